"""kit.bench.payoff: the break-even model's pure functions (no engine), and one small engine run of the measurement path."""
import json
import math

import pytest

from kit.bench.payoff import (
    Costs,
    acceptance_for_length,
    expected_tokens,
    fit_costs,
    fit_linear,
    predict,
    step_components,
    timeline,
)


def test_expected_tokens():
    assert expected_tokens(0.0, 3) == 1.0
    assert expected_tokens(1.0, 3) == 4.0
    assert math.isclose(expected_tokens(0.5, 2), 1.75)
    with pytest.raises(ValueError):
        expected_tokens(1.5, 2)


@pytest.mark.parametrize("a,k", [(0.1, 1), (0.6, 2), (0.9, 3), (0.99, 4)])
def test_acceptance_for_length_inverts(a, k):
    assert math.isclose(acceptance_for_length(expected_tokens(a, k), k), a, abs_tol=1e-9)


def test_acceptance_for_length_clips():
    assert acceptance_for_length(0.9, 2) == 0.0
    assert acceptance_for_length(5.0, 2) == 1.0


def test_fit_linear():
    assert fit_linear([1, 2, 3], [3, 5, 7]) == pytest.approx((1.0, 2.0))
    assert fit_linear([2, 2], [1, 3]) == (2.0, 0.0)


def _costs(**kw):
    base = dict(fixed_nospec_s=0.002, fixed_spec_s=0.003, forward_base_s=0.008, forward_per_token_s=0.001,
                draft_base_s=0.0, draft_per_token_s=0.001)
    base.update(kw)
    return Costs(**base)


def test_step_and_speedup():
    c = _costs()
    assert c.step_s(0) == pytest.approx(0.011)          # 2 + 8 + 1 ms
    assert c.step_s(2) == pytest.approx(0.016)          # 3 + 8 + 3 + 2 ms
    assert c.speedup(0.0, 2) == pytest.approx(0.011 / 0.016)
    assert c.speedup(1.0, 2) == pytest.approx(3 * 0.011 / 0.016)
    assert c.speedup_at_length(2.0, 2) == pytest.approx(2 * 0.011 / 0.016)


def test_break_even_solves_speedup_one():
    c = _costs()
    for k in (1, 2, 3):
        a = c.break_even(k)
        assert 0 < a < 1
        assert c.speedup(a, k) == pytest.approx(1.0, abs=1e-6)
        assert c.speedup(min(1.0, a + 0.05), k) > 1 > c.speedup(max(0.0, a - 0.05), k)


def test_break_even_never_and_always():
    # A drafter so slow that even perfect acceptance loses; a free speculation that always pays.
    assert _costs(draft_per_token_s=0.1).break_even(1) is None
    assert _costs(fixed_spec_s=0.0, forward_per_token_s=0.0, draft_per_token_s=0.0, fixed_nospec_s=0.003).break_even(2) == 0.0


def test_fit_costs_recovers_a_known_model():
    true = _costs(draft_base_s=0.0005)
    comps = {}
    for k in (0, 1, 2, 3):
        fwd = true.forward_s(k + 1)
        draft = 0.0 if k == 0 else true.draft_base_s + true.draft_per_token_s * k
        fixed = true.fixed_nospec_s if k == 0 else true.fixed_spec_s
        comps[k] = {"forward_s": fwd, "draft_s": draft, "period_s": fixed + fwd + draft}
    got = fit_costs(comps)
    for k in (0, 1, 2, 3, 5):
        assert got.step_s(k) == pytest.approx(true.step_s(k))
    with pytest.raises(ValueError):
        fit_costs({1: comps[1]})


def _ev(kind, t0, t1, tokens=None):
    """One kit.worker.steptrace event (the fields kit.bench.payoff reads)."""
    return {"kind": kind, "t0": t0, "t1": t1, **({"tokens": tokens} if kind == "model" else {})}


