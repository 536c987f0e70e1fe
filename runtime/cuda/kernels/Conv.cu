//===- Conv.cu - conv2d, pooling, batch_norm and their gradients ----------===//
//
// Straightforward kernels with the semantics of runtime/cpu/Conv.cpp,
// runtime/cpu/NN.cpp (batch_norm) and runtime/cpu/Grad.cpp
// (batch_norm_grad); layouts NCHW / [N, C, ...], 16-bit tensors are read
// into f32 and rounded once on store.
//
// - conv2d: direct convolution, one thread per output element, f32
//   accumulation over (ci, ky, kx). The CPU runs im2col + GEMM, so results
//   agree within rounding (the conformance tolerances), not bit for bit.
// - conv2d_grad_input: one thread per input element gathers every
//   (o, ky, kx) tap that read it (a transposed convolution without atomics).
// - conv2d_grad_filter: one block per filter element reduces over
//   (n, oy, ox): per-thread f32 partials, then a fixed f64 block tree.
// - pooling: one thread per output element; avg sums in f64 in the CPU's
//   order, so the forward results are the CPU's bits. The gradients run one
//   thread per input pixel that walks the windows covering it in the
//   row-major order of the output positions and adds in f32, which is the
//   order the CPU's per-plane accumulation adds in: the same bits too.
// - batch_norm(_grad): one block per channel, statistics and gradient sums
//   in f64 (block trees: the sum order differs from the CPU's sequential
//   one by f64 rounding only); the per-element math uses the CPU's f32
//   operations without FMA contraction.
//
// Every reduction has a fixed shape (no floating-point atomics), so results
// repeat run to run. Status: compiled (CUDA 13, sm_80/sm_90), never run on a
// GPU.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/kernels/Common.cuh"

#include <algorithm>

