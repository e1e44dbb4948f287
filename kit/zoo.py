"""Regenerate the zoo of tiny drafter-family models under ``data/models/`` (random weights only).

Each zoo directory gets ``config.json``, ``generation_config.json``, tokenizer files (one shared
byte-level BPE, vocab 2048, trained on a fixed list of CPython stdlib sources) and ``weights.json``:
every tensor name and shape that vLLM 0.32's loader for the architecture reads from a checkpoint,
in the checkpoint's own naming (HF names; MTP layers as ``model.layers.<num_hidden_layers>.*``;
Eagle3 drafts in the EAGLE3 ``midlayer.*`` layout). No weights are stored: the kit writes seeded
random checkpoints from ``weights.json`` (:func:`kit.models.random_checkpoint`).

Models (see ``data/models/README.md``, section "Zoo", for what was observed on vLLM 0.32.0 CPU):

* ``tiny-deepseek-v3``: ``DeepseekV3ForCausalLM``, MLA (kv_lora_rank 512, qk_rope_head_dim 64, the
  only latent size the CPU MLA kernels take), dense layers, one MTP layer -> ``DeepSeekMTPModel``.
* ``tiny-llama-swa``: ``LlamaForCausalLM`` with ``layer_types`` mixing sliding and full attention;
  its ``kit.json`` names the Eagle3 draft ``tiny-llama-swa-eagle3`` (``LlamaForCausalLMEagle3``).
* ``tiny-glm4-moe``: ``Glm4MoeForCausalLM`` (small MoE), one MTP layer -> ``Glm4MoeMTPModel``.
* ``tiny-qwen3_5``: ``Qwen3_5ForCausalLM`` (``qwen3_5_text``; 3 Gated-DeltaNet layers + 1 full
  attention layer, linear head dims 128), ``mtp_num_hidden_layers`` 1 -> ``Qwen3_5MTP``. vLLM 0.32 CPU
  needs bf16 and, with spec decode, ``enable_prefix_caching=False`` (both set by
  ``kit.topology.model_requirements``), and imports it only with the kit's ``qwen_vl_no_torchvision`` patch.

Trained variants (:data:`TRAINED`): the same ``config.json``, tokenizer and ``weights.json`` as a zoo model,
copied unchanged, plus ``model.safetensors`` from ``python -m kit.tiny train`` (``data/models/README.md`` records
each recipe). Their logits are far from ties, so a PP + speculation cell diverges only for a real reason:

* ``tiny-deepseek-v3-trained`` (``python -m kit.tiny train tiny-deepseek``), from ``tiny-deepseek-v3``.
* ``tiny-qwen3_5-trained`` (``python -m kit.tiny train tiny-qwen3_5``), from ``tiny-qwen3_5``: the Qwen3.5
  cells of the correctness matrix are token-identical with it (random bf16 weights meet one-bf16-step ties).

Usage: ``python -m kit.zoo [--out DIR] [--only NAME ...] [--no-tokenizer]``. The configs and
manifests are pure functions of this file; the tokenizer is deterministic for a given CPython
version (its training text is that interpreter's stdlib).
"""
from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from .models import MODELS_DIR

VOCAB_SIZE = 2048
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN)  # ids 0 and 1

# Training text for the tokenizer: these stdlib modules, in this order (present in CPython 3.10-3.13).
TOKENIZER_SOURCES = (
    "abc.py", "argparse.py", "ast.py", "bisect.py", "calendar.py", "collections/__init__.py",
    "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "difflib.py", "enum.py",
    "fractions.py", "functools.py", "heapq.py", "inspect.py", "json/decoder.py",
    "json/encoder.py", "logging/__init__.py", "os.py", "pathlib.py", "pprint.py", "queue.py",
    "random.py", "shutil.py", "statistics.py", "string.py", "textwrap.py", "threading.py",
    "typing.py", "weakref.py",
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------

_COMMON = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-06,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 1,
    "tie_word_embeddings": False,
    "use_cache": True,
    "torch_dtype": "float32",
}

SWA_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
SLIDING_WINDOW = 32
EAGLE3_AUX_LAYER_IDS = [1, 2, 3]


