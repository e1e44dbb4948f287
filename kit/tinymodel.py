"""``tiny-mimo``: a tiny trained MiMo-style model with one MTP layer, built offline.

Everything here is deterministic and needs no download:

* **Corpus**: the CPython standard library source shipped with the running Python
  (``sysconfig.get_paths()["stdlib"]``), sorted ``*.py`` files, without test suites, data tables
  and vendored packages (see :func:`corpus_files`). Every 50th file is held out for validation.
* **Tokenizer**: HF ``tokenizers`` byte-level BPE trained on the training files
  (:func:`build_tokenizer`), saved so that ``AutoTokenizer`` (and so vLLM) loads it from the model
  directory. Prompts are encoded as ``<|bos|> text``; ``<|endoftext|>`` ends a document.
* **Model** (:class:`TinyMiMo`): a pure-PyTorch re-implementation of exactly what vLLM 0.32 runs for
  ``MiMoForCausalLM`` (``vllm/model_executor/models/{qwen2,mimo,mimo_mtp}.py``):
  Qwen2 decoder layers (RMSNorm, q/k/v projections with bias, neox-style RoPE, SiLU-gated MLP,
  pre-norm residuals), a final RMSNorm and an untied LM head. The MTP layer
  (``MiMoMultiTokenPredictorLayer``) takes, at position ``t``, the trunk's last hidden state ``h_t``
  *before* the final norm (``MiMoModel.forward`` returns ``hidden_states + residual``; the norm is
  applied in ``compute_logits``) and the embedding of token ``t+1`` (zeroed at position 0, as vLLM
  does), normalises them (``hidden_layernorm``, ``token_layernorm``), concatenates
  ``[hidden, token]``, projects with ``input_proj``, runs one Qwen2 decoder block, applies
  ``final_layernorm`` and the shared LM head, and is trained to predict token ``t+2``.
  With ``num_speculative_tokens > 1`` vLLM re-applies the same layer to its own (final-normed)
  output and its own draft token; the trainer also trains that second application ("chain" loss),
  with the attention pattern vLLM's drafter KV cache produces.
* **Checkpoint names** follow the HF MiMo layout: trunk under ``model.`` / ``lm_head``, the MTP
  layer as ``model.mtp_layers.0.{token_layernorm,hidden_layernorm,input_proj,final_layernorm}``
  plus the decoder block's own names directly under ``model.mtp_layers.0.`` (vLLM's ``MiMoMTP``
  maps them onto ``mtp_block`` at load time).

Command line (``python -m kit.tinymodel`` or ``kit train-tiny``)::

    python -m kit.tinymodel [--out DIR] [--seed N] [--steps N] [--quick]     # train
    python -m kit.tinymodel parity [--model DIR] [--prompts FILE] [--n 4] [--max-tokens 32]
    python -m kit.tinymodel acceptance [--model DIR] [--prompts FILE] [--k 1 2 3]

``parity`` and ``acceptance`` start vLLM (CPU) in a child process that is always ended with its
whole process group.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "data" / "models" / "tiny-mimo"
PROMPTS_DIR = REPO_ROOT / "data" / "prompts"

BOS = "<|bos|>"
EOS = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (BOS, EOS, PAD)  # ids 0, 1, 2
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2

# Directories (any path component) left out of the corpus: test suites, data tables,
# vendored wheels, IDLE/turtle demos and the 2to3 grammar fixtures.
EXCLUDED_DIRS = frozenset({
    "test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
    "encodings", "pydoc_data", "ensurepip", "idlelib", "turtledemo", "lib2to3",
})
MAX_FILE_BYTES = 300_000
# transformers' Qwen2Tokenizer pre-tokenizer split (models/qwen2/tokenization_qwen2.py)
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
VAL_EVERY = 50  # every 50th corpus file is validation text


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 2  # head_dim 64 (the CPU attention backend supports 32..512)
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    num_nextn_predict_layers: int = 1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass
class TrainConfig:
    seed: int = 0
    steps: int = 700
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 50
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    mtp_weight: float = 1.0
    chain_weight: float = 0.5
    # Optional extra drafter loss against the trunk's own distribution (see compute_losses).
    # 0 for the committed tiny-mimo; a run with 1.0 was started but not completed or evaluated.
    distill_weight: float = 0.0
    doc_start_fraction: float = 0.25
    # One intra-op thread: on this 2-core machine, shared with other CPU-heavy processes (vLLM runs),
    # 2 OpenMP threads were measured 3-5x SLOWER per step than 1 (oversubscribed OpenMP barriers).
    # The thread count can change float summation order, so it is part of the reproducible recipe.
    threads: int = 1
    log_every: int = 10
    max_corpus_files: int | None = None
    eval_batches: int = 8
    model: ModelConfig = field(default_factory=ModelConfig)


def quick_config(seed: int = 0) -> TrainConfig:
    """A few-step smoke configuration (tests): small corpus, small vocab, tiny batches."""
    return TrainConfig(
        seed=seed, steps=3, batch_size=4, seq_len=64, warmup_steps=1, log_every=1,
        max_corpus_files=24, eval_batches=1,
        model=ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                          num_attention_heads=2, num_key_value_heads=1),
    )


def hf_config(mc: ModelConfig) -> dict:
    """The ``config.json`` that vLLM 0.32 loads as ``MiMoForCausalLM`` (plus its MTP drafter)."""
    return {
        "architectures": ["MiMoForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": mc.vocab_size,
        "hidden_size": mc.hidden_size,
        "intermediate_size": mc.intermediate_size,
        "num_hidden_layers": mc.num_hidden_layers,
        "num_attention_heads": mc.num_attention_heads,
        "num_key_value_heads": mc.num_key_value_heads,
        "head_dim": mc.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": mc.max_position_embeddings,
        "rms_norm_eps": mc.rms_norm_eps,
        "rope_theta": mc.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": mc.rope_theta},
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": mc.num_hidden_layers,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": mc.num_nextn_predict_layers,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "use_cache": True,
        "torch_dtype": "float32",
        "dtype": "float32",
    }


def model_config_from_hf(cfg: dict) -> ModelConfig:
    rope = cfg.get("rope_parameters") or {}
    return ModelConfig(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        num_attention_heads=int(cfg["num_attention_heads"]),
        num_key_value_heads=int(cfg.get("num_key_value_heads", cfg["num_attention_heads"])),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        num_nextn_predict_layers=int(cfg.get("num_nextn_predict_layers", 1)),
    )


# --------------------------------------------------------------------------------------------
# Corpus and tokenizer
# --------------------------------------------------------------------------------------------


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def corpus_files(root: Path | None = None, max_files: int | None = None) -> list[Path]:
    """Sorted, deterministic list of stdlib ``*.py`` files used as corpus."""
    root = Path(root) if root else stdlib_root()
    out = []
    for f in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = f.relative_to(root).parts
        if any(p in EXCLUDED_DIRS or p.startswith("test") for p in rel[:-1]):
            continue
        if rel[-1].startswith("test_") or rel[-1] == "__phello__":
            continue
        if not f.is_file() or f.stat().st_size > MAX_FILE_BYTES or f.stat().st_size == 0:
            continue
        out.append(f)
    if max_files is not None:
        out = out[:max_files]
    return out


def split_files(files: Sequence[Path]) -> tuple[list[Path], list[Path]]:
    train = [f for i, f in enumerate(files) if i % VAL_EVERY != VAL_EVERY - 1]
    val = [f for i, f in enumerate(files) if i % VAL_EVERY == VAL_EVERY - 1]
    if not val and len(files) > 1:  # small (quick) corpora: hold out the last file
        train, val = list(files[:-1]), [files[-1]]
    return train, val


def read_text(f: Path) -> str:
    return f.read_bytes().decode("utf-8", errors="replace")


def read_corpus(max_files: int | None = None) -> tuple[list[Path], list[Path], list[str], list[str], str]:
    """Train files, validation files, their texts, and one sha256 over every file's path and text."""
    root = stdlib_root()
    train_files, val_files = split_files(corpus_files(root, max_files))
    train_texts = [read_text(f) for f in train_files]
    val_texts = [read_text(f) for f in val_files]
    h = hashlib.sha256()
    for f, t in zip(train_files + val_files, train_texts + val_texts):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + t.encode() + b"\0")
    return train_files, val_files, train_texts, val_texts, h.hexdigest()


