"""kit.worker.steptrace.summary: where a decode step's time goes, from recorded step events (no engine)."""
from __future__ import annotations

import pytest

from kit.worker import steptrace


def _fwd(rank, step, t0, t1, reqs, hidden_in=None):
    return {"kind": "forward", "rank": rank, "step": step, "t0": t0, "t1": t1,
            "reqs": {r: [1 + k, k] for r, k in reqs.items()}, "history_gap": {}, "hidden_in": hidden_in}


def _serial_pp2_with_drafts(n_steps=6):
    """One request, PP=2, k=2: each computed step is followed by an empty one (the request is in flight),
    drafts are collected before the next step starts."""
    ev, t = [], 0.0
    for i in range(n_steps):
        s = 2 * i                      # steps 1, 3, 5, ... are empty
        ev.append(_fwd(0, s, t, t + 3.0, {"a": 2}))
        ev.append(_fwd(1, s, t + 0.5, t + 7.0, {"a": 2}, hidden_in=t + 4.0))   # waits 3.5 for rank 0's states
        ev.append({"kind": "sample", "rank": 1, "step": s, "t0": t + 7.0, "t1": t + 8.0, "accepted": {"a": 2}})
        ev.append({"kind": "propose", "rank": 1, "step": s, "t0": t + 8.0, "t1": t + 10.0, "reqs": ["a"], "k": 2})
        ev.append({"kind": "handoff", "rank": 1, "step": s, "t0": t + 10.0, "t1": t + 10.5, "reqs": ["a"]})
        t += 12.0
    return ev


def test_summary_of_a_serial_pp2_run_with_drafts():
    t = steptrace.summary(_serial_pp2_with_drafts())
    assert t["pp"] == 2 and t["decode_steps"] == 6
    assert t["empty_steps"] == 5 and t["held_out"] == 0
    assert t["period"] == pytest.approx(12.0)
    p = t["path"]
    assert (p["first"], p["send"], p["last"], p["sample"], p["propose"], p["handoff"], p["back"]) == \
        pytest.approx((3.0, 1.0, 3.0, 1.0, 2.0, 0.5, 1.5))
    assert sum(p.values()) == pytest.approx(t["period"])      # the critical path accounts for the whole period
    r0, r1 = t["stages"]
    assert (r0["busy"], r0["recv"], r0["idle"]) == pytest.approx((3.0, 0.0, 9.0))
    assert (r1["busy"], r1["recv"], r1["idle"]) == pytest.approx((3.0 + 1.0 + 2.0, 3.5, 2.5))
    assert t["in_flight"] == {"overlap_steps": 0, "overlap": 0.0}
    assert t["engine_wait"] == pytest.approx(10.5)
    line = steptrace.summary_line("pp2 mtp:2 b1", t)
    assert line.startswith("| pp2 mtp:2 b1 | 6 | 5 | 0 |") and "12000.00" in line


def test_summary_sees_two_micro_batches_in_flight_and_requests_held_out():
    """PP=2 without drafts, requests a and b alternate: rank 0 computes b's step while the last rank computes
    a's; a request is never in two adjacent steps (held out while in flight)."""
    ev, t = [], 0.0
    for s in range(8):
        r = "a" if s % 2 == 0 else "b"
        ev.append(_fwd(0, s, t, t + 2.0, {r: 0}))
        ev.append(_fwd(1, s, t + 2.0, t + 4.0, {r: 0}, hidden_in=t + 2.0))
        ev.append({"kind": "sample", "rank": 1, "step": s, "t0": t + 4.0, "t1": t + 4.5, "accepted": {r: 0}})
        t += 2.5                       # the next step starts on rank 0 while this one runs on rank 1
    # Step 8 carries both (the scheduler put them together again): a and b were alive, neither held out there.
    ev.append(_fwd(0, 8, t, t + 2.0, {"a": 0, "b": 0}))
    ev.append(_fwd(1, 8, t + 2.0, t + 4.0, {"a": 0, "b": 0}, hidden_in=t + 2.0))
    t = steptrace.summary(sorted(ev, key=lambda e: e["t0"]))
    assert t["empty_steps"] == 0 and t["decode_steps"] == 9
    assert t["held_out"] == 7       # steps 1..7: the request of the step before sat out (alive later, at step 8)
    assert t["in_flight"]["overlap_steps"] == 8
    assert t["in_flight"]["overlap"] == pytest.approx(1.5 / 2.0)   # 1.5 of each 2.0 rank-0 forward ran beside rank 1
    assert t["engine_wait"] is None and "propose" not in t["path"]


