"""Prefill/decode (PD) disaggregation on real vLLM servers with a real NIXL connector.

- :class:`PDPair`: a producer server (``kv_producer``, prefill) and a consumer server (``kv_consumer``,
  decode) from two :class:`~kit.topology.Topology` objects, on loopback, each with a free HTTP port, its
  own NIXL side-channel port, a health wait with a deadline, one log file, and teardown of both trees.
  It picks the connector (pull ``NixlConnector`` or push ``NixlPushConnector``) and says why
  (:attr:`PDPair.connector_reason`).
- The router (:meth:`PDPair.complete`, :meth:`PDPair.complete_many`): the two-step flow measured in the
  findings note. POST to the producer with ``max_tokens=1`` and ``kv_transfer_params`` asking for a remote
  decode; POST to the consumer with the returned ``kv_transfer_params`` unchanged and the SAME
  ``X-Request-Id`` (push mode pairs the two requests by id). Greedy, token ids returned by the server
  (``return_token_ids``), non-streaming or streaming, one request or many in threads.
- What moved: NIXL's own counters from both servers' ``/metrics`` (``vllm:nixl_bytes_transferred``
  histogram: ``_sum`` bytes, ``_count`` transfers; ``vllm:nixl_num_descriptors``;
  ``vllm:nixl_num_failed_transfers``) and the consumer's prompt-token accounting
  (``vllm:prompt_tokens_by_source{source="local_compute"|"external_kv_transfer"|"local_cache_hit"}``),
  against :func:`kv_bytes_expected` computed from the model shape.
- :func:`pd_compare`: the consumer's tokens against the colocated PP=1, no-spec reference.
- :func:`main`: the ``kit pd`` command line.
"""
from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .engine import DEFAULT_START_TIMEOUT, EngineError, GenerationResult, Server, free_port, precheck
from .metrics import SpecCounters
from .models import cache_dir
from .topology import Spec, Topology, TopologyError, omp_threads_bind

DEFAULT_REQUEST_TIMEOUT = 180.0
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The producer call: prefill only, and ask the connector to keep the KV for a remote decode.
PRODUCER_KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                      "remote_block_ids": None, "remote_host": None, "remote_port": None}
# A warm-up prompt that shares no full block with ordinary prompts (prefix caching works on full blocks).
WARMUP_PROMPT = "warm up the disaggregated pair"


class PDError(RuntimeError):
    """A PD request failed (HTTP error, timeout, malformed answer); the message says which step."""


# -- connector choice and the expected KV volume ---------------------------------------------------

def kv_layer_names(t: Topology) -> list[str]:
    """Attention layers holding KV in an engine of this topology (all PP ranks together).

    Target layers are ``model.layers.0..L-1``; a MiMo/DeepSeek MTP drafter adds ``model.layers.L..``
    (vLLM's ``mtp_start_layer_idx = num_hidden_layers``), held by the last PP rank.
    """
    info = t.info
    names = [f"model.layers.{i}" for i in range(info.num_layers)]
    if t.spec is not None and t.spec.method == "mtp":
        names += [f"model.layers.{info.num_layers + i}" for i in range(info.num_mtp_layers)]
    return names


def choose_connector(producer: Topology, consumer: Topology) -> tuple[str, str]:
    """``("nixl" | "nixl-push", reason)`` for this producer/consumer pair on vLLM 0.32.

    Raises :class:`TopologyError` for a consumer with PP>1 fed by a producer of another PP size: the kit's
    ``nixl_pp_consumer`` patch pairs producer stage s with consumer stage s, nothing splits one stage's layers.
    """
    if consumer.pp > 1:
        if producer.pp != consumer.pp:
            raise TopologyError(
                f"a PD consumer with PP={consumer.pp} needs a producer with the same PP size (got producer "
                f"pp={producer.pp}): vLLM 0.32's NIXL refuses decode-side PP, and the kit's nixl_pp_consumer patch "
                "feeds consumer stage s from producer stage s only. Use --producer-pp "
                f"{consumer.pp}, or a PP=1 consumer")
        return "nixl-push", (
            f"consumer PP={consumer.pp}: vLLM 0.32 refuses decode-side PP ('does not support "
            "pipeline_parallel_size > 1'); the kit's nixl_pp_consumer patch lets push run it, each producer PP "
            "stage writing its layers into the consumer stage that holds the same layers")
    if producer.pp != consumer.pp:
        return "nixl-push", (
            f"heterogeneous PP (producer pp={producer.pp}, consumer pp={consumer.pp}): the pull connector on "
            "vLLM 0.32 fails the handshake with 'AssertionError: Number of KV layers must match between prefill "
            "and decode' (nixl/base_worker.py); with push each producer PP rank writes its own layers")
    np_, nc = len(kv_layer_names(producer)), len(kv_layer_names(consumer))
    if np_ != nc:
        return "nixl-push", (
            f"the producer has {np_} KV layers and the consumer {nc} (an MTP layer on one side only): pull "
            "asserts equal layer counts at the handshake ('Number of KV layers must match'), so push")
    return "nixl", (f"same PP (pp={producer.pp}) and the same {np_} KV layers on both sides: the default pull "
                    "connector (NixlConnector; the consumer reads the producer's blocks)")


def hidden_state_drafter(t: Topology) -> str | None:
    """The drafter method vLLM's NIXL compatibility hash covers (MTP/Eagle: they hold KV layers), else None."""
    return t.spec.method if t.spec is not None and t.spec.method in ("mtp", "eagle", "eagle3") else None


def kv_layers_moved(producer: Topology, consumer: Topology) -> list[str]:
    """KV layers whose blocks the connector moves from producer to consumer.

    Target layers from every producer PP rank; an MTP layer's KV only where both sides hold it
    (a consumer without the drafter has no region to receive it).
    """
    c = set(kv_layer_names(consumer))
    return [n for n in kv_layer_names(producer) if n in c]


def kv_block_bytes(t: Topology) -> int:
    """Bytes of one layer's KV for one block *token* (K and V), as the CPU cache lays it out."""
    cfg = t.info.config
    kv_heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
    return kv_heads * head_dim * 2 * DTYPE_BYTES[t.dtype]


