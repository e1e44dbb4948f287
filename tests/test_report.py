"""kit.lab.report: what the index lists, read from an executed notebook. No engine (the notebooks' own runs are
tests/test_notebooks.py)."""
import json

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from kit.lab import report


def _executed(tmp_path):
    fig = {"data": [{"type": "bar", "x": ["a", "b"], "y": [1, 2]}], "layout": {"title": {"text": "main"}}}
    nb = new_notebook(cells=[
        new_markdown_cell("# Title\n\n**The question:** does it\nhold?\n\nMore text."),
        new_code_cell("x", outputs=[new_output("stream", name="stdout", text="noise\nclaim holds: it does\n")]),
        new_code_cell("f", outputs=[new_output("display_data", data={report.PLOTLY_MIME: fig, "text/plain": "fig"})]),
        new_code_cell("y", outputs=[new_output("stream", name="stdout", text="CLAIM: second\nas expected: refused\n"),
                                    new_output("stream", name="stderr", text="claim holds: not from stderr\n")]),
    ])
    path = tmp_path / "00_x.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_summary_has_question_claims_and_first_figure(tmp_path):
    s = report.summarize(_executed(tmp_path))
    assert s["question"] == "does it hold?"
    assert s["claims"] == ["claim holds: it does", "CLAIM: second", "as expected: refused"]
    assert s["figure"]["layout"]["title"]["text"] == "main"


def test_a_figure_marked_main_is_the_main_figure():
    cell = lambda fig: {"cell_type": "code", "outputs": [{"output_type": "display_data", "data": {report.PLOTLY_MIME: fig}}]}
    a, b = {"data": [], "layout": {"title": "a"}}, {"data": [], "layout": {"title": "b", "meta": "main"}}
    assert report.first_figure({"cells": [cell(a), cell(b)]}) is b
    assert report.first_figure({"cells": [cell(a)]}) is a
    assert report.first_figure({"cells": []}) is None


def test_question_falls_back_to_the_title():
    nb = {"cells": [{"cell_type": "markdown", "source": ["# Only a title\n", "text"]}]}
    assert report.question(nb) == "Only a title"


def test_index_lists_each_notebook_with_versions_and_an_offline_figure(tmp_path):
    row = {"name": "00_x.ipynb", "seconds": 12.3, "error": None, "page": "00_x.html", **report.summarize(_executed(tmp_path))}
    bad = {"name": "01_y.ipynb", "seconds": 4, "error": "PapermillExecutionError: boom", "page": None,
           "question": "q", "claims": [], "figure": None}
    page = report.index_html([row, bad], {"vllm": "0.32.0", "cores": 2}, "2026-01-01 00:00 UTC")
    assert "does it hold?" in page and "CLAIM: second" in page and "12 s" in page
    assert "FAILED: PapermillExecutionError: boom" in page
    assert "<th>vllm</th><td>0.32.0</td>" in page
    assert "src=\"http" not in page and "src='http" not in page  # no remote script: opens offline
    assert "Plotly.newPlot" in page and len(page) > 1_000_000  # plotly.js itself is inline
    assert json.dumps("main") in page


def test_links_between_notebooks_point_at_their_pages_and_headings_keep_their_anchor(tmp_path):
    nb = new_notebook(cells=[
        new_markdown_cell("# Title\n\nThe [Glossary](00_start_here.ipynb#Glossary); [elsewhere](other.ipynb#x)."),
        new_markdown_cell("## Glossary\n- **PP**: stages."),
    ])
    path = tmp_path / "01_x.ipynb"
    nbformat.write(nb, str(path))
    body = report.to_html(path).read_text()
    assert 'href="00_start_here.html#Glossary"' in body and "00_start_here.ipynb" not in body
    assert 'href="other.ipynb#x"' in body  # not a notebook of the kit: left as it is
    assert 'id="Glossary"' in body  # the anchor the link lands on (JupyterLab gives the heading the same id)
