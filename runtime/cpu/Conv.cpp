//===- Conv.cpp - conv2d, pooling and their gradients ---------------------===//
//
// Where dlopt is built with oneDNN, conv2d and its gradients first try
// oneDNN's direct convolutions (DnnlConv.h: 1.2-2.8x faster on the shapes
// of dlopt-bench-cpu-conv); what follows is the fallback, and the path
// under DLOPT_CONV=im2col.
//
// conv2d lowers each (image, group) to one GEMM per chunk of output rows:
// W_g [O/groups, Cg*KH*KW] x col [Cg*KH*KW, rows*OW], written straight into
// the NCHW output through ldc. 1x1 convolutions with unit stride and no
// padding skip im2col since the input already is the column matrix. When
// several images' column matrices fit in 1 MiB (imagesPerChunkOf), their
// planes sit side by side in one column matrix and one GEMM covers them all
// (results copied between [O, images*plane] and NCHW): small planes would
// otherwise give GEMMs a few pixels wide.
// The gradients reuse that geometry: conv2d_grad_input is col = W_g^T dy_g
// then col2im (scatter-add, split by input channel); conv2d_grad_filter is
// dW_g += dy_g col^T over images and row chunks in a fixed order; the pool
// gradients scatter each window's gradient within its plane.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/DnnlConv.h"
#include "runtime/cpu/KernelUtil.h"
#include "runtime/cpu/ThreadPool.h"
#include "runtime/cpu/VecMath.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace dlopt::rt::cpu {
namespace {

/// Output rows per GEMM so the column buffer stays around 32 MB.
int64_t rowsPerChunkOf(const ConvGeom &g) {
  return std::clamp<int64_t>((int64_t(1) << 23) /
                                 std::max<int64_t>(g.ckk() * g.ow, 1),
                             1, std::max<int64_t>(g.oh, 1));
}

/// The output columns xx in [xa, xb) whose input column off + xx * stride
/// lies inside [0, W); the others read padding.
void validColumns(const ConvGeom &g, int64_t off, int64_t &xa, int64_t &xb) {
  const int64_t st = g.stride[1];
  xa = off >= 0 ? 0 : (-off + st - 1) / st;
  xb = g.w - off <= 0 ? 0 : (g.w - off + st - 1) / st;
  xb = std::min(xb, g.ow);
  xa = std::min(xa, xb);
}

/// True when a row pair r0, r1 of n floats holds a NaN (no short-circuit:
/// one vectorizable pass).
DLOPT_SIMD_CLONES bool anyNaN2(const float *__restrict r0,
                               const float *__restrict r1, int64_t n) {
  int nan = 0; // an int OR, which vectorizes where a bool's does not
  for (int64_t j = 0; j < n; ++j)
    nan |= int(r0[j] != r0[j]) | int(r1[j] != r1[j]);
  return nan != 0;
}

// Eight f32 lanes in the GCC vector extension, which clang shares (AVX2
// registers in the avx2 clone, pairs of SSE registers in the baseline one):
// the 2x2 max-pool rows below deinterleave their windows with shuffles,
// which GCC's vectorizer did not do by itself on this loop (it kept scalar
// code with branches). Only what both compilers accept: constant
// __builtin_shufflevector, and selects as bit masks (a comparison gives
// all-ones or zero lanes).
typedef float V8f __attribute__((vector_size(32)));
typedef int32_t V8i __attribute__((vector_size(32)));

#define DLOPT_EVEN8(a, b)                                                      \
  __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14)
#define DLOPT_ODD8(a, b)                                                       \
  __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15)
#define DLOPT_LOW8(a, b) __builtin_shufflevector(a, b, 0, 8, 1, 9, 2, 10, 3, 11)
#define DLOPT_HIGH8(a, b)                                                      \
  __builtin_shufflevector(a, b, 4, 12, 5, 13, 6, 14, 7, 15)

/// Lane-wise c ? a : b for a comparison mask c (a macro: a function
/// returning a 32-byte vector draws GCC's -Wpsabi note in the SSE clone).
#define DLOPT_SELECT8(c, a, b) ((V8f)(((V8i)(a) & (c)) | ((V8i)(b) & ~(c))))

/// Max pooling over eight 2x2 windows at stride 2 of a NaN-free row pair
/// r0, r1 (16 floats each): y[k] is the first strict maximum of r0[2k],
/// r0[2k+1], r1[2k], r1[2k+1] in that order (so -0 before +0 gives -0),
/// as the general loop gives.
[[gnu::always_inline]] inline void maxPool2x2x8(const float *r0,
                                                const float *r1, float *y) {
  V8f a0, a1, b0, b1; // loads (memcpy: no alignment assumed)
  std::memcpy(&a0, r0, 32);
  std::memcpy(&a1, r0 + 8, 32);
  std::memcpy(&b0, r1, 32);
  std::memcpy(&b1, r1 + 8, 32);
  V8f m = DLOPT_EVEN8(a0, a1);
  V8f v = DLOPT_ODD8(a0, a1);
  m = DLOPT_SELECT8(v > m, v, m);
  v = DLOPT_EVEN8(b0, b1);
  m = DLOPT_SELECT8(v > m, v, m);
  v = DLOPT_ODD8(b0, b1);
  m = DLOPT_SELECT8(v > m, v, m);
  std::memcpy(y, &m, 32);
}

