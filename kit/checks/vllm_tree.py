"""A vLLM source tree read with :mod:`ast`: where a ``module:qualname`` is bound (defined, imported or inherited), without
importing anything from the tree, so any vLLM version (an installed ``site-packages`` or an unpacked wheel) can be read
from the kit's environment. Used by :mod:`kit.checks.patch_compat`.
"""
from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

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


def in_vllm(module: str) -> bool:
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
        if not in_vllm(name):
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
            if not in_vllm(src):
                return Site(src, orig, None, [f"imported from {src}"], outside=True)
            site = self.name_in(src, orig, depth + 1) or self._module_site(f"{src}.{orig}")
            if site is not None:
                site.via.insert(0, f"imported from {src}")
            return site
        if isinstance(b, ast.Import):
            alias = next(a for a in b.names if (a.asname or a.name.split(".")[0]) == name)
            target = alias.name if alias.asname else alias.name.split(".")[0]
            if not in_vllm(target):
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
