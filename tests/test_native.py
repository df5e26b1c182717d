"""The native decoder step (`native`, `gemv`'s `llama_step`) computes the static path's forward: the same logits up to
float rounding, the same tokens, the cache moved on alike; it passes over what it cannot run, and its operator
refuses malformed input with a clear error."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specrepro import autoregressive_generate, compiled, gemv, native, speculative_generate
from specrepro.compiled import SLOT_BUCKET, StaticCachedModel
from specrepro.kernels import use_kernel
from specrepro.tiny import tiny_target

pytestmark = pytest.mark.skipif(not gemv.has_compiler(), reason="no C++ compiler here: the kernels cannot be built")


def llama(hidden: int, heads: int, kv_heads: int, intermediate: int, *, layers: int = 2, vocab: int = 96,
          seed: int = 0, **extra) -> LlamaForCausalLM:
    """A random float32 Llama on the few-row kernel set."""
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=1024,
                      initializer_range=0.1, tie_word_embeddings=True, **extra)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg).eval()
    use_kernel(model, "few_rows")
    return model


SHAPES = {  # head size 64 (the unrolled loops), 32 with a tail of the MLP's rows, 8 (the runtime loops), no grouping
    "d64": (192, 3, 1, 512), "d32-tail": (128, 4, 2, 340), "d8": (16, 2, 1, 32), "mha": (64, 2, 2, 96)}


def feeds(model, mode: str, widths, *, prompt: int = 70, block: int = 4, calls=None):
    """Logits of a prefill of `prompt` tokens then of forwards of `widths` tokens on `compiled`'s static path."""
    m = StaticCachedModel(model, "target", [], block=block, slots=SLOT_BUCKET, mode=mode)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (prompt + sum(widths),), generator=g).tolist()
    m.feed([ids[:prompt]], 1)
    out, at = [], prompt
    for w in widths:
        out.append(m.feed([ids[at:at + w]], w))
        at += w
    return out, m


@pytest.mark.parametrize("shape", SHAPES)
def test_the_native_step_computes_the_static_paths_logits(shape, monkeypatch):
    model = llama(*SHAPES[shape])
    calls = []
    real = native.NativeStep.__call__
    monkeypatch.setattr(native.NativeStep, "__call__", lambda self, *a: calls.append(a[0].shape) or real(self, *a))
    widths = [1, 4, 1, 3, 2, 1]  # a block of 4, shorter ones padded up to it
    want, eager = feeds(model, "eager", widths)
    got, nat = feeds(model, "native", widths)
    assert calls == [(1, 1), (1, 4), (1, 1), (1, 4), (1, 4), (1, 1)]  # every forward after the prefill ran natively
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert nat.slots == eager.slots == 70 + sum(widths)
    for a, b in zip(nat.cache.layers, eager.cache.layers):  # the same keys and values in the same slots
        torch.testing.assert_close(a.keys[:, :, :nat.slots], b.keys[:, :, :nat.slots], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a.values[:, :, :nat.slots], b.values[:, :, :nat.slots], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layers", [(2,), (0, 1, 2), (1,)])
def test_the_native_step_returns_the_hidden_states_a_feature_draft_reads(layers):
    """`_forward_features` on the native step: the logits and transformers' hidden_states[i] for i in `layers` (the
    embeddings, a layer's output, the final norm's) as the static path's eager forward gives them."""
    model = llama(*SHAPES["d32-tail"])
    _, eager = feeds(model, "eager", [], prompt=40)
    _, nat = feeds(model, "eager", [], prompt=40)
    ids, key = torch.tensor([[5, 6, 7]]), compiled.graph_key(model)
    want = compiled._forward_features(model, ids, eager.cache, 3, eager.keyword, key, layers)
    got = compiled._native_or(None)(model, ids, nat.cache, 3, nat.keyword, key, layers)
    assert got[1].shape == want[1].shape == (1, 3, len(layers) * model.config.hidden_size)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert nat.slots == eager.slots == 43


def test_a_token_gets_the_same_bits_alone_or_in_a_block_on_any_thread_count():
    """Each output is one thread's sum in a fixed order and each query's attention merges its chunks in slot order:
    a token's logits do not depend on the tokens after it in the forward or on the thread count (so a verification
    scores its tokens with decode's own numerics)."""
    model = llama(*SHAPES["d32-tail"], layers=3)
    block, _ = feeds(model, "native", [4], prompt=130, block=4)
    alone, m = feeds(model, "native", [1], prompt=130, block=4)
    assert torch.equal(block[0][:, :1], alone[0])
    step = native.step_for(model, compiled.graph_key(model), m.cache)
    layers = m.cache.layers
    cos, sin = step.rotary(layers[0].max_cache_len)
    x = torch.randn(5, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    threads, out = torch.get_num_threads(), []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            keys, values = [c.keys.clone() for c in layers], [c.values.clone() for c in layers]
            lengths = [c.cumulative_length.clone() for c in layers]
            out.append(torch.ops.specrepro.llama_step.default(x, step.weights, keys, values, lengths, cos, sin,
                                                              step.heads, step.kv_heads, step.eps, step.scale, [1]))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])


