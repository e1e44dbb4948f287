"""What notebook 05 (does speculation pay?) says about the recorded rows, as Markdown formatted from them: every number
and direction (which PP size pays more, whether a* rises or falls, how much of a step the forward is) comes from the
rows, the fitted costs and the predictions passed in, so the prose cannot drift from the data.

Inputs are those of the notebook: ``rows`` as in ``docs/results/bench.json``, ``costs`` from
:func:`kit.bench.payoff.costs_by_group`, ``preds`` from :func:`kit.bench.payoff.predict`, the held-out ``result`` of
:func:`kit.bench.holdout.evaluate` and the bench timeline's :func:`kit.worker.steptrace.summary` per traced run.
Nothing here measures.
"""
from __future__ import annotations

from kit.bench.payoff import Costs

# Two speed-ups within this ratio of each other are "about the same".
SAME = 0.02
# Two break-even rates within this distance are "the same".
SAME_A = 0.005


def span(xs: list, fmt: str = "{:.2f}") -> str:
    """``"0.22–0.35"``, or one value when the range rounds to one."""
    lo, hi = fmt.format(min(xs)), fmt.format(max(xs))
    return lo if lo == hi else f"{lo}–{hi}"


def listed(xs: list) -> str:
    return ", ".join(map(str, sorted(set(xs))))


def fmt_a(x: float | None) -> str:
    return "never (even a = 1 loses)" if x is None else f"{x:.2f}"


def direction(before: float | None, after: float | None) -> str:
    """How a break-even rate moved: "rises", "falls" or "stays" (``None``: even a = 1 loses, above any rate)."""
    before, after = (2.0 if x is None else x for x in (before, after))
    return "rises" if after > before + SAME_A else "falls" if after < before - SAME_A else "stays"


def compare(before: float, after: float) -> str:
    """``after`` against ``before``: "less", "more" or "about the same" (within :data:`SAME`)."""
    return "less" if after < (1 - SAME) * before else "more" if after > (1 + SAME) * before else "about the same"


def coverage(rows: list[dict]) -> str:
    """Which models, PP sizes, k and batches the recorded run has, and its engines per row."""
    covers: dict[str, dict[str, set]] = {}
    for r in rows:
        c = covers.setdefault(r["model"], {"pp": set(), "k": set(), "batch": set(), "runs": set()})
        for name in c:
            c[name].add(r[name])
    return "**The recorded run covers:**\n" + "\n".join(
        f"- `{m}`: PP {listed(c['pp'])}; k {listed(c['k'])} (0: no speculation); batch {listed(c['batch'])}; "
        f"{span(list(c['runs']), '{}')} engines per row" for m, c in covers.items())


def forward_share(costs: dict[tuple, Costs]) -> str:
    """Each model's target forward (one token per request) as a share of a plain step T(0), over its groups."""
    share: dict[str, list[float]] = {}
    for (m, _, b), c in costs.items():
        share.setdefault(m, []).append(c.forward_s(b) / c.step_s(0))

    def words(lo: float, hi: float) -> str:
        return "most of it" if lo > 0.5 else "less than half: the fixed part is most of it" if hi < 0.5 else "about half"

    return ("**The target forward's share of a plain step T(0)**, over PP sizes and batches: " + "; ".join(
        f"`{m}` {span(v, '{:.0%}')} ({words(min(v), max(v))})" for m, v in share.items()) + ".")


def _models(preds: list[dict]) -> list[str]:
    return list(dict.fromkeys(p["model"] for p in preds))


def _pp_sizes(preds: list[dict]) -> tuple[int, int]:
    return min(p["pp"] for p in preds), max(p["pp"] for p in preds)


