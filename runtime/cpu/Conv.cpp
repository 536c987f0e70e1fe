//===- Conv.cpp - conv2d (im2col + sgemm), max_pool2d, avg_pool2d ---------===//
//
// conv2d lowers each (image, group) to one GEMM per chunk of output rows:
// W_g [O/groups, Cg*KH*KW] x col [Cg*KH*KW, rows*OW], written straight into
// the NCHW output through ldc. 1x1 convolutions with unit stride and no
// padding skip im2col since the input already is the column matrix.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/KernelUtil.h"
#include "runtime/cpu/ThreadPool.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dlopt::rt::cpu {
namespace {

/// Reads a 2-element int list attribute with a default.
Status getPair(const Instr &instr, const std::string &name,
               std::vector<int64_t> &out, int64_t minValue) {
  DLOPT_RETURN_IF_ERROR(getOptIntsAttr(instr, name, out));
  if (out.size() != 2 || out[0] < minValue || out[1] < minValue)
    return opError(instr, "expects '" + name +
                              "' to be 2 ints >= " + std::to_string(minValue) +
                              ", got " + shapeStr(out));
  return Status::ok();
}

/// Output size of a sliding window; -1 when the window does not fit.
int64_t windowOut(int64_t in, int64_t k, int64_t s, int64_t p, int64_t dil) {
  int64_t span = in + 2 * p - dil * (k - 1) - 1;
  return span < 0 ? -1 : span / s + 1;
}

Status conv2dKernel(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(checkArityRange(instr, ins, outs, 2, 3, 1));
  const TensorType &tx = ins[0].type, &tw = ins[1].type;
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "x", tx));
  if (tx.shape.size() != 4 || tw.shape.size() != 4 || tw.dtype != tx.dtype)
    return opError(instr, "expects x [N,C,H,W] and w [O,C/groups,KH,KW] of "
                          "one float type, got " +
                              typeStr(tx) + " and " + typeStr(tw));
  bool hasBias = ins.size() == 3;
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(instr, "has_bias", hasBias));
  if (ins.size() != 2 + size_t(hasBias))
    return opError(instr,
                   "expects " + std::to_string(2 + hasBias) +
                       " operands (has_bias = " + std::to_string(hasBias) +
                       "), got " + std::to_string(ins.size()));
  std::vector<int64_t> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
  DLOPT_RETURN_IF_ERROR(getPair(instr, "stride", stride, 1));
  DLOPT_RETURN_IF_ERROR(getPair(instr, "padding", padding, 0));
  DLOPT_RETURN_IF_ERROR(getPair(instr, "dilation", dilation, 1));
  DLOPT_RETURN_IF_ERROR(getOptIntAttr(instr, "groups", groups));
  int64_t n = tx.shape[0], c = tx.shape[1], h = tx.shape[2], w = tx.shape[3];
  int64_t o = tw.shape[0], cg = tw.shape[1], kh = tw.shape[2], kw = tw.shape[3];
  if (groups < 1 || c != cg * groups || o % groups != 0)
    return opError(instr, "expects C = Cg * groups and O % groups == 0, got " +
                              typeStr(tx) + ", " + typeStr(tw) +
                              ", groups = " + std::to_string(groups));
  if (hasBias)
    DLOPT_RETURN_IF_ERROR(
        checkType(instr, "bias", ins[2].type, TensorType{tx.dtype, {o}}));
  int64_t oh = windowOut(h, kh, stride[0], padding[0], dilation[0]);
  int64_t ow = windowOut(w, kw, stride[1], padding[1], dilation[1]);
  if (oh < 0 || ow < 0)
    return opError(instr, "kernel does not fit the padded input: " +
                              typeStr(tx) + ", " + typeStr(tw));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result", outs[0].type,
                                  TensorType{tx.dtype, {n, o, oh, ow}}));
  if (outs[0].numElements() == 0)
    return Status::ok();

  int64_t og = o / groups, ckk = cg * kh * kw, plane = oh * ow;
  bool direct = kh == 1 && kw == 1 && stride[0] == 1 && stride[1] == 1 &&
                padding[0] == 0 && padding[1] == 0;
  // Output rows per GEMM so the column buffer stays around 32 MB.
  int64_t rowsPerChunk = std::clamp<int64_t>(
      (int64_t(1) << 23) / std::max<int64_t>(ckk * ow, 1), 1, oh);
  return dispatchFloat(tx.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    std::vector<float> xb, wb, ob, col;
    const float *x, *wt;
    float *y;
    if constexpr (std::is_same_v<T, float>) {
      x = ins[0].as<float>();
      wt = ins[1].as<float>();
      y = outs[0].as<float>();
    } else {
      xb.resize(size_t(ins[0].numElements()));
      wb.resize(size_t(ins[1].numElements()));
      ob.resize(size_t(outs[0].numElements()));
      loadF32(ins[0].as<T>(), xb.data(), ins[0].numElements());
      loadF32(ins[1].as<T>(), wb.data(), ins[1].numElements());
      x = xb.data();
      wt = wb.data();
      y = ob.data();
    }
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
          // im2col: row (ci, ky, kx) holds the input pixel each output
          // position of this chunk sees through that kernel tap.
          parallelFor(ckk, grainFor(cols), [&](int64_t rb, int64_t re) {
            for (int64_t r = rb; r < re; ++r) {
              int64_t ci = r / (kh * kw), ky = (r / kw) % kh, kx = r % kw;
              const float *xc = xg + ci * h * w;
              float *dst = col.data() + r * cols;
              for (int64_t yy = 0; yy < rows; ++yy) {
                int64_t iy =
                    (r0 + yy) * stride[0] - padding[0] + ky * dilation[0];
                float *d = dst + yy * ow;
                if (iy < 0 || iy >= h) {
                  std::fill(d, d + ow, 0.0f);
                  continue;
                }
                const float *xrow = xc + iy * w;
                for (int64_t xx = 0; xx < ow; ++xx) {
                  int64_t ix = xx * stride[1] - padding[1] + kx * dilation[1];
                  d[xx] = ix >= 0 && ix < w ? xrow[ix] : 0.0f;
                }
              }
            }
          });
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
    if constexpr (!std::is_same_v<T, float>)
      storeF32(y, outs[0].as<T>(), outs[0].numElements());
    return Status::ok();
  });
}

