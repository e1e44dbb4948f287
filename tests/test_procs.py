"""Root-cause extraction from vLLM logs (pure; no engine)."""
from kit.engine.procs import root_cause


def test_root_cause_strips_colour_and_process_prefixes(tmp_path):
    esc = "\x1b"
    log = tmp_path / "engine.log"
    lines = [
        f"{esc}[0;36m(Worker_PP1 pid=27437){esc}[0;0m {esc}[31mERROR{esc}[0m {esc}[90m12-01 07:42:35{esc}[0m "
        f"{esc}[90m[multiproc_executor.py:953]{esc}[0m Traceback (most recent call last):",
        f"{esc}[0;36m(Worker_PP1 pid=27437){esc}[0;0m {esc}[31mERROR{esc}[0m {esc}[90m12-01 07:42:35{esc}[0m "
        f"{esc}[90m[multiproc_executor.py:953]{esc}[0m     raise ValueError(f\"Duplicate layer name: {{prefix}}\")",
        f"{esc}[0;36m(Worker_PP1 pid=27437){esc}[0;0m {esc}[31mERROR{esc}[0m {esc}[90m12-01 07:42:35{esc}[0m "
        f"{esc}[90m[multiproc_executor.py:953]{esc}[0m ValueError: Duplicate layer name: model.layers.2.self_attn.attn",
    ]
    log.write_text("\n".join(lines) + "\n")
    got = root_cause(log)
    assert got[0] == "in Worker_PP1:"
    assert got[-1] == "ValueError: Duplicate layer name: model.layers.2.self_attn.attn"
    assert not any(esc in line for line in got)



def test_startup_failure_lines_and_sigbus_hint(tmp_path):
    """The short start-up form (what a PD pair reports while the other server still boots) comes from the same
    parser: innermost frame, its code, the exception; a log without a start-up failure gives nothing. A SIGBUS
    line brings the /dev/shm hint."""
    from kit.engine.procs import fatal_log_lines

    esc = "\x1b"
    pre = f"{esc}[0;36m(EngineCore_DP0 pid=7){esc}[0;0m ERROR 12-01 03:27:51 [core.py:1]"
    log = tmp_path / "consumer.log"
    log.write_text("\n".join([
        f"{pre} EngineCore failed to start.",
        f"{pre} Traceback (most recent call last):",
        f'{pre}   File "core.py", line 1, in run',
        "(APIServer pid=6) INFO 12-01 03:27:51 [api_server.py:1] waiting for the engine",
        f'{pre}   File "nixl_connector.py", line 9, in __init__',
        f"{pre}     raise NotImplementedError(msg)",
        f"{pre} NotImplementedError: does not support pipeline_parallel_size > 1.",
    ]) + "\n")
    assert fatal_log_lines(log) == ['File "nixl_connector.py", line 9, in __init__', "raise NotImplementedError(msg)",
                                    "NotImplementedError: does not support pipeline_parallel_size > 1."]
    ok = tmp_path / "ok.log"
    ok.write_text("(Worker_PP1 pid=1) INFO 12-01 03:27:51 [x.py:1] Bus error handling: none\n")
    assert fatal_log_lines(ok) == []
    bus = tmp_path / "bus.log"
    bus.write_text("(Worker_PP1 pid=1) ERROR 12-01 03:27:51 [x.py:1] Worker died: Fatal Python error: Bus error\n")
    got = root_cause(bus)
    assert got[0] == "[Worker_PP1] Worker died: Fatal Python error: Bus error" and "/dev/shm" in got[-1], got

# -- kit.engine.guard: the tree a ManagedProcess starts dies with its caller, however the caller dies -----------

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402
from callers import start_guarded_caller  # noqa: E402 (tests/callers.py)
from conftest import ROOT  # noqa: E402

