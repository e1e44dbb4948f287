"""The CLI refuses bad input with one line and exit 2 (that nothing starts first is checked in-process, with process
creation blocked, by tests/test_bad_input.py)."""
import subprocess
import sys

import pytest
from conftest import MODEL, ROOT


def kit(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "kit", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, fragment", [
    (["--pp", "0"], "pp must be"),
    (["--pp", "64"], "larger than the model"),
    (["--spec", "lookahead:2"], "unknown speculative method"),
    (["--spec", "mtp:0"], "k must be"),
    (["--model", "nope"], "unknown model"),
    (["--prompts", "/nonexistent/prompts.jsonl"], "does not exist"),
    (["--max-tokens", "0"], "max-tokens must be"),
    (["--max-tokens", "100000"], "exceeds the model length"),
])
def test_compare_refuses_bad_input_fast(args, fragment):
    p = kit("compare", "--model", MODEL, "--random", *args)
    assert p.returncode == 2, p.stderr
    assert fragment in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_bad_prompt_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n{"text": "wrong key"}\n')
    p = kit("compare", "--model", MODEL, "--random", "--prompts", str(f))
    assert p.returncode == 2 and "p.jsonl:2" in p.stderr


def test_doctor_reports_versions_and_patches():
    import json

    p = kit("doctor", "--json", timeout=180)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout.strip().splitlines()[-1])
    assert info["vllm"] == "0.32.0"
    names = {x["name"]: x for x in info["patches"]}
    assert names["pp_spec_schedule_gate"]["status"] == "applied"
    assert names["draft_pp_gate"]["status"].startswith("upstream")
    assert "kit.patches:load_plugin" in info["plugin_entry_points"]
    # the runner this device uses by default, and which patches belong to which runner
    assert info["runner"]["device"] == info["device"] == "cpu" and info["runner"]["default"] == "v1"
    by = info["patches_by_runner"]
    assert set(by) == {"v1", "v2", "any"}
    assert "pp_spec_token_history" in by["v1"] and "tcp_store_bind_host" in by["any"]
    assert names["pp_spec_token_history"]["runner"] == "v1"


def test_doctor_runner_follows_the_environment(monkeypatch):
    from kit import patches
    from kit.cli.doctor import runner_info

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    r = runner_info("cpu")
    assert (r["default"], r["VLLM_USE_V2_MODEL_RUNNER"]) == ("v1", None) and "Triton" in r["why"]
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert runner_info("cpu")["default"] == "v1"
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    r = runner_info("cpu")
    assert r["default"] == "v2" and "which vLLM refuses here" in r["why"]   # the CPU build has no Triton
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "yes")
    assert runner_info("cpu")["default"] is None
    # every registered patch is listed once, under its own runner; teaching-only ones are left out
    by = patches.by_runner()
    listed = [n for names in by.values() for n in names]
    assert len(listed) == len(set(listed))
    for name in patches.INDEX:
        p = patches._load(name)
        assert (name in by[p.runner.value]) == (not p.teaching_only)


def test_runner_flag_reaches_compare_and_bench():
    from kit.cli.main import build_parser

    parser = build_parser()
    for cmd in ("compare", "bench"):
        assert parser.parse_args([cmd]).runner == "auto"
        assert parser.parse_args([cmd, "--runner", "v1"]).runner == "v1"


