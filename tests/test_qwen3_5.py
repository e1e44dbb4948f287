"""Qwen3.5 (Gated-DeltaNet + full attention hybrid) with its MTP drafter under PP, on live vLLM workers.

vLLM PR #46003's claim for ``qwen3_5_mtp``: the drafter lives on the last PP rank and never reads PP
intermediates. the report-only patch ``qwen3_5_mtp_intermediates`` reports it as upstream from the source text; here it is read
from a running PP=2 engine: where the drafter and each rank's linear-attention (mamba cache) state live, and
what the drafter's forward was given on every call while it generated.
"""
import pytest

from kit import engine
from kit.checks.compare import first_divergence, load_prompts
from kit.checks.matrix import reference_for
from kit.core.topology import Topology

pytestmark = pytest.mark.engine


def test_qwen3_5_mtp_drafter_lives_on_the_last_rank_and_never_reads_pp_intermediates(no_leftovers):
    t = Topology(model="tiny-qwen3_5", random_weights=True, pp=2, spec="mtp:2")
    res = engine.run(t, [{"kind": "rpc", "method": "kit_watch_drafter"}, {"kind": "inspect"},
                         {"kind": "generate", "prompts": load_prompts(limit=4), "max_tokens": 16},
                         {"kind": "rpc", "method": "kit_drafter_calls"}], timeout=900)
    watch, ranks, gen, calls = res["jobs"]
    ranks = sorted(ranks, key=lambda r: r["pp_rank"])
    first, last = ranks
    # Layers: 0-1 (linear attention) on rank 0, 2 (linear) and 3 (full attention) on rank 1.
    assert first["layer_range"] == [0, 2] and last["layer_range"] == [2, 4]
    assert last["is_last_rank"] and not first["is_last_rank"]
    # The drafter: the real Qwen3_5MTP on the last rank only (rank 0 holds the kit's inert stand-in).
    assert last["drafter"]["model_class"] == "Qwen3_5MTP" and last["drafter"]["params"] > 0
    assert first["drafter"] is None or first["drafter"]["params"] == 0
    # Per-rank state: each rank's mamba-cache group holds exactly its own Gated-DeltaNet layers; the full-attention
    # KV (layer 3 and the drafter's own attention layer) is on the last rank only.
    def groups(r, kind):
        return [g for g in r["kv_cache"]["groups"] if g["spec"] == kind]

    def layers(r, kind):
        return sorted(n for g in groups(r, kind) for n in g["layers"])

    assert layers(first, "MambaSpec") == ["model.layers.0.linear_attn", "model.layers.1.linear_attn"]
    assert layers(last, "MambaSpec") == ["model.layers.2.linear_attn"]
    assert not [n for g in first["kv_cache"]["groups"] if g["spec"] != "MambaSpec" for n in g["layers"]], first
    full = [n for g in last["kv_cache"]["groups"] if g["spec"] != "MambaSpec" for n in g["layers"]]
    assert "model.layers.3.self_attn.attn" in full and any(n.startswith("mtp.") for n in full), full
    for g in groups(first, "MambaSpec") + groups(last, "MambaSpec"):
        assert g["mamba_cache_mode"] == "none", g  # prefix caching off: one state slot per request
        assert len(g["state_shapes"]) == 2, g   # conv state and the recurrent (delta-rule) state
    # While generating with drafts: the drafter ran on the last rank only, and never with PP intermediates.
    assert gen["spec"]["num_drafts"] > 0
    watch = {w["pp_rank"]: w for w in watch}
    calls = {c["pp_rank"]: c for c in calls}
    assert not watch[0]["watching"] and watch[1]["watching"] and watch[1]["inner_class"] == "Qwen3_5MultiTokenPredictor"
    assert calls[1]["calls"] > 0, calls  # k forwards per step, each drafting for the whole batch
    assert calls[1]["with_intermediates"] == 0, calls
    assert "calls" not in calls[0], calls


@pytest.mark.slow
@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_gdn_short_spec_steps_off_and_on(patched, no_leftovers):
    """cpu_gdn_spec_conv_window: n-gram drafts give steps with fewer than k drafts; vLLM 0.32's CPU GDN roll then
    overruns its conv buffer (the engine dies); with the patch the run completes with drafts proposed."""
    t = Topology(model="tiny-qwen3_5", random_weights=True, pp=1, spec="ngram:2")
    env = {"KIT_PATCHES": "all" if patched else "all,-cpu_gdn_spec_conv_window"}
    if not patched:
        # Without AMX the torch roll overruns its buffer; on an AMX CPU vLLM's C++ branch refuses the short step.
        with pytest.raises(engine.EngineError, match="must match the size of tensor|num_accepted_tokens must be in"):
            engine.generate(t, load_prompts(limit=8), max_tokens=40, env=env, timeout=900)
        return
    r = engine.generate(t, load_prompts(limit=8), max_tokens=40, env=env, timeout=900)
    assert r.spec.num_drafts > 0 and all(len(x) == 40 for x in r.token_ids)


