"""Reference decoding with the PyTorch model: greedy tokens by full recompute, vLLM's MTP draft loop replayed,
the spec-decode counters vLLM should report, and the model's batch-1 forward time.

These are the "expected" side of the parity and acceptance checks (:mod:`kit.checks.parity`): the tokens vLLM must
produce and the drafts it must accept, computed without vLLM.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F


@torch.no_grad()
def greedy_generate(model, prompt_ids: Sequence[int], max_tokens: int, eos_id: int | None = None) -> dict:
    """Greedy tokens by full recompute, stopping after ``eos_id``; per step the row ``[token, top-1 logprob,
    top-2 logprob]`` (the layout of :attr:`kit.engine.GenerationResult.top2`, for tie diagnosis)."""
    ids = list(prompt_ids)
    toks, top = [], []
    for _ in range(max_tokens):
        h = model.hidden(torch.tensor([ids]))
        lp = torch.log_softmax(model.logits(h[:, -1]).float(), dim=-1)[0]
        v, i = lp.topk(2)
        t = int(i[0])
        toks.append(t)
        top.append([float(t), float(v[0]), float(v[1])])
        ids.append(t)
        if eos_id is not None and t == eos_id:
            break
    return {"tokens": toks, "top2": top}


@torch.no_grad()
def draft_tokens(model, seq: Sequence[int], j: int, k: int, _cache: dict | None = None,
                 return_hidden: bool = False):
    """The k MTP draft tokens vLLM proposes when ``seq[:j+1]`` is known (last known index j).

    Draft 1 comes from the drafter's first pass at position p=j-1 (trunk hidden h_p, token seq[j]).
    Draft s>1 re-applies the MTP layer at position p+s-1 to the previous draft step's output
    (after its output norm) and the previous draft token; its attention sees the first pass's
    keys at positions 0..p, the earlier draft steps' keys and its own (the drafter KV cache).
    """
    layer = model.mtp_layer
    attn = layer.self_attn
    if _cache is None or _cache.get("seq") != tuple(seq):
        x = torch.tensor([list(seq)])
        T = x.shape[1] - 1
        pos = torch.arange(T)
        h = model.hidden(x[:, :T], pos)
        kv: list = []
        m = model.mtp_hidden(h, x[:, 1:T + 1], pos, kv_out=kv)
        fresh = {"seq": tuple(seq), "m": m, "k": kv[0][0], "v": kv[0][1]}
        if _cache is not None:
            _cache.clear()
            _cache.update(fresh)
        _cache = fresh
    p = j - 1
    m_prev = _cache["m"][:, p:p + 1]
    K, V = _cache["k"][:, :, :p + 1], _cache["v"][:, :, :p + 1]
    drafts = [int(model.mtp_logits(m_prev).argmax(-1))]
    hiddens = [m_prev]
    for s in range(1, k):
        position = torch.tensor([p + s])
        tok = torch.tensor([[drafts[-1]]])
        xin = layer.mtp_input(model.model.embed_tokens(tok), position, m_prev)
        hn = layer.input_layernorm(xin)
        q, k_new, v_new = attn.qkv(hn, position)
        K, V = torch.cat([K, k_new], dim=2), torch.cat([V, v_new], dim=2)
        o = F.scaled_dot_product_attention(q, K, V, scale=attn.hd ** -0.5)
        hmid = xin + attn.out(o, hn)
        out = hmid + layer.mlp(layer.post_attention_layernorm(hmid))
        m_prev = layer.out_norm(out)
        hiddens.append(m_prev)
        drafts.append(int(model.mtp_logits(m_prev).argmax(-1)))
    return (drafts, hiddens) if return_hidden else drafts


def simulate_spec(model, prompt_ids: Sequence[int], output_ids: Sequence[int], k: int) -> dict:
    """Expected vLLM MTP counters for one greedy request whose (spec-independent) output is
    ``output_ids``: each decode step verifies k drafts, accepts the longest matching prefix (a)
    and yields a+1 tokens; the request ends at len(output_ids) tokens (a last accepted draft
    still counts even when its bonus token is cut off)."""
    seq = list(prompt_ids) + list(output_ids)
    L, n_out = len(prompt_ids), len(output_ids)
    drafts = accepted = 0
    per_pos = [0] * k
    produced, j = 1, L  # the prefill samples the first output token, at index L
    cache: dict = {}
    while produced < n_out:
        d = draft_tokens(model, seq, j, k, cache)
        drafts += 1
        a = 0
        while a < k and j + 1 + a < len(seq) and d[a] == seq[j + 1 + a]:
            per_pos[a] += 1
            a += 1
        accepted += a
        produced += a + 1
        j += a + 1
    return {"drafts": drafts, "draft_tokens": drafts * k, "accepted": accepted, "accepted_per_pos": per_pos}


def predicted_counters(model, requests: Sequence[tuple[Sequence[int], Sequence[int]]], k: int) -> dict:
    """:func:`simulate_spec` summed over ``(prompt ids, output ids)`` requests."""
    sims = [simulate_spec(model, p, o, k) for p, o in requests]
    return {"drafts": sum(x["drafts"] for x in sims), "draft_tokens": sum(x["draft_tokens"] for x in sims),
            "accepted": sum(x["accepted"] for x in sims),
            "accepted_per_pos": [sum(x["accepted_per_pos"][i] for x in sims) for i in range(k)]}


def simulated_acceptance(model, tokenizer_json: Path, prompts: list[str], ks=(1, 2, 3), max_tokens: int = 64,
                         eos_id: int | None = None) -> dict:
    """What vLLM's MTP counters should read for greedy decoding of ``prompts`` (PyTorch, CPU, float32), per k.
    Position 1 matched vLLM exactly for tiny-mimo and mimo-py-18m; later positions were within a few counts."""
    from kit.zoo.tiny.tokenizer import encode_prompt

    reqs = []
    for p in prompts:
        ids = encode_prompt(tokenizer_json, p)
        reqs.append((ids, greedy_generate(model, ids, max_tokens, eos_id)["tokens"]))
    res = {}
    for k in ks:
        c = predicted_counters(model, reqs, k)
        drafts, per_pos = c["drafts"], c["accepted_per_pos"]
        res[f"k{k}"] = {"drafts": drafts, "accepted_per_pos": per_pos,
                        "rate_per_pos": [round(a / max(1, drafts), 4) for a in per_pos],
                        "mean_acceptance_length": round(1 + sum(per_pos) / max(1, drafts), 4)}
    return {"n_prompts": len(prompts), "max_tokens": max_tokens, **res}


def forward_time(model, threads: int, repeats: int = 200, position: int = 64) -> dict:
    """Seconds for one batch-1 decode forward of the PyTorch model (float32, CPU, ``threads`` intra-op threads):
    one token through embedding, every trunk layer, the final norm and the LM head, and separately through
    the MTP layer and the LM head (one draft step). Attention sees the token alone (no KV cache), which
    leaves out the attention over the context: small next to the layers' matrix-vector products at the
    context lengths the kit uses (a few hundred tokens, head_dim 64). Min and median of ``repeats``."""
    import statistics

    torch.set_num_threads(threads)
    x, pos = torch.tensor([[5]]), torch.tensor([position])
    out: dict = {"threads": threads, "repeats": repeats}
    with torch.inference_mode():
        h = model.hidden(x, pos)
        for name, fn in (("trunk", lambda: model.logits(model.hidden(x, pos))),
                         ("mtp_draft", lambda: model.mtp_logits(model.mtp_hidden(h, x, pos)))):
            for _ in range(10):
                fn()
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            out[name] = {"min_ms": round(1e3 * min(ts), 3), "median_ms": round(1e3 * statistics.median(ts), 3)}
    return out
