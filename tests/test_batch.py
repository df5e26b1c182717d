"""Batch > 1 (Zhang et al. 2025, arXiv 2510.22876): ragged rows decoded together give each row's batch-1 output.

Tiny float64 models, so any difference is a bookkeeping bug, not float numerics.
"""

import numpy as np
import pytest
import torch

from specrepro import autoregressive_generate, generate, speculative_generate
from specrepro.distribution import chisquare_gof, counts_of, exact_joint_distribution
from specrepro.sampling import SamplingConfig

from conftest import draw

V, PAD = 8, 0
FALSE_ALARM = 1e-3


def ragged_prompts(batch: int, seed: int) -> list[list[int]]:
    """Prompts of 1 to 11 tokens (lengths differ by up to 10)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 12, (batch,), generator=g).tolist()
    return [torch.randint(V, (n,), generator=g).tolist() for n in lengths]


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    return generate.left_pad(prompts, PAD)


def alone(fn, prompt: list[int], **kw) -> list[int]:
    return fn(torch.tensor([prompt]), **kw).sequences[0, len(prompt):].tolist()


def row_new_tokens(result, mask: torch.Tensor, b: int) -> list[int]:
    return result.sequences[b, mask.shape[1]:mask.shape[1] + result.rows[b].new_tokens].tolist()


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("gamma", [1, 2, 3, 5])
@pytest.mark.parametrize("eos", [None, 5])
def test_batched_greedy_equals_each_row_alone(pair64, batch, gamma, eos):
    target, draft = pair64
    prompts = ragged_prompts(batch, seed=batch * 10 + gamma)
    ids, mask = left_pad(prompts)
    kw = dict(max_new_tokens=12, temperature=0, eos_token_id=eos, pad_token_id=PAD)
    spec = speculative_generate(target, draft, ids, attention_mask=mask, gamma=gamma, check_invariants=True, **kw)
    ar = autoregressive_generate(target, ids, attention_mask=mask, check_invariants=True, **kw)
    for b, prompt in enumerate(prompts):
        ref = alone(lambda x, **k: autoregressive_generate(target, x, **k), prompt, **kw)
        assert row_new_tokens(ar, mask, b) == ref
        assert row_new_tokens(spec, mask, b) == ref
        assert spec.sequences[b, mask.shape[1] + len(ref):].eq(PAD).all()  # padding after the row ended
        assert torch.equal(spec.sequences[b, :mask.shape[1]], ids[b])  # the input row as given
    assert spec.sequences.shape[1] == ids.shape[1] + max(r.new_tokens for r in spec.rows)


def test_rows_ending_at_different_iterations_leave_the_batch(pair64):
    """With EOS some rows end early; the others go on with their caches intact (checked against batch 1)."""
    target, draft = pair64
    prompts = ragged_prompts(6, seed=3)
    ids, mask = left_pad(prompts)
    kw = dict(max_new_tokens=20, temperature=0, pad_token_id=PAD)
    refs = [alone(lambda x, **k: autoregressive_generate(target, x, **k), p, **kw) for p in prompts]
    eos = refs[0][3]  # a token that ends at least one row early
    out = speculative_generate(target, draft, ids, attention_mask=mask, gamma=3, eos_token_id=eos, **kw)
    lengths = [r.new_tokens for r in out.rows]
    assert len(set(lengths)) > 1 and min(lengths) < 20
    for b, ref in enumerate(refs):
        expected = ref[:ref.index(eos) + 1] if eos in ref else ref
        assert row_new_tokens(out, mask, b) == expected


@pytest.mark.parametrize("temperature,top_p", [(1.0, None), (0.8, 0.9)])
def test_each_row_with_its_own_generator_reads_its_batch1_uniforms(pair64, temperature, top_p):
    """Rows are independent draws: with one generator per row, row b's tokens are exactly those it gets alone."""
    target, draft = pair64
    prompts = ragged_prompts(5, seed=7)
    ids, mask = left_pad(prompts)
    kw = dict(max_new_tokens=10, temperature=temperature, top_p=top_p, eos_token_id=6, pad_token_id=PAD)
    out = speculative_generate(target, draft, ids, attention_mask=mask, gamma=3,
                               generator=[torch.Generator().manual_seed(100 + b) for b in range(5)], **kw)
    for b, prompt in enumerate(prompts):
        ref = speculative_generate(target, draft, torch.tensor([prompt]), gamma=3,
                                   generator=torch.Generator().manual_seed(100 + b), **kw)
        assert row_new_tokens(out, mask, b) == ref.sequences[0, len(prompt):].tolist()
        assert out.rows[b].accepted == ref.stats.accepted


