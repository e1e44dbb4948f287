import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Generated files (random checkpoints, engine logs) stay inside the test session's cache.
os.environ.setdefault("KIT_CACHE_DIR", str(ROOT / "runs" / "cache"))

MODEL = os.environ.get("KIT_TEST_MODEL", "tiny-mimo")


@pytest.fixture
def no_leftovers():
    """Fail the test if it leaves a vLLM-looking process behind: an orphan, or a child of this process,
    created during the test (other owners' live processes on a shared machine are not counted)."""
    import time

    from kit.procs import leftover_vllm_processes

    t0 = time.time()
    yield
    deadline = time.monotonic() + 15
    while True:
        now = leftover_vllm_processes(since=t0, owner=os.getpid())
        if not now or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not now, f"processes left behind: {now}"