def _events(period, fwd, draft, steps, tokens, t0=0.0, prefill=None):
    ev, t = [], t0
    if prefill:
        ev.append(_ev("model", t, t + 0.05, prefill))
        t += 0.06
    for _ in range(steps):
        ev.append(_ev("forward", t, t + fwd + 0.0001))
        ev.append(_ev("model", t, t + fwd, tokens))
        if draft:
            ev.append(_ev("propose", t + fwd + 0.0002, t + fwd + 0.0002 + draft))
        t += period
    return ev


def test_step_components_from_spans():
    rank = {"pp_rank": 0, "is_last_rank": True,
            "events": _events(0.010, 0.006, 0.002, 50, 3, prefill=40) + _events(0.010, 0.006, 0.002, 50, 3, t0=5, prefill=40)}
    c = step_components([rank], k=2, batch=1)
    assert c["steps"] == 100
    assert c["period_s"] == pytest.approx(0.010)         # the prefill gaps between requests are not steps
    assert c["forward_s"] == pytest.approx(0.006)
    assert c["draft_s"] == pytest.approx(0.002)
    assert c["fixed_s"] == pytest.approx(0.002)


def test_timeline_serial_and_overlapping_stages():
    # Stage 1 computes after stage 0 each step (serial), or during stage 0's next forward (overlapped).
    s0 = {"pp_rank": 0, "is_last_rank": False, "events": [_ev("model", i * 0.01, i * 0.01 + 0.004, 1) for i in range(20)]}
    serial = {"pp_rank": 1, "is_last_rank": True,
              "events": [_ev("model", i * 0.01 + 0.005, i * 0.01 + 0.009, 1) for i in range(20)]}
    over = {"pp_rank": 1, "is_last_rank": True,
            "events": [_ev("model", i * 0.01 + 0.002, i * 0.01 + 0.006, 1) for i in range(20)]}
    assert timeline([s0, serial], 1)["forward_overlap"] == pytest.approx(0.0)
    assert timeline([s0, over], 1)["forward_overlap"] == pytest.approx(0.5)
    st = timeline([s0, serial], 1)["stages"]
    assert st[0]["busy"] == pytest.approx(0.08 / 0.194, rel=1e-6)


def test_predict_flags_rows_outside_the_band():
    true = _costs()
    rows = []
    for k, length in ((0, 1.0), (1, 1.8), (2, 2.4)):
        fwd = true.forward_s(k + 1)
        draft = 0.0 if k == 0 else true.draft_per_token_s * k
        fixed = true.fixed_nospec_s if k == 0 else true.fixed_spec_s
        period = fixed + fwd + draft
        rows.append({"model": "m", "pp": 1, "batch": 1, "k": k, "tokens_per_forward": length,
                     "decode_tok_s": length / period, "components": {"forward_s": fwd, "draft_s": draft, "period_s": period}})
    out = predict(rows)
    assert [p["k"] for p in out] == [1, 2]
    assert all(p["agrees"] and abs(p["error"]) < 1e-9 for p in out)
    rows[2]["decode_tok_s"] *= 1.5  # a measurement the model cannot explain
    out = predict(rows)
    assert out[0]["agrees"] and not out[1]["agrees"]
    assert out[0]["occupancy"] is None  # no step counts: no occupancy


def test_prediction_at_the_measured_occupancy_explains_half_empty_steps():
    """A speculative engine whose steps carry half the requests (a split batch) needs twice the steps for the same
    tokens and runs at half the full-step speed-up; the prediction at the measured occupancy says so."""
    from kit.bench.payoff import occupancy

    true = _costs()
    rows = []
    tokens = 2048
    for k, length, full in ((0, 1.0, 1.0), (2, 2.4, 0.5)):
        fwd = true.forward_s(k + 1)
        draft = 0.0 if k == 0 else true.draft_per_token_s * k
        period = (true.fixed_nospec_s if k == 0 else true.fixed_spec_s) + fwd + draft
        steps = tokens / length / full  # batch 1 here: "half full" stands for half the plain engine's requests
        rows.append({"model": "m", "pp": 2, "batch": 4, "k": k, "tokens_per_forward": length,
                     "decode_tok_s": tokens / (steps * period),
                     "components": {"forward_s": fwd, "draft_s": draft, "period_s": period, "steps": steps}})
    (p,) = predict(rows)
    assert p["occupancy"] == pytest.approx(0.5) == occupancy(tokens, tokens / 2.4 / 0.5, 2.4)
    assert not p["agrees"] and p["error"] == pytest.approx(1.0)  # full steps would be twice as fast
    assert p["agrees_at_occupancy"] and abs(p["error_at_occupancy"]) < 1e-9


