"""Timing that a reviewer would trust: warm-up, repeats, medians with spread, device synchronisation, threads.

Machines are shared and noisy, so speed claims in this package are ratios of measurements taken side by side in
one process, interleaved (method A, method B, A, B, ...) so that drifts in machine load hit both alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .flops import flops_config, forward_bytes
from .intervals import bootstrap
from .kvcache import make_cache, model_forward


def synchronize(device: str | torch.device | None = None) -> None:
    """Wait for queued device work, so a timer measures it (a no-op on CPU)."""
    device = torch.device(device) if device is not None else None
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        torch.cuda.synchronize(device)


def timed(fn, device=None) -> tuple[float, object]:
    """(seconds, result) of one call of fn, synchronised before and after on a GPU."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return time.perf_counter() - t0, out


@dataclass
class Timing:
    """Wall times (seconds) of repeated runs of one thing."""

    name: str
    seconds: list[float] = field(default_factory=list)
    units: list[int] = field(default_factory=list)  # e.g. tokens produced by each run
    threads: int = field(default_factory=torch.get_num_threads)

    @property
    def per_unit(self) -> list[float]:
        return [s / u for s, u in zip(self.seconds, self.units)]

    @property
    def median_per_unit(self) -> float:
        """Median over runs of seconds per unit (e.g. seconds per output token)."""
        return statistics.median(self.per_unit)


