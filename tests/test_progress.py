"""kit.engine.progress: phases read from vLLM 0.32 log lines, the runner's generation lines, and quiet. No engine."""
import contextlib
import io

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
