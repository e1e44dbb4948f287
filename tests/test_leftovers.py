"""What a process tree of the kit leaves behind: temp-dir sockets and files, and orphans under a subreaper.

vLLM puts its ZMQ ipc sockets (``VLLM_RPC_BASE_PATH``) and its ``vllm_dist_*`` rendezvous files under the temp
dir and never removes them; every tree the kit starts gets its own temp folder (``kit.engine.procs.ManagedProcess``)
that the guard and the teardown remove. The leak checks (``conftest.no_leftovers``) see those entries, and
orphans adopted by a subreaper instead of init.
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import psutil
import pytest
from callers import start_guarded_caller
from conftest import MODEL, ROOT

from kit.engine.procs import ManagedProcess, leftover_temp_entries, leftover_vllm_processes, vllm_temp_entries

# What vLLM does in the temp dir, without vLLM: bind an ipc socket named by a uuid under VLLM_RPC_BASE_PATH and
# create a vllm_dist_* file under tempfile.gettempdir(), then wait (and never clean up).
_VLLM_LIKE = textwrap.dedent("""
    import os, socket, sys, tempfile, time, uuid
    base = os.environ["VLLM_RPC_BASE_PATH"]
    s = socket.socket(socket.AF_UNIX); s.bind(os.path.join(base, str(uuid.uuid4()))); s.listen(1)
    open(os.path.join(tempfile.gettempdir(), "vllm_dist_" + uuid.uuid4().hex), "w").close()
    print("made", base, tempfile.gettempdir(), flush=True)
    time.sleep(300)
""")


def _wait_for(path, text, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"{text!r} never appeared in {path}")


def test_a_tree_gets_its_own_temp_folder_and_teardown_removes_it(tmp_path):
    before = vllm_temp_entries()
    log = tmp_path / "tree.log"
    p = ManagedProcess([sys.executable, "-c", _VLLM_LIKE], log_path=log, name="vllm-like")
    try:
        made = _wait_for(log, "made").split()
        assert made[1] == made[2] == p.tmpdir and os.path.basename(p.tmpdir).startswith("kit-tmp-")
        inside = os.listdir(p.tmpdir)
        assert len(inside) == 2 and any(n.startswith("vllm_dist_") for n in inside), inside
        assert os.path.dirname(p.tmpdir) == tempfile.gettempdir()
    finally:
        p.terminate(grace=2)
    assert not os.path.exists(p.tmpdir)
    assert leftover_temp_entries(before) == []


def test_a_start_that_fails_leaves_no_temp_folder(tmp_path):
    before = vllm_temp_entries()
    with pytest.raises(OSError):
        ManagedProcess([sys.executable], cwd=tmp_path / "no-such-folder")
    assert leftover_temp_entries(before) == []


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_the_guard_removes_the_temp_folder_when_the_caller_dies(tmp_path, how):
    """The caller never runs its teardown; the guard (parent-death signal) ends the tree and removes the folder."""
    log = tmp_path / "tree.log"
    caller, folder = start_guarded_caller(_VLLM_LIKE, log, "tmpdir")
    _wait_for(log, "made")
    assert len(os.listdir(folder)) == 2
    caller.send_signal(how)
    caller.wait(timeout=10)
    deadline = time.monotonic() + 30
    while os.path.exists(folder) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.exists(folder), f"{folder} left behind after the caller got {how.name}"
    assert not os.path.exists(folder + ".shm"), "the guard's /dev/shm ledger was left behind"


def test_leftover_temp_entries_counts_what_no_process_uses():
    before = vllm_temp_entries()
    stale = os.path.join(tempfile.gettempdir(), str(uuid.uuid4()))
    live = os.path.join(tempfile.gettempdir(), str(uuid.uuid4()))
    s = socket.socket(socket.AF_UNIX)
    try:
        open(stale, "w").close()
        s.bind(live)
        s.listen(1)
        assert leftover_temp_entries(before) == [stale]  # the bound socket is someone's live ipc endpoint
    finally:
        s.close()
        for f in (stale, live):
            if os.path.exists(f):
                os.unlink(f)


_SUBREAPER = textwrap.dedent("""
    # A child subreaper (as a container runtime or systemd sets) above the owner: the owner starts a child that
    # starts a vLLM-looking grandchild and exits; the grandchild is adopted by the subreaper, not by init.
    import ctypes, json, subprocess, sys
    ctypes.CDLL("libc.so.6").prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    owner = subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True, timeout=60)
    print(owner.stdout, owner.stderr, flush=True)
