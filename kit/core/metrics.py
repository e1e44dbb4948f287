"""Counters read from vLLM's own metrics, and the figures derived from them.

Two sources: ``LLM.get_metrics()`` in an engine process (:meth:`SpecCounters.from_metrics`) and a server's
``/metrics`` page, parsed with ``prometheus_client``'s text parser (installed with vLLM) for everything
(:func:`parse_prometheus`): speculative decoding, NIXL transfers, prompt-token accounting, the cache config.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families


class Sample(NamedTuple):
    """One sample of a ``/metrics`` page: full sample name (``..._total``, ``..._sum``), labels, value."""

    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a Prometheus text page, flattened over metric families."""
    return [Sample(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples]


def metric_sum(samples: list[Sample], name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels`` (e.g. over engines)."""
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


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
    def from_samples(cls, samples: list[Sample]) -> "SpecCounters":
        """From a parsed ``/metrics`` page (:func:`parse_prometheus`)."""
        pos: dict[int, int] = {}
        for s in samples:
            if s.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                p = int(s.labels["position"])
                pos[p] = pos.get(p, 0) + int(s.value)
        return cls(num_drafts=int(metric_sum(samples, "vllm:spec_decode_num_drafts_total")),
                   num_draft_tokens=int(metric_sum(samples, "vllm:spec_decode_num_draft_tokens_total")),
                   num_accepted_tokens=int(metric_sum(samples, "vllm:spec_decode_num_accepted_tokens_total")),
                   per_position=[pos[i] for i in sorted(pos)])

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


@dataclass
class Counters:
    """A server's NIXL transfer and prompt-accounting counters, or a difference of two readings.

    NIXL's own metrics: ``vllm:nixl_bytes_transferred`` (histogram: ``_sum`` bytes, ``_count`` transfers),
    ``vllm:nixl_num_descriptors``, ``vllm:nixl_num_failed_transfers``, ``vllm:nixl_num_kv_expired_reqs``; the
    prompt tokens by source (``local_compute`` | ``external_kv_transfer`` | ``local_cache_hit``).
    """

    nixl_bytes: float = 0
    nixl_transfers: float = 0
    nixl_descriptors: float = 0
    nixl_failed: float = 0
    nixl_expired: float = 0
    prompt_tokens: float = 0
    local_compute: float = 0
    local_cache_hit: float = 0
    external_kv_transfer: float = 0
    requests_ok: float = 0
    spec: SpecCounters = field(default_factory=SpecCounters)

    @classmethod
    def from_text(cls, text: str) -> "Counters":
        s = parse_prometheus(text)
        src = "vllm:prompt_tokens_by_source_total"
        return cls(
            nixl_bytes=metric_sum(s, "vllm:nixl_bytes_transferred_sum"),
            nixl_transfers=metric_sum(s, "vllm:nixl_bytes_transferred_count"),
            nixl_descriptors=metric_sum(s, "vllm:nixl_num_descriptors_sum"),
            nixl_failed=metric_sum(s, "vllm:nixl_num_failed_transfers_total"),
            nixl_expired=metric_sum(s, "vllm:nixl_num_kv_expired_reqs_total"),
            prompt_tokens=metric_sum(s, "vllm:prompt_tokens_total"),
            local_compute=metric_sum(s, src, source="local_compute"),
            local_cache_hit=metric_sum(s, src, source="local_cache_hit"),
            external_kv_transfer=metric_sum(s, src, source="external_kv_transfer"),
            requests_ok=metric_sum(s, "vllm:request_success_total"),
            spec=SpecCounters.from_samples(s),
        )

    def __sub__(self, o: "Counters") -> "Counters":
        kw = {k: getattr(self, k) - getattr(o, k) for k in self.__dataclass_fields__ if k != "spec"}
        return Counters(**kw, spec=self.spec - o.spec)

    def to_dict(self) -> dict:
        d = {k: int(v) for k, v in asdict(self).items() if k != "spec"}
        d["spec"] = self.spec.to_dict()
        return d


# The scheduler's own counters that say which traffic a run met (``LLM.get_metrics()`` names; token counts for the
# prefix cache).
SCHEDULER_COUNTERS = {"preemptions": "vllm:num_preemptions", "prefix_cache_queries": "vllm:prefix_cache_queries",
                      "prefix_cache_hits": "vllm:prefix_cache_hits"}


def scheduler_counters(metrics) -> dict[str, int]:
    """Preemptions and prefix-cache queried/hit tokens from ``LLM.get_metrics()``, summed over label sets."""
    out = dict.fromkeys(SCHEDULER_COUNTERS, 0)
    names = {v: k for k, v in SCHEDULER_COUNTERS.items()}
    for m in metrics:
        key = names.get(getattr(m, "name", ""))
        if key is not None:
            out[key] += int(getattr(m, "value", 0) or 0)
    return out


def block_size_from_metrics(text: str) -> int | None:
    """The KV cache block size from ``vllm:cache_config_info``, or None when the page lacks it."""
    for s in parse_prometheus(text):
        if s.name == "vllm:cache_config_info" and s.labels.get("block_size"):
            return int(s.labels["block_size"])
    return None
