"""``kit bench``'s records and tables: engine runs as records (JSONL for ``--save-runs``/``--from-runs``),
aggregated per topology (median with its bootstrap 95 % interval, :mod:`kit.bench.stats`; min, max), the
speed-ups between rows with their intervals, and the markdown rows; the ``--breakdown`` step-cost tables with
:mod:`kit.bench.payoff`'s predictions.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from kit.bench.stats import MIN_ENGINES, Interval, median_interval, ratio_interval, separate
from kit.core.topology import Topology, TopologyError

__all__ = ["SPEEDUP_HEAD", "TABLE_HEAD", "aggregate", "breakdown_lines", "load_runs", "payoff_rows", "save_run",
           "speedup_lines", "speedups", "table_line"]


TABLE_HEAD = ["| topology | start s | TTFT s | decode tok/s | mean accept len | tok/target fwd "
              "| peak RSS MiB (largest process) |",
              "|---|---|---|---|---|---|---|"]
SPEEDUP_HEAD = ["| topology | over | decode speed-up [95 % interval] | intervals |", "|---|---|---|---|"]


def _describe(label: str, topo: Topology, batch: int | None) -> dict:
    """What a run record says about its row: model, topology label, PP, spec, k, batch."""
    return {"model": topo.model, "trained": not topo.random_weights,
            "topology": label + (f" b{batch}" if batch else ""), "pp": topo.pp,
            "spec": str(topo.spec) if topo.spec else "none", "k": topo.spec.k if topo.spec else 0, "batch": batch}


def save_run(path: str, record: dict) -> None:
    """Append one engine run (one batch size) to a JSONL file, for ``--from-runs`` to merge later; a ``.gz`` path
    gets one gzip member per record (a step trace is large; readers such as ``kit trace`` read it whole)."""
    if str(path).endswith(".gz"):
        import gzip

        with gzip.open(path, "at") as f:
            f.write(json.dumps(record) + "\n")
        return
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def load_runs(paths: str) -> list[dict]:
    """The run records of comma-separated JSONL files written by ``--save-runs``; ``FILE@MODEL`` takes only
    that model's runs from FILE (to combine one model's rows from one file with another model's from another)."""
    records = []
    for entry in [x for x in paths.split(",") if x]:
        p, _, only = entry.partition("@")
        if not Path(p).is_file():
            raise TopologyError(f"--from-runs: {p} does not exist")
        for n, line in enumerate(Path(p).read_text().splitlines(), 1):
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    raise TopologyError(f"--from-runs: {p}:{n} is not JSON") from None
                if not only or rec.get("model") == only:
                    records.append(rec)
    return records


def _summary(vals: list) -> dict | None:
    """``median``, its bootstrap interval ``lo``/``hi``, ``min``, ``max`` and the ``values`` themselves (from
    which bench.json's readers can recompute any interval); ``None`` when no run gave a value."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    ci = median_interval(vals)
    return {"median": statistics.median(vals), "lo": ci.lo, "hi": ci.hi, "min": min(vals), "max": max(vals),
            "values": vals}


def median_engine(runs: list[dict], key: str = "decode_tok_s") -> dict:
    """The run with the median ``key`` (decode tok/s unless told; the lower one of the middle two for an even
    count). Its step components stand for the row: on a shared machine one disturbed engine would pull a mean of
    the components away from the median speed the row reports, and the prediction would then miss a speed no
    engine showed."""
    ranked = sorted(runs, key=lambda r: r[key])
    return ranked[(len(ranked) - 1) // 2]


def aggregate(records: list[dict]) -> list[dict]:
    """One row per (model, topology) in first-seen order: median/min/max over its engines; where the runs were
    timed (``--breakdown``), the step components of the median engine (by decode tok/s)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["model"], r["topology"]), []).append(r)
    several = len({m for m, _ in groups}) > 1
    rows = []
    for (model, label), rs in groups.items():
        r0 = rs[0]
        rows.append({
            "model": model, "trained": r0.get("trained", True), "topology": label,
            "label": f"{model} {label}" if several else label, "pp": r0["pp"], "spec": r0["spec"], "k": r0["k"],
            "batch": r0.get("batch"), "runs": len(rs), "started_at": min(r.get("started_at") or "" for r in rs) or None,
            "start_s": _summary([r["start_s"] for r in rs]), "ttft_s": _summary([r["ttft_s"] for r in rs]),
            "decode_tok_s": _summary([r["decode_tok_s"] for r in rs]),
            "mean_accept_len": (_summary([r["mean_accept_len"] for r in rs]) or {}).get("median"),
            "tokens_per_target_forward": (_summary([r["tokens_per_target_forward"] for r in rs]) or {}).get("median"),
            "peak_rss_mib": max((max(r["peak_rss_mib"].values(), default=0) for r in rs), default=0),
            "components": median_engine(rs).get("components"),
            **({"kit_patches": r0["kit_patches"]} if r0.get("kit_patches") else {}),
        })
    for r, sp in zip(rows, speedups(rows)):
        r["speedups"] = sp
    return rows


