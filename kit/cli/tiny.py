"""``kit tiny``: train the tiny models, check them against vLLM, build the Python-source corpus.

::

    kit train tiny-mimo [--out DIR] [--seed N] [--steps N] [--quick] [--threads N]
    kit train tiny-deepseek [--out DIR] [--seed N] [--steps N] [--quick] [--no-q-rope]
    kit train tiny-qwen3_5 [--out DIR] [--seed N] [--steps N] [--quick]
    kit train tiny-llama-swa [--out DIR] [--seed N] [--steps N] [--quick]   # and its Eagle3 drafter (DIR-eagle3)
    kit train mimo-py-18m --corpus PACK [--out DIR] [--device cpu|cuda] [--steps N] [--quick]
                                         [--shard-mb MB] [--simulate PROMPTS]
    kit tiny parity [--model M] [--prompts FILE ...] [--n N] [--max-tokens 32] [--patches SEL]
    kit tiny acceptance [--model M] [--prompts FILE ...] [--k 1 2 3] [--max-tokens 64] [--patches SEL]
    kit tiny merge DIR                 # shards -> model.safetensors, weights.json, manifest sha256
    kit tiny forward-time [--model M] [--threads 1 2]
    kit tiny corpus build [--out PACK] [--package-cap-mb 6]
    kit tiny corpus prompts --corpus PACK --out FILE [--n 16]

``kit train MODEL ...`` is ``kit train MODEL ...``. ``parity`` and ``acceptance`` start vLLM
(CPU, PP=1) through :mod:`kit.engine`; ``--patches`` loads a ``KIT_PATCHES`` selection (default: stock vLLM).
Training never imports vLLM. Bad input: one line on stderr and exit 2.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from kit.core.flags import Parser
from kit.core.models import REPO_ROOT, ModelError, resolve_model
from kit.core.validate import arg_count, arg_seed
from kit.zoo.tiny import config, trainers
from kit.zoo.tiny.pycorpus import DEFAULT_PACK, DEFAULT_PACKAGE_CAP

TRAINED = {"tiny-mimo": trainers.TINY_MIMO_DIR, "tiny-deepseek": trainers.TINY_DEEPSEEK_DIR,
           "tiny-qwen3_5": trainers.TINY_QWEN_DIR, "tiny-llama-swa": trainers.TINY_LLAMA_DIR,
           "mimo-py-18m": trainers.MIMO_PY_DIR}
PROG = "kit.zoo.tiny"


def _out(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO_ROOT))


def build_parser() -> Parser:
    ap = Parser(prog=PROG, description="Train the tiny models, check them against vLLM, build their corpus.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    tr = sub.add_parser("train", help="train a tiny model (CPU; mimo-py-18m also on a GPU)")
    models = tr.add_subparsers(dest="model", required=True, parser_class=Parser, metavar="MODEL")
    for name, text in (("tiny-mimo", "tiny-mimo: MiMo + MTP on the standard library, its own BPE tokenizer"),
                       ("tiny-deepseek", "tiny-deepseek-v3-trained: the zoo's DeepSeek-V3 + MTP, trained"),
                       ("tiny-qwen3_5", "tiny-qwen3_5-trained: the zoo's Qwen3.5 Gated-DeltaNet hybrid + MTP, trained"),
                       ("tiny-llama-swa", "tiny-llama-swa-trained: the zoo's sliding/full Llama and its Eagle3 drafter "
                                          "(written to OUT-eagle3), trained"),
                       ("mimo-py-18m", "mimo-py-18m: MiMo + MTP, 17.8 M parameters, on the Python-source pack")):
        t = models.add_parser(name, help=text, description=text)
        t.add_argument("--out", default=_rel(TRAINED[name]), help="model directory (relative to the repo)")
        t.add_argument("--seed", type=arg_seed, default=0)
        t.add_argument("--steps", type=arg_count, default=None, help="override the recipe's step count")
        t.add_argument("--quick", action="store_true", help="few-step smoke run on a small corpus (tests)")
    models.choices["tiny-mimo"].add_argument("--threads", type=arg_count, default=config.TrainConfig.threads,
                                             help="torch intra-op threads (default 1; part of the reproducible recipe)")
    models.choices["tiny-deepseek"].add_argument(
        "--no-q-rope", dest="q_rope", action="store_false",
        help="hold q's rope rows at 0 (matches stock vLLM's CPU MLA rope; see kit.zoo.tiny.deepseek.NO_Q_ROPE_NOTE)")
    py = models.choices["mimo-py-18m"]
    py.add_argument("--corpus", default=str(DEFAULT_PACK), help="pack from `kit tiny corpus build`")
    py.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    py.add_argument("--shard-mb", type=float, default=None, help="write the weights as shards of at most this size")
    py.add_argument("--simulate", default=None, metavar="PROMPTS",
                    help="after training, simulate MTP acceptance (k 1..3, 64 greedy tokens) on this prompt file")

    for name, text in (("parity", "greedy tokens of the PyTorch model vs vLLM (PP=1, no speculation)"),
                       ("acceptance", "vLLM's MTP acceptance per prompt file vs the PyTorch drafter's prediction")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--model", default="tiny-mimo", help="a model under data/models/ or a directory")
        p.add_argument("--prompts", nargs="+", default=[str(config.PROMPTS_DIR / "default.jsonl")],
                       help='JSONL files of {"prompt": ...}; acceptance reports each file as a set')
        p.add_argument("--n", type=arg_count, default=None, help="use the first N prompts of each file")
        p.add_argument("--max-tokens", type=arg_count, default=32 if name == "parity" else 64)
        p.add_argument("--patches", default=None, help="KIT_PATCHES selection to load in vLLM (default: none, "
                       "stock vLLM); cpu_rope_layout for tiny-deepseek-v3-trained, qwen_vl_no_torchvision for "
                       "tiny-qwen3_5-trained (plus cpu_gdn_spec_conv_window for acceptance)")
        p.add_argument("--timeout", type=float, default=900.0, help="seconds for the vLLM run")
        p.add_argument("--json", default=None, help="also write the result here")
        if name == "acceptance":
            p.add_argument("--k", type=int, nargs="+", default=[1], help="MTP draft lengths, one engine each")

    m = sub.add_parser("merge", help="join the shards of a trained model directory into model.safetensors")
    m.add_argument("dir")
    f = sub.add_parser("forward-time", help="time one batch-1 decode forward of the PyTorch model (float32, CPU)")
    f.add_argument("--model", default="mimo-py-18m")
    f.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    f.add_argument("--repeats", type=int, default=200)

    c = sub.add_parser("corpus", help="the Python-source corpus pack of mimo-py-18m")
    cs = c.add_subparsers(dest="corpus_cmd", required=True, parser_class=Parser)
    b = cs.add_parser("build", help="collect, deduplicate, split and write the pack")
    b.add_argument("--out", default=str(DEFAULT_PACK))
    b.add_argument("--package-cap-mb", type=float, default=DEFAULT_PACKAGE_CAP / 1e6)
    b.add_argument("--max-files", type=int, default=None)
    pr = cs.add_parser("prompts", help="held-out code prompts (JSON lines) from a pack")
    pr.add_argument("--corpus", default=str(DEFAULT_PACK))
    pr.add_argument("--out", required=True)
    pr.add_argument("--n", type=arg_count, default=16)
    return ap


def _train(a, argv: list[str]) -> int:
    command = ("kit tiny " + " ".join(argv)).strip()
    out = _out(a.out)
    if a.model == "tiny-mimo":
        tc = config.tiny_mimo_config(a.quick, a.seed)
        tc.threads = a.threads
    elif a.model == "tiny-deepseek":
        tc = config.tiny_deepseek_config(a.quick, a.seed)
    elif a.model == "tiny-qwen3_5":
        tc = config.tiny_qwen3_5_config(a.quick, a.seed)
    elif a.model == "tiny-llama-swa":
        tc = config.tiny_llama_swa_config(a.quick, a.seed)
    else:
        tc = config.mimo_py_config(a.quick, a.seed)
    if a.steps is not None:
        tc.steps = a.steps
    if a.model == "tiny-mimo":
        m = trainers.train_tiny_mimo(tc, out, command=command)
    elif a.model == "tiny-deepseek":
        m = trainers.train_tiny_deepseek(tc, out, command=command, q_rope=a.q_rope)
    elif a.model == "tiny-qwen3_5":
        m = trainers.train_tiny_qwen3_5(tc, out, command=command)
    elif a.model == "tiny-llama-swa":
        m = trainers.train_tiny_llama_eagle3(tc, out, command=command)
    else:
        shard = int(a.shard_mb * 2**20) if a.shard_mb else None
        m = trainers.train_mimo_py(tc, Path(a.corpus), out, a.device, shard, command=command,
                                   sim_prompts=Path(a.simulate) if a.simulate else None)
    print(json.dumps({k: m[k] for k in m if k.startswith(("final_", "val_"))}, indent=2))
    return 0


def _check(a) -> int:
    from kit.checks.parity import acceptance_sets, parity_check
    from kit.core.prompts import load_prompts

    model = resolve_model(a.model).path
    sets = {Path(f).stem: load_prompts(f, a.n) for f in a.prompts}
    if a.cmd == "parity":
        res = parity_check(model, [p for ps in sets.values() for p in ps], a.max_tokens, a.patches, a.timeout)
        rc = 0 if res["ok"] else 1
    else:
        res = {"prompt_files": a.prompts, "kit_patches": a.patches,
               "runs": [acceptance_sets(model, sets, k, a.max_tokens, a.patches, a.timeout) for k in a.k]}
        rc = 0
    text = json.dumps(res, indent=2)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)
    return rc


def _corpus(a) -> int:
    from kit.zoo.tiny import pycorpus

    if a.corpus_cmd == "build":
        sources = pycorpus.default_sources()
        cap = int(a.package_cap_mb * 1e6)
        docs, stats = pycorpus.collect(sources, cap, a.max_files)
        m = pycorpus.write_pack(docs, Path(a.out), stats, sources, cap)
        print(json.dumps({k: v for k, v in m.items() if k != "largest_packages_bytes"}, indent=2))
        return 0
    train, val = pycorpus.read_pack(a.corpus)
    rows = pycorpus.heldout_prompts(train, val, a.n)
    Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts from {len(val)} held-out files to {a.out}")
    return 0


def _bad_input(a) -> str | None:
    """What is wrong with the arguments, checked before anything runs (one line), or ``None``."""
    from kit.core.topology import TopologyError

    pack = getattr(a, "corpus", None)
    if (a.cmd, getattr(a, "model", None)) == ("train", "mimo-py-18m") or getattr(a, "corpus_cmd", None) == "prompts":
        if not Path(pack).is_file():
            return f"no corpus pack at {pack} (run: kit tiny corpus build)"
    if a.cmd in ("parity", "acceptance", "forward-time"):
        try:
            resolve_model(a.model)
            if a.cmd != "forward-time":
                from kit.core.prompts import load_prompts

                for f in a.prompts:
                    load_prompts(f)
        except (ModelError, TopologyError) as e:
            return str(e)
        if a.cmd != "forward-time" and (a.max_tokens < 1 or (a.n is not None and a.n < 1)):
            return "--max-tokens and --n must be >= 1"
    if a.cmd == "merge" and not (Path(a.dir) / "model.safetensors.index.json").is_file():
        return f"{a.dir} holds no model.safetensors.index.json (nothing to merge)"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    err = _bad_input(a)
    if err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    if a.cmd == "train":
        return _train(a, argv)
    if a.cmd in ("parity", "acceptance"):
        return _check(a)
    if a.cmd == "merge":
        from kit.zoo.tiny.checkpoint import merge

        print(merge(Path(a.dir)))
        return 0
    if a.cmd == "forward-time":
        from kit.zoo.tiny.checkpoint import load_model
        from kit.zoo.tiny.decode import forward_time

        model = load_model(resolve_model(a.model).path)
        for n in a.threads:
            print(json.dumps(forward_time(model, n, a.repeats)))
        return 0
    return _corpus(a)


if __name__ == "__main__":
    sys.exit(main())
