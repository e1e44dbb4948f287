"""Configurations of the tiny trained models: architecture, training recipe, and the ``config.json`` vLLM loads.

:class:`ModelConfig` is the MiMo-layout model (``tiny-mimo``, ``mimo-py-18m``), :class:`DSConfig` the dense
DeepSeek-V3 layout (``tiny-deepseek-v3-trained``), :class:`Qwen35Config` the Qwen3.5 hybrid
(``tiny-qwen3_5-trained``), :class:`TrainConfig` one training run. The presets at the
bottom are the recipes the shipped checkpoints were trained with (changing one changes what retraining writes).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from kit.core.models import MODELS_DIR, PROMPTS_DIR, REPO_ROOT

__all__ = ["REPO_ROOT", "MODELS_DIR", "PROMPTS_DIR", "BOS", "EOS", "PAD", "SPECIAL_TOKENS", "BOS_ID", "EOS_ID",
           "PAD_ID", "ModelConfig", "DSConfig", "Qwen35Config", "TrainConfig", "hf_config",
           "tiny_mimo_config", "tiny_deepseek_config", "tiny_qwen3_5_config", "tiny_llama_swa_config", "MIMO_PY_PRESET", "mimo_py_config"]

# tiny-mimo's tokenizer (mimo-py-18m copies it): ids 0, 1, 2.
BOS = "<|bos|>"
EOS = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (BOS, EOS, PAD)
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2


@dataclass
class _ArchConfig:
    """What both architectures share, with ``from_hf``: the fields read from a ``config.json``."""

    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 2  # head_dim 64 (the CPU attention backend supports 32..512)
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    num_nextn_predict_layers: int = 1

    @classmethod
    def from_hf(cls, c: dict):
        rope = c.get("rope_parameters") or {}
        return cls(**{f.name: type(f.default)(c[f.name]) for f in fields(cls)
                      if f.name in c and f.name != "rope_theta"},
                   rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))))


@dataclass
class ModelConfig(_ArchConfig):
    """``MiMoForCausalLM``: Qwen2 decoder layers plus ``num_nextn_predict_layers`` MTP layers."""

    num_key_value_heads: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, c: dict) -> "ModelConfig":
        return super().from_hf({"num_key_value_heads": c["num_attention_heads"], **c})


@dataclass
class DSConfig(_ArchConfig):
    """``DeepseekV3ForCausalLM`` with dense layers (MLA attention with q LoRA) and its MTP layer."""

    intermediate_size: int = 256
    num_attention_heads: int = 4
    q_lora_rank: int = 64
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 64
    v_head_dim: int = 32

    @classmethod
    def from_hf(cls, c: dict) -> "DSConfig":
        rope = c.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default" or c.get("n_routed_experts") and \
                c.get("first_k_dense_replace", 0) <= c["num_hidden_layers"]:
            raise ValueError("only default RoPE and all-dense layers (incl. the MTP layer) are implemented")
        return super().from_hf(c)


@dataclass
class Qwen35Config(_ArchConfig):
    """``Qwen3_5ForCausalLM`` (``qwen3_5_text``) with its ``mtp.*`` drafter. The Gated-DeltaNet and attention
    details are transformers' ``Qwen3_5TextConfig``, built from ``hf`` (the ``config.json`` itself)."""

    num_key_value_heads: int = 2
    head_dim: int = 64
    partial_rotary_factor: float = 0.25
    hf: dict = field(default_factory=dict)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_hf(cls, c: dict) -> "Qwen35Config":
        if c.get("model_type") != "qwen3_5_text" or c.get("mtp_num_hidden_layers", 0) != 1:
            raise ValueError("only qwen3_5_text with one MTP layer is implemented")
        rope = c.get("rope_parameters") or {}
        base = super().from_hf({k: v for k, v in c.items() if k != "partial_rotary_factor"})
        return replace(base, hf=dict(c),
                       partial_rotary_factor=float(rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1))))


@dataclass
class TrainConfig:
    """One training run: optimiser, schedule, loss weights, batches; ``model`` is the architecture."""

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
    # Optional extra drafter loss against the trunk's own distribution (see kit.zoo.tiny.train.compute_losses).
    distill_weight: float = 0.0
    doc_start_fraction: float = 0.25
    # One intra-op thread: on a 2-core machine shared with other CPU-heavy processes (vLLM runs), 2 OpenMP
    # threads were measured 3-5x SLOWER per step than 1 (oversubscribed OpenMP barriers). The thread count can
    # change float summation order, so it is part of the reproducible recipe.
    threads: int = 1
    log_every: int = 10
    max_corpus_files: int | None = None
    eval_batches: int = 8
    model: ModelConfig | DSConfig | Qwen35Config = field(default_factory=ModelConfig)


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


