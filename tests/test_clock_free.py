"""What CI runs does not depend on the clock: no assertion of the default selection reads a measured time, and
every notebook claim that reads one is marked ``timed`` and left unasserted by the notebooks' CI parameters.

CI runs on a shared 2-core machine; a speed claim there passes or fails with the load. Speed claims live in
``kit bench`` tables (with intervals) and in the report run of the notebooks. The rules and their taint
analysis are in ``tests/clock_lint.py``; the lint is tested here on snippets that must and must not be flagged.
"""
import ast
import textwrap

import clock_lint
import pytest
from conftest import ROOT
from test_notebooks import CI_PARAMS

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
TESTS = sorted((ROOT / "tests").glob("*.py"))


@pytest.mark.parametrize("path", TESTS, ids=lambda p: p.name)
def test_no_assertion_of_the_default_selection_reads_the_clock(path):
    found = clock_lint.test_findings(path.read_text())
    assert found == [], "\n".join(map(str, found))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_claim_that_reads_the_clock_is_marked_timed(path):
    found = clock_lint.notebook_findings(path.read_text())
    assert found == [], "\n".join(map(str, found))


def _parameters_cell(text: str) -> str:
    cells = text.split("\n# %%")
    return next(c for c in cells if 'tags=["parameters"]' in c.splitlines()[0])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_ci_parameters_leave_timed_claims_unasserted(path):
    """A notebook with a timed claim has a TIMED_CLAIMS parameter, hands it to ``kit.lab.notebook.setup`` and gets
    ``TIMED_CLAIMS=False`` from the CI parameters."""
    text = path.read_text()
    timed = any(isinstance(n, ast.Call) and any(k.arg == "timed" for k in n.keywords)
                for n in ast.walk(ast.parse(text)))
    if not timed:
        return
    assert "TIMED_CLAIMS = True" in _parameters_cell(text), "no TIMED_CLAIMS parameter"
    assert "setup(timed_claims=TIMED_CLAIMS)" in text, "TIMED_CLAIMS not handed to kit.lab.notebook.setup"
    assert CI_PARAMS.get(path.stem, {}).get("TIMED_CLAIMS") is False, "the CI parameters assert its timed claims"


def test_a_timed_claim_is_printed_not_asserted_when_timed_claims_are_off(capsys):
    from kit.lab import notebook

    try:
        notebook.setup(timed_claims=False)
        notebook.claim(False, "MTP beats no speculation", 0.84, timed=True)
        assert "TIMED, NOT ASSERTED: MTP beats no speculation (did not hold: 0.84 in this run)" in capsys.readouterr().out
        with pytest.raises(AssertionError, match="tokens are equal: does not hold"):
            notebook.claim(False, "tokens are equal")  # an untimed claim is always asserted
        notebook.setup(timed_claims=True)
        with pytest.raises(AssertionError, match="MTP beats no speculation: does not hold"):
            notebook.claim(False, "MTP beats no speculation", timed=True)
        notebook.claim(True, "MTP beats no speculation", timed=True)
        assert "CLAIM: MTP beats no speculation [timed]" in capsys.readouterr().out
    finally:
        notebook.setup()


# -- the lint itself ------------------------------------------------------------------------------------

LIVE = textwrap.dedent("""
    from kit.bench import measure_batches, payoff_rows, aggregate
    records = []
    for spec in SPECS:
        for b, r in measure_batches(topo, prompts, 8, batches=[1]).items():
            records.append({"spec": spec, **r})
    live = payoff_rows(aggregate(records))
    base = next(r for r in live if r["k"] == 0)
    for r in live:
        got = r["decode_tok_s"] / base["decode_tok_s"]
        claim(got > 1.0, "MTP beats no speculation"MARK)
    claim(records[1]["token_ids"] == records[0]["token_ids"], "same tokens")
""")


def test_the_lint_flags_an_unmarked_speed_claim_and_a_needless_mark():
    found = clock_lint.notebook_findings(LIVE.replace("MARK", ""))
    assert [f.source for f in found] == ["got > 1.0"]
    assert clock_lint.notebook_findings(LIVE.replace("MARK", ", timed=True")) == []
    needless = clock_lint.notebook_findings('x = 1\nclaim(x == 1, "one", timed=True)\n')
    assert [f.what for f in needless] == ["claim marked timed=True reads no measured time"]


@pytest.mark.parametrize("snippet", [
    't0 = time.monotonic()\nrun()\nclaim(time.monotonic() - t0 < 60, "fast")',
    'from time import perf_counter as pc\na = pc()\nclaim(pc() - a < 1, "fast")',
    'res = compare(topo)\nspeed = {k: r.num_generated / r.seconds for k, r in res.items()}\nclaim(max(speed.values()) > 10, "x")',
    'rows = pair.run(prompts)\nclaim(all(r["consumer_ttft_s"] < 0.5 for r in rows), "ttft")',
    'ev = trace()\nclaim(sum(e["t1"] - e["t0"] for e in ev) < 2, "busy")',
    'times = []\ntimes.append(time.time())\nclaim(times[-1] - times[0] < 5, "quick")',
], ids=["monotonic", "from-import", "seconds-field", "ttft-field", "timestamp-difference", "appended"])
def test_the_lint_follows_the_clock_into_a_claim(snippet):
    assert len(clock_lint.notebook_findings(snippet)) == 1


@pytest.mark.parametrize("snippet", [
    # committed data: the same bytes on every machine
    'm = json.loads(Path(P).read_text())\nrows = [r["decode_tok_s"]["median"] for r in m["rows"]]\nclaim(min(rows) > 1, "x")',
    # timestamps compared, not subtracted: the order of causally linked events
    'ev = trace()\nlate = [e for e in ev if e["t0"] < e["prev_t1"]]\nclaim(not late, "in order")',
    # a timestamp handed to a library call as a filter returns no time
    't0 = time.time()\nprocs = leftovers(since=t0)\nclaim(not procs, "nothing left")',
], ids=["committed", "ordering", "since-filter"])
def test_the_lint_leaves_clock_free_claims_alone(snippet):
    assert clock_lint.notebook_findings(snippet) == []


def test_the_test_lint_skips_only_opt_in_tests():
    src = textwrap.dedent("""
        import time
        import pytest

        def test_fast():
            t0 = time.monotonic()
            run()
            assert time.monotonic() - t0 < 5

        @pytest.mark.slow
        def test_slow():
            t0 = time.monotonic()
            assert time.monotonic() - t0 < 5

        def helper():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                pass
            assert ready()
    """)
    found = clock_lint.test_findings(src)
    assert [f.line for f in found] == [8]
    marked = "import pytest\npytestmark = [pytest.mark.reliability]\n" + src
    assert clock_lint.test_findings(marked) == []
