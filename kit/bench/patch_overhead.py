"""What the kit's patches cost on a decode step they have nothing to do for (PP=1, no speculation).

``kit bench --patch-cost`` compares whole engines with the patches on and off; on a shared 2-core machine
that comparison swings by more than the 3% it is meant to check. This measures the cost directly: every patch
wrapper that sits on a per-step path is called on the PP=1 / no-spec branch with the vLLM function it wraps
swapped for a no-op (through the wrapper's closure cell, restored afterwards), so only the wrapper's own work
is timed: its extra Python call and the checks that send it straight to the original. Which wrappers: every
patch of the registry whose ``kind`` is per-step and that gives a ``step_probe`` (its no-op path).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from kit.patches import Kind, StepProbe, apply_selected, marked, registry


@dataclass
class WrapperCost:
    patch: str
    target: str
    calls_per_step: int
    ns_per_call: float


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _swap_orig(wrapper: Callable, replacement: Callable):
    """The closure cell holding the function ``wrapper`` wraps (``__wrapped__``), and its old contents."""
    orig = wrapper.__wrapped__
    for cell in wrapper.__closure__ or ():
        try:
            if cell.cell_contents is orig:
                cell.cell_contents = replacement
                return cell, orig
        except ValueError:  # an empty cell
            continue
    raise LookupError(f"{wrapper.__qualname__}: no closure cell holds the wrapped function")


def _time(fn: Callable, args: tuple, kwargs: dict, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn(*args, **kwargs)
    return (time.perf_counter_ns() - t0) / n


def per_step_probes(num_layers: int) -> list[tuple[str, StepProbe]]:
    """(patch, probe) for every per-step patch of the registry on the PP=1 / no-spec path (``kind`` per-step
    and a ``step_probe``; a per-step patch without one runs only where PP > 1 or PD is in use)."""
    return [(p.name, p.step_probe(num_layers)) for p in registry().values()
            if p.kind is Kind.PER_STEP and p.step_probe is not None]


def measure(n: int = 200_000, num_layers: int = 4) -> list[WrapperCost]:
    """Apply the selected patches in this process and time each per-step wrapper's own overhead
    (``num_layers``: attention layers per forward, for the per-layer wrappers)."""
    apply_selected()
    out = []
    for patch, probe in per_step_probes(num_layers):
        wrapper = getattr(probe.owner, probe.attr)
        while wrapper is not None and marked(wrapper) != patch:  # patches stacked on one function
            wrapper = getattr(wrapper, "__wrapped__", None)
        if wrapper is None:
            continue  # this patch is not applied here
        cell, orig = _swap_orig(wrapper, _noop)
        try:
            _time(wrapper, probe.args, probe.kwargs, n // 10)  # warm up
            direct = min(_time(_noop, probe.args, probe.kwargs, n) for _ in range(3))
            wrapped = min(_time(wrapper, probe.args, probe.kwargs, n) for _ in range(3))
        finally:
            cell.cell_contents = orig
        out.append(WrapperCost(patch, f"{probe.owner.__name__}.{probe.attr}", probe.calls_per_step,
                               max(0.0, wrapped - direct)))
    return out


# -- start-up: the plugin's load time per process, with and without the process filter --------------------

def startup_run(topology, filtered: bool) -> dict:
    """One fresh engine (one prompt, 4 tokens): its start seconds and each vLLM process's plugin record
    (``KIT_PATCH_LOG``). ``filtered=False`` sets ``KIT_PATCH_EVERY_PROCESS=1``: every patch in every process."""
    import tempfile

    from kit.engine import generate
    from kit.patches import ENV_EVERYWHERE, ENV_LOG

    with tempfile.TemporaryDirectory(prefix="kit-startup-") as d:
        log = f"{d}/patches.jsonl"
        env = {ENV_LOG: log, ENV_EVERYWHERE: "0" if filtered else "1"}
        r = generate(topology, ["def add(a, b):\n    return"], max_tokens=4, env=env)
        procs = [json.loads(line) for line in open(log)]
    return {"filtered": filtered, "time": time.time(), "start_s": r.topology["start_seconds"], "tokens": r.token_ids,
            "plugin_s": {_kind(p): p["seconds"] for p in procs}}


def _kind(rec: dict) -> str:
    """A short name for a plugin record's process: front end, engine core, or worker N."""
    name = rec.get("mp_name", "")
    if name.startswith("VllmWorker-"):
        return "worker " + name.split("-", 1)[1]
    return {"MainProcess": "front end", "EngineCore": "engine core"}.get(name, name)


