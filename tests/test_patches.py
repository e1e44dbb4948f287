"""Patch registry selection and the pure helpers of the correctness patches (small fakes allowed)."""
from types import SimpleNamespace

import numpy as np
import pytest

from kit import patches
from kit.patches.pp_spec_token_history import fill_history


def test_selection(monkeypatch):
    reg = patches.registry()
    monkeypatch.setenv("KIT_PATCHES", "all")
    assert patches.selected_names() == [n for n, p in reg.items() if not p.teaching_only]
    monkeypatch.setenv("KIT_PATCHES", "none")
    assert patches.selected_names() == []
    monkeypatch.setenv("KIT_PATCHES", "all,-pp_spec_schedule_gate")
    assert "pp_spec_schedule_gate" not in patches.selected_names()
    assert not patches.is_active("pp_spec_schedule_gate")
    monkeypatch.setenv("KIT_PATCHES", "drafter_only_on_last_rank")
    assert patches.selected_names() == ["drafter_only_on_last_rank"]
    monkeypatch.setenv("KIT_PATCHES", "bogus")
    with pytest.raises(ValueError, match="unknown patch 'bogus'"):
        patches.selected_names()


def test_every_patch_is_documented():
    for p in patches.registry().values():
        mod = __import__(p.apply.__module__, fromlist=["x"])
        doc = mod.__doc__ or ""
        assert p.upstream and p.targets and p.summary
        if not p.teaching_only and not p.name.startswith(("draft_pp", "eagle3_total", "qwen3_5")):
            for word in ("What breaks without it", "Upstream", "Turn off"):
                assert word in doc, (p.name, word)


def test_decode_side_rule(monkeypatch):
    """Decode-side PP + spec is refused only when a correctness patch is off."""
    from kit.patches.decode_side_pp_spec_rule import check

    monkeypatch.setenv("KIT_PATCHES", "all")
    check(2, True, None)  # allowed: the fix is active
    monkeypatch.setenv("KIT_PATCHES", "all,-pp_spec_token_history")
    with pytest.raises(ValueError, match="data parallelism"):
        check(2, True, "kv_consumer")
    check(2, True, "kv_producer")  # the producer side is always fine
    check(1, True, None)


class _State(SimpleNamespace):
    @property
    def num_tokens(self):
        return self.num_prompt_tokens + len(self.output_token_ids)


def _fake_runner(history, prompt_len, in_batch=True):
    state = _State(output_token_ids=list(history), num_prompt_tokens=prompt_len)
    batch = SimpleNamespace(req_id_to_index={"r": 0} if in_batch else {},
                            token_ids_cpu=np.zeros((1, 64), dtype=np.int64),
                            is_token_ids=np.zeros((1, 64), dtype=bool),
                            num_tokens_no_spec=np.array([prompt_len + len(history)]))
    return SimpleNamespace(requests={"r": state}, input_batch=batch), state, batch


def _sched(num_computed, new_tokens, spec=None, all_tokens=None):
    cached = SimpleNamespace(req_ids=["r"], resumed_req_ids=set(), new_token_ids=[new_tokens],
                             num_computed_tokens=[num_computed], all_token_ids=all_tokens or {})
    return SimpleNamespace(scheduled_cached_reqs=cached, scheduled_spec_decode_tokens=spec or {},
                           finished_req_ids=set())


def test_fill_history_appends_accepted_drafts():
    # prompt of 4, history [10]; last step sent drafts [7, 8]; 2 accepted -> scheduler says 7 computed.
    runner, state, batch = _fake_runner([10], 4)
    drafts = {"r": [7, 8]}
    added = fill_history(runner, _sched(num_computed=7, new_tokens=[9]), drafts)
    assert added == 2 and state.output_token_ids == [10, 7, 8]
    assert list(batch.token_ids_cpu[0, 5:7]) == [7, 8] and batch.num_tokens_no_spec[0] == 7
    assert "r" not in drafts


