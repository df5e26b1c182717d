"""End-to-end claim 1 on tiny random transformers: the joint distribution of the first generated tokens of
`speculative_generate` equals the exact (enumerated) target distribution, and the same test catches known bugs.

Each test is a chi-squared goodness-of-fit test at a false-alarm rate of FALSE_ALARM = 1e-3: a correct sampler
fails one with probability 1e-3 over seeds. Seeds are fixed, so the outcome is reproducible.
"""

import copy

import numpy as np
import pytest
import torch

from specrepro import autoregressive_generate, generate, speculative_generate
from specrepro.distribution import chisquare_gof, counts_of, exact_joint_distribution
from specrepro.sampling import SamplingConfig, sample_from, speculative_accept

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


def _greedy_proposal(draft_probs, u):
    return draft_probs.argmax(-1)  # proposes argmax(q) but the ratio still uses the stochastic q


def _replacement_from_target(p, q, x, u_accept, u_residual):
    n, _ = speculative_accept(p, q, x, u_accept, u_residual)
    return n, sample_from(p[torch.arange(p.shape[0]), n], u_residual)  # p_n instead of norm(max(0, p_n - q_n))


def _reseeding_uniform(generator, n):
    generator.manual_seed(generator.initial_seed())  # the "seed on every draw" bug
    return DRAW_UNIFORMS(generator, n)


DRAW_UNIFORMS, PROPOSE, ACCEPT = generate.draw_uniforms, generate.propose, generate.accept
# each bug is planted in one step function of the loop, through the step's own parameters
BAD = {
    "greedy-draft-with-stochastic-ratio": (T1, T1, "propose",
                                           lambda *a, **k: PROPOSE(*a, **k, sample=_greedy_proposal)),
    "replacement-from-p-not-residual": (T1, T1, "accept",
                                        lambda *a, **k: ACCEPT(*a, **k, rule=_replacement_from_target)),
    "reseed-generator-every-draw": (T1, T1, "draw_uniforms", _reseeding_uniform),
    "top-p-on-draft-only": (TP, SamplingConfig(TP.temperature), "propose",
                            lambda drf, seqs, lengths, cfg, gens: PROPOSE(drf, seqs, lengths, TP, gens)),
}


@pytest.mark.parametrize("name", BAD)
def test_negative_controls_are_detected(pair64, name, monkeypatch):
    target, draft = pair64
    expected_cfg, run_cfg, step, buggy = BAD[name]
    monkeypatch.setattr(generate, step, buggy)

    def once(g):
        return new_tokens(speculative_generate(target, draft, PROMPT, gamma=2, max_new_tokens=2, generator=g,
                                               temperature=run_cfg.temperature, top_p=run_cfg.top_p))

    result = gof(target, draw(once, 600, 11), expected_cfg)
    assert result.rejects(FALSE_ALARM), result


def test_chisquare_gof_flags_impossible_outcomes_and_pools_small_cells():
    probs = np.array([0.5, 0.3, 0.199, 0.001, 0.0])
    r = chisquare_gof(np.array([50, 30, 20, 0, 0]), probs)
    assert r.impossible == 0 and r.dof == 2 and r.p_value > 0.9  # the 0.001 cell is merged into a neighbour
    r = chisquare_gof(np.array([50, 30, 19, 0, 1]), probs)
    assert r.impossible == 1 and r.p_value == 0.0
