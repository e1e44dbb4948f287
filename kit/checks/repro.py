"""``kit repro``: each vLLM defect the kit patches, shown on stock vLLM and gone with the kit's patches.

The reproducers are the ones written for upstream, ``docs/upstream/<patch>_repro.py``: short scripts that need only
vLLM and a model shipped in ``data/models/``, and exit 1 when the defect shows, 0 when it does not. ``kit repro
NAME`` runs one twice, with that one patch off (``KIT_PATCHES=all,-NAME``: vLLM as shipped for the code it fixes,
while the kit's other fixes keep defects met on the way out of the picture, e.g. Qwen3.5's import without
torchvision; a script that needs more patches off names them on a ``# kit repro also off:`` line) and with every kit patch on, under the kit's process guard (nothing outlives the run), and exits 0 only
when the defect shows off and is gone on. ``--stock`` runs the first one with ``KIT_PATCHES=none`` instead. ``kit repro --list`` lists the reproducers and their reports.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kit.core.models import REPO_ROOT

UPSTREAM = REPO_ROOT / "docs" / "upstream"
SUFFIX = "_repro.py"
# A reproducer whose defect another kit patch hides or refuses to reach names those patches on one line of its own:
# ``# kit repro also off: PATCH, PATCH`` (e.g. decode_side_pp_spec_rule refuses PP + drafts unless every PP + spec
# correctness patch is on). They are turned off with NAME in the defect run, and the report says so.
ALSO_OFF = "# kit repro also off:"
TIMEOUT_S = 900
TAIL_LINES = 6
# How a reproducer is started: vLLM's general plugins loaded first, as vLLM loads them in every process it starts,
# so that a reproducer that starts no engine (it calls one vLLM function) gets the kit's patches too when
# KIT_PATCHES selects them; KIT_PATCHES=none applies nothing, which is stock vLLM.
_LAUNCH = ("import runpy, sys; import vllm.plugins; vllm.plugins.load_general_plugins(); "
           "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


@dataclass
class Outcome:
    """One run of a reproducer: its exit code, what it printed last, and how long it took."""

    patches: str
    returncode: int | None     # None: stopped at the time limit
    tail: list[str]
    seconds: float

    @property
    def shows_defect(self) -> bool:
        return self.returncode == 1


# Registered patches with no vLLM defect of their own to reproduce here, and why. `kit repro --list` prints them
# after the reproducers; tests/test_repro.py keeps every registered patch in one of names(), NO_REPRODUCER, PENDING.
NO_REPRODUCER: dict[str, str] = {
    "decode_side_pp_spec_rule": "the kit's own rule (refuses decode-side PP + drafts unless the kit's PP + spec fixes "
                                "are on), not a fix",
    "draft_pp_gate": "report only: fixed upstream before vLLM 0.32.0 (PR #52117)",
    "eagle3_total_layers": "report only: fixed upstream in vLLM 0.32.0 (PR #46003)",
    "qwen3_5_mtp_intermediates": "report only: fixed for Qwen3.5 in vLLM 0.32.0; its report reads the same branch in "
                                 "Qwen3-Next and EXAONE-MoE MTP, for which no model is shipped",
    "eagle3_per_rank_layers_legacy": "teaching: turns the behaviour before PR #46003 back on (notebook 02)",
    "pp_microbatches": "throughput, not wrong output: vLLM 0.32's V1 loop runs one PP step at a time (findings)",
    "nixl_progress_delay": "CPU time, not wrong output: NIXL's progress threads busy-poll (findings)",
    "nixl_cpu_affinity": "CPU time, not wrong output: NIXL pins every worker to one core (findings)",
    "cpu_ray_executor": "a configuration vLLM 0.32.0 does not offer (Ray on the CPU build): a feature request",
    "nixl_pp_consumer": "a configuration vLLM 0.32.0 refuses (a PP consumer for NIXL): a feature request",
    "api_key_every_route": "security: goes to vLLM's private vulnerability reporting, not a public issue (findings)",
    "tcp_store_bind_host": "security: goes to vLLM's private vulnerability reporting, not a public issue (findings)",
    "ray_store_bind_host": "security: goes to vLLM's private vulnerability reporting, not a public issue (findings)",
}
# Reproducers that need hardware this kit's machines lack: they say so and exit 0 there (no defect shown), so
# `kit repro NAME` reports "NOT as expected"; tests/test_repro.py skips them.
NEEDS_HARDWARE: dict[str, str] = {
    "cpu_amx_permission": "an Intel CPU with AMX (Sapphire Rapids or later)",
}
# Correctness patches whose report and reproducer are not written yet (the list only shrinks).
PENDING: dict[str, str] = {}


def names() -> list[str]:
    """Every reproducer's name (its patch's name), sorted."""
    return sorted(p.name[: -len(SUFFIX)] for p in UPSTREAM.glob(f"*{SUFFIX}"))


def also_off(name: str) -> list[str]:
    """The other kit patches the reproducer of ``name`` needs off to reach its defect (``ALSO_OFF`` line)."""
    for line in (UPSTREAM / f"{name}{SUFFIX}").read_text().splitlines():
        if line.startswith(ALSO_OFF):
            return [p.strip() for p in line[len(ALSO_OFF):].split(",") if p.strip()]
    return []


def off_selection(name: str) -> str:
    """``KIT_PATCHES`` for the defect run: every kit patch but ``name`` (and its :func:`also_off` patches)."""
    return ",".join(["all", f"-{name}", *(f"-{p}" for p in also_off(name))])


def title(name: str) -> str:
    """The report's title: the first Markdown heading of ``docs/upstream/<name>.md``."""
    report = UPSTREAM / f"{name}.md"
    if report.exists():
        for line in report.read_text().splitlines():
            if line.startswith("#"):
                return line.lstrip("#").strip()
    return ""


