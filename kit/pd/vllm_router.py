"""vLLM's own PD router (the ``vllm-router`` package) in front of a :class:`~kit.pd.pair.PDPair`.

``vllm-router --vllm-pd-disaggregation --prefill URL --decode URL`` does what :meth:`PDPair.complete` does in
one client call: it POSTs the request to the producer with ``max_tokens=1`` and ``kv_transfer_params``
asking for a remote decode, then the original request to the consumer with the returned
``kv_transfer_params`` and the same ``X-Request-Id``. :class:`VllmRouter` starts it on loopback against a
started pair (a managed process with its own log), and routes prompts through it; the KV bytes are read
from the same NIXL counters as the kit's own router (:meth:`PDPair.complete_many` with ``route=``).

Closed: vllm-router 0.1.17 checks no API key on its inbound side, so the kit never puts it on the host's
network. It runs in a private network namespace of its own (:class:`~kit.engine.netns.PrivateNetwork`) with a
:mod:`kit.engine.bridge` beside it: the bridge passes the router's calls to the pair's servers (which serve on
Unix sockets in a 0700 folder) and serves the router to the kit on a Unix socket of its own, answering every route
but ``/health`` only with the pair's API key. Where no namespace can be made (not root, no iproute2) ``auto``
takes the kit's router and ``vllm-router`` is refused.

What it cannot do, and why the kit keeps its own router for it (:func:`choose_router`):

- push pairs with a PP>1 producer: vllm-router 0.1.17 rebuilds a push producer's ``kv_transfer_params`` and drops
  ``pp_size``, so a PP=2 consumer refuses the handoff and a PP=1 consumer counts one producer stage's write as
  all of them (``docs/findings.md#vllm-router-in-front-of-nixl-pairs``); ``auto`` sends every push pair through
  the kit's router;
- what lives between the two calls, which the router makes inside one HTTP request: the producer's answer (its
  first token and the ``kv_transfer_params`` it returned), the split of a request's time into prefill and decode
  (notebook 04's timeline), a pause between the calls (fault injection), and the log lines about one request's
  handoff (the router replaces the client's ``X-Request-Id`` with its own).
"""
from __future__ import annotations

import importlib.metadata
import os
import shlex
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from kit.core.topology import TopologyError
from kit.core.validate import check_choice
from kit.engine import bridge, netns
from kit.engine.httpclient import auth_headers, client, close_client
from kit.engine.lifecycle import ProcessLifecycle
from kit.engine.procs import ManagedProcess
from kit.pd.client import PDError, post_json, stream_completion
from kit.pd.pair import PDPair, PDRequest, finish_record

DEFAULT_ROUTER_START_TIMEOUT = 60.0
# Who sends a PD request's two calls: the kit (PDPair.complete) or vLLM's router; "auto" picks by connector.
ROUTERS = ("auto", "kit", "vllm-router")


def choose_router(router: str, connector: str, producer_pp: int) -> tuple[str, str]:
    """``("kit" | "vllm-router", reason)`` for a pair with this connector, decided before any process starts.

    ``auto``: vllm-router for the pull connector (measured: the reference tokens and the expected KV bytes);
    the kit's router for push. vllm-router 0.1.17 rebuilds a push producer's ``kv_transfer_params`` (those
    with ``transfer_mode: push``) from a fixed set of keys and drops ``pp_size``: the consumer then takes the
    producer for PP=1 (``docs/findings.md#vllm-router-in-front-of-nixl-pairs``).
    """
    check_choice(router, ROUTERS, "router")
    closed = why_not_closed()
    if router == "vllm-router" and closed:
        raise TopologyError(f"vllm-router checks no API key on its inbound side and the kit cannot put it in a private "
                            f"network here ({closed}): run as root, or use --router kit")
    if router == "vllm-router" and connector == "nixl-push" and producer_pp > 1:
        raise TopologyError(
            f"vllm-router cannot route this push pair (producer PP={producer_pp}): vllm-router 0.1.17 drops the "
            "producer's pp_size from a push handoff's kv_transfer_params, so a PP=2 consumer refuses the handoff and a "
            "PP=1 consumer counts one producer stage's write as all of them; use --router kit or auto")
    if router != "auto":
        return router, f"requested ({router})"
    if connector == "nixl" and closed:
        return "kit", f"pull connector, but vllm-router would be open to every local user here ({closed})"
    if connector == "nixl":
        return "vllm-router", "pull connector: vLLM's PD router (vllm-router) makes the prefill and decode calls"
    return "kit", ("push connector: vllm-router 0.1.17 drops the producer's pp_size from a push handoff's "
                   "kv_transfer_params, so the kit's router (which passes them unchanged) makes the two calls")


