"""The summary beside the papers: every notebook's results set against what Leviathan et al. 2022, Chen et al. 2023
and Zhang et al. 2025 report, one row per claim with one sentence on what reproduces.

The papers' values come from data/papers/claims.json, which names where each was reported and holds only what could
be checked offline (Chen et al.'s Table 1 as quoted by the project's seed post, the abstracts); ours are read from
the output folders' metrics.json and tables, never typed in. A claim whose notebook has not run says so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from . import audit, models, numerics, paths, report, verdicts
from .distribution import rule_power
from .sweep import setting_key


def claims() -> dict:
    """data/papers/claims.json: the papers and their claims, each with where it was reported."""
    return json.loads((paths.PAPERS / "claims.json").read_text())


SUMMARY = "99-summary"  # the summary's own folder, never one of its inputs


def results(outputs: str | Path = paths.OUTPUTS) -> dict[str, dict]:
    """{notebook folder: {"metrics": its metrics.json, "parameters": its parameters.json ({} where absent),
    "environment": its environment.json ({} where absent), "<table>": its <table>.csv as a DataFrame, ...}}
    for every numbered output folder under `outputs` that has a metrics.json, the summary's own left out."""
    out = {}
    for folder in sorted(Path(outputs).glob("[0-9][0-9]-*")):
        if (folder / "metrics.json").exists() and folder.name != SUMMARY:
            params, env = folder / "parameters.json", folder / "environment.json"
            out[folder.name] = {"metrics": json.loads((folder / "metrics.json").read_text()),
                                "parameters": json.loads(params.read_text()) if params.exists() else {},
                                "environment": json.loads(env.read_text()) if env.exists() else {}} | {
                csv.stem: pd.read_csv(csv) for csv in sorted(folder.glob("*.csv"))}
    return out


def host(r: dict) -> str:
    """A folder's host in a few words ("Intel Xeon", "AMD EPYC", a GPU's name), from its environment.json; "" where
    it was not recorded."""
    env = r.get("environment", {})
    if (env.get("device") or "cpu") != "cpu" and env.get("gpu"):
        return str(env["gpu"])
    return re.sub(r"\s+", " ", re.sub(r"\((R|TM)\)|\bProcessor\b", "", env.get("cpu") or "")).strip()


def code_commit(r: dict) -> str:
    """The code a folder's run computed with (`report.code_commit`), from its environment.json; derived from its git
    commit for folders written before environment.json recorded it; "unknown" where neither was recorded."""
    env = r.get("environment", {})
    return env.get("code_commit") or report.code_commit(env.get("git_commit") or "unknown")


def _short(commit: str) -> str:
    return commit[:10] + ("+dirty" if commit.endswith("+dirty") else "")


def provenance(code_commits: dict[str, str]) -> str:
    """One sentence, computed: do these folders come from one code commit, and if not, which from which. A folder
    whose run had uncommitted code ('+dirty') or no recorded commit ('unknown') shares its code with no other: two
    dirty runs of one HEAD may have run different edits."""
    if not code_commits:
        return "No result folders, so no code commit behind them."
    unsure = sorted(n for n, c in code_commits.items() if c.endswith("+dirty") or c == "unknown")
    groups: dict[str, list[str]] = {}
    for name, commit in sorted(code_commits.items()):
        if name not in unsure:
            groups.setdefault(commit, []).append(name)
    if len(groups) == 1 and not unsure:
        (commit,) = groups
        return f"All {len(code_commits)} folders were computed by the code of one commit, {_short(commit)}."
    head = (f"The folders were computed by the code of {len(groups)} commit{'' if len(groups) == 1 else 's'}"
            + (f" and {len(unsure)} of uncommitted or unrecorded code" if unsure else "") + " (not one): ")
    return head + "; ".join([f"{_short(c)}: {', '.join(names)}" for c, names in groups.items()]
                            + [f"{_short(code_commits[n])}: {n}" for n in unsure]) + "."


def _at(r: dict, notebook: str) -> str:
    """"02" or "02, <its host>": where a number was measured, for rows that set two folders' numbers side by side."""
    where = host(r)
    return f"{notebook}, {where}" if where else notebook


