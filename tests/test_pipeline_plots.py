"""kit.lab.pipeline_plots: the animated PP pipeline figure of notebook 01, from synthetic step events (no engine)."""
from __future__ import annotations

import re

import pytest

from kit.lab import pipeline_plots
from test_steptrace import _fwd, _serial_pp2_with_drafts


def _micro_batched(n=9):
    """PP=2, requests a and b take turns; after each pair of computed steps one step is empty (both in flight)."""
    ev, t = [], 0.0
    for i in range(n):
        s = i + i // 2                   # steps 2, 5, 8, ... are empty
        r = "a" if i % 2 == 0 else "b"
        ev.append(_fwd(0, s, t, t + 2.0, {r: 2}))
        ev.append(_fwd(1, s, t + 2.0, t + 4.0, {r: 2}, hidden_in=t + 2.2))
        ev.append({"kind": "sample", "rank": 1, "step": s, "t0": t + 4.0, "t1": t + 4.5, "accepted": {r: 1}})
        t += 4.6 if i % 2 else 2.1       # the next step starts on rank 0 while this one runs on rank 1
    return sorted(ev, key=lambda e: e["t0"])


RUNS = {"off": _serial_pp2_with_drafts(), "on": _micro_batched()}


def test_empty_steps_are_drawn_in_each_ranks_gap():
    bars = pipeline_plots.lane_bars(_serial_pp2_with_drafts(), 2, (24.0, 48.0), "off")
    empty = {(b["step"], b["rank"]): (b["x0"], b["x1"]) for b in bars if b["kind"] == "empty"}
    # Step 5 carried nothing: on rank 0 between s4's forward (ends 3 s in) and s6's (starts 12 s in), on rank 1
    # between s4's drafts (end 10 s in) and s6's forward call (starts 12.5 s in).
    assert empty[(5, 0)] == pytest.approx((3000.0, 12000.0))
    assert empty[(5, 1)] == pytest.approx((10000.0, 12500.0))
    assert {s for s, _ in empty} == {3, 5, 7}        # s3 on rank 1 reaches into the window; s7 fills its end
    assert all(b["text"] == f"s{b['step']}" and f"step {b['step']} " in b["hover"] and "empty" in b["hover"]
               for b in bars if b["kind"] == "empty")


def test_empty_steps_in_a_row_share_the_gap():
    ev = _serial_pp2_with_drafts(3)
    for e in ev:                                     # steps 0, 4, 8: three empty steps between computed ones
        e["step"] *= 2
    bars = pipeline_plots.lane_bars(ev, 2, (0.0, 36.0))
    row = [x for b in bars if b["kind"] == "empty" and b["rank"] == 0 and b["step"] in (1, 2, 3)
           for x in (b["x0"], b["x1"])]
    assert row == pytest.approx([3000.0, 6000.0, 6000.0, 9000.0, 9000.0, 12000.0])


def test_every_bar_is_labelled_and_coloured_per_micro_batch():
    fig = pipeline_plots.pipeline_lanes(RUNS, 2, span_ms=24_000)
    by_name, labelled = {}, []
    for tr in fig.data:
        by_name.setdefault(tr.name, []).append(tr)
        assert len(tr.text) == len(tr.hovertext) == len(tr.x) > 0
        for text, hover, width in zip(tr.text, tr.hovertext, tr.x):
            step = re.search(r"step (\d+) on rank", hover).group(1)      # the hover always names the step
            label = "wait" if " waits " in hover else f"s{step}"
            # Labelled where the label fits at report width (12 px type, 0.6 of it a character, on ~900 px)
            assert text == (label if width / 24_000 * 900 >= 7.2 * len(label) + 4 else "")
            labelled.append(bool(text))
    assert sum(labelled) >= 0.8 * len(labelled)
    assert {"requests a", "requests b", "waiting for the previous stage", "empty step (no request)"} <= set(by_name)
    # One colour per set of requests, the same in both panels; one legend entry each.
    assert len({tr.marker.color for tr in by_name["requests a"]}) == 1
    assert by_name["requests a"][0].marker.color != by_name["requests b"][0].marker.color
    assert sum(tr.showlegend is not False for tr in fig.data) == len(by_name)
    # Empty steps: outlined, not filled.
    for tr in by_name["empty step (no request)"]:
        assert tr.marker.color == "rgba(255,255,255,0)" and tr.marker.line.width > 0
    assert {t for tr in by_name["empty step (no request)"] for t in tr.text} >= {"s5", "s7"}