def test_per_row_stats_add_up_to_the_batch(pair64):
    target, draft = pair64
    prompts = ragged_prompts(4, seed=1)
    ids, mask = left_pad(prompts)
    out = speculative_generate(target, draft, ids, attention_mask=mask, gamma=2, max_new_tokens=9,
                               generator=torch.Generator().manual_seed(0))
    assert [r.prompt_len for r in out.rows] == [len(p) for p in prompts]
    assert all(r.new_tokens == 9 and sum(n + 1 for n in r.accepted) == 9 for r in out.rows)
    assert out.stats.new_tokens == 36
    assert sorted(out.stats.accepted) == sorted(n for r in out.rows for n in r.accepted)
    assert out.stats.target_calls == len(out.stats.iteration_seconds)


# ---- distributions: every row is the target's distribution for its own prompt --------------------------------

PROMPTS3 = [[0, 3, 5], [2], [4, 1, 1, 6, 2, 7, 3]]


@pytest.mark.parametrize("cfg", [SamplingConfig(1.0), SamplingConfig(0.8, top_p=0.9)])
def test_each_row_of_a_batch_draws_from_the_target(pair64, cfg):
    target, draft = pair64
    ids, mask = left_pad(PROMPTS3)

    def once(g):
        out = speculative_generate(target, draft, ids, attention_mask=mask, gamma=2, max_new_tokens=2, generator=g,
                                   temperature=cfg.temperature, top_p=cfg.top_p)
        return out.sequences[:, ids.shape[1]:].flatten().numpy()  # (3 rows x 2 tokens)

    samples = draw(once, 1500, seed=5).reshape(1500, 3, 2)
    for b, prompt in enumerate(PROMPTS3):
        exact = exact_joint_distribution(target, torch.tensor([prompt]), 2, cfg)
        assert not chisquare_gof(counts_of(samples[:, b], V), exact.numpy()).rejects(FALSE_ALARM), b


def test_rows_are_independent(pair64):
    """The first tokens of two rows are independent: chi-squared of their joint against the product of marginals."""
    target, draft = pair64
    ids, mask = left_pad(PROMPTS3[:2])
    first = _first_tokens(target, draft, ids, mask)
    assert not _independence_rejects(first)


def test_planted_bug_rows_sharing_uniforms_is_detected(pair64, monkeypatch):
    """Rows reading copies of one uniform stream (a bug of batching one generator naively) are dependent."""
    target, draft = pair64
    ids, mask = left_pad(PROMPTS3[:2])

    def copies_of_one_stream(generator, rows):
        state = generator.get_state()
        generator.manual_seed(int(torch.randint(2**62, (), generator=generator)))  # next call, a new stream
        copies = [torch.Generator() for _ in range(rows)]
        for c in copies:
            c.set_state(state)
        return copies

    monkeypatch.setattr(generate, "_row_generators", copies_of_one_stream)
    assert _independence_rejects(_first_tokens(target, draft, ids, mask))


def test_planted_bug_row_reading_another_rows_q_is_detected(pair64):
    target, draft = pair64
    ids, mask = left_pad(PROMPTS3[:2])

    def swapped_q(*args, **kw):
        drafts, q = generate.propose(*args, **kw)
        return drafts, q[1:] + q[:1]

    def once(g):
        out = generate.decode(target, draft, ids, mask, gamma=2, max_new_tokens=2, cfg=SamplingConfig(), generator=g,
                              steps=generate.Steps(propose=swapped_q))
        return out.sequences[0, ids.shape[1]:].numpy()

    exact = exact_joint_distribution(target, torch.tensor([PROMPTS3[0]]), 2, SamplingConfig())
    first = draw(once, 1500, seed=9)[:, :1]  # the first token: drafted and accepted with the wrong q
    assert chisquare_gof(counts_of(first, V), exact.sum(1).numpy()).rejects(FALSE_ALARM)