/// The gradient of maxPool2x2x8: each input gets 0 + dy of its window
/// where it is the window's first strict maximum, 0 elsewhere (d0, d1: 16
/// floats each).
[[gnu::always_inline]] inline void maxPool2x2Grad8(const float *r0,
                                                   const float *r1,
                                                   const float *dy, float *d0,
                                                   float *d1) {
  V8f a0, a1, c0, c1, dyv;
  std::memcpy(&a0, r0, 32);
  std::memcpy(&a1, r0 + 8, 32);
  std::memcpy(&c0, r1, 32);
  std::memcpy(&c1, r1 + 8, 32);
  std::memcpy(&dyv, dy, 32);
  const V8f v0 = DLOPT_EVEN8(a0, a1), v1 = DLOPT_ODD8(a0, a1),
            v2 = DLOPT_EVEN8(c0, c1), v3 = DLOPT_ODD8(c0, c1);
  const V8f zero = {}, g = zero + dyv;
  const V8i b1 = v1 > v0;
  const V8f m01 = DLOPT_SELECT8(b1, v1, v0);
  const V8i b2 = v2 > m01;
  const V8f m = DLOPT_SELECT8(b2, v2, m01);
  const V8i b3 = v3 > m;
  const V8f o3 = DLOPT_SELECT8(b3, g, zero);
  const V8f o2 = DLOPT_SELECT8(b2 & ~b3, g, zero);
  const V8f o1 = DLOPT_SELECT8(b1 & ~b2 & ~b3, g, zero);
  const V8f o0 = DLOPT_SELECT8(~b1 & ~b2 & ~b3, g, zero);
  const V8f s0 = DLOPT_LOW8(o0, o1), s1 = DLOPT_HIGH8(o0, o1),
            s2 = DLOPT_LOW8(o2, o3), s3 = DLOPT_HIGH8(o2, o3);
  std::memcpy(d0, &s0, 32);
  std::memcpy(d0 + 8, &s1, 32);
  std::memcpy(d1, &s2, 32);
  std::memcpy(d1 + 8, &s3, 32);
}

/// maxPool2x2x8 over a row pair of ow windows; a tail of fewer than eight
/// goes through zero-padded copies (planes are often 7 or 14 wide, where a
/// scalar remainder would take most windows).
DLOPT_SIMD_CLONES void maxPool2x2Row(const float *r0, const float *r1, float *y,
                                     int64_t ow) {
  int64_t ox = 0;
  for (; ox + 8 <= ow; ox += 8)
    maxPool2x2x8(r0 + 2 * ox, r1 + 2 * ox, y + ox);
  if (ox < ow) {
    const int64_t n = ow - ox;
    float a[16] = {}, b[16] = {}, o[8];
    std::memcpy(a, r0 + 2 * ox, size_t(2 * n) * sizeof(float));
    std::memcpy(b, r1 + 2 * ox, size_t(2 * n) * sizeof(float));
    maxPool2x2x8(a, b, o);
    std::memcpy(y + ox, o, size_t(n) * sizeof(float));
  }
}

/// maxPool2x2Grad8 over a row pair of ow windows (tail as in maxPool2x2Row).
DLOPT_SIMD_CLONES void maxPool2x2GradRow(const float *r0, const float *r1,
                                         const float *dy, float *d0, float *d1,
                                         int64_t ow) {
  int64_t ox = 0;
  for (; ox + 8 <= ow; ox += 8)
    maxPool2x2Grad8(r0 + 2 * ox, r1 + 2 * ox, dy + ox, d0 + 2 * ox,
                    d1 + 2 * ox);
  if (ox < ow) {
    const int64_t n = ow - ox;
    float a[16] = {}, b[16] = {}, g[8] = {}, o0[16], o1[16];
    std::memcpy(a, r0 + 2 * ox, size_t(2 * n) * sizeof(float));
    std::memcpy(b, r1 + 2 * ox, size_t(2 * n) * sizeof(float));
    std::memcpy(g, dy + ox, size_t(n) * sizeof(float));
    maxPool2x2Grad8(a, b, g, o0, o1);
    std::memcpy(d0 + 2 * ox, o0, size_t(2 * n) * sizeof(float));
    std::memcpy(d1 + 2 * ox, o1, size_t(2 * n) * sizeof(float));
  }
}

/// Images per chunk when n images are cut into chunks of at most nb: the
/// same number of chunks, sizes as even as possible (so two threads get
/// equal work: 64 images at nb 9 become 8 chunks of 8, not 7 of 9 and a
/// 1). A function of the shape only.
int64_t evenChunk(int64_t n, int64_t nb) {
  const int64_t chunks = (n + nb - 1) / std::max<int64_t>(nb, 1);
  return chunks > 0 ? (n + chunks - 1) / chunks : 1;
}

/// Runs body(ci, n0, cnt, a, b) for the chunks ci of `per` images of n
/// (images [n0, n0 + cnt)), the chunks in parallel. Each worker has its own
/// scratch of aSize and bSize floats (a, b), so the im2col and GEMM of a
/// chunk run on that worker's thread alone: the same calls, so the same
/// bits, with any thread count.
template <typename Body>
void forImageChunks(int64_t n, int64_t per, int64_t aSize, int64_t bSize,
                    Body body) {
  parallelFor((n + per - 1) / per, 1, [&](int64_t cb, int64_t ce) {
    std::vector<float> a(static_cast<size_t>(aSize)),
        b(static_cast<size_t>(bSize));
    for (int64_t ci = cb; ci < ce; ++ci) {
      const int64_t n0 = ci * per;
      body(ci, n0, std::min(per, n - n0), a.data(), b.data());
    }
  });
}

