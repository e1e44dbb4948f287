"""The guard every process the kit starts runs under: ``python -m kit.engine.guard -- CMD ...``.

Why: a vLLM server or engine is a tree (API server -> engine core -> PP workers), and only the top of it
is the kit's child. If the kit's process dies without running its teardown (SIGKILL, a SIGTERM with the
default handler, a notebook kernel killed), ``PR_SET_PDEATHSIG`` ends that top process only and the
engine core and its workers live on, reparented to init, eating both cores (seen: 17 minutes of orphaned
``VLLM::EngineCore`` after ``kill`` of a ``scripts/pd_check.py`` run). The guard sits at the top of the
process group instead: when its parent dies, or on SIGTERM / SIGINT, it passes SIGTERM to the command,
waits a short grace period, then SIGKILLs the whole group.

A tree killed that way cannot unlink its POSIX shared memory: vLLM's shm broadcast rings (``/dev/shm/psm_*``,
240 MiB each), its ``vllm*`` segments and multiprocessing semaphores (``sem.mp-*``) stay in ``/dev/shm`` (seen:
~900 entries after a day of runs). So the guard also removes the entries in ``/dev/shm`` that its tree made: those
ran that its own tree was seen holding and that no live process has open or mapped any more
(:class:`kit.engine.shm.ShmWatch`, its ledger also kept in the file ``KIT_SHM_LEDGER`` names, for whoever cleans up
after a guard killed with its tree), and the tree's own temp folder (``KIT_TREE_TMPDIR``, where vLLM's ipc sockets
went). When the caller itself died, the guard also removes the run's folder under the kit's cache (``KIT_RUN_DIR``):
nobody is left to read its log or remove it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_SECONDS = 10.0
from kit.engine.lifecycle import ENV_KEEP_RUNS
from kit.engine.shm import ShmWatch, dist_idents
# The tree's own temp folder (TMPDIR, VLLM_RPC_BASE_PATH: vLLM's ipc sockets and vllm_dist_* files), made by
# kit.engine.procs.ManagedProcess and named in this variable; removed here when the tree has ended.
TREE_TMP_ENV = "KIT_TREE_TMPDIR"
TREE_TMP_PREFIX = "kit-tmp-"
# The file the guard's ShmWatch appends the tree's /dev/shm inodes to (kit.engine.procs.ManagedProcess names it and
# reads it if the guard was killed with its tree, so one watch serves both); removed here once the guard cleaned up.
SHM_LEDGER_ENV = "KIT_SHM_LEDGER"
# The run's folder under the kit's cache (request, result, logs), which the caller removes; named so that the guard
# can remove it when the caller was killed hard and never will (only folders of these kinds).
RUN_DIR_ENV = "KIT_RUN_DIR"
RUN_DIR_PREFIXES = ("kit-run-", "kit-srv-", "kit-pd-", "kit-nodes-")


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
    ledger = os.environ.get(SHM_LEDGER_ENV) or None
    shm = ShmWatch(_group_pids, file=ledger).start()  # what the tree holds in /dev/shm: the only entries removed
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
    shm.stop()
    _kill_rest_of_group()
    _wait_group_gone(10.0)
    shm.claim_dist(dist_idents(os.environ.get(TREE_TMP_ENV)))  # segments made and never seen held (killed at once)
    shm.remove(settle=3.0)
    _remove_tree_tmp()
    if ledger and os.path.basename(ledger).startswith(TREE_TMP_PREFIX) and not shm.entries():
        try:  # cleaned up: nothing left to read (else kit.engine.procs.ManagedProcess.terminate tries again)
            os.unlink(ledger)
        except OSError:
            pass
    if parent and os.getppid() != parent:  # the caller died: nobody will read or remove the run's folder now
        _remove_run_dir()
    os._exit(rc if rc >= 0 else 128 - rc)


def _remove_own_folder(env: str, prefixes: str | tuple[str, ...]) -> None:
    """Remove the folder the variable ``env`` names, only if the kit made it: its name starts with one of
    ``prefixes`` and this user owns it."""
    import shutil

    d = os.environ.get(env, "").rstrip("/")
    try:
        if d and os.path.basename(d).startswith(prefixes) and os.stat(d).st_uid == os.getuid():
            shutil.rmtree(d, ignore_errors=True)
    except OSError:
        pass


def _remove_run_dir() -> None:
    """Remove the run's folder under the kit's cache (``RUN_DIR_ENV``, a ``kit-*`` folder). A live caller removes it
    itself (a failed run's when it exits, :func:`kit.engine.lifecycle.remove_run_dir`); a caller killed hard never
    does, so the guard, which outlives it, does. ``KIT_KEEP_RUNS=1`` keeps it."""
    if os.environ.get(ENV_KEEP_RUNS) != "1":
        _remove_own_folder(RUN_DIR_ENV, RUN_DIR_PREFIXES)


def _remove_tree_tmp() -> None:
    """Remove the tree's temp folder (``kit-tmp-*``, where vLLM's ipc sockets and rendezvous files went)."""
    _remove_own_folder(TREE_TMP_ENV, TREE_TMP_PREFIX)


def _group_members() -> list:
    """The other live (non-zombie) processes in our process group."""
    import psutil

    out = []
    for pid in _group_pids():
        try:
            p = psutil.Process(pid)
            if pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def _kill_rest_of_group() -> None:
    """SIGKILL what the command left in our process group (engine core, workers, resource tracker),
    but not the guard itself, so that its exit code is the command's."""
    kill_trackers_last(_group_members())


def _is_tracker(p) -> bool:
    try:
        return "resource_tracker" in " ".join(p.cmdline())
    except Exception:  # gone, or not ours to read
        return False


def kill_trackers_last(procs: list, wait: float = 3.0) -> None:
    """SIGKILL ``procs`` (psutil processes), Python's ``multiprocessing.resource_tracker`` processes last.

    A tracker unlinks the named semaphores (``/dev/shm/sem.mp-*``) its processes registered and never removed once
    every one of them is gone (its pipe reaches EOF), then exits; it ignores SIGTERM. Killed with the others, it
    leaves them behind (seen: one ``sem.mp-*`` after a run whose worker was killed). So it gets ``wait`` seconds to
    do that before it is killed too."""
    import psutil

    def kill(ps) -> None:
        for p in ps:
            try:
                p.kill()
            except psutil.Error:
                pass

    trackers = [p for p in procs if _is_tracker(p)]
    kill(p for p in procs if p not in trackers)
    if trackers:
        kill(psutil.wait_procs(trackers, timeout=wait)[1])


def _wait_group_gone(timeout: float) -> None:
    end = time.monotonic() + timeout
    while _group_members() and time.monotonic() < end:
        time.sleep(0.05)


def _group_pids() -> list[int]:
    """Every process in our process group (the guard and its tree), from /proc."""
    group, out = os.getpgid(0), []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.getpgid(int(pid)) == group:
                out.append(int(pid))
        except OSError:
            continue
    return out


def command(cmd: list[str]) -> list[str]:
    """``cmd`` wrapped in the guard."""
    return [sys.executable, "-m", "kit.engine.guard", "--", *cmd]


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--":
        guard(sys.argv[2:])
    print("usage: python -m kit.engine.guard -- CMD ...", file=sys.stderr)
    sys.exit(2)
