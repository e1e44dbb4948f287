"""PP + hybrid (Gated-DeltaNet) model: the engine core asserts "Workers disagree on supported KV cache layouts"
at start-up, because a stage without full-attention layers reports other layouts than the stage that has one.

Run from the root of a checkout that holds data/models/tiny-qwen3_5-trained (layers: linear, linear, linear, full),
with stock vLLM 0.32.0 (CPU build). Pipeline parallelism 2: stage 0 holds two linear-attention layers only, stage 1
a linear-attention layer and the full-attention layer. The engine core runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), so its error is caught here; the 2 workers are processes (multiprocessing).
Exit 1: the defect shows (the assertion); exit 0: generation completes; exit 2: the engine failed otherwise.
"""
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the engine core (which resolves the layout) here
# CPU build: one core list per worker (vLLM's automatic binding refuses more than one worker per NUMA node).
cores = sorted(os.sched_getaffinity(0))
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(cores[i % len(cores)]) for i in range(2)))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

ASSERTION = "Workers disagree on supported KV cache layouts"


def main() -> int:
    from vllm import LLM, SamplingParams
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    reported = []   # what each call of the executor's RPC returned (one list per worker); recorded, not changed
    orig = MultiprocExecutor.get_supported_kv_cache_layouts

    def get_supported_kv_cache_layouts(self, *args, **kwargs):
        reported.append(orig(self, *args, **kwargs))
        return reported[-1]

    MultiprocExecutor.get_supported_kv_cache_layouts = get_supported_kv_cache_layouts
    try:
        # Gated-DeltaNet on CPU needs bfloat16. Not enforce_eager: eager PP on the CPU build hits another defect
        # first (no intermediate-tensor buffers on non-first ranks).
        llm = LLM(model="data/models/tiny-qwen3_5-trained", dtype="bfloat16", max_model_len=512,
                  pipeline_parallel_size=2, distributed_executor_backend="mp")
    except AssertionError as e:
        print(f"workers reported: {reported[-1] if reported else '?'}")
        print(f"AssertionError: {e}")
        if ASSERTION in str(e):
            print("defect: the engine core refused the ranks' different lists (no layout shared was looked for)")
            return 1
        return 2
    print(f"workers reported: {reported[-1] if reported else '?'}")
    print(f"resolved KV cache layout: {llm.llm_engine.vllm_config.cache_config.kv_cache_layout}")
    out = llm.generate(["def add(a, b):"], SamplingParams(temperature=0.0, max_tokens=8))
    print(f"ok: {list(out[0].outputs[0].token_ids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
