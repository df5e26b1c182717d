"""The timing helpers: every call timed once, results as data (no speed is asserted: the machine is shared)."""


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
