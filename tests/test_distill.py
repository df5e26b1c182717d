"""Distillation data and training: batched answers equal one-at-a-time greedy decoding, rows are laid out so that
each label predicts the next answer token, the masked loss ignores context, and training lowers the loss."""

import pytest
import torch
from transformers import PhiForCausalLM

from specrepro import autoregressive_generate, distill
from specrepro import drafts as D
from specrepro.tiny import tiny_target
from specrepro.train import TrainConfig, distillation_loss, train_draft

V = 32


@pytest.fixture(scope="module")
def target():
    return tiny_target(V, hidden_size=16, layers=2, dtype=torch.float64, seed=5)


def test_batched_answers_equal_greedy_decoding_one_at_a_time(target):
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10], [11, 12, 11, 12]]
    free = autoregressive_generate(target, torch.tensor([prompts[0]]), max_new_tokens=12, temperature=0)
    eos = int(free.sequences[0, len(prompts[0]) + 4])  # a token the target emits: rows stop at different steps
    got = distill.generate_batch(target, prompts, max_new_tokens=12, eos_token_id=eos, top_k=5)
    lengths = set()
    for p, g in zip(prompts, got):
        ref = autoregressive_generate(target, torch.tensor([p]), max_new_tokens=12, temperature=0, eos_token_id=eos)
        assert g["answer"] == ref.sequences[0, len(p):].tolist()
        assert g["topk_ids"].shape == (len(g["answer"]), 5)
        assert g["topk_ids"][:, 0].tolist() == g["answer"]  # greedy: the answer is the top-1 of each row
        lengths.add(len(g["answer"]))
    assert len(lengths) > 1  # some rows left the batch early


def test_top_k_labels_are_the_targets_log_probabilities(target):
    p = [3, 1, 4, 1, 5]
    (g,) = distill.generate_batch(target, [p], max_new_tokens=3, eos_token_id=V - 1, top_k=4)
    seq = torch.tensor([p + g["answer"]])
    with torch.no_grad():
        logp = target(seq).logits[0].float().log_softmax(-1)
    for i in range(len(g["answer"])):
        top = logp[len(p) - 1 + i].topk(4)
        assert g["topk_ids"][i].tolist() == top.indices.tolist()
        assert torch.allclose(g["topk_logp"][i].float(), top.values, atol=2e-3)  # stored in float16


def test_pack_puts_each_label_before_its_answer_token():
    answer = dict(answer=[7, 8, 9], topk_ids=torch.tensor([[7, 1], [8, 1], [9, 1]], dtype=torch.int32),
                  topk_logp=torch.zeros(3, 2, dtype=torch.float16))
    tokens, mask, ids, _ = distill.pack([1, 2], answer, context=8, pad_id=0)
    assert tokens.tolist() == [1, 2, 7, 8, 9, 0, 0, 0]
    assert mask.tolist() == [False, True, True, True, False, False, False, False]
    assert ids[mask, 0].tolist() == tokens[2:5].tolist()  # position t labels token t + 1
    tokens, mask, ids, _ = distill.pack([1, 2, 3, 4, 5, 6], answer, context=5, pad_id=0)  # request cut on the left
    assert tokens.tolist() == [5, 6, 7, 8, 9] and mask.tolist() == [False, True, True, True, False]


def test_masked_loss_ignores_unlabelled_positions():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 6, generator=g)
    ids = torch.randint(0, 6, (2, 4, 3), generator=g)
    logp = torch.randn(2, 4, 3, generator=g)
    mask = torch.tensor([[True, False, False, True], [False, False, True, False]])
    loss, _ = distillation_loss(logits, ids, logp, mask)
    kept, _ = distillation_loss(logits[mask][None], ids[mask][None], logp[mask][None])
    assert torch.allclose(loss, kept)
    garbage = logits.clone()
    garbage[~mask] = 1e4
    assert torch.allclose(distillation_loss(garbage, ids, logp, mask)[0], loss)