/// Images per GEMM when whole planes are batched: the column matrix of nb
/// images is [C/groups*KH*KW, nb*OH*OW], kept within 1 MiB (2^18 floats:
/// GEMMs still a thousand or more columns wide, and the kernels' scratch,
/// this plus the GEMM's [O/groups, nb*OH*OW] result, stays small; 4 MiB
/// measured no faster and raised a batch-64 CNN's peak by 5 MiB). 1 means one
/// image at a time (row chunks of rowsPerChunkOf). Small planes (the deep
/// layers of a ResNet: 2x2 to 8x8 pixels at 64 px) then make GEMMs wide
/// enough to run at the BLAS's speed, and the filter gradient sums over
/// images inside one GEMM. A function of the shape only.
int64_t imagesPerChunkOf(const ConvGeom &g, int64_t n) {
  int64_t perImage = std::max<int64_t>(g.ckk() * g.oh * g.ow, 1);
  return std::clamp<int64_t>((int64_t(1) << 18) / perImage, 1,
                             std::max<int64_t>(n, 1));
}

/// dst[oc, i*plane + p] = src[(n0 + i, g0 + oc), p] for i < nb, oc < og:
/// one group's planes of nb images, side by side (the GEMM layout).
void gatherPlanes(const float *src, int64_t n0, int64_t nb, int64_t channels,
                  int64_t g0, int64_t og, int64_t plane, float *dst) {
  parallelFor(og, grainFor(nb * plane), [&](int64_t b, int64_t e) {
    for (int64_t oc = b; oc < e; ++oc)
      for (int64_t i = 0; i < nb; ++i)
        std::copy_n(src + ((n0 + i) * channels + g0 + oc) * plane, plane,
                    dst + (oc * nb + i) * plane);
  });
}

/// The inverse of gatherPlanes.
void scatterPlanes(const float *src, int64_t n0, int64_t nb, int64_t channels,
                   int64_t g0, int64_t og, int64_t plane, float *dst) {
  parallelFor(og, grainFor(nb * plane), [&](int64_t b, int64_t e) {
    for (int64_t oc = b; oc < e; ++oc)
      for (int64_t i = 0; i < nb; ++i)
        std::copy_n(src + (oc * nb + i) * plane, plane,
                    dst + ((n0 + i) * channels + g0 + oc) * plane);
  });
}

/// Output rows [r0, r0 + rows) of one image's columns: row r of the column
/// matrix (one (channel, ky, kx) tap) at col + r * ld.
void im2col(const ConvGeom &g, const float *xg, int64_t r0, int64_t rows,
            float *col, int64_t ld) {
  int64_t cols = rows * g.ow;
  parallelFor(g.ckk(), grainFor(cols), [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      int64_t ci = r / (g.kh * g.kw), ky = (r / g.kw) % g.kh, kx = r % g.kw;
      const float *xc = xg + ci * g.h * g.w;
      float *dst = col + r * ld;
      // Output columns [xa, xb) read pixels off + xx * stride, the others
      // fall in the padding: the same for every row of this tap (computed
      // once: its divisions cost more than a short row's copy).
      const int64_t off = kx * g.dilation[1] - g.padding[1];
      int64_t xa, xb;
      validColumns(g, off, xa, xb);
      const int64_t st = g.stride[1];
      for (int64_t yy = 0; yy < rows; ++yy) {
        int64_t iy =
            (r0 + yy) * g.stride[0] - g.padding[0] + ky * g.dilation[0];
        float *d = dst + yy * g.ow;
        if (iy < 0 || iy >= g.h) {
          std::fill(d, d + g.ow, 0.0f);
          continue;
        }
        std::fill(d, d + xa, 0.0f);
        const float *src = xc + iy * g.w + off;
        // Stride 2 (stems, downsampling) as a constant: resnet-tiny's 7x7
        // stem conv 0.074 ms against 0.089 (fastest of 3000, one thread).
        if (st == 1)
          std::copy(src + xa, src + xb, d + xa);
        else if (st == 2)
          for (int64_t xx = xa; xx < xb; ++xx)
            d[xx] = src[2 * xx];
        else
          for (int64_t xx = xa; xx < xb; ++xx)
            d[xx] = src[xx * st];
        std::fill(d + xb, d + g.ow, 0.0f);
      }
    }
  });
}

/// im2col of `count` whole images (image i at xg + i * imageStride) side by
/// side: image i's columns start at col + i * OH*OW, rows ld apart. The
/// images run in parallel (small planes would leave im2col's own split over
/// taps serial).
void im2colImages(const ConvGeom &g, const float *xg, int64_t imageStride,
                  int64_t count, float *col, int64_t ld) {
  const int64_t plane = g.oh * g.ow;
  parallelFor(count, grainFor(g.ckk() * plane), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      im2col(g, xg + i * imageStride, 0, g.oh, col + i * plane, ld);
  });
}