def startup_table(runs: list[dict]) -> str:
    """Markdown: median [min-max] engine start and per-process plugin time, filtered vs every process."""
    import statistics

    def stat(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]" if xs else "-"

    kinds = sorted({k for r in runs for k in r["plugin_s"]}, key=lambda k: (k != "front end", k != "engine core", k))
    lines = ["| patches applied | engines | engine start s | " + " | ".join(f"plugin s, {k}" for k in kinds) + " |",
             "|---" * (3 + len(kinds)) + "|"]
    for filtered, label in ((False, "in every process (KIT_PATCH_EVERY_PROCESS=1)"),
                            (True, "only where their code runs (default)")):
        rs = [r for r in runs if r["filtered"] is filtered]
        cells = [stat([r["plugin_s"][k] for r in rs if k in r["plugin_s"]]) for k in kinds]
        lines.append(f"| {label} | {len(rs)} | {stat([r['start_s'] for r in rs])} | " + " | ".join(cells) + " |")
    same = len({json.dumps(r["tokens"]) for r in runs}) == 1
    lines += ["", f"Tokens identical across all {len(runs)} engines: {same}. Median [min-max] over fresh engines, "
              "run alternately (every process, filtered), every record in the --raw file."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``kit patch-overhead startup``: append RUNS x 2 engines' records to --raw; print the table (with --out, also
    write it into that file as a results block headed by the records' dates, machine and versions)."""
    import argparse
    import datetime as dt
    import sys

    from kit.core.models import REPO_ROOT
    from kit.core.results import block_key, command_line, header, machine, versions, write_block
    from kit.core.topology import Topology

    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="kit patch-overhead", description=main.__doc__)
    ap.add_argument("what", choices=["startup"])
    ap.add_argument("--model", default="tiny-mimo")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--spec", default="mtp:2")
    ap.add_argument("--runs", type=int, default=1, help="pairs of engines (every process, filtered) to start now")
    ap.add_argument("--raw", required=True, metavar="FILE",
                    help="JSONL file the runs are appended to (and the table made from)")
    ap.add_argument("--out", default=None, metavar="FILE",
                    help="also write the table into FILE (docs/results/patch-startup.md) as this command's block")
    a = ap.parse_args(argv)
    if a.runs < 0:
        ap.error("--runs must be >= 0")
    try:
        topo = Topology(model=a.model, pp=a.pp, spec=a.spec)
    except ValueError as e:  # TopologyError: bad input, before any process starts
        ap.error(str(e))
    for _ in range(a.runs):
        for filtered in (False, True):
            rec = {**startup_run(topo, filtered), "machine": machine(), "versions": versions()}
            with open(a.raw, "a") as f:
                f.write(json.dumps(rec) + "\n")
    runs = [json.loads(x) for x in open(a.raw)] if os.path.exists(a.raw) else []
    if not runs:
        ap.error(f"--raw {a.raw}: no runs recorded (give --runs N)")
    times = [dt.datetime.fromtimestamp(r["time"], dt.timezone.utc) for r in runs]
    last = runs[-1]
    raw = os.path.abspath(a.raw)
    recorded = {"until": max(times), "on": last.get("machine"), "with_versions": last.get("versions"),
                "source": os.path.relpath(raw, REPO_ROOT) if raw.startswith(str(REPO_ROOT) + os.sep) else None}
    command = command_line("kit patch-overhead", argv)
    table = startup_table(runs)
    print(header(command, min(times), **recorded) + "\n\n" + table)
    if a.out:
        write_block(a.out, block_key("kit patch-overhead", argv, skip=("--out", "--raw", "--runs")), table, command,
                    when=min(times), title="Patch plugin start-up cost", **recorded)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
