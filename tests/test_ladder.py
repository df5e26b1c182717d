"""The tuned-lens ladder: the draft reads the stream it was trained on, its full-vocabulary q is the cut one spread
exactly, it decodes in the loops (greedy = the target's when it agrees), it round-trips through storage, and the
training lowers the held-out loss."""

import math

import pytest
import torch

from specrepro import autoregressive_generate, speculative_generate
from specrepro import ladder as L
from specrepro.drafts import TARGET_VOCAB
from specrepro.lens import LensDraft, load_lens, save_lens
from specrepro.tiny import tiny_target
from specrepro.train import TrainConfig


@pytest.fixture(scope="module")
def target():
    return tiny_target(TARGET_VOCAB, hidden_size=16, layers=3, dtype=torch.float32, seed=0)


def _kept(n=200):
    return torch.arange(0, 2 * n, 2)  # every other id of the first 2n


def test_features_are_the_drafts_own_residual_stream(target):
    tokens = torch.randint(0, 400, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[0, 3:9], mask[1, 5:12] = True, True
    streams = L.residual_streams(target, tokens, mask, (1, 2), batch_rows=1)
    for k in (1, 2):
        draft = LensDraft(target, k, _kept())
        h = draft.body(input_ids=tokens).last_hidden_state  # (B, T, d)
        torch.testing.assert_close(streams[k], h[mask], rtol=1e-5, atol=1e-5)
    assert streams[1].shape == (13, 16)


def test_full_logits_spread_the_catch_all_over_unseen_ids(target):
    draft = LensDraft(target, 1, _kept())
    with torch.no_grad():
        draft.bias.normal_(0, 2, generator=torch.Generator().manual_seed(1))
        z = draft.cut_logits(torch.randn(3, 16, generator=torch.Generator().manual_seed(2)))  # (3, keep + 1)
        p_cut, p_full = z.softmax(-1), draft.full_logits(z).softmax(-1)  # (3, keep + 1), (3, V)
    kept = _kept()
    unseen = torch.ones(TARGET_VOCAB, dtype=torch.bool)
    unseen[kept] = False
    torch.testing.assert_close(p_full[:, kept], p_cut[:, :-1], rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(p_full[:, unseen].sum(-1), p_cut[:, -1], rtol=1e-4, atol=1e-7)
    assert draft.full_logits(z)[:, unseen].max() <= z[:, -1].max() - math.log(int(unseen.sum())) + 1e-4


def test_lens_draft_decodes_in_the_loops_and_round_trips(target, tmp_path):
    draft = LensDraft(target, 2, _kept())
    with torch.no_grad():
        draft.lens.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(3))
    prompt = torch.tensor([[2, 4, 6, 8, 10]])
    ar = autoregressive_generate(target, prompt, max_new_tokens=12, temperature=0)
    sd = speculative_generate(target, draft, prompt, gamma=3, max_new_tokens=12, temperature=0)
    assert sd.sequences.tolist() == ar.sequences.tolist()  # greedy speculative decoding is the target's greedy text
    assert sd.stats.draft_calls > 0
    save_lens(tmp_path / "lens-2", draft, {"name": "lens-2"})
    back = load_lens(tmp_path / "lens-2", target)
    for k, v in draft.trainable().items():
        torch.testing.assert_close(back.trainable()[k], v.to(torch.bfloat16).float())
    assert back.layers == 2 and back.kept.tolist() == _kept().tolist()


def test_the_zero_layer_lens_reads_the_embedding_and_needs_no_kv_cache(target, tmp_path):
    draft = LensDraft(target, 0, _kept())
    with torch.no_grad():
        draft.lens.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(5))
    tokens = torch.randint(0, 400, (2, 9), generator=torch.Generator().manual_seed(6))
    streams = L.residual_streams(target, tokens, torch.ones(2, 9, dtype=torch.bool), (0,))
    torch.testing.assert_close(streams[0], target.get_input_embeddings()(tokens).flatten(0, 1))
    # the logits at a position depend on its token alone: fed whole or one token at a time (with its cache), alike
    whole = draft(tokens).logits  # (2, 9, V)
    cache = draft.make_cache()
    last = [draft(tokens[:, t:t + 1], cache=cache, logits_to_keep=1).logits for t in range(9)]
    torch.testing.assert_close(torch.cat(last, 1), whole)
    assert cache.get_seq_length() == 9 and draft.weights_read() == 16 * 16 + 201 * 16
    # in the loops: greedy speculative decoding is the target's greedy text, one row or a ragged batch
    prompts = torch.tensor([[2, 4, 6, 8, 10], [0, 0, 3, 5, 7]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    ar = autoregressive_generate(target, prompts, attention_mask=mask, max_new_tokens=10, temperature=0)
    sd = speculative_generate(target, draft, prompts, attention_mask=mask, gamma=3, max_new_tokens=10,
                              temperature=0, check_invariants=True)
    assert sd.sequences.tolist() == ar.sequences.tolist() and sd.stats.draft_calls > 0
    save_lens(tmp_path / "lens-0", draft, {"name": "lens-0"})
    assert load_lens(tmp_path / "lens-0", target).layers == 0


def test_bad_ladder_inputs_are_refused(target):
    with pytest.raises(ValueError, match="layers must be in 0..2"):
        LensDraft(target, 3, _kept())
    with pytest.raises(ValueError, match="cut head keeps"):
        LensDraft(target, 1, torch.arange(TARGET_VOCAB))


def _teacher_labels(target, rows: int, cols: int, first: int, seed: int) -> dict:
    """A distillation set as `distill.target_answers` gives it: random token rows, labelled from position `first` on
    with the target's own top-8 next-token log-probabilities."""
    tokens = torch.randint(0, 400, (rows, cols), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, first:] = True
    with torch.no_grad():
        top = target(input_ids=tokens).logits.log_softmax(-1).topk(8, dim=-1)
    return dict(tokens=tokens, mask=mask, topk_ids=top.indices.int(), topk_logp=top.values.half(), key="t")


def test_training_the_lens_lowers_the_held_out_loss(target):
    # the teacher: the target's own top-k at random positions; the lens of layer 1 learns to predict it
    labels = _teacher_labels(target, 24, 16, first=2, seed=4)
    kept = torch.unique(labels["topk_ids"].long().flatten())[:4000]
    x = L.residual_streams(target, labels["tokens"], labels["mask"], (1,))[1]
    ids, logp = L.labelled(labels, kept)
    n = 20 * 14  # the first 20 rows train, the last 4 are held out
    draft = LensDraft(target, 1, kept)
    cfg = TrainConfig(epochs=30, batch_rows=64, lr=1e-2, warmup_steps=2, weight_decay=0.0)
    history = L.train_lens(draft, x[:n], ids[:n], logp[:n], cfg, x_val=x[n:], ids_val=ids[n:], logp_val=logp[n:],
                           log=lambda m: None)
    assert history[-1]["heldout_loss"] < 0.9 * history[0]["heldout_loss"]
    assert not any(p.requires_grad for p in draft.parameters())


def test_build_ladder_stores_each_rung_with_its_own_cut_head(target, tmp_path):
    labels = _teacher_labels(target, 10, 12, first=3, seed=7)
    cfg = L.LadderConfig(layers=(0, 1), keep=60, keep_by_layers=((0, 20),), holdout=5,
                         train=TrainConfig(epochs=1, batch_rows=32, lr=1e-3, warmup_steps=1, weight_decay=0.0))
    drafts = L.build_ladder(target, labels, cfg, target_id="tiny", folder=tmp_path, log=lambda m: None)
    assert [len(drafts[k].kept) for k in (0, 1)] == [20, 60]
    assert drafts[0].kept.tolist() == drafts[1].kept[:20].tolist()  # the most frequent ids first, in both heads
    assert load_lens(tmp_path / "lens-0", target).kept.tolist() == drafts[0].kept.tolist()
