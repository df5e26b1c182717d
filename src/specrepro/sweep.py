"""The draft sweep (Leviathan et al. 2022, arXiv 2211.17192, Sec. 4 and Table 2): drafts x gamma, predicted before
measured.

Two runs on disjoint prompts. The *calibration* (`calibrate`) measures each draft's cost c (its decode time per
token over the target's, interleaved) and, given the target's verification cost (a forward of g+1 tokens in
autoregressive decode steps, `verify_profile`), the draft's acceptance on the target's own continuations of the
calibration prompts: one forward of each model gives every position's acceptance probability beta
(`acceptance.betas`, Leviathan Def. 3.1), and `replay` walks the speculative loop's iterations over those positions
at every gamma (which proposals are made, how many are accepted) without running it: greedy, exactly the loop's run;
sampling, an approximation (`replay`). From these alone `predict` gives every gamma's speedup
(`walltime.predicted_speedup_in_steps`, Thm 3.8 with measured costs): an out-of-sample prediction. `predict_replay`
counts the replayed iterations' tokens over their costs instead: greedy, it needs no part of Eq. 1's i.i.d.
assumption; sampling, it keeps how beta varies along the path but not how one acceptance changes the next position's
beta. The *sweep* (`sweep`) then measures every (draft, gamma) on other prompts, interleaved per prompt with
autoregressive decoding, and `cells`/`table2` set the measured speedup (pooled, 95% bootstrap interval over prompts)
beside the predictions.

Eq. 1 assumes each draft token is accepted independently with probability alpha, so the accepted length of an
iteration follows a geometric law capped at gamma (`capped_geometric`); `geometric_fit` tests it and
`lag_correlation` measures how far consecutive iterations' acceptances are from independent (a copying draft
accepts in runs).

A drafted token costs a draft forward. A prompt-lookup draft proposes only as far as its match reaches
(`proposal_length`), so its proposal lengths, and with them how its iterations split a generation, depend on gamma;
the replay asks it at every iteration, as the loop does.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from . import bench, intervals, verdicts, walltime
from .acceptance import betas as acceptance_betas
from .acceptance import position_logits
from .generate import (
    GenerationStats,
    autoregressive_generate,
    checked_length,
    eos_set,
    pooled_alpha,
    speculative_generate,
    tested,
)
from .kernels import KERNELS, use_kernel, use_kernels  # use_kernels: also sweep.use_kernels, as 06 calls it
from .sampling import SamplingConfig
from .timing import timed

CALIBRATION_SEED = 10_000  # offset of the calibration runs' sampling seeds from the sweep's


@dataclass(frozen=True)
class Calibration:
    """A draft's costs and acceptance measured apart from the sweep."""

    draft: str
    c: float  # draft decode ms per token / target decode ms per token, interleaved
    draft_ms: float
    target_ms: float
    verify_steps: tuple[float, ...]  # a target forward of g+1 tokens in autoregressive decode steps, g = 0..G
    alpha: float  # accepted / tested over the calibration's iterations at gamma G
    lengths: dict[int, tuple[int, ...]]  # gamma -> the calibration iterations' proposal lengths
    gamma: int  # G
    accepted: dict[int, tuple[int, ...]] = field(default_factory=dict)  # gamma -> the iterations' accepted counts

    def alpha_at(self, gamma: int) -> float:
        """alpha of the calibration's iterations at `gamma` (accepted / tested), `alpha` where only G's are kept."""
        if gamma not in self.accepted:
            return self.alpha
        return _alpha(self.accepted[gamma], self.lengths[gamma])


def _alpha(accepted, proposed) -> float:
    """`generate.pooled_alpha` of these iterations (accepted / tested), 0 rather than NaN when no draft token was
    tested (the replay then predicts from no acceptance)."""
    a = pooled_alpha([GenerationStats(0, accepted=list(accepted), proposed=list(proposed))])
    return 0.0 if a != a else a


