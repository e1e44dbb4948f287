"""Speculative-decoding counters read from vLLM's own metrics, and the figures derived from them."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SpecCounters:
    """vLLM's ``vllm:spec_decode_*`` counters (or their difference between two readings)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    per_position: list[int] = field(default_factory=list)

    @classmethod
    def from_metrics(cls, metrics) -> "SpecCounters":
        """From ``LLM.get_metrics()`` (summed over label sets, e.g. engines)."""
        c = cls()
        for m in metrics:
            name = getattr(m, "name", "")
            if name == "vllm:spec_decode_num_drafts":
                c.num_drafts += int(m.value)
            elif name == "vllm:spec_decode_num_draft_tokens":
                c.num_draft_tokens += int(m.value)
            elif name == "vllm:spec_decode_num_accepted_tokens":
                c.num_accepted_tokens += int(m.value)
            elif name == "vllm:spec_decode_num_accepted_tokens_per_pos":
                vals = list(m.values)
                if len(vals) > len(c.per_position):
                    c.per_position += [0] * (len(vals) - len(c.per_position))
                for i, v in enumerate(vals):
                    c.per_position[i] += int(v)
        return c

    @classmethod
    def from_prometheus_text(cls, text: str) -> "SpecCounters":
        """From a server's ``/metrics`` page."""
        c = cls()
        pos: dict[int, int] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            try:
                v = int(float(value))
            except ValueError:
                continue
            if name == "vllm:spec_decode_num_drafts_total":
                c.num_drafts += v
            elif name == "vllm:spec_decode_num_draft_tokens_total":
                c.num_draft_tokens += v
            elif name == "vllm:spec_decode_num_accepted_tokens_total":
                c.num_accepted_tokens += v
            elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                p = int(name_labels.split('position="', 1)[1].split('"', 1)[0])
                pos[p] = pos.get(p, 0) + v
        c.per_position = [pos[i] for i in sorted(pos)]
        return c

    def __sub__(self, other: "SpecCounters") -> "SpecCounters":
        n = max(len(self.per_position), len(other.per_position))
        a = self.per_position + [0] * (n - len(self.per_position))
        b = other.per_position + [0] * (n - len(other.per_position))
        return SpecCounters(self.num_drafts - other.num_drafts, self.num_draft_tokens - other.num_draft_tokens,
                            self.num_accepted_tokens - other.num_accepted_tokens, [x - y for x, y in zip(a, b)])

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def per_position_rate(self) -> list[float]:
        return [x / self.num_drafts for x in self.per_position] if self.num_drafts else []

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens produced per target forward for drafted steps: 1 + accepted / drafts."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["acceptance_rate"] = self.acceptance_rate
        d["mean_acceptance_length"] = self.mean_acceptance_length
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SpecCounters":
        return cls(d["num_drafts"], d["num_draft_tokens"], d["num_accepted_tokens"], list(d["per_position"]))
