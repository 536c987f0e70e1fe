//===- Common.cuh - Shared device helpers of the dlopt CUDA kernels -------===//
//
// The per-element math of ElementMath.cuh (16-bit float storage types and
// their conversions, unary and binary functions), dtype dispatch on the host,
// strided index arithmetic, block reductions, and the error-word helper.
// Math is f32 (statistics in f64, as the CPU kernels do), never fast-math.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/kernels/ElementMath.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dlopt::rt::cuda::kernels {

template <typename T> struct IsFloatStorage {
  static constexpr bool value = false;
};
template <> struct IsFloatStorage<float> {
  static constexpr bool value = true;
};
template <> struct IsFloatStorage<F16> {
  static constexpr bool value = true;
};
template <> struct IsFloatStorage<BF16> {
  static constexpr bool value = true;
};

constexpr int kThreads = 256;

/// Blocks for a grid-stride loop over n items.
inline unsigned gridFor(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1)
    b = 1;
  if (b > 65535 * 8)
    b = 65535 * 8;
  return unsigned(b);
}

#define DLOPT_GRID_STRIDE(i, n)                                                \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);    \
       i += int64_t(blockDim.x) * gridDim.x)

//===--- Host dtype dispatch: fn receives a storage-type tag ---------------===//

template <typename Fn> int dispatchFloat(DType t, Fn &&fn) {
  switch (t) {
  case DType::F32: return fn(float{});
  case DType::F16: return fn(F16{});
  case DType::BF16: return fn(BF16{});
  default: return int(cudaErrorInvalidValue);
  }
}
template <typename Fn> int dispatchNumeric(DType t, Fn &&fn) {
  switch (t) {
  case DType::I32: return fn(int32_t{});
  case DType::I64: return fn(int64_t{});
  default: return dispatchFloat(t, fn);
  }
}
/// All six types; i1 travels as uint8_t.
template <typename Fn> int dispatchAny(DType t, Fn &&fn) {
  if (t == DType::I1)
    return fn(uint8_t{});
  return dispatchNumeric(t, fn);
}
template <typename Fn> int dispatchBySize(int bytes, Fn &&fn) {
  switch (bytes) {
  case 1: return fn(uint8_t{});
  case 2: return fn(uint16_t{});
  case 4: return fn(uint32_t{});
  case 8: return fn(uint64_t{});
  default: return int(cudaErrorInvalidValue);
  }
}

inline int lastError() { return int(cudaGetLastError()); }

//===--- Strided indexing ----------------------------------------------------===//

/// Element offsets of operands [0, N) at flat index i of `ix`.
template <int N>
__device__ __forceinline__ void stridedOffsets(const StridedIndex &ix,
                                               int64_t i, int64_t (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k)
    off[k] = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d >= ix.rank)
      continue;
    int64_t c = i % ix.size[d];
    i /= ix.size[d];
#pragma unroll
    for (int k = 0; k < N; ++k)
      off[k] += c * ix.stride[k][d];
  }
}

//===--- Reductions -------------------------------------------------------===//

__device__ __forceinline__ double warpSum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2)
    v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

/// Max that keeps NaN (as the CPU's max over dims and softmax do).
__device__ __forceinline__ float nanMax(float a, float b) {
  if (a != a)
    return a;
  if (b != b)
    return b;
  return a > b ? a : b;
}

__device__ __forceinline__ float warpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2)
    v = nanMax(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
/// thread gets the result. Uses 33 doubles of shared memory.
__device__ __forceinline__ double blockSum(double v) {
  __shared__ double part[33];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warpSum(v);
  __syncthreads(); // `part` may still be read by a previous call
  if (lane == 0)
    part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double w = lane < int(blockDim.x / 32) ? part[lane] : 0.0;
    w = warpSum(w);
    if (lane == 0)
      part[32] = w;
  }
  __syncthreads();
  return part[32];
}

__device__ __forceinline__ float blockMax(float v) {
  __shared__ float part[33];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warpMax(v);
  __syncthreads();
  if (lane == 0)
    part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < int(blockDim.x / 32) ? part[lane] : -INFINITY;
    w = warpMax(w);
    if (lane == 0)
      part[32] = w;
  }
  __syncthreads();
  return part[32];
}

//===--- Data-dependent errors ---------------------------------------------===//

/// Records the first error of a run (later ones are dropped).
__device__ __forceinline__ void raise(DeviceError *err, int code, int tag,
                                      long long a, long long b, long long c) {
  if (!err)
    return;
  if (atomicCAS(&err->code, 0, -1) == 0) {
    err->tag = tag;
    err->a = a;
    err->b = b;
    err->c = c;
    __threadfence();
    atomicExch(&err->code, code);
  }
}

/// Reads element i of an int tensor given as i32 or i64.
__device__ __forceinline__ int64_t loadId(const void *p, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t *>(p)[i]
              : int64_t(static_cast<const int32_t *>(p)[i]);
}

} // namespace dlopt::rt::cuda::kernels
