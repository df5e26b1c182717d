"""Every verdict is computed from its inputs: results that point the other way give the other verdict."""

import math

import pytest

from specrepro import verdicts as V


def _row(task="code", decoding="nucleus", trained=True, s=1.5, lo=1.2, hi=1.8, n=24):
    return V.SpeedupRow(task, decoding, "draft-x" if trained else "prompt-lookup", trained, s, lo, hi, n, 4)


PAPER = {"code": 2.46, "text": 1.92}


def test_interval_side():
    assert V.interval_side(1.1, 1.3) == "above" and V.interval_side(0.7, 0.9) == "below"
    assert V.interval_side(0.9, 1.1) == "contains" and V.interval_side(None, 1.2) == "no interval"
    assert V.interval_side(math.nan, math.nan) == "no interval"
    assert V.fmt_ci(1.2961, 1.0868, 1.5607) == "1.30x [1.09, 1.56]"
    assert V.fmt_ci(0.82, None, None) == "0.82x (no interval)"


def test_verdict_labels_are_checked():
    with pytest.raises(ValueError, match="unknown verdict label"):
        V.Verdict("fine", "")


def test_table1_each_label_from_its_data():
    # the paper's size reached on both tasks: reproduces
    v = V.table1([_row("code", s=2.4, lo=2.0, hi=2.8), _row("text", s=2.0, lo=1.7, hi=2.3)], PAPER)
    assert v.label == "reproduces" and v.facts["reach"] == 2
    # reliably faster, below the paper's size: in direction only
    v = V.table1([_row("code"), _row("text")], PAPER)
    assert v.label == "in direction only" and "2 of 2 rows reliably faster" in v.reason
    # one faster, one not
    assert V.table1([_row("code"), _row("text", s=0.95, lo=0.85, hi=1.05)], PAPER).label == "partly"
    # none faster, one reliably slower: the contrary verdict
    v = V.table1([_row("code", s=0.9, lo=0.8, hi=0.97), _row("text", s=1.0, lo=0.9, hi=1.1)], PAPER)
    assert v.label == "does not reproduce" and v.facts["slower"] == 1
    assert "0 of 2 rows reliably faster" in v.reason and "1 reliably slower" in v.reason


def test_table1_greedy_and_lookup_rows_never_decide():
    fast_greedy = [_row(decoding="greedy", s=3.0, lo=2.8, hi=3.2), _row(trained=False, s=3.0, lo=2.8, hi=3.2)]
    v = V.table1(fast_greedy, PAPER)
    assert v.label == "not tested like for like" and "2 of 2 reliably faster" in v.reason
    # a slow like-for-like row is the headline however fast the other rows are
    v = V.table1(fast_greedy + [_row(s=0.8, lo=0.7, hi=0.9)], PAPER)
    assert v.label == "does not reproduce" and v.facts["other_faster"] == 2


def test_arithmetic():
    counted, thm = {"a": 1.7, "b": 3.6}, {"a": 1.69, "b": 3.9}
    assert V.arithmetic(counted, thm).label == "reproduces"
    assert V.arithmetic(counted, {"a": 1.69, "b": 6.0}).label == "partly"  # the theorem off by 40%
    v = V.arithmetic({"a": 0.9, "b": 3.6}, thm)  # less work somewhere: contrary
    assert v.label == "does not reproduce" and "more than autoregressive decoding in 1" in v.reason
    assert V.arithmetic({}, {}).label == "not testable"


def _batch(gains, lo_hi, ar=None, steps=None, ar_decode=None):
    ar = ar or [10 * (i + 1) for i in range(len(gains))]
    return [V.BatchRow(b, 20 * g, a, s, lo, hi, 4, None if steps is None else steps[i],
                       None if ar_decode is None else ar_decode[i])
            for i, (b, g, a, (s, lo, hi)) in enumerate(zip((1, 2, 4, 8), gains, ar, lo_hi))]


