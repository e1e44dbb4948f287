"""Fault injection on real vLLM: each fault injected into a real run, the time until the kit says what
happened, and what the run left behind (processes, ``/dev/shm`` entries, temp folders).

    kit faults --list                                  # the rows
    flock /tmp/kit-vllm.lock kit faults ROW [ROW ...]  # run rows, append to docs/results/faults.jsonl
    kit faults --render                                # write docs/results/faults.md from the JSONL

Each row is short (one engine or one PD pair), so each locked invocation is. A row's ``seconds`` runs from the
injection (the kill, the signal, the disk filling up) to the line the kit printed or raised; ``gone_s`` to the
moment no process of the run was left; then the leak checks of ``tests/conftest.py`` (``no_leftovers``) run,
with 30 s of grace. Whatever a row leaves is listed in the JSONL, then removed so that the next row starts
clean. The callers that get a signal are the ``kit`` CLI (``kit compare``) or, for the PD handoff, a short script
on the Python API (:func:`caller_main`), each in its own process.
"""
from __future__ import annotations

import argparse
import json
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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

from kit.checks.faults_table import render
from kit.core.models import REPO_ROOT, cache_dir
from kit.core.results import machine, versions
from kit.engine.procs import (RUN_ID_ENV, leftover_temp_entries, leftover_vllm_processes, new_run_id, run_processes,
                              tree_tmp_prefix, vllm_temp_entries)
from kit.engine.shm import SHM_DIR, ShmWatch

JSONL = REPO_ROOT / "docs" / "results" / "faults.jsonl"
DOC = REPO_ROOT / "docs" / "results" / "faults.md"
MODEL = os.environ.get("KIT_TEST_MODEL", "tiny-mimo")
PROMPTS = ["def add(a, b):\n    return", "import os\n"]
# `kit compare` as a user runs it, long enough that a signal lands while it generates.
COMPARE = ["compare", "--model", MODEL, "--random", "--pp", "2", "--max-tokens", "600", "--quiet"]


# -- finding and killing vLLM processes (also used by tests/test_reliability.py) -----------------------------

_RUN_IDS: set[str] = set()  # the runs this process started for fault rows: the only ones its cleanup touches


def row_run_id() -> str:
    """A run id for a run a fault row starts (``env={RUN_ID_ENV: id}``), remembered for the row's cleanup."""
    rid = new_run_id()
    _RUN_IDS.add(rid)
    return rid


def vllm_processes(title: str, run_id: str) -> list[psutil.Process]:
    """The run's live processes whose command line contains ``title`` (vLLM retitles its children:
    ``VLLM::Worker_PP1``); another run's processes are never among them."""
    return [p for p in run_processes(run_id) if title in " ".join(_cmdline(p))]


def run_log_says(run_id: str, text: str) -> bool:
    """Whether the engine log of the run ``run_id`` (its ``kit.engine.child``'s ``kit-run-*/engine.log``)
    contains ``text``."""
    for p in run_processes(run_id):
        cmd = _cmdline(p)
        if "kit.engine.child" in cmd and len(cmd) >= 2:
            log = Path(cmd[cmd.index("kit.engine.child") + 1]).parent / "engine.log"
            try:
                if text in log.read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def kill_when_generating(title: str, stop: threading.Event, run_id: str, killed: list | None = None,
                         also_alive: Callable[[], bool] | None = None) -> None:
    """SIGKILL the run's processes titled ``title`` once it has started generating (1 s into it; with
    ``also_alive``, once that also holds); the kill's ``time.monotonic()`` goes to ``killed``."""
    while not stop.is_set():
        if run_log_says(run_id, "[kit.engine.child] job generate") and vllm_processes(title, run_id) \
                and (also_alive is None or also_alive()):
            time.sleep(1.0)  # mid-request
            if killed is not None:
                killed.append(time.monotonic())
            for p in vllm_processes(title, run_id):
                try:
                    p.send_signal(signal.SIGKILL)
                except psutil.Error:
                    pass
            return
        time.sleep(0.3)


