"""Notebook 06's picture of one verify step on the last rank: the rows of hidden states each request owns, and
the rows its logits were read from (:func:`kit.worker.steptrace.logits_rows`, read back by
:func:`kit.checks.inflight.rows_read`).

One lane per request: its own rows as a filled band in its colour (:data:`kit.lab.plots.REQ_COLORS`, the colours
the step swimlanes use), and a marker on every row its logits were read from, in the colour of the request that
owns that row; a read outside its own band is ringed in red and labelled. Takes plain data, returns a plotly figure.
"""
from __future__ import annotations

from kit.checks.inflight import row_owner
from kit.lab.plots import REQ_COLORS

WRONG = "#b2182b"


def rows_figure(rows: dict[str, dict], labels: dict[str, str] | None = None, title: str = ""):
    """``rows``: request -> ``{"own": [first, end), "read": [rows]}`` of one step (a sample event's ``rows``);
    ``labels``: request -> the lane's name (``r0 (prompt 0)``)."""
    import plotly.graph_objects as go

    labels = labels or {}
    reqs = list(rows)
    color = {r: REQ_COLORS[i % len(REQ_COLORS)] for i, r in enumerate(reqs)}
    n_rows = max(v["own"][1] for v in rows.values())

    fig = go.Figure()
    for lane, r in enumerate(reqs):
        a, b = rows[r]["own"]
        fig.add_shape(type="rect", x0=a - 0.45, x1=b - 0.55, y0=lane - 0.3, y1=lane + 0.3, line=dict(width=0),
                      fillcolor=color[r], opacity=0.25, layer="below")
        xs, cs, sym, text = [], [], [], []
        for j, row in enumerate(rows[r]["read"]):
            o = row_owner(rows, row)
            xs.append(row)
            cs.append(color.get(o, "#000000"))
            ok = o == r
            sym.append("circle" if ok else "circle-open-dot")
            text.append("" if ok else f"logit {j} from {o}'s row {row}")
        fig.add_trace(go.Scatter(
            x=xs, y=[lane + 0.12 * (j - (len(xs) - 1) / 2) for j in range(len(xs))], mode="markers+text",
            text=text, textposition="middle right", textfont=dict(size=12, color=WRONG),
            marker=dict(size=14, color=cs, symbol=sym, line=dict(width=[1 if t == "" else 3 for t in text],
                                                                  color=[c if t == "" else WRONG
                                                                         for c, t in zip(cs, text)])),
            name=labels.get(r, r), showlegend=False,
            hovertext=[f"{labels.get(r, r)}: logit {j} read from row {x} ({row_owner(rows, x)}'s)"
                       for j, x in enumerate(xs)],
            hoverinfo="text"))
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)), height=120 + 70 * len(reqs), margin=dict(l=10, r=10, t=60, b=40),
        plot_bgcolor="#ffffff",
        xaxis=dict(title="row of the step's hidden states (the tokens it was sent, request after request)",
                   tickmode="linear", dtick=1, range=[-0.7, n_rows + 1.5], showgrid=True, gridcolor="#eeeeee"),
        yaxis=dict(tickmode="array", tickvals=list(range(len(reqs))),
                   ticktext=[labels.get(r, r) + "'s logits" for r in reqs], range=[-0.6, len(reqs) - 0.4],
                   autorange="reversed"))
    return fig
