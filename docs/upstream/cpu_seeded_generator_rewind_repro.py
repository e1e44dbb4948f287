"""CPU build: a seeded request whose prompt is prefilled in chunks kills the engine ("CPU Generator does not use
offset").

Run from the root of a checkout that holds data/models/tiny-mimo, with stock vLLM 0.32.0 (CPU build).
Exit 1: the defect shows (the error above); exit 0: the request completes.
"""
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the worker's exception surfaces in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM, SamplingParams  # noqa: E402

MODEL = "data/models/tiny-mimo"
# The settings of the run that showed it: MTP with one draft, a 64-token budget, temperature 0.8, seeded requests.
llm = LLM(model=MODEL, dtype="float32", enforce_eager=True, max_model_len=512, max_num_batched_tokens=64,
          enable_chunked_prefill=True, speculative_config={"method": "mtp", "num_speculative_tokens": 1})
prompt = [3 + (7 * i) % 2000 for i in range(100)]   # 100 tokens: prefilled in two steps
params = SamplingParams(temperature=0.8, seed=0, max_tokens=8)


def chain(e):
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


try:
    out = llm.generate([{"prompt_token_ids": prompt}], params)
except Exception as e:  # noqa: BLE001
    msgs = [f"{type(x).__name__}: {x}" for x in chain(e)]
    print("\n".join(msgs))
    if any("does not use offset" in m for m in msgs):
        print("defect: the seeded request's generator was rewound by offset on CPU")
        sys.exit(1)
    raise
print(f"ok: {out[0].outputs[0].token_ids}")
sys.exit(0)