# -- the shipped recipes ----------------------------------------------------------------------------


def tiny_mimo_config(quick: bool = False, seed: int = 0) -> TrainConfig:
    """``tiny-mimo``: the defaults above; ``quick``: a few-step smoke run (small corpus, vocab and batches)."""
    if not quick:
        return TrainConfig(seed=seed)
    return TrainConfig(
        seed=seed, steps=3, batch_size=4, seq_len=64, warmup_steps=1, log_every=1,
        max_corpus_files=24, eval_batches=1,
        model=ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                          num_attention_heads=2, num_key_value_heads=1),
    )


def tiny_deepseek_config(quick: bool = False, seed: int = 0) -> TrainConfig:
    """``tiny-deepseek-v3-trained`` (the architecture is read from the zoo's ``config.json`` at training)."""
    if quick:
        return TrainConfig(seed=seed, steps=3, batch_size=2, seq_len=32, warmup_steps=1, log_every=1,
                           max_corpus_files=8, eval_batches=1, model=DSConfig())
    return TrainConfig(seed=seed, steps=700, batch_size=8, seq_len=256, warmup_steps=50,
                       log_every=10, eval_batches=8, model=DSConfig())


def tiny_qwen3_5_config(quick: bool = False, seed: int = 0) -> TrainConfig:
    """``tiny-qwen3_5-trained`` (the architecture is read from the zoo's ``config.json`` at training): tiny-deepseek's
    recipe with 600 steps (about 1 s each on one core) and the drafter's distillation term."""
    if quick:
        return TrainConfig(seed=seed, steps=3, batch_size=2, seq_len=32, warmup_steps=1, log_every=1,
                           max_corpus_files=8, eval_batches=1, model=Qwen35Config())
    return TrainConfig(seed=seed, steps=600, batch_size=8, seq_len=256, warmup_steps=50, distill_weight=1.0,
                       log_every=10, eval_batches=8, model=Qwen35Config())


def tiny_llama_swa_config(quick: bool = False, seed: int = 0) -> TrainConfig:
    """``tiny-llama-swa-trained`` and its Eagle3 drafter (the architecture is read from the zoo's ``config.json``
    files at training): tiny-qwen3_5's recipe with 700 steps, the drafter's distillation term included."""
    if quick:
        return TrainConfig(seed=seed, steps=3, batch_size=2, seq_len=32, warmup_steps=1, log_every=1,
                           max_corpus_files=8, eval_batches=1, distill_weight=1.0)
    return TrainConfig(seed=seed, steps=700, batch_size=8, seq_len=256, warmup_steps=50, distill_weight=1.0,
                       log_every=10, eval_batches=8)


MIMO_PY_PRESET = ModelConfig(vocab_size=2048, hidden_size=384, intermediate_size=1024, num_hidden_layers=8,
                             num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=2048)


def mimo_py_config(quick: bool = False, seed: int = 0, steps: int = 4500) -> TrainConfig:
    """``mimo-py-18m``: batch 64 x 512 tokens, AdamW, peak LR 1.5e-3, cosine to 10 %, drafter distillation;
    ``quick``: a few CPU steps of a small model on a few files (tests)."""
    if quick:
        return TrainConfig(seed=seed, steps=3, batch_size=2, seq_len=64, warmup_steps=1, log_every=1,
                           eval_batches=1, distill_weight=1.0, max_corpus_files=24,
                           model=ModelConfig(vocab_size=2048, hidden_size=128, intermediate_size=256,
                                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2))
    return TrainConfig(seed=seed, steps=steps, batch_size=64, seq_len=512, lr=1.5e-3, min_lr_ratio=0.1,
                       warmup_steps=200, weight_decay=0.1, grad_clip=1.0, mtp_weight=1.0, chain_weight=0.5,
                       distill_weight=1.0, doc_start_fraction=0.25, threads=1, log_every=100,
                       eval_batches=16, model=ModelConfig(**asdict(MIMO_PY_PRESET)))
