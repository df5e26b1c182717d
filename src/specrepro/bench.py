"""Benchmark: autoregressive vs speculative decoding vs transformers' assisted generation, in one process.

    python -m specrepro.bench --draft prompt-lookup --gamma 3 --prompts 4 --max-new-tokens 64
    make bench ARGS="--temperature 0.8 --top-p 0.95"

Every method decodes the same prompts with the same sampling settings, interleaved (A, B, C, A, B, C, ...), so
machine-load drift hits all alike; speedups are ratios of time per token pooled over the prompts, measured side by
side. For each method it reports time to first token (the fastest of `FIRST_TOKEN_CALLS` runs of one new token, so
that one stall cannot eat a run's decode time) apart from the time per output token after it. It also prints the
speedup the generalised walltime model (`theory.walltime_improvement_lengths`) predicts from the measured alpha and
proposal lengths (`specrepro.walltime`), twice: with every cost timed inside the runs, and with the draft's speed
and the verification forwards timed apart, after the runs.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from . import flops, intervals, theory, walltime
from .compiled import MODES, CompileConfig, slots_needed
from .generate import GenerationStats, autoregressive_generate, pooled_alpha, speculative_generate
from .kernels import KERNELS, use_kernels
from .timing import forward_log, memory_bandwidth, paired_ratio, read_floor, read_ms, timed, x_read_summary  # noqa: F401 (read_floor: 07 calls bench.read_floor)

METHODS = ("autoregressive", "speculative", "hf_assisted_fixed", "hf_assisted_default")
HF_AUTOREGRESSIVE = "hf_autoregressive"  # transformers' plain generate(), a baseline beside ours
AUTOREGRESSIVE = ("autoregressive", HF_AUTOREGRESSIVE)  # the speedup baseline is the fastest of these that ran
COMPILED = "compiled"  # the configuration that runs the compiled static-cache paths (ours and transformers')
COMPILED_FEW_ROWS = "compiled_few_rows"  # the same, with the few-row kernel in the linear layers
COMPILED_KERNEL = {COMPILED: "stock", COMPILED_FEW_ROWS: "few_rows"}  # compiled configurations: their linear kernel
CONFIGS = (*KERNELS, *COMPILED_KERNEL)
COMPILED_METHODS = ("autoregressive", "speculative", HF_AUTOREGRESSIVE)  # the methods COMPILED runs (see run_bench)


def is_compiled(config: str) -> bool:
    """Whether a configuration of `CONFIGS` runs the compiled static-cache paths."""
    return config in COMPILED_KERNEL


def linear_kernel(config: str) -> str:
    """The `kernels.KERNELS` entry a configuration runs the linear layers with (COMPILED compiles the stock ones)."""
    return COMPILED_KERNEL.get(config, config)


def runs_in(config: str, method: str) -> bool:
    """Whether `run_bench` runs `method` in `config`: a compiled one runs `COMPILED_METHODS` only.
    Every draft runs on both paths (a feature-reading one gets the target's states from its compiled graphs)."""
    return not is_compiled(config) or method in COMPILED_METHODS


def hf_generate(target, input_ids, *, max_new_tokens: int, temperature: float = 0.0, top_k=None, top_p=None,
                eos_token_id=None, assistant=None, gamma: int | None = None, generator=None,
                compile: CompileConfig | None = None):
    """transformers' generate(), with `assistant_model=assistant` when given.

    compile: transformers' own compiled generation, with the same inductor options as ours (`compiled.MODES`) and
    a static cache of `compile.slots` slots made here (a cache sized per call would compile per prompt length).
    On a CPU transformers refuses to compile unless the compile config allows every device, which it does here.

    gamma set: a like-for-like run (num_assistant_tokens=gamma, constant schedule, no confidence threshold). gamma
    None: transformers' default heuristics, as a user would call it. The assistant's generation config (which
    transformers reads and, for the heuristic schedule, mutates) is restored afterwards. A `PromptLookupDraft` maps
    to transformers' own prompt lookup decoding (`prompt_lookup_num_tokens`, `max_matching_ngram_size`).
    """
    from transformers import GenerationConfig

    from .drafts import PromptLookupDraft

    kw = dict(max_new_tokens=max_new_tokens, min_new_tokens=0,
              pad_token_id=eos_token_id if eos_token_id is not None else 0, eos_token_id=eos_token_id)
    if temperature > 0:
        kw |= dict(do_sample=True, temperature=temperature, top_k=top_k or 0, top_p=top_p if top_p is not None else 1.0)
    else:
        kw |= dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    seed = int(torch.randint(2 ** 31, (1,), generator=generator)) if generator is not None else None
    saved = None
    if isinstance(assistant, PromptLookupDraft):
        kw["prompt_lookup_num_tokens"] = gamma if gamma is not None else 10  # transformers' documented example
        kw["max_matching_ngram_size"] = assistant.config.max_ngram
        assistant = None
    if assistant is not None:
        if not hf_supports(assistant):
            raise TypeError(f"transformers' assisted generation takes a transformers model as assistant_model; a "
                            f"{type(assistant).__name__} has no transformers equivalent: leave out the hf_* methods, "
                            "or give run_bench a transformers model as hf_draft")
        saved = assistant.generation_config
        cfg = GenerationConfig()  # transformers' defaults
        if gamma is not None:
            cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = gamma, "constant"
            cfg.assistant_confidence_threshold = 0.0
        assistant.generation_config = cfg
        kw["assistant_model"] = assistant
    if compile is not None:
        kw |= _hf_compiled(target, compile, input_ids.shape[1] + max_new_tokens + (gamma or 10) + 1)
    devices = [target.device] if target.device.type == "cuda" else []
    try:
        # transformers samples from the global RNG: seed it inside fork_rng, which restores it afterwards
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            if seed is not None:
                torch.manual_seed(seed)
            # an explicit mask: generate() would otherwise mask every prompt token equal to pad_token_id
            out = target.generate(input_ids.to(target.device), attention_mask=torch.ones_like(input_ids).to(
                target.device), **kw)
    finally:
        if assistant is not None:
            assistant.generation_config = saved
    return out.cpu()


def _hf_compiled(target, config: CompileConfig, need: int) -> dict:
    """generate() keywords for transformers' compiled decoding on a static cache of `config.slots` slots."""
    from transformers import StaticCache
    from transformers.generation import CompileConfig as HFCompileConfig

    slots = config.slots or need
    if slots < need:
        raise ValueError(f"a static cache of {slots} slots is too small for {need}: raise CompileConfig.slots")
    cache = StaticCache(config=target.config, max_cache_len=slots)
    if MODES[config.mode] is None:  # "eager": the static cache, uncompiled
        return dict(cache=cache, disable_compile=True)
    cc = HFCompileConfig(fullgraph=True, dynamic=False, mode=None, **MODES[config.mode])
    cc._compile_all_devices = True  # else transformers compiles on CUDA/XPU only (its _valid_auto_compile_criteria)
    return dict(cache=cache, compile_config=cc)


def hf_supports(draft) -> bool:
    """Whether transformers' generate() can run `draft`: a transformers model as assistant_model, or our
    prompt-lookup draft as its prompt lookup decoding."""
    from transformers import PreTrainedModel

    from .drafts import PromptLookupDraft

    return isinstance(draft, (PreTrainedModel, PromptLookupDraft))


@dataclass
class Run:
    method: str
    prompt: int
    repeat: int
    seconds: float
    ttft_seconds: float
    new_tokens: int
    output: list[int] | None = None  # the generated token ids, for quality metrics
    stats: GenerationStats | None = None  # ours only (autoregressive and speculative): forwards and in-run times
    forward_times: list[tuple[int, float]] | None = None  # every target forward of the run: (tokens fed, seconds);
    # None for the compiled configuration, whose forwards cannot be hooked
    kernel: str = ""  # the `kernels.KERNELS` entry both models ran with ("" where run_bench was not asked to switch)

    @property
    def _speculative(self) -> bool:
        return self.stats is not None and bool(self.stats.proposed)

    @property
    def alpha(self) -> float | None:
        """Our speculative runs' acceptance rate (`GenerationStats.alpha`); None for the other methods."""
        return pooled_alpha([self.stats]) if self._speculative else None

    @property
    def tokens_per_iteration(self) -> float | None:
        return self.stats.tokens_per_iteration if self._speculative else None

    @property
    def proposed(self) -> list[int] | None:
        """Draft tokens proposed per iteration (our speculative runs only)."""
        return self.stats.proposed if self._speculative else None

    @property
    def ms_per_token(self) -> float:
        return 1e3 * self.seconds / self.new_tokens

    @property
    def decode_seconds(self) -> float:
        """Time after the first token (the first token's time is the TTFT)."""
        return self.seconds - self.ttft_seconds

    @property
    def decode_tokens(self) -> int:
        return max(1, self.new_tokens - 1)

    @property
    def decode_ms_per_token(self) -> float:
        """Time per output token after the first."""
        return 1e3 * self.decode_seconds / self.decode_tokens


FIRST_TOKEN_CALLS = 2  # runs of one new token per timed run; the fastest is its TTFT
# new tokens of each method's warm-up call: enough iterations that every forward width a decode uses (a draft's
# catch-up after an accepted draft among them) compiles there, not inside a timed run
WARMUP_TOKENS = 16


def run_bench(target, draft, prompts: list[torch.Tensor], *, gamma: int, max_new_tokens: int,
              temperature: float = 0.0, top_k=None, top_p=None, eos_token_id=None, repeats: int = 1,
              methods=METHODS, seed: int = 0, device=None, warmup: bool = True,
              kernels: tuple[str, ...] | Mapping[str, str] = (), compile_mode: str = "max-autotune",
              hf_draft=None) -> list[Run]:
    """Time each method on each prompt, interleaved; `repeats` rounds. HF methods need a transformers draft:
    `hf_draft` (default `draft`) is the one transformers' assisted generation runs, so that ours can run a draft
    transformers cannot (one that reads the target's features) beside transformers' best one.

    `kernels`: configurations from `CONFIGS`; each prompt is then run with every one in turn, so that each method
    can be compared at its fastest configuration, side by side (`fastest`). A mapping {method: configuration} (e.g.
    `kernels_of(fastest(runs))` of an earlier race) runs each method with its own configuration only, switched
    before each of its runs: half the time of racing two configurations again. A `kernels.KERNELS` name switches the
    linear layers of the target and of a model draft; `COMPILED` (`COMPILED_FEW_ROWS`) runs the stock (few-row)
    layers through the compiled static-cache paths in `compile_mode`: ours (`compile=`) and transformers' plain
    generate() (`hf_generate(compile=)`), all on one static cache size that fits every prompt, so that each graph
    compiles once (in the warm-up, or in the first round when `warmup` is off). transformers' assisted generation is
    left out of it: its verification width changes from iteration to iteration and each width is a new graph under
    dynamic=False, so its runs would time compilations; it runs in the other configurations. The models are left
    with the last kernel.

    A run's TTFT is the fastest of `FIRST_TOKEN_CALLS` calls for one new token, timed just before it; its decode time
    is its whole call's time minus that. With one call, a stall there (once, 1 s on a text prompt) left a run almost
    no decode time and its speedup thousands of times too high; a stall in the whole call stays in, as time a user
    waits for."""
    sample = dict(temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id)
    hf_draft = draft if hf_draft is None else hf_draft
    slots = slots_needed(max(p.shape[1] for p in prompts), max_new_tokens, max(gamma, 10) + 1)
    compile_cfg = CompileConfig(compile_mode, slots)

    def call(method, ids, n, g, config):
        c = compile_cfg if is_compiled(config) else None
        if method == "autoregressive":
            return autoregressive_generate(target, ids, max_new_tokens=n, generator=g, compile=c or False, **sample)
        if method == "speculative":
            return speculative_generate(target, draft, ids, gamma=gamma, max_new_tokens=n, generator=g,
                                        compile=c or False, **sample)
        fixed = gamma if method == "hf_assisted_fixed" else None
        assistant = None if method == HF_AUTOREGRESSIVE else hf_draft
        return hf_generate(target, ids, max_new_tokens=n, assistant=assistant, gamma=fixed, generator=g, compile=c,
                           **sample)

    configured = [None]

    def configure(config):
        if config and config != configured[0]:
            use_kernels((target, draft, hf_draft), linear_kernel(config))
            configured[0] = config

    if isinstance(kernels, Mapping):
        missing = [m for m in methods if m not in kernels]
        if missing:
            raise ValueError(f"kernels names no configuration for {missing}; give every method of `methods` one")
        order = [(kernels[m], m) for m in methods]  # (configuration, method) in the order each prompt runs them
    else:
        order = [(k, m) for k in (kernels or ("",)) for m in methods]
    unknown = {k for k, _ in order if k} - set(CONFIGS)
    if unknown:
        raise ValueError(f"unknown configuration(s) {sorted(unknown)}; choose from {CONFIGS}")
    if warmup:
        for config, m in order:
            if not runs_in(config, m):
                continue
            configure(config)
            call(m, prompts[0], WARMUP_TOKENS, torch.Generator().manual_seed(seed), config)
    runs = []
    for rep in range(repeats):
        for i, ids in enumerate(prompts):
            for kernel, m in order:
                if not runs_in(kernel, m):
                    continue
                configure(kernel)
                # defaults bind this iteration's m, ids, i, kernel; the generator is still built inside the timed call
                ttft = min(timed(lambda m=m, ids=ids, i=i, k=kernel: call(m, ids, 1,
                                                                          torch.Generator().manual_seed(seed + i), k),
                                 device)[0] for _ in range(FIRST_TOKEN_CALLS))
                # a hook inside a compiled forward would change its graph: the compiled runs log no forwards
                with forward_log(target, device) if not is_compiled(kernel) else contextlib.nullcontext() as log:
                    secs, out = timed(lambda m=m, ids=ids, i=i, k=kernel: call(
                        m, ids, max_new_tokens, torch.Generator().manual_seed(seed + i), k), device)
                seq = out.sequences if hasattr(out, "sequences") else out
                runs.append(Run(m, i, rep, secs, ttft, seq.shape[1] - ids.shape[1],
                                output=seq[0, ids.shape[1]:].tolist(), stats=getattr(out, "stats", None),
                                forward_times=log, kernel=kernel))
    return runs


def kernels_of(runs: list[Run]) -> dict[str, str]:
    """Each method's configuration in `runs` ({method: kernel}; one per method, as `fastest` leaves them), to run
    each method again with its own only (`run_bench(kernels=kernels_of(fastest(runs)))`)."""
    found = {}
    for r in runs:
        if found.setdefault(r.method, r.kernel) != r.kernel:
            raise ValueError(f"{r.method} ran with several configurations ({found[r.method]!r}, {r.kernel!r}): "
                             "pick one each first, e.g. with fastest(runs)")
    return found


def fastest(runs: list[Run]) -> list[Run]:
    """Each method's runs at the kernel where its pooled decode time per token is lowest: every method at its
    fastest configuration, measured side by side by `run_bench(kernels=...)`. `summarize(fastest(runs))` compares
    the fastest against the fastest."""
    best = {}
    for m in dict.fromkeys(r.method for r in runs):
        kernels = {r.kernel for r in runs if r.method == m}
        best[m] = min(kernels, key=lambda k, m=m: _pooled_decode([r for r in runs if (r.method, r.kernel) == (m, k)]))
    return [r for r in runs if r.kernel == best[r.method]]


def _pooled_decode(runs: list[Run]) -> float:
    """Seconds per token after the first, pooled over runs."""
    return sum(r.decode_seconds for r in runs) / sum(r.decode_tokens for r in runs)


def _too_short_to_time(who: str) -> ValueError:
    """The error for runs whose decode time (total minus the first token's, timed apart) is not positive."""
    return ValueError(f"{who} no positive decode time (total minus the first token's, timed apart): too short to "
                      "time; raise max_new_tokens")


def summarize(runs: list[Run]) -> dict[str, dict]:
    """Per method: time per output token pooled over the runs (total seconds / total tokens; `decode_` after the
    first token, whose time is the TTFT, reported apart as a median), the (min, max) time per token over runs, and
    the speedup over the fastest autoregressive method that ran (`AUTOREGRESSIVE`, named in `baseline`) as the
    ratio of pooled decode times, with the (min, max) of the per-run
    ratios paired by prompt and repeat in `speedup_range`, and a 95% percentile bootstrap interval over prompts in
    `speedup_lo`/`speedup_hi` (`intervals.bootstrap`: prompts resampled, each with all its repeats and both methods'
    times, so that the interval is for this workload's pooled speedup on other prompts like these; `n_prompts`).

    Pooled, not a median of per-prompt rates: the workload's time per token is what a user waits for, and it is
    what the walltime model predicts (prompts differ a lot in how much they repeat themselves).

    Where the time goes, from the target's forwards logged in every run (prefill included, so over all tokens):
    `target_forwards_per_token`, `target_forward_ms_per_token`, and `other_ms_per_token`, everything else (the
    draft, sampling, acceptance, bookkeeping, and for transformers its generation machinery)."""
    out, decode = {}, {}
    for m in dict.fromkeys(r.method for r in runs):
        rs = [r for r in runs if r.method == m]
        decode[m] = {(r.prompt, r.repeat): r.decode_ms_per_token for r in rs}
        out[m] = dict(ms_per_token=1e3 * sum(r.seconds for r in rs) / sum(r.new_tokens for r in rs),
                      decode_ms_per_token=1e3 * _pooled_decode(rs),
                      ttft_ms=1e3 * statistics.median(r.ttft_seconds for r in rs),
                      spread_ms_per_token=(min(r.ms_per_token for r in rs), max(r.ms_per_token for r in rs)),
                      tokens=sum(r.new_tokens for r in rs), runs=len(rs))
        if all(r.forward_times is not None for r in rs):  # where the time goes, any method alike
            tokens = sum(r.new_tokens for r in rs)
            fwd = [f for r in rs for f in r.forward_times]
            out[m] |= dict(target_forwards_per_token=len(fwd) / tokens,
                           target_forward_ms_per_token=1e3 * sum(t for _, t in fwd) / tokens,
                           other_ms_per_token=1e3 * (sum(r.seconds for r in rs) - sum(t for _, t in fwd)) / tokens)
    # a method whose decode time is not positive ran too briefly to tell its first token (timed in separate calls)
    # from the rest: it is no measurement of decoding speed, so never the baseline (seen in smoke runs of tiny models
    # on a loaded machine, where a handful of tokens take a few milliseconds)
    bases = [m for m in AUTOREGRESSIVE if m in out and out[m]["decode_ms_per_token"] > 0]
    if any(m in out for m in AUTOREGRESSIVE) and not bases:
        raise _too_short_to_time("every autoregressive run has")
    if bases:
        baseline = min(bases, key=lambda m: out[m]["decode_ms_per_token"])
        base = out[baseline]["decode_ms_per_token"]
        for m in out:
            out[m]["speedup"] = base / out[m]["decode_ms_per_token"]
            out[m]["baseline"] = baseline
            paired = [decode[baseline][k] / v for k, v in decode[m].items() if k in decode[baseline]]
            out[m]["speedup_range"] = (min(paired), max(paired)) if paired else (math.nan, math.nan)
            ci = speedup_interval(runs, m, baseline=baseline)
            out[m] |= dict(speedup_lo=ci.lo, speedup_hi=ci.hi, n_prompts=ci.n_units)
    return out


def per_prompt(runs: list[Run], method: str) -> dict[int, tuple[float, int]]:
    """`method`'s decode seconds and tokens per prompt, each prompt's repeats summed (runs with a `method` name, a
    `prompt`, `decode_seconds` and `decode_tokens`: `Run`s, `sweep.SweepRun`s)."""
    out = {}
    for r in runs:
        if r.method == method:
            sec, tok = out.get(r.prompt, (0.0, 0))
            out[r.prompt] = (sec + r.decode_seconds, tok + r.decode_tokens)
    return out


def speedup_interval(runs: list[Run], method: str, *, level: float = 0.95, seed: int = 0,
                     baseline: str = "autoregressive") -> intervals.Interval:
    """Pooled decode-time speedup of `method` over `baseline` with a percentile bootstrap interval over prompts
    (each prompt's repeats stay together); only prompts both methods ran count."""
    ar, other = per_prompt(runs, baseline), per_prompt(runs, method)
    shared = sorted(set(ar) & set(other))
    if not shared:
        raise ValueError(f"no prompt was run by both {baseline!r} and {method!r}")
    return intervals.speedup_interval([ar[k][0] for k in shared], [ar[k][1] for k in shared],
                                      [other[k][0] for k in shared], [other[k][1] for k in shared], level=level,
                                      seed=seed)


def sweep_row(runs: list[Run], gamma: int, *, draft_ms_per_token: float, verify_steps: list[float]) -> dict:
    """One point of a gamma sweep or a draft sweep: the measured speedup of `run_bench`'s autoregressive and
    speculative runs at `gamma` (with its bootstrap interval over prompts, `summarize`), beside what the walltime
    model predicts for the same runs (times in ms).

    predicted: `walltime.predicted_speedup_in_run`, every cost timed inside the runs. predicted_apart:
    `walltime.predicted_speedup_in_steps`, with the draft's speed (`draft_ms_per_token`) and the verification
    cost (`verify_steps[g]` decode steps for a forward of g + 1 tokens) timed apart. thm_3_8: Thm 3.8 at
    c = draft_ms_per_token / the autoregressive time per token (verification costing one step). tokens_model and
    tokens_measured: mean tokens per iteration, Eq. 1 at the measured alpha and proposal lengths, and as they
    happened. rel_error, rel_error_apart: measured / predicted - 1. c_in_run: the draft's time per proposed token
    over the decode step, both timed inside the runs."""
    s, costs = summarize(runs), walltime.iteration_costs(runs)
    spec = [r.stats for r in runs if r.method == "speculative"]
    alpha, lengths = pooled_alpha(spec), walltime.proposal_lengths(runs)
    ar_ms, measured = s["autoregressive"]["decode_ms_per_token"], s["speculative"]["speedup"]
    if ar_ms <= 0:  # as in `summarize`: too brief to tell the first token from the rest, no decode speed
        raise _too_short_to_time(f"the autoregressive runs at gamma {gamma} have")
    predicted = walltime.predicted_speedup_in_run(runs)
    apart = walltime.predicted_speedup_in_steps(alpha, gamma, ar_ms_per_token=ar_ms,
                                                draft_ms_per_token=draft_ms_per_token, verify_steps=verify_steps,
                                                lengths=lengths)
    a = min(alpha, 1.0)
    return dict(gamma=gamma, alpha=alpha, mean_proposed=statistics.mean(lengths), measured_speedup=measured,
                speedup_lo=s["speculative"]["speedup_lo"], speedup_hi=s["speculative"]["speedup_hi"],
                n_prompts=s["speculative"]["n_prompts"], predicted=predicted, predicted_apart=apart,
                thm_3_8=theory.walltime_improvement(a, gamma, draft_ms_per_token / ar_ms),
                tokens_model=statistics.mean(1.0 if n == 0 else theory.expected_tokens(a, n) for n in lengths),
                tokens_measured=statistics.mean(n + 1 for st in spec for n in st.accepted),
                verify_steps_in_run=costs.verify_steps.get(gamma, math.nan), verify_steps_apart=verify_steps[gamma],
                step_ms=costs.step_ms, draft_ms=costs.draft_ms, overhead_ms=costs.overhead_ms, ar_ms=ar_ms,
                spec_ms=s["speculative"]["decode_ms_per_token"], rel_error=measured / predicted - 1,
                rel_error_apart=measured / apart - 1, c=draft_ms_per_token / ar_ms,
                c_in_run=costs.draft_ms / costs.step_ms)


MODEL_PICK = "the walltime model (Thm 3.8) at the K run's alpha and c"  # `at_k_then_model_pick`'s second row


def at_k_then_model_pick(run_at, k: int, *, max_gamma: int = 16) -> list[dict]:
    """Speculative decoding at a fixed K (Chen et al.'s Table 1 used 4), then at the gamma the walltime model picks
    from that run's own measurements, where it differs from K: `theory.optimal_gamma` (Thm 3.8) at the K run's
    pooled alpha (capped at 0.99) and its draft cost c = draft_ms / step_ms, both timed inside the runs
    (`walltime.iteration_costs`). The second gamma is a prediction from the first run, not the better of measured
    runs, so it carries no winner's curse of its own.

    run_at(g) runs autoregressive and speculative decoding at gamma g and returns their runs at each method's fastest
    configuration (`fastest`). Returns one dict per gamma run, K first: gamma, chosen_by ("K" or `MODEL_PICK`),
    runs (run_at's list), alpha, costs (`walltime.IterationCosts`), c, and picked (the model's gamma at this run's
    alpha and c)."""
    if k < 1 or max_gamma < 1:
        raise ValueError(f"K and max_gamma must be >= 1, got K={k}, max_gamma={max_gamma}")
    out, g = [], k
    while g is not None:
        runs = run_at(g)
        alpha = pooled_alpha(r.stats for r in runs if r.method == "speculative" and r.stats is not None)
        costs = walltime.iteration_costs(runs)
        c = costs.draft_ms / costs.step_ms
        picked = theory.optimal_gamma(min(alpha, 0.99), c, max_gamma=max_gamma)
        out.append(dict(gamma=g, chosen_by="K" if g == k else MODEL_PICK, runs=runs, alpha=alpha, costs=costs, c=c,
                        picked=picked))
        g = picked if g == k and picked != k else None
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m specrepro.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--draft", default="prompt-lookup", help="a shipped draft name, Hugging Face id or folder")
    ap.add_argument("--task", choices=("code", "text"), default="code")
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--top-p", type=float, default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--goal-speedup", type=float, default=1.6, help="the speedup the last table asks what stops")
    ap.add_argument("--goal-alpha", type=float, default=0.6, help="the alpha that table tries in place of the measured")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' assisted generation")
    ap.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS),
                    help="linear-layer kernels to run every method with; each method is compared at its fastest")
    ap.add_argument("--compile", nargs="?", const="max-autotune", default=None, choices=sorted(MODES),
                    help="also run every method through its compiled static-cache path (ours and transformers'), "
                         "in this torch.compile mode (default max-autotune; minutes of compilation first)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run every method on the prompts (`run_bench`), print each kernel's summary, then each method at its fastest
    beside the walltime model's predictions (`_print_costs`)."""
    from .acceptance import eval_prompts
    from .data import encode_prompt
    from .models import load_draft, load_target, load_tokenizer

    ap = _parser()
    args = ap.parse_args(argv)
    if not 0 <= args.goal_alpha <= 1 or not args.goal_speedup > 0:
        ap.error("--goal-alpha must be in [0, 1] and --goal-speedup > 0")
    dtype = getattr(torch, args.dtype)
    target = load_target(args.target, dtype=dtype, device=args.device)
    draft = load_draft(args.draft, dtype=dtype, device=args.device)
    tok = load_tokenizer(args.target)
    prompts = [encode_prompt(tok, args.task, ex) for ex in eval_prompts(args.task, args.prompts)]
    hf_ok = not args.no_hf and hf_supports(draft)
    methods = (*METHODS[:2], HF_AUTOREGRESSIVE, *METHODS[2:]) if hf_ok else METHODS[:2]
    compiled = [c for c, kernel in COMPILED_KERNEL.items() if kernel == "stock" or kernel in args.kernels]
    configs = (*args.kernels, *compiled) if args.compile else tuple(args.kernels)
    runs = run_bench(target, draft, prompts, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                     temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                     eos_token_id=tok.eos_token_id, repeats=args.repeats, methods=methods, device=args.device,
                     kernels=configs, compile_mode=args.compile or "max-autotune")
    for kernel in configs:
        print(f"--- kernel {kernel}")
        _print_summary(summarize([r for r in runs if r.kernel == kernel]))
    _print_costs(target, draft, prompts, fastest(runs), args)
    return 0


def _print_costs(target, draft, prompts, runs: list[Run], args) -> None:
    """Each method at its fastest configuration, the memory floor, the costs timed in the runs, and the speedup the
    generalised walltime model predicts from them and from the draft and verification timed apart (in the
    speculative runs' configuration)."""
    summary = summarize(runs)
    spec_kernel = next(r.kernel for r in runs if r.method == "speculative")
    use_kernels((target, draft), linear_kernel(spec_kernel))  # the costs timed apart, below, with the speculative
    # runs' configuration
    compile_apart = CompileConfig(args.compile) if is_compiled(spec_kernel) else False
    alpha = pooled_alpha(r.stats for r in runs if r.method == "speculative")
    ctx = int(statistics.mean(p.shape[1] for p in prompts)) + args.max_new_tokens // 2
    verify = walltime.verify_ms(target, ctx, args.gamma, device=args.device, compile=compile_apart)
    apart = walltime.predicted_speedup(alpha, args.gamma,
                                       ar_ms_per_token=summary["autoregressive"]["decode_ms_per_token"],
                                       draft_ms_per_token=walltime.draft_ms_per_token(draft, prompts[0],
                                                                                      compile=compile_apart),
                                       forward_ms_1=verify[0], forward_ms_verify=verify,
                                       lengths=walltime.proposal_lengths(runs))
    costs = walltime.iteration_costs(runs)
    floor = floor_ms(target, ctx, device=args.device)
    print("--- each method at its fastest kernel: "
          + ", ".join(f"{m} {k}" for m, k in dict.fromkeys((r.method, r.kernel) for r in runs)))
    _print_summary(summary)
    print(f"target {args.target}, draft {args.draft}, gamma {args.gamma}, T={args.temperature}, "
          f"{len(prompts)} {args.task} prompts x {args.repeats} rounds, {torch.get_num_threads()} threads, "
          f"{args.device}; speedup intervals: 95% percentile bootstrap over prompts")
    print(f"bandwidth floor of a decode step {floor:.1f} ms (weights and cache read / measured bandwidth): "
          + ", ".join(f"{m} {summary[m]['decode_ms_per_token'] / floor:.2f}x" for m in AUTOREGRESSIVE if m in summary)
          + f"; the decode step of our runs {costs.step_ms / floor:.2f}x")
    print(f"in-run costs: decode step {costs.step_ms:.1f} ms, draft {costs.draft_ms:.2f} ms/token, overhead "
          f"{costs.overhead_ms:.2f} ms/iteration, verification in decode steps "
          + ", ".join(f"g={g}: {v:.2f} (x{costs.iterations[g]})" for g, v in costs.verify_steps.items()))
    spec_stats = [r.stats for r in runs if r.method == "speculative"]
    per_forward = sum(n + 1 for st in spec_stats for n in st.accepted) / sum(st.iterations for st in spec_stats)
    print(f"alpha {alpha:.3f}, {per_forward:.2f} tokens per target forward; the generalised walltime model predicts "
          f"{walltime.predicted_speedup_in_run(runs):.2f}x with the costs timed in the runs, "
          f"{apart:.2f}x with the costs timed apart")
    print(f"what keeps the run from {args.goal_speedup:g}x, by the walltime model with the in-run costs against the "
          "fastest autoregressive decoding's step, one factor changed at a time (alpha_needed: the alpha that reaches "
          "the goal at that row's costs; none: no alpha does):")
    import pandas as pd

    baseline = summary["speculative"]["baseline"]  # the fastest autoregressive method, ours or transformers'
    stops = pd.DataFrame(walltime.what_stops(costs, min(alpha, 1.0), goal_speedup=args.goal_speedup,
                                             goal_alpha=args.goal_alpha,
                                             baseline_ms=summary[baseline]["decode_ms_per_token"]))
    print(stops.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="none"))


