"""The benchmark harness: every method decodes the same thing; transformers' assisted generation agrees."""

import math

import pytest
import torch

from specrepro import autoregressive_generate, bench, gemv, timing
from specrepro.kernels import LINEARS
from specrepro.tiny import tiny_pair


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(16, dtype=torch.float64)


@pytest.mark.parametrize("gamma", [None, 3])
def test_hf_assisted_greedy_equals_ours(pair, gamma):
    target, draft = pair
    x = torch.tensor([[1, 2, 3, 4]])
    ref = autoregressive_generate(target, x, max_new_tokens=20, temperature=0).sequences
    saved = draft.generation_config
    assert torch.equal(bench.hf_generate(target, x, max_new_tokens=20, assistant=draft, gamma=gamma), ref)
    assert draft.generation_config is saved  # restored


def test_hf_sampling_is_seeded_without_touching_the_global_rng(pair):
    target, draft = pair
    x = torch.tensor([[1, 2, 3, 4]])
    state = torch.random.get_rng_state()
    a = bench.hf_generate(target, x, max_new_tokens=10, temperature=1.0, assistant=draft, gamma=2,
                          generator=torch.Generator().manual_seed(3))
    b = bench.hf_generate(target, x, max_new_tokens=10, temperature=1.0, assistant=draft, gamma=2,
                          generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and torch.equal(torch.random.get_rng_state(), state)


def test_run_bench_interleaves_all_methods_on_the_same_prompts(pair):
    target, draft = pair
    prompts = [torch.tensor([[1, 2, 3]]), torch.tensor([[5, 6, 7, 8]])]
    runs = bench.run_bench(target, draft, prompts, gamma=2, max_new_tokens=8, repeats=2)
    assert [r.method for r in runs[:4]] == list(bench.METHODS)
    assert len(runs) == 2 * 2 * len(bench.METHODS)
    for i in range(2):  # greedy: every method writes the same tokens
        outs = {tuple(r.output) for r in runs if r.prompt == i}
        assert len(outs) == 1
    summary = bench.summarize(runs)
    assert summary["autoregressive"]["speedup"] == 1.0
    assert all(s["tokens"] == 2 * 2 * 8 for s in summary.values())
    assert all(r.alpha is not None for r in runs if r.method == "speculative")


def test_prompt_lookup_maps_to_transformers_prompt_lookup_decoding():
    from specrepro.drafts import PromptLookupDraft
    from specrepro.tiny import tiny_target

    target = tiny_target(16, seed=3)
    x = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])
    ref = autoregressive_generate(target, x, max_new_tokens=15, temperature=0).sequences
    for gamma in (None, 3):
        assert torch.equal(bench.hf_generate(target, x, max_new_tokens=15, assistant=PromptLookupDraft(16, 2),
                                             gamma=gamma), ref)


def _run(method, prompt, seconds, ttft, tokens, stats=None):
    return bench.Run(method, prompt, 0, seconds, ttft, tokens, stats=stats)


def test_summary_pools_time_per_token_over_prompts():
    # prompt 0 repeats itself (speculative 4x faster), prompt 1 does not (no faster): pooled, not the median
    runs = [_run("autoregressive", 0, 10.5, 0.5, 101), _run("speculative", 0, 3.0, 0.5, 101),
            _run("autoregressive", 1, 10.5, 0.5, 101), _run("speculative", 1, 10.5, 0.5, 101)]
    s = bench.summarize(runs)
    assert s["autoregressive"]["decode_ms_per_token"] == pytest.approx(100.0)
    assert s["speculative"]["decode_ms_per_token"] == pytest.approx(1e3 * 12.5 / 200)
    assert s["speculative"]["speedup"] == pytest.approx(20 / 12.5)
    assert s["speculative"]["speedup_range"] == pytest.approx((1.0, 4.0))
    assert s["speculative"]["ttft_ms"] == pytest.approx(500)
    # the bootstrap over the 2 prompts: resamples are {0,0} (4x), {1,1} (1x) and {0,1} (1.6x)
    assert s["speculative"]["n_prompts"] == 2
    assert s["speculative"]["speedup_lo"] == pytest.approx(1.0) and s["speculative"]["speedup_hi"] == pytest.approx(4.0)


