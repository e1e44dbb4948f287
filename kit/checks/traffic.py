"""Traffic the repository's prompts never send, for the correctness matrix's ``traffic`` cells.

One prompt set and one engine setting per model, built from the model's own tokenizer so that the lengths are
exact token counts (as vLLM counts them, special tokens included):

- prompt lengths 1, 2, k + 1 .. k + 3 (shorter than, equal to and just beyond the draft window), one short of, at and
  one past a KV block (:data:`BLOCK` tokens), and two blocks and one token (longer than the prefill budget);
- two prompts that share a prefix of two blocks and more (prefix-cache hits where the family allows caching);
- :data:`MAX_NUM_SEQS` running requests at most, so requests wait, join a running batch and leave it;
- a stop token (:data:`STOP_TEXT`): a request stops where the model emits it, mid-draft as often as not, while the
  others run to ``max_tokens``;
- a prefill budget of :data:`PREFILL_BUDGET` tokens per step (longer prompts are prefilled in chunks) and
  :data:`KV_BLOCKS` KV blocks in all, fewer than the running requests outgrow while decoding (preemption and recompute: the matrix table counts them), with a
  model length of :data:`MODEL_LEN` tokens (vLLM refuses fewer blocks than one request of the model's length needs).

The reference engine (PP=1, no drafts) gets the same setting, so a difference is PP's or speculation's, not the
setting's.
"""
from __future__ import annotations

from kit.core.prompts import DEFAULT_PROMPTS, load_prompts
from kit.engine.launch import tokenizer as _tokenizer

BLOCK = 128            # vLLM 0.32's KV block size on CPU (CpuPlatform's default)
PREFILL_BUDGET = 64    # max_num_batched_tokens: a longer prompt is prefilled over several steps
KV_BLOCKS = 5          # num_gpu_blocks_override: requests outgrow them while decoding and are preempted (6 were
                       # enough for tiny-mimo's: 0 preemptions measured); 4 do not hold one 512-token request
MODEL_LEN = 4 * BLOCK  # max_model_len: vLLM wants the KV blocks to hold one request of the model's full length
MAX_NUM_SEQS = 3
STOP_TEXT = "."


def lengths(k: int) -> list[int]:
    """The prompt lengths (tokens) of the traffic set for ``k`` drafts per step."""
    return sorted({1, 2, k + 1, k + 2, k + 3, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 1})


def plain_kv(config: dict) -> bool:
    """Whether a model's KV cache is plain full attention in blocks of :data:`BLOCK` tokens (no recurrent state, no
    MLA latent, no sliding window), where :data:`KV_BLOCKS` blocks hold one request of :data:`MODEL_LEN` tokens."""
    layer_types = config.get("layer_types") or []
    return not (config.get("kv_lora_rank") or config.get("sliding_window")
                or any(t != "full_attention" for t in layer_types))


def engine_args(plain: bool = True) -> dict:
    """The engine setting of a traffic cell: prefill budget, model length and, where the KV cache is plain
    (:func:`plain_kv`), :data:`KV_BLOCKS` KV blocks (``max_num_seqs`` is the cell's). Other families keep vLLM's KV
    sizing: their blocks hold another number of tokens (MLA, a recurrent state's page, sliding-window groups) and six
    of them do not hold one request, which vLLM refuses at start."""
    args: dict = {"max_num_batched_tokens": PREFILL_BUDGET, "max_model_len": MODEL_LEN}
    if plain:
        args["extra_engine_args"] = {"num_gpu_blocks_override": KV_BLOCKS}
    return args


def _count(tok, text: str) -> int:
    return len(tok(text)["input_ids"])


def _text_of(tok, ids: list[int], n: int) -> str:
    """A text the tokenizer reads as exactly ``n`` tokens, cut from ``ids`` (the nearest count if none is exact)."""
    best = None
    for m in sorted(range(max(1, n - 4), n + 5), key=lambda m: abs(m - n)):
        text = tok.decode(ids[:m], skip_special_tokens=True)
        if not text.strip():
            continue
        c = _count(tok, text)
        if c == n:
            return text
        if best is None or abs(c - n) < abs(best[0] - n):
            best = (c, text)
    return best[1] if best else tok.decode(ids[:n])


def prompts(model_path: str, k: int) -> list[str]:
    """The traffic prompts for a model (its tokenizer at ``model_path``) and ``k`` drafts per step."""
    tok = _tokenizer(model_path)
    corpus = " ".join(load_prompts(DEFAULT_PROMPTS))
    ids = tok(corpus, add_special_tokens=False)["input_ids"]
    while len(ids) < 2 * BLOCK + 64:
        ids = ids + ids
    out = [_text_of(tok, ids, n) for n in lengths(k)]
    shared = _text_of(tok, ids, 2 * BLOCK + 8)
    out += [shared + " Then the story turns", shared + " In the end, however"]
    return list(dict.fromkeys(out))  # a length the tokenizer cannot make (one token with a BOS) comes out twice


def stop_token_ids(model_path: str) -> list[int]:
    """The id of :data:`STOP_TEXT` in the model's vocabulary."""
    ids = _tokenizer(model_path)(STOP_TEXT, add_special_tokens=False)["input_ids"]
    return ids[-1:]


def prompt_lengths(model_path: str, texts: list[str]) -> list[int]:
    """Token counts of ``texts`` as vLLM counts them."""
    tok = _tokenizer(model_path)
    return [_count(tok, t) for t in texts]
