"""The layers both tiny models are built from, in pure PyTorch, computing what vLLM 0.32 computes.

RMSNorm in float32, RoPE from vLLM's cos/sin cache (neox style, and GPT-J style for DeepSeek's MLA), grouped-query
attention with q/k/v biases (Qwen2), the SiLU-gated MLP and the pre-norm residual decoder layer. The attention
also computes the drafter's second application (``forward_chain``): what vLLM's drafter KV cache holds at draft
step 2, which the trainer's chain loss trains.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from kit.zoo.tiny.config import ModelConfig


class RMSNorm(nn.Module):
    """vLLM ``ir.ops.rms_norm``: x * rsqrt(mean(x^2) + eps) * weight, computed in float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x.to(self.weight.dtype) * self.weight).to(dt)


class Rotary(nn.Module):
    """Neox-style RoPE with vLLM's cos/sin cache (``rotary_embedding/base.py``)."""

    def __init__(self, head_dim: int, max_pos: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        t = torch.arange(max_pos, dtype=torch.float)
        freqs = torch.einsum("i,j -> ij", t, inv_freq)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [B, T] or [T] -> [B, 1, T, D/2] (broadcast over heads)
        return self.cos[positions].unsqueeze(-3), self.sin[positions].unsqueeze(-3)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos_sin(positions)  # x: [B, H, T, D]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class InterleavedRotary(Rotary):
    """vLLM's RoPE with ``is_neox_style=False`` (GPT-J style): pairs (2i, 2i+1) rotate by freq i."""

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos_sin(positions)
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """Who may attend to whom: causal, and within ``window`` positions (``q - k < window``) when ``window`` > 0."""
    d = q_pos[:, None] - k_pos[None, :]
    ok = d >= 0
    return ok & (d < window) if window > 0 else ok


class Attention(nn.Module):
    """Qwen2 attention (biased q/k/v, grouped KV heads); Llama's with ``bias=False``. ``in_dim``: the input width
    when it is not the hidden size (an Eagle3 drafter's layer reads two hidden states side by side); ``window`` > 0:
    sliding-window attention over the last ``window`` positions. Subclasses change only :meth:`qkv` (and their
    projections): ``hd`` is the q/k head dim used for the softmax scale."""

    window = 0  # full causal attention unless __init__ says otherwise (subclasses build their own projections)

    def __init__(self, mc: ModelConfig, rotary: Rotary, bias: bool = True, in_dim: int | None = None,
                 window: int = 0):
        super().__init__()
        self.nh, self.nkv, self.hd = mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim
        h = mc.hidden_size
        d = in_dim or h
        self.q_proj = nn.Linear(d, self.nh * self.hd, bias=bias)
        self.k_proj = nn.Linear(d, self.nkv * self.hd, bias=bias)
        self.v_proj = nn.Linear(d, self.nkv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self._rotary = [rotary]  # shared, not a submodule (keeps state_dict names clean)
        self.window = window

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        rot = self._rotary[0]
        q, k = rot(q, positions), rot(k, positions)
        rep = self.nh // self.nkv
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        return q, k, v

    def out(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The output projection of the heads ``o``; ``x`` is the attention's input (gated attention reads it)."""
        B, H, T, D = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * D))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_out: list | None = None):
        q, k, v = self.qkv(x, positions)
        if kv_out is not None:
            kv_out.append((k, v))
        if self.window > 0:
            pos = torch.arange(x.shape[1], device=x.device)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=window_mask(pos, pos, self.window),
                                               scale=self.hd ** -0.5)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.hd ** -0.5)
        return self.out(o, x)

    def forward_chain(self, x: torch.Tensor, positions: torch.Tensor, k1: torch.Tensor,
                      v1: torch.Tensor) -> torch.Tensor:
        """Second drafter application: slot i (position ``positions[i]``, one past first-pass
        position i) attends to the first pass's keys at positions 0..i (those within the window from
        position i+1) and to its own key, which is what the drafter KV cache holds at draft step 2 in vLLM."""
        q, k2, v2 = self.qkv(x, positions)
        T = x.shape[1]
        scale = self.hd ** -0.5
        s1 = torch.matmul(q, k1.transpose(-1, -2)) * scale  # [B, H, T, T]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        if self.window > 0:
            pos = torch.arange(T, device=x.device)
            mask &= window_mask(pos + 1, pos, self.window)
        s1 = s1.masked_fill(~mask, float("-inf"))
        s2 = (q * k2).sum(-1, keepdim=True) * scale  # [B, H, T, 1]
        p = torch.softmax(torch.cat([s1, s2], dim=-1), dim=-1)
        o = torch.matmul(p[..., :T], v1) + p[..., T:] * v2
        return self.out(o, x)


class MLP(nn.Module):
    def __init__(self, mc):
        super().__init__()
        self.gate_proj = nn.Linear(mc.hidden_size, mc.intermediate_size, bias=False)
        self.up_proj = nn.Linear(mc.hidden_size, mc.intermediate_size, bias=False)
        self.down_proj = nn.Linear(mc.intermediate_size, mc.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP with residual adds (Qwen2DecoderLayer; DeepseekV2DecoderLayer when dense).
    ``attention`` is the attention module (built from ``mc`` and ``rotary``)."""

    def __init__(self, mc, rotary: Rotary, attention: nn.Module | None = None):
        super().__init__()
        self.self_attn = attention if attention is not None else Attention(mc, rotary)
        self.mlp = MLP(mc)
        self.input_layernorm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)

    def forward(self, x, positions, kv_out: list | None = None):
        h = x + self.self_attn(self.input_layernorm(x), positions, kv_out)
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward_chain(self, x, positions, k1, v1):
        h = x + self.self_attn.forward_chain(self.input_layernorm(x), positions, k1, v1)
        return h + self.mlp(self.post_attention_layernorm(h))


class MTPBase(DecoderLayer):
    """An MTP layer: the input of token t+1's embedding and hidden state h_t (:meth:`mtp_input`, per
    architecture), one decoder block, and an output norm (:meth:`out_norm`)."""

    def mtp_input(self, token_embeds, positions, prev_hidden):
        raise NotImplementedError

    def out_norm(self, x):
        raise NotImplementedError

    def mtp_forward(self, token_embeds, positions, prev_hidden, kv_out: list | None = None):
        x = self.mtp_input(token_embeds, positions, prev_hidden)
        return self.out_norm(DecoderLayer.forward(self, x, positions, kv_out))

    def mtp_forward_chain(self, token_embeds, positions, prev_hidden, k1, v1):
        x = self.mtp_input(token_embeds, positions, prev_hidden)
        return self.out_norm(DecoderLayer.forward_chain(self, x, positions, k1, v1))


def init_normal_(model: nn.Module, seed: int, n_layers: int) -> None:
    """GPT-2-style init, seeded, in sorted parameter-name order: biases 0, other 1-D tensors (norms) 1, matrices
    N(0, 0.02), output projections scaled by 1/sqrt(2 x layers). Shared by both tiny models."""
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.ndim == 1:
            nn.init.ones_(p)
        else:
            std = 0.02
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                std = 0.02 / math.sqrt(2 * n_layers)
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)
