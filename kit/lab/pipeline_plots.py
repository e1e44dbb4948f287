"""The PP pipeline over time, from live step traces: which stage computes which micro-batch when.

Input is :func:`kit.worker.steptrace.merge` output (every rank's events of one engine run). One panel per run, the
same time span for each, so that runs with and without micro-batches in flight compare at a glance; animated
(plotly frames, Play/Pause and a time slider) so that the steps enter and leave the stages as time runs, while the
figure as drawn without interaction (a static HTML report, a thumbnail) is the whole span.
"""
from __future__ import annotations

from kit.lab.plots import REQ_COLORS
from kit.worker import steptrace


def decode_window(events: list[dict], span_ms: float) -> tuple[float, float] | None:
    """``(t0, t1)`` in trace seconds: ``span_ms`` of decode steps starting at the first decode step past a third
    of the run's decode steps (away from the prefills at the start and the stragglers at the end)."""
    by = steptrace.steps(events)
    dec = steptrace.decode_steps(events)
    if not dec:
        return None
    t0 = min(f["t0"] for f in by[dec[len(dec) // 3]]["forward"].values())
    return t0, t0 + span_ms / 1000.0


def decode_left_ms(events: list[dict]) -> float | None:
    """ms from the start of :func:`decode_window` to the end of the run's last traced work: the longest span a
    panel of :func:`pipeline_lanes` can fill (None without decode steps)."""
    win = decode_window(events, 0.0)
    if win is None:
        return None
    return 1000.0 * (max(e["t1"] for e in events) - win[0])


def busy_share(events: list[dict], rank: int, window: tuple[float, float]) -> float:
    """The share of ``window`` in which ``rank`` computed: its forwards minus the wait for the previous stage's
    hidden states, and on the last rank its sampling and drafting (a union of intervals, overlaps counted once)."""
    lo, hi = window
    spans = []
    for e in events:
        if e["rank"] != rank or e["kind"] not in ("forward", "sample", "propose"):
            continue
        a = (e.get("hidden_in") or e["t0"]) if e["kind"] == "forward" else e["t0"]
        a, b = max(a, lo), min(e["t1"], hi)
        if b > a:
            spans.append((a, b))
    total, end = 0.0, lo
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total / (hi - lo) if hi > lo else 0.0


def lane_bars(events: list[dict], pp: int, window: tuple[float, float], label: str = "") -> list[dict]:
    """The bars of one panel of :func:`pipeline_lanes`, in ms from ``window``'s start, ordered by start.

    Each is a dict: ``kind`` (``compute``: a step's work on a stage, the last stage's sampling and drafting
    included; ``wait``: a non-first stage waiting inside its forward for the previous stage's hidden states;
    ``empty``: a step that carried no request), ``rank``, ``step``, ``x0``/``x1`` (ms), ``key`` (the step's
    requests, ``"r0 r1"``; ``""`` for an empty step), ``text`` (the label drawn inside the bar where it fits) and
    ``hover``. Only bars that reach into the window.

    The trace records nothing for an empty step (no request, so no forward, sample or drafts): each rank ran it
    somewhere between its forwards of the computed steps before and after, so it is drawn over that gap (split
    evenly between empty steps in a row), and its hover says so.
    """
    lo, hi = window
    span = (hi - lo) * 1000.0
    ms = lambda t: (t - lo) * 1000.0  # noqa: E731
    by = steptrace.steps(events)
    bars: list[dict] = []

    def end_of(step: int, rank: int) -> float:
        v = by[step]
        end = v["forward"][rank]["t1"]
        if rank == pp - 1:  # the last stage's work on a step ends after its sample and drafts
            end = max([end] + [e["t1"] for e in (v["sample"], v["propose"]) if e])
        return end

    def add(**bar) -> None:
        if bar["x1"] > 0 and bar["x0"] < span:
            bars.append(bar)

    for step, v in sorted(by.items()):
        for rank, f in sorted(v["forward"].items()):
            reqs = sorted(f.get("reqs") or [], key=lambda r: (len(r), r))  # r2 before r10
            key = " ".join(reqs)
            start, end = f["t0"], end_of(step, rank)
            if f.get("hidden_in") and f["hidden_in"] > f["t0"]:
                start = f["hidden_in"]
                add(kind="wait", rank=rank, step=step, x0=ms(f["t0"]), x1=ms(start), key=key, text="wait",
                    hover=f"{label}<br>step {step} on rank {rank}: waits {ms(start) - ms(f['t0']):.1f} ms for "
                          f"rank {rank - 1}'s hidden states")
            what = " (forward, sample and drafts)" if rank == pp - 1 else ""
            add(kind="compute", rank=rank, step=step, x0=ms(start), x1=ms(end), key=key, text=f"s{step}",
                hover=f"{label}<br>step {step} on rank {rank}{what}: requests {key or '-'}<br>"
                      f"{ms(start):.1f} to {ms(end):.1f} ms ({ms(end) - ms(start):.1f} ms)")
    computed = sorted(s for s, v in by.items() if v["forward"])
    for prev, nxt in zip(computed, computed[1:]):
        empties = list(range(prev + 1, nxt))
        for rank in range(pp):
            if not empties or rank not in by[prev]["forward"] or rank not in by[nxt]["forward"]:
                continue
            a, b = ms(end_of(prev, rank)), ms(by[nxt]["forward"][rank]["t0"])
            width = max((b - a) / len(empties), 0.004 * span)   # a gap too short to see still shows each step
            for i, step in enumerate(empties):
                add(kind="empty", rank=rank, step=step, x0=a + i * width, x1=a + (i + 1) * width, key="",
                    text=f"s{step}",
                    hover=f"{label}<br>step {step} on rank {rank}: empty, no request (every running request was in "
                          f"flight)<br>no trace event: drawn in rank {rank}'s gap between s{prev} and s{nxt}")
    return sorted(bars, key=lambda b: (b["x0"], b["rank"]))


WAIT_COLOR = "#d9d9d9"
NOW_COLOR = "#d62728"


PLOT_PX = 900     # the plot area's width at report width (1000 px) less the margins
LABEL_FONT = 12


def _fits(text: str, width_ms: float, span: float) -> bool:
    """Whether ``text`` fits a bar ``width_ms`` wide at :data:`LABEL_FONT` px on a :data:`PLOT_PX` plot of ``span``
    ms (characters taken as 0.6 of the font size wide, plus a little padding)."""
    return width_ms / span * PLOT_PX >= 0.6 * LABEL_FONT * len(text) + 4


def _group_traces(groups: list[dict], t: float, span: float, full: bool = False) -> list[dict]:
    """Per trace group (one panel's bars of one kind and colour), the bars as they stand at ``t`` ms: those started
    by then cut at ``t`` (and at the panel's left edge, so that each label sits in the visible part), the rest
    parked unlabelled and of zero width left of the panel, outside the axis range. Every frame holds every bar: in
    plotly.js a bar that enters an animation is drawn unstyled (black), and one of zero width still shows its
    outline. A bar is labelled only where its label fits (:func:`_fits`): plotly.js's ``uniformtext`` hides the
    rest in a static drawing but not always while it animates. ``full`` adds what stays the same (lane, hover)
    for the figure itself."""
    out = []
    for g in groups:
        bars = g["bars"]
        on = [b["x0"] < t for b in bars]
        x0 = [max(b["x0"], 0.0) if o else -span for b, o in zip(bars, on)]
        x = [max(min(b["x1"], t) - a, 0.0) if o else 0.0 for b, a, o in zip(bars, x0, on)]
        d = dict(type="bar", x=x, base=x0, text=[b["text"] if o and _fits(b["text"], w, span) else ""
                                                 for b, w, o in zip(bars, x, on)])
        if full:
            d.update(y=[f"rank {b['rank']}" for b in bars], hovertext=[b["hover"] for b in bars])
        out.append(d)
    return out


def _now_lines(n_panels: int, t: float) -> list[dict]:
    """The moving "now" line, one per panel."""
    return [dict(type="line", xref=f"x{'' if i == 0 else i + 1}", yref=f"y{'' if i == 0 else i + 1} domain",
                 x0=t, x1=t, y0=0, y1=1, line=dict(color=NOW_COLOR, width=2, dash="dot"))
            for i in range(n_panels)]


def pipeline_lanes(runs: dict[str, list[dict]], pp: int, span_ms: float = 120.0,
                   title: str = "The PP pipeline over time", frames: int = 40):
    """One panel per run (``runs[label]`` = merged events): a lane per stage, a bar per step's work on that stage
    (:func:`lane_bars`), coloured by the requests it carries (a micro-batch, the same colour in every panel) and
    labelled ``s<step>`` where the label fits (the hover always says it); grey where a stage waits for the previous
    stage's hidden states; an outlined bar for an empty step. The last stage's bar includes its sampling and
    drafting. Each panel's title gives its share of decode steps that started on rank 0 while the previous step
    still ran on the last rank (two micro-batches in flight) and each stage's busy share of the span drawn.

    Animated: ``frames`` frames, evenly over the span, each showing the bars up to its time and a dotted "now" line
    in every panel; a Play/Pause button and a slider step through them. The figure itself (what a static
    rendering shows) is the last frame: the whole span.
    """
    import math

    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels, colors = [], {}
    for label, events in runs.items():
        win = decode_window(events, span_ms)
        s = steptrace.summary(events)
        steps_n, ov = s.get("decode_steps", 0), (s.get("in_flight") or {}).get("overlap_steps", 0)
        busy = [busy_share(events, r, win) for r in range(pp)] if win else [0.0] * pp
        head = (f"{label}: {ov} of {steps_n} decode steps with 2 in flight; busy "
                + ", ".join(f"rank {r} {100 * b:.0f} %" for r, b in enumerate(busy)))
        bars = lane_bars(events, pp, win, label) if win else []
        for b in bars:
            if b["kind"] == "compute":
                colors.setdefault(b["key"], REQ_COLORS[len(colors) % len(REQ_COLORS)])
        panels.append((head, bars))

    # Pixel layout: title, then per panel its title and lanes, then the x axis, the legend and the time slider.
    n = len(panels)
    lane_px, gap_px, top_px = 44, 62, 96
    panel_px = 30 + lane_px * pp
    empties = any(b["kind"] == "empty" for _, bs in panels for b in bs)
    legend_names = ([f"requests {k}" for k in colors] + ["waiting for the previous stage"]
                    + (["empty step (no request)"] if empties else []))
    legend_rows = max(1, math.ceil(sum(46 + 7.5 * len(t) for t in legend_names) / 880))
    axis_px, legend_px, slider_px = 48, 26 * legend_rows, 92
    plot_px = n * panel_px + (n - 1) * gap_px
    height = top_px + plot_px + axis_px + legend_px + slider_px
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, vertical_spacing=gap_px / plot_px if n > 1 else 0.0,
                        subplot_titles=[p[0] for p in panels])
    lanes = [f"rank {r}" for r in range(pp)]

    groups: list[dict] = []   # one bar trace per panel and kind of bar (a colour per set of requests)
    shown: set[str] = set()
    for row, (_, bars) in enumerate(panels, start=1):
        kinds = [(f"requests {k}", "compute", k, dict(color=c, line=dict(color="white", width=1)),
                  dict(size=LABEL_FONT, color="white")) for k, c in colors.items()]
        kinds.append(("waiting for the previous stage", "wait", None,
                      dict(color=WAIT_COLOR, line=dict(color="white", width=1)), dict(size=LABEL_FONT, color="#444")))
        kinds.append(("empty step (no request)", "empty", None,
                      dict(color="rgba(255,255,255,0)", line=dict(color="#555", width=1.5)),
                      dict(size=LABEL_FONT, color="#333")))
        for order, (name, kind, key, marker, font) in enumerate(kinds):
            mine = [b for b in bars if b["kind"] == kind and (key is None or b["key"] == key)]
            if not mine:
                continue
            groups.append(dict(bars=mine))
            fig.add_trace(go.Bar(name=name, legendgroup=name, showlegend=name not in shown, orientation="h",
                                 legendrank=1000 + order,
                                 marker=marker, textposition="inside", insidetextanchor="middle", textangle=0,
                                 textfont=font, hoverinfo="text", cliponaxis=True), row=row, col=1)
            shown.add(name)
        fig.update_yaxes(categoryorder="array", categoryarray=lanes, autorange="reversed", row=row, col=1)

    frames = max(1, int(frames))
    times = [span_ms * (i + 1) / frames for i in range(frames)]
    # The figure itself is the last frame: the whole span.
    for trace, data in zip(fig.data, _group_traces(groups, span_ms, span_ms, full=True)):
        trace.update({k: v for k, v in data.items() if k != "type"})
    fig.frames = [go.Frame(name=str(i), data=_group_traces(groups, t, span_ms), traces=list(range(len(groups))),
                           layout=dict(shapes=_now_lines(n, t))) for i, t in enumerate(times)]
    fig.update_layout(shapes=_now_lines(n, span_ms))

    digits = max(0, 1 - math.floor(math.log10(span_ms / frames))) if span_ms > 0 else 0   # slider labels, in ms
    below = lambda px: -px / plot_px  # noqa: E731  (paper y of a point px pixels under the plot area)
    play = dict(frame=dict(duration=200, redraw=True), transition=dict(duration=0), fromcurrent=True, mode="immediate")
    pause = dict(frame=dict(duration=0, redraw=False), transition=dict(duration=0), mode="immediate")
    fig.update_layout(
        updatemenus=[dict(type="buttons", direction="left", showactive=False, x=0.0, xanchor="left",
                          y=below(axis_px + legend_px + 22), yanchor="top", pad=dict(t=0, r=10),
                          font=dict(size=12),
                          buttons=[dict(label="Play", method="animate", args=[None, play]),
                                   dict(label="Pause", method="animate", args=[[None], pause])])],
        sliders=[dict(active=frames - 1, x=0.14, len=0.86, xanchor="left", y=below(axis_px + legend_px + 8),
                      yanchor="top", pad=dict(t=0, b=0), font=dict(size=11),
                      currentvalue=dict(prefix="now: ", suffix=" ms", font=dict(size=12), xanchor="left"),
                      steps=[dict(label=f"{t:.{digits}f}", method="animate",
                                  args=[[str(i)], dict(pause, frame=dict(duration=0, redraw=True))])
                             for i, t in enumerate(times)])])
    fig.update_xaxes(range=[0, span_ms])
    fig.update_xaxes(title_text="ms from the first step drawn", row=n, col=1)
    fig.update_annotations(font_size=13)   # the panel titles
    fig.update_layout(title=dict(text=title, font=dict(size=16), y=1 - 18 / height, yanchor="top"),
                      barmode="overlay", height=height, font=dict(size=12),
                      uniformtext=dict(minsize=11, mode="hide"),   # a label that does not fit is left to the hover
                      legend=dict(orientation="h", x=0, xanchor="left", y=below(axis_px), yanchor="top",
                                  font=dict(size=12)),
                      margin=dict(t=top_px, b=axis_px + legend_px + slider_px, l=70, r=20))
    return fig
