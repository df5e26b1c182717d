"""Two independent FLOP counters agree exactly; the operation counter, bytes and ledger are consistent."""

import pytest
import torch
from transformers import PhiConfig, PhiForCausalLM

from specrepro import autoregressive_generate, flops, speculative_generate
from specrepro.tiny import tiny_draft, tiny_target


def _phi():
    cfg = PhiConfig(vocab_size=40, hidden_size=16, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, partial_rotary_factor=0.5, tie_word_embeddings=True)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return PhiForCausalLM(cfg).eval()


MODELS = {"llama-gqa": lambda: tiny_target(32, hidden_size=16, layers=2, dtype=torch.float32),
          "gpt2": lambda: tiny_draft(32, dtype=torch.float32), "phi": _phi}


@pytest.mark.parametrize("arch", MODELS)
@pytest.mark.parametrize("new_tokens,cache_len,logits", [(1, 0, None), (1, 9, 1), (4, 7, None), (5, 3, 5),
                                                          (3, 12, 1), (8, 0, 1)])
def test_analytic_equals_flop_counter(arch, new_tokens, cache_len, logits):
    model = MODELS[arch]()
    assert flops.forward_flops(model.config, new_tokens, cache_len, logits) == \
        flops.measured_forward_flops(model, new_tokens, cache_len, logits)


def test_analytic_formula_by_hand_for_smollm2_shape():
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    parts = flops.forward_flops_breakdown(cfg, 1, 100)
    assert parts["attn_proj"] == 30 * 2 * 576 * (2 * 576 + 2 * 192)
    assert parts["mlp"] == 30 * 2 * 576 * 1536 * 3
    assert parts["attn_scores"] == parts["attn_values"] == 30 * 2 * 9 * 101 * 64
    assert parts["lm_head"] == 2 * 576 * 49152
    # the linear layers of one decode step are 2 FLOPs per parameter (134.5M, embedding counted once through the
    # tied LM head), short only of the norms' weights (61 x 576)
    linear = parts["attn_proj"] + parts["mlp"] + parts["lm_head"]
    assert 2 * 134_515_008 - linear == 2 * 61 * 576


def test_verification_work_grows_as_gamma_plus_one():
    model = MODELS["llama-gqa"]()
    c = 50
    one = flops.forward_flops_breakdown(model.config, 1, c, logits=1)
    for gamma in (1, 3, 7):
        verify = flops.forward_flops_breakdown(model.config, gamma + 1, c, logits=gamma + 1)
        for part in ("attn_proj", "mlp", "lm_head"):  # linear layers: exactly gamma + 1 times the work
            assert verify[part] == (gamma + 1) * one[part]
        for part in ("attn_scores", "attn_values"):  # attention: gamma + 1 queries over gamma more keys
            assert verify[part] * (c + 1) == one[part] * (gamma + 1) * (c + gamma + 1)


def test_operation_counter_matmul_part_matches_flop_counter_and_sees_the_rest():
    model = MODELS["llama-gqa"]()
    ids = torch.zeros(1, 6, dtype=torch.long)
    count, _ = flops.count_operations(lambda: model(input_ids=ids))
    assert count.matmul == flops.forward_flops(model.config, 6, 0)
    assert count.elementwise > 0 and count.reduction > 0
    assert {"silu", "mul", "add"} <= set(count.by_op)  # SwiGLU, RMSNorm, residuals
    assert 0 < count.non_matmul_fraction < 0.5


def test_unknown_architecture_is_refused():
    class Cfg:
        model_type = "mamba"
    with pytest.raises(ValueError, match="no FLOP formula for model_type 'mamba'"):
        flops.forward_flops(Cfg(), 1)


def test_bytes_and_intensity_decode_is_memory_bound_verify_less_so():
    model = MODELS["llama-gqa"]()
    b1 = flops.forward_bytes(model.config, 1, 100)
    params = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    # weights: every layer weight + the (untied) LM head once, plus one embedding row per token
    assert b1["weights"] == 4 * (params + 16)
    assert flops.arithmetic_intensity(model.config, 5, 100) > 4 * flops.arithmetic_intensity(model.config, 1, 100)


