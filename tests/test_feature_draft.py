"""The feature-reading draft (EAGLE, `specrepro.eagle`) in the loops: the guarantee tests of the other drafts
(greedy equality, the exact joint distribution, the planted bugs, batched rows equal to each row alone) run on a
tiny random one over the tiny Llama target, plus what is particular to it (features in, drafted states out)."""

import copy
import itertools

import pytest
import torch

from specrepro import autoregressive_generate, speculative_generate
from specrepro.distribution import PLANTED_BUGS, chisquare_gof, counts_of, exact_joint_distribution, sample_sequences
from specrepro.eagle import FeatureDraft, load, save
from specrepro.generate import left_pad, preceding_features
from specrepro.models import load_shipped
from specrepro.protocol import conformance
from specrepro.sampling import SamplingConfig
from specrepro.tiny import tiny_feature_draft

FALSE_ALARM = 1e-3
V = 8
PROMPT = torch.tensor([[0, 3, 5]])
T1 = SamplingConfig()
TP = SamplingConfig(temperature=1.3, top_p=0.85)


@pytest.fixture(scope="module")
def feature_pair(pair64):
    target, _ = pair64
    return target, tiny_feature_draft(target)


def gof(target, samples, cfg):
    exact = exact_joint_distribution(target, PROMPT, samples.shape[1], cfg)
    return chisquare_gof(counts_of(samples, V), exact.numpy())


def test_the_tiny_feature_draft_conforms_to_the_draft_protocol(feature_pair):
    target, draft = feature_pair
    width = len(draft.target_features) * target.config.hidden_size
    assert conformance(draft, V, feature_width=width) == []
    assert conformance(draft, V) == ["reads target features: pass feature_width to check it"]


@pytest.mark.parametrize("gamma", [1, 3])
@pytest.mark.parametrize("prompt", [[0, 3, 5], [2, 2, 2, 2, 6, 1, 4]])
def test_greedy_speculative_equals_greedy_autoregressive(feature_pair, gamma, prompt):
    target, draft = feature_pair
    ids = torch.tensor([prompt])
    ar = autoregressive_generate(target, ids, max_new_tokens=16, temperature=0)
    sp = speculative_generate(target, draft, ids, gamma=gamma, max_new_tokens=16, temperature=0,
                              check_invariants=True)
    assert torch.equal(ar.sequences, sp.sequences)
    assert sp.stats.proposed[0] == 0 and all(g > 0 for g in sp.stats.proposed[1:-1])  # drafts from iteration 1


def test_a_draft_equal_to_the_target_in_distribution_is_accepted_more_than_a_random_one(pair64):
    # the loop feeds the features the draft asks for: a draft reading the target's top state through the target's
    # own head (a copy of p) must be accepted at every first drafted token, greedy
    target, _ = pair64
    n = target.config.num_hidden_layers
    draft = FeatureDraft(target, torch.arange(V - 1), feature_layers=(n,), layers=1).to(torch.float64)
    with torch.no_grad():  # the input projection passes the fused features through; the layer adds nothing
        d = target.config.hidden_size
        draft.fuse.weight.copy_(torch.eye(d))
        draft.inp.weight.zero_()
        draft.inp.weight[:, :d] = torch.eye(d)
        for p in draft.body.layers.parameters():
            p.zero_()
        draft.final_norm.weight.fill_(1.0)
    # with zeroed layers a_j = g_j = the target's normed top state at j - 1, so q_{j+1} is p_j shifted by one:
    # a wrong-position bug would show as acceptance near chance; the right plumbing gives p's argmax at the
    # first drafted token exactly when the target's head is the tied embedding, so test the plumbing directly
    seen = []
    orig = draft.forward

    def spy(input_ids, target_features=None, **kw):
        if target_features is not None:
            seen.append((input_ids.clone(), target_features.clone()))
        return orig(input_ids, target_features=target_features, **kw)

    draft.forward = spy
    ids = torch.tensor([[0, 3, 5, 1]])
    speculative_generate(target, draft, ids, gamma=2, max_new_tokens=6, temperature=0)
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states[n][0]  # (T, d)
    first_ids, first_feats = seen[0]
    # the first catch-up feeds the whole prompt plus the first token: position j gets the state of j - 1
    assert first_ids[0, :4].tolist() == [0, 3, 5, 1]
    assert torch.all(first_feats[0, 0] == 0)
    assert torch.allclose(first_feats[0, 1:4], hs[:3], atol=1e-10)


