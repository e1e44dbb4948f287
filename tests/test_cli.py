"""The CLI refuses bad input with exit 2 in seconds, before any engine starts."""
import subprocess
import sys
import time

import pytest

from conftest import MODEL, ROOT


def kit(*args, timeout=60):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "kit", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


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
    p, secs = kit("compare", "--model", MODEL, "--random", *args)
    assert p.returncode == 2, p.stderr
    assert fragment in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert secs < 20


def test_bad_prompt_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n{"text": "wrong key"}\n')
    p, _ = kit("compare", "--model", MODEL, "--random", "--prompts", str(f))
    assert p.returncode == 2 and "p.jsonl:2" in p.stderr


def test_doctor_reports_versions_and_patches():
    import json

    p, _ = kit("doctor", "--json", timeout=180)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout.strip().splitlines()[-1])
    assert info["vllm"] == "0.32.0"
    names = {x["name"]: x for x in info["patches"]}
    assert names["pp_spec_schedule_gate"]["status"] == "applied"
    assert names["draft_pp_gate"]["status"].startswith("upstream")
    assert "kit.patches:load_plugin" in info["plugin_entry_points"]


def test_bench_pd_cases_parse_and_bad_input_exits_2(capsys):
    from kit.bench import main as bench_main, parse_pd_cases

    assert parse_pd_cases("1:none>1:none, 2:mtp:2>1:mtp:2") == [(1, None, 1, None), (2, "mtp:2", 1, "mtp:2")]
    assert parse_pd_cases("") == []
    with pytest.raises(ValueError, match="PP:SPEC>PP:SPEC"):
        parse_pd_cases("1:none")
    assert bench_main(["--pd", "2-1", "--only-extras", "--force"]) == 2
    assert "PP:SPEC>PP:SPEC" in capsys.readouterr().err
    assert bench_main(["--env", "NOVALUE", "--only-extras", "--force"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
