"""PP across nodes: the per-node plan (no engine), bad input (exit 2), and a real two-node run on this machine
through vLLM's multiprocessing multi-node launch (leader server + headless follower, each on its own loopback
address and core): tokens, acceptance counters, patches in both trees, listening sockets, node death, teardown."""
import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import psutil
import pytest
from conftest import MODEL, ROOT

from kit.core.topology import Topology, TopologyError

MASTER_PORT = 29555


def _plan(**kw):
    return Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", nodes=2, **kw).node_plan(8000, MASTER_PORT)


def test_mp_plan_leader_and_headless_follower_on_own_address_and_core():
    leader, follower = _plan()
    assert (leader.rank, leader.role, follower.rank, follower.role) == (0, "leader", 1, "headless follower")
    assert (leader.ip, follower.ip) == ("127.0.0.2", "127.0.0.3")
    for c in (leader, follower):
        a = c.argv
        assert a[:2] == ["vllm", "serve"]
        assert a[a.index("--nnodes") + 1] == "2" and a[a.index("--node-rank") + 1] == str(c.rank)
        assert a[a.index("--master-addr") + 1] == "127.0.0.2" and a[a.index("--master-port") + 1] == str(MASTER_PORT)
        assert a[a.index("--pipeline-parallel-size") + 1] == "2"
        assert c.env["VLLM_HOST_IP"] == c.ip and c.env["GLOO_SOCKET_IFNAME"] == "lo"
    assert "--headless" in follower.argv and "--headless" not in leader.argv
    assert leader.argv[leader.argv.index("--host") + 1] == "127.0.0.2" and "--host" not in follower.argv
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:
        assert leader.cores != follower.cores and not set(leader.cores) & set(follower.cores)
        assert leader.env["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(map(str, leader.cores)) or "-" in leader.env[
            "VLLM_CPU_OMP_THREADS_BIND"]
    assert leader.shell().split()[0:3] == ["GLOO_SOCKET_IFNAME=lo", f"VLLM_CPU_OMP_THREADS_BIND={leader.env['VLLM_CPU_OMP_THREADS_BIND']}",
                                           "VLLM_HOST_IP=127.0.0.2"]
    assert "taskset -c" in leader.shell()


def test_ray_plan_starts_a_ray_node_each_then_the_server_on_node_0():
    head, worker, server = _plan(backend="ray")
    assert head.argv[:3] == ["ray", "start", "--block"] and "--head" in head.argv
    assert worker.argv[worker.argv.index("--address") + 1] == f"127.0.0.2:{MASTER_PORT}"
    assert server.rank == 0 and server.role == "leader" and "--nnodes" not in server.argv
    assert server.argv[server.argv.index("--distributed-executor-backend") + 1] == "ray"
    assert server.env["RAY_ADDRESS"] == f"127.0.0.2:{MASTER_PORT}"


def test_real_hosts_are_not_pinned_and_need_one_address_per_node():
    t = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", nodes=2, device="cuda")
    leader, follower = t.node_plan(8000, MASTER_PORT, hosts=["10.0.0.1", "10.0.0.2"])
    assert leader.cores == [] and "taskset" not in leader.shell() and "GLOO_SOCKET_IFNAME" not in leader.env
    assert follower.argv[follower.argv.index("--master-addr") + 1] == "10.0.0.1"
    with pytest.raises(TopologyError, match="1 hosts given for nodes=2"):
        t.node_plan(8000, MASTER_PORT, hosts=["10.0.0.1"])


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(pp=2, nodes=0), "nodes must be an integer >= 1"),
    (dict(pp=2, nodes=True), "nodes must be an integer >= 1"),
    (dict(pp=1, nodes=2), "nodes=2 must divide pp=1"),
    (dict(pp=4, nodes=3), "nodes=3 must divide pp=4"),
    (dict(pp=2, nodes=2, pd_role="producer", connector="nixl"), "takes no PD role"),
])
def test_bad_nodes_are_refused(kwargs, fragment):
    with pytest.raises(TopologyError, match=fragment):
        Topology(model=MODEL, random_weights=True, **kwargs)


def test_reference_is_one_node():
    t = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", nodes=2)
    assert t.reference().nodes == 1 and "2nodes-mp" in t.label()


