"""Verdicts computed from the numbers they report: one function per claim, each taking the measured values and
returning a `Verdict` (a label and the sentence that says why, both built from the inputs).

No verdict here is a typed sentence: every word that states a finding depends on a comparison of the inputs, so
results that point the other way give the other verdict (`tests/test_verdicts.py` feeds each function contrary
data). No verdict names a cause that its inputs do not isolate: where a notebook measured something that may
explain a result without isolating it (e.g. the cost of a verification at each batch size), the verdict reports
it as a measurement beside the finding, never as a "because".

Intervals are read one way everywhere (`interval_side`): a speedup is *reliably faster* when its interval lies
above 1, *reliably slower* when it lies below, and *not distinguishable* otherwise; an interval over one unit
(no bounds) is never reliable either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

LABELS = ("reproduces", "in direction only", "partly", "does not reproduce", "not tested like for like",
          "not testable", "lossless at this power", "differs: numerics only", "differs: not explained by numerics")


@dataclass(frozen=True)
class Verdict:
    """What a claim's numbers say: `label` (one of `LABELS`), `reason` (the sentence built from the numbers) and
    `facts` (the counts behind it, for tests and tables)."""

    label: str
    reason: str
    facts: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.label not in LABELS:
            raise ValueError(f"unknown verdict label {self.label!r}; one of {LABELS}")

    def __str__(self) -> str:
        return f"{self.label}: {self.reason}" if self.reason else self.label


def _num(v) -> float:
    """A value read back from JSON or a CSV: NaN for null/None, so that every comparison with it is False."""
    return float("nan") if v is None else float(v)


def interval_side(lo, hi, null: float = 1.0) -> str:
    """"above" when the interval lies above `null`, "below" when below, "contains" otherwise, "no interval" when a
    bound is missing (an interval over one unit)."""
    lo, hi = _num(lo), _num(hi)
    if math.isnan(lo) or math.isnan(hi):
        return "no interval"
    return "above" if lo > null else "below" if hi < null else "contains"


def fmt_ci(x, lo, hi, unit: str = "x", digits: int = 2) -> str:
    """"1.30x [1.09, 1.56]", or "0.82x (no interval)" where the interval has no bounds."""
    lo, hi = _num(lo), _num(hi)
    if math.isnan(lo) or math.isnan(hi):
        return f"{_num(x):.{digits}f}{unit} (no interval)"
    return f"{_num(x):.{digits}f}{unit} [{lo:.{digits}f}, {hi:.{digits}f}]"


@dataclass(frozen=True)
class SpeedupRow:
    """One measured speedup of the Table-1 analog: which task, decoding and draft, whether the draft is trained
    (a model, not a lookup), and the speedup with its interval over `n_prompts` prompts."""

    task: str
    decoding: str  # "greedy" or a sampled mode ("nucleus", ...)
    draft: str
    trained: bool
    speedup: float
    lo: float
    hi: float
    n_prompts: int
    gamma: int | None = None

    @property
    def like_for_like(self) -> bool:
        """The mode of Chen et al.'s headline rows: sampled decoding with a trained draft."""
        return self.decoding != "greedy" and self.trained

    def describe(self) -> str:
        g = f", gamma {self.gamma}" if self.gamma else ""
        return (f"{self.task} {self.decoding} ({self.draft}{g}, {self.n_prompts} prompts) "
                f"{fmt_ci(self.speedup, self.lo, self.hi)}")


