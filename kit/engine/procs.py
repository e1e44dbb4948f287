"""Process trees the kit starts: own session, deadline waits, root-cause log lines, and teardown.

Every vLLM run the kit starts is a subprocess in a new session (its own process group), so the
whole tree (engine core, PP workers, ``resource_tracker``) can be ended together. Teardown sends
SIGTERM, waits a grace period, then SIGKILL: stock vLLM workers and the resource tracker ignore
SIGTERM after a failure (``docs/cpu-notes.md#processes-that-outlive-their-caller``). Each command runs
under :mod:`kit.engine.guard`, which ends the group when the kit's process dies without its teardown, and
:func:`kill_all` runs at interpreter exit.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, TypeVar

import psutil

from kit.engine.guard import RUN_DIR_ENV, RUN_DIR_PREFIXES, SHM_LEDGER_ENV, TREE_TMP_ENV, TREE_TMP_PREFIX
from kit.engine.guard import command as guard_command
from kit.engine.guard import kill_trackers_last
from kit.engine.postmortem import exit_status, hints, oom_kills
from kit.engine.shm import DIST_PREFIX, SHM_DIR, ShmLedger, dist_idents, in_use, is_vllm_shm

_LIVE: "weakref.WeakSet[ManagedProcess]" = weakref.WeakSet()
T = TypeVar("T")

# Process titles vLLM gives its children; used to spot a dead worker early.
VLLM_TITLES = re.compile(r"VLLM::|EngineCore|Worker_PP|Worker_TP|RayWorker", re.I)


class ProcessFailed(RuntimeError):
    """A process the kit started died or missed its deadline; the message holds its log's root cause."""

    def __init__(self, message: str, log_path: Path | None = None, cause_lines: list[str] | None = None):
        super().__init__(message)
        self.log_path = log_path
        self.cause_lines = cause_lines or []


# vLLM colours its log lines when it thinks a terminal is attached (e.g. under a Jupyter kernel, which
# sets CLICOLOR/FORCE_COLOR-style variables): strip the escapes before matching.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# ``(Worker_PP1 pid=N) ERROR 12-01 03:27:51 [file.py:123] text``: the process tag and the logger's level, date
# and source are optional (the front end's own lines and raw tracebacks carry neither).
_PREFIX = re.compile(r"^(?:\((?P<proc>[^)]*pid=\d+)\)\s+)?"
                     r"(?:(?P<level>[A-Z]+)\s+\d\d-\d\d \d\d:\d\d:\d\d \[[^\]]+\]\s?)?")
_SIGNALS = re.compile(r"(SIGILL|SIGSEGV|SIGBUS|SIGKILL|Illegal instruction|Segmentation fault|Bus error|"
                      r"core dumped|out of memory|died|exit code -?\d+|Fatal Python error)", re.I)
# A vLLM server or engine that failed during start-up says so with one of these.
# A port taken between the kit's check and vLLM's bind (the NIXL side channel's listener thread dies and
# start-up waits for it forever) counts too.
_STARTUP_FAILED = re.compile(r"EngineCore failed to start|WorkerProc hit an exception|"
                             r"Engine core initialization failed|Address already in use")


def _log_lines(log_path: Path | None) -> list[tuple[str, str, str]]:
    """``(process tag, level, text)`` per line, colours and prefixes stripped; [] without a log."""
    try:
        raw = Path(log_path).read_text(errors="replace").splitlines() if log_path else []
    except OSError:
        return []
    out = []
    for line in raw:
        line = _ANSI.sub("", line)
        m = _PREFIX.match(line)
        out.append((m.group("proc") or "", m.group("level") or "", line[m.end():]))
    return out


def _first_traceback(lines: list[tuple[str, str, str]]) -> tuple[str, list[str]] | None:
    """The FIRST traceback (the original failure; later ones are consequences: a dead engine core, then the
    caller's error): its process tag and its lines from the header to the exception line. Lines of other
    processes and plain log lines interleave and are skipped; ``^~~~`` markers are dropped."""
    start = next((i for i, (_, _, t) in enumerate(lines) if t.startswith("Traceback (most recent call last)")), None)
    if start is None:
        return None
    proc = lines[start][0]
    block = [lines[start][2]]
    for p, level, t in lines[start + 1:]:
        if p != proc or level in ("DEBUG", "INFO", "WARNING") or not t.strip() or set(t.strip()) <= set("^~"):
            continue
        block.append(t)
        if not t[0].isspace():  # the first unindented line after the header is the exception
            break
    return proc, block