/// The column matrix [C/groups*KH*KW, count*OH*OW] of images [n0, n0 +
/// count) of NCHW x (C channels), group gi: im2col, or for a direct (1x1)
/// convolution the group's planes themselves.
void imageColumns(const ConvGeom &g, const float *x, int64_t c, int64_t n0,
                  int64_t count, int64_t gi, float *col) {
  const int64_t hw = g.h * g.w;
  if (g.direct())
    gatherPlanes(x, n0, count, c, gi * g.cg, g.cg, hw, col);
  else
    im2colImages(g, x + (n0 * c + gi * g.cg) * hw, c * hw, count, col,
                 count * g.oh * g.ow);
}

/// The adjoint of im2col: adds each column entry back onto the input pixel
/// it was read from. Parallel over input channels (each channel's taps only
/// touch that channel), each summed in one fixed order.
void col2imAdd(const ConvGeom &g, const float *col, int64_t r0, int64_t rows,
               float *dxg, int64_t ld) {
  int64_t cols = rows * g.ow;
  parallelFor(g.cg, grainFor(g.kh * g.kw * cols), [&](int64_t cb, int64_t ce) {
    for (int64_t ci = cb; ci < ce; ++ci) {
      float *dxc = dxg + ci * g.h * g.w;
      for (int64_t ky = 0; ky < g.kh; ++ky)
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const float *src = col + ((ci * g.kh + ky) * g.kw + kx) * ld;
          const int64_t off = kx * g.dilation[1] - g.padding[1];
          int64_t xa, xb;
          validColumns(g, off, xa, xb);
          for (int64_t yy = 0; yy < rows; ++yy) {
            int64_t iy =
                (r0 + yy) * g.stride[0] - g.padding[0] + ky * g.dilation[0];
            if (iy < 0 || iy >= g.h)
              continue;
            float *drow = dxc + iy * g.w + off;
            const float *s = src + yy * g.ow;
            if (g.stride[1] == 1)
              for (int64_t xx = xa; xx < xb; ++xx)
                drow[xx] += s[xx];
            else
              for (int64_t xx = xa; xx < xb; ++xx)
                drow[xx * g.stride[1]] += s[xx];
          }
        }
    }
  });
}

Status conv2dKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tx = ins[0].type, &tw = ins[1].type;
  const bool hasBias = ins.size() == 3;
  ConvGeom geom;
  DLOPT_RETURN_IF_ERROR(
      convGeometry(instr, tx, tw, hasBias ? &ins[2].type : nullptr, geom));
  const int64_t groups = geom.groups;
  int64_t n = tx.shape[0], c = tx.shape[1], h = geom.h, w = geom.w;
  int64_t o = tw.shape[0], og = o / groups, cg = geom.cg, ckk = geom.ckk();
  int64_t oh = geom.oh, ow = geom.ow, plane = oh * ow;
  if (outs[0].numElements() == 0)
    return Status::ok();

  bool direct = geom.direct();
  int64_t rowsPerChunk = rowsPerChunkOf(geom);
  return dispatchFloat(tx.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    std::vector<float> xb, wb, ob, col;
    const float *x, *wt;
    float *y;
    x = asF32<T>(ins[0], xb);
    wt = asF32<T>(ins[1], wb);
    y = outF32<T>(outs[0], ob);
    const int64_t nb = imagesPerChunkOf(geom, n);
    if (dnnlConvForward(geom, n, c, o, x, wt, y)) {
      // oneDNN's direct convolution (DnnlConv.h).
    } else if (nb > 1) {
      // Whole planes of nb images per GEMM: [og, ckk] x [ckk, nb*plane].
      // The chunks run in parallel (forImageChunks).
      const int64_t per = evenChunk(n, nb);
      forImageChunks(
          n, per, og * per * plane, ckk * per * plane,
          [&](int64_t, int64_t n0, int64_t cnt, float *tmp, float *col) {
            const int64_t cols = cnt * plane;
            for (int64_t gi = 0; gi < groups; ++gi) {
              imageColumns(geom, x, c, n0, cnt, gi, col);
              gemmF32(false, false, og, cols, ckk, 1.0f, wt + gi * og * ckk,
                      ckk, col, cols, 0.0f, tmp, cols);
              scatterPlanes(tmp, n0, cnt, o, gi * og, og, plane, y);
            }
          });
    } else {
      if (!direct)
        col.resize(size_t(ckk * rowsPerChunk * ow));
      for (int64_t ni = 0; ni < n; ++ni) {
        for (int64_t gi = 0; gi < groups; ++gi) {
          const float *xg = x + (ni * c + gi * cg) * h * w;
          const float *wg = wt + gi * og * ckk;
          float *yg = y + (ni * o + gi * og) * plane;
          if (direct) {
            gemmF32(false, false, og, plane, ckk, 1.0f, wg, ckk, xg, h * w,
                    0.0f, yg, plane);
            continue;
          }
          for (int64_t r0 = 0; r0 < oh; r0 += rowsPerChunk) {
            int64_t rows = std::min(rowsPerChunk, oh - r0);
            int64_t cols = rows * ow;
            im2col(geom, xg, r0, rows, col.data(), cols);
            gemmF32(false, false, og, cols, ckk, 1.0f, wg, ckk, col.data(),
                    cols, 0.0f, yg + r0 * ow, plane);
          }
        }
      }
    }
    if (hasBias) {
      std::vector<float> bias(static_cast<size_t>(o));
      loadF32(ins[2].as<T>(), bias.data(), o);
      parallelFor(n * o, grainFor(plane), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          float bv = bias[i % o];
          float *p = y + i * plane;
          for (int64_t j = 0; j < plane; ++j)
            p[j] += bv;
        }
      });
    }
    finishF32<T>(outs[0], y);
    return Status::ok();
  });
}