def kv_bytes_expected(producer: Topology, consumer: Topology, prompt_tokens: list[int], block_size: int) -> dict:
    """Expected bytes over NIXL for prompts of these lengths: whole blocks, per moved layer.

    ``layers x ceil(prompt_tokens / block_size) x block_size x kv_heads x head_dim x 2 (K,V) x dtype bytes``.
    """
    layers = kv_layers_moved(producer, consumer)
    per_token = kv_block_bytes(producer)
    blocks = [math.ceil(n / block_size) for n in prompt_tokens]
    per_req = [len(layers) * b * block_size * per_token for b in blocks]
    return {"bytes": sum(per_req), "per_request": per_req, "blocks": blocks, "layers": layers,
            "block_size": block_size, "bytes_per_layer_block": block_size * per_token,
            "formula": (f"{len(layers)} layers x blocks x {block_size} tokens x {per_token} B/token "
                        f"(kv_heads x head_dim x 2 x {DTYPE_BYTES[producer.dtype]} B)")}


# -- /metrics --------------------------------------------------------------------------------------

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict, float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        try:
            v = float(value)
        except ValueError:
            continue
        name, _, rest = name_labels.partition("{")
        out.append((name, dict(_LABEL.findall(rest)), v))
    return out


def _msum(samples, name: str, **labels) -> float:
    return sum(v for n, l, v in samples if n == name and all(l.get(k) == x for k, x in labels.items()))


@dataclass
class Counters:
    """The transfer and prompt-accounting counters of one server, or a difference of two readings."""

    nixl_bytes: float = 0
    nixl_transfers: float = 0
    nixl_descriptors: float = 0
    nixl_failed: float = 0
    nixl_expired: float = 0
    prompt_tokens: float = 0
    local_compute: float = 0
    local_cache_hit: float = 0
    external_kv_transfer: float = 0
    requests_ok: float = 0
    spec: SpecCounters = field(default_factory=SpecCounters)

    @classmethod
    def from_text(cls, text: str) -> "Counters":
        s = parse_prometheus(text)
        src = "vllm:prompt_tokens_by_source_total"
        return cls(
            nixl_bytes=_msum(s, "vllm:nixl_bytes_transferred_sum"),
            nixl_transfers=_msum(s, "vllm:nixl_bytes_transferred_count"),
            nixl_descriptors=_msum(s, "vllm:nixl_num_descriptors_sum"),
            nixl_failed=_msum(s, "vllm:nixl_num_failed_transfers_total"),
            nixl_expired=_msum(s, "vllm:nixl_num_kv_expired_reqs_total"),
            prompt_tokens=_msum(s, "vllm:prompt_tokens_total"),
            local_compute=_msum(s, src, source="local_compute"),
            local_cache_hit=_msum(s, src, source="local_cache_hit"),
            external_kv_transfer=_msum(s, src, source="external_kv_transfer"),
            requests_ok=_msum(s, "vllm:request_success_total"),
            spec=SpecCounters.from_prometheus_text(text),
        )

    def __sub__(self, o: "Counters") -> "Counters":
        kw = {k: getattr(self, k) - getattr(o, k) for k in self.__dataclass_fields__ if k != "spec"}
        return Counters(**kw, spec=self.spec - o.spec)

    def to_dict(self) -> dict:
        d = {k: int(v) for k, v in asdict(self).items() if k != "spec"}
        d["spec"] = self.spec.to_dict()
        return d


def block_size_from_metrics(text: str) -> int | None:
    for name, labels, _ in parse_prometheus(text):
        if name == "vllm:cache_config_info" and labels.get("block_size"):
            return int(labels["block_size"])
    return None


# -- per-request record ----------------------------------------------------------------------------

@dataclass
class PDRequest:
    """One prompt through the pair: what came back, how long each step took, and what moved."""

    index: int
    request_id: str
    prompt: str
    stream: bool
    prompt_tokens: int | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    producer_token_ids: list[int] = field(default_factory=list)
    kv_transfer_params: dict | None = None
    finish_reason: str | None = None
    # Seconds: producer call (prefill + first token), consumer time to first token (client side, streaming
    # only), consumer call, both calls; consumer_ttft_server_ms from the server's per-request metrics.
    producer_prefill_s: float | None = None
    consumer_ttft_s: float | None = None
    consumer_ttft_server_ms: float | None = None
    consumer_s: float | None = None
    total_s: float | None = None
    # Filled when the request ran alone (counter differences around it); None in a concurrent batch.
    kv_bytes_transferred: int | None = None
    kv_transfers: int | None = None
    kv_descriptors: int | None = None
    consumer_prefill_tokens_computed: int | None = None
    consumer_external_tokens: int | None = None
    consumer_local_cache_hit_tokens: int | None = None
    consumer_spec: dict | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# -- the pair --------------------------------------------------------------------------------------

# NIXL's own knobs (``kv_connector_extra_config``). The producer keeps a request's blocks for
# ``kv_lease_duration`` seconds (default 30) waiting for the consumer; on 2 loaded cores the consumer's first
# handshake alone took longer than that (seen: push mode, the lease expired, the consumer waited for ever).
DEFAULT_KV_EXTRA_CONFIG = {"kv_lease_duration": 120}


def _server_only(t: Topology, kv_extra: dict | None = None) -> Topology:
    """The topology as the pair serves it: per-request metrics in responses, NIXL's extra config.

    Both go through ``extra_engine_args`` (which :meth:`Topology.serve_args` turns into flags), so
    :mod:`kit.topology` needs no change: ``kv_transfer_config`` is the topology's own plus
    ``kv_connector_extra_config``.
    """
    extra = dict(t.extra_engine_args)
    extra.setdefault("enable_per_request_metrics", True)
    kv = t.kv_transfer_config()
    if kv is not None and kv_extra and "kv_transfer_config" not in extra:
        extra["kv_transfer_config"] = {**kv, "kv_connector_extra_config": dict(kv_extra)}
    return t.with_(extra_engine_args=extra)


