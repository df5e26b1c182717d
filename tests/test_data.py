"""Prompt sets, held-out splits and quality metrics."""

import json
import math

import pytest

from specrepro import data, paths


def test_prompt_sets_load_with_checksums():
    code, text = data.load_prompts("code"), data.load_prompts("text")
    assert len(code) == 164 and code[0]["task_id"] == "HumanEval/0"
    assert len(text) == len(data.HELD_OUT_PLAYS) * data.TEXT_PER_PLAY
    sums = json.loads((paths.PROMPTS / "checksums.json").read_text())
    assert set(sums) == {"code.jsonl", "text.jsonl"}
    with pytest.raises(ValueError, match="task must be"):
        data.load_prompts("xsum")


def test_rebuilding_the_prompt_sets_reproduces_the_checksums(tmp_path):
    assert data.build_prompt_sets(tmp_path) == json.loads((paths.PROMPTS / "checksums.json").read_text())


def test_tampered_prompt_file_is_detected(tmp_path):
    data.build_prompt_sets(tmp_path)
    (tmp_path / "code.jsonl").write_text((tmp_path / "code.jsonl").read_text().replace("def ", "def  ", 1))
    with pytest.raises(ValueError, match="does not match its checksum"):
        data.load_prompts("code", tmp_path)


def test_held_out_plays_and_humaneval_never_enter_the_distillation_requests():
    requests = data.distillation_requests(seed=0)
    text = [r for kind, r in requests if kind == "text"]
    code = [r for kind, r in requests if kind == "code"]
    titles = {r.split("Shakespeare's ")[1].split(".")[0].lower() for r in text}
    assert not titles & set(data.HELD_OUT_PLAYS) and len(titles) > 30
    assert len(code) > 1000 and all(r.startswith("Complete this Python function.") for r in code)
    stubs = [ex["prompt"].strip() for ex in data.code_examples()]
    assert not any(stub in r for r in code for stub in stubs)


def test_code_prompts_go_through_the_chat_template():
    from specrepro.models import load_tokenizer

    tok = load_tokenizer()
    ex = data.code_examples()[0]
    text = data.format_prompt(tok, "code", ex)
    assert text.startswith("<|im_start|>") and ex["prompt"].rstrip() in text
    assert text.endswith("<|im_start|>assistant\n")


def test_encode_prompt_is_the_formatted_prompt_as_one_row_of_ids():
    import torch

    from specrepro.models import load_tokenizer

    tok = load_tokenizer()
    for task, ex in (("code", data.code_examples()[0]), ("text", data.text_examples()[0])):
        ids = data.encode_prompt(tok, task, ex)
        assert ids.dtype == torch.long and ids.shape[0] == 1 and ids.shape[1] > 20
        assert tok.decode(ids[0]) == data.format_prompt(tok, task, ex)  # every character of the prompt, no more
        assert int(ids[0, 0]) == tok.convert_tokens_to_ids("<|im_start|>")


def test_extract_code_takes_the_first_fenced_block():
    answer = "Sure:\n```python\ndef f():\n    return 1\n```\nIt returns 1."
    assert data.extract_code(answer) == "def f():\n    return 1\n"
    assert data.extract_code("```\nx = 1\n```") == "x = 1\n"
    # cut before the fence closed
    assert data.extract_code("```python\ndef f():\n    return 1") == "def f():\n    return 1"
    assert data.extract_code("    return 1\n") == "    return 1\n"  # no fence: the answer itself


def test_pass_at_1_accepts_a_full_function_in_a_chat_answer():
    ex = data.code_examples()[2]  # truncate_number
    answer = ("```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```\n\n"
              "This function returns the decimal part.")
    assert data.passes_tests(ex, answer)
    assert not data.passes_tests(ex, answer.replace("% 1.0", "// 1.0"))


def test_pass_at_1_runs_the_tests():
    ex = data.code_examples()[2]  # truncate_number
    good = "    return number % 1.0\n"
    assert data.passes_tests(ex, good)
    assert not data.passes_tests(ex, "    return number\n")
    assert not data.passes_tests(ex, "    while True:\n        pass\n", timeout_s=2)
    # the completion is cut at the next top-level statement, as HumanEval does
    assert data.passes_tests(ex, good + "\ndef junk(:\n")


def test_rouge2():
    assert data.rouge2_f1("the cat sat on the mat", "the cat sat on the mat") == 1.0
    assert data.rouge2_f1("a b c", "d e f") == 0.0
    # candidate bigrams {the cat, cat sat}, reference {the cat, cat ran}: P = R = 1/2
    assert data.rouge2_f1("The cat sat", "the cat ran") == pytest.approx(0.5)


