"""Every notebook runs headless under papermill; breaking a claim makes papermill fail."""

import pytest
from conftest import ROOT

pytestmark = [pytest.mark.notebook, pytest.mark.engine]
NB = ROOT / "notebooks"

# CI parameters: fewer engines and shorter runs, but every claim's assertion stays, except the timed ones
# (TIMED_CLAIMS=False: a claim that reads a measured time or speed is printed, not asserted; tests/test_clock_free.py
# checks that every such claim is marked and that these parameters turn it off). Each asserted at least once:
# 01 at PP=2 only, 02's no-clash run at PP=3 instead of 4 and its per-rank run at PP=2 left to the break-the-claim
# test below, which starts that very engine; 03 at one k with the plain engine at PP=1 only).
CI_PARAMS = {
    "00_start_here": dict(NUM_PROMPTS=2, MAX_TOKENS=16, SHOW_DOCTOR=False),
    "01_drafter_placement": dict(PP_SIZES=[2], TRACE_TOKENS=12),
    "02_layer_types_fix": dict(NUM_PROMPTS=2, MAX_TOKENS=16, NO_CLASH_PP=3, RUN_LEGACY=False),
    "03_draft_acceptance": dict(KS=[2], PP_SIZES=[1, 2], PLAIN_PP_SIZES=[1], NUM_PROMPTS=4, MAX_TOKENS=32,
                                SAMPLED_TEMPERATURES=[0.05, 0.8]),
    "04_pd_kv_handoff": dict(NUM_PROMPTS=2, MAX_TOKENS=16),
    "05_does_it_pay": dict(NUM_PROMPTS=3, MAX_TOKENS=64, TIMED_CLAIMS=False),
}


def _run(name, tmp_path, **params):
    import papermill as pm

    out = tmp_path / f"{name}.out.ipynb"
    pm.execute_notebook(str(NB / f"{name}.ipynb"), str(out), parameters=params, cwd=str(NB),
                        kernel_name="python3", progress_bar=False, execution_timeout=1500)
    return out


@pytest.mark.parametrize("name", sorted(p.stem for p in NB.glob("[0-9][0-9]_*.ipynb")))
def test_notebook_runs(name, tmp_path, no_leftovers):
    import nbformat

    out = _run(name, tmp_path, **CI_PARAMS.get(name, {}))
    printed = [ln for c in nbformat.read(str(out), as_version=4).cells if c.cell_type == "code"
               for o in c.get("outputs", []) if o.get("name") == "stdout" for ln in o.get("text", "").splitlines()]
    asserted_timed = [ln for ln in printed if ln.startswith("CLAIM:") and ln.endswith("[timed]")]
    assert asserted_timed == [], f"timed claims asserted under the CI parameters: {asserted_timed}"


def test_placement_notebook_fails_when_its_claim_breaks(tmp_path, no_leftovers):
    """With the drafter guard left ON in the 'failure' run, the notebook's expected crash does not
    happen, and its assertion must stop papermill."""
    import papermill as pm

    # PP_SIZES=[], NODES=1, HYBRID_PP=0: no placement engine before the failure section (its claims then cover no PP size); the one engine
    # started is the 'failure' run, which now starts fine.
    with pytest.raises(pm.PapermillExecutionError, match="expected the missing-drafter crash"):
        _run("01_drafter_placement", tmp_path, PP_SIZES=[], NODES=1, HYBRID_PP=0, PATCHES_FOR_FAILURE="all")


def test_layer_types_notebook_fails_when_its_claim_breaks(tmp_path, no_leftovers):
    """With the per-rank count (the teaching patch) in the 'fixed' run, papermill must stop there: on vLLM 0.32 the
    last rank refuses the draft layer's name. This is also the notebook's per-rank claim at PP=2 (its RUN_LEGACY
    engine, skipped in the CI run above): the error must name the clash the notebook predicts."""
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"Duplicate layer name: model\.layers\.2\."):
        _run("02_layer_types_fix", tmp_path, PATCHES="all,eagle3_per_rank_layers_legacy")