@pytest.mark.parametrize("args, fragment", [
    (["--nodes", "3", "--pp", "2"], "nodes=3 must divide pp=2"),
    (["--nodes", "0"], "nodes must be an integer >= 1"),
    (["--nodes", "2", "--pp", "4", "--backend", "ray"], "nodes must equal pp*tp (4), got nodes=2"),
    (["--nodes", "1", "--pp", "2", "--backend", "ray"], "backend ray (the kit's local Ray cluster) needs nodes >= 2"),
    (["--nodes", "2", "--pp", "2", "--backend", "slurm"], "backend must be one of"),
    (["--nodes", "2", "--pp", "2", "--spec", "mtp:2", "--temperature", "0.7"], "greedy tokens only"),
])
def test_kit_compare_bad_nodes_exit_2_with_one_line(args, fragment):
    r = subprocess.run([sys.executable, "-m", "kit", "compare", "--model", MODEL, *args], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], r.stderr
    assert r.stdout == ""


def test_kit_compare_backend_ray_without_ray_exit_2_with_one_line(monkeypatch, capsys):
    """Ray not installed: one line naming what to install, exit 2, before any process starts."""
    import importlib.util

    from kit import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    monkeypatch.setattr(subprocess, "Popen", None)  # nothing may start
    rc = cli.main(["compare", "--model", MODEL, "--random", "--pp", "2", "--spec", "mtp:2", "--nodes", "2",
                   "--backend", "ray"])
    err = capsys.readouterr()
    assert rc == 2 and err.out == ""
    lines = err.err.strip().splitlines()
    assert len(lines) == 1 and "backend ray needs Ray" in lines[0] and "pip install" in lines[0], err.err


_STORE_PROBE = """
import datetime, importlib, json, sys
import psutil
from kit.core.net import free_port
if sys.argv[1] == "on":
    from kit.patches import tcp_store_bind_host as m
    assert m._needed() is True
    m._apply()
rdzv = importlib.import_module("torch.distributed.rendezvous")
port = free_port()
server = rdzv._create_c10d_store("127.0.0.2", port, 0, 1, datetime.timedelta(seconds=20))
client = rdzv._create_c10d_store("127.0.0.2", port, 1, 2, datetime.timedelta(seconds=20))
client.set("k", "v")
assert server.get("k") == b"v"
print(json.dumps([c.laddr.ip for c in psutil.Process().net_connections("inet")
                  if c.status == psutil.CONN_LISTEN and c.laddr.port == port]))
"""

# The Ray executor's rank-0 actor creates the store first (RayWorkerProc.create_dist_init_method); called here on a
# bare instance, with Ray's node address stubbed to 127.0.0.2 (no Ray cluster: the store is what is checked).
_RAY_STORE_PROBE = """
import json, sys, types
import psutil, ray.util
from vllm.v1.executor import ray_executor_v2 as rx
if sys.argv[1] == "on":
    from kit.patches import ray_store_bind_host as m
    assert m._needed() is True
    m._apply()
ray.util.get_node_ip_address = lambda: "127.0.0.2"
w = rx.RayWorkerProc.__new__(rx.RayWorkerProc)
w._parallel_config = types.SimpleNamespace(world_size=2)
url = w.create_dist_init_method()
port = int(url.rsplit(":", 1)[1])
assert url.startswith("tcp://127.0.0.2:"), url
print(json.dumps([c.laddr.ip for c in psutil.Process().net_connections("inet")
                  if c.status == psutil.CONN_LISTEN and c.laddr.port == port]))
"""


@pytest.mark.parametrize("probe", ["rendezvous", "ray"])
def test_tcp_store_bind_host_off_and_on(probe):
    """The rank-0 rendezvous store of a multi-node run (``tcp_store_bind_host``), and the one vLLM's Ray executor
    creates in its rank-0 actor (``ray_store_bind_host``): on every interface without the patch, on the master
    (Ray node) address with it."""
    if probe == "ray":
        pytest.importorskip("ray", reason="ray not installed (optional)")

    def listening(mode):
        code = _STORE_PROBE if probe == "rendezvous" else _RAY_STORE_PROBE
        r = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, cwd=ROOT,
                           timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    off = listening("off")
    assert off and not all(_loopback(ip) for ip in off), off  # the wildcard ('::' or '0.0.0.0')
    assert listening("on") == ["127.0.0.2"]


