"""The kinds of vLLM process (front end, engine core, worker) and which of them this process runs.

vLLM loads the kit's plugin (:func:`kit.patches.load_plugin`) once in each of its processes; each patch is
applied only where the code it fixes runs. :func:`process_kinds` tells those kinds from who called vLLM's plugin
loader. Only the standard library is imported at module level (this runs at every vLLM process start).
"""
from __future__ import annotations

import os
import sys
from enum import Enum

ENV_EVERYWHERE = "KIT_PATCH_EVERY_PROCESS"  # "1": no process filter (every patch in every process)


class Proc(str, Enum):
    """The kinds of vLLM process, by the code they run."""

    FRONT_END = "front_end"      # builds the VllmConfig: `vllm serve`'s API server or the vllm.LLM process
    ENGINE_CORE = "engine_core"  # the scheduler loop (EngineCore)
    WORKER = "worker"            # one per PP/TP rank: model runner, model code, KV connector worker side


ALL_PROCS = frozenset(Proc)


def loader_caller() -> tuple[str, str, dict] | None:
    """(module, qualname, locals) of the function that called ``vllm.plugins.load_general_plugins``."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "load_general_plugins" and f.f_globals.get("__name__") == "vllm.plugins":
            c = f.f_back
            if c is None:
                return None
            return c.f_globals.get("__name__", "?"), getattr(c.f_code, "co_qualname", c.f_code.co_name), c.f_locals
        f = f.f_back
    return None


def _children_forked() -> bool:
    """Whether vLLM may fork this process's children (they then inherit its patches and never load the
    plugin themselves). vLLM's CPU platform forces spawn before any child starts."""
    return os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "fork") != "spawn"


def process_kinds(caller: tuple[str, str, dict] | None = None) -> tuple[frozenset, str]:
    """The process kinds whose code this process runs, judged from who called vLLM's plugin loader.

    vLLM 0.32 loads general plugins from ``EngineArgs.__post_init__`` (front end), ``EngineCore.__init__``
    (engine core) and ``WorkerWrapperBase.init_worker`` (workers); the process title is no guide (a spawned
    worker still has the spawn command line as its title then). A process also runs the code of the
    processes it holds in-process (a uni-process executor's worker; ``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
    and of those it forks. Any other caller (``kit doctor``, tests, an unknown vLLM path): every kind.
    """
    if os.environ.get(ENV_EVERYWHERE, "") not in ("", "0"):
        return ALL_PROCS, f"{ENV_EVERYWHERE} is set: all process kinds"
    if caller is None:
        return ALL_PROCS, "not called by vLLM's plugin loader: all process kinds"
    module, qualname, local = caller
    where = f"{module}:{qualname}"
    if module == "vllm.v1.worker.worker_base":
        return frozenset({Proc.WORKER}), where
    if module == "vllm.v1.engine.core":
        kinds = {Proc.ENGINE_CORE}
        executor = local.get("executor_class")
        try:
            from vllm.v1.executor.uniproc_executor import UniProcExecutor

            in_process = executor is None or issubclass(executor, UniProcExecutor)
        except Exception:
            in_process = True
        if in_process or _children_forked():
            kinds.add(Proc.WORKER)
        return frozenset(kinds), where + (" (+ workers: in-process or forked)" if Proc.WORKER in kinds else "")
    if module == "vllm.engine.arg_utils":
        import vllm.envs as envs

        if not envs.VLLM_ENABLE_V1_MULTIPROCESSING or _children_forked():
            return ALL_PROCS, where + " (+ engine core and workers: in-process or forked)"
        return frozenset({Proc.FRONT_END}), where
    return ALL_PROCS, where + " (unknown caller: all process kinds)"
