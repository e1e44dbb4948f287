"""The bad-input table: what the kit refuses, with which message, before any process starts.

One list, :data:`CASES`, is both the test (``tests/test_bad_input.py`` runs every case and checks: exit 2 and
one line on stderr for a command, a one-line :class:`~kit.core.topology.TopologyError` for the Python API, no
process started, nothing written) and the documentation: ``kit bad-input`` runs the cases and writes
``docs/bad-input.md`` with the message each one actually got; ``--check`` exits 1 when the file differs (a
test compares too).

Cases run in this process: :func:`run_case` blocks every way of starting a process (``fork``, ``fork_exec``,
``posix_spawn``) for the duration, points ``KIT_CACHE_DIR`` and the working directory into a scratch folder,
and compares that folder before and after.
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kit.core.models import REPO_ROOT

DOC_PATH = REPO_ROOT / "docs" / "bad-input.md"
REGENERATE = "kit bad-input"
TMP = "$TMP"  # the scratch folder in commands and messages


@dataclass(frozen=True)
class Case:
    """``kind`` ``cli``: ``text`` is what follows ``kit`` on the command line; ``api``: a Python expression
    (names in :func:`api_namespace`). ``expect``: a fragment the message must contain."""

    kind: str
    what: str
    text: str
    expect: str

    @property
    def command(self) -> str:
        return f"kit {self.text}" if self.kind == "cli" else self.text


# cli(what, text, expect) and api(what, text, expect): a case of each kind.
cli = functools.partial(Case, "cli")
api = functools.partial(Case, "api")


C, P, B = "compare --random", "pd --random", "bench --random --force"
CASES: list[Case] = [
    # kit compare: the model
    cli("model without trained weights, no --random", "compare --model tiny-qwen3_5", "ships no trained weights"),
    cli("unknown model name", "compare --random --model no-such-model", "unknown model 'no-such-model'"),
    cli("model: a directory without config.json", f"compare --random --model {TMP}/dir", "has no config.json"),
    cli("model: config.json not JSON", f"compare --random --model {TMP}/badmodel", "is not valid JSON"),
    cli("--seed negative", f"{C} --seed -1", "argument --seed: expected an integer >= 0"),
    cli("--seed not a number", f"{C} --seed one", "argument --seed"),
    cli("--dtype unknown", f"{C} --dtype int8", "dtype must be one of"),
    # kit compare: the topology
    cli("--pp 0", f"{C} --pp 0", "pp must be an integer >= 1"),
    cli("--pp negative", f"{C} --pp -1", "pp must be an integer >= 1"),
    cli("--pp not a number", f"{C} --pp two", "argument --pp: invalid int value"),
    cli("--pp beyond the layers", f"{C} --pp 64", "larger than the model"),
    cli("--spec unknown method", f"{C} --spec lookahead:2", "unknown speculative method"),
    cli("--spec k = 0", f"{C} --spec mtp:0", "k must be in 1.."),
    cli("--spec k not a number", f"{C} --spec mtp:nan", "is not an integer"),
    cli("--spec without k", f"{C} --spec mtp", "lacks k"),
    cli("--spec mtp on a model without MTP layers", "compare --random --model tiny-llama-swa --spec mtp:1",
        "has no MTP layers"),
    cli("--spec eagle3 without a draft model", f"{C} --spec eagle3:2", "eagle3 needs a draft model"),
    cli("--max-num-seqs 0", f"{C} --max-num-seqs 0", "max_num_seqs must be an integer >= 1"),
    cli("--max-model-len below 16", f"{C} --max-model-len 8", "max_model_len=8 outside"),
    # kit compare: nodes and backend
    cli("--nodes not dividing --pp", f"{C} --pp 2 --nodes 3", "nodes=3 must divide pp=2"),
    cli("--backend unknown", f"{C} --pp 2 --nodes 2 --backend slurm", "backend must be one of"),
    cli("--backend ray on one node", f"{C} --pp 2 --spec mtp:2 --backend ray", "needs nodes >= 2"),
    cli("--backend ray with nodes != pp", f"{C} --pp 4 --nodes 2 --backend ray", "nodes must equal pp*tp (4)"),
    # kit compare: the run
    cli("--max-tokens 0", f"{C} --max-tokens 0", "--max-tokens must be an integer >= 1"),
    cli("--max-tokens negative", f"{C} --max-tokens -5", "--max-tokens must be an integer >= 1"),
    cli("--max-tokens not a number", f"{C} --max-tokens many", "argument --max-tokens: invalid int value"),
    cli("--max-tokens beyond the model length", f"{C} --max-tokens 100000", "exceeds the model length"),
    cli("--timeout 0", f"{C} --timeout 0", "argument --timeout: expected a finite number of seconds > 0"),
    cli("--timeout negative", f"{C} --timeout -1", "argument --timeout"),
    cli("--timeout NaN", f"{C} --timeout nan", "argument --timeout"),
    cli("--timeout infinite", f"{C} --timeout inf", "argument --timeout"),
    cli("--timeout not a number", f"{C} --timeout soon", "argument --timeout"),
    cli("--temperature NaN", f"{C} --temperature nan", "--temperature must be a finite number > 0"),
    cli("--temperature negative", f"{C} --temperature -1", "--temperature must be a finite number > 0"),
    cli("--samples too few", f"{C} --temperature 0.5 --distribution --samples 0", "--samples must be an integer >= 10"),
    cli("--timeline with --temperature", f"{C} --temperature 0.5 --timeline", "--timeline traces greedy runs only"),
    cli("unknown option", f"{C} --bogus", "unrecognized arguments: --bogus"),
    # the prompts file and --limit (every command reads them the same way)
    cli("--limit 0", f"{C} --limit 0", "argument --limit: expected an integer >= 1"),
    cli("--limit negative", f"{C} --limit -1", "argument --limit"),
    cli("--limit not a number", f"{C} --limit all", "argument --limit"),
    cli("--limit beyond the prompt count", f"{C} --limit 100", "is more than the 16 prompts"),
    cli("--prompts missing", f"{C} --prompts {TMP}/missing.jsonl", "does not exist"),
    cli("--prompts empty", f"{C} --prompts {TMP}/empty.jsonl", "holds no prompts"),
    cli("--prompts a directory", f"{C} --prompts {TMP}/dir", "is a directory"),
    cli("--prompts not UTF-8", f"{C} --prompts {TMP}/latin1.jsonl", "is not UTF-8"),
    cli("--prompts a line not JSON", f"{C} --prompts {TMP}/broken.jsonl", "broken.jsonl:2: not JSON"),
    cli("--prompts a line without a prompt", f"{C} --prompts {TMP}/wrongkey.jsonl", 'wrongkey.jsonl:1: expected {"prompt"'),
    cli("--prompts unreadable", f"{C} --prompts /proc/self/mem", "prompt file /proc/self/mem cannot be read"),
    cli("a prompt longer than the model length", f"compare --model tiny-mimo --max-model-len 16 --max-tokens 4 --prompts {TMP}/long.jsonl",
        "longer than the model length 16"),
    # kit pd
    cli("model without trained weights, no --random", "pd --model tiny-qwen3_5", "ships no trained weights"),
    cli("--producer-pp 0", f"{P} --producer-pp 0", "pp must be an integer >= 1"),
    cli("--consumer-pp 2 with a PP=1 producer", f"{P} --consumer-pp 2", "needs a producer with the same PP size"),
    cli("forced --connector does not skip the PP pairing", f"{P} --consumer-pp 2 --connector nixl-push",
        "needs a producer with the same PP size"),
    cli("pull connector for a PP=2 consumer", f"{P} --producer-pp 2 --consumer-pp 2 --connector nixl",
        "runs with the push connector only"),
    cli("--connector unknown", f"{P} --connector tcp", "argument --connector: invalid choice"),
    cli("drafter on one side only", f"{P} --producer-spec mtp:1", "compatibility hash"),
    cli("--concurrency 0", f"{P} --concurrency 0", "--concurrency must be an integer >= 1"),
    cli("--concurrency not a number", f"{P} --concurrency x", "argument --concurrency: invalid int value"),
    cli("--timeout NaN", f"{P} --timeout nan", "argument --timeout"),
    cli("--limit 0", f"{P} --limit 0", "argument --limit"),
    cli("--kv-extra without =", f"{P} --kv-extra lease", "--kv-extra wants KEY=VALUE"),
    cli("vllm-router for a push pair with a PP=2 producer", f"{P} --producer-pp 2 --router vllm-router",
        "drops the producer's pp_size"),
    cli("--router unknown", f"{P} --router nginx", "argument --router: invalid choice"),
    cli("--prompts a directory", f"{P} --prompts {TMP}/dir", "is a directory"),
    cli("--api-key empty", f"{P} --api-key ''", "--api-key must be a non-empty string"),
    cli("--api-key with a space", f"{P} --api-key 'a b'", "--api-key must be a non-empty string"),
    # kit bench
    cli("--pp 0 in the grid", f"{B} --pp 0", "--pp wants integers >= 1"),
    cli("--pp not integers", f"{B} --pp 1,x", "--pp wants comma-separated integers"),
    cli("--spec unknown in the grid", f"{B} --spec none,bogus:1", "unknown speculative method"),
    cli("--pd malformed", f"{B} --pd 2-1", "expected PP:SPEC>PP:SPEC"),
    cli("--pd PP pairing no connector runs", f"{B} --pd '1:none>2:none'", "needs a producer with the same PP size"),
    cli("--pd unknown spec", f"{B} --pd '1:bogus:1>1:none'", "unknown speculative method"),
    cli("--repeats 0", f"{B} --repeats 0", "argument --repeats: expected an integer >= 1"),
    cli("--max-tokens 0", f"{B} --max-tokens 0", "--max-tokens must be an integer >= 1"),
    cli("--limit beyond the prompt count", f"{B} --limit 100", "is more than the 16 prompts"),
    cli("--patch-cost-pp 0", f"{B} --only-extras --patch-cost --patch-cost-pp 0", "--patch-cost-pp wants integers >= 1"),
    cli("--env without =", f"{B} --env NOVALUE", "--env wants KEY=VALUE"),
    cli("--write a directory", f"{B} --write {TMP}/dir", "is a directory"),
    cli("--write into a missing folder", f"{B} --write {TMP}/missing/bench.md", "does not exist"),
    cli("--runner v2 on the CPU build", f"{B} --runner v2", "runner v2 cannot run on device cpu"),
    # --runner (kit compare; kit bench shares the flag)
    cli("--runner unknown", f"{C} --runner v3", "argument --runner: invalid choice: 'v3'"),
    cli("--runner v2 on the CPU build", f"{C} --pp 2 --spec mtp:2 --runner v2", "runner v2 cannot run on device cpu"),
    # the other subcommands
    cli("unknown subcommand", "nosuch", "invalid choice: 'nosuch'"),
    cli("kit doctor: unknown option", "doctor --bogus", "unrecognized arguments: --bogus"),
    cli("kit matrix: --write a directory", f"matrix --write {TMP}/dir", "is a directory"),
    cli("kit matrix: an unknown cell id", "matrix --cells tiny-mimo-pp9", "no cell tiny-mimo-pp9"),
    cli("kit report: --only selects no notebook", f"report --out {TMP}/reports --only no-such-notebook",
        "no notebook name contains it"),
    cli("kit report: --out a file", f"report --out {TMP}/empty.jsonl", "not a directory"),
    cli("kit train: no model", "train", "required: MODEL"),
    cli("kit train: unknown model", "train tiny-llama", "invalid choice: 'tiny-llama'"),
    cli("kit train: --steps 0", "train tiny-mimo --steps 0", "argument --steps: expected an integer >= 1"),
    cli("kit train: --seed negative", "train tiny-deepseek --seed -1", "argument --seed: expected an integer >= 0"),
    cli("kit zoo: unknown family", "zoo --only no-such-family", "argument --only: invalid choice"),
    cli("kit zoo-status: unknown option", "zoo-status --bogus", "unrecognized arguments: --bogus"),
    # the Python API
    api("kv_cache_gib of the wrong type", 'Topology("tiny-mimo", random_weights=True, kv_cache_gib="4")',
        "kv_cache_gib must be a finite number > 0"),
    api("kv_cache_gib NaN", 'Topology("tiny-mimo", random_weights=True, kv_cache_gib=float("nan"))',
        "kv_cache_gib must be a finite number > 0"),
    api("seed negative (no .tmp checkpoint left)", 'Topology("tiny-mimo", random_weights=True, seed=-1)',
        "seed must be an integer >= 0"),
    api("pp as a string", 'Topology("tiny-mimo", random_weights=True, pp="2")', "pp must be an integer"),
    api("runner unknown", 'Topology("tiny-mimo", random_weights=True, runner="V2")', "runner must be one of auto, v1, v2"),
    api("runner v2 on device cpu", 'T.with_(runner="v2")', "runner v2 cannot run on device cpu"),
    api("max_num_seqs not an integer", 'Topology("tiny-mimo", random_weights=True, max_num_seqs=2.5)',
        "max_num_seqs must be an integer"),
    api("extra_engine_args: an unknown vLLM engine argument",
        'Topology("tiny-mimo", random_weights=True, extra_engine_args={"enable_prefix_cache": True})',
        "'enable_prefix_cache' is not a vLLM engine or server argument"),
    api("Server: an empty API key", 'Server(T, api_key="")', "api_key must be a non-empty string"),
    api("Server: a host beyond loopback", 'Server(T, host="0.0.0.0")', "is not a loopback address"),
    api("extra_engine_args: the server's host",
        'Topology("tiny-mimo", random_weights=True, extra_engine_args={"host": "0.0.0.0"})',
        "'host' sets where a server listens"),
    api("kv_cache_gib not whole on device cpu", 'Topology("tiny-mimo", random_weights=True, kv_cache_gib=1.5)',
        "kv_cache_gib must be a whole number of GiB on device cpu"),
    api("a prompt longer than the model length", 'generate(Topology("tiny-mimo", max_model_len=16), ["x " * 40])',
        "longer than the model length 16"),
    api("a string as the prompts list", 'generate(T, "Hello")', "prompts must be a list of strings, got a str"),
    api("an empty prompts list", "generate(T, [])", "prompts is empty"),
    api("a prompt that is not a string", "generate(T, [1, 2])", "prompts[0] must be a non-empty string"),
    api("max_tokens 0", 'generate(T, ["Hello"], max_tokens=0)', "max_tokens must be an integer >= 1"),
    api("timeout NaN", 'generate(T, ["Hello"], timeout=float("nan"))', "timeout must be a finite number"),
    api("timeout 0", 'generate(T, ["Hello"], timeout=0)', "timeout must be a finite number"),
    api("a string as the prompts list (compare)", 'compare(T.with_(pp=2), "Hello")', "prompts must be a list"),
    api("compare: a traced run with stop tokens", 'compare(T.with_(pp=2), ["Hello"], timeline=True, stop_token_ids=[2])',
        "takes no stop tokens"),
    api("a string in a job's prompts", 'run(T, [{"kind": "generate", "prompts": "ab", "max_tokens": 1}])',
        "prompts must be a list"),
    api("load_prompts: limit 0", "load_prompts(limit=0)", "limit must be an integer >= 1"),
    api("load_prompts: limit beyond the count", "load_prompts(limit=100)", "is more than the 16 prompts"),
    api("load_prompts: a directory", 'load_prompts(TMP + "/dir")', "is a directory"),
    api("Server: timeout negative", "Server(T).start(timeout=-1)", "timeout must be a finite number"),
    api("PDPair: start_timeout NaN", 'PDPair(T, T, start_timeout=float("nan"))', "start_timeout must be"),
    api("PDPair: forced connector, PP pairing", 'PDPair(T, T.with_(pp=2), connector="nixl-push")',
        "needs a producer with the same PP size"),
    api("pd_compare: a string as the prompts list", 'pd_compare(T, T, "Hello")', "prompts must be a list"),
]


# -- running a case ---------------------------------------------------------------------------------

@dataclass
class Outcome:
    """What a case did: exit code (None for an API case that raised as expected), the message, its line
    count, what reached stdout, the processes it tried to start and the files it wrote."""

    rc: int | None
    message: str
    lines: int
    stdout: str
    started: list[str]
    written: list[str]
    raised: str | None = None

    def problems(self, case: Case) -> list[str]:
        """[] when the case was refused as the table says."""
        out = []
        if case.kind == "cli" and self.rc != 2:
            out.append(f"exit {self.rc}, not 2")
        if case.kind == "api" and self.raised != "TopologyError":
            out.append(f"raised {self.raised}, not TopologyError")
        if self.lines != 1:
            out.append(f"{self.lines} message lines, not 1")
        if case.expect not in self.message:
            out.append(f"message lacks {case.expect!r}")
        if self.stdout.strip():
            out.append(f"wrote to stdout: {self.stdout.strip()[:80]!r}")
        if self.started:
            out.append(f"started processes: {self.started}")
        if self.written:
            out.append(f"wrote files: {self.written}")
        return out


def make_fixtures(tmp: Path) -> None:
    """The files the cases name under ``$TMP``."""
    (tmp / "empty.jsonl").write_text("")
    (tmp / "dir").mkdir()
    (tmp / "latin1.jsonl").write_bytes('{"prompt": "café"}\n'.encode("latin-1"))
    (tmp / "broken.jsonl").write_text('{"prompt": "ok"}\n{"prompt": "no closing brace"\n')
    (tmp / "wrongkey.jsonl").write_text('{"text": "the key is prompt"}\n')
    (tmp / "long.jsonl").write_text(json.dumps({"prompt": "def f(x):\n    return x\n" * 8}) + "\n")
    (tmp / "badmodel").mkdir()
    (tmp / "badmodel" / "config.json").write_text("{")
    (tmp / "cache").mkdir()
    (tmp / "cwd").mkdir()


class _ProcessBlocked(BaseException):
    """Raised instead of starting a process (a BaseException: a broad ``except Exception`` cannot hide it)."""


@contextlib.contextmanager
def _no_processes(started: list[str]):
    import _posixsubprocess
    import subprocess

    saved = {(os, "fork"): os.fork, (os, "posix_spawn"): os.posix_spawn, (os, "posix_spawnp"): os.posix_spawnp,
             (_posixsubprocess, "fork_exec"): _posixsubprocess.fork_exec,  # multiprocessing's spawn
             (subprocess.Popen, "_execute_child"): subprocess.Popen._execute_child}  # every subprocess.Popen
    if hasattr(subprocess, "_fork_exec"):  # subprocess binds fork_exec at import (Python >= 3.12)
        saved[(subprocess, "_fork_exec")] = subprocess._fork_exec

    def block(name):
        def refuse(*args, **kw):
            what = args[1] if name == "_execute_child" and len(args) > 1 else (args[0] if args else "")
            started.append(f"{name} {str(what)[:100]}".strip())
            raise _ProcessBlocked(name)
        return refuse

    for (mod, attr) in saved:
        setattr(mod, attr, block(attr))
    try:
        yield
    finally:
        for (mod, attr), fn in saved.items():
            setattr(mod, attr, fn)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else (0, 0)
            for p in root.rglob("*")}


def api_namespace(tmp: Path) -> dict:
    """The names an API case may use; ``T`` is ``Topology("tiny-mimo", random_weights=True)``."""
    from kit.checks.compare import compare, load_prompts
    from kit.core.topology import Spec, Topology
    from kit.engine import Server, generate, run
    from kit.pd import PDPair, pd_compare

    return {"Topology": Topology, "Spec": Spec, "generate": generate, "run": run, "compare": compare,
            "load_prompts": load_prompts, "Server": Server, "PDPair": PDPair, "pd_compare": pd_compare,
            "T": Topology("tiny-mimo", random_weights=True), "TMP": str(tmp)}


def run_case(case: Case, tmp: Path) -> Outcome:
    """Run one case in this process with processes blocked, the cache and working directory in ``tmp``."""
    from kit.cli import main
    from kit.core.topology import TopologyError

    started: list[str] = []
    out, err = io.StringIO(), io.StringIO()
    env_before, cwd_before = os.environ.get("KIT_CACHE_DIR"), os.getcwd()
    ns = api_namespace(tmp) if case.kind == "api" else {}
    before = _snapshot(tmp)
    rc, raised, message = None, None, ""
    os.environ["KIT_CACHE_DIR"] = str(tmp / "cache")
    os.chdir(tmp / "cwd")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _no_processes(started):
            try:
                if case.kind == "cli":
                    rc = main(shlex.split(case.text.replace(TMP, str(tmp))))
                else:
                    eval(case.text, ns)  # noqa: S307 - the expression is one of CASES, written here
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            except TopologyError as e:
                raised, message = "TopologyError", str(e)
            except _ProcessBlocked:
                raised = "a process start"
            except Exception as e:  # noqa: BLE001 - reported as the case's outcome
                raised, message = type(e).__name__, str(e)
    finally:
        os.chdir(cwd_before)
        if env_before is None:
            os.environ.pop("KIT_CACHE_DIR", None)
        else:
            os.environ["KIT_CACHE_DIR"] = env_before
    if case.kind == "cli":
        message = err.getvalue()
    message = message.strip()
    after = _snapshot(tmp)
    written = sorted(k for k in after if after[k] != before.get(k))
    shown = message.replace(str(tmp), TMP).replace(str(REPO_ROOT) + "/", "")  # the same table on every checkout
    return Outcome(rc=rc, message=shown, lines=len(message.splitlines()),
                   stdout=out.getvalue(), started=started, written=written, raised=raised)


@contextlib.contextmanager
def scratch():
    """A fresh ``$TMP`` with the fixtures; removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="kit-bad-input-"))
    try:
        make_fixtures(tmp)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- the table --------------------------------------------------------------------------------------

