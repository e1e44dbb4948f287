"""``kit bench``: start-up, time to first token, decode speed, acceptance and memory per topology.

Printed tables, not timed tests: each figure is the median of ``--repeats`` fresh engines (5 by default) with its
bootstrap 95 % interval, the engines of all rows interleaved (A B A B ...); a speed-up between two rows is claimed
only when the intervals separate (:mod:`kit.bench.stats`). Run it on an idle machine (it refuses to start while
other vLLM processes run, unless ``--force``).
``--write FILE`` (e.g. ``docs/results/bench.md``) also writes the printed table into FILE, headed by date,
machine, versions and the command (:mod:`kit.core.results`), replacing that command's earlier block.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

# aggregate and payoff_rows are also imported from here (notebook 05).
from kit.bench.table import (  # noqa: F401
    LAYERS_VARIANT,
    TABLE_HEAD,
    _describe,
    aggregate,
    breakdown_lines,
    load_runs,
    payoff_rows,
    save_run,
    speedup_lines,
    table_line,
    timeline_lines,
)
from kit.core.flags import (
    add_command,
    add_model_flags,
    add_output_flags,
    add_prompt_flags,
    add_runner_flag,
    parse_assignments,
    read_prompts,
)
from kit.core.results import (
    block_key,
    check_writable,
    command_line,
    machine,
    versions,
    write_block,
)
from kit.core.topology import AUTO, Topology, TopologyError, parse_partition
from kit.core.validate import arg_count, check_counts, check_max_tokens
from kit.engine import SEPARATE_ENGINE_CORE_ENV
from kit.engine import run as run_engine
from kit.engine.procs import leftover_vllm_processes

T = TypeVar("T")


def interleaved(cases: list[T], repeats: int) -> list[tuple[int, T]]:
    """The order engines run in: ``(repeat, case)``, repeat 0 of every case, then repeat 1, ... (A B A B ...,
    not A A B B): a slow drift of a shared machine then hits every case alike instead of whichever ran last, and
    each row's engines spread over the whole run."""
    return [(rep, case) for rep in range(repeats) for case in cases]


def _groups(prompts: list[str], batch: int) -> list[list[str]]:
    return [prompts[i:i + batch] for i in range(0, len(prompts), batch)]


def measure(topo: Topology, prompts: list[str], max_tokens: int, env: dict | None = None) -> dict:
    """One fresh engine: start time, TTFT (a 1-token request), decode tokens/s, acceptance, peak RSS
    (all prompts submitted at once)."""
    return measure_batches(topo, prompts, max_tokens, env=env)[len(prompts)]


def select_rows(cases: list, rows: str) -> list:
    """The cases whose label is in ``--rows`` (comma-separated), in the grid's order; an unknown label is bad input."""
    wanted = [r.strip() for r in rows.split(",") if r.strip()]
    labels = [case[0] for case in cases]
    if (unknown := [r for r in wanted if r not in labels]):
        raise TopologyError(f"--rows {unknown[0]!r} is no row of this grid; its rows: {', '.join(labels)}")
    return [case for case in cases if case[0] in wanted]


def parse_variants(specs: list[str]) -> list[tuple[str, dict[str, str]]]:
    """``--variant LABEL:KEY=VALUE[;KEY=VALUE]`` -> ``[(LABEL, {KEY: VALUE})]`` (one line and exit 2 when malformed)."""
    out = []
    for spec in specs:
        label, sep, rest = spec.partition(":")
        if not sep or not label.strip() or not rest:
            raise TopologyError(f"--variant wants LABEL:KEY=VALUE[;KEY=VALUE], got {spec!r}")
        out.append((label.strip(), parse_assignments(rest.split(";"), "--variant")))
    return out