def why_not_closed() -> str | None:
    """Why vllm-router cannot run closed, in a private network, here (None: it can)."""
    return netns.unavailable()


def router_version() -> str | None:
    """The installed ``vllm-router`` version, None when it is not installed."""
    try:
        return importlib.metadata.version("vllm-router")
    except importlib.metadata.PackageNotFoundError:
        return None


def router_binary() -> str:
    """The ``vllm-router`` entry point next to this interpreter (or on PATH)."""
    here = Path(sys.executable).with_name("vllm-router")
    found = str(here) if here.exists() else shutil.which("vllm-router")
    if not found:
        raise PDError("vllm-router is not installed (pip install vllm-router; it is in the kit's dependencies)")
    return found


def router_command(prefill_url: str, decode_url: str, port: int, prometheus_port: int, request_timeout: float,
                   start_timeout: float) -> list[str]:
    """``vllm-router`` in vLLM PD mode for one prefill and one decode server, on loopback (its private network's,
    or the host's): NIXL, round robin, no retries (a retried prefill would hand over a second copy of the KV), no
    circuit breaker, an explicit Prometheus port, the workers' health polled every second at start."""
    return [router_binary(), "--vllm-pd-disaggregation", "--kv-connector", "nixl",
            "--prefill", prefill_url, "--decode", decode_url,
            "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(prometheus_port),
            "--policy", "round_robin", "--disable-retries", "--disable-circuit-breaker",
            "--request-timeout-secs", str(int(request_timeout)),
            "--worker-startup-timeout-secs", str(int(start_timeout)),
            "--worker-startup-check-interval", "1", "--log-level", "info"]


@dataclass
class _Endpoint:
    """What :mod:`kit.pd.client` needs of a server: its URL, its HTTP client, its key and a name for messages."""

    url: str
    uds: str | None = None
    api_key: str | None = None
    name: str = "vllm-router"

    @property
    def where(self) -> str:
        return f"unix:{self.uds}" if self.uds else self.url

    def http(self):
        return client(self.uds)

    def auth_headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)


# Inside the router's own network every port is free: fixed ones (no race with other runs).
_INSIDE = {"producer": 8100, "consumer": 8200, "router": 8300, "prometheus": 8400}


