"""Distillation training of a draft on the target's top-k next-token distributions (see `specrepro.distill`).

Loss: cross-entropy of the draft against the target's top-k distribution renormalised over its k ids, i.e. the
forward KL(p_topk || q) up to a constant (Hinton et al. 2015). For cut-vocabulary drafts the target's ids are
mapped to cut ids first; ids outside the cut vocabulary land on the catch-all class, which thus learns the mass
the cut vocabulary cannot represent.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TrainConfig:
    tokens: int  # training tokens (positions) in all; epochs over the labels repeat in a fresh order
    batch_chunks: int = 16  # chunks per optimiser step (x context tokens)
    lr: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.1
    seed: int = 0
    log_every: int = 25


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def distillation_loss(logits: torch.Tensor, topk_ids: torch.Tensor, topk_logp: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft cross-entropy against the renormalised top-k targets, and top-1 agreement with the target.

    logits: (B, T, V) draft logits; topk_ids: (B, T, k) ids in the draft's vocabulary; topk_logp: (B, T, k).
    """
    w = topk_logp.float().softmax(-1)  # (B, T, k) renormalised teacher probabilities
    logq = logits.float().log_softmax(-1)  # (B, T, V)
    loss = -(w * logq.gather(-1, topk_ids)).sum(-1).mean()
    agree = (logits.argmax(-1) == topk_ids[..., 0]).float().mean()
    return loss, agree


def train_draft(model, labels: dict, cfg: TrainConfig, *, id_map: torch.Tensor | None = None,
                log=print) -> list[dict]:
    """Train `model` in place on teacher labels (from `distill.teacher_labels`). Only parameters with
    requires_grad are updated. `id_map` maps full ids to the model's (cut) ids. Returns the training history."""
    tokens, topk_ids, topk_logp = labels["tokens"], labels["topk_ids"].long(), labels["topk_logp"]
    if id_map is not None:
        tokens, topk_ids = id_map[tokens], id_map[topk_ids]
    n_chunks, context = tokens.shape
    steps = max(1, cfg.tokens // (cfg.batch_chunks * context))
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(n_chunks, generator=g)
    cursor, history, t0 = 0, [], time.perf_counter()
    model.train()
    for step in range(steps):
        if cursor + cfg.batch_chunks > n_chunks:  # next epoch, new order
            order, cursor = torch.randperm(n_chunks, generator=g), 0
        idx = order[cursor:cursor + cfg.batch_chunks]
        cursor += cfg.batch_chunks
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, cfg)
        logits = model(input_ids=tokens[idx]).logits  # (B, T, V)
        loss, agree = distillation_loss(logits, topk_ids[idx], topk_logp[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % cfg.log_every == 0 or step == steps - 1:
            elapsed = time.perf_counter() - t0
            row = dict(step=step, tokens=(step + 1) * cfg.batch_chunks * context, loss=loss.item(),
                       top1_agreement=agree.item(), seconds=elapsed)
            history.append(row)
            log(f"step {step}/{steps} loss {row['loss']:.3f} top-1 agreement {row['top1_agreement']:.3f} "
                f"({row['tokens'] / elapsed:.0f} tokens/s)")
    model.eval()
    return history