def test_preceding_features_shift_by_one_with_zeros_before_the_start():
    f = torch.arange(12.0).reshape(6, 2)
    assert preceding_features(f, 0, 3).tolist() == [[0, 0], [0, 1], [2, 3]]
    assert preceding_features(f, 4, 2).tolist() == [[6, 7], [8, 9]]


@pytest.mark.parametrize("cfg,gamma", [(T1, 2), (TP, 2), (T1, 1)], ids=["T1-gamma2", "T1.3-top_p0.85-gamma2",
                                                                         "T1-gamma1"])
def test_speculative_with_a_feature_draft_matches_the_exact_target(feature_pair, cfg, gamma):
    target, draft = feature_pair
    # batched draws (rows are independent draws, tests/test_batch.py): 3 tokens, so drafts from iteration 1
    s, _ = sample_sequences(target, draft, PROMPT, method="speculative", n_tokens=3, n_samples=3000, cfg=cfg,
                            generator=torch.Generator().manual_seed(11), gamma=gamma, batch_size=500)
    result = gof(target, s, cfg)
    assert not result.rejects(FALSE_ALARM), result


@pytest.mark.parametrize("name", PLANTED_BUGS)
def test_planted_bugs_are_detected_with_a_feature_draft(feature_pair, name):
    target, draft = feature_pair
    cfg = TP if name == "top-p-dropped-on-target" else T1
    samples, _ = sample_sequences(target, draft, PROMPT, method="speculative", n_tokens=3, n_samples=3000, cfg=cfg,
                                  generator=torch.Generator().manual_seed(11), gamma=2, bug=name, batch_size=500)
    result = gof(target, samples, cfg)
    assert result.rejects(FALSE_ALARM), result


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ragged_batch_rows_equal_each_row_alone(feature_pair, temperature):
    target, draft = feature_pair
    rows = [[1, 5, 7], [2, 3, 4, 5, 6, 7, 1], [4]]
    ids, mask = left_pad(rows, 0)
    batch = speculative_generate(target, draft, ids, attention_mask=mask, gamma=3, max_new_tokens=10,
                                 temperature=temperature, pad_token_id=0, check_invariants=True,
                                 generator=[torch.Generator().manual_seed(b) for b in range(3)])
    for b, row in enumerate(rows):
        alone = speculative_generate(target, draft, torch.tensor([row]), gamma=3, max_new_tokens=10,
                                     temperature=temperature, generator=torch.Generator().manual_seed(b))
        assert batch.sequences[b, ids.shape[1]:].tolist() == alone.sequences[0, len(row):].tolist()


def test_catching_up_without_features_is_refused_clearly(feature_pair):
    target, draft = feature_pair
    with pytest.raises(ValueError, match="needs target_features"):
        draft(input_ids=torch.tensor([[1, 2]]), cache=draft.make_cache())


@pytest.mark.parametrize("mode", ["eager", "dynamo"])
@pytest.mark.parametrize("gamma", [1, 4])
def test_the_compiled_target_feeds_the_draft_the_eager_paths_features(feature_pair, mode, gamma):
    # the static-cache target returns its hidden states from the same graph as its logits (padded blocks included):
    # greedy and sampled tokens, and every acceptance count, as on the eager path (float64: the same draws)
    target, draft = feature_pair
    accepted = 0
    for cfg, ids in itertools.product((SamplingConfig(0.0), TP), ([[2, 2, 2, 2, 6, 1, 4]], [[3]], [[1, 5]])):
        ids = torch.tensor(ids)  # short prompts: the first forwards run compiled on empty caches, padded
        kw = dict(gamma=gamma, max_new_tokens=20, temperature=cfg.temperature, top_p=cfg.top_p)
        eager = speculative_generate(target, draft, ids, generator=torch.Generator().manual_seed(3), **kw)
        static = speculative_generate(target, draft, ids, generator=torch.Generator().manual_seed(3), compile=mode,
                                      check_invariants=True, **kw)
        assert torch.equal(static.sequences, eager.sequences)
        assert static.stats.accepted == eager.stats.accepted
        accepted += sum(static.stats.accepted)
    assert accepted > 0  # drafts were accepted, so the catch-up block ran too


