"""Whether speculation pays: timed runs (:mod:`~kit.bench.measure`), their tables (:mod:`~kit.bench.table`), the
payoff model (:mod:`~kit.bench.payoff`) and the patches' cost (:mod:`~kit.bench.patch_overhead`).

May import :mod:`kit.core`, :mod:`kit.patches`, :mod:`kit.worker`, :mod:`kit.engine` and :mod:`kit.pd`.
The names below are the public API (``kit.bench.measure_batches``).
"""
import importlib

_API = {"measure_batches": "kit.bench.measure", "measure_pd": "kit.bench.measure",
        "aggregate": "kit.bench.table", "payoff_rows": "kit.bench.table"}
__all__ = sorted(_API)


def __getattr__(name: str):  # lazy (PEP 562), as kit.engine
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'kit.bench' has no attribute {name!r}")
