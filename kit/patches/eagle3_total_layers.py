"""Report only: Eagle3's target layer count is the total, not the per-rank count (fixed in 0.32).

What breaks without it (before vLLM PR #46003): Eagle3 drafters computed ``target_layer_num`` with
``get_num_layers(parallel_config)`` (the per-rank count) instead of ``get_total_num_hidden_layers()``,
corrupting ``layer_types`` indexing under PP.
Fix: upstream; nothing to apply. ``needed()`` reads ``llama_eagle3``'s code. The old behaviour can be
reproduced for teaching with ``eagle3_per_rank_layers_legacy``.
Upstream: vLLM PR #46003. Target: vLLM < 0.32 (detection on 0.32.0).
Removal: with support for vLLM versions without the fix. Turn off: nothing to turn off (report only).
"""
from __future__ import annotations

import inspect

from kit.patches import Kind, Patch, Proc, Runner
from kit.patches.draft_pp_gate import nothing_to_apply

NAME = "eagle3_total_layers"


def _needed() -> "bool | str":
    from vllm.model_executor.models import llama_eagle3

    return "get_total_num_hidden_layers" not in inspect.getsource(llama_eagle3)


PATCH = Patch(
    name=NAME,
    summary="Eagle3 target_layer_num from the total layer count, not the per-rank count (report only)",
    why=("Eagle3 drafters used the per-rank layer count as the target's layer count, so under PP the draft "
         "layer was named after a target layer (model.layers.<per-rank count>): a clash on the last rank, or a "
         "name whose layer_types entry is another layer's kind. Detected from llama_eagle3's code."),
    upstream="vLLM PR #46003",
    target="vLLM < 0.32 (fixed in 0.32.0)",
    symbols=(),
    processes={Proc.WORKER},  # the drafter is built in the last PP rank's worker
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="with support for vLLM versions without the fix",
    tests=("tests/test_notebooks.py::test_layer_types_notebook_fails_when_its_claim_breaks "
           "(the teaching patch eagle3_per_rank_layers_legacy reinstates the defect)",),
    findings="eagle3-drafter-takes-the-per-rank-layer-count",
    apply=nothing_to_apply,
    needed=_needed,
    report_only=True,
)
