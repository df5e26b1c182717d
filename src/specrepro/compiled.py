"""The compiled decode path: a static KV cache and forwards of fixed shape, compiled once and reused.

The recipe gpt-fast made known (and transformers' `cache_implementation="static"` follows): batch-1 decoding is
memory-bound only once the per-step overhead is gone, and most of that overhead is the framework's, not the math's
(Python dispatch of ~300 small ops per step, a cache that grows by concatenation). So:

- the cache is a transformers `StaticCache` of a fixed number of slots, allocated once; its layers keep the fill
  level as a tensor, so a forward has the same shapes and the same graph at every position;
- a forward of one token (a decode step, a draft step) and a forward of `block` = gamma + 1 tokens (a
  verification; shorter blocks are padded up to it) are each compiled once with `torch.compile(fullgraph=True,
  dynamic=False)`, so a whole decode needs two compiled graphs per model. The prompt's prefill, the only other
  width, runs eagerly on the same cache;
- attention reads the cache in place: transformers' sdpa, compiled, widens every layer's keys and values to all
  query heads (`repeat_kv`), a copy of the whole cache per step, so the compiled forwards run sdpa with the grouped
  heads left to the kernel (`_sdpa_gqa`; on SmolLM2 the same logits, bit for bit; 07 section 1 times the step
  every run). Where the model's linear layers run the few-row kernel, the forwards run this package's own attention
  over the cache instead (`_cache_attention`, `gemv.cache_attention`), which reads only the filled slots where sdpa
  reads all of them, masked; `python -m specrepro.walltime --beside-read N` times the two against each other;
- rolling back moves the fill level (`StaticCache.crop`), nothing is copied; the padding of a short block is rolled
  back the same way right after its forward, so the cache never holds a token of it.

On the CPU, compilation alone does not reach the floor: with torch's own product the linear layers stay far below
the memory's speed (`specrepro.kernels`). With this package's few-row kernel (`kernels.use_kernel(model,
"few_rows")`) each linear layer is one opaque operator and compilation removes most of the remaining per-op
overhead; 07-regime section 1 times every kernel eagerly and compiled against the memory floor on the machine it runs
on. For torch's product the fastest mode we found is max-autotune with freezing (the weights become constants, which
lets inductor use its own few-row GEMM instead of MKL's):
compiling one graph takes from under a minute to about three minutes on 2 cores (inductor keeps its autotuning
results on disk, so a later process compiles faster). `mode="max-autotune-cpp"` adds inductor's C++ wrapper (the
Python that calls the graph's kernels at every step, about 420 calls a decode step of SmolLM2 with the few-row
kernel set, compiled; a longer compile, cached on disk like the others, so paid once per machine and graph), an option
for long decodes that `python -m specrepro.walltime --beside-read N --versus max-autotune-cpp` times against
max-autotune and 07 races against it when its `compile_modes` lists it (`walltime.race_modes`; by default 07 races
max-autotune alone, the wrapper's first compiles being several times slower on 2 cores). `mode="default"` compiles
in about a minute and `mode="eager"`
runs the same static-cache bookkeeping uncompiled (tests, debugging, and the fallback where compilation fails).
On a GPU, `mode="reduce-overhead"` adds CUDA graphs.

`mode="native"` compiles nothing where it applies: a plain Llama decoder on the few-row kernel set in float32 runs
each forward of the static path as one call of this package's C++ (`specrepro.native`: every layer in one OpenMP
region, the threads meeting at barriers), the design llama.cpp's CPU backend follows, the hidden states a
feature-reading draft reads included; the forwards of other models and kernels run max-autotune graphs. On the AMD EPYC
host its decode step of SmolLM2 came to 1.02x a read of its bytes where max-autotune's took 1.28x (ad hoc, 7 rounds
beside reads; 07 section 1c measures it every run).

Compiled code is cached by torch per function and model (guards on `graph_key`, not on the model's modules), so a
second `speculative_generate(..., compile=True)` with the same models and cache size reuses it; cache sizes are
rounded up to a multiple of `SLOT_BUCKET` so that prompts of different lengths share graphs.

This path serves batch 1 (the row of `generate`'s loop) and transformers causal LMs. A draft that reads the target's
features (`specrepro.eagle`) gets them from the same compiled graphs (`_forward_features`: the hidden states come out
beside the logits, so a verification still costs one forward), and itself runs compiled on the static cache it
offers (`make_static_cache`, `eagle.StaticFeatureCache`). A draft that brings its own cache and offers none (prompt
lookup, the lookup hybrid: no forward worth compiling) keeps its eager path.
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from dataclasses import dataclass

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from . import native
from .kvcache import CachedModel, cache_kwarg, concat_features, model_forward
from .sampling import check_logits

SLOT_BUCKET = 256  # static caches hold a multiple of this many slots
# torch.compile arguments per mode: inductor's presets (`torch._inductor.list_mode_options`) spelled out as options,
# plus freezing, which folds the weights in as constants (needed on the CPU for inductor's own GEMM template,
# harmless elsewhere; `options=` and `mode=` cannot both be given). "dynamo" traces and caches graphs like the others
# but runs them uncompiled (a fast check of the caching, for tests); "eager" does not trace at all.
# Every inductor mode leaves out inductor's size asserts: its Python wrapper checks the size and strides of every
# input and of every custom operator's output at every call (hundreds of checks a decode step of SmolLM2 with the
# few-row kernel set), ~5% of the step on 2 cores (measured ad hoc in mode "default", 7 rounds beside reads as
# `python -m specrepro.walltime --beside-read` runs them: the step 0.95x its time with the checks, paired by round,
# AMD EPYC host). The graphs are compiled for static shapes and dynamo's guards check the shapes of
# every input but the model's own parameters, which `graph_key` ties to the model; tests compare the tokens with
# the eager path's in every mode.
_INDUCTOR = {"freezing": True, "size_asserts": False}
_MAX_AUTOTUNE = {**_INDUCTOR, "max_autotune": True, "coordinate_descent_tuning": True}
MODES = {
    "max-autotune": {"options": _MAX_AUTOTUNE},
    # the same graph with inductor's C++ wrapper: the per-step Python that calls the kernels becomes compiled C++
    # (longer compiles); `python -m specrepro.walltime --mode max-autotune-cpp` times it against max-autotune
    "max-autotune-cpp": {"options": {**_MAX_AUTOTUNE, "cpp_wrapper": True}},
    "default": {"options": _INDUCTOR},
    # `native.NativeStep` where it applies (a Llama decoder on the few-row kernel set: every layer in one C++ call),
    # the max-autotune graph for everything else (and for transformers' own compiled generate)
    "native": {"options": _MAX_AUTOTUNE},
    "reduce-overhead": {"options": {**_INDUCTOR, "triton.cudagraphs": True}},
    "dynamo": {"backend": "eager"},
    "eager": None,  # the static cache without compilation
}
# Every graph of the process (each model x width x cache size) is an entry of `_forward`'s one compiled-code cache;
# torch's default limit of 8 entries per function would silently end compilation after the eighth (a cost profile
# of 9 widths reaches it), so the calls raise the limit to this, for the duration of each call only.
RECOMPILE_LIMIT = 256


@dataclass(frozen=True)
class CompileConfig:
    """How `compile=` decodes: `mode` one of `MODES`; `slots` the static cache's size (None: the prompt, the new
    tokens and one block, rounded up to a multiple of `SLOT_BUCKET`). A larger cache costs attention over more
    (masked) slots at every step; a different size compiles new graphs."""

    mode: str = "max-autotune"
    slots: int | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown compile mode {self.mode!r}; choose from {sorted(MODES)}")
        if self.slots is not None and (not isinstance(self.slots, int) or self.slots < 1):
            raise ValueError(f"slots must be a positive integer or None, got {self.slots!r}")


def as_config(compile) -> CompileConfig | None:
    """`compile=` as the loops take it: False/None (the eager path), True (max-autotune), a mode name, or a
    `CompileConfig`."""
    if compile is None or compile is False:
        return None
    if compile is True:
        return CompileConfig()
    if isinstance(compile, str):
        return CompileConfig(mode=compile)
    if isinstance(compile, CompileConfig):
        return compile
    raise ValueError(f"compile must be a bool, a mode name {sorted(MODES)} or a CompileConfig, got {compile!r}")


def slots_needed(prompt_len: int, max_new_tokens: int, block: int) -> int:
    """Cache slots a decode can touch: the prompt, the new tokens and one padded block past them, bucketed."""
    need = prompt_len + max_new_tokens + block
    return -(-need // SLOT_BUCKET) * SLOT_BUCKET


GQA_ATTENTION = "specrepro_sdpa_gqa"  # the attention the static-cache forwards run where the model's is "sdpa"


def _sdpa_gqa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
              **kwargs):
    """transformers' "sdpa" attention with the grouped-query heads left to the kernel (`enable_gqa`).

    Under torch.compile transformers' own sdpa widens the keys and values to every query head (`repeat_kv`): the
    graph then copies each layer's whole static cache, all its slots, n_rep times wider at every step (on SmolLM2, 9
    query heads over 3 key-value heads: the 24 MB cache of 512 slots read and 71 MB written per decode step). Eager
    transformers avoids the copy for one-token queries (it packs the query heads instead) but not while compiling.
    Here the kernel reads each key-value head for its group in place (on SmolLM2 the compiled decode step's logits
    came out bitwise those of transformers' sdpa; the tests allow float32 rounding). transformers notes that on CUDA
    sdpa with a mask and grouped heads falls back to its math kernel, so there, without grouped heads, and for the
    arguments only transformers' function honours (a position bias, a softcap, attention weights asked for), this is
    transformers' sdpa unchanged."""
    if (query.device.type != "cpu" or key.shape[1] == query.shape[1] or kwargs.get("position_bias") is not None
            or kwargs.get("softcap") is not None or kwargs.get("output_attentions")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=bool(query.shape[2] > 1 and attention_mask is None and causal), enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GQA_ATTENTION, _sdpa_gqa)
AttentionMaskInterface.register(GQA_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])  # the masks "sdpa" gets

