"""End-to-end claim 1 on tiny random transformers: the joint distribution of the first generated tokens of
`speculative_generate` equals the exact (enumerated) target distribution, and the same test catches known bugs.

Each test is a chi-squared goodness-of-fit test at a false-alarm rate of FALSE_ALARM = 1e-3: a correct sampler
fails one with probability 1e-3 over seeds. Seeds are fixed, so the outcome is reproducible.
"""

import copy

import numpy as np
import pytest
import torch

from specrepro import autoregressive_generate, speculative_generate
from specrepro.distribution import PLANTED_BUGS, chisquare_gof, counts_of, exact_joint_distribution, sample_sequences
from specrepro.kvcache import CachedModel
from specrepro.sampling import SamplingConfig

from conftest import draw

FALSE_ALARM = 1e-3
V = 8
PROMPT = torch.tensor([[0, 3, 5]])
T1 = SamplingConfig()
TP = SamplingConfig(temperature=1.3, top_p=0.85)


def gof(model, samples, cfg):
    exact = exact_joint_distribution(model, PROMPT, samples.shape[1], cfg)
    return chisquare_gof(counts_of(samples, V), exact.numpy())


def new_tokens(result):
    return result.sequences[0, PROMPT.shape[1]:].numpy()


def test_exact_distribution_is_a_distribution_and_factorises(pair64):
    target, _ = pair64
    joint = exact_joint_distribution(target, PROMPT, 2, T1)
    assert joint.shape == (V, V) and abs(joint.sum().item() - 1) < 1e-12
    with torch.no_grad():
        p1 = target(PROMPT).logits[0, -1].softmax(-1)
        p2 = target(torch.cat([PROMPT, torch.tensor([[4]])], 1)).logits[0, -1].softmax(-1)
    assert torch.allclose(joint[4], p1[4] * p2, atol=1e-12)


def test_autoregressive_reference_matches_exact(pair64):
    target, _ = pair64
    s = draw(lambda g: new_tokens(autoregressive_generate(target, PROMPT, max_new_tokens=3, generator=g)), 1500, 7)
    assert not gof(target, s, T1).rejects(FALSE_ALARM)


@pytest.mark.parametrize("cfg,gamma,n_tokens", [(T1, 2, 3), (TP, 2, 3), (T1, 1, 3)],
                         ids=["T1-gamma2", "T1.3-top_p0.85-gamma2", "T1-gamma1-two-iterations"])
