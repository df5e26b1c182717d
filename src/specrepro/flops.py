"""Counting the work: matmul FLOPs (analytic and measured), all arithmetic operations, bytes moved, and a ledger.

Claim 3 (Leviathan et al. 2022, Sec. 3.5, Thm 3.11): speculative decoding performs *more* arithmetic operations
than autoregressive decoding, gamma+1 times as many concurrently in a verification pass, and wins anyway because
batch-1 decoding is memory-bandwidth bound (Chen et al. 2023, Sec. 1; the roofline, Williams et al. 2009).

Two independent FLOP counters must agree (2 FLOPs per multiply-add, matmul-like work only):
1. `forward_flops(config, new_tokens, cache_len)`: analytic, from the model's config.
2. `measured_forward_flops(model, new_tokens, cache_len)`: torch's `FlopCounterMode` around the real forward. On
   CPU, `scaled_dot_product_attention` dispatches to a fused kernel FlopCounterMode has no formula for, so it would
   count attention as 0; the measurement runs under the MATH backend, which computes attention as two batched
   matmuls that are counted.
`count_operations` adds every other arithmetic op (elementwise, reductions, softmax, norms, sampling) at the aten
dispatch level, so "arithmetic operations" is not only matmul FLOPs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from . import theory
from .generate import GenerationStats, pooled_alpha
from .kvcache import make_cache, model_forward

# model_type -> whether the MLP is gated (three matrices: gate, up, down) or plain (two: up, down)
GATED_MLP = {"llama": True, "mistral": True, "qwen2": True, "qwen3": True, "gemma": True, "gemma2": True,
             "phi3": True, "olmo": True, "smollm3": True, "phi": False, "gpt2": False, "gpt_neox": False,
             "gptj": False, "opt": False}


@dataclass(frozen=True)
class Shape:
    """The numbers of a decoder-only transformer that FLOPs and bytes depend on."""

    d_model: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    d_ff: int
    vocab: int
    gated: bool
    tied: bool


def shape_of(config) -> Shape:
    """Read a transformers config (Llama-, Phi-, GPT-2-style and relatives)."""
    mt = getattr(config, "model_type", None)
    if mt not in GATED_MLP:
        raise ValueError(f"no FLOP formula for model_type {mt!r}; known: {sorted(GATED_MLP)}")
    d = getattr(config, "hidden_size", None) or config.n_embd
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    kv = getattr(config, "num_key_value_heads", None) or heads
    hd = getattr(config, "head_dim", None) or d // heads
    ff = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * d
    layers = config.num_hidden_layers if getattr(config, "num_hidden_layers", None) is not None else config.n_layer
    return Shape(d, layers, heads, kv, hd, ff, config.vocab_size, GATED_MLP[mt],
                 bool(getattr(config, "tie_word_embeddings", True)))


def forward_flops_breakdown(config, new_tokens: int, cache_len: int = 0, logits: int | None = None) -> dict[str, int]:
    """Analytic matmul FLOPs of one forward of `new_tokens` tokens after `cache_len` cached ones, by part.

    Attention scores and values are counted over all cache_len + new_tokens keys for every query (the dense
    matmul a kernel computes, causal mask or not). `logits` = positions sent through the LM head (default all).
    """
    s = shape_of(config) if not isinstance(config, Shape) else config
    T, S = new_tokens, cache_len + new_tokens
    L = T if logits is None else logits
    q_dim, kv_dim = s.heads * s.head_dim, s.kv_heads * s.head_dim
    per_layer = {
        "attn_proj": 2 * T * s.d_model * (2 * q_dim + 2 * kv_dim),  # q, k, v, o
        "attn_scores": 2 * s.heads * T * S * s.head_dim,  # q k^T
        "attn_values": 2 * s.heads * T * S * s.head_dim,  # softmax(.) v
        "mlp": 2 * T * s.d_model * s.d_ff * (3 if s.gated else 2),
    }
    out = {k: v * s.layers for k, v in per_layer.items()}
    out["lm_head"] = 2 * L * s.d_model * s.vocab
    return out


def forward_flops(config, new_tokens: int, cache_len: int = 0, logits: int | None = None) -> int:
    """Analytic matmul FLOPs (2 per multiply-add) of one forward; see `forward_flops_breakdown`."""
    return sum(forward_flops_breakdown(config, new_tokens, cache_len, logits).values())


def _random_cache(model, cache_len: int):
    cache = make_cache(model)
    if cache_len:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(model.config.vocab_size, (1, cache_len), generator=g).to(next(model.parameters()).device)
        model_forward(model, ids, cache, logits_to_keep=1)
    return cache


@torch.no_grad()
def measured_forward_flops(model, new_tokens: int, cache_len: int = 0, logits: int | None = None) -> int:
    """FLOPs of the real forward counted by FlopCounterMode, attention included (MATH SDPA backend)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        cache = _random_cache(model, cache_len)
        ids = torch.zeros(1, new_tokens, dtype=torch.long, device=next(model.parameters()).device)
        with FlopCounterMode(display=False) as counter:
            model_forward(model, ids, cache, logits_to_keep=logits or 0)
    return counter.get_total_flops()


