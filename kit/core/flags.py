"""What every ``kit`` subcommand shares: the parser and its error path, the common flags, ``KEY=VALUE`` lists.

Each command module registers its subcommand on the one tree :mod:`kit.cli` builds, with :func:`add_command`
and the flag groups below, so that ``--model``, ``--prompts`` (always a JSONL file), ``--limit``,
``--max-tokens``, ``--timeout`` and ``--json`` mean the same everywhere. Bad input is a
:class:`~kit.core.topology.TopologyError` raised before any process starts; :func:`kit.cli.main` prints it as one
line on stderr and exits 2, as argparse errors do.
"""
from __future__ import annotations

import argparse
import json
from typing import Callable

from kit.core.topology import RUNNERS, TopologyError
from kit.core.validate import arg_count, arg_seconds, arg_seed


class Parser(argparse.ArgumentParser):
    """argparse with the kit's error path: one line ``<prog>: error: <message>`` on stderr, exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_command(sub, name: str, run: Callable[[argparse.Namespace], int], help: str,
                description: str | None = None) -> Parser:
    """A subcommand whose ``run(args)`` returns the exit code (0 success, 1 a failed or differing run)."""
    p = sub.add_parser(name, help=help, description=description or help)
    p.set_defaults(func=run, prog=p.prog)
    p.add_argument("--quiet", action="store_true", help="no live status line on stderr (also KIT_QUIET=1)")
    return p


def add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-mimo", help="a model under data/models/ or a path")
    p.add_argument("--random", action="store_true", help="seeded random weights (normal init) instead of trained")
    p.add_argument("--seed", type=arg_seed, default=0)
    p.add_argument("--dtype", default="float32")


def add_runner_flag(p: argparse.ArgumentParser) -> None:
    """``--runner auto|v1|v2``: vLLM's model runner for every engine (:attr:`kit.core.topology.Topology.runner`)."""
    p.add_argument("--runner", choices=RUNNERS, default="auto",
                   help="vLLM's model runner: auto (vLLM's default: V1 on this CPU build, V2 on CUDA), v1 (the one "
                        "the kit's correctness patches target) or v2 (needs Triton: refused on device cpu)")


def add_prompt_flags(p: argparse.ArgumentParser, limit: int | None = None) -> None:
    """``--prompts FILE`` and ``--limit N`` (1 .. the file's prompts; :func:`kit.core.prompts.load_prompts` checks).
    With ``limit``, no ``--limit`` means the first ``limit`` prompts, or all when the file holds fewer."""
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help='JSONL file of {"prompt": ...}; default data/prompts/default.jsonl')
    p.add_argument("--limit", type=arg_count, default=None, metavar="N",
                   help="use only the first N prompts" + (f" (default {limit}, or all if fewer)" if limit else ""))
    p.set_defaults(default_limit=limit)


def read_prompts(args: argparse.Namespace) -> list[str]:
    """The prompts ``--prompts`` / ``--limit`` (:func:`add_prompt_flags`) select."""
    from kit.core.prompts import load_prompts

    prompts = load_prompts(args.prompts, limit=args.limit)
    default = getattr(args, "default_limit", None)
    return prompts[:default] if args.limit is None and default else prompts


def add_output_flags(p: argparse.ArgumentParser, max_tokens: int = 32, timeout: float | None = 900.0) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    if timeout is not None:
        p.add_argument("--timeout", type=arg_seconds, default=timeout, help="seconds per engine start or run")


def parse_assignments(items: list[str], flag: str, json_values: bool = False) -> dict:
    """``["KEY=VALUE", ...]`` from a repeatable flag -> dict; with ``json_values`` a VALUE is read as JSON when
    it parses (``false``, ``120``), else kept as the string. :class:`TopologyError` names the bad item."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TopologyError(f"{flag} wants KEY=VALUE, got {item!r}")
        if json_values:
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        out[key.strip()] = value
    return out
