"""Sync PP + speculative decoding: non-last stages never record the accepted drafts in a request's token history.

Run from the root of a checkout that holds data/models/tiny-mimo (MiMo layout with one MTP layer, trained, so its
drafts are accepted), with stock vLLM 0.32.0 (CPU build). Greedy tokens of pipeline parallelism 2 with `mtp`
(2 drafts) against PP=1 without drafts, engines one after another; the engine core runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), the PP workers are spawned (vLLM's CPU platform forces
spawn) and import this file first, which puts the stand-in below in place there too. Applied first, because they break PP + MTP
before this defect can show: non-last stages get an inert drafter (vLLM PR #46003's guards), and the scheduler
skips a request whose previous step is still in flight (`pp_spec_schedule_gate.md` in this folder).
Exit 1: the defect shows (PP=2 + MTP tokens differ from PP=1); exit 0: they are identical.
"""
# kit repro also off: decode_side_pp_spec_rule
import gc
import os
import sys

cores = sorted(os.sched_getaffinity(0))   # CPU build: one core list per worker, shared round-robin
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(cores[i % len(cores)]) for i in range(2)))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the scheduler runs in this process

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.spec_decode.eagle import EagleProposer  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402


class NoDrafter(EagleProposer):   # prerequisite 1: the runner touches self.drafter on stages that have none
    kv_cache_gid, draft_attn_groups, supports_mm_inputs = 0, [], False

    def __init__(self): pass
    def load_model(self, *a, **k): pass
    def dummy_run(self, *a, **k): pass
    def initialize_attn_backend(self, *a, **k): pass
    def initialize_cudagraph_keys(self, *a, **k): pass
    def validate_same_kv_cache_group(self, *a, **k): pass


orig_init, orig_schedule = GPUModelRunner.__init__, Scheduler.schedule


def runner_init(self, *args, **kwargs):
    orig_init(self, *args, **kwargs)
    if self.speculative_config is not None and not hasattr(self, "drafter"):
        self.drafter = NoDrafter()


def schedule(self, *args, **kwargs):   # prerequisite 2: no request in two steps at once (drafts hidden meanwhile)
    busy = [r for r in self.running if self.use_pp and r.num_in_flight_tokens > 0]
    hidden = [(r, r.spec_token_ids) for r in busy if r.spec_token_ids]
    for r, _ in hidden:
        r.spec_token_ids = []
    try:
        return orig_schedule(self, *args, **kwargs)
    finally:
        for r, drafts in hidden:
            if not r.spec_token_ids and not r.is_finished():
                r.spec_token_ids = drafts


GPUModelRunner.__init__, Scheduler.schedule = runner_init, schedule


PROMPTS = ["def add(a, b):\n    return", "import os\n\ndef main():\n    for name in os.listdir(", "class Stack:\n"]
MTP = dict(pipeline_parallel_size=2, distributed_executor_backend="mp", disable_log_stats=False,
           speculative_config={"method": "mtp", "num_speculative_tokens": 2})


def main() -> int:
    runs = {}
    for name, kw in (("PP=2 mtp:2", MTP), ("PP=1", {})):
        try:
            llm = LLM(model="data/models/tiny-mimo", dtype="float32", max_model_len=512, seed=0, **kw)
        except Exception as e:
            print(f"{name}: the engine did not start ({type(e).__name__}: {e}): not this defect")
            return 2
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=32))
        runs[name] = [list(o.outputs[0].token_ids) for o in outs]
        if kw:   # the defect needs accepted drafts
            acc = [m.value for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_accepted_tokens"]
            print(f"{name}: {acc[0] if acc else 'n/a'} draft tokens accepted")
        del llm
        gc.collect()
    bad = 0
    for j, (ref, got) in enumerate(zip(runs["PP=1"], runs["PP=2 mtp:2"])):
        pos = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
        bad += pos is not None or len(ref) != len(got)
        print(f"prompt {j}: " + ("identical" if pos is None else f"first difference at output position {pos}: "
                                 f"PP=1 {ref[pos:pos + 4]}, PP=2 + MTP {got[pos:pos + 4]}"))
    return 1 if bad else 0


if __name__ == "__main__":   # the spawned workers import this file: only the patches above run there
    sys.exit(main())
