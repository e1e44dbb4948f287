"""Do the kit's patches fit a vLLM source tree? ``kit patches check [--vllm-src DIR ...] [--write FILE]``.

Each patch declares the vLLM symbols it replaces (``Patch.symbols``, ``"module:qualname"``) and what else it relies
on (``Patch.anchors``: symbols its ``needed()`` or replacement reads, and the source text its detection or source
rewrite looks for, the same constants the patch module uses). This module finds them in a vLLM source tree (an
installed ``site-packages`` or an unpacked wheel) by reading the files with :mod:`ast`: nothing is imported from the
tree, so any vLLM version can be checked from the kit's environment. Per patch and tree, one verdict:

- ``applies``: every symbol is where the patch looks for it (in that module, imported into it, or inherited by the
  class), every anchor text is as the patch expects, and, against the vLLM the patches target (the installed one,
  when it is a supported version; :data:`kit.patches.SUPPORTED_VLLM`), each replaced function has the same
  parameters and each definition the patch replaces by a copy is unchanged;
- ``code changed at the fixed spot``: the symbols are there but the text the patch detects or rewrites is not (or a
  fix's text now is), a replaced function's parameters differ, or a copied definition differs;
- ``target moved``: a symbol is not in its module but the same qualified name is defined in another module of the
  tree (named), or a module-level function the reference defines in its module is now only imported there from
  another one (callers of that one never see the replacement);
- ``target gone``: a symbol is nowhere in the tree under that name.

Symbols outside vLLM (torch, transformers, nixl) are not part of a vLLM tree and are not checked; a patch that has
only such targets, or is report-only (nothing to apply), says so.
"""
from __future__ import annotations

import argparse
import ast
import json
import platform
from dataclasses import dataclass
from datetime import datetime, timezone

from kit.core.flags import Parser
from kit.core.results import block_key, check_writable, command_line, write_block
from kit.core.topology import TopologyError
from kit.checks.vllm_tree import Site, Tree, TreeError, in_vllm, installed_tree, signature
from kit.patches import SUPPORTED_VLLM, Anchor, Patch, registry

APPLIES, CHANGED, MOVED, GONE = "applies", "code changed at the fixed spot", "target moved", "target gone"
NOT_VLLM, REPORT_ONLY = "no vLLM target", "report only"
NOTE = "note"  # a replaced definition that changed since the reference elsewhere than where the patch looks
UNREADABLE = "not readable here"  # a module this Python cannot parse (newer syntax): nothing said about the patch
_RANK = {APPLIES: 0, CHANGED: 1, MOVED: 2, GONE: 3, UNREADABLE: 4}


@dataclass(frozen=True)
class Finding:
    status: str
    symbol: str
    detail: str


def reference_tree() -> Tree | None:
    """The tree replaced functions and copied definitions are compared with: the installed vLLM when it is a
    version the patches target."""
    t = installed_tree()
    return t if t is not None and t.version in SUPPORTED_VLLM else None


# -- the check -------------------------------------------------------------------------------------------

@dataclass
class Verdict:
    patch: str
    tree: str
    status: str
    findings: list[Finding]

    def to_dict(self) -> dict:
        return {"patch": self.patch, "tree": self.tree, "status": self.status,
                "findings": [f.__dict__ for f in self.findings]}


def _split(symbol: str) -> tuple[str, str]:
    module, _, qualname = symbol.partition(":")
    return module, qualname


def _where(site: Site) -> str:
    return f"{site.module}:{site.qualname}" if site.qualname else site.module


def _dump(node: ast.AST) -> str:
    return ast.dump(node, include_attributes=False)


