"""Exact target distributions by enumeration, and the goodness-of-fit test that compares samples with them.

Claim 1 (Leviathan et al. 2022, Thm 3.5 / Appendix A.1; Chen et al. 2023, Thm 1): speculative sampling draws
from the target's distribution exactly. On a vocabulary of V tokens the joint distribution of the first n
generated tokens has V**n cells, small enough to enumerate from the target's logits and to test a sampler
against with Pearson's chi-squared test.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from scipy import stats as sps

from .generate import GenerationStats, Steps, accept, decode, draw_uniforms, left_pad, propose
from .intervals import proportion
from .kvcache import CachedModel, make_cache, model_forward
from .sampling import SamplingConfig, probs_from_logits, sample_from, speculative_accept


@torch.no_grad()
def exact_joint_distribution(model, input_ids: torch.Tensor, n_tokens: int, cfg: SamplingConfig) -> torch.Tensor:
    """P(x_1..x_n | prompt) under the warped target distribution, as a float64 tensor of shape (V,)*n.

    Every prefix is scored by a full forward without a KV cache (the reference computation graph).
    """
    if input_ids.shape[0] != 1:
        raise ValueError("exact_joint_distribution takes one prompt, shape (1, L)")
    V = model.get_output_embeddings().weight.shape[0]
    device = next(model.parameters()).device
    joint = torch.ones((), dtype=torch.float64)
    prefixes = input_ids.to(device)  # (V**k, L + k) after step k
    for k in range(n_tokens):
        probs = probs_from_logits(model(input_ids=prefixes).logits[:, -1], cfg).double().cpu()  # (V**k, V)
        joint = (joint.reshape(-1, 1) * probs).reshape((V,) * (k + 1))
        if k + 1 < n_tokens:
            nxt = torch.arange(V, device=device).repeat(prefixes.shape[0])[:, None]
            prefixes = torch.cat([prefixes.repeat_interleave(V, dim=0), nxt], dim=1)
    return joint


def exact_joint_sparse(model, input_ids: torch.Tensor, n_tokens: int, cfg: SamplingConfig, *,
                       max_cells: int = 200_000, chunk: int = 64) -> dict[tuple[int, ...], float]:
    """P(x_1..x_n | prompt) under the warped target distribution for a real vocabulary: only the continuations of
    nonzero probability, which top-k or top-p keep few ({continuation: probability}, summing to 1).

    The prompt but its last token is computed once, into a KV cache; each level then scores the surviving prefixes,
    `chunk` rows at a time, by one forward of the prompt's last token and the prefix over a copy of that cache (no
    other cache: a prefix's tokens are always computed together, as a block)."""
    if input_ids.shape[0] != 1:
        raise ValueError("exact_joint_sparse takes one prompt, shape (1, L)")
    if cfg.temperature <= 0:
        raise ValueError("greedy decoding has one continuation; the joint distribution is for sampling")
    device = next(model.parameters()).device
    prompt = input_ids[0].tolist()
    head = make_cache(model)
    if len(prompt) > 1:
        with torch.no_grad():
            model_forward(model, torch.tensor([prompt[:-1]], device=device), head)
    support: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n_tokens):
        keys, new = list(support), {}
        for start in range(0, len(keys), chunk):
            part = keys[start:start + chunk]
            cache = copy.deepcopy(head)
            if len(prompt) > 1:
                cache.batch_repeat_interleave(len(part))
            ids = torch.tensor([prompt[-1:] + list(k) for k in part], device=device)
            with torch.no_grad():
                logits = model_forward(model, ids, cache, logits_to_keep=1).logits[:, -1]
            probs = probs_from_logits(logits, cfg).double().cpu()
            for key, row in zip(part, probs):
                for t in torch.nonzero(row).flatten().tolist():
                    new[key + (t,)] = support[key] * float(row[t])
        if len(new) > max_cells:
            raise ValueError(f"{len(new):,} continuations of nonzero probability after {len(next(iter(new)))} tokens "
                             f"(more than max_cells = {max_cells:,}): use top-k, a smaller top-p or fewer tokens")
        support = new
    return support


