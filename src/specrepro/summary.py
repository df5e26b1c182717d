"""The summary beside the papers: every notebook's results set against what Leviathan et al. 2022, Chen et al. 2023
and Zhang et al. 2025 report, one row per claim with one sentence on what reproduces.

The papers' values come from data/papers/claims.json, which names where each was reported and holds only what could
be checked offline (Chen et al.'s Table 1 as quoted by the project's seed post, the abstracts); ours are read from
the output folders' metrics.json and tables, never typed in. A claim whose notebook has not run says so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from . import paths


def claims() -> dict:
    """data/papers/claims.json: the papers and their claims, each with where it was reported."""
    return json.loads((paths.PAPERS / "claims.json").read_text())


SUMMARY = "99-summary"  # the summary's own folder, never one of its inputs


def results(outputs: str | Path = paths.OUTPUTS) -> dict[str, dict]:
    """{notebook folder: {"metrics": its metrics.json, "<table>": its <table>.csv as a DataFrame, ...}} for every
    numbered output folder under `outputs` that has a metrics.json, the summary's own left out."""
    out = {}
    for folder in sorted(Path(outputs).glob("[0-9][0-9]-*")):
        if (folder / "metrics.json").exists() and folder.name != SUMMARY:
            out[folder.name] = {"metrics": json.loads((folder / "metrics.json").read_text())} | {
                csv.stem: pd.read_csv(csv) for csv in sorted(folder.glob("*.csv"))}
    return out


def _bound(v) -> float:
    """A value read back from metrics.json or a CSV: NaN where JSON holds null (an interval over one unit has no
    bounds, `intervals.bootstrap`), so that every comparison with it is False."""
    return float("nan") if v is None else float(v)


def _ci(x: float, lo: float | None, hi: float | None, unit: str = "x") -> str:
    lo, hi = _bound(lo), _bound(hi)
    if math.isnan(lo) or math.isnan(hi):
        return f"{_bound(x):.2f}{unit} (no interval)"
    return f"{_bound(x):.2f}{unit} [{lo:.2f}, {hi:.2f}]"


def _distribution(r):
    m = r["metrics"]
    tests = len(m["p_values"])
    ours = (f"smallest p-value {m['min_p_value']:.2f} over {tests} chi-squared tests of whole generations "
            f"({m['n_samples']:,} samples each, level {m['false_alarm']}); planted bugs rejected with power >= "
            f"{m['weakest_power']['power']:.2f}")
    return ours, ("reproduces" if m["min_p_value"] >= m["false_alarm"] else "does not reproduce: a test rejected"), \
        "01-distribution"


def _numerics(r):
    m = r["metrics"]
    g = m["greedy"]
    ours = (f"same seed: {m['same_seed_identical']}/{m['same_seed_prompts']} sampled continuations identical; greedy "
            f"identical on {g['float32']['exact_match']:.0%} (float32), {g['float16']['exact_match']:.0%} (float16), "
            f"{g['bfloat16']['exact_match']:.0%} (bfloat16) of {m['greedy_prompts']} prompts, "
            f"{sum(v['bugs'] for v in g.values())} divergences not at a near-tie; first-token distributions agree "
            f"(p = {m['distribution_p_value']:.2f})")
    ok = m["same_seed_identical"] < m["same_seed_prompts"] and all(v["bugs"] == 0 for v in g.values())
    return ours, ("reproduces: same distribution, a different draw; greedy differs only at near-ties" if ok else
                  "does not reproduce"), "04-numerics"


def _arithmetic(r):
    m = r["metrics"]
    counted = [v["counted"] for v in m["counted_test"].values()]
    gaps = [abs(v["rel_gap"]) for k, v in m["counted_test"].items() if "prompt-lookup" not in k]
    ours = (f"{min(counted):.2f}-{max(counted):.2f}x the arithmetic of autoregressive decoding per token (every "
            f"operation counted, {len(counted)} configurations, held-out prompts), within {max(gaps):.0%} of Thm 3.11 "
            "fed with a separate run's alpha")
    return ours, ("reproduces: more work, not less" if min(counted) > 1 else "does not reproduce"), \
        "02-arithmetic-ops"


