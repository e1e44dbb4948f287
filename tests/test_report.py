"""kit.lab.report: what the index lists, read from an executed notebook. No engine (the notebooks' own runs are
tests/test_notebooks.py)."""
import argparse
import re

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from kit.lab import report, thumbnails


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


# The index: one render path (report.write_index) over executed copies, whether kit report just executed them or
# --render-only reads those an earlier run left. No engine, no papermill: the executed copies are written here.

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16  # what the fake renderer writes: a file the index may point at


def _source(folder, stem, body="", fig=False, claims=(), error=None, seconds=None):
    """A notebook ``stem`` in ``folder``: its title and question, optional claims printed, a figure and an error
    output; with ``seconds``, papermill's metadata as an executed copy carries it."""
    cells = [new_markdown_cell(f"# Title {stem}: more\n\n**The question:** what is {stem}? Later sentence.\n"
                               f"\n{body}")]
    if claims:
        cells.append(new_code_cell("c", outputs=[new_output("stream", name="stdout",
                                                            text="".join(f"CLAIM: {c}\n" for c in claims))]))
    if fig:
        f = {"data": [{"type": "bar", "x": [1], "y": [2], "name": "n"}],
             "layout": {"title": {"text": f"figure of {stem}<br>second line"}, "meta": "main"}}
        out = new_output("display_data", data={report.PLOTLY_MIME: f, "text/plain": "fig"})
        cells.append(new_code_cell("f", outputs=[out]))
    if error:
        cells.append(new_code_cell("e", outputs=[new_output("error", ename=error[0], evalue=error[1], traceback=[])]))
    nb = new_notebook(cells=cells)
    if seconds is not None:
        nb.metadata["papermill"] = {"duration": seconds, "exception": bool(error),
                                    "start_time": "2026-12-04T14:03:32+00:00", "end_time": "2026-12-04T14:09:12+00:00"}
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(folder / f"{stem}.ipynb"))
    return folder / f"{stem}.ipynb"


