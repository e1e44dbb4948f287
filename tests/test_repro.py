"""``kit repro``: the upstream reproducers (docs/upstream/*_repro.py) with their patch off and with the kit's patches.

The default selection runs the one that starts no engine (``cpu_rejection_expand``: vLLM's CPU expand kernel
called directly) and the command's bad input; ``-m slow`` runs every reproducer, each of which must show its defect
with its patch off (``KIT_PATCHES=all,-NAME``) and not with the kit's patches.
"""
import subprocess
import sys

import pytest
from conftest import ROOT

from kit.checks import repro


def _kit(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kit", "repro", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_every_reproducer_has_its_report_and_its_patch():
    from kit import patches

    known = patches.registry()
    assert repro.names(), "no reproducer in docs/upstream"
    for n in repro.names():
        assert n in known, f"docs/upstream/{n}_repro.py names no kit patch"
        assert repro.title(n), f"docs/upstream/{n}.md is missing or has no title"
        for other in repro.also_off(n):
            assert other in known and other != n, f"docs/upstream/{n}_repro.py: also off names {other!r}"
    out = _kit("--list")
    assert out.returncode == 0
    assert len([ln for ln in out.stdout.splitlines() if not ln.startswith("  ")]) == len(repro.names())


def test_every_patch_has_a_reproducer_or_says_why_not():
    """Every registered patch: a reproducer, a reason it has none (NO_REPRODUCER), or written down as pending."""
    from kit import patches

    known, have = set(patches.registry()), set(repro.names())
    missing = known - have - set(repro.NO_REPRODUCER) - set(repro.PENDING)
    assert not missing, f"patches with neither a reproducer nor a reason: {sorted(missing)}"
    assert not have & (set(repro.NO_REPRODUCER) | set(repro.PENDING)), "a listed patch has a reproducer now"
    assert set(repro.NO_REPRODUCER) | set(repro.PENDING) <= known
    assert set(repro.NEEDS_HARDWARE) <= have


@pytest.mark.parametrize("args,why", [(("no_such_defect",), "no reproducer no_such_defect"),
                                      ((), "name a reproducer or pass --all")])
def test_bad_input_is_one_line_and_exit_2(args, why):
    out = _kit(*args)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and why in out.stderr, out.stderr


def test_cpu_rejection_expand_shows_off_and_is_gone_on(no_leftovers):
    out = _kit("cpu_rejection_expand", timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "KIT_PATCHES=all,-cpu_rejection_expand: defect shows" in out.stdout
    assert "KIT_PATCHES=all: no defect" in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.skip(reason=f"needs {repro.NEEDS_HARDWARE[n]}"))
                                  if n in repro.NEEDS_HARDWARE else n
                                  for n in repro.names() if n != "cpu_rejection_expand"])
def test_reproducer_shows_off_and_is_gone_on(name, no_leftovers):
    out = _kit(name)
    assert out.returncode == 0, out.stdout + out.stderr
