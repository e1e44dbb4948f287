"""The PD results table of the README: producer -> consumer pairs on trained tiny-mimo, against the colocated engine.

Usage: ``.venv/bin/python scripts/pd_check.py [--prompts FILE] [--limit N] [--max-tokens N] [--only SUBSTR]
[--jsonl runs/pd.jsonl]``. Runs one pair at a time (real servers, NIXL), then the colocated PP=1 + ``mtp:2``
engine on the same prompts for the acceptance comparison, and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kit import pd  # noqa: E402
from kit.compare import load_prompts  # noqa: E402
from kit.engine import generate  # noqa: E402

# (producer pp, producer spec, consumer pp, consumer spec)
PAIRS = [
    (2, "mtp:2", 1, "mtp:2"),   # the seed scenario, MTP on both sides
    (1, "mtp:2", 1, "mtp:2"),
    (1, "mtp:2", 2, "mtp:2"),   # decode-side PP + MTP: allowed with the kit's fix
    (2, "mtp:2", 1, None),
    (1, None, 1, "mtp:2"),      # the producer has no MTP layer: its KV cannot arrive
]


def _spec(s: dict | None) -> str:
    if not s:
        return "-"
    return f"{s['num_drafts']} / {s['num_draft_tokens']} / {s['num_accepted_tokens']} {s['per_position']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-mimo")
    ap.add_argument("--prompts", default=None)
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--only", default="")
    ap.add_argument("--jsonl", default=None)
    args = ap.parse_args(argv)
    prompts = load_prompts(args.prompts, limit=args.limit)
    rows = []
    ref = None
    colocated = {}
    for ppp, ps, cpp, cs in PAIRS:
        label = f"P pp{ppp} {ps or 'no-spec'} -> C pp{cpp} {cs or 'no-spec'}"
        if args.only not in label:
            continue
        p, c = pd.pd_topologies(args.model, ppp, ps, cpp, cs)
        if ref is None:
            ref = generate(c.reference(), prompts, max_tokens=args.max_tokens, top2=True)
        t0 = time.monotonic()
        try:
            d = pd.pd_compare(p, c, prompts, max_tokens=args.max_tokens, reference=ref)
        except Exception as e:  # noqa: BLE001 - a failed pair is a row
            rows.append(f"| {label} | **ERROR** {str(e).splitlines()[0][:160]} |||||||")
            print(rows[-1], flush=True)
            continue
        if cs and cs not in colocated:
            colocated[cs] = generate(c.with_(pp=1), prompts, max_tokens=args.max_tokens).spec.to_dict()
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps({"pair": label, **{k: v for k, v in d.items() if k != "reference_tokens"}}) + "\n")
        rows.append(f"| {label} | {d['connector']} | {'yes' if d['identical'] else '**NO** ' + str(d['first_divergence'])} "
                    f"| {d['consumer_prefill_tokens_computed']} | {d['kv_bytes_transferred']} / {d['kv_bytes_expected']} "
                    f"| {len(d['kv_expected']['layers'])} | {_spec(d['consumer_spec'])} "
                    f"| {_spec(colocated.get(cs)) if cs else '-'} | {round(time.monotonic() - t0)} |")
        print(rows[-1], flush=True)
    print(f"\n{len(prompts)} prompts x {args.max_tokens} tokens ({args.prompts or 'data/prompts/default.jsonl'})\n")
    print("| pair | connector | identical | consumer prefill tokens computed | KV bytes measured / expected "
          "| KV layers moved | consumer drafts / draft tokens / accepted [per pos] | colocated PP=1 same spec | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