def table1(rows: Sequence[SpeedupRow], paper: Mapping[str, float]) -> Verdict:
    """Chen et al.'s Table 1 (sampled, trained draft, K = 4: 1.92x on XSum, 2.46x on HumanEval) against our rows.

    The headline is the like-for-like rows (sampled, trained draft); the others (greedy, or a lookup draft) are
    counted apart and never decide the label. `paper` maps a task of ours to the paper's speedup for it (e.g.
    {"code": 2.46, "text": 1.92}). A row *reaches* the paper's size when its interval's upper end is at or above
    the paper's value.

    reproduces: every like-for-like row reliably faster and reaching the paper's size; in direction only: every
    one reliably faster, not every one reaching it; partly: some reliably faster; does not reproduce: none; not
    tested like for like: no such row."""
    like = [r for r in rows if r.like_for_like]
    other = [r for r in rows if not r.like_for_like]
    faster = [r for r in like if interval_side(r.lo, r.hi) == "above"]
    slower = [r for r in like if interval_side(r.lo, r.hi) == "below"]
    reach = [r for r in like if _num(r.hi) >= paper.get(r.task, math.inf)]
    other_faster = [r for r in other if interval_side(r.lo, r.hi) == "above"]
    other_text = (f"; other rows (greedy or a lookup draft): {len(other_faster)} of {len(other)} reliably faster"
                  + (f", best {max(other, key=lambda r: r.speedup).describe()}" if other else "")) if other else ""
    facts = dict(like_for_like=len(like), faster=len(faster), slower=len(slower), reach=len(reach),
                 other=len(other), other_faster=len(other_faster))
    if not like:
        return Verdict("not tested like for like", "no row is sampled with a trained draft, the mode of Chen et "
                       f"al.'s Table 1{other_text}", facts)
    if len(faster) == len(like):
        label = "reproduces" if len(reach) == len(like) else "in direction only"
    else:
        label = "partly" if faster else "does not reproduce"
    papers = ", ".join(f"{t} {v:.2f}x" for t, v in paper.items())
    reason = (f"like for like (sampled, trained draft), {len(faster)} of {len(like)} rows reliably faster than "
              f"autoregressive decoding and {len(slower)} reliably slower; {len(reach)} of {len(like)} reach the "
              f"paper's size ({papers}): " + "; ".join(r.describe() for r in like) + other_text)
    return Verdict(label, reason, facts)


def arithmetic(counted: Mapping[str, float], predicted: Mapping[str, float], tolerance: float = 0.20) -> Verdict:
    """Leviathan et al.'s Sec. 3.5: speculative decoding does more arithmetic per token than autoregressive
    decoding, by the factor Thm 3.11 gives. `counted` maps each configuration to its measured factor, `predicted`
    to Thm 3.11's (fed with alpha from another run).

    reproduces: more work in every configuration and Thm 3.11 within `tolerance` in every one; partly: more work
    everywhere, the theorem off by more somewhere; does not reproduce: some configuration did not do more work."""
    if not counted:
        return Verdict("not testable", "no configuration was counted")
    more = {k: v for k, v in counted.items() if v > 1}
    gaps = {k: counted[k] / predicted[k] - 1 for k in counted if k in predicted}
    worst = max(gaps, key=lambda k: abs(gaps[k])) if gaps else None
    within = [k for k, g in gaps.items() if abs(g) <= tolerance]
    facts = dict(configurations=len(counted), more_work=len(more), within=len(within), compared=len(gaps))
    reason = (f"{min(counted.values()):.2f}-{max(counted.values()):.2f}x the arithmetic per token over "
              f"{len(counted)} configurations, more than autoregressive decoding in {len(more)}; Thm 3.11 within "
              f"{tolerance:.0%} in {len(within)} of {len(gaps)}"
              + (f" (largest gap {gaps[worst]:+.1%}, {worst})" if worst else ""))
    if len(more) < len(counted):
        return Verdict("does not reproduce", reason, facts)
    return Verdict("reproduces" if len(within) == len(gaps) and gaps else "partly", reason, facts)


@dataclass(frozen=True)
class BatchRow:
    """Throughput at one batch size: speculative and autoregressive tokens per second, the speedup with its
    interval over `batches` batches, and (optional) the cost of a verification forward in decode steps."""

    batch_size: int
    spec_tokens_per_s: float
    ar_tokens_per_s: float
    speedup: float
    lo: float
    hi: float
    batches: int
    verify_steps: float | None = None
    ar_decode_tokens_per_s: float | None = None  # autoregressive, after each batch's first iteration (no prefill)


