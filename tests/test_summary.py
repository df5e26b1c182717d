"""The summary beside the papers: claims.json is well formed, every claim row is built from the committed outputs,
and a notebook that has not run says so instead of inventing a number."""

import json

import pandas as pd
import pytest

from specrepro import paths, summary, verdicts


def test_claims_name_their_paper_and_where_they_were_reported():
    c = summary.claims()
    ids = [x["id"] for x in c["claims"]]
    assert len(ids) == len(set(ids))
    for x in c["claims"]:
        assert x["paper"] in c["papers"] and x["where"] and x["says"]
    assert set(summary.ROWS) <= set(ids)
    v = {x["id"]: x["value"] for x in c["claims"]}
    # Chen et al.'s Table 1 as quoted: HumanEval's speedup is the ratio of its times; XSum's is not (1.875 vs 1.92),
    # and claims.json says so in a note beside the value
    assert v["table1_ms_ar"] / v["table1_humaneval_ms_sps"] == pytest.approx(v["table1_humaneval_speedup"], abs=0.01)
    xsum = next(x for x in c["claims"] if x["id"] == "table1_xsum_speedup")
    assert abs(v["table1_ms_ar"] / v["table1_xsum_ms_sps"] - v["table1_xsum_speedup"]) < 0.01 or "1.875" in xsum["note"]


def test_every_claim_row_is_built_from_the_committed_outputs():
    res = summary.results(paths.OUTPUTS)
    table = summary.summary_table(res)
    assert list(table.claim) == list(summary.ROWS)
    ran = table[table.ours != "not run"]
    assert len(ran) >= 7 and ran.verdict.str.len().min() > 5
    t1 = summary.table1_beside_chen(res)
    assert (t1[t1.source.str.startswith("Chen")].speedup.max()) == pytest.approx(2.46)
    assert (t1.speedup > 0).all()


def test_a_notebook_that_has_not_run_is_reported_as_such(tmp_path):
    folder = tmp_path / "01-distribution"
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps({"p_values": {"a": 0.5, "b": 0.2}, "min_p_value": 0.2,
                                                     "n_samples": 100, "false_alarm": 0.001,
                                                     "weakest_power": {"power": 0.95}}))
    table = summary.summary_table(summary.results(tmp_path)).set_index("claim")
    assert table.loc["distribution", "verdict"] == "reproduces"
    assert "2 chi-squared tests" in table.loc["distribution", "ours"]
    assert table.loc["concurrency", "ours"] == "not run"
    assert "has not run" in table.loc["batch_equivalence", "verdict"]
    assert summary.table1_beside_chen({}).source.str.startswith("Chen").all()  # theirs alone


