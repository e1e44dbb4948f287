"""Notebook 04's figures: what a PD pair's producer ranks wrote into the consumer, and when, in one colour set.

Colours: each producer PP rank has one qualitative colour (:data:`RANK_COLORS`, Okabe-Ito's blue, orange, bluish
green and reddish purple), used for every mark that stands for a rank. Nothing else in notebook 04 takes those
colours: the servers and the plain engine are grey, dark red and near black (:data:`PRODUCER`, :data:`CONSUMER`,
:data:`ENGINE`), and "nothing was written here" is a hatched, white fill (:data:`NOT_WRITTEN`). Every figure takes
plain data (dicts and lists from :func:`kit.pd.pd_compare`) and returns a plotly figure.
"""
from __future__ import annotations

from typing import Callable

RANK_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7")
PRODUCER = "#7f7f7f"            # the producer server as a whole (all its ranks)
CONSUMER = "#b2182b"            # the consumer server
CONSUMER_DECODE = "#f4a582"     # the consumer after its first token
ENGINE = "#252525"              # one plain (colocated) engine
HATCH = "#969696"
NOT_WRITTEN = dict(color="#ffffff", line=dict(color=HATCH, width=1), pattern=dict(shape="/", fgcolor=HATCH, size=8))


def rank_color(rank: int) -> str:
    """The colour of producer PP rank ``rank`` (the set repeats past four ranks)."""
    return RANK_COLORS[rank % len(RANK_COLORS)]