def kill_tree(procs: list[psutil.Process], spare_guard: bool = False) -> None:
    """SIGKILL every process given (with ``spare_guard``, all but the kit's guard, which then cleans up as it
    does after any death in its tree)."""
    for p in procs:
        if spare_guard and "kit.engine.guard" in " ".join(_cmdline(p)):
            continue
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass


# -- measuring one row ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One fault: ``run()`` injects it and returns ``{"seconds", "line", "outcome", ...}``."""

    name: str
    fault: str
    phase: str
    how: str
    run: Callable[[], dict]


def _first_line(text: str) -> str:
    return next((l.strip() for l in str(text).splitlines() if l.strip()), "")


def measure(row: Row) -> dict:
    """Run one row and the leak checks after it; remove what it left (after recording it)."""
    t0, before, start = time.time(), vllm_temp_entries(), time.monotonic()
    # Every process the row starts (in this process, or in a caller it starts) carries the row's run id, unless
    # the row gives a run its own (also remembered): the cleanup below touches those runs only, and the /dev/shm
    # entries their processes were seen holding (ShmWatch), never entries found by name or time.
    earlier = set(_RUN_IDS)
    saved = os.environ.get(RUN_ID_ENV)
    os.environ[RUN_ID_ENV] = row_run_id()
    shm = ShmWatch(lambda: [p.pid for rid in _RUN_IDS - earlier for p in run_processes(rid)]).start()
    try:
        res = row.run()
    except Exception as e:  # noqa: BLE001 - a row that breaks is recorded as such, not hidden
        res = {"seconds": None, "line": f"row failed: {type(e).__name__}: {_first_line(e)}", "outcome": "error"}
    finally:
        shm.stop()
        if saved is None:
            os.environ.pop(RUN_ID_ENV, None)
        else:
            os.environ[RUN_ID_ENV] = saved
    ours = tuple(tree_tmp_prefix(rid) for rid in _RUN_IDS - earlier)
    # This process's ancestors (the shell, flock) are never leftovers, whatever their command lines say.
    mine = {p.pid for p in psutil.Process().parents()}
    deadline = time.monotonic() + 30
    while True:
        procs = leftover_vllm_processes(exclude=mine, since=t0, owner=os.getpid())
        procs += [f"{p.pid} {' '.join(p.cmdline())[:160]}" for p in res.pop("tree_procs", [])
                  if _alive(p) and not any(x.startswith(f"{p.pid} ") for x in procs)]
        # Temp entries new since the row began are reported (the rows run under the vLLM lock), but only the
        # folders of the row's own trees are removed below.
        temp = [f for f in leftover_temp_entries(before) if not f.startswith(SHM_DIR + "/")]
        shm_left = shm.left()
        if not (procs or temp or shm_left) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    res.update({
        "row": row.name, "fault": row.fault, "phase": row.phase, "how": row.how,
        "leftover_processes": procs, "leftover_shm": [f"{SHM_DIR}/{n}" for n in shm_left],
        "leftover_temp": temp,
        "row_seconds": round(time.monotonic() - start, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)),
    })
    # The record has them; the next row starts clean: only processes of the runs this process started.
    for p in [p for rid in _RUN_IDS for p in run_processes(rid)]:
        if p.pid not in mine:
            try:
                p.kill()
            except psutil.Error:
                pass
    shm.remove()
    for f in temp:
        if ours and os.path.basename(f).startswith(ours):
            shutil.rmtree(f, ignore_errors=True)
    return res


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# -- callers in their own process ------------------------------------------------------------------------

_SIGINT_DEFAULT_EXEC = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                        "os.execvp(sys.argv[1], sys.argv[1:])")