def _first_tokens(target, draft, ids, mask) -> np.ndarray:
    def once(g):
        out = speculative_generate(target, draft, ids, attention_mask=mask, gamma=2, max_new_tokens=1, generator=g)
        return out.sequences[:, ids.shape[1]].numpy()  # (2,): each row's first new token

    return draw(once, 1500, seed=13)


def _independence_rejects(pairs: np.ndarray) -> bool:
    from scipy.stats import chi2_contingency

    table = counts_of(pairs, V)
    table = table[table.sum(1) > 0][:, table.sum(0) > 0]
    return chi2_contingency(table).pvalue < FALSE_ALARM


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_batched_prompt_lookup_equals_each_row_alone(pair64, gamma):
    """The prompt-lookup draft proposes a different number of tokens per row (as far as each row's match reaches)."""
    from specrepro.drafts import PromptLookupDraft

    target, _ = pair64
    lookup = PromptLookupDraft(V, max_ngram=2)
    prompts = [p * 3 for p in ragged_prompts(6, seed=gamma)]  # repetitive prompts, so that the lookup matches
    ids, mask = left_pad(prompts)
    kw = dict(max_new_tokens=15, pad_token_id=PAD, eos_token_id=4)
    greedy = speculative_generate(target, lookup, ids, attention_mask=mask, gamma=gamma, temperature=0,
                                  check_invariants=True, **kw)
    sampled = speculative_generate(target, lookup, ids, attention_mask=mask, gamma=gamma, check_invariants=True,
                                   generator=[torch.Generator().manual_seed(b) for b in range(6)], **kw)
    assert len({tuple(r.proposed) for r in greedy.rows}) > 1  # the rows' proposal lengths differ
    for b, prompt in enumerate(prompts):
        x = torch.tensor([prompt])
        ref = autoregressive_generate(target, x, temperature=0, **kw)
        assert row_new_tokens(greedy, mask, b) == ref.sequences[0, len(prompt):].tolist()
        ref = speculative_generate(target, lookup, x, gamma=gamma, generator=torch.Generator().manual_seed(b), **kw)
        assert row_new_tokens(sampled, mask, b) == ref.sequences[0, len(prompt):].tolist()


def test_speedup_interval_of_one_batch_has_no_bounds():
    from types import SimpleNamespace

    from specrepro.batching import BatchedRun, speedup_interval

    def run(method, seconds, tokens):
        results = [SimpleNamespace(stats=SimpleNamespace(iteration_seconds=[s / 2, s / 2], new_tokens=t), rows=[0, 1])
                   for s, t in zip(seconds, tokens)]
        return BatchedRun(method, 2, [[1]] * 2 * len(seconds), results)

    one = speedup_interval(run("autoregressive", [2.0], [10]), run("speculative", [1.0], [10]))
    assert one.estimate == pytest.approx(2.0) and one.n_units == 1
    assert np.isnan(one.lo) and np.isnan(one.hi)
    two = speedup_interval(run("autoregressive", [2.0, 3.0], [10, 10]), run("speculative", [1.0, 2.0], [10, 10]))
    assert two.n_units == 2 and 1.5 - 1e-9 <= two.lo < two.hi <= 2.0 + 1e-9


