"""A local Ray cluster of several nodes on loopback, for vLLM's Ray executor (``backend="ray"``).

:class:`LocalRayCluster` starts a head node and ``num_nodes - 1`` further nodes on this machine, each a
separate ``ray start --block`` process tree in its own session (:class:`~kit.engine.procs.ManagedProcess`), node
``i`` on loopback address 127.0.0.(2+i) with its own ports, a per-node custom resource ``kit_node_<i>`` and
per-node environment (e.g. ``VLLM_CPU_OMP_THREADS_BIND``). Or it attaches to an existing cluster (``address=`` or
``RAY_ADDRESS``) and then starts and stops nothing.

Ray 2.60 binds most of its servers to every interface (docs/ray.md), so the nodes run inside a private network
(:class:`kit.engine.netns.PrivateNetwork`): the caller's (``network=``, a multi-node run's), or one the cluster
makes and removes itself. Where none can be made, starting needs ``open_network=True`` (the caller's opt-in).

Teardown ends ONLY what it started: the ``ray start`` trees (gcs_server, raylet, plasma store, dashboard,
agents, log monitor, Ray workers), found as descendants of those processes, members of their process
groups, or processes whose command line names this cluster's temp dir. It does not call ``ray stop``:
that command finds Ray processes by name on the whole machine and would end other users' clusters too.
Each ``ray start`` runs under :mod:`kit.engine.guard` (as everything the kit starts does), which ends
its node's process group when the process that started the cluster dies (a killed notebook kernel).

Ray is an optional dependency (``pip install "ray[default]==2.60.0"``); importing this module does not
need it, starting a cluster does.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from kit.core.net import free_ports, local_node_ip
from kit.engine.shm import ShmWatch
from kit.engine.lifecycle import Lifecycle
from kit.engine.procs import ManagedProcess

# Node i listens on kit.core.net.local_node_ip(i) (127.0.0.(2+i)).

# Ray's start-up deadlines are short for a loaded 2-core machine. Measured with Ray 2.60: the dashboard agent
# took > 15 s to start, and the raylet aborted ("Check failed ... Timed out waiting for file
# .../dashboard_agent_listen_port_<node id>" in NodeManager::WaitForDashboardAgentPorts). That 15 s wait did
# NOT follow RAY_agent_register_timeout_ms; hence nodes start one at a time and a failed node start is retried
# (``start_attempts``). These settings lengthen Ray's other start-up waits.
SLOW_MACHINE_ENV = {
    "RAY_agent_register_timeout_ms": "180000",
    "RAY_worker_register_timeout_seconds": "180",
}
# Fewer listeners beyond loopback: without metrics collection the dashboard agent starts no Prometheus exporter
# (with a node address other than 127.0.0.1 it binds every interface: ray/dashboard/modules/reporter/reporter_agent.py;
# the raylet passes the agent --disable-metrics-collection). The kit reads vLLM's metrics from its own server.
LOOPBACK_ENV = {"RAY_enable_metrics_collection": "0"}
# The ports of Ray's core-worker gRPC servers (one in every Ray worker and driver): Ray's default range, given
# explicitly so that a listener can be told apart as Ray's (tests/test_ray.py).
WORKER_PORTS = (10002, 19999)
# `import ray` imports jsonschema, and jsonschema imports `rfc3987_syntax` when it is installed (the Jupyter
# stack pulls it in via jsonschema[format-nongpl]); that module builds ~35 Lark parsers at import. Measured
# here: the dashboard agent's imports took 4.9 s CPU with it and 1.6 s without. With ``fast_imports`` the
# node processes get a module on PYTHONPATH that makes that optional import fail, so jsonschema skips it
# (it only validates the "iri" formats, which neither Ray nor vLLM use). Upstream: python-jsonschema #1428.
_RFC3987_SHIM = (
    '"""ppmtp-kit: make jsonschema skip the slow optional rfc3987_syntax import in local Ray nodes."""\n'
    'raise ImportError("rfc3987_syntax disabled for kit.engine.raycluster nodes (slow import)")\n'
)
# Object store per node: small, the kit's tensors are tiny (Ray's default is 30% of RAM per node).
DEFAULT_OBJECT_STORE_BYTES = 256 * 1024 * 1024


class RayClusterError(RuntimeError):
    """The local Ray cluster did not come up (or Ray is not installed)."""


def _ray_cli() -> str:
    exe = Path(sys.executable).with_name("ray")
    if exe.exists():
        return str(exe)
    found = shutil.which("ray")
    if not found:
        raise RayClusterError("the `ray` command is not installed: pip install \"ray[default]==2.60.0\"")
    return found


@dataclass
class RayNode:
    index: int
    ip: str
    resource: str
    env: dict[str, str]
    proc: ManagedProcess | None = None
    log_path: Path | None = None
    node_id: str | None = None


@dataclass
class LocalRayCluster(Lifecycle):
    """``with LocalRayCluster(num_nodes=2, cpus_per_node=1) as c: ... c.address ...``

    ``node_env(i)`` returns extra environment for node ``i`` (Ray workers inherit their raylet's
    environment, and vLLM's RayExecutorV2 does not overwrite node-local variables with the driver's).
    ``node_prefix(i)`` returns what node ``i``'s ``ray start`` runs under (e.g. ``taskset -c 1``: the whole node,
    its Ray workers included, inherits the affinity).
    ``address`` (or ``RAY_ADDRESS`` when ``attach_env=True``) attaches to a running cluster instead.
    """

    num_nodes: int = 2
    cpus_per_node: int = 1
    address: str | None = None
    attach_env: bool = True
    node_env: "callable | None" = None
    node_prefix: "callable | None" = None  # i -> what node i's `ray start` runs under (``taskset -c 1``)
    object_store_bytes: int = DEFAULT_OBJECT_STORE_BYTES
    start_timeout: float = 240.0
    start_attempts: int = 3
    fast_imports: bool = True
    temp_dir: str | None = None
    keep_logs: bool = False  # True keeps the temp dir (node logs, Ray's session) after stop(), for debugging
    network: "object | None" = None  # the kit.engine.netns.PrivateNetwork the nodes run in (None: make one)
    open_network: bool = False  # no private network: Ray's servers on the host's interfaces (an explicit opt-in)
    nodes: list[RayNode] = field(default_factory=list)
    started: bool = False
    _own_network: bool = False

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "LocalRayCluster":
        if self.address is None and self.attach_env and os.environ.get("RAY_ADDRESS"):
            self.address = os.environ["RAY_ADDRESS"]
        if self.address is not None:  # attach: start nothing, stop nothing
            self._wait_nodes(expected=None)
            return self
        if self.num_nodes < 1 or self.cpus_per_node < 1:
            raise RayClusterError("num_nodes and cpus_per_node must be >= 1")
        ray = _ray_cli()
        if self.network is None and not self.open_network:
            from kit.engine import netns

            if why := netns.unavailable():
                raise RayClusterError(f"Ray listens on every interface and no private network can be made here "
                                      f"({why}): run as root, or pass open_network=True")
            self.network, self._own_network = netns.PrivateNetwork().start(), True
        # Ray puts Unix sockets under the temp dir: keep the path short (< 108 bytes for AF_UNIX).
        self.temp_dir = self.temp_dir or tempfile.mkdtemp(prefix="kitray-", dir="/tmp")
        # vLLM's workers run inside the nodes' Ray workers, outside any kit.engine.guard tree: the shared memory they
        # hold (the CPU PP communicator's `<id>-pp:...-cpushm_*`) is recorded and removed when the cluster stops.
        self._shm = ShmWatch(lambda: [p.pid for p in self._ours()]).start()
        self.started = True
        try:
            gcs_port = 0
            # One node at a time, each up before the next starts: on a loaded 2-core machine parallel starts
            # make Ray's helpers miss the raylet's fixed 15 s wait for the dashboard agent's port file.
            for i in range(self.num_nodes):
                for attempt in range(1, self.start_attempts + 1):
                    if i == 0:  # a fresh GCS port for each head attempt
                        gcs_port = free_ports(1)[0]
                        self.address = f"{local_node_ip(0)}:{gcs_port}"
                    self._start_node(ray, i, gcs_port, attempt)
                    if self._wait_node_started(self.nodes[i]):
                        break
                    if attempt == self.start_attempts:
                        raise RayClusterError(f"ray node {i} did not start in {self.start_attempts} attempts"
                                              + self._log_tail())
                    self._stop_node(self.nodes.pop())  # this node's processes only, then try again
            self._wait_nodes(expected=self.num_nodes)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_node_started(self, node: "RayNode") -> bool:
        """True once ``ray start`` reports the node up; False if it exited (e.g. the raylet aborted)."""
        deadline = time.monotonic() + self.start_timeout
        raylet_seen = False
        while time.monotonic() < deadline:
            text = node.log_path.read_text(errors="replace") if node.log_path.exists() else ""
            if "Ray runtime started" in text:
                return True
            if not node.proc.alive():
                return False
            # A raylet that aborted is noticed by `ray start` only a minute later: watch it directly.
            names = set()
            for p in node.proc.tree():
                try:
                    names.add(p.name())
                except psutil.Error:
                    pass
            if "raylet" in names:
                raylet_seen = True
            elif raylet_seen:
                return False
            time.sleep(0.5)
        raise RayClusterError(f"ray node {node.index} not up after {self.start_timeout:.0f} s" + self._log_tail())

    def _start_node(self, ray: str, i: int, gcs_port: int, attempt: int = 1) -> None:
        resource = f"kit_node_{i}"
        agent_http, agent_grpc, rt_env, metrics, nm_port, om_port, dash, client = free_ports(8)
        cmd = [ray, "start", "--block", "--disable-usage-stats",
               "--node-ip-address", local_node_ip(i), "--num-cpus", str(self.cpus_per_node), "--num-gpus", "0",
               "--resources", json.dumps({resource: 1}), "--labels", f"kit-node={i}",
               "--temp-dir", str(self.temp_dir),
               "--object-store-memory", str(self.object_store_bytes),
               "--dashboard-agent-listen-port", str(agent_http),
               "--dashboard-agent-grpc-port", str(agent_grpc),
               "--runtime-env-agent-port", str(rt_env),
               "--metrics-export-port", str(metrics),
               "--node-manager-port", str(nm_port),
               "--object-manager-port", str(om_port),
               "--min-worker-port", str(WORKER_PORTS[0]), "--max-worker-port", str(WORKER_PORTS[1])]
        if i == 0:
            # No dashboard UI and no autoscaler monitor: fewer processes to start on 2 cores.
            cmd += ["--head", "--port", str(gcs_port), "--include-dashboard", "false", "--no-monitor",
                    "--dashboard-port", str(dash), "--ray-client-server-port", str(client)]
        else:
            cmd += ["--address", f"{local_node_ip(0)}:{gcs_port}"]
        env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": "", "PYTHONUNBUFFERED": "1", **SLOW_MACHINE_ENV,
               **LOOPBACK_ENV}
        if self.fast_imports:
            shim = Path(self.temp_dir) / "pyshim"
            shim.mkdir(exist_ok=True)
            (shim / "rfc3987_syntax.py").write_text(_RFC3987_SHIM)
            env["PYTHONPATH"] = os.pathsep.join(x for x in (str(shim), os.environ.get("PYTHONPATH", "")) if x)
        extra = dict(self.node_env(i)) if self.node_env else {}
        env.update(extra)
        log_path = Path(self.temp_dir) / f"kit-node{i}-try{attempt}.log"
        prefix = self._inside() + (list(self.node_prefix(i)) if self.node_prefix else [])
        proc = ManagedProcess(prefix + cmd, env=env, log_path=log_path, name=f"ray node {i}")
        self.nodes.append(RayNode(index=i, ip=local_node_ip(i), resource=resource, env=extra, proc=proc, log_path=log_path))

    def _inside(self) -> list[str]:
        """What a command runs under to be in the nodes' network (nothing on the host's loopback)."""
        return self.network.prefix() if self.network is not None else []

    def _check_alive(self) -> None:
        for n in self.nodes:
            if n.proc is not None and not n.proc.alive():
                raise RayClusterError(f"ray node {n.index} exited with code {n.proc.popen.returncode}"
                                      + self._log_tail())

    def _log_tail(self, lines: int = 15) -> str:
        out = []
        for n in self.nodes:
            if n.log_path and n.log_path.exists():
                tail = n.log_path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"\n  --- {n.log_path} ---\n    " + "\n    ".join(tail))
        return "".join(out)

    def node_table(self) -> list[dict]:
        """Live nodes as the GCS sees them (``ray list nodes`` without the dashboard), via a short-lived
        subprocess so this process never becomes a Ray driver."""
        code = ("import json, ray; ray.init(address=%r, logging_level='ERROR', log_to_driver=False);"
                "print('KITNODES' + json.dumps([{'node_id': n['NodeID'], 'alive': n['Alive'], "
                "'ip': n['NodeManagerAddress'], 'resources': n['Resources'], 'labels': n.get('Labels', {})} "
                "for n in ray.nodes()]))" % self.address)
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        env.pop("RAY_ADDRESS", None)
        shim = Path(self.temp_dir) / "pyshim" if self.temp_dir else None
        if shim is not None and shim.is_dir():
            env["PYTHONPATH"] = os.pathsep.join(x for x in (str(shim), env.get("PYTHONPATH", "")) if x)
        r = subprocess.run(self._inside() + [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env=env)
        for line in r.stdout.splitlines():
            if line.startswith("KITNODES"):
                return json.loads(line[len("KITNODES"):])
        raise RayClusterError(f"could not list Ray nodes at {self.address}: {r.stderr[-2000:]}")

    def _wait_nodes(self, expected: int | None) -> None:
        deadline = time.monotonic() + self.start_timeout
        last: list[dict] = []
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                last = [n for n in self.node_table() if n["alive"]]
            except (RayClusterError, subprocess.TimeoutExpired):
                last = []
            if expected is None and last:
                return
            if expected is not None and len(last) >= expected:
                by_res = {r: n["node_id"] for n in last for r in n["resources"] if r.startswith("kit_node_")}
                for node in self.nodes:
                    node.node_id = by_res.get(node.resource)
                return
            time.sleep(2.0)
        raise RayClusterError(f"expected {expected} live Ray nodes at {self.address}, saw {len(last)} after "
                              f"{self.start_timeout:.0f} s" + self._log_tail())

    # -- teardown -------------------------------------------------------------------------------
    def _ours(self) -> list[psutil.Process]:
        """Every live process of the nodes this object started."""
        found: dict[int, psutil.Process] = {}
        for n in self.nodes:
            if n.proc is not None:
                for p in n.proc.tree():
                    found[p.pid] = p
        if self.temp_dir:
            for pid in psutil.pids():  # not process_iter: its shared cache is not safe across threads (ShmWatch)
                try:
                    p = psutil.Process(pid)
                    if self.temp_dir in " ".join(p.cmdline()):
                        found[pid] = p
                except psutil.Error:
                    continue
        # Ray workers are children of raylets; include descendants of everything found.
        for p in list(found.values()):
            try:
                for c in p.children(recursive=True):
                    found[c.pid] = c
            except psutil.Error:
                pass
        found.pop(os.getpid(), None)
        return list(found.values())

    def _stop_node(self, node: "RayNode") -> None:
        """End one node's ``ray start`` tree (used between start attempts)."""
        procs = []
        if node.proc is not None:
            for p in node.proc.tree():
                try:
                    procs += [p] + p.children(recursive=True)
                except psutil.Error:
                    pass
            node.proc.terminate(grace=5.0)
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=5)

    def stop(self, grace: float = 10.0) -> list[str]:
        """End the nodes this object started (nothing when attached). Returns what had to be SIGKILLed."""
        if not self.started:
            return []
        if getattr(self, "_shm", None) is not None:
            self._shm.stop()  # a last look while the nodes are alive
        procs = self._ours()
        # Worker nodes first, then the head: SIGTERM to each `ray start --block` lets it stop its children.
        for n in reversed(self.nodes):
            if n.proc is not None and n.proc.alive():
                try:
                    n.proc.popen.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        _, alive = psutil.wait_procs(procs, timeout=grace)
        procs_left = {p.pid: p for p in alive}
        for p in self._ours():
            procs_left.setdefault(p.pid, p)
        killed = []
        for p in procs_left.values():
            try:
                killed.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(list(procs_left.values()), timeout=5)
        for n in self.nodes:
            if n.proc is not None:
                n.proc.terminate(grace=2.0)
        self.started = False
        if getattr(self, "_shm", None) is not None:
            self._shm.remove()
        if not self.keep_logs and self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        if self._own_network:
            self.network.stop()
            self.network, self._own_network = None, False
        return killed

    def leftovers(self) -> list[str]:
        """Processes of this cluster still alive (empty after :meth:`stop`)."""
        out = []
        for p in self._ours():
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except psutil.Error:
                continue
        return out

    # -- for vLLM -------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """Environment for the vLLM engine process that should use this cluster as its Ray driver (a process
        started under :meth:`_inside`'s prefix, in the nodes' network)."""
        return {"RAY_ADDRESS": self.address or "", "RAY_USAGE_STATS_ENABLED": "0"}
