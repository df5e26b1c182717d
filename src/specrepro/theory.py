"""Leviathan et al. 2022 (arXiv 2211.17192), Sec. 3: expected speed and work of speculative decoding.

    alpha  acceptance rate: E[beta], beta = sum_x min(p(x), q(x)) (Def. 3.1)
    gamma  draft tokens per iteration
    c      cost coefficient: time of one draft forward / time of one target forward (Def. 3.7)
    c_hat  ratio of arithmetic operations per token, draft / target (Sec. 3.5)

Under the paper's model (i.i.d. acceptances, a verification of gamma+1 tokens costs one target step) these are
closed forms. `walltime_improvement_measured` drops the second assumption: it takes the *measured* times of a
draft step, a target step and a verification forward of gamma+1 tokens, which on a CPU cost well over one step.
"""

from __future__ import annotations


def _check_alpha(alpha: float) -> None:
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")


def _check(alpha: float, gamma: int) -> None:
    _check_alpha(alpha)
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")


def expected_tokens(alpha: float, gamma: int) -> float:
    """Eq. 1: expected tokens per iteration, (1 - alpha^(gamma+1)) / (1 - alpha); gamma + 1 when alpha = 1."""
    _check(alpha, gamma)
    if alpha == 1:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def walltime_improvement(alpha: float, gamma: int, c: float) -> float:
    """Thm 3.8: expected speedup over autoregressive decoding, (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def improvement_lower_bound(alpha: float, c: float) -> float | None:
    """Cor. 3.9: if alpha > c, gamma = 1 already gives a speedup of at least (1 + alpha) / (1 + c); else None."""
    return (1 + alpha) / (1 + c) if alpha > c else None


def operations_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """Thm 3.11: expected factor of total arithmetic operations over autoregressive decoding,
    (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1))."""
    return (gamma * c_hat + gamma + 1) / expected_tokens(alpha, gamma)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
    """The integer gamma in 1..max_gamma maximising Thm 3.8's speedup (Sec. 3.4, Fig. 3)."""
    return max(range(1, max_gamma + 1), key=lambda g: walltime_improvement(alpha, g, c))


def walltime_improvement_measured(alpha: float, gamma: int, *, t_target: float, t_draft: float,
                                  t_verify: float, t_overhead: float = 0.0) -> float:
    """Generalised Thm 3.8 with measured costs: one iteration takes gamma draft steps, one verification forward
    of gamma+1 tokens and a fixed overhead (sampling, bookkeeping), and yields expected_tokens(alpha, gamma)
    tokens; autoregressive decoding takes t_target per token. Reduces to Thm 3.8 when t_verify = t_target,
    t_draft = c t_target and t_overhead = 0. The one-length case of `walltime_improvement_lengths`."""
    _check(alpha, gamma)
    return walltime_improvement_lengths(alpha, [gamma], t_target=t_target, t_draft=t_draft,
                                        t_verify={gamma: t_verify}, t_overhead=t_overhead)


def walltime_improvement_lengths(alpha: float, lengths, *, t_target: float, t_draft: float, t_verify,
                                 t_overhead: float = 0.0) -> float:
    """`walltime_improvement_measured` for drafts that propose a varying number of tokens per iteration (prompt
    lookup proposes as far as its match reaches, 0 without one). `lengths` are the iterations' proposal lengths
    g_i as they happened; `t_verify[g]` (a list or a dict) is the time of a target forward of g+1 tokens. Expected
    tokens sum_i expected_tokens(alpha, g_i) (1 for g_i = 0: a plain decoding step) over expected time
    sum_i (g_i t_draft + t_verify[g_i] + t_overhead), against t_target per token."""
    lengths = list(lengths)
    if not lengths or any(not isinstance(g, int) or isinstance(g, bool) or g < 0 for g in lengths):
        raise ValueError("lengths must be a non-empty list of integers >= 0")
    _check_alpha(alpha)
    verify = [t_verify[g] for g in lengths]
    if min([t_target, t_draft, t_overhead] + verify) < 0 or t_target <= 0:
        raise ValueError("times must be >= 0 and t_target > 0")
    tokens = sum(1.0 if g == 0 else expected_tokens(alpha, g) for g in lengths)
    seconds = sum(g * t_draft + v + t_overhead for g, v in zip(lengths, verify))
    return tokens * t_target / seconds


def forward_ms(tokens: int, *, overhead_ms: float, bytes_read: float, bandwidth: float, flops_per_token: float,
               peak_flops: float):
    """A roofline with a fixed cost: the time of one forward of `tokens` tokens predicted from the machine's
    balance, overhead_ms + max(bytes_read / bandwidth, tokens x flops_per_token / peak_flops), in ms. With the
    overhead at 0 it is the pure roofline: a forward costs one step's time until tokens x flops_per_token /
    peak_flops passes the memory time (the ridge, at bytes_read x peak_flops / (bandwidth x flops_per_token)
    tokens), then grows linearly."""
    return overhead_ms + 1e3 * max(bytes_read / bandwidth, tokens * flops_per_token / peak_flops)
