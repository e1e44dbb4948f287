"""The parent side: a :class:`~kit.core.topology.Topology` run on a fresh engine in a managed subprocess.

:func:`generate` / :func:`run` start :mod:`kit.engine.child` with a deadline, its own process group, the root
cause of a failure, and nothing left behind; :func:`precheck` refuses what vLLM would refuse before any process
starts. Notebooks and the CLI use this.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

from kit.core.models import cache_dir
from kit.core.topology import Topology, TopologyError
from kit.core.validate import check_count, check_generation, check_prompts, check_seconds
from kit.engine.lifecycle import remove_run_dir
from kit.engine.procs import ManagedProcess, ProcessFailed, python_cmd, root_cause
from kit.engine.progress import Status
from kit.engine.result import EngineError, GenerationResult
from kit.patches import ENV_LOG

DEFAULT_START_TIMEOUT = 600.0
# The runner holds vLLM's engine core in its own process (vLLM's in-process client,
# VLLM_ENABLE_V1_MULTIPROCESSING=0) instead of starting a process for it: the same scheduler and executor code, and
# PP workers are still processes of their own (at PP=1 vLLM's CPU platform then keeps its uni-process executor, so
# the one worker runs in the runner too). Measured start of a tiny-mimo engine on 2 cores: 13.5 s against 34.8 s at
# PP=1, 23.1 s against 36.6 s at PP=2, same tokens (docs/results/bench.md, "Start-up: vLLM's engine core in the
# runner process"). Servers (`vllm serve`) and `kit bench` keep vLLM's default, a separate engine core process, as a
# deployment runs it; env=SEPARATE_ENGINE_CORE_ENV does the same for one run.
INPROC_ENGINE_CORE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
SEPARATE_ENGINE_CORE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}


# ------------------------------------------------------------------------------

def precheck(topology: Topology, env: dict[str, str] | None = None, in_pair: bool = False) -> None:
    """Refuse, before any process starts, what vLLM with the selected patches would refuse at start-up.

    Today: the decode-side PP + speculation rule (``kit.patches.decode_side_pp_spec_rule``) under the
    ``KIT_PATCHES`` value the vLLM processes will see, and ``KIT_PP_GROUPS`` (``kit.patches.pp_microbatches``).
    Raises :class:`TopologyError`.
    """
    from kit.patches.decode_side_pp_spec_rule import check_before_start
    from kit.patches.pp_microbatches import groups as pp_groups

    env = env or {}
    if topology.pd_role == "consumer" and not in_pair:
        raise TopologyError("a PD consumer needs its producer: start the two together with kit.pd.PDPair "
                            "(or `kit pd`), not as a single engine or server")
    try:
        check_before_start(topology.pp, topology.spec is not None, topology.pd_role, env.get("KIT_PATCHES"))
        if topology.pp > 1:  # the engine core would refuse it only after the workers started
            pp_groups(topology.pp, {**os.environ, **env})
    except ValueError as e:
        raise TopologyError(str(e)) from None


_TOKENIZERS: dict[str, object] = {}
_TOKENIZER_LOCK = threading.Lock()


def tokenizer(path: str):
    """The model's own tokenizer at ``path`` (loaded once per process), for counting tokens as vLLM counts them."""
    with _TOKENIZER_LOCK:  # transformers' lazy imports are not safe when two threads import it at once
        if path not in _TOKENIZERS:
            from transformers import AutoTokenizer

            _TOKENIZERS[path] = AutoTokenizer.from_pretrained(path)
        return _TOKENIZERS[path]


def check_prompt_lengths(topology: Topology, prompts: list[str]) -> None:
    """Refuse (:class:`TopologyError`, before any process starts) a prompt that vLLM would refuse after its
    start: more tokens than the model length (``InputProcessor._validate_prompt_len``), counted with the model's
    own tokenizer as vLLM counts them."""
    tok = tokenizer(str(topology.model_path()))
    for i, p in enumerate(prompts):
        n = len(tok(p)["input_ids"])
        if n > topology.model_len:
            raise TopologyError(f"prompt {i} is {n} tokens, longer than the model length {topology.model_len}: "
                                "shorten it or raise --max-model-len")


