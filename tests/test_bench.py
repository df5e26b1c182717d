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
