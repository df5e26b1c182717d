"""The generalised walltime model (Leviathan et al. 2022, Thm 3.8, as `theory.walltime_improvement_lengths`) fed
with measured costs: what speedup a run should have had, given its alpha, its proposal lengths and what its parts
cost.

Two sources of costs:
- timed inside the runs (`iteration_costs` from the `GenerationStats` times of `bench.run_bench`'s runs), so that
  the machine's drift cannot come between a cost and the run it explains: `predicted_speedup_in_run`;
- timed apart (`verify_ms` forwards on a random prefix, `draft_ms_per_token` from the draft's own decoding), as one
  would predict before running anything: `predicted_speedup`, `predicted_speedup_in_steps`.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from . import theory
from .compiled import MODES, CompileConfig, StaticCachedModel, as_config, slots_needed
from .generate import autoregressive_generate, pooled_alpha
from .protocol import feature_layers
from .timing import forward_seconds, op_profile, timed


@dataclass(frozen=True)
class IterationCosts:
    """Costs timed inside the runs (`GenerationStats` times), in ms, over every iteration but each run's first
    (which includes the prompt's prefill).

    step_ms: autoregressive decoding, mean time per token (the target's forward and the loop around it).
    draft_ms: speculative decoding, the draft's time per proposed token (its forwards and proposal_length).
    verify_ms[g]: mean time of the target's part of an iteration that verified g drafts (a forward of g+1 tokens
        and the acceptance rule on its logits).
    overhead_ms: mean time per iteration beyond the draft's and the target's parts (appending, cache rollback).
    iterations[g]: how many iterations verified g drafts.
    """

    step_ms: float
    draft_ms: float
    verify_ms: dict[int, float]
    overhead_ms: float
    iterations: dict[int, int]

    @property
    def verify_steps(self) -> dict[int, float]:
        """verify_ms[g] in decode steps."""
        return {g: v / self.step_ms for g, v in self.verify_ms.items()}

    @property
    def mean_proposed(self) -> float:
        """Drafts proposed per iteration, on average over the timed iterations."""
        return sum(g * k for g, k in self.iterations.items()) / sum(self.iterations.values())

    @property
    def mean_verify_ms(self) -> float:
        """The target's part of an iteration, on average over the timed iterations."""
        return sum(self.verify_ms[g] * k for g, k in self.iterations.items()) / sum(self.iterations.values())

    @property
    def iteration_ms(self) -> float:
        """Mean time of one iteration: its drafts, the target's part and the bookkeeping."""
        return self.mean_proposed * self.draft_ms + self.mean_verify_ms + self.overhead_ms


def iteration_costs(runs: list) -> IterationCosts:
    """`IterationCosts` from the autoregressive and speculative runs of `run_bench`."""
    ar = [r.stats for r in runs if r.method == "autoregressive" and r.stats is not None]
    sp = [r.stats for r in runs if r.method == "speculative" and r.stats is not None]
    steps = [t for s in ar for t in s.iteration_seconds[1:]]
    iters = [(g, it, d, t) for s in sp for g, it, d, t in list(zip(s.proposed, s.iteration_seconds, s.draft_seconds,
                                                                     s.target_seconds))[1:]]
    if not steps or not iters:
        raise ValueError("need autoregressive and speculative runs of more than one iteration each: run_bench with "
                         "methods including both and max_new_tokens large enough")
    by_g: dict[int, list[float]] = {}
    for g, _, _, t in iters:
        by_g.setdefault(g, []).append(t)
    proposed = sum(g for g, *_ in iters)
    return IterationCosts(step_ms=1e3 * statistics.mean(steps),
                          draft_ms=1e3 * sum(d for _, _, d, _ in iters) / proposed if proposed else 0.0,
                          verify_ms={g: 1e3 * statistics.mean(ts) for g, ts in sorted(by_g.items())},
                          overhead_ms=1e3 * statistics.mean(it - d - t for _, it, d, t in iters),
                          iterations={g: len(ts) for g, ts in sorted(by_g.items())})


def predicted_speedup_in_run(runs: list) -> float:
    """The generalised walltime model (`theory.walltime_improvement_lengths`) with the measured alpha of the
    speculative runs, their proposal lengths, and every cost timed inside the runs (`iteration_costs`).

    With the costs timed where they were spent, the model's one remaining assumption is Leviathan's Eq. 1: that
    each draft token is accepted independently with probability alpha. Its error against the measured speedup
    is the error of that assumption (plus how the EOS and max_new_tokens cut the last iteration)."""
    alpha = pooled_alpha(r.stats for r in runs if r.method == "speculative" and r.stats is not None)
    return model_speedup(iteration_costs(runs), alpha)


def model_speedup(costs: IterationCosts, alpha: float) -> float:
    """The generalised walltime model with `costs` and acceptance rate `alpha`, over the iterations the costs were
    timed on (their proposal lengths as they happened). `predicted_speedup_in_run` is this at the runs' alpha."""
    lengths = [g for g, k in costs.iterations.items() for _ in range(k)]
    return theory.walltime_improvement_lengths(min(alpha, 1.0), lengths, t_target=costs.step_ms,
                                               t_draft=costs.draft_ms, t_verify=costs.verify_ms,
                                               t_overhead=costs.overhead_ms)


def alpha_for_speedup(costs: IterationCosts, speedup: float, *, tol: float = 1e-6) -> float | None:
    """The smallest alpha at which `model_speedup(costs, alpha)` reaches `speedup` (bisection: the model rises
    with alpha); 0.0 if it is reached at alpha = 0, None if not even alpha = 1 reaches it at these costs."""
    if model_speedup(costs, 1.0) < speedup:
        return None
    if model_speedup(costs, 0.0) >= speedup:
        return 0.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if model_speedup(costs, mid) < speedup else (lo, mid)
    return hi


def what_stops(costs: IterationCosts, alpha: float, *, goal_speedup: float, goal_alpha: float,
               baseline_ms: float | None = None) -> list[dict]:
    """Which factor keeps a speculative run from `goal_speedup`, and by how much: the generalised walltime model
    at the measured alpha and in-run costs (`iteration_costs`), then with one factor changed at a time: alpha at
    `goal_alpha`; a free draft; every verification (also of 0 drafts) costing one decode step, as Leviathan et al.'s
    model assumes (where a forward of a few tokens costs less than a step this row is slower, not faster); no
    per-iteration bookkeeping of the loop; the three costs at once (Thm 3.8's model); and those with alpha at
    `goal_alpha`. `baseline_ms`: the decode step of the autoregressive decoding the speedup is measured against,
    where it is not ours (e.g. transformers' or a compiled one); default `costs.step_ms`.

    Each row has the factor changed (`change`), the alpha, the draft's cost c (ms per drafted token over the
    baseline's step), the verification of the longest proposal in baseline steps, the per-iteration overhead in
    steps, the model's speedup, whether it reaches the goal, and the alpha that would reach the goal at that row's
    costs (`alpha_for_speedup`; NaN: no alpha does). These are the model's counterfactuals, not measurements: the
    first row's speedup beside the measured one says how far to trust them."""
    for name, v in (("alpha", alpha), ("goal_alpha", goal_alpha)):
        if not 0 <= v <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {v}")
    if not goal_speedup > 0:
        raise ValueError(f"goal_speedup must be > 0, got {goal_speedup}")
    if baseline_ms is not None:
        costs = replace(costs, step_ms=baseline_ms)
    one_step = {g: costs.step_ms for g in costs.verify_ms}
    ideal = replace(costs, draft_ms=0.0, verify_ms=one_step, overhead_ms=0.0)
    scenarios = [("as measured", alpha, costs),
                 (f"alpha at the goal ({goal_alpha:g})", goal_alpha, costs),
                 ("a free draft (c = 0)", alpha, replace(costs, draft_ms=0.0)),
                 ("verification at one decode step", alpha, replace(costs, verify_ms=one_step)),
                 ("no loop overhead", alpha, replace(costs, overhead_ms=0.0)),
                 ("all three costs as Thm 3.8 has them", alpha, ideal),
                 (f"Thm 3.8's costs and alpha {goal_alpha:g}", goal_alpha, ideal)]
    g_max = max(costs.verify_ms)
    rows = []
    for change, a, cs in scenarios:
        speedup = model_speedup(cs, a)
        need = alpha_for_speedup(cs, goal_speedup)
        rows.append(dict(change=change, alpha=a, c=cs.draft_ms / cs.step_ms, gamma=g_max,
                         verify_steps=cs.verify_ms[g_max] / cs.step_ms, overhead_steps=cs.overhead_ms / cs.step_ms,
                         speedup=speedup, meets_goal=speedup >= goal_speedup,
                         alpha_needed=float("nan") if need is None else need))
    return rows


def predicted_speedup(alpha: float, gamma: int, *, ar_ms_per_token: float, draft_ms_per_token: float,
                      forward_ms_1: float, forward_ms_verify, lengths: list[int] | None = None) -> float:
    """The generalised walltime model from measured costs. A decode step's overhead beyond its forward
    (sampling, bookkeeping: ar_ms_per_token - forward_ms_1) is charged to each verification too.

    Fixed gamma (`lengths` None): `theory.walltime_improvement_measured` with `forward_ms_verify` the time of a
    forward of gamma+1 tokens. With the iterations' proposal lengths `lengths` (a draft that proposes fewer than
    gamma tokens, e.g. prompt lookup): `theory.walltime_improvement_lengths`, `forward_ms_verify[g]` the time of a
    forward of g+1 tokens for g = 0..gamma."""
    overhead = max(0.0, ar_ms_per_token - forward_ms_1)
    if lengths is None:
        return theory.walltime_improvement_measured(min(alpha, 1.0), gamma, t_target=ar_ms_per_token,
                                                    t_draft=draft_ms_per_token, t_verify=forward_ms_verify + overhead)
    return theory.walltime_improvement_lengths(min(alpha, 1.0), lengths, t_target=ar_ms_per_token,
                                               t_draft=draft_ms_per_token, t_verify=forward_ms_verify,
                                               t_overhead=overhead)


def predicted_speedup_in_steps(alpha: float, gamma: int, *, ar_ms_per_token: float, draft_ms_per_token: float,
                               verify_steps: list[float], lengths: list[int]) -> float:
    """`predicted_speedup` with the verification cost given as a ratio: verify_steps[g] decode steps for a forward
    of g+1 tokens (measured side by side), times the decode step timed in the runs themselves, so that machine
    drift between the cost measurement and the runs cancels."""
    return predicted_speedup(alpha, gamma, ar_ms_per_token=ar_ms_per_token, draft_ms_per_token=draft_ms_per_token,
                             forward_ms_1=ar_ms_per_token,
                             forward_ms_verify=[ar_ms_per_token * r for r in verify_steps], lengths=lengths)


def verify_ms(target, context: int, gamma: int, device=None, *, compile=False, padded: bool = True,
              repeats: int = 5) -> list[float]:
    """Milliseconds of one target forward of g+1 tokens after `context` cached ones, for g = 0..gamma.

    compile: time the compiled static-cache forwards instead (`specrepro.compiled`, as `compile=` of the loops
    takes it), each the median of `repeats` after a warm-up that compiles. `padded`: as in the loops, every block of
    2..gamma+1 tokens runs padded to gamma + 1 (one graph); False compiles a graph per width (the cost profile)."""
    config = as_config(compile)
    if config is None:
        return [1e3 * forward_seconds(target, context, g + 1, device=device) for g in range(gamma + 1)]
    slots = config.slots or slots_needed(context, 0, gamma + 1)
    tokens = torch.randint(target.config.vocab_size, (context + gamma + 1,), generator=torch.Generator().manual_seed(0))
    out = []
    for g in range(gamma + 1):
        if g == 0 or not padded:  # a fresh cache per graph width: the prompt's prefill runs eagerly
            _, forward = _cached_forward(target, tokens.tolist(), context, block=gamma + 1 if padded else max(g + 1, 2),
                                         slots=slots, mode=config.mode, device=device)
        times = [forward(g + 1) for _ in range(repeats + 1)]  # the first compiles (once per width) and warms up
        out.append(1e3 * statistics.median(times[1:]))
    return out


def _cached_forward(target, tokens: list[int], context: int, *, block: int, slots: int, mode: str, device=None):
    """The compiled static-cache model (`compiled.StaticCachedModel`) of `target` with tokens[:context] fed (the
    prefill runs eagerly), and a function of k that times one forward of the k tokens after them, in seconds, and
    rewinds the cache to `context` tokens: every call times the same forward."""
    m = StaticCachedModel(target, "target", [], block=block, slots=slots, mode=mode)
    m.feed([tokens[:context]], 1)

    def forward(k: int) -> float:
        seconds = timed(lambda: m.feed([tokens[context:context + k]], k), device)[0]
        m.keep([context])
        return seconds

    return m, forward


def step_timer(target, context: int, device=None, *, compile=True, repeats: int = 5):
    """A function that times `repeats` decode steps of `target` (a forward of one token after `context` cached
    ones, as `verify_ms` times it) and returns their median in ms, as a contender of `timing.paired_with_read`. On
    the compiled path (`compile=`, as the loops take it) the cache is filled and the graph compiled once, here, so
    that each call times steps only (the function's `cache` attribute is that static-cache model); eagerly
    (compile=False) each call prefills anew (`timing.forward_seconds`). The linear layers' kernel is the model's own
    at each call."""
    config = as_config(compile)
    if config is None:
        return lambda: 1e3 * forward_seconds(target, context, 1, repeats=repeats, device=device)
    tokens = torch.randint(target.config.vocab_size, (context + 1,), generator=torch.Generator().manual_seed(0))
    m, forward = _cached_forward(target, tokens.tolist(), context, block=2,
                                 slots=config.slots or slots_needed(context, 0, 1), mode=config.mode, device=device)

    def steps() -> float:
        return 1e3 * statistics.median(forward(1) for _ in range(repeats))

    steps.cache = m  # the static-cache model the steps run on (filled once; each call leaves it as it found it)
    steps()  # compiles and warms up
    return steps


def race_modes(target, context: int, modes: Sequence[str], *, rounds: int = 3, repeats: int = 5,
               device=None) -> list[dict]:
    """The compiled decode step (a forward of one token after `context` cached ones, as `verify_ms` times it) in
    each torch.compile mode of `modes` (`compiled.MODES`), the modes taken in turn for `rounds` rounds so that a
    shared machine's drift falls on all alike. The first round of a mode compiles it (its `seconds` include the
    compile); each round's `ms` is the median of `repeats` forwards after a warm-up.

    A compile that fails counts as a failure of its mode, and so does one that falls back to the uncompiled path
    (`compiled` announces that with a "torch.compile failed" warning, raised here as an error): an eager step must
    not win a race of compilers; a failed mode is not compiled again in later rounds. One row per mode and round:
    mode, round, ms (None where it failed), seconds, error. Only the 1-token graph is raced: the winner's other
    graphs (the verification's width, a draft's, another dtype's) are compiled by the runs that use them.
    The linear layers' kernel is the model's own (`kernels.use_kernel` before the call)."""
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"modes must be a non-empty list of {sorted(MODES)}, got {list(modes)!r}")
    if rounds < 1 or repeats < 1:
        raise ValueError(f"rounds and repeats must be >= 1, got rounds={rounds}, repeats={repeats}")
    rows, failed = [], set()
    for rnd in range(rounds):
        for mode in modes:
            start, ms, error = time.perf_counter(), None, None
            if mode in failed:  # out of the race already: not compiled again
                rows.append(dict(mode=mode, round=rnd, ms=None, seconds=0.0, error="failed in an earlier round"))
                continue
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("error", message="torch.compile failed")
                    ms = verify_ms(target, context, 0, device=device, compile=CompileConfig(mode), padded=False,
                                   repeats=repeats)[0]
            except Exception as err:  # a mode that cannot compile here loses the race, with its reason kept
                error = f"{type(err).__name__}: {str(err)[:300]}"
                failed.add(mode)
            rows.append(dict(mode=mode, round=rnd, ms=ms, seconds=time.perf_counter() - start, error=error))
    return rows