def test_batch_throughput():
    faster = [(1.5, 1.2, 1.8)] * 4
    v = V.batch_throughput(_batch([1, 2, 3, 3.5], faster))
    assert v.label == "reproduces" and "still reliably faster at the largest batch" in v.reason
    v = V.batch_throughput(_batch([1, 1.5, 2, 2.5], [(1.5, 1.2, 1.8), (1.3, 1.1, 1.5), (0.9, 0.8, 0.99),
                                                     (0.8, 0.7, 0.9)]))
    assert v.label == "in direction only" and v.facts["gone_from"] == 4 and v.facts["slower"] == [4, 8]
    v = V.batch_throughput(_batch([1, 0.9, 0.8, 0.7], faster))  # contrary: throughput falls with the batch
    assert v.label == "does not reproduce"
    # verification costs are reported as measured, never as the cause; a falling baseline is flagged
    v = V.batch_throughput(_batch([1, 2, 3, 3.5], faster, ar=[10, 9, 12, 14], steps=[1.1, 1.0, 1.2, 2.0]))
    assert "not isolated as the cause" in v.reason and "because" not in v.reason
    assert v.facts["ar_rises"] is False and "falls from batch 1 to 2" in v.reason
    assert "not split at the first iteration" in v.reason
    # where the fall is, from each batch's time split at its first iteration (the prefill)
    v = V.batch_throughput(_batch([1, 2, 3, 3.5], faster, ar=[10, 20, 30, 25], ar_decode=[11, 22, 33, 40]))
    assert v.facts["ar_fall_in_first_iteration"] == [8] and v.facts["ar_fall_in_decode_steps"] == []
    assert "the fall is in the first iteration" in v.reason and "rises from 33.0 to 40.0" in v.reason
    v = V.batch_throughput(_batch([1, 2, 3, 3.5], faster, ar=[10, 20, 30, 25], ar_decode=[11, 22, 33, 30]))
    assert v.facts["ar_fall_in_decode_steps"] == [8] and "the fall is in the decode steps" in v.reason
    v = V.batch_throughput(_batch([1, 2, 3, 3.5], faster, ar=[10, 9, 30, 25], ar_decode=[11, 12, 33, 30]))
    assert v.facts["ar_fall_in_first_iteration"] == [2] and v.facts["ar_fall_in_decode_steps"] == [8]
    assert "the first iteration at batch [2] and the decode steps at batch [8]" in v.reason
    v = V.batch_throughput(_batch([1, 2, 3, 3.5], faster, ar=[10, 20, 30, 25], ar_decode=[11, 22, 33, float("nan")]))
    assert "not split at the first iteration" in v.reason  # no time after the first iteration: nothing to compare
    v = V.batch_throughput(_batch([1, 2, 3, 3.5], faster, ar_decode=[11, 22, 33, 30]))  # AR rises: nothing to split
    assert "falls" not in v.reason and "ar_fall_in_decode_steps" not in v.facts
    assert V.batch_throughput(_batch([1], faster)).label == "not testable"


def _cell(decoding="nucleus", p=0.001, identical=0.0, detectable=0.05, margin=0.1):
    return V.QualityCell("code", decoding, "assert_share", 164, 0.12, 0.13, -0.02, 0.05, margin, p, 0.05,
                         identical, detectable, 0.019)


def test_quality_identical_cells_are_not_equivalence_tests():
    v = V.quality([_cell("greedy", p=0.0, identical=1.0), _cell()])
    assert v.label == "reproduces" and "identical outputs on 100%" in v.reason
    assert v.facts == dict(identical=1, tested=1, equivalent=1, underpowered=0)
    assert V.quality([_cell("greedy", p=0.0, identical=1.0)]).label == "not testable"


def test_quality_contrary():
    assert V.quality([_cell(p=0.2)]).label == "does not reproduce"
    v = V.quality([_cell(detectable=0.15)])  # the design cannot see a difference as small as its margin
    assert v.label == "partly" and "cannot detect" in v.reason and "detects 0.150 at 80% power" in v.reason


def _setting(smallest=True, reliable=True, lo=1.05):
    return dict(smallest_wins=smallest, reliably_faster=reliable, winner_lo=lo, winner_hi=lo + 0.1)