def test_fill_history_prefers_the_schedulers_full_token_list():
    runner, state, _ = _fake_runner([10], 4, in_batch=False)
    truth = {"r": [1, 2, 3, 4, 10, 7, 5, 9]}  # only one of the drafts [7, 8] was accepted... then 5
    fill_history(runner, _sched(num_computed=7, new_tokens=[9], all_tokens=truth), {"r": [7, 8]})
    assert state.output_token_ids == [10, 7, 5]


def test_fill_history_no_gap_no_change_and_remembers_new_drafts():
    runner, state, _ = _fake_runner([10], 4)
    drafts = {}
    assert fill_history(runner, _sched(num_computed=5, new_tokens=[11], spec={"r": [3, 4]}), drafts) == 0
    assert state.output_token_ids == [10] and drafts == {"r": [3, 4]}


def test_decode_side_rule_is_checked_before_any_process_starts():
    """The kit refuses decode-side PP + spec without the fix in-process, in well under a second."""
    import time

    from kit import engine, pd
    from kit.topology import Topology, TopologyError

    t = Topology(model="tiny-mimo", random_weights=True, pp=2, spec="mtp:1")
    t0 = time.monotonic()
    with pytest.raises(TopologyError, match="only supported on the\\s+prefill side"):
        engine.run(t, [], env={"KIT_PATCHES": "all,-pp_spec_token_history"})
    with pytest.raises(TopologyError, match="refused by the kit before starting vLLM"):
        engine.Server(t, env={"KIT_PATCHES": "decode_side_pp_spec_rule"}).start()
    # A consumer PP=2 + MTP without the fix: refused when the pair is built; the producer side is allowed.
    with pytest.raises(TopologyError, match="prefill side"):
        pd.PDPair(Topology(model="tiny-mimo", random_weights=True, pp=2), t, env={"KIT_PATCHES": "all,-pp_spec_schedule_gate"})
    engine.precheck(t.with_(pd_role="producer", connector="nixl-push"), {"KIT_PATCHES": "all,-pp_spec_schedule_gate"})
    # With the fix active (default), or with the rule itself off, nothing is refused.
    engine.precheck(t, {})
    engine.precheck(t, {"KIT_PATCHES": "none"})
    assert time.monotonic() - t0 < 5


_IDLE_AGENT = r"""
import json, time
from kit.patches import apply_selected
apply_selected()   # what the vllm.general_plugins entry point does in every vLLM process
from vllm.distributed.nixl_utils import NixlWrapper, nixl_agent_config
agent = NixlWrapper("idle", nixl_agent_config(num_threads=4, capture_telemetry=True))  # vLLM's own config
time.sleep(0.5)
c0, t0 = time.process_time(), time.monotonic()
time.sleep(3.0)
print(json.dumps({"cpu": time.process_time() - c0, "wall": time.monotonic() - t0}))
"""


