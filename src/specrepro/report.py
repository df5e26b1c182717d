"""Where a notebook's results go: figures, tables and metrics, each beside the environment that produced them.

A notebook creates one `Report(out_dir, ...)` in its setup cell and sends every figure and table through it.
`environment.json` records package versions, device, dtype, threads, the git commit and the code commit (the last
commit that changed code, `code_commit`), so any figure can be traced to the code and machine that drew it; the
pipeline (`specrepro.pipeline`) adds `parameters.json`.
Every file is written through `paths.writing_file` (a temporary name, then a rename), so a crash never leaves half a
file.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from . import paths
from .timing import cpu_features
from .verdicts import fmt_ci

PACKAGES = ("specrepro", "torch", "transformers", "accelerate", "datasets", "numpy", "scipy", "pandas",
            "seaborn", "matplotlib", "papermill", "gguf")


#: What no notebook computes with: results and prose. Commits that change only these leave every run's computation
#: as it was (`code_commit`), and editing them does not make a run's checkout dirty (`git_commit`).
NOT_CODE = ("outputs", "docs", "README.md", "CONTRIBUTING.md")
_CODE = (".", *(f":!{p}" for p in NOT_CODE))  # git's pathspec for everything else


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=paths.ROOT, capture_output=True, text=True, check=True).stdout.strip()


def git_commit() -> str:
    """The checkout's commit, with '+dirty' if tracked files outside `NOT_CODE` (code, notebooks, data) differ from
    it; 'unknown' outside git. Other notebooks' results waiting in outputs/ to be committed, and prose being edited,
    do not change what a run computes, so they do not count."""
    try:
        sha = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", *_CODE)
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def code_commit(commit: str = "HEAD") -> str:
    """The code a run at `commit` computed with, named by the last commit at or before it that changed anything
    outside `NOT_CODE`. A full `make reproduce` takes longer than one sitting; its folders, committed one by one,
    sit at different commits, yet share one code commit if no code changed between their runs, and then they are
    results of one commit in every sense that matters. `commit` as `git_commit` writes it: a '+dirty' one ran
    uncommitted code and is returned as it is; 'unknown' outside git or for a commit not in this history."""
    if commit.endswith("+dirty"):
        return commit
    try:
        return _git("log", "-1", "--format=%H", commit, "--", *_CODE) or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment(device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """A record of the software and hardware a result came from."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "cpu_features": cpu_features(),  # the instruction sets that decide which kernels run (timing.ISA_FLAGS)
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the kernel level torch dispatches to
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "device": str(device) if device is not None else None,
        "dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
        "git_commit": (commit := git_commit()),
        "code_commit": code_commit(commit),
        "packages": versions,
    }
    return env


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf
    if isinstance(value, torch.Tensor):
        return _jsonable(value.tolist())
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _jsonable(value.item())
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    with paths.writing_file(path) as tmp:
        tmp.write_text(json.dumps(_jsonable(data), indent=2, sort_keys=True) + "\n")


class Report:
    """One notebook run's output folder."""

    def __init__(self, out_dir: str | os.PathLike, *, device=None, dtype=None):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env = environment(device, dtype)
        write_json(self.dir / "environment.json", self.env)
        self._metrics: dict[str, Any] = {}

    def figure(self, fig, name: str, formats: tuple[str, ...] = ("png", "svg")) -> Path:
        """Save a matplotlib figure as PNG (and SVG, or PDF, for print)."""
        for ext in formats:
            with paths.writing_file(self.dir / f"{name}.{ext}") as tmp:
                fig.savefig(tmp, dpi=130, bbox_inches="tight", format=ext)
        return self.dir / f"{name}.png"

    def table(self, df, name: str) -> Path:
        """Save a pandas DataFrame as CSV."""
        path = self.dir / f"{name}.csv"
        with paths.writing_file(path) as tmp:
            df.to_csv(tmp, index=False)
        return path

    def latex(self, df, name: str, **kw) -> Path:
        """Save a pandas DataFrame as a LaTeX tabular (booktabs rules), ready to paste into a write-up."""
        path = self.dir / f"{name}.tex"
        with paths.writing_file(path) as tmp:
            tmp.write_text(df.to_latex(index=False, escape=True, **kw))
        return path

    def metrics(self, **values: Any) -> dict[str, Any]:
        """Merge values into metrics.json (rewritten in full each time) and return everything recorded so far."""
        self._metrics.update(values)
        write_json(self.dir / "metrics.json", self._metrics)
        return dict(self._metrics)


def formatted(df, intervals: dict[str, tuple[str, str]] | None = None, digits: int = 2):
    """A table for reading in a rendered notebook: each column of `intervals` shown with its interval as
    "1.30 [1.09, 1.56]" (its bound columns folded in; "(no interval)" where a bound is missing), other numbers
    rounded to `digits`, as a pandas Styler, which renders every row and column (no truncation) without the index.
    The CSV written by `Report.table` keeps the raw columns."""
    out = df.copy()
    for col, (lo, hi) in (intervals or {}).items():
        out[col] = [fmt_ci(v, a, z, unit="", digits=digits)
                    if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)) else ""
                    for v, a, z in zip(df[col], df[lo], df[hi])]
        out = out.drop(columns=[lo, hi])
    return out.style.format(precision=digits, na_rep="").hide(axis="index")
