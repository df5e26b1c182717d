"""Every notebook runs in smoke mode through the same pipeline `make reproduce` uses; failures never clobber."""

import json
from pathlib import Path

import nbformat
import pytest

from specrepro.paths import ROOT as REPO_ROOT
from specrepro.pipeline import NotebookFailed, declared_parameters, main, run_notebook
from specrepro.report import Report, write_json

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_clean_with_smoke_and_out_dir(nb):
    cells = nbformat.read(nb, as_version=4).cells
    code = [c for c in cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "strip outputs before committing"
    assert cells[0].cell_type == "markdown"
    declared = declared_parameters(nb)
    assert {"smoke", "out_dir"} <= set(declared)
    params_cell = next(c for c in cells if "parameters" in c.metadata.get("tags", []))
    assigned = [line.split("=")[0].strip() for line in params_cell.source.splitlines() if "=" in line]
    assert sorted(assigned) == sorted(declared), "papermill could not parse every parameter line"
    assert all("#" in line for line in params_cell.source.splitlines() if line.strip()), "document every parameter"
    assert not any(line.lstrip().startswith(("def ", "class ")) for c in code for line in c.source.splitlines()), \
        "functions belong in the library, with a test"


@pytest.mark.notebook
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_smoke_run(nb, tmp_path):
    out = run_notebook(nb, tmp_path / nb.stem, {"smoke": True}, html=False)
    params = json.loads((out / "parameters.json").read_text())
    assert params["smoke"] is True and params["out_dir"] == str(out)
    assert json.loads((out / "metrics.json").read_text())
    env = json.loads((out / "environment.json").read_text())
    assert env["packages"]["torch"] and env["git_commit"]
    assert isinstance(env["cpu_features"], list) and env["torch_cpu_capability"]  # the host's kernels, named
    assert (out / f"{nb.stem}.ipynb").exists()
    assert not (tmp_path / ".staging" / nb.stem).exists()


def _notebook(path: Path, body: str) -> Path:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("smoke = False\nout_dir = 'x'\nfail = False")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_failed_run_keeps_previous_good_output(tmp_path, capsys):
    nb = _notebook(tmp_path / "99-demo.ipynb", "import pathlib\n"
                   "pathlib.Path(out_dir, 'metrics.json').write_text('{\"ok\": 1}')\n"
                   "assert not fail, 'planted failure'")
    out = tmp_path / "out" / "99-demo"
    run_notebook(nb, out, {}, html=True)
    assert (out / "99-demo.html").exists() and json.loads((out / "metrics.json").read_text()) == {"ok": 1}
    with pytest.raises(NotebookFailed, match="notebook 99-demo failed.*AssertionError: planted failure"):
        run_notebook(nb, out, {"fail": True})
    assert json.loads((out / "metrics.json").read_text()) == {"ok": 1}  # the good run is still there
    assert (tmp_path / "out" / ".failed" / "99-demo" / "99-demo.ipynb").exists()
    assert main([str(nb), "--out", str(out), "-p", "fail=true"]) == 1
    assert "planted failure" in capsys.readouterr().err


def test_unknown_parameter_is_refused_before_running(tmp_path):
    nb = _notebook(tmp_path / "98-demo.ipynb", "pass")
    with pytest.raises(ValueError, match=r"no parameter\(s\) \['smok'\]; it declares \['fail', 'out_dir', 'smoke'\]"):
        run_notebook(nb, tmp_path / "out", {"smok": True})


def test_report_writes_json_without_nan(tmp_path):
    r = Report(tmp_path / "r", device="cpu")
    r.metrics(a=float("nan"), b=[1.5, float("inf")])
    assert json.loads((tmp_path / "r" / "metrics.json").read_text()) == {"a": None, "b": [1.5, None]}
    write_json(tmp_path / "x.json", {"t": 1})
    assert not list(tmp_path.glob("*.tmp"))


def test_git_commit_is_dirty_for_code_changes_not_for_waiting_outputs(tmp_path, monkeypatch):
    import subprocess

    from specrepro import paths, report

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "metrics.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    assert not report.git_commit().endswith("+dirty")
    (tmp_path / "outputs" / "metrics.json").write_text('{"a": 1}')
    assert not report.git_commit().endswith("+dirty")
    (tmp_path / "README.md").write_text("prose\n")
    git("add", "README.md")
    assert not report.git_commit().endswith("+dirty")  # prose being edited changes no result
    (tmp_path / "code.py").write_text("x = 2\n")
    assert report.git_commit().endswith("+dirty")
    assert report.code_commit(report.git_commit()) == report.git_commit()  # uncommitted code is its own state


def test_code_commit_moves_with_code_not_with_results_or_prose(tmp_path, monkeypatch):
    import subprocess

    from specrepro import paths, report

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    def commit(path, text):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
        git("add", path)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", path)
        return git("rev-parse", "HEAD")

    git("init", "-q")
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    code = commit("src/code.py", "x = 1\n")
    assert report.code_commit() == code
    results = commit("outputs/05-batch/metrics.json", "{}")
    commit("docs/results.md", "05 ran\n")
    commit("README.md", "05 ran\n")
    assert report.code_commit() == code and report.code_commit(results) == code
    newer = commit("notebooks/05-batch.ipynb", "{}")
    assert report.code_commit() == newer and report.code_commit(results) == code
    assert report.code_commit("0" * 40) == "unknown"  # not in this history


def test_reproduce_skips_unchanged_notebooks_and_reruns_changed_or_forced(tmp_path, monkeypatch, capsys):
    from specrepro import paths, reproduce

    monkeypatch.setattr(paths, "OUTPUTS", tmp_path / "outputs")
    monkeypatch.setattr(paths, "QUICK_OUTPUTS", tmp_path / "outputs" / "quick")
    monkeypatch.setitem(reproduce.QUICK, "97-demo", {"fail": False})
    body = "import pathlib\npathlib.Path(out_dir, 'metrics.json').write_text('{}')\nassert not fail, 'planted'"
    nb = _notebook(tmp_path / "97-demo.ipynb", body)
    first = reproduce.plan([nb], quick=False, force=False)
    assert first[0]["run"] and first[0]["expected"] is None
    assert reproduce.run_plan(first, quick=False, log=lambda m: None) == []
    record = json.loads((tmp_path / "outputs" / "97-demo" / "run.json").read_text())
    assert record["wall_seconds"] > 0 and record["inputs_key"] == first[0]["key"]
    again = reproduce.plan([nb], quick=False, force=False)
    assert not again[0]["run"] and again[0]["expected"] == record["wall_seconds"]
    assert reproduce.plan([nb], quick=False, force=True)[0]["run"]
    quick = reproduce.plan([nb], quick=True, force=False)  # other parameters, other folder: runs
    assert quick[0]["run"] and quick[0]["upper_bound"] and quick[0]["out_dir"] == tmp_path / "outputs/quick/97-demo"
    assert reproduce.run_plan(quick, quick=True, log=lambda m: None) == []
    assert "not the published numbers" in (quick[0]["out_dir"] / "QUICK_RUN.md").read_text()
    _notebook(nb, body + "\n# an edit")  # the notebook changed: its key changed
    assert reproduce.plan([nb], quick=False, force=False)[0]["run"]
    _notebook(nb, body.replace("assert not fail", "assert fail"))  # a failing run keeps the good output
    assert reproduce.run_plan(reproduce.plan([nb], quick=False, force=False), quick=False, log=print) == ["97-demo"]
    assert "planted" in capsys.readouterr().out
    assert json.loads((tmp_path / "outputs" / "97-demo" / "run.json").read_text()) == record
    # a summary of the others' outputs reruns when one of them runs, though its own inputs are unchanged
    monkeypatch.setattr(reproduce, "READS_OUTPUTS", {"98-summary"})
    summary_nb = _notebook(tmp_path / "98-summary.ipynb", body)
    assert reproduce.run_plan(reproduce.plan([summary_nb], quick=False, force=False), quick=False,
                              log=lambda m: None) == []
    assert not reproduce.plan([summary_nb], quick=False, force=False)[0]["run"]
    _notebook(nb, body)
    assert [r["run"] for r in reproduce.plan([nb, summary_nb], quick=False, force=False)] == [True, True]


def test_the_inputs_key_covers_the_machine_but_not_its_kernel_build(tmp_path, monkeypatch):
    import platform

    import torch

    from specrepro.pipeline import inputs_key

    nb = _notebook(tmp_path / "96-key.ipynb", "x = 1")
    key = inputs_key(nb, {"a": 1})
    assert inputs_key(nb, {"a": 2}) != key
    monkeypatch.setattr(platform, "platform", lambda *a, **k: "Linux-9.9.9-another-kernel-build")
    assert inputs_key(nb, {"a": 1}) == key  # a kernel update on the same host
    from specrepro import report

    monkeypatch.setattr(report, "code_commit", lambda commit="HEAD": "another commit")
    assert inputs_key(nb, {"a": 1}) == key  # the files themselves are hashed: a commit elsewhere voids nothing
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert inputs_key(nb, {"a": 1}) != key  # another thread count: another machine
    finally:
        torch.set_num_threads(threads)


def test_reproduce_refuses_unknown_notebooks(capsys):
    from specrepro import reproduce

    assert reproduce.main(["99-nonexistent", "--dry-run"]) == 1
    assert "no notebook(s) ['99-nonexistent']" in capsys.readouterr().err
    assert set(reproduce.QUICK) == {nb.stem for nb in NOTEBOOKS}  # every notebook has a quick configuration
    for nb in NOTEBOOKS:
        assert set(reproduce.QUICK[nb.stem]) <= set(declared_parameters(nb))


def test_the_kernel_runs_quiet_and_the_callers_environment_is_left_as_it_was(tmp_path, monkeypatch):
    import os

    from tqdm import tqdm

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")  # a caller's own setting wins
    nb = _notebook(tmp_path / "97-demo.ipynb", "import json, os, pathlib\n"
                   "from tqdm import tqdm\n"
                   "pathlib.Path(out_dir, 'metrics.json').write_text(json.dumps(dict(\n"
                   "    tqdm=os.environ.get('TQDM_DISABLE'), verbosity=os.environ.get('TRANSFORMERS_VERBOSITY'),\n"
                   "    bar_disabled=tqdm(range(2)).disable)))")
    out = run_notebook(nb, tmp_path / "out" / "97-demo", {})
    seen = json.loads((out / "metrics.json").read_text())
    assert seen == {"tqdm": "1", "verbosity": "info", "bar_disabled": True}
    assert "TQDM_DISABLE" not in os.environ and not tqdm(range(2)).disable  # restored for the caller


def test_formatted_tables_fold_intervals_in_and_show_every_column():
    import numpy as np
    import pandas as pd

    from specrepro.report import formatted

    df = pd.DataFrame({f"c{i}": [i] for i in range(30)} | dict(speedup=[1.2961], speedup_lo=[1.0868],
                                                              speedup_hi=[1.5607]))
    html = formatted(df, {"speedup": ("speedup_lo", "speedup_hi")}).to_html()
    assert "1.30 [1.09, 1.56]" in html and "c29" in html and "speedup_lo" not in html
    one = pd.DataFrame(dict(speedup=[0.82], speedup_lo=[np.nan], speedup_hi=[np.nan]))
    assert "0.82 (no interval)" in formatted(one, {"speedup": ("speedup_lo", "speedup_hi")}).to_html()
