"""The five shipped trainers, each a corpus, a tokenizer, a model and :func:`kit.zoo.tiny.train.fit`:

- ``tiny-mimo`` (:func:`train_tiny_mimo`): a byte-level BPE trained here on the standard-library corpus
  (:mod:`kit.zoo.tiny.corpus`), :class:`~kit.zoo.tiny.mimo.TinyMiMo` at the default :class:`~kit.zoo.tiny.config.ModelConfig`.
- ``tiny-deepseek-v3-trained`` (:func:`train_tiny_deepseek`): the zoo's ``tiny-deepseek-v3`` (config, tokenizer,
  ``weights.json`` copied unchanged) trained on the same corpus, documents joined as ``doc <|endoftext|>`` (the
  zoo tokenizer adds no BOS to prompts). The zoo model's seeded random weights give near-tie logits; trained, the
  logits are peaked, so a PP + MTP cell diverges only for reasons of speculation.
- ``tiny-qwen3_5-trained`` (:func:`train_tiny_qwen3_5`): the zoo's ``tiny-qwen3_5`` (Gated-DeltaNet hybrid) the
  same way, :class:`~kit.zoo.tiny.qwen3_5.TinyQwen3_5` (transformers' target plus the ``mtp.*`` drafter), stored in
  bfloat16 as vLLM's CPU Gated-DeltaNet kernel requires, and evaluated as stored.
- ``tiny-llama-swa-trained`` (:func:`train_tiny_llama_eagle3`): the zoo's ``tiny-llama-swa`` (sliding and full
  attention layers) and its Eagle3 drafter ``tiny-llama-swa-eagle3``, trained jointly the same way
  (:class:`~kit.zoo.tiny.llama_eagle3.TinyLlamaEagle3`); the drafter goes to ``tiny-llama-swa-trained-eagle3``.
- ``mimo-py-18m`` (:func:`train_mimo_py`): the MiMo layout at :data:`~kit.zoo.tiny.config.MIMO_PY_PRESET` (17.8 M
  parameters: large enough that the forward, not vLLM's fixed per-step cost, dominates a decode step) on the
  Python-source pack of :mod:`kit.zoo.tiny.pycorpus`, with ``tiny-mimo``'s tokenizer copied unchanged. On a GPU
  (bfloat16 autocast, float32 master weights) or the CPU; weights stored in bfloat16 and evaluated as stored.

Every trainer writes a model directory vLLM loads (``config.json``, tokenizer files, ``model.safetensors``,
``weights.json``) and a ``manifest.json`` with the command, recipe, corpus, losses and sha256s. None imports vLLM.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from kit.zoo.tiny.config import EOS_ID, MODELS_DIR, DSConfig, Qwen35Config, TrainConfig, hf_config

TINY_MIMO_DIR = MODELS_DIR / "tiny-mimo"
ZOO_DEEPSEEK_DIR = MODELS_DIR / "tiny-deepseek-v3"
TINY_DEEPSEEK_DIR = MODELS_DIR / "tiny-deepseek-v3-trained"
ZOO_QWEN_DIR = MODELS_DIR / "tiny-qwen3_5"
TINY_QWEN_DIR = MODELS_DIR / "tiny-qwen3_5-trained"
MIMO_PY_DIR = MODELS_DIR / "mimo-py-18m"
ZOO_LLAMA_DIR = MODELS_DIR / "tiny-llama-swa"
ZOO_EAGLE3_DIR = MODELS_DIR / "tiny-llama-swa-eagle3"
TINY_LLAMA_DIR = MODELS_DIR / "tiny-llama-swa-trained"
# Copied unchanged from the zoo model a trained one is based on (the config and tokenizer stay the zoo's).
DEEPSEEK_COPIED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                         "special_tokens_map.json", "weights.json")
# Copied unchanged from tiny-mimo into mimo-py-18m.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def _finish(out: Path, manifest: dict, t_start: float, log) -> dict:
    manifest["wall_seconds"] = round(time.time() - t_start, 1)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {out} in {manifest['wall_seconds']}s; sha256 {manifest['model_safetensors_sha256'][:16]}")
    return manifest


def _stdlib_corpus(tc: TrainConfig):
    from kit.zoo.tiny.corpus import read_corpus

    # The tokenizers library's thread pool, sized like torch's (part of the CPU recipe).
    os.environ.setdefault("RAYON_NUM_THREADS", str(tc.threads))
    return read_corpus(tc.max_corpus_files)


def train_tiny_mimo(tc: TrainConfig, out: Path, command: str | None = None, log=print) -> dict:
    """Build the tokenizer and corpus, train trunk + MTP jointly, write the model directory."""
    from kit.zoo.tiny.checkpoint import save_checkpoint, sha256_file
    from kit.zoo.tiny.corpus import TokenStream, corpus_summary
    from kit.zoo.tiny.mimo import TinyMiMo
    from kit.zoo.tiny.tokenizer import build_tokenizer, encode_docs, save_tokenizer
    from kit.zoo.tiny.train import deterministic, evaluate, fit

    t_start = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    deterministic(tc)
    mc = tc.model
    train_files, val_files, train_texts, val_texts, corpus_sha256 = _stdlib_corpus(tc)
    t0 = time.time()
    tok = build_tokenizer(train_texts, mc.vocab_size)
    mc.vocab_size = tok.get_vocab_size()  # BPE may stop short of the target on a small corpus
    save_tokenizer(tok, out, mc.max_position_embeddings)
    t_tok = time.time() - t0
    log(f"tokenizer: vocab {mc.vocab_size}, trained on {len(train_files)} files in {t_tok:.1f}s")
    train_stream, val_stream = TokenStream(encode_docs(tok, train_texts)), TokenStream(encode_docs(tok, val_texts))
    log(f"corpus: {len(train_files)} train files, {len(train_stream)} tokens; "
        f"{len(val_files)} val files, {len(val_stream)} tokens")
    model = TinyMiMo(mc)
    run = fit(model, train_stream, tc, log)
    ev = evaluate(model, val_stream, tc)
    log("eval: " + json.dumps(ev))
    (out / "config.json").write_text(json.dumps(hf_config(mc), indent=2) + "\n")
    sha = save_checkpoint(model.state_dict(), out)
    corpus = {**corpus_summary(train_files, val_files),
              "train_files": len(train_files), "train_bytes": sum(len(t.encode()) for t in train_texts),
              "train_tokens": len(train_stream), "val_files": len(val_files),
              "val_bytes": sum(len(t.encode()) for t in val_texts), "val_tokens": len(val_stream),
              "sha256": corpus_sha256}
    manifest = {"name": out.name, "command": command, "argv": sys.argv, **run, "corpus": corpus,
                "tokenizer": {"type": "byte-level BPE (HF tokenizers)", "vocab_size": mc.vocab_size,
                              "train_seconds": round(t_tok, 1),
                              "sha256_tokenizer_json": sha256_file(out / "tokenizer.json")},
                **ev, "model_safetensors_sha256": sha}
    return _finish(out, manifest, t_start, log)


def _train_zoo(tc: TrainConfig, out: Path, zoo_dir: Path, arch_cls, make_model, command: str | None, log,
               extra: dict, store_dtype=None, also_save=None) -> dict:
    """A zoo model (config, tokenizer and ``weights.json`` copied unchanged) trained on the standard-library
    corpus, documents joined as ``doc <|endoftext|>``. ``store_dtype``: store the weights in it and evaluate
    what is stored (rounded back to float32). ``also_save(model)``: writes what else the model holds (a separate
    drafter checkpoint) and returns manifest entries."""
    import torch

    from kit.zoo.tiny.checkpoint import copy_files, save_checkpoint
    from kit.zoo.tiny.corpus import TokenStream
    from kit.zoo.tiny.tokenizer import encode_docs
    from kit.zoo.tiny.train import deterministic, evaluate, fit

    t_start = time.time()
    out = Path(out)
    deterministic(tc)
    copy_files(zoo_dir, out, DEEPSEEK_COPIED_FILES)
    c = tc.model = arch_cls.from_hf(json.loads((zoo_dir / "config.json").read_text()))
    train_files, val_files, train_texts, val_texts, corpus_sha256 = _stdlib_corpus(tc)
    tok = out / "tokenizer.json"
    eos = json.loads((zoo_dir / "generation_config.json").read_text())["eos_token_id"]
    streams = {k: TokenStream(encode_docs(tok, v), bos_id=None, eos_id=eos)
               for k, v in (("train", train_texts), ("val", val_texts))}
    log(f"corpus: {len(train_files)} train files, {len(streams['train'])} tokens; "
        f"{len(val_files)} val files, {len(streams['val'])} tokens")
    model = make_model(c)
    run = fit(model, streams["train"], tc, log)
    sd = model.checkpoint_state_dict()
    if store_dtype is not None:
        sd = {k: v.to(store_dtype) for k, v in sd.items()}
        with torch.no_grad():
            model.load_state_dict(model.from_checkpoint({k: v.float() for k, v in sd.items()}))
    ev = evaluate(model, streams["val"], tc)
    log("eval: " + json.dumps(ev))
    sha = save_checkpoint(sd, out, weights_json=False)  # weights.json: the zoo's
    if also_save is not None:
        extra = {**extra, **also_save(model)}
    manifest = {
        "name": out.name, "command": command,
        "based_on": f"data/models/{zoo_dir.name} (config.json, tokenizer and weights.json copied unchanged)",
        **run, **extra,
        "corpus": {"source": "CPython standard library *.py files (kit.zoo.tiny.corpus.corpus_files), zoo tokenizer, "
                             "documents joined as 'doc <|endoftext|>'",
                   "python_version": sys.version.split()[0],
                   "train_files": len(train_files), "train_tokens": len(streams["train"]),
                   "val_files": len(val_files), "val_tokens": len(streams["val"]), "sha256": corpus_sha256},
        **ev, "model_safetensors_sha256": sha}
    return _finish(out, manifest, t_start, log)


def train_tiny_deepseek(tc: TrainConfig, out: Path, zoo_dir: Path = ZOO_DEEPSEEK_DIR, command: str | None = None,
                        log=print, q_rope: bool = True) -> dict:
    """The zoo's DeepSeek-V3 architecture and tokenizer, trained on the standard-library corpus.
    ``q_rope=False``: q's rope rows held at 0 (:data:`kit.zoo.tiny.deepseek.NO_Q_ROPE_NOTE`)."""
    from kit.zoo.tiny.deepseek import TIED, TinyDeepseekV3

    n = json.loads((zoo_dir / "config.json").read_text())["num_hidden_layers"]
    return _train_zoo(tc, out, zoo_dir, DSConfig, lambda c: TinyDeepseekV3(c, q_rope=q_rope), command, log,
                      {"q_rope": q_rope, "tied_copies": {k.format(n=n): v for k, v in TIED.items()}})


