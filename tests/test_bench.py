"""The benchmark harness: every method decodes the same thing; transformers' assisted generation agrees."""

import pytest
import torch

from specrepro import autoregressive_generate, bench, theory
from specrepro.tiny import tiny_pair


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(16, dtype=torch.float64)


@pytest.mark.parametrize("gamma", [None, 3])
def test_hf_assisted_greedy_equals_ours(pair, gamma):
    target, draft = pair
    x = torch.tensor([[1, 2, 3, 4]])
    ref = autoregressive_generate(target, x, max_new_tokens=20, temperature=0).sequences
    saved = draft.generation_config
    assert torch.equal(bench.hf_generate(target, x, max_new_tokens=20, assistant=draft, gamma=gamma), ref)
    assert draft.generation_config is saved  # restored


def test_hf_sampling_is_seeded_without_touching_the_global_rng(pair):
    target, draft = pair
    x = torch.tensor([[1, 2, 3, 4]])
    state = torch.random.get_rng_state()
    a = bench.hf_generate(target, x, max_new_tokens=10, temperature=1.0, assistant=draft, gamma=2,
                          generator=torch.Generator().manual_seed(3))
    b = bench.hf_generate(target, x, max_new_tokens=10, temperature=1.0, assistant=draft, gamma=2,
                          generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and torch.equal(torch.random.get_rng_state(), state)


def test_run_bench_interleaves_all_methods_on_the_same_prompts(pair):
    target, draft = pair
    prompts = [torch.tensor([[1, 2, 3]]), torch.tensor([[5, 6, 7, 8]])]
    runs = bench.run_bench(target, draft, prompts, gamma=2, max_new_tokens=8, repeats=2)
    assert [r.method for r in runs[:4]] == list(bench.METHODS)
    assert len(runs) == 2 * 2 * len(bench.METHODS)
    for i in range(2):  # greedy: every method writes the same tokens
        outs = {tuple(r.output) for r in runs if r.prompt == i}
        assert len(outs) == 1
    summary = bench.summarize(runs)
    assert summary["autoregressive"]["speedup"] == 1.0
    assert all(s["tokens"] == 2 * 2 * 8 for s in summary.values())
    assert all(r.alpha is not None for r in runs if r.method == "speculative")


def test_predicted_speedup_is_the_generalised_model():
    got = bench.predicted_speedup(0.8, 4, ar_ms_per_token=100, draft_ms_per_token=5, forward_ms_1=90,
                                  forward_ms_verify=150)
    assert got == pytest.approx(theory.expected_tokens(0.8, 4) * 100 / (4 * 5 + 150 + 10))
    # with the iterations' proposal lengths: all equal to gamma gives the same; a 0 is one plain decoding step
    verify = [90, 100, 110, 130, 150]
    same = bench.predicted_speedup(0.8, 4, ar_ms_per_token=100, draft_ms_per_token=5, forward_ms_1=90,
                                   forward_ms_verify=verify, lengths=[4, 4, 4])
    assert same == pytest.approx(got)
    mixed = bench.predicted_speedup(0.8, 4, ar_ms_per_token=100, draft_ms_per_token=5, forward_ms_1=90,
                                    forward_ms_verify=verify, lengths=[4, 0])
    tokens, ms = theory.expected_tokens(0.8, 4) + 1, (4 * 5 + 150 + 10) + (90 + 10)
    assert mixed == pytest.approx(tokens * 100 / ms)


def test_prompt_lookup_maps_to_transformers_prompt_lookup_decoding():
    from specrepro.drafts import PromptLookupDraft
    from specrepro.tiny import tiny_target

    target = tiny_target(16, seed=3)
    x = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])
    ref = autoregressive_generate(target, x, max_new_tokens=15, temperature=0).sequences
    for gamma in (None, 3):
        assert torch.equal(bench.hf_generate(target, x, max_new_tokens=15, assistant=PromptLookupDraft(16, 2),
                                             gamma=gamma), ref)


def test_prediction_in_decode_steps_scales_the_verification_by_the_run_step():
    got = bench.predicted_speedup_in_steps(0.8, 2, ar_ms_per_token=50, draft_ms_per_token=5, verify_steps=[1.0, 1.1, 1.2],
                                           lengths=[2, 0])
    tokens, ms = theory.expected_tokens(0.8, 2) + 1, (2 * 5 + 1.2 * 50) + 50
    assert got == pytest.approx(tokens * 50 / ms)


def _run(method, prompt, seconds, ttft, tokens, stats=None):
    return bench.Run(method, prompt, 0, seconds, ttft, tokens, stats=stats)


