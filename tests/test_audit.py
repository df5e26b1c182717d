"""The engine audit's statistics and client (`specrepro.audit`), without a server: the homogeneity test holds its
size and sees a real shift, the power simulation finds the shift it detects, responses of llama.cpp's and OpenAI's
shapes parse, and bad input is refused with a message."""

from __future__ import annotations

import numpy as np
import pytest

from specrepro import audit, verdicts
from specrepro.sampling import SamplingConfig


def draws(probs, n, seed):
    return np.random.default_rng(seed).choice(len(probs), size=n, p=probs).tolist()


P = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])


def test_homogeneity_keeps_its_size_on_one_distribution():
    rejections = sum(audit.homogeneity(draws(P, 500, 2 * s), draws(P, 500, 2 * s + 1)).p_value < 0.05
                     for s in range(200))
    assert rejections / 200 < 0.1  # nominal 0.05; 200 replicates


def test_homogeneity_rejects_a_shifted_distribution():
    h = audit.homogeneity(draws(P, 2000, 0), draws(audit.shifted(P, 0.1), 2000, 1))
    assert h.p_value < 1e-4 and 0.05 < h.total_variation < 0.15


def test_rare_outcomes_are_pooled_and_one_cell_is_no_evidence():
    a = [0] * 100 + [1, 2, 3]
    b = [0] * 100 + [4]
    h = audit.homogeneity(a, b)
    assert h.cells <= 2 and h.p_value > 0.05
    assert audit.homogeneity([0] * 10, [0] * 10).p_value == 1.0
    with pytest.raises(ValueError, match="non-empty"):
        audit.homogeneity([], [1])


def test_shifted_moves_exactly_the_mass_asked_onto_the_mode():
    q = audit.shifted(P, 0.1)
    assert q.sum() == pytest.approx(1.0)
    assert 0.5 * np.abs(q - P).sum() == pytest.approx(0.1)
    assert q.argmax() == 0 and q[0] == pytest.approx(0.5)


def test_power_grows_with_the_shift_and_the_detectable_shift_sits_where_power_crosses_80_percent():
    small, large = (audit.power(P, s, 400, 400, replicates=100) for s in (0.01, 0.15))
    assert small < 0.3 and large > 0.95
    d = audit.detectable_shift(P, 400, 400, replicates=100)
    assert 0.02 < d < 0.15
    assert audit.power(P, d, 400, 400, replicates=200, seed=1) > 0.6


LLAMA_CPP = {"choices": [{"text": " Paris.", "logprobs": {"content": [
    {"id": 12, "token": " Paris", "logprob": -0.1}, {"id": 30, "token": ".", "logprob": -0.5}]}}],
    "usage": {"completion_tokens": 2}, "timings": {"draft_n": 3, "draft_n_accepted": 1}}
OPENAI = {"choices": [{"text": " Paris.", "logprobs": {"tokens": [" Paris", "."], "token_logprobs": [-0.1, -0.5]}}],
          "usage": {"completion_tokens": 2}}


def test_llama_cpp_and_openai_responses_parse():
    a = audit.parse(LLAMA_CPP, 0.5)
    assert a.ids == (12, 30) and a.key == (12, 30) and (a.drafted, a.accepted) == (3, 1)
    b = audit.parse(OPENAI, 0.5)
    assert b.ids is None and b.key == (" Paris", ".") and b.completion_tokens == 2
    with pytest.raises(audit.ServerError, match="logprobs"):
        audit.parse({"choices": [{"text": "x"}]}, 0.1)
    with pytest.raises(audit.ServerError, match="no choices"):
        audit.parse({"error": "bad"}, 0.1)