def test_speculative_and_autoregressive_decoding_give_the_eager_paths_tokens():
    target, draft = llama(128, 4, 2, 256, vocab=64, seed=3), llama(64, 2, 1, 128, vocab=64, seed=4, layers=1)
    x = torch.tensor([[1, 5, 9, 2, 7]])
    ref = autoregressive_generate(target, x, max_new_tokens=24, temperature=0)
    assert torch.equal(autoregressive_generate(target, x, max_new_tokens=24, temperature=0,
                                               compile="native").sequences, ref.sequences)
    for temperature in (0.0, 1.0):
        kw = dict(gamma=3, max_new_tokens=24, temperature=temperature)
        eager = speculative_generate(target, draft, x, generator=torch.Generator().manual_seed(2), **kw)
        nat = speculative_generate(target, draft, x, generator=torch.Generator().manual_seed(2), compile="native",
                                   **kw)
        assert torch.equal(nat.sequences, eager.sequences)


def test_the_native_step_passes_over_what_it_cannot_run():
    model = llama(*SHAPES["d8"])
    assert native.unsupported(model) is None
    use_kernel(model, "stock")
    assert "few-row kernel" in native.unsupported(model)
    use_kernel(model, "few_rows")
    model.config._attn_implementation = compiled.GQA_ATTENTION  # the A/B of the attention
    assert "sdpa" in native.unsupported(model)
    model.config._attn_implementation = "sdpa"
    assert "biases" in native.unsupported(llama(*SHAPES["d8"], attention_bias=True))
    assert "float32" in native.unsupported(llama(*SHAPES["d8"]).double())
    assert "Llama decoder" in native.unsupported(torch.nn.Linear(2, 2))
    other = tiny_target(16, dtype=torch.float32)  # a Llama on the stock kernel: the graph runs it
    graph_calls = []

    def graph(*args):
        graph_calls.append(args[1].shape)
        return compiled._forward(*args)

    forward = compiled._native_or(graph)
    m = StaticCachedModel(other, "target", [], block=2, slots=SLOT_BUCKET, mode="eager")
    m.feed([[1, 2, 3]], 1)
    forward(other, torch.tensor([[4]]), m.cache, 1, m.keyword, compiled.graph_key(other))
    assert graph_calls == [(1, 1)]
    assert native.step_for(other, compiled.graph_key(other), m.cache) is None


def test_a_prompt_shorter_than_a_block_starts_on_the_native_step(monkeypatch):
    """The first forward of a prompt of at most gamma + 1 tokens is not a prefill: the native step allocates the
    cache as transformers would at its first update, and decodes what the eager path decodes."""
    model = llama(*SHAPES["d32-tail"])
    calls = []
    real = native.NativeStep.__call__
    monkeypatch.setattr(native.NativeStep, "__call__", lambda self, *a: calls.append(a[0].shape) or real(self, *a))
    eager = StaticCachedModel(model, "target", [], block=4, slots=SLOT_BUCKET, mode="eager")
    nat = StaticCachedModel(model, "target", [], block=4, slots=SLOT_BUCKET, mode="native")
    for tokens in ([[3, 1]], [[4]], [[1, 5, 9, 2]]):
        torch.testing.assert_close(nat.feed(tokens, len(tokens[0])), eager.feed(tokens, len(tokens[0])), rtol=1e-4,
                                   atol=1e-5)
    assert nat.slots == eager.slots == 7 and calls == [(1, 4), (1, 1), (1, 4)]


