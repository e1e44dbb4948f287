"""The patch registry: small, documented fixes to vLLM for PP + speculative decoding.

vLLM calls :func:`load_plugin` (entry point ``vllm.general_plugins``) once in each of its processes: the
front end, the engine core, each PP worker. Each patch is applied only in the processes that run the code it
fixes (:class:`Proc`); ``KIT_PATCHES`` selects: ``all`` (default), ``none``, a comma list of names, or
``all,-name`` to leave some out (the notebooks use that to show what breaks); a list that starts with ``-name``
means the same as ``all,-name`` (what a reader takes it to mean; it used to select nothing). ``docs/patches.md`` is
generated from this registry (``kit patch-docs``); a test fails when it is out of date.

Adding a patch (one module file + one registry entry):

1. ``kit/patches/<name>.py``: a docstring in the house form (what breaks without it, fix, upstream,
   target, removal, turn off), ``_needed()`` (True: the installed vLLM has the defect; False: fixed
   upstream; a string: why it does not apply here), ``_apply()`` replacing each vLLM symbol through
   :func:`install` (it marks the replacement, so nothing is wrapped twice, and undoes a half-applied patch),
   and ``PATCH = Patch(name="<name>", ...)`` with every field filled in.
2. Add ``"<name>"`` to :data:`INDEX` below, where it belongs in application order.
3. Tests off and on (name them in ``tests=``), then ``kit patch-docs`` to rewrite
   ``docs/patches.md``.

Fail closed: a selected patch whose module does not import, whose ``needed()`` or whose ``apply()`` raises is
recorded in this process (``kit doctor``) and in the ``KIT_PATCH_LOG`` JSON line, and then :func:`load_plugin`
raises :class:`PatchFailedError` with one line naming the patches, so the vLLM process does not start (a plain
``vllm serve`` or ``LLM(...)`` that loaded the plugin too: a correctness patch that silently failed would give wrong
tokens). ``KIT_PATCHES=none`` runs stock vLLM. The kit checks a vLLM version the patches were not written for and a
``KIT_PATCHES`` name that does not exist before it starts any process; inside vLLM both are raised too.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

# The process kinds and which ones this process runs (kept importable from here).
from kit.patches.vllm_process import ALL_PROCS, ENV_EVERYWHERE, Proc, loader_caller, process_kinds  # noqa: F401

log = logging.getLogger("kit.patches")

SUPPORTED_VLLM = ("0.32.0",)
ENV_SELECT = "KIT_PATCHES"
ENV_LOG = "KIT_PATCH_LOG"  # when set: one JSON line per vLLM process that loaded the plugin
MARK = "__kit_patch__"     # set on every replacement :func:`install` makes: the patch's name

# The registry: every patch, in application order. Module kit/patches/<name>.py defines PATCH named <name>.
INDEX: tuple[str, ...] = (
    # start-up and model code, every worker
    "cpu_amx_permission",
    "cpu_rope_layout",
    "cpu_rejection_expand",
    "cpu_seeded_generator_rewind",
    "cpu_gdn_spec_conv_window",
    "cpu_gdn_spec_cpp_conv",
    "cpu_gdn_one_token_batch",
    "cpu_mla_spec_token_budget",
    "qwen_vl_no_torchvision",
    "pp_kv_layout_intersect",
    "pp_batch_order_agree",
    "pp_mamba_align_attention_stage",
    "drafter_only_on_last_rank",
    "eager_pp_intermediate_buffers",
    # multi-node runs (vLLM's --nnodes launch)
    "tcp_store_bind_host",
    "cpu_ray_executor",
    "ray_store_bind_host",
    # closed by default: the API key on every route of vLLM's server
    "api_key_every_route",
    # correctness of speculation (before pp_spec_schedule_gate: it replaces the function the gate wraps)
    "spec_no_pad_fresh_prompt",
    "spec_chunk_boundary_token",
    # correctness of PP + speculation (V1 runner, sync scheduling)
    "pp_spec_schedule_gate",
    "pp_microbatches",
    "pp_spec_token_history",
    "pp_spec_hybrid_accepted_count",
    "eagle3_aux_hidden_states_over_pp",
    "glm4_moe_dense_stage",
    # PD disaggregation with NIXL
    "nixl_cpu_affinity",
    "nixl_pp_draft_regions",
    "nixl_pp_consumer",
    "nixl_progress_delay",
    # vLLM PR #46003's rule, conditioned on the correctness patches
    "decode_side_pp_spec_rule",
    # report only: fixed in the vLLM the kit targets, detected and shown by `kit doctor`
    "draft_pp_gate",
    "eagle3_total_layers",
    "qwen3_5_mtp_intermediates",
    # teaching only: off unless named
    "eagle3_per_rank_layers_legacy",
)


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is not a version the patches were written and tested against."""