def test_speedup_interval_keeps_a_prompts_repeats_together_and_needs_shared_prompts():
    runs = [bench.Run(m, p, rep, secs, 0.0, 11) for p in range(6) for rep in range(2)
            for m, secs in (("autoregressive", 1.0), ("speculative", 0.5 if p % 2 else 0.25))]
    ci = bench.speedup_interval(runs, "speculative")
    assert ci.n_units == 6 and ci.estimate == pytest.approx(2 / 0.75)
    assert 2.0 <= ci.lo < ci.estimate < ci.hi <= 4.0
    with pytest.raises(ValueError, match="no prompt was run by both"):
        bench.speedup_interval([r for r in runs if r.method == "speculative"], "speculative")


def test_every_method_logs_the_targets_forwards(pair):
    target, draft = pair
    runs = bench.run_bench(target, draft, [torch.tensor([[1, 2, 3]])], gamma=2, max_new_tokens=8, warmup=False)
    for r in runs:
        assert r.forward_times and all(n >= 1 and t > 0 for n, t in r.forward_times)
        if r.stats is not None:  # ours: the hook sees exactly the forwards the loop recorded
            assert [n for n, _ in r.forward_times] == [n for n, _ in r.stats.target_forwards]
    s = bench.summarize(runs)
    assert s["autoregressive"]["target_forwards_per_token"] == 1.0
    for m in bench.METHODS:
        assert s[m]["other_ms_per_token"] >= 0 and s[m]["target_forward_ms_per_token"] > 0


def test_forward_log_removes_its_hooks(pair):
    from specrepro.timing import forward_log

    target, _ = pair
    with forward_log(target) as log:
        target(input_ids=torch.tensor([[1, 2]]))
    target(input_ids=torch.tensor([[1, 2]]))
    assert [n for n, _ in log] == [2] and not target._forward_hooks and not target._forward_pre_hooks


def test_sweep_row_sets_the_measured_speedup_beside_the_models():
    from specrepro.generate import GenerationStats

    # binary-exact times (s): autoregressive 100 ms per decode step, speculative 50 ms per token after the first;
    # every speculative iteration after the first: draft 31.25 ms (2 drafts), target 62.5 ms, bookkeeping 31.25 ms
    ar = GenerationStats(prompt_len=1, new_tokens=11, iteration_seconds=[0.125] + [0.1] * 10)
    sp = GenerationStats(prompt_len=1, new_tokens=11, proposed=[2, 2, 2, 2], accepted=[2, 1, 0, 2],
                         iteration_seconds=[0.25, 0.125, 0.125, 0.125], draft_seconds=[0.03125] * 4,
                         target_seconds=[0.0625] * 4)
    runs = [_run("autoregressive", 0, 1.125, 0.125, 11, ar), _run("speculative", 0, 0.625, 0.125, 11, sp)]
    row = bench.sweep_row(runs, 2, draft_ms_per_token=20.0, verify_steps=[1.0, 1.2, 1.5])
    tokens = 109 / 49  # Eq. 1 at alpha = 5/7, gamma = 2: 1 + 5/7 + 25/49
    assert row["alpha"] == 5 / 7 and row["mean_proposed"] == 2 and row["tokens_measured"] == 2.25
    assert row["measured_speedup"] == 2.0 and row["ar_ms"] == 100.0 and row["spec_ms"] == 50.0
    assert (row["step_ms"], row["draft_ms"], row["overhead_ms"]) == pytest.approx((100.0, 15.625, 31.25))
    assert row["tokens_model"] == pytest.approx(tokens)
    assert row["predicted"] == pytest.approx(tokens * 100 / 125)  # 2 * 15.625 + 62.5 + 31.25 ms per iteration
    assert row["predicted_apart"] == pytest.approx(tokens * 100 / 190)  # 2 * 20 + 1.5 * 100, no overhead
    assert row["thm_3_8"] == pytest.approx(tokens / 1.4)  # c = 20 / 100
    assert row["rel_error"] == pytest.approx(2.0 / (tokens * 100 / 125) - 1)
    assert row["verify_steps_in_run"] == pytest.approx(0.625) and row["verify_steps_apart"] == 1.5
    assert row["c"] == 0.2 and row["c_in_run"] == pytest.approx(0.15625)
    # our autoregressive runs too brief to time (transformers' made the baseline): no model is fed a negative step
    brief = [_run("autoregressive", 0, 0.1, 0.125, 11, ar), _run(bench.HF_AUTOREGRESSIVE, 0, 1.125, 0.125, 11, ar),
             runs[1]]
    with pytest.raises(ValueError, match="runs at gamma .* have no positive decode time .* too short to time"):
        bench.sweep_row(brief, 2, draft_ms_per_token=20.0, verify_steps=[1.0, 1.2, 1.5])