def gof_sparse(samples: np.ndarray, exact: dict[tuple[int, ...], float], min_expected: float = 5.0) -> GofResult:
    """`chisquare_gof` of sampled continuations ((N, n) token ids) against `exact_joint_sparse`; a sample outside
    the exact support is impossible and rejects outright."""
    cells = {k: i for i, k in enumerate(exact)}
    counts = np.zeros(len(cells) + 1)  # the last cell: everything outside the support (probability 0)
    for row in np.asarray(samples, dtype=np.int64):
        counts[cells.get(tuple(row.tolist()), len(cells))] += 1
    probs = np.append(np.fromiter(exact.values(), dtype=np.float64), 0.0)
    return chisquare_gof(counts, probs / probs.sum(), min_expected)


class DistinctRows:
    """Cache bookkeeping for a sampling study (`sample_ragged`): each forward computes every *distinct* row once.

    A row's logits and states are a function of what it holds, so rows that hold the same need one computation
    between them. What a row holds is its tokens, each marked with how it went in: a draft that reads the target's
    states (`specrepro.protocol`) keeps a different state for a token fed with them than for one fed with its own
    output (its drafted tokens), so the two are different rows here. In a sampling study rows that hold the same are
    most rows: thousands of rows share a handful of prompts, a prompt-lookup draft proposes the same tokens to all
    of them, and the first few sampled tokens branch into a few hundred continuations at most. An inner
    `CachedModel` holds one row per distinct sequence; this class maps the loop's rows onto it, and presents the
    interface the loop (`generate.decode`) uses: `feed`, `keep`, `select`, `check`, `fed`, `hidden_layers`,
    `features`. Every forward runs on the inner rows as generation runs them (left-padded, ragged, with holes), so
    the batch bookkeeping is the one tested, on fewer rows. The loop's own steps (propose, accept, rollback) run for
    every row with its own random numbers, unchanged.

    Used for the target and the draft alike. What it does not preserve is the composition of a batch, which can move
    logits in their last bits (04 measures that): a study of batch numerics uses `CachedModel`."""

    def __init__(self, model, who: str, log: list[tuple[int, int]], rows: int = 1):
        self.model, self.who, self.log = model, who, log
        self.held: list[tuple] = [()] * rows  # per row of the loop: (token, fed with the target's states) pairs
        self.row: list[int] = [0] * rows  # each row's inner row
        self.inner: CachedModel | None = None  # one row per distinct sequence in `held`, none before the first feed
        self.hidden_layers: tuple[int, ...] = ()
        self.features: torch.Tensor | None = None

    @property
    def fed(self) -> list[int]:
        return [len(h) for h in self.held]

    @property
    def distinct_rows(self) -> int:
        """Rows of the inner cache now: one per distinct row held."""
        return len(self.inner.fed) if self.inner is not None else 0

    def _copy_rows(self, source: list[int]) -> None:
        """Inner row u becomes a copy of inner row source[u] (nothing moves when that is every row in place)."""
        if source != list(range(len(self.inner.fed))):
            self.inner.select(source)

    def _regroup(self, held: list[tuple], rows: list[int]) -> None:
        """Make the loop's rows hold `held` (each a prefix of what row rows[b] holds, row b of `held`): the inner
        rows become its distinct sequences in order of first appearance, each copied from an inner row that holds
        it or more, then cut to it."""
        if self.inner is None:  # nothing fed yet (a draft waiting for the target's states): nothing to copy
            self.held, self.row = held, [0] * len(held)
            return
        first: dict[tuple, int] = {}
        for b, h in zip(rows, held):
            first.setdefault(h, b)
        self._copy_rows([self.row[b] for b in first.values()])
        self.inner.keep([len(h) for h in first])
        where = {h: u for u, h in enumerate(first)}
        self.held, self.row = held, [where[h] for h in held]

    @torch.no_grad()
    def feed(self, new, n_logits, pad_mask=None, features=None):
        if pad_mask is not None:
            raise ValueError("DistinctRows feeds rows of real tokens (the loop's blocks); a pad_mask is not taken")
        how = features is not None
        grown = [h + tuple((t, how) for t in block) for h, block in zip(self.held, new)]
        longest: dict[tuple, int] = {}  # per distinct sequence, the row that feeds the most of it
        for b, g in enumerate(grown):
            if g not in longest or len(new[b]) > len(new[longest[g]]):
                longest[g] = b
        feeders = list(longest.values())  # in order of first appearance: the inner rows' order
        if self.inner is None:
            self.inner = CachedModel(self.model, self.who, self.log, rows=len(feeders))
            self.inner.hidden_layers = self.hidden_layers
        else:  # each feeder's inner row holds its sequence before this block: copy those rows, then feed
            self._copy_rows([self.row[b] for b in feeders])
        logits = self.inner.feed([list(new[b]) for b in feeders], n_logits,
                                 features=[features[b] for b in feeders] if features is not None else None)
        where = {grown[b]: u for u, b in enumerate(feeders)}
        self.held, self.row = grown, [where[g] for g in grown]
        index = torch.tensor(self.row, device=logits.device)
        if self.hidden_layers:  # a row's block is the end of its feeder's: the same positions, the same states
            self.features = self.inner.features[index]
        return logits[index]

    def keep(self, lengths: list[int]) -> None:
        """Roll row b back to its first lengths[b] tokens."""
        held = [h[:k] for h, k in zip(self.held, lengths)]
        if held != self.held:
            self._regroup(held, list(range(len(held))))

    def select(self, rows: list[int]) -> None:
        """Keep only the given rows (in this order): the others have finished."""
        self._regroup([self.held[r] for r in rows], rows)

    def check(self, lengths: list[int]) -> None:
        """The loop's invariants (`CachedModel.check`) on the rows, and the inner rows': one per distinct row held,
        each as long as what it stands for."""
        if self.fed != list(lengths):
            raise AssertionError(f"{self.who} rows hold {self.fed} tokens, expected {list(lengths)}")
        distinct = list(dict.fromkeys(self.held))
        if self.inner is None and not any(self.held):  # nothing fed yet (a draft waiting for the target's states)
            return
        if self.inner is None or len(self.inner.fed) != len(distinct):
            raise AssertionError(f"{self.who}: {len(distinct)} distinct rows, inner cache of "
                                 f"{self.distinct_rows}")
        if any(distinct[self.row[b]] != h for b, h in enumerate(self.held)):
            raise AssertionError(f"{self.who}: a row maps to an inner row holding other tokens")
        self.inner.check([len(h) for h in distinct])


