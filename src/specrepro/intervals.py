"""Confidence intervals for the package's claims: the percentile bootstrap over independent units (prompts, or
batches of prompts), resampled in pairs so that two methods measured on the same units stay matched.

Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13 (percentile intervals). A claim in a notebook
or the README is the estimate on all units with the interval from `bootstrap`, and the number of units.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm


@dataclass(frozen=True)
class Interval:
    estimate: float  # the statistic on all units
    lo: float
    hi: float
    n_units: int
    level: float

    def __str__(self) -> str:
        return f"{self.estimate:.2f} [{self.lo:.2f}, {self.hi:.2f}] ({self.level:.0%} CI, n={self.n_units})"


def proportion(k: int, n: int, *, level: float = 0.95) -> Interval:
    """k successes in n independent trials: the share with its Wilson score interval (Wilson 1927), which stays
    inside [0, 1] and is not degenerate at 0 or n successes (0 of 200 gives [0, 0.019], not [0, 0])."""
    if n < 1 or not 0 <= k <= n or not 0 < level < 1:
        raise ValueError(f"need 0 <= k <= n, n >= 1 and 0 < level < 1; got k={k}, n={n}, level={level}")
    z, p = float(norm.ppf((1 + level) / 2)), k / n
    centre, half = p + z * z / (2 * n), z * float(np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)))
    scale = 1 + z * z / n
    return Interval(p, max(0.0, (centre - half) / scale), min(1.0, (centre + half) / scale), n, level)


def bootstrap(statistic: Callable[..., float], *columns, n_boot: int = 2000, level: float = 0.95,
              seed: int = 0) -> Interval:
    """Percentile interval of `statistic(*columns)`, resampling the units (the rows shared by all columns) with
    replacement, paired across columns. Columns are 1-D arrays of equal length, one value per unit. With a single
    unit there is nothing to resample: the estimate comes with NaN bounds, not a zero-width interval that would read
    as certainty."""
    cols = [np.asarray(c, dtype=np.float64) for c in columns]
    n = len(cols[0])
    if n == 0 or any(len(c) != n for c in cols):
        raise ValueError(f"columns must be non-empty and of one length, got {[len(c) for c in cols]}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n == 1:
        return Interval(float(statistic(*cols)), float("nan"), float("nan"), 1, level)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    values = np.array([statistic(*(c[i] for c in cols)) for i in idx])
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(statistic(*cols)), float(lo), float(hi), n, level)


def ratio_of_sums(numerator, denominator) -> float:
    """sum(numerator) / sum(denominator): a pooled rate (e.g. seconds per token over prompts)."""
    return float(np.sum(numerator) / np.sum(denominator))


def speedup(seconds_a, tokens_a, seconds_b, tokens_b) -> float:
    """How many times faster method b produces a token than method a, pooled over units."""
    return ratio_of_sums(seconds_a, tokens_a) / ratio_of_sums(seconds_b, tokens_b)


def speedup_interval(seconds_a, tokens_a, seconds_b, tokens_b, *, n_boot: int = 2000, level: float = 0.95,
                     seed: int = 0) -> Interval:
    """How many times faster method b is than method a (`speedup`, pooled time per token), with its percentile
    bootstrap interval over the units both measured (prompts, or batches), resampled in pairs. One value per unit
    in each column; a single unit gets NaN bounds."""
    return bootstrap(speedup, seconds_a, tokens_a, seconds_b, tokens_b, n_boot=n_boot, level=level, seed=seed)