class Caller:
    """A caller process (``kit ...`` or :func:`caller_main`) whose output lines are read with their times."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None):
        # SIGINT back to its default before the caller starts, so that Python installs its KeyboardInterrupt
        # handler even when this process runs as a shell's background job (which starts it ignored). A small exec
        # wrapper does it, not preexec_fn (unsafe while this process runs threads).
        self.proc = subprocess.Popen([sys.executable, "-c", _SIGINT_DEFAULT_EXEC, *argv], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "KIT_QUIET": "1",
                                          **(env or {})})
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.snapshot: list[psutil.Process] = []

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def tree(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def wait_for(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the caller exited (code {self.proc.returncode}) before {what}: "
                                   + " | ".join(l for _, l in self.lines[-5:]))
            time.sleep(0.1)
        raise RuntimeError(f"no {what} within {timeout:.0f} s")

    def said(self, text: str) -> bool:
        return any(text in l for _, l in self.lines)

    def signal(self, sig: int) -> float:
        """Remember the tree, send ``sig`` to the caller; returns the time it was sent."""
        self.snapshot = [psutil.Process(self.proc.pid), *self.tree()]
        t = time.monotonic()
        self.proc.send_signal(sig)
        return t

    def outcome(self, sent: float, timeout: float = 120.0) -> dict:
        """After a signal: when the caller printed its last line and exited, when the whole tree was gone."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)
        gone = psutil.wait_procs(self.snapshot[1:], timeout=60)[1]
        gone_at = time.monotonic()
        after = [(t, l) for t, l in self.lines if t >= sent and l.strip()]
        own = [(t, l) for t, l in after if not l.startswith((" ", "\t"))]  # the kit's line, not a traceback's
        last = own[-1] if own else (after[-1] if after else None)
        return {"seconds": round(last[0] - sent, 2) if last else None, "line": last[1].strip() if last else "",
                "exit_code": self.proc.returncode, "gone_s": round(gone_at - sent, 2) if not gone else None,
                "tree_procs": self.snapshot[1:]}


def _kit(*args: str) -> list[str]:
    return [sys.executable, "-m", "kit", *args]


def _has_vllm(caller: Caller) -> bool:
    return any(re.search(r"VLLM::|EngineCore", " ".join(_cmdline(p))) for p in caller.tree())


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _caller_row(sig: int, phase: str) -> Callable[[], dict]:
    def run() -> dict:
        rid = row_run_id()
        c = Caller(_kit(*COMPARE), env={RUN_ID_ENV: rid})
        if phase == "starting":  # the engine core exists, the model is loading: no generation yet
            c.wait_for(lambda: _has_vllm(c), 300, "a vLLM process")
            hit = "starting" if not run_log_says(rid, "[kit.engine.child] job generate") else "generating"
        else:
            c.wait_for(lambda: run_log_says(rid, "[kit.engine.child] job generate"), 300, "generation")
            time.sleep(1.0)
            hit = "generating"
        sent = c.signal(sig)
        out = c.outcome(sent)
        out["phase_hit"] = hit
        if sig == signal.SIGKILL:
            out["line"] = "(the caller is gone; nothing to print)"
            out["seconds"] = None
        return out
    return run


def _pd_handoff_row(sig: int) -> Callable[[], dict]:
    def run() -> dict:
        c = Caller([sys.executable, "-m", "kit.checks.faults", "--caller", "pd-handoff"])
        c.wait_for(lambda: c.said("caller: handoff"), 400, "the PD handoff")
        sent = c.signal(sig)
        out = c.outcome(sent)
        out["phase_hit"] = "PD handoff (between the producer's answer and the consumer call)"
        if sig == signal.SIGKILL:
            out["line"] = "(the caller is gone; nothing to print)"
            out["seconds"] = None
        return out
    return run