def sample_ragged(target, draft, prompts: list[list[int]], *, method: str, n_tokens: int, n_samples: int,
                  cfg: SamplingConfig, generator: torch.Generator, gamma: int = 1, batch_rows: int = 8,
                  pad_token_id: int = 0, shared_prompt: bool = False, distinct_rows: bool = True,
                  steps: Steps | None = None
                  ) -> tuple[list[np.ndarray], list[list[GenerationStats]]]:
    """`n_samples` continuations of each prompt, drawn by the batched loop (`generate.decode`): per prompt an
    (n_samples, n_tokens) array of token ids, and the `GenerationStats` of the rows that drew them (what they
    proposed and accepted: `generate.pooled_alpha`).

    By default each batch of `batch_rows` rows cycles through the prompts, so rows of different lengths decode
    together (left-padded); `shared_prompt` fills each batch with one prompt instead. Either way each forward of
    the target and the draft computes each distinct row of the batch once (`DistinctRows`; `distinct_rows=False`
    computes every row, as generation does). `steps` swaps the loop's step functions (a planted bug of
    `planted_bug`)."""
    if method not in ("autoregressive", "speculative") or not prompts or batch_rows < 1:
        raise ValueError("need method 'autoregressive' or 'speculative', at least one prompt and batch_rows >= 1")
    d = draft if method == "speculative" else None
    out: list[list[np.ndarray]] = [[] for _ in prompts]
    stats: list[list[GenerationStats]] = [[] for _ in prompts]
    i = 0
    while min(sum(len(a) for a in got) for got in out) < n_samples:
        if shared_prompt:
            which = [min(range(len(prompts)), key=lambda w: sum(len(a) for a in out[w]))] * batch_rows
        else:
            which = [(i + r) % len(prompts) for r in range(batch_rows)]
            i += batch_rows
        ids, mask = left_pad([prompts[w] for w in which], pad_token_id)
        r = decode(target, d, ids, mask, gamma=gamma if d is not None else 0, max_new_tokens=n_tokens, cfg=cfg,
                   generator=generator, pad_token_id=pad_token_id, steps=steps,
                   cached_model=DistinctRows if distinct_rows else CachedModel)
        new = r.sequences[:, ids.shape[1]:].numpy()
        for row, w in enumerate(which):
            out[w].append(new[row:row + 1])
            stats[w].append(r.rows[row])
    return [np.concatenate(got)[:n_samples] for got in out], [s[:n_samples] for s in stats]


