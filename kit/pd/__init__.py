"""Prefill/decode (PD) disaggregation on real vLLM servers with a real NIXL connector.

Modules, each importing only the ones before it:

- :mod:`kit.pd.layout`: which pairs run and how, decided before any process starts: :func:`check_pair`,
  :func:`choose_connector` (pull ``NixlConnector`` or push ``NixlPushConnector``, with the reason),
  :func:`kv_bytes_expected` from the model shape.
- :mod:`kit.pd.client`: HTTP to the servers (``httpx``): GET, the one POST helper, the streamed completion.
- :mod:`kit.pd.pair`: :class:`PDPair`, the two servers' lifecycle and the router (:meth:`PDPair.complete`,
  :meth:`PDPair.complete_many`); what moved, from NIXL's own counters on both servers' ``/metrics``
  (:class:`kit.core.metrics.Counters`).
- :mod:`kit.pd.vllm_router`: :class:`VllmRouter`, vLLM's PD router (``vllm-router``) in front of a started pair,
  and :func:`choose_router` (vllm-router for pull pairs, the kit's router for push).
- :mod:`kit.pd.compare`: :func:`pd_compare`, the consumer's tokens against the colocated PP=1, no-spec reference.
- :mod:`kit.pd.cli`: ``kit pd``.
"""
from kit.core.metrics import Counters, block_size_from_metrics
from kit.core.topology import TopologyError
from kit.engine.procs import fatal_log_lines
from kit.pd.cli import parse_kv_extra
from kit.pd.client import PDError, model_id, post_json
from kit.pd.compare import acceptance_vs_colocated, pd_compare
from kit.pd.layout import (
                     DEFAULT_KV_EXTRA_CONFIG,
                     DTYPE_BYTES,
                     check_pair,
                     choose_connector,
                     hidden_state_drafter,
                     kv_block_bytes,
                     kv_bytes_expected,
                     kv_layer_names,
                     kv_layers_moved,
                     pd_topologies,
)
from kit.pd.pair import DEFAULT_REQUEST_TIMEOUT, PRODUCER_KV_PARAMS, WARMUP_PROMPT, PDPair, PDRequest
from kit.pd.vllm_router import ROUTERS, VllmRouter, choose_router

# The names tests/test_reliability.py imports (a plain completion on one server of a pair).
_model_id, _post_json = model_id, post_json

__all__ = ["Counters", "DEFAULT_KV_EXTRA_CONFIG", "DEFAULT_REQUEST_TIMEOUT", "DTYPE_BYTES", "PDError", "PDPair",
           "PDRequest", "PRODUCER_KV_PARAMS", "ROUTERS", "TopologyError", "VllmRouter", "choose_router", "WARMUP_PROMPT", "acceptance_vs_colocated",
           "block_size_from_metrics", "check_pair", "choose_connector", "fatal_log_lines", "hidden_state_drafter",
           "kv_block_bytes", "kv_bytes_expected", "kv_layer_names", "kv_layers_moved", "model_id", "parse_kv_extra",
           "pd_compare", "pd_topologies", "post_json"]
