"""The acceptance rate alpha of a draft, measured without running speculative decoding.

Leviathan et al. 2022, Def. 3.1 and Thm 3.5: the probability that speculative sampling accepts a draft token at a
given prefix is beta = sum_x min(p(x), q(x)), and alpha = E[beta] over the prefixes met while decoding. With greedy
decoding (one-hot p and q) beta is 1 exactly when the draft's argmax equals the target's. So alpha can be measured
on the target's own continuations of held-out prompts with one forward of each model, for every draft alike,
instead of one speculative run per draft and setting.
"""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import torch

from . import intervals, paths
from .data import encode_prompt, format_prompt, load_prompts
from .generate import autoregressive_generate, preceding_features
from .kvcache import concat_features
from .protocol import feature_layers
from .sampling import SamplingConfig, probs_from_logits


def eval_prompts(task: str, n_prompts: int, seed: int = 0) -> list[dict]:
    """A seeded sample of the task's held-out prompts."""
    ds = load_prompts(task)
    idx = sorted(random.Random(seed).sample(range(len(ds)), min(n_prompts, len(ds))))
    return [ds[i] for i in idx]


def prompts_apart(task: str, n_prompts: int, seed: int, exclude) -> list[dict]:
    """A seeded sample of the task's held-out prompts none of which has a task id in `exclude`: a set to choose a
    setting on (e.g. gamma), apart from the prompts the result is reported on, so that the reported number is an
    out-of-sample one (no winner's curse)."""
    ds = load_prompts(task)
    exclude = set(exclude)
    pool = [i for i in range(len(ds)) if ds[i]["task_id"] not in exclude]
    if not pool:
        raise ValueError(f"every {task} prompt is excluded: nothing is left to choose on")
    return [ds[i] for i in sorted(random.Random(seed).sample(pool, min(n_prompts, len(pool))))]


def target_continuations(target, tokenizer, task: str, *, n_prompts: int, n_tokens: int, temperature: float,
                         seed: int = 0, target_id: str = "", cache: bool = True) -> list[dict]:
    """The target's own continuations of held-out prompts (our autoregressive sampler), cached on disk.

    Returns [{"task_id", "prompt_ids": (1, L) long, "new_ids": (1, n) long}]. Stops at EOS.
    """
    examples = eval_prompts(task, n_prompts, seed)
    texts = [format_prompt(tokenizer, task, ex) for ex in examples]  # the key changes with the prompt format
    key = hashlib.sha256(json.dumps([task, n_prompts, n_tokens, temperature, seed, target_id, texts]).encode()
                         ).hexdigest()[:16]
    path = paths.CACHE / "continuations" / f"{task}-{key}.pt"
    if cache and target_id and path.exists():
        return torch.load(path)
    g = torch.Generator().manual_seed(seed)
    out = []
    for ex in examples:
        ids = encode_prompt(tokenizer, task, ex)
        r = autoregressive_generate(target, ids, max_new_tokens=n_tokens, temperature=temperature,
                                    eos_token_id=tokenizer.eos_token_id, generator=g)
        out.append(dict(task_id=ex["task_id"], prompt_ids=ids, new_ids=r.sequences[:, ids.shape[1]:]))
    if cache and target_id:
        with paths.writing_file(path) as tmp:
            torch.save(out, tmp)
    return out


@torch.no_grad()
def position_logits(model, prompt_ids: torch.Tensor, new_ids: torch.Tensor, *, target=None) -> torch.Tensor:
    """Logits predicting each of new_ids[0, i] from prompt + new_ids[:, :i], one full forward: (n, V).

    A draft that reads the target's features (`specrepro.protocol`) gets them from a forward of `target`, each
    token with the state of the position before: every position is then scored as the first drafted token of an
    iteration (depth 1), which bounds what later drafted tokens of the loop reach with the draft's own states."""
    n = new_ids.shape[1]
    full = torch.cat([prompt_ids, new_ids], dim=1).to(next(model.parameters()).device)
    extra = {}
    layers = feature_layers(model)
    if layers:
        if target is None:
            raise ValueError("this draft reads the target's features: pass target=...")
        hs = target(input_ids=full, output_hidden_states=True).hidden_states
        feats = concat_features(hs, layers)[0]  # (L, F)
        extra["target_features"] = preceding_features(feats, 0, full.shape[1])[None]  # (1, L, F)
    return model(input_ids=full, logits_to_keep=n + 1, **extra).logits[0, -(n + 1):-1].float().cpu()


