"""Figures and the slider of notebook 05 (does speculation pay?): the predicted speed-up over acceptance rate and
k for each (model, PP) with the measured points and the break-even line, and a slider that redraws the prediction.

Plotly figures built from :class:`kit.bench.payoff.Costs`; nothing here measures.
"""
from __future__ import annotations

from kit.bench.payoff import Costs, expected_tokens

A_GRID = [i / 100 for i in range(0, 101)]


def _key_title(key: tuple) -> str:
    model, pp, batch = key
    return f"{model}, PP={pp}, batch {batch}"


def surface_figure(costs: dict[tuple, Costs], points: list[dict] | None = None, ks: tuple[int, ...] = (1, 2, 3, 4, 5),
                   title: str = "Predicted decode speed-up over no speculation"):
    """One heatmap per (model, PP, batch) in ``costs``: predicted speed-up over the per-position acceptance rate
    (x) and k (y); the break-even line (speed-up 1) in black; the measured rows of ``points`` (dicts from
    :func:`kit.bench.payoff.predict`) as markers labelled measured / predicted."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    keys = list(costs)
    models = list(dict.fromkeys(k[0] for k in keys))
    cols = list(dict.fromkeys((k[1], k[2]) for k in keys))
    fig = make_subplots(rows=len(models), cols=len(cols), shared_xaxes=True, shared_yaxes=True,
                        subplot_titles=[_key_title((m, pp, b)) for m in models for pp, b in cols],
                        horizontal_spacing=0.06, vertical_spacing=0.12)
    points = points or []
    for i, m in enumerate(models, 1):
        for j, (pp, b) in enumerate(cols, 1):
            c = costs.get((m, pp, b))
            if c is None:
                continue
            z = [[c.speedup(a, k) for a in A_GRID] for k in ks]
            fig.add_trace(go.Heatmap(x=A_GRID, y=list(ks), z=z, zmin=0, zmax=2.5, zmid=1.0, colorscale="RdBu",
                                     colorbar=dict(title="speed-up"), showscale=(i, j) == (1, 1),
                                     hovertemplate="a=%{x:.2f}, k=%{y}: %{z:.2f}x<extra></extra>"), row=i, col=j)
            be = [(c.break_even(k), k) for k in ks]
            fig.add_trace(go.Scatter(x=[a if a is not None else 1.0 for a, _ in be], y=[k for _, k in be],
                                     mode="lines+markers", line=dict(color="black", width=2),
                                     name="break-even", showlegend=(i, j) == (1, 1),
                                     hovertemplate="k=%{y}: loses below a=%{x:.2f}<extra></extra>"), row=i, col=j)
            pts = [p for p in points if (p["model"], p["pp"], p["batch"]) == (m, pp, b)]
            if pts:
                fig.add_trace(go.Scatter(
                    x=[p["acceptance"] for p in pts], y=[p["k"] for p in pts], mode="markers+text",
                    marker=dict(size=11, color="gold", line=dict(color="black", width=1)),
                    text=[f"{p['measured']:.2f}x / {p['predicted']:.2f}x" for p in pts], textposition="middle left",
                    name="measured / predicted", showlegend=(i, j) == (1, 1),
                    hovertemplate="measured at a=%{x:.3f}, k=%{y}: %{text}<extra></extra>"), row=i, col=j)
    fig.update_xaxes(title_text="per-position acceptance rate a", range=[0, 1], row=len(models))
    fig.update_yaxes(title_text="k (draft tokens)", col=1)
    fig.update_layout(title=title, height=330 * len(models) + 80, legend=dict(orientation="h", y=-0.12))
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


def slider(costs: dict[tuple, Costs], a: float = 0.8, k: int = 2):
    """An ipywidgets box: sliders over acceptance rate and k redraw :func:`bars_figure` (the model is closed form,
    so a redraw is instant). Returns ``(box, redraw)``; ``redraw(a, k)`` returns the figure it drew."""
    import ipywidgets as w
    from IPython.display import display

    sa = w.FloatSlider(value=a, min=0.0, max=1.0, step=0.01, description="acceptance a", continuous_update=True)
    sk = w.IntSlider(value=k, min=1, max=8, description="k")
    out = w.Output()

    def redraw(a: float, k: int):
        fig = bars_figure(costs, a, k)
        out.clear_output(wait=True)
        with out:
            display(fig)
        return fig

    w.interactive_output(redraw, {"a": sa, "k": sk})
    return w.VBox([w.HBox([sa, sk]), out]), redraw
