//===- KernelTestUtil.h - Helpers for the CPU kernel tests ----------------===//
//
// Host tensors with typed get/set through double, random fills, an Instr
// builder, index helpers for the naive float64 references, and a closeness
// check that never lets NaN pass. References in the tests are written from
// docs/ops.md and share no code with the kernels (only the 16-bit float
// conversions of Half.h, which HalfTest checks independently).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/cpu/CpuKernels.h"
#include "runtime/format/OpTable.h"
#include "runtime/cpu/Half.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace kt {

using namespace dlopt::rt;
using Shape = std::vector<int64_t>;

/// A seed from DLOPT_TEST_SEED, else from the clock; reported on failure via
/// SCOPED_TRACE so a failing case can be replayed.
inline uint32_t pickSeed() {
  if (const char *s = std::getenv("DLOPT_TEST_SEED"))
    return uint32_t(std::strtoul(s, nullptr, 10));
  return uint32_t(
      std::chrono::high_resolution_clock::now().time_since_epoch().count());
}
#define KT_SEEDED_RNG(rng)                                                     \
  const uint32_t kt_seed_ = ::kt::pickSeed();                                  \
  SCOPED_TRACE("seed " + std::to_string(kt_seed_) +                            \
               " (replay with DLOPT_TEST_SEED)");                              \
  std::mt19937 rng(kt_seed_)

inline int64_t numel(const Shape &s) {
  int64_t n = 1;
  for (int64_t d : s)
    n *= d;
  return n;
}

/// A dense host tensor.
struct Tensor {
  TensorType type;
  std::vector<uint64_t> storage; // 8-byte aligned

  Tensor() = default;
  Tensor(DType dt, Shape shape) : type{dt, std::move(shape)} {
    storage.assign(size_t((type.byteSize() + 7) / 8 + 1), 0);
  }
  int64_t size() const { return type.numElements(); }
  void *data() { return storage.data(); }
  const void *data() const { return storage.data(); }
  TensorRef ref() const {
    return TensorRef{const_cast<uint64_t *>(storage.data()), type};
  }

  /// Element i as a double (i1 as 0/1).
  double get(int64_t i) const {
    const char *p = static_cast<const char *>(data());
    switch (type.dtype) {
    case DType::F32:
      return reinterpret_cast<const float *>(p)[i];
    case DType::F16:
      return halfToFloat(reinterpret_cast<const uint16_t *>(p)[i]);
    case DType::BF16:
      return bf16ToFloat(reinterpret_cast<const uint16_t *>(p)[i]);
    case DType::I32:
      return reinterpret_cast<const int32_t *>(p)[i];
    case DType::I64:
      return double(reinterpret_cast<const int64_t *>(p)[i]);
    case DType::I1:
      return reinterpret_cast<const uint8_t *>(p)[i];
    }
    return 0;
  }
  int64_t getInt(int64_t i) const {
    if (type.dtype == DType::I64)
      return static_cast<const int64_t *>(data())[i];
    return int64_t(get(i));
  }
  /// Stores v rounded to the element type.
  void set(int64_t i, double v) {
    char *p = static_cast<char *>(data());
    switch (type.dtype) {
    case DType::F32:
      reinterpret_cast<float *>(p)[i] = float(v);
      break;
    case DType::F16:
      reinterpret_cast<uint16_t *>(p)[i] = floatToHalf(float(v));
      break;
    case DType::BF16:
      reinterpret_cast<uint16_t *>(p)[i] = floatToBf16(float(v));
      break;
    case DType::I32:
      reinterpret_cast<int32_t *>(p)[i] = int32_t(v);
      break;
    case DType::I64:
      reinterpret_cast<int64_t *>(p)[i] = int64_t(v);
      break;
    case DType::I1:
      reinterpret_cast<uint8_t *>(p)[i] = v != 0;
      break;
    }
  }
  void setInt(int64_t i, int64_t v) {
    if (type.dtype == DType::I64)
      static_cast<int64_t *>(data())[i] = v;
    else
      set(i, double(v));
  }
  std::vector<double> values() const {
    std::vector<double> v(static_cast<size_t>(size()));
    for (int64_t i = 0; i < size(); ++i)
      v[i] = get(i);
    return v;
  }
};

