"""Distillation data for the drafts: the target's own answers to held-out-style requests, with its distributions.

A draft is useful in proportion to how often it agrees with the *target* on the text the target itself writes
(Leviathan et al. 2022, Def. 3.1: alpha = E[sum_x min(p, q)] over the prefixes met while decoding), not with a
corpus. So the drafts are trained on-policy, the recipe of DistillSpec (Zhou et al. 2023, arXiv 2310.08461) and
of sequence-level distillation (Kim & Rush 2016): the target answers requests phrased exactly like the two tasks
(`data.distillation_requests`: stdlib function stubs to complete, passages of non-held-out plays to continue), and
at every position of its answer the top-k log-probabilities of its next-token distribution are kept as soft
labels (k = 20 holds nearly all of a 135M model's mass). The labels come from the generating forwards themselves,
so no second teacher pass is needed.

Generation is batched (left-padded, one KV cache for the batch) and written in resumable shards under
data/cache/distill/<key>/; `key` hashes everything the labels depend on (requests, target weights, settings).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass

import torch

from . import paths
from .data import chat, distillation_requests
from .kvcache import make_cache, model_forward
from .sampling import SamplingConfig, probs_from_logits


@dataclass(frozen=True)
class DistillConfig:
    n_code: int = 1024  # code requests (stdlib stubs) answered by the target
    n_text: int = 384  # text requests (passages of non-held-out plays)
    max_new_tokens: int = 160  # answer length cap (answers end at EOS before that)
    context: int = 512  # tokens per training row: request + answer, longer requests lose their start
    temperature: float = 0.0  # 0: the target's greedy answers (on-policy for T = 0); > 0: sampled answers
    top_p: float | None = None  # nucleus sampling of the sampled answers (None: the whole distribution at temperature)
    top_k: int = 20  # target log-probabilities kept per answer position
    seed: int = 0  # request order and sampling
    batch: int = 32  # requests per batched generation (one shard)
    skip_code: int = 0  # code requests of the seeded order passed over (answered in another set)
    skip_text: int = 0  # text requests passed over


LATER_FIELDS = {"skip_code": 0, "skip_text": 0, "top_p": None}  # fields added after sets were cached: left out of
# the key at these values, so those sets keep their keys


def held_out(n_rows: int, holdout: int, offset: int = 0) -> torch.Tensor:
    """Which of n_rows labelled rows a strided split keeps out of training: every holdout-th row, counted from the
    start of the set the rows were trained in (`offset` rows before them, e.g. the greedy answers before the sampled
    ones in `eagle_train`). (n_rows,) bool. The ladder and the feature draft split their answers this way; scoring a
    draft later must use the same rule, or rows it trained on read as held out."""
    return (offset + torch.arange(n_rows)) % holdout == holdout - 1


def requests(cfg: DistillConfig) -> list[str]:
    """The chat-formatted requests: n_code code and n_text text requests in seeded order, after the first skip_code
    and skip_text."""
    pool = distillation_requests(cfg.seed)
    code = [r for k, r in pool if k == "code"][cfg.skip_code:][: cfg.n_code]
    text = [r for k, r in pool if k == "text"][cfg.skip_text:][: cfg.n_text]
    if len(code) < cfg.n_code or len(text) < cfg.n_text:
        raise ValueError(f"only {len(code)} code and {len(text)} text requests exist after skipping {cfg.skip_code} "
                         f"and {cfg.skip_text}: lower n_code/n_text")
    return code + text


def label_key(prompts: list[str], cfg: DistillConfig, target_id: str) -> str:
    h = hashlib.sha256("\x00".join(prompts).encode())
    fields = {k: v for k, v in asdict(cfg).items() if k not in LATER_FIELDS or v != LATER_FIELDS[k]}
    h.update(json.dumps(fields | {"target": target_id}, sort_keys=True).encode())
    return h.hexdigest()[:16]


@torch.no_grad()
def generate_batch(target, prompt_ids: list[list[int]], *, max_new_tokens: int, eos_token_id: int, top_k: int,
                   temperature: float = 0.0, top_p: float | None = None, generator: torch.Generator | None = None
                   ) -> list[dict]:
    """Answer a batch of prompts with one left-padded KV-cached decode, keeping the target's top-k log-probs.
    A row that reaches EOS leaves the batch (and the cache), so short answers cost no more than their length.

    Returns, per prompt, dict(answer=list of ids (ending with EOS unless cut by max_new_tokens),
    topk_ids=(n, k) int32, topk_logp=(n, k) float16): row i is the distribution that produced answer[i].
    """
    device = next(target.parameters()).device
    B, L = len(prompt_ids), max(len(p) for p in prompt_ids)
    ids = torch.full((B, L), eos_token_id, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for b, p in enumerate(prompt_ids):
        ids[b, L - len(p):], mask[b, L - len(p):] = torch.tensor(p), 1
    x, mask = ids.to(device), mask.to(device)
    cache = make_cache(target)
    live = list(range(B))  # original row of each batch row still decoding
    answers, top_ids, top_logp = [[] for _ in range(B)], [[] for _ in range(B)], [[] for _ in range(B)]
    for _ in range(max_new_tokens):
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)[:, -x.shape[1]:]
        logits = model_forward(target, x, cache, attention_mask=mask, position_ids=position_ids,
                               logits_to_keep=1).logits[:, -1].float()
        logp = logits.log_softmax(-1)
        top = logp.topk(top_k, dim=-1)
        if temperature == 0:
            nxt = logits.argmax(-1)
        elif top_p is None:
            nxt = torch.multinomial((logp / temperature).softmax(-1), 1, generator=generator).squeeze(-1)
        else:  # the labels stay the unwarped distribution: the draft learns p, the loop warps both alike
            probs = probs_from_logits(logits, SamplingConfig(temperature=temperature, top_p=top_p))
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        for i, (b, t) in enumerate(zip(live, nxt.tolist())):
            answers[b].append(t)
            top_ids[b].append(top.indices[i].int().cpu())
            top_logp[b].append(top.values[i].half().cpu())
        keep = [i for i, t in enumerate(nxt.tolist()) if t != eos_token_id]
        if not keep:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        x = nxt[:, None]
        if len(keep) < len(live):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask, x, live = mask[index], x[index], [live[i] for i in keep]
    return [dict(answer=answers[b], topk_ids=torch.stack(top_ids[b]), topk_logp=torch.stack(top_logp[b]))
            for b in range(B)]


def pack(prompt: list[int], answer: dict, context: int, pad_id: int) -> tuple[torch.Tensor, ...]:
    """One training row of `context` tokens: request + answer (the request's start dropped if too long), padded
    right. Position t's labels are the target's distribution over token t + 1, so they sit at the positions just
    before each answer token; `mask` marks them."""
    seq = (prompt + answer["answer"])[-context:]
    n_answer = min(len(answer["answer"]), context - 1)
    k = answer["topk_ids"].shape[-1]
    tokens = torch.full((context,), pad_id, dtype=torch.long)
    tokens[: len(seq)] = torch.tensor(seq)
    topk_ids = torch.zeros((context, k), dtype=torch.int32)
    topk_logp = torch.full((context, k), -30.0, dtype=torch.float16)
    mask = torch.zeros(context, dtype=torch.bool)
    start = len(seq) - n_answer - 1  # position predicting the first kept answer token
    topk_ids[start:start + n_answer] = answer["topk_ids"][-n_answer:]
    topk_logp[start:start + n_answer] = answer["topk_logp"][-n_answer:]
    mask[start:start + n_answer] = True
    return tokens, mask, topk_ids, topk_logp


def target_answers(target, tokenizer, cfg: DistillConfig, *, target_id: str, log=print) -> dict:
    """The distillation set: the target's answers to `requests(cfg)` with its top-k labels, cached in shards.

    Returns dict(tokens=(N, context) long, mask=(N, context) bool, topk_ids=(N, context, k) int32,
    topk_logp=(N, context, k) float16, key=str, answer_tokens=int).
    """
    prompts = requests(cfg)
    key = label_key(prompts, cfg, target_id)
    folder = paths.CACHE / "distill" / key
    folder.mkdir(parents=True, exist_ok=True)
    encoded = [tokenizer(chat(tokenizer, p), add_special_tokens=False).input_ids for p in prompts]
    encoded.sort(key=len)  # batches of similar lengths waste little on padding
    n_shards = -(-len(encoded) // cfg.batch)
    t0, done_tokens = time.perf_counter(), 0
    for s in range(n_shards):
        path = folder / f"shard{s:04d}.pt"
        if path.exists():
            continue
        part = encoded[s * cfg.batch:(s + 1) * cfg.batch]
        g = torch.Generator().manual_seed(cfg.seed * 100_003 + s)
        answers = generate_batch(target, part, max_new_tokens=cfg.max_new_tokens, top_k=cfg.top_k,
                                 eos_token_id=tokenizer.eos_token_id, temperature=cfg.temperature, top_p=cfg.top_p,
                                 generator=g)
        rows = [pack(p, a, cfg.context, tokenizer.eos_token_id) for p, a in zip(part, answers)]
        with paths.writing_file(path) as tmp:
            torch.save({name: torch.stack([r[i] for r in rows]) for i, name in
                        enumerate(("tokens", "mask", "topk_ids", "topk_logp"))}, tmp)
        done_tokens += sum(len(a["answer"]) for a in answers)
        log(f"shard {s + 1}/{n_shards}: {done_tokens / (time.perf_counter() - t0):.0f} answer tokens/s")
    shards = [torch.load(folder / f"shard{s:04d}.pt") for s in range(n_shards)]
    out = {name: torch.cat([d[name] for d in shards]) for name in ("tokens", "mask", "topk_ids", "topk_logp")}
    return out | dict(key=key, answer_tokens=int(out["mask"].sum()))
