"""``mimo-py-18m``: a MiMo-layout model with one MTP layer, trained on Python source, large enough to time.

``tiny-mimo`` (1.6 M parameters) is so small that vLLM's fixed per-step cost dominates a decode step;
this model (17.8 M parameters, 8 layers, hidden 384) makes the forward itself cost several
milliseconds on a 2-core CPU. It is the same architecture and the same vLLM classes as ``tiny-mimo``
(``MiMoForCausalLM`` + ``MiMoMTP``): :class:`kit.tinymodel.TinyMiMo` with the :data:`PRESET` config,
trained by :func:`kit.tinymodel.train_steps` on the Python-source corpus of :mod:`kit.pycorpus`
(standard library + installed packages, deduplicated, ~2 % of files held out) with ``tiny-mimo``'s
tokenizer (byte-level BPE, vocab 2048, trained on the standard library) copied unchanged.

It trains on a GPU (plain PyTorch, bfloat16 autocast, float32 master weights) or on the CPU, and never
imports vLLM. Weights are stored in bfloat16 (the kit computes in float32; vLLM upcasts on load), and
the evaluation in the manifest is of the stored (rounded) weights. ``--shard-mb`` writes the weights in
pieces that travel (and ``merge`` joins them into the ``model.safetensors`` the kit reads).

Command line::

    python -m kit.pymimo train --corpus PACK [--out DIR] [--device cuda|cpu] [--steps N] [--quick]
    python -m kit.pymimo merge DIR        # shards -> model.safetensors, weights.json, manifest sha256
    python -m kit.pymimo forward-time [--model DIR] [--threads 1 2]   # PyTorch batch-1 decode forward, CPU
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

from . import pycorpus
from . import tinymodel as tm

REPO_ROOT = tm.REPO_ROOT
NAME = "mimo-py-18m"
DEFAULT_OUT = REPO_ROOT / "data" / "models" / NAME
TOKENIZER_FROM = REPO_ROOT / "data" / "models" / "tiny-mimo"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")

PRESET = tm.ModelConfig(vocab_size=2048, hidden_size=384, intermediate_size=1024, num_hidden_layers=8,
                        num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=2048)


def train_config(steps: int = 4500, seed: int = 0) -> tm.TrainConfig:
    """The shipped recipe: batch 64 x 512 tokens, AdamW, peak LR 1.5e-3, cosine to 10 %, drafter distillation."""
    return tm.TrainConfig(seed=seed, steps=steps, batch_size=64, seq_len=512, lr=1.5e-3, min_lr_ratio=0.1,
                          warmup_steps=200, weight_decay=0.1, grad_clip=1.0, mtp_weight=1.0, chain_weight=0.5,
                          distill_weight=1.0, doc_start_fraction=0.25, threads=1, log_every=100,
                          eval_batches=16, model=tm.ModelConfig(**asdict(PRESET)))


def quick_config(seed: int = 0) -> tm.TrainConfig:
    """A few CPU steps of a small model (tests)."""
    return tm.TrainConfig(seed=seed, steps=3, batch_size=2, seq_len=64, warmup_steps=1, log_every=1,
                          eval_batches=1, distill_weight=1.0,
                          model=tm.ModelConfig(vocab_size=2048, hidden_size=128, intermediate_size=256,
                                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2))


def _sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def save_weights(sd: dict, out: Path, shard_bytes: int | None) -> str:
    """Write ``sd`` (sorted names) as ``model.safetensors`` or as shards; return the sha256 of the single-file
    serialisation (what :func:`merge` must reproduce)."""
    from safetensors.torch import save, save_file

    sd = {k: sd[k] for k in sorted(sd)}
    single = save(sd, metadata={"format": "pt"})
    if not shard_bytes:
        save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
        os.chmod(out / "model.safetensors", 0o644)
        return _sha256_bytes(single)
    shards, cur, size = [], {}, 0
    for k, v in sd.items():
        n = v.numel() * v.element_size()
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += n
    shards.append(cur)
    index = {"metadata": {"single_file_sha256": _sha256_bytes(single)}, "weight_map": {}}
    for i, part in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(part, str(out / fname), metadata={"format": "pt"})
        os.chmod(out / fname, 0o644)
        index["weight_map"].update({k: fname for k in part})
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return _sha256_bytes(single)


def merge(model_dir: Path) -> str:
    """Join shards into ``model.safetensors`` (checks the sha256 recorded at training), remove the shards,
    write ``weights.json`` and the file's sha256 into ``manifest.json``."""
    from safetensors.torch import load_file, save_file

    from .models import weights_manifest_from_safetensors

    idx_path = model_dir / "model.safetensors.index.json"
    index = json.loads(idx_path.read_text())
    sd = {}
    for fname in sorted(set(index["weight_map"].values())):
        sd.update(load_file(str(model_dir / fname)))
    sd = {k: sd[k] for k in sorted(sd)}
    st = model_dir / "model.safetensors"
    save_file(sd, str(st), metadata={"format": "pt"})
    os.chmod(st, 0o644)
    sha = tm._sha256(st)
    want = index["metadata"]["single_file_sha256"]
    if sha != want:
        st.unlink()
        raise SystemExit(f"merged file sha256 {sha} != {want} recorded at training")
    for fname in set(index["weight_map"].values()):
        (model_dir / fname).unlink()
    idx_path.unlink()
    (model_dir / "weights.json").write_text(json.dumps(weights_manifest_from_safetensors(st), indent=2) + "\n")
    mpath = model_dir / "manifest.json"
    if mpath.exists():
        m = json.loads(mpath.read_text())
        m["model_safetensors_sha256"] = sha
        m.pop("shards", None)
        mpath.write_text(json.dumps(m, indent=2) + "\n")
    return sha


