//===- Attention.cu - Tiled attention (online softmax) and rope -----------===//
//
// Forward: a block takes 16 query rows of one (batch, head), 8 threads per
// row, and walks the keys in tiles of 32 held in shared memory, keeping the
// running max m, the running sum l and the output accumulator in registers
// (flash-attention's online softmax), so the [S, T] score matrix never
// exists. Causal blocks stop at the last key their last row may see.
//
// Backward recomputes instead of storing: (1) the forward kernel in "stats"
// mode writes each row's log-sum-exp and D_i = dout_i . out_i; (2) a dq
// kernel walks key tiles per block of query rows; (3) a dk/dv kernel owns 16
// keys of one (batch, kv head) and walks every query of the heads sharing
// that kv head. Each output element is summed by one thread in a fixed
// order: no atomics, deterministic.
//
// These kernels run the math in f32 on CUDA cores, for every dtype and head
// dim up to kMaxHeadDim (256). bf16 and f16 with head dims 64 and 128 take
// the tensor-core kernels below instead (sm_80 and newer): by default the
// WMMA ones, or the register-level mma.sync ones (namespace fa;
// DLOPT_CUDA_ATTENTION=mma, opt-in until they have run on a GPU);
// DLOPT_CUDA_ATTENTION=simt forces the CUDA-core ones. The same three
// stages in all three.
//
// Context parallelism: the causal shift (query i sees keys j <= i + shift)
// is T - S or the offset operand, and rope's positions start at its offset
// operand; both are read from device memory by every thread (one cached
// word), so a step counter or rank offset needs no host copy.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/kernels/AttentionMma.cuh"
#include "runtime/cuda/kernels/Common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <mma.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <type_traits>

namespace dlopt::rt::cuda::kernels {
namespace {

constexpr int BQ = 16;       ///< query rows per block (forward, dq)
constexpr int BK = 32;       ///< keys per tile (forward, dq)
constexpr int KR = 16;       ///< key rows per block (dk/dv)
constexpr int QT = 32;       ///< queries per tile (dk/dv)
constexpr int kAttnThreads = 128; ///< 8 threads per row

__device__ __forceinline__ float groupMax8(float v) {
#pragma unroll
  for (int o = 4; o > 0; o /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o, 8));
  return v;
}
__device__ __forceinline__ float groupSum8(float v) {
#pragma unroll
  for (int o = 4; o > 0; o /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, o, 8);
  return v;
}

template <typename T>
__device__ __forceinline__ void loadTile(float *dst, int stride, const T *src,
                                         int64_t row0, int64_t rows,
                                         int64_t limit, int cols) {
  for (int idx = threadIdx.x; idx < rows * cols; idx += blockDim.x) {
    int rr = idx / cols, c = idx % cols;
    int64_t row = row0 + rr;
    dst[rr * stride + c] = row < limit ? toF(src[row * cols + c]) : 0.0f;
  }
}

__device__ __forceinline__ float dot(const float *a, const float *b, int n) {
  float s = 0.0f;
  for (int c = 0; c < n; ++c)
    s += a[c] * b[c];
  return s;
}

/// One key tile of the online softmax for a row spread over a group of
/// lanes: `sc` holds this lane's scaled scores (-inf where masked);
/// `rowMax` and `rowSum` combine a value over the row's lanes. Turns `sc`
/// into exp(s - m_new), updates the row's running max `m` and sum `l`, and
/// returns the factor the row's accumulated output is scaled by.
template <int N, typename MaxF, typename SumF>
__device__ __forceinline__ float onlineSoftmaxTile(float (&sc)[N], float &m,
                                                   float &l, MaxF rowMax,
                                                   SumF rowSum) {
  float tmax = -INFINITY;
#pragma unroll
  for (int j = 0; j < N; ++j)
    tmax = fmaxf(tmax, sc[j]);
  tmax = rowMax(tmax);
  float mNew = fmaxf(m, tmax), psum = 0.0f, corr = 1.0f;
  if (mNew != -INFINITY) {
    corr = expf(m - mNew);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      sc[j] = expf(sc[j] - mNew);
      psum += sc[j];
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j)
      sc[j] = 0.0f;
  }
  l = l * corr + rowSum(psum);
  m = mNew;
  return corr;
}