def mode_medians(rows: list[dict]) -> dict[str, float | None]:
    """Each mode of `race_modes`' rows, in race order: its median step time in ms over the rounds, or None where it
    failed in a round (its rows' `error` says why)."""
    times = {m: [r["ms"] for r in rows if r["mode"] == m] for m in dict.fromkeys(r["mode"] for r in rows)}
    return {m: statistics.median(t) if all(x is not None for x in t) else None for m, t in times.items()}


def fastest_mode(rows: list[dict]) -> str:
    """The mode of `race_modes`' rows with the lowest median step time (`mode_medians`), among the modes that
    compiled in every round (a mode that failed once is out: a decode would meet the same failure). Raises when
    none did."""
    ok = {m: ms for m, ms in mode_medians(rows).items() if ms is not None}
    if not ok:
        errors = "; ".join(f"{r['mode']}: {r['error']}" for r in rows if r["error"])
        raise RuntimeError(f"no compile mode compiled the decode step on this machine ({errors}); run with "
                           "compile=False (the eager path) or try compile mode 'default'")
    return min(ok, key=ok.get)


def step_profile(target, context: int, *, tokens: int = 1, compile=True, repeats: int = 10, top: int = 12,
                 device=None) -> dict:
    """Where a forward of `tokens` tokens after `context` cached ones spends its time on the static-cache path
    (`compile` as the loops take it: True, a mode name of `compiled.MODES` or a `CompileConfig`; mode "eager" runs
    the same path uncompiled). Returns `ms` (the median of `repeats` unprofiled forwards, after a warm-up that
    compiles) and `rows` (`timing.op_profile` of the same forward: self time per operator). The linear layers'
    kernel is the model's own (`kernels.use_kernel` before the call)."""
    config = as_config(compile)
    if config is None:
        raise ValueError("step_profile profiles the static-cache path: pass compile=True, a mode name, or "
                         "compile='eager' for that path uncompiled")
    if context < 1 or tokens < 1:
        raise ValueError(f"context and tokens must be >= 1, got context={context}, tokens={tokens}")
    block = max(tokens, 2)
    m = StaticCachedModel(target, "target", [], block=block, slots=config.slots or slots_needed(context, 0, block),
                          mode=config.mode)
    ids = torch.randint(target.config.vocab_size, (context + tokens,), generator=torch.Generator().manual_seed(0))
    m.feed([ids[:context].tolist()], 1)
    new = ids[context:].tolist()

    def forward():
        m.feed([new], tokens)
        m.keep([context])

    forward()  # compiles
    times = [timed(forward, device)[0] for _ in range(repeats)]
    return dict(ms=1e3 * statistics.median(times), rows=op_profile(forward, repeats=repeats, top=top))


