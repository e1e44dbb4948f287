"""CPU build: the rejection sampler's per-token temperature (and top-k/top-p) is never written.

Needs stock vLLM 0.32.0, CPU build (no Triton backend), and no model: it calls the functions the rejection sampler
calls, after registering the CPU kernel overrides as vLLM's CPU worker does.
Exit 1: the defect shows (the expanded values are not the requests' values); exit 0: it does not.
"""
import sys

import torch

from vllm.platforms import current_platform
from vllm.utils import cpu_triton_utils
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

current_platform.register_triton_kernel_overrides()   # what the CPU worker does at start-up

# Three requests with 1, 2 and 1 draft tokens; request 2 is greedy (temperature 0, replaced by 1 as in
# rejection_sampler.apply_sampling_constraints).
cu_num_draft_tokens = torch.tensor([1, 3, 4], dtype=torch.int32)
temperature = torch.tensor([0.05, 0.8, 0.0], dtype=torch.float32)
top_k = torch.tensor([5, 7, 0], dtype=torch.int32)
expected_t, expected_k = [0.05, 0.8, 0.8, 1.0], [5, 7, 7, 1]

bad = False
# 1. The CPU override itself, into outputs pre-filled with 42: what does it write?
for name, x, want in (("temperature float32", temperature, expected_t), ("top_k int32", top_k, expected_k)):
    out = torch.full((4,), 42, dtype=x.dtype)
    cpu_triton_utils._expand_kernel_impl(out, x, cu_num_draft_tokens, 0, 1)
    ok = torch.allclose(out.double(), torch.tensor(want, dtype=torch.float64))
    bad |= not ok
    print(f"_expand_kernel_impl {name}: {out.tolist()} (expected {want}){'' if ok else '  <- not written'}")

# 2. What the rejection sampler gets as the per-token temperature (fresh new_empty memory when unwritten).
t = expand_batch_to_tokens(temperature, cu_num_draft_tokens, 4, replace_from=0, replace_to=1)
ok = torch.allclose(t, torch.tensor(expected_t))
bad |= not ok
print(f"expand_batch_to_tokens(temperature): {t.tolist()} (expected {expected_t}){'' if ok else '  <- wrong'}")
sys.exit(1 if bad else 0)