def _fault_dump(lines: list[tuple[str, str, str]], frames: int = 10) -> tuple[str, list[str]] | None:
    """What Python's fault handler wrote for a crash in native code (the kit sets ``PYTHONFAULTHANDLER`` in every
    tree): the "Fatal Python error" line and the innermost frames of the thread that crashed."""
    start = next((i for i, (_, _, t) in enumerate(lines) if t.startswith("Fatal Python error")), None)
    if start is None:
        return None
    proc = lines[start][0]
    block = [lines[start][2]]
    for _, _, t in lines[start + 1:]:
        if t.startswith("  File "):
            block.append(t)
            if len(block) > frames:
                break
        elif block[1:] and not t.strip():  # the crashed thread's stack ends at the first blank line
            break
    return proc, block


def _shm_hint(lines: list[str]) -> list[str]:
    """SIGBUS in a vLLM process is most often a full /dev/shm (its shared-memory queues are mmapped files)."""
    if not any(re.search(r"SIGBUS|Bus error", l) for l in lines):
        return []
    try:
        import shutil

        free = f"{shutil.disk_usage('/dev/shm').free / 2**20:.0f} MiB free now"
    except OSError:
        free = "not readable"
    return [f"hint: SIGBUS usually means /dev/shm ran out of space ({free}); remove stale psm_* entries or enlarge it"]


def _disk_hint(log_path: Path | None) -> list[str]:
    """A full file system under the run's folder (its log, its result file) as a root cause: the log itself may
    then hold nothing about it."""
    if not log_path:
        return []
    try:
        free = shutil.disk_usage(Path(log_path).parent).free
    except OSError:
        return []
    if free >= 1 << 20:
        return []
    return [f"hint: the file system holding {Path(log_path).parent} is full ({free // 1024} KiB free): "
            "the run could not write its log or its result"]


def root_cause(log_path: Path | None, max_lines: int = 20) -> list[str]:
    """The lines of a vLLM log that say why it failed.

    The first traceback's last frames and exception line, named by the process that raised it, plus any
    signal / exit-code lines (and a hint for SIGBUS).
    """
    lines = _log_lines(log_path)
    picked: list[str] = []
    tb = _first_traceback(lines) or _fault_dump(lines)
    if tb:
        proc, block = tb
        head = f"in {proc.split(' pid=')[0]}:" if proc else "in the engine process:"
        picked = [head] + block[-(max_lines - 1):]
    for p, _, t in lines:
        if _SIGNALS.search(t) and t not in picked:
            picked.append(t if not p else f"[{p.split(' pid=')[0]}] {t}")
    return picked[:max_lines + 6] + _shm_hint(picked)


def fatal_log_lines(log_path: Path | None, max_lines: int = 8) -> list[str]:
    """[] unless the log shows a vLLM start-up failure; else the lines that say why, short: the innermost
    frame of the first traceback, its source line and the exception (without a traceback: the ERROR lines)."""
    lines = _log_lines(log_path)
    if not any(_STARTUP_FAILED.search(t) for _, _, t in lines):
        return []
    tb = _first_traceback(lines)
    if tb is None:
        return [t.strip() for _, level, t in lines if level == "ERROR" and t.strip()
                and not _STARTUP_FAILED.search(t)][-max_lines:]
    block = tb[1]
    frames = [i for i, t in enumerate(block) if t.lstrip().startswith('File "')]
    return [t.strip() for t in block[frames[-1] if frames else 0:]][-max_lines:]


