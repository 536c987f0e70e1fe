//===- ElementMath.cuh - Per-element math of the elementwise kernels ------===//
//
// f16/bf16 storage types and their f32 conversions (the CPU backend's
// rounding, runtime/cpu/Half.h: round to nearest even), the unary and binary
// functions, and the vector loads and stores of the fused kernels. Shared
// by the nvcc-built kernels and the fused kernels NVRTC compiles at run time
// (FusedJit.cpp), so both compute every element the same way. Includes only
// ElementOps.h, and no CUDA header: the f16 conversions are the PTX
// instructions cuda_fp16.h's __half2float / __float2half_rn wrap.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/cuda/kernels/ElementOps.h"

namespace dlopt::rt::cuda::kernels {

struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

__device__ __forceinline__ float toF(float x) { return x; }
__device__ __forceinline__ float toF(F16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}
__device__ __forceinline__ float toF(BF16 x) {
  return __uint_as_float(uint32_t(x.bits) << 16);
}

template <typename T> __device__ __forceinline__ T fromF(float x);
template <> __device__ __forceinline__ float fromF<float>(float x) { return x; }
template <> __device__ __forceinline__ F16 fromF<F16>(float x) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return F16{h};
}
template <> __device__ __forceinline__ BF16 fromF<BF16>(float x) {
  // Bit-identical to runtime/cpu/Half.h floatToBf16.
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    return BF16{uint16_t((u >> 16) | 0x0040u)};
  u += 0x7FFFu + ((u >> 16) & 1u);
  return BF16{uint16_t(u >> 16)};
}

//===--- Unary and binary functions (f32) ------------------------------===//

__device__ __forceinline__ float unaryF(UnaryOp op, float x) {
  switch (op) {
  case UnaryOp::Neg: return -x;
  case UnaryOp::Abs: return fabsf(x);
  case UnaryOp::Relu: return x < 0.0f ? 0.0f : x; // NaN stays NaN
  case UnaryOp::Exp: return expf(x);
  case UnaryOp::Log: return logf(x);
  case UnaryOp::Sqrt: return sqrtf(x);
  case UnaryOp::Rsqrt: return 1.0f / sqrtf(x);
  case UnaryOp::Tanh: return tanhf(x);
  case UnaryOp::Sin: return sinf(x);
  case UnaryOp::Cos: return cosf(x);
  case UnaryOp::Sigmoid: return 1.0f / (1.0f + expf(-x));
  case UnaryOp::Silu: return x / (1.0f + expf(-x));
  case UnaryOp::GeluErf:
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  case UnaryOp::GeluTanh:
    return 0.5f * x *
           (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  }
  return x;
}

__device__ __forceinline__ float geluDeriv(float x, bool tanhForm) {
  if (tanhForm) {
    const float c = 0.79788456080286536f, k = 0.044715f;
    float t = tanhf(c * (x + k * x * x * x));
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * k * x * x);
  }
  return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) +
         x * 0.39894228040143268f * expf(-0.5f * x * x);
}

__device__ __forceinline__ float binaryF(BinaryOp op, float a, float b) {
  switch (op) {
  case BinaryOp::Add: return a + b;
  case BinaryOp::Sub: return a - b;
  case BinaryOp::Mul: return a * b;
  case BinaryOp::Div: return a / b;
  case BinaryOp::Max: return a != a ? a : (b != b ? b : (a > b ? a : b));
  case BinaryOp::Min: return a != a ? a : (b != b ? b : (a < b ? a : b));
  case BinaryOp::Pow: return powf(a, b);
  case BinaryOp::GeluErfGrad: return b * geluDeriv(a, false);
  case BinaryOp::GeluTanhGrad: return b * geluDeriv(a, true);
  }
  return a;
}

/// `a p b` for the compare kernel (floats widened to f32, or integers) and
/// the fused comparison steps; NaN compares unequal to everything.
template <typename T>
__device__ __forceinline__ bool comparePred(ComparePred p, T a, T b) {
  switch (p) {
  case ComparePred::Eq: return a == b;
  case ComparePred::Ne: return a != b;
  case ComparePred::Lt: return a < b;
  case ComparePred::Le: return a <= b;
  case ComparePred::Gt: return a > b;
  default: return a >= b;
  }
}

/// A fused comparison step: 1.0 where it holds, 0.0 elsewhere.
__device__ __forceinline__ float compareF(ComparePred p, float a, float b) {
  return comparePred(p, a, b) ? 1.0f : 0.0f;
}

//===--- Vector loads and stores of the fused kernels -------------------===//

template <typename T>
__device__ __forceinline__ void loadVec(const void *p, int64_t i0, int cnt,
                                        bool vec, float (&dst)[kFusedVec]) {
  const T *x = static_cast<const T *>(p) + i0;
  if (vec && cnt == kFusedVec) {
    if constexpr (sizeof(T) == 4) {
      float4 v = *reinterpret_cast<const float4 *>(x);
      dst[0] = v.x; dst[1] = v.y; dst[2] = v.z; dst[3] = v.w;
    } else {
      uint2 v = *reinterpret_cast<const uint2 *>(x);
      T e[4] = {T{uint16_t(v.x & 0xFFFFu)}, T{uint16_t(v.x >> 16)},
                T{uint16_t(v.y & 0xFFFFu)}, T{uint16_t(v.y >> 16)}};
      for (int u = 0; u < kFusedVec; ++u)
        dst[u] = toF(e[u]);
    }
    return;
  }
  // Unrolled with constant indices, so `dst` can stay in registers.
#pragma unroll
  for (int u = 0; u < kFusedVec; ++u)
    if (u < cnt)
      dst[u] = toF(x[u]);
}

template <typename T>
__device__ __forceinline__ void storeVec(void *p, int64_t i0, int cnt,
                                         bool vec, const float (&src)[kFusedVec]) {
  T *y = static_cast<T *>(p) + i0;
  if (vec && cnt == kFusedVec) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float4 *>(y) = make_float4(src[0], src[1], src[2], src[3]);
    } else {
      uint32_t h[4];
      for (int u = 0; u < kFusedVec; ++u)
        h[u] = fromF<T>(src[u]).bits;
      *reinterpret_cast<uint2 *>(y) = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
    }
    return;
  }
#pragma unroll
  for (int u = 0; u < kFusedVec; ++u)
    if (u < cnt)
      y[u] = fromF<T>(src[u]);
}

} // namespace dlopt::rt::cuda::kernels
