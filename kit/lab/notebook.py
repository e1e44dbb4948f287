"""Notebook helpers: the setup every notebook runs, claims, and the ``.py`` <-> ``.ipynb`` pairing.

Each notebook's source of truth is ``notebooks/NN_name.py`` (jupytext percent format); the committed
``NN_name.ipynb`` beside it is derived from it: no outputs, cell ids from the cell's content (the same
text gives the same file, byte for byte). JupyterLab with jupytext keeps the two paired while editing
(``notebooks/jupytext.toml``); after an edit, ``kit notebook sync`` rewrites both files in
their canonical form, and ``kit notebook check`` (and ``tests/test_notebook_sync.py``) fails
when a pair is out of sync.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from kit.core.models import REPO_ROOT

NOTEBOOKS = REPO_ROOT / "notebooks"
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


_TIMED_CLAIMS = True


def setup(timed_claims: bool = True) -> None:
    """What every notebook needs before its first figure.

    JupyterLab renders the plotly mime type; the HTML report (nbconvert) gets plotly.js embedded once
    per notebook, so the report opens offline. ``timed_claims=False`` (the notebooks' CI parameters) prints
    claims marked ``timed`` without asserting them: see :func:`claim`.
    """
    import plotly.io as pio

    global _TIMED_CLAIMS
    _TIMED_CLAIMS = bool(timed_claims)
    pio.renderers.default = "plotly_mimetype+notebook"


def claim(holds: bool, text: str, detail: object = None, *, timed: bool = False) -> None:
    """Assert one claim of a notebook and print it as ``CLAIM: text`` (the report collects these lines).

    ``timed=True`` marks a claim that reads a measured time, speed or speed ratio of this run. On a shared
    machine the load alone can flip such a claim, so it is asserted only where the notebook asks for it
    (``setup(timed_claims=True)``: the report run); with ``timed_claims=False`` (the CI parameters) it is
    printed as ``TIMED, NOT ASSERTED: text (held | did not hold ...)`` and the run goes on.
    ``tests/test_clock_free.py`` fails on an unmarked claim that reads the clock, and on a marked one that
    does not.
    """
    if timed and not _TIMED_CLAIMS:
        outcome = "held" if holds else "did not hold" + (f": {detail}" if detail is not None else "")
        print(f"TIMED, NOT ASSERTED: {text} ({outcome} in this run)", flush=True)
        return
    if not holds:
        raise AssertionError(f"{text}: does not hold" + (f" ({detail})" if detail is not None else ""))
    print(f"CLAIM: {text}" + (" [timed]" if timed else ""), flush=True)


def doctor_output(stdout: str, returncode: int) -> dict:
    """What a notebook shows of ``kit doctor --json``'s output: ``{"text/plain": ..., "text/html": ...}``.

    One summary line (:func:`kit.lab.doctor_report.summary`) with the full report folded under it (``<details>``); when a
    patch failed, the doctor failed, or its output is not JSON, the full report is open and in the plain text too.
    """
    import html
    import json

    from kit.lab.doctor_report import summary, text

    try:
        info = json.loads(stdout.strip().splitlines()[-1])
        line, full = "kit doctor: " + summary(info), text(info)
        failed = bool(returncode or info.get("patch_failures") or info.get("patch_error"))
    except (ValueError, IndexError, KeyError, TypeError):
        line, full, failed = f"kit doctor: no report (exit code {returncode})", stdout, True
    folded = (f"<details{' open' if failed else ''}><summary><code>{html.escape(line)}</code></summary>"
              f"<pre>{html.escape(full)}</pre></details>")
    return {"text/plain": line + ("\n" + full if failed else ""), "text/html": folded}


def show_doctor(timeout: float = 300) -> None:
    """Run ``kit doctor`` in a subprocess (it applies the patches in its own process) and show
    :func:`doctor_output`: one line, the full report folded under it (open when something failed)."""
    import subprocess

    from IPython.display import display

    r = subprocess.run([sys.executable, "-m", "kit", "doctor", "--json"], capture_output=True, text=True,
                       timeout=timeout)
    display(doctor_output(r.stdout or r.stderr, r.returncode), raw=True)


# -- widgets with a static default -----------------------------------------------------------------

def interact_static(draw, note: str = "", **controls):
    """``ipywidgets.interact`` that leaves a static picture of its default state in the notebook's output.

    ``draw(**values)`` prints, displays, or returns what to show (a plotly figure, a DataFrame, ...) for the
    controls' values. It runs once at the controls' current values as a plain cell output, which the HTML report
    (nbconvert, no live widgets) and a notebook opened without a kernel show; then the controls are displayed with
    an output area under them, where ``note`` stands until a control moves and ``draw`` shows the new values
    instead (live in JupyterLab). Returns the box of controls and output area."""
    import ipywidgets as w
    from IPython.display import display

    def values() -> dict:
        return {name: c.value for name, c in controls.items()}

    def show(result) -> None:
        if result is not None:
            display(result)

    show(draw(**values()))
    out = w.Output()
    if note:
        out.append_stdout(note + "\n")

    def changed(_) -> None:
        out.clear_output(wait=True)
        with out:
            show(draw(**values()))

    for c in controls.values():
        c.observe(changed, names="value")
    box = w.VBox([w.HBox(list(controls.values())), out])
    display(box)
    return box


# -- the .py <-> .ipynb pairing --------------------------------------------------------------------

def _config(directory: Path):
    from jupytext.config import load_jupytext_config

    return load_jupytext_config(str(directory / "x.py"))


def _cell_ids(cells) -> None:
    """Ids from each cell's type and text; a repeated cell gets a numbered suffix."""
    seen: dict[str, int] = {}
    for c in cells:
        h = hashlib.sha1(f"{c.cell_type}\n{c.source}".encode()).hexdigest()[:12]
        n = seen.get(h, 0)
        seen[h] = n + 1
        c["id"] = h if n == 0 else f"{h}-{n}"


def render(py: Path) -> tuple[str, str]:
    """(canonical ``.py`` text, ``.ipynb`` text) for the notebook whose source is ``py``."""
    import jupytext
    import nbformat

    py = Path(py)
    config = _config(py.parent)
    nb = jupytext.read(str(py), fmt="py:percent", config=config)
    nb.metadata = {"kernelspec": dict(KERNELSPEC)}
    py_text = jupytext.writes(nb, fmt="py:percent", config=config)
    nb.nbformat, nb.nbformat_minor = 4, 5
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
        c.metadata = {k: v for k, v in c.metadata.items() if k == "tags"}
    _cell_ids(nb.cells)
    nbformat.validate(nb)
    return py_text, nbformat.writes(nb) + "\n"


def sources(directory: Path = NOTEBOOKS) -> list[Path]:
    return sorted(Path(directory).glob("[0-9][0-9]_*.py"))


def out_of_sync(directory: Path = NOTEBOOKS) -> list[str]:
    """One line per file that ``sync`` would change (empty when every pair agrees)."""
    problems = []
    directory = Path(directory)
    pys = sources(directory)
    for ipynb in sorted(directory.glob("[0-9][0-9]_*.ipynb")):
        if not ipynb.with_suffix(".py").exists():
            problems.append(f"{ipynb.name}: no {ipynb.with_suffix('.py').name} beside it (the .py is the source)")
    for py in pys:
        py_text, nb_text = render(py)
        if py.read_text() != py_text:
            problems.append(f"{py.name}: not in jupytext's canonical form")
        ipynb = py.with_suffix(".ipynb")
        if not ipynb.exists():
            problems.append(f"{ipynb.name}: missing")
        elif ipynb.read_text() != nb_text:
            problems.append(f"{ipynb.name}: differs from what {py.name} gives (edited by hand, outputs, or ids)")
    return problems


def sync(directory: Path = NOTEBOOKS) -> list[Path]:
    """Rewrite every pair from its ``.py``; return the files that changed."""
    changed = []
    for py in sources(directory):
        py_text, nb_text = render(py)
        for path, text in ((py, py_text), (py.with_suffix(".ipynb"), nb_text)):
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kit notebook",
                                 description="Keep notebooks/NN_name.py and NN_name.ipynb in sync (the .py is the source).")
    ap.add_argument("action", choices=["sync", "check"])
    ap.add_argument("--dir", default=str(NOTEBOOKS))
    args = ap.parse_args(argv)
    if args.action == "check":
        problems = out_of_sync(Path(args.dir))
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print("run: kit notebook sync", file=sys.stderr)
        return 1 if problems else 0
    for p in sync(Path(args.dir)):
        print("wrote", p)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def where_next(current: str):
    """The "where next" list at the end of a notebook: every notebook of the kit in reading order, each linked with
    its question (read from the committed notebooks, so a new notebook joins without an edit), ``current`` (its
    ``NN`` prefix) marked. A Markdown display object; the report points the links at its HTML pages."""
    import json

    from IPython.display import Markdown

    from kit.lab.report import first_sentence, notebooks, question, title

    lines = ["**Where next** (the notebooks in reading order; terms in the [glossary](00_start_here.ipynb#Glossary)):", ""]
    for path in notebooks():
        nb = json.loads(path.read_text())
        here = path.name.startswith(f"{current}_")
        head = f"**{title(nb)}** (this notebook)" if here else f"[{title(nb)}]({path.name})"
        q = first_sentence(question(nb))
        lines.append(f"- {head}" + (f": {q}" if q and q != title(nb) else ""))
    return Markdown("\n".join(lines))
