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

import pytest

pytest.importorskip("ray", reason="ray not installed (optional): pip install \"ray[default]==2.60.0\"")

from kit import engine  # noqa: E402
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


def test_pp2_mtp2_on_ray_executor_two_nodes(tmp_path, no_leftovers):
    log = tmp_path / "plugin.jsonl"
    topo = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", backend="ray")
    with LocalRayCluster(num_nodes=2, cpus_per_node=1, attach_env=False,
                         node_env=lambda i: {"VLLM_CPU_OMP_THREADS_BIND": str(i)}) as c:
        res = engine.run(topo, [{"kind": "generate", "prompts": PROMPTS, "max_tokens": 16},
                                {"kind": "inspect"}],
                         timeout=600, env={**c.env(), "KIT_PATCH_LOG": str(log)})
    got = res["jobs"][0]["token_ids"]
    placement = res["jobs"][1]
    assert sorted(p["pp_rank"] for p in placement) == [0, 1]
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert any("drafter_only_on_last_rank" in r["applied"] for r in recs)
    assert any("cpu_ray_executor" in r["applied"] for r in recs)
    ref = engine.generate(topo.reference(), PROMPTS, max_tokens=16)
    assert got == ref.token_ids


def test_ray_executor_without_the_patch_refuses_the_cpu_platform(no_leftovers):
    """The defect, kept visible: without cpu_ray_executor vLLM 0.32's CPU build refuses the Ray executor."""
    topo = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", backend="ray")
    with LocalRayCluster(num_nodes=2, cpus_per_node=1, attach_env=False,
                         node_env=lambda i: {"VLLM_CPU_OMP_THREADS_BIND": str(i)}) as c:
        with pytest.raises(engine.EngineError, match=KNOWN):
            engine.run(topo, [{"kind": "generate", "prompts": PROMPTS, "max_tokens": 16}], timeout=600,
                       env={**c.env(), "KIT_PATCHES": "all,-cpu_ray_executor"})
