//===- Reduce.cu - gather/scatter, reductions, softmax, norms, losses -----===//
//
// Everything here reduces in a fixed order whose shape depends only on the
// tensor shapes (block trees over fixed strides, per-chunk partials summed
// in chunk order, no floating-point atomics), so results are the same from
// run to run. Statistics accumulate in f64 as in runtime/cpu; scatter_add
// accumulates in f32 in the row-major order of the ids, exactly as the CPU
// kernel does.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/kernels/Common.cuh"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <type_traits>

namespace dlopt::rt::cuda::kernels {
namespace {

/// Deterministic tree reduction over a block of blockDim.x (a power of two,
/// at most kThreads) values; every thread gets the result.
template <typename A, typename F>
__device__ __forceinline__ A blockReduce(A v, F combine) {
  __shared__ alignas(8) unsigned char raw[kThreads * 8];
  A *buf = reinterpret_cast<A *>(raw);
  unsigned t = threadIdx.x;
  __syncthreads();
  buf[t] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (t < s)
      buf[t] = combine(buf[t], buf[t + s]);
    __syncthreads();
  }
  A r = buf[0];
  __syncthreads();
  return r;
}

struct SumD {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct MaxF {
  __device__ float operator()(float a, float b) const { return nanMax(a, b); }
};

//===--- gather ---------------------------------------------------------===//

template <typename W>
__global__ void gatherKernel(const W *table, const void *ids, bool ids64,
                             int64_t n, int64_t v, int64_t rowWords, W *out,
                             DeviceError *err, int tag) {
  int64_t total = n * rowWords;
  DLOPT_GRID_STRIDE(w, total) {
    int64_t i = w / rowWords, c = w % rowWords;
    int64_t id = loadId(ids, ids64, i);
    if (id < 0 || id >= v) {
      if (c == 0)
        raise(err, kErrIdOutOfRange, tag, id, i, v);
      continue;
    }
    out[w] = table[id * rowWords + c];
  }
}

//===--- scatter_add --------------------------------------------------------===//

/// Thread = one feature column of one bucket of rows; it walks every id in
/// order and adds the ones that land in its bucket, so each output element
/// sums its updates in the row-major order of ids (as the CPU kernel).
template <typename T>
__global__ void scatterAddKernel(const void *ids, bool ids64, const T *u,
                                 float *acc, int64_t n, int64_t v, int64_t rest,
                                 int64_t bucket, DeviceError *err, int tag) {
  int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t lo = int64_t(blockIdx.y) * bucket;
  int64_t hi = lo + bucket < v ? lo + bucket : v;
  bool reporter = c == 0 && blockIdx.y == 0;
  if (c >= rest && !reporter)
    return;
  for (int64_t i = 0; i < n; ++i) {
    int64_t id = loadId(ids, ids64, i);
    if (id < 0 || id >= v) {
      if (reporter)
        raise(err, kErrIdOutOfRange, tag, id, i, v);
      continue;
    }
    if (c < rest && id >= lo && id < hi)
      acc[id * rest + c] += toF(u[i * rest + c]);
  }
}

template <typename T>
__global__ void storeF32Kernel(const float *src, T *dst, int64_t n) {
  DLOPT_GRID_STRIDE(i, n) { dst[i] = fromF<T>(src[i]); }
}

//===--- sum / mean / max -----------------------------------------------------===//

template <typename T, ReduceKind K> struct Red {
  static constexpr bool isF = IsFloatStorage<T>::value;
  using A = typename std::conditional<
      K == ReduceKind::Max, typename std::conditional<isF, float, T>::type,
      typename std::conditional<isF, double, unsigned long long>::type>::type;
  static __device__ A init() {
    if constexpr (K != ReduceKind::Max)
      return A(0);
    else if constexpr (isF)
      return -INFINITY;
    else
      return sizeof(T) == 8 ? T(-0x7FFFFFFFFFFFFFFFll - 1) : T(INT_MIN);
  }
  static __device__ void add(A &acc, T x) {
    if constexpr (K != ReduceKind::Max) {
      if constexpr (isF)
        acc += double(toF(x));
      else
        acc += (unsigned long long)(long long)(x); // wraps like the op
    } else if constexpr (isF) {
      float v = toF(x);
      if (acc == acc && (v != v || v > acc)) // NaN sticks
        acc = v;
    } else if (x > acc) {
      acc = x;
    }
  }
  struct Combine {
    __device__ A operator()(A a, A b) const {
      if constexpr (K != ReduceKind::Max)
        return a + b;
      else if constexpr (isF)
        return nanMax(a, b);
      else
        return a > b ? a : b;
    }
  };
  static __device__ T finish(A acc, int64_t count) {
    if constexpr (K == ReduceKind::Mean && isF)
      return fromF<T>(float(acc / double(count)));
    else if constexpr (isF)
      return fromF<T>(float(acc));
    else
      return T(acc);
  }
};

__device__ __forceinline__ int64_t dimsOffset(int rank, const int64_t *size,
                                              const int64_t *stride,
                                              int64_t i) {
  int64_t off = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d >= rank)
      continue;
    off += (i % size[d]) * stride[d];
    i /= size[d];
  }
  return off;
}