def test_decode_speed_reads_the_servers_own_timings_and_says_when_there_are_none():
    timed = LLAMA_CPP | {"timings": {"draft_n": 3, "draft_n_accepted": 1, "predicted_ms": 250.0, "predicted_n": 2}}
    c = audit.parse(timed, 0.5)
    assert (c.decode_seconds, c.decoded) == (0.25, 2) and audit.parse(OPENAI, 0.5).decode_seconds is None

    def done(seconds, decode_seconds):  # 10 tokens; the wall time includes a prompt of varying length
        return audit.Completion("", (1,), ("a",), seconds, 10, 4, 2, decode_seconds, 10)

    off = [done(3.0, 1.0), done(1.0, 1.0)]
    on = [done(1.0, 0.5), done(3.0, 0.5)]  # wall times say no faster; the decode times say twice as fast
    assert audit.speed_row(on, off)["speedup"] == pytest.approx(1.0)
    row = audit.speed_row(on, off, decode=True, mode="m")
    assert row["speedup"] == pytest.approx(2.0) and row["mode"] == "m" and row["acceptance"] == pytest.approx(0.5)
    with pytest.raises(audit.ServerError, match="decode=False"):
        audit.speed([audit.parse(OPENAI, 0.5)], decode=True)


def test_compare_outputs_finds_the_first_divergence():
    ref = [audit.parse(LLAMA_CPP, 0.1)] * 2
    other = dict(LLAMA_CPP, choices=[{"text": "", "logprobs": {"content": [{"id": 12, "token": "a"},
                                                                               {"id": 31, "token": "b"}]}}])
    m = audit.compare_outputs(ref, [ref[0], audit.parse(other, 0.1)])
    assert (m.prompts, m.exact, m.first_divergence) == (2, 1, (None, 1)) and m.prefix_match == 0.75


def test_the_request_turns_every_other_sampler_stage_off_and_bad_input_is_refused():
    c = audit.Client("http://127.0.0.1:9")
    body = c.body("hi", 4, SamplingConfig(0.8, top_p=0.9), seed=3)
    assert body["top_k"] == 0 and body["top_p"] == 0.9 and body["min_p"] == 0.0 and body["seed"] == 3
    assert body["samplers"] == ["temperature", "top_k", "top_p"] and body["repeat_penalty"] == 1.0
    with pytest.raises(ValueError, match="empty prompt"):
        c.body("", 4, SamplingConfig(), None)
    with pytest.raises(ValueError, match="max_tokens"):
        c.body("hi", audit.MAX_TOKENS + 1, SamplingConfig(), None)
    with pytest.raises(ValueError, match="http"):
        audit.Client("127.0.0.1:8080")
    with pytest.raises(ValueError, match="temperature > 0"):
        audit.first_tokens(c, "hi", n_samples=2, n_tokens=2, cfg=SamplingConfig(0.0))


def test_an_unreachable_server_says_so():
    from specrepro.engines import free_port

    with pytest.raises(audit.ServerError, match="is the server running"):
        audit.Client(f"http://127.0.0.1:{free_port()}", timeout=5).complete("hi", max_tokens=2)


def test_the_probe_lists_what_cannot_be_tested():
    assert audit.Probe(True, True, True).cannot_test() == []
    msgs = audit.Probe(False, False, False).cannot_test()
    assert any("seed" in m for m in msgs) and any("top_k" in m for m in msgs) and any("ids" in m for m in msgs)


# ---- the audit end to end, through HTTP, on our own loop (specrepro.served) --------------------------------------


def keys(completions):
    return [c.key for c in completions]


