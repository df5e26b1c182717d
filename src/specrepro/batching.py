"""Batch > 1, measured: throughput and latency of batched autoregressive and speculative decoding, and what a
verification forward costs as the batch grows.

The seed's caveat: both papers measured at batch size 1, and "if you're serving large batches, don't expect these
numbers". Leviathan et al. 2022 (Sec. 3.4) assume "enough compute resources to support the increased
concurrency": a verification forward of gamma + 1 tokens costs about one decode step only while a decode step is
bound by reading the weights, not by arithmetic. A batch of B rows multiplies a step's arithmetic by B for the
same weight reads, so the step moves right on the roofline; once B (gamma + 1) rows no longer ride along for free,
verification costs more than a step and speculation stops paying. Zhang et al. 2025 (arXiv 2510.22876) measure
up to 3x throughput for batched speculative decoding at batch 8 over batch 1 on a GPU.

`sweep` runs both methods on the same prompts at each batch size (autoregressive, then speculative, batch size by
batch size, so a drift in machine load hits both alike) and keeps every output for the equivalence checker.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import intervals
from .generate import GenerationResult, decode_in_batches, pooled_alpha
from .intervals import Interval
from .timing import forward_seconds


@dataclass
class BatchedRun:
    """One method over a prompt set in batches of `batch_size`: each batch's decode time and new tokens."""

    method: str
    batch_size: int
    outputs: list[list[int]]  # each prompt's new tokens, in prompt order
    results: list[GenerationResult]  # one per batch

    @property
    def seconds(self) -> list[float]:
        """Per batch: the decoding loop's wall time (prefill included)."""
        return [sum(r.stats.iteration_seconds) for r in self.results]

    @property
    def tokens(self) -> list[int]:
        return [r.stats.new_tokens for r in self.results]

    @property
    def tokens_per_second(self) -> float:
        return sum(self.tokens) / sum(self.seconds)

    @property
    def ms_per_token(self) -> float:
        """Latency: the time a row waits per token of its own (a batch's time over its rows' mean new tokens)."""
        return 1e3 * sum(self.seconds) / sum(t / len(r.rows) for t, r in zip(self.tokens, self.results))

    @property
    def alpha(self) -> float | None:
        rows = [s for r in self.results for s in r.rows if s.proposed]
        return pooled_alpha(rows) if rows else None


def sweep(target, draft, prompts: list[list[int]], *, batch_sizes: list[int], gamma: int, max_new_tokens: int,
          pad_token_id: int, eos_token_id: int | None = None, log=None) -> list[BatchedRun]:
    """Greedy autoregressive and speculative decoding of `prompts` at every batch size."""
    runs = []
    for b in batch_sizes:
        for method, d in (("autoregressive", None), ("speculative", draft)):
            outputs, results = decode_in_batches(target, d, prompts, batch_size=b, gamma=gamma,
                                                 max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
                                                 eos_token_id=eos_token_id)
            runs.append(BatchedRun(method, b, outputs, results))
            if log is not None:
                log(f"batch {b:>2} {method:<14} {runs[-1].tokens_per_second:6.1f} tokens/s")
    return runs


def speedup_interval(ar: BatchedRun, spec: BatchedRun, *, n_boot: int = 2000, seed: int = 0) -> Interval:
    """Speculative over autoregressive time per token at one batch size, bootstrapped over the batches (the units
    both methods decoded alike; a single batch gets NaN bounds): `intervals.speedup_interval` over batches."""
    if ar.batch_size != spec.batch_size or len(ar.results) != len(spec.results):
        raise ValueError("compare runs of one batch size over the same prompts")
    return intervals.speedup_interval(ar.seconds, ar.tokens, spec.seconds, spec.tokens, n_boot=n_boot, seed=seed)


def verify_cost(model, batch_sizes: list[int], gamma: int, *, prefix_len: int = 64, repeats: int = 3) -> list[dict]:
    """At each batch size: the decode step's time, and a verification forward of gamma + 1 tokens per row in decode
    steps (forwards on a cache of `prefix_len` tokens per row, medians of `repeats`)."""
    rows = []
    for b in batch_sizes:
        step = forward_seconds(model, prefix_len, 1, repeats=repeats, batch_size=b)
        verify = forward_seconds(model, prefix_len, gamma + 1, repeats=repeats, batch_size=b)
        rows.append(dict(batch_size=b, decode_step_ms=1e3 * step, verify_ms=1e3 * verify,
                         verify_steps=verify / step, step_ms_per_row=1e3 * step / b))
    return rows


def crossover(runs: list[BatchedRun]) -> int | None:
    """The batch size from which batched speculative decoding is no faster than batched autoregressive decoding at
    that and every larger batch size measured (None if it is faster at the largest)."""
    by_b = {(r.method, r.batch_size): r for r in runs}
    sizes = sorted({r.batch_size for r in runs})
    slower = [by_b["speculative", b].tokens_per_second <= by_b["autoregressive", b].tokens_per_second for b in sizes]
    if not slower[-1]:
        return None
    first = len(slower)
    while first > 0 and slower[first - 1]:
        first -= 1
    return sizes[first]
