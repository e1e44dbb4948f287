"""Models the kit knows: names under ``data/models/``, their configs, and random checkpoints.

A model directory holds ``config.json``, tokenizer files and ``weights.json`` (tensor names and
shapes). A trained model also holds ``model.safetensors``. ``--random`` weights are written by
:func:`random_checkpoint` from ``weights.json`` with a normal init (std 0.02, norms at 1, biases at 0)
and a seed: vLLM's ``load_format="dummy"`` fills weights in about +-1e-3, which makes every greedy
step a near-tie (``docs/cpu-notes.md#dummy-weights-are-near-ties``), so the kit never uses it for correctness work.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "data"
MODELS_DIR = DATA_DIR / "models"
PROMPTS_DIR = DATA_DIR / "prompts"

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


def cache_dir() -> Path:
    """Where the kit writes generated files (random checkpoints, logs); ``KIT_CACHE_DIR`` overrides."""
    d = Path(os.environ.get("KIT_CACHE_DIR", Path.home() / ".cache" / "ppmtp-kit"))
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file there, or no permission: one line, not a traceback
        raise ModelError(f"KIT_CACHE_DIR {d} is not a folder the kit can write: {e.strerror or e}") from None
    return d


class ModelError(ValueError):
    """A model name or directory that the kit cannot use."""


@dataclass(frozen=True)
class ModelInfo:
    """What the kit needs to know about a model before any process starts."""

    path: Path
    config: dict

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def num_mtp_layers(self) -> int:
        c = self.config
        for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules"):
            if c.get(key):
                return int(c[key])
        return 0

    @property
    def max_model_len(self) -> int:
        return int(self.config.get("max_position_embeddings", 2048))

    @property
    def architecture(self) -> str:
        return (self.config.get("architectures") or ["?"])[0]

    @property
    def is_eagle3_draft(self) -> bool:
        return "eagle3" in self.architecture.lower()

    @property
    def has_trained_weights(self) -> bool:
        return (self.path / "model.safetensors").exists()

    @property
    def draft_model(self) -> Path | None:
        """A model directory may name its Eagle3 / draft model in ``kit.json``."""
        meta = self.path / "kit.json"
        if meta.exists():
            d = json.loads(meta.read_text()).get("draft_model")
            if d:
                return (self.path / d).resolve() if not Path(d).is_absolute() else Path(d)
        return None


def resolve_model(model: str | os.PathLike) -> ModelInfo:
    """Resolve a name under ``data/models/`` or a path to a model directory."""
    p = Path(model)
    if not p.is_absolute() and not p.exists():
        p = MODELS_DIR / str(model)
    if not p.is_dir():
        known = ", ".join(sorted(x.name for x in MODELS_DIR.iterdir() if (x / "config.json").exists())) if MODELS_DIR.exists() else ""
        raise ModelError(f"unknown model {str(model)!r}: not a directory and not a model under data/models/ (known: {known or 'none'})")
    cfg = p / "config.json"
    if not cfg.exists():
        raise ModelError(f"model directory {p} has no config.json")
    try:
        config = json.loads(cfg.read_text())
    except json.JSONDecodeError as e:
        raise ModelError(f"{cfg} is not valid JSON: {e}") from e
    if "num_hidden_layers" not in config:
        raise ModelError(f"{cfg} has no num_hidden_layers")
    return ModelInfo(path=p.resolve(), config=config)


def _init_tensor(name: str, shape: list[int], rng) -> "object":
    import numpy as np

    base = name.rsplit(".", 1)
    leaf = base[-1]
    owner = base[0] if len(base) > 1 else ""
    if leaf == "bias":
        return np.zeros(shape, dtype=np.float32)
    if "norm" in owner.rsplit(".", 1)[-1] or owner.endswith("_norm"):
        return np.ones(shape, dtype=np.float32)
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)


def random_checkpoint(info: ModelInfo, seed: int = 0) -> Path:
    """Write (once) a seeded random checkpoint for ``info`` and return its directory.

    The directory has the same config and tokenizer, and ``model.safetensors`` filled from
    ``weights.json``. It is keyed by the hash of the manifest and config, the initialisation's version
    (:data:`RANDOM_INIT_VERSION`) and the seed, so it is reused; its ``.complete`` marker holds the sha256 of every
    file, checked at each reuse: a checkpoint changed since it was written is written again.
    """
    import numpy as np

    manifest_path = info.path / "weights.json"
    if not manifest_path.exists():
        raise ModelError(f"{info.path} has no weights.json: random weights need the tensor manifest")
    manifest_bytes = manifest_path.read_bytes()
    key = hashlib.sha256(manifest_bytes + (info.path / "config.json").read_bytes()
                         + f"init{RANDOM_INIT_VERSION}".encode()).hexdigest()[:12]
    out = cache_dir() / "random" / f"{info.name}-{key}-seed{seed}"
    if _intact(out):
        return out
    rng = np.random.default_rng(seed)  # a bad seed fails here, before anything is written
    out.parent.mkdir(parents=True, exist_ok=True)
    # One writer at a time, across processes (a lock on the folder of random checkpoints: no lock file to leave
    # behind): two runs that both found no checkpoint would otherwise each write one, and the second's replace
    # removes the directory the first one's engine is loading.
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not _intact(out):  # else written by another run while this one waited
            _write_random(info, manifest_bytes, rng, seed, out)
    finally:
        os.close(fd)  # releases the lock
    return out


# The version of _init_tensor's scheme: part of a random checkpoint's key, so a changed initialisation is never
# served from a checkpoint written by the old one.
RANDOM_INIT_VERSION = 1


def _file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file of a checkpoint folder but its marker."""
    out = {}
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.name != ".complete":
            h = hashlib.sha256()
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            out[f.name] = h.hexdigest()
    return out