def gof_ragged(target, draft, prompts: list[list[int]], exact: list[dict[tuple[int, ...], float]], *, seed: int,
               **draw) -> tuple[list[GofResult], list[list[GenerationStats]]]:
    """One draw of speculative samples of every prompt (`sample_ragged` with `draw`'s arguments, random numbers
    from `seed`), each prompt's tested against its exact probabilities (`exact_joint_sparse`'s dict, `gof_sparse`):
    the tests and each prompt's `GenerationStats`. One draw of 01's real-pair tests (drawn again with fresh seeds
    where `rule_redraws` says), and of `python -m specrepro.distribution`."""
    if len(exact) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(exact)} exact distributions: give one per prompt")
    samples, stats = sample_ragged(target, draft, prompts, method="speculative",
                                   generator=torch.Generator().manual_seed(seed), **draw)
    return [gof_sparse(x, e) for x, e in zip(samples, exact)], stats


def counts_of(samples: np.ndarray | list, vocab_size: int) -> np.ndarray:
    """Histogram of sampled n-token tuples, shape (V,)*n, from an (N, n) array of token ids."""
    samples = np.asarray(samples, dtype=np.int64)
    flat = np.ravel_multi_index(samples.T, (vocab_size,) * samples.shape[1])
    return np.bincount(flat, minlength=vocab_size ** samples.shape[1]).reshape((vocab_size,) * samples.shape[1])


@dataclass(frozen=True)
class GofResult:
    """Pearson chi-squared goodness of fit of observed counts to exact probabilities."""

    statistic: float
    dof: int
    p_value: float
    n_samples: int
    impossible: int  # samples that fell on cells of probability 0 (any one of them rejects outright)
    total_variation: float  # 0.5 * sum |empirical - exact|

    def rejects(self, false_alarm_rate: float) -> bool:
        return self.p_value < false_alarm_rate


def chisquare_gof(counts: np.ndarray, probs: np.ndarray | torch.Tensor, min_expected: float = 5.0) -> GofResult:
    """Chi-squared test of `counts` against `probs`, pooling cells whose expected count is below `min_expected`
    into one cell so the chi-squared approximation holds. A sample in a zero-probability cell gives p = 0;
    zero-probability cells take no part otherwise."""
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    if not math.isclose(probs.sum(), 1.0, abs_tol=1e-9):
        raise ValueError(f"probs must sum to 1, got {probs.sum()}")
    n = counts.sum()
    tv = 0.5 * np.abs(counts / n - probs).sum()
    impossible = int(counts[probs == 0].sum())
    if impossible:
        return GofResult(math.inf, 0, 0.0, int(n), impossible, float(tv))
    possible = probs > 0
    counts, expected = counts[possible], probs[possible] * n
    big = expected >= min_expected
    obs, exp = list(counts[big]), list(expected[big])
    if (~big).any():
        if expected[~big].sum() >= min_expected or not obs:
            obs.append(counts[~big].sum())
            exp.append(expected[~big].sum())
        else:  # the pooled cell is itself too small: merge it into the smallest cell
            i = int(np.argmin(exp))
            obs[i] += counts[~big].sum()
            exp[i] += expected[~big].sum()
    if len(obs) < 2:
        raise ValueError("too few samples for a chi-squared test: every cell's expected count is below "
                         f"{min_expected}; draw more samples")
    stat, p = sps.chisquare(obs, exp)
    return GofResult(float(stat), len(obs) - 1, float(p), int(n), 0, float(tv))


