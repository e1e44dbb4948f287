"""``tiny-mimo``'s tokenizer: HF ``tokenizers`` byte-level BPE trained on the corpus, saved so that
``AutoTokenizer`` (and so vLLM) loads it from the model directory. Prompts are encoded as ``<|bos|> text``;
``<|endoftext|>`` ends a document."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from kit.zoo.tiny.config import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, SPECIAL_TOKENS

# transformers' Qwen2Tokenizer pre-tokenizer split (models/qwen2/tokenization_qwen2.py)
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def bpe_trainer(vocab_size: int, special_tokens: Sequence[str]):
    """The byte-level BPE trainer of every tokenizer the kit trains (the tiny models' and the zoo's): the 256
    byte symbols first, the special tokens at ids 0.., merges seen at least twice."""
    from tokenizers import pre_tokenizers, trainers

    return trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(special_tokens),
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)


def build_tokenizer(texts: Iterable[str], vocab_size: int):
    """Byte-level BPE (GPT-2 style pre-tokenizer), deterministic for a given text sequence."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

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
    tok.train_from_iterator(texts, trainer=bpe_trainer(vocab_size, SPECIAL_TOKENS))
    assert tok.token_to_id(BOS) == BOS_ID and tok.token_to_id(EOS) == EOS_ID
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)]
    )
    return tok


def save_tokenizer(tok, out: Path, max_len: int) -> None:
    """``tokenizer.json`` and the small files ``AutoTokenizer`` reads beside it."""
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
    """Token ids of ``text`` as vLLM encodes a prompt with the model directory's ``tokenizer.json``."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_json)).encode(text).ids


def encode_docs(tok, texts: list[str]) -> list[list[int]]:
    """Token ids of each document, without special tokens (the stream adds them); ``tok`` is a ``Tokenizer``
    or the path of a ``tokenizer.json``."""
    if isinstance(tok, (str, Path)):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok))
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
