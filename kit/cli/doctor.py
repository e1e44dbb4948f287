"""``kit doctor``: versions, device, cores, memory, the model runner vLLM will use, and every patch's status."""
from __future__ import annotations

import json
import os
import platform

from kit.lab.doctor_report import text


def cmd_doctor(args) -> int:
    import psutil

    info = {"python": platform.python_version(), "platform": platform.platform(),
            "cores": len(os.sched_getaffinity(0)), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        info["cuda_available"] = torch.cuda.is_available()
    except Exception as e:
        info["torch"] = f"not importable: {e}"
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except Exception as e:
        info["vllm"] = f"not importable: {type(e).__name__}: {e}"
    info["device"] = "cuda" if info.get("cuda_available") else "cpu"
    info["runner"] = runner_info(info["device"])
    from kit.patches import ENV_SELECT, SUPPORTED_VLLM, UnsupportedVllmError, apply_selected, by_runner, errors, report

    info["patch_selection"] = os.environ.get(ENV_SELECT, "all")
    info["supported_vllm"] = list(SUPPORTED_VLLM)
    try:
        apply_selected()  # in this process, for every process kind, to report what applies here
    except (UnsupportedVllmError, ValueError) as e:
        info["patch_error"] = str(e)
    except Exception as e:  # apply_selected records patch failures itself; anything else is reported here
        info["patch_error"] = f"{type(e).__name__}: {e}"
    info["patches"] = report()
    info["patches_by_runner"] = by_runner()
    info["patch_failures"] = errors()
    info["patch_docs"] = "docs/patches.md (kit patch-docs)"
    try:
        from importlib.metadata import entry_points

        eps = [e.value for e in entry_points(group="vllm.general_plugins")]
        info["plugin_entry_points"] = eps
    except Exception:
        info["plugin_entry_points"] = []
    if args.json:
        print(json.dumps(info))
        return 0
    print(text(info))
    return 1 if info["patch_failures"] else 0


def runner_info(device: str) -> dict:
    """The model runner vLLM 0.32 uses on ``device`` with this environment (the ``auto`` of
    :class:`~kit.core.topology.Topology`), and why: ``VLLM_USE_V2_MODEL_RUNNER`` when set, else V1 without Triton
    (the CPU build), else V2 (vLLM falls back to V1 only for a config V2 lacks; it logs which)."""
    from kit.core.topology import RUNNER_ENV, default_runner

    env = os.environ.get(RUNNER_ENV)
    try:
        from vllm.triton_utils import HAS_TRITON
    except Exception as e:  # vLLM not importable: doctor still reports the rest
        return {"device": device, "default": None, "why": f"vllm.triton_utils not importable: {e}", RUNNER_ENV: env}
    if env is not None:  # vLLM reads it as bool(int(value)) (vllm/envs.py)
        try:
            default, why = ("v2" if int(env) else "v1"), f"{RUNNER_ENV}={env}"
            why += ", which vLLM refuses here: Model Runner V2 requires Triton" if int(env) and not HAS_TRITON else ""
        except ValueError:
            default, why = None, f"{RUNNER_ENV}={env!r} is not an integer: vLLM fails on it"
    else:
        default = default_runner(device, HAS_TRITON)
        why = ("Triton present: vLLM's default, V1 only for what V2 does not support" if HAS_TRITON else
               "no Triton (vLLM's CPU build): Model Runner V2 requires it")
    return {"device": device, "default": default, "why": why, RUNNER_ENV: env,
            "patches_apply": f"runner '{default}' and 'any' (patches_by_runner; docs/patches.md)"}
