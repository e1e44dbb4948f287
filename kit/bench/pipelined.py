"""The pipelined decode step predicted from a serial run's stage costs.

Under ``pp_microbatches`` the running requests split into PP groups that take turns: while one group's step is on
the last stage, the next group's is on rank 0. vLLM's own loop (the patch off) runs the same groups one step after
another when drafts are on (its scheduling gate holds a group out of the step after its own, the engine core waits
for each step's drafts), so a serial run and a pipelined run at one batch size carry the same requests per step
and differ only in the schedule. From the serial run's trace (:func:`kit.worker.steptrace.summary`), nothing fitted,
the pipelined step period is bounded below by:

- **stage**: the busiest stage's busy time per step (each stage computes every group's step in turn);
- **cores**: all the work of a step, every stage's busy time plus the engine core's part of the path (hand-over,
  draft collection, output processing and scheduling), over the machine's cores;
- **round trip**: a group's whole serial step over the number of groups (a group's next step waits for its own
  outputs and drafts).

The prediction is the largest bound; the decode speed-up over the serial run, at equal requests per step, is the
serial period over it. What the bounds leave out (a group's round trip lengthens while it queues behind the other
group on a busy stage) makes the prediction optimistic; the notebook that uses it says by how much.
"""
from __future__ import annotations


def bounds(serial: dict, groups: int = 2, cores: int = 2) -> dict[str, float]:
    """The three lower bounds (seconds) on the pipelined period, from a serial run's :func:`summary`."""
    busy = [s["busy"] for s in serial["stages"]]
    path = serial.get("path", {})
    engine = sum(path.get(k) or 0.0 for k in ("send", "handoff", "back"))
    return {"stage": max(busy), "cores": (sum(busy) + engine) / cores, "round trip": serial["period"] / groups}


def predict(serial: dict, groups: int = 2, cores: int = 2) -> dict:
    """The predicted pipelined period (``period``), the bound that sets it (``bound``), all bounds, and the
    predicted decode speed-up over the serial run at equal requests per step (``speedup``)."""
    b = bounds(serial, groups, cores)
    name = max(b, key=b.get)
    return {"period": b[name], "bound": name, "bounds": b, "speedup": serial["period"] / b[name]}


def check(serial: dict, pipelined: dict, groups: int = 2, cores: int = 2) -> dict:
    """The prediction against a pipelined run's :func:`summary`: the serial period it came from (``serial``), the
    measured one, the error of the predicted one (``error`` = predicted / measured - 1), the measured speed-up
    (periods, then per request: the two runs' requests per step differ a little where requests finish at different
    times)."""
    p = predict(serial, groups, cores)
    measured = pipelined["period"]
    per_request = (serial["period"] / serial["reqs_per_step"]) / (measured / pipelined["reqs_per_step"])
    return {**p, "serial": serial["period"], "measured": measured, "error": p["period"] / measured - 1.0,
            "measured_speedup": serial["period"] / measured, "measured_speedup_per_request": per_request}