def test_the_distribution_row_fails_when_the_real_pair_rejects(tmp_path):
    folder = tmp_path / "01-distribution"
    folder.mkdir()
    real = dict(drafts=["prompt-lookup"], n_tokens=3, prompts=["a", "b", "c"], n_samples=3000, tests=6,
                min_p_value=0.3, outside_support=0, detectable_tv=[0.03, 0.05], bug_rejected=3, bug_tests=3)
    metrics = {"p_values": {"a": 0.5}, "min_p_value": 0.5, "n_samples": 100, "false_alarm": 0.001,
               "weakest_power": {"power": 0.95}, "real_pair": real}
    for change, verdict in (({}, "reproduces"), ({"min_p_value": 1e-5}, "does not reproduce: a test on the real "
                                                  "pair rejected"), ({"outside_support": 2}, "does not reproduce")):
        (folder / "metrics.json").write_text(json.dumps(metrics | {"real_pair": real | change}))
        row = summary.summary_table(summary.results(tmp_path)).set_index("claim").loc["distribution"]
        assert row.verdict.startswith(verdict) and "6 tests" in row.ours and "0.03-0.05" in row.ours
    real |= dict(zhang_tv=0.05, power_at_zhang_tv=[0.93, 1.0], small_batch=dict(
        batch_rows=8, draft="feature-1-s8", n_samples=2000, tests=3, min_p_value=0.2))
    (folder / "metrics.json").write_text(json.dumps(metrics | {"real_pair": real}))
    row = summary.summary_table(summary.results(tmp_path)).set_index("claim").loc["distribution"]
    assert "power 0.93-1.00 against 0.05 (the most a bug in 5% of rows" in row.ours
    assert "at batch 8 (feature-1-s8, 2,000" in row.ours and row.verdict == "reproduces"
    # what the small batch can see, from its detectable error against 0.05: too small, partly, and enough
    bug = "the error of 0.05 that a bug in 5% of rows could make"
    for tv, words in (([0.0612, 0.076], f"0.061-0.076, above {bug}: underpowered"),
                      ([0.04, 0.06], f"above {bug} on some prompts"),
                      ([0.02, 0.03], f"enough to see {bug}")):
        small = real["small_batch"] | {"detectable_tv": tv}
        (folder / "metrics.json").write_text(json.dumps(metrics | {"real_pair": real | {"small_batch": small,
                                                                                        "batch_rows": 1000}}))
        row = summary.summary_table(summary.results(tmp_path)).set_index("claim").loc["distribution"]
        assert words in row.ours and "in ragged batches of 1,000 rows" in row.ours
        assert row.ours.index("planted bug rejected in 3 of 3 prompts (batches of 1,000 rows)") < row.ours.index(
            "at batch 8")
    no_zhang = {k: v for k, v in real.items() if k not in ("zhang_tv", "power_at_zhang_tv")}
    (folder / "metrics.json").write_text(json.dumps(metrics | {"real_pair": no_zhang | {"small_batch": small}}))
    row = summary.summary_table(summary.results(tmp_path)).set_index("claim").loc["distribution"]
    assert "detectable error 0.020-0.030" in row.ours and "a bug in" not in row.ours  # nothing to compare with
    (folder / "metrics.json").write_text(json.dumps(metrics | {"real_pair": real | {"min_p_value": 0.00095}}))
    row = summary.summary_table(summary.results(tmp_path)).set_index("claim").loc["distribution"]
    assert "smallest p-value 0.00095 over 6 tests" in row.ours  # beside a level of 0.001, never "0.00"
    real["small_batch"]["min_p_value"] = 1e-5  # the batch-8 run rejects: so does the row
    (folder / "metrics.json").write_text(json.dumps(metrics | {"real_pair": real}))
    row = summary.summary_table(summary.results(tmp_path)).set_index("claim").loc["distribution"]
    assert row.verdict == "does not reproduce: a test on the real pair rejected"


def test_the_distribution_row_counts_a_rejection_only_when_its_redraw_confirms_it(tmp_path):
    folder = tmp_path / "01-distribution"
    folder.mkdir()
    small = dict(batch_rows=8, draft="feature-1-s8", n_samples=2000, tests=3, min_p_value=0.2, rejected_first=0,
                 confirmed=0)
    real = dict(drafts=["prompt-lookup"], n_tokens=3, prompts=["a", "b", "c"], n_samples=3000, tests=6,
                min_p_value=0.00095, outside_support=0, detectable_tv=[0.03, 0.05], bug_rejected=3, bug_tests=3,
                confirm_draws=1, rejected_first=1, confirmed=0, redrawn={"prompt-lookup T0.8 a": [0.00095, 0.24]},
                small_batch=small)
    metrics = {"p_values": {"a": 0.5}, "min_p_value": 0.5, "n_samples": 100, "false_alarm": 0.001,
               "weakest_power": {"power": 0.95}, "confirm_draws": 1, "rejected_first": 0, "confirmed": 0}

    def row(m):
        (folder / "metrics.json").write_text(json.dumps(m))
        return summary.summary_table(summary.results(tmp_path)).set_index("claim").loc["distribution"]

    got = row(metrics | {"real_pair": real})  # 01's rejection at f59ffa8, cleared by its redraw
    assert got.verdict == "reproduces"
    assert "1 of its tests (any batch) rejected and were drawn again with fresh seeds, p then redrawn: 0.00095 then " \
           "0.24; 0 confirmed" in got.ours
    contrary = real | {"confirmed": 1, "redrawn": {"prompt-lookup T0.8 a": [0.00095, 0.0002]}}
    assert row(metrics | {"real_pair": contrary}).verdict == ("does not reproduce: a test on the real pair "
                                                              "rejected, confirmed on fresh draws")
    outside = row(metrics | {"real_pair": real | {"outside_support": 2}})  # never cleared by a redraw
    assert outside.verdict == "does not reproduce: 2 samples fell outside the target's support"
    tiny_outside = row(metrics | {"outside_support": 1, "real_pair": real}).verdict
    assert tiny_outside == "does not reproduce: 1 sample fell outside the target's support"
    assert row(metrics | {"real_pair": real | {"small_batch": small | {"confirmed": 1}}}).verdict.startswith(
        "does not reproduce")  # the batch-8 run's confirmed rejection counts too
    tiny = metrics | {"min_p_value": 0.0004, "rejected_first": 1, "redrawn": {"T1 gamma=2": [0.0004, 0.5]},
                      "real_pair": real}
    got = row(tiny)
    assert got.verdict == "reproduces" and "1 rejected, p then redrawn: 0.0004 then 0.50; 0 confirmed" in got.ours
    assert row(tiny | {"confirmed": 1}).verdict == "does not reproduce: a test rejected, confirmed on fresh draws"
    weakest = row(tiny | {"weakest_power": {"power": 0.9}}).ours
    assert "power 0.90 (no interval) for one test (0.81 with its confirmation)" in weakest