def proposal_lengths(runs: list) -> list[int]:
    """Every iteration's proposal length over the speculative runs."""
    return [g for r in runs if r.proposed for g in r.proposed]


def decode_ms_per_token(models: dict, prompt: torch.Tensor, n: int = 16, repeats: int = 3,
                        compile=False) -> dict[str, float]:
    """Each model's greedy decoding time per token after the first, in ms: the median over `repeats` rounds that
    take the models in turn (interleaved, so that drift hits all alike), after one warm-up call each. The first
    iteration (prefill and first token) is left out, as in every decode time of `specrepro.bench`, so a draft's
    cost c = its value / the target's compares like with like. `compile` as the loops take it (the warm-up
    compiles; give a `CompileConfig` with `slots` to share the graphs of the runs it is compared with)."""
    if n < 2:
        raise ValueError(f"n must be >= 2 (the first token is left out), got {n}")
    for m in models.values():
        _seconds_per_token(m, prompt, n, compile)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(repeats):
        for name, m in models.items():
            times[name].append(_seconds_per_token(m, prompt, n, compile))
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def _seconds_per_token(model, prompt: torch.Tensor, n: int, compile) -> float:
    """One greedy decoding of n tokens, seconds per token after the first. A draft that reads the target's
    features cannot decode alone: it runs as it drafts (`drafting_seconds`)."""
    if feature_layers(model):
        return drafting_seconds(model, prompt, n)
    st = autoregressive_generate(model, prompt, max_new_tokens=n, temperature=0, compile=compile).stats
    return sum(st.iteration_seconds[1:]) / (st.new_tokens - 1)