@pytest.mark.slow  # the default selection: notebook 05's live run times the same spans and checks the prediction
@pytest.mark.engine
def test_breakdown_measures_a_real_engine(no_leftovers):
    """One small PP=1 mtp:1 engine with the step timers on: the spans add up to the wall clock of the decode."""
    from kit.bench import measure_batches
    from kit.checks.compare import load_prompts
    from kit.core.topology import Topology

    prompts = load_prompts(limit=2)
    rows = measure_batches(Topology(model="tiny-mimo", spec="mtp:1"), prompts, 24, batches=[1, 2], timing=True)
    assert sorted(rows) == [1, 2]
    for b, r in rows.items():
        c = r["components"]
        assert c is not None, b
        # Every decode step was seen (a step emits 1 or 2 tokens per request; each group's first token is the prefill's).
        assert 23 * len(prompts) / 2 / b <= c["steps"] * 1.0 <= 23 * len(prompts) / b + 1, (b, c["steps"])
        assert 0 < c["forward_s"] < c["period_s"] and 0 < c["draft_s"] < c["period_s"]
        # The step period times the steps cannot exceed the measured decode time of the groups.
        assert c["period_s"] * c["steps"] <= len(prompts) * 24 / r["decode_tok_s"] * 1.05
        assert c["timeline"]["stages"][0]["busy"] > 0


def test_plots_draw_the_break_even_line_and_the_points():
    from kit.lab import payoff_plots

    c = {("m", 1, 1): _costs(), ("m", 2, 1): _costs(fixed_spec_s=0.008)}
    fig = payoff_plots.surface_figure(c, [{"model": "m", "pp": 1, "batch": 1, "k": 2, "acceptance": 0.8,
                                           "measured": 1.5, "predicted": 1.6}], ks=(1, 2, 3))
    lines = [t for t in fig.data if t.name == "break-even"]
    assert len(lines) == 2
    assert list(lines[0].x) == pytest.approx([c[("m", 1, 1)].break_even(k) for k in (1, 2, 3)])
    assert [t.text for t in fig.data if t.name == "measured / predicted"] == [("1.50x / 1.60x",)]
    bars = payoff_plots.bars_figure(c, 0.8, 2).data[0]
    assert list(bars.y) == pytest.approx([c[key].speedup(0.8, 2) for key in c])


def test_surface_colour_is_white_at_break_even_and_axes_span_the_grid():
    from kit.lab import payoff_plots

    ks = (1, 2, 3)
    # "never": a step so dear that even a = 1 loses at every k (no break-even point to draw).
    c = {("m", 1, 1): _costs(), ("m", 2, 1): _costs(fixed_spec_s=0.008), ("m", 4, 1): _costs(fixed_spec_s=0.2)}
    fig = payoff_plots.surface_figure(c, ks=ks)
    heat = [t for t in fig.data if t.type == "heatmap"]
    lim = payoff_plots.colour_limit(c, ks)
    assert len(heat) == 3
    for t, cost in zip(heat, c.values()):
        # Coloured by log2(speed-up) over a range symmetric around 0: 1.0x sits in the middle of the scale, whose
        # middle stop is white; the hover reads the speed-up itself.
        assert (t.zmin, t.zmax, t.zmid) == (-lim, lim, 0.0)
        assert list(t.customdata[1]) == pytest.approx([cost.speedup(a, 2) for a in payoff_plots.A_GRID])
        assert list(t.z[1]) == pytest.approx([math.log2(cost.speedup(a, 2)) for a in payoff_plots.A_GRID])
    assert dict((pos, col) for pos, col in heat[0].colorscale)[0.5] == "rgb(255,255,255)"
    assert payoff_plots.colour_at(1.0, lim) == (255.0, 255.0, 255.0)
    r, g, b = payoff_plots.colour_at(2.0, lim)
    assert b > r  # blue where speculation pays
    r, g, b = payoff_plots.colour_at(0.5, lim)
    assert r > b  # red where it loses
    assert payoff_plots.colour_at(1e6, lim) == (5.0, 48.0, 97.0)  # clipped at the scale's ends
    bar = heat[0].colorbar
    assert dict(zip(bar.tickvals, bar.ticktext))[0.0] == "1x break-even"
    assert all(abs(v) <= lim for v in bar.tickvals)
    assert lim == pytest.approx(max(abs(math.log2(x.speedup(a, k))) for x in c.values() for k in ks
                                    for a in payoff_plots.A_GRID))
    # The axes span what is drawn: k from the first to the last (no empty rows), a over the grid.
    for axis in (fig.layout.yaxis, fig.layout.yaxis2, fig.layout.yaxis3):
        assert list(axis.range) == [0.5, 3.5] and list(axis.tickvals) == [1, 2, 3]
    for axis in (fig.layout.xaxis, fig.layout.xaxis2, fig.layout.xaxis3):
        assert list(axis.range) == [0.0, 1.0]
    never = [t for t in fig.data if t.name == "break-even"][2]
    assert list(never.x) == [None, None, None]  # no point where even a = 1 loses (was drawn at a = 1)