def confirm_rejection(p_value: float, redraws: list[float] | tuple[float, ...], false_alarm: float, *,
                      outside_support: int = 0) -> str:
    """The outcome of one test under a confirmation rule stated before the data: "pass" where the test does not
    reject at `false_alarm`; where it rejects, the same cell is drawn again with fresh random numbers and `redraws`
    holds those tests' p-values: "rejected" if every one rejects too, "not confirmed" if any passes (for a correct
    sampler: a false alarm). A sample outside the exact support (`outside_support` > 0, counted over the test and
    its redraws) is "rejected" whatever the p-values: a continuation of probability 0 is never a chance event.

    A correct sampler ends "rejected" with probability false_alarm ** (1 + len(redraws)); a sampler that one test
    detects with power `pi` ends "rejected" with probability pi ** (1 + len(redraws)) (the draws are independent),
    so the rule's power is the single test's raised to that power (`rule_power`; `detectable_tv` and
    `power_against_tv` give the rule's with `confirm_draws`). `rule_redraws` says which draws the rule makes,
    `confirmed` applies it to their results."""
    if not 0 <= p_value <= 1 or not all(0 <= r <= 1 for r in redraws):
        raise ValueError(f"p-values lie in [0, 1]: got {p_value} and redraws {list(redraws)}")
    if outside_support:
        return "rejected"
    if p_value >= false_alarm:
        return "pass"
    if not redraws:
        raise ValueError(f"the test rejected (p = {p_value:.3g} < {false_alarm}): draw the cell again with fresh "
                         "seeds and pass those p-values as redraws, as the rule requires")
    return "rejected" if all(r < false_alarm for r in redraws) else "not confirmed"


@dataclass(frozen=True)
class Confirmed:
    """One test under the confirmation rule (`confirm_rejection`): its first draw's result and its redraws'."""

    draws: tuple[GofResult, ...]  # the first draw, then the redraws the rule made (none where nothing rejected)
    false_alarm: float

    @property
    def first(self) -> GofResult:
        return self.draws[0]

    @property
    def redraw_p_values(self) -> list[float]:
        return [g.p_value for g in self.draws[1:]]

    @property
    def outside_support(self) -> int:
        """Samples outside the exact support, over the first draw and every redraw."""
        return sum(g.impossible for g in self.draws)

    @property
    def outcome(self) -> str:
        return confirm_rejection(self.first.p_value, self.redraw_p_values, self.false_alarm,
                                 outside_support=self.outside_support)


def rule_redraws(first: list[GofResult], *, false_alarm: float, confirm_draws: int) -> range:
    """The draws the confirmation rule makes after the first draw of a set of tests (`first`, one result per test):
    draws 1 to `confirm_draws`, each with fresh random numbers, where any test rejects at `false_alarm`; none where
    none rejects. The whole set is drawn again: the rows of one ragged batch are drawn together, so a test is
    redrawn with the tests it shares batches with (`confirmed` keeps a passing test's outcome)."""
    if confirm_draws < 1:
        raise ValueError(f"confirm_draws={confirm_draws}: the confirmation rule needs at least one redraw of a "
                         "rejecting test; set confirm_draws >= 1")
    return range(1, 1 + confirm_draws) if any(g.rejects(false_alarm) for g in first) else range(0)