def test_speculative_sampling_on_the_native_step_matches_the_exact_target_distribution():
    """Chi-square of 1500 three-token continuations against the target's exact joint distribution (vocabulary 8),
    both models of the pair on the native step."""
    from specrepro.distribution import chisquare_gof, counts_of, exact_joint_distribution
    from specrepro.sampling import SamplingConfig

    target, draft = llama(32, 2, 1, 64, vocab=8, seed=5), llama(16, 2, 1, 32, vocab=8, seed=6, layers=1)
    for model in (target, draft):
        for p in model.parameters():
            p.data *= 4  # sharper, unlike distributions: acceptance well below 1
    prompt, cfg, n = torch.tensor([[1, 4]]), SamplingConfig(1.0), 3
    g = torch.Generator().manual_seed(11)
    samples = [speculative_generate(target, draft, prompt, gamma=2, max_new_tokens=n, generator=g,
                                    compile="native").sequences[0, 2:].tolist() for _ in range(1500)]
    counts = counts_of(samples, 8)

    def exact(model):  # float32 models: renormalised in float64
        p = exact_joint_distribution(model, prompt, n, cfg).ravel().double().numpy()
        return p / p.sum()

    result = chisquare_gof(counts, exact(target))
    assert not result.rejects(1e-3), result
    assert chisquare_gof(counts, exact(draft)).rejects(1e-3)  # the test tells the draft's distribution apart


def test_llama_step_refuses_malformed_input_with_a_clear_error():
    model = llama(*SHAPES["d8"])
    _, m = feeds(model, "native", [1], prompt=10)
    step = native.step_for(model, compiled.graph_key(model), m.cache)
    layers = m.cache.layers
    keys, values = [c.keys for c in layers], [c.values for c in layers]
    lengths = [c.cumulative_length for c in layers]
    cos, sin = step.rotary(layers[0].max_cache_len)
    x = torch.randn(2, model.config.hidden_size)
    op = torch.ops.specrepro.llama_step.default

    def call(**change):
        args = dict(x=x, weights=step.weights, keys=keys, values=values, lengths=lengths, cos=cos, sin=sin,
                    heads=step.heads, kv_heads=step.kv_heads, eps=step.eps, scale=step.scale, keep=[]) | change
        return op(*args.values())

    with pytest.raises(RuntimeError, match="9 weights"):
        call(weights=step.weights[:-1])
    with pytest.raises(RuntimeError, match="float32"):
        call(x=x.double())
    with pytest.raises(RuntimeError, match="Llama layer's shapes"):
        call(heads=1)
    with pytest.raises(RuntimeError, match="fill levels differ"):
        call(lengths=[lengths[0], lengths[1] + 1])
    with pytest.raises(RuntimeError, match="no room"):
        call(lengths=[torch.tensor(layers[0].max_cache_len - 1)] * len(layers))
    with pytest.raises(RuntimeError, match="cos and sin"):
        call(cos=cos[:5], sin=sin[:5])
    with pytest.raises(RuntimeError, match="keep names layers"):
        call(keep=[len(layers)])
    before = int(lengths[0])
    call()
    assert int(lengths[0]) == before + 2  # a good call moves every layer's fill level on


def test_the_avx2_build_computes_the_same_step():
    """The AVX2 code path (8-float vectors) of the whole step, against the native build's."""
    assert gemv.available()
    avx2 = gemv.build_for("x86-64-v3")
    model = llama(*SHAPES["d32-tail"])
    _, m = feeds(model, "native", [1], prompt=90)
    step = native.step_for(model, compiled.graph_key(model), m.cache)
    layers = m.cache.layers
    cos, sin = step.rotary(layers[0].max_cache_len)
    x = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    out = {}
    for name, fn in (("native", torch.ops.specrepro.llama_step.default), ("avx2", avx2.llama_step)):
        keys, values = [c.keys.clone() for c in layers], [c.values.clone() for c in layers]
        lengths = [c.cumulative_length.clone() for c in layers]
        out[name] = (fn(x, step.weights, keys, values, lengths, cos, sin, step.heads, step.kv_heads, step.eps,
                        step.scale, [0, 1]), keys[-1])
    torch.testing.assert_close(out["avx2"][0], out["native"][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["avx2"][1], out["native"][1], rtol=1e-4, atol=1e-5)
