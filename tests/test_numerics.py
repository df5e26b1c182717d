"""Numerics probes on tiny models, and the statistics that tell a different draw from a broken sampler."""

import numpy as np
import pytest
import torch

from specrepro import autoregressive_generate, speculative_generate
from specrepro import numerics as N
from specrepro.tiny import tiny_draft, tiny_target

PROMPT = torch.tensor([[1, 5, 9, 3]])
CONT = torch.tensor([[7, 2, 2, 8, 4, 6, 1, 0, 3]])


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-3)])
def test_three_graphs_compute_the_same_logits_up_to_rounding(dtype, tol):
    model = tiny_target(16, seed=4, dtype=dtype)
    a = N.logits_decode(model, PROMPT, CONT)
    b = N.logits_verify(model, PROMPT, CONT, gamma=3)
    c = N.logits_full(model, PROMPT, CONT)
    assert a.shape == b.shape == c.shape == (CONT.shape[1], 16)
    assert (a - b).abs().max() < tol and (a - c).abs().max() < tol


def test_compare_logits_reports_flips_with_their_gap():
    a = torch.tensor([[2.0, 1.0, 0.0], [1.0, 1.0 - 1e-6, 0.0]], dtype=torch.float64)
    b = torch.tensor([[2.0, 1.0, 0.0], [1.0 - 2e-6, 1.0 - 1e-6, 0.0]], dtype=torch.float64)
    d = N.compare_logits(a, b, torch.float32)
    assert d.argmax_flips == 1 and d.positions == 2 and d.flip_gaps == pytest.approx((1e-6,))
    assert d.max_abs == pytest.approx(2e-6) and d.flip_rate == 0.5


def test_ulp_distance():
    one = torch.tensor([1.0], dtype=torch.float64)
    assert N.ulp_distance(one, one + 2 ** -23, torch.float32).item() == pytest.approx(1.0)
    assert N.ulp_distance(one * 4, one * 4 + 2 ** -7 * 4, torch.bfloat16).item() == pytest.approx(1.0)
    # measured at the row's scale: a near-zero entry's change counts in ULPs of the row's largest entry (8.0)
    row = torch.tensor([[8.0, 1e-5, -3.0]], dtype=torch.float64)
    moved = row + torch.tensor([[0.0, 2 ** -20, 0.0]], dtype=torch.float64)
    assert N.ulp_distance(row, moved, torch.float32)[0].tolist() == pytest.approx([0.0, 1.0, 0.0])


def test_deterministic_flag_is_restored():
    before = torch.are_deterministic_algorithms_enabled()
    with N.deterministic_algorithms(not before):
        assert torch.are_deterministic_algorithms_enabled() == (not before)
    assert torch.are_deterministic_algorithms_enabled() == before


def test_batch_composition_in_float64_changes_nothing_visible():
    model = tiny_target(16, seed=4, dtype=torch.float64)
    others = torch.randint(16, (3, 13), generator=torch.Generator().manual_seed(0))
    diff, flips = N.batch_composition_diff(model, torch.cat([PROMPT, CONT], 1), others)
    assert diff < 1e-10 and flips == 0


def test_uniform_stream_positions_of_speculative_tokens():
    target, draft = tiny_target(8), tiny_draft(8)
    r = speculative_generate(target, draft, PROMPT % 8, gamma=3, max_new_tokens=15,
                             generator=torch.Generator().manual_seed(0))
    idx = N.uniform_index_of_tokens(r.stats)
    assert len(idx) == 15 and idx == sorted(set(idx))
    # the first token is never decided by uniform 0, which autoregressive decoding uses for it
    assert idx[0] >= r.stats.proposed[0]


def test_same_seed_gives_different_text_but_first_difference_is_found():
    target, draft = tiny_target(8), tiny_draft(8)
    diffs = []
    for seed in range(10):
        a = autoregressive_generate(target, PROMPT % 8, max_new_tokens=12,
                                    generator=torch.Generator().manual_seed(seed))
        b = speculative_generate(target, draft, PROMPT % 8, gamma=3, max_new_tokens=12,
                                 generator=torch.Generator().manual_seed(seed))
        diffs.append(N.first_difference(a.sequences[0, 4:], b.sequences[0, 4:]))
    assert any(d is not None for d in diffs)
    assert N.first_difference(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3, 4])) is None


def test_paired_quality_test_verdicts():
    same = N.paired_quality_test([1, 0, 1, 1, 0] * 8, [1, 0, 1, 1, 0] * 8)
    assert same.p_value == 1.0 and "no significant difference" in same.verdict
    worse = N.paired_quality_test([1] * 30 + [0] * 10, [0] * 30 + [0] * 10)
    assert worse.p_value < 1e-6 and "reproducibly worse" in worse.verdict and worse.test.startswith("McNemar")
    rng = np.random.default_rng(0)
    a = rng.normal(0.3, 0.05, 60)
    noisy = N.paired_quality_test(a, a + rng.normal(0, 0.01, 60))
    assert noisy.test == "Wilcoxon signed-rank" and noisy.p_value > 0.01
    assert "reproducibly worse" in N.paired_quality_test(a, a - 0.05).verdict
    with pytest.raises(ValueError):
        N.paired_quality_test([1, 0], [1])