def floor_ms(model, context: int, device=None, *, tokens: int = 1, bandwidth: float | None = None) -> float:
    """The memory-bandwidth floor of one forward of `tokens` tokens (1: a decode step) at `context` cached tokens,
    in ms: the bytes it must read (`flops.forward_bytes`: every weight once, the KV cache, in the model's dtype)
    over `bandwidth` in bytes/s (None: measured now, `timing.memory_bandwidth`)."""
    bytes_ = flops.forward_bytes(flops.flops_config(model), tokens, context,
                                 bytes_per_param=next(model.parameters()).element_size())
    return 1e3 * sum(bytes_.values()) / (bandwidth or memory_bandwidth(device or "cpu"))


# ---- llama.cpp as the anchor of the cost profile (notebook 07) -------------------------------------------------------

LLAMA_CPP = "llama.cpp"  # the regime name of llama.cpp's rows in `anchor_table`


def _llama_folder(target_name: str):
    """The local transformers folder llama.cpp's GGUF is converted from, or (None, why not)."""
    from pathlib import Path

    from . import models

    folder = models.target_dir() if target_name == models.TARGET else Path(target_name)
    if not (folder / "config.json").exists():
        return None, (f"llama.cpp runs the target's weights converted to GGUF and needs them as a local "
                      f"transformers folder; {target_name!r} is not one")
    return folder, None


