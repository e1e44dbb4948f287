"""The tiny-model zoo under data/models/ matches what kit/zoo/write.py generates (no vLLM engine)."""
from __future__ import annotations

import json

import pytest

from kit.zoo import write as zoo
from kit.core.models import MODELS_DIR, resolve_model


@pytest.fixture(scope="module", params=zoo.ZOO)
def name(request):
    return request.param


def _read_json(path):
    return json.loads(path.read_text())


def test_zoo_dir_has_files(name):
    d = MODELS_DIR / name
    assert d.is_dir(), f"{d} missing: run kit zoo"
    for f in ("config.json", "generation_config.json", "weights.json", *zoo.TOKENIZER_FILES):
        assert (d / f).is_file(), f"{d / f} missing"
    assert not (d / "model.safetensors").exists(), "zoo models ship no weights (random_checkpoint writes them)"


def test_zoo_files_match_generator(name):
    d = MODELS_DIR / name
    for fname, text in zoo.model_files(name).items():
        assert _read_json(d / fname) == json.loads(text), f"{d / fname} differs from kit/zoo/write.py: run kit zoo"


def test_weights_manifest_matches_generator(name):
    d = MODELS_DIR / name
    on_disk = _read_json(d / "weights.json")
    assert on_disk == zoo.weights_manifest(_read_json(d / "config.json"))
    assert on_disk == zoo.weights_manifest(zoo.config(name))
    for tname, shape in on_disk["tensors"].items():
        assert shape and all(isinstance(x, int) and x > 0 for x in shape), (tname, shape)


def test_mtp_layer_in_manifest(name):
    cfg = zoo.config(name)
    tensors = zoo.weights_manifest(cfg)["tensors"]
    n = cfg["num_hidden_layers"]
    layers = {int(k.split(".")[2]) for k in tensors if k.startswith("model.layers.")}
    if cfg["architectures"][0].endswith("Eagle3"):
        assert any(k.startswith("midlayer.") for k in tensors) and "fc.weight" in tensors
        return
    if cfg.get("mtp_num_hidden_layers"):  # Qwen3.5: MTP module under mtp.*
        n_mtp = cfg["mtp_num_hidden_layers"]
        assert layers == set(range(n))
        assert {int(k.split(".")[2]) for k in tensors if k.startswith("mtp.layers.")} == set(range(n_mtp))
        for part in ("fc", "pre_fc_norm_hidden", "pre_fc_norm_embedding", "norm"):
            assert f"mtp.{part}.weight" in tensors
        assert resolve_model(MODELS_DIR / name).num_mtp_layers == n_mtp
        return
    n_mtp = cfg.get("num_nextn_predict_layers", 0)
    if cfg["architectures"][0] == "LlamaForCausalLM":  # Eagle3 target: no MTP layer
        assert n_mtp == 0 and layers == set(range(n))
        return
    assert n_mtp >= 1
    assert layers == set(range(n + n_mtp))
    for i in range(n, n + n_mtp):
        for part in ("enorm", "hnorm", "eh_proj", "shared_head.norm", "shared_head.head"):
            assert f"model.layers.{i}.{part}.weight" in tensors
    assert resolve_model(MODELS_DIR / name).num_mtp_layers == n_mtp


def test_tokenizer_loads_and_fits_vocab(name):
    from tokenizers import Tokenizer

    d = MODELS_DIR / name
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    cfg = _read_json(d / "config.json")
    assert tok.get_vocab_size() <= cfg["vocab_size"]
    assert tok.token_to_id(zoo.EOS_TOKEN) == cfg["eos_token_id"]
    text = "def f(x):\n    return x + 1\n"
    assert tok.decode(tok.encode(text).ids) == text


def test_tokenizer_same_everywhere():
    ref = {f: (MODELS_DIR / zoo.ZOO[0] / f).read_bytes() for f in zoo.TOKENIZER_FILES}
    for name in zoo.ZOO[1:]:
        for f, data in ref.items():
            assert (MODELS_DIR / name / f).read_bytes() == data, f"{name}/{f} differs from {zoo.ZOO[0]}/{f}"


