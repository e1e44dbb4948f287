"""PP + enforce_eager on CPU: the first request kills a non-first pipeline stage with
`assert self.intermediate_tensors is not None` (the buffer for the tensors received from the previous stage).

Run from the root of a checkout that holds data/models/tiny-llama-swa-trained (a 4-layer Llama), with stock vLLM
0.32.0 (CPU build). Pipeline parallelism 2, `enforce_eager=True`, no speculative decoding; starts 2 worker processes
(multiprocessing executor). The engine starts; the assertion comes at the first step, in Worker_PP1.
Exit 1: the defect shows (the assertion in a worker); exit 0: generation completes.
"""
import os
import sys

# CPU build: one core list per worker (vLLM's automatic binding refuses more than one worker per NUMA node);
# workers share cores round-robin when there are fewer cores than workers.
cores = sorted(os.sched_getaffinity(0))
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(cores[i % len(cores)]) for i in range(2)))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

ASSERTION = "assert self.intermediate_tensors is not None"


def child() -> int:
    from vllm import LLM, SamplingParams

    llm = LLM(model="data/models/tiny-llama-swa-trained", dtype="float32", max_model_len=512, enforce_eager=True,
              pipeline_parallel_size=2, distributed_executor_backend="mp")
    print("started: engine up (eager, PP=2)")
    prompt = [3 + (7 * i) % 2000 for i in range(20)]
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=8),
                       use_tqdm=False)
    print(f"ok: {list(out[0].outputs[0].token_ids)}")
    return 0


def main() -> int:
    """The engine runs in a child process whose output (its workers' included) is read back: the AssertionError
    has no message, so it reaches this process only as "Worker failed with error ''"; the worker's traceback is
    what names it."""
    import subprocess

    proc = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    lines = out.splitlines()
    print("\n".join(ln for ln in lines if ln.startswith(("started:", "ok:"))))
    hit = next((i for i, ln in enumerate(lines) if ASSERTION in ln), None)
    if hit is not None:   # the assertion and the vLLM frame it is in
        frame = next((ln for ln in reversed(lines[:hit]) if "/vllm/" in ln and ", in " in ln), "")
        where = frame.split("/site-packages/", 1)[-1].replace('", line', ", line").strip()
        worker = next((ln.split()[0].strip("(") for ln in lines[hit:] if "AssertionError" in ln), "")
        print(f"{worker}: AssertionError: {ASSERTION}\n  raised at {where}")
    if hit is not None:
        print("defect: a non-first PP stage has no intermediate-tensor buffer in eager mode")
        return 1
    if proc.returncode == 0 and "ok:" in out:
        return 0
    print(out[-2000:])
    print(f"the engine failed for another reason (exit {proc.returncode}): not this defect")
    return 2


if __name__ == "__main__":
    sys.exit(child() if "--child" in sys.argv else main())
