"""The arithmetic the notebooks draw from (no engine): acceptance rates and Eagle3 layer names per PP rank; what
notebook 00 shows of `kit doctor`."""
import pytest

from kit.bench.payoff import expected_tokens
from kit.checks.placement import eagle3_layer_names
from kit.lab import plots


def test_conditional_rates_and_expected_length():
    assert plots.conditional_rates([8, 4, 1], 10) == [0.8, 0.5, 0.25]
    assert plots.conditional_rates([0, 0], 0) == [0.0, 0.0]
    assert expected_tokens([0.8, 0.5, 0.25], 3) == pytest.approx(1 + 0.8 + 0.4 + 0.1)
    # With one rate: the geometric sum (1 - a^(k+1)) / (1 - a)
    for a in (0.3, 0.8):
        for k in range(5):
            assert expected_tokens(a, k) == pytest.approx((1 - a ** (k + 1)) / (1 - a))


def test_eagle3_names_per_rank_follow_vllms_split():
    total = {pp: eagle3_layer_names(4, pp, "total") for pp in (1, 2, 3, 4)}
    per_rank = {pp: eagle3_layer_names(4, pp, "per_rank") for pp in (1, 2, 3, 4)}
    assert [r["target"] for r in per_rank[2]] == [["model.layers.0", "model.layers.1"], ["model.layers.2", "model.layers.3"]]
    assert {pp: rows[-1]["draft"] for pp, rows in total.items()} == {pp: "model.layers.4" for pp in (1, 2, 3, 4)}
    assert {pp: rows[-1]["draft"] for pp, rows in per_rank.items()} == {1: "model.layers.4", 2: "model.layers.2",
                                                                      3: "model.layers.1", 4: "model.layers.1"}
    assert [pp for pp, rows in per_rank.items() if rows[-1]["clash"]] == [2]
    assert {pp: rows[-1]["elsewhere"] for pp, rows in per_rank.items()} == {1: None, 2: None, 3: 1, 4: 1}
    assert all(rows[-1]["layer_types_index"] == 0 for rows in list(total.values()) + list(per_rank.values()))
    assert all(r["draft"] is None for rows in per_rank.values() for r in rows[:-1])
    with pytest.raises(ValueError):
        eagle3_layer_names(4, 2, "half")


def test_steptrace_merge_names_requests_and_groups_steps():
    from kit.worker import steptrace

    rank0 = {"events": [{"kind": "forward", "rank": 0, "t0": 1.0, "t1": 2.0, "step": 3,
                         "reqs": {"abc": [3, 2]}, "history_gap": {"abc": 1}, "hidden_in": None}]}
    rank1 = {"events": [{"kind": "forward", "rank": 1, "t0": 1.0, "t1": 3.0, "step": 3, "reqs": {"abc": [3, 2]},
                         "history_gap": {}, "hidden_in": 2.5},
                        {"kind": "sample", "rank": 1, "t0": 3.0, "t1": 3.1, "step": 3, "accepted": {"abc": 1}},
                        {"kind": "propose", "rank": 1, "t0": 3.05, "t1": 3.09, "step": 3, "reqs": ["abc"], "k": 2}]}
    ev = steptrace.merge([rank1, rank0])
    assert [e["rank"] for e in ev[:2]] == [0, 1]  # same start: rank order
    assert ev[0]["reqs"] == {"r0": [3, 2]} and ev[0]["history_gap"] == {"r0": 1}
    by = steptrace.steps(ev)
    assert set(by[3]["forward"]) == {0, 1}
    assert by[3]["sample"]["accepted"] == {"r0": 1} and by[3]["propose"]["reqs"] == ["r0"]
    fig = plots.step_swimlane(ev, 2, steps=[3])
    assert len(fig.data) == 5  # rank 0 forward, rank 1 waiting + forward, sample, propose
    assert len(fig.layout.annotations) == 0  # no later step of r0 in the window: no arrow