def _k_runs(gamma: int, accepted: list[int]) -> list:
    """Runs at `gamma` with the given accepted counts per iteration: the decode step 125 ms, the draft 7.8125 ms per
    proposed token (c = 1/16), all binary-exact."""
    from specrepro.generate import GenerationStats

    n = len(accepted)
    ar = GenerationStats(prompt_len=1, new_tokens=11, iteration_seconds=[0.25] + [0.125] * 10)
    sp = GenerationStats(prompt_len=1, new_tokens=11, proposed=[gamma] * n, accepted=accepted,
                         iteration_seconds=[0.5] * n, draft_seconds=[gamma * 0.0078125] * n,
                         target_seconds=[0.125] * n)
    return [_run("autoregressive", 0, 1.5, 0.25, 11, ar), _run("speculative", 0, 0.5 * n, 0.25, 11, sp)]


def test_k_then_model_pick_runs_the_models_gamma_only_where_it_differs_from_k():
    calls = []

    def high(g):  # alpha 13/14 at every gamma the runs see (3 full acceptances, then 1 of 2 tested)
        calls.append(g)
        return _k_runs(g, [g, g, g, 1])

    rows = bench.at_k_then_model_pick(high, 4)
    assert calls == [4, 15] == [r["gamma"] for r in rows]  # Thm 3.8 at alpha 13/14, c = 1/16, gamma <= 16: 15
    assert [r["chosen_by"] for r in rows] == ["K", bench.MODEL_PICK]
    assert rows[0]["alpha"] == 13 / 14 and rows[0]["c"] == 1 / 16 and rows[0]["picked"] == 15
    assert rows[0]["costs"].step_ms == 125.0 and rows[1]["runs"][1].stats.proposed[0] == 15
    # contrary data: alpha 3/5 at the same c puts the model's gamma at K itself, so K is the only run
    calls.clear()
    rows = bench.at_k_then_model_pick(lambda g: calls.append(g) or _k_runs(g, [3, 0]), 4)
    assert calls == [4] and rows[0]["alpha"] == 0.6 and rows[0]["picked"] == 4
    # the cap on gamma holds, and nonsense is refused
    assert bench.at_k_then_model_pick(high, 4, max_gamma=6)[1]["gamma"] == 6
    with pytest.raises(ValueError, match="K and max_gamma must be >= 1"):
        bench.at_k_then_model_pick(high, 0)


def test_fastest_takes_each_method_at_its_fastest_kernel():
    runs = [bench.Run("autoregressive", p, 0, secs, 0.0, 11, kernel=k) for p in range(2)
            for k, secs in (("stock", 1.0), ("small_row", 2.0))]
    runs += [bench.Run("speculative", p, 0, secs, 0.0, 11, kernel=k) for p in range(2)
             for k, secs in (("stock", 0.8), ("small_row", 0.4))]
    best = bench.fastest(runs)
    assert {(r.method, r.kernel) for r in best} == {("autoregressive", "stock"), ("speculative", "small_row")}
    assert bench.summarize(best)["speculative"]["speedup"] == pytest.approx(2.5)


