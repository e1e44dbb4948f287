"""Closed by default: what the kit's servers answer without their key (docs/security.md).

The middleware test runs vLLM's own ``AuthenticationMiddleware`` in front of a small Starlette app with routes
shaped like vLLM's (no engine); the live servers' every route is checked in
``tests/test_pd.py::test_pd_tree_listens_on_loopback_only_and_wants_its_api_key``.
"""
from __future__ import annotations

import pytest

from kit.engine.httpclient import random_api_key

KEY = "kit-test-key"
# (method, path) -> what vLLM 0.32 serves there (shapes only; the live check reads the real route list)
ROUTES = [("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/invocations"),
          ("POST", "/tokenize"), ("GET", "/metrics"), ("POST", "/collective_rpc"), ("GET", "/version"),
          ("GET", "/openapi.json")]


def _client(patched: bool, monkeypatch):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from kit.patches import api_key_every_route as patch

    from kit.patches import marked

    mod = patch._module()
    stock = mod.AuthenticationMiddleware.__call__
    while marked(stock):  # applied in this process by an earlier test's apply_selected(): vLLM's own is under it
        stock = stock.__wrapped__
    monkeypatch.setattr(mod.AuthenticationMiddleware, "__call__", patch._wrap(stock) if patched else stock)

    async def ok(request):
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route(p, ok, methods=[m]) for m, p in ROUTES])
    app.add_middleware(mod.AuthenticationMiddleware, tokens=[KEY])
    return TestClient(app)


def _statuses(c, headers=None) -> dict:
    return {p: c.request(m, p, headers=headers or {}).status_code for m, p in ROUTES}


def test_api_key_every_route_off_and_on(monkeypatch):
    """Off (vLLM 0.32 as shipped): without the key only /v1 answers 401; completions through /invocations,
    /tokenize, /metrics and /collective_rpc answer anyone. On: every route but /health answers 401 without the
    key, and every route answers with it."""
    stock = _statuses(_client(False, monkeypatch))
    assert stock["/v1/models"] == stock["/v1/completions"] == 401
    open_without_key = sorted(p for p, s in stock.items() if s == 200)
    assert open_without_key == sorted(["/health", "/invocations", "/tokenize", "/metrics", "/collective_rpc",
                                       "/version", "/openapi.json"]), stock
    c = _client(True, monkeypatch)
    fixed = _statuses(c)
    assert {p for p, s in fixed.items() if s != 401} == {"/health"}, fixed
    assert set(_statuses(c, {"Authorization": f"Bearer {KEY}"}).values()) == {200}
    assert _statuses(c, {"Authorization": "Bearer wrong"})["/invocations"] == 401
    assert c.request("OPTIONS", "/invocations").status_code != 401  # CORS preflight, as vLLM lets it pass


def test_a_server_without_a_user_key_gets_a_random_one():
    """Nothing the kit starts is open by default: each Server and PD pair without a key makes one."""
    from conftest import MODEL

    from kit import engine, pd
    from kit.core.topology import Topology

    t = Topology(model=MODEL, random_weights=True)
    a, b = engine.Server(t), engine.Server(t)
    assert a.api_key and b.api_key and a.api_key != b.api_key
    assert a.auth_headers() == {"Authorization": f"Bearer {a.api_key}"}
    assert engine.Server(t, api_key="mine").api_key == "mine"
    assert random_api_key() != random_api_key()
    with pytest.raises(pd.TopologyError, match="api_key must be"):
        engine.Server(t, api_key="two words")
