"""Plotly figures the notebooks show. Each takes plain data (lists/dicts) and returns a figure."""
from __future__ import annotations

from kit.bench.payoff import expected_tokens


def placement_lanes(ranks: list[dict], num_layers: int, title: str = "What each PP rank holds"):
    """Ranks as horizontal lanes: decoder layers as boxes, plus embedding, LM head and drafter."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for r in ranks:
        y = f"PP rank {r['pp_rank']}"
        if r.get("node") is not None:  # a multi-node run: the node the worker runs on, as it reported itself
            y += f"<br>node {r['node']} ({r.get('host_ip')}, core {','.join(map(str, r.get('cpu_affinity') or []))})"
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


# Attention kinds as the layer grids draw them: one marker shape each, with its legend text.
KIND_SHAPES = {"sliding_attention": ("square", "sliding-window attention"), "full_attention": ("circle", "full attention")}
# The layer grids' colours: which layer a marker is.
NAME_ROLES = {"target layer": "#3182bd", "draft layer": "#e6550d", "draft layer, name taken on its rank": "#de2d26",
              "draft layer, name of a target layer on another rank": "#756bb1"}


def attention_kind(sliding_window) -> str:
    """``layer_types``' word for a built attention layer: ``sliding_attention`` when it has a window, else
    ``full_attention``."""
    return "sliding_attention" if sliding_window else "full_attention"


def eagle3_name_grid(by_count: dict[str, dict[int, list[dict]]], title: str = "Layer names per PP rank",
                     layer_types: list[str] | None = None, draft_layer_type: str | None = None,
                     panel_titles: list[str] | None = None):
    """Side by side, one panel per count ("total", "per_rank"): a row per (PP size, rank), a marker per
    attention layer name; target layers blue, the draft layer orange, a draft name that clashes with a
    target layer on its rank red, one that a target layer on another rank also has purple. ``by_count[count][pp]`` is
    :func:`kit.checks.placement.eagle3_layer_names` output. With ``layer_types`` (the target's, by layer index) and
    ``draft_layer_type`` (the draft layer's), each marker's shape is its attention kind (:data:`KIND_SHAPES`:
    sliding-window a square, full a circle). Two legends under the panels: colour (which layer), shape (kind)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    counts = list(by_count)
    panels = {}
    for count in counts:
        panels[count] = []
        for pp, ranks in by_count[count].items():
            for r in ranks:
                y = f"PP={pp} rank {r['pp_rank']}"
                for name in r["target"]:
                    idx = int(name.split(".")[2])
                    kind = layer_types[idx] if layer_types and idx < len(layer_types) else None
                    panels[count].append((y, name, idx, float(idx), "target layer", kind))
                if r["draft"]:
                    role = ("draft layer, name taken on its rank" if r["clash"] else
                            "draft layer, name of a target layer on another rank" if r.get("elsewhere") is not None
                            else "draft layer")
                    idx = int(r["draft"].split(".")[2])
                    panels[count].append((y, r["draft"], idx, idx + 0.3, role, draft_layer_type))
    max_x = max((b[3] for boxes in panels.values() for b in boxes), default=0.0)
    fig = make_subplots(rows=1, cols=len(counts), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=panel_titles or [f"draft numbered after the {c.replace('_', '-')} count"
                                                        for c in counts])
    for col, count in enumerate(counts, start=1):
        for y, name, idx, x, role, kind in panels[count]:
            symbol, kind_text = KIND_SHAPES.get(kind, ("square", None))
            fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers+text", text=[f"L{idx}"], textposition="middle center",
                                     legendgroup=role, showlegend=False, cliponaxis=False,
                                     marker=dict(size=30, color=NAME_ROLES[role], symbol=symbol,
                                                 line=dict(width=2 if "taken" in role else 0, color="black")),
                                     textfont=dict(color="white"),
                                     hovertext=f"{y}: {name} ({role}{', ' + kind_text if kind_text else ''})",
                                     hoverinfo="text"), row=1, col=col)
        fig.update_xaxes(title_text="layer index in the name: model.layers.i", dtick=1, range=[-0.5, max_x + 0.5],
                         row=1, col=col)
    # Legend-only entries: the colours (clicking one hides those markers) and, in grey, the shapes.
    used = {b[4] for boxes in panels.values() for b in boxes}
    for role, color in NAME_ROLES.items():
        if role in used:
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=role, legendgroup=role,
                                     marker=dict(size=14, color=color, symbol="square")))
    kinds = {b[5] for boxes in panels.values() for b in boxes}
    for kind, (symbol, kind_text) in KIND_SHAPES.items():
        if kind in kinds:
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=kind_text, legend="legend2",
                                     marker=dict(size=14, color="#737373", symbol=symbol)))
    fig.update_yaxes(autorange="reversed")
    rows = list(dict.fromkeys(b[0] for boxes in panels.values() for b in boxes))  # the y categories, in order
    for i in range(1, len(rows)):  # a thin line where one PP size's rows end and the next one's begin
        if rows[i].split()[0] != rows[i - 1].split()[0]:
            fig.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y", y0=i - 0.5, y1=i - 0.5,
                          line=dict(color="#969696", width=1), layer="below")
    plot_h = 44 * len(rows) + 20
    # Legends placed in pixels below the plot area (paper units scale with the figure's height).
    fig.update_layout(title=dict(text=title, x=0, xanchor="left"), height=plot_h + 80 + 135,
                      margin=dict(t=80, b=135, l=110, r=20),
                      legend=dict(orientation="h", x=0, xanchor="left", y=-60 / plot_h, yanchor="top",
                                  title_text="colour:"),
                      legend2=dict(orientation="h", x=0, xanchor="left", y=-100 / plot_h, yanchor="top",
                                   title_text="shape:"))
    return fig


