"""GLM-4 MoE under pipeline parallelism: a stage that holds only the dense first layers fails to build its model
with "RuntimeError: No Glm4MoE layer found in model.layers.".

Run from the root of a checkout that holds data/models/tiny-glm4-moe (4 layers, first_k_dense_replace=1: layer 0
dense, layers 1-3 MoE), with stock vLLM 0.32.0 (CPU build). Dummy weights: the defect is in the model's __init__.
Pipeline parallelism 4 puts layer 0 alone on stage 0. Starts 4 worker processes (multiprocessing executor).
Exit 1: the defect shows (a worker raised it); exit 0: generation completes; exit 2: the engine failed otherwise.
"""
import os
import sys

# CPU build: one core list per worker (vLLM's automatic binding refuses more than one worker per NUMA node);
# workers share cores round-robin when there are fewer cores than workers.
cores = sorted(os.sched_getaffinity(0))
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(cores[i % len(cores)]) for i in range(4)))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

ERROR = "No Glm4MoE layer found in model.layers."


def child() -> int:
    from vllm import LLM, SamplingParams

    # Not enforce_eager: eager PP on the CPU build hits another defect first (no intermediate-tensor buffers on
    # non-first ranks, docs/findings.md#eager-pp-on-cpu-no-intermediate-tensor-buffers).
    llm = LLM(model="data/models/tiny-glm4-moe", load_format="dummy", dtype="float32", max_model_len=512,
              pipeline_parallel_size=4, distributed_executor_backend="mp")
    out = llm.generate([{"prompt_token_ids": [3 + 5 * i for i in range(16)]}],
                       SamplingParams(temperature=0.0, max_tokens=8))
    print(f"ok: {list(out[0].outputs[0].token_ids)}")
    return 0


def main() -> int:
    """The engine runs in a child process whose output (its workers' included) is read back: the error is raised
    in Worker_PP0 and reaches this process only as "WorkerProc initialization failed"."""
    import subprocess

    proc = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    lines = [ln for ln in out.splitlines() if ERROR in ln or ln.startswith("ok:")]
    print("\n".join(lines[-3:]) or out[-2000:])
    if ERROR in out:
        print("defect: a worker refused its stage (stage 0 holds dense layer 0 only, no MoE layer)")
        return 1
    if proc.returncode == 0 and "ok:" in out:
        print("stage 0 (dense layer 0 only) built; PP=4 generated")
        return 0
    print(f"the engine failed for another reason (exit {proc.returncode}): not this defect")
    return 2


if __name__ == "__main__":
    sys.exit(child() if "--child" in sys.argv else main())
