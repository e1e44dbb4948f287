import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Generated files (random checkpoints, engine logs) stay inside the test session's cache.
os.environ.setdefault("KIT_CACHE_DIR", str(ROOT / "runs" / "cache"))

MODEL = os.environ.get("KIT_TEST_MODEL", "tiny-mimo")


# -- what a JUnit XML report (pytest --junitxml, as ./test.sh runs it) records beside the results ----------------
# `kit test-report` renders docs/results/tests.md from these properties (kit_*) and the report's test cases.

_DESELECTED: list[int] = []


def _junit(config):
    try:
        from _pytest.junitxml import xml_key  # the store behind pytest's record_testsuite_property
    except ImportError:
        return None
    return config.stash.get(xml_key, None)


def _selection(config) -> str:
    """The -m expression, -k and any paths other than the configured testpaths, as typed."""
    import shlex

    parts = [f"-m {shlex.quote(config.option.markexpr)}"] if config.option.markexpr else []
    if config.option.keyword:
        parts.append(f"-k {shlex.quote(config.option.keyword)}")
    here = Path(config.invocation_params.dir)
    default = {(ROOT / t).resolve() for t in config.getini("testpaths")}
    paths = [a for a in config.args if (here / a.split("::")[0]).resolve() not in default]
    return " ".join(parts + [str(Path(a)) if "::" not in a else a for a in paths]) or "all tests"


def _command(config) -> str:
    """The command the user ran: ./test.sh passes its own (KIT_TEST_COMMAND); else pytest's arguments."""
    import shlex

    if os.environ.get("KIT_TEST_COMMAND"):
        return os.environ["KIT_TEST_COMMAND"]
    args, skip = [], False
    for a in config.invocation_params.args:
        if skip or a.startswith(("--junitxml", "--junit-xml")):
            skip = a in ("--junitxml", "--junit-xml")
            continue
        args.append(a)
    return shlex.join(["python", "-m", "pytest", *args])


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    xml = _junit(session.config)
    if xml is None:
        return
    import datetime as dt

    from kit.core.results import machine, versions

    for name, value in (("command", _command(session.config)), ("selection", _selection(session.config)),
                        ("machine", machine()), ("versions", versions()),
                        ("start_utc", dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))):
        xml.add_global_property(f"kit_{name}", value)


def pytest_deselected(items):
    _DESELECTED.append(len(items))


def pytest_collection_finish(session):
    xml = _junit(session.config)
    if xml is not None:
        xml.add_global_property("kit_deselected", str(sum(_DESELECTED)))


@pytest.fixture
def kit_json(tmp_path):
    """``kit_json(*args, timeout=...)`` runs ``python -m kit ARGS --json FILE`` from the repository root and returns
    the JSON it wrote; without one, the test fails with the end of the command's output."""
    def run(*args: str, timeout: float = 1200) -> dict:
        out = tmp_path / "kit.json"
        r = subprocess.run([sys.executable, "-m", "kit", *map(str, args), "--json", str(out)], cwd=ROOT,
                           timeout=timeout, capture_output=True, text=True)
        assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
        return json.loads(out.read_text())

    return run


@pytest.fixture
def no_leftovers():
    """Fail the test if it leaves something of vLLM's behind, created during the test: a process (an orphan,
    adopted by init or by a subreaper above this process, or a child of this process), an ipc socket, a
    ``vllm_dist_*`` file or a kit tree folder in the temp dir, or a ``/dev/shm`` entry, that no live process uses
    any more (other owners' live processes and files on a shared machine are not counted)."""
    import time

    from kit.engine.procs import leftover_temp_entries, leftover_vllm_processes, vllm_temp_entries

    t0 = time.time()
    files_before = vllm_temp_entries()
    yield
    deadline = time.monotonic() + 15
    while True:
        procs = leftover_vllm_processes(since=t0, owner=os.getpid())
        files = leftover_temp_entries(files_before)
        if not (procs or files) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not procs, f"processes left behind: {procs}"
    assert not files, f"temp or /dev/shm entries left behind: {files[:20]} ({len(files)})"
