"""kit.checks.inflight on hand-made merged traces (the shape kit.worker.steptrace.merge returns)."""
from __future__ import annotations

import pytest

from kit.checks import inflight


def _fwd(step, reqs, t, rank=0):
    return {"kind": "forward", "rank": rank, "step": step, "t0": t, "t1": t + 1, "reqs": reqs}


def _sample(step, accepted, t):
    return {"kind": "sample", "rank": 1, "step": step, "t0": t, "t1": t + 1, "accepted": accepted}


def _trace(gate: bool):
    """PP=2, two requests, prefill in step 0. Gate on: step 1 empty (both in flight), step 2 decodes both. Gate off:
    step 1 carries both again with the prefill's drafts alone, step 2 is empty."""
    ev = [_fwd(0, {"r0": [5, 0], "r1": [6, 0]}, 0), _fwd(0, {"r0": [5, 0], "r1": [6, 0]}, 1, rank=1),
          _sample(0, {"r0": 0, "r1": 0}, 2)]
    if gate:
        ev += [_fwd(2, {"r0": [3, 2], "r1": [3, 2]}, 3), _sample(2, {"r0": 2, "r1": 1}, 5)]
    else:
        ev += [_fwd(1, {"r0": [2, 2], "r1": [2, 2]}, 3), _sample(1, {"r0": 2, "r1": 1}, 5)]
    return ev


def test_a_request_verifying_drafts_in_the_step_after_its_own_is_a_ride():
    got = inflight.rides(_trace(gate=False))
    assert [(r["req"], r["step"], r["prev_step"], r["tokens"], r["drafts"], r["others"]) for r in got] == \
        [("r0", 1, 0, 2, 2, ["r1"]), ("r1", 1, 0, 2, 2, ["r0"])]
    assert inflight.rides(_trace(gate=True)) == []  # an empty step between: nothing rode in flight


def test_a_prefill_chunk_right_after_the_one_before_is_not_a_ride():
    ev = [_fwd(0, {"r0": [64, 0]}, 0), _fwd(1, {"r0": [40, 0]}, 1)]  # chunked prefill: no drafts
    assert inflight.rides(ev) == []


def test_each_output_position_maps_to_the_step_that_wrote_it():
    assert inflight.written_by(_trace(gate=False), "r0") == [0, 1, 1, 1]
    assert inflight.written_by(_trace(gate=True), "r1") == [0, 2, 2]
    assert inflight.written_by(_trace(gate=True), "r9") == []


def test_request_names_follow_the_first_step_and_refuse_a_partial_one():
    assert inflight.request_names(_trace(gate=False), 2) == ["r0", "r1"]
    with pytest.raises(ValueError, match="not the 3 prompts"):
        inflight.request_names(_trace(gate=False), 3)


def test_the_rows_a_request_read_name_their_owner():
    ev = _trace(gate=False)
    # Step 1 as vLLM computes it: r0 sent 2 tokens (its drafts alone) reads rows [-1, 0, 1], the first of them the
    # batch's last row, r1's.
    ev[-1]["rows"] = {"r0": {"own": [0, 2], "read": [3, 0, 1]}, "r1": {"own": [2, 4], "read": [1, 2, 3]}}
    assert inflight.rows_read(ev, "r0", 1) == {"own": [0, 2], "read": [3, 0, 1], "owners": ["r1", "r0", "r0"]}
    assert inflight.rows_read(ev, "r1", 1)["owners"] == ["r0", "r1", "r1"]
    assert inflight.rows_read(ev, "r0", 0) is None  # no record: no drafts verified there


def test_the_rows_figure_rings_only_reads_from_another_requests_rows():
    from kit.lab.rows_plot import rows_figure

    rows = {"r0": {"own": [0, 2], "read": [3, 0, 1]}, "r1": {"own": [2, 4], "read": [1, 2, 3]}}
    assert [inflight.row_owner(rows, x) for x in (0, 1, 2, 3, 4)] == ["r0", "r0", "r1", "r1", None]
    fig = rows_figure(rows)
    assert [list(d.text) for d in fig.data] == [["logit 0 from r1's row 3", "", ""], ["logit 0 from r0's row 1", "", ""]]