def _first_divergence_with(t: Topology, num_prompts: int, patches: tuple[str, ...], patched: bool) -> dict | None:
    """40 tokens of ``t`` with ``patches`` on or off against the PP=1 no-spec engine; drafts must be accepted."""
    prompts = load_prompts(limit=num_prompts)
    env = {"KIT_PATCHES": ",".join(["all"] + ([] if patched else [f"-{n}" for n in patches]))}
    got = engine.generate(t, prompts, max_tokens=40, env=env, timeout=900)
    assert got.spec.num_accepted_tokens > 0
    return first_divergence(reference_for(t, prompts, 40), got)


@pytest.mark.slow
@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_verified_tokens_computed_as_decode_steps_off_and_on(patched, no_leftovers):
    """cpu_gdn_spec_conv_window: vLLM 0.32's CPU GDN speculative path computes a verified token with other kernels
    than a plain decode step (bf16 conv + bf16 SiLU, the fused spec recurrence); on the trained bf16 model that
    flips a one-bf16-step tie against the PP=1 no-spec engine (prompt 5, position 35, margin 0.0625). Through the
    decode kernels, token for token, the MTP run is token-identical. cpu_gdn_spec_cpp_conv also sends each verified
    token's conv through the decode path's C++ kernel, and either patch alone gave identical tokens here
    (2026-12-05: 8 prompts x 40 tokens, 131-132 drafts accepted each), so the off run turns both off: the speculative
    path as vLLM ships it."""
    div = _first_divergence_with(Topology(model="tiny-qwen3_5-trained", pp=1, spec="mtp:1"), 8,
                                 ("cpu_gdn_spec_conv_window", "cpu_gdn_spec_cpp_conv"), patched)
    if patched:
        assert div is None, div
    else:
        assert div is not None and div["reference_margin"] is not None and div["reference_margin"] < 0.1, div


@pytest.mark.slow
@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_pp2_mtp_accepted_drafts_continue_from_the_right_state_off_and_on(patched, no_leftovers):
    """pp_spec_hybrid_accepted_count: under sync PP every request sits out the batch queue's in-flight step and
    vLLM re-adds it with an accepted count of 1 on every rank, so after accepted drafts each stage's Gated-DeltaNet
    layers continued from the state after the first verified token (trained weights: wrong tokens, not a tie).
    With the count kept, PP=2 MTP is token-identical to the PP=1 no-spec engine."""
    div = _first_divergence_with(Topology(model="tiny-qwen3_5-trained", pp=2, spec="mtp:2"), 4,
                                 ("pp_spec_hybrid_accepted_count",), patched)
    if patched:
        assert div is None, div
    else:
        assert div is not None and div["reference_margin"] is not None and div["reference_margin"] > 0.1, div


@pytest.mark.slow
@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_pp4_mixed_prefill_and_decode_steps_off_and_on(patched, no_leftovers):
    """pp_batch_order_agree: at PP=4 tiny-qwen3_5's Gated-DeltaNet ranks reorder a step's requests (decodes first)
    and the full-attention rank does not, so in a step mixing new prompts with verifies the last stage read other
    requests' hidden states. 8 prompts through 3 batch slots: without the patch the prompts admitted later are wrong
    from their first token; with it the run is token-identical to the PP=1 no-spec engine, with PP=1's counters."""
    t = Topology(model="tiny-qwen3_5-trained", pp=4, spec="mtp:2", max_num_seqs=3)
    prompts = load_prompts(limit=8)
    # Off: in vLLM's own step loop too (pp_microbatches off), as stock vLLM schedules. With pp_microbatches on, the
    # off run was token-identical (2026-12-05): the micro-batches change which steps mix prompts with verifies.
    env = {"KIT_PATCHES": "all" if patched else "all,-pp_batch_order_agree,-pp_microbatches"}
    got = engine.generate(t, prompts, max_tokens=40, env=env, timeout=900)
    ref = reference_for(t, prompts, 40)
    first = [next((j for j, (a, b) in enumerate(zip(x, y)) if a != b), None)
             for x, y in zip(ref.token_ids, got.token_ids)]
    if patched:
        assert first == [None] * 8, first
        assert (got.spec.num_drafts, got.spec.num_accepted_tokens) == (147, 167), got.spec  # the PP=1 cell's
    else:
        assert first[3:].count(0) >= 3, first   # admitted after the first three: wrong at token 0