def test_draft_size():
    sizes = ["lens-0", "lens-16"]
    ok = {"a": _setting(), "b": _setting()}
    assert V.draft_size(ok, [True, True], sizes).label == "reproduces"
    assert V.draft_size({"a": _setting(), "b": _setting(reliable=False)}, [True, True], sizes).label == "partly"
    v = V.draft_size({"a": _setting(False), "b": _setting(False)}, [True, True], sizes)
    assert v.label == "does not reproduce" and "wins in 0 of 2" in v.reason
    assert V.draft_size(ok, [True, False], sizes).label == "not testable"


def test_ladder_setting():
    speeds = {"lens-0": (1.10, 1.05, 1.15), "lens-1": (1.12, 1.08, 1.16), "lens-2": (0.9, 0.85, 0.95)}
    v = V.ladder_setting(speeds, ["lens-0", "lens-1", "lens-2"], [0.3, 0.35, 0.4])
    assert v["winner"] == "lens-1" and v["runner_up"] == "lens-0" and not v["smallest_wins"]
    assert v["intervals_overlap"] and not v["reliably_faster"] and v["alpha_rises_with_size"]
    v = V.ladder_setting(speeds, ["lens-0", "lens-1", "lens-2"], [0.3, 0.2, 0.4], lambda a, b: (1.02, 1.01, 1.04))
    assert v["reliably_faster"] and v["paired_lo"] == 1.01 and not v["alpha_rises_with_size"]
    assert v["alpha_largest_above_smallest"]


def test_ladder_setting_tests_the_calibrations_choice():
    speeds = {"lens-0": (1.10, 1.05, 1.15), "lens-1": (1.12, 1.08, 1.16), "lens-2": (0.9, 0.85, 0.95)}
    sizes, alphas = ["lens-0", "lens-1", "lens-2"], [0.3, 0.35, 0.4]
    # the calibration predicted lens-0 first: it is the winner tested, though lens-1 measured faster here
    v = V.ladder_setting(speeds, sizes, alphas, lambda a, b: (0.98, 0.95, 1.01), predicted={
        "lens-0": 1.2, "lens-1": 1.1, "lens-2": 1.0})
    assert v["winner"] == "lens-0" and v["runner_up"] == "lens-1" and v["smallest_wins"]
    assert v["measured_winner"] == "lens-1" and not v["predicted_is_measured"] and not v["reliably_faster"]
    assert v["chosen_on"] == "calibration"
    v2 = V.ladder_setting(speeds, sizes, alphas, predicted={"lens-0": 1.0, "lens-1": 1.3, "lens-2": 1.1})
    assert v2["predicted_is_measured"] and v2["runner_up"] == "lens-2"
    verdict = V.draft_size({"a": v, "b": v2}, [True, True], sizes)
    assert verdict.facts["predicted_is_measured"] == 1 and "agreed on the winner in 1 of 2" in verdict.reason
    assert "the calibration's pick is reliably faster" in verdict.reason  # who picked the winner, named
    mixed = V.draft_size({"a": v, "b": V.ladder_setting(speeds, sizes, alphas)}, [True, True], sizes)
    assert "the winner is reliably faster than autoregressive" in mixed.reason


def test_regime():
    x, v = {"eager": 3.4, "compiled": 2.9, "compiled few_rows": 1.25}, {"eager": 1.6, "compiled few_rows": 1.1}
    r = V.regime(x, v)
    assert r.label == "reproduces" and r.facts["regime"] == "compiled few_rows" and "within 1.3x" in r.reason
    r = V.regime(x, {"compiled few_rows": 1.5})  # the verification is not free: contrary
    assert r.label == "partly" and "not free" in r.reason
    r = V.regime({"eager": 3.4, "compiled": 2.9}, {"compiled": 1.6})  # far from the floor and not free
    assert r.label == "does not reproduce" and r.facts["regime"] == "compiled" and "beyond 1.3x" in r.reason
    assert V.regime({"eager": 3.4}, {"eager": 1.0}).label == "partly"  # free only because the step is overhead
    assert V.regime({}, {}).label == "not testable"
    # the read timed beside the step decides where it exists, either way from the probe's multiple
    r = V.regime({"eager": 3.4, "compiled": 2.5}, {"compiled": 1.1}, paired={"compiled": (1.2, 1.15, 1.26)})
    assert r.label == "reproduces" and r.facts["x_floor"] == 1.2 and r.facts["x_probe"] == 2.5
    assert "1.20x [1.15, 1.26] a read of its bytes timed beside it, within 1.3x (2.50x the probe's floor" in r.reason
    r = V.regime({"compiled": 1.2}, {"compiled": 1.1}, paired={"compiled": (1.7, 1.6, 1.8), "eager": (1.0, 1, 1)})
    assert r.label == "partly" and "beyond 1.3x" in r.reason and r.facts["paired"]
    r = V.regime({"compiled": 1.2}, {"compiled": 1.1}, paired={"eager": (2.0, 1.9, 2.1)})  # not the fastest's
    assert r.label == "reproduces" and not r.facts["paired"]