def replay(betas, gamma: int, *, rng: np.random.Generator, end: int | None = None, prefix: list[int] | None = None,
           new: list[int] | None = None, proposal_length=None) -> list[tuple[int, int]]:
    """The speculative loop's iterations over one continuation of the target, without running it: (proposed,
    accepted) per iteration. The continuation runs to the run's max_new_tokens (= len(betas)) without stopping at
    EOS; `end` is how many of its tokens the run keeps (first EOS + 1; default all). `betas[t]` is the probability
    that the draft's proposal for new token t is accepted given the continuation's prefix (greedy: 1 where the
    draft's argmax is the continuation's token, else 0). As in `generate.decode`, an iteration at new token t
    proposes min(gamma, len(betas) - t - 1) (the target adds one of its own), or as far as `proposal_length(prefix +
    new[:t], that)` reaches for a lookup draft, tests its proposals in order until the first rejection (past EOS
    too: the loop cuts the tokens after testing them), and the next iteration starts one token past the accepted
    ones; the walk ends at `end`.

    Greedy, this is exactly the loop's run on the continuation (accepted drafts are the target's own tokens).
    Sampling, it is an approximation: it walks the continuation's prefixes, a path drawn from p, and flips an
    independent coin with each beta, where a real run continues from the accepted draft token (drawn from
    min(p, q) / beta) or the residual (p - q)+ / (1 - beta), so the next position's beta depends on the previous
    acceptance. Runs of acceptances that come from that dependence are lost; those that come from the path's
    prefixes (a repeated passage the draft copies) are kept."""
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    if proposal_length is not None and (prefix is None or new is None or len(new) != len(betas)):
        raise ValueError("a lookup draft's replay needs the prompt (prefix) and the continuation (new), one token "
                         "per beta")
    n_max = len(betas)
    end = n_max if end is None else end
    if not 0 < end <= n_max:
        raise ValueError(f"end must be in 1..{n_max} (the continuation's length), got {end}")
    out, t = [], 0
    while t < end:
        g = min(gamma, n_max - t - 1)
        if proposal_length is not None and g > 0:
            g = checked_length(proposal_length(list(prefix) + list(new[:t]), g), g)
        n = 0
        while n < g and rng.random() < float(betas[t + n]):
            n += 1
        out.append((g, n))
        t += n + 1
    return out


