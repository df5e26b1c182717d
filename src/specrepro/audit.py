"""Is an engine's speculative decoding lossless? An audit of any OpenAI-compatible completions server.

The seed post's practical question ("if your output is reproducibly worse across many prompts, that's an
implementation problem") asked of a real engine, through its HTTP API alone, so it runs against llama.cpp's
`llama-server` (`specrepro.engines`), vLLM or SGLang alike:

1. **Distribution, alone** (`first_tokens`, `homogeneity`): the joint distribution of the first few sampled tokens of
   a prompt, with speculation on against the same engine with speculation off: a chi-squared test of homogeneity
   on the two samples' counts (sequences seen fewer than 5 times expected pooled), so the engine's own numerics
   cancel. `detectable_shift` gives the design's power: the smallest total-variation shift of the reference
   distribution (mass moved onto its most likely sequence, as a sampler that over-accepts the draft would) the test
   detects at 80%, by simulation at the sample sizes used. Where the audit holds the engine's weights (`target`)
   and the prompt as token ids, each side is also tested against the target's exact probabilities of those
   sequences (`exact_test`, `distribution.exact_joint_sparse`): the off-side tells whether the engine's own
   sampler draws the target's warped distribution at all, the on-side whether speculation keeps it.
2. **Equivalence under concurrency** (`greedy`, `compare_outputs`): greedy outputs of prompts sent one at a time and
   then `concurrency` at once (the server batches them: continuous batching, Zhang et al. 2025, arXiv
   2510.22876); exact and prefix match against the one-at-a-time outputs. The same with speculation off is the
   control that separates batching numerics from speculation. Divergences are classified near-tie or not with our
   reference logits (`equivalence.compare`) where the server returns token ids.
3. **Speed** (`speed`): tokens a second with speculation on and off on the same prompts, one request at a time.

`probe` says what the server ignores (a seed, top-k) so a test it cannot run is reported, not passed. The client
sends bounded requests (`max_tokens` <= `MAX_TOKENS`) to the address it is given and nowhere else.

`python -m specrepro.audit --url http://127.0.0.1:PORT [--baseline-url ...]` runs it against a server you started.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .distribution import exact_joint_sparse, gof_sparse
from .sampling import SamplingConfig

MAX_TOKENS = 1024
GREEDY = SamplingConfig(0.0)
ALONE = "on vs off, one at a time"  # the concurrency table's rows comparing speculation on with off, requests alone


class ServerError(RuntimeError):
    """The server is unreachable or answered something the audit cannot use; the message says what to check."""


@dataclass(frozen=True)
class Completion:
    text: str
    ids: tuple[int, ...] | None  # the generated token ids, where the server returns them (llama.cpp's n_probs)
    tokens: tuple[str, ...]  # the generated tokens as text (ids as text where only ids came back)
    seconds: float  # wall time of the request, as the client saw it
    completion_tokens: int
    drafted: int | None = None  # llama.cpp's timings: tokens drafted and accepted in this request
    accepted: int | None = None
    decode_seconds: float | None = None  # llama.cpp's timings: the server's time generating, the prompt's apart
    decoded: int | None = None  # and the tokens it generated in that time

    @property
    def key(self) -> tuple:
        """What two samples are compared on: the ids where known, else the token texts."""
        return self.ids if self.ids is not None else self.tokens


class Client:
    """POSTs to `url`/v1/completions. Sampling is sent as the audit needs it: `cfg`'s temperature, top-k and
    top-p, every other stage off (min-p 0, no repetition penalty), and for llama.cpp the order temperature,
    top-k, top-p (transformers' and ours, `sampling.warp_logits`), no prompt cache reuse."""

    def __init__(self, url: str, *, model: str | None = None, timeout: float = 300.0):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        self.url, self.model, self.timeout = url.rstrip("/"), model, timeout

    def body(self, prompt: str | list[int], max_tokens: int, cfg: SamplingConfig, seed: int | None) -> dict:
        if not prompt:
            raise ValueError("an empty prompt: give text or a non-empty list of token ids")
        if not 1 <= max_tokens <= MAX_TOKENS:
            raise ValueError(f"max_tokens must be in 1..{MAX_TOKENS}, got {max_tokens}")
        body = dict(prompt=prompt, max_tokens=max_tokens, temperature=float(cfg.temperature), stream=False,
                    top_k=cfg.top_k or 0, top_p=cfg.top_p or 1.0, min_p=0.0, repeat_penalty=1.0,
                    frequency_penalty=0.0, presence_penalty=0.0, logprobs=1, n_probs=1, cache_prompt=False,
                    samplers=["temperature", "top_k", "top_p"])
        if seed is not None:
            body["seed"] = int(seed)
        if self.model:
            body["model"] = self.model
        return body

    def complete(self, prompt: str | list[int], *, max_tokens: int, cfg: SamplingConfig = GREEDY,
                 seed: int | None = None) -> Completion:
        data = json.dumps(self.body(prompt, max_tokens, cfg, seed)).encode()
        req = urllib.request.Request(self.url + "/v1/completions", data=data,
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise ServerError(f"{self.url}/v1/completions answered {e.code}: {e.read()[:500]!r}") from e
        except (OSError, ValueError) as e:
            raise ServerError(f"could not reach {self.url}/v1/completions ({e}): is the server running, and is this "
                              "its address?") from e
        return parse(out, time.perf_counter() - t0)


def parse(out: dict, seconds: float) -> Completion:
    """A /v1/completions response as a `Completion`: llama.cpp's logprobs carry token ids (`content[i].id`),
    OpenAI's and vLLM's carry token texts (`tokens`)."""
    try:
        choice = out["choices"][0]
    except (KeyError, IndexError, TypeError) as e:
        raise ServerError(f"the response has no choices: {str(out)[:300]}") from e
    lp = choice.get("logprobs") or {}
    ids = tokens = None
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        ids = tuple(int(t["id"]) for t in lp["content"])
        tokens = tuple(str(t.get("token", t["id"])) for t in lp["content"])
    elif isinstance(lp, dict) and isinstance(lp.get("tokens"), list):
        tokens = tuple(lp["tokens"])
    if tokens is None:
        raise ServerError("the server returned no per-token logprobs: the audit needs them to read the sampled "
                          "tokens (the request asks for logprobs=1)")
    usage = out.get("usage") or {}
    timings = out.get("timings") or {}
    return Completion(text=choice.get("text", ""), ids=ids, tokens=tokens, seconds=seconds,
                      completion_tokens=int(usage.get("completion_tokens", len(tokens))),
                      # llama.cpp's timings name draft_n only where the request drafted
                      drafted=timings.get("draft_n", 0) if timings else None,
                      accepted=timings.get("draft_n_accepted", 0) if timings else None,
                      decode_seconds=timings["predicted_ms"] / 1e3 if "predicted_ms" in timings else None,
                      decoded=int(timings["predicted_n"]) if "predicted_n" in timings else None)


# ---- 1. the distribution of the first tokens ------------------------------------------------------------------


def first_tokens(client: Client, prompt: str | list[int], *, n_samples: int, n_tokens: int, cfg: SamplingConfig,
                 seed0: int = 0, concurrency: int = 1) -> list[Completion]:
    """`n_samples` completions of `n_tokens` tokens, seeds seed0, seed0 + 1, ..."""
    if cfg.greedy:
        raise ValueError("the distribution audit samples: give a temperature > 0")
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda s: client.complete(prompt, max_tokens=n_tokens, cfg=cfg, seed=s),
                             range(seed0, seed0 + n_samples)))