def measure_batches(topo: Topology, prompts: list[str], max_tokens: int, env: dict | None = None,
                    batches: list[int] | None = None, timing: bool = False, trace: bool = False,
                    token_ids: bool = False) -> dict[int, dict]:
    """One fresh engine, each batch size in turn: the prompts submitted ``batch`` at a time (one ``generate``
    call per group, the next after the previous finished), decode tokens/s over all groups.

    ``timing`` and ``trace`` both trace every step on every rank during each batch size's groups
    (:mod:`kit.worker.steptrace`, the kit's one step timer). ``timing``: the row gets the per-step components
    (:func:`kit.bench.payoff.step_components`) under ``components``. ``trace``: the row gets the run's
    :func:`kit.worker.steptrace.summary` under ``timeline`` and the merged events under ``trace_events``.
    ``token_ids``: each row also carries the generated token ids per prompt (in prompt order) and the draft
    counters, the clock-free part of the run. Returns ``{batch: row}``.
    """
    from kit.bench.payoff import step_components
    from kit.worker import steptrace

    batches = batches or [len(prompts)]
    jobs: list[dict] = [{"kind": "generate", "prompts": prompts[:1], "max_tokens": 1}]
    traced = timing or trace
    for b in batches:
        if traced:
            jobs.append({"kind": "rpc", "method": "kit_trace_start"})
        jobs += [{"kind": "generate", "prompts": g, "max_tokens": max_tokens} for g in _groups(prompts, b)]
        if traced:
            jobs.append({"kind": "rpc", "method": "kit_trace_read"})
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load = round(os.getloadavg()[0], 2)  # the shared machine's 1-minute load as this engine starts
    # vLLM's default process layout (a separate engine core), as a deployment runs it: kit.engine's in-process
    # engine core shortens the start but serialises the front end's output processing with the engine steps.
    res = run_engine(topo, jobs, env={**SEPARATE_ENGINE_CORE_ENV, **(env or {})})
    out_jobs = list(res["jobs"])
    first = out_jobs.pop(0)
    k = topo.spec.k if topo.spec else 0
    rows = {}
    for b in batches:
        if traced:
            out_jobs.pop(0)  # kit_trace_start's answer
        groups = [out_jobs.pop(0) for _ in _groups(prompts, b)]
        reads = out_jobs.pop(0) if traced else None
        n = sum(len(t) for g in groups for t in g["token_ids"])
        drafts = sum(g["spec"]["num_drafts"] for g in groups)
        acc = sum(g["spec"]["num_accepted_tokens"] for g in groups)
        # Target forwards: one per step; a step emits 1 + accepted tokens per request, so per request
        # tokens/forward = n / (n - accepted) when every step drafts.
        rows[b] = {
            "started_at": started,
            "load_1min": load,
            "start_s": res["start_seconds"],
            "ttft_s": first["seconds"],
            "decode_tok_s": n / sum(g["seconds"] for g in groups),
            "mean_accept_len": 1 + acc / drafts if drafts else None,
            "tokens_per_target_forward": n / max(1, n - acc),
            "peak_rss_mib": {kk: round(v / 2**20) for kk, v in res["peak_rss"].items()},
            "components": step_components(reads, k, b) if timing else None,
        }
        if token_ids:
            rows[b]["token_ids"] = [t for g in groups for t in g["token_ids"]]
            rows[b]["num_drafts"], rows[b]["num_accepted_tokens"] = drafts, acc
        if trace:
            events = steptrace.merge(reads)
            rows[b]["timeline"] = steptrace.summary(events)
            rows[b]["trace_events"] = events
    return rows