def conditional_rates(per_position: list[int], num_drafts: int) -> list[float]:
    """Acceptance at draft position i given positions 1..i-1 were accepted (a draft is kept only after its
    whole prefix is): accepted[i] / accepted[i-1], and accepted[0] / rounds for position 1."""
    out, prev = [], num_drafts
    for n in per_position:
        out.append(n / prev if prev else 0.0)
        prev = n
    return out


def acceptance_panels(rates: dict[tuple[int, int], list[float]], ks: list[int], pps: list[int],
                      title: str = "Acceptance per draft position, one panel per k"):
    """``rates[(pp, k)]``: per-position values. One panel per k; the first PP size as bars, the others as
    markers on top (equal runs put each marker on its bar's top)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=len(ks), shared_yaxes=True, subplot_titles=[f"k={k}" for k in ks])
    colors = ["#9ecae1", "#e6550d", "#31a354", "#756bb1"]
    for col, k in enumerate(ks, start=1):
        for i, pp in enumerate(pps):
            y = rates[(pp, k)]
            x = [f"pos {j + 1}" for j in range(len(y))]
            kw = dict(name=f"PP={pp}", legendgroup=f"PP={pp}", showlegend=col == 1,
                      hovertemplate=f"PP={pp}, k={k}, %{{x}}: %{{y:.3f}}<extra></extra>")
            if i == 0:
                fig.add_trace(go.Bar(x=x, y=y, marker_color=colors[0], **kw), row=1, col=col)
            else:
                c = colors[1 + (i - 1) % (len(colors) - 1)]
                fig.add_trace(go.Scatter(x=x, y=y, mode="markers", marker=dict(size=26, symbol="line-ew-open", color=c,
                                         line=dict(width=4, color=c)), **kw), row=1, col=col)
    fig.update_yaxes(range=[0, 1.05])
    fig.update_layout(title=title, height=340, legend=dict(orientation="h", y=-0.2))
    return fig


def acceptance_length_vs_k(measured: dict[int, dict[int, float]], a: float, ks: list[int],
                           title: str = "Tokens per verify round vs k"):
    """``measured[pp][k]``: mean acceptance length. Drawn against (1 - a^(k+1)) / (1 - a) for one rate a."""
    import plotly.graph_objects as go

    kk = list(range(0, max(ks) + 1))
    fig = go.Figure(go.Scatter(x=kk, y=[expected_tokens(a, k) for k in kk], mode="lines",
                               name=f"(1 - a^(k+1)) / (1 - a), a = {a:.2f}", line=dict(dash="dash", color="#555")))
    for i, (pp, by_k) in enumerate(measured.items()):
        fig.add_trace(go.Scatter(x=list(by_k), y=list(by_k.values()), mode="markers+lines", name=f"measured, PP={pp}",
                                 marker=dict(size=12 - 4 * i)))
    fig.update_layout(title=title, xaxis_title="k (drafts per round)", yaxis_title="tokens per target forward",
                      height=360, xaxis=dict(dtick=1))
    return fig


def token_match_side_by_side(reference: list[list[int]], runs: dict[str, list[list[int]]],
                             title: str = "Tokens vs the reference: green same, red different"):
    """One heatmap per run (prompts x positions) against the same reference; hover names both tokens."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=len(runs), shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=list(runs))
    for col, (label, got) in enumerate(runs.items(), start=1):
        z, text = [], []
        for ref, g in zip(reference, got):
            z.append([1 if j < len(g) and g[j] == t else 0 for j, t in enumerate(ref)])
            text.append([f"reference {t}, got {g[j] if j < len(g) else None}" for j, t in enumerate(ref)])
        fig.add_trace(go.Heatmap(z=z, zmin=0, zmax=1, colorscale=[[0, "#de2d26"], [1, "#31a354"]], showscale=False,
                                 text=text, xgap=1, ygap=1,
                                 hovertemplate="prompt %{y}, position %{x}: %{text}<extra>" + label + "</extra>"),
                      row=1, col=col)
        fig.update_xaxes(title_text="generated position", row=1, col=col)
    fig.update_yaxes(autorange="reversed", dtick=1)
    fig.update_yaxes(title_text="prompt", row=1, col=1)
    fig.update_layout(title=title, height=200 + 45 * len(reference))
    return fig


