"""``kit test-report``: the test-suite block of ``docs/results/tests.md``, rendered from pytest's own reports.

    ./test.sh [ARGS]          # pytest also writes its JUnit XML report: runs/junit/<UTC time>.xml
    kit test-report --junit runs/junit/<file>.xml --write docs/results/tests.md

``--junit FILE`` (repeatable) adds a report to the recorded ones, ``docs/results/junit/`` (committed, like the
other raw runs beside the tables); the block is rendered from every recorded report. Per selection (the ``-m``
expression, ``-k`` and paths pytest ran) its latest report: date, machine, versions, the command, the counts
(passed, failed, errors, skipped, xfailed, and deselected where the report says), pytest's wall time, and per test
file its count and time. Then what the default selection leaves out (``-m slow``, ``-m pd``, ``-m reliability``;
``pytest --collect-only``: collection starts no engine), each test function with its latest recorded result, or
"not run since" the oldest recorded report. ``tests/conftest.py`` writes the command, machine, versions, selection and deselected count into the report
as properties (pytest's ``record_testsuite_property`` store); a report without them still counts, with those
fields unknown.
"""
from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from kit.core.models import REPO_ROOT
from kit.core.results import block_key, check_writable, command_line, write_block

RECORDED = REPO_ROOT / "docs" / "results" / "junit"
DOC = REPO_ROOT / "docs" / "results" / "tests.md"
PROG = "kit test-report"
# Properties tests/conftest.py records in the report (kit_ + name).
PROPERTIES = ("command", "selection", "machine", "versions", "start_utc", "deselected")


@dataclass
class Case:
    nodeid: str
    file: str
    outcome: str  # passed, failed, error, skipped, xfailed
    seconds: float


@dataclass
class Report:
    path: Path
    start: dt.datetime
    seconds: float
    props: dict[str, str] = field(default_factory=dict)
    cases: list[Case] = field(default_factory=list)

    @property
    def end(self) -> dt.datetime:
        return self.start + dt.timedelta(seconds=self.seconds)

    @property
    def selection(self) -> str:
        return self.props.get("selection") or "unknown (the report names no selection)"

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in ("passed", "failed", "error", "skipped", "xfailed")}
        for c in self.cases:
            out[c.outcome] += 1
        return out


def _outcome(case: ET.Element) -> str:
    for child in case:
        if child.tag == "failure":
            return "failed"
        if child.tag == "error":
            return "error"
        if child.tag == "skipped":
            return "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
    return "passed"


def _file(classname: str, root: Path) -> tuple[str, list[str]]:
    """``tests.test_x.TestC`` -> (``tests/test_x.py``, [``TestC``]): the longest prefix that is a file."""
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        if (root / Path(*parts[:i])).with_suffix(".py").is_file():
            return "/".join(parts[:i]) + ".py", parts[i:]
    return "/".join(parts) + ".py", []


