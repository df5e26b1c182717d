"""Tiny random-initialised model pairs for correctness checks and smoke runs (no download, built from configs).

The target is a Llama, the draft a GPT-2: two different architectures sharing a vocabulary, which is all that
speculative sampling asks of a pair. Weights are drawn with a large init scale so that p and q are far from
uniform and far from each other (acceptance well below 1), which is what makes the distribution tests sharp.
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def tiny_target(vocab_size: int = 8, *, seed: int = 0, dtype: torch.dtype = torch.float64,
                hidden_size: int = 16, layers: int = 2, init_scale: float = 0.5) -> LlamaForCausalLM:
    """A 2-layer Llama with grouped-query attention (2 heads, 1 KV head)."""
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=256, initializer_range=init_scale, tie_word_embeddings=False,
                      bos_token_id=0, eos_token_id=vocab_size - 1, pad_token_id=None)
    return _build(LlamaForCausalLM, cfg, seed, dtype)


def tiny_draft(vocab_size: int = 8, *, seed: int = 1, dtype: torch.dtype = torch.float64,
               hidden_size: int = 8, layers: int = 1, init_scale: float = 0.5) -> GPT2LMHeadModel:
    """A 1-layer GPT-2."""
    cfg = GPT2Config(vocab_size=vocab_size, n_embd=hidden_size, n_layer=layers, n_head=2, n_positions=256,
                     initializer_range=init_scale, bos_token_id=0, eos_token_id=vocab_size - 1)
    return _build(GPT2LMHeadModel, cfg, seed, dtype)


def tiny_pair(vocab_size: int = 8, *, seed: int = 0, dtype: torch.dtype = torch.float64):
    """(target, draft) with a shared vocabulary; `seed` fixes both."""
    return (tiny_target(vocab_size, seed=seed, dtype=dtype),
            tiny_draft(vocab_size, seed=seed + 1, dtype=dtype))


def widened(config, width: int, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """A random Llama with `config`'s depth, vocabulary and head size at hidden size about `width` (a whole number of
    heads; KV heads and the MLP at the config's ratios): models of one depth and several widths, to time a decode
    step against the bytes it reads with the framework's per-layer work held fixed. Random weights: for timing
    only."""
    head = config.hidden_size // config.num_attention_heads
    heads = max(1, round(width / head))
    kv = max(1, round(heads * config.num_key_value_heads / config.num_attention_heads))
    while heads % kv:
        kv -= 1
    d = heads * head
    cfg = LlamaConfig(vocab_size=config.vocab_size, hidden_size=d,
                      intermediate_size=round(config.intermediate_size * d / config.hidden_size),
                      num_hidden_layers=config.num_hidden_layers, num_attention_heads=heads, num_key_value_heads=kv,
                      max_position_embeddings=config.max_position_embeddings,
                      tie_word_embeddings=config.tie_word_embeddings, rms_norm_eps=config.rms_norm_eps,
                      rope_theta=getattr(config, "rope_theta", 10000.0), initializer_range=0.02)
    return _build(LlamaForCausalLM, cfg, seed, dtype)


def tiny_feature_draft(target, *, seed: int = 2, keep: int | None = None, init_scale: float = 3.0,
                       regress: bool = False, layers: int = 1):
    """A feature-reading draft (`specrepro.eagle.FeatureDraft`, `layers` decoder layers) on a tiny Llama target,
    reading the target's embedding and its last layer's output (`regress`: the top state alone, EAGLE-1), its cut
    head keeping `keep` ids (default: all but one), with weights drawn at `init_scale` so that q is far from p (at
    0.5, a planted bug in the residual goes unseen)."""
    from .eagle import FeatureDraft

    vocab, n = target.config.vocab_size, target.config.num_hidden_layers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = FeatureDraft(target, torch.arange(keep or vocab - 1), feature_layers=(n,) if regress else (0, n),
                             layers=layers, regress=regress)
        with torch.no_grad():
            for p in draft.parameters():
                if p.dim() >= 2:  # the matrices; norms keep their weights, the head its zero bias
                    p.normal_(0.0, init_scale)
    return draft.to(next(target.parameters()).dtype).eval()


def _build(cls, cfg, seed: int, dtype: torch.dtype):
    # fork_rng: building a model draws from the global RNG; the library never leaves it changed
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(cfg)
    return model.to(dtype).eval()