def test_paired_quality_test_reads_its_significance_level():
    # McNemar on 8 prompts only a passed, 1 only b passed: p = 2 * (9 + 1) / 2**9 = 0.0390625
    a, b = [1] * 8 + [0] + [1] * 5, [0] * 8 + [1] + [1] * 5
    assert N.paired_quality_test(a, b, level=0.05).p_value == pytest.approx(0.0390625)
    assert "reproducibly worse (p = 0.0391 < 0.05)" in N.paired_quality_test(a, b, level=0.05).verdict
    assert "no significant difference (p = 0.0391 >= 0.01)" in N.paired_quality_test(a, b, level=0.01).verdict


def test_two_sample_chisquare_and_power():
    rng = np.random.default_rng(1)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    a, b = rng.multinomial(2000, p), rng.multinomial(2000, p)
    assert N.chisquare_two_sample(a, b)[2] > 0.01
    c = rng.multinomial(2000, [0.4, 0.35, 0.2, 0.05])
    assert N.chisquare_two_sample(a, c)[2] < 1e-6
    assert N.chisquare_power(p, p, 1000, 3, 0.01) == 0.01
    q = 0.9 * p + 0.1 * np.array([0, 0, 0, 1.0])
    powers = [N.chisquare_power(p, q, n, 3, 0.01) for n in (100, 1000, 10000)]
    assert powers == sorted(powers) and powers[-1] > 0.99


def test_two_sample_power_by_simulation():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    assert N.two_sample_power(p, p, 500, 0.05, reps=400) == pytest.approx(0.05, abs=0.03)  # its false-alarm rate
    q = np.array([0.35, 0.35, 0.2, 0.1])
    weak, strong = (N.two_sample_power(p, q, n, 0.01, reps=300) for n in (50, 1000))
    assert weak < 0.5 < 0.95 < strong
    assert N.samples_for_power(p, q, 0.01, grid=(50, 100, 200, 400, 800), reps=300) in (200, 400)


def test_tost_shows_equivalence_only_with_enough_data_and_a_difference_inside_the_margin():
    from specrepro.numerics import paired_equivalence_test

    rng = np.random.default_rng(0)
    a = rng.normal(0.5, 0.1, 400)
    same = a + rng.normal(0, 0.05, 400)
    r = paired_equivalence_test(a, same, margin=0.02)
    assert r.equivalent and r.ci[0] > -0.02 and r.ci[1] < 0.02 and r.n == 400
    assert not paired_equivalence_test(a[:5], same[:5], margin=0.02).equivalent  # too few prompts: no finding
    assert not paired_equivalence_test(a, same + 0.03, margin=0.02).equivalent  # a real shift outside the margin
    # the p-value is that of the interval: equivalent at level 0.05 exactly when the 90% CI is inside the margin
    for shift in np.linspace(-0.03, 0.03, 13):
        r = paired_equivalence_test(a, same + shift, margin=0.02)
        assert r.equivalent == (-0.02 < r.ci[0] and r.ci[1] < 0.02)
    passed = np.array([1, 0, 1, 1, 0, 1] * 20)
    assert paired_equivalence_test(passed, passed, margin=0.05).equivalent  # identical answers: no variance
    with pytest.raises(ValueError, match="margin > 0"):
        paired_equivalence_test(a, same, margin=0)


def test_proportion_interval_is_wilsons():
    from specrepro.intervals import proportion

    ci = proportion(0, 200)  # none seen in 200: the interval still says how many there could be
    assert ci.estimate == 0 and ci.lo == pytest.approx(0, abs=1e-12) and 0.018 < ci.hi < 0.020
    ci = proportion(19, 30)  # the weakest planted-bug cell of 01 at 2,000 samples
    assert (round(ci.lo, 3), round(ci.hi, 3)) == (0.455, 0.781)
    assert proportion(30, 30).hi == 1.0 and proportion(30, 30).lo > 0.88
    with pytest.raises(ValueError, match="0 <= k <= n"):
        proportion(3, 2)


def test_detectable_difference_shrinks_with_the_sample():
    d100, d400 = N.detectable_difference(0.3, 100), N.detectable_difference(0.3, 400)
    assert d100 == pytest.approx(2 * d400, rel=0.02) and 0.08 < d100 < 0.09  # (1.98 + 0.84) * 0.03
    assert N.detectable_difference(0.0, 10) == 0.0
    with pytest.raises(ValueError):
        N.detectable_difference(0.3, 1)
