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
import importlib.util
import json
import platform
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from kit.core.flags import Parser
from kit.core.results import block_key, check_writable, command_line, write_block
from kit.core.topology import TopologyError
from kit.patches import SUPPORTED_VLLM, Anchor, Patch, registry

APPLIES, CHANGED, MOVED, GONE = "applies", "code changed at the fixed spot", "target moved", "target gone"
NOT_VLLM, REPORT_ONLY = "no vLLM target", "report only"
NOTE = "note"  # a replaced definition that changed since the reference elsewhere than where the patch looks
UNREADABLE = "not readable here"  # a module this Python cannot parse (newer syntax): nothing said about the patch
_RANK = {APPLIES: 0, CHANGED: 1, MOVED: 2, GONE: 3, UNREADABLE: 4}
_MAX_DEPTH = 24  # import and base-class chains followed


class TreeError(ValueError):
    """A path that is not a vLLM source tree."""


@dataclass
class Module:
    name: str
    path: Path
    text: str
    tree: ast.Module
    package: bool


@dataclass
class Site:
    """Where a symbol is bound: ``node`` a def, class or assignment in ``module`` (None with ``qualname`` "": the
    module itself); ``outside``: an import from a package that is not vLLM (not followed)."""

    module: str
    qualname: str
    node: ast.AST | None
    via: list[str] = field(default_factory=list)
    outside: bool = False


@dataclass(frozen=True)
class Finding:
    status: str
    symbol: str
    detail: str


def _is_type_checking(test: ast.AST) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _target_names(t: ast.AST) -> list[str]:
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, (ast.Tuple, ast.List)):
        return [n for e in t.elts for n in _target_names(e)]
    return []


