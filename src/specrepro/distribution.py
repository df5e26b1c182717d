"""Exact target distributions by enumeration, and the goodness-of-fit test that compares samples with them.

Claim 1 (Leviathan et al. 2022, Thm 3.5 / Appendix A.1; Chen et al. 2023, Thm 1): speculative sampling draws
from the target's distribution exactly. On a vocabulary of V tokens the joint distribution of the first n
generated tokens has V**n cells, small enough to enumerate from the target's logits and to test a sampler
against with Pearson's chi-squared test.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats as sps

from .sampling import SamplingConfig, probs_from_logits


@torch.no_grad()
def exact_joint_distribution(model, input_ids: torch.Tensor, n_tokens: int, cfg: SamplingConfig) -> torch.Tensor:
    """P(x_1..x_n | prompt) under the warped target distribution, as a float64 tensor of shape (V,)*n.

    Every prefix is scored by a full forward without a KV cache (the reference computation graph).
    """
    if input_ids.shape[0] != 1:
        raise ValueError("exact_joint_distribution takes one prompt, shape (1, L)")
    V = model.get_output_embeddings().weight.shape[0]
    device = next(model.parameters()).device
    joint = torch.ones((), dtype=torch.float64)
    prefixes = input_ids.to(device)  # (V**k, L + k) after step k
    for k in range(n_tokens):
        probs = probs_from_logits(model(input_ids=prefixes).logits[:, -1], cfg).double().cpu()  # (V**k, V)
        joint = (joint.reshape(-1, 1) * probs).reshape((V,) * (k + 1))
        if k + 1 < n_tokens:
            nxt = torch.arange(V, device=device).repeat(prefixes.shape[0])[:, None]
            prefixes = torch.cat([prefixes.repeat_interleave(V, dim=0), nxt], dim=1)
    return joint


def counts_of(samples: np.ndarray | list, vocab_size: int) -> np.ndarray:
    """Histogram of sampled n-token tuples, shape (V,)*n, from an (N, n) array of token ids."""
    samples = np.asarray(samples, dtype=np.int64)
    flat = np.ravel_multi_index(samples.T, (vocab_size,) * samples.shape[1])
    return np.bincount(flat, minlength=vocab_size ** samples.shape[1]).reshape((vocab_size,) * samples.shape[1])


@dataclass(frozen=True)
class GofResult:
    """Pearson chi-squared goodness of fit of observed counts to exact probabilities."""

    statistic: float
    dof: int
    p_value: float
    n_samples: int
    impossible: int  # samples that fell on cells of probability 0 (any one of them rejects outright)
    total_variation: float  # 0.5 * sum |empirical - exact|

    def rejects(self, false_alarm_rate: float) -> bool:
        return self.p_value < false_alarm_rate


def chisquare_gof(counts: np.ndarray, probs: np.ndarray | torch.Tensor, min_expected: float = 5.0) -> GofResult:
    """Chi-squared test of `counts` against `probs`, pooling cells whose expected count is below `min_expected`
    into one cell so the chi-squared approximation holds. A sample in a zero-probability cell gives p = 0;
    zero-probability cells take no part otherwise."""
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    if not math.isclose(probs.sum(), 1.0, abs_tol=1e-9):
        raise ValueError(f"probs must sum to 1, got {probs.sum()}")
    n = counts.sum()
    tv = 0.5 * np.abs(counts / n - probs).sum()
    impossible = int(counts[probs == 0].sum())
    if impossible:
        return GofResult(math.inf, 0, 0.0, int(n), impossible, float(tv))
    possible = probs > 0
    counts, expected = counts[possible], probs[possible] * n
    big = expected >= min_expected
    obs, exp = list(counts[big]), list(expected[big])
    if (~big).any():
        if expected[~big].sum() >= min_expected or not obs:
            obs.append(counts[~big].sum())
            exp.append(expected[~big].sum())
        else:  # the pooled cell is itself too small: merge it into the smallest cell
            i = int(np.argmin(exp))
            obs[i] += counts[~big].sum()
            exp[i] += expected[~big].sum()
    if len(obs) < 2:
        raise ValueError("too few samples for a chi-squared test: every cell's expected count is below "
                         f"{min_expected}; draw more samples")
    stat, p = sps.chisquare(obs, exp)
    return GofResult(float(stat), len(obs) - 1, float(p), int(n), 0, float(tv))


def all_sequences(vocab_size: int, n_tokens: int) -> list[tuple[int, ...]]:
    """Every n-token tuple, in the row-major order of `exact_joint_distribution(...).ravel()`."""
    return list(itertools.product(range(vocab_size), repeat=n_tokens))


def sample_sequences(target, draft, input_ids: torch.Tensor, *, method: str, n_tokens: int, n_samples: int,
                     cfg: SamplingConfig, generator: torch.Generator, gamma: int = 1) -> tuple[np.ndarray, list]:
    """Draw `n_samples` continuations of `n_tokens` tokens with one generator.

    method: "autoregressive" (draft unused) or "speculative". Returns the (n_samples, n_tokens) array of new tokens
    and the list of each run's `GenerationStats`.
    """
    from .generate import autoregressive_generate, speculative_generate

    kw = dict(max_new_tokens=n_tokens, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
              generator=generator)
    if method == "autoregressive":
        runs = [autoregressive_generate(target, input_ids, **kw) for _ in range(n_samples)]
    elif method == "speculative":
        runs = [speculative_generate(target, draft, input_ids, gamma=gamma, **kw) for _ in range(n_samples)]
    else:
        raise ValueError(f"method must be 'autoregressive' or 'speculative', got {method!r}")
    L = input_ids.shape[1]
    return np.stack([r.sequences[0, L:].numpy() for r in runs]), [r.stats for r in runs]
