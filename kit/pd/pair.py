"""The PD pair: a producer (prefill) and a consumer (decode) vLLM server joined by a NIXL connector.

:class:`PDPair` starts both servers on loopback (each with a free HTTP port, its own NIXL side-channel port,
its half of the cores, a health wait with a deadline and one log file), ends both trees, and routes requests:
:meth:`PDPair.complete` POSTs to the producer with ``max_tokens=1`` and ``kv_transfer_params`` asking for a
remote decode, then to the consumer with the returned ``kv_transfer_params`` unchanged and the SAME
``X-Request-Id`` (push mode pairs the two requests by id). Greedy, token ids returned by the server
(``return_token_ids``), non-streaming or streaming, one request or many in threads. What moved is read from
both servers' ``/metrics`` (:class:`~kit.core.metrics.Counters`).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from kit.core.metrics import Counters, block_size_from_metrics
from kit.core.models import cache_dir
from kit.core.net import free_port
from kit.core.topology import Topology, omp_threads_bind
from kit.core.validate import check_api_key, check_count, check_prompts, check_seconds
from kit.engine import DEFAULT_START_TIMEOUT, EngineError, Server
from kit.engine.httpclient import random_api_key
from kit.engine.lifecycle import Lifecycle
from kit.engine.procs import Abandoned, call_watched, fatal_log_lines
from kit.pd.client import PDError, get, model_id, post_json, stream_completion
from kit.pd.layout import DEFAULT_KV_EXTRA_CONFIG, as_served, check_pair

DEFAULT_REQUEST_TIMEOUT = 180.0
# The producer call: prefill only, and ask the connector to keep the KV for a remote decode.
PRODUCER_KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                      "remote_block_ids": None, "remote_host": None, "remote_port": None}
# A warm-up prompt that shares no full block with ordinary prompts (prefix caching works on full blocks).
WARMUP_PROMPT = "warm up the disaggregated pair"


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

class PDPair(Lifecycle):
    """A producer and a consumer vLLM server joined by a NIXL connector. Use as a context manager.

    ``connector=None`` picks pull or push with :func:`choose_connector`; the choice and its reason are in
    :attr:`connector` and :attr:`connector_reason`. Both topologies get their PD role and the connector.
    """

    def __init__(self, producer: Topology, consumer: Topology, connector: str | None = None,
                 start_timeout: float = DEFAULT_START_TIMEOUT, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 log_dir: Path | str | None = None, env: dict[str, str] | None = None, warmup: bool = True,
                 parallel_start: bool = True, split_cores: bool = True, kv_extra_config: dict | None = None,
                 api_key: str | None = None):
        self.kv_extra_config = dict(DEFAULT_KV_EXTRA_CONFIG if kv_extra_config is None else kv_extra_config)
        # Both servers answer every route but /health only with it; one random key when none is given (the
        # router sends one key to both).
        self.api_key = check_api_key(api_key) or random_api_key()
        self.connector, self.connector_reason = check_pair(producer, consumer, connector, env, self.kv_extra_config)
        check_seconds(start_timeout, "start_timeout")
        check_seconds(request_timeout, "request_timeout")
        self.producer_topology = producer.with_(pd_role="producer", connector=self.connector)
        self.consumer_topology = consumer.with_(pd_role="consumer", connector=self.connector)
        self.start_timeout = start_timeout
        self.request_timeout = request_timeout
        # None: a fresh kit-pd-* folder at start(), removed at stop() unless the run failed (a pair built but never
        # started, e.g. refused by its router choice, leaves nothing).
        self.log_dir = Path(log_dir) if log_dir else None
        self.run_dir = None
        if self.log_dir is not None:
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
        self.uds_dir: str | None = None
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
        self.served_topology[role] = served = as_served(topo, self.kv_extra_config)
        # Each server's HTTP on a Unix socket in a folder of mode 0700: this user's processes only, and a socket
        # vllm-router reaches from its private network through kit.engine.bridge (kit.pd.vllm_router).
        if self.uds_dir is None:
            self.uds_dir = tempfile.mkdtemp(prefix="kit-uds-")
        return Server(served, env=env, log_path=self.log_dir / f"{role}.log", name=role, in_pair=True,
                      api_key=self.api_key, uds=os.path.join(self.uds_dir, f"{role}.sock"))

    def start(self) -> "PDPair":
        # Write a random checkpoint once, before two processes race to write it.
        self.producer_topology.model_path()
        if self.log_dir is None:
            self.run_dir = self.log_dir = Path(tempfile.mkdtemp(prefix="kit-pd-", dir=cache_dir()))
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
            # kit.engine.procs starts each server with PR_SET_PDEATHSIG, which the kernel fires when the *thread*
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
                        if errors and role not in errors and role not in stopped_by_us and proc is not None \
                                and not booted[role].is_set():
                            # The other server failed before this one had a process to end (boot() could not
                            # stop it then): end it now instead of letting it start for nothing.
                            stopped_by_us.add(role)
                            try:
                                proc.terminate(grace=2.0)
                            except Exception:  # noqa: BLE001 - it may be ending on its own
                                pass
                            continue
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
                self.model_name[role] = model_id(srv)
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
            self.failed = True
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
        if self.uds_dir:
            shutil.rmtree(self.uds_dir, ignore_errors=True)
            self.uds_dir = None
        self.release_run_dir()

    def describe(self) -> dict:
        return {"connector": self.connector, "connector_class": self.producer_topology.kv_transfer_config()["kv_connector"],
                "connector_reason": self.connector_reason,
                "producer": self.producer_topology.describe(), "consumer": self.consumer_topology.describe(),
                "producer_kv_transfer_config": self._served_kv("producer"),
                "consumer_kv_transfer_config": self._served_kv("consumer"),
                "producer_url": self.producer.where if self.producer else None,
                "consumer_url": self.consumer.where if self.consumer else None,
                "side_channel_ports": dict(self.side_channel_ports), "start_seconds": dict(self.start_seconds),
                "omp_threads_bind": {r: e.get("VLLM_CPU_OMP_THREADS_BIND") for r, e in self.server_env.items()},
                "block_size": self.block_size,
                "logs": {r: str(self.log_dir / f"{r}.log") for r in ("producer", "consumer")} if self.log_dir else None}

    def _served_kv(self, role: str) -> dict | None:
        t = self.served_topology.get(role) or (self.producer_topology if role == "producer" else self.consumer_topology)
        return t.extra_engine_args.get("kv_transfer_config") or t.kv_transfer_config()

    # -- counters --------------------------------------------------------------------------------
    def _metrics_text(self, srv: Server) -> str:
        return get(srv, "/metrics").decode()

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
        def deaths() -> str | None:
            dead = self.dead_servers()
            return _deaths(dead) if dead else None

        try:
            return call_watched(lambda: fn(*args), deaths, name=f"pd-{what}")
        except Abandoned as e:
            raise PDError(f"{what} abandoned: {e}") from None
        except Exception as e:
            # The call failed: if a server is gone, that is the root cause (a consumer whose producer died after
            # the prefill answers a plain HTTP 500), so name it.
            if dead := deaths():
                raise PDError(f"{what} failed ({type(e).__name__}: {e}): {dead}") from e
            raise

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
            pres = self._watched("producer prefill", post_json, self.producer, "/v1/completions", pbody, headers,
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
                out = self._watched("consumer decode", stream_completion, self.consumer, cbody, headers,
                                    self.request_timeout, "consumer")
                rec.consumer_ttft_s = round(out["first_token_time"] - t1, 4) if out["first_token_time"] else None
                rec.token_ids, rec.text, rec.finish_reason = out["token_ids"], out["text"], out["finish_reason"]
                metrics = out.get("metrics")
                if rec.prompt_token_ids is None:
                    rec.prompt_token_ids = out.get("prompt_token_ids")
            else:
                cres = self._watched("consumer decode", post_json, self.consumer, "/v1/completions", cbody, headers,
                                     self.request_timeout, "consumer")
                cch = cres["choices"][0]
                rec.token_ids = list(cch.get("token_ids") or [])
                rec.text, rec.finish_reason = cch.get("text", ""), cch.get("finish_reason")
                metrics = cres.get("metrics")
            t2 = time.monotonic()
            rec.consumer_s = round(t2 - t1, 4)
            rec.total_s = round(t2 - t0, 4)
            finish_record(rec, metrics, max_tokens, "consumer")
        except Exception as e:  # noqa: BLE001 - one request's failure is data, not a crash
            self.record_failure(rec, e, t0)
        return rec

    def record_failure(self, rec: PDRequest, e: Exception, t0: float) -> None:
        """A failed request's record: the error, what the servers logged about its KV handoff, the time taken."""
        rec.error = f"{type(e).__name__}: {e}"
        hints = self.handoff_diagnosis(rec.request_id)
        if hints:
            rec.error += "\n  what the servers logged about this request's KV:\n    " + "\n    ".join(hints)
        rec.total_s = round(time.monotonic() - t0, 4)

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
                      concurrency: int = 1, route: Callable[..., PDRequest] | None = None
                      ) -> tuple[list[PDRequest], dict]:
        """All prompts through the pair; returns records (prompt order) and the transfer totals.

        ``concurrency=1``: one at a time, each with its own counter differences. ``>1``: that many threads
        at once; counters are then totals over the batch. ``route``: what sends one prompt
        (``route(prompt, max_tokens, stream, index)``), :meth:`complete` unless given (e.g.
        :meth:`kit.pd.vllm_router.VllmRouter.complete`).
        """
        route = route or self.complete
        prompts = check_prompts(prompts)
        check_count(concurrency, "concurrency")
        before = self.counters()
        recs: list[PDRequest]
        if concurrency <= 1:
            recs = []
            for i, p in enumerate(prompts):
                b = self.counters()
                r = route(p, max_tokens=max_tokens, stream=stream, index=i)
                if r.error is None:
                    a = self.settle(b, 1, r.prompt_tokens or 0)
                    _fill_transfer(r, a, b)
                recs.append(r)
        else:
            ex = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="pd-req")
            try:
                futs = [ex.submit(route, p, max_tokens, stream, i) for i, p in enumerate(prompts)]
                recs = [f.result() for f in futs]
            finally:
                # Ctrl-C (or any error) here: drop the queued prompts instead of waiting for all of them (a
                # ``with`` block would); the requests in flight end when the caller stops the servers.
                ex.shutdown(wait=False, cancel_futures=True)
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


