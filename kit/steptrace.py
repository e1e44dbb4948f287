"""Timestamps of each engine step inside every PP worker: forward, sample, MTP propose, per request.

:class:`kit.workerext.KitWorkerExtension` turns it on (``kit_trace_start``) and reads it back
(``kit_trace_read``) with ``LLM.collective_rpc``. It wraps methods on this worker's *instance* (the
classes stay untouched, so other engines in the process and the kit's patches are unaffected):

- ``worker.execute_model``: one ``forward`` event per step, with the requests the scheduler put in it
  (tokens and draft tokens to verify), on non-first ranks the moment the previous stage's hidden states
  arrived (``AsyncIntermediateTensors.wait_for_comm``), and on non-last ranks how many tokens each
  request's history is short of the scheduler's count *before* ``_update_states`` runs (the accepted
  drafts the scheduler never sends there, which ``pp_spec_token_history`` fills in);
- ``worker.sample_tokens``: a ``sample`` event on the last rank, with each request's accepted drafts
  (sampled tokens - 1);
- ``model_runner.propose_draft_token_ids``: a ``propose`` event (the drafter's forward), with the
  requests it drafted for;
- ``worker.take_draft_token_ids``: a ``handoff`` event when the engine core collects the drafts for its
  scheduler (``EngineCore.post_step`` under sync scheduling).

Times are ``time.monotonic()``: one clock for every process on the host, so ranks line up.
"""
from __future__ import annotations

import functools
import time

MAX_EVENTS = 5000
_STATE: dict = {"events": [], "step": -1, "rank": None, "last": False}


def _record(kind: str, t0: float, t1: float, **kw) -> None:
    if len(_STATE["events"]) < MAX_EVENTS:
        _STATE["events"].append({"kind": kind, "rank": _STATE["rank"], "t0": t0, "t1": t1, **kw})


def _scheduled(runner, so) -> tuple[dict, dict]:
    """Per request id: [scheduled tokens, draft tokens to verify]; and the history gap (non-last ranks)."""
    reqs = {rid: [int(n), len(so.scheduled_spec_decode_tokens.get(rid, ()))]
            for rid, n in so.num_scheduled_tokens.items()}
    gap = {}
    if not _STATE["last"]:
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            state = runner.requests.get(rid)
            if state is not None and rid not in cached.resumed_req_ids:
                gap[rid] = int(cached.num_computed_tokens[i] - state.num_tokens)
    return reqs, gap


def start(worker) -> dict:
    """Clear the events and wrap this worker's methods (once)."""
    from vllm.distributed.parallel_state import get_pp_group

    pp = get_pp_group()
    _STATE.update(events=[], step=-1, rank=pp.rank_in_group, last=pp.is_last_rank)
    runner = worker.model_runner
    if getattr(worker, "_kit_traced", False):
        return {"pp_rank": _STATE["rank"], "tracing": True}
    worker._kit_traced = True

    orig_exec = worker.execute_model

    @functools.wraps(orig_exec)
    def execute_model(scheduler_output, *args, **kwargs):
        _STATE["step"] += 1
        step = _STATE["step"]
        reqs, gap = _scheduled(runner, scheduler_output)
        t0 = time.monotonic()
        try:
            return orig_exec(scheduler_output, *args, **kwargs)
        finally:
            if reqs:
                _record("forward", t0, time.monotonic(), step=step, reqs=reqs, history_gap=gap,
                        hidden_in=_STATE.pop("hidden_in", None))

    worker.execute_model = execute_model

    orig_runner_exec = runner.execute_model

    @functools.wraps(orig_runner_exec)
    def runner_execute_model(scheduler_output, intermediate_tensors=None, *args, **kwargs):
        wait = getattr(intermediate_tensors, "wait_for_comm", None)
        if wait is not None:
            def wait_for_comm():
                wait()
                _STATE.setdefault("hidden_in", time.monotonic())
            intermediate_tensors.wait_for_comm = wait_for_comm  # an instance attribute: this step's tensors only
        return orig_runner_exec(scheduler_output, intermediate_tensors, *args, **kwargs)

    runner.execute_model = runner_execute_model

    orig_sample = worker.sample_tokens

    @functools.wraps(orig_sample)
    def sample_tokens(*args, **kwargs):
        t0 = time.monotonic()
        out = orig_sample(*args, **kwargs)
        sampled = getattr(out, "sampled_token_ids", None)
        if _STATE["last"] and sampled:
            accepted = {rid: len(s) - 1 for rid, s in zip(out.req_ids, sampled) if len(s)}
            _record("sample", t0, time.monotonic(), step=_STATE["step"], accepted=accepted)
        return out

    worker.sample_tokens = sample_tokens

    orig_take = worker.take_draft_token_ids

    @functools.wraps(orig_take)
    def take_draft_token_ids(*args, **kwargs):
        # The engine core's post_step asks for the drafts (sync scheduling); this call queues behind the step's
        # sample, so its start is when the engine core asked and its end when the drafts left for the scheduler.
        t0 = time.monotonic()
        out = orig_take(*args, **kwargs)
        if out is not None and getattr(out, "req_ids", None):
            _record("handoff", t0, time.monotonic(), step=_STATE["step"], reqs=list(out.req_ids))
        return out

    worker.take_draft_token_ids = take_draft_token_ids

    if hasattr(runner, "propose_draft_token_ids"):
        orig_propose = runner.propose_draft_token_ids

        @functools.wraps(orig_propose)
        def propose_draft_token_ids(scheduler_output, *args, **kwargs):
            t0 = time.monotonic()
            drafts = orig_propose(scheduler_output, *args, **kwargs)
            k = int(drafts.shape[-1]) if hasattr(drafts, "shape") and len(drafts.shape) == 2 else None
            _record("propose", t0, time.monotonic(), step=_STATE["step"],
                    reqs=list(scheduler_output.num_scheduled_tokens), k=k)
            return drafts

        runner.propose_draft_token_ids = propose_draft_token_ids
    return {"pp_rank": _STATE["rank"], "tracing": True}


def read() -> dict:
    """This rank's events since :func:`start`."""
    return {"pp_rank": _STATE["rank"], "is_last_rank": _STATE["last"], "events": list(_STATE["events"])}


# -- reading a trace (in the notebook's process) ---------------------------------------------------

def merge(per_rank: list[dict]) -> list[dict]:
    """All ranks' events in one list ordered by start, request ids renamed ``r0, r1, ...`` by first appearance."""
    events = sorted((e for r in per_rank for e in r["events"]), key=lambda e: (e["t0"], e["rank"]))
    names: dict[str, str] = {}

    def name(rid: str) -> str:
        return names.setdefault(rid, f"r{len(names)}")

    out = []
    for e in events:
        e = dict(e)
        if "reqs" in e:
            e["reqs"] = ({name(k): v for k, v in e["reqs"].items()} if isinstance(e["reqs"], dict)
                         else [name(k) for k in e["reqs"]])
        for key in ("history_gap", "accepted"):
            if key in e:
                e[key] = {name(k): v for k, v in e[key].items()}
        out.append(e)
    return out


def steps(events: list[dict]) -> dict[int, dict]:
    """Per step: its forward on each rank, the last rank's sample, propose and handoff."""
    by: dict[int, dict] = {}
    for e in events:
        s = by.setdefault(e["step"], {"forward": {}, "sample": None, "propose": None, "handoff": None})
        if e["kind"] == "forward":
            s["forward"][e["rank"]] = e
        else:
            s[e["kind"]] = e
    return by
