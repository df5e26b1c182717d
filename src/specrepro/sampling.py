"""Speculative sampling: the acceptance rule, and the logits warpers it shares with plain sampling.

Notation, declared once for the whole package (Leviathan et al. 2022, arXiv 2211.17192, Alg. 1;
Chen et al. 2023, arXiv 2302.01318, Alg. 2):

    p      the target model's next-token distribution: the distribution that is preserved
    q      the draft model's next-token distribution
    gamma  the number of draft tokens proposed per iteration (Chen et al. call it K)
    x_i    the i-th draft token, drawn from q_i

A draft token x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)). At the first rejected position the
replacement is drawn from the residual norm(max(0, p_i - q_i)) (Leviathan Sec. 2.3, Chen Eq. 1). If all gamma
drafts are accepted, a bonus token is drawn from p_{gamma+1}. The bonus case is the residual against an all-zero
draft row, so one code path serves both.

Every random choice here is made by inverse-CDF from a uniform that the caller passes in, which keeps
`speculative_accept` a pure function of tensors: the same inputs give the same outputs on every device, and the
tests can enumerate its behaviour exactly. Outside this module, write `target_probs` / `draft_probs`.

Warping (temperature, top-k, top-p) follows transformers' `TemperatureLogitsWarper`, `TopKLogitsWarper` and
`TopPLogitsWarper`, in that order, and is applied to p and q alike: the distribution speculative sampling
preserves is the *warped* target distribution, the one plain sampling with the same settings draws from.
Temperature 0 means greedy: p and q become one-hot at their argmax, and the same acceptance rule then accepts
x_i exactly when it equals the target's argmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How next-token distributions are formed from logits. `temperature=0` means greedy (argmax)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {t!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or isinstance(self.top_k, bool)
                                       or self.top_k < 1):
            raise ValueError(f"top_k must be None or an integer >= 1, got {self.top_k!r}")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be None or in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_logits(logits: torch.Tensor, who: str) -> None:
    """Raise if a model produced NaN or +inf logits, or a row with no finite logit at all.

    One reduction: a row's max is NaN if the row holds a NaN, +inf if it holds +inf, -inf if every entry is -inf,
    and finite otherwise (-inf entries beside finite ones are fine: masked tokens, one-hot drafts)."""
    if not bool(torch.isfinite(logits.amax(-1)).all()):
        raise FloatingPointError(
            f"the {who} model returned NaN or infinite logits. This is usually an overflow in float16 or a "
            f"corrupted checkpoint: load the {who} in float32 or bfloat16 (dtype=...) and check its weights.")


def warp_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p, with transformers' semantics. Removed tokens get -inf.

    Not for greedy configs (temperature 0): use `probs_from_logits`, which turns those into one-hots.
    """
    scores = logits / cfg.temperature if cfg.temperature != 1 else logits
    if cfg.top_k is not None and cfg.top_k < scores.shape[-1]:
        kth = torch.topk(scores, cfg.top_k, dim=-1).values[..., -1:]  # ties with the k-th score are kept
        scores = scores.masked_fill(scores < kth, -math.inf)
    if cfg.top_p is not None and cfg.top_p < 1:
        scores = scores.masked_fill(top_p_drop(scores, cfg.top_p), -math.inf)
    return scores


TOP_P_CANDIDATES = 256  # top-p looks among this many top tokens before it sorts a whole large vocabulary