def break_even(costs: dict[tuple, Costs], preds: list[dict]) -> str:
    """Per model at batch 1: the measured acceptance against a* and the measured speed-ups; per model and batch:
    whether a* rises or falls from the smallest PP size to the largest, with T(k)/T(0) beside it."""
    lines = []
    for m in _models(preds):
        b1 = [p for p in preds if p["model"] == m and p["batch"] == 1]
        if not b1:
            continue
        a_stars = [p["break_even"] for p in b1 if p["break_even"] is not None]
        above = len(a_stars) == len(b1) and all(p["acceptance"] > p["break_even"] for p in b1)
        lines.append(f"- `{m}`, batch 1 (PP {listed([p['pp'] for p in b1])}; k {listed([p['k'] for p in b1])}): "
                     f"measured acceptance a = {span([p['acceptance'] for p in b1])} against a* = "
                     + (span(a_stars) if a_stars else "")
                     + (" (never in some rows: even a = 1 loses)" if len(a_stars) < len(b1) else "") + ", "
                     + ("above a* in every row" if above else "not above a* in every row")
                     + f"; measured speed-up {span([p['measured'] for p in b1], '{:.2f}x')}.")
    pp_lo, pp_hi = _pp_sizes(preds)
    for m in _models(preds):
        for b in sorted({key[2] for key in costs if key[0] == m}):
            c_lo, c_hi = costs.get((m, pp_lo, b)), costs.get((m, pp_hi, b))
            ks = sorted({p["k"] for p in preds if p["model"] == m and p["batch"] == b})
            if c_lo is None or c_hi is None or pp_lo == pp_hi or not ks:
                continue
            dirs = {direction(c_lo.break_even(k), c_hi.break_even(k)) for k in ks}
            lines.append(f"- `{m}`, batch {b}: from PP={pp_lo} to PP={pp_hi} a* "
                         + (f"{dirs.pop()} at every measured k" if len(dirs) == 1 else "moves both ways") + " ("
                         + "; ".join(f"k={k}: a* {fmt_a(c_lo.break_even(k))} → {fmt_a(c_hi.break_even(k))}, "
                                     f"T({k})/T(0) {c_lo.step_s(k) / c_lo.step_s(0):.2f} → "
                                     f"{c_hi.step_s(k) / c_hi.step_s(0):.2f}" for k in ks) + ").")
    return "\n".join(lines)


def pp_compare(rows: list[dict], costs: dict[tuple, Costs], preds: list[dict]) -> str:
    """Per model and batch: the measured speed-ups at the largest PP size against the smallest, k by k; the
    occupancy of their speculative steps; the fixed cost of a speculative step; where the larger PP size pays less
    with emptier steps, the prediction at the measured occupancy. Then the forward overlap of the larger PP size's
    rows (``components.timeline.forward_overlap``)."""
    pp_lo, pp_hi = _pp_sizes(preds)
    by = {(p["model"], p["pp"], p["batch"], p["k"]): p for p in preds}
    lines = []
    for m in _models(preds):
        for b in sorted({p["batch"] for p in preds if p["model"] == m}):
            pairs = [(by[(m, pp_lo, b, k)], by[(m, pp_hi, b, k)]) for k in sorted({p["k"] for p in preds if p["model"] == m})
                     if (m, pp_lo, b, k) in by and (m, pp_hi, b, k) in by]
            if not pairs or pp_lo == pp_hi:
                continue
            c_lo, c_hi = costs[(m, pp_lo, b)], costs[(m, pp_hi, b)]
            words = {compare(p1["measured"], p2["measured"]) for p1, p2 in pairs}
            word = words.pop() if len(words) == 1 else None
            summary = (f"{word} than PP={pp_lo} at every k" if word in ("less", "more")
                       else f"about the same as PP={pp_lo} at every k" if word
                       else f"as much as PP={pp_lo} or more" if "less" not in words
                       else f"less than PP={pp_lo} at some k, not at others")
            line = (f"- `{m}`, batch {b}: PP={pp_hi} pays {summary}: measured speed-up "
                    + ", ".join(f"k={p1['k']} {p2['measured']:.2f}x against {p1['measured']:.2f}x "
                                f"({compare(p1['measured'], p2['measured'])})" for p1, p2 in pairs))
            occ = [(p1["occupancy"], p2["occupancy"]) for p1, p2 in pairs if p1["occupancy"] and p2["occupancy"]]
            if occ:
                line += (f"; occupancy of its speculative steps {span([o2 for _, o2 in occ])} against "
                         f"{span([o1 for o1, _ in occ])}")
            line += (f"; fixed cost of a speculative step {1e3 * c_hi.fixed_spec_s:.2f} ms against "
                     f"{1e3 * c_lo.fixed_spec_s:.2f} ms.")
            less = [p2 for p1, p2 in pairs if compare(p1["measured"], p2["measured"]) == "less"]
            if less and all(p["agrees_at_occupancy"] and p["occupancy"] < 0.9 for p in less):
                line += (" Where it pays less its speculative steps were emptier: at their measured occupancy the "
                         "model predicts " + "; ".join(f"k={p['k']}: {p['predicted_at_occupancy']:.2f}x against "
                                                       f"{p['measured']:.2f}x measured" for p in less) + ".")
            lines.append(line)
    overlap = [r["components"]["timeline"]["forward_overlap"] for r in rows
               if r["pp"] == pp_hi and (((r.get("components") or {}).get("timeline") or {}).get("forward_overlap")
                                        is not None)]
    if overlap and pp_hi > 1:
        lines.append(f"- Forward overlap (two stages computing at once, as a share of stage 0's forward time) in the "
                     f"{len(overlap)} PP={pp_hi} rows: {span(overlap, '{:.0%}')}.")
    return "\n".join(lines)