def batch_throughput(rows: Sequence[BatchRow], paper_gain: float = 3.0, at: int = 8) -> Verdict:
    """Zhang et al.: batched speculative decoding's throughput grows with the batch (up to `paper_gain` at batch
    `at` over batch 1); the seed post: its advantage over autoregressive decoding goes away in large batches.

    Label on the first part (throughput growth), the second reported beside it: where speculative decoding is
    reliably faster, slower, or not distinguishable, and the first batch size from which it is never reliably
    faster again. Verification costs, where given, are reported as measured, not as the cause.
    reproduces: growth reaching `paper_gain`; in direction only: growth below it; does not reproduce: no growth."""
    rows = sorted(rows, key=lambda r: r.batch_size)
    if len(rows) < 2 or rows[0].batch_size != 1:
        return Verdict("not testable", "needs batch size 1 and at least one larger batch")
    top = next((r for r in rows if r.batch_size == at), rows[-1])
    gain = top.spec_tokens_per_s / rows[0].spec_tokens_per_s
    side = {r.batch_size: interval_side(r.lo, r.hi) for r in rows}
    faster = [b for b, s in side.items() if s == "above"]
    slower = [b for b, s in side.items() if s == "below"]
    gone = next((r.batch_size for i, r in enumerate(rows) if all(side[s.batch_size] != "above" for s in rows[i:])),
                None)
    ar_rises = all(b.ar_tokens_per_s >= a.ar_tokens_per_s for a, b in zip(rows, rows[1:]))
    facts = dict(gain=gain, faster=faster, slower=slower, gone_from=gone, ar_rises=ar_rises)
    reason = (f"speculative throughput {gain:.2f}x at batch {top.batch_size} over batch 1 (theirs up to "
              f"{paper_gain:g}x); over autoregressive decoding reliably faster at batch {faster or 'none'}, reliably "
              f"slower at {slower or 'none'}, "
              + (f"never reliably faster from batch {gone} on" if gone else "still reliably faster at the largest "
                 "batch") + f" ({', '.join(f'{r.batch_size}: {fmt_ci(r.speedup, r.lo, r.hi)}' for r in rows)})")
    if rows[0].verify_steps is not None and rows[-1].verify_steps is not None:
        reason += (f"; a verification forward cost {rows[0].verify_steps:.2f} decode steps at batch 1 and "
                   f"{rows[-1].verify_steps:.2f} at batch {rows[-1].batch_size} (measured beside, not isolated as "
                   "the cause)")
    if not ar_rises:
        falls = [(a, b) for a, b in zip(rows, rows[1:]) if b.ar_tokens_per_s < a.ar_tokens_per_s]
        reason += ("; autoregressive throughput falls from batch "
                   + ", ".join(f"{a.batch_size} to {b.batch_size}" for a, b in falls))
        split = [(a, b) for a, b in falls if not math.isnan(_num(a.ar_decode_tokens_per_s))
                 and not math.isnan(_num(b.ar_decode_tokens_per_s))]
        if split:  # each batch's time split at its first iteration, which holds the prefill
            in_steps = [(a, b) for a, b in split if b.ar_decode_tokens_per_s < a.ar_decode_tokens_per_s]
            facts["ar_fall_in_decode_steps"] = [b.batch_size for _, b in in_steps]
            facts["ar_fall_in_first_iteration"] = [b.batch_size for a, b in split if (a, b) not in in_steps]
            reason += ("; without each batch's first iteration (the prompts' prefill) it "
                       + ", ".join(f"{'falls' if (a, b) in in_steps else 'rises'} from {a.ar_decode_tokens_per_s:.1f} "
                                   f"to {b.ar_decode_tokens_per_s:.1f} tokens/s at batch {b.batch_size}"
                                   for a, b in split)
                       + ": the fall is in "
                       + ("the decode steps" if len(in_steps) == len(split) else "the first iteration"
                          if not in_steps else "the first iteration at batch "
                          f"{facts['ar_fall_in_first_iteration']} and the decode steps at batch "
                          f"{facts['ar_fall_in_decode_steps']}"))
        else:
            reason += " (its time was not split at the first iteration, so where the fall is is not measured)"
    label = "does not reproduce" if gain <= 1 else "reproduces" if gain >= paper_gain else "in direction only"
    return Verdict(label, reason, facts)


IDENTICAL_SHARE = 0.99  # a quality cell whose answers are identical on this share of prompts is reported as such


@dataclass(frozen=True)
class QualityCell:
    """Both methods' quality on the same prompts: means, the paired difference's (1 - 2 level) interval, TOST's
    p-value at `margin`, the share of prompts on which the two wrote identical answers, and the smallest
    difference the design detects at 80% power (`detectable`)."""

    task: str
    decoding: str
    metric: str
    n_prompts: int
    autoregressive: float
    speculative: float
    diff_lo: float
    diff_hi: float
    margin: float
    tost_p: float
    level: float
    identical: float
    detectable: float | None = None
    paper_movement: float | None = None


