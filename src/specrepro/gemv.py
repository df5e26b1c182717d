"""A float32 product for a few rows that reads the weights once, at the memory's speed: y = x W^T for x of 1..8 rows.

Batch-1 decoding and the verification of gamma + 1 tokens multiply a few rows by every weight matrix. On the CPUs
this package was built on, the torch 2.13 wheel runs these products far below the memory floor: one row through
`F.linear` (MKL's GEMV) reads the weights at 11-15 GB/s where a copy runs at ~39 GB/s, and 2-8 rows through MKL's
GEMM vary from 5 to 37 GB/s with the row count and the shape (measured per shape on a 2-core AMD EPYC, Zen 4).
llama.cpp's own F32 kernel reaches 1.07x the floor on the same machine. The product itself is simple: each weight
row is read once and meets every input row while it is in registers, so k rows cost about what one row costs until
the arithmetic, k multiply-adds per weight, catches up with the memory (the machine's ridge, 07-regime section 1b).

This module compiles that loop once per machine (`torch.utils.cpp_extension.load_inline`, about a minute, cached on
disk under the extension's name, which carries a hash of the source and of the CPU's instruction-set flags, so
another host rebuilds) and registers it as the CPU implementation of the operator `specrepro::few_rows` (a C++
kernel behind the dispatcher, with a shape function), so that `torch.compile` calls it as one opaque kernel. It
takes R weight rows at a time (as many as keep R x N vectors of partial sums in registers: 16 with AVX-512, 8 with
AVX2, each one register wide), so that each load of x serves R rows. The sum over each weight row is split into
one register's worth of partial sums (`LANES` = 16 with AVX-512, 8 with AVX2) added in a fixed order: the result is
deterministic on a machine, equal to `F.linear` up to float summation order, and the same for a row whatever the
other rows are (the batched-equality tests rely on that). An AVX2 build (`-march=x86-64-v3`) was checked on the
AVX-512 AMD host: the same correctness, and 41 / 38 / 27 GB/s for 1 / 4 / 8 rows against 42 / 30 / 30 for the
native build and 12 / 10 / 10 for torch's product, measured side by side. `python -m specrepro.timing` measures
each kernel's read speed on the target, beside a copy's, on the machine it runs on.

`available()` says whether the operator could be built here (a C++ compiler with OpenMP); `kernels.use_kernel(model,
"few_rows")` routes a model's linear layers through it, and falls back to the stock product, with a warning naming
the compiler error, where it cannot be built.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import warnings

import torch

MAX_ROWS = 8  # inputs of more rows take the stock path (a GEMM with enough rows is compute-bound anyway)
LANES = 16  # partial sums per output with AVX-512 (8 with AVX2), added in a fixed order; tests size inputs by it

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
// Software prefetch of the weight row PREFETCH rows ahead: with 4-8 input rows the loop is slow enough that the
// hardware prefetchers fall behind (measured on the AMD host: 27 -> 33 GB/s at 4 rows, 20 -> 28 at 8; one row
// unchanged). Into the outer caches (locality 1, prefetcht2), not non-temporally (locality 0, prefetchnta): a
// block's rows are prefetched a whole block ahead, 18-49 KB for these layers, and on the Intel host
// prefetchnta read the weights at 9-10 GB/s for 1-8 rows, prefetcht2 at 19-24 (python -m specrepro.timing at
// 8a6f1e8 and ca2eaab; likely a non-temporal line evicted before its use, so read twice, not measured).
#define PREFETCH 8
#define PREFETCH_LOCALITY 1

// The partial sums are GCC vectors of the machine's register width, VW floats (16 with AVX-512, 8 otherwise; a
// vector wider than a register is spilled by GCC, measured at a third of the speed), and R weight rows x N input
// rows of them stay in registers: ACCS of the 32 AVX-512 or 16 AVX2 registers, the rest for the loads.
#ifdef __AVX512F__
constexpr int VW = 16;
constexpr int ACCS = 16;
#else
constexpr int VW = 8;
constexpr int ACCS = 8;
#endif

// y[n, o] = sum_i x[n, i] * w[o, i] (+ b[o]) for N rows of x. Each weight is read once for all N rows, R weight
// rows at a time (so that each load of x serves R rows). Every output is the same sum in the same order, VW partial
// sums over i = l mod VW added in lane order, then the tail, whatever N and R are: a row's result does not depend
// on the other rows (on one machine: the order depends on VW).
typedef float vec __attribute__((vector_size(VW * sizeof(float))));

static inline vec loadv(const float* p) {
  vec v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

template <int N, int R>
static inline void block(const float* __restrict w, const float* __restrict x, const float* __restrict b,
                         float* __restrict y, int64_t o, int64_t out, int64_t in) {
  const int64_t body = in - in % VW;
  vec acc[R][N];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) acc[r][n] = vec{};
  for (int64_t i = 0; i < body; i += VW) {
    vec xv[N];
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) xv[n] = loadv(x + n * in + i);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vec wv = loadv(w + (o + r) * in + i);
      __builtin_prefetch(w + (o + r + PREFETCH) * in + i, 0, PREFETCH_LOCALITY);  // past the end: never a fault
#pragma GCC unroll 8
      for (int n = 0; n < N; ++n) acc[r][n] += wv * xv[n];
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* wr = w + (o + r) * in;
    for (int n = 0; n < N; ++n) {
      float s = 0.f;
      for (int l = 0; l < VW; ++l) s += acc[r][n][l];
      for (int64_t i = body; i < in; ++i) s += wr[i] * x[n * in + i];
      y[n * out + o + r] = b ? s + b[o + r] : s;
    }
  }
}

template <int N>
static void few_rows_kernel(const float* __restrict w, const float* __restrict x, const float* __restrict b,
                            float* __restrict y, int64_t out, int64_t in) {
  constexpr int R = ACCS / N < 1 ? 1 : ACCS / N > 8 ? 8 : ACCS / N;  // weight rows per step
  at::parallel_for(0, (out + R - 1) / R, 4, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t o = k * R;
      if (o + R <= out) {
        block<N, R>(w, x, b, y, o, out, in);
      } else {
        for (int64_t p = o; p < out; ++p) block<N, 1>(w, x, b, y, p, out, in);
      }
    }
  });
}

torch::Tensor few_rows(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "few_rows: CPU tensors only");
  TORCH_CHECK(x.dtype() == torch::kFloat32 && w.dtype() == torch::kFloat32, "few_rows: float32 only");
  TORCH_CHECK(!bias.has_value() || (bias->device().is_cpu() && bias->dtype() == torch::kFloat32 &&
              bias->numel() == w.size(0)), "few_rows: bias (out,) float32 on the CPU");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "few_rows: x (N, in), w (out, in)");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= 8, "few_rows: 1 to 8 rows");
  auto xc = x.contiguous();
  auto wc = w.contiguous();
  torch::Tensor bc;
  if (bias.has_value()) bc = bias->contiguous();
  const float* bp = bias.has_value() ? bc.data_ptr<float>() : nullptr;
  const int64_t out = wc.size(0), in = wc.size(1);
  auto y = torch::empty({xc.size(0), out}, xc.options());
  const float *wp = wc.data_ptr<float>(), *xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  switch (xc.size(0)) {
    case 1: few_rows_kernel<1>(wp, xp, bp, yp, out, in); break;
    case 2: few_rows_kernel<2>(wp, xp, bp, yp, out, in); break;
    case 3: few_rows_kernel<3>(wp, xp, bp, yp, out, in); break;
    case 4: few_rows_kernel<4>(wp, xp, bp, yp, out, in); break;
    case 5: few_rows_kernel<5>(wp, xp, bp, yp, out, in); break;
    case 6: few_rows_kernel<6>(wp, xp, bp, yp, out, in); break;
    case 7: few_rows_kernel<7>(wp, xp, bp, yp, out, in); break;
    default: few_rows_kernel<8>(wp, xp, bp, yp, out, in); break;
  }
  return y;
}

// The CPU kernel of the operator `specrepro::few_rows` (its schema is defined in Python, `gemv._LIB`): called through
// the dispatcher in C++, so a compiled graph skips the Python a `torch.library.custom_op` runs at every call. Only the
// native build registers it (`build_for` defines SPECREPRO_NO_REGISTER for the others): a second registration
// would replace the operator's kernel for the rest of the process.
#ifndef SPECREPRO_NO_REGISTER
TORCH_LIBRARY_IMPL(specrepro, CPU, m) { m.impl("few_rows", &few_rows); }
#endif
"""


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def extension_name() -> str:
    """The extension's name: a hash of the source, the flags it is compiled with and the host's CPU flags
    (`-march=native` makes the binary specific to the host that built it)."""
    text = SOURCE + " ".join(_CFLAGS) + _cpu_flags() + torch.__version__
    return "specrepro_few_rows_" + hashlib.sha256(text.encode()).hexdigest()[:12]


