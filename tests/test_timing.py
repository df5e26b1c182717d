"""The timing helpers: every call timed once, results as data (no speed is asserted: the machine is shared)."""

import math

import pytest
import torch

from specrepro import timing
from specrepro.tiny import tiny_target


def test_timed_returns_seconds_and_result():
    secs, out = timing.timed(lambda: 41 + 1)
    assert out == 42 and secs >= 0


def test_time_interleaved_times_each_fn_once_per_round_after_warmup():
    calls = []
    fns = {"a": lambda: calls.append("a") or 3, "b": lambda: calls.append("b") or 5}
    got = timing.time_interleaved(fns, repeats=3, warmup=1)
    assert calls == ["a", "b"] * 4  # one warm-up round, then three interleaved rounds
    assert got["a"].units == [3, 3, 3] and got["b"].units == [5, 5, 5]
    assert len(got["a"].seconds) == 3 and got["a"].median_per_unit >= 0


def test_forward_seconds_times_a_forward_after_a_cached_prefix():
    model = tiny_target(16, seed=0)
    assert timing.forward_seconds(model, 5, 3, repeats=2) > 0


def test_roofline_probes_give_positive_rates():
    assert timing.peak_matmul_flops(n=64, repeats=2) > 0
    assert timing.memory_bandwidth(n_bytes=1 << 16, repeats=2) > 0


def test_overhead_fit_recovers_a_known_line_and_refuses_one_point():
    from specrepro.timing import overhead_fit

    gb = [0.1e9, 0.3e9, 0.5e9, 0.9e9]
    fit = overhead_fit(gb, [8.0 + 20.0 * b / 1e9 for b in gb])  # 8 ms fixed, 20 ms per GB: 50 GB/s
    assert fit["overhead_ms"] == pytest.approx(8.0) and fit["bandwidth"] == pytest.approx(50e9)
    assert fit["r2"] == pytest.approx(1.0) and fit["n_models"] == 4
    with pytest.raises(ValueError, match="two models"):
        overhead_fit([1e9, 1e9], [3.0, 4.0])


def test_step_vs_bytes_on_models_of_one_depth():
    import torch

    from specrepro.timing import step_vs_bytes
    from specrepro.tiny import tiny_target, widened

    base = tiny_target(64, hidden_size=32, layers=3, dtype=torch.float32)
    models = {w: widened(base.config, w) for w in (32, 64, 128)}
    assert [m.config.num_hidden_layers for m in models.values()] == [3, 3, 3]
    assert [m.config.hidden_size for m in models.values()] == [32, 64, 128]
    rows = step_vs_bytes(models, 8, repeats=1)
    assert [r["hidden_size"] for r in rows] == [32, 64, 128]
    assert rows[0]["bytes"] < rows[1]["bytes"] < rows[2]["bytes"] and all(r["step_ms"] > 0 for r in rows)


def test_forward_ms_is_a_roofline_with_a_fixed_cost():
    from specrepro.theory import forward_ms

    kw = dict(overhead_ms=5.0, bytes_read=1e9, bandwidth=50e9, flops_per_token=1e9, peak_flops=200e9)
    # memory time 20 ms; compute 5 ms per token: flat up to the ridge at 4 tokens, then linear
    assert [forward_ms(k, **kw) for k in (1, 4, 8)] == pytest.approx([25.0, 25.0, 45.0])


def test_linear_bandwidth_times_every_kernel_on_the_distinct_weights_and_restores_the_kernel():
    from torch import nn

    from specrepro import gemv
    from specrepro.kernels import SmallRowLinear, use_kernel
    from specrepro.timing import linear_bandwidth
    from specrepro.tiny import tiny_pair

    target, _ = tiny_pair(16, seed=2)
    target.lm_head.weight = target.model.embed_tokens.weight  # tied: read once per pass
    use_kernel(target, "small_row")
    kernels = ("stock", "few_rows") if gemv.has_compiler() else ("stock", "small_row")
    rows = linear_bandwidth(target, kernels, rows=(1, 3), rounds=1, repeats=2)
    assert [(r["kernel"], r["rows"]) for r in rows] == [(k, n) for k in kernels for n in (1, 3)]
    distinct = {m.weight.data_ptr(): m.weight.numel() * m.weight.element_size() for m in target.modules()
                if isinstance(m, nn.Linear)}
    assert all(r["bytes"] == sum(distinct.values()) and r["ms"] > 0 and r["gb_per_s"] > 0 for r in rows)
    assert all(type(m) is SmallRowLinear for m in target.modules() if isinstance(m, nn.Linear))


