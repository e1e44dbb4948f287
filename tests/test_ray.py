"""vLLM's Ray executor on a local two-node Ray cluster (loopback): PP=2 + MTP k=2 on CPU.

Skipped when Ray is not installed (it is not a kit dependency: ``pip install "ray[default]==2.60.0"``).
On vLLM 0.32.0's CPU build the Ray executor does not start without the kit's ``cpu_ray_executor`` patch:
``CpuPlatform.ray_device_key`` is empty
(``vllm/platforms/interface.py``; only CUDA, ROCm and XPU set ``"GPU"``), so
``initialize_ray_cluster`` (``vllm/v1/executor/ray_utils.py``) raises
``ValueError: current platform cpu does not support ray.`` right after ``ray.init`` — with the default
``RayExecutorV2`` and with the legacy ``RayDistributedExecutor`` alike. With the patch (default) RayExecutorV2
runs PP=2 + MTP k=2 over the two nodes, token-identical to the PP=1 reference; without it the refusal is kept
visible. See docs/ray.md and docs/multinode.md.
"""
import json
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray not installed (optional): pip install \"ray[default]==2.60.0\"")

from conftest import MODEL  # noqa: E402

from kit import engine  # noqa: E402
from kit.core.topology import Topology  # noqa: E402
from kit.engine.multinode import MultiNode  # noqa: E402
from kit.engine.netns import host_listening  # noqa: E402
from kit.engine.raycluster import LocalRayCluster  # noqa: E402
from kit.patches import ENV_LOG  # noqa: E402

pytestmark = pytest.mark.engine
PROMPTS = ["def add(a, b):\n    return", "import os\n"]
KNOWN = "current platform cpu does not support ray"


def test_local_ray_cluster_two_nodes_and_clean_teardown(no_leftovers):
    with LocalRayCluster(num_nodes=2, cpus_per_node=1, attach_env=False) as c:
        nodes = [n for n in c.node_table() if n["alive"]]
        assert len(nodes) == 2
        assert sorted(n["ip"] for n in nodes) == ["127.0.0.2", "127.0.0.3"]
        assert {r for n in nodes for r in n["resources"] if r.startswith("kit_node_")} == {"kit_node_0", "kit_node_1"}
        assert all(n.node_id for n in c.nodes)
    assert c.leftovers() == []


def _loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip in ("::1", "::ffff:127.0.0.1") or ip.startswith("::ffff:127.")


# Ray 2.60's own servers on every interface: the GCS, each raylet (node manager and object manager), each dashboard
# agent's gRPC, the core worker inside every Ray worker and driver (the engine core), and the dashboard head's metrics
# endpoint, whatever node address they are given, unless it is exactly 127.0.0.1 (which `ray start` replaces by the
# machine's outward address for a cluster of several nodes). Ray offers no bind-address setting for them
# (docs/ray.md); the kit runs the nodes in a private network (kit.engine.netns), where "every interface" is its
# loopback only.
RAY_GRPC_PROCESSES = ("gcs_server", "raylet", "ray::DashboardAgent")


def _rays_own(s: dict) -> bool:
    """A wildcard listener of Ray's own servers: its gRPC servers (by process, or a core worker by Ray's worker
    port range) and the dashboard head's metrics endpoint (its fixed port)."""
    from ray.dashboard.consts import DASHBOARD_METRIC_PORT

    from kit.engine.raycluster import WORKER_PORTS

    return s["ip"] in ("::", "0.0.0.0") and (s["name"] in RAY_GRPC_PROCESSES or s["port"] == DASHBOARD_METRIC_PORT
                                              or WORKER_PORTS[0] <= s["port"] <= WORKER_PORTS[1])


