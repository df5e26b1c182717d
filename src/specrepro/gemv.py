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

The same extension holds the static path's attention, the operator `specrepro::cache_attention`
(`cache_attention`): a few query rows over a static KV cache, each query head reading its group's key-value head in
place, each row reading its slots only up to its last unmasked one. torch's sdpa reads every slot of the static
cache, masked (on SmolLM2, 512 slots where 07's decode step has 257 filled); here the slots are split into tasks of
64 (so that 2 threads share even one head), each task's softmax kept as (max, sum, weighted sum) and the tasks merged
in slot order, so that the result does not depend on the thread count or on the other rows. The exponential is a
vectorised polynomial (Cephes'), within about 1 ulp; the whole within float32 rounding of sdpa (tests). `compiled`
runs it where the model's linear layers run the few-row kernel.

The same extension holds the native decoder step, the operator `specrepro::llama_step` (`native`, compiled mode
"native"): every layer of a Llama decoder for a few tokens in one OpenMP region, these two kernels' loops split
between the threads (a product's weight rows in units of 8, the attention's slot chunks, the merges), barriers
between the steps that read what another thread wrote. Each output is still one thread's sum in a fixed order, so
a token's logits do not depend on the other tokens of the forward or on the thread count.

`available()` says whether the operators could be built here (a C++ compiler with OpenMP); `kernels.use_kernel(model,
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
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>
#include <cstring>
#include <omp.h>
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
// on the other rows (on one machine: the order depends on VW). ADD: y += the product (a residual connection).
typedef float vec __attribute__((vector_size(VW * sizeof(float))));

static inline vec loadv(const float* p) {
  vec v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

template <int N, int R, bool ADD = false>
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
      if (ADD) y[n * out + o + r] += s;
      else y[n * out + o + r] = b ? s + b[o + r] : s;
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

// Attention over a static KV cache for a few query rows (a decode step, a verification), transformers' layout:
// out[b, t, h, :] = sum_s softmax_s(scale q[b, h, t, :] . k[b, g, s, :]) v[b, g, s, :] over the slots s that
// mask[b, 0, t, s] lets query t see, g = h / (H / Hk) (grouped-query heads read their key-value head in place). A
// row reads its slots up to its last unmasked one (a static cache's empty tail is never read), in tasks of CHUNK
// slots of one key-value head (split-K, so that 2 threads share even a single head), each task's partial softmax
// merged in slot order: the result does not depend on the thread count or on the other rows of the batch. A query
// that sees no slot gets zeros.
typedef int32_t ivec __attribute__((vector_size(VW * sizeof(int32_t))));
// exp(x) for x <= 0, a lane at a time in registers (Cephes' expf: x = n ln2 + r, |r| <= ln2/2, a degree-6
// polynomial in r, times 2^n through the exponent bits): within 1.02 ulp of the exact value at every 7th float of
// [-87, 0] (checked against double exp). x <= -88 (masked slots are -inf) gives exactly 0.
static inline vec exp_neg(vec x) {
  const vec lo = vec{} - 88.f;
  x = x < lo ? lo : x;
  const ivec n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, ivec);  // round to nearest for x <= 0
  const vec nf = __builtin_convertvector(n, vec);
  const vec r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  vec p = vec{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vec y = p * r * r + r + 1.f;
  const ivec bits = (n + 127) << 23;
  vec two;
  __builtin_memcpy(&two, &bits, sizeof(two));
  return y * two;
}
constexpr int64_t CHUNK = 64;  // slots per task

// The lanes of a vector added pairwise, a fixed tree, in registers (a sum through memory, lane by lane, took most
// of a decode step's attention time).
#ifdef __AVX512F__
typedef float half __attribute__((vector_size(8 * sizeof(float))));
static inline float hsum(vec a) {
  const half h = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
#else
static inline float hsum(vec h) {
#endif
  typedef float quarter __attribute__((vector_size(4 * sizeof(float))));
  const quarter q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
  return (q[0] + q[2]) + (q[1] + q[3]);
}

static inline float dot(const float* __restrict a, const float* __restrict b, int64_t d) {
  if (d % VW == 0) {
    vec acc{};
    for (int64_t i = 0; i < d; i += VW) acc += loadv(a + i) * loadv(b + i);
    return hsum(acc);
  }
  float s = 0.f;
  for (int64_t i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}

struct Views {
  const float *q, *k, *v;
  const bool* m;
  int64_t ks0, ks1, ks2, vs0, vs1, vs2, msb, H, W, D, S, Hk, rep, J, chunks;
  float scale;
};

// One task: the slots [c * CHUNK, (c + 1) * CHUNK) of row b's key-value head g, for its rep x W queries: per query
// the chunk's max score m, its sum of exp(score - m) l and its sum of exp(score - m) v (the partial a merge rescales).
// DD: the head size where it is a multiple of the vector width (the loops over it unrolled), else 0 (a runtime loop).
template <int DD>
static void chunk_task(const Views& a, const std::vector<int64_t>& used, float* part, float* score,
                       const float** qj, const bool** mj, int64_t task) {
  const int64_t D = DD ? DD : a.D, J = a.J, P = D + 2;
  const int64_t c = task % a.chunks, g = (task / a.chunks) % a.Hk, b = task / (a.chunks * a.Hk);
  const float ninf = -std::numeric_limits<float>::infinity();
  float* out = part + task * J * P;  // per query j: m, l, acc[D]
  const int64_t s0 = c * CHUNK, s1 = std::min(s0 + CHUNK, used[b]);
  for (int64_t j = 0; j < J; ++j) out[j * P + 1] = 0.f;
  if (s0 >= s1) return;
  const float* kg = a.k + b * a.ks0 + g * a.ks1;
  const float* vg = a.v + b * a.vs0 + g * a.vs1;
  for (int64_t j = 0; j < J; ++j) {
    const int64_t h = g * a.rep + j / a.W, t = j % a.W;
    qj[j] = a.q + ((b * a.H + h) * a.W + t) * D;
    mj[j] = a.m + b * a.msb + t * a.S;
  }
  for (int64_t s = s0; s < s1; ++s) {
    const float* ks = kg + s * a.ks2;
    if constexpr (DD != 0) {
      vec kv[DD / VW];
#pragma GCC unroll 8
      for (int i = 0; i < DD / VW; ++i) kv[i] = loadv(ks + i * VW);
      for (int64_t j = 0; j < J; ++j) {
        vec acc = kv[0] * loadv(qj[j]);
#pragma GCC unroll 8
        for (int i = 1; i < DD / VW; ++i) acc += kv[i] * loadv(qj[j] + i * VW);
        score[j * CHUNK + s - s0] = mj[j][s] ? a.scale * hsum(acc) : ninf;
      }
    } else {
      for (int64_t j = 0; j < J; ++j) score[j * CHUNK + s - s0] = mj[j][s] ? a.scale * dot(qj[j], ks, D) : ninf;
    }
  }
  for (int64_t j = 0; j < J; ++j) {
    float* sj = score + j * CHUNK;
    for (int64_t s = s1 - s0; s < CHUNK; ++s) sj[s] = ninf;
    float mx = ninf;
    for (int64_t s = 0; s < s1 - s0; ++s) mx = sj[s] > mx ? sj[s] : mx;
    float l = 0.f;
    if (mx != ninf) {
      vec lv{};
      for (int64_t s = 0; s < CHUNK; s += VW) {
        const vec e = exp_neg(loadv(sj + s) - mx);
        __builtin_memcpy(sj + s, &e, sizeof(e));
        lv += e;
      }
      l = hsum(lv);
    }
    out[j * P] = mx;
    out[j * P + 1] = l;
    for (int64_t d = 0; d < D; ++d) out[j * P + 2 + d] = 0.f;
  }
  for (int64_t s = s0; s < s1; ++s) {
    const float* __restrict vs = vg + s * a.vs2;
    if constexpr (DD != 0) {
      vec vv[DD / VW];
#pragma GCC unroll 8
      for (int i = 0; i < DD / VW; ++i) vv[i] = loadv(vs + i * VW);
      for (int64_t j = 0; j < J; ++j) {
        const float p = score[j * CHUNK + s - s0];
        float* acc = out + j * P + 2;
#pragma GCC unroll 8
        for (int i = 0; i < DD / VW; ++i) {
          const vec r = loadv(acc + i * VW) + p * vv[i];
          __builtin_memcpy(acc + i * VW, &r, sizeof(r));
        }
      }
    } else {
      for (int64_t j = 0; j < J; ++j) {
        const float p = score[j * CHUNK + s - s0];
        float* __restrict acc = out + j * P + 2;
        for (int64_t d = 0; d < D; ++d) acc[d] += p * vs[d];
      }
    }
  }
}

// One query's tasks merged in slot order (each `stride` floats after the last, as chunk_task writes them) into its
// output yo (D floats): the softmax-weighted sum of the values over the slots it sees; zeros where it sees none.
static void merge_query(const float* base, int64_t chunks, int64_t stride, int64_t D, float* __restrict yo) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t d = 0; d < D; ++d) yo[d] = 0.f;
  float mx = ninf;
  for (int64_t c = 0; c < chunks; ++c) if (base[c * stride + 1] > 0.f) mx = std::max(mx, base[c * stride]);
  if (mx == ninf) return;  // no slot to attend to
  float l = 0.f;
  for (int64_t c = 0; c < chunks; ++c) {
    const float* pc = base + c * stride;
    if (pc[1] == 0.f) continue;
    const float f = std::exp(pc[0] - mx);
    l += f * pc[1];
    for (int64_t d = 0; d < D; ++d) yo[d] += f * pc[2 + d];
  }
  for (int64_t d = 0; d < D; ++d) yo[d] /= l;
}

torch::Tensor cache_attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                              const torch::Tensor& mask, double scale) {
  TORCH_CHECK(query.device().is_cpu() && key.device().is_cpu() && value.device().is_cpu() && mask.device().is_cpu(),
              "cache_attention: CPU tensors only");
  TORCH_CHECK(query.dtype() == torch::kFloat32 && key.dtype() == torch::kFloat32 && value.dtype() == torch::kFloat32,
              "cache_attention: float32 only");
  TORCH_CHECK(mask.dtype() == torch::kBool, "cache_attention: a boolean mask (True: attend)");
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.sizes() == key.sizes() && mask.dim() == 4,
              "cache_attention: query (B, H, W, D), key and value (B, Hk, S, D), mask (B, 1, W, S)");
  const int64_t B = query.size(0), H = query.size(1), W = query.size(2), D = query.size(3);
  const int64_t Hk = key.size(1), S = key.size(2);
  TORCH_CHECK(key.size(0) == B && key.size(3) == D && Hk >= 1 && H % Hk == 0, "cache_attention: shapes disagree");
  TORCH_CHECK((mask.size(0) == B || mask.size(0) == 1) && mask.size(1) == 1 && mask.size(2) == W && mask.size(3) == S,
              "cache_attention: mask (B, 1, W, S)");
  auto q = query.contiguous();
  auto k = key.stride(3) == 1 ? key : key.contiguous();
  auto v = value.stride(3) == 1 ? value : value.contiguous();
  auto m = mask.contiguous();
  const int64_t rep = H / Hk, J = rep * W;
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const bool* mp = m.data_ptr<bool>();
  const int64_t msb = m.size(0) == 1 ? 0 : W * S;
  // the slots a row reads: up to its last unmasked one
  std::vector<int64_t> used(B, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < W; ++t)
      for (int64_t s = S - 1; s >= used[b]; --s)
        if (mp[b * msb + t * S + s]) { used[b] = s + 1; break; }
  const int64_t most = *std::max_element(used.begin(), used.end());
  const int64_t chunks = std::max<int64_t>(1, (most + CHUNK - 1) / CHUNK), P = D + 2;  // the slots some row reads
  std::unique_ptr<float[]> part(new float[B * Hk * chunks * J * P]);  // each task writes what the merge reads
  const float sc = static_cast<float>(scale);
  const Views views{qp, kp, vp, mp, k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
                    msb, H, W, D, S, Hk, rep, J, chunks, sc};
  at::parallel_for(0, B * Hk * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> score(J * CHUNK);
    std::vector<const float*> qj(J);
    std::vector<const bool*> mj(J);
    for (int64_t task = begin; task < end; ++task) {
      switch (D % VW ? 0 : D) {  // the common head sizes unrolled, others through the runtime loop
        case 64: chunk_task<64>(views, used, part.get(), score.data(), qj.data(), mj.data(), task); break;
        case 128: chunk_task<128>(views, used, part.get(), score.data(), qj.data(), mj.data(), task); break;
        case 32: chunk_task<32>(views, used, part.get(), score.data(), qj.data(), mj.data(), task); break;
        case 16: chunk_task<16>(views, used, part.get(), score.data(), qj.data(), mj.data(), task); break;
        default: chunk_task<0>(views, used, part.get(), score.data(), qj.data(), mj.data(), task); break;
      }
    }
  });
  auto y = torch::empty({B, W, H, D}, q.options());
  float* yp = y.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < Hk; ++g)
      for (int64_t j = 0; j < J; ++j) {
        const int64_t h = g * rep + j / W, t = j % W;
        merge_query(part.get() + ((b * Hk + g) * chunks) * J * P + j * P, chunks, J * P, D,
                    yp + ((b * W + t) * H + h) * D);
      }
  return y;
}

// ---- The native decoder step: every layer of a Llama-architecture decoder for a few new tokens, in one call ----
// What a compiled graph of the same forward runs as ~400 kernel launches from a Python wrapper (inductor's code,
// this package's linear layers and attention), here in one OpenMP parallel region: per layer, the threads split
// each product's weight rows between them (each weight read once, by one thread, as few_rows reads it), the
// attention's slot chunks, and the merges, and meet at a barrier between the steps that read what others wrote.
constexpr int64_t UNIT = 8;  // weight rows a thread takes at a time: a multiple of every row block R but the tail

// y (N, out) (+)= x (N, in) W^T for the weight rows [o0, o1): few_rows' blocks, so the same sums in the same order.
template <int N, bool ADD>
static void rows_range(const float* w, const float* x, float* y, int64_t out, int64_t in, int64_t o0, int64_t o1) {
  constexpr int R = ACCS / N < 1 ? 1 : ACCS / N > 8 ? 8 : ACCS / N;
  int64_t o = o0;
  for (; o + R <= o1; o += R) block<N, R, ADD>(w, x, nullptr, y, o, out, in);
  for (; o < o1; ++o) block<N, 1, ADD>(w, x, nullptr, y, o, out, in);
}

template <bool ADD>
static void rows_any(int64_t n, const float* w, const float* x, float* y, int64_t out, int64_t in, int64_t o0,
                     int64_t o1) {
  switch (n) {
    case 1: rows_range<1, ADD>(w, x, y, out, in, o0, o1); break;
    case 2: rows_range<2, ADD>(w, x, y, out, in, o0, o1); break;
    case 3: rows_range<3, ADD>(w, x, y, out, in, o0, o1); break;
    case 4: rows_range<4, ADD>(w, x, y, out, in, o0, o1); break;
    case 5: rows_range<5, ADD>(w, x, y, out, in, o0, o1); break;
    case 6: rows_range<6, ADD>(w, x, y, out, in, o0, o1); break;
    case 7: rows_range<7, ADD>(w, x, y, out, in, o0, o1); break;
    default: rows_range<8, ADD>(w, x, y, out, in, o0, o1); break;
  }
}

// A weight matrix (out, in) and where its product goes, y (rows, out).
struct Mat {
  const float* w;
  float* y;
  int64_t out;
};

// Thread tid's share of the products of x (rows, in) with the matrices `mats`, their weight rows taken as one range
// in units of UNIT rows and cut into nt contiguous shares; x in groups of at most 8 rows.
template <bool ADD>
static void products(const Mat* mats, int nm, const float* x, int64_t in, int64_t rows, int tid, int nt) {
  int64_t units = 0;
  for (int m = 0; m < nm; ++m) units += (mats[m].out + UNIT - 1) / UNIT;
  const int64_t u0 = units * tid / nt, u1 = units * (tid + 1) / nt;
  int64_t base = 0;
  for (int m = 0; m < nm; ++m) {
    const int64_t mu = (mats[m].out + UNIT - 1) / UNIT;
    const int64_t a = std::max<int64_t>(u0 - base, 0), b = std::min<int64_t>(u1 - base, mu);
    for (int64_t n0 = 0; a < b && n0 < rows; n0 += 8)
      rows_any<ADD>(std::min<int64_t>(8, rows - n0), mats[m].w, x + n0 * in, mats[m].y + n0 * mats[m].out,
                    mats[m].out, in, a * UNIT, std::min(b * UNIT, mats[m].out));
    base += mu;
  }
}

// y = w * (x / sqrt(mean(x^2) + eps)) for each of `rows` rows of d (transformers' LlamaRMSNorm in float32).
static void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t d, float eps) {
  for (int64_t n = 0; n < rows; ++n) {
    const float* xn = x + n * d;
    float ss = 0.f;
    if (d % VW == 0) {
      vec acc{};
      for (int64_t i = 0; i < d; i += VW) acc += loadv(xn + i) * loadv(xn + i);
      ss = hsum(acc);
    } else {
      for (int64_t i = 0; i < d; ++i) ss += xn[i] * xn[i];
    }
    const float r = 1.f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i) y[n * d + i] = w[i] * (xn[i] * r);
  }
}

// silu(g) * u = g * sigmoid(g) * u, sigmoid through exp_neg(-|g|) (within about an ulp of exp), VW lanes at a time.
static inline vec silu_mul(vec g, vec u) {
  const vec zero{}, one = zero + 1.f;
  const vec e = exp_neg(g < zero ? g : zero - g);  // exp(-|g|), in (0, 1]
  return g * ((g < zero ? e : one) / (one + e)) * u;
}

static void silu_mul_rows(const float* g, const float* u, float* h, int64_t n) {
  int64_t i = 0;
  for (; i + VW <= n; i += VW) {
    const vec r = silu_mul(loadv(g + i), loadv(u + i));
    __builtin_memcpy(h + i, &r, sizeof(r));
  }
  if (i < n) {  // the tail, through one padded vector
    float gt[VW] = {}, ut[VW] = {}, ht[VW];
    __builtin_memcpy(gt, g + i, (n - i) * sizeof(float));
    __builtin_memcpy(ut, u + i, (n - i) * sizeof(float));
    const vec r = silu_mul(loadv(gt), loadv(ut));
    __builtin_memcpy(ht, &r, sizeof(r));
    __builtin_memcpy(h + i, ht, (n - i) * sizeof(float));
  }
}

// x (rows, d) runs through `layers` decoder layers, for the `rows` tokens at positions L.. of a static cache of S
// slots (L: lengths[0], every layer's fill level; they move on by `rows`). weights: 9 per layer, input norm, q, k,
// v, o, post-attention norm, gate, up, down (no biases); keys/values (1, Hk, S, D) each; cos/sin the rotary tables
// (>= L + rows, D), row p for position p. The tokens attend causally to the cache's first L slots and to each other.
// Returns (1 + len(keep), rows, d): the last layer's output, then the input of each layer of `keep` (0 .. layers-1:
// transformers' hidden_states[i]), for a draft that reads the target's features.
torch::Tensor llama_step(const torch::Tensor& x_in, const std::vector<torch::Tensor>& weights,
                         const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values,
                         const std::vector<torch::Tensor>& lengths, const torch::Tensor& cos, const torch::Tensor& sin,
                         int64_t H, int64_t Hk, double eps, double scale, const std::vector<int64_t>& keep) {
  const int64_t layers = static_cast<int64_t>(keys.size());
  TORCH_CHECK(layers >= 1 && weights.size() == 9 * keys.size() && values.size() == keys.size() &&
              lengths.size() == keys.size(), "llama_step: 9 weights, a key, a value and a length per layer");
  TORCH_CHECK(x_in.device().is_cpu() && x_in.dtype() == torch::kFloat32 && x_in.dim() == 2,
              "llama_step: x (rows, hidden) float32 on the CPU");
  TORCH_CHECK(H >= 1 && Hk >= 1 && H % Hk == 0, "llama_step: heads a multiple of kv_heads");
  const int64_t W = x_in.size(0), d = x_in.size(1);
  TORCH_CHECK(W >= 1, "llama_step: at least one token");
  const int64_t D = weights[1].size(0) / H, I = weights[6].size(0), S = keys[0].size(2);
  for (int64_t l = 0; l < layers; ++l) {
    const torch::Tensor* w = weights.data() + 9 * l;
    for (int i = 0; i < 9; ++i)
      TORCH_CHECK(w[i].device().is_cpu() && w[i].dtype() == torch::kFloat32 && w[i].is_contiguous(),
                  "llama_step: weights contiguous float32 on the CPU");
    TORCH_CHECK(w[0].numel() == d && w[5].numel() == d && w[1].sizes() == torch::IntArrayRef({H * D, d}) &&
                w[2].sizes() == torch::IntArrayRef({Hk * D, d}) && w[3].sizes() == w[2].sizes() &&
                w[4].sizes() == torch::IntArrayRef({d, H * D}) && w[6].sizes() == torch::IntArrayRef({I, d}) &&
                w[7].sizes() == w[6].sizes() && w[8].sizes() == torch::IntArrayRef({d, I}),
                "llama_step: layer ", l, "'s weights do not have a Llama layer's shapes");
    TORCH_CHECK(keys[l].dtype() == torch::kFloat32 && values[l].dtype() == torch::kFloat32 && keys[l].dim() == 4 &&
                keys[l].sizes() == torch::IntArrayRef({1, Hk, S, D}) && values[l].sizes() == keys[l].sizes() &&
                keys[l].stride(3) == 1 && values[l].stride(3) == 1 && keys[l].is_cpu() && values[l].is_cpu(),
                "llama_step: keys and values (1, kv_heads, slots, head size) float32 on the CPU");
    TORCH_CHECK(lengths[l].dtype() == torch::kInt64 && lengths[l].numel() == 1 && lengths[l].is_cpu() &&
                lengths[l].is_contiguous(), "llama_step: one int64 fill level per layer");
    TORCH_CHECK(*lengths[l].data_ptr<int64_t>() == *lengths[0].data_ptr<int64_t>(),
                "llama_step: the layers' fill levels differ");
  }
  const int64_t L = *lengths[0].data_ptr<int64_t>();
  TORCH_CHECK(L >= 0 && L + W <= S, "llama_step: the cache holds ", S, " slots, ", L, " filled: no room for ", W);
  TORCH_CHECK(cos.dtype() == torch::kFloat32 && sin.sizes() == cos.sizes() && cos.dim() == 2 && cos.size(1) == D &&
              cos.size(0) >= L + W && cos.is_contiguous() && sin.is_contiguous(),
              "llama_step: cos and sin (positions, head size), float32, past the last position");
  TORCH_CHECK(D % 2 == 0, "llama_step: an even head size");
  std::vector<int64_t> slot(layers, -1);  // where layer l's input is kept, if it is
  for (size_t i = 0; i < keep.size(); ++i) {
    TORCH_CHECK(keep[i] >= 0 && keep[i] < layers, "llama_step: keep names layers 0 .. ", layers - 1);
    slot[keep[i]] = static_cast<int64_t>(i) + 1;
  }
  auto out = torch::empty({1 + static_cast<int64_t>(keep.size()), W, d}, x_in.options());
  out[0].copy_(x_in);
  float* xp = out.data_ptr<float>();
  std::vector<const float*> wp(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) wp[i] = weights[i].data_ptr<float>();
  std::vector<float*> kp(layers), vp(layers);
  for (int64_t l = 0; l < layers; ++l) kp[l] = keys[l].data_ptr<float>(), vp[l] = values[l].data_ptr<float>();
  const int64_t ks1 = keys[0].stride(1), ks2 = keys[0].stride(2), vs1 = values[0].stride(1), vs2 = values[0].stride(2);
  for (int64_t l = 0; l < layers; ++l)
    TORCH_CHECK(keys[l].stride(1) == ks1 && keys[l].stride(2) == ks2 && values[l].stride(1) == vs1 &&
                values[l].stride(2) == vs2, "llama_step: every layer's cache laid out alike");
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t rep = H / Hk, J = rep * W, P = D + 2, used = L + W;
  const int64_t chunks = (used + CHUNK - 1) / CHUNK, half = D / 2;
  const int T = std::max(1, at::get_num_threads());
  std::vector<float> xn(T * W * d), q(W * H * D), k(W * Hk * D), v(W * Hk * D), qr(H * W * D), att(W * H * D);
  std::vector<float> g(W * I), u(W * I), h(W * I), part(Hk * chunks * J * P), score(T * J * CHUNK);
  std::unique_ptr<bool[]> mask(new bool[W * S]);  // query t sees slots 0 .. L + t
  for (int64_t t = 0; t < W; ++t)
    for (int64_t s = 0; s < S; ++s) mask[t * S + s] = s <= L + t;
  std::vector<const float*> qj(T * J);
  std::vector<const bool*> mj(T * J);
  const std::vector<int64_t> used_rows{used};
  const float fe = static_cast<float>(eps);
#pragma omp parallel num_threads(T)
  {
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    float* xt = xn.data() + tid * W * d;
    for (int64_t l = 0; l < layers; ++l) {
      const float* const* w = wp.data() + 9 * l;
      if (slot[l] > 0 && tid == 0) std::memcpy(xp + slot[l] * W * d, xp, W * d * sizeof(float));  // x is read-only
      rms_norm(xp, w[0], xt, W, d, fe);                                                          // till o's barrier
      const Mat qkv[3] = {{w[1], q.data(), H * D}, {w[2], k.data(), Hk * D}, {w[3], v.data(), Hk * D}};
      products<false>(qkv, 3, xt, d, W, tid, nt);
#pragma omp barrier
      // rotary embedding: q into qr (H, W, D), the attention's layout; k and v into their cache slots
      for (int64_t e = (W * (H + Hk)) * tid / nt; e < (W * (H + Hk)) * (tid + 1) / nt; ++e) {
        const int64_t t = e / (H + Hk), head = e % (H + Hk);
        const float* c = cp + (L + t) * D;
        const float* sn = sp + (L + t) * D;
        const float* src;
        float* dst;
        if (head < H) {
          src = q.data() + (t * H + head) * D, dst = qr.data() + (head * W + t) * D;
        } else {
          const int64_t gk = head - H;
          src = k.data() + (t * Hk + gk) * D, dst = kp[l] + gk * ks1 + (L + t) * ks2;
          std::memcpy(vp[l] + gk * vs1 + (L + t) * vs2, v.data() + (t * Hk + gk) * D, D * sizeof(float));
        }
        for (int64_t i = 0; i < half; ++i) {
          dst[i] = src[i] * c[i] - src[i + half] * sn[i];
          dst[i + half] = src[i + half] * c[i + half] + src[i] * sn[i + half];
        }
      }
#pragma omp barrier
      const Views views{qr.data(), kp[l], vp[l], mask.get(), 0, ks1, ks2, 0, vs1, vs2, 0, H, W, D, S, Hk, rep, J,
                        chunks, static_cast<float>(scale)};
      for (int64_t task = Hk * chunks * tid / nt; task < Hk * chunks * (tid + 1) / nt; ++task) {
        float* sc = score.data() + tid * J * CHUNK;
        const float** qt = qj.data() + tid * J;
        const bool** mt = mj.data() + tid * J;
        switch (D % VW ? 0 : D) {
          case 64: chunk_task<64>(views, used_rows, part.data(), sc, qt, mt, task); break;
          case 128: chunk_task<128>(views, used_rows, part.data(), sc, qt, mt, task); break;
          case 32: chunk_task<32>(views, used_rows, part.data(), sc, qt, mt, task); break;
          case 16: chunk_task<16>(views, used_rows, part.data(), sc, qt, mt, task); break;
          default: chunk_task<0>(views, used_rows, part.data(), sc, qt, mt, task); break;
        }
      }
#pragma omp barrier
      for (int64_t e = Hk * J * tid / nt; e < Hk * J * (tid + 1) / nt; ++e) {
        const int64_t gk = e / J, j = e % J, head = gk * rep + j / W, t = j % W;
        merge_query(part.data() + gk * chunks * J * P + j * P, chunks, J * P, D, att.data() + (t * H + head) * D);
      }
#pragma omp barrier
      const Mat o{w[4], xp, d};
      products<true>(&o, 1, att.data(), H * D, W, tid, nt);  // x += attention's output, projected
#pragma omp barrier
      rms_norm(xp, w[5], xt, W, d, fe);
      {  // gate and up for this thread's rows of both, then silu(gate) * up on them
        const int64_t units = (I + UNIT - 1) / UNIT;
        const int64_t o0 = std::min(I, units * tid / nt * UNIT), o1 = std::min(I, units * (tid + 1) / nt * UNIT);
        for (int64_t n0 = 0; o0 < o1 && n0 < W; n0 += 8) {
          const int64_t n = std::min<int64_t>(8, W - n0);
          rows_any<false>(n, w[6], xt + n0 * d, g.data() + n0 * I, I, d, o0, o1);
          rows_any<false>(n, w[7], xt + n0 * d, u.data() + n0 * I, I, d, o0, o1);
        }
        for (int64_t t = 0; o0 < o1 && t < W; ++t)
          silu_mul_rows(g.data() + t * I + o0, u.data() + t * I + o0, h.data() + t * I + o0, o1 - o0);
      }
#pragma omp barrier
      const Mat down{w[8], xp, d};
      products<true>(&down, 1, h.data(), I, W, tid, nt);  // x += the MLP's output
#pragma omp barrier
    }
  }
  for (int64_t l = 0; l < layers; ++l) *lengths[l].data_ptr<int64_t>() += W;
  return out;
}

// The CPU kernel of the operator `specrepro::few_rows` (its schema is defined in Python, `gemv._LIB`): called through
// the dispatcher in C++, so a compiled graph skips the Python a `torch.library.custom_op` runs at every call. Only the
// native build registers it (`build_for` defines SPECREPRO_NO_REGISTER for the others): a second registration
// would replace the operator's kernel for the rest of the process.
#ifndef SPECREPRO_NO_REGISTER
TORCH_LIBRARY_IMPL(specrepro, CPU, m) {
  m.impl("few_rows", &few_rows);
  m.impl("cache_attention", &cache_attention);
  m.impl("llama_step", &llama_step);
}
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
    return cpp_extension.load_inline(name=name, cpp_sources=SOURCE, extra_cflags=flags, extra_ldflags=["-fopenmp"],
                                     functions=["few_rows", "cache_attention", "llama_step"], verbose=False)


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
_LIB.define("cache_attention(Tensor query, Tensor key, Tensor value, Tensor mask, float scale) -> Tensor")
_LIB.define("llama_step(Tensor x, Tensor[] weights, Tensor(a!)[] keys, Tensor(b!)[] values, Tensor(c!)[] lengths, "
            "Tensor cos, Tensor sin, int heads, int kv_heads, float eps, float scale, int[] keep) -> Tensor")


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


def cache_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """Attention of query (B, H, W, D) over a static cache's key and value (B, Hk, S, D), Hk dividing H (grouped
    heads read in place), where mask (B or 1, 1, W, S), boolean, says which slots each query sees: (B, W, H, D), the
    layout transformers' attention functions return. float32 on the CPU. Reads each row's slots up to its last
    unmasked one only; a query that sees no slot gets zeros. Eager callers come here; a compiled graph calls the
    operator `torch.ops.specrepro.cache_attention` (`compiled`'s attention)."""
    return _built().cache_attention(query, key, value, mask, scale)


@torch.library.register_fake("specrepro::cache_attention", lib=_LIB)
def _(query, key, value, mask, scale):
    _built()
    return query.new_empty((query.shape[0], query.shape[2], query.shape[1], query.shape[3]))


@torch.library.register_fake("specrepro::llama_step", lib=_LIB)
def _(x, weights, keys, values, lengths, cos, sin, heads, kv_heads, eps, scale, keep):
    _built()
    return x.new_empty((1 + len(keep), x.shape[0], x.shape[1]))


def warn_unavailable() -> None:
    warnings.warn(f"the few-row kernel could not be built on this machine ({build_error()}); the linear layers "
                  "keep the stock product. It needs a C++ compiler with OpenMP (e.g. apt install g++).",
                  RuntimeWarning, stacklevel=3)