def calibrate(target, drafts: dict, prompts: list[torch.Tensor], *, gamma: int, max_new_tokens: int,
              temperature: float, cost_prompt: torch.Tensor, verify_steps: list[float], seed: int = 0,
              eos_token_id=None, cost_tokens: int = 16, gammas=None, walks: int = 20) -> dict[str, Calibration]:
    """Each draft's `Calibration`: c from `walltime.decode_ms_per_token` on `cost_prompt` (all models interleaved);
    the proposal and accepted lengths at `gamma` and each of `gammas` from `replay` on the target's continuations
    of `prompts` (the sweep must use other prompts) at the sweep's `max_new_tokens`: one target forward per
    continuation (none when greedy), one forward per draft (a draft that reads the target's features gets them
    from a target forward, `acceptance.position_logits`: every position scored at depth 1, so its alpha is an
    upper bound on the loop's). Each continuation's first iteration is left out, as the sweep's decode times leave
    it out. Continuation i samples with seed + CALIBRATION_SEED + i, apart from the
    sweep's seeds; sampling, each continuation is replayed `walks` times (`numpy` generator seeded from `seed`: more
    coin flips on the same prefixes, not more prefixes). `verify_steps` is the target's verification cost profile
    (`verify_profile`, in autoregressive decode steps), measured once."""
    if len(verify_steps) < gamma + 1:
        raise ValueError(f"verify_steps covers forwards of 1..{len(verify_steps)} tokens; gamma {gamma} needs "
                         f"{gamma + 1}")
    if not prompts:
        raise ValueError("calibrate needs at least one calibration prompt")
    cfg = SamplingConfig(temperature=temperature)
    eos = eos_set(eos_token_id)
    ms = walltime.decode_ms_per_token({"target": target} | drafts, cost_prompt, n=cost_tokens)
    samples = []  # (prompt ids, new ids to max_new_tokens, tokens kept, target logits per new position or None)
    for i, ids in enumerate(prompts):
        out = autoregressive_generate(target, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                      generator=torch.Generator().manual_seed(seed + CALIBRATION_SEED + i))
        new = out.sequences[:, ids.shape[1]:]
        end = next((j + 1 for j, tok in enumerate(new[0].tolist()) if tok in eos), new.shape[1])
        samples.append((ids, new, end, None if cfg.greedy else position_logits(target, ids, new)))
    each = sorted(set(gammas or ()) | {gamma})
    result = {}
    for name, draft in drafts.items():
        rng = np.random.default_rng(seed + CALIBRATION_SEED)
        betas = []
        for ids, new, _, tl in samples:
            dl = position_logits(draft, ids, new, target=target)  # a feature draft reads the target's states
            betas.append((dl.argmax(-1) == new[0]).double().tolist() if cfg.greedy
                         else acceptance_betas(tl, dl, cfg).tolist())
        pl = getattr(draft, "proposal_length", None)
        iters = {g: [it for (ids, new, end, _), b in zip(samples, betas) for _ in range(1 if cfg.greedy else walks)
                     for it in replay(b, g, rng=rng, end=end, prefix=ids[0].tolist(), new=new[0].tolist(),
                                      proposal_length=pl)[1:]]  # the first iteration holds the prefill
                 for g in each}
        if not iters[gamma]:
            raise ValueError("every calibration continuation ended in its first iteration (EOS at once): use more "
                             "calibration prompts or other ones")
        lengths = {g: tuple(p for p, _ in its) for g, its in iters.items()}
        accepted = {g: tuple(n for _, n in its) for g, its in iters.items()}
        result[name] = Calibration(name, ms[name] / ms["target"], ms[name], ms["target"], tuple(verify_steps),
                                   _alpha(accepted[gamma], lengths[gamma]), lengths, gamma, accepted)
    return result


def predict(cal: Calibration, gamma: int) -> float:
    """The speedup at `gamma` predicted from the calibration alone (costs in target steps, so drift cancels):
    Thm 3.8 at the calibration's alpha and proposal lengths for that gamma."""
    if not 1 <= gamma <= cal.gamma:
        raise ValueError(f"the calibration covers gamma 1..{cal.gamma}, got {gamma}")
    lengths = list(cal.lengths[gamma]) if gamma in cal.lengths else [min(g, gamma) for g in cal.lengths[cal.gamma]]
    return walltime.predicted_speedup_in_steps(cal.alpha_at(gamma), gamma, ar_ms_per_token=1.0,
                                               draft_ms_per_token=cal.c, verify_steps=list(cal.verify_steps),
                                               lengths=lengths)


def predict_replay(cal: Calibration, gamma: int) -> float:
    """The speedup at `gamma` from the calibration's replayed iterations themselves, without Eq. 1: tokens
    sum(accepted + 1) over cost sum(proposed * c + verify_steps[proposed]), in target steps. nan where the
    calibration kept no iterations at that gamma."""
    if not 1 <= gamma <= cal.gamma:
        raise ValueError(f"the calibration covers gamma 1..{cal.gamma}, got {gamma}")
    if gamma not in cal.accepted or not cal.accepted[gamma]:
        return float("nan")
    tokens = sum(n + 1 for n in cal.accepted[gamma])
    steps = sum(g * cal.c + cal.verify_steps[g] for g in cal.lengths[gamma])
    return tokens / steps


