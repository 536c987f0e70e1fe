//===- NN.cpp - softmax, norms, attention, rope, batch_norm, dropout ------===//
//
// Statistics (softmax sums, norm means and variances) are accumulated in
// double; elementwise math is f32, and 16-bit tensors are rounded once on
// store. Loops are split by rows (or channels), each row computed by a single
// thread, so results do not depend on the thread count.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/KernelUtil.h"
#include "runtime/cpu/ThreadPool.h"
#include "runtime/cpu/VecMath.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dlopt::rt::cpu {

/// Softmax (or log-softmax) of `v[0..n)` in place (also used by
/// attention_grad to recompute the probabilities exactly as attention does).
DLOPT_SIMD_CLONES void softmaxInPlace(float *v, int64_t n, bool log) {
  float m = vm::rowMax(v, n);
  if (log) {
    // The exponentials go to a scratch row; v keeps the inputs.
    thread_local std::vector<float> scratch;
    if (scratch.size() < size_t(n))
      scratch.resize(size_t(n));
    vm::expShifted(v, n, m, scratch.data());
    float lse = float(std::log(vm::rowSumF64(scratch.data(), n)));
    for (int64_t j = 0; j < n; ++j)
      v[j] = (v[j] - m) - lse;
  } else {
    vm::expShifted(v, n, m, v);
    float inv = float(1.0 / vm::rowSumF64(v, n));
    for (int64_t j = 0; j < n; ++j)
      v[j] *= inv;
  }
}

/// Query rows per score buffer of attention and attention_grad: at most
/// 2^20 floats (4 MiB) of [rows, T] scores per buffer, a function of the
/// shape only (the chunks fix the GEMM calls, hence the bits).
int64_t attentionRowChunk(int64_t rowsPerGroup, int64_t t) {
  return std::max<int64_t>(
      1, std::min<int64_t>(rowsPerGroup,
                           (int64_t(1) << 20) / std::max<int64_t>(t, 1)));
}

namespace {

template <bool Log>
Status softmaxKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &t = ins[0].type;
  DimSplit split;
  DLOPT_RETURN_IF_ERROR(getDimSplit(instr, t.shape, split));
  int64_t n = split.n, inner = split.inner, outer = split.outer;
  if (t.numElements() == 0)
    return Status::ok();
  return dispatchFloat(t.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>();
    T *y = outs[0].as<T>();
    if (inner == 1) {
      parallelFor(outer, grainFor(n * 20), [&](int64_t b, int64_t e) {
        std::vector<float> buf(static_cast<size_t>(n));
        for (int64_t r = b; r < e; ++r) {
          loadF32(x + r * n, buf.data(), n);
          softmaxInPlace(buf.data(), n, Log);
          storeF32(buf.data(), y + r * n, n);
        }
      });
      return Status::ok();
    }
    // Strided: a block of columns is processed row by row (contiguous
    // reads), with the same per-column arithmetic as softmaxInPlace.
    constexpr int64_t kCols = 64;
    int64_t blocks = (inner + kCols - 1) / kCols;
    parallelFor(
        outer * blocks, grainFor(n * kCols * 20), [&](int64_t b, int64_t e) {
          std::vector<float> buf(static_cast<size_t>(n * kCols));
          float m[kCols];
          double sum[kCols];
          for (int64_t item = b; item < e; ++item) {
            int64_t c0 = (item % blocks) * kCols;
            int64_t nc = std::min(kCols, inner - c0);
            int64_t base = (item / blocks) * n * inner + c0;
            for (int64_t c = 0; c < nc; ++c) {
              m[c] = -std::numeric_limits<float>::infinity();
              sum[c] = 0;
            }
            for (int64_t j = 0; j < n; ++j) {
              const T *xr = x + base + j * inner;
              float *br = buf.data() + j * nc;
              for (int64_t c = 0; c < nc; ++c) {
                br[c] = toF32(xr[c]);
                m[c] = std::max(m[c], br[c]);
              }
            }
            for (int64_t j = 0; j < n; ++j) {
              float *br = buf.data() + j * nc;
              for (int64_t c = 0; c < nc; ++c) {
                float ev = vm::expF(br[c] - m[c]);
                sum[c] += double(ev);
                if (!Log)
                  br[c] = ev;
              }
            }
            float scale[kCols];
            for (int64_t c = 0; c < nc; ++c)
              scale[c] = Log ? float(std::log(sum[c])) : float(1.0 / sum[c]);
            for (int64_t j = 0; j < n; ++j) {
              const float *br = buf.data() + j * nc;
              T *yr = y + base + j * inner;
              for (int64_t c = 0; c < nc; ++c)
                yr[c] = fromF32<T>(Log ? (br[c] - m[c]) - scale[c]
                                       : br[c] * scale[c]);
            }
          }
        });
    return Status::ok();
  });
}

