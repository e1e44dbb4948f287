"""Addresses and ports: the one place the kit picks a free port or a local node's address. Everything binds to
loopback unless a caller passes another host."""
from __future__ import annotations

import random
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


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
# Below this sit well-known and registered services, and Ray's worker ports (10002-19999 by default), which Ray
# refuses to share with any port the kit gives its other components.
_LOWEST = 20000


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports handed out by ``bind(port 0)`` and outgoing connections (Linux default)."""
    try:
        lo, hi = (int(x) for x in open(EPHEMERAL_RANGE_FILE).read().split()[:2])
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _pool() -> range | None:
    """Ports outside the ephemeral range (and above Ray's worker ports) to pick from, or None when there is no room
    for a pool of 2,000."""
    lo, hi = ephemeral_range()
    if lo - _LOWEST >= 2000:
        return range(_LOWEST, lo)
    if 65535 - hi >= 2000:
        return range(hi + 1, 65536)
    return None


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct ports that were free on ``host`` (all held at once while picked, so they differ).

    They come from outside the kernel's ephemeral range, at random: vLLM binds the ports the kit passes it seconds
    after they were picked (after the model loads), and every process that binds port 0 in the meantime (vLLM's own
    ``get_open_port``, in a second server starting beside the first) is handed ephemeral ports, which therefore
    never land on a port picked here. Seen without this: a PD pair's consumer failing with ``ZMQError: Address
    already in use`` on its NIXL side-channel port."""
    pool = _pool()
    rng = random.SystemRandom()
    socks, ports = [], []
    try:
        tries = 0
        while len(ports) < n:
            s = socket.socket()
            port = 0
            if pool is not None and tries < 50 * n:
                tries += 1
                port = rng.choice(pool)
                if port in ports:
                    s.close()
                    continue
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
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