/// Uniform floats in [lo, hi] (rounded to the dtype) or ints in [lo, hi];
/// i1 gets random 0/1. Never all zeros for sizes > 1.
inline Tensor randomTensor(std::mt19937 &rng, DType dt, Shape shape,
                           double lo = -1.0, double hi = 1.0) {
  Tensor t(dt, std::move(shape));
  if (isFloat(dt)) {
    std::uniform_real_distribution<double> d(lo, hi);
    for (int64_t i = 0; i < t.size(); ++i)
      t.set(i, d(rng));
  } else if (dt == DType::I1) {
    std::uniform_int_distribution<int> d(0, 1);
    for (int64_t i = 0; i < t.size(); ++i)
      t.set(i, d(rng));
  } else {
    std::uniform_int_distribution<int64_t> d{int64_t(lo), int64_t(hi)};
    for (int64_t i = 0; i < t.size(); ++i)
      t.setInt(i, d(rng));
  }
  return t;
}

/// Builds an instruction with attributes.
inline Instr makeInstr(const std::string &op,
                       std::map<std::string, AttrValue> attrs = {}) {
  Instr in;
  in.op = op;
  in.attrs = std::move(attrs);
  in.loc = "test.mlir:1:1";
  return in;
}

inline Status run(const Instr &instr, const std::vector<const Tensor *> &ins,
                  const std::vector<Tensor *> &outs) {
  std::vector<TensorRef> i, o;
  for (const Tensor *t : ins)
    i.push_back(t->ref());
  for (Tensor *t : outs)
    o.push_back(t->ref());
  // As when an executable is loaded: the verifier first, then the kernel.
  std::vector<TensorType> it, ot;
  for (const TensorRef &r : i)
    it.push_back(r.type);
  for (const TensorRef &r : o)
    ot.push_back(r.type);
  if (Status st = verifyInstr(instr, it, ot); !st)
    return st;
  return cpu::runKernel(instr, i, o);
}

/// Relative tolerance for results stored in `dt` after f32 math whose own
/// relative error is about `f32Tol`.
inline double tolFor(DType dt, double f32Tol = 1e-5) {
  switch (dt) {
  case DType::F16:
    return 2e-3 + f32Tol;
  case DType::BF16:
    return 1e-2 + f32Tol;
  case DType::F32:
    return f32Tol;
  default:
    return 0;
  }
}

/// |got - ref| <= atol + rtol * |ref| elementwise (plus the f16 subnormal
/// spacing for f16 results); NaN in either fails, and infinities must match
/// exactly.
inline ::testing::AssertionResult allClose(const Tensor &got,
                                           const std::vector<double> &ref,
                                           double rtol, double atol = 0) {
  if (int64_t(ref.size()) != got.size())
    return ::testing::AssertionFailure()
           << "size mismatch: got " << got.size() << ", ref " << ref.size();
  // f16 subnormals are spaced 2^-24 apart: no result can be closer.
  if (got.type.dtype == DType::F16 && rtol > 0)
    atol += std::ldexp(1.0, -24);
  for (int64_t i = 0; i < got.size(); ++i) {
    double g = got.get(i), r = ref[i];
    bool ok;
    if (std::isnan(g) || std::isnan(r))
      ok = false;
    else if (std::isinf(r) || std::isinf(g))
      ok = g == r;
    else
      ok = std::fabs(g - r) <= atol + rtol * std::fabs(r);
    if (!ok)
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << g << ", expected " << r
             << " (rtol " << rtol << ", atol " << atol << ", type "
             << dtypeName(got.type.dtype) << ")";
  }
  return ::testing::AssertionSuccess();
}

/// Exact equality (ints, data movement); NaN never equal.
inline ::testing::AssertionResult allEqual(const Tensor &got,
                                           const std::vector<double> &ref) {
  return allClose(got, ref, 0, 0);
}

inline double maxAbs(const std::vector<double> &v) {
  double m = 0;
  for (double x : v)
    m = std::max(m, std::fabs(x));
  return m;
}

/// Row-major multi-index helpers for references.
inline Shape unravel(int64_t i, const Shape &shape) {
  Shape idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}
inline int64_t ravel(const Shape &idx, const Shape &shape) {
  int64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    i = i * shape[d] + idx[d];
  return i;
}
/// Index into `inShape` of the element that NumPy broadcasting maps to the
/// output index `outIdx`.
inline int64_t broadcastIndex(const Shape &outIdx, const Shape &inShape) {
  size_t lead = outIdx.size() - inShape.size();
  int64_t i = 0;
  for (size_t d = 0; d < inShape.size(); ++d)
    i = i * inShape[d] + (inShape[d] == 1 ? 0 : outIdx[lead + d]);
  return i;
}

inline const std::vector<DType> &floatTypes() {
  static const std::vector<DType> t{DType::F32, DType::F16, DType::BF16};
  return t;
}

} // namespace kt
