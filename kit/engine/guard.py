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
~900 entries after a day of runs). So the guard also removes the entries that appeared in ``/dev/shm`` while it
ran and that no live process has open or mapped any more, and the tree's own temp folder (``KIT_TREE_TMPDIR``,
where vLLM's ipc sockets went).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_SECONDS = 10.0
SHM_DIR = "/dev/shm"
# What vLLM and Python's multiprocessing create there; nothing else is touched.
SHM_PREFIXES = ("psm_", "vllm", "sem.mp-")
SHM_INFIX = "-cpushm"  # the CPU PP communicator's segments: `<id>-pp:<group>-cpushm_<rank>`


def is_vllm_shm(name: str) -> bool:
    """A /dev/shm entry of the kinds vLLM (and multiprocessing) create."""
    return name.startswith(SHM_PREFIXES) or SHM_INFIX in name
# The tree's own temp folder (TMPDIR, VLLM_RPC_BASE_PATH: vLLM's ipc sockets and vllm_dist_* files), made by
# kit.engine.procs.ManagedProcess and named in this variable; removed here when the tree has ended.
TREE_TMP_ENV = "KIT_TREE_TMPDIR"
TREE_TMP_PREFIX = "kit-tmp-"


def guard(cmd: list[str], grace: float = GRACE_SECONDS) -> int:
    """Run ``cmd`` in this process group until it exits; end the group if our parent dies or we are told to stop."""
    import ctypes

    parent = int(os.environ.get("KIT_PARENT_PID", "0") or 0)
    try:  # the kit asked for SIGKILL on parent death; SIGTERM lets the guard clean up first
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except Exception:
        pass
    shm_before = _shm_entries()
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
    _wait_group_gone(2.0)
    _remove_orphan_shm(shm_before)
    _remove_tree_tmp()
    os._exit(rc if rc >= 0 else 128 - rc)


def _remove_tree_tmp() -> None:
    """Remove the tree's temp folder (only one the kit made: named ``kit-tmp-*`` and owned by us)."""
    import shutil

    d = os.environ.get(TREE_TMP_ENV, "")
    try:
        if os.path.basename(d.rstrip("/")).startswith(TREE_TMP_PREFIX) and os.stat(d).st_uid == os.getuid():
            shutil.rmtree(d, ignore_errors=True)
    except OSError:
        pass


def _group_members() -> list:
    """The other live (non-zombie) processes in our process group."""
    import psutil

    me, group, out = os.getpid(), os.getpgid(0), []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.pid != me and os.getpgid(p.pid) == group and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def _kill_rest_of_group() -> None:
    """SIGKILL what the command left in our process group (engine core, workers, resource tracker),
    but not the guard itself, so that its exit code is the command's."""
    for p in _group_members():
        try:
            os.kill(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue


def _wait_group_gone(timeout: float) -> None:
    end = time.monotonic() + timeout
    while _group_members() and time.monotonic() < end:
        time.sleep(0.05)


def _shm_entries() -> set[str]:
    try:
        return {n for n in os.listdir(SHM_DIR) if is_vllm_shm(n)}
    except OSError:
        return set()


def _shm_in_use() -> set[str]:
    """Names under /dev/shm that some live process has open or mapped.

    Matched by inode, not only by name: a POSIX semaphore is created under a temporary name that glibc maps and
    then links to its final name (``sem.mp-*``) and unlinks, so its creator's maps show ``/dev/shm/sem.XXXXXX
    (deleted)`` and never the final name. By name alone a semaphore that a spawned child has not opened yet looks
    unused, and a guard ending beside a starting run removed it (the child then failed in ``SemLock._rebuild``
    with ``FileNotFoundError``)."""
    used: set[str] = set()
    inodes: set[int] = set()
    prefix = SHM_DIR + "/"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    i = line.find(prefix)
                    if i >= 0:
                        used.add(line[i + len(prefix):].split()[0])
                        fields = line.split()
                        if len(fields) > 4 and fields[4].isdigit():
                            inodes.add(int(fields[4]))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(prefix):
                        used.add(target[len(prefix):].split()[0])
                        inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
                except OSError:
                    continue
        except OSError:
            continue
    try:
        with os.scandir(SHM_DIR) as it:
            used.update(e.name for e in it if e.inode() in inodes)
    except OSError:
        pass
    return used


def _remove_orphan_shm(before: set[str]) -> list[str]:
    """Unlink the /dev/shm entries created since ``before`` that are ours and no process uses."""
    new = _shm_entries() - before
    if not new:
        return []
    used, uid, removed = _shm_in_use(), os.getuid(), []
    for name in sorted(new - used):
        path = os.path.join(SHM_DIR, name)
        try:
            if os.stat(path).st_uid == uid:
                os.unlink(path)
                removed.append(name)
        except OSError:
            continue
    return removed


def command(cmd: list[str]) -> list[str]:
    """``cmd`` wrapped in the guard."""
    return [sys.executable, "-m", "kit.engine.guard", "--", *cmd]


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--":
        guard(sys.argv[2:])
    print("usage: python -m kit.engine.guard -- CMD ...", file=sys.stderr)
    sys.exit(2)