def top_p_drop(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """The tokens top-p removes (bool, like `scores`): in ascending order of score, every token whose cumulative
    probability (itself and all below it) is at most 1 - top_p, never the most likely (transformers' rule).

    Sorting a 49,152-token vocabulary costs about 2.7 ms on a 2-core CPU, more than a small draft's forward. Where
    the vocabulary is large and the `TOP_P_CANDIDATES` most likely tokens of every row hold at least top_p of the
    mass, every other token is removed (its cumulative probability is at most their complement), so only the
    candidates are ordered (ties in index order, as the whole-row sort orders them here; the tests check it), their
    cumulative sums starting from that complement. Otherwise the whole row is sorted. The two paths differ only in
    float rounding of the cumulative sums (`tests/test_sampling.py` compares them with each other and with
    transformers)."""
    k, order = TOP_P_CANDIDATES, None
    if scores.shape[-1] > 4 * k:
        probs = scores.softmax(-1)
        top, idx = torch.topk(probs, k, dim=-1)  # descending probabilities
        rest = 1 - top.sum(-1, keepdim=True)  # the mass outside the candidates
        # every token as unlikely as the least likely candidate goes, whichever order ties take
        low = rest + (top == top[..., -1:]).sum(-1, keepdim=True) * top[..., -1:]
        if bool((low <= 1 - top_p).all()):
            idx = idx.sort(-1).values  # in index order: the stable sort then orders ties as the whole-row sort
            order = idx.gather(-1, torch.sort(scores.gather(-1, idx), dim=-1, stable=True).indices)  # ascending
            cum = rest + probs.gather(-1, order).cumsum(-1)
    if order is None:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cum = sorted_scores.softmax(-1).cumsum(-1)
    drop_sorted = cum <= (1 - top_p)
    drop_sorted[..., -1] = False  # always keep the most likely token
    return torch.ones_like(scores, dtype=torch.bool).scatter_(-1, order, drop_sorted)  # tokens not in order go


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Next-token probabilities (..., V) in at least float32. Greedy configs give one-hots at the argmax."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # the ratio p/q needs more precision than the half-precision logits carry
    if cfg.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return warp_logits(logits, cfg).softmax(-1)


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: probs (..., V) need not be normalised, u (...) uniforms in [0, 1). Returns (...) long.

    A token with zero mass is never returned, also when rounding pushes u * total onto the total.
    """
    cdf = probs.double().cumsum(-1)  # (..., V)
    target = (u.double() * cdf[..., -1]).unsqueeze(-1)  # (..., 1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # first index with cdf > target
    last_with_mass = probs.shape[-1] - 1 - (probs.flip(-1) > 0).long().argmax(-1)
    return torch.minimum(idx, last_with_mass)


def speculative_accept(
    p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, u_accept: torch.Tensor, u_residual: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The acceptance rule of speculative sampling (Leviathan Alg. 1 steps 5-7, Chen Alg. 2), batched.

    Args:
        p: (B, gamma+1, V) target probabilities at the pending position and after each draft token.
        q: (B, gamma, V) draft probabilities that x was drawn from.
        x: (B, gamma) draft tokens.
        u_accept: (B, gamma) uniforms in [0, 1), one per draft token.
        u_residual: (B,) uniforms in [0, 1) for the replacement or bonus token.

    Returns:
        n: (B,) long, the number of leading draft tokens accepted (0..gamma).
        token: (B,) long, the next token: drawn from norm(max(0, p_n - q_n)) if n < gamma, else from p_gamma.
        The new text of row b is x[b, :n[b]] followed by token[b].
    """
    B, gamma = x.shape
    p = p.double()
    q = q.double()
    px = p[:, :gamma].gather(-1, x.unsqueeze(-1)).squeeze(-1)  # (B, gamma)
    qx = q.gather(-1, x.unsqueeze(-1)).squeeze(-1)  # (B, gamma)
    # u < min(1, p/q)  <=>  u * q < p, which needs no division and rejects p(x) = 0 even when q(x) = 0
    accepted = u_accept.double() * qx < px  # (B, gamma)
    n = accepted.long().cumprod(-1).sum(-1)  # (B,) length of the leading run of acceptances
    q_padded = torch.cat([q, q.new_zeros(B, 1, q.shape[-1])], dim=1)  # (B, gamma+1, V): bonus row is zero
    rows = torch.arange(B, device=p.device)
    p_n, q_n = p[rows, n], q_padded[rows, n]  # (B, V)
    residual = (p_n - q_n).clamp_min(0)  # (B, V)
    # Zero-mass guard: a rejection with p_n <= q_n everywhere happens only through rounding (p == q up to
    # numerics); the residual is then undefined and p_n is the distribution the target asks for.
    empty = residual.sum(-1, keepdim=True) <= 0
    residual = torch.where(empty, p_n, residual)
    return n, sample_from(residual, u_residual)


def greedy_accept(target_argmax: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`speculative_accept` at temperature 0, from the argmaxes alone.

    With p and q one-hot (greedy warping), x_i is accepted exactly when it is the target's argmax, and the
    replacement or bonus token is the target's argmax where the run of acceptances stops: the same n and token as
    `speculative_accept(onehot(p), onehot(q), x, u, u')` for any uniforms, without building (gamma+1) x V
    distributions.

    Args:
        target_argmax: (B, gamma+1) long, the target's argmax at the pending position and after each draft token.
        x: (B, gamma) long, draft tokens.
    Returns: n (B,) and token (B,) as `speculative_accept`.
    """
    gamma = x.shape[1]
    n = (x == target_argmax[:, :gamma]).long().cumprod(-1).sum(-1)  # (B,)
    return n, target_argmax.gather(1, n[:, None]).squeeze(1)
