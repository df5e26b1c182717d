"""Prompt sets, held-out splits and quality metrics."""

import json

import pytest

from specrepro import data


def test_prompt_sets_load_with_checksums():
    code, text = data.load_prompts("code"), data.load_prompts("text")
    assert len(code) == 164 and code[0]["task_id"] == "HumanEval/0"
    assert len(text) == len(data.HELD_OUT_PLAYS) * data.TEXT_PER_PLAY
    sums = json.loads((data.PROMPTS_DIR / "checksums.json").read_text())
    assert set(sums) == {"code.jsonl", "text.jsonl"}
    with pytest.raises(ValueError, match="task must be"):
        data.load_prompts("xsum")


def test_rebuilding_the_prompt_sets_reproduces_the_checksums(tmp_path):
    assert data.build_prompt_sets(tmp_path) == json.loads((data.PROMPTS_DIR / "checksums.json").read_text())


def test_tampered_prompt_file_is_detected(tmp_path):
    data.build_prompt_sets(tmp_path)
    (tmp_path / "code.jsonl").write_text((tmp_path / "code.jsonl").read_text().replace("def ", "def  ", 1))
    with pytest.raises(ValueError, match="does not match its checksum"):
        data.load_prompts("code", tmp_path)


def test_held_out_plays_and_humaneval_never_enter_the_training_corpus():
    docs = data.training_documents(seed=0)
    text_docs = [d for kind, d in docs if kind == "text"]
    titles = {d[0].split("Shakespeare's ")[1].split(".")[0].lower() for d in text_docs}
    assert not titles & set(data.HELD_OUT_PLAYS)
    passages = [ex["passage"] for ex in data.text_examples()[:10]]
    corpus = "\n".join(d[0] + d[1] for d in text_docs)
    assert not any(p in corpus for p in passages)
    code = "\n".join(d for kind, d in docs if kind == "code")
    assert "def has_close_elements" not in code and len(data.stdlib_files()) > 300


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