def check_pair(producer: Topology, consumer: Topology, connector: str | None = None,
               env: dict[str, str] | None = None, kv_extra_config: dict | None = None) -> tuple[str, str]:
    """Refuse, before any process starts, a pair vLLM 0.32 would refuse; return ``(connector, reason)``.

    Same model, weights, seed and dtype; a PP pairing the connector supports (:func:`choose_connector`); the
    decode-side PP + spec rule on each side; the same MTP/Eagle drafter method on both sides unless the NIXL
    handshake check is turned off (``enforce_handshake_compat: False`` in ``kv_extra_config``).
    """
    if producer.info.path != consumer.info.path:
        raise TopologyError(f"producer and consumer load different models ({producer.model} vs {consumer.model})")
    for what, a, b in (("random_weights", producer.random_weights, consumer.random_weights),
                       ("seed", producer.seed, consumer.seed), ("dtype", producer.dtype, consumer.dtype)):
        if a != b:
            raise TopologyError(f"producer and consumer differ in {what} ({a!r} vs {b!r}): the KV would not fit")
    if connector is None:
        connector, reason = choose_connector(producer, consumer)
    else:
        reason = f"requested by the caller ({connector})"
    for t, role in ((producer, "producer"), (consumer, "consumer")):  # decode-side PP + spec rule
        precheck(t.with_(pd_role=role, connector=connector), env, in_pair=True)
    pd_, cd_ = hidden_state_drafter(producer), hidden_state_drafter(consumer)
    if pd_ != cd_ and (kv_extra_config or {}).get("enforce_handshake_compat", True) is not False:
        raise TopologyError(
            f"producer drafter {pd_ or 'none'} vs consumer drafter {cd_ or 'none'}: vLLM 0.32's NIXL handshake "
            "refuses this pair ('NIXL compatibility hash mismatch'; the hash covers MTP/Eagle drafters, whose "
            "KV layers move too). Give both sides the same drafter method (k may differ), or pass "
            "kv_extra_config={'enforce_handshake_compat': False} (kit pd --kv-extra "
            "enforce_handshake_compat=false) to run it anyway and see what the missing drafter KV costs")
    return connector, reason


