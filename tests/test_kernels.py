"""The linear-layer kernels compute the same products and leave models' outputs unchanged."""

import pytest
import torch
from torch import nn

from specrepro import autoregressive_generate, gemv, speculative_generate
from specrepro.kernels import (
    ALIGN,
    KERNELS,
    LINEARS,
    FewRowsLinear,
    SmallRowLinear,
    usable,
    use_kernel,
    use_small_row_matmul,
)
from specrepro.tiny import tiny_pair


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 1, 24), (1, 3, 24), (2, 4, 24), (5, 24), (1, 9, 24), (0, 24)])
def test_small_row_linear_equals_linear(bias, shape):
    torch.manual_seed(0)
    lin = nn.Linear(24, 40, bias=bias)
    x = torch.randn(*shape)
    expected = lin(x)
    lin.__class__ = SmallRowLinear
    got = lin(x)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)
    if x.numel() // 24 > SmallRowLinear.max_rows:
        assert torch.equal(got, expected)  # many rows take the stock path


def test_switch_keeps_parameters_and_outputs_and_can_be_undone():
    target, draft = tiny_pair(16, seed=2)
    state = {k: v.clone() for k, v in target.state_dict().items()}
    x = torch.tensor([[1, 5, 3, 9, 2]])
    ref = autoregressive_generate(target, x, max_new_tokens=12, temperature=0).sequences
    ref_spec = speculative_generate(target, draft, x, gamma=3, max_new_tokens=12, temperature=0).sequences
    n = use_small_row_matmul(target)
    assert n == sum(isinstance(m, nn.Linear) for m in target.modules()) > 0
    assert all(torch.equal(v, state[k]) for k, v in target.state_dict().items())
    assert torch.equal(autoregressive_generate(target, x, max_new_tokens=12, temperature=0).sequences, ref)
    assert torch.equal(speculative_generate(target, draft, x, gamma=3, max_new_tokens=12, temperature=0).sequences,
                       ref_spec)
    assert use_small_row_matmul(target, enabled=False) == n
    assert not any(isinstance(m, SmallRowLinear) for m in target.modules())


# ---- the few-row kernel (specrepro.gemv): compiled on this machine at first use --------------------------------------

HAS_COMPILER = gemv.has_compiler()
needs_compiler = pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler here: the few-row kernel cannot be built")


@needs_compiler
def test_few_rows_builds_where_there_is_a_compiler():
    assert gemv.available(), gemv.build_error()
    assert gemv.build_error() is None


@needs_compiler
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("in_features", [gemv.LANES * 3, gemv.LANES * 2 + 7, 5])  # a whole number of lanes, a tail
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8])
def test_few_rows_equals_linear(bias, in_features, rows):
    torch.manual_seed(rows)
    lin = nn.Linear(in_features, 37, bias=bias)
    x = torch.randn(rows, in_features)
    got = gemv.few_rows(x, lin.weight, lin.bias)
    assert got.shape == (rows, 37)
    assert torch.allclose(got, lin(x), atol=1e-5, rtol=1e-5)


@needs_compiler
def test_few_rows_gives_each_row_the_same_bits_alone_or_with_others():
    torch.manual_seed(0)
    w, x = torch.randn(50, 3 * gemv.LANES + 3), torch.randn(8, 3 * gemv.LANES + 3)
    together = gemv.few_rows(x, w)
    for n in range(8):
        assert torch.equal(together[n], gemv.few_rows(x[n:n + 1], w)[0])
    assert torch.equal(gemv.few_rows(x.t().contiguous().t(), w), together)  # a non-contiguous input


@needs_compiler
@pytest.mark.parametrize("shape,dtype", [((1, 1, 24), torch.float32), ((2, 4, 24), torch.float32),
                                         ((1, 9, 24), torch.float32), ((0, 24), torch.float32),
                                         ((1, 3, 24), torch.float64)])
def test_few_rows_linear_takes_the_stock_path_outside_its_range(shape, dtype):
    torch.manual_seed(0)
    lin = nn.Linear(24, 40).to(dtype)
    x = torch.randn(*shape, dtype=dtype)
    expected = lin(x)
    lin.__class__ = FewRowsLinear
    got = lin(x)
    assert got.shape == expected.shape and got.dtype == dtype
    rows = x.numel() // 24
    if dtype != torch.float32 or not 0 < rows <= gemv.MAX_ROWS:
        assert torch.equal(got, expected)
    else:
        assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)


@needs_compiler
def test_every_kernel_keeps_the_outputs_and_switches_back():
    target, draft = tiny_pair(16, seed=2)
    x = torch.tensor([[1, 5, 3, 9, 2]])
    ref = speculative_generate(target, draft, x, gamma=3, max_new_tokens=12, temperature=0).sequences
    n_linear = sum(isinstance(m, nn.Linear) for m in target.modules())
    for kernel in KERNELS:
        use_kernel(target, kernel)
        use_kernel(draft, kernel)
        assert all(type(m) is LINEARS[kernel] for m in target.modules() if isinstance(m, nn.Linear))
        assert torch.equal(autoregressive_generate(target, x, max_new_tokens=12, temperature=0).sequences[:, :10],
                           ref[:, :10])
        assert torch.equal(speculative_generate(target, draft, x, gamma=3, max_new_tokens=12, temperature=0).sequences,
                           ref)
    assert use_kernel(target, "stock") == n_linear
    assert all(type(m) is nn.Linear for m in target.modules() if isinstance(m, nn.Linear))
    with pytest.raises(ValueError, match="unknown kernel"):
        use_kernel(target, "fast")


