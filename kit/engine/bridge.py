"""The edge of a private network (:mod:`kit.engine.netns`) for a program that speaks only TCP: a process run
inside the network that joins it to Unix sockets, which the file system (not the network) carries across.

    python -m kit.engine.bridge --tcp 127.0.0.1:8100=/dir/producer.sock --http /dir/router.sock=127.0.0.1:8200

- ``--tcp HOST:PORT=SOCKET``: listen on ``HOST:PORT`` inside the network and pass each connection, byte for byte,
  to the Unix socket ``SOCKET`` outside (a kit server started with ``--uds``): how a program inside reaches a
  server that has no TCP port at all.
- ``--http SOCKET=HOST:PORT``: serve HTTP on the Unix socket ``SOCKET`` (in a 0700 folder) and forward each
  request to ``HOST:PORT`` inside the network, after checking the API key (``KIT_BRIDGE_API_KEY``) on every route
  but ``GET``/``HEAD /health``: how the kit reaches a program inside that has no API key of its own (vllm-router
  0.1.17 checks none on its inbound side).

Why a bridge at all: vllm-router listens on TCP and calls its workers over TCP; on the host's loopback any local
user could use it without a key. Inside the run's own network namespace its TCP sockets are reachable by no one
outside, and the two Unix sockets are the only ways in and out.
"""
from __future__ import annotations

import argparse
import asyncio
import hmac
import os
import sys

KEY_ENV = "KIT_BRIDGE_API_KEY"
OPEN = {("GET", "/health"), ("HEAD", "/health")}  # the liveness probe, as on the kit's vLLM servers


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:  # noqa: BLE001 - the other side may be gone already
            pass


async def _tcp_to_uds(host: str, port: int, path: str) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return await asyncio.start_server(handle, host, port)


def key_proxy(target: str, key: str):
    """An ASGI app that forwards every request to ``target`` (``http://host:port``) when it carries ``key`` as
    its bearer token (or is the liveness probe), and answers 401 otherwise; bodies stream both ways."""
    import httpx
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse

    upstream = httpx.AsyncClient(base_url=target, timeout=None, trust_env=False)
    want = f"Bearer {key}".encode()

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        got = request.headers.get("authorization", "").encode()
        if (request.method, request.url.path) not in OPEN and not hmac.compare_digest(got, want):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        # The request body is read whole (a JSON request is small), the answer streams (server-sent events).
        drop = (b"host", b"authorization", b"content-length", b"transfer-encoding", b"connection")
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in drop]
        req = upstream.build_request(request.method, request.url.path, params=request.url.query or None,
                                     headers=headers, content=await request.body())
        try:
            resp = await upstream.send(req, stream=True)
        except httpx.HTTPError as e:
            await JSONResponse({"error": f"bridge: {type(e).__name__}: {e}"}, status_code=502)(scope, receive, send)
            return
        hop = {"content-length", "transfer-encoding", "connection"}
        out = StreamingResponse(resp.aiter_raw(), status_code=resp.status_code,
                                headers={k: v for k, v in resp.headers.items() if k.lower() not in hop},
                                background=BackgroundTask(resp.aclose))
        await out(scope, receive, send)

    return app


async def _serve(tcp: list[tuple[str, int, str]], http: list[tuple[str, str]], key: str) -> None:
    import uvicorn

    servers = [await _tcp_to_uds(h, p, path) for h, p, path in tcp]
    tasks = [asyncio.ensure_future(s.serve_forever()) for s in servers]
    for path, target in http:
        config = uvicorn.Config(key_proxy(f"http://{target}", key), uds=path, log_level="warning",
                                timeout_keep_alive=5)
        tasks.append(asyncio.ensure_future(uvicorn.Server(config).serve()))
    print("bridge: ready", flush=True)
    await asyncio.gather(*tasks)


def _split(spec: str, what: str) -> tuple[str, str]:
    left, sep, right = spec.partition("=")
    if not sep or not left or not right:
        raise SystemExit(f"bridge: {what} wants A=B, got {spec!r}")
    return left, right


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kit.engine.bridge", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tcp", action="append", default=[], help="HOST:PORT=SOCKET (inside -> Unix socket outside)")
    ap.add_argument("--http", action="append", default=[], help="SOCKET=HOST:PORT (key-checked HTTP, outside -> in)")
    args = ap.parse_args(argv)
    key = os.environ.get(KEY_ENV, "")
    if args.http and not key:
        print(f"bridge: --http needs the API key in {KEY_ENV}", file=sys.stderr)
        return 2
    tcp = []
    for spec in args.tcp:
        addr, path = _split(spec, "--tcp")
        host, _, port = addr.rpartition(":")
        tcp.append((host, int(port), path))
    http = [_split(spec, "--http") for spec in args.http]
    asyncio.run(_serve(tcp, http, key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