def _bindings(body: list[ast.stmt], out: dict | None = None) -> dict[str, ast.AST]:
    """Names a module or class body binds at run time, each to its statement (the last one wins; the body of a
    ``try`` wins over its handlers, code under ``if TYPE_CHECKING`` binds nothing)."""
    out = {} if out is None else out
    for st in body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[st.name] = st
        elif isinstance(st, ast.Assign):
            for t in st.targets:
                for n in _target_names(t):
                    out[n] = st
        elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            if st.value is not None or st.target.id not in out:  # a bare annotation only declares
                out[st.target.id] = st
        elif isinstance(st, ast.ImportFrom):
            for a in st.names:
                if a.name != "*":
                    out[a.asname or a.name] = st
        elif isinstance(st, ast.Import):
            for a in st.names:
                out[a.asname or a.name.split(".")[0]] = st
        elif isinstance(st, ast.If):
            if not _is_type_checking(st.test):
                _bindings(st.orelse, out)
                _bindings(st.body, out)
        elif isinstance(st, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            for h in st.handlers:
                _bindings(h.body, out)
            _bindings(st.body, out)
            _bindings(st.orelse, out)
            _bindings(st.finalbody, out)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            _bindings(st.body, out)
    return out


def signature(fn: ast.AST) -> str | None:
    """A function's parameters as ``(a, b=…, *args, c, **kw)`` (defaults as ``…``); None for anything else."""
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = fn.args
    pos = a.posonlyargs + a.args
    first_default = len(pos) - len(a.defaults)
    parts = []
    for i, arg in enumerate(pos):
        parts.append(arg.arg + ("=…" if i >= first_default else ""))
        if a.posonlyargs and i == len(a.posonlyargs) - 1:
            parts.append("/")
    if a.vararg:
        parts.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        parts.append("*")
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        parts.append(arg.arg + ("=…" if d is not None else ""))
    if a.kwarg:
        parts.append("**" + a.kwarg.arg)
    return "(" + ", ".join(parts) + ")"


def _in_vllm(module: str) -> bool:
    return module == "vllm" or module.startswith("vllm.")


class Tree:
    """A vLLM source tree: a folder holding the ``vllm`` package (``site-packages``, an unpacked wheel) or the
    package folder itself. Read with :mod:`ast`, never imported."""

    def __init__(self, path: str | Path):
        p = Path(path).expanduser()
        if not p.is_dir():
            raise TreeError(f"--vllm-src {path}: no such directory")
        if (p / "vllm" / "__init__.py").is_file():
            root = p
        elif p.name == "vllm" and (p / "__init__.py").is_file():
            root = p.parent
        else:
            raise TreeError(f"--vllm-src {path}: holds no vllm package (no vllm/__init__.py)")
        self.root = root.resolve()
        self.name, self.version = _identity(self.root)
        self._mods: dict[str, Module | None] = {}
        self._binds: dict[int, dict[str, ast.AST]] = {}
        self._files: list[tuple[str, Path]] | None = None
        self.unreadable: dict[str, str] = {}  # module -> the SyntaxError this Python gave

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"

    # -- modules and names --------------------------------------------------------------------------------

    def module(self, name: str) -> Module | None:
        if not _in_vllm(name):
            return None
        if name not in self._mods:
            rel = Path(*name.split("."))
            found = None
            for f, package in ((self.root / rel.parent / (rel.name + ".py"), False),
                               (self.root / rel / "__init__.py", True)):
                if f.is_file():
                    text = f.read_text(errors="replace")
                    try:
                        found = Module(name, f, text, ast.parse(text), package)
                    except SyntaxError as e:
                        self.unreadable[name] = f"{type(e).__name__}: {e}"
                        found = None
                    break
            self._mods[name] = found
        return self._mods[name]

    def _bound(self, body_owner: ast.AST) -> dict[str, ast.AST]:
        key = id(body_owner)
        if key not in self._binds:
            self._binds[key] = _bindings(body_owner.body)
        return self._binds[key]

    def _absolute(self, mod: Module, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = mod.name if mod.package else mod.name.rpartition(".")[0]
        parts = package.split(".")
        base = parts[: len(parts) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    def _module_site(self, name: str) -> Site | None:
        return Site(name, "", None) if self.module(name) is not None else None

    def name_in(self, module: str, name: str, depth: int = 0) -> Site | None:
        """Where ``module.name`` comes from: its def/class/assignment, following imports and ``x = y`` aliases."""
        mod = self.module(module)
        if mod is None or depth > _MAX_DEPTH:
            return None
        b = self._bound(mod.tree).get(name)
        if b is None:
            return self._module_site(f"{module}.{name}") if mod.package else None
        if isinstance(b, ast.ImportFrom):
            src = self._absolute(mod, b)
            orig = next(a.name for a in b.names if (a.asname or a.name) == name)
            if not _in_vllm(src):
                return Site(src, orig, None, [f"imported from {src}"], outside=True)
            site = self.name_in(src, orig, depth + 1) or self._module_site(f"{src}.{orig}")
            if site is not None:
                site.via.insert(0, f"imported from {src}")
            return site
        if isinstance(b, ast.Import):
            alias = next(a for a in b.names if (a.asname or a.name.split(".")[0]) == name)
            target = alias.name if alias.asname else alias.name.split(".")[0]
            if not _in_vllm(target):
                return Site(target, "", None, [f"imports {target}"], outside=True)
            return self._module_site(target)
        if isinstance(b, ast.Assign) and isinstance(b.value, ast.Name) and b.value.id != name:
            site = self.name_in(module, b.value.id, depth + 1)
            if site is not None:
                site.via.insert(0, f"alias of {b.value.id}")
                return site
        return Site(module, name, b)

    def member(self, cls: Site, name: str, depth: int = 0) -> Site | None:
        """``cls.name``: in the class body, else in its bases (resolved through the class's module)."""
        if depth > _MAX_DEPTH or not isinstance(cls.node, ast.ClassDef):
            return None
        b = self._bound(cls.node).get(name)
        if b is not None:
            return Site(cls.module, f"{cls.qualname}.{name}", b)
        for base in cls.node.bases:
            bs = self.expr(cls.module, base, depth + 1)
            if bs is not None and isinstance(bs.node, ast.ClassDef):
                found = self.member(bs, name, depth + 1)
                if found is not None:
                    found.via.append(f"inherited from {bs.module}:{bs.qualname}")
                    return found
        return None

    def expr(self, module: str, e: ast.AST, depth: int = 0) -> Site | None:
        if isinstance(e, ast.Name):
            return self.name_in(module, e.id, depth)
        if isinstance(e, ast.Subscript):
            return self.expr(module, e.value, depth)
        if isinstance(e, ast.Attribute):
            left = self.expr(module, e.value, depth)
            return self._step(left, e.attr, depth) if left is not None else None
        return None

    def _step(self, site: Site, part: str, depth: int = 0) -> Site | None:
        if site.outside:
            return None
        if site.node is None:  # a module
            return self.name_in(site.module, part, depth)
        if isinstance(site.node, ast.ClassDef):
            return self.member(site, part, depth)
        return None

    def resolve(self, module: str, qualname: str) -> Site | None:
        """The site of ``module:qualname`` (``qualname`` "": the module), or None when it is not there."""
        if not qualname:
            return self._module_site(module)
        parts = qualname.split(".")
        site = self.name_in(module, parts[0])
        for part in parts[1:]:
            if site is None or site.outside:
                return site
            site = self._step(site, part)
        return site

    def source(self, site: Site) -> str | None:
        """The source text of a site (what ``inspect.getsource`` gives for the object there), None outside vLLM."""
        if site.outside:
            return None
        mod = self.module(site.module)
        if mod is None:
            return None
        if site.node is None:
            return mod.text
        node = site.node
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return "\n".join(mod.text.splitlines()[start - 1: node.end_lineno])

    # -- searching the whole tree -----------------------------------------------------------------------

    def _all_files(self) -> list[tuple[str, Path]]:
        if self._files is None:
            out = []
            for f in sorted((self.root / "vllm").rglob("*.py")):
                parts = list(f.relative_to(self.root).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                if all(p.isidentifier() for p in parts):
                    out.append((".".join(parts), f))
            self._files = out
        return self._files

    def defining(self, name: str) -> list[str]:
        """Modules of the tree whose top level defines ``name`` (def, class or assignment; not an import)."""
        n = re.escape(name)
        pat = re.compile(rf"^[ \t]*(?:async[ \t]+def|def|class)[ \t]+{n}\b|^[ \t]*{n}[ \t]*(?::|=(?!=))", re.M)
        out = []
        for module, f in self._all_files():
            try:
                text = f.read_text(errors="replace")
            except OSError:
                continue
            if not pat.search(text):
                continue
            mod = self.module(module)
            b = self._bound(mod.tree).get(name) if mod is not None else None
            if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)):
                out.append(module)
        return out

    def elsewhere(self, module: str, qualname: str) -> list[str]:
        """``module:qualname`` strings of the same qualified name defined in other modules of the tree."""
        top = qualname.split(".")[0]
        out = []
        for m in self.defining(top):
            if m != module and self.resolve(m, qualname) is not None:
                out.append(f"{m}:{qualname}")
        return out


def _identity(root: Path) -> tuple[str, str]:
    """(distribution name, version) of the vLLM in ``root``: its ``*.dist-info`` (the one whose RECORD lists
    ``vllm/__init__.py``), else ``vllm/_version.py``."""
    for info in sorted(root.glob("vllm*.dist-info")):
        record, meta = info / "RECORD", info / "METADATA"
        try:
            if not re.search(r"^vllm/__init__\.py,", record.read_text(errors="replace"), re.M):
                continue
            head = meta.read_text(errors="replace").split("\n\n", 1)[0]
        except OSError:
            continue
        name = re.search(r"^Name: *(.+)$", head, re.M)
        version = re.search(r"^Version: *(.+)$", head, re.M)
        if name and version:
            return name.group(1).strip(), version.group(1).strip()
    try:
        text = (root / "vllm" / "_version.py").read_text()
        m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
        return "vllm", m.group(1) if m else "unknown version"
    except OSError:
        return "vllm", "unknown version"


def installed_tree() -> Tree | None:
    """The vLLM installed in this environment, as a source tree (found without importing it), or None."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        return Tree(Path(list(spec.submodule_search_locations)[0]))
    except TreeError:
        return None


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
        if not _in_vllm(module):
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
        out += [f"{p.name}: {s}" for s in p.symbols if not _in_vllm(_split(s)[0])]
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

