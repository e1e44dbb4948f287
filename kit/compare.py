"""Correctness as a measurement: a topology's greedy tokens against the PP=1, no-spec reference."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .engine import GenerationResult, generate
from .models import PROMPTS_DIR
from .topology import Topology, TopologyError

DEFAULT_PROMPTS = PROMPTS_DIR / "default.jsonl"


def load_prompts(path: str | Path | None = None, limit: int | None = None) -> list[str]:
    """Prompts from a JSONL file, one ``{"prompt": "..."}`` per line (default: ``data/prompts/default.jsonl``)."""
    p = Path(path) if path else DEFAULT_PROMPTS
    if not p.is_file():
        raise TopologyError(f"prompt file {p} does not exist")
    prompts = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TopologyError(f"{p}:{n}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise TopologyError(f'{p}:{n}: expected {{"prompt": "<non-empty text>"}}')
        prompts.append(obj["prompt"])
    if not prompts:
        raise TopologyError(f"{p} holds no prompts")
    return prompts[:limit] if limit else prompts


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


@dataclass
class Comparison:
    topology: Topology
    reference: GenerationResult
    result: GenerationResult

    @property
    def divergence(self) -> dict | None:
        return first_divergence(self.reference, self.result)

    @property
    def identical(self) -> bool:
        return self.divergence is None

    def to_dict(self) -> dict:
        s = self.result.spec
        return {
            "identical": self.identical,
            "num_prompts": len(self.reference.token_ids),
            "num_tokens": self.reference.num_generated,
            "first_divergence": self.divergence,
            "acceptance": {"num_drafts": s.num_drafts, "num_draft_tokens": s.num_draft_tokens,
                           "num_accepted_tokens": s.num_accepted_tokens, "per_position": s.per_position,
                           "mean_acceptance_length": s.mean_acceptance_length},
            "topology": self.topology.describe(),
            "reference_topology": self.topology.reference().describe(),
            "seconds": {"reference": self.reference.seconds, "run": self.result.seconds,
                        "reference_start": self.reference.topology.get("start_seconds"),
                        "run_start": self.result.topology.get("start_seconds")},
        }


def compare(topology: Topology, prompts: list[str], max_tokens: int = 32, timeout: float = 900.0,
            env: dict[str, str] | None = None, reference: GenerationResult | None = None) -> Comparison:
    """Run the reference (unless given) and ``topology`` on the same prompts, greedy; compare tokens."""
    if reference is None:
        reference = generate(topology.reference(), prompts, max_tokens=max_tokens, top2=True, timeout=timeout, env=env)
    result = generate(topology, prompts, max_tokens=max_tokens, timeout=timeout, env=env)
    return Comparison(topology, reference, result)
