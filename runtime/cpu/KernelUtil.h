//===- KernelUtil.h - Shared helpers for the CPU kernels (internal) -------===//
//
// Error formatting, operand checks, dtype dispatch, 16-bit float storage
// types, and the broadcast iteration plan used by every elementwise kernel.
// Not part of the runtime's public interface.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/cpu/CpuKernels.h"
#include "runtime/cpu/Half.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace dlopt::rt::cpu {

using Ins = std::span<const TensorRef>;
using Outs = std::span<const TensorRef>;
using KernelFn = Status (*)(const Instr &, Ins, Outs);
using KernelRegistry = std::unordered_map<std::string, KernelFn>;

/// Each kernel file adds its ops to the registry (CpuKernels.cpp).
void registerElementwiseKernels(KernelRegistry &r);
void registerReduceKernels(KernelRegistry &r);
void registerMatmulKernels(KernelRegistry &r);
void registerShapeKernels(KernelRegistry &r);
void registerNNKernels(KernelRegistry &r);
void registerConvKernels(KernelRegistry &r);
void registerLossKernels(KernelRegistry &r);
void registerGradKernels(KernelRegistry &r);

//===----------------------------------------------------------------------===//
// 16-bit float storage
//===----------------------------------------------------------------------===//

/// Distinct storage types so templates can tell f16 from bf16.
struct Half16 {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline float toF32(float x) { return x; }
inline float toF32(Half16 x) { return halfToFloat(x.bits); }
inline float toF32(BFloat16 x) { return bf16ToFloat(x.bits); }

template <typename T> inline T fromF32(float x);
template <> inline float fromF32<float>(float x) { return x; }
template <> inline Half16 fromF32<Half16>(float x) {
  return Half16{floatToHalf(x)};
}
template <> inline BFloat16 fromF32<BFloat16>(float x) {
  return BFloat16{floatToBf16(x)};
}

template <typename T>
inline constexpr bool isFloatStorage =
    std::is_same_v<T, float> || std::is_same_v<T, Half16> ||
    std::is_same_v<T, BFloat16>;

/// Loads `n` elements of a float tensor into f32 (a copy for f32 too, so the
/// caller may scribble on it).
template <typename T> inline void loadF32(const T *src, float *dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    std::memcpy(dst, src, size_t(n) * sizeof(float));
  else
    for (int64_t i = 0; i < n; ++i)
      dst[i] = toF32(src[i]);
}
template <typename T>
inline void storeF32(const float *src, T *dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    std::memcpy(dst, src, size_t(n) * sizeof(float));
  else
    for (int64_t i = 0; i < n; ++i)
      dst[i] = fromF32<T>(src[i]);
}

/// f32 view of a float tensor: the tensor itself for f32, else a widened
/// copy kept in `buf`.
template <typename T>
inline const float *asF32(const TensorRef &t, std::vector<float> &buf) {
  if constexpr (std::is_same_v<T, float>) {
    return t.as<float>();
  } else {
    buf.resize(size_t(t.numElements()));
    loadF32(t.as<T>(), buf.data(), t.numElements());
    return buf.data();
  }
}

/// f32 destination for a float result: the result itself for f32 (contents
/// unspecified), else a zeroed buffer that finishF32 stores at the end.
template <typename T>
inline float *outF32(const TensorRef &t, std::vector<float> &buf) {
  if constexpr (std::is_same_v<T, float>) {
    return t.as<float>();
  } else {
    buf.assign(size_t(t.numElements()), 0.0f);
    return buf.data();
  }
}

/// Stores an outF32 buffer into its result (a no-op for f32).
template <typename T> inline void finishF32(const TensorRef &t, const float *buf) {
  if constexpr (!std::is_same_v<T, float>)
    storeF32(buf, t.as<T>(), t.numElements());
}

//===----------------------------------------------------------------------===//
// Errors and checks
//===----------------------------------------------------------------------===//

std::string shapeStr(const std::vector<int64_t> &shape);
/// "4x8xf32" (tensor type as in MLIR, without `tensor<>`).
std::string typeStr(const TensorType &t);

/// "op 'OP' at LOC: MSG" (the location part is left out when unknown).
Status opError(const Instr &instr, const std::string &msg);

/// Checks the number of operands and results.
Status checkArity(const Instr &instr, Ins ins, Outs outs, size_t numIns,
                  size_t numOuts);
/// Like checkArity with a range of operand counts.
Status checkArityRange(const Instr &instr, Ins ins, Outs outs, size_t minIns,
                       size_t maxIns, size_t numOuts);

/// The optional rank-0 i32/i64 operand `index` (a position offset: dropout,
/// rope, attention), or `otherwise` when the instruction has no such
/// operand.
Expected<int64_t> optionalScalarInt(const Instr &instr, Ins ins, size_t index,
                                    const char *name, int64_t otherwise);

/// `what` (e.g. "operand #0") must have a float element type.
Status checkFloat(const Instr &instr, const std::string &what,
                  const TensorType &t);
/// `what` must have a float or int element type.
Status checkNumeric(const Instr &instr, const std::string &what,
                    const TensorType &t);
/// `what` must have an int (i32/i64) element type.
Status checkInt(const Instr &instr, const std::string &what,
                const TensorType &t);
/// `got` must equal `expected` (dtype and shape).
Status checkType(const Instr &instr, const std::string &what,
                 const TensorType &got, const TensorType &expected);
Status checkDType(const Instr &instr, const std::string &what, DType got,
                  DType expected);
Status checkShape(const Instr &instr, const std::string &what,
                  const std::vector<int64_t> &got,
                  const std::vector<int64_t> &expected);

/// Typed attribute reads that turn a missing/mistyped attribute into an
/// error naming the op.
Status getIntAttr(const Instr &instr, const std::string &name, int64_t &out);
Status getIntsAttr(const Instr &instr, const std::string &name,
                   std::vector<int64_t> &out);
Status getFloatAttr(const Instr &instr, const std::string &name, double &out);
/// Optional variants: `out` keeps its default when the attribute is absent.
Status getOptIntAttr(const Instr &instr, const std::string &name, int64_t &out);
Status getOptIntsAttr(const Instr &instr, const std::string &name,
                      std::vector<int64_t> &out);
Status getOptFloatAttr(const Instr &instr, const std::string &name,
                       double &out);
Status getOptBoolAttr(const Instr &instr, const std::string &name, bool &out);
Status getOptStringAttr(const Instr &instr, const std::string &name,
                        std::string &out);

/// Largest stride, padding, dilation and window size the conv and pool
/// kernels take; far above any real one, and small enough that every index
/// computed from them stays far from int64 overflow.
constexpr int64_t kMaxWindowAttr = int64_t(1) << 30;

/// Reads a 2-int attribute (stride, padding, dilation, kernel) with a
/// default; each int must lie in [minValue, kMaxWindowAttr].
inline Status getWindowPair(const Instr &instr, const std::string &name,
                            std::vector<int64_t> &out, int64_t minValue) {
  DLOPT_RETURN_IF_ERROR(getOptIntsAttr(instr, name, out));
  if (out.size() != 2 || out[0] < minValue || out[1] < minValue ||
      out[0] > kMaxWindowAttr || out[1] > kMaxWindowAttr)
    return opError(instr, "expects '" + name + "' to be 2 ints in [" +
                              std::to_string(minValue) + ", 2^30], got " +
                              shapeStr(out));
  return Status::ok();
}

/// Output size of a sliding window; -1 when the window does not fit or the
/// arithmetic would overflow.
inline int64_t windowOut(int64_t in, int64_t k, int64_t s, int64_t p,
                         int64_t dil) {
  int64_t twoP, reach, padded, span;
  if (__builtin_mul_overflow(p, int64_t(2), &twoP) ||
      __builtin_mul_overflow(dil, k - 1, &reach) ||
      __builtin_add_overflow(in, twoP, &padded) ||
      __builtin_sub_overflow(padded, reach + 1, &span) || s < 1)
    return -1;
  return span < 0 ? -1 : span / s + 1;
}

//===----------------------------------------------------------------------===//
// Dtype dispatch: fn receives a value of the storage type as a tag.
//===----------------------------------------------------------------------===//

template <typename Fn> Status dispatchFloat(DType t, Fn &&fn) {
  switch (t) {
  case DType::F32:
    return fn(float{});
  case DType::F16:
    return fn(Half16{});
  case DType::BF16:
    return fn(BFloat16{});
  default:
    return Status::error(std::string("unsupported element type ") +
                         dtypeName(t));
  }
}

template <typename Fn> Status dispatchNumeric(DType t, Fn &&fn) {
  switch (t) {
  case DType::I32:
    return fn(int32_t{});
  case DType::I64:
    return fn(int64_t{});
  default:
    return dispatchFloat(t, fn);
  }
}

/// All six element types; i1 is passed as uint8_t.
template <typename Fn> Status dispatchAny(DType t, Fn &&fn) {
  if (t == DType::I1)
    return fn(uint8_t{});
  return dispatchNumeric(t, fn);
}

/// Data movement only needs the element size.
template <typename Fn> Status dispatchBySize(DType t, Fn &&fn) {
  switch (dtypeSize(t)) {
  case 1:
    return fn(uint8_t{});
  case 2:
    return fn(uint16_t{});
  case 4:
    return fn(uint32_t{});
  case 8:
    return fn(uint64_t{});
  default:
    return Status::error("bad element size");
  }
}

//===----------------------------------------------------------------------===//
// Shapes and broadcasting
//===----------------------------------------------------------------------===//

inline int64_t product(const std::vector<int64_t> &v, size_t begin,
                       size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i)
    p *= v[i];
  return p;
}