/// Forward; with `lse` set ("stats" mode) it writes, instead of the output,
/// each row's log-sum-exp and D_i = dout_i . out_i for the backward pass.
template <typename T, int CPT>
__global__ void __launch_bounds__(kAttnThreads)
    attnFwdKernel(AttentionDims a, const T *q, const T *k, const T *v, T *out,
                  float *lse, const T *dout, float *dvec) {
  extern __shared__ float smem[];
  const int D = int(a.d), E = int(a.e), DP = D + 1;
  float *qs = smem;           // BQ x DP
  float *ks = qs + BQ * DP;   // BK x DP
  float *vs = ks + BK * DP;   // BK x E
  float *ps = vs + BK * E;    // BQ x BK
  int r = threadIdx.x / 8, lane = threadIdx.x % 8;
  int64_t bh = blockIdx.x, b = bh / a.h, h = bh % a.h;
  int64_t kvh = b * a.g + h / (a.h / a.g);
  int64_t q0 = int64_t(blockIdx.y) * BQ, qi = q0 + r;
  bool valid = qi < a.s;
  const T *kb = k + kvh * a.t * D;
  const T *vb = v + kvh * a.t * E;
  loadTile(qs, DP, q + bh * a.s * D, q0, BQ, a.s, D);
  const int64_t shift = causalShift(a);
  int64_t myLimit = valid ? keyLimit(a, shift, qi) : 0;
  int64_t last = (q0 + BQ < a.s ? q0 + BQ : a.s) - 1;
  int64_t blockLimit = keyLimit(a, shift, last);
  float m = -INFINITY, l = 0.0f, acc[CPT];
#pragma unroll
  for (int i = 0; i < CPT; ++i)
    acc[i] = 0.0f;
  for (int64_t k0 = 0; k0 < blockLimit; k0 += BK) {
    __syncthreads();
    loadTile(ks, DP, kb, k0, BK, a.t, D);
    loadTile(vs, E, vb, k0, BK, a.t, E);
    __syncthreads();
    float sc[BK / 8];
#pragma unroll
    for (int t = 0; t < BK / 8; ++t) {
      int jj = lane + 8 * t;
      sc[t] = valid && k0 + jj < myLimit
                  ? dot(qs + r * DP, ks + jj * DP, D) * a.scale
                  : -INFINITY;
    }
    float corr = onlineSoftmaxTile(
        sc, m, l, [](float v) { return groupMax8(v); },
        [](float v) { return groupSum8(v); });
#pragma unroll
    for (int t = 0; t < BK / 8; ++t)
      ps[r * BK + lane + 8 * t] = sc[t];
#pragma unroll
    for (int i = 0; i < CPT; ++i)
      acc[i] *= corr;
    __syncwarp();
    for (int jj = 0; jj < BK; ++jj) {
      float p = ps[r * BK + jj];
#pragma unroll
      for (int i = 0; i < CPT; ++i) {
        int c = lane + 8 * i;
        if (c < E)
          acc[i] += p * vs[jj * E + c];
      }
    }
  }
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
  int64_t row = bh * a.s + qi;
  if (!lse) {
    if (valid)
#pragma unroll
      for (int i = 0; i < CPT; ++i) {
        int c = lane + 8 * i;
        if (c < E)
          out[row * E + c] = fromF<T>(acc[i] * inv);
      }
    return;
  }
  float dsum = 0.0f;
  if (valid)
#pragma unroll
    for (int i = 0; i < CPT; ++i) {
      int c = lane + 8 * i;
      if (c < E)
        dsum += toF(dout[row * E + c]) * (acc[i] * inv);
    }
  dsum = groupSum8(dsum); // every lane of the warp takes part
  if (valid && lane == 0) {
    lse[row] = l > 0.0f ? m + logf(l) : 0.0f;
    dvec[row] = dsum;
  }
}

/// dq = scale * sum_j P_ij (dP_ij - D_i) k_j over the key tiles.
template <typename T, int CPT>
__global__ void __launch_bounds__(kAttnThreads)
    attnDqKernel(AttentionDims a, const T *q, const T *k, const T *v,
                 const T *dout, const float *lse, const float *dvec, T *dq) {
  extern __shared__ float smem[];
  const int D = int(a.d), E = int(a.e), DP = D + 1, EP = E + 1;
  float *qs = smem;            // BQ x DP
  float *dos = qs + BQ * DP;   // BQ x EP
  float *ks = dos + BQ * EP;   // BK x DP
  float *vs = ks + BK * DP;    // BK x EP
  float *ps = vs + BK * EP;    // BQ x BK
  int r = threadIdx.x / 8, lane = threadIdx.x % 8;
  int64_t bh = blockIdx.x, b = bh / a.h, h = bh % a.h;
  int64_t kvh = b * a.g + h / (a.h / a.g);
  int64_t q0 = int64_t(blockIdx.y) * BQ, qi = q0 + r;
  bool valid = qi < a.s;
  int64_t row = bh * a.s + qi;
  loadTile(qs, DP, q + bh * a.s * D, q0, BQ, a.s, D);
  loadTile(dos, EP, dout + bh * a.s * E, q0, BQ, a.s, E);
  float rowLse = valid ? lse[row] : 0.0f, rowD = valid ? dvec[row] : 0.0f;
  const int64_t shift = causalShift(a);
  int64_t myLimit = valid ? keyLimit(a, shift, qi) : 0;
  int64_t last = (q0 + BQ < a.s ? q0 + BQ : a.s) - 1;
  int64_t blockLimit = keyLimit(a, shift, last);
  const T *kb = k + kvh * a.t * D;
  const T *vb = v + kvh * a.t * E;
  float acc[CPT];
#pragma unroll
  for (int i = 0; i < CPT; ++i)
    acc[i] = 0.0f;
  for (int64_t k0 = 0; k0 < blockLimit; k0 += BK) {
    __syncthreads();
    loadTile(ks, DP, kb, k0, BK, a.t, D);
    loadTile(vs, EP, vb, k0, BK, a.t, E);
    __syncthreads();
#pragma unroll
    for (int t = 0; t < BK / 8; ++t) {
      int jj = lane + 8 * t;
      float ds = 0.0f;
      if (valid && k0 + jj < myLimit) {
        float p = expf(dot(qs + r * DP, ks + jj * DP, D) * a.scale - rowLse);
        float dp = dot(dos + r * EP, vs + jj * EP, E);
        ds = p * (dp - rowD);
      }
      ps[r * BK + jj] = ds;
    }
    __syncwarp();
    for (int jj = 0; jj < BK; ++jj) {
      float ds = ps[r * BK + jj];
#pragma unroll
      for (int i = 0; i < CPT; ++i) {
        int c = lane + 8 * i;
        if (c < D)
          acc[i] += ds * ks[jj * DP + c];
      }
    }
  }
  if (valid)
#pragma unroll
    for (int i = 0; i < CPT; ++i) {
      int c = lane + 8 * i;
      if (c < D)
        dq[row * D + c] = fromF<T>(acc[i] * a.scale);
    }
}

