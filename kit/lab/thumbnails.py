"""Small static PNG pictures of a notebook's main plotly figure, for ``reports/index.html``.

The index shows each notebook's key figure as a PNG so that the page stays small (no plotly.js, no figure data) and
reads the same at any width. Two routes, both offline, both drawing with plotly.js in a headless Chrome/Chromium:

- plotly's own static export (``plotly.io.to_image``) when ``kaleido`` (>= 1) is importable;
- else a screenshot of a small HTML page holding the figure, ``chromium --headless --screenshot``, with the
  browser named by ``BROWSER_PATH`` (the variable kaleido reads too) or found on ``PATH``.

Without either, :func:`write_png` raises :class:`ThumbnailError` saying why; the index then says so in place of
the picture.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

# Drawn at twice the size the index shows, so the picture stays sharp on high-density screens.
WIDTH, HEIGHT = 640, 400
FONT = 20  # the most: at half size 10 px, still readable
MIN_FONT = 9
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


class ThumbnailError(RuntimeError):
    """No PNG could be drawn (no renderer found, or the renderer failed)."""


def small_figure(fig: dict) -> dict:
    """The figure as a thumbnail draws it: no title (the index prints it as the caption, where it wraps), no legend
    and no sliders or buttons (at thumbnail size they cover the plot), small fonts and margins, fixed size."""
    f = copy.deepcopy(fig)
    layout = f.setdefault("layout", {})
    for key in ("title", "sliders", "updatemenus", "width", "height", "margin"):
        layout.pop(key, None)
    for ann in layout.get("annotations") or []:  # subplot titles are annotations: keep them, the size of the rest
        (ann.get("font") or {}).pop("size", None)
    # The index shows the picture at half size: fonts twice their usual size stay readable there.
    for axis in [k for k in layout if k.startswith(("xaxis", "yaxis"))]:
        if isinstance(layout[axis], dict) and isinstance(layout[axis].get("title"), dict):
            layout[axis]["title"].pop("font", None)
    layout.update(showlegend=False, width=WIDTH, height=HEIGHT, margin={"l": 60, "r": 20, "t": 40, "b": 60},
                  font={**(layout.get("font") or {}), "size": font_size(f)})
    for trace in f.get("data") or []:
        trace["showlegend"] = False
    return f


def _text(title: object) -> str:
    """A title or annotation's text, whether given as a string or as ``{"text": ...}``."""
    return str((title.get("text") if isinstance(title, dict) else title) or "")


def font_size(fig: dict) -> int:
    """The largest font, up to :data:`FONT`, at which the figure's panel titles and axis titles fit their panel:
    a figure of several panels gets smaller type instead of titles running into each other. Characters are taken
    as 0.6 of the font size wide; plotly draws axis titles at 1.2 times the font."""
    layout = fig.get("layout") or {}
    axes = {k: v for k, v in layout.items() if k.startswith(("xaxis", "yaxis")) and isinstance(v, dict)}
    cols = len({round((v.get("domain") or [0])[0], 2) for k, v in axes.items() if k.startswith("xaxis")}) or 1
    rows = len({round((v.get("domain") or [0])[0], 2) for k, v in axes.items() if k.startswith("yaxis")}) or 1
    colour_bar = any(t.get("showscale") is not False and t.get("type") in ("heatmap", "contour", "surface")
                     for t in fig.get("data") or []) or "coloraxis" in layout
    col_w = (WIDTH - 80 - (110 if colour_bar else 0)) / cols
    row_h = (HEIGHT - 100) / rows
    wide = max([len(_text(a.get("text"))) for a in layout.get("annotations") or []]
               + [1.2 * len(_text(v.get("title"))) for k, v in axes.items() if k.startswith("xaxis")] + [1])
    tall = max([1.2 * len(_text(v.get("title"))) for k, v in axes.items() if k.startswith("yaxis")] + [1])
    return int(max(MIN_FONT, min(FONT, col_w / (0.6 * wide), row_h / (0.6 * tall))))


def title(fig: dict) -> str:
    """The figure's title text ('' when it has none)."""
    return _text((fig.get("layout") or {}).get("title"))


def browser() -> str | None:
    """The headless browser to draw with: ``BROWSER_PATH`` when set, else the first of :data:`BROWSERS` on PATH."""
    env = os.environ.get("BROWSER_PATH")
    if env:
        return env if Path(env).exists() else None
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def _kaleido_available() -> bool:
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return False
    return True


def _with_kaleido(fig: dict, out: Path) -> None:
    import plotly.io as pio

    out.write_bytes(pio.to_image(fig, format="png", width=WIDTH, height=HEIGHT))


def _with_screenshot(fig: dict, out: Path, exe: str, timeout: float) -> None:
    from plotly.offline import get_plotlyjs

    with tempfile.TemporaryDirectory(prefix="kit-thumb-") as tmp:
        page = Path(tmp) / "figure.html"
        # staticPlot: no mode bar or hover layer in the picture; plotly.js inline: the page needs no network.
        page.write_text(
            "<!doctype html><html><head><meta charset='utf-8'><style>body{margin:0;background:#fff}</style>"
            f"<script>{get_plotlyjs()}</script></head><body><div id='f'></div><script>"
            f"var fig={json.dumps(fig)};Plotly.newPlot('f',fig.data,fig.layout,{{staticPlot:true}});"
            "</script></body></html>")
        # --no-sandbox: Chromium's sandbox does not start as root or in most containers; the page is the kit's own.
        # --virtual-time-budget: the screenshot waits until plotly.js has drawn. A private profile directory keeps
        # a running browser's profile lock out of the way.
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
               "--force-device-scale-factor=1", f"--user-data-dir={tmp}/profile", f"--window-size={WIDTH},{HEIGHT}",
               "--virtual-time-budget=5000", f"--screenshot={out}", page.as_uri()]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise ThumbnailError(f"{exe} --screenshot: no picture after {timeout:.0f} s") from e
        if not out.exists() or out.stat().st_size == 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit code {r.returncode}"]
            raise ThumbnailError(f"{exe} --screenshot wrote no picture: {tail[0]}")


def write_png(fig: dict, out: Path, timeout: float = 120) -> str:
    """Draw ``fig`` (a plotly figure as JSON) small into ``out``; return the route taken: ``kaleido`` or the browser's
    path (screenshot). Raises :class:`ThumbnailError` when neither route draws it."""
    small = small_figure(fig)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)  # a picture left by an earlier run must not pass for this one
    why = []
    if _kaleido_available():
        try:
            _with_kaleido(small, out)
            return "kaleido"
        except Exception as e:  # kaleido present but its browser missing or broken: try the screenshot
            why.append(f"kaleido: {type(e).__name__}: {str(e).strip()[:200]}")
    else:
        why.append("kaleido not installed")
    exe = browser()
    if exe is None:
        why.append("no Chrome/Chromium (set BROWSER_PATH or put chromium on PATH)")
        raise ThumbnailError("; ".join(why))
    try:
        _with_screenshot(small, out, exe, timeout)
    except ThumbnailError as e:
        why.append(str(e))
        raise ThumbnailError("; ".join(why)) from e
    return exe
