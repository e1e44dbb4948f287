"""The kit's one step timer: timestamps of each engine step inside every PP worker (forward, model, recv, sample,
MTP propose, handoff), per request.

:class:`kit.worker.ext.KitWorkerExtension` turns it on (``kit_trace_start``) and reads it back
(``kit_trace_read``) with ``LLM.collective_rpc``. It wraps methods on this worker's *instance* (the
classes stay untouched, so other engines in the process and the kit's patches are unaffected):

- ``worker.execute_model``: one ``forward`` event per step, with the requests the scheduler put in it
  (tokens and draft tokens to verify), on non-first ranks the moment the previous stage's hidden states
  arrived (``AsyncIntermediateTensors.wait_for_comm``), and on non-last ranks how many tokens each
  request's history is short of the scheduler's count *before* ``_update_states`` runs (the accepted
  drafts the scheduler never sends there, which ``pp_spec_token_history`` fills in);
- ``worker.sample_tokens``: a ``sample`` event on the last rank, with each request's accepted drafts
  (sampled tokens - 1) and, in a step that verifies drafts, the rows of hidden states each request owns and the
  rows its logits were read from (:func:`logits_rows`);
- ``model_runner.propose_draft_token_ids``: a ``propose`` event (the drafter's forward), with the
  requests it drafted for;
- ``worker.take_draft_token_ids``: a ``handoff`` event when the engine core collects the drafts for its
  scheduler (``EngineCore.post_step`` under sync scheduling);
- ``model_runner._model_forward``: a ``model`` event, the target model's forward alone with its token count, after
  a ``recv`` event on non-first ranks (the wait for the previous stage's activations, done first so that ``model``
  is this stage's compute). :mod:`kit.bench.payoff` reduces these to the step costs of ``kit bench --breakdown``;
  :func:`summary` reads the rest for ``kit bench --timeline``.

Times are ``time.monotonic()``: one clock for every process on the host, so ranks line up.
"""
from __future__ import annotations

import functools
import time

MAX_EVENTS = 50000  # a few MB; 8 prompts x 256 tokens at PP=2 batch 1 is about 6000 events
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


