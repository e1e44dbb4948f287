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
                                         "tiny-glm4-moe", "tiny-llama-swa"}
    t = cells[0].topology()
    assert t.max_num_seqs == traffic.MAX_NUM_SEQS and t.max_num_batched_tokens == traffic.PREFILL_BUDGET
    assert t.engine_args()["num_gpu_blocks_override"] == traffic.KV_BLOCKS
    ref = t.reference()
    assert ref.max_num_batched_tokens == traffic.PREFILL_BUDGET and ref.extra_engine_args == t.extra_engine_args
    assert all(c.id.endswith("-traffic") and not c.fast for c in cells)