def test_a_machine_that_cannot_build_the_kernel_gets_a_warning_and_the_stock_product(monkeypatch):
    monkeypatch.setattr(gemv, "_build", lambda: OSError("c++: command not found"))
    target, _ = tiny_pair(16, seed=2)
    with pytest.warns(RuntimeWarning, match="could not be built.*c\\+\\+: command not found.*stock"):
        use_kernel(target, "few_rows")
    assert all(type(m) is nn.Linear for m in target.modules() if isinstance(m, nn.Linear))
    with pytest.raises(RuntimeError, match="use the stock kernel"):
        gemv.few_rows(torch.randn(1, 4), torch.randn(3, 4))


@needs_compiler
@pytest.mark.compiles
def test_torch_compile_calls_the_few_row_kernel_as_one_operator():
    torch.manual_seed(0)
    lin = nn.Linear(3 * gemv.LANES, 24)
    lin.__class__ = FewRowsLinear
    x = torch.randn(1, 4, 3 * gemv.LANES)
    with torch.no_grad():
        eager = lin(x)
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        compiled = torch.compile(lin, fullgraph=True, dynamic=False, backend=backend)(x)
    assert torch.equal(compiled, eager)
    assert any(node.target is torch.ops.specrepro.few_rows.default for node in graphs[0].graph.nodes)
    assert lin(x.requires_grad_()).grad_fn is not None  # with a gradient to compute, the stock product


def test_usable_drops_the_few_row_configurations_where_the_kernel_cannot_be_built(monkeypatch):
    names = ["stock", "few_rows", "compiled", "compiled_few_rows"]
    if HAS_COMPILER:
        assert usable(names) == names
    monkeypatch.setattr(gemv, "_build", lambda: OSError("no compiler"))
    with pytest.warns(RuntimeWarning, match="no compiler"):
        assert usable(names) == ["stock", "compiled"]


@needs_compiler
def test_few_rows_moves_weights_to_aligned_memory_keeping_values_and_ties():
    target, _ = tiny_pair(16, seed=2)
    target.lm_head.weight = target.model.embed_tokens.weight  # tied, as in SmolLM2
    buffer = torch.zeros(target.lm_head.weight.numel() + 1)
    with torch.no_grad():  # a view at an offset of 4 bytes: what a weight loaded from a file can be
        view = buffer[1:].view_as(target.lm_head.weight)
        view.copy_(target.lm_head.weight)
        target.lm_head.weight.data = view
    before = target.lm_head.weight.detach().clone()
    assert target.lm_head.weight.data_ptr() % ALIGN
    use_kernel(target, "few_rows")
    assert all(m.weight.data_ptr() % ALIGN == 0 for m in target.modules() if isinstance(m, nn.Linear))
    assert torch.equal(target.lm_head.weight, before)
    assert target.lm_head.weight is target.model.embed_tokens.weight


@needs_compiler
@pytest.mark.skipif("avx2" not in gemv._cpu_flags().split(), reason="not an x86 machine with AVX2")
def test_the_avx2_build_is_correct_too():
    """Development machines differ (AVX2 only, AVX-512): the AVX2 code path (8-float vectors, other register
    budget) built and checked here whatever this machine has."""
    assert gemv.available()  # the native build first: it implements the operator (this test may run alone)
    avx2 = gemv.build_for("x86-64-v3")
    torch.manual_seed(0)
    for rows in range(1, 9):
        for in_features in (16, 8 * 5 + 3, 5):
            w, b, x = torch.randn(37, in_features), torch.randn(37), torch.randn(rows, in_features)
            y = avx2.few_rows(x, w, b)
            assert torch.allclose(y, torch.nn.functional.linear(x, w, b), atol=1e-5, rtol=1e-5)
            assert all(torch.equal(y[n], avx2.few_rows(x[n:n + 1], w, b)[0]) for n in range(rows))
    for head_dim in (64, 8):  # the attention's unrolled and runtime loops, 8-float vectors
        q, k, v, mask = _attention_inputs(2, 6, 3, 3, 100, head_dim, fills=[70, 3])
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        torch.testing.assert_close(avx2.cache_attention(q, k, v, mask, head_dim ** -0.5), want.transpose(1, 2),
                                   rtol=1e-5, atol=1e-6)
    # the operator keeps the native build's kernel: loading another build does not replace it for the process
    w, b, x = torch.randn(64, 16 * 7 + 3), torch.randn(64), torch.randn(4, 16 * 7 + 3)
    assert torch.equal(torch.ops.specrepro.few_rows.default(x, w, b), gemv.few_rows(x, w, b))


