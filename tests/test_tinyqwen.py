"""tiny-qwen3_5-trained: checkpoint layout against the zoo's weights.json, the drafter's math against transformers,
the target against transformers' own Qwen3_5ForCausalLM loading the shipped checkpoint (no vLLM)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.qwen3_5")

from kit.zoo.tiny import checkpoint, trainers  # noqa: E402
from kit.zoo.tiny.config import Qwen35Config  # noqa: E402
from kit.zoo.tiny.layers import DecoderLayer  # noqa: E402
from kit.zoo.tiny.qwen3_5 import TinyQwen3_5  # noqa: E402
from kit.zoo.tiny.train import compute_losses  # noqa: E402
from drafter_replay import check_replay_matches_training  # noqa: E402 (tests/drafter_replay.py)

ZOO = REPO / "data" / "models" / "tiny-qwen3_5"
TRAINED = trainers.TINY_QWEN_DIR
needs_trained = pytest.mark.skipif(not (TRAINED / "model.safetensors").exists(),
                                   reason="data/models/tiny-qwen3_5-trained has no model.safetensors")


def _model(seed: int = 0, jitter: float = 0.0) -> TinyQwen3_5:
    torch.manual_seed(seed)
    m = TinyQwen3_5(Qwen35Config.from_hf(json.loads((ZOO / "config.json").read_text())))
    m.init_weights(seed)
    if jitter:  # non-trivial norms, gates and projections
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(jitter * torch.randn(p.shape, generator=g))
    return m.eval()


def test_checkpoint_names_and_shapes_equal_zoo_weights_json():
    expected = json.loads((ZOO / "weights.json").read_text())["tensors"]
    sd = _model().checkpoint_state_dict()
    assert {k: list(v.shape) for k, v in sd.items()} == expected
    # and back: the module's names from the checkpoint's
    m = _model(1)
    m.load_state_dict(m.from_checkpoint(sd), strict=True)


def test_init_follows_qwen3_5_conventions():
    sd = _model().checkpoint_state_dict()
    assert torch.equal(sd["model.norm.weight"], torch.zeros(128))  # zero-centred: x * (1 + w)
    assert torch.equal(sd["mtp.pre_fc_norm_hidden.weight"], torch.zeros(128))
    assert torch.equal(sd["model.layers.0.linear_attn.norm.weight"], torch.ones(128))  # gated norm: x * w
    assert (sd["model.layers.0.linear_attn.A_log"].exp() >= 1).all()


def test_drafter_block_equals_transformers_full_attention_layer():
    """The drafter's decoder block (kit.zoo.tiny style, so the chain loss and the draft replay apply) computes what
    transformers' Qwen3_5DecoderLayer (full attention: gated output, q/k norms, partial RoPE) computes."""
    m = _model(2, jitter=0.05)
    hf_layer = m.model.layers[3]
    assert hf_layer.block_type == "full_attention"
    block = {k: v for k, v in m.mtp.state_dict().items() if not k.startswith(("fc.", "pre_fc_norm", "norm."))}
    hf_layer.load_state_dict(block, strict=True)
    x = torch.randn(2, 11, 128, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(11)
    with torch.no_grad():
        ours = DecoderLayer.forward(m.mtp, x, pos)
        theirs = hf_layer(x, position_embeddings=m.model.rotary_emb(x, pos.expand(2, 11)), attention_mask=None)
        assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
        # the gate matters: zeroing it (sigmoid 0.5) changes the output
        m.mtp.self_attn.q_proj.weight.view(4, 128, 128)[:, 64:] = 0
        assert not torch.allclose(DecoderLayer.forward(m.mtp, x, pos), ours, atol=1e-3)


def test_incremental_drafter_matches_training_chain():
    """vLLM's draft loop replayed step by step equals the batched training computation (first pass and chain)."""
    m = _model(3, jitter=0.05)
    seq = torch.randint(3, 2048, (1, 20), generator=torch.Generator().manual_seed(1))
    check_replay_matches_training(m, m.mtp_layer, seq, (0, 6, 16), 1e-4)


def test_training_losses_run_on_the_model():
    m = _model(4)
    m.train()
    batch = torch.randint(0, 2048, (2, 19), generator=torch.Generator().manual_seed(2))
    losses = compute_losses(m, batch, distill=True)
    assert set(losses) == {"trunk", "mtp", "chain", "mtp_distill", "chain_distill"}
    sum(losses.values()).backward()
    assert m.mtp.fc.weight.grad is not None and m.model.layers[0].linear_attn.A_log.grad is not None


def test_quick_training_is_deterministic(tmp_path):
    def quick(out):
        subprocess.run([sys.executable, "-m", "kit", "tiny", "train", "tiny-qwen3_5", "--quick", "--out", str(out)],
                       cwd=REPO, check=True, timeout=300, capture_output=True)
        return json.loads((out / "manifest.json").read_text())

    a, b = quick(tmp_path / "a"), quick(tmp_path / "b")
    assert a["steps"] == 3 and a["storage_dtype"] == "bfloat16"
    assert [h["trunk"] for h in a["loss_history"]] == [h["trunk"] for h in b["loss_history"]]
    assert a["model_safetensors_sha256"] == b["model_safetensors_sha256"]
    checkpoint.load_model(tmp_path / "a")


@needs_trained
def test_trained_dir_is_the_zoo_model_with_weights():
    for f in trainers.DEEPSEEK_COPIED_FILES:
        assert (TRAINED / f).read_bytes() == (ZOO / f).read_bytes(), f
    from safetensors.torch import load_file

    sd = load_file(str(TRAINED / "model.safetensors"))
    expected = json.loads((ZOO / "weights.json").read_text())["tensors"]
    assert {k: list(v.shape) for k, v in sd.items()} == expected
    assert {v.dtype for v in sd.values()} == {torch.bfloat16}


@needs_trained
def test_trained_target_equals_transformers_qwen3_5_for_causal_lm():
    """The shipped checkpoint loaded by transformers' own Qwen3_5ForCausalLM (which drops ``mtp.*``) gives the
    logits of our model: the target's names and math are transformers' (and so vLLM's loader's)."""
    from transformers import Qwen3_5ForCausalLM

    hf = Qwen3_5ForCausalLM.from_pretrained(str(TRAINED), dtype=torch.float32).eval()
    ours = checkpoint.load_model(TRAINED)
    ids = torch.randint(3, 2048, (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = hf(ids).logits
        b = ours.logits(ours.hidden(ids))
    assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