# A parent that starts a grandchild in its own process group and both sleep: the shape of
# `vllm serve` -> EngineCore -> workers, without vLLM.
_TREE = ("import subprocess, sys, time; "
         "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
         "print('grandchild', g.pid, flush=True); time.sleep(300)")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_managed_tree_dies_with_its_caller(tmp_path, how):
    log = tmp_path / "tree.log"
    caller, pid = start_guarded_caller(_TREE, log, "pid")
    guard_pid = int(pid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "grandchild" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.2)
    grandchild = int(log.read_text().split("grandchild")[1].split()[0])
    tree = [psutil.Process(guard_pid)] + psutil.Process(guard_pid).children(recursive=True)
    assert grandchild in [p.pid for p in tree]
    caller.send_signal(how)
    caller.wait(timeout=10)
    gone, alive = psutil.wait_procs(tree, timeout=20)
    assert not alive, f"left behind after the caller got {how.name}: {[p.pid for p in alive]}"


_SHM_TREE = ("import os, signal, sys, time, uuid\n"
             "from multiprocessing import resource_tracker, shared_memory\n"
             "name = 'psm_kittest_' + uuid.uuid4().hex[:8]\n"
             "kept = shared_memory.SharedMemory(name=name, create=True, size=1 << 20)\n"
             "resource_tracker.unregister('/' + name, 'shared_memory')  # only the guard may clean it now\n"
             "print('segment', name, flush=True)\n"
             "time.sleep(1.5)  # held a while, as vLLM's rings are for the whole run: the guard sees it held\n"
             "os.kill(os.getpid(), signal.SIGKILL)  # as the guard's teardown does to vLLM's workers\n")


