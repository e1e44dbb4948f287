"""When does speculation pay? A break-even model of a speculative decode step, from measured parts.

A decode step with k drafts per request and batch B costs

    T(k) = fixed(spec) + forward(B * (k + 1)) + draft(k)          (T(0) = fixed(no spec) + forward(B))

where ``forward(n)`` is the target model's forward over n tokens (summed over the PP stages: one request's step
passes through every stage in turn), ``draft(k) = d0 + d1 * k`` the drafter's proposal for the batch (MTP with one
layer runs it k times, the first over the verified tokens) and ``fixed`` everything else a step costs (scheduler,
sampling, rejection, inter-process hand-offs, PP transfers). A step emits ``E(a, k) = 1 + a + ... + a^k`` tokens per
request when each draft position is accepted with probability a (given the ones before it were), so

    speed-up(a, k) = E(a, k) * T(0) / T(k)

and speculation loses below the acceptance rate a* where ``E(a*, k) = T(k) / T(0)``.

The parts come from the engine's own per-rank spans (:mod:`kit.worker.steptrace`, the kit's one step timer: the
target forward with its token count, the wait for the previous stage, the drafter's proposal) recorded during a
``kit bench --breakdown`` run: :func:`step_components` reduces one run's spans to per-step means, :func:`fit_costs`
fits the model to the rows of one (model, PP, batch) group and :func:`predict` sets predicted against measured
speed-ups. Pure functions: nothing here starts an engine or imports vLLM.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass


def expected_tokens(a: "float | list[float]", k: int) -> float:
    """Tokens per target forward (verify round) per request with k drafts: ``1 + sum_i prod_{j<=i} a_j``. For one
    i.i.d. rate a per draft position this is ``1 + a + ... + a^k`` = ``(1 - a^(k+1)) / (1 - a)``; with a list of
    per-position conditional rates, each position uses its own."""
    rates = [a] * k if isinstance(a, (int, float)) else list(a)[:k]
    for r in rates:
        if not 0.0 <= r <= 1.0:
            raise ValueError(f"acceptance rate must be in [0, 1], got {r}")
    total, p = 1.0, 1.0
    for r in rates:
        p *= r
        total += p
    return total


def acceptance_for_length(length: float, k: int) -> float:
    """The i.i.d. per-position acceptance rate a whose ``expected_tokens(a, k)`` equals ``length`` (clipped to [0, 1])."""
    if length <= 1.0:
        return 0.0
    if length >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) < length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Costs:
    """The step-cost model of one (model, PP size, batch), in seconds."""

    fixed_nospec_s: float
    fixed_spec_s: float
    forward_base_s: float       # forward(n) = forward_base_s + forward_per_token_s * n
    forward_per_token_s: float
    draft_base_s: float         # draft(k) = draft_base_s + draft_per_token_s * k
    draft_per_token_s: float
    batch: int = 1
    pp: int = 1

    def forward_s(self, n_tokens: float) -> float:
        return self.forward_base_s + self.forward_per_token_s * n_tokens

    def step_s(self, k: int) -> float:
        """T(k): one decode step of the whole batch with k drafts per request (k = 0: no speculation)."""
        if k == 0:
            return self.fixed_nospec_s + self.forward_s(self.batch)
        return (self.fixed_spec_s + self.forward_s(self.batch * (k + 1))
                + self.draft_base_s + self.draft_per_token_s * k)

    def speedup(self, a: float, k: int) -> float:
        """Predicted decode speed-up over no speculation at acceptance rate a with k drafts."""
        return expected_tokens(a, k) * self.step_s(0) / self.step_s(k)

    def speedup_at_length(self, length: float, k: int) -> float:
        """Predicted speed-up for a measured mean acceptance length (tokens per target forward)."""
        return length * self.step_s(0) / self.step_s(k)

    def break_even(self, k: int) -> float | None:
        """The acceptance rate below which k drafts lose against none; ``None`` when even a = 1 loses."""
        need = self.step_s(k) / self.step_s(0)
        if need <= 1.0:
            return 0.0
        if need > k + 1:
            return None
        return acceptance_for_length(need, k)

    def to_dict(self) -> dict:
        return asdict(self)


def fit_linear(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = b0 + b1 * x``; one distinct x gives slope 0."""
    if not xs:
        raise ValueError("no points to fit")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 0.0
    b1 = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b1 * mx, b1


