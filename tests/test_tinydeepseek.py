"""tiny-deepseek-v3-trained: checkpoint layout against the zoo's weights.json, model math helpers."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

torch = pytest.importorskip("torch")

from kit.zoo.tiny import checkpoint, trainers  # noqa: E402
from kit.zoo.tiny import deepseek as td  # noqa: E402
from kit.zoo.tiny.config import DSConfig  # noqa: E402
from kit.zoo.tiny.layers import InterleavedRotary  # noqa: E402
from kit.zoo.tiny.tokenizer import encode_prompt  # noqa: E402
from kit.zoo.tiny.train import compute_losses  # noqa: E402

ZOO = REPO / "data" / "models" / "tiny-deepseek-v3"
TRAINED = trainers.TINY_DEEPSEEK_DIR
needs_trained = pytest.mark.skipif(not (TRAINED / "model.safetensors").exists(),
                                   reason="data/models/tiny-deepseek-v3-trained has no model.safetensors")


def _zoo_model(seed: int = 0) -> td.TinyDeepseekV3:
    torch.manual_seed(seed)
    m = td.TinyDeepseekV3(DSConfig.from_hf(json.loads((ZOO / "config.json").read_text())))
    m.init_weights(seed)
    return m.eval()


def test_checkpoint_names_and_shapes_equal_zoo_weights_json():
    expected = json.loads((ZOO / "weights.json").read_text())["tensors"]
    sd = _zoo_model().checkpoint_state_dict()
    assert {k: list(v.shape) for k, v in sd.items()} == expected
    n = json.loads((ZOO / "config.json").read_text())["num_hidden_layers"]
    assert torch.equal(sd[f"model.layers.{n}.embed_tokens.weight"], sd["model.embed_tokens.weight"])
    assert torch.equal(sd[f"model.layers.{n}.shared_head.head.weight"], sd["lm_head.weight"])


def test_forward_shapes_and_determinism():
    torch.set_num_threads(1)
    m1, m2 = _zoo_model(3), _zoo_model(3)
    ids = torch.randint(0, m1.mc.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        h = m1.hidden(ids)
        logits = m1.logits(h)
        mtp = m1.mtp_logits(m1.mtp_hidden(h[:, :-1], ids[:, 1:], torch.arange(11)))
        assert h.shape == (2, 12, 128) and logits.shape == (2, 12, 2048) and mtp.shape == (2, 11, 2048)
        assert torch.isfinite(logits).all() and torch.isfinite(mtp).all()
        assert torch.equal(logits, m2.logits(m2.hidden(ids)))
        # causal: appending tokens does not change earlier logits
        assert torch.allclose(m1.logits(m1.hidden(ids[:, :6])), logits[:, :6], atol=1e-5)


def test_interleaved_rope_is_pairwise_and_relative():
    rot = InterleavedRotary(8, 64, 10000.0)
    x = torch.randn(1, 1, 1, 8)
    y = rot(x, torch.tensor([[5]]))
    # GPT-J style: each adjacent pair keeps its norm
    assert torch.allclose(x.view(4, 2).norm(dim=-1), y.view(4, 2).norm(dim=-1), atol=1e-6)
    # dot products depend only on the position difference
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    d1 = (rot(q, torch.tensor([[7]])) * rot(k, torch.tensor([[3]]))).sum()
    d2 = (rot(q, torch.tensor([[14]])) * rot(k, torch.tensor([[10]]))).sum()
    assert torch.allclose(d1, d2, atol=1e-5)


def test_mtp_input_order_and_position_zero_mask():
    m = _zoo_model()
    layer = m.model.mtp_layers[0]
    e, h = torch.randn(1, 2, 128), torch.randn(1, 2, 128)
    out = layer.mtp_input(e, torch.tensor([0, 1]), h)
    W = layer.eh_proj.weight
    # [enorm(embedding), hnorm(hidden)]; the embedding is zeroed at position 0
    assert torch.allclose(out[0, 0], W[:, 128:] @ layer.hnorm(h[0, 0]), atol=1e-5)
    assert torch.allclose(out[0, 1], W[:, :128] @ layer.enorm(e[0, 1]) + W[:, 128:] @ layer.hnorm(h[0, 1]),
                          atol=1e-5)


def test_no_q_rope_keeps_rows_zero_and_makes_rope_irrelevant():
    c = DSConfig.from_hf(json.loads((ZOO / "config.json").read_text()))
    m = td.TinyDeepseekV3(c, q_rope=False)
    m.init_weights(0)
    a = m.model.layers[0].self_attn
    assert not a.q_b_proj.weight.view(a.nh, a.hd, -1)[:, a.nope:].any()
    with torch.no_grad():  # nonzero rows in the stored weight are masked out in the forward pass
        a.q_b_proj.weight.view(a.nh, a.hd, -1)[:, a.nope:] = 1.0
    x = torch.randn(1, 5, 128)
    q, k, _ = a.qkv(x, torch.arange(5))
    assert not q[..., a.nope:].any()
    q2, _, _ = a.qkv(x, torch.arange(5) + 7)  # positions change nothing in the scores
    assert torch.equal(q, q2)
    loss = compute_losses(m.train(), torch.randint(0, 2048, (1, 11)))["trunk"]
    loss.backward()
    assert not a.q_b_proj.weight.grad.view(a.nh, a.hd, -1)[:, a.nope:].any()


def test_training_losses_run_on_the_model():
    m = _zoo_model()
    batch = torch.randint(0, 2048, (2, 19), generator=torch.Generator().manual_seed(1))
    losses = compute_losses(m.train(), batch)
    assert set(losses) == {"trunk", "mtp", "chain"}
    assert all(7.0 < float(v.detach()) < 8.5 for v in losses.values())  # ~ln(2048) at init


@needs_trained
def test_trained_dir_loads_with_zoo_config_and_tokenizer():
    for f in trainers.DEEPSEEK_COPIED_FILES:
        assert (TRAINED / f).read_bytes() == (ZOO / f).read_bytes(), f
    manifest = json.loads((TRAINED / "manifest.json").read_text())
    assert manifest["model_safetensors_sha256"] == checkpoint.sha256_file(TRAINED / "model.safetensors")
    assert (TRAINED / "model.safetensors").stat().st_size < 20 * 2**20
    from kit.core.models import resolve_model

    assert resolve_model("tiny-deepseek-v3-trained").has_trained_weights
    m = checkpoint.load_model(TRAINED)  # strict, and checks the tied copies
    if not manifest["q_rope"]:  # q's rope rows exactly 0 (vLLM 0.32 CPU rotary op, see kit/zoo/tiny/deepseek.py)
        for layer in m.model.layers:
            a = layer.self_attn
            assert not a.q_b_proj.weight.view(a.nh, a.hd, -1)[:, a.nope:].any()
    ids = torch.tensor([encode_prompt(TRAINED / "tokenizer.json", "import os\nimport sys\n")])
    with torch.no_grad():
        lp = torch.log_softmax(m.logits(m.hidden(ids))[0, -1], -1)
    top2 = lp.topk(2).values
    assert float(top2[0] - top2[1]) > 0.01  # trained: not the random weights' near-ties