/// dk, dv of 16 keys of one (batch, kv head), summed over every query of
/// every query head that shares the kv head.
template <typename T, int CPT>
__global__ void __launch_bounds__(kAttnThreads)
    attnDkDvKernel(AttentionDims a, const T *q, const T *k, const T *v,
                   const T *dout, const float *lse, const float *dvec, T *dk,
                   T *dv) {
  extern __shared__ float smem[];
  const int D = int(a.d), E = int(a.e), DP = D + 1, EP = E + 1;
  float *ks = smem;            // KR x DP
  float *vs = ks + KR * DP;    // KR x EP
  float *qs = vs + KR * EP;    // QT x DP
  float *dos = qs + QT * DP;   // QT x EP
  float *ls = dos + QT * EP;   // QT
  float *dsv = ls + QT;        // QT
  float *pS = dsv + QT;        // KR x QT
  float *dS = pS + KR * QT;    // KR x QT
  int kr = threadIdx.x / 8, lane = threadIdx.x % 8;
  int64_t kvh = blockIdx.x, b = kvh / a.g, gi = kvh % a.g;
  int64_t k0 = int64_t(blockIdx.y) * KR, j = k0 + kr;
  bool validK = j < a.t;
  const int64_t shift = causalShift(a);
  loadTile(ks, DP, k + kvh * a.t * D, k0, KR, a.t, D);
  loadTile(vs, EP, v + kvh * a.t * E, k0, KR, a.t, E);
  float accK[CPT], accV[CPT];
#pragma unroll
  for (int i = 0; i < CPT; ++i)
    accK[i] = accV[i] = 0.0f;
  int64_t hpg = a.h / a.g;
  // The first query that may see key k0 (causal: i + shift >= k0).
  int64_t iStart = a.causal ? (k0 - shift > 0 ? k0 - shift : 0) : 0;
  for (int64_t hh = 0; hh < hpg; ++hh) {
    int64_t bh = b * a.h + gi * hpg + hh;
    for (int64_t i0 = iStart; i0 < a.s; i0 += QT) {
      __syncthreads();
      loadTile(qs, DP, q + bh * a.s * D, i0, QT, a.s, D);
      loadTile(dos, EP, dout + bh * a.s * E, i0, QT, a.s, E);
      for (int t = threadIdx.x; t < QT; t += blockDim.x) {
        int64_t i = i0 + t;
        ls[t] = i < a.s ? lse[bh * a.s + i] : 0.0f;
        dsv[t] = i < a.s ? dvec[bh * a.s + i] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int t = 0; t < QT / 8; ++t) {
        int qq = lane + 8 * t;
        int64_t i = i0 + qq;
        float p = 0.0f, ds = 0.0f;
        if (validK && i < a.s && (!a.causal || j <= i + shift)) {
          p = expf(dot(qs + qq * DP, ks + kr * DP, D) * a.scale - ls[qq]);
          float dp = dot(dos + qq * EP, vs + kr * EP, E);
          ds = p * (dp - dsv[qq]);
        }
        pS[kr * QT + qq] = p;
        dS[kr * QT + qq] = ds;
      }
      __syncwarp();
      for (int qq = 0; qq < QT; ++qq) {
        float p = pS[kr * QT + qq], ds = dS[kr * QT + qq];
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
          int c = lane + 8 * i;
          if (c < E)
            accV[i] += p * dos[qq * EP + c];
          if (c < D)
            accK[i] += ds * qs[qq * DP + c];
        }
      }
    }
  }
  if (validK)
#pragma unroll
    for (int i = 0; i < CPT; ++i) {
      int c = lane + 8 * i;
      if (c < D)
        dk[(kvh * a.t + j) * D + c] = fromF<T>(accK[i] * a.scale);
      if (c < E)
        dv[(kvh * a.t + j) * E + c] = fromF<T>(accV[i]);
    }
}

template <typename T>
__global__ void ropeKernel(const T *x, T *y, int64_t rows, int64_t seq,
                           int64_t d, double theta, bool inverse,
                           const void *offset, bool offset64) {
  int64_t half = d / 2;
  // Positions start at the offset operand (a context-parallel block).
  int64_t first = offset ? loadId(offset, offset64, 0) : 0;
  DLOPT_GRID_STRIDE(idx, rows * half) {
    int64_t r = idx / half, i = idx % half, p = r % seq + first;
    double ang = double(p) * pow(theta, -2.0 * double(i) / double(d));
    float c = float(cos(ang)), s = float(inverse ? -sin(ang) : sin(ang));
    float x0 = toF(x[r * d + i]), x1 = toF(x[r * d + i + half]);
    y[r * d + i] = fromF<T>(x0 * c - x1 * s);
    y[r * d + i + half] = fromF<T>(x1 * c + x0 * s);
  }
}

//===--- Tensor-core attention (bf16 / f16, head dims 64 and 128) -----------===//
//
// The same algorithm as the kernels above, with the four products (q k^T,
// p v, and in the backward pass do v^T, ds k, p^T do, ds^T q) on the tensor
// cores through WMMA 16x16x16 tiles with f32 accumulation. A block has 4
// warps; in the forward and dq kernels each warp owns 16 of the block's 64
// query rows and walks the keys in tiles of 64; in the dk/dv kernel each
// warp owns 16 of the block's 64 keys and walks the queries of every head
// sharing the kv head in tiles of 64. Scores and probabilities are f32 in
// shared memory (WMMA's accumulator layout is opaque, so the online softmax
// works on a stored tile, two lanes per row); P and dS are rounded to the
// input type before their products, as FlashAttention does. Every output
// element is accumulated by one warp in a fixed order: deterministic.

constexpr int MT = 64; ///< query rows / keys per block, and per tile

template <typename T> struct MmaType;
template <> struct MmaType<BF16> { using type = __nv_bfloat16; };
template <> struct MmaType<F16> { using type = __half; };
template <> struct MmaType<float> { using type = __half; }; // never launched