def fit_costs(components: dict[int, dict], batch: int = 1, pp: int = 1) -> Costs:
    """Fit :class:`Costs` to per-k step components (``{k: step_components(...)}``, k = 0 required).

    forward(n) is fitted over every k's forward; draft(k) over the speculative rows; the fixed costs are each row's
    step period minus its forward and draft, no-spec alone for ``fixed_nospec_s`` and the mean over the
    speculative rows for ``fixed_spec_s``.
    """
    if 0 not in components:
        raise ValueError("the no-speculation row (k = 0) is needed to fit the model")
    ks = sorted(components)
    f0, f1 = fit_linear([batch * (k + 1) for k in ks], [components[k]["forward_s"] for k in ks])
    spec = [k for k in ks if k > 0]
    c0 = components[0]["period_s"] - components[0]["forward_s"]
    if spec:
        d0, d1 = fit_linear([float(k) for k in spec], [components[k]["draft_s"] for k in spec])
        if len(spec) == 1:  # one point: all of it per draft token
            d0, d1 = 0.0, components[spec[0]]["draft_s"] / spec[0]
        cs = statistics.fmean(components[k]["period_s"] - components[k]["forward_s"] - components[k]["draft_s"]
                              for k in spec)
    else:
        d0 = d1 = 0.0
        cs = c0
    return Costs(c0, cs, f0, f1, d0, d1, batch=batch, pp=pp)


# -- from the engine's spans -----------------------------------------------------------------------

def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def _decode_model(e: dict, limit: int) -> bool:
    """A target forward of a decode step: at most ``batch * (k + 1)`` tokens (more is a prefill chunk)."""
    return e["kind"] == "model" and e.get("tokens") is not None and e["tokens"] <= limit


def step_components(ranks: list[dict], k: int, batch: int) -> dict:
    """Per decode step means from one run's :func:`kit.worker.steptrace.read` results (one per rank).

    A decode step is a target forward (a ``model`` span) over at most ``batch * (k + 1)`` tokens (more is a
    prefill). Returns ``forward_s`` (summed over the stages), ``forward_per_stage_s``, ``recv_s`` (later stages
    waiting for the previous one), ``draft_s`` (the last rank's proposals after decode forwards), ``period_s`` (mean
    time from one decode forward's start to the next on the last rank, over consecutive decode steps of a request),
    ``fixed_s`` (period minus forward and draft), ``steps`` and ``timeline`` (:func:`timeline`).
    """
    limit = batch * (k + 1)
    ranks = sorted(ranks, key=lambda r: r["pp_rank"])
    per_stage, recv = [], []
    for r in ranks:
        per_stage.append(_mean([e["t1"] - e["t0"] for e in r["events"] if _decode_model(e, limit)]))
        recv += [e["t1"] - e["t0"] for e in r["events"] if e["kind"] == "recv"]
    last = next((r for r in ranks if r.get("is_last_rank")), ranks[-1])
    drafts, periods, prev, steps = [], [], None, 0
    for e in sorted(last["events"], key=lambda e: e["t0"]):
        if e["kind"] == "model":
            decode = _decode_model(e, limit)
            steps += decode
            if decode and prev is not None and _decode_model(prev, limit):
                periods.append(e["t0"] - prev["t0"])
            prev = e
        elif e["kind"] == "propose" and prev is not None and _decode_model(prev, limit):
            drafts.append(e["t1"] - e["t0"])
    # A request's last decode step and the next request's first are separated by its prefill, so consecutive
    # decode forwards are steps of the same requests; still drop the rare outlier (a GC pause, another process).
    if periods:
        med = statistics.median(periods)
        periods = [p for p in periods if p <= 4 * med]
    fwd, draft, period = sum(per_stage), _mean(drafts), _mean(periods)
    return {"forward_s": fwd, "forward_per_stage_s": per_stage, "recv_s": _mean(recv), "draft_s": draft,
            "period_s": period, "fixed_s": period - fwd - draft, "steps": steps, "timeline": timeline(ranks, limit)}


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total time where an interval of ``a`` and one of ``b`` overlap (both sorted by start)."""
    total, j = 0.0, 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        i = j
        while i < len(b) and b[i][0] < e:
            total += max(0.0, min(e, b[i][1]) - max(s, b[i][0]))
            i += 1
    return total


def timeline(ranks: list[dict], limit: int) -> dict:
    """Per stage over the decode window: busy share (forward + draft), waiting for the previous stage, idle share,
    and how much of the stages' forwards ran at the same time (micro-batches in flight: 0 means the pipeline
    never overlapped, every step crossed the stages one after the other)."""
    spans, out = [], []
    for r in sorted(ranks, key=lambda r: r["pp_rank"]):
        ev = [e for e in r["events"] if e["kind"] in ("model", "propose", "recv")]
        fw = sorted((e["t0"], e["t1"]) for e in ev if _decode_model(e, limit))
        spans.append(fw)
        if not fw:
            out.append({"pp_rank": r["pp_rank"], "busy": 0.0, "recv": 0.0, "idle": 0.0})
            continue
        t0, t1 = fw[0][0], fw[-1][1]
        window = max(t1 - t0, 1e-9)
        inside = [e for e in ev if t0 <= e["t0"] <= t1]
        busy = sum(e["t1"] - e["t0"] for e in inside if e["kind"] in ("model", "propose"))
        rcv = sum(e["t1"] - e["t0"] for e in inside if e["kind"] == "recv")
        out.append({"pp_rank": r["pp_rank"], "busy": busy / window, "recv": rcv / window,
                    "idle": max(0.0, 1 - (busy + rcv) / window)})
    overlap = None
    if len(spans) >= 2 and spans[0] and spans[-1]:
        ov = sum(_overlap(spans[i], spans[j]) for i in range(len(spans)) for j in range(i + 1, len(spans)))
        overlap = ov / max(1e-9, sum(e - s for s, e in spans[0]))
    return {"stages": out, "forward_overlap": overlap}


# -- rows: predicted against measured --------------------------------------------------------------

def occupancy(steps_plain: float, steps_spec: float, tokens_per_forward: float) -> float:
    """How full the speculative row's decode steps were, relative to the plain row's: 1 when every step carried
    as many requests as the plain engine's steps did.

    Both rows decode the same tokens; a speculative step emits ``tokens_per_forward`` of them per request, so
    with the same requests per step it needs ``steps_plain / tokens_per_forward`` steps. More steps than that
    means fewer requests per step (a batch split by in-flight requests, a tail of requests finishing at different
    steps). :func:`predict`'s full-batch speed-up times this factor is its prediction at the measured occupancy."""
    return steps_plain / (steps_spec * tokens_per_forward)