def run(topology: Topology, jobs: list[dict], timeout: float = DEFAULT_START_TIMEOUT,
        env: dict[str, str] | None = None, log_path: Path | None = None, check: bool = True,
        quiet: bool | None = None) -> dict:
    """Run ``jobs`` (``{"kind": "generate", ...}`` / ``{"kind": "inspect"}``) on a fresh engine in a subprocess.

    Raises :class:`EngineError` with the root-cause log lines if the engine fails, a vLLM child
    dies, or ``timeout`` seconds pass. The whole process tree is gone when this returns, and so is the run's
    folder under the kit's cache (``kit-run-*``: request, result, engine log); a failed run's folder, which its error
    names, goes when this process exits (``KIT_KEEP_RUNS=1`` keeps every folder).
    ``check=False`` skips :func:`precheck` (to watch vLLM itself refuse, as the patch-necessity tests do).
    While it runs, one status line shows the phase and elapsed seconds (:mod:`kit.engine.progress`; ``quiet=True``
    or ``KIT_QUIET=1`` turns it off).
    """
    check_seconds(timeout)
    for job in jobs:
        if job.get("kind") == "generate":
            check_prompts(job.get("prompts"))
            check_count(job.get("max_tokens", 1), "max_tokens")
    if check:
        precheck(topology, env)
    topology.model_path()  # write a random checkpoint here, before any process starts
    topology.draft_path()
    for job in jobs:
        if job.get("kind") == "generate":
            check_prompt_lengths(topology, job["prompts"])
    work = Path(tempfile.mkdtemp(prefix="kit-run-", dir=cache_dir()))
    req = work / "request.json"
    out = work / "result.json"
    log_path = Path(log_path) if log_path else work / "engine.log"
    req.write_text(json.dumps({"topology": topology.describe(), "jobs": jobs}))
    proc_env = dict(topology.env())
    if topology.nodes == 1 and topology.backend == "mp":
        proc_env.update(INPROC_ENGINE_CORE_ENV)
    proc_env.update(env or {})
    proc_env.setdefault(ENV_LOG, str(work / "patches.jsonl"))  # each vLLM process records its patches there
    try:
        result = _run_tree(topology, req, out, log_path, proc_env, timeout, quiet)
    except BaseException:
        remove_run_dir(work, failed=True)  # its error names the log: kept until this process exits
        raise
    # A run that succeeded leaves nothing behind.
    if remove_run_dir(work):
        result["log"] = str(log_path) if log_path.parent != work else None
    return result


def _run_tree(topology: Topology, req: Path, out: Path, log_path: Path, proc_env: dict[str, str], timeout: float,
              quiet: bool | None) -> dict:
    """The engine's process tree for one :func:`run`: start it, wait for its result, end it; the result, or
    :class:`EngineError` with the root cause."""
    proc = ManagedProcess(python_cmd("kit.engine.child", str(req), str(out)), env=proc_env, log_path=log_path,
                          name=f"vLLM engine [{topology.label()}]")
    status = Status(proc.name, log_path, quiet=quiet)
    deadline = time.monotonic() + timeout
    failed = True
    try:
        while True:
            status.poll()
            if out.exists():
                break
            alive = proc.alive()
            dead = proc.check_children() if alive else None
            if not alive or dead:
                # The runner writes its result and leaves at once; its guard then ends the engine core and
                # workers. A death seen just after the result landed is that teardown, not a failure. A real
                # death: let the survivors write the root cause (a worker's traceback reaches the log through
                # the engine core a moment later) before the tree is ended: up to 3 s, while the log grows.
                settle, size = time.monotonic() + 3.0, -1
                while not out.exists() and time.monotonic() < settle:
                    now = log_path.stat().st_size if log_path.exists() else 0
                    if now == size:
                        break
                    size = now
                    time.sleep(0.5)
                if out.exists():
                    break
                raise proc.fail(f"a vLLM process died: {dead}" if dead else
                                f"exited with code {proc.popen.returncode} before finishing")
            if time.monotonic() > deadline:
                raise proc.fail(f"no result after {timeout:.0f} s (deadline)")
            time.sleep(0.5)
        result = json.loads(out.read_text())
        failed = not result.get("ok")
    except ProcessFailed as e:
        raise EngineError(str(e)) from None
    finally:
        status.close(failed=failed)
        proc.terminate()
    result["log"] = str(log_path)
    result["peak_rss"] = dict(proc.peak_rss)
    check_patch_log(topology, proc_env[ENV_LOG])
    if not result.get("ok"):
        cause = root_cause(log_path)
        raise EngineError(f"vLLM engine [{topology.label()}] failed: {result.get('error')}\n  root cause from "
                          f"{log_path}:\n    " + "\n    ".join(cause))
    return result


def check_patch_log(topology: Topology, path: str) -> None:
    """A patch that failed in a vLLM process is logged there and kept running (kit.patches); a run whose
    tokens may be wrong because of it fails here, naming the patch, the process and the error."""
    from kit.patches import failures_in_log

    failed = failures_in_log(path)
    if failed:
        raise EngineError(f"vLLM engine [{topology.label()}]: ppmtp-kit patches failed ({path}):\n  "
                          + "\n  ".join(failed))


def generate(topology: Topology, prompts: list[str], max_tokens: int = 32, temperature: float = 0.0,
             top2: bool = False, seed: int | None = None, timeout: float = DEFAULT_START_TIMEOUT,
             env: dict[str, str] | None = None, check: bool = True, quiet: bool | None = None,
             stop_token_ids: list[int] | None = None) -> GenerationResult:
    """Generation (greedy unless ``temperature`` > 0; request i seeded ``seed + i``) on a fresh engine in a
    subprocess; returns tokens and spec-decode counters. A request stops at ``max_tokens`` or at one of
    ``stop_token_ids`` (EOS is ignored)."""
    prompts = check_generation(prompts, max_tokens, timeout)
    job = {"kind": "generate", "prompts": prompts, "max_tokens": max_tokens, "temperature": temperature,
           "top2": top2, "seed": seed}
    if stop_token_ids:
        job["stop_token_ids"] = [int(t) for t in stop_token_ids]
    res = run(topology, [job], timeout=timeout, env=env, check=check, quiet=quiet)
    g = GenerationResult.from_dict(res["jobs"][0])
    g.topology["start_seconds"] = res.get("start_seconds")
    g.topology["log"] = res["log"]
    g.topology["peak_rss"] = res.get("peak_rss", {})
    return g
