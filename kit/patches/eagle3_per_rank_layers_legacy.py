"""TEACHING ONLY: reinstate the old Eagle3 ``target_layer_num`` = per-rank layer count, on real vLLM code.

What it shows: before vLLM PR #46003 Eagle3 drafters took the target's layer count from
``model_config.get_num_layers(parallel_config)``, the per-rank count, so ``layer_types`` indexing went wrong
under PP (``eagle3_total_layers`` reports the fix upstream). The notebooks turn this on to show the defect.
How: during the Eagle3 drafter's construction only, answer ``get_total_num_hidden_layers()`` with the per-rank
count, exactly as pre-fix vLLM did.
Upstream: vLLM PR #46003 (what it fixed). Target: vLLM 0.32.0. Removal: with the notebook that uses it.
Turn on: ``KIT_PATCHES=all,eagle3_per_rank_layers_legacy`` (off by default).
"""
from __future__ import annotations

import functools

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "eagle3_per_rank_layers_legacy"


def _wrap(orig_init):
    from vllm.config import ModelConfig

    @functools.wraps(orig_init)
    def __init__(self, *, vllm_config, prefix: str = ""):
        mc = vllm_config.model_config
        per_rank = mc.get_num_layers(vllm_config.parallel_config)
        orig_total = ModelConfig.get_total_num_hidden_layers
        ModelConfig.get_total_num_hidden_layers = lambda self_: per_rank if self_ is mc else orig_total(self_)
        try:
            orig_init(self, vllm_config=vllm_config, prefix=prefix)
        finally:
            ModelConfig.get_total_num_hidden_layers = orig_total

    return __init__


def _apply() -> None:
    from vllm.model_executor.models import llama_eagle3

    install(llama_eagle3.Eagle3LlamaForCausalLM, "__init__", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="TEACHING ONLY: reinstate the old Eagle3 target_layer_num = per-rank layer count",
    why=("Reproduces the pre-#46003 defect for the notebooks: while the Eagle3 drafter is built, the target's "
         "total layer count is answered with the per-rank count."),
    upstream="vLLM PR #46003 (what it fixed)",
    target="vllm==0.32.0 (to show pre-fix behaviour)",
    symbols=("vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM.__init__",),
    processes={Proc.WORKER},
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="with the notebook that uses it",
    tests=("tests/test_notebooks.py::test_layer_types_notebook_fails_when_its_claim_breaks",),
    findings="eagle3-drafter-takes-the-per-rank-layer-count",
    anchors=(Anchor("vllm.config:ModelConfig.get_total_num_hidden_layers"),
             Anchor("vllm.config:ModelConfig.get_num_layers")),
    apply=_apply,
    needed=lambda: True,
    teaching_only=True,
)
