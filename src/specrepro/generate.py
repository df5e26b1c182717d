"""Autoregressive and speculative decoding for any pair of transformers causal LMs sharing a vocabulary.

References: Leviathan et al. 2022 (arXiv 2211.17192), Alg. 1; Chen et al. 2023 (arXiv 2302.01318), Alg. 2. The
acceptance rule itself lives in `specrepro.sampling` (pure, in paper notation); this module owns the loop and its
bookkeeping, `specrepro.kvcache` the caches.

One iteration is the paper's four steps, each a function below: `propose` (the draft proposes up to gamma
tokens), `verify` (the target scores them in one forward), `accept` (the acceptance rule keeps a prefix and adds
one token of the target's own), `rollback` (both caches forget the rejected drafts). Autoregressive decoding is
the same loop with no draft: every iteration proposes nothing, and `accept` draws the next token from p.

Invariant: every model's KV cache holds a prefix of its row's sequence that ends *before* the last token ("the
pending token"). A forward feeds the tokens the cache lacks, so the prompt's prefill, the draft catching up on
the tokens the target accepted, and the bonus token need no special cases.

Batches: `input_ids` (B, L) may be left-padded, with `attention_mask` marking real tokens. Each row proposes,
accepts and rolls back on its own (the cache keeps rows apart, see `specrepro.kvcache`), and a row that ends
leaves the batch, so row b's tokens are those it would get decoded alone, up to float numerics.

Random numbers: a row draws from its generator (`generator` may be one for all rows, or a list of one per row),
in this order per iteration: one uniform per draft token while drafting (step by step, rows in batch order), then
for each row in batch order gamma_b acceptance uniforms and one residual uniform. With one generator per row, a
row reads exactly the uniforms it would read decoded alone. Greedy decoding (temperature 0) draws none.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from .compiled import as_config, cached_model_factory, slots_needed
from .kvcache import CachedModel
from .protocol import feature_layers
from .sampling import SamplingConfig, greedy_accept, probs_from_logits, sample_from, speculative_accept


@dataclass
class GenerationStats:
    """What a generation did, as data. Each forward is recorded as (tokens fed per row, cache slots before it):
    at batch 1, (new tokens, cache length before).

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
    proposed: list[int] = field(default_factory=list)  # drafts proposed per iteration (gamma, or fewer at the end)
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


def tested(accepted: Iterable[int], proposed: Iterable[int]) -> int:
    """Draft tokens the target tested over iterations: n + 1 when n of g were accepted (n < g), g when all were
    (a draft is tested only if all before it were accepted)."""
    return sum(n + (n < g) for n, g in zip(accepted, proposed))


def pooled_alpha(runs: Iterable[GenerationStats]) -> float:
    """`GenerationStats.alpha` over many runs: all accepted drafts / all drafts tested."""
    runs = list(runs)
    tested_ = sum(tested(s.accepted, s.proposed) for s in runs)
    return sum(sum(s.accepted) for s in runs) / tested_ if tested_ else float("nan")


@dataclass
class GenerationResult:
    """`sequences` (B, L + N) long: row b is its input row as given (left padding included), its generated tokens,
    then `pad_token_id` after the row ended; N is the longest row's number of new tokens (`max_new_tokens` unless
    every row stopped at EOS before).

    `stats` covers the whole batch: its forwards and per-iteration times, and `proposed`/`accepted` with one entry
    per row and iteration (iteration order, rows in batch order). `rows[b]` holds row b's own counts: its prompt
    length without padding, new tokens, proposed/accepted per iteration and alpha. At batch 1, `rows[0]` has the
    same counts as `stats`."""

    sequences: torch.Tensor
    stats: GenerationStats
    rows: list[GenerationStats]


