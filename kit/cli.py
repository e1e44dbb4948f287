"""The ``kit`` command: ``doctor``, ``compare``, ``train-tiny`` (``python -m kit ...`` works too).

Exit codes: 0 success / identical, 1 not identical or a failed run, 2 bad input (checked before
any process starts, one line on stderr).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys


def _err(msg: str) -> int:
    print(f"kit: error: {msg}", file=sys.stderr)
    return 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # exit 2 with one line, as argparse does, but in our words
        self.exit(2, f"kit: error: {message}\n")


def cmd_doctor(args) -> int:
    import psutil

    info = {"python": platform.python_version(), "platform": platform.platform(),
            "cores": len(os.sched_getaffinity(0)), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        info["cuda_available"] = torch.cuda.is_available()
    except Exception as e:
        info["torch"] = f"not importable: {e}"
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except Exception as e:
        info["vllm"] = f"not importable: {type(e).__name__}: {e}"
    info["device"] = "cuda" if info.get("cuda_available") else "cpu"
    from .patches import ENV_SELECT, SUPPORTED_VLLM, UnsupportedVllmError, apply_selected, errors, report

    info["patch_selection"] = os.environ.get(ENV_SELECT, "all")
    info["supported_vllm"] = list(SUPPORTED_VLLM)
    try:
        apply_selected()  # in this process, for every process kind, to report what applies here
    except (UnsupportedVllmError, ValueError) as e:
        info["patch_error"] = str(e)
    except Exception as e:  # apply_selected records patch failures itself; anything else is reported here
        info["patch_error"] = f"{type(e).__name__}: {e}"
    info["patches"] = report()
    info["patch_failures"] = errors()
    info["patch_docs"] = "docs/patches.md (python -m kit.patches.docs)"
    try:
        from importlib.metadata import entry_points

        eps = [e.value for e in entry_points(group="vllm.general_plugins")]
        info["plugin_entry_points"] = eps
    except Exception:
        info["plugin_entry_points"] = []
    if args.json:
        print(json.dumps(info))
        return 0
    for k, v in info.items():
        if k != "patches":
            print(f"{k:22s} {v}")
    print("\npatches (name, processes, kind, status; upstream thread):")
    for p in info["patches"]:
        procs = ",".join(p.get("processes", [])) or "?"
        print(f"  {p['name']:32s} {procs:20s} {p.get('kind', '?'):9s} {p['status']}\n"
              f"  {'':32s} {p.get('upstream', '')}")
    return 1 if info["patch_failures"] else 0


def _topology_from_args(args, **extra):
    from .topology import Spec, Topology

    return Topology(model=args.model, random_weights=args.random, seed=args.seed, pp=args.pp,
                    spec=Spec.parse(args.spec), dtype=args.dtype, enforce_eager=not args.compiled,
                    max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len, **extra)


def cmd_compare(args) -> int:
    from .compare import compare, load_prompts
    from .engine import EngineError
    from .topology import TopologyError

    try:
        if args.max_tokens < 1:
            raise TopologyError(f"--max-tokens must be >= 1, got {args.max_tokens}")
        topo = _topology_from_args(args)
        if args.max_tokens >= topo.model_len:
            raise TopologyError(f"--max-tokens {args.max_tokens} exceeds the model length {topo.model_len}")
        prompts = load_prompts(args.prompts, limit=args.limit)
    except (TopologyError, ValueError) as e:
        return _err(str(e))
    try:
        c = compare(topo, prompts, max_tokens=args.max_tokens, timeout=args.timeout)
    except EngineError as e:
        print(f"kit: engine failed: {e}", file=sys.stderr)
        if args.json:
            print(json.dumps({"identical": False, "error": str(e), "topology": topo.describe()}))
        return 1
    d = c.to_dict()
    if not args.json or args.verbose:
        print(f"reference : {topo.reference().label()}  ({d['seconds']['reference']:.1f} s)")
        print(f"run       : {topo.label()}  ({d['seconds']['run']:.1f} s)")
        print(f"prompts   : {d['num_prompts']} x {args.max_tokens} tokens")
        print(f"identical : {d['identical']}")
        if d["first_divergence"]:
            print(f"divergence: {d['first_divergence']}")
        a = d["acceptance"]
        print(f"acceptance: drafts={a['num_drafts']} draft_tokens={a['num_draft_tokens']} "
              f"accepted={a['num_accepted_tokens']} per_position={a['per_position']} "
              f"mean_len={a['mean_acceptance_length']}")
    if args.json:
        print(json.dumps(d))
    return 0 if d["identical"] else 1


def cmd_train_tiny(args, rest: list[str]) -> int:
    from . import tinymodel

    return tinymodel.main(rest) or 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kit", description="ppmtp-kit: PP + speculative decoding on real vLLM")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    d = sub.add_parser("doctor", help="versions, device, cores, memory and patch status")
    d.add_argument("--json", action="store_true")

    c = sub.add_parser("compare", help="a topology's greedy tokens against the PP=1 no-spec reference")
    c.add_argument("--model", default="tiny-mimo", help="a model under data/models/ or a path")
    c.add_argument("--random", action="store_true", help="seeded random weights (normal init) instead of trained")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--pp", type=int, default=2)
    c.add_argument("--spec", default=None, help="METHOD:K, e.g. mtp:2, eagle3:2, ngram:3, or none")
    c.add_argument("--prompts", default=None, help="JSONL file of {\"prompt\": ...}; default data/prompts/default.jsonl")
    c.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    c.add_argument("--max-tokens", type=int, default=32)
    c.add_argument("--dtype", default="float32")
    c.add_argument("--compiled", action="store_true", help="torch.compile instead of enforce_eager")
    c.add_argument("--max-num-seqs", type=int, default=None)
    c.add_argument("--max-model-len", type=int, default=None)
    c.add_argument("--timeout", type=float, default=900.0, help="seconds per engine run")
    c.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    c.add_argument("--verbose", action="store_true")

    sub.add_parser("train-tiny", help="train the tiny-mimo checkpoint (see kit.tinymodel)", add_help=False)
    sub.add_parser("report", help="execute the notebooks headless and write reports/index.html", add_help=False)
    sub.add_parser("bench", help="start-up, TTFT, decode speed, acceptance and memory per topology", add_help=False)
    sub.add_parser("pd", help="producer PP+MTP hands KV to a consumer; compare with the reference", add_help=False)
    sub.add_parser("matrix", help="run the correctness matrix and print a markdown table", add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "train-tiny":
        return cmd_train_tiny(None, argv[1:])
    if argv and argv[0] == "report":
        from .report import main as report_main

        return report_main(argv[1:])
    if argv and argv[0] == "bench":
        from .bench import main as bench_main

        return bench_main(argv[1:])
    if argv and argv[0] == "pd":
        from .pd import main as pd_main

        return pd_main(argv[1:])
    if argv and argv[0] == "matrix":
        from .matrix import main as matrix_main

        return matrix_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.cmd == "doctor":
        return cmd_doctor(args)
    if args.cmd == "compare":
        return cmd_compare(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