class PDPair:
    """A producer and a consumer vLLM server joined by a NIXL connector. Use as a context manager.

    ``connector=None`` picks pull or push with :func:`choose_connector`; the choice and its reason are in
    :attr:`connector` and :attr:`connector_reason`. Both topologies get their PD role and the connector.
    """

    def __init__(self, producer: Topology, consumer: Topology, connector: str | None = None,
                 start_timeout: float = DEFAULT_START_TIMEOUT, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 log_dir: Path | str | None = None, env: dict[str, str] | None = None, warmup: bool = True,
                 parallel_start: bool = True, split_cores: bool = True, kv_extra_config: dict | None = None):
        self.kv_extra_config = dict(DEFAULT_KV_EXTRA_CONFIG if kv_extra_config is None else kv_extra_config)
        self.connector, self.connector_reason = check_pair(producer, consumer, connector, env, self.kv_extra_config)
        self.producer_topology = producer.with_(pd_role="producer", connector=self.connector)
        self.consumer_topology = consumer.with_(pd_role="consumer", connector=self.connector)
        self.start_timeout = start_timeout
        self.request_timeout = request_timeout
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="kit-pd-", dir=cache_dir()))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(env or {})
        self.warmup = warmup
        self.parallel_start = parallel_start
        # Each server's OMP threads on its own half of the cores: both engines keep stepping while a transfer
        # is pending, and OMP threads of two engines bound to the same cores slow decoding many times over.
        self.split_cores = split_cores
        self.server_env: dict[str, dict[str, str]] = {}
        self.served_topology: dict[str, Topology] = {}
        self._ports: set[int] = set()
        self.producer: Server | None = None
        self.consumer: Server | None = None
        self.side_channel_ports: dict[str, int] = {}
        self.start_seconds: dict[str, float] = {}
        self.block_size: int | None = None
        self.model_name: dict[str, str] = {}
        self.warmup_record: PDRequest | None = None
        self.warmup_errors: list[str] = []
        self.fatal: dict[str, list[str]] = {}
        self._release = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> "PDPair":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _free_port(self) -> int:
        port = free_port()
        while port in self._ports:
            port = free_port()
        self._ports.add(port)
        return port

    def _make_server(self, role: str, topo: Topology) -> Server:
        port = self._free_port()
        self.side_channel_ports[role] = port
        env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)}
        if self.split_cores and topo.device == "cpu":
            cores = sorted(os.sched_getaffinity(0))
            half = max(1, len(cores) // 2)
            mine = cores[:half] if role == "producer" else (cores[half:] or cores[:half])
            env["VLLM_CPU_OMP_THREADS_BIND"] = omp_threads_bind(topo.pp * topo.tp, mine)
        env.update(self.env)
        self.server_env[role] = env
        http_port = self._free_port()
        self.served_topology[role] = served = _server_only(topo, self.kv_extra_config)
        return Server(served, port=http_port, env=env, log_path=self.log_dir / f"{role}.log", name=role, in_pair=True)

    def start(self) -> "PDPair":
        # Write a random checkpoint once, before two processes race to write it.
        self.producer_topology.model_path()
        self.producer = self._make_server("producer", self.producer_topology)
        self.consumer = self._make_server("consumer", self.consumer_topology)
        servers = {"producer": self.producer, "consumer": self.consumer}
        errors: dict[str, BaseException] = {}
        stopped_by_us: set[str] = set()
        booted = {r: threading.Event() for r in servers}

        def boot(role: str, hold: bool) -> None:
            t0 = time.monotonic()
            try:
                servers[role].start(timeout=self.start_timeout)
                self.start_seconds[role] = round(time.monotonic() - t0, 2)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors[role] = e
                other_role = "consumer" if role == "producer" else "producer"
                proc = servers[other_role].proc
                if proc is not None and other_role not in errors and not booted[other_role].is_set():
                    # Make the other start fail fast instead of waiting for its deadline.
                    stopped_by_us.add(other_role)
                    try:
                        proc.terminate(grace=2.0)
                    except Exception:  # noqa: BLE001 - it may be ending on its own
                        pass
            finally:
                booted[role].set()
            # kit.procs starts each server with PR_SET_PDEATHSIG, which the kernel fires when the *thread*
            # that forked the child exits: the thread that started a server must live until it is stopped.
            if hold and role not in errors:
                self._release.wait()

        try:
            if self.parallel_start:
                self._release.clear()
                self._threads = [threading.Thread(target=boot, args=(r, True), name=f"pd-server-{r}", daemon=True)
                                 for r in servers]
                for th in self._threads:
                    th.start()
                # Stock vLLM can hang after a worker fails during start-up (the front end waits in zmq
                # teardown until the deadline): watch the logs and end such a server at once.
                while not all(ev.is_set() for ev in booted.values()):
                    for role, srv in servers.items():
                        proc = srv.proc
                        if booted[role].is_set() or proc is None or role in self.fatal:
                            continue
                        lines = fatal_log_lines(self.log_dir / f"{role}.log")
                        if lines:
                            self.fatal[role] = lines
                            try:
                                proc.terminate(grace=2.0)
                            except Exception:  # noqa: BLE001
                                pass
                    time.sleep(1.0)
            else:
                for r in servers:
                    boot(r, False)
                    if errors:
                        break
            if errors:
                own = {r: e for r, e in errors.items() if r not in stopped_by_us} or errors
                parts = []
                for r, e in own.items():
                    if r in self.fatal:
                        parts.append(f"{r} failed to start:\n    " + "\n    ".join(self.fatal[r]))
                    else:
                        parts.append(f"{r} failed to start: {e}")
                raise EngineError("; ".join(parts) + f"\n  logs: {self.log_dir}")
            for role, srv in servers.items():
                self.model_name[role] = _model_id(srv)
            self.block_size = block_size_from_metrics(self._metrics_text(self.producer)) or 0
            if self.warmup:
                # One PD round trip: establishes the NIXL handshake (and the consumer's first decode-only
                # forward) outside the measured requests.
                # The handshake has a fixed 5 s receive timeout (nixl/base_worker.py); on a loaded machine it
                # can miss it once, so the warm-up (and only the warm-up) is tried up to 3 times.
                self.warmup_errors = []
                for _ in range(3):
                    b = self.counters()
                    self.warmup_record = self.complete(WARMUP_PROMPT, max_tokens=2, index=-1)
                    if not self.warmup_record.error:
                        # Its transfer counters reach /metrics a step later: let them land before anything
                        # measured takes its baseline (else they are counted with the first request).
                        self.settle(b, 1, self.warmup_record.prompt_tokens or 0)
                        break
                    self.warmup_errors.append(self.warmup_record.error)
                if self.warmup_record.error:
                    raise PDError(f"warm-up request failed 3 times: {self.warmup_errors}"
                                  f"\n  logs: {self.log_dir}")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for srv in (self.consumer, self.producer):
            if srv is not None:
                try:
                    srv.stop()
                except Exception:
                    pass
        # Only now let the threads that started the servers end (see ``boot``).
        self._release.set()
        for th in self._threads:
            th.join(timeout=10)
        self._threads = []

    def describe(self) -> dict:
        return {"connector": self.connector, "connector_class": self.producer_topology.kv_transfer_config()["kv_connector"],
                "connector_reason": self.connector_reason,
                "producer": self.producer_topology.describe(), "consumer": self.consumer_topology.describe(),
                "producer_kv_transfer_config": self._served_kv("producer"),
                "consumer_kv_transfer_config": self._served_kv("consumer"),
                "producer_url": self.producer.url if self.producer else None,
                "consumer_url": self.consumer.url if self.consumer else None,
                "side_channel_ports": dict(self.side_channel_ports), "start_seconds": dict(self.start_seconds),
                "omp_threads_bind": {r: e.get("VLLM_CPU_OMP_THREADS_BIND") for r, e in self.server_env.items()},
                "block_size": self.block_size, "logs": {"producer": str(self.log_dir / "producer.log"),
                                                        "consumer": str(self.log_dir / "consumer.log")}}

    def _served_kv(self, role: str) -> dict | None:
        t = self.served_topology.get(role) or (self.producer_topology if role == "producer" else self.consumer_topology)
        return t.extra_engine_args.get("kv_transfer_config") or t.kv_transfer_config()

    # -- counters --------------------------------------------------------------------------------
    def _metrics_text(self, srv: Server) -> str:
        return _get(srv, "/metrics").decode()

    def counters(self) -> dict[str, Counters]:
        return {"producer": Counters.from_text(self._metrics_text(self.producer)),
                "consumer": Counters.from_text(self._metrics_text(self.consumer))}

    def transfers_per_request(self) -> int:
        """NIXL transfers one request makes: in push mode every producer PP rank writes its own layers."""
        return self.producer_topology.pp if self.connector == "nixl-push" else 1

    def settle(self, before: dict[str, Counters], n_requests: int, prompt_tokens: int,
               timeout: float = 15.0) -> dict[str, Counters]:
        """Counters once the transfers and prompt accounting of ``n_requests`` have been reported.

        Transfers are recorded by the side that issues them (the consumer reads in pull mode, the
        producer writes in push mode) and reach ``/metrics`` with a later engine step than the answer.
        """
        deadline = time.monotonic() + timeout
        last = None
        while True:
            now = self.counters()
            p, c = now["producer"] - before["producer"], now["consumer"] - before["consumer"]
            done = (p.nixl_transfers + c.nixl_transfers + p.nixl_failed + c.nixl_failed
                    >= n_requests * self.transfers_per_request() and c.prompt_tokens >= prompt_tokens)
            key = (p.nixl_transfers, c.nixl_transfers, p.nixl_bytes, c.nixl_bytes, c.prompt_tokens)
            if done and key == last:
                return now
            if time.monotonic() > deadline:
                return now
            last = key if done else None
            time.sleep(0.3)

    # -- liveness ----------------------------------------------------------------------------------
    def dead_servers(self) -> dict[str, str]:
        """``{role: what died + root cause}`` for servers whose process or a vLLM child has died."""
        out = {}
        for role, srv in (("producer", self.producer), ("consumer", self.consumer)):
            proc = srv.proc if srv is not None else None
            if proc is None:
                continue
            dead = None if proc.alive() else f"exited with code {proc.popen.returncode}"
            dead = dead or (f"a vLLM process died: {c}" if (c := proc.check_children()) else None)
            if dead:
                out[role] = str(proc.fail(dead))
        return out

    def _watched(self, what: str, fn, *args):
        """Run an HTTP call while watching both servers: a dead server ends the wait at once (within ~1 s)
        with its root cause, instead of leaving the caller until the request timeout."""
        box: dict[str, Any] = {}

        def target():
            try:
                box["value"] = fn(*args)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = e

        th = threading.Thread(target=target, daemon=True, name=f"pd-{what}")
        th.start()
        while th.is_alive():
            th.join(1.0)
            if th.is_alive():
                dead = self.dead_servers()
                if dead:
                    raise PDError(f"{what} abandoned: {_deaths(dead)}")
        if "error" in box:
            # The call failed: if a server is gone, that is the root cause (a consumer whose producer died after
            # the prefill answers a plain HTTP 500), so name it.
            dead = self.dead_servers()
            if dead:
                raise PDError(f"{what} failed ({type(box['error']).__name__}: {box['error']}): "
                              f"{_deaths(dead)}") from box["error"]
            raise box["error"]
        return box["value"]

    # -- the router ------------------------------------------------------------------------------
    def complete(self, prompt: str, max_tokens: int = 32, stream: bool = False, index: int = 0,
                 request_id: str | None = None, pause_before_decode: float = 0.0) -> PDRequest:
        """One prompt through the pair (producer prefill, then consumer decode); errors land in ``.error``.

        ``pause_before_decode`` (fault injection, teaching): wait that long between the two calls, e.g. past the
        producer's ``kv_lease_duration`` so that the producer releases the blocks before the consumer asks.
        """
        rid = request_id or f"pd-{uuid.uuid4().hex}"
        rec = PDRequest(index=index, request_id=rid, prompt=prompt, stream=stream)
        headers = {"X-Request-Id": rid}
        t0 = time.monotonic()
        try:
            pbody = {"model": self.model_name["producer"], "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                     "ignore_eos": True, "return_token_ids": True, "stream": False,
                     "kv_transfer_params": dict(PRODUCER_KV_PARAMS)}
            pres = self._watched("producer prefill", _post_json, self.producer, "/v1/completions", pbody, headers,
                                 self.request_timeout, "producer")
            t1 = time.monotonic()
            rec.producer_prefill_s = round(t1 - t0, 4)
            ch = pres["choices"][0]
            rec.producer_token_ids = list(ch.get("token_ids") or [])
            rec.prompt_token_ids = ch.get("prompt_token_ids")
            rec.prompt_tokens = (pres.get("usage") or {}).get("prompt_tokens")
            kvp = pres.get("kv_transfer_params")
            rec.kv_transfer_params = kvp
            if not kvp:
                raise PDError(f"producer returned no kv_transfer_params (is it a kv_producer?): {json.dumps(pres)[:400]}")
            if pause_before_decode > 0:
                time.sleep(pause_before_decode)
            cbody = {"model": self.model_name["consumer"], "prompt": prompt, "max_tokens": max_tokens,
                     "temperature": 0.0, "ignore_eos": True, "return_token_ids": True, "stream": stream,
                     "kv_transfer_params": kvp}
            if stream:
                cbody["stream_options"] = {"include_usage": True}
                out = self._watched("consumer decode", _post_stream, self.consumer, "/v1/completions", cbody, headers,
                                    self.request_timeout)
                rec.consumer_ttft_s = round(out["first_token_time"] - t1, 4) if out["first_token_time"] else None
                rec.token_ids, rec.text, rec.finish_reason = out["token_ids"], out["text"], out["finish_reason"]
                metrics = out.get("metrics")
                if rec.prompt_token_ids is None:
                    rec.prompt_token_ids = out.get("prompt_token_ids")
            else:
                cres = self._watched("consumer decode", _post_json, self.consumer, "/v1/completions", cbody, headers,
                                     self.request_timeout, "consumer")
                cch = cres["choices"][0]
                rec.token_ids = list(cch.get("token_ids") or [])
                rec.text, rec.finish_reason = cch.get("text", ""), cch.get("finish_reason")
                metrics = cres.get("metrics")
            t2 = time.monotonic()
            rec.consumer_s = round(t2 - t1, 4)
            rec.total_s = round(t2 - t0, 4)
            if metrics:
                rec.consumer_ttft_server_ms = metrics.get("time_to_first_token_ms")
                rec.consumer_spec = metrics.get("speculative_decoding")
            if rec.prompt_tokens is None and rec.prompt_token_ids is not None:
                rec.prompt_tokens = len(rec.prompt_token_ids)
            if len(rec.token_ids) != max_tokens:
                raise PDError(f"consumer returned {len(rec.token_ids)} token ids, expected {max_tokens}")
        except Exception as e:  # noqa: BLE001 - one request's failure is data, not a crash
            rec.error = f"{type(e).__name__}: {e}"
            hints = self.handoff_diagnosis(rid)
            if hints:
                rec.error += "\n  what the servers logged about this request's KV:\n    " + "\n    ".join(hints)
            rec.total_s = round(time.monotonic() - t0, 4)
        return rec

    def handoff_diagnosis(self, request_id: str, limit: int = 6) -> list[str]:
        """Log lines of either server about this request's KV handoff going wrong (lease expiry, failed or
        expired transfers, notifications after expiry): the root cause when a consumer call times out."""
        pattern = (rf"{re.escape(request_id)}.*(expired|[Ff]ail|[Tt]imed? ?out|abort)"
                   rf"|(expired|[Ff]ail|[Tt]imed? ?out|abort).*{re.escape(request_id)}")
        out = []
        for role in ("producer", "consumer"):
            out += [f"{role}: {line.strip()[:300]}" for line in self.log_lines(role, pattern, limit)]
        return out[:limit]

    def complete_many(self, prompts: list[str], max_tokens: int = 32, stream: bool = False,
                      concurrency: int = 1) -> tuple[list[PDRequest], dict]:
        """All prompts through the pair; returns records (prompt order) and the transfer totals.

        ``concurrency=1``: one at a time, each with its own counter differences. ``>1``: that many threads
        at once; counters are then totals over the batch.
        """
        before = self.counters()
        bs = self.block_size or 0
        recs: list[PDRequest]
        if concurrency <= 1:
            recs = []
            for i, p in enumerate(prompts):
                b = self.counters()
                r = self.complete(p, max_tokens=max_tokens, stream=stream, index=i)
                if r.error is None:
                    a = self.settle(b, 1, r.prompt_tokens or 0)
                    _fill_transfer(r, a, b)
                recs.append(r)
        else:
            with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="pd-req") as ex:
                futs = [ex.submit(self.complete, p, max_tokens, stream, i) for i, p in enumerate(prompts)]
                recs = [f.result() for f in futs]
        ok = [r for r in recs if r.error is None]
        after = self.settle(before, len(ok), sum(r.prompt_tokens or 0 for r in ok))
        p, c = after["producer"] - before["producer"], after["consumer"] - before["consumer"]
        totals = {"producer": p.to_dict(), "consumer": c.to_dict(),
                  "kv_bytes_transferred": int(p.nixl_bytes + c.nixl_bytes),
                  "kv_transfers": int(p.nixl_transfers + c.nixl_transfers),
                  "kv_descriptors": int(p.nixl_descriptors + c.nixl_descriptors),
                  "kv_failed_transfers": int(p.nixl_failed + c.nixl_failed),
                  "transfer_recorded_by": ("producer" if p.nixl_transfers and not c.nixl_transfers else
                                           "consumer" if c.nixl_transfers and not p.nixl_transfers else
                                           "both" if p.nixl_transfers else "none"),
                  "consumer_prefill_tokens_computed": int(c.local_compute),
                  "consumer_external_tokens": int(c.external_kv_transfer),
                  "consumer_local_cache_hit_tokens": int(c.local_cache_hit),
                  "consumer_prompt_tokens": int(c.prompt_tokens),
                  "producer_prefill_tokens_computed": int(p.local_compute),
                  "consumer_spec": c.spec.to_dict(), "producer_spec": p.spec.to_dict()}
        return recs, totals

    # -- diagnostics -----------------------------------------------------------------------------
    def log_lines(self, role: str, pattern: str, limit: int = 20) -> list[str]:
        """Lines of a server's log matching a regex (e.g. ``"KV Transfer metrics"``)."""
        path = self.log_dir / f"{role}.log"
        if not path.exists():
            return []
        rx = re.compile(pattern)
        return [l for l in path.read_text(errors="replace").splitlines() if rx.search(l)][-limit:]