def kv_layers_per_rank(layouts: dict[int, list[dict]], num_layers: int,
                       title: str = "KV cache per PP rank: which layers' KV each rank holds"):
    """``layouts[pp]``: :func:`kit.checks.placement.placement` output. One row per (PP size, rank), one box per KV
    cache layer the live worker allocated: target layers blue, a layer numbered past the target's (the MTP
    layer, named after all target layers) orange. Hover gives the rank's block count."""
    import plotly.graph_objects as go

    fig = go.Figure()
    seen = set()
    for pp, ranks in layouts.items():
        for r in ranks:
            y = f"PP={pp} rank {r['pp_rank']}" + (f" (node {r['node']})" if r.get("node") is not None else "")
            for name in r["kv_cache"].get("layers", []):
                idx = int(name.split(".")[2])
                kind = "MTP layer's KV" if idx >= num_layers else "target layer's KV"
                fig.add_trace(go.Scatter(x=[idx], y=[y], mode="markers+text", text=[f"L{idx}"], name=kind,
                                         legendgroup=kind, showlegend=kind not in seen, textfont=dict(color="white"),
                                         marker=dict(size=30, symbol="square",
                                                     color="#e6550d" if idx >= num_layers else "#3182bd"),
                                         hovertext=f"{y}: {name}, {r['kv_cache'].get('num_blocks')} blocks "
                                                   f"of {r['kv_cache'].get('block_size')} tokens", hoverinfo="text"))
                seen.add(kind)
    n_rows = sum(len(v) for v in layouts.values())
    fig.update_layout(title=title, height=140 + 38 * n_rows, xaxis=dict(title="layer index", dtick=1),
                      yaxis=dict(autorange="reversed"), legend=dict(orientation="h", y=-0.2))
    return fig


