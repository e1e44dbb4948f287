"""The main job: execute every notebook headless with papermill and write an HTML report with an index.

``reports/index.html`` is the entry page: first the total run time (the sum of the notebooks' run times), then
the notebooks in reading order (``notebooks/NN_*.ipynb`` sorted by name, so a new notebook joins without a code
change), each with its title, one-line takeaway, run time, claims held out of those made (the lines its assertions
printed: ``CLAIM: ...``, ``claim(s) hold: ...``, ``as expected: ...``, ``checked: ...``, folded), a link to its
HTML page and a small PNG of its main figure (:mod:`kit.lab.thumbnails`); last, folded, the versions
``kit doctor`` reports. The index holds no plotly.js: the interactive figures are on the notebooks' pages.

The index is rendered from the executed copies (``reports/NN_name.ipynb``: outputs, papermill's run time and
exception), after executing them or, with ``--render-only``, from the copies an earlier run left; a notebook not
executed yet is listed as not run. Each executed copy's HTML page sits beside the index; ``./run.sh --lab`` opens
the executed copies in JupyterLab.
"""
from __future__ import annotations

import argparse
import html
import json
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from kit.core.flags import add_command
from kit.core.models import REPO_ROOT
from kit.core.topology import TopologyError
from kit.lab import cell_times, thumbnails

NOTEBOOKS = REPO_ROOT / "notebooks"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
# Lines a notebook prints once an assertion has passed.
CLAIM_LINE = re.compile(r"^(CLAIM:|TIMED, NOT ASSERTED:|claims? holds?\b|as expected\b|checked\b)", re.I)
# A claim printed but not asserted (kit.lab.notebook.claim with timed_claims off): listed, not counted.
UNASSERTED = "TIMED, NOT ASSERTED:"
# The one-line takeaway a notebook states in a markdown cell (or prints as Markdown): "**Takeaway:** ...".
TAKEAWAY = re.compile(r"\*\*Takeaway:\*\*\s*(.+?)(?:\n\s*\n|$)", re.S)
THUMBS = "thumbs"  # the index's pictures, beside it: reports/thumbs/NN_name.png


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


def _markdown_texts(nb: dict) -> list[str]:
    """Every markdown cell's text and every Markdown output, in cell order."""
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            out.append("".join(cell["source"]))
        for o in cell.get("outputs", []):
            md = (o.get("data") or {}).get("text/markdown")
            if md:
                out.append("".join(md) if isinstance(md, list) else md)
    return out


def question(nb: dict) -> str:
    """The notebook's question: the paragraph that starts with "**The question:**", else its :func:`title`."""
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            m = re.search(r"\*\*The question:\*\*\s*(.+?)(?:\n\s*\n|$)", "".join(cell["source"]), re.S)
            if m:
                return " ".join(m.group(1).split())
    return title(nb)


def title(nb: dict) -> str:
    """The notebook's title: the first Markdown heading."""
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for ln in "".join(cell["source"]).splitlines():
                if ln.startswith("#"):
                    return ln.lstrip("#").strip()
    return ""


