"""Speculation token by token, as HTML: verify rounds from the acceptance probe's log, and a run against its reference.

Pure functions of token ids and a tokenizer (anything with ``decode(list[int]) -> str``, e.g. the model's Hugging
Face tokenizer from :func:`load_tokenizer`); they return HTML strings with inline styles only, so the blocks look the
same in JupyterLab and in the static report (nbconvert). :func:`show` displays one.

- :func:`rounds_html`: one row per verify round of one request: the accepted drafts green, the first rejected draft
  red and struck through, the target's own token blue (its correction at the rejection) or grey (its bonus token
  after every draft was accepted), the drafts after a rejection faded (never used). The rounds come from the verify-round
  log of :mod:`kit.worker.acceptance_probe` (``kit_probe_start_log``), matched to the generated outputs with
  :func:`match_requests`.
- :func:`divergence_html`: a run against its reference, position by position (reference token above, the run's
  below); a token that differs is coloured by the prompt whose reference has it nearby (:func:`leak_sources`), or red
  when no other prompt does.
"""
from __future__ import annotations

import html as _html
from dataclasses import dataclass, field

# Token styles (inline CSS), one per role; the legends use the same words.
_BOX = ("display:inline-block;margin:1px 1px;padding:0 3px;border-radius:3px;font-family:monospace;"
        "font-size:13px;line-height:20px;white-space:pre;border:1px solid ")
STYLES = {
    "accepted": _BOX + "#31a354;background:#c7e9c0;color:#00441b",
    "rejected": _BOX + "#cb181d;background:#fcbba1;color:#a50f15;text-decoration:line-through",
    "correction": _BOX + "#3182bd;background:#c6dbef;color:#08306b;font-weight:bold",
    "bonus": _BOX + "#969696;background:#e0e0e0;color:#252525;font-weight:bold",
    "unused": _BOX + "#d9d9d9;background:#ffffff;color:#a0a0a0;text-decoration:line-through;border-style:dashed",
    "same": _BOX + "#e0e0e0;background:#f7f7f7;color:#252525",
    "differs": _BOX + "#cb181d;background:#de2d26;color:#ffffff;font-weight:bold",
}
LABELS = {
    "accepted": "draft accepted",
    "rejected": "first rejected draft",
    "correction": "target's own token at the rejection",
    "bonus": "target's own token after all drafts (bonus)",
    "unused": "draft after a rejection (never used)",
}
# One colour per prompt for tokens that came from another prompt (red is kept for "differs, from no other prompt").
PROMPT_COLOURS = ["#1f78b4", "#ff7f00", "#6a3d9a", "#b15928", "#e7298a", "#1b9e77", "#a6761d", "#666666"]
_FRAME = "font-family:sans-serif;font-size:13px;margin:6px 0 10px 0"
_NOTE = "color:#636363;font-size:12px"


class _FastTokenizer:
    """A ``tokenizer.json`` read with Hugging Face ``tokenizers``, decoding special tokens too (as the model's
    ``transformers`` tokenizer does by default); loads in well under a second, without importing transformers."""

    def __init__(self, path):
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_file(str(path))

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode([int(t) for t in ids], skip_special_tokens=False)


def load_tokenizer(model: str):
    """The Hugging Face tokenizer of a model under ``data/models/`` (or a model directory): its ``tokenizer.json``
    through ``tokenizers`` when it has one, else ``transformers.AutoTokenizer``."""
    from kit.core.models import resolve_model

    path = resolve_model(model).path
    if (path / "tokenizer.json").exists():
        return _FastTokenizer(path / "tokenizer.json")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def show(block: str) -> None:
    """Display an HTML block of this module in the notebook."""
    from IPython.display import HTML, display

    display(HTML(block))


def count(n: int, word: str) -> str:
    """``count(1, "bonus token")`` -> ``"1 bonus token"``, ``count(2, ...)`` -> ``"2 bonus tokens"``."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def visible(text: str) -> str:
    """A token's text with its whitespace drawn: spaces as ``·``, newlines ``↵``, tabs ``⇥``."""
    return text.replace(" ", "·").replace("\n", "↵").replace("\r", "␍").replace("\t", "⇥")


