"""The guard every process the kit starts runs under: ``python -m kit.guard -- CMD ...``.

Why: a vLLM server or engine is a tree (API server -> engine core -> PP workers), and only the top of it
is the kit's child. If the kit's process dies without running its teardown (SIGKILL, a SIGTERM with the
default handler, a notebook kernel killed), ``PR_SET_PDEATHSIG`` ends that top process only and the
engine core and its workers live on, reparented to init, eating both cores (seen: 17 minutes of orphaned
``VLLM::EngineCore`` after ``kill`` of a ``scripts/pd_check.py`` run). The guard sits at the top of the
process group instead: when its parent dies, or on SIGTERM / SIGINT, it passes SIGTERM to the command,
waits a short grace period, then SIGKILLs the whole group.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_SECONDS = 10.0


def guard(cmd: list[str], grace: float = GRACE_SECONDS) -> int:
    """Run ``cmd`` in this process group until it exits; end the group if our parent dies or we are told to stop."""
    import ctypes

    parent = int(os.environ.get("KIT_PARENT_PID", "0") or 0)
    try:  # the kit asked for SIGKILL on parent death; SIGTERM lets the guard clean up first
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except Exception:
        pass
    env = dict(os.environ, KIT_PARENT_PID=str(os.getpid()))  # the command's parent is now the guard
    child = subprocess.Popen(cmd, env=env)
    stopping: list[float] = []

    def on_term(signum, frame) -> None:
        if not stopping:
            stopping.append(time.monotonic())
        try:
            child.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if parent and os.getppid() != parent:
        on_term(None, None)
    while True:
        try:
            child.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            pass
        if not stopping and parent and os.getppid() != parent:
            on_term(None, None)
        if stopping and time.monotonic() - stopping[0] > grace:
            break
    rc = child.returncode if child.returncode is not None else 1
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _kill_rest_of_group()
    os._exit(rc if rc >= 0 else 128 - rc)


def _kill_rest_of_group() -> None:
    """SIGKILL what the command left in our process group (engine core, workers, resource tracker),
    but not the guard itself, so that its exit code is the command's."""
    import psutil

    me, group = os.getpid(), os.getpgid(0)
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != me and os.getpgid(p.pid) == group:
                os.kill(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue


def command(cmd: list[str]) -> list[str]:
    """``cmd`` wrapped in the guard."""
    return [sys.executable, "-m", "kit.guard", "--", *cmd]


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--":
        guard(sys.argv[2:])
    print("usage: python -m kit.guard -- CMD ...", file=sys.stderr)
    sys.exit(2)