def finish_record(rec: PDRequest, metrics: dict | None, max_tokens: int, who: str) -> None:
    """Fill what the consumer's answer carries (per-request metrics, the prompt length) and check the length:
    ``who`` (the server or router that answered) must have returned ``max_tokens`` token ids."""
    if metrics:
        rec.consumer_ttft_server_ms = metrics.get("time_to_first_token_ms")
        rec.consumer_spec = metrics.get("speculative_decoding")
    if rec.prompt_tokens is None and rec.prompt_token_ids is not None:
        rec.prompt_tokens = len(rec.prompt_token_ids)
    if len(rec.token_ids) != max_tokens:
        raise PDError(f"{who} returned {len(rec.token_ids)} token ids, expected {max_tokens}")


def _fill_transfer(r: PDRequest, after: dict[str, Counters], before: dict[str, Counters]) -> None:
    p, c = after["producer"] - before["producer"], after["consumer"] - before["consumer"]
    r.kv_bytes_transferred = int(p.nixl_bytes + c.nixl_bytes)
    r.kv_transfers = int(p.nixl_transfers + c.nixl_transfers)
    r.kv_descriptors = int(p.nixl_descriptors + c.nixl_descriptors)
    r.consumer_prefill_tokens_computed = int(c.local_compute)
    r.consumer_external_tokens = int(c.external_kv_transfer)
    r.consumer_local_cache_hit_tokens = int(c.local_cache_hit)


def _deaths(dead: dict[str, str]) -> str:
    """``PDPair.dead_servers()`` as one phrase: 'the producer died (...); the consumer died (...)'."""
    return "the " + "; the ".join(f"{r} died ({m})" for r, m in dead.items())