class _Decoder:
    """Per-id decoding, cached (one call per distinct token)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, tid: int) -> str:
        if tid not in self.cache:
            self.cache[tid] = self.tokenizer.decode([int(tid)])
        return self.cache[tid]

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode([int(t) for t in ids]) if ids else ""


def _span(role_style: str, text: str, title: str = "") -> str:
    t = f' title="{_html.escape(title)}"' if title else ""
    return f'<span style="{role_style}"{t}>{_html.escape(visible(text)) or "&nbsp;"}</span>'


def _legend(roles: list[tuple[str, str]]) -> str:
    items = "".join(f'<span style="margin-right:14px">{_span(style, "tok")} {_html.escape(label)}</span>'
                    for style, label in roles)
    return f'<div style="{_NOTE};margin:4px 0">{items}</div>'


# -- verify rounds -------------------------------------------------------------------------------------------------

@dataclass
class Round:
    """One verify round of one request: its drafts and the tokens the sampler wrote (accepted drafts, then the
    target's own token). ``position``: output tokens the request had before the round (set by
    :func:`match_requests`); ``logged_position``: what the worker's input batch said it was."""

    draft: list[int]
    output: list[int]
    position: int | None = None
    step: int | None = None
    logged_position: int | None = None

    @property
    def accepted(self) -> int:
        return max(0, min(len(self.output) - 1, len(self.draft)))

    @property
    def rejected(self) -> int | None:
        """The first rejected draft, or ``None`` when every draft was accepted."""
        return self.draft[self.accepted] if self.accepted < len(self.draft) else None

    @property
    def target_token(self) -> int | None:
        return self.output[self.accepted] if len(self.output) > self.accepted else None

    @property
    def bonus(self) -> bool:
        """The target's token came after every draft was accepted (or the round had no drafts)."""
        return self.accepted == len(self.draft)


@dataclass
class RequestRounds:
    """The logged rounds of one request, matched to a prompt's generated tokens."""

    req_id: str | None
    prompt_index: int
    offset: int                      # the generated position of the first round's first token
    rounds: list[Round] = field(default_factory=list)
    logged_offset: int | None = None  # where the worker's input batch said the first round starts

    @property
    def tokens(self) -> list[int]:
        return [t for r in self.rounds for t in r.output]

    @property
    def verify_rounds(self) -> list[Round]:
        """The rounds that checked drafts (vLLM counts only these; the prefill's row has none)."""
        return [r for r in self.rounds if r.draft]

    @property
    def positions_agree(self) -> bool:
        """Every round starts where the worker's input batch said it did."""
        return all(r.logged_position == r.position for r in self.rounds)


def rounds_from_log(entries: list[dict]) -> dict:
    """The probe's log rows grouped per request (in log order), rows the runner discarded left out:
    ``{req_id: [Round, ...]}``."""
    out: dict = {}
    for e in entries:
        if e.get("discarded"):
            continue
        key = e.get("req_id")
        if key is None:
            key = ("step", e.get("step"), "row", e.get("row"))
        out.setdefault(key, []).append(Round(list(e["draft"]), list(e["output"]), e.get("position"), e.get("step"),
                                             e.get("position")))
    return out


def _fits(seq: list[int], last: int, gen: list[int], o: int) -> bool:
    """``seq`` is ``gen`` from ``o`` on, except that its last round (``last`` tokens) may run past ``gen``'s end
    (the request reached max_tokens mid-round: those tokens were dropped)."""
    n = min(len(seq), len(gen) - o)
    return n > 0 and n >= len(seq) - last + 1 and gen[o:o + n] == seq[:n]


def match_requests(entries: list[dict], token_ids: list[list[int]]) -> dict[int, RequestRounds]:
    """Which prompt each logged request is, by its tokens: ``{prompt index: RequestRounds}``.

    A request's rounds, concatenated, must be that prompt's generated tokens from some position on (the position
    the worker logged is tried first); identical continuations go to the first prompt not yet taken. Requests that
    match no prompt are left out. Each round's ``position`` is set from the match."""
    taken: dict[int, RequestRounds] = {}
    for key, rounds in rounds_from_log(entries).items():
        seq = [t for r in rounds for t in r.output]
        if not seq:
            continue
        hint = rounds[0].position
        last = len(rounds[-1].output)
        found = None
        for i, gen in enumerate(token_ids):
            if i in taken:
                continue
            order = ([hint] if hint is not None and 0 <= hint < len(gen) else []) + \
                [o for o in range(len(gen)) if o != hint]
            for o in order:
                if _fits(seq, last, gen, o):
                    if found is None or (o == hint and found[1] != hint):
                        found = (i, o)
                    break
            if found is not None and found[1] == hint:
                break
        if found is None:
            continue
        i, o = found
        pos = o
        for r in rounds:
            r.position = pos
            pos += len(r.output)
        taken[i] = RequestRounds(None if isinstance(key, tuple) else key, i, o, rounds,
                                 logged_offset=rounds[0].logged_position)
    return dict(sorted(taken.items()))


