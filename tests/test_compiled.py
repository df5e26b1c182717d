"""The compiled decode path (`compile=`): the same tokens as the eager path, rollback of padded blocks, the target's
distribution, errors and the fallback. Mode "eager" runs the static-cache bookkeeping uncompiled (fast); the tests
marked `compiles` run inductor on tiny models (about ten seconds per graph on 2 cores)."""

import pytest
import torch

from specrepro import autoregressive_generate, compiled, gemv, speculative_generate
from specrepro.compiled import SLOT_BUCKET, CompileConfig, StaticCachedModel
from specrepro.distribution import chisquare_gof, counts_of, exact_joint_distribution
from specrepro.drafts import PromptLookupDraft
from specrepro.sampling import SamplingConfig
from specrepro.tiny import tiny_pair

PROMPTS = [torch.tensor([[0, 3, 5]]), torch.tensor([[6]]), torch.tensor([[1, 2, 3, 4, 5, 6, 7, 1, 2]])]


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_static_path_gives_the_eager_paths_tokens(pair64, gamma, prompt):
    target, draft = pair64
    x = PROMPTS[prompt]
    ref = autoregressive_generate(target, x, max_new_tokens=30, temperature=0)
    assert torch.equal(autoregressive_generate(target, x, max_new_tokens=30, temperature=0, compile="eager").sequences,
                       ref.sequences)
    got = speculative_generate(target, draft, x, gamma=gamma, max_new_tokens=30, temperature=0, compile="eager")
    assert torch.equal(got.sequences, ref.sequences)
    for temperature, top_p in [(1.0, None), (1.3, 0.85)]:  # float64: the same uniforms give the same draws
        kw = dict(gamma=gamma, max_new_tokens=30, temperature=temperature, top_p=top_p)
        eager = speculative_generate(target, draft, x, generator=torch.Generator().manual_seed(5), **kw)
        static = speculative_generate(target, draft, x, generator=torch.Generator().manual_seed(5), compile="eager",
                                      **kw)
        assert torch.equal(static.sequences, eager.sequences)
        assert static.stats.accepted == eager.stats.accepted


def test_padded_blocks_leave_no_trace_in_the_cache(pair64):
    """A block shorter than gamma + 1 runs padded to it; the padding's slots are rolled back at once."""
    target, _ = pair64
    log = []
    m = StaticCachedModel(target, "target", log, block=5, slots=SLOT_BUCKET, mode="eager")
    m.feed([[0, 3, 5, 1, 2, 4, 6]], 1)  # 7 > block: the eager prefill
    assert m.fed == [7] and m.slots == 7
    short = m.feed([[2, 3]], 2)  # padded to 5
    assert m.fed == [9] and m.slots == 9 and short.shape == (1, 2, 8)
    with torch.no_grad():  # the logits of the real tokens, as a plain forward of the whole sequence gives them
        full = target(torch.tensor([[0, 3, 5, 1, 2, 4, 6, 2, 3]])).logits[:, -2:]
    torch.testing.assert_close(short, full)
    m.keep([8])
    assert m.fed == [8] and m.slots == 8
    one = m.feed([[3]], 1)
    torch.testing.assert_close(one, full[:, -1:])
    assert log == [(7, 0), (2, 7), (1, 8)]


def test_speculative_matches_exact_target_on_the_static_path(pair64):
    target, draft = pair64
    prompt, cfg, n = torch.tensor([[1, 4]]), SamplingConfig(1.0), 3
    g = torch.Generator().manual_seed(11)
    samples = [speculative_generate(target, draft, prompt, gamma=2, max_new_tokens=n, generator=g,
                                    compile="eager").sequences[0, 2:].tolist() for _ in range(1500)]
    exact = exact_joint_distribution(target, prompt, n, cfg).ravel().numpy()
    result = chisquare_gof(counts_of(samples, 8), exact)
    assert not result.rejects(1e-3), result


def test_prompt_lookup_draft_stays_eager_beside_a_static_target(pair64):
    target, _ = pair64
    x = PROMPTS[2]
    ref = autoregressive_generate(target, x, max_new_tokens=30, temperature=0)
    got = speculative_generate(target, PromptLookupDraft(8), x, gamma=4, max_new_tokens=30, temperature=0,
                               compile="eager")
    assert torch.equal(got.sequences, ref.sequences)


