"""How the decoder layers are split over the PP stages: vLLM's even split, the split that balances given per-layer
and per-stage costs, and the ``auto`` split the kit picks before any run.

Under PP the decode period is set by the busiest stage. The last stage also samples and, with speculation, runs the
drafter: an MTP layer or an Eagle3 head once per draft token, each pass about one decoder layer of work (measured on
``mimo-py-18m``, PP=2 ``mtp:2``: the last stage's extra was 2.05 layers' worth, docs/results/bench.md, "PP
micro-batches in flight and the layer split"). :func:`auto_partition` moves layers off the last stage by that
count; :mod:`kit.bench.split` predicts the same from a traced run's measured stage costs.
"""
from __future__ import annotations

import itertools


def even_partition(num_layers: int, pp: int) -> tuple[int, ...]:
    """vLLM 0.32's split without ``VLLM_PP_LAYER_PARTITION`` (``vllm.distributed.utils.get_pp_indices``): equal
    shares, one more layer for each of the remainder's stages counted back from the second-to-last."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return tuple(parts)


def best_split(total: int, per_layer: float, extra: list[float], near: tuple[int, ...]) -> tuple[int, ...]:
    """The split of ``total`` layers over ``len(extra)`` stages (at least one each) that minimises the busiest
    stage, a stage costing its layers x ``per_layer`` + its ``extra``; ties go to the split closest to ``near``."""
    pp = len(extra)

    def busiest(p: tuple[int, ...]) -> float:
        return max(n * per_layer + e for n, e in zip(p, extra))

    splits = [tuple(b - a for a, b in zip((0, *cut), (*cut, total)))
              for cut in itertools.combinations(range(1, total), pp - 1)]
    return min(splits, key=lambda p: (round(busiest(p), 9), sum(abs(a - b) for a, b in zip(p, near))))


def auto_partition(num_layers: int, pp: int, drafter_passes: int) -> tuple[int, ...]:
    """The split ``layer_partition="auto"`` picks: every decoder layer one unit of work, the last stage
    ``drafter_passes`` more (its drafter's forward passes per step: k for MTP and Eagle3, 0 for n-gram and no
    speculation); the even split where nothing better exists."""
    even = even_partition(num_layers, pp)
    if pp < 2 or drafter_passes <= 0:
        return even
    return best_split(num_layers, 1.0, [0.0] * (pp - 1) + [float(drafter_passes)], even)
