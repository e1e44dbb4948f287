"""MLA + MTP on the CPU build: a prompt longer than max_num_batched_tokens is never scheduled.

Run from the root of a checkout that holds data/models/tiny-deepseek-v3-trained, with stock vLLM 0.32.0 (CPU build).
Exit 1: the defect shows (the scheduler's budget stayed at 64 and the 100-token prompt made no progress);
exit 0: it does not.
"""
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # step the engine core in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM, SamplingParams  # noqa: E402

MODEL = "data/models/tiny-deepseek-v3-trained"   # DeepseekV3ForCausalLM (MLA) with one MTP layer
STEPS = 200

llm = LLM(model=MODEL, dtype="float32", enforce_eager=True, max_model_len=512, max_num_batched_tokens=64,
          speculative_config={"method": "mtp", "num_speculative_tokens": 1})
sc = llm.llm_engine.vllm_config.scheduler_config
print(f"enable_chunked_prefill={sc.enable_chunked_prefill} max_num_batched_tokens={sc.max_num_batched_tokens} "
      f"max_num_scheduled_tokens={sc.max_num_scheduled_tokens}")

engine = llm.llm_engine
engine.add_request("long", {"prompt_token_ids": list(range(3, 103))},   # 100 tokens > 64
                   SamplingParams(temperature=0.0, max_tokens=4))
finished = None
for step in range(STEPS):
    for out in engine.step():
        if out.finished:
            finished = out
    if finished is not None:
        break

if finished is None:
    print(f"defect: the 100-token prompt was not scheduled in {STEPS} engine steps")
    sys.exit(1)
print(f"ok: finished after {step + 1} steps, tokens {finished.outputs[0].token_ids}")
sys.exit(0)