namespace dlopt::rt::cuda::kernels {
namespace {

/// Blocks for a loop of one block per item.
unsigned blocksFor(int64_t items) {
  return unsigned(std::clamp<int64_t>(items, 1, int64_t(1) << 20));
}

//===--- conv2d ------------------------------------------------------------===//

template <typename T>
__global__ void conv2dKernel(ConvDims d, const T *__restrict__ x,
                             const T *__restrict__ w,
                             const T *__restrict__ bias, T *__restrict__ y) {
  int64_t total = d.n * d.o * d.oh * d.ow;
  int64_t og = d.o / d.groups, taps = d.kh * d.kw;
  DLOPT_GRID_STRIDE(i, total) {
    int64_t ox = i % d.ow, r = i / d.ow;
    int64_t oy = r % d.oh;
    r /= d.oh;
    int64_t oc = r % d.o, ni = r / d.o;
    int64_t g = oc / og;
    const T *xg = x + (ni * d.c + g * d.cg) * d.h * d.w;
    const T *wo = w + oc * d.cg * taps;
    int64_t y0 = oy * d.strideH - d.padH, x0 = ox * d.strideW - d.padW;
    float acc = 0.0f;
    for (int64_t ci = 0; ci < d.cg; ++ci) {
      const T *xc = xg + ci * d.h * d.w;
      const T *wc = wo + ci * taps;
      for (int64_t ky = 0; ky < d.kh; ++ky) {
        int64_t iy = y0 + ky * d.dilH;
        if (iy < 0 || iy >= d.h)
          continue;
        const T *xr = xc + iy * d.w;
        const T *wr = wc + ky * d.kw;
        for (int64_t kx = 0; kx < d.kw; ++kx) {
          int64_t ix = x0 + kx * d.dilW;
          if (ix >= 0 && ix < d.w)
            acc = fmaf(toF(xr[ix]), toF(wr[kx]), acc);
        }
      }
    }
    if (bias)
      acc = __fadd_rn(acc, toF(bias[oc]));
    y[i] = fromF<T>(acc);
  }
}

template <typename T>
__global__ void conv2dGradInputKernel(ConvDims d, const T *__restrict__ dy,
                                      const T *__restrict__ w,
                                      T *__restrict__ dx) {
  int64_t total = d.n * d.c * d.h * d.w;
  int64_t og = d.o / d.groups, taps = d.kh * d.kw;
  DLOPT_GRID_STRIDE(i, total) {
    int64_t ix = i % d.w, r = i / d.w;
    int64_t iy = r % d.h;
    r /= d.h;
    int64_t ch = r % d.c, ni = r / d.c;
    int64_t g = ch / d.cg, ci = ch % d.cg;
    float acc = 0.0f;
    for (int64_t oc = g * og; oc < (g + 1) * og; ++oc) {
      const T *wk = w + (oc * d.cg + ci) * taps;
      const T *dyp = dy + (ni * d.o + oc) * d.oh * d.ow;
      for (int64_t ky = 0; ky < d.kh; ++ky) {
        int64_t ty = iy + d.padH - ky * d.dilH;
        if (ty < 0 || ty % d.strideH != 0)
          continue;
        int64_t oy = ty / d.strideH;
        if (oy >= d.oh)
          continue;
        for (int64_t kx = 0; kx < d.kw; ++kx) {
          int64_t tx = ix + d.padW - kx * d.dilW;
          if (tx < 0 || tx % d.strideW != 0)
            continue;
          int64_t ox = tx / d.strideW;
          if (ox < d.ow)
            acc = fmaf(toF(dyp[oy * d.ow + ox]), toF(wk[ky * d.kw + kx]), acc);
        }
      }
    }
    dx[i] = fromF<T>(acc);
  }
}

template <typename T>
__global__ void conv2dGradFilterKernel(ConvDims d, const T *__restrict__ x,
                                       const T *__restrict__ dy,
                                       T *__restrict__ dw) {
  int64_t total = d.o * d.cg * d.kh * d.kw;
  int64_t og = d.o / d.groups, m = d.n * d.oh * d.ow;
  for (int64_t wi = blockIdx.x; wi < total; wi += gridDim.x) {
    int64_t kx = wi % d.kw, r = wi / d.kw;
    int64_t ky = r % d.kh;
    r /= d.kh;
    int64_t ci = r % d.cg, oc = r / d.cg;
    int64_t ch = (oc / og) * d.cg + ci;
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
      int64_t ox = j % d.ow, rr = j / d.ow;
      int64_t oy = rr % d.oh, ni = rr / d.oh;
      int64_t iy = oy * d.strideH - d.padH + ky * d.dilH;
      int64_t ix = ox * d.strideW - d.padW + kx * d.dilW;
      if (iy < 0 || iy >= d.h || ix < 0 || ix >= d.w)
        continue;
      acc = fmaf(toF(dy[((ni * d.o + oc) * d.oh + oy) * d.ow + ox]),
                 toF(x[((ni * d.c + ch) * d.h + iy) * d.w + ix]), acc);
    }
    double sum = blockSum(double(acc));
    if (threadIdx.x == 0)
      dw[wi] = fromF<T>(float(sum));
  }
}

//===--- Pooling -----------------------------------------------------------===//

/// The clamped window [ya, yb) x [xa, xb) of output position (oy, ox).
struct Window {
  int64_t ya, yb, xa, xb;
};
__device__ __forceinline__ Window windowOf(const PoolDims &d, int64_t oy,
                                           int64_t ox) {
  int64_t y0 = oy * d.strideH - d.padH, x0 = ox * d.strideW - d.padW;
  return Window{y0 > 0 ? y0 : 0, y0 + d.kh < d.h ? y0 + d.kh : d.h,
                x0 > 0 ? x0 : 0, x0 + d.kw < d.w ? x0 + d.kw : d.w};
}

/// Divisor of avg pooling for a window (0: the window is all padding).
__device__ __forceinline__ int64_t avgCount(const PoolDims &d,
                                            const Window &win) {
  if (d.countIncludePad)
    return d.kh * d.kw;
  int64_t hy = win.yb - win.ya, hx = win.xb - win.xa;
  return (hy > 0 ? hy : 0) * (hx > 0 ? hx : 0);
}

template <typename T>
__global__ void pool2dKernel(bool isMax, PoolDims d, const T *__restrict__ x,
                             T *__restrict__ y) {
  int64_t total = d.planes * d.oh * d.ow;
  DLOPT_GRID_STRIDE(i, total) {
    int64_t ox = i % d.ow, r = i / d.ow;
    int64_t oy = r % d.oh, pl = r / d.oh;
    const T *xp = x + pl * d.h * d.w;
    Window win = windowOf(d, oy, ox);
    float res;
    if (isMax) {
      // Padding is -inf, so only real pixels matter; NaN wins.
      res = -INFINITY;
      for (int64_t iy = win.ya; iy < win.yb; ++iy)
        for (int64_t ix = win.xa; ix < win.xb; ++ix) {
          float v = toF(xp[iy * d.w + ix]);
          if (res == res && (v != v || v > res))
            res = v;
        }
    } else {
      double s = 0;
      for (int64_t iy = win.ya; iy < win.yb; ++iy)
        for (int64_t ix = win.xa; ix < win.xb; ++ix)
          s = __dadd_rn(s, double(toF(xp[iy * d.w + ix])));
      int64_t cnt = avgCount(d, win);
      res = cnt > 0 ? float(s / double(cnt)) : 0.0f;
    }
    y[i] = fromF<T>(res);
  }
}

template <typename T>
__global__ void pool2dGradKernel(bool isMax, PoolDims d,
                                 const T *__restrict__ x,
                                 const T *__restrict__ dy,
                                 T *__restrict__ dx) {
  int64_t total = d.planes * d.h * d.w;
  DLOPT_GRID_STRIDE(i, total) {
    int64_t ix = i % d.w, r = i / d.w;
    int64_t iy = r % d.h, pl = r / d.h;
    int64_t self = iy * d.w + ix;
    const T *xp = isMax ? x + pl * d.h * d.w : nullptr;
    const T *dyp = dy + pl * d.oh * d.ow;
    // Output positions whose window covers (iy, ix):
    // oy * s - p <= iy <= oy * s - p + k - 1.
    int64_t ty = iy + d.padH - d.kh + 1, tx = ix + d.padW - d.kw + 1;
    int64_t oyLo = ty <= 0 ? 0 : (ty + d.strideH - 1) / d.strideH;
    int64_t oxLo = tx <= 0 ? 0 : (tx + d.strideW - 1) / d.strideW;
    int64_t oyHi = (iy + d.padH) / d.strideH, oxHi = (ix + d.padW) / d.strideW;
    if (oyHi > d.oh - 1)
      oyHi = d.oh - 1;
    if (oxHi > d.ow - 1)
      oxHi = d.ow - 1;
    float acc = 0.0f;
    for (int64_t oy = oyLo; oy <= oyHi; ++oy)
      for (int64_t ox = oxLo; ox <= oxHi; ++ox) {
        Window win = windowOf(d, oy, ox);
        float g = toF(dyp[oy * d.ow + ox]);
        if (isMax) {
          // The window's first maximum in row-major order (the forward's
          // NaN rule); the gradient goes there only.
          int64_t best = -1;
          float m = 0.0f;
          for (int64_t yy = win.ya; yy < win.yb; ++yy)
            for (int64_t xx = win.xa; xx < win.xb; ++xx) {
              float v = toF(xp[yy * d.w + xx]);
              if (best < 0 || (m == m && (v != v || v > m))) {
                m = v;
                best = yy * d.w + xx;
              }
            }
          if (best == self)
            acc = __fadd_rn(acc, g);
        } else {
          int64_t cnt = avgCount(d, win);
          if (cnt == 0)
            continue;
          acc = __fadd_rn(acc, float(double(g) / double(cnt)));
        }
      }
    dx[i] = fromF<T>(acc);
  }
}

//===--- batch_norm ----------------------------------------------------------===//

constexpr int kBnThreads = 512;

/// Batch mean and biased variance of channel ch (two passes, f64).
template <typename T>
__device__ void channelStats(const T *__restrict__ x, int64_t n, int64_t c,
                             int64_t inner, int64_t ch, double &mean,
                             double &ss) {
  int64_t count = n * inner;
  double s = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x)
    s = __dadd_rn(s, double(toF(x[((j / inner) * c + ch) * inner + j % inner])));
  mean = blockSum(s) / double(count);
  double q = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    double dv = double(toF(x[((j / inner) * c + ch) * inner + j % inner])) - mean;
    q = __dadd_rn(q, __dmul_rn(dv, dv));
  }
  ss = blockSum(q);
}

