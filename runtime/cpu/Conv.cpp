//===- Conv.cpp - conv2d, pooling and their gradients ---------------------===//
//
// conv2d lowers each (image, group) to one GEMM per chunk of output rows:
// W_g [O/groups, Cg*KH*KW] x col [Cg*KH*KW, rows*OW], written straight into
// the NCHW output through ldc. 1x1 convolutions with unit stride and no
// padding skip im2col since the input already is the column matrix.
// The gradients reuse that geometry: conv2d_grad_input is col = W_g^T dy_g
// then col2im (scatter-add, split by input channel); conv2d_grad_filter is
// dW_g += dy_g col^T over images and row chunks in a fixed order; the pool
// gradients scatter each window's gradient within its plane.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/KernelUtil.h"
#include "runtime/cpu/ThreadPool.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dlopt::rt::cpu {
namespace {

/// Output rows per GEMM so the column buffer stays around 32 MB.
int64_t rowsPerChunkOf(const ConvGeom &g) {
  return std::clamp<int64_t>(
      (int64_t(1) << 23) / std::max<int64_t>(g.ckk() * g.ow, 1), 1,
      std::max<int64_t>(g.oh, 1));
}

void im2col(const ConvGeom &g, const float *xg, int64_t r0, int64_t rows,
            float *col) {
  int64_t cols = rows * g.ow;
  parallelFor(g.ckk(), grainFor(cols), [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      int64_t ci = r / (g.kh * g.kw), ky = (r / g.kw) % g.kh, kx = r % g.kw;
      const float *xc = xg + ci * g.h * g.w;
      float *dst = col + r * cols;
      for (int64_t yy = 0; yy < rows; ++yy) {
        int64_t iy = (r0 + yy) * g.stride[0] - g.padding[0] + ky * g.dilation[0];
        float *d = dst + yy * g.ow;
        if (iy < 0 || iy >= g.h) {
          std::fill(d, d + g.ow, 0.0f);
          continue;
        }
        const float *xrow = xc + iy * g.w;
        for (int64_t xx = 0; xx < g.ow; ++xx) {
          int64_t ix = xx * g.stride[1] - g.padding[1] + kx * g.dilation[1];
          d[xx] = ix >= 0 && ix < g.w ? xrow[ix] : 0.0f;
        }
      }
    }
  });
}

/// The adjoint of im2col: adds each column entry back onto the input pixel
/// it was read from. Parallel over input channels (each channel's taps only
/// touch that channel), each summed in one fixed order.
void col2imAdd(const ConvGeom &g, const float *col, int64_t r0, int64_t rows,
               float *dxg) {
  int64_t cols = rows * g.ow;
  parallelFor(g.cg, grainFor(g.kh * g.kw * cols), [&](int64_t cb, int64_t ce) {
    for (int64_t ci = cb; ci < ce; ++ci) {
      float *dxc = dxg + ci * g.h * g.w;
      for (int64_t ky = 0; ky < g.kh; ++ky)
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const float *src = col + ((ci * g.kh + ky) * g.kw + kx) * cols;
          for (int64_t yy = 0; yy < rows; ++yy) {
            int64_t iy =
                (r0 + yy) * g.stride[0] - g.padding[0] + ky * g.dilation[0];
            if (iy < 0 || iy >= g.h)
              continue;
            float *drow = dxc + iy * g.w;
            const float *s = src + yy * g.ow;
            for (int64_t xx = 0; xx < g.ow; ++xx) {
              int64_t ix = xx * g.stride[1] - g.padding[1] + kx * g.dilation[1];
              if (ix >= 0 && ix < g.w)
                drow[ix] += s[xx];
            }
          }
        }
    }
  });
}

Status conv2dKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tx = ins[0].type, &tw = ins[1].type;
  const bool hasBias = ins.size() == 3;
  ConvGeom geom;
  DLOPT_RETURN_IF_ERROR(convGeometry(
      instr, tx, tw, hasBias ? &ins[2].type : nullptr, geom));
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
    if (!direct)
      col.resize(size_t(ckk * rowsPerChunk * ow));
    for (int64_t ni = 0; ni < n; ++ni) {
      for (int64_t gi = 0; gi < groups; ++gi) {
        const float *xg = x + (ni * c + gi * cg) * h * w;
        const float *wg = wt + gi * og * ckk;
        float *yg = y + (ni * o + gi * og) * plane;
        if (direct) {
          gemmF32(false, false, og, plane, ckk, 1.0f, wg, ckk, xg, h * w, 0.0f,
                  yg, plane);
          continue;
        }
        for (int64_t r0 = 0; r0 < oh; r0 += rowsPerChunk) {
          int64_t rows = std::min(rowsPerChunk, oh - r0);
          int64_t cols = rows * ow;
          im2col(geom, xg, r0, rows, col.data());
          gemmF32(false, false, og, cols, ckk, 1.0f, wg, ckk, col.data(), cols,
                  0.0f, yg + r0 * ow, plane);
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
    parallelFor(planes * oh, grainFor(ow * kernel[0] * kernel[1]),
                [&](int64_t b, int64_t e) {
                  for (int64_t item = b; item < e; ++item) {
                    int64_t pl = item / oh, oy = item % oh;
                    const T *xp = x + pl * h * w;
                    T *yr = y + item * ow;
                    int64_t y0 = oy * stride[0] - padding[0];
                    int64_t ya = std::max<int64_t>(y0, 0),
                            yb = std::min(y0 + kernel[0], h);
                    for (int64_t ox = 0; ox < ow; ++ox) {
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
                        int64_t cnt = includePad
                                          ? kernel[0] * kernel[1]
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
    std::fill(dx, dx + outs[0].numElements(), 0.0f);
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
          col2imAdd(geom, col.data(), r0, rows, dxg);
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
    std::fill(dw, dw + outs[0].numElements(), 0.0f);
    if (!direct && plane > 0)
      col.resize(size_t(ckk * rowsPerChunk * ow));
    for (int64_t ni = 0; ni < n && plane > 0; ++ni) {
      for (int64_t gi = 0; gi < groups; ++gi) {
        const float *xg = x + (ni * c + gi * cg) * h * w;
        const float *dyg = dy + (ni * o + gi * og) * plane;
        float *dwg = dw + gi * og * ckk;
        if (direct) {
          gemmF32(false, true, og, cg, plane, 1.0f, dyg, plane, xg, h * w, 1.0f,
                  dwg, ckk);
          continue;
        }
        for (int64_t r0 = 0; r0 < oh; r0 += rowsPerChunk) {
          int64_t rows = std::min(rowsPerChunk, oh - r0);
          int64_t cols = rows * ow;
          im2col(geom, xg, r0, rows, col.data());
          gemmF32(false, true, og, ckk, cols, 1.0f, dyg + r0 * ow, plane,
                  col.data(), cols, 1.0f, dwg, ckk);
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
