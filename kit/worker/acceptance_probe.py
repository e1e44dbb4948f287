"""Sampled acceptance against theory, recorded inside the worker that verifies the drafts.

For a draft token ``d`` proposed without probabilities (MTP, Eagle3 and n-gram in vLLM 0.32 pass
``draft_probs=None``), speculative sampling accepts ``d`` with probability ``p(d)``: the target's probability of
``d`` after the request's temperature (and top-k/top-p). With draft probabilities ``q`` it is ``min(1, p/q)``.
The probe wraps vLLM's ``RejectionSampler.forward`` in the worker process: before the real call it computes
``p(d)`` from the raw target logits and each request's own sampling parameters (independently of vLLM's
per-token expansion, which is what the ``cpu_rejection_expand`` patch fixes), and after it reads which drafts
were accepted. Per draft position it sums, over the sampled (non-greedy) requests that reached the position
(every earlier draft accepted): how often it was reached, how often accepted, the expected number accepted
(sum of ``p``) and that count's variance (sum of ``p (1 - p)``), so a caller can tell agreement from a defect
with a z-score. Installed on demand through the kit's worker extension (``kit_probe_start``/``kit_probe_read``),
never at import.

On request (``kit_probe_start_log``) it also keeps a log of verify rounds, greedy or sampled: per request row of each
verify batch its draft token ids and the tokens the sampler wrote that round (the accepted drafts, then the
target's own token: its correction at the first rejected draft, or its bonus token after the last one), with the
request id and how many output tokens the request had before the round, read from the model runner's input
batch (whose rows the sampler's rows follow). The log is bounded (``LOG_ROWS`` rows; later rows are only
counted) and off unless asked: ``kit_probe_start`` turns it off again.
"""
from __future__ import annotations

import functools

_STATS: dict | None = None
_MARK = "__kit_acceptance_probe__"
# The verify-round log (``None``: off) and the model runner whose input batch names its rows.
_LOG: dict | None = None
_RUNNER = None
# Rows the log keeps by default: every round of a notebook-sized run (8 prompts x 48 tokens is under 400 rows).
LOG_ROWS = 10000


def _empty() -> dict:
    return {"reached": [], "accepted": [], "expected": [], "variance": [], "rounds": 0}


def _grow(stats: dict, n: int) -> None:
    for key in ("reached", "accepted", "expected", "variance"):
        stats[key] += [0.0 if key in ("expected", "variance") else 0] * (n - len(stats[key]))


def _predicted(metadata, draft_probs, logits, sampling_metadata):
    """``[num_draft_tokens]`` acceptance probabilities, or ``None`` when every request is greedy."""
    import torch

    if sampling_metadata.all_greedy or sampling_metadata.temperature is None:
        return None
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    counts = torch.tensor(metadata.num_draft_tokens, dtype=torch.int64)
    per_token = lambda x: None if x is None else x.cpu().repeat_interleave(counts)  # noqa: E731
    temp = per_token(sampling_metadata.temperature).to(torch.float32)
    raw = logits[metadata.target_logits_indices].to(torch.float32).cpu()
    scaled = raw / torch.where(temp > 0, temp, torch.ones_like(temp)).unsqueeze(-1)
    scaled = apply_top_k_top_p(scaled, per_token(sampling_metadata.top_k), per_token(sampling_metadata.top_p))
    probs = scaled.softmax(dim=-1)
    draft = metadata.draft_token_ids.to(torch.int64).cpu()
    valid = draft >= 0
    p = torch.zeros(draft.shape[0], dtype=torch.float64)
    idx = torch.nonzero(valid).flatten()
    p[idx] = probs[idx, draft[idx]].to(torch.float64)
    if draft_probs is not None:
        q = torch.zeros_like(p)
        q[idx] = draft_probs.cpu()[idx, draft[idx]].to(torch.float64)
        p = torch.where(q > 0, torch.clamp(p / q.clamp_min(1e-30), max=1.0), torch.zeros_like(p))
    sampled = (temp > 0) & valid
    return p, sampled, draft