def test_run_bench_runs_every_kernel_on_every_prompt(pair):
    from specrepro.kernels import SmallRowLinear, use_kernel

    target, draft = pair
    runs = bench.run_bench(target, draft, [torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5]])], gamma=2,
                           max_new_tokens=6, warmup=False, methods=("autoregressive", "speculative"),
                           kernels=("stock", "small_row"))
    assert [(r.prompt, r.kernel, r.method) for r in runs][:4] == [
        (0, "stock", "autoregressive"), (0, "stock", "speculative"),
        (0, "small_row", "autoregressive"), (0, "small_row", "speculative")]
    assert len(runs) == 8 and len(bench.fastest(runs)) == 4
    outputs = {(r.prompt, r.kernel, r.method): r.output for r in runs}
    assert all(outputs[p, "stock", m] == outputs[p, "small_row", m]  # same tokens whichever kernel (greedy)
               for p in range(2) for m in ("autoregressive", "speculative"))
    assert isinstance(target.lm_head, SmallRowLinear)  # left with the last kernel
    use_kernel(target, "stock")
    use_kernel(draft, "stock")
    with pytest.raises(ValueError, match="unknown configuration"):
        bench.run_bench(target, draft, [torch.tensor([[1, 2]])], gamma=2, max_new_tokens=2, warmup=False,
                        kernels=("fast",))


def test_run_bench_runs_each_method_with_its_own_kernel_when_given_a_mapping(pair):
    """A {method: kernel} mapping (an earlier race's picks) runs each method once per prompt, with its own kernel
    switched in before it: the same tokens as the race, half the runs; a method without a kernel, an unknown kernel
    and runs with several kernels per method are refused."""
    from specrepro.kernels import SmallRowLinear, use_kernel

    target, draft = pair
    prompts = [torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5]])]
    race = bench.run_bench(target, draft, prompts, gamma=2, max_new_tokens=6, warmup=False,
                           methods=("autoregressive", "speculative"), kernels=("stock", "small_row"))
    picks = {"autoregressive": "small_row", "speculative": "stock"}
    runs = bench.run_bench(target, draft, prompts, gamma=2, max_new_tokens=6, warmup=True,
                           methods=("autoregressive", "speculative"), kernels=picks)
    assert [(r.prompt, r.method, r.kernel) for r in runs] == [
        (p, m, picks[m]) for p in range(2) for m in ("autoregressive", "speculative")]
    assert bench.kernels_of(runs) == picks
    race_out = {(r.prompt, r.method, r.kernel): r.output for r in race}
    assert all(r.output == race_out[r.prompt, r.method, r.kernel] for r in runs)
    assert not isinstance(target.lm_head, SmallRowLinear)  # the last method's kernel (speculative: stock)
    with pytest.raises(ValueError, match="several configurations"):
        bench.kernels_of(race)
    with pytest.raises(ValueError, match=r"no configuration for \['speculative'\]"):
        bench.run_bench(target, draft, prompts[:1], gamma=2, max_new_tokens=2, warmup=False,
                        methods=("autoregressive", "speculative"), kernels={"autoregressive": "stock"})
    with pytest.raises(ValueError, match="unknown configuration"):
        bench.run_bench(target, draft, prompts[:1], gamma=2, max_new_tokens=2, warmup=False,
                        methods=("autoregressive",), kernels={"autoregressive": "fast"})
    use_kernel(target, "stock")
    use_kernel(draft, "stock")


