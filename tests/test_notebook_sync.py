"""The notebooks' source (notebooks/NN_name.py) and the committed .ipynb agree; no engine starts."""
import json
import shutil

import pytest
from conftest import ROOT

from kit.lab import notebook

NB = ROOT / "notebooks"


def test_every_pair_is_in_sync():
    problems = notebook.out_of_sync(NB)
    assert not problems, "\n".join(problems) + "\nrun: kit notebook sync"


def test_committed_notebooks_have_no_outputs_and_keep_the_parameters_cell():
    for ipynb in sorted(NB.glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(ipynb.read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert all(c["outputs"] == [] and c["execution_count"] is None for c in code), ipynb.name
        assert sum("parameters" in c["metadata"].get("tags", []) for c in code) == 1, ipynb.name
        assert len({c["id"] for c in nb["cells"]}) == len(nb["cells"]), ipynb.name
        src = "".join("".join(c["source"]) for c in code)
        assert "sys.path" not in src, f"{ipynb.name} edits sys.path: import the installed kit"


@pytest.fixture
def copy(tmp_path):
    for p in list(NB.glob("[0-9][0-9]_*")) + [NB / "jupytext.toml"]:
        shutil.copy(p, tmp_path / p.name)
    assert notebook.out_of_sync(tmp_path) == []
    return tmp_path


def test_a_hand_edited_ipynb_is_caught(copy):
    ipynb = copy / "00_start_here.ipynb"
    nb = json.loads(ipynb.read_text())
    nb["cells"][0]["source"][0] = "# An edit made to the .ipynb alone\n"
    ipynb.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    assert [p for p in notebook.out_of_sync(copy) if p.startswith("00_start_here.ipynb")]


def test_an_edited_py_without_sync_is_caught_and_sync_repairs_it(copy):
    py = copy / "01_drafter_placement.py"
    py.write_text(py.read_text().replace("PP_SIZES = [2, 4]", "PP_SIZES = [2]"))
    assert [p for p in notebook.out_of_sync(copy) if p.startswith("01_drafter_placement.ipynb")]
    changed = notebook.sync(copy)
    assert changed == [copy / "01_drafter_placement.ipynb"]
    assert notebook.out_of_sync(copy) == []
    assert "PP_SIZES = [2]" in (copy / "01_drafter_placement.ipynb").read_text()


def test_an_executed_copy_is_caught(copy):
    ipynb = copy / "00_start_here.ipynb"
    nb = json.loads(ipynb.read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
    cell["execution_count"] = 1
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["hi\n"]}]
    ipynb.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    assert notebook.out_of_sync(copy)


def test_regenerating_is_byte_identical(copy):
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    for p in copy.glob("*.ipynb"):
        p.unlink()
    notebook.sync(copy)
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before


def test_a_notebook_without_source_is_caught(copy):
    (copy / "02_layer_types_fix.py").unlink()
    assert [p for p in notebook.out_of_sync(copy) if "no 02_layer_types_fix.py" in p]