@dataclass
class SweepRun:
    """One timed generation of the sweep. Decode time and tokens leave out the first iteration (the prefill and
    the first token(s)), as every decode time of `specrepro.bench` does."""

    draft: str  # "" for autoregressive decoding
    gamma: int  # 0 for autoregressive decoding
    prompt: int
    seconds: float
    decode_seconds: float
    decode_tokens: int
    draft_seconds: float
    drafted: int  # draft tokens proposed after the first iteration
    proposed: list[int]
    accepted: list[int]
    output: list[int]

    @property
    def method(self) -> str:
        """How `bench.speedup_interval` names the run: "autoregressive", or "<draft>@<gamma>"."""
        return f"{self.draft}@{self.gamma}" if self.gamma else "autoregressive"


def _run(target, draft, ids, *, gamma: int, name: str, prompt: int, **kw) -> SweepRun:
    if draft is None:
        secs, out = timed(lambda: autoregressive_generate(target, ids, **kw))
    else:
        secs, out = timed(lambda: speculative_generate(target, draft, ids, gamma=gamma, **kw))
    st = out.stats
    first = min(st.accepted[0] + 1, st.new_tokens) if st.accepted else 1  # the first iteration's tokens (EOS cuts)
    # the first iteration is left out of the draft's time too: it holds the draft's prefill of the prompt
    return SweepRun(name, gamma if draft is not None else 0, prompt, secs, sum(st.iteration_seconds[1:]),
                    st.new_tokens - first, sum(st.draft_seconds[1:]), sum(st.proposed[1:]), list(st.proposed),
                    list(st.accepted), out.sequences[0, ids.shape[1]:].tolist())


METHODS = ("autoregressive", "speculative")  # the keys of `sweep`'s `kernels`


def check_kernels(kernels: Mapping[str, str]) -> None:
    """Raise a ValueError saying what to pass unless `kernels` names a `kernels.KERNELS` entry for each of
    `METHODS`."""
    missing = [m for m in METHODS if m not in kernels]
    unknown = sorted(set(kernels.values()) - set(KERNELS))
    if missing or unknown:
        raise ValueError(f"kernels must map each of {METHODS} to one of {KERNELS}; got {dict(kernels)!r}"
                         + (f" (no kernel for {missing})" if missing else "")
                         + (f" (unknown {unknown})" if unknown else ""))


def sweep(target, drafts: dict, prompts: list[torch.Tensor], gammas: list[int], *, max_new_tokens: int,
          temperature: float, seed: int = 0, eos_token_id=None, log=None,
          kernels: Mapping[str, str] | None = None) -> list[SweepRun]:
    """Every prompt: autoregressive decoding, then every draft at every gamma, timed back to back (drift hits
    every cell of a prompt alike). Prompt i samples with seed + i in every cell.

    kernels: {"autoregressive": kernel, "speculative": kernel} (`kernels.KERNELS` names, e.g. the `ar_kernel` and
    `spec_kernel` of a `batching.verify_cost` race): the target is switched to the first before each
    autoregressive run, the target and every model draft to the second before each speculative one (a lens draft
    shares the target's layers, so the two cannot differ there), outside the timed calls. Each method then runs
    with the kernel its race picked (a draft's own 1-token forwards are not raced apart). None: the models' kernels
    as they are. The models are left with the speculative kernel."""
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, eos_token_id=eos_token_id)
    if kernels is not None:
        check_kernels(kernels)
    current = [None]

    def switch(method):
        if kernels is not None and kernels[method] != current[0]:
            use_kernels((target, *drafts.values()), kernels[method])
            current[0] = kernels[method]

    runs = []
    for i, ids in enumerate(prompts):
        switch("autoregressive")
        runs.append(_run(target, None, ids, gamma=0, name="", prompt=i,
                         generator=torch.Generator().manual_seed(seed + i), **kw))
        switch("speculative")
        for name, draft in drafts.items():
            for g in gammas:
                runs.append(_run(target, draft, ids, gamma=g, name=name, prompt=i,
                                 generator=torch.Generator().manual_seed(seed + i), **kw))
        if log:
            log(f"prompt {i + 1}/{len(prompts)} done")
    return runs