@pytest.fixture
def kit_dirs(tmp_path, monkeypatch):
    """notebooks/ with 00, 01, 02 and a later 06; reports/ with 00 and 01 executed, 01's claim failed. Pictures
    are drawn by a fake renderer (the real one: test_a_thumbnail_is_a_small_png)."""
    src, out = tmp_path / "notebooks", tmp_path / "reports"
    for stem in ("06_later", "02_third", "01_second", "00_first"):  # written out of order: the order is the names'
        _source(src, stem)
    _source(out, "00_first", body="About 90 s on 2 cores.\n\n**Takeaway:** it holds, token for token.", fig=True,
            claims=["one", "two", "three"], seconds=95.1)
    _source(out, "01_second", fig=True, claims=["four"], seconds=226.6,
            error=("AssertionError", "the tokens are equal: does not hold (3 differ)"))
    monkeypatch.setattr(report, "NOTEBOOKS", src)
    drawn = []

    def fake_png(fig, path):
        drawn.append(path.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(PNG)
        return "fake"

    monkeypatch.setattr(report.thumbnails, "write_png", fake_png)
    return src, out, drawn


def _index(out):
    return report.write_index(out, info={"vllm": "0.32.0", "cores": 2}).read_text()


def test_index_lists_every_notebook_of_the_folder_in_reading_order(kit_dirs):
    _, out, _ = kit_dirs
    page = _index(out)
    at = [page.index(f"id='nb{n}'") for n in ("00", "01", "02", "06")]
    assert at == sorted(at)  # 06 joins after 05's place without a code change
    assert page.count("not run") == 2 and "kit report --only 06" in page
    assert "Read in this order:" in page and page.index("href='#nb00'") < page.index("href='#nb06'")


def test_index_shows_the_total_time_first(kit_dirs):
    _, out, _ = kit_dirs
    page = _index(out)
    assert "Total time: 5 min 22 s" in page  # 95.1 s + 226.6 s, papermill's durations
    assert page.index("Total time") < page.index("id='nb00'")
    assert "2 of 4 notebooks run" in page and "1 min 35 s" in page and "3 min 47 s" in page
    assert "executed <span class='nowrap'>2026-12-04 14:03 to 14:09 UTC" in page


def test_each_notebook_has_its_title_takeaway_time_and_page_link(kit_dirs):
    _, out, _ = kit_dirs
    page = _index(out)
    assert "<b>Takeaway:</b> it holds, token for token." in page
    # without a takeaway line: the first sentence of the first markdown cell
    assert "<b>The question:</b> what is 01_second?</p>" in page and "Later sentence" not in page
    assert "<a href='00_first.html'>Title 00_first: more</a>" in page and (out / "00_first.html").exists()


def test_claims_are_counted_and_folded(kit_dirs):
    _, out, _ = kit_dirs
    page = _index(out)
    folded = "<details><summary>3/3 claims held</summary><ul><li>one</li><li>two</li><li>three</li></ul></details>"
    assert folded in page
    assert "<summary>1/2 claims held</summary>" in page  # the failed claim stopped 01: it counts, and fails
    assert "FAILED" in page and "the tokens are equal: does not hold (3 differ)" in page
    assert "CLAIM:" not in page
    for item in re.findall(r"<li>(?:one|two|three|four)</li>", page):
        assert page.rfind("<details>", 0, page.index(item)) > page.rfind("</details>", 0, page.index(item))


def test_index_has_no_plotly_and_stays_small(kit_dirs, tmp_path):
    src, out, _ = kit_dirs
    many = [f"claim number {i}: " + "words " * 15 for i in range(22)]
    for n in range(3, 10):  # ten notebooks, each with 22 long claims
        _source(src, f"0{n}_more")
        _source(out, f"0{n}_more", fig=True, claims=many, seconds=100)
    page = _index(out)
    assert "<script" not in page and "plotly" not in page.lower()
    assert len(page.encode()) < 60_000


def test_thumbnails_the_index_shows_exist_and_are_not_redrawn_from_the_same_copy(kit_dirs):
    _, out, drawn = kit_dirs
    page = _index(out)
    srcs = re.findall(r"<img src='([^']+)'", page)
    assert srcs == ["thumbs/00_first.png", "thumbs/01_second.png"]
    assert all((out / s).read_bytes() == PNG for s in srcs)
    assert "<figcaption>figure of 00_first second line</figcaption>" in page
    _index(out)
    assert drawn == ["00_first.png", "01_second.png"]  # the second pass found them newer than the copies


def test_a_picture_that_cannot_be_drawn_is_said_in_its_place(kit_dirs, monkeypatch):
    _, out, _ = kit_dirs

    def no_png(fig, path):
        raise report.thumbnails.ThumbnailError("kaleido not installed; no Chrome/Chromium")

    monkeypatch.setattr(report.thumbnails, "write_png", no_png)
    page = _index(out)
    assert "<img" not in page and page.count("no picture: kaleido not installed; no Chrome/Chromium") == 2


def test_kit_report_render_only_executes_nothing_and_writes_the_same_index(kit_dirs, monkeypatch, capsys):
    _, out, _ = kit_dirs
    monkeypatch.setattr(report, "execute", lambda *a, **k: pytest.fail("--render-only executed a notebook"))
    monkeypatch.setattr(report, "versions", lambda: {"vllm": "0.32.0", "cores": 2})
    rc = report.run(argparse.Namespace(out=str(out), only="", render_only=True))
    assert rc == 1  # 01's executed copy failed
    assert "nothing executed" in capsys.readouterr().out
    assert (out / "index.html").read_text() == _index(out)


def test_takeaway_line_in_a_markdown_output_and_first_sentence_fallback():
    said = {"output_type": "display_data", "data": {"text/markdown": "**Takeaway:** 2.3x at k=2.\n"}}
    out_md = {"cells": [{"cell_type": "markdown", "source": "# T\n\nFirst one. Second one."},
                        {"cell_type": "code", "source": "", "outputs": [said]}]}
    assert report.takeaway(out_md) == ("2.3x at k=2.", True)
    del out_md["cells"][1]
    assert report.takeaway(out_md) == ("First one.", False)
    assert report.first_sentence("# T\nIt is e.g. this. And that.") == "It is e.g. this."


def test_a_thumbnail_drops_title_legend_and_sliders_and_shrinks_type_for_many_panels():
    fig = {"data": [{"type": "bar", "x": [1], "y": [1], "showlegend": True}],
           "layout": {"title": {"text": "t"}, "sliders": [{}], "showlegend": True, "height": 900}}
    small = thumbnails.small_figure(fig)
    assert "title" not in small["layout"] and "sliders" not in small["layout"] and fig["layout"]["title"]
    assert small["layout"]["showlegend"] is False and small["data"][0]["showlegend"] is False
    assert (small["layout"]["width"], small["layout"]["height"]) == (thumbnails.WIDTH, thumbnails.HEIGHT)
    four = {"data": [{"type": "heatmap"}], "layout": {
        "annotations": [{"text": "mimo-py-18m, PP=1, batch 1"}],
        **{f"xaxis{i}": {"domain": d, "title": {"text": "per-position acceptance rate a"}}
           for i, d in (("", [0, .45]), ("2", [.55, 1]))},
        **{f"yaxis{i}": {"domain": d, "title": {"text": "k (draft tokens)"}}
           for i, d in (("", [0, .45]), ("2", [.55, 1]))}}}
    assert thumbnails.font_size({"data": [], "layout": {}}) == thumbnails.FONT
    assert thumbnails.MIN_FONT <= thumbnails.font_size(four) < 12


@pytest.mark.skipif(thumbnails.browser() is None and not thumbnails._kaleido_available(),
                    reason="neither kaleido nor a Chrome/Chromium to draw with")
def test_a_thumbnail_is_a_small_png(tmp_path):
    out = tmp_path / "t.png"
    thumbnails.write_png({"data": [{"type": "bar", "x": ["a", "b"], "y": [1, 2]}], "layout": {"title": "x"}}, out)
    head = out.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    size = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")  # the PNG's IHDR: width, height
    assert size == (thumbnails.WIDTH, thumbnails.HEIGHT)
    assert out.stat().st_size < 100_000


def test_kit_report_write_records_the_run_as_a_results_block(kit_dirs, monkeypatch, tmp_path):
    src, out, _ = kit_dirs
    for stem in ("02_third", "06_later"):  # every notebook executed in this run
        _source(out, stem, claims=["x"], seconds=10.0)
    monkeypatch.setattr(report, "versions", lambda: {"vllm": "0.32.0", "cores": 2})
    secs = {"00_first.ipynb": 95.1, "01_second.ipynb": 226.6, "02_third.ipynb": 10.0, "06_later.ipynb": 10.0}

    def fake_execute(nb, out_dir, *a, **k):
        err = "AssertionError: the tokens are equal: does not hold (3 differ)" if nb.stem == "01_second" else None
        return out_dir / nb.name, secs[nb.name], err

    monkeypatch.setattr(report, "execute", fake_execute)
    doc = tmp_path / "tests.md"
    rc = report.run(argparse.Namespace(out=str(out), only="", render_only=False, write=str(doc)))
    assert rc == 1
    text = doc.read_text()
    from kit.core.results import HEADER, blocks

    (b,) = blocks(text)
    assert HEADER.search(b.group("body")) and "Command: `kit report --out" in text
    assert "**3 of 4 notebooks ok; 342 s in all (5.7 minutes" in text and "failed: 01_second" in text
    assert "| 00_first | 95 s | 3 of 3 | 1 of 1 | ok |" in text  # "About 90 s" against 95 s: within 30 %
    assert "| 01_second | 227 s | 1 of 2 | 0 of 0 | failed: AssertionError" in text
    assert "outside ±30 %: none." in text


def test_kit_report_write_wants_a_whole_run(kit_dirs, tmp_path):
    _, out, _ = kit_dirs
    with pytest.raises(report.TopologyError, match="--write records a whole run"):
        report.run(argparse.Namespace(out=str(out), only="01", render_only=False, write=str(tmp_path / "t.md")))