def confirmed(draws: list[list[GofResult]], false_alarm: float) -> list[Confirmed]:
    """Each test's `Confirmed` from the draws of a set of tests: `draws[d][i]` is test i's result in draw d (the
    first draw, then `rule_redraws`'), every draw testing the same set in the same order."""
    if not draws or len({len(gs) for gs in draws}) != 1:
        raise ValueError(f"{[len(gs) for gs in draws]} results in draws 0, 1, ...: every draw must test the same "
                         "set, in the same order")
    return [Confirmed(tuple(gs), false_alarm) for gs in zip(*draws)]


def rule_power(power: float, confirm_draws: int) -> float:
    """The confirmation rule's power, from one test's: the first test and its `confirm_draws` redraws, independent,
    must all reject."""
    return power ** (1 + confirm_draws)


def all_sequences(vocab_size: int, n_tokens: int) -> list[tuple[int, ...]]:
    """Every n-token tuple, in the row-major order of `exact_joint_distribution(...).ravel()`."""
    return list(itertools.product(range(vocab_size), repeat=n_tokens))


def sample_sequences(target, draft, input_ids: torch.Tensor, *, method: str, n_tokens: int, n_samples: int,
                     cfg: SamplingConfig, generator: torch.Generator, gamma: int = 1, batch_size: int = 1,
                     bug: str | None = None) -> tuple[np.ndarray, list]:
    """Draw `n_samples` continuations of `n_tokens` tokens with one generator.

    method: "autoregressive" (draft unused) or "speculative". `batch_size` > 1 decodes that many copies of the
    prompt as one batch: the rows are independent draws (tests/test_batch.py), so this only runs faster.
    `bug` names one of `PLANTED_BUGS` to sample with a known-bad sampler instead. Returns the (n_samples, n_tokens)
    array of new tokens and each sample's `GenerationStats`.
    """
    if method not in ("autoregressive", "speculative"):
        raise ValueError(f"method must be 'autoregressive' or 'speculative', got {method!r}")
    steps, loop_cfg = planted_bug(bug, cfg) if bug is not None else (None, cfg)
    d = draft if method == "speculative" else None
    L, samples, stats = input_ids.shape[1], [], []
    while len(stats) < n_samples:
        b = min(batch_size, n_samples - len(stats))
        r = decode(target, d, input_ids.repeat(b, 1), gamma=gamma if d is not None else 0, max_new_tokens=n_tokens,
                   cfg=loop_cfg, generator=generator, steps=steps)
        samples.append(r.sequences[:, L:].numpy())
        stats += r.rows
    return np.concatenate(samples), stats


# ---- planted bugs: known-bad samplers the goodness-of-fit test must reject -------------------------------------

PLANTED_BUGS = {
    "greedy-draft-with-stochastic-ratio": "the draft proposes argmax(q) while the ratio still uses the stochastic q",
    "replacement-from-p-not-residual": "a rejected draft is replaced by a draw from p_n, not norm(max(0, p_n - q_n))",
    "reseed-generator-every-draw": "the generator is re-seeded before every draw (one popular reference does)",
    "top-p-dropped-on-target": "top-p warps the draft's q but not the target's p",
}


def _greedy_proposal(draft_probs, u):
    return draft_probs.argmax(-1)


def _replacement_from_target(p, q, x, u_accept, u_residual):
    n, _ = speculative_accept(p, q, x, u_accept, u_residual)
    return n, sample_from(p[torch.arange(p.shape[0]), n], u_residual)


def _reseeding_draw(generator, n):
    generator.manual_seed(generator.initial_seed())
    return draw_uniforms(generator, n)


@dataclass(frozen=True)
class _DraftConfig:
    """`propose` with the draft's own sampling config in place of the loop's."""

    cfg: SamplingConfig

    def __call__(self, drf, seqs, lengths, cfg, gens, **kw):
        return propose(drf, seqs, lengths, self.cfg, gens, **kw)


