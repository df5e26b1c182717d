"""Run a notebook with papermill into its own output folder, replacing the old folder only on success.

    python -m specrepro.pipeline notebooks/01-distribution.ipynb            # -> outputs/01-distribution/
    python -m specrepro.pipeline notebooks/01-distribution.ipynb -p smoke true --out /tmp/x
    python -m specrepro.pipeline notebooks/03-latency.ipynb -y "gammas: [1, 2, 4]"

The notebook runs in a staging folder (outputs/.staging/<name>/) with `out_dir` pointing there. When it finishes,
the staging folder gets the executed notebook, an HTML rendering, parameters.json (the parameters cell's defaults
merged with the overrides) and run.json (when it ran, its wall time, and the sha256 of its inputs, `inputs_key`,
which `specrepro.reproduce` compares to skip unchanged notebooks), then replaces outputs/<name>/ by rename. A
failed run is moved to outputs/.failed/<name>/ for inspection, the error is printed with the notebook's name, the
exit code is 1, and the previous good outputs/<name>/ stays untouched.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from . import paths
from .report import environment, write_json
from .summary import SUMMARY

RUN_RECORD = "run.json"


def input_files(notebook: Path) -> list[Path]:
    """Every file a notebook's results depend on besides its parameters: the notebook, the library's sources, the
    shipped drafts, prompt sets and papers' values, and the install pins (pyproject.toml, constraints.txt, and the
    Makefile, which pins torch and the packages holding the target and the data). The summary also depends on the
    other notebooks' published results (their metrics.json and tables)."""
    folders = (paths.MODELS, paths.PROMPTS, paths.PAPERS)
    shipped = [p for folder in folders if folder.exists() for p in sorted(folder.rglob("*")) if p.is_file()]
    pins = [p for p in (paths.ROOT / n for n in ("pyproject.toml", "constraints.txt", "Makefile")) if p.exists()]
    results = [p for p in sorted(paths.OUTPUTS.glob("[0-9][0-9]-*/*")) if p.parent.name != SUMMARY
               and (p.name == "metrics.json" or p.suffix == ".csv")] if Path(notebook).stem == SUMMARY else []
    return [Path(notebook).resolve(), *sorted(paths.PACKAGE.glob("*.py")), *shipped, *pins, *results]


def inputs_key(notebook: Path, parameters: dict[str, Any]) -> str:
    """sha256 over the input files (path and bytes), the effective parameters (out_dir excluded) and the machine
    and software it runs on (Python, OS and architecture, CPU, thread count, CUDA and GPU, installed versions of
    `report.PACKAGES`): a result measured elsewhere is not this machine's. The kernel build is left out (it is in
    environment.json): a kernel update on the same host does not void its results."""
    h = hashlib.sha256()
    for f in input_files(notebook):
        name = str(f.relative_to(paths.ROOT)) if f.is_relative_to(paths.ROOT) else f.name
        h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(json.dumps({k: v for k, v in parameters.items() if k != "out_dir"}, sort_keys=True, default=str).encode())
    machine = {k: v for k, v in environment().items()
               if k not in ("git_commit", "code_commit", "device", "dtype", "platform")}
    machine["os"] = f"{platform.system()} {platform.machine()}"
    h.update(json.dumps(machine, sort_keys=True, default=str).encode())
    return h.hexdigest()


class NotebookFailed(RuntimeError):
    """A notebook raised; the message names the notebook, the error and where the failed run was kept."""


