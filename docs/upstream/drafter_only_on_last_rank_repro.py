"""PP + MTP/EAGLE: workers on non-last pipeline stages touch `self.drafter`, which only the last stage creates.

Run from the root of a checkout that holds data/models/tiny-mimo (MiMo layout with one MTP layer), with stock vLLM
0.32.0 (CPU build). Pipeline parallelism 2 with `mtp`, 1 draft; starts 2 worker processes (multiprocessing executor).
Exit 1: the defect shows (a worker raises AttributeError on `drafter`); exit 0: the engine starts and generates.
"""
import os
import sys

# CPU build: one core list per worker (vLLM's automatic binding refuses more than one worker per NUMA node);
# workers share cores round-robin when there are fewer cores than workers.
cores = sorted(os.sched_getaffinity(0))
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(cores[i % len(cores)]) for i in range(2)))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

ERROR = "object has no attribute 'drafter'"


def child() -> int:
    from vllm import LLM, SamplingParams

    # Not enforce_eager: eager PP on the CPU build hits another defect first (no intermediate-tensor buffers on
    # non-first ranks, docs/findings.md#eager-pp-on-cpu-no-intermediate-tensor-buffers).
    llm = LLM(model="data/models/tiny-mimo", dtype="float32", max_model_len=512, pipeline_parallel_size=2,
              distributed_executor_backend="mp", speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    prompt = [3 + (7 * i) % 2000 for i in range(20)]
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=8))
    print(f"ok: {list(out[0].outputs[0].token_ids)}")
    return 0


def main() -> int:
    """The engine runs in a child process whose output (its workers' included) is read back: the AttributeError is
    raised in the non-last stage's worker and reaches this process only as "engine core initialization failed"."""
    import subprocess

    proc = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    lines = out.splitlines()
    hit = next((i for i, ln in enumerate(lines) if "AttributeError" in ln and ERROR in ln), None)
    if hit is not None:   # the worker's error and the innermost vLLM frame above it
        frame = next((ln for ln in reversed(lines[:hit]) if "/vllm/" in ln and ", in " in ln), "")
        where = frame.split("/site-packages/", 1)[-1].replace('", line', ", line").strip()
        print(f"{lines[hit].split('] ')[-1]}\n  raised at {where}")
    print("\n".join(ln for ln in lines if ln.startswith("ok:")) or ("" if hit is not None else out[-2000:]))
    if ERROR in out:
        print("defect: a worker without a drafter (not the last PP stage) used self.drafter")
        return 1
    if proc.returncode == 0 and "ok:" in out:
        return 0
    print(f"the engine failed for another reason (exit {proc.returncode}): not this defect")
    return 2


if __name__ == "__main__":
    sys.exit(child() if "--child" in sys.argv else main())
