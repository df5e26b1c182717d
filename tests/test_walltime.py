"""The walltime model fed with measured costs: in-run costs from GenerationStats times, and the prediction."""

import math

import pytest
import torch

from specrepro import bench, compiled, gemv, theory, walltime
from specrepro.kernels import use_kernel
from specrepro.tiny import tiny_pair


def _run(method, prompt, seconds, ttft, tokens, stats=None):
    return bench.Run(method, prompt, 0, seconds, ttft, tokens, stats=stats)


def test_predicted_speedup_is_the_generalised_model():
    got = walltime.predicted_speedup(0.8, 4, ar_ms_per_token=100, draft_ms_per_token=5, forward_ms_1=90,
                                  forward_ms_verify=150)
    assert got == pytest.approx(theory.expected_tokens(0.8, 4) * 100 / (4 * 5 + 150 + 10))
    # with the iterations' proposal lengths: all equal to gamma gives the same; a 0 is one plain decoding step
    verify = [90, 100, 110, 130, 150]
    same = walltime.predicted_speedup(0.8, 4, ar_ms_per_token=100, draft_ms_per_token=5, forward_ms_1=90,
                                   forward_ms_verify=verify, lengths=[4, 4, 4])
    assert same == pytest.approx(got)
    mixed = walltime.predicted_speedup(0.8, 4, ar_ms_per_token=100, draft_ms_per_token=5, forward_ms_1=90,
                                    forward_ms_verify=verify, lengths=[4, 0])
    tokens, ms = theory.expected_tokens(0.8, 4) + 1, (4 * 5 + 150 + 10) + (90 + 10)
    assert mixed == pytest.approx(tokens * 100 / ms)


def test_prediction_in_decode_steps_scales_the_verification_by_the_run_step():
    got = walltime.predicted_speedup_in_steps(0.8, 2, ar_ms_per_token=50, draft_ms_per_token=5,
                                           verify_steps=[1.0, 1.1, 1.2], lengths=[2, 0])
    tokens, ms = theory.expected_tokens(0.8, 2) + 1, (2 * 5 + 1.2 * 50) + 50
    assert got == pytest.approx(tokens * 50 / ms)


def _stats(proposed, accepted, iteration, draft, target):
    from specrepro.generate import GenerationStats

    return GenerationStats(prompt_len=4, new_tokens=sum(n + 1 for n in accepted), proposed=proposed,
                           accepted=accepted, iteration_seconds=iteration, draft_seconds=draft,
                           target_seconds=target)


def test_iteration_costs_skip_the_prefill_and_split_by_proposal_length():
    ar = _stats([], [], [9.0, 0.10, 0.12], [0.0] * 3, [8.9, 0.09, 0.11])
    sp = _stats([3, 3, 0, 2], [0, 3, 0, 1], [9.0, 0.14, 0.11, 0.13],
                [0.5, 0.006, 0.001, 0.004], [8.0, 0.13, 0.10, 0.12])
    costs = walltime.iteration_costs([_run("autoregressive", 0, 9.22, 9.0, 3, ar),
                                      _run("speculative", 0, 9.38, 9.0, 8, sp)])
    assert costs.step_ms == pytest.approx(110)
    assert costs.draft_ms == pytest.approx(11 / 5)  # 11 ms of draft work for 5 proposed tokens
    assert costs.verify_ms == pytest.approx({0: 100, 2: 120, 3: 130})
    assert costs.iterations == {0: 1, 2: 1, 3: 1}
    assert costs.overhead_ms == pytest.approx((4 + 9 + 6) / 3)
    assert costs.verify_steps[3] == pytest.approx(130 / 110)
    with pytest.raises(ValueError, match="autoregressive and speculative"):
        walltime.iteration_costs([_run("speculative", 0, 9.38, 9.0, 8, sp)])