class PatchFailedError(RuntimeError):
    """A selected patch did not apply in this vLLM process; the process must not run without it."""


class Runner(str, Enum):
    """The model runner a patch's target code belongs to (vLLM 0.32: CPU uses V1; CUDA defaults to V2)."""

    V1 = "v1"
    V2 = "v2"
    ANY = "any"


class Kind(str, Enum):
    """When the patched code runs: at start-up only, or on every engine step (``kit.bench.patch_overhead`` times
    the per-step ones)."""

    START_UP = "start-up"
    PER_STEP = "per-step"


@dataclass(frozen=True)
class StepProbe:
    """How to call a per-step wrapper on the PP=1 / no-spec path, for :mod:`kit.bench.patch_overhead`."""

    owner: Any
    attr: str
    calls_per_step: int
    args: tuple
    kwargs: dict


@dataclass(frozen=True)
class Anchor:
    """Code a patch relies on in vLLM beyond the symbols it replaces, for ``kit patches check``
    (:mod:`kit.checks.patch_compat`), which looks for it in a vLLM source tree without importing it.

    ``symbol`` (``"module:qualname"``, or ``"module:"`` for the whole module) must exist; with ``text``, its
    source must hold that fragment (``present``; ``False``: must not hold it; ``once``: exactly once), the text the
    patch's ``needed()`` or source rewrite looks for (the patch module uses the same constant); ``whole``: the
    patch puts a copy of the targeted vLLM's definition in its place, so any change to the definition counts.
    """

    symbol: str
    text: str = ""
    present: bool = True
    once: bool = False
    whole: bool = False


@dataclass(frozen=True)
class Patch:
    """One fix, with everything ``docs/patches.md`` and ``kit doctor`` show about it."""

    name: str
    summary: str                  # what breaks without it, one line
    why: str                      # the root cause and the fix, a few sentences
    upstream: str                 # the upstream thread(s), or why there is none
    target: str                   # the vLLM version/distribution it was written and tested against
    symbols: tuple[str, ...]      # the vLLM (or library) symbols it replaces, "module:qualname"
    processes: frozenset          # of Proc: where the code it fixes runs (the only places it is applied)
    runner: Runner                # model runner the fixed code belongs to
    kind: Kind                    # start-up, or a wrapper on every step
    removal: str                  # when to delete it
    tests: tuple[str, ...]        # pytest ids showing the defect (off) and the fix (on)
    apply: Callable[[], None]
    needed: Callable[[], "bool | str"]
    findings: str = ""            # anchor in docs/findings.md with the investigation behind it
    teaching_only: bool = False   # off by default: reproduces old behaviour for teaching
    opt_in: bool = False          # off by default: a measured trade-off rather than a fix, named to turn it on
    # Nothing to apply (the fix is upstream); not evaluated at plugin load, where its detection would cost
    # every process start-up time (draft_pp_gate: ~1.3 s), only by `kit doctor`.
    report_only: bool = False
    # kind == PER_STEP: the wrapper's no-op path for kit.bench.patch_overhead (None: not on the PP=1 no-spec path).
    step_probe: "Callable[[int], StepProbe] | None" = None
    # What else it relies on in vLLM's code: symbols it reads and the source text its needed() or rewrite looks for.
    anchors: tuple[Anchor, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "processes", frozenset(Proc(p) for p in self.processes))


# -- per-process state ----------------------------------------------------------------------------------

@dataclass
class _State:
    applied: set = field(default_factory=set)
    errors: dict = field(default_factory=dict)      # name -> "phase: Type: message"
    skipped: dict = field(default_factory=dict)     # name -> why it was not applied here
    processes: frozenset = ALL_PROCS
    how: str = "not loaded as a vLLM plugin: all process kinds"


STATE = _State()
_PATCHES: dict[str, Patch] = {}
_undo: list | None = None   # (owner, attr, original) of the patch being applied, to undo a half-applied one


def _load(name: str) -> Patch | None:
    """The PATCH of module ``kit.patches.<name>``; an import failure is recorded, never raised."""
    if name in _PATCHES:
        return _PATCHES[name]
    try:
        mod = importlib.import_module(f"{__name__}.{name}")
        patch = getattr(mod, "PATCH")
        if not isinstance(patch, Patch) or patch.name != name:
            raise TypeError(f"kit/patches/{name}.py must define PATCH = Patch(name={name!r}, ...)")
    except Exception as e:
        _fail(name, "import", e)
        return None
    _PATCHES[name] = patch
    return patch


