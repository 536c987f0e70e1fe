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
#include "runtime/format/OpTable.h"

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
template <typename T>
inline void finishF32(const TensorRef &t, const float *buf) {
  if constexpr (!std::is_same_v<T, float>)
    storeF32(buf, t.as<T>(), t.numElements());
}

//===----------------------------------------------------------------------===//
// Errors and checks
//===----------------------------------------------------------------------===//

/// The optional rank-0 i32/i64 operand `index` (a position offset: dropout,
/// rope, attention), or `otherwise` when the instruction has no such
/// operand. Its type was checked by the verifier.
int64_t optionalScalarInt(Ins ins, size_t index, int64_t otherwise);

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

/// Query rows per [rows, T] score buffer of attention and attention_grad
/// (a function of the shape only: the chunks fix the GEMM calls).
int64_t attentionRowChunk(int64_t rowsPerGroup, int64_t t);

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
