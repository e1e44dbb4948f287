"""Speculative decoding: a fresh one-token prompt admitted while other requests run is padded into a speculative
row (1 + k tokens, k placeholder drafts); on a Gated-DeltaNet model its tokens then go wrong.

Run from the root of a checkout that holds data/models/tiny-qwen3_5-trained (Qwen3.5 layout with an MTP layer,
trained weights), with stock vLLM 0.32.0 (CPU build). The engine runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0): first the reference (no speculation), then `mtp` with 2 drafts and
max_num_seqs=3, so that the one-token prompt "Q" (6th of 8) waits for a slot and joins requests that verify drafts.
A recording wrapper on Scheduler.schedule (it returns what vLLM returns) notes new requests scheduled with drafts.
Exit 1: the defect shows (the fresh prompt got placeholder drafts, or its tokens differ from the reference); exit 0.
"""
import gc
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the scheduler runs in this process: observe it here
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

PROMPTS = ["The history of the printing press begins", "x y z w",
           "Once upon a time in a small village by the sea, there lived an old fisherman who", "Hi there you",
           "def fibonacci(n):\n    ", "Q", "The capital of France is", "a b"]
padded = []   # (request id, computed tokens, scheduled tokens, drafts) of new requests scheduled with drafts
orig_schedule = Scheduler.schedule


def schedule(self, *args, **kwargs):
    out = orig_schedule(self, *args, **kwargs)
    for new in out.scheduled_new_reqs:
        drafts = out.scheduled_spec_decode_tokens.get(new.req_id)
        if drafts and new.num_computed_tokens == 0:
            padded.append((new.req_id, len(new.prompt_token_ids), out.num_scheduled_tokens[new.req_id], drafts))
    return out


Scheduler.schedule = schedule


def generate(**kwargs) -> list[list[int]]:
    # Gated-DeltaNet on CPU needs bfloat16.
    llm = LLM(model="data/models/tiny-qwen3_5-trained", dtype="bfloat16", max_model_len=512, enforce_eager=True,
              **kwargs)
    out = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    del llm
    gc.collect()
    return [list(o.outputs[0].token_ids) for o in out]


def main() -> int:
    try:
        ref = generate()
        padded.clear()
        # Prefix caching off with drafts: its mamba cache mode "align" fails with speculative decoding on CPU
        # (mamba_utils.py), another defect.
        got = generate(max_num_seqs=3, enable_prefix_caching=False,
                       speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    except Exception as e:
        print(f"an engine failed ({type(e).__name__}: {e}): not this defect")
        return 2
    for rid, prompt_len, n, drafts in padded:
        print(f"fresh request {rid} ({prompt_len}-token prompt, 0 computed) scheduled as {n} tokens, drafts {drafts}")
    wrong = 0
    for i, (r, g) in enumerate(zip(ref, got)):
        j = next((j for j, (a, b) in enumerate(zip(r, g)) if a != b), None)
        if j is not None:
            wrong += 1
            print(f"prompt {i} {PROMPTS[i]!r}: position {j}: reference {r[j]}, mtp {g[j]}  (ref {r[:8]}, got {g[:8]})")
    print(f"{len(padded)} fresh request(s) padded with drafts; {wrong} of {len(PROMPTS)} prompts differ from the "
          "reference (no speculation)")
    return 1 if padded or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
