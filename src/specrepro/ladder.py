"""A ladder of drafts whose size buys accuracy: tuned-lens drafts of the target's first k layers, k = 0..16.

Leviathan et al. 2022 (arXiv 2211.17192, Sec. 4) drafted an 11B T5 with T5-small, -base and -large and found the
smallest won. A larger draft of one kind can be expected to agree more (alpha up) but costs more (c up), and the
speedup of Thm 3.8 trades the two. Testing that needs drafts of one kind whose alpha rises with their cost. Draft k
(`specrepro.lens.LensDraft`) is the target's own embedding and first k layers, frozen, read out by a tuned lens
(Belrose et al. 2023, arXiv 2303.08112) over a cut vocabulary; the early-exit drafts of Draft & Verify (Zhang et
al. 2023, arXiv 2309.08168) and LayerSkip (Elhoushi et al. 2024, arXiv 2404.16710) read out the same stream. Its
cost grows linearly with k; its agreement with the target rises with k (k = 30 would be the target itself). Draft 0
reads out the token's embedding alone (a bigram model) and keeps half the ids in its cut head, the cheapest rung.

Training is distillation on the target's own answers (`distill.target_answers`, on-policy as for the small
drafts): the target's residual stream after layer k at every answer position, against its top-k next-token
distribution (`train.distillation_loss`, forward KL). The streams of every k come from one forward of the target,
so the whole ladder trains in minutes; every 10th answer row is held out to score each lens (and the untrained
"logit lens" it starts from).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import distill, paths
from .drafts import cut_vocabulary, full_to_cut
from .lens import LensDraft, save_lens
from .train import TrainConfig, distillation_loss, lr_at

LAYERS = (0, 1, 2, 4, 8, 16)  # the shipped ladder: lens-0 .. lens-16


def name(layers: int) -> str:
    return f"lens-{layers}"


# ---- training ----------------------------------------------------------------------------------------------------


@torch.no_grad()
def residual_streams(target, tokens: torch.Tensor, mask: torch.Tensor, layers, batch_rows: int = 8
                     ) -> dict[int, torch.Tensor]:
    """The target's residual stream after each of `layers` layers at the labelled positions (`mask`), one forward
    of the target per batch of rows: {k: (N, d)}, rows in order, positions in order within a row."""
    out: dict[int, list[torch.Tensor]] = {k: [] for k in layers}
    for s in range(0, tokens.shape[0], batch_rows):
        m = mask[s:s + batch_rows]
        used = int(m.any(0).nonzero().max()) + 1 if m.any() else 1
        hs = target.model(input_ids=tokens[s:s + batch_rows, :used], output_hidden_states=True).hidden_states
        for k in layers:
            out[k].append(hs[k][m[:, :used]].float())  # hs[k]: the output of layer k (hs[0] the embedding)
    return {k: torch.cat(v) for k, v in out.items()}


@dataclass(frozen=True)
class LadderConfig:
    layers: tuple[int, ...] = LAYERS
    keep: int = 8191  # ids of the cut head (plus the catch-all)
    keep_by_layers: tuple[tuple[int, int], ...] = ((0, 4095),)  # (layers, keep) where not `keep`: lens-0 is cheap
    # only with a small head (a 0-layer draft's cost is mostly its head)
    holdout: int = 10  # every holdout-th row (whole answers, both tasks alike) is kept out to score the lens
    train: TrainConfig = TrainConfig(epochs=8, batch_rows=1024, lr=2e-3, warmup_steps=10, weight_decay=0.0)

    def keep_for(self, layers: int) -> int:
        """The cut head's size for the draft of `layers` layers."""
        return dict(self.keep_by_layers).get(layers, self.keep)