template <typename T>
__global__ void batchNormKernel(const T *x, const T *w, const T *b,
                                const T *rm, const T *rv, T *y, T *rmOut,
                                T *rvOut, int64_t n, int64_t c, int64_t inner,
                                double eps, double momentum, bool training) {
  int64_t count = n * inner;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    // Every per-channel input is read before any thread writes (the
    // running statistics may be updated in place).
    float wv = toF(w[ch]), bv = toF(b[ch]);
    float rmv = toF(rm[ch]), rvv = toF(rv[ch]);
    double mean, var;
    if (training) {
      double ss;
      channelStats(x, n, c, inner, ch, mean, ss);
      var = ss / double(count);
      double unbiased = ss / double(count - 1);
      if (threadIdx.x == 0) {
        rmOut[ch] = fromF<T>(float(
            __dadd_rn((1.0 - momentum) * double(rmv), momentum * mean)));
        rvOut[ch] = fromF<T>(float(
            __dadd_rn((1.0 - momentum) * double(rvv), momentum * unbiased)));
      }
    } else {
      mean = double(rmv);
      var = double(rvv);
      __syncthreads();
      if (threadIdx.x == 0) {
        rmOut[ch] = rm[ch];
        rvOut[ch] = rv[ch];
      }
    }
    // y = x * a + bb with a, bb folded per channel (f64), as on the CPU.
    double a = double(wv) / sqrt(var + eps);
    float af = float(a), bf = float(__dsub_rn(double(bv), __dmul_rn(mean, a)));
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
      int64_t at = ((j / inner) * c + ch) * inner + j % inner;
      y[at] = fromF<T>(__fadd_rn(__fmul_rn(toF(x[at]), af), bf));
    }
  }
}