@pytest.mark.parametrize("selection", ["patch-off", "patch-on"])
def test_nixl_progress_delay_stops_the_idle_agent_spinning(selection):
    """A real NIXL agent created the way vLLM 0.32's connector creates it, doing nothing for 3 s.

    Off (stock): nixl hard-codes pthrDelay=0 and the progress thread burns a core. On: it sleeps in poll().
    """
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("nixl")
    env = dict(os.environ, KIT_PATCHES="all,-nixl_progress_delay" if selection == "patch-off" else "all")
    out = subprocess.run([sys.executable, "-c", _IDLE_AGENT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    m = json.loads(out.stdout.strip().splitlines()[-1])
    share = m["cpu"] / m["wall"]
    if selection == "patch-off":
        assert share > 0.5, f"stock NIXL agent used only {share:.0%} of a core while idle: is the spin gone upstream?"
    else:
        assert share < 0.2, f"idle NIXL agent still used {share:.0%} of a core with the patch on"


def test_patch_overhead_times_only_the_wrapper_and_restores_it():
    """kit bench --patch-overhead: each per-step wrapper is timed with its vLLM function swapped for a no-op,
    and the real function is back in place afterwards."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from kit import patch_overhead

    costs = patch_overhead.measure(n=2000)  # applies the selected patches first
    before = Scheduler.schedule.__wrapped__
    patch_overhead.measure(n=2000)
    assert {c.patch for c in costs} >= {"pp_spec_schedule_gate", "pp_spec_token_history"}
    assert all(0 <= c.ns_per_call < 1e6 for c in costs), costs
    cell = next(c for c in Scheduler.schedule.__closure__ if c.cell_contents is before)
    assert cell.cell_contents is before


@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_cpu_rope_rotates_every_head_of_mla_shaped_tensors(patched):
    """cpu_rope_layout: vLLM 0.32's CPU rotary kernel mis-rotates a 3-D query and MLA's strided q_pe/k_pe views
    (the real kernel, against vLLM's own pure-PyTorch forward_static); through the patch every row is right and
    the caller's views are updated in place, with nothing else in the fused buffer touched."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    from kit.patches import apply_selected

    apply_selected()   # what the plugin does in every vLLM process (idempotent)
    forward_cpu = RotaryEmbedding.forward_cpu
    if not patched:
        forward_cpu = getattr(forward_cpu, "__wrapped__", forward_cpu)
    else:
        assert getattr(forward_cpu, "__kit_patch__", None) == "cpu_rope_layout"
    torch.manual_seed(0)
    T, H, nope, rope_dim = 7, 4, 32, 64
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(rope_dim, max_position=2048, is_neox_style=False,
                        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, dtype=torch.float32)
    pos = torch.arange(T) * 3
    q_full = torch.randn(T, H, nope + rope_dim)
    fused = torch.randn(T, 512 + rope_dim + 64)   # kv_a output: [latent | k_pe | something after]
    q_pe, k_pe = q_full[..., nope:], fused[:, 512:512 + rope_dim].unsqueeze(1)
    want_q, want_k = rope.forward_static(pos, q_pe.clone(), k_pe.clone(), rope.head_size, rope.rotary_dim,
                                         rope.cos_sin_cache, rope.is_neox_style)
    before = fused.clone()
    forward_cpu(rope, pos, q_pe, k_pe)
    q_ok = torch.allclose(q_pe, want_q.view(q_pe.shape), atol=1e-5)
    k_ok = torch.allclose(k_pe, want_k.view(k_pe.shape), atol=1e-5)
    untouched = torch.equal(fused[:, :512], before[:, :512]) and torch.equal(fused[:, 576:], before[:, 576:])
    if patched:
        assert q_ok and k_ok and untouched
    else:
        assert not q_ok and not k_ok, "stock vLLM's CPU rotary kernel now handles MLA layouts: retire the patch"


@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_glm4_moe_stage_without_moe_layers(patched):
    """glm4_moe_dense_stage: vLLM 0.32's GLM-4 MoE model refuses a PP stage that holds only dense layers (its
    real extract_moe_parameters, called as the model's __init__ calls it on such a stage); patched, the stage's
    expert counts are 0, as vLLM's DeepSeek-V2 sets them."""
    from types import SimpleNamespace

    from vllm.model_executor.models.glm4_moe import Glm4MixtureOfExperts

    from kit.patches import apply_selected

    apply_selected()
    fn = Glm4MixtureOfExperts.extract_moe_parameters
    stage = SimpleNamespace()
    if not patched:
        with pytest.raises(RuntimeError, match="No Glm4MoE layer found"):
            fn.__wrapped__(stage, None)
        return
    assert fn.__kit_patch__ == "glm4_moe_dense_stage"
    fn(stage, None)
    assert stage.num_logical_experts == 0 and stage.num_local_physical_experts == 0
