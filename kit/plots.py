"""Plotly figures the notebooks show. Each takes plain data (lists/dicts) and returns a figure."""
from __future__ import annotations


def placement_lanes(ranks: list[dict], num_layers: int, title: str = "What each PP rank holds"):
    """Ranks as horizontal lanes: decoder layers as boxes, plus embedding, LM head and drafter."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for r in ranks:
        y = f"PP rank {r['pp_rank']}"
        items = []
        if r["embedding"]:
            items.append(("embed", -1.4, 0.8, "#9ecae1"))
        for i in r["layers"]:
            items.append((f"L{i}", i, 0.9, "#3182bd"))
        if r["lm_head"]:
            items.append(("lm_head", num_layers + 0.4, 0.8, "#9ecae1"))
        d = r.get("drafter")
        if d and d.get("params"):
            items.append((f"drafter ({d.get('model_class') or d['class']})", num_layers + 1.8, 1.2, "#e6550d"))
        for label, x, w, color in items:
            fig.add_trace(go.Bar(x=[w], y=[y], base=[x - w / 2], orientation="h", marker_color=color,
                                 text=[label], textposition="inside", showlegend=False,
                                 hovertext=f"{label} on {y}: {r['params']:,} params on this rank, "
                                           f"{r['kv_cache'].get('num_blocks')} KV blocks"))
    fig.update_layout(title=title, barmode="overlay", height=140 + 70 * len(ranks),
                      xaxis_title="decoder layer index (embedding left, LM head and drafter right)",
                      yaxis=dict(autorange="reversed"))
    return fig


def acceptance_bars(rows: list[dict], title: str = "Acceptance per draft position"):
    """rows: {"label": str, "per_position_rate": [floats]} -> grouped bars by position."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for r in rows:
        rates = r["per_position_rate"]
        fig.add_trace(go.Bar(name=r["label"], x=[f"pos {i + 1}" for i in range(len(rates))], y=rates))
    fig.update_layout(title=title, barmode="group", yaxis_title="accepted / drafts", yaxis_range=[0, 1])
    return fig


def token_match(reference: list[list[int]], got: list[list[int]], title: str = "Tokens vs the reference"):
    """A heatmap: prompts x positions, 1 where the token equals the reference's."""
    import plotly.graph_objects as go

    z = [[1 if j < len(g) and g[j] == t else 0 for j, t in enumerate(ref)] for ref, g in zip(reference, got)]
    fig = go.Figure(go.Heatmap(z=z, zmin=0, zmax=1, colorscale=[[0, "#de2d26"], [1, "#31a354"]], showscale=False,
                               hovertemplate="prompt %{y}, position %{x}: %{z}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="generated position", yaxis_title="prompt", height=320)
    return fig
