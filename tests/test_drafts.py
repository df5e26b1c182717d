"""Draft construction: cut-vocabulary expansion is exact, storage round-trips, early exit and prompt lookup."""

import json

import pytest
import torch
from transformers import PhiForCausalLM

from specrepro import autoregressive_generate, speculative_generate
from specrepro import drafts as D
from specrepro.models import load_draft, load_shipped
from specrepro.paths import MODELS as MODELS_DIR
from specrepro.tiny import tiny_target


@pytest.fixture(scope="module")
def cut_draft():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 300, (4, 32), generator=g)
    topk = torch.randint(0, 300, (4, 32, 5), generator=g)
    kept = D.cut_vocabulary(tokens, topk, keep=63)
    spec = D.DraftSpec("t", d_model=16, layers=1, heads=2, keep=63)
    with torch.random.fork_rng():
        torch.manual_seed(1)
        cut = PhiForCausalLM(spec.config(64)).eval()
        with torch.no_grad():
            cut.lm_head.bias.normal_(0, 2)  # make the bias matter
    return cut, kept, tokens


def test_cut_vocabulary_is_by_frequency_then_id():
    tokens = torch.tensor([[5, 5, 5, 9, 9, 2]])
    topk = torch.tensor([[[9], [7], [7], [1], [1], [1]]])
    # corpus + target top-1 counts: 1 -> 3, 5 -> 3, 9 -> 3, 7 -> 2, 2 -> 1; ties go to the smaller id
    assert D.cut_vocabulary(tokens, topk, 4).tolist() == [1, 5, 9, 7]


def test_expanded_draft_reproduces_the_cut_distribution(cut_draft):
    cut, kept, tokens = cut_draft
    full = D.expand(cut, kept)
    table = D.full_to_cut(kept)
    x = tokens[:2, :20]
    with torch.no_grad():
        log_cut = cut(input_ids=table[x]).logits.log_softmax(-1)  # (2, 20, 64)
        log_full = full(input_ids=x).logits.log_softmax(-1)  # (2, 20, 49152)
    assert log_full.shape[-1] == D.TARGET_VOCAB
    # float32 log-sum-exp over 49,152 vs 64 ids
    assert torch.allclose(log_full[..., kept], log_cut[..., :63], atol=2e-4)
    unseen = torch.ones(D.TARGET_VOCAB, dtype=torch.bool)
    unseen[kept] = False
    assert torch.allclose(log_full[..., unseen].exp().sum(-1), log_cut[..., 63].exp(), rtol=1e-3, atol=0)
    # every unseen id has the same, small logit: none can outscore a token the draft learnt without its help
    assert torch.equal(log_full[..., unseen].amax(-1), log_full[..., unseen].amin(-1))


def test_unseen_input_ids_act_as_the_catch_all(cut_draft):
    cut, kept, _ = cut_draft
    full = D.expand(cut, kept)
    unseen_id = next(i for i in range(D.TARGET_VOCAB) if i not in set(kept.tolist()))
    with torch.no_grad():
        a = full(input_ids=torch.tensor([[int(kept[0]), unseen_id]])).logits[..., kept]
        b = cut(input_ids=torch.tensor([[0, 63]])).logits[..., :63]
    assert torch.allclose(a, b, atol=1e-5)


def test_small_draft_round_trips_through_bf16_storage(cut_draft, tmp_path):
    cut, kept, tokens = cut_draft
    D.save_small(tmp_path / "d", cut, kept, {"name": "d"})
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert manifest["kind"] == "small" and manifest["config"]["vocab_size"] == 64
    loaded = load_shipped(tmp_path / "d")
    with torch.no_grad():
        a = loaded(input_ids=tokens[:1]).logits.softmax(-1)
        b = D.expand(cut, kept)(input_ids=tokens[:1]).logits.softmax(-1)
    assert (a - b).abs().max() < 0.02  # bf16 weights
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temporary folder left behind


def test_early_exit_is_the_target_truncated():
    target = tiny_target(32, hidden_size=16, layers=3, dtype=torch.float32)
    ee = D.early_exit(target, 2)
    x = torch.tensor([[1, 4, 9, 2]])
    with torch.no_grad():
        h = target(input_ids=x, output_hidden_states=True).hidden_states[2]  # after 2 layers
        expected = target.lm_head(target.model.norm(h))
        assert torch.allclose(ee(input_ids=x).logits, expected, atol=1e-5)


def test_early_exit_for_training_unfreezes_only_the_fine_tuned_tensors():
    target = tiny_target(32, hidden_size=16, layers=3, dtype=torch.float32)
    ee = D.early_exit_for_training(target, 2)
    trainable = sorted(n for n, p in ee.named_parameters() if p.requires_grad)
    assert trainable == ["model.layers.1.mlp.down_proj.weight", "model.layers.1.self_attn.o_proj.weight",
                         "model.norm.weight"]
    assert all(p.requires_grad for p in target.parameters())  # the target itself is left as it was


def test_prompt_lookup_proposes_the_continuation_of_the_latest_match():
    pl = D.PromptLookupDraft(vocab_size=20, max_ngram=3)
    assert pl.predict([1, 2, 3, 9, 1, 2, 3]) == 9  # trigram match
    assert pl.predict([4, 5, 6, 4, 7, 6, 4]) == 7  # bigram "6 4" -> 7 (the latest match)
    assert pl.predict([3, 1, 2]) == 2  # no match: repeat the last token