def test_batched_run_splits_time_at_the_first_iteration(pair64):
    """`decode_tokens_per_second` leaves out each batch's first iteration (the prefill) and the tokens made in it;
    `pad_share` is the padding among the batches' prompt slots."""
    from types import SimpleNamespace

    from specrepro.batching import BatchedRun

    def row(new, accepted, prompt_len):
        return SimpleNamespace(new_tokens=new, accepted=accepted, prompt_len=prompt_len)

    results = [SimpleNamespace(stats=SimpleNamespace(iteration_seconds=[3.0, 1.0, 1.0], new_tokens=9, prompt_len=10),
                               rows=[row(6, [2, 1, 1], 10), row(3, [3], 5)])]  # the second ended in iteration 0
    spec = BatchedRun("speculative", 2, [[1] * 6, [1] * 3], results)
    assert spec.first_seconds == [3.0] and spec.first_share == pytest.approx(0.6)
    assert spec.decode_tokens_per_second == pytest.approx((9 - 3 - 3) / 2.0)
    assert spec.pad_share == pytest.approx(1 - 15 / 20)
    ar = BatchedRun("autoregressive", 2, [[1] * 4, [1] * 4],
                    [SimpleNamespace(stats=SimpleNamespace(iteration_seconds=[2.0, 0.5, 0.5, 0.5], new_tokens=8,
                                                           prompt_len=4), rows=[row(4, [], 4), row(4, [], 4)])])
    assert ar.decode_tokens_per_second == pytest.approx(6 / 1.5) and ar.pad_share == 0

    target, _ = pair64  # on a real batched decode: the padding comes from the prompts' lengths
    prompts = ragged_prompts(4, seed=5)
    _, res = generate.decode_in_batches(target, None, prompts, batch_size=4, max_new_tokens=3, pad_token_id=PAD)
    real = BatchedRun("autoregressive", 4, [], res)
    assert real.pad_share == pytest.approx(1 - sum(map(len, prompts)) / (4 * max(map(len, prompts))))
    assert 0 < real.first_share < 1 and real.decode_tokens_per_second > 0


def test_sweep_runs_each_batch_size_with_its_kernel_and_enough_batches():
    from specrepro import batching
    from specrepro.kernels import SmallRowLinear
    from specrepro.tiny import tiny_pair

    target, draft = tiny_pair(V, seed=0, dtype=torch.float32)
    costs = batching.verify_cost(target, [1, 4], 2, prefix_len=4, repeats=1, kernels=("stock", "small_row"))
    assert all({"decode_step_ms_stock", "verify_ms_small_row", "ar_kernel", "spec_kernel"} <= set(r) for r in costs)
    assert all(r["verify_steps"] == r["verify_ms"] / r["decode_step_ms"] for r in costs)
    chosen = {1: {"autoregressive": "stock", "speculative": "small_row"},
              4: {"autoregressive": "small_row", "speculative": "stock"}}
    seen = []
    real = generate.decode_in_batches

    def spy(model, d, prompts, **kw):  # which kernel the target's layers run when each batch size decodes
        seen.append((kw["batch_size"], d is None, any(isinstance(m, SmallRowLinear) for m in model.modules()),
                     len(prompts)))
        return real(model, d, prompts, **kw)

    prompts = ragged_prompts(12, seed=3)
    batching.decode_in_batches = spy
    try:
        runs = batching.sweep(target, draft, prompts, batch_sizes=[1, 4], gamma=2,
                              max_new_tokens=3, pad_token_id=PAD, kernels=chosen, n_prompts=3, min_batches=2)
    finally:
        batching.decode_in_batches = real
    # batch 1 decodes the 3 shared prompts; batch 4 gets 8, two batches; each method with its kernel
    assert seen == [(1, True, False, 3), (1, False, True, 3), (4, True, True, 8), (4, False, False, 8)]
    assert [(r.batch_size, r.method, r.kernel, len(r.results)) for r in runs] == [
        (1, "autoregressive", "stock", 3), (1, "speculative", "small_row", 3),
        (4, "autoregressive", "small_row", 2), (4, "speculative", "stock", 2)]
    assert not any(isinstance(m, SmallRowLinear) for m in target.modules())  # back to stock
    assert batching.chosen_kernels(costs)[1].keys() == {"autoregressive", "speculative"}
    with pytest.raises(ValueError, match="min_batches"):
        batching.sweep(target, draft, prompts, batch_sizes=[1], gamma=2, max_new_tokens=2, pad_token_id=PAD,
                       min_batches=0)
