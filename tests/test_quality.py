"""Quality with power: answers from both methods, truncation, and the equivalence verdict."""

import numpy as np
import pytest
import torch

from specrepro import quality
from specrepro.numerics import equivalence_power, paired_equivalence_test
from specrepro.sampling import SamplingConfig
from specrepro.tiny import tiny_pair


def test_truncated_means_cut_at_the_cap_before_eos():
    assert quality.is_truncated([5, 6, 7], 3, eos_token_id=2)
    assert not quality.is_truncated([5, 6, 2], 3, eos_token_id=2)
    assert not quality.is_truncated([5, 2], 3, eos_token_id=2)
    assert quality.is_truncated([5, 6, 2], 3, eos_token_id=None)


def test_answers_of_both_methods_agree_when_greedy_and_report_truncation():
    target, draft = tiny_pair(16, seed=3, dtype=torch.float64)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    kw = dict(gamma=3, max_new_tokens=10, cfg=SamplingConfig(0), seed=0, batch_size=2, pad_token_id=0)
    ar = quality.answers(target, None, prompts, eos_token_id=None, **kw)
    spec = quality.answers(target, draft, prompts, eos_token_id=None, **kw)
    assert [a["new_ids"] for a in ar] == [s["new_ids"] for s in spec]
    assert all(a["truncated"] and a["new_tokens"] == 10 for a in ar)
    eos = ar[0]["new_ids"][4]  # a token the first answer writes: it now ends there
    ended = quality.answers(target, None, prompts, eos_token_id=eos, **kw)
    assert ended[0]["new_ids"] == ar[0]["new_ids"][:ar[0]["new_ids"].index(eos) + 1]
    assert not ended[0]["truncated"]


def test_compare_shows_equivalence_only_when_the_difference_is_small_and_the_sample_large():
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 1, 200)  # sd 0.29 per method: the design's sd of a difference is 0.41
    same = quality.compare(a, a + rng.normal(0, 0.05, 200), metric="m", margin=0.15, identical=[False] * 200)
    assert same.test.equivalent and same.power > 0.9 and same.identical == 0.0
    assert "equivalent within +-0.15" in same.verdict
    assert same.power == pytest.approx(equivalence_power(np.sqrt(a.var(ddof=1) * 2), 200, margin=0.15), abs=0.02)
    shifted = quality.compare(a, a + 0.2 + rng.normal(0, 0.05, 200), metric="m", margin=0.15)
    assert not shifted.test.equivalent and "not shown equivalent" in shifted.verdict
    small = quality.compare(a[:5], a[:5] + rng.normal(0, 0.2, 5), metric="m", margin=0.05)
    assert not small.test.equivalent and small.power < 0.2
    identical = quality.compare(a, a, metric="m", margin=0.05)  # greedy, same outputs: p = 0, power of the design
    assert identical.test.equivalent and identical.power < 0.2
    assert same.a.lo <= same.a.estimate <= same.a.hi and same.a.n_units == 200


def test_equivalence_power_matches_simulation():
    rng = np.random.default_rng(1)
    n, sd, margin = 60, 0.3, 0.12
    hits = [paired_equivalence_test(np.zeros(n), rng.normal(0, sd, n), margin=margin).equivalent for _ in range(2000)]
    assert equivalence_power(sd, n, margin=margin) == pytest.approx(np.mean(hits), abs=0.04)
    assert equivalence_power(0.0, n, margin=margin) == 1.0
    assert equivalence_power(sd, n, margin=margin, true_diff=margin) < 0.06  # at the margin: the test's level
    with pytest.raises(ValueError):
        equivalence_power(sd, 1, margin=margin)