def test_draft_size_reads_the_ladder_sweep_when_it_ran(tmp_path):
    import pandas as pd

    folder = tmp_path / "06-draft-sweep"
    folder.mkdir()
    rows = [dict(task="code", temperature=0.0, draft=d, alpha=a, speedup=s, speedup_lo=s - 0.05, speedup_hi=s + 0.05)
            for d, a, s in (("lens-1", 0.2, 0.9), ("lens-2", 0.3, 0.8), ("prompt-lookup", 0.5, 1.3))]
    pd.DataFrame(rows).to_csv(folder / "table2.csv", index=False)
    verdict = dict(winner="lens-1", winner_speedup=0.9, winner_lo=0.85, winner_hi=0.95, runner_up="lens-2",
                   intervals_overlap=False, smallest_wins=True, alpha_rises_with_size=True,
                   overall_best="prompt-lookup")
    (folder / "metrics.json").write_text(json.dumps({"verdicts": {"code_T0": verdict}, "n_prompts": 12}))
    res = summary.results(tmp_path)
    res["03-latency"] = {}  # 06 answers the claim; 03's family sweep is not read
    ours, verdict_text, notebook = summary.ROWS["draft_size"][1](res)
    assert notebook == "06-draft-sweep" and verdict_text == (
        "reproduces: alpha rises from lens-1 to lens-2 in every setting; the smallest draft wins in 1 of 1, and the "
        "winner is reliably faster than the runner-up in 1 of 1; the measurement's best is reliably faster than "
        "autoregressive decoding in 0 of 1")
    assert "lens-1 0.90x [0.85, 0.95]" in ours and "0.20/0.30" in ours and "lens-1/lens-2" in ours
    res["06-draft-sweep"]["metrics"] |= dict(prediction_within_10pct="1/2", prediction_median_abs_error=0.12)
    assert summary.ROWS["draft_size"][1](res)[0].endswith("within 10% for 1/2 ladder rows (median |error| 12.0%)")
    # the paired test decides where the folder has it: here the winner is not reliably faster than the runner-up
    res["06-draft-sweep"]["metrics"]["verdicts"]["code_T0"] |= dict(paired_ratio=1.06, paired_lo=0.98, paired_hi=1.15)
    ours, verdict_text, _ = summary.ROWS["draft_size"][1](res)
    assert "runner-up lens-2 (lens-1/lens-2 1.06x [0.98, 1.15], paired)" in ours
    assert verdict_text.startswith("partly: alpha rises from lens-1 to lens-2 in every setting; the smallest draft "
                                   "wins in 1 of 1, and the winner is reliably faster than the runner-up in 0 of 1")
    # one sweep prompt: JSON holds null for the bounds (no interval); read as "no interval", never as reliable
    one = dict(res["06-draft-sweep"]["metrics"]["verdicts"]["code_T0"], winner_lo=None, winner_hi=None,
               paired_lo=None, paired_hi=None)
    res_one = res | {"06-draft-sweep": res["06-draft-sweep"] | {"metrics": {"verdicts": {"code_T0": one},
                                                                           "n_prompts": 1}}}
    ours, verdict_text, _ = summary.ROWS["draft_size"][1](res_one)
    assert "lens-1 0.90x (no interval)" in ours and "lens-1/lens-2 1.06x (no interval), paired" in ours
    assert "reliably faster than the runner-up in 0 of 1" in verdict_text
    assert "reliably faster than autoregressive decoding in 0 of 1" in verdict_text
    # the feature draft's own size question (06's feature family) is read beside the ladder's, its label as given
    fam = dict(winner="feature-2", winner_speedup=1.1, winner_lo=1.0, winner_hi=1.2, runner_up="feature-1",
               paired_ratio=0.97, paired_lo=0.93, paired_hi=1.01)
    for label in ("does not reproduce", "reproduces"):
        res["06-draft-sweep"]["metrics"] |= dict(feature_family=["feature-1", "feature-2"],
                                                 feature_verdicts={"code_T0": fam},
                                                 feature_draft_size=dict(label=label, reason="..."))
        assert summary.ROWS["draft_size"][1](res)[0].endswith(
            "The feature draft at 2 sizes (feature-1/feature-2), the same question: code T0: feature-2 1.10x [1.00, "
            f"1.20], runner-up feature-1 (feature-2/feature-1 0.97x [0.93, 1.01], paired); {label}")
    res["06-draft-sweep"]["metrics"]["verdicts"]["code_T0"] |= dict(smallest_wins=False, winner="lens-2")
    assert summary.ROWS["draft_size"][1](res)[1].startswith("does not reproduce: alpha rises from lens-1 to lens-2")
    res["06-draft-sweep"]["table2"].loc[1, "alpha"] = 0.1  # the larger draft agrees less: size buys no accuracy
    assert summary.ROWS["draft_size"][1](res)[1].startswith("not testable")


