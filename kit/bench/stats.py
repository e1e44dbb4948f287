"""How sure a ``kit bench`` figure is: the bootstrap 95 % percentile interval of a row's median, of a speed-up (the
ratio of two rows' medians), and the rule for claiming a difference (the intervals separate).

A row has a handful of engines (``--repeats``, 5 by default), too few for a normal approximation and spread by a
shared machine's load rather than by a known distribution, hence a percentile bootstrap of the median. The
generator is seeded: the same runs give the same table on every machine and every time they are merged.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["LEVEL", "MIN_ENGINES", "RESAMPLES", "SEED", "Interval", "median_interval", "ratio_interval", "separate"]

# 10 000 resamples put the 2.5th/97.5th percentiles within well under a rounding step of the tables' digits.
RESAMPLES = 10_000
SEED = 0
LEVEL = 0.95
# Fewer engines per row than this give no interval worth the name (one engine: [v, v]): no difference is claimed.
MIN_ENGINES = 3


@dataclass(frozen=True)
class Interval:
    """A point estimate (``median``: a median, or a ratio of medians) and its bootstrap interval ``[lo, hi]``."""

    median: float
    lo: float
    hi: float

    def excludes(self, value: float) -> bool:
        """Whether ``value`` lies outside ``[lo, hi]`` (a speed-up whose interval excludes 1.0 is a difference)."""
        return value < self.lo or value > self.hi

    def to_dict(self) -> dict[str, float]:
        return {"median": self.median, "lo": self.lo, "hi": self.hi}


def _resampled_medians(x: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """The medians of ``resamples`` samples of ``len(x)`` values drawn from ``x`` with replacement."""
    return np.median(x[rng.integers(0, len(x), size=(resamples, len(x)))], axis=1)


def _bounds(stats: np.ndarray, level: float) -> tuple[float, float]:
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(stats, [tail, 100 - tail])
    return float(lo), float(hi)


def _values(values: Sequence[float], what: str) -> np.ndarray:
    x = np.asarray([v for v in values if v is not None], dtype=float)
    if x.size == 0:
        raise ValueError(f"{what}: no values")
    return x


def median_interval(values: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED,
                    level: float = LEVEL) -> Interval:
    """The median of ``values`` (``None`` left out) and the ``level`` percentile interval of the median over
    ``resamples`` bootstrap resamples. One value gives ``[v, v]``: no spread was seen, not none exists."""
    x = _values(values, "median_interval")
    lo, hi = _bounds(_resampled_medians(x, np.random.default_rng(seed), resamples), level)
    return Interval(float(np.median(x)), lo, hi)


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float], resamples: int = RESAMPLES,
                   seed: int = SEED, level: float = LEVEL) -> Interval:
    """``median(numerator) / median(denominator)`` (a speed-up: a row's decode tok/s over its baseline's) and its
    ``level`` percentile interval. Each side is resampled on its own: the two rows' engines are separate runs, not
    pairs (interleaving spreads a drift over both rows, it does not pair one engine with another)."""
    a, b = _values(numerator, "ratio_interval numerator"), _values(denominator, "ratio_interval denominator")
    rng = np.random.default_rng(seed)
    ratios = _resampled_medians(a, rng, resamples) / _resampled_medians(b, rng, resamples)
    lo, hi = _bounds(ratios, level)
    return Interval(float(np.median(a) / np.median(b)), lo, hi)


def separate(a: Interval, b: Interval) -> bool:
    """Whether two intervals do not overlap: only then does the kit claim the two figures differ."""
    return a.hi < b.lo or b.hi < a.lo