def _regime(r02, r07):
    d = r02["metrics"]["decode_step"]
    ours = (f"eager decode step {d['measured_ms']:.1f} ms vs a {d['memory_floor_ms']:.1f} ms memory floor "
            f"({d['memory_share']:.0%} of its time) (02)")
    if r07 is None:
        return ours, "07-regime has not run", "02-arithmetic-ops"
    m = r07["metrics"]
    x = m["decode_step_x_floor"]
    steps = m["verify_steps"]
    ours += (f"; {x['eager']:.2f}x the floor eager, {x['compiled']:.2f}x compiled; a 4-token verification costs "
             f"{steps.get('compiled_4', float('nan')):.2f} compiled steps, {steps.get('eager_4', float('nan')):.2f} "
             "eager (07)")
    verify = steps.get("compiled_4", float("nan"))
    near, free = x["compiled"] <= 2, verify <= 1.2
    return ours, (f"{'partly' if near != free else 'yes' if near else 'no'}: the compiled decode step is "
                  f"{'within' if near else 'beyond'} 2x of the memory floor ({x['compiled']:.2f}x), and a 4-token "
                  f"verification {'costs about one step' if free else 'is not free'} ({verify:.2f} steps)"), \
        "02-arithmetic-ops, 07-regime"


def _table1(r03, r07):
    t = r03["table1"]
    spec = t[(t.method == "speculative") & (t.kernels == "fastest")]
    parts = [f"{row.task} {row.decoding} {_ci(row.speedup, row.speedup_lo, row.speedup_hi)}"
             for row in spec.itertuples()]
    ours = "03 (eager, 12 prompts): " + "; ".join(parts)
    greedy = spec[spec.decoding == "greedy"]
    lows = list(greedy.speedup_lo)
    if r07 is not None:
        m = r07["metrics"]
        ours += f"; 07 (code greedy, fastest configuration, {m['n_prompts']} other prompts): " + _ci(
            m["speedup"], m["speedup_lo"], m["speedup_hi"])
        lows.append(m["speedup_lo"])
    above = sum(_bound(lo) > 1 for lo in lows)
    return ours, (f"in direction only, not in size: {above} of {len(lows)} greedy intervals lie above 1x, none "
                  "reaches the papers' 1.9-2.5x (a 135M target on a 2-core CPU, not a 70B model on accelerators); "
                  "sampled decoding is not reliably faster"), "03-latency, 07-regime"


def _quality(r03):
    q = r03["quality"]
    prim = q[q.primary]
    ours = "; ".join(f"{row.task} {row.decoding}: {row.autoregressive:.3f} vs {row.speculative:.3f} "
                     f"({row.metric}, {row.n_prompts} prompts, TOST p = {row.tost_p:.3g}, power {row.power:.2f})"
                     for row in prim.itertuples())
    ok = bool(prim.equivalent.all())
    return ours, ("reproduces: equivalent within margins fixed before the run" if ok else
                  "not shown equivalent in every cell"), "03-latency"


def _ladder(r06):
    """06's answer: per task and temperature, which lens draft wins, and whether it is reliably faster than the
    runner-up (the paired bootstrap interval of their ratio above 1; folders from before that test: the two
    marginal intervals clear of each other)."""
    t, verdicts = r06["table2"], r06["metrics"]["verdicts"]
    lad = t[t.draft.str.startswith("lens-")]
    parts = []
    for key, v in verdicts.items():
        row = lad[(lad.task + "_T" + lad.temperature.map("{:g}".format)) == key].set_index("draft")
        won = _ci(v["winner_speedup"], v["winner_lo"], v["winner_hi"])
        parts.append(f"{key.replace('_', ' ')}: {v['winner']} {won}"
                     f" (alpha {'/'.join(f'{a:.2f}' for a in row.alpha)} across the ladder)"
                     + (f", runner-up {v['runner_up']}" + (
                         f" (winner/runner-up {_ci(v['paired_ratio'], v['paired_lo'], v['paired_hi'])}, paired)"
                         if "paired_lo" in v else " (overlapping)" if v["intervals_overlap"] else "")
                        if v["runner_up"] else ""))
    names = sorted(set(lad.draft), key=lambda d: int(d.split("-")[1]))  # by size
    smallest = [v["smallest_wins"] for v in verdicts.values()]
    reliable = [_bound(v["paired_lo"]) > 1 if "paired_lo" in v else not v["intervals_overlap"]
                for v in verdicts.values()]
    # alpha (the sweep's, each draft at its best gamma) higher for the largest draft than for the smallest
    rises = sum(float(g.set_index("draft").alpha[names[-1]]) > float(g.set_index("draft").alpha[names[0]])
                for _, g in lad.groupby(["task", "temperature"]))
    ours = (f"ladder {'/'.join(names)} ({r06['metrics']['n_prompts']} prompts per task): " + "; ".join(parts))
    if r06["metrics"].get("prediction_within_10pct"):  # the out-of-sample prediction (Thm 3.8, calibration apart)
        ours += (f"; predicted before measured within 10% for {r06['metrics']['prediction_within_10pct']} ladder "
                 f"rows (median |error| {r06['metrics']['prediction_median_abs_error']:.1%})")
    if rises < len(verdicts):
        verdict = (f"not testable where alpha does not rise with size (largest above smallest in {rises} of "
                   f"{len(verdicts)} settings)")
    elif all(smallest) and all(reliable):
        verdict = "reproduces: the smallest draft wins everywhere, reliably faster than the runner-up"
    else:
        verdict = (f"{'partly' if any(smallest) else 'does not reproduce'}: alpha rises from {names[0]} to "
                   f"{names[-1]} in every setting; the smallest draft wins in {sum(smallest)} of {len(verdicts)}, "
                   f"and the winner is reliably faster than the runner-up in {sum(reliable)} of {len(verdicts)}")
    if not all(_bound(v["winner_lo"]) > 1 for v in verdicts.values()):  # the ladder's best not reliably > 1x somewhere
        verdict += "; and no draft of the ladder is reliably faster than autoregressive decoding in every setting"
    return ours, verdict, "06-draft-sweep"


