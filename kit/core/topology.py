"""One declarative description of a run, validated before any process starts.

A :class:`Topology` says which model (and which weights), how it is split (PP, TP), which drafter
runs (method and k), what PD role the engine plays and with which KV connector, on which device and
executor backend. It turns into ``vllm.LLM`` keyword arguments (:meth:`Topology.engine_args`), into
OpenAI-server flags (:meth:`Topology.serve_args`) and into the environment vLLM needs
(:meth:`Topology.env`). The same topology targets a GPU by setting ``device="cuda"``.

Model-specific engine settings live in one place, :func:`kit.core.models.model_requirements`: what a model family needs
from vLLM 0.32 beyond the topology's own fields (today: hybrid Gated-DeltaNet models such as Qwen3.5).
"""
from __future__ import annotations

import functools
import json
import os
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kit.core.cores import core_ranges, cpu_count, omp_threads_bind  # noqa: F401 - omp_threads_bind is imported from here too
from kit.core.partition import auto_partition, even_partition
from kit.core.models import (
    ModelError,
    ModelInfo,
    model_requirements,
    random_checkpoint,
    resolve_model,
)
from kit.core.net import local_node_ip  # noqa: F401 - kit.core.topology.local_node_ip is public
from kit.core.validate import TopologyError, check_choice, check_count, check_positive

SPEC_METHODS = ("mtp", "eagle3", "draft_model", "ngram")
MAX_SPEC_TOKENS = 8
PD_ROLES = (None, "producer", "consumer")
# vLLM 0.32 NIXL connectors: pull (consumer reads the producer's blocks) and push (producer writes).
CONNECTORS = {"nixl": "NixlConnector", "nixl-push": "NixlPushConnector"}
DEVICES = ("cpu", "cuda")
BACKENDS = ("mp", "ray")
DTYPES = ("float32", "bfloat16", "float16")
# vLLM 0.32's model runners. "auto" leaves the choice to vLLM: V1 on the CPU build (V2 requires Triton, which it
# lacks), V2 on CUDA unless the config uses something V2 lacks (vllm/config/vllm.py: VllmConfig.use_v2_model_runner).
RUNNERS = ("auto", "v1", "v2")
# The one switch vLLM reads (vllm/envs.py; "1"/"0", unset = vLLM decides); there is no engine argument for it.
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
# Boolean engine args whose False must reach the server as --no-FLAG (vLLM's default may be on).
_NEGATED_FLAGS = ("enable_prefix_caching",)


@dataclass(frozen=True)
class Spec:
    """A speculative-decoding setting: ``method`` and ``k`` draft tokens per step."""

    method: str
    k: int
    draft_model: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> "Spec | None":
        """Parse ``METHOD:K`` (e.g. ``mtp:2``); ``none``/empty gives ``None``."""
        if text is None or str(text).strip().lower() in ("", "none", "off"):
            return None
        method, _, k = str(text).partition(":")
        method = method.strip().lower()
        if method not in SPEC_METHODS:
            raise TopologyError(f"unknown speculative method {method!r}: use one of {', '.join(SPEC_METHODS)} (as METHOD:K)")
        if not k:
            raise TopologyError(f"speculative setting {text!r} lacks k: write {method}:K, e.g. {method}:2")
        try:
            kk = int(k)
        except ValueError:
            raise TopologyError(f"k in {text!r} is not an integer") from None
        return cls(method=method, k=kk)

    def __str__(self) -> str:
        return f"{self.method}:{self.k}"


