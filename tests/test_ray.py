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

from kit import engine  # noqa: E402
from kit.multinode import MultiNode  # noqa: E402
from kit.patches import ENV_LOG  # noqa: E402
from kit.raycluster import LocalRayCluster  # noqa: E402
from kit.topology import Topology  # noqa: E402

from conftest import MODEL  # noqa: E402

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


def test_pp2_mtp2_on_ray_executor_two_nodes(tmp_path, no_leftovers):
    """PP=2 + MTP k=2 through vLLM's Ray executor over the kit's two-node local Ray cluster, launched as
    ``kit compare --nodes 2 --backend ray`` launches it (:class:`kit.multinode.MultiNode`): tokens equal the PP=1
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
    assert not outside, f"listening beyond loopback: {outside}"

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


def test_ray_executor_without_the_patch_refuses_the_cpu_platform(no_leftovers):
    """The defect, kept visible: without cpu_ray_executor vLLM 0.32's CPU build refuses the Ray executor."""
    topo = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", backend="ray")
    with LocalRayCluster(num_nodes=2, cpus_per_node=1, attach_env=False,
                         node_env=lambda i: {"VLLM_CPU_OMP_THREADS_BIND": str(i)}) as c:
        with pytest.raises(engine.EngineError, match=KNOWN):
            engine.run(topo, [{"kind": "generate", "prompts": PROMPTS, "max_tokens": 16}], timeout=600,
                       env={**c.env(), "KIT_PATCHES": "all,-cpu_ray_executor"})
