"""kit.bench.payoff: the break-even model's pure functions (no engine), and one small engine run of the measurement path."""
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
