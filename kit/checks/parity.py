"""The tiny models against vLLM: greedy tokens (parity) and MTP acceptance, both run through :mod:`kit.engine`.

Parity: the PyTorch model's greedy tokens (full recompute, float32) against vLLM's (PP=1, no speculation,
float32, eager) on vLLM's own prompt token ids, with the prompt's tokenization and the logprobs compared too.
Acceptance: one vLLM engine with MTP k over several prompt sets; per set the spec-decode counters, and what the
PyTorch drafter (:func:`kit.zoo.tiny.decode.predicted_counters`) says they should be. ``patches=None`` runs stock
vLLM (no plugins: the kit's own patches are not applied, so the model is checked against vLLM as shipped); a
``KIT_PATCHES`` selection loads those (``cpu_rope_layout`` for the DeepSeek model's MLA rope).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from kit.checks.compare import first_divergence
from kit.core.metrics import SpecCounters
from kit.core.prompts import DEFAULT_PROMPTS, load_prompts
from kit.core.topology import Topology
from kit.engine import DEFAULT_START_TIMEOUT, GenerationResult, run
from kit.zoo.tiny.checkpoint import eos_id, load_model
from kit.zoo.tiny.decode import greedy_generate, predicted_counters
from kit.zoo.tiny.tokenizer import encode_prompt


def _env(patches: str | None) -> dict[str, str]:
    return {"KIT_PATCHES": patches} if patches else {"VLLM_PLUGINS": ""}


def run_vllm(model_dir: Path, sets: dict[str, list[str]], max_tokens: int, k: int | None = None,
             top2: bool = False, patches: str | None = None, timeout: float = DEFAULT_START_TIMEOUT) -> dict:
    """One engine (PP=1, float32, eager, greedy, stopping at EOS), one generate job per prompt set.
    Returns ``{"start_seconds", "sets": {name: GenerationResult}}``."""
    topo = Topology(model=str(model_dir), spec=f"mtp:{k}" if k else None)
    jobs = [{"kind": "generate", "prompts": list(p), "max_tokens": max_tokens, "temperature": 0.0, "top2": top2,
             "ignore_eos": False} for p in sets.values()]
    res = run(topo, jobs, timeout=timeout, env=_env(patches))
    return {"start_seconds": res.get("start_seconds"),
            "sets": {name: GenerationResult.from_dict(j) for name, j in zip(sets, res["jobs"])}}


def _row(g: GenerationResult, i: int) -> GenerationResult:
    """Prompt ``i`` of a result, alone."""
    return GenerationResult([g.token_ids[i]], [""], [g.prompt_token_ids[i]], SpecCounters(), 0.0,
                            [g.top2[i]] if g.top2 else None)


def parity_check(model_dir: Path | str, prompts: Sequence[str] | None = None, max_tokens: int = 32,
                 patches: str | None = None, timeout: float = DEFAULT_START_TIMEOUT) -> dict:
    """Greedy tokens of the PyTorch model vs vLLM on the same prompt token ids; ``ok`` when every prompt is
    tokenized alike and gives identical tokens. Default prompts: the first 4 of ``data/prompts/default.jsonl``."""
    model_dir = Path(model_dir).resolve()
    prompts = list(prompts) if prompts is not None else load_prompts(DEFAULT_PROMPTS, 4)
    got = run_vllm(model_dir, {"prompts": prompts}, max_tokens, top2=True, patches=patches, timeout=timeout)
    vllm = got["sets"]["prompts"]
    model, eos = load_model(model_dir), eos_id(model_dir)
    refs = [greedy_generate(model, ids, max_tokens, eos) for ids in vllm.prompt_token_ids]
    torch_res = GenerationResult([r["tokens"] for r in refs], [""] * len(refs), vllm.prompt_token_ids,
                                 SpecCounters(), 0.0, [r["top2"] for r in refs])
    per, ok, max_lp_diff = [], True, 0.0
    for i, (prompt, ids, ref) in enumerate(zip(prompts, vllm.prompt_token_ids, refs)):
        div = first_divergence(_row(torch_res, i), _row(vllm, i))
        first = None if div is None else div["position"]
        # logprob of the sampled (top-1) token, compared where both agree
        for j, (a, b) in enumerate(zip(ref["top2"], (vllm.top2 or [[]] * len(prompts))[i])):
            if first is not None and j >= first:
                break
            max_lp_diff = max(max_lp_diff, abs(a[1] - b[1]))
        item = {"prompt": prompt, "prompt_tokens": len(ids),
                "tokenization_matches": encode_prompt(model_dir / "tokenizer.json", prompt) == ids,
                "vllm_tokens": vllm.token_ids[i], "torch_tokens": ref["tokens"], "identical": div is None,
                "first_divergence": first,
                "min_top1_top2_margin": min((r[1] - r[2] for r in ref["top2"]), default=None)}
        if first is not None and first < len(ref["top2"]):
            item["torch_top2_at_divergence"] = ref["top2"][first]
        ok = ok and item["identical"] and item["tokenization_matches"]
        per.append(item)
    return {"ok": ok, "model": str(model_dir), "kit_patches": patches, "max_tokens": max_tokens,
            "n_prompts": len(prompts), "max_abs_logprob_diff": max_lp_diff,
            "vllm_start_seconds": got["start_seconds"], "prompts": per}


def _summarise(k: int, g: GenerationResult, model, max_tokens: int, eos: int | None) -> dict:
    s = g.spec
    reqs = list(zip(g.prompt_token_ids, g.token_ids))
    # What the PyTorch MTP head predicts for the same greedy outputs (checks the drafter's math), and whether the
    # speculative output equals the PyTorch greedy output (speculation must not change it).
    predicted = predicted_counters(model, reqs, k)
    same = sum(greedy_generate(model, p, max_tokens, eos)["tokens"] == o for p, o in reqs)
    return {
        "k": k,
        "n_prompts": len(reqs),
        "output_tokens": g.num_generated,
        "drafts": s.num_drafts,
        "draft_tokens": s.num_draft_tokens,
        "accepted_tokens": s.num_accepted_tokens,
        "accepted_per_pos": s.per_position,
        "acceptance_rate_per_pos": [a / s.num_drafts if s.num_drafts else None for a in s.per_position],
        "mean_acceptance_length": s.mean_acceptance_length,
        "torch_predicted": predicted,
        "torch_predicted_matches": (predicted["drafts"] == s.num_drafts and predicted["accepted"] == s.num_accepted_tokens
                                    and predicted["accepted_per_pos"] == list(s.per_position)),
        "outputs_equal_torch_greedy": f"{same}/{len(reqs)}",
        "outputs": g.token_ids,
        "generate_seconds": g.seconds,
    }


def acceptance_sets(model_dir: Path | str, sets: dict[str, Sequence[str]], k: int, max_tokens: int = 64,
                    patches: str | None = None, timeout: float = DEFAULT_START_TIMEOUT) -> dict:
    """One vLLM engine with MTP k (greedy, float32, eager, PP=1) over several prompt sets;
    per set: counters, per-position acceptance, mean acceptance length (1 + accepted/drafts)."""
    model_dir = Path(model_dir).resolve()
    got = run_vllm(model_dir, {n: list(p) for n, p in sets.items()}, max_tokens, k=k, patches=patches,
                   timeout=timeout)
    model, eos = load_model(model_dir), eos_id(model_dir)
    return {"k": k, "start_seconds": got["start_seconds"],
            "sets": {name: _summarise(k, g, model, max_tokens, eos) for name, g in got["sets"].items()}}
