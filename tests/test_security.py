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


# What vllm-router 0.1.17 (a fork of SGLang's router) serves; the bridge in front answers each without the key.
ROUTER_ROUTES = [("GET", "/health"), ("GET", "/health_generate"), ("GET", "/v1/models"), ("GET", "/get_model_info"),
                 ("GET", "/get_server_info"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                 ("POST", "/generate"), ("POST", "/flush_cache"), ("GET", "/get_loads"), ("GET", "/list_workers"),
                 ("POST", "/add_worker"), ("POST", "/remove_worker"), ("GET", "/metrics")]


@pytest.mark.engine
def test_a_pd_pair_and_its_vllm_router_answer_no_route_without_the_key(no_leftovers):
    """A PD pair (PP=1 -> PP=1, pull) with vllm-router in front, as ``kit pd --router vllm-router`` starts it.
    vllm-router 0.1.17 itself answers anyone (checked from inside its private network: without a key it lists
    its workers and serves a completion); the kit reaches it only through the bridge's Unix socket, where every route but ``GET /health``
    answers 401 without the key. Both servers (on Unix sockets) answer every route of theirs with 401 but the
    probe; a completion with the key goes through; no new TCP listener in the host's network is beyond
    loopback, and none is the router's or the servers' HTTP."""
    import subprocess
    import sys

    from conftest import MODEL

    from kit import pd
    from kit.engine import netns
    from kit.engine.procs import is_loopback

    if netns.unavailable():
        pytest.skip(f"no private network here: {netns.unavailable()}")
    before = {(s["ip"], s["port"]) for s in netns.host_listening()}
    p, c = pd.pd_topologies(MODEL, 1, None, 1, None, random_weights=True)
    with pd.PDPair(p, c, warmup=False) as pair, pd.VllmRouter(pair) as router:
        for srv in (pair.producer, pair.consumer):
            routes = srv.routes()
            assert len(routes) > 20 and ("POST", "/invocations") in routes, routes
            assert srv.open_routes() == {("GET", "/health"): 200}, srv.name
        assert router.open_routes(ROUTER_ROUTES) == {("GET", "/health"): 200}
        # Stock vllm-router, reached from inside its network without a key: it lists its workers and serves a
        # completion (calling the servers with its own key): what the bridge keeps from everyone else.
        code = ("import httpx\nu = 'http://127.0.0.1:%d'\nprint(httpx.get(u + '/list_workers').status_code, "
                "httpx.post(u + '/v1/completions', json={'model': %r, 'prompt': 'x', 'max_tokens': 2}, "
                "timeout=120).status_code)" % (router.port, pair.model_name["consumer"]))
        inside = subprocess.run(router.network.prefix() + [sys.executable, "-c", code], capture_output=True,
                                text=True, timeout=180)
        assert inside.stdout.split() == ["200", "200"], (inside.stdout, inside.stderr[-400:])
        rec = router.complete("def add(a, b):\n    return", max_tokens=4)
        assert rec.error is None and len(rec.token_ids) == 4, rec.error
        new = [s for s in netns.host_listening() if (s["ip"], s["port"]) not in before]
        assert all(is_loopback(s["ip"]) for s in new), new
        assert router.port not in {s["port"] for s in new}
        print(f"servers: {len(routes)} routes each, router: {len(ROUTER_ROUTES)} routes, 401 but GET /health; "
              f"{len(new)} new host listeners, all on loopback")
