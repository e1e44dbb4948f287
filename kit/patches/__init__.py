"""The patch registry: small, documented fixes to vLLM for PP + speculative decoding.

Every vLLM process (front end, engine core, each PP worker) loads the kit through the
``vllm.general_plugins`` entry point (:func:`load_plugin`), so each patch is applied wherever
the code it fixes runs. ``KIT_PATCHES`` selects: ``all`` (default), ``none``, a comma list of
names, or ``all,-name`` to leave some out (the notebooks use that to show what breaks).

A patch module defines one :class:`Patch`: what breaks without it, the upstream thread, the
vLLM version it targets, how to tell whether the installed vLLM needs it, and ``apply()``.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger("kit.patches")

SUPPORTED_VLLM = ("0.32.0",)
ENV_SELECT = "KIT_PATCHES"
ENV_LOG = "KIT_PATCH_LOG"  # when set: a JSON line per process that loaded the plugin


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is not a version the patches were written and tested against."""


@dataclass
class Patch:
    """One fix. ``needed()`` inspects the installed vLLM and returns ``True`` (the defect is there),
    ``False`` (the fix is upstream), or a string saying why it does not apply here."""

    name: str
    summary: str
    upstream: str
    targets: str
    apply: Callable[[], None]
    needed: Callable[[], "bool | str"]
    # Which vLLM process the patched code runs in (for documentation and `kit doctor`).
    where: str = "worker"
    # Patches off by default: used only to reproduce old behaviour for teaching.
    teaching_only: bool = False
    # Nothing to apply (the fix is upstream; the entry reports it): not evaluated at plugin load, where its
    # detection would cost every vLLM process start-up time (draft_pp_gate: ~1.3 s), only by report/doctor.
    report_only: bool = False
    applied: bool = field(default=False, init=False)

    def status(self, selected: bool) -> str:
        try:
            need = self.needed()
        except Exception as e:  # detection must never break a process
            need = f"detection failed: {e}"
        if need is False:
            return "upstream (installed vLLM has the fix)"
        if isinstance(need, str):
            return need
        if self.applied:
            return "applied"
        return "needed, selected" if selected else "needed, NOT selected"


_REGISTRY: dict[str, Patch] = {}


def register(patch: Patch) -> Patch:
    if patch.name in _REGISTRY:
        raise ValueError(f"duplicate patch name {patch.name}")
    _REGISTRY[patch.name] = patch
    return patch


_MODULES = ("cpu_amx", "cpu_rope_layout", "cpu_rejection_expand", "cpu_seeded_generator_rewind", "drafter_guard", "eager_pp_buffers", "pp_spec_schedule", "pp_spec_history", "eagle3_aux_pp", "glm4_moe_dense_stage", "qwen_vl_no_torchvision", "pp_kv_layout_intersect",
            "nixl_cpu_affinity", "nixl_pp_draft_regions", "nixl_pp_consumer", "nixl_progress", "decode_side_rule", "upstream_checks")


def registry() -> dict[str, Patch]:
    """All patches, in application order (the order of ``_MODULES``)."""
    _load_modules()
    order = {}
    for n, p in _REGISTRY.items():
        order[n] = (_MODULES.index(p.apply.__module__.rsplit(".", 1)[-1]), list(_REGISTRY).index(n))
    return {n: _REGISTRY[n] for n in sorted(_REGISTRY, key=order.__getitem__)}


def _load_modules() -> None:
    from . import (  # noqa: F401
        cpu_amx,
        cpu_rejection_expand,
        cpu_seeded_generator_rewind,
        cpu_rope_layout,
        drafter_guard,
        eager_pp_buffers,
        pp_spec_schedule,
        pp_spec_history,
        eagle3_aux_pp,
        glm4_moe_dense_stage,
        qwen_vl_no_torchvision,
        pp_kv_layout_intersect,
        nixl_cpu_affinity,
        nixl_pp_consumer,
        nixl_pp_draft_regions,
        nixl_progress,
        decode_side_rule,
        upstream_checks,
    )


def selected_names(spec: str | None = None) -> list[str]:
    """Names selected by ``KIT_PATCHES`` (or ``spec``); unknown names raise ``ValueError``."""
    reg = registry()
    spec = (os.environ.get(ENV_SELECT, "all") if spec is None else spec).strip() or "all"
    defaults = [n for n, p in reg.items() if not p.teaching_only]
    if spec == "none":
        return []
    chosen: list[str] = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        if item == "all":
            chosen += [n for n in defaults if n not in chosen]
        elif item.startswith("-"):
            name = item[1:]
            if name not in reg:
                raise ValueError(f"{ENV_SELECT}: unknown patch {name!r}; known: {', '.join(reg)}")
            chosen = [n for n in chosen if n != name]
        else:
            if item not in reg:
                raise ValueError(f"{ENV_SELECT}: unknown patch {item!r}; known: {', '.join(reg)}")
            if item not in chosen:
                chosen.append(item)
    return [n for n in reg if n in chosen]


def is_active(name: str) -> bool:
    """Whether patch ``name`` is selected for the vLLM processes of this environment."""
    try:
        return name in selected_names()
    except ValueError:
        return False


def check_vllm_version() -> str:
    import vllm

    v = getattr(vllm, "__version__", "?")
    if v not in SUPPORTED_VLLM:
        raise UnsupportedVllmError(
            f"ppmtp-kit patches target vLLM {', '.join(SUPPORTED_VLLM)}, but vLLM {v} is installed. "
            f"Install the pinned version (see README) or set {ENV_SELECT}=none to run stock vLLM.")
    return v


def apply_selected() -> list[str]:
    """Apply the selected patches in this process (idempotent); return the names applied now or before."""
    names = selected_names()
    if not names:
        return []
    check_vllm_version()
    reg = registry()
    done = []
    for name in names:
        p = reg[name]
        if p.report_only:
            continue
        if not p.applied and p.needed() is True:
            p.apply()
            p.applied = True
        if p.applied:
            done.append(name)
    return done


def load_plugin() -> None:
    """Entry point for ``vllm.general_plugins``: called once in every vLLM process."""
    applied = apply_selected()
    path = os.environ.get(ENV_LOG)
    if path:
        try:
            import setproctitle

            title = setproctitle.getproctitle()
        except Exception:
            title = ""
        rec = {"pid": os.getpid(), "ppid": os.getppid(), "title": title, "applied": applied, "time": time.time()}
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
    if applied:
        log.info("ppmtp-kit patches applied in pid %d: %s", os.getpid(), ", ".join(applied))


def report() -> list[dict]:
    """One row per patch: name, where, targets, upstream thread, status in this process."""
    try:
        names = set(selected_names())
    except ValueError:
        names = set()
    return [
        {"name": p.name, "where": p.where, "targets": p.targets, "upstream": p.upstream,
         "selected": p.name in names, "status": p.status(p.name in names), "summary": p.summary}
        for p in registry().values()
    ]
