"""kit.engine.progress: phases read from vLLM 0.32 log lines, the runner's generation lines, and quiet. No engine."""
import contextlib
import io
import sys
import types

from kit.engine import progress
from kit.engine.progress import Status

# Lines as a vLLM 0.32 (CPU) engine log has them (colour escapes included, as under a Jupyter kernel).
LOG = """\
Triton is installed, but doesn't include CPU backend. Disabling Triton.
(MainProcess pid=7497) INFO 12-02 00:48:46 [api_utils.py:286] non-default args: {'dtype': 'float32'}
(EngineCore pid=7889) INFO 12-02 00:49:24 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: x
(Worker pid=7991) INFO 12-02 00:49:34 [parallel_state.py:1906] world_size=2 rank=0 local_rank=0 distributed_init_method=file:///tmp/x backend=gloo
(Worker_PP0 pid=7991) INFO 12-02 00:49:35 [cpu_model_runner.py:68] Starting to load model /m...
(Worker_PP0 pid=7991) INFO 12-02 00:49:35 [default_loader.py:501] Loading weights took 0.02 seconds
(Worker_PP0 pid=7991) INFO 12-02 00:49:36 [cpu_model_runner.py:75] Loading drafter model...
(Worker_PP1 pid=7992) INFO 12-02 00:49:37 [cpu_worker.py:260] Explicitly set (1.0/9.34) GiB for KV cache on node 0.
(Worker_PP1 pid=7992) INFO 12-02 00:49:37 [cpu_model_runner.py:68] Starting to load model /m...
\x1b[1;36m(EngineCore pid=7889)\x1b[0;0m INFO 12-02 00:49:42 [core.py:402] init engine (profile, create kv cache, warmup model) took 4.22 s
[kit.engine.child] engine started in 66.7 s
[kit.engine.child] job generate
"""
EXPECTED = ["reading the model config", "starting the engine core", "starting the workers", "loading weights",
            "loading weights", "loading the drafter", "allocating the KV cache, warming up",
            "allocating the KV cache, warming up",  # a late worker's "Starting to load" does not go back
            "engine core up", "up", "generating"]


def test_phases_follow_the_log_in_order():
    s = Status("vLLM engine [x]", quiet=True)
    assert s.phase.startswith("starting")
    seen = []
    for line in LOG.splitlines()[1:]:
        s.feed(line)
        seen.append(s.phase)
    assert seen == EXPECTED
    assert s.ready_seconds == 66.7
    s.feed("[kit.engine.child] generated 3/8 prompts")
    assert s.phase == "generating 3/8 prompts" and s.generated == (3, 8)
    s.close()
    assert s.text.startswith("vLLM engine [x]: ready in 67 s · done after ")


