"""The pure pieces: warpers against transformers, inverse-CDF draws, and the acceptance rule by enumeration."""

import math

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specrepro import sampling
from specrepro.sampling import (
    SamplingConfig,
    check_logits,
    greedy_accept,
    probs_from_logits,
    sample_from,
    speculative_accept,
    warp_logits,
)


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, None, None), (0.7, None, None), (1.0, 5, None), (1.0, None, 0.9), (0.8, 10, 0.95), (1.3, 3, 0.5),
    (1.0, 1, None), (1.0, None, 0.01),
])
def test_warpers_match_transformers(temperature, top_k, top_p):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g) * 3
    logits[0, :10] = logits[0, 10]  # ties at the top-k boundary are kept by both
    ref = logits.clone()
    if temperature != 1:
        ref = TemperatureLogitsWarper(temperature)(None, ref)
    if top_k is not None:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p is not None:
        ref = TopPLogitsWarper(top_p)(None, ref)
    ours = warp_logits(logits, SamplingConfig(temperature, top_k, top_p))
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    assert torch.allclose(ours.softmax(-1), ref.softmax(-1), atol=1e-7)


@pytest.mark.parametrize("scale,top_p", [(3.0, 0.9), (3.0, 0.95), (6.0, 0.5), (12.0, 0.99), (0.3, 0.9)])
def test_top_p_on_a_large_vocabulary_matches_transformers_and_the_full_sort(monkeypatch, scale, top_p):
    # the candidate path (peaked rows) and the whole-row sort (scale 0.3: flat rows, too much mass outside the
    # candidates) remove the same tokens as transformers' warper and as sorting the whole row
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 3, 49_152, generator=g) * scale
    logits[0, 0, :5] = logits[0, 0].max()  # ties at the top
    ref = TopPLogitsWarper(top_p)(None, logits.reshape(12, -1).clone()).reshape(logits.shape)
    fast = warp_logits(logits, SamplingConfig(1.0, top_p=top_p))
    monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", 10 ** 9)  # forces the whole-row sort
    full = warp_logits(logits, SamplingConfig(1.0, top_p=top_p))
    assert torch.equal(torch.isinf(fast), torch.isinf(ref)) and torch.equal(torch.isinf(fast), torch.isinf(full))
    kept = (~torch.isinf(fast)).sum(-1)
    assert (kept >= 1).all() and (kept < 49_152).all()


def test_top_p_candidate_path_is_taken_only_where_it_holds(monkeypatch):
    calls = []
    real_sort = torch.sort
    monkeypatch.setattr(torch, "sort", lambda x, *a, **k: calls.append(x.shape[-1]) or real_sort(x, *a, **k))
    g = torch.Generator().manual_seed(3)
    peaked, flat = torch.randn(1, 49_152, generator=g) * 6, torch.randn(1, 49_152, generator=g) * 0.3
    warp_logits(peaked, SamplingConfig(1.0, top_p=0.9))
    assert calls == [sampling.TOP_P_CANDIDATES]  # they hold 90% of a peaked row: only they are sorted
    warp_logits(torch.cat([peaked, flat]), SamplingConfig(1.0, top_p=0.9))
    assert calls[1:] == [49_152]  # a flat row in the batch: the whole rows are sorted


def test_warp_applies_to_any_leading_shape():
    logits = torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(1))
    cfg = SamplingConfig(0.9, 7, 0.8)
    assert torch.equal(warp_logits(logits, cfg), warp_logits(logits.reshape(6, 40), cfg).reshape(2, 3, 40))


def test_greedy_probs_are_one_hot_at_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0, 2.0]])
    assert probs_from_logits(logits, SamplingConfig(0)).tolist() == [[0, 1, 0, 0]]


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=math.nan), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_k=0), "top_k"),
    (dict(top_k=2.5), "top_k"),
])
def test_sampling_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_check_logits_names_the_model():
    check_logits(torch.tensor([[0.0, -math.inf]]), "draft")
    for bad in (math.nan, math.inf):
        with pytest.raises(FloatingPointError, match="draft model returned NaN"):
            check_logits(torch.tensor([[0.0, bad]]), "draft")
    with pytest.raises(FloatingPointError):
        check_logits(torch.full((1, 3), -math.inf), "target")


def test_inverse_cdf_on_a_grid_is_exact():
    probs = torch.tensor([0.0, 0.25, 0.0, 0.5, 0.25, 0.0])
    M = 1000
    u = (torch.arange(M, dtype=torch.float64) + 0.5) / M
    tokens = sample_from(probs.expand(M, -1), u)
    assert torch.bincount(tokens, minlength=6).tolist() == [0, 250, 0, 500, 250, 0]


def test_inverse_cdf_never_returns_zero_mass_tokens():
    probs = torch.tensor([[0.3, 0.7, 0.0, 0.0]], dtype=torch.float32)
    for u in (0.0, 1 - 1e-16, math.nextafter(1.0, 0.0)):
        assert sample_from(probs, torch.tensor([u], dtype=torch.float64)).item() in (0, 1)


# ---- the acceptance rule by enumeration -------------------------------------------------------------------


