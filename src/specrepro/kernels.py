"""A CPU fix for verification forwards: matmuls with a few rows, computed as (W x^T)^T.

Speculative decoding pays off when a verification forward of gamma+1 tokens costs about one decode step, which holds
when decoding is memory-bound: the weights are read once whatever the number of rows. On the CPU this package was
built on (2-core AMD EPYC, torch 2.13 CPU wheel), `F.linear` with 2-3 rows instead took 2-3x the time of one row,
as if it read the weights once per row, and a 3-token forward of the target cost ~2 decode steps (03-latency,
section 0, measures this on the machine it runs on). Multiplying the other way round, W @ x^T (the rows become
the columns of a skinny right-hand side), reads the weights once; for one row it costs the same as `F.linear`.

`use_small_row_matmul(model)` switches every `nn.Linear` of a model to that formulation for inputs of at most
`max_rows` rows on the CPU (other inputs, and every other device, take the stock path). The result is the same
product, up to float summation order. It changes a model's speed, not its outputs' distribution, and applies to
everything that runs the model (our loops and transformers' `generate` alike), so comparisons stay like-for-like.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class SmallRowLinear(nn.Linear):
    """`nn.Linear` that computes inputs of at most `max_rows` rows on the CPU as (W @ x^T)^T."""

    max_rows: int = 8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(1, x.shape[-1])
        if x.device.type != "cpu" or rows > self.max_rows or rows == 0:
            return F.linear(x, self.weight, self.bias)
        y = (self.weight @ x.reshape(rows, x.shape[-1]).t()).t().reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def use_small_row_matmul(model: nn.Module, enabled: bool = True) -> int:
    """Switch every `nn.Linear` of `model` to `SmallRowLinear` (or back, with enabled=False), in place: the
    parameters and state dict are unchanged. Returns the number of layers switched."""
    switched = 0
    for module in model.modules():
        if enabled and type(module) is nn.Linear:
            module.__class__ = SmallRowLinear
            switched += 1
        elif not enabled and type(module) is SmallRowLinear:
            module.__class__ = nn.Linear
            switched += 1
    return switched


KERNELS = ("stock", "small_row")  # what `use_kernel` can switch a model's linear layers to


def use_kernel(model: nn.Module, name: str) -> int:
    """Switch `model`'s linear layers to the kernel `name` of `KERNELS`: "stock" (`nn.Linear`) or "small_row"
    (`SmallRowLinear`). Returns the number of layers switched; a draft that is not a module (prompt lookup) has none.
    """
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r}; choose from {KERNELS}")
    return use_small_row_matmul(model, enabled=name == "small_row") if isinstance(model, nn.Module) else 0
