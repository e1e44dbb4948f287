"""A caller process that starts a process tree under the kit's guard and then never runs its own teardown: what
tests/test_procs.py and tests/test_leftovers.py kill to see the guard clean up after it."""
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_guarded_caller(child_code: str, log: Path, show: str) -> tuple[subprocess.Popen, str]:
    """Start a Python caller that runs ``child_code`` in a :class:`kit.engine.procs.ManagedProcess` (``log_path=log``),
    prints that object's attribute ``show`` (``pid``, ``tmpdir``) and sleeps; returns the caller and that line."""
    caller = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time; sys.path.insert(0, {str(ROOT)!r})
        from kit.engine.procs import ManagedProcess
        p = ManagedProcess([sys.executable, "-c", {child_code!r}], log_path={str(log)!r}, name="tree")
        print(p.{show}, flush=True)
        time.sleep(300)
    """)], stdout=subprocess.PIPE, text=True)
    return caller, caller.stdout.readline().strip()
