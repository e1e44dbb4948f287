"""One updating status line while a vLLM engine or server starts and generates: phase and elapsed seconds.

The engine runs in a subprocess (:mod:`kit.engine.child`) or as ``vllm``'s API server, and both write one log
file. :class:`Status` follows that log and turns known lines into phases (importing vLLM, starting the
engine core, loading weights, KV cache and warm-up, ready in N s, generating k/N prompts). How it shows depends
on where stderr goes:

- a Jupyter kernel (JupyterLab, papermill): ``tqdm.auto``'s widget line (a ``\\r``-updated text line where
  ipywidgets is missing), and the final line left as text in the cell's output;
- a terminal (``sys.stderr.isatty()``): one line redrawn in place with ``\\r`` (tqdm);
- anything else (a file, a pipe, a CI log): plain lines and no ``\\r``: one when the phase changes, one per
  quarter of the prompts generated (0, 25, 50, 75, 100 %), the same line again at most every
  :data:`REPEAT_SECONDS` while a phase lasts (so the log shows the run is alive), and the final line.

Off with ``quiet=True``, :func:`set_quiet`, or ``KIT_QUIET=1`` in the environment.
"""
from __future__ import annotations

import io
import os
import re
import sys
import time
from pathlib import Path

ENV_QUIET = "KIT_QUIET"
_quiet_default: bool | None = None
# Without a terminal: a phase that lasts repeats its line at most this often.
REPEAT_SECONDS = 60.0

