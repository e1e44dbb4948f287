"""Topology validation, flag generation and the CPU environment (no engine)."""
import json

import pytest
from conftest import MODEL

from kit.core.topology import PARTITION_ENV, Spec, Topology, TopologyError, omp_threads_bind


def test_defaults_are_valid_and_reference_is_pp1_nospec():
    t = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2")
    ref = t.reference()
    assert (ref.pp, ref.spec, ref.pd_role) == (1, None, None)
    assert t.spec == Spec("mtp", 2)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(pp=0), "pp must be an integer >= 1"),
    (dict(pp=-1), "pp must be"),
    (dict(pp=99), "larger than the model's"),
    (dict(tp=0), "tp must be"),
    (dict(spec="medusa:2"), "unknown speculative method"),
    (dict(spec="mtp:0"), "k must be in 1.."),
    (dict(spec="mtp:99"), "k must be in 1.."),
    (dict(spec="mtp"), "lacks k"),
    (dict(spec="mtp:x"), "not an integer"),
    (dict(model="no-such-model"), "unknown model"),
    (dict(device="tpu"), "device must be"),
    (dict(backend="slurm"), "backend must be"),
    (dict(dtype="int8"), "dtype must be"),
    (dict(pd_role="decoder", connector="nixl"), "pd_role must be"),
    (dict(connector="nixl"), "without a PD role"),
    (dict(pd_role="producer", connector="tcp"), "connector must be"),
    (dict(pd_role="consumer"), "connector must be"),
    (dict(max_model_len=10**7), "max_model_len"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(kv_cache_gib=0), "kv_cache_gib"),
    (dict(spec="eagle3:2"), "eagle3 needs a draft model"),
])
def test_bad_topologies_are_refused_with_a_clear_message(kwargs, fragment):
    base = dict(model=MODEL, random_weights=True)
    base.update(kwargs)
    with pytest.raises(TopologyError, match=fragment):
        Topology(**base)


def test_mtp_on_a_model_without_mtp_layers_is_refused():
    with pytest.raises(TopologyError, match="no MTP layers"):
        Topology(model="tiny-llama-swa", random_weights=True, spec="mtp:1")


def test_engine_args_and_serve_flags():
    t = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", max_num_seqs=3)
    a = t.engine_args()
    assert a["pipeline_parallel_size"] == 2 and a["distributed_executor_backend"] == "mp"
    assert a["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    assert a["enforce_eager"] is True and a["dtype"] == "float32" and a["max_num_seqs"] == 3
    flags = t.serve_args()
    i = flags.index("--speculative-config")
    assert json.loads(flags[i + 1])["num_speculative_tokens"] == 2
    assert flags[flags.index("--pipeline-parallel-size") + 1] == "2"
    assert "--enforce-eager" in flags


def test_ngram_and_pd_configs():
    t = Topology(model=MODEL, random_weights=True, spec="ngram:3", pd_role="producer", connector="nixl-push")
    assert t.speculative_config()["prompt_lookup_max"] == 3
    kv = t.kv_transfer_config()
    assert kv == {"kv_connector": "NixlPushConnector", "kv_role": "kv_producer", "kv_buffer_device": "cpu"}


def test_cpu_env_binds_one_core_group_per_rank():
    assert omp_threads_bind(2, [0, 1]) == "0|1"
    assert omp_threads_bind(4, [0, 1]) == "0|1|0|1"
    assert omp_threads_bind(2, [0, 1, 2, 3]) == "0-1|2-3"
    assert omp_threads_bind(1, [0, 1]) == "0-1"
    env = Topology(model=MODEL, random_weights=True, pp=2, kv_cache_gib=1).env()
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"].count("|") == 1
    assert env["VLLM_NO_USAGE_STATS"] == env["DO_NOT_TRACK"] == "1"   # no usage reports from the kit's processes


def test_random_checkpoint_is_seeded_and_normal_scale(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path))
    from safetensors.numpy import load_file

    t = Topology(model=MODEL, random_weights=True, seed=3)
    p1 = t.model_path()
    w = load_file(str(p1 / "model.safetensors"))
    emb = w["model.embed_tokens.weight"]
    assert 0.015 < float(emb.std()) < 0.025  # normal init, not vLLM's ~1e-3 dummy weights
    assert float(w["model.norm.weight"].min()) == 1.0
    assert t.model_path() == p1  # reused
    p2 = t.with_(seed=4).model_path()
    assert p2 != p1
    assert (load_file(str(p2 / "model.safetensors"))["model.embed_tokens.weight"] != emb).any()


