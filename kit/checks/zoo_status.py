"""Does vLLM start each zoo model at PP=1 with its drafter? The observed rows of ``data/models/README.md``.

``kit zoo-status [--write]`` starts every zoo model (seeded random weights) with its drafter on a
fresh engine, greedy, 2 prompts x 16 tokens, and prints one markdown row each: the settings tried, whether
the engine started and generated, the speculative-decoding counters, and otherwise the exception line from
the root cause. ``--write`` replaces the block between the ``zoo-status`` markers in ``data/models/README.md``.
"""
from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field

from kit.checks.compare import load_prompts
from kit.core.models import DATA_DIR
from kit.core.results import machine
from kit.core.topology import Topology
from kit.engine import EngineError, generate

README = DATA_DIR / "models" / "README.md"
BEGIN, END = "<!-- zoo-status:begin -->", "<!-- zoo-status:end -->"


@dataclass(frozen=True)
class Probe:
    model: str
    spec: str
    family: str
    dtype: str = "float32"
    extra: dict = field(default_factory=dict)
    why: str = ""


PROBES = [
    Probe("tiny-deepseek-v3", "mtp:1", "DeepSeek-V3 MLA + `deepseek_mtp`"),
    Probe("tiny-deepseek-v3", "mtp:1", "DeepSeek-V3 MLA + `deepseek_mtp`", dtype="bfloat16",
          why="the CPU MLA backend was seen in bf16 (docs/cpu-notes.md#other-drafter-families-on-cpu)"),
    Probe("tiny-llama-swa", "eagle3:1", "Llama sliding/full `layer_types` + `llama_eagle3`"),
    Probe("tiny-glm4-moe", "mtp:1", "GLM-4 MoE + `glm4_moe_mtp`"),
    Probe("tiny-qwen3_5", "mtp:1", "Qwen3.5 Gated-DeltaNet hybrid + `qwen3_5_mtp`", dtype="bfloat16",
          extra={"enable_prefix_caching": False},
          why="the CPU GDN kernel needs bf16; prefix caching off (mamba align mode + spec decode)"),
]


def _last_exception(msg: str) -> str:
    lines = [l.strip() for l in msg.splitlines() if l.strip()]
    exc = [l for l in lines if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", l)]
    return (exc[-1] if exc else lines[-1] if lines else msg)[:220]


def probe(p: Probe, timeout: float = 600.0) -> dict:
    t = Topology(model=p.model, random_weights=True, pp=1, spec=p.spec, dtype=p.dtype, extra_engine_args=p.extra)
    t0 = time.monotonic()
    try:
        r = generate(t, load_prompts(limit=2), max_tokens=16, timeout=timeout)
        s = r.spec
        return {"ok": True, "seconds": round(time.monotonic() - t0),
                "result": f"starts and generates 2x16 tokens; {s.num_drafts} drafts, {s.num_draft_tokens} draft "
                          f"tokens, {s.num_accepted_tokens} accepted"}
    except EngineError as e:
        return {"ok": False, "seconds": round(time.monotonic() - t0), "result": f"fails: `{_last_exception(str(e))}`",
                "error": str(e)}


def table(rows: list[tuple[Probe, dict]]) -> str:
    out = [f"Observed {time.strftime('%Y-%m-%d')} on {machine(python=True)} with `kit zoo-status` (vLLM 0.32.0 CPU, PP=1, eager, "
           "seeded random weights, greedy, 2 prompts x 16 tokens, the kit's patches on):", "",
           "| model | family | spec | dtype / settings | result |", "|---|---|---|---|---|"]
    for p, r in rows:
        settings = p.dtype + ("".join(f", {k}={v}" for k, v in p.extra.items()))
        out.append(f"| {p.model} | {p.family} | {p.spec} | {settings} | {r['result']} |")
    return "\n".join(out)


def write_readme(text: str) -> None:
    old = README.read_text()
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in old:
        new = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, old, flags=re.S)
    else:
        new = old.rstrip() + "\n\n## Zoo: does vLLM 0.32 CPU start each family at PP=1 with its drafter?\n\n" + block + "\n"
    README.write_text(new)


def main(argv: list[str] | None = None) -> int:
    from kit.core.flags import Parser  # one-line errors, exit 2

    ap = Parser(prog="kit zoo-status", description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="only models whose name contains this")
    ap.add_argument("--write", action="store_true", help="write the table into data/models/README.md")
    args = ap.parse_args(argv)
    rows = []
    for p in PROBES:
        if args.only in p.model:
            r = probe(p)
            print(f"[zoo] {p.model} {p.spec} {p.dtype}: {r['result']} ({r['seconds']} s)", flush=True)
            if not r["ok"]:
                print("       " + r["error"].replace("\n", "\n       "), flush=True)
            rows.append((p, r))
    text = table(rows)
    print(text)
    if args.write:
        write_readme(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