def test_surface_labels_contrast_with_the_colour_under_them():
    from kit.lab import payoff_plots

    assert payoff_plots.text_colour((255, 255, 255)) == "black"
    assert payoff_plots.text_colour((5, 48, 97)) == "white"
    assert payoff_plots.text_colour((103, 0, 31)) == "white"
    c = {("m", 1, 1): _costs()}  # k=2: 0.77x at a = 0.1, 1.87x at a = 0.9
    pts = [{"model": "m", "pp": 1, "batch": 1, "k": 2, "acceptance": a, "measured": 1.0, "predicted": 1.0}
           for a in (0.2, 1.0)]
    fig = payoff_plots.surface_figure(c, pts, ks=(1, 2, 3))
    lim = payoff_plots.colour_limit(c, (1, 2, 3))
    marks = next(t for t in fig.data if t.name == "measured / predicted")
    # Each label sits left of its marker: its colour follows the surface there, dark blue under the right one.
    under = [payoff_plots.colour_at(c[("m", 1, 1)].speedup(a - 0.1, 2), lim) for a in (0.2, 1.0)]
    assert list(marks.textfont.color) == [payoff_plots.text_colour(u) for u in under] == ["black", "white"]
    assert marks.textfont.shadow == "auto"


def test_best_k_says_when_it_is_the_top_of_the_range_searched():
    from kit.lab import payoff_plots

    c, searched = _costs(), range(1, 7)
    k9, k5 = (max(searched, key=lambda k: c.speedup(a, k)) for a in (0.9, 0.5))
    assert k9 == 6 and c.speedup(0.9, 6) > c.speedup(0.9, 5)  # still rising at the top: a larger k might pay more
    assert payoff_plots.best_k_text(k9, searched) == "≥ 6 (top of the range searched)"
    assert k5 < 6 and payoff_plots.best_k_text(k5, searched) == str(k5)
    assert payoff_plots.best_k_text(6, range(1, 9)) == "6"


def _pred(model, pp, batch, k, measured, acceptance=0.9, occupancy=1.0, **kw):
    return dict(model=model, pp=pp, batch=batch, k=k, measured=measured, acceptance=acceptance, occupancy=occupancy,
                predicted=measured, predicted_at_occupancy=measured, agrees_at_occupancy=True, **kw)


