"""PP + hybrid (Gated-DeltaNet) model with prefix caching: a stage without linear-attention layers asserts
"no mamba layers in the model" at the first step.

Run from the root of a checkout that holds data/models/tiny-qwen3_5-trained (layers: linear, linear, linear, full),
with stock vLLM 0.32.0 (CPU build). Pipeline parallelism 4 puts only the full-attention layer on the last stage.
Starts 4 worker processes (multiprocessing executor).
Exit 1: the defect shows (the assertion, or the engine dying at its first step); exit 0: generation completes.
"""
import os
import sys

# CPU build: one core list per worker (vLLM's automatic binding refuses more than one worker per NUMA node);
# workers share cores round-robin when there are fewer cores than workers.
cores = sorted(os.sched_getaffinity(0))
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(cores[i % len(cores)]) for i in range(4)))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


ASSERTION = "no mamba layers in the model"


def child() -> int:
    from vllm import LLM, SamplingParams

    # Gated-DeltaNet on CPU needs bfloat16; prefix caching is on by default, which selects mamba_cache_mode "align".
    # Not enforce_eager: eager PP on the CPU build hits another defect first (no intermediate-tensor buffers on
    # non-first ranks, docs/findings.md#eager-pp-on-cpu-no-intermediate-tensor-buffers).
    llm = LLM(model="data/models/tiny-qwen3_5-trained", dtype="bfloat16", max_model_len=512,
              pipeline_parallel_size=4, distributed_executor_backend="mp")
    print(f"mamba_cache_mode={llm.llm_engine.vllm_config.cache_config.mamba_cache_mode}")
    out = llm.generate(["def add(a, b):"], SamplingParams(temperature=0.0, max_tokens=8))
    print(f"ok: {out[0].outputs[0].token_ids}")
    return 0


def main() -> int:
    """The engine runs in a child process whose output (its workers' included) is read back: the assertion is
    raised in Worker_PP3 and reaches this process only as "engine core initialization failed"."""
    import subprocess

    proc = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    lines = [ln for ln in out.splitlines() if ASSERTION in ln or ln.startswith(("ok:", "mamba_cache_mode"))]
    print("\n".join(lines[-3:]) or out[-2000:])
    if ASSERTION in out:
        print(f"defect: a worker asserted '{ASSERTION}' (the last stage holds no linear-attention layer)")
        return 1
    if proc.returncode == 0 and "ok:" in out:
        return 0
    print(f"the engine failed for another reason (exit {proc.returncode}): not this defect")
    return 2


if __name__ == "__main__":
    sys.exit(child() if "--child" in sys.argv else main())