@pytest.mark.slow
@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_pp4_without_speculation_off_and_on(patched, no_leftovers):
    """pp_mamba_align_attention_stage: without speculation prefix caching stays on, so the mamba cache runs in mode
    'align'; at PP=4 rank 3 holds only the full-attention layer and vLLM asserts at the first step. With the patch
    PP=4 runs and is token-identical to the PP=1 engine."""
    t = Topology(model="tiny-qwen3_5-trained", pp=4)
    prompts = load_prompts(limit=4)
    env = {"KIT_PATCHES": "all" if patched else "all,-pp_mamba_align_attention_stage"}
    if not patched:
        with pytest.raises(engine.EngineError, match="no mamba layers in the model"):
            engine.generate(t, prompts, max_tokens=16, env=env, timeout=900)
        return
    got = engine.generate(t, prompts, max_tokens=16, env=env, timeout=900)
    assert first_divergence(reference_for(t, prompts, 16), got) is None


@pytest.mark.slow
@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_random_weights_spec_matches_no_spec_off_and_on(patched, no_leftovers):
    """cpu_gdn_spec_cpp_conv: with speculation configured vLLM 0.32's CPU GDN conv ran torch fallbacks on CPUs with
    AVX-512 BF16 and no AMX, where the no-spec engine runs the C++ kernels; with random bf16 weights (no draft ever
    accepted, logits one bf16 step apart) the MTP engine's greedy tokens then part from the no-spec engine's
    (16 prompts x 32 tokens: prompt 0, position 12, margin 0.0078). With the patch they are identical."""
    import torch

    if not torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
        pytest.skip("the two paths differ only on AVX-512 BF16 without AMX")
    t = Topology(model="tiny-qwen3_5", random_weights=True, pp=1, spec="mtp:2")
    prompts = load_prompts(limit=16)
    env = {"KIT_PATCHES": "all" if patched else "all,-cpu_gdn_spec_cpp_conv"}
    got = engine.generate(t, prompts, max_tokens=32, env=env, timeout=900)
    div = first_divergence(reference_for(t, prompts, 32), got)
    if patched:
        assert div is None, div
    else:
        assert div is not None and div["reference_margin"] is not None and div["reference_margin"] < 0.05, div


@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_one_token_prompt_alone_off_and_on(patched, no_leftovers):
    """cpu_gdn_one_token_batch: a one-token prompt alone in a step (here: the only prompt of a fresh PP=1 engine, no
    speculation) killed vLLM 0.32's CPU GDN prefill ('expect x to be transposed'). Patched it runs, and its tokens
    are the ones the same prompt gets batched behind longer prompts (a step of several tokens, which never failed)."""
    t = Topology(model="tiny-qwen3_5", random_weights=True)
    if not patched:
        with pytest.raises(engine.EngineError, match="expect x to be transposed"):
            engine.generate(t, ["x"], max_tokens=8, env={"KIT_PATCHES": "all,-cpu_gdn_one_token_batch"})
        return
    res = engine.run(t, [{"kind": "generate", "prompts": ["x"], "max_tokens": 8},
                         {"kind": "generate", "prompts": load_prompts(limit=2) + ["x"], "max_tokens": 8}], timeout=900)
    alone, batched = res["jobs"]
    assert len(alone["token_ids"][0]) == 8
    assert alone["token_ids"][0] == batched["token_ids"][-1]


# A one-token prompt ("Q") that waits for a free slot (max_num_seqs=3) and joins requests that are verifying drafts.
JOINING = ["The history of the printing press begins", "x y z w",
           "Once upon a time in a small village by the sea, there lived an old fisherman who", "Hi there you",
           "def fibonacci(n):\n    ", "Q", "The capital of France is", "a b"]


@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_one_token_prompt_joining_spec_decodes_off_and_on(patched, no_leftovers):
    """spec_no_pad_fresh_prompt: vLLM 0.32's scheduler padded the fresh one-token prompt into a speculative row
    (1 + k tokens, placeholder drafts) because other requests were running, and the Gated-DeltaNet speculative path
    continued from its state slot's previous owner: a wrong token, not a tie. Patched, identical to the PP=1 no-spec
    engine."""
    t = Topology(model="tiny-qwen3_5-trained", spec="mtp:2", max_num_seqs=3)
    ref = reference_for(t, JOINING, 24)
    env = None if patched else {"KIT_PATCHES": "all,-spec_no_pad_fresh_prompt"}
    div = first_divergence(ref, engine.generate(t, JOINING, max_tokens=24, env=env))
    if patched:
        assert div is None, div
    else:
        assert div is not None and div["prompt_index"] == JOINING.index("Q"), div
        assert div["reference_margin"] > 0.5, div   # far from a tie: the reference's top-1 was clearly ahead
