"""test.sh turns pytest's "no tests collected" (exit 5) into success only for a -m selection of known markers, and
keeps pytest's JUnit XML report of each run (KIT_JUNIT_DIR, default runs/junit/) for `kit test-report`."""
import os
import subprocess
import sys

import pytest
from conftest import ROOT


def run_test_sh(*args, junit_dir=None):
    env = {**os.environ, "KIT_TEST_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    if junit_dir is not None:
        env["KIT_JUNIT_DIR"] = str(junit_dir)
    else:
        args = (*args, "-p", "no:junitxml")  # no report of these runs in runs/junit/
    return subprocess.run(["bash", str(ROOT / "test.sh"), "tests/test_progress.py", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, rc, said", [
    (["-m", "pd"], 0, "not a failure"),                   # a known marker, none of these tests carry it
    (["-m", "engine and not engine"], 0, "not a failure"),
    (["-mpd or reliability"], 0, "not a failure"),
    (["-m", "enigne"], 5, "unknown marker 'enigne'"),      # misspelt: must not pass
    (["-m", "not slow and pdd"], 5, "unknown marker 'pdd'"),
    (["-k", "no_such_test_name"], 5, "collected no tests"),  # no -m: nothing to excuse it
])
def test_no_tests_collected_is_success_only_for_known_markers(args, rc, said):
    p = run_test_sh(*args)
    assert p.returncode == rc, (p.stdout[-2000:], p.stderr[-2000:])
    assert said in p.stdout + p.stderr


def test_a_normal_run_keeps_pytests_exit_code():
    assert run_test_sh("-q").returncode == 0
    assert run_test_sh("-q", "-k", "no_such_test_name or test_").returncode == 0


def test_a_run_leaves_its_junit_report_with_the_command_and_machine(tmp_path):
    from kit.lab import test_report

    p = run_test_sh("-q", "-k", "not slow", junit_dir=tmp_path / "junit")
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    (xml,) = (tmp_path / "junit").glob("*.xml")
    rep = test_report.read_report(xml)
    assert rep.props["command"] == "./test.sh tests/test_progress.py -p no:cacheprovider -q -k not\\ slow"
    assert rep.props["selection"].startswith("-m '(not slow and not pd and not reliability) or ci' -k 'not slow' ")
    assert rep.props["machine"] and rep.props["versions"].startswith("vLLM ")
    assert rep.cases and all(c.file == "tests/test_progress.py" for c in rep.cases)
    assert rep.counts()["passed"] == len(rep.cases)