@pytest.mark.compiles
@pytest.mark.filterwarnings("error::RuntimeWarning")  # our compiled path must not fall back to eager unseen
@pytest.mark.parametrize("compiled", [bench.COMPILED, bench.COMPILED_FEW_ROWS])
def test_compiled_configuration_runs_ours_and_transformers_compiled_paths(compiled):
    """A compiled configuration runs our static-cache path and transformers' static-cache compiled generate(), with
    its linear kernel: the same greedy tokens as the eager runs; no forward hooks inside compiled graphs; the speedup
    baseline is the fastest autoregressive method."""
    if compiled == bench.COMPILED_FEW_ROWS and not gemv.has_compiler():
        pytest.skip("no C++ compiler here: the few-row kernel cannot be built")
    target, draft = tiny_pair(32, seed=4, dtype=torch.float32)
    methods = ("autoregressive", "speculative", bench.HF_AUTOREGRESSIVE, "hf_assisted_fixed")
    prompts = [torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5, 6, 7, 8]])]
    runs = bench.run_bench(target, draft, prompts, gamma=2, max_new_tokens=10, methods=methods,
                           kernels=("stock", compiled), compile_mode="default")
    assert bench.linear_kernel(compiled) == {bench.COMPILED: "stock", bench.COMPILED_FEW_ROWS: "few_rows"}[compiled]
    assert type(target.model.layers[0].mlp.up_proj) is LINEARS[bench.linear_kernel(compiled)]  # the last config's
    assert len(runs) == 2 * (len(methods) + len(bench.COMPILED_METHODS))  # no assisted generation compiled
    assert {r.method for r in runs if r.kernel == compiled} == set(bench.COMPILED_METHODS)
    for p in range(2):
        assert len({tuple(r.output) for r in runs if r.prompt == p}) == 1
    assert all((r.forward_times is None) == (r.kernel == compiled) for r in runs)
    summary = bench.summarize(bench.fastest(runs))
    baseline = min(bench.AUTOREGRESSIVE, key=lambda m: summary[m]["decode_ms_per_token"])
    assert all(s["baseline"] == baseline for s in summary.values()) and summary[baseline]["speedup"] == 1.0


def _llama(forward_ms: dict[int, float], decode_ms: float = 10.0):
    from specrepro.engines import BenchRow

    common = dict(depth=256, threads=2, flash_attn="auto", model_type="llama F32")
    return ([BenchRow(test="forward", tokens=k, ms=t, samples_ms=(t,), **common) for k, t in forward_ms.items()]
            + [BenchRow(test="decode", tokens=32, ms=decode_ms, samples_ms=(decode_ms,), **common)])


def test_anchor_table_sets_each_width_beside_llama_cpp_in_time_and_in_steps():
    rows = bench.anchor_table({"compiled": [20.0, 24.0, 30.0]}, _llama({1: 10.0, 2: 11.0, 3: 13.0}),
                              {1: 8.0, 2: 8.5, 3: 9.0})
    by = {(r["regime"], r["tokens"]): r for r in rows}
    assert by[bench.LLAMA_CPP, 3]["steps"] == pytest.approx(1.3)
    assert by["compiled", 1]["ms_vs_llama"] == pytest.approx(2.0)
    assert by["compiled", 1]["x_floor"] == pytest.approx(2.5)
    assert by["compiled", 3]["steps_vs_llama"] == pytest.approx(1.5 / 1.3)
    alone = bench.anchor_table({"compiled": [20.0, 24.0]}, [], {1: 8.0})  # llama.cpp could not run here
    assert [r["regime"] for r in alone] == ["compiled", "compiled"] and math.isnan(alone[1]["steps_vs_llama"])
    assert math.isnan(alone[1]["x_floor"])  # no floor given for that width