_HEAD = f"""# Bad input

<!-- Generated from kit/cli/bad_input.py by `{REGENERATE}`; do not edit by hand (a test compares). -->

What the kit refuses before it starts any process or writes any file, and the one line it says. A command
exits 2 with that line on stderr (`kit <command>: error: ...`); the Python API raises
`kit.core.topology.TopologyError` (a `ValueError`) with it. `tests/test_bad_input.py` runs every row and checks
the exit code, the single line, the fragment the row expects, that no process was started (process creation
is blocked while a case runs) and that nothing was written (cache and working directory are compared before
and after).

Where the checks live: the fields of a run in `kit.core.topology.Topology.validate`, the PD pairing in
`kit.pd.layout.check_pair`, the prompts file in `kit.core.prompts.load_prompts`, everything else (counts, seconds,
seeds, the prompts list) in `kit.core.validate`, used as argparse types by the commands and called by the API
functions.

Paths inside the repository are shown relative to it. `$TMP` is a scratch folder holding `empty.jsonl` (empty), `dir/` (a directory), `latin1.jsonl` (not UTF-8),
`broken.jsonl` (line 2 is not JSON), `wrongkey.jsonl` (`{{"text": ...}}`), `badmodel/` (a `config.json` that
is not JSON); `missing.jsonl` does not exist. `/proc/self/mem` is a file no read succeeds on. In the API rows
`T = Topology("tiny-mimo", random_weights=True)`.
"""


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render(outcomes: list[tuple[Case, Outcome]] | None = None) -> str:
    """The markdown table; runs the cases unless their outcomes are given."""
    if outcomes is None:
        with scratch() as tmp:
            outcomes = [(c, run_case(c, tmp)) for c in CASES]
    rows = ["| # | case | command | message |", "|---|---|---|---|"]
    for i, (c, o) in enumerate(outcomes, 1):
        bad = o.problems(c)
        msg = o.message if not bad else f"NOT REFUSED AS EXPECTED: {'; '.join(bad)}"
        rows.append(f"| {i} | {_cell(c.what)} | `{_cell(c.command)}` | {_cell(msg)} |")
    n_cli = sum(c.kind == "cli" for c in CASES)
    return (_HEAD + f"\n{len(CASES)} cases: {n_cli} commands, {len(CASES) - n_cli} Python API calls.\n\n"
            + "\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    """``kit bad-input [--check] [PATH]``: write (or compare) the table."""
    from kit.core.results import write_or_check

    rendered: list[str] = []

    def want() -> str:
        rendered.append(render())
        return rendered[0]

    path, rc = write_or_check(sys.argv[1:] if argv is None else list(argv), DOC_PATH, want, "kit/cli/bad_input.py",
                              REGENERATE)
    if rc is not None:
        return rc
    print(f"wrote {path} ({len(CASES)} cases)")
    return 0 if "NOT REFUSED AS EXPECTED" not in rendered[0] else 1


if __name__ == "__main__":
    sys.exit(main())