def test_the_static_target_keeps_the_real_tokens_features_only(feature_pair):
    from specrepro.compiled import SLOT_BUCKET, StaticCachedModel
    from specrepro.kvcache import concat_features

    target, draft = feature_pair
    m = StaticCachedModel(target, "target", [], block=5, slots=SLOT_BUCKET, mode="eager")
    m.hidden_layers = draft.target_features
    m.feed([[0, 3, 5, 1, 2, 4, 6]], 1)  # the eager prefill
    assert m.features.shape[1] == 7
    m.feed([[2, 3]], 2)  # padded to 5, the padding's states dropped
    with torch.no_grad():
        out = target(torch.tensor([[0, 3, 5, 1, 2, 4, 6, 2, 3]]), output_hidden_states=True)
    torch.testing.assert_close(m.features, concat_features(out.hidden_states, draft.target_features)[:, -2:])
    with pytest.raises(ValueError, match="read tokens only"):
        m.feed([[1]], 1, features=[torch.zeros(1, 4)])


def test_feature_draft_round_trips_through_the_registry(feature_pair, tmp_path):
    target, draft = feature_pair
    save(tmp_path / "f", draft, {"name": "f"})
    loaded = load_shipped(tmp_path / "f", target=target, dtype=torch.float64)
    assert isinstance(loaded, FeatureDraft) and loaded.target_features == draft.target_features
    rounded = copy.deepcopy(draft)  # what bf16 storage keeps of the draft: the loaded one must compute exactly this
    with torch.no_grad():
        for v in rounded.trainable().values():
            v.copy_(v.to(torch.bfloat16).to(v.dtype))
        ids = torch.tensor([[1, 2, 3]])
        feats = torch.randn(1, 3, len(draft.target_features) * target.config.hidden_size, dtype=torch.float64,
                            generator=torch.Generator().manual_seed(0))
        want = rounded(input_ids=ids, target_features=feats).logits
        got = loaded(input_ids=ids, target_features=feats).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="pass target="):
        load(tmp_path / "f")


@pytest.mark.parametrize("regress", [False, True], ids=["eagle3", "eagle1-regress"])
def test_training_time_test_computes_what_the_loop_computes(pair64, regress):
    # depth k at position j in `unrolled` = catch up on positions 0..j-k+1 with the target's features, then feed
    # the next k - 1 tokens one at a time on the draft's own states, as `propose` does
    from specrepro.kvcache import model_forward

    target, _ = pair64
    draft = tiny_feature_draft(target, regress=regress)
    tokens = torch.tensor([[0, 3, 5, 1, 6, 2, 4]])
    with torch.no_grad():
        hs = target(input_ids=tokens, output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i] for i in draft.target_features], -1)  # (1, T, F)
        outs = draft.unrolled(tokens, feats, depth=3)
        for k in (1, 2, 3):
            for j in range(k - 1, tokens.shape[1]):
                cache = draft.make_cache()
                start = j - k + 1  # the last position fed with the target's features
                prev = torch.cat([feats.new_zeros(1, 1, feats.shape[-1]), feats[:, :start]], 1)
                model_forward(draft, tokens[:, :start + 1], cache, target_features=prev)
                for i in range(start + 1, j + 1):
                    model_forward(draft, tokens[:, i:i + 1], cache)
                assert torch.allclose(cache.last[0], outs[k - 1][0, j], atol=1e-8), (k, j)


def test_chain_mask_lets_each_depth_see_what_the_loop_shows_it():
    from specrepro.eagle import chain_mask

    m = chain_mask(4, 2)  # depth 1: causal; depth 2 at j: depth-1 keys <= j - 1 and itself
    assert m[:4, :4].equal(torch.ones(4, 4, dtype=torch.bool).tril()) and not m[:4, 4:].any()
    assert m[4 + 2].tolist() == [True, True, False, False, False, False, True, False]
    assert m[4 + 0].tolist() == [False] * 4 + [True, False, False, False]