@dataclass(frozen=True)
class Homogeneity:
    statistic: float
    dof: int
    p_value: float
    n_a: int
    n_b: int
    cells: int  # categories after pooling the rare ones
    total_variation: float  # between the two empirical distributions


def homogeneity(a: list, b: list, min_expected: float = 5.0) -> Homogeneity:
    """Chi-squared test that samples a and b (hashable outcomes) come from one distribution: a 2 x K table of
    counts, outcomes with expected count below `min_expected` in either row pooled into one cell."""
    from scipy.stats import chi2

    if not a or not b:
        raise ValueError(f"both samples must be non-empty, got {len(a)} and {len(b)}")
    ca, cb = Counter(a), Counter(b)
    keys = sorted(set(ca) | set(cb), key=lambda k: -(ca[k] + cb[k]))
    table = np.array([[ca[k] for k in keys], [cb[k] for k in keys]], dtype=np.float64)
    n = table.sum(1, keepdims=True)
    tv = 0.5 * float(np.abs(table[0] / n[0] - table[1] / n[1]).sum())
    expected = n * table.sum(0, keepdims=True) / n.sum()
    rare = (expected < min_expected).any(0)
    if rare.any():
        table = np.concatenate([table[:, ~rare], table[:, rare].sum(1, keepdims=True)], 1)
        if table[:, -1].sum() == 0:
            table = table[:, :-1]
    cells = table.shape[1]
    if cells < 2:
        return Homogeneity(0.0, 0, 1.0, int(n[0, 0]), int(n[1, 0]), cells, tv)
    expected = n * table.sum(0, keepdims=True) / n.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    dof = cells - 1
    return Homogeneity(stat, dof, float(chi2.sf(stat, dof)), int(n[0, 0]), int(n[1, 0]), cells, tv)