template <typename T>
__global__ void batchNormGradKernel(const T *x, const T *w, const T *rm,
                                    const T *rv, const T *dy, T *dx, T *dw,
                                    T *db, int64_t n, int64_t c, int64_t inner,
                                    double eps, bool training) {
  int64_t count = n * inner;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    float wv = toF(w[ch]);
    double mean = 0, var = 0;
    if (training) {
      if (count > 0) {
        double ss;
        channelStats(x, n, c, inner, ch, mean, ss);
        var = ss / double(count);
      }
    } else {
      mean = double(toF(rm[ch]));
      var = double(toF(rv[ch]));
    }
    float rs = float(1.0 / sqrt(var + eps)), mu = float(mean);
    double sdy = 0, sdyx = 0;
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
      int64_t at = ((j / inner) * c + ch) * inner + j % inner;
      float g = toF(dy[at]);
      float xh = __fmul_rn(__fsub_rn(toF(x[at]), mu), rs);
      sdy = __dadd_rn(sdy, double(g));
      sdyx = __dadd_rn(sdyx, __dmul_rn(double(g), double(xh)));
    }
    sdy = blockSum(sdy);
    sdyx = blockSum(sdyx);
    float a = __fmul_rn(wv, rs);
    float mdy = count ? float(sdy / double(count)) : 0.0f;
    float mdyx = count ? float(sdyx / double(count)) : 0.0f;
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
      int64_t at = ((j / inner) * c + ch) * inner + j % inner;
      float g = toF(dy[at]);
      float r;
      if (training) {
        float xh = __fmul_rn(__fsub_rn(toF(x[at]), mu), rs);
        r = __fmul_rn(a, __fsub_rn(__fsub_rn(g, mdy), __fmul_rn(xh, mdyx)));
      } else {
        r = __fmul_rn(a, g);
      }
      dx[at] = fromF<T>(r);
    }
    if (threadIdx.x == 0) {
      dw[ch] = fromF<T>(float(sdyx));
      db[ch] = fromF<T>(float(sdy));
    }
  }
}

} // namespace

