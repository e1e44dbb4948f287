"""Multi-node rendezvous: the rank-0 TCPStore listens on the master address only, not on every interface.

What breaks without it: in a multi-node run (``--nnodes 2 --master-addr 127.0.0.2 --master-port P``) vLLM's
rank-0 worker hosts the ``torch.distributed`` rendezvous store for ``tcp://MASTER_ADDR:P``
(``vllm/distributed/parallel_state.py:init_distributed_environment``, ``nnodes > 1``), and torch's TCPStore
server binds the wildcard address (``*:P``, every interface, IPv4 and IPv6) whatever host name it is given
(``torch/distributed/rendezvous.py:_create_c10d_store`` -> ``TCPStore(host_name, port, is_master=True)``):
seen with ``ss -ltnp`` as ``*:P ... VLLM::Worker_PP0`` during a two-node run on loopback addresses, the one
socket of the run not on loopback. On a real cluster it is the same: the store answers on every interface of
the head node, not only on the address the other nodes are told to use.
Fix: for the store's server (rank 0, no torchelastic agent store) bind a listening socket to the given host
and port first and hand it to the TCPStore (``master_listen_fd``, as vLLM's own ``create_tcp_store`` does);
clients and every other case are unchanged.
Processes: workers (rank 0 creates the store). Runner: any. Upstream: none found (torch's TCPStore has no
bind-address option; ``master_listen_fd`` is the documented way). Target: vLLM 0.32.0 with torch 2.13.
Removal: when torch's TCPStore binds its host name, or vLLM creates the multi-node store itself on
``master_addr``. Tests: ``tests/test_multinode.py::test_tcp_store_bind_host_off_and_on`` (store level) and the
two-node engine test (no socket of either node's tree listens beyond loopback).
Turn off: ``KIT_PATCHES=all,-tcp_store_bind_host``.
"""
from __future__ import annotations

import socket

from kit.patches import Kind, Patch, Proc, Runner, install

NAME = "tcp_store_bind_host"


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv4 or IPv6 by the address's own family)."""
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(addr)
        s.listen(2048)
    except BaseException:
        s.close()
        raise
    return s


def _module():
    """``torch.distributed.rendezvous`` the module (``from torch.distributed import rendezvous`` is a function)."""
    import importlib

    return importlib.import_module("torch.distributed.rendezvous")


def _wrap(orig):
    def _create_c10d_store(hostname, port, rank, world_size, timeout, use_libuv=True):
        from torch.distributed import TCPStore

        rdzv = _module()

        if rank != 0 or rdzv._torchelastic_use_agent_store() or not hostname:
            return orig(hostname, port, rank, world_size, timeout, use_libuv)
        if not 0 <= port < 2**16:
            raise ValueError(f"port must have value from 0 to 65535 but was {port}.")
        try:
            s = listen_socket(hostname, port)
        except OSError:
            # The port is taken, e.g. by a multi-tenant store this process already serves on it (vLLM's Ray
            # executor creates one before the rendezvous): torch's own call reuses that one.
            return orig(hostname, port, rank, world_size, timeout, use_libuv)
        fd = s.detach()
        try:
            # As torch's own call, plus the bound socket.
            return TCPStore(host_name=hostname, port=port, world_size=world_size, is_master=True, timeout=timeout,
                            multi_tenant=True, master_listen_fd=fd, use_libuv=use_libuv)
        except BaseException:
            socket.close(fd)
            raise
    return _create_c10d_store


def _needed() -> "bool | str":
    import inspect

    src = inspect.getsource(_module()._create_c10d_store)
    return "master_listen_fd" not in src


def _apply() -> None:
    install(_module(), "_create_c10d_store", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="multi-node runs: the rank-0 rendezvous TCPStore listened on every interface (*:master_port)",
    why=("With --nnodes > 1 vLLM rendezvouses over tcp://master_addr:master_port, and torch's TCPStore server "
         "(rank 0's worker) binds the wildcard address whatever host name it gets: the store answers on every "
         "interface. The patch binds a socket to the host and port first and gives it to the TCPStore "
         "(master_listen_fd); clients and the torchelastic agent store are unchanged."),
    upstream="none found (torch's TCPStore has no bind-address option; master_listen_fd is its way)",
    target="vLLM 0.32.0 with torch 2.13 (torch/distributed/rendezvous.py _create_c10d_store)",
    symbols=("torch.distributed.rendezvous:_create_c10d_store",),
    processes={Proc.WORKER},
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="when torch's TCPStore binds its host name (or vLLM creates the multi-node store on master_addr itself)",
    tests=("tests/test_multinode.py::test_tcp_store_bind_host_off_and_on",
           "tests/test_multinode.py::test_two_nodes_pp2_mtp2_tokens_acceptance_patches_sockets_and_node_death"),
    findings="multi-node-the-rendezvous-store-listens-on-every-interface",
    apply=_apply,
    needed=_needed,
)