def llama_cpp_profile(target_name: str, widths, context: int, *, threads: int, repetitions: int = 5,
                      decode_tokens: int = 32) -> tuple[list, str | None]:
    """llama.cpp's cost profile of the same float32 weights as `target_name` (the built-in target, or a local
    transformers folder with safetensors weights): llama-bench built (`engines.build`) and run (`engines.bench`) on
    the weights converted to an F32 GGUF, a forward of each width in `widths` after `context` cached tokens and
    `decode_tokens` decode steps from there. Returns (rows, None), or ([], why) where it cannot run here (no
    compiler, a Hugging Face id), so a notebook states the reason and goes on without the anchor."""
    from . import engines

    folder, why = _llama_folder(target_name)
    if folder is None:
        return [], why
    try:
        engines.build()
        return engines.bench(engines.gguf(folder), widths, depth=context, decode_tokens=decode_tokens,
                             threads=threads, repetitions=repetitions), None
    except engines.EngineUnavailable as e:
        return [], f"llama.cpp is unavailable here: {e}"


def llama_cpp_step(target_name: str, context: int, *, threads: int, decode_tokens: int = 32,
                   repetitions: int = 3) -> tuple:
    """llama.cpp's decode step on the same float32 weights as `target_name`, as a contender of
    `timing.paired_with_read`: (a function that runs llama-bench's decode test, `decode_tokens` steps from `context`
    cached tokens repeated `repetitions` times, and returns the median ms per step; None), or (None, why) where it
    cannot run here. Each call starts llama-bench afresh (its model load and prefill are not timed)."""
    from . import engines

    folder, why = _llama_folder(target_name)
    if folder is None:
        return None, why
    try:
        engines.build()
        model = engines.gguf(folder)
    except engines.EngineUnavailable as e:
        return None, f"llama.cpp is unavailable here: {e}"

    def step() -> float:
        (row,) = engines.bench(model, (), depth=context, decode_tokens=decode_tokens, threads=threads,
                               repetitions=repetitions)
        return row.ms

    return step, None