def best_k_top(best: dict[tuple, dict[float, int]], ks: range) -> str:
    """Says, per acceptance rate, in how many groups the best k of ``best`` (``{group: {a: k}}``) is the top of the
    range searched: there the best k is at least that, not exactly it."""
    top = max(ks)
    rates = sorted({a for v in best.values() for a in v})
    counts = {a: sum(v[a] == top for v in best.values()) for a in rates}
    return (" ".join(f"At a = {a} the best k is the top of the range searched in {n} of {len(best)} groups: there it "
                     f"is at least {top}, and a larger k was not tried." for a, n in counts.items() if n)
            or f"No best k is the top of the range searched ({top}).")


def best_k_interior(best: dict[tuple, dict[float, int]], ks: range, measured_ks: list[int]) -> str:
    """Says where the best k of ``best`` (``{group: {a: k}}``, found over ``ks``) lies: per acceptance rate its span
    over the groups, whether any is the top of the range searched (then it is at least that, not a winner), and
    how far it lies beyond the k the costs were fitted on (``measured_ks``: there the model extrapolates)."""
    rates = sorted({a for v in best.values() for a in v})
    top, fitted = max(ks), max(measured_ks)
    parts = []
    for a in rates:
        got = [v[a] for v in best.values()]
        at_top = sum(k == top for k in got)
        parts.append(f"at a = {a} the best k is {span(got, '{}')}"
                     + (f" (in {at_top} of {len(got)} groups the top of the range searched, {top}: there it is at "
                        f"least {top}, and a larger k was not tried)" if at_top else ""))
    beyond = sorted({k for v in best.values() for k in v.values() if k > fitted})
    return (f"Searched k = {min(ks)}–{top}: " + "; ".join(parts) + "."
            + (f" The costs were fitted on rows with k ≤ {fitted}, so a best k of {listed(beyond)} extrapolates the "
               "forward's and the drafter's linear fits beyond the measured k." if beyond else ""))


# -- held out: kit.bench.holdout on the committed engine runs ----------------------------------------

def _held(result: list[dict]) -> list[tuple[str, dict]]:
    return [(s["name"], g) for s in result for g in s["rows"]]