/// Reads the required "dim" attribute and checks it is in [0, rank).
inline Status getDimAttr(const Instr &instr, size_t rank, int64_t &dim) {
  DLOPT_RETURN_IF_ERROR(getIntAttr(instr, "dim", dim));
  if (dim < 0 || dim >= int64_t(rank))
    return opError(instr, "expects 'dim' in [0, " + std::to_string(rank) +
                              "), got " + std::to_string(dim));
  return Status::ok();
}

/// A row-major shape seen as [outer, n, inner] around one dim.
struct DimSplit {
  int64_t dim = 0, outer = 1, n = 1, inner = 1;
};

/// getDimAttr, then splits `shape` around that dim.
inline Status getDimSplit(const Instr &instr, const std::vector<int64_t> &shape,
                          DimSplit &s) {
  DLOPT_RETURN_IF_ERROR(getDimAttr(instr, shape.size(), s.dim));
  s.n = shape[s.dim];
  s.inner = product(shape, s.dim + 1, shape.size());
  s.outer = product(shape, 0, s.dim);
  return Status::ok();
}

/// Row-major element strides.
std::vector<int64_t> contiguousStrides(const std::vector<int64_t> &shape);

/// NumPy broadcast of `a` and `b`; false when incompatible.
bool broadcastShapes(const std::vector<int64_t> &a,
                     const std::vector<int64_t> &b, std::vector<int64_t> &out);