def test_training_on_target_answers_lowers_the_loss(target):
    prompts = [[i % V, (3 * i) % V, (7 * i + 1) % V] for i in range(24)]
    answers = distill.generate_batch(target, prompts, max_new_tokens=10, eos_token_id=V - 1, top_k=5)
    rows = [distill.pack(p, a, context=16, pad_id=0) for p, a in zip(prompts, answers)]
    labels = {n: torch.stack([r[i] for r in rows]) for i, n in enumerate(("tokens", "mask", "topk_ids", "topk_logp"))}
    kept = D.cut_vocabulary(labels["tokens"], labels["topk_ids"][labels["mask"]], keep=V - 1)
    spec = D.DraftSpec("t", d_model=16, layers=1, heads=2, keep=V - 1)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        draft = PhiForCausalLM(spec.config(V))
    history = train_draft(draft, labels, TrainConfig(epochs=30, batch_rows=8, lr=1e-2, warmup_steps=5, log_every=10),
                          id_map=D.full_to_cut(kept), log=lambda m: None)
    assert history[-1]["loss"] < 0.7 * history[0]["loss"]
    assert history[-1]["epoch"] == pytest.approx(30, abs=1)


def test_a_skipped_set_takes_the_next_requests_and_an_unskipped_one_keeps_its_cache_key(monkeypatch):
    import hashlib
    import json
    from dataclasses import asdict, replace

    pool = [("code", f"c{i}") for i in range(10)] + [("text", f"t{i}") for i in range(6)]
    monkeypatch.setattr(distill, "distillation_requests", lambda seed: pool)
    first = distill.DistillConfig(n_code=4, n_text=2)
    second = distill.DistillConfig(n_code=5, n_text=3, skip_code=4, skip_text=2, temperature=0.8)
    assert distill.requests(first) == ["c0", "c1", "c2", "c3", "t0", "t1"]
    assert distill.requests(second) == ["c4", "c5", "c6", "c7", "c8", "t2", "t3", "t4"]
    with pytest.raises(ValueError, match="only 6 code .* after skipping 4"):
        distill.requests(distill.DistillConfig(n_code=7, n_text=1, skip_code=4))
    # the key of a set without skips is the one it had before skips existed, so its cached answers still count
    prompts = distill.requests(first)
    old = {k: v for k, v in asdict(first).items() if k not in ("skip_code", "skip_text", "top_p")}
    h = hashlib.sha256("\x00".join(prompts).encode())
    h.update(json.dumps(old | {"target": "t"}, sort_keys=True).encode())
    assert distill.label_key(prompts, first, "t") == h.hexdigest()[:16]
    for changed in (dict(skip_code=4), dict(skip_text=1), dict(top_p=0.95)):  # set, each is part of the key
        assert distill.label_key(prompts, replace(first, **changed), "t") != distill.label_key(prompts, first, "t")


def test_nucleus_sampled_answers_stay_inside_the_nucleus_and_keep_unwarped_labels(target):
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    g = torch.Generator().manual_seed(0)
    # top-p this small keeps only the most likely token: a nucleus sample is the greedy answer
    tight = distill.generate_batch(target, prompts, max_new_tokens=8, eos_token_id=0, top_k=5, temperature=0.8,
                                   top_p=1e-6, generator=g)
    greedy = distill.generate_batch(target, prompts, max_new_tokens=8, eos_token_id=0, top_k=5)
    assert [a["answer"] for a in tight] == [a["answer"] for a in greedy]
    assert all(torch.equal(a["topk_logp"], b["topk_logp"]) for a, b in zip(tight, greedy))  # labels: the target's p
    # a wide nucleus at a high temperature leaves the greedy path somewhere
    loose = distill.generate_batch(target, prompts, max_new_tokens=8, eos_token_id=0, top_k=5, temperature=2.0,
                                   top_p=0.99, generator=g)
    assert [a["answer"] for a in loose] != [a["answer"] for a in greedy]


def test_held_out_counts_rows_from_the_start_of_the_training_set():
    # the split eagle_train and the ladder train with; scoring a later set (the sampled answers after 1,056 greedy
    # ones) must count from the start of the concatenation, or rows the draft trained on read as held out
    from specrepro.distill import held_out

    assert held_out(20, 10).nonzero()[:, 0].tolist() == [9, 19]
    assert held_out(20, 10, offset=1056).nonzero()[:, 0].tolist() == [3, 13]
    assert not held_out(9, 10).any()
