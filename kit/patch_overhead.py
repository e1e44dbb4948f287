"""What the kit's patches cost on a decode step they have nothing to do for (PP=1, no speculation).

``kit bench --patch-cost`` compares whole engines with the patches on and off; on a shared 2-core machine
that comparison swings by more than the 3% it is meant to check. This measures the cost directly: every patch
wrapper that sits on a per-step path is called on the PP=1 / no-spec branch with the vLLM function it wraps
swapped for a no-op (through the wrapper's closure cell, restored afterwards), so only the wrapper's own work
is timed: its extra Python call and the checks that send it straight to the original.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable


@dataclass
class WrapperCost:
    patch: str
    target: str
    calls_per_step: int
    ns_per_call: float


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _swap_orig(wrapper: Callable, replacement: Callable):
    """The closure cell holding the function ``wrapper`` wraps (``__wrapped__``), and its old contents."""
    orig = wrapper.__wrapped__
    for cell in wrapper.__closure__ or ():
        try:
            if cell.cell_contents is orig:
                cell.cell_contents = replacement
                return cell, orig
        except ValueError:  # an empty cell
            continue
    raise LookupError(f"{wrapper.__qualname__}: no closure cell holds the wrapped function")


def _time(fn: Callable, args: tuple, kwargs: dict, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn(*args, **kwargs)
    return (time.perf_counter_ns() - t0) / n


def _per_step_wrappers(num_layers: int) -> list[tuple[str, Any, str, int, tuple, dict]]:
    """(patch, class, attribute, calls per decode step, args, kwargs) on the PP=1 / no-spec path."""
    import torch
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    sched = SimpleNamespace(use_pp=False, num_spec_tokens=0,
                            scheduler_config=SimpleNamespace(async_scheduling=False))
    runner = SimpleNamespace(speculative_config=None)
    return [
        ("pp_spec_schedule_gate", Scheduler, "schedule", 1, (sched,), {}),
        ("pp_spec_token_history", GPUModelRunner, "_update_states", 1, (runner, None), {}),
        ("eagle3_aux_hidden_states_over_pp", GPUModelRunner, "_model_forward", 1, (runner,), {"input_ids": None}),
        # Once per attention layer; a Llama/Qwen-style layer passes 2-D q/k (the untouched branch).
        ("cpu_rope_layout", RotaryEmbedding, "forward_cpu", num_layers,
         (SimpleNamespace(), torch.zeros(1, dtype=torch.long), torch.zeros(1, 256), torch.zeros(1, 128)), {}),
    ]


def measure(n: int = 200_000, num_layers: int = 4) -> list[WrapperCost]:
    """Apply the selected patches in this process and time each per-step wrapper's own overhead
    (``num_layers``: attention layers per forward, for the per-layer wrappers)."""
    from .patches import apply_selected

    apply_selected()
    out = []
    for patch, cls, attr, calls, args, kwargs in _per_step_wrappers(num_layers):
        wrapper = getattr(cls, attr)
        if not hasattr(wrapper, "__wrapped__"):
            continue  # this patch is not applied here
        cell, orig = _swap_orig(wrapper, _noop)
        try:
            _time(wrapper, args, kwargs, n // 10)  # warm up
            direct = min(_time(_noop, args, kwargs, n) for _ in range(3))
            wrapped = min(_time(wrapper, args, kwargs, n) for _ in range(3))
        finally:
            cell.cell_contents = orig
        out.append(WrapperCost(patch, f"{cls.__name__}.{attr}", calls, max(0.0, wrapped - direct)))
    return out
