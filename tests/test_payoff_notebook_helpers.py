"""Notebook 05's held-out, best-k, timeline and takeaway helpers (kit.lab.payoff_text, kit.lab.payoff_plots): the words
and numbers they print follow the data passed in. No engine."""
from __future__ import annotations

from kit.bench.payoff import Costs
from kit.lab import payoff_plots, payoff_text


def _held_row(label, predicted, measured, occ=1.0, occ_measured=1.0, interval=(0.9, 1.1)):
    return {"label": label, "model": "m", "pp": 2, "batch": 4, "k": 2, "tokens_per_forward": 2.5,
            "measured": measured, "interval": interval, "predicted": predicted, "predicted_full": predicted / occ,
            "occupancy": occ, "occupancy_measured": occ_measured, "source": ("m", 2, 4),
            "error": predicted / measured - 1}


def _result():
    return [{"name": "fit a -> predict b", "fit": 4, "skipped": [], "mean_abs_error": 0.1, "max_abs_error": 0.2,
             "rows": [_held_row("r1", 1.1, 1.05), _held_row("r2", 1.2, 1.5)]},
            {"name": "fit c -> predict d", "fit": 3, "skipped": [], "mean_abs_error": 0.27, "max_abs_error": 0.27,
             "rows": [_held_row("r3", 0.87, 1.19, occ=0.5, occ_measured=0.66)]}]


def test_holdout_summary_counts_the_band_the_worst_row_and_the_wrong_side():
    text = payoff_text.holdout_summary(_result(), 0.15)
    assert "1 of 3 predictions lie within ±15%" in text  # r1 +5 %; r2 -20 %, r3 -27 % outside
    assert "`r3` (fit c -> predict d), is -27 % off" in text
    assert "Noise: in 2 of 3 rows" in text and "1 of 3 predictions lie inside the measured interval" in text
    assert "in 2 of 3 rows; not in `r3`" in text and "occupancy predicted 0.50, measured 0.66" in text
    assert [g["label"] for _, g in payoff_text.wrong_side(_result())] == ["r3"]
    rows = payoff_text.holdout_table(_result(), 0.15)
    assert [r["within ±15%"] for r in rows] == [True, False, False]
    assert rows[0]["costs fitted from"] == "its own group"


def test_holdout_figure_one_trace_per_split_and_break_even_lines():
    fig = payoff_plots.holdout_figure(_result(), 0.15)
    names = [t.name for t in fig.data]
    assert "fit a -> predict b" in names and "fit c -> predict d" in names
    marks = next(t for t in fig.data if t.name == "fit c -> predict d")
    assert list(marks.x) == [1.19] and list(marks.y) == [0.87]


def _costs(fwd_per_token=0.001):
    return Costs(fixed_nospec_s=0.005, fixed_spec_s=0.006, forward_base_s=0.004, forward_per_token_s=fwd_per_token,
                 draft_base_s=0.0005, draft_per_token_s=0.001, batch=1, pp=1)


def test_best_k_interior_names_the_edge_and_the_extrapolation():
    inner = {("m", 1, 1): {0.5: 2, 0.9: 7}}
    text = payoff_text.best_k_interior(inner, range(1, 17), [1, 2, 3])
    assert "at a = 0.9 the best k is 7" in text and "top of the range" not in text
    assert "k ≤ 3, so a best k of 7 extrapolates" in text
    edge = payoff_text.best_k_interior({("m", 1, 1): {0.5: 2, 0.9: 6}}, range(1, 7), [2])
    assert "the top of the range searched, 6: there it is at least 6" in edge
    c = _costs()
    best = max(range(1, 17), key=lambda k: c.speedup(0.9, k))
    assert 1 < best < 16  # the notebook's K_SEARCH reaches past the optimum for costs of this shape


def _summary(period, busy, reqs, held=0):
    return {"period": period, "reqs_per_step": reqs, "held_out": held, "decode_steps": 10,
            "in_flight": {"overlap_steps": 0, "overlap": 0.0},
            "stages": [{"rank": 0, "busy": 0.3 * period, "recv": 0.0, "idle": 0.7 * period},
                       {"rank": 1, "busy": busy, "recv": 0.2 * period, "idle": period - busy - 0.2 * period}]}


def test_timeline_findings_and_stage_figure_follow_the_traces():
    traces = [{"model": "m", "topology": "pp2 none b4"}, {"model": "m", "topology": "pp2 mtp:2 b4"}]
    summ = {"m pp2 none b4": _summary(0.010, 0.003, 4.0), "m pp2 mtp:2 b4": _summary(0.015, 0.006, 2.5, held=7)}
    text = payoff_text.timeline_findings(traces, summ)
    assert "a larger share (40% against 30%)" in text and "2.50 requests against 4.00" in text and "7 times" in text
    summ["m pp2 mtp:2 b4"] = _summary(0.015, 0.003, 2.5)
    assert "a smaller share (20% against 30%)" in payoff_text.timeline_findings(traces, summ)
    assert "0 of 10 decode steps with two micro-batches in flight" in payoff_text.timeline_summary(summ)
    fig = payoff_plots.stage_figure(summ)
    assert [t.name for t in fig.data] == ["computing", "waiting for the previous stage", "idle"]
    assert list(fig.data[0].y) == ["m pp2 none b4 · stage 0", "m pp2 none b4 · stage 1",
                                   "m pp2 mtp:2 b4 · stage 0", "m pp2 mtp:2 b4 · stage 1"]


def test_takeaway_names_the_losing_rows_and_the_held_out_count():
    preds = [{"model": "m", "pp": 1, "batch": 1, "k": 2, "measured": 1.8, "acceptance": 0.9, "break_even": 0.3,
              "occupancy": 1.0},
             {"model": "m", "pp": 2, "batch": 4, "k": 2, "measured": 0.7, "acceptance": 0.9, "break_even": 0.3,
              "occupancy": 0.43}]
    text = payoff_text.takeaway(preds, _result(), 0.15)
    assert text.startswith("**Takeaway:** MTP decoded faster than no speculation in 1 of 2 recorded rows")
    assert "above the break-even a* in every row" in text
    assert "m PP=2 batch 4 k=2 (0.71x" not in text and "(0.70x), where its speculative steps were 43% full" in text
    assert "predicts 1 of 3 speed-ups within ±15% (the worst 27 % off)" in text
    preds[0]["acceptance"] = 0.2
    assert "below the break-even a* in some rows" in payoff_text.takeaway(preds, _result(), 0.15)
    # With the measured speed-up's interval: a row counts as faster only when the whole interval lies above 1.0x.
    preds[0]["interval"] = (0.9, 2.1)
    text = payoff_text.takeaway(preds, _result(), 0.15)
    assert "faster than no speculation in 0 of 2" in text
    assert "not told apart from no speculation in m PP=1 batch 1 k=2 (1.80x [0.90–2.10], steps 100% full)" in text
