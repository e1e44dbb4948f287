"""The package's layers, read from its own imports (every ``import`` statement, at module level or inside a
function): each subpackage of ``kit`` imports only the layers below it, and no modules import each other in a
cycle. The layers, bottom to top, are documented in ``kit/__init__.py`` and ``docs/layout.md``."""
from __future__ import annotations

import ast
from pathlib import Path

KIT = Path(__file__).resolve().parents[1] / "kit"
# Rank of each top-level entry of kit/: a package may import packages of a lower rank and itself only.
LAYERS = {"core": 0, "patches": 1, "worker": 1, "zoo": 1, "engine": 2, "pd": 3, "checks": 4, "bench": 4,
          "lab": 5, "cli": 6}
TOP = {"__init__.py", "__main__.py"}  # the facade (lazy names) and `python -m kit`


def module_name(path: Path) -> str:
    parts = list(path.relative_to(KIT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(KIT.rglob("*.py"))}


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The kit modules ``path`` imports (``from kit.x import y`` counts as kit.x.y when y is a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t.startswith("kit") and t != name:
                found.add(t)
    return found


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def upward_imports() -> list[str]:
    known = modules()
    bad = []
    for name, path in known.items():
        if path.parent == KIT and path.name in TOP:
            continue
        src = layer(name)
        for target in sorted(imports(path, known)):
            dst = layer(target)
            if dst is None:
                bad.append(f"{name} imports the facade {target}")
            elif dst != src and LAYERS[dst] >= LAYERS[src]:
                bad.append(f"{name} ({src}, layer {LAYERS[src]}) imports {target} ({dst}, layer {LAYERS[dst]})")
    return bad


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), over every import."""
    known = modules()
    graph = {n: sorted(imports(p, known)) for n, p in known.items()}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_every_top_level_entry_is_a_known_layer():
    entries = sorted(p.name for p in KIT.iterdir() if p.name != "__pycache__")
    assert len(entries) <= 12, entries
    assert set(entries) == TOP | set(LAYERS), entries


def test_no_layer_imports_upward():
    assert upward_imports() == []


def test_no_import_cycles():
    assert cycles() == []


def test_the_check_sees_an_upward_import_and_a_cycle(tmp_path, monkeypatch):
    """The checks above can fail: a fake tree with one upward import and one cycle."""
    fake = tmp_path / "kit"
    for rel, text in {"__init__.py": "", "core/__init__.py": "", "core/a.py": "from kit.cli import b\n",
                      "cli/__init__.py": "", "cli/b.py": "import kit.core.a\n"}.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(text)
    monkeypatch.setattr(__import__(__name__), "KIT", fake)
    assert upward_imports() == ["kit.core.a (core, layer 0) imports kit.cli.b (cli, layer 6)"]
    assert cycles() == [["kit.cli.b", "kit.core.a"]]
