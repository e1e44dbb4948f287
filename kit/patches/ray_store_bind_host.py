"""vLLM's Ray executor: the rank-0 actor's rendezvous TCPStore listens on its Ray node's address, not on every interface.

What breaks without it: under ``distributed_executor_backend="ray"`` (RayExecutorV2) the rank-0 Ray actor creates
the ``torch.distributed`` rendezvous store itself, before the workers initialise
(``vllm/v1/executor/ray_executor_v2.py:RayWorkerProc.create_dist_init_method``:
``TCPStore(host_name=ray.util.get_node_ip_address(), port=0, is_master=True, multi_tenant=True)``), and torch's
TCPStore server binds the wildcard address whatever host name it is given: the store answers on every interface of
the head node, while the other ranks are told ``tcp://<node address>:<port>``. The same defect as
``tcp_store_bind_host`` (vLLM's ``--nnodes`` launch), in the store the Ray executor makes on its own.
Fix: bind a listening socket to the Ray node's address first and hand it to the TCPStore (``master_listen_fd``,
as vLLM's own ``create_tcp_store`` does); the rendezvous in ``init_process_group`` reuses that multi-tenant store
by port, as before.
Processes: the Ray actors (workers). ``create_dist_init_method`` runs in the rank-0 actor before vLLM loads the
kit's plugin there (``initialize_worker``), so the patch reaches the actors through the Ray worker-process setup
hook that ``cpu_ray_executor`` installs; where that patch is not needed (a platform with a ``ray_device_key``),
the hook and so this patch are absent (not covered). Runner: any.
Upstream: none found (torch's TCPStore has no bind-address option; ``master_listen_fd`` is the documented way).
Target: vLLM 0.32.0 with torch 2.13. Removal: when vLLM binds the Ray executor's store to the node address (e.g.
through its ``create_tcp_store``), or torch's TCPStore binds its host name.
Tests: ``tests/test_multinode.py::test_tcp_store_bind_host_off_and_on`` (``ray``: the store alone, off and on) and
``tests/test_ray.py::test_pp2_mtp2_on_ray_executor_two_nodes`` (no process of a two-node Ray run listens beyond
loopback). Turn off: ``KIT_PATCHES=all,-ray_store_bind_host``.
"""
from __future__ import annotations

import socket
import sys

from kit.patches import MARK, Anchor, Kind, Patch, Proc, Runner, install
from kit.patches.tcp_store_bind_host import listen_socket

NAME = "ray_store_bind_host"
RAY_EXECUTOR = "vllm.v1.executor.ray_executor_v2"
FIX = "master_listen_fd"  # the store created on a socket bound to the node address


def _wrap(orig):
    def create_dist_init_method(self):
        import ray
        from torch.distributed import TCPStore
        from vllm.utils.network_utils import get_distributed_init_method

        host = ray.util.get_node_ip_address()
        s = listen_socket(host, 0)
        port = s.getsockname()[1]
        fd = s.detach()
        try:  # as vLLM's own call, plus the bound socket
            store = TCPStore(host_name=host, port=port, world_size=self._parallel_config.world_size, is_master=True,
                             wait_for_workers=False, multi_tenant=True, master_listen_fd=fd)
        except BaseException:
            socket.close(fd)
            raise
        self._dist_init_store = store  # kept alive until init_process_group reuses it (multi-tenant, by port)
        return get_distributed_init_method(host, store.port)
    return create_dist_init_method


def _needed() -> "bool | str":
    import inspect

    # Only where the Ray executor is loaded (a Ray actor, whose setup hook imports it): no Ray import elsewhere.
    if RAY_EXECUTOR not in sys.modules:
        return "not a Ray run (vLLM's Ray executor is not loaded in this process)"
    fn = sys.modules[RAY_EXECUTOR].RayWorkerProc.create_dist_init_method
    if getattr(fn, MARK, None) == NAME:  # applied already, by the actor's setup hook
        return True
    return FIX not in inspect.getsource(fn)


def _apply() -> None:
    install(sys.modules[RAY_EXECUTOR].RayWorkerProc, "create_dist_init_method", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="Ray executor: the rank-0 actor's rendezvous TCPStore listened on every interface",
    why=("RayExecutorV2's rank-0 actor creates the rendezvous store itself (RayWorkerProc.create_dist_init_method, "
         "TCPStore(host_name=<node address>, port=0, is_master=True)), and torch's TCPStore server binds the "
         "wildcard address whatever host name it gets. The patch binds a socket to the node address first and "
         "gives it to the TCPStore (master_listen_fd); the later rendezvous reuses that multi-tenant store."),
    upstream="none found (torch's TCPStore has no bind-address option; master_listen_fd is its way)",
    target="vLLM 0.32.0 with torch 2.13 (v1/executor/ray_executor_v2.py RayWorkerProc.create_dist_init_method)",
    symbols=("vllm.v1.executor.ray_executor_v2:RayWorkerProc.create_dist_init_method",),
    processes={Proc.WORKER},  # the Ray actors; reached there through cpu_ray_executor's worker setup hook
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="when vLLM binds the Ray executor's store to the node address, or torch's TCPStore binds its host name",
    tests=("tests/test_multinode.py::test_tcp_store_bind_host_off_and_on",
           "tests/test_ray.py::test_pp2_mtp2_on_ray_executor_two_nodes"),
    findings="ray-executor-the-rendezvous-store-listens-on-every-interface",
    anchors=(Anchor(RAY_EXECUTOR + ":RayWorkerProc.create_dist_init_method", FIX, present=False),
             Anchor("vllm.utils.network_utils:get_distributed_init_method")),
    apply=_apply,
    needed=_needed,
)