def _deepseek_v3() -> dict:
    c = dict(_COMMON)
    c.update(
        architectures=["DeepseekV3ForCausalLM"],
        model_type="deepseek_v3",
        # MLA: the CPU MLA backends (AMX_MLA, CPU_MLA) only take a 576-wide latent cache,
        # i.e. kv_lora_rank 512 + qk_rope_head_dim 64. q_lora_rank set -> fused q_a/kv_a path.
        q_lora_rank=64,
        kv_lora_rank=512,
        qk_nope_head_dim=32,
        qk_rope_head_dim=64,
        v_head_dim=32,
        head_dim=64,
        num_key_value_heads=4,
        rope_interleave=True,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        attention_bias=False,
        # MoE fields are required by the config classes, but every layer (and the MTP layer,
        # index 4) is dense because first_k_dense_replace > num_hidden_layers.
        first_k_dense_replace=5,
        moe_layer_freq=1,
        moe_intermediate_size=64,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
        num_nextn_predict_layers=1,
        # float32 runs on the reference CPU_MLA backend (used on hosts without AMX). On AMX hosts
        # vLLM 0.32 picks AMX_MLA (bf16 only) for any dtype unless the CPU_MLA backend is requested.
    )
    return c


def _llama_swa() -> dict:
    c = dict(_COMMON)
    c.update(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        head_dim=32,
        attention_bias=False,
        mlp_bias=False,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        layer_types=list(SWA_LAYER_TYPES),
        sliding_window=SLIDING_WINDOW,
    )
    return c


def _llama_swa_eagle3() -> dict:
    c = dict(_COMMON)
    c.update(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        num_hidden_layers=1,
        head_dim=32,
        attention_bias=False,
        mlp_bias=False,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        # Draft-relative: vLLM indexes layer_types with (layer index - target layer count).
        layer_types=["sliding_attention"],
        sliding_window=SLIDING_WINDOW,
        draft_vocab_size=VOCAB_SIZE,  # == target vocab: no d2t/t2d tables in the checkpoint
        target_hidden_size=128,
        eagle_aux_hidden_state_layer_ids=list(EAGLE3_AUX_LAYER_IDS),
        # llama_eagle3.py sizes fc from eagle_config's layer ids (default 3), not the top-level key.
        eagle_config={
            "eagle_aux_hidden_state_layer_ids": list(EAGLE3_AUX_LAYER_IDS),
            "use_aux_hidden_state": True,
        },
    )
    return c


def _glm4_moe() -> dict:
    c = dict(_COMMON)
    c.update(
        architectures=["Glm4MoeForCausalLM"],
        model_type="glm4_moe",
        head_dim=32,
        attention_bias=True,
        use_qk_norm=False,
        partial_rotary_factor=0.5,
        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_type": "default"},
        first_k_dense_replace=1,  # layer 0 dense; layers 1-3 and the MTP layer (4) MoE
        moe_intermediate_size=64,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
        num_nextn_predict_layers=1,
    )
    return c


def _qwen3_5() -> dict:
    c = dict(_COMMON)
    c.update(
        architectures=["Qwen3_5ForCausalLM"],
        model_type="qwen3_5_text",
        head_dim=64,
        attention_bias=False,
        attn_output_gate=True,  # q_proj emits query and gate: 2 * heads * head_dim rows
        # Gated-DeltaNet (linear attention) layers: the CPU GDN kernel wants head dims of 128.
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        linear_conv_kernel_dim=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.25, "rope_type": "default"},
        partial_rotary_factor=0.25,
        mtp_num_hidden_layers=1,
        # vLLM 0.32's CPU GDN kernel asserts bf16 ("CPU GDN attention requires BF16.").
        torch_dtype="bfloat16",
    )
    return c


CONFIGS = {
    "tiny-deepseek-v3": _deepseek_v3,
    "tiny-llama-swa": _llama_swa,
    "tiny-llama-swa-eagle3": _llama_swa_eagle3,
    "tiny-glm4-moe": _glm4_moe,
    "tiny-qwen3_5": _qwen3_5,
}

# Extra files per model (kit.json names the Eagle3 draft of a target).
KIT_META = {"tiny-llama-swa": {"draft_model": "../tiny-llama-swa-eagle3"}}

ZOO = tuple(CONFIGS)