# llama.cpp's n-gram speculation (llama-server's --spec-type), each at its own defaults; "3-gram" matches the lookup
# length of our prompt-lookup draft (drafts.PromptLookupDraft's max_ngram)
LLAMA_SPEC_MODES = {
    "ngram-simple 3-gram": ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3"),
    "ngram-simple": ("--spec-type", "ngram-simple"),
    "ngram-map-k": ("--spec-type", "ngram-map-k"),
    "ngram-mod": ("--spec-type", "ngram-mod"),
}


def llama_cpp_speculation(target_name: str, prompts: list[list[int]], *, max_new_tokens: int, threads: int,
                          modes: dict[str, tuple[str, ...]] | None = None, warmup_tokens: int = 8
                          ) -> tuple[list[dict], str | None]:
    """llama.cpp's own speculative decoding on our prompts, each mode against llama.cpp's own autoregressive
    decoding: one `llama-server` per mode of `modes` (default `LLAMA_SPEC_MODES`) and one with speculation off, on
    the F32 GGUF of `target_name`'s weights with `threads` threads, greedy, one request at a time, interleaved
    prompt by prompt (drift on a shared machine falls on every mode alike), after a warm-up request each.

    One row per mode (`audit.speed_row` over the server's own decode time, the prompt's processing apart, as
    `summarize` pools ours): the speedup with its bootstrap interval over prompts, the share of drafted tokens
    accepted, and how many outputs equal speculation off's (`identical`, `prefix_match`). Returns (rows, None), or
    ([], why) where llama.cpp cannot run here."""
    from . import audit, engines

    modes = dict(LLAMA_SPEC_MODES if modes is None else modes)
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("give one or more non-empty prompts (lists of token ids)")
    if "off" in modes:
        raise ValueError('"off" names the server without speculation; give the modes other names')
    folder, why = _llama_folder(target_name)
    if folder is None:
        return [], why
    try:
        engines.build()
        model = engines.gguf(folder)
        with contextlib.ExitStack() as stack:
            clients = {name: audit.Client(stack.enter_context(
                engines.LlamaServer(model, spec=list(args), threads=threads)).url)
                for name, args in {"off": (), **modes}.items()}
            for client in clients.values():
                client.complete(prompts[0], max_tokens=warmup_tokens)
            out = {name: [] for name in clients}
            for p in prompts:
                for name, client in clients.items():
                    out[name].append(client.complete(list(p), max_tokens=max_new_tokens))
    except engines.EngineUnavailable as e:
        return [], f"llama.cpp is unavailable here: {e}"
    rows = []
    for name, args in modes.items():
        match = audit.compare_outputs(out["off"], out[name])
        rows.append(audit.speed_row(out[name], out["off"], decode=True, engine=LLAMA_CPP, mode=name,
                                    args=" ".join(args), threads=threads)
                    | dict(identical=match.exact, prefix_match=match.prefix_match,
                           tokens=sum(c.decoded for c in out[name])))
    return rows, None


