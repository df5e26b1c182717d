"""Distillation training of a draft on the target's top-k next-token distributions (see `specrepro.distill`).

Loss: cross-entropy of the draft against the target's top-k distribution renormalised over its k ids, i.e. the
forward KL(p_topk || q) up to a constant (Hinton et al. 2015), averaged over the labelled positions (the target's
answer tokens; the request and the padding only give context). For cut-vocabulary drafts the target's ids are
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
    epochs: float  # passes over the distillation rows; each pass in a fresh order
    batch_rows: int = 16  # rows (request + answer) per optimiser step
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


def distillation_loss(logits: torch.Tensor, topk_ids: torch.Tensor, topk_logp: torch.Tensor,
                      mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft cross-entropy against the renormalised top-k targets, and top-1 agreement with the target, over the
    positions where `mask` is true (all if None).

    logits: (B, T, V) draft logits; topk_ids: (B, T, k) ids in the draft's vocabulary; topk_logp: (B, T, k);
    mask: (B, T) bool.
    """
    w = topk_logp.float().softmax(-1)  # (B, T, k) renormalised teacher probabilities
    logq = logits.float().log_softmax(-1)  # (B, T, V)
    ce = -(w * logq.gather(-1, topk_ids)).sum(-1)  # (B, T)
    agree = (logits.argmax(-1) == topk_ids[..., 0]).float()
    if mask is None:
        return ce.mean(), agree.mean()
    m = mask.float()
    return (ce * m).sum() / m.sum(), (agree * m).sum() / m.sum()


def train_draft(model, labels: dict, cfg: TrainConfig, *, id_map: torch.Tensor | None = None,
                log=print) -> list[dict]:
    """Train `model` in place on distillation labels (from `distill.target_answers`). Only parameters with
    requires_grad are updated. `id_map` maps full ids to the model's (cut) ids. Returns the training history."""
    tokens, mask = labels["tokens"], labels["mask"]
    topk_ids, topk_logp = labels["topk_ids"].long(), labels["topk_logp"]
    if id_map is not None:
        tokens, topk_ids = id_map[tokens], id_map[topk_ids]
    n_rows = tokens.shape[0]
    steps = max(1, math.ceil(cfg.epochs * n_rows / cfg.batch_rows))
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(n_rows, generator=g)
    cursor, history, t0, seen = 0, [], time.perf_counter(), 0
    model.train()
    for step in range(steps):
        if cursor + cfg.batch_rows > n_rows:  # next epoch, new order
            order, cursor = torch.randperm(n_rows, generator=g), 0
        idx = order[cursor:cursor + cfg.batch_rows]
        cursor += cfg.batch_rows
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, cfg)
        used = int(mask[idx].any(0).nonzero().max()) + 1 if mask[idx].any() else 1  # trailing padding skipped
        logits = model(input_ids=tokens[idx, :used]).logits  # (B, used, V)
        loss, agree = distillation_loss(logits, topk_ids[idx, :used], topk_logp[idx, :used], mask[idx, :used])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        seen += int(mask[idx].sum())
        if step % cfg.log_every == 0 or step == steps - 1:
            elapsed = time.perf_counter() - t0
            row = dict(step=step, epoch=(step + 1) * cfg.batch_rows / n_rows, answer_tokens=seen, loss=loss.item(),
                       top1_agreement=agree.item(), seconds=elapsed)
            history.append(row)
            log(f"step {step}/{steps} loss {row['loss']:.3f} top-1 agreement {row['top1_agreement']:.3f} "
                f"({seen / elapsed:.0f} answer tokens/s)")
    model.eval()
    return history