# Trained variant -> the zoo model whose config, tokenizer and weights.json it carries unchanged.
TRAINED = {"tiny-deepseek-v3-trained": "tiny-deepseek-v3", "tiny-qwen3_5-trained": "tiny-qwen3_5"}


def config(name: str) -> dict:
    return CONFIGS[name]()


def generation_config(cfg: dict) -> dict:
    return {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
            "pad_token_id": cfg["pad_token_id"], "do_sample": False}


# --------------------------------------------------------------------------------------------
# Tensor manifests (checkpoint names, as vLLM 0.32's load_weights for each architecture reads them)
# --------------------------------------------------------------------------------------------


def _mlp(p: str, hidden: int, inter: int) -> dict:
    return {
        f"{p}.gate_proj.weight": [inter, hidden],
        f"{p}.up_proj.weight": [inter, hidden],
        f"{p}.down_proj.weight": [hidden, inter],
    }


def _gqa_attn(p: str, c: dict, in_size: int | None = None, bias: bool = False) -> dict:
    h = c["hidden_size"]
    d = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    t = {
        f"{p}.q_proj.weight": [q, in_size or h],
        f"{p}.k_proj.weight": [kv, in_size or h],
        f"{p}.v_proj.weight": [kv, in_size or h],
        f"{p}.o_proj.weight": [h, q],
    }
    if bias:
        t.update({f"{p}.q_proj.bias": [q], f"{p}.k_proj.bias": [kv], f"{p}.v_proj.bias": [kv]})
    return t


def _mla_attn(p: str, c: dict) -> dict:
    h, n = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    kvl, ql = c["kv_lora_rank"], c.get("q_lora_rank")
    t = {}
    if ql:
        t[f"{p}.q_a_proj.weight"] = [ql, h]
        t[f"{p}.q_a_layernorm.weight"] = [ql]
        t[f"{p}.q_b_proj.weight"] = [n * (nope + rope), ql]
    else:
        t[f"{p}.q_proj.weight"] = [n * (nope + rope), h]
    t[f"{p}.kv_a_proj_with_mqa.weight"] = [kvl + rope, h]
    t[f"{p}.kv_a_layernorm.weight"] = [kvl]
    t[f"{p}.kv_b_proj.weight"] = [n * (nope + v), kvl]
    t[f"{p}.o_proj.weight"] = [h, n * v]
    return t


def _moe(p: str, c: dict) -> dict:
    h, e, mi = c["hidden_size"], c["n_routed_experts"], c["moe_intermediate_size"]
    t = {f"{p}.gate.weight": [e, h], f"{p}.gate.e_score_correction_bias": [e]}
    for i in range(e):
        t.update(_mlp(f"{p}.experts.{i}", h, mi))
    if c.get("n_shared_experts"):
        t.update(_mlp(f"{p}.shared_experts", h, mi * c["n_shared_experts"]))
    return t


def _norms(p: str, h: int) -> dict:
    return {f"{p}.input_layernorm.weight": [h], f"{p}.post_attention_layernorm.weight": [h]}


def _mtp_extra(p: str, c: dict) -> dict:
    """The DeepSeek-V3-style MTP layer's own tensors (beside its decoder block)."""
    h, v = c["hidden_size"], c["vocab_size"]
    return {
        f"{p}.enorm.weight": [h],
        f"{p}.hnorm.weight": [h],
        f"{p}.eh_proj.weight": [h, 2 * h],
        f"{p}.shared_head.norm.weight": [h],
        f"{p}.shared_head.head.weight": [v, h],
        f"{p}.embed_tokens.weight": [v, h],
    }


def _causal_lm_top(c: dict) -> dict:
    h, v = c["hidden_size"], c["vocab_size"]
    t = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h]}
    if not c.get("tie_word_embeddings"):
        t["lm_head.weight"] = [v, h]
    return t


def _manifest_deepseek_v3(c: dict) -> dict:
    t = _causal_lm_top(c)
    n = c["num_hidden_layers"]
    for i in range(n + c.get("num_nextn_predict_layers", 0)):
        p = f"model.layers.{i}"
        t.update(_mla_attn(f"{p}.self_attn", c))
        t.update(_norms(p, c["hidden_size"]))
        moe = c.get("n_routed_experts") and i >= c["first_k_dense_replace"] and i % c.get("moe_layer_freq", 1) == 0
        t.update(_moe(f"{p}.mlp", c) if moe else _mlp(f"{p}.mlp", c["hidden_size"], c["intermediate_size"]))
        if i >= n:
            t.update(_mtp_extra(p, c))
    return t


