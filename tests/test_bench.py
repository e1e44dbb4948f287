"""kit bench's rows: merging saved runs, the JSON last line, the breakdown tables, bad input (no engine here;
the measurement path runs a real engine in tests/test_payoff.py)."""
import json

import pytest

from kit.cli import main


def _record(model, pp, k, batch, tok_s, length, period, fwd, draft, started="2026-12-02T05:00:00+00:00"):
    return {"model": model, "trained": True, "topology": f"pp{pp} {'mtp:%d' % k if k else 'none'} b{batch}", "pp": pp,
            "spec": f"mtp:{k}" if k else "none", "k": k, "batch": batch, "started_at": started, "start_s": 25.0,
            "ttft_s": 0.02, "decode_tok_s": tok_s, "mean_accept_len": length if k else None,
            "tokens_per_target_forward": length, "peak_rss_mib": {"1": 1800},
            "components": {"forward_s": fwd, "forward_per_stage_s": [fwd], "recv_s": 0.0, "draft_s": draft,
                           "period_s": period, "fixed_s": period - fwd - draft, "steps": 100,
                           "timeline": {"stages": [{"pp_rank": 0, "busy": 0.8, "recv": 0.0, "idle": 0.2}],
                                        "forward_overlap": None}}}


def _runs(tmp_path):
    # Two engines per row; a model whose step costs 10 ms + 1 ms per verified token + 1 ms per draft token.
    lines = []
    for rep, jitter in ((0, 1.0), (1, 1.02)):
        for k, length in ((0, 1.0), (1, 1.8), (2, 2.5)):
            period = 0.002 + 0.008 + 0.001 * (k + 1) + 0.001 * k + (0.001 if k else 0)
            lines.append(_record("m", 1, k, 1, jitter * length / period, length, period, 0.008 + 0.001 * (k + 1), 0.001 * k))
    p = tmp_path / "runs.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return p


def test_from_runs_json_is_the_last_line(tmp_path, capsys):
    p = _runs(tmp_path)
    out_json = tmp_path / "bench.json"
    assert main(["bench", "--from-runs", str(p), "--breakdown", "--json", "--write-json", str(out_json)]) == 0
    text = capsys.readouterr().out.strip().splitlines()
    rows = json.loads(text[-1])
    assert [r["topology"] for r in rows] == ["pp1 none b1", "pp1 mtp:1 b1", "pp1 mtp:2 b1"]
    for r in rows:
        assert r["runs"] == 2 and r["batch"] == 1 and r["pp"] == 1
        d = r["decode_tok_s"]
        assert d["min"] <= d["lo"] <= d["median"] <= d["hi"] <= d["max"] and len(d["values"]) == 2
        assert {"topology", "pp", "spec", "batch", "decode_tok_s", "mean_accept_len", "tokens_per_target_forward",
                "start_s", "started_at"} <= set(r)
    # The synthetic runs follow the model exactly: the prediction agrees.
    assert rows[2]["payoff"]["agrees"] and abs(rows[2]["payoff"]["error"]) < 0.02
    assert 0 < rows[1]["payoff"]["break_even"] < 1
    assert any(line.startswith("| pp1 mtp:2 b1 |") and "yes" in line for line in text)
    # Every speculative row has its speed-up over no speculation, with its interval, in the JSON and the tables.
    assert [s["over"] for s in rows[2]["speedups"]] == ["pp1 none b1"] and rows[0]["speedups"] == []
    sp = rows[2]["speedups"][0]
    assert sp["kind"] == "speculation" and sp["lo"] <= sp["median"] <= sp["hi"]
    assert abs(sp["median"] - rows[2]["payoff"]["measured"]) < 1e-9
    assert f"| pp1 mtp:2 b1 | pp1 none b1 | {sp['median']:.2f}x [{sp['lo']:.2f}–{sp['hi']:.2f}] |" in "\n".join(text)
    saved = json.loads(out_json.read_text())
    assert saved["rows"][0]["topology"] == "pp1 none b1" and "command" in saved and "machine" in saved