# A prediction agrees with a measured speed-up within this relative error (the payoff tables' band).
TOLERANCE = 0.15


def predict(rows: list[dict], tolerance: float = TOLERANCE) -> list[dict]:
    """Predicted against measured speed-up for every speculative row.

    ``rows``: dicts with ``model``, ``pp``, ``batch``, ``k`` (0 = no speculation), ``decode_tok_s`` (a number: the
    median), ``tokens_per_forward`` (the measured mean acceptance length; 1 without speculation) and
    ``components`` (:func:`step_components` of the row's median engine). The model is fitted per (model, PP,
    batch) group; a row agrees when ``|predicted / measured - 1| <= tolerance``. ``predicted`` assumes every
    step carries the same requests as the plain engine's; ``predicted_at_occupancy`` takes the row's measured step
    count as an input too (:func:`occupancy`), which separates a slow step from a half-empty one.
    """
    groups: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["pp"], r["batch"]), {})[r["k"]] = r
    out = []
    for (model, pp, batch), by_k in sorted(groups.items()):
        if 0 not in by_k or any(r.get("components") is None for r in by_k.values()):
            continue
        costs = fit_costs({k: r["components"] for k, r in by_k.items()}, batch=batch, pp=pp)
        base = by_k[0]["decode_tok_s"]
        for k in sorted(by_k):
            r = by_k[k]
            if k == 0:
                continue
            measured = r["decode_tok_s"] / base
            pred = costs.speedup_at_length(r["tokens_per_forward"], k)
            steps0, steps = by_k[0]["components"].get("steps"), r["components"].get("steps")
            occ = occupancy(steps0, steps, r["tokens_per_forward"]) if steps0 and steps else None
            pred_occ = pred * occ if occ else None
            out.append({"model": model, "pp": pp, "batch": batch, "k": k,
                        "acceptance": acceptance_for_length(r["tokens_per_forward"], k),
                        "tokens_per_forward": r["tokens_per_forward"], "measured": measured, "predicted": pred,
                        "error": pred / measured - 1, "agrees": abs(pred / measured - 1) <= tolerance,
                        "occupancy": occ, "predicted_at_occupancy": pred_occ,
                        "error_at_occupancy": pred_occ / measured - 1 if pred_occ else None,
                        "agrees_at_occupancy": abs(pred_occ / measured - 1) <= tolerance if pred_occ else None,
                        "break_even": costs.break_even(k), "costs": costs.to_dict()})
    return out


def costs_by_group(rows: list[dict]) -> dict[tuple, Costs]:
    """``{(model, pp, batch): Costs}`` for every group of ``rows`` (as for :func:`predict`) that has a no-spec row."""
    groups: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        if r.get("components") is not None:
            groups.setdefault((r["model"], r["pp"], r["batch"]), {})[r["k"]] = r["components"]
    return {g: fit_costs(c, batch=g[2], pp=g[1]) for g, c in sorted(groups.items()) if 0 in c}