__device__ __forceinline__ __nv_bfloat16 toMma(float x, const __nv_bfloat16 *) {
  return __float2bfloat16_rn(x);
}
__device__ __forceinline__ __half toMma(float x, const __half *) {
  return __float2half_rn(x);
}

namespace wm = nvcuda::wmma;
template <typename M>
using FragA = wm::fragment<wm::matrix_a, 16, 16, 16, M, wm::row_major>;
template <typename M>
using FragBRow = wm::fragment<wm::matrix_b, 16, 16, 16, M, wm::row_major>;
template <typename M>
using FragBCol = wm::fragment<wm::matrix_b, 16, 16, 16, M, wm::col_major>;
using FragC = wm::fragment<wm::accumulator, 16, 16, 16, float>;

/// out[16 x 64] (f32, row stride lo) = a[16 x K] . b^T where b is [64 x K]
/// (both 16-bit, row strides la and lb): scores from rows of q and k.
template <typename M, int K>
__device__ __forceinline__ void mmaABt(float *out, int lo, const M *a, int la,
                                       const M *b, int lb) {
#pragma unroll
  for (int n = 0; n < MT / 16; ++n) {
    FragC acc;
    wm::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
      FragA<M> fa;
      FragBCol<M> fb;
      wm::load_matrix_sync(fa, a + kk * 16, la);
      wm::load_matrix_sync(fb, b + n * 16 * lb + kk * 16, lb);
      wm::mma_sync(acc, fa, fb, acc);
    }
    wm::store_matrix_sync(out + n * 16, acc, lo, wm::mem_row_major);
  }
}

/// acc[c] += a[16 x 64] . b[64 x HD] for the HD / 16 column tiles c.
template <typename M, int HD>
__device__ __forceinline__ void mmaAccumulate(FragC (&acc)[HD / 16], const M *a,
                                              int la, const M *b, int lb) {
#pragma unroll
  for (int kk = 0; kk < MT / 16; ++kk) {
    FragA<M> fa;
    wm::load_matrix_sync(fa, a + kk * 16, la);
#pragma unroll
    for (int c = 0; c < HD / 16; ++c) {
      FragBRow<M> fb;
      wm::load_matrix_sync(fb, b + kk * 16 * lb + c * 16, lb);
      wm::mma_sync(acc[c], fa, fb, acc[c]);
    }
  }
}

template <int HD> struct MmaLayout {
  static constexpr int LD = HD + 8;  ///< 16-bit tiles' row stride
  static constexpr int LS = MT + 4;  ///< f32 score tiles' row stride
  static constexpr int LO = HD + 4;  ///< f32 output tiles' row stride
  static constexpr int LP = MT + 8;  ///< 16-bit probability tiles' row stride
  static constexpr size_t tile16 = size_t(MT) * LD * 2;
  static constexpr size_t score = size_t(16) * LS * 4;
  static constexpr size_t outTile = size_t(16) * LO * 4;
  static constexpr size_t prob = size_t(16) * LP * 2;
  /// Forward: q, k, v tiles; per warp a score tile, an output tile and a
  /// probability tile.
  static constexpr size_t fwd = 3 * tile16 + 4 * (score + outTile + prob);
  /// dq: q, do, k, v tiles; per warp s, dp (the output tile reuses them)
  /// and ds.
  static constexpr size_t dq = 4 * tile16 + 4 * (2 * score + prob);
  /// dk/dv: k, v, q, do tiles, the lse and D rows; per warp s^T, dp^T (the
  /// output tile reuses them), p^T and ds^T.
  static constexpr size_t dkdv =
      4 * tile16 + 2 * MT * 4 + 4 * (2 * score + 2 * prob);
  static_assert(2 * score >= outTile, "the output tile reuses s and dp");
  static_assert(tile16 % 32 == 0 && score % 32 == 0 && outTile % 32 == 0 &&
                    prob % 32 == 0,
                "WMMA pointers must stay 32-byte aligned");
};

template <typename T, int HD>
__global__ void __launch_bounds__(kAttnThreads)
    attnFwdMmaKernel(AttentionDims a, const T *q, const T *k, const T *v,
                     T *out, float *lse, const T *dout, float *dvec) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using M = typename MmaType<T>::type;
  using L = MmaLayout<HD>;
  extern __shared__ __align__(128) unsigned char smraw[];
  M *qs = reinterpret_cast<M *>(smraw);
  M *ks = qs + MT * L::LD;
  M *vs = ks + MT * L::LD;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char *wbase = smraw + 3 * L::tile16 +
                         size_t(warp) * (L::score + L::outTile + L::prob);
  float *sw = reinterpret_cast<float *>(wbase);
  float *ow = reinterpret_cast<float *>(wbase + L::score);
  M *pw = reinterpret_cast<M *>(wbase + L::score + L::outTile);
  int64_t bh = blockIdx.x, b = bh / a.h, h = bh % a.h;
  int64_t kvh = b * a.g + h / (a.h / a.g);
  int64_t q0 = int64_t(blockIdx.y) * MT;
  const T *kb = k + kvh * a.t * HD, *vb = v + kvh * a.t * HD;
  loadRows16<HD>(qs, L::LD, q + bh * a.s * HD, q0, MT, a.s);
  for (int i = lane; i < 16 * L::LO; i += 32)
    ow[i] = 0.0f;
  int r = lane / 2, half = lane % 2;
  int64_t qi = q0 + warp * 16 + r;
  bool valid = qi < a.s;
  const int64_t shift = causalShift(a);
  int64_t myLimit = valid ? keyLimit(a, shift, qi) : 0;
  int64_t last = (q0 + MT < a.s ? q0 + MT : a.s) - 1;
  int64_t blockLimit = keyLimit(a, shift, last);
  float m = -INFINITY, l = 0.0f;
  for (int64_t k0 = 0; k0 < blockLimit; k0 += MT) {
    __syncthreads();
    loadRows16<HD>(ks, L::LD, kb, k0, MT, a.t);
    loadRows16<HD>(vs, L::LD, vb, k0, MT, a.t);
    __syncthreads();
    mmaABt<M, HD>(sw, L::LS, qs + warp * 16 * L::LD, L::LD, ks, L::LD);
    __syncwarp();
    float sc[MT / 2];
#pragma unroll
    for (int j = 0; j < MT / 2; ++j) {
      int col = half * (MT / 2) + j;
      sc[j] = valid && k0 + col < myLimit ? sw[r * L::LS + col] * a.scale
                                          : -INFINITY;
    }
    // Two lanes per row.
    float corr = onlineSoftmaxTile(
        sc, m, l,
        [](float v) { return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1)); },
        [](float v) { return v + __shfl_xor_sync(0xffffffffu, v, 1); });