/// One row of a norm in place: its statistics (vm::normRowStats), then
/// (v - mu) * rs, times w and plus b where given. An AVX2 clone and a
/// baseline one, the same bits (VecMath.h).
template <bool Rms>
DLOPT_SIMD_CLONES void normRow(float *v, int64_t n, double eps, const float *w,
                               const float *b) {
  float mu = 0, rs;
  vm::normRowStats<Rms>(v, n, eps, mu, rs);
  for (int64_t j = 0; j < n; ++j)
    v[j] = (v[j] - mu) * rs;
  if (w)
    for (int64_t j = 0; j < n; ++j)
      v[j] *= w[j];
  if (b)
    for (int64_t j = 0; j < n; ++j)
      v[j] += b[j];
}

/// Shared by layer_norm (Rms = false) and rms_norm (Rms = true).
template <bool Rms> Status normKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &t = ins[0].type;
  NormGeom geom;
  DLOPT_RETURN_IF_ERROR(normGeometry(instr, t, Rms, false, ins.size(), geom));
  const double eps = geom.eps;
  const bool hasWeight = geom.hasWeight, hasBias = geom.hasBias;
  const int64_t n = geom.n, rows = geom.rows;
  return dispatchFloat(t.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>();
    const T *w = hasWeight ? ins[1].as<T>() : nullptr;
    const T *bias = hasBias ? ins[hasWeight ? 2 : 1].as<T>() : nullptr;
    T *y = outs[0].as<T>();
    std::vector<float> wf, bf;
    if (w) {
      wf.resize(size_t(n));
      loadF32(w, wf.data(), n);
    }
    if (bias) {
      bf.resize(size_t(n));
      loadF32(bias, bf.data(), n);
    }
    parallelFor(rows, grainFor(n * 6), [&](int64_t b, int64_t e) {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t r = b; r < e; ++r) {
        loadF32(x + r * n, v.data(), n);
        normRow<Rms>(v.data(), n, eps, w ? wf.data() : nullptr,
                     bias ? bf.data() : nullptr);
        storeF32(v.data(), y + r * n, n);
      }
    });
    return Status::ok();
  });
}

