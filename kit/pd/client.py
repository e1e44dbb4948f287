"""HTTP to the pair's vLLM servers (on their Unix sockets) and to vllm-router through the kit's ``httpx`` clients
(:mod:`kit.engine.httpclient`, ``srv.http()``): one POST helper, the server-sent-event stream.

Every call names the server it went to and turns transport failures, timeouts and HTTP errors into a
:class:`PDError` whose message says which step failed; a caller watching the servers (``PDPair._watched``)
adds the root cause when a server died.
"""
from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

import httpx

from kit.engine import Server


class PDError(RuntimeError):
    """A PD request failed (HTTP error, timeout, malformed answer); the message says which step."""


def get(srv: Server, path: str, timeout: float = 30.0, attempts: int = 5) -> bytes:
    """GET with a few retries on a refused or dropped connection (seen right after start-up on a loaded machine)."""
    for i in range(attempts):
        try:
            r = srv.http().get(srv.url + path, headers=srv.auth_headers(), timeout=timeout)
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as e:
            if i == attempts - 1:
                raise PDError(f"GET {path} on {srv.name} failed {attempts} times: {e!r}") from None
            print(f"kit.pd: GET {srv.where}{path}: {e!r}, retrying", file=sys.stderr, flush=True)
            time.sleep(1.0)
            continue
        except httpx.TimeoutException as e:
            raise PDError(f"GET {path} on {srv.name} timed out ({timeout:.0f} s limit): {e!r}") from None
        if r.status_code != 200:
            raise PDError(f"GET {path} on {srv.name} answered HTTP {r.status_code}: {r.text[:600]}")
        return r.content
    raise AssertionError("unreachable")


def model_id(srv: Server) -> str:
    """The model name the server answers to (``/v1/models``)."""
    return json.loads(get(srv, "/v1/models"))["data"][0]["id"]


@contextmanager
def _post(srv: Server, path: str, body: dict, headers: dict | None, timeout: float, what: str) -> Iterator[httpx.Response]:
    """The one POST: a JSON body, the response open for reading; failures (also while reading) as PDError."""
    try:
        with srv.http().stream("POST", srv.url + path, json=body, headers={**srv.auth_headers(), **(headers or {})},
                              timeout=timeout) as r:
            if r.status_code != 200:
                r.read()
                raise PDError(f"{what} answered HTTP {r.status_code}: {r.text[:600]}")
            yield r
    except httpx.TimeoutException as e:
        raise PDError(f"{what} timed out ({timeout:.0f} s limit, {type(e).__name__})") from None
    except httpx.TransportError as e:
        raise PDError(f"{what} call failed: {type(e).__name__}: {e}") from None


def post_json(srv: Server, path: str, body: dict, headers: dict | None = None, timeout: float = 120.0,
              what: str | None = None) -> dict:
    """POST a JSON body and return the JSON answer."""
    with _post(srv, path, body, headers, timeout, what or srv.name) as r:
        return json.loads(r.read())


def post_events(srv: Server, path: str, body: dict, headers: dict | None = None, timeout: float = 120.0,
                what: str | None = None) -> Iterator[dict]:
    """POST a JSON body and yield the ``data:`` events of the server-sent-event answer, as dicts, until ``[DONE]``."""
    with _post(srv, path, body, {"Accept": "text/event-stream", **(headers or {})}, timeout, what or srv.name) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                yield json.loads(payload)


def stream_completion(srv: Server, body: dict, headers: dict | None = None, timeout: float = 120.0,
                      what: str | None = None) -> dict:
    """A streamed ``/v1/completions`` call, gathered: token ids, text, finish reason, the monotonic time the
    first token arrived, the per-request metrics (vLLM's ``enable_per_request_metrics``), the prompt's ids."""
    what = what or srv.name
    out: dict[str, Any] = {"token_ids": [], "text": "", "finish_reason": None, "first_token_time": None,
                           "chunks": 0, "metrics": None, "prompt_token_ids": None}
    for chunk in post_events(srv, "/v1/completions", {**body, "stream": True}, headers, timeout, what):
        if "error" in chunk and not chunk.get("choices"):
            raise PDError(f"{what} stream error: {json.dumps(chunk)[:400]}")
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
