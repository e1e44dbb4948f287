"""The dense DeepSeek-V3 model (``tiny-deepseek-v3-trained``): what vLLM 0.32 runs for ``DeepseekV3ForCausalLM``
with dense layers (``vllm/model_executor/models/deepseek_v2.py``, ``layers/mla.py``) and its ``DeepSeekMTP``
drafter (``deepseek_mtp.py``).

- MLA attention: ``q = q_b_proj(q_a_layernorm(q_a_proj(x)))`` split per head into nope (32) and rope (64) parts;
  ``kv_a_proj_with_mqa(x)`` split into the latent (512, then ``kv_a_layernorm``) and one shared rope key (64);
  ``kv_b_proj(latent)`` gives per-head nope keys (32) and values (32). RoPE is GPT-J style (``is_neox_style=False``:
  adjacent pairs rotate; vLLM uses it for every DeepSeek MLA model, ``rope_interleave`` only matters to HF), theta
  10000, default rope type, so the softmax scale is ``(32 + 64) ** -0.5`` with no yarn mscale.
- Pre-norm residual decoder layers with a SiLU-gated MLP; ``model.norm``; untied ``lm_head``.
- The trunk hands the MTP layer its hidden state **after** ``model.norm`` (``DeepseekV2Model`` returns
  ``self.norm(hidden, residual)``).
- MTP layer (``model.layers.<num_hidden_layers>``): embedding of token t+1 zeroed at position 0, ``enorm`` of it and
  ``hnorm`` of the hidden, concatenated as ``[embedding, hidden]`` (this order, unlike MiMo's), ``eh_proj``, one
  decoder layer, ``shared_head.norm`` and the head. The normed output is also the "hidden" that the second draft
  step (``num_speculative_tokens`` > 1) feeds back in.
- The MTP layer's ``embed_tokens`` and ``shared_head.head`` are the trunk's ``embed_tokens`` and ``lm_head``
  (trained tied; the checkpoint stores identical copies, :data:`TIED`, as DeepSeek-V3 does), so vLLM gives the
  same drafter whether it shares the target's tensors (PP=1) or loads its own (PP>1).

MLA rope needs the kit's ``cpu_rope_layout`` patch in vLLM (``docs/patches.md``): vLLM 0.32's CPU rotary op
mishandles the strided query and the ``k_pe`` view that ``layers/mla.py`` passes, so stock vLLM's MLA rope depends
on how many tokens share a forward pass; this model (correct rope) matches vLLM with that patch. ``q_rope=False``
is the workaround used before the patch existed (:data:`NO_Q_ROPE_NOTE`).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kit.zoo.tiny.config import DSConfig
from kit.zoo.tiny.layers import Attention, DecoderLayer, InterleavedRotary, MTPBase, RMSNorm
from kit.zoo.tiny.mimo import TinyMiMo

# Checkpoint tensors that are copies of trunk tensors (MTP layer index filled in).
TIED = {"model.layers.{n}.embed_tokens.weight": "model.embed_tokens.weight",
        "model.layers.{n}.shared_head.head.weight": "lm_head.weight"}
NO_Q_ROPE_NOTE = ("q_rope=False holds q's rope rows at exactly 0, so every rope score is 0 whatever the rotation "
                  "(position-free attention, causal mask only): it matches stock vLLM 0.32, whose CPU rotary op "
                  "mishandles MLA's strided q / k_pe (fixed by the kit's cpu_rope_layout patch)")


class MLAttention(Attention):
    """Multi-head latent attention with q LoRA, computed in the plain (non-absorbed) form.
    ``forward``/``forward_chain``/``out`` are :class:`kit.zoo.tiny.layers.Attention`'s; only the
    projections differ. Keys are [nope | roped shared rope key], ``hd`` the q/k head dim (96)."""

    def __init__(self, c: DSConfig, rotary: InterleavedRotary, q_rope: bool = True):
        nn.Module.__init__(self)
        self.q_rope = q_rope
        self.nh, self.nope, self.rope, self.vd = (c.num_attention_heads, c.qk_nope_head_dim,
                                                  c.qk_rope_head_dim, c.v_head_dim)
        self.hd = self.nope + self.rope
        self.q_a_proj = nn.Linear(c.hidden_size, c.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
        self.q_b_proj = nn.Linear(c.q_lora_rank, self.nh * self.hd, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(c.hidden_size, c.kv_lora_rank + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, self.nh * (self.nope + self.vd), bias=False)
        self.o_proj = nn.Linear(self.nh * self.vd, c.hidden_size, bias=False)
        self.kv_lora_rank = c.kv_lora_rank
        self._rotary = [rotary]

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        B, T, _ = x.shape
        rot = self._rotary[0]
        w = self.q_b_proj.weight
        if not self.q_rope:  # q's rope rows stay exactly 0 (see NO_Q_ROPE_NOTE)
            w = w * torch.ones(self.nh, self.hd, 1).index_fill_(1, torch.arange(self.nope, self.hd), 0.0).view(-1, 1)
        q = F.linear(self.q_a_layernorm(self.q_a_proj(x)), w).view(B, T, self.nh, self.hd).transpose(1, 2)
        kv_c, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(kv_c)).view(B, T, self.nh, self.nope + self.vd).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.vd], dim=-1)
        q = torch.cat([q[..., :self.nope], rot(q[..., self.nope:], positions)], dim=-1)
        k_pe = rot(k_pe.unsqueeze(1), positions).expand(B, self.nh, T, self.rope)  # one key head, shared
        return q, torch.cat([k_nope, k_pe], dim=-1), v


def _layer(c: DSConfig, rotary: InterleavedRotary, q_rope: bool) -> DecoderLayer:
    """DeepseekV2DecoderLayer with a dense MLP."""
    return DecoderLayer(c, rotary, MLAttention(c, rotary, q_rope))


class SharedHead(nn.Module):
    """Only the norm: the head is the trunk's ``lm_head`` (tied; written as a copy on save)."""

    def __init__(self, c: DSConfig):
        super().__init__()
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class MTPLayer(MTPBase):
    """DeepSeekMultiTokenPredictorLayer (checkpoint ``model.layers.<num_hidden_layers>.*``)."""

    def __init__(self, c: DSConfig, rotary: InterleavedRotary, q_rope: bool = True):
        super().__init__(c, rotary, MLAttention(c, rotary, q_rope))
        self.enorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hnorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.shared_head = SharedHead(c)

    def mtp_input(self, token_embeds, positions, prev_hidden):
        token_embeds = torch.where(positions.unsqueeze(-1) == 0, 0.0, token_embeds)
        return self.eh_proj(torch.cat([self.enorm(token_embeds), self.hnorm(prev_hidden)], dim=-1))

    def out_norm(self, x):
        return self.shared_head.norm(x)