def _device_info(device: str) -> dict:
    import platform

    import torch

    info = {"device": device, "torch_version": torch.__version__, "python_version": platform.python_version(),
            "cpu_count": os.cpu_count()}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def simulated_acceptance(model, tokenizer_json: Path, prompts: list[str], ks=(1, 2, 3), max_tokens: int = 64) -> dict:
    """What vLLM's MTP counters should read for greedy decoding of ``prompts`` (PyTorch, CPU, float32):
    :func:`kit.tinymodel.simulate_spec` on the PyTorch greedy outputs. Position 1 matched vLLM exactly for
    tiny-mimo; later positions were within a few counts."""
    outs = []
    for p in prompts:
        ids = tm.encode_prompt(tokenizer_json, p)
        outs.append((ids, tm.greedy_generate(model, ids, max_tokens)["tokens"]))
    res = {}
    for k in ks:
        sims = [tm.simulate_spec(model, ids, o, k) for ids, o in outs]
        drafts = sum(x["drafts"] for x in sims)
        per_pos = [sum(x["accepted_per_pos"][i] for x in sims) for i in range(k)]
        res[f"k{k}"] = {"drafts": drafts, "accepted_per_pos": per_pos,
                        "rate_per_pos": [round(a / max(1, drafts), 4) for a in per_pos],
                        "mean_acceptance_length": round(1 + sum(per_pos) / max(1, drafts), 4)}
    return {"n_prompts": len(prompts), "max_tokens": max_tokens, **res}


