"""kit.bench.pipelined: the pipelined step predicted from a serial run's stage costs (pure; no engine)."""
import pytest

from kit.bench import pipelined


def _summary(period, busy, send=0.001, handoff=0.0005, back=0.001, reqs=4.0):
    return {"period": period, "reqs_per_step": reqs, "path": {"send": send, "handoff": handoff, "back": back},
            "stages": [{"rank": r, "busy": b} for r, b in enumerate(busy)]}


def test_the_largest_bound_sets_the_period():
    # The last stage (drafter) is the busiest: 16 ms of a 30 ms serial step; round trip 15, cores (10+16+2.5)/2.
    s = _summary(0.030, [0.010, 0.016])
    p = pipelined.predict(s)
    assert p["bound"] == "stage" and p["period"] == pytest.approx(0.016)
    assert p["bounds"]["round trip"] == pytest.approx(0.015)
    assert p["bounds"]["cores"] == pytest.approx((0.026 + 0.0025) / 2)
    assert p["speedup"] == pytest.approx(0.030 / 0.016)
    # Balanced stages and a long engine-core path: the round trip binds.
    assert pipelined.predict(_summary(0.040, [0.010, 0.010], back=0.015))["bound"] == "round trip"


def test_the_check_says_how_far_off_and_which_way():
    serial, piped = _summary(0.030, [0.010, 0.016], reqs=2.0), _summary(0.020, [0.010, 0.015], reqs=1.9)
    c = pipelined.check(serial, piped)
    assert c["error"] == pytest.approx(0.016 / 0.020 - 1)  # optimistic: the measured step was longer
    assert c["measured_speedup"] == pytest.approx(1.5)
    assert c["measured_speedup_per_request"] == pytest.approx((0.030 / 2.0) / (0.020 / 1.9))


def test_the_findings_text_comes_from_the_checks():
    from kit.lab.payoff_text import pipelined_findings

    serial, piped = _summary(0.030, [0.010, 0.016], reqs=2.0), _summary(0.020, [0.010, 0.015], reqs=1.9)
    text = pipelined_findings({"m pp2 mtp:2 b4": pipelined.check(serial, piped)})
    assert "the stage bound" in text and "optimistic" in text and "20%" in text
    assert "pp2 mtp:2 b4: 16.00 ms predicted, 20.00 ms measured, 1.88x predicted against 1.50x per step" in text
    assert pipelined_findings({}) == ""