def _utc(stamp: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(stamp)
    return t.astimezone(dt.timezone.utc) if t.tzinfo else t.astimezone().astimezone(dt.timezone.utc)


def read_report(path: Path, root: Path = REPO_ROOT) -> Report:
    """One pytest JUnit XML report (``--junitxml``): its suite's start, time, properties and test cases."""
    tree = ET.parse(path).getroot()
    suite = tree if tree.tag == "testsuite" else tree.find("testsuite")
    if suite is None:
        raise ValueError(f"{path}: not a pytest JUnit XML report (no testsuite)")
    props = {p.get("name", "")[4:]: p.get("value", "") for p in suite.iter("property")
             if p.get("name", "").startswith("kit_")}
    start = _utc(props["start_utc"]) if props.get("start_utc") else _utc(suite.get("timestamp", "1970-01-01T00:00"))
    cases = []
    for tc in suite.iter("testcase"):
        file, classes = _file(tc.get("classname", ""), root)
        nodeid = "::".join([file, *classes, tc.get("name", "")])
        cases.append(Case(nodeid, file, _outcome(tc), float(tc.get("time") or 0)))
    return Report(path, start, float(suite.get("time") or 0), props, cases)


def recorded(folder: Path, root: Path = REPO_ROOT) -> list[Report]:
    """Every recorded report, oldest first."""
    return sorted((read_report(p, root) for p in sorted(folder.glob("*.xml"))), key=lambda r: r.start)


def record(path: Path, folder: Path, root: Path = REPO_ROOT) -> Path:
    """Copy a report into ``folder`` as ``<start, UTC>.xml`` (checked first: it must read as a report)."""
    rep = read_report(path, root)
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{rep.start:%Y%m%dT%H%M%SZ}.xml"
    if not (dest.exists() and dest.read_bytes() == path.read_bytes()):
        shutil.copyfile(path, dest)
    return dest


# The markers whose tests the default selection leaves out (pyproject.toml's addopts), in the order a test is
# filed under when it carries several.
OPT_IN = ("slow", "pd", "reliability")


def default_markexpr(root: Path = REPO_ROOT) -> str:
    """The default selection's ``-m`` expression, read from pyproject.toml's pytest ``addopts``."""
    import shlex
    import tomllib

    addopts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    words = shlex.split(addopts)
    return words[words.index("-m") + 1] if "-m" in words else ""


def _collect(root: Path, markexpr: str) -> list[str]:
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", markexpr, "-p", "no:cacheprovider"],
                       cwd=root, capture_output=True, text=True, timeout=600)
    ids = [line.strip() for line in p.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if p.returncode not in (0, 5):
        raise RuntimeError(f"pytest --collect-only -m {markexpr!r} failed (exit {p.returncode}): "
                           f"{p.stdout[-500:]}{p.stderr[-500:]}")
    return ids


def opt_in_tests(root: Path = REPO_ROOT) -> dict[str, str]:
    """Node id -> marker (``slow``, ``pd`` or ``reliability``) of every test the default selection leaves out:
    pytest's own collection (``-m "MARKER and not (DEFAULT)"``), which imports the test modules and starts no engine."""
    default = default_markexpr(root)
    out: dict[str, str] = {}
    for marker in OPT_IN:
        for nodeid in _collect(root, f"{marker} and not ({default})" if default else marker):
            out.setdefault(nodeid, marker)
    if not out:
        raise RuntimeError(f"pytest --collect-only found no test outside the default selection ({default!r})")
    return out


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _span(a: dt.datetime, b: dt.datetime) -> str:
    return f"{a:%Y-%m-%d %H:%M}–{b:%H:%M} UTC" if a.date() == b.date() else f"{a:%Y-%m-%d %H:%M} UTC–{b:%Y-%m-%d %H:%M} UTC"


def _function(nodeid: str) -> str:
    return nodeid.split("[", 1)[0]


def render(reports: list[Report], opt_in: dict[str, str], collected: dt.datetime, root: Path = REPO_ROOT) -> str:
    """The block's body: the latest report of each selection, then the tests the default selection leaves out
    (``opt_in``: node id -> the marker that selects it), each with its latest recorded result."""
    out = []
    latest: dict[str, Report] = {}
    for r in reports:
        latest[r.selection] = r
    if not latest:
        out += ["No pytest report recorded yet: `./test.sh` writes one to `runs/junit/`, and `kit test-report --junit "
                "FILE --write docs/results/tests.md` records it here.", ""]
    for sel, r in sorted(latest.items(), key=lambda kv: kv[1].start, reverse=True):
        n = r.counts()
        rel = r.path.resolve().relative_to(root) if r.path.resolve().is_relative_to(root) else r.path
        counts = ", ".join(f"{n[k]} {k}" for k in ("passed", "failed", "error", "skipped", "xfailed"))
        desel = r.props.get("deselected")
        out += [f"### {sel}", "",
                f"{_span(r.start, r.end)} on {r.props.get('machine', 'an unrecorded machine')}; "
                f"{r.props.get('versions', 'versions not recorded')}. Command: `{r.props.get('command', 'not recorded')}`; "
                f"report `{rel}`.", "",
                f"**{counts}**" + (f"; {desel} deselected" if desel else "; deselected not recorded")
                + f"; {r.seconds:.0f} s of pytest ({r.seconds / 60:.1f} minutes).", "",
                "| test file | tests | passed | failed or error | skipped or xfailed | s |", "|---|---|---|---|---|---|"]
        files: dict[str, list[Case]] = {}
        for c in r.cases:
            files.setdefault(c.file, []).append(c)
        for f, cs in sorted(files.items()):
            k = [sum(c.outcome in o for c in cs) for o in (("passed",), ("failed", "error"), ("skipped", "xfailed"))]
            out.append(f"| `{f}` | {len(cs)} | {k[0]} | {k[1]} | {k[2]} | {sum(c.seconds for c in cs):.0f} |")
        out.append("")
    oldest = reports[0].start if reports else None
    funcs: dict[str, list[str]] = {}
    for nodeid in opt_in:
        funcs.setdefault(_function(nodeid), []).append(nodeid)
    markers = ", ".join(f"`-m {m}`" for m in OPT_IN)
    out += ["### Outside the default selection", "",
            f"{len(opt_in)} tests in {len(funcs)} test functions that only {markers} select, collected "
            f"{collected:%Y-%m-%d %H:%M} UTC with `pytest --collect-only -q -m \"MARKER and not (DEFAULT)\"`; last run "
            "and result: the latest recorded report that holds them.", "",
            "| test | run with | cases | last run | result |", "|---|---|---|---|---|"]
    for func, ids in funcs.items():
        how = "`-m " + "`, `-m ".join(sorted({opt_in[i] for i in ids}, key=OPT_IN.index)) + "`"
        last = next((r for r in reversed(reports) if any(c.nodeid in ids for c in r.cases)), None)
        if last is None:
            when = f"not run since {oldest:%Y-%m-%d %H:%M} UTC" if oldest else "no recorded run"
            out.append(f"| `{func}` | {how} | {len(ids)} | {when} | – |")
            continue
        got = [c.outcome for c in last.cases if c.nodeid in ids]
        tally = ", ".join(f"{got.count(o)} {o}" for o in ("passed", "failed", "error", "skipped", "xfailed")
                          if got.count(o))
        if len(got) < len(ids):
            tally += f", {len(ids) - len(got)} not in that run"
        out.append(f"| `{func}` | {how} | {len(ids)} | {last.start:%Y-%m-%d %H:%M} UTC | {tally} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from kit.core.flags import Parser  # one-line errors, exit 2

    ap = Parser(prog=PROG, description="the test-suite block of docs/results/tests.md from pytest's JUnit XML reports")
    ap.add_argument("--junit", action="append", default=[], metavar="FILE",
                    help="a report (pytest --junitxml; ./test.sh writes runs/junit/*.xml) to record in "
                         f"{_rel(RECORDED)}/ first (repeatable)")
    ap.add_argument("--write", default=None, metavar="FILE", help=f"write the block into FILE ({_rel(DOC)})")
    args = ap.parse_args(argv)
    for f in args.junit:
        if not Path(f).is_file():
            ap.error(f"--junit {f}: no such file")
        try:
            rep = read_report(Path(f))
        except (ET.ParseError, ValueError) as e:
            ap.error(f"--junit {f}: not a pytest JUnit XML report ({' '.join(str(e).split())})")
        if missing := [k for k in ("command", "machine", "versions") if k not in rep.props]:
            ap.error(f"--junit {f}: no kit_{missing[0]} property: not a report of this suite (tests/conftest.py "
                     "records them when pytest runs with --junitxml, as ./test.sh does)")
    if args.write and (why := check_writable(args.write)):
        ap.error(why)
    for f in args.junit:
        print(f"recorded {_rel(record(Path(f), RECORDED))}")
    reports = recorded(RECORDED)
    collected = dt.datetime.now(dt.timezone.utc)
    body = render(reports, opt_in_tests(), collected, REPO_ROOT)
    print(body)
    if args.write:
        recorded_header = {}
        if reports:
            last = reports[-1]
            recorded_header = dict(until=max(r.end for r in reports), on=last.props.get("machine"),
                                   with_versions=last.props.get("versions"),
                                   source=_rel(RECORDED))
        write_block(args.write, block_key("kit test-report", argv, skip=("--write", "--junit")), body,
                    command_line(PROG, argv), when=reports[0].start if reports else collected, title="Tests",
                    **recorded_header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