__device__ __forceinline__ int64_t keptOffset(const ReducePlan &p, int64_t o) {
  return p.keptRank == 1 ? o * p.keptStride[0]
                         : dimsOffset(p.keptRank, p.keptSize, p.keptStride, o);
}
__device__ __forceinline__ int64_t redOffset(const ReducePlan &p, int64_t r) {
  return p.redRank == 1 ? r * p.redStride[0]
                        : dimsOffset(p.redRank, p.redSize, p.redStride, r);
}

/// The reduced dims are innermost (stride 1): one block per output (and per
/// chunk of `chunk` reduced elements, blockIdx.y) walks its inputs with
/// consecutive threads on consecutive elements. With one chunk the block
/// writes y; with several it writes its partial to part[o * chunks + c] and
/// reduceFinishKernel combines them in chunk order.
template <typename T, ReduceKind K>
__global__ void reduceRowsKernel(ReducePlan p, int64_t chunk, const T *x, T *y,
                                 typename Red<T, K>::A *part) {
  using R = Red<T, K>;
  int64_t c = blockIdx.y, chunks = gridDim.y;
  int64_t r0 = c * chunk, r1 = r0 + chunk < p.numRed ? r0 + chunk : p.numRed;
  for (int64_t o = blockIdx.x; o < p.numOut; o += gridDim.x) {
    int64_t base = keptOffset(p, o);
    typename R::A acc = R::init();
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x)
      R::add(acc, x[base + redOffset(p, r)]);
    acc = blockReduce(acc, typename R::Combine{});
    if (threadIdx.x == 0) {
      if (part)
        part[o * chunks + c] = acc;
      else
        y[o] = R::finish(acc, p.numRed);
    }
  }
}

/// The innermost dim is kept: a 32 x 8 block covers 32 adjacent outputs
/// (coalesced) with 8 lanes over the reduced elements of its chunk
/// (blockIdx.y), combined in lane order; partials as in reduceRowsKernel.
template <typename T, ReduceKind K>
__global__ void reduceColsKernel(ReducePlan p, int64_t chunk, const T *x, T *y,
                                 typename Red<T, K>::A *part) {
  using R = Red<T, K>;
  __shared__ typename R::A lanes[8][32];
  int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  int64_t c = blockIdx.y, chunks = gridDim.y;
  int64_t r0 = c * chunk, r1 = r0 + chunk < p.numRed ? r0 + chunk : p.numRed;
  for (int64_t o0 = int64_t(blockIdx.x) * 32; o0 < p.numOut;
       o0 += int64_t(gridDim.x) * 32) {
    int64_t o = o0 + tx;
    typename R::A acc = R::init();
    if (o < p.numOut) {
      int64_t base = keptOffset(p, o);
      for (int64_t r = r0 + ty; r < r1; r += 8)
        R::add(acc, x[base + redOffset(p, r)]);
    }
    lanes[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && o < p.numOut) {
      typename R::A a = lanes[0][tx];
      for (int l = 1; l < 8; ++l)
        a = typename R::Combine{}(a, lanes[l][tx]);
      if (part)
        part[o * chunks + c] = a;
      else
        y[o] = R::finish(a, p.numRed);
    }
    __syncthreads();
  }
}

/// Combines each output's chunk partials in chunk order.
template <typename T, ReduceKind K>
__global__ void reduceFinishKernel(int64_t numOut, int64_t chunks,
                                   int64_t numRed,
                                   const typename Red<T, K>::A *part, T *y) {
  using R = Red<T, K>;
  DLOPT_GRID_STRIDE(o, numOut) {
    typename R::A a = part[o * chunks];
    for (int64_t c = 1; c < chunks; ++c)
      a = typename R::Combine{}(a, part[o * chunks + c]);
    y[o] = R::finish(a, numRed);
  }
}

//===--- softmax ----------------------------------------------------------===//