def test_spare_compute_each_label_from_its_data():
    slower = {"lens-16@4": (0.90, 0.86, 0.94), "lens-0@1": (0.98, 0.95, 1.02)}
    v = V.spare_compute(1.40, 1.20, slower, tokens=5)  # the hypothesis borne out
    assert v.label == "reproduces" and "more steps than on 2 threads (1.20" in v.reason
    assert "reliably lower in 1 of 2 cells, reliably higher in 0" in v.reason and v.facts["lower"] == ["lens-16@4"]
    faster = {"lens-16@4": (1.03, 1.01, 1.05), "lens-0@1": (1.03, 0.99, 1.06)}
    v = V.spare_compute(1.14, 1.21, faster, tokens=5)  # shaped like 06's committed run: cheaper, gains more
    assert v.label == "does not reproduce" and "fewer steps than" in v.reason and "reliably higher in 1" in v.reason
    assert V.spare_compute(1.21, 1.20, faster, tokens=5).label == "does not reproduce"  # within the tolerance
    assert V.spare_compute(1.40, 1.20, faster, tokens=5).label == "partly"  # costlier, yet gains more
    assert V.spare_compute(1.10, 1.20, slower, tokens=5).label == "partly"  # cheaper, yet gains less
    both = {"a@1": (0.9, 0.85, 0.95), "b@1": (1.1, 1.05, 1.15)}
    assert V.spare_compute(1.40, 1.20, both, tokens=5).label == "partly"  # the cells point both ways
    unclear = {"a@1": (0.98, 0.9, 1.05)}
    assert V.spare_compute(1.40, 1.20, unclear, tokens=5).label == "partly"  # costlier, no cell distinguishable
    assert V.spare_compute(1.10, 1.20, {"a@1": (0.9, float("nan"), float("nan"))}, tokens=5).label == "not testable"
    assert V.spare_compute(float("nan"), 1.2, slower, tokens=5).label == "not testable"
    assert V.spare_compute(1.4, 1.2, {}, tokens=5).label == "not testable"


def test_engine_audit():
    ok = V.engine_audit([0.4, 0.7, 0.2], 0.04, 0, 0, compared=8)
    assert ok.label == "lossless at this power" and "0.040" in ok.reason and "0 of 8" in ok.reason
    # one rejection survives Bonferroni over three tests: contrary
    v = V.engine_audit([0.4, 0.01, 0.2], 0.04, 0, 0, compared=8)
    assert v.label == "differs: not explained by numerics" and "1 of 3" in v.reason
    assert V.engine_audit([0.4, 0.03, 0.2], 0.04, 0, 0, compared=8).label == "lossless at this power"  # 0.09 > 0.05
    v = V.engine_audit([0.4], 0.04, 2, 0, compared=8)
    assert v.label == "differs: numerics only" and "2 at near-ties" in v.reason
    # a divergence beyond a near-tie at a token the engine flipped without speculation too: counted as numerics
    v = V.engine_audit([0.4], 0.04, 0, 2, compared=8, engine_flips=2)
    assert v.label == "differs: numerics only" and "2 at tokens the engine also flipped" in v.reason
    v = V.engine_audit([0.4], 0.04, 0, 2, compared=8, engine_flips=1)  # contrary: one of them is not such a token
    assert v.label == "differs: not explained by numerics" and "1 elsewhere" in v.reason
    v = V.engine_audit([0.4, 0.01, 0.2], 0.04, 0, 1, compared=8, engine_flips=1)  # a rejection still decides
    assert v.label == "differs: not explained by numerics"
    with pytest.raises(ValueError, match="engine_flips"):
        V.engine_audit([0.4], 0.04, 0, 1, compared=8, engine_flips=2)
    v = V.engine_audit([0.4], 0.04, 2, 1, compared=8)
    assert v.label == "differs: not explained by numerics" and "1 elsewhere" in v.reason
    assert V.engine_audit([], float("nan"), 0, 0, compared=0).label == "not testable"
    assert V.engine_audit([], float("nan"), 0, 0, compared=4).label == "lossless at this power"