def test_bench_pd_cases_parse_and_bad_input_exits_2(capsys, tmp_path):
    from kit.bench.measure import parse_pd_cases
    from kit.cli import main

    assert parse_pd_cases("1:none>1:none, 2:mtp:2>1:mtp:2") == [(1, None, 1, None), (2, "mtp:2", 1, "mtp:2")]
    assert parse_pd_cases("") == []
    with pytest.raises(ValueError, match="PP:SPEC>PP:SPEC"):
        parse_pd_cases("1:none")
    assert main(["bench", "--pd", "2-1", "--only-extras", "--force"]) == 2
    assert "PP:SPEC>PP:SPEC" in capsys.readouterr().err
    assert main(["bench", "--env", "NOVALUE", "--only-extras", "--force"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    # --prompts is a file in every subcommand; the count of prompts is --limit.
    assert main(["bench", "--prompts", str(tmp_path / "none.jsonl"), "--only-extras", "--force"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["bench", "--pp", "1,x", "--force"]) == 2
    assert "--pp wants comma-separated integers" in capsys.readouterr().err


# Every subcommand of the one tree, and what its --help must show (its own parser, or the module it hands to).
SUBCOMMANDS = [
    (["doctor"], "--json"), (["compare"], "--spec"), (["pd"], "--producer-pp"), (["bench"], "--patch-overhead"),
    (["matrix"], "--fast"), (["report"], "--only"), (["train", "tiny-mimo"], "--quick"),
    (["train", "tiny-deepseek"], "--no-q-rope"), (["zoo"], "--no-tokenizer"), (["zoo-status"], "--write"),
    (["patches", "check"], "--vllm-src"),
]


@pytest.mark.parametrize("cmd, flag", SUBCOMMANDS, ids=[" ".join(c) for c, _ in SUBCOMMANDS])
def test_every_subcommand_is_reachable_as_kit_and_python_m_kit(cmd, flag):
    import os
    import shutil

    p = kit(*cmd, "--help", timeout=120)
    assert p.returncode == 0 and flag in p.stdout, (p.stdout, p.stderr)
    exe = shutil.which("kit", path=os.path.dirname(sys.executable))
    if exe:  # the console script of the installed package
        q = subprocess.run([exe, *cmd, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert q.returncode == 0 and flag in q.stdout, q.stderr


@pytest.mark.parametrize("args, fragment", [
    (["nosuch"], "invalid choice"),
    (["compare", "--bogus"], "unrecognized arguments: --bogus"),
    (["train"], "required: MODEL"),
    (["pd", "--concurrency", "0"], "--concurrency must be an integer >= 1"),
    (["patches", "check", "--vllm-src", "/nonexistent"], "--vllm-src /nonexistent: no such directory"),
])
def test_every_error_is_one_line_and_exit_2(args, fragment):
    p = kit(*args)
    assert p.returncode == 2 and fragment in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("kit"), p.stderr


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    """KeyboardInterrupt out of a subcommand (its process trees already ended by their teardown): one line on
    stderr and exit 130, not a traceback."""
    from kit import cli
    from kit.checks import compare

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "run", interrupted)
    try:
        rc = cli.main(["compare", "--model", MODEL, "--random"])
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped kit.cli.main")
    assert rc == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kit compare: interrupted (Ctrl-C); the vLLM processes it started are ended"], err


def test_pd_api_key_reaches_both_servers_from_flag_or_environment(monkeypatch, capsys):
    """``kit pd --api-key`` (or ``$KIT_API_KEY``) is handed to the pair (both servers and the routers use it);
    the run itself is replaced here: the key's effect on live servers is tests/test_pd.py's loopback test."""
    import json

    from kit import cli
    from kit.pd import cli as pd_cli

    seen = []

    def fake_compare(*args, **kwargs):
        seen.append(kwargs.get("api_key"))
        return {"identical": True, "handoff_ok": True}

    monkeypatch.setattr(pd_cli, "pd_compare", fake_compare)
    assert cli.main(["pd", "--model", MODEL, "--random", "--api-key", "s3cret", "--json"]) == 0
    monkeypatch.setenv("KIT_API_KEY", "from-env")
    assert cli.main(["pd", "--model", MODEL, "--random", "--json"]) == 0
    monkeypatch.delenv("KIT_API_KEY")
    assert cli.main(["pd", "--model", MODEL, "--random", "--json"]) == 0
    assert seen == ["s3cret", "from-env", None]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["identical"] is True


def test_sigterm_runs_the_commands_teardown(tmp_path):
    """``kill PID`` of a ``kit`` command: Python's default would end it at once, leaving a failed run's folder (kept
    until the command exits) in the kit's cache; the command line turns SIGTERM into an exception, so its
    ``finally`` blocks and exit handlers run."""
    import signal
    import subprocess
    import sys
    import textwrap

    from conftest import ROOT

    folder = tmp_path / "kit-run-failed"
    folder.mkdir()
    script = textwrap.dedent(f"""
        import sys, time; sys.path.insert(0, {str(ROOT)!r})
        from kit.cli.main import Terminated, stop_on_sigterm
        from kit.engine.lifecycle import remove_run_dir
        stop_on_sigterm()
        remove_run_dir({str(folder)!r}, failed=True)  # a failed run: its folder kept until this process exits
        print("ready", flush=True)
        try:
            time.sleep(60)
        except Terminated:
            sys.exit(143)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    assert folder.exists()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 143
    assert not folder.exists()
