"""Autoregressive and speculative decoding for any pair of transformers causal LMs sharing a vocabulary.

References: Leviathan et al. 2022 (arXiv 2211.17192), Alg. 1; Chen et al. 2023 (arXiv 2302.01318), Alg. 2. The
acceptance rule itself lives in `specrepro.sampling` (pure, in paper notation); this module owns the loop, the
two KV caches and the bookkeeping.

Invariant of both loops: every model's KV cache holds a prefix of `seq` that ends *before* the last token
("the pending token"). A forward feeds the tokens the cache lacks, so the prompt's prefill, the draft catching up
on the tokens the target accepted, and the bonus token need no special cases. After each iteration both caches
are cropped back to `len(seq) - 1`.

Random numbers are drawn from the caller's `torch.Generator` in a fixed order per iteration: one uniform per draft
token while drafting, then gamma acceptance uniforms and one residual uniform. Autoregressive decoding draws one
uniform per token. Greedy decoding (temperature 0) draws none.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch
from transformers import DynamicCache

from .sampling import (SamplingConfig, check_logits, greedy_accept, probs_from_logits, sample_from,
                       speculative_accept)


@dataclass
class GenerationStats:
    """What a generation did, as data. Each forward is recorded as (new_tokens, cache_len_before).

    Wall-clock times are recorded per iteration (per token for autoregressive decoding), in seconds:
    `iteration_seconds` the whole iteration, `draft_seconds` the draft's part (its proposal_length, forwards and
    draws; 0 for autoregressive decoding), `target_seconds` the target's part: its forward and the work on its
    logits up to the new token(s) (argmax, or p, the acceptance rule and the draw). The rest of an iteration is
    the loop's bookkeeping: appending and cache rollback. On a GPU each stamp follows a host sync the loop makes
    anyway (the checks on the logits, moving tokens to the CPU), so it includes the device work before it.
    Iteration 0 includes the prompt's prefill.
    """

    prompt_len: int
    new_tokens: int = 0
    target_forwards: list[tuple[int, int]] = field(default_factory=list)
    draft_forwards: list[tuple[int, int]] = field(default_factory=list)
    proposed: list[int] = field(default_factory=list)  # draft tokens proposed per iteration (gamma, or fewer at the end)
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted per iteration
    iteration_seconds: list[float] = field(default_factory=list)
    draft_seconds: list[float] = field(default_factory=list)
    target_seconds: list[float] = field(default_factory=list)

    @property
    def target_calls(self) -> int:
        return len(self.target_forwards)

    @property
    def draft_calls(self) -> int:
        return len(self.draft_forwards)

    @property
    def target_tokens(self) -> int:
        return sum(n for n, _ in self.target_forwards)

    @property
    def draft_tokens(self) -> int:
        return sum(n for n, _ in self.draft_forwards)

    @property
    def iterations(self) -> int:
        return len(self.accepted)

    @property
    def alpha(self) -> float:
        """Maximum-likelihood acceptance rate: accepted drafts / drafts actually tested.

        A draft token is tested only if all before it were accepted, so an iteration with n accepted out of g
        tested n + 1 tokens when n < g and g when n = g (Leviathan's alpha, Def. 3.1, under its i.i.d. model).
        """
        return pooled_alpha([self])

    @property
    def tokens_per_iteration(self) -> float:
        """Mean tokens produced per target verification call (Leviathan Eq. 1 estimates its expectation)."""
        return sum(n + 1 for n in self.accepted) / self.iterations if self.iterations else float("nan")


def pooled_alpha(runs: Iterable[GenerationStats]) -> float:
    """`GenerationStats.alpha` over many runs: all accepted drafts / all drafts tested."""
    runs = list(runs)
    tested = sum(n + (n < g) for s in runs for n, g in zip(s.accepted, s.proposed))
    return sum(sum(s.accepted) for s in runs) / tested if tested else float("nan")


@dataclass
class GenerationResult:
    sequences: torch.Tensor  # (B, prompt_len + new_tokens) long: the prompt followed by the generated tokens
    stats: GenerationStats


# ----------------------------------------------------------------------------------------------------------
# checks


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_common(input_ids: torch.Tensor, max_new_tokens: int) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError("input_ids must be a (batch, length) LongTensor, e.g. tokenizer(text, return_tensors='pt')"
                         f".input_ids; got {type(input_ids).__name__} "
                         f"{getattr(input_ids, 'shape', '')} {getattr(input_ids, 'dtype', '')}")
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. the tokenizer's BOS token)")
    if input_ids.shape[0] != 1:
        raise NotImplementedError(f"batch size {input_ids.shape[0]}: these loops decode one sequence at a time; "
                                  "loop over the rows or pass input_ids[i:i+1]")
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def vocab_size(model) -> int:
    """Number of logits a model produces per position (its output embedding rows)."""
    head = model.get_output_embeddings()
    return int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)


def check_same_vocab(target, draft) -> None:
    vt, vd = vocab_size(target), vocab_size(draft)
    if vt != vd:
        raise ValueError(
            f"vocabulary mismatch: the target scores {vt} tokens, the draft {vd}. Speculative sampling compares "
            "p and q token by token, so both models must share one tokenizer and vocabulary: pick a draft from "
            "the target's model family (or one trained on its tokenizer).")


def _eos_set(eos_token_id: int | Sequence[int] | None) -> set[int]:
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id}


# ----------------------------------------------------------------------------------------------------------
# one forward with a KV cache


def _cache_kwarg(model) -> str:
    # transformers 5.x calls it `cache`; older and remote-code models still say `past_key_values`.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class _Decoder:
    """A model, its KV cache and the log of its forwards."""

    def __init__(self, model, who: str, log: list[tuple[int, int]]):
        self.model, self.who, self.log = model, who, log
        # a model that is not a transformer (the prompt-lookup draft) brings its own cache-like object
        self.cache = model.make_cache() if hasattr(model, "make_cache") else DynamicCache(config=model.config)
        self.kwarg = _cache_kwarg(model)
        self.device = next(model.parameters()).device

    @property
    def cached(self) -> int:
        return self.cache.get_seq_length()

    @torch.no_grad()
    def logits_for(self, seq: torch.Tensor, n_logits: int) -> torch.Tensor:
        """Feed seq[:, cached:] and return the logits of its last n_logits positions, (B, n_logits, V)."""
        new = seq[:, self.cached:].to(self.device)
        self.log.append((new.shape[1], self.cached))
        out = self.model(input_ids=new, use_cache=True, logits_to_keep=n_logits, **{self.kwarg: self.cache})
        logits = out.logits[:, -n_logits:]
        check_logits(logits, self.who)
        return logits

    def rollback(self, length: int) -> None:
        """Crop the cache to its first `length` positions (no-op if it is already that short)."""
        if self.cached > length:
            self.cache.crop(length - self.cached)  # negative: number of positions to remove


def _uniform(generator: torch.Generator | None, shape: tuple[int, ...]) -> torch.Tensor:
    device = generator.device if generator is not None else "cpu"
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float64)


# ----------------------------------------------------------------------------------------------------------
# the loops


def autoregressive_generate(model, input_ids: torch.Tensor, *, max_new_tokens: int, temperature: float = 1.0,
                            top_k: int | None = None, top_p: float | None = None,
                            eos_token_id: int | Sequence[int] | None = None,
                            generator: torch.Generator | None = None) -> GenerationResult:
    """Plain decoding, one token per forward with a KV cache: the reference speculative sampling must match.

    Each token is drawn from the warped target distribution by inverse CDF with one uniform from `generator`.
    Stops after `max_new_tokens` tokens or right after an EOS token.
    """
    cfg = SamplingConfig(temperature, top_k, top_p)
    _check_common(input_ids, max_new_tokens)
    eos = _eos_set(eos_token_id)
    stats = GenerationStats(prompt_len=input_ids.shape[1])
    dec = _Decoder(model, "target", stats.target_forwards)
    seq = input_ids.cpu()
    clock = time.perf_counter
    while stats.new_tokens < max_new_tokens:
        t0 = clock()
        logits = dec.logits_for(seq, 1)[:, -1]  # (B, V)
        if cfg.greedy:
            token = logits.argmax(-1).cpu()  # (B,)
        else:
            target_probs = probs_from_logits(logits, cfg)  # (B, V)
            token = sample_from(target_probs, _uniform(generator, (1,)).to(target_probs.device)).cpu()  # (B,)
        t_target = clock() - t0
        seq = torch.cat([seq, token[:, None]], dim=1)
        dec.rollback(seq.shape[1] - 1)
        stats.new_tokens += 1
        stats.iteration_seconds.append(clock() - t0)
        stats.draft_seconds.append(0.0)
        stats.target_seconds.append(t_target)
        if int(token) in eos:
            break
    return GenerationResult(seq, stats)


def speculative_generate(target, draft, input_ids: torch.Tensor, *, gamma: int, max_new_tokens: int,
                         temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                         eos_token_id: int | Sequence[int] | None = None,
                         generator: torch.Generator | None = None) -> GenerationResult:
    """Speculative sampling (Leviathan Alg. 1, Chen Alg. 2): the draft proposes gamma tokens, the target scores
    them in one forward of gamma+1 tokens, and `speculative_accept` keeps a prefix plus one token of its own.

    The output is distributed exactly as `autoregressive_generate(target, ...)` with the same sampling settings
    (up to floating-point numerics: the same seed does *not* give the same text). With temperature 0 the output
    equals greedy decoding of the target token for token, except where float near-ties flip an argmax.

    The last iteration proposes only as many drafts as tokens remain (minus the one the target adds), and the
    run stops right after an EOS token even in the middle of an accepted block.

    A draft may propose fewer than gamma tokens by defining `proposal_length(tokens: list[int], gamma: int) ->
    int`, called once per iteration with the sequence so far (the prompt-lookup draft returns how far its n-gram
    match reaches, 0 when nothing matches: that iteration is one plain decoding step). The length must depend on
    the sequence so far only, never on the target's randomness; then the output distribution is unchanged, since
    every token is still accepted or replaced by the same rule.
    """
    cfg = SamplingConfig(temperature, top_k, top_p)
    if not _is_int(gamma) or gamma < 1:
        raise ValueError(f"gamma (draft tokens per iteration) must be an integer >= 1, got {gamma!r}")
    _check_common(input_ids, max_new_tokens)
    check_same_vocab(target, draft)
    return _speculative_loop(target, draft, input_ids, gamma=gamma, max_new_tokens=max_new_tokens,
                             target_cfg=cfg, draft_cfg=cfg, eos=_eos_set(eos_token_id), generator=generator)


def _checked_length(n, gamma: int) -> int:
    if not _is_int(n) or not 0 <= n <= gamma:
        raise ValueError(f"the draft's proposal_length returned {n!r}; it must be an integer in [0, {gamma}]")
    return n


def _speculative_loop(target, draft, input_ids, *, gamma: int, max_new_tokens: int, target_cfg: SamplingConfig,
                      draft_cfg: SamplingConfig, eos: set[int], generator: torch.Generator | None,
                      propose: Callable = sample_from, accept: Callable = speculative_accept,
                      uniform: Callable = _uniform) -> GenerationResult:
    """The loop behind `speculative_generate`. `propose`, `accept`, `uniform` and the two configs are
    parameters only so that the tests can plant known bugs in it (negative controls); do not use them. The three
    hooks act on the sampling path: greedy decoding (both configs at temperature 0) takes argmaxes and
    `greedy_accept`, which equals `speculative_accept` on one-hot distributions."""
    greedy = target_cfg.greedy and draft_cfg.greedy
    stats = GenerationStats(prompt_len=input_ids.shape[1])
    tgt = _Decoder(target, "target", stats.target_forwards)
    drf = _Decoder(draft, "draft", stats.draft_forwards)
    seq = input_ids.cpu()  # (1, L); the last token is pending: in no cache yet

    def uniforms(n: int) -> torch.Tensor:
        return uniform(generator, (n,)).cpu()

    proposal_length = getattr(draft, "proposal_length", None)
    clock = time.perf_counter
    while stats.new_tokens < max_new_tokens:
        t0 = clock()
        g = min(gamma, max_new_tokens - stats.new_tokens - 1)
        if proposal_length is not None and g > 0:
            g = _checked_length(proposal_length(seq[0].tolist(), g), g)
        start = seq.shape[1]
        # 1. the draft proposes g tokens, x_i ~ q_i, one forward each (the first also catches up on seq)
        draft_probs, drafted = [], seq
        for _ in range(g):
            logits = drf.logits_for(drafted, 1)[:, -1]  # (1, V)
            if greedy:
                x_i = logits.argmax(-1).cpu()  # (1,): q_i is one-hot there
            else:
                q_i = probs_from_logits(logits, draft_cfg)  # (1, V)
                x_i = propose(q_i, uniforms(1).to(q_i.device)).cpu()  # (1,)
                draft_probs.append(q_i)
            drafted = torch.cat([drafted, x_i[:, None]], dim=1)
        x = drafted[:, start:]  # (1, g)
        t1 = clock()
        # 2. the target scores the pending token and the g drafts in one forward: p_1 .. p_{g+1}
        logits = tgt.logits_for(drafted, g + 1)  # (1, g+1, V)
        if greedy:
            # 3. (greedy) accept the drafts that equal the target's argmax; then the target's own token
            n, token = greedy_accept(logits.argmax(-1), x.to(logits.device))
        else:
            target_probs = probs_from_logits(logits, target_cfg)  # (1, g+1, V)
            q = (torch.stack(draft_probs, dim=1).to(target_probs.device) if g else
                 target_probs.new_zeros(1, 0, target_probs.shape[-1]))  # (1, g, V)
            # 3. accept a prefix of the drafts and draw the replacement (or bonus) token
            u = uniforms(g + 1).to(target_probs.device)
            n, token = accept(target_probs, q, x.to(target_probs.device), u[None, :g], u[g:])
        n = int(n[0])
        t2 = clock()
        stats.proposed.append(g)
        stats.accepted.append(n)
        new = torch.cat([x[0, :n], token.cpu()])  # (n+1,)
        hit = [i for i, t in enumerate(new.tolist()) if t in eos]
        if hit:
            new = new[: hit[0] + 1]
        seq = torch.cat([seq, new[None]], dim=1)
        stats.new_tokens += new.numel()
        # 4. roll both caches back to everything but the new pending token; rejected drafts leave no trace
        tgt.rollback(seq.shape[1] - 1)
        drf.rollback(seq.shape[1] - 1)
        stats.iteration_seconds.append(clock() - t0)
        stats.draft_seconds.append(t1 - t0)
        stats.target_seconds.append(t2 - t1)
        if hit:
            break
    return GenerationResult(seq, stats)
