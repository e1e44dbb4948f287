"""PP that pipelines: more than one micro-batch in flight, and the same tokens as the PP=1 reference.

Measured with the kit's step trace (:mod:`kit.worker.steptrace`): a decode step "overlaps" when its rank-0
forward started before the previous computed step's last-rank forward ended (two micro-batches in flight).
Speed is measured by ``kit bench --variant`` (docs/results/bench.md), not here.
"""
import pytest
from conftest import MODEL

from kit import engine
from kit.checks.compare import first_divergence, load_prompts
from kit.checks.matrix import MAX_TOKENS, NUM_PROMPTS, reference_for
from kit.core.topology import Topology
from kit.worker import steptrace

pytestmark = pytest.mark.engine


def _traced(t: Topology, prompts: list[str], patches: str) -> tuple[engine.GenerationResult, dict]:
    jobs = [{"kind": "rpc", "method": "kit_trace_start"},
            {"kind": "generate", "prompts": prompts, "max_tokens": MAX_TOKENS},
            {"kind": "rpc", "method": "kit_trace_read"}]
    res = engine.run(t, jobs, env={"KIT_PATCHES": patches})
    events = steptrace.merge(res["jobs"][2])
    summary = steptrace.summary(events)
    by = steptrace.steps(events)
    # Rank 0's requests per computed decode step, in step order.
    summary["groups"] = [frozenset(by[s]["forward"][0]["reqs"]) for s in steptrace.decode_steps(events)]
    return engine.GenerationResult.from_dict(res["jobs"][1]), summary


def test_microbatches_off_and_on(no_leftovers):
    """PP=2 without drafts, 8 prompts at once. Off (vLLM 0.32 as shipped): every step carries every request, so
    no two steps are ever in flight. On (``pp_microbatches``): the requests alternate in two disjoint groups of 4
    and more than half of the decode steps start while the previous one is still on the last stage. Tokens
    identical to the PP=1 no-spec reference both ways.

    The share in flight depends on how the OS shares 2 cores among the engine core and two workers (64 % to 93 %
    across runs on this class of machine); the issue's 80 % target is a speed figure, measured side by side by
    ``kit bench --timeline`` (docs/results/bench.md), not asserted here."""
    prompts = load_prompts(limit=NUM_PROMPTS)
    t = Topology(model=MODEL, random_weights=True, pp=2)
    ref = reference_for(t, prompts, MAX_TOKENS)
    seen = {}
    for patches in ("all,-pp_microbatches", "all"):
        got, seen[patches] = _traced(t, prompts, patches)
        assert first_divergence(ref, got) is None, (patches, first_divergence(ref, got))
    off, on = seen["all,-pp_microbatches"], seen["all"]
    print(f"off: {off['decode_steps']} decode steps, {off['in_flight']['overlap_steps']} overlapping, "
          f"{off.get('reqs_per_step')} requests per step; on: {on['decode_steps']} steps, "
          f"{on['in_flight']['overlap_steps']} overlapping, {on.get('reqs_per_step')} per step")
    assert off["in_flight"]["overlap_steps"] == 0, off["in_flight"]
    assert all(len(g) == NUM_PROMPTS for g in off["groups"]), off["groups"]
    # On: two micro-batches of half the requests take turns, a request never in two adjacent steps.
    assert all(len(g) == NUM_PROMPTS // 2 for g in on["groups"]), on["groups"]
    assert all(not (a & b) for a, b in zip(on["groups"], on["groups"][1:])), "a request in two adjacent steps"
    assert on["in_flight"]["overlap_steps"] > on["decode_steps"] // 2, (on["in_flight"], on["decode_steps"])


def test_three_groups_at_pp2_take_turns_with_the_same_tokens(no_leftovers):
    """``KIT_PP_GROUPS=3`` at PP=2 without drafts, 8 prompts at once: the requests take turns in three disjoint groups
    (3, 3 and 2 requests; a request never in two of any three consecutive steps: three steps in flight), and the
    tokens are the PP=1 no-spec reference's."""
    prompts = load_prompts(limit=NUM_PROMPTS)
    t = Topology(model=MODEL, random_weights=True, pp=2)
    ref = reference_for(t, prompts, MAX_TOKENS)
    jobs = [{"kind": "rpc", "method": "kit_trace_start"},
            {"kind": "generate", "prompts": prompts, "max_tokens": MAX_TOKENS},
            {"kind": "rpc", "method": "kit_trace_read"}]
    res = engine.run(t, jobs, env={"KIT_PATCHES": "all", "KIT_PP_GROUPS": "3"})
    got = engine.GenerationResult.from_dict(res["jobs"][1])
    assert first_divergence(ref, got) is None, first_divergence(ref, got)
    events = steptrace.merge(res["jobs"][2])
    by = steptrace.steps(events)
    groups = [frozenset(by[s]["forward"][0]["reqs"]) for s in steptrace.decode_steps(events)]
    full = [g for g in groups if len(g) > 1]  # the tail: requests end at different steps only with drafts; none here
    assert sorted(len(g) for g in full[:3]) == [2, 3, 3], groups[:6]
    assert all(not (a & b) and not (a & c) and not (b & c) for a, b, c in zip(groups, groups[1:], groups[2:])), \
        "a request in two of three consecutive steps"


def test_the_group_count_is_checked():
    from kit.patches.pp_microbatches import GROUPS_ENV, groups

    assert groups(2, {}) == 2 and groups(4, {GROUPS_ENV: ""}) == 4
    assert groups(2, {GROUPS_ENV: "3"}) == 3 and groups(2, {GROUPS_ENV: "4"}) == 4
    for bad in ("1", "5", "x", "-3", "2.5"):
        with pytest.raises(ValueError, match=GROUPS_ENV):
            groups(2, {GROUPS_ENV: bad})