def check_patch(patch: Patch, tree: Tree, reference: Tree | None = None) -> Verdict:
    """One patch against one tree (and, where given, the reference tree the patch was written against)."""
    if patch.report_only:
        return Verdict(patch.name, tree.label, REPORT_ONLY, [])
    anchors: list[Anchor] = list(patch.anchors)
    wanted = list(dict.fromkeys([*patch.symbols, *(a.symbol for a in anchors)]))
    findings: list[Finding] = []
    sites: dict[str, Site] = {}
    checked = 0
    for symbol in wanted:
        module, qualname = _split(symbol)
        if not in_vllm(module):
            continue
        checked += 1
        site = tree.resolve(module, qualname)
        if site is None and module in tree.unreadable:
            findings.append(Finding(UNREADABLE, symbol, f"{module} does not parse with Python "
                                                        f"{platform.python_version()} ({tree.unreadable[module]})"))
            continue
        if site is None:
            moved = tree.elsewhere(module, qualname) if qualname else []
            if moved:
                findings.append(Finding(MOVED, symbol, "not in " + module + "; defined in " + ", ".join(moved[:3])))
            else:
                where = (f"no module {module}, and no {qualname} elsewhere" if tree.module(module) is None
                         else f"no {qualname} in {module}, nor elsewhere")
                if tree.unreadable:  # a module this Python could not read may hold it
                    where += " (not parsed here: " + ", ".join(sorted(tree.unreadable)) + ")"
                findings.append(Finding(GONE, symbol, where))
            continue
        sites[symbol] = site
        if reference is None or symbol not in patch.symbols or site.outside:
            continue
        ref = reference.resolve(module, qualname)
        if ref is None or ref.outside:
            continue
        if "." not in qualname and ref.module == module and site.module != module:
            findings.append(Finding(MOVED, symbol, f"now defined in {_where(site)} and only imported into {module} "
                                                   f"(callers of {site.module} do not see the replacement)"))
        old, new = signature(ref.node), signature(site.node)
        if old is not None and new is not None and old != new:
            findings.append(Finding(CHANGED, symbol, f"parameters {old} in {reference.label}, {new} here"))
        elif ref.node is not None and site.node is not None and _dump(ref.node) != _dump(site.node) \
                and not any(a.whole and a.symbol == symbol for a in anchors):
            findings.append(Finding(NOTE, symbol, f"the definition differs from {reference.label}'s, not in what "
                                                  "the patch relies on"))
    for a in anchors:
        site = sites.get(a.symbol)
        if site is None:
            continue
        if a.text:
            src = tree.source(site)
            if src is not None:
                n = src.count(a.text)
                if a.present and n == 0:
                    findings.append(Finding(CHANGED, a.symbol, f"the text {a.text!r} the patch looks for is not there"))
                elif a.present and a.once and n != 1:
                    findings.append(Finding(CHANGED, a.symbol, f"the text {a.text!r} is there {n} times, not once"))
                elif not a.present and n:
                    findings.append(Finding(CHANGED, a.symbol, f"the text {a.text!r} is there now (the patch's "
                                                               "detection reads it as the fix being upstream)"))
        if a.whole and reference is not None and site.node is not None:
            ref = reference.resolve(*_split(a.symbol))
            if ref is not None and ref.node is not None and _dump(ref.node) != _dump(site.node):
                findings.append(Finding(CHANGED, a.symbol, f"differs from {reference.label}'s, which the patch puts "
                                                           "in its place (a copy with its fix)"))
    if not checked:
        return Verdict(patch.name, tree.label, NOT_VLLM, [])
    flagged = {f.symbol for f in findings if f.status != NOTE}
    findings = [f for f in findings if f.status != NOTE or f.symbol not in flagged]
    status = max((f.status for f in findings if f.status != NOTE), key=_RANK.__getitem__, default=APPLIES)
    return Verdict(patch.name, tree.label, status, findings)


def check(trees: list[Tree], reference: Tree | None = None) -> dict[str, list[Verdict]]:
    """patch name -> one verdict per tree, for every patch in the registry."""
    return {name: [check_patch(p, t, reference) for t in trees] for name, p in registry().items()}


def outside_symbols() -> list[str]:
    """The patches' declared symbols that are not vLLM's (checked by no vLLM tree)."""
    out = []
    for p in registry().values():
        out += [f"{p.name}: {s}" for s in p.symbols if not in_vllm(_split(s)[0])]
    return out


def render(results: dict[str, list[Verdict]], trees: list[Tree], reference: Tree | None) -> str:
    """The markdown table (one column per tree), what each verdict other than ``applies`` found, and the replaced
    definitions that changed since the reference where no patch looks."""
    head = "| patch | " + " | ".join(t.label for t in trees) + " |"
    lines = [head, "|---|" + "---|" * len(trees)]
    for name, verdicts in results.items():
        cells = [v.status if v.status in (APPLIES, NOT_VLLM, REPORT_ONLY) else f"**{v.status}**" for v in verdicts]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    found, notes = [], []
    for i, t in enumerate(trees):
        for name, verdicts in results.items():
            for f in verdicts[i].findings:
                if f.status == NOTE:
                    notes.append(f"- {t.label}, `{name}`: `{f.symbol}`")
                else:
                    found.append(f"- {t.label}, `{name}`: {f.status}: `{f.symbol}`: {f.detail}")
    out = "\n".join(lines)
    if found:
        out += "\n\nWhat was found:\n\n" + "\n".join(found)
    if notes and reference is not None:
        out += (f"\n\nReplaced definitions that differ from {reference.label}'s elsewhere than where the patch "
                "looks (the patch still applies; worth a read before trusting it there):\n\n" + "\n".join(notes))
    return out