def _draft_size(r03, r06=None):
    if r06 is not None and "table2" in r06 and r06["metrics"].get("verdicts"):
        return _ladder(r06)
    f = r03["draft_family"]
    neural = f.set_index("draft").reindex(["draft-s", "draft-m", "draft-l"]).dropna(subset=["alpha"])  # by size
    best = f.loc[f.measured_speedup.idxmax()]
    ours = (f"best draft {best.draft} {_ci(best.measured_speedup, best.speedup_lo, best.speedup_hi)} (alpha "
            f"{best.alpha:.2f}, c {best.c:.3f}); the distilled drafts s/m/l: alpha "
            + "/".join(f"{a:.2f}" for a in neural.alpha) + ", speedup "
            + "/".join(f"{s:.2f}x" for s in neural.measured_speedup))
    rising = bool(neural.alpha.is_monotonic_increasing) and len(neural) >= 3
    return ours, ("testable" if rising else "not testable with these drafts: alpha does not rise with size, so "
                  "size buys only cost (a ladder that rises is issue #14)"), "03-latency"


def _batch_equivalence(r05):
    e = r05["equivalence"]
    ours_rows = e[(e.method == "speculative") & (e.dtype == "float32")]
    controls = e[e.method.str.startswith("control")]
    ours = (f"speculative, float32: exact match {ours_rows.exact_match.min():.0%}-{ours_rows.exact_match.max():.0%} "
            f"at batch {ours_rows.batch_size.min()}-{ours_rows.batch_size.max()} ({ours_rows.prompts.iloc[0]} prompts);"
            f" the two published bugs as controls: {controls.exact_match.min():.0%}-{controls.exact_match.max():.0%}")
    ok = bool((ours_rows.exact_match == 1).all())
    return ours, ("reproduces the problem in the controls; ours keeps equivalence" if ok else
                  "ours loses equivalence somewhere"), "05-batch"


def _batch_throughput(r05):
    t = r05["throughput"].set_index("batch_size")
    top = 8 if 8 in t.index else t.index.max()
    gain = t.spec_tokens_per_s[top] / t.spec_tokens_per_s[1]
    cross = r05["metrics"].get("crossover_batch_size")
    ours = (f"speculative throughput {gain:.2f}x at batch {top} over batch 1; speculative over autoregressive "
            f"{_ci(t.speedup[1], t.speedup_lo[1], t.speedup_hi[1])} at batch 1, "
            f"{_ci(t.speedup[top], t.speedup_lo[top], t.speedup_hi[top])} at batch {top}")
    return ours, (f"throughput grows with the batch ({gain:.2f}x at batch {top}; theirs up to 3x), but speculative "
                  f"decoding's advantage over autoregressive decoding is gone from batch {cross} on: the spare compute "
                  "it rides on (Leviathan et al., Sec. 3) is used up" if cross else
                  f"throughput {gain:.2f}x at batch {top}; no crossover within the batch sizes run"), "05-batch"