def test_a_random_checkpoint_changed_on_disk_is_written_again(tmp_path, monkeypatch):
    """A random checkpoint is verified by hash at each reuse: bytes changed after it was written (a truncated or
    edited file) are not served; the checkpoint is written again, identical to the first."""
    import json

    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path))
    t = Topology(model=MODEL, random_weights=True, seed=3)
    p = t.model_path()
    marker = json.loads((p / ".complete").read_text())
    assert marker["init"] >= 1 and "model.safetensors" in marker["sha256"] and "config.json" in marker["sha256"]
    good = (p / "model.safetensors").read_bytes()
    with open(p / "model.safetensors", "r+b") as f:
        f.seek(len(good) // 2)
        f.write(b"\x00\x01\x02\x03")
    assert t.model_path() == p
    assert (p / "model.safetensors").read_bytes() == good


def test_model_requirements_for_hybrid_gdn_models():
    """Qwen3.5 (Gated-DeltaNet + full attention) on CPU: bf16 (the CPU GDN kernel's only dtype) in place of the
    kit's float32 default, and prefix caching off with speculative decoding only; other models are untouched."""
    t = Topology(model="tiny-qwen3_5", random_weights=True, pp=2, spec="mtp:2")
    assert t.dtype == "bfloat16"
    args = t.engine_args()
    assert args["dtype"] == "bfloat16" and args["enable_prefix_caching"] is False
    ref = t.reference()
    assert ref.dtype == "bfloat16" and "enable_prefix_caching" not in ref.engine_args()
    assert "--no-enable-prefix-caching" in t.serve_args() and "--enable-prefix-caching" not in t.serve_args()
    # Extra engine args still win.
    assert t.with_(extra_engine_args={"enable_prefix_caching": True}).engine_args()["enable_prefix_caching"] is True
    with pytest.raises(TopologyError, match="needs dtype bfloat16"):
        Topology(model="tiny-qwen3_5", random_weights=True, dtype="float16")
    m = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2")
    assert m.dtype == "float32" and "enable_prefix_caching" not in m.engine_args()


# -- model runner (auto / v1 / v2): VLLM_USE_V2_MODEL_RUNNER for every process --------------------------------

def test_runner_auto_leaves_env_args_and_label_as_before():
    import warnings

    from kit.core.topology import RUNNER_ENV

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto on cpu (V1) with PP + spec: no RunnerWarning
        t = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2")
    assert t.runner == "auto" and t.effective_runner == "v1"
    assert RUNNER_ENV not in t.env() and t.runner_env() == {}
    assert "runner" not in t.label() and not any("runner" in f for f in t.serve_args() if f.startswith("--"))
    v1 = t.with_(runner="v1")
    assert v1.engine_args() == t.engine_args()              # vLLM has no engine argument for it: the env only
    assert v1.env() == {**t.env(), RUNNER_ENV: "0"} and v1.label().endswith("/runner-v1")
    assert v1.reference().runner == "v1"                     # the reference runs on the same runner
    assert Topology(model=MODEL, random_weights=True, device="cuda").effective_runner == "v2"


def test_runner_reaches_every_node_of_a_plan():
    from kit.core.topology import RUNNER_ENV

    t = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", nodes=2, runner="v1")
    for backend in ("mp", "ray"):
        plan = t.with_(backend=backend).node_plan(8000, 29501)
        assert plan and all(c.env[RUNNER_ENV] == "0" for c in plan)
        assert all(f"{RUNNER_ENV}=0" in c.shell() for c in plan)
    auto = t.with_(runner="auto").node_plan(8000, 29501)
    assert all(RUNNER_ENV not in c.env for c in auto)
    cuda = t.with_(device="cuda", runner="v2").node_plan(8000, 29501, hosts=["10.0.0.1", "10.0.0.2"])
    assert [c.env[RUNNER_ENV] for c in cuda] == ["1", "1"]


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(runner="v3"), "runner must be one of auto, v1, v2, got 'v3'"),
    (dict(runner="V1"), "runner must be one of"),
    (dict(runner=None), "runner must be one of"),
    (dict(runner="v2"), "runner v2 cannot run on device cpu: vLLM 0.32's CPU build has no Triton"),
    (dict(runner="v2", pp=2, spec="mtp:2"), "runner v2 cannot run on device cpu"),
])
def test_bad_runners_are_refused_in_one_line(kwargs, fragment):
    with pytest.raises(TopologyError, match=fragment) as e:
        Topology(model=MODEL, random_weights=True, **kwargs)
    assert "\n" not in str(e.value)


def test_pp_spec_on_the_v2_runner_warns_that_the_v1_patches_do_not_apply():
    from kit.core.topology import RunnerWarning

    with pytest.warns(RunnerWarning, match="V1 correctness patches do not apply"):
        t = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", device="cuda", runner="v2")
    assert t.env()["VLLM_USE_V2_MODEL_RUNNER"] == "1" and "VLLM_CPU_KVCACHE_SPACE" not in t.env()
    with pytest.warns(RunnerWarning, match="vLLM's default on cuda is V2"):
        Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", device="cuda")
    cuda = dict(model=MODEL, random_weights=True, device="cuda")
    assert Topology(**cuda, pp=2, spec="mtp:2", runner="v1").runner_note() is None
    assert Topology(**cuda, pp=1, spec="mtp:2", runner="v2").runner_note() is None   # PP=1: no PP + spec path
    assert Topology(**cuda, pp=2, runner="v2").runner_note() is None                 # no speculation