_CFLAGS = ("-O3", "-march=native", "-fopenmp")


@functools.cache
def _build():
    """Compile and load the extension (cached on disk by torch; about a minute the first time on a machine).
    Returns the module, or the exception that stopped the build."""
    try:
        return build_for("native")
    except Exception as err:  # no compiler, no OpenMP, a header mismatch: the caller falls back to F.linear
        return err


def build_for(march: str):
    """The extension compiled for `-march=march` ("native" is what `few_rows` uses and the one that implements the
    operator; e.g. "x86-64-v3", AVX2 without AVX-512, lets an AVX-512 machine test the code path of an AVX2 one
    through the module's own `few_rows`). Raises where it cannot be built."""
    from torch.utils import cpp_extension

    flags = [f if not f.startswith("-march=") else f"-march={march}" for f in _CFLAGS]
    if march != "native":  # the operator keeps the native build's kernel; this one is called directly
        flags.append("-DSPECREPRO_NO_REGISTER")
    name = extension_name() if march == "native" else f"{extension_name()}_{march.replace('-', '_')}"
    return cpp_extension.load_inline(name=name, cpp_sources=SOURCE, functions=["few_rows"], extra_cflags=flags,
                                     extra_ldflags=["-fopenmp"], verbose=False)


def has_compiler() -> bool:
    """Whether the C++ compiler torch's extension builder uses (`$CXX`, else `c++`) is on the PATH: where it is
    not, the kernel cannot be built and its tests skip."""
    return shutil.which(os.environ.get("CXX", "c++")) is not None


