"""The MiMo model (``tiny-mimo``, ``mimo-py-18m``): what vLLM 0.32 runs for ``MiMoForCausalLM`` and ``MiMoMTP``.

Sources followed: ``vllm/model_executor/models/{qwen2,mimo,mimo_mtp}.py``. Qwen2 decoder layers, a final RMSNorm
and an untied LM head. The MTP layer (``MiMoMultiTokenPredictorLayer``) takes, at position ``t``, the trunk's last
hidden state ``h_t`` *before* the final norm (``MiMoModel.forward`` returns ``hidden_states + residual``; the norm
is applied in ``compute_logits``) and the embedding of token ``t+1`` (zeroed at position 0, as vLLM does),
normalises them (``hidden_layernorm``, ``token_layernorm``), concatenates ``[hidden, token]``, projects with
``input_proj``, runs one Qwen2 decoder block, applies ``final_layernorm`` and the shared LM head, and predicts
token ``t+2``. With ``num_speculative_tokens > 1`` vLLM re-applies the same layer to its own (final-normed) output
and its own draft token.

Checkpoint names follow the HF MiMo layout: trunk under ``model.`` / ``lm_head``, the MTP layer as
``model.mtp_layers.0.{token_layernorm,hidden_layernorm,input_proj,final_layernorm}`` plus the decoder block's own
names directly under ``model.mtp_layers.0.`` (vLLM's ``MiMoMTP`` maps them onto ``mtp_block`` at load time).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from kit.zoo.tiny.config import ModelConfig
from kit.zoo.tiny.layers import DecoderLayer, MTPBase, RMSNorm, Rotary, init_normal_


class MTPLayer(MTPBase):
    """MiMoMultiTokenPredictorLayer; the decoder block's parameters sit directly on the layer,
    as in the HF checkpoint (vLLM renames them to ``mtp_block.*`` when loading)."""

    def __init__(self, mc: ModelConfig, rotary: Rotary):
        super().__init__(mc, rotary)
        self.token_layernorm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)
        self.hidden_layernorm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)
        self.input_proj = nn.Linear(2 * mc.hidden_size, mc.hidden_size, bias=False)
        self.final_layernorm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)

    def mtp_input(self, token_embeds, positions, prev_hidden):
        token_embeds = torch.where(positions.unsqueeze(-1) == 0, 0.0, token_embeds)
        e = self.token_layernorm(token_embeds)
        h = self.hidden_layernorm(prev_hidden)
        return self.input_proj(torch.cat([h, e], dim=-1))

    def out_norm(self, x):
        return self.final_layernorm(x)


class Trunk(nn.Module):
    def __init__(self, mc: ModelConfig):
        super().__init__()
        self.rotary = Rotary(mc.head_dim, mc.max_position_embeddings, mc.rope_theta)
        self.embed_tokens = nn.Embedding(mc.vocab_size, mc.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(mc, self.rotary) for _ in range(mc.num_hidden_layers)])
        self.norm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)
        self.mtp_layers = nn.ModuleList([MTPLayer(mc, self.rotary) for _ in range(mc.num_nextn_predict_layers)])


class TinyMiMo(nn.Module):
    """State-dict names are exactly the checkpoint's (``model.*``, ``lm_head.weight``).

    The interface every tiny model offers (the trainer, decoding and parity use only it): :meth:`hidden`,
    :meth:`logits`, :meth:`mtp_hidden`, :meth:`mtp_logits`, ``model.embed_tokens``, :attr:`mtp_layer`."""

    def __init__(self, mc: ModelConfig):
        super().__init__()
        self.mc = mc
        self.model = Trunk(mc)
        self.lm_head = nn.Linear(mc.hidden_size, mc.vocab_size, bias=False)

    def trunk_layers(self) -> list[nn.Module]:
        return list(self.model.layers)

    @property
    def mtp_layer(self) -> MTPBase:
        """The (first) MTP layer: the drafter the trainer's chain loss and the draft replay apply."""
        return self.model.mtp_layers[0]

    def hidden(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Last-layer hidden state BEFORE the final norm (what vLLM hands the MTP drafter)."""
        if positions is None:
            positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
        x = self.model.embed_tokens(input_ids)
        for layer in self.trunk_layers():
            x = layer(x, positions)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model.norm(hidden))

    def drafter_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """The trunk state the drafter receives: MiMo hands over the pre-norm hidden state."""
        return hidden

    def mtp_hidden(self, hidden: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                   kv_out: list | None = None) -> torch.Tensor:
        """MTP output at position t from h_t and token t+1 (after the layer's output norm)."""
        return self.model.mtp_layers[0].mtp_forward(self.model.embed_tokens(next_ids), positions,
                                                    self.drafter_hidden(hidden), kv_out)

    def mtp_logits(self, mtp_hidden: torch.Tensor) -> torch.Tensor:
        # compute_logits of the MTP model: the shared LM head on the output norm (no model.norm)
        return self.lm_head(mtp_hidden)

    def init_weights(self, seed: int) -> None:
        init_normal_(self, seed, self.mc.num_hidden_layers + self.mc.num_nextn_predict_layers)
