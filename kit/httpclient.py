"""The kit's one HTTP client: ``httpx`` (installed with vLLM), shared by every call to a vLLM server.

Loopback only: proxies from the environment are ignored, and no connection is kept alive (each request gets a
fresh one, so a restarted or dying server leaves none stale). :class:`kit.engine.Server` uses it for its health
wait and :meth:`~kit.engine.Server.post`; :mod:`kit.pd.client` for the pair's requests and streams.
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