def ink(color: str) -> str:
    """Black or white, whichever reads better on ``color`` (``#rrggbb``)."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#ffffff"


def hatched(color: str) -> dict:
    """A bar marker for a run in which something was withheld: white, hatched and outlined in ``color``."""
    return dict(color="#ffffff", line=dict(color=color, width=1.5), pattern=dict(shape="/", fgcolor=color, size=8))


def layer_index(name: str) -> int:
    """``model.layers.7`` -> 7."""
    return int(name.split(".")[2])


def layer_owners(layers: list[str], num_target_layers: int, pp: int,
                 split: Callable[[int, int, int], tuple[int, int]]) -> dict[str, int]:
    """The producer PP rank that holds each KV layer. ``split(num_target_layers, rank, pp)`` gives a rank's target
    layers as ``(start, end)`` (vLLM's ``get_pp_indices``, what its workers use); a layer numbered past the target's
    (the MTP layer, which vLLM names after all target layers) sits with the drafter on the last rank."""
    bounds = [split(num_target_layers, r, pp) for r in range(pp)]
    out = {}
    for name in layers:
        i = layer_index(name)
        out[name] = pp - 1 if i >= num_target_layers else next(r for r, (lo, hi) in enumerate(bounds) if lo <= i < hi)
    return out


def producer_blocks(kv_params: dict | None) -> list:
    """The producer's block ids of a request from the ``kv_transfer_params`` it returned (first KV cache group);
    ``[]`` when it returned none."""
    ids = list((kv_params or {}).get("remote_block_ids") or [])
    if ids and isinstance(ids[0], (list, tuple)):
        ids = list(ids[0])
    return ids


def block_layout(run: dict, consumer_layers: list[str], owners: dict[str, int], mtp: str | None = None) -> dict:
    """What the consumer received, block by block, from a :func:`kit.pd.pd_compare` result.

    Rows: the consumer's KV layers (``consumer_layers``, one NIXL region each on the CPU build). Columns: every
    answered request's prompt blocks in order (``kv_expected["blocks"]``, the whole blocks the connector moves),
    each with the producer's block id from the ``kv_transfer_params`` the producer returned (``None`` where it
    named none; the consumer's own block ids are not reported). A row's writer is the producer rank that holds the
    layer (``owners``) if the layer moved (``kv_expected["layers"]``), else ``None``: nobody wrote that region.
    """
    e = run["kv_expected"]
    bs = e["block_size"]
    ok = [r for r in run["requests"] if not r["error"]]
    columns = []
    for r, n_blocks in zip(ok, e["blocks"]):
        ids = producer_blocks(r.get("kv_transfer_params"))
        for j in range(n_blocks):
            columns.append({"request": r["index"], "block": j, "producer_block": ids[j] if j < len(ids) else None,
                            "first_token": j * bs, "last_token": min((j + 1) * bs, r["prompt_tokens"]) - 1})
    moved = set(e["layers"])
    writer = {n: owners[n] if n in moved else None for n in consumer_layers}
    ranks = sorted({w for w in writer.values() if w is not None})
    rank_layers = {k: [n for n in consumer_layers if writer[n] == k] for k in ranks}
    per_cell = e["bytes_per_layer_block"]
    rank_bytes = {k: len(v) * len(columns) * per_cell for k, v in rank_layers.items()}
    return {"layers": list(consumer_layers), "columns": columns, "writer": writer, "rank_layers": rank_layers,
            "rank_bytes": rank_bytes, "unwritten": [n for n in consumer_layers if writer[n] is None],
            "bytes_per_cell": per_cell, "block_size": bs, "total_bytes": sum(rank_bytes.values()), "mtp": mtp}


def short(name: str, mtp: str | None = None) -> str:
    """``model.layers.4`` -> ``layers.4``, with `` (MTP)`` for the MTP layer."""
    return name.replace("model.", "") + (" (MTP)" if name == mtp else "")


def kv_block_layout(panels: dict[str, dict], title: str = "The consumer's KV blocks, by the producer rank that wrote them"):
    """One panel per :func:`block_layout` (side by side, the same rows): a cell per consumer KV layer (row) and prompt
    block (column), filled in the colour of the producer rank that wrote it, or hatched white where nothing was
    written. The legend has one entry per rank and one for "not written" (only if some cell is)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    labels = list(panels)
    fig = make_subplots(rows=1, cols=len(labels), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=labels)
    shown = set()
    n_rows = max(len(p["layers"]) for p in panels.values())
    for col, label in enumerate(labels, start=1):
        p = panels[label]
        cells: dict = {}
        for y, name in enumerate(p["layers"]):
            for x, c in enumerate(p["columns"]):
                cells.setdefault(p["writer"][name], []).append((x, y, name, c))
        for w in sorted((k for k in cells if k is not None)) + ([None] if None in cells else []):
            group = cells[w]
            legend = f"written by producer rank {w}" if w is not None else "not written (no rank sent this layer)"
            hover = []
            for x, y, name, c in group:
                where = (f"{short(name, p['mtp'])}, request {c['request']}'s prompt block {c['block']} "
                         f"(tokens {c['first_token']}-{c['last_token']})")
                src = (f"from its block {c['producer_block']}" if c["producer_block"] is not None
                       else "(its block id not reported)")
                hover.append(f"{label}<br>{where}<br>" + (f"written by producer rank {w} {src}: {p['bytes_per_cell']:,} B"
                                                          if w is not None else "nothing written: no producer rank holds this layer"))
            fig.add_trace(go.Bar(x=[g[0] for g in group], y=[0.9] * len(group), base=[g[1] - 0.45 for g in group],
                                 width=0.9, marker=dict(color=rank_color(w), line=dict(color="#ffffff", width=1))
                                 if w is not None else NOT_WRITTEN,
                                 text=[f"rank {w}" if w is not None else "not written"] * len(group),
                                 textposition="inside", insidetextanchor="middle", textangle=0,
                                 textfont=dict(color=ink(rank_color(w)) if w is not None else "#525252"),
                                 name=legend, legendgroup=legend, showlegend=legend not in shown,
                                 hovertext=hover, hoverinfo="text"), row=1, col=col)
            shown.add(legend)
        cols = p["columns"]
        fig.update_xaxes(tickvals=list(range(len(cols))),
                         ticktext=[f"request {c['request']}, block {c['block']}<br>"
                                   + (f"(producer block {c['producer_block']})" if c["producer_block"] is not None else "")
                                   for c in cols],
                         range=[-0.6, len(cols) - 0.4], title_text="prompt blocks, request by request", row=1, col=col)
    first = next(iter(panels.values()))
    fig.update_yaxes(tickvals=list(range(len(first["layers"]))), ticktext=[short(n, first["mtp"]) for n in first["layers"]],
                     range=[len(first["layers"]) - 0.4, -0.6])  # top to bottom: layer 0 first, the MTP layer last
    fig.update_yaxes(title_text="consumer KV layer (one region each)", row=1, col=1)
    fig.update_layout(title=title, barmode="overlay", height=230 + 52 * n_rows, bargap=0,
                      uniformtext=dict(minsize=9, mode="hide"), legend=dict(orientation="h", y=-0.3),
                      plot_bgcolor="#ffffff")
    return fig


PHASE_COLORS = {"producer prefill": PRODUCER, "consumer: KV in + first token": CONSUMER,
                "consumer decode": CONSUMER_DECODE, "consumer: KV in + decode": CONSUMER}


def timeline_steps(r: dict) -> list[tuple[str, float, float]]:
    """One request's ``(phase, start s, duration s)`` from its router timings (``pd_compare``'s
    ``timings["per_request"]``): the producer's prefill, then the consumer's call, split at its first token where
    that time was measured (the client's clock when streaming, else the server's per-request metric)."""
    pre, cons = r["producer_prefill_s"], r["consumer_s"]
    ttft = r["consumer_ttft_s"] or ((r["consumer_ttft_server_ms"] or 0) / 1000) or None
    return [("producer prefill", 0.0, pre)] + (
        [("consumer: KV in + first token", pre, ttft), ("consumer decode", pre + ttft, cons - ttft)] if ttft
        else [("consumer: KV in + decode", pre, cons)])


def request_timeline(per_request: list[dict], title: str = "Each request's timeline (s, measured by the router)"):
    """A lane per request, its phases (:func:`timeline_steps`) as bars: the producer grey, the consumer dark red
    up to its first token and light red after it."""
    import plotly.graph_objects as go

    fig = go.Figure()
    shown = set()
    for r in per_request:
        for name, start, dur in timeline_steps(r):
            fig.add_trace(go.Bar(y=[f"request {r['index']}"], x=[dur], base=[start], orientation="h", name=name,
                                 marker_color=PHASE_COLORS[name], legendgroup=name, showlegend=name not in shown,
                                 hovertemplate=f"{name}: %{{x:.3f}} s<extra></extra>"))
            shown.add(name)
    fig.update_layout(title=title, barmode="overlay", height=230 + 40 * len(per_request), xaxis_title="s",
                      yaxis=dict(autorange="reversed"), legend=dict(orientation="h", y=-0.3, yanchor="top"))
    return fig


def draft_counts(runs: dict[str, dict], markers: list[dict], title: str):
    """Grouped bars: accepted drafts per draft position and verify rounds, one bar group per run (``runs[label]``:
    spec-decode counters with ``per_position`` and ``num_drafts``), the i-th run drawn with ``markers[i]``."""
    import plotly.graph_objects as go

    k = max(len(c["per_position"]) for c in runs.values())
    fig = go.Figure()
    for (name, c), marker in zip(runs.items(), markers):
        y = list(c["per_position"]) + [0] * (k - len(c["per_position"])) + [c["num_drafts"]]
        fig.add_trace(go.Bar(x=[f"draft position {i + 1}" for i in range(k)] + ["verify rounds"], y=y, name=name,
                             marker=marker, text=y, textposition="outside"))
    fig.update_layout(barmode="group", height=380, yaxis_title="count", title=title)
    return fig