class Trunk(nn.Module):
    def __init__(self, c: DSConfig, q_rope: bool = True):
        super().__init__()
        self.rotary = InterleavedRotary(c.qk_rope_head_dim, c.max_position_embeddings, c.rope_theta)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        n = c.num_hidden_layers
        self.layers = nn.ModuleList([_layer(c, self.rotary, q_rope) for _ in range(n)]
                                    + [MTPLayer(c, self.rotary, q_rope) for _ in range(c.num_nextn_predict_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.n_trunk = n

    @property
    def mtp_layers(self) -> list[MTPLayer]:  # the name the trainer and the decoding use
        return list(self.layers[self.n_trunk:])


class TinyDeepseekV3(TinyMiMo):
    """:class:`~kit.zoo.tiny.mimo.TinyMiMo`'s interface on the DeepSeek-V3 layout. State-dict names are the
    checkpoint's, minus the two tied MTP copies (:data:`TIED`)."""

    def __init__(self, c: DSConfig, q_rope: bool = True):
        nn.Module.__init__(self)
        self.mc = c
        self.q_rope = q_rope
        self.model = Trunk(c, q_rope)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def trunk_layers(self) -> list[nn.Module]:
        return list(self.model.layers[:self.model.n_trunk])

    def drafter_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """DeepseekV2Model returns the post-norm hidden state to the drafter."""
        return self.model.norm(hidden)

    def init_weights(self, seed: int) -> None:
        super().init_weights(seed)
        if not self.q_rope:
            with torch.no_grad():
                for layer in self.model.layers:
                    a = layer.self_attn
                    a.q_b_proj.weight.view(a.nh, a.hd, -1)[:, a.nope:] = 0.0

    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors: the state dict plus the tied copies, sorted by name."""
        sd = {k: v.detach().contiguous().clone() for k, v in self.state_dict().items()}
        n = self.mc.num_hidden_layers
        for copy, src in TIED.items():
            sd[copy.format(n=n)] = sd[src].clone()
        return dict(sorted(sd.items()))

    def from_checkpoint(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A checkpoint's tensors under this module's names (:meth:`untie`)."""
        return self.untie(sd, self.mc.num_hidden_layers)

    @classmethod
    def untie(cls, sd: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
        """A checkpoint's tensors without the tied copies (which must equal their sources)."""
        for copy, src in TIED.items():
            t = sd.pop(copy.format(n=n_layers))
            if not torch.equal(t, sd[src]):
                raise ValueError(f"{copy} differs from {src}: this model class needs them tied")
        return sd