def _variant(row: dict) -> str | None:
    """The bracketed part of an engine row's topology (``"[off]"`` in ``"pp1 mtp:2 [off] b1"``, ``""`` for a plain
    row); ``None`` for a row not named ``pp<PP> <spec>...`` (a PD pair), which is compared with nothing."""
    label = row["topology"]
    if row.get("batch") and label.endswith(f" b{row['batch']}"):
        label = label[: -len(f" b{row['batch']}")]
    head, _, rest = label.partition(" [")
    if len(head.split()) != 2 or head.split()[0] != f"pp{row['pp']}":
        return None
    return f"[{rest}" if rest else ""


def _speedup(row: dict, base: dict, kind: str) -> dict:
    """``row``'s decode tok/s over ``base``'s: the ratio of medians, its interval, and whether the difference is
    claimed (``separate``): only when the speed-up's interval excludes 1.0 and the two rows' own intervals do not
    overlap, so neither a lucky ratio nor two stray engines alone make a claim; and never with fewer than
    :data:`~kit.bench.stats.MIN_ENGINES` engines on either side (``too_few``: one engine's "interval" is a point)."""
    a, b = row["decode_tok_s"], base["decode_tok_s"]
    ci = ratio_interval(a["values"], b["values"])
    rows_apart = separate(Interval(a["median"], a["lo"], a["hi"]), Interval(b["median"], b["lo"], b["hi"]))
    too_few = min(len([v for v in a["values"] if v is not None]),
                  len([v for v in b["values"] if v is not None])) < MIN_ENGINES
    return {"over": base["label"], "kind": kind, **ci.to_dict(), "too_few": too_few,
            "separate": ci.excludes(1.0) and rows_apart and not too_few}


# The variant of a ``kit bench --layer-partition`` row: ``"[layers 5-3]"``.
LAYERS_VARIANT = "[layers "


def speedups(rows: list[dict]) -> list[list[dict]]:
    """Each aggregated row's decode speed-ups, in row order: over no speculation (``kind`` "speculation": the
    ``none`` row of the same model, PP, batch and variant) for a speculative row, and over the first row of its
    (model, PP, spec, batch) group (``kind`` "variant": a ``--variant``, ``--patch-cost`` or ``--startup`` row
    against the plain or first-listed one), and for a PP > 1 row over the PP=1 row of the same model, spec, batch and
    variant (``kind`` "pp": what splitting the model over stages costs or wins on the same cores; a
    ``--layer-partition`` row against the plain PP=1 row). Rows without
    decode values or not named ``pp<PP> <spec>`` get none."""
    usable = [(r, _variant(r)) for r in rows]
    usable = [(r, v) for r, v in usable if v is not None and r.get("decode_tok_s") and r["decode_tok_s"].get("values")]
    plain = {}
    first = {}
    pp1 = {}
    for r, v in usable:
        if r["k"] == 0:
            plain.setdefault((r["model"], r["pp"], r.get("batch"), v), r)
        if r["pp"] == 1:
            pp1.setdefault((r["model"], r["spec"], r.get("batch"), v), r)
        first.setdefault((r["model"], r["pp"], r["spec"], r.get("batch")), r)
    out: dict[int, list[dict]] = {}
    for r, v in usable:
        found = out.setdefault(id(r), [])
        base = plain.get((r["model"], r["pp"], r.get("batch"), v))
        if r["k"] and base is not None:
            found.append(_speedup(r, base, "speculation"))
        base = first[(r["model"], r["pp"], r["spec"], r.get("batch"))]
        if base is not r:
            found.append(_speedup(r, base, "variant"))
        base = pp1.get((r["model"], r["spec"], r.get("batch"), v))
        if base is None and v.startswith(LAYERS_VARIANT):  # a layer split has no PP=1 twin: the plain PP=1 row
            base = pp1.get((r["model"], r["spec"], r.get("batch"), ""))
        if r["pp"] > 1 and base is not None:
            found.append(_speedup(r, base, "pp"))
    return [out.get(id(r), []) for r in rows]


def _fmt_speedup(sp: dict) -> str:
    return f"{sp['median']:.2f}x [{sp['lo']:.2f}–{sp['hi']:.2f}]"