def quality(cells: Sequence[QualityCell]) -> Verdict:
    """Quality unchanged (Chen et al.: 45.1% -> 47.0% on HumanEval, small movements both ways).

    A cell whose answers are (almost) all identical (>= `IDENTICAL_SHARE`) is reported as identical outputs, not as an
    equivalence test: the test passes there because there is nothing to test. The other cells count as shown
    unchanged when TOST rejects at their level; each reports the smallest difference its design detects at 80%
    power beside the paper's movement, and a cell whose detectable difference exceeds its margin is flagged as
    underpowered for that margin.
    reproduces: every tested cell equivalent and none underpowered; partly: every tested cell equivalent, some
    underpowered; does not reproduce: some tested cell not shown equivalent; not testable: nothing to test."""
    same = [c for c in cells if c.identical >= IDENTICAL_SHARE]
    tested = [c for c in cells if c.identical < IDENTICAL_SHARE]
    equiv = [c for c in tested if c.tost_p < c.level]
    weak = [c for c in tested if c.detectable is not None and c.detectable > c.margin]
    parts = [f"{c.task} {c.decoding}: identical outputs on {c.identical:.0%} of {c.n_prompts} prompts"
             for c in same]
    for c in tested:
        part = (f"{c.task} {c.decoding}: {c.metric} {c.autoregressive:.3f} vs {c.speculative:.3f} "
                f"({c.n_prompts} prompts), difference in [{c.diff_lo:+.3f}, {c.diff_hi:+.3f}], "
                f"{'equivalent' if c.tost_p < c.level else 'not shown equivalent'} within +-{c.margin:g} "
                f"(TOST p = {c.tost_p:.2g})")
        if c.detectable is not None:
            part += f", detects {c.detectable:.3f} at 80% power"
            if c.paper_movement is not None:
                part += f" (Chen et al. moved {c.paper_movement:+.3f} on their metric)"
        parts.append(part)
    facts = dict(identical=len(same), tested=len(tested), equivalent=len(equiv), underpowered=len(weak))
    reason = "; ".join(parts)
    if not tested:
        return Verdict("not testable", reason + "; no cell with different answers to test", facts)
    if len(equiv) < len(tested):
        return Verdict("does not reproduce", reason, facts)
    if weak:
        return Verdict("partly", reason + f"; {len(weak)} of {len(tested)} tested cells cannot detect a difference "
                       "as small as their margin", facts)
    return Verdict("reproduces", reason, facts)


def ladder_setting(speedups: Mapping[str, tuple[float, float, float]], sizes: Sequence[str],
                   alphas: Sequence[float], paired: Callable[[str, str], tuple[float, float, float]] | None = None,
                   predicted: Mapping[str, float] | None = None) -> dict:
    """One setting (task x temperature) of the draft-size sweep: `speedups` maps each ladder draft to its measured
    (speedup, lo, hi), `sizes` lists the drafts from smallest to largest, `alphas` their acceptance rates in that
    order at one gamma, `paired(a, b)` the ratio of a over b on the same prompts (estimate, lo, hi;
    `sweep.speedup_ratio`), `predicted` each draft's speedup predicted from a calibration on other prompts.

    With `predicted`, the winner and runner-up are the calibration's (so the measurement tests a choice made
    elsewhere: no winner's curse), `speedups` should hold each draft measured at the gamma the calibration chose,
    and `measured_winner` / `predicted_is_measured` say whether the measurement agrees. Without it, both are picked
    on the measurement itself. Returns the winner, the runner-up, whether the smallest draft wins, whether the winner
    is reliably faster than the runner-up (the paired interval above 1; without `paired`, the two marginal
    intervals clear of each other), whether alpha rises with size at every step, and whether the largest draft
    accepts more than the smallest."""
    measured = sorted(speedups, key=lambda d: speedups[d][0], reverse=True)
    order = sorted(speedups, key=lambda d: predicted[d], reverse=True) if predicted else measured
    win, second = order[0], order[1] if len(order) > 1 else None
    s, lo, hi = speedups[win]
    overlap = second is not None and speedups[second][2] >= lo
    out = dict(winner=win, winner_speedup=float(s), winner_lo=float(lo), winner_hi=float(hi), runner_up=second,
               intervals_overlap=bool(overlap), smallest_wins=win == sizes[0],
               alpha_rises_with_size=all(b > a for a, b in zip(alphas, alphas[1:])),
               alpha_largest_above_smallest=bool(alphas[-1] > alphas[0]),
               chosen_on="calibration" if predicted else "the measurement itself", measured_winner=measured[0],
               predicted_is_measured=bool(predicted) and win == measured[0])
    if paired is not None and second is not None:
        est, plo, phi = paired(win, second)
        out |= dict(paired_ratio=float(est), paired_lo=float(plo), paired_hi=float(phi),
                    reliably_faster=bool(plo > 1))
    else:
        out["reliably_faster"] = second is not None and not overlap
    return out