def summary(results: dict[str, list[Verdict]], trees: list[Tree], reference: Tree | None) -> str:
    counts = []
    for i, t in enumerate(trees):
        by: dict[str, int] = {}
        for verdicts in results.values():
            by[verdicts[i].status] = by.get(verdicts[i].status, 0) + 1
        order = [APPLIES, CHANGED, MOVED, GONE, UNREADABLE, NOT_VLLM, REPORT_ONLY]
        counts.append(f"{t.label}: " + ", ".join(f"{by[s]} {s}" for s in order if by.get(s)))
    ref = (f"parameters and copied definitions compared with {reference.label} (installed, the version the patches "
           f"target)" if reference is not None else
           "no installed vLLM of a version the patches target: parameters and copied definitions not compared")
    out = (f"{len(results)} patches, read with `ast` from each tree (nothing imported from it); {ref}. "
           + "; ".join(counts) + ".")
    outside = outside_symbols()
    if outside:
        out += " Not vLLM's, so not checked here: " + ", ".join(f"`{s}`" for s in outside) + "."
    return out


# -- the command -----------------------------------------------------------------------------------------

PROG = "kit patches check"


def register(sub) -> None:
    """Add ``kit patches check`` to the ``kit`` command tree."""
    p = sub.add_parser("patches", help="check the kit's patches against a vLLM source tree (kit patches check)",
                       description="The kit's patches and vLLM versions.")
    p.set_defaults(prog=p.prog)
    cmds = p.add_subparsers(dest="patches_cmd", required=True, parser_class=Parser, metavar="COMMAND")
    c = cmds.add_parser("check", help="resolve every patch's targets in vLLM source trees, statically",
                        description="Resolve every patch's vLLM targets in each source tree with ast (nothing "
                                    "imported from it) and say per patch: applies, code changed at the fixed spot, "
                                    "target moved or target gone. Exit 1 when any patch does not apply.")
    c.set_defaults(func=run, prog=c.prog)
    c.add_argument("--vllm-src", action="append", default=[], metavar="DIR",
                   help="a folder holding the vllm package (site-packages, an unpacked wheel) or the package "
                        "itself; repeatable, one table column each (default: the installed vLLM)")
    c.add_argument("--json", action="store_true", help="print the verdicts as one JSON object instead of the table")
    c.add_argument("--write", default=None, metavar="FILE",
                   help="also write the table into FILE (e.g. docs/results/patch-compat.md), replacing this "
                        "command's block")


def trees_from(paths: list[str]) -> list[Tree]:
    """The trees named by ``--vllm-src`` (default: the installed vLLM); :class:`TopologyError` on a bad path."""
    if not paths:
        t = installed_tree()
        if t is None:
            raise TopologyError("no vLLM installed here: name a source tree with --vllm-src DIR")
        return [t]
    out = []
    for p in paths:
        try:
            out.append(Tree(p))
        except TreeError as e:
            raise TopologyError(str(e)) from None
    return out


def run(args: argparse.Namespace) -> int:
    argv = list(getattr(args, "argv", None) or [])
    if args.write and (why := check_writable(args.write)):
        raise TopologyError(why)
    trees = trees_from(args.vllm_src)
    started = datetime.now(timezone.utc)
    reference = reference_tree()
    results = check(trees, reference)
    bad = sum(v.status in _RANK and v.status != APPLIES for vs in results.values() for v in vs)
    if args.json:
        print(json.dumps({"reference": reference.label if reference else None,
                          "trees": [{"label": t.label, "root": str(t.root)} for t in trees],
                          "verdicts": {n: [v.to_dict() for v in vs] for n, vs in results.items()}}))
    else:
        print(render(results, trees, reference))
    if args.write:
        body = summary(results, trees, reference) + "\n\n" + render(results, trees, reference)
        write_block(args.write, block_key("kit patches", argv, skip=("--write", "--json")), body,
                    command_line("kit patches", argv), when=started, title="Patch compatibility")
    return 1 if bad else 0