def test_anchor_goals_hold_only_where_ours_is_as_cheap_as_llama_cpp():
    llama = _llama({1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0, 5: 14.0}, decode_ms=10.0)
    floors = {k: 8.0 for k in range(1, 6)}
    level = bench.anchor_table({"c": [10.5, 11.5, 12.5, 13.5, 14.5]}, llama, floors)
    assert [g["holds"] for g in bench.anchor_goals(level, "c", llama_decode_ms=10.0)] == [True, True]
    slow = bench.anchor_table({"c": [20.0, 40.0, 60.0, 80.0, 100.0]}, llama, floors)  # twice the step, flat-less
    goals = bench.anchor_goals(slow, "c", llama_decode_ms=10.0)
    assert [g["holds"] for g in goals] == [False, False] and goals[0]["value"] == pytest.approx(2.0)
    cheaper = bench.anchor_table({"c": [20.0, 20.0, 20.0, 20.0, 20.0]}, llama, floors)  # slower step, flat curve
    assert [g["holds"] for g in bench.anchor_goals(cheaper, "c", llama_decode_ms=10.0)] == [False, True]
    missing = bench.anchor_goals(bench.anchor_table({"c": [10.0, 11.0]}, [], floors), "c",
                                 llama_decode_ms=float("nan"))
    assert not any(g["holds"] for g in missing) and all(math.isnan(g["value"]) for g in missing)
    with pytest.raises(ValueError, match="no 1-token forward"):
        bench.anchor_goals(level, "eager", llama_decode_ms=10.0)


def _paired(ours: list[float], llama: list[float] | None) -> list[dict]:
    rows = [dict(round=r, name="c", ms=10.0 * x, read_ms=10.0, x_read=x) for r, x in enumerate(ours)]
    return rows + [dict(round=r, name=bench.LLAMA_CPP, ms=10.0 * x, read_ms=10.0, x_read=x)
                   for r, x in enumerate(llama or [])]


def test_read_goals_follow_the_paired_ratios():
    met = bench.read_goals(_paired([1.2, 1.25, 1.1, 1.3, 1.2], [1.15, 1.2, 1.1, 1.25, 1.1]), "c")
    assert [g["holds"] for g in met] == [True, True] and met[0]["value"] == pytest.approx(1.2)
    assert met[0]["lo"] <= met[0]["value"] <= met[0]["hi"] and met[0]["rounds"] == 5
    own = timing.x_read_summary(_paired([1.2, 1.25, 1.1, 1.3, 1.2], [1.15, 1.2, 1.1, 1.25, 1.1]))["c"]
    assert (met[0]["value"], met[0]["lo"], met[0]["hi"]) == (own["x_read"], own["x_read_lo"], own["x_read_hi"])
    slow = bench.read_goals(_paired([2.0, 2.2, 1.9], [1.1, 1.2, 1.0]), "c")  # the contrary data
    assert [g["holds"] for g in slow] == [False, False] and slow[1]["value"] > 1.6
    behind = bench.read_goals(_paired([1.25, 1.28, 1.2], [1.0, 1.0, 1.0]), "c")  # near its floor, not llama.cpp's
    assert [g["holds"] for g in behind] == [True, False]
    alone = bench.read_goals(_paired([1.2, 1.2], None), "c")  # llama.cpp could not run
    assert alone[0]["holds"] and not alone[1]["holds"] and math.isnan(alone[1]["value"])


def test_read_floor_reads_each_weight_once_and_the_cache_bytes(monkeypatch):
    from specrepro import flops
    from specrepro.tiny import tiny_pair

    target, _ = tiny_pair(64, dtype=torch.float32)
    seen = []
    monkeypatch.setattr(timing, "read_ms", lambda tensors, device=None: seen.append(tensors) or 1.0)
    assert bench.read_floor(target, 16)() == 1.0
    (tensors,) = seen
    emb = target.get_input_embeddings().weight
    assert emb is not target.get_output_embeddings().weight  # untied: a forward reads only its looked-up rows
    params = {p.data_ptr() for p in target.parameters() if p is not emb}
    assert {t.data_ptr() for t in tensors[:-1]} == params and len(tensors) == len(params) + 1  # in place, once
    b = flops.forward_bytes(flops.flops_config(target), 1, 16)
    assert tensors[-1].numel() * 4 == b["kv_read"] + b["kv_write"] + b["logits"]