def shifted(probs: np.ndarray, shift: float) -> np.ndarray:
    """`probs` with `shift` of total variation moved onto its most likely outcome from the others in proportion."""
    probs = np.asarray(probs, dtype=np.float64)
    top = int(probs.argmax())
    rest = 1.0 - probs[top]
    shift = min(shift, rest)
    out = probs * (1 - shift / rest) if rest > 0 else probs.copy()
    out[top] = probs[top] + shift
    return out


def power(probs: np.ndarray, shift: float, n_a: int, n_b: int, *, alpha: float = 0.05, replicates: int = 400,
          seed: int = 0) -> float:
    """Share of simulated audits (n_a draws from `probs`, n_b from `shifted(probs, shift)`) that `homogeneity`
    rejects at `alpha`."""
    rng = np.random.default_rng(seed)
    q = shifted(probs, shift)
    hits = 0
    for _ in range(replicates):
        a = rng.choice(len(probs), size=n_a, p=probs).tolist()
        b = rng.choice(len(q), size=n_b, p=q).tolist()
        hits += homogeneity(a, b).p_value < alpha
    return hits / replicates


def detectable_shift(probs: np.ndarray, n_a: int, n_b: int, *, target_power: float = 0.8, alpha: float = 0.05,
                     replicates: int = 200, seed: int = 0) -> float:
    """The smallest total-variation shift (`shifted`) the audit detects with `target_power`, by bisection on
    simulated power (to about 0.005)."""
    lo, hi = 0.0, float(1.0 - np.max(probs))
    if hi <= 0 or power(probs, hi, n_a, n_b, alpha=alpha, replicates=replicates, seed=seed) < target_power:
        return float("nan")  # not even moving all the mass is detected at this size
    while hi - lo > 0.005:
        mid = (lo + hi) / 2
        if power(probs, mid, n_a, n_b, alpha=alpha, replicates=replicates, seed=seed) >= target_power:
            hi = mid
        else:
            lo = mid
    return hi


def empirical(samples: list) -> tuple[list, np.ndarray]:
    """(outcomes, their frequencies), most frequent first."""
    c = Counter(samples)
    keys = [k for k, _ in c.most_common()]
    f = np.array([c[k] for k in keys], dtype=np.float64)
    return keys, f / f.sum()