def _parse_override(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected name=value, got {text!r}")
    return name, yaml.safe_load(value)  # "true" -> True, "3" -> 3, "[1, 2]" -> [1, 2]


def declared_parameters(notebook: Path) -> dict[str, Any]:
    """The parameters cell's names and default values, parsed by papermill."""
    import papermill as pm

    return {name: yaml.safe_load(p["default"]) if isinstance(p["default"], str) else p["default"]
            for name, p in pm.inspect_notebook(str(notebook)).items()}


QUIET_KERNEL = {  # environment of the notebook's kernel: progress bars and loader messages stay out of the outputs
    "TQDM_DISABLE": "1",  # tqdm (transformers' "Loading weights", datasets)
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "PYTHONWARNINGS": "ignore:IProgress not found",  # tqdm.auto's notice when ipywidgets is not installed
}


def _restore(added: dict) -> None:
    for k in added:
        os.environ.pop(k, None)


def run_notebook(notebook: str | os.PathLike, out_dir: str | os.PathLike | None = None,
                 parameters: dict[str, Any] | None = None, *, html: bool = True,
                 timeout_s: int | None = None, progress_bar: bool = False,
                 extra_files: dict[str, str] | None = None) -> Path:
    """Execute `notebook` into `out_dir` (default outputs/<notebook name>/) atomically. Returns out_dir.

    `progress_bar` shows papermill's per-cell progress (elapsed time and an estimate); `extra_files` (name ->
    text) are written into the folder before it replaces the old one. Raises ValueError for a parameter the
    notebook does not declare, NotebookFailed if a cell raises.
    """
    import papermill as pm

    notebook = Path(notebook).resolve()
    if not notebook.exists():
        raise FileNotFoundError(f"no notebook at {notebook}")
    name = notebook.stem
    out_dir = Path(out_dir) if out_dir is not None else paths.OUTPUTS / name
    declared = declared_parameters(notebook)
    overrides = dict(parameters or {})
    unknown = sorted(set(overrides) - set(declared))
    if unknown:
        raise ValueError(f"{name} has no parameter(s) {unknown}; it declares {sorted(declared)}")

    staging = out_dir.parent / ".staging" / out_dir.name
    failed = out_dir.parent / ".failed" / out_dir.name
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    overrides["out_dir"] = str(staging)
    executed = staging / f"{name}.ipynb"
    key = inputs_key(notebook, declared | dict(parameters or {}))  # before the run: what it ran on
    started, t0 = datetime.now().isoformat(timespec="seconds"), time.monotonic()
    quiet = {k: v for k, v in QUIET_KERNEL.items() if k not in os.environ}  # the caller's own settings win
    os.environ.update(quiet)  # the kernel inherits them: no progress bars or loader chatter in the saved notebook
    try:
        bar = dict(unit="cell", desc="Executing", disable=False) if progress_bar is True else progress_bar  # ours
        pm.execute_notebook(str(notebook), str(executed), parameters=overrides, kernel_name="python3",
                            progress_bar=bar, cwd=str(notebook.parent), execution_timeout=timeout_s)
    except Exception as err:  # a cell that raised, and also a kernel that died or a cell that timed out
        shutil.rmtree(failed, ignore_errors=True)
        failed.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(failed)
        where = (f"in cell {err.exec_count}: {err.ename}: {err.evalue}" if isinstance(err, pm.PapermillExecutionError)
                 else f"{type(err).__name__}: {err}")
        raise NotebookFailed(f"notebook {name} failed {where}\n"
                             f"  the failed run is kept in {failed}; {out_dir} was left as it was") from None
    finally:
        _restore(quiet)

    effective = declared | overrides
    effective["out_dir"] = str(out_dir)  # where the results live once the run is accepted
    write_json(staging / "parameters.json", effective)
    write_json(staging / RUN_RECORD, dict(inputs_key=key, started=started, wall_seconds=time.monotonic() - t0,
                                          overrides={k: v for k, v in overrides.items() if k != "out_dir"}))
    for fname, text in (extra_files or {}).items():
        (staging / fname).write_text(text)
    if html:
        _render_html(executed)
    paths.replace_dir(staging, out_dir)
    return out_dir


def _render_html(executed: Path) -> None:
    import nbformat
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4))
    executed.with_suffix(".html").write_text(body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specrepro.pipeline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebook")
    ap.add_argument("--out", help="output folder (default: outputs/<notebook name>/)")
    ap.add_argument("-p", "--param", action="append", default=[], type=_parse_override, metavar="NAME=VALUE",
                    help="override a parameter; the value is parsed as YAML (true, 3, 0.5, [1, 2])")
    ap.add_argument("-y", "--yaml", help="parameters as a YAML mapping, e.g. 'gammas: [1, 2, 4]'")
    ap.add_argument("--no-html", action="store_true", help="skip the HTML rendering")
    args = ap.parse_args(argv)
    params = dict(yaml.safe_load(args.yaml) or {}) if args.yaml else {}
    params.update(dict(args.param))
    try:
        out = run_notebook(args.notebook, args.out, params, html=not args.no_html)
    except (NotebookFailed, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{Path(args.notebook).name} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
