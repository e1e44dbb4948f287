"""JupyterLab where its users meet it: started as ``./run.sh --lab`` starts it, driven from headless Chromium.

The test opens notebook 05 (a copy, beside a copy of the committed measurements it reads), runs its cells from the
top up to and including "Slide it" (they read ``docs/results/bench.json`` and start no engine), moves the
acceptance slider with the keyboard and checks that the bars under the sliders were redrawn for the new value.
JupyterLab gets its own home, runtime, config, data and settings folders inside one temp folder, removed
afterwards; the test fails if a process it started outlives it or Chromium leaves an entry in ``/dev/shm``.

It needs Debian's ``chromium`` (``scripts/setup.sh`` installs it where it runs as root) and the ``playwright``
package of the ``test`` extra, which drives that browser; Playwright's own browser download is never used.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest
from conftest import ROOT

NOTEBOOK = "05_does_it_pay"
SLIDER_CELL = "payoff_plots.slider("  # the "Slide it" cell: the last one this test runs
# What the notebook's cells up to the slider read (its MEASURED_JSON, RUNS and TRACE parameters and the runs file
# beside the trace); test_measured_files_are_the_notebooks checks the list against the notebook.
MEASURED_FILES = ("bench.json", "bench-runs-grid.jsonl", "timeline-trace.jsonl.gz", "timeline-runs.jsonl")
ENGINE_CALLS = ("Topology(", "measure_batches(", "engine.run(", "PDPair(")  # none may run before it
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHM = Path("/dev/shm")
ERROR_OUTPUT = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"  # tracebacks too
BROWSER_ENTRY = re.compile(r"chrom|playwright", re.I)  # names Chromium and Playwright give their temp entries


def test_measured_files_are_the_notebooks():
    """Every ../docs/results/ file notebook 05 names is copied beside it (and each exists)."""
    text = (ROOT / "notebooks" / f"{NOTEBOOK}.py").read_text()
    named = set(re.findall(r"\.\./docs/results/([\w.-]+)", text))
    assert named <= set(MEASURED_FILES), f"copy these too: {sorted(named - set(MEASURED_FILES))}"
    assert all((ROOT / "docs" / "results" / n).is_file() for n in MEASURED_FILES)


def _missing() -> str | None:
    """What the test cannot run without, in words, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package playwright (the test extra: pip install -e '.[test]')"
    if not Path(CHROMIUM).is_file():
        return "Debian's chromium (none on PATH: apt-get install chromium, or scripts/setup.sh run as root)"
    return None


def _require_browser() -> None:
    """Under CI a missing browser fails the run in one line (a skipped test proves nothing); elsewhere it skips."""
    missing = _missing()
    if missing is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the browser test needs {missing}", pytrace=False)
    pytest.skip(f"needs {missing}")


def _cells_to_run() -> int:
    """Index of the notebook's slider cell; every cell up to it is engine-free."""
    cells = json.loads((ROOT / "notebooks" / f"{NOTEBOOK}.ipynb").read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells]
    last = next(i for i, (c, s) in enumerate(zip(cells, sources)) if c["cell_type"] == "code" and SLIDER_CELL in s)
    starts = [i for i, (c, s) in enumerate(zip(cells[:last], sources)) if c["cell_type"] == "code"
              and any(call in s for call in ENGINE_CALLS)]
    assert not starts, f"cells {starts} of {NOTEBOOK} start an engine before its slider cell {last}"
    return last


def _lab_command(notebook_dir: Path) -> list[str]:
    """``./run.sh --lab``'s JupyterLab command, read from run.sh, on ``notebook_dir`` instead of reports/."""
    text = (ROOT / "run.sh").read_text()
    m = re.search(r"exec \.venv/bin/jupyter (lab\b[^;\n]*)", text)
    assert m, "run.sh no longer starts JupyterLab with `exec .venv/bin/jupyter lab ...`: update tests/test_browser.py"
    # Shell expansions (run.sh's root-only flag) are left out: the test adds --allow-root itself as root.
    args = [f"--notebook-dir={notebook_dir}" if a.startswith("--notebook-dir=") else a
            for a in shlex.split(m.group(1)) if not a.startswith("$")]
    # The test's additions: no desktop browser to open (the test brings its own) and a port the OS picks (the
    # runtime file names it), so a JupyterLab already on 8888 is left alone.
    args += ["--no-browser", "--port=0"]
    if os.geteuid() == 0 and "--allow-root" not in args:
        args.append("--allow-root")  # JupyterLab refuses root without it; CI runs as root
    return [str(Path(sys.executable).with_name("jupyter")), *args]