template <typename T>
__global__ void softmaxRowsKernel(bool log, const T *x, T *y, int64_t rows,
                                  int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + r * n;
    T *yr = y + r * n;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      m = nanMax(m, toF(xr[j]));
    m = blockReduce(m, MaxF{});
    double s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      s += double(expf(toF(xr[j]) - m));
    s = blockReduce(s, SumD{});
    if (log) {
      float lse = float(::log(s));
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        yr[j] = fromF<T>((toF(xr[j]) - m) - lse);
    } else {
      float inv = float(1.0 / s);
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        yr[j] = fromF<T>(expf(toF(xr[j]) - m) * inv);
    }
  }
}

/// softmax along a non-innermost dim: one thread per column, adjacent
/// threads on adjacent columns.
template <typename T>
__global__ void softmaxColsKernel(bool log, const T *x, T *y, int64_t outer,
                                  int64_t n, int64_t inner) {
  DLOPT_GRID_STRIDE(col, outer * inner) {
    int64_t base = (col / inner) * n * inner + col % inner;
    float m = -INFINITY;
    for (int64_t j = 0; j < n; ++j)
      m = nanMax(m, toF(x[base + j * inner]));
    double s = 0;
    for (int64_t j = 0; j < n; ++j)
      s += double(expf(toF(x[base + j * inner]) - m));
    float sc = log ? float(::log(s)) : float(1.0 / s);
    for (int64_t j = 0; j < n; ++j) {
      float v = toF(x[base + j * inner]);
      y[base + j * inner] =
          fromF<T>(log ? (v - m) - sc : expf(v - m) * sc);
    }
  }
}

template <typename T>
__global__ void softmaxGradRowsKernel(bool log, const T *y, const T *dy, T *dx,
                                      int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *yr = y + r * n, *gr = dy + r * n;
    T *xr = dx + r * n;
    double s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      s += log ? double(toF(gr[j])) : double(toF(gr[j])) * double(toF(yr[j]));
    float sf = float(blockReduce(s, SumD{}));
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      float yv = toF(yr[j]), g = toF(gr[j]);
      xr[j] = fromF<T>(log ? g - expf(yv) * sf : yv * (g - sf));
    }
  }
}

template <typename T>
__global__ void softmaxGradColsKernel(bool log, const T *y, const T *dy, T *dx,
                                      int64_t outer, int64_t n, int64_t inner) {
  DLOPT_GRID_STRIDE(col, outer * inner) {
    int64_t base = (col / inner) * n * inner + col % inner;
    double s = 0;
    for (int64_t j = 0; j < n; ++j) {
      int64_t k = base + j * inner;
      s += log ? double(toF(dy[k])) : double(toF(dy[k])) * double(toF(y[k]));
    }
    float sf = float(s);
    for (int64_t j = 0; j < n; ++j) {
      int64_t k = base + j * inner;
      float yv = toF(y[k]), g = toF(dy[k]);
      dx[k] = fromF<T>(log ? g - expf(yv) * sf : yv * (g - sf));
    }
  }
}

//===--- layer_norm / rms_norm ------------------------------------------------===//

/// Mean (0 for rms_norm) and 1/sqrt(var + eps) of one row, as the CPU does.
template <typename T>
__device__ void rowStats(bool rms, const T *xr, int64_t n, double eps,
                         float &mu, float &rs) {
  if (rms) {
    double ss = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      double v = double(toF(xr[j]));
      ss += v * v;
    }
    ss = blockReduce(ss, SumD{});
    mu = 0.0f;
    rs = float(1.0 / sqrt(ss / double(n) + eps));
  } else {
    double s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      s += double(toF(xr[j]));
    double mean = blockReduce(s, SumD{}) / double(n);
    double ss = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      double d = double(toF(xr[j])) - mean;
      ss += d * d;
    }
    ss = blockReduce(ss, SumD{});
    mu = float(mean);
    rs = float(1.0 / sqrt(ss / double(n) + eps));
  }
}

template <typename T>
__global__ void normKernel(bool rms, const T *x, const T *w, const T *b, T *y,
                           int64_t rows, int64_t n, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + r * n;
    T *yr = y + r * n;
    float mu, rs;
    rowStats(rms, xr, n, eps, mu, rs);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      float z = (toF(xr[j]) - mu) * rs;
      if (w)
        z *= toF(w[j]);
      if (b)
        z += toF(b[j]);
      yr[j] = fromF<T>(z);
    }
  }
}

