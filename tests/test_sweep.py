"""The draft sweep's statistics: Eq. 1's capped geometric law and its fit test (which must reject runs of
acceptances), the lag correlation, the calibrated prediction and the sweep's bookkeeping on a tiny pair."""

import numpy as np
import pytest
import torch

from specrepro import sweep as S
from specrepro import theory
from specrepro.tiny import tiny_pair


def test_capped_geometric_sums_to_one_and_has_eq1_mean():
    for alpha, gamma in ((0.3, 4), (0.8, 7), (0.0, 2)):
        p = S.capped_geometric(alpha, gamma)
        assert p.sum() == pytest.approx(1.0)
        assert (p * (np.arange(gamma + 1) + 1)).sum() == pytest.approx(theory.expected_tokens(alpha, gamma))


def _iid(alpha, gamma, n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = 0
        while k < gamma and rng.random() < alpha:
            k += 1
        out.append(k)
    return out


def test_geometric_fit_accepts_iid_acceptances_and_rejects_runs():
    ok = S.geometric_fit(_iid(0.6, 5, 3000, 0), 5)
    assert ok["p_value"] > 0.01 and ok["alpha"] == pytest.approx(0.6, abs=0.03)
    # all-or-nothing iterations (a copying draft): same alpha, far from geometric
    rng = np.random.default_rng(1)
    runs = [5 if rng.random() < 0.5 else 0 for _ in range(3000)]
    assert S.geometric_fit(runs, 5)["p_value"] < 1e-6


def test_lag_correlation_sees_runs():
    def run(acc):
        return S.SweepRun("d", 4, 0, 1.0, 1.0, 1, 0.0, 4 * len(acc), [4] * len(acc), acc, [])
    iid = [run(_iid(0.5, 4, 400, s)) for s in range(3)]
    assert abs(S.lag_correlation(iid)) < 0.1
    # prompts that differ in alpha alone are not runs: within each generation acceptances are independent
    mixed = [run(_iid(a, 4, 400, s)) for s, a in enumerate((0.1, 0.9, 0.1, 0.9))]
    assert abs(S.lag_correlation(mixed)) < 0.1
    sticky = [run([4] * 50 + [0] * 50 + [4] * 50)]
    assert S.lag_correlation(sticky) > 0.9


def test_predict_is_thm_3_8_when_verification_costs_one_step():
    cal = S.Calibration("d", c=0.1, draft_ms=1.0, target_ms=10.0, verify_steps=(1.0,) * 9, alpha=0.7,
                        lengths={8: (8,) * 10}, gamma=8)
    for g in (1, 3, 8):
        assert S.predict(cal, g) == pytest.approx(theory.walltime_improvement(0.7, g, 0.1))
    with pytest.raises(ValueError, match="covers gamma 1..8"):
        S.predict(cal, 9)


def _greedy_continuation(target, ids, n):
    from specrepro.generate import autoregressive_generate

    return autoregressive_generate(target, ids, max_new_tokens=n, temperature=0).sequences[:, ids.shape[1]:]


@pytest.mark.parametrize("lookup", [False, True])
@pytest.mark.parametrize("with_eos", [False, True])
def test_greedy_replay_is_the_loops_own_run(lookup, with_eos):
    """Greedy, the replay over the target's continuation gives the loop's iterations exactly, model or lookup, also
    when EOS ends the run early (the loop tests drafts past EOS before it cuts them)."""
    from specrepro.acceptance import position_logits
    from specrepro.drafts import PromptLookupDraft
    from specrepro.generate import speculative_generate

    target, draft = tiny_pair(16, dtype=torch.float32)
    draft = PromptLookupDraft(16) if lookup else draft
    for i in range(3):
        ids = torch.randint(16, (1, 6), generator=torch.Generator().manual_seed(i))
        new = _greedy_continuation(target, ids, 20)
        eos = int(new[0, 9]) if with_eos else None
        end = next((j + 1 for j, t in enumerate(new[0].tolist()) if t == eos), 20)
        b = (position_logits(draft, ids, new).argmax(-1) == new[0]).double().tolist()
        for gamma in (1, 3, 5):
            its = S.replay(b, gamma, rng=np.random.default_rng(0), end=end, prefix=ids[0].tolist(),
                           new=new[0].tolist(), proposal_length=getattr(draft, "proposal_length", None))
            st = speculative_generate(target, draft, ids, gamma=gamma, max_new_tokens=20, temperature=0,
                                      eos_token_id=eos).stats
            assert [p for p, _ in its] == list(st.proposed) and [n for _, n in its] == list(st.accepted)
            assert min(sum(n + 1 for _, n in its), end) == st.new_tokens == end


def test_sampled_replay_follows_eq1_when_betas_are_constant():
    rng = np.random.default_rng(0)
    its = [it for _ in range(400) for it in S.replay([0.6] * 40, 4, rng=rng)]
    full = [n for p, n in its if p == 4]
    assert np.mean([n + 1 for n in full]) == pytest.approx(theory.expected_tokens(0.6, 4), rel=0.03)
    assert S.replay([1.0] * 10, 3, rng=rng) == [(3, 3), (3, 3), (1, 1)]  # the last proposes only what is left
    assert S.replay([0.0] * 3, 2, rng=rng) == [(2, 0), (1, 0), (0, 0)]
    with pytest.raises(ValueError, match="gamma must be >= 1"):
        S.replay([0.5], 0, rng=rng)
    assert S.replay([1.0] * 10, 3, rng=rng, end=2) == [(3, 3)]  # EOS at the 2nd token: drafts past it are tested
    with pytest.raises(ValueError, match="needs the prompt"):
        S.replay([0.5], 2, rng=rng, proposal_length=lambda tokens, g: g)
    with pytest.raises(ValueError, match="end must be in 1..3"):
        S.replay([0.5] * 3, 2, rng=rng, end=4)
    with pytest.raises(ValueError, match="proposal_length returned 5"):
        S.replay([0.5] * 3, 2, rng=rng, prefix=[1], new=[1, 2, 3], proposal_length=lambda tokens, g: 5)


def test_predict_replay_counts_tokens_over_steps():
    cal = S.Calibration("d", c=0.1, draft_ms=1.0, target_ms=10.0, verify_steps=(1.0, 1.2, 1.5), alpha=0.5,
                        lengths={2: (2, 2, 0)}, gamma=2, accepted={2: (2, 0, 0)})
    assert S.predict_replay(cal, 2) == pytest.approx((3 + 1 + 1) / (2 * 0.1 + 1.5 + 2 * 0.1 + 1.5 + 1.0))
    assert cal.alpha_at(2) == pytest.approx(2 / 3)  # tested: 2 accepted + 1 rejection; the empty proposal none
    assert np.isnan(S.predict_replay(cal, 1))  # no iterations kept at gamma 1


def test_sweep_and_tables_on_a_tiny_pair():
    from specrepro.drafts import PromptLookupDraft

    target, draft = tiny_pair(16, dtype=torch.float32)
    prompts = [torch.randint(16, (1, 6), generator=torch.Generator().manual_seed(i)) for i in range(3)]
    verify = [1.0, 1.1, 1.2, 1.3]
    cal = S.calibrate(target, {"d": draft}, prompts[:1], gamma=3, max_new_tokens=8, temperature=1.0,
                      cost_prompt=prompts[0], verify_steps=verify, cost_tokens=4)
    assert 0 <= cal["d"].alpha <= 1 and cal["d"].c > 0 and list(cal["d"].lengths) == [3]
    lookup = S.calibrate(target, {"l": PromptLookupDraft(16)}, prompts[:1], gamma=3, max_new_tokens=8, temperature=0,
                         cost_prompt=prompts[0], verify_steps=verify, cost_tokens=4, gammas=[1, 3])
    assert list(lookup["l"].lengths) == [1, 3]  # a lookup draft is calibrated at every gamma it will run
    runs = S.sweep(target, {"d": draft}, prompts[1:], [1, 3], max_new_tokens=8, temperature=1.0)
    assert [(r.draft, r.gamma, r.prompt) for r in runs] == [("", 0, 0), ("d", 1, 0), ("d", 3, 0),
                                                            ("", 0, 1), ("d", 1, 1), ("d", 3, 1)]
    assert all(r.decode_tokens + r.accepted[0] + 1 == 8 for r in runs if r.gamma and r.accepted[0] < 7)
    rows = S.cells(runs, cal)
    assert [(r["draft"], r["gamma"]) for r in rows] == [("d", 1), ("d", 3)]
    assert all(r["speedup_lo"] <= r["speedup"] <= r["speedup_hi"] and r["n_prompts"] == 2 for r in rows)
    assert len(S.records(runs)) == 6 and S.records(runs)[1]["accepted"].split()[0].isdigit()
    # the paired ratio of two cells: the ratio of their speedups over the same autoregressive runs, and 1 for itself
    ratio = S.speedup_ratio(runs, ("d", 3), ("d", 1))
    assert ratio.estimate == pytest.approx(rows[1]["speedup"] / rows[0]["speedup"]) and ratio.n_units == 2
    assert ratio.lo <= ratio.estimate <= ratio.hi and S.speedup_ratio(runs, ("d", 1), ("d", 1)).hi == 1.0
    t2 = S.table2(rows, cal, {"d": 123})
    assert t2[0]["gamma_opt"] in (1, 3) and t2[0]["params"] == 123
    assert t2[0]["speedup"] == max(r["speedup"] for r in rows)
    with pytest.raises(ValueError, match="verify_steps covers"):
        S.calibrate(target, {"d": draft}, prompts[:1], gamma=5, max_new_tokens=4, temperature=0,
                    cost_prompt=prompts[0], verify_steps=verify)


def test_weights_read_counts_the_head_not_the_embedding_lookup():
    from specrepro.drafts import LookupHybridDraft, PromptLookupDraft
    from specrepro.lens import LensDraft
    from specrepro.tiny import tiny_target

    target, draft = tiny_pair(16, dtype=torch.float32)
    # the tiny target's head is untied: everything but the embedding lookup
    emb = target.get_input_embeddings().weight.numel()
    assert S.weights_read(target) == sum(p.numel() for p in target.parameters() if p.dim() >= 2) - emb
    assert S.weights_read(PromptLookupDraft(16)) == 0
    assert S.weights_read(LookupHybridDraft(draft)) == S.weights_read(draft)
    big = tiny_target(49152, hidden_size=16, layers=2, dtype=torch.float32)
    lens = LensDraft(big, 1, torch.arange(100))
    layer = sum(p.numel() for p in big.model.layers[0].parameters() if p.dim() >= 2)
    assert S.weights_read(lens) == layer + 16 * 16 + 101 * 16


def test_threads_restores_the_thread_count():
    before = torch.get_num_threads()
    with S.threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def _size_case(predicted_small: float, alpha_big: float):
    """Two drafts of one family measured on 8 prompts at gamma 2: small decodes each prompt's 10 tokens in
    1.0 s (+-2%), big in 1.25 s; the calibration predicted `predicted_small` for small, 1.2 for big."""
    import pandas as pd

    rng = np.random.default_rng(0)
    runs = [S.SweepRun(d, 2, p, 0.0, secs * (1 + rng.uniform(-0.02, 0.02)), 10, 0.0, 0, [], [], [])
            for p in range(8) for d, secs in (("small", 1.0), ("big", 1.25), ("other", 0.8))]
    rows = [dict(task="code", temperature=0.0, draft=d, gamma_pred=2, predicted_speedup=pred, speedup=sp,
                 measured_at_gamma_pred=sp, measured_at_gamma_pred_lo=sp - 0.05, measured_at_gamma_pred_hi=sp + 0.05)
            for d, pred, sp in (("small", predicted_small, 1.25), ("big", 1.2, 1.0), ("other", 1.5, 1.56))]
    grid = pd.DataFrame([dict(task="code", temperature=0.0, draft=d, gamma=2, alpha=a)
                         for d, a in (("small", 0.4), ("big", alpha_big), ("other", 0.6))])
    return pd.DataFrame(rows), grid, {("code", 0.0): runs}


def test_size_verdicts_answer_the_question_for_a_family_and_its_contrary():
    table2, grid, runs = _size_case(predicted_small=1.3, alpha_big=0.5)
    v = S.size_verdicts(table2, grid, runs, ["small", "big"], 2)["code_T0"]
    assert (v["winner"], v["runner_up"], v["smallest_wins"], v["alpha_rises_with_size"]) == ("small", "big", True,
                                                                                             True)
    assert v["reliably_faster"] and v["paired_ratio"] == pytest.approx(1.25, rel=0.03)
    assert v["alphas"] == [0.4, 0.5] and v["overall_best"] == "other"  # the fastest of all, outside the family
    # the contrary: the calibration favours the larger draft, whose alpha is no higher: it is picked and loses
    table2, grid, runs = _size_case(predicted_small=1.1, alpha_big=0.3)
    v = S.size_verdicts(table2, grid, runs, ["small", "big"], 2)["code_T0"]
    assert (v["winner"], v["smallest_wins"], v["alpha_rises_with_size"], v["reliably_faster"]) == ("big", False,
                                                                                                  False, False)
    with pytest.raises(ValueError, match="smallest first"):
        S.size_verdicts(table2, grid, runs, [], 2)
    with pytest.raises(ValueError, match=r"\['huge'\] not in the sweep's table at code_T0"):
        S.size_verdicts(table2, grid, runs, ["small", "huge"], 2)


def test_sweep_runs_each_method_with_its_own_kernel(monkeypatch):
    from specrepro.kernels import LINEARS

    target, draft = tiny_pair(16, dtype=torch.float32)
    prompts = [torch.randint(16, (1, 6), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    seen, real_run = [], S._run

    def spy(t, d, ids, **kw):  # the linear class each model holds while the run is timed
        seen.append((kw["gamma"] if d is not None else 0, type(t.lm_head),
                     None if d is None else type(d.lm_head)))
        return real_run(t, d, ids, **kw)

    monkeypatch.setattr(S, "_run", spy)
    kernels = {"autoregressive": "stock", "speculative": "small_row"}
    runs = S.sweep(target, {"d": draft}, prompts, [1, 2], max_new_tokens=6, temperature=0.0, kernels=kernels)
    assert len(runs) == 6 and len(seen) == 6
    stock, small = LINEARS["stock"], LINEARS["small_row"]
    assert all(t is (stock if g == 0 else small) for g, t, _ in seen)  # the target: per method
    assert all(d is small for g, _, d in seen if g)  # the draft with the speculative kernel
    # the contrary mapping gives the contrary classes
    seen.clear()
    S.sweep(target, {"d": draft}, prompts[:1], [1], max_new_tokens=4, temperature=0.0,
            kernels={"autoregressive": "small_row", "speculative": "stock"})
    assert [t for _, t, _ in seen] == [small, stock]
    for bad, match in (({"autoregressive": "stock"}, "no kernel for"), ({**kernels, "speculative": "fast"}, "unknown")):
        with pytest.raises(ValueError, match=match):
            S.sweep(target, {"d": draft}, prompts, [1], max_new_tokens=4, temperature=0.0, kernels=bad)
        with pytest.raises(ValueError, match=match):
            S.verify_profile(target, 8, 1, bad)


def test_verify_profile_divides_the_speculative_forwards_by_the_autoregressive_step(monkeypatch):
    from specrepro.kernels import LINEARS

    target, _ = tiny_pair(16, dtype=torch.float32)
    ms = {LINEARS["stock"]: 10.0, LINEARS["small_row"]: 8.0}  # a 1-token forward's time with each kernel

    def fake(model, context, gamma, device=None):  # g+1 tokens cost 1 + g/4 forwards with the kernel held
        return [ms[type(model.lm_head)] * (1 + g / 4) for g in range(gamma + 1)]

    monkeypatch.setattr(S.walltime, "verify_ms", fake)
    got = S.verify_profile(target, 8, 2, {"autoregressive": "stock", "speculative": "small_row"})
    assert got == pytest.approx([0.8, 1.0, 1.2])  # small_row's forwards over stock's step
    assert type(target.lm_head) is LINEARS["small_row"]  # left with the speculative kernel
    got = S.verify_profile(target, 8, 2, {"autoregressive": "small_row", "speculative": "stock"})
    assert got == pytest.approx([1.25, 1.5625, 1.875])
    # one kernel for both: every forward with it, the first entry 1
    assert S.verify_profile(target, 8, 2, dict.fromkeys(S.METHODS, "small_row")) == pytest.approx([1.0, 1.25, 1.5])
    assert type(target.lm_head) is LINEARS["small_row"]
    assert S.verify_profile(target, 8, 1) == pytest.approx([1.0, 1.25])


def test_thread_effect_pairs_the_two_speedups_on_the_same_prompts():
    """One thread: autoregressive 2.0 s and speculative 1.0 s per prompt (2x); two threads: 1.0 and 0.8 s (1.25x),
    each prompt's times scaled by a per-prompt factor (long and short prompts) that must cancel."""
    rng = np.random.default_rng(1)
    scale = rng.uniform(0.5, 2.0, size=10)

    def runs(ar, sd):
        return [S.SweepRun(d, g, p, 0.0, secs * scale[p] * (1 + rng.uniform(-0.01, 0.01)), 10, 0.0, 0, [], [], [])
                for p in range(10) for d, g, secs in (("", 0, ar), ("x", 2, sd))]

    one, two = runs(2.0, 1.0), runs(1.0, 0.8)
    r = S.thread_effect(one, two, "x", 2)
    assert r.estimate == pytest.approx(2.0 / 1.25, rel=0.02) and r.lo > 1.5 and r.n_units == 10
    r = S.thread_effect(two, one, "x", 2)  # the contrary: the fewer-thread runs gain less
    assert r.estimate == pytest.approx(1.25 / 2.0, rel=0.02) and r.hi < 0.7
    with pytest.raises(ValueError, match="no prompt"):
        S.thread_effect(one, two, "y", 2)