_FATAL = re.compile(r"EngineCore failed to start|WorkerProc hit an exception|Engine core initialization failed")


def fatal_log_lines(path: Path, max_lines: int = 8) -> list[str]:
    """If a vLLM log shows a start-up failure, the lines that say why: the innermost frame, its code, the exception."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    if not _FATAL.search(text):
        return []
    bodies = []
    for line in text.splitlines():
        if " ERROR " in line:
            body = line.split("] ", 1)[-1] if "] " in line else line
            if body.strip() and not re.match(r"^\s*\^+\s*$", body):
                bodies.append(body.rstrip())
    # The first traceback: from its header to the first line that is not indented (the exception).
    start = next((i for i, b in enumerate(bodies) if b.startswith("Traceback (most recent call last)")), None)
    if start is None:
        return [b for b in bodies if not _FATAL.search(b)][-max_lines:]
    end = next((i for i in range(start + 1, len(bodies)) if not bodies[i].startswith(" ")), len(bodies) - 1)
    frames = [i for i in range(start, end) if bodies[i].lstrip().startswith('File "')]
    pick = bodies[frames[-1]:end + 1] if frames else bodies[start:end + 1]
    return [p.strip() for p in pick][-max_lines:]


def _fill_transfer(r: PDRequest, after: dict[str, Counters], before: dict[str, Counters]) -> None:
    p, c = after["producer"] - before["producer"], after["consumer"] - before["consumer"]
    r.kv_bytes_transferred = int(p.nixl_bytes + c.nixl_bytes)
    r.kv_transfers = int(p.nixl_transfers + c.nixl_transfers)
    r.kv_descriptors = int(p.nixl_descriptors + c.nixl_descriptors)
    r.consumer_prefill_tokens_computed = int(c.local_compute)
    r.consumer_external_tokens = int(c.external_kv_transfer)
    r.consumer_local_cache_hit_tokens = int(c.local_cache_hit)


def _get(srv: Server, path: str, timeout: float = 30.0, attempts: int = 5) -> bytes:
    """GET with a few retries on a dropped connection (seen right after start-up on a loaded machine)."""
    for i in range(attempts):
        try:
            with urllib.request.urlopen(srv.url + path, timeout=timeout) as r:
                return r.read()
        except (ConnectionError, http.client.RemoteDisconnected) as e:
            if i == attempts - 1:
                raise PDError(f"GET {path} on {srv.name} failed {attempts} times: {e!r}") from None
            print(f"kit.pd: GET {srv.url}{path}: {e!r}, retrying", file=sys.stderr, flush=True)
            time.sleep(1.0)
    raise AssertionError("unreachable")


def _deaths(dead: dict[str, str]) -> str:
    """``PDPair.dead_servers()`` as one phrase: 'the producer died (...); the consumer died (...)'."""
    return "the " + "; the ".join(f"{r} died ({m})" for r, m in dead.items())


def _model_id(srv: Server) -> str:
    return json.loads(_get(srv, "/v1/models"))["data"][0]["id"]


def _post_json(srv: Server, path: str, body: dict, headers: dict, timeout: float, what: str) -> dict:
    data = json.dumps(body).encode()
    req = urllib.request.Request(srv.url + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:600]
        raise PDError(f"{what} answered HTTP {e.code}: {detail}") from None
    except (TimeoutError, urllib.error.URLError) as e:
        raise PDError(f"{what} call failed after {timeout:.0f} s limit: {e}") from None


def _post_stream(srv: Server, path: str, body: dict, headers: dict, timeout: float) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream", **headers})
        resp = conn.getresponse()
        if resp.status != 200:
            raise PDError(f"consumer answered HTTP {resp.status}: {resp.read().decode(errors='replace')[:600]}")
        out: dict[str, Any] = {"token_ids": [], "text": "", "finish_reason": None, "first_token_time": None,
                               "chunks": 0, "metrics": None, "prompt_token_ids": None}
        for raw in resp:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            if "error" in chunk and not chunk.get("choices"):
                raise PDError(f"consumer stream error: {json.dumps(chunk)[:400]}")
            out["chunks"] += 1
            if chunk.get("metrics"):
                out["metrics"] = chunk["metrics"]
            for ch in chunk.get("choices") or []:
                toks = ch.get("token_ids") or []
                if toks and out["first_token_time"] is None:
                    out["first_token_time"] = time.monotonic()
                out["token_ids"] += list(toks)
                out["text"] += ch.get("text") or ""
                if ch.get("prompt_token_ids"):
                    out["prompt_token_ids"] = ch["prompt_token_ids"]
                if ch.get("finish_reason"):
                    out["finish_reason"] = ch["finish_reason"]
        return out
    except (TimeoutError, OSError) as e:
        raise PDError(f"consumer stream failed ({timeout:.0f} s limit): {e}") from None
    finally:
        conn.close()


# -- comparison --------------------------------------------------------------------------------------

def pd_topologies(model: str, producer_pp: int = 1, producer_spec: str | Spec | None = None, consumer_pp: int = 1,
                  consumer_spec: str | Spec | None = None, random_weights: bool = False, **common) -> tuple[Topology, Topology]:
    """Producer and consumer topologies from PP sizes and spec settings (``METHOD:K``)."""
    p = Topology(model=model, random_weights=random_weights, pp=producer_pp, spec=producer_spec, **common)
    c = Topology(model=model, random_weights=random_weights, pp=consumer_pp, spec=consumer_spec, **common)
    return p, c


def acceptance_vs_colocated(consumer: dict, colocated: dict, n_requests: int, colocated_identical: bool) -> dict:
    """The PD consumer's spec-decode counters next to one colocated engine's on the same prompts.

    ``extra_draft_rounds`` is how many more verify rounds the consumer ran; ``accepted_equal`` whether the
    accepted drafts, in total and per draft position, are the same.
    """
    keys = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "per_position", "mean_acceptance_length")
    return {
        "consumer": {k: consumer.get(k) for k in keys},
        "colocated": {k: colocated.get(k) for k in keys},
        "accepted_equal": (consumer.get("num_accepted_tokens") == colocated.get("num_accepted_tokens")
                           and list(consumer.get("per_position") or []) == list(colocated.get("per_position") or [])),
        "extra_draft_rounds": (consumer.get("num_drafts") or 0) - (colocated.get("num_drafts") or 0),
        "requests": n_requests,
        "colocated_tokens_identical_to_reference": colocated_identical,
    }


def pd_compare(producer: Topology, consumer: Topology, prompts: list[str], max_tokens: int = 32,
               stream: bool = False, concurrency: int = 1, reference: GenerationResult | None = None,
               connector: str | None = None, timeout: float = 900.0, log_dir: Path | str | None = None,
               env: dict[str, str] | None = None, colocated: bool = False,
               kv_extra_config: dict | None = None) -> dict:
    """Run the prompts through a PD pair and compare the consumer's tokens with the PP=1 no-spec reference.

    The reference (``kit.engine.generate(consumer.reference(), ..., top2=True)``) runs first, in its own
    engine, unless given. Returns a JSON-able dict: ``identical``, ``first_divergence``, ``connector``,
    ``kv_bytes_transferred`` vs ``kv_bytes_expected``, ``consumer_prefill_tokens_computed``, per-request
    records and timings, the consumer's spec-decode counters, ``handoff_ok`` and the logs.
    ``colocated=True`` (consumer with a drafter) also runs the consumer's topology as one plain engine on the
    same prompts and reports its spec-decode counters next to the consumer's (``acceptance_vs_colocated``).
    ``kv_extra_config`` adds ``kv_connector_extra_config`` keys for both servers (over the kit's defaults).
    """
    from .compare import first_divergence
    from .engine import generate

    # Built first: PDPair checks the pair (models, PP sizes, decode-side rule) before any process starts.
    pair = PDPair(producer, consumer, connector=connector, start_timeout=timeout, log_dir=log_dir, env=env,
                  kv_extra_config={**DEFAULT_KV_EXTRA_CONFIG, **(kv_extra_config or {})})
    t_ref = None
    if reference is None:
        t0 = time.monotonic()
        reference = generate(consumer.reference(), prompts, max_tokens=max_tokens, top2=True, timeout=timeout, env=env)
        t_ref = round(time.monotonic() - t0, 2)
    coloc = None
    if colocated and consumer.spec is not None:
        coloc = generate(consumer.with_(pd_role=None, connector=None), prompts, max_tokens=max_tokens,
                         timeout=timeout, env=env)
    t0 = time.monotonic()
    with pair:
        t_start = round(time.monotonic() - t0, 2)
        t1 = time.monotonic()
        recs, totals = pair.complete_many(prompts, max_tokens=max_tokens, stream=stream, concurrency=concurrency)
        t_run = round(time.monotonic() - t1, 2)
        desc = pair.describe()
        kv_log = pair.log_lines("producer", r"KV Transfer metrics", 5) + pair.log_lines("consumer", r"KV Transfer metrics", 5)
        warm = pair.warmup_record.to_dict() if pair.warmup_record else None
    errors = [f"prompt {r.index}: {r.error}" for r in recs if r.error]
    got = GenerationResult(token_ids=[r.token_ids for r in recs], texts=[r.text for r in recs],
                           prompt_token_ids=[r.prompt_token_ids or [] for r in recs], spec=SpecCounters(), seconds=t_run)
    div = first_divergence(reference, got)
    ok = [r for r in recs if r.error is None]
    expected = kv_bytes_expected(producer, consumer, [r.prompt_tokens or 0 for r in ok], desc["block_size"] or 1)
    consumer_computed = totals["consumer_prefill_tokens_computed"]
    prompt_total = sum(r.prompt_tokens or 0 for r in ok)
    handoff = {
        "no_request_errors": not errors,
        "transfers_at_least_one_per_request": totals["kv_transfers"] >= len(ok) > 0,
        "no_failed_transfers": totals["kv_failed_transfers"] == 0,
        "consumer_computed_no_prompt_tokens": consumer_computed == 0,
        "consumer_received_all_prompt_tokens": totals["consumer_external_tokens"] == prompt_total,
        "kv_bytes_equal_expected": totals["kv_bytes_transferred"] == expected["bytes"],
    }
    first_tokens_agree = all(r.producer_token_ids[:1] == r.token_ids[:1] for r in ok)
    return {
        "acceptance_vs_colocated": (acceptance_vs_colocated(totals["consumer_spec"], coloc.spec.to_dict(),
                                                            len(ok), coloc.token_ids == reference.token_ids)
                                    if coloc is not None else None),
        "identical": div is None and not errors,
        "first_divergence": div,
        "handoff_ok": all(handoff.values()),
        "handoff_checks": handoff,
        "connector": pair.connector,
        "connector_class": desc["connector_class"],
        "connector_reason": pair.connector_reason,
        "kv_bytes_transferred": totals["kv_bytes_transferred"],
        "kv_bytes_expected": expected["bytes"],
        "kv_expected": expected,
        "kv_transfers": totals["kv_transfers"],
        "kv_descriptors": totals["kv_descriptors"],
        "kv_failed_transfers": totals["kv_failed_transfers"],
        "transfer_recorded_by": totals["transfer_recorded_by"],
        "consumer_prefill_tokens_computed": consumer_computed,
        "consumer_external_tokens": totals["consumer_external_tokens"],
        "consumer_local_cache_hit_tokens": totals["consumer_local_cache_hit_tokens"],
        "prompt_tokens": prompt_total,
        "producer_first_token_equals_consumer_first": first_tokens_agree,
        "consumer_spec": totals["consumer_spec"] if consumer.spec else None,
        "producer_spec": totals["producer_spec"] if producer.spec else None,
        "stream": stream,
        "concurrency": concurrency,
        "num_prompts": len(prompts),
        "max_tokens": max_tokens,
        "errors": errors,
        "requests": [r.to_dict() for r in recs],
        "timings": {"reference_s": t_ref, "pair_start_s": t_start, "requests_s": t_run,
                    "per_request": [{"index": r.index, "prompt_tokens": r.prompt_tokens,
                                     "producer_prefill_s": r.producer_prefill_s, "consumer_ttft_s": r.consumer_ttft_s,
                                     "consumer_ttft_server_ms": r.consumer_ttft_server_ms,
                                     "consumer_s": r.consumer_s, "total_s": r.total_s} for r in recs]},
        "warmup": warm,
        "reference_tokens": reference.token_ids,
        "pair": desc,
        "kv_transfer_log": kv_log,
    }


# -- command line ------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"kit pd: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kit pd", description="PD disaggregation on real vLLM servers with a NIXL connector: "
                "producer (prefill) -> consumer (decode), compared with the PP=1 no-spec reference")
    p.add_argument("--model", default="tiny-mimo", help="a model under data/models/ or a path")
    p.add_argument("--random", action="store_true", help="seeded random weights (normal init)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--producer-pp", type=int, default=1)
    p.add_argument("--producer-spec", default=None, help="METHOD:K on the producer, e.g. mtp:2 (or none)")
    p.add_argument("--consumer-pp", type=int, default=1)
    p.add_argument("--consumer-spec", default=None, help="METHOD:K on the consumer (or none)")
    p.add_argument("--connector", choices=["auto", "nixl", "nixl-push"], default="auto",
                   help="pull (nixl), push (nixl-push), or auto: push when the KV layer layouts differ")
    p.add_argument("--prompts", default=None, help="JSONL of {\"prompt\": ...}; default data/prompts/default.jsonl")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--stream", action="store_true", help="stream from the consumer")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per engine start")
    p.add_argument("--colocated-acceptance", action="store_true",
                   help="also run the consumer topology as one plain engine and compare spec-decode acceptance")
    p.add_argument("--kv-extra", action="append", default=[], metavar="KEY=VALUE",
                   help="a kv_connector_extra_config entry for both servers (VALUE read as JSON when it parses), "
                        "e.g. enforce_handshake_compat=false; repeatable")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last stdout line")
    return p


def parse_assignments(items: list[str], flag: str, json_values: bool = False) -> dict:
    """``["KEY=VALUE", ...]`` from a repeatable CLI flag -> dict; with ``json_values`` a VALUE is read as JSON
    when it parses (``false``, ``120``), else kept as the string. :class:`TopologyError` names the bad item."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TopologyError(f"{flag} wants KEY=VALUE, got {item!r}")
        if json_values:
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        out[key.strip()] = value
    return out


def parse_kv_extra(items: list[str]) -> dict:
    """``--kv-extra`` entries: ``kv_connector_extra_config`` keys, values read as JSON when they parse."""
    return parse_assignments(items, "--kv-extra", json_values=True)


def main(argv: list[str] | None = None) -> int:
    """``kit pd``: exit 0 identical and the handoff worked, 1 otherwise, 2 bad input (before any server starts)."""
    from .compare import load_prompts

    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        if args.max_tokens < 1:
            raise TopologyError(f"--max-tokens must be >= 1, got {args.max_tokens}")
        if args.concurrency < 1:
            raise TopologyError(f"--concurrency must be >= 1, got {args.concurrency}")
        prod, cons = pd_topologies(args.model, args.producer_pp, Spec.parse(args.producer_spec), args.consumer_pp,
                                   Spec.parse(args.consumer_spec), random_weights=args.random, seed=args.seed,
                                   dtype=args.dtype)
        if args.max_tokens >= cons.model_len:
            raise TopologyError(f"--max-tokens {args.max_tokens} exceeds the model length {cons.model_len}")
        if not args.random and not prod.info.has_trained_weights:
            raise TopologyError(f"model {prod.info.name} ships no trained weights: use random weights (--random)")
        prompts = load_prompts(args.prompts, limit=args.limit)
        kv_extra = parse_kv_extra(args.kv_extra)
        check_pair(prod, cons, None if args.connector == "auto" else args.connector, None,
                   {**DEFAULT_KV_EXTRA_CONFIG, **kv_extra})  # refuses what vLLM would, before anything starts
    except (TopologyError, ValueError) as e:
        print(f"kit pd: error: {e}", file=sys.stderr)
        return 2
    connector = None if args.connector == "auto" else args.connector
    try:
        d = pd_compare(prod, cons, prompts, max_tokens=args.max_tokens, stream=args.stream,
                       concurrency=args.concurrency, connector=connector, timeout=args.timeout,
                       colocated=args.colocated_acceptance, kv_extra_config=kv_extra)
    except (EngineError, PDError) as e:
        print(f"kit pd: failed: {e}", file=sys.stderr)
        if args.json:
            print(json.dumps({"identical": False, "handoff_ok": False, "error": str(e)}))
        return 1
    if not args.json:
        print(f"connector : {d['connector_class']} ({d['connector_reason']})")
        print(f"producer  : {prod.label()}   consumer: {cons.label()}")
        print(f"prompts   : {d['num_prompts']} x {args.max_tokens} tokens, stream={args.stream}, "
              f"concurrency={args.concurrency}")
        print(f"identical : {d['identical']}" + (f"  divergence {d['first_divergence']}" if d["first_divergence"] else ""))
        print(f"kv bytes  : measured {d['kv_bytes_transferred']} in {d['kv_transfers']} transfers, "
              f"expected {d['kv_bytes_expected']} ({d['kv_expected']['formula']})")
        print(f"consumer  : prefill tokens computed {d['consumer_prefill_tokens_computed']}, "
              f"received {d['consumer_external_tokens']} of {d['prompt_tokens']}")
        print(f"handoff   : {'ok' if d['handoff_ok'] else 'FAILED'} {d['handoff_checks']}")
        for t in d["timings"]["per_request"]:
            print(f"  #{t['index']}: {t['prompt_tokens']} prompt tokens, prefill {t['producer_prefill_s']} s, "
                  f"consumer ttft {t['consumer_ttft_s']} s (server {t['consumer_ttft_server_ms']} ms), total {t['total_s']} s")
        if d["consumer_spec"]:
            print(f"consumer spec: {d['consumer_spec']}")
        if d["acceptance_vs_colocated"]:
            a = d["acceptance_vs_colocated"]
            print(f"vs colocated: accepted equal {a['accepted_equal']} (consumer {a['consumer']['per_position']}, "
                  f"colocated {a['colocated']['per_position']}), extra verify rounds {a['extra_draft_rounds']} "
                  f"for {a['requests']} requests")
        for e in d["errors"]:
            print(f"error: {e}")
    else:
        print(json.dumps(d))
    return 0 if d["identical"] and d["handoff_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