def holdout_table(result: list[dict], band: float) -> list[dict]:
    """One record per held-out prediction of :func:`kit.bench.holdout.evaluate`'s ``result``, for a table."""
    out = []
    for name, g in _held(result):
        iv = g["interval"]
        src = "its own group" if g["source"] == (g["model"], g["pp"], g["batch"]) else \
            f"{g['source'][0]} PP={g['source'][1]} batch {g['source'][2]}"
        out.append({"split": name, "held-out row": g["label"], "costs fitted from": src,
                    "occupancy predicted": round(g["occupancy"], 2),
                    "occupancy measured": (None if g["occupancy_measured"] is None
                                           else round(g["occupancy_measured"], 2)),
                    "predicted": round(g["predicted"], 2), "measured": round(g["measured"], 2),
                    "measured 95 % interval": "-" if not iv else f"{iv[0]:.2f}–{iv[1]:.2f}",
                    "error %": round(100 * g["error"], 1), f"within ±{band:.0%}": abs(g["error"]) <= band})
    return out


def wrong_side(result: list[dict]) -> list[tuple[str, dict]]:
    """The held-out predictions on the other side of break-even (1.0x) than the measurement: the model said
    "pays" where speculation lost, or the reverse."""
    return [(n, g) for n, g in _held(result) if (g["predicted"] > 1.0) != (g["measured"] > 1.0)]


def holdout_summary(result: list[dict], band: float) -> str:
    """The held-out result in words: how many predictions lie within ``band``, per split its count, mean and worst
    error, the worst row, and the rows where the prediction is on the wrong side of break-even (with the
    occupancy the schedule predicted against the one measured)."""
    held = _held(result)
    if not held:
        return "**Held out:** no row could be predicted."
    inside = sum(abs(g["error"]) <= band for _, g in held)
    worst_name, worst = max(held, key=lambda x: abs(x[1]["error"]))
    lines = [f"**Held out:** {inside} of {len(held)} predictions lie within ±{band:.0%} of the measured speed-up; "
             f"the worst, `{worst['label']}` ({worst_name}), is {100 * worst['error']:+.0f} % off "
             f"(predicted {worst['predicted']:.2f}x, measured {worst['measured']:.2f}x)."]
    for s in result:
        if not s["rows"]:
            continue
        n_in = sum(abs(g["error"]) <= band for g in s["rows"])
        lines.append(f"- {s['name']} ({s['fit']} fit rows): {n_in} of {len(s['rows'])} within ±{band:.0%}, mean "
                     f"error {100 * s['mean_abs_error']:.0f} %, worst {100 * s['max_abs_error']:.0f} %"
                     + (f"; {len(s['skipped'])} held-out rows not predictable" if s["skipped"] else "") + ".")
    ivs = [g for _, g in held if g["interval"]]
    if ivs:
        wide = sum(g["interval"][0] < (1 - band) * g["measured"] or g["interval"][1] > (1 + band) * g["measured"]
                   for g in ivs)
        within = sum(g["interval"][0] <= g["predicted"] <= g["interval"][1] for g in ivs)
        lines.append(f"- Noise: in {wide} of {len(ivs)} rows the measured speed-up's 95 % interval reaches beyond "
                     f"±{band:.0%} of its median; {within} of {len(ivs)} predictions lie inside the measured interval.")
    wrong = wrong_side(result)
    good = len(held) - len(wrong)
    lines.append(f"- Pays or loses: the prediction lies on the measured side of break-even (1.0x) in {good} of "
                 f"{len(held)} rows" + ("." if not wrong else "; not in " + "; ".join(
                     f"`{g['label']}` ({n}: predicted {g['predicted']:.2f}x, measured {g['measured']:.2f}x; "
                     f"occupancy predicted {g['occupancy']:.2f}, measured "
                     + ("-" if g["occupancy_measured"] is None else f"{g['occupancy_measured']:.2f}") + ")"
                     for n, g in wrong) + "."))
    return "\n".join(lines)


