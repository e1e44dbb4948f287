"""CPU cores for vLLM's CPU workers: how many this process may use, and ``VLLM_CPU_OMP_THREADS_BIND`` lists."""
from __future__ import annotations

import os


def cpu_count() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def omp_threads_bind(ranks: int, cores: list[int] | None = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU workers: one ``|``-separated core list per rank.

    Cores are split into contiguous, equal groups; with more ranks than cores, ranks share cores
    round-robin (PP=4 on 2 cores gives ``0|1|0|1``). vLLM's automatic binding refuses more than one
    worker per NUMA node, hence the explicit list.
    """
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if ranks <= 1:
        return core_ranges(cores)
    if ranks >= len(cores):
        return "|".join(str(cores[i % len(cores)]) for i in range(ranks))
    per = len(cores) // ranks
    return "|".join(core_ranges(cores[i * per:(i + 1) * per]) for i in range(ranks))


def core_ranges(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the list form taskset and vLLM take)."""
    out, start, prev = [], None, None
    for c in cores:
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            out.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = c
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(out)