@dataclass(frozen=True)
class Topology:
    """A validated run description. Construct it; invalid input raises :class:`TopologyError`."""

    model: str = "tiny-mimo"
    random_weights: bool = False
    seed: int = 0
    pp: int = 1
    tp: int = 1
    spec: Spec | None = None
    pd_role: str | None = None
    connector: str | None = None
    device: str = "cpu"
    backend: str = "mp"
    dtype: str = "float32"
    enforce_eager: bool = True
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_gib: float = 1.0
    extra_engine_args: dict = field(default_factory=dict)
    # Nodes the ranks are spread over (vLLM's --nnodes / Ray nodes); each holds pp*tp/nodes whole ranks.
    nodes: int = 1
    # Model runner: "auto" (vLLM's default for the device), "v1" or "v2"; turned into RUNNER_ENV for every process.
    runner: str = "auto"
    # Decoder layers per PP stage, first stage first (vLLM's VLLM_PP_LAYER_PARTITION); None = vLLM's even split.
    # The drafter (MTP layers, Eagle3 head) always runs on the last stage, on top of its share: (5, 3) for an
    # 8-layer model with MTP moves one target layer off the stage that also drafts. "auto": the split
    # kit.core.partition.auto_partition picks from the drafter's passes per step (the even split, None, where it is
    # no better).
    layer_partition: tuple[int, ...] | str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.spec, str):
            object.__setattr__(self, "spec", Spec.parse(self.spec))
        if isinstance(self.layer_partition, str) and self.layer_partition.strip().lower() == AUTO:
            object.__setattr__(self, "layer_partition", self._auto_partition())
        elif isinstance(self.layer_partition, (str, list)):
            object.__setattr__(self, "layer_partition", parse_partition(self.layer_partition))
        self.validate()
        dtype, _ = model_requirements(self.info, self.device, self.spec)
        if dtype and self.dtype != dtype:
            if self.dtype != "float32":  # the kit's default gives way; another explicit choice is an error
                raise TopologyError(f"model {self.info.name} needs dtype {dtype} on {self.device} "
                                    f"(see kit.core.models.model_requirements), got {self.dtype}")
            object.__setattr__(self, "dtype", dtype)
        if note := self.runner_note():
            warnings.warn(note, RunnerWarning, stacklevel=3)

    # -- validation -------------------------------------------------------------------------
    @property
    def info(self) -> ModelInfo:
        try:
            return resolve_model(self.model)
        except ModelError as e:
            raise TopologyError(str(e)) from None

    def validate(self) -> None:
        self._check_types()
        info = self.info
        if self.pp > info.num_layers:
            raise TopologyError(
                f"pp={self.pp} is larger than the model's {info.num_layers} decoder layers ({info.name}): "
                "every pipeline stage needs at least one layer")
        check_choice(self.device, DEVICES, "device")
        check_choice(self.backend, BACKENDS, "backend")
        check_choice(self.dtype, DTYPES, "dtype")
        if self.device == "cpu" and self.tp > 1 and self.pp * self.tp > max(4, cpu_count()):
            raise TopologyError(f"tp*pp={self.tp * self.pp} ranks exceed what this CPU hosts ({cpu_count()} cores)")
        self._validate_nodes()
        self._validate_runner()
        self._validate_partition()
        if self.device == "cuda":
            n = _cuda_count()
            if n is not None and self.pp * self.tp // self.nodes > n and self.backend == "mp":
                raise TopologyError(
                    f"tp*pp={self.tp * self.pp} GPUs needed but {n} visible; use backend='ray' across nodes")
        s = self.spec
        if s is not None:
            if s.method not in SPEC_METHODS:
                raise TopologyError(f"unknown speculative method {s.method!r}: use one of {', '.join(SPEC_METHODS)}")
            if not isinstance(s.k, int) or not 1 <= s.k <= MAX_SPEC_TOKENS:
                raise TopologyError(f"speculative k must be in 1..{MAX_SPEC_TOKENS}, got {s.k!r}")
            if s.method == "mtp" and info.num_mtp_layers == 0:
                raise TopologyError(f"model {info.name} has no MTP layers (num_nextn_predict_layers is 0): use another method")
            if s.method == "eagle3" and not (s.draft_model or info.draft_model):
                raise TopologyError(f"eagle3 needs a draft model: model {info.name} names none in kit.json, and none was given")
            if s.method == "draft_model" and not (s.draft_model or info.draft_model):
                raise TopologyError("draft_model needs a draft model directory")
        if self.pd_role not in PD_ROLES:
            raise TopologyError(f"pd_role must be one of producer, consumer or None, got {self.pd_role!r}")
        if self.pd_role is None and self.connector is not None:
            raise TopologyError("a KV connector was given without a PD role (producer or consumer)")
        if self.pd_role is not None:
            check_choice(self.connector, CONNECTORS, "connector")
        mml = self.max_model_len
        if mml is not None and (mml < 16 or mml > info.max_model_len):
            raise TopologyError(f"max_model_len={mml} outside 16..{info.max_model_len} (the model's max_position_embeddings)")
        check_positive(self.kv_cache_gib, "kv_cache_gib", "a finite number > 0 (GiB)")
        if self.device == "cpu" and not float(self.kv_cache_gib).is_integer():
            # VLLM_CPU_KVCACHE_SPACE is read as an integer: vLLM would refuse 1.5 only after its start
            raise TopologyError(f"kv_cache_gib must be a whole number of GiB on device cpu (vLLM's "
                                f"VLLM_CPU_KVCACHE_SPACE), got {self.kv_cache_gib}")

    def _check_types(self) -> None:
        """Field types first: a string or a float where an integer belongs would otherwise fail later, in a
        comparison's TypeError or inside vLLM."""
        for name in ("pp", "tp", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if v is not None or not name.startswith("max_"):
                check_count(v, name)
        check_count(self.seed, "seed", minimum=0)  # numpy's generator for --random weights and vLLM's seed take none below 0
        for name in ("random_weights", "enforce_eager"):
            if not isinstance(getattr(self, name), bool):
                raise TopologyError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.extra_engine_args, dict):
            raise TopologyError(f"extra_engine_args must be a dict, got {type(self.extra_engine_args).__name__}")
        known = engine_arg_names() if self.extra_engine_args else frozenset()
        for key in self.extra_engine_args:
            if key in SERVER_PLACEMENT_ARGS:  # where a server listens is the kit's (loopback), not a model setting
                raise TopologyError(f"extra_engine_args: {key!r} sets where a server listens; the kit binds its "
                                    "servers to loopback (Server(host=...) takes a loopback address)")
            if known and key not in known:  # vLLM would refuse it only in the started process, with a traceback
                import difflib

                close = difflib.get_close_matches(str(key), sorted(known), n=1)
                raise TopologyError(f"extra_engine_args: {key!r} is not a vLLM engine or server argument (a field "
                                    "of vLLM's EngineArgs or FrontendArgs)"
                                    + (f"; did you mean {close[0]!r}?" if close else ""))

    def _validate_nodes(self) -> None:
        n = check_count(self.nodes, "nodes")
        if n == 1:
            return
        if self.pp % n:
            raise TopologyError(f"nodes={n} must divide pp={self.pp}: each node holds whole pipeline stages")
        if self.pd_role is not None:
            raise TopologyError("a multi-node topology takes no PD role: its nodes form one engine")
        if self.device == "cpu" and n > cpu_count():
            raise TopologyError(f"nodes={n} local CPU nodes need a core each; this machine gives {cpu_count()}")

    def _auto_partition(self) -> tuple[int, ...] | None:
        """``layer_partition="auto"``: :func:`kit.core.partition.auto_partition` for this model, PP size and
        drafter (k passes per step for a drafter model, none for n-gram); None where that is vLLM's even split."""
        if self.pp < 2:
            raise TopologyError("layer_partition auto needs pp > 1 (it splits the decoder layers over the PP stages)")
        n = self.info.num_layers
        passes = self.spec.k if self.spec is not None and self.spec.method != "ngram" else 0
        part = auto_partition(n, self.pp, passes)
        return None if part == even_partition(n, self.pp) else part

    def _validate_partition(self) -> None:
        part = self.layer_partition
        if part is None:
            return
        if not isinstance(part, tuple) or not all(isinstance(n, int) and not isinstance(n, bool) for n in part):
            raise TopologyError(f"layer_partition must be whole numbers of layers per stage, got {part!r}")
        n = self.info.num_layers
        if self.pp == 1:
            raise TopologyError("layer_partition needs pp > 1 (it splits the decoder layers over the PP stages)")
        if len(part) != self.pp or min(part) < 1 or sum(part) != n:
            raise TopologyError(f"layer_partition {','.join(map(str, part))} must give each of the pp={self.pp} "
                                f"stages at least one layer and sum to the model's {n} decoder layers ({self.info.name})")

    def _validate_runner(self) -> None:
        check_choice(self.runner, RUNNERS, "runner")
        if self.runner == "v2" and self.device == "cpu":
            raise TopologyError("runner v2 cannot run on device cpu: vLLM 0.32's CPU build has no Triton and Model "
                                "Runner V2 requires it (vllm/config/vllm.py); use runner auto or v1")

    # -- model runner -------------------------------------------------------------------------
    @property
    def effective_runner(self) -> str:
        """The runner vLLM uses: the explicit choice, else its default for the device (:func:`default_runner`)."""
        return self.runner if self.runner != "auto" else default_runner(self.device)

    def runner_env(self) -> dict[str, str]:
        """``VLLM_USE_V2_MODEL_RUNNER`` for an explicit runner; nothing for ``auto`` (vLLM decides)."""
        return {"v1": {RUNNER_ENV: "0"}, "v2": {RUNNER_ENV: "1"}}.get(self.runner, {})

    def vllm_env(self) -> dict[str, str]:
        """What every process of this topology reads from its environment for the model: the runner
        (:meth:`runner_env`) and the layer split (``VLLM_PP_LAYER_PARTITION``, only when one is set)."""
        env = self.runner_env()
        if self.layer_partition:
            env[PARTITION_ENV] = ",".join(map(str, self.layer_partition))
        return env

    def runner_note(self) -> str | None:
        """Why the kit's correctness claim does not cover this topology, or ``None``.

        PP > 1 with speculation on the V2 runner is allowed, not refused: upstream implements it there (PP + MTP,
        vllm#46994; PP + Eagle3, vllm#50514), and ``kit compare`` is the check of whether it holds. But the kit's
        PP + spec correctness patches (``Runner.V1`` in :mod:`kit.patches`) patch V1 code that V2 never calls, so
        what the kit measured on V1 says nothing about V2.
        """
        if self.spec is None or self.pp == 1 or self.effective_runner != "v2":
            return None
        why = "runner v2" if self.runner == "v2" else "runner auto (vLLM's default on cuda is V2)"
        return (f"{self.label()}: {why} with PP>1 and speculation uses upstream's V2 code; the kit's V1 correctness "
                "patches do not apply there and nothing was verified on it; runner v1 is the one they cover")

    # -- nodes --------------------------------------------------------------------------------
    def node_ips(self, hosts: list[str] | None = None) -> list[str]:
        """One address per node: ``hosts`` (real machines), else a loopback address each (127.0.0.2, ...)."""
        if hosts is not None:
            if len(hosts) != self.nodes:
                raise TopologyError(f"{len(hosts)} hosts given for nodes={self.nodes}")
            return list(hosts)
        return [local_node_ip(i) for i in range(self.nodes)]

    def node_cores(self, rank: int) -> list[int]:
        """The cores node ``rank`` is pinned to when all nodes share this machine (contiguous, equal shares)."""
        cores = sorted(os.sched_getaffinity(0))
        per = max(1, len(cores) // self.nodes)
        return cores[rank * per:(rank + 1) * per] or [cores[rank % len(cores)]]

    def node_flags(self, rank: int, master_addr: str, master_port: int) -> list[str]:
        """vLLM's multi-node flags for node ``rank`` (``--headless`` on followers: workers only, no server)."""
        flags = ["--nnodes", str(self.nodes), "--node-rank", str(rank), "--master-addr", master_addr,
                 "--master-port", str(master_port)]
        return flags + (["--headless"] if rank > 0 else [])

    def node_plan(self, port: int, master_port: int, hosts: list[str] | None = None) -> list["NodeCommand"]:
        """The command each node runs, leader (rank 0, the API server) first.

        ``backend="mp"``: vLLM's multiprocessing multi-node launch, ``vllm serve ... --nnodes N --node-rank R
        --master-addr IP0 --master-port P`` and ``--headless`` on every follower. ``backend="ray"``: ``ray start``
        on each node (head on node 0), then the server on node 0 with the Ray executor. Without ``hosts`` the
        nodes are local: each on its own loopback address and pinned to its own cores (``taskset``), with
        ``VLLM_HOST_IP`` (vLLM's address for its cross-node queues) and ``GLOO_SOCKET_IFNAME=lo`` (gloo's pairs).
        """
        ips = self.node_ips(hosts)
        local = hosts is None
        serve = ["vllm", "serve", *self.serve_args()]
        out: list[NodeCommand] = []
        for r, ip in enumerate(ips):
            env: dict[str, str] = {"VLLM_HOST_IP": ip, **self.vllm_env()}
            cores = self.node_cores(r) if local else []
            if local:
                env["GLOO_SOCKET_IFNAME"] = "lo"
                if self.device == "cpu":
                    env["VLLM_CPU_OMP_THREADS_BIND"] = omp_threads_bind(self.pp * self.tp // self.nodes, cores)
            if self.backend == "ray":
                ray = ["ray", "start", "--block", "--node-ip-address", ip, "--num-gpus",
                       "0" if self.device == "cpu" else str(self.pp * self.tp // self.nodes)]
                ray += ["--head", "--port", str(master_port)] if r == 0 else ["--address", f"{ips[0]}:{master_port}"]
                out.append(NodeCommand(r, ip, cores, ray, env, "ray head" if r == 0 else "ray worker"))
                continue
            argv = serve + self.node_flags(r, ips[0], master_port)
            argv += ["--host", ip, "--port", str(port)] if r == 0 else []
            out.append(NodeCommand(r, ip, cores, argv, env, "leader" if r == 0 else "headless follower"))
        if self.backend == "ray":
            env = {"VLLM_HOST_IP": ips[0], "RAY_ADDRESS": f"{ips[0]}:{master_port}", **self.vllm_env()}
            out.append(NodeCommand(0, ips[0], out[0].cores, serve + ["--host", ips[0], "--port", str(port)],
                                   env, "leader"))
        return out

    # -- derived ----------------------------------------------------------------------------
    @property
    def model_len(self) -> int:
        return self.max_model_len or min(self.info.max_model_len, 1024)

    def model_path(self) -> Path:
        """The checkpoint directory vLLM loads (a seeded random one when ``random_weights``)."""
        info = self.info
        if self.random_weights:
            return random_checkpoint(info, self.seed)
        if not info.has_trained_weights:
            raise TopologyError(f"model {info.name} ships no trained weights: use random weights (--random)")
        return info.path

    def draft_path(self) -> Path | None:
        s = self.spec
        if s is None or s.method not in ("eagle3", "draft_model"):
            return None
        d = s.draft_model or self.info.draft_model
        if s.method == "draft_model" and d is None:
            return None
        dinfo = resolve_model(d)
        if self.random_weights or not dinfo.has_trained_weights:
            return random_checkpoint(dinfo, self.seed + 1)
        return dinfo.path

    def speculative_config(self) -> dict | None:
        s = self.spec
        if s is None:
            return None
        cfg: dict[str, Any] = {"method": s.method, "num_speculative_tokens": s.k}
        if s.method == "ngram":
            cfg.update(prompt_lookup_max=3, prompt_lookup_min=1)
        if s.method in ("eagle3", "draft_model"):
            cfg["model"] = str(self.draft_path())
        if s.method == "mtp" and (backend := model_requirements(self.info, self.device, s)[1].get("attention_backend")):
            cfg["attention_backend"] = backend  # vLLM's drafter never inherits the target's attention backend
        return cfg

    def kv_transfer_config(self) -> dict | None:
        if self.pd_role is None:
            return None
        return {
            "kv_connector": CONNECTORS[self.connector],
            "kv_role": "kv_producer" if self.pd_role == "producer" else "kv_consumer",
            "kv_buffer_device": "cpu" if self.device == "cpu" else "cuda",
        }

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` (and ``EngineArgs``)."""
        path = str(self.model_path())
        args: dict[str, Any] = dict(
            model=path,
            tokenizer=path,
            dtype=self.dtype,
            seed=self.seed,
            pipeline_parallel_size=self.pp,
            tensor_parallel_size=self.tp,
            enforce_eager=self.enforce_eager,
            max_model_len=self.model_len,
            disable_log_stats=False,
        )
        if self.pp * self.tp > 1 or self.backend == "ray":
            args["distributed_executor_backend"] = self.backend
        if self.max_num_seqs:
            args["max_num_seqs"] = self.max_num_seqs
        if self.max_num_batched_tokens:
            args["max_num_batched_tokens"] = self.max_num_batched_tokens
        args.update(model_requirements(self.info, self.device, self.spec)[1])
        sc = self.speculative_config()
        if sc:
            args["speculative_config"] = sc
        kv = self.kv_transfer_config()
        if kv:
            args["kv_transfer_config"] = kv
        args.update(self.extra_engine_args)
        return args

    def serve_args(self) -> list[str]:
        """Flags for vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``)."""
        flags: list[str] = []
        for key, value in self.engine_args().items():
            if key == "disable_log_stats":
                continue
            opt = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                if value:
                    flags.append(opt)
                elif key in _NEGATED_FLAGS:  # off where vLLM's default is on: say so explicitly
                    flags.append("--no-" + opt[2:])
            elif isinstance(value, dict):
                flags += [opt, json.dumps(value)]
            else:
                flags += [opt, str(value)]
        return flags

    def env(self) -> dict[str, str]:
        """Environment for every vLLM process of this topology."""
        env = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "TOKENIZERS_PARALLELISM": "false",
               "NO_COLOR": "1", "VLLM_LOGGING_COLOR": "0",  # plain logs: root causes are parsed from them
               # no usage reports from anything the kit starts (vLLM's own switch and the common one it reads)
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        if self.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = _fmt_num(self.kv_cache_gib)
            env["VLLM_CPU_OMP_THREADS_BIND"] = omp_threads_bind(self.pp * self.tp)
        if self.nodes == 1:
            env.update(LOOPBACK_ENV)  # a multi-node plan sets each node's own address over these
        env.update(self.vllm_env())
        return env

    def with_(self, **changes: Any) -> "Topology":
        """A copy with some fields changed (validated again)."""
        if "spec" in changes and isinstance(changes["spec"], str):
            changes["spec"] = Spec.parse(changes["spec"])
        return replace(self, **changes)

    def reference(self) -> "Topology":
        """The PP=1, no-spec, colocated topology every other one is compared against."""
        return self.with_(pp=1, tp=1, spec=None, pd_role=None, connector=None, backend="mp", nodes=1,
                          layer_partition=None)

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d["spec"] = str(self.spec) if self.spec else None
        return d

    def label(self) -> str:
        parts = [self.model, "random" if self.random_weights else "trained", f"pp{self.pp}"]
        if self.tp > 1:
            parts.append(f"tp{self.tp}")
        parts.append(str(self.spec) if self.spec else "nospec")
        if self.pd_role:
            parts.append(self.pd_role)
        if self.nodes > 1:
            parts.append(f"{self.nodes}nodes-{self.backend}")
        if not self.enforce_eager:
            parts.append("compiled")
        if self.runner != "auto":
            parts.append(f"runner-{self.runner}")
        if self.layer_partition:
            parts.append("layers" + "-".join(map(str, self.layer_partition)))
        return "/".join(parts)


# vLLM reads the per-stage layer counts from this variable only (vllm/distributed/utils.py get_pp_indices).
PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"


AUTO = "auto"  # layer_partition="auto"


def parse_partition(text: "str | list | tuple") -> tuple[int, ...]:
    """``"5,3"`` or ``[5, 3]`` -> ``(5, 3)`` (one :class:`TopologyError` line when it is not whole numbers)."""
    items = str(text).split(",") if isinstance(text, str) else list(text)
    try:
        return tuple(int(str(x).strip()) for x in items)
    except ValueError:
        raise TopologyError(f"layer_partition wants whole numbers of layers per stage like 5,3, or auto, got {text!r}") from None


# Loopback only, for every process of a one-node topology. Without these, vLLM's workers bind the machine's
# address: ``VLLM_HOST_IP`` is the address vLLM gives its distributed rendezvous and message queues (else the
# address of the default route), gloo binds the interface its hostname resolves to (``GLOO_SOCKET_IFNAME``),
# and NIXL's UCX transport may use every device (``UCX_NET_DEVICES``; a PD pair's KV still moves with ``lo``).
# Seen without these in a PD pair (PP=2 producer): each PP worker listened on 5 TCP ports of the machine's address
# (tests/test_pd.py::test_pd_tree_listens_on_loopback_only_and_wants_its_api_key).
LOOPBACK_ENV = {"VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "UCX_NET_DEVICES": "lo"}


# Where vLLM declares what ``extra_engine_args`` may hold: the engine's arguments (``vllm.LLM`` and the server)
# and the OpenAI server's own (``enable_per_request_metrics``, which kit.pd's servers get, is one).
_ARG_CLASSES = {"engine/arg_utils.py": ("EngineArgs", "AsyncEngineArgs"),
                "entrypoints/launchers/cli_args.py": ("BaseFrontendArgs", "FrontendArgs")}


@functools.lru_cache(maxsize=1)
def engine_arg_names() -> frozenset[str]:
    """The fields of vLLM's ``EngineArgs``/``AsyncEngineArgs`` and of its OpenAI server's ``FrontendArgs``, read
    from their source (importing vLLM takes 10 s); empty when a source cannot be read, and then nothing is
    refused here."""
    import ast
    import importlib.util

    names: set[str] = set()
    try:  # find_spec of the top package imports nothing (of vllm.engine.arg_utils it would import vllm)
        root = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
        for rel, classes in _ARG_CLASSES.items():
            tree = ast.parse((root / rel).read_text())
            found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in classes]
            if not found:
                return frozenset()
            names.update(a.target.id for c in found for a in c.body
                         if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name))
    except (ImportError, AttributeError, TypeError, IndexError, OSError, SyntaxError, ValueError):
        return frozenset()
    return frozenset(names)


class RunnerWarning(UserWarning):
    """A topology the kit's correctness patches do not cover (:meth:`Topology.runner_note`)."""


def default_runner(device: str, has_triton: bool | None = None) -> str:
    """vLLM 0.32's model runner when ``VLLM_USE_V2_MODEL_RUNNER`` is not set, the one answer the kit gives (the
    topology's ``auto`` and ``kit doctor``): Model Runner V2 requires Triton, so ``v1`` without it, else ``v2``
    (vLLM then falls back to V1 only for a config V2 lacks, and logs which). ``has_triton`` defaults to what the
    device's vLLM build has: none in the CPU build, Triton in the CUDA one."""
    if has_triton is None:
        has_triton = device != "cpu"
    return "v2" if has_triton else "v1"



@dataclass(frozen=True)
class NodeCommand:
    """One command of a multi-node plan: which node runs it, bound to which address and cores, with what env."""

    rank: int
    ip: str
    cores: list[int]
    argv: list[str]
    env: dict[str, str]
    role: str

    def shell(self) -> str:
        """The command as one shell line (environment first; ``taskset`` when the node is pinned)."""
        import shlex

        pin = ["taskset", "-c", core_ranges(self.cores)] if self.cores else []
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())),
                         *map(shlex.quote, pin + self.argv)])


# Server arguments that would move a server the kit starts off loopback (or off its Unix socket).
SERVER_PLACEMENT_ARGS = frozenset({"host", "port", "uds"})


def _fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _cuda_count() -> int | None:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([v for v in vis.split(",") if v.strip()])
    return None