/// Operands broadcast into an output shape, with size-1 dims dropped and
/// compatible neighbours merged, so the innermost dim is as long as
/// possible. Strides are in elements; broadcast dims have stride 0, and the
/// innermost stride of every operand is 0 or 1.
struct BroadcastPlan {
  std::vector<int64_t> shape;                ///< collapsed, rank >= 1
  std::vector<std::vector<int64_t>> strides; ///< one per operand
  int64_t inner() const { return shape.back(); }
  int64_t outer() const { return product(shape, 0, shape.size() - 1); }
  /// Element offset of operand `k` at the start of outer row `row`.
  int64_t rowOffset(size_t k, int64_t row) const;
};

/// Builds the plan; returns an error message (empty on success) when an
/// operand does not broadcast to `outShape`.
std::string planBroadcast(const std::vector<int64_t> &outShape,
                          const std::vector<std::vector<int64_t>> &inShapes,
                          BroadcastPlan &plan);

//===----------------------------------------------------------------------===//
// GEMM (Matmul.cpp)
//===----------------------------------------------------------------------===//

/// Row-major C = alpha * op(A) op(B) + beta * C through OpenBLAS sgemm.
/// op(A) is M x K, op(B) is K x N. Dims must fit in an int.
void gemmF32(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
             float alpha, const float *a, int64_t lda, const float *b,
             int64_t ldb, float beta, float *c, int64_t ldc);

//===----------------------------------------------------------------------===//
// Shared math (NN.cpp)
//===----------------------------------------------------------------------===//

/// Softmax (or log-softmax) of `v[0..n)` in place: max-subtracted, sums in
/// double. attention and attention_grad share it so the recomputed
/// probabilities match the forward ones bit for bit.
void softmaxInPlace(float *v, int64_t n, bool log);

/// Saturating, truncating float -> int conversion (NaN -> 0), as `cast`.
template <typename I> inline I floatToInt(double x) {
  if (x != x)
    return 0;
  // The bounds are exactly representable as doubles: -2^(n-1) and 2^(n-1).
  constexpr double lo = double(std::numeric_limits<I>::min());
  constexpr double hi = -lo;
  if (x >= hi)
    return std::numeric_limits<I>::max();
  if (x <= lo)
    return std::numeric_limits<I>::min();
  return I(x);
}

} // namespace dlopt::rt::cpu
