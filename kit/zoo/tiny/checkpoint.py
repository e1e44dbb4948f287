"""Checkpoint I/O in the layout vLLM loads: ``model.safetensors`` (or shards and their index), ``weights.json``,
and loading a model directory back into its PyTorch model (the class chosen by ``config.json``'s architecture)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterable

from kit.core.models import weights_manifest_from_safetensors

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def copy_files(src: Path, out: Path, names: Iterable[str]) -> None:
    """Files taken unchanged from another model directory (tokenizer, config)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in names:
        shutil.copyfile(src / f, out / f)


def _write(sd: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file(sd, str(path), metadata={"format": "pt"})
    os.chmod(path, 0o644)


def write_weights_json(model_dir: Path) -> None:
    st = model_dir / SINGLE
    (model_dir / "weights.json").write_text(json.dumps(weights_manifest_from_safetensors(st), indent=2) + "\n")


def save_checkpoint(sd: dict, out: Path, shard_bytes: int | None = None, weights_json: bool = True) -> str:
    """Write ``sd`` (sorted by name) as ``model.safetensors`` (and ``weights.json``), or as shards of at most
    ``shard_bytes`` with an index. Returns the sha256 of the single-file serialisation (what :func:`merge`
    must reproduce from the shards)."""
    from safetensors.torch import save

    sd = {k: sd[k].detach().contiguous() for k in sorted(sd)}
    if not shard_bytes:
        _write(sd, out / SINGLE)
        if weights_json:
            write_weights_json(out)
        return sha256_file(out / SINGLE)
    single_sha = hashlib.sha256(save(sd, metadata={"format": "pt"})).hexdigest()
    shards, cur, size = [], {}, 0
    for k, v in sd.items():
        n = v.numel() * v.element_size()
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += n
    shards.append(cur)
    index = {"metadata": {"single_file_sha256": single_sha}, "weight_map": {}}
    for i, part in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        _write(part, out / fname)
        index["weight_map"].update({k: fname for k in part})
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return single_sha


def merge(model_dir: Path) -> str:
    """Join shards into ``model.safetensors`` (checks the sha256 recorded at training), remove the shards,
    write ``weights.json`` and the file's sha256 into ``manifest.json``."""
    from safetensors.torch import load_file

    idx_path = model_dir / INDEX
    index = json.loads(idx_path.read_text())
    sd = {}
    for fname in sorted(set(index["weight_map"].values())):
        sd.update(load_file(str(model_dir / fname)))
    st = model_dir / SINGLE
    _write({k: sd[k] for k in sorted(sd)}, st)
    sha = sha256_file(st)
    want = index["metadata"]["single_file_sha256"]
    if sha != want:
        st.unlink()
        raise SystemExit(f"merged file sha256 {sha} != {want} recorded at training")
    for fname in set(index["weight_map"].values()):
        (model_dir / fname).unlink()
    idx_path.unlink()
    write_weights_json(model_dir)
    mpath = model_dir / "manifest.json"
    if mpath.exists():
        m = json.loads(mpath.read_text())
        m["model_safetensors_sha256"] = sha
        m.pop("shards", None)
        mpath.write_text(json.dumps(m, indent=2) + "\n")
    return sha


def build_model(cfg: dict, **kwargs):
    """An untrained PyTorch model for a ``config.json`` (MiMo, dense DeepSeek-V3, Qwen3.5 or Llama with Eagle3)."""
    arch = (cfg.get("architectures") or ["?"])[0]
    if arch == "MiMoForCausalLM":
        from kit.zoo.tiny.config import ModelConfig
        from kit.zoo.tiny.mimo import TinyMiMo

        return TinyMiMo(ModelConfig.from_hf(cfg))
    if arch == "DeepseekV3ForCausalLM":
        from kit.zoo.tiny.config import DSConfig
        from kit.zoo.tiny.deepseek import TinyDeepseekV3

        return TinyDeepseekV3(DSConfig.from_hf(cfg), **kwargs)
    if arch == "Qwen3_5ForCausalLM":
        from kit.zoo.tiny.config import Qwen35Config
        from kit.zoo.tiny.qwen3_5 import TinyQwen3_5

        return TinyQwen3_5(Qwen35Config.from_hf(cfg))
    if arch == "LlamaForCausalLM":
        from kit.zoo.tiny.llama_eagle3 import LlamaSWAConfig, TinyLlamaEagle3

        return TinyLlamaEagle3(LlamaSWAConfig.from_hf(cfg))
    raise ValueError(f"no PyTorch model for architecture {arch!r} "
                     "(MiMoForCausalLM, DeepseekV3ForCausalLM, Qwen3_5ForCausalLM, LlamaForCausalLM)")


def load_model(model_dir: Path | str):
    """The PyTorch model of a model directory, strictly loaded (float32 compute; bfloat16 weights upcast)."""
    import torch
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    model = build_model(json.loads((model_dir / "config.json").read_text()))
    sd = load_file(str(model_dir / SINGLE))
    if hasattr(model, "from_checkpoint"):
        sd = model.from_checkpoint(sd)
    model.load_state_dict(sd, strict=True)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    model.eval()
    return model


def eos_id(model_dir: Path | str) -> int | None:
    """The end-of-sequence id vLLM stops at (``generation_config.json``, else ``config.json``)."""
    model_dir = Path(model_dir)
    for name in ("generation_config.json", "config.json"):
        p = model_dir / name
        if p.exists():
            v = json.loads(p.read_text()).get("eos_token_id")
            if v is not None:
                return v[0] if isinstance(v, list) else int(v)
    return None
