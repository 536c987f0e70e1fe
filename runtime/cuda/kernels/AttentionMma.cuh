//===- AttentionMma.cuh - FlashAttention-2-style kernels on mma.sync ------===//
//
// The register-level tensor-core attention kernels (namespace fa) and the
// helpers they share with Attention.cu's other kernels. A header so that
// test/unit/cuda/AttentionMmaEmulationTest.cpp can compile the very same
// kernel source for the host: with DLOPT_ATTENTION_MMA_EMULATION defined
// (and its emulator included first, which provides the block's threads,
// barriers, shuffles and the storage types), the warp-level mma.sync,
// ldmatrix and shared-memory loads go to emu:: functions that implement
// them from the PTX ISA's fragment definitions; nothing else changes.
//
//===----------------------------------------------------------------------===//
#pragma once

#if !defined(DLOPT_ATTENTION_MMA_EMULATION)
#include "runtime/cuda/kernels/Common.cuh"
#include <cuda_runtime.h>
#endif

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(DLOPT_ATTENTION_MMA_EMULATION)
#define DLOPT_FA_ENABLED 1
#define DLOPT_FA_DEVICE 0
#define DLOPT_FA_SHARED(name) unsigned char *name = emu::smem()
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define DLOPT_FA_ENABLED 1
#define DLOPT_FA_DEVICE 1
#define DLOPT_FA_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#else
#define DLOPT_FA_ENABLED 0
#define DLOPT_FA_DEVICE 0
#define DLOPT_FA_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

namespace dlopt::rt::cuda::kernels {

/// The causal shift: query i sees keys j <= i + shift (T - S, or the
/// offset operand).
__device__ __forceinline__ int64_t causalShift(const AttentionDims &a) {
  return a.offset ? loadId(a.offset, a.offset64, 0) : a.t - a.s;
}

/// Number of keys query i may attend to.
__device__ __forceinline__ int64_t keyLimit(const AttentionDims &a,
                                            int64_t shift, int64_t i) {
  if (!a.causal)
    return a.t;
  int64_t l = i + shift + 1;
  return l < 0 ? 0 : (l > a.t ? a.t : l);
}

/// rows x HD 16-bit elements from rows row0.. of src (row stride HD) into
/// dst (row stride ld), 16 bytes per access; rows at or past `limit` are
/// zeros.
template <int HD>
__device__ __forceinline__ void loadRows16(void *dst, int ld, const void *src,
                                           int64_t row0, int rows,
                                           int64_t limit) {
  constexpr int CH = HD / 8;
  auto *d = static_cast<uint16_t *>(dst);
  auto *s = static_cast<const uint16_t *>(src);
  for (int idx = threadIdx.x; idx < rows * CH; idx += blockDim.x) {
    int r = idx / CH, c = idx % CH;
    int64_t row = row0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < limit)
      v = *reinterpret_cast<const uint4 *>(s + row * HD + c * 8);
    *reinterpret_cast<uint4 *>(d + r * ld + c * 8) = v;
  }
}

//===--- Register-level tensor-core attention (mma.sync m16n8k16) ----------===//
//
// FlashAttention-2's structure: every product is a warp-wide
// mma.sync.m16n8k16 with f32 accumulation, and the score tile never leaves
// registers. A block has 4 warps. Forward and dq: each warp owns 16 of the
// block's 64 query rows and walks the keys in tiles of 64 held in shared
// memory; the accumulator layout of S = Q K^T (a thread holds rows g and
// g + 8, columns 2 tig and 2 tig + 1 of each 8-column tile, g = lane / 4,
// tig = lane % 4) is exactly the A-operand layout of the next product, so P
// (or dS) goes from the softmax to P V (dS K) in registers, rounded to the
// input type as FlashAttention does. Row statistics reduce over the 4
// lanes of a quad. dk/dv: each warp owns 16 of the block's 64 keys and
// walks the queries of every head sharing the kv head, computing S^T and
// dP^T with keys as rows. B operands that are rows of a tile (K in Q K^T)
// load as 32-bit pairs; those that are columns (V in P V) load with
// ldmatrix.trans. Softmax runs in base 2 (scores scaled by scale log2 e;
// the lse the forward leaves for the backward is in base 2 too). No
// atomics: every output element is accumulated by one thread in a fixed
// order, so results repeat run to run.