template <bool Max> Status poolKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tx = ins[0].type;
  size_t rank = tx.shape.size();
  PoolGeom g;
  DLOPT_RETURN_IF_ERROR(poolGeometry(instr, Max, tx, g));
  const std::vector<int64_t> &kernel = g.kernel, &stride = g.stride,
                             &padding = g.padding;
  bool includePad = g.includePad;
  int64_t h = tx.shape[rank - 2], w = tx.shape[rank - 1];
  int64_t oh = g.pooled[rank - 2], ow = g.pooled[rank - 1];
  int64_t planes = product(tx.shape, 0, rank - 2);
  return dispatchFloat(tx.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>();
    T *y = outs[0].as<T>();
    const bool twoByTwo = kernel[0] == 2 && kernel[1] == 2 && stride[0] == 2 &&
                          stride[1] == 2 && padding[1] == 0 && 2 * ow <= w;
    parallelFor(
        planes * oh, grainFor(ow * kernel[0] * kernel[1]),
        [&](int64_t b, int64_t e) {
          std::vector<float> rowMax(size_t(Max ? ow : 0));
          for (int64_t item = b; item < e; ++item) {
            int64_t pl = item / oh, oy = item % oh;
            const T *xp = x + pl * h * w;
            T *yr = y + item * ow;
            int64_t y0 = oy * stride[0] - padding[0];
            int64_t ya = std::max<int64_t>(y0, 0),
                    yb = std::min(y0 + kernel[0], h);
            if constexpr (Max && std::is_same_v<T, float>) {
              // 2x2 windows at stride 2 inside the image, no NaN in the
              // row pair: one vectorizable pass.
              if (twoByTwo && yb - ya == 2) {
                const float *r0 = xp + ya * w, *r1 = r0 + w;
                if (!anyNaN2(r0, r1, 2 * ow)) {
                  maxPool2x2Row(r0, r1, yr, ow);
                  continue;
                }
              }
            }
            // Max pooling, interior columns (whole window inside
            // the row): window row by window row, each a loop over
            // the output columns. Every output still visits its
            // window in row-major order, so the NaN and signed-zero
            // outcomes are those of the per-output loop below.
            int64_t oxa = ow, oxb = ow;
            if constexpr (Max) {
              oxa = std::min<int64_t>((padding[1] + stride[1] - 1) / stride[1],
                                      ow);
              oxb = w - kernel[1] + padding[1] < 0
                        ? 0
                        : (w - kernel[1] + padding[1]) / stride[1] + 1;
              oxb = std::clamp<int64_t>(oxb, oxa, ow);
              float *r = rowMax.data();
              std::fill(r + oxa, r + oxb,
                        -std::numeric_limits<float>::infinity());
              for (int64_t iy = ya; iy < yb; ++iy)
                for (int64_t kx = 0; kx < kernel[1]; ++kx) {
                  const T *src = xp + iy * w + kx - padding[1];
                  for (int64_t ox = oxa; ox < oxb; ++ox) {
                    float v = toF32(src[ox * stride[1]]);
                    r[ox] = r[ox] == r[ox] && (v != v || v > r[ox]) ? v : r[ox];
                  }
                }
              for (int64_t ox = oxa; ox < oxb; ++ox)
                yr[ox] = fromF32<T>(r[ox]);
            }
            for (int64_t ox = 0; ox < ow; ++ox) {
              if (ox == oxa)
                ox = oxb;
              if (ox >= ow)
                break;
              int64_t x0 = ox * stride[1] - padding[1];
              int64_t xa = std::max<int64_t>(x0, 0),
                      xb = std::min(x0 + kernel[1], w);
              float r;
              if constexpr (Max) {
                // Padding is -inf, so only real pixels matter.
                r = -std::numeric_limits<float>::infinity();
                for (int64_t iy = ya; iy < yb; ++iy)
                  for (int64_t ix = xa; ix < xb; ++ix) {
                    float v = toF32(xp[iy * w + ix]);
                    if (r == r && (v != v || v > r))
                      r = v;
                  }
              } else {
                double s = 0;
                for (int64_t iy = ya; iy < yb; ++iy)
                  for (int64_t ix = xa; ix < xb; ++ix)
                    s += double(toF32(xp[iy * w + ix]));
                int64_t cnt = includePad ? kernel[0] * kernel[1]
                                         : std::max<int64_t>(yb - ya, 0) *
                                               std::max<int64_t>(xb - xa, 0);
                r = cnt > 0 ? float(s / double(cnt)) : 0.0f;
              }
              yr[ox] = fromF32<T>(r);
            }
          }
        });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// Gradients (see "Gradient ops" in docs/ops.md)
//===----------------------------------------------------------------------===//

/// conv2d_grad_input %dy, %w -> dx (the forward input type): per (image,
/// group) col = w_g^T dy_g, then col2im.
Status conv2dGradInputKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tdy = ins[0].type, &tw = ins[1].type, &tx = outs[0].type;
  ConvGeom geom;
  DLOPT_RETURN_IF_ERROR(convGradGeometry(instr, tx, tw, tdy, geom));
  const int64_t groups = geom.groups;
  if (outs[0].numElements() == 0)
    return Status::ok();
  int64_t n = tx.shape[0], c = tx.shape[1], h = geom.h, w = geom.w;
  int64_t o = tw.shape[0], og = o / groups, cg = geom.cg, ckk = geom.ckk();
  int64_t oh = geom.oh, ow = geom.ow, plane = oh * ow;
  bool direct = geom.direct();
  int64_t rowsPerChunk = rowsPerChunkOf(geom);
  return dispatchFloat(tx.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    std::vector<float> dyb, wb, dxb, col;
    const float *dy, *wt;
    float *dx;
    dy = asF32<T>(ins[0], dyb);
    wt = asF32<T>(ins[1], wb);
    dx = outF32<T>(outs[0], dxb);
    if (dnnlConvBackwardData(geom, n, c, o, dy, wt, dx)) {
      finishF32<T>(outs[0], dx);
      return Status::ok();
    }
    std::fill(dx, dx + outs[0].numElements(), 0.0f);
    const int64_t nb = plane > 0 ? imagesPerChunkOf(geom, n) : 1;
    if (nb > 1) {
      // Whole planes of nb images: col = w_g^T [ckk, og] x dy [og, nb*plane].
      // Chunks in parallel as in conv2d (each adds into its own images'
      // planes only).
      const int64_t per = evenChunk(n, nb);
      forImageChunks(
          n, per, og * per * plane, ckk * per * plane,
          [&](int64_t, int64_t n0, int64_t cnt, float *dyT, float *col) {
            const int64_t cols = cnt * plane;
            for (int64_t gi = 0; gi < groups; ++gi) {
              gatherPlanes(dy, n0, cnt, o, gi * og, og, plane, dyT);
              gemmF32(true, false, ckk, cols, og, 1.0f, wt + gi * og * ckk, ckk,
                      dyT, cols, 0.0f, col, cols);
              if (direct)
                scatterPlanes(col, n0, cnt, c, gi * cg, cg, plane, dx);
              else
                // Images in parallel (each adds into its own planes only).
                parallelFor(
                    cnt, grainFor(ckk * plane), [&](int64_t b, int64_t e) {
                      for (int64_t i = b; i < e; ++i)
                        col2imAdd(geom, col + i * plane, 0, oh,
                                  dx + ((n0 + i) * c + gi * cg) * h * w, cols);
                    });
            }
          });
    } else {
      if (!direct && plane > 0)
        col.resize(size_t(ckk * rowsPerChunk * ow));
      for (int64_t ni = 0; ni < n && plane > 0; ++ni) {
        for (int64_t gi = 0; gi < groups; ++gi) {
          float *dxg = dx + (ni * c + gi * cg) * h * w;
          const float *wg = wt + gi * og * ckk;
          const float *dyg = dy + (ni * o + gi * og) * plane;
          if (direct) {
            gemmF32(true, false, cg, plane, og, 1.0f, wg, ckk, dyg, plane, 0.0f,
                    dxg, h * w);
            continue;
          }
          for (int64_t r0 = 0; r0 < oh; r0 += rowsPerChunk) {
            int64_t rows = std::min(rowsPerChunk, oh - r0);
            int64_t cols = rows * ow;
            gemmF32(true, false, ckk, cols, og, 1.0f, wg, ckk, dyg + r0 * ow,
                    plane, 0.0f, col.data(), cols);
            col2imAdd(geom, col.data(), r0, rows, dxg, cols);
          }
        }
      }
    }
    finishF32<T>(outs[0], dx);
    return Status::ok();
  });
}

