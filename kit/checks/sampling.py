"""Sampled speculative decoding, checked: acceptance against theory, output distribution against the plain engine.

Two promises of speculative sampling, each measured on real vLLM:

- **Acceptance follows the target**: a draft ``d`` proposed without probabilities is accepted with probability
  ``p(d)``, the target's probability of ``d`` at the request's temperature. :func:`sampled_acceptance` runs one
  engine, greedy and then sampled, and counts per draft position the drafts reached and accepted next to the
  sum of ``p(d)`` recorded in the verifying worker (:mod:`kit.worker.acceptance_probe`). A z-score per position tells
  sampling noise from a defect.
- **Lossless**: the speculative engine's tokens follow the same distribution as the plain engine's at the same
  temperature. :func:`distribution_check` samples every context many times on both engines and compares, per
  context and output position, the two token histograms with a chi-square test of homogeneity (rare tokens pooled
  so each expected cell count is at least 5), Bonferroni-corrected over all (context, position) tests.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from kit.core.metrics import SpecCounters
from kit.core.topology import Topology, TopologyError
from kit.core.validate import check_count, check_temperature
from kit.engine import GenerationResult, run

# |z| above this at any position is a disagreement with theory (two-sided p ~ 6e-5 per position).
Z_LIMIT = 4.0
# Family-wise false-alarm rate of the distribution check (split over its tests).
DISTRIBUTION_ALPHA = 1e-3


@dataclass
class PositionTheory:
    """One draft position: how often it was reached and accepted, and what theory expects."""

    position: int
    reached: int
    accepted: int
    expected: float
    sd: float

    @property
    def z(self) -> float | None:
        if self.reached == 0:
            return None
        if self.sd == 0:
            return 0.0 if abs(self.accepted - self.expected) < 0.5 else math.inf
        return (self.accepted - self.expected) / self.sd

    def to_dict(self) -> dict:
        return {"position": self.position, "reached": self.reached, "accepted": self.accepted,
                "expected": round(self.expected, 2), "sd": round(self.sd, 2),
                "measured_rate": self.accepted / self.reached if self.reached else None,
                "predicted_rate": self.expected / self.reached if self.reached else None,
                "z": None if self.z is None else round(self.z, 2)}


@dataclass
class SampledAcceptance:
    """One engine, the same prompts greedy and sampled: vLLM's counters and the probe's theory per position."""

    topology: Topology
    temperature: float
    seed: int
    greedy: SpecCounters
    sampled: SpecCounters
    positions: list[PositionTheory]
    sampled_result: GenerationResult | None = None

    @property
    def measured_rate(self) -> float | None:
        reached = sum(p.reached for p in self.positions)
        return sum(p.accepted for p in self.positions) / reached if reached else None

    @property
    def predicted_rate(self) -> float | None:
        reached = sum(p.reached for p in self.positions)
        return sum(p.expected for p in self.positions) / reached if reached else None

    @property
    def agrees(self) -> bool:
        """Every reached position within ``Z_LIMIT`` standard deviations of theory (and something was drafted)."""
        zs = [p.z for p in self.positions if p.z is not None]
        return bool(zs) and all(abs(z) <= Z_LIMIT for z in zs)

    @property
    def ratio_to_greedy(self) -> float | None:
        g, s = self.greedy.acceptance_rate, self.sampled.acceptance_rate
        return s / g if g and s is not None else None

    def to_dict(self) -> dict:
        return {"temperature": self.temperature, "seed": self.seed, "agrees_with_theory": self.agrees,
                "z_limit": Z_LIMIT, "measured_rate": self.measured_rate, "predicted_rate": self.predicted_rate,
                "ratio_to_greedy": self.ratio_to_greedy,
                "greedy": self.greedy.to_dict(), "sampled": self.sampled.to_dict(),
                "per_position": [p.to_dict() for p in self.positions],
                "topology": self.topology.describe()}


def _theory(reads: list[dict]) -> list[PositionTheory]:
    """Sum the probe's counts over ranks (only the last rank verifies drafts)."""
    n = max((len(r["reached"]) for r in reads), default=0)
    out = []
    for i in range(n):
        get = lambda key: sum(r[key][i] for r in reads if i < len(r[key]))  # noqa: E731
        out.append(PositionTheory(i, int(get("reached")), int(get("accepted")), float(get("expected")),
                                  math.sqrt(float(get("variance")))))
    return out


