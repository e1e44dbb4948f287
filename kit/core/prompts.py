"""The prompts file every command reads: JSONL, one ``{"prompt": "..."}`` per line.

:func:`load_prompts` refuses, with one line naming the file, what it cannot use: a missing file, a directory or
other non-file, a file it cannot read, one that is not UTF-8, a line that is not JSON or not a prompt, a file with
no prompts, and a ``limit`` that is not 1 .. the number of prompts (a run over zero prompts would compare
nothing and report identical).
"""
from __future__ import annotations

import json
from pathlib import Path

from kit.core.models import PROMPTS_DIR
from kit.core.topology import TopologyError

DEFAULT_PROMPTS = PROMPTS_DIR / "default.jsonl"


def load_prompts(path: str | Path | None = None, limit: int | None = None) -> list[str]:
    """Prompts from a JSONL file (default: ``data/prompts/default.jsonl``); with ``limit`` the first ``limit``."""
    p = Path(path) if path else DEFAULT_PROMPTS
    if not p.exists():
        raise TopologyError(f"prompt file {p} does not exist")
    if p.is_dir():
        raise TopologyError(f"prompt file {p} is a directory, not a JSONL file")
    if not p.is_file():
        raise TopologyError(f"prompt file {p} is not a regular file")
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as e:
        raise TopologyError(f"prompt file {p} cannot be read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TopologyError(f"prompt file {p} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                            f"{e.start})") from None
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TopologyError(f"{p}:{n}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise TopologyError(f'{p}:{n}: expected {{"prompt": "<non-empty text>"}}')
        prompts.append(obj["prompt"])
    if not prompts:
        raise TopologyError(f"prompt file {p} holds no prompts")
    if limit is None:
        return prompts
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise TopologyError(f"limit must be an integer >= 1, got {limit!r}")
    if limit > len(prompts):
        raise TopologyError(f"limit {limit} is more than the {len(prompts)} prompts in {p}")
    return prompts[:limit]