def labelled(labels: dict, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's top-k at the labelled positions, ids mapped to the cut vocabulary: (N, k) long, (N, k)."""
    m = labels["mask"]
    return full_to_cut(kept)[labels["topk_ids"][m].long()], labels["topk_logp"][m].float()


def train_lens(draft: LensDraft, x: torch.Tensor, ids: torch.Tensor, logp: torch.Tensor, cfg: TrainConfig, *,
               x_val: torch.Tensor, ids_val: torch.Tensor, logp_val: torch.Tensor, log=print) -> list[dict]:
    """Fit the lens of `draft` on residual streams x (N, d) against the teacher's top-k (ids, logp), minibatches of
    `cfg.batch_rows` positions; scored on the held-out positions after every epoch. Returns the history."""
    params = list(draft.trainable().values())
    for p in draft.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    g = torch.Generator().manual_seed(cfg.seed)
    per_epoch = math.ceil(x.shape[0] / cfg.batch_rows)
    steps = max(1, math.ceil(cfg.epochs * per_epoch))
    history, t0, step = [], time.perf_counter(), 0
    while step < steps:
        order = torch.randperm(x.shape[0], generator=g)
        for s in range(0, x.shape[0], cfg.batch_rows):
            if step == steps:
                break
            idx = order[s:s + cfg.batch_rows]
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps, cfg)
            loss, _ = distillation_loss(draft.cut_logits(x[idx])[:, None], ids[idx][:, None], logp[idx][:, None])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        with torch.no_grad():
            val_loss, val_agree = distillation_loss(draft.cut_logits(x_val)[:, None], ids_val[:, None],
                                                    logp_val[:, None])
        history.append(dict(step=step, epoch=step / per_epoch, loss=loss.item(), heldout_loss=val_loss.item(),
                            heldout_top1_agreement=val_agree.item(), seconds=time.perf_counter() - t0))
        log(f"lens-{draft.layers} epoch {step / per_epoch:.1f}: loss {loss.item():.3f}, held-out loss "
            f"{val_loss.item():.3f}, held-out top-1 agreement {val_agree.item():.3f}")
    for p in params:
        p.requires_grad_(False)
    return history


def build_ladder(target, labels: dict, cfg: LadderConfig = LadderConfig(), *, target_id: str,
                 folder: Path = paths.MODELS, log=print) -> dict[int, LensDraft]:
    """Train and store one lens draft per entry of `cfg.layers` on the distillation `labels`
    (`distill.target_answers`). Every `cfg.holdout`-th row is held out and scored (rows come sorted by prompt
    length, and the long prompts are mostly Shakespeare, so a strided split holds out both tasks alike)."""
    held = distill.held_out(labels["tokens"].shape[0], cfg.holdout)
    split = {part: {k: v[rows] for k, v in labels.items() if isinstance(v, torch.Tensor)}
             for part, rows in (("train", ~held), ("val", held))}
    kept_of = {n: cut_vocabulary(split["train"]["tokens"], split["train"]["topk_ids"], n)
               for n in sorted({cfg.keep_for(k) for k in cfg.layers})}
    t0 = time.perf_counter()
    streams = {part: residual_streams(target, d["tokens"], d["mask"], cfg.layers) for part, d in split.items()}
    log(f"residual streams of {sum(len(s[cfg.layers[0]]) for s in streams.values())} positions in "
        f"{time.perf_counter() - t0:.0f} s")
    out = {}
    for k in cfg.layers:
        kept = kept_of[cfg.keep_for(k)]
        (ids, logp), (ids_val, logp_val) = labelled(split["train"], kept), labelled(split["val"], kept)
        draft = LensDraft(target, k, kept)
        with torch.no_grad():  # the untrained lens is the logit lens: the baseline the training improves on
            _, logit_lens = distillation_loss(draft.cut_logits(streams["val"][k])[:, None], ids_val[:, None],
                                              logp_val[:, None])
        history = train_lens(draft, streams["train"][k], ids, logp, cfg.train, x_val=streams["val"][k],
                             ids_val=ids_val, logp_val=logp_val, log=log)
        save_lens(folder / name(k), draft, dict(
            name=name(k), target=target_id, corpus_key=labels["key"], ladder_config=asdict(cfg),
            train_positions=len(ids), heldout_positions=len(ids_val), history=history,
            heldout_top1_agreement=history[-1]["heldout_top1_agreement"], logit_lens_top1_agreement=logit_lens.item(),
            trained_numbers=sum(p.numel() for p in draft.trainable().values())))
        out[k] = draft.eval()
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m specrepro.ladder`: generate (or reuse) the target's answers, train and store the ladder."""
    import argparse

    from . import models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=list(LAYERS))
    ap.add_argument("--epochs", type=float, default=LadderConfig.train.epochs)
    ap.add_argument("--keep", type=int, default=None, help=f"ids of every draft's cut head (default: "
                    f"{LadderConfig.keep}, and as LadderConfig.keep_by_layers says for lens-0)")
    ap.add_argument("--n-code", type=int, default=768)
    ap.add_argument("--n-text", type=int, default=288)
    args = ap.parse_args(argv)
    target, tokenizer = models.load_target(), models.load_tokenizer()
    dcfg = distill.DistillConfig(n_code=args.n_code, n_text=args.n_text, max_new_tokens=128, context=384)
    labels = distill.target_answers(target, tokenizer, dcfg, target_id=models.GGUF_SHA256)
    train = TrainConfig(**asdict(LadderConfig.train) | {"epochs": args.epochs})
    keep = dict(keep=args.keep, keep_by_layers=()) if args.keep else {}
    build_ladder(target, labels, LadderConfig(layers=tuple(args.layers), train=train, **keep),
                 target_id=models.GGUF_SHA256)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