def sweep_jobs(prompts: list[str], temperatures: list[float], max_tokens: int = 64, seed: int = 0) -> list[dict]:
    """Runner jobs for one engine: the prompts greedy, then sampled at each temperature with the acceptance probe
    (request i seeded ``seed + i``). Read the results back with :func:`parse_sweep`."""
    for t in temperatures:
        check_temperature(t)
    jobs = [{"kind": "generate", "prompts": list(prompts), "max_tokens": max_tokens}]
    for t in temperatures:
        jobs += [{"kind": "rpc", "method": "kit_probe_start"},
                 {"kind": "generate", "prompts": list(prompts), "max_tokens": max_tokens, "temperature": t,
                  "seed": seed},
                 {"kind": "rpc", "method": "kit_probe_read"}]
    return jobs


def parse_sweep(topology: Topology, temperatures: list[float], job_results: list, seed: int = 0,
                first: int = 0) -> list[SampledAcceptance]:
    """One :class:`SampledAcceptance` per temperature from a run of :func:`sweep_jobs` (starting at job
    ``first`` when other jobs came before them)."""
    jr = job_results[first:]
    greedy = GenerationResult.from_dict(jr[0])
    out = []
    for i, t in enumerate(temperatures):
        sampled = GenerationResult.from_dict(jr[2 + 3 * i])
        out.append(SampledAcceptance(topology, t, seed, greedy.spec, sampled.spec, _theory(jr[3 + 3 * i]),
                                     sampled_result=sampled))
    return out


def sampled_acceptance(topology: Topology, prompts: list[str], temperature: float, seed: int = 0,
                       max_tokens: int = 64, timeout: float = 900.0, env: dict[str, str] | None = None
                       ) -> SampledAcceptance:
    """On one fresh engine: the prompts greedy, then sampled at ``temperature`` (request i seeded ``seed + i``)
    with the acceptance probe on; vLLM's counters for both and the probe's per-position theory."""
    if topology.spec is None:
        raise TopologyError("sampled acceptance needs a drafter: give --spec METHOD:K")
    jobs = sweep_jobs(prompts, [temperature], max_tokens=max_tokens, seed=seed)
    res = run(topology, jobs, timeout=timeout, env=env)
    return parse_sweep(topology, [temperature], res["jobs"], seed=seed)[0]


# -- output distribution -------------------------------------------------------------------------

def chi2_sf(x: float, df: int) -> float:
    """Upper tail of the chi-square distribution (the regularised upper incomplete gamma function)."""
    import torch

    if df <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(x / 2.0, dtype=torch.float64)))