def in_place_summary(preds: list[dict], band: float) -> str:
    """The in-place fit (each group fitted on the rows it then describes, the occupancy read from each row) in
    words: a consistency check of the cost model, not a prediction."""
    err = [p["error_at_occupancy"] for p in preds]
    full = [p for p in preds if p["agrees"]]
    return (f"**Consistency check (fitted on the rows it describes, not a prediction):** at each row's measured "
            f"occupancy the fit lies within ±{band:.0%} in {sum(p['agrees_at_occupancy'] for p in preds)} of "
            f"{len(preds)} rows (error {100 * min(err):+.0f} % to {100 * max(err):+.0f} %); at full steps in "
            f"{len(full)} of {len(preds)}.")


# -- the bench timeline ------------------------------------------------------------------------------

def timeline_summary(summaries: dict[str, dict]) -> str:
    """Per traced run (``{label: kit.worker.steptrace.summary(...)}``): each stage's busy share of a decode step's
    period, its wait for the previous stage, and how many decode steps had two micro-batches in flight."""
    lines = []
    for label, t in summaries.items():
        period = t.get("period") or 0.0
        if not period:
            continue
        stages = ", ".join(f"stage {s['rank']} busy {s['busy'] / period:.0%}, waiting {s['recv'] / period:.0%}, "
                           f"idle {s['idle'] / period:.0%}" for s in t["stages"])
        lines.append(f"- `{label}`: a decode step every {1e3 * period:.2f} ms carrying {t['reqs_per_step']:.2f} "
                     f"requests; {stages}; {t['in_flight']['overlap_steps']} of {t['decode_steps']} decode steps with "
                     "two micro-batches in flight.")
    return "\n".join(lines)


def takeaway(preds: list[dict], result: list[dict], band: float) -> str:
    """The notebook's closing paragraph: where speculation paid in the recorded rows (and the rows where it lost,
    with their occupancy), the break-even against the measured acceptance, and how well the model predicts rows
    it was not fitted on. A pred with ``interval`` (the measured speed-up's bootstrap 95 % interval, lo and hi)
    counts as faster or slower only when the interval lies wholly on that side of 1.0x; the rest are named as not
    told apart."""
    def side(p: dict) -> str:
        lo, hi = p.get("interval") or (p["measured"], p["measured"])
        return "paid" if lo > 1.0 else "lost" if hi <= 1.0 else "open"

    paid = [p for p in preds if side(p) == "paid"]
    lost = [p for p in preds if side(p) == "lost"]
    open_ = [p for p in preds if side(p) == "open"]
    a_star = [p["break_even"] for p in preds if p["break_even"] is not None]
    held = _held(result)
    inside = sum(abs(g["error"]) <= band for _, g in held)
    worst = max((abs(g["error"]) for _, g in held), default=0.0)
    above = all(p["break_even"] is not None and p["acceptance"] > p["break_even"] for p in preds)
    name = lambda p: f"{p['model']} PP={p['pp']} batch {p['batch']} k={p['k']}"  # noqa: E731
    iv = lambda p: f" [{p['interval'][0]:.2f}–{p['interval'][1]:.2f}]" if p.get("interval") else ""  # noqa: E731
    first = (f"MTP decoded faster than no speculation in {len(paid)} of {len(preds)} recorded rows, its measured "
             f"acceptance ({span([p['acceptance'] for p in preds])}) "
             + ("above the break-even a* in every row" if above else "below the break-even a* in some rows")
             + f" (a* {span(a_star)})" + ("" if not lost else "; it lost only in " + ", ".join(
                 f"{name(p)} ({p['measured']:.2f}x{iv(p)}), where its speculative steps were {p['occupancy']:.0%} "
                 "full" for p in lost))
             + ("" if not open_ else "; not told apart from no speculation in " + ", ".join(
                 f"{name(p)} ({p['measured']:.2f}x{iv(p)}, steps {p['occupancy']:.0%} full)" for p in open_))
             + ".")
    second = (f"Held out, the step-cost model predicts {inside} of {len(held)} speed-ups within ±{band:.0%} "
              f"(the worst {100 * worst:.0f} % off), so read its surface as a guide to the break-even, not to the "
              "second decimal.")
    return f"**Takeaway:** {first} {second}"