def test_payoff_text_states_what_the_rows_say():
    """Notebook 05's sentences about the recorded rows: directions and numbers from the rows, both ways."""
    from kit.lab import payoff_text

    cheap, dear = _costs(), _costs(fixed_spec_s=0.006)  # a speculative step dearer at PP=2 for "m", cheaper for "n"
    costs = {("m", 1, 1): cheap, ("m", 2, 1): dear, ("n", 1, 1): dear, ("n", 2, 1): cheap}
    preds = [_pred("m", 1, 1, 2, 2.0, break_even=cheap.break_even(2)), _pred("m", 2, 1, 2, 1.5, break_even=dear.break_even(2)),
             _pred("n", 1, 1, 2, 1.5, break_even=dear.break_even(2)), _pred("n", 2, 1, 2, 1.52, break_even=cheap.break_even(2))]
    text = payoff_text.break_even(costs, preds).splitlines()
    assert text[0].startswith("- `m`, batch 1 (PP 1, 2; k 2): measured acceptance a = 0.90 against a* = "
                              f"{cheap.break_even(2):.2f}–{dear.break_even(2):.2f}, above a* in every row; "
                              "measured speed-up 1.50x–2.00x.")
    assert text[2].startswith("- `m`, batch 1: from PP=1 to PP=2 a* rises at every measured k (k=2: a* "
                              f"{cheap.break_even(2):.2f} → {dear.break_even(2):.2f}, T(2)/T(0) "
                              f"{cheap.step_s(2) / cheap.step_s(0):.2f} → {dear.step_s(2) / dear.step_s(0):.2f}")
    assert text[3].startswith("- `n`, batch 1: from PP=1 to PP=2 a* falls at every measured k")
    low = [dict(p, acceptance=0.1) for p in preds]
    assert "not above a* in every row" in payoff_text.break_even(costs, low)

    rows = [{"pp": 2, "components": {"timeline": {"forward_overlap": x}}} for x in (0.0, 0.25)] + [{"pp": 1, "components": {}}]
    text = payoff_text.pp_compare(rows, costs, preds).splitlines()
    assert text[0].startswith("- `m`, batch 1: PP=2 pays less than PP=1 at every k: measured speed-up k=2 1.50x "
                              "against 2.00x (less); occupancy of its speculative steps 1.00 against 1.00; fixed cost "
                              "of a speculative step 6.00 ms against 3.00 ms.")
    assert text[1].startswith("- `n`, batch 1: PP=2 pays about the same as PP=1 at every k: measured speed-up k=2 "
                              "1.52x against 1.50x (about the same)")
    assert text[2] == "- Forward overlap (two stages computing at once, as a share of stage 0's forward time) in the 2 PP=2 rows: 0%–25%."
    # A half-empty step where PP=2 pays less: the prediction at the measured occupancy says so.
    half = [dict(p, occupancy=0.5, predicted_at_occupancy=1.45) if (p["model"], p["pp"]) == ("m", 2) else p for p in preds]
    assert ("Where it pays less its speculative steps were emptier: at their measured occupancy the model predicts "
            "k=2: 1.45x against 1.50x measured.") in payoff_text.pp_compare(rows, costs, half)


def test_payoff_text_coverage_share_and_best_k():
    from kit.lab import payoff_text

    rows = [{"model": "m", "pp": pp, "k": k, "batch": b, "runs": 3} for pp in (1, 2) for k in (0, 2) for b in (1, 4)]
    assert payoff_text.coverage(rows) == ("**The recorded run covers:**\n"
                                          "- `m`: PP 1, 2; k 0, 2 (0: no speculation); batch 1, 4; 3 engines per row")
    fwd = _costs(fixed_nospec_s=0.002)  # forward 9 ms of an 11 ms step
    fixed = _costs(fixed_nospec_s=0.030)  # 9 of 39 ms
    assert payoff_text.forward_share({("a", 1, 1): fwd, ("b", 1, 1): fixed}) == (
        "**The target forward's share of a plain step T(0)**, over PP sizes and batches: `a` 82% (most of it); "
        "`b` 23% (less than half: the fixed part is most of it).")
    assert payoff_text.best_k_top({"g": {0.5: 2, 0.9: 6}, "h": {0.5: 2, 0.9: 5}}, range(1, 7)) == (
        "At a = 0.9 the best k is the top of the range searched in 1 of 2 groups: there it is at least 6, and a "
        "larger k was not tried.")
    assert payoff_text.best_k_top({"g": {0.5: 2}}, range(1, 7)) == "No best k is the top of the range searched (6)."