def test_compile_errors_say_what_to_do(pair64):
    target, draft = pair64
    batch = torch.tensor([[0, 3, 5], [1, 2, 3]])
    with pytest.raises(ValueError, match="one sequence at a time"):
        speculative_generate(target, draft, batch, gamma=2, max_new_tokens=4, compile=True)
    with pytest.raises(ValueError, match="unknown compile mode"):
        autoregressive_generate(target, PROMPTS[0], max_new_tokens=4, compile="fastest")
    with pytest.raises(ValueError, match="compile must be"):
        autoregressive_generate(target, PROMPTS[0], max_new_tokens=4, compile=3)
    with pytest.raises(ValueError, match="slots"):
        speculative_generate(target, draft, PROMPTS[0], gamma=2, max_new_tokens=20,
                             compile=CompileConfig(mode="eager", slots=8))
    assert compiled.slots_needed(200, 64, 5) == SLOT_BUCKET * 2


def test_a_failed_compilation_warns_and_decodes_eagerly(pair64, monkeypatch):
    target, draft = pair64

    def broken(*args):
        raise RuntimeError("no C compiler")

    monkeypatch.setattr(compiled, "compiled_forward", lambda mode, features=False: broken)
    ref = speculative_generate(target, draft, PROMPTS[0], gamma=3, max_new_tokens=20, temperature=0)
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        got = speculative_generate(target, draft, PROMPTS[0], gamma=3, max_new_tokens=20, temperature=0,
                                   compile=True)
    assert torch.equal(got.sequences, ref.sequences)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback to eager would fail the test
def test_more_graphs_than_torchs_default_limit_stay_compiled(pair64):
    """Each gamma is another verification width: 10 gammas make 21 graphs of one compiled function, past torch's
    default limit of 8 per function, after which fullgraph compilation fails (07's first run fell back to eager)."""
    target, draft = pair64
    ref = autoregressive_generate(target, PROMPTS[0], max_new_tokens=14, temperature=0)
    for gamma in range(1, 11):
        got = speculative_generate(target, draft, PROMPTS[0], gamma=gamma, max_new_tokens=14, temperature=0,
                                   compile="dynamo")
        assert torch.equal(got.sequences, ref.sequences)


@pytest.mark.compiles
@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback to eager would pass unseen otherwise
def test_inductor_compiled_path_gives_the_eager_paths_tokens_and_compiles_once():
    """Float32 tiny models through inductor: greedy and sampled tokens as the eager path's; a second call with
    another prompt of the same slot bucket compiles nothing new."""
    target, draft = tiny_pair(64, seed=2, dtype=torch.float32)
    kw = dict(gamma=3, max_new_tokens=24, compile="default")
    for temperature in (0.0, 1.0):
        ref = speculative_generate(target, draft, PROMPTS[0], gamma=3, max_new_tokens=24, temperature=temperature,
                                   generator=torch.Generator().manual_seed(1))
        got = speculative_generate(target, draft, PROMPTS[0], temperature=temperature,
                                   generator=torch.Generator().manual_seed(1), **kw)
        assert torch.equal(got.sequences, ref.sequences)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    again = speculative_generate(target, draft, PROMPTS[2], temperature=0, **kw)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames
    ref = autoregressive_generate(target, PROMPTS[2], max_new_tokens=24, temperature=0)
    assert torch.equal(again.sequences, ref.sequences)