def exact_test(samples: list[Completion], exact: dict[tuple[int, ...], float] | None) -> dict:
    """A side's samples against the target's exact probabilities (`distribution.gof_sparse`): p-value, total
    variation, samples outside the exact support, and `tokens`, the length of the prefix tested. Where the joint of
    all the tokens cannot be tested at this sample size (no continuation, and no pool of them, is expected 5 times:
    a spread-out setting at tens of samples), the joint of the first tokens is, the longest prefix that can be; the
    choice depends on the exact probabilities and the sample size only, never on the samples, so the test keeps its
    level (equal joints have equal prefixes). A sample outside the support of the whole joint rejects outright.
    NaNs (tokens 0) where there is nothing exact to compare with (no exact distribution, a sample without token ids
    or shorter than the others: it stopped early) or even the first token cannot be tested."""
    nan = dict(p_value=float("nan"), total_variation=float("nan"), outside_support=float("nan"), tokens=0)
    n = len(next(iter(exact))) if exact else 0
    if not exact or not samples or any(x.ids is None or len(x.ids) != n for x in samples):
        return nan
    ids = np.array([x.ids for x in samples])
    for k in range(n, 0, -1):
        prefix: dict[tuple[int, ...], float] = {}
        for key, prob in exact.items():
            prefix[key[:k]] = prefix.get(key[:k], 0.0) + prob
        try:
            g = gof_sparse(ids[:, :k], prefix)
        except ValueError:  # too few samples for this joint: try a shorter prefix
            continue
        return dict(p_value=g.p_value, total_variation=g.total_variation, outside_support=g.impossible, tokens=k)
    return nan


_EXACT: dict[tuple, tuple] = {}  # exact_distribution's results, with the model they came from (its id stays its own)


def exact_distribution(target, prompt, n_tokens: int, cfg: SamplingConfig, max_cells: int = 50_000
                       ) -> dict[tuple[int, ...], float] | None:
    """`distribution.exact_joint_sparse` of a prompt given as token ids, None where the prompt is text or the
    continuations of nonzero probability are more than `max_cells`. Kept for the process: every engine and mode
    of an audit asks for the same ones."""
    if target is None or not isinstance(prompt, list):
        return None
    key = (id(target), tuple(prompt), n_tokens, cfg, max_cells)
    if key not in _EXACT:
        try:
            got = exact_joint_sparse(target, torch.tensor([prompt]), n_tokens, cfg, max_cells=max_cells)
        except ValueError:
            got = None
        _EXACT[key] = (target, got)
    return _EXACT[key][1]


# ---- 2. greedy equivalence under concurrency ------------------------------------------------------------------