def test_status_follows_a_growing_log_file(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("")
    s = Status("e", log, quiet=True)
    lines = LOG.splitlines(keepends=True)
    with open(log, "a") as f:
        f.write("".join(lines[:5]) + lines[5][:20])  # a half-written line is kept for the next read
        f.flush()
        s.poll()
        assert s.phase == "loading weights"
        f.write(lines[5][20:] + "".join(lines[6:]))
    s.poll()
    assert s.phase == "generating" and s.ready_seconds == 66.7


def test_the_line_is_drawn_on_stderr_unless_quiet(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", err)
    monkeypatch.delenv(progress.ENV_QUIET, raising=False)
    s = Status("vLLM engine [PP=2 mtp:1]")
    s.feed("[kit.engine.child] engine started in 12.0 s")
    s.poll()
    s.close()
    assert "vLLM engine [PP=2 mtp:1]: ready in 12 s · done after 0 s" in err.getvalue()

    err.truncate(0)
    monkeypatch.setenv(progress.ENV_QUIET, "1")
    Status("quiet one").close()
    progress.set_quiet(True)
    monkeypatch.delenv(progress.ENV_QUIET)
    try:
        Status("quiet two").close()
    finally:
        progress.set_quiet(None)
    assert err.getvalue().strip("\x00") == ""
    assert progress.is_quiet() is False and progress.is_quiet(True) is True


def test_generation_bar_prints_what_status_reads():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bar = progress.generation_bar(total=3, desc="Processed prompts")
        bar.update(1)
        bar.update(2)
        assert bar.format_dict["elapsed"] >= 0  # vLLM divides by it
        bar.close()
        assert list(progress.generation_bar(["a", "b"], desc="Rendering prompts")) == ["a", "b"]  # silent
    lines = out.getvalue().splitlines()
    assert lines == ["[kit.engine.child] generated 0/3 prompts", "[kit.engine.child] generated 1/3 prompts",
                     "[kit.engine.child] generated 3/3 prompts"]
    s = Status("e", quiet=True)
    for line in lines:
        s.feed(line)
    assert s.phase == "generating 3/3 prompts"


class _Clock:
    """A clock the test moves by hand (no real time is read)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _run_through_a_start(stream, clock, polls_per_line=20, total=8):
    """Feed the engine log and the runner's generation lines, polling every 0.5 s as the launch loop does."""
    s = Status("vLLM engine [PP=2 mtp:1]", stream=stream, clock=clock)
    lines = LOG.splitlines()[1:] + [f"[kit.engine.child] generated {k}/{total} prompts" for k in range(total + 1)]
    for line in lines:
        s.feed(line)
        for _ in range(polls_per_line):
            clock.now += 0.5
            s.poll()
    s.close()
    return s


def test_without_a_terminal_one_plain_line_per_phase_and_no_carriage_return(monkeypatch):
    monkeypatch.delenv(progress.ENV_QUIET, raising=False)
    assert progress.display_kind(io.StringIO()) == "lines"
    out, clock = io.StringIO(), _Clock()
    _run_through_a_start(out, clock, polls_per_line=20)  # 10 s per log line: below the repeat interval
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    phases = [ln.split(": ", 1)[1].rsplit(" · ", 1)[0] for ln in lines[:-1]]
    # One line per phase change (the first phase included), one per quarter of the prompts, the final line.
    assert phases == ["starting (importing vLLM)", "reading the model config", "starting the engine core",
                      "starting the workers", "loading weights", "loading the drafter",
                      "allocating the KV cache, warming up", "engine core up", "ready in 67 s · up",
                      "ready in 67 s · generating", "ready in 67 s · generating 0/8 prompts",
                      "ready in 67 s · generating 2/8 prompts", "ready in 67 s · generating 4/8 prompts",
                      "ready in 67 s · generating 6/8 prompts", "ready in 67 s · generating 8/8 prompts"]
    assert lines[-1].startswith("vLLM engine [PP=2 mtp:1]: ready in 67 s · done after ")
    assert len(text) < 2000 and max(map(len, lines)) < 100


def test_without_a_terminal_a_long_phase_repeats_its_line_once_a_minute():
    out, clock = io.StringIO(), _Clock()
    s = Status("e", stream=out, clock=clock)
    s.feed("x Starting to load model /m")
    for _ in range(600):  # 10 minutes of polls every second in one phase
        clock.now += 1.0
        s.poll()
    s.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "e: starting (importing vLLM) · 0 s"
    assert lines[1:-1] == [f"e: loading weights · {60 * i + 1} s" for i in range(10)]
    assert lines[-1] == "e: done after 600 s"


def test_on_a_terminal_the_line_is_redrawn_in_place(monkeypatch):
    monkeypatch.delenv(progress.ENV_QUIET, raising=False)
    tty = _Terminal()
    assert progress.display_kind(tty) == "redraw"
    _run_through_a_start(tty, _Clock(), polls_per_line=1)
    text = tty.getvalue()
    assert text.count("\r") > 10  # tqdm's in-place frames
    assert text.rstrip().endswith("done after 10 s") and "generating 8/8 prompts" in text


def test_a_jupyter_kernel_keeps_tqdm_auto(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", types.ModuleType("ipykernel.zmqshell"))
    assert progress.display_kind(io.StringIO()) == "jupyter"  # ipykernel's streams are no TTY, yet show widgets