CACHE_ATTENTION = "specrepro_cache_attention"  # where the model's is "sdpa": the static-cache forwards' attention


def _cache_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                     **kwargs):
    """The static-cache forwards' attention where the model's is "sdpa": in a layer whose linear layers run the
    few-row kernel (`kernels.use_kernel(model, "few_rows")`), this package's own attention over the cache
    (`gemv.cache_attention`, the same C++ extension), which reads only the filled slots; elsewhere, and for what it
    does not take (another device or dtype, a mask that is not boolean, dropout, transformers-only arguments),
    `_sdpa_gqa`. sdpa reads all of the static cache's slots, masked, at every forward (on SmolLM2, 512 slots where
    07's step has 257 filled). The same attention up to float summation order (`test_compiled`). To run the few-row
    linear layers with sdpa's attention instead (an A/B of the attention alone), set
    `model.config._attn_implementation = GQA_ATTENTION`."""
    own = (type(getattr(module, "q_proj", None)).__name__ == "FewRowsLinear" and query.device.type == "cpu"
           and not dropout and attention_mask is not None and attention_mask.dtype == torch.bool
           and attention_mask.dim() == 4 and attention_mask.shape[1] == 1
           and query.dtype == key.dtype == value.dtype == torch.float32
           and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
           and not kwargs.get("output_attentions"))
    if not own:
        return _sdpa_gqa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                         is_causal=is_causal, **kwargs)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    # the operator (built and registered by `gemv` when the few-row kernel was switched on); by the class's name, as
    # `compiled` sits below `kernels` and `gemv` in the package's layers
    return _cache_op(query, key, value, attention_mask, scale), None