def test_several_models_are_named_in_the_rows(tmp_path, capsys):
    p = _runs(tmp_path)
    q = tmp_path / "other.jsonl"
    q.write_text(p.read_text().replace('"model": "m"', '"model": "n"'))
    assert main(["bench", "--from-runs", f"{p},{q}", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["label"] for r in rows][:2] == ["m pp1 none b1", "m pp1 mtp:1 b1"] and len(rows) == 6
    assert main(["bench", "--from-runs", f"{p}@n,{q}@n", "--json"]) == 0   # FILE@MODEL: that model's runs only
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["label"] for r in rows] == ["pp1 none b1", "pp1 mtp:1 b1", "pp1 mtp:2 b1"] and rows[0]["runs"] == 2


@pytest.mark.parametrize("argv", [
    ["--breakdown"],                          # needs --batch
    ["--batch", "0"],
    ["--batch", "1,x"],
    ["--from-runs", "/nonexistent/runs.jsonl"],
    ["--save-runs", "/nonexistent/dir/runs.jsonl"],
    ["--timeline"],                           # needs --batch
    ["--batch", "1", "--save-trace", "/tmp/x.jsonl"],   # needs --timeline
])
def test_bad_input_exits_2(argv, capsys):
    assert main(["bench", *argv, "--force"]) == 2
    assert "error" in capsys.readouterr().err


