"""What the things the kit starts have in common: a server, a router, a PD pair, a set of nodes, a Ray cluster."""
from __future__ import annotations


class Lifecycle:
    """Started, then stopped: ``with X(...) as x`` calls :meth:`start` and, on the way out, :meth:`stop`.

    ``start`` must stop what it started when it fails part-way (``__exit__`` does not run when ``__enter__``
    raises) and returns ``self``; ``stop`` may be called more than once.
    """

    def start(self):
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class ProcessLifecycle(Lifecycle):
    """A :class:`Lifecycle` that is one managed process tree (``self.proc``), ended as a whole by :meth:`stop`."""

    proc = None  # a kit.engine.procs.ManagedProcess while running

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc = None