def _bound(v) -> float:
    """A value read back from metrics.json or a CSV: NaN where JSON holds null (an interval over one unit has no
    bounds, `intervals.bootstrap`), so that every comparison with it is False."""
    return float("nan") if v is None else float(v)


_ci = verdicts.fmt_ci


def _p(p: float) -> str:
    """A p-value as read beside a level of 0.001: two decimals, two significant digits below 0.01."""
    return f"{p:.2f}" if p >= 0.01 else f"{p:.2g}"


def _redrawn(redrawn: dict) -> str:
    """01's rejected tests and their redraws, as read: "0.00095 then 0.24" per test."""
    return "; ".join(f"{_p(v[0])} then " + ", ".join(_p(x) for x in v[1:]) for v in redrawn.values())


def _small_power(small: dict, real: dict) -> str:
    """What 01's small-batch run can see: its detectable total variation (80% power) against the error a bug in
    `zhang_tv` of the rows could make; where it cannot see that error, the sentence says the run is underpowered."""
    if "detectable_tv" not in small:
        return ""
    lo, hi = small["detectable_tv"]
    out = f"; detectable error {lo:.3f}-{hi:.3f}"
    zhang = real.get("zhang_tv")
    if zhang is None:
        return out
    bug = f"the error of {zhang} that a bug in {zhang:.0%} of rows could make"
    if lo > zhang:
        return out + f", above {bug}: underpowered for such a bug"
    if hi > zhang:
        return out + f", above {bug} on some prompts"
    return out + f", enough to see {bug}"


def _distribution(r):
    m = r["metrics"]
    tests = len(m["p_values"])
    w = m["weakest_power"]
    lo, hi = w.get("interval", (None, None))
    at = f" at {w['n_samples']:,} samples" if "n_samples" in w else ""
    k = m.get("confirm_draws")  # 01's confirmation rule: a rejection counts only if its k fresh redraws reject too
    tiny_redrawn = m.get("redrawn") or {}
    ours = (f"smallest p-value {_p(m['min_p_value'])} over {tests} chi-squared tests of whole generations "
            f"({m['n_samples']:,} samples each, level {m['false_alarm']}"
            + (f"; {len(tiny_redrawn)} rejected, p then redrawn: {_redrawn(tiny_redrawn)}; {m['confirmed']} confirmed"
               if tiny_redrawn else "")
            + f"); the weakest planted-bug cell rejected with power {_ci(w['power'], lo, hi, unit='')}{at}"
            + (f" for one test ({rule_power(w['power'], k):.2f} with its confirmation)" if k else ""))
    # metrics from before the rule (no "confirmed"): any rejection counts
    failed = m["confirmed"] > 0 if "confirmed" in m else m["min_p_value"] < m["false_alarm"]
    outside = m.get("outside_support", 0)  # a sample of probability 0 fails whatever the p-values
    real_failed = False
    real = m.get("real_pair")
    if real:  # section 3: the real pair against its exact probabilities
        small = real.get("small_batch") or {}  # 01's run at a small batch size, beside the large batches'
        outside += real["outside_support"]
        real_failed = (real["confirmed"] + small.get("confirmed", 0) > 0 if "confirmed" in real
                       else min(real["min_p_value"], small.get("min_p_value", 1.0)) < m["false_alarm"])
        redrawn = real.get("redrawn") or {}
        rule = (f"; {len(redrawn)} of its tests (any batch) rejected and were drawn again with fresh seeds, p then "
                f"redrawn: {_redrawn(redrawn)}; {real['confirmed'] + small.get('confirmed', 0)} confirmed"
                if redrawn else "")
        ours += (f"; the real pair ({', '.join(real['drafts'])}; first {real['n_tokens']} tokens of "
                 f"{len(real['prompts'])} prompts in ragged batches"
                 + (f" of {real['batch_rows']:,} rows" if "batch_rows" in real else "")
                 + f", {real['n_samples']:,} samples each): smallest "
                 f"p-value {_p(real['min_p_value'])} over {real['tests']} tests{rule}; detectable error (80% power"
                 + (", with the confirmation" if "confirmed" in real else "") + ") "
                 f"{real['detectable_tv'][0]:.2f}-{real['detectable_tv'][1]:.2f} in total variation"
                 + (f", power {real['power_at_zhang_tv'][0]:.2f}-{real['power_at_zhang_tv'][1]:.2f} against "
                    f"{real['zhang_tv']} (the most a bug in {real['zhang_tv']:.0%} of rows could move)"
                    if "power_at_zhang_tv" in real else "")
                 + f"; its planted bug rejected in {real['bug_rejected']} of {real['bug_tests']} prompts"
                 + (f" (batches of {real['batch_rows']:,} rows)" if "batch_rows" in real else "")
                 + (f"; at batch {small['batch_rows']} ({small['draft']}, {small['n_samples']:,} samples): smallest "
                    f"p-value {_p(small['min_p_value'])} over {small['tests']} tests" + _small_power(small, real)
                    if small else ""))
    verdict = verdicts.distribution(failed, real_failed, outside, tiny_rule="confirmed" in m,
                                    real_rule=bool(real) and "confirmed" in real)
    return ours, str(verdict), "01-distribution"