def available() -> bool:
    """Whether the operator is built (building it if needed) on this machine."""
    return not isinstance(_build(), Exception)


def build_error() -> str | None:
    """Why the operator could not be built here, or None."""
    built = _build()
    return f"{type(built).__name__}: {str(built).strip().splitlines()[-1] if str(built).strip() else ''}" \
        if isinstance(built, Exception) else None


_LIB = torch.library.Library("specrepro", "FRAGMENT")  # kept alive: the operator lives as long as the module
_LIB.define("few_rows(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor")


def _built():
    """The built extension, or a RuntimeError that says what to do instead."""
    built = _build()
    if isinstance(built, Exception):
        raise RuntimeError(f"the few-row kernel could not be built here ({build_error()}); use the stock kernel")
    return built


def few_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (N, in) float32, N in 1..`MAX_ROWS`, weight (out, in), bias (out,) or None -> (N, out) on the CPU.

    Eager callers come here: the built function, called directly, without the dispatcher's per-call overhead (a
    linear layer of the target is called ~200 times per decode step). A compiled graph calls the operator
    `torch.ops.specrepro.few_rows` instead (`kernels.FewRowsLinear`), the same C++ function through the dispatcher."""
    return _built().few_rows(x, weight, bias)


@torch.library.register_fake("specrepro::few_rows", lib=_LIB)
def _(x, weight, bias=None):
    """The operator's output shape, for tracing. It also builds the kernel, which registers the operator's CPU
    implementation: a graph traced here never runs into an operator without one."""
    _built()
    return x.new_empty((x.shape[0], weight.shape[0]))


def warn_unavailable() -> None:
    warnings.warn(f"the few-row kernel could not be built on this machine ({build_error()}); the linear layers "
                  "keep the stock product. It needs a C++ compiler with OpenMP (e.g. apt install g++).",
                  RuntimeWarning, stacklevel=3)