def draft_size(settings: Mapping[str, dict], alpha_rises: Iterable[bool], sizes: Sequence[str]) -> Verdict:
    """Leviathan et al. (T5): the smallest draft won. `settings` are `ladder_setting` results per task x
    temperature, `alpha_rises` whether the largest draft accepts more than the smallest in each.

    not testable: alpha does not rise with size somewhere (size then buys only cost); reproduces: the smallest
    wins everywhere, reliably faster than the runner-up; partly: it wins somewhere; does not reproduce: nowhere."""
    rises = list(alpha_rises)
    n = len(settings)
    smallest = sum(v["smallest_wins"] for v in settings.values())
    reliable = sum(bool(v.get("reliably_faster")) for v in settings.values())
    above = sum(interval_side(v["winner_lo"], v["winner_hi"]) == "above" for v in settings.values())
    facts = dict(settings=n, alpha_rises=sum(rises), smallest_wins=smallest, reliable=reliable, winner_above_1=above)
    if sum(rises) < len(rises) or not n:
        return Verdict("not testable", f"alpha does not rise with size in every setting (largest above smallest in "
                       f"{sum(rises)} of {len(rises)})", facts)
    chosen = [v for v in settings.values() if v.get("chosen_on") == "calibration"]
    pick = ("the calibration's pick" if len(chosen) == n else "the measurement's best" if not chosen else
            "the winner")  # who chose the winner whose interval is read
    reason = (f"alpha rises from {sizes[0]} to {sizes[-1]} in every setting; the smallest draft wins in {smallest} "
              f"of {n}, and the winner is reliably faster than the runner-up in {reliable} of {n}; {pick} is "
              f"reliably faster than autoregressive decoding in {above} of {n}")
    if chosen:
        agree = sum(v["predicted_is_measured"] for v in chosen)
        facts["predicted_is_measured"] = agree
        reason += (f" (winner and runner-up chosen on calibration prompts in {len(chosen)} of {n}; the measurement "
                   f"agreed on the winner in {agree} of {len(chosen)})")
    if smallest == n and reliable == n:
        return Verdict("reproduces", reason, facts)
    return Verdict("partly" if smallest else "does not reproduce", reason, facts)


def numerics(same_seed_identical: int, same_seed_prompts: int, greedy_bugs: Mapping[str, int],
             distribution_p: float, *, alpha: float = 0.05) -> Verdict:
    """Chen et al. Sec. 1, 4: speculative sampling keeps the target's distribution, not its sample. Inputs: how many
    of `same_seed_prompts` sampled continuations came out identical with the same seed; per dtype, the greedy
    divergences not at a near-tie (`greedy_bugs`); the p-value of the test that the two first-token distributions
    agree.

    reproduces: the distributions agree at `alpha`, no greedy divergence beyond a near-tie, and the same seed gave
    a different continuation somewhere; partly: all that, but every same-seed continuation was identical (the
    "different draw" half not shown); does not reproduce: the distribution test rejects, or a greedy output
    diverges where the logits are not tied."""
    p = _num(distribution_p)
    bugs = {d: int(b) for d, b in greedy_bugs.items()}
    facts = dict(same_seed_identical=same_seed_identical, same_seed_prompts=same_seed_prompts, bugs=bugs,
                 distribution_p=p)
    if math.isnan(p) or not same_seed_prompts or not bugs:
        return Verdict("not testable", "the distribution test, the same-seed runs or the greedy runs are missing",
                       facts)
    agree, clean = p >= alpha, not any(bugs.values())
    differ = same_seed_identical < same_seed_prompts
    reason = (f"first-token distributions {'agree' if agree else 'differ'} (p = {p:.2g}, level {alpha}); "
              f"{sum(bugs.values())} greedy divergences not at a near-tie ("
              + ", ".join(f"{d} {b}" for d, b in bugs.items()) + f"); same seed: {same_seed_identical} of "
              f"{same_seed_prompts} sampled continuations identical")
    if not (agree and clean):
        return Verdict("does not reproduce", reason, facts)
    return Verdict("reproduces" if differ else "partly", reason, facts)