def _forward_tokens(args, kwargs) -> int | None:
    """Tokens in a ``_model_forward`` call (its ``input_ids``, or ``positions`` when the model takes embeddings)."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    pos = kwargs.get("positions", args[1] if len(args) > 1 else None)
    t = ids if ids is not None else pos
    try:
        return int(t.shape[-1])
    except Exception:
        return None


def _span(obj, name: str, kind: str, fields, before=None) -> None:
    """Wrap ``obj.name`` (an instance attribute: the class stays untouched) to record a ``kind`` event around each
    call, with ``fields(args, kwargs, result)`` (``fields(args, kwargs, result, before(args, kwargs))`` when
    ``before`` reads state the call consumes); no event when that returns None."""
    orig = getattr(obj, name)

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        pre = before(args, kwargs) if before is not None else None
        t0 = time.monotonic()
        out = orig(*args, **kwargs)
        extra = fields(args, kwargs, out) if before is None else fields(args, kwargs, out, pre)
        if extra is not None:
            _record(kind, t0, time.monotonic(), step=_STATE["step"], **extra)
        return out

    setattr(obj, name, wrapper)


def logits_rows(runner) -> dict | None:
    """Per request of the step about to be sampled (last rank, drafts verified): the rows of the step's hidden
    states it owns (``own``: [first, end)) and the rows its logits are read from (``read``, wrapped like a
    negative tensor index). vLLM computes the read rows from the tokens it was sent; a request scheduled with its
    drafts alone reads in front of its own rows (notebook 06)."""
    st = getattr(runner, "execute_model_state", None)
    md = getattr(st, "spec_decode_metadata", None)
    if md is None:
        return None
    so = st.scheduler_output
    ids = runner.input_batch.req_ids[:len(so.num_scheduled_tokens)]
    n_rows = int(st.hidden_states.shape[0])
    read = [int(i) % n_rows for i in md.logits_indices.tolist()]
    out, start, at = {}, 0, 0
    for rid in ids:
        n = int(so.num_scheduled_tokens[rid])
        k = 1 + len(so.scheduled_spec_decode_tokens.get(rid, ()))
        out[rid] = {"own": [start, start + n], "read": read[at:at + k]}
        start, at = start + n, at + k
    return out


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

    def sampled(args, kwargs, out, rows) -> dict | None:
        tokens = getattr(out, "sampled_token_ids", None)
        if not (_STATE["last"] and tokens):
            return None
        ev = {"accepted": {rid: len(t) - 1 for rid, t in zip(out.req_ids, tokens) if len(t)}}
        if rows:
            ev["rows"] = rows
        return ev

    def rows_before(args, kwargs) -> dict | None:
        try:
            return logits_rows(runner) if _STATE["last"] else None
        except Exception:  # noqa: BLE001 - a trace field, never a reason to fail the step
            return None

    def handed_off(args, kwargs, out) -> dict | None:
        # The engine core's post_step asks for the drafts (sync scheduling); this call queues behind the step's
        # sample, so its start is when the engine core asked and its end when the drafts left for the scheduler.
        return {"reqs": list(out.req_ids)} if out is not None and getattr(out, "req_ids", None) else None

    def proposed(args, kwargs, out) -> dict:
        so = kwargs.get("scheduler_output", args[0] if args else None)
        k = int(out.shape[-1]) if hasattr(out, "shape") and len(out.shape) == 2 else None
        return {"reqs": list(so.num_scheduled_tokens), "k": k}

    _span(worker, "sample_tokens", "sample", sampled, before=rows_before)
    _span(worker, "take_draft_token_ids", "handoff", handed_off)
    if hasattr(runner, "propose_draft_token_ids"):
        _span(runner, "propose_draft_token_ids", "propose", proposed)

    orig_model_forward = runner._model_forward

    @functools.wraps(orig_model_forward)
    def model_forward(*args, **kwargs):
        it = kwargs.get("intermediate_tensors", args[2] if len(args) > 2 else None)
        wait = getattr(it, "wait_for_comm", None)
        if wait is not None:
            t0 = time.monotonic()
            wait()
            _record("recv", t0, time.monotonic(), step=_STATE["step"])
        t0 = time.monotonic()
        try:
            return orig_model_forward(*args, **kwargs)
        finally:
            _record("model", t0, time.monotonic(), step=_STATE["step"], tokens=_forward_tokens(args, kwargs))

    runner._model_forward = model_forward
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
        for key in ("history_gap", "accepted", "rows"):
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
        elif e["kind"] in s:  # the per-stage model/recv spans are kit.bench.payoff's
            s[e["kind"]] = e
    return by


# -- a whole run in figures ------------------------------------------------------------------------

def _decode(forward: dict, max_tokens: int = 9) -> bool:
    """A decode step: every request computes its newest token plus at most 8 drafts (not a prefill chunk)."""
    return all(n <= max_tokens for n, _ in forward["reqs"].values())


def decode_steps(events: list[dict]) -> list[int]:
    """The decode steps of a merged trace in order: computed on rank 0, every request past its prefill."""
    by = steps(events)
    return [s for s in sorted(by) if 0 in by[s]["forward"] and _decode(by[s]["forward"][0])]


def _inside(inner: dict | None, outer: dict | None) -> bool:
    return bool(inner and outer and outer["t0"] <= inner["t0"] and inner["t1"] <= outer["t1"])


def summary(events: list[dict]) -> dict:
    """Where a decode step's time goes, from :func:`merge`'d events of one run (all ranks).

    Only decode steps count, and a step period only between two decode steps that follow each other with no
    computed step between them (a prefill or a new ``generate`` call in between is left out). Times in seconds,
    means per computed decode step:

    - ``period``: rank 0's start of one step to its start of the next;
    - ``path``: the parts of the critical path from one step's start to the next's: rank 0's forward (``first``),
      the hand-over to the next stage (``send``), the last rank's forward after its input arrived (``last``;
      at PP=1 ``first`` is the whole forward), the sample, the drafter (``propose``; vLLM's V1 runner calls it
      inside ``sample_tokens``, and ``sample`` is then the rest of that call), the drafts' collection by
      the engine core (``handoff``: the drafts leave the last rank) and the rest until rank 0 starts the next step
      (``back``: the engine core's output processing and scheduling, empty steps, the trip to the workers);
    - ``stages``: per rank, ``busy`` (forward computing, plus sample and drafter on the last rank), ``recv`` (waiting
      inside a forward for the previous stage's hidden states) and ``idle`` (the rest of the period);
    - ``in_flight``: ``overlap_steps`` = decode steps whose rank-0 forward started before the previous computed
      step's last-rank forward ended (two micro-batches in flight), ``overlap`` = time two stages computed at once /
      rank 0's forward time;
    - ``empty_steps``: step numbers inside the decode window that computed nothing (the engine core sent a step
      with no request: every running request was in flight);
    - ``held_out``: per decode step, running requests left out of it although they were in the step just before
      (in flight: vLLM skips them without drafts, the kit's ``pp_spec_schedule_gate`` with drafts);
    - ``engine_wait``: from rank 0's start of a step to the moment its drafts left the last rank, i.e. how long the
      engine core's ``post_step`` (``take_draft_token_ids``) at least blocks it before it can schedule again.
    """
    by = steps(events)
    ranks = sorted({e["rank"] for e in events if e["kind"] == "forward"})
    if not ranks:
        return {"pp": 0, "decode_steps": 0}
    first, last = ranks[0], ranks[-1]
    computed = [s for s in sorted(by) if first in by[s]["forward"] and last in by[s]["forward"]]
    decode = [s for s in computed if _decode(by[s]["forward"][first])]
    pairs = [(a, b) for a, b in zip(computed, computed[1:]) if a in decode and b in decode]
    dec = set(decode)

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    def busy_of(s: int, r: int) -> tuple[float, float]:
        f = by[s]["forward"][r]
        recv = (f["hidden_in"] - f["t0"]) if f.get("hidden_in") else 0.0
        extra = 0.0
        if r == last:
            sm, pr = by[s]["sample"], by[s]["propose"]
            extra = sum(e["t1"] - e["t0"] for e in (sm, pr) if e and not (e is pr and _inside(pr, sm)))
        return f["t1"] - f["t0"] - recv + extra, recv

    periods = [by[b]["forward"][first]["t0"] - by[a]["forward"][first]["t0"] for a, b in pairs]
    path: dict[str, list[float]] = {k: [] for k in ("first", "send", "last", "sample", "propose", "handoff", "back")}
    waits = []
    for a, b in pairs:
        v = by[a]
        f0, fl = v["forward"][first], v["forward"][last]
        path["first"].append(f0["t1"] - f0["t0"])
        if last != first:
            start_last = fl.get("hidden_in") or fl["t0"]
            path["send"].append(start_last - f0["t1"])
            path["last"].append(fl["t1"] - start_last)
        end = fl["t1"]
        sm, pr = v["sample"], v["propose"]
        if sm is not None and pr is not None and _inside(pr, sm):
            # vLLM's V1 runner proposes inside sample_tokens: the sample part is what is left around the drafter.
            path["sample"].append(sm["t1"] - end - (pr["t1"] - pr["t0"]))
            path["propose"].append(pr["t1"] - pr["t0"])
            end = sm["t1"]
        else:
            for e, kind in ((sm, "sample"), (pr, "propose")):
                if e is not None:
                    path[kind].append(e["t1"] - end)
                    end = e["t1"]
        if v["handoff"] is not None:
            path["handoff"].append(v["handoff"]["t1"] - end)
            end = v["handoff"]["t1"]
        path["back"].append(by[b]["forward"][first]["t0"] - end)
        if v["handoff"] is not None:
            waits.append(v["handoff"]["t1"] - f0["t0"])
    stages = []
    period = mean(periods) or 0.0
    for r in ranks:
        bs = [busy_of(s, r) for s, _ in pairs]
        busy, recv = mean([x[0] for x in bs]) or 0.0, mean([x[1] for x in bs]) or 0.0
        stages.append({"rank": r, "busy": busy, "recv": recv, "idle": max(0.0, period - busy - recv)})
    # Two micro-batches in flight: rank 0 computes a step while the last rank still computes the one before.
    ov_steps, ov_time, f0_time = 0, 0.0, 0.0
    for a, b in zip(computed, computed[1:]):
        if b not in dec:
            continue
        fb, fa = by[b]["forward"][first], by[a]["forward"][last]
        f0_time += fb["t1"] - fb["t0"]
        if last != first and fb["t0"] < fa["t1"]:
            ov_steps += 1
            ov_time += max(0.0, min(fb["t1"], fa["t1"]) - max(fb["t0"], fa.get("hidden_in") or fa["t0"]))
    empty = 0
    held = 0
    if decode:
        lo, hi = decode[0], decode[-1]
        empty = sum(1 for s in range(lo, hi + 1) if s not in by or first not in by[s]["forward"])
        span: dict[str, list[int]] = {}
        for s in computed:
            for rid in by[s]["forward"][first]["reqs"]:
                span.setdefault(rid, []).append(s)
        for s in range(lo + 1, hi + 1):
            if s not in dec or (s - 1) not in by or first not in by[s - 1]["forward"]:
                continue
            now, before = by[s]["forward"][first]["reqs"], by[s - 1]["forward"][first]["reqs"]
            held += sum(1 for rid in before if rid not in now and span[rid][-1] > s)
        # A request in step s - 1 and alive after s but not in s: skipped while in flight. Steps s - 1 empty are
        # counted in ``empty`` instead.
    reqs_per_step = mean([len(by[s]["forward"][first]["reqs"]) for s in decode])
    return {
        "pp": len(ranks), "decode_steps": len(decode), "empty_steps": empty, "held_out": held,
        "reqs_per_step": reqs_per_step, "period": period,
        "path": {k: mean(v) for k, v in path.items() if v},
        "stages": stages,
        "in_flight": {"overlap_steps": ov_steps, "overlap": ov_time / f0_time if f0_time else None},
        "engine_wait": mean(waits),
    }


TIMELINE_HEAD = ["| topology | decode steps | empty steps | held out | req/step | period | rank-0 fwd | send | last fwd "
                 "| sample | propose | handoff | back | busy / recv / idle per stage | 2 in flight | post_step wait |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]


def summary_line(label: str, t: dict) -> str:
    """One markdown row of :data:`TIMELINE_HEAD` from a :func:`summary` (times in ms)."""
    ms = lambda x: "-" if x is None else f"{1e3 * x:.2f}"  # noqa: E731
    p = t.get("path", {})
    st = " ; ".join(f"{ms(s['busy'])} / {ms(s['recv'])} / {ms(s['idle'])}" for s in t.get("stages", []))
    fl = t.get("in_flight", {})
    ov = fl.get("overlap")
    return (f"| {label} | {t['decode_steps']} | {t.get('empty_steps', 0)} | {t.get('held_out', 0)} "
            f"| {t.get('reqs_per_step') or 0:.2f} | {ms(t.get('period'))} | "
            + " | ".join(ms(p.get(k)) for k in ("first", "send", "last", "sample", "propose", "handoff", "back"))
            + f" | {st} | {fl.get('overlap_steps', 0)} ({'-' if ov is None else f'{ov:.0%}'}) | {ms(t.get('engine_wait'))} |")


def load_traces(path: str) -> list[dict]:
    """The rows ``kit bench --timeline --save-trace FILE`` appended (``FILE`` may be gzipped)."""
    import gzip
    import json

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: list[str] | None = None) -> int:
    """``kit trace FILE``: the timeline table of every run saved with ``--save-trace``."""
    import argparse

    p = argparse.ArgumentParser(prog="kit trace", description=main.__doc__)
    p.add_argument("file", help="JSONL (or .jsonl.gz) written by kit bench --timeline --save-trace")
    args = p.parse_args(argv)
    rows = load_traces(args.file)
    several = len({r.get("model") for r in rows}) > 1
    print("\n".join(TIMELINE_HEAD))
    for r in rows:
        print(summary_line(f"{r['model']} {r['topology']}" if several else r["topology"], summary(r["events"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
