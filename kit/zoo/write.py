"""Regenerate the zoo of tiny drafter-family models under ``data/models/`` (random weights only).

Each zoo directory gets ``config.json``, ``generation_config.json``, tokenizer files (one shared
byte-level BPE, vocab 2048, trained on a fixed list of CPython stdlib sources) and ``weights.json``:
every tensor name and shape that vLLM 0.32's loader for the architecture reads from a checkpoint,
in the checkpoint's own naming (HF names; MTP layers as ``model.layers.<num_hidden_layers>.*``;
Eagle3 drafts in the EAGLE3 ``midlayer.*`` layout). No weights are stored: the kit writes seeded
random checkpoints from ``weights.json`` (:func:`kit.core.models.random_checkpoint`).

Models (see ``data/models/README.md``, section "Zoo", for what was observed on vLLM 0.32.0 CPU):

* ``tiny-deepseek-v3``: ``DeepseekV3ForCausalLM``, MLA (kv_lora_rank 512, qk_rope_head_dim 64, the
  only latent size the CPU MLA kernels take), dense layers, one MTP layer -> ``DeepSeekMTPModel``.
* ``tiny-llama-swa``: ``LlamaForCausalLM`` with ``layer_types`` mixing sliding and full attention;
  its ``kit.json`` names the Eagle3 draft ``tiny-llama-swa-eagle3`` (``LlamaForCausalLMEagle3``).
* ``tiny-glm4-moe``: ``Glm4MoeForCausalLM`` (small MoE), one MTP layer -> ``Glm4MoeMTPModel``.
* ``tiny-qwen3_5``: ``Qwen3_5ForCausalLM`` (``qwen3_5_text``; 3 Gated-DeltaNet layers + 1 full
  attention layer, linear head dims 128), ``mtp_num_hidden_layers`` 1 -> ``Qwen3_5MTP``. vLLM 0.32 CPU
  needs bf16 and, with spec decode, ``enable_prefix_caching=False`` (both set by
  ``kit.core.models.model_requirements``), and imports it only with the kit's ``qwen_vl_no_torchvision`` patch.

Trained variants (:data:`TRAINED`): the same ``config.json``, tokenizer and ``weights.json`` as a zoo model,
copied unchanged, plus ``model.safetensors`` from ``kit train`` (``data/models/README.md`` records
each recipe). Their logits are far from ties, so a PP + speculation cell diverges only for a real reason:

* ``tiny-deepseek-v3-trained`` (``kit train tiny-deepseek``), from ``tiny-deepseek-v3``.
* ``tiny-qwen3_5-trained`` (``kit train tiny-qwen3_5``), from ``tiny-qwen3_5``.
* ``tiny-llama-swa-trained`` (``kit train tiny-llama-swa``), from ``tiny-llama-swa``; its trained Eagle3 drafter
  ``tiny-llama-swa-trained-eagle3`` carries ``tiny-llama-swa-eagle3``'s config and tokenizer.

Usage: ``kit zoo [--out DIR] [--only NAME ...] [--no-tokenizer]``. The configs
(:mod:`kit.zoo.configs`) and manifests (:mod:`kit.zoo.weights`) are pure functions of those files; the
tokenizer (here) is deterministic for a given CPython version (its training text is that interpreter's stdlib).
"""
from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from kit.core.models import MODELS_DIR
from kit.zoo.configs import (
    CONFIGS,
    EOS_TOKEN,
    KIT_META,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    ZOO,
    config,
    generation_config,
)
from kit.zoo.weights import weights_manifest

# The zoo's public names, configs and manifests included, stay importable from here.
__all__ = ["CONFIGS", "EOS_TOKEN", "KIT_META", "PAD_TOKEN", "SPECIAL_TOKENS", "TOKENIZER_FILES", "TOKENIZER_SOURCES",
           "VOCAB_SIZE", "ZOO", "config", "generation_config", "main", "model_files", "tokenizer_corpus",
           "tokenizer_files", "train_tokenizer", "weights_manifest", "write_zoo"]

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

# Trained variant -> the zoo model whose config, tokenizer and weights.json it carries unchanged.
TRAINED = {"tiny-deepseek-v3-trained": "tiny-deepseek-v3", "tiny-qwen3_5-trained": "tiny-qwen3_5",
           "tiny-llama-swa-trained": "tiny-llama-swa"}


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def tokenizer_corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / rel).read_text(encoding="utf-8") for rel in TOKENIZER_SOURCES]


def train_tokenizer():
    """A byte-level BPE (``tokenizers``), vocab ``VOCAB_SIZE`` including the special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    from kit.zoo.tiny.tokenizer import bpe_trainer

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
    from kit.core.flags import Parser  # one-line errors, exit 2

    ap = Parser(prog="kit zoo", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=MODELS_DIR, help="parent directory (default data/models)")
    ap.add_argument("--only", nargs="*", choices=ZOO, default=list(ZOO))
    ap.add_argument("--no-tokenizer", action="store_true", help="keep existing tokenizer files")
    a = ap.parse_args(argv)
    for p in write_zoo(a.out, a.only, tokenizer=not a.no_tokenizer):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