def distribution(tiny_rejected: bool, real_rejected: bool, outside_support: int, *, tiny_rule: bool,
                 real_rule: bool) -> Verdict:
    """Leviathan et al. Thm 3.5, Chen et al. Thm 1: speculative sampling draws from the target's distribution.
    Inputs: whether a test on the tiny pairs failed (`tiny_rejected`) and whether one on the real pair did
    (`real_rejected`), each as its run counts a failure; whether that run applied the confirmation rule (`tiny_rule`,
    `real_rule`: a rejection counts only if its fresh redraws reject too, so a failure is reported as confirmed on
    fresh draws); how many samples fell where the target's probability is 0 (`outside_support`), which fails the
    claim whatever the p-values.

    reproduces: no sample outside the support and no test failed; does not reproduce: otherwise, naming which."""
    outside = int(outside_support)
    facts = dict(tiny_rejected=bool(tiny_rejected), real_rejected=bool(real_rejected), outside_support=outside)
    if outside:
        return Verdict("does not reproduce",
                       f"{outside} sample{'s' * (outside != 1)} fell outside the target's support", facts)
    if tiny_rejected:
        return Verdict("does not reproduce",
                       "a test rejected" + (", confirmed on fresh draws" if tiny_rule else ""), facts)
    if real_rejected:
        return Verdict("does not reproduce",
                       "a test on the real pair rejected" + (", confirmed on fresh draws" if real_rule else ""), facts)
    return Verdict("reproduces", "", facts)


def batch_equivalence(ours: Sequence[float], controls: Sequence[float]) -> Verdict:
    """Zhang et al. 2025: batch > 1 must keep every row's output. `ours`: our speculative decoding's exact-match
    rate against each row decoded alone, one per batch size; `controls`: the same checker on the published batching
    bugs (it must see them, or a pass means nothing).

    reproduces (the problem, and ours free of it): every batch size matches exactly and every control is caught;
    does not reproduce: ours loses equivalence at some batch size; partly: ours matches, but a control matched
    everywhere (or none ran), so the checker is not shown to see the bug."""
    ours, controls = [_num(x) for x in ours], [_num(x) for x in controls]
    if not ours:
        return Verdict("not testable", "no batch size was checked")
    kept = all(x == 1 for x in ours)
    caught = bool(controls) and all(x < 1 for x in controls)
    facts = dict(kept=kept, caught=caught, worst=min(ours))
    seen = (f"the checker caught every control ({min(controls):.0%}-{max(controls):.0%} exact)" if caught else
            "no control ran" if not controls else
            f"a control matched everywhere ({max(controls):.0%}): the checker is not shown to see the bug")
    reason = (f"ours exact at {sum(x == 1 for x in ours)} of {len(ours)} batch sizes (worst {min(ours):.0%}); "
              + seen)
    if not kept:
        return Verdict("does not reproduce", reason, facts)
    return Verdict("reproduces" if caught else "partly", reason, facts)


def regime(step_x_floor: Mapping[str, float], verify_steps: Mapping[str, float], *,
           paired: Mapping[str, tuple[float, float, float]] | None = None, near: float = 1.3, free: float = 1.2,
           tokens: int = 4) -> Verdict:
    """Leviathan et al. Sec. 3.5, Chen et al. Sec. 1: batch-1 decoding is memory-bound, so a verification of a few
    tokens costs about one decode step. `step_x_floor`: each regime's decode step as a multiple of the memory floor
    (its bytes over a bandwidth probe's reading); `verify_steps`: its forward of `tokens` tokens in decode steps.
    Judged on the regime with the fastest step. `paired`: a regime's step over a read of its own bytes timed beside
    it, round by round (estimate, lo, hi; `timing.x_read_summary`); where the fastest regime has one, it is the
    multiple judged (a probe taken minutes apart can be off by the machine's drift), the probe's beside it.

    reproduces: that step is within `near` x the floor and the verification within `free` steps; partly: one of
    the two; does not reproduce: neither (the claim is then untested in its regime: the step is mostly not reads)."""
    known = {r: _num(x) for r, x in step_x_floor.items() if not math.isnan(_num(x))}
    if not known:
        return Verdict("not testable", "no decode step was measured against the memory floor")
    best = min(known, key=known.get)
    probe, v = known[best], _num(verify_steps.get(best))
    beside = (paired or {}).get(best)
    is_paired = beside is not None and not math.isnan(_num(beside[0]))
    x = _num(beside[0]) if is_paired else probe
    others = ", ".join(f"{r} {known[r]:.2f}x" for r in known if r != best)
    is_near, is_free = x <= near, v <= free
    if not is_paired:
        floor = (f"{x:.2f}x the memory floor, {'within' if is_near else 'beyond'} {near}x"
                 f"{f' ({others})' if others else ''}")
    else:
        floor = (f"{x:.2f}x [{_num(beside[1]):.2f}, {_num(beside[2]):.2f}] a read of its bytes timed beside it, "
                 f"{'within' if is_near else 'beyond'} {near}x ({probe:.2f}x the probe's floor"
                 f"{f'; {others}' if others else ''})")
    reason = (f"the fastest decode step ({best}) is {floor}; a {tokens}-token verification there costs {v:.2f} steps, "
              f"{'about one step' if is_free else 'not free'} (at most {free})")
    facts = dict(regime=best, x_floor=x, x_probe=probe, paired=is_paired, verify_steps=v, near=is_near,
                 free=is_free)
    if is_near and is_free:
        return Verdict("reproduces", reason, facts)
    return Verdict("partly" if is_near or is_free else "does not reproduce", reason, facts)