def run_one(name: str, patches: str, timeout: float = TIMEOUT_S) -> Outcome:
    """Run ``docs/upstream/<name>_repro.py`` from the repository root with ``KIT_PATCHES=patches``."""
    import tempfile

    from kit.engine.procs import ManagedProcess

    script = UPSTREAM / f"{name}{SUFFIX}"
    with tempfile.TemporaryDirectory(prefix="kit-repro-") as tmp:
        log = Path(tmp) / "out.log"
        t0 = time.monotonic()
        with ManagedProcess([sys.executable, "-c", _LAUNCH, str(script)], env={"KIT_PATCHES": patches}, log_path=log,
                            cwd=REPO_ROOT, name=f"repro {name}") as proc:
            try:
                rc: int | None = proc.popen.wait(timeout=timeout)
            except Exception:   # subprocess.TimeoutExpired: the context manager ends the tree
                rc = None
        text = log.read_text(errors="replace") if log.exists() else ""
    lines, after_warning = [], False
    for ln in text.splitlines():
        # vLLM's log lines and Python warnings (a warning's source line follows it, indented) are not the script's.
        if after_warning and ln.startswith("  "):
            continue
        after_warning = "Warning:" in ln
        if ln.strip() and not after_warning and " INFO " not in ln and " WARNING " not in ln:
            lines.append(ln)
    return Outcome(patches, rc, lines[-TAIL_LINES:], time.monotonic() - t0)


def _print(name: str, o: Outcome) -> None:
    what = {1: "defect shows", 0: "no defect"}.get(o.returncode, "stopped at the time limit"
                                                    if o.returncode is None else f"failed (exit {o.returncode})")
    print(f"  KIT_PATCHES={o.patches}: {what} ({o.seconds:.0f} s)")
    for ln in o.tail:
        print(f"    | {ln}")


def main(argv: list[str] | None = None) -> int:
    """``kit repro NAME [NAME ...]`` / ``kit repro --list`` / ``kit repro --all``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="kit repro", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help="a reproducer's name (kit repro --list prints them)")
    ap.add_argument("--list", action="store_true", help="list the reproducers and their reports' titles")
    ap.add_argument("--all", action="store_true", help="run every reproducer")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per run (default %(default)s)")
    ap.add_argument("--stock", action="store_true",
                    help="run the defect side with every kit patch off (KIT_PATCHES=none), not only NAME's")
    args = ap.parse_args(argv)
    known = names()
    if args.list:
        for n in known:
            print(f"{n}: {title(n)}")
        for n, why in sorted({**NO_REPRODUCER, **PENDING}.items()):
            if n not in known:
                print(f"  (no reproducer) {n}: {'not written yet: ' if n in PENDING else ''}{why}")
        return 0
    wanted = known if args.all else args.names
    unknown = [n for n in wanted if n not in known]
    if not wanted or unknown:
        why = f"no reproducer {', '.join(unknown)}" if unknown else "name a reproducer or pass --all"
        print(f"kit repro: error: {why} (kit repro --list prints them)", file=sys.stderr)
        return 2
    if args.timeout <= 0:
        print(f"kit repro: error: --timeout must be > 0, got {args.timeout}", file=sys.stderr)
        return 2
    bad = 0
    for n in wanted:
        print(f"{n}: {title(n)}", flush=True)
        if n in NEEDS_HARDWARE:
            print(f"  (needs {NEEDS_HARDWARE[n]}; elsewhere the script says so and shows no defect)", flush=True)
        off = run_one(n, "none" if args.stock else off_selection(n), args.timeout)
        _print(n, off)
        on = run_one(n, "all", args.timeout)
        _print(n, on)
        ok = off.shows_defect and on.returncode == 0
        bad += not ok
        print(f"  => {'reproduced with the patch off, gone with it on' if ok else 'NOT as expected'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
