"""The main job: execute every notebook headless with papermill and write an HTML report with an index.

``reports/index.html`` lists, per notebook: its question, the claims that held (the lines its assertions
printed: ``CLAIM: ...``, ``claim(s) hold: ...``, ``as expected: ...``, ``checked: ...``), its run time and
result, and its first figure (interactive, plotly.js embedded once, so the page opens offline); above them
the versions ``kit doctor`` reports. Each notebook's executed copy (``reports/NN_name.ipynb``) and its HTML
page sit beside the index; ``./run.sh --lab`` opens the executed copies in JupyterLab.
"""
from __future__ import annotations

import argparse
import html
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from kit.core.flags import add_command
from kit.core.models import REPO_ROOT
from kit.core.topology import TopologyError

NOTEBOOKS = REPO_ROOT / "notebooks"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
# Lines a notebook prints once an assertion has passed.
CLAIM_LINE = re.compile(r"^(CLAIM:|TIMED, NOT ASSERTED:|claims? holds?\b|as expected\b|checked\b)", re.I)


def notebooks() -> list[Path]:
    return sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def execute(nb: Path, out_dir: Path, parameters: dict | None = None, timeout: float = 1800) -> tuple[Path, float, str | None]:
    """Run one notebook with papermill into ``out_dir``; return (executed path, seconds, error or None)."""
    import papermill as pm

    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / nb.name
    t0 = time.monotonic()
    err = None
    try:
        pm.execute_notebook(str(nb), str(out), parameters=parameters or {}, cwd=str(nb.parent),
                            kernel_name="python3", execution_timeout=int(timeout), progress_bar=False)
    except Exception as e:
        err = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    return out, time.monotonic() - t0, err


# A link from one notebook to another (``00_start_here.ipynb#Glossary``) as nbconvert writes it.
NOTEBOOK_LINK = re.compile(r'href="([0-9][0-9]_[A-Za-z0-9_]+)\.ipynb(#[^"]*)?"')


def link_pages(body: str) -> str:
    """Links between the notebooks, pointed at their report pages: ``NN_name.ipynb#anchor`` becomes
    ``NN_name.html#anchor`` for every notebook of the kit (``kit report`` writes the pages side by side; nbconvert
    gives each heading the id JupyterLab gives it, ``#Glossary`` for ``## Glossary``)."""
    def page(m: re.Match) -> str:
        if not (NOTEBOOKS / f"{m.group(1)}.ipynb").exists():
            return m.group(0)
        return f'href="{m.group(1)}.html{m.group(2) or ""}"'

    return NOTEBOOK_LINK.sub(page, body)


def to_html(executed: Path) -> Path:
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(executed), as_version=4)
    body, _ = HTMLExporter().from_notebook_node(nb)
    out = executed.with_suffix(".html")
    out.write_text(link_pages(body))
    return out


def question(nb: dict) -> str:
    """The notebook's question: the paragraph that starts with "**The question:**", else its first title."""
    title = ""
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        m = re.search(r"\*\*The question:\*\*\s*(.+?)(?:\n\s*\n|$)", text, re.S)
        if m:
            return " ".join(m.group(1).split())
        title = title or next((ln.lstrip("# ").strip() for ln in text.splitlines() if ln.startswith("#")), "")
    return title


def claims(nb: dict) -> list[str]:
    """The claim lines the executed notebook printed, in order."""
    out = []
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream" and o.get("name") == "stdout":
                text = "".join(o["text"]) if isinstance(o["text"], list) else o["text"]
                out += [ln.strip() for ln in text.splitlines() if CLAIM_LINE.match(ln.strip())]
    return out


def first_figure(nb: dict) -> dict | None:
    """The notebook's main picture: the plotly figure whose layout has ``meta="main"``, else its first one."""
    figs = [o["data"][PLOTLY_MIME] for cell in nb["cells"] for o in cell.get("outputs", [])
            if o.get("data", {}).get(PLOTLY_MIME)]
    main = [f for f in figs if (f.get("layout") or {}).get("meta") == "main"]
    return (main or figs or [None])[0]


def _inline_md(text: str) -> str:
    """HTML for one line of Markdown: escaped, with **bold**, *italic* and `code`."""
    s = html.escape(text)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    s = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", s)
    return re.sub(r"\*(.+?)\*", r"<i>\1</i>", s)


def summarize(executed: Path) -> dict:
    nb = json.loads(executed.read_text())
    return {"question": question(nb), "claims": claims(nb), "figure": first_figure(nb)}


