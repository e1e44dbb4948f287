"""The PP pipeline over time, from live step traces: which stage computes which micro-batch when.

Input is :func:`kit.worker.steptrace.merge` output (every rank's events of one engine run). One panel per run, the
same time span for each, so that runs with and without micro-batches in flight compare at a glance.
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


def pipeline_lanes(runs: dict[str, list[dict]], pp: int, span_ms: float = 120.0,
                   title: str = "The PP pipeline over time"):
    """One panel per run (``runs[label]`` = merged events): a lane per stage, a bar per step's work on that stage,
    coloured by the requests it carries (a micro-batch) and labelled ``s<step>``; grey where a stage waits for the
    previous stage's hidden states. The last stage's bar includes its sampling and drafting. Each panel's title
    gives its share of decode steps that started on rank 0 while the previous step still ran on the last rank
    (two micro-batches in flight) and each stage's busy share of the span drawn."""
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
        panels.append((label, events, win, head))
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.16,
                        subplot_titles=[p[3] for p in panels])
    lanes = [f"rank {r}" for r in range(pp)]
    for row, (label, events, win, _) in enumerate(panels, start=1):
        if win is None:
            continue
        lo, hi = win
        ms = lambda t: (t - lo) * 1000.0  # noqa: E731
        by = steptrace.steps(events)
        for step, v in sorted(by.items()):
            for rank, f in v["forward"].items():
                end = f["t1"]
                if rank == pp - 1:  # the last stage's work on a step ends after its sample and drafts
                    end = max([end] + [e["t1"] for e in (v["sample"], v["propose"]) if e])
                if end <= lo or f["t0"] >= hi:
                    continue
                reqs = sorted(f.get("reqs") or [], key=lambda r: (len(r), r))  # r2 before r10
                key = " ".join(reqs)
                c = colors.setdefault(key, REQ_COLORS[len(colors) % len(REQ_COLORS)])
                start = f["t0"]
                if f.get("hidden_in") and f["hidden_in"] > f["t0"]:
                    fig.add_trace(go.Bar(y=[lanes[rank]], x=[ms(f["hidden_in"]) - ms(f["t0"])], base=[ms(f["t0"])],
                                         orientation="h", marker_color="#e0e0e0", showlegend=False,
                                         hovertext=f"step {step}: rank {rank} waits for rank {rank - 1}",
                                         hoverinfo="text"), row=row, col=1)
                    start = f["hidden_in"]
                fig.add_trace(go.Bar(y=[lanes[rank]], x=[max(ms(end) - ms(start), 0.05)], base=[ms(start)],
                                     orientation="h", marker=dict(color=c, line=dict(color="white", width=1)),
                                     text=[f"s{step}"], textposition="inside", insidetextanchor="middle",
                                     textangle=0, textfont=dict(size=12), showlegend=False,
                                     hovertext=f"{label}, step {step} on rank {rank}: requests {key or '-'}",
                                     hoverinfo="text"), row=row, col=1)
        fig.update_yaxes(categoryorder="array", categoryarray=lanes, autorange="reversed", row=row, col=1)
    for key, c in colors.items():  # the legend: one entry per micro-batch (set of requests) seen
        fig.add_trace(go.Bar(y=[None], x=[None], marker_color=c, name=f"requests {key}"), row=1, col=1)
    fig.add_trace(go.Bar(y=[None], x=[None], marker_color="#e0e0e0", name="waiting for the previous stage"),
                  row=1, col=1)
    fig.update_xaxes(range=[0, span_ms])
    fig.update_xaxes(title_text="ms from the first step drawn", row=len(panels), col=1)
    fig.update_layout(title=title, barmode="overlay", height=140 + 150 * len(panels) + 30 * pp * len(panels),
                      uniformtext=dict(minsize=10, mode="hide"), legend=dict(orientation="h", y=-0.18),
                      margin=dict(t=110))
    return fig