def test_engines_claim():
    bug = {"planted": "differs: not explained by numerics"}
    v = V.engines({"llama.cpp ngram": "lossless at this power", "llama.cpp draft": "differs: numerics only"},
                  planted=bug)
    assert v.label == "does not reproduce" and "1 by numerics only" in v.reason and "planted bug failed" in v.reason
    audits = {"llama.cpp ngram": "lossless at this power", "x": "differs: not explained by numerics"}
    v = V.engines(audits, planted=bug, batched={"x": True, "llama.cpp ngram": False})
    assert v.label == "reproduces" and v.facts["broken"] == ["x"] and "tied to batch > 1" in v.reason
    v = V.engines(audits, planted=bug, batched={"x": False, "llama.cpp ngram": False})  # broken alone, not by batching
    assert v.label == "partly" and "none shown to break only once" in v.reason
    assert V.engines(audits, planted=bug).label == "partly"  # the batch's part untested
    assert V.engines({"a": "lossless at this power"}, planted={"p": "lossless at this power"}).label == "not testable"
    assert V.engines({}, planted=bug).label == "not testable"


def test_numerics_each_label_from_its_data():
    clean = {"float32": 0, "float16": 0, "bfloat16": 0}
    assert V.numerics(0, 12, clean, 0.16).label == "reproduces"
    v = V.numerics(0, 12, clean, 0.001)  # the distributions differ: contrary
    assert v.label == "does not reproduce" and "differ (p = 0.001" in v.reason
    v = V.numerics(0, 12, clean | {"bfloat16": 1}, 0.5)  # a greedy divergence that is no near-tie
    assert v.label == "does not reproduce" and "1 greedy divergences not at a near-tie" in v.reason
    assert V.numerics(12, 12, clean, 0.5).label == "partly"  # the same seed gave the same text everywhere
    assert V.numerics(0, 12, clean, None).label == "not testable"


def test_distribution_each_label_from_its_data():
    rule = dict(tiny_rule=True, real_rule=True)
    assert str(V.distribution(False, False, 0, **rule)) == "reproduces"
    v = V.distribution(True, False, 0, **rule)  # a tiny-pair test rejected, and its redraws too: contrary
    assert v.label == "does not reproduce" and v.reason == "a test rejected, confirmed on fresh draws"
    v = V.distribution(False, True, 0, tiny_rule=True, real_rule=False)  # the real pair, in a run without the rule
    assert v.label == "does not reproduce" and v.reason == "a test on the real pair rejected"
    v = V.distribution(True, False, 0, tiny_rule=False, real_rule=True)  # the tiny pairs, without the rule
    assert v.reason == "a test rejected"
    v = V.distribution(False, False, 1, **rule)  # one sample of probability 0 fails whatever the p-values
    assert v.label == "does not reproduce" and v.reason == "1 sample fell outside the target's support"
    assert V.distribution(True, True, 3, **rule).reason == "3 samples fell outside the target's support"


def test_batch_equivalence_each_label_from_its_data():
    assert V.batch_equivalence([1.0, 1.0, 1.0], [0.0, 0.03]).label == "reproduces"
    v = V.batch_equivalence([1.0, 0.97], [0.0, 0.03])  # ours loses a row at one batch size: contrary
    assert v.label == "does not reproduce" and "exact at 1 of 2 batch sizes (worst 97%)" in v.reason
    v = V.batch_equivalence([1.0, 1.0], [0.0, 1.0])  # a control the checker did not see
    assert v.label == "partly" and "not shown to see the bug" in v.reason
    assert V.batch_equivalence([1.0], []).label == "partly" and V.batch_equivalence([], [0.0]).label == "not testable"