def test_answer_scores_are_pass_at_1_for_code_and_rouge_for_text():
    ex = [e for e in data.load_prompts("code") if e["entry_point"] == "truncate_number"][0]
    assert data.answer_scores("code", ex, "    return number % 1.0\n")["pass_at_1"] == 1.0
    assert data.answer_scores("code", ex, "    return number\n")["pass_at_1"] == 0.0
    assert data.answer_scores("text", {"reference": "the cat ran"}, "The cat sat")["rouge2"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="task must be"):
        data.answer_scores("xsum", {}, "")


def test_copied_share_counts_tokens_whose_ngram_is_in_the_prompt():
    prompt = [1, 2, 3, 4, 5, 6]
    assert data.copied_share(prompt, [7, 8, 9], n=2) == 0.0
    assert data.copied_share(prompt, [2, 3, 4], n=2) == pytest.approx(2 / 3)  # (6, 2) is not in the prompt
    assert data.copied_share(prompt, [7], n=1) == 0.0 and data.copied_share(prompt, [3], n=1) == 1.0
    assert data.copied_share([5, 6, 5, 6, 5], [6, 5, 6, 5], n=4) == 1.0  # an echo, n-grams across the boundary
    assert math.isnan(data.copied_share(prompt, [], n=2))
    with pytest.raises(ValueError, match="n must be"):
        data.copied_share(prompt, [1], n=0)


def test_assertions_are_counted_one_by_one_and_pass_at_1_needs_them_all():
    ex = data.load_prompts("code")[0]  # has_close_elements: 7 assert statements
    right = ("```python\ndef has_close_elements(numbers, threshold):\n"
             "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```")
    assert data.assertions_passed(ex, right) == (7, 7, True)
    assert data.assertions_passed(ex, "    return True\n") == (4, 7, False)  # the four cases expecting True
    assert data.assertions_passed(ex, "    raise ValueError\n") == (0, 7, False)
    assert data.assertions_passed(ex, "    while True:\n        pass\n", timeout_s=2) == (0, 7, False)
    assert data.answer_scores("code", ex, right) == dict(assert_share=1.0, pass_at_1=1.0, parses=1.0)
    assert data.answer_scores("code", ex, "def (:") == dict(assert_share=0.0, pass_at_1=0.0, parses=0.0)
    # a statement in a loop passes only if it holds every time
    looped = dict(ex, test="def check(candidate):\n    for x in (1, 2):\n        assert candidate([x], 0.5) == 1\n")
    assert data.assertions_passed(looped, "    return 1\n") == (1, 1, True)
    assert data.assertions_passed(looped, "    return numbers\n") == (0, 1, False)


def test_rouge1_and_text_scores():
    assert data.rouge1_f1("the cat sat", "the cat sat") == 1.0
    assert data.rouge1_f1("the dog", "a cat") == 0.0
    assert data.rouge1_f1("The cat sat", "the cat ran") == pytest.approx(2 / 3)
    scores = data.answer_scores("text", {"reference": "the cat ran"}, "The cat sat")
    assert scores == dict(rouge1=pytest.approx(2 / 3), rouge2=pytest.approx(0.5))
    assert set(scores) == set(data.QUALITY_METRICS["text"])


def test_the_assertion_count_cannot_be_faked_or_flooded_by_the_answer():
    ex = data.load_prompts("code")[0]  # has_close_elements: 7 assert statements
    forged = ("    for i in range(7):\n        print('tally reached', i)\n"
              "    globals()['__tally_tally__'] = lambda i, t: None\n    return True\n")
    assert data.assertions_passed(ex, forged) == (4, 7, False)  # as `return True` alone
    noisy = ("```python\ndef has_close_elements(numbers, threshold):\n    print('x' * 100_000)\n"
             "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```")
    assert data.assertions_passed(ex, noisy) == (7, 7, True)  # 700 kB of its own output loses no marker
    constant = dict(ex, test="def check(candidate):\n    assert True, 'free'\n"
                             "    assert candidate([1.0], 0.5) is False\n")
    assert data.assertion_program(constant, "    return False\n")[1] == 1  # `assert True` is not counted
    assert data.assertions_passed(constant, "    return True\n") == (0, 1, False)


def test_prompts_apart_never_share_a_prompt_with_the_reported_set():
    from specrepro.acceptance import eval_prompts, prompts_apart

    for task in ("code", "text"):
        reported = {e["task_id"] for e in eval_prompts(task, 24, 0)}
        apart = prompts_apart(task, 8, 1, reported)
        assert len(apart) == 8 and not reported & {e["task_id"] for e in apart}
        assert [e["task_id"] for e in apart] == [e["task_id"] for e in prompts_apart(task, 8, 1, reported)]
    every = {e["task_id"] for e in eval_prompts("code", 10_000, 0)}
    with pytest.raises(ValueError, match="nothing is left"):
        prompts_apart("code", 1, 0, every)
