"""Sync PP + speculative decoding: the scheduler schedules a request again while its previous step is in flight.

Run from the root of a checkout that holds data/models/tiny-mimo (MiMo layout with one MTP layer), with stock vLLM
0.32.0 (CPU build). Pipeline parallelism 2 with `mtp`, 2 drafts; the engine core runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), the 2 workers are spawned (vLLM's CPU platform forces spawn) and import this file
first, which puts the stand-in below in place there too. Applied first (another defect, vLLM PR
#46003): non-last stages get an inert drafter, otherwise PP + MTP does not start. The schedule wrapper only records.
Exit 1: the defect shows (a request in flight was scheduled again with drafts); exit 0: it does not.
"""
# kit repro also off: decode_side_pp_spec_rule, pp_microbatches
import os
import sys

cores = sorted(os.sched_getaffinity(0))   # CPU build: one core list per worker, shared round-robin
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(cores[i % len(cores)]) for i in range(2)))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the scheduler runs in this process: observe it here

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.spec_decode.eagle import EagleProposer  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402


class NoDrafter(EagleProposer):   # prerequisite: the runner touches self.drafter on stages that have none
    kv_cache_gid, draft_attn_groups, supports_mm_inputs = 0, [], False

    def __init__(self): pass
    def load_model(self, *a, **k): pass
    def dummy_run(self, *a, **k): pass
    def initialize_attn_backend(self, *a, **k): pass
    def initialize_cudagraph_keys(self, *a, **k): pass
    def validate_same_kv_cache_group(self, *a, **k): pass


orig_init, orig_schedule = GPUModelRunner.__init__, Scheduler.schedule
twice = []   # (step, request id, tokens in flight, drafts scheduled)
steps = [0]


def runner_init(self, *args, **kwargs):
    orig_init(self, *args, **kwargs)
    if self.speculative_config is not None and not hasattr(self, "drafter"):
        self.drafter = NoDrafter()


def schedule(self, *args, **kwargs):
    in_flight = {r.request_id: r.num_in_flight_tokens for r in self.running if r.num_in_flight_tokens > 0}
    out = orig_schedule(self, *args, **kwargs)
    steps[0] += 1
    for rid, drafts in out.scheduled_spec_decode_tokens.items():
        if rid in in_flight:
            twice.append((steps[0], rid, in_flight[rid], list(drafts)))
    return out


GPUModelRunner.__init__, Scheduler.schedule = runner_init, schedule


def main() -> int:
    try:
        llm = LLM(model="data/models/tiny-mimo", dtype="float32", max_model_len=512, pipeline_parallel_size=2,
                  distributed_executor_backend="mp", speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    except Exception as e:
        print(f"the engine did not start ({type(e).__name__}: {e}): not this defect")
        return 2
    prompts = [[3 + (7 * i + 11 * j) % 2000 for i in range(24)] for j in range(2)]
    try:
        out = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0.0, max_tokens=8))
        for j, o in enumerate(out):
            print(f"prompt {j}: tokens {list(o.outputs[0].token_ids)}")
    except Exception as e:   # with one request the worker raises IndexError (negative logits index)
        print(f"generate raised {type(e).__name__}: {e}")
    for step, rid, n, drafts in twice[:4]:
        print(f"schedule #{step}: request {rid} scheduled with drafts {drafts} while {n} of its tokens were in flight")
    print(f"{len(twice)} request(s) scheduled again while in flight, {steps[0]} schedules")
    return 1 if twice else 0


if __name__ == "__main__":   # the spawned workers import this file: only the patches above run there
    sys.exit(main())
