"""CPU with AMX: a fresh engine whose first forward is a one-token query dies with SIGILL (AMX without permission).

Run from the root of a checkout that holds data/models/tiny-mimo, with stock vLLM 0.32.0 (CPU build) on Linux on an
x86 CPU with AMX (Intel Sapphire Rapids or later). The engine runs in a child process, in-process there
(VLLM_ENABLE_V1_MULTIPROCESSING=0), because a SIGILL ends the process that runs the worker. enforce_eager with an
explicit KV cache size (VLLM_CPU_KVCACHE_SPACE): vLLM then skips its warm-up forward. bfloat16 and the CPU default
block size 128: vLLM picks the "amx" attention ISA. The first request is a one-token prompt.
Exit 1: the defect shows (the child dies with SIGILL); exit 0: it generates, or this CPU has no AMX (said so).
"""
import os
import signal
import subprocess
import sys

import torch

CHILD = """
from vllm import LLM, SamplingParams
llm = LLM(model="data/models/tiny-mimo", dtype="bfloat16", enforce_eager=True, max_model_len=256)
out = llm.generate([{"prompt_token_ids": [5]}], SamplingParams(temperature=0.0, max_tokens=4))
print("child: generated", list(out[0].outputs[0].token_ids), flush=True)
"""


def has_amx() -> bool:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "amx_tile" in flags and torch.cpu._is_amx_tile_supported()


if not has_amx():
    print("this CPU has no AMX (no amx_tile flag in /proc/cpuinfo, or torch.cpu._is_amx_tile_supported() is False): "
          "vLLM does not take its AMX attention path here, so the defect cannot be shown on this machine")
    sys.exit(0)

env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
child = subprocess.run([sys.executable, "-c", CHILD], env=env, timeout=600)
print(f"\nengine process exit code: {child.returncode}")
if child.returncode == -signal.SIGILL:
    print("defect: the engine died with SIGILL (Illegal instruction) at its first forward, a one-token query")
    sys.exit(1)
if child.returncode != 0:
    print("the engine failed otherwise (not this defect)")
    sys.exit(2)
print("ok: the first forward (a one-token query) ran on the AMX attention path")
sys.exit(0)