def speedup_lines(rows: list[dict]) -> list[str]:
    """The speed-up table (rows of :func:`aggregate`): one line per speed-up; ``separate`` marks a difference the
    runs support (:func:`_speedup`), ``overlap`` one they do not. Empty when no row has a speed-up."""
    def verdict(sp: dict) -> str:
        return f"not claimed (< {MIN_ENGINES} engines)" if sp.get("too_few") else \
            "separate" if sp["separate"] else "overlap"

    lines = [f"| {r['label']} | {sp['over']} | {_fmt_speedup(sp)} | {verdict(sp)} |"
             for r in rows for sp in r.get("speedups") or []]
    if not lines:
        return []
    return ["", "Decode speed-ups: a row's median decode tok/s over another's, with the bootstrap 95 % interval of "
            "the ratio (each row's engines resampled on their own); a difference is claimed (separate) only when that "
            f"interval excludes 1.00x and the two rows' own intervals do not overlap, with at least {MIN_ENGINES} "
            "engines per row.", "", *SPEEDUP_HEAD, *lines]


def _fmt(s: dict | None, fmt: str) -> str:
    """``median [lo–hi]``; rows of a bench.json written before the intervals have only min and max."""
    if not s:
        return "-"
    if "lo" not in s:
        return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}–{fmt.format(s['max'])})"
    return f"{fmt.format(s['median'])} [{fmt.format(s['lo'])}–{fmt.format(s['hi'])}]"


def table_line(row: dict) -> str:
    """The markdown row of an aggregated row."""
    mal = row["mean_accept_len"]
    return (f"| {row['label']} | {_fmt(row['start_s'], '{:.1f}')} | {_fmt(row['ttft_s'], '{:.3f}')} "
            f"| {_fmt(row['decode_tok_s'], '{:.1f}')} | {'-' if mal is None else f'{mal:.2f}'} "
            f"| {row['tokens_per_target_forward']:.2f} | {row['peak_rss_mib']} |")


def payoff_rows(rows: list[dict]) -> list[dict]:
    """Aggregated bench rows in the form :func:`kit.bench.payoff.predict` takes (rows without a batch size: batch =
    all prompts at once is not a fixed batch, they are left out)."""
    out = []
    for r in rows:
        if r.get("batch") and r.get("components") and r["decode_tok_s"]:
            out.append({"model": r["model"], "pp": r["pp"], "batch": r["batch"], "k": r["k"],
                        "decode_tok_s": r["decode_tok_s"]["median"], "tokens_per_forward": r["mean_accept_len"] or 1.0,
                        "components": r["components"], "label": r["label"],
                        **({"kit_patches": r["kit_patches"]} if r.get("kit_patches") else {})})
    return out


