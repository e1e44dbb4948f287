"""kit.checks.traffic: the traffic cells' prompts have the token counts they are meant to have (no engine)."""
from __future__ import annotations

import os

from kit.checks import traffic
from kit.checks.matrix import CELLS
from kit.core.topology import Topology


def test_traffic_prompts_have_exact_lengths_and_shared_prefixes():
    path = str(Topology(model="tiny-deepseek-v3-trained").model_path())
    texts = traffic.prompts(path, 2)
    got = traffic.prompt_lengths(path, texts)
    want = traffic.lengths(2)
    assert got[:len(want)] == want        # 1, 2, k+1..k+3, a block -1/0/+1, two blocks + 1
    shared = os.path.commonprefix(texts[-2:])
    assert min(got[-2:]) > 2 * traffic.BLOCK and traffic.prompt_lengths(path, [shared])[0] > 2 * traffic.BLOCK
    assert traffic.stop_token_ids(path) and len(traffic.stop_token_ids(path)) == 1


def test_traffic_cells_carry_the_setting_into_their_topology_and_reference():
    cells = [c for c in CELLS if c.traffic]
    assert {c.model for c in cells} >= {"tiny-mimo", "tiny-qwen3_5-trained", "tiny-deepseek-v3-trained",
                                         "tiny-glm4-moe", "tiny-llama-swa-trained"}
    t = cells[0].topology()
    assert t.max_num_seqs == traffic.MAX_NUM_SEQS and t.max_num_batched_tokens == traffic.PREFILL_BUDGET
    assert t.engine_args()["num_gpu_blocks_override"] == traffic.KV_BLOCKS
    ref = t.reference()
    assert ref.max_num_batched_tokens == traffic.PREFILL_BUDGET and ref.extra_engine_args == t.extra_engine_args
    assert all(c.id.endswith("-traffic") for c in cells)
    # Every family at PP 1, 2 and 4; the default selection runs the MLA and the Eagle3 family at PP=2.
    assert {(c.model, c.spec.split(":")[0], c.pp) for c in cells} == {
        (m, s, pp) for m, s in (("tiny-mimo", "mtp"), ("tiny-qwen3_5-trained", "mtp"), ("tiny-mimo", "ngram"),
                                ("tiny-deepseek-v3-trained", "mtp"), ("tiny-glm4-moe", "mtp"),
                                ("tiny-llama-swa-trained", "eagle3")) for pp in (1, 2, 4)}
    assert sorted(c.id for c in cells if c.fast) == ["tiny-deepseek-v3-trained-trained-pp2-mtp2-seqs3-traffic",
                                                     "tiny-llama-swa-trained-trained-pp2-eagle32-seqs3-traffic"]


def test_scheduler_counters_sum_vllms_own_metrics():
    """Preemptions and prefix-cache tokens as LLM.get_metrics() reports them (one Counter per engine)."""
    from types import SimpleNamespace as M

    from kit.core.metrics import scheduler_counters

    got = scheduler_counters([M(name="vllm:num_preemptions", value=2), M(name="vllm:num_preemptions", value=1),
                              M(name="vllm:prefix_cache_hits", value=256), M(name="vllm:prefix_cache_queries", value=900),
                              M(name="vllm:spec_decode_num_drafts", value=7)])
    assert got == {"preemptions": 3, "prefix_cache_queries": 900, "prefix_cache_hits": 256}