def _numerics(r):
    m = r["metrics"]
    g = m["greedy"]
    level = r.get("parameters", {}).get("level", 0.05)  # 04's own significance level
    p = m["distribution_p_value"]
    ours = (f"same seed: {m['same_seed_identical']}/{m['same_seed_prompts']} sampled continuations identical; greedy "
            f"identical on {g['float32']['exact_match']:.0%} (float32), {g['float16']['exact_match']:.0%} (float16), "
            f"{g['bfloat16']['exact_match']:.0%} (bfloat16) of {m['greedy_prompts']} prompts, "
            f"{sum(v['bugs'] for v in g.values())} divergences not at a near-tie; first-token distributions "
            f"{'agree' if p >= level else 'differ'} (p = {p:.2g}, level {level:g})")
    v = verdicts.numerics(m["same_seed_identical"], m["same_seed_prompts"], {d: x["bugs"] for d, x in g.items()},
                          p, alpha=level)
    return ours, v.label, "04-numerics"


def _arithmetic(r):
    m = r["metrics"]["counted_test"]
    tolerance = r["metrics"].get("heldout_tolerance", 0.20)  # 02's parameter; 0.20 in runs before it had one
    v = verdicts.arithmetic({k: x["counted"] for k, x in m.items()}, {k: x["thm_3_11"] for k, x in m.items()},
                            tolerance=tolerance)
    return "every operation counted, held-out prompts: " + v.reason, v.label, "02-arithmetic-ops"