def records(runs: list[SweepRun]) -> list[dict]:
    """The runs as flat rows (a CSV): per-iteration proposals and acceptances as space-separated integers."""
    return [dict(draft=r.draft, gamma=r.gamma, prompt=r.prompt, seconds=r.seconds, decode_seconds=r.decode_seconds,
                 decode_tokens=r.decode_tokens, draft_seconds=r.draft_seconds, drafted=r.drafted,
                 proposed=" ".join(map(str, r.proposed)), accepted=" ".join(map(str, r.accepted)),
                 new_tokens=len(r.output)) for r in runs]


def speedup(runs: list[SweepRun], draft: str, gamma: int, *, seed: int = 0) -> intervals.Interval:
    """Pooled decode-time speedup of (draft, gamma) over autoregressive decoding on the same prompts, with a 95%
    percentile bootstrap interval over prompts (`bench.speedup_interval`)."""
    return bench.speedup_interval(runs, f"{draft}@{gamma}", seed=seed)


def speedup_ratio(runs: list[SweepRun], a: tuple[str, int], b: tuple[str, int], *, seed: int = 0
                  ) -> intervals.Interval:
    """How many times faster draft a = (name, gamma) decodes than b on the same prompts: pooled decode times, with a
    95% bootstrap interval over prompts resampled in pairs. What the prompts share (their length, how copyable they
    are) cancels, so this is the test of "a beats b"; two speedups' marginal intervals overlap far more often.
    When a is picked as the best on these same runs, the estimate leans towards a (the winner's curse)."""
    return bench.speedup_interval(runs, f"{a[0]}@{a[1]}", baseline=f"{b[0]}@{b[1]}", seed=seed)


def thread_effect(runs_few: list[SweepRun], runs_many: list[SweepRun], draft: str, gamma: int, *,
                  seed: int = 0) -> intervals.Interval:
    """How many times the speedup of (draft, gamma) over autoregressive decoding with fewer threads (`runs_few`)
    is the speedup with more (`runs_many`), on the prompts both ran: (AR_few / SD_few) / (AR_many / SD_many) of
    pooled decode times per token, with a 95% bootstrap interval over prompts resampled together in all four
    runs (what a prompt does to both speedups cancels). Below 1: speculation gains less with fewer threads."""
    method = f"{draft}@{gamma}"
    parts = [bench.per_prompt(runs, m) for runs in (runs_few, runs_many) for m in ("autoregressive", method)]
    shared = sorted(set.intersection(*(set(p) for p in parts)))
    if not shared:
        raise ValueError(f"no prompt was run autoregressively and by {method} in both sets of runs")
    cols = [[p[k][i] for k in shared] for p in parts for i in (0, 1)]

    def ratio(*c):  # speedup with fewer threads over speedup with more
        return intervals.speedup(*c[:4]) / intervals.speedup(*c[4:])

    return intervals.bootstrap(ratio, *cols, seed=seed)


def alpha_interval(runs: list[SweepRun], *, seed: int = 0) -> intervals.Interval:
    """Pooled alpha (accepted / tested, `GenerationStats.alpha`) with a bootstrap interval over prompts; all nan
    when no draft token was tested (a lookup draft that never matched)."""
    acc = [sum(r.accepted) for r in runs]
    tests = [tested(r.accepted, r.proposed) for r in runs]
    if sum(tests) == 0:
        return intervals.Interval(float("nan"), float("nan"), float("nan"), len(runs), 0.95)
    return intervals.bootstrap(intervals.ratio_of_sums, acc, tests, seed=seed)


def capped_geometric(alpha: float, gamma: int) -> np.ndarray:
    """P(n accepted of gamma) under Eq. 1's model: alpha^n (1 - alpha) for n < gamma, alpha^gamma for n = gamma."""
    n = np.arange(gamma + 1)
    p = alpha ** n * (1 - alpha)
    p[gamma] = alpha ** gamma
    return p


