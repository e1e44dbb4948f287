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