namespace fa {

constexpr int kThreads = 128; ///< 4 warps a block

constexpr int BM = 64;  ///< query rows (forward, dq) or keys (dk/dv) per block
constexpr int BN = 64;  ///< keys (forward, dq) or queries (dk/dv) per tile
constexpr float kLog2e = 1.4426950408889634f;

template <int HD> struct Layout {
  static constexpr int LD = HD + 8; ///< tile row stride (16-bit elements)
  static constexpr size_t tile = size_t(BN) * LD * 2;
  static constexpr size_t fwd = 3 * tile;               // q, k, v
  static constexpr size_t dq = 4 * tile;                // q, do, k, v
  static constexpr size_t dkdv = 4 * tile + 2 * BN * 4; // k, v, q, do; lse, D
  static_assert(LD * 2 % 16 == 0, "ldmatrix rows must be 16-byte aligned");
};

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return uint32_t(fromF<T>(lo).bits) | (uint32_t(fromF<T>(hi).bits) << 16);
}

template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4],
                                    uint32_t b0, uint32_t b1) {
#if defined(DLOPT_ATTENTION_MMA_EMULATION)
  emu::mma<T>(d, a, b0, b1);
#elif DLOPT_FA_DEVICE
  if constexpr (std::is_same_v<T, BF16>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                   "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                   "r"(b1));
#endif
}

__device__ __forceinline__ uint32_t ld32(const uint16_t *p) {
#if defined(DLOPT_ATTENTION_MMA_EMULATION)
  return emu::ld32(p);
#else
  return *reinterpret_cast<const uint32_t *>(p);
#endif
}

/// The A fragment (16 x 16) of rows row0.. and columns k0.. of a
/// row-major shared tile.
__device__ __forceinline__ void loadA(uint32_t (&a)[4], const uint16_t *t,
                                      int ld, int row0, int k0) {
  int lane = threadIdx.x & 31;
  const uint16_t *p = t + (row0 + (lane >> 2)) * ld + k0 + (lane & 3) * 2;
  a[0] = ld32(p);
  a[1] = ld32(p + 8 * ld);
  a[2] = ld32(p + 8);
  a[3] = ld32(p + 8 * ld + 8);
}

/// The B fragment (k16 x n8) with B[k][n] = X[n0 + n][k0 + k]: rows of a
/// row-major shared tile X as columns of B.
__device__ __forceinline__ void loadBRows(uint32_t &b0, uint32_t &b1,
                                          const uint16_t *x, int ld, int n0,
                                          int k0) {
  int lane = threadIdx.x & 31;
  const uint16_t *p = x + (n0 + (lane >> 2)) * ld + k0 + (lane & 3) * 2;
  b0 = ld32(p);
  b1 = ld32(p + 8);
}

/// The B fragments of two n8 tiles (k16 x n16) with B[k][n] =
/// X[k0 + k][n0 + n] (X row-major in shared memory): ldmatrix.trans.
/// b[0], b[1] are the tile at n0, b[2], b[3] the one at n0 + 8.
__device__ __forceinline__ void loadBCols(uint32_t (&b)[4], const uint16_t *x,
                                          int ld, int k0, int n0) {
#if DLOPT_FA_ENABLED
  int lane = threadIdx.x & 31, mi = lane >> 3;
  const uint16_t *p =
      x + (k0 + (mi & 1) * 8 + (lane & 7)) * ld + n0 + (mi >> 1) * 8;
#if defined(DLOPT_ATTENTION_MMA_EMULATION)
  emu::ldmatrixX4Trans(b, p);
#else
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
      : "r"(addr));
#endif
#endif
}

/// s[n] (the 16 x 64 tile, 8 n8 tiles) = A[row0.., 0..HD) . X[0..64, 0..HD)^T.
template <typename T, int HD>
__device__ __forceinline__ void scores(float (&s)[8][4], const uint16_t *a,
                                       int row0, const uint16_t *x) {
  constexpr int LD = Layout<HD>::LD;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      s[n][i] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    uint32_t af[4];
    loadA(af, a, LD, row0, kk * 16);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      uint32_t b0, b1;
      loadBRows(b0, b1, x, LD, n * 8, kk * 16);
      mma<T>(s[n], af, b0, b1);
    }
  }
}

/// The 16 x 64 accumulator tile `p` as four A fragments (k16 slices),
/// rounded to T.
template <typename T>
__device__ __forceinline__ void packA(uint32_t (&pa)[4][4],
                                      const float (&p)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = pack2<T>(p[2 * kk][0], p[2 * kk][1]);
    pa[kk][1] = pack2<T>(p[2 * kk][2], p[2 * kk][3]);
    pa[kk][2] = pack2<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    pa[kk][3] = pack2<T>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
  }
}