def test_notebook_05_prose_matches_the_committed_rows():
    """The committed docs/results/bench.json through notebook 05's own formatting: every direction word agrees with
    the numbers printed beside it."""
    import json
    import re

    from conftest import ROOT
    from kit.bench import payoff
    from kit.lab import payoff_text

    rows = json.loads((ROOT / "docs/results/bench.json").read_text())["rows"]
    prows = [{"model": r["model"], "pp": r["pp"], "batch": r["batch"], "k": r["k"],
              "decode_tok_s": r["decode_tok_s"]["median"], "tokens_per_forward": r["mean_accept_len"] or 1.0,
              "components": r["components"]} for r in rows if r.get("batch") and r.get("components")]
    costs, preds = payoff.costs_by_group(prows), payoff.predict(prows)
    for line in payoff_text.break_even(costs, preds).splitlines():
        pairs = [(float(a), float(b)) for a, b in re.findall(r"a\* ([0-9.]+) → ([0-9.]+)", line)]
        if "rises at every" in line:
            assert pairs and all(b > a for a, b in pairs), line
        if "falls at every" in line:
            assert pairs and all(b < a for a, b in pairs), line
    for line in payoff_text.pp_compare(rows, costs, preds).splitlines():
        for new, old, word in re.findall(r"k=\d ([0-9.]+)x against ([0-9.]+)x \(([a-z ]+)\)", line):
            new, old = float(new), float(old)
            assert {"less": new < old, "more": new > old, "about the same": abs(new / old - 1) <= 0.03}[word], line


# -- held-out predictions (kit.bench.holdout) ----------------------------------------------------------------------

def _law_row(c, model, pp, batch, k, length, occ=1.0, draft_scale=1.0):
    """A row generated from the cost law ``c`` (at this batch): its components and a decode speed that follows from
    them, with ``occ`` of the batch in every speculative step (a split batch needs 1/occ times the steps)."""
    fwd = c.forward_s(batch * (k + 1))
    draft = 0.0 if k == 0 else (c.draft_base_s + c.draft_per_token_s * k) * draft_scale
    period = (c.fixed_nospec_s if k == 0 else c.fixed_spec_s) + fwd + draft
    tokens = 512
    steps = tokens / batch / length / (occ if k else 1.0)
    return {"model": model, "pp": pp, "batch": batch, "k": k, "tokens_per_forward": length,
            "decode_tok_s": tokens / (steps * period), "label": f"{model} pp{pp} k={k} b{batch}",
            "components": {"forward_s": fwd, "draft_s": draft, "period_s": period, "steps": steps}}


_LENGTHS = {0: 1.0, 1: 1.8, 2: 2.4, 3: 2.9}


def _law_rows(model="m", batches=(1, 4), pps=(1, 2), ks=(0, 1, 2, 3), base=None, patches=None):
    """Rows of every (PP, batch, k) from one cost law per PP, their steps as full as
    :func:`kit.bench.holdout.schedule_occupancy` predicts for the patch selection ``patches`` (``KIT_PATCHES``;
    with ``pp_microbatches`` off the speculative steps at PP=2 and batch 4 carry half the batch, the gate's split)."""
    from kit.bench.holdout import microbatches_on, schedule_occupancy

    on = microbatches_on({"kit_patches": patches})
    rows = []
    for pp in pps:
        law = base or _costs(draft_base_s=0.0005, fixed_spec_s=0.003 + 0.001 * (pp - 1))
        for b in batches:
            # The drafter at batch b costs what the target forward does relative to batch 1 (transfer's rule).
            scale = law.forward_s(b) / law.forward_s(1)
            lawb = Costs(**{**law.to_dict(), "batch": b, "pp": pp})
            rows += [{**_law_row(lawb, model, pp, b, k, _LENGTHS[k], schedule_occupancy(pp, b, k, on), scale),
                      **({"kit_patches": patches} if patches else {})} for k in ks]
    return rows


def _split(result, name):
    return next(s for s in result if s["name"] == name)