def caller_main(kind: str) -> int:
    """A caller on the Python API, as a notebook would be: ``pd-handoff`` runs a PD pair whose router pauses
    5 s between the producer's answer and the consumer call, and says ``caller: handoff`` when the pause starts."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a Jupyter kernel, whatever the parent did
    from kit import pd

    try:
        p, c = pd.pd_topologies(MODEL, 1, None, 1, None, random_weights=True)
        with pd.PDPair(p, c, warmup=False) as pair:
            orig = pair._watched

            def watched(what, fn, *args):
                out = orig(what, fn, *args)
                if what == "producer prefill":
                    print("caller: handoff", flush=True)
                return out

            pair._watched = watched
            rec = pair.complete(PROMPTS[0], max_tokens=16, pause_before_decode=5.0)
            print(f"caller: done, error={rec.error}", flush=True)
    except KeyboardInterrupt:
        print("caller: KeyboardInterrupt; PDPair.__exit__ ran", flush=True)
        return 130
    return 0


# -- in-process rows ---------------------------------------------------------------------------------------

def _topology(pp: int = 2, **kw):
    from kit.core.topology import Topology

    return Topology(model=MODEL, random_weights=True, pp=pp, **kw)


def _worker_death() -> dict:
    from kit import engine

    stop, killed, rid = threading.Event(), [], row_run_id()
    th = threading.Thread(target=kill_when_generating, args=("VLLM::Worker_PP1", stop, rid, killed), daemon=True)
    th.start()
    try:
        engine.generate(_topology(), PROMPTS * 32, max_tokens=900, timeout=600, quiet=True, env={RUN_ID_ENV: rid})
        return {"seconds": None, "line": "no error: the run finished", "outcome": "missed"}
    except engine.EngineError as e:
        return {"seconds": round(time.monotonic() - killed[0], 2) if killed else None, "line": _first_line(e),
                "outcome": "EngineError"}
    finally:
        stop.set()


def _server_killed(role: str) -> Callable[[], dict]:
    def run() -> dict:
        from kit import pd

        p, c = pd.pd_topologies(MODEL, 1, None, 1, None, random_weights=True)
        with pd.PDPair(p, c) as pair:
            killed: list[float] = []
            if role == "consumer":  # mid-decode, streaming a long answer
                def later():
                    time.sleep(2.0)
                    killed.append(time.monotonic())
                    kill_tree(pair.consumer.proc.tree(), spare_guard=True)

                threading.Thread(target=later, daemon=True).start()
                rec = pair.complete(PROMPTS[1], max_tokens=1000, stream=True)
            else:  # after its prefill answer, before the consumer reads the KV
                orig = pair._watched

                def watched(what, fn, *args):
                    out = orig(what, fn, *args)
                    if what == "producer prefill":
                        killed.append(time.monotonic())
                        kill_tree(pair.producer.proc.tree(), spare_guard=True)
                    return out

                pair._watched = watched
                rec = pair.complete(PROMPTS[0], max_tokens=16)
            done = time.monotonic()
        return {"seconds": round(done - killed[0], 2) if killed else None, "line": _first_line(rec.error or "no error"),
                "outcome": "PDRequest.error" if rec.error else "missed"}
    return run


def _held_port(host: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    s.bind((host, 0))
    s.listen(1)
    return s


def _port_server() -> dict:
    from kit.core.topology import TopologyError
    from kit.engine import Server

    with _held_port() as s:
        t0 = time.monotonic()
        try:
            Server(_topology(pp=1), port=s.getsockname()[1], quiet=True).start()
            return {"seconds": None, "line": "started although the port is taken", "outcome": "missed"}
        except TopologyError as e:
            return {"seconds": round(time.monotonic() - t0, 2), "line": _first_line(e), "outcome": "TopologyError"}


def _port_side_channel() -> dict:
    from kit import pd
    from kit.engine import EngineError

    p, c = pd.pd_topologies(MODEL, 1, None, 1, None, random_weights=True)
    with _held_port() as s:
        pair = pd.PDPair(p, c, warmup=False)
        taken = s.getsockname()[1]
        orig = pair._free_port
        pair._free_port = lambda: (pair._ports.add(taken), taken)[1] if taken not in pair._ports else orig()
        t0 = time.monotonic()
        try:
            with pair:
                return {"seconds": None, "line": "started although the port is taken", "outcome": "missed"}
        except EngineError as e:
            return {"seconds": round(time.monotonic() - t0, 2), "line": _first_line(e), "outcome": "EngineError",
                    "port": taken}


def _port_master() -> dict:
    from kit.core.topology import TopologyError
    from kit.engine import multinode

    t = _topology(pp=2, nodes=2)
    ip = t.node_plan(port=0, master_port=1)[0].ip
    with _held_port(ip) as s:
        real = multinode.free_port
        multinode.free_port = lambda: s.getsockname()[1]
        t0 = time.monotonic()
        try:
            with multinode.MultiNode(t, quiet=True):
                return {"seconds": None, "line": "started although the port is taken", "outcome": "missed"}
        except TopologyError as e:
            return {"seconds": round(time.monotonic() - t0, 2), "line": _first_line(e), "outcome": "TopologyError"}
        finally:
            multinode.free_port = real


def _disk_full() -> dict:
    """The cache folder (random checkpoint, engine log, result file) on a 32 MiB tmpfs in the caller's own
    mount namespace; the caller fills it once its engine generates (``caller_main('disk-full')``)."""
    unshare = shutil.which("unshare")
    if not unshare:
        return {"seconds": None, "line": "not run: no unshare(1)", "outcome": "skipped"}
    ns = [unshare, "--mount"] if os.geteuid() == 0 else [unshare, "--user", "--map-root-user", "--mount"]
    folder = tempfile.mkdtemp(prefix="kit-faults-disk-")
    script = (f"mount -t tmpfs -o size=32m tmpfs {folder} && exec env KIT_CACHE_DIR={folder} "
              f"{sys.executable} -m kit.checks.faults --caller disk-full")
    try:
        c = Caller([*ns, "sh", "-c", script])
        c.wait_for(lambda: c.said("caller: full"), 300, "a full disk")
        sent = next(t for t, l in c.lines if "caller: full" in l)
        c.snapshot = [psutil.Process(c.proc.pid), *c.tree()]
        out = c.outcome(sent, timeout=600)
        out["line"] = next((l for _, l in reversed(c.lines) if l.startswith("caller: error")), out["line"])
        out["line"] += "".join(" / " + l.strip() for _, l in c.lines if "hint:" in l)
        out["seconds"] = next((round(t - sent, 2) for t, l in c.lines if l.startswith("caller: error")), None)
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _disk_full_caller() -> int:
    from kit import engine

    t = _topology()
    rid = new_run_id()

    def fill() -> None:
        while not run_log_says(rid, "[kit.engine.child] job generate"):
            time.sleep(0.2)
        try:
            with open(cache_dir() / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * (1 << 20))
        except OSError:
            print("caller: full", flush=True)

    threading.Thread(target=fill, daemon=True).start()
    try:
        engine.generate(t, PROMPTS * 8, max_tokens=400, timeout=600, quiet=True, env={RUN_ID_ENV: rid})
        print("caller: no error", flush=True)
        return 0
    except Exception as e:  # noqa: BLE001 - the line the kit gives is the measurement
        print(f"caller: error: {type(e).__name__}: {_first_line(e)}", flush=True)
        for line in str(e).splitlines()[1:]:
            print("  " + line, flush=True)
        return 1


def _two_runs() -> dict:
    """Two `kit compare` runs started together on a fresh seed: both write the same random checkpoint."""
    seed = str(int(time.time()) % 100000 + 1000)
    argv = _kit("compare", "--model", MODEL, "--random", "--seed", seed, "--pp", "2", "--max-tokens", "16",
                "--limit", "2", "--quiet")
    t0 = time.monotonic()
    a, b = Caller(argv), Caller(argv)
    for c in (a, b):
        c.proc.wait(timeout=600)
        c._reader.join(timeout=5)
    lines = [next((l for _, l in reversed(c.lines) if l.startswith("identical")), c.lines[-1][1] if c.lines else "")
             for c in (a, b)]
    return {"seconds": None, "wall_s": round(time.monotonic() - t0, 2), "line": f"exit codes {a.proc.returncode}, {b.proc.returncode}: "
            + " / ".join(lines), "outcome": "both passed" if a.proc.returncode == b.proc.returncode == 0 else "failed",
            "seed": seed}


ROWS: list[Row] = [
    Row("worker-death", "worker death (PP=2)", "generating", "SIGKILL to VLLM::Worker_PP1 1 s into generation",
        _worker_death),
    Row("sigint-starting", "caller SIGINT", "starting", "`kit compare --pp 2`: SIGINT as its engine core appears",
        _caller_row(signal.SIGINT, "starting")),
    Row("sigint-generating", "caller SIGINT", "generating", "`kit compare --pp 2`: SIGINT 1 s into generation",
        _caller_row(signal.SIGINT, "generating")),
    Row("sigint-handoff", "caller SIGINT", "PD handoff", "PDPair caller: SIGINT between prefill answer and decode call",
        _pd_handoff_row(signal.SIGINT)),
    Row("sigkill-starting", "caller SIGKILL", "starting", "`kit compare --pp 2`: SIGKILL as its engine core appears",
        _caller_row(signal.SIGKILL, "starting")),
    Row("sigkill-generating", "caller SIGKILL", "generating", "`kit compare --pp 2`: SIGKILL 1 s into generation",
        _caller_row(signal.SIGKILL, "generating")),
    Row("sigkill-handoff", "caller SIGKILL", "PD handoff", "PDPair caller: SIGKILL between prefill answer and decode call",
        _pd_handoff_row(signal.SIGKILL)),
    Row("producer-killed", "server killed: PD producer", "PD handoff", "SIGKILL to the producer's vLLM processes (not the kit's guard) after its prefill answer",
        _server_killed("producer")),
    Row("consumer-killed", "server killed: PD consumer", "generating", "SIGKILL to the consumer's vLLM processes (not the kit's guard) 2 s into a 1000-token stream",
        _server_killed("consumer")),
    Row("disk-full", "disk full", "generating", "cache folder on a 32 MiB tmpfs, filled 0 s into generation",
        _disk_full),
    Row("port-server", "port taken: server HTTP port", "starting", "Server(port=P) with P held by another socket",
        _port_server),
    Row("port-side-channel", "port taken: NIXL side channel", "starting",
        "PDPair whose producer side-channel port is held by another socket", _port_side_channel),
    Row("port-master", "port taken: master port (multi-node)", "starting",
        "MultiNode (2 nodes) whose master port is held on the leader's address", _port_master),
    Row("two-runs", "two kit runs at once", "all", "two `kit compare --pp 2` on one fresh seed, started together",
        _two_runs),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kit faults", description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="*", help="row names (see --list)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--render", action="store_true", help=f"write {DOC.relative_to(REPO_ROOT)}")
    ap.add_argument("--out", type=Path, default=JSONL)
    ap.add_argument("--caller", choices=["pd-handoff", "disk-full"], help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.caller == "pd-handoff":
        return caller_main(a.caller)
    if a.caller == "disk-full":
        return _disk_full_caller()
    names = {r.name: r for r in ROWS}
    if a.list:
        for r in ROWS:
            print(f"{r.name:20s} {r.fault} [{r.phase}]: {r.how}")
        return 0
    bad = [n for n in a.rows if n not in names]
    if bad:
        print(f"kit faults: error: unknown row {bad[0]!r} (see --list)", file=sys.stderr)
        return 2
    for n in a.rows:
        res = measure(names[n])
        res.update({"machine": machine(), "versions": versions(),
                    "command": f"flock /tmp/kit-vllm.lock kit faults {n}"})
        with open(a.out, "a") as f:
            f.write(json.dumps(res) + "\n")
        print(json.dumps({k: res[k] for k in ("row", "seconds", "line", "gone_s", "leftover_processes",
                                               "leftover_shm", "leftover_temp", "row_seconds") if k in res}), flush=True)
    if a.render:
        render(a.out, DOC, [r.name for r in ROWS], MODEL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
