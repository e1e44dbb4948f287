"""Finds the places where a notebook claim or a test assertion reads the clock.

A shared 2-core machine (CI's) runs engines at whatever speed its load allows, so a claim or an assertion that
reads a measured time, speed or speed ratio passes or fails with the load. The rules:

- a notebook's ``claim(holds, ...)`` whose ``holds`` reads the clock must say ``timed=True`` (the CI parameters
  then print it instead of asserting it, :func:`kit.lab.notebook.claim`); one marked ``timed`` that does not read
  the clock is flagged too, so the mark cannot be used to silence a claim;
- a test's ``assert`` may not read the clock at all.

"Reads the clock" is a taint followed through the source, flow-insensitively (a name is tainted when any
assignment to it is; comprehension variables are scoped to their comprehension):

- sources: calls of the ``time`` module's clocks; in notebooks also a subtraction of two ``t0``/``t1``
  timestamps (a duration; comparing two timestamps, which orders causally linked events, is not a source) and
  a read of a duration or speed field (``seconds``, ``*_s``, ``*_ms``, ``*tok_s``, ``ttft*``) of a live
  object, such as a row of :func:`kit.bench.measure_batches`. Fields read from committed data (anything derived
  from ``json.loads``/``read_text``/``json.load``, e.g. ``docs/results/bench.json``) are not sources: the
  same bytes give the same claim on every machine;
- a name assigned, iterated, appended to (``x.append(v)``, ``x[k] = v``, ...) from a tainted expression is
  tainted; so is arithmetic on it, and a call's result when the callee is (a method of a tainted object, a
  function of the same source returning a tainted value) or when a function that passes values on (``sum``,
  ``max``, ``round``, ``statistics.median``, ...) gets a tainted argument. Other calls' arguments do not taint
  their result: a library call given a timestamp (``since=t0``) returns no time.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

CLOCK = "clock"
COMMITTED = "committed"
TIME_FUNCS = {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "process_time",
              "process_time_ns", "thread_time", "thread_time_ns"}
PASS_THROUGH = {"abs", "round", "min", "max", "sum", "sorted", "float", "int", "median", "mean", "fmean", "stdev",
                "quantile", "quantiles", "percentile", "array", "asarray", "list", "tuple", "dict", "set", "zip",
                "map", "filter", "reversed", "enumerate", "next", "iter", "fsum", "prod", "all", "any"}
COMMITTED_CALLS = {"loads", "load", "read_text", "read_json", "read_csv"}
DURATION_FIELD = re.compile(r"^(seconds|.*_s|.*_ms|.*tok_s|ttft.*)$")
TIMESTAMP_FIELD = {"t0", "t1"}
MUTATORS = {"append", "extend", "add", "update", "insert", "setdefault", "appendleft"}


@dataclass(frozen=True)
class Finding:
    line: int
    what: str
    source: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}: {self.source}"


def _field(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def _callee(node: ast.Call) -> str | None:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


class _Taint:
    def __init__(self, tree: ast.AST, fields: bool):
        self.fields = fields  # the duration-field and timestamp rules (notebooks); tests use only real clocks
        self.env: dict[str, set[str]] = {}
        self.clock_names = set()  # `from time import monotonic`
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module == "time":
                self.clock_names |= {a.asname or a.name for a in n.names if a.name in TIME_FUNCS}
        self.tree = tree

    # -- expressions -------------------------------------------------------------------------------
    def of(self, node: ast.AST | None, local: dict[str, set[str]] | None = None) -> set[str]:
        if node is None:
            return set()
        local = local or {}
        if isinstance(node, ast.Name):
            return set(local[node.id]) if node.id in local else set(self.env.get(node.id, ()))
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = dict(local)
            for g in node.generators:
                t = self.of(g.iter, inner)
                for name in _names(g.target):
                    inner[name] = set(t)
                for cond in g.ifs:
                    self.of(cond, inner)
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            return set().union(*(self.of(p, inner) for p in parts))
        if isinstance(node, ast.Lambda):
            return self.of(node.body, local)
        out: set[str] = set()
        if isinstance(node, ast.Call):
            name = _callee(node)
            f = node.func
            if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "time"
                    and f.attr in TIME_FUNCS) or (isinstance(f, ast.Name) and f.id in self.clock_names):
                return {CLOCK}
            if name in COMMITTED_CALLS:
                out.add(COMMITTED)
            # The callee's own taint (a method of a tainted object, a function of this source returning a
            # clock value); the arguments' only through functions that pass their values on (sum, max, round,
            # ...): a library call that takes a timestamp (a `since=` filter) returns no time.
            out |= self.of(f, local)
            if name in PASS_THROUGH or name in COMMITTED_CALLS:
                for a in [*node.args, *(k.value for k in node.keywords)]:
                    out |= self.of(a, local)
            return out
        if self.fields:
            field = _field(node)
            if field is not None and DURATION_FIELD.match(field):
                base = self.of(node.value, local)
                if not (COMMITTED in base and CLOCK not in base):
                    out.add(CLOCK)
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and \
                    any(_field(side) in TIMESTAMP_FIELD for side in (node.left, node.right)):
                out.add(CLOCK)
        for child in ast.iter_child_nodes(node):
            out |= self.of(child, local)
        return out

    # -- statements --------------------------------------------------------------------------------
    def _bind(self, target: ast.AST, taint: set[str]) -> bool:
        changed = False
        for name in _names(target):
            have = self.env.setdefault(name, set())
            if not taint <= have:
                have |= taint
                changed = True
        return changed

    def settle(self) -> None:
        """Propagate until no name gains a taint."""
        changed = True
        while changed:
            changed = False
            for n in ast.walk(self.tree):
                if isinstance(n, ast.Assign):
                    t = self.of(n.value)
                    for tgt in n.targets:
                        changed |= self._bind(tgt, t)
                elif isinstance(n, (ast.AugAssign, ast.AnnAssign)) and n.value is not None:
                    changed |= self._bind(n.target, self.of(n.value) | self.of(n.target))
                elif isinstance(n, ast.NamedExpr):
                    changed |= self._bind(n.target, self.of(n.value))
                elif isinstance(n, (ast.For, ast.AsyncFor)):
                    changed |= self._bind(n.target, self.of(n.iter))
                elif isinstance(n, ast.withitem) and n.optional_vars is not None:
                    changed |= self._bind(n.optional_vars, self.of(n.context_expr))
                elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    t = set().union(*(self.of(r.value) for r in ast.walk(n) if isinstance(r, ast.Return)))
                    changed |= self._bind(ast.Name(id=n.name), t)
                elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS:
                    t = set().union(*(self.of(a) for a in [*n.args, *(k.value for k in n.keywords)]))
                    changed |= self._bind(_root(n.func.value), t)
            # x[k] = v / x.attr = v taint x
            for n in ast.walk(self.tree):
                if isinstance(n, ast.Assign):
                    for tgt in n.targets:
                        if isinstance(tgt, (ast.Subscript, ast.Attribute)):
                            changed |= self._bind(_root(tgt), self.of(n.value))


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node


def _names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _names(e)]
    if isinstance(target, ast.Starred):
        return _names(target.value)
    return []


def notebook_findings(source: str) -> list[Finding]:
    """Claims that read the clock without ``timed=True``, and claims marked ``timed`` that do not read it."""
    tree = ast.parse(source)
    taint = _Taint(tree, fields=True)
    taint.settle()
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and _callee(n) == "claim" and n.args:
            reads = CLOCK in taint.of(n.args[0])
            marked = any(k.arg == "timed" and isinstance(k.value, ast.Constant) and k.value.value is True
                         for k in n.keywords)
            if reads and not marked:
                out.append(Finding(n.lineno, "claim reads a measured time or speed but is not marked timed=True",
                                   ast.get_source_segment(source, n.args[0]) or ""))
            elif marked and not reads:
                out.append(Finding(n.lineno, "claim marked timed=True reads no measured time",
                                   ast.get_source_segment(source, n.args[0]) or ""))
    return out


OPT_IN_MARKS = {"slow", "pd", "reliability"}  # pyproject's addopts leaves these out of the default selection


def _marks(decorators: list[ast.expr]) -> set[str]:
    """The ``pytest.mark.NAME`` names among decorators (or a ``pytestmark`` value)."""
    out = set()
    for d in decorators:
        for n in ast.walk(d):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "mark":
                out.add(n.attr)
    return out


def test_findings(source: str) -> list[Finding]:
    """Assertions that read one of the ``time`` module's clocks, in what the default selection runs: test
    functions not marked slow/pd/reliability (by decorator or the module's ``pytestmark``), and every helper
    and fixture (which any test may call)."""
    tree = ast.parse(source)
    module_marks = set()
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets):
            module_marks |= _marks([n.value])
    taint = _Taint(tree, fields=False)
    taint.settle()
    skipped: set[int] = set()  # ids of assert nodes inside opt-in tests
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test"):
            if (module_marks | _marks(n.decorator_list)) & OPT_IN_MARKS:
                skipped |= {id(a) for a in ast.walk(n) if isinstance(a, ast.Assert)}
    return [Finding(n.lineno, "assertion reads the clock", ast.get_source_segment(source, n.test) or "")
            for n in ast.walk(tree)
            if isinstance(n, ast.Assert) and id(n) not in skipped and CLOCK in taint.of(n.test)]


test_findings.__test__ = False  # a helper, not a pytest test
