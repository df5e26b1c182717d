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
batch size, so a drift in machine load hits both alike) and keeps every output for the equivalence checker. Each
method runs at each batch size with the linear-layer kernel `verify_cost` measured fastest for its forward there
(a 1-token step of B rows for autoregressive decoding, a (gamma + 1)-token verification for speculative), chosen
apart from the timed runs and named in each `BatchedRun`; `min_batches` gives the large batch sizes more prompts,
so that every batch size's interval rests on several batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from . import intervals
from .generate import GenerationResult, decode_in_batches, pooled_alpha
from .intervals import Interval
from .kernels import use_kernel, use_kernels
from .timing import forward_seconds


@dataclass
class BatchedRun:
    """One method over a prompt set in batches of `batch_size`: each batch's decode time and new tokens."""

    method: str
    batch_size: int
    outputs: list[list[int]]  # each prompt's new tokens, in prompt order
    results: list[GenerationResult]  # one per batch
    kernel: str = "stock"  # the linear-layer kernel it ran with (`kernels.KERNELS`)

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
    def first_seconds(self) -> list[float]:
        """Per batch: the first iteration's wall time. It holds the prompts' prefill, every row left-padded to the
        batch's longest prompt, and the batch's first new token(s)."""
        return [r.stats.iteration_seconds[0] if r.stats.iteration_seconds else 0.0 for r in self.results]

    @property
    def first_share(self) -> float:
        """The share of the decoding time spent in first iterations (prefill included)."""
        return sum(self.first_seconds) / sum(self.seconds)

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens per second after each batch's first iteration: the decoding steps alone, prefill excluded. A row
        makes min(its new tokens, accepted drafts + 1) tokens in the first iteration (one, autoregressively)."""
        first = sum(min(s.new_tokens, (s.accepted[0] if s.accepted else 0) + 1) for r in self.results for s in r.rows)
        seconds = sum(self.seconds) - sum(self.first_seconds)
        return (sum(self.tokens) - first) / seconds if seconds > 0 else float("nan")  # NaN: every batch ended at once

    @property
    def pad_share(self) -> float:
        """The share of prompt slots that were padding: 1 - real prompt tokens / (rows x longest prompt), pooled over
        batches."""
        slots = sum(r.stats.prompt_len * len(r.rows) for r in self.results)
        return 1 - sum(s.prompt_len for r in self.results for s in r.rows) / slots

    @property
    def alpha(self) -> float | None:
        rows = [s for r in self.results for s in r.rows if s.proposed]
        return pooled_alpha(rows) if rows else None


def sweep(target, draft, prompts: list[list[int]], *, batch_sizes: list[int], gamma: int, max_new_tokens: int,
          pad_token_id: int, eos_token_id: int | None = None, log=None,
          kernels: Mapping[int, Mapping[str, str]] | None = None, n_prompts: int | None = None,
          min_batches: int = 1) -> list[BatchedRun]:
    """Greedy autoregressive and speculative decoding at every batch size B, of the first max(n_prompts,
    min_batches * B) of `prompts` (all of them by default; `n_prompts` defaults to all), so the prompts every
    batch size shares come first. `kernels[B][method]` names the kernel each method runs with at B (default: the
    models' kernels as they are); the target and a model draft are switched to it, and back to stock at the end."""
    base = len(prompts) if n_prompts is None else n_prompts
    if min_batches < 1 or base < 1:
        raise ValueError(f"need min_batches >= 1 and n_prompts >= 1, got {min_batches}, {base}")
    runs = []
    for b in batch_sizes:
        use = prompts[:max(base, min_batches * b)]
        for method, d in (("autoregressive", None), ("speculative", draft)):
            kernel = kernels[b][method] if kernels else "stock"
            if kernels:
                use_kernels((target, d), kernel)
            outputs, results = decode_in_batches(target, d, use, batch_size=b, gamma=gamma,
                                                 max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
                                                 eos_token_id=eos_token_id)
            runs.append(BatchedRun(method, b, outputs, results, kernel))
            if log is not None:
                log(f"batch {b:>2} {method:<14} {kernel:<9} {len(use):>3} prompts "
                    f"{runs[-1].tokens_per_second:6.1f} tokens/s")
    if kernels:
        use_kernels((target, draft), "stock")
    return runs


def speedup_interval(ar: BatchedRun, spec: BatchedRun, *, n_boot: int = 2000, seed: int = 0) -> Interval:
    """Speculative over autoregressive time per token at one batch size, bootstrapped over the batches (the units
    both methods decoded alike; a single batch gets NaN bounds): `intervals.speedup_interval` over batches."""
    if ar.batch_size != spec.batch_size or len(ar.results) != len(spec.results):
        raise ValueError("compare runs of one batch size over the same prompts")
    return intervals.speedup_interval(ar.seconds, ar.tokens, spec.seconds, spec.tokens, n_boot=n_boot, seed=seed)


def verify_cost(model, batch_sizes: list[int], gamma: int, *, prefix_len: int = 64, repeats: int = 3,
                kernels: tuple[str, ...] = ("stock",)) -> list[dict]:
    """At each batch size, with each kernel: a decode step's time and a verification forward of gamma + 1 tokens
    per row (forwards on a cache of `prefix_len` tokens per row, medians of `repeats`), in columns
    `decode_step_ms_<kernel>` and `verify_ms_<kernel>`; then the fastest kernel for each (`ar_kernel`,
    `spec_kernel`), their times (`decode_step_ms`, `verify_ms`) and the verification in decode steps of the fastest
    step (`verify_steps`). The model is left with the stock kernel."""
    rows = []
    for b in batch_sizes:
        row = dict(batch_size=b)
        for k in kernels:
            use_kernel(model, k)
            row[f"decode_step_ms_{k}"] = 1e3 * forward_seconds(model, prefix_len, 1, repeats=repeats, batch_size=b)
            row[f"verify_ms_{k}"] = 1e3 * forward_seconds(model, prefix_len, gamma + 1, repeats=repeats,
                                                          batch_size=b)
        ar = min(kernels, key=lambda k, row=row: row[f"decode_step_ms_{k}"])
        spec = min(kernels, key=lambda k, row=row: row[f"verify_ms_{k}"])
        step, verify = row[f"decode_step_ms_{ar}"], row[f"verify_ms_{spec}"]
        rows.append(row | dict(ar_kernel=ar, spec_kernel=spec, decode_step_ms=step, verify_ms=verify,
                               verify_steps=verify / step, step_ms_per_row=step / b))
    use_kernel(model, "stock")
    return rows


def chosen_kernels(costs: list[dict]) -> dict[int, dict[str, str]]:
    """{batch size: {"autoregressive": kernel, "speculative": kernel}} from `verify_cost` rows: the `kernels`
    argument of `sweep`."""
    return {r["batch_size"]: {"autoregressive": r["ar_kernel"], "speculative": r["spec_kernel"]} for r in costs}


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