def test_guard_removes_the_shared_memory_a_killed_tree_left(tmp_path):
    """A SIGKILLed process cannot unlink its /dev/shm segments; the guard removes the ones its tree held, and
    leaves alone an entry of the same kind and owner that appeared meanwhile but that its tree never held
    (another run's, not opened yet): cleanup by what the run held, not by name or time."""

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    guarded = subprocess.Popen([sys.executable, "-m", "kit.engine.guard", "--", sys.executable, "-c", _SHM_TREE],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # the guard ends its whole process group, as under procs
    other = f"/dev/shm/psm_kittest_other_{os.getpid()}"
    try:
        name = guarded.stdout.readline().split()[1]
        with open(other, "wb") as f:  # made while the guard runs, by no process of its tree, held by none
            f.write(b"x")
        rc = guarded.wait(timeout=60)
        leftover = os.path.exists(f"/dev/shm/{name}")
        if leftover:
            os.unlink(f"/dev/shm/{name}")
        assert rc == 128 + signal.SIGKILL, (rc, guarded.stderr.read()[-500:])
        assert not leftover, f"/dev/shm/{name} was left behind by the killed tree"
        assert os.path.exists(other), "the guard removed an entry its tree never held"
    finally:
        guarded.kill()
        if os.path.exists(other):
            os.unlink(other)



def _unlink_present(*paths) -> None:
    """Remove what a test made or a tree left in /dev/shm (``None`` and missing paths skipped)."""
    for path in paths:
        if path and os.path.exists(path):
            os.unlink(path)


def _segment_named_in(log, timeout: float = 30.0) -> str:
    """The name the tree printed after ``segment`` in its log, once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and "segment" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.05)
    return log.read_text().split("segment")[1].split()[0]


_SHM_HELD = ("import time, uuid\n"
             "from multiprocessing import resource_tracker, shared_memory\n"
             "name = 'psm_kittest_' + uuid.uuid4().hex[:8]\n"
             "kept = shared_memory.SharedMemory(name=name, create=True, size=1 << 20)\n"
             "resource_tracker.unregister('/' + name, 'shared_memory')\n"
             "print('segment', name, flush=True)\n"
             "time.sleep(300)  # held until the whole tree is killed\n")


def test_terminate_removes_the_shared_memory_of_a_tree_killed_with_its_guard(tmp_path):
    """A tree SIGKILLed whole, its guard included (a fault test's kill, or terminate()'s own SIGKILL after its
    grace while the guard still waits for the command), leaves its /dev/shm segments: the guard that would remove
    them is dead. ManagedProcess.terminate() removes those its tree was seen holding, and leaves alone an entry
    of the same kind that appeared meanwhile but that no process of the tree held."""
    from kit.engine.procs import ManagedProcess

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    log = tmp_path / "tree.log"
    mp = ManagedProcess([sys.executable, "-c", _SHM_HELD], log_path=log, name="shm holder")
    other = f"/dev/shm/psm_kittest_other_{os.getpid()}"
    name = None
    try:
        name = _segment_named_in(log)
        with open(other, "wb") as f:  # made while the tree runs, by no process of it, held by none
            f.write(b"x")
        time.sleep(1.0)  # held a while: the tree is seen holding it
        tree = mp.tree()
        assert any("kit.engine.guard" in " ".join(p.cmdline()) for p in tree)
        for p in tree:  # the whole tree, guard included: nothing in it can clean up
            p.kill()
        psutil.wait_procs(tree, timeout=10)
        assert os.path.exists(f"/dev/shm/{name}")  # what the killed tree left
        assert os.path.exists(mp.shm_ledger)  # what the guard recorded before it was killed: read by terminate()
        mp.terminate()
        assert not os.path.exists(mp.shm_ledger)
        leftover = os.path.exists(f"/dev/shm/{name}")
        assert not leftover, f"/dev/shm/{name} was left behind by the killed tree"
        assert os.path.exists(other), "terminate() removed an entry its tree never held"
    finally:
        mp.terminate()
        _unlink_present(other, f"/dev/shm/{name}" if name else None)



_SEM_HOLDER = textwrap.dedent("""
    import multiprocessing as mp, os, sys
    before = set(os.listdir("/dev/shm"))
    lock = mp.get_context("spawn").Lock()   # a named semaphore, as a spawning vLLM process makes for its child
    print(*(set(os.listdir("/dev/shm")) - before), flush=True)
    sys.stdin.read()                        # hold it until told to go
""")
_SEM_TREE = textwrap.dedent("""
    import multiprocessing as mp, os, signal, sys, time
    before = set(os.listdir("/dev/shm"))
    lock = mp.get_context("spawn").Lock()
    print("semaphore", *(set(os.listdir("/dev/shm")) - before), flush=True)
    time.sleep(1.5)                         # held a while: the guard sees its tree hold it
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_live_semaphore_of_another_run_survives_a_guard_ending(tmp_path):
    """A guard that ends beside another run must not remove that run's semaphores. The creator maps one under a
    temporary (deleted) name only; a name-only check called it unused and unlinked it, and the other run's spawned
    child then failed in ``SemLock._rebuild`` with ``FileNotFoundError``."""

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    go = tmp_path / "go"
    # The guard's tree makes a semaphore of its own, then is SIGKILLed: that one is an orphan to remove.
    guarded = subprocess.Popen([sys.executable, "-m", "kit.engine.guard", "--", sys.executable, "-c", _SEM_TREE, str(go)],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    holder = None
    try:
        mine = guarded.stdout.readline().split()[1]
        # Another run, started while the guard runs, holds a semaphore that no process has opened by name.
        holder = subprocess.Popen([sys.executable, "-c", _SEM_HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        theirs = holder.stdout.readline().split()
        assert theirs
        go.touch()
        assert guarded.wait(timeout=60) == 128 + 9
        assert all(os.path.exists(f"/dev/shm/{n}") for n in theirs), "the guard removed a live run's semaphore"
        assert not os.path.exists(f"/dev/shm/{mine}"), "the killed tree's own semaphore was left"
    finally:
        guarded.kill()
        if holder:
            holder.stdin.close()
            holder.wait(timeout=30)


def test_a_worker_killed_just_after_its_retitling_is_named_as_it_last_logged(tmp_path):
    """Seen in the side-by-side fault test: the killed worker was reported as VLLM::Worker, its title at the last
    poll, though it had retitled itself VLLM::Worker_PP1 just before the kill. Its log lines name it."""
    from kit.engine.procs import ManagedProcess

    log = tmp_path / "engine.log"
    log.write_text("(VllmWorker-1 pid=26497) INFO starting\n(Worker_PP1 pid=26497) INFO loading\n"
                   "(Worker_PP0 pid=26496) INFO loading\n")
    mp = ManagedProcess.__new__(ManagedProcess)  # the method reads log_path only
    mp.log_path = log
    assert mp._logged_title(26497, "VLLM::Worker") == "VLLM::Worker_PP1"
    assert mp._logged_title(26497, "VLLM::Worker_PP1") == "VLLM::Worker_PP1"
    assert mp._logged_title(26497, "VLLM::EngineCore") == "VLLM::EngineCore"  # a name the log gives is no refinement
    assert mp._logged_title(11111, "VLLM::Worker") == "VLLM::Worker"
    mp.log_path = tmp_path / "missing.log"
    assert mp._logged_title(26497, "VLLM::Worker") == "VLLM::Worker"


_DYING_WORKER = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import ctypes, os, signal, sys, time, setproctitle
setproctitle.setproctitle("VLLM:" + ":Worker_" + "PP0")  # not spelt whole: the command lines above would match
print("(Worker_" + "PP0 pid=%d) INFO warming up" % os.getpid(), flush=True)
time.sleep(1.5)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
ctypes.string_at(0)  # a crash in native code: SIGSEGV
''', sys.argv[1]])
time.sleep(60)  # never reaps the child: it stays a zombie, as a worker does until the engine core notices
"""


@pytest.mark.parametrize("how", ["kill", "segv"])
def test_a_worker_dead_without_a_traceback_is_explained(tmp_path, how):
    """A worker that dies by a signal leaves no traceback (seen in CI: "a vLLM process died: VLLM::Worker_PP0" and
    nothing more). The kit names the signal it read from the zombie, turns Python's fault handler on so that a
    crash in native code leaves its stack in the log, and otherwise says what the kernel counted (OOM kills),
    the memory left and the log's last lines."""
    from kit.engine.procs import ManagedProcess

    log = tmp_path / "engine.log"
    with ManagedProcess([sys.executable, "-c", _DYING_WORKER, how], log_path=log, name="fake engine") as mp:
        deadline = time.monotonic() + 30
        dead = None
        while dead is None and time.monotonic() < deadline:
            dead = mp.check_children()
            time.sleep(0.05)
        time.sleep(0.5)  # the fault handler's dump reaches the log
        msg = str(mp.fail(f"a vLLM process died: {dead}"))
    assert dead is not None and dead.startswith("VLLM::Worker_PP0 (pid ")
    if how == "kill":
        assert dead.endswith(", killed by SIGKILL)"), dead
        assert "no traceback in the log" in msg and "memory available now" in msg, msg
        assert "INFO warming up" in msg, msg  # the log's last lines
    else:
        assert dead.endswith(", killed by SIGSEGV)"), dead
        assert "Fatal Python error: Segmentation fault" in msg, msg
        assert 'File "<string>", line 8' in msg, msg  # the crashing line, from the fault handler's dump


_FORKING_WORKER = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", '''
import os, time, setproctitle
setproctitle.setproctitle("VLLM:" + ":Worker_" + "PP0")  # not spelt whole: the command lines above would match
for _ in range(6):  # short-lived children that keep the worker's title (fork without exec), each reaped
    pid = os.fork()
    if pid == 0:
        time.sleep(0.4)
        os._exit(0)
    os.waitpid(pid, 0)
time.sleep(60)
'''])
time.sleep(60)
"""


def test_a_forked_child_of_a_worker_is_not_the_worker(tmp_path):
    """A worker's short-lived children carry its title between fork and exec (torch.compile's C++ compiler runs on
    a cold cache); one of them ending must not read as the worker's death (seen in CI: "a vLLM process died:
    VLLM::Worker_PP0" 4 s into the compile warm-up, on the first compiled run of a fresh machine)."""
    from kit.engine.procs import ManagedProcess

    with ManagedProcess([sys.executable, "-c", _FORKING_WORKER], log_path=tmp_path / "log", name="fake engine") as mp:
        deadline = time.monotonic() + 5
        dead, seen = None, set()
        while time.monotonic() < deadline and dead is None:
            dead = mp.check_children()
            seen |= {p.pid for p in mp.tree()}
            time.sleep(0.05)
        assert dead is None, dead
        assert len(seen) >= 6, seen  # the forked children were there to be seen
        assert list(mp._seen.values()) == ["VLLM::Worker_PP0"]


def test_the_run_folder_goes_with_a_caller_killed_hard(tmp_path):
    """A caller killed with SIGKILL never removes its run's folder under the kit's cache (request, result, logs; a
    failed run's is kept until the caller exits): the guard, which outlives it, removes the folder its tree logs
    in. A folder of another kind beside it stays."""
    run_dir = tmp_path / "kit-run-abc123"
    run_dir.mkdir()
    (run_dir / "request.json").write_text("{}")
    other = tmp_path / "notes"
    other.mkdir()
    caller, pid = start_guarded_caller(_TREE, run_dir / "engine.log", "pid")
    guard = psutil.Process(int(pid))
    caller.kill()
    caller.wait(timeout=10)
    psutil.wait_procs([guard], timeout=30)
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())
    assert other.exists()


_DIST_TREE = textwrap.dedent("""
    import os, signal, sys, tempfile, time, uuid
    ident = "vllm_dist_" + uuid.uuid4().hex
    open(os.path.join(tempfile.gettempdir(), ident), "w").close()   # vLLM's file-store rendezvous, in TMPDIR
    name = ident + "-pp:0-[0-1]-cpushm_1"                          # the CPU PP communicator's segment
    with open("/dev/shm/" + name, "wb") as f:                         # made, and never held while anyone looked
        f.write(b"x")
    print("segment", name, flush=True)
    if sys.argv[1] == "terminate":
        time.sleep(300)  # wait: the test kills the whole tree, guard included (stdin is /dev/null here)
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("who", ["guard", "terminate"])
def test_a_pp_segment_never_seen_held_is_removed_by_its_name(tmp_path, who):
    """A worker killed right after making its PP communicator segment was never seen holding it; the segment's
    name carries the rendezvous id whose file lies in the tree's temp folder, so the guard (or terminate(), when the
    guard was killed too) removes it. A segment of the same kind named after another rendezvous stays."""
    from kit.engine.procs import ManagedProcess

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    other = f"/dev/shm/vllm_dist_{os.getpid():x}kittest-pp:0-[0-1]-cpushm_0"
    open(other, "wb").close()
    log = tmp_path / "tree.log"
    mp = ManagedProcess([sys.executable, "-c", _DIST_TREE, who], log_path=log, name="dist tree")
    name = None
    try:
        name = _segment_named_in(log)
        if who == "terminate":
            tree = mp.tree()
            for p in tree:
                p.kill()
            psutil.wait_procs(tree, timeout=10)
            assert os.path.exists(f"/dev/shm/{name}")  # nobody cleaned up yet
        else:
            mp.popen.wait(timeout=30)  # the guard's own cleanup after its command died
        mp.terminate()
        assert not os.path.exists(f"/dev/shm/{name}"), f"{name} was left behind"
        assert os.path.exists(other), "a segment of another rendezvous was removed"
    finally:
        mp.terminate()
        _unlink_present(other, f"/dev/shm/{name}" if name else None)


_SEM_IGNORING_TERM = textwrap.dedent("""
    import multiprocessing as mp, os, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # as a vLLM worker after a failure: only SIGKILL ends it
    before = set(os.listdir("/dev/shm"))
    lock = mp.get_context("spawn").Lock()           # a named semaphore, registered with this process's tracker
    print("semaphore", *(set(os.listdir("/dev/shm")) - before), flush=True)
    time.sleep(300)
""")


def test_the_resource_tracker_is_killed_last_and_removes_the_semaphores(tmp_path):
    """A tree ended with SIGKILL: its ``multiprocessing.resource_tracker`` gets its seconds after the others are
    gone, and unlinks the named semaphores they registered (killed with them, it left a ``sem.mp-*`` behind after a
    fault test's run)."""
    from kit.engine.guard import kill_trackers_last

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    proc = subprocess.Popen([sys.executable, "-c", _SEM_IGNORING_TERM], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    name = None
    try:
        name = proc.stdout.readline().split()[1]
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
        assert any("resource_tracker" in " ".join(p.cmdline()) for p in tree), [p.cmdline() for p in tree]
        assert os.path.exists(f"/dev/shm/{name}")
        kill_trackers_last(tree)
        psutil.wait_procs(tree, timeout=10)
        assert not os.path.exists(f"/dev/shm/{name}"), f"{name} was left behind"
    finally:
        proc.kill()
        proc.wait(timeout=10)
        _unlink_present(f"/dev/shm/{name}" if name else None)
