"""The ``/dev/shm`` entries a run made, found by watching the run's own processes, and their removal.

A process tree killed by a signal cannot unlink its POSIX shared memory: vLLM's shm broadcast rings
(``psm_*``, 240 MiB each), its ``vllm*`` segments, the CPU PP communicator's ``*-cpushm_*`` and
multiprocessing's semaphores (``sem.mp-*``) stay behind. Whoever cleans up must remove those of its own run
only: an entry that appeared meanwhile may belong to another run that has not mapped it yet (a semaphore a
spawned child is about to open). So a :class:`ShmLedger` records what the run's processes have open or mapped
(by inode: a semaphore is created under a temporary name, mapped, then linked to its final name), and at the end
removes the recorded entries that no live process uses any more. An entry the run made and never held between
two looks is left alone (a leak, never a wrong removal), except the CPU PP communicator's segments, which carry
the run's rendezvous id in their names (:func:`dist_idents`, :meth:`ShmLedger.claim_dist`).
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable

SHM_DIR = "/dev/shm"
# What vLLM and Python's multiprocessing create there; nothing else is touched.
SHM_PREFIXES = ("psm_", "vllm", "sem.mp-")
SHM_INFIX = "-cpushm"  # the CPU PP communicator's segments: `<id>-pp:<group>-cpushm_<rank>`
_PREFIX = SHM_DIR + "/"


def is_vllm_shm(name: str) -> bool:
    """A /dev/shm entry of the kinds vLLM (and multiprocessing) create."""
    return name.startswith(SHM_PREFIXES) or SHM_INFIX in name


DIST_PREFIX = "vllm_dist_"  # vLLM's file-store rendezvous under the tree's temp folder; its name prefixes the segments


def dist_idents(folder: str | None) -> list[str]:
    """The rendezvous ids (``vllm_dist_<hex>``) of the run whose temp folder is ``folder``.

    vLLM's CPU worker names its PP communicator's segments after its rendezvous file (``VLLM_DIST_IDENT``, the
    file's base name: ``/dev/shm/vllm_dist_<hex>-pp:...-cpushm_<rank>``), and that file lies in the tree's own temp
    folder. So a segment a worker made and was killed before anyone saw it hold is still tied to its run by name."""
    try:
        return sorted(n for n in os.listdir(folder) if n.startswith(DIST_PREFIX)) if folder else []
    except OSError:
        return []


def held_by(pids: Iterable[int]) -> tuple[set[str], set[int]]:
    """Names and inodes under /dev/shm that the processes ``pids`` have open or mapped."""
    names: set[str] = set()
    inodes: set[int] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                data = f.read()
        except OSError:
            continue
        i = data.find(_PREFIX)
        while i >= 0:  # a maps line: address perms offset dev inode path
            start = data.rfind("\n", 0, i) + 1
            end = data.find("\n", i)
            fields = data[start:end if end >= 0 else None].split()
            names.add(data[i + len(_PREFIX):end if end >= 0 else None].split()[0])
            if len(fields) > 4 and fields[4].isdigit():
                inodes.add(int(fields[4]))
            i = data.find(_PREFIX, end) if end >= 0 else -1
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(_PREFIX):
                    names.add(target[len(_PREFIX):].split()[0])
                    inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
            except OSError:
                continue
    return names, inodes


def in_use() -> set[str]:
    """Names under /dev/shm that some live process has open or mapped (matched by inode too, see the module)."""
    names, inodes = held_by(int(p) for p in os.listdir("/proc") if p.isdigit())
    try:
        with os.scandir(SHM_DIR) as it:
            names.update(e.name for e in it if e.inode() in inodes)
    except OSError:
        pass
    return names


class ShmLedger:
    """The /dev/shm entries some process of a run was seen holding; :meth:`remove` unlinks the unused ones."""

    def __init__(self) -> None:
        self.inodes: set[int] = set()
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str) -> ShmLedger:
        """The ledger a :class:`ShmWatch` kept in the file ``path`` (one inode per line; empty if there is none)."""
        ledger = cls()
        try:
            with open(path) as f:
                ledger.inodes = {int(line) for line in f if line.strip().isdigit()}
        except OSError:
            pass
        return ledger

    def record(self, pids: Iterable[int]) -> None:
        """Look at what ``pids`` (the run's processes) hold now."""
        _, inodes = held_by(pids)
        with self._lock:
            self.inodes |= inodes

    def claim_dist(self, idents: Iterable[str]) -> None:
        """Record the /dev/shm entries named after the run's rendezvous ids (:func:`dist_idents`), held or not."""
        prefixes = tuple(f"{i}-" for i in idents)
        if not prefixes:
            return
        try:
            with os.scandir(SHM_DIR) as it:
                found = {e.inode() for e in it if e.name.startswith(prefixes)}
        except OSError:
            return
        with self._lock:
            self.inodes |= found

    def entries(self) -> list[str]:
        """Recorded entries still present (this user's, of the kinds vLLM makes)."""
        with self._lock:
            inodes = set(self.inodes)
        out, uid = [], os.getuid()
        try:
            with os.scandir(SHM_DIR) as it:
                for e in it:
                    try:
                        if e.inode() in inodes and is_vllm_shm(e.name) and e.stat().st_uid == uid:
                            out.append(e.name)
                    except OSError:
                        continue
        except OSError:
            pass
        return sorted(out)

    def left(self) -> list[str]:
        """Recorded entries that no live process uses any more: what the run left behind."""
        mine = self.entries()
        if not mine:
            return []
        used = in_use()
        return [n for n in mine if n not in used]

    def remove(self, settle: float = 0.0) -> list[str]:
        """Unlink :meth:`left`; returns the names removed. With ``settle``, look again for up to that many seconds
        while recorded entries are still in use: a killed tree's last processes may still be exiting (unmapping
        hundreds of MiB on a busy machine) when the first look is made."""
        removed: list[str] = []
        end = time.monotonic() + settle
        while True:
            for name in self.left():
                try:
                    os.unlink(os.path.join(SHM_DIR, name))
                    removed.append(name)
                except OSError:
                    continue
            if not self.entries() or time.monotonic() >= end:
                return removed
            time.sleep(0.1)


class ShmWatch(ShmLedger):
    """A ledger filled by a daemon thread that looks at ``pids()`` every ``interval / 4`` for the first 10 s (when a
    run makes its segments), then every ``interval``, every ``5 * interval`` after two minutes, until :meth:`stop`
    (which looks once more). With ``file``, each inode recorded is also appended there, so that the ledger outlives
    the watching process (:meth:`ShmLedger.load`)."""

    def __init__(self, pids: Callable[[], Iterable[int]], interval: float = 1.0, file: str | None = None) -> None:
        super().__init__()
        self._pids, self._interval, self._file = pids, interval, file
        self._written: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kit-shm-watch", daemon=True)

    def start(self) -> ShmWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        t0 = time.monotonic()
        while True:
            self.look()
            age = time.monotonic() - t0
            wait = self._interval / 4 if age < 10 else self._interval if age < 120 else 5 * self._interval
            if self._stop.wait(wait):
                return

    def look(self) -> None:
        try:
            self.record(list(self._pids()))
        except Exception:  # noqa: BLE001 - a process list that failed once is tried again next time
            pass
        if self._file:  # each new inode appended at once: whoever cleans up after this process was killed reads it
            with self._lock:
                new = self.inodes - self._written
            if new:
                try:
                    with open(self._file, "a") as f:
                        f.write("".join(f"{i}\n" for i in sorted(new)))
                    self._written |= new
                except OSError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.look()