# ----------------------------------------------------------------------------------------------------------
# checks


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def vocab_size(model) -> int:
    """Number of logits a model produces per position (its output embedding rows, else `config.vocab_size`)."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    return int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)


def check_same_vocab(target, draft) -> None:
    vt, vd = vocab_size(target), vocab_size(draft)
    if vt != vd:
        raise ValueError(
            f"vocabulary mismatch: the target scores {vt} tokens, the draft {vd}. Speculative sampling compares "
            "p and q token by token, so both models must share one tokenizer and vocabulary: pick a draft from "
            "the target's model family (or one trained on its tokenizer).")


def eos_set(eos_token_id: int | Sequence[int] | None) -> set[int]:
    """The end-of-sequence ids as a set: none, one id, or several."""
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id}


def prompt_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[list[int]]:
    """The real tokens of each row of a left-padded batch, after checking its shape and padding."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError("input_ids must be a (batch, length) LongTensor, e.g. tokenizer(text, return_tensors='pt')"
                         f".input_ids; got {type(input_ids).__name__} "
                         f"{getattr(input_ids, 'shape', '')} {getattr(input_ids, 'dtype', '')}")
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. the tokenizer's BOS token)")
    ids = input_ids.cpu()
    if attention_mask is None:
        return ids.tolist()
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, got "
                         f"{getattr(attention_mask, 'shape', type(attention_mask).__name__)}")
    mask = attention_mask.cpu().long()
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("attention_mask must hold 0 (padding) and 1 (real token) only")
    if not bool((mask[:, 1:] >= mask[:, :-1]).all()):
        raise ValueError("the batch must be left-padded (padding first, then the prompt): set the tokenizer's "
                         "padding_side = 'left'")
    empty = (mask.sum(1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"row(s) {empty} of the batch are all padding: every prompt needs at least one token")
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)]