def speculation_goal(ours: dict, llama_rows: list[dict], *, label: str = "ours") -> dict:
    """The regime issue's third goal: our speculative speedup over our fastest autoregressive decoding (`ours`, a
    `summarize` entry) at least llama.cpp's best over its own (`llama_cpp_speculation` rows, on the same prompts).
    `value` is ours over llama.cpp's best, each point estimate; llama.cpp's best is picked on these same prompts, so
    it is if anything an overestimate (a bar set high). No llama.cpp rows: value NaN, the goal does not hold."""
    best = max(llama_rows, key=lambda r: r["speedup"], default=None)
    value = ours["speedup"] / best["speedup"] if best else float("nan")
    name = f"llama.cpp's best ({best['mode']}, {best['speedup']:.2f}x)" if best else "llama.cpp's best (not run)"
    return dict(goal=f"speculative ({label}) over the fastest autoregressive >= {name} over its own",
                value=value, holds=bool(value >= 1))


def anchor_table(regime_ms: dict[str, list[float]], llama_rows: list, floor_ms: dict[int, float]) -> list[dict]:
    """Our cost profile beside llama.cpp's, width by width. `regime_ms`: our regimes' forwards of 1, 2, ... tokens
    in ms (as `walltime.verify_ms` gives them); `llama_rows`: `engines.bench` rows ("forward" ones are used);
    `floor_ms`: the memory floor of a forward of each width. One row per regime (llama.cpp's under `LLAMA_CPP`)
    and width: ms, steps (over the regime's own 1-token forward), x_floor, and for ours `ms_vs_llama` and
    `steps_vs_llama` (ours over llama.cpp's at that width; NaN where llama.cpp did not run that width)."""
    nan = float("nan")
    llama = {r.tokens: r.ms for r in llama_rows if r.test == "forward"}

    def row(regime, k, t, one):
        return dict(regime=regime, tokens=k, ms=t, steps=t / one, floor_ms=floor_ms.get(k, nan),
                    x_floor=t / floor_ms.get(k, nan))

    rows = [row(LLAMA_CPP, k, t, llama.get(1, nan)) for k, t in sorted(llama.items())]
    for regime, ms in regime_ms.items():
        for k, t in enumerate(ms, 1):
            ref = llama.get(k, nan)
            rows.append(row(regime, k, t, ms[0]) | dict(ms_vs_llama=t / ref,
                                                        steps_vs_llama=(t / ms[0]) / (ref / llama.get(1, nan))))
    return rows