def test_margin_in_units_counts_assertions_and_reference_words():
    code = [{"prompt": "def f(x):\n", "entry_point": "f", "canonical_solution": "    return x\n",
             "test": "def check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2) == 2\n"},
            {"prompt": "def f(x):\n", "entry_point": "f", "canonical_solution": "    return x\n",
             "test": "def check(candidate):\n" + "".join(f"    assert candidate({i}) == {i}\n" for i in range(6))}]
    u = quality.margin_in_units("code", code, 0.1)
    assert (u["per_prompt"], u["min"], u["max"]) == (4.0, 2.0, 6.0)
    assert u["units"] == pytest.approx(0.4)
    t = quality.margin_in_units("text", [{"reference": "To be, or not to be"}, {"reference": "that is the question"}],
                                0.5)
    assert t["per_prompt"] == 5.0 and t["units"] == pytest.approx(2.5)
    with pytest.raises(ValueError, match="task"):
        quality.margin_in_units("poetry", code, 0.1)
    with pytest.raises(ValueError, match="examples"):
        quality.margin_in_units("code", [], 0.1)


def test_greedy_line_counts_identical_prompts_and_names_each_divergence():
    line = quality.greedy_line("code", {"prompts": 164, "exact_match": 163 / 164},
                               [{"task_id": "HumanEval/19", "position": 82, "kind": "near-tie", "gap": 1.1e-5}],
                               "assert_share", 0.1975, 0.1975)
    assert line == ("- code, greedy: the two methods wrote the same tokens for 163 of 164 prompts; the 1 that differ "
                    "part at HumanEval/19 token 82 (near-tie, top-2 logit gap 1.1e-05) (assert_share 0.198 "
                    "autoregressive, 0.198 speculative)")
    none = quality.greedy_line("text", {"prompts": 100, "exact_match": 1.0}, [], "rouge1", 0.0928, 0.0928)
    assert none == ("- text, greedy: the two methods wrote the same tokens for 100 of 100 prompts (rouge1 0.093 "
                    "autoregressive, 0.093 speculative)")
    gapless = quality.greedy_line("text", {"prompts": 100, "exact_match": 0.99},
                                  [{"task_id": 7, "position": 3, "kind": "unclassified", "gap": float("nan")}],
                                  "rouge1", 0.09, 0.09, paper_move=-0.001)
    assert "7 token 3 (unclassified, top-2 logit gap not computed)" in gapless
    assert gapless.endswith("(rouge1 0.090 autoregressive, 0.090 speculative; Chen et al. moved -0.001 on their "
                            "metric)")


def _cell(identical: float, detectable: float = 0.05):
    from types import SimpleNamespace

    return SimpleNamespace(metric="rouge1", autoregressive=0.108, ar_lo=0.096, ar_hi=0.121, speculative=0.121,
                           spec_lo=0.110, spec_hi=0.132, n_prompts=100, equivalent=True, margin=0.03, mean_diff=0.013,
                           diff_lo=0.002, diff_hi=0.024, tost_p=0.0075, power=0.93, detectable=detectable,
                           identical=identical, truncated_ar=0.71, truncated_spec=0.72)


def test_cell_line_reports_identical_outputs_only_where_they_are_identical():
    summary = {"prompts": 100, "exact_match": 1.0}
    line = quality.cell_line("text", "greedy", _cell(1.0), summary=summary, paper_move=-0.001)
    assert line.startswith("- text, greedy: the two methods wrote the same tokens for 100 of 100 prompts")
    # contrary: a greedy cell whose answers differ on 5% of prompts is tested, not called identical
    line = quality.cell_line("text", "greedy", _cell(0.95), summary=summary | {"exact_match": 0.95, "near_ties": 3})
    assert "equivalent within +-0.03" in line and "TOST p = 0.0075" in line and "wrote the same tokens" not in line
    assert line.endswith("; the same tokens for 95 of 100 prompts, 3 of the others parting at a near-tie")
    # a sampled cell is never reported as identical outputs, whatever its share
    assert "TOST" in quality.cell_line("text", "nucleus", _cell(1.0), summary=summary)
    line = quality.cell_line("text", "nucleus", _cell(0.0, detectable=0.04), paper_move=0.002)
    assert "detects 0.040 at 80% power, Chen et al. moved +0.002" in line and "underpowered" in line
    assert "underpowered" not in quality.cell_line("text", "nucleus", _cell(0.0, detectable=0.025))
