"""kit.lab.tokens_view (verify rounds and a run against its reference, as HTML) and the acceptance probe's
verify-round log, with a fake tokenizer and fake sampler tensors: no engine."""
import re
from types import SimpleNamespace

import pytest

from kit.lab import tokens_view as tv


class FakeTokenizer:
    """Token id n decodes to the n-th word of a small vocabulary."""

    words = ["<s>", "def", " main", "():", "\n", "    ", "return", " 0", " x", " y", "+", "=", " 1", " 2"]

    def decode(self, ids):
        return "".join(self.words[i] for i in ids)


TOK = FakeTokenizer()


def _spans(block: str, role: str) -> list[str]:
    """The texts of the spans drawn in ``role``'s style."""
    style = re.escape(tv.STYLES[role])
    return re.findall(rf'<span style="{style}"[^>]*>([^<]*)</span>', block)


def test_round_roles_accepted_rejected_correction_bonus_unused():
    r = tv.Round(draft=[1, 2, 9], output=[1, 2, 3])   # two accepted, the third rejected, the target wrote 3
    assert (r.accepted, r.rejected, r.target_token, r.bonus) == (2, 9, 3, False)
    r = tv.Round(draft=[4, 8, 9], output=[4, 5])      # one accepted, 8 rejected, 9 never used
    assert (r.accepted, r.rejected, r.target_token, r.bonus) == (1, 8, 5, False)
    r = tv.Round(draft=[1, 2], output=[1, 2, 3])      # all accepted: the target's token is the bonus
    assert (r.accepted, r.rejected, r.target_token, r.bonus) == (2, None, 3, True)
    r = tv.Round(draft=[], output=[6])                 # no drafts: only the target's token
    assert (r.accepted, r.rejected, r.target_token, r.bonus) == (0, None, 6, True)


def test_rounds_html_colours_each_role_and_counts_them():
    rounds = [tv.Round([1, 2, 9], [1, 2, 3], position=1), tv.Round([4, 8, 9], [4, 5], position=4),
              tv.Round([6, 7], [6, 7, 12], position=6)]
    block = tv.rounds_html(rounds, TOK, generated=[0, 1, 2, 3, 4, 5, 6, 7, 12], prompt=[0], title="prompt 0")
    # Legend spans read "tok"; the rest are the rounds' tokens, whitespace drawn.
    assert _spans(block, "accepted") == ["tok", "def", "·main", "↵", "return", "·0"]
    assert _spans(block, "rejected") == ["tok", "·y", "·x"]
    assert _spans(block, "correction") == ["tok", "():", "····"]
    assert _spans(block, "bonus") == ["tok", "·1"]
    assert _spans(block, "unused") == ["tok", "·y"]
    assert "3 verify rounds: 8 drafts, 5 accepted, 2 rejected (1 more after a rejection never used); the target " \
           "added 2 corrections and 1 bonus token: 8 tokens written." in block
    # The text before each round: the prompt and the generated tokens before its position.
    assert "&lt;s&gt;&lt;s&gt;def·main():↵" in block
    assert "<script" not in block and "class=" not in block   # inline styles only: survives nbconvert as is


def test_rounds_html_escapes_token_text():
    class Angle:
        def decode(self, ids):
            return "<b>&" if ids == [1] else "x"

    block = tv.rounds_html([tv.Round([1], [1, 2])], Angle())
    assert "&lt;b&gt;&amp;" in block and "<b>&" not in block


def _log(entries):
    return [dict({"step": s, "row": r, "draft": d, "output": o, "req_id": q, "position": p, "discarded": x})
            for s, r, d, o, q, p, x in entries]


def test_match_requests_finds_each_request_by_its_tokens_and_counts_like_vllm():
    generated = [[5, 1, 2, 3, 4, 6, 7], [9, 8, 8, 7, 6, 5, 4]]
    log = _log([
        (0, 0, [1, 2], [1, 2, 3], "b-1", 1, False),     # request b-1 is prompt 0
        (0, 1, [8, 3], [8, 8], "a-0", 1, False),        # request a-0 is prompt 1
        (1, 0, [4, 9], [4, 6], "b-1", 4, False),
        (1, 1, [7, 6], [7, 6, 5], "a-0", 3, False),
        (1, 2, [], [1], "c-2", 0, True),                # a prefill chunk the runner discarded: left out
        (2, 0, [7, 1], [7, 1], "b-1", 6, False),        # ran past max_tokens: only 7 is in the output
        (2, 1, [4, 4], [4, 3], "a-0", 6, False),
    ])
    m = tv.match_requests(log, generated)
    assert sorted(m) == [0, 1]
    assert (m[0].req_id, m[0].offset, m[0].logged_offset) == ("b-1", 1, 1)
    assert (m[1].req_id, m[1].offset) == ("a-0", 1)
    assert [r.position for r in m[0].rounds] == [1, 4, 6]
    assert m[0].positions_agree and m[1].positions_agree
    assert [r.draft for r in m[0].verify_rounds] == [[1, 2], [4, 9], [7, 1]]
    assert m[1].tokens[:6] == generated[1][1:]
    c = tv.counters([r for rr in m.values() for r in rr.rounds])
    assert c == {"num_drafts": 6, "num_draft_tokens": 12, "num_accepted_tokens": 8, "per_position": [6, 2]}


