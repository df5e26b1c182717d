"""Quality with power: does speculative decoding change what the target writes?

Chen et al. 2023 (arXiv 2302.01318), Table 1, put a quality column beside each speedup (HumanEval pass@100,
XSum ROUGE-2) and read "unchanged" off two close numbers. Here "unchanged" is a finding with a stated power:
both methods answer the same >= 100 prompts per task, each answer is scored (`specrepro.data.answer_scores`), and
the per-prompt differences go through a paired equivalence test (TOST, `numerics.paired_equivalence_test`)
against a margin fixed before the run, with the power of that design at a true difference of zero beside it.

The answers are decoded in left-padded batches (`generate.decode_in_batches`), which makes hundreds of long
answers affordable on a CPU: each row decodes as it would alone (05-batch checks greedy rows against batch 1 on the
real pair; tests/test_batch.py and test_equivalence.py check sampled rows' distributions and draws on tiny pairs). When
sampling, prompt i draws from its own generator (seed + i) under either method; the two methods read their
uniforms differently, so their samples differ even so (04-numerics).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .data import assertion_program, words
from .generate import decode_in_batches
from .intervals import Interval, bootstrap
from .numerics import Equivalence, detectable_difference, equivalence_power, paired_equivalence_test
from .sampling import SamplingConfig
from .verdicts import IDENTICAL_SHARE


def answers(target, draft, prompts: list[list[int]], *, gamma: int, max_new_tokens: int, cfg: SamplingConfig,
            seed: int, batch_size: int, pad_token_id: int, eos_token_id: int | None) -> list[dict]:
    """Each prompt's answer from one method (speculative with `draft`, autoregressive without): its new tokens and
    whether it was cut at `max_new_tokens` before an EOS token (truncated)."""
    outs, _ = decode_in_batches(target, draft, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                gamma=gamma, pad_token_id=pad_token_id, eos_token_id=eos_token_id, cfg=cfg,
                                seed=seed if cfg.temperature > 0 else None)
    return [dict(new_ids=ids, new_tokens=len(ids), truncated=is_truncated(ids, max_new_tokens, eos_token_id))
            for ids in outs]


def is_truncated(new_ids: list[int], max_new_tokens: int, eos_token_id: int | None) -> bool:
    """An answer is truncated when it used all `max_new_tokens` and did not end with EOS."""
    return len(new_ids) >= max_new_tokens and (not new_ids or new_ids[-1] != eos_token_id)


@dataclass(frozen=True)
class QualityComparison:
    """One metric, two methods on the same prompts: each method's mean with its bootstrap interval over prompts,
    the paired TOST of b - a, and that test's power."""

    metric: str
    a: Interval
    b: Interval
    test: Equivalence
    power: float  # of the TOST with these n and margin at a true difference of 0, the methods' scores taken as
    # independent across prompts (sd of a difference = sqrt(var a + var b)): what the design could detect, not
    # the observed spread of the differences (0 when greedy outputs coincide), which would only echo the p-value
    identical: float  # share of prompts on which both methods wrote the same tokens (nan when not given)
    detectable: float  # the smallest true difference a two-sided paired test at `level` sees at 80% power, same sd

    @property
    def verdict(self) -> str:
        lo, hi = self.test.ci
        within = f"difference {self.test.mean_diff:+.3f}, {1 - 2 * self.test.level:.0%} CI [{lo:+.3f}, {hi:+.3f}]"
        if self.test.equivalent:
            return (f"equivalent within +-{self.test.margin} ({within}; TOST p = {self.test.p_value:.2g}, "
                    f"power {self.power:.2f})")
        return (f"not shown equivalent within +-{self.test.margin} ({within}; TOST p = {self.test.p_value:.2g}, "
                f"power {self.power:.2f})")