def test_from_runs_timeline_prints_one_line_per_traced_run(tmp_path, capsys):
    from kit.worker import steptrace
    from tests.test_steptrace import _serial_pp2_with_drafts

    rec = _record("m", 2, 2, 1, 100.0, 2.5, 0.012, 0.006, 0.002)
    rec["topology"] = "pp2 mtp:2 b1 [KIT_PATCHES=all,-pp_spec_schedule_gate]"
    rec["timeline"] = steptrace.summary(_serial_pp2_with_drafts())
    p = tmp_path / "runs.jsonl"
    p.write_text(json.dumps(rec) + "\n")
    assert main(["bench", "--from-runs", str(p), "--timeline"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| pp2 mtp:2 b1 [KIT_PATCHES")]
    assert len(lines) == 2     # the rows table and the timeline table
    assert lines[1].startswith("| pp2 mtp:2 b1 [KIT_PATCHES=all,-pp_spec_schedule_gate] | 6 | 5 | 0 |")


# -- intervals (kit.bench.stats) and the engines' order, on synthetic numbers ------------------------------------

TIGHT = [100.0, 101.0, 99.0, 100.5, 99.5]
WIDE = [100.0, 130.0, 70.0, 115.0, 85.0]


def test_the_interval_contains_the_median():
    from kit.bench.stats import median_interval

    for values in (TIGHT, WIDE, [3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 0.5]):
        ci = median_interval(values)
        assert ci.lo <= ci.median <= ci.hi and min(values) <= ci.lo and ci.hi <= max(values)
    assert median_interval([3.0]).to_dict() == {"median": 3.0, "lo": 3.0, "hi": 3.0}


def test_a_wider_spread_gives_a_wider_interval():
    from kit.bench.stats import median_interval, ratio_interval

    tight, wide = median_interval(TIGHT), median_interval(WIDE)
    assert tight.median == wide.median == 100.0 and wide.hi - wide.lo > 5 * (tight.hi - tight.lo)
    r_tight, r_wide = ratio_interval(TIGHT, TIGHT), ratio_interval(WIDE, TIGHT)
    assert r_wide.hi - r_wide.lo > r_tight.hi - r_tight.lo


def test_separated_samples_are_separate_and_overlapping_ones_are_not():
    from kit.bench.stats import median_interval, ratio_interval, separate

    fast = [1.5 * v for v in TIGHT]
    assert separate(median_interval(fast), median_interval(TIGHT))
    assert ratio_interval(fast, TIGHT).excludes(1.0)
    shifted = [1.03 * v for v in WIDE]     # 3 % faster in the median, well inside the spread
    assert not separate(median_interval(shifted), median_interval(WIDE))
    assert not ratio_interval(shifted, WIDE).excludes(1.0)


def test_the_speedup_table_marks_only_separate_intervals(capsys, tmp_path):
    lines = []
    for rep in range(5):   # rows interleaved, as kit bench runs them
        for label, k, tok_s in (("pp1 none", 0, TIGHT[rep]), ("pp1 mtp:2", 2, 1.5 * TIGHT[rep]),
                                ("pp1 mtp:2 [off]", 2, 1.03 * 1.5 * WIDE[rep])):
            rec = _record("m", 1, k, 1, tok_s, 2.5, 0.01, 0.008, 0.001)
            lines.append({**rec, "topology": f"{label} b1", "components": None})
    p = tmp_path / "runs.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert main(["bench", "--quiet", "--from-runs", str(p), "--json"]) == 0
    text = capsys.readouterr().out.strip().splitlines()
    rows = {r["topology"]: r for r in json.loads(text[-1])}
    assert [(s["over"], s["separate"]) for s in rows["pp1 mtp:2 b1"]["speedups"]] == [("pp1 none b1", True)]
    # No "pp1 none [off]" row: the variant is compared with its plain row only.
    assert [(s["kind"], s["over"], s["separate"]) for s in rows["pp1 mtp:2 [off] b1"]["speedups"]] == [
        ("variant", "pp1 mtp:2 b1", False)]
    assert "| pp1 mtp:2 [off] b1 | pp1 mtp:2 b1 | 1.03x [" in "\n".join(text)
    assert [x.rsplit("|", 2)[1].strip() for x in text if x.startswith("| pp1 mtp:2 [off] b1 | pp1 mtp:2 b1 |")] == [
        "overlap"]
    assert "| pp1 none b1 | 25.0 [25.0–25.0] |" in "\n".join(text)   # median [interval], not (min–max)


def test_a_pp_row_is_compared_with_pp1_of_the_same_spec_and_batch(capsys, tmp_path):
    """PP=2 over PP=1 (kind "pp"), per spec and batch: the figure behind "PP=2 at least 0.9x PP=1's decode speed"."""
    lines = []
    for rep in range(5):
        for pp, k, tok_s in ((1, 0, TIGHT[rep]), (2, 0, 0.7 * TIGHT[rep]), (1, 2, 2 * TIGHT[rep]),
                             (2, 2, 1.02 * 2 * WIDE[rep])):
            lines.append({**_record("m", pp, k, 8, tok_s, 2.5, 0.01, 0.008, 0.001), "components": None})
    p = tmp_path / "runs.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert main(["bench", "--quiet", "--from-runs", str(p), "--json"]) == 0
    text = capsys.readouterr().out.strip().splitlines()
    rows = {r["topology"]: r for r in json.loads(text[-1])}
    pp = {label: [(s["over"], s["separate"]) for s in r["speedups"] if s["kind"] == "pp"] for label, r in rows.items()}
    assert pp == {"pp1 none b8": [], "pp2 none b8": [("pp1 none b8", True)], "pp1 mtp:2 b8": [],
                  "pp2 mtp:2 b8": [("pp1 mtp:2 b8", False)]}
    assert "| pp2 none b8 | pp1 none b8 | 0.70x [" in "\n".join(text)


def test_the_intervals_are_reproducible_with_the_seed():
    from kit.bench.stats import median_interval, ratio_interval

    assert median_interval(WIDE) == median_interval(WIDE) == median_interval(list(WIDE), seed=0)
    assert ratio_interval(WIDE, TIGHT) == ratio_interval(WIDE, TIGHT)
    # Few resamples, so that the percentiles fall between resampled medians: then the seed is what fixes them.
    assert len({ratio_interval(WIDE, TIGHT, resamples=40, seed=s) for s in range(5)}) > 1


def test_the_engines_of_the_rows_are_interleaved():
    from kit.bench.measure import interleaved

    order = interleaved(["A", "B"], 5)
    assert [case for _, case in order] == ["A", "B"] * 5
    assert [rep for rep, _ in order] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_five_engines_per_row_by_default():
    import argparse

    from kit.bench.measure import register

    sub = argparse.ArgumentParser().add_subparsers()
    register(sub)
    assert sub.choices["bench"].parse_args([]).repeats == 5


def test_a_layer_split_row_is_compared_with_the_even_split_and_with_pp1(capsys, tmp_path):
    """``--layer-partition`` rows ("[layers 5-3]") get a variant speed-up over the even split of the same PP and a
    "pp" speed-up over the plain PP=1 row (a split has no PP=1 twin)."""
    lines = []
    for rep in range(5):
        for label, pp, tok_s in (("pp1 mtp:2", 1, TIGHT[rep]), ("pp2 mtp:2", 2, 0.8 * TIGHT[rep]),
                                 ("pp2 mtp:2 [layers 5-3]", 2, 0.96 * TIGHT[rep]),
                                 ("pp2 mtp:2 [layers 5-3] [g3]", 2, 1.0 * TIGHT[rep])):
            rec = _record("m", pp, 2, 8, tok_s, 2.5, 0.01, 0.008, 0.001)
            lines.append({**rec, "topology": f"{label} b8", "components": None})
    p = tmp_path / "runs.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert main(["bench", "--quiet", "--from-runs", str(p), "--json"]) == 0
    rows = {r["topology"]: r for r in json.loads(capsys.readouterr().out.strip().splitlines()[-1])}
    got = [(s["kind"], s["over"], round(s["median"], 2)) for s in rows["pp2 mtp:2 [layers 5-3] b8"]["speedups"]]
    assert got == [("variant", "pp2 mtp:2 b8", 1.2), ("pp", "pp1 mtp:2 b8", 0.96)]
    # A split with a --variant on top: over the even split, and over the plain PP=1 row.
    got = [(s["kind"], s["over"], round(s["median"], 2)) for s in rows["pp2 mtp:2 [layers 5-3] [g3] b8"]["speedups"]]
    assert got == [("variant", "pp2 mtp:2 b8", 1.25), ("pp", "pp1 mtp:2 b8", 1.0)]


def test_a_layer_split_for_no_pp_of_the_grid_is_bad_input(capsys):
    assert main(["bench", "--pp", "1,2", "--spec", "none", "--layer-partition", "3,2,2,1"]) == 2
    assert "--layer-partition 3,2,2,1: no --pp size of the grid has 4 stages" in capsys.readouterr().err


def test_an_unknown_row_is_bad_input_naming_the_rows_there_are(capsys):
    assert main(["bench", "--pp", "1,2", "--spec", "none", "--variant", "off:KIT_PATCHES=none",
                 "--rows", "pp1 none,pp2 none [of]"]) == 2
    err = capsys.readouterr().err
    assert "--rows 'pp2 none [of]' is no row of this grid" in err and "pp2 none [off]" in err


def test_rows_keeps_only_the_named_rows_in_the_grids_order():
    from kit.bench.measure import select_rows

    cases = [("pp1 none", 1, None), ("pp1 none [off]", 1, {"K": "v"}), ("pp2 none", 2, None),
             ("pp2 none [layers 3-1]", 2, None), ("pp2 none [layers 3-1] [off]", 2, {"K": "v"})]
    assert select_rows(cases, "pp2 none [layers 3-1] [off], pp1 none") == [cases[0], cases[4]]


def test_one_engine_per_row_claims_no_difference(capsys, tmp_path):
    """A timeline run has one engine per row: its "interval" is a point, and no speed-up is claimed from it however
    far apart the two figures are."""
    lines = [{**_record("m", 1, k, 1, tok_s, 2.5, 0.01, 0.008, 0.001), "components": None}
             for k, tok_s in ((0, 100.0), (2, 200.0))]
    p = tmp_path / "runs.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert main(["bench", "--quiet", "--from-runs", str(p), "--json"]) == 0
    text = capsys.readouterr().out.strip().splitlines()
    rows = {r["topology"]: r for r in json.loads(text[-1])}
    assert [(s["separate"], s["too_few"]) for s in rows["pp1 mtp:2 b1"]["speedups"]] == [(False, True)]
    assert "| pp1 mtp:2 b1 | pp1 none b1 | 2.00x [2.00–2.00] | not claimed (< 3 engines) |" in text