def test_draft_size_from_03_alone_is_a_verdict_label_either_way():
    """Without 06's ladder, 03's draft family cannot answer the question: the row says why, under a verdict label,
    whether alpha rises with size there or not."""
    family = pd.DataFrame(dict(draft=["draft-s", "draft-m", "draft-l"], alpha=[0.3, 0.4, 0.5],
                               measured_speedup=[1.1, 1.0, 0.9], speedup_lo=[1.0, 0.9, 0.8],
                               speedup_hi=[1.2, 1.1, 1.0], c=[0.1, 0.2, 0.3]))
    ours, text, source = summary._draft_size({"draft_family": family})
    assert source == "03-latency" and ours.startswith("best draft draft-s 1.10x [1.00, 1.20]")
    assert text.startswith("not testable: alpha rises with size in 03, but the ladder") and "06-draft-sweep" in text
    family.loc[2, "alpha"] = 0.2  # the largest agrees least
    _, text, _ = summary._draft_size({"draft_family": family})
    assert text == "not testable: alpha does not rise with size with these drafts, so size buys only cost"
    assert text.split(":")[0] in verdicts.LABELS


def test_table1_verdict_follows_the_draft_and_the_numbers(tmp_path):
    import pandas as pd

    folder = tmp_path / "03-latency"
    folder.mkdir()

    def write(draft, lo):
        rows = [dict(task=t, decoding=d, method=m, kernels="fastest", speedup=1.0 if m == "autoregressive" else 1.4,
                     speedup_lo=1.0 if m == "autoregressive" else lo, speedup_hi=1.0 if m == "autoregressive" else 1.6,
                     n_prompts=24, quality_metric="q", quality=0.1, quality_lo=0.05, quality_hi=0.15,
                     ms_per_token=30.0)
                for t in ("code", "text") for d in ("greedy", "nucleus") for m in ("autoregressive", "speculative")]
        pd.DataFrame(rows).to_csv(folder / "table1.csv", index=False)
        (folder / "parameters.json").write_text(json.dumps({"draft_name": draft, "gamma": 4}))
        (folder / "metrics.json").write_text("{}")
        return summary._table1(summary.results(tmp_path)["03-latency"], None)

    ours, verdict, _ = write("prompt-lookup", 1.2)  # a lookup draft: no like-for-like row, whatever its speed
    assert verdict.startswith("not tested like for like") and "4 of 4 reliably faster" in verdict
    assert "code nucleus (prompt-lookup, gamma 4, 24 prompts) 1.40x [1.20, 1.60]" in ours
    assert write("draft-m", 1.2)[1].startswith("in direction only: like for like (sampled, trained draft), 2 of 2")
    assert write("draft-m", 0.9)[1].startswith("does not reproduce: like for like (sampled, trained draft), 0 of 2")
    t1 = summary.table1_beside_chen(summary.results(tmp_path))
    assert t1.like_for_like.iloc[0] and set(t1[t1.like_for_like].decoding) == {"nucleus"}
    assert {"XSum", "HumanEval"} <= set(t1.task) and (t1.decoding == "greedy").any()


