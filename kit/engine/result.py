"""What an engine run returns, and how two runs are compared: :class:`GenerationResult`, :class:`EngineError`,
:func:`first_divergence`. Shared by the child process (which builds results) and the parent side (which reads them)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kit.core.metrics import SpecCounters


class EngineError(RuntimeError):
    """vLLM failed to start or to generate; the message carries the root-cause log lines."""


@dataclass
class GenerationResult:
    """Greedy (or sampled) output of one batch of prompts on one topology."""

    token_ids: list[list[int]]
    texts: list[str]
    prompt_token_ids: list[list[int]]
    spec: SpecCounters
    seconds: float
    # Per prompt, per position: (top-1 token, top-1 logprob, top-2 logprob) when requested.
    top2: list[list[list[float]]] | None = None
    topology: dict = field(default_factory=dict)
    # Scheduler counters over the run (kit.core.metrics.scheduler_counters): preemptions, prefix-cache tokens.
    scheduler: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["spec"] = self.spec.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "GenerationResult":
        d = dict(d)
        d["spec"] = SpecCounters.from_dict(d["spec"])
        return cls(**d)

    @property
    def num_generated(self) -> int:
        return sum(len(t) for t in self.token_ids)


def first_divergence(ref: GenerationResult, got: GenerationResult) -> dict | None:
    """The first (prompt, position) where the tokens differ, with the reference's top-1 minus top-2 margin."""
    for i, (a, b) in enumerate(zip(ref.token_ids, got.token_ids)):
        for j in range(max(len(a), len(b))):
            ta = a[j] if j < len(a) else None
            tb = b[j] if j < len(b) else None
            if ta != tb:
                margin = None
                if ref.top2 and j < len(ref.top2[i]):
                    _, l1, l2 = ref.top2[i][j]
                    margin = l1 - l2
                return {"prompt_index": i, "position": j, "expected": ta, "got": tb, "reference_margin": margin}
    if len(ref.token_ids) != len(got.token_ids):
        return {"prompt_index": min(len(ref.token_ids), len(got.token_ids)), "position": 0,
                "expected": None, "got": None, "reference_margin": None}
    return None