# ---- every arithmetic operation ---------------------------------------------------------------------------------

# aten ops that move or view data but compute nothing
_NO_ARITHMETIC = {"view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "contiguous", "clone",
                  "copy_", "copy", "slice", "select", "unsqueeze", "squeeze", "cat", "stack", "index_select",
                  "embedding", "detach", "alias", "split", "split_with_sizes", "empty", "zeros", "ones", "full",
                  "arange", "_to_copy", "lift_fresh", "index", "gather", "scatter", "new_zeros", "new_empty",
                  "zeros_like", "ones_like", "empty_like", "full_like", "fill_", "masked_fill", "where",
                  "_reshape_alias", "as_strided", "unbind", "repeat", "narrow", "flip", "scalar_tensor",
                  "new_ones", "sym_size", "sym_stride", "item", "_local_scalar_dense", "bernoulli_", "rand",
                  "randint", "lift_fresh_copy", "resolve_conj", "resolve_neg", "unfold", "diagonal",
                  "_has_compatible_shallow_copy_type", "is_nonzero", "index_put_", "index_put", "slice_scatter",
                  "select_scatter", "set_", "resize_", "_unsafe_index"}
# ops costing several arithmetic operations per output element (a documented convention, not hardware truth)
_PER_ELEMENT = {"_softmax": 5, "_safe_softmax": 5, "_log_softmax": 5, "softmax": 5, "log_softmax": 5, "silu": 4,
                "gelu": 8, "tanh": 1, "native_layer_norm": 5, "rsqrt": 1, "pow": 1, "exp": 1, "sigmoid": 4}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "cumsum", "cumprod", "prod",
               "topk", "sort", "any", "all", "var", "std", "norm", "searchsorted", "logsumexp"}


@dataclass
class OperationCount:
    """Arithmetic operations by category: matmul FLOPs (2 per multiply-add), elementwise, reductions."""

    matmul: int = 0
    elementwise: int = 0
    reduction: int = 0
    by_op: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return self.matmul + self.elementwise + self.reduction

    @property
    def non_matmul_fraction(self) -> float:
        return (self.elementwise + self.reduction) / self.total if self.total else 0.0


class _OpCounter(TorchDispatchMode):
    def __init__(self, count: OperationCount):
        super().__init__()
        self.count = count
        from torch.utils.flop_counter import FlopCounterMode as _F

        self._flops = _F(display=False)
        self._registry = self._flops.flop_registry

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        name = packet.__name__.rstrip("_") if packet.__name__ not in _NO_ARITHMETIC else packet.__name__
        if packet in self._registry:
            flops = self._registry[packet](*args, **kwargs, out_val=out)
            self.count.matmul += flops
            self.count.by_op[packet.__name__] += flops
            return out
        if packet.__name__ in _NO_ARITHMETIC or name in _NO_ARITHMETIC:
            return out
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        result = out[0] if isinstance(out, (tuple, list)) else out
        if not isinstance(result, torch.Tensor):
            return out
        if name in _REDUCTIONS and first is not None:
            n = first.numel()
            self.count.reduction += n
        else:
            n = result.numel() * _PER_ELEMENT.get(name, 1)
            self.count.elementwise += n
        self.count.by_op[packet.__name__] += n
        return out