/// dx per row; the row's mean and rs are kept in `stats` for the parameter
/// gradients.
template <typename T>
__global__ void normGradRowsKernel(bool rms, const T *x, const T *dy,
                                   const T *w, T *dx, float2 *stats,
                                   int64_t rows, int64_t n, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + r * n, *gr = dy + r * n;
    T *out = dx + r * n;
    float mu, rs;
    rowStats(rms, xr, n, eps, mu, rs);
    if (threadIdx.x == 0)
      stats[r] = make_float2(mu, rs);
    double sg = 0, sgx = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      float xh = (toF(xr[j]) - mu) * rs;
      float g = toF(gr[j]) * (w ? toF(w[j]) : 1.0f);
      sg += double(g);
      sgx += double(g) * double(xh);
    }
    sg = blockReduce(sg, SumD{});
    sgx = blockReduce(sgx, SumD{});
    float mg = float(sg / double(n)), mgx = float(sgx / double(n));
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      float xh = (toF(xr[j]) - mu) * rs;
      float g = toF(gr[j]) * (w ? toF(w[j]) : 1.0f);
      out[j] = fromF<T>((rms ? g - xh * mgx : g - mg - xh * mgx) * rs);
    }
  }
}

/// Partial dw/db over one chunk of rows: 32 columns x 8 row lanes.
template <typename T>
__global__ void normParamPartialKernel(const T *x, const T *dy,
                                       const float2 *stats, double *partial,
                                       int64_t rows, int64_t n,
                                       int64_t rowsPerChunk) {
  __shared__ double pw[8][32], pb[8][32];
  int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  int64_t j = int64_t(blockIdx.x) * 32 + tx;
  int64_t chunk = blockIdx.y;
  int64_t r0 = chunk * rowsPerChunk;
  int64_t r1 = r0 + rowsPerChunk < rows ? r0 + rowsPerChunk : rows;
  double sw = 0, sb = 0;
  if (j < n)
    for (int64_t r = r0 + ty; r < r1; r += 8) {
      float2 st = stats[r];
      float g = toF(dy[r * n + j]);
      float xh = (toF(x[r * n + j]) - st.x) * st.y;
      sw += double(g) * double(xh);
      sb += double(g);
    }
  pw[ty][tx] = sw;
  pb[ty][tx] = sb;
  __syncthreads();
  if (ty == 0 && j < n) {
    double a = 0, c = 0;
    for (int l = 0; l < 8; ++l) {
      a += pw[l][tx];
      c += pb[l][tx];
    }
    partial[(chunk * n + j) * 2] = a;
    partial[(chunk * n + j) * 2 + 1] = c;
  }
}

template <typename T>
__global__ void normParamFinishKernel(const double *partial, T *dw, T *db,
                                      int64_t n, int64_t chunks) {
  DLOPT_GRID_STRIDE(j, n) {
    double a = 0, c = 0;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      a += partial[(ch * n + j) * 2];
      c += partial[(ch * n + j) * 2 + 1];
    }
    dw[j] = fromF<T>(float(a));
    if (db)
      db[j] = fromF<T>(float(c));
  }
}

int64_t normChunks(int64_t rows) {
  int64_t c = (rows + 31) / 32;
  return c < 1 ? 1 : (c > 256 ? 256 : c);
}
int64_t alignUp(int64_t v) { return (v + 255) / 256 * 256; }

//===--- cross_entropy / mse -------------------------------------------------===//

/// Per row: loss and whether it counts (ws[2r], ws[2r+1]).
template <typename T>
__global__ void crossEntropyRowsKernel(const T *logits, const void *labels,
                                       bool labels64, int64_t rows, int64_t c,
                                       int64_t ignore, double *ws,
                                       DeviceError *err, int tag) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    int64_t label = loadId(labels, labels64, r);
    if (label == ignore || label < 0 || label >= c) {
      if (label != ignore && threadIdx.x == 0)
        raise(err, kErrLabelOutOfRange, tag, label, r, c);
      if (threadIdx.x == 0) {
        ws[2 * r] = 0;
        ws[2 * r + 1] = 0;
      }
      continue;
    }
    const T *xr = logits + r * c;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      float v = toF(xr[j]);
      m = v > m ? v : m; // std::max: a NaN never becomes the max
    }
    m = blockReduce(m, MaxF{});
    double s = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
      s += double(expf(toF(xr[j]) - m));
    s = blockReduce(s, SumD{});
    if (threadIdx.x == 0) {
      ws[2 * r] = double(m) + ::log(s) - double(toF(xr[label]));
      ws[2 * r + 1] = 1;
    }
  }
}

