"""``kit doctor``'s report as text and as one summary line, from what ``kit doctor --json`` prints.

Formatting only (no vLLM, no patches): ``kit doctor`` prints :func:`text`; a notebook shows :func:`summary` with the
full text folded under it (:func:`kit.lab.notebook.show_doctor`).
"""
from __future__ import annotations


def text(info: dict) -> str:
    """The report ``kit doctor`` prints, from what ``kit doctor --json`` prints."""
    lines = [f"{k:22s} {v}" for k, v in info.items() if k not in ("patches", "runner", "patches_by_runner")]
    r = info["runner"]
    lines.append(f"{'runner':22s} {r['default']} by default on {r['device']} ({r['why']}); Topology(runner=...) or "
                 "--runner picks v1/v2")
    for name, names in info["patches_by_runner"].items():
        lines.append(f"{'patches for ' + name:22s} {', '.join(names) or '(none)'}")
    lines.append("\npatches (name, processes, runner, kind, status; upstream thread):")
    for p in info["patches"]:
        procs = ",".join(p.get("processes", [])) or "?"
        lines.append(f"  {p['name']:32s} {procs:20s} {p.get('runner', '?'):4s} {p.get('kind', '?'):9s} {p['status']}\n"
                     f"  {'':32s} {p.get('upstream', '')}")
    return "\n".join(lines)


def patch_counts(info: dict) -> dict[str, int]:
    """The patches by state: ``applied``, ``upstream`` (the installed vLLM has the fix), ``not selected``,
    ``failed``, and ``not needed here`` (no Ray run, no AMX, ...)."""
    counts = {"applied": 0, "upstream": 0, "not needed here": 0, "not selected": 0, "failed": 0}
    for p in info.get("patches", []):
        status = p.get("status", "")
        key = ("failed" if status.startswith("FAILED") or p["name"] in (info.get("patch_failures") or {}) else
               "applied" if status == "applied" else "upstream" if status.startswith("upstream") else
               "not selected" if "NOT selected" in status else "not needed here")
        counts[key] += 1
    return counts


def summary(info: dict) -> str:
    """One line: versions, machine, runner, the patches counted by state, and the patch error if there was one."""
    r = info.get("runner") or {}
    counts = ", ".join(f"{n} {k}" for k, n in patch_counts(info).items() if n or k == "failed")
    line = (f"vLLM {info.get('vllm')}, torch {info.get('torch')}, Python {info.get('python')}; "
            f"{info.get('device')} ({info.get('cpu_capability', '?')}), {info.get('cores')} cores, "
            f"{info.get('memory_gib')} GiB; runner {r.get('default')}; "
            f"patches ({info.get('patch_selection')}): {counts}")
    if info.get("patch_error"):
        line += f"; patch error: {info['patch_error']}"
    return line