class ManagedProcess:
    """A subprocess in its own session with a log file; a context manager that ends its whole tree."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None, log_path: Path | None = None,
                 cwd: str | os.PathLike | None = None, name: str = "process"):
        self.name = name
        self.log_path = Path(log_path) if log_path else None
        full_env = dict(os.environ)
        # Every process of the tree, and any that escapes it, carries the run's id in its environment: what fault
        # tools and checks find a run's processes (run_processes) and its temp folder by, never a command line.
        self.run_id = (env or {}).get(RUN_ID_ENV) or full_env.get(RUN_ID_ENV) or new_run_id()
        # The tree's own temp folder: vLLM puts its ZMQ ipc sockets (VLLM_RPC_BASE_PATH, default the temp dir) and
        # its file-store rendezvous (vllm_dist_*) under tempfile.gettempdir() and never removes them (seen:
        # thousands of /tmp/<uuid> sockets). The guard removes the folder when the tree ends; terminate() too.
        self.tmpdir = tempfile.mkdtemp(prefix=tree_tmp_prefix(self.run_id))
        # The guard's record of what the tree holds in /dev/shm, beside the folder (kit-tmp-...shm, so that leak
        # checks see it if it is left): the guard removes those entries when the tree ends, but a guard killed with
        # its tree (SIGKILL of the whole tree, or terminate()'s own after its grace) cannot; terminate() then
        # removes the recorded entries no live process uses.
        self.shm_ledger = self.tmpdir + ".shm"
        full_env.update({"TMPDIR": self.tmpdir, "VLLM_RPC_BASE_PATH": self.tmpdir, TREE_TMP_ENV: self.tmpdir,
                         SHM_LEDGER_ENV: self.shm_ledger})
        # A log in a run's folder under the kit's cache (kit-run-*, kit-srv-*, ...): the guard removes that folder if
        # this process is killed hard and so never removes it itself.
        if self.log_path and self.log_path.parent.name.startswith(RUN_DIR_PREFIXES):
            full_env[RUN_DIR_ENV] = str(self.log_path.parent)
        # torch.compile's cache stays where it was (it is keyed by content, and worth keeping across runs).
        full_env.setdefault("TORCHINDUCTOR_CACHE_DIR", _inductor_cache_dir())
        # A crash in native code (SIGSEGV, SIGILL, SIGBUS, SIGABRT) then leaves the Python stack in the log.
        full_env.setdefault("PYTHONFAULTHANDLER", "1")
        self._oom_at_start = oom_kills()
        if env:
            full_env.update(env)
        full_env[RUN_ID_ENV] = self.run_id
        full_env["KIT_PARENT_PID"] = str(os.getpid())
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        # Under kit.engine.guard: if this process dies without its teardown, the guard still ends the tree.
        try:
            self.popen = subprocess.Popen(guard_command(cmd), env=full_env, cwd=cwd, stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        except BaseException:  # nothing started: nothing else would remove the folder
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            raise
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        self.pid = self.popen.pid
        self.started = time.monotonic()
        self._seen: dict[int, str] = {}
        self._ended: dict[int, str] = {}  # pid -> how a vLLM process ended, read while it was a zombie
        self.peak_rss: dict[str, int] = {}  # process title -> peak resident bytes seen
        _LIVE.add(self)

    # -- state --------------------------------------------------------------------------------
    def alive(self) -> bool:
        return self.popen.poll() is None

    def tree(self) -> list[psutil.Process]:
        """The process and all its descendants, plus anything left in its process group."""
        procs: dict[int, psutil.Process] = {}
        try:
            root = psutil.Process(self.pid)
            procs[root.pid] = root
            for c in root.children(recursive=True):
                procs[c.pid] = c
        except psutil.NoSuchProcess:
            pass
        for pid in psutil.pids():  # not process_iter: its shared cache is not safe across threads
            try:
                if pid not in procs and os.getpgid(pid) == self.pid:
                    procs[pid] = psutil.Process(pid)
            except (ProcessLookupError, PermissionError, psutil.Error, OSError):
                continue
        return list(procs.values())

    def check_children(self) -> str | None:
        """Return a description if a vLLM child seen earlier has died while the root still runs."""
        current, parents, names = {}, {}, {}
        for p in self.tree():
            try:
                if p.status() == psutil.STATUS_ZOMBIE:  # before cmdline(), which a zombie refuses
                    how = exit_status(p.pid) if p.pid in self._seen else None
                    if how:
                        self._ended[p.pid] = how
                    continue
                title = " ".join(" ".join(p.cmdline()).split())  # vLLM pads its retitled names
                # A process on its way out has no command line any more: its 15-character name ("VLLM::Worker_PP"
                # for "VLLM::Worker_PP1") must not replace the full title seen before.
                names[p.pid] = p.name()
                title = title or self._seen.get(p.pid) or names[p.pid]
                parents[p.pid] = p.ppid()
            except psutil.Error:
                continue
            current[p.pid] = title
        for pid, title in current.items():
            if not VLLM_TITLES.search(title):
                # Seen with a vLLM title before and alive under another now: a forked child that has exec'd.
                self._seen.pop(pid, None)
            elif pid not in self._seen and parents[pid] in current and (
                    current[parents[pid]].startswith(title) or names[parents[pid]] == names[pid]):
                # A child that inherited its parent's title (and name) by fork and has not retitled itself: not a
                # vLLM process. A worker's subprocesses (g++ and python helpers under torch.compile's cold start,
                # over a hundred per worker) carry "VLLM::Worker_PP0" between fork and exec, or an empty command
                # line and the name "VLLM::Worker_PP"; one caught in that window and gone by the next poll was
                # reported as the worker's death (CI, a fresh machine's first compiled run). A prefix, not equality:
                # a child on its way out shows only the 15-character name, while psutil names the parent after its
                # whole command line ("VLLM::Worker_PP0").
                continue
            else:  # the latest title: a worker is "VLLM::Worker" before "VLLM::Worker_PP1"
                self._seen[pid] = title
        for p in self.tree():
            try:
                title = _title(p)
                rss = p.memory_info().rss
            except psutil.Error:
                continue
            key = f"{title} (pid {p.pid})"
            if rss > self.peak_rss.get(key, 0):
                self.peak_rss[key] = rss
        dead = [f"{self._logged_title(pid, t)} (pid {pid}{', ' + self._ended[pid] if pid in self._ended else ''})"
                for pid, t in self._seen.items() if pid not in current]
        return ", ".join(dead) if dead else None

    def _logged_title(self, pid: int, title: str) -> str:
        """``title``, or the more specific name the process last logged under: vLLM prefixes a worker's log lines
        with it (``(Worker_PP1 pid=26497)``), and a worker killed just after it retitled itself from
        ``VLLM::Worker`` to ``VLLM::Worker_PP1``, between two polls, was only ever seen with the first."""
        if self.log_path is None or not title.startswith("VLLM::"):
            return title
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 1_000_000))
                text = f.read().decode(errors="replace")
        except OSError:
            return title
        names = re.findall(rf"\((\w+) pid={pid}\)", text)
        short = title.removeprefix("VLLM::")
        if names and names[-1] != short and names[-1].startswith(short):
            return "VLLM::" + names[-1]
        return title

    def fail(self, what: str) -> ProcessFailed:
        lines = root_cause(self.log_path) + _disk_hint(self.log_path)
        msg = f"{self.name}: {what}"
        if lines:
            msg += "\n  root cause from " + str(self.log_path) + ":\n    " + "\n    ".join(lines)
        else:
            # Nothing in the log says why (a SIGKILL leaves no trace there): what the kernel and the kit saw, and
            # the log's last lines, so that a CI log that keeps only this message still shows how far it got.
            tail = [t for _, _, t in _log_lines(self.log_path) if t.strip()][-8:]
            msg += "\n  no traceback in the log; " + "\n  ".join(hints(self._oom_at_start, self.peak_rss))
            if tail:
                msg += f"\n  last lines of {self.log_path}:\n    " + "\n    ".join(t[:200] for t in tail)
            elif self.log_path:
                msg += f"\n  log: {self.log_path}"
        return ProcessFailed(msg, self.log_path, lines)

    # -- teardown -----------------------------------------------------------------------------
    def terminate(self, grace: float = 5.0) -> int:
        """End the whole tree: SIGTERM, ``grace`` seconds, then SIGKILL; then remove the tree's temp folder and the
        /dev/shm entries its processes were seen holding that no live process uses (what the guard would have
        removed, had it not been killed too). Returns processes killed hard."""
        procs = self.tree()
        self._signal_group(signal.SIGTERM, procs)
        for p in procs:
            try:
                p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace)
        alive += [p for p in self.tree() if p not in alive]
        kill_trackers_last(alive)  # a resource tracker removes its processes' named semaphores once they are gone
        self._signal_group(signal.SIGKILL, procs)
        psutil.wait_procs(alive, timeout=5)
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        # What the guard recorded and, killed, did not remove; and the PP communicator's segments named after the
        # tree's rendezvous file (a worker killed at once after making one was never seen holding it).
        ledger = ShmLedger.load(self.shm_ledger)
        ledger.claim_dist(dist_idents(self.tmpdir))
        shutil.rmtree(self.tmpdir, ignore_errors=True)  # also when the guard itself was killed hard
        if ledger.entries():  # the tree's last processes (orphans included) may still be exiting: wait, then look
            deadline = time.monotonic() + 5.0
            while run_processes(self.run_id) and time.monotonic() < deadline:
                time.sleep(0.1)
            ledger.remove(settle=2.0)
        try:
            os.unlink(self.shm_ledger)
        except OSError:
            pass
        _LIVE.discard(self)
        return len(alive)

    def _signal_group(self, sig: int, procs: list[psutil.Process]) -> None:
        """Signal the tree's process group only while a process of the tree (checked by pid and start time) is
        still in it: a group whose members are all gone may carry a reused number."""
        for p in procs:
            try:
                if p.is_running() and os.getpgid(p.pid) == self.pid:
                    os.killpg(self.pid, sig)
                    return
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue

    def __enter__(self) -> "ManagedProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.terminate()


class Abandoned(RuntimeError):
    """:func:`call_watched` stopped waiting: a watched process died while the call ran (message: what died)."""


def call_watched(fn: Callable[[], T], deaths: Callable[[], str | None], name: str = "watched",
                 poll: float = 1.0) -> T:
    """``fn()`` in a daemon thread, asking ``deaths()`` every ``poll`` seconds while it runs.

    A death (a non-empty description) ends the wait at once with :class:`Abandoned`, instead of leaving the
    caller until ``fn``'s own timeout; the thread is left to that timeout. ``fn``'s exception is re-raised
    here (the caller may then ask ``deaths()`` for the root cause: a request to a dying server fails first).
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    th = threading.Thread(target=target, daemon=True, name=name)
    th.start()
    while th.is_alive():
        th.join(poll)
        if th.is_alive() and (dead := deaths()):
            raise Abandoned(dead)
    if "error" in box:
        raise box["error"]
    return box["value"]