def _regime(r02, r07):
    d = r02["metrics"]["decode_step"]
    ours = (f"eager decode step {d['measured_ms']:.1f} ms vs a {d['memory_floor_ms']:.1f} ms memory floor "
            f"({d['memory_share']:.0%} of its time) ({_at(r02, '02')})")
    if r07 is None:
        return ours, "07-regime has not run", "02-arithmetic-ops"
    m = r07["metrics"]
    x = m["decode_step_x_floor"]
    steps = m["verify_steps"]
    beside = (m.get("read_floor") or {}).get("summary") or {}  # 07's section 1c: each step beside a read of its bytes
    v = verdicts.regime(x, {r: steps.get(f"{r}_4") for r in x},
                        paired={r: (s["x_read"], s["x_read_lo"], s["x_read_hi"]) for r, s in beside.items() if r in x})
    eager_4 = steps.get("eager_4")
    ours += f"; {v.reason} (eager: {float('nan') if eager_4 is None else eager_4:.2f} steps) ({_at(r07, '07')})"
    llama = m.get("llama_cpp") or {}
    if llama.get("decode_x_floor") is not None and x:  # the anchor: llama.cpp on the same weights, same floor
        ours += (f"; llama.cpp on the same float32 weights, same run: decode step {llama['decode_ms']:.1f} ms, "
                 f"{llama['decode_x_floor']:.2f}x the floor; ours at its fastest "
                 f"{min(x.values()) / llama['decode_x_floor']:.2f}x llama.cpp's (07)")
    lb = beside.get("llama.cpp")
    if lb:
        ours += (f"; llama.cpp's step beside a read of its bytes {_ci(lb['x_read'], lb['x_read_lo'], lb['x_read_hi'])} "
                 f"({lb['rounds']} rounds, 07)")
    spec = (m.get("llama_cpp_speculation") or {}).get("speedup") or {}
    if spec and m.get("speedup") is not None:  # each engine's speculation over its own autoregressive decoding
        mode, (est, lo, hi) = max(spec.items(), key=lambda kv: kv[1][0])
        ours += (f"; greedy speculation over its own autoregressive decoding, same prompts: llama.cpp's best "
                 f"({mode}, of {len(spec)} modes) {_ci(est, lo, hi)}, ours "
                 f"{_ci(m['speedup'], m['speedup_lo'], m['speedup_hi'])} (07)")
    b = m.get("bf16")
    if b:  # bfloat16 copies, where the host computes it natively: their own floor, their own race
        ours += (f"; in bfloat16 ({', '.join(b['cpu_features']) or 'CPU features not recorded'}): decode step "
                 + ", ".join(f"{r} {x_:.2f}x" for r, x_ in b["step_x_floor"].items())
                 + f" its {b['floor_ms']:.1f} ms floor, speculative "
                 f"{_ci(b['speedup'], b['speedup_lo'], b['speedup_hi'])} over bfloat16 autoregressive and "
                 f"{_ci(b['vs_float32'], b['vs_float32_lo'], b['vs_float32_hi'])} over float32's fastest, "
                 f"greedy output as float32's on {b['greedy_identical']} of "
                 f"{b['greedy_prompts']} prompts (07)")
    return ours, v.label, "02-arithmetic-ops, 07-regime"


def _draft_and_gamma(row, draft: str, gamma):
    """A Table-1 row's draft and gamma: the row's own where the table names them, else the notebook's parameters."""
    return getattr(row, "draft", draft), getattr(row, "gamma", gamma)


def _draft_07(r07) -> str:
    return r07["metrics"].get("draft_name", r07.get("parameters", {}).get("draft_name", "prompt-lookup"))


def speedup_rows(table1: pd.DataFrame, like_for_like: pd.DataFrame | None = None, *, draft: str = "prompt-lookup",
                 gamma: int | None = None) -> list[verdicts.SpeedupRow]:
    """03's speedups as `verdicts.SpeedupRow`s: the Table-1 analog's speculative rows (each at its fastest kernel;
    the draft and gamma from the table where it names them, else `draft`/`gamma`, 03's parameters) and section
    1c's like-for-like rows (sampled, trained draft)."""
    fast = table1[table1.method == "speculative"]
    if "kernels" in fast:
        fast = fast[fast.kernels == "fastest"]
    rows = []
    for row in fast.itertuples():
        name, g = _draft_and_gamma(row, draft, gamma)
        rows.append(verdicts.SpeedupRow(row.task, row.decoding, name, models.is_trained(name), row.speedup,
                                        _bound(row.speedup_lo), _bound(row.speedup_hi), int(row.n_prompts),
                                        None if g is None else int(g)))
    if like_for_like is not None and len(like_for_like):
        for row in like_for_like[like_for_like.method == "speculative"].itertuples():
            rows.append(verdicts.SpeedupRow(row.task, row.decoding, f"{row.draft}, {row.chosen}", bool(row.trained),
                                            row.speedup, _bound(row.speedup_lo), _bound(row.speedup_hi),
                                            int(row.n_prompts), int(row.gamma)))
    return rows