def left_pad(rows: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of token lists as left-padded `input_ids` (B, L) and `attention_mask` (B, L), 1 = real token."""
    width = max(len(r) for r in rows)
    input_ids = torch.tensor([[pad_token_id] * (width - len(r)) + list(r) for r in rows], dtype=torch.long)
    attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return input_ids, attention_mask


def _check_request(rows: list[list[int]], max_new_tokens: int, eos: set[int], pad_token_id: int | None) -> None:
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if len(rows) > 1 and eos and pad_token_id is None:
        raise ValueError("rows of a batch can end at EOS before the others: pass pad_token_id (e.g. "
                         "tokenizer.pad_token_id) to fill them up")


def checked_length(n, gamma: int) -> int:
    """A draft's `proposal_length` answer, checked: an integer in [0, gamma]."""
    if not _is_int(n) or not 0 <= n <= gamma:
        raise ValueError(f"the draft's proposal_length returned {n!r}; it must be an integer in [0, {gamma}]")
    return n


# ----------------------------------------------------------------------------------------------------------
# random numbers


def draw_uniforms(generator: torch.Generator | None, n: int) -> torch.Tensor:
    """n uniforms in [0, 1) as float64 on the CPU: every random choice of the loops is one of these."""
    device = generator.device if generator is not None else "cpu"
    return torch.rand((n,), generator=generator, device=device, dtype=torch.float64).cpu()


def _row_generators(generator, rows: int) -> list[torch.Generator | None]:
    if isinstance(generator, (list, tuple)):
        if len(generator) != rows:
            raise ValueError(f"got {len(generator)} generators for a batch of {rows} rows: pass one per row, or one")
        return list(generator)
    return [generator] * rows


# ----------------------------------------------------------------------------------------------------------
# the four steps of an iteration (Leviathan Alg. 1), for the live rows of a batch


def propose(drf: CachedModel | None, seqs: list[list[int]], lengths: list[int], cfg: SamplingConfig, gens: list,
            *, features: list[torch.Tensor] | None = None, sample=sample_from, draw=draw_uniforms
            ) -> tuple[list[list[int]], list[torch.Tensor | None]]:
    """1. The draft proposes lengths[b] tokens for row b, x_i ~ q_i, one forward per position (the first also
    catches up on the row's sequence). Returns the drafts and, when sampling, their q (1, lengths[b], V) per row.

    `features` (a draft that reads the target's states): row b's target features at positions 0 .. len - 2. The
    catch-up forward feeds each token at position j with the features of position j - 1 (zeros at j = 0); the
    drafted tokens after it go without, and the draft uses its own output there (`specrepro.protocol`)."""
    drafts: list[list[int]] = [[] for _ in seqs]
    q_rows: list[list[torch.Tensor]] = [[] for _ in seqs]
    for i in range(max(lengths, default=0)):
        active = [b for b, g in enumerate(lengths) if i < g]
        blocks = [(seqs[b] + drafts[b])[drf.fed[b]:] if b in active else [] for b in range(len(seqs))]
        feats = None
        if features is not None and i == 0:
            feats = [preceding_features(features[b], drf.fed[b], len(blocks[b])) if b in active else None
                     for b in range(len(seqs))]
        logits = drf.feed(blocks, 1, **({"features": feats} if feats is not None else {}))[:, -1]  # (B, V)
        if cfg.greedy:
            tokens = logits.argmax(-1).tolist()  # q_i is one-hot there
        else:
            q_i = probs_from_logits(logits, cfg)  # (B, V)
            tokens = {b: int(sample(q_i[b:b + 1], draw(gens[b], 1).to(q_i.device))) for b in active}
        for b in active:
            drafts[b].append(tokens[b])
            if not cfg.greedy:
                q_rows[b].append(q_i[b:b + 1])
    q = [torch.stack(r, dim=1) if r else None for r in q_rows]  # (1, g_b, V) per row
    return drafts, q


def preceding_features(features: torch.Tensor, start: int, n: int) -> torch.Tensor:
    """The target features a draft reads with the n tokens at positions start .. start + n - 1: those of positions
    start - 1 .. start + n - 2, a row of zeros standing for position -1. `features` (>= start + n - 1, F)."""
    rows = features[max(start - 1, 0):start + n - 1]
    if start == 0 and n > 0:
        rows = torch.cat([features.new_zeros(1, features.shape[-1]), rows])
    return rows


def verify(tgt: CachedModel, seqs: list[list[int]], drafts: list[list[int]]
           ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """2. The target scores each row's pending token and drafts in one forward: logits (g_b + 1, V) per row, the
    rows p_1 .. p_{g_b + 1}. When the target keeps hidden states (`CachedModel.hidden_layers`), also each row's
    features at every position it was fed, (tokens fed, F), else None."""
    n_logits = max(len(x) for x in drafts) + 1
    blocks = [(seq + x)[tgt.fed[b]:] for b, (seq, x) in enumerate(zip(seqs, drafts))]
    logits = tgt.feed(blocks, n_logits)
    features = None
    if tgt.hidden_layers:
        width = tgt.features.shape[1]
        features = [tgt.features[b, width - len(block):] for b, block in enumerate(blocks)]
    return [logits[b, n_logits - len(x) - 1:] for b, x in enumerate(drafts)], features


def accept(logits: torch.Tensor, x: list[int], q: torch.Tensor | None, cfg: SamplingConfig, gen,
           *, rule=speculative_accept, draw=draw_uniforms) -> tuple[int, int]:
    """3. One row: accept a prefix of its drafts x (g) and draw the replacement or bonus token. Greedy decoding
    takes argmaxes and `greedy_accept`, the acceptance rule on one-hot p and q. Returns (n accepted, token)."""
    x_t = torch.tensor([x], dtype=torch.long, device=logits.device)  # (1, g)
    if cfg.greedy:
        n, token = greedy_accept(logits.argmax(-1)[None], x_t)
    else:
        target_probs = probs_from_logits(logits[None], cfg)  # (1, g+1, V)
        q = q.to(target_probs.device) if q is not None else target_probs.new_zeros(1, 0, target_probs.shape[-1])
        u = draw(gen, len(x) + 1).to(target_probs.device)
        n, token = rule(target_probs, q, x_t, u[None, :len(x)], u[len(x):])
    return int(n[0]), int(token[0])


def rollback(models: list[CachedModel | None], seqs: list[list[int]]) -> None:
    """4. Every cache forgets what lies past its row's sequence but the pending token: rejected drafts leave no
    trace."""
    for m in models:
        if m is not None:
            m.keep([len(seq) - 1 for seq in seqs])


@dataclass(frozen=True)
class Steps:
    """The step functions an iteration calls. The defaults are the algorithm; `specrepro.distribution`'s planted
    bugs swap one for a known-bad version (negative controls), through its own parameters (`sample`, `rule`,
    `draw`), without touching the loop."""

    propose: Callable = propose
    accept: Callable = accept


# ----------------------------------------------------------------------------------------------------------
# the loop


def _draft_lengths(draft, seqs, new, gamma: int, max_new_tokens: int, ready: list[bool]) -> list[int]:
    """Drafts to propose per row: gamma, fewer where the row is about to reach max_new_tokens (the target adds one
    token of its own), or where the draft's `proposal_length` stops earlier; none where the draft is not ready (it
    reads target features and the target has not run yet)."""
    lengths = [min(gamma, max_new_tokens - n - 1) if ok else 0 for n, ok in zip(new, ready)]
    proposal_length = getattr(draft, "proposal_length", None)
    if proposal_length is None:
        return lengths
    return [checked_length(proposal_length(seq, g), g) if g > 0 else 0 for seq, g in zip(seqs, lengths)]


def decode(target, draft, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *, gamma: int,
           max_new_tokens: int, cfg: SamplingConfig, eos: set[int] = frozenset(), generator=None,
           pad_token_id: int | None = None, check_invariants: bool = False,
           cached_model: type[CachedModel] = CachedModel, steps: Steps | None = None) -> GenerationResult:
    """The loop behind `autoregressive_generate` (draft None, gamma 0) and `speculative_generate`, without their
    argument checks. `cached_model` is the cache bookkeeping each model gets (`specrepro.equivalence` plugs in the
    published batching bugs here), `steps` the step functions (`specrepro.distribution` plants sampling bugs there);
    `check_invariants` asserts the caches' invariants after every iteration."""
    steps = steps if steps is not None else Steps()
    seqs = prompt_rows(input_ids, attention_mask)
    _check_request(seqs, max_new_tokens, eos, pad_token_id)
    gens = _row_generators(generator, len(seqs))
    stats = GenerationStats(prompt_len=input_ids.shape[1])
    rows = [GenerationStats(prompt_len=len(seq)) for seq in seqs]
    tgt = cached_model(target, "target", stats.target_forwards, len(seqs))
    drf = cached_model(draft, "draft", stats.draft_forwards, len(seqs)) if draft is not None else None
    layers = feature_layers(draft) if draft is not None else ()
    feats: list[torch.Tensor] | None = None  # per row: the target's features at positions 0 .. len - 2
    if layers:
        tgt.hidden_layers = layers
        feats = [None] * len(seqs)
    live = list(range(len(seqs)))  # the batch's rows still decoding, by their index in input_ids
    clock = time.perf_counter
    while live:
        t0 = clock()
        ready = [feats is None or feats[r] is not None for r in live]
        lengths = _draft_lengths(draft, [seqs[r] for r in live], [rows[r].new_tokens for r in live], gamma,
                                 max_new_tokens, ready)
        old_lengths = [len(seqs[r]) for r in live]
        drafts, q = steps.propose(drf, [seqs[r] for r in live], lengths, cfg, [gens[r] for r in live],
                                  **({"features": [feats[r] for r in live]} if layers else {}))  # 1.
        t1 = clock()
        p_logits, p_features = verify(tgt, [seqs[r] for r in live], drafts)  # 2.
        results = [steps.accept(p_logits[i], drafts[i], q[i], cfg, gens[r]) for i, r in enumerate(live)]  # 3.
        t2 = clock()
        ended = []
        for i, (r, (n, token)) in enumerate(zip(live, results)):
            if feats is not None:  # keep the states of the accepted positions (the pending token and n drafts)
                kept = p_features[i] if feats[r] is None else torch.cat([feats[r], p_features[i]])
                feats[r] = kept[:old_lengths[i] + n]
            new = drafts[i][:n] + [token]
            hit = next((j for j, t in enumerate(new) if t in eos), None)
            new = new[:hit + 1] if hit is not None else new
            seqs[r] += new
            for s in (rows[r], stats):
                s.new_tokens += len(new)
                if draft is not None:  # autoregressive decoding proposes nothing and records no proposals
                    s.proposed.append(lengths[i])
                    s.accepted.append(n)
            if hit is not None or rows[r].new_tokens >= max_new_tokens:
                ended.append(i)
        rollback([tgt, drf], [seqs[r] for r in live])  # 4.
        if layers:  # drafted tokens went in with the draft's own features: forget them, feed them again with p's
            drf.keep(old_lengths)
        if check_invariants:
            _check_caches(tgt, drf, [seqs[r] for r in live])
        if ended:
            live = _leave(live, ended, [tgt, drf])
        stats.iteration_seconds.append(clock() - t0)
        stats.draft_seconds.append(t1 - t0 if draft is not None else 0.0)
        stats.target_seconds.append(t2 - t1)
    return GenerationResult(_assemble(input_ids, seqs, rows, pad_token_id), stats, rows)


def _check_caches(tgt: CachedModel, drf: CachedModel | None, seqs: list[list[int]]) -> None:
    tgt.check([len(seq) - 1 for seq in seqs])  # everything but the pending token
    if drf is not None:  # the draft may lag (it has not seen the last accepted draft or the bonus token yet)
        drf.check([min(f, len(seq) - 1) for f, seq in zip(drf.fed, seqs)])


def _leave(live: list[int], ended: list[int], models: list[CachedModel | None]) -> list[int]:
    """The rows that ended leave the batch and every cache."""
    stay = [i for i in range(len(live)) if i not in ended]
    if stay:
        for m in models:
            if m is not None:
                m.select(stay)
    return [live[i] for i in stay]


def _assemble(input_ids: torch.Tensor, seqs: list[list[int]], rows: list[GenerationStats],
              pad_token_id: int | None) -> torch.Tensor:
    """Each input row as given, then its new tokens, then padding up to the longest row."""
    width = max(s.new_tokens for s in rows)
    out = torch.full((len(seqs), input_ids.shape[1] + width), pad_token_id if pad_token_id is not None else 0,
                     dtype=torch.long)
    out[:, :input_ids.shape[1]] = input_ids.cpu()
    for b, (seq, s) in enumerate(zip(seqs, rows)):
        out[b, input_ids.shape[1]:input_ids.shape[1] + s.new_tokens] = torch.tensor(seq[len(seq) - s.new_tokens:])
    return out


def autoregressive_generate(model, input_ids: torch.Tensor, *, max_new_tokens: int, temperature: float = 1.0,
                            top_k: int | None = None, top_p: float | None = None,
                            eos_token_id: int | Sequence[int] | None = None,
                            generator: torch.Generator | Sequence[torch.Generator] | None = None,
                            attention_mask: torch.Tensor | None = None, pad_token_id: int | None = None,
                            check_invariants: bool = False, compile=False) -> GenerationResult:
    """Plain decoding, one token per forward with a KV cache: the reference speculative sampling must match.

    Each token is drawn from the warped target distribution by inverse CDF with one uniform from the row's
    generator. A row stops after `max_new_tokens` tokens or right after an EOS token. `input_ids` may be a
    left-padded batch with its `attention_mask`; `pad_token_id` fills rows that end early. `check_invariants`
    asserts the cache's invariants after every iteration (a debug switch; slower). `compile=True` (or a mode name,
    or a `specrepro.compiled.CompileConfig`) decodes a single row on a static cache with compiled forwards
    (`specrepro.compiled`): the same tokens up to float numerics, faster once compiled.
    """
    cfg = SamplingConfig(temperature, top_k, top_p)
    return decode(model, None, input_ids, attention_mask, gamma=0, max_new_tokens=max_new_tokens, cfg=cfg,
                  eos=eos_set(eos_token_id), generator=generator, pad_token_id=pad_token_id,
                  check_invariants=check_invariants,
                  cached_model=_cached_model(compile, input_ids, max_new_tokens, block=1))


def speculative_generate(target, draft, input_ids: torch.Tensor, *, gamma: int, max_new_tokens: int,
                         temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                         eos_token_id: int | Sequence[int] | None = None,
                         generator: torch.Generator | Sequence[torch.Generator] | None = None,
                         attention_mask: torch.Tensor | None = None, pad_token_id: int | None = None,
                         check_invariants: bool = False, compile=False) -> GenerationResult:
    """Speculative sampling (Leviathan Alg. 1, Chen Alg. 2): the draft proposes gamma tokens, the target scores
    them in one forward of gamma+1 tokens, and `speculative_accept` keeps a prefix plus one token of its own.

    The output is distributed exactly as `autoregressive_generate(target, ...)` with the same sampling settings
    (up to floating-point numerics: the same seed does *not* give the same text). With temperature 0 the output
    equals greedy decoding of the target token for token, except where float near-ties flip an argmax.

    The last iteration proposes only as many drafts as tokens remain (minus the one the target adds), and a row
    stops right after an EOS token even in the middle of an accepted block.

    A draft may propose fewer than gamma tokens by defining `proposal_length(tokens: list[int], gamma: int) ->
    int`, called once per iteration with the row's sequence so far (the prompt-lookup draft returns how far its
    n-gram match reaches, 0 when nothing matches: that iteration is one plain decoding step). The length must
    depend on the sequence so far only, never on the target's randomness; then the output distribution is
    unchanged, since every token is still accepted or replaced by the same rule.

    Batches: `input_ids` (B, L) left-padded with `attention_mask` (B, L); rows are independent draws, each
    distributed as the target's for its own prompt; `pad_token_id` fills rows that end early.
    `check_invariants` asserts both caches' invariants after every iteration (a debug switch; slower).

    `compile=True` (or a mode name, or a `specrepro.compiled.CompileConfig`) decodes a single row on static caches
    with compiled forwards of one token and of gamma + 1 tokens (`specrepro.compiled`), for the target, a
    transformers draft and a draft that offers a static cache (the feature-reading one); a draft with its own cache
    and none to offer (prompt lookup) stays eager. Same algorithm, same tokens up to
    float numerics; the first call compiles (minutes on a CPU), later ones reuse the graphs.
    """
    cfg = SamplingConfig(temperature, top_k, top_p)
    if not _is_int(gamma) or gamma < 1:
        raise ValueError(f"gamma (draft tokens per iteration) must be an integer >= 1, got {gamma!r}")
    check_same_vocab(target, draft)
    return decode(target, draft, input_ids, attention_mask, gamma=gamma, max_new_tokens=max_new_tokens, cfg=cfg,
                  eos=eos_set(eos_token_id), generator=generator, pad_token_id=pad_token_id,
                  check_invariants=check_invariants,
                  cached_model=_cached_model(compile, input_ids, max_new_tokens, block=gamma + 1))


GREEDY = SamplingConfig(0)


def decode_in_batches(target, draft, prompts: list[list[int]], *, batch_size: int, max_new_tokens: int,
                      gamma: int = 3, pad_token_id: int, eos_token_id: int | None = None,
                      cached_model: type[CachedModel] = CachedModel, cfg: SamplingConfig = GREEDY,
                      seed: int | None = None) -> tuple[list[list[int]], list[GenerationResult]]:
    """Decoding of `prompts` in left-padded batches of `batch_size` (speculative with `draft`, else autoregressive),
    greedy unless `cfg` samples. When sampling, prompt i draws from its own generator seeded `seed + i`, so its
    draws do not depend on the batch it lands in. Returns every prompt's new tokens and each batch's result."""
    if cfg.temperature > 0 and seed is None:
        raise ValueError("sampling needs a seed: pass seed=<int> (prompt i draws from a generator seeded seed + i)")
    outputs, results = [], []
    for start in range(0, len(prompts), batch_size):
        ids, mask = left_pad(prompts[start:start + batch_size], pad_token_id)
        gens = ([torch.Generator().manual_seed(seed + i) for i in range(start, start + ids.shape[0])]
                if seed is not None else None)
        r = decode(target, draft, ids, mask, gamma=gamma if draft is not None else 0, max_new_tokens=max_new_tokens,
                   cfg=cfg, eos={eos_token_id} if eos_token_id is not None else set(), generator=gens,
                   pad_token_id=pad_token_id, cached_model=cached_model)
        outputs += [r.sequences[b, ids.shape[1]:ids.shape[1] + s.new_tokens].tolist() for b, s in enumerate(r.rows)]
        results.append(r)
    return outputs, results


def _cached_model(compile, input_ids: torch.Tensor, max_new_tokens: int, *, block: int):
    """The cache bookkeeping `compile=` asks for: `CachedModel` (eager), or the compiled path's factory."""
    config = as_config(compile)
    if config is None:
        return CachedModel
    slots = config.slots or slots_needed(input_ids.shape[-1], max_new_tokens, block)
    return cached_model_factory(config, block=block, slots=slots)
