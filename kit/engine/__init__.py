"""Starting and stopping real vLLM, and talking to it: the parent-side launcher (:mod:`~kit.engine.launch`), the
child process (:mod:`~kit.engine.child`, :mod:`~kit.engine.local`), the HTTP server (:mod:`~kit.engine.server`)
and client, process trees and their guard, progress lines, several nodes (:mod:`~kit.engine.multinode`) and the
local Ray cluster.

May import :mod:`kit.core` and :mod:`kit.patches`. The names below are the public API (``kit.engine.generate``).
"""
import importlib

# Lazy (PEP 562): `python -m kit.engine.guard` and the child must not find their own module imported already.
_API = {name: "kit.engine.launch" for name in ("DEFAULT_START_TIMEOUT", "INPROC_ENGINE_CORE_ENV",
                                               "SEPARATE_ENGINE_CORE_ENV", "check_patch_log", "generate",
                                               "precheck", "run")}
_API.update({name: "kit.engine.result" for name in ("EngineError", "GenerationResult", "first_divergence")})
_API["Server"] = "kit.engine.server"
__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'kit.engine' has no attribute {name!r}")