def _speedup_rows(r03, r07) -> list[verdicts.SpeedupRow]:
    """`speedup_rows` of 03's folder, and 07's fastest configuration."""
    params = r03.get("parameters", {})
    rows = speedup_rows(r03["table1"], r03.get("like_for_like"), draft=params.get("draft_name", "prompt-lookup"),
                        gamma=params.get("gamma"))
    if r07 is not None:
        m, task = r07["metrics"], r07.get("parameters", {}).get("task", "code")

        def row(decoding, s, draft):  # s: 07's metrics for one race, each method at its fastest
            return verdicts.SpeedupRow(task, decoding, f"{draft}, 07's fastest configuration", models.is_trained(draft),
                                       s["speedup"], _bound(s["speedup_lo"]), _bound(s["speedup_hi"]),
                                       int(s["n_prompts"]), s.get("gamma"))

        rows.append(row("greedy", m, _draft_07(r07)))
        if "sampled" in m:  # section 2c: Chen et al.'s mode against every method at its fastest
            rows.append(row("nucleus", m["sampled"], m["sampled"]["draft"]))
        for s in _bf16_sampled(m):  # section 2d: the same in bfloat16, against bfloat16 autoregressive decoding
            label = f"{s['draft']}, 07 bfloat16 {s['config']} ({s['chosen_by']})"
            rows.append(verdicts.SpeedupRow(task, "nucleus", label, models.is_trained(s["draft"]), s["speedup"],
                                            _bound(s["speedup_lo"]), _bound(s["speedup_hi"]), int(s["n_prompts"]),
                                            s["gamma"]))
    return rows


def _bf16_sampled(m07: dict) -> list[dict]:
    """07 section 2d's nucleus-sampled rows in bfloat16 (none where bfloat16 did not run, or 07 predates them)."""
    return m07.get("bf16_sampled") or []


CHEN_ROWS = {  # our (task, decoding) -> the key of Chen et al.'s Table-1 row in claims.json ("table1_<key>_...")
    ("code", "nucleus"): "humaneval", ("text", "nucleus"): "xsum", ("text", "greedy"): "xsum_greedy"}


def _values(paper_claims: dict | None = None) -> dict:
    return {c["id"]: c["value"] for c in (paper_claims or claims())["claims"]}


def paper_speedups(paper_claims: dict | None = None) -> dict[str, float]:
    """Chen et al.'s sampled Table-1 speedups under our task names (code: HumanEval, text: XSum)."""
    v = _values(paper_claims)
    return {task: v[f"table1_{key}_speedup"] for (task, decoding), key in CHEN_ROWS.items() if decoding == "nucleus"}


def paper_quality_moves(paper_claims: dict | None = None) -> dict[tuple[str, str], float]:
    """Chen et al.'s Table-1 quality, speculative minus autoregressive on their metric, under our (task, decoding)
    (rows an older claims.json lacks are left out)."""
    v = _values(paper_claims)
    return {cell: v[f"table1_{key}_quality"][1] - v[f"table1_{key}_quality"][0] for cell, key in CHEN_ROWS.items()
            if f"table1_{key}_quality" in v}


def _table1(r03, r07):
    rows = _speedup_rows(r03, r07)
    v = verdicts.table1(rows, paper_speedups())
    ours = "; ".join(r.describe() for r in rows)
    return ours, str(v), "03-latency" + (", 07-regime" if r07 is not None else "")


def _quality_cells(r03) -> list[verdicts.QualityCell]:
    q = r03["quality"]
    level = r03.get("parameters", {}).get("level", 0.05)
    answers = r03.get("quality_answers")
    moves = paper_quality_moves()
    cells = []
    for row in q[q.primary].itertuples():
        detect = getattr(row, "detectable", None)
        if (detect is None or pd.isna(detect)) and answers is not None:  # folders from before the column
            grp = answers[(answers.task == row.task) & (answers.decoding == row.decoding)]
            a, b = (grp[grp.method == m].sort_values("prompt")[row.metric].to_numpy(float)
                    for m in ("autoregressive", "speculative"))
            detect = numerics.detectable_difference(float(np.sqrt(a.var(ddof=1) + b.var(ddof=1))), a.size,
                                                    level=level)
        cells.append(verdicts.QualityCell(
            row.task, row.decoding, row.metric, int(row.n_prompts), row.autoregressive, row.speculative,
            row.diff_lo, row.diff_hi, row.margin, row.tost_p, level, row.identical,
            None if detect is None else float(detect), moves.get((row.task, row.decoding))))
    return cells