def _cache_op(query, key, value, mask, scale):
    """`gemv.cache_attention`'s operator (one node of a compiled graph)."""
    return torch.ops.specrepro.cache_attention.default(query, key, value, mask, scale)


AttentionInterface.register(CACHE_ATTENTION, _cache_attention)
AttentionMaskInterface.register(CACHE_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def _static_forward(model, **kwargs):
    """`model(**kwargs)` with its attention switched to `CACHE_ATTENTION` for this forward only where it is "sdpa"
    (the model's other callers, eager loops racing this path included, keep theirs)."""
    own = model.config._attn_implementation
    model.config._attn_implementation = CACHE_ATTENTION if own == "sdpa" else own
    try:
        return model(**kwargs)
    finally:
        model.config._attn_implementation = own


_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (serial, a linear layer, a parameter)
_SERIALS = itertools.count()


def graph_key(model) -> str:
    """What a compiled forward of `model` depends on beyond the shapes of its inputs, as one string: the model
    object (a serial number, never reused, unlike `id`), its linear layers' kernel (`kernels.use_kernel` switches
    their class), its parameters' dtype and device, train or eval, and its attention implementation.

    The compiled forwards take it as an argument and read it, so that torch guards on its value, and leave out
    torch's guards on the model's modules (`torch.compiler.skip_guard_on_all_nn_modules_unsafe`): checking those,
    a few hundred per call on SmolLM2, took ~1 ms of a ~23 ms compiled decode step on the AMD EPYC host (profiled,
    0.27 ms without them). Unsafe in general; here the key changes with everything the package changes on a model
    between calls (without it, a kernel switch kept running the old kernel's graph: `test_compiled`). The weights
    stay inputs of the graph, read at each call (two models of one shape through one graph each gave their own
    tokens); changing a model's code or other attributes in place between calls is not supported."""
    if model not in _MODELS:
        linear = next((m for m in model.modules() if isinstance(m, torch.nn.Linear)), None)
        _MODELS[model] = (next(_SERIALS), linear, next(model.parameters(), None))
    serial, linear, param = _MODELS[model]
    return (f"{serial}|{type(linear).__name__}|{getattr(param, 'dtype', None)}|{getattr(param, 'device', None)}|"
            f"{model.training}|{getattr(getattr(model, 'config', None), '_attn_implementation', None)}")


def _forward(model, ids: torch.Tensor, cache, n_logits: int, keyword: str, key: str) -> torch.Tensor:
    """The function that gets compiled: one forward on the static cache (passed under `keyword`, see
    `kvcache.cache_kwarg`), positions from its fill level. `key` is `graph_key(model)`, hashed so that the graph
    is guarded on it."""
    hash(key)
    return _static_forward(model, input_ids=ids, use_cache=True, logits_to_keep=n_logits, **{keyword: cache}).logits


def _forward_features(model, ids: torch.Tensor, cache, n_logits: int, keyword: str, key: str,
                      layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """`_forward` that also returns the hidden states a feature-reading draft reads (`kvcache.concat_features` of
    `layers`), (1, width, F), inside the same graph: a verification that keeps features costs one compiled forward."""
    hash(key)
    out = _static_forward(model, input_ids=ids, use_cache=True, logits_to_keep=n_logits, output_hidden_states=True,
                          **{keyword: cache})
    return out.logits, concat_features(out.hidden_states, layers)


def compile_in(fn, mode: str, *, keyed: bool = False):
    """`fn` compiled in `mode` (fullgraph, static shapes), or itself for "eager". `keyed`: `fn` reads a
    `graph_key` of its model, and torch's guards on the model's modules are left out."""
    if MODES[mode] is None:
        return fn
    kwargs = dict(MODES[mode])
    if keyed:  # a fresh options dict: torch.compile pops the filter out of the one it is given
        kwargs["options"] = {**kwargs.get("options", {}),
                             "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
    return torch.compile(fn, fullgraph=True, dynamic=False, **kwargs)


def compiled_forward(mode: str, features: bool = False):
    """`_forward` (`_forward_features` with `features`) compiled in `mode`, or itself for "eager"; in a mode of
    `NATIVE`, either runs `native.NativeStep` where it applies. torch keeps one cache of
    compiled graphs per function, keyed by guards on `graph_key` and the inputs' shapes, so rebuilding this wrapper
    does not recompile."""
    graph = compile_in(_forward_features if features else _forward, mode, keyed=True)
    return graph if mode not in NATIVE else _native_or(graph)


NATIVE = {"native"}  # modes whose forwards run `native.NativeStep` where it applies


def _native_or(graph):
    """A forward that runs the model's native step (`native.step_for`) where it has one, else `graph`; with the
    hidden-state indices of `_forward_features` after the key, the native step returns those states too."""
    def forward(model, ids, cache, n_logits, keyword, key, *layers):
        step = native.step_for(model, key, cache)
        if step is None:
            return graph(model, ids, cache, n_logits, keyword, key, *layers)
        return step(ids, cache, n_logits, *layers)

    return forward


def width_of(w: int, block: int, *, one: bool = True) -> int:
    """The width a forward of w tokens runs at: 1 (when `one`), `block` (a shorter block padded up to it), or w (a
    prefill)."""
    return 1 if w == 1 and one else block if w <= block else w


def check_room(used: int, w: int, block: int, capacity: int, who: str) -> None:
    """Raise unless a static cache of `capacity` slots, `used` of them filled, has room for a forward of w tokens (a
    short block runs padded to `block`)."""
    need = used + max(w, block)
    if need > capacity:
        raise ValueError(f"the {who}'s static cache holds {capacity} slots, and this forward would need {need}: pass "
                         "CompileConfig(slots=...) large enough for the prompt, max_new_tokens and gamma + 1")


def call_compiled(step, args: tuple, *, eager, who: str):
    """(step(*args), step): a compiled forward under `RECOMPILE_LIMIT`. Where compilation fails (no compiler, an
    unsupported op) it says so in a warning and returns (eager(*args), eager), the uncompiled function the caller
    keeps from then on. A failure of `eager` itself is raised."""
    try:
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            return step(*args), step
    except Exception as err:
        if step is eager:
            raise
        warnings.warn(f"torch.compile failed for the {who} ({type(err).__name__}: {err}); running on the static "
                      "cache without compilation (mode='eager')", RuntimeWarning, stacklevel=5)
        return eager(*args), eager


def compiles(model) -> bool:
    """Whether the compiled path applies to `model`: a module without a cache of its own."""
    return isinstance(model, torch.nn.Module) and not hasattr(model, "make_cache")


class StaticCachedModel(CachedModel):
    """`CachedModel` (the loop's cache bookkeeping) on a static cache, with compiled forwards of width 1 and
    `block`. Batch 1 only: a batch's rows grow raggedly, which needs per-row masks (`CachedModel`). With
    `hidden_layers` set (a draft that reads the target's features), both graphs also return those hidden states."""

    def __init__(self, model, who: str, log_: list[tuple[int, int]], rows: int = 1, *, block: int, slots: int,
                 mode: str):
        if rows != 1:
            raise ValueError(f"compile=True decodes one sequence at a time, got a batch of {rows}: decode rows one by "
                             "one, or use compile=False (the batched path)")
        from transformers import StaticCache

        super().__init__(model, who, log_, rows)
        self.cache = StaticCache(config=model.config, max_cache_len=slots)
        self.block, self.capacity, self.mode = block, slots, mode
        self.keyword = cache_kwarg(model)
        self.steps = {False: compiled_forward(mode), True: compiled_forward(mode, features=True)}

    @property
    def slots(self) -> int:
        return int(self.cache.get_seq_length())

    @torch.no_grad()
    def feed(self, new: list[list[int]], n_logits: int, pad_mask: torch.Tensor | None = None,
             features: list[torch.Tensor] | None = None) -> torch.Tensor:
        """As `CachedModel.feed` for one row: widths 1 and up to `block` run compiled (a short block padded up to
        `block`, the padding rolled back at once), longer ones (the prefill) eagerly. `features` (the input of a
        draft that reads them) is for the eager path: a target on this path reads none."""
        (tokens,) = new
        w = len(tokens)
        if features is not None:
            raise ValueError("the compiled path serves models that read tokens only; a feature-reading draft runs "
                             "on a cache of its own (make_static_cache)")
        if pad_mask is not None and not bool(pad_mask.all()):
            raise ValueError("the compiled path takes no padding: decode one unpadded row")
        check_room(self.fed[0], w, self.block, self.capacity, self.who)
        self.log.append((w, self.slots))
        # a target that keeps features runs width 1 only as a verification without drafts (an answer's last token):
        # padded to the block, so that it needs no third graph, compiled in the middle of a timed run
        width = width_of(w, self.block, one=not self.hidden_layers)
        ids = torch.tensor([tokens + [0] * (width - w)], device=self.device)  # (1, width): filler after the row
        feats = None
        if w > self.block:  # the prefill
            out = model_forward(self.model, ids, self.cache, logits_to_keep=n_logits,
                                output_hidden_states=bool(self.hidden_layers))
            logits = out.logits
            if self.hidden_layers:
                feats = concat_features(out.hidden_states, self.hidden_layers)
        else:
            logits, feats = self._compiled(ids, width)
            logits = logits[:, w - n_logits:w]  # (1, n_logits, V): the real tokens' last ones
            if width > w:
                self.cache.crop(w - width)  # the filler's slots: forgotten before anything reads them
        if self.hidden_layers:
            self.features = feats[:, :w]  # (1, w, F): the real tokens' states
        self.fed = [self.fed[0] + w]
        check_logits(logits[0], self.who)
        return logits

    def _compiled(self, ids: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The compiled forward: (logits, features or None), cloned (a compiled graph, CUDA graphs, may reuse its
        output buffers at the next call)."""
        layers = self.hidden_layers
        eager = _forward_features if layers else _forward
        args = (self.model, ids, self.cache, width, self.keyword, graph_key(self.model)) + ((layers,) if layers else ())
        out, kept = call_compiled(self.steps[bool(layers)], args, eager=eager, who=self.who)
        if kept is eager:  # compilation failed (or mode "eager"): both widths' graphs run uncompiled from now on
            self.steps, self.mode = {False: _forward, True: _forward_features}, "eager"
        return (out[0].clone(), out[1].clone()) if layers else (out.clone(), None)

    def keep(self, lengths: list[int]) -> None:
        (k,) = lengths
        if k < self.fed[0]:
            self.cache.crop(k - self.slots)
            self.fed = [k]

    def select(self, rows: list[int]) -> None:
        if rows != [0]:
            raise ValueError("the compiled path holds one row")


def cached_model_factory(config: CompileConfig, *, block: int, slots: int):
    """What `generate.decode(cached_model=...)` takes: a `StaticCachedModel` for models the compiled path serves;
    for a draft with a cache of its own, `CachedModel` on its static cache where it offers one
    (`make_static_cache(slots=, block=, mode=)`, the feature-reading draft), on its eager cache otherwise."""
    def make(model, who, log_, rows=1):
        if compiles(model):
            return StaticCachedModel(model, who, log_, rows, block=block, slots=slots, mode=config.mode)
        m = CachedModel(model, who, log_, rows)
        if hasattr(model, "make_static_cache") and rows == 1:
            m.cache = model.make_static_cache(slots=slots, block=block, mode=config.mode)
        return m

    return make
