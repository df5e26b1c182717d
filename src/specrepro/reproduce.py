"""`make reproduce`: every notebook in order, each skipped when its inputs are unchanged since its last good run.

    python -m specrepro.reproduce                 # run what changed, skip the rest (make reproduce)
    python -m specrepro.reproduce --force         # rerun all (make reproduce FORCE=1)
    python -m specrepro.reproduce --quick         # reduced prompts and grids into outputs/quick/ (make reproduce-quick)
    python -m specrepro.reproduce 03-latency      # only these notebooks

A notebook's inputs are its own file, the library's sources, the shipped drafts and prompt sets, the install pins
(pyproject.toml, constraints.txt) and its effective parameters; their sha256 (`pipeline.inputs_key`) is stored in
the run's `run.json` beside the wall time it took. A notebook that reads the others' outputs (`READS_OUTPUTS`:
99-summary) also runs whenever one of them runs. Before running, the plan says which notebooks run and how long
each is expected to take (its last recorded run on this checkout, else the duration papermill recorded in the
committed executed notebook); while a notebook runs, papermill's progress bar shows its cells with elapsed time
and an estimate, and each start prints when the whole run should end. A notebook that fails leaves its previous output
in place (`specrepro.pipeline`); the others still run, and the exit code is 1.

Quick runs use `QUICK` (fewer prompts, tokens, grid points and samples per notebook): they check that the whole
chain runs on the real models in well under 30 minutes; their numbers are not the published ones, each of their
folders carries a QUICK_RUN.md saying so, and outputs/quick/ is git-ignored.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from . import paths
from .pipeline import RUN_RECORD, NotebookFailed, declared_parameters, inputs_key, run_notebook

# Reduced parameters of `make reproduce-quick`, per notebook: every section runs, on fewer prompts and points.
QUICK: dict[str, dict[str, Any]] = {
    "00-train-drafts": dict(eval_prompts=4, eval_tokens=16, timing_tokens=8),
    "01-distribution": dict(n_samples=4000, power_sizes=[100, 500], power_pool=2000, power_pool_max=2000, min_reps=2,
                            real_samples=500),
    "02-arithmetic-ops": dict(gammas=[1, 2, 4], count_gammas=[1, 4], n_prompts=2, max_new_tokens=24,
                              timing_repeats=3),
    "03-latency": dict(n_prompts=3, code_tokens=48, text_tokens=32, gammas=[1, 3, 5], sweep_prompts=2,
                       sweep_tokens=32, family=["prompt-lookup", "draft-s", "lookup-draft-m"],
                       hf_drafts=["prompt-lookup"], baseline_repeats=1, quality_code_prompts=8,
                       quality_text_prompts=8, quality_code_tokens=128, quality_text_tokens=64),
    "04-numerics": dict(n_prompts=4, n_tokens=16, probe_prompts=1, n_samples=1000, power_reps=100,
                        greedy_prompts=8, greedy_tokens=24),
    "05-batch": dict(n_prompts=8, max_new_tokens=24, batch_sizes=[1, 2, 8], control_batch_sizes=[2, 8]),
    "06-draft-sweep": dict(ladder=["lens-0", "lens-4", "lens-16"], others=["prompt-lookup"], gammas=[1, 3],
                           temperatures=[0.0], n_prompts=3, n_calibration=1, max_new_tokens=16,
                           cost_tokens=4, one_thread_prompts=1, one_thread_gammas=[1]),
    "07-regime": dict(n_prompts=3, repeats=1, max_new_tokens=24, configs=["stock", "compiled_few_rows"], read_rounds=2,
                      compile_modes=["default", "native"], widths=[1, 4], sweep_gammas=[3], sweep_prompts=2),
    "08-engines": dict(n_samples=100, ours_samples=60, n_prompts=4, max_new_tokens=16, concurrency=[4],
                       llama_draft="", power_replicates=50),
    "99-summary": dict(results_dir=str(paths.QUICK_OUTPUTS)),  # the quick runs' folders, not the published ones
}


# Notebooks that read the other notebooks' outputs: they run whenever one of those runs, whatever their own key.
READS_OUTPUTS = {"99-summary"}


def notebooks() -> list[Path]:
    """The numbered notebooks, in order."""
    return sorted(paths.NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"))


def expected_seconds(out_dir: Path, name: str) -> float | None:
    """How long the last good run into `out_dir` took (run.json), else papermill's recorded duration of the
    executed notebook there; None when neither exists."""
    record = out_dir / RUN_RECORD
    if record.exists():
        return json.loads(record.read_text()).get("wall_seconds")
    executed = out_dir / f"{name}.ipynb"
    if executed.exists():
        return json.loads(executed.read_text()).get("metadata", {}).get("papermill", {}).get("duration")
    return None


def _minutes(seconds: float | None, upper_bound: bool = False) -> str:
    if seconds is None:
        return "unknown"
    return f"{'at most ' if upper_bound else ''}~{seconds / 60:.0f} min"


def plan(selected: list[Path], *, quick: bool, force: bool) -> list[dict[str, Any]]:
    """One entry per notebook: its output folder, parameters, inputs key, whether it runs and its expected time."""
    rows = []
    for nb in selected:
        name = nb.stem
        out_dir = (paths.QUICK_OUTPUTS if quick else paths.OUTPUTS) / name
        overrides = dict(QUICK.get(name, {})) if quick else {}
        key = inputs_key(nb, declared_parameters(nb) | overrides)
        record = out_dir / RUN_RECORD
        last = json.loads(record.read_text()).get("inputs_key") if record.exists() else None
        expected, bound = expected_seconds(out_dir, name), False
        if expected is None and quick:  # no quick run yet: the full run's time is an upper bound
            expected, bound = expected_seconds(paths.OUTPUTS / name, name), True
        stale = name in READS_OUTPUTS and any(r["run"] for r in rows)  # an output it reads will change
        rows.append(dict(notebook=nb, name=name, out_dir=out_dir, overrides=overrides, key=key,
                         run=force or last != key or stale, expected=expected, upper_bound=bound))
    return rows


def run_plan(rows: list[dict[str, Any]], *, quick: bool, log=print) -> list[str]:
    """Run the notebooks the plan marks; returns the names of those that failed."""
    todo = [r for r in rows if r["run"]]
    log(("Quick run (reduced prompts and grids; not the published numbers) into " if quick else "Reproducing into ")
        + str(paths.QUICK_OUTPUTS if quick else paths.OUTPUTS))
    for r in rows:
        log(f"  {r['name']:<20} {'run' if r['run'] else 'skip (inputs unchanged since its last good run)':<48} "
            f"{_minutes(r['expected'], r['upper_bound']) if r['run'] else ''}")
    known = [r["expected"] for r in todo if r["expected"] is not None]
    log(f"  {len(todo)} to run, expected {_minutes(sum(known), any(r['upper_bound'] for r in todo))} in all"
        + (f" ({len(todo) - len(known)} without a recorded time)" if len(known) < len(todo) else ""))
    failed, start = [], time.monotonic()
    for i, r in enumerate(todo, 1):
        remaining = sum(t["expected"] or 0 for t in todo[i - 1:])
        log(f"[{i}/{len(todo)}] {r['name']}: expected {_minutes(r['expected'], r['upper_bound'])}; elapsed "
            f"{(time.monotonic() - start) / 60:.0f} min; all done by ~"
            f"{(datetime.now() + timedelta(seconds=remaining)):%H:%M}")
        t0 = time.monotonic()
        quick_note = ("# Quick run: not the published numbers\n\n`make reproduce-quick` ran this notebook with reduced "
                      "prompts, tokens and grids, to check that the chain runs:\n\n```json\n"
                      + json.dumps(r["overrides"], indent=2) + "\n```\n")
        try:
            run_notebook(r["notebook"], r["out_dir"], r["overrides"], progress_bar=True,
                         extra_files={"QUICK_RUN.md": quick_note} if quick else None)
        except (NotebookFailed, ValueError, FileNotFoundError) as err:
            log(f"error: {err}")
            failed.append(r["name"])
            continue
        log(f"    {r['name']} done in {(time.monotonic() - t0) / 60:.1f} min")
    log(f"{len(todo) - len(failed)} of {len(todo)} notebooks ran in {(time.monotonic() - start) / 60:.0f} min"
        + (f"; failed: {', '.join(failed)}" if failed else ""))
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specrepro.reproduce", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="notebooks to consider (e.g. 03-latency); default all")
    ap.add_argument("--force", action="store_true", help="rerun even where the inputs are unchanged")
    ap.add_argument("--quick", action="store_true", help="reduced prompts and grids into outputs/quick/")
    ap.add_argument("--dry-run", action="store_true", help="print the plan only")
    args = ap.parse_args(argv)
    every = notebooks()
    unknown = sorted(set(args.names) - {nb.stem for nb in every})
    if unknown:
        print(f"error: no notebook(s) {unknown}; they are {[nb.stem for nb in every]}", file=sys.stderr)
        return 1
    selected = [nb for nb in every if not args.names or nb.stem in args.names]
    rows = plan(selected, quick=args.quick, force=args.force)
    if args.dry_run:
        for r in rows:
            print(f"{r['name']:<20} {'run' if r['run'] else 'skip':<5} {_minutes(r['expected'], r['upper_bound'])}")
        return 0
    return 1 if run_plan(rows, quick=args.quick) else 0


if __name__ == "__main__":
    sys.exit(main())