def geometric_fit(accepted: list[int], gamma: int, alpha: float | None = None) -> dict:
    """Chi-squared goodness of fit of the accepted lengths of full iterations (gamma proposed) to the capped
    geometric law at `alpha` (estimated from them when None: one degree of freedom less). Bins with an expected
    count under 5 are merged into their neighbour. Returns counts, expected counts, chi2, dof and p-value."""
    from scipy import stats

    counts = np.bincount(np.asarray(accepted, dtype=int), minlength=gamma + 1)[:gamma + 1].astype(float)
    n = counts.sum()
    if n == 0:
        raise ValueError("no iteration to fit")
    fitted = alpha is None
    if fitted:
        alpha = _alpha(accepted, [gamma] * len(accepted))
    expected = n * capped_geometric(alpha, gamma)
    obs, exp = [], []
    for o, e in zip(counts, expected):  # merge small bins forward
        if obs and exp[-1] < 5:
            obs[-1] += o
            exp[-1] += e
        else:
            obs.append(o)
            exp.append(e)
    if len(exp) > 1 and exp[-1] < 5:  # a small last bin joins the one before it
        o, e = obs.pop(), exp.pop()
        obs[-1] += o
        exp[-1] += e
    dof = len(obs) - 1 - int(fitted)
    chi2 = float(sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0))
    p = float(stats.chi2.sf(chi2, dof)) if dof > 0 else float("nan")
    return dict(alpha=alpha, iterations=int(n), counts=counts.tolist(), expected=expected.tolist(), chi2=chi2,
                dof=dof, p_value=p)


def lag_correlation(runs: list[SweepRun]) -> float:
    """Within-generation correlation of consecutive full iterations' accepted fractions (n/gamma): each
    generation's mean is subtracted before the pairs are pooled, so that prompts that differ in alpha alone do not
    count as runs. About 0 (slightly below, a short series' mean is estimated) when acceptances are independent,
    > 0 when a draft accepts in runs."""
    pairs = []
    for r in runs:
        f = np.array([a / g for a, g in zip(r.accepted, r.proposed) if g == r.gamma and g > 0])
        if len(f) >= 2:
            f = f - f.mean()
            pairs += list(zip(f[:-1], f[1:]))
    if len(pairs) < 3:
        return float("nan")
    x, y = np.array(pairs).T
    if x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def in_run_c(runs: list[SweepRun]) -> float:
    """The draft's cost per drafted token inside the runs, over the same prompts' autoregressive decode time per
    token (the in-run c; the calibrated c is measured apart)."""
    ar = [r for r in runs if r.gamma == 0]
    sd = [r for r in runs if r.gamma > 0]
    ar_ms = sum(r.decode_seconds for r in ar) / sum(r.decode_tokens for r in ar)
    drafted = sum(r.drafted for r in sd)
    return (sum(r.draft_seconds for r in sd) / drafted) / ar_ms if drafted else float("nan")


def cells(runs: list[SweepRun], calibration: dict[str, Calibration], *, seed: int = 0) -> list[dict]:
    """One row per (draft, gamma): measured speedup with its interval, alpha with its interval, the prediction
    from the calibration, and the accepted lengths' fit to Eq. 1's law."""
    rows = []
    ar = [r for r in runs if r.gamma == 0]
    for name in dict.fromkeys(r.draft for r in runs if r.gamma > 0):
        for g in sorted({r.gamma for r in runs if r.draft == name}):
            rs = [r for r in runs if (r.draft, r.gamma) == (name, g)]
            s, a = speedup(runs, name, g, seed=seed), alpha_interval(rs, seed=seed)
            full = [n for r in rs for n, p in zip(r.accepted, r.proposed) if p == g]
            fit = geometric_fit(full, g) if full else {}
            cal = calibration.get(name)
            rows.append(dict(draft=name, gamma=g, speedup=s.estimate, speedup_lo=s.lo, speedup_hi=s.hi,
                             n_prompts=s.n_units, alpha=a.estimate, alpha_lo=a.lo, alpha_hi=a.hi,
                             tokens_per_iteration=sum(n + 1 for r in rs for n in r.accepted)
                             / max(1, sum(len(r.accepted) for r in rs)),
                             c_in_run=in_run_c(ar + rs), c=cal.c if cal else float("nan"),
                             predicted_speedup=predict(cal, g) if cal else float("nan"),
                             predicted_replay=predict_replay(cal, g) if cal else float("nan"),
                             fit_p_value=fit.get("p_value", float("nan")), lag_correlation=lag_correlation(rs)))
    return rows