def breakdown_lines(rows: list[dict], ks: tuple[int, ...] = (1, 2, 3, 4)) -> list[str]:
    """The ``--breakdown`` tables: per-step components, predicted against measured speed-up (each row gets its
    prediction in ``row["payoff"]``), and the break-even acceptance rate per (model, PP, batch) and k."""
    from kit.bench.payoff import costs_by_group, predict

    ms = lambda x: f"{1e3 * x:.2f}"  # noqa: E731
    lines = ["", "Per decode step (the row's median engine by decode tok/s; ms): the step period on the last rank, the target "
             "forward summed over the stages (per stage), the later stages' wait for the previous one, the drafter, "
             "and the rest (fixed = period - forward - draft); per stage the share of the decode window spent in "
             "forward + draft (busy) and waiting (recv); forward overlap = time two stages computed at once / "
             "stage 0's forward time.", "",
             "| topology | steps | period | forward (per stage) | recv | draft | fixed | busy per stage | recv per stage "
             "| forward overlap |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r.get("components")
        if not c:
            continue
        tl = c.get("timeline") or {}
        st = tl.get("stages", [])
        ov = tl.get("forward_overlap")
        busy = " / ".join(f"{s['busy']:.0%}" for s in st)
        recv = " / ".join(f"{s['recv']:.0%}" for s in st)
        lines.append(f"| {r['label']} | {c['steps']:.0f} | {ms(c['period_s'])} | {ms(c['forward_s'])} "
                     f"({' + '.join(ms(x) for x in c['forward_per_stage_s'])}) | {ms(c['recv_s'])} | {ms(c['draft_s'])} "
                     f"| {ms(c['fixed_s'])} | {busy} | {recv} | {'-' if ov is None else f'{ov:.0%}'} |")
    preds = predict(payoff_rows(rows))
    by_label = {(p["model"], p["pp"], p["batch"], p["k"]): p for p in preds}
    for r in rows:
        p = by_label.get((r["model"], r["pp"], r.get("batch"), r["k"]))
        if p:
            r["payoff"] = {key: p[key] for key in ("measured", "predicted", "error", "agrees", "acceptance", "break_even",
                                                   "occupancy", "predicted_at_occupancy", "error_at_occupancy",
                                                   "agrees_at_occupancy")}
    lines += ["", "Speed-up over no speculation (same model, PP, batch): measured (median decode tok/s ratio [its "
              "bootstrap 95 % interval]) and "
              "predicted by kit.bench.payoff from the fitted step costs and the row's measured mean acceptance length; "
              "a = the i.i.d. per-position acceptance rate with that length; a* = break-even rate for that k. The "
              "prediction assumes full steps (every step carrying the plain engine's requests per step); occupancy = "
              "plain steps / (speculative steps x mean acceptance length) is how full the speculative steps were, "
              "and the last columns predict at that measured occupancy.", "",
              "| topology | mean accept len | a | measured | predicted (full steps) | error | within 15 % | a* "
              "| occupancy | predicted at occupancy | error | within 15 % |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.get("payoff")
        if p:
            be = "never pays" if p["break_even"] is None else f"{p['break_even']:.2f}"
            # The speed-up table's interval, when its baseline is the one the prediction used (same ratio).
            sp = next((x for x in r.get("speedups") or [] if x["kind"] == "speculation"
                       and abs(x["median"] - p["measured"]) <= 1e-9 * p["measured"]), None)
            measured = _fmt_speedup(sp) if sp else f"{p['measured']:.2f}x"
            lines.append(f"| {r['label']} | {r['mean_accept_len']:.2f} | {p['acceptance']:.3f} | {measured} "
                         f"| {p['predicted']:.2f}x | {100 * p['error']:+.0f} % | {'yes' if p['agrees'] else 'NO'} | {be} "
                         + (f"| {p['occupancy']:.2f} | {p['predicted_at_occupancy']:.2f}x | {100 * p['error_at_occupancy']:+.0f} % "
                            f"| {'yes' if p['agrees_at_occupancy'] else 'NO'} |" if p["occupancy"] else "| - | - | - | - |"))
    costs = costs_by_group(payoff_rows(rows))
    if costs:
        lines += ["", "Fitted step costs (ms) and the break-even acceptance rate a* per k (below it speculation "
                  "loses; 'never' = loses even when every draft is accepted):", "",
                  "| model | PP | batch | T(0) | fixed no-spec | fixed spec | forward(n) | draft(k) | "
                  + " | ".join(f"a* k={k}" for k in ks) + " |", "|---" * (8 + len(ks)) + "|"]
        for (model, pp, batch), c in costs.items():
            bes = [c.break_even(k) for k in ks]
            lines.append(f"| {model} | {pp} | {batch} | {ms(c.step_s(0))} | {ms(c.fixed_nospec_s)} | {ms(c.fixed_spec_s)} "
                         f"| {ms(c.forward_base_s)} + {1e3 * c.forward_per_token_s:.3f} n | {ms(c.draft_base_s)} + "
                         f"{ms(c.draft_per_token_s)} k | "
                         + " | ".join("never" if b is None else f"{b:.2f}" for b in bes) + " |")
            for r in rows:
                if (r["model"], r["pp"], r.get("batch")) == (model, pp, batch):
                    r["costs"] = c.to_dict()
    return lines


def timeline_lines(records: list[dict]) -> list[str]:
    """The ``--timeline`` table: one line per traced engine run (:func:`kit.worker.steptrace.summary`)."""
    from kit.worker.steptrace import TIMELINE_HEAD, summary_line

    runs = [r for r in records if r.get("timeline")]
    if not runs:
        return []
    several = len({r["model"] for r in runs}) > 1
    return ["", "Timeline per engine run (kit.worker.steptrace; decode steps only; ms per step): period = rank 0's start to "
            "its next start; the critical path rank-0 forward, send to the next stage, last-rank forward, sample, "
            "drafter, drafts collected (handoff), back to rank 0's next start; per stage busy / waiting for the "
            "previous stage / idle; steps that started while the previous one still ran on the last rank (time two "
            "stages computed at once / rank 0's forward); the engine core's least wait in post_step (rank 0's start "
            "to the drafts leaving the last rank).", "", *TIMELINE_HEAD,
            *(summary_line(f"{r['model']} {r['topology']}" if several else r["topology"], r["timeline"]) for r in runs)]