def draft_ms_per_token(draft, prompt: torch.Tensor, n: int = 16, repeats: int = 3, compile=False) -> float:
    """The draft's own greedy decoding time per token after the first (`decode_ms_per_token`): its cost c times
    the target's decode time per token."""
    return decode_ms_per_token({"draft": draft}, prompt, n, repeats, compile)["draft"]


@torch.no_grad()
def drafting_seconds(draft, prompt: torch.Tensor, n: int = 16) -> float:
    """A feature-reading draft's time per drafted token: after a catch-up on `prompt` (zero features), n - 1
    one-token forwards on its own states (the loop's steps after the catch-up), each with its greedy pick."""
    from .kvcache import make_cache, model_forward

    width = len(feature_layers(draft)) * draft.config.hidden_size
    dev = next(draft.parameters()).device
    cache = make_cache(draft)
    logits = model_forward(draft, prompt.to(dev), cache, logits_to_keep=1,
                           target_features=torch.zeros(*prompt.shape, width, device=dev)).logits
    total = 0.0
    for _ in range(n - 1):
        nxt = logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
        dt, logits = timed(lambda ids=nxt, c=cache: model_forward(draft, ids, c, logits_to_keep=1).logits, dev)
        total += dt
    return total / (n - 1)


def main(argv: list[str] | None = None) -> int:
    """python -m specrepro.walltime: where the target's compiled decode step spends its time, on this machine."""
    import argparse

    from .compiled import MODES
    from .kernels import KERNELS, use_kernel
    from .models import TARGET, load_target

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--target", default=TARGET, help="built-in target, a Hugging Face id or a folder")
    ap.add_argument("--kernel", default="few_rows", choices=KERNELS, help="the linear layers' kernel")
    ap.add_argument("--mode", default="max-autotune", choices=sorted(MODES), help="torch.compile mode")
    ap.add_argument("--context", type=int, default=256, help="cached tokens before the profiled forward")
    ap.add_argument("--tokens", type=int, default=1, help="tokens per forward (1: a decode step)")
    ap.add_argument("--repeats", type=int, default=10, help="forwards timed, and forwards profiled")
    ap.add_argument("--top", type=int, default=12, help="operators listed; the rest in one row")
    ap.add_argument("--beside-read", type=int, default=0, metavar="ROUNDS",
                    help="then time the 1-token step beside a read of its bytes for ROUNDS rounds (07 section 1c), "
                         "against the step of a second copy of the target set as --versus says")
    ap.add_argument("--versus", default="sdpa-attention", choices=["sdpa-attention", *sorted(MODES)],
                    help="the second copy: the same kernel and mode with sdpa's attention (compiled.GQA_ATTENTION), "
                         "or the same kernel compiled in this mode")
    args = ap.parse_args(argv)
    if args.versus == args.mode:
        ap.error(f"--versus {args.versus} is --mode itself: name another mode, or sdpa-attention")
    target = load_target(args.target)
    use_kernel(target, args.kernel)
    out = step_profile(target, args.context, tokens=args.tokens, compile=args.mode, repeats=args.repeats,
                       top=args.top)
    print(f"{args.target}: a forward of {args.tokens} token(s) after {args.context} cached, kernel {args.kernel}, "
          f"mode {args.mode}, {torch.get_num_threads()} threads: {out['ms']:.2f} ms (median of {args.repeats})")
    for r in out["rows"]:
        print(f"  {r['ms']:8.3f} ms  {r['share']:6.1%}  {r['calls']:7.1f} calls  {r['op'][:90]}")
    if args.beside_read:
        _beside_read(target, load_target(args.target), args)
    return 0