def spare_compute(verify_few: float, verify_many: float, ratios: Mapping[str, tuple[float, float, float]], *,
                  tokens: int, threads: tuple[int, int] = (1, 2), margin: float = 0.05) -> Verdict:
    """06's hypothesis: with fewer CPU threads there is less spare compute, so a forward of `tokens` tokens costs
    more decode steps and speculative decoding gains less. `verify_few`, `verify_many`: that forward in decode steps
    with `threads[0]` and `threads[1]` threads; `ratios`: per (draft, gamma) cell, the speedup with fewer threads
    over the speedup with more, paired on the same prompts (estimate, lo, hi; `sweep.thread_effect`). The forward
    costs more (fewer) steps where it exceeds (falls below) the other by more than `margin`, a relative tolerance
    for single readings. The data can agree with the hypothesis; they do not isolate spare compute as the cause.

    reproduces (the data agree): the forward costs more steps with fewer threads and some cell's speedup is
    reliably lower, none reliably higher; does not reproduce (the data contradict it): the forward costs no more
    steps and no cell is reliably lower; partly: the rest (the cost and the speedups disagree, the cells point both
    ways, or the forward costs more while no cell is distinguishable); not testable: a cost missing, no cell, or no
    cell with an interval."""
    few, many = _num(verify_few), _num(verify_many)
    if math.isnan(few) or math.isnan(many) or not ratios:
        return Verdict("not testable", "the verification was not measured at both thread counts, or no cell ran")
    sides = {k: interval_side(lo, hi) for k, (_, lo, hi) in ratios.items()}
    if all(side == "no interval" for side in sides.values()):
        return Verdict("not testable", f"none of the {len(ratios)} cells has an interval (one prompt each)")
    costlier, cheaper = few > many * (1 + margin), few < many * (1 - margin)
    lower = [k for k, side in sides.items() if side == "below"]
    higher = [k for k, side in sides.items() if side == "above"]
    est = [_num(v[0]) for v in ratios.values()]
    how = "more steps than" if costlier else "fewer steps than" if cheaper else "about as many steps as"
    reason = (f"a {tokens}-token forward costs {few:.2f} decode steps on {threads[0]} thread(s), {how} on "
              f"{threads[1]} threads ({many:.2f}; tolerance {margin:.0%}); the speedup on {threads[0]} thread(s) over "
              f"the speedup on {threads[1]} threads, paired on the same prompts, is {min(est):.2f}-{max(est):.2f}: "
              f"reliably lower in {len(lower)} of {len(ratios)} cells, reliably higher in {len(higher)}")
    facts = dict(costlier=costlier, cheaper=cheaper, lower=lower, higher=higher)
    if costlier and lower and not higher:
        return Verdict("reproduces", reason + "; the data agree with the hypothesis", facts)
    if not costlier and not lower:
        return Verdict("does not reproduce", reason + "; the data contradict the hypothesis", facts)
    return Verdict("partly", reason + "; the data neither agree nor contradict throughout", facts)


