"""The small-row matmul switch computes the same products and leaves models' outputs unchanged."""

import pytest
import torch
from torch import nn

from specrepro import autoregressive_generate, speculative_generate
from specrepro.kernels import SmallRowLinear, use_small_row_matmul
from specrepro.tiny import tiny_pair


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 1, 24), (1, 3, 24), (2, 4, 24), (5, 24), (1, 9, 24), (0, 24)])
def test_small_row_linear_equals_linear(bias, shape):
    torch.manual_seed(0)
    lin = nn.Linear(24, 40, bias=bias)
    x = torch.randn(*shape)
    expected = lin(x)
    lin.__class__ = SmallRowLinear
    got = lin(x)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)
    if x.numel() // 24 > SmallRowLinear.max_rows:
        assert torch.equal(got, expected)  # many rows take the stock path


def test_switch_keeps_parameters_and_outputs_and_can_be_undone():
    target, draft = tiny_pair(16, seed=2)
    state = {k: v.clone() for k, v in target.state_dict().items()}
    x = torch.tensor([[1, 5, 3, 9, 2]])
    ref = autoregressive_generate(target, x, max_new_tokens=12, temperature=0).sequences
    ref_spec = speculative_generate(target, draft, x, gamma=3, max_new_tokens=12, temperature=0).sequences
    n = use_small_row_matmul(target)
    assert n == sum(isinstance(m, nn.Linear) for m in target.modules()) > 0
    assert all(torch.equal(v, state[k]) for k, v in target.state_dict().items())
    assert torch.equal(autoregressive_generate(target, x, max_new_tokens=12, temperature=0).sequences, ref)
    assert torch.equal(speculative_generate(target, draft, x, gamma=3, max_new_tokens=12, temperature=0).sequences,
                       ref_spec)
    assert use_small_row_matmul(target, enabled=False) == n
    assert not any(isinstance(m, SmallRowLinear) for m in target.modules())