# -- a real two-node run ----------------------------------------------------------------------------

def _loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip in ("::1", "::ffff:127.0.0.1") or ip.startswith("::ffff:127.")


@pytest.mark.engine
@pytest.mark.slow
def test_two_nodes_pp2_mtp2_tokens_acceptance_patches_sockets_and_node_death(tmp_path, no_leftovers):
    from kit import engine
    from kit.checks.compare import load_prompts
    from kit.engine.multinode import MultiNode, NodeError
    from kit.patches import ENV_LOG

    prompts = load_prompts(limit=4)
    topo = Topology(model=MODEL, pp=2, spec="mtp:2", nodes=2)
    ref = engine.generate(topo.reference(), prompts, max_tokens=32)
    pp1 = engine.generate(topo.with_(pp=1, nodes=1), prompts, max_tokens=32)
    log = tmp_path / "patches.jsonl"
    with MultiNode(topo, env={ENV_LOG: str(log)}, log_dir=tmp_path) as mn:
        got = mn.generate(prompts, max_tokens=32)
        assert got.token_ids == ref.token_ids
        assert got.spec.num_drafts > 0
        assert got.spec.to_dict() == pp1.spec.to_dict()

        # Each node is its own tree, pinned to its own cores, its vLLM processes bound to its own address.
        trees = {n.rank: {p.pid for p in n.tree()} for n in mn.nodes}
        assert not trees[0] & trees[1]
        for n in mn.nodes:
            for p in n.tree():
                try:
                    if "kit.engine.guard" in p.cmdline():  # the kit's watchdog runs taskset, outside the pinned tree
                        continue
                    assert set(p.cpu_affinity()) <= set(n.cores), (n.name, p.cmdline())
                except psutil.NoSuchProcess:
                    pass
        socks = mn.listening()
        assert socks and all(_loopback(s["ip"]) for s in socks), socks
        assert {s["node"] for s in socks if s["ip"] == "127.0.0.2"} == {0}  # the leader's API server at least

        # The kit's patches loaded in every vLLM process of both trees, workers included.
        mn.check_patches()
        recs = [json.loads(x) for x in log.read_text().splitlines()]
        by_node = {r: [x for x in recs if x["pid"] in trees[r]] for r in trees}
        for r, xs in by_node.items():
            workers = [x for x in xs if "worker" in x["processes"]]
            assert workers, f"no worker of node {r} loaded the kit's patches: {xs}"
            assert all("pp_spec_token_history" in x["applied"] for x in workers)
        assert any("pp_spec_schedule_gate" in x["applied"] for x in by_node[0])

        # A node killed mid-request is reported, by rank and address, well within 30 s.
        victim = next(p for p in mn.nodes[1].tree() if "VLLM" in " ".join(p.cmdline()) or "Worker" in p.name())
        threading.Timer(3.0, lambda: os.kill(victim.pid, signal.SIGKILL)).start()
        with pytest.raises(NodeError, match=r"node 1 \(127\.0\.0\.3") as e:
            mn.generate(prompts, max_tokens=900, timeout=300)
        # Reported when the node died, not when the request's own timeout ran out.
        assert not isinstance(e.value.__context__, (httpx.TimeoutException, TimeoutError)), repr(e.value.__context__)
    for n in mn.nodes:
        assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in n.tree())


