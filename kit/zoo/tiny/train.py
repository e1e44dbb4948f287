"""The one training loop of the tiny models: joint trunk + MTP loss, schedule, evaluation, the reproducible set-up.

Every tiny model offers :class:`~kit.zoo.tiny.mimo.TinyMiMo`'s interface, so one loss serves them all: the trunk
predicts token t+1, the MTP layer t+2 from (h_t, token t+1), and its second application ("chain", what vLLM does
with ``num_speculative_tokens > 1``) t+3 from its own output and token t+2, with the attention pattern vLLM's
drafter KV cache produces. The order of every random draw and update is fixed, so a config trains
bitwise-identical weights on the CPU.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import asdict

import torch
import torch.nn as nn
import torch.nn.functional as F

from kit.zoo.tiny.config import TrainConfig
from kit.zoo.tiny.corpus import TokenStream


def compute_losses(model: nn.Module, batch: torch.Tensor, chain: bool = True,
                   distill: bool = False) -> dict[str, torch.Tensor]:
    """batch: [B, T+3] token windows. Position t (0 <= t < T):
    trunk predicts x[t+1] from x[..t]; MTP predicts x[t+2] from (h_t, x[t+1]);
    chain (second drafter application at position t+1) predicts x[t+3] from (mtp_out_t, x[t+2]).
    ``distill`` adds, for the MTP and chain predictions, a cross-entropy against the trunk's own
    (detached) distribution for the same token (trunk logits one / two positions later): the
    drafter is scored on agreeing with the trunk, which is what speculative acceptance measures."""
    T = batch.shape[1] - 3
    pos = torch.arange(T, device=batch.device)
    inp = batch[:, :T]
    h = model.hidden(inp, pos)
    V = model.mc.vocab_size
    trunk_logits = model.logits(h)
    trunk = F.cross_entropy(trunk_logits.reshape(-1, V), batch[:, 1:T + 1].reshape(-1))
    kv: list = []
    m = model.mtp_hidden(h, batch[:, 1:T + 1], pos, kv_out=kv)
    mtp_logits = model.mtp_logits(m)
    mtp = F.cross_entropy(mtp_logits.reshape(-1, V), batch[:, 2:T + 2].reshape(-1))
    out = {"trunk": trunk, "mtp": mtp}
    teacher = torch.softmax(trunk_logits.detach(), dim=-1) if distill else None
    if distill:
        out["mtp_distill"] = F.cross_entropy(mtp_logits[:, :T - 1].reshape(-1, V), teacher[:, 1:].reshape(-1, V))
    if chain:
        k1, v1 = kv[0]
        layer = model.mtp_layer
        m2 = layer.mtp_forward_chain(model.model.embed_tokens(batch[:, 2:T + 2]), pos + 1, m, k1, v1)
        chain_logits = model.mtp_logits(m2)
        out["chain"] = F.cross_entropy(chain_logits.reshape(-1, V), batch[:, 3:T + 3].reshape(-1))
        if distill:
            out["chain_distill"] = F.cross_entropy(chain_logits[:, :T - 2].reshape(-1, V),
                                                   teacher[:, 2:].reshape(-1, V))
    return out


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio`` of the peak."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    t = (step - tc.warmup_steps) / max(1, tc.steps - tc.warmup_steps)
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


@torch.no_grad()
def evaluate(model: nn.Module, stream: TokenStream, tc: TrainConfig) -> dict:
    """Validation losses, and how often the MTP argmax equals the trunk's argmax one step later
    (teacher-forced proxy for the k=1 acceptance rate)."""
    model.eval()
    dev = next(model.parameters()).device
    g = torch.Generator().manual_seed(tc.seed + 12345)
    tot: dict[str, float] = {}
    agree = n = 0
    for _ in range(tc.eval_batches):
        b = stream.batch(g, tc.batch_size, tc.seq_len + 3, 0.0).to(dev)
        for k, v in compute_losses(model, b, distill=True).items():
            tot[k] = tot.get(k, 0.0) + float(v)
        T = tc.seq_len
        pos = torch.arange(T, device=dev)
        h = model.hidden(b[:, :T], pos)
        trunk_next = model.logits(h).argmax(-1)  # prediction of x[t+1]
        m = model.mtp_logits(model.mtp_hidden(h, b[:, 1:T + 1], pos)).argmax(-1)  # of x[t+2]
        agree += int((m[:, :-1] == trunk_next[:, 1:]).sum())
        n += m[:, :-1].numel()
    model.train()
    out = {f"val_{k}_loss": v / tc.eval_batches for k, v in tot.items()}
    out["val_mtp_trunk_argmax_agreement"] = agree / max(1, n)
    return out


def train_steps(model: nn.Module, stream: TokenStream, tc: TrainConfig, log=print,
                autocast_dtype: torch.dtype | None = None) -> tuple[list, dict, dict]:
    """AdamW (weight decay on 2-D tensors only), :func:`lr_at`'s schedule, the joint loss of
    :func:`compute_losses` (trunk + MTP + chain, + distillation when configured), gradient clipping; batches
    from ``stream`` with a generator seeded from ``tc.seed``. Returns the logged history, the last step's
    losses and their exponential moving average. Batches go to the model's device; ``autocast_dtype`` (e.g.
    bfloat16 on a GPU) runs the losses under ``torch.autocast``.
    """
    decay = [p for n, p in model.named_parameters() if p.ndim == 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tc.lr, betas=(0.9, 0.95), eps=1e-8, fused=True,
    )
    g = torch.Generator().manual_seed(tc.seed)
    dev = next(model.parameters()).device
    amp = (torch.autocast(dev.type, dtype=autocast_dtype) if autocast_dtype is not None
           else contextlib.nullcontext())
    width = tc.seq_len + 3
    history = []
    model.train()
    t_train = time.time()
    ema = rec = None
    for step in range(tc.steps):
        lr = lr_at(step, tc)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = stream.batch(g, tc.batch_size, width, tc.doc_start_fraction).to(dev)
        with amp:
            losses = compute_losses(model, batch, chain=tc.chain_weight > 0, distill=tc.distill_weight > 0)
        loss = losses["trunk"] + tc.mtp_weight * losses["mtp"] + tc.chain_weight * losses.get("chain", 0.0)
        if tc.distill_weight > 0:
            loss = loss + tc.distill_weight * (tc.mtp_weight * losses["mtp_distill"]
                                               + tc.chain_weight * losses.get("chain_distill", 0.0))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        rec = {k: float(v.detach()) for k, v in losses.items()}
        ema = rec if ema is None else {k: 0.95 * ema[k] + 0.05 * rec[k] for k in rec}
        if step % tc.log_every == 0 or step == tc.steps - 1:
            el = time.time() - t_train
            tps = (step + 1) * tc.batch_size * tc.seq_len / max(el, 1e-9)
            history.append({"step": step, "lr": lr, **rec})
            log(f"step {step:5d} lr {lr:.2e} " + " ".join(f"{k} {v:.4f}" for k, v in rec.items())
                + f" | {el:.0f}s {tps:.0f} tok/s")
    return history, rec, ema


def deterministic(tc: TrainConfig, device: str = "cpu") -> None:
    """The reproducible set-up: ``tc.threads`` intra-op threads and deterministic kernels on the CPU; on a
    GPU deterministic cuBLAS without TF32 (bitwise reproducibility is promised on the CPU only)."""
    if device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch.set_num_threads(tc.threads)
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(tc.seed)


def fit(model: nn.Module, stream: TokenStream, tc: TrainConfig, log=print, device: str = "cpu") -> dict:
    """Initialise ``model`` from ``tc.seed``, move it to ``device`` and train it (bfloat16 autocast on a GPU).
    Returns the run's manifest entries: configs, parameter count, losses, history, timings."""
    model.init_weights(tc.seed)
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters on {device}")
    t0 = time.time()
    history, rec, ema = train_steps(model, stream, tc, log,
                                    autocast_dtype=torch.bfloat16 if device.startswith("cuda") else None)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {
        "seed": tc.seed,
        "steps": tc.steps,
        "train_config": {k: v for k, v in asdict(tc).items() if k != "model"},
        "model_config": asdict(tc.model),
        "num_parameters": n_params,
        "tokens_seen": tc.steps * tc.batch_size * tc.seq_len,
        **{f"final_{k}_loss": v for k, v in rec.items()},
        **{f"final_{k}_loss_ema": v for k, v in ema.items()},
        "loss_history": history,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "train_seconds": round(time.time() - t0, 1),
    }