def test_the_like_for_like_rows_of_03_decide_the_table1_verdict(tmp_path):
    import pandas as pd

    folder = tmp_path / "03-latency"
    folder.mkdir()
    rows = [dict(task="code", decoding=d, method=m, kernels="fastest", speedup=1.0 if m == "autoregressive" else 1.5,
                 speedup_lo=1.0 if m == "autoregressive" else 1.3, speedup_hi=1.0 if m == "autoregressive" else 1.7,
                 n_prompts=24, quality_metric="q", quality=0.1, quality_lo=0.05, quality_hi=0.15, ms_per_token=30.0)
            for d in ("greedy", "nucleus") for m in ("autoregressive", "speculative")]
    pd.DataFrame(rows).to_csv(folder / "table1.csv", index=False)
    (folder / "parameters.json").write_text(json.dumps({"draft_name": "prompt-lookup", "gamma": 3}))
    (folder / "metrics.json").write_text("{}")

    def lfl(lo, hi):  # the estimate in the middle of its interval
        pd.DataFrame([dict(task="code", decoding="nucleus", draft="feature-1", trained=True, gamma=4,
                           chosen="Chen et al.'s K", method=m, kernel_used="stock", ms_per_token=30.0,
                           speedup=1.0 if m == "autoregressive" else (lo + hi) / 2,
                           speedup_lo=1.0 if m == "autoregressive" else lo,
                           speedup_hi=1.0 if m == "autoregressive" else hi, n_prompts=24, alpha=0.3)
                      for m in ("autoregressive", "speculative")]).to_csv(folder / "like_for_like.csv", index=False)
        return summary._table1(summary.results(tmp_path)["03-latency"], None)

    ours, verdict, _ = lfl(0.7, 0.85)  # the lookup rows are fast; the trained draft is not: the headline says so
    assert verdict.startswith("does not reproduce: like for like (sampled, trained draft), 0 of 1")
    assert "feature-1, Chen et al.'s K, gamma 4, 24 prompts) 0.77x [0.70, 0.85]" in ours
    assert "2 of 2 reliably faster" in verdict
    assert lfl(2.2, 2.7)[1].startswith("reproduces")
    t1 = summary.table1_beside_chen(summary.results(tmp_path))
    ours_lfl = t1[t1.source.str.contains("section 1c")]
    assert ours_lfl.like_for_like.all() and len(ours_lfl) == 2


