"""The equivalence checker: ours matches batch-1 greedy decoding exactly, both published bugs are flagged."""

import pytest
import torch

from specrepro import equivalence as E
from specrepro.generate import decode_in_batches
from specrepro.sampling import SamplingConfig
from specrepro.tiny import tiny_pair

PAD = 0


@pytest.fixture(scope="module")
def pair_and_prompts():
    target, draft = tiny_pair(16, seed=4, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 16, (int(n),), generator=g).tolist()
               for n in torch.randint(1, 12, (16,), generator=g)]
    refs, _ = decode_in_batches(target, None, prompts, batch_size=1, max_new_tokens=16, pad_token_id=PAD)
    return target, draft, prompts, refs


def test_first_divergence_and_prefix_match():
    assert E.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert E.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert E.first_divergence([1, 2, 3], [1, 2]) == 2
    target, _ = tiny_pair(8, seed=0)
    rows = E.compare(target, [[1], [2]], [[3, 4, 5, 6], [1, 1]], [[3, 4, 0, 6], [1, 1]])
    assert [r.kind != "match" for r in rows] == [True, False]
    assert rows[0].prefix_match == 0.5 and rows[0].position == 2 and rows[0].reference_token == 5
    assert E.summary(rows)["exact_match"] == 0.5 and E.summary(rows)["prefix_match"] == 0.75


def test_a_divergence_at_a_clear_margin_is_a_bug_and_at_a_tie_a_near_tie():
    target, _ = tiny_pair(8, seed=0)
    gap = E.logit_gap(target, [1, 2], [])
    assert gap > 0
    bug = E.compare(target, [[1, 2]], [[0]], [[1]], tie_tolerance=gap / 2)[0]
    tie = E.compare(target, [[1, 2]], [[0]], [[1]], tie_tolerance=gap * 2)[0]
    assert bug.kind == "bug" and tie.kind == "near-tie" and bug.gap == pytest.approx(gap)


@pytest.mark.parametrize("batch_size", [2, 4, 8, 16])
def test_ours_is_exact_at_every_batch_size(pair_and_prompts, batch_size):
    target, draft, prompts, refs = pair_and_prompts
    for d in (None, draft):
        out, _ = decode_in_batches(target, d, prompts, batch_size=batch_size, max_new_tokens=16, pad_token_id=PAD)
        s = E.summary(E.compare(target, prompts, refs, out))
        assert s["exact_match"] == 1.0 and s["bugs"] == 0


@pytest.mark.parametrize("control", [E.PadsAttended, E.CroppedToShortestRow])
def test_both_controls_are_flagged(pair_and_prompts, control):
    target, draft, prompts, refs = pair_and_prompts
    out, _ = decode_in_batches(target, draft, prompts, batch_size=8, max_new_tokens=16, pad_token_id=PAD,
                                 cached_model=control)
    s = E.summary(E.compare(target, prompts, refs, out))
    mismatched = round(s["prompts"] * (1 - s["exact_match"]))
    assert s["exact_match"] <= 0.75 and s["bugs"] == mismatched >= 4, s  # every divergence at a clear margin


def test_crossover_is_where_speculation_stops_paying_for_good():
    from types import SimpleNamespace

    from specrepro.batching import crossover

    def runs(ar, spec):
        return [SimpleNamespace(method=m, batch_size=b, tokens_per_second=t)
                for m, ts in (("autoregressive", ar), ("speculative", spec)) for b, t in zip((1, 2, 4, 8), ts)]

    assert crossover(runs([10, 20, 30, 40], [9, 25, 35, 38])) == 8  # slower at 1, faster at 2-4, slower from 8
    assert crossover(runs([10, 20, 30, 40], [9, 18, 29, 39])) == 1
    assert crossover(runs([10, 20, 30, 40], [12, 25, 35, 41])) is None


def test_sampled_batches_draw_per_prompt_so_the_batch_size_does_not_change_a_row(pair_and_prompts):
    target, draft, prompts, _ = pair_and_prompts
    cfg = SamplingConfig(1.0, top_p=0.9)
    for d in (None, draft):
        alone, _ = decode_in_batches(target, d, prompts, batch_size=1, max_new_tokens=12, pad_token_id=PAD,
                                     cfg=cfg, seed=7)
        batched, _ = decode_in_batches(target, d, prompts, batch_size=5, max_new_tokens=12, pad_token_id=PAD,
                                       cfg=cfg, seed=7)
        other_seed, _ = decode_in_batches(target, d, prompts, batch_size=5, max_new_tokens=12, pad_token_id=PAD,
                                          cfg=cfg, seed=8)
        assert alone == batched  # float64: the batch's numerics cannot move a draw across a CDF boundary
        assert other_seed != batched
    with pytest.raises(ValueError, match="sampling needs a seed"):
        decode_in_batches(target, None, prompts, batch_size=2, max_new_tokens=4, pad_token_id=PAD, cfg=cfg)