def _quality(r03):
    v = verdicts.quality(_quality_cells(r03))
    return v.reason, v.label, "03-latency"


def _pick(key: str, v: dict, note: str = "") -> str:
    """One setting of an 06 draft-size verdict: the calibration's pick as measured, and against its runner-up the
    paired ratio (folders from before that test: whether the two intervals overlapped)."""
    text = f"{key.replace('_', ' ')}: {v['winner']} {_ci(v['winner_speedup'], v['winner_lo'], v['winner_hi'])}{note}"
    if not v.get("runner_up"):
        return text
    vs = (f" ({v['winner']}/{v['runner_up']} {_ci(v['paired_ratio'], v['paired_lo'], v['paired_hi'])}, paired)"
          if "paired_lo" in v else " (overlapping)" if v.get("intervals_overlap") else "")
    return f"{text}, runner-up {v['runner_up']}{vs}"


def _ladder(r06):
    """06's answer: per task and temperature, which lens draft wins, and whether it is reliably faster than the
    runner-up (the paired bootstrap interval of their ratio above 1; folders from before that test: the two
    marginal intervals clear of each other)."""
    t, settings = r06["table2"], r06["metrics"]["verdicts"]
    lad = t[t.draft.str.startswith("lens-")]
    parts = []
    for key, v in settings.items():
        row = lad[[setting_key(t, T) == key for t, T in zip(lad.task, lad.temperature)]].set_index("draft")
        parts.append(_pick(key, v, f" (alpha {'/'.join(f'{a:.2f}' for a in row.alpha)} across the ladder)"))
    names = sorted(set(lad.draft), key=lambda d: int(d.split("-")[1]))  # by size
    settings = {k: v | {"reliably_faster": _bound(v["paired_lo"]) > 1 if "paired_lo" in v
                        else not v["intervals_overlap"]} for k, v in settings.items()}
    # alpha (the sweep's, each draft at its best gamma) higher for the largest draft than for the smallest
    rises = [float(g.set_index("draft").alpha[names[-1]]) > float(g.set_index("draft").alpha[names[0]])
             for _, g in lad.groupby(["task", "temperature"])]
    ours = (f"ladder {'/'.join(names)} ({r06['metrics']['n_prompts']} prompts per task): " + "; ".join(parts))
    if r06["metrics"].get("prediction_within_10pct"):  # the out-of-sample prediction (Thm 3.8, calibration apart)
        ours += (f"; predicted before measured within 10% for {r06['metrics']['prediction_within_10pct']} ladder "
                 f"rows (median |error| {r06['metrics']['prediction_median_abs_error']:.1%})")
    family, fam_verdicts = r06["metrics"].get("feature_family"), r06["metrics"].get("feature_verdicts")
    if family and fam_verdicts:  # the same question asked of the feature draft at 1 and 2 layers (one recipe)
        picks = "; ".join(_pick(key, v) for key, v in fam_verdicts.items())
        ours += (f". The feature draft at {len(family)} sizes ({'/'.join(family)}), the same question: {picks}; "
                 f"{r06['metrics']['feature_draft_size']['label']}")
    return ours, str(verdicts.draft_size(settings, rises, names)), "06-draft-sweep"


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
    why = ("alpha rises with size in 03, but the ladder that answers the question (06-draft-sweep) did not run"
           if rising else "alpha does not rise with size with these drafts, so size buys only cost")
    return ours, str(verdicts.Verdict("not testable", why)), "03-latency"