def test_every_process_of_a_one_node_topology_stays_on_loopback():
    """vLLM's rendezvous and queues, gloo and NIXL's UCX bind loopback only (kit.core.topology.LOOPBACK_ENV); a
    multi-node plan's per-node address wins over it."""
    from kit.core.topology import LOOPBACK_ENV

    env = Topology(model=MODEL, random_weights=True, pp=2).env()
    assert {k: env[k] for k in LOOPBACK_ENV} == {"VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
                                                  "UCX_NET_DEVICES": "lo"}
    two = Topology(model=MODEL, random_weights=True, pp=2, nodes=2)
    assert "VLLM_HOST_IP" not in two.env()
    assert [c.env["VLLM_HOST_IP"] for c in two.node_plan(8000, 29555)] == ["127.0.0.2", "127.0.0.3"]


def test_two_runs_writing_one_random_checkpoint_do_not_replace_each_others(tmp_path, monkeypatch):
    """Two runs (processes) find no checkpoint for a seed and both write it: the second must not replace (remove,
    then rename over) the directory the first one already returned and its engine is loading."""
    import os
    import subprocess
    import sys
    import textwrap
    import time

    from conftest import ROOT

    from kit.core.models import random_checkpoint, resolve_model

    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path))
    writing, a_done = tmp_path / "b-writing", tmp_path / "a-done"
    run_b = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys, time; sys.path.insert(0, {str(ROOT)!r})
        import safetensors.numpy as sn
        real = sn.save_file
        def slow(*a, **kw):  # run b is writing; run a finishes meanwhile, unless it has to wait for run b
            open({str(writing)!r}, "w").close()
            t = time.monotonic()
            while not os.path.exists({str(a_done)!r}) and time.monotonic() - t < 3:
                time.sleep(0.05)
            return real(*a, **kw)
        sn.save_file = slow
        from kit.core.models import random_checkpoint, resolve_model
        random_checkpoint(resolve_model({MODEL!r}), 7)
    """)], env={**os.environ, "KIT_CACHE_DIR": str(tmp_path)})
    deadline = time.monotonic() + 60
    while not writing.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert writing.exists(), "run b never started writing"
    out = random_checkpoint(resolve_model(MODEL), 7)  # run a
    loaded = (out / "model.safetensors").stat().st_ino  # what run a's engine would now load
    a_done.touch()
    assert run_b.wait(60) == 0
    assert (out / "model.safetensors").stat().st_ino == loaded, "run b replaced the checkpoint run a returned"
    assert not [p.name for p in out.parent.iterdir() if ".tmp" in p.name]


def test_a_layer_partition_reaches_every_process_and_the_label():
    from kit.core.topology import PARTITION_ENV

    t = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:2", layer_partition="3,1")
    assert t.layer_partition == (3, 1) and t.env()[PARTITION_ENV] == "3,1" and t.label().endswith("/layers3-1")
    assert t.reference().layer_partition is None and PARTITION_ENV not in t.reference().env()
    assert PARTITION_ENV not in t.with_(layer_partition=None).env()        # None: vLLM's even split, nothing set
    two = t.with_(nodes=2)
    for backend in ("mp", "ray"):
        assert all(c.env[PARTITION_ENV] == "3,1" for c in two.with_(backend=backend).node_plan(8000, 29501))


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(pp=2, layer_partition="2,1"), "must give each of the pp=2 stages at least one layer and sum to the model's 4"),
    (dict(pp=2, layer_partition="4,0"), "at least one layer"),
    (dict(pp=2, layer_partition="1,1,2"), "pp=2 stages"),
    (dict(pp=2, layer_partition="3,x"), "wants whole numbers of layers per stage like 5,3, or auto, got '3,x'"),
    (dict(pp=1, layer_partition="4"), "layer_partition needs pp > 1"),
])
def test_bad_layer_partitions_are_refused_in_one_line(kwargs, fragment):
    with pytest.raises(TopologyError, match=fragment) as e:
        Topology(model=MODEL, random_weights=True, **kwargs)
    assert "\n" not in str(e.value)


def test_layer_partition_auto_moves_one_layer_off_the_last_stage_per_drafter_pass():
    from kit.core.partition import auto_partition

    assert Topology(model="mimo-py-18m", pp=2, spec="mtp:2", layer_partition="auto").layer_partition == (5, 3)
    # No better split than the even one: left to vLLM (no variable set, the label unchanged).
    for spec in (None, "mtp:1", "ngram:3"):
        t = Topology(model="mimo-py-18m", pp=2, spec=spec, layer_partition="auto")
        assert t.layer_partition is None and PARTITION_ENV not in t.vllm_env()
    assert auto_partition(8, 4, 2) in {(2, 2, 3, 1), (3, 2, 2, 1), (2, 3, 2, 1)}
    assert auto_partition(8, 2, 0) == (4, 4) and auto_partition(7, 2, 0) == (4, 3)
    with pytest.raises(TopologyError, match="layer_partition auto needs pp > 1"):
        Topology(model="tiny-mimo", pp=1, layer_partition="auto")
