"""``kit bench``: start-up, time to first token, decode speed, acceptance and memory per topology.

Printed tables, not timed tests: each figure is the median of ``--repeats`` fresh engines with min/max.
Run it on an idle machine (it refuses to start while other vLLM processes run, unless ``--force``).
``--write FILE`` (e.g. ``docs/results/bench.md``) also writes the printed table into FILE, headed by date,
machine, versions and the command (:mod:`kit.results`), replacing that command's earlier block.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from datetime import datetime, timezone

from .command import (add_command, add_model_flags, add_output_flags, add_prompt_flags, check_max_tokens,
                      parse_assignments, read_prompts)
from .engine import run as run_engine
from .procs import leftover_vllm_processes
from .results import block_key, check_writable, command_line, write_block
from .results import machine as _machine_hw
from .topology import Topology, TopologyError
from .validate import arg_count


def machine() -> str:
    """``CPU model, N cores, M GiB, Python X`` (the line the printed tables start with)."""
    return f"{_machine_hw()}, Python {platform.python_version()}"


def measure(topo: Topology, prompts: list[str], max_tokens: int, env: dict | None = None) -> dict:
    """One fresh engine: start time, TTFT (a 1-token request), decode tokens/s, acceptance, peak RSS."""
    jobs = [{"kind": "generate", "prompts": prompts[:1], "max_tokens": 1},
            {"kind": "generate", "prompts": prompts, "max_tokens": max_tokens}]
    res = run_engine(topo, jobs, env=env)
    first, full = res["jobs"]
    spec = full["spec"]
    n = sum(len(t) for t in full["token_ids"])
    # Target forwards: one per step; a step emits 1 + accepted tokens per request, so per request
    # tokens/forward = n / (n - accepted) when every step drafts.
    acc = spec["num_accepted_tokens"]
    return {
        "start_s": res["start_seconds"],
        "ttft_s": first["seconds"],
        "decode_tok_s": n / full["seconds"],
        "mean_accept_len": spec["mean_acceptance_length"],
        "tokens_per_target_forward": n / max(1, n - acc),
        "peak_rss_mib": {k: round(v / 2**20) for k, v in res["peak_rss"].items()},
    }


def _tree_rss_mib(proc) -> int:
    """Largest resident set (MiB) in a :class:`kit.procs.ManagedProcess` tree right now."""
    import psutil

    best = 0
    for p in proc.tree():
        try:
            best = max(best, p.memory_info().rss)
        except psutil.Error:
            continue
    return round(best / 2**20)


def measure_pd(producer: Topology, consumer: Topology, prompts: list[str], max_tokens: int) -> dict:
    """One fresh PD pair: pair start (both servers + the warm-up round trip), TTFT of a 1-token PD request
    (producer prefill + KV handoff + the consumer's first token), end-to-end tokens/s over the prompts one at a
    time, the consumer's acceptance, and the largest process RSS of each server at the end (not a peak)."""
    from .pd import PDPair

    t0 = time.monotonic()
    with PDPair(producer, consumer) as pair:
        start_s = time.monotonic() - t0
        first = pair.complete(prompts[0], max_tokens=1, index=0)
        if first.error:
            raise RuntimeError(first.error)
        recs, totals = pair.complete_many(prompts, max_tokens=max_tokens)
        errors = [r.error for r in recs if r.error]
        if errors:
            raise RuntimeError(errors[0])
        n = sum(len(r.token_ids) for r in recs)
        seconds = sum(r.total_s for r in recs)
        spec = totals.get("consumer_spec") or {}
        acc = spec.get("num_accepted_tokens") or 0
        rss = {role: _tree_rss_mib(srv.proc) for role, srv in (("producer", pair.producer), ("consumer", pair.consumer))
               if srv is not None and srv.proc is not None}
    return {
        "start_s": start_s,
        "ttft_s": first.total_s,
        "decode_tok_s": n / seconds if seconds else None,
        "mean_accept_len": spec.get("mean_acceptance_length"),
        "tokens_per_target_forward": n / max(1, n - acc),
        "peak_rss_mib": rss,
    }


def _stat(vals: list[float], fmt: str = "{:.2f}") -> str:
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    med = statistics.median(vals)
    return f"{fmt.format(med)} ({fmt.format(min(vals))}–{fmt.format(max(vals))})"


def parse_pd_cases(text: str) -> list[tuple[int, str | None, int, str | None]]:
    """``"1:none>1:none,1:mtp:2>1:mtp:2"`` -> [(producer PP, producer spec, consumer PP, consumer spec), ...]."""
    out = []
    for item in [x.strip() for x in text.split(",") if x.strip()]:
        try:
            left, right = item.split(">")
            ppp, pspec = left.split(":", 1)
            cpp, cspec = right.split(":", 1)
            out.append((int(ppp), None if pspec == "none" else pspec, int(cpp), None if cspec == "none" else cspec))
        except ValueError:
            raise TopologyError(f"--pd item {item!r}: expected PP:SPEC>PP:SPEC, e.g. 1:mtp:2>1:mtp:2") from None
    return out


def patch_overhead_table(topo: Topology, prompts: list[str], max_tokens: int, repeats: int,
                         env: dict | None = None, out: list[str] | None = None) -> int:
    """Print each per-step wrapper's own cost and its share of a PP=1, batch-1 decode step measured here
    (the table's lines are also appended to ``out``)."""
    from .patch_overhead import measure as wrapper_costs

    costs = wrapper_costs(num_layers=topo.info.num_layers)
    # Batch 1, the shortest step there is (so the largest share). Tokens/s over the whole request includes the
    # prefill, so the step is slightly overestimated: the shares below are for a step of that length.
    steps = [measure(topo, prompts[:1], max_tokens, env=env or None)["decode_tok_s"] for _ in range(repeats)]
    step_us = 1e6 / max(steps)
    total_ns = sum(c.ns_per_call * c.calls_per_step for c in costs)
    print(f"# kit bench --patch-overhead — {time.strftime('%Y-%m-%d')} — {machine()}")
    lines = [f"PP=1 no-spec decode step, batch 1, {max_tokens} tokens, fastest of {repeats} engines: "
             f"{step_us:.0f} us ({max(steps):.0f} tok/s)", "",
             "| patch | wraps | calls per step | ns per call (wrapper only) | share of a step |",
             "|---|---|---|---|---|"]
    for c in costs:
        lines.append(f"| {c.patch} | {c.target} | {c.calls_per_step} | {c.ns_per_call:.0f} "
                     f"| {100 * c.ns_per_call * c.calls_per_step / (step_us * 1e3):.3f}% |")
    lines.append(f"| **all** | | | {total_ns:.0f} | **{100 * total_ns / (step_us * 1e3):.3f}%** |")
    print("# " + lines[0] + "\n\n" + "\n".join(lines[2:]))
    if out is not None:
        out.extend(lines)
    return 0


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TopologyError(f"{flag} wants comma-separated integers, got {text!r}") from None


def _refuse_if_busy(force: bool) -> None:
    """Timings next to other vLLM processes would be wrong: refuse (bad input, exit 2) unless ``--force``."""
    others = leftover_vllm_processes()
    if others and not force:
        raise TopologyError(f"{len(others)} other vLLM processes are running (pids "
                            f"{', '.join(o.split()[0] for o in others)}): timings would be wrong; --force runs anyway")


def register(sub) -> None:
    """Add ``kit bench`` to the ``kit`` command tree."""
    p = add_command(sub, "bench", run, help="start-up, TTFT, decode speed, acceptance and memory per topology",
                    description=__doc__)
    add_model_flags(p)
    p.add_argument("--pp", default="1,2,4", help="PP sizes of the grid, comma-separated")
    p.add_argument("--spec", default="none,mtp:1,mtp:2,mtp:3", help="spec settings of the grid, comma-separated")
    p.add_argument("--repeats", type=arg_count, default=3)
    add_prompt_flags(p, limit=8)
    add_output_flags(p, max_tokens=64, timeout=None)
    p.add_argument("--compiled", action="store_true")
    p.add_argument("--patch-cost", action="store_true",
                   help="also PP=1 and PP=2 no-spec decode speed with KIT_PATCHES=none, side by side")
    p.add_argument("--patch-cost-pp", default="1,2", help="PP sizes for --patch-cost (default 1,2)")
    p.add_argument("--patch-overhead", action="store_true",
                   help="time each per-step patch wrapper on the PP=1 no-spec path (in this process) and relate "
                        "it to a measured PP=1 decode step; no other table")
    p.add_argument("--startup", action="store_true",
                   help="also PP=2 no-spec start time eager vs compiled, side by side")
    p.add_argument("--only-extras", action="store_true", help="skip the PP x spec grid (just --patch-cost/--startup)")
    p.add_argument("--pd", default="",
                   help="PD pairs to add, PRODUCER_PP:SPEC>CONSUMER_PP:SPEC comma-separated, e.g. 1:none>1:none,1:mtp:2>1:mtp:2")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every engine (overrides the topology's), e.g. VLLM_CPU_OMP_THREADS_BIND=0")
    p.add_argument("--force", action="store_true", help="run even if other vLLM processes are alive")
    p.add_argument("--write", default=None, metavar="FILE",
                   help="also write the table into FILE (e.g. docs/results/bench.md), replacing this command's block")


def run(args: argparse.Namespace) -> int:
    from .pd import choose_connector, pd_topologies

    argv = list(getattr(args, "argv", None) or [])
    if args.write and (why := check_writable(args.write)):
        raise TopologyError(why)
    pd_cases = parse_pd_cases(args.pd)
    extra_env = parse_assignments(args.env, "--env")
    prompts = read_prompts(args)
    common = {"model": args.model, "random_weights": args.random, "seed": args.seed, "dtype": args.dtype}
    check_max_tokens(args.max_tokens, Topology(**common).model_len)
    started = datetime.now(timezone.utc)
    out: list[str] = []

    def write() -> None:
        if args.write:
            write_block(args.write, block_key("kit bench", argv, skip=("--write", "--force")), "\n".join(out),
                        command_line("kit bench", argv), when=started, title="Benchmarks")

    if args.patch_overhead:
        _refuse_if_busy(args.force)
        rc = patch_overhead_table(Topology(**common, pp=1, enforce_eager=not args.compiled), prompts,
                                  args.max_tokens, args.repeats, extra_env, out=out)
        write()
        return rc
    cases = []
    for pp in ([] if args.only_extras else _ints(args.pp, "--pp")):
        for spec in args.spec.split(","):
            cases.append((f"pp{pp} {spec}", Topology(**common, pp=pp, spec=None if spec == "none" else spec,
                                                     enforce_eager=not args.compiled), None))
    if args.patch_cost:
        for pp in _ints(args.patch_cost_pp, "--patch-cost-pp"):
            t = Topology(**common, pp=pp, enforce_eager=not args.compiled)
            cases.append((f"pp{pp} none [patches on]", t, {"KIT_PATCHES": "all"}))
            # Stock vLLM cannot run eager PP=2 at all (intermediate buffers): keep that one fix.
            off = "eager_pp_intermediate_buffers" if pp > 1 and not args.compiled else "none"
            cases.append((f"pp{pp} none [KIT_PATCHES={off}]", t, {"KIT_PATCHES": off}))
    if args.startup:
        for eager in (True, False):
            t = Topology(**common, pp=2, enforce_eager=eager)
            cases.append((f"pp2 none [{'eager' if eager else 'compiled'}]", t, None))
    for ppp, pspec, cpp, cspec in pd_cases:
        p, c = pd_topologies(args.model, ppp, pspec, cpp, cspec, random_weights=args.random, seed=args.seed,
                             dtype=args.dtype)
        conn = choose_connector(p, c)[0]
        cases.append((f"PD pp{ppp} {pspec or 'none'} -> pp{cpp} {cspec or 'none'} [{conn}]", (p, c), None))
    _refuse_if_busy(args.force)
    print(f"# kit bench — {time.strftime('%Y-%m-%d')} — {machine()}")
    if extra_env:
        print(f"# extra environment: {extra_env}")
    what = (f"model {args.model} ({'random' if args.random else 'trained'}), {len(prompts)} prompts x "
            f"{args.max_tokens} tokens, {'compiled' if args.compiled else 'eager'}, "
            f"median (min–max) of {args.repeats}")
    print(f"# {what}\n")
    out += [what + (f"; extra environment {extra_env}" if extra_env else ""), "",
            "| topology | start s | TTFT s | decode tok/s | mean accept len | tok/target fwd "
            "| peak RSS MiB (largest process) |",
            "|---|---|---|---|---|---|---|"]
    print("\n".join(out[2:]))
    # Round-robin over the cases (repeat 1 of every case, then repeat 2, ...): slow drifts of a shared
    # machine then hit every case alike instead of whichever ran last.
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in cases}
    failed: dict[str, str] = {}
    for rep in range(args.repeats):
        for label, topo, env in cases:
            if label in failed:
                continue
            try:
                if isinstance(topo, tuple):
                    runs[label].append(measure_pd(*topo, prompts, args.max_tokens))
                else:
                    runs[label].append(measure(topo, prompts, args.max_tokens, env={**(env or {}), **extra_env} or None))
            except Exception as e:  # noqa: BLE001 - a failed case is a row
                failed[label] = str(e).splitlines()[0][:100]
            print(f"[bench] {label} repeat {rep + 1}: {'failed' if label in failed else 'ok'}", file=sys.stderr, flush=True)
    for label, _, _ in cases:
        rs = runs[label]
        if label in failed:
            out.append(f"| {label} | failed: {failed[label]} |||||| ")
            print(out[-1], flush=True)
        if not rs:
            continue
        rss = max((max(r["peak_rss_mib"].values(), default=0) for r in rs), default=0)
        out.append(f"| {label} | {_stat([r['start_s'] for r in rs], '{:.1f}')} | {_stat([r['ttft_s'] for r in rs], '{:.3f}')} "
                   f"| {_stat([r['decode_tok_s'] for r in rs], '{:.1f}')} | {_stat([r['mean_accept_len'] for r in rs])} "
                   f"| {_stat([r['tokens_per_target_forward'] for r in rs])} | {rss} |")
        print(out[-1], flush=True)
    write()
    return 0


if __name__ == "__main__":
    from kit.cli import main

    sys.exit(main(["bench", *sys.argv[1:]]))