def table2(cell_rows: list[dict], calibration: dict[str, Calibration], params: dict[str, int]) -> list[dict]:
    """Leviathan's Table 2 layout: per draft, the measured best gamma (`speedup`, with its interval), the
    prediction at the gamma the calibration chose (`gamma_pred`, `predicted_speedup`) and the prediction at the
    measured best gamma (`predicted_at_best`)."""
    out = []
    for name in dict.fromkeys(r["draft"] for r in cell_rows):
        rows = [r for r in cell_rows if r["draft"] == name]
        best = max(rows, key=lambda r: r["speedup"])
        cal = calibration[name]
        gammas = [r["gamma"] for r in rows]
        gamma_pred = max(gammas, key=lambda g: predict(cal, g))
        measured_at_pred = next(r for r in rows if r["gamma"] == gamma_pred)
        out.append(dict(draft=name, params=params.get(name, 0), c=cal.c, c_in_run=best["c_in_run"],
                        alpha=best["alpha"], alpha_lo=best["alpha_lo"], alpha_hi=best["alpha_hi"],
                        alpha_calibration=cal.alpha_at(best["gamma"]), gamma_opt=best["gamma"], speedup=best["speedup"],
                        speedup_lo=best["speedup_lo"], speedup_hi=best["speedup_hi"], gamma_pred=gamma_pred,
                        predicted_speedup=predict(cal, gamma_pred),
                        measured_at_gamma_pred=measured_at_pred["speedup"],
                        measured_at_gamma_pred_lo=measured_at_pred["speedup_lo"],
                        measured_at_gamma_pred_hi=measured_at_pred["speedup_hi"],
                        predicted_at_best=predict(cal, best["gamma"]),
                        predicted_replay=predict_replay(cal, gamma_pred),
                        prediction_error=predict(cal, gamma_pred) / measured_at_pred["speedup"] - 1,
                        n_prompts=best["n_prompts"]))
    return out


def setting_verdict(table2_rows, runs: list[SweepRun], ladder: list[str], alphas: list[float], *,
                    seed: int = 0) -> dict:
    """`verdicts.ladder_setting` for one task x temperature of the sweep: `table2_rows` (the `table2` rows of that
    setting as a DataFrame indexed by draft) gives each ladder draft's prediction from the calibration and its
    measurement at the gamma the calibration chose; the calibration's first two are tested against each other
    paired on the sweep's prompts (`speedup_ratio`, each at its calibrated gamma), so nothing is chosen on the runs
    that test it."""
    lad = table2_rows.loc[[d for d in ladder if d in table2_rows.index]]

    def paired(a: str, b: str) -> tuple[float, float, float]:
        r = speedup_ratio(runs, (a, int(lad.gamma_pred[a])), (b, int(lad.gamma_pred[b])), seed=seed)
        return r.estimate, r.lo, r.hi

    return verdicts.ladder_setting(
        {d: (r.measured_at_gamma_pred, r.measured_at_gamma_pred_lo, r.measured_at_gamma_pred_hi)
         for d, r in lad.iterrows()}, ladder, alphas, paired,
        predicted={d: r.predicted_speedup for d, r in lad.iterrows()})


def setting_key(task: str, temperature: float) -> str:
    """How metrics name a setting of the sweep: "code_T0", "text_T1"."""
    return f"{task}_T{temperature:g}"


