"""Figures and the slider of notebook 05 (does speculation pay?): the predicted speed-up over acceptance rate and
k for each (model, PP) with the measured points and the break-even line, the best k of a range, a slider that
redraws the prediction (its default state drawn as a plain output first, for the HTML report), the held-out
predictions against the measurements (:mod:`kit.bench.holdout`) and each PP stage's busy / waiting / idle time per
decode step from the bench timeline (:func:`kit.worker.steptrace.summary`).

Plotly figures built from :class:`kit.bench.payoff.Costs`; nothing here measures.
"""
from __future__ import annotations

import math

from kit.bench.payoff import Costs, expected_tokens

A_GRID = [i / 100 for i in range(0, 101)]
# A diverging scale with white exactly in the middle (ColorBrewer RdBu, its near-white centre made white): the
# surface colours log2(speed-up) over a range symmetric around 0, so 1.0x (break-even) is white, blue pays and red
# loses, and 2x and 0.5x are the same depth of blue and red.
DIVERGING = ["rgb(103,0,31)", "rgb(178,24,43)", "rgb(214,96,77)", "rgb(244,165,130)", "rgb(253,219,199)",
             "rgb(255,255,255)",
             "rgb(209,229,240)", "rgb(146,197,222)", "rgb(67,147,195)", "rgb(33,102,172)", "rgb(5,48,97)"]