def test_match_requests_without_positions_searches_and_leaves_strangers_out():
    generated = [[1, 2, 3, 4], [1, 2, 3, 4]]
    log = _log([(0, 0, [2], [2, 3], "x", None, None), (0, 1, [2], [2, 3], "y", None, None),
                (0, 2, [9], [9, 9], "z", None, None)])
    m = tv.match_requests(log, generated)
    # The same continuation twice: each request takes the first prompt not yet taken; "z" matches none.
    assert {i: (rr.req_id, rr.offset) for i, rr in m.items()} == {0: ("x", 1), 1: ("y", 1)}
    assert not m[0].positions_agree   # nothing logged to agree with


def test_leak_sources_and_divergence_html():
    reference = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    got = [[1, 2, 8, 4, 11], [6, 7, 8, 9, 10]]
    src = tv.leak_sources(reference, got)
    assert src == {(0, 2): 1}                      # 8 is prompt 1's token two positions away; 11 is nobody's
    words = [f" w{i}" for i in range(12)]

    class Words:
        def decode(self, ids):
            return "".join(words[i] for i in ids)

    block = tv.divergence_html(reference, got, Words(), sources=src, prompts=["p0", "p1"],
                               labels=("reference", "gate off"))
    assert _spans(block, "differs")[-1] == "·w11"
    leak = tv._BOX + f"{tv.PROMPT_COLOURS[1]};background:{tv.PROMPT_COLOURS[1]};color:#ffffff;font-weight:bold"
    assert re.findall(rf'<span style="{re.escape(leak)}"[^>]*>([^<]*)</span>', block) == ["tok", "·w8"]
    assert "2 of 10 tokens differ from the reference; 1 of them are in another prompt&#x27;s reference" in block
    assert "differs: prompt 1&#x27;s token" in block


def test_describe_token():
    assert tv.describe_token(TOK, 2) == "'·main' (id 2)"
    assert tv.describe_token(TOK, None) == "no token"


# -- the probe's log ---------------------------------------------------------------------------------------------

def test_probe_log_keeps_each_rows_drafts_and_written_tokens_up_to_its_limit(monkeypatch):
    torch = pytest.importorskip("torch")
    from kit.worker import acceptance_probe as ap

    monkeypatch.setattr(ap, "_LOG", {"limit": 4, "rounds": [], "dropped": 0, "steps": 0})
    P = -1
    meta = SimpleNamespace(num_draft_tokens=[2, 0, 2], draft_token_ids=torch.tensor([5, 6, 7, 8]))
    out = torch.tensor([[5, 9, P], [3, P, P], [7, 8, 4]])
    rows = [{"req_id": "a", "position": 3, "discarded": False}, {"req_id": "b", "position": 0, "discarded": True},
            {"req_id": "c", "position": 7, "discarded": False}]
    ap._log_rounds(meta, out, P, rows)
    ap._log_rounds(meta, out, P, rows)
    log = ap._LOG
    assert [(e["step"], e["row"], e["draft"], e["output"], e["req_id"]) for e in log["rounds"]] == [
        (0, 0, [5, 6], [5, 9], "a"), (0, 1, [], [3], "b"), (0, 2, [7, 8], [7, 8, 4], "c"), (1, 0, [5, 6], [5, 9], "a")]
    assert (log["dropped"], log["steps"]) == (2, 2)


def test_probe_read_has_a_log_only_when_one_was_asked_for(monkeypatch):
    from kit.worker import acceptance_probe as ap

    monkeypatch.setattr(ap, "_STATS", ap._empty())
    monkeypatch.setattr(ap, "_LOG", None)
    assert "log" not in ap.read()
    monkeypatch.setattr(ap, "_LOG", {"limit": 2, "rounds": [{"x": 1}], "dropped": 0, "steps": 1})
    assert ap.read()["log"]["rounds"] == [{"x": 1}]


def test_count():
    assert (tv.count(1, "bonus token"), tv.count(0, "draft"), tv.count(3, "draft")) == \
        ("1 bonus token", "0 drafts", "3 drafts")


def test_load_tokenizer_reads_the_models_tokenizer_json():
    from conftest import MODEL

    from kit.core.models import resolve_model

    path = resolve_model(MODEL).path
    if not (path / "tokenizer.json").exists():
        pytest.skip(f"{MODEL} has no tokenizer.json")
    from tokenizers import Tokenizer

    tok = tv.load_tokenizer(MODEL)
    ids = Tokenizer.from_file(str(path / "tokenizer.json")).encode("def main():\n    return 0", add_special_tokens=False).ids
    assert tok.decode(ids) == "def main():\n    return 0"
    assert "".join(tok.decode([t]) for t in ids) == "def main():\n    return 0"