#pragma unroll
    for (int j = 0; j < MT / 2; ++j)
      pw[r * L::LP + half * (MT / 2) + j] = toMma(sc[j], pw);
    for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c)
      ow[r * L::LO + c] *= corr;
    __syncwarp();
    FragC acc[HD / 16];
#pragma unroll
    for (int c = 0; c < HD / 16; ++c)
      wm::load_matrix_sync(acc[c], ow + c * 16, L::LO, wm::mem_row_major);
    mmaAccumulate<M, HD>(acc, pw, L::LP, vs, L::LD);
#pragma unroll
    for (int c = 0; c < HD / 16; ++c)
      wm::store_matrix_sync(ow + c * 16, acc[c], L::LO, wm::mem_row_major);
    __syncwarp();
  }
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
  int64_t row = bh * a.s + qi;
  if (!lse) {
    if (valid)
      for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c)
        out[row * HD + c] = fromF<T>(ow[r * L::LO + c] * inv);
    return;
  }
  float dsum = 0.0f;
  if (valid)
    for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c)
      dsum += toF(dout[row * HD + c]) * (ow[r * L::LO + c] * inv);
  dsum += __shfl_xor_sync(0xffffffffu, dsum, 1);
  if (valid && half == 0) {
    lse[row] = l > 0.0f ? m + logf(l) : 0.0f;
    dvec[row] = dsum;
  }
#else
  __trap(); // the host launches these only on sm_80 and newer
#endif
}

template <typename T, int HD>
__global__ void __launch_bounds__(kAttnThreads)
    attnDqMmaKernel(AttentionDims a, const T *q, const T *k, const T *v,
                    const T *dout, const float *lse, const float *dvec, T *dq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using M = typename MmaType<T>::type;
  using L = MmaLayout<HD>;
  extern __shared__ __align__(128) unsigned char smraw[];
  M *qs = reinterpret_cast<M *>(smraw);
  M *dos = qs + MT * L::LD;
  M *ks = dos + MT * L::LD;
  M *vs = ks + MT * L::LD;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char *wbase =
      smraw + 4 * L::tile16 + size_t(warp) * (2 * L::score + L::prob);
  float *sw = reinterpret_cast<float *>(wbase);
  float *dpw = reinterpret_cast<float *>(wbase + L::score);
  M *dsw = reinterpret_cast<M *>(wbase + 2 * L::score);
  int64_t bh = blockIdx.x, b = bh / a.h, h = bh % a.h;
  int64_t kvh = b * a.g + h / (a.h / a.g);
  int64_t q0 = int64_t(blockIdx.y) * MT;
  const T *kb = k + kvh * a.t * HD, *vb = v + kvh * a.t * HD;
  loadRows16<HD>(qs, L::LD, q + bh * a.s * HD, q0, MT, a.s);
  loadRows16<HD>(dos, L::LD, dout + bh * a.s * HD, q0, MT, a.s);
  int r = lane / 2, half = lane % 2;
  int64_t qi = q0 + warp * 16 + r;
  bool valid = qi < a.s;
  int64_t row = bh * a.s + qi;
  float rowLse = valid ? lse[row] : 0.0f, rowD = valid ? dvec[row] : 0.0f;
  const int64_t shift = causalShift(a);
  int64_t myLimit = valid ? keyLimit(a, shift, qi) : 0;
  int64_t last = (q0 + MT < a.s ? q0 + MT : a.s) - 1;
  int64_t blockLimit = keyLimit(a, shift, last);
  FragC acc[HD / 16];
#pragma unroll
  for (int c = 0; c < HD / 16; ++c)
    wm::fill_fragment(acc[c], 0.0f);
  for (int64_t k0 = 0; k0 < blockLimit; k0 += MT) {
    __syncthreads();
    loadRows16<HD>(ks, L::LD, kb, k0, MT, a.t);
    loadRows16<HD>(vs, L::LD, vb, k0, MT, a.t);
    __syncthreads();
    mmaABt<M, HD>(sw, L::LS, qs + warp * 16 * L::LD, L::LD, ks, L::LD);
    mmaABt<M, HD>(dpw, L::LS, dos + warp * 16 * L::LD, L::LD, vs, L::LD);
    __syncwarp();
#pragma unroll
    for (int j = 0; j < MT / 2; ++j) {
      int col = half * (MT / 2) + j;
      float ds = 0.0f;
      if (valid && k0 + col < myLimit) {
        float p = expf(sw[r * L::LS + col] * a.scale - rowLse);
        ds = p * (dpw[r * L::LS + col] - rowD);
      }
      dsw[r * L::LP + col] = toMma(ds, dsw);
    }
    __syncwarp();
    mmaAccumulate<M, HD>(acc, dsw, L::LP, ks, L::LD);
  }
  float *ow = sw; // s and dp are done with
  __syncwarp();
#pragma unroll
  for (int c = 0; c < HD / 16; ++c)
    wm::store_matrix_sync(ow + c * 16, acc[c], L::LO, wm::mem_row_major);
  __syncwarp();
  if (valid)
    for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c)
      dq[row * HD + c] = fromF<T>(ow[r * L::LO + c] * a.scale);