def test_pp2_mtp2_on_ray_executor_two_nodes(tmp_path, no_leftovers):
    """PP=2 + MTP k=2 through vLLM's Ray executor over the kit's two-node local Ray cluster, launched as
    ``kit compare --nodes 2 --backend ray`` launches it (:class:`kit.engine.multinode.MultiNode`): tokens equal the PP=1
    reference; stage 0 on node 0 (127.0.0.2), stage 1 with the drafter and the MTP layer's KV on node 1, as the live
    workers report it; the kit's patches in the Ray actors; no process of the run (server, engine core, GCS,
    raylets, dashboard agents, runtime-env agents, Ray workers) listens beyond loopback; teardown leaves no process
    of the cluster, no /dev/shm entry (``no_leftovers``) and no Ray temp dir."""
    log = tmp_path / "plugin.jsonl"
    topo = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", nodes=2, backend="ray")
    before = {(s["ip"], s["port"]) for s in host_listening()}
    with MultiNode(topo, env={ENV_LOG: str(log)}, log_dir=tmp_path, rpc_enabled=True) as mn:
        got = mn.generate(PROMPTS, max_tokens=16)
        ranks = mn.inspect()
        socks = mn.listening()
        host_new = [s for s in host_listening() if (s["ip"], s["port"]) not in before]
        names = {p.name() for _, p in mn.processes() if p.is_running()}
        mn.check_patches()
        # Closed by default: the leader (with /collective_rpc) answers no route without its key but /health.
        assert ("POST", "/collective_rpc") in mn.leader.routes()
        assert mn.leader.open_routes() == {("GET", "/health"): 200}
        cluster = mn.cluster
    assert cluster.leftovers() == [] and not Path(cluster.temp_dir).exists()
    # Every process kind of the run was looked at, and each listens somewhere.
    listening_names = {s["name"] for s in socks}
    for kind in ("gcs_server", "raylet"):
        assert kind in names and kind in listening_names, (kind, sorted(names))
    # In the host's network the run listens on nothing beyond loopback (in fact on nothing at all: the leader
    # serves on a Unix socket); Ray's servers on "every interface" are inside the run's private network, whose only
    # interface is its loopback. There, vLLM's and the kit's sockets are on loopback addresses too.
    assert mn.network is not None and not Path(mn.network.path).exists()
    assert [s for s in host_new if not _loopback(s["ip"])] == [], host_new
    outside = [s for s in socks if not _loopback(s["ip"])]
    assert [s for s in outside if _rays_own(s)], "Ray's wildcard listeners were not seen inside the private network"
    ours = [s for s in outside if not _rays_own(s)]
    assert not ours, f"listening beyond loopback (vLLM, the kit, or Ray beyond its gRPC servers): {ours}"
    print(f"host network: {len(host_new)} new listeners ({host_new}); private network: {len(socks)} listeners, "
          f"{len(outside)} of Ray's on every interface of it")

    assert [(r["pp_rank"], r["node"], r["host_ip"]) for r in ranks] == [(0, 0, "127.0.0.2"), (1, 1, "127.0.0.3")]
    assert ranks[0]["embedding"] and not (ranks[0]["drafter"] or {}).get("params")
    assert ranks[1]["lm_head"] and (ranks[1]["drafter"] or {}).get("params")
    n_layers = topo.info.num_layers
    assert n_layers in [int(n.split(".")[2]) for n in ranks[1]["kv_cache"]["layers"]]
    assert all(r["ray_node_id"] for r in ranks) and ranks[0]["ray_node_id"] != ranks[1]["ray_node_id"]
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    workers = [r for r in recs if "worker" in r["processes"]]
    assert len(workers) == 2 and all("drafter_only_on_last_rank" in r["applied"] for r in workers), workers
    assert any("cpu_ray_executor" in r["applied"] for r in recs)
    ref = engine.generate(topo.reference(), PROMPTS, max_tokens=16)
    assert got.token_ids == ref.token_ids


def test_ray_executor_without_the_patch_refuses_the_cpu_platform(tmp_path, no_leftovers):
    """The defect, kept visible: without cpu_ray_executor vLLM 0.32's CPU build refuses the Ray executor."""
    topo = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", nodes=2, backend="ray")
    with pytest.raises(engine.EngineError, match=KNOWN):
        with MultiNode(topo, env={"KIT_PATCHES": "all,-cpu_ray_executor"}, log_dir=tmp_path):
            pass
