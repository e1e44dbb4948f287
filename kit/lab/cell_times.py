"""How long a notebook says its waits take, against how long they took in an executed copy.

A learner should know how long a cell will keep them waiting. Every cell that runs engines (any cell that ran at
least :data:`ENGINE_S` seconds) states its wait in a comment line, ``# about 25 s on 2 cores: ...`` (a cell that
calls an engine but is refused before any process starts begins with ``# under a second: ...``), and each
notebook states its whole run time in its opening markdown (``About 90 s on 2 cores`` or ``About 2 minutes ...``).
:func:`check` compares each statement with papermill's durations in the executed copy (``metadata.papermill``
of each cell and of the notebook) and :func:`summary` says how many lie within :data:`TOLERANCE` of the measured
time; ``kit report`` prints that per notebook and records it with ``--write``. The statements are written from
one run and checked on the next: a statement off by more than the tolerance is listed, not hidden.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

TOLERANCE = 0.30   # a stated time counts as right within ±30 % of the measured one
TOLERANCE_TEXT = f"±{TOLERANCE:.0%}".replace("%", " %")  # "±30 %", as the kit's tables write percentages
ENGINE_S = 10.0    # a cell that ran this long keeps a learner waiting: it must state its time
# "# about 25 s on 2 cores" in a code cell; "About 2 minutes on 2 cores" in the opening markdown.
_AMOUNT = r"about (\d+(?:\.\d+)?) (s|seconds?|min|minutes?)\b"
CELL_STATED = re.compile(r"^\s*#.*?\b" + _AMOUNT, re.I | re.M)
NOTEBOOK_STATED = re.compile(r"\b" + _AMOUNT + r" on 2 cores", re.I)


@dataclass
class Stated:
    """One stated wait: ``where`` is ``"notebook"`` or ``"cell N"`` (the code cell's position, from 1)."""
    where: str
    stated: float | None    # seconds, None when an engine cell states nothing
    measured: float | None  # seconds, None when the copy holds no duration (not executed)

    @property
    def ok(self) -> bool:
        return (self.stated is not None and self.measured is not None
                and abs(self.stated - self.measured) <= TOLERANCE * self.measured)

    def describe(self) -> str:
        measured = f"{self.measured:.0f} s" if self.measured is not None else "not measured"
        if self.stated is None:
            return f"{self.where}: states no time, took {measured}"
        return f"{self.where}: states about {self.stated:.0f} s, took {measured}"


def _seconds(number: str, unit: str) -> float:
    return float(number) * (60.0 if unit.lower().startswith("min") else 1.0)


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def check(nb: dict) -> list[Stated]:
    """Every stated wait of an executed notebook (and every engine cell that states none), with its measured
    time: the notebook's statement first (the first markdown cell that has one), then the code cells in order."""
    out: list[Stated] = []
    cells = nb.get("cells", [])
    for cell in cells:
        if cell.get("cell_type") == "markdown" and (m := NOTEBOOK_STATED.search(_source(cell))):
            total = (nb.get("metadata", {}).get("papermill") or {}).get("duration")
            out.append(Stated("notebook", _seconds(*m.groups()), total))
            break
    code = [c for c in cells if c.get("cell_type") == "code"]
    for i, cell in enumerate(code, start=1):
        took = (cell.get("metadata", {}).get("papermill") or {}).get("duration")
        src = _source(cell)
        m = CELL_STATED.search(src)
        first = next((line.strip() for line in src.splitlines()
                      if line.strip() and not line.lstrip().startswith("#")), "")  # names the cell: its first code
        where = f"cell {i}" + (f" (`{first[:40]}{'...' if len(first) > 40 else ''}`)" if first else "")
        if m:
            out.append(Stated(where, _seconds(*m.groups()), took))
        elif took is not None and took >= ENGINE_S:
            out.append(Stated(where, None, took))
    return out


def summary(times: list[Stated]) -> str:
    """``"6 of 6 stated times within ±30 %"`` (the ones off: ``[t.describe() for t in times if not t.ok]``)."""
    good = sum(t.ok for t in times)
    return f"{good} of {len(times)} stated times within {TOLERANCE_TEXT}"
