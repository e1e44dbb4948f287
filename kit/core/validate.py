"""Checks of values that are not topology fields: CLI argument types and the Python API's arguments.

:class:`~kit.core.topology.Topology` validates its own fields (PP, spec, seed, ``kv_cache_gib``, ...). What is left is
here, once: counts (``--limit``, ``--repeats``, ``--steps``), seeds, seconds (``--timeout``), and
the prompts list and deadlines the API functions take. The ``arg_*`` functions are argparse ``type=`` callables
(argparse turns their :class:`argparse.ArgumentTypeError` into one line and exit 2); the ``check_*`` functions
raise :class:`~kit.core.topology.TopologyError`, which :func:`kit.cli.main` prints as one line with exit 2. All of it
runs before any process starts or any file is written.
"""
from __future__ import annotations

import argparse
import math
from numbers import Real
from typing import Any

from kit.core.topology import TopologyError

# -- argparse types -------------------------------------------------------------------------------

def _arg_int(text: str, minimum: int) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
    if n < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {n}")
    return n


def arg_count(text: str) -> int:
    """An integer >= 1 (``--limit``, ``--repeats``, ``--steps``)."""
    return _arg_int(text, 1)


def arg_seed(text: str) -> int:
    """An integer >= 0 (``--seed``: numpy, torch and vLLM take no negative seeds)."""
    return _arg_int(text, 0)


def arg_seconds(text: str) -> float:
    """A finite number of seconds > 0 (``--timeout``: NaN would turn every deadline off)."""
    try:
        return check_seconds(float(text), "")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {text!r}") from None


# -- the Python API -------------------------------------------------------------------------------

def check_seconds(value: Any, name: str = "timeout") -> float:
    """``value`` as float if it is a finite real number > 0, else :class:`TopologyError` naming ``name``."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        raise TopologyError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def check_count(value: Any, name: str) -> int:
    """``value`` if it is an integer >= 1 (not a bool), else :class:`TopologyError` naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TopologyError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def check_prompts(prompts: Any) -> list[str]:
    """A non-empty list (or tuple) of non-empty strings; a bare string is refused, not split into characters."""
    if isinstance(prompts, (str, bytes)):
        raise TopologyError(f"prompts must be a list of strings, got a {type(prompts).__name__} "
                            f"({str(prompts)[:30]!r}): wrap a single prompt in a list")
    if not isinstance(prompts, (list, tuple)):
        raise TopologyError(f"prompts must be a list of strings, got {type(prompts).__name__}")
    if not prompts:
        raise TopologyError("prompts is empty: a run over no prompts would compare nothing")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p:
            raise TopologyError(f"prompts[{i}] must be a non-empty string, got {p!r}"[:120])
    return list(prompts)


def check_generation(prompts: Any, max_tokens: Any, timeout: Any) -> list[str]:
    """What every generation entry point takes: prompts, ``max_tokens`` >= 1 and a deadline; the prompts as a list."""
    check_count(max_tokens, "max_tokens")
    check_seconds(timeout)
    return check_prompts(prompts)
