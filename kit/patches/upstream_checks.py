"""Seed items that vLLM 0.32.0 already fixes, detected from the installed code's behaviour.

- ``draft_pp_gate`` (vLLM issue #52069, PR #52117): the draft model's parallel config copied the target's
  PP size, so ``verify_with_parallel_config`` demanded ``SupportsPP`` of every MTP head and PP + MTP
  failed with ``NotImplementedError: Pipeline parallelism is not supported for this model``.
  Detected by building a draft parallel config from a PP=2 target config.
- ``eagle3_total_layers`` (seed PR #46003): Eagle3 drafters computed ``target_layer_num`` with
  ``get_num_layers(parallel_config)`` (the per-rank count) instead of ``get_total_num_hidden_layers()``,
  corrupting ``layer_types`` indexing under PP. Detected from ``llama_eagle3``'s code.
- ``qwen3_5_mtp_intermediates`` (seed PR #46003): the Qwen3.5 MTP forward read PP intermediates on
  non-first ranks. Detected from ``qwen3_5_mtp``'s forward (importable here through the kit's
  ``qwen_vl_no_torchvision`` patch); checked on live PP=2 workers by ``tests/test_qwen3_5.py`` (the drafter only
  on the last rank, never called with PP intermediates).
Each is registered with ``needed()`` that returns False when the fix is present (status "upstream").
"""
from __future__ import annotations

import inspect

from . import Patch, register


def _draft_pp_gate_needed() -> "bool | str":
    from vllm.config import ParallelConfig, SpeculativeConfig

    target = ParallelConfig(pipeline_parallel_size=2)
    draft = SpeculativeConfig.create_draft_parallel_config(target, 1)
    return draft.pipeline_parallel_size != 1


def _eagle3_needed() -> "bool | str":
    from vllm.model_executor.models import llama_eagle3

    src = inspect.getsource(llama_eagle3)
    return "get_total_num_hidden_layers" not in src


def _qwen35_needed() -> "bool | str":
    try:
        from vllm.model_executor.models import qwen3_5_mtp
    except Exception as e:  # without the qwen_vl_no_torchvision patch: needs torchvision via transformers
        return f"not importable here: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    src = inspect.getsource(qwen3_5_mtp)
    return "is_first_rank" in src and "intermediate_tensors is None" not in src


def _noop() -> None:
    raise RuntimeError("this vLLM already has the fix; the kit has nothing to apply")


register(Patch(
    name="draft_pp_gate",
    summary="draft parallel config uses PP=1, so MTP heads need no SupportsPP",
    upstream="vLLM issue #52069, PR #52117",
    targets="vLLM < 0.32",
    apply=_noop,
    report_only=True,
    needed=_draft_pp_gate_needed,
    where="front end (config)",
))
register(Patch(
    name="eagle3_total_layers",
    summary="Eagle3 target_layer_num from the total layer count, not the per-rank count",
    upstream="vLLM #46003 (seed PR)",
    targets="vLLM < 0.32",
    apply=_noop,
    report_only=True,
    needed=_eagle3_needed,
))
register(Patch(
    name="qwen3_5_mtp_intermediates",
    summary="Qwen3.5 MTP forward never consumes PP intermediates",
    upstream="vLLM #46003 (seed PR)",
    targets="vLLM < 0.32",
    apply=_noop,
    report_only=True,
    needed=_qwen35_needed,
))


# -- teaching: the OLD Eagle3 behaviour, reproduced on real vLLM code ------------------------------------

def _legacy_apply() -> None:
    """During the Eagle3 drafter's construction, answer the total layer count with the per-rank count,
    exactly as pre-fix vLLM did (``target_layer_num = model_config.get_num_layers(parallel_config)``)."""
    import functools

    from vllm.config import ModelConfig
    from vllm.model_executor.models import llama_eagle3

    cls = llama_eagle3.Eagle3LlamaForCausalLM
    orig_init = cls.__init__

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

    cls.__init__ = __init__


register(Patch(
    name="eagle3_per_rank_layers_legacy",
    summary="TEACHING ONLY: reinstate the old Eagle3 target_layer_num = per-rank layer count",
    upstream="vLLM #46003 (what the seed PR fixed)",
    targets="vllm==0.32.0 (to show pre-fix behaviour)",
    apply=_legacy_apply,
    needed=lambda: True,
    teaching_only=True,
))
