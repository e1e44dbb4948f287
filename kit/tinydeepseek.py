"""``tiny-deepseek-v3-trained``: the zoo's ``tiny-deepseek-v3`` (same config and tokenizer), trained.

The zoo model runs on seeded random weights, whose greedy logits are near-ties (top-1/top-2 margins
of about 0.002 nats), so a PP=2 + MTP cell can diverge from the PP=1 reference for reasons that
have nothing to do with speculation. This module trains the same architecture on the same corpus
approach as ``tiny-mimo`` (:mod:`kit.tinymodel`) so that its logits are peaked (and works around
the CPU rotary op, below).

* **Config and tokenizer** are copied unchanged from ``data/models/tiny-deepseek-v3`` (the zoo's
  byte-level BPE, ``<|endoftext|>`` = 0 is BOS/EOS, ``<|pad|>`` = 1, prompts get no BOS).
* **Corpus**: :func:`kit.tinymodel.corpus_files` (CPython stdlib sources, every 50th file held out),
  encoded with the zoo tokenizer as ``doc <|endoftext|> doc <|endoftext|> ...``.
* **Model** (:class:`TinyDeepseekV3`): a pure-PyTorch re-implementation of what vLLM 0.32 runs for
  ``DeepseekV3ForCausalLM`` with dense layers (``vllm/model_executor/models/deepseek_v2.py``,
  ``layers/mla.py``) and its ``DeepSeekMTP`` drafter (``deepseek_mtp.py``):

  - MLA attention: ``q = q_b_proj(q_a_layernorm(q_a_proj(x)))`` split per head into nope (32) and
    rope (64) parts; ``kv_a_proj_with_mqa(x)`` split into the latent (512, then
    ``kv_a_layernorm``) and one shared rope key (64); ``kv_b_proj(latent)`` gives per-head nope keys
    (32) and values (32). RoPE is GPT-J style (``is_neox_style=False``: adjacent pairs rotate; vLLM
    uses it for every DeepSeek MLA model, ``rope_interleave`` only matters to HF), theta 10000,
    default rope type, so the softmax scale is ``(32 + 64) ** -0.5`` with no yarn mscale.
  - Pre-norm residual decoder layers with a SiLU-gated MLP; ``model.norm``; untied ``lm_head``.
  - The trunk hands the MTP layer its hidden state **after** ``model.norm`` (``DeepseekV2Model``
    returns ``self.norm(hidden, residual)``).
  - MTP layer (``model.layers.4``): embedding of token t+1 zeroed at position 0, ``enorm`` of it and
    ``hnorm`` of the hidden, concatenated as ``[embedding, hidden]`` (this order, unlike MiMo's),
    ``eh_proj``, one decoder layer, ``shared_head.norm`` and the head. The normed output is also
    the "hidden" that the second draft step (``num_speculative_tokens`` > 1) feeds back in.
  - The MTP layer's ``embed_tokens`` and ``shared_head.head`` are the trunk's ``embed_tokens`` and
    ``lm_head`` (trained tied; the checkpoint stores identical copies, as DeepSeek-V3 does), so vLLM
    gives the same drafter whether it shares the target's tensors (PP=1) or loads its own (PP>1).

* **MLA rope needs the kit's ``cpu_rope_layout`` patch in vLLM.** vLLM 0.32's CPU rotary op
  (``RotaryEmbedding.forward_cpu`` -> ``ops.rotary_embedding``, what the eager engine dispatches to)
  mishandles the tensors ``layers/mla.py`` passes: the query ``q[..., qk_nope_head_dim:]``
  ([tokens, heads, 64], strides (384, 96, 1)) and the key ``k_pe`` ([tokens, 1, 64], a view into
  the fused q_a/kv_a output). Called directly on such tensors, it rotated only rows 0..T-1 of the
  query seen as [T * heads, 64] rows (row r with ``positions[r]``, other rows untouched), did not
  rotate key rows 1.. with their positions, and wrote into other rows of the fused buffer. So stock
  vLLM's MLA rope depends on how many tokens share a forward pass, and this model (correct rope) does
  not match stock vLLM; it matches vLLM with ``kit/patches/cpu_rope_layout.py`` (``parity --patches
  cpu_rope_layout``). ``--no-q-rope`` trains the workaround used before that patch existed: q's rope
  rows held at exactly 0, so every rope score is 0 whatever the rotation (position-free attention,
  causal mask only), which also matches stock vLLM (``NO_Q_ROPE_NOTE``).
* **Training** reuses :mod:`kit.tinymodel`: its token stream, loss (trunk + MTP + 0.5 x the second
  draft step, ``compute_losses``), evaluation, learning-rate schedule and the vLLM child runner.

Command line::

    python -m kit.tinydeepseek [--out DIR] [--seed N] [--steps N] [--quick] [--no-q-rope]   # train
    python -m kit.tinydeepseek parity [--model DIR] [--n 4] [--max-tokens 32] [--lock FILE] [--patches SEL]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import tinymodel as tm

REPO_ROOT = tm.REPO_ROOT
ZOO_DIR = REPO_ROOT / "data" / "models" / "tiny-deepseek-v3"
DEFAULT_OUT = REPO_ROOT / "data" / "models" / "tiny-deepseek-v3-trained"
# Copied from the zoo directory unchanged (the config and tokenizer stay the zoo's).
COPIED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "weights.json")
EOS_ID = 0  # zoo tokenizer: <|endoftext|> (also its BOS), no BOS added to prompts
# Checkpoint tensors that are copies of trunk tensors (MTP layer index filled in).
# NO_Q_ROPE_NOTE: see the module docstring (vLLM 0.32's CPU rotary op and MLA's strided q / k_pe).
TIED = {"model.layers.{n}.embed_tokens.weight": "model.embed_tokens.weight",
        "model.layers.{n}.shared_head.head.weight": "lm_head.weight"}


@dataclass
class DSConfig:
    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    q_lora_rank: int = 64
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 64
    v_head_dim: int = 32
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    num_nextn_predict_layers: int = 1

    @classmethod
    def from_hf(cls, c: dict) -> "DSConfig":
        rope = c.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default" or c.get("n_routed_experts") and \
                c.get("first_k_dense_replace", 0) <= c["num_hidden_layers"]:
            raise ValueError("only default RoPE and all-dense layers (incl. the MTP layer) are implemented")
        return cls(**{k: type(getattr(cls, k))(c[k]) for k in cls.__dataclass_fields__
                      if k in c and k != "rope_theta"},
                   rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))))


# --------------------------------------------------------------------------------------------
# Model (pure PyTorch; the computation vLLM runs)
# --------------------------------------------------------------------------------------------


class InterleavedRotary(tm.Rotary):
    """vLLM's RoPE with ``is_neox_style=False`` (GPT-J style): pairs (2i, 2i+1) rotate by freq i."""

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos = self.cos[positions].unsqueeze(-3)  # [B, 1, T, D/2]
        sin = self.sin[positions].unsqueeze(-3)
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


