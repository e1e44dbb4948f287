"""tiny-llama-swa-trained and its Eagle3 drafter: checkpoint layout against the zoo's weights.json, the sliding
window and the drafter's second step as vLLM computes them, and a few training steps (no vLLM engine)."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from kit.core.models import MODELS_DIR, resolve_model  # noqa: E402
from kit.zoo.tiny import checkpoint, trainers  # noqa: E402
from kit.zoo.tiny.config import tiny_llama_swa_config  # noqa: E402
from kit.zoo.tiny.layers import window_mask  # noqa: E402
from kit.zoo.tiny.llama_eagle3 import LlamaSWAConfig, TinyLlamaEagle3  # noqa: E402
from kit.zoo.tiny.train import compute_losses  # noqa: E402

ZOO, ZOO_DRAFT = MODELS_DIR / "tiny-llama-swa", MODELS_DIR / "tiny-llama-swa-eagle3"
TRAINED, DRAFT = trainers.TINY_LLAMA_DIR, MODELS_DIR / "tiny-llama-swa-trained-eagle3"


def _cfg() -> LlamaSWAConfig:
    return LlamaSWAConfig.from_hf(json.loads((ZOO / "config.json").read_text()),
                                  json.loads((ZOO_DRAFT / "config.json").read_text()))


def _model(seed: int = 0) -> TinyLlamaEagle3:
    m = TinyLlamaEagle3(_cfg())
    m.init_weights(seed)
    return m.eval()


def test_config_read_from_the_zoo():
    c = _cfg()
    assert c.layer_types == ["sliding_attention", "full_attention"] * 2 and c.sliding_window == 32
    assert c.aux_layer_ids == [1, 2, 3] and c.draft_layer_types == ["sliding_attention"] and c.head_dim == 32


def test_checkpoint_names_and_shapes_equal_weights_json():
    m = _model()
    target = {k: list(v.shape) for k, v in m.checkpoint_state_dict().items()}
    assert target == json.loads((ZOO / "weights.json").read_text())["tensors"]
    drafter = {k: list(v.shape) for k, v in m.drafter_state_dict().items()}
    zoo_drafter = json.loads((ZOO_DRAFT / "weights.json").read_text())["tensors"]
    # The zoo's drafter has no embedding; the trained one carries the target's (vLLM shares it only at PP=1).
    assert drafter == {**zoo_drafter, "embed_tokens.weight": [2048, 128]}


def test_sliding_window_mask():
    pos = torch.arange(40)
    m = window_mask(pos, pos, 32)
    assert m[35, 4] and not m[35, 3] and not m[3, 4] and m[3, 3]
    assert window_mask(pos, pos, 0)[39, 0]


def test_sliding_layer_forgets_beyond_the_window():
    """A sliding-only stack's output at position t does not depend on tokens 32 or more positions back."""
    c = _cfg()
    c.layer_types = ["sliding_attention"]
    m = TinyLlamaEagle3(c)
    m.init_weights(1)
    ids = torch.randint(3, 2048, (1, 40), generator=torch.Generator().manual_seed(0))
    other = ids.clone()
    other[0, 2] = (ids[0, 2] + 7) % 2048
    with torch.no_grad():
        a, b = m.logits(m.hidden(ids)), m.logits(m.hidden(other))
    assert torch.equal(a[0, 34:], b[0, 34:]) and not torch.allclose(a[0, 2:34], b[0, 2:34])


def test_chain_step_equals_one_longer_forward():
    """The chained second draft at slot i equals the drafter's attention over the first pass's keys 0..i plus its
    own key: the same as a first pass over a sequence whose slot i+1 holds the chained input."""
    m = _model(2)
    T = 12
    ids = torch.randint(3, 2048, (1, T + 3), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(T)
    with torch.no_grad():
        h = m.hidden(ids[:, :T], pos)
        kv: list = []
        first = m.mtp_hidden(h, ids[:, 1:T + 1], pos, kv_out=kv)
        layer = m.mtp_layer
        chained = layer.mtp_forward_chain(m.model.embed_tokens(ids[:, 2:T + 2]), pos + 1, first, *kv[0])
        i = 5   # recompute slot i: first-pass inputs at 0..i, then the chained input at position i+1
        g = m.eagle3.fc(h[..., m.mc.hidden_size:])
        emb = torch.cat([m.model.embed_tokens(ids[:, 1:i + 2]), m.model.embed_tokens(ids[:, i + 2:i + 3])], dim=1)
        gin = torch.cat([g[:, :i + 1], first[:, i:i + 1]], dim=1)
        direct = layer.mtp_forward(emb, torch.arange(i + 2), gin)
    torch.testing.assert_close(chained[0, i], direct[0, i + 1], rtol=1e-5, atol=1e-5)


def test_quick_training_writes_target_and_drafter(tmp_path):
    out = tmp_path / "tiny-llama-swa-trained"
    m = trainers.train_tiny_llama_eagle3(tiny_llama_swa_config(quick=True), out, log=lambda *_: None)
    draft = tmp_path / "tiny-llama-swa-trained-eagle3"
    assert json.loads((out / "kit.json").read_text()) == {"draft_model": "../tiny-llama-swa-trained-eagle3"}
    assert m["drafter"]["model_safetensors_sha256"] == checkpoint.sha256_file(draft / "model.safetensors")
    assert resolve_model(out).draft_model == draft.resolve()
    losses = compute_losses(checkpoint.load_model(out), torch.randint(3, 2048, (2, 19)))
    assert set(losses) == {"trunk", "mtp", "chain"}


def test_shipped_checkpoints():
    for d in (TRAINED, DRAFT):
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["model_safetensors_sha256"] == checkpoint.sha256_file(d / "model.safetensors"), d
    assert resolve_model("tiny-llama-swa-trained").draft_model == DRAFT.resolve()
    checkpoint.load_model(TRAINED)   # strict