def _private_env(base: Path) -> dict[str, str]:
    """An environment whose home, temp and Jupyter folders all lie under ``base``: nothing is written elsewhere."""
    env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_TOKEN", "JUPYTER_PORT")}
    dirs = {"HOME": "home", "TMPDIR": "tmp", "IPYTHONDIR": "ipython", "JUPYTER_CONFIG_DIR": "config",
            "JUPYTER_DATA_DIR": "data", "JUPYTER_RUNTIME_DIR": "runtime", "JUPYTERLAB_SETTINGS_DIR": "settings",
            "JUPYTERLAB_WORKSPACES_DIR": "workspaces"}
    for var, name in dirs.items():
        (base / name).mkdir()
        env[var] = str(base / name)
    return env


def _wait_for_server(proc: subprocess.Popen, runtime: Path, log: Path, timeout: float = 90) -> dict:
    """The runtime file JupyterLab writes once it listens (url, port, token)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(runtime.glob("jpserver-*.json"))
        if found:
            return json.loads(found[0].read_text())
        if proc.poll() is not None:
            break
        time.sleep(0.25)
    pytest.fail(f"JupyterLab did not start (exit code {proc.poll()}):\n{log.read_text()[-3000:]}", pytrace=False)


def _stop_server(proc: subprocess.Popen, info: dict | None) -> None:
    """Shut JupyterLab down through its API (kernels first), or kill it if that does not end it."""
    if info is not None and proc.poll() is None:
        try:
            httpx.post(f"{info['url']}api/shutdown", headers={"Authorization": f"token {info['token']}"}, timeout=10)
        except httpx.HTTPError:
            pass
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _figure(plot) -> dict:
    """Title and bar heights of a rendered plotly figure (the graph div keeps the figure it drew)."""
    return plot.evaluate("g => ({title: (g.layout.title && (g.layout.title.text ?? g.layout.title)) || '',"
                         " y: Array.from(g.data[0].y)})")


def _errors(page) -> list[str]:
    """Tracebacks shown in the notebook's outputs."""
    return [t[-1500:] for t in page.locator(ERROR_OUTPUT).all_inner_texts() if "Traceback" in t]


def _drive(page, url: str, last: int) -> tuple[dict, dict, str, str]:
    """Open the notebook, run cells 0..last, move the acceptance slider one step right.

    Returns the bars figure at the starting value (the plain output), the one redrawn under the sliders, and the
    slider's readout before and after the move."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(url, wait_until="domcontentloaded", timeout=60_000)
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
    # JupyterLab drops a cell run before the kernel is up: wait for the status bar's "Python 3 (ipykernel) | Idle"
    # (it reads "No Kernel | Initializing", then "... | Connecting" and "... | Unknown", before that).
    page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\(ipykernel\) \| Idle")).wait_for(timeout=60_000)
    cells = page.locator(".jp-Notebook .jp-Cell")
    cells.first.locator(".jp-InputPrompt").click()  # selects the cell; its text holds links a click would follow
    for i in range(last + 1):
        # Shift+Enter runs the selected cell and selects the next, as a user would; the next press waits for that.
        cells.nth(i).locator("xpath=self::*[contains(@class, 'jp-mod-active')]").wait_for(timeout=10_000)
        page.keyboard.press("Shift+Enter")
    cell = cells.nth(last)
    handle = cell.locator(".widget-slider .noUi-handle").first
    try:
        # The sliders appear only when every cell before them ran; an error stops the run, so stop waiting too.
        handle.or_(page.locator(ERROR_OUTPUT).filter(has_text="Traceback")).first.wait_for(timeout=90_000)
        assert _errors(page) == [], f"cells 0..{last} of {NOTEBOOK} failed: {_errors(page)}"
        cell.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
    except PlaywrightTimeout:
        pytest.fail(f"cells 0..{last} of {NOTEBOOK} did not show the sliders", pytrace=False)
    assert cell.locator(".widget-output .js-plotly-plot").count() == 0, "bars under the sliders before any move"
    start = _figure(cell.locator(".js-plotly-plot").first)
    readout = cell.locator(".widget-readout").first
    before = readout.inner_text()
    handle.press("ArrowRight")
    redrawn = cell.locator(".widget-output .js-plotly-plot")
    try:
        redrawn.wait_for(timeout=30_000)
    except PlaywrightTimeout:
        pytest.fail(f"no figure under the sliders after a move; errors: {_errors(page)}", pytrace=False)
    return start, _figure(redrawn), before, readout.inner_text()


def _started_by_test(known: set[int]) -> list[psutil.Process]:
    """This process's descendants that were not there before the test."""
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in known]


