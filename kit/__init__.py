"""ppmtp-kit: learn, check and debug speculative decoding (MTP, Eagle3, n-gram) under PP and PD in vLLM.

The package is in layers; each imports only the layers below it (``tests/test_layers.py`` checks it):

- ``core``: topology, cores, model registry, prompts, metrics, validation and flags, ports, results.
- ``patches`` and ``worker``: what runs inside vLLM's processes (they import ``core`` only); ``zoo``: the
  tiny models and their trainers (``core`` only, no vLLM).
- ``engine``: starting real vLLM (child process, launcher, server, client, process trees, several nodes, Ray).
- ``pd``: prefill/decode pairs over NIXL.
- ``checks`` (correctness as a measurement) and ``bench`` (speed and payoff).
- ``lab``: notebook helpers, figures, the report; ``cli``: the ``kit`` command, on top.

The names below are the short way in (``kit.Topology``, ``kit.generate``); they load on first use.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_API = {
    "Topology": "kit.core.topology", "Spec": "kit.core.topology", "TopologyError": "kit.core.topology",
    "load_prompts": "kit.core.prompts",
    "generate": "kit.engine", "run": "kit.engine", "Server": "kit.engine", "EngineError": "kit.engine",
    "GenerationResult": "kit.engine", "MultiNode": "kit.engine.multinode",
    "compare": "kit.checks.compare", "Comparison": "kit.checks.compare",
    "PDPair": "kit.pd", "pd_compare": "kit.pd",
}
__all__ = sorted(_API)


def __getattr__(name: str):
    # Lazy: vLLM loads kit.patches in every worker, which imports this package first; it must stay light.
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'kit' has no attribute {name!r}")
