//===- Grad.cpp - Gradient ops (see "Gradient ops" in docs/ops.md) --------===//
//
// scatter_add, softmax_grad, log_softmax_grad, layer_norm_grad,
// rms_norm_grad, attention_grad, batch_norm_grad, cross_entropy_grad,
// gelu_grad and slice_grad. (conv2d and pooling gradients live in Conv.cpp.)
//
// As in the forward kernels, sums are accumulated in double (or f32 where the
// contract says so), elementwise math is f32, and 16-bit results are rounded
// once on store. Every reduction runs in a fixed order over fixed chunks
// whose boundaries depend only on the shapes, so results are bitwise
// identical for any thread count.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/KernelUtil.h"
#include "runtime/cpu/ThreadPool.h"
#include "runtime/cpu/VecMath.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace dlopt::rt::cpu {
namespace {

/// Reads an int tensor (i32/i64) element as int64.
inline int64_t intAt(const TensorRef &t, int64_t i) {
  return t.type.dtype == DType::I32 ? int64_t(t.as<int32_t>()[i])
                                    : t.as<int64_t>()[i];
}

//===----------------------------------------------------------------------===//
// scatter_add
//===----------------------------------------------------------------------===//

Status scatterAddKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tr = outs[0].type;
  int64_t v = tr.shape[0];
  int64_t n = ins[0].numElements();
  int64_t rest = product(tr.shape, 1, tr.shape.size());
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = intAt(ins[0], i);
    if (ids[i] < 0 || ids[i] >= v)
      return opError(instr, "id " + std::to_string(ids[i]) + " at position " +
                                std::to_string(i) + " is outside [0, " +
                                std::to_string(v) + ")");
  }
  return dispatchFloat(tr.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    std::vector<float> accBuf;
    float *acc = outF32<T>(outs[0], accBuf);
    if constexpr (std::is_same_v<T, float>)
      std::fill(acc, acc + outs[0].numElements(), 0.0f);
    if (rest == 0 || n == 0) {
      finishF32<T>(outs[0], acc);
      return Status::ok();
    }
    const T *u = ins[1].as<T>();
    // Parallel over blocks of the feature dims; each block walks the ids in
    // row-major order, so every sum has one fixed order.
    constexpr int64_t kCols = 256;
    int64_t blocks = (rest + kCols - 1) / kCols;
    parallelFor(blocks, grainFor(n * std::min(rest, kCols)),
                [&](int64_t b, int64_t e) {
                  for (int64_t blk = b; blk < e; ++blk) {
                    int64_t c0 = blk * kCols, nc = std::min(kCols, rest - c0);
                    for (int64_t i = 0; i < n; ++i) {
                      const T *src = u + i * rest + c0;
                      float *dst = acc + ids[i] * rest + c0;
                      for (int64_t c = 0; c < nc; ++c)
                        dst[c] += toF32(src[c]);
                    }
                  }
                });
    finishF32<T>(outs[0], acc);
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// softmax_grad / log_softmax_grad
//===----------------------------------------------------------------------===//

template <bool Log>
Status softmaxGradKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &t = ins[0].type;
  DimSplit split;
  DLOPT_RETURN_IF_ERROR(getDimSplit(instr, t.shape, split));
  int64_t n = split.n, inner = split.inner, outer = split.outer;
  if (t.numElements() == 0)
    return Status::ok();
  return dispatchFloat(t.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *y = ins[0].as<T>(), *dy = ins[1].as<T>();
    T *dx = outs[0].as<T>();
    // A block of up to kCols lines along `dim` per work item (one line when
    // the dim is innermost); each line is reduced in order by one thread.
    constexpr int64_t kCols = 64;
    int64_t blocks = (inner + kCols - 1) / kCols;
    int64_t width = std::min(inner, kCols);
    parallelFor(
        outer * blocks, grainFor(n * width * 8), [&](int64_t b, int64_t e) {
          double sum[kCols];
          float sf[kCols];
          for (int64_t item = b; item < e; ++item) {
            int64_t c0 = (item % blocks) * kCols;
            int64_t nc = std::min(kCols, inner - c0);
            int64_t base = (item / blocks) * n * inner + c0;
            for (int64_t c = 0; c < nc; ++c)
              sum[c] = 0;
            for (int64_t j = 0; j < n; ++j) {
              const T *yr = y + base + j * inner, *gr = dy + base + j * inner;
              for (int64_t c = 0; c < nc; ++c) {
                if constexpr (Log)
                  sum[c] += double(toF32(gr[c]));
                else
                  sum[c] += double(toF32(gr[c])) * double(toF32(yr[c]));
              }
            }
            for (int64_t c = 0; c < nc; ++c)
              sf[c] = float(sum[c]);
            for (int64_t j = 0; j < n; ++j) {
              const T *yr = y + base + j * inner, *gr = dy + base + j * inner;
              T *xr = dx + base + j * inner;
              for (int64_t c = 0; c < nc; ++c) {
                float yv = toF32(yr[c]), g = toF32(gr[c]);
                xr[c] = fromF32<T>(Log ? g - vm::expF(yv) * sf[c]
                                       : yv * (g - sf[c]));
              }
            }
          }
        });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// layer_norm_grad / rms_norm_grad
//===----------------------------------------------------------------------===//

/// One row of a norm's gradient: x in v, dy in d (dx on return), w in w;
/// adds dy * xhat and dy to the parameter-gradient partials pw and pb. An
/// AVX2 clone and a baseline one, the same bits (VecMath.h).
template <bool Rms>
DLOPT_SIMD_CLONES void normGradRow(float *v, float *g, float *d,
                                   const float *w, double *pw, double *pb,
                                   int64_t n, double eps) {
  float mu = 0, rs;
  vm::normRowStats<Rms>(v, n, eps, mu, rs);
  // v becomes xhat (layer_norm) or x*r (rms_norm); g = dy*w.
  for (int64_t j = 0; j < n; ++j) {
    v[j] = (v[j] - mu) * rs;
    g[j] = d[j] * w[j];
    pw[j] += double(d[j]) * double(v[j]);
    pb[j] += double(d[j]);
  }
  const double sg = vm::rowSumF64(g, n), sgx = vm::dotF64(g, v, n);
  float mg = float(sg / double(n)), mgx = float(sgx / double(n));
  // layer_norm: (g - mean(g) - xhat*mean(g*xhat)) * rs;
  // rms_norm:   r*g - x*r^3*mean(g*x) = (g - (x*r)*mean(g*x*r)) * r.
  for (int64_t j = 0; j < n; ++j)
    d[j] = (Rms ? g[j] - v[j] * mgx : g[j] - mg - v[j] * mgx) * rs;
}

/// Operands x, dy[, w]; results dx, dw[, db] (db for layer_norm only).
template <bool Rms>
Status normGradKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &t = ins[0].type;
  NormGeom geom;
  DLOPT_RETURN_IF_ERROR(normGeometry(instr, t, Rms, true, ins.size(), geom));
  const double eps = geom.eps;
  const bool hasWeight = geom.hasWeight;
  const int64_t n = geom.n, rows = geom.rows;
  // Fixed row chunks (from the shape only); each chunk leaves partial
  // parameter-gradient sums that are then added in chunk order.
  int64_t rowChunk =
      std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(n, 1));
  int64_t numChunks = (rows + rowChunk - 1) / rowChunk;
  return dispatchFloat(t.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>(), *dy = ins[1].as<T>();
    T *dx = outs[0].as<T>();
    std::vector<float> wf(static_cast<size_t>(n), 1.0f);
    if (hasWeight)
      loadF32(ins[2].as<T>(), wf.data(), n);
    // partial[chunk] = [dw sums (n), db sums (n)].
    std::vector<double> partial(size_t(numChunks * n * 2), 0.0);
    parallelFor(numChunks, 1, [&](int64_t cb, int64_t ce) {
      std::vector<float> v(static_cast<size_t>(n)), g(static_cast<size_t>(n)),
          d(static_cast<size_t>(n));
      for (int64_t ch = cb; ch < ce; ++ch) {
        double *pw = partial.data() + ch * n * 2, *pb = pw + n;
        for (int64_t r = ch * rowChunk, re = std::min(rows, r + rowChunk);
             r < re; ++r) {
          loadF32(x + r * n, v.data(), n);
          loadF32(dy + r * n, d.data(), n);
          normGradRow<Rms>(v.data(), g.data(), d.data(), wf.data(), pw, pb, n,
                           eps);
          storeF32(d.data(), dx + r * n, n);
        }
      }
    });
    // Parameter gradients: per column, chunks summed in order.
    std::vector<float> dw(static_cast<size_t>(n)), db(static_cast<size_t>(n));
    parallelFor(n, grainFor(numChunks * 2), [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) {
        double sw = 0, sb = 0;
        for (int64_t ch = 0; ch < numChunks; ++ch) {
          sw += partial[ch * n * 2 + j];
          sb += partial[ch * n * 2 + n + j];
        }
        dw[j] = float(sw);
        db[j] = float(sb);
      }
    });
    storeF32(dw.data(), outs[1].as<T>(), n);
    if constexpr (!Rms)
      storeF32(db.data(), outs[2].as<T>(), n);
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// attention_grad
//===----------------------------------------------------------------------===//

Status attentionGradKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tq = ins[0].type, &tk = ins[1].type, &tv = ins[2].type;
  AttentionDims ad;
  DLOPT_RETURN_IF_ERROR(attentionDims(instr, tq, tk, tv, ad));
  const int64_t b = ad.b, h = ad.h, s = ad.s, d = ad.d, g = ad.g, t = ad.t,
                e = ad.e;
  const bool causal = ad.causal;
  const double scale = ad.scale;
  const int64_t shift = optionalScalarInt(ins, 4, t - s);
  int64_t headsPerGroup = h / g;
  // The query heads of one kv head are adjacent, so each (batch, kv head) is
  // a stack of headsPerGroup*S query rows; dk/dv GEMMs over that stack sum
  // over the group's heads. Rows are chunked to bound the [rows, T] buffers;
  // chunks accumulate into dk/dv in a fixed order.
  int64_t rowsPerGroup = headsPerGroup * s;
  int64_t chunk = attentionRowChunk(rowsPerGroup, t);
  float sc = float(scale);
  return dispatchFloat(tq.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    std::vector<float> qb, kb, vb, dob, dqb, dkb, dvb;
    const float *q = asF32<T>(ins[0], qb), *k = asF32<T>(ins[1], kb),
                *v = asF32<T>(ins[2], vb), *dout = asF32<T>(ins[3], dob);
    float *dq = outF32<T>(outs[0], dqb), *dk = outF32<T>(outs[1], dkb),
          *dv = outF32<T>(outs[2], dvb);
    std::fill(dq, dq + outs[0].numElements(), 0.0f);
    std::fill(dk, dk + outs[1].numElements(), 0.0f);
    std::fill(dv, dv + outs[2].numElements(), 0.0f);
    if (rowsPerGroup > 0 && t > 0) {
      // (batch, kv head) pairs in parallel, as in attention: each writes
      // its own rows of dq and its own dk, dv, chunks in a fixed order.
      parallelFor(b * g, 1, [&](int64_t pb, int64_t pe) {
        std::vector<float> p(static_cast<size_t>(chunk * t)),
            dp(static_cast<size_t>(chunk * t));
        for (int64_t pair = pb; pair < pe; ++pair) {
          const int64_t bi = pair / g, gi = pair % g;
          int64_t head0 = bi * h + gi * headsPerGroup;
          const float *kg = k + (bi * g + gi) * t * d;
          const float *vg = v + (bi * g + gi) * t * e;
          float *dkg = dk + (bi * g + gi) * t * d;
          float *dvg = dv + (bi * g + gi) * t * e;
          for (int64_t r0 = 0; r0 < rowsPerGroup; r0 += chunk) {
            int64_t rc = std::min(chunk, rowsPerGroup - r0);
            const float *qc = q + (head0 * s + r0) * d;
            const float *doc = dout + (head0 * s + r0) * e;
            float *dqc = dq + (head0 * s + r0) * d;
            // P = softmax(scale q k^T + mask), as in attention.
            gemmF32(false, true, rc, t, d, sc, qc, d, kg, d, 0.0f, p.data(), t);
            parallelFor(rc, grainFor(t * 20), [&](int64_t rb, int64_t re) {
              for (int64_t r = rb; r < re; ++r) {
                float *row = p.data() + r * t;
                int64_t allowed = t;
                if (causal) {
                  int64_t i = (r0 + r) % s;
                  allowed = std::clamp<int64_t>(i + shift + 1, 0, t);
                }
                if (allowed > 0)
                  softmaxInPlace(row, allowed, false);
                std::fill(row + allowed, row + t, 0.0f);
              }
            });
            // dV += P^T dO; dP = dO V^T.
            gemmF32(true, false, t, e, rc, 1.0f, p.data(), t, doc, e, 1.0f, dvg,
                    e);
            gemmF32(false, true, rc, t, e, 1.0f, doc, e, vg, e, 0.0f, dp.data(),
                    t);
            // dS = P * (dP - rowsum(dP * P)), in place in dp.
            parallelFor(rc, grainFor(t * 4), [&](int64_t rb, int64_t re) {
              for (int64_t r = rb; r < re; ++r) {
                const float *pr = p.data() + r * t;
                float *dr = dp.data() + r * t;
                float sf = float(vm::dotF64(dr, pr, t));
                for (int64_t j = 0; j < t; ++j)
                  dr[j] = pr[j] * (dr[j] - sf);
              }
            });
            // dQ = scale dS K; dK += scale dS^T Q.
            gemmF32(false, false, rc, d, t, sc, dp.data(), t, kg, d, 0.0f, dqc,
                    d);
            gemmF32(true, false, t, d, rc, sc, dp.data(), t, qc, d, 1.0f, dkg,
                    d);
          }
        }
      });
    }
    finishF32<T>(outs[0], dq);
    finishF32<T>(outs[1], dk);
    finishF32<T>(outs[2], dv);
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// batch_norm_grad
//===----------------------------------------------------------------------===//

Status batchNormGradKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tx = ins[0].type;
  int64_t n = tx.shape[0], c = tx.shape[1];
  double eps = 1e-5;
  bool training = false;
  DLOPT_RETURN_IF_ERROR(getOptFloatAttr(instr, "eps", eps));
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(instr, "training", training));
  int64_t inner = product(tx.shape, 2, tx.shape.size());
  int64_t count = n * inner;
  return dispatchFloat(tx.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>(), *w = ins[1].as<T>(), *rm = ins[2].as<T>(),
            *rv = ins[3].as<T>(), *dy = ins[4].as<T>();
    T *dx = outs[0].as<T>(), *dw = outs[1].as<T>(), *db = outs[2].as<T>();
    parallelFor(c, grainFor(count * 10), [&](int64_t cb, int64_t ce) {
      for (int64_t ch = cb; ch < ce; ++ch) {
        double mean = 0, var = 0;
        // The statistics as batch_norm computes them (vm::laneSum), and
        // the two sums of the gradient in one pass of the same kind.
        auto at = [&](int64_t i, int64_t j) {
          return double(toF32(x[(i * c + ch) * inner + j]));
        };
        if (training) {
          if (count > 0) {
            double sum = vm::laneSum(n, inner, at);
            mean = sum / double(count);
            double ss = vm::laneSum(n, inner, [&](int64_t i, int64_t j) {
              double dv = at(i, j) - mean;
              return dv * dv;
            });
            var = ss / double(count);
          }
        } else {
          mean = double(toF32(rm[ch]));
          var = double(toF32(rv[ch]));
        }
        float rs = float(1.0 / std::sqrt(var + eps)), mu = float(mean);
        auto gAt = [&](int64_t i, int64_t j) {
          return toF32(dy[(i * c + ch) * inner + j]);
        };
        double sdy = 0, sdyx = 0;
        vm::laneSum2(
            n, inner, [&](int64_t i, int64_t j) { return double(gAt(i, j)); },
            [&](int64_t i, int64_t j) {
              return double(gAt(i, j)) *
                     double((toF32(x[(i * c + ch) * inner + j]) - mu) * rs);
            },
            sdy, sdyx);
        dw[ch] = fromF32<T>(float(sdyx));
        db[ch] = fromF32<T>(float(sdy));
        float a = toF32(w[ch]) * rs;
        float mdy = count ? float(sdy / double(count)) : 0.0f;
        float mdyx = count ? float(sdyx / double(count)) : 0.0f;
        for (int64_t i = 0; i < n; ++i) {
          const T *p = x + (i * c + ch) * inner;
          const T *gp = dy + (i * c + ch) * inner;
          T *q = dx + (i * c + ch) * inner;
          for (int64_t j = 0; j < inner; ++j) {
            float g = toF32(gp[j]);
            if (training) {
              float xh = (toF32(p[j]) - mu) * rs;
              q[j] = fromF32<T>(a * (g - mdy - xh * mdyx));
            } else {
              q[j] = fromF32<T>(a * g);
            }
          }
        }
      }
    });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// cross_entropy_grad
//===----------------------------------------------------------------------===//

Status crossEntropyGradKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tl = ins[0].type;
  int64_t ignore = -100;
  DLOPT_RETURN_IF_ERROR(getOptIntAttr(instr, "ignore_index", ignore));
  int64_t n = tl.shape[0], c = tl.shape[1];
  std::vector<int64_t> labels(static_cast<size_t>(n));
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    labels[i] = intAt(ins[1], i);
    if (labels[i] == ignore)
      continue;
    if (labels[i] < 0 || labels[i] >= c)
      return opError(instr, "label " + std::to_string(labels[i]) + " of row " +
                                std::to_string(i) + " is outside [0, " +
                                std::to_string(c) + ") and not ignore_index (" +
                                std::to_string(ignore) + ")");
    ++count;
  }
  return dispatchFloat(tl.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>();
    T *dx = outs[0].as<T>();
    // dloss has the logits' type or f32.
    const float dloss = ins[2].type.dtype == DType::F32
                            ? ins[2].as<float>()[0]
                            : toF32(ins[2].as<T>()[0]);
    float scale = count ? float(double(dloss) / double(count)) : 0.0f;
    parallelFor(n, grainFor(c * 20), [&](int64_t b, int64_t e) {
      std::vector<float> p(static_cast<size_t>(c));
      for (int64_t i = b; i < e; ++i) {
        T *out = dx + i * c;
        if (labels[i] == ignore) {
          for (int64_t j = 0; j < c; ++j)
            out[j] = fromF32<T>(0.0f);
          continue;
        }
        loadF32(x + i * c, p.data(), c);
        softmaxInPlace(p.data(), c, false);
        p[labels[i]] -= 1.0f;
        for (int64_t j = 0; j < c; ++j)
          out[j] = fromF32<T>(p[j] * scale);
      }
    });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// gelu_grad
//===----------------------------------------------------------------------===//

template <bool Tanh> inline float geluDeriv(float x) {
  if constexpr (Tanh) {
    return vm::geluTanhDerivF(x);
  } else {
    // Phi(x) + x * phi(x).
    return 0.5f * (1.0f + std::erf(x * 0.70710678118654752f)) +
           x * 0.39894228040143268f * vm::expF(-0.5f * x * x);
  }
}

template <bool Tanh, typename T>
DLOPT_SIMD_CLONES void geluGradLoop(const T *x, const T *dy, T *dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dx[i] = fromF32<T>(toF32(dy[i]) * geluDeriv<Tanh>(toF32(x[i])));
}

Status geluGradKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &t = ins[0].type;
  std::string approx = "none";
  DLOPT_RETURN_IF_ERROR(getOptStringAttr(instr, "approximate", approx));
  bool useTanh = approx == "tanh";
  int64_t n = t.numElements();
  return dispatchFloat(t.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>(), *dy = ins[1].as<T>();
    T *dx = outs[0].as<T>();
    parallelFor(n, grainFor(24), [&](int64_t b, int64_t e) {
      if (useTanh)
        geluGradLoop<true>(x + b, dy + b, dx + b, e - b);
      else
        geluGradLoop<false>(x + b, dy + b, dx + b, e - b);
    });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// slice_grad
//===----------------------------------------------------------------------===//

Status sliceGradKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tr = outs[0].type;
  size_t rank = tr.shape.size();
  SliceGeom sg;
  DLOPT_RETURN_IF_ERROR(sliceGeometry(instr, tr.shape, sg));
  const std::vector<int64_t> &start = sg.start, &stride = sg.stride,
                             &sliced = sg.sliced;
  // Zero bits are 0 for every element type.
  int64_t bytes = tr.byteSize();
  parallelFor(bytes, 1 << 20, [&](int64_t b, int64_t e) {
    std::memset(static_cast<char *>(outs[0].data) + b, 0, size_t(e - b));
  });
  if (ins[0].numElements() == 0)
    return Status::ok();
  std::vector<int64_t> outStrides = contiguousStrides(tr.shape);
  int64_t base = 0;
  for (size_t i = 0; i < rank; ++i)
    base += start[i] * outStrides[i];
  if (rank == 0) {
    std::memcpy(outs[0].data, ins[0].data, size_t(dtypeSize(tr.dtype)));
    return Status::ok();
  }
  int64_t inner = sliced[rank - 1];
  int64_t innerStep = stride[rank - 1];
  int64_t numRows = ins[0].numElements() / inner;
  return dispatchBySize(tr.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *g = ins[0].as<T>();
    T *y = outs[0].as<T>() + base;
    parallelFor(numRows, grainFor(inner), [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        int64_t off = 0, rem = row;
        for (size_t d = rank - 1; d-- > 0;) {
          off += (rem % sliced[d]) * stride[d] * outStrides[d];
          rem /= sliced[d];
        }
        const T *gr = g + row * inner;
        T *yr = y + off;
        for (int64_t j = 0; j < inner; ++j)
          yr[j * innerStep] = gr[j];
      }
    });
    return Status::ok();
  });
}

} // namespace

void registerGradKernels(KernelRegistry &r) {
  r["scatter_add"] = scatterAddKernel;
  r["softmax_grad"] = softmaxGradKernel<false>;
  r["log_softmax_grad"] = softmaxGradKernel<true>;
  r["layer_norm_grad"] = normGradKernel<false>;
  r["rms_norm_grad"] = normGradKernel<true>;
  r["attention_grad"] = attentionGradKernel;
  r["batch_norm_grad"] = batchNormGradKernel;
  r["cross_entropy_grad"] = crossEntropyGradKernel;
  r["gelu_grad"] = geluGradKernel;
  r["slice_grad"] = sliceGradKernel;
}

} // namespace dlopt::rt::cpu