@pytest.mark.parametrize("regress", [0.0, 1.0])
def test_feature_draft_training_lowers_the_loss_on_tiny_data(pair64, regress):
    from specrepro.eagle_train import FeatureDraftConfig, train
    from specrepro.train import TrainConfig

    target, _ = pair64
    g = torch.Generator().manual_seed(0)
    N, T, k = 20, 12, 3
    tokens = torch.randint(0, V, (N, T), generator=g)
    with torch.no_grad():
        logp = target(input_ids=tokens).logits.float().log_softmax(-1)
    top = logp.topk(k, -1)
    labels = dict(tokens=tokens, mask=torch.ones(N, T, dtype=torch.bool), topk_ids=top.indices.int(),
                  topk_logp=top.values.half(), key="tiny")
    cfg = FeatureDraftConfig(feature_layers=(2,) if regress else (0, 2), keep=V - 1, depth=2, holdout=5,
                             regress=regress,
                             train=TrainConfig(epochs=30, batch_rows=4, lr=1e-2, warmup_steps=2, log_every=1000))
    # a float32 copy: .float() on the session's float64 pair would turn it float32 for every later test
    draft, fields = train(copy.deepcopy(target).float(), labels, cfg, log=lambda _: None, cache_features=False)
    first, last = fields["history"][0], fields["history"][-1]
    assert last["heldout_loss"] < first["heldout_loss"]
    assert len(last["heldout_top1_agreement_by_depth"]) == 2


@pytest.mark.slow
def test_corpus_rows_carry_the_targets_labels_and_features():
    from specrepro import models
    from specrepro.eagle_train import corpus_labels

    try:
        target, tok = models.load_target(), models.load_tokenizer()
    except models.ModelFilesMissing as err:
        pytest.skip(str(err))
    lab = corpus_labels(target, tok, rows=4, context=32, layers=(2, 30))
    assert lab["tokens"].shape == (4, 32) and lab["features"].shape == (4, 32, 2 * 576) and lab["mask"].all()
    with torch.no_grad():
        out = target(input_ids=lab["tokens"][:1], output_hidden_states=True)
    assert lab["topk_ids"][0, :, 0].tolist() == out.logits[0].argmax(-1).tolist()  # the target's own top-1
    assert torch.allclose(lab["features"][0, :, 576:].float(), out.hidden_states[30][0], atol=0.05, rtol=0.02)


def test_sampled_answers_come_after_the_greedy_ones_and_answers_only_stops_before_training(monkeypatch):
    """`eagle_train --sampled-code/--sampled-text` asks `distill.target_answers` for a second set (sampled at the
    given temperature, to the requests after the greedy set's); `concat_labels` keeps the greedy rows first, so
    their held-out rows stay the same; `--answers-only` returns before any training."""
    from specrepro import distill, eagle_train, models

    asked = []

    def answers(target, tokenizer, cfg, *, target_id):
        asked.append(cfg)
        n = cfg.n_code + cfg.n_text
        return dict(tokens=torch.full((n, 4), len(asked)), mask=torch.ones(n, 4, dtype=torch.bool),
                    topk_ids=torch.zeros(n, 4, 2, dtype=torch.int32), topk_logp=torch.zeros(n, 4, 2).half(),
                    key=f"set{len(asked)}")

    monkeypatch.setattr(models, "load_target", lambda: None)
    monkeypatch.setattr(models, "load_tokenizer", lambda: None)
    monkeypatch.setattr(distill, "target_answers", answers)
    monkeypatch.setattr(eagle_train, "train", lambda *a, **k: pytest.fail("--answers-only must not train"))
    assert eagle_train.main(["--sampled-code", "6", "--sampled-text", "2", "--sampled-temperature", "0.7",
                             "--answers-only"]) == 0
    greedy, sampled = asked
    assert greedy.temperature == 0 and (greedy.n_code, greedy.n_text, greedy.seed) == (768, 288, 0)
    assert sampled.temperature == 0.7 and (sampled.n_code, sampled.n_text, sampled.seed) == (6, 2, 0)
    assert (sampled.skip_code, sampled.skip_text) == (768, 288)  # requests the greedy set did not use
    assert sampled.context == greedy.context and sampled.max_new_tokens == greedy.max_new_tokens
    first, second = (answers(None, None, c, target_id="") | {"features": torch.zeros(c.n_code + c.n_text, 4, 3)}
                     for c in (greedy, sampled))
    both = eagle_train.concat_labels(first, second)
    assert both["tokens"].shape[0] == 1056 + 8 and both["key"] == f"{first['key']}+{second['key']}"
    assert both["tokens"][:1056].eq(first["tokens"]).all() and both["features"].shape == (1064, 4, 3)