/// One block: sums ws[2r] and ws[2r+1] in a fixed order.
__global__ void sumPairsKernel(const double *ws, int64_t rows, double *out) {
  double a = 0, b = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    a += ws[2 * r];
    b += ws[2 * r + 1];
  }
  a = blockReduce(a, SumD{});
  b = blockReduce(b, SumD{});
  if (threadIdx.x == 0) {
    out[0] = a;
    out[1] = b;
  }
}

/// The loss in the result's type L (the logits' or f32).
template <typename L>
__global__ void crossEntropyFinishKernel(const double *sums, L *loss) {
  double count = sums[1];
  loss[0] = fromF<L>(count > 0 ? float(sums[0] / count) : 0.0f);
}

/// dloss has type D (the logits' or f32).
template <typename T, typename D>
__global__ void crossEntropyGradRowsKernel(const T *logits, const void *labels,
                                           bool labels64, const D *dloss,
                                           const double *sums, T *dlogits,
                                           int64_t rows, int64_t c,
                                           int64_t ignore, DeviceError *err,
                                           int tag) {
  double count = sums[1];
  float scale = count > 0 ? float(double(toF(dloss[0])) / count) : 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    int64_t label = loadId(labels, labels64, r);
    T *out = dlogits + r * c;
    if (label == ignore || label < 0 || label >= c) {
      if (label != ignore && threadIdx.x == 0)
        raise(err, kErrLabelOutOfRange, tag, label, r, c);
      for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
        out[j] = fromF<T>(0.0f);
      continue;
    }
    const T *xr = logits + r * c;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      float v = toF(xr[j]);
      m = v > m ? v : m;
    }
    m = blockReduce(m, MaxF{});
    double s = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
      s += double(expf(toF(xr[j]) - m));
    float inv = float(1.0 / blockReduce(s, SumD{}));
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      float p = expf(toF(xr[j]) - m) * inv;
      if (j == label)
        p -= 1.0f;
      out[j] = fromF<T>(p * scale);
    }
  }
}

/// Marks each row's count for cross_entropy_grad (ws[2r+1]).
__global__ void countRowsKernel(const void *labels, bool labels64,
                                int64_t rows, int64_t c, int64_t ignore,
                                double *ws) {
  DLOPT_GRID_STRIDE(r, rows) {
    int64_t label = loadId(labels, labels64, r);
    ws[2 * r] = 0;
    ws[2 * r + 1] = label != ignore && label >= 0 && label < c ? 1 : 0;
  }
}

constexpr int kMseBlocks = 1024;

template <typename T>
__global__ void msePartialKernel(const T *a, const T *b, int64_t n,
                                 double *partial) {
  double s = 0;
  DLOPT_GRID_STRIDE(i, n) {
    double d = double(toF(a[i])) - double(toF(b[i]));
    s += d * d;
  }
  s = blockReduce(s, SumD{});
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = s;
    partial[2 * blockIdx.x + 1] = 0;
  }
}

template <typename T>
__global__ void mseFinishKernel(const double *sums, int64_t n, T *out) {
  out[0] = fromF<T>(n ? float(sums[0] / double(n)) : __int_as_float(0x7FC00000));
}

unsigned rowGrid(int64_t rows) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(rows, 65535 * 8)));
}

} // namespace

//===----------------------------------------------------------------------===//
// Launchers
//===----------------------------------------------------------------------===//