def induced_first_token_distribution(p, q, M=400, accept=speculative_accept):
    """Enumerate the draft token x (weight q(x)) and a midpoint grid of M x M (u_accept, u_residual): the
    distribution of the first emitted token, up to a grid error of about 2/M per token."""
    V = p.shape[-1]
    x = torch.arange(V).repeat_interleave(M * M)  # (V*M*M,)
    grid = (torch.arange(M, dtype=torch.float64) + 0.5) / M
    u_acc = grid.repeat_interleave(M).repeat(V)
    u_res = grid.repeat(M * V)
    B = x.numel()
    P = torch.stack([p, p]).expand(B, 2, V)  # gamma = 1: p_1, and p_2 for the bonus
    Q = q.expand(B, 1, V)
    n, token = accept(P, Q, x[:, None], u_acc[:, None], u_res)
    first = torch.where(n == 1, x, token)
    weights = q[x] / (M * M)
    return torch.zeros(V, dtype=torch.float64).index_add_(0, first, weights)


def random_simplex(V, g, zeros=()):
    w = torch.rand(V, generator=g, dtype=torch.float64) ** 3
    w[list(zeros)] = 0
    return w / w.sum()


CASES = {
    "random": lambda g: (random_simplex(5, g), random_simplex(5, g)),
    "q_equals_p": lambda g: (lambda p: (p, p.clone()))(random_simplex(5, g)),
    "disjoint_supports": lambda g: (random_simplex(5, g, zeros=[0, 1]), random_simplex(5, g, zeros=[2, 3, 4])),
    "q_zero_where_p_positive": lambda g: (random_simplex(5, g), random_simplex(5, g, zeros=[1, 3])),
    "p_zero_where_q_positive": lambda g: (random_simplex(5, g, zeros=[4]), random_simplex(5, g)),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_acceptance_rule_preserves_p(case, seed):
    p, q = CASES[case](torch.Generator().manual_seed(seed))
    got = induced_first_token_distribution(p, q)
    assert torch.allclose(got, p, atol=3 / 400), (got, p)


def test_enumeration_detects_sampling_the_replacement_from_p():
    """The same enumeration must fail for the classic bug: on rejection, draw from p instead of the residual."""
    p, q = CASES["random"](torch.Generator().manual_seed(0))

    def buggy(P, Q, x, u_acc, u_res):
        n, _ = speculative_accept(P, Q, x, u_acc, u_res)
        return n, sample_from(P[:, 0], u_res)

    got = induced_first_token_distribution(p, q, accept=buggy)
    assert (got - p).abs().max() > 0.02


def test_acceptance_rule_greedy_one_hots():
    V = 6

    def onehot(i):
        return torch.nn.functional.one_hot(torch.tensor(i), V).double()

    p = torch.stack([onehot(2), onehot(4), onehot(1), onehot(0)])[None]  # target argmaxes 2, 4, 1, 0
    x = torch.tensor([[2, 4, 5]])
    q = torch.stack([onehot(2), onehot(4), onehot(5)])[None]
    n, token = speculative_accept(p, q, x, torch.zeros(1, 3), torch.zeros(1))
    assert (n.item(), token.item()) == (2, 1)  # third draft rejected, replaced by the target's argmax
    n, token = speculative_accept(p, q, torch.tensor([[2, 4, 1]]), torch.zeros(1, 3), torch.zeros(1))
    assert (n.item(), token.item()) == (3, 0)  # all accepted: bonus token is the target's next argmax


def test_greedy_accept_equals_the_rule_on_one_hots():
    # every draft block over a 3-token vocabulary against random target argmaxes, batched, any uniforms
    g = torch.Generator().manual_seed(0)
    V, gamma = 3, 3
    x = torch.cartesian_prod(*[torch.arange(V)] * gamma)  # (27, gamma): all draft blocks
    B = x.shape[0]
    for _ in range(20):
        target_argmax = torch.randint(V, (B, gamma + 1), generator=g)
        p = torch.nn.functional.one_hot(target_argmax, V).double()
        q = torch.nn.functional.one_hot(x, V).double()
        u, r = torch.rand(B, gamma, generator=g), torch.rand(B, generator=g)
        n_ref, tok_ref = speculative_accept(p, q, x, u, r)
        n, tok = greedy_accept(target_argmax, x)
        assert torch.equal(n, n_ref) and torch.equal(tok, tok_ref)
    n, tok = greedy_accept(torch.tensor([[5, 6]]), torch.tensor([[5]]))
    assert (n.item(), tok.item()) == (1, 6)


def test_acceptance_rule_is_batched_and_pure():
    g = torch.Generator().manual_seed(3)
    B, gamma, V = 7, 4, 11
    p = torch.rand(B, gamma + 1, V, generator=g).softmax(-1)
    q = torch.rand(B, gamma, V, generator=g).softmax(-1)
    x = torch.randint(V, (B, gamma), generator=g)
    u, r = torch.rand(B, gamma, generator=g), torch.rand(B, generator=g)
    n, tok = speculative_accept(p, q, x, u, r)
    for b in range(B):
        nb, tb = speculative_accept(p[b:b + 1], q[b:b + 1], x[b:b + 1], u[b:b + 1], r[b:b + 1])
        assert (nb.item(), tb.item()) == (n[b].item(), tok[b].item())
    assert torch.equal(speculative_accept(p, q, x, u, r)[1], tok)
