"""PP + MTP, hybrid (Gated-DeltaNet) model: the stages continue linear attention from the first verified token.

Run from the root of a checkout that holds data/models/tiny-qwen3_5-trained (Gated-DeltaNet x3, full attention, MTP).
Greedy tokens of PP=2 + MTP (2 drafts) against PP=1 without drafts, each engine in a child process, one after the
other. On stock vLLM 0.32.0, PP + MTP first needs the fixes listed in pp_spec_hybrid_accepted_count.md (not here).
Exit 1: the defect shows (PP=2 tokens differ from PP=1's); exit 0: identical; 2: an engine failed.
"""
import json
import os
import subprocess
import sys

cores = sorted(os.sched_getaffinity(0))
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(cores[i % len(cores)]) for i in range(2)))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

PROMPTS = ["import os\nimport sys\n\n\ndef main():\n",
           'class Stack:\n    """A simple last-in first-out stack."""\n\n    def __init__(self):\n'
           "        self.items = []\n\n    def push(self, item):\n",
           "def read_lines(path):\n    with open(path) as f:\n",
           "for i in range(10):\n    if i % 2 == 0:\n"]


def child(pp: int) -> int:
    from vllm import LLM, SamplingParams

    # bfloat16: the CPU GDN kernel needs it. With drafts prefix caching off (mamba cache mode "none"; 1 + k slots).
    extra = dict(pipeline_parallel_size=2, distributed_executor_backend="mp", enable_prefix_caching=False,
                 speculative_config={"method": "mtp", "num_speculative_tokens": 2}) if pp == 2 else {}
    llm = LLM(model="data/models/tiny-qwen3_5-trained", dtype="bfloat16", enforce_eager=True, max_model_len=1024,
              seed=0, **extra)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=40))
    print("TOKENS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))
    return 0


def run(pp: int) -> list | None:
    proc = subprocess.run([sys.executable, __file__, "--child", str(pp)], capture_output=True, text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("TOKENS ")), None)
    if line is None:
        out = proc.stdout + proc.stderr   # vLLM logs to stdout
        errors = [ln.split("] ")[-1] for ln in out.splitlines() if "Error: " in ln and "initialization" not in ln]
        print(f"PP={pp} engine failed (exit {proc.returncode}): {errors[0] if errors else out[-1500:]}")
        return None
    return json.loads(line[len("TOKENS "):])


def main() -> int:
    ref, got = run(1), run(2)
    if ref is None or got is None:
        return 2
    bad = 0
    for i, (r, g) in enumerate(zip(ref, got)):
        pos = next((j for j, (a, b) in enumerate(zip(r, g)) if a != b), None)
        if pos is None and len(r) == len(g):
            print(f"prompt {i}: identical ({len(g)} tokens)")
            continue
        bad += 1
        pos = min(len(r), len(g)) if pos is None else pos
        print(f"prompt {i}: position {pos}: PP=1 (no drafts) {r[pos] if pos < len(r) else 'end'}, "
              f"PP=2 + MTP {g[pos] if pos < len(g) else 'end'}  <- wrong")
    if bad:
        print(f"defect: {bad} of {len(ref)} prompts differ at PP=2 + MTP")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(child(int(sys.argv[-1])) if "--child" in sys.argv else main())