def test_the_audit_passes_our_speculative_sampling_and_fails_a_planted_bug(pair64):
    from specrepro.served import OursServer

    target, draft = pair64
    prompt, cfg, n = [0, 3, 5], SamplingConfig(1.0), 300
    with OursServer(target) as ar, OursServer(target, draft, gamma=2) as sp, \
            OursServer(target, draft, gamma=2, bug="greedy-draft-with-stochastic-ratio") as bad:
        a, b, c = (audit.first_tokens(audit.Client(s.url), prompt, n_samples=n, n_tokens=2, cfg=cfg, concurrency=2)
                   for s in (ar, sp, bad))
    assert sum(x.drafted for x in b) > 0 and all(x.drafted == 0 for x in a)
    assert audit.homogeneity(keys(a), keys(b)).p_value > 0.01
    assert audit.homogeneity(keys(a), keys(c)).p_value < 1e-3
    # the same samples against the target's exact probabilities: both correct samplers pass, the bug fails
    exact = audit.exact_distribution(target, prompt, 2, cfg)
    assert len(exact) == 64 and audit.exact_distribution(target, "text", 2, cfg) is None
    ok_a, ok_b, bug = (audit.exact_test(x, exact) for x in (a, b, c))
    assert ok_a["p_value"] > 1e-3 and ok_b["p_value"] > 1e-3 and bug["p_value"] < 1e-3
    assert ok_a["outside_support"] == 0 and ok_a["tokens"] == 2
    short = [audit.Completion(text="", ids=(1,), tokens=("1",), seconds=0.0, completion_tokens=1)]
    assert np.isnan(audit.exact_test(short, exact)["p_value"]) and np.isnan(audit.exact_test(a, None)["p_value"])


def test_the_speed_arms_are_timed_interleaved_with_both_servers_up(pair64):
    """Each prompt goes to both servers, the first of the two alternating, after one untimed warm-up each; drift
    then falls on both arms alike. The servers stop afterwards."""
    from specrepro.served import OursServer

    target, draft = pair64
    calls = []

    class Spy(OursServer):
        def __init__(self, name, *args, **kw):
            super().__init__(*args, **kw)
            self.name = name

        def complete(self, body):
            calls.append((self.name, tuple(body["prompt"]), body["max_tokens"]))
            return super().complete(body)

    prompts = [[0, 3, 5], [1, 2], [7, 7, 1]]
    on, off = Spy("on", target, draft, gamma=2), Spy("off", target)
    ons, offs = audit.interleaved(on, off, prompts, max_tokens=4)
    assert [c[0] for c in calls] == ["off", "on", "off", "on", "on", "off", "off", "on"]
    assert [c[2] for c in calls[:2]] == [2, 2] and all(c[2] == 4 for c in calls[2:])  # the warm-ups: 2 tokens
    assert [c[1] for c in calls[2:]] == [(0, 3, 5)] * 2 + [(1, 2)] * 2 + [(7, 7, 1)] * 2
    assert len(ons) == len(offs) == 3 and keys(ons) == keys(offs)  # greedy: the same tokens on and off
    assert all(c.seconds > 0 for c in ons + offs)
    with pytest.raises(ValueError, match="no prompts"):
        audit.interleaved(on, off, [], max_tokens=4)
    with pytest.raises(audit.ServerError):  # both servers stopped with the block
        audit.Client(on.url).complete([0], max_tokens=1)


def test_exact_test_falls_back_to_the_longest_testable_prefix_and_keeps_its_verdicts():
    # 2 first tokens x 100 second tokens, all equally likely: at 60 samples no continuation is expected 5 times
    exact = {(a, b): 1 / 200 for a in (7, 8) for b in range(100)}

    def done(ids):
        return [audit.Completion(text="", ids=tuple(i), tokens=(), seconds=0.0, completion_tokens=2) for i in ids]

    rng = np.random.default_rng(0)
    fair = audit.exact_test(done([(int(a), int(b)) for a, b in zip(rng.choice([7, 8], 60), rng.integers(0, 100, 60))]),
                            exact)
    assert fair["tokens"] == 1 and fair["p_value"] > 1e-3 and fair["outside_support"] == 0
    skewed = audit.exact_test(done([(7, int(b)) for b in rng.integers(0, 100, 60)]), exact)  # never token 8
    assert skewed["tokens"] == 1 and skewed["p_value"] < 1e-6
    outside = audit.exact_test(done([(7, 100)] + [(8, 1)] * 59), exact)  # (7, 100) has probability 0
    assert outside["tokens"] == 2 and outside["p_value"] == 0 and outside["outside_support"] == 1
    untestable = audit.exact_test(done([(7, 1)] * 3), exact)  # 3 samples: not even the first token
    assert untestable["tokens"] == 0 and np.isnan(untestable["p_value"])
    assert audit.exact_test([], exact)["tokens"] == 0