def build_tokenizer(texts: Iterable[str], vocab_size: int):
    """Byte-level BPE (GPT-2 style pre-tokenizer), deterministic for a given text sequence."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    # The same normalizer / pre-tokenizer / decoder that transformers' Qwen2Tokenizer builds: with
    # ``model_type: qwen2`` transformers 5 (and so vLLM) may load the vocab and merges into that class
    # instead of using tokenizer.json as is, and both paths must give the same ids.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(BOS) == BOS_ID and tok.token_to_id(EOS) == EOS_ID
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)]
    )
    return tok


def save_tokenizer(tok, out: Path, max_len: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
    }, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "do_sample": False,
    }, indent=2) + "\n")


def encode_prompt(tokenizer_json: Path | str, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_json)).encode(text).ids


# --------------------------------------------------------------------------------------------
# Model (pure PyTorch, the computation vLLM runs)
# --------------------------------------------------------------------------------------------

import torch  # noqa: E402  (kept below the docs/helpers that do not need it)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


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

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [B, H, T, D]; positions: [B, T] or [T]
        cos = self.cos[positions].unsqueeze(-3)  # [B, 1, T, D/2]
        sin = self.sin[positions].unsqueeze(-3)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, mc: ModelConfig, rotary: Rotary):
        super().__init__()
        self.nh, self.nkv, self.hd = mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim
        h = mc.hidden_size
        self.q_proj = nn.Linear(h, self.nh * self.hd, bias=True)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=True)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=True)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self._rotary = [rotary]  # shared, not a submodule (keeps state_dict names clean)

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

    def out(self, o: torch.Tensor) -> torch.Tensor:
        B, H, T, D = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * D))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_out: list | None = None):
        q, k, v = self.qkv(x, positions)
        if kv_out is not None:
            kv_out.append((k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.hd ** -0.5)
        return self.out(o)

    def forward_chain(self, x: torch.Tensor, positions: torch.Tensor, k1: torch.Tensor,
                      v1: torch.Tensor) -> torch.Tensor:
        """Second drafter application: slot i (position ``positions[i]``, one past first-pass
        position i) attends to the first pass's keys at positions 0..i and to its own key,
        which is what the drafter KV cache holds at draft step 2 in vLLM."""
        q, k2, v2 = self.qkv(x, positions)
        T = x.shape[1]
        scale = self.hd ** -0.5
        s1 = torch.matmul(q, k1.transpose(-1, -2)) * scale  # [B, H, T, T]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        s1 = s1.masked_fill(~mask, float("-inf"))
        s2 = (q * k2).sum(-1, keepdim=True) * scale  # [B, H, T, 1]
        p = torch.softmax(torch.cat([s1, s2], dim=-1), dim=-1)
        o = torch.matmul(p[..., :T], v1) + p[..., T:] * v2
        return self.out(o)


class MLP(nn.Module):
    def __init__(self, mc: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(mc.hidden_size, mc.intermediate_size, bias=False)
        self.up_proj = nn.Linear(mc.hidden_size, mc.intermediate_size, bias=False)
        self.down_proj = nn.Linear(mc.intermediate_size, mc.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Qwen2DecoderLayer: pre-norm attention and MLP, residual adds."""

    def __init__(self, mc: ModelConfig, rotary: Rotary):
        super().__init__()
        self.self_attn = Attention(mc, rotary)
        self.mlp = MLP(mc)
        self.input_layernorm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)

    def forward(self, x, positions, kv_out: list | None = None):
        h = x + self.self_attn(self.input_layernorm(x), positions, kv_out)
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward_chain(self, x, positions, k1, v1):
        h = x + self.self_attn.forward_chain(self.input_layernorm(x), positions, k1, v1)
        return h + self.mlp(self.post_attention_layernorm(h))