def betas(target_logits: torch.Tensor, draft_logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """beta = sum_x min(p(x), q(x)) per position (Leviathan Def. 3.1); p, q warped by cfg. (n,)"""
    p = probs_from_logits(target_logits, cfg)
    q = probs_from_logits(draft_logits, cfg)
    return torch.minimum(p, q).sum(-1)


def expected_acceptance(target, draft, samples: list[dict], cfg: SamplingConfig,
                        target_logits: list[torch.Tensor] | None = None) -> float:
    """alpha = mean beta over every position of every continuation. Pass precomputed `target_logits`
    (one per sample, from `position_logits`) to score many drafts against one target pass."""
    total, count = 0.0, 0
    for i, s in enumerate(samples):
        if s["new_ids"].shape[1] == 0:
            continue
        tl = target_logits[i] if target_logits is not None else position_logits(target, s["prompt_ids"], s["new_ids"])
        b = betas(tl, position_logits(draft, s["prompt_ids"], s["new_ids"], target=target), cfg)
        total, count = total + float(b.sum()), count + b.numel()
    return total / count if count else float("nan")


def temperature_scan(target_logits: list[torch.Tensor], draft_logits: list[torch.Tensor], cfg: SamplingConfig,
                     temperatures, *, n_boot: int = 2000, seed: int = 0) -> list[dict]:
    """Is a draft's alpha held down by its calibration? Speculative sampling stays exact for any q, so a draft whose
    q is too flat or too sharp could sample at its own temperature. Per draft temperature T_q: alpha (pooled over
    every position, p warped by `cfg`, q by `cfg` with T_q) and its gain over T_q = cfg.temperature with a paired
    bootstrap interval over the continuations (one list entry each: (n, V) logits from `position_logits`). The best
    T_q is chosen on these same positions, so its gain is an optimistic bound, not a prediction."""
    if len(target_logits) != len(draft_logits) or not target_logits:
        raise ValueError(f"one target and one draft logits tensor per continuation, got {len(target_logits)} and "
                         f"{len(draft_logits)}")
    if cfg.greedy:
        raise ValueError("greedy decoding has no temperature to scan: q is one-hot at the draft's argmax")
    counts = np.array([t.shape[0] for t in target_logits], dtype=np.float64)
    p = [probs_from_logits(t, cfg) for t in target_logits]

    def beta_sums(t_q: float) -> np.ndarray:  # sum of beta over each continuation's positions
        q_cfg = SamplingConfig(temperature=t_q, top_k=cfg.top_k, top_p=cfg.top_p)
        return np.array([float(torch.minimum(pi, probs_from_logits(d, q_cfg)).sum()) for pi, d in zip(p, draft_logits)])

    base = beta_sums(cfg.temperature)
    rows = []
    for t_q in temperatures:
        sums = base if t_q == cfg.temperature else beta_sums(t_q)
        gain = intervals.bootstrap(lambda a, b, n: float((b.sum() - a.sum()) / n.sum()), base, sums, counts,
                                   n_boot=n_boot, seed=seed)
        rows.append(dict(draft_temperature=float(t_q), alpha=float(sums.sum() / counts.sum()), gain=gain.estimate,
                         gain_lo=gain.lo, gain_hi=gain.hi, continuations=len(counts), positions=int(counts.sum())))
    return rows


def agreement_intervals(hits, scored, *, n_boot: int = 2000, seed: int = 0) -> list[intervals.Interval]:
    """Per draft depth, the pooled top-1 agreement sum(hits) / sum(scored) with its percentile-bootstrap interval
    over rows (one request's answer each): `hits`, `scored` are (rows, depth) counts from
    `eagle_train.agreement_by_row`. Greedy, the depth-1 agreement is alpha at gamma = 1 (Leviathan Def. 3.1)."""
    hits, scored = np.asarray(hits, dtype=np.float64), np.asarray(scored, dtype=np.float64)
    if hits.ndim != 2 or hits.shape != scored.shape or (hits > scored).any():
        raise ValueError(f"hits and scored must be (rows, depth) counts with hits <= scored; got shapes {hits.shape} "
                         f"and {scored.shape}")
    return [intervals.bootstrap(intervals.ratio_of_sums, hits[:, k], scored[:, k], n_boot=n_boot, seed=seed)
            for k in range(hits.shape[1])]


def agreement_difference(a, b, *, n_boot: int = 2000, seed: int = 0) -> list[intervals.Interval]:
    """Per depth, draft b's pooled agreement minus draft a's on the same rows, with a paired bootstrap interval over
    rows. a and b are (hits, scored) pairs from `eagle_train.agreement_by_row` on one labels set and one selection
    of rows, so `scored` is the same array in both."""
    (ha, sa), (hb, sb) = ([np.asarray(x, dtype=np.float64) for x in pair] for pair in (a, b))
    if ha.shape != hb.shape or not np.array_equal(sa, sb):
        raise ValueError("the two drafts must be scored on the same rows and positions (one labels set, one selection "
                         f"of rows, one depth); got shapes {ha.shape} and {hb.shape}")

    def diff(x, y, n):
        return float((y.sum() - x.sum()) / n.sum())

    return [intervals.bootstrap(diff, ha[:, k], hb[:, k], sa[:, k], n_boot=n_boot, seed=seed)
            for k in range(ha.shape[1])]


def main(argv: list[str] | None = None) -> int:
    """`python -m specrepro.acceptance DRAFT [DRAFT ...]`: stored feature drafts' top-1 agreement with the target per
    depth on the training answers' training and held-out rows (a check for overfitting), each with its interval over
    rows, and each later draft's paired difference from the first; with --temperature-scan, `temperature_scan`."""
    import argparse
    from pathlib import Path

    from . import models
    from .distill import held_out
    from .eagle import load
    from .eagle_train import FeatureDraftConfig, agreement_by_row, answer_sets, cached_features

    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    ap.add_argument("drafts", type=Path, nargs="+", help="feature-draft folders (data/models/<name>)")
    ap.add_argument("--sampled-code", type=int, default=0, help="score on the sampled answers too: as many code "
                    "requests as `eagle_train --sampled-code` used (470 for the shipped sampled set)")
    ap.add_argument("--sampled-text", type=int, default=0, help="the same for text requests (586)")
    ap.add_argument("--held-out-only", action="store_true", help="skip the training rows (ten times as many)")
    ap.add_argument("--temperature-scan", action="store_true", help="instead: each draft's alpha at T = 0.8 with "
                    "top-p 0.95 when q is warped at other temperatures (`temperature_scan`), on the target's own "
                    "continuations (96 tokens sampled at T = 0.8) of --prompts held-out prompts per task")
    ap.add_argument("--prompts", type=int, default=12, help="prompts per task of the temperature scan")
    ap.add_argument("--seed", type=int, default=23, help="the scan's prompt sample (the notebooks use 0, 7 and 11)")
    args = ap.parse_args(argv)
    target, tokenizer = models.load_target(), models.load_tokenizer()
    drafts = [load(path, target=target) for path in args.drafts]
    if args.temperature_scan:
        cfg = SamplingConfig(temperature=0.8, top_p=0.95)
        for task in ("code", "text"):
            samples = target_continuations(target, tokenizer, task, n_prompts=args.prompts, n_tokens=96,
                                           temperature=cfg.temperature, seed=args.seed, target_id=models.GGUF_SHA256)
            tl = [position_logits(target, s["prompt_ids"], s["new_ids"]) for s in samples]
            for path, draft in zip(args.drafts, drafts):
                dl = [position_logits(draft, s["prompt_ids"], s["new_ids"], target=target) for s in samples]
                for r in temperature_scan(tl, dl, cfg, (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)):
                    print(f"{path.name}, {task}, T_q {r['draft_temperature']:g}: alpha {r['alpha']:.3f}, gain over "
                          f"T_q = {cfg.temperature:g} {r['gain']:+.3f} [{r['gain_lo']:+.3f}, {r['gain_hi']:+.3f}] "
                          f"({r['continuations']} continuations, {r['positions']} positions)")
        return 0
    _, labels, sampled = answer_sets(target, tokenizer, sampled_code=args.sampled_code, sampled_text=args.sampled_text)

    def show(values) -> str:
        return "; ".join(f"depth {k}: {iv}" for k, iv in enumerate(values, 1))

    # `eagle_train` holds out every holdout-th row of the greedy answers followed by the sampled ones, so a sampled
    # row's place in that concatenation, not in its own set, says whether a draft trained on both saw it
    for set_name, part, offset in (("greedy answers", labels, 0),
                                   ("sampled answers", sampled, labels["tokens"].shape[0])):
        if part is None:
            continue
        held = held_out(part["tokens"].shape[0], FeatureDraftConfig.holdout, offset)
        feats = {layers: cached_features(target, part, FeatureDraftConfig(feature_layers=layers), part["key"])
                 for layers in {draft.target_features for draft in drafts}}  # one read per set and feature layers
        for rows_name, rows in (("training rows", (~held).nonzero()[:, 0]), ("held-out rows", held.nonzero()[:, 0])):
            if args.held_out_only and rows_name == "training rows":
                continue
            scores = []
            for path, draft in zip(args.drafts, drafts):
                scores.append(agreement_by_row(draft, part, feats[draft.target_features], rows))
                print(f"{path.name}, {set_name}, {rows_name}: top-1 agreement {show(agreement_intervals(*scores[-1]))}")
            for path, score in zip(args.drafts[1:], scores[1:]):
                print(f"{path.name} minus {args.drafts[0].name}, {set_name}, {rows_name}, paired over rows: "
                      f"{show(agreement_difference(scores[0], score))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