def kill_all() -> None:
    """End every process tree this interpreter started and still holds."""
    for p in list(_LIVE):
        try:
            p.terminate(grace=2.0)
        except Exception:
            pass


atexit.register(kill_all)


def leftover_vllm_processes(exclude: set[int] | None = None, since: float | None = None,
                            owner: int | None = None) -> list[str]:
    """vLLM-looking processes on this machine (engines, workers, servers, trackers, Ray), for leak checks.

    With ``since`` (a ``time.time()``), only processes created after it; with ``owner`` (a pid), only
    those left behind by that process: orphans (re-parented to init or to a subreaper above ``owner``) and its
    own direct children.
    Processes of other, still-running owners are then not counted.
    """
    me = os.getpid()
    exclude = exclude or set()
    reapers = _reapers(owner) if owner is not None else set()
    out = []
    pat = re.compile(r"VLLM::|EngineCore|vllm\.entrypoints|kit\.engine\.child|resource_tracker|ray::|raylet|gcs_server")
    for p in psutil.process_iter(["pid", "cmdline", "name", "ppid", "create_time"]):
        try:
            if p.pid in (me,) or p.pid in exclude or p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.info["cmdline"] or []) or (p.info["name"] or "")
        except psutil.Error:
            continue
        if not pat.search(cmd) or "pytest" in cmd:
            continue
        if since is not None and p.info["create_time"] < since - 1:
            continue
        if owner is not None and p.info["ppid"] not in reapers:
            continue
        out.append(f"{p.pid} {cmd[:160]}")
    return out