def engine_audit(p_values: Sequence[float], detectable_shift: float, near_ties: int, other_divergences: int,
                 *, compared: int, alpha: float = 0.05, left_out: Sequence[str] = (), engine_flips: int = 0
                 ) -> Verdict:
    """An engine's speculative decoding (`specrepro.audit`): is it lossless? `p_values`: the distribution tests of
    speculation on against off (one per prompt and setting, Bonferroni-corrected here); `detectable_shift`: the
    largest over them of the total-variation shift each detects at 80% power; `near_ties` / `other_divergences`:
    greedy outputs (speculation on, alone or concurrent) that differ from the reference, classified by the
    reference's logit gap at the first divergence; `engine_flips`: those of `other_divergences` at a token the
    engine also changed with speculation off (its own numerics, batching say, reach across that gap without any
    speculation: the divergence is consistent with numerics, not proven to come from them); `compared`: greedy
    outputs compared; `left_out`: the tests that could not speak about speculation and why
    (`audit.speculation_tests`), named in the reason.

    differs: not explained by numerics: a distribution test rejects, or a greedy output diverges where the
    reference's top two logits are not tied and the engine without speculation never flipped that token; differs:
    numerics only: every divergence is at a near-tie or at such a token; lossless at this power: neither (with the
    shift the design could have missed)."""
    if not 0 <= engine_flips <= other_divergences:
        raise ValueError(f"engine_flips counts among other_divergences: got {engine_flips} of {other_divergences}")
    ps = [_num(p) for p in p_values]
    if not ps and not compared:
        return Verdict("not testable", "no distribution test and no greedy comparison ran")
    k = max(1, len(ps))
    rejected = [p for p in ps if p * k < alpha]
    smallest = min(ps) if ps else float("nan")
    facts = dict(tests=len(ps), left_out=len(left_out),
                 rejected=len(rejected), smallest_p=smallest, detectable_shift=detectable_shift,
                 near_ties=near_ties, other_divergences=other_divergences, engine_flips=engine_flips,
                 compared=compared)
    dist = (f"{len(rejected)} of {len(ps)} distribution tests reject at {alpha} (Bonferroni; smallest p "
            f"{smallest:.3g})" if ps else "no distribution test ran")
    if left_out:
        dist += f" ({len(left_out)} left out: {'; '.join(left_out)})"
    unexplained = other_divergences - engine_flips
    flips = f"{engine_flips} at tokens the engine also flipped with speculation off, " if engine_flips else ""
    greedy = (f"{near_ties + other_divergences} of {compared} greedy outputs diverge ({near_ties} at near-ties, "
              f"{flips}{unexplained} elsewhere)")
    if rejected or unexplained:
        return Verdict("differs: not explained by numerics", f"{dist}; {greedy}", facts)
    if near_ties or engine_flips:
        return Verdict("differs: numerics only", f"{dist}; {greedy}", facts)
    power = (f"; a shift of {detectable_shift:.3f} in total variation would have been detected with 80% power"
             if ps else "")
    return Verdict("lossless at this power", f"{dist}; {greedy}{power}", facts)


def engines(audits: Mapping[str, str], *, planted: Mapping[str, str] | None = None,
            batched: Mapping[str, bool] | None = None) -> Verdict:
    """The seed post (after Zhang et al. 2025): "some engines break the distribution guarantee outright once batch
    size exceeds one". `audits`: each audited engine and mode (ours excluded) -> its `engine_audit` label;
    `planted`: the planted bugs' labels (the audit must catch them, or its passes mean nothing); `batched`: each
    mode -> whether its greedy outputs, speculation on, changed beyond numerics when requests ran concurrently
    (batch > 1) while the same engine with speculation off did not (`audit.batch_break`): what ties a difference
    to the batch rather than to speculation alone.

    reproduces: an audited mode differs in a way numerics do not explain, and some mode's break is tied to batch > 1;
    partly: modes differ beyond numerics, but none is shown to break only once requests share a batch (or `batched`
    is not given); does not reproduce: none differs, and every planted bug was caught; not testable: nothing
    audited, or a planted bug went unseen."""
    planted = planted or {}
    missed = [m for m, label in planted.items() if label != "differs: not explained by numerics"]
    if not audits or missed:
        why = (f"the audit missed the planted bug(s) {missed}" if missed else "no engine was audited")
        return Verdict("not testable", why, dict(missed=missed))
    broken = [m for m, label in audits.items() if label == "differs: not explained by numerics"]
    numerics_only = [m for m, label in audits.items() if label == "differs: numerics only"]
    in_batch = [m for m, b in (batched or {}).items() if b and m in audits]
    facts = dict(audited=len(audits), broken=broken, numerics_only=numerics_only, batch_breaks=in_batch)
    caught = f"; the planted bug{'s' if len(planted) > 1 else ''} failed the same audit" if planted else ""
    if broken:
        where = (f"; tied to batch > 1 (greedy outputs change under concurrency with speculation on, not off): "
                 f"{', '.join(in_batch)}" if in_batch else
                 "; none shown to break only once requests share a batch" if batched is not None else
                 "; whether a break is the batch's was not tested")
        return Verdict("reproduces" if in_batch else "partly", f"{len(broken)} of {len(audits)} audited modes "
                       f"differ beyond numerics: {', '.join(broken)}{where}{caught}", facts)
    by_numerics = f" ({len(numerics_only)} by numerics only)" if numerics_only else ""
    return Verdict("does not reproduce", f"none of the {len(audits)} audited modes ({', '.join(audits)}) differs "
                   f"beyond numerics{by_numerics}{caught}", facts)