int gather(Stream s, const void *table, const void *ids, DType idType,
           int64_t n, int64_t v, int64_t rowBytes, void *out, DeviceError *err,
           int tag) {
  if (n == 0 || rowBytes == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  auto addr = reinterpret_cast<uintptr_t>(table) |
              reinterpret_cast<uintptr_t>(out);
  int w = 16;
  while (w > 1 && (rowBytes % w != 0 || addr % w != 0))
    w /= 2;
  bool is64 = idType == DType::I64;
  int64_t words = rowBytes / w;
  auto launch = [&](auto tagW) {
    using W = decltype(tagW);
    gatherKernel<W><<<gridFor(n * words), kThreads, 0, st>>>(
        static_cast<const W *>(table), ids, is64, n, v, words,
        static_cast<W *>(out), err, tag);
    return lastError();
  };
  switch (w) {
  case 16: return launch(uint4{});
  case 8: return launch(uint2{});
  case 4: return launch(uint32_t{});
  case 2: return launch(uint16_t{});
  default: return launch(uint8_t{});
  }
}

int64_t scatterAddWorkspaceBytes(DType t, int64_t v, int64_t rest) {
  return t == DType::F32 ? 0 : v * rest * int64_t(sizeof(float));
}

int scatterAdd(Stream s, DType t, const void *ids, DType idType,
               const void *updates, void *out, int64_t n, int64_t v,
               int64_t rest, float *ws, DeviceError *err, int tag) {
  auto st = static_cast<cudaStream_t>(s);
  int64_t total = v * rest;
  if (total == 0)
    return 0;
  float *acc = t == DType::F32 ? static_cast<float *>(out) : ws;
  cudaError_t e = cudaMemsetAsync(acc, 0, size_t(total) * sizeof(float), st);
  if (e != cudaSuccess)
    return int(e);
  if (n > 0) {
    int64_t colBlocks = (rest + kThreads - 1) / kThreads;
    int64_t buckets = std::max<int64_t>(1, (int64_t(1) << 16) / (colBlocks * kThreads));
    buckets = std::min<int64_t>({buckets, v, 65535});
    int64_t bucket = (v + buckets - 1) / buckets;
    buckets = (v + bucket - 1) / bucket;
    dim3 grid{unsigned(colBlocks), unsigned(buckets)};
    int rc = dispatchFloat(t, [&](auto ttag) {
      using T = decltype(ttag);
      scatterAddKernel<T><<<grid, kThreads, 0, st>>>(
          ids, idType == DType::I64, static_cast<const T *>(updates), acc, n,
          v, rest, bucket, err, tag);
      return lastError();
    });
    if (rc)
      return rc;
  }
  if (t == DType::F32)
    return 0;
  return dispatchFloat(t, [&](auto ttag) {
    using T = decltype(ttag);
    storeF32Kernel<T><<<gridFor(total), kThreads, 0, st>>>(
        acc, static_cast<T *>(out), total);
    return lastError();
  });
}

namespace {
bool innerKept(const ReducePlan &p) {
  return p.keptRank > 0 && p.keptStride[p.keptRank - 1] == 1;
}
} // namespace

ReduceSplit reduceSplit(const ReducePlan &p) {
  // Blocks without splitting: one per output (reduced dims innermost) or
  // per 32 outputs. Fewer than ~8 per multiprocessor leaves the GPU idle
  // (a gradient norm's sum of a whole weight ran on one block), so the
  // reduced range is cut into chunks of at least `minChunk` elements, each
  // its own block; the chunk partials are combined in order by a second
  // kernel. The cut depends on the shapes only: results repeat run to run.
  constexpr int64_t kTargetBlocks = 1024;
  int64_t blocks = innerKept(p) ? (p.numOut + 31) / 32 : p.numOut;
  int64_t minChunk = innerKept(p) ? 256 : 4096;
  ReduceSplit r{1, std::max<int64_t>(p.numRed, 1)};
  if (blocks >= kTargetBlocks || p.numRed < 2 * minChunk)
    return r;
  int64_t chunks = std::min<int64_t>(
      {(kTargetBlocks + blocks - 1) / blocks, p.numRed / minChunk, 65535});
  r.chunk = (p.numRed + chunks - 1) / chunks;
  r.chunks = (p.numRed + r.chunk - 1) / r.chunk;
  return r;
}

int64_t reduceWorkspaceBytes(const ReducePlan &p) {
  ReduceSplit r = reduceSplit(p);
  return r.chunks > 1 ? r.chunks * p.numOut * 8 : 0;
}

int reduce(Stream s, ReduceKind k, DType t, const ReducePlan &p,
           const void *x, void *y, void *ws) {
  if (p.numOut == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  ReduceSplit split = reduceSplit(p);
  if (split.chunks > 1 && !ws)
    return int(cudaErrorInvalidValue);
  auto launch = [&](auto ttag, auto kind) {
    using T = decltype(ttag);
    constexpr ReduceKind K = decltype(kind)::value;
    using A = typename Red<T, K>::A;
    static_assert(sizeof(A) <= 8, "reduceWorkspaceBytes assumes 8-byte partials");
    A *part = split.chunks > 1 ? static_cast<A *>(ws) : nullptr;
    if (innerKept(p)) {
      dim3 grid{unsigned(std::min<int64_t>((p.numOut + 31) / 32, int64_t(65535) * 8)),
                unsigned(split.chunks)};
      reduceColsKernel<T, K><<<grid, kThreads, 0, st>>>(
          p, split.chunk, static_cast<const T *>(x), static_cast<T *>(y), part);
    } else {
      dim3 grid{rowGrid(p.numOut), unsigned(split.chunks)};
      reduceRowsKernel<T, K><<<grid, kThreads, 0, st>>>(
          p, split.chunk, static_cast<const T *>(x), static_cast<T *>(y), part);
    }
    if (part)
      reduceFinishKernel<T, K><<<gridFor(p.numOut), kThreads, 0, st>>>(
          p.numOut, split.chunks, p.numRed, part, static_cast<T *>(y));
    return lastError();
  };
  using SumK = std::integral_constant<ReduceKind, ReduceKind::Sum>;
  using MeanK = std::integral_constant<ReduceKind, ReduceKind::Mean>;
  using MaxK = std::integral_constant<ReduceKind, ReduceKind::Max>;
  switch (k) {
  case ReduceKind::Sum:
    return dispatchNumeric(t, [&](auto tt) { return launch(tt, SumK{}); });
  case ReduceKind::Mean:
    return dispatchFloat(t, [&](auto tt) { return launch(tt, MeanK{}); });
  case ReduceKind::Max:
    return dispatchNumeric(t, [&](auto tt) { return launch(tt, MaxK{}); });
  }
  return int(cudaErrorInvalidValue);
}

int softmax(Stream s, bool log, DType t, const void *x, void *y,
            int64_t outer, int64_t n, int64_t inner) {
  auto st = static_cast<cudaStream_t>(s);
  return dispatchFloat(t, [&](auto ttag) {
    using T = decltype(ttag);
    if (inner == 1)
      softmaxRowsKernel<T><<<rowGrid(outer), kThreads, 0, st>>>(
          log, static_cast<const T *>(x), static_cast<T *>(y), outer, n);
    else
      softmaxColsKernel<T><<<gridFor(outer * inner), kThreads, 0, st>>>(
          log, static_cast<const T *>(x), static_cast<T *>(y), outer, n,
          inner);
    return lastError();
  });
}

int softmaxGrad(Stream s, bool log, DType t, const void *y, const void *dy,
                void *dx, int64_t outer, int64_t n, int64_t inner) {
  auto st = static_cast<cudaStream_t>(s);
  return dispatchFloat(t, [&](auto ttag) {
    using T = decltype(ttag);
    if (inner == 1)
      softmaxGradRowsKernel<T><<<rowGrid(outer), kThreads, 0, st>>>(
          log, static_cast<const T *>(y), static_cast<const T *>(dy),
          static_cast<T *>(dx), outer, n);
    else
      softmaxGradColsKernel<T><<<gridFor(outer * inner), kThreads, 0, st>>>(
          log, static_cast<const T *>(y), static_cast<const T *>(dy),
          static_cast<T *>(dx), outer, n, inner);
    return lastError();
  });
}

int norm(Stream s, bool rms, DType t, const void *x, const void *w,
         const void *b, void *y, int64_t rows, int64_t n, double eps) {
  if (rows == 0 || n == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchFloat(t, [&](auto ttag) {
    using T = decltype(ttag);
    normKernel<T><<<rowGrid(rows), kThreads, 0, st>>>(
        rms, static_cast<const T *>(x), static_cast<const T *>(w),
        static_cast<const T *>(b), static_cast<T *>(y), rows, n, eps);
    return lastError();
  });
}

int64_t normGradWorkspaceBytes(int64_t rows, int64_t n) {
  return alignUp(rows * int64_t(sizeof(float2))) +
         normChunks(rows) * n * 2 * int64_t(sizeof(double));
}

int normGrad(Stream s, bool rms, DType t, const void *x, const void *dy,
             const void *w, void *dx, void *dw, void *db, int64_t rows,
             int64_t n, double eps, float *ws) {
  if (n == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  auto *stats = reinterpret_cast<float2 *>(ws);
  auto *partial = reinterpret_cast<double *>(
      reinterpret_cast<char *>(ws) + alignUp(rows * int64_t(sizeof(float2))));
  int64_t chunks = normChunks(rows);
  int64_t rowsPerChunk = (rows + chunks - 1) / chunks;
  return dispatchFloat(t, [&](auto ttag) {
    using T = decltype(ttag);
    const T *tx = static_cast<const T *>(x), *tdy = static_cast<const T *>(dy);
    if (rows > 0)
      normGradRowsKernel<T><<<rowGrid(rows), kThreads, 0, st>>>(
          rms, tx, tdy, static_cast<const T *>(w), static_cast<T *>(dx), stats,
          rows, n, eps);
    dim3 grid{unsigned((n + 31) / 32), unsigned(chunks)};
    normParamPartialKernel<T><<<grid, kThreads, 0, st>>>(
        tx, tdy, stats, partial, rows, n, std::max<int64_t>(rowsPerChunk, 1));
    normParamFinishKernel<T><<<gridFor(n), kThreads, 0, st>>>(
        partial, static_cast<T *>(dw), static_cast<T *>(db), n, chunks);
    return lastError();
  });
}

int64_t lossWorkspaceBytes(int64_t rows) {
  return (std::max<int64_t>(rows, kMseBlocks) + 1) * 2 *
         int64_t(sizeof(double));
}

int crossEntropy(Stream s, DType t, const void *logits, const void *labels,
                 DType labelType, void *loss, DType lossType, int64_t n,
                 int64_t c, int64_t ignoreIndex, float *ws, DeviceError *err,
                 int tag) {
  auto st = static_cast<cudaStream_t>(s);
  auto *rowsWs = reinterpret_cast<double *>(ws);
  double *sums = rowsWs + 2 * std::max<int64_t>(n, kMseBlocks);
  bool l64 = labelType == DType::I64;
  return dispatchFloat(t, [&](auto ttag) {
    using T = decltype(ttag);
    if (n > 0)
      crossEntropyRowsKernel<T><<<rowGrid(n), kThreads, 0, st>>>(
          static_cast<const T *>(logits), labels, l64, n, c, ignoreIndex,
          rowsWs, err, tag);
    sumPairsKernel<<<1, kThreads, 0, st>>>(rowsWs, n, sums);
    if (lossType == DType::F32)
      crossEntropyFinishKernel<float>
          <<<1, 1, 0, st>>>(sums, static_cast<float *>(loss));
    else
      crossEntropyFinishKernel<T><<<1, 1, 0, st>>>(sums, static_cast<T *>(loss));
    return lastError();
  });
}

int crossEntropyGrad(Stream s, DType t, const void *logits,
                     const void *labels, DType labelType, const void *dloss,
                     DType dlossType, void *dlogits, int64_t n, int64_t c,
                     int64_t ignoreIndex, float *ws, DeviceError *err, int tag) {
  auto st = static_cast<cudaStream_t>(s);
  auto *rowsWs = reinterpret_cast<double *>(ws);
  double *sums = rowsWs + 2 * std::max<int64_t>(n, kMseBlocks);
  bool l64 = labelType == DType::I64;
  return dispatchFloat(t, [&](auto ttag) {
    using T = decltype(ttag);
    if (n > 0)
      countRowsKernel<<<gridFor(n), kThreads, 0, st>>>(labels, l64, n, c,
                                                       ignoreIndex, rowsWs);
    sumPairsKernel<<<1, kThreads, 0, st>>>(rowsWs, n, sums);
    if (n > 0 && dlossType == DType::F32)
      crossEntropyGradRowsKernel<T, float><<<rowGrid(n), kThreads, 0, st>>>(
          static_cast<const T *>(logits), labels, l64,
          static_cast<const float *>(dloss), sums, static_cast<T *>(dlogits),
          n, c, ignoreIndex, err, tag);
    else if (n > 0)
      crossEntropyGradRowsKernel<T, T><<<rowGrid(n), kThreads, 0, st>>>(
          static_cast<const T *>(logits), labels, l64,
          static_cast<const T *>(dloss), sums, static_cast<T *>(dlogits), n, c,
          ignoreIndex, err, tag);
    return lastError();
  });
}

int mse(Stream s, DType t, const void *a, const void *b, void *out, int64_t n,
        float *ws) {
  auto st = static_cast<cudaStream_t>(s);
  auto *partial = reinterpret_cast<double *>(ws);
  double *sums = partial + 2 * kMseBlocks;
  // The grid depends only on n, so the summation order does too.
  unsigned blocks = unsigned(std::min<int64_t>(
      kMseBlocks, std::max<int64_t>(1, (n + kThreads * 4 - 1) / (kThreads * 4))));
  return dispatchFloat(t, [&](auto ttag) {
    using T = decltype(ttag);
    msePartialKernel<T><<<blocks, kThreads, 0, st>>>(
        static_cast<const T *>(a), static_cast<const T *>(b), n, partial);
    sumPairsKernel<<<1, kThreads, 0, st>>>(partial, int64_t(blocks), sums);
    mseFinishKernel<T><<<1, 1, 0, st>>>(sums, n, static_cast<T *>(out));
    return lastError();
  });
}

} // namespace dlopt::rt::cuda::kernels
