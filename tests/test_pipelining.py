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
    return engine.GenerationResult.from_dict(res["jobs"][1]), steptrace.summary(steptrace.merge(res["jobs"][2]))


def test_microbatches_off_and_on(no_leftovers):
    """PP=2 without drafts, 8 prompts at once. Off (vLLM 0.32 as shipped): every step carries every request, so
    no two steps are ever in flight. On (``pp_microbatches``): the requests alternate in two groups of 4 and
    most decode steps start while the previous one is still on the last stage. Tokens identical to the PP=1
    no-spec reference both ways."""
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
    assert on["in_flight"]["overlap_steps"] >= 0.8 * on["decode_steps"], (on["in_flight"], on["decode_steps"])