@needs_compiler
def test_few_rows_refuses_what_it_cannot_compute_with_a_clear_error():
    w = torch.randn(6, 16)
    for x, bias, match in ((torch.randn(9, 16), None, "1 to 8 rows"), (torch.randn(2, 16).double(), None, "float32"),
                           (torch.randn(2, 15), None, r"x \(N, in\)"), (torch.randn(2, 16), torch.randn(5), "bias")):
        with pytest.raises(RuntimeError, match=match):
            gemv.few_rows(x, w, bias)


def test_use_kernels_switches_each_distinct_model_once_and_passes_over_the_rest(monkeypatch):
    from specrepro import kernels as K
    from specrepro.drafts import PromptLookupDraft
    from specrepro.tiny import tiny_pair

    target, draft = tiny_pair(16, dtype=torch.float32)
    calls, real = [], K.use_kernel
    monkeypatch.setattr(K, "use_kernel", lambda m, n: calls.append(m) or real(m, n))
    K.use_kernels((target, draft, target, None, PromptLookupDraft()), "small_row")
    assert [id(m) for m in calls[:2]] == [id(target), id(draft)] and len(calls) == 3  # the lookup: called, no layers
    assert type(target.lm_head) is K.LINEARS["small_row"] and type(draft.lm_head) is K.LINEARS["small_row"]
    K.use_kernels((target, draft), "stock")
    assert type(target.lm_head) is torch.nn.Linear


def _attention_inputs(batch, heads, kv_heads, width, slots, head_dim, fills, seed=0):
    """Query, key, value and a causal mask as the static path builds them: row b sees its first fills[b] slots and
    each query its block's earlier tokens."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, width, heads, head_dim, generator=g).transpose(1, 2)  # the layout the model gives
    key = torch.randn(batch, kv_heads, slots, head_dim, generator=g)
    value = torch.randn(batch, kv_heads, slots, head_dim, generator=g)
    mask = torch.zeros(batch, 1, width, slots, dtype=torch.bool)
    for b, fill in enumerate(fills):
        for t in range(width):
            mask[b, 0, t, :fill + t + 1] = True
    return query, key, value, mask


@needs_compiler
@pytest.mark.parametrize("head_dim", [64, 128, 16, 8, 24])  # unrolled sizes, and the runtime loop
@pytest.mark.parametrize("width", [1, 3, 8])
def test_cache_attention_equals_sdpa(head_dim, width):
    q, k, v, mask = _attention_inputs(3, 6, 2, width, 200, head_dim, fills=[150, 0, 63])
    mask[1, :, :, :2] = False  # a left-padded row
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got = gemv.cache_attention(q, k, v, mask, head_dim ** -0.5)
    assert got.shape == (3, width, 6, head_dim)
    torch.testing.assert_close(got, want.transpose(1, 2), rtol=1e-5, atol=1e-6)
    assert torch.equal(torch.ops.specrepro.cache_attention.default(q, k, v, mask, head_dim ** -0.5), got)


@needs_compiler
def test_cache_attention_reads_no_slot_past_a_rows_last_visible_one():
    """A static cache's tail is never read: NaN there changes nothing (sdpa reads every slot)."""
    q, k, v, mask = _attention_inputs(2, 9, 3, 2, 512, 64, fills=[256, 40])
    clean = gemv.cache_attention(q, k, v, mask, 0.125)
    k[0, :, 258:], v[0, :, 258:], k[1, :, 42:], v[1, :, 42:] = (float("nan"),) * 4
    assert torch.equal(gemv.cache_attention(q, k, v, mask, 0.125), clean)


@needs_compiler
def test_cache_attention_gives_each_row_the_same_bits_alone_or_with_others_on_any_thread_count():
    q, k, v, mask = _attention_inputs(3, 9, 3, 4, 300, 64, fills=[280, 5, 100], seed=1)
    together = gemv.cache_attention(q, k, v, mask, 0.125)
    for b in range(3):
        alone = gemv.cache_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], mask[b:b + 1], 0.125)
        assert torch.equal(alone[0], together[b])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(gemv.cache_attention(q, k, v, mask, 0.125), together)
    finally:
        torch.set_num_threads(threads)


@needs_compiler
def test_cache_attention_gives_zeros_to_a_query_that_sees_nothing_and_refuses_what_it_cannot_compute():
    q, k, v, mask = _attention_inputs(1, 4, 2, 2, 32, 16, fills=[10])
    mask[0, 0, 1] = False
    out = gemv.cache_attention(q, k, v, mask, 0.25)
    assert torch.equal(out[0, 1], torch.zeros(4, 16)) and out[0, 0].abs().sum() > 0
    for args, match in (((q.double(), k, v, mask), "float32"), ((q, k, v, mask.float()), "boolean mask"),
                        ((q, k[:, :, :31], v[:, :, :31], mask), "mask"), ((q[:, :3], k, v, mask), "disagree")):
        with pytest.raises(RuntimeError, match=match):
            gemv.cache_attention(*args, 0.25)
