"""Report only: the Qwen3.5 MTP forward never consumes PP intermediates (fixed in 0.32).

What breaks without it (before vLLM PR #46003): the Qwen3.5 MTP forward read PP intermediate tensors on
non-first ranks, which an MTP head never receives.
Fix: upstream; nothing to apply. ``needed()`` reads ``qwen3_5_mtp``'s forward (not importable without
torchvision on some installs: then it says so).
Upstream: vLLM PR #46003. Target: vLLM < 0.32 (detection on 0.32.0).
Removal: with support for vLLM versions without the fix. Turn off: nothing to turn off (report only).
"""
from __future__ import annotations

import inspect

from kit.patches import Kind, Patch, Proc, Runner
from kit.patches.draft_pp_gate import nothing_to_apply

NAME = "qwen3_5_mtp_intermediates"


def _needed() -> "bool | str":
    try:
        from vllm.model_executor.models import qwen3_5_mtp
    except Exception as e:  # needs torchvision via transformers on some installs
        return f"not importable here: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    src = inspect.getsource(qwen3_5_mtp)
    return "is_first_rank" in src and "intermediate_tensors is None" not in src


PATCH = Patch(
    name=NAME,
    summary="Qwen3.5 MTP forward never consumes PP intermediates (report only: fixed upstream)",
    why=("The Qwen3.5 MTP forward read PP intermediates on non-first ranks. Detected from qwen3_5_mtp's forward; "
         "a live PP=2 engine checks that the drafter is never called with intermediates."),
    upstream="vLLM PR #46003",
    target="vLLM < 0.32 (fixed in 0.32.0)",
    symbols=(),
    processes={Proc.WORKER},
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="with support for vLLM versions without the fix",
    tests=("tests/test_qwen3_5.py::test_qwen3_5_mtp_drafter_lives_on_the_last_rank_and_never_reads_pp_intermediates "
           "(report only: the fixed vLLM is checked, there is no off)",),
    findings="qwen35-mtp-reads-pp-intermediates",
    apply=nothing_to_apply,
    needed=_needed,
    report_only=True,
)