def test_the_speculation_goal_holds_only_where_ours_gains_as_much_as_llama_cpps_best():
    llama = [dict(mode="a", speedup=1.2), dict(mode="b", speedup=1.5)]
    ahead = bench.speculation_goal(dict(speedup=1.6), llama)
    assert ahead["holds"] and ahead["value"] == pytest.approx(1.6 / 1.5) and "b, 1.50x" in ahead["goal"]
    behind = bench.speculation_goal(dict(speedup=1.3), llama)  # ahead of one mode, behind the best
    assert not behind["holds"] and behind["value"] == pytest.approx(1.3 / 1.5)
    missing = bench.speculation_goal(dict(speedup=2.0), [])
    assert not missing["holds"] and math.isnan(missing["value"]) and "not run" in missing["goal"]


def test_llama_cpp_speculation_refuses_bad_input_and_says_why_it_cannot_run():
    with pytest.raises(ValueError, match="non-empty prompts"):
        bench.llama_cpp_speculation("x", [[1, 2], []], max_new_tokens=4, threads=1)
    with pytest.raises(ValueError, match='"off"'):
        bench.llama_cpp_speculation("x", [[1, 2]], max_new_tokens=4, threads=1, modes={"off": ()})
    rows, why = bench.llama_cpp_speculation("someone/a-hub-model", [[1, 2]], max_new_tokens=4, threads=1)
    assert rows == [] and "local transformers folder" in why


def test_one_stalled_first_token_call_does_not_eat_the_runs_decode_time(pair, monkeypatch):
    """A 1 s stall in a first-token call (seen once on a text prompt) must not become that run's TTFT: the TTFT is
    the fastest of `FIRST_TOKEN_CALLS` calls, and the whole call keeps its own time."""
    target, draft = pair
    real, calls = bench.timed, []

    def stalling(fn, device=None):
        secs, out = real(fn, device)
        calls.append(secs)
        return (secs + 1.0 if len(calls) == 1 else secs), out  # the very first call stalls

    monkeypatch.setattr(bench, "timed", stalling)
    runs = bench.run_bench(target, draft, [torch.tensor([[1, 2, 3]])], gamma=2, max_new_tokens=8, warmup=False,
                           methods=("autoregressive",))
    assert len(calls) == bench.FIRST_TOKEN_CALLS + 1
    (run,) = runs
    assert run.ttft_seconds < 1.0 and run.decode_seconds > 0
    monkeypatch.setattr(bench, "FIRST_TOKEN_CALLS", 1)  # the old design: the stall is the TTFT, decode time < 0
    calls.clear()
    (old,) = bench.run_bench(target, draft, [torch.tensor([[1, 2, 3]])], gamma=2, max_new_tokens=8, warmup=False,
                             methods=("autoregressive",))
    assert old.ttft_seconds >= 1.0 and old.decode_seconds < 0


def test_the_cli_runs_end_to_end_and_prints_the_walltime_predictions(monkeypatch, capsys):
    """`python -m specrepro.bench` on a tiny pair (loaders and prompts patched; the rest is the real path)."""
    import types

    from specrepro import acceptance, data, models

    target, draft = tiny_pair(16, dtype=torch.float32)  # its own pair: main must not retype the shared one
    monkeypatch.setattr(models, "load_target", lambda name, **kw: target)
    monkeypatch.setattr(models, "load_draft", lambda name, **kw: draft)
    monkeypatch.setattr(models, "load_tokenizer", lambda name: types.SimpleNamespace(eos_token_id=None))
    monkeypatch.setattr(acceptance, "eval_prompts", lambda task, n, seed=0: list(range(n)))
    monkeypatch.setattr(data, "encode_prompt", lambda tok, task, ex: torch.tensor([[1 + ex, 2, 3, 4]]))
    assert bench.main(["--prompts", "2", "--max-new-tokens", "6", "--repeats", "1", "--kernels", "stock"]) == 0
    out = capsys.readouterr().out
    assert "--- kernel stock" in out and "each method at its fastest kernel" in out
    assert "the generalised walltime model predicts" in out and "tokens per target forward" in out
    assert "what keeps the run from 1.6x" in out and "verification at one decode step" in out


