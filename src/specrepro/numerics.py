"""Same distribution, different draw: where speculative decoding's numerics and random numbers part ways.

Chen et al. 2023 (arXiv 2302.01318), Sec. 3: "because the different computation graphs lead to different numerics,
we cannot expect identical outputs". Speculative sampling scores gamma+1 tokens in one forward, plain decoding one
at a time; the same logits come out of different kernels, summation orders and batch shapes, so they differ in the
last bits. Greedy decoding flips only where the top two logits are that close; sampling moreover consumes random
numbers in another order (gamma draft draws, gamma acceptance draws and a residual draw per iteration), so the
same seed gives a different sample from the same distribution.

Probes here measure each effect; the paired test `paired_quality_test` tells "a different draw" from "a broken
implementation" given per-prompt quality of both methods.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats as sps

from .kvcache import make_cache, model_forward


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool):
    """Set torch.use_deterministic_algorithms for the block and restore the previous setting afterwards."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(enabled, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


# ---- logits along one continuation, three computation graphs -------------------------------------------------


def logits_decode(model, prompt_ids: torch.Tensor, cont_ids: torch.Tensor) -> torch.Tensor:
    """(a) One token at a time with a KV cache, as autoregressive decoding computes them: (n, V) predicting each
    continuation token. The same forwards as `logits_verify` with blocks of one token (gamma = 0)."""
    return logits_verify(model, prompt_ids, cont_ids, gamma=0)


@torch.no_grad()
def logits_verify(model, prompt_ids: torch.Tensor, cont_ids: torch.Tensor, gamma: int) -> torch.Tensor:
    """(b) In verification passes of gamma+1 tokens with a KV cache, as speculative decoding computes them when
    every draft is accepted: (n, V). The prompt but its last token is prefilled first, as in `specrepro.generate`."""
    dev = next(model.parameters()).device
    cache = make_cache(model)
    seq = torch.cat([prompt_ids, cont_ids], 1).to(dev)
    L, n = prompt_ids.shape[1], cont_ids.shape[1]
    if L > 1:
        model_forward(model, seq[:, :L - 1], cache, logits_to_keep=1)
    out, pos = [], L - 1
    while pos < L - 1 + n:
        block = seq[:, pos:min(pos + gamma + 1, L - 1 + n)]
        out.append(model_forward(model, block, cache).logits[0])
        pos += block.shape[1]
    return torch.cat(out).double().cpu()


@torch.no_grad()
def logits_full(model, prompt_ids: torch.Tensor, cont_ids: torch.Tensor) -> torch.Tensor:
    """(c) One forward of the whole sequence without a cache: (n, V)."""
    dev = next(model.parameters()).device
    n = cont_ids.shape[1]
    seq = torch.cat([prompt_ids, cont_ids], 1).to(dev)
    return model(input_ids=seq).logits[0, -(n + 1):-1].double().cpu()


MANTISSA_BITS = {torch.float64: 52, torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}