def test_frames_step_through_the_span_and_the_figure_is_the_last_one():
    fig = pipeline_plots.pipeline_lanes(RUNS, 2, span_ms=24_000, frames=12)
    assert len(fig.frames) == 12
    now = [fr.layout.shapes[0].x0 for fr in fig.frames]
    assert now == pytest.approx([2000.0 * (i + 1) for i in range(12)])
    assert all(len(fr.layout.shapes) == 2 for fr in fig.frames)          # a "now" line in each panel
    last = fig.frames[-1]
    assert list(last.traces) == list(range(len(fig.data)))
    for tr, fr in zip(fig.data, last.data):                              # what a static rendering shows: all of it
        assert (list(tr.x), list(tr.base), list(tr.text)) == (list(fr.x), list(fr.base), list(fr.text))
        assert all(x > 0 for x in tr.x)
    assert fig.layout.shapes == last.layout.shapes
    # Every frame holds every bar (widths, starts and labels change); earlier frames show fewer, none reaching past
    # their time, the others parked left of the panel.
    assert all(len(fr.x) == len(fr.base) == len(fr.text) == len(tr.x) for f in fig.frames
               for tr, fr in zip(fig.data, f.data))
    counts = [sum(x > 0 for d in fr.data for x in d.x) for fr in fig.frames]
    assert counts == sorted(counts) and counts[0] < counts[-1]
    for fr, t in zip(fig.frames, now):
        for tr, d in zip(fig.data, fr.data):
            assert all(0 <= b and b + x <= t + 1e-6 for b, x in zip(d.base, d.x) if x > 0)
            assert all(text == "" and b < 0 for b, x, text in zip(d.base, d.x, d.text) if x == 0)
    slider = fig.layout.sliders[0]
    assert len(slider.steps) == 12 and slider.active == 11
    assert [s.args[0][0] for s in slider.steps] == [fr.name for fr in fig.frames]
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["Play", "Pause"]


def test_readable_at_report_width():
    fig = pipeline_plots.pipeline_lanes(RUNS, 2, span_ms=24_000)
    lay = fig.layout
    assert lay.uniformtext.minsize >= 11 and lay.font.size >= 11 and lay.sliders[0].font.size >= 11
    assert all(a.font.size >= 11 for a in lay.annotations)
    assert all(tr.textfont.size >= 11 for tr in fig.data)
    # Title and panel titles above the plot, the legend and then the slider below the x axis.
    assert lay.legend.y < 0 and lay.legend.yanchor == "top"
    assert lay.sliders[0].y < lay.legend.y and lay.updatemenus[0].y < lay.legend.y


def test_a_run_without_decode_steps_draws_an_empty_panel():
    fig = pipeline_plots.pipeline_lanes({"none": [], "on": _micro_batched()}, 2, span_ms=10_000, frames=5)
    assert len(fig.layout.annotations) == 2 and len(fig.frames) == 5
    assert fig.data and all(tr.yaxis == "y2" for tr in fig.data)


def test_decode_left_is_what_a_panel_can_fill():
    # The window starts at step 4 (24 s); the last step's drafts are handed off at 60 + 10.5 s.
    assert pipeline_plots.decode_left_ms(_serial_pp2_with_drafts()) == pytest.approx(46_500.0)
    assert pipeline_plots.decode_left_ms([]) is None