def test_summary_leaves_prefills_and_group_boundaries_out():
    ev = _serial_pp2_with_drafts(3)
    # A prefill (a 40-token chunk) between two decode steps: neither period across it counts.
    pre = [_fwd(0, 3, 30.0, 31.0, {"b": 0}), _fwd(1, 3, 31.0, 32.0, {"b": 0}, hidden_in=31.0)]
    for e in pre:
        e["reqs"] = {"b": [40, 0]}
    ev = sorted(ev + pre, key=lambda e: e["t0"])
    t = steptrace.summary(ev)
    assert t["decode_steps"] == 3
    assert t["period"] == pytest.approx(12.0)   # only the 0 -> 2 pair; 2 -> 3 (prefill) and 3 -> 4 are left out


def test_a_proposal_inside_the_sample_call_is_counted_once():
    """vLLM 0.32's V1 runner runs the drafter inside sample_tokens: the path splits that call, busy counts it once."""
    ev = _serial_pp2_with_drafts()
    for e in ev:
        if e["kind"] == "propose":
            e["t0"] -= 0.5
            e["t1"] -= 1.25       # propose 1.25 long, inside the sample call, which now spans 7.0 .. 8.75 + ...
        if e["kind"] == "sample":
            e["t1"] += 2.0        # sample 7.0 .. 10.0 around propose 7.5 .. 8.75
    t = steptrace.summary(sorted(ev, key=lambda e: e["t0"]))
    p = t["path"]
    assert (p["sample"], p["propose"], p["handoff"]) == pytest.approx((3.0 - 1.25, 1.25, 0.5))
    assert sum(p.values()) == pytest.approx(t["period"])
    assert t["stages"][1]["busy"] == pytest.approx(3.0 + 3.0)   # forward 3.0 + the sample call 3.0, drafter inside


def test_pipeline_lanes_busy_share_and_window_of_a_serial_run():
    """kit.lab.pipeline_plots on the serial run above: per 12 s period rank 0 computes 3 s and rank 1 computes
    3 s of forward (after its 3.5 s wait), 1 s of sampling and 2 s of drafting; one panel per run, a lane per stage."""
    from kit.lab import pipeline_plots

    ev = _serial_pp2_with_drafts()
    win = pipeline_plots.decode_window(ev, span_ms=24_000)
    assert win == (24.0, 48.0)          # the decode step a third into the run (step 4 of steps 0..10) and 24 s on
    assert pipeline_plots.busy_share(ev, 0, win) == pytest.approx(6.0 / 24.0)
    assert pipeline_plots.busy_share(ev, 1, win) == pytest.approx(12.0 / 24.0)
    fig = pipeline_plots.pipeline_lanes({"serial": ev}, 2, span_ms=24_000)
    assert "0 of 6 decode steps with 2 in flight" in fig.layout.annotations[0].text
    # the two steps inside the span, labelled (the empty steps and the waits have bars of their own)
    assert {t for b in fig.data if b.name.startswith("requests") for t in b.text} == {"s4", "s6"}


def test_logits_rows_reads_own_and_read_rows_as_vllm_indexes_them():
    """vLLM 0.32's _calc_spec_decode_metadata for two requests sent their 2 drafts alone (2 tokens each, k=2):
    logits_indices = repeat(cu_scheduled - (k + 1)) + arange = [-1, 0, 1, 1, 2, 3]."""
    from types import SimpleNamespace as NS

    import torch

    from kit.worker.steptrace import logits_rows

    so = NS(num_scheduled_tokens={"a": 2, "b": 2}, scheduled_spec_decode_tokens={"a": [7, 8], "b": [9, 9]})
    md = NS(logits_indices=torch.tensor([-1, 0, 1, 1, 2, 3]))
    runner = NS(execute_model_state=NS(scheduler_output=so, spec_decode_metadata=md, hidden_states=torch.zeros(4, 8)),
                input_batch=NS(req_ids=["a", "b"]))
    assert logits_rows(runner) == {"a": {"own": [0, 2], "read": [3, 0, 1]}, "b": {"own": [2, 4], "read": [1, 2, 3]}}
    runner.execute_model_state = None  # nothing to sample (a non-last rank, or no step)
    assert logits_rows(runner) is None
