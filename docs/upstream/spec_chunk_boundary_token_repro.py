"""Chunked prefill + MTP: the drafter's input at the end of a prompt chunk is the prompt's last token.

Run from the root of a checkout that holds data/models/tiny-mimo, with stock vLLM 0.32.0.
The two wrappers below only record arguments and results; they change nothing.
Exit 1: the defect shows (some chunk boundary got another token than the one after the chunk); exit 0: it does not.
"""
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the worker runs in this process: observe it here
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402

MODEL = "data/models/tiny-mimo"   # MiMo layout with one MTP layer
seen = []          # (prompt position after the chunk, token given to the drafter, token at that position)
scheduled = {}     # the step's scheduled token counts, by request id

orig_propose = GPUModelRunner.propose_draft_token_ids
orig_padded = SpecDecodeBaseProposer.prepare_next_token_ids_padded


def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
    scheduled.clear()
    scheduled.update(scheduler_output.num_scheduled_tokens)
    return orig_propose(self, scheduler_output, *args, **kwargs)


def prepare_next_token_ids_padded(self, sampled_token_ids, requests, batch, discard_request_mask, *args, **kwargs):
    next_ids, valid = orig_padded(self, sampled_token_ids, requests, batch, discard_request_mask, *args, **kwargs)
    discard = discard_request_mask[:batch.num_reqs].tolist()
    for i, rid in enumerate(batch.req_ids[:batch.num_reqs]):
        state = requests[rid]
        end = state.num_computed_tokens + scheduled.get(rid, 0)   # num_computed_tokens: as of the step's start
        if discard[i] and end < state.num_tokens:                   # a partial prefill
            seen.append((end, int(next_ids[i]), state.get_token_id(end)))
    return next_ids, valid


GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
SpecDecodeBaseProposer.prepare_next_token_ids_padded = prepare_next_token_ids_padded

llm = LLM(model=MODEL, dtype="float32", enforce_eager=True, max_model_len=512, max_num_batched_tokens=64,
          enable_chunked_prefill=True, speculative_config={"method": "mtp", "num_speculative_tokens": 1})
prompt = [3 + (7 * i) % 2000 for i in range(150)]   # 150 tokens: chunks of 64, 64, 22
llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=4))

bad = 0
for end, given, expected in seen:
    ok = given == expected
    bad += not ok
    print(f"chunk ends before prompt position {end}: drafter got token {given}, the token there is {expected}"
          f" (prompt's last token: {prompt[-1]}){'' if ok else '  <- wrong'}")
if not seen:
    print("no partial-prefill step reached the padded drafter batch: nothing observed")
    sys.exit(0)
sys.exit(1 if bad else 0)
