"""The decoding loops: greedy equivalence token for token, EOS and length handling, caches, stats, errors."""

import math

import pytest
import torch

from specrepro import autoregressive_generate, speculative_generate
from specrepro.tiny import tiny_draft, tiny_target

PROMPTS = [torch.tensor([[0, 3, 5]]), torch.tensor([[6]]), torch.tensor([[1, 2, 3, 4, 5, 6, 7, 1, 2]])]


@pytest.mark.parametrize("gamma", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_greedy_speculative_equals_greedy_autoregressive(pair64, gamma, prompt):
    target, draft = pair64
    x = PROMPTS[prompt]
    ref = autoregressive_generate(target, x, max_new_tokens=25, temperature=0)
    got = speculative_generate(target, draft, x, gamma=gamma, max_new_tokens=25, temperature=0)
    assert torch.equal(got.sequences, ref.sequences)
    assert got.stats.new_tokens == 25 and got.sequences.shape[1] == x.shape[1] + 25


def test_greedy_equivalence_with_a_draft_that_agrees_often():
    """With draft = target every block is accepted, including the bonus token path, for a long run."""
    target = tiny_target(16, seed=3)
    ref = autoregressive_generate(target, PROMPTS[0], max_new_tokens=40, temperature=0)
    got = speculative_generate(target, target, PROMPTS[0], gamma=4, max_new_tokens=40, temperature=0)
    assert torch.equal(got.sequences, ref.sequences)
    assert got.stats.accepted[:-1] == [4] * (len(got.stats.accepted) - 1) and got.stats.alpha == 1.0


def test_greedy_eos_stops_in_the_middle_of_an_accepted_block():
    target = tiny_target(16, seed=3)
    ref = autoregressive_generate(target, PROMPTS[0], max_new_tokens=40, temperature=0)
    new = ref.sequences[0, 3:].tolist()
    eos = new[6]  # a token the greedy run emits; it stops there
    stop = new.index(eos)
    ref_eos = autoregressive_generate(target, PROMPTS[0], max_new_tokens=40, temperature=0, eos_token_id=eos)
    got = speculative_generate(target, target, PROMPTS[0], gamma=4, max_new_tokens=40, temperature=0,
                               eos_token_id=[eos, 99])
    assert ref_eos.sequences[0, 3:].tolist() == new[:stop + 1]
    assert torch.equal(got.sequences, ref_eos.sequences)
    # the last block was accepted beyond the EOS position: the stop happened mid-block
    produced_before_last = sum(n + 1 for n in got.stats.accepted[:-1])
    assert got.stats.accepted[-1] + 1 > got.stats.new_tokens - produced_before_last


@pytest.mark.parametrize("gamma,max_new", [(1, 1), (3, 1), (3, 2), (4, 13), (8, 9)])
def test_speculative_produces_exactly_max_new_tokens(pair64, gamma, max_new):
    target, draft = pair64
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        r = speculative_generate(target, draft, PROMPTS[0], gamma=gamma, max_new_tokens=max_new, generator=g)
        assert r.sequences.shape[1] == 3 + max_new == 3 + r.stats.new_tokens
        assert sum(n + 1 for n in r.stats.accepted) == max_new
        assert all(g_i <= gamma for g_i in r.stats.proposed)


def test_stats_account_for_every_forward(pair64):
    target, draft = pair64
    r = speculative_generate(target, draft, PROMPTS[2], gamma=3, max_new_tokens=20,
                             generator=torch.Generator().manual_seed(1))
    s = r.stats
    assert s.target_calls == s.iterations
    assert s.draft_calls == sum(s.proposed)
    # the target sees the prompt once, then gamma+1 tokens per iteration, minus the rejected drafts re-fed
    assert s.target_forwards[0] == (9 + s.proposed[0], 0)
    for (n_tok, _cache_len), g in zip(s.target_forwards[1:], s.proposed[1:]):
        assert n_tok == g + 1
    # after each iteration the cache holds everything but the pending token
    lengths = [9 - 1]
    for n in s.accepted:
        lengths.append(lengths[-1] + n + 1)
    assert [c for _, c in s.target_forwards] == [0] + lengths[1:-1]
    assert 0 <= s.alpha <= 1 and s.tokens_per_iteration == 20 / s.iterations


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stats_time_every_iteration(pair64, temperature):
    target, draft = pair64
    sample = dict(max_new_tokens=12, temperature=temperature, generator=torch.Generator().manual_seed(2))
    s = speculative_generate(target, draft, PROMPTS[1], gamma=3, **sample).stats
    a = autoregressive_generate(target, PROMPTS[1], **sample).stats
    assert len(s.iteration_seconds) == len(s.draft_seconds) == len(s.target_seconds) == s.iterations
    assert len(a.iteration_seconds) == len(a.target_seconds) == a.new_tokens and set(a.draft_seconds) == {0.0}
    for it, d, t in zip(s.iteration_seconds + a.iteration_seconds, s.draft_seconds + a.draft_seconds,
                        s.target_seconds + a.target_seconds):
        assert 0 <= d and 0 < t and d + t <= it


def test_same_generator_seed_same_output_and_global_rng_untouched(pair64):
    target, draft = pair64
    state = torch.random.get_rng_state()
    a = speculative_generate(target, draft, PROMPTS[0], gamma=3, max_new_tokens=15,
                             generator=torch.Generator().manual_seed(5))
    b = speculative_generate(target, draft, PROMPTS[0], gamma=3, max_new_tokens=15,
                             generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.sequences, b.sequences)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_float32_models_work_and_draft_equal_to_target_accepts_everything():
    target = tiny_target(8, seed=2, dtype=torch.float32)
    r = speculative_generate(target, target, PROMPTS[0], gamma=4, max_new_tokens=30,
                             generator=torch.Generator().manual_seed(0))
    assert r.stats.alpha > 0.95  # p and q differ only by the numerics of batched vs one-token forwards


# ---- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(gamma=0), ValueError, "gamma"), (dict(gamma=-2), ValueError, "gamma"), (dict(gamma=1.5), ValueError, "gamma"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens"), (dict(temperature=-1.0), ValueError, "temperature"),
    (dict(top_p=0.0), ValueError, "top_p"), (dict(top_p=1.01), ValueError, "top_p"),
    (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), ValueError, "prompt is empty"),
    (dict(input_ids=torch.zeros(1, 3)), ValueError, "LongTensor"),
    (dict(input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 2, dtype=torch.long)),
     ValueError, "attention_mask must have input_ids' shape"),
    (dict(input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.tensor([[1, 1, 0], [1, 1, 1]])),
     ValueError, "left-padded"),
    (dict(input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.tensor([[0, 0, 0], [1, 1, 1]])),
     ValueError, "all padding"),
    (dict(input_ids=torch.zeros(2, 3, dtype=torch.long), eos_token_id=7), ValueError, "pad_token_id"),
    (dict(input_ids=torch.zeros(2, 3, dtype=torch.long), generator=[torch.Generator()]), ValueError,
     "one per row"),
])
def test_bad_arguments_raise_clear_errors(pair64, kwargs, exc, match):
    target, draft = pair64
    args = dict(input_ids=PROMPTS[0], gamma=2, max_new_tokens=5) | kwargs
    with pytest.raises(exc, match=match):
        speculative_generate(target, draft, **args)


def test_autoregressive_bad_arguments(pair64):
    target, _ = pair64
    with pytest.raises(ValueError, match="prompt is empty"):
        autoregressive_generate(target, torch.zeros(1, 0, dtype=torch.long), max_new_tokens=3)
    with pytest.raises(ValueError, match="temperature"):
        autoregressive_generate(target, PROMPTS[0], max_new_tokens=3, temperature=-0.5)


def test_vocabulary_mismatch_is_refused(pair64):
    target, _ = pair64
    with pytest.raises(ValueError, match="vocabulary mismatch: the target scores 8 tokens, the draft 9"):
        speculative_generate(target, tiny_draft(9), PROMPTS[0], gamma=2, max_new_tokens=3)


def test_nan_logits_are_reported_with_the_model_that_made_them(pair64):
    target, _ = pair64
    broken = tiny_draft(8)
    with torch.no_grad():
        broken.lm_head.weight[0, 0] = math.nan
    with pytest.raises(FloatingPointError, match="draft model returned NaN"):
        speculative_generate(target, broken, PROMPTS[0], gamma=2, max_new_tokens=3)