template <bool Max> Status poolKernel(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(checkArity(instr, ins, outs, 1, 1));
  const TensorType &tx = ins[0].type;
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "operand #0", tx));
  size_t rank = tx.shape.size();
  if (rank < 2)
    return opError(instr,
                   "expects rank >= 2 ([..., H, W]), got " + typeStr(tx));
  std::vector<int64_t> kernel, padding{0, 0};
  DLOPT_RETURN_IF_ERROR(getIntsAttr(instr, "kernel", kernel));
  if (kernel.size() != 2 || kernel[0] < 1 || kernel[1] < 1)
    return opError(instr, "expects 'kernel' to be 2 ints >= 1, got " +
                              shapeStr(kernel));
  std::vector<int64_t> stride = kernel;
  DLOPT_RETURN_IF_ERROR(getPair(instr, "stride", stride, 1));
  DLOPT_RETURN_IF_ERROR(getPair(instr, "padding", padding, 0));
  bool includePad = true;
  if constexpr (!Max)
    DLOPT_RETURN_IF_ERROR(
        getOptBoolAttr(instr, "count_include_pad", includePad));
  int64_t h = tx.shape[rank - 2], w = tx.shape[rank - 1];
  int64_t oh = windowOut(h, kernel[0], stride[0], padding[0], 1);
  int64_t ow = windowOut(w, kernel[1], stride[1], padding[1], 1);
  if (oh < 0 || ow < 0)
    return opError(instr, "window " + shapeStr(kernel) +
                              " does not fit the padded input " + typeStr(tx));
  std::vector<int64_t> expected(tx.shape.begin(), tx.shape.end() - 2);
  expected.push_back(oh);
  expected.push_back(ow);
  DLOPT_RETURN_IF_ERROR(
      checkType(instr, "result", outs[0].type, TensorType{tx.dtype, expected}));
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

} // namespace

void registerConvKernels(KernelRegistry &r) {
  r["conv2d"] = conv2dKernel;
  r["max_pool2d"] = poolKernel<true>;
  r["avg_pool2d"] = poolKernel<false>;
}

} // namespace dlopt::rt::cpu