_INTACT: set = set()  # (folder, its files' sizes and mtimes) verified in this process: not hashed again


def _intact(folder: Path) -> bool:
    """Whether a written checkpoint's files are the ones its marker names, byte for byte."""
    try:
        want = json.loads((folder / ".complete").read_text()).get("sha256")
        seen = (str(folder), tuple((f.name, st.st_size, st.st_mtime_ns)
                                   for f in sorted(folder.iterdir()) for st in (f.stat(),)))
    except (OSError, ValueError):
        return False
    if seen in _INTACT:
        return True
    ok = bool(want) and _file_hashes(folder) == want
    if ok:
        _INTACT.add(seen)
    return ok


def _write_random(info: ModelInfo, manifest_bytes: bytes, rng, seed: int, out: Path) -> None:
    from safetensors.numpy import save_file

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for f in info.path.iterdir():
            if f.is_file() and f.name not in ("model.safetensors", "weights.json"):
                shutil.copy2(f, tmp / f.name)
        manifest = json.loads(manifest_bytes)
        tensors = {name: _init_tensor(name, shape, rng) for name, shape in sorted(manifest["tensors"].items())}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / ".complete").write_text(json.dumps({"seed": seed, "source": str(info.path), "init": RANDOM_INIT_VERSION,
                                                   "sha256": _file_hashes(tmp)}))
    except BaseException:  # a full disk or Ctrl-C: no half-written .tmp directory stays behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)  # an incomplete one (no .complete), left by a run that died
    os.replace(tmp, out)


def weights_manifest_from_safetensors(path: Path) -> dict:
    """Names and shapes of a safetensors file, as stored in ``weights.json``."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return {"tensors": {k: list(f.get_slice(k).get_shape()) for k in sorted(f.keys())}}


def model_requirements(info: ModelInfo, device: str, spec: object | None) -> tuple[str | None, dict[str, Any]]:
    """What a model family needs from vLLM 0.32 beyond the topology: ``(dtype or None, extra engine args)``.

    The one place for model-specific settings (measured on vLLM 0.32.0 CPU, ``docs/cpu-notes.md#gated-deltanet-models-on-cpu-engine-settings``):

    - Gated-DeltaNet layers (``layer_types`` with ``linear_attention``: Qwen3.5, Qwen3-Next) on CPU need bfloat16:
      the CPU GDN kernel asserts it ("CPU GDN attention requires BF16."). The kit's float32 default gives way to it
      (:class:`~kit.core.topology.Topology` substitutes it; another explicit dtype is refused).
    - Hybrid models (linear attention / mamba state beside full attention) with speculative decoding need
      ``enable_prefix_caching=False``: with prefix caching on, vLLM picks the mamba cache mode ``align``, whose
      state copy with spec decode fails in ``v1/worker/mamba_utils.py``. The no-spec reference keeps vLLM's default.

    - MLA models (``kv_lora_rank`` in the config: DeepSeek-V2/V3) on CPU get vLLM's reference MLA backend
      (``attention_backend="CPU_MLA"``). On a CPU with AMX tiles vLLM 0.32 prefers ``AMX_MLA``, whose weight packing
      accepts bfloat16, float16 and int8 only: the kit's float32 engines die at load (``convert_weight_packed``:
      "expect weight to be bfloat16, float16, int8, ..."; seen on an Intel Xeon with AMX). Pinned on every CPU, the
      same kernels run with and without AMX, so results do not depend on the machine. The MTP drafter gets it too, in
      its speculative config (vLLM selects the drafter's backend anew unless told).

    ``spec``: the topology's :class:`~kit.core.topology.Spec`, or None without speculative decoding. Extra engine args
    given to a :class:`~kit.core.topology.Topology` (``extra_engine_args``) still win over these.
    """
    layer_types = info.config.get("layer_types") or []
    gdn = "linear_attention" in layer_types
    hybrid = gdn or any(t in ("mamba", "mamba2") for t in layer_types)
    dtype = "bfloat16" if gdn and device == "cpu" else None
    extra: dict[str, Any] = {}
    if hybrid and spec is not None:
        extra["enable_prefix_caching"] = False
    if info.config.get("kv_lora_rank") and device == "cpu":
        extra["attention_backend"] = "CPU_MLA"
    return dtype, extra
