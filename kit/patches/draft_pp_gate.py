"""Report only: the draft model's parallel config uses PP=1 (fixed in the vLLM the kit targets).

What breaks without it (vLLM < 0.32): the draft model's parallel config copied the target's PP size, so
``verify_with_parallel_config`` demanded ``SupportsPP`` of every MTP head and PP + MTP failed with
``NotImplementedError: Pipeline parallelism is not supported for this model``.
Fix: upstream (vLLM issue #52069, PR #52117); nothing to apply. ``needed()`` builds a draft parallel config
from a PP=2 target config and reports "upstream" when it comes out PP=1 (``kit doctor``; not evaluated at
plugin load, where it would cost every process ~1.3 s).
Upstream: vLLM issue #52069, PR #52117. Target: vLLM < 0.32 (detection on 0.32.0).
Removal: when the kit stops supporting vLLM versions without the fix (it reports, so nothing breaks).
Turn off: nothing to turn off (report only).
"""
from __future__ import annotations

from kit.patches import Kind, Patch, Proc, Runner

NAME = "draft_pp_gate"


def _needed() -> "bool | str":
    from vllm.config import ParallelConfig, SpeculativeConfig

    target = ParallelConfig(pipeline_parallel_size=2)
    draft = SpeculativeConfig.create_draft_parallel_config(target, 1)
    return draft.pipeline_parallel_size != 1


def nothing_to_apply() -> None:
    raise RuntimeError("this vLLM already has the fix; the kit has nothing to apply")


PATCH = Patch(
    name=NAME,
    summary="draft parallel config uses PP=1, so MTP heads need no SupportsPP (report only: fixed upstream)",
    why=("Before the fix the draft model's parallel config copied the target's PP size and PP + MTP failed with "
         "'Pipeline parallelism is not supported for this model'. Detected by building a draft parallel config "
         "from a PP=2 target config."),
    upstream="vLLM issue #52069, PR #52117",
    target="vLLM < 0.32 (fixed in 0.32.0)",
    symbols=(),
    processes={Proc.FRONT_END},  # where the speculative config is built
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="with support for vLLM versions without the fix",
    tests=("tests/test_cli.py::test_doctor_reports_versions_and_patches (status 'upstream')",),
    findings="mtp-under-pp-refused-supportspp-demanded-of-the-draft-model",
    apply=nothing_to_apply,
    needed=_needed,
    report_only=True,
)