def size_verdicts(table2, grid, runs: dict, family: list[str], gamma: int, *, seed: int = 0) -> dict[str, dict]:
    """The draft-size question for one family of drafts (`family`, smallest first), in every setting of the sweep:
    `setting_verdict` on the family's `table2` rows, with the family's alphas at one gamma (`grid`'s, the sweep's
    at `gamma`: not each draft at its own best gamma). `runs` maps (task, temperature) to that setting's runs.
    Keyed by `setting_key`; each verdict also holds `alphas` (in `family`'s order) and `overall_best` (the fastest
    draft of all measured in the setting, family or not). `verdicts.draft_size` turns them into one answer."""
    if not family:
        raise ValueError("a draft-size question needs the names of the family's drafts, smallest first")
    out = {}
    for (task, temperature), setting_runs in runs.items():
        sub = table2[(table2.task == task) & (table2.temperature == temperature)]
        missing = [d for d in family if d not in set(sub.draft)]
        if missing:
            raise ValueError(f"{missing} not in the sweep's table at {setting_key(task, temperature)}: a family's "
                             "drafts must be among the drafts swept")
        at_g = grid[(grid.task == task) & (grid.temperature == temperature) & (grid.gamma == gamma)]
        alphas = [float(at_g.set_index("draft").alpha.get(d, float("nan"))) for d in family]
        v = setting_verdict(sub.set_index("draft"), setting_runs, family, alphas, seed=seed)
        out[setting_key(task, temperature)] = v | dict(alphas=alphas,
                                                       overall_best=str(sub.loc[sub.speedup.idxmax(), "draft"]))
    return out


def verify_steps(verify_ms: list[float], step_ms: float | None = None) -> list[float]:
    """`walltime.verify_ms` in autoregressive decode steps: a forward of g+1 tokens over `step_ms`, the
    autoregressive decode step (default: the first entry, a 1-token forward timed with the same kernel, which then
    reads 1)."""
    return [v / (verify_ms[0] if step_ms is None else step_ms) for v in verify_ms]


def verify_profile(target, context: int, gamma: int, kernels: Mapping[str, str] | None = None, *,
                   device=None) -> list[float]:
    """The verification cost profile `calibrate` and `predict` take: a forward of g+1 tokens (g = 0..gamma) after
    `context` cached ones, in autoregressive decode steps. With `kernels` (as `sweep` takes them) the forwards run
    with the speculative kernel and the step with the autoregressive one, as each method runs in the sweep; the
    target is left with the speculative kernel. None, or one kernel for both: every forward with that kernel (the
    first entry then reads 1)."""
    if kernels is not None:
        check_kernels(kernels)
        if kernels["autoregressive"] == kernels["speculative"]:
            use_kernel(target, kernels["speculative"])
            kernels = None
    if kernels is None:
        return verify_steps(walltime.verify_ms(target, context, gamma, device=device))
    use_kernel(target, kernels["autoregressive"])
    step = walltime.verify_ms(target, context, 0, device=device)[0]
    use_kernel(target, kernels["speculative"])
    return verify_steps(walltime.verify_ms(target, context, gamma, device=device), step)


def weights_read(model) -> int:
    """Weights a draft multiplies per token: every matrix of its forward, the output head included (tied or not),
    the input embedding (a row lookup) left out. A lens draft reads its k layers, lens and cut head; a lookup
    hybrid its small model; the prompt lookup none."""
    if hasattr(model, "weights_read"):
        return model.weights_read()
    if hasattr(model, "lookup") and hasattr(model, "model"):  # the lookup hybrid runs its small model
        return weights_read(model.model)
    if not hasattr(model, "get_input_embeddings"):  # the prompt lookup
        return 0
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    total = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    return total if head is not None and head.weight is emb else total - emb.numel()


@contextmanager
def threads(n: int):
    """Run the block with `n` intra-op CPU threads (torch.set_num_threads), restoring the number after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