def sampled_vs_theory(points: dict[tuple[int, float], list[dict]], greedy_rate: float | None = None,
                      title: str = "Sampled acceptance: measured against the target's probabilities"):
    """``points[(pp, temperature)]``: :meth:`kit.checks.sampling.PositionTheory.to_dict` rows. One panel per draft
    position: acceptance rate against temperature, theory (the mean of p(draft) over the rounds that reached the
    position) as a line, measured as markers with +-2 sd bars, one colour per PP size; the greedy rate dotted."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    npos = max((len(v) for v in points.values()), default=1)
    pps = sorted({pp for pp, _ in points})
    fig = make_subplots(rows=1, cols=npos, shared_yaxes=True, subplot_titles=[f"draft position {i + 1}" for i in range(npos)])
    colors = ["#3182bd", "#e6550d", "#31a354", "#756bb1"]
    for i, pp in enumerate(pps):
        temps = sorted(t for p, t in points if p == pp)
        for pos in range(npos):
            rows = [points[(pp, t)][pos] if pos < len(points[(pp, t)]) else None for t in temps]
            ok = [(t, r) for t, r in zip(temps, rows) if r and r["reached"]]
            if not ok:
                continue
            x = [t for t, _ in ok]
            c = colors[i % len(colors)]
            fig.add_trace(go.Scatter(x=x, y=[r["predicted_rate"] for _, r in ok], mode="lines",
                                     line=dict(color=c, dash="dash" if i else "solid"), name=f"theory, PP={pp}",
                                     legendgroup=f"t{pp}", showlegend=pos == 0), row=1, col=pos + 1)
            fig.add_trace(go.Scatter(
                x=x, y=[r["measured_rate"] for _, r in ok], mode="markers", name=f"measured, PP={pp}",
                legendgroup=f"m{pp}", showlegend=pos == 0, marker=dict(size=12 - 3 * i, color=c),
                error_y=dict(type="data", array=[2 * r["sd"] / r["reached"] for _, r in ok], visible=True),
                customdata=[[r["reached"], r["accepted"], r["expected"], r["z"]] for _, r in ok],
                hovertemplate=("T=%{x}: measured %{y:.3f} (%{customdata[1]} of %{customdata[0]}), expected "
                               "%{customdata[2]}, z=%{customdata[3]}<extra>PP=" + str(pp) + "</extra>")),
                row=1, col=pos + 1)
    if greedy_rate is not None:
        fig.add_hline(y=greedy_rate, line=dict(dash="dot", color="#888"), annotation_text="greedy, position 1",
                      row=1, col=1)
    fig.update_xaxes(title_text="temperature")
    fig.update_yaxes(range=[0, 1.05])
    fig.update_layout(title=title, height=380, yaxis_title="accepted / reached", legend=dict(orientation="h", y=-0.25))
    return fig


REQ_COLORS = ["#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363", "#8c6d31"]


def step_swimlane(events: list[dict], pp: int, steps: list[int] | None = None,
                  title: str = "One decode step with drafts across the PP ranks"):
    """A lane per rank's forward, and the last rank's sample and MTP propose, over time (ms) for ``steps``.

    ``events``: :func:`kit.worker.steptrace.merge` output. A bar per step and rank, coloured by request, labelled
    ``s<step> <request>`` (hover: tokens and drafts it verifies); on a non-first rank the part spent waiting for
    the previous stage's hidden states is grey. Non-last ranks add ``h<N>`` where a request's token history was N
    tokens short (the accepted drafts the scheduler does not send them). An arrow joins a request's MTP propose to its next
    forward on rank 0 (from the engine core's collection of the drafts, ``handoff``, when traced): the drafts
    travel back through the scheduler before the next step can verify them.
    """
    import plotly.graph_objects as go

    sel = [e for e in events if steps is None or e["step"] in steps]
    if not sel:
        return go.Figure().update_layout(title=title + " (no events)")
    t_origin = min(e["t0"] for e in sel)
    ms = lambda t: (t - t_origin) * 1000.0  # noqa: E731
    last = pp - 1
    lanes = [f"rank {r} forward" for r in range(pp)] + [f"rank {last} sample", f"rank {last} MTP propose",
                                                         "drafts to the scheduler"]
    reqs = sorted({r for e in sel for r in (e.get("reqs") or [])}, key=lambda r: int(r[1:]))
    color = {r: REQ_COLORS[i % len(REQ_COLORS)] for i, r in enumerate(reqs)}
    fig = go.Figure()
    shown = set()

    def bar(lane, t0, t1, c, text, hover, legend=None):
        fig.add_trace(go.Bar(y=[lane], x=[max(ms(t1) - ms(t0), 0.05)], base=[ms(t0)], orientation="h",
                             marker=dict(color=c, line=dict(color="white", width=1)), text=[text],
                             textposition="inside", insidetextanchor="middle", textangle=0, hovertext=hover, hoverinfo="text",
                             name=legend or "", legendgroup=legend or text, showlegend=bool(legend) and legend not in shown))
        if legend:
            shown.add(legend)

    for e in sel:
        rq = e.get("reqs") or []
        names = list(rq)
        c = color[names[0]] if len(names) == 1 else "#969696"
        legend = f"request {names[0]}" if len(names) == 1 else "several requests"
        if e["kind"] == "forward":
            lane = f"rank {e['rank']} forward"
            t0 = e["t0"]
            if e.get("hidden_in") and e["hidden_in"] > e["t0"]:
                bar(lane, e["t0"], e["hidden_in"], "#d9d9d9", "", f"step {e['step']}: rank {e['rank']} waits for "
                    f"rank {e['rank'] - 1}'s hidden states ({ms(e['hidden_in']) - ms(e['t0']):.1f} ms)",
                    legend="waiting for the previous stage")
                t0 = e["hidden_in"]
            label = " ".join(rq)
            gap = {r: g for r, g in (e.get("history_gap") or {}).items() if g}
            hover = (f"step {e['step']} on rank {e['rank']}: " + ", ".join(f"{r}: {v[0]} tokens ({v[1]} drafts to verify)"
                                                                      for r, v in rq.items()))
            if gap:
                label += " h" + ",".join(str(g) for g in gap.values())
                hover += "; history short by " + ", ".join(f"{r}: {g}" for r, g in gap.items()) + \
                         " accepted tokens (filled by pp_spec_token_history)"
            bar(lane, t0, e["t1"], c, f"s{e['step']} {label}", hover, legend)
        elif e["kind"] == "sample":
            acc = e.get("accepted") or {}
            bar(f"rank {last} sample", e["t0"], e["t1"], color.get(next(iter(acc), ""), "#969696"),
                " ".join(f"{r}:{a} ok" for r, a in acc.items()),
                f"step {e['step']}: sampled; accepted drafts " + ", ".join(f"{r}: {a}" for r, a in acc.items()))
        elif e["kind"] == "propose":
            bar(f"rank {last} MTP propose", e["t0"], e["t1"], c, f"{' '.join(names)} {e.get('k') or ''} drafts",
                f"step {e['step']}: the MTP layer proposes {e.get('k')} drafts for {', '.join(names)}")
        elif e["kind"] == "handoff":
            bar("drafts to the scheduler", e["t0"], e["t1"], c, "take drafts",
                f"step {e['step']}: the engine core collects the drafts for {', '.join(names)} (post_step, "
                f"{ms(e['t1']) - ms(e['t0']):.1f} ms waiting for the step to finish)")
    # The drafts' way back: a request's propose, then its next forward on rank 0.
    fwd0 = [e for e in sel if e["kind"] == "forward" and e["rank"] == 0]
    back = "handoff" if any(e["kind"] == "handoff" for e in sel) else "propose"
    for p in (e for e in sel if e["kind"] == back):
        for r in p["reqs"]:
            nxt = next((f for f in fwd0 if f["step"] > p["step"] and r in f["reqs"]), None)
            if nxt is not None:
                fig.add_annotation(x=ms(nxt["t0"]), y=lanes[0], ax=ms(p["t1"]),
                                   ay=lanes[-1] if back == "handoff" else lanes[-2], xref="x", yref="y",
                                   axref="x", ayref="y", showarrow=True, arrowhead=3, arrowwidth=1.5,
                                   arrowcolor=color.get(r, "#636363"), opacity=0.8, text="")
    fig.update_layout(title=title, barmode="overlay", height=170 + 55 * len(lanes), xaxis_title="ms",
                      uniformtext=dict(minsize=9, mode="hide"),  # a label that does not fit is left to the hover
                      yaxis=dict(categoryorder="array", categoryarray=lanes, autorange="reversed"),
                      legend=dict(orientation="h", y=-0.25))
    return fig


_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1}


def state_bytes(group: dict) -> int:
    """Bytes of one state slot of a ``MambaSpec`` group (:func:`kit.checks.placement.placement`'s ``kv_cache.groups``):
    the conv window and the recurrent state of one layer for one request."""
    import math

    return sum(math.prod(s) * _DTYPE_BYTES.get(d, 4) for s, d in zip(group["state_shapes"], group["state_dtypes"]))


def hybrid_state_lanes(ranks: list[dict], calls: dict[int, dict] | None = None,
                       title: str = "A hybrid model under PP: what each rank keeps per request"):
    """Ranks as lanes, from the live workers' KV cache groups: each linear-attention (mamba-state) layer green with
    its state per request (slots x bytes), each full-attention layer's KV blue, the drafter orange (its forward calls
    and how many were given PP intermediates, from ``calls[pp_rank]``)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    seen = set()
    for r in sorted(ranks, key=lambda x: x["pp_rank"]):
        y = f"PP rank {r['pp_rank']}"
        items = []
        for g in r["kv_cache"]["groups"]:
            for name in g["layers"]:
                idx = name.split(".")
                if g["spec"] == "MambaSpec":
                    slots = 1 + int(g.get("num_speculative_blocks") or 0)
                    items.append(("linear attention: recurrent state", f"L{idx[2]} GDN<br>{slots} x "
                                  f"{state_bytes(g) / 1024:.0f} KiB", int(idx[2]), "#31a354",
                                  f"{name}: {slots} state slots per request (mode {g.get('mamba_cache_mode')}), "
                                  f"shapes {g['state_shapes']} {g['state_dtypes']}"))
                else:
                    mtp = idx[0] == "mtp"
                    items.append(("full attention: KV per token", ("MTP attn" if mtp else f"L{idx[2]} attn") + "<br>KV",
                                  None if mtp else int(idx[2]), "#3182bd",
                                  f"{name}: KV grows with the tokens, pages of {g['page_size_bytes']:,} bytes"))
        d = r.get("drafter") or {}
        if d.get("params"):
            c = (calls or {}).get(r["pp_rank"], {})
            items.append(("drafter", f"{d.get('model_class')}<br>{c.get('calls', '?')} calls, "
                          f"{c.get('with_intermediates', '?')} with PP input", None, "#e6550d",
                          f"{d.get('model_class')}: {d['params']:,} params"))
        xs = [it[2] for it in items if it[2] is not None]   # None: the drafter's parts, right of the target's layers
        right = (max(xs) if xs else 0) + 1.3
        for kind, label, x, color, hover in items:
            if x is None:
                x, right = right, right + 1.3
            fig.add_trace(go.Bar(x=[1.1], y=[y], base=[x - 0.55], orientation="h", marker_color=color, name=kind,
                                 legendgroup=kind, showlegend=kind not in seen, text=[label],
                                 textposition="inside", insidetextanchor="middle", hovertext=hover, hoverinfo="text"))
            seen.add(kind)
    fig.update_layout(title=title, barmode="overlay", height=170 + 80 * len(ranks),
                      xaxis=dict(title="decoder layer index (the drafter and its attention layer right of the target's)"),
                      yaxis=dict(autorange="reversed"), legend=dict(orientation="h", y=-0.25))
    return fig
