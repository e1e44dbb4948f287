"""The kit's one HTTP client: ``httpx`` (installed with vLLM), shared by every call to a vLLM server.

Loopback only: proxies from the environment are ignored, and no connection is kept alive (each request gets a
fresh one, so a restarted or dying server leaves none stale). :class:`kit.engine.Server` uses it for its health
wait and :meth:`~kit.engine.Server.post`; :mod:`kit.pd.client` for the pair's requests and streams. A server
started with an API key (vLLM's ``VLLM_API_KEY``; with the kit's ``api_key_every_route`` patch it guards every
route but ``/health``) gets it in every request from :func:`auth_headers`; a server the user gave no key gets
:func:`random_api_key`.
"""
from __future__ import annotations

import secrets
import threading

import httpx

_CLIENTS: dict[str | None, httpx.Client] = {}
_LOCK = threading.Lock()


def client(uds: str | None = None) -> httpx.Client:
    """The process's one client (thread-safe); ``uds``: the one for a server on that Unix socket (a multi-node
    leader in its private network, :mod:`kit.engine.netns`)."""
    with _LOCK:
        if uds not in _CLIENTS:
            transport = httpx.HTTPTransport(uds=uds) if uds else None
            _CLIENTS[uds] = httpx.Client(trust_env=False, limits=httpx.Limits(max_keepalive_connections=0),
                                         transport=transport)
        return _CLIENTS[uds]


def close_client(uds: str) -> None:
    """Close and forget the client of a Unix-socket server that has stopped."""
    with _LOCK:
        c = _CLIENTS.pop(uds, None)
    if c is not None:
        c.close()


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header a server started with ``api_key`` wants on every request but ``/health`` ({} without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def random_api_key() -> str:
    """A fresh key for a server the user gave none: nothing the kit starts answers without a key."""
    return "kit-" + secrets.token_urlsafe(24)
