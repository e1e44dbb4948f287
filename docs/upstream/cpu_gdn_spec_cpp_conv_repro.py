"""CPU build, Gated-DeltaNet (Qwen3.5): with speculation configured the prompt's prefill convolves on other kernels.

Run from the root of a checkout that holds data/models/tiny-qwen3_5-trained, with stock vLLM 0.32.0 (CPU build) on
an x86 CPU with AVX-512 BF16 and no AMX (e.g. AMD EPYC Zen 4). The same prompt is prefilled by an engine without
speculation and by one with MTP (2 drafts), one after the other; two recording wrappers keep the first Gated-DeltaNet
layer's output of that prefill (no draft is involved yet) and let vLLM's functions run unchanged.
Exit 1: the defect shows (the two prefills differ); exit 0: they are bit-identical.
"""
import gc
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the worker runs in this process: observe it here
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as g  # noqa: E402

MODEL = "data/models/tiny-qwen3_5-trained"   # layers: linear (GDN), linear, linear, full attention; one MTP layer
if not torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
    print("this CPU is not AVX-512 BF16 without AMX: both paths take the same conv kernels here, nothing to show")
    sys.exit(0)
seen = {}   # the first GDN layer call of the first step of generate(): the prompt's prefill


def recording(orig, name):
    def wrapper(layer, md, mixed_qkv, b, a, core_attn_out, *args, **kwargs):
        result = orig(layer, md, mixed_qkv, b, a, core_attn_out, *args, **kwargs)
        if seen.get("on") and "out" not in seen:
            seen.update(out=core_attn_out[: md.num_actual_tokens].clone(), path=name, layer=layer.prefix)
        return result
    return wrapper


g._cpu_gdn_attention_nonspec = recording(g._cpu_gdn_attention_nonspec, "_cpu_gdn_attention_nonspec")
g._cpu_gdn_attention_spec_aware = recording(g._cpu_gdn_attention_spec_aware, "_cpu_gdn_attention_spec_aware")
prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


def run(spec):
    # bfloat16: the CPU GDN kernels require it. Prefix caching off in both engines: with it vLLM selects mamba cache
    # mode "align", whose Triton pre-copy kernel the CPU build cannot launch (another defect).
    extra = {"speculative_config": {"method": "mtp", "num_speculative_tokens": 2}} if spec else {}
    llm = LLM(model=MODEL, dtype="bfloat16", enforce_eager=True, max_model_len=512, enable_prefix_caching=False,
              **extra)
    seen.clear()
    seen["on"] = True
    tokens = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24))[0].outputs[0].token_ids
    seen["on"] = False
    del llm
    gc.collect()
    return dict(seen), list(tokens)


ref, ref_tokens = run(spec=False)
got, got_tokens = run(spec=True)
diff = (ref["out"].float() - got["out"].float()).abs()
print(f"\nprefill of {ref['out'].shape[0]} tokens, {ref['layer']}: no-spec engine via {ref['path']}, "
      f"MTP engine via {got['path']}")
print(f"outputs differ in {int((diff > 0).sum())} of {diff.numel()} elements (max abs difference {diff.max():.3g})")
first = next((i for i, (x, y) in enumerate(zip(ref_tokens, got_tokens)) if x != y), None)
print("greedy tokens: " + ("identical" if first is None else
                           f"first differ at position {first}: {ref_tokens[first]} vs {got_tokens[first]}"))
if torch.equal(ref["out"], got["out"]):
    print("ok: the two engines computed the same prefill")
    sys.exit(0)
print("defect: with speculation configured the prefill ran other conv arithmetic than without it")
sys.exit(1)