def _reapers(owner: int) -> set[int]:
    """Where an orphan of ``owner``'s trees can end up: ``owner`` itself, init, or any ancestor of ``owner``
    (a child subreaper, PR_SET_CHILD_SUBREAPER, as a container runtime or systemd sets, adopts orphans of its
    descendants instead of init: counting ppid 1 alone finds nothing under one)."""
    out = {1, owner}
    try:
        out.update(p.pid for p in psutil.Process(owner).parents())
    except psutil.Error:
        pass
    return out


# What vLLM leaves under the temp dir when a tree is not given its own: ZMQ ipc sockets named by a uuid4 and the
# file-store rendezvous; plus the kit's per-tree folders.
_TEMP_NAMES = re.compile(r"^([0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}|"
                         + re.escape(DIST_PREFIX) + r"[0-9a-f]+|" + re.escape(TREE_TMP_PREFIX) + r".+)$")


def vllm_temp_entries() -> set[str]:
    """The vLLM-made (and kit-tree) entries now in the temp dir and in /dev/shm, as paths: for leak checks."""
    out: set[str] = set()
    for folder, keep in ((tempfile.gettempdir(), _TEMP_NAMES.match), (SHM_DIR, is_vllm_shm)):
        try:
            out.update(os.path.join(folder, n) for n in os.listdir(folder) if keep(n))
        except OSError:
            continue
    return out


