"""The kit's one place for checks of values that are not topology fields: CLI argument types and the Python API's
arguments.

:class:`~kit.core.topology.Topology` validates its own fields (PP, spec, seed, ``kv_cache_gib``, ...), and the rules
that combine topologies stay with the concept they belong to (a PD pair's two sides in :mod:`kit.pd.layout`, a
multi-node backend in :mod:`kit.engine.multinode`). Every other value check is here, once, and the CLI and the API
call it: counts and integer lists (``--limit``, ``--repeats``, ``--batch``, ``--pp``), seeds, seconds
(``--timeout``), temperatures, ``--max-tokens`` against the model length, API keys, named choices, and the prompts
list and deadlines the API functions take. The ``arg_*`` functions are argparse ``type=`` callables
(argparse turns their :class:`argparse.ArgumentTypeError` into one line and exit 2); the ``check_*`` functions
raise :class:`~kit.core.topology.TopologyError`, which :func:`kit.cli.main` prints as one line with exit 2. All of it
runs before any process starts or any file is written.
"""
from __future__ import annotations

import argparse
import math
from numbers import Real
from typing import Any, Iterable


class TopologyError(ValueError):
    """A topology or an argument that cannot run; raised before any process starts (also importable from
    :mod:`kit.core.topology`, whose fields are its first use)."""

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

def check_positive(value: Any, name: str, what: str = "a finite number > 0") -> float:
    """``value`` as float if it is a finite real number > 0 (not a bool; NaN compares False with everything and
    would pass a plain ``<= 0``), else :class:`TopologyError`: ``{name} must be {what}, got ...``."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        raise TopologyError(f"{name} must be {what}, got {value!r}")
    return float(value)


def check_seconds(value: Any, name: str = "timeout") -> float:
    """A deadline: a finite number of seconds > 0."""
    return check_positive(value, name, "a finite number of seconds > 0")


def check_count(value: Any, name: str, minimum: int = 1) -> int:
    """``value`` if it is an integer >= ``minimum`` (not a bool), else :class:`TopologyError` naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise TopologyError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_counts(text: str, flag: str) -> list[int]:
    """A comma-separated list of integers >= 1 (``--batch 1,4``, ``--pp 1,2``), else :class:`TopologyError`."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TopologyError(f"{flag} wants comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise TopologyError(f"{flag} wants integers >= 1, got {text!r}")
    return values


def check_temperature(value: Any, name: str = "temperature") -> float:
    """A sampling temperature: a finite real number > 0 (0 is greedy, which a sampled check cannot use)."""
    return check_positive(value, name, "a finite number > 0 for a sampled run")


def check_max_tokens(max_tokens: int, model_len: int, name: str = "--max-tokens") -> None:
    """``max_tokens`` within 1 .. model length - 1, else :class:`TopologyError`."""
    check_count(max_tokens, name)
    if max_tokens >= model_len:
        raise TopologyError(f"{name} {max_tokens} exceeds the model length {model_len}")


def check_api_key(api_key: Any, name: str = "api_key") -> str | None:
    """``api_key`` as given (None: no key), else :class:`TopologyError`: a key is a non-empty string without
    whitespace (it goes into an HTTP header and onto a command line)."""
    if api_key is None:
        return None
    if not isinstance(api_key, str) or not api_key or any(c.isspace() for c in api_key):
        raise TopologyError(f"{name} must be a non-empty string without whitespace, got {type(api_key).__name__}")
    return api_key


def check_choice(value: Any, choices: Iterable, name: str) -> Any:
    """``value`` if it is one of ``choices``, else :class:`TopologyError` listing them."""
    choices = tuple(choices)
    if value not in choices:
        raise TopologyError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")
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
