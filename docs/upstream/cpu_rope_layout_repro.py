"""CPU build, MLA (DeepSeek-V3): the rotary kernel mis-rotates MLA's 3-D, strided q_pe and k_pe.

Run from the root of a checkout that holds data/models/tiny-deepseek-v3-trained, with stock vLLM 0.32.0 (CPU build).
A recording wrapper around RotaryEmbedding.forward_cpu computes vLLM's own PyTorch reference
(RotaryEmbedding.forward_static) on copies of each call's inputs, then lets vLLM's forward_cpu run unchanged and
compares. Exit 1: the defect shows (some call's query or key differs from the reference, or the kernel wrote outside
the key/query views); exit 0: every call matches.
"""
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the worker runs in this process: observe it here
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding  # noqa: E402

MODEL = "data/models/tiny-deepseek-v3-trained"   # DeepSeek-V3 layout (MLA, rope on 64 of each head's dims)
seen = []    # per call: (query shape, query strides, key shape, key strides, query error, key error, outside written)
orig_forward_cpu = RotaryEmbedding.forward_cpu


def storage_snapshot(views):
    """Per storage under the views: the whole storage (flat), a copy of it, and a mask of the elements outside
    every view. The storage, not t._base: views made under inference mode do not record their base."""
    snaps = {}
    for t in views:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in snaps:
            flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())
            snaps[ptr] = (flat, flat.clone(), torch.ones(flat.shape, dtype=torch.bool))
        snaps[ptr][2].as_strided(t.shape, t.stride(), t.storage_offset()).fill_(False)
    return snaps.values()


def forward_cpu(self, positions, query, key=None):
    want_q, want_k = self.forward_static(positions, query.clone(), None if key is None else key.clone(),
                                         self.head_size, self.rotary_dim, self.cos_sin_cache, self.is_neox_style)
    snaps = storage_snapshot([t for t in (query, key) if t is not None])
    out = orig_forward_cpu(self, positions, query, key)
    q_err = (query - want_q.view(query.shape)).abs().max().item()
    k_err = 0.0 if key is None else (key - want_k.view(key.shape)).abs().max().item()
    outside = sum(int((flat[m] != before[m]).sum()) for flat, before, m in snaps)
    seen.append((tuple(query.shape), query.stride(), None if key is None else tuple(key.shape),
                 None if key is None else key.stride(), q_err, k_err, outside))
    return out


RotaryEmbedding.forward_cpu = forward_cpu   # before the model is built: CustomOp binds forward_cpu at __init__

# enforce_eager: the custom op (ops.rotary_embedding) runs; compiled, vLLM would pick another implementation.
llm = LLM(model=MODEL, dtype="float32", enforce_eager=True, max_model_len=512)
out = llm.generate(["def fibonacci(n):\n    "], SamplingParams(temperature=0.0, max_tokens=4))
print(f"generated: {out[0].outputs[0].token_ids}")

bad = [s for s in seen if s[4] > 1e-4 or s[5] > 1e-4 or s[6]]
for qs, qst, ks, kst, q_err, k_err, outside in (bad or seen)[:3]:
    print(f"query {qs} strides {qst}, key {ks} strides {kst}: max |query - reference| {q_err:.3g}, "
          f"max |key - reference| {k_err:.3g}, elements written outside the views: {outside}")
print(f"{len(bad)} of {len(seen)} rotary calls differ from RotaryEmbedding.forward_static")
if not seen:
    print("forward_cpu was never called: nothing observed")
sys.exit(1 if bad else 0)