def counters(rounds: list[Round]) -> dict:
    """vLLM's speculative counters over these rounds (rounds without drafts are not verify rounds):
    ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens`` and ``per_position``."""
    drafted = [r for r in rounds if r.draft]
    k = max((len(r.draft) for r in drafted), default=0)
    per = [sum(1 for r in drafted if r.accepted > i) for i in range(k)]
    return {"num_drafts": len(drafted), "num_draft_tokens": sum(len(r.draft) for r in drafted),
            "num_accepted_tokens": sum(r.accepted for r in drafted), "per_position": per}


def round_counts(rounds: list[Round]) -> dict:
    """What a view of these rounds shows: drafts, accepted, rejected, never used, corrections, bonus tokens, and
    the tokens written."""
    return {"rounds": len(rounds), "drafts": sum(len(r.draft) for r in rounds),
            "accepted": sum(r.accepted for r in rounds),
            "rejected": sum(1 for r in rounds if r.rejected is not None),
            "unused": sum(max(0, len(r.draft) - r.accepted - 1) for r in rounds),
            "corrections": sum(1 for r in rounds if not r.bonus and r.target_token is not None),
            "bonus": sum(1 for r in rounds if r.bonus and r.target_token is not None),
            "tokens": sum(len(r.output) for r in rounds)}


def rounds_html(rounds: list[Round], tokenizer, generated: list[int] | None = None, prompt: list[int] | None = None,
                title: str = "", context_chars: int = 28) -> str:
    """One row per verify round: its number, the generated position it starts at, the text just before it (from
    ``prompt`` and ``generated``, the request's token ids, when given), then its tokens coloured by role and how
    many drafts it accepted. A legend and a caption with the counts close it."""
    dec = _Decoder(tokenizer)
    rows = []
    for n, r in enumerate(rounds, start=1):
        toks = [_span(STYLES["accepted"], dec(t), f"draft {p + 1}: accepted") for p, t in enumerate(r.draft[:r.accepted])]
        if r.rejected is not None:
            toks.append(_span(STYLES["rejected"], dec(r.rejected), f"draft {r.accepted + 1}: rejected"))
        if r.target_token is not None:
            role = "bonus" if r.bonus else "correction"
            toks.append(_span(STYLES[role], dec(r.target_token), LABELS[role]))
        toks += [_span(STYLES["unused"], dec(t), f"draft {r.accepted + 2 + p}: after the rejection, never used")
                 for p, t in enumerate(r.draft[r.accepted + 1:])]
        ctx = ""
        if generated is not None and r.position is not None:
            ctx = visible(dec.text(list(prompt or []) + list(generated[:r.position])))[-context_chars:]
        where = "" if r.position is None else str(r.position)
        rows.append(
            '<div style="display:flex;align-items:center;border-bottom:1px solid #f0f0f0">'
            f'<span style="{_NOTE};width:3.5em;flex:none;text-align:right;padding-right:6px">{n}</span>'
            f'<span style="{_NOTE};width:3em;flex:none;text-align:right;padding-right:8px">{where}</span>'
            f'<span style="{_NOTE};width:5em;flex:none;text-align:center">{r.accepted} of {len(r.draft)}</span>'
            f'<span style="{_NOTE};font-family:monospace;width:{context_chars + 1}ch;flex:none;text-align:right;'
            f'white-space:pre;overflow:hidden;padding-right:6px">{_html.escape(ctx)}</span>'
            f'<span style="flex:1">{"".join(toks)}</span></div>')
    head = ('<div style="display:flex;border-bottom:1px solid #bdbdbd">'
            f'<span style="{_NOTE};width:3.5em;flex:none;text-align:right;padding-right:6px">round</span>'
            f'<span style="{_NOTE};width:3em;flex:none;text-align:right;padding-right:8px">pos</span>'
            f'<span style="{_NOTE};width:5em;flex:none;text-align:center">accepted</span>'
            f'<span style="{_NOTE};width:{context_chars + 1}ch;flex:none;text-align:right;padding-right:6px">'
            'text before</span>'
            f'<span style="{_NOTE};flex:1">drafts and the target&#x27;s token of the round (legend above)</span></div>')
    c = round_counts(rounds)
    caption = (f"{count(c['rounds'], 'verify round')}: {count(c['drafts'], 'draft')}, {c['accepted']} accepted, "
               f"{c['rejected']} rejected"
               + (f" ({c['unused']} more after a rejection never used)" if c["unused"] else "")
               + f"; the target added {count(c['corrections'], 'correction')} and {count(c['bonus'], 'bonus token')}: "
               f"{count(c['tokens'], 'token')} written.")
    legend = _legend([(STYLES[k], LABELS[k]) for k in ("accepted", "rejected", "correction", "bonus", "unused")])
    top = f'<div style="font-weight:bold;margin-bottom:2px">{_html.escape(title)}</div>' if title else ""
    return (f'<div style="{_FRAME}">{top}{legend}{head}{"".join(rows)}'
            f'<div style="{_NOTE};margin-top:4px">{_html.escape(caption)}</div></div>')