def ulp_distance(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """|a - b| in units of the last place of `dtype` at the scale of the row: the spacing of representable numbers
    at max |a| over the last dimension (the whole tensor for a 0-d one).

    A logit is a sum of products whose rounding errors are on the scale of the row's large entries; measured at
    its own magnitude, a near-zero logit that moved by 1e-5 would count millions of ULPs."""
    scale = a.abs().amax(-1, keepdim=True) if a.dim() else a.abs()
    mag = scale.clamp_min(torch.finfo(dtype).tiny)
    spacing = torch.pow(2.0, torch.floor(torch.log2(mag)) - MANTISSA_BITS[dtype])
    return (a - b).abs() / spacing


@dataclass(frozen=True)
class LogitDiff:
    """How two computations of the same logits differ."""

    max_abs: float  # max |delta logit|
    max_ulp: float  # max distance in ULPs of the compute dtype
    argmax_flips: int  # positions whose argmax differs
    positions: int
    flip_gaps: tuple[float, ...]  # top-1 minus top-2 logit (of the first computation) where the argmax flips
    median_gap: float  # the median top-1/top-2 gap over all positions, for scale

    @property
    def flip_rate(self) -> float:
        return self.argmax_flips / self.positions if self.positions else float("nan")


def compare_logits(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> LogitDiff:
    """Compare two (n, V) logit tensors computed in `dtype`."""
    top2 = a.topk(2, dim=-1).values
    gap = top2[:, 0] - top2[:, 1]
    flips = a.argmax(-1) != b.argmax(-1)
    return LogitDiff(max_abs=float((a - b).abs().max()), max_ulp=float(ulp_distance(a, b, dtype).max()),
                     argmax_flips=int(flips.sum()), positions=a.shape[0],
                     flip_gaps=tuple(float(g) for g in gap[flips]), median_gap=float(gap.median()))


# ---- batch composition -------------------------------------------------------------------------------------


@torch.no_grad()
def batch_composition_diff(model, row: torch.Tensor, others: torch.Tensor) -> tuple[float, int]:
    """Logits of `row` (1, T) computed alone vs as row 0 of a batch with `others` (B-1, T), same length, no padding.
    Returns (max |delta logit|, positions whose argmax flips)."""
    dev = next(model.parameters()).device
    alone = model(input_ids=row.to(dev)).logits[0].double()
    batched = model(input_ids=torch.cat([row, others]).to(dev)).logits[0].double()
    return float((alone - batched).abs().max()), int((alone.argmax(-1) != batched.argmax(-1)).sum())


# ---- same seed, different draw -----------------------------------------------------------------------------


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Index of the first differing token of two 1-D token sequences (compared up to the shorter), else None."""
    n = min(a.numel(), b.numel())
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if diff.numel() else None


def uniform_index_of_tokens(stats) -> list[int]:
    """For a speculative run, the position in the generator's stream of the uniform that decided each emitted
    token (accepted drafts: their acceptance draw; the last token of an iteration: the residual/bonus draw).
    Autoregressive decoding uses uniform k for token k, so the streams line up only by coincidence."""
    out, used = [], 0
    for g, n in zip(stats.proposed, stats.accepted):
        accept_base = used + g  # after the g draft draws
        out += [accept_base + i for i in range(n)]
        out.append(accept_base + g)  # the residual (or bonus) uniform
        used += 2 * g + 1
    return out


# ---- who was right? -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairedVerdict:
    n: int
    mean_a: float
    mean_b: float
    p_value: float
    test: str
    verdict: str


def paired_quality_test(quality_a, quality_b, *, level: float = 0.05, binary: bool | None = None,
                        names: tuple[str, str] = ("autoregressive", "speculative")) -> PairedVerdict:
    """Is method b reproducibly worse (or better) than a on the same prompts, or within what different draws give?

    Binary metrics (pass/fail) use McNemar's exact test on the discordant pairs; continuous ones the Wilcoxon
    signed-rank test. A p-value below the significance `level` (not the acceptance rate alpha) with b worse says
    "reproducibly worse: look for an implementation problem"; otherwise the difference is within sampling noise of
    two draws from one distribution.
    """
    a, b = np.asarray(quality_a, dtype=float), np.asarray(quality_b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError("quality_a and quality_b must be equal-length 1-D sequences, one value per prompt")
    binary = bool(np.isin(np.concatenate([a, b]), (0, 1)).all()) if binary is None else binary
    if binary:
        worse, better = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
        k = worse + better
        p = 1.0 if k == 0 else float(sps.binomtest(worse, k, 0.5).pvalue)
        test = f"McNemar exact ({worse} prompts only {names[0]} passed, {better} only {names[1]})"
    else:
        d = b - a
        p = 1.0 if not np.any(d) else float(sps.wilcoxon(a, b).pvalue)
        test = "Wilcoxon signed-rank"
    if p < level:
        direction = "worse" if b.mean() < a.mean() else "better"
        verdict = (f"{names[1]} is reproducibly {direction} (p = {p:.3g} < {level}): not a different draw; "
                   "check the implementation")
    else:
        verdict = (f"no significant difference (p = {p:.3g} >= {level}): consistent with two draws from one "
                   "distribution")
    return PairedVerdict(int(a.size), float(a.mean()), float(b.mean()), p, test, verdict)



@dataclass(frozen=True)
class Equivalence:
    """Two one-sided tests (TOST) of a paired mean difference b - a against the margin +-`margin`."""

    n: int
    mean_diff: float
    ci: tuple[float, float]  # the (1 - 2 level) confidence interval of the mean difference
    p_value: float  # the larger of the two one-sided p-values
    margin: float
    level: float

    @property
    def equivalent(self) -> bool:
        """True when the difference is shown to lie within the margin (both one-sided tests reject)."""
        return self.p_value < self.level


def paired_equivalence_test(quality_a, quality_b, *, margin: float, level: float = 0.05) -> Equivalence:
    """Schuirmann's TOST on paired per-prompt values: "quality unchanged" as a finding, not an absence of one.

    H0: |mean(b - a)| >= margin, rejected at `level` when both one-sided t-tests reject, i.e. when the
    (1 - 2 level) confidence interval of the mean difference lies inside (-margin, margin). Pass/fail metrics
    (pass@1) work as 0/1 values: the difference is then one of pass rates. With no variance in the differences
    the interval is the point itself."""
    a, b = np.asarray(quality_a, dtype=float), np.asarray(quality_b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError("quality_a and quality_b must be equal-length 1-D sequences of at least 2 prompts")
    if not margin > 0 or not 0 < level < 0.5:
        raise ValueError(f"need margin > 0 and 0 < level < 0.5, got margin={margin}, level={level}")
    d = b - a
    n, mean = d.size, float(d.mean())
    se = float(d.std(ddof=1) / np.sqrt(n))
    if se == 0:
        inside = abs(mean) < margin
        return Equivalence(n, mean, (mean, mean), 0.0 if inside else 1.0, margin, level)
    t = sps.t(df=n - 1)
    p_low = float(t.sf((mean + margin) / se))  # H0: mean <= -margin
    p_high = float(t.cdf((mean - margin) / se))  # H0: mean >= margin
    half = float(t.ppf(1 - level)) * se
    return Equivalence(n, mean, (mean - half, mean + half), max(p_low, p_high), margin, level)


def equivalence_power(sd_diff: float, n: int, *, margin: float, level: float = 0.05, true_diff: float = 0.0
                      ) -> float:
    """Power of `paired_equivalence_test` with n prompts when the true mean difference is `true_diff` and the
    per-prompt differences have standard deviation `sd_diff`: the chance that the (1 - 2 level) interval lands
    inside +-margin. Normal approximation of the mean with the test's t critical value (Schuirmann 1987)."""
    if n < 2 or not margin > 0 or not 0 < level < 0.5 or sd_diff < 0:
        raise ValueError(f"need n >= 2, margin > 0, 0 < level < 0.5, sd_diff >= 0; got {n}, {margin}, {level}, "
                         f"{sd_diff}")
    if sd_diff == 0:
        return float(abs(true_diff) < margin)
    se, crit = sd_diff / math.sqrt(n), float(sps.t(df=n - 1).ppf(1 - level))
    power = sps.norm.cdf((margin - true_diff) / se - crit) - sps.norm.cdf(-(margin + true_diff) / se + crit)
    return float(max(0.0, power))


def detectable_difference(sd_diff: float, n: int, *, level: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean difference a two-sided paired test at `level` detects with probability `power`, for
    n prompts whose differences have standard deviation `sd_diff`: (t_{1-level/2} + z_power) sd / sqrt(n). What a
    design can see, to set beside the movements a paper reports (normal approximation with the t critical value)."""
    if n < 2 or sd_diff < 0 or not 0 < level < 1 or not 0 < power < 1:
        raise ValueError(f"need n >= 2, sd_diff >= 0, 0 < level < 1, 0 < power < 1; got {n}, {sd_diff}, {level}, "
                         f"{power}")
    return float((sps.t(df=n - 1).ppf(1 - level / 2) + sps.norm.ppf(power)) * sd_diff / math.sqrt(n))


def chisquare_two_sample(counts_a: np.ndarray, counts_b: np.ndarray, min_expected: float = 5.0
                         ) -> tuple[float, int, float]:
    """Chi-squared test of homogeneity of two histograms over the same categories; categories whose pooled
    expected count is below `min_expected` are merged. Returns (statistic, dof, p_value)."""
    a, b = np.asarray(counts_a, float).ravel(), np.asarray(counts_b, float).ravel()
    total = a + b
    keep = total > 0
    a, b, total = a[keep], b[keep], total[keep]
    small = total * min(a.sum(), b.sum()) / total.sum() < min_expected
    if small.any():
        a = np.append(a[~small], a[small].sum())
        b = np.append(b[~small], b[small].sum())
    table = np.stack([a, b])
    table = table[:, table.sum(0) > 0]
    if table.shape[1] < 2:
        return 0.0, 0, 1.0
    stat, p, dof, _ = sps.chi2_contingency(table, correction=False)
    return float(stat), int(dof), float(p)


def chisquare_power(p0: np.ndarray, p1: np.ndarray, n: int, dof: int, level: float) -> float:
    """Power of a chi-squared goodness-of-fit test with n samples to reject p0 when the truth is p1 (noncentral
    chi-squared approximation, noncentrality n * sum (p1 - p0)^2 / p0)."""
    p0, p1 = np.asarray(p0, float), np.asarray(p1, float)
    keep = p0 > 0
    lam = n * float((((p1 - p0) ** 2)[keep] / p0[keep]).sum())
    crit = sps.chi2.ppf(1 - level, dof)
    return float(sps.ncx2.sf(crit, dof, lam)) if lam > 0 else level


def two_sample_power(p_a: np.ndarray, p_b: np.ndarray, n: int, level: float, *, reps: int = 1000,
                     seed: int = 0) -> float:
    """Power of `chisquare_two_sample` as it is run, by simulation: the share of `reps` pairs of n-sample histograms
    drawn from p_a and p_b (merged bins and all) that it rejects at `level`. With p_a = p_b: its false-alarm rate."""
    rng = np.random.default_rng(seed)
    a = rng.multinomial(n, np.asarray(p_a, float) / np.sum(p_a), size=reps)
    b = rng.multinomial(n, np.asarray(p_b, float) / np.sum(p_b), size=reps)
    return float(np.mean([chisquare_two_sample(x, y)[2] < level for x, y in zip(a, b)]))


def samples_for_power(p_a: np.ndarray, p_b: np.ndarray, level: float, power: float = 0.9, *,
                      grid: tuple[int, ...] = (100, 200, 300, 500, 1000, 2000, 3000, 5000, 10000, 20000),
                      reps: int = 500, seed: int = 0) -> int | None:
    """The smallest n of `grid` at which `two_sample_power` reaches `power` (None if none does)."""
    for n in grid:
        if two_sample_power(p_a, p_b, n, level, reps=reps, seed=seed) >= power:
            return n
    return None


def top1_top2_gap(logits: torch.Tensor) -> torch.Tensor:
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]

