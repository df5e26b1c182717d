"""The linear-layer kernels a model can run with: products of a few rows (decode steps, verifications), made fast.

Speculative decoding pays off when a verification forward of gamma+1 tokens costs about one decode step, which holds
when decoding is memory-bound: the weights are read once whatever the number of rows. The torch 2.13 CPU wheel does
not run these products that way. On the 2-core AMD EPYC hosts this package was built on, one row through `F.linear`
reads the weights at 11-15 GB/s against a copy at ~39 GB/s, and 2-3 rows took 2-3x the time of one row, as if the
weights were read once per row; on the 2-core Intel Xeon host one row reads at ~25 GB/s, about a copy's speed, but 4
and 8 rows at 15 and 12 GB/s (`python -m specrepro.timing` at ca2eaab; 03-latency section 0 and 07-regime section 1
measure this on the machine they run on). Three kernels, switched per model with `use_kernel`, so that every method
can be timed with each and compared at its fastest:

- "stock": `nn.Linear`, torch's product (MKL or oneDNN on the CPU; cuBLAS on a GPU).
- "small_row": `SmallRowLinear`, inputs of at most `max_rows` rows computed the other way round, (W @ x^T)^T: the
  rows become the columns of a skinny right-hand side and MKL's GEMM reads the weights once for them.
- "few_rows": `FewRowsLinear`, float32 inputs of at most `gemv.MAX_ROWS` rows through this package's own CPU kernel
  (`specrepro.gemv`): each weight row read once for all the rows, near the memory's speed; built with the machine's
  C++ compiler at first use. Where it cannot be built, `use_kernel` warns and keeps the stock layers. On the
  static-cache path (`compiled`) the same extension also runs the attention (`gemv.cache_attention`), and in
  compiled mode "native" the whole decoder step (`native`): "few_rows" names the package's kernel set.

Every kernel computes the same product up to float summation order: it changes a model's speed, not its outputs'
distribution, and applies to everything that runs the model (our loops and transformers' `generate` alike), so
comparisons stay like-for-like. Other inputs (more rows, other dtypes, other devices) take the stock path.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from . import gemv


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
    """Switch every linear layer of `model` to `SmallRowLinear` (or back to `nn.Linear`, with enabled=False), in
    place: the parameters and state dict are unchanged. Returns the number of layers switched (`use_kernel`)."""
    return use_kernel(model, "small_row" if enabled else "stock")


class FewRowsLinear(nn.Linear):
    """`nn.Linear` that computes float32 inputs of at most `gemv.MAX_ROWS` rows on the CPU with `gemv.few_rows`
    (each weight read once for all rows, near the memory's speed); other inputs, and anything that needs a gradient
    (training), take the stock path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(1, x.shape[-1])
        grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)  # no backward of its own
        if grad or x.device.type != "cpu" or x.dtype != torch.float32 or self.weight.dtype != torch.float32 \
                or not 0 < rows <= gemv.MAX_ROWS:
            return F.linear(x, self.weight, self.bias)
        x2 = x.reshape(rows, x.shape[-1])
        # traced: the operator (one node of the graph); eager: the built function itself, without the dispatcher
        y = torch.ops.specrepro.few_rows.default(x2, self.weight, self.bias) if torch.compiler.is_compiling() \
            else gemv.few_rows(x2, self.weight, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)


LINEARS = {"stock": nn.Linear, "small_row": SmallRowLinear, "few_rows": FewRowsLinear}
KERNELS = tuple(LINEARS)  # what `use_kernel` can switch a model's linear layers to


def use_kernel(model: nn.Module, name: str) -> int:
    """Switch `model`'s linear layers to the kernel `name` of `KERNELS`: "stock" (`nn.Linear`), "small_row"
    (`SmallRowLinear`) or "few_rows" (`FewRowsLinear`; where its operator cannot be built here, a warning says why and
    the layers take the stock path). Returns the number of layers switched; a draft that is not a module (prompt
    lookup) has none."""
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r}; choose from {KERNELS}")
    if not isinstance(model, nn.Module):
        return 0
    if name == "few_rows" and not gemv.available():
        gemv.warn_unavailable()
        name = "stock"
    cls, kinds = LINEARS[name], tuple(LINEARS.values())
    switched = 0
    for module in model.modules():
        if type(module) in kinds and type(module) is not cls:
            module.__class__ = cls
            switched += 1
        if name == "few_rows" and type(module) is cls:
            _align(module.weight)
    return switched


def use_kernels(models, name: str) -> None:
    """`use_kernel(model, name)` for each distinct model of `models`, once each (a lens draft shares the target's
    layers); None and models without linear layers (a lookup draft) are passed over."""
    for model in {id(m): m for m in models if m is not None}.values():
        use_kernel(model, name)


ALIGN = 64  # bytes: a cache line, and an AVX-512 register


@torch.no_grad()
def _align(weight: nn.Parameter) -> None:
    """Move `weight` to memory aligned to `ALIGN` bytes, in place (same values; a weight tied to another module is
    the same Parameter, so the tie holds). Weights loaded from a file are views at arbitrary offsets of one buffer,
    and the few-row kernel's vector loads then straddle cache lines: measured on the target, 4 rows at 22-24 GB/s
    unaligned against 30-32 aligned."""
    if weight.data_ptr() % ALIGN:
        weight.data = weight.data.clone(memory_format=torch.contiguous_format)


def usable(names) -> list[str]:
    """`names` (kernels or `bench.CONFIGS` entries) without the few-row ones where `gemv` cannot be built here (a
    warning says why), so that no table labels a stock run "few_rows"."""
    names = list(names)
    if any("few_rows" in n for n in names) and not gemv.available():
        gemv.warn_unavailable()
        return [n for n in names if "few_rows" not in n]
    return names
