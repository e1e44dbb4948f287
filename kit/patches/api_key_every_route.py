"""A server started with an API key answers no route without it, except the liveness probe ``/health``.

What breaks without it (vLLM 0.32.0, ``vllm serve`` with ``--api-key`` or ``VLLM_API_KEY``): the key guards only
paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere`` (``vllm/entrypoints/serve/middleware/authenticate.py``:
``AuthenticationMiddleware.__call__`` checks ``url_path.startswith(GUARDED_PREFIX)``). Measured on a kit server with a key: ``POST /invocations`` serves
completions without it, ``/tokenize``, ``/detokenize``, ``/metrics``, ``/load``, ``/version``, ``/openapi.json`` and,
with ``VLLM_SERVER_DEV_MODE=1``, ``/collective_rpc`` (a method call on every worker) and ``/reset_prefix_cache``
answer anyone who reaches the port, other local users included.
Fix: the same middleware with the path rule inverted: every HTTP and WebSocket request but ``OPTIONS`` (CORS
preflight, as before) and ``GET``/``HEAD /health`` must carry ``Authorization: Bearer <key>``; the token check is
vLLM's own (``verify_token``, a constant-time compare of hashes). Nothing changes for a server started without a
key (vLLM does not install the middleware then); the kit starts none such: without a user key each server gets a
random one (:class:`kit.engine.Server`).
Processes: the front end (vLLM's API server). Runner: any. Upstream: none found (vLLM's docs say the key guards
``/v1``; no issue or PR asks for every route). Target: vLLM 0.32.0.
Removal: when vLLM's middleware guards every route (or offers a setting for it).
Tests: ``tests/test_security.py::test_api_key_every_route_off_and_on`` (the middleware, off and on) and
``tests/test_pd.py::test_pd_tree_listens_on_loopback_only_and_wants_its_api_key`` (every route of two live servers).
Turn off: ``KIT_PATCHES=all,-api_key_every_route``.
"""
from __future__ import annotations

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "api_key_every_route"
# The one route that answers without the key: the liveness probe the kit and load balancers poll.
OPEN_ROUTES = frozenset({("GET", "/health"), ("HEAD", "/health")})
MODULE = "vllm.entrypoints.serve.middleware.authenticate"
SYMBOL = MODULE + ":AuthenticationMiddleware.__call__"
DEFECT = "GUARDED_PREFIX"  # the defect: __call__ checks the key only under these path prefixes


def _module():
    import importlib

    return importlib.import_module(MODULE)


def _wrap(orig):
    mod = _module()  # vLLM's module: its own starlette names (the kit does not import starlette itself)

    def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            return self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if (scope.get("method"), path) in OPEN_ROUTES or self.verify_token(mod.Headers(scope=scope)):
            return self.app(scope, receive, send)
        return mod.JSONResponse(content={"error": "Unauthorized"}, status_code=401)(scope, receive, send)

    __call__.__wrapped__ = orig
    return __call__


def _needed() -> "bool | str":
    import inspect

    return DEFECT in inspect.getsource(_module().AuthenticationMiddleware.__call__)


def _apply() -> None:
    install(_module().AuthenticationMiddleware, "__call__", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="an API key guarded only /v1 (and /v2, /inference, /cohere): /invocations, /tokenize, /metrics, "
            "/collective_rpc ... answered anyone",
    why=("vLLM's AuthenticationMiddleware checks the bearer token only for paths starting with /v1, /v2, "
         "/inference or /cohere; the rest of "
         "the app (completions through /invocations, tokenizer, metrics, the development endpoints) is open to "
         "whoever reaches the port. The patch makes the same middleware check every HTTP and WebSocket request "
         "except OPTIONS and GET/HEAD /health, with vLLM's own token check."),
    upstream="none found (vLLM documents the key as guarding the /v1 API)",
    target="vLLM 0.32.0 (vllm/entrypoints/serve/middleware/authenticate.py AuthenticationMiddleware.__call__)",
    symbols=(SYMBOL,),
    processes={Proc.FRONT_END},
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="when vLLM's middleware guards every route, or has a setting for it",
    tests=("tests/test_security.py::test_api_key_every_route_off_and_on",
           "tests/test_pd.py::test_pd_tree_listens_on_loopback_only_and_wants_its_api_key"),
    findings="the-api-key-guards-only-v1",
    anchors=(Anchor(SYMBOL, DEFECT), Anchor(MODULE + ":AuthenticationMiddleware.verify_token"),
             Anchor(MODULE + ":Headers"), Anchor(MODULE + ":JSONResponse")),  # what the replacement uses
    apply=_apply,
    needed=_needed,
)
