"""Where things live in a running PP engine, read from the live workers (not recomputed on paper)."""
from __future__ import annotations

from .engine import run
from .topology import Topology


def placement(topology: Topology, env: dict[str, str] | None = None, timeout: float = 600) -> list[dict]:
    """Start ``topology``, ask every worker what it holds (``kit_placement``), stop it.

    One dict per rank, ordered by PP rank: layer range and indices, parameter count and bytes,
    whether it holds the embedding and the LM head, its drafter (class, parameters), and its KV cache
    (blocks, block size, layer names).
    """
    res = run(topology, [{"kind": "inspect"}], timeout=timeout, env=env)
    ranks = res["jobs"][0]
    return sorted(ranks, key=lambda r: (r["pp_rank"], r["tp_rank"]))


def summary_rows(ranks: list[dict]) -> list[dict]:
    """A flat table of :func:`placement` output, one row per rank."""
    rows = []
    for r in ranks:
        d = r.get("drafter") or {}
        rows.append({
            "pp_rank": r["pp_rank"],
            "layers": f"{r['layer_range'][0]}..{r['layer_range'][1] - 1}" if r["layer_range"][0] is not None else "?",
            "params": r["params"],
            "param_MiB": round(r["param_bytes"] / 2**20, 2),
            "embedding": r["embedding"],
            "lm_head": r["lm_head"],
            "drafter": d.get("model_class") or d.get("class") or "-",
            "drafter_params": d.get("params", 0),
            "kv_blocks": r["kv_cache"].get("num_blocks"),
            "kv_layers": len(r["kv_cache"].get("layers", [])),
            "kv_layer_names": ", ".join(x.replace("model.", "") for x in r["kv_cache"].get("layers", [])),
        })
    return rows