COLORSCALE = [[i / (len(DIVERGING) - 1), c] for i, c in enumerate(DIVERGING)]
SPEEDUP_TICKS = (0.25, 0.33, 0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


def _key_title(key: tuple) -> str:
    model, pp, batch = key
    return f"{model}, PP={pp}, batch {batch}"


def colour_limit(costs: dict[tuple, Costs], ks: tuple[int, ...], a_grid: list[float] = A_GRID) -> float:
    """The colour range of :func:`surface_figure`: the largest ``|log2(speed-up)|`` over every panel's grid (at
    least log2(1.25), so a nearly flat surface is not all deep colour)."""
    vals = [abs(math.log2(c.speedup(a, k))) for c in costs.values() for k in ks for a in a_grid]
    return max([math.log2(1.25)] + vals)


def _rgb(text: str) -> tuple[float, float, float]:
    r, g, b = (float(x) for x in text[text.index("(") + 1:text.index(")")].split(","))
    return r, g, b


def colour_at(speedup: float, limit: float) -> tuple[float, float, float]:
    """The surface's colour (r, g, b in 0..255) for ``speedup`` when the colour range is ``[-limit, limit]`` in
    log2(speed-up): plotly's linear interpolation between the stops of :data:`COLORSCALE`, clipped at both ends."""
    f = min(1.0, max(0.0, (math.log2(speedup) / limit + 1) / 2))
    n = len(DIVERGING) - 1
    i = min(int(f * n), n - 1)
    t = f * n - i
    lo, hi = _rgb(DIVERGING[i]), _rgb(DIVERGING[i + 1])
    return tuple(x + (y - x) * t for x, y in zip(lo, hi))


def text_colour(background: tuple[float, float, float]) -> str:
    """Black on a light background, white on a dark one (perceived brightness, 0..255)."""
    r, g, b = background
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b >= 150 else "white"


def best_k_text(k: int, searched: "range | tuple[int, ...]") -> str:
    """A best k found over ``searched``: ``"2"``, or ``"≥ 6 (top of the range searched)"`` when it is the largest k
    tried (a larger one, not tried, might pay more)."""
    return f"≥ {k} (top of the range searched)" if k == max(searched) else str(k)


def surface_figure(costs: dict[tuple, Costs], points: list[dict] | None = None, ks: tuple[int, ...] = (1, 2, 3, 4, 5),
                   title: str = "Predicted decode speed-up over no speculation"):
    """One heatmap per (model, PP, batch) in ``costs``: predicted speed-up over the per-position acceptance rate
    (x) and k (y), coloured by log2(speed-up) on a diverging scale centred at 1.0x (white: break-even; blue: pays;
    red: loses; one colour range for all panels, :func:`colour_limit`); the break-even line in black (no point
    where even a = 1 loses); the measured rows of ``points`` (dicts from :func:`kit.bench.payoff.predict`) as
    markers labelled measured / predicted, each label black or white by the colour under it. The axes span the
    acceptance rates and the k drawn."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    keys = list(costs)
    models = list(dict.fromkeys(k[0] for k in keys))
    cols = list(dict.fromkeys((k[1], k[2]) for k in keys))
    fig = make_subplots(rows=len(models), cols=len(cols), shared_xaxes=True, shared_yaxes=True,
                        subplot_titles=[_key_title((m, pp, b)) for m in models for pp, b in cols],
                        horizontal_spacing=0.06, vertical_spacing=0.12)
    points = points or []
    lim = colour_limit(costs, ks)
    ticks = [t for t in SPEEDUP_TICKS if abs(math.log2(t)) <= lim + 1e-9]
    colorbar = dict(title="speed-up", tickvals=[math.log2(t) for t in ticks],
                    ticktext=[f"{t:g}x" + (" break-even" if t == 1.0 else "") for t in ticks])
    for i, m in enumerate(models, 1):
        for j, (pp, b) in enumerate(cols, 1):
            c = costs.get((m, pp, b))
            if c is None:
                continue
            s = [[c.speedup(a, k) for a in A_GRID] for k in ks]
            fig.add_trace(go.Heatmap(x=A_GRID, y=list(ks), z=[[math.log2(v) for v in row] for row in s], customdata=s,
                                     zmin=-lim, zmax=lim, zmid=0.0, colorscale=COLORSCALE, colorbar=colorbar,
                                     showscale=(i, j) == (1, 1), name="predicted speed-up",
                                     hovertemplate="a=%{x:.2f}, k=%{y}: %{customdata:.2f}x<extra></extra>"),
                          row=i, col=j)
            be = [(c.break_even(k), k) for k in ks]
            fig.add_trace(go.Scatter(x=[a for a, _ in be], y=[k for _, k in be], connectgaps=False,
                                     mode="lines+markers", line=dict(color="black", width=2),
                                     name="break-even", showlegend=(i, j) == (1, 1),
                                     hovertemplate="k=%{y}: loses below a=%{x:.2f}<extra></extra>"), row=i, col=j)
            pts = [p for p in points if (p["model"], p["pp"], p["batch"]) == (m, pp, b)]
            if pts:
                # The label sits left of its marker (textposition "middle left"), over about a tenth of the x axis.
                under = [colour_at(c.speedup(max(0.0, p["acceptance"] - 0.1), p["k"]), lim) for p in pts]
                fig.add_trace(go.Scatter(
                    x=[p["acceptance"] for p in pts], y=[p["k"] for p in pts], mode="markers+text",
                    marker=dict(size=11, color="gold", line=dict(color="black", width=1)),
                    text=[f"{p['measured']:.2f}x / {p['predicted']:.2f}x" for p in pts], textposition="middle left",
                    textfont=dict(color=[text_colour(u) for u in under], shadow="auto"),
                    name="measured / predicted", showlegend=(i, j) == (1, 1),
                    hovertemplate="measured at a=%{x:.3f}, k=%{y}: %{text}<extra></extra>"), row=i, col=j)
    fig.update_xaxes(range=[A_GRID[0], A_GRID[-1]], showgrid=False, zeroline=False)
    fig.update_xaxes(title_text="per-position acceptance rate a", row=len(models))
    fig.update_yaxes(range=[min(ks) - 0.5, max(ks) + 0.5], tickvals=list(ks), showgrid=False, zeroline=False)
    fig.update_yaxes(title_text="k (draft tokens)", col=1)
    fig.update_layout(title=title, height=330 * len(models) + 80, legend=dict(orientation="h", y=-0.12),
                      plot_bgcolor="white")
    return fig


def bars_figure(costs: dict[tuple, Costs], a: float, k: int):
    """Predicted speed-up of every (model, PP, batch) at acceptance rate ``a`` with ``k`` drafts, as bars
    (the line at 1 is break-even)."""
    import plotly.graph_objects as go

    names = [_key_title(key) for key in costs]
    vals = [c.speedup(a, k) for c in costs.values()]
    fig = go.Figure(go.Bar(x=names, y=vals, text=[f"{v:.2f}x" for v in vals], textposition="outside",
                           marker_color=["#2b8cbe" if v >= 1 else "#de2d26" for v in vals]))
    fig.add_hline(y=1.0, line_dash="dash")
    fig.update_layout(title=f"Predicted speed-up at a = {a:.2f}, k = {k} (E = {expected_tokens(a, k):.2f} tokens "
                            "per target forward)", yaxis=dict(range=[0, max(2.0, max(vals, default=1) * 1.15)],
                                                             title="speed-up"), height=380)
    return fig


def slider(costs: dict[tuple, Costs], a: float = 0.8, k: int = 2, k_max: int = 16):
    """:func:`bars_figure` at ``a`` and ``k`` as a plain output (what the HTML report shows), then sliders over
    acceptance rate and k (1..``k_max``, the range notebook 05 searches for the best k) that redraw it under them,
    live (the model is closed form, so a redraw is instant): :func:`kit.lab.notebook.interact_static`. Returns the
    box of sliders."""
    import ipywidgets as w

    from kit.lab.notebook import interact_static

    return interact_static(lambda a, k: bars_figure(costs, a, k),
                           note=f"Above: a = {a:.2f}, k = {k}. Move a slider to redraw the bars here.",
                           a=w.FloatSlider(value=a, min=0.0, max=1.0, step=0.01, description="acceptance a",
                                           continuous_update=True),
                           k=w.IntSlider(value=k, min=1, max=k_max, description="k"))


SPLIT_COLOURS = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d"]


def holdout_figure(result: list[dict], band: float):
    """Held-out predictions (:func:`kit.bench.holdout.evaluate`'s ``result``) against the measurements: one marker
    per held-out row, x the measured speed-up with its 95 % interval, y the prediction, a colour per split; the
    diagonal (exact) and the ``±band`` lines around it, and break-even (1.0x) on both axes."""
    import plotly.graph_objects as go

    fig = go.Figure()
    vals = [v for s in result for g in s["rows"] for v in (g["measured"], g["predicted"], *(g["interval"] or ()))]
    lo, hi = 0.9 * min(vals + [1.0]), 1.05 * max(vals + [1.0])
    xs = [lo, hi]
    fig.add_trace(go.Scatter(x=xs, y=xs, mode="lines", line=dict(color="black", width=1), name="predicted = measured",
                             hoverinfo="skip"))
    for f, dash in ((1 + band, "dash"), (1 - band, "dash")):
        fig.add_trace(go.Scatter(x=xs, y=[x * f for x in xs], mode="lines", line=dict(color="grey", width=1, dash=dash),
                                 name=f"±{band:.0%}", showlegend=f > 1, hoverinfo="skip"))
    for i, s in enumerate(result):
        rows = s["rows"]
        if not rows:
            continue
        fig.add_trace(go.Scatter(
            x=[g["measured"] for g in rows], y=[g["predicted"] for g in rows], mode="markers", name=s["name"],
            marker=dict(size=10, color=SPLIT_COLOURS[i % len(SPLIT_COLOURS)], line=dict(color="black", width=1)),
            error_x=dict(type="data", symmetric=False, thickness=1,
                         array=[(g["interval"][1] - g["measured"]) if g["interval"] else 0 for g in rows],
                         arrayminus=[(g["measured"] - g["interval"][0]) if g["interval"] else 0 for g in rows]),
            text=[f"{g['label']}: predicted {g['predicted']:.2f}x, measured {g['measured']:.2f}x "
                  f"({100 * g['error']:+.0f} %)" for g in rows], hovertemplate="%{text}<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#b2182b", width=1, dash="dot"))
    fig.add_vline(x=1.0, line=dict(color="#b2182b", width=1, dash="dot"))
    fig.update_xaxes(range=xs, title_text="measured speed-up over no speculation (95 % interval)")
    fig.update_yaxes(range=xs, title_text="held-out prediction", scaleanchor="x", scaleratio=1)
    fig.update_layout(title="Held out: predicted against measured speed-up (dotted: break-even)", height=620,
                      width=900, plot_bgcolor="white", legend=dict(x=1.02, y=1, xanchor="left"))
    return fig


STAGE_PARTS = (("busy", "computing", "#2166ac"), ("recv", "waiting for the previous stage", "#f4a582"),
               ("idle", "idle", "#e0e0e0"))


def stage_figure(summaries: dict[str, dict], title: str = "Where a decode step's time goes, per PP stage"):
    """Per traced run (``{label: kit.worker.steptrace.summary(...)}``) and stage: a stacked bar of one decode step's
    period, split into computing (forward, and sampling and drafting on the last stage), waiting for the previous
    stage's hidden states, and idle, in ms; each bar labelled with its busy share."""
    import plotly.graph_objects as go

    cats = [f"{label} · stage {s['rank']}" for label, t in summaries.items() for s in t.get("stages", [])]
    stages = [(t.get("period") or 0.0, s) for t in summaries.values() for s in t.get("stages", [])]
    fig = go.Figure()
    for key, name, colour in STAGE_PARTS:
        ms = [1e3 * s[key] for _, s in stages]
        text = [f"{s['busy'] / p:.0%} busy" if key == "busy" and p else "" for p, s in stages]
        fig.add_trace(go.Bar(y=cats, x=ms, orientation="h", name=name, marker_color=colour, text=text,
                             textposition="inside", insidetextanchor="start",
                             textfont=dict(color="white"),
                             hovertemplate="%{y}: " + name + " %{x:.2f} ms<extra></extra>"))
    fig.update_yaxes(categoryorder="array", categoryarray=cats, autorange="reversed")
    fig.update_xaxes(title_text="ms per decode step (mean)")
    fig.update_layout(title=title, barmode="stack", height=120 + 28 * len(cats), plot_bgcolor="white",
                      legend=dict(orientation="h", y=-0.08 - 2.0 / max(len(cats), 1), traceorder="normal"),
                      margin=dict(l=10))
    return fig