def _listeners(procs: list[psutil.Process]) -> list[tuple[str, str]]:
    """(address, process name) of every listening TCP socket of ``procs``."""
    found = []
    for p in procs:
        try:
            found += [(c.laddr.ip, p.name()) for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            pass  # ended meanwhile: it listens on nothing
    return found


def _reap(procs: list[psutil.Process]) -> list[str]:
    """Wait for ``procs`` to end; kill and name those still alive."""
    _, alive = psutil.wait_procs(procs, timeout=15)
    names = []
    for p in alive:
        try:
            names.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            p.kill()
        except psutil.Error:
            pass
    return names


def _browser_entries(folder: Path) -> set[str]:
    """Entries of ``folder`` named as Chromium and Playwright name theirs."""
    try:
        return {e for e in os.listdir(folder) if BROWSER_ENTRY.search(e)}
    except OSError:
        return set()


def test_jupyterlab_runs_a_notebook_and_a_slider_redraws_its_figure(monkeypatch):
    _require_browser()
    from playwright.sync_api import sync_playwright

    last = _cells_to_run()
    known = {p.pid for p in psutil.Process().children(recursive=True)}
    shm_before, tmp_before = _browser_entries(SHM), _browser_entries(Path(tempfile.gettempdir()))
    base = Path(tempfile.mkdtemp(prefix="kit-browser-"))
    started: list[psutil.Process] = []
    proc, info, result, listening = None, None, None, []
    try:
        env = _private_env(base)
        # The notebook reads the committed measurements under ../docs/results/ (MEASURED_FILES): the copy keeps that
        # layout, and the repository's notebook stays untouched whatever JupyterLab saves.
        (base / "notebooks").mkdir()
        (base / "docs" / "results").mkdir(parents=True)
        shutil.copy(ROOT / "notebooks" / f"{NOTEBOOK}.ipynb", base / "notebooks")
        for name in MEASURED_FILES:
            shutil.copy(ROOT / "docs" / "results" / name, base / "docs" / "results")
        log = base / "jupyterlab.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(_lab_command(base / "notebooks"), cwd=ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        info = _wait_for_server(proc, base / "runtime", log)
        url = f"http://127.0.0.1:{info['port']}/"
        # Closed by default: no answer without the token JupyterLab made up itself.
        auth = {"Authorization": f"token {info['token']}"}
        answers = tuple(httpx.get(f"{url}api/contents", headers=h, timeout=10).status_code for h in ({}, auth))
        # The Playwright driver (and the profile it makes for Chromium) takes its temp folder from TMPDIR.
        monkeypatch.setenv("TMPDIR", env["TMPDIR"])
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, env=env)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                result = _drive(page, f"{url}lab/tree/{NOTEBOOK}.ipynb?token={info['token']}", last)
                listening = _listeners(_started_by_test(known))  # JupyterLab, its kernel and Chromium, all up
            finally:
                started += _started_by_test(known)
                browser.close()
    finally:
        try:
            started += _started_by_test(known)
            if proc is not None:
                _stop_server(proc, info)
            left = _reap(started)
        finally:
            shutil.rmtree(base, ignore_errors=True)

    assert answers == (403, 200), f"JupyterLab's answers without and with its token: {answers}"
    assert listening and all(ipaddress.ip_address(ip).is_loopback for ip, _ in listening), listening
    start, moved, before, after = result
    assert after != before, f"the slider's readout did not move from {before}"
    assert f"a = {before}" in start["title"] and f"a = {after}" in moved["title"], (start["title"], moved["title"])
    # A higher acceptance rate predicts a higher speed-up for every measured group: every bar grew.
    assert len(moved["y"]) == len(start["y"]) > 0 and all(b > a for a, b in zip(start["y"], moved["y"])), (start, moved)
    assert left == [], f"processes left running: {left}"
    assert not base.exists(), f"{base} left behind"
    assert _browser_entries(SHM) - shm_before == set(), "Chromium left entries in /dev/shm"
    assert _browser_entries(Path(tempfile.gettempdir())) - tmp_before == set(), "browser entries left in the temp dir"