def test_ledger_adds_up_to_every_forward():
    target = tiny_target(8, seed=0, dtype=torch.float32)
    draft = tiny_draft(8, dtype=torch.float32)
    ids = torch.tensor([[0, 3, 5]])
    r = speculative_generate(target, draft, ids, gamma=3, max_new_tokens=20, generator=torch.Generator().manual_seed(0))
    led = flops.ledger(r.stats, target.config, draft.config)
    expect_t = sum(flops.forward_flops(target.config, n, c, logits=g + 1)
                   for (n, c), g in zip(r.stats.target_forwards, r.stats.proposed))
    expect_d = sum(flops.forward_flops(draft.config, n, c, logits=1) for n, c in r.stats.draft_forwards)
    assert led.total == expect_t + expect_d
    assert led.prefill == (flops.forward_flops(target.config, 2, 0, logits=0)
                           + flops.forward_flops(draft.config, 2, 0, logits=0))
    assert (led.target_wasted > 0) == any(n < g for n, g in zip(r.stats.accepted, r.stats.proposed))
    ar = autoregressive_generate(target, ids, max_new_tokens=20, generator=torch.Generator().manual_seed(0))
    led_ar = flops.ledger(ar.stats, target.config)
    assert led_ar.wasted_fraction == 0 and led_ar.total == sum(
        flops.forward_flops(target.config, n, c, logits=1) for n, c in ar.stats.target_forwards)


def test_operations_vs_theory_counts_full_gamma_iterations_only():
    from specrepro.generate import GenerationStats

    # no layers: a forward costs its LM head alone, 2 * d * V = 80 FLOPs per logit row
    shape = flops.Shape(d_model=4, layers=0, heads=1, kv_heads=1, head_dim=4, d_ff=8, vocab=10, gated=False, tied=True)
    ar = GenerationStats(prompt_len=1, new_tokens=4, target_forwards=[(1, 0), (1, 1), (1, 2), (1, 3)])
    # gamma 2: all accepted (3 tokens), none accepted (1 token, 2 of 3 rows wasted), then a last, shortened one
    sp = GenerationStats(prompt_len=1, new_tokens=6, target_forwards=[(3, 0), (3, 3), (2, 4)],
                         draft_forwards=[(1, 0)] * 5, proposed=[2, 2, 1], accepted=[2, 0, 1])
    row = flops.operations_vs_theory([ar], [sp], 2, shape, None, context=3)
    assert row["alpha"] == 2 / 3  # 2 accepted of 3 tested; the shortened iteration is left out
    assert row["c_hat"] == 0.0
    assert row["measured_ops_factor"] == 1.5  # (2 * 240 FLOPs / 4 tokens) / (320 / 4)
    assert row["wasted_fraction"] == 1 / 3  # 160 of 480
    assert row["tokens_per_iteration"] == 2.0  # (3 + 1 + 2) / 3, every iteration
    assert row["thm_3_11"] == pytest.approx(27 / 19)  # (1 - a)(2 + 1) / (1 - a^3) at a = 2/3
    assert row["rel_gap"] == pytest.approx(1.5 * 19 / 27 - 1)


def test_c_hat_is_the_ratio_of_decode_step_flops():
    target, draft = tiny_target(16), tiny_draft(16)
    assert flops.c_hat(target.config, target.config, 10) == 1.0
    assert flops.c_hat(target.config, None, 10) == 0.0
    assert flops.c_hat(target.config, draft.config, 10) == (flops.forward_flops(draft.config, 1, 10, logits=1)
                                                            / flops.forward_flops(target.config, 1, 10, logits=1))


def test_operations_per_token_counts_every_decode_forward_and_leaves_the_prefill_out():
    from functools import partial

    from specrepro import autoregressive_generate, speculative_generate

    target, draft = tiny_target(16), tiny_draft(16)
    ids = [torch.tensor([[1, 2, 3, 4]]), torch.tensor([[5, 6]])]
    ar = flops.operations_per_token(partial(autoregressive_generate, target, temperature=0), ids, 6)
    assert ar["tokens"] == 10 and len(ar["results"]) == 2
    # greedy autoregressive: tokens 2..6 of each prompt are one 1-token forward each, on caches of L..L+4
    expected = sum(flops.measured_forward_flops(target, 1, L + k, logits=1) for L in (4, 2) for k in range(5))
    assert ar["matmul_per_token"] == pytest.approx(expected / 10, rel=1e-9)
    assert ar["operations_per_token"] > ar["matmul_per_token"]  # norms, softmax, activations
    sp = flops.operations_per_token(partial(speculative_generate, target, draft, gamma=3, temperature=0), ids, 6)
    assert sp["matmul_per_token"] > ar["matmul_per_token"]  # a random draft: more work per token, not less
    with pytest.raises(ValueError, match="raise max_new_tokens"):
        flops.operations_per_token(partial(autoregressive_generate, target, temperature=0), ids, 1)