def anchor_goals(table: list[dict], regime: str, *, llama_decode_ms: float, max_tokens: int = 5,
                 tolerance: float = 0.10) -> list[dict]:
    """The regime issue's two goals against llama.cpp, computed from `anchor_table` rows for our `regime`: its
    1-token forward within `tolerance` of llama.cpp's decode step, and its k-token curve (in steps) within
    `tolerance` of llama.cpp's, or below it, for k = 2..`max_tokens`. A goal whose llama.cpp numbers are missing
    has value NaN and does not hold."""
    ours = {r["tokens"]: r for r in table if r["regime"] == regime}
    if 1 not in ours:
        raise ValueError(f"no 1-token forward of regime {regime!r} in the table")
    step = ours[1]["ms"] / llama_decode_ms
    worst = max((ours[k]["steps_vs_llama"] for k in range(2, max_tokens + 1) if k in ours), default=float("nan"))
    return [dict(goal=f"our decode step ({regime}) within {tolerance:.0%} of llama.cpp's", value=step,
                 holds=bool(step <= 1 + tolerance)),
            dict(goal=f"our forward of 2..{max_tokens} tokens ({regime}), in decode steps, within {tolerance:.0%} of "
                      "llama.cpp's or below", value=worst, holds=bool(worst <= 1 + tolerance))]


