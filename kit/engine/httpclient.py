"""The kit's one HTTP client: ``httpx`` (installed with vLLM), shared by every call to a vLLM server.

Loopback only: proxies from the environment are ignored, and no connection is kept alive (each request gets a
fresh one, so a restarted or dying server leaves none stale). :class:`kit.engine.Server` uses it for its health
wait and :meth:`~kit.engine.Server.post`; :mod:`kit.pd.client` for the pair's requests and streams. A server
started with an API key (vLLM's ``VLLM_API_KEY``, which guards ``/v1/*``) gets it in every request from
:func:`auth_headers`.
"""
from __future__ import annotations

import threading

import httpx

_CLIENT: httpx.Client | None = None
_LOCK = threading.Lock()


def client() -> httpx.Client:
    """The process's one client (thread-safe)."""
    global _CLIENT
    with _LOCK:
        if _CLIENT is None:
            _CLIENT = httpx.Client(trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))
        return _CLIENT


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header a server started with ``api_key`` wants on ``/v1/*`` requests ({} without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