def _doctor_info(failures=None):
    return {"python": "3.11.7", "cores": 2, "memory_gib": 23.5, "torch": "2.13.0+cpu", "cpu_capability": "AVX512",
            "vllm": "0.32.0", "device": "cpu", "patch_selection": "all", "patch_failures": failures or {},
            "runner": {"device": "cpu", "default": "v1", "why": "no Triton"},
            "patches_by_runner": {"v1": ["a"], "v2": [], "any": ["b", "c", "d", "e"]},
            "patches": [{"name": "a", "status": "applied"},
                        {"name": "b", "status": "upstream (installed vLLM has the fix)"},
                        {"name": "c", "status": "not a Ray run: nothing to do"},
                        {"name": "d", "status": "needed, NOT selected"},
                        {"name": "e", "status": "FAILED: boom" if failures else "applied"}]}


def test_doctor_is_one_line_with_the_full_report_folded_and_open_on_a_failure():
    import json

    from kit.lab.doctor_report import summary, text
    from kit.lab.notebook import doctor_output

    info = _doctor_info()
    assert summary(info) == ("vLLM 0.32.0, torch 2.13.0+cpu, Python 3.11.7; cpu (AVX512), 2 cores, 23.5 GiB; "
                             "runner v1; patches (all): 2 applied, 1 upstream, 1 not needed here, 1 not selected, 0 failed")
    out = doctor_output("a warning line\n" + json.dumps(info) + "\n", 0)
    assert out["text/plain"] == "kit doctor: " + summary(info)  # one line
    assert out["text/html"].startswith("<details><summary>") and "patches for any" in out["text/html"]
    assert "patches for any" in text(info) and len(text(info).splitlines()) > 10

    bad = _doctor_info(failures={"e": "boom"})
    out = doctor_output(json.dumps(bad), 1)
    assert "1 failed" in out["text/plain"].splitlines()[0] and "FAILED: boom" in out["text/plain"]
    assert out["text/html"].startswith("<details open>")
    out = doctor_output("Traceback: vLLM not importable\n", 1)
    assert out["text/plain"].startswith("kit doctor: no report (exit code 1)") and "Traceback" in out["text/plain"]



def test_interact_static_shows_the_default_as_plain_output_and_redraws_under_the_controls(capsys):
    """The HTML report keeps no live widget: the default state must be a plain output of its own, drawn before the
    controls; moving a control draws again (into the widget's output area, live)."""
    import ipywidgets as w

    from kit.lab.notebook import interact_static

    calls = []

    def draw(k, a):
        calls.append((k, a))
        print(f"drawn k={k} a={a}")

    k, a = w.IntSlider(value=3, min=1, max=5), w.FloatSlider(value=0.5)
    box = interact_static(draw, note="move a slider", k=k, a=a)
    shown = capsys.readouterr().out
    assert calls == [(3, 0.5)] and shown.index("drawn k=3 a=0.5") < shown.index("VBox")  # before the controls
    out = box.children[1]
    assert [o["text"] for o in out.outputs] == ["move a slider\n"]
    assert list(box.children[0].children) == [k, a]
    k.value = 2
    assert calls == [(3, 0.5), (2, 0.5)]


def test_payoff_slider_draws_its_default_bars_without_a_widget(monkeypatch):
    import ipywidgets as w

    from kit.bench.payoff import Costs
    from kit.lab import payoff_plots

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objs, **kw: shown.extend(objs))
    costs = {("m", 1, 1): Costs(0.002, 0.003, 0.008, 0.001, 0.0, 0.001)}
    box = payoff_plots.slider(costs, a=0.7, k=3)
    bars = shown[0]
    assert bars.layout.title.text.startswith("Predicted speed-up at a = 0.70, k = 3")
    assert list(bars.data[0].y) == pytest.approx([costs[("m", 1, 1)].speedup(0.7, 3)])
    assert shown[1] is box and isinstance(box, w.VBox)


def test_where_next_lists_every_notebook_in_order_and_marks_the_current_one():
    from kit.lab.notebook import where_next
    from kit.lab.report import notebooks

    text = where_next("02").data
    names = [p.name for p in notebooks()]
    items = [ln for ln in text.splitlines() if ln.startswith("- ")]
    assert len(items) == len(names) >= 6
    for item, name in zip(items, names):
        assert (f"]({name})" in item) != name.startswith("02_"), item   # every other notebook linked, this one not
    assert "(this notebook)" in items[names.index(next(n for n in names if n.startswith("02_")))]
    assert "00_start_here.ipynb#Glossary" in text