def model_shapes(models: list[str]) -> str:
    """Each model's shape from its config (``data/models/``): decoder layers, hidden size, MTP layers."""
    from kit.core.models import resolve_model

    out = []
    for m in models:
        info = resolve_model(m)
        c = info.config
        out.append(f"`{m}`: {info.num_layers} decoder layers, hidden size {c.get('hidden_size')}, vocabulary "
                   f"{c.get('vocab_size')}, {info.num_mtp_layers} MTP layer(s)"
                   + ("" if info.has_trained_weights else " (random weights)"))
    return "**The models:** " + "; ".join(out) + "."


def timeline_findings(traces: list[dict], summaries: dict[str, dict]) -> str:
    """What the traced runs show, per model and batch: the last stage's computing time per step without drafts and
    with them (and which way its share of the step moved), and the requests a step carried against the batch.
    ``traces``: the trace records (``model``, ``topology`` as ``"pp2 mtp:2 b4"``), ``summaries`` their
    :func:`kit.worker.steptrace.summary` under ``f"{model} {topology}"``."""
    by: dict[tuple, dict[str, dict]] = {}
    for t in traces:
        _, spec, b = t["topology"].split()[:3]
        by.setdefault((t["model"], int(b.lstrip("b"))), {})[spec] = summaries[f"{t['model']} {t['topology']}"]
    lines = []
    for (m, b), specs in by.items():
        plain = specs.get("none")
        for spec, t in specs.items():
            if spec == "none" or plain is None:
                continue
            lp, ls = plain["stages"][-1], t["stages"][-1]
            sp, ss = lp["busy"] / plain["period"], ls["busy"] / t["period"]
            word = "larger" if ss > sp + 0.005 else "smaller" if ss < sp - 0.005 else "the same"
            lines.append(f"- `{m}`, batch {b}: with `{spec}` the last stage computes {1e3 * ls['busy']:.2f} ms of a "
                         f"{1e3 * t['period']:.2f} ms step against {1e3 * lp['busy']:.2f} of "
                         f"{1e3 * plain['period']:.2f} "
                         f"without drafts, a {word} share ({ss:.0%} against {sp:.0%}); a step carries "
                         f"{t['reqs_per_step']:.2f} requests against {plain['reqs_per_step']:.2f} without drafts"
                         + (f" ({t['held_out']} times a running request was held out of a step)" if t.get("held_out")
                            else "") + ".")
    return "\n".join(lines)


def pipelined_findings(checks: dict[str, dict]) -> str:
    """What the pipelined prediction shows (``{label: kit.bench.pipelined.check(...)}``): which bound set the
    period, how far off the prediction was and in which direction, and the speed-up per step against per request."""
    if not checks:
        return ""
    errs = [c["error"] for c in checks.values()]
    bound_names = sorted({c["bound"] for c in checks.values()})
    direction = ("optimistic (the measured step was longer)" if all(e < 0 for e in errs) else
                 "pessimistic (the measured step was shorter)" if all(e > 0 for e in errs) else "off both ways")
    rows = "; ".join(f"{label.split(' ', 1)[1]}: {1e3 * c['period']:.2f} ms predicted, {1e3 * c['measured']:.2f} ms "
                     f"measured, {c['speedup']:.2f}x predicted against {c['measured_speedup']:.2f}x per step and "
                     f"{c['measured_speedup_per_request']:.2f}x per request" for label, c in checks.items())
    return (f"**What the prediction shows:** the bound that set the period was the {' and the '.join(bound_names)} "
            f"bound; the prediction was {direction}, by {span([abs(e) for e in errs], '{:.0%}')} ({rows}). What "
            "the bounds leave out: in the pipelined run a group's step queues behind the other group's on the busy "
            "last stage, so its round trip is longer than the serial step it was predicted from, and rank 0 waits "
            "for it. The speed-up per request can differ from the one per step where the two runs' steps carried "
            "slightly different numbers of requests (requests finishing at different times).")
