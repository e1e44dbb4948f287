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
# endpoint (port 44227), whatever node address they are given, unless it is exactly 127.0.0.1 (which `ray start`
# replaces by the machine's outward address for a cluster of several nodes). Ray offers no bind-address setting for
# them (see docs/ray.md).
RAY_GRPC_PROCESSES = ("gcs_server", "raylet", "ray::DashboardAgent")
RAY_WILDCARD = ("Ray 2.60 binds its gRPC servers (GCS, raylets, dashboard agents, core workers of the Ray workers and "
                "of the driver) and the dashboard head's metrics endpoint to every interface unless the node address "
                "is 127.0.0.1; no Ray setting changes it "
                "(docs/ray.md#listening-sockets-during-a-ray-run)")
_SEEN: dict = {}


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
    with MultiNode(topo, env={ENV_LOG: str(log)}, log_dir=tmp_path, rpc_enabled=True) as mn:
        got = mn.generate(PROMPTS, max_tokens=16)
        ranks = mn.inspect()
        socks = mn.listening()
        names = {p.name() for _, p in mn.processes() if p.is_running()}
        mn.check_patches()
        cluster = mn.cluster
    assert cluster.leftovers() == [] and not Path(cluster.temp_dir).exists()
    # Every process kind of the run was looked at, and each listens somewhere.
    listening_names = {s["name"] for s in socks}
    for kind in ("gcs_server", "raylet"):
        assert kind in names and kind in listening_names, (kind, sorted(names))
    outside = [s for s in socks if not _loopback(s["ip"])]
    ours = [s for s in outside if not _rays_own(s)]
    assert not ours, f"listening beyond loopback (vLLM, the kit, or Ray beyond its gRPC servers): {ours}"
    _SEEN["ray_outside"] = [s for s in outside if _rays_own(s)]

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


@pytest.mark.xfail(strict=True, reason=RAY_WILDCARD)
def test_ray_run_listens_only_on_loopback():
    """Kept visible: Ray's own gRPC servers listen on every interface during the two-node run above (the rest of
    the run, vLLM's and the kit's sockets included, is checked to be on loopback there). Turns into a pass (a
    strict-xfail failure) the day Ray binds them to the node address."""
    if "ray_outside" not in _SEEN:
        pytest.skip("reads the sockets of test_pp2_mtp2_on_ray_executor_two_nodes (run it in the same session)")
    assert not _SEEN["ray_outside"], "\n".join(f"{s['name']} (node {s['node']}, pid {s['pid']}): {s['ip']}:{s['port']}"
                                               for s in _SEEN["ray_outside"])


def test_ray_executor_without_the_patch_refuses_the_cpu_platform(no_leftovers):
    """The defect, kept visible: without cpu_ray_executor vLLM 0.32's CPU build refuses the Ray executor."""
    topo = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", backend="ray")
    with LocalRayCluster(num_nodes=2, cpus_per_node=1, attach_env=False,
                         node_env=lambda i: {"VLLM_CPU_OMP_THREADS_BIND": str(i)}) as c:
        with pytest.raises(engine.EngineError, match=KNOWN):
            engine.run(topo, [{"kind": "generate", "prompts": PROMPTS, "max_tokens": 16}], timeout=600,
                       env={**c.env(), "KIT_PATCHES": "all,-cpu_ray_executor"})