def leftover_temp_entries(before: set[str]) -> list[str]:
    """Entries of :func:`vllm_temp_entries` that appeared since ``before`` and that no live process uses (a
    socket still bound, a shared-memory segment still open or mapped): what a run left behind."""
    new = vllm_temp_entries() - before
    if not new:
        return []
    try:
        with open("/proc/net/unix") as f:  # the last column of a bound socket is its path
            bound = {line.split()[-1] for line in f.readlines()[1:] if len(line.split()) >= 8}
    except OSError:
        bound = set()
    shm = in_use()
    prefix = SHM_DIR + "/"
    return sorted(e for e in new if e not in bound and not (e.startswith(prefix) and e[len(prefix):] in shm))


def _inductor_cache_dir() -> str:
    """torch's default inductor cache folder (``<tempdir>/torchinductor_<user>``), computed here, outside any tree."""
    try:
        import getpass

        user = getpass.getuser()
    except Exception:  # no passwd entry (some containers): torch's own fallback
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r"[\\/:*?\"<>|]", "_", user))


def _title(p: psutil.Process) -> str:
    """A short name for a process of a vLLM tree (vLLM retitles its children, e.g. ``VLLM::Worker_PP1``)."""
    cmd = " ".join(p.cmdline()).strip()
    for key in ("kit.engine.child", "vllm.entrypoints", "resource_tracker"):
        if key in cmd:
            return key
    if cmd.startswith("VLLM::") or "EngineCore" in cmd:
        return cmd.split()[0]
    return p.name()


RUN_ID_ENV = "KIT_RUN_ID"


def tree_tmp_prefix(run_id: str) -> str:
    """The name every temp folder of a tree of run ``run_id`` starts with (``kit-tmp-<run id>-``)."""
    return f"{TREE_TMP_PREFIX}{run_id}-"


def new_run_id() -> str:
    """A fresh run id (give it to a run as ``env={RUN_ID_ENV: id}`` to find its processes later)."""
    import uuid

    return uuid.uuid4().hex[:16]


def run_processes(run_id: str) -> list[psutil.Process]:
    """The live processes of a run: those whose environment carries ``KIT_RUN_ID=run_id`` (set by
    :class:`ManagedProcess` and inherited by every descendant, and by any that left the tree), and their
    descendants. Processes whose environment cannot be read (other users') are not the run's."""
    found: dict[int, psutil.Process] = {}
    for pid in psutil.pids():  # not process_iter: its shared cache of Process objects is not safe across threads
        try:
            p = psutil.Process(pid)
            if pid != os.getpid() and p.environ().get(RUN_ID_ENV) == run_id:
                found[pid] = p
        except psutil.Error:
            continue
    # vLLM retitles its workers (setproctitle), which can overwrite the memory /proc/PID/environ shows: add the
    # descendants of the processes found.
    for p in list(found.values()):
        try:
            found.update({c.pid: c for c in p.children(recursive=True)})
        except psutil.Error:
            continue
    out = []
    for p in found.values():
        try:
            if p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def python_cmd(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped loopback address."""
    import ipaddress

    try:
        addr = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or bool(mapped and mapped.is_loopback)


def listening_sockets(procs: list[psutil.Process]) -> list[dict]:
    """Every socket the processes accept on: TCP in LISTEN and UDP bound without a peer, as
    ``{"pid", "title", "proto", "ip", "port"}`` (a socket shared by several processes is listed once per pid)."""
    out = []
    for p in procs:
        try:
            conns = p.net_connections(kind="inet")
            title = _title(p)
        except psutil.Error:
            continue
        for c in conns:
            udp = c.type == socket.SOCK_DGRAM
            if (udp and not c.raddr) or c.status == psutil.CONN_LISTEN:
                out.append({"pid": p.pid, "title": title, "proto": "udp" if udp else "tcp",
                            "ip": c.laddr.ip, "port": c.laddr.port})
    return out
