"""The fault table: a results block in ``docs/results/faults.md`` rendered from the records ``kit faults ROW``
appends to ``docs/results/faults.jsonl`` (``kit faults --render``), headed by the records' own dates, machine and
versions (:func:`kit.core.results.header`)."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from kit.core.models import REPO_ROOT
from kit.core.results import write_block

COMMAND = "kit faults --render"
KEY = "kit faults render"


def _when(date: str) -> dt.datetime:
    """A record's ``date`` (``2026-12-02 08:39 UTC``) as an aware datetime."""
    return dt.datetime.strptime(date, "%Y-%m-%d %H:%M UTC").replace(tzinfo=dt.timezone.utc)


def render(jsonl: Path, doc: Path, order: list[str], model: str) -> str:
    """Write the fault block into ``doc``: the table from the last record of each row in ``jsonl``, rows in
    ``order`` (the fault rows of :mod:`kit.checks.faults`), ``model`` the model the rows ran. The header gives the
    records' first and last date and the machine and versions they name. Returns the block."""
    recs: dict[str, dict] = {}
    for line in jsonl.read_text().splitlines() if jsonl.exists() else []:
        if line.strip():
            r = json.loads(line)
            recs[r["row"]] = r
    rows = sorted(recs.values(), key=lambda r: order.index(r["row"]) if r["row"] in order else 99)
    if not rows:
        raise ValueError(f"{jsonl}: no fault records to render (run `flock /tmp/kit-vllm.lock kit faults ROW`)")
    dates = sorted(_when(r["date"]) for r in rows)
    last = max(rows, key=lambda r: _when(r["date"]))
    try:
        source = str(jsonl.resolve().relative_to(REPO_ROOT))
    except ValueError:
        source = str(jsonl)
    out = ["Each row is the last record of one locked invocation, `flock /tmp/kit-vllm.lock kit faults ROW` (rows "
           "and injections: `kit faults --list`). Model "
           f"`{model}`, random weights. *Time* runs from the injection to the line the kit printed or raised; *gone* "
           "to the moment no process of the run was left; *left after* is the leak check of `tests/conftest.py` "
           "(`no_leftovers`: vLLM processes, `/dev/shm` entries, temp-dir sockets and folders, 30 s of grace).",
           "", "| fault | phase | injected | time to the error | line printed | gone | left after (proc / shm / temp) |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        secs = "–" if r.get("seconds") is None else f"{r['seconds']} s"
        if r.get("wall_s") is not None:  # nothing failed: how long the runs took
            secs = f"no error; both done after {r['wall_s']} s"
        gone = "–" if r.get("gone_s") is None else f"{r['gone_s']} s"
        left = f"{len(r['leftover_processes'])} / {len(r['leftover_shm'])} / {len(r['leftover_temp'])}"
        line = r["line"].replace("|", "\\|")[:400]
        out.append(f"| {r['fault']} | {r['phase']} | {r['how']} | {secs} | `{line}` | {gone} | {left} |")
    out.append("")
    out += ["Notes:", "",
            "- SIGKILL rows: the caller dies at once and prints nothing; *gone* is the kit's guard ending the tree "
            "(parent-death signal) and removing its `/dev/shm` entries and temp folder.",
            "- PD handoff rows: the caller is a script on the Python API (`kit faults --caller pd-handoff`) "
            "whose router pauses 5 s between the producer's answer and the consumer call (`pause_before_decode`); "
            "`PDPair.complete` lets KeyboardInterrupt through and `PDPair.__exit__` ends both servers. The line is "
            "the script's own: the Python API raises KeyboardInterrupt, it prints nothing itself.",
            "- Disk-full row: the caller (`kit faults --caller disk-full`, in its own mount namespace) "
            "prints `caller: error:` before the kit's EngineError, and its hint line after ` / `. Both PP workers "
            "died within seconds of the disk filling up; why is not in their log, which could not be written.",
            "- Port rows: the kit checks each port just before the process that binds it starts; a port taken after "
            "that check fails vLLM's bind; for the NIXL side channel the pair's start-up watch counts \"Address "
            "already in use\" in a server's log as a start-up failure. That path is not injected here.",
            "- Earlier records of a row stay in `faults.jsonl`; the table shows each row's last. The side-channel "
            "row's earlier record (38.93 s) is from before `PDPair` ended the other server when one failed before "
            "it had a process.",
            "- A node's death in a two-node run is not a row here: `tests/test_multinode.py` kills node 1's worker "
            "mid-request and holds the report to 30 s ([multinode](../multinode.md)).", ""]
    notes = [r for r in rows if r.get("leftover_processes") or r.get("leftover_shm") or r.get("leftover_temp")
             or r.get("outcome") in ("missed", "error", "failed")]
    if notes:
        out += ["Rows with something to say:", ""]
        for r in notes:
            out.append(f"- {r['row']}: outcome {r.get('outcome')}; left {r['leftover_processes'][:3]} "
                       f"{r['leftover_shm'][:3]} {r['leftover_temp'][:3]}")
        out.append("")
    return write_block(doc, KEY, "\n".join(out), COMMAND, when=dates[0], until=dates[-1], title="Fault table",
                       on=last["machine"], with_versions=last["versions"], source=source)