class MLAttention(tm.Attention):
    """Multi-head latent attention with q LoRA, computed in the plain (non-absorbed) form.
    ``forward``/``forward_chain``/``out`` are :class:`kit.tinymodel.Attention`'s; only the
    projections differ. Keys are [nope | roped shared rope key], ``hd`` the q/k head dim (96)."""

    def __init__(self, c: DSConfig, rotary: InterleavedRotary, q_rope: bool = True):
        nn.Module.__init__(self)
        self.q_rope = q_rope
        self.nh, self.nope, self.rope, self.vd = (c.num_attention_heads, c.qk_nope_head_dim,
                                                  c.qk_rope_head_dim, c.v_head_dim)
        self.hd = self.nope + self.rope
        self.q_a_proj = nn.Linear(c.hidden_size, c.q_lora_rank, bias=False)
        self.q_a_layernorm = tm.RMSNorm(c.q_lora_rank, c.rms_norm_eps)
        self.q_b_proj = nn.Linear(c.q_lora_rank, self.nh * self.hd, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(c.hidden_size, c.kv_lora_rank + self.rope, bias=False)
        self.kv_a_layernorm = tm.RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
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


class DecoderLayer(tm.DecoderLayer):
    """DeepseekV2DecoderLayer with a dense MLP (forward / forward_chain inherited)."""

    def __init__(self, c: DSConfig, rotary: InterleavedRotary, q_rope: bool = True):
        nn.Module.__init__(self)
        self.self_attn = MLAttention(c, rotary, q_rope)
        self.mlp = tm.MLP(c)
        self.input_layernorm = tm.RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = tm.RMSNorm(c.hidden_size, c.rms_norm_eps)


class SharedHead(nn.Module):
    """Only the norm: the head is the trunk's ``lm_head`` (tied; written as a copy on save)."""

    def __init__(self, c: DSConfig):
        super().__init__()
        self.norm = tm.RMSNorm(c.hidden_size, c.rms_norm_eps)


class MTPLayer(DecoderLayer):
    """DeepSeekMultiTokenPredictorLayer (checkpoint ``model.layers.<num_hidden_layers>.*``)."""

    def __init__(self, c: DSConfig, rotary: InterleavedRotary, q_rope: bool = True):
        super().__init__(c, rotary, q_rope)
        self.enorm = tm.RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hnorm = tm.RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.shared_head = SharedHead(c)

    def mtp_input(self, token_embeds, positions, prev_hidden):
        token_embeds = torch.where(positions.unsqueeze(-1) == 0, 0.0, token_embeds)
        return self.eh_proj(torch.cat([self.enorm(token_embeds), self.hnorm(prev_hidden)], dim=-1))

    def mtp_forward(self, token_embeds, positions, prev_hidden, kv_out: list | None = None):
        x = self.mtp_input(token_embeds, positions, prev_hidden)
        return self.shared_head.norm(DecoderLayer.forward(self, x, positions, kv_out))

    def mtp_forward_chain(self, token_embeds, positions, prev_hidden, k1, v1):
        x = self.mtp_input(token_embeds, positions, prev_hidden)
        return self.shared_head.norm(DecoderLayer.forward_chain(self, x, positions, k1, v1))


class Trunk(nn.Module):
    def __init__(self, c: DSConfig, q_rope: bool = True):
        super().__init__()
        self.rotary = InterleavedRotary(c.qk_rope_head_dim, c.max_position_embeddings, c.rope_theta)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        n = c.num_hidden_layers
        self.layers = nn.ModuleList([DecoderLayer(c, self.rotary, q_rope) for _ in range(n)]
                                    + [MTPLayer(c, self.rotary, q_rope) for _ in range(c.num_nextn_predict_layers)])
        self.norm = tm.RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.n_trunk = n

    @property
    def mtp_layers(self) -> list[MTPLayer]:  # the name kit.tinymodel's losses use
        return list(self.layers[self.n_trunk:])


class TinyDeepseekV3(nn.Module):
    """Same interface as :class:`kit.tinymodel.TinyMiMo` (``hidden``, ``logits``, ``mtp_hidden``,
    ``mtp_logits``), so :func:`kit.tinymodel.compute_losses` / ``evaluate`` / ``greedy_generate``
    apply. State-dict names are the checkpoint's, minus the two tied MTP copies (:data:`TIED`)."""

    def __init__(self, c: DSConfig, q_rope: bool = True):
        super().__init__()
        self.mc = c
        self.q_rope = q_rope
        self.model = Trunk(c, q_rope)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def hidden(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Last trunk layer's output before ``model.norm``."""
        if positions is None:
            positions = torch.arange(input_ids.shape[-1])
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers[:self.model.n_trunk]:
            x = layer(x, positions)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model.norm(hidden))

    def mtp_hidden(self, hidden: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                   kv_out: list | None = None) -> torch.Tensor:
        """MTP output at position t (after shared_head.norm) from the post-norm trunk hidden h_t
        (what DeepseekV2Model returns to the drafter) and token t+1."""
        return self.model.mtp_layers[0].mtp_forward(self.model.embed_tokens(next_ids), positions,
                                                    self.model.norm(hidden), kv_out)

    def mtp_logits(self, mtp_hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(mtp_hidden)

    def init_weights(self, seed: int) -> None:
        tm.init_normal_(self, seed, self.mc.num_hidden_layers + self.mc.num_nextn_predict_layers)
        if not self.q_rope:
            with torch.no_grad():
                for layer in self.model.layers:
                    a = layer.self_attn
                    a.q_b_proj.weight.view(a.nh, a.hd, -1)[:, a.nope:] = 0.0

    # -- checkpoint ---------------------------------------------------------------------------
    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        sd = {k: v.detach().contiguous().clone() for k, v in self.state_dict().items()}
        n = self.mc.num_hidden_layers
        for copy, src in TIED.items():
            sd[copy.format(n=n)] = sd[src].clone()
        return dict(sorted(sd.items()))


def load_model(model_dir: Path | str) -> TinyDeepseekV3:
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    model = TinyDeepseekV3(DSConfig.from_hf(json.loads((model_dir / "config.json").read_text())))
    sd = load_file(str(model_dir / "model.safetensors"))
    for copy, src in TIED.items():
        t = sd.pop(copy.format(n=model.mc.num_hidden_layers))
        if not torch.equal(t, sd[src]):
            raise ValueError(f"{copy} differs from {src}: this model class needs them tied")
    model.load_state_dict(sd, strict=True)
    model.eval()
    return model


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


class EosStream(tm.TokenStream):
    """``doc <|endoftext|> doc <|endoftext|> ...``; windows may start at a document's first token
    (prompts get no BOS with the zoo tokenizer)."""

    def __init__(self, docs: list[list[int]]):
        ids, starts = [], []
        for d in docs:
            starts.append(len(ids))
            ids.extend(d)
            ids.append(EOS_ID)
        self.ids = torch.tensor(ids, dtype=torch.long)
        self.starts = torch.tensor(starts, dtype=torch.long)


def train_config(quick: bool = False, seed: int = 0) -> tm.TrainConfig:
    if quick:
        return tm.TrainConfig(seed=seed, steps=3, batch_size=2, seq_len=32, warmup_steps=1, log_every=1,
                              max_corpus_files=8, eval_batches=1, model=DSConfig())
    return tm.TrainConfig(seed=seed, steps=700, batch_size=8, seq_len=256, warmup_steps=50,
                          log_every=10, eval_batches=8, model=DSConfig())


def train(tc: tm.TrainConfig, out: Path, zoo_dir: Path = ZOO_DIR, command: str | None = None, log=print,
          q_rope: bool = True) -> dict:
    from safetensors.torch import save_file
    from tokenizers import Tokenizer

    t_start = time.time()
    os.environ.setdefault("RAYON_NUM_THREADS", str(tc.threads))
    torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)
    torch.use_deterministic_algorithms(True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in COPIED_FILES:
        shutil.copyfile(zoo_dir / f, out / f)
    c = tc.model = DSConfig.from_hf(json.loads((zoo_dir / "config.json").read_text()))

    train_files, val_files, train_texts, val_texts, corpus_sha256 = tm.read_corpus(tc.max_corpus_files)
    texts = {"train": train_texts, "val": val_texts}
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    streams = {k: EosStream([e.ids for e in tok.encode_batch(v, add_special_tokens=False)]) for k, v in texts.items()}
    log(f"corpus: {len(train_files)} train files, {len(streams['train'])} tokens; "
        f"{len(val_files)} val files, {len(streams['val'])} tokens")

    model = TinyDeepseekV3(c, q_rope=q_rope)
    model.init_weights(tc.seed)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters")
    t_train = time.time()
    history, rec, _ = tm.train_steps(model, streams["train"], tc, log)
    train_seconds = time.time() - t_train
    ev = tm.evaluate(model, streams["val"], tc)
    log("eval: " + json.dumps(ev))

    st_path = out / "model.safetensors"
    save_file(model.checkpoint_state_dict(), str(st_path), metadata={"format": "pt"})
    os.chmod(st_path, 0o644)
    manifest = {
        "name": out.name,
        "command": command,
        "based_on": "data/models/tiny-deepseek-v3 (config.json, tokenizer and weights.json copied unchanged)",
        "seed": tc.seed,
        "steps": tc.steps,
        "train_config": {k: v for k, v in asdict(tc).items() if k != "model"},
        "model_config": asdict(c),
        "num_parameters": n_params,
        "q_rope": q_rope,
        "tied_copies": {k.format(n=c.num_hidden_layers): v for k, v in TIED.items()},
        "corpus": {
            "source": "CPython standard library *.py files (kit.tinymodel.corpus_files), zoo tokenizer, "
                      "documents joined as 'doc <|endoftext|>'",
            "python_version": sys.version.split()[0],
            "train_files": len(train_files), "train_tokens": len(streams["train"]),
            "val_files": len(val_files), "val_tokens": len(streams["val"]),
            "sha256": corpus_sha256,
        },
        "tokens_seen": tc.steps * tc.batch_size * tc.seq_len,
        **{f"final_{k}_loss": v for k, v in rec.items()},
        **ev,
        "loss_history": history,
        "model_safetensors_sha256": tm._sha256(st_path),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "train_seconds": round(train_seconds, 1),
        "wall_seconds": round(time.time() - t_start, 1),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {out} in {manifest['wall_seconds']}s; sha256 {manifest['model_safetensors_sha256'][:16]}")
    return manifest


# --------------------------------------------------------------------------------------------
# Parity with vLLM (PP=1, no speculation)
# --------------------------------------------------------------------------------------------


def parity_check(model_dir: Path | str = DEFAULT_OUT, prompts: Sequence[str] | None = None,
                 max_tokens: int = 32, timeout: float = 900, lock: str | None = None,
                 patches: str | None = None) -> dict:
    """Greedy tokens of :class:`TinyDeepseekV3` (full recompute, float32) vs vLLM (PP=1, no spec,
    float32, eager) on vLLM's prompt token ids. ``patches=None``: stock vLLM (no plugins); else the
    ``KIT_PATCHES`` selection to load (e.g. ``cpu_rope_layout``, which MLA's rope needs on CPU)."""
    from tokenizers import Tokenizer

    model_dir = Path(model_dir).resolve()
    prompts = list(prompts or tm.read_prompts(tm.PROMPTS_DIR / "default.jsonl")[:4])
    job = {"model": str(model_dir), "prompts": prompts, "max_tokens": max_tokens, "logprobs": 2}
    if patches:
        job.update(stock=False, env={"KIT_PATCHES": patches})
    res = tm.run_vllm_job(job, timeout=timeout, lock=lock)
    model = load_model(model_dir)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    per, ok, max_lp_diff = [], True, 0.0
    for o in res["outputs"]:
        ref = tm.greedy_generate(model, o["prompt_token_ids"], max_tokens, eos_id=EOS_ID)
        same = ref["tokens"] == o["token_ids"]
        first_div = None if same else next(
            (i for i, (a, b) in enumerate(zip(ref["tokens"], o["token_ids"])) if a != b),
            min(len(ref["tokens"]), len(o["token_ids"])))
        for i, (t, lps) in enumerate(zip(o["token_ids"], o.get("logprobs") or [])):
            if first_div is not None and i >= first_div:
                break
            if str(t) in lps and ref["top2"][i][0][0] == t:
                max_lp_diff = max(max_lp_diff, abs(lps[str(t)] - ref["top2"][i][0][1]))
        item = {"prompt": o["prompt"], "prompt_tokens": len(o["prompt_token_ids"]),
                "tokenization_matches": tok.encode(o["prompt"]).ids == o["prompt_token_ids"],
                "vllm_tokens": o["token_ids"], "torch_tokens": ref["tokens"], "identical": same,
                "first_divergence": first_div,
                "min_top1_top2_margin": min((a[1] - b[1] for a, b in ref["top2"]), default=None)}
        ok = ok and same and item["tokenization_matches"]
        per.append(item)
    return {"ok": ok, "model": str(model_dir), "kit_patches": patches, "max_tokens": max_tokens, "n_prompts": len(prompts),
            "max_abs_logprob_diff": max_lp_diff, "vllm_start_seconds": res["start_seconds"], "prompts": per}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "parity":
        ap = argparse.ArgumentParser(prog="kit.tinydeepseek parity")
        ap.add_argument("--model", default=str(DEFAULT_OUT))
        ap.add_argument("--prompts", default=str(tm.PROMPTS_DIR / "default.jsonl"))
        ap.add_argument("--n", type=int, default=4)
        ap.add_argument("--max-tokens", type=int, default=32)
        ap.add_argument("--lock", default=None, help="flock this file around the vLLM run")
        ap.add_argument("--json", default=None, help="also write the result here")
        ap.add_argument("--patches", default=None,
                        help="KIT_PATCHES selection to load in vLLM (default: none, stock vLLM); "
                             "cpu_rope_layout for a model trained with q's rope")
        a = ap.parse_args(argv[1:])
        res = parity_check(a.model, tm.read_prompts(a.prompts)[:a.n], a.max_tokens, lock=a.lock,
                           patches=a.patches)
        text = json.dumps(res, indent=2)
        if a.json:
            Path(a.json).write_text(text + "\n")
        print(text)
        return 0 if res["ok"] else 1
    from .command import Parser  # one-line errors, exit 2
    from .validate import arg_count, arg_seed

    ap = Parser(prog="kit.tinydeepseek", description="Train tiny-deepseek-v3-trained (CPU, offline).")
    ap.add_argument("--out", default=str(DEFAULT_OUT.relative_to(REPO_ROOT)))
    ap.add_argument("--seed", type=arg_seed, default=0)
    ap.add_argument("--steps", type=arg_count, default=None)
    ap.add_argument("--quick", action="store_true", help="few-step smoke run on a small corpus (tests)")
    ap.add_argument("--no-q-rope", dest="q_rope", action="store_false",
                    help="hold q's rope rows at 0 (matches stock vLLM's CPU MLA rope; see NO_Q_ROPE_NOTE)")
    a = ap.parse_args(argv)
    tc = train_config(a.quick, a.seed)
    if a.steps is not None:
        tc.steps = a.steps
    out = Path(a.out) if Path(a.out).is_absolute() else REPO_ROOT / a.out
    m = train(tc, out, command=("python -m kit.tinydeepseek " + " ".join(argv)).strip(), q_rope=a.q_rope)
    print(json.dumps({k: m[k] for k in m if k.startswith(("final_", "val_"))}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