#else
  __trap();
#endif
}

template <typename T, int HD>
__global__ void __launch_bounds__(kAttnThreads)
    attnDkDvMmaKernel(AttentionDims a, const T *q, const T *k, const T *v,
                      const T *dout, const float *lse, const float *dvec,
                      T *dk, T *dv) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using M = typename MmaType<T>::type;
  using L = MmaLayout<HD>;
  extern __shared__ __align__(128) unsigned char smraw[];
  M *ks = reinterpret_cast<M *>(smraw);
  M *vs = ks + MT * L::LD;
  M *qs = vs + MT * L::LD;
  M *dos = qs + MT * L::LD;
  float *ls = reinterpret_cast<float *>(smraw + 4 * L::tile16);
  float *dsv = ls + MT;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char *wbase = smraw + 4 * L::tile16 + 2 * MT * 4 +
                         size_t(warp) * (2 * L::score + 2 * L::prob);
  float *st = reinterpret_cast<float *>(wbase);
  float *dpt = reinterpret_cast<float *>(wbase + L::score);
  M *pt = reinterpret_cast<M *>(wbase + 2 * L::score);
  M *dst = reinterpret_cast<M *>(wbase + 2 * L::score + L::prob);
  int64_t kvh = blockIdx.x, b = kvh / a.g, gi = kvh % a.g;
  int64_t k0 = int64_t(blockIdx.y) * MT;
  int r = lane / 2, half = lane % 2;
  int64_t j = k0 + warp * 16 + r;
  bool validK = j < a.t;
  const int64_t shift = causalShift(a);
  loadRows16<HD>(ks, L::LD, k + kvh * a.t * HD, k0, MT, a.t);
  loadRows16<HD>(vs, L::LD, v + kvh * a.t * HD, k0, MT, a.t);
  FragC accK[HD / 16], accV[HD / 16];
#pragma unroll
  for (int c = 0; c < HD / 16; ++c) {
    wm::fill_fragment(accK[c], 0.0f);
    wm::fill_fragment(accV[c], 0.0f);
  }
  int64_t hpg = a.h / a.g;
  // The first query that may see key k0 (causal: i + shift >= k0).
  int64_t iStart = a.causal ? (k0 - shift > 0 ? k0 - shift : 0) : 0;
  for (int64_t hh = 0; hh < hpg; ++hh) {
    int64_t bh = b * a.h + gi * hpg + hh;
    for (int64_t i0 = iStart; i0 < a.s; i0 += MT) {
      __syncthreads();
      loadRows16<HD>(qs, L::LD, q + bh * a.s * HD, i0, MT, a.s);
      loadRows16<HD>(dos, L::LD, dout + bh * a.s * HD, i0, MT, a.s);
      for (int t = threadIdx.x; t < MT; t += blockDim.x) {
        int64_t i = i0 + t;
        ls[t] = i < a.s ? lse[bh * a.s + i] : 0.0f;
        dsv[t] = i < a.s ? dvec[bh * a.s + i] : 0.0f;
      }
      __syncthreads();
      mmaABt<M, HD>(st, L::LS, ks + warp * 16 * L::LD, L::LD, qs, L::LD);
      mmaABt<M, HD>(dpt, L::LS, vs + warp * 16 * L::LD, L::LD, dos, L::LD);
      __syncwarp();
#pragma unroll
      for (int jj = 0; jj < MT / 2; ++jj) {
        int col = half * (MT / 2) + jj;
        int64_t i = i0 + col;
        float p = 0.0f, ds = 0.0f;
        if (validK && i < a.s && (!a.causal || j <= i + shift)) {
          p = expf(st[r * L::LS + col] * a.scale - ls[col]);
          ds = p * (dpt[r * L::LS + col] - dsv[col]);
        }
        pt[r * L::LP + col] = toMma(p, pt);
        dst[r * L::LP + col] = toMma(ds, dst);
      }
      __syncwarp();
      mmaAccumulate<M, HD>(accV, pt, L::LP, dos, L::LD);
      mmaAccumulate<M, HD>(accK, dst, L::LP, qs, L::LD);
    }
  }
  float *ow = st; // s^T and dp^T are done with
  __syncwarp();
#pragma unroll
  for (int c = 0; c < HD / 16; ++c)
    wm::store_matrix_sync(ow + c * 16, accK[c], L::LO, wm::mem_row_major);
  __syncwarp();
  if (validK)
    for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c)
      dk[(kvh * a.t + j) * HD + c] = fromF<T>(ow[r * L::LO + c] * a.scale);
  __syncwarp();
#pragma unroll
  for (int c = 0; c < HD / 16; ++c)
    wm::store_matrix_sync(ow + c * 16, accV[c], L::LO, wm::mem_row_major);
  __syncwarp();
  if (validK)
    for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c)
      dv[(kvh * a.t + j) * HD + c] = fromF<T>(ow[r * L::LO + c]);
#else
  __trap();
#endif
}


std::atomic<int> gPath{-1};

AttentionPath pathFromEnv() {
  const char *e = std::getenv("DLOPT_CUDA_ATTENTION");
  std::string v = e ? e : "";
  if (v == "simt")
    return AttentionPath::Simt;
  if (v == "mma")
    return AttentionPath::Mma;
  return AttentionPath::Wmma;
}