/// conv2d_grad_filter %x, %dy -> dw (the filter type): per group,
/// dw_g = sum over images and row chunks of dy_g col^T, in a fixed order.
Status conv2dGradFilterKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tx = ins[0].type, &tdy = ins[1].type, &tw = outs[0].type;
  ConvGeom geom;
  DLOPT_RETURN_IF_ERROR(convGradGeometry(instr, tx, tw, tdy, geom));
  const int64_t groups = geom.groups;
  if (outs[0].numElements() == 0)
    return Status::ok();
  int64_t n = tx.shape[0], c = tx.shape[1], h = geom.h, w = geom.w;
  int64_t o = tw.shape[0], og = o / groups, cg = geom.cg, ckk = geom.ckk();
  int64_t oh = geom.oh, ow = geom.ow, plane = oh * ow;
  bool direct = geom.direct();
  int64_t rowsPerChunk = rowsPerChunkOf(geom);
  return dispatchFloat(tx.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    std::vector<float> xb, dyb, dwb, col;
    const float *x, *dy;
    float *dw;
    x = asF32<T>(ins[0], xb);
    dy = asF32<T>(ins[1], dyb);
    dw = outF32<T>(outs[0], dwb);
    if (dnnlConvBackwardWeights(geom, n, c, o, x, dy, dw)) {
      finishF32<T>(outs[0], dw);
      return Status::ok();
    }
    std::fill(dw, dw + outs[0].numElements(), 0.0f);
    const int64_t nb = plane > 0 ? imagesPerChunkOf(geom, n) : 1;
    const int64_t per = nb > 1 ? evenChunk(n, nb) : 1;
    const int64_t chunks = (n + per - 1) / per, wsize = o * ckk;
    if (nb > 1 && chunks > 1 && chunks * wsize <= (int64_t(1) << 21)) {
      // Whole planes of per images, the chunks in parallel: chunk ci's
      // dw_g = dy [og, per*plane] x col^T (the sum over its images inside
      // the GEMM) into its own slice of `part`, then the slices added in
      // chunk order (bits fixed by the shape). At most 2^21 floats of
      // slices; beyond that, the serial loop below.
      std::vector<float> part(size_t(chunks * wsize));
      forImageChunks(
          n, per, og * per * plane, ckk * per * plane,
          [&](int64_t ci, int64_t n0, int64_t cnt, float *dyT, float *col) {
            const int64_t cols = cnt * plane;
            for (int64_t gi = 0; gi < groups; ++gi) {
              gatherPlanes(dy, n0, cnt, o, gi * og, og, plane, dyT);
              imageColumns(geom, x, c, n0, cnt, gi, col);
              gemmF32(false, true, og, ckk, cols, 1.0f, dyT, cols, col, cols,
                      0.0f, part.data() + ci * wsize + gi * og * ckk, ckk);
            }
          });
      parallelFor(wsize, grainFor(chunks), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          float acc = part[size_t(i)];
          for (int64_t ci = 1; ci < chunks; ++ci)
            acc += part[size_t(ci * wsize + i)];
          dw[i] = acc;
        }
      });
    } else if (nb > 1) {
      // Whole planes of nb images: dw_g += dy [og, nb*plane] x col^T, the
      // sum over images inside the GEMM; chunks in order.
      std::vector<float> dyT(size_t(og * nb * plane));
      col.resize(size_t(ckk * nb * plane));
      for (int64_t n0 = 0; n0 < n; n0 += nb) {
        int64_t cnt = std::min(nb, n - n0), cols = cnt * plane;
        for (int64_t gi = 0; gi < groups; ++gi) {
          gatherPlanes(dy, n0, cnt, o, gi * og, og, plane, dyT.data());
          imageColumns(geom, x, c, n0, cnt, gi, col.data());
          gemmF32(false, true, og, ckk, cols, 1.0f, dyT.data(), cols,
                  col.data(), cols, 1.0f, dw + gi * og * ckk, ckk);
        }
      }
    } else {
      if (!direct && plane > 0)
        col.resize(size_t(ckk * rowsPerChunk * ow));
      for (int64_t ni = 0; ni < n && plane > 0; ++ni) {
        for (int64_t gi = 0; gi < groups; ++gi) {
          const float *xg = x + (ni * c + gi * cg) * h * w;
          const float *dyg = dy + (ni * o + gi * og) * plane;
          float *dwg = dw + gi * og * ckk;
          if (direct) {
            gemmF32(false, true, og, cg, plane, 1.0f, dyg, plane, xg, h * w,
                    1.0f, dwg, ckk);
            continue;
          }
          for (int64_t r0 = 0; r0 < oh; r0 += rowsPerChunk) {
            int64_t rows = std::min(rowsPerChunk, oh - r0);
            int64_t cols = rows * ow;
            im2col(geom, xg, r0, rows, col.data(), cols);
            gemmF32(false, true, og, ckk, cols, 1.0f, dyg + r0 * ow, plane,
                    col.data(), cols, 1.0f, dwg, ckk);
          }
        }
      }
    }
    finishF32<T>(outs[0], dw);
    return Status::ok();
  });
}