class MTPLayer(DecoderLayer):
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

    def mtp_forward(self, token_embeds, positions, prev_hidden, kv_out: list | None = None):
        x = self.mtp_input(token_embeds, positions, prev_hidden)
        return self.final_layernorm(DecoderLayer.forward(self, x, positions, kv_out))

    def mtp_forward_chain(self, token_embeds, positions, prev_hidden, k1, v1):
        x = self.mtp_input(token_embeds, positions, prev_hidden)
        return self.final_layernorm(DecoderLayer.forward_chain(self, x, positions, k1, v1))


class Trunk(nn.Module):
    def __init__(self, mc: ModelConfig):
        super().__init__()
        self.rotary = Rotary(mc.head_dim, mc.max_position_embeddings, mc.rope_theta)
        self.embed_tokens = nn.Embedding(mc.vocab_size, mc.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(mc, self.rotary) for _ in range(mc.num_hidden_layers)])
        self.norm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)
        self.mtp_layers = nn.ModuleList([MTPLayer(mc, self.rotary) for _ in range(mc.num_nextn_predict_layers)])


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


class TinyMiMo(nn.Module):
    """State-dict names are exactly the checkpoint's (``model.*``, ``lm_head.weight``)."""

    def __init__(self, mc: ModelConfig):
        super().__init__()
        self.mc = mc
        self.model = Trunk(mc)
        self.lm_head = nn.Linear(mc.hidden_size, mc.vocab_size, bias=False)

    # -- trunk --------------------------------------------------------------------------------
    def hidden(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Last-layer hidden state BEFORE the final norm (what vLLM hands the MTP drafter)."""
        if positions is None:
            positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, positions)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model.norm(hidden))

    # -- MTP ----------------------------------------------------------------------------------
    def mtp_hidden(self, hidden: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                   kv_out: list | None = None) -> torch.Tensor:
        """MTP output at position t from h_t and token t+1 (post final_layernorm)."""
        return self.model.mtp_layers[0].mtp_forward(self.model.embed_tokens(next_ids), positions, hidden, kv_out)

    def mtp_logits(self, mtp_hidden: torch.Tensor) -> torch.Tensor:
        # MiMoMTP.compute_logits: the shared LM head on the final_layernorm output (no model.norm)
        return self.lm_head(mtp_hidden)

    def init_weights(self, seed: int) -> None:
        init_normal_(self, seed, self.mc.num_hidden_layers + self.mc.num_nextn_predict_layers)


def expected_tensor_names(mc: ModelConfig) -> list[str]:
    return sorted(TinyMiMo(mc).state_dict().keys())


def load_model(model_dir: Path | str) -> TinyMiMo:
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    mc = model_config_from_hf(json.loads((model_dir / "config.json").read_text()))
    model = TinyMiMo(mc)
    sd = load_file(str(model_dir / "model.safetensors"))
    model.load_state_dict(sd, strict=True)
    model.eval()
    return model


# --------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------


def compute_losses(model: TinyMiMo, batch: torch.Tensor, chain: bool = True,
                   distill: bool = False) -> dict[str, torch.Tensor]:
    """batch: [B, T+3] token windows. Position t (0 <= t < T):
    trunk predicts x[t+1] from x[..t]; MTP predicts x[t+2] from (h_t, x[t+1]);
    chain (second drafter application at position t+1) predicts x[t+3] from (mtp_out_t, x[t+2]).
    ``distill`` adds, for the MTP and chain predictions, a cross-entropy against the trunk's own
    (detached) distribution for the same token (trunk logits one / two positions later): the
    drafter is scored on agreeing with the trunk, which is what speculative acceptance measures."""
    T = batch.shape[1] - 3
    pos = torch.arange(T, device=batch.device)
    inp = batch[:, :T]
    h = model.hidden(inp, pos)
    V = model.mc.vocab_size
    trunk_logits = model.logits(h)
    trunk = F.cross_entropy(trunk_logits.reshape(-1, V), batch[:, 1:T + 1].reshape(-1))
    kv: list = []
    m = model.mtp_hidden(h, batch[:, 1:T + 1], pos, kv_out=kv)
    mtp_logits = model.mtp_logits(m)
    mtp = F.cross_entropy(mtp_logits.reshape(-1, V), batch[:, 2:T + 2].reshape(-1))
    out = {"trunk": trunk, "mtp": mtp}
    teacher = torch.softmax(trunk_logits.detach(), dim=-1) if distill else None
    if distill:
        out["mtp_distill"] = F.cross_entropy(mtp_logits[:, :T - 1].reshape(-1, V), teacher[:, 1:].reshape(-1, V))
    if chain:
        k1, v1 = kv[0]
        layer = model.model.mtp_layers[0]
        m2 = layer.mtp_forward_chain(model.model.embed_tokens(batch[:, 2:T + 2]), pos + 1, m, k1, v1)
        chain_logits = model.mtp_logits(m2)
        out["chain"] = F.cross_entropy(chain_logits.reshape(-1, V), batch[:, 3:T + 3].reshape(-1))
        if distill:
            out["chain_distill"] = F.cross_entropy(chain_logits[:, :T - 2].reshape(-1, V),
                                                   teacher[:, 2:].reshape(-1, V))
    return out


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


class TokenStream:
    """All documents as one stream ``<|bos|> doc <|endoftext|> <|bos|> doc ...``."""

    def __init__(self, docs: list[list[int]]):
        ids, starts = [], []
        for d in docs:
            starts.append(len(ids))
            ids.append(BOS_ID)
            ids.extend(d)
            ids.append(EOS_ID)
        self.ids = torch.tensor(ids, dtype=torch.long)
        self.starts = torch.tensor(starts, dtype=torch.long)

    def __len__(self):
        return int(self.ids.numel())

    def batch(self, g: torch.Generator, batch_size: int, width: int, doc_start_fraction: float) -> torch.Tensor:
        if len(self) <= width:  # tiny validation streams (quick runs): repeat the stream
            reps = width // len(self) + 2
            self.ids = self.ids.repeat(reps)
            self.starts = torch.cat([self.starts + i * (len(self) // reps) for i in range(reps)])
        n = len(self) - width
        offs = torch.randint(0, n, (batch_size,), generator=g)
        use_start = torch.rand(batch_size, generator=g) < doc_start_fraction
        valid = self.starts[self.starts < n]
        pick = valid[torch.randint(0, len(valid), (batch_size,), generator=g)]
        offs = torch.where(use_start, pick, offs)
        idx = offs.unsqueeze(1) + torch.arange(width).unsqueeze(0)
        return self.ids[idx]


def lr_at(step: int, tc: TrainConfig) -> float:
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    t = (step - tc.warmup_steps) / max(1, tc.steps - tc.warmup_steps)
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


@torch.no_grad()
def evaluate(model: TinyMiMo, stream: TokenStream, tc: TrainConfig) -> dict:
    """Validation losses, and how often the MTP argmax equals the trunk's argmax one step later
    (teacher-forced proxy for the k=1 acceptance rate)."""
    model.eval()
    dev = next(model.parameters()).device
    g = torch.Generator().manual_seed(tc.seed + 12345)
    tot: dict[str, float] = {}
    agree = n = 0
    for _ in range(tc.eval_batches):
        b = stream.batch(g, tc.batch_size, tc.seq_len + 3, 0.0).to(dev)
        for k, v in compute_losses(model, b, distill=True).items():
            tot[k] = tot.get(k, 0.0) + float(v)
        T = tc.seq_len
        pos = torch.arange(T, device=dev)
        h = model.hidden(b[:, :T], pos)
        trunk_next = model.logits(h).argmax(-1)  # prediction of x[t+1]
        m = model.mtp_logits(model.mtp_hidden(h, b[:, 1:T + 1], pos)).argmax(-1)  # of x[t+2]
        agree += int((m[:, :-1] == trunk_next[:, 1:]).sum())
        n += m[:, :-1].numel()
    model.train()
    out = {f"val_{k}_loss": v / tc.eval_batches for k, v in tot.items()}
    out["val_mtp_trunk_argmax_agreement"] = agree / max(1, n)
    return out


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def train_steps(model: nn.Module, stream: "TokenStream", tc: TrainConfig, log=print,
                autocast_dtype: torch.dtype | None = None) -> tuple[list, dict, dict]:
    """The optimisation loop both tiny models train with (tiny-mimo here, tiny-deepseek-v3 in kit.tinydeepseek).

    AdamW (weight decay on 2-D tensors only), :func:`lr_at`'s schedule, the joint loss of
    :func:`compute_losses` (trunk + MTP + chain, + distillation when configured), gradient clipping; batches
    from ``stream`` with a generator seeded from ``tc.seed``. Returns the logged history, the last step's
    losses and their exponential moving average. The order of every random draw and update is fixed, so a
    given config trains bitwise-identical weights (on CPU; see kit.pymimo for GPU runs). Batches go to the
    model's device; ``autocast_dtype`` (e.g. bfloat16 on a GPU) runs the losses under ``torch.autocast``.
    """
    decay = [p for n, p in model.named_parameters() if p.ndim == 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tc.lr, betas=(0.9, 0.95), eps=1e-8, fused=True,
    )
    g = torch.Generator().manual_seed(tc.seed)
    dev = next(model.parameters()).device
    amp = (torch.autocast(dev.type, dtype=autocast_dtype) if autocast_dtype is not None
           else contextlib.nullcontext())
    width = tc.seq_len + 3
    history = []
    model.train()
    t_train = time.time()
    ema = rec = None
    for step in range(tc.steps):
        lr = lr_at(step, tc)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = stream.batch(g, tc.batch_size, width, tc.doc_start_fraction).to(dev)
        with amp:
            losses = compute_losses(model, batch, chain=tc.chain_weight > 0, distill=tc.distill_weight > 0)
        loss = losses["trunk"] + tc.mtp_weight * losses["mtp"] + tc.chain_weight * losses.get("chain", 0.0)
        if tc.distill_weight > 0:
            loss = loss + tc.distill_weight * (tc.mtp_weight * losses["mtp_distill"]
                                               + tc.chain_weight * losses.get("chain_distill", 0.0))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        rec = {k: float(v.detach()) for k, v in losses.items()}
        ema = rec if ema is None else {k: 0.95 * ema[k] + 0.05 * rec[k] for k in rec}
        if step % tc.log_every == 0 or step == tc.steps - 1:
            el = time.time() - t_train
            tps = (step + 1) * tc.batch_size * tc.seq_len / max(el, 1e-9)
            history.append({"step": step, "lr": lr, **rec})
            log(f"step {step:5d} lr {lr:.2e} " + " ".join(f"{k} {v:.4f}" for k, v in rec.items())
                + f" | {el:.0f}s {tps:.0f} tok/s")
    return history, rec, ema


def train(tc: TrainConfig, out: Path, command: str | None = None, log=print) -> dict:
    """Build tokenizer and corpus, train trunk + MTP jointly, write the model directory."""
    from safetensors.torch import save_file

    t_start = time.time()
    os.environ.setdefault("RAYON_NUM_THREADS", str(tc.threads))
    torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)
    torch.use_deterministic_algorithms(True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mc = tc.model

    root = stdlib_root()
    train_files, val_files, train_texts, val_texts, corpus_sha256 = read_corpus(tc.max_corpus_files)

    t0 = time.time()
    tok = build_tokenizer(train_texts, mc.vocab_size)
    mc.vocab_size = tok.get_vocab_size()  # BPE may stop short of the target on a small corpus
    save_tokenizer(tok, out, mc.max_position_embeddings)
    t_tok = time.time() - t0
    log(f"tokenizer: vocab {mc.vocab_size}, trained on {len(train_files)} files in {t_tok:.1f}s")

    enc = lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]  # noqa: E731
    train_stream = TokenStream(enc(train_texts))
    val_stream = TokenStream(enc(val_texts))
    n_bytes_train = sum(len(t.encode()) for t in train_texts)
    n_bytes_val = sum(len(t.encode()) for t in val_texts)
    log(f"corpus: {len(train_files)} train files, {n_bytes_train} bytes, {len(train_stream)} tokens; "
        f"{len(val_files)} val files, {len(val_stream)} tokens")

    model = TinyMiMo(mc)
    model.init_weights(tc.seed)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters")
    t_train = time.time()
    history, rec, ema = train_steps(model, train_stream, tc, log)
    train_seconds = time.time() - t_train
    final = {f"final_{k}_loss": v for k, v in rec.items()}
    final.update({f"final_{k}_loss_ema": v for k, v in ema.items()})
    ev = evaluate(model, val_stream, tc)
    log("eval: " + json.dumps(ev))

    (out / "config.json").write_text(json.dumps(hf_config(mc), indent=2) + "\n")
    sd = {k: v.detach().contiguous().clone() for k, v in sorted(model.state_dict().items())}
    st_path = out / "model.safetensors"
    save_file(sd, str(st_path), metadata={"format": "pt"})
    os.chmod(st_path, 0o644)
    from kit.models import weights_manifest_from_safetensors

    (out / "weights.json").write_text(json.dumps(weights_manifest_from_safetensors(st_path), indent=2) + "\n")
    manifest = {
        "name": out.name,
        "command": command,
        "argv": sys.argv,
        "seed": tc.seed,
        "steps": tc.steps,
        "train_config": {k: v for k, v in asdict(tc).items() if k != "model"},
        "model_config": asdict(mc),
        "num_parameters": n_params,
        "corpus": {
            "source": "CPython standard library *.py files shipped with the training Python",
            "stdlib_root": str(root),
            "python_version": sys.version.split()[0],
            "excluded_dirs": sorted(EXCLUDED_DIRS),
            "excluded_rules": f"dirs starting with 'test', files 'test_*', files > {MAX_FILE_BYTES} bytes",
            "validation": f"every {VAL_EVERY}th file (index % {VAL_EVERY} == {VAL_EVERY - 1})",
            "train_files": len(train_files),
            "train_bytes": n_bytes_train,
            "train_tokens": len(train_stream),
            "val_files": len(val_files),
            "val_bytes": n_bytes_val,
            "val_tokens": len(val_stream),
            "first_files": [f.relative_to(root).as_posix() for f in train_files[:3]],
            "last_files": [f.relative_to(root).as_posix() for f in train_files[-3:]],
            "sha256": corpus_sha256,
        },
        "tokenizer": {"type": "byte-level BPE (HF tokenizers)", "vocab_size": mc.vocab_size,
                      "train_seconds": round(t_tok, 1),
                      "sha256_tokenizer_json": _sha256(out / "tokenizer.json")},
        "tokens_seen": tc.steps * tc.batch_size * tc.seq_len,
        **final,
        **ev,
        "loss_history": history,
        "model_safetensors_sha256": _sha256(st_path),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "train_seconds": round(train_seconds, 1),
        "wall_seconds": round(time.time() - t_start, 1),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {out} in {manifest['wall_seconds']}s; sha256 {manifest['model_safetensors_sha256'][:16]}")
    return manifest


# --------------------------------------------------------------------------------------------
# PyTorch reference decoding (full recompute) and MTP acceptance simulation
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def greedy_generate(model: TinyMiMo, prompt_ids: Sequence[int], max_tokens: int,
                    eos_id: int | None = EOS_ID) -> dict:
    """Greedy tokens by full recompute; also top-1/top-2 logprobs per step (tie diagnosis)."""
    ids = list(prompt_ids)
    toks, top = [], []
    for _ in range(max_tokens):
        h = model.hidden(torch.tensor([ids]))
        lp = torch.log_softmax(model.logits(h[:, -1]).float(), dim=-1)[0]
        v, i = lp.topk(2)
        t = int(i[0])
        toks.append(t)
        top.append([[int(i[0]), float(v[0])], [int(i[1]), float(v[1])]])
        ids.append(t)
        if eos_id is not None and t == eos_id:
            break
    return {"tokens": toks, "top2": top}


@torch.no_grad()
def mtp_predictions(model: TinyMiMo, seq: Sequence[int]) -> list[int]:
    """For a full sequence, MTP argmax at each position p (prediction of seq[p+2]) computed from
    the trunk hidden h_p and token seq[p+1]; causal, so equal to what the drafter's first pass
    yields at p when everything up to p+1 is known."""
    x = torch.tensor([list(seq)])
    T = x.shape[1] - 1
    pos = torch.arange(T)
    h = model.hidden(x[:, :T], pos)
    return model.mtp_logits(model.mtp_hidden(h, x[:, 1:T + 1], pos)).argmax(-1)[0].tolist()


@torch.no_grad()
def draft_tokens(model: TinyMiMo, seq: Sequence[int], j: int, k: int, _cache: dict | None = None,
                 return_hidden: bool = False):
    """The k MTP draft tokens vLLM proposes when ``seq[:j+1]`` is known (last known index j).

    Draft 1 comes from the drafter's first pass at position p=j-1 (trunk hidden h_p, token seq[j]).
    Draft s>1 re-applies the MTP layer at position p+s-1 to the previous draft step's output
    (after final_layernorm) and the previous draft token; its attention sees the first pass's
    keys at positions 0..p, the earlier draft steps' keys and its own (the drafter KV cache).
    """
    layer = model.model.mtp_layers[0]
    attn = layer.self_attn
    if _cache is None or _cache.get("seq") != tuple(seq):
        x = torch.tensor([list(seq)])
        T = x.shape[1] - 1
        pos = torch.arange(T)
        h = model.hidden(x[:, :T], pos)
        kv: list = []
        m = model.mtp_hidden(h, x[:, 1:T + 1], pos, kv_out=kv)
        fresh = {"seq": tuple(seq), "m": m, "k": kv[0][0], "v": kv[0][1]}
        if _cache is not None:
            _cache.clear()
            _cache.update(fresh)
        _cache = fresh
    p = j - 1
    m_prev = _cache["m"][:, p:p + 1]
    K, V = _cache["k"][:, :, :p + 1], _cache["v"][:, :, :p + 1]
    drafts = [int(model.mtp_logits(m_prev).argmax(-1))]
    hiddens = [m_prev]
    for s in range(1, k):
        position = torch.tensor([p + s])
        tok = torch.tensor([[drafts[-1]]])
        xin = layer.mtp_input(model.model.embed_tokens(tok), position, m_prev)
        hn = layer.input_layernorm(xin)
        q, k_new, v_new = attn.qkv(hn, position)
        K, V = torch.cat([K, k_new], dim=2), torch.cat([V, v_new], dim=2)
        o = F.scaled_dot_product_attention(q, K, V, scale=attn.hd ** -0.5)
        hmid = xin + attn.out(o)
        out = hmid + layer.mlp(layer.post_attention_layernorm(hmid))
        m_prev = layer.final_layernorm(out)
        hiddens.append(m_prev)
        drafts.append(int(model.mtp_logits(m_prev).argmax(-1)))
    return (drafts, hiddens) if return_hidden else drafts


def simulate_spec(model: TinyMiMo, prompt_ids: Sequence[int], output_ids: Sequence[int], k: int) -> dict:
    """Expected vLLM MTP counters for one greedy request whose (spec-independent) output is
    ``output_ids``: each decode step verifies k drafts, accepts the longest matching prefix (a)
    and yields a+1 tokens; the request ends at len(output_ids) tokens (a last accepted draft
    still counts even when its bonus token is cut off)."""
    seq = list(prompt_ids) + list(output_ids)
    L, n_out = len(prompt_ids), len(output_ids)
    drafts = accepted = 0
    per_pos = [0] * k
    produced, j = 1, L  # the prefill samples the first output token, at index L
    cache: dict = {}
    while produced < n_out:
        d = draft_tokens(model, seq, j, k, cache)
        drafts += 1
        a = 0
        while a < k and j + 1 + a < len(seq) and d[a] == seq[j + 1 + a]:
            per_pos[a] += 1
            a += 1
        accepted += a
        produced += a + 1
        j += a + 1
    return {"drafts": drafts, "draft_tokens": drafts * k, "accepted": accepted, "accepted_per_pos": per_pos}


def simulate_k1(model: TinyMiMo, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> dict:
    return simulate_spec(model, prompt_ids, output_ids, 1)


# --------------------------------------------------------------------------------------------
# vLLM runs (always in a child process; the whole process group is killed afterwards)
# --------------------------------------------------------------------------------------------


def read_prompts(path: Path | str) -> list[str]:
    return [json.loads(line)["prompt"] for line in Path(path).read_text().splitlines() if line.strip()]


def vllm_env(extra: dict | None = None, stock: bool = True) -> dict:
    """Environment for a vLLM child. ``stock=True`` loads no vLLM plugins (``VLLM_PLUGINS=""``),
    so the kit's own patches are not applied: the tiny model is checked against stock vLLM."""
    env = dict(os.environ)
    if stock:
        env["VLLM_PLUGINS"] = ""
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if extra:
        env.update(extra)
    return env


@contextlib.contextmanager
def _file_lock(path: str | None):
    if not path:
        yield
        return
    import fcntl

    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def run_vllm_job(job: dict, timeout: float = 900, lock: str | None = None, log_path: Path | None = None) -> dict:
    """Run :func:`_vllm_job_main` in a fresh process group; return its JSON result."""
    with tempfile.TemporaryDirectory(prefix="tinymimo-vllm-") as td:
        jf, rf = Path(td) / "job.json", Path(td) / "result.json"
        jf.write_text(json.dumps(job))
        logf = open(log_path or Path(td) / "vllm.log", "w")
        cmd = [sys.executable, "-m", "kit.tinymodel", "_vllm-job", str(jf), str(rf)]
        with _file_lock(lock):
            proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=vllm_env(job.get("env"), job.get("stock", True)),
                                    stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except BaseException:
                _kill_group(proc)
                logf.close()
                raise
            finally:
                _kill_group(proc)  # leftovers (resource tracker, workers) of a finished run, too
        logf.close()
        if rc != 0 or not rf.exists():
            tail = Path(logf.name).read_text()[-4000:]
            raise RuntimeError(f"vLLM child failed (exit {rc}); log tail:\n{tail}")
        return json.loads(rf.read_text())


def _metric_values(llm) -> dict:
    from vllm.v1.metrics.reader import Counter, Vector

    out: dict[str, Any] = {}
    for m in llm.get_metrics():
        if not m.name.startswith("vllm:spec_decode"):
            continue
        if isinstance(m, Counter):
            out[m.name] = out.get(m.name, 0) + m.value
        elif isinstance(m, Vector):
            prev = out.get(m.name, [0] * len(m.values))
            out[m.name] = [a + b for a, b in zip(prev, m.values)]
    return out


def _vllm_job_main(job_file: str, result_file: str) -> None:
    """Child process: one engine, one or more prompt sets (``job["sets"]``: name -> prompts);
    spec-decode counters are reported per set as differences of the cumulative counters."""
    job = json.loads(Path(job_file).read_text())
    from vllm import LLM, SamplingParams

    kwargs = dict(model=job["model"], dtype="float32", enforce_eager=True, max_model_len=1024,
                  disable_log_stats=False, seed=0)
    if job.get("k"):
        kwargs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": int(job["k"])}
    kwargs.update(job.get("llm_kwargs") or {})
    t0 = time.time()
    llm = LLM(**kwargs)
    res: dict[str, Any] = {"start_seconds": time.time() - t0, "sets": {}}
    sp = SamplingParams(temperature=0, max_tokens=int(job["max_tokens"]), logprobs=job.get("logprobs"))
    sets = job.get("sets") or {"prompts": job["prompts"]}
    before = _metric_values(llm)
    for name, prompts in sets.items():
        t0 = time.time()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        item_set: dict[str, Any] = {"generate_seconds": time.time() - t0, "outputs": []}
        for o in outs:
            c = o.outputs[0]
            item = {"prompt": o.prompt, "prompt_token_ids": list(o.prompt_token_ids),
                    "token_ids": list(c.token_ids), "text": c.text, "finish_reason": c.finish_reason}
            if c.logprobs:
                item["logprobs"] = [{str(k): v.logprob for k, v in d.items()} for d in c.logprobs]
            item_set["outputs"].append(item)
        after = _metric_values(llm)
        delta = {}
        for key, v in after.items():
            b = before.get(key)
            if isinstance(v, list):
                b = b or [0] * len(v)
                delta[key] = [x - y for x, y in zip(v, b)]
            else:
                delta[key] = v - (b or 0)
        item_set["metrics"] = delta
        before = after
        res["sets"][name] = item_set
    if "prompts" in res["sets"] and len(res["sets"]) == 1:  # single-set shape used by parity_check
        res.update(res["sets"]["prompts"])
    Path(result_file).write_text(json.dumps(res))
    del llm


def parity_check(model_dir: Path | str = DEFAULT_OUT, prompts: Sequence[str] | None = None,
                 max_tokens: int = 32, timeout: float = 900, lock: str | None = None) -> dict:
    """Greedy tokens of :class:`TinyMiMo` (full recompute, float32) vs vLLM (PP=1, no spec,
    float32, eager) on the same prompt token ids. Returns per-prompt results and ``ok``."""
    model_dir = Path(model_dir).resolve()
    if prompts is None:
        prompts = read_prompts(PROMPTS_DIR / "default.jsonl")[:4]
    prompts = list(prompts)
    res = run_vllm_job({"model": str(model_dir), "prompts": prompts, "max_tokens": max_tokens,
                        "logprobs": 2}, timeout=timeout, lock=lock)
    model = load_model(model_dir)
    own_tok = model_dir / "tokenizer.json"
    per, ok = [], True
    max_lp_diff = 0.0
    for o in res["outputs"]:
        ref = greedy_generate(model, o["prompt_token_ids"], max_tokens)
        same = ref["tokens"] == o["token_ids"]
        first_div = None
        if not same:
            first_div = next((i for i, (a, b) in enumerate(zip(ref["tokens"], o["token_ids"])) if a != b),
                             min(len(ref["tokens"]), len(o["token_ids"])))
        # logprob of the sampled token, compared where both agree
        for i, (t, lps) in enumerate(zip(o["token_ids"], o.get("logprobs") or [])):
            if first_div is not None and i >= first_div:
                break
            if str(t) in lps and ref["top2"][i][0][0] == t:
                max_lp_diff = max(max_lp_diff, abs(lps[str(t)] - ref["top2"][i][0][1]))
        item = {
            "prompt": o["prompt"],
            "prompt_tokens": len(o["prompt_token_ids"]),
            "tokenization_matches": encode_prompt(own_tok, o["prompt"]) == o["prompt_token_ids"],
            "vllm_tokens": o["token_ids"],
            "torch_tokens": ref["tokens"],
            "identical": same,
            "first_divergence": first_div,
            "min_top1_top2_margin": min((a[1] - b[1] for a, b in ref["top2"]), default=None),
        }
        if first_div is not None and first_div < len(ref["top2"]):
            item["torch_top2_at_divergence"] = ref["top2"][first_div]
        ok = ok and same and item["tokenization_matches"]
        per.append(item)
    return {"ok": ok, "model": str(model_dir), "max_tokens": max_tokens, "n_prompts": len(prompts),
            "max_abs_logprob_diff": max_lp_diff, "vllm_start_seconds": res["start_seconds"], "prompts": per}


def _summarise(k: int, m: dict, outputs: list[dict], model: TinyMiMo, max_tokens: int) -> dict:
    drafts = m.get("vllm:spec_decode_num_drafts", 0)
    per_pos = m.get("vllm:spec_decode_num_accepted_tokens_per_pos", [])
    acc = m.get("vllm:spec_decode_num_accepted_tokens", 0)
    # What the PyTorch MTP head predicts for the same greedy outputs (checks the drafter's math),
    # and whether the speculative output equals the PyTorch greedy output (spec must not change it).
    sims = [simulate_spec(model, o["prompt_token_ids"], o["token_ids"], k) for o in outputs]
    predicted = {"drafts": sum(x["drafts"] for x in sims), "draft_tokens": sum(x["draft_tokens"] for x in sims),
                 "accepted": sum(x["accepted"] for x in sims),
                 "accepted_per_pos": [sum(x["accepted_per_pos"][i] for x in sims) for i in range(k)]}
    same = sum(greedy_generate(model, o["prompt_token_ids"], max_tokens)["tokens"] == o["token_ids"] for o in outputs)
    return {
        "k": k,
        "n_prompts": len(outputs),
        "output_tokens": sum(len(o["token_ids"]) for o in outputs),
        "drafts": drafts,
        "draft_tokens": m.get("vllm:spec_decode_num_draft_tokens", 0),
        "accepted_tokens": acc,
        "accepted_per_pos": per_pos,
        "acceptance_rate_per_pos": [a / drafts if drafts else None for a in per_pos],
        "mean_acceptance_length": 1 + acc / drafts if drafts else None,
        "torch_predicted": predicted,
        "torch_predicted_matches": (predicted["drafts"] == drafts and predicted["accepted"] == acc
                                    and predicted["accepted_per_pos"] == list(per_pos)),
        "outputs_equal_torch_greedy": f"{same}/{len(outputs)}",
        "outputs": [o["token_ids"] for o in outputs],
    }


def acceptance_sets(model_dir: Path | str, sets: dict[str, Sequence[str]], k: int, max_tokens: int = 64,
                    timeout: float = 900, lock: str | None = None, llm_kwargs: dict | None = None,
                    env: dict | None = None) -> dict:
    """One vLLM engine with MTP k (greedy, float32, eager, PP=1) over several prompt sets;
    per set: counters, per-position acceptance, mean acceptance length (1 + accepted/drafts)."""
    model_dir = Path(model_dir).resolve()
    job = {"model": str(model_dir), "sets": {n: list(p) for n, p in sets.items()}, "max_tokens": max_tokens,
           "k": k, "llm_kwargs": llm_kwargs, "env": env}
    res = run_vllm_job(job, timeout=timeout, lock=lock)
    model = load_model(model_dir)
    out = {"k": k, "start_seconds": res["start_seconds"], "sets": {}}
    for name, r in res["sets"].items():
        out["sets"][name] = {**_summarise(k, r["metrics"], r["outputs"], model, max_tokens),
                             "generate_seconds": r["generate_seconds"]}
    return out


def acceptance(model_dir: Path | str = DEFAULT_OUT, prompts: Sequence[str] | None = None, k: int = 1,
               max_tokens: int = 64, timeout: float = 900, lock: str | None = None,
               llm_kwargs: dict | None = None, env: dict | None = None) -> dict:
    """:func:`acceptance_sets` for one prompt list (default: data/prompts/default.jsonl)."""
    if prompts is None:
        prompts = read_prompts(PROMPTS_DIR / "default.jsonl")
    r = acceptance_sets(model_dir, {"prompts": prompts}, k, max_tokens, timeout, lock, llm_kwargs, env)
    return {**r["sets"]["prompts"], "start_seconds": r["start_seconds"]}


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _train_main(argv: list[str]) -> int:
    from .command import Parser  # one-line errors, exit 2
    from .validate import arg_count, arg_seed

    ap = Parser(prog="kit train-tiny", description="Train the tiny-mimo MTP model (CPU, offline).")
    ap.add_argument("--out", default=str(DEFAULT_OUT.relative_to(REPO_ROOT)),
                    help="model directory (default data/models/tiny-mimo, relative to the repo)")
    ap.add_argument("--seed", type=arg_seed, default=0)
    ap.add_argument("--steps", type=arg_count, default=None)
    ap.add_argument("--quick", action="store_true", help="few-step smoke run on a small corpus (tests)")
    ap.add_argument("--threads", type=arg_count, default=TrainConfig.threads,
                    help="torch intra-op threads (default 1; part of the reproducible recipe)")
    args = ap.parse_args(argv)
    tc = quick_config(args.seed) if args.quick else TrainConfig(seed=args.seed)
    if args.steps is not None:
        tc.steps = args.steps
    tc.threads = args.threads
    out = Path(args.out)
    if not out.is_absolute():
        out = REPO_ROOT / out
    cmd = "python -m kit.tinymodel " + " ".join(argv)
    m = train(tc, out, command=cmd.strip())
    print(json.dumps({k: m[k] for k in m if k.startswith(("final_", "val_"))}, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_vllm-job":
        _vllm_job_main(argv[1], argv[2])
        return 0
    if argv and argv[0] in ("parity", "acceptance"):
        ap = argparse.ArgumentParser(prog=f"kit.tinymodel {argv[0]}")
        ap.add_argument("--model", default=str(DEFAULT_OUT))
        ap.add_argument("--prompts", nargs="+", default=[str(PROMPTS_DIR / "default.jsonl")],
                        help="prompt files (JSONL, one {\"prompt\": ...} a line); acceptance runs each as a set")
        ap.add_argument("--n", type=int, default=None, help="use the first N prompts")
        ap.add_argument("--max-tokens", type=int, default=None)
        ap.add_argument("--k", type=int, nargs="+", default=[1])
        ap.add_argument("--timeout", type=float, default=900)
        ap.add_argument("--lock", default=None, help="flock this file around each vLLM run")
        ap.add_argument("--json", default=None, help="also write the result here")
        args = ap.parse_args(argv[1:])
        sets = {Path(f).stem: read_prompts(f)[: args.n] if args.n else read_prompts(f) for f in args.prompts}
        if argv[0] == "parity":
            prompts = [p for ps in sets.values() for p in ps]
            res = parity_check(args.model, prompts, args.max_tokens or 32, timeout=args.timeout, lock=args.lock)
            rc = 0 if res["ok"] else 1
        else:
            res = {"prompt_files": args.prompts, "runs": []}
            for k in args.k:
                r = acceptance_sets(args.model, sets, k, args.max_tokens or 64, timeout=args.timeout, lock=args.lock)
                res["runs"].append(r)
            rc = 0
        text = json.dumps(res, indent=2)
        if args.json:
            Path(args.json).write_text(text + "\n")
        print(text)
        return rc
    return _train_main(argv)


if __name__ == "__main__":
    sys.exit(main())