def compare(a, b, *, metric: str, margin: float, level: float = 0.05, identical=None, n_boot: int = 2000,
            seed: int = 0) -> QualityComparison:
    """Compare per-prompt scores `a` (reference method) and `b` (same prompts, same order) of one metric."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    test = paired_equivalence_test(a, b, margin=margin, level=level)
    # pairing only helps when a prompt's two scores correlate positively, so this is a lower bound then
    sd_design = float(np.sqrt(np.var(a, ddof=1) + np.var(b, ddof=1)))
    power = equivalence_power(sd_design, a.size, margin=margin, level=level)
    detectable = detectable_difference(sd_design, a.size, level=level)
    same = float(np.mean(identical)) if identical is not None else float("nan")
    return QualityComparison(metric, bootstrap(np.mean, a, n_boot=n_boot, seed=seed),
                             bootstrap(np.mean, b, n_boot=n_boot, seed=seed), test, power, same,
                             detectable)


def margin_in_units(task: str, examples: list[dict], margin: float) -> dict[str, float]:
    """What a margin on a task's primary metric amounts to in the things the metric counts, averaged over the
    task's prompts: the scale a margin is justified from (the metric runs from 0 to 1 on every prompt).

    code (share of a problem's assert statements passed): `per_prompt` assert statements per problem, the margin
    `margin * per_prompt` of them; text (ROUGE-1 F1 against the next lines): `per_prompt` words per reference, the
    margin about `margin * per_prompt` shared words (F1 is shared words over length when answer and reference are
    of about one length)."""
    if not examples:
        raise ValueError("margin_in_units needs the task's examples, got none")
    if task == "code":
        counts = [assertion_program(ex, "")[1] for ex in examples]
    elif task == "text":
        counts = [len(words(ex["reference"])) for ex in examples]
    else:
        raise ValueError(f"task must be 'code' or 'text', got {task!r}")
    per_prompt = float(np.mean(counts))
    return dict(margin=margin, per_prompt=per_prompt, units=margin * per_prompt, min=float(min(counts)),
                max=float(max(counts)))


def _same_tokens(summary: dict) -> int:
    """Prompts on which both methods wrote the same tokens (`equivalence.evaluate`'s summary)."""
    return round(summary["exact_match"] * summary["prompts"])


def greedy_line(task: str, summary: dict, divergences, metric: str, autoregressive: float, speculative: float,
                paper_move: float | None = None) -> str:
    """03's Conclusions line for a greedy quality cell: identical tokens need no test, so the line counts the prompts
    on which both methods wrote the same tokens (`summary`: `equivalence.evaluate`'s, with `prompts` and
    `exact_match`) and names where each answer that differs parts (`divergences`: records with task_id, position,
    kind and gap; a gap that was not computed says so), beside both methods' mean `metric` and, where given, the
    paper's movement on its own metric (`paper_move`: speculative minus autoregressive)."""
    same = _same_tokens(summary)
    divergences = list(divergences)

    def gap(d):
        g = d.get("gap")
        return "top-2 logit gap not computed" if g is None or g != g else f"top-2 logit gap {g:.2g}"

    return (f"- {task}, greedy: the two methods wrote the same tokens for {same} of {summary['prompts']} prompts"
            + ("" if not divergences else f"; the {len(divergences)} that differ part at " + ", ".join(
                f"{d['task_id']} token {d['position']} ({d['kind']}, {gap(d)})" for d in divergences))
            + f" ({metric} {autoregressive:.3f} autoregressive, {speculative:.3f} speculative"
            + ("" if paper_move is None else f"; Chen et al. moved {paper_move:+.3f} on their metric") + ")")


def cell_line(task: str, decoding: str, q, *, summary: dict | None = None, divergences=(),
              paper_move: float | None = None) -> str:
    """03's Conclusions line for one quality cell (`q`: a row of `quality.csv`, 03's columns). Where a greedy
    cell's two methods wrote identical answers on at least `verdicts.IDENTICAL_SHARE` of the prompts and `summary`
    (`equivalence.evaluate`'s token-level comparison) is given, the identical outputs are reported as such
    (`greedy_line`): an equivalence test passes there because there is nothing to test. Otherwise the equivalence
    test: both means with their intervals, TOST at the margin, its power, the smallest difference the design detects
    at 80% power beside the paper's movement, flagged underpowered where that exceeds the margin (and, for a greedy
    cell with its `summary`, how many answers differ and how many of them part at near-ties)."""
    if decoding == "greedy" and summary is not None and q.identical >= IDENTICAL_SHARE:
        return greedy_line(task, summary, divergences, q.metric, q.autoregressive, q.speculative, paper_move)
    tokens = ("" if summary is None else f"; the same tokens for {_same_tokens(summary)} "
              f"of {summary['prompts']} prompts, {summary.get('near_ties', 0)} of the others parting at a near-tie")
    return (f"- {task}, {decoding}: {q.metric} {q.autoregressive:.3f} [{q.ar_lo:.3f}, {q.ar_hi:.3f}] autoregressive, "
            f"{q.speculative:.3f} [{q.spec_lo:.3f}, {q.spec_hi:.3f}] speculative over {int(q.n_prompts)} prompts: "
            f"{'equivalent' if q.equivalent else 'not shown equivalent'} within +-{q.margin:g} (difference "
            f"{q.mean_diff:+.3f}, 90% CI [{q.diff_lo:+.3f}, {q.diff_hi:+.3f}], TOST p = {q.tost_p:.2g}, power "
            f"{q.power:.2f}; the design detects {q.detectable:.3f} at 80% power"
            + ("" if paper_move is None else f", Chen et al. moved {paper_move:+.3f} on their metric")
            + ("; underpowered for this margin" if q.detectable > q.margin else "") + "); identical answers "
            f"{q.identical:.0%}, truncated {q.truncated_ar:.0%} / {q.truncated_spec:.0%}" + tokens)