int conv2d(Stream s, DType t, const ConvDims &d, const void *x,
           const void *w, const void *bias, void *y) {
  int64_t total = d.n * d.o * d.oh * d.ow;
  if (total == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    conv2dKernel<T><<<gridFor(total), kThreads, 0, st>>>(
        d, static_cast<const T *>(x), static_cast<const T *>(w),
        static_cast<const T *>(bias), static_cast<T *>(y));
    return lastError();
  });
}

int conv2dGradInput(Stream s, DType t, const ConvDims &d, const void *dy,
                    const void *w, void *dx) {
  int64_t total = d.n * d.c * d.h * d.w;
  if (total == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    conv2dGradInputKernel<T><<<gridFor(total), kThreads, 0, st>>>(
        d, static_cast<const T *>(dy), static_cast<const T *>(w),
        static_cast<T *>(dx));
    return lastError();
  });
}

int conv2dGradFilter(Stream s, DType t, const ConvDims &d, const void *x,
                     const void *dy, void *dw) {
  int64_t total = d.o * d.cg * d.kh * d.kw;
  if (total == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    conv2dGradFilterKernel<T><<<blocksFor(total), kThreads, 0, st>>>(
        d, static_cast<const T *>(x), static_cast<const T *>(dy),
        static_cast<T *>(dw));
    return lastError();
  });
}

int pool2d(Stream s, bool isMax, DType t, const PoolDims &d, const void *x,
           void *y) {
  int64_t total = d.planes * d.oh * d.ow;
  if (total == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    pool2dKernel<T><<<gridFor(total), kThreads, 0, st>>>(
        isMax, d, static_cast<const T *>(x), static_cast<T *>(y));
    return lastError();
  });
}

int pool2dGrad(Stream s, bool isMax, DType t, const PoolDims &d,
               const void *x, const void *dy, void *dx) {
  int64_t total = d.planes * d.h * d.w;
  if (total == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    pool2dGradKernel<T><<<gridFor(total), kThreads, 0, st>>>(
        isMax, d, static_cast<const T *>(x), static_cast<const T *>(dy),
        static_cast<T *>(dx));
    return lastError();
  });
}

int batchNorm(Stream s, DType t, const void *x, const void *w,
              const void *b, const void *rm, const void *rv, void *y,
              void *rmOut, void *rvOut, int64_t n, int64_t c, int64_t inner,
              double eps, double momentum, bool training) {
  if (c == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    batchNormKernel<T><<<blocksFor(c), kBnThreads, 0, st>>>(
        static_cast<const T *>(x), static_cast<const T *>(w),
        static_cast<const T *>(b), static_cast<const T *>(rm),
        static_cast<const T *>(rv), static_cast<T *>(y),
        static_cast<T *>(rmOut), static_cast<T *>(rvOut), n, c, inner, eps,
        momentum, training);
    return lastError();
  });
}

int batchNormGrad(Stream s, DType t, const void *x, const void *w,
                  const void *rm, const void *rv, const void *dy, void *dx,
                  void *dw, void *db, int64_t n, int64_t c, int64_t inner,
                  double eps, bool training) {
  if (c == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    batchNormGradKernel<T><<<blocksFor(c), kBnThreads, 0, st>>>(
        static_cast<const T *>(x), static_cast<const T *>(w),
        static_cast<const T *>(rm), static_cast<const T *>(rv),
        static_cast<const T *>(dy), static_cast<T *>(dx),
        static_cast<T *>(dw), static_cast<T *>(db), n, c, inner, eps,
        training);
    return lastError();
  });
}

} // namespace dlopt::rt::cuda::kernels
