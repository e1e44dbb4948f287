"""Eagle3 + PP (V1 runner): aux hidden states of an earlier stage never reach the last stage ("Missing aux_...").

Run from the root of a checkout that holds data/models/tiny-llama-swa-trained (4-layer Llama) and its Eagle3 drafter
data/models/tiny-llama-swa-trained-eagle3 (aux layers 1, 2, 3), with stock vLLM 0.32.0 (CPU build, V1 runner).
Pipeline parallelism 2: aux layers 1 and 2 are outputs of stage 0, layer 3 of stage 1. The engine core runs in this
process (VLLM_ENABLE_V1_MULTIPROCESSING=0); the 2 workers are spawned and import this file first, which puts the
stand-in below in place there too. Applied first (another defect, vLLM PR #46003): non-last stages get an inert
drafter, otherwise PP + Eagle3 fails earlier with AttributeError 'drafter'.
Exit 1: the defect shows (the engine fails with the missing aux hidden states); exit 0: it starts and generates.
"""
import os
import re
import sys

cores = sorted(os.sched_getaffinity(0))   # CPU build: one core list per worker, shared round-robin
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(cores[i % len(cores)]) for i in range(2)))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the worker's error is raised in this process

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.v1.spec_decode.eagle import EagleProposer  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402

MISSING = "Missing aux_hidden_states_"


class NoDrafter(EagleProposer):   # prerequisite: the runner touches self.drafter on stages that have none
    kv_cache_gid, draft_attn_groups, supports_mm_inputs = 0, [], False

    def __init__(self): pass
    def load_model(self, *a, **k): pass
    def dummy_run(self, *a, **k): pass
    def initialize_attn_backend(self, *a, **k): pass
    def initialize_cudagraph_keys(self, *a, **k): pass
    def validate_same_kv_cache_group(self, *a, **k): pass


orig_init = GPUModelRunner.__init__


def runner_init(self, *args, **kwargs):
    orig_init(self, *args, **kwargs)
    if self.speculative_config is not None and not hasattr(self, "drafter"):
        self.drafter = NoDrafter()


GPUModelRunner.__init__ = runner_init


def main() -> int:
    # Not enforce_eager: eager PP on CPU hits another defect first (docs/upstream/eager_pp_intermediate_buffers.md).
    try:
        llm = LLM(model="data/models/tiny-llama-swa-trained", dtype="float32", max_model_len=512,
                  pipeline_parallel_size=2, distributed_executor_backend="mp",
                  speculative_config={"method": "eagle3", "model": "data/models/tiny-llama-swa-trained-eagle3",
                                      "num_speculative_tokens": 2})
        prompt = [3 + (7 * i) % 2000 for i in range(20)]
        out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    except Exception as e:   # "Worker failed with error '<the worker's error and traceback>'"
        hit = re.search(MISSING + r"\d+ from PP intermediate tensors: \[[^\]]*\]", str(e))
        print(f"{type(e).__name__}: {hit.group(0) if hit else str(e)[:300]}")
        if hit:
            print("defect: the last stage did not receive the aux hidden states of the earlier stage")
            return 1
        print("the engine failed for another reason: not this defect")
        return 2
    print(f"ok: PP=2 + eagle3 generated {list(out[0].outputs[0].token_ids)}")
    return 0


if __name__ == "__main__":   # the spawned workers import this file: only the patches above run there
    sys.exit(main())
