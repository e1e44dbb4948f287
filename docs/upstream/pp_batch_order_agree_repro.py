"""PP + hybrid (Gated-DeltaNet) model: pipeline stages reorder a step's requests differently (each with its own
reorder_batch_threshold), so in a step that mixes new prompts with decodes a stage reads other requests' hidden states.

Run from the root of a checkout that holds data/models/tiny-qwen3_5-trained (layers: linear, linear, linear, full;
one MTP layer), with stock vLLM 0.32.0 (CPU build). Two engines, one after another, each in a child process: the
reference (PP=1, no speculation), then PP=4 with `mtp` (2 drafts) and max_num_seqs=3, so that prompts enter while
others decode. PP=4 puts one layer on each stage: stages 0-2 hold a Gated-DeltaNet layer, stage 3 the
full-attention layer. The PP child starts 4 worker processes (multiprocessing executor) and reads each worker's
reorder_batch_threshold (collective_rpc).
Exit 1: the defect shows (PP=4 tokens differ from the reference); exit 0: identical; exit 2: an engine failed.
"""
import json
import os
import subprocess
import sys

PROMPTS = ["import os\nimport sys\n\n\ndef main():\n",
           'class Stack:\n    """A simple last-in first-out stack."""\n\n    def __init__(self):\n'
           "        self.items = []\n\n    def push(self, item):\n",
           "def read_lines(path):\n    with open(path) as f:\n", "for i in range(10):\n    if i % 2 == 0:\n",
           "def is_prime(n):\n    if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n",
           'import json\n\n\ndef load_config(filename):\n    """Return the settings stored in *filename*."""\n',
           "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
           "    def __repr__(self):\n", "try:\n    value = int(text)\nexcept ValueError:\n"]


def child(pp: int) -> None:
    cores = sorted(os.sched_getaffinity(0))   # CPU build: one core list per worker, shared round-robin
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(cores[i % len(cores)]) for i in range(pp)))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # The engine core runs in its own process (vLLM's default; with it in this process the schedule did not mix
    # prefills with decodes here). Reading each worker's threshold through it needs a pickled function.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from vllm import LLM, SamplingParams

    # Gated-DeltaNet on CPU needs bfloat16. Both engines eager (compiled PP=4 and PP=1 were not token-identical here,
    # not traced); eager PP on the CPU build needs the fix for non-first ranks' intermediate-tensor buffers.
    # Prefix caching off with drafts: its mamba cache mode "align" fails with drafts on CPU (mamba_utils.py).
    kw = dict(pipeline_parallel_size=4, distributed_executor_backend="mp", max_num_seqs=3, enable_prefix_caching=False,
              speculative_config={"method": "mtp", "num_speculative_tokens": 2}) if pp > 1 else {}
    llm = LLM(model="data/models/tiny-qwen3_5-trained", dtype="bfloat16", max_model_len=1024, enforce_eager=True,
              **kw)
    if pp > 1:
        print("THRESHOLDS", llm.collective_rpc(lambda w: w.model_runner.reorder_batch_threshold), flush=True)
    # Prompts 0 and 1 stop after their prefill: prompts 3 and 4 take their rows (0, 1) in the step where prompt 2
    # (row 2) verifies its drafts, a step mixing prefills with a decode that the GDN stages reorder.
    params = [SamplingParams(temperature=0.0, max_tokens=1 if i < 2 else 40, ignore_eos=True) for i in range(8)]
    out = llm.generate(PROMPTS, params, use_tqdm=False)
    print("TOKENS", json.dumps([list(o.outputs[0].token_ids) for o in out]), flush=True)


def run(pp: int):
    proc = subprocess.run([sys.executable, __file__, "--child", str(pp)], capture_output=True, text=True)
    lines = dict(ln.split(" ", 1) for ln in proc.stdout.splitlines() if ln.startswith(("TOKENS ", "THRESHOLDS ")))
    if "TOKENS" not in lines:
        print(f"the PP={pp} engine failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return lines


def main() -> int:
    ref, got = run(1), run(4)
    if "TOKENS" not in ref or "TOKENS" not in got:
        return 2
    print(f"reorder_batch_threshold per PP rank: {got['THRESHOLDS']}")
    ref, got = json.loads(ref["TOKENS"]), json.loads(got["TOKENS"])
    first = [next((j for j, (a, b) in enumerate(zip(r, g)) if a != b), None) for r, g in zip(ref, got)]
    for i, j in enumerate(first):
        if j is not None:
            print(f"prompt {i}: position {j}: reference {ref[i][j]}, PP=4 {got[i][j]}")
    print(f"first differing position per prompt (None: identical): {first}")
    return 1 if any(j is not None for j in first) else 0


if __name__ == "__main__":
    if "--child" in sys.argv:
        child(int(sys.argv[sys.argv.index("--child") + 1]))
    else:
        sys.exit(main())
