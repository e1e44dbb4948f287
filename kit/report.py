"""The main job: execute every notebook headless with papermill and write an HTML report with an index."""
from __future__ import annotations

import argparse
import html
import sys
import time
from pathlib import Path

from .command import add_command
from .models import REPO_ROOT

NOTEBOOKS = REPO_ROOT / "notebooks"


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


def to_html(executed: Path) -> Path:
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(executed), as_version=4)
    body, _ = HTMLExporter().from_notebook_node(nb)
    out = executed.with_suffix(".html")
    out.write_text(body)
    return out


def register(sub) -> None:
    """Add ``kit report`` to the ``kit`` command tree (exit 1 when a notebook fails)."""
    p = add_command(sub, "report", run, help="execute the notebooks headless and write reports/index.html",
                    description=__doc__)
    p.add_argument("--out", default=str(REPO_ROOT / "reports"))
    p.add_argument("--only", default="", help="run only notebooks whose name contains this")
    p.add_argument("--lab", action="store_true", help="(handled by run.sh) open JupyterLab afterwards")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    rows = []
    for nb in notebooks():
        if args.only not in nb.name:
            continue
        print(f"[report] running {nb.name} ...", flush=True)
        executed, secs, err = execute(nb, out)
        page = to_html(executed) if executed.exists() else None
        rows.append((nb.name, secs, err, page))
        print(f"[report] {nb.name}: {'FAILED: ' + err if err else 'ok'} ({secs:.0f} s)", flush=True)
    items = "\n".join(
        f"<tr><td><a href='{html.escape(p.name) if p else '#'}'>{html.escape(n)}</a></td><td>{s:.0f} s</td>"
        f"<td>{'FAILED: ' + html.escape(e) if e else 'ok'}</td></tr>" for n, s, e, p in rows)
    (out / "index.html").write_text(
        "<html><head><meta charset='utf-8'><title>ppmtp-kit report</title></head><body>"
        f"<h1>ppmtp-kit notebooks</h1><p>Executed {time.strftime('%Y-%m-%d %H:%M')} on the CPU default.</p>"
        f"<table border=1 cellpadding=4><tr><th>notebook</th><th>time</th><th>result</th></tr>{items}</table></body></html>")
    print(f"[report] wrote {out / 'index.html'}")
    return 1 if any(e for _, _, e, _ in rows) else 0


if __name__ == "__main__":
    from kit.cli import main

    sys.exit(main(["report", *sys.argv[1:]]))