def test_holdout_predicts_a_larger_k_from_the_same_cost_law_exactly():
    from kit.bench.holdout import evaluate

    for patches, occ in ((None, 1.0), ("all,-pp_microbatches", 0.5)):
        rows = _law_rows(batches=(1, 4), pps=(1, 2), patches=patches)
        s = _split(evaluate(rows), "fit k<=2 -> predict k=3")
        assert [(g["pp"], g["batch"], g["k"]) for g in s["rows"]] == [(1, 1, 3), (1, 4, 3), (2, 1, 3), (2, 4, 3)]
        assert s["fit"] == len(rows) - 4 and not s["skipped"]
        assert s["max_abs_error"] < 1e-9, patches
        # Pipelined, plain and speculative batches split alike (full steps); with vLLM's loop and the gate the
        # PP=2 batch-4 row ran half full: the occupancy was predicted from the schedule, not read.
        assert [g["occupancy"] for g in s["rows"]] == [1.0, 1.0, 1.0, occ]
        assert all(g["source"] == (g["model"], g["pp"], g["batch"]) for g in s["rows"])


def test_holdout_carries_costs_across_batch_and_model_when_the_law_holds():
    from kit.bench.holdout import evaluate

    rows = _law_rows(batches=(1, 4), pps=(1, 2))
    s = _split(evaluate(rows), "fit batch 1 -> predict batch 4")
    assert len(s["rows"]) == 6 and s["max_abs_error"] < 1e-9
    assert {g["source"] for g in s["rows"]} == {("m", 1, 1), ("m", 2, 1)}
    # Another model: the same law with every forward twice as dear and twice the layers (the drafter per layer the
    # same), measured at k=0 and 2 only; predicted from "m" at the same PP and batch.
    big = _costs(draft_base_s=0.0005, forward_base_s=0.016, forward_per_token_s=0.002)
    other = _law_rows("n", batches=(1,), pps=(1,), ks=(0, 2), base=big)
    got = evaluate(rows + other, layers={"m": 4, "n": 8})
    s = _split(got, "fit m -> predict n")
    assert [g["label"] for g in s["rows"]] == ["n pp1 k=2 b1"] and s["rows"][0]["source"] == ("m", 1, 1)
    assert s["max_abs_error"] < 1e-9
    # Without the layer counts the model split cannot carry the drafter over: said, not guessed.
    s = _split(evaluate(rows + other), "fit m -> predict n")
    assert not s["rows"] and "layer counts" in s["skipped"][0]["why"]


def test_holdout_prediction_can_fail():
    """A held-out row that does not follow the fitted law (a slower engine, a split batch the schedule does not
    predict) gets a large error: the prediction is not the measurement read back."""
    from kit.bench.holdout import evaluate

    rows = _law_rows(batches=(1,), pps=(1,))
    rows[3]["decode_tok_s"] /= 1.5
    (g,) = _split(evaluate(rows), "fit k<=2 -> predict k=3")["rows"]
    assert g["error"] == pytest.approx(0.5)
    # PP=1 batch 4 whose speculative steps were half full: the schedule says full, so the prediction is 2x.
    rows = _law_rows(batches=(1, 4), pps=(1,))
    for r in rows:
        if r["batch"] == 4 and r["k"]:
            r["decode_tok_s"] /= 2
            r["components"]["steps"] *= 2
    s = _split(evaluate(rows), "fit batch 1 -> predict batch 4")
    assert all(g["error"] == pytest.approx(1.0) and g["occupancy_measured"] == pytest.approx(0.5) for g in s["rows"])
    assert s["mean_abs_error"] == pytest.approx(1.0)


