"""kit.core.net: the ports the kit picks are free, distinct and outside the kernel's ephemeral range."""
from __future__ import annotations

import socket

from kit.core import net


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range():
    lo, hi = net.ephemeral_range()
    ports = net.free_ports(16)
    assert len(set(ports)) == 16
    for p in ports:
        assert not lo <= p <= hi, (p, lo, hi)
        assert not 10002 <= p <= 19999, p  # Ray's default worker ports: Ray refuses a component port among them
        assert net.port_is_free(p)


def test_a_port_bound_by_port_zero_is_never_picked():
    # What a second vLLM's get_open_port() holds while the kit's ports wait to be bound.
    held = []
    try:
        for _ in range(64):
            s = socket.socket()
            s.bind((net.LOOPBACK, 0))
            held.append(s)
        taken = {s.getsockname()[1] for s in held}
        assert not taken & set(net.free_ports(32))
    finally:
        for s in held:
            s.close()


def test_without_room_outside_the_range_it_falls_back_to_the_kernel(monkeypatch):
    monkeypatch.setattr(net, "ephemeral_range", lambda: (1024, 65535))
    ports = net.free_ports(4)
    assert len(set(ports)) == 4 and all(net.port_is_free(p) for p in ports)