def test_in_run_prediction_is_exact_when_acceptance_is_what_alpha_says():
    # alpha = 1 (every draft accepted): Eq. 1 holds exactly, so with costs timed in the run the model must give
    # back the speedup measured from the same times
    step, it = 0.1, 0.16  # a decode step; an iteration of gamma = 3 that yields 4 tokens
    ar = _stats([], [], [1.0] + [step] * 12, [0.0] * 13, [0.9] + [0.09] * 12)
    sp = _stats([3] * 4, [3] * 4, [1.0] + [it] * 3, [0.1] + [0.03] * 3, [0.85] + [0.12] * 3)
    runs = [_run("autoregressive", 0, 1.0 + 12 * step, 1.0, 13, ar), _run("speculative", 0, 1.0 + 3 * it, 1.0, 16, sp)]
    measured = (12 * step / 12) / (3 * it / 12)  # pooled decode time per token, autoregressive / speculative
    assert walltime.predicted_speedup_in_run(runs) == pytest.approx(measured)


def test_costs_from_real_runs_add_up():
    import torch

    from specrepro.tiny import tiny_pair

    target, draft = tiny_pair(16, dtype=torch.float64)
    runs = bench.run_bench(target, draft, [torch.tensor([[1, 2, 3]])], gamma=2, max_new_tokens=12, warmup=False,
                           methods=("autoregressive", "speculative"))
    costs = walltime.iteration_costs(runs)
    assert costs.step_ms > 0 and costs.draft_ms > 0 and costs.overhead_ms >= 0
    assert set(costs.verify_ms) == set(costs.iterations) and all(v > 0 for v in costs.verify_ms.values())
    spec = next(r for r in runs if r.method == "speculative").stats
    # the parts account for the iterations' time exactly
    total = sum(spec.iteration_seconds[1:]) * 1e3
    parts = (costs.draft_ms * sum(spec.proposed[1:]) + sum(costs.verify_ms[g] * k for g, k in costs.iterations.items())
             + costs.overhead_ms * sum(costs.iterations.values()))
    assert parts == pytest.approx(total)
    # bounds that hold for any timing, however loaded the machine: 1 to gamma + 1 = 3 tokens per iteration, each
    # iteration costing between its verification and its whole time
    longest = max(g * costs.draft_ms + v + costs.overhead_ms for g, v in costs.verify_ms.items())
    lo, hi = costs.step_ms / longest, 3 * costs.step_ms / min(costs.verify_ms.values())
    assert lo * (1 - 1e-9) <= walltime.predicted_speedup_in_run(runs) <= hi * (1 + 1e-9)


def test_iteration_costs_means_weight_each_proposal_length_by_its_iterations():
    costs = walltime.IterationCosts(step_ms=100.0, draft_ms=10.0, verify_ms={1: 120.0, 3: 160.0}, overhead_ms=4.0,
                                    iterations={1: 1, 3: 3})
    assert costs.mean_proposed == 2.5  # (1 + 3 * 3) / 4
    assert costs.mean_verify_ms == 150.0  # (120 + 3 * 160) / 4
    assert costs.iteration_ms == 179.0  # 2.5 * 10 + 150 + 4