def test_summary_pools_time_per_token_over_prompts():
    # prompt 0 repeats itself (speculative 4x faster), prompt 1 does not (no faster): pooled, not the median
    runs = [_run("autoregressive", 0, 10.5, 0.5, 101), _run("speculative", 0, 3.0, 0.5, 101),
            _run("autoregressive", 1, 10.5, 0.5, 101), _run("speculative", 1, 10.5, 0.5, 101)]
    s = bench.summarize(runs)
    assert s["autoregressive"]["decode_ms_per_token"] == pytest.approx(100.0)
    assert s["speculative"]["decode_ms_per_token"] == pytest.approx(1e3 * 12.5 / 200)
    assert s["speculative"]["speedup"] == pytest.approx(20 / 12.5)
    assert s["speculative"]["speedup_range"] == pytest.approx((1.0, 4.0))
    assert s["speculative"]["ttft_ms"] == pytest.approx(500)


def _stats(proposed, accepted, iteration, draft, target):
    from specrepro.generate import GenerationStats

    return GenerationStats(prompt_len=4, new_tokens=sum(n + 1 for n in accepted), proposed=proposed,
                           accepted=accepted, iteration_seconds=iteration, draft_seconds=draft,
                           target_seconds=target)


def test_iteration_costs_skip_the_prefill_and_split_by_proposal_length():
    ar = _stats([], [], [9.0, 0.10, 0.12], [0.0] * 3, [8.9, 0.09, 0.11])
    sp = _stats([3, 3, 0, 2], [0, 3, 0, 1], [9.0, 0.14, 0.11, 0.13],
                [0.5, 0.006, 0.001, 0.004], [8.0, 0.13, 0.10, 0.12])
    costs = bench.iteration_costs([_run("autoregressive", 0, 9.22, 9.0, 3, ar), _run("speculative", 0, 9.38, 9.0, 8, sp)])
    assert costs.step_ms == pytest.approx(110)
    assert costs.draft_ms == pytest.approx(11 / 5)  # 11 ms of draft work for 5 proposed tokens
    assert costs.verify_ms == pytest.approx({0: 100, 2: 120, 3: 130})
    assert costs.iterations == {0: 1, 2: 1, 3: 1}
    assert costs.overhead_ms == pytest.approx((4 + 9 + 6) / 3)
    assert costs.verify_steps[3] == pytest.approx(130 / 110)
    with pytest.raises(ValueError, match="autoregressive and speculative"):
        bench.iteration_costs([_run("speculative", 0, 9.38, 9.0, 8, sp)])


def test_in_run_prediction_is_exact_when_acceptance_is_what_alpha_says():
    # alpha = 1 (every draft accepted): Eq. 1 holds exactly, so with costs timed in the run the model must give
    # back the speedup measured from the same times
    step, it = 0.1, 0.16  # a decode step; an iteration of gamma = 3 that yields 4 tokens
    ar = _stats([], [], [1.0] + [step] * 12, [0.0] * 13, [0.9] + [0.09] * 12)
    sp = _stats([3] * 4, [3] * 4, [1.0] + [it] * 3, [0.1] + [0.03] * 3, [0.85] + [0.12] * 3)
    runs = [_run("autoregressive", 0, 1.0 + 12 * step, 1.0, 13, ar), _run("speculative", 0, 1.0 + 3 * it, 1.0, 16, sp)]
    measured = (12 * step / 12) / (3 * it / 12)  # pooled decode time per token, autoregressive / speculative
    assert bench.predicted_speedup_in_run(runs) == pytest.approx(measured)


def test_every_method_logs_the_targets_forwards(pair):
    target, draft = pair
    runs = bench.run_bench(target, draft, [torch.tensor([[1, 2, 3]])], gamma=2, max_new_tokens=8, warmup=False)
    for r in runs:
        assert r.target_forwards and all(n >= 1 and t > 0 for n, t in r.target_forwards)
        if r.stats is not None:  # ours: the hook sees exactly the forwards the loop recorded
            assert [n for n, _ in r.target_forwards] == [n for n, _ in r.stats.target_forwards]
    s = bench.summarize(runs)
    assert s["autoregressive"]["target_forwards_per_token"] == 1.0
    for m in bench.METHODS:
        assert s[m]["other_ms_per_token"] >= 0 and s[m]["target_forward_ms_per_token"] > 0


def test_forward_log_removes_its_hooks(pair):
    from specrepro.timing import forward_log

    target, _ = pair
    with forward_log(target) as log:
        target(input_ids=torch.tensor([[1, 2]]))
    target(input_ids=torch.tensor([[1, 2]]))
    assert [n for n, _ in log] == [2] and not target._forward_hooks and not target._forward_pre_hooks