def homogeneity_test(a: Counter, b: Counter, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Chi-square test that two samples of tokens come from one distribution: (statistic, df, p-value).

    Tokens whose pooled count is too small for the test's approximation are merged into one "other" cell (merged
    repeatedly until every expected count is at least ``min_expected``)."""
    na, nb = sum(a.values()), sum(b.values())
    if na == 0 or nb == 0:
        return 0.0, 0, 1.0
    total = na + nb
    need = min_expected * total / min(na, nb)  # pooled count giving expected >= min_expected in both rows
    cells: list[tuple[int, int]] = []
    other = [0, 0]
    for tok in set(a) | set(b):
        ca, cb = a.get(tok, 0), b.get(tok, 0)
        if ca + cb >= need:
            cells.append((ca, cb))
        else:
            other[0] += ca
            other[1] += cb
    if sum(other):
        if sum(other) >= need or not cells:
            cells.append(tuple(other))
        else:  # too small alone: fold it into the smallest kept cell
            cells.sort(key=sum)
            cells[0] = (cells[0][0] + other[0], cells[0][1] + other[1])
    if len(cells) < 2:
        return 0.0, 0, 1.0
    stat = 0.0
    for ca, cb in cells:
        col = ca + cb
        for obs, n in ((ca, na), (cb, nb)):
            exp = n * col / total
            stat += (obs - exp) ** 2 / exp
    df = len(cells) - 1
    return stat, df, chi2_sf(stat, df)


@dataclass
class DistributionCheck:
    """Per (context, position): the chi-square homogeneity test of the two engines' tokens."""

    temperature: float
    samples: int
    tokens: int
    tests: list[dict] = field(default_factory=list)
    alpha: float = DISTRIBUTION_ALPHA

    @property
    def threshold(self) -> float:
        """Bonferroni: each test's p-value must stay above alpha / number of tests."""
        n = sum(1 for t in self.tests if t["df"] > 0)
        return self.alpha / max(n, 1)

    @property
    def min_p(self) -> float:
        return min((t["p"] for t in self.tests if t["df"] > 0), default=1.0)

    @property
    def same_distribution(self) -> bool:
        return self.min_p >= self.threshold

    def to_dict(self) -> dict:
        return {"same_distribution": self.same_distribution, "temperature": self.temperature,
                "samples_per_context": self.samples, "tokens": self.tokens, "alpha": self.alpha,
                "threshold": self.threshold, "min_p": self.min_p,
                "num_tests": sum(1 for t in self.tests if t["df"] > 0), "tests": self.tests}


def _histograms(result: GenerationResult, contexts: int, samples: int, tokens: int) -> list[list[Counter]]:
    """``[context][position]`` token counts; the prompts were ``contexts`` repeated ``samples`` times."""
    out = [[Counter() for _ in range(tokens)] for _ in range(contexts)]
    for i, toks in enumerate(result.token_ids):
        for j, t in enumerate(toks[:tokens]):
            out[i % contexts][j][t] += 1
    return out


def distribution_check(topology: Topology, contexts: list[str], temperature: float, samples: int = 200,
                       tokens: int = 4, seed: int = 0, timeout: float = 900.0, env: dict[str, str] | None = None,
                       plain: GenerationResult | None = None) -> tuple[DistributionCheck, GenerationResult]:
    """Sample each context ``samples`` times (``tokens`` new tokens, every request its own seed) on the plain
    engine (PP=1, no speculation; or ``plain`` when given) and on ``topology``; test per (context, position)
    that the token distributions are the same. Returns the check and the plain run (to reuse)."""
    check_temperature(temperature)
    check_count(samples, "samples", minimum=10)
    check_count(tokens, "tokens")
    prompts = [c for _ in range(samples) for c in contexts]
    job = {"kind": "generate", "prompts": prompts, "max_tokens": tokens, "temperature": temperature}
    if plain is None:
        # Different seeds for the two engines: the test compares distributions, not draws.
        plain = GenerationResult.from_dict(run(topology.reference(), [dict(job, seed=seed)], timeout=timeout,
                                               env=env)["jobs"][0])
    spec = GenerationResult.from_dict(run(topology, [dict(job, seed=seed + len(prompts))], timeout=timeout,
                                          env=env)["jobs"][0])
    ha = _histograms(plain, len(contexts), samples, tokens)
    hb = _histograms(spec, len(contexts), samples, tokens)
    check = DistributionCheck(temperature, samples, tokens)
    for c in range(len(contexts)):
        for j in range(tokens):
            stat, df, p = homogeneity_test(ha[c][j], hb[c][j])
            check.tests.append({"context": c, "position": j, "chi2": round(stat, 2), "df": df, "p": p,
                                "distinct_tokens": len(set(ha[c][j]) | set(hb[c][j]))})
    return check, plain