def time_interleaved(fns: dict[str, Callable[[], int]], *, repeats: int = 3, warmup: int = 1,
                     device=None) -> dict[str, Timing]:
    """Run each fn `warmup` times, then `repeats` rounds of all fns in turn, timing each call.

    Each fn returns the number of units it produced (tokens), so results come as time per unit as well.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out = {name: Timing(name) for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            secs, units = timed(fn, device)
            out[name].seconds.append(secs)
            out[name].units.append(int(units))
    return out


@contextmanager
def forward_log(model, device=None):
    """Record every forward of `model` while the context is open, whoever calls it (our loops or transformers'
    generate): yields a list that fills with (tokens fed, seconds) per forward. The hooks cost microseconds; on a
    GPU they synchronise before and after each forward so that the seconds hold its kernels."""
    log: list[tuple[int, float]] = []
    started: list[float] = []

    def before(module, args, kwargs):
        synchronize(device)
        started.append(time.perf_counter())

    def after(module, args, kwargs, output):
        synchronize(device)
        ids = kwargs.get("input_ids", args[0] if args else None)
        log.append((int(ids.shape[1]) if ids is not None else 0, time.perf_counter() - started.pop()))

    hooks = [model.register_forward_pre_hook(before, with_kwargs=True),
             model.register_forward_hook(after, with_kwargs=True)]
    try:
        yield log
    finally:
        for h in hooks:
            h.remove()


@torch.no_grad()
def forward_seconds(model, prefix_len: int, new_tokens: int, *, repeats: int = 5, device=None,
                    batch_size: int = 1) -> float:
    """Median time of one forward of `new_tokens` tokens on a KV cache of `prefix_len` tokens, for `batch_size`
    rows (the cost of one decode step for new_tokens = 1, of one verification of gamma drafts for new_tokens =
    gamma + 1)."""
    dev = next(model.parameters()).device
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(vocab, (batch_size, prefix_len), generator=g).to(dev)
    new = torch.randint(vocab, (batch_size, new_tokens), generator=g).to(dev)
    cache = make_cache(model)
    model_forward(model, prefix, cache, logits_to_keep=1)
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        times.append(timed(lambda: model_forward(model, new, cache, logits_to_keep=new_tokens), device)[0])
        cache.crop(-new_tokens)
    return statistics.median(times[1:])


def op_profile(fn: Callable[[], object], *, repeats: int = 10, top: int = 12) -> list[dict]:
    """Where the time of `fn()` goes, by operator: `fn` run `repeats` times under torch's profiler (after one
    unprofiled warm-up call). One dict per operator, the `top` largest by self time, then one row "other" for the
    rest: `op`, `ms` (self time per call of fn), `calls` (per call of fn) and `share` of the profiled time. Self
    times leave each operator's children out, so the rows add up to the whole; a compiled graph appears as its own
    row (inductor's fused kernels and its Python wrapper) beside the opaque operators it calls. The profiler adds a
    little time per operator, so read shares and large rows, not a total to compare with an unprofiled timing."""
    from torch.profiler import ProfilerActivity, profile

    if repeats < 1 or top < 1:
        raise ValueError(f"repeats and top must be >= 1, got repeats={repeats}, top={top}")
    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            fn()
    events = sorted(((e.key, e.self_cpu_time_total, e.count) for e in prof.key_averages()), key=lambda e: -e[1])
    total = sum(t for _, t, _ in events) or 1.0
    groups = events[:top]
    if events[top:]:
        groups.append(("other", sum(t for _, t, _ in events[top:]), sum(c for *_, c in events[top:])))
    return [dict(op=k, ms=t / 1e3 / repeats, calls=c / repeats, share=t / total) for k, t, c in groups]


ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")  # what sets a CPU's kernels
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # a CPU that reports one of these computes bfloat16 products natively


def cpu_features(cpuinfo: str | Path = "/proc/cpuinfo", names: tuple[str, ...] = ISA_FLAGS) -> list[str]:
    """The instruction sets of `names` that this CPU reports (the `flags` line of /proc/cpuinfo), in the order of
    `names`; [] where it cannot be read (not Linux, or an ARM `Features` line naming none of them). The development
    hosts differ in exactly these (AVX2 only; AVX-512 with bf16; AMX), so every environment.json records them."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    have = set(line.partition(":")[2].split())
    return [n for n in names if n in have]


def native_bf16(device: str | torch.device = "cpu", features: list[str] | None = None) -> bool:
    """Whether `device` computes bfloat16 matrix products natively: a CUDA GPU of compute capability 8.0 or more
    (Ampere on), or a CPU reporting AVX-512 bf16 or AMX bf16 (`features`, default `cpu_features()`). Elsewhere
    bfloat16 is emulated and slower than float32, so a notebook skips its bfloat16 runs there."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 8
    if device.type != "cpu":
        return False
    return any(f in BF16_FLAGS for f in (cpu_features() if features is None else features))


def peak_matmul_flops(device="cpu", n: int = 2048, dtype=torch.float32, repeats: int = 5) -> float:
    """Achieved FLOP/s of a large square matmul: the roofline's compute ceiling on this device and thread count."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up
    times = [timed(lambda: a @ b, device)[0] for _ in range(repeats)]
    return 2 * n ** 3 / min(times)


def memory_bandwidth(device="cpu", n_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """Achieved bytes/s of reading a buffer far larger than the caches (a reduction over `n_bytes` of float32):
    the roofline's memory slope."""
    x = torch.ones(n_bytes // 4, device=device, dtype=torch.float32)
    x.sum()  # warm-up
    times = [timed(x.sum, device)[0] for _ in range(repeats)]
    return n_bytes / min(times)


def read_ms(tensors, device=None) -> float:
    """Milliseconds of one read of every tensor of `tensors` where it lies (a sum over each, nothing copied): the
    floor of any pass that must read those bytes, at the speed the memory gives them now. Unlike
    `memory_bandwidth`, which reads a buffer it has just allocated, this reads the bytes a model's forward reads, in
    the pages they sit in: on the 2-core AMD EPYC host the target's weights read in place at 75-90% of the speed of
    a fresh 1 GiB buffer, the two moving together by up to 2x within seconds (8 readings 5 s apart, the buffer at
    34-62 GB/s; an ad hoc check while building `paired_with_read`)."""
    def one():
        for x in tensors:
            x.sum()
    return 1e3 * timed(one, device)[0]


def paired_with_read(contenders: dict[str, Callable[[], float]], read: Callable[[], float], *, rounds: int = 5,
                     reads: int = 3) -> list[dict]:
    """Each contender's time beside a read of the bytes it must read, taken just before and just after it.

    `contenders`: name -> a callable that runs the thing once (or several times) and returns its milliseconds (e.g.
    the median of a few decode steps); `read`: a callable that reads the bytes once and returns its milliseconds
    (`read_ms`, `bench.read_floor`). In each of `rounds` rounds the contenders take turns, each between two sets of
    `reads` reads. Returns one row per round and contender: round, name, ms, read_ms (the mean of the median read
    before and the median read after), x_read = ms / read_ms. Where the memory's speed changes within seconds (a
    shared machine), a floor measured minutes apart can be off by 2x; a ratio of times taken seconds apart is not,
    and its spread over rounds says how far it can be trusted (`x_read_summary`)."""
    if rounds < 1 or reads < 1:
        raise ValueError(f"rounds and reads must be at least 1, got {rounds} and {reads}")
    if not contenders:
        raise ValueError("no contenders to time")
    rows = []
    for r in range(rounds):
        for name, fn in contenders.items():
            before = statistics.median(read() for _ in range(reads))
            ms = float(fn())
            after = statistics.median(read() for _ in range(reads))
            floor = (before + after) / 2
            rows.append(dict(round=r, name=name, ms=ms, read_ms=floor, x_read=ms / floor))
    return rows


def read_floor(model, context: int, *, tokens: int = 1, device=None):
    """A function that reads, once, the bytes a forward of `tokens` tokens at `context` cached tokens must read, and
    returns the milliseconds it took (`timing.read_ms`): every distinct parameter of `model` where it lies (an
    untied input embedding left out: a forward reads only its rows), and the cache and logits bytes of
    `flops.forward_bytes` from a buffer of that size allocated once. The floor of `bench.floor_ms`, measured on the
    weights themselves rather than derived from a bandwidth probe; `timing.paired_with_read` times it beside a
    step."""
    params = list(model.parameters())  # distinct: a tied weight once
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if emb is not None and (head is None or head.weight is not emb.weight):
        params = [p for p in params if p is not emb.weight]
    size = params[0].element_size()
    bytes_ = forward_bytes(flops_config(model), tokens, context, bytes_per_param=size)
    rest = torch.ones(max(1, (bytes_["kv_read"] + bytes_["kv_write"] + bytes_["logits"]) // size),
                      dtype=params[0].dtype, device=params[0].device)
    tensors = [p.detach() for p in params] + [rest]
    return lambda: read_ms(tensors, device)


def x_read_summary(rows: list[dict], *, level: float = 0.95) -> dict[str, dict]:
    """Per contender of `paired_with_read` rows: the median ratio to the read beside it over the rounds, with a
    percentile bootstrap interval over rounds (NaN bounds for a single round), and the median ms and read_ms."""
    out = {}
    for name in dict.fromkeys(r["name"] for r in rows):
        mine = [r for r in rows if r["name"] == name]
        iv = bootstrap(np.median, [r["x_read"] for r in mine], level=level)
        out[name] = dict(x_read=iv.estimate, x_read_lo=iv.lo, x_read_hi=iv.hi, rounds=len(mine),
                         ms=statistics.median(r["ms"] for r in mine),
                         read_ms=statistics.median(r["read_ms"] for r in mine))
    return out


def paired_ratio(rows: list[dict], a: str, b: str, *, key: str = "x_read", level: float = 0.95):
    """Contender `a` over contender `b` of `paired_with_read` rows, round by round (their `key`: "x_read", each over
    the read beside it, or "ms"), on the rounds both ran: the median ratio with a percentile bootstrap interval over
    rounds (`intervals.Interval`), or None where they share no round."""
    by = {name: {r["round"]: r[key] for r in rows if r["name"] == name} for name in (a, b)}
    both = sorted(set(by[a]) & set(by[b]))
    return bootstrap(np.median, [by[a][k] / by[b][k] for k in both], level=level) if both else None


def step_vs_bytes(models, context: int, *, repeats: int = 5, device=None) -> list[dict]:
    """For each model of `models` ({name: model}, e.g. `tiny.widened` at several widths, one depth): the bytes a
    decode step must read (`flops.forward_bytes` at `context` cached tokens) and the step's median time. A line
    through these points separates the step's fixed part (framework overhead: the intercept) from the part that
    grows with the bytes read (the slope: the inverse of the bandwidth the step achieves)."""
    rows = []
    for name, model in models.items():
        size = next(model.parameters()).element_size()
        read = sum(forward_bytes(flops_config(model), 1, context, bytes_per_param=size).values())
        rows.append(dict(model=name, hidden_size=model.config.hidden_size, bytes=read,
                         step_ms=1e3 * forward_seconds(model, context, 1, repeats=repeats, device=device)))
    return rows


def overhead_fit(bytes_read, step_ms) -> dict:
    """Least squares step_ms = overhead_ms + bytes / bandwidth over models of one depth: the fixed cost of a step
    (`overhead_ms`), the bandwidth the step achieves on its bytes (`bandwidth`, bytes/s), and R^2."""
    x, y = np.asarray(bytes_read, dtype=np.float64), np.asarray(step_ms, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("need at least two models that read different numbers of bytes")
    slope, intercept = np.polyfit(x, y, 1)
    r2 = 1 - float(np.sum((y - (intercept + slope * x)) ** 2)) / max(float(np.sum((y - y.mean()) ** 2)), 1e-300)
    return dict(overhead_ms=float(intercept), bandwidth=float(1e3 / slope) if slope > 0 else float("inf"),
                ms_per_gb=float(slope * 1e9), r2=r2, n_models=int(x.size))


def linear_bandwidth(model, kernels=None, rows=(1, 2, 4, 8), *, rounds: int = 3, repeats: int = 5,
                     device=None) -> list[dict]:
    """How fast each linear-layer kernel of `specrepro.kernels` reads `model`'s weights: one pass over every
    distinct linear layer of the model (a tied weight counted once) with an input of r rows, for each r of `rows`,
    kernels interleaved in each of `rounds` rounds. Returns one dict per kernel and row count: `ms` (the median
    pass), `bytes` (the weights read) and `gb_per_s`; compare with `memory_bandwidth()` taken beside it. The model is
    left with the kernel it had."""
    from .kernels import KERNELS, LINEARS, use_kernel

    kernels = tuple(kernels or KERNELS)
    layers, seen = [], set()
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m.weight.data_ptr() not in seen:
            seen.add(m.weight.data_ptr())
            layers.append(m)
    if not layers:
        raise ValueError("the model has no linear layers")
    before = next(k for k, cls in LINEARS.items() if type(layers[0]) is cls)
    weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in layers)
    samples: dict[tuple[str, int], list[float]] = {(k, r): [] for k in kernels for r in rows}
    with torch.no_grad():
        inputs = {r: {m.in_features: torch.randn(r, m.in_features, device=m.weight.device, dtype=m.weight.dtype)
                      for m in layers} for r in rows}
        for _ in range(rounds):
            for k in kernels:
                use_kernel(model, k)
                for r in rows:
                    def one_pass(r=r):
                        for m in layers:
                            m(inputs[r][m.in_features])
                    one_pass()  # warm-up (and, the first time, the kernel's build)
                    samples[k, r] += [timed(one_pass, device)[0] for _ in range(repeats)]
    use_kernel(model, before)
    out = []
    for (k, r), secs in samples.items():
        ms = 1e3 * statistics.median(secs)
        out.append(dict(kernel=k, rows=r, ms=ms, bytes=weight_bytes, gb_per_s=weight_bytes / ms / 1e6))
    return out


if __name__ == "__main__":  # python -m specrepro.timing: the kernels' read speed on the target, beside a copy's
    import pandas as pd

    from .models import load_target

    rows = linear_bandwidth(load_target())
    print(pd.DataFrame(rows).pivot(index="rows", columns="kernel", values="gb_per_s").round(1).to_string())
    print(f"reading a 1 GiB buffer (memory_bandwidth): {memory_bandwidth() / 1e9:.1f} GB/s; "
          f"{torch.get_num_threads()} threads")