Status attentionKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tq = ins[0].type, &tk = ins[1].type, &tv = ins[2].type;
  AttentionDims ad;
  DLOPT_RETURN_IF_ERROR(attentionDims(instr, tq, tk, tv, ad));
  const int64_t b = ad.b, h = ad.h, s = ad.s, d = ad.d, g = ad.g, t = ad.t,
                e = ad.e;
  const bool causal = ad.causal;
  const double scale = ad.scale;
  // Causal: query i sees keys j <= i + shift (T - S, or the offset operand).
  const int64_t shift = optionalScalarInt(ins, 3, t - s);
  if (outs[0].numElements() == 0)
    return Status::ok();
  int64_t headsPerGroup = h / g;
  // Query heads sharing a KV head are adjacent in q and out, so each
  // (batch, kv head) is one [headsPerGroup*S, D] x [D, T] GEMM; rows are
  // chunked to bound the score buffer (by the shape alone).
  int64_t rowsPerGroup = headsPerGroup * s;
  int64_t chunk = attentionRowChunk(rowsPerGroup, t);
  return dispatchFloat(tq.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    std::vector<float> qb, kb, vb, ob;
    auto widen = [](const TensorRef &r, std::vector<float> &buf) {
      if constexpr (std::is_same_v<T, float>) {
        return r.as<const float>();
      } else {
        buf.resize(size_t(r.numElements()));
        loadF32(r.as<T>(), buf.data(), r.numElements());
        return static_cast<const float *>(buf.data());
      }
    };
    const float *q = widen(ins[0], qb), *k = widen(ins[1], kb),
                *v = widen(ins[2], vb);
    float *o;
    if constexpr (std::is_same_v<T, float>) {
      o = outs[0].as<float>();
    } else {
      ob.resize(size_t(outs[0].numElements()));
      o = ob.data();
    }
    // The (batch, kv head) pairs run in parallel, each worker with its own
    // score buffer; the GEMMs and softmaxes inside then run on one thread
    // (the same calls, so the same bits with any thread count). The GEMMs
    // of usual heads (S x T x D of 128x128x64) are below gemmF32's split
    // size and would otherwise run on one thread anyway.
    parallelFor(b * g, 1, [&](int64_t pb, int64_t pe) {
      std::vector<float> scores(static_cast<size_t>(chunk * t));
      for (int64_t pair = pb; pair < pe; ++pair) {
        const int64_t bi = pair / g, gi = pair % g;
        int64_t head0 = bi * h + gi * headsPerGroup;
        const float *kg = k + (bi * g + gi) * t * d;
        const float *vg = v + (bi * g + gi) * t * e;
        for (int64_t r0 = 0; r0 < rowsPerGroup; r0 += chunk) {
          int64_t rc = std::min(chunk, rowsPerGroup - r0);
          gemmF32(false, true, rc, t, d, float(scale), q + (head0 * s + r0) * d,
                  d, kg, d, 0.0f, scores.data(), t);
          parallelFor(rc, grainFor(t * 20), [&](int64_t rb, int64_t re) {
            for (int64_t r = rb; r < re; ++r) {
              float *row = scores.data() + r * t;
              int64_t allowed = t;
              if (causal) {
                int64_t i = (r0 + r) % s;
                allowed = std::clamp<int64_t>(i + shift + 1, 0, t);
              }
              // A query that may see no key (causal with S > T) gets zeros
              // rather than the NaN of an all -inf softmax.
              if (allowed > 0)
                softmaxInPlace(row, allowed, false);
              std::fill(row + allowed, row + t, 0.0f);
            }
          });
          gemmF32(false, false, rc, e, t, 1.0f, scores.data(), t, vg, e, 0.0f,
                  o + (head0 * s + r0) * e, e);
        }
      }
    });
    if constexpr (!std::is_same_v<T, float>)
      storeF32(o, outs[0].as<T>(), outs[0].numElements());
    return Status::ok();
  });
}

Status ropeKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tx = ins[0].type;
  size_t rank = tx.shape.size();
  double theta = 10000.0;
  bool inverse = false;
  DLOPT_RETURN_IF_ERROR(getOptFloatAttr(instr, "theta", theta));
  // `inverse` rotates by the negated angle (rope's gradient).
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(instr, "inverse", inverse));
  int64_t s = tx.shape[rank - 2], d = tx.shape[rank - 1], half = d / 2;
  // Positions start at the offset operand (a context-parallel block).
  const int64_t first = optionalScalarInt(ins, 1, 0);
  if (tx.numElements() == 0)
    return Status::ok();
  // cos/sin table [S, D/2], angles in double.
  std::vector<float> cosT(static_cast<size_t>(s * half)),
      sinT(static_cast<size_t>(s * half));
  for (int64_t p = 0; p < s; ++p)
    for (int64_t i = 0; i < half; ++i) {
      double a =
          double(p + first) * std::pow(theta, -2.0 * double(i) / double(d));
      cosT[p * half + i] = float(std::cos(a));
      sinT[p * half + i] = float(inverse ? -std::sin(a) : std::sin(a));
    }
  int64_t rows = tx.numElements() / d;
  return dispatchFloat(tx.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>();
    T *y = outs[0].as<T>();
    parallelFor(rows, grainFor(d * 4), [&](int64_t rb, int64_t re) {
      for (int64_t r = rb; r < re; ++r) {
        const T *xr = x + r * d;
        T *yr = y + r * d;
        const float *c = cosT.data() + (r % s) * half;
        const float *sn = sinT.data() + (r % s) * half;
        for (int64_t i = 0; i < half; ++i) {
          float x0 = toF32(xr[i]), x1 = toF32(xr[i + half]);
          yr[i] = fromF32<T>(x0 * c[i] - x1 * sn[i]);
          yr[i + half] = fromF32<T>(x1 * c[i] + x0 * sn[i]);
        }
      }
    });
    return Status::ok();
  });
}

