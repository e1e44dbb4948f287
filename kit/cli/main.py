"""The ``kit`` command: one argparse tree (``python -m kit ...`` too), grouped by what a command is for.

The commands with their own argparse parsers are registered here (``compare``, ``pd``, ``bench``, ``matrix``,
``report``, ``doctor``, ``patches check``); the tools below them hand their arguments, unparsed, to the module's own
``main(argv)`` (``kit faults ...`` runs ``kit.checks.faults.main``). Exit codes: 0 success / identical, 1 not
identical or a failed run, 2 bad input (checked before any process starts: one line on stderr).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass

from kit.core.flags import Parser, add_command
from kit.core.models import ModelError
from kit.core.topology import TopologyError

TINY_MODELS = ("tiny-mimo", "tiny-deepseek", "tiny-qwen3_5", "mimo-py-18m")


@dataclass(frozen=True)
class Tool:
    """A subcommand whose arguments go, unparsed, to ``module.main(words + rest)``."""

    name: str
    module: str
    help: str
    words: tuple[str, ...] = ()


# The groups of `kit --help`, in order: (title, commands). Registered commands are named by string; tools by Tool.
GROUPS: list[tuple[str, list]] = [
    ("check correctness", [
        "compare", "pd", "matrix",
        Tool("sampling-table", "kit.checks.sampling_table", "sampled acceptance against theory, table in docs/results"),
        Tool("parity", "kit.cli.tiny", "a tiny model's PyTorch tokens against vLLM's (PP=1)", ("parity",)),
        Tool("acceptance", "kit.cli.tiny", "a tiny model's MTP acceptance in vLLM against PyTorch's",
             ("acceptance",)),
        Tool("zoo-status", "kit.checks.zoo_status", "which zoo families vLLM starts at PP=1 with their drafter"),
        Tool("faults", "kit.checks.faults", "kill, block and fill things during runs; what the kit reports"),
        Tool("repro", "kit.checks.repro", "a vLLM defect the kit patches, on stock vLLM and patched (docs/upstream)"),
    ]),
    ("measure", [
        "bench",
        Tool("patch-overhead", "kit.bench.patch_overhead", "what the patches cost per step and at start-up"),
        Tool("trace", "kit.worker.steptrace", "the timeline table of runs saved with kit bench --save-trace"),
    ]),
    ("models", [
        Tool("train", "kit.cli.tiny", "train a tiny model: " + ", ".join(TINY_MODELS), ("train",)),
        Tool("tiny", "kit.cli.tiny", "the tiny models' other tools: merge, forward-time, corpus"),
        Tool("zoo", "kit.zoo.write", "write the tiny model zoo's configs and tokenizers"),
    ]),
    ("notebooks and documents", [
        "report",
        Tool("notebook", "kit.lab.notebook", "sync or check the notebooks' .py/.ipynb pairs"),
        Tool("patch-docs", "kit.patches.docs", "write (or --check) docs/patches.md from the patch registry"),
        Tool("bad-input", "kit.cli.bad_input", "run the bad-input cases; write (or --check) docs/bad-input.md"),
        Tool("test-report", "kit.lab.test_report", "docs/results/tests.md from pytest's JUnit XML reports"),
    ]),
    ("set-up", [
        "doctor", "patches",
        Tool("clean", "kit.cli.clean", "remove run folders left in the cache (failed or kept runs), --all also checkpoints"),
    ]),
]


def _register(sub) -> None:
    from kit.bench import measure
    from kit.checks import compare, matrix, patch_compat
    from kit.cli.doctor import cmd_doctor
    from kit.lab import report
    from kit.pd import cli as pd_cli

    d = add_command(sub, "doctor", cmd_doctor, help="versions, device, cores, memory and patch status")
    d.add_argument("--json", action="store_true")
    compare.register(sub)
    pd_cli.register(sub)
    measure.register(sub)
    matrix.register(sub)
    patch_compat.register(sub)
    report.register(sub)


def _delegate(args: argparse.Namespace, rest: list[str]) -> int:
    tool: Tool = args.tool
    return importlib.import_module(tool.module).main([*tool.words, *rest]) or 0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="kit", description="ppmtp-kit: PP + speculative decoding on real vLLM",
               formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser, metavar="COMMAND")
    _register(sub)
    helps = {name: a.help for name, a in ((c.dest, c) for c in sub._choices_actions)}
    sub._choices_actions.clear()  # listed by group in the epilog instead
    lines = []
    for title, commands in GROUPS:
        lines.append(f"\n{title}:" if lines else f"{title}:")
        for c in commands:
            if isinstance(c, Tool):
                # add_help=False: -h/--help reach the module's own parser.
                t = sub.add_parser(c.name, add_help=False)
                t.set_defaults(func=_delegate, prog=t.prog, delegated=True, tool=c)
                lines.append(f"  {c.name:16s}{c.help}")
            else:
                lines.append(f"  {c:16s}{helps[c]}")
    p.epilog = "\n".join(lines) + "\n\n`kit COMMAND -h` shows a command's options."
    return p


class Terminated(BaseException):
    """SIGTERM to a ``kit`` command, raised where it runs so that its teardown runs (see :func:`stop_on_sigterm`)."""


def stop_on_sigterm() -> None:
    """Turn SIGTERM into :class:`Terminated`: Python's default ends the process at once, skipping every ``finally``
    and ``atexit`` (the engine trees would be ended by their guards, but failed runs' folders, kept until the
    command exits, would stay in the kit's cache). Only for the command line itself, not for a caller of
    :func:`main` in its own process."""
    import signal

    def raise_terminated(signum, frame) -> None:
        raise Terminated()

    signal.signal(signal.SIGTERM, raise_terminated)


def main(argv: list[str] | None = None) -> int:
    """``kit ...``: parse, run the subcommand, and turn bad input into one stderr line and exit 2."""
    if argv is None:
        stop_on_sigterm()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    args.argv = argv[1:]  # the subcommand's own arguments, as typed (for commands that record their command line)
    quiet = getattr(args, "quiet", False)
    try:
        if getattr(args, "delegated", False):
            return args.func(args, rest)
        if rest:
            raise TopologyError(f"unrecognized arguments: {' '.join(rest)}")
        if quiet:
            from kit.engine.progress import set_quiet

            set_quiet(True)
        return args.func(args)
    except (TopologyError, ModelError) as e:
        print(f"{args.prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the process trees were ended on the way out (kit.engine.procs teardown)
        print(f"{args.prog}: interrupted (Ctrl-C); the vLLM processes it started are ended", file=sys.stderr)
        return 130
    except Terminated:
        print(f"{args.prog}: terminated (SIGTERM); the vLLM processes it started are ended", file=sys.stderr)
        return 143
    finally:
        if quiet:  # a caller in the same process (a test, a notebook) gets its status lines back
            from kit.engine.progress import set_quiet

            set_quiet(None)


if __name__ == "__main__":
    sys.exit(main())
