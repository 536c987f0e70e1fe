//===- Loss.cpp - cross_entropy and mse ----------------------------------===//
//
// Per-row (or per-chunk) partial results are computed in parallel and then
// summed serially in a fixed order, so the scalar loss is the same for any
// thread count.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/KernelUtil.h"
#include "runtime/cpu/ThreadPool.h"
#include "runtime/cpu/VecMath.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dlopt::rt::cpu {
namespace {

/// log(sum_j e^row[j]) in double, max-shifted; ex is scratch.
DLOPT_SIMD_CLONES double logSumExp(const float *row, float *ex, int64_t c) {
  float m = vm::rowMax(row, c);
  vm::expShifted(row, c, m, ex);
  return double(m) + std::log(vm::rowSumF64(ex, c));
}

Status crossEntropyKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &tl = ins[0].type, &ty = ins[1].type;
  int64_t ignore = -100;
  DLOPT_RETURN_IF_ERROR(getOptIntAttr(instr, "ignore_index", ignore));
  int64_t n = tl.shape[0], c = tl.shape[1];
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    labels[i] = ty.dtype == DType::I32 ? int64_t(ins[1].as<int32_t>()[i])
                                       : ins[1].as<int64_t>()[i];
    if (labels[i] != ignore && (labels[i] < 0 || labels[i] >= c))
      return opError(instr, "label " + std::to_string(labels[i]) + " of row " +
                                std::to_string(i) + " is outside [0, " +
                                std::to_string(c) + ") and not ignore_index (" +
                                std::to_string(ignore) + ")");
  }
  return dispatchFloat(tl.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>();
    std::vector<double> rowLoss(size_t(n), 0.0);
    parallelFor(n, grainFor(c * 20), [&](int64_t b, int64_t e) {
      std::vector<float> buf(size_t(2 * c));
      float *row = buf.data(), *ex = buf.data() + c;
      for (int64_t i = b; i < e; ++i) {
        if (labels[i] == ignore)
          continue;
        loadF32(x + i * c, row, c);
        rowLoss[i] = logSumExp(row, ex, c) - double(row[labels[i]]);
      }
    });
    double total = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i)
      if (labels[i] != ignore) {
        total += rowLoss[i];
        ++count;
      }
    // The loss in the result's type: the logits' or f32.
    float loss = count ? float(total / double(count)) : 0.0f;
    if (outs[0].type.dtype == DType::F32)
      outs[0].as<float>()[0] = loss;
    else
      outs[0].as<T>()[0] = fromF32<T>(loss);
    return Status::ok();
  });
}

Status mseKernel(const Instr &, Ins ins, Outs outs) {
  const TensorType &ta = ins[0].type;
  int64_t n = ta.numElements();
  constexpr int64_t kChunk = 1 << 16;
  int64_t numChunks = (n + kChunk - 1) / kChunk;
  return dispatchFloat(ta.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *a = ins[0].as<T>(), *b = ins[1].as<T>();
    // Fixed chunks, so the summation order does not depend on threads.
    std::vector<double> partial(size_t(numChunks), 0.0);
    parallelFor(numChunks, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t ch = cb; ch < ce; ++ch) {
        double s = 0;
        for (int64_t i = ch * kChunk, e = std::min(n, i + kChunk); i < e; ++i) {
          double d = double(toF32(a[i])) - double(toF32(b[i]));
          s += d * d;
        }
        partial[ch] = s;
      }
    });
    double total = 0;
    for (double p : partial)
      total += p;
    outs[0].as<T>()[0] = fromF32<T>(
        n ? float(total / double(n)) : std::numeric_limits<float>::quiet_NaN());
    return Status::ok();
  });
}

} // namespace

void registerLossKernels(KernelRegistry &r) {
  r["cross_entropy"] = crossEntropyKernel;
  r["mse"] = mseKernel;
}

} // namespace dlopt::rt::cpu