/// acc (16 x HD) += P (16 x 64, packed) . X[0..64, 0..HD).
template <typename T, int HD>
__device__ __forceinline__ void accumulate(float (&acc)[HD / 8][4],
                                           const uint32_t (&pa)[4][4],
                                           const uint16_t *x) {
  constexpr int LD = Layout<HD>::LD;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int c = 0; c < HD / 16; ++c) {
      uint32_t b[4];
      loadBCols(b, x, LD, kk * 16, c * 16);
      mma<T>(acc[2 * c], pa[kk], b[0], b[1]);
      mma<T>(acc[2 * c + 1], pa[kk], b[2], b[3]);
    }
}

/// Reduces over the 4 lanes of a quad (the lanes holding one row).
__device__ __forceinline__ float quadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <typename T>
__device__ __forceinline__ void storePair(T *dst, float a, float b) {
  *reinterpret_cast<uint32_t *>(dst) =
      uint32_t(fromF<T>(a).bits) | (uint32_t(fromF<T>(b).bits) << 16);
}

/// Forward; with `lse` set ("stats" mode) it writes, instead of the output,
/// each row's base-2 log-sum-exp of the scaled scores and D_i = dout_i .
/// out_i for the backward kernels below.
template <typename T, int HD>
__global__ void __launch_bounds__(kThreads)
    fwdKernel(AttentionDims a, const T *q, const T *k, const T *v, T *out,
              float *lse, const T *dout, float *dvec) {
#if DLOPT_FA_ENABLED
  using L = Layout<HD>;
  DLOPT_FA_SHARED(smraw);
  uint16_t *qs = reinterpret_cast<uint16_t *>(smraw);
  uint16_t *ks = qs + BM * L::LD, *vs = ks + BN * L::LD;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tig = lane & 3;
  const int64_t bh = blockIdx.x, b = bh / a.h, h = bh % a.h;
  const int64_t kvh = b * a.g + h / (a.h / a.g);
  const int64_t q0 = int64_t(blockIdx.y) * BM;
  const T *kb = k + kvh * a.t * HD, *vb = v + kvh * a.t * HD;
  loadRows16<HD>(qs, L::LD, q + bh * a.s * HD, q0, BM, a.s);
  const int64_t shift = causalShift(a);
  int64_t row[2], lim[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r] = q0 + warp * 16 + (lane >> 2) + 8 * r;
    lim[r] = row[r] < a.s ? keyLimit(a, shift, row[r]) : 0;
  }
  const int64_t last = (q0 + BM < a.s ? q0 + BM : a.s) - 1;
  const int64_t blockLimit = keyLimit(a, shift, last);
  const float sl2 = a.scale * kLog2e;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[HD / 8][4];
#pragma unroll
  for (int c = 0; c < HD / 8; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      o[c][i] = 0.0f;
  for (int64_t k0 = 0; k0 < blockLimit; k0 += BN) {
    __syncthreads();
    loadRows16<HD>(ks, L::LD, kb, k0, BN, a.t);
    loadRows16<HD>(vs, L::LD, vb, k0, BN, a.t);
    __syncthreads();
    float s[8][4];
    scores<T, HD>(s, qs, warp * 16, ks);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          int64_t col = k0 + n * 8 + tig * 2 + j;
          float x = col < lim[r] ? s[n][2 * r + j] * sl2 : -INFINITY;
          s[n][2 * r + j] = x;
          mx = fmaxf(mx, x);
        }
      mx = quadMax(mx);
      float mNew = fmaxf(m[r], mx), corr = 1.0f, ps = 0.0f;
      if (mNew == -INFINITY) {
#pragma unroll
        for (int n = 0; n < 8; ++n)
          s[n][2 * r] = s[n][2 * r + 1] = 0.0f;
      } else {
        corr = exp2f(m[r] - mNew);
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            float p = exp2f(s[n][2 * r + j] - mNew);
            s[n][2 * r + j] = p;
            ps += p;
          }
      }
      l[r] = l[r] * corr + ps; // this lane's share of the row sum
      m[r] = mNew;
