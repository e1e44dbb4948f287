"""Addresses and ports: the one place the kit picks a free port or a local node's address. Everything binds to
loopback unless a caller passes another host."""
from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether ``port`` on ``host`` can be bound now."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct ports that were free on ``host`` (all held at once while picked, so they differ)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind((host, 0))
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def free_port(host: str = LOOPBACK) -> int:
    """One port that was free on ``host``."""
    return free_ports(1, host)[0]


def local_node_ip(rank: int) -> str:
    """The loopback address local node ``rank`` binds to (127.0.0.2, 127.0.0.3, ...; all of 127/8 is loopback).
    Ray keeps these (it rewrites 127.0.0.1 and localhost to the machine's outward address), and distinct
    addresses make the nodes look like separate hosts to vLLM."""
    return f"127.0.0.{2 + rank}"