def test_holdout_never_reads_the_held_out_rows_steps_or_costs():
    """Changing the held-out row's step count, step period, forward and drafter time leaves its prediction as it was
    (its measured speed moves, and with it the error); payoff.predict, fitted in place, moves with them."""
    from kit.bench.holdout import blind, evaluate

    for name, held in (("fit k<=2 -> predict k=3", lambda r: r["k"] == 3),
                       ("fit batch 1 -> predict batch 4", lambda r: r["batch"] == 4 and r["k"])):
        rows = _law_rows(batches=(1, 4), pps=(2,), patches="all,-pp_microbatches")
        before = [g["predicted"] for g in _split(evaluate(rows), name)["rows"]]
        in_place = [p["predicted_at_occupancy"] for p in predict(rows) if held(p)]
        for r in filter(held, rows):
            r["components"] = {"forward_s": 1.0, "draft_s": 1.0, "period_s": 9.0, "steps": 1}
            r["decode_tok_s"] *= 0.8
        s = _split(evaluate(rows), name)
        assert len(s["rows"]) == len(before) > 0 and [g["predicted"] for g in s["rows"]] == before, name
        assert all(g["error"] == pytest.approx(0.25) for g in s["rows"]), name
        # The in-place fit reads those fields: its prediction at the measured occupancy moves.
        assert all(a != pytest.approx(b) for a, b in zip(in_place, [p["predicted_at_occupancy"] for p in predict(rows)
                                                                     if held(p)])), name
    assert set(blind(rows[0])) == {"model", "pp", "batch", "k", "tokens_per_forward", "microbatches"}


def test_schedule_occupancy():
    from kit.bench.holdout import schedule_occupancy

    assert schedule_occupancy(1, 4, 2) == 1.0 and schedule_occupancy(2, 1, 2) == 1.0 and schedule_occupancy(2, 4, 0) == 1.0
    # The kit's default pipelined schedule splits plain and speculative batches alike.
    assert schedule_occupancy(2, 4, 2) == 1.0 and schedule_occupancy(4, 8, 1) == 1.0
    # vLLM's own loop with the gate (pp_microbatches off): only the speculative batch splits.
    off = dict(microbatches=False)
    assert schedule_occupancy(2, 4, 2, **off) == 0.5 and schedule_occupancy(4, 8, 1, **off) == 0.25
    assert schedule_occupancy(4, 2, 1, **off) == 0.5 and schedule_occupancy(2, 4, 0, **off) == 1.0


def test_a_rows_schedule_comes_from_its_patch_selection():
    from kit.bench.holdout import blind, microbatches_on

    row = {"model": "m", "pp": 2, "batch": 4, "k": 2, "tokens_per_forward": 2.0}
    assert microbatches_on(row) and blind(row)["microbatches"]
    off = {**row, "kit_patches": "all,-pp_microbatches"}
    assert not microbatches_on(off) and not blind(off)["microbatches"]
    assert not microbatches_on({**row, "kit_patches": "none"})


def test_bench_holdout_prints_and_writes_the_splits(tmp_path, capsys):
    """``kit bench --from-runs ... --holdout``: a table per split, the summary, and the block under --write."""
    from kit.cli import main

    lines = []
    for rep in (1.0, 1.01):
        for r in _law_rows(batches=(1, 4), pps=(1,)):
            c = r["components"]
            lines.append({"model": "m", "trained": True, "topology": f"pp1 {'mtp:%d' % r['k'] if r['k'] else 'none'} "
                          f"b{r['batch']}", "pp": 1, "spec": f"mtp:{r['k']}" if r["k"] else "none", "k": r["k"],
                          "batch": r["batch"], "start_s": 1.0, "ttft_s": 0.01, "decode_tok_s": rep * r["decode_tok_s"],
                          "mean_accept_len": r["tokens_per_forward"] if r["k"] else None,
                          "tokens_per_target_forward": r["tokens_per_forward"], "peak_rss_mib": {"1": 100},
                          "components": {**c, "forward_per_stage_s": [c["forward_s"]], "recv_s": 0.0,
                                        "fixed_s": c["period_s"] - c["forward_s"] - c["draft_s"], "timeline": {}}})
    runs, out = tmp_path / "runs.jsonl", tmp_path / "out.md"
    runs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["bench", "--from-runs", str(runs), "--holdout", "--write", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| fit k<=2 -> predict k=3 | 6 | 2 | 0 % | 0 % | 2 of 2 |" in text
    assert "**fit batch 1 -> predict batch 4** (5 fit rows):" in text
    assert "| pp1 mtp:3 b4 | m pp1 b1 | 2.90 | 1.00 (1.00) |" in text
    written = out.read_text()
    assert "--holdout" in written and "fit k<=1 -> predict k=2,3" in written
    assert main(["bench", "--holdout"]) == 2  # no --batch, no --from-runs: one line, bad input
