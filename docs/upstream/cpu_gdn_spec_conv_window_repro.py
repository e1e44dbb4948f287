"""CPU build, Gated-DeltaNet (Qwen3.5) + n-gram speculation: a step with fewer than k drafts breaks the conv buffer.

Run from the root of a checkout that holds data/models/tiny-qwen3_5-trained, with stock vLLM 0.32.0 (CPU build, a
CPU without AMX: with AMX or Arm bf16 vLLM takes its C++ conv path when every row has the same length).
A recording wrapper around gdn_attention._spec_forward notes each speculative row's length q and num_accepted
before vLLM's function runs unchanged. Exit 1: the defect shows (the engine dies with the roll's size mismatch);
exit 0: every prompt completes.
"""
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the worker's exception surfaces in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention  # noqa: E402

MODEL = "data/models/tiny-qwen3_5-trained"   # layers: linear (GDN), linear, linear, full attention
K = 2
rows = []   # (q, num_accepted) of each speculative row in each GDN layer call
orig_spec_forward = gdn_attention._spec_forward


def _spec_forward(layer, md, *args, **kwargs):
    n = md.num_spec_decodes
    qsl = md.spec_query_start_loc[: n + 1]
    rows.extend(zip((qsl[1:] - qsl[:-1]).tolist(), md.num_accepted_tokens[:n].tolist()))
    return orig_spec_forward(layer, md, *args, **kwargs)


gdn_attention._spec_forward = _spec_forward   # called through the module's global name

# bfloat16: the CPU GDN kernels require it. n-gram with k = 2: a step carries 0, 1 or 2 drafts per request.
# Prefix caching off: with it vLLM selects mamba cache mode "align", whose Triton pre-copy kernel the CPU build
# cannot launch ("'function' object is not subscriptable"), another defect.
llm = LLM(model=MODEL, dtype="bfloat16", enforce_eager=True, max_model_len=512, enable_prefix_caching=False,
          speculative_config={"method": "ngram", "num_speculative_tokens": K,
                              "prompt_lookup_min": 2, "prompt_lookup_max": 3})
prompts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
           "import os\nimport sys\nimport re\nimport json\n\n\nclass Config:\n    def __init__(self",
           "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\nfor k in"]
err = None
try:
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=40))
except Exception as e:  # noqa: BLE001
    err = e
    while err.__cause__ or err.__context__:   # the engine's own error, below vLLM's wrapper
        if "must match the size" in str(err):
            break
        err = err.__cause__ or err.__context__

short = [(q, a) for q, a in rows if q < 1 + K]
print(f"\nspeculative rows seen: {len(rows)}; shorter than 1 + k = {1 + K}: {len(short)}; "
      f"of those with num_accepted > q: {sum(a > q for q, a in short)}")
if err is not None:
    print(f"{type(err).__name__}: {err}")
    if "must match the size" in str(err):
        print("defect: the conv buffer roll of a short speculative step ran past the buffer")
        sys.exit(1)
    raise err
for o in outs:
    print(f"ok: {len(o.outputs[0].token_ids)} tokens: {o.outputs[0].token_ids[:12]}...")
sys.exit(0)