def planted_bug(name: str, cfg: SamplingConfig) -> tuple[Steps, SamplingConfig]:
    """The step functions and loop config of a known-bad sampler, for a run asked to sample with `cfg`."""
    if name == "greedy-draft-with-stochastic-ratio":
        return Steps(propose=partial(propose, sample=_greedy_proposal)), cfg
    if name == "replacement-from-p-not-residual":
        return Steps(accept=partial(accept, rule=_replacement_from_target)), cfg
    if name == "reseed-generator-every-draw":
        return Steps(propose=partial(propose, draw=_reseeding_draw), accept=partial(accept, draw=_reseeding_draw)), cfg
    if name == "top-p-dropped-on-target":
        return Steps(propose=_DraftConfig(cfg)), SamplingConfig(cfg.temperature, cfg.top_k)
    raise ValueError(f"no planted bug {name!r}; they are {sorted(PLANTED_BUGS)}")


def rejection_rate(sampler_probs: np.ndarray, exact: np.ndarray, *, n_samples: int, false_alarm: float,
                   reps: int = 1000, seed: int = 0) -> float:
    """Power of `chisquare_gof` with `n_samples` samples, by simulation: the share of `reps` multinomial samples
    from `sampler_probs` (a sampler's output distribution over the cells) that the test against `exact` rejects at
    `false_alarm`. With sampler_probs = exact it is the test's false-alarm rate.

    `sampler_probs` must be exact (enumerated) for the answer to be the power. An estimate from M draws carries its
    own noise, which adds about n_samples / M times the test's own to the statistic: with many cells even a correct
    sampler's estimate is then rejected often. For a sampler known only by its draws, replicate the test on fresh
    draws instead."""
    rng = np.random.default_rng(seed)
    probs = np.asarray(sampler_probs, dtype=np.float64).ravel()
    counts = rng.multinomial(n_samples, probs / probs.sum(), size=reps)
    return float(np.mean([chisquare_gof(c, exact).rejects(false_alarm) for c in counts]))


def _probabilities(exact: np.ndarray | dict) -> np.ndarray:
    """Cell probabilities as one normalised array: an array as given, or `exact_joint_sparse`'s dict's values."""
    probs = np.fromiter(exact.values(), dtype=np.float64) if isinstance(exact, dict) else np.ravel(exact)
    return probs / probs.sum()


def shifted_toward_top(exact: np.ndarray | dict, tv: float) -> tuple[np.ndarray, np.ndarray]:
    """The alternative `detectable_tv` and `power_against_tv` test against: `tv` of probability moved onto the most
    likely continuation from the others in proportion, the way a sampler that leans toward the draft's or the
    target's argmax errs. Returns (exact, shifted), both normalised arrays over the same cells."""
    probs = _probabilities(exact)
    top = int(probs.argmax())
    if tv > 1 - probs[top]:
        raise ValueError(f"cannot move {tv} onto the top continuation: the others hold {1 - probs[top]:.3g}")
    out = probs.copy()
    if tv > 0:
        out *= 1 - tv / (1 - probs[top])
        out[top] = probs[top] + tv
    return probs, out


def power_against_tv(exact: np.ndarray | dict, tv: float, n_samples: int, *, false_alarm: float, reps: int = 200,
                     seed: int = 0, confirm_draws: int = 0) -> float:
    """Power of `chisquare_gof` at `n_samples` samples against a sampler `tv` away from `exact`
    (`shifted_toward_top`), by simulation (`rejection_rate`); with `confirm_draws` > 0, the confirmation rule's
    power (`rule_power`). NaN where the other continuations hold less than `tv` of the mass (no such sampler
    exists)."""
    probs = _probabilities(exact)
    if tv > 1 - probs.max():
        return float("nan")
    _, shifted = shifted_toward_top(probs, tv)
    return rule_power(rejection_rate(shifted, probs, n_samples=n_samples, false_alarm=false_alarm, reps=reps,
                                     seed=seed), confirm_draws)


