"""NIXL producer with pipeline parallelism + MTP: the last stage dies registering its KV caches with NIXL
(`assert num_local_layers > 0 and self.num_regions % num_local_layers == 0`).

Run from the root of a checkout that holds data/models/tiny-mimo (MiMo layout: 4 target layers and one MTP layer),
with stock vLLM 0.32.0 (CPU build) and NIXL installed. One engine, no consumer: a `kv_producer` with
NixlPushConnector (the connector vLLM 0.32 offers for a PP producer pushing to a PP=1 consumer), KV buffer on the
CPU, pipeline parallelism 2, `mtp` with 2 drafts; starts 2 worker processes (multiprocessing executor). The
defect is raised while the engine starts, when each worker registers its KV caches with NIXL: the last stage holds
2 target layers and the MTP layer (3 KV regions), and NIXL divides its regions by 2.
Exit 1: the defect shows (the assertion in a worker); exit 0: the engine starts and generates; exit 2: the engine
failed otherwise.
"""
import os
import socket
import sys

# CPU build: one core list per worker (vLLM's automatic binding refuses more than one worker per NUMA node);
# workers share cores round-robin when there are fewer cores than workers.
cores = sorted(os.sched_getaffinity(0))
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(cores[i % len(cores)]) for i in range(2)))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
# Loopback only: NIXL's side channel (a free port), vLLM's rendezvous, gloo and UCX.
if "VLLM_NIXL_SIDE_CHANNEL_PORT" not in os.environ:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(s.getsockname()[1])
for key, value in {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_HOST_IP": "127.0.0.1",
                   "GLOO_SOCKET_IFNAME": "lo", "UCX_NET_DEVICES": "lo"}.items():
    os.environ.setdefault(key, value)

ASSERTION = "self.num_regions % num_local_layers == 0"


def child() -> int:
    from vllm import LLM, SamplingParams

    # Not enforce_eager: eager PP on the CPU build hits another defect first (no intermediate-tensor buffers on
    # non-first ranks, docs/findings.md#eager-pp-on-cpu-no-intermediate-tensor-buffers).
    llm = LLM(model="data/models/tiny-mimo", dtype="float32", max_model_len=512, pipeline_parallel_size=2,
              distributed_executor_backend="mp", speculative_config={"method": "mtp", "num_speculative_tokens": 2},
              kv_transfer_config={"kv_connector": "NixlPushConnector", "kv_role": "kv_producer",
                                  "kv_buffer_device": "cpu"})
    print("started: every PP stage registered its KV caches with NIXL")
    prompt = [3 + (7 * i) % 2000 for i in range(20)]
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    print(f"ok: {list(out[0].outputs[0].token_ids)}")
    return 0


def main() -> int:
    """The engine runs in a child process whose output (its workers' included) is read back: the AssertionError is
    raised in Worker_PP1 and reaches this process only as "WorkerProc initialization failed"."""
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
        print(f"{worker}: AssertionError: assert num_local_layers > 0 and {ASSERTION}\n  raised at {where}")
        print("defect: the last PP stage's KV regions (2 target layers + the MTP layer) divided by its 2 target "
              "layers")
        return 1
    if proc.returncode == 0 and "ok:" in out:
        print("every stage registered with NIXL (the last one with its MTP layer's region); PP=2 + MTP generated")
        return 0
    print(out[-2000:])
    print(f"the engine failed for another reason (exit {proc.returncode}): not this defect")
    return 2


if __name__ == "__main__":
    sys.exit(child() if "--child" in sys.argv else main())