def _record(metadata, pred, output_token_ids) -> None:
    from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID

    p, sampled, _ = pred
    out = output_token_ids.cpu()
    start = 0
    for r, n in enumerate(metadata.num_draft_tokens):
        if n == 0:
            continue
        if not bool(sampled[start]):
            start += n
            continue
        _STATS["rounds"] += 1
        _grow(_STATS, n)
        # The sampler writes the accepted drafts, then the recovered token at the first rejection (or the bonus
        # token after the last draft), and placeholders after that: accepted = written tokens - 1.
        n_accepted = int((out[r] != PLACEHOLDER_TOKEN_ID).sum()) - 1
        for pos in range(n):
            pi = float(p[start + pos])
            _STATS["reached"][pos] += 1
            _STATS["expected"][pos] += pi
            _STATS["variance"][pos] += pi * (1.0 - pi)
            if pos >= n_accepted:
                break
            _STATS["accepted"][pos] += 1
        start += n


def _batch_rows(n: int) -> list[dict]:
    """Per sampler row: the request id, the output tokens it had before this round (``position``) and whether the
    runner discards the row's token (a prompt still being prefilled); ``None`` where the runner does not say."""
    rows = [{"req_id": None, "position": None, "discarded": None} for _ in range(n)]
    try:
        batch = _RUNNER.input_batch
        ids = list(batch.req_ids)[:n]
        for r, rid in enumerate(ids):
            rows[r]["req_id"] = rid
            rows[r]["position"] = int(batch.num_tokens_no_spec[r]) - int(batch.num_prompt_tokens[r])
        mask = getattr(getattr(_RUNNER, "discard_request_mask", None), "np", None)
        if mask is not None:
            for r in range(min(n, len(ids))):
                rows[r]["discarded"] = bool(mask[r])
    except Exception:  # a runner without these fields: the rows stay unnamed, the log still has the tokens
        pass
    return rows


def _log_rounds(metadata, output_token_ids, placeholder: int, rows: list[dict]) -> None:
    """Append one entry per request row of this verify batch (``rows``: :func:`_batch_rows`) to ``_LOG`` (until it
    holds ``limit`` rows)."""
    out = output_token_ids.cpu().tolist()
    drafts = metadata.draft_token_ids.cpu().tolist()
    step = _LOG["steps"]
    _LOG["steps"] += 1
    start = 0
    for r, n in enumerate(metadata.num_draft_tokens):
        draft = [int(t) for t in drafts[start:start + n]]
        start += n
        if len(_LOG["rounds"]) >= _LOG["limit"]:
            _LOG["dropped"] += 1
            continue
        written = []
        for t in out[r]:  # the accepted drafts and the target's token, then placeholders
            if t == placeholder:
                break
            written.append(int(t))
        _LOG["rounds"].append({"step": step, "row": r, "draft": draft, "output": written, **rows[r]})


def start(log_rows: int = 0, runner=None) -> None:
    """Install the probe in this process (once) and reset its counts. ``log_rows > 0`` also starts a fresh
    verify-round log of at most that many rows (``runner``: the model runner, to name each row's request);
    ``log_rows=0`` (the default) turns the log off."""
    global _STATS, _LOG, _RUNNER
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    _STATS = _empty()
    _LOG = {"limit": int(log_rows), "rounds": [], "dropped": 0, "steps": 0} if log_rows > 0 else None
    _RUNNER = runner if log_rows > 0 else None
    orig = RejectionSampler.forward
    if getattr(orig, _MARK, False):
        return

    @functools.wraps(orig)
    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        pred = None
        if _STATS is not None:
            pred = _predicted(metadata, draft_probs, logits, sampling_metadata)
        out = orig(self, metadata, draft_probs, logits, sampling_metadata)
        if pred is not None:
            _record(metadata, pred, out.sampled_token_ids)
        if _LOG is not None:
            from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID

            _log_rounds(metadata, out.sampled_token_ids, PLACEHOLDER_TOKEN_ID,
                        _batch_rows(len(metadata.num_draft_tokens)))
        return out

    setattr(forward, _MARK, True)
    RejectionSampler.forward = forward


def read() -> dict:
    """The counts since :func:`start` (all zero in a process that verified no sampled drafts); with the log on,
    also ``log``: ``{"rounds": [...], "dropped": rows not kept, "limit": ..., "steps": verify batches}``."""
    out = dict(_STATS) if _STATS is not None else _empty()
    if _LOG is not None:
        out["log"] = {**_LOG, "rounds": list(_LOG["rounds"])}
    return out