def _tree_rss_mib(proc) -> int:
    """Largest resident set (MiB) in a :class:`kit.engine.procs.ManagedProcess` tree right now."""
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
    from kit.pd import PDPair

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
    from kit.bench.patch_overhead import measure as wrapper_costs

    costs = wrapper_costs(num_layers=topo.info.num_layers)
    # Batch 1, the shortest step there is (so the largest share). Tokens/s over the whole request includes the
    # prefill, so the step is slightly overestimated: the shares below are for a step of that length.
    steps = [measure(topo, prompts[:1], max_tokens, env=env or None)["decode_tok_s"] for _ in range(repeats)]
    step_us = 1e6 / max(steps)
    total_ns = sum(c.ns_per_call * c.calls_per_step for c in costs)
    print(f"# kit bench --patch-overhead — {time.strftime('%Y-%m-%d')} — {machine(python=True)}")
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
    add_runner_flag(p)
    p.add_argument("--pp", default="1,2,4", help="PP sizes of the grid, comma-separated")
    p.add_argument("--spec", default="none,mtp:1,mtp:2,mtp:3", help="spec settings of the grid, comma-separated")
    p.add_argument("--repeats", type=arg_count, default=5,
                   help="fresh engines per row (default 5), run interleaved with the other rows' (A B A B ...); "
                        "each figure is their median with its bootstrap 95 %% interval")
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
    p.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=VALUE[;KEY=VALUE]",
                   help="also run every grid row (--layer-partition rows too) with this environment, labelled [LABEL], "
                        "interleaved with the rows without it, e.g. 'off:KIT_PATCHES=all,-pp_microbatches' (a patch off and on side by side)")
    p.add_argument("--layer-partition", action="append", default=[], metavar="N,N[,...]|auto",
                   help="also run each grid row whose PP has this many stages with these decoder layers per stage "
                        "(Topology.layer_partition, vLLM's VLLM_PP_LAYER_PARTITION), labelled [layers N-N]; 'auto': "
                        "each PP>1 row with the split Topology picks for it, where that is not the even one; "
                        "repeatable")
    p.add_argument("--rows", default=None, metavar="LABEL[,LABEL...]",
                   help="run only these rows of the grid, --variant and --layer-partition rows (labels as printed, "
                        "without the batch, e.g. 'pp1 none,pp2 mtp:2 [layers 5-3] [g3]'): one run holds every "
                        "question about a configuration without running each variant on every row")
    p.add_argument("--force", action="store_true", help="run even if other vLLM processes are alive")
    p.add_argument("--write", default=None, metavar="FILE",
                   help="also write the table into FILE (e.g. docs/results/bench.md), replacing this command's block")
    p.add_argument("--batch", default=None, metavar="B[,B...]",
                   help="batch sizes: the prompts submitted B at a time (each batch size on every engine); default "
                        "all prompts at once")
    p.add_argument("--breakdown", action="store_true",
                   help="time every decode step on every rank and print the step costs, predicted against measured "
                        "speed-up and the break-even acceptance rate (kit.bench.payoff; needs --batch)")
    p.add_argument("--holdout", action="store_true",
                   help="fit the payoff model on some rows and predict the others (k <= K -> larger k, the smallest "
                        "batch -> the others, one model -> another), reading only the held-out row's acceptance; "
                        "prints each split's rows and errors (kit.bench.holdout; needs --batch, or --from-runs of "
                        "--breakdown runs)")
    p.add_argument("--timeline", action="store_true",
                   help="trace every step on every rank (kit.worker.steptrace) and print where a decode step's time goes: "
                        "the critical path, busy/recv/idle per stage, micro-batches in flight, empty steps, requests "
                        "held out, the engine core's wait for the drafts (needs --batch)")
    p.add_argument("--save-trace", default=None, metavar="FILE",
                   help="with --timeline: append each row's merged step events to FILE (JSONL)")
    p.add_argument("--json", action="store_true", help="print the rows as one JSON list, the last line of output")
    p.add_argument("--write-json", default=None, metavar="FILE", help="also write the rows (with header data) to FILE")
    p.add_argument("--save-runs", default=None, metavar="FILE",
                   help="append every engine run to FILE (JSONL), for --from-runs")
    p.add_argument("--from-runs", default=None, metavar="FILE[@MODEL][,...]",
                   help="start no engine: merge the runs saved with --save-runs into one table (FILE@MODEL: only that model's runs from FILE)")


def _num_layers(records: list[dict]) -> dict[str, int]:
    """Decoder layers of each model the records name (the ones the kit resolves)."""
    from kit.core.models import ModelError, resolve_model

    out = {}
    for name in {r["model"] for r in records}:
        try:
            out[name] = resolve_model(name).num_layers
        except ModelError:
            pass
    return out