/// The kernels that take `a` on this device: the tensor-core ones (the
/// selected path) for bf16 or f16, head dims d == e of 64 or 128, 16-byte
/// aligned tensors, sm_80 or newer; the CUDA-core ones otherwise.
AttentionPath pathFor(DType t, const AttentionDims &a,
                      std::initializer_list<const void *> ptrs) {
  AttentionPath p = attentionPath();
  if (p == AttentionPath::Simt)
    return p;
  if (t != DType::BF16 && t != DType::F16)
    return AttentionPath::Simt;
  if (a.d != a.e || (a.d != 64 && a.d != 128))
    return AttentionPath::Simt;
  for (const void *ptr : ptrs)
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      return AttentionPath::Simt;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) !=
          cudaSuccess ||
      major < 8)
    return AttentionPath::Simt;
  return p;
}

template <typename Fn> int dispatchMma(DType t, int64_t d, Fn &&fn) {
  auto withDim = [&](auto tt) {
    if (d == 64)
      return fn(tt, std::integral_constant<int, 64>{});
    return fn(tt, std::integral_constant<int, 128>{});
  };
  if (t == DType::BF16)
    return withDim(BF16{});
  return withDim(F16{});
}

/// Columns per thread for head dims up to `dim`.
template <typename Fn> int dispatchCpt(int64_t dim, Fn &&fn) {
  if (dim <= 64)
    return fn(std::integral_constant<int, 8>{});
  if (dim <= 128)
    return fn(std::integral_constant<int, 16>{});
  if (dim <= kMaxHeadDim)
    return fn(std::integral_constant<int, 32>{});
  return int(cudaErrorInvalidValue);
}

/// Launches with `smem` bytes of dynamic shared memory, raising the
/// kernel's limit first when it is above the default 48 KiB.
template <typename K, typename... Args>
int launch(K kernel, dim3 grid, size_t smem, cudaStream_t st, Args... args) {
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess)
      return int(e);
  }
  kernel<<<grid, kAttnThreads, smem, st>>>(args...);
  return lastError();
}

size_t fwdSmem(const AttentionDims &a) {
  return sizeof(float) *
         size_t(BQ * (a.d + 1) + BK * (a.d + 1) + BK * a.e + BQ * BK);
}
size_t dqSmem(const AttentionDims &a) {
  return sizeof(float) * size_t((BQ + BK) * (a.d + 1) + (BQ + BK) * (a.e + 1) +
                                BQ * BK);
}
size_t dkdvSmem(const AttentionDims &a) {
  return sizeof(float) * size_t((KR + QT) * (a.d + 1) + (KR + QT) * (a.e + 1) +
                                2 * QT + 2 * KR * QT);
}

} // namespace