ROWS = {  # claim id in claims.json -> (notebooks it needs, a builder of (ours, verdict, notebooks) from `results`)
    "distribution": (("01-distribution",), lambda r: _distribution(r["01-distribution"])),
    "numerics": (("04-numerics",), lambda r: _numerics(r["04-numerics"])),
    "concurrency": (("02-arithmetic-ops",), lambda r: _arithmetic(r["02-arithmetic-ops"])),
    "memory_bound": (("02-arithmetic-ops",), lambda r: _regime(r["02-arithmetic-ops"], r.get("07-regime"))),
    "table1_humaneval_speedup": (("03-latency",), lambda r: _table1(r["03-latency"], r.get("07-regime"))),
    "table1_humaneval_quality": (("03-latency",), lambda r: _quality(r["03-latency"])),
    "draft_size": (("03-latency",), lambda r: _draft_size(r["03-latency"], r.get("06-draft-sweep"))),
    "batch_equivalence": (("05-batch",), lambda r: _batch_equivalence(r["05-batch"])),
    "batch_throughput": (("05-batch",), lambda r: _batch_throughput(r["05-batch"])),
}


def summary_table(res: dict[str, dict], paper_claims: dict | None = None) -> pd.DataFrame:
    """One row per claim: the paper, where it says it, what it says, what we measured (with intervals and sample
    sizes), which notebooks, and the verdict. A claim whose notebooks did not run says "not run"."""
    paper_claims = paper_claims or claims()
    by_id = {c["id"]: c for c in paper_claims["claims"]}
    rows = []
    for cid, (needs, build) in ROWS.items():
        c = by_id[cid]
        missing = [n for n in needs if n not in res]
        if missing:
            ours, verdict, where = "not run", f"{', '.join(missing)} has not run", ", ".join(needs)
        else:
            ours, verdict, where = build(res)
        rows.append(dict(claim=cid, paper=paper_claims["papers"][c["paper"]]["arxiv"], where=c["where"],
                         theirs=c["says"], ours=ours, verdict=verdict, notebooks=where))
    return pd.DataFrame(rows)


def table1_beside_chen(res: dict[str, dict], paper_claims: dict | None = None) -> pd.DataFrame:
    """Chen et al.'s Table 1 rows as the seed post quotes them, and ours (03's Table-1 analog, 07's fastest
    configuration), in one table: source, task, quality metric, method, quality, ms per token, speedup [95% CI]."""
    v = {c["id"]: c["value"] for c in (paper_claims or claims())["claims"]}
    chen = "Chen et al. 2023 (Chinchilla 70B, TPU, K=4)"
    rows = []
    for task, metric, key in (("XSum", "ROUGE-2", "xsum"), ("HumanEval", "score", "humaneval")):
        q_ar, q_sps = v[f"table1_{key}_quality"]
        rows += [dict(source=chen, task=task, metric=metric, method="autoregressive", quality=q_ar,
                      ms_per_token=v["table1_ms_ar"], speedup=1.0),
                 dict(source=chen, task=task, metric=metric, method="speculative", quality=q_sps,
                      ms_per_token=v[f"table1_{key}_ms_sps"], speedup=v[f"table1_{key}_speedup"])]
    if "03-latency" in res:
        t = res["03-latency"]["table1"]
        for row in t[t.kernels == "fastest"].itertuples():
            rows.append(dict(source="ours, 03 (SmolLM2-135M, 2-core CPU, eager, gamma 3, prompt lookup)",
                             task=f"{row.task}, {row.decoding}", metric=row.quality_metric, method=row.method,
                             quality=row.quality, quality_lo=row.quality_lo, quality_hi=row.quality_hi,
                             ms_per_token=row.ms_per_token, speedup=row.speedup, speedup_lo=row.speedup_lo,
                             speedup_hi=row.speedup_hi, n_prompts=row.n_prompts))
    if "07-regime" in res:
        m = res["07-regime"]["metrics"]
        speed = res["07-regime"]["speed"]
        spec = speed[(speed.method == "speculative") & speed.fastest].iloc[0]
        rows.append(dict(source=f"ours, 07 (fastest configuration: {spec.config})", task="code, greedy",
                         method="speculative", ms_per_token=spec.decode_ms_per_token, speedup=m["speedup"],
                         speedup_lo=m["speedup_lo"], speedup_hi=m["speedup_hi"], n_prompts=m["n_prompts"]))
    return pd.DataFrame(rows)
