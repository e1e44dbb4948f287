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
"""
from __future__ import annotations

import functools

_STATS: dict | None = None
_MARK = "__kit_acceptance_probe__"


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


def start() -> None:
    """Install the probe in this process (once) and reset its counts."""
    global _STATS
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    _STATS = _empty()
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
        return out

    setattr(forward, _MARK, True)
    RejectionSampler.forward = forward


def read() -> dict:
    """The counts since :func:`start` (all zero in a process that verified no sampled drafts)."""
    return dict(_STATS) if _STATS is not None else _empty()