def versions() -> dict:
    """What ``kit doctor --json`` reports (python, torch, vLLM, CPU, cores, memory, patch selection)."""
    try:
        r = subprocess.run([sys.executable, "-m", "kit", "doctor", "--json"], capture_output=True, text=True,
                           timeout=300, cwd=str(REPO_ROOT))
        info = json.loads(r.stdout.strip().splitlines()[-1])
    except Exception as e:  # the report still lists the notebooks
        return {"doctor": f"not available: {type(e).__name__}: {e}"}
    keep = ("python", "platform", "cores", "memory_gib", "torch", "cpu_capability", "vllm", "device",
            "patch_selection")
    return {k: info[k] for k in keep if k in info}


def _figure_html(fig: dict) -> str:
    import plotly.graph_objects as go
    import plotly.io as pio

    f = go.Figure(fig)
    f.update_layout(height=min(f.layout.height or 420, 420), width=None, margin=dict(l=40, r=20, t=90, b=40),
                    title_font_size=13)
    return pio.to_html(f, include_plotlyjs=False, full_html=False, default_width="100%", default_height="380px",
                       config={"displaylogo": False})


def index_html(rows: list[dict], info: dict, when: str) -> str:
    """The index page: versions, then one section per notebook."""
    from plotly.offline import get_plotlyjs

    vers = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in info.items())
    total = sum(r["seconds"] for r in rows)
    sections = []
    for r in rows:
        status = (f"<span class='bad'>FAILED: {html.escape(r['error'])}</span>" if r["error"]
                  else "<span class='ok'>ok</span>")
        claims_html = "".join(f"<li>{html.escape(c)}</li>" for c in r["claims"]) or "<li><i>none printed</i></li>"
        fig = _figure_html(r["figure"]) if r["figure"] else "<p><i>no figure</i></p>"
        links = (f"<a href='{html.escape(r['page'])}'>page</a> · " if r["page"] else "") + \
                f"<a href='{html.escape(r['name'])}'>executed notebook</a>"
        sections.append(f"""
<section><h2>{html.escape(r['name'])}</h2>
<p class='meta'>{status} · {r['seconds']:.0f} s · {links}</p>
<p><b>Question:</b> {_inline_md(r['question'])}</p>
<div class='cols'><div><b>Claims that held</b><ul>{claims_html}</ul></div>
<div class='fig'><b>Main figure</b>{fig}</div></div></section>""")
    return f"""<!doctype html><html><head><meta charset='utf-8'><title>ppmtp-kit report</title>
<script type="text/javascript">{get_plotlyjs()}</script>
<style>body{{font-family:sans-serif;max-width:1250px;margin:auto;padding:0 1em}} section{{border-top:1px solid #ccc;
padding:.4em 0}} .cols{{display:grid;grid-template-columns:1fr 1.3fr;gap:1em}} .ok{{color:#31a354;font-weight:bold}}
.bad{{color:#de2d26;font-weight:bold}} .meta{{color:#555}} table{{border-collapse:collapse}} th,td{{text-align:left;
padding:1px 8px;font-size:90%}} li{{font-size:90%;margin-bottom:.3em}}</style></head><body>
<h1>ppmtp-kit notebooks</h1>
<p>Executed {html.escape(when)} on the CPU default; {len(rows)} notebooks, {total:.0f} s in all.</p>
<table>{vers}</table>{''.join(sections)}</body></html>"""


def register(sub) -> None:
    """Add ``kit report`` to the ``kit`` command tree (exit 1 when a notebook fails)."""
    p = add_command(sub, "report", run, help="execute the notebooks headless and write reports/index.html",
                    description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO_ROOT / "reports"))
    p.add_argument("--only", default="", help="run only notebooks whose name contains this")
    p.add_argument("--lab", action="store_true", help="(handled by run.sh) open JupyterLab afterwards")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise TopologyError(f"--out {out}: not a directory")
    chosen = [nb for nb in notebooks() if args.only in nb.name]
    if not chosen:
        raise TopologyError(f"--only {args.only!r}: no notebook name contains it "
                            f"({', '.join(nb.name for nb in notebooks())})")
    rows = []
    for nb in chosen:
        print(f"[report] running {nb.name} ...", flush=True)
        executed, secs, err = execute(nb, out)
        row = {"name": nb.name, "seconds": secs, "error": err, "page": None, "question": "", "claims": [],
               "figure": None}
        if executed.exists():
            row["page"] = to_html(executed).name
            row.update(summarize(executed))
        rows.append(row)
        print(f"[report] {nb.name}: {'FAILED: ' + err if err else 'ok'} ({secs:.0f} s, {len(row['claims'])} claims)",
              flush=True)
    (out / "index.html").write_text(index_html(rows, versions(), time.strftime("%Y-%m-%d %H:%M %Z")))
    print(f"[report] wrote {out / 'index.html'}")
    return 1 if any(r["error"] for r in rows) else 0