def train_tiny_qwen3_5(tc: TrainConfig, out: Path, zoo_dir: Path = ZOO_QWEN_DIR, command: str | None = None,
                       log=print) -> dict:
    """The zoo's Qwen3.5 hybrid (Gated-DeltaNet + full attention + MTP) and tokenizer, trained on the
    standard-library corpus, stored in bfloat16 (the dtype vLLM's CPU Gated-DeltaNet kernel runs)."""
    import torch

    from kit.zoo.tiny.qwen3_5 import TinyQwen3_5

    return _train_zoo(tc, out, zoo_dir, Qwen35Config, TinyQwen3_5, command, log,
                      {"storage_dtype": "bfloat16", "compute": "float32"}, store_dtype=torch.bfloat16)


def train_tiny_llama_eagle3(tc: TrainConfig, out: Path, draft_out: Path | None = None, zoo_dir: Path = ZOO_LLAMA_DIR,
                           zoo_draft_dir: Path = ZOO_EAGLE3_DIR, command: str | None = None, log=print) -> dict:
    """The zoo's Llama with sliding/full layers and its Eagle3 drafter (configs and tokenizer copied unchanged),
    trained jointly on the standard-library corpus: the target's next-token loss, the drafter's first draft (aux
    states at t and token t+1 predict t+2) and its chained second draft. The target goes to ``out`` (with a
    ``kit.json`` naming the drafter), the drafter to ``draft_out``."""
    from kit.zoo.tiny.checkpoint import copy_files, save_checkpoint
    from kit.zoo.tiny.llama_eagle3 import LlamaSWAConfig, TinyLlamaEagle3

    out = Path(out)
    draft_out = Path(draft_out) if draft_out is not None else out.parent / f"{out.name}-eagle3"
    draft_cfg = json.loads((zoo_draft_dir / "config.json").read_text())

    arch = SimpleNamespace(from_hf=lambda c: LlamaSWAConfig.from_hf(c, draft_cfg))   # _train_zoo's arch_cls

    def save_drafter(model) -> dict:
        copy_files(zoo_draft_dir, draft_out, [f for f in DEEPSEEK_COPIED_FILES if f != "weights.json"])
        # weights.json written from the checkpoint: the zoo's lacks the embedding copy (kit.zoo.tiny.llama_eagle3)
        dsha = save_checkpoint(model.drafter_state_dict(), draft_out)
        (out / "kit.json").write_text(json.dumps({"draft_model": f"../{draft_out.name}"}, indent=2) + "\n")
        (draft_out / "manifest.json").write_text(json.dumps(
            {"name": draft_out.name, "command": command, "trained_with": out.name,
             "based_on": f"data/models/{zoo_draft_dir.name} (config.json and tokenizer copied unchanged)",
             "model_safetensors_sha256": dsha}, indent=2) + "\n")
        return {"drafter": {"dir": draft_out.name, "model_safetensors_sha256": dsha}}

    return _train_zoo(tc, out, zoo_dir, arch, TinyLlamaEagle3, command, log, {}, also_save=save_drafter)