def test_auto_tokenizer_loads():
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(MODELS_DIR / zoo.ZOO[0]))
    assert len(tok) == zoo.VOCAB_SIZE
    assert tok.eos_token_id == 0 and tok.pad_token_id == 1


def test_eagle3_draft_named_in_kit_json():
    info = resolve_model("tiny-llama-swa")
    draft = info.draft_model
    assert draft is not None and draft == (MODELS_DIR / "tiny-llama-swa-eagle3").resolve()
    dinfo = resolve_model(draft)
    assert dinfo.is_eagle3_draft
    dc, tc = dinfo.config, info.config
    assert dc["target_hidden_size"] == tc["hidden_size"]
    assert dc["draft_vocab_size"] == tc["vocab_size"]
    ids = dc["eagle_aux_hidden_state_layer_ids"]
    assert ids == dc["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert all(0 <= i < tc["num_hidden_layers"] for i in ids)
    # vLLM indexes the draft's layer_types draft-relatively (layer index - target layer count).
    assert len(dc["layer_types"]) == dc["num_hidden_layers"]
    assert len(tc["layer_types"]) == tc["num_hidden_layers"]
    assert {"sliding_attention", "full_attention"} == set(tc["layer_types"])


def test_random_checkpoint_from_manifest(tmp_path, monkeypatch):
    """random_checkpoint writes exactly the manifest's tensors (small model only, to stay fast)."""
    from kit.core.models import random_checkpoint, weights_manifest_from_safetensors

    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path))
    info = resolve_model("tiny-llama-swa-eagle3")
    out = random_checkpoint(info, seed=1)
    assert weights_manifest_from_safetensors(out / "model.safetensors") == _read_json(info.path / "weights.json")


def test_every_zoo_target_is_in_the_correctness_matrix():
    """Each zoo model with a drafter has matrix cells at PP 2 and 4 for k 1..3, on its random weights or on its
    trained variant (zoo.TRAINED); Qwen3.5 (a recurrent state per request on each stage) also at PP 1, with
    max_num_seqs below the prompt count."""
    from kit.checks.matrix import CELLS, NUM_PROMPTS

    for name in zoo.ZOO:
        if zoo.config(name)["architectures"][0].endswith("Eagle3"):
            continue
        variants = {t for t, base in zoo.TRAINED.items() if base == name}
        cells = {(c.pp, c.spec) for c in CELLS if (c.model == name and c.random) or c.model in variants}
        for pp in (2, 4):
            for k in (1, 2, 3):
                assert any(p == pp and s.endswith(f":{k}") for p, s in cells), (name, pp, k)
    q = [c for c in CELLS if c.model == "tiny-qwen3_5-trained"]
    assert {c.pp for c in q} == {1, 2, 4}
    assert {c.pp for c in q if c.max_num_seqs and c.max_num_seqs < NUM_PROMPTS} == {1, 2, 4}


@pytest.mark.parametrize("trained", sorted(zoo.TRAINED))
def test_trained_variants_carry_their_zoo_model_unchanged(trained):
    """A trained variant is its zoo model plus weights: same config, tokenizer and weights.json, and a
    model.safetensors holding exactly weights.json's tensors (what --random writes for the zoo model)."""
    from safetensors import safe_open

    base, d = MODELS_DIR / zoo.TRAINED[trained], MODELS_DIR / trained
    for f in ("config.json", "generation_config.json", "weights.json", *zoo.TOKENIZER_FILES):
        assert (d / f).read_bytes() == (base / f).read_bytes(), f"{trained}/{f} differs from {base.name}/{f}"
    info = resolve_model(trained)
    assert info.has_trained_weights
    with safe_open(str(d / "model.safetensors"), "pt") as st:
        shapes = {k: list(st.get_slice(k).get_shape()) for k in st.keys()}
    assert shapes == _read_json(d / "weights.json")["tensors"]
