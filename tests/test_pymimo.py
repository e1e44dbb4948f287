"""mimo-py-18m: the Python-source corpus, the trainer (CPU quick run, no vLLM), the shipped checkpoint, parity."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kit.checks.compare import load_prompts  # noqa: E402
from kit.zoo.tiny import checkpoint, config, pycorpus, trainers  # noqa: E402
from kit.zoo.tiny.mimo import TinyMiMo  # noqa: E402

NAME = "mimo-py-18m"
MODEL_DIR = trainers.MIMO_PY_DIR
HELDOUT_PROMPTS = REPO / "data" / "prompts" / "pycode-heldout.jsonl"
needs_model = pytest.mark.skipif(not (MODEL_DIR / "model.safetensors").exists(),
                                 reason=f"data/models/{NAME} has no model.safetensors")

CODE = "import os\n\n\ndef f{i}(x):\n    if x > {i}:\n        return os.path.join(str(x), 'a')\n    return x * {i}\n" * 3


def _tree(root: Path) -> None:
    pkg = root / "pkg"
    (pkg / "tests").mkdir(parents=True)
    (pkg / "sub").mkdir()
    for i in range(12):
        (pkg / f"mod{i:02d}.py").write_text(CODE.replace("{i}", str(i)))
    (pkg / "sub" / "copy.py").write_text(CODE.replace("{i}", "3"))       # same bytes as mod03.py
    (pkg / "tests" / "test_mod.py").write_text(CODE.replace("{i}", "99"))  # test suite: left out
    (pkg / "table.py").write_text("DATA = [" + ", ".join(str(i) for i in range(400)) + "]\n")  # data, not code
    (pkg / "tiny.py").write_text("x = 1\n")  # under MIN_FILE_BYTES


def test_collect_filters_dedups_and_splits(tmp_path):
    _tree(tmp_path)
    docs, stats = pycorpus.collect([("site-packages", tmp_path)])
    paths = [d.path for d in docs]
    assert stats["duplicates"] == 1 and "pkg/sub/copy.py" not in paths and "pkg/mod03.py" in paths
    assert not any("tests/" in p or p.endswith(("table.py", "tiny.py")) for p in paths)
    assert stats["skipped_not_code"] == 1 and stats["skipped_size"] == 1
    assert len({d.sha256 for d in docs}) == len(docs) == 12
    train, val = pycorpus.split(docs)
    assert val and not {d.sha256 for d in train} & {d.sha256 for d in val}
    # A small package cap keeps a content-hash sample of the package.
    capped, st = pycorpus.collect([("site-packages", tmp_path)], package_cap=3 * len(docs[0].text))
    assert len(capped) == 3 and st["over_package_cap"] == 9


def test_pack_round_trip_and_heldout_prompts(tmp_path):
    _tree(tmp_path)
    sources = [("site-packages", tmp_path)]
    docs, stats = pycorpus.collect(sources)
    pack = tmp_path / "p.jsonl.xz"
    m = pycorpus.write_pack(docs, pack, stats, sources, 10**9)
    train, val = pycorpus.read_pack(pack)
    assert [d.sha256 for d in train + val] == [d.sha256 for d in pycorpus.split(docs)[0] + pycorpus.split(docs)[1]]
    assert m["train_files"] == len(train) and m["val_files"] == len(val)
    rows = pycorpus.heldout_prompts(train, val, prompt_lines=3)
    train_text = "\n".join(d.text for d in train)
    assert rows and all(r["sha256"] in {d.sha256 for d in val} and r["prompt"] not in train_text for r in rows)
    # A held-out file whose functions also occur verbatim in training text yields no prompt.
    near_copy = pycorpus.Doc("site-packages", "pkg/near.py", "0" * 64, "# a comment\n" + train[0].text)
    assert pycorpus.heldout_prompts(train, [near_copy], prompt_lines=3) == []


def test_heldout_prompt_file_is_from_heldout_code():
    rows = [json.loads(x) for x in HELDOUT_PROMPTS.read_text().splitlines() if x.strip()]
    assert len(rows) == 16 and len({r["prompt"] for r in rows}) == 16
    for r in rows:
        assert pycorpus.is_heldout(r["sha256"]), r["source"]
        assert r["prompt"].lstrip().startswith("def ") and r["prompt"].endswith("\n")
    assert not {r["prompt"] for r in rows} & set(load_prompts(config.PROMPTS_DIR / "default.jsonl"))


def test_trainer_imports_no_vllm():
    code = "import sys, kit.zoo.tiny.trainers, kit.zoo.tiny.pycorpus, kit.cli.tiny; print('vllm' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr[-2000:]


def test_quick_cpu_training_is_deterministic_and_shards_merge(tmp_path):
    _tree(tmp_path / "src")
    sources = [("site-packages", tmp_path / "src")]
    docs, stats = pycorpus.collect(sources)
    pack = tmp_path / "p.jsonl.xz"
    pycorpus.write_pack(docs, pack, stats, sources, 10**9)

    def run(out: Path, *extra: str) -> dict:
        subprocess.run([sys.executable, "-m", "kit", "tiny", "train", NAME, "--quick", "--corpus", str(pack), "--out", str(out),
                        *extra], cwd=REPO, check=True, timeout=300, capture_output=True)
        return json.loads((out / "manifest.json").read_text())

    a = run(tmp_path / "a")
    b = run(tmp_path / "b", "--shard-mb", "0.25")
    assert a["steps"] == 3 and a["device"] == "cpu" and a["storage_dtype"] == "bfloat16"
    assert [h["trunk"] for h in a["loss_history"]] == [h["trunk"] for h in b["loss_history"]]
    assert not (tmp_path / "b" / "model.safetensors").exists()
    assert len(list((tmp_path / "b").glob("model-*.safetensors"))) > 1
    assert checkpoint.merge(tmp_path / "b") == a["model_safetensors_sha256"] == checkpoint.sha256_file(tmp_path / "a" / "model.safetensors")
    assert not list((tmp_path / "b").glob("model-*.safetensors"))
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (REPO / "data/models/tiny-mimo/tokenizer.json").read_bytes()
    checkpoint.load_model(tmp_path / "b")  # strict load of the merged file


@needs_model
def test_checkpoint_layout_size_and_manifest():
    from safetensors import safe_open

    from kit.core.models import resolve_model

    cfg = json.loads((MODEL_DIR / "config.json").read_text())
    assert cfg["architectures"] == ["MiMoForCausalLM"] and cfg["num_nextn_predict_layers"] == 1
    mc = config.ModelConfig.from_hf(cfg)
    assert mc == config.MIMO_PY_PRESET
    expected = {k: list(v.shape) for k, v in TinyMiMo(mc).state_dict().items()}
    with safe_open(str(MODEL_DIR / "model.safetensors"), framework="pt") as f:
        stored = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16"}
    assert stored == expected == json.loads((MODEL_DIR / "weights.json").read_text())["tensors"]
    assert sum(p.stat().st_size for p in MODEL_DIR.iterdir()) <= 40 * 10**6
    m = json.loads((MODEL_DIR / "manifest.json").read_text())
    assert m["model_safetensors_sha256"] == checkpoint.sha256_file(MODEL_DIR / "model.safetensors")
    assert m["num_parameters"] == sum(math.prod(s) for s in expected.values()) == 17_811_840
    for f in trainers.TOKENIZER_FILES:
        assert (MODEL_DIR / f).read_bytes() == (trainers.TINY_MIMO_DIR / f).read_bytes(), f
    info = resolve_model(NAME)
    assert info.has_trained_weights and info.num_layers == 8 and info.num_mtp_layers == 1


@pytest.mark.slow  # CI: tiny-mimo's parity covers the same vLLM classes and checkpoint code; 05 runs this model
@pytest.mark.engine
@needs_model
def test_parity_with_vllm(kit_json):
    res = kit_json("tiny", "parity", "--model", MODEL_DIR, "--prompts", HELDOUT_PROMPTS, "--n", "2", "--max-tokens", "32")
    assert res["ok"], json.dumps(res, indent=1)[:4000]


@pytest.mark.slow
@needs_model
def test_mtp_k1_acceptance_on_heldout_code(kit_json):
    res = kit_json("tiny", "acceptance", "--model", MODEL_DIR, "--prompts", HELDOUT_PROMPTS, "--k", "1",
                   "--max-tokens", "64", timeout=1800)
    run = res["runs"][0]["sets"]["pycode-heldout"]
    assert run["drafts"] > 0 and run["outputs_equal_torch_greedy"] == f"{run['n_prompts']}/{run['n_prompts']}"
    assert run["acceptance_rate_per_pos"][0] >= 0.7, run


@pytest.mark.slow
@needs_model
@pytest.mark.parametrize("k", [1, 2, 3])
def test_matrix_pp_sizes_accept_the_same_drafts(k):
    """PP=1/2/4 with MTP k: token-identical to the PP=1 no-spec reference, and the same acceptance counters."""
    from kit.checks.matrix import CELLS, run_cell

    cells = [c for c in CELLS if c.model == NAME and c.spec == f"mtp:{k}" and not c.layer_partition]
    assert sorted(c.pp for c in cells) == [1, 2, 4]
    results = [run_cell(c).to_dict() for c in cells]
    assert all(d["identical"] for d in results), [d["first_divergence"] for d in results]
    assert results[0]["acceptance"]["num_accepted_tokens"] > 0
    assert all(d["acceptance"] == results[0]["acceptance"] for d in results), [d["acceptance"] for d in results]