def test_agreement_by_row_pools_to_what_training_measures_and_its_intervals_can_say_no(feature_pair):
    """`agreement_by_row` counts, per answer and depth, the positions where the draft's top-1 is the target's; pooled
    they equal `batch_loss`'s agreement over the same rows at once. `acceptance.agreement_intervals` brackets the
    pooled value; `agreement_difference` puts a draft against itself at exactly 0 and a draft that agrees
    everywhere above it, with an interval that excludes 0 (the contrary verdict), and refuses unmatched rows."""
    import numpy as np

    from specrepro.acceptance import agreement_difference, agreement_intervals
    from specrepro.drafts import full_to_cut
    from specrepro.eagle_train import agreement_by_row, batch_loss

    target, draft = feature_pair
    g = torch.Generator().manual_seed(1)
    N, T, k = 12, 10, 3
    tokens = torch.randint(0, V, (N, T), generator=g)
    mask = torch.arange(T)[None] < torch.randint(3, T + 1, (N, 1), generator=g)  # answers of different lengths
    mask[:, 0] = False  # the request's token
    with torch.no_grad():
        out = target(input_ids=tokens, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i] for i in draft.target_features], -1).float()
    top = out.logits.float().log_softmax(-1).topk(k, -1)
    labels = dict(tokens=tokens, mask=mask, topk_ids=top.indices.int(), topk_logp=top.values.half())
    rows = torch.arange(N)
    with torch.no_grad():
        hits, scored = agreement_by_row(draft, labels, feats, rows, depth=2)
        _, pooled = batch_loss(draft, tokens, feats, mask, full_to_cut(draft.head.kept)[top.indices.long()],
                               top.values.half(), 2)
    assert scored[:, 0].tolist() == mask.sum(1).float().tolist()
    assert (hits <= scored).all() and (hits >= 0).all()
    for d in range(2):
        assert float(hits[:, d].sum() / scored[:, d].sum()) == pytest.approx(pooled[d], abs=1e-6)
    ivs = agreement_intervals(hits, scored, n_boot=500)
    assert all(iv.lo <= iv.estimate <= iv.hi and iv.n_units == N for iv in ivs)
    same = agreement_difference((hits, scored), (hits, scored), n_boot=500)
    assert all(iv.estimate == iv.lo == iv.hi == 0 for iv in same)
    better = agreement_difference((hits, scored), (scored.clone(), scored), n_boot=500)
    assert all(iv.lo > 0 for iv in better), better  # a draft agreeing everywhere is reliably ahead
    worse = agreement_difference((scored.clone(), scored), (hits, scored), n_boot=500)
    assert all(iv.hi < 0 for iv in worse)
    with pytest.raises(ValueError, match="same rows"):
        agreement_difference((hits, scored), (hits[:5], scored[:5]))
    with pytest.raises(ValueError, match="hits <= scored"):
        agreement_intervals(np.ones((2, 1)) * 3, np.ones((2, 1)))


@pytest.mark.compiles
@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback to eager would pass unseen otherwise
def test_inductor_compiles_the_target_forward_that_returns_features():
    from specrepro.tiny import tiny_pair

    target, _ = tiny_pair(64, seed=2, dtype=torch.float32)
    draft = tiny_feature_draft(target)
    ids = torch.tensor([[2, 2, 2, 2, 6, 1, 4]])
    ref = autoregressive_generate(target, ids, max_new_tokens=20, temperature=0)
    eager = speculative_generate(target, draft, ids, gamma=3, max_new_tokens=20, temperature=0)
    got = speculative_generate(target, draft, ids, gamma=3, max_new_tokens=20, temperature=0, compile="default")
    assert torch.equal(got.sequences, ref.sequences) and got.stats.accepted == eager.stats.accepted
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    other = torch.tensor([[1, 5, 5, 2, 6, 3]])
    again = speculative_generate(target, draft, other, gamma=3, max_new_tokens=20, temperature=0, compile="default")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames  # the same graphs, none compiled anew
    ref = autoregressive_generate(target, other, max_new_tokens=20, temperature=0)
    assert torch.equal(again.sequences, ref.sequences)