#pragma unroll
      for (int c = 0; c < HD / 8; ++c) {
        o[c][2 * r] *= corr;
        o[c][2 * r + 1] *= corr;
      }
    }
    uint32_t pa[4][4];
    packA<T>(pa, s);
    accumulate<T, HD>(o, pa, vs);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = quadSum(l[r]);
    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    bool valid = row[r] < a.s;
    const int64_t at = (bh * a.s + row[r]) * HD;
    if (!lse) {
      if (valid)
#pragma unroll
        for (int c = 0; c < HD / 8; ++c)
          storePair(out + at + c * 8 + tig * 2, o[c][2 * r] * inv,
                    o[c][2 * r + 1] * inv);
      continue;
    }
    float dsum = 0.0f;
    if (valid)
#pragma unroll
      for (int c = 0; c < HD / 8; ++c)
#pragma unroll
        for (int j = 0; j < 2; ++j)
          dsum += toF(dout[at + c * 8 + tig * 2 + j]) * (o[c][2 * r + j] * inv);
    dsum = quadSum(dsum);
    if (valid && tig == 0) {
      lse[bh * a.s + row[r]] = sum > 0.0f ? m[r] + log2f(sum) : 0.0f;
      dvec[bh * a.s + row[r]] = dsum;
    }
  }
#else
  __trap(); // the host launches these only on sm_80 and newer
#endif
}

/// dq = scale sum_j P_ij (dP_ij - D_i) k_j over the key tiles.
template <typename T, int HD>
__global__ void __launch_bounds__(kThreads)
    dqKernel(AttentionDims a, const T *q, const T *k, const T *v,
             const T *dout, const float *lse, const float *dvec, T *dq) {
#if DLOPT_FA_ENABLED
  using L = Layout<HD>;
  DLOPT_FA_SHARED(smraw);
  uint16_t *qs = reinterpret_cast<uint16_t *>(smraw);
  uint16_t *dos = qs + BM * L::LD, *ks = dos + BM * L::LD,
           *vs = ks + BN * L::LD;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tig = lane & 3;
  const int64_t bh = blockIdx.x, b = bh / a.h, h = bh % a.h;
  const int64_t kvh = b * a.g + h / (a.h / a.g);
  const int64_t q0 = int64_t(blockIdx.y) * BM;
  const T *kb = k + kvh * a.t * HD, *vb = v + kvh * a.t * HD;
  loadRows16<HD>(qs, L::LD, q + bh * a.s * HD, q0, BM, a.s);
  loadRows16<HD>(dos, L::LD, dout + bh * a.s * HD, q0, BM, a.s);
  const int64_t shift = causalShift(a);
  int64_t row[2], lim[2];
  float rowLse[2], rowD[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r] = q0 + warp * 16 + (lane >> 2) + 8 * r;
    bool valid = row[r] < a.s;
    lim[r] = valid ? keyLimit(a, shift, row[r]) : 0;
    rowLse[r] = valid ? lse[bh * a.s + row[r]] : 0.0f;
    rowD[r] = valid ? dvec[bh * a.s + row[r]] : 0.0f;
  }
  const int64_t last = (q0 + BM < a.s ? q0 + BM : a.s) - 1;
  const int64_t blockLimit = keyLimit(a, shift, last);
  const float sl2 = a.scale * kLog2e;
  float acc[HD / 8][4];
#pragma unroll
  for (int c = 0; c < HD / 8; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      acc[c][i] = 0.0f;
  for (int64_t k0 = 0; k0 < blockLimit; k0 += BN) {
    __syncthreads();
    loadRows16<HD>(ks, L::LD, kb, k0, BN, a.t);
    loadRows16<HD>(vs, L::LD, vb, k0, BN, a.t);
    __syncthreads();
    float s[8][4], dp[8][4];
    scores<T, HD>(s, qs, warp * 16, ks);
    scores<T, HD>(dp, dos, warp * 16, vs); // dP = dO V^T
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        int r = i >> 1;
        int64_t col = k0 + n * 8 + tig * 2 + (i & 1);
        float ds = 0.0f;
        if (col < lim[r]) {
          float p = exp2f(s[n][i] * sl2 - rowLse[r]);
          ds = p * (dp[n][i] - rowD[r]);
        }
        s[n][i] = ds;
      }
    uint32_t da[4][4];
    packA<T>(da, s);
    accumulate<T, HD>(acc, da, ks); // dS K
  }
#pragma unroll
  for (int r = 0; r < 2; ++r)
    if (row[r] < a.s)
