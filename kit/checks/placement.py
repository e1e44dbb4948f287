"""Where things live in a running PP engine, read from the live workers (not recomputed on paper)."""
from __future__ import annotations

from kit.core.topology import Topology
from kit.engine import GenerationResult, run


def placement(topology: Topology, env: dict[str, str] | None = None, timeout: float = 600) -> list[dict]:
    """Start ``topology``, ask every worker what it holds (``kit_placement``), stop it.

    One dict per rank, ordered by PP rank: layer range and indices, parameter count and bytes,
    whether it holds the embedding and the LM head, its drafter (class, parameters), and its KV cache
    (blocks, block size, layer names).
    """
    res = run(topology, [{"kind": "inspect"}], timeout=timeout, env=env)
    ranks = res["jobs"][0]
    return sorted(ranks, key=lambda r: (r["pp_rank"], r["tp_rank"]))


def traced_placement(topology: Topology, prompts: list[str] | None = None, max_tokens: int = 16,
                     env: dict[str, str] | None = None, timeout: float = 600) -> dict:
    """:func:`placement` and, with ``prompts``, a generation with every step traced inside each worker
    (:mod:`kit.worker.steptrace`), on one engine; a multi-node topology runs on its nodes (:class:`kit.engine.multinode.MultiNode`,
    the workers read through the leader's ``/collective_rpc``), and each rank then says which node it is on.

    Returns ``{"ranks", "generation" (or None), "trace" (per-rank events, or None), "nodes"}``; ``nodes`` is one
    dict per node (rank, address, cores, role), ``[]`` for a one-node topology.
    """
    out: dict = {"generation": None, "trace": None, "nodes": []}
    if topology.nodes > 1:
        from kit.engine.multinode import MultiNode

        with MultiNode(topology, env=dict(env or {}), rpc_enabled=True) as mn:
            out["ranks"] = mn.inspect()
            if prompts:
                mn.rpc("kit_trace_start")
                out["generation"] = mn.generate(prompts, max_tokens=max_tokens)
                out["trace"] = mn.rpc("kit_trace_read")
            mn.check_patches()  # a patch that did not apply on some node stops the run, as in a plain generate
            out["nodes"] = [{"rank": n.rank, "ip": n.ip, "cores": n.cores, "role": n.role} for n in mn.nodes]
        return out
    jobs = [{"kind": "inspect"}]
    if prompts:
        jobs += [{"kind": "rpc", "method": "kit_trace_start"},
                 {"kind": "generate", "prompts": prompts, "max_tokens": max_tokens},
                 {"kind": "rpc", "method": "kit_trace_read"}]
    res = run(topology, jobs, timeout=timeout, env=env)
    out["ranks"] = sorted(res["jobs"][0], key=lambda r: (r["pp_rank"], r["tp_rank"]))
    if prompts:
        out["generation"] = GenerationResult.from_dict(res["jobs"][2])
        out["trace"] = res["jobs"][3]
    return out


def summary_rows(ranks: list[dict]) -> list[dict]:
    """A flat table of :func:`placement` output, one row per rank."""
    rows = []
    for r in ranks:
        d = r.get("drafter") or {}
        where = {"node": r["node"], "address": r.get("host_ip"), "cores": r.get("cpu_affinity")} if "node" in r else {}
        rows.append({
            "pp_rank": r["pp_rank"],
            **where,
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


def eagle3_layer_names(num_layers: int, pp: int, count: str = "total") -> list[dict]:
    """Per PP rank, the attention layer names an Eagle3 target plus its one draft layer get in vLLM 0.32.

    ``llama_eagle3.Eagle3LlamaForCausalLM`` takes one number, ``target_layer_num``, and uses it twice: as
    ``start_layer_id`` (the draft layer is named ``model.layers.<target_layer_num>``) and as
    ``config.target_layer_count``, which ``llama.LlamaAttention`` subtracts from the index in that name to
    look up ``layer_types``. ``count="total"`` is vLLM 0.32 (``get_total_num_hidden_layers()``),
    ``count="per_rank"`` the old ``get_num_layers(parallel_config)``: the layers on the drafter's (last) rank.
    Target layers are split with vLLM's own ``get_pp_indices``. Per rank: ``target`` names, ``draft`` name
    (last rank only), ``clash`` (the draft's name is a target layer's on the same rank), ``elsewhere`` (the
    rank whose target layer has the draft's name, if another one) and ``layer_types_index`` (what the lookup
    reads; 0 with either count).
    """
    from vllm.distributed.utils import get_pp_indices

    if count not in ("total", "per_rank"):
        raise ValueError(f"count must be 'total' or 'per_rank', not {count!r}")
    rows = []
    for rank in range(pp):
        start, end = get_pp_indices(num_layers, rank, pp)
        names = [f"model.layers.{i}" for i in range(start, end)]
        row = {"pp": pp, "pp_rank": rank, "target": names, "draft": None, "clash": False, "elsewhere": None,
               "layer_types_index": None}
        if rank == pp - 1:
            target_layer_num = num_layers if count == "total" else end - start
            row["draft"] = f"model.layers.{0 + target_layer_num}"  # layer 0 of the draft, start_layer_id
            row["clash"] = row["draft"] in names
            row["layer_types_index"] = int(row["draft"].split(".")[2]) - target_layer_num
            row["elsewhere"] = next((r["pp_rank"] for r in rows if row["draft"] in r["target"]), None)
        rows.append(row)
    return rows
