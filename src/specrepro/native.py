"""The native decoder step: a Llama-architecture model's forward of a few tokens on a static cache, every layer in one
call of this package's C++ (`gemv`'s operator `specrepro::llama_step`), no Python and no compiled graph per layer.

A compiled decode step of SmolLM2 with the few-row kernel set still runs ~400 kernels a step from inductor's Python
wrapper, ~6 ms beyond a read of its bytes on the 2-core hosts (`python -m specrepro.walltime`); llama.cpp runs its
graph in C with the threads waiting at barriers between the steps. This is that design for the layers this package
already has: per layer, RMS norm, the q/k/v products (few_rows' blocks, the weight rows split between the threads),
the rotary embedding and the cache write, `cache_attention`'s chunked attention and merge, the output product added
to the residual stream, RMS norm, gate and up with SiLU, the down product added; one OpenMP region for all layers,
barriers between the steps. Python keeps the embedding lookup, the final norm and the head (few_rows).

It runs where `compiled`'s mode "native" is asked for and the model is a plain Llama decoder (transformers'
`LlamaForCausalLM` layers: no biases, SiLU, sdpa attention, rotary embedding) whose linear layers run the few-row
kernel (`kernels.use_kernel(model, "few_rows")`, which builds the operator), float32 on the CPU, on transformers'
`StaticCache`, the hidden states a feature-reading draft reads included (`compiled`'s `_forward_features`).
Everything else in that mode (other models, other kernels or dtypes, a feature draft's own forward) runs the
max-autotune compiled graph. The same math as the compiled path up to float
summation order; `tests/test_native.py` compares logits and tokens.
"""

from __future__ import annotations

import weakref

import torch

_LAYER = "LlamaDecoderLayer"
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (graph key, NativeStep or the reason)


def unsupported(model) -> str | None:
    """Why the native step cannot run `model`, or None where it can."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    config = getattr(model, "config", None)
    if layers is None or not len(layers) or any(type(layer).__name__ != _LAYER for layer in layers):
        return "not a Llama decoder (transformers' LlamaDecoderLayer layers)"
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "_attn_implementation", None) != "sdpa":
        return "its activation is not SiLU or its attention not sdpa"
    if getattr(model, "lm_head", None) is None or getattr(inner, "rotary_emb", None) is None:
        return "no output head or rotary embedding where a Llama model has them"
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(type(m).__name__ != "FewRowsLinear" for m in linears + (model.lm_head,)):
            return "its linear layers do not run the few-row kernel (kernels.use_kernel(model, 'few_rows'))"
        if any(m.bias is not None for m in linears):
            return "its linear layers have biases"
    p = model.lm_head.weight
    if p.dtype != torch.float32 or p.device.type != "cpu" or model.training:
        return "not float32 on the CPU in eval mode"
    return None


class NativeStep:
    """The native step of one model: its weights gathered once (9 per layer), its rotary tables per cache size."""

    def __init__(self, model):
        self.model = weakref.ref(model)
        layers = model.model.layers
        self.weights = [t.detach() for layer in layers for t in (
            layer.input_layernorm.weight, layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
            layer.self_attn.v_proj.weight, layer.self_attn.o_proj.weight, layer.post_attention_layernorm.weight,
            layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight, layer.mlp.down_proj.weight)]
        self.weights = [w if w.is_contiguous() else w.contiguous() for w in self.weights]
        config = model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.eps = float(layers[0].input_layernorm.variance_epsilon)
        self.scale = float(layers[0].self_attn.scaling)
        self.tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.shape = (1, self.kv_heads, 1, layers[0].self_attn.head_dim)  # a token's keys: how a cache is allocated

    def rotary(self, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (slots, head size) of the model's rotary embedding, at positions 0 .. slots - 1."""
        if slots not in self.tables:
            model = self.model()
            x = torch.zeros(1, 1, model.config.hidden_size)
            cos, sin = model.model.rotary_emb(x, torch.arange(slots).unsqueeze(0))
            self.tables[slots] = (cos[0].float().contiguous(), sin[0].float().contiguous())
        return self.tables[slots]

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, cache, n_logits: int, features: tuple[int, ...] | None = None):
        """Logits (1, n_logits, V) of the last n_logits of the tokens `ids` (1, W), fed to `cache` (a transformers
        `StaticCache`), which moves on by W; with `features` (indices of transformers' `hidden_states`, 0 .. the
        number of layers), (logits, those states concatenated, (1, W, len(features) * d)), as `compiled`'s
        `_forward_features` returns them. A cache that holds nothing yet (a prompt no longer than a verification
        block) is allocated here, as transformers allocates it at its first update."""
        model = self.model()
        layers = cache.layers
        for c in layers:
            if not c.is_initialized:
                c.lazy_initialization(torch.empty(self.shape), torch.empty(self.shape))
        cos, sin = self.rotary(layers[0].max_cache_len)
        n = len(model.model.layers)
        keep = sorted({i for i in features or () if i < n})  # the top state is the final norm's output, below
        out = torch.ops.specrepro.llama_step.default(
            model.model.embed_tokens(ids[0]), self.weights, [c.keys for c in layers], [c.values for c in layers],
            [c.cumulative_length for c in layers], cos, sin, self.heads, self.kv_heads, self.eps, self.scale, keep)
        if features is None:
            return model.lm_head(model.model.norm(out[0, -n_logits:])).unsqueeze(0)
        top = model.model.norm(out[0])
        states = [top if i == n else out[1 + keep.index(i)] for i in features]
        return model.lm_head(top[-n_logits:]).unsqueeze(0), torch.cat(states, -1).unsqueeze(0)


def step_for(model, key: str, cache) -> NativeStep | None:
    """The native step for `model` as it is now (`key`: `compiled.graph_key(model)`, which changes with its kernel,
    dtype, mode and attention), or None where it cannot run it or `cache` is not a static cache of full-length layers
    (transformers' `StaticLayer`)."""
    if any(type(c).__name__ != "StaticLayer" for c in cache.layers):
        return None
    kept = _STEPS.get(model)
    if kept is None or kept[0] != key:
        why = unsupported(model)
        kept = (key, NativeStep(model) if why is None else why)
        _STEPS[model] = kept
    return kept[1] if isinstance(kept[1], NativeStep) else None