def greedy(client: Client, prompts: list, *, max_tokens: int, concurrency: int = 1) -> list[Completion]:
    """Greedy completions of `prompts`, `concurrency` requests in flight at once (1: one at a time)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda p: client.complete(p, max_tokens=max_tokens), prompts))


@dataclass(frozen=True)
class Match:
    prompts: int
    exact: int
    prefix_match: float  # mean share of the reference's tokens before the first divergence
    first_divergence: tuple[int | None, ...]  # per prompt: index of the first differing token, None if identical


def compare_outputs(reference: list[Completion], got: list[Completion]) -> Match:
    """Each completion against its reference, token by token (ids where both have them)."""
    from .equivalence import first_divergence

    if len(reference) != len(got):
        raise ValueError(f"{len(reference)} references and {len(got)} outputs")
    pos = tuple(first_divergence(list(r.key), list(g.key)) for r, g in zip(reference, got))
    share = [1.0 if p is None else p / max(1, len(r.key)) for p, r in zip(pos, reference)]
    return Match(len(got), sum(p is None for p in pos), float(np.mean(share)), pos)


# ---- 3. speed ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Speed:
    seconds: tuple[float, ...]
    tokens: tuple[int, ...]
    drafted: int | None
    accepted: int | None

    @property
    def tokens_per_second(self) -> float:
        return sum(self.tokens) / sum(self.seconds)


def speed(completions: list[Completion], *, decode: bool = False) -> Speed:
    """Each request's time and tokens: as the client waited for them, or with `decode` the server's own time
    generating (llama.cpp's `timings`), the prompt's processing apart, as `bench.summarize` pools our decode time."""
    drafted = [c.drafted for c in completions]
    accepted = [c.accepted for c in completions]
    if decode and any(c.decode_seconds is None or c.decoded is None for c in completions):
        raise ServerError("decode timing needs the server's own timings (llama.cpp's predicted_ms and predicted_n); "
                          "this server returned none: compare the requests' wall times (decode=False)")
    seconds = tuple(c.decode_seconds if decode else c.seconds for c in completions)
    tokens = tuple(c.decoded if decode else c.completion_tokens for c in completions)
    return Speed(seconds, tokens, sum(drafted) if None not in drafted else None,
                 sum(accepted) if None not in accepted else None)


# ---- what the server honours ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    seed_repeats: bool  # the same seed at T = 1 gives the same tokens
    top_k_1_is_greedy: bool  # top-k 1 at T = 1 gives the greedy tokens
    returns_ids: bool

    def cannot_test(self) -> list[str]:
        out = []
        if not self.seed_repeats:
            out.append("the server ignores the seed: samples are still comparable, but runs do not repeat")
        if not self.top_k_1_is_greedy:
            out.append("the server ignores top_k: audits at top-k test top-p and temperature only")
        if not self.returns_ids:
            out.append("no token ids: divergences cannot be classified with reference logits")
        return out


def probe(client: Client, prompt: str | list[int], *, n_tokens: int = 8) -> Probe:
    a, b = (client.complete(prompt, max_tokens=n_tokens, cfg=SamplingConfig(1.0), seed=1234) for _ in range(2))
    g = client.complete(prompt, max_tokens=n_tokens)
    k1 = client.complete(prompt, max_tokens=n_tokens, cfg=SamplingConfig(1.0, top_k=1), seed=99)
    return Probe(a.key == b.key, k1.key == g.key, g.ids is not None)


# ---- the audit as table rows (notebook 08, the CLI) -----------------------------------------------------------


def concurrency_runs(client: Client, prompts: list, *, max_tokens: int, levels=(1, 2, 4, 8)
                     ) -> dict[int, list[Completion]]:
    """Section 2's outputs: the prompts' greedy completions at each level of concurrency (1 first: the reference)."""
    return {c: greedy(client, prompts, max_tokens=max_tokens, concurrency=c) for c in sorted(set(levels) | {1})}


def concurrency_rows(runs: dict[int, list[Completion]], *, reference: list[Completion] | None = None, target=None,
                     prompt_ids: list[list[int]] | None = None, **labels) -> tuple[list[dict], list[dict]]:
    """Each level's outputs against the one-at-a-time ones (or against `reference`, e.g. another server's
    one-at-a-time outputs): a summary row per level, and one row per divergence,
    classified near-tie or not with `target`'s logits (`equivalence.compare`) where the server returned ids and the
    prompts' ids are given."""
    from .equivalence import compare

    reference = runs[1] if reference is None else reference
    summaries, divergences = [], []
    for level, got in runs.items():
        if got is reference:
            continue
        m = compare_outputs(reference, got)
        kinds = [None] * len(got)
        if target is not None and prompt_ids is not None and all(c.ids is not None for c in reference + got):
            rows = compare(target, prompt_ids, [list(c.ids) for c in reference], [list(c.ids) for c in got])
            kinds = [r.kind for r in rows]
            divergences += [labels | dict(concurrency=level, prompt=r.row, position=r.position, gap=r.gap,
                                          kind=r.kind) for r in rows if not r.exact]
        summaries.append(labels | dict(concurrency=level, prompts=m.prompts, exact_match=m.exact / m.prompts,
                                       prefix_match=m.prefix_match, near_ties=kinds.count("near-tie"),
                                       other=kinds.count("bug"), unclassified=sum(
                                           p is not None and k is None for p, k in zip(m.first_divergence, kinds))))
    return summaries, divergences


def interleaved(on, off, prompts: list, *, max_tokens: int, warmup: int = 2) -> tuple[list[Completion],
                                                                                     list[Completion]]:
    """Section 3's timed completions: both servers up at once (`on` and `off` as `audit_engine` takes them), each
    prompt sent alone to one and then the other, which goes first alternating from prompt to prompt, so that drift
    of the machine's speed over the run falls on both arms alike instead of entering their ratio (timed one arm
    after the other, two identical configurations read 0.69x and 0.84x in 08's run at 2a0a605). `warmup` greedy
    tokens of the first prompt are asked of each server first, untimed. Returns (on, off), in `prompts`' order."""
    if not prompts:
        raise ValueError("no prompts to time")
    ons, offs = [], []
    with off as s_off, on as s_on:
        a, b = Client(s_off.url), Client(s_on.url)
        if warmup:
            a.complete(prompts[0], max_tokens=warmup)
            b.complete(prompts[0], max_tokens=warmup)
        for i, p in enumerate(prompts):
            for client, out in ([(a, offs), (b, ons)] if i % 2 == 0 else [(b, ons), (a, offs)]):
                out.append(client.complete(p, max_tokens=max_tokens))
    return ons, offs