#pragma unroll
      for (int c = 0; c < HD / 8; ++c)
        storePair(dq + (bh * a.s + row[r]) * HD + c * 8 + tig * 2,
                  acc[c][2 * r] * a.scale, acc[c][2 * r + 1] * a.scale);
#else
  __trap();
#endif
}

/// dk, dv of 64 keys of one (batch, kv head), summed over every query of
/// every query head sharing the kv head: with keys as rows, S^T = K Q^T,
/// dP^T = V dO^T, dv += P^T dO, dk += dS^T Q.
template <typename T, int HD>
__global__ void __launch_bounds__(kThreads)
    dkdvKernel(AttentionDims a, const T *q, const T *k, const T *v,
               const T *dout, const float *lse, const float *dvec, T *dk,
               T *dv) {
#if DLOPT_FA_ENABLED
  using L = Layout<HD>;
  DLOPT_FA_SHARED(smraw);
  uint16_t *ks = reinterpret_cast<uint16_t *>(smraw);
  uint16_t *vs = ks + BM * L::LD, *qs = vs + BM * L::LD,
           *dos = qs + BN * L::LD;
  float *ls = reinterpret_cast<float *>(smraw + 4 * L::tile);
  float *dsv = ls + BN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tig = lane & 3;
  const int64_t kvh = blockIdx.x, b = kvh / a.g, gi = kvh % a.g;
  const int64_t k0 = int64_t(blockIdx.y) * BM;
  int64_t key[2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    key[r] = k0 + warp * 16 + (lane >> 2) + 8 * r;
  const int64_t shift = causalShift(a);
  loadRows16<HD>(ks, L::LD, k + kvh * a.t * HD, k0, BM, a.t);
  loadRows16<HD>(vs, L::LD, v + kvh * a.t * HD, k0, BM, a.t);
  const float sl2 = a.scale * kLog2e;
  float accK[HD / 8][4], accV[HD / 8][4];
#pragma unroll
  for (int c = 0; c < HD / 8; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      accK[c][i] = accV[c][i] = 0.0f;
  const int64_t hpg = a.h / a.g;
  // The first query that may see key k0 (causal: i + shift >= k0).
  const int64_t iStart = a.causal ? (k0 - shift > 0 ? k0 - shift : 0) : 0;
  for (int64_t hh = 0; hh < hpg; ++hh) {
    const int64_t bh = b * a.h + gi * hpg + hh;
    for (int64_t i0 = iStart; i0 < a.s; i0 += BN) {
      __syncthreads();
      loadRows16<HD>(qs, L::LD, q + bh * a.s * HD, i0, BN, a.s);
      loadRows16<HD>(dos, L::LD, dout + bh * a.s * HD, i0, BN, a.s);
      for (int t = threadIdx.x; t < BN; t += blockDim.x) {
        int64_t i = i0 + t;
        ls[t] = i < a.s ? lse[bh * a.s + i] : 0.0f;
        dsv[t] = i < a.s ? dvec[bh * a.s + i] : 0.0f;
      }
      __syncthreads();
      float p[8][4];
      scores<T, HD>(p, ks, warp * 16, qs); // S^T
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          int cc = n * 8 + tig * 2 + (i & 1);
          int64_t qi = i0 + cc, j = key[i >> 1];
          bool on = j < a.t && qi < a.s && (!a.causal || j <= qi + shift);
          p[n][i] = on ? exp2f(p[n][i] * sl2 - ls[cc]) : 0.0f;
        }
      uint32_t pa[4][4];
      packA<T>(pa, p);
      accumulate<T, HD>(accV, pa, dos); // P^T dO
      float dp[8][4];
      scores<T, HD>(dp, vs, warp * 16, dos); // dP^T = V dO^T
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          dp[n][i] = p[n][i] * (dp[n][i] - dsv[n * 8 + tig * 2 + (i & 1)]);
      packA<T>(pa, dp);
      accumulate<T, HD>(accK, pa, qs); // dS^T Q
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r)
    if (key[r] < a.t)
#pragma unroll
      for (int c = 0; c < HD / 8; ++c) {
        const int64_t at = (kvh * a.t + key[r]) * HD + c * 8 + tig * 2;
        storePair(dk + at, accK[c][2 * r] * a.scale,
                  accK[c][2 * r + 1] * a.scale);
        storePair(dv + at, accV[c][2 * r], accV[c][2 * r + 1]);
      }
#else
  __trap();
#endif
}

} // namespace fa

} // namespace dlopt::rt::cuda::kernels
