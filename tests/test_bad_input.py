"""Bad input is refused before any process starts, with a message that says what to do.

The table (kit/cli/bad_input.py, written to docs/bad-input.md) runs every case in this process with process
creation blocked and checks exit 2 (or TopologyError), one line, the expected fragment, no process, nothing
written. Below it, the refusals that need more than one field: device capacity, PD pairs, ports, the
decode-side rule, patch names. Every case must fail in-process, fast, and leave no process behind.
"""
import os
import socket
import subprocess
import sys

import pytest
from conftest import MODEL, ROOT

from kit import engine, pd
from kit.cli import bad_input
from kit.core.topology import Topology, TopologyError


@pytest.fixture(scope="module")
def scratch():
    with bad_input.scratch() as tmp:
        yield tmp


@pytest.mark.parametrize("case", bad_input.CASES, ids=[f"{i + 1}-{c.what}" for i, c in enumerate(bad_input.CASES)])
def test_the_table(case, scratch):
    out = bad_input.run_case(case, scratch)
    assert out.problems(case) == [], (case.command, out)  # includes: no process started, no file written


def test_the_table_has_what_the_docs_promise():
    kinds = {c.text.split()[0] if c.kind == "cli" else "api" for c in bad_input.CASES}
    assert len(bad_input.CASES) >= 30
    assert {"compare", "pd", "bench", "matrix", "report", "train", "zoo", "doctor", "api"} <= kinds


def test_docs_bad_input_md_is_generated_from_the_table():
    have = bad_input.DOC_PATH.read_text() if bad_input.DOC_PATH.exists() else ""
    assert have == bad_input.render(), f"docs/bad-input.md is out of date: run `{bad_input.REGENERATE}`"
    assert "NOT REFUSED AS EXPECTED" not in have


def test_the_harness_sees_a_process_start_and_a_file_written(scratch):
    """Without this the table could pass vacuously: good input must reach the (blocked) process start, having
    written its random checkpoint, and be reported as not refused."""
    import multiprocessing

    with bad_input._no_processes(started := []):
        for start in (lambda: subprocess.run(["true"]), lambda: multiprocessing.get_context("spawn").Process().start(),
                      lambda: multiprocessing.get_context("fork").Process().start(), os.fork):
            with pytest.raises(bad_input._ProcessBlocked):
                start()
    assert len(started) == 4, started
    case = bad_input.cli("good input", "compare --random --limit 1 --max-tokens 2 --timeout 1", "")
    out = bad_input.run_case(case, scratch)
    assert out.started and any(w.startswith("cache/random/") for w in out.written), out
    assert out.raised == "a process start" and out.problems(case)
    api = bad_input.api("good input", 'generate(T, ["Hello"], max_tokens=2)', "")
    out = bad_input.run_case(api, scratch)
    assert out.started and out.problems(api)


REAL = ["compare --random --seed -1", "compare --random --timeout nan", "compare --random --limit 100",
        "pd --random --consumer-pp 2 --connector nixl-push", "train tiny-mimo --steps 0"]


@pytest.mark.parametrize("text", REAL)
def test_a_real_kit_process_prints_the_same_line(text, scratch):
    """The table runs in-process; the command itself, as a user starts it, gives the same line and exit 2."""
    case = next(c for c in bad_input.CASES if c.text == text)
    want = bad_input.run_case(case, scratch).message
    p = subprocess.run([sys.executable, "-m", "kit", *case.text.replace(bad_input.TMP, str(scratch)).split()],
                       cwd=scratch / "cwd", capture_output=True, text=True, timeout=120,
                       env={**os.environ, "KIT_CACHE_DIR": str(scratch / "cache"), "PYTHONPATH": str(ROOT)})
    got = p.stderr.strip().replace(str(scratch), bad_input.TMP).replace(str(ROOT) + "/", "")
    assert (p.returncode, got, p.stdout) == (2, want, "")