def read_goals(rows: list[dict], ours: str, *, llama: str = LLAMA_CPP, limit: float = 1.3,
               tolerance: float = 0.10) -> list[dict]:
    """The regime issue's step goals from `timing.paired_with_read` rows, each a median over rounds with its
    bootstrap interval (value, lo, hi, rounds): our step (`ours`) at most `limit` times a read of its bytes taken
    beside it, and our step within `tolerance` of llama.cpp's, each of the two over the read beside it, round by
    round. A goal holds where its median does; a contender missing from the rows gives NaN, and the goal does not
    hold."""
    def goal(text, value, lo, hi, rounds, bound):
        return dict(goal=text, value=value, lo=lo, hi=hi, rounds=rounds, holds=bool(value <= bound))

    nan = float("nan")
    first = f"our decode step ({ours}) <= {limit:g}x a read of its bytes beside it"
    own = x_read_summary([r for r in rows if r["name"] == ours]).get(ours)  # as 07's summary table gives it
    second = f"our decode step ({ours}) within {tolerance:.0%} of llama.cpp's, each over the read beside it"
    pair = paired_ratio(rows, ours, llama)
    return [goal(first, nan, nan, nan, 0, limit) if own is None else
            goal(first, own["x_read"], own["x_read_lo"], own["x_read_hi"], own["rounds"], limit),
            goal(second, nan, nan, nan, 0, 1 + tolerance) if pair is None else
            goal(second, pair.estimate, pair.lo, pair.hi, pair.n_units, 1 + tolerance)]


def _print_summary(summary: dict) -> None:
    print(f"{'method':22s} {'ms/token':>9s} {'decode ms/tok':>14s} {'TTFT ms':>8s} {'speedup':>8s} {'95% CI':>13s} "
          f"{'per prompt':>12s}")
    for m, s in summary.items():
        lo, hi = s.get("speedup_range", (math.nan, math.nan))
        print(f"{m:22s} {s['ms_per_token']:9.1f} {s['decode_ms_per_token']:14.1f} {s['ttft_ms']:8.1f} "
              f"{s.get('speedup', math.nan):8.2f} {s.get('speedup_lo', math.nan):6.2f}-"
              f"{s.get('speedup_hi', math.nan):<6.2f} {lo:5.2f}-{hi:<5.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