def test_the_draft_runs_on_its_own_static_cache_on_the_compiled_path(feature_pair):
    from specrepro.compiled import CompileConfig, cached_model_factory
    from specrepro.eagle import StaticFeatureCache

    target, draft = feature_pair
    m = cached_model_factory(CompileConfig("eager"), block=4, slots=256)(draft, "draft", [])
    assert isinstance(m.cache, StaticFeatureCache)
    width = len(draft.target_features) * target.config.hidden_size
    feats = torch.randn(7, width, dtype=torch.float64)
    m.feed([[0, 3, 5, 1, 2, 4, 6]], 1, features=[feats[:7]])  # the prompt, eagerly
    short = m.feed([[2, 3]], 1, features=[feats[:2]])  # padded to 4, the padding rolled back
    assert m.slots == 9 and m.fed == [9]
    ref = draft.make_cache()  # the eager draft over the same inputs
    with torch.no_grad():
        draft(input_ids=torch.tensor([[0, 3, 5, 1, 2, 4, 6]]), cache=ref, target_features=feats[None, :7])
        want = draft(input_ids=torch.tensor([[2, 3]]), cache=ref, target_features=feats[None, :2], logits_to_keep=1)
    torch.testing.assert_close(short, want.logits)
    torch.testing.assert_close(m.cache.last, ref.last)


def test_a_failed_compilation_of_the_draft_warns_and_drafts_eagerly(feature_pair, monkeypatch):
    from specrepro import eagle

    target, draft = feature_pair

    def broken(*args):
        raise RuntimeError("no C compiler")

    monkeypatch.setattr(eagle, "compile_in", lambda fn, mode: broken)
    ids = torch.tensor([[2, 2, 2, 2, 6, 1, 4]])
    ref = speculative_generate(target, draft, ids, gamma=3, max_new_tokens=12, temperature=0)
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        got = speculative_generate(target, draft, ids, gamma=3, max_new_tokens=12, temperature=0, compile="eager")
    assert torch.equal(got.sequences, ref.sequences)


def test_temperature_scan_finds_the_temperature_that_undoes_a_miscalibrated_draft():
    """A draft whose logits are the target's times s is the target at temperature 1/s: warping q at T_q = T s gives
    q = p exactly, alpha 1, the scan's best. Too sharp (s = 2) and too flat (s = 0.5) are found on opposite sides;
    a calibrated draft (s = 1) gains nothing anywhere."""
    from specrepro.acceptance import temperature_scan
    from specrepro.sampling import SamplingConfig

    g = torch.Generator().manual_seed(0)
    target_logits = [3 * torch.randn(n, 50, generator=g) for n in (7, 5, 9, 6)]
    cfg = SamplingConfig(temperature=0.8)
    for scale, best_t in ((2.0, 1.6), (0.5, 0.4), (1.0, 0.8)):
        rows = temperature_scan(target_logits, [scale * t for t in target_logits], cfg, (0.4, 0.8, 1.6), n_boot=200)
        by_t = {r["draft_temperature"]: r for r in rows}
        assert max(by_t, key=lambda t: by_t[t]["alpha"]) == best_t
        assert by_t[best_t]["alpha"] == pytest.approx(1.0, abs=1e-5) and by_t[0.8]["gain"] == 0.0
        assert rows[0]["positions"] == 27 and rows[0]["continuations"] == 4
        if scale != 1.0:  # a real gain, its paired interval clear of zero
            assert by_t[best_t]["gain_lo"] > 0
        else:
            assert all(r["gain"] <= 1e-9 for r in rows)
    with pytest.raises(ValueError, match="greedy"):
        temperature_scan(target_logits, target_logits, SamplingConfig(temperature=0), (0.5,))