def detectable_tv(exact: np.ndarray | dict, n_samples: int, *, false_alarm: float, target_power: float = 0.8,
                  reps: int = 200, seed: int = 0, confirm_draws: int = 0) -> float:
    """The smallest total-variation error `chisquare_gof` detects with `target_power` at `n_samples` samples, by
    simulation (`power_against_tv`, bisection to about 0.002) against `shifted_toward_top`'s alternative; with
    `confirm_draws` > 0, the error the confirmation rule detects with `target_power` (`rule_power`).
    `exact`: probabilities over the cells, or `exact_joint_sparse`'s dict. NaN if even moving all the other mass
    is not detected."""
    probs = _probabilities(exact)

    def power(tv: float) -> float:
        return power_against_tv(probs, tv, n_samples, false_alarm=false_alarm, reps=reps, seed=seed,
                                confirm_draws=confirm_draws)

    lo, hi = 0.0, float(1 - probs.max())
    if hi <= 0 or power(hi) < target_power:
        return float("nan")
    while hi - lo > 0.002:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if power(mid) >= target_power else (mid, hi)
    return hi


@dataclass(frozen=True)
class Power:
    """Share of replicated tests that rejected, with its Wilson 95% interval."""

    n_samples: int  # samples per replicated test
    reps: int
    rejected: int

    @property
    def power(self) -> float:
        return self.rejected / self.reps

    @property
    def interval(self) -> tuple[float, float]:
        ci = proportion(self.rejected, self.reps)
        return ci.lo, ci.hi


def replicated_power(samples: np.ndarray, exact: np.ndarray, vocab_size: int, *, n_samples: int,
                     false_alarm: float) -> Power:
    """Power of `chisquare_gof` at `n_samples` samples, measured on a sampler's own draws: `samples` (N, n) is split
    into N // n_samples disjoint chunks, each an independent replicate of the test, and the share of chunks the test
    rejects at `false_alarm` is the power against that sampler (its false-alarm rate if the sampler is correct).

    Unlike `rejection_rate`, nothing about the sampler's distribution is estimated: each replicate is the test as run.
    """
    samples = np.asarray(samples)
    reps = samples.shape[0] // n_samples
    if reps < 1:
        raise ValueError(f"{samples.shape[0]} samples make no replicate of {n_samples}; draw more samples")
    rejected = sum(chisquare_gof(counts_of(samples[i * n_samples:(i + 1) * n_samples], vocab_size), exact)
                   .rejects(false_alarm) for i in range(reps))
    return Power(n_samples, reps, int(rejected))


def main(argv: list[str] | None = None) -> int:
    """`python -m specrepro.distribution`: draw one of 01's real-pair cells again with fresh seeds (the first
    `n_tokens` tokens of one shipped prompt, SmolLM2 and a shipped draft) and test each draw against the exact
    probabilities: how a cell that rejected once is confirmed or found a false alarm."""
    import argparse

    from . import data, models

    ap = argparse.ArgumentParser(prog="python -m specrepro.distribution", description=main.__doc__)
    ap.add_argument("--draft", default="prompt-lookup")
    ap.add_argument("--task", choices=("code", "text"), default="text")
    ap.add_argument("--prompt", type=int, default=0, help="index in the task's shipped prompt set")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--gamma", type=int, default=2)
    ap.add_argument("--n-tokens", type=int, default=3)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--batch-rows", type=int, default=1000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = ap.parse_args(argv)
    target, tok = models.load_target(), models.load_tokenizer()
    draft = models.load_draft(args.draft, target=target)
    ids = data.encode_prompt(tok, args.task, data.load_prompts(args.task)[args.prompt])[0].tolist()
    cfg = SamplingConfig(args.temperature, args.top_k, args.top_p)
    exact = exact_joint_sparse(target, torch.tensor([ids]), args.n_tokens, cfg)
    for seed in args.seeds:
        [g], _ = gof_ragged(target, draft, [ids], [exact], seed=seed, n_tokens=args.n_tokens, n_samples=args.samples,
                            cfg=cfg, gamma=args.gamma, batch_rows=args.batch_rows, pad_token_id=tok.pad_token_id or 0)
        print(f"{args.draft}, {args.task} {args.prompt}, {cfg}, seed {seed}: p = {g.p_value:.4f}, total variation "
              f"{g.total_variation:.4f}, {g.dof} degrees of freedom, {g.impossible} outside the support "
              f"({args.samples:,} samples, {len(exact):,} continuations)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