@pytest.mark.engine
@pytest.mark.slow
def test_two_nodes_keep_two_micro_batches_in_flight(no_leftovers):
    """``kit compare --nodes 2 --timeline``: with the kit's ``pp_microbatches`` the leader's engine core keeps two
    micro-batches in flight across the two nodes (one PP stage each) in at least 80 % of the decode steps, tokens
    equal to the PP=1 reference and acceptance equal to PP=1 on one node; vLLM 0.32's own loop
    (``KIT_PATCHES=all,-pp_microbatches``) keeps none, with the same tokens. The trace comes from both nodes'
    workers through the leader's ``/collective_rpc``."""
    from kit.checks.compare import compare
    from kit.core.prompts import load_prompts

    prompts = load_prompts(limit=8)
    topo = Topology(model=MODEL, pp=2, spec="mtp:2", nodes=2)
    on = compare(topo, prompts, max_tokens=48, timeline=True)
    off = compare(topo, prompts, max_tokens=48, timeline=True, reference=on.reference,
                  env={"KIT_PATCHES": "all,-pp_microbatches"})
    for c in (on, off):
        assert c.identical, c.divergence
        assert c.acceptance_equal and c.result.spec.num_accepted_tokens > 0
        assert [n["rank"] for n in c.result.topology["nodes"]] == [0, 1]
    t_on, t_off = on.result.topology["timeline"], off.result.topology["timeline"]
    print(f"in flight: on {t_on['in_flight']['overlap_steps']} of {t_on['decode_steps']} decode steps, "
          f"off {t_off['in_flight']['overlap_steps']} of {t_off['decode_steps']}; period on "
          f"{1e3 * t_on['period']:.2f} ms, off {1e3 * t_off['period']:.2f} ms")
    assert t_on["decode_steps"] > 20 and t_on["in_flight"]["overlap_steps"] >= 0.8 * t_on["decode_steps"]
    assert t_off["in_flight"]["overlap_steps"] == 0


@pytest.mark.engine
def test_two_node_mp_run_in_a_private_network(tmp_path, no_leftovers):
    """``kit compare --nodes 2 --backend mp`` as the kit starts it, where it can make a private network (root, as
    CI): during the run no socket of it listens in the host's network beyond loopback (the leader serves on a Unix
    socket; the nodes' sockets are inside the run's network namespace, on its loopback addresses); the leader
    answers no route without its key but /health; the namespace and the socket's folder are gone afterwards."""
    from kit import engine
    from kit.engine import netns
    from kit.engine.multinode import MultiNode

    if netns.unavailable():
        pytest.skip(f"no private network here: {netns.unavailable()}")
    topo = Topology(model=MODEL, random_weights=True, pp=2, nodes=2)
    prompts = ["def add(a, b):\n    return", "import os\n"]
    before = {(s["ip"], s["port"]) for s in netns.host_listening()}
    with MultiNode(topo, log_dir=tmp_path) as mn:
        got = mn.generate(prompts, max_tokens=8)
        host_new = [s for s in netns.host_listening() if (s["ip"], s["port"]) not in before]
        inside = mn.listening()
        open_routes = mn.leader.open_routes()
        uds = mn.leader.uds
    print(f"host network: {len(host_new)} new listeners {host_new}; private network: {inside}")
    assert [s for s in host_new if not _loopback(s["ip"])] == [], host_new
    assert inside and all(_loopback(s["ip"]) for s in inside), inside
    assert {s["node"] for s in inside} == {0, 1}  # both nodes' trees were looked at, inside the network
    assert open_routes == {("GET", "/health"): 200}
    assert not os.path.exists(mn.network.path) and not os.path.exists(os.path.dirname(uds))
    assert got.token_ids == engine.generate(topo.reference(), prompts, max_tokens=8).token_ids


def test_a_taken_master_port_is_refused_before_any_node_starts(monkeypatch):
    """The master port free_port() chose is taken before the nodes start: one clear error, no process started
    (before, the leader's rendezvous failed to bind and the followers waited on someone else's port)."""
    import socket

    from kit.engine import multinode

    def no_process(*a, **kw):
        raise AssertionError("a process was started")

    monkeypatch.setenv("KIT_OPEN_NETWORK", "1")  # on the host's loopback (in a private network every port is free)
    t = Topology(model=MODEL, random_weights=True, pp=2, nodes=2)
    ip = t.node_plan(port=0, master_port=1)[0].ip
    with socket.socket() as s:
        s.bind((ip, 0))
        s.listen(1)
        monkeypatch.setattr(multinode, "free_port", lambda: s.getsockname()[1])
        monkeypatch.setattr(multinode, "ManagedProcess", no_process)
        monkeypatch.setattr(multinode.Server, "start", no_process)
        with pytest.raises(TopologyError, match=f"master port {s.getsockname()[1]} on {ip} is in use"):
            multinode.MultiNode(t, quiet=True).start(timeout=30)
