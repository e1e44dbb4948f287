"""What notebook 05 (does speculation pay?) says about the recorded rows, as Markdown formatted from them: every number
and direction (which PP size pays more, whether a* rises or falls, how much of a step the forward is) comes from the
rows, the fitted costs and the predictions passed in, so the prose cannot drift from the data.

Inputs are those of the notebook: ``rows`` as in ``docs/results/bench.json``, ``costs`` from
:func:`kit.bench.payoff.costs_by_group` and ``preds`` from :func:`kit.bench.payoff.predict`. Nothing here measures.
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