def speed_row(on: list[Completion], off: list[Completion], *, decode: bool = False, **labels) -> dict:
    """Section 3: tokens a second with speculation on over off, pooled over the prompts (each request alone), with
    its bootstrap interval over prompts, and the share of drafted tokens accepted. `decode`: over the server's own
    decode time (`speed`)."""
    from .intervals import speedup_interval

    a, b = speed(off, decode=decode), speed(on, decode=decode)
    ci = speedup_interval(a.seconds, a.tokens, b.seconds, b.tokens)
    return labels | dict(prompts=len(on), off_tokens_per_s=a.tokens_per_second, on_tokens_per_s=b.tokens_per_second,
                         speedup=ci.estimate, speedup_lo=ci.lo, speedup_hi=ci.hi,
                         acceptance=(b.accepted / b.drafted if b.drafted else float("nan")))


def audit_engine(on, off, *, engine: str, mode: str, sample_prompts: list, settings: dict[str, SamplingConfig],
                 n_samples: int, n_tokens: int, prompts: list[list[int]], max_tokens: int, levels=(2, 4, 8),
                 target=None, concurrency: int = 1, power_replicates: int = 200, same_seed: int = 50,
                 speed_prompts: list[list[int]] | None = None) -> dict[str, list[dict]]:
    """The three sections for one engine and speculative mode: `on` and `off` are servers (context managers with
    a `url`: `engines.LlamaServer`, `served.OursServer`) of the same model with speculation on and off, started
    here one after the other. The distribution test compares samples drawn with disjoint seeds (off: 0..n-1, on:
    n..2n-1), so the two are independent whatever the engine does with a seed; `same_seed` more on-samples reuse
    the off-samples' seeds, to report how often the engine writes the same sample with speculation on (claim 2:
    the same distribution need not mean the same sample). A test whose samples pool into fewer than 2 cells
    tests nothing (its detectable shift is NaN). The speed row times `speed_prompts` (default: `prompts`), each sent
    alone, greedy, to both servers up at once, interleaved (`interleaved`). Returns the tables: distribution,
    concurrency (speculation on, and off as the control), divergences, speed."""
    labels = dict(engine=engine, mode=mode)
    runs = {}
    with off as server:
        c = Client(server.url)
        off_runs = concurrency_runs(c, prompts, max_tokens=max_tokens, levels=levels)
        off_samples = {(name, i): first_tokens(c, p, n_samples=n_samples, n_tokens=n_tokens, cfg=cfg,
                                               concurrency=concurrency)
                       for name, cfg in settings.items() for i, p in enumerate(sample_prompts)}
    paired = min(n_samples, same_seed)
    with on as server:
        c = Client(server.url)
        runs = concurrency_runs(c, prompts, max_tokens=max_tokens, levels=levels)
        # the test's samples use other seeds than the off-samples (independent samples); a few use the same seeds,
        # to see whether the engine reproduces its own sample with speculation on
        on_samples = {k: first_tokens(c, sample_prompts[k[1]], n_samples=n_samples, n_tokens=n_tokens,
                                      cfg=settings[k[0]], concurrency=concurrency, seed0=n_samples)
                      for k in off_samples}
        same = {k: first_tokens(c, sample_prompts[k[1]], n_samples=paired, n_tokens=n_tokens, cfg=settings[k[0]],
                                concurrency=concurrency) for k in off_samples}
    distribution = []
    for (name, i), a in off_samples.items():
        b = on_samples[name, i]
        h = homogeneity([x.key for x in a], [x.key for x in b])
        exact = exact_distribution(target, sample_prompts[i], n_tokens, settings[name])
        vs_exact = {f"exact_{k}_{side}": v for side, x in (("off", a), ("on", b))
                    for k, v in exact_test(x, exact).items()}
        drafted = [x.drafted for x in b]
        distribution.append(labels | dict(setting=name, prompt=i, **asdict(h), detectable_shift=float("nan"),
            drafting_share=float(np.mean([d > 0 for d in drafted])) if None not in drafted else float("nan"),
            drafted=sum(d or 0 for d in drafted), accepted=sum(x.accepted or 0 for x in b),
            same_seed_pairs=paired, same_seed_identical=float(np.mean([x.key == y.key for x, y in
                                                                       zip(a[:paired], same[name, i])])),
            exact_continuations=len(exact) if exact else 0, **vs_exact))
    # the shift each test detects at 80% power, at the level the verdict tests it: Bonferroni over the tests
    # that can speak about speculation (`speculation_tests`, the ones `engine_audit` counts)
    kept = speculation_tests(distribution)[0]
    for r in distribution:
        if r["cells"] >= 2:
            a = off_samples[r["setting"], r["prompt"]]
            r["detectable_shift"] = detectable_shift(empirical([x.key for x in a])[1], r["n_a"], r["n_b"],
                                                     replicates=power_replicates, alpha=0.05 / max(1, len(kept)))
    on_speed, off_speed = interleaved(on, off, speed_prompts or prompts, max_tokens=max_tokens)
    conc, div = concurrency_rows(runs, target=target, prompt_ids=prompts, speculation="on", **labels)
    conc_off, div_off = concurrency_rows(off_runs, target=target, prompt_ids=prompts, speculation="off", **labels)
    across, div_across = concurrency_rows({1: runs[1]}, reference=off_runs[1], target=target, prompt_ids=prompts,
                                          speculation=ALONE, **labels)
    return dict(distribution=distribution, concurrency=conc + conc_off + across,
                divergences=div + div_off + div_across, speed=[speed_row(on_speed, off_speed, **labels)])