Status batchNormKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tx = ins[0].type;
  int64_t n = tx.shape[0], c = tx.shape[1];
  double eps = 1e-5, momentum = 0.1;
  bool training = false;
  DLOPT_RETURN_IF_ERROR(getOptFloatAttr(instr, "eps", eps));
  DLOPT_RETURN_IF_ERROR(getOptFloatAttr(instr, "momentum", momentum));
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(instr, "training", training));
  int64_t inner = product(tx.shape, 2, tx.shape.size());
  int64_t count = n * inner;
  return dispatchFloat(tx.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>(), *w = ins[1].as<T>(), *bias = ins[2].as<T>();
    const T *rm = ins[3].as<T>(), *rv = ins[4].as<T>();
    T *y = outs[0].as<T>(), *rmOut = outs[1].as<T>(), *rvOut = outs[2].as<T>();
    parallelFor(c, grainFor(count * 6), [&](int64_t cb, int64_t ce) {
      for (int64_t ch = cb; ch < ce; ++ch) {
        double mean, var;
        if (training) {
          // Two passes (mean, then squared deviations) in double, each
          // over vm::kLanes partial sums in a fixed order.
          auto at = [&](int64_t i, int64_t j) {
            return double(toF32(x[(i * c + ch) * inner + j]));
          };
          double sum = vm::laneSum(n, inner, at);
          mean = sum / double(count);
          double ss = vm::laneSum(n, inner, [&](int64_t i, int64_t j) {
            double dv = at(i, j) - mean;
            return dv * dv;
          });
          var = ss / double(count);
          double unbiased = ss / double(count - 1);
          rmOut[ch] = fromF32<T>(float(
              (1.0 - momentum) * double(toF32(rm[ch])) + momentum * mean));
          rvOut[ch] = fromF32<T>(float(
              (1.0 - momentum) * double(toF32(rv[ch])) + momentum * unbiased));
        } else {
          mean = double(toF32(rm[ch]));
          var = double(toF32(rv[ch]));
          rmOut[ch] = rm[ch];
          rvOut[ch] = rv[ch];
        }
        // y = x * a + bb with a, bb folded per channel.
        double a = double(toF32(w[ch])) / std::sqrt(var + eps);
        float af = float(a), bf = float(double(toF32(bias[ch])) - mean * a);
        for (int64_t i = 0; i < n; ++i) {
          const T *p = x + (i * c + ch) * inner;
          T *q = y + (i * c + ch) * inner;
          for (int64_t j = 0; j < inner; ++j)
            q[j] = fromF32<T>(toF32(p[j]) * af + bf);
        }
      }
    });
    return Status::ok();
  });
}

/// The counter-based uniform of docs/ops.md, in [0, 1).
inline double dropoutUniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z = z ^ (z >> 31);
  return double(z >> 40) * 0x1p-24;
}

/// The effective seed of docs/ops.md: seed + offset * 0xD1B54A32D192ED03
/// (uint64, wrapping; the offset sign-extended).
inline uint64_t dropoutSeed(int64_t seed, int64_t offset) {
  return uint64_t(seed) + uint64_t(offset) * 0xD1B54A32D192ED03ull;
}

Status dropoutKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &t = ins[0].type;
  double rate = 0;
  int64_t seed = 0;
  DLOPT_RETURN_IF_ERROR(getFloatAttr(instr, "rate", rate));
  DLOPT_RETURN_IF_ERROR(getOptIntAttr(instr, "seed", seed));
  const int64_t offset = optionalScalarInt(ins, 1, 0);
  uint64_t s = dropoutSeed(seed, offset);
  float scale = float(1.0 / (1.0 - rate));
  int64_t n = t.numElements();
  return dispatchFloat(t.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>();
    T *y = outs[0].as<T>();
    parallelFor(n, grainFor(8), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        y[i] = dropoutUniform(s, uint64_t(i)) >= rate
                   ? fromF32<T>(toF32(x[i]) * scale)
                   : fromF32<T>(0.0f);
    });
    return Status::ok();
  });
}

} // namespace

void registerNNKernels(KernelRegistry &r) {
  r["softmax"] = softmaxKernel<false>;
  r["log_softmax"] = softmaxKernel<true>;
  r["layer_norm"] = normKernel<false>;
  r["rms_norm"] = normKernel<true>;
  r["attention"] = attentionKernel;
  r["rope"] = ropeKernel;
  r["batch_norm"] = batchNormKernel;
  r["dropout"] = dropoutKernel;
}

} // namespace dlopt::rt::cpu
