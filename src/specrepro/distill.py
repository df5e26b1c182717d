"""Distillation data for the drafts: the target's own next-token distributions on an offline corpus.

A draft is useful in proportion to how often it agrees with the *target* (Leviathan et al. 2022, Sec. 3.1: alpha
= E[min(p, q)] summed over tokens), not with the corpus. So the drafts are trained on the target's predictions
(Hinton et al. 2015, knowledge distillation; the same recipe as DistillSpec, Zhou et al. 2023, arXiv 2310.08461):
the target scores every position of fixed-length corpus chunks in one teacher-forced forward, and its top-k
log-probabilities are stored (k = 20 covers nearly all of the mass of a 135M model's next-token distribution).

Labelling runs at ~300 tokens/s on a 2-core CPU, so it is written in shards under data/cache/distill/<key>/ and
resumes where it stopped; `key` hashes everything the labels depend on (corpus, target weights, sizes, seed).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .data import training_documents
from .models import CACHE_DIR
from .report import tmp_path

SHARD_CHUNKS = 64


@dataclass(frozen=True)
class LabelConfig:
    n_tokens: int = 524_288  # tokens labelled in all
    context: int = 256  # tokens per chunk (the drafts' training context)
    code_fraction: float = 0.67  # share of chunks from stdlib code, the rest chat-formatted Shakespeare
    top_k: int = 20  # target log-probabilities kept per position
    seed: int = 0  # corpus shuffle
    batch: int = 4  # chunks per teacher forward


def corpus_chunks(tokenizer, cfg: LabelConfig) -> torch.Tensor:
    """(n_chunks, context) token ids: code and chat-formatted text streams cut into chunks, interleaved."""
    n_chunks = cfg.n_tokens // cfg.context
    n_code = round(n_chunks * cfg.code_fraction)
    want = {"code": n_code, "text": n_chunks - n_code}
    streams: dict[str, list[int]] = {"code": [], "text": []}
    eos = tokenizer.eos_token_id
    for kind, doc in training_documents(cfg.seed):
        if len(streams[kind]) >= want[kind] * cfg.context:
            if all(len(streams[k]) >= want[k] * cfg.context for k in want):
                break
            continue
        if kind == "text":
            instruction, continuation = doc
            doc = tokenizer.apply_chat_template(
                [{"role": "user", "content": instruction}, {"role": "assistant", "content": continuation}],
                tokenize=False)
        streams[kind] += tokenizer(doc, add_special_tokens=False).input_ids + [eos]
    chunks = {k: torch.tensor(s[: want[k] * cfg.context]).view(-1, cfg.context) for k, s in streams.items()}
    if any(chunks[k].shape[0] < want[k] for k in want):
        raise ValueError(f"the corpus is too small for {cfg.n_tokens} tokens: lower n_tokens")
    order = torch.randperm(n_chunks, generator=torch.Generator().manual_seed(cfg.seed))
    return torch.cat([chunks["code"], chunks["text"]])[order]


def label_key(chunks: torch.Tensor, cfg: LabelConfig, target_id: str) -> str:
    h = hashlib.sha256(chunks.numpy().tobytes())
    h.update(json.dumps(asdict(cfg) | {"target": target_id}, sort_keys=True).encode())
    return h.hexdigest()[:16]


@torch.no_grad()
def teacher_labels(target, chunks: torch.Tensor, cfg: LabelConfig, *, target_id: str,
                   log=print) -> dict[str, torch.Tensor]:
    """Top-k log-probabilities of the target at every position of every chunk, cached in resumable shards.

    Returns dict(tokens=(N, T) long, topk_ids=(N, T, k) int32, topk_logp=(N, T, k) float16, key=str).
    """
    key = label_key(chunks, cfg, target_id)
    folder = CACHE_DIR / "distill" / key
    folder.mkdir(parents=True, exist_ok=True)
    n_shards = -(-chunks.shape[0] // SHARD_CHUNKS)
    t0, done_tokens = time.perf_counter(), 0
    for s in range(n_shards):
        path = folder / f"shard{s:04d}.pt"
        if path.exists():
            continue
        part = chunks[s * SHARD_CHUNKS:(s + 1) * SHARD_CHUNKS]
        ids, logp = [], []
        for b in range(0, part.shape[0], cfg.batch):
            x = part[b:b + cfg.batch].to(target.device)
            logits = target(input_ids=x).logits.float()  # (B, T, V)
            top = logits.log_softmax(-1).topk(cfg.top_k, dim=-1)
            ids.append(top.indices.int().cpu())
            logp.append(top.values.half().cpu())
        tmp = tmp_path(path)
        torch.save({"topk_ids": torch.cat(ids), "topk_logp": torch.cat(logp)}, tmp)
        os.replace(tmp, path)
        done_tokens += part.numel()
        rate = done_tokens / (time.perf_counter() - t0)
        log(f"labelled shard {s + 1}/{n_shards} ({rate:.0f} tokens/s)")
    shards = [torch.load(folder / f"shard{s:04d}.pt") for s in range(n_shards)]
    return dict(tokens=chunks, topk_ids=torch.cat([d["topk_ids"] for d in shards]),
                topk_logp=torch.cat([d["topk_logp"] for d in shards]), key=key)