def _device_info(device: str) -> dict:
    import platform

    import torch

    info = {"device": device, "python_version": platform.python_version(), "cpu_count": os.cpu_count()}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def train_mimo_py(tc: TrainConfig, corpus: Path, out: Path, device: str = "cpu", shard_bytes: int | None = None,
                  command: str | None = None, sim_prompts: Path | None = None, log=print) -> dict:
    """Encode the pack with tiny-mimo's tokenizer, train trunk + MTP jointly, write the model directory
    (``shard_bytes``: the weights in shards that travel; ``kit tiny merge`` joins them)."""
    os.environ.setdefault("RAYON_NUM_THREADS", str(max(1, os.cpu_count() or 1)))
    import torch

    from kit.zoo.tiny import pycorpus
    from kit.zoo.tiny.checkpoint import copy_files, save_checkpoint, sha256_file
    from kit.zoo.tiny.corpus import TokenStream
    from kit.zoo.tiny.decode import simulated_acceptance
    from kit.zoo.tiny.mimo import TinyMiMo
    from kit.zoo.tiny.tokenizer import encode_docs
    from kit.zoo.tiny.train import deterministic, evaluate, fit

    t_start = time.time()
    out = Path(out)
    deterministic(tc, device)
    mc = tc.model
    train_docs, val_docs = pycorpus.read_pack(corpus)
    if tc.max_corpus_files is not None:
        train_docs, val_docs = train_docs[: tc.max_corpus_files], val_docs[: max(1, tc.max_corpus_files // 8)]
    copy_files(TINY_MIMO_DIR, out, TOKENIZER_FILES)
    tok = out / "tokenizer.json"
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(tok)).get_vocab_size() == mc.vocab_size, "tokenizer and model vocab differ"
    t0 = time.time()
    train_stream = TokenStream(encode_docs(tok, [d.text for d in train_docs]))
    val_stream = TokenStream(encode_docs(tok, [d.text for d in val_docs]))
    log(f"corpus: {len(train_docs)} train files, {len(train_stream)} tokens; {len(val_docs)} held-out files, "
        f"{len(val_stream)} tokens (encoded in {time.time() - t0:.1f}s)")
    model = TinyMiMo(mc)
    run = fit(model, train_stream, tc, log, device)
    # Store bfloat16; evaluate what is stored (rounded back to float32, as the kit and vLLM compute).
    sd = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.load_state_dict({k: v.float() for k, v in sd.items()})
    ev = evaluate(model, val_stream, tc)
    log("eval (stored bf16 weights): " + json.dumps(ev))
    sim = None
    if sim_prompts:
        t0 = time.time()
        # A plain read: the GPU machine that trains this needs torch, tokenizers and safetensors only.
        prompts = [json.loads(x)["prompt"] for x in Path(sim_prompts).read_text().splitlines() if x.strip()]
        sim = simulated_acceptance(model.to("cpu").eval(), tok, prompts, eos_id=EOS_ID)
        sim.update(prompts=Path(sim_prompts).name, seconds=round(time.time() - t0, 1))
        log("simulated acceptance: " + json.dumps(sim))
    (out / "config.json").write_text(json.dumps(hf_config(mc), indent=2) + "\n")
    sha = save_checkpoint(sd, out, shard_bytes)
    pack_manifest = Path(str(corpus) + ".manifest.json")
    manifest = {
        "name": out.name, "command": command, **run,
        "storage_dtype": "bfloat16",
        "compute": "bfloat16 autocast, float32 master weights" if device.startswith("cuda") else "float32",
        "corpus": {"pack": corpus.name, "pack_sha256": sha256_file(corpus),
                   "pack_manifest": json.loads(pack_manifest.read_text()) if pack_manifest.exists() else None,
                   "train_files": len(train_docs), "train_tokens": len(train_stream),
                   "val_files": len(val_docs), "val_tokens": len(val_stream)},
        "tokenizer": {"copied_from": "data/models/tiny-mimo", "vocab_size": mc.vocab_size,
                      "sha256_tokenizer_json": sha256_file(tok)},
        **ev, "simulated_acceptance": sim, "model_safetensors_sha256": sha, **_device_info(device)}
    if shard_bytes:
        manifest["shards"] = "model-*.safetensors; run `kit tiny merge DIR`"
    return _finish(out, manifest, t_start, log)