# The runner prints these lines (to its log) for the parent to follow.
RUNNER_STARTED = "[kit.engine.child] engine started in {seconds:.1f} s"
RUNNER_GENERATED = "[kit.engine.child] generated {done}/{total} prompts"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Start-up phases, in the order vLLM 0.32 reaches them (a later one never goes back to an earlier one:
# the PP workers' lines interleave). Matched on lines of the engine or server log.
_STARTUP = [
    (re.compile(r"non-default args"), "reading the model config"),
    (re.compile(r"Initializing a V1 LLM engine"), "starting the engine core"),
    (re.compile(r"distributed_init_method="), "starting the workers"),
    (re.compile(r"Starting to load model"), "loading weights"),
    (re.compile(r"Loading drafter model"), "loading the drafter"),
    (re.compile(r"KV cache size|Explicitly set .* for KV cache"), "allocating the KV cache, warming up"),
    (re.compile(r"init engine \(profile, create kv cache, warmup model\) took"), "engine core up"),
    (re.compile(r"Starting vLLM (API|HTTP) server|Application startup complete"), "API server up, waiting for /health"),
]
_STARTED = re.compile(r"\[kit\.engine\.child\] engine started in ([\d.]+) s")
_JOB = re.compile(r"\[kit\.engine\.child\] job (\w+)")
_GENERATED = re.compile(r"\[kit\.engine\.child\] generated (\d+)/(\d+) prompts")
_JOB_PHASE = {"generate": "generating", "inspect": "reading each worker's placement", "rpc": "calling every worker"}


def set_quiet(quiet: bool | None) -> None:
    """The default for every :class:`Status` in this process (``None``: ``KIT_QUIET`` decides)."""
    global _quiet_default
    _quiet_default = quiet


def is_quiet(quiet: bool | None = None) -> bool:
    if quiet is not None:
        return quiet
    if _quiet_default is not None:
        return _quiet_default
    return os.environ.get(ENV_QUIET, "").strip().lower() in ("1", "true", "yes", "on")


class LogFollower:
    """Reads the lines appended to a log file since the last call."""

    def __init__(self, path: Path | None):
        self.path = Path(path) if path else None
        self.pos = 0
        self.rest = b""

    def new_lines(self) -> list[str]:
        if self.path is None or not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            data = f.read()
        self.pos += len(data)
        data = self.rest + data
        *lines, self.rest = re.split(rb"[\r\n]", data)
        return [_ANSI.sub("", ln.decode(errors="replace")) for ln in lines]


def _in_jupyter_kernel() -> bool:
    """Running under ipykernel (JupyterLab, papermill): its output streams say ``isatty()`` False but show
    ``\\r`` and widgets."""
    return "ipykernel.zmqshell" in sys.modules or "IPython.utils._process_emscripten" in sys.modules


def display_kind(stream) -> str:
    """How a status line is shown on ``stream``: ``"jupyter"`` (tqdm.auto: a widget, or ``\\r`` text where
    ipywidgets is missing), ``"redraw"`` (a terminal: tqdm's ``\\r`` line) or ``"lines"`` (plain lines)."""
    if _in_jupyter_kernel():
        return "jupyter"
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        tty = False
    return "redraw" if tty else "lines"


class Status:
    """The status line of one engine or server. Call :meth:`poll` from the wait loop, :meth:`close` at the end.

    ``text`` (the current line without the bar) and ``ready_seconds`` are kept for callers and tests.
    ``stream`` (default ``sys.stderr`` at construction) and ``clock`` (default :func:`time.monotonic`) are there
    for tests.
    """

    def __init__(self, label: str, log_path: Path | None = None, quiet: bool | None = None,
                 first_phase: str = "starting (importing vLLM)", stream=None, clock=None):
        self.label = label
        self.clock = clock or time.monotonic
        self.t0 = self.clock()
        self.follower = LogFollower(log_path)
        self.phase = first_phase
        self._rank = -1
        self.ready_seconds: float | None = None
        self.generated: tuple[int, int] | None = None
        self.text = ""
        self.bar = None
        self.stream = None  # "lines" mode: the stream written to
        self._said: tuple | None = None  # "lines" mode: the milestone of the last line written
        self._said_at = 0.0
        if not is_quiet(quiet):
            stream = sys.stderr if stream is None else stream
            kind = display_kind(stream)
            if kind == "lines":
                self.stream = stream
            else:
                if kind == "jupyter":
                    from tqdm.auto import tqdm
                else:
                    from tqdm import tqdm
                self.bar = tqdm(total=None, bar_format="{desc}", file=stream, leave=True, dynamic_ncols=True,
                                mininterval=0.5)
        self._draw()

    @property
    def elapsed(self) -> float:
        return self.clock() - self.t0

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self._draw()

    def ready(self, seconds: float | None = None) -> None:
        """The engine or server answers now (``seconds`` after its start, measured here if not given)."""
        self.ready_seconds = self.elapsed if seconds is None else seconds
        self.phase = "up"
        self._rank = len(_STARTUP)
        self._draw()

    def feed(self, line: str) -> None:
        """Advance the phase from one log line."""
        m = _GENERATED.search(line)
        if m:
            self.generated = (int(m.group(1)), int(m.group(2)))
            self.phase = f"generating {self.generated[0]}/{self.generated[1]} prompts"
            return
        m = _STARTED.search(line)
        if m:
            self.ready(float(m.group(1)))
            return
        m = _JOB.search(line)
        if m:
            self.phase = _JOB_PHASE.get(m.group(1), m.group(1))
            return
        for rank, (pat, phase) in enumerate(_STARTUP):
            if rank > self._rank and pat.search(line):
                self._rank, self.phase = rank, phase

    def poll(self) -> None:
        """Read the log's new lines and redraw (elapsed seconds move even when no line came)."""
        for line in self.follower.new_lines():
            self.feed(line)
        self._draw()

    def _line(self, final: str | None = None) -> str:
        parts = [self.label + ":"]
        if self.ready_seconds is not None:
            parts.append(f"ready in {self.ready_seconds:.0f} s ·")
        parts.append(f"{final} after {self.elapsed:.0f} s" if final else f"{self.phase} · {self.elapsed:.0f} s")
        return " ".join(parts)

    def _milestone(self, final: str | None) -> tuple:
        """What a plain line reports: a new value is worth a line (the elapsed seconds alone are not)."""
        if final:
            return ("final", final)
        if self.generated and self.phase.startswith("generating "):
            done, total = self.generated
            return ("generating", 4 * done // total if total > 0 else 4)  # quarters: 0..4
        return ("phase", self.phase, self.ready_seconds is not None)

    def _draw(self, final: str | None = None) -> None:
        self.text = self._line(final)
        if self.bar is not None:
            self.bar.set_description_str(self.text, refresh=False)
            self.bar.refresh()
        elif self.stream is not None:
            milestone = self._milestone(final)
            now = self.clock()
            if milestone != self._said or now - self._said_at >= REPEAT_SECONDS:
                self._said, self._said_at = milestone, now
                self.stream.write(self.text + "\n")
                self.stream.flush()

    def close(self, final: str | None = None, failed: bool = False) -> None:
        """Last redraw (``final`` replaces the phase, e.g. "done"), then leave the line on screen."""
        if self.follower.path is not None:
            for line in self.follower.new_lines():
                self.feed(line)
        self._draw(final or ("failed" if failed else "done"))
        if self.bar is not None:
            widget = hasattr(self.bar, "container")  # tqdm.notebook
            if failed and widget:
                self.bar.disp(bar_style="danger")
            self.bar.close()
            self.bar = None
            if widget:
                # A saved notebook keeps no widget state: leave the final line as text in the cell's output.
                print(self.text, flush=True)
        self.stream = None

    def __enter__(self) -> "Status":
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.close(failed=exc_type is not None)


def generation_bar(*args, **kwargs):
    """A tqdm for ``LLM.generate(use_tqdm=...)`` in the runner: each finished prompt prints a
    :data:`RUNNER_GENERATED` line to stdout (the engine log) for :class:`Status` to follow.

    vLLM also wraps its prompt rendering in the same callable (with the prompts as iterable): that bar
    stays silent.
    """
    from tqdm import tqdm

    lines = not args  # the bar of finished requests gets only ``total=``

    class _LogLines(tqdm):
        def __init__(self, *a, **kw):
            kw.update(file=io.StringIO(), mininterval=0)
            super().__init__(*a, **kw)
            if lines:
                print(RUNNER_GENERATED.format(done=0, total=self.total), flush=True)

        def update(self, n=1):
            r = super().update(n)
            if lines:
                print(RUNNER_GENERATED.format(done=self.n, total=self.total), flush=True)
            return r

    return _LogLines(*args, **kwargs)
