"""Export every plotly figure of executed notebooks (``reports/*.ipynb`` from ``./run.sh``) as PNG.

For looking at the figures outside JupyterLab (review, docs). Needs ``kaleido`` and a Chrome/Chromium
(``pip install kaleido``; ``apt-get install chromium``) — not part of the kit's dependencies.
Usage: ``.venv/bin/python scripts/export_figures.py [reports] [--out reports/png]``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import nbformat
import plotly.io as pio

MIME = "application/vnd.plotly.v1+json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", default="reports")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    src = Path(args.src)
    out = Path(args.out) if args.out else src / "png"
    out.mkdir(parents=True, exist_ok=True)
    for nb_path in sorted(src.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(str(nb_path), as_version=4)
        n = 0
        for cell in nb.cells:
            for o in cell.get("outputs", []):
                fig = (o.get("data") or {}).get(MIME)
                if fig is None:
                    continue
                n += 1
                path = out / f"{nb_path.stem}-{n}.png"
                pio.from_json(json.dumps(fig)).write_image(str(path), width=1100, height=450, scale=1)
                print("wrote", path)


if __name__ == "__main__":
    main()
