"""The Qwen3.5 hybrid (``tiny-qwen3_5-trained``): what vLLM 0.32 runs for ``Qwen3_5ForCausalLM``
(``vllm/model_executor/models/qwen3_5.py``, on ``qwen3_next.py``) and its ``Qwen3_5MTP`` drafter (``qwen3_5_mtp.py``).

- Target: transformers' own ``Qwen3_5TextModel`` (Gated-DeltaNet and gated full-attention layers, zero-centred
  RMSNorms ``x * (1 + w)``, the final norm) with its pure-PyTorch Gated-DeltaNet (``torch_chunk_gated_delta_rule``;
  no ``fla`` needed), and an untied ``lm_head``. Its checkpoint names are the ones vLLM's loader reads.
  The model returns the hidden state **after** ``model.norm``, and that is what vLLM hands the drafter.
- Drafter (checkpoint ``mtp.*``): ``fc`` over ``[pre_fc_norm_embedding(embed(x[t+1])), pre_fc_norm_hidden(h_t)]``
  (this order; the embedding is **not** zeroed at position 0, unlike MiMo / DeepSeek), one full-attention decoder
  layer (``mtp.layers.0.*``: gated attention, per-head q/k norms, partial neox RoPE on the first
  ``head_dim * partial_rotary_factor`` dims), ``mtp.norm``, the shared ``lm_head``. The normed output is the hidden
  the second draft step takes. Written in :mod:`kit.zoo.tiny.layers`' style so the trainer's chain loss and the draft
  replay (:mod:`kit.zoo.tiny.decode`) apply to it; ``tests/test_tinyqwen.py`` checks its block against transformers'
  ``Qwen3_5DecoderLayer`` with the same weights.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from kit.zoo.tiny.config import Qwen35Config
from kit.zoo.tiny.layers import Attention, MTPBase, Rotary, init_normal_

# The drafter's decoder block sits under ``mtp.layers.0.``; its fc and norms directly under ``mtp.``.
MTP_OWN = ("fc.", "pre_fc_norm_hidden.", "pre_fc_norm_embedding.", "norm.")


def _zero_centred_norm(dim: int, eps: float) -> nn.Module:
    """vLLM's ``GemmaRMSNorm`` (``Qwen3_5RMSNorm``): transformers' class, the same formula."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    return Qwen3_5RMSNorm(dim, eps)