/// max_pool2d_grad %x, %dy and avg_pool2d_grad %dy. Windows overlap when
/// stride < kernel, so the work is split by planes; each plane accumulates
/// its output positions in row-major order in f32.
template <bool Max>
Status poolGradKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tx = Max ? ins[0].type : outs[0].type;
  const TensorType &tdy = ins[Max ? 1 : 0].type;
  PoolGeom g;
  DLOPT_RETURN_IF_ERROR(poolGradGeometry(instr, Max, tx, tdy, g));
  const std::vector<int64_t> &kernel = g.kernel, &stride = g.stride,
                             &padding = g.padding;
  bool includePad = g.includePad;
  size_t rank = tx.shape.size();
  int64_t h = tx.shape[rank - 2], w = tx.shape[rank - 1];
  int64_t oh = tdy.shape[rank - 2], ow = tdy.shape[rank - 1];
  int64_t planes = product(tx.shape, 0, rank - 2);
  if (outs[0].numElements() == 0)
    return Status::ok();
  return dispatchFloat(tx.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = Max ? ins[0].as<T>() : nullptr;
    const T *dy = ins[Max ? 1 : 0].as<T>();
    T *dx = outs[0].as<T>();
    if (Max && kernel[0] == 2 && kernel[1] == 2 && stride[0] == 2 &&
        stride[1] == 2 && padding[0] == 0 && padding[1] == 0 && 2 * oh <= h &&
        2 * ow <= w) {
      // 2x2 windows, stride 2, no padding: the windows do not overlap, so
      // each input element gets its window's gradient or 0, written once,
      // with the argmax picked without branches (the same first maximum and
      // NaN rule as below).
      parallelFor(planes, grainFor(8 * h * w), [&](int64_t pb, int64_t pe) {
        for (int64_t pl = pb; pl < pe; ++pl) {
          const T *xp = x + pl * h * w;
          const T *dyp = dy + pl * oh * ow;
          T *dxp = dx + pl * h * w;
          if (2 * oh < h || 2 * ow < w) // rows or columns in no window
            std::fill(dxp, dxp + h * w, fromF32<T>(0.0f));
          for (int64_t oy = 0; oy < oh; ++oy) {
            const T *r0 = xp + 2 * oy * w, *r1 = r0 + w;
            T *d0 = dxp + 2 * oy * w, *d1 = d0 + w;
            // NaNs are rare: a row pair without any takes the comparison
            // chain below with no NaN rule (selects, no branches); one with
            // a NaN takes the rule window by window.
            bool nan = false;
            if constexpr (std::is_same_v<T, float>) {
              if (!anyNaN2(r0, r1, 2 * ow)) {
                maxPool2x2GradRow(r0, r1, dyp + oy * ow, d0, d1, ow);
                continue;
              }
              nan = true;
            } else {
              for (int64_t j = 0; j < 2 * ow; ++j) {
                float a = toF32(r0[j]), b = toF32(r1[j]);
                nan = nan || std::isnan(a) || std::isnan(b);
              }
            }
            for (int64_t ox = 0; ox < ow; ++ox) {
              float v0 = toF32(r0[2 * ox]), v1 = toF32(r0[2 * ox + 1]),
                    v2 = toF32(r1[2 * ox]), v3 = toF32(r1[2 * ox + 1]);
              int k;
              if (!nan) {
                // The first strict maximum in row-major order.
                float m = v0;
                k = 0;
                k = v1 > m ? 1 : k;
                m = v1 > m ? v1 : m;
                k = v2 > m ? 2 : k;
                m = v2 > m ? v2 : m;
                k = v3 > m ? 3 : k;
              } else {
                float v[4] = {v0, v1, v2, v3}, r = v0;
                k = 0;
                for (int q = 1; q < 4; ++q)
                  if (r == r && (v[q] != v[q] || v[q] > r)) {
                    r = v[q];
                    k = q;
                  }
              }
              // 0 + g, as the general path's accumulation gives (+0 for -0).
              float g = 0.0f + toF32(dyp[oy * ow + ox]);
              d0[2 * ox] = fromF32<T>(k == 0 ? g : 0.0f);
              d0[2 * ox + 1] = fromF32<T>(k == 1 ? g : 0.0f);
              d1[2 * ox] = fromF32<T>(k == 2 ? g : 0.0f);
              d1[2 * ox + 1] = fromF32<T>(k == 3 ? g : 0.0f);
            }
          }
        }
      });
      return Status::ok();
    }
    parallelFor(planes, grainFor(oh * ow * kernel[0] * kernel[1] + h * w),
                [&](int64_t pb, int64_t pe) {
                  std::vector<float> acc(static_cast<size_t>(h * w));
                  for (int64_t pl = pb; pl < pe; ++pl) {
                    std::fill(acc.begin(), acc.end(), 0.0f);
                    const T *dyp = dy + pl * oh * ow;
                    for (int64_t oy = 0; oy < oh; ++oy) {
                      int64_t y0 = oy * stride[0] - padding[0];
                      int64_t ya = std::max<int64_t>(y0, 0),
                              yb = std::min(y0 + kernel[0], h);
                      for (int64_t ox = 0; ox < ow; ++ox) {
                        int64_t x0 = ox * stride[1] - padding[1];
                        int64_t xa = std::max<int64_t>(x0, 0),
                                xb = std::min(x0 + kernel[1], w);
                        float g = toF32(dyp[oy * ow + ox]);
                        if constexpr (Max) {
                          // The first maximum in row-major order, with the
                          // forward's NaN rule; padding (-inf) never wins.
                          const T *xp = x + pl * h * w;
                          int64_t best = -1;
                          float r = 0;
                          for (int64_t iy = ya; iy < yb; ++iy)
                            for (int64_t ix = xa; ix < xb; ++ix) {
                              float v = toF32(xp[iy * w + ix]);
                              if (best < 0 || (r == r && (v != v || v > r))) {
                                r = v;
                                best = iy * w + ix;
                              }
                            }
                          if (best >= 0)
                            acc[best] += g;
                        } else {
                          int64_t cnt = includePad
                                            ? kernel[0] * kernel[1]
                                            : std::max<int64_t>(yb - ya, 0) *
                                                  std::max<int64_t>(xb - xa, 0);
                          if (cnt == 0)
                            continue;
                          float share = float(double(g) / double(cnt));
                          for (int64_t iy = ya; iy < yb; ++iy)
                            for (int64_t ix = xa; ix < xb; ++ix)
                              acc[iy * w + ix] += share;
                        }
                      }
                    }
                    storeF32(acc.data(), dx + pl * h * w, h * w);
                  }
                });
    return Status::ok();
  });
}

} // namespace

void registerConvKernels(KernelRegistry &r) {
  r["conv2d"] = conv2dKernel;
  r["max_pool2d"] = poolKernel<true>;
  r["avg_pool2d"] = poolKernel<false>;
  r["conv2d_grad_input"] = conv2dGradInputKernel;
  r["conv2d_grad_filter"] = conv2dGradFilterKernel;
  r["max_pool2d_grad"] = poolGradKernel<true>;
  r["avg_pool2d_grad"] = poolGradKernel<false>;
}

} // namespace dlopt::rt::cpu