def _manifest_glm4_moe(c: dict) -> dict:
    t = _causal_lm_top(c)
    n = c["num_hidden_layers"]
    d = c["head_dim"]
    for i in range(n + c.get("num_nextn_predict_layers", 0)):
        p = f"model.layers.{i}"
        t.update(_gqa_attn(f"{p}.self_attn", c, bias=c["attention_bias"]))
        if c.get("use_qk_norm"):
            t.update({f"{p}.self_attn.q_norm.weight": [d], f"{p}.self_attn.k_norm.weight": [d]})
        t.update(_norms(p, c["hidden_size"]))
        moe = i >= c["first_k_dense_replace"]
        t.update(_moe(f"{p}.mlp", c) if moe else _mlp(f"{p}.mlp", c["hidden_size"], c["intermediate_size"]))
        if i >= n:
            t.update(_mtp_extra(p, c))
    return t


def _manifest_llama(c: dict) -> dict:
    t = _causal_lm_top(c)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        t.update(_gqa_attn(f"{p}.self_attn", c, bias=c.get("attention_bias", False)))
        t.update(_mlp(f"{p}.mlp", c["hidden_size"], c["intermediate_size"]))
        t.update(_norms(p, c["hidden_size"]))
    return t


def _manifest_llama_eagle3(c: dict) -> dict:
    """EAGLE3 checkpoint layout (as yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): one ``midlayer`` whose
    q/k/v take [embeds, hidden] (2*hidden), ``fc`` over the aux hidden states, no embed_tokens
    (shared from the target), and no d2t/t2d while draft_vocab_size == vocab_size."""
    assert c["num_hidden_layers"] == 1, "the EAGLE3 midlayer layout has one layer"
    h = c["hidden_size"]
    n_aux = len(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    t = {}
    t.update(_gqa_attn("midlayer.self_attn", c, in_size=2 * h, bias=c.get("attention_bias", False)))
    t.update(_mlp("midlayer.mlp", h, c["intermediate_size"]))
    t.update(_norms("midlayer", h))
    t["midlayer.hidden_norm.weight"] = [h]
    t["fc.weight"] = [h, n_aux * c["target_hidden_size"]]
    t["norm.weight"] = [h]
    t["lm_head.weight"] = [c["draft_vocab_size"], h]
    if c["draft_vocab_size"] != c["vocab_size"]:
        raise ValueError("a smaller draft vocab needs integer d2t/t2d tensors, which random_checkpoint cannot write")
    return t


def _qwen3_5_layer(p: str, c: dict, layer_type: str) -> dict:
    h = c["hidden_size"]
    t = {}
    if layer_type == "full_attention":
        d, n, kvh = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
        gate = 2 if c.get("attn_output_gate", True) else 1
        t.update({
            f"{p}.self_attn.q_proj.weight": [gate * n * d, h],
            f"{p}.self_attn.k_proj.weight": [kvh * d, h],
            f"{p}.self_attn.v_proj.weight": [kvh * d, h],
            f"{p}.self_attn.o_proj.weight": [h, n * d],
            f"{p}.self_attn.q_norm.weight": [d],
            f"{p}.self_attn.k_norm.weight": [d],
        })
    else:
        kd, vd = c["linear_key_head_dim"], c["linear_value_head_dim"]
        nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        key_dim, value_dim = nk * kd, nv * vd
        conv_dim = 2 * key_dim + value_dim
        t.update({
            f"{p}.linear_attn.in_proj_qkv.weight": [conv_dim, h],
            f"{p}.linear_attn.in_proj_z.weight": [value_dim, h],
            f"{p}.linear_attn.in_proj_b.weight": [nv, h],
            f"{p}.linear_attn.in_proj_a.weight": [nv, h],
            f"{p}.linear_attn.conv1d.weight": [conv_dim, 1, c["linear_conv_kernel_dim"]],
            f"{p}.linear_attn.dt_bias": [nv],
            f"{p}.linear_attn.A_log": [nv],
            f"{p}.linear_attn.norm.weight": [vd],
            f"{p}.linear_attn.out_proj.weight": [h, value_dim],
        })
    t.update(_mlp(f"{p}.mlp", h, c["intermediate_size"]))
    t.update(_norms(p, h))
    return t


def _manifest_qwen3_5(c: dict) -> dict:
    """Text-only Qwen3.5 (``model.layers.*``) plus its MTP module under ``mtp.*`` (fc over
    [embeds, hidden], two pre-fc norms, full-attention decoder layers, final norm); the MTP
    module shares the target's embed_tokens and lm_head."""
    h = c["hidden_size"]
    t = _causal_lm_top(c)
    for i, lt in enumerate(c["layer_types"]):
        t.update(_qwen3_5_layer(f"model.layers.{i}", c, lt))
    if c.get("mtp_num_hidden_layers"):
        t.update({
            "mtp.fc.weight": [h, 2 * h],
            "mtp.pre_fc_norm_hidden.weight": [h],
            "mtp.pre_fc_norm_embedding.weight": [h],
            "mtp.norm.weight": [h],
        })
        for i in range(c["mtp_num_hidden_layers"]):
            t.update(_qwen3_5_layer(f"mtp.layers.{i}", c, "full_attention"))
    return t


_MANIFESTS = {
    "DeepseekV3ForCausalLM": _manifest_deepseek_v3,
    "Glm4MoeForCausalLM": _manifest_glm4_moe,
    "LlamaForCausalLM": _manifest_llama,
    "LlamaForCausalLMEagle3": _manifest_llama_eagle3,
    "Qwen3_5ForCausalLM": _manifest_qwen3_5,
}


def weights_manifest(cfg: dict) -> dict:
    """``{"tensors": {name: shape}}`` for a zoo config, names sorted."""
    tensors = _MANIFESTS[cfg["architectures"][0]](cfg)
    return {"tensors": {k: tensors[k] for k in sorted(tensors)}}


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def tokenizer_corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / rel).read_text(encoding="utf-8") for rel in TOKENIZER_SOURCES]