def _batch_equivalence(r05):
    e = r05["equivalence"]
    ours_rows = e[(e.method == "speculative") & (e.dtype == "float32")]
    controls = e[e.method.str.startswith("control")]
    ours = (f"speculative, float32: exact match {ours_rows.exact_match.min():.0%}-{ours_rows.exact_match.max():.0%} "
            f"at batch {ours_rows.batch_size.min()}-{ours_rows.batch_size.max()} ({ours_rows.prompts.iloc[0]} prompts);"
            f" the two published bugs as controls: {controls.exact_match.min():.0%}-{controls.exact_match.max():.0%}")
    v = verdicts.batch_equivalence(ours_rows.exact_match.tolist(), controls.exact_match.tolist())
    return ours, v.label, "05-batch"


def _batch_rows(r05) -> list[verdicts.BatchRow]:
    t = r05["throughput"]
    cost = r05["verify_cost"].set_index("batch_size").verify_steps if "verify_cost" in r05 else {}
    return [verdicts.BatchRow(int(r.batch_size), r.spec_tokens_per_s, r.ar_tokens_per_s, r.speedup,
                              _bound(r.speedup_lo), _bound(r.speedup_hi), int(r.batches),
                              float(cost[r.batch_size]) if r.batch_size in cost else None,
                              getattr(r, "ar_decode_tokens_per_s", None))
            for r in t.itertuples()]


def _batch_throughput(r05):
    v = verdicts.batch_throughput(_batch_rows(r05))
    return v.reason, v.label, "05-batch"