def test_cpu_features_and_native_bf16_read_the_flags(tmp_path):
    amd_zen3 = tmp_path / "zen3"  # AVX2 only: bfloat16 is emulated there
    amd_zen3.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    xeon = tmp_path / "xeon"
    xeon.write_text("processor\t: 0\nmodel name\t: Xeon\nflags\t\t: avx2 avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert timing.cpu_features(amd_zen3) == ["avx2"]
    assert timing.cpu_features(xeon) == ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]
    assert timing.cpu_features(tmp_path / "missing") == []
    assert not timing.native_bf16("cpu", timing.cpu_features(amd_zen3))
    assert timing.native_bf16("cpu", timing.cpu_features(xeon))
    assert timing.native_bf16("cpu", ["avx512f", "avx512_bf16"]) and not timing.native_bf16("cpu", ["avx512f"])
    assert not timing.native_bf16("meta", ["amx_bf16"])


def test_op_profile_splits_a_calls_time_by_operator_and_keeps_the_rest_in_one_row():
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def fn():
        return torch.relu(a @ b).sum() + torch.tanh(a).mean()

    rows = timing.op_profile(fn, repeats=4, top=2)
    assert len(rows) == 3 and rows[-1]["op"] == "other"
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert rows[0]["ms"] >= rows[1]["ms"] and all(r["ms"] >= 0 for r in rows)
    every = {r["op"]: r for r in timing.op_profile(fn, repeats=4, top=50)}
    assert every["aten::mm"]["calls"] == 1 and every["aten::tanh"]["calls"] == 1  # per call of fn, not in all
    with pytest.raises(ValueError, match="repeats and top must be >= 1"):
        timing.op_profile(fn, repeats=0)


def test_paired_with_read_brackets_each_contender_with_reads_beside_it():
    log, reads = [], iter([9.0, 10.0, 11.0, 12.0, 12.0, 12.0] * 4)

    def read():
        log.append("read")
        return next(reads)

    def contender(name, ms):
        return lambda: log.append(name) or ms

    rows = timing.paired_with_read({"a": contender("a", 20.0), "b": contender("b", 33.0)}, read, rounds=2)
    assert log[:7] == ["read"] * 3 + ["a"] + ["read"] * 3 and log.count("a") == log.count("b") == 2
    first = rows[0]
    assert (first["round"], first["name"], first["ms"]) == (0, "a", 20.0)
    assert first["read_ms"] == pytest.approx((10.0 + 12.0) / 2) and first["x_read"] == pytest.approx(20.0 / 11.0)
    summary = timing.x_read_summary(rows)
    assert list(summary) == ["a", "b"] and summary["b"]["x_read"] == pytest.approx(3.0)
    assert summary["a"]["rounds"] == 2 and summary["a"]["x_read_lo"] <= summary["a"]["x_read"]
    single = timing.x_read_summary(rows[:1])
    assert math.isnan(single["a"]["x_read_lo"])  # one round: no interval
    with pytest.raises(ValueError, match="at least 1"):
        timing.paired_with_read({"a": contender("a", 1.0)}, read, rounds=0)
    with pytest.raises(ValueError, match="no contenders"):
        timing.paired_with_read({}, read)


def test_paired_ratio_pairs_rounds_both_contenders_ran():
    def row(r, name, ms, read):
        return dict(round=r, name=name, ms=ms, read_ms=read, x_read=ms / read)

    rows = [row(0, "a", 12.0, 10.0), row(0, "b", 20.0, 10.0), row(1, "a", 30.0, 20.0), row(1, "b", 40.0, 20.0),
            row(2, "a", 9.0, 10.0)]  # b missed round 2
    ms = timing.paired_ratio(rows, "a", "b", key="ms")
    assert ms.n_units == 2 and ms.estimate == pytest.approx((0.6 + 0.75) / 2) and ms.lo <= ms.estimate <= ms.hi
    x = timing.paired_ratio(rows, "a", "b")  # over the reads beside each: the same here, the reads being equal
    assert x.estimate == pytest.approx(ms.estimate)
    slower = timing.paired_ratio(rows, "b", "a", key="ms")  # the other way round: above one
    assert slower.estimate > 1 > ms.estimate
    assert timing.paired_ratio(rows, "a", "missing") is None
    one = timing.paired_ratio(rows[:2], "a", "b")
    assert one.n_units == 1 and math.isnan(one.lo)


def test_read_ms_reads_tensors_in_place():
    assert timing.read_ms([torch.ones(1000), torch.ones(10, 10)]) > 0