def registry() -> dict[str, Patch]:
    """Every patch whose module imports, in application order (:data:`INDEX`)."""
    return {n: p for n in INDEX if (p := _load(n)) is not None}


def _fail(name: str, phase: str, e: BaseException) -> None:
    msg = f"{phase}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
    STATE.errors[name] = msg
    log.warning("ppmtp-kit patch %s failed (%s) in pid %d; not applied here", name, msg, os.getpid())


def install(owner: Any, attr: str, patch: str, make: Callable[[Any], Any]) -> bool:
    """Replace ``owner.attr`` by ``make(current)``, marked with the patch's name (:data:`MARK`).

    Nothing happens if the current value already carries that mark (applied before in this process), so a
    patch is never stacked on itself. During :func:`apply_selected` each replacement is remembered, and a
    patch whose ``apply()`` raises halfway is undone. Returns whether it replaced.
    """
    current = getattr(owner, attr)
    if patch in _marks(current):
        return False
    new = make(current)
    setattr(new, MARK, patch)
    if isinstance(new, (classmethod, staticmethod)):
        setattr(new.__func__, MARK, patch)   # getattr(owner, attr) returns the function (bound): mark it too
    if _undo is not None:
        _undo.append((owner, attr, current))
    setattr(owner, attr, new)
    return True


def marked(obj: Any) -> str | None:
    """The name of the patch that installed ``obj``, or None."""
    return getattr(obj, MARK, None)


def _marks(obj: Any) -> list[str]:
    """The patch marks along ``obj``'s ``__wrapped__`` chain (outermost first): a patch under another's
    wrapper is still seen."""
    out = []
    for _ in range(64):
        if obj is None:
            break
        m = getattr(obj, MARK, None)
        if m is not None:
            out.append(m)
        obj = getattr(obj, "__wrapped__", None)
    return out


# -- selection -------------------------------------------------------------------------------------------

def selected_names(spec: str | None = None) -> list[str]:
    """Names selected by ``KIT_PATCHES`` (or ``spec``); unknown names raise ``ValueError``."""
    spec = (os.environ.get(ENV_SELECT, "all") if spec is None else spec).strip() or "all"
    if spec == "none":
        return []
    reg = registry()
    known = set(INDEX)
    defaults = [n for n in INDEX if not ((reg[n].teaching_only or reg[n].opt_in) if n in reg else False)]
    chosen: list[str] = []
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if items and items[0].startswith("-"):  # "-name" reads as "all but name"
        items.insert(0, "all")
    for item in items:
        if item == "all":
            chosen += [n for n in defaults if n not in chosen]
            continue
        name = item[1:] if item.startswith("-") else item
        if name not in known:
            raise ValueError(f"{ENV_SELECT}: unknown patch {name!r}; known: {', '.join(INDEX)}")
        if item.startswith("-"):
            chosen = [n for n in chosen if n != name]
        elif name not in chosen:
            chosen.append(name)
    return [n for n in INDEX if n in chosen]


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


# -- applying --------------------------------------------------------------------------------------------

def apply_selected(processes: frozenset | None = None) -> list[str]:
    """Apply the selected patches meant for ``processes`` (default: every kind) in this process.

    Idempotent; returns the names applied (now or before). A patch that fails to import, detect or apply is
    recorded in :data:`STATE` (``errors``) and logged, not raised; see :func:`errors`.
    """
    global _undo
    names = selected_names()
    if not names:
        return []
    check_vllm_version()
    processes = ALL_PROCS if processes is None else frozenset(processes)
    for name in names:
        p = _load(name)
        if p is None or name in STATE.applied or name in STATE.errors:
            continue
        if p.report_only:
            STATE.skipped[name] = "report only (nothing to apply)"
            continue
        if not p.processes & processes:
            STATE.skipped[name] = "not for this process (" + ", ".join(sorted(k.value for k in p.processes)) + ")"
            continue
        try:
            need = p.needed()
        except Exception as e:
            _fail(name, "needed()", e)
            continue
        if need is not True:
            STATE.skipped[name] = "upstream (installed vLLM has the fix)" if need is False else str(need)
            continue
        _undo = []
        try:
            p.apply()
        except Exception as e:
            for owner, attr, orig in reversed(_undo):
                setattr(owner, attr, orig)
            _fail(name, "apply()", e)
            continue
        finally:
            _undo = None
        STATE.skipped.pop(name, None)
        STATE.applied.add(name)
    return [n for n in names if n in STATE.applied]