def test_speculative_matches_exact_target(pair64, cfg, gamma, n_tokens):
    target, draft = pair64
    kw = dict(gamma=gamma, max_new_tokens=n_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
    s = draw(lambda g: new_tokens(speculative_generate(target, draft, PROMPT, generator=g, **kw)), 1500, 11)
    result = gof(target, s, cfg)
    assert not result.rejects(FALSE_ALARM), result


def test_variable_proposal_lengths_keep_the_distribution(pair64):
    # a draft that proposes 0, 1 or 2 tokens depending on the sequence so far, as prompt lookup does
    target, draft = pair64
    variable = copy.deepcopy(draft)
    variable.proposal_length = lambda tokens, gamma: min(gamma, sum(tokens) % 3)
    kw = dict(gamma=2, max_new_tokens=3, temperature=1.0)
    runs = []

    def once(g):
        r = speculative_generate(target, variable, PROMPT, generator=g, **kw)
        runs.append(r.stats.proposed)
        return new_tokens(r)

    result = gof(target, draw(once, 1500, 13), T1)
    assert not result.rejects(FALSE_ALARM), result
    assert {g for p in runs for g in p} >= {0, 1, 2}  # every length was exercised


def test_lookup_hybrid_draft_keeps_the_distribution(pair64):
    from specrepro.drafts import LookupHybridDraft

    target, draft = pair64
    hybrid = LookupHybridDraft(draft, max_ngram=2, min_ngram=1)  # one-hot copies mixed with the draft's own q
    kw = dict(gamma=2, max_new_tokens=3, temperature=1.0)
    s = draw(lambda g: new_tokens(speculative_generate(target, hybrid, PROMPT, generator=g, **kw)), 1500, 17)
    result = gof(target, s, T1)
    assert not result.rejects(FALSE_ALARM), result


def test_bad_proposal_length_is_refused(pair64):
    target, draft = pair64
    bad = copy.deepcopy(draft)
    bad.proposal_length = lambda tokens, gamma: gamma + 1
    with pytest.raises(ValueError, match="proposal_length returned 3"):
        speculative_generate(target, bad, PROMPT, gamma=2, max_new_tokens=4, temperature=0)


# ---- negative controls: known-bad samplers the same test must detect --------------------------------------


@pytest.mark.parametrize("name", PLANTED_BUGS)
def test_negative_controls_are_detected(pair64, name):
    target, draft = pair64
    cfg = TP if name == "top-p-dropped-on-target" else T1
    samples, _ = sample_sequences(target, draft, PROMPT, method="speculative", n_tokens=2, n_samples=600, cfg=cfg,
                                  generator=torch.Generator().manual_seed(11), gamma=2, bug=name)
    result = gof(target, samples, cfg)
    assert result.rejects(FALSE_ALARM), result


def test_batched_sampling_gives_the_same_draws_in_another_order_of_rows(pair64):
    """sample_sequences in batches: one generator read row by row, so different draws, the same distribution."""
    target, draft = pair64
    samples, stats = sample_sequences(target, draft, PROMPT, method="speculative", n_tokens=2, n_samples=3000,
                                      cfg=TP, generator=torch.Generator().manual_seed(3), gamma=2, batch_size=500)
    assert samples.shape == (3000, 2) and len(stats) == 3000
    assert not gof(target, samples, TP).rejects(FALSE_ALARM)


def test_chisquare_gof_flags_impossible_outcomes_and_pools_small_cells():
    probs = np.array([0.5, 0.3, 0.199, 0.001, 0.0])
    r = chisquare_gof(np.array([50, 30, 20, 0, 0]), probs)
    assert r.impossible == 0 and r.dof == 2 and r.p_value > 0.9  # the 0.001 cell is merged into a neighbour
    r = chisquare_gof(np.array([50, 30, 19, 0, 1]), probs)
    assert r.impossible == 1 and r.p_value == 0.0


def test_rejection_rate_is_the_false_alarm_rate_under_the_null_and_high_against_a_big_change():
    exact = np.array([0.4, 0.3, 0.2, 0.1])
    assert rate_of(exact, exact) == pytest.approx(0.05, abs=0.03)
    assert rate_of(np.array([0.3, 0.3, 0.2, 0.2]), exact) > 0.95


def rate_of(probs, exact):
    from specrepro.distribution import rejection_rate

    return rejection_rate(probs, exact, n_samples=1000, false_alarm=0.05, reps=400, seed=1)


def test_replicated_power_splits_draws_into_independent_tests():
    from specrepro.distribution import replicated_power

    rng = np.random.default_rng(2)
    exact = np.array([0.4, 0.3, 0.2, 0.1])
    null = rng.choice(4, size=(40_000, 1), p=exact)
    shifted = rng.choice(4, size=(40_000, 1), p=[0.3, 0.3, 0.2, 0.2])
    at_null = replicated_power(null, exact, 4, n_samples=100, false_alarm=0.05)
    assert at_null.reps == 400 and at_null.power == pytest.approx(0.05, abs=0.03)
    strong = replicated_power(shifted, exact, 4, n_samples=1000, false_alarm=0.05)
    weak = replicated_power(shifted, exact, 4, n_samples=50, false_alarm=0.05)
    assert strong.power > 0.95 and weak.power < 0.6  # power grows with the sample size
    lo, hi = strong.interval
    assert lo < strong.power <= hi <= 1
    with pytest.raises(ValueError, match="draw more samples"):
        replicated_power(null[:10], exact, 4, n_samples=100, false_alarm=0.05)


def test_the_sparse_joint_is_the_dense_one_on_its_support():
    from specrepro.distribution import exact_joint_distribution, exact_joint_sparse
    from specrepro.tiny import tiny_target

    target = tiny_target(16, seed=3, dtype=torch.float64)
    ids = torch.tensor([[1, 5, 2]])
    for cfg in (SamplingConfig(1.0, top_k=3), SamplingConfig(0.8, top_p=0.7)):
        dense = exact_joint_distribution(target, ids, 2, cfg)
        sparse = exact_joint_sparse(target, ids, 2, cfg, chunk=2)
        assert sum(sparse.values()) == pytest.approx(1.0)
        assert {k for k in zip(*np.nonzero(dense.numpy()))} == set(sparse)
        assert all(float(dense[k]) == pytest.approx(v) for k, v in sparse.items())
    with pytest.raises(ValueError, match="max_cells"):
        exact_joint_sparse(target, ids, 2, SamplingConfig(1.0), max_cells=20)


def test_ragged_batches_sample_each_prompts_distribution_and_catch_a_planted_bug():
    from specrepro.distribution import exact_joint_sparse, gof_sparse, sample_ragged
    from specrepro.tiny import tiny_draft, tiny_target

    target, draft = tiny_target(16, seed=3, dtype=torch.float64), tiny_draft(16, seed=4, dtype=torch.float64)
    prompts = [[1, 5, 2], [7, 3, 3, 9, 4, 1], [2]]
    cfg = SamplingConfig(1.0, top_k=3)
    got, _ = sample_ragged(target, draft, prompts, method="speculative", n_tokens=2, n_samples=3000, cfg=cfg,
                        generator=torch.Generator().manual_seed(0), gamma=2, batch_rows=48)
    assert [a.shape for a in got] == [(3000, 2)] * 3
    for p, samples in zip(prompts, got):
        assert not gof_sparse(samples, exact_joint_sparse(target, torch.tensor([p]), 2, cfg)).rejects(FALSE_ALARM)
    # the same test sees a sample outside the support, and a wrong distribution
    exact = exact_joint_sparse(target, torch.tensor([prompts[0]]), 2, cfg)
    assert gof_sparse(np.array([[15, 15]] + [list(next(iter(exact)))] * 99), exact).impossible == 1
    wrong = np.array([list(k) for k in exact for _ in range(200)])  # every continuation equally often
    assert gof_sparse(wrong, exact).rejects(FALSE_ALARM)


@pytest.mark.parametrize("feature", [False, True])
def test_distinct_rows_are_computed_once_and_sample_the_same_distribution(feature):
    from specrepro.distribution import DistinctRows, exact_joint_sparse, gof_sparse, sample_ragged
    from specrepro.generate import decode, left_pad, pooled_alpha
    from specrepro.tiny import tiny_draft, tiny_feature_draft, tiny_target

    target = tiny_target(16, seed=3, dtype=torch.float64)
    draft = tiny_feature_draft(target) if feature else tiny_draft(16, seed=4, dtype=torch.float64)
    prompts = [[1, 5, 2, 8, 8, 3], [7, 3, 9]]
    greedy = SamplingConfig(0.0)
    for rows in ([prompts[0]] * 5, [prompts[0], prompts[1], prompts[0], prompts[1], prompts[1]]):
        ids, mask = left_pad(rows, 0)
        plain = decode(target, draft, ids, mask, gamma=2, max_new_tokens=6, cfg=greedy, pad_token_id=0)
        made = []
        shared = decode(target, draft, ids, mask, gamma=2, max_new_tokens=6, cfg=greedy, pad_token_id=0,
                        cached_model=lambda *a, made=made, **kw: made.append(DistinctRows(*a, **kw)) or made[-1],
                        check_invariants=True)
        assert torch.equal(plain.sequences, shared.sequences)
        # greedy rows of one prompt stay one sequence: every forward computed one row per distinct prompt
        assert [m.distinct_rows for m in made] == [len({tuple(r) for r in rows})] * 2
        assert len(shared.stats.target_forwards) == len(plain.stats.target_forwards)
    # sampled rows branch, roll back and finish at different times; the invariants hold after every iteration
    cfg = SamplingConfig(1.0, top_k=3)
    ids, mask = left_pad([prompts[0], prompts[1]] * 20, 0)
    r = decode(target, draft, ids, mask, gamma=2, max_new_tokens=4, cfg=cfg, pad_token_id=0, eos={5},
               generator=torch.Generator().manual_seed(2), cached_model=DistinctRows, check_invariants=True)
    assert len({tuple(s) for s in r.sequences.tolist()}) > 2  # the rows did branch
    for one_prompt_a_batch in (True, False):
        got, stats = sample_ragged(target, draft, prompts, method="speculative", n_tokens=3, n_samples=1500, cfg=cfg,
                                   generator=torch.Generator().manual_seed(1), gamma=2, batch_rows=50,
                                   shared_prompt=one_prompt_a_batch)
        assert [a.shape for a in got] == [(1500, 3)] * 2 and [len(s) for s in stats] == [1500] * 2
        assert 0 < pooled_alpha(stats[0]) < 1  # drafts were proposed, some accepted and some rejected
        for p, samples in zip(prompts, got):
            exact = exact_joint_sparse(target, torch.tensor([p]), 3, cfg)
            assert not gof_sparse(samples, exact).rejects(FALSE_ALARM)


@pytest.mark.parametrize("which", ["prompt-lookup", "tiny draft", "feature draft"])
def test_distinct_rows_draw_what_every_row_computed_alone_draws(which):
    """Row b's own generator makes the same draws whether its forwards are shared with identical rows or not: the
    same tokens, drafts and acceptances row for row (float64: batch composition moves no decision). Rows of one
    prompt branch and then share forwards again, so caches are copied to several rows and grow apart; some rows
    end at an EOS (the feature draft's before it was ever fed); the feature draft drafts 3 tokens, two of them fed
    with its own output, which a row that accepted them must not lend to a row that holds the same tokens from the
    target."""
    from specrepro.distribution import DistinctRows
    from specrepro.drafts import PromptLookupDraft
    from specrepro.generate import decode, left_pad
    from specrepro.tiny import tiny_draft, tiny_feature_draft, tiny_target

    target = tiny_target(16, seed=3, dtype=torch.float64)
    draft = {"prompt-lookup": lambda: PromptLookupDraft(16),
             "tiny draft": lambda: tiny_draft(16, seed=4, dtype=torch.float64),
             "feature draft": lambda: tiny_feature_draft(target)}[which]()
    ids, mask = left_pad([[1, 5, 2, 1, 5, 2, 1], [7, 3, 9, 7, 3]] * 16, 0)
    got = []
    for cached_model in (CachedModel, DistinctRows):
        gens = [torch.Generator().manual_seed(100 + b) for b in range(ids.shape[0])]
        got.append(decode(target, draft, ids, mask, gamma=3, max_new_tokens=10, cfg=SamplingConfig(1.0, top_k=4),
                          generator=gens, pad_token_id=0, cached_model=cached_model, check_invariants=True,
                          eos={12}))
    plain, distinct = got
    assert torch.equal(plain.sequences, distinct.sequences)
    assert [(r.proposed, r.accepted) for r in plain.rows] == [(r.proposed, r.accepted) for r in distinct.rows]
    assert len({tuple(s) for s in plain.sequences.tolist()}) > 8  # the rows did branch
    ended = [r.new_tokens for r in plain.rows]
    assert min(ended) == 1 and max(ended) == 10  # an EOS ended some rows in the first iteration, not all


def test_distinct_rows_keep_apart_a_token_fed_with_the_targets_states_and_one_fed_without():
    """A feature draft's state for a token depends on how it went in: with the target's states (a catch-up) or with
    the draft's own output (a drafted token). Two rows holding the same tokens fed differently are two rows."""
    from specrepro.distribution import DistinctRows
    from specrepro.tiny import tiny_feature_draft, tiny_target

    target = tiny_target(16, seed=3, dtype=torch.float64)
    draft = tiny_feature_draft(target)
    width = len(draft.target_features) * target.config.hidden_size
    feats = torch.randn(6, width, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rows = DistinctRows(draft, "draft", [], rows=2)
    rows.feed([[1, 5, 2], [1, 5, 2]], 1, features=[feats[:3], feats[:3]])
    assert rows.distinct_rows == 1
    rows.feed([[7], []], 1)  # row 0 drafts 7 with its own output
    rows.feed([[], [7]], 1, features=[None, feats[3:4]])  # row 1 holds 7 from the target, with its states
    assert rows.fed == [4, 4] and rows.distinct_rows == 2
    rows.keep([3, 4])  # row 0's draft rolled back: the rows differ in length now
    rows.feed([[7], []], 1, features=[feats[3:4], None])  # row 0 catches up on 7 as row 1 did: one row again
    assert rows.distinct_rows == 1
    rows.check([4, 4])


def test_a_planted_bug_in_the_shared_prompt_sampler_is_rejected():
    from specrepro.distribution import exact_joint_sparse, gof_sparse, planted_bug, sample_ragged
    from specrepro.tiny import tiny_draft, tiny_target

    target, draft = tiny_target(16, seed=3, dtype=torch.float64), tiny_draft(16, seed=4, dtype=torch.float64)
    steps, cfg = planted_bug("reseed-generator-every-draw", SamplingConfig(1.0, top_k=3))
    [samples], _ = sample_ragged(target, draft, [[1, 5, 2]], method="speculative", n_tokens=2, n_samples=3000,
                              cfg=cfg, generator=torch.Generator().manual_seed(0), gamma=2, batch_rows=100,
                              shared_prompt=True, steps=steps)
    assert gof_sparse(samples, exact_joint_sparse(target, torch.tensor([[1, 5, 2]]), 2, cfg)).rejects(FALSE_ALARM)


@pytest.mark.slow
@pytest.mark.parametrize("draft_name", ["prompt-lookup", "feature-1-s8"])
def test_the_real_pair_samples_the_targets_first_tokens(draft_name):
    """On SmolLM2 and a shipped draft, in a ragged batch: no sample outside the target's top-k support (a wrong
    vocabulary, a feature draft fed the wrong states, a misplaced row would put some there) and no rejection by
    the goodness-of-fit test. 240 samples per prompt: a check for gross errors, not a power study (the sampler
    handles about 5-10 samples a second on a 2-core CPU; the exact test with power is 01's, on tiny models)."""
    from specrepro import models
    from specrepro.distribution import exact_joint_sparse, gof_sparse, sample_ragged

    try:
        models.gguf_path()
    except models.ModelFilesMissing as err:
        pytest.skip(str(err))
    target, tok = models.load_target(), models.load_tokenizer()
    draft = models.load_draft(draft_name, target=target)
    prompts = [tok(p).input_ids for p in ("def add(a, b):\n    return", "for i in range(3):\n    for i in")]
    cfg = SamplingConfig(2.0, top_k=4)  # flattened, so that 240 samples fill the 16 cells
    got, _ = sample_ragged(target, draft, prompts, method="speculative", n_tokens=2, n_samples=240, cfg=cfg,
                        generator=torch.Generator().manual_seed(0), gamma=3, batch_rows=96,
                        pad_token_id=tok.pad_token_id or 0)
    for p, samples in zip(prompts, got):
        result = gof_sparse(samples, exact_joint_sparse(target, torch.tensor([p]), 2, cfg))
        assert result.impossible == 0 and not result.rejects(FALSE_ALARM), (draft_name, result)


def test_the_detectable_error_shrinks_with_the_sample_and_is_detected_at_that_size():
    from specrepro.distribution import detectable_tv, rejection_rate

    exact = np.array([0.4, 0.3, 0.2, 0.05, 0.05])
    small, large = (detectable_tv(exact, n, false_alarm=FALSE_ALARM, reps=300) for n in (500, 5000))
    assert 0 < large < small < 0.6
    moved = exact * (1 - large / 0.6)
    moved[0] = 0.4 + large
    assert rejection_rate(moved, exact, n_samples=5000, false_alarm=FALSE_ALARM, reps=300) >= 0.8
    assert rejection_rate(exact, exact, n_samples=5000, false_alarm=FALSE_ALARM, reps=300) < 0.02
    assert np.isnan(detectable_tv({(1,): 1.0}, 100, false_alarm=FALSE_ALARM))  # one continuation: nothing to move


def test_power_against_a_fixed_error_grows_with_the_sample_and_the_error():
    from specrepro.distribution import detectable_tv, power_against_tv, shifted_toward_top

    exact = {(0,): 0.4, (1,): 0.3, (2,): 0.2, (3,): 0.05, (4,): 0.05}
    probs, shifted = shifted_toward_top(exact, 0.1)
    assert np.isclose(shifted.sum(), 1) and np.isclose(0.5 * np.abs(shifted - probs).sum(), 0.1)
    small, large = (power_against_tv(exact, 0.05, n, false_alarm=FALSE_ALARM, reps=300) for n in (500, 5000))
    assert small < 0.5 < 0.9 < large
    assert power_against_tv(exact, 0.0, 5000, false_alarm=FALSE_ALARM, reps=300) < 0.02  # no error: false alarms
    tv = detectable_tv(exact, 2000, false_alarm=FALSE_ALARM, reps=300)
    assert power_against_tv(exact, tv, 2000, false_alarm=FALSE_ALARM, reps=300) >= 0.8
    assert np.isnan(power_against_tv(exact, 0.7, 2000, false_alarm=FALSE_ALARM))  # more than the others hold


@pytest.mark.slow
def test_the_resample_command_tests_a_real_cell_again(capsys):
    from specrepro import models
    from specrepro.distribution import main

    try:
        models.gguf_path()
    except models.ModelFilesMissing as err:
        pytest.skip(str(err))
    assert main(["--prompt", "1", "--top-k", "4", "--samples", "300", "--batch-rows", "100", "--seeds", "5", "6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(": p = ")[0].endswith(f"seed {s}") for ln, s in zip(lines, (5, 6))] == [True, True]
    assert all("0 outside the support" in ln for ln in lines)


def test_a_rejection_counts_only_when_its_redraw_rejects_too():
    from specrepro.distribution import confirm_rejection

    assert confirm_rejection(0.5, [], 0.001) == "pass"
    assert confirm_rejection(0.0009, [0.3], 0.001) == "not confirmed"  # 01's one rejection and a redraw that passes
    assert confirm_rejection(0.0009, [0.0002], 0.001) == "rejected"  # the contrary data: the redraw rejects too
    assert confirm_rejection(1e-9, [1e-9, 0.2], 0.001) == "not confirmed"  # every redraw must reject
    assert confirm_rejection(0.0, [0.4], 0.001, outside_support=1) == "rejected"  # probability 0: no chance event
    assert confirm_rejection(0.6, [], 0.001, outside_support=2) == "rejected"  # in a redraw, after a first pass
    with pytest.raises(ValueError, match="draw the cell again"):
        confirm_rejection(1e-5, [], 0.001)
    with pytest.raises(ValueError, match="lie in"):
        confirm_rejection(float("nan"), [], 0.001)


def _gof(p_value: float, impossible: int = 0):
    from specrepro.distribution import GofResult

    return GofResult(1.0, 3, p_value, 100, impossible, 0.01)


def _rule(runs: dict[int, list[float]], confirm_draws: int = 1) -> list:
    """The confirmation rule on canned p-values, as 01 runs it: draw 0, then the redraws the rule asks for."""
    from specrepro.distribution import confirmed, rule_redraws

    def draw(d):
        return [_gof(p, impossible=int(p == 0)) for p in runs[d]]

    first = draw(0)
    return confirmed([first, *(draw(d) for d in rule_redraws(first, false_alarm=0.001, confirm_draws=confirm_draws))],
                     0.001)


def test_the_rule_redraws_the_whole_set_only_where_a_first_test_rejects():
    tests = _rule({0: [0.5, 0.2]})  # no draw 1 to make: asking for it would raise KeyError
    assert [t.outcome for t in tests] == ["pass", "pass"] and tests[0].redraw_p_values == []
    # a rejection cleared by its redraw: the set is drawn again whole, the passing test's outcome is unchanged
    tests = _rule({0: [0.0009, 0.2], 1: [0.24, 0.0002]})
    assert [t.outcome for t in tests] == ["not confirmed", "pass"]
    assert tests[0].redraw_p_values == [0.24] and tests[1].redraw_p_values == [0.0002]
    # the contrary data: the redraws reject too
    tests = _rule({0: [0.0009, 0.2], 1: [0.0001, 0.5], 2: [0.0003, 0.5]}, confirm_draws=2)
    assert [t.outcome for t in tests] == ["rejected", "pass"] and tests[0].redraw_p_values == [0.0001, 0.0003]
    # a sample outside the support in a redraw fails the test whose first draw passed
    tests = _rule({0: [0.0009, 0.2], 1: [0.5, 0.0]})
    assert [t.outcome for t in tests] == ["not confirmed", "rejected"] and tests[1].outside_support == 1


def test_the_rule_refuses_no_redraws_and_ragged_draws():
    from specrepro.distribution import confirmed, rule_redraws

    with pytest.raises(ValueError, match="confirm_draws >= 1"):
        rule_redraws([_gof(0.5)], false_alarm=0.001, confirm_draws=0)
    with pytest.raises(ValueError, match="same set"):
        confirmed([[_gof(0.0001)], [_gof(0.5), _gof(0.5)]], 0.001)
    with pytest.raises(ValueError, match="same set"):
        confirmed([], 0.001)


def test_the_rules_power_is_the_single_tests_to_the_number_of_draws():
    from specrepro.distribution import detectable_tv, power_against_tv, rule_power

    assert rule_power(0.9, 1) == pytest.approx(0.81) and rule_power(0.9, 0) == 0.9
    exact = np.array([0.4, 0.3, 0.2, 0.05, 0.05])
    one = power_against_tv(exact, 0.05, 2000, false_alarm=FALSE_ALARM, reps=300)
    assert power_against_tv(exact, 0.05, 2000, false_alarm=FALSE_ALARM, reps=300, confirm_draws=1) == one ** 2
    single, rule = (detectable_tv(exact, 2000, false_alarm=FALSE_ALARM, reps=300, confirm_draws=k) for k in (0, 1))
    assert single < rule  # the rule pays in power: it needs a larger error for the same 80%
    assert power_against_tv(exact, rule, 2000, false_alarm=FALSE_ALARM, reps=300, confirm_draws=1) >= 0.8