def train_tokenizer():
    """A byte-level BPE (``tokenizers``), vocab ``VOCAB_SIZE`` including the special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    from .tiny.tokenizer import bpe_trainer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(tokenizer_corpus(), trainer=bpe_trainer(VOCAB_SIZE, SPECIAL_TOKENS))
    return tok


def tokenizer_files(tok=None) -> dict[str, str]:
    """File name -> text for the tokenizer files (the same in every zoo directory)."""
    tok = tok or train_tokenizer()
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
    }
    special = {"bos_token": EOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}
    return {
        "tokenizer.json": tok.to_str(pretty=True) + "\n",
        "tokenizer_config.json": json.dumps(cfg, indent=2) + "\n",
        "special_tokens_map.json": json.dumps(special, indent=2) + "\n",
    }


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def _dump(obj) -> str:
    return json.dumps(obj, indent=2) + "\n"


def model_files(name: str) -> dict[str, str]:
    """File name -> text for one zoo model, without the tokenizer files."""
    cfg = config(name)
    files = {
        "config.json": _dump(cfg),
        "generation_config.json": _dump(generation_config(cfg)),
        "weights.json": _dump(weights_manifest(cfg)),
    }
    if name in KIT_META:
        files["kit.json"] = _dump(KIT_META[name])
    return files


def write_zoo(out: Path = MODELS_DIR, names=ZOO, tokenizer: bool = True) -> list[Path]:
    tok_files = tokenizer_files() if tokenizer else {}
    written = []
    for name in names:
        d = Path(out) / name
        d.mkdir(parents=True, exist_ok=True)
        for fname, text in {**model_files(name), **tok_files}.items():
            (d / fname).write_text(text)
            written.append(d / fname)
    return written


def main(argv: list[str] | None = None) -> int:
    from .command import Parser  # one-line errors, exit 2

    ap = Parser(prog="python -m kit.zoo", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=MODELS_DIR, help="parent directory (default data/models)")
    ap.add_argument("--only", nargs="*", choices=ZOO, default=list(ZOO))
    ap.add_argument("--no-tokenizer", action="store_true", help="keep existing tokenizer files")
    a = ap.parse_args(argv)
    for p in write_zoo(a.out, a.only, tokenizer=not a.no_tokenizer):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