""")
_OWNER = textwrap.dedent(f"""
    import os, subprocess, sys, time; sys.path.insert(0, {str(ROOT)!r})
    from kit.engine.procs import leftover_vllm_processes
    t0 = time.time()
    mid = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', "
        "'VLLM::EngineCore']); print(p.pid)"], stdout=subprocess.PIPE, text=True)
    orphan = int(mid.stdout.readline()); mid.wait()
    time.sleep(0.5)
    found = leftover_vllm_processes(since=t0, owner=os.getpid())
    os.kill(orphan, 9)
    print("orphan", orphan, "found", [int(f.split()[0]) for f in found])
""")


def test_an_orphan_adopted_by_a_subreaper_is_still_found():
    out = subprocess.run([sys.executable, "-c", _SUBREAPER, _OWNER], capture_output=True, text=True, timeout=90)
    words = out.stdout.split()
    orphan = int(words[words.index("orphan") + 1])
    found = out.stdout.split("found", 1)[1]
    assert str(orphan) in found, out.stdout + out.stderr


# -- one real vLLM tree ---------------------------------------------------------------------------

@pytest.mark.engine
def test_a_vllm_server_keeps_its_sockets_in_its_own_folder(no_leftovers):
    """A PP=2 server: its ipc sockets are in the tree's folder while it serves, and nothing is left after."""
    from kit.core.topology import Topology
    from kit.engine import Server

    before = vllm_temp_entries()
    srv = Server(Topology(model=MODEL, random_weights=True, pp=2), name="leftovers")
    with srv:
        folder, ledger = srv.proc.tmpdir, srv.proc.shm_ledger
        inside = os.listdir(folder)
        # Beside the folder: the guard's /dev/shm ledger (kit.engine.guard), the kit's own, removed with the tree.
        new_outside = sorted(vllm_temp_entries() - before - {folder, ledger})
    assert inside, "vLLM made no ipc socket in the tree's folder"
    assert not [e for e in new_outside if not e.startswith("/dev/shm/")], new_outside
    assert not os.path.exists(folder) and not os.path.exists(ledger)
    assert leftover_temp_entries(before) == []
    assert leftover_vllm_processes(since=time.time() - 600, owner=os.getpid()) == []
    assert psutil.pid_exists(os.getpid())


_INTERRUPTED_CALLER = textwrap.dedent(f"""
    # A caller that lives on after Ctrl-C, as a Jupyter kernel does: the tree must be gone before it exits.
    import signal, sys, time; sys.path.insert(0, {str(ROOT)!r})
    # Python leaves SIGINT ignored when its parent started it ignored (a shell's background job); a Jupyter
    # kernel, like an interactive caller, has the KeyboardInterrupt handler: install it explicitly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from kit.engine import Server
    from kit.core.topology import Topology
    try:
        Server(Topology(model={MODEL!r}, random_weights=True), name="interrupted", quiet=True).start()
        print("started", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    time.sleep(120)
""")


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


@pytest.mark.engine
def test_ctrl_c_during_server_start_leaves_nothing(no_leftovers, tmp_path):
    """SIGINT to the caller while its server starts: KeyboardInterrupt ends the server tree at once (before,
    only ``ProcessFailed`` was handled and the tree lived until the caller's interpreter exited)."""
    from kit.core.models import cache_dir

    before = vllm_temp_entries()
    # The caller is SIGKILLed at the end, so its failed run's folder (kept for its log until the interpreter
    # exits) would stay: its cache is a folder of this test's, sharing the random checkpoints.
    (tmp_path / "random").symlink_to(cache_dir() / "random", target_is_directory=True)
    caller = subprocess.Popen([sys.executable, "-c", _INTERRUPTED_CALLER], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "KIT_CACHE_DIR": str(tmp_path)})
    try:
        me = psutil.Process(caller.pid)
        deadline = time.monotonic() + 120
        tree: list[psutil.Process] = []
        while time.monotonic() < deadline:  # until vLLM's API server runs under the guard
            tree = me.children(recursive=True)
            if any("vllm.entrypoints" in _cmd(p) for p in tree):
                break
            time.sleep(0.2)
        assert tree, "the server never started"
        time.sleep(2)
        tree = me.children(recursive=True)
        caller.send_signal(signal.SIGINT)
        assert caller.stdout.readline().strip() == "interrupted"
        gone, alive = psutil.wait_procs(tree, timeout=30)
        assert caller.poll() is None, "the caller must still be alive: nothing but start() may clean up"
        assert not alive, f"left behind while the caller lives: {[p.pid for p in alive]}"
        assert leftover_temp_entries(before) == []
    finally:
        caller.kill()
        caller.wait()