def count_operations(fn, *args, **kwargs) -> tuple[OperationCount, object]:
    """Run fn(*args, **kwargs) under a dispatch-level counter of arithmetic operations (MATH SDPA backend, so
    attention is counted). Matmul-like ops use torch's FLOP formulas; every other op costs one operation per output
    element (softmax/norm/activation a few, see _PER_ELEMENT), reductions one per input element; data movement
    (views, copies, indexing, concatenation) costs none. Returns (count, fn's result)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    count = OperationCount()
    with sdpa_kernel(SDPBackend.MATH), torch.no_grad(), _OpCounter(count):
        result = fn(*args, **kwargs)
    return count, result



def operations_per_token(generate, prompts: list[torch.Tensor], max_new_tokens: int) -> dict:
    """Every arithmetic operation of whole generations, counted at dispatch (`count_operations`), per generated token
    after the first: every iteration of the real runs counts, the short last ones and the drafts' rejected work
    included. The prompt's prefill and first token are left out by subtracting a run of one new token on the same
    prompt. `generate(ids, max_new_tokens=n)` returns a `GenerationResult`.

    Returns operations and matmul FLOPs per token, the tokens they were counted over, and the generations."""
    total = matmul = tokens = 0
    results = []
    for ids in prompts:
        full, result = count_operations(generate, ids, max_new_tokens=max_new_tokens)
        first, _ = count_operations(generate, ids, max_new_tokens=1)
        total += full.total - first.total
        matmul += full.matmul - first.matmul
        tokens += result.sequences.shape[1] - ids.shape[1] - 1
        results.append(result)
    if tokens < 1:
        raise ValueError("the generations made no token after the first: raise max_new_tokens")
    return dict(operations_per_token=total / tokens, matmul_per_token=matmul / tokens, tokens=tokens,
                results=results)


# ---- bytes moved, for the roofline ------------------------------------------------------------------------------


def forward_bytes(config, new_tokens: int, cache_len: int = 0, bytes_per_param: int = 4,
                  logits: int | None = None) -> dict[str, int]:
    """Minimum bytes one forward moves from memory: every weight once (the embedding only for the looked-up rows,
    unless tied to the LM head, which reads it whole), the KV cache read, the new K/V written, and the logits
    written. Activations are assumed to stay in cache. A lower bound, as the roofline needs."""
    s = shape_of(config) if not isinstance(config, Shape) else config
    T, L = new_tokens, new_tokens if logits is None else logits
    b = bytes_per_param
    kv_dim = s.kv_heads * s.head_dim
    attn = s.d_model * (2 * s.heads * s.head_dim + 2 * kv_dim)
    mlp = s.d_model * s.d_ff * (3 if s.gated else 2)
    layer_params = attn + mlp + 2 * s.d_model  # + norms
    embedding = s.vocab * s.d_model
    return {
        "weights": b * (s.layers * layer_params + s.d_model + embedding + (0 if s.tied else T * s.d_model)),
        "kv_read": b * 2 * s.layers * kv_dim * cache_len,
        "kv_write": b * 2 * s.layers * kv_dim * T,
        "logits": b * L * s.vocab,
    }


def arithmetic_intensity(config, new_tokens: int, cache_len: int = 0, bytes_per_param: int = 4) -> float:
    """FLOPs per byte of one forward (the roofline's x axis)."""
    return forward_flops(config, new_tokens, cache_len) / sum(
        forward_bytes(config, new_tokens, cache_len, bytes_per_param).values())


# ---- the ledger: where a generation's operations went ---------------------------------------------------------


@dataclass(frozen=True)
class Ledger:
    """Matmul FLOPs a generation spent, split into work on tokens that were kept and work thrown away."""

    target_useful: int
    target_wasted: int
    draft_useful: int
    draft_wasted: int
    prefill: int = 0  # both models' work on the prompt (all but its last token), counted apart

    @property
    def total(self) -> int:
        return self.target_useful + self.target_wasted + self.draft_useful + self.draft_wasted + self.prefill

    @property
    def decode(self) -> int:
        """Work after the prompt: what Thm 3.11 compares."""
        return self.total - self.prefill

    @property
    def wasted_fraction(self) -> float:
        return (self.target_wasted + self.draft_wasted) / self.total if self.total else 0.0


def flops_config(model):
    """The config the FLOP formulas read, or None for a model that does no matrix work (prompt lookup)."""
    config = getattr(model, "config", None)
    return config if getattr(config, "model_type", None) in GATED_MLP else None


def iteration_flops(stats, target_config, draft_config=None) -> list[dict]:
    """Per-iteration matmul FLOPs of a speculative generation, as data: one dict per target verification with
    gamma (drafts proposed), accepted, tokens (emitted), target/draft FLOPs, split useful/wasted (see `ledger`).
    The prompt's prefill (its first L - 1 tokens, carried by each model's first forward) is left out."""
    L = stats.prompt_len - 1
    draft_iter = iter(stats.draft_forwards)
    rows, first_draft = [], True
    for i, ((n_tok, cache_len), g, n) in enumerate(zip(stats.target_forwards, stats.proposed, stats.accepted)):
        f = forward_flops(target_config, n_tok, cache_len, logits=g + 1)
        if i == 0 and L:
            f -= forward_flops(target_config, L, 0, logits=0)
            n_tok -= L
        wasted = f * (g - n) // n_tok
        row = dict(gamma=g, accepted=n, tokens=n + 1, target_useful=f - wasted, target_wasted=wasted,
                   draft_useful=0, draft_wasted=0)
        for j in range(1, g + 1):
            d_tok, d_cache = next(draft_iter)
            fd = forward_flops(draft_config, d_tok, d_cache, logits=1) if draft_config is not None else 0
            if first_draft and L and draft_config is not None:
                fd -= forward_flops(draft_config, L, 0, logits=0)
            first_draft = False
            row["draft_useful" if j <= n else "draft_wasted"] += fd
        rows.append(row)
    return rows


def ledger(stats, target_config, draft_config=None) -> Ledger:
    """Split a generation's FLOPs (from its GenerationStats) into useful and wasted.

    Target: a verification forward of g+1 tokens with n accepted keeps n+1 positions' work; the other g-n are
    waste (rejected drafts). Draft: the forward that proposed x_i is useful if x_i was accepted (i <= n), waste
    otherwise. Autoregressive stats (no drafts) are all useful. The prompt's prefill (its first L - 1 tokens,
    which the first forward of each model carries) is booked apart in `prefill`. FLOPs of a partly useful forward
    are split in proportion to tokens.
    """
    L = stats.prompt_len - 1
    prefill = forward_flops(target_config, L, 0, logits=0) if L else 0
    if draft_config is not None and stats.draft_forwards and L:
        prefill += forward_flops(draft_config, L, 0, logits=0)
    if not stats.proposed:  # autoregressive
        tu = sum(forward_flops(target_config, n, c, logits=1) for n, c in stats.target_forwards) - prefill
        return Ledger(tu, 0, 0, 0, prefill)
    rows = iteration_flops(stats, target_config, draft_config)
    return Ledger(*(sum(r[k] for r in rows) for k in ("target_useful", "target_wasted", "draft_useful",
                                                        "draft_wasted")), prefill)


# ---- Thm 3.11 against the count --------------------------------------------------------------------------------


def c_hat(target_config, draft_config, context: int) -> float:
    """Leviathan's c_hat (Sec. 3.5): matmul FLOPs of one draft decode step over one target decode step, both at
    `context` cached tokens; 0 for a draft that does no matrix work (`flops_config` None: prompt lookup)."""
    if draft_config is None:
        return 0.0
    return forward_flops(draft_config, 1, context, logits=1) / forward_flops(target_config, 1, context, logits=1)


def operations_vs_theory(ar_stats: list, sp_stats: list, gamma: int, target_config, draft_config,
                         context: int) -> dict:
    """Counted matmul FLOPs per generated token of speculative generations over autoregressive ones of the same
    prompts (the prefill left out of both), against Thm 3.11 at the measured alpha and c_hat.

    Thm 3.11 describes iterations that propose a full gamma, so only those count on the speculative side, for the
    FLOPs, the tokens and alpha alike: the last iterations of a run, shortened to the tokens left, and those where
    prompt lookup found less to copy are left out. `context`: cached tokens at which c_hat is taken (the mean
    decoding context). Returns alpha, c_hat, measured_ops_factor, thm_3_11, rel_gap (measured / Thm 3.11 - 1),
    wasted_fraction (of the counted speculative FLOPs, spent on rejected drafts) and tokens_per_iteration (the mean
    over runs of each run's, every iteration included)."""
    full = [r for s in sp_stats for r in iteration_flops(s, target_config, draft_config) if r["gamma"] == gamma]
    sp_flops = sum(r["target_useful"] + r["target_wasted"] + r["draft_useful"] + r["draft_wasted"] for r in full)
    sp_wasted = sum(r["target_wasted"] + r["draft_wasted"] for r in full)
    sp_tokens = sum(r["tokens"] for r in full)
    ar_flops = sum(ledger(s, target_config).decode for s in ar_stats)
    ar_tokens = sum(s.new_tokens for s in ar_stats)
    kept = [GenerationStats(s.prompt_len, proposed=[g for g in s.proposed if g == gamma],
                            accepted=[n for n, g in zip(s.accepted, s.proposed) if g == gamma]) for s in sp_stats]
    alpha = pooled_alpha(kept)
    ratio = c_hat(target_config, draft_config, context)
    measured = (sp_flops / sp_tokens) / (ar_flops / ar_tokens)
    predicted = theory.operations_factor(min(alpha, 1 - 1e-9), gamma, ratio)
    return dict(alpha=alpha, c_hat=ratio, measured_ops_factor=measured, thm_3_11=predicted,
                rel_gap=measured / predicted - 1, wasted_fraction=sp_wasted / sp_flops,
                tokens_per_iteration=float(np.mean([s.tokens_per_iteration for s in sp_stats])))