def first_sentence(text: str) -> str:
    """The first sentence of a Markdown text, headings skipped, on one line."""
    prose = " ".join(" ".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#")).split())
    # A sentence ends at . ? ! followed by a capital, a Markdown mark or a bracket; "e.g. x" does not end one.
    m = re.match(r"(.+?[.?!])(?=\s+[A-Z*`(\[])", prose)
    return m.group(1) if m else prose


def takeaway(nb: dict) -> tuple[str, bool]:
    """The notebook's one-line takeaway and whether the notebook states it: the paragraph after "**Takeaway:**"
    (a markdown cell or a Markdown output), else the first sentence of the first markdown cell (False)."""
    texts = _markdown_texts(nb)
    for text in texts:
        m = TAKEAWAY.search(text)
        if m:
            return " ".join(m.group(1).split()), True
    first = next(("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"), "")
    return first_sentence(first), False


def claims(nb: dict) -> list[str]:
    """The claim lines the executed notebook printed, in order."""
    out = []
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream" and o.get("name") == "stdout":
                text = "".join(o["text"]) if isinstance(o["text"], list) else o["text"]
                out += [ln.strip() for ln in text.splitlines() if CLAIM_LINE.match(ln.strip())]
    return out


def failure(nb: dict) -> str | None:
    """Why the executed notebook stopped (``Name: message``, from its error output), or None when papermill
    recorded no exception."""
    if not (nb.get("metadata", {}).get("papermill") or {}).get("exception"):
        return None
    errors = [o for cell in nb["cells"] for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors:
        return "the run stopped (no error output recorded)"
    lines = str(errors[0].get("evalue", "")).strip().splitlines()
    return f"{errors[0].get('ename', 'Error')}: {lines[-1] if lines else ''}"


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
    return re.sub(r"(?<![\w\\])\*(?!\s)(.+?)(?<!\s)\*", r"<i>\1</i>", s).replace("\\*", "*")


def texts(nb: dict) -> dict:
    """What the index says of a notebook from its text alone (executed or not): question, title, takeaway."""
    text, stated = takeaway(nb)
    return {"question": question(nb), "title": title(nb), "takeaway": text, "takeaway_stated": stated}


def summarize(executed: Path) -> dict:
    """What the index shows of one executed notebook (no picture: :func:`row` draws it)."""
    nb = json.loads(executed.read_text())
    pm = nb.get("metadata", {}).get("papermill") or {}
    return {**texts(nb), "claims": claims(nb), "figure": first_figure(nb), "error": failure(nb),
            "times": cell_times.check(nb), "seconds": pm.get("duration"), "started": pm.get("start_time"),
            "finished": pm.get("end_time")}


def claim_count(row: dict) -> tuple[int, int]:
    """(claims that held, claims made): every asserted claim line printed held; a notebook stopped by an
    ``AssertionError`` of :func:`kit.lab.notebook.claim` ("...: does not hold") made one more, which failed."""
    held = sum(1 for c in row["claims"] if not c.startswith(UNASSERTED))
    failed = 1 if (row.get("error") or "").startswith("AssertionError") and "does not hold" in row["error"] else 0
    return held, held + failed


def _fresh(path: Path, source: Path) -> bool:
    """``path`` exists and was written after ``source`` (so it was made from this executed copy)."""
    return path.exists() and path.stat().st_mtime >= source.stat().st_mtime


def row(nb: Path, out: Path, ran: tuple[float, str | None] | None = None) -> dict:
    """One notebook of the index, read from its executed copy in ``out`` (else from its source: not run).
    ``ran``: (seconds, error) of an execution just done, which win over what the copy records (a run that failed
    before papermill wrote its copy leaves none, or an older one)."""
    executed = out / nb.name
    r = {"name": nb.name, "stem": nb.stem, "ran": executed.exists() or ran is not None, "page": None,
         "notebook": None, "seconds": None, "error": None, "started": None, "finished": None, "claims": [],
         "figure": None, "thumb": None, "thumb_error": None, "thumb_route": None, "times": []}
    if executed.exists():
        r.update(summarize(executed), notebook=executed.name)
        page = executed.with_suffix(".html")
        r["page"] = (page if _fresh(page, executed) else to_html(executed)).name
        if r["figure"]:
            png = out / THUMBS / f"{nb.stem}.png"
            if _fresh(png, executed):  # drawn from this copy already: a render-only pass does not redraw it
                r["thumb"] = f"{THUMBS}/{png.name}"
            else:
                try:
                    r["thumb_route"] = thumbnails.write_png(r["figure"], png)
                    r["thumb"] = f"{THUMBS}/{png.name}"
                except thumbnails.ThumbnailError as e:
                    r["thumb_error"] = str(e)
    else:
        r.update(texts(json.loads(nb.read_text())))
    if ran is not None:
        r["seconds"], r["error"] = ran[0], ran[1] or r["error"]
    return r


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


def duration(seconds: float | None) -> str:
    """``95 s``, ``3 min 47 s``, ``1 h 02 min``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _when(iso: str | None) -> str:
    """papermill's ISO end time as ``2026-12-04 14:09 UTC``."""
    if not iso:
        return ""
    try:
        return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return iso


def _plain(text: str) -> str:
    """A plotly title as plain text: the tags plotly draws (``<br>``, ``<b>``, ...) become spaces; other text in
    angle brackets (``s<step>``) is the title's own words and stays."""
    return " ".join(re.sub(r"</?(?:br|b|i|em|sup|sub|span|a)\b[^>]*>", " ", text, flags=re.I).split())


def _section(r: dict) -> str:
    """One notebook of the index: text on the left, its picture on the right (below it on a narrow screen)."""
    num = r["stem"][:2]
    head = _inline_md(r.get("title") or r["stem"])
    head = f"<a href='{html.escape(r['page'])}'>{head}</a>" if r["page"] else head
    label = "<b>Takeaway:</b> " if r.get("takeaway_stated") else ""
    if not r["ran"]:
        meta = f"<span class='todo'>not run</span> · <code>kit report --only {html.escape(num)}</code>"
    else:
        status = ("<span class='bad'>FAILED</span>" if r["error"] else "<span class='ok'>ok</span>")
        links = [f"<a href='{html.escape(r['page'])}'>report page</a>"] if r["page"] else []
        links += [f"<a href='{html.escape(r['notebook'])}'>executed notebook</a>"] if r["notebook"] else []
        when = [f"<span class='nowrap'>{_when(r['finished'])}</span>"] if r["finished"] else []
        meta = " · ".join([status, f"<b>{duration(r['seconds'])}</b>", *when, *links])
    parts = [f"<h2><span class='num'>{html.escape(num)}</span> {head}</h2>",
             f"<p class='takeaway'>{label}{_inline_md(r.get('takeaway') or '')}</p>", f"<p class='meta'>{meta}</p>"]
    if r["error"]:
        parts.append(f"<p class='bad'>{html.escape(r['error'])}</p>")
    if r["ran"]:
        held, made = claim_count(r)
        unasserted = len(r["claims"]) - held
        summary = f"{held}/{made} claims held" + (f", {unasserted} timed, not asserted" if unasserted else "")
        items = []
        for c in r["claims"]:
            text = c[len("CLAIM:"):].strip() if c.startswith("CLAIM:") else c
            items.append(f"<li{' class=unasserted' if c.startswith(UNASSERTED) else ''}>{html.escape(text)}</li>")
        if made > held:
            items.append(f"<li class='bad'>{html.escape(r['error'])}</li>")
        parts.append(f"<details><summary>{summary}</summary><ul>{''.join(items)}</ul></details>")
    fig = ""
    if r["thumb"]:
        cap = _plain(thumbnails.title(r["figure"])) if r["figure"] else ""
        img = (f"<img src='{html.escape(r['thumb'])}' width='{thumbnails.WIDTH // 2}' "
               f"height='{thumbnails.HEIGHT // 2}' alt='{html.escape(cap or 'main figure')}'>")
        fig = (f"<figure><a href='{html.escape(r['page'] or r['thumb'])}'>{img}</a>"
               f"<figcaption>{html.escape(cap)}</figcaption></figure>")
    elif r["thumb_error"]:
        fig = f"<figure><figcaption>no picture: {html.escape(r['thumb_error'])}</figcaption></figure>"
    return f"<li class='nb' id='nb{html.escape(num)}'><div>{''.join(parts)}</div>{fig}</li>"


STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:auto;padding:0 1em;line-height:1.4;color:#222}
h1{margin-bottom:.2em} h2{font-size:1.15em;margin:.2em 0} h2 a{color:inherit} .num{color:#777;font-weight:normal}
.total{font-size:1.25em;margin:.3em 0} .meta{color:#555;margin:.2em 0;font-size:.95em} nav{margin:.6em 0 1em}
nav a{white-space:nowrap} ol.nbs{list-style:none;padding:0;margin:0}
li.nb{display:grid;grid-template-columns:minmax(0,1fr) 320px;gap:1.2em;border-top:1px solid #ddd;padding:.8em 0}
.takeaway{margin:.3em 0} figure{margin:0} figure img{display:block;max-width:100%;height:auto;border:1px solid #ddd}
figcaption{font-size:.8em;color:#555;margin-top:.2em} details{margin:.3em 0} summary{cursor:pointer;color:#333}
details li{font-size:.9em;margin-bottom:.2em} .unasserted{color:#777} .ok{color:#31a354;font-weight:bold}
.bad{color:#de2d26;font-weight:bold} .todo{color:#777;font-weight:bold} code{font-size:.92em}
.nowrap{white-space:nowrap}
table{border-collapse:collapse} th,td{text-align:left;padding:1px 8px;font-size:.9em;vertical-align:top}
@media (max-width:720px){li.nb{grid-template-columns:minmax(0,1fr)} figure{max-width:320px}}"""


def index_html(rows: list[dict], info: dict) -> str:
    """The index page: total time, reading order, one section per notebook, the versions folded last."""
    done = [r for r in rows if r["ran"]]
    total = sum(r["seconds"] or 0 for r in done)
    failed = sum(1 for r in done if r["error"])
    starts = sorted(_when(r["started"]) for r in done if r["started"])
    ends = sorted(_when(r["finished"]) for r in done if r["finished"])
    span = ""
    if starts and ends:  # one date written once: "executed 2026-12-04 14:03 to 14:09 UTC"
        a, b = starts[0].removesuffix(" UTC"), ends[-1].removesuffix(" UTC")
        span = f"executed <span class='nowrap'>{a} to {b[len(a) - 5:] if a[:10] == b[:10] else b} UTC</span>"
    count = f"{len(done)} of {len(rows)} notebooks run" + (f", <span class='bad'>{failed} failed</span>" if failed
                                                             else "")
    # Numbers only: the titles follow right below, and a row of long titles would wrap on a narrow screen.
    order = " → ".join(f"<a href='#nb{html.escape(r['stem'][:2])}' "
                       f"title='{html.escape(r.get('title') or r['stem'])}'>{html.escape(r['stem'][:2])}</a>"
                       for r in rows)
    vers = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in info.items())
    return f"""<!doctype html><html lang='en'><head><meta charset='utf-8'>
<meta name='viewport' content='width=device-width,initial-scale=1'><title>ppmtp-kit notebooks</title>
<style>{STYLE}</style></head><body>
<h1>ppmtp-kit notebooks</h1>
<p class='total'><b>Total time: {duration(total)}</b></p>
<p class='meta'>The sum of the notebooks' run times; {count}{'; ' + span if span else ''}.</p>
<nav>Read in this order: {order}</nav>
<ol class='nbs'>{''.join(_section(r) for r in rows)}</ol>
<details><summary>Versions (<code>kit doctor</code>)</summary><table>{vers}</table></details>
</body></html>
"""


def write_index(out: Path, ran: dict[str, tuple[float, str | None]] | None = None, info: dict | None = None) -> Path:
    """Write ``out/index.html`` for every notebook of ``notebooks/``, in order, from the executed copies in ``out``
    (rendering their missing or stale pages and pictures); ``ran``: name -> (seconds, error) of this run's
    executions. The one path to the index: after executing, and alone with ``kit report --render-only``."""
    rows = [row(nb, out, (ran or {}).get(nb.name)) for nb in notebooks()]
    routes = sorted({r["thumb_route"] for r in rows if r["thumb_route"]})
    if routes:
        print(f"[report] pictures drawn with {', '.join(routes)}", flush=True)
    for r in rows:
        if r["thumb_error"]:
            print(f"[report] {r['name']}: no picture: {r['thumb_error']}", flush=True)
    path = out / "index.html"
    path.write_text(index_html(rows, versions() if info is None else info))
    return path


def register(sub) -> None:
    """Add ``kit report`` to the ``kit`` command tree (exit 1 when a notebook fails)."""
    p = add_command(sub, "report", run, help="execute the notebooks headless and write reports/index.html",
                    description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO_ROOT / "reports"))
    p.add_argument("--only", default="", help="run only notebooks whose name contains this")
    p.add_argument("--render-only", action="store_true",
                   help="execute nothing: write index.html (and missing pages and pictures) from the executed "
                        "notebooks already in --out")
    p.add_argument("--lab", action="store_true", help="(handled by run.sh) open JupyterLab afterwards")
    p.add_argument("--write", default=None, metavar="FILE",
                   help="also write this run's times and claims as a results block into FILE "
                        "(docs/results/tests.md); only after executing every notebook")


def run_block(rows: list[dict]) -> str:
    """The body of the ``./run.sh`` results block: total, then per notebook its time, claims held and result."""
    total = sum(r["seconds"] or 0 for r in rows)
    failed = [r["stem"] for r in rows if r["error"]]
    lines = [f"**{len(rows) - len(failed)} of {len(rows)} notebooks ok; {total:.0f} s in all "
             f"({total / 60:.1f} minutes, the sum of the notebooks' run times; the target is 15 minutes)**"
             + (f"; failed: {', '.join(failed)}" if failed else "") + ".", ""]
    tol = cell_times.TOLERANCE_TEXT
    lines += [f"| notebook | time | claims held | stated times within {tol} | result |", "|---|---|---|---|---|"]
    off = []
    for r in rows:
        held, made = claim_count(r)
        good = sum(t.ok for t in r["times"])
        off += [f"{r['stem']} {t.describe()}" for t in r["times"] if not t.ok]
        lines.append(f"| {r['stem']} | {r['seconds'] or 0:.0f} s | {held} of {made} | {good} of {len(r['times'])} | "
                     f"{'failed: ' + r['error'] if r['error'] else 'ok'} |")
    lines += ["", f"Stated times (`kit.lab.cell_times`: each engine cell's `# about N s` and each notebook's opening "
              f"'About N ... on 2 cores', against papermill's durations in this run) outside {tol}: "
              + ("; ".join(off) if off else "none") + "."]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise TopologyError(f"--out {out}: not a directory")
    chosen = [nb for nb in notebooks() if args.only in nb.name]
    if not chosen:
        raise TopologyError(f"--only {args.only!r}: no notebook name contains it "
                            f"({', '.join(nb.name for nb in notebooks())})")
    ran: dict[str, tuple[float, str | None]] = {}
    write = getattr(args, "write", None)
    if write:
        from kit.core.results import check_writable

        if getattr(args, "render_only", False) or args.only:
            raise TopologyError("--write records a whole run: not with --render-only or --only")
        if why := check_writable(write):
            raise TopologyError(why)
    started = datetime.now(timezone.utc)
    if getattr(args, "render_only", False):
        if not out.is_dir():
            raise TopologyError(f"--render-only: {out} does not exist (run kit report first)")
        print(f"[report] rendering from the executed notebooks in {out} (nothing executed)", flush=True)
    else:
        for nb in chosen:
            print(f"[report] running {nb.name} ...", flush=True)
            executed, secs, err = execute(nb, out)
            ran[nb.name] = (secs, err)
            done = json.loads(executed.read_text()) if executed.exists() else {}
            n = len(claims(done)) if done else 0
            stated = cell_times.check(done) if done and not err else []
            times = f"; {cell_times.summary(stated)}" if stated else ""
            print(f"[report] {nb.name}: {'FAILED: ' + err if err else 'ok'} ({secs:.0f} s, {n} claims{times})",
                  flush=True)
            for t in stated:
                if not t.ok:
                    print(f"[report]   stated time off: {t.describe()}", flush=True)
    path = write_index(out, ran)
    print(f"[report] wrote {path}")
    if write:
        from kit.core.results import block_key, command_line, write_block

        rows = [row(nb, out, ran.get(nb.name)) for nb in chosen]
        argv = (["--out", str(out)] if out.resolve() != (REPO_ROOT / "reports").resolve() else []) + ["--write", write]
        write_block(write, block_key("kit report", argv), run_block(rows), command_line("kit report", argv),
                    when=started, until=datetime.now(timezone.utc), title="Tests")
        print(f"[report] recorded the run in {write}")
    if ran:
        return 1 if any(err for _, err in ran.values()) else 0
    return 1 if any(failure(json.loads((out / nb.name).read_text())) for nb in notebooks()
                    if (out / nb.name).exists()) else 0