def test_a_bad_seed_or_an_interrupted_write_leaves_no_tmp_checkpoint(tmp_path, monkeypatch):
    import safetensors.numpy

    from kit.core.models import random_checkpoint, resolve_model

    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path))
    info = resolve_model(MODEL)
    with pytest.raises(ValueError):
        random_checkpoint(info, seed=-1)
    assert not list(tmp_path.rglob("*.tmp*"))

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.numpy, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        random_checkpoint(info, seed=12345)
    assert not list(tmp_path.rglob("*.tmp*")) and not list(tmp_path.rglob("*seed12345*"))


def _t(**kw) -> Topology:
    return Topology(model=MODEL, random_weights=True, **kw)


def _refused(fn, fragment: str) -> None:
    """Refused before anything starts: process creation is blocked while ``fn`` runs (as in the table)."""
    started: list[str] = []
    with bad_input._no_processes(started), pytest.raises(TopologyError, match=fragment):
        fn()
    assert started == [], started


def test_tp_times_pp_beyond_the_cpu(no_leftovers):
    _refused(lambda: _t(pp=4, tp=4), "exceed what this CPU hosts")


def test_consumer_without_producer(no_leftovers):
    c = _t(pd_role="consumer", connector="nixl")
    _refused(lambda: engine.run(c, [{"kind": "generate", "prompts": ["x"], "max_tokens": 1}]), "needs its producer")
    _refused(lambda: engine.Server(c).start(), "needs its producer")


def test_pd_pair_with_different_models_or_weights(no_leftovers):
    _refused(lambda: pd.PDPair(_t(), Topology(model="tiny-llama-swa", random_weights=True)), "different models")
    _refused(lambda: pd.PDPair(_t(), _t(seed=1)), "differ in seed")
    _refused(lambda: pd.PDPair(_t(), _t(dtype="bfloat16")), "differ in dtype")


def test_pd_consumer_pp_without_a_producer_of_the_same_pp(no_leftovers):
    _refused(lambda: pd.PDPair(_t(pp=1), _t(pp=2)), "needs a producer with the same PP size")


def test_pd_pair_with_different_drafters(no_leftovers):
    _refused(lambda: pd.PDPair(_t(), _t(spec="mtp:2")), "compatibility hash")
    _refused(lambda: pd.PDPair(_t(spec="mtp:1"), _t()), "compatibility hash")


def test_pd_pair_with_an_unknown_connector(no_leftovers):
    _refused(lambda: pd.PDPair(_t(), _t(), connector="tcp"), "connector must be one of")


def test_server_port_in_use(no_leftovers):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        _refused(lambda: engine.Server(_t(), port=port).start(), f"port {port} on 127.0.0.1 is in use")


def test_unknown_patch_name(no_leftovers):
    _refused(lambda: engine.run(_t(pp=2, spec="mtp:1"), [], env={"KIT_PATCHES": "all,-no_such_patch"}),
             "unknown patch 'no_such_patch'")


def test_decode_side_pp_spec_without_the_fix(no_leftovers):
    _refused(lambda: engine.run(_t(pp=2, spec="mtp:1"), [], env={"KIT_PATCHES": "all,-pp_spec_token_history"}),
             "only supported on the prefill side")


def test_pp_groups_out_of_range(no_leftovers):
    _refused(lambda: engine.run(_t(pp=2), [], env={"KIT_PP_GROUPS": "5"}), "KIT_PP_GROUPS='5'")


def test_eagle3_draft_model_missing(no_leftovers):
    _refused(lambda: Topology(model=MODEL, random_weights=True, spec="eagle3:1"), "eagle3 needs a draft model")


def test_a_cache_folder_that_is_a_file_gets_one_line(tmp_path, monkeypatch, capsys):
    """``KIT_CACHE_DIR`` naming a file: one line and exit 2, not a traceback."""
    from kit.cli.main import main

    f = tmp_path / "a-file"
    f.write_text("")
    monkeypatch.setenv("KIT_CACHE_DIR", str(f))
    assert main(["compare", "--random"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a folder the kit can write" in err[0], err