def train(tc: tm.TrainConfig, corpus: Path, out: Path, device: str = "cpu", shard_bytes: int | None = None,
          command: str | None = None, sim_prompts: Path | None = None, log=print) -> dict:
    """Encode the pack with tiny-mimo's tokenizer, train trunk + MTP jointly, write the model directory."""
    t_start = time.time()
    os.environ.setdefault("RAYON_NUM_THREADS", str(max(1, os.cpu_count() or 1)))
    import torch
    from tokenizers import Tokenizer

    on_gpu = device.startswith("cuda")
    if on_gpu:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch.set_num_threads(tc.threads)
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(tc.seed)
    out.mkdir(parents=True, exist_ok=True)
    mc = tc.model

    train_docs, val_docs = pycorpus.read_pack(corpus)
    if tc.max_corpus_files is not None:
        train_docs, val_docs = train_docs[: tc.max_corpus_files], val_docs[: max(1, tc.max_corpus_files // 8)]
    for f in TOKENIZER_FILES:
        shutil.copy2(TOKENIZER_FROM / f, out / f)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == mc.vocab_size, (tok.get_vocab_size(), mc.vocab_size)
    t0 = time.time()
    enc = lambda docs: [e.ids for e in tok.encode_batch([d.text for d in docs], add_special_tokens=False)]  # noqa: E731
    train_stream = tm.TokenStream(enc(train_docs))
    val_stream = tm.TokenStream(enc(val_docs))
    log(f"corpus: {len(train_docs)} train files, {len(train_stream)} tokens; {len(val_docs)} held-out files, "
        f"{len(val_stream)} tokens (encoded in {time.time() - t0:.1f}s)")

    model = tm.TinyMiMo(mc)
    model.init_weights(tc.seed)
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters on {device}")
    t_train = time.time()
    history, rec, ema = tm.train_steps(model, train_stream, tc, log,
                                       autocast_dtype=torch.bfloat16 if on_gpu else None)
    if on_gpu:
        torch.cuda.synchronize()
    train_seconds = time.time() - t_train

    # Store bfloat16; evaluate what is stored (rounded back to float32, as the kit and vLLM compute).
    sd = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.load_state_dict({k: v.float() for k, v in sd.items()})
    ev = tm.evaluate(model, val_stream, tc)
    log("eval (stored bf16 weights): " + json.dumps(ev))
    sim = None
    if sim_prompts:
        t0 = time.time()
        sim = simulated_acceptance(model.to("cpu").eval(), out / "tokenizer.json", tm.read_prompts(sim_prompts))
        sim["prompts"] = Path(sim_prompts).name
        sim["seconds"] = round(time.time() - t0, 1)
        log("simulated acceptance: " + json.dumps(sim))
    (out / "config.json").write_text(json.dumps(tm.hf_config(mc), indent=2) + "\n")
    sha = save_weights(sd, out, shard_bytes)
    if not shard_bytes:
        from .models import weights_manifest_from_safetensors

        (out / "weights.json").write_text(
            json.dumps(weights_manifest_from_safetensors(out / "model.safetensors"), indent=2) + "\n")
    pack_manifest = Path(str(corpus) + ".manifest.json")
    manifest = {
        "name": out.name,
        "command": command,
        "seed": tc.seed,
        "steps": tc.steps,
        "train_config": {k: v for k, v in asdict(tc).items() if k != "model"},
        "model_config": asdict(mc),
        "num_parameters": n_params,
        "storage_dtype": "bfloat16",
        "compute": "bfloat16 autocast, float32 master weights" if on_gpu else "float32",
        "corpus": {
            "pack": corpus.name,
            "pack_sha256": tm._sha256(corpus),
            "pack_manifest": json.loads(pack_manifest.read_text()) if pack_manifest.exists() else None,
            "train_files": len(train_docs), "train_tokens": len(train_stream),
            "val_files": len(val_docs), "val_tokens": len(val_stream),
        },
        "tokenizer": {"copied_from": "data/models/tiny-mimo", "vocab_size": mc.vocab_size,
                      "sha256_tokenizer_json": tm._sha256(out / "tokenizer.json")},
        "tokens_seen": tc.steps * tc.batch_size * tc.seq_len,
        **{f"final_{k}_loss": v for k, v in rec.items()},
        **{f"final_{k}_loss_ema": v for k, v in ema.items()},
        **ev,
        "simulated_acceptance": sim,
        "loss_history": history,
        "model_safetensors_sha256": sha,
        **_device_info(device),
        "train_seconds": round(train_seconds, 1),
        "wall_seconds": round(time.time() - t_start, 1),
    }
    if shard_bytes:
        manifest["shards"] = "model-*.safetensors; run `python -m kit.pymimo merge DIR`"
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {out} in {manifest['wall_seconds']}s; model.safetensors sha256 {sha[:16]}")
    return manifest


def forward_time(model_dir: Path, threads: int, repeats: int = 200, position: int = 64) -> dict:
    """Seconds for one batch-1 decode forward of the PyTorch model (float32, CPU, ``threads`` intra-op threads):
    one token through embedding, every trunk layer, the final norm and the LM head, and separately through
    the MTP layer and the LM head (one draft step). Attention sees the token alone (no KV cache), which
    leaves out the attention over the context: small next to the layers' matrix-vector products at the
    context lengths the kit uses (a few hundred tokens, head_dim 64). Min and median of ``repeats``."""
    import statistics

    import torch

    torch.set_num_threads(threads)
    model = tm.load_model(model_dir)
    x, pos = torch.tensor([[5]]), torch.tensor([position])
    out: dict = {"threads": threads, "repeats": repeats}
    with torch.inference_mode():
        h = model.hidden(x, pos)
        for name, fn in (("trunk", lambda: model.logits(model.hidden(x, pos))),
                         ("mtp_draft", lambda: model.mtp_logits(model.mtp_hidden(h, x, pos)))):
            for _ in range(10):
                fn()
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            out[name] = {"min_ms": round(1e3 * min(ts), 3), "median_ms": round(1e3 * statistics.median(ts), 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="kit.pymimo", description="Train mimo-py-18m (GPU or CPU; no vLLM needed).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--corpus", default=str(pycorpus.DEFAULT_PACK), help="pack from `python -m kit.pycorpus build`")
    t.add_argument("--out", default=str(DEFAULT_OUT.relative_to(REPO_ROOT)))
    t.add_argument("--device", default="cpu", help="cpu or cuda")
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--quick", action="store_true", help="a few CPU steps of a small model on a few files (tests)")
    t.add_argument("--shard-mb", type=float, default=None, help="write the weights as shards of at most this size")
    t.add_argument("--simulate", default=None, metavar="PROMPTS",
                   help="after training, simulate MTP acceptance (k 1..3, 64 greedy tokens) on this prompt file")
    m = sub.add_parser("merge")
    m.add_argument("dir")
    f = sub.add_parser("forward-time", help="time one batch-1 decode forward of the PyTorch model (float32, CPU)")
    f.add_argument("--model", default=str(DEFAULT_OUT))
    f.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    f.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args(argv)
    if args.cmd == "merge":
        print(merge(Path(args.dir)))
        return 0
    if args.cmd == "forward-time":
        for n in args.threads:
            print(json.dumps(forward_time(Path(args.model), n, args.repeats)))
        return 0
    corpus = Path(args.corpus)
    if not corpus.is_file():
        print(f"kit.pymimo: error: no corpus pack at {corpus} (run: python -m kit.pycorpus build)", file=sys.stderr)
        return 2
    if args.device not in ("cpu", "cuda"):
        print(f"kit.pymimo: error: --device must be cpu or cuda, got {args.device!r}", file=sys.stderr)
        return 2
    tc = quick_config(args.seed) if args.quick else train_config(seed=args.seed)
    if args.quick:
        tc.max_corpus_files = 24
    if args.steps is not None:
        tc.steps = args.steps
    out = Path(args.out)
    if not out.is_absolute():
        out = REPO_ROOT / out
    shard = int(args.shard_mb * 2**20) if args.shard_mb else None
    man = train(tc, corpus, out, args.device, shard, command="python -m kit.pymimo " + " ".join(argv),
                sim_prompts=Path(args.simulate) if args.simulate else None)
    print(json.dumps({k: man[k] for k in man if k.startswith(("final_", "val_"))}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