int attention(Stream s, DType t, const AttentionDims &a, const void *q,
              const void *k, const void *v, void *out) {
  if (a.b * a.h * a.s * a.e == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  const AttentionPath path = pathFor(t, a, {q, k, v, out});
  if (path == AttentionPath::Mma) {
    dim3 grid{unsigned(a.b * a.h), unsigned((a.s + fa::BM - 1) / fa::BM)};
    return dispatchMma(t, a.d, [&](auto tt, auto hd) {
      using T = decltype(tt);
      constexpr int HD = decltype(hd)::value;
      return launch(fa::fwdKernel<T, HD>, grid, fa::Layout<HD>::fwd, st, a,
                    static_cast<const T *>(q), static_cast<const T *>(k),
                    static_cast<const T *>(v), static_cast<T *>(out),
                    static_cast<float *>(nullptr),
                    static_cast<const T *>(nullptr),
                    static_cast<float *>(nullptr));
    });
  }
  if (path == AttentionPath::Wmma) {
    dim3 grid{unsigned(a.b * a.h), unsigned((a.s + MT - 1) / MT)};
    return dispatchMma(t, a.d, [&](auto tt, auto hd) {
      using T = decltype(tt);
      constexpr int HD = decltype(hd)::value;
      return launch(attnFwdMmaKernel<T, HD>, grid, MmaLayout<HD>::fwd, st, a,
                    static_cast<const T *>(q), static_cast<const T *>(k),
                    static_cast<const T *>(v), static_cast<T *>(out),
                    static_cast<float *>(nullptr),
                    static_cast<const T *>(nullptr),
                    static_cast<float *>(nullptr));
    });
  }
  dim3 grid{unsigned(a.b * a.h), unsigned((a.s + BQ - 1) / BQ)};
  return dispatchFloat(t, [&](auto tt) {
    using T = decltype(tt);
    return dispatchCpt(std::max(a.d, a.e), [&](auto cpt) {
      constexpr int CPT = decltype(cpt)::value;
      return launch(attnFwdKernel<T, CPT>, grid, fwdSmem(a), st, a,
                    static_cast<const T *>(q), static_cast<const T *>(k),
                    static_cast<const T *>(v), static_cast<T *>(out),
                    static_cast<float *>(nullptr),
                    static_cast<const T *>(nullptr),
                    static_cast<float *>(nullptr));
    });
  });
}

int64_t attentionGradWorkspaceBytes(const AttentionDims &a) {
  return 2 * a.b * a.h * a.s * int64_t(sizeof(float));
}

int attentionGrad(Stream s, DType t, const AttentionDims &a, const void *q,
                  const void *k, const void *v, const void *dout, void *dq,
                  void *dk, void *dv, float *ws) {
  auto st = static_cast<cudaStream_t>(s);
  float *lse = ws, *dvec = ws + a.b * a.h * a.s;
  const AttentionPath path = a.b * a.h * a.s > 0
                                 ? pathFor(t, a, {q, k, v, dout, dq, dk, dv})
                                 : AttentionPath::Simt;
  if (path == AttentionPath::Mma) {
    return dispatchMma(t, a.d, [&](auto tt, auto hd) {
      using T = decltype(tt);
      constexpr int HD = decltype(hd)::value;
      using L = fa::Layout<HD>;
      const T *tq = static_cast<const T *>(q), *tk = static_cast<const T *>(k),
              *tv = static_cast<const T *>(v),
              *tdo = static_cast<const T *>(dout);
      dim3 qgrid{unsigned(a.b * a.h), unsigned((a.s + fa::BM - 1) / fa::BM)};
      int rc = launch(fa::fwdKernel<T, HD>, qgrid, L::fwd, st, a, tq, tk, tv,
                      static_cast<T *>(nullptr), lse, tdo, dvec);
      if (rc)
        return rc;
      rc = launch(fa::dqKernel<T, HD>, qgrid, L::dq, st, a, tq, tk, tv, tdo,
                  static_cast<const float *>(lse),
                  static_cast<const float *>(dvec), static_cast<T *>(dq));
      if (rc || a.t == 0)
        return rc;
      dim3 kgrid{unsigned(a.b * a.g), unsigned((a.t + fa::BM - 1) / fa::BM)};
      return launch(fa::dkdvKernel<T, HD>, kgrid, L::dkdv, st, a, tq, tk, tv,
                    tdo, static_cast<const float *>(lse),
                    static_cast<const float *>(dvec), static_cast<T *>(dk),
                    static_cast<T *>(dv));
    });
  }
  if (path == AttentionPath::Wmma) {
    return dispatchMma(t, a.d, [&](auto tt, auto hd) {
      using T = decltype(tt);
      constexpr int HD = decltype(hd)::value;
      using L = MmaLayout<HD>;
      const T *tq = static_cast<const T *>(q), *tk = static_cast<const T *>(k),
              *tv = static_cast<const T *>(v),
              *tdo = static_cast<const T *>(dout);
      dim3 qgrid{unsigned(a.b * a.h), unsigned((a.s + MT - 1) / MT)};
      int rc = launch(attnFwdMmaKernel<T, HD>, qgrid, L::fwd, st, a, tq, tk, tv,
                      static_cast<T *>(nullptr), lse, tdo, dvec);
      if (rc)
        return rc;
      rc = launch(attnDqMmaKernel<T, HD>, qgrid, L::dq, st, a, tq, tk, tv, tdo,
                  static_cast<const float *>(lse),
                  static_cast<const float *>(dvec), static_cast<T *>(dq));
      if (rc || a.t == 0)
        return rc;
      dim3 kgrid{unsigned(a.b * a.g), unsigned((a.t + MT - 1) / MT)};
      return launch(attnDkDvMmaKernel<T, HD>, kgrid, L::dkdv, st, a, tq, tk,
                    tv, tdo, static_cast<const float *>(lse),
                    static_cast<const float *>(dvec), static_cast<T *>(dk),
                    static_cast<T *>(dv));
    });
  }
  return dispatchFloat(t, [&](auto tt) {
    using T = decltype(tt);
    // Without queries every key gets a zero gradient (and dq is empty).
    if (a.b * a.h * a.s == 0) {
      cudaError_t e = cudaMemsetAsync(
          dk, 0, size_t(a.b * a.g * a.t * a.d) * sizeof(T), st);
      if (e == cudaSuccess)
        e = cudaMemsetAsync(dv, 0, size_t(a.b * a.g * a.t * a.e) * sizeof(T),
                            st);
      return int(e);
    }
    return dispatchCpt(std::max(a.d, a.e), [&](auto cpt) {
      constexpr int CPT = decltype(cpt)::value;
      const T *tq = static_cast<const T *>(q), *tk = static_cast<const T *>(k),
              *tv = static_cast<const T *>(v),
              *tdo = static_cast<const T *>(dout);
      dim3 qgrid{unsigned(a.b * a.h), unsigned((a.s + BQ - 1) / BQ)};
      int rc = launch(attnFwdKernel<T, CPT>, qgrid, fwdSmem(a), st, a, tq, tk,
                      tv, static_cast<T *>(nullptr), lse, tdo, dvec);
      if (rc)
        return rc;
      rc = launch(attnDqKernel<T, CPT>, qgrid, dqSmem(a), st, a, tq, tk, tv,
                  tdo, static_cast<const float *>(lse),
                  static_cast<const float *>(dvec), static_cast<T *>(dq));
      if (rc || a.t == 0)
        return rc;
      dim3 kgrid{unsigned(a.b * a.g), unsigned((a.t + KR - 1) / KR)};
      return launch(attnDkDvKernel<T, CPT>, kgrid, dkdvSmem(a), st, a, tq, tk,
                    tv, tdo, static_cast<const float *>(lse),
                    static_cast<const float *>(dvec), static_cast<T *>(dk),
                    static_cast<T *>(dv));
    });
  });
}

void setAttentionPath(AttentionPath p) { gPath.store(int(p)); }

AttentionPath attentionPath() {
  int p = gPath.load();
  if (p < 0) {
    int fromEnv = int(pathFromEnv());
    gPath.compare_exchange_strong(p, fromEnv);
    p = gPath.load();
  }
  return AttentionPath(p);
}

int rope(Stream s, DType t, const void *x, void *y, int64_t rows, int64_t seq,
         int64_t d, double theta, bool inverse, const void *offset,
         DType offsetType) {
  if (rows == 0 || d == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchFloat(t, [&](auto tt) {
    using T = decltype(tt);
    ropeKernel<T><<<gridFor(rows * (d / 2)), kThreads, 0, st>>>(
        static_cast<const T *>(x), static_cast<T *>(y), rows, seq, d, theta,
        inverse, offset, offsetType == DType::I64);
    return lastError();
  });
}

} // namespace dlopt::rt::cuda::kernels
