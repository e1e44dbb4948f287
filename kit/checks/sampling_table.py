"""``kit sampling-table``: sampled acceptance against theory, and the distribution checks, as one table.

Each row is one fresh engine (:func:`kit.checks.sampling.sweep_jobs`): the default prompts greedy, then sampled at each
of the row's temperatures; measured acceptance per draft position next to the sum of the target's probabilities
of the drafts. ``--write docs/results/sampling.md`` writes the tables there, headed by date, machine, versions and
the command (:mod:`kit.core.results`).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from kit.checks.compare import load_prompts
from kit.checks.sampling import distribution_check, parse_sweep, sweep_jobs
from kit.core.results import block_key, check_writable, command_line, write_block
from kit.core.topology import Spec, Topology
from kit.engine import run


@dataclass(frozen=True)
class Row:
    """One engine: a topology, the patch selection, and the temperatures sampled on it."""

    model: str
    random_weights: bool
    pp: int
    spec: str
    temperatures: tuple[float, ...]
    patches: str = "all"

    def label(self, temperature: float) -> str:
        w = "random" if self.random_weights else "trained"
        off = "" if self.patches == "all" else f" [{self.patches}]"
        return f"{self.model}-{w} PP={self.pp} {self.spec} T={temperature}{off}"

    @property
    def id(self) -> str:
        return " ".join(self.label(t) for t in self.temperatures)

    def topology(self) -> Topology:
        return Topology(model=self.model, random_weights=self.random_weights, pp=self.pp, spec=Spec.parse(self.spec))


OFF = "all,-cpu_rejection_expand"
ROWS = [
    Row("tiny-mimo", False, 1, "mtp:1", (0.05, 0.8), OFF),
    Row("tiny-mimo", False, 2, "mtp:1", (0.05,), OFF),
    Row("tiny-mimo", False, 1, "mtp:1", (0.05, 0.3, 0.8)),
    Row("tiny-mimo", False, 2, "mtp:1", (0.05, 0.8)),
    Row("tiny-mimo", False, 4, "mtp:1", (0.05, 0.8)),
    Row("tiny-mimo", False, 2, "mtp:3", (0.8,)),
    # n-gram drafts on the trained model (its text repeats enough for the n-gram proposer to find matches)
    Row("tiny-mimo", False, 1, "ngram:2", (0.3, 0.8)),
    Row("tiny-mimo", False, 2, "ngram:2", (0.3, 0.8)),
    Row("tiny-mimo", False, 4, "ngram:2", (0.3,)),
    # Eagle3 on the trained tiny-llama-swa with its trained drafter
    Row("tiny-llama-swa-trained", False, 2, "eagle3:2", (0.3, 0.8)),
    Row("tiny-llama-swa-trained", False, 4, "eagle3:2", (0.8,)),
]
# (row, samples per context): the output distribution against the plain PP=1 engine at temperature 1.
DIST_ROWS = [(Row("tiny-mimo", False, 2, "mtp:2", (1.0,)), 150), (Row("tiny-mimo", False, 1, "mtp:2", (1.0,), OFF), 150)]


def _fmt(x, nd=3) -> str:
    return "" if x is None else f"{x:.{nd}f}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="kit sampling-table",
                                 description="sampled acceptance against theory and the output distribution checks")
    ap.add_argument("--match", default="", help="only rows whose id contains this")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--no-distribution", action="store_true", help="skip the output-distribution rows")
    ap.add_argument("--write", default=None, metavar="FILE", help="also write the tables into FILE")
    args = ap.parse_args(argv)
    if args.write and (why := check_writable(args.write)):
        print(f"kit sampling-table: error: {why}", file=sys.stderr)
        return 2
    if args.max_tokens < 1:
        print(f"kit sampling-table: error: --max-tokens must be >= 1, got {args.max_tokens}", file=sys.stderr)
        return 2
    prompts = load_prompts()
    started, t_start = datetime.now(timezone.utc), time.monotonic()
    lines = ["| run | greedy rate | sampled rate | x greedy | position: reached / accepted / expected (z) | theory | s |",
             "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    bad = 0
    for row in [r for r in ROWS if args.match in r.id]:
        t0 = time.monotonic()
        try:
            res = run(row.topology(), sweep_jobs(prompts, list(row.temperatures), max_tokens=args.max_tokens),
                      env={"KIT_PATCHES": row.patches})
            runs = parse_sweep(row.topology(), list(row.temperatures), res["jobs"])
        except Exception as e:
            lines.append(f"| {row.id} | **ERROR** | {str(e).splitlines()[0][:100]} |  |  |  | "
                         f"{time.monotonic() - t0:.0f} |")
            print(lines[-1], flush=True)
            bad += 1
            continue
        secs = f"{time.monotonic() - t0:.0f} (one engine)" if len(runs) > 1 else f"{time.monotonic() - t0:.0f}"
        for t, r in zip(row.temperatures, runs):
            pos = "; ".join(f"{p.position}: {p.reached} / {p.accepted} / {p.expected:.1f} ({_fmt(p.z, 1)})"
                            for p in r.positions)
            # A row with the fix off is expected to disagree (that is the defect shown); any other must agree.
            bad += (not r.agrees) if row.patches == "all" else r.agrees
            cells = (row.label(t), _fmt(r.greedy.acceptance_rate), _fmt(r.sampled.acceptance_rate),
                     _fmt(r.ratio_to_greedy, 2), pos, "agrees" if r.agrees else "**disagrees**", secs)
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
            print(lines[-1], flush=True)
    dist = ["| run | tests | min p | threshold (1e-3 / tests) | same distribution as PP=1 no-spec | s |",
            "|---|---|---|---|---|---|"]
    if not args.no_distribution:
        print("\n" + "\n".join(dist), flush=True)
        plain = None
        for row, samples in [(r, s) for r, s in DIST_ROWS if args.match in r.id]:
            t0 = time.monotonic()
            try:
                check, plain = distribution_check(row.topology(), prompts[:4], row.temperatures[0], samples=samples,
                                                  tokens=4, env={"KIT_PATCHES": row.patches}, plain=plain)
                bad += (not check.same_distribution) if row.patches == "all" else check.same_distribution
                cells = (f"{row.id}, 4 contexts x {samples} samples x 4 tokens", check.to_dict()["num_tests"],
                         f"{check.min_p:.3g}", f"{check.threshold:.3g}", "yes" if check.same_distribution else "**no**")
            except Exception as e:
                cells = (row.id, "**ERROR**", str(e).splitlines()[0][:100], "", "")
                bad += 1
            dist.append("| " + " | ".join(str(c) for c in cells) + f" | {time.monotonic() - t0:.0f} |")
            print(dist[-1], flush=True)
    if args.write:
        note = (f"{len(prompts)} prompts x {args.max_tokens} new tokens per run, greedy then sampled on the same "
                f"engine (request i seeded i); theory: a draft without probabilities is accepted with the target's "
                f"probability of it at the request's temperature, summed per position over the sampled rounds "
                f"that reached it (z = (accepted - expected) / sd; agrees when |z| <= 4 everywhere). Rows marked "
                f"[{OFF}] run without the fix and are expected to disagree. {bad} unexpected result(s); "
                f"{time.monotonic() - t_start:.0f} s in all.")
        body = note + "\n\n" + "\n".join(lines)
        if not args.no_distribution:
            body += ("\n\nOutput distribution: each context sampled many times on the plain engine (PP=1, no "
                     "speculation) and on the run; per context and output position a chi-square homogeneity test "
                     "(rare tokens pooled), Bonferroni over all tests.\n\n" + "\n".join(dist))
        write_block(args.write, block_key("kit.checks.sampling_table", argv), body,
                    command_line("kit sampling-table", argv),
                    when=started, title="Sampled speculative decoding")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