def _engines(r08):
    v, c = r08["verdicts"], r08["concurrency"]
    engines_ = v[v.engine != "ours"]
    ours = v[v.engine == "ours"]
    planted = ours["mode"].str.contains("planted")
    batched = {f"{e} {m}": audit.batch_break(g.to_dict("records"))
               for (e, m), g in c[c.engine != "ours"].groupby(["engine", "mode"], sort=False)}
    verdict = verdicts.engines({f"{r.engine} {r.mode}": r.verdict for r in engines_.itertuples()},
                               planted={r.mode: r.verdict for r in ours[planted].itertuples()}, batched=batched)
    under = c[(c.engine != "ours") & (c.speculation == "on")]
    text = "; ".join(f"{r.engine} {r.mode}: {r.verdict}" for r in engines_.itertuples())
    if len(under):
        text += (f"; greedy exact match under concurrency {under.concurrency.min()}-{under.concurrency.max()}: "
                 f"{under.exact_match.min():.0%}-{under.exact_match.max():.0%} ({under.prompts.iloc[0]} prompts)")
    text += "; ours: " + ", ".join(f"{r.mode}: {r.verdict}" for r in ours.itertuples())
    return text, f"{verdict.label}: {verdict.reason}", "08-engines"


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
    "engines": (("08-engines",), lambda r: _engines(r["08-engines"])),
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
    """Chen et al.'s Table 1 rows and ours in one table, the like-for-like rows first: source, task, decoding,
    draft, like_for_like (sampled with a trained draft, the mode of Chen et al.'s headline rows), quality metric,
    method, quality, ms per token, speedup [95% CI], prompts; for ours also the host (`host`) and what the speedup
    is over (`over`: 07's bfloat16 rows are over bfloat16 autoregressive decoding, not over the float32 fastest).
    Ours: 03's Table-1 analog (each row at its fastest kernel) and 07's fastest configuration, greedy and (section
    2c) nucleus with a trained draft, and (section 2d) bfloat16."""
    v = _values(paper_claims)
    chen = "Chen et al. 2023 (Chinchilla 70B, TPU, K=4)"
    rows = []
    for task, decoding, metric, key in (("XSum", "nucleus", "ROUGE-2", "xsum"),
                                        ("XSum", "greedy", "ROUGE-2", "xsum_greedy"),
                                        ("HumanEval", "nucleus", "score", "humaneval")):
        if f"table1_{key}_speedup" not in v:  # an older claims.json
            continue
        q_ar, q_sps = v[f"table1_{key}_quality"]
        base = dict(source=chen, task=task, decoding=decoding, draft="their trained draft",
                    like_for_like=decoding != "greedy", metric=metric, host="TPU", over="autoregressive")
        rows += [base | dict(method="autoregressive", quality=q_ar, ms_per_token=v["table1_ms_ar"], speedup=1.0),
                 base | dict(method="speculative", quality=q_sps, ms_per_token=v[f"table1_{key}_ms_sps"],
                             speedup=v[f"table1_{key}_speedup"])]
    if "03-latency" in res:
        t = res["03-latency"]["table1"]
        params = res["03-latency"].get("parameters", {})
        env = res["03-latency"].get("environment", {})
        cores = (f"CPU, {env['cpu_count']} logical CPUs" if env.get("device", "cpu") == "cpu" and env.get("cpu_count")
                 else env.get("gpu") or env.get("device") or "host not recorded")
        for row in t[t.kernels == "fastest"].itertuples():
            draft, gamma = _draft_and_gamma(row, params.get("draft_name", "prompt-lookup"), params.get("gamma", "?"))
            rows.append(dict(source=f"ours, 03 (SmolLM2-135M, {cores}, eager, gamma {gamma})", task=row.task,
                             decoding=row.decoding, draft=draft,
                             like_for_like=row.decoding != "greedy" and models.is_trained(draft),
                             metric=row.quality_metric, method=row.method, quality=row.quality,
                             quality_lo=row.quality_lo, quality_hi=row.quality_hi, ms_per_token=row.ms_per_token,
                             speedup=row.speedup, speedup_lo=row.speedup_lo, speedup_hi=row.speedup_hi,
                             n_prompts=row.n_prompts, host=host(res["03-latency"]),
                             over="autoregressive, fastest kernel"))
        lfl = res["03-latency"].get("like_for_like")
        for row in (lfl.itertuples() if lfl is not None else ()):
            rows.append(dict(source=f"ours, 03 section 1c (SmolLM2-135M, {cores}, eager, gamma {row.gamma}: "
                                    f"{row.chosen})", task=row.task, decoding=row.decoding, draft=row.draft,
                             like_for_like=bool(row.trained), method=row.method, ms_per_token=row.ms_per_token,
                             speedup=row.speedup, speedup_lo=row.speedup_lo, speedup_hi=row.speedup_hi,
                             n_prompts=row.n_prompts, host=host(res["03-latency"]),
                             over="autoregressive, fastest kernel"))
    if "07-regime" in res:
        r07 = res["07-regime"]
        m, task = r07["metrics"], r07.get("parameters", {}).get("task", "code")

        def ours_07(where, decoding, s, draft, ms, over="autoregressive, fastest configuration"):
            # s: 07's metrics for one race, each method at its fastest
            return dict(source=f"ours, 07 {where}", task=task, decoding=decoding, draft=draft,
                        like_for_like=decoding != "greedy" and models.is_trained(draft), method="speculative",
                        ms_per_token=ms, speedup=s["speedup"], speedup_lo=s["speedup_lo"], speedup_hi=s["speedup_hi"],
                        n_prompts=s["n_prompts"], host=host(r07), over=over)

        speed = r07["speed"]
        spec = speed[(speed.method == "speculative") & speed.fastest].iloc[0]
        rows.append(ours_07(f"(fastest configuration: {spec.config})", "greedy", m, _draft_07(r07),
                            spec.decode_ms_per_token))
        if "sampled" in m:  # section 2c: Chen et al.'s mode, each method at its fastest configuration
            s, table = m["sampled"], r07.get("sampled")
            ms = table[table.method == "speculative"].decode_ms_per_token if table is not None else ()
            rows.append(ours_07(f"section 2c (fastest configuration: {s.get('config', '?')}, gamma "
                                f"{s.get('gamma', '?')})", "nucleus", s, s["draft"],
                                float(ms.iloc[0]) if len(ms) else float("nan")))
        for s in _bf16_sampled(m):  # section 2d: over bfloat16 autoregressive decoding
            rows.append(ours_07(f"section 2d in bfloat16 ({s['config']}, gamma {s['gamma']}: {s['chosen_by']})",
                                "nucleus", s, s["draft"], float("nan"), over="bfloat16 autoregressive"))
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    # like-for-like rows first (theirs, then ours), each source's rows in their order
    return out.sort_values("like_for_like", ascending=False, kind="stable").reset_index(drop=True)