def errors() -> dict[str, str]:
    """Patches that failed in this process: name -> what failed."""
    return dict(STATE.errors)


def load_plugin() -> None:
    """Entry point for ``vllm.general_plugins``: called once in every vLLM process."""
    t0 = time.perf_counter()
    caller = loader_caller()
    try:
        kinds, how = process_kinds(caller)
    except Exception as e:  # never guess narrow: apply everything
        kinds, how = ALL_PROCS, f"process kind unknown ({type(e).__name__}: {e}): all process kinds"
    STATE.processes, STATE.how = kinds, how
    try:
        applied = apply_selected(kinds)  # raises only UnsupportedVllmError / an unknown KIT_PATCHES name
    except Exception as e:
        if isinstance(e, (UnsupportedVllmError, ValueError)):
            raise
        applied = []
        _fail("*", "load_plugin", e)
    secs = time.perf_counter() - t0
    path = os.environ.get(ENV_LOG)
    if path:
        try:
            import setproctitle

            title = setproctitle.getproctitle()
        except Exception:
            title = ""
        import multiprocessing

        rec = {"pid": os.getpid(), "ppid": os.getppid(), "title": title,
               "mp_name": multiprocessing.current_process().name, "caller": how,
               "processes": sorted(k.value for k in kinds), "applied": applied, "errors": errors(),
               "seconds": round(secs, 4), "time": time.time()}
        try:
            with open(path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        except OSError as e:
            log.warning("ppmtp-kit: cannot write %s=%s: %s", ENV_LOG, path, e)
    if applied:
        log.info("ppmtp-kit patches applied in pid %d (%s) in %.2f s: %s", os.getpid(),
                 ",".join(sorted(k.value for k in kinds)), secs, ", ".join(applied))
    failed = errors()
    if failed:
        raise PatchFailedError(
            "ppmtp-kit: patch " + "; patch ".join(f"{n} did not apply ({m})" for n, m in failed.items())
            + f" in pid {os.getpid()}; refusing to run without it ({ENV_SELECT}=all,-NAME runs without it knowingly)")


def failures_in_log(path: str | os.PathLike) -> list[str]:
    """One line per patch failure recorded in a ``KIT_PATCH_LOG`` file (empty: none, or no file)."""
    out = []
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        for name, msg in (rec.get("errors") or {}).items():
            out.append(f"patch {name} failed in pid {rec.get('pid')} ({rec.get('caller')}): {msg}")
    return out


def status(name: str, selected: bool) -> str:
    """The patch's state in this process, in words."""
    if name in STATE.errors:
        return f"FAILED: {STATE.errors[name]}"
    p = _load(name)
    if p is None:
        return f"FAILED: {STATE.errors.get(name, 'not loaded')}"
    if name in STATE.applied:
        return "applied"
    try:
        need = p.needed()
    except Exception as e:  # detection must never break a process
        return f"FAILED: needed(): {type(e).__name__}: {e}"
    if need is False:
        return "upstream (installed vLLM has the fix)"
    if isinstance(need, str):
        return need
    if selected and name in STATE.skipped:
        return STATE.skipped[name]
    return "needed, selected" if selected else "needed, NOT selected"


def by_runner() -> dict[str, list[str]]:
    """The registry's patch names per model runner (``v1``, ``v2``, ``any``), teaching-only ones left out: on a
    runner, the ``any`` patches and its own apply; the others load but patch code that runner never calls."""
    out: dict[str, list[str]] = {r.value: [] for r in Runner}
    for name in INDEX:
        p = _load(name)
        if p is not None and not p.teaching_only:
            out[p.runner.value].append(name)
    return out


def report() -> list[dict]:
    """One row per patch: its registry fields and its status in this process."""
    try:
        names = set(selected_names())
    except ValueError:
        names = set()
    rows = []
    for name in INDEX:
        p = _load(name)
        row = {"name": name, "selected": name in names, "status": status(name, name in names)}
        if p is not None:
            row.update(summary=p.summary, upstream=p.upstream, target=p.target,
                       processes=sorted(k.value for k in p.processes), runner=p.runner.value, kind=p.kind.value,
                       teaching_only=p.teaching_only, opt_in=p.opt_in, report_only=p.report_only)
        rows.append(row)
    return rows
