"""kit.lab.cell_times: the waits a notebook states against papermill's durations in an executed copy."""
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from kit.lab import cell_times, report


def _nb(total=100.0, cells=(), intro="About 2 minutes on 2 cores (three engines)."):
    """An executed notebook: an opening markdown cell, then code cells of (source, seconds)."""
    nb = new_notebook(cells=[new_markdown_cell(f"# T\n\n{intro}")])
    for src, took in cells:
        c = new_code_cell(src)
        c.metadata["papermill"] = {"duration": took}
        nb.cells.append(c)
    nb.metadata["papermill"] = {"duration": total}
    return nb


def test_statements_are_read_from_the_opening_and_from_engine_cells_comments():
    nb = _nb(total=100.0, cells=[("import kit", 0.5),
                                 ("# about 25 s on 2 cores: two engines\nrun()", 30.0),
                                 ("# about 10 s\nx = 1", 2.0), ("y = 1  # about 10 s: not a comment line", 1.0)])
    times = cell_times.check(nb)
    assert [(t.where, t.stated, t.measured) for t in times] == [
        ("notebook", 120.0, 100.0), ("cell 2 (`run()`)", 25.0, 30.0), ("cell 3 (`x = 1`)", 10.0, 2.0)]
    assert [t.ok for t in times] == [True, True, False]  # 120 vs 100: 20 %; 25 vs 30: 17 %; 10 vs 2: 400 %


def test_an_engine_cell_that_states_nothing_is_listed_and_counts_as_off():
    times = cell_times.check(_nb(intro="no statement", cells=[("run()", 12.0), ("small()", 3.0)]))
    assert [(t.where, t.stated) for t in times] == [("cell 1 (`run()`)", None)]
    assert cell_times.summary(times) == "0 of 1 stated times within ±30 %"
    assert times[0].describe() == "cell 1 (`run()`): states no time, took 12 s"


def test_the_tolerance_is_relative_to_the_measured_time():
    edge = cell_times.Stated("cell 1", 130.0, 100.0)
    assert edge.ok and not cell_times.Stated("cell 1", 131.0, 100.0).ok
    assert not cell_times.Stated("cell 1", 60.0, None).ok


def test_every_notebook_states_its_run_time_and_each_engine_cell_its_wait():
    """The notebooks themselves (sources, not executed): an opening statement, and a ``# about N s`` comment in each
    cell that starts an engine or a server (the calls the kit's notebooks start them with)."""
    import json
    import re

    starts = re.compile(r"\b(traced_placement|engine\.(run|generate)|pd_compare|compare|measure_batches)\(")
    on_click = re.compile(r"\.(on_click|observe)\(|interactive\(")  # runs an engine only when a learner asks
    for path in report.notebooks():
        nb = json.loads(path.read_text())
        md = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        assert cell_times.NOTEBOOK_STATED.search(md), f"{path.name}: its opening states no run time"
        for c in nb["cells"]:
            src = "".join(c["source"])
            if c["cell_type"] == "code" and starts.search(src) and not on_click.search(src):
                assert cell_times.CELL_STATED.search(src) or src.startswith("# under a second"), \
                    f"{path.name}: an engine cell states no wait:\n{src[:200]}"
