"""What the things the kit starts have in common: a server, a router, a PD pair, a set of nodes, a Ray cluster."""
from __future__ import annotations

import atexit
import os
import shutil
from pathlib import Path

ENV_KEEP_RUNS = "KIT_KEEP_RUNS"  # "1": keep every run folder (prompts, result, logs) under the cache, for debugging
_AT_EXIT: set[str] = set()  # failed runs' folders: kept while this process lives (their errors name the logs)


def _remove_failed_runs() -> None:
    if os.environ.get(ENV_KEEP_RUNS) != "1":
        for p in _AT_EXIT:
            shutil.rmtree(p, ignore_errors=True)


atexit.register(_remove_failed_runs)


def remove_run_dir(path: "Path | str | None", failed: bool = False) -> bool:
    """Remove a run's folder under the kit's cache now; a failed run's (its error names the log there) when this
    process exits, so the notebook or session that saw the error can still read it. ``KIT_KEEP_RUNS=1`` keeps
    every folder. Returns whether it was removed now."""
    if path is None or os.environ.get(ENV_KEEP_RUNS) == "1":
        return False
    if failed:
        _AT_EXIT.add(str(path))
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


class Lifecycle:
    """Started, then stopped: ``with X(...) as x`` calls :meth:`start` and, on the way out, :meth:`stop`.

    ``start`` must stop what it started when it fails part-way (``__exit__`` does not run when ``__enter__``
    raises) and returns ``self``; ``stop`` may be called more than once. A folder the object made for its logs
    (``run_dir``) is removed by :meth:`release_run_dir`; if something failed (``failed``: a failed start, or an
    exception leaving the ``with`` block) when this process exits (:func:`remove_run_dir`).
    """

    run_dir: "Path | None" = None
    failed: bool = False

    def release_run_dir(self) -> None:
        remove_run_dir(self.run_dir, self.failed)
        self.run_dir = None

    def start(self):
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            self.failed = True
        self.stop()


class ProcessLifecycle(Lifecycle):
    """A :class:`Lifecycle` that is one managed process tree (``self.proc``), ended as a whole by :meth:`stop`."""

    proc = None  # a kit.engine.procs.ManagedProcess while running

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc = None
        self.release_run_dir()