@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("masked", [True, False])
def test_grouped_query_attention_gives_transformers_sdpa_without_widening_the_cache(q_len, masked):
    """The static path's attention (`enable_gqa`) against transformers' sdpa (which widens the keys and values to
    every query head while compiling): the same outputs, within float32 rounding, with and without a mask, for a
    decode step and a verification block; without grouped heads it is transformers' sdpa itself."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    query = torch.randn(2, 9, q_len, 16, generator=g)
    key, value = torch.randn(2, 3, 40, 16, generator=g), torch.randn(2, 3, 40, 16, generator=g)
    mask = None
    if masked:  # row 1 left-padded by 5 slots, both rows' last slots beyond the fill level
        mask = torch.ones(2, 1, q_len, 40, dtype=torch.bool)
        mask[1, :, :, :5] = False
        mask[:, :, :, 36:] = False
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    got, _ = compiled._sdpa_gqa(module, query, key, value, mask, scaling=0.25)
    assert got.shape == want.shape == (2, q_len, 9, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    module.num_key_value_groups = 1
    same, _ = compiled._sdpa_gqa(module, query[:, :3], key, value, mask, scaling=0.25)
    assert torch.equal(same, sdpa_attention_forward(module, query[:, :3], key, value, mask, scaling=0.25)[0])


def test_the_static_path_switches_attention_for_its_forwards_only(pair64):
    """The model keeps its own attention between the static path's forwards, also where a forward raises, so eager
    loops racing the compiled ones in one process run transformers' sdpa."""
    target, _ = pair64
    assert target.config._attn_implementation == "sdpa"
    seen = []
    hook = target.model.layers[0].self_attn.register_forward_pre_hook(
        lambda *_: seen.append(target.config._attn_implementation))
    try:
        m = StaticCachedModel(target, "target", [], block=2, slots=SLOT_BUCKET, mode="eager")
        m.feed([[1, 2, 3]], 1)  # the prompt's prefill: eager, the model's own attention
        assert seen[-1] == "sdpa"
        m.feed([[4]], 1)  # a decode step on the static path
        assert seen[-1] == compiled.CACHE_ATTENTION and target.config._attn_implementation == "sdpa"
        hook.remove()
        hook = target.model.layers[0].self_attn.register_forward_pre_hook(lambda *_: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            compiled._static_forward(target, input_ids=torch.tensor([[1]]))
        assert target.config._attn_implementation == "sdpa"
    finally:
        hook.remove()


def test_grouped_query_attention_leaves_a_position_bias_to_transformers():
    """Arguments only transformers' sdpa honours (here a position bias) are not dropped: the call is its own."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(1)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    query = torch.randn(1, 9, 1, 16, generator=g)
    key, value = torch.randn(1, 3, 8, 16, generator=g), torch.randn(1, 3, 8, 16, generator=g)
    bias = torch.randn(1, 9, 1, 8, generator=g)
    want, _ = sdpa_attention_forward(module, query, key, value, None, position_bias=bias)
    got, _ = compiled._sdpa_gqa(module, query, key, value, None, position_bias=bias)
    assert torch.equal(got, want)
    assert not torch.allclose(got, compiled._sdpa_gqa(module, query, key, value, None)[0])


@pytest.mark.compiles
@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback to eager would pass unseen otherwise
def test_the_cpp_wrapper_mode_gives_the_eager_paths_tokens():
    """`max-autotune-cpp` (inductor's C++ wrapper around the same kernels) decodes what the eager path decodes."""
    target, draft = tiny_pair(64, seed=4, dtype=torch.float32)
    ref = speculative_generate(target, draft, PROMPTS[0], gamma=2, max_new_tokens=12, temperature=0.0)
    got = speculative_generate(target, draft, PROMPTS[0], gamma=2, max_new_tokens=12, temperature=0.0,
                               compile="max-autotune-cpp")
    assert torch.equal(got.sequences, ref.sequences)


def test_the_graph_key_follows_what_the_package_changes_on_a_model():
    """`graph_key` stands in for torch's guards on the model's modules: it must change with the model object, the
    linear layers' kernel, the dtype and train/eval, and stay put otherwise."""
    from specrepro.kernels import use_kernel

    a, _ = tiny_pair(64, seed=3, dtype=torch.float32)
    b, _ = tiny_pair(64, seed=3, dtype=torch.float32)  # the same weights: another object all the same
    key = compiled.graph_key(a)
    assert compiled.graph_key(a) == key and compiled.graph_key(b) != key
    use_kernel(a, "small_row")
    assert compiled.graph_key(a) != key
    use_kernel(a, "stock")
    assert compiled.graph_key(a) == key
    a.train()
    assert compiled.graph_key(a) != key
    a.eval()
    a.to(torch.float64)
    assert compiled.graph_key(a) != key


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_each_model_and_kernel_gets_a_graph_of_its_own():
    """The compiled forwards skip torch's guards on the model's modules: without `graph_key`, a second model of the
    same shapes, or the same model after a kernel switch, would run the first graph (one graph for all three runs
    here, measured), and a race of kernels would time one kernel under every name."""
    from torch._dynamo.utils import counters

    from specrepro.kernels import use_kernel

    a, b = (tiny_pair(64, seed=s, dtype=torch.float32)[0] for s in (5, 6))
    before = counters["stats"]["unique_graphs"]
    runs = [(a, "stock"), (b, "stock"), (a, "small_row"), (a, "stock")]
    for model, kernel in runs:
        use_kernel(model, kernel)
        ref = autoregressive_generate(model, PROMPTS[2], max_new_tokens=8, temperature=0)
        got = autoregressive_generate(model, PROMPTS[2], max_new_tokens=8, temperature=0, compile="dynamo")
        assert torch.equal(got.sequences, ref.sequences)
    assert counters["stats"]["unique_graphs"] - before == 3  # the last run is the first one's graph again


@pytest.mark.skipif(not gemv.has_compiler(), reason="no C++ compiler here: the few-row kernels cannot be built")
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_the_few_row_kernel_set_runs_its_own_attention_in_the_static_forwards(monkeypatch):
    """With the few-row kernel, the static-cache forwards run `gemv.cache_attention` (an operator of the graph when
    compiled) and decode the eager path's tokens, greedy and sampled; with the stock kernel, or with the model's
    attention set to `GQA_ATTENTION` (the A/B of the attention alone), they run sdpa."""
    from specrepro.kernels import use_kernel

    target, draft = tiny_pair(64, seed=7, dtype=torch.float32)
    for model in (target, draft):
        use_kernel(model, "few_rows")
    for temperature in (0.0, 1.0):
        ref = speculative_generate(target, draft, PROMPTS[0], gamma=3, max_new_tokens=16, temperature=temperature,
                                   generator=torch.Generator().manual_seed(3))
        got = speculative_generate(target, draft, PROMPTS[0], gamma=3, max_new_tokens=16, temperature=temperature,
                                   generator=torch.Generator().manual_seed(3), compile="dynamo")
        assert torch.equal(got.sequences, ref.sequences)
    calls = []
    real = compiled._cache_op
    monkeypatch.setattr(compiled, "_cache_op", lambda *a: calls.append(a[0].shape) or real(*a))
    layers = target.config.num_hidden_layers

    def step(model):
        m = StaticCachedModel(model, "target", [], block=3, slots=SLOT_BUCKET, mode="eager")
        m.feed([[1, 2, 3, 4, 5]], 1)  # the prefill: eager, the model's own attention
        return torch.cat([m.feed([[6]], 1).flatten(), m.feed([[7, 8]], 2).flatten()])

    own = step(target)
    h, d = target.config.num_attention_heads, target.config.head_dim
    assert calls == [(1, h, 1, d)] * layers + [(1, h, 3, d)] * layers  # a step, then a block padded to 3
    target.config._attn_implementation = compiled.GQA_ATTENTION
    sdpa = step(target)
    target.config._attn_implementation = "sdpa"
    use_kernel(target, "stock")
    step(target)
    assert len(calls) == 2 * layers  # sdpa both times: not called again
    torch.testing.assert_close(own, sdpa, rtol=1e-5, atol=1e-5)
    use_kernel(target, "few_rows")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    m = StaticCachedModel(target, "target", [], block=3, slots=SLOT_BUCKET, mode="eager")
    m.feed([[1, 2, 3, 4, 5]], 1)
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=compiled.RECOMPILE_LIMIT):  # _forward's
        torch.compile(compiled._forward, backend=backend, fullgraph=True)(  # graphs of the other tests count
            target, torch.tensor([[6]]), m.cache, 1, m.keyword, compiled.graph_key(target))
    ops = [n.target for n in graphs[0].graph.nodes]
    assert ops.count(torch.ops.specrepro.cache_attention.default) == layers
