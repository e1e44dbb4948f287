"""Which decoder-layer split balances the PP stages, predicted from one traced run's stage costs.

Under PP the decode period is set by the busiest stage. vLLM splits the decoder layers evenly, but the last stage
also samples and, with speculation, runs the drafter (the MTP layer once per draft), so with drafts it is busier
than the others. From a ``kit bench --timeline`` row of the even split this module estimates a per-layer cost
(stage 0's busy time per step over its layer count: stage 0 holds nothing but its layers and the embedding) and each
stage's extra (its busy time minus its layers at that cost: sampling and drafting on the last stage), and predicts
the split that minimises the busiest stage, with the stage costs it expects. ``kit bench --layer-partition`` runs
that split next to the even one, which checks the prediction on rows it was not made from.
"""
from __future__ import annotations

from kit.core.partition import best_split, even_partition  # noqa: F401 - even_partition: the public name here too


def stage_model(busy_ms: list[float], partition: tuple[int, ...]) -> tuple[float, list[float]]:
    """``(per-layer ms, per-stage extra ms)`` from the stages' busy time per step under ``partition``."""
    if len(busy_ms) != len(partition) or not partition or partition[0] < 1:
        raise ValueError(f"one busy time per stage needed: {busy_ms} for partition {partition}")
    per_layer = busy_ms[0] / partition[0]
    return per_layer, [b - n * per_layer for b, n in zip(busy_ms, partition)]


def balanced_partition(busy_ms: list[float], partition: tuple[int, ...]) -> tuple[tuple[int, ...], list[float]]:
    """The split of the same layers that minimises the busiest stage under :func:`stage_model` (ties: the split
    closest to ``partition``), and the busy time per stage it predicts."""
    per_layer, extra = stage_model(busy_ms, partition)
    best = best_split(sum(partition), per_layer, extra, partition)
    return best, [n * per_layer + e for n, e in zip(best, extra)]


def split_lines(records: list[dict], num_layers: dict[str, int]) -> list[str]:
    """The ``--timeline`` paragraph on layer splits: per even-split PP row (median stage busy times over its engine
    runs) the predicted balanced split and its stage costs, and, where the same run has ``[layers ...]`` rows of
    that split, their measured stage busy times. ``num_layers``: model name -> decoder layers."""
    from statistics import median

    from kit.bench.table import LAYERS_VARIANT, _variant

    groups: dict[tuple, list[list[float]]] = {}
    for r in records:
        st = (r.get("timeline") or {}).get("stages") or []
        v = _variant(r)
        if r.get("pp", 1) < 2 or len(st) != r["pp"] or v is None or (v and not v.startswith(LAYERS_VARIANT)) \
                or "] [" in v:  # a split with a --variant on top ("[layers 5-3] [g3]") is not the split alone
            continue
        part = tuple(int(x) for x in v[len(LAYERS_VARIANT):-1].split("-")) if v else None
        groups.setdefault((r["model"], r["pp"], r["spec"], r.get("batch"), part), []).append(
            [1e3 * s["busy"] for s in st])
    lines = []
    for (model, pp, spec, batch, part), runs in groups.items():
        if part is not None or model not in num_layers:
            continue
        busy = [median(col) for col in zip(*runs)]
        even = even_partition(num_layers[model], pp)
        best, predicted = balanced_partition(busy, even)
        fmt = lambda xs: " / ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        line = (f"| {model} pp{pp} {spec}{f' b{batch}' if batch else ''} | {'-'.join(map(str, even))}: {fmt(busy)} "
                f"| {'-'.join(map(str, best))}: {fmt(predicted)} |")
        measured = groups.get((model, pp, spec, batch, best))
        if best == even:
            line += " (the even split) |"
        else:
            line += f" {fmt([median(col) for col in zip(*measured)])} |" if measured else " not run |"
        lines.append(line)
    if not lines:
        return []
    return ["", "Layer split predicted from the even split's stage busy times (ms per decode step, median over the row's "
            "engines; kit.bench.split): per-layer cost = stage 0's busy time / its layers, each stage's extra = its busy "
            "time minus its layers at that cost (sampling and the drafter on the last stage); the predicted split "
            "minimises the busiest stage. Measured: the same run's `[layers ...]` rows of that split.", "",
            "| row | even split: busy per stage | predicted split: busy per stage | measured busy per stage |",
            "|---|---|---|---|", *lines]
