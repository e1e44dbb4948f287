"""Requests scheduled again while their step is still in flight, read from a step trace (:mod:`kit.worker.steptrace`).

Under sync PP vLLM's engine core keeps up to PP steps in flight: it schedules step s + 1 before step s's output
has been processed. A request in step s is therefore still in flight when step s + 1 is planned, and it must not
ride in it: without drafts it has no new token and is skipped; with drafts stock vLLM 0.32 schedules it again,
with the drafts and no sampled token in front (the defect ``pp_spec_schedule_gate`` fixes). In a trace that shows
as one request in two adjacent decode steps on rank 0. Notebook 06 follows the chain from a wrong token to such a
step with these functions.
"""
from __future__ import annotations

from kit.worker.steptrace import steps


def rides(events: list[dict]) -> list[dict]:
    """Every step on rank 0 in which a request verifies drafts although the step just before it carried that
    request too (it was in flight).

    ``events``: :func:`kit.worker.steptrace.merge` output. Each: ``req``, ``step``, ``prev_step``, ``tokens``
    (scheduled for it in the second step), ``drafts`` (draft tokens it verifies there) and ``others`` (the other
    requests in the second step). ``tokens == drafts``: the step has no sampled token in front of the drafts.
    Meaningful at PP > 1 only: at PP = 1 every step follows the one before it."""
    by = steps(events)
    out = []
    for s in sorted(by):
        now, before = by[s]["forward"].get(0), by.get(s - 1, {}).get("forward", {}).get(0)
        if now is None or before is None:
            continue
        for rid, (n, d) in now["reqs"].items():
            # With drafts only: a long prompt's next prefill chunk rides right after the one before by design.
            if rid in before["reqs"] and d > 0:
                out.append({"req": rid, "step": s, "prev_step": s - 1, "tokens": n, "drafts": d,
                            "others": sorted(r for r in now["reqs"] if r != rid)})
    return out


def written_by(events: list[dict], req: str) -> list[int]:
    """For each output token of ``req`` in order, the step whose sample on the last rank wrote it (a sample writes
    1 + its accepted drafts); tokens the trace did not see (a run longer than the trace) are left out."""
    by = steps(events)
    out: list[int] = []
    for s in sorted(by):
        sm = by[s]["sample"]
        if sm is not None and req in sm.get("accepted", {}):
            out += [s] * (1 + sm["accepted"][req])
    return out


def request_names(events: list[dict], n_prompts: int) -> list[str]:
    """The trace's request names (``r0``, ``r1``, ... from :func:`kit.worker.steptrace.merge`) of prompts
    0..n_prompts-1: the order the first step on rank 0 scheduled them in, which is the order ``generate`` added the
    prompts (all of them prefill in that first step when they fit). Raises ValueError when they did not all fit."""
    by = steps(events)
    first = next((by[s]["forward"][0] for s in sorted(by) if 0 in by[s]["forward"]), None)
    names = list(first["reqs"]) if first else []
    if len(names) != n_prompts:
        raise ValueError(f"the first step scheduled {len(names)} requests, not the {n_prompts} prompts: "
                         "request names cannot be read from it")
    return names


def rows_read(events: list[dict], req: str, step: int) -> dict | None:
    """The rows of ``step``'s hidden states that the last rank read ``req``'s logits from, and whose rows they
    are: ``{"own": [first, end), "read": [rows], "owners": [the request owning each read row]}``; None when the
    trace has no such record (no drafts verified in that step, or an older trace)."""
    sm = steps(events).get(step, {}).get("sample")
    rows = (sm or {}).get("rows") or {}
    if req not in rows:
        return None
    return {**rows[req], "owners": [row_owner(rows, x) for x in rows[req]["read"]]}


def row_owner(rows: dict[str, dict], row: int) -> str | None:
    """The request whose own rows (``rows[req]["own"]``: [first, end) of a sample event's ``rows``) hold ``row``."""
    return next((r for r, v in rows.items() if v["own"][0] <= row < v["own"][1]), None)