# -- a run against its reference -------------------------------------------------------------------------------------

def leak_sources(reference: list[list[int]], got: list[list[int]], window: int = 2) -> dict[tuple[int, int], int]:
    """``{(prompt, position): other prompt}`` for each token of ``got`` that differs from its reference and that
    another prompt's reference has within ``window`` positions (the first such prompt): a token that came from that
    request."""
    out = {}
    for i, (ref, g) in enumerate(zip(reference, got)):
        for j, t in enumerate(g):
            if j < len(ref) and ref[j] == t:
                continue
            for i2, r2 in enumerate(reference):
                if i2 != i and t in r2[max(0, j - window):j + window + 1]:
                    out[(i, j)] = i2
                    break
    return out


def divergence_html(reference: list[list[int]], got: list[list[int]], tokenizer,
                    sources: dict[tuple[int, int], int] | None = None, prompts: list[str] | None = None,
                    labels: tuple[str, str] = ("reference", "this run"), prompt_chars: int = 60) -> str:
    """Per prompt, position by position: the reference's token above the run's. The run's token is grey where it is
    the reference's, coloured by the prompt it came from where ``sources`` names one (:func:`leak_sources`), red
    where it differs and no other prompt has it; the reference's token above a difference is framed. A legend and
    a caption with the counts close it."""
    dec = _Decoder(tokenizer)
    sources = sources or {}
    colour = lambda i2: PROMPT_COLOURS[i2 % len(PROMPT_COLOURS)]  # noqa: E731
    leak_style = lambda i2: _BOX + f"{colour(i2)};background:{colour(i2)};color:#ffffff;font-weight:bold"  # noqa: E731
    framed = _BOX + "#252525;background:#ffffff;color:#252525"
    blocks, n_diff, n_leak, total = [], 0, 0, 0
    for i, (ref, g) in enumerate(zip(reference, got)):
        cells = []
        for j in range(max(len(ref), len(g))):
            a = ref[j] if j < len(ref) else None
            b = g[j] if j < len(g) else None
            total += a is not None
            same = a == b
            top = _span(STYLES["same"] if same else framed, "" if a is None else dec(a),
                        f"position {j}: the {labels[0]}'s token")
            if same:
                bottom = _span(STYLES["same"], dec(b), f"position {j}: the {labels[0]}'s token")
            else:
                n_diff += 1
                src = sources.get((i, j))
                if src is not None:
                    n_leak += 1
                    bottom = _span(leak_style(src), "" if b is None else dec(b),
                                   f"position {j}: not the {labels[0]}'s token; prompt {src}'s {labels[0]} has it nearby")
                else:
                    bottom = _span(STYLES["differs"], "∅" if b is None else dec(b),
                                   f"position {j}: not the {labels[0]}'s token")
            cells.append(f'<span style="display:inline-flex;flex-direction:column;margin-right:1px">{top}{bottom}</span>')
        head = f"prompt {i}"
        if prompts is not None and i < len(prompts):
            head += ": …" + visible(prompts[i])[-prompt_chars:]
        blocks.append(
            f'<div style="margin:6px 0"><div style="{_NOTE};font-family:monospace">{_html.escape(head)}</div>'
            '<div style="display:flex;align-items:flex-start">'
            f'<span style="{_NOTE};flex:none;width:7.5em;line-height:24px">{_html.escape(labels[0])}<br>'
            f'{_html.escape(labels[1])}</span><span style="display:flex;flex-wrap:wrap;flex:1">{"".join(cells)}</span>'
            '</div></div>')
    used = sorted(set(sources.values()))
    legend = _legend([(STYLES["same"], f"the {labels[0]}'s token"),
                      (framed, f"the {labels[0]}'s token where {labels[1]} differs"),
                      (STYLES["differs"], "differs, in no other prompt's reference nearby")]
                     + [(leak_style(i2), f"differs: prompt {i2}'s token") for i2 in used])
    caption = (f"{n_diff} of {total} tokens differ from the {labels[0]}; {n_leak} of them are in another prompt's "
               f"{labels[0]} within a few positions (coloured by that prompt).")
    return (f'<div style="{_FRAME}">{legend}{"".join(blocks)}'
            f'<div style="{_NOTE};margin-top:4px">{_html.escape(caption)}</div></div>')


def describe_token(tokenizer, tid: int | None) -> str:
    """``'·over' (id 295)``: a token as text for prose and printouts."""
    if tid is None:
        return "no token"
    return f"'{visible(tokenizer.decode([int(tid)]))}' (id {tid})"