class GatedAttention(Attention):
    """``Qwen3NextAttention`` with ``attn_output_gate``: ``q_proj`` gives per head ``[query | gate]``; the output
    of the heads is multiplied by ``sigmoid(gate)`` before ``o_proj``. No biases."""

    def __init__(self, c: Qwen35Config, rotary: Rotary):
        nn.Module.__init__(self)
        self.nh, self.nkv, self.hd, self.rot = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rotary_dim
        h = c.hidden_size
        self.q_proj = nn.Linear(h, 2 * self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self.q_norm = _zero_centred_norm(self.hd, c.rms_norm_eps)
        self.k_norm = _zero_centred_norm(self.hd, c.rms_norm_eps)
        self._rotary = [rotary]

    def _query_gate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        qg = self.q_proj(x).view(B, T, self.nh, 2 * self.hd)
        return qg[..., :self.hd], qg[..., self.hd:]

    def _rope(self, t: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return torch.cat([self._rotary[0](t[..., :self.rot], positions), t[..., self.rot:]], dim=-1)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        B, T, _ = x.shape
        q = self.q_norm(self._query_gate(x)[0]).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = self._rope(q, positions), self._rope(k, positions)
        rep = self.nh // self.nkv
        return q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)

    def out(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        B, H, T, D = o.shape
        gate = self._query_gate(x)[1]
        return self.o_proj((o.transpose(1, 2) * torch.sigmoid(gate)).reshape(B, T, H * D))


class MTPLayer(MTPBase):
    """``Qwen3_5MultiTokenPredictor`` with one layer; parameters as in the checkpoint minus the block's
    ``layers.0.`` (:meth:`TinyQwen3_5.checkpoint_state_dict` adds it back)."""

    def __init__(self, c: Qwen35Config, rotary: Rotary):
        super().__init__(c, rotary, GatedAttention(c, rotary))
        h, eps = c.hidden_size, c.rms_norm_eps
        self.input_layernorm = _zero_centred_norm(h, eps)
        self.post_attention_layernorm = _zero_centred_norm(h, eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_hidden = _zero_centred_norm(h, eps)
        self.pre_fc_norm_embedding = _zero_centred_norm(h, eps)
        self.norm = _zero_centred_norm(h, eps)

    def mtp_input(self, token_embeds, positions, prev_hidden):
        return self.fc(torch.cat([self.pre_fc_norm_embedding(token_embeds), self.pre_fc_norm_hidden(prev_hidden)], -1))

    def out_norm(self, x):
        return self.norm(x)


class TinyQwen3_5(nn.Module):
    """:class:`~kit.zoo.tiny.mimo.TinyMiMo`'s interface on the Qwen3.5 layout. :meth:`hidden` is the trunk's output
    after ``model.norm`` (what vLLM passes to the drafter), so :meth:`logits` is the head alone."""

    def __init__(self, c: Qwen35Config):
        super().__init__()
        from transformers import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextModel

        self.mc = c
        hc = Qwen3_5TextConfig(**{k: v for k, v in c.hf.items() if k not in ("architectures", "torch_dtype")})
        hc._attn_implementation = "sdpa"
        self.model = Qwen3_5TextModel(hc).float()
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.rotary = Rotary(c.rotary_dim, c.max_position_embeddings, c.rope_theta)  # buffers only, not stored
        self.mtp = MTPLayer(c, self.rotary)

    @property
    def mtp_layer(self) -> MTPLayer:
        return self.mtp

    def hidden(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        B, T = input_ids.shape
        pos = torch.arange(T, device=input_ids.device) if positions is None else positions
        pos = pos.expand(B, T) if pos.dim() == 1 else pos
        return self.model(input_ids=input_ids, position_ids=pos, use_cache=False).last_hidden_state

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def mtp_hidden(self, hidden: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                   kv_out: list | None = None) -> torch.Tensor:
        return self.mtp.mtp_forward(self.model.embed_tokens(next_ids), positions, hidden, kv_out)

    def mtp_logits(self, mtp_hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(mtp_hidden)

    def init_weights(self, seed: int) -> None:
        """:func:`~kit.zoo.tiny.layers.init_normal_`, then transformers' Qwen3.5 values where they differ: the
        zero-centred norms 0, the depthwise conv uniform within 1/sqrt(kernel), ``A_log`` = log U(1, 16),
        ``dt_bias`` 1 (the gated output norm stays 1)."""
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet, Qwen3_5RMSNorm

        init_normal_(self, seed, self.mc.num_hidden_layers + 1)
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, m in sorted(self.named_modules(), key=lambda x: x[0]):
                if isinstance(m, Qwen3_5RMSNorm):
                    m.weight.zero_()
                elif isinstance(m, Qwen3_5GatedDeltaNet):
                    w = m.conv1d.weight
                    bound = 1 / math.sqrt(w.shape[-1])
                    w.copy_(torch.rand(w.shape, generator=g) * 2 * bound - bound)
                    m.A_log.copy_(torch.log(1 + 15 * torch.rand(m.A_log.shape, generator=g)))
                    m.dt_bias.fill_(1.0)

    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        """The checkpoint's names (``mtp.layers.0.`` for the drafter's block), sorted."""
        sd = {}
        for k, v in self.state_dict().items():
            if k.startswith("mtp.") and not k[4:].startswith(MTP_OWN):
                k = "mtp.layers.0." + k[4:]
            sd[k] = v.detach().contiguous().clone()
        return dict(sorted(sd.items()))

    def from_checkpoint(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A checkpoint's tensors under this module's names."""
        return {k.replace("mtp.layers.0.", "mtp.", 1): v for k, v in sd.items()}