def run(args: argparse.Namespace) -> int:
    from kit.pd import choose_connector, pd_topologies

    argv = list(getattr(args, "argv", None) or [])
    for flag, path in (("--write", args.write), ("--write-json", args.write_json), ("--save-runs", args.save_runs),
                       ("--save-trace", args.save_trace)):
        if path and (why := check_writable(path)):
            raise TopologyError(why.replace("--write", flag, 1))
    for flag, on in (("--breakdown", args.breakdown), ("--holdout", args.holdout)):
        if on and not args.batch and not args.from_runs:
            raise TopologyError(f"{flag} needs --batch (the step model is per batch size), e.g. --batch 1,4")
    if args.timeline and not args.batch and not args.from_runs:
        raise TopologyError("--timeline needs --batch (a timeline per batch size), e.g. --batch 1,4")
    if args.save_trace and not args.timeline:
        raise TopologyError("--save-trace needs --timeline")
    pd_cases = parse_pd_cases(args.pd)
    extra_env = parse_assignments(args.env, "--env")
    prompts = read_prompts(args)
    common = {"model": args.model, "random_weights": args.random, "seed": args.seed, "dtype": args.dtype,
              "runner": args.runner}
    check_max_tokens(args.max_tokens, Topology(**common).model_len)
    started = datetime.now(timezone.utc)
    out: list[str] = []

    def write() -> None:
        if args.write:
            write_block(args.write, block_key("kit bench", argv, skip=("--write", "--force", "--json", "--write-json", "--save-runs")), "\n".join(out),
                        command_line("kit bench", argv), when=started, title="Benchmarks")

    if args.patch_overhead:
        _refuse_if_busy(args.force)
        rc = patch_overhead_table(Topology(**common, pp=1, enforce_eager=not args.compiled), prompts,
                                  args.max_tokens, args.repeats, extra_env, out=out)
        write()
        return rc
    batches = check_counts(args.batch, "--batch") if args.batch else None
    timing = args.breakdown or args.holdout
    variants = parse_variants(args.variant)
    auto = any(x.strip().lower() == AUTO for x in args.layer_partition)
    splits = [parse_partition(x) for x in args.layer_partition if x.strip().lower() != AUTO]
    grid_pps = [] if args.only_extras or args.from_runs else check_counts(args.pp, "--pp")
    if (odd := [x for x in splits if len(x) not in grid_pps]):
        raise TopologyError(f"--layer-partition {','.join(map(str, odd[0]))}: no --pp size of the grid has "
                            f"{len(odd[0])} stages")
    cases = []
    for pp in grid_pps:
        for spec in args.spec.split(","):
            t = Topology(**common, pp=pp, spec=None if spec == "none" else spec, enforce_eager=not args.compiled)
            cases.append((f"pp{pp} {spec}", t, None))
            cases += [(f"pp{pp} {spec} [{name}]", t, env) for name, env in variants]
            parts = [part for part in splits if len(part) == pp]
            if auto and pp > 1 and (a := t.with_(layer_partition="auto").layer_partition) and a not in parts:
                parts.append(a)  # auto's split where it is not the even one, labelled by the split it picked
            for part in parts:  # each split plain, then with each --variant
                split = f"pp{pp} {spec} {LAYERS_VARIANT}{'-'.join(map(str, part))}]"
                cases.append((split, t.with_(layer_partition=part), None))
                cases += [(f"{split} [{name}]", t.with_(layer_partition=part), env) for name, env in variants]
    if args.rows:
        cases = select_rows(cases, args.rows)
    if args.patch_cost and not args.from_runs:
        for pp in check_counts(args.patch_cost_pp, "--patch-cost-pp"):
            t = Topology(**common, pp=pp, enforce_eager=not args.compiled)
            cases.append((f"pp{pp} none [patches on]", t, {"KIT_PATCHES": "all"}))
            # Stock vLLM cannot run eager PP=2 at all (intermediate buffers): keep that one fix.
            off = "eager_pp_intermediate_buffers" if pp > 1 and not args.compiled else "none"
            cases.append((f"pp{pp} none [KIT_PATCHES={off}]", t, {"KIT_PATCHES": off}))
    if args.startup and not args.from_runs:
        for eager in (True, False):
            t = Topology(**common, pp=2, enforce_eager=eager)
            cases.append((f"pp2 none [{'eager' if eager else 'compiled'}]", t, None))
    for ppp, pspec, cpp, cspec in ([] if args.from_runs else pd_cases):
        p, c = pd_topologies(args.model, ppp, pspec, cpp, cspec, random_weights=args.random, seed=args.seed,
                             dtype=args.dtype, runner=args.runner)
        conn = choose_connector(p, c)[0]
        cases.append((f"PD pp{ppp} {pspec or 'none'} -> pp{cpp} {cspec or 'none'} [{conn}]", (p, c), None))
    if args.from_runs:
        records = load_runs(args.from_runs)
        what = f"merged from {args.from_runs}: {len(records)} engine runs, median [bootstrap 95 % interval] per row"
    else:
        _refuse_if_busy(args.force)
        what = (f"model {args.model} ({'random' if args.random else 'trained'}), {len(prompts)} prompts x "
                f"{args.max_tokens} tokens, "
                + (f"batch {args.batch} (prompts submitted that many at a time), " if batches else "")
                + f"{'compiled' if args.compiled else 'eager'}, median [bootstrap 95 % interval] of {args.repeats} "
                "engines per row, interleaved")
        records = []
    print(f"# kit bench — {time.strftime('%Y-%m-%d')} — {machine(python=True)}")
    if extra_env:
        print(f"# extra environment: {extra_env}")
    print(f"# {what}\n")
    out += [what + (f"; extra environment {extra_env}" if extra_env else ""), "", *TABLE_HEAD]
    print("\n".join(out[2:]))
    failed: dict[str, str] = {}
    for rep, (label, topo, env) in interleaved(cases, 0 if args.from_runs else args.repeats):
        if label in failed:
            continue
        try:
            if isinstance(topo, tuple):
                records.append({**_describe(label, topo[1], None), **measure_pd(*topo, prompts, args.max_tokens)})
            else:
                env = {**(env or {}), **extra_env} or None
                per_batch = measure_batches(topo, prompts, args.max_tokens, env=env, batches=batches, timing=timing,
                                            trace=args.timeline)
                # Extra environment is part of the row's name: runs with and without it never merge.
                shown = label + "".join(f" [{kk}={vv}]" for kk, vv in extra_env.items() if f"{kk}=" not in label)
                for b, r in per_batch.items():
                    events = r.pop("trace_events", None)
                    records.append({**_describe(shown, topo, b if batches else None), **r,
                                    # The patch selection, where the row set one: the schedule it ran on.
                                    **({"kit_patches": env["KIT_PATCHES"]} if env and "KIT_PATCHES" in env else {})})
                    if args.save_trace and events is not None:
                        save_run(args.save_trace, {"topology": records[-1]["topology"], "model": topo.model,
                                                   "env": env, "events": events})
                    if args.save_runs:
                        save_run(args.save_runs, records[-1])
        except Exception as e:  # noqa: BLE001 - a failed case is a row
            failed[label] = str(e).splitlines()[0][:100]
        print(f"[bench] {label} repeat {rep + 1}: {'failed' if label in failed else 'ok'}", file=sys.stderr, flush=True)
    for label, why in failed.items():
        out.append(f"| {label} | failed: {why} |||||| ")
        print(out[-1], flush=True)
    rows = aggregate(records)
    for r in rows:
        out.append(table_line(r))
        print(out[-1], flush=True)
    lines = speedup_lines(rows)
    print("\n".join(lines), flush=True)
    out += lines
    if args.timeline:
        from kit.bench.split import split_lines

        lines = timeline_lines(records) + split_lines(records, _num_layers(records))
        print("\n".join(lines), flush=True)
        out += lines
    if args.breakdown:
        lines = breakdown_lines(rows)
        print("\n".join(lines), flush=True)
        out += lines
    if args.holdout:
        from kit.bench.holdout import holdout_lines

        lines = holdout_lines(rows)
        print("\n".join(lines), flush=True)
        out += lines
    if args.write_json:
        Path(args.write_json).write_text(json.dumps(
            {"command": command_line("kit bench", argv), "measured_at": started.isoformat(timespec="seconds"),
             "machine": machine(), "versions": versions(), "what": what, "rows": rows}, indent=1) + "\n")
    write()
    if args.json:
        print(json.dumps(rows))
    return 0
