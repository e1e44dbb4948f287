"""The process that holds one ``vllm.LLM``: ``python -m kit.engine.child REQUEST.json RESULT.json``.

:mod:`kit.engine` starts it in its own session so the whole vLLM tree can be ended at once. It
builds the engine from the topology, runs the jobs in the request (generate, inspect), writes the
result, and ends its process group if its parent dies (a notebook kernel restart).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback


def _watch_parent() -> None:
    parent = int(os.environ.get("KIT_PARENT_PID", "0") or 0)
    if not parent:
        return

    def loop() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                try:
                    os.killpg(os.getpgid(0), signal.SIGKILL)
                finally:
                    os._exit(1)

    threading.Thread(target=loop, daemon=True, name="kit-parent-watch").start()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    req_path, out_path = argv
    _watch_parent()
    from kit.core.topology import Topology
    from kit.engine.local import LocalEngine
    from kit.engine.progress import RUNNER_STARTED

    req = json.loads(open(req_path).read())
    topo = Topology(**req["topology"])
    result: dict = {"ok": False, "jobs": []}
    try:
        t0 = time.monotonic()
        eng = LocalEngine(topo)
        eng.start()
        result["start_seconds"] = time.monotonic() - t0
        print(RUNNER_STARTED.format(seconds=result["start_seconds"]), flush=True)
        for job in req["jobs"]:
            kind = job.pop("kind")
            print(f"[kit.engine.child] job {kind}", flush=True)
            if kind == "generate":
                result["jobs"].append(eng.generate(**job, progress_lines=True).to_dict())
            elif kind == "inspect":
                result["jobs"].append(eng.inspect())
            elif kind == "rpc":  # a KitWorkerExtension method, called on every worker
                result["jobs"].append(eng.llm.collective_rpc(job["method"]))
            else:
                raise ValueError(f"unknown job kind {kind!r}")
        result["ok"] = True
    except BaseException as e:  # report everything, including KeyboardInterrupt
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()
        print(result["traceback"], file=sys.stderr, flush=True)
    # Write the result before any shutdown: the parent ends the whole process group as soon as it has it.
    with open(out_path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(out_path + ".tmp", out_path)
    sys.stdout.flush()
    # vLLM's shutdown can linger; the result is written, so leave now and take the group with us.
    os._exit(0 if result["ok"] else 3)


if __name__ == "__main__":
    sys.exit(main())