def test_a_feature_draft_runs_ours_beside_transformers_with_another_draft(pair):
    """Ours with a draft transformers cannot run (it reads the target's features), transformers' assisted
    generation with `hf_draft`, interleaved: the feature draft runs in the compiled configuration too (the compiled
    target returns its features); transformers' assisted generation gives the target's greedy tokens."""
    from specrepro.tiny import tiny_feature_draft

    target, hf_draft = tiny_pair(32, seed=5, dtype=torch.float32)  # their own pair: the fixture stays float64
    feature = tiny_feature_draft(target)
    methods = ("autoregressive", "speculative", bench.HF_AUTOREGRESSIVE, "hf_assisted_fixed")
    runs = bench.run_bench(target, feature, [torch.tensor([[1, 2, 3]])], gamma=2, max_new_tokens=6, warmup=False,
                           methods=methods, hf_draft=hf_draft, kernels=("stock", bench.COMPILED),
                           compile_mode="eager")
    ran = {(r.kernel, r.method) for r in runs}
    assert ran == {("stock", m) for m in methods} | {(bench.COMPILED, m) for m in bench.COMPILED_METHODS}
    assert len({tuple(r.output) for r in runs}) == 1  # greedy: every method, every configuration, the same tokens
    assert next(r for r in runs if r.method == "speculative").stats.proposed  # the feature draft did draft
    with pytest.raises(TypeError, match="has no transformers equivalent.*as hf_draft"):
        bench.run_bench(target, feature, [torch.tensor([[1, 2, 3]])], gamma=2, max_new_tokens=4, warmup=False,
                        methods=("hf_assisted_fixed",))


@pytest.mark.compiles
def test_a_converted_copy_decodes_with_its_own_forward_after_transformers_compiled_the_original():
    """07's bfloat16 section failed 65 minutes into a full run: transformers' compiled generate() had run the float32
    target, which keeps the compiled `__call__` on the module; a deepcopy shares it, so the bfloat16 copy decoded
    with the float32 original's forward ("query float, key BFloat16"). `models.converted` drops that cache."""
    import copy

    from specrepro.compiled import CompileConfig
    from specrepro.models import converted

    target, _ = tiny_pair(16, dtype=torch.float32)
    x = torch.tensor([[1, 2, 3, 4]])
    compiled = CompileConfig("dynamo")  # dynamo traces with fake tensors, as every compiled mode does; no inductor
    bench.hf_generate(target, x, max_new_tokens=4, compile=compiled)
    assert hasattr(target, "_compiled_call")  # the cache the bug came from (if transformers drops it, so can we)
    with pytest.raises(Exception, match="same dtype"):  # the bug, as 07 met it
        bench.hf_generate(copy.deepcopy(target).to(torch.bfloat16), x, max_new_tokens=4, compile=compiled)
    copy16 = converted(target, torch.bfloat16)
    out = bench.hf_generate(copy16, x, max_new_tokens=4, compile=compiled)
    assert out.shape == (1, 8)
    assert next(copy16.parameters()).dtype == torch.bfloat16 and next(target.parameters()).dtype == torch.float32


def test_a_baseline_too_brief_to_time_is_never_the_fastest():
    """transformers' generate here took less for 11 tokens than its first token took apart (noise in a run of a few
    milliseconds): its decode time is negative, no measurement, so ours is the baseline; with none positive, a
    clear error."""
    runs = [bench.Run(m, p, 0, secs, 0.004, 11) for p in range(3)
            for m, secs in (("autoregressive", 0.05), (bench.HF_AUTOREGRESSIVE, 0.003), ("speculative", 0.03))]
    s = bench.summarize(runs)
    assert s["speculative"]["baseline"] == "autoregressive"
    assert s["speculative"]["speedup"] == pytest.approx((0.05 - 0.004) / (0.03 - 0.004))
    with pytest.raises(ValueError, match="every autoregressive run has no positive decode time .* too short to time"):
        bench.summarize([r for r in runs if r.method != "autoregressive"])