class VllmRouter(ProcessLifecycle):
    """``vllm-router`` in PD mode in front of a started :class:`PDPair`; a context manager."""

    def __init__(self, pair: PDPair, log_path: Path | str | None = None,
                 start_timeout: float = DEFAULT_ROUTER_START_TIMEOUT, api_key: str | None = None):
        """``api_key``: the key the pair's servers require (default: the pair's). vllm-router 0.1.17 sends its own
        ``OPENAI_API_KEY`` environment variable as the bearer token of both PD calls (not the client's
        ``Authorization`` header, nor ``--api-key``), so the key goes to the router's environment; the bridge in
        front of it asks every request for the same key."""
        if pair.producer is None or pair.consumer is None:
            raise PDError("start the pair before its router (use VllmRouter inside `with pair:`)")
        if why := why_not_closed():
            raise TopologyError(f"vllm-router cannot run closed here ({why}): use the kit's router")
        self.pair = pair
        self.api_key = api_key or pair.api_key
        self.log_path = Path(log_path) if log_path else pair.log_dir / "vllm-router.log"
        self.start_timeout = start_timeout
        self.port = _INSIDE["router"]
        self.endpoint = _Endpoint("http://localhost", uds=os.path.join(pair.uds_dir, "router.sock"),
                                  api_key=self.api_key)
        self.env = {"OPENAI_API_KEY": self.api_key}
        self.network: netns.PrivateNetwork | None = None
        self.bridge: ManagedProcess | None = None
        self.proc: ManagedProcess | None = None
        self.start_seconds: float | None = None
        self.command_line: str | None = None

    def command(self) -> list[str]:
        """The router's command line for this pair (:func:`router_command`), the servers as the router sees them:
        the bridge's ports in the router's network."""
        return router_command(f"http://127.0.0.1:{_INSIDE['producer']}", f"http://127.0.0.1:{_INSIDE['consumer']}",
                              self.port, _INSIDE["prometheus"], self.pair.request_timeout, self.start_timeout)

    def _start_bridge(self) -> None:
        """The router's network and the bridge in it (:mod:`kit.engine.bridge`)."""
        self.network = netns.PrivateNetwork().start()
        cmd = [sys.executable, "-m", "kit.engine.bridge", "--http", f"{self.endpoint.uds}=127.0.0.1:{self.port}"]
        for role, srv in (("producer", self.pair.producer), ("consumer", self.pair.consumer)):
            cmd += ["--tcp", f"127.0.0.1:{_INSIDE[role]}={srv.uds}"]
        self.bridge = ManagedProcess(self.network.prefix() + cmd, env={bridge.KEY_ENV: self.api_key},
                                     log_path=self.log_path.with_name("vllm-router-bridge.log"), name="bridge")

    def start(self) -> "VllmRouter":
        t0 = time.monotonic()
        cmd = self.command()
        self.command_line = shlex.join(cmd)
        deadline = t0 + self.start_timeout
        try:
            self._start_bridge()
            self.proc = ManagedProcess(self.network.prefix() + cmd, env=self.env, log_path=self.log_path, name="vllm-router")
            while True:
                for p in (self.proc, self.bridge):
                    if p is not None and not p.alive():
                        raise PDError(str(p.fail(f"exited with code {p.popen.returncode} during start-up")))
                try:
                    if self.endpoint.http().get(self.endpoint.url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise PDError(str(self.proc.fail(f"not healthy after {self.start_timeout:.0f} s")))
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = round(time.monotonic() - t0, 2)
        return self

    def stop(self) -> None:
        super().stop()
        if self.bridge is not None:
            self.bridge.terminate(grace=2.0)
            self.bridge = None
        if self.endpoint.uds:
            close_client(self.endpoint.uds)
        if self.network is not None:
            self.network.stop()
            self.network = None

    def open_routes(self, paths: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Which of ``paths`` answer a request without the key, with their HTTP status (closed: ``GET /health``)."""
        answers = {(m, p): self.endpoint.http().request(m, self.endpoint.url + p, timeout=30).status_code
                   for m, p in paths}
        return {k: code for k, code in answers.items() if code != 401}

    def complete(self, prompt: str, max_tokens: int = 32, stream: bool = False, index: int = 0,
                 request_id: str | None = None) -> PDRequest:
        """One prompt through the router; greedy, token ids returned; errors land in ``.error``. Both servers
        are watched during the call (:meth:`PDPair._watched`): a dead one ends the wait with its root cause.

        The router gives both calls an ``X-Request-Id`` of its own (``___prefill_addr_..._<uuid>``) in place of
        the client's; a non-streamed answer's ``id`` (``cmpl-<that id>``) replaces ``request_id`` in the record.
        """
        rid = request_id or f"pd-{uuid.uuid4().hex}"
        rec = PDRequest(index=index, request_id=rid, prompt=prompt, stream=stream)
        body = {"model": self.pair.model_name["consumer"], "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0.0, "ignore_eos": True, "return_token_ids": True, "stream": stream}
        headers = {"X-Request-Id": rid}
        t0 = time.monotonic()
        try:
            if stream:
                body["stream_options"] = {"include_usage": True}
                out = self.pair._watched("vllm-router stream", stream_completion, self.endpoint, body, headers,
                                         self.pair.request_timeout, "vllm-router")
                rec.consumer_ttft_s = round(out["first_token_time"] - t0, 4) if out["first_token_time"] else None
                rec.token_ids, rec.text, rec.finish_reason = out["token_ids"], out["text"], out["finish_reason"]
                rec.prompt_token_ids, metrics = out.get("prompt_token_ids"), out.get("metrics")
            else:
                res = self.pair._watched("vllm-router call", post_json, self.endpoint, "/v1/completions", body,
                                         headers, self.pair.request_timeout, "vllm-router")
                rec.request_id = str(res.get("id") or rid).removeprefix("cmpl-")
                ch = res["choices"][0]
                rec.token_ids = list(ch.get("token_ids") or [])
                rec.text, rec.finish_reason = ch.get("text", ""), ch.get("finish_reason")
                rec.prompt_token_ids = ch.get("prompt_token_ids")
                rec.prompt_tokens = (res.get("usage") or {}).get("prompt_tokens")
                metrics = res.get("metrics")
            rec.total_s = rec.consumer_s = round(time.monotonic() - t0, 4)
            finish_record(rec, metrics, max_tokens, "vllm-router")
        except Exception as e:  # noqa: BLE001 - one request's failure is data, not a crash
            self.pair.record_failure(rec, e, t0)
        return rec

    def complete_many(self, prompts: list[str], max_tokens: int = 32, stream: bool = False,
                      concurrency: int = 1) -> tuple[list[PDRequest], dict]:
        """All prompts through the router, with the pair's per-request and total NIXL counters."""
        return self.pair.complete_many(prompts, max_tokens=max_tokens, stream=stream, concurrency=concurrency,
                                       route=self.complete)