def test_the_regime_row_sets_ours_beside_llama_cpp_where_07_ran_it(tmp_path):
    for name, metrics in (("02-arithmetic-ops", {"decode_step": dict(measured_ms=60.0, memory_floor_ms=10.0,
                                                                      memory_share=0.17)}),
                          ("07-regime", {"decode_step_x_floor": {"eager": 6.0, "compiled few_rows": 2.5},
                                         "verify_steps": {"eager_4": 1.3, "compiled few_rows_4": 1.2},
                                         "llama_cpp": {"decode_ms": 20.0, "decode_x_floor": 2.0}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))
    regime_row = summary.ROWS["memory_bound"][1]  # (ours, verdict, notebooks) from the results
    ours, _, _ = regime_row(summary.results(tmp_path))
    assert "decode step 20.0 ms, 2.00x the floor; ours at its fastest 1.25x llama.cpp's" in ours
    assert regime_row(summary.results(tmp_path))[1] == "partly"  # 2.5x the probe's floor; verification free
    m = json.loads((tmp_path / "07-regime" / "metrics.json").read_text())
    m["read_floor"] = {"summary": {  # section 1c: the steps beside reads of their bytes decide
        "compiled few_rows": dict(x_read=1.25, x_read_lo=1.2, x_read_hi=1.3, rounds=7, ms=20.0, read_ms=16.0),
        "llama.cpp": dict(x_read=1.1, x_read_lo=1.05, x_read_hi=1.15, rounds=7, ms=18.0, read_ms=16.4)}}
    (tmp_path / "07-regime" / "metrics.json").write_text(json.dumps(m))
    ours, label, _ = regime_row(summary.results(tmp_path))
    assert label == "reproduces" and "1.25x [1.20, 1.30] a read of its bytes timed beside it" in ours
    assert "llama.cpp's step beside a read of its bytes 1.10x [1.05, 1.15] (7 rounds, 07)" in ours
    del m["read_floor"]
    (tmp_path / "07-regime" / "metrics.json").write_text(json.dumps(m))
    m = json.loads((tmp_path / "07-regime" / "metrics.json").read_text())
    m["llama_cpp"] = {"decode_ms": float("nan"), "decode_x_floor": None}  # llama.cpp could not run there
    (tmp_path / "07-regime" / "metrics.json").write_text(json.dumps(m))
    assert "llama.cpp" not in regime_row(summary.results(tmp_path))[0]
    (tmp_path / "02-arithmetic-ops" / "environment.json").write_text(json.dumps({"cpu": "CPU A"}))
    (tmp_path / "07-regime" / "environment.json").write_text(json.dumps({"cpu": "CPU B"}))
    ours = regime_row(summary.results(tmp_path))[0]  # two folders, two hosts: each number says where it was measured
    assert "(02, CPU A)" in ours and "(07, CPU B)" in ours
    assert "bfloat16" not in ours  # 07 ran no bfloat16 section there
    assert "llama.cpp's best" not in ours  # 07 ran no section 2e there
    m |= dict(speedup=1.1, speedup_lo=1.0, speedup_hi=1.2,
              llama_cpp_speculation={"speedup": {"ngram-simple": [1.3, 1.1, 1.5], "ngram-mod": [1.4, 1.2, 1.6]}})
    (tmp_path / "07-regime" / "metrics.json").write_text(json.dumps(m))
    ours = regime_row(summary.results(tmp_path))[0]
    assert ("llama.cpp's best (ngram-mod, of 2 modes) 1.40x [1.20, 1.60], ours 1.10x [1.00, 1.20] (07)") in ours
    m["bf16"] = dict(cpu_features=["avx512f", "amx_bf16"], step_x_floor={"eager": 4.4, "compiled": 2.0}, floor_ms=9.2,
                     speedup=1.65, speedup_lo=1.25, speedup_hi=2.35, vs_float32=2.0, vs_float32_lo=1.5,
                     vs_float32_hi=2.6, greedy_identical=18, greedy_prompts=24)
    (tmp_path / "07-regime" / "metrics.json").write_text(json.dumps(m))
    ours = regime_row(summary.results(tmp_path))[0]
    assert ("in bfloat16 (avx512f, amx_bf16): decode step eager 4.40x, compiled 2.00x its 9.2 ms floor, speculative "
            "1.65x [1.25, 2.35] over bfloat16 autoregressive and 2.00x [1.50, 2.60] over float32's fastest, greedy "
            "output as float32's on 18 of 24 prompts") in ours


def test_07s_sampled_trained_row_joins_the_like_for_like_rows(tmp_path):
    """07's section 2c (nucleus, a trained draft, every method at its fastest) is a like-for-like row of the
    Table-1 verdict: a slow one makes it "does not reproduce" however fast the greedy rows are; a fast one, not."""
    import pandas as pd

    (tmp_path / "03-latency").mkdir()
    pd.DataFrame([dict(task="code", decoding="greedy", method=m, kernels="fastest", speedup=1.0 if m == "autoregressive"
                       else 1.5, speedup_lo=1.0 if m == "autoregressive" else 1.3, speedup_hi=1.0 if m ==
                       "autoregressive" else 1.7, n_prompts=24, quality_metric="q", quality=0.1, quality_lo=0.05,
                       quality_hi=0.15, ms_per_token=30.0) for m in ("autoregressive", "speculative")]
                 ).to_csv(tmp_path / "03-latency" / "table1.csv", index=False)
    (tmp_path / "03-latency" / "parameters.json").write_text(json.dumps({"draft_name": "prompt-lookup", "gamma": 3}))
    (tmp_path / "03-latency" / "metrics.json").write_text("{}")
    (tmp_path / "07-regime").mkdir()
    (tmp_path / "07-regime" / "parameters.json").write_text(json.dumps({"draft_name": "prompt-lookup", "task": "code"}))

    def with_07(lo, hi):
        m = dict(speedup=1.3, speedup_lo=1.1, speedup_hi=1.5, n_prompts=12, draft_name="prompt-lookup",
                 sampled=dict(draft="feature-1", gamma=4, speedup=(lo + hi) / 2, speedup_lo=lo, speedup_hi=hi,
                              n_prompts=12))
        (tmp_path / "07-regime" / "metrics.json").write_text(json.dumps(m))
        res = summary.results(tmp_path)
        return summary._table1(res["03-latency"], res["07-regime"])

    ours, verdict, notebooks = with_07(0.5, 0.7)
    assert "code nucleus (feature-1, 07's fastest configuration, gamma 4, 12 prompts) 0.60x [0.50, 0.70]" in ours
    assert verdict.startswith("does not reproduce: like for like (sampled, trained draft), 0 of 1")
    assert notebooks == "03-latency, 07-regime"
    pd.DataFrame([dict(method="speculative", config="compiled", decode_ms_per_token=20.0, fastest=True)]
                 ).to_csv(tmp_path / "07-regime" / "speed.csv", index=False)
    pd.DataFrame([dict(method="speculative", config="stock", decode_ms_per_token=50.0)]
                 ).to_csv(tmp_path / "07-regime" / "sampled.csv", index=False)
    t1 = summary.table1_beside_chen(summary.results(tmp_path))  # the table beside Chen's shows the row too
    row = t1[t1.source.str.startswith("ours, 07 section 2c")].iloc[0]
    assert row.like_for_like and row.decoding == "nucleus" and row.ms_per_token == 50.0
    assert row.speedup == pytest.approx(0.6)
    assert with_07(2.3, 2.7)[1].startswith("reproduces")


def test_07s_bfloat16_sampled_rows_join_the_like_for_like_rows(tmp_path):
    """Section 2d's nucleus rows in bfloat16 (K and the model's gamma) are like-for-like rows too, labelled bfloat16:
    fast ones turn a slow float32 row's "does not reproduce" into "partly"; slow ones leave it."""
    (tmp_path / "03-latency").mkdir()
    pd.DataFrame([dict(task="code", decoding="greedy", method=m, kernels="fastest", speedup=1.0, speedup_lo=1.0,
                       speedup_hi=1.0, n_prompts=24, quality_metric="q", quality=0.1, quality_lo=0.05, quality_hi=0.15,
                       ms_per_token=30.0) for m in ("autoregressive", "speculative")]
                 ).to_csv(tmp_path / "03-latency" / "table1.csv", index=False)
    (tmp_path / "03-latency" / "parameters.json").write_text(json.dumps({"draft_name": "prompt-lookup", "gamma": 3}))
    (tmp_path / "03-latency" / "metrics.json").write_text("{}")
    (tmp_path / "07-regime").mkdir()
    (tmp_path / "07-regime" / "parameters.json").write_text(json.dumps({"task": "code"}))
    pd.DataFrame([dict(method="speculative", config="compiled", decode_ms_per_token=20.0, fastest=True)]
                 ).to_csv(tmp_path / "07-regime" / "speed.csv", index=False)

    def with_bf16(lo, hi):
        bf16 = [dict(draft="feature-1-s8", gamma=g, chosen_by=by, config="compiled", speedup=(lo + hi) / 2,
                     speedup_lo=lo, speedup_hi=hi, n_prompts=24) for g, by in ((4, "Chen et al.'s K"), (2, "model"))]
        m = dict(speedup=1.3, speedup_lo=1.1, speedup_hi=1.5, n_prompts=24, draft_name="prompt-lookup",
                 sampled=dict(draft="feature-1-s8", gamma=4, speedup=0.8, speedup_lo=0.7, speedup_hi=0.9, n_prompts=24),
                 bf16_sampled=bf16)
        (tmp_path / "07-regime" / "metrics.json").write_text(json.dumps(m))
        res = summary.results(tmp_path)
        return summary._table1(res["03-latency"], res["07-regime"]), summary.table1_beside_chen(res)

    (ours, verdict, _), t1 = with_bf16(1.2, 1.4)
    assert "code nucleus (feature-1-s8, 07 bfloat16 compiled (model), gamma 2, 24 prompts) 1.30x [1.20, 1.40]" in ours
    assert verdict.startswith("partly: like for like (sampled, trained draft), 2 of 3")
    rows = t1[t1.source.str.contains("in bfloat16")]
    assert len(rows) == 2 and rows.like_for_like.all() and (rows.decoding == "nucleus").all()
    assert (rows.over == "bfloat16 autoregressive").all()  # not over the float32 fastest: the table says so
    fastest = t1[t1.source.str.startswith("ours, 07 (")]
    assert len(fastest) == 1 and fastest.over.iloc[0] == "autoregressive, fastest configuration"
    (_, verdict, _), _ = with_bf16(0.6, 0.8)
    assert verdict.startswith("does not reproduce: like for like (sampled, trained draft), 0 of 3")


def test_host_names_a_folders_machine_in_a_few_words():
    assert summary.host({"environment": {"cpu": "Intel(R) Xeon(R) Processor", "device": "cpu"}}) == "Intel Xeon"
    assert summary.host({"environment": {"cpu": "AMD EPYC"}}) == "AMD EPYC"
    assert summary.host({"environment": {"device": "cuda", "gpu": "NVIDIA H100", "cpu": "x"}}) == "NVIDIA H100"
    assert summary.host({}) == ""
    assert summary.host({"environment": {"device": None, "gpu": "NVIDIA H100", "cpu": "AMD EPYC"}}) == "AMD EPYC"
    assert summary._at({"environment": {"cpu": "Intel(R) Xeon(R) Processor"}}, "02") == "02, Intel Xeon"


def test_provenance_says_one_code_commit_only_when_every_folder_ran_the_same_code():
    one = summary.provenance({"01-distribution": "a" * 40, "05-batch": "a" * 40})
    assert one.startswith("All 2 folders") and "aaaaaaaaaa" in one
    two = summary.provenance({"01-distribution": "a" * 40, "05-batch": "b" * 40 + "+dirty", "06-draft-sweep": "a" * 40})
    assert "of 1 commit and 1 of uncommitted or unrecorded code (not one)" in two
    assert "of 2 commits (not one)" in summary.provenance({"01-distribution": "a" * 40, "05-batch": "c" * 40})
    assert "aaaaaaaaaa: 01-distribution, 06-draft-sweep" in two and "bbbbbbbbbb+dirty: 05-batch" in two
    # two runs of one HEAD with uncommitted edits, or with no recorded commit, share no code as far as anyone knows
    dirty = summary.provenance({"01-distribution": "b" * 40 + "+dirty", "05-batch": "b" * 40 + "+dirty"})
    assert "0 commits and 2 of uncommitted or unrecorded code (not one)" in dirty
    assert "(not one)" in summary.provenance({"01-distribution": "unknown", "05-batch": "unknown"})
    assert summary.provenance({"05-batch": "unknown"}).endswith("(not one): unknown: 05-batch.")
    mixed = summary.provenance({"01-distribution": "a" * 40, "05-batch": "unknown"})
    assert "of 1 commit and 1 of uncommitted" in mixed and "aaaaaaaaaa: 01-distribution" in mixed
    assert summary.provenance({}).startswith("No result folders")


def test_code_commit_is_read_from_environment_json_or_derived_from_the_git_commit(monkeypatch):
    from specrepro import report

    assert summary.code_commit({"environment": {"code_commit": "c" * 40, "git_commit": "d" * 40}}) == "c" * 40
    monkeypatch.setattr(report, "code_commit", lambda commit: f"code of {commit}")
    assert summary.code_commit({"environment": {"git_commit": "d" * 40}}) == "code of " + "d" * 40
    assert summary.code_commit({"environment": {}}) == "code of unknown"


def test_the_numerics_row_tests_at_04s_own_level_and_says_differ_when_it_rejects(tmp_path):
    folder = tmp_path / "04-numerics"
    folder.mkdir()
    greedy = {d: dict(exact_match=1.0, bugs=0) for d in ("float32", "float16", "bfloat16")}
    metrics = dict(same_seed_identical=0, same_seed_prompts=12, greedy=greedy, greedy_prompts=24)
    (folder / "parameters.json").write_text(json.dumps({"level": 0.01}))
    for p, verdict, word in ((0.03, "reproduces", "agree"), (0.004, "does not reproduce", "differ")):
        (folder / "metrics.json").write_text(json.dumps(metrics | {"distribution_p_value": p}))
        row = summary.summary_table(summary.results(tmp_path)).set_index("claim").loc["numerics"]
        assert row.verdict == verdict and f"first-token distributions {word}" in row.ours and "level 0.01" in row.ours


def test_the_arithmetic_row_holds_thm_3_11_to_02s_held_out_tolerance():
    counted = {"draft-s gamma=3": dict(counted=2.0, thm_3_11=2.2), "draft-m gamma=3": dict(counted=3.0, thm_3_11=3.0)}
    for tolerance, verdict in ((0.20, "reproduces"), (0.05, "partly"), (None, "reproduces")):  # None: runs before it
        m = {"counted_test": counted} | ({} if tolerance is None else {"heldout_tolerance": tolerance})
        ours, label, _ = summary._arithmetic({"metrics": m})
        assert label == verdict and f"within {tolerance or 0.20:.0%}" in ours, (tolerance, label, ours)


def test_the_engines_row_ties_a_break_to_the_batch_only_where_speculation_off_kept_its_outputs(tmp_path):
    folder = tmp_path / "08-engines"
    folder.mkdir()
    (folder / "metrics.json").write_text("{}")
    (folder / "verdicts.csv").write_text(
        "engine,mode,verdict,reason\nours,\"ours, draft-s\",lossless at this power,x\n"
        "ours,ours with a planted bug,differs: not explained by numerics,x\n"
        "llama.cpp,ngram,differs: not explained by numerics,x\n")
    head = "speculation,engine,mode,concurrency,prompts,exact_match,near_ties,other,unclassified\n"
    # contrary cases: speculation off broke at batch 2 as well; speculation on already differed from off alone
    for off_other, alone_other, verdict in ((0, 0, "reproduces"), (1, 0, "partly"), (0, 1, "partly")):
        (folder / "concurrency.csv").write_text(
            head + f"on,llama.cpp,ngram,2,8,0.875,0,1,0\noff,llama.cpp,ngram,2,8,1.0,0,{off_other},0\n"
            f"\"on vs off, one at a time\",llama.cpp,ngram,1,8,1.0,0,{alone_other},0\n")
        row = summary.summary_table(summary.results(tmp_path)).set_index("claim").loc["engines"]
        assert row.verdict.startswith(verdict), row.verdict