def test_prompt_lookup_proposes_only_as_far_as_its_matches_reach():
    pl = D.PromptLookupDraft(vocab_size=20, max_ngram=3)
    # 1 2 3 | 9 -> "3 9" | 1 -> "9 1" | 2 -> "1 2" | 3 ...: every step finds a match
    assert pl.proposal_length([1, 2, 3, 9, 1, 2, 3], 3) == 3
    assert pl.proposal_length([3, 1, 2], 4) == 0  # nothing to copy: a plain decoding step
    assert pl.proposal_length([5, 6, 5], 4) == 4  # "5" -> 6, "5 6" -> 5, ...


def test_prompt_lookup_skips_speculation_without_a_match():
    target = tiny_target(16, seed=3)
    draft = D.PromptLookupDraft(vocab_size=16, max_ngram=2)
    x = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])  # no repeated token: the first iteration cannot propose
    r = speculative_generate(target, draft, x, gamma=3, max_new_tokens=12, temperature=0)
    assert r.stats.proposed[0] == 0 and r.stats.target_forwards[0][0] == 7  # prefill + pending, no drafts
    assert len(r.stats.proposed) == r.stats.target_calls
    assert sum(n for n, _ in r.stats.draft_forwards) <= sum(r.stats.proposed) + r.sequences.shape[1]


def test_prompt_lookup_draft_in_speculative_decoding_is_exact_greedy():
    target = tiny_target(16, seed=3)
    draft = D.PromptLookupDraft(vocab_size=16, max_ngram=2)
    x = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])
    ref = autoregressive_generate(target, x, max_new_tokens=30, temperature=0)
    got = speculative_generate(target, draft, x, gamma=3, max_new_tokens=30, temperature=0)
    assert torch.equal(got.sequences, ref.sequences)
    sampled = speculative_generate(target, draft, x, gamma=3, max_new_tokens=30,
                                   generator=torch.Generator().manual_seed(0))
    assert sampled.stats.new_tokens == 30


def test_lookup_hybrid_copies_on_long_matches_and_predicts_otherwise():
    target, small = tiny_target(16, seed=3), tiny_target(16, seed=4, layers=1)
    hybrid = D.LookupHybridDraft(small, max_ngram=3, min_ngram=2)
    seq = [1, 2, 3, 9, 1, 2]  # tail "1 2" occurred before: copy 3
    with torch.no_grad():
        q = hybrid(torch.tensor([seq]), logits_to_keep=2).logits[0]  # positions ending in "... 1" and "... 1 2"
        own = small(torch.tensor([seq])).logits[0, -2:]
    assert torch.allclose(q[0], own[0])  # "9 1": no 2-gram match, the small draft's logits
    assert q[1].argmax() == 3 and torch.isinf(q[1]).sum() == 15  # one-hot on the copied token
    x = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])
    ref = autoregressive_generate(target, x, max_new_tokens=20, temperature=0)
    got = speculative_generate(target, hybrid, x, gamma=3, max_new_tokens=20, temperature=0)
    assert torch.equal(got.sequences, ref.sequences)


def test_lookup_hybrid_round_trips_as_a_manifest(cut_draft, tmp_path):
    cut, kept, tokens = cut_draft
    D.save_small(tmp_path / "small", cut, kept, {"name": "small"})
    D.save_lookup_hybrid(tmp_path / "hyb", "small", 4, 2, {"name": "hyb"})
    loaded = load_shipped(tmp_path / "hyb")
    assert isinstance(loaded, D.LookupHybridDraft) and loaded.lookup.config.min_ngram == 2
    assert loaded.get_output_embeddings().weight.shape[0] == D.TARGET_VOCAB


SHIPPED = sorted(p.parent.name for p in MODELS_DIR.glob("*/manifest.json"))
SMALL = [n for n in SHIPPED if json.loads((MODELS_DIR / n / "manifest.json").read_text())["kind"] == "small"]


@pytest.mark.parametrize("name", SMALL)
def test_shipped_small_drafts_load_with_the_target_vocabulary(name):
    manifest = json.loads((MODELS_DIR / name / "manifest.json").read_text())
    assert {"corpus_key", "steps", "final_loss", "seed"} <= set(manifest)
    assert "measured" not in manifest  # how a draft was made lives in data/; what was measured of it, in outputs/
    model = load_draft(name)
    assert model.config.vocab_size == D.TARGET_VOCAB
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, D.TARGET_VOCAB) and torch.isfinite(logits).all()


def test_shipped_drafts_fit_the_size_budget():
    # the drafts ship in the repository (the ladder stores only what differs from the target). The budget was 25 MB
    # until the feature draft (10.4 MB: a decoder layer at the target's width, in bf16) came, 45 MB with its
    # retraining on sampled answers (feature-1-s8) beside it, and 62 MB with feature-2 (two layers, 17 MB), which asks
    # 06's draft-size question of the feature draft against feature-1 (same recipe). Once 00 and 01 report
    # feature-1-s8 too, feature-1 and feature-2 could be retrained on its recipe and feature-1 go.
    total = sum(f.stat().st_size for f in MODELS_DIR.rglob("*") if f.is_file())
    assert total <= 62e6


def test_unknown_draft_name_lists_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match="no draft named 'nope'"):
        load_draft("nope")
