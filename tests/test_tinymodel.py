"""tiny-mimo: checkpoint layout, deterministic quick training, and (engine) vLLM parity/acceptance."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kit.checks.compare import load_prompts  # noqa: E402
from kit.zoo.tiny import checkpoint, config  # noqa: E402
from kit.zoo.tiny.mimo import TinyMiMo  # noqa: E402
from kit.zoo.tiny.tokenizer import encode_prompt  # noqa: E402
from drafter_replay import check_replay_matches_training  # noqa: E402 (tests/drafter_replay.py)

MODEL_DIR = REPO / "data" / "models" / "tiny-mimo"

needs_model = pytest.mark.skipif(not (MODEL_DIR / "model.safetensors").exists(),
                                 reason="data/models/tiny-mimo has no model.safetensors")


@needs_model
def test_checkpoint_names_and_shapes_match_pytorch_model():
    import torch
    from safetensors import safe_open

    cfg = json.loads((MODEL_DIR / "config.json").read_text())
    assert cfg["architectures"] == ["MiMoForCausalLM"]
    assert cfg["model_type"] == "qwen2"
    assert cfg["num_nextn_predict_layers"] == 1
    assert cfg["num_hidden_layers"] == 4
    assert cfg["hidden_size"] // cfg["num_attention_heads"] in (64, 128)
    assert cfg["tie_word_embeddings"] is False

    mc = config.ModelConfig.from_hf(cfg)
    model = TinyMiMo(mc)
    expected = {k: list(v.shape) for k, v in model.state_dict().items()}
    with safe_open(str(MODEL_DIR / "model.safetensors"), framework="pt") as f:
        stored = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    assert stored == expected
    manifest = json.loads((MODEL_DIR / "weights.json").read_text())["tensors"]
    assert manifest == expected

    # The MTP layer in the layout vLLM's MiMoMTP.load_weights maps (block names directly under the layer).
    for name in ("token_layernorm.weight", "hidden_layernorm.weight", "input_proj.weight",
                 "final_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias",
                 "mlp.gate_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"):
        assert f"model.mtp_layers.0.{name}" in stored
    assert stored["model.mtp_layers.0.input_proj.weight"] == [mc.hidden_size, 2 * mc.hidden_size]
    assert "lm_head.weight" in stored and "model.embed_tokens.weight" in stored

    loaded = checkpoint.load_model(MODEL_DIR)  # strict load
    ids = torch.tensor([encode_prompt(MODEL_DIR / "tokenizer.json", "def f(x):\n    return")])
    h = loaded.hidden(ids)
    logits = loaded.logits(h)
    mtp = loaded.mtp_logits(loaded.mtp_hidden(h[:, :-1], ids[:, 1:], torch.arange(ids.shape[1] - 1)))
    assert torch.isfinite(logits).all() and torch.isfinite(mtp).all()
    assert logits.shape[-1] == mtp.shape[-1] == mc.vocab_size


@needs_model
def test_model_dir_files_and_manifest():
    for f in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
              "generation_config.json", "weights.json", "manifest.json"):
        assert (MODEL_DIR / f).exists(), f
    m = json.loads((MODEL_DIR / "manifest.json").read_text())
    assert m["model_safetensors_sha256"] == checkpoint.sha256_file(MODEL_DIR / "model.safetensors")
    assert sum(p.stat().st_size for p in MODEL_DIR.iterdir()) < 50 * 2**20
    tcfg = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())
    assert tcfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    ids = encode_prompt(MODEL_DIR / "tokenizer.json", "import os\n")
    assert ids[0] == config.BOS_ID


@needs_model
def test_autotokenizer_loads_model_dir():
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))
    text = "def add(a, b):\n    return a + b\n"
    ids = tok(text)["input_ids"]
    assert ids == encode_prompt(MODEL_DIR / "tokenizer.json", text)
    assert tok.bos_token_id == config.BOS_ID and tok.eos_token_id == config.EOS_ID
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_prompt_files():
    for name, n in (("default", 16), ("heldout", 8)):
        prompts = load_prompts(config.PROMPTS_DIR / f"{name}.jsonl")
        assert len(prompts) == n and len(set(prompts)) == n
    assert not set(load_prompts(config.PROMPTS_DIR / "default.jsonl")) & set(
        load_prompts(config.PROMPTS_DIR / "heldout.jsonl"))


def _quick(out: Path, seed: int = 0) -> dict:
    subprocess.run([sys.executable, "-m", "kit", "tiny", "train", "tiny-mimo", "--quick", "--seed", str(seed), "--out", str(out)],
                   cwd=REPO, check=True, timeout=300, capture_output=True)
    return json.loads((out / "manifest.json").read_text())


def test_quick_training_is_deterministic(tmp_path):
    a = _quick(tmp_path / "a")
    b = _quick(tmp_path / "b")
    assert a["steps"] == 3
    assert [h["trunk"] for h in a["loss_history"]] == [h["trunk"] for h in b["loss_history"]]
    assert [h["mtp"] for h in a["loss_history"]] == [h["mtp"] for h in b["loss_history"]]
    assert a["final_trunk_loss"] == b["final_trunk_loss"]
    assert a["final_mtp_loss"] == b["final_mtp_loss"]
    assert a["model_safetensors_sha256"] == b["model_safetensors_sha256"]
    assert a["tokenizer"]["sha256_tokenizer_json"] == b["tokenizer"]["sha256_tokenizer_json"]
    # the quick model loads back into the PyTorch model with the names it saved
    checkpoint.load_model(tmp_path / "a")


@pytest.mark.engine
@needs_model
def test_parity_with_vllm(kit_json):
    res = kit_json("tiny", "parity", "--model", MODEL_DIR, "--n", "4", "--max-tokens", "32")
    assert res["ok"], json.dumps(res, indent=1)[:4000]


@pytest.mark.slow  # CI: the trained MTP cells of tests/test_correctness.py assert first-position acceptance >= 0.5
@pytest.mark.engine
@needs_model
def test_mtp_k1_acceptance_on_default_prompts(kit_json):
    run = kit_json("tiny", "acceptance", "--model", MODEL_DIR, "--k", "1", "--max-tokens", "64")["runs"][0]["sets"]["default"]
    assert run["drafts"] > 0
    assert run["acceptance_rate_per_pos"][0] >= 0.5, run


def test_incremental_drafter_matches_training_chain():
    """The step-by-step drafter simulation (vLLM's draft loop) equals the batched training
    computation: first pass == mtp_hidden, second application == forward_chain."""
    import torch

    torch.manual_seed(0)
    mc = config.ModelConfig(vocab_size=64, hidden_size=128, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = TinyMiMo(mc)
    model.init_weights(1)
    with torch.no_grad():  # non-trivial norms and biases
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn(p.shape))
    model.eval()
    check_replay_matches_training(model, model.model.mtp_layers[0], torch.randint(3, 64, (1, 24)), (0, 5, 20), 1e-5)