class Running:
    """A server someone else started, for `audit_engine`: entering and leaving it starts and stops nothing."""

    def __init__(self, url: str):
        self.url = url

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    """`python -m specrepro.audit`: the audit against running servers, speculation on at --url and off at
    --baseline-url (without it, only what one server can show: greedy equivalence under concurrency)."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="the server with speculative decoding on")
    ap.add_argument("--baseline-url", help="the same model with speculation off: the distribution and speed "
                    "comparisons need it")
    ap.add_argument("--model", help="the model name to send, for servers that serve several")
    ap.add_argument("--prompt", action="append", help="a prompt (repeatable): text, or token ids as a JSON list "
                    "(e.g. '[1, 2, 3]'); default: three built-in texts")
    ap.add_argument("--samples", type=int, default=400, help="sampled completions per prompt, setting and server")
    ap.add_argument("--tokens", type=int, default=3, help="tokens per sampled completion (their joint is compared)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens per greedy completion")
    ap.add_argument("--power-replicates", type=int, default=200, help="simulated audits per step of the "
                    "detectable-shift search")
    args = ap.parse_args(argv)
    prompts = [json.loads(p) if p.lstrip().startswith("[") else p for p in args.prompt or DEFAULT_PROMPTS]
    on = Client(args.url, model=args.model)
    found = probe(on, prompts[0])
    report: dict = {"probe": asdict(found), "cannot_test": found.cannot_test() + [
        "divergences are not classified: the CLI has no reference model (notebook 08 classifies them)"]}
    if args.baseline_url is None:
        runs = concurrency_runs(on, prompts, max_tokens=args.max_tokens, levels=args.concurrency)
        report["concurrency"] = concurrency_rows(runs, engine=args.url, mode="on")[0]
        report["cannot_test"].append("no --baseline-url: no distribution or speed comparison")
    else:
        settings = {"T=1, top-k 4": SamplingConfig(1.0, top_k=4), "T=0.8, top-p 0.9": SamplingConfig(0.8, top_p=0.9)}
        out = audit_engine(Running(args.url), Running(args.baseline_url), engine=args.url, mode="on",
                           sample_prompts=prompts, settings=settings, n_samples=args.samples, n_tokens=args.tokens,
                           prompts=prompts, max_tokens=args.max_tokens, levels=args.concurrency,
                           power_replicates=args.power_replicates)
        report |= out
        v = audit_verdict(out["distribution"], out["concurrency"], out["divergences"])
        report["verdict"] = dict(label=v.label, reason=v.reason)
    print(json.dumps(report, indent=2, default=str))
    return 0


def _beyond_numerics(row: dict) -> int:
    """Divergences in one concurrency-table row that are not near-ties (unclassified ones counted against)."""
    return row["other"] + row["unclassified"]


def batch_break(concurrency: list[dict]) -> bool:
    """Whether one engine and mode's greedy outputs (its rows of `audit_engine`'s concurrency table) break beyond
    numerics only once requests share a batch: with speculation on, an output under concurrency > 1 differs from
    the same request sent alone, at a level where the engine with speculation off kept every output, while
    speculation on and off agreed on every request sent one at a time. (The concurrent rows compare with speculation
    on alone: where that already differs from off, a concurrent output that differs may just be off's output.)"""
    alone = [_beyond_numerics(r) for r in concurrency if r["speculation"] == ALONE]
    if not alone or any(alone):
        return False
    off = {r["concurrency"]: _beyond_numerics(r) for r in concurrency
           if r["speculation"] == "off" and r["concurrency"] > 1}
    return any(_beyond_numerics(r) > 0 and off.get(r["concurrency"]) == 0
               for r in concurrency if r["speculation"] == "on" and r["concurrency"] > 1)


def speculation_tests(rows: list[dict], *, min_pairs: int = 20) -> tuple[list[dict], list[str]]:
    """The distribution tests (`audit_engine`'s "distribution" rows) that can speak about speculation, and why each
    other one cannot. A test is left out where (1) its samples pooled into one cell (it tests nothing), (2) the
    engine reported drafting nothing in any on-sample (speculation never ran: on and off are the same decoding), or
    (3) every one of at least `min_pairs` same-seed pairs was identical: speculation then wrote the off-sample seed
    for seed, so the on- and off-distributions are one function of the seed, and the disjoint-seed test compares
    two sets of seeds, not speculation against none."""
    kept, left_out = [], []
    for r in rows:
        where = f"{r.get('setting')}, prompt {r.get('prompt')}"
        if r["cells"] < 2:
            left_out.append(f"{where}: one cell")
        elif r.get("drafting_share") == 0:  # None or NaN: the engine reports no drafted counts
            left_out.append(f"{where}: nothing drafted")
        elif r.get("same_seed_pairs", 0) >= min_pairs and r.get("same_seed_identical") == 1.0:
            left_out.append(f"{where}: identical to off seed for seed")
        else:
            kept.append(r)
    return kept, left_out


def engine_flips(divergences: list[dict]) -> int:
    """Of one engine and mode's greedy divergences with speculation on (`audit_engine`'s divergence rows), those not
    at a near-tie that are at a token (prompt and position) where the same engine with speculation off also
    diverged, under concurrency: a token its own numerics flip without speculation (the control of section 2)."""
    off = {(d["prompt"], d["position"]) for d in divergences if d["speculation"] == "off"}
    return sum(d["kind"] != "near-tie" and (d["prompt"], d["position"]) in off
               for d in divergences if d["speculation"] != "off")


def audit_verdict(distribution: list[dict], concurrency: list[dict], divergences: list[dict] | None = None):
    """`verdicts.engine_audit` for one engine and mode from `audit_engine`'s rows: the distribution tests that can
    speak about speculation (`speculation_tests`), and every greedy comparison with speculation on (alone against
    off, and under concurrency against alone), with the divergences at tokens the engine flips without speculation
    too (`engine_flips`, where the divergence rows are given) counted as its numerics."""
    from .verdicts import engine_audit

    tests, left_out = speculation_tests(distribution)
    spec = [r for r in concurrency if r["speculation"] != "off"]
    return engine_audit([r["p_value"] for r in tests],
                        max((r["detectable_shift"] for r in tests), default=float("nan")),
                        sum(r["near_ties"] for r in spec), sum(_beyond_numerics(r) for r in spec),
                        compared=sum(r["prompts"] for r in spec), left_out=left_out,
                        engine_flips=engine_flips(divergences or []))


DEFAULT_PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Q: What is the capital of France?\nA:",
]


if __name__ == "__main__":
    raise SystemExit(main())