def test_decode_ms_per_token_leaves_out_the_prefill(monkeypatch):
    import time

    import torch

    from specrepro.generate import autoregressive_generate
    from specrepro.tiny import tiny_pair

    target, draft = tiny_pair(16, seed=0, dtype=torch.float32)
    # a prompt of several tokens takes 1000 s on the clock the loops time with, a decode step nothing extra: a jump
    # of the clock, not a sleep, so that no load on the machine can bring a decode step near a counted prefill
    prefills, real_clock = [], time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + 1000.0 * len(prefills))

    def slow_prefill(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 1:
            prefills.append(ids.shape[1])

    handle = target.register_forward_pre_hook(slow_prefill, with_kwargs=True)
    try:
        ms = walltime.decode_ms_per_token({"target": target, "draft": draft}, torch.tensor([[1, 2, 3, 4]]), n=8,
                                          repeats=1)
        # the loops' first iteration sees the jump: the prefill would have been counted, had it not been left out
        assert autoregressive_generate(target, torch.tensor([[1, 2, 3]]), max_new_tokens=2,
                                       temperature=0).stats.iteration_seconds[0] >= 1000
    finally:
        handle.remove()
    assert set(ms) == {"target", "draft"}
    assert ms["target"] < 1000  # with the prefill counted it would be >= 1000 s / 7 per token, 143,000 ms
    with pytest.raises(ValueError, match="n must be >= 2"):
        walltime.decode_ms_per_token({"draft": draft}, torch.tensor([[1, 2]]), n=1)


@pytest.mark.parametrize("padded", [True, False])
def test_verify_ms_times_the_static_cache_forwards(padded):
    target, _ = tiny_pair(16, dtype=torch.float32)
    ms = walltime.verify_ms(target, 12, 3, compile="eager", padded=padded, repeats=2)
    assert len(ms) == 4 and all(t > 0 for t in ms)


def _costs(*, step=34.0, draft=3.2, verify_steps=1.72, gamma=4, overhead=0.5, iterations=100):
    return walltime.IterationCosts(step_ms=step, draft_ms=draft, verify_ms={gamma: verify_steps * step},
                                   overhead_ms=overhead, iterations={gamma: iterations})


def test_model_speedup_is_thm_3_8_under_the_papers_costs():
    # verification at one step, no overhead, every iteration proposing gamma: Leviathan's closed form
    costs = _costs(draft=0.05 * 34.0, verify_steps=1.0, overhead=0.0, gamma=3)
    assert walltime.model_speedup(costs, 0.7) == pytest.approx(theory.walltime_improvement(0.7, 3, 0.05))


def test_alpha_for_speedup_inverts_the_model_and_says_when_no_alpha_reaches_it():
    costs = _costs()
    need = walltime.alpha_for_speedup(costs, 1.2)
    assert 0 < need < 1 and walltime.model_speedup(costs, need) == pytest.approx(1.2, abs=1e-4)
    assert walltime.model_speedup(costs, need - 1e-3) < 1.2
    # at alpha = 1 an iteration yields 5 tokens for 4 x 3.2 + 1.72 x 34 + 0.5 ms: 2.37x at most
    assert walltime.alpha_for_speedup(costs, 2.5) is None
    # a verification cheaper than a step wins even when nothing is accepted
    assert walltime.alpha_for_speedup(_costs(draft=0.0, verify_steps=0.5, overhead=0.0), 1.5) == 0.0


def test_what_stops_changes_one_factor_at_a_time_and_its_verdicts_follow_the_data():
    rows = {r["change"]: r for r in walltime.what_stops(_costs(), 0.32, goal_speedup=1.6, goal_alpha=0.6)}
    measured = rows["as measured"]
    assert measured["c"] == pytest.approx(3.2 / 34) and measured["verify_steps"] == pytest.approx(1.72)
    assert measured["speedup"] == pytest.approx(walltime.model_speedup(_costs(), 0.32)) and not measured["meets_goal"]
    assert rows["a free draft (c = 0)"]["c"] == 0 and rows["verification at one decode step"]["verify_steps"] == 1
    assert rows["no loop overhead"]["overhead_steps"] == 0 < measured["overhead_steps"]
    # Thm 3.8's costs give Thm 3.8's closed form
    assert rows["all three costs as Thm 3.8 has them"]["speedup"] == pytest.approx(
        theory.walltime_improvement(0.32, 4, 0.0))
    # these costs: neither the goal's alpha alone nor any one cost alone reaches 1.6x; the goal's alpha at Thm 3.8's
    # costs does
    assert [r["meets_goal"] for r in rows.values()] == [False] * 6 + [True]
    assert all(r["meets_goal"] == (r["alpha_needed"] <= r["alpha"]) for r in rows.values())
    assert measured["alpha_needed"] > 0.6 and rows["Thm 3.8's costs and alpha 0.6"]["alpha_needed"] < 0.6
    assert math.isnan(walltime.what_stops(_costs(), 0.32, goal_speedup=3.0, goal_alpha=0.6)[0]["alpha_needed"])
    # contrary data: a cheap draft that accepts well under the paper's costs meets the goal as measured
    ideal = walltime.what_stops(_costs(draft=1.0, verify_steps=1.0, overhead=0.0), 0.8, goal_speedup=1.6,
                                goal_alpha=0.6)
    assert ideal[0]["meets_goal"] and ideal[0]["alpha_needed"] < 0.8
    with pytest.raises(ValueError, match="goal_alpha must be in"):
        walltime.what_stops(_costs(), 0.32, goal_speedup=1.6, goal_alpha=1.2)


def test_what_stops_measures_against_the_baseline_given_and_sets_every_verification_to_one_step():
    # a draft proposing 0 (a plain step, 30 ms here) or 3 tokens; the baseline is another method's 25 ms step
    costs = walltime.IterationCosts(step_ms=30.0, draft_ms=0.0, verify_ms={0: 30.0, 3: 45.0}, overhead_ms=0.0,
                                    iterations={0: 50, 3: 50})
    rows = {r["change"]: r for r in walltime.what_stops(costs, 0.5, goal_speedup=1.2, goal_alpha=0.6,
                                                        baseline_ms=25.0)}
    as_measured = rows["as measured"]
    # 50 x 1 + 50 x expected_tokens(0.5, 3) tokens in 50 x 30 + 50 x 45 ms, against 25 ms per token
    assert as_measured["speedup"] == pytest.approx((50 + 50 * 1.875) * 25 / (50 * 30 + 50 * 45))
    assert as_measured["verify_steps"] == pytest.approx(45 / 25)
    one = rows["verification at one decode step"]  # both lengths at the baseline's 25 ms
    assert one["speedup"] == pytest.approx((50 + 50 * 1.875) / 100)


def test_step_profile_times_and_profiles_one_static_cache_forward():
    target, _ = tiny_pair(32, seed=3)
    out = walltime.step_profile(target, 12, tokens=3, compile="eager", repeats=3, top=50)
    assert out["ms"] > 0 and sum(r["share"] for r in out["rows"]) == pytest.approx(1.0)
    ops = {r["op"] for r in out["rows"]}
    assert "aten::addmm" in ops or "aten::mm" in ops or "aten::linear" in ops  # the linear layers ran
    with pytest.raises(ValueError, match="profiles the static-cache path"):
        walltime.step_profile(target, 12, compile=False)
    with pytest.raises(ValueError, match="context and tokens must be >= 1"):
        walltime.step_profile(target, 0, compile="eager")


def test_race_modes_times_each_mode_each_round_and_the_fastest_wins():
    target, _ = tiny_pair(16, dtype=torch.float32)
    rows = walltime.race_modes(target, 12, ["dynamo", "eager"], rounds=2, repeats=1)
    assert [(r["mode"], r["round"]) for r in rows] == [("dynamo", 0), ("eager", 0), ("dynamo", 1), ("eager", 1)]
    assert all(r["ms"] > 0 and r["error"] is None for r in rows)
    fake = [dict(mode="a", round=i, ms=ms, error=None) for i, ms in enumerate([3.0, 2.0, 9.0])] + [
        dict(mode="b", round=i, ms=ms, error=None) for i, ms in enumerate([2.5, 2.6, 2.4])]
    assert walltime.fastest_mode(fake) == "b"  # the median, not the single best round
    assert walltime.mode_medians(fake) == {"a": 3.0, "b": 2.5}
    fake[4] = dict(mode="b", round=1, ms=None, error="RuntimeError: boom")
    assert walltime.fastest_mode(fake) == "a"  # a mode that failed in any round is out
    assert walltime.mode_medians(fake) == {"a": 3.0, "b": None}
    with pytest.raises(RuntimeError, match="no compile mode.*boom"):
        walltime.fastest_mode([fake[4]])
    with pytest.raises(ValueError, match="non-empty list"):
        walltime.race_modes(target, 12, ["max-autotune", "fastest-please"])
    with pytest.raises(ValueError, match="non-empty list"):
        walltime.race_modes(target, 12, [])


def test_race_modes_counts_a_fallback_to_eager_as_a_failure(monkeypatch):
    import specrepro.compiled as compiled

    own, own_verify = compiled.compiled_forward, walltime.verify_ms

    def broken(mode, features=False):  # "dynamo" fails to compile: the path falls back to eager, with its warning
        if mode != "dynamo":
            return own(mode, features)

        def fail(*args, **kwargs):
            raise RuntimeError("inductor exploded")
        return fail

    monkeypatch.setattr(compiled, "compiled_forward", broken)
    target, _ = tiny_pair(16, dtype=torch.float32)
    calls = []
    monkeypatch.setattr(walltime, "verify_ms", lambda *a, compile, **k: calls.append(compile.mode) or own_verify(
        *a, compile=compile, **k))
    rows = walltime.race_modes(target, 12, ["dynamo", "eager"], rounds=2, repeats=1)
    failed = {r["mode"]: r["error"] for r in rows if r["round"] == 0}
    assert failed["eager"] is None and "torch.compile failed" in failed["dynamo"] and "inductor exploded" in failed[
        "dynamo"]
    assert calls == ["dynamo", "eager", "eager"]  # a failed mode is not compiled again
    assert [r["error"] for r in rows if r["round"] == 1] == ["failed in an earlier round", None]
    assert walltime.fastest_mode(rows) == "eager"


def test_step_timer_times_decode_steps_on_one_cache_each_call():
    target, _ = tiny_pair(64, dtype=torch.float32)
    for compile in (False, "dynamo"):
        steps = walltime.step_timer(target, 12, compile=compile, repeats=3)
        assert steps() > 0 and steps() > 0
    steps = walltime.step_timer(target, 12, compile="dynamo", repeats=2)
    steps()  # the cache is filled once: a call leaves it where it found it
    assert steps.cache.fed == [12] and steps.cache.slots == 12


@pytest.mark.skipif(not gemv.has_compiler(), reason="no C++ compiler here: the few-row kernels cannot be built")
def test_the_ab_times_both_steps_beside_reads(capsys):
    import argparse

    target, _ = tiny_pair(64, dtype=torch.float32)
    other, _ = tiny_pair(64, dtype=torch.float32)
    use_kernel(target, "few_rows")
    walltime._beside_read(target, other, argparse.Namespace(kernel="few_rows", mode="dynamo", context=12,
                                                            beside_read=2, versus="sdpa-attention"))
    out = capsys.readouterr().out
    assert "attention: own: step" in out and "attention: sdpa: step" in out
    assert "attention: own over attention: sdpa, paired by round" in out and "compiled and warmed up in" in out
    assert other.config._attn_implementation == compiled.GQA_ATTENTION
    other, _ = tiny_pair(64, dtype=torch.float32)  # a mode against another
    walltime._beside_read(target, other, argparse.Namespace(kernel="few_rows", mode="dynamo", context=12,
                                                            beside_read=2, versus="eager"))
    assert "mode: dynamo over mode: eager, paired by round" in capsys.readouterr().out
    assert other.config._attn_implementation == "sdpa"


def test_the_ab_refuses_a_mode_against_itself():
    with pytest.raises(SystemExit):  # before any model is loaded
        walltime.main(["--beside-read", "2", "--mode", "default", "--versus", "default"])