def _beside_read(target, other, args) -> None:
    """An A/B of the 1-token step on the static path, each step beside reads of its bytes, rounds in turn (07
    section 1c): `target` as it runs (kernel `args.kernel`, mode `args.mode`; with the few-row kernel, the package's
    attention) against `other`, a second copy of it with sdpa's attention (`args.versus` "sdpa-attention",
    `compiled.GQA_ATTENTION`) or compiled in the mode `args.versus`. Prints each one's compile time (the first call,
    a warm-up included; inductor caches compiled graphs on disk, so a second process compiles faster), its step over
    the read, and the ratio of the two steps paired by round."""
    from .compiled import GQA_ATTENTION
    from .kernels import use_kernel
    from .timing import paired_ratio, paired_with_read, read_floor, x_read_summary

    use_kernel(other, args.kernel)
    if args.versus == "sdpa-attention":
        other.config._attn_implementation = GQA_ATTENTION
        names, modes = ("attention: own", "attention: sdpa"), (args.mode, args.mode)
    else:
        names, modes = (f"mode: {args.mode}", f"mode: {args.versus}"), (args.mode, args.versus)
    timers = {}
    for name, model, mode in zip(names, (target, other), modes):
        start = time.perf_counter()
        timers[name] = step_timer(model, args.context, compile=CompileConfig(mode))
        print(f"{name}: compiled and warmed up in {time.perf_counter() - start:.0f} s")
    rows = paired_with_read(timers, read_floor(target, args.context), rounds=args.beside_read)
    print(f"the 1-token step beside a read of its bytes ({args.beside_read} rounds; median, 95% bootstrap interval):")
    for name, r in x_read_summary(rows).items():
        print(f"  {name}: step {r['ms']:.2f} ms, read {r['read_ms']:.2f} ms: {r['x_read']:.3f}x "
              f"[{r['x_read_lo']:.3f}, {r['x_read_hi']:.3f}]")
    ratio = paired_ratio(rows, *names, key="ms")
    print(f"  {names[0]} over {names[1]}, paired by round: {ratio.estimate:.3f}x [{ratio.lo:.3f}, {ratio.hi:.3f}]")


if __name__ == "__main__":
    raise SystemExit(main())
