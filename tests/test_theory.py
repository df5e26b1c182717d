"""Leviathan et al. 2022, Sec. 3 closed forms, checked against the paper's numbers and against simulation."""

import math

import pytest
import torch

from specrepro import theory


def test_leviathan_table_1_example():
    # alpha = 0.8, gamma = 5 (c = c_hat = 0): 3.69x faster, 1.63x the arithmetic operations
    assert round(theory.walltime_improvement(0.8, 5, 0.0), 2) == 3.69
    assert round(theory.operations_factor(0.8, 5, 0.0), 2) == 1.63


def test_expected_tokens_limits_and_eq_1():
    assert theory.expected_tokens(0.0, 7) == 1.0
    assert theory.expected_tokens(1.0, 7) == 8.0
    assert math.isclose(theory.expected_tokens(0.5, 3), 1 + 0.5 + 0.25 + 0.125)


def test_expected_tokens_matches_simulated_truncated_geometric():
    g = torch.Generator().manual_seed(0)
    alpha, gamma, n = 0.7, 4, 200_000
    accept = torch.rand(n, gamma, generator=g) < alpha
    tokens = accept.long().cumprod(-1).sum(-1) + 1
    se = tokens.float().std().item() / math.sqrt(n)
    assert abs(tokens.float().mean().item() - theory.expected_tokens(alpha, gamma)) < 4 * se


def test_walltime_and_corollary_3_9():
    for alpha, c in [(0.6, 0.1), (0.9, 0.5), (0.3, 0.05)]:
        bound = theory.improvement_lower_bound(alpha, c)
        assert bound is not None and theory.walltime_improvement(alpha, 1, c) >= bound - 1e-12
        best = theory.optimal_gamma(alpha, c)
        assert theory.walltime_improvement(alpha, best, c) >= theory.walltime_improvement(alpha, 1, c)
    assert theory.improvement_lower_bound(0.2, 0.3) is None


def test_optimal_gamma_is_the_argmax():
    for alpha, c in [(0.8, 0.05), (0.5, 0.01), (0.95, 0.02), (0.6, 0.3)]:
        best = theory.optimal_gamma(alpha, c, max_gamma=40)
        values = [theory.walltime_improvement(alpha, g, c) for g in range(1, 41)]
        assert values[best - 1] == max(values)
    assert theory.optimal_gamma(0.99, 0.0, max_gamma=10) == 10  # free drafts: as long as allowed


def test_operations_factor_grows_with_gamma_and_exceeds_one():
    for alpha in (0.5, 0.8, 0.95):
        factors = [theory.operations_factor(alpha, g, 0.02) for g in range(1, 9)]
        assert all(f > 1 for f in factors) and factors == sorted(factors)


def test_measured_walltime_reduces_to_thm_3_8():
    alpha, gamma, c = 0.75, 4, 0.1
    assert math.isclose(theory.walltime_improvement_measured(alpha, gamma, t_target=1.0, t_draft=c, t_verify=1.0),
                        theory.walltime_improvement(alpha, gamma, c))
    # a verification that costs 1.7 steps (as on a CPU) loses a large part of the speedup
    slower = theory.walltime_improvement_measured(alpha, gamma, t_target=1.0, t_draft=c, t_verify=1.7)
    assert slower < theory.walltime_improvement(alpha, gamma, c) / 1.4


@pytest.mark.parametrize("bad", [dict(alpha=1.2, gamma=2), dict(alpha=0.5, gamma=0), dict(alpha=-0.1, gamma=1)])
def test_bad_inputs(bad):
    with pytest.raises(ValueError):
        theory.expected_tokens(**bad)


def test_variable_lengths_model_reduces_to_the_fixed_one_and_counts_plain_steps():
    fixed = theory.walltime_improvement_measured(0.7, 3, t_target=1.0, t_draft=0.1, t_verify=1.2, t_overhead=0.05)
    t_verify = [1.0, 1.1, 1.15, 1.2]
    same = theory.walltime_improvement_lengths(0.7, [3, 3], t_target=1.0, t_draft=0.1, t_verify=t_verify,
                                               t_overhead=0.05)
    assert math.isclose(same, fixed)
    # iterations without a proposal are plain decoding steps: all-zero lengths give the autoregressive speed
    assert math.isclose(theory.walltime_improvement_lengths(0.7, [0, 0], t_target=1.0, t_draft=0.1,
                                                            t_verify=t_verify), 1.0)
    with pytest.raises(ValueError, match="lengths"):
        theory.walltime_improvement_lengths(0.7, [], t_target=1.0, t_draft=0.1, t_verify=t_verify)
