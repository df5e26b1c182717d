"""Every location the package reads or writes, and the one way it writes a file or a folder.

One module owns the layout, as showyourwork's `paths.py` does for a paper's repository: the repository root is
found from this file (never from the current directory), so a notebook, a test and `python -m` agree. It imports
nothing from the package, so every layer may import it.

Writes are atomic: a file or a folder is written under a temporary sibling name and renamed onto its place only
when it is complete, so a crash or a failed run never leaves half an output where a good one was.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: src/specrepro/paths.py -> ../..
PACKAGE = Path(__file__).resolve().parent  # src/specrepro: the library's sources
DATA = ROOT / "data"
MODELS = DATA / "models"  # shipped drafts, one folder each with its manifest.json (tracked)
PROMPTS = DATA / "prompts"  # the prompt sets and their checksums (tracked)
PAPERS = DATA / "papers"  # what the papers report, with where (tracked): the summary sets ours beside it
CACHE = DATA / "cache"  # rebuilt on demand, git-ignored: the converted target, distillation labels, continuations
NOTEBOOKS = ROOT / "notebooks"
OUTPUTS = ROOT / "outputs"  # one folder per notebook run; outputs/.staging and .failed hold runs in progress/failed
QUICK_OUTPUTS = OUTPUTS / "quick"  # `make reproduce-quick`: reduced runs that check the chain (git-ignored)


def tmp_sibling(path: str | os.PathLike) -> Path:
    """A temporary name beside `path`, unique to this process, to write into before renaming onto `path`."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def replace_dir(finished: Path, folder: Path) -> None:
    """Move the finished folder `finished` onto `folder`, replacing what was there. If another process put a folder
    there in the meantime, the last one wins; a reader never sees a half-written folder."""
    folder = Path(folder)
    old = tmp_sibling(folder.with_name(folder.name + ".old"))
    if folder.exists():
        folder.rename(old)
    os.replace(finished, folder)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def writing_dir(folder: str | os.PathLike) -> Iterator[Path]:
    """Write a folder atomically: yields an empty temporary folder; on success it replaces `folder`, on an
    exception it is removed and `folder` stays as it was.

        with writing_dir(MODELS / "draft-s") as tmp:
            (tmp / "manifest.json").write_text(...)
    """
    folder = Path(folder)
    tmp = tmp_sibling(folder)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, folder)


@contextmanager
def writing_file(path: str | os.PathLike) -> Iterator[Path]:
    """Write a file atomically: yields a temporary path beside `path` (its folder is created); on success it is
    renamed onto `path`, on an exception it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_sibling(path)
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