def test_our_server_repeats_a_seed_honours_top_k_and_serves_greedy_alike_alone_and_concurrently(pair64):
    from specrepro.served import OursServer

    target, draft = pair64
    with OursServer(target, draft, gamma=2) as sp:
        client = audit.Client(sp.url)
        assert audit.probe(client, [0, 3, 5], n_tokens=4) == audit.Probe(True, True, True)
        prompts = [[0, 3, 5], [1, 2], [7, 7, 7, 7, 1]]
        m = audit.compare_outputs(audit.greedy(client, prompts, max_tokens=6),
                                  audit.greedy(client, prompts, max_tokens=6, concurrency=3))
        assert m.exact == 3
        with pytest.raises(audit.ServerError, match="400.*token ids"):
            client.complete("text", max_tokens=2)  # no tokenizer was given


def test_the_cli_audits_running_servers_and_prints_a_computed_verdict(pair64, capsys):
    import json

    from specrepro.served import OursServer

    target, draft = pair64
    with OursServer(target) as off, OursServer(target, draft, gamma=2, bug="greedy-draft-with-stochastic-ratio") as bad:
        assert audit.main(["--url", bad.url, "--baseline-url", off.url, "--prompt", "[0, 3, 5]", "--samples", "200",
                           "--tokens", "2", "--concurrency", "2", "--max-tokens", "4", "--power-replicates", "20"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["verdict"]["label"] == "differs: not explained by numerics"
        assert out["probe"] == dict(seed_repeats=True, top_k_1_is_greedy=True, returns_ids=True)
        assert audit.main(["--url", off.url, "--prompt", "[1, 2]", "--concurrency", "2", "--max-tokens", "3"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["concurrency"][0]["exact_match"] == 1.0 and "no --baseline-url" in out["cannot_test"][-1]


def test_transformers_assisted_and_prompt_lookup_generation_go_through_the_same_audit(pair64):
    from specrepro.drafts import PromptLookupDraft
    from specrepro.served import OursServer, TransformersServer

    target, draft = pair64
    prompt, cfg, n = [0, 3, 5], SamplingConfig(1.0, top_k=3), 300
    with TransformersServer(target, draft, gamma=2) as assisted, TransformersServer(target) as plain, \
            TransformersServer(target, PromptLookupDraft(), gamma=2) as lookup, OursServer(target) as ours:
        client = audit.Client(assisted.url)
        assert audit.probe(client, prompt, n_tokens=4) == audit.Probe(True, True, True)
        a, b = (audit.first_tokens(audit.Client(s.url), prompt, n_samples=n, n_tokens=2, cfg=cfg, concurrency=2)
                for s in (assisted, ours))
        assert all(x.drafted is None for x in a)  # transformers reports no drafted counts
        assert audit.homogeneity(keys(a), keys(b)).p_value > 0.01  # transformers' assisted sampling against ours
        prompts = [[0, 3, 5], [1, 2, 1, 2, 1, 2], [7, 7, 7, 7, 1]]
        reference = audit.greedy(audit.Client(plain.url), prompts, max_tokens=6)
        for s in (assisted, lookup, ours):
            assert audit.compare_outputs(reference, audit.greedy(audit.Client(s.url), prompts, max_tokens=6)).exact == 3
    with pytest.raises(TypeError, match="transformers cannot run"):
        TransformersServer(target, object())


def test_only_tests_where_speculation_ran_and_changed_the_draw_speak_about_it():
    def row(prompt, p, **kw):
        return dict(setting="T=1", prompt=prompt, p_value=p, cells=5, drafting_share=1.0, same_seed_pairs=50,
                    same_seed_identical=0.3, detectable_shift=0.2) | kw

    rows = [row(0, 0.001), row(1, 0.004, drafting_share=0.0), row(2, 0.005, same_seed_identical=1.0),
            row(3, 0.5, cells=1), row(4, 0.3, drafting_share=float("nan"))]  # NaN: the engine reports no counts
    kept, left_out = audit.speculation_tests(rows)
    assert [r["prompt"] for r in kept] == [0, 4]
    assert left_out == ["T=1, prompt 1: nothing drafted", "T=1, prompt 2: identical to off seed for seed",
                        "T=1, prompt 3: one cell"]
    # an engine whose speculation wrote the off-samples seed for seed is not called lossy by a seed-set difference
    seedwise = [row(i, 0.001, same_seed_identical=1.0) for i in range(3)]
    kept, left_out = audit.speculation_tests(seedwise)
    v = verdicts.engine_audit([r["p_value"] for r in kept], float("nan"), 0, 0, compared=8, left_out=left_out)
    assert v.label == "lossless at this power" and "3 left out" in v.reason
    # the same rejections where speculation did change the draw: contrary
    kept, left_out = audit.speculation_tests([row(i, 0.001) for i in range(3)])
    v = verdicts.engine_audit([r["p_value"] for r in kept], 0.2, 0, 0, compared=8, left_out=left_out)
    assert v.label == "differs: not explained by numerics"
    # too few same-seed pairs to call them identical: kept
    assert len(audit.speculation_tests([row(0, 0.001, same_seed_identical=1.0, same_seed_pairs=5)])[0]) == 1


def test_a_break_is_the_batchs_only_where_speculation_on_and_off_agreed_alone_and_off_kept_its_outputs():
    def row(speculation, concurrency, other):
        return dict(speculation=speculation, concurrency=concurrency, other=other, unclassified=0)

    batched = [row("on", 2, 1), row("off", 2, 0), row("on vs off, one at a time", 1, 0)]
    assert audit.batch_break(batched)
    assert not audit.batch_break([row("on", 2, 1), row("off", 2, 1), row("on vs off, one at a time", 1, 0)])
    # speculation on already differed from off alone: the concurrent output may just be off's (08's ngram-simple)
    assert not audit.batch_break([row("on", 2, 1), row("off", 2, 0), row("on vs off, one at a time", 1, 1)])
    assert not audit.batch_break([row("on", 2, 1), row("off", 2, 0)])  # the comparison alone did not run


def test_a_divergence_at_a_token_the_engine_flips_without_speculation_counts_as_its_numerics():
    """08's ngram-simple: speculation on diverged at prompt 4, token 5 (a 0.02-logit gap, no near-tie by our
    tolerance), alone and under concurrency, and llama.cpp with speculation off flipped the same token at 2 requests
    at once: the flip is within llama.cpp's numerics without speculation (consistent with numerics, not proof); a
    divergence elsewhere is still speculation's."""
    def div(speculation, prompt, position, kind="bug"):
        return dict(speculation=speculation, concurrency=2, prompt=prompt, position=position, kind=kind)

    def conc(speculation, other, concurrency=2):
        return dict(speculation=speculation, concurrency=concurrency, prompts=8, near_ties=0, other=other,
                    unclassified=0)

    seen = [div("on", 4, 5), div("on vs off, one at a time", 4, 5), div("off", 4, 5)]
    assert audit.engine_flips(seen) == 2
    rows = [conc("on", 1), conc("off", 1), conc("on vs off, one at a time", 1, 1)]
    v = audit.audit_verdict([], rows, seen)
    assert v.label == "differs: numerics only" and "2 at tokens the engine also flipped" in v.reason
    # contrary: off flipped another token, or nothing: speculation's divergence stands
    other = [div("on", 4, 5), div("on vs off, one at a time", 4, 5), div("off", 4, 6)]
    assert audit.engine_flips(other) == 0
    assert audit.audit_verdict([], rows, other).label == "differs: not explained by numerics"
    assert audit.audit_verdict([], rows).label == "differs: not explained by numerics"  # no divergence rows given
    # a near-tie is counted as one already, not twice
    assert audit.engine_flips([div("on", 4, 5, kind="near-tie"), div("off", 4, 5)]) == 0
