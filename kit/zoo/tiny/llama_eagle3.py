"""Llama with sliding/full attention layers and its Eagle3 drafter (``tiny-llama-swa-trained`` and
``tiny-llama-swa-trained-eagle3``): what vLLM 0.32 runs for ``LlamaForCausalLM`` and ``Eagle3LlamaForCausalLM``.

Sources followed: ``vllm/model_executor/models/{llama,llama_eagle3}.py``, ``models/interfaces.py``
(``_maybe_add_hidden_state``). The target is plain Llama (no q/k/v bias, neox RoPE) whose layers attend either to
the whole context or, where ``layer_types`` says ``sliding_attention``, to the last ``sliding_window`` positions
(``i - j < window``). Eagle3 auxiliary hidden state ``L`` is the residual stream after ``L`` target layers
(``hidden + residual``; ``L = 0`` the embeddings). The drafter at position ``t``: ``fc`` maps the concatenated
auxiliary states to one hidden state ``g``; its one decoder layer takes ``cat(input_layernorm(embed(x[t+1])),
hidden_norm(g))`` (twice the hidden width) into attention, keeps ``g`` as the residual, then the usual post-attention
norm and MLP; ``norm`` and the drafter's own ``lm_head`` give the logits of ``x[t+2]``. Its second application
(``num_speculative_tokens > 1``) feeds its own pre-norm output back in place of ``g`` (no ``fc``: the widths
already agree). The drafter uses the target's token embedding; its checkpoint carries a copy (``embed_tokens``), because
vLLM 0.32 shares the target's embedding with an Eagle3 drafter only at PP=1 (``_maybe_share_embeddings``): at PP > 1
a drafter checkpoint without one runs on an embedding no checkpoint filled.

:class:`TinyLlamaEagle3` offers :class:`~kit.zoo.tiny.mimo.TinyMiMo`'s interface, so the trainer's joint loss
(trunk + first draft + chained second draft) trains both: :meth:`hidden` returns the target's final pre-norm state
with the auxiliary states appended along the last dimension, which :meth:`logits` and :meth:`mtp_hidden` split.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from kit.zoo.tiny.config import _ArchConfig
from kit.zoo.tiny.layers import MLP, Attention, DecoderLayer, RMSNorm, Rotary, init_normal_

SLIDING = "sliding_attention"


@dataclass
class LlamaSWAConfig(_ArchConfig):
    """The target's ``config.json`` fields, and the drafter's (``from_hf``'s ``draft``)."""

    intermediate_size: int = 256
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    sliding_window: int = 32
    layer_types: list = field(default_factory=list)
    aux_layer_ids: list = field(default_factory=lambda: [1, 2, 3])
    draft_layer_types: list = field(default_factory=lambda: [SLIDING])
    draft_intermediate_size: int = 256

    @classmethod
    def from_hf(cls, c: dict, draft: dict | None = None) -> "LlamaSWAConfig":
        if c.get("attention_bias") or c.get("tie_word_embeddings") or (c.get("rope_parameters") or {}).get(
                "rope_type", "default") != "default":
            raise ValueError("only bias-free attention, untied heads and default RoPE are implemented")
        base = super().from_hf({k: v for k, v in c.items() if k not in ("layer_types", "sliding_window")})
        base.layer_types = list(c.get("layer_types") or ["full_attention"] * base.num_hidden_layers)
        base.sliding_window = int(c.get("sliding_window") or 0)
        if draft is not None:
            if draft.get("num_hidden_layers", 1) != 1 or draft.get("draft_vocab_size", base.vocab_size) != base.vocab_size:
                raise ValueError("only a one-layer Eagle3 drafter over the full vocabulary is implemented")
            ec = draft.get("eagle_config") or {}
            base.aux_layer_ids = list(ec.get("eagle_aux_hidden_state_layer_ids")
                                      or draft.get("eagle_aux_hidden_state_layer_ids") or [1, 2, 3])
            base.draft_layer_types = list(draft.get("layer_types") or ["full_attention"])
            base.draft_intermediate_size = int(draft["intermediate_size"])
        return base


def _attention(c: LlamaSWAConfig, rotary: Rotary, kind: str, in_dim: int | None = None) -> Attention:
    """Llama attention (no biases) of the layer kind ``kind``: sliding-window or full."""
    return Attention(c, rotary, bias=False, in_dim=in_dim, window=c.sliding_window if kind == SLIDING else 0)


class Eagle3Layer(nn.Module):
    """The drafter's ``midlayer``: attention over ``cat(norm(embeds), hidden_norm(g))``, residual ``g``."""

    def __init__(self, c: LlamaSWAConfig, rotary: Rotary):
        super().__init__()
        self.self_attn = _attention(c, rotary, c.draft_layer_types[0], 2 * c.hidden_size)
        self.mlp = MLP(_Sized(c.hidden_size, c.draft_intermediate_size))
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def _step(self, embeds, g, attend):
        h = g + attend(torch.cat([self.input_layernorm(embeds), self.hidden_norm(g)], dim=-1))
        return h + self.mlp(self.post_attention_layernorm(h))

    def mtp_forward(self, token_embeds, positions, prev_hidden, kv_out: list | None = None):
        return self._step(token_embeds, prev_hidden, lambda x: self.self_attn(x, positions, kv_out))

    def mtp_forward_chain(self, token_embeds, positions, prev_hidden, k1, v1):
        return self._step(token_embeds, prev_hidden, lambda x: self.self_attn.forward_chain(x, positions, k1, v1))


@dataclass
class _Sized:
    hidden_size: int
    intermediate_size: int


class Drafter(nn.Module):
    """``Eagle3LlamaForCausalLM``'s weights under their checkpoint names (``fc``, ``midlayer.*``, ``norm``,
    ``lm_head``)."""

    def __init__(self, c: LlamaSWAConfig, rotary: Rotary):
        super().__init__()
        self.fc = nn.Linear(len(c.aux_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(c, rotary)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)


class Trunk(nn.Module):
    def __init__(self, c: LlamaSWAConfig):
        super().__init__()
        self.rotary = Rotary(c.head_dim, c.max_position_embeddings, c.rope_theta)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(c, self.rotary, _attention(c, self.rotary, kind))
                                     for kind in c.layer_types])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class TinyLlamaEagle3(nn.Module):
    """Target (``model.*``, ``lm_head``) and drafter (``eagle3.*``); :meth:`checkpoint_state_dict` and
    :meth:`drafter_state_dict` give each checkpoint's names."""

    def __init__(self, c: LlamaSWAConfig):
        super().__init__()
        self.mc = c
        self.model = Trunk(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.eagle3 = Drafter(c, self.model.rotary)

    @property
    def mtp_layer(self) -> Eagle3Layer:
        return self.eagle3.midlayer

    def hidden(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``[final pre-norm state, aux states...]`` concatenated on the last dimension."""
        if positions is None:
            positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
        x = self.model.embed_tokens(input_ids)
        aux = [x] if 0 in self.mc.aux_layer_ids else []
        for i, layer in enumerate(self.model.layers):
            x = layer(x, positions)
            if i + 1 in self.mc.aux_layer_ids:
                aux.append(x)
        return torch.cat([x, *aux], dim=-1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model.norm(hidden[..., : self.mc.hidden_size]))

    def mtp_hidden(self, hidden: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                   kv_out: list | None = None) -> torch.Tensor:
        """The drafter's pre-norm output at position t from the aux states at t and token t+1."""
        g = self.eagle3.fc(hidden[..., self.mc.hidden_size:])
        return self.mtp_layer.mtp_forward(self.model.embed_tokens(next_ids), positions, g, kv_out)

    def mtp_logits(self, mtp_hidden: torch.Tensor) -> torch.Tensor:
        return self.eagle3.lm_head(self.eagle3.norm(mtp_hidden))

    def init_weights(self, seed: int) -> None:
        init_normal_(self, seed, self.mc.num_hidden_layers + 1)

    def checkpoint_state_dict(self) -> dict:
        """The target's checkpoint (HF Llama names)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("eagle3.")}

    def drafter_state_dict(self) -> dict:
        """The drafter's checkpoint: ``fc``, ``midlayer.*``, ``norm``, ``lm_head`` and a copy of the target's
        ``embed_tokens`` (at PP=1 vLLM finds it identical and shares the target's)."""
        sd = {k[len("eagle3."):]: v for k, v in self.state_dict().items() if k.startswith("eagle3.")}
        return {**sd, "embed_tokens.weight": self.model.embed_tokens.weight.detach().clone()}

    def from_checkpoint(self, sd: dict) -> dict:
        """A full state dict from the target's checkpoint plus the model's current drafter."""
        own = {k: v for k, v in self.state_dict().items() if k.startswith("eagle3.")}
        return {**sd, **own}
