//===- Elementwise.cu - unary, cast, binary, compare, select, copies ------===//
//
// One generic strided kernel per family: the op is a run-time switch (the
// branch is uniform across a launch, so it costs nothing next to the memory
// traffic) and the element type a template parameter. Operands flagged
// contiguous skip the index arithmetic. Semantics follow runtime/cpu
// (Elementwise.cpp, NN.cpp dropout, Grad.cpp gelu_grad) operation for
// operation, so f32 results agree to rounding and data movement is exact.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/kernels/Common.cuh"

#include <cuda_runtime_api.h>

#include <type_traits>

namespace dlopt::rt::cuda::kernels {
namespace {

//===--- Unary ----------------------------------------------------------===//

template <typename I> __device__ __forceinline__ I unaryI(UnaryOp op, I x) {
  using U = typename std::make_unsigned<I>::type;
  switch (op) {
  case UnaryOp::Neg: return I(U(0) - U(x));
  case UnaryOp::Abs: return x < 0 ? I(U(0) - U(x)) : x;
  default: return x < 0 ? I(0) : x; // Relu
  }
}

template <typename T>
__global__ void unaryKernel(UnaryOp op, const T *x, T *y, int64_t n) {
  DLOPT_GRID_STRIDE(i, n) {
    if constexpr (IsFloatStorage<T>::value)
      y[i] = fromF<T>(unaryF(op, toF(x[i])));
    else
      y[i] = unaryI(op, x[i]);
  }
}

//===--- Cast -------------------------------------------------------------===//

/// Saturating, truncating float -> int (NaN -> 0), as runtime/cpu floatToInt.
template <typename I> __device__ __forceinline__ I floatToInt(double x) {
  if (x != x)
    return 0;
  const double lo = sizeof(I) == 8 ? -9223372036854775808.0 : -2147483648.0;
  const double hi = -lo;
  if (x >= hi)
    return sizeof(I) == 8 ? I(0x7FFFFFFFFFFFFFFFll) : I(0x7FFFFFFF);
  if (x <= lo)
    return sizeof(I) == 8 ? I(-0x7FFFFFFFFFFFFFFFll - 1) : I(-0x7FFFFFFF - 1);
  return I(x);
}

template <typename D, typename S> __device__ __forceinline__ D castElem(S x) {
  constexpr bool sf = IsFloatStorage<S>::value, df = IsFloatStorage<D>::value;
  constexpr bool sb = std::is_same<S, uint8_t>::value;
  if constexpr (std::is_same<D, uint8_t>::value) {
    if constexpr (sf)
      return toF(x) != 0.0f ? 1 : 0;
    else
      return x != 0 ? 1 : 0;
  } else if constexpr (df) {
    if constexpr (sf)
      return fromF<D>(toF(x));
    else if constexpr (sb)
      return fromF<D>(x != 0 ? 1.0f : 0.0f);
    else
      return fromF<D>(float(x));
  } else {
    if constexpr (sf)
      return floatToInt<D>(double(toF(x)));
    else if constexpr (sb)
      return D(x != 0 ? 1 : 0);
    else
      return D(x); // int -> int wraps
  }
}

template <typename D, typename S>
__global__ void castKernel(const S *x, D *y, int64_t n) {
  DLOPT_GRID_STRIDE(i, n) { y[i] = castElem<D>(x[i]); }
}

//===--- Binary -----------------------------------------------------------===//

template <typename T>
__global__ void binaryKernel(BinaryOp op, StridedIndex ix, const T *a,
                             const T *b, T *out, int64_t n, DeviceError *err,
                             int tag) {
  bool fast = ix.contiguous[0] && ix.contiguous[1];
  DLOPT_GRID_STRIDE(i, n) {
    int64_t off[2] = {i, i};
    if (!fast)
      stridedOffsets<2>(ix, i, off);
    T x = a[off[0]], y = b[off[1]];
    if constexpr (IsFloatStorage<T>::value) {
      out[i] = fromF<T>(binaryF(op, toF(x), toF(y)));
    } else {
      using U = typename std::make_unsigned<T>::type;
      T r;
      switch (op) {
      case BinaryOp::Add: r = T(U(x) + U(y)); break;
      case BinaryOp::Sub: r = T(U(x) - U(y)); break;
      case BinaryOp::Mul: r = T(U(x) * U(y)); break;
      case BinaryOp::Div:
        if (y == 0) {
          raise(err, kErrIntDivByZero, tag, 0, off[1], 0);
          r = 0;
        } else {
          r = y == -1 ? T(U(0) - U(x)) : T(x / y);
        }
        break;
      case BinaryOp::Max: r = x > y ? x : y; break;
      default: r = x < y ? x : y; break; // Min
      }
      out[i] = r;
    }
  }
}

template <typename T>
__global__ void compareKernel(ComparePred p, StridedIndex ix, const T *a,
                              const T *b, uint8_t *out, int64_t n) {
  bool fast = ix.contiguous[0] && ix.contiguous[1];
  DLOPT_GRID_STRIDE(i, n) {
    int64_t off[2] = {i, i};
    if (!fast)
      stridedOffsets<2>(ix, i, off);
    if constexpr (IsFloatStorage<T>::value)
      out[i] = comparePred(p, toF(a[off[0]]), toF(b[off[1]]));
    else
      out[i] = comparePred(p, a[off[0]], b[off[1]]);
  }
}

template <typename T>
__global__ void selectKernel(StridedIndex ix, const uint8_t *c, const T *a,
                             const T *b, T *out, int64_t n) {
  bool fast = ix.contiguous[0] && ix.contiguous[1] && ix.contiguous[2];
  DLOPT_GRID_STRIDE(i, n) {
    int64_t off[3] = {i, i, i};
    if (!fast)
      stridedOffsets<3>(ix, i, off);
    out[i] = c[off[0]] ? a[off[1]] : b[off[2]];
  }
}

template <typename T>
__global__ void stridedCopyKernel(StridedIndex ix, const T *src, T *dst,
                                  int64_t n) {
  DLOPT_GRID_STRIDE(i, n) {
    int64_t off[2] = {i, i};
    if (!(ix.contiguous[0] && ix.contiguous[1]))
      stridedOffsets<2>(ix, i, off);
    dst[off[0]] = src[off[1]];
  }
}

template <typename T>
__global__ void iotaKernel(T *y, int64_t n, int64_t size, int64_t inner) {
  DLOPT_GRID_STRIDE(i, n) {
    int64_t v = (i / inner) % size;
    if constexpr (IsFloatStorage<T>::value)
      y[i] = fromF<T>(float(v));
    else
      y[i] = T(v);
  }
}

//===--- Dropout (docs/ops.md: the counter-based uniform) -----------------===//

__device__ __forceinline__ double dropoutUniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z = z ^ (z >> 31);
  return double(z >> 40) * 0x1p-24;
}

template <typename T>
__global__ void dropoutKernel(const T *x, T *y, int64_t n, uint64_t seed,
                              const void *offset, bool offset64, double rate,
                              float scale) {
  int64_t o = offset ? loadId(offset, offset64, 0) : 0;
  uint64_t s = seed + uint64_t(o) * 0xD1B54A32D192ED03ull;
  DLOPT_GRID_STRIDE(i, n) {
    y[i] = dropoutUniform(s, uint64_t(i)) >= rate ? fromF<T>(toF(x[i]) * scale)
                                                  : fromF<T>(0.0f);
  }
}


//===--- Fused elementwise ------------------------------------------------===//
//
// An interpreter of the per-element program in the launch parameters (the
// branch on each step is uniform across the launch). Each thread evaluates
// kFusedVec consecutive elements together, so each step is decoded once per
// kFusedVec elements and the loads/stores can be vectors. The register file
// is indexed at run time, so it lives in local memory (1.8 KiB per thread):
// the fallback when NVRTC is missing. The default is a kernel generated for
// each program (runtime/cuda/FusedJit.h, kernels/FusedJitLaunch.cpp).

__device__ __forceinline__ void loadAny(uint8_t t, const void *p, int64_t i0,
                                        int cnt, bool vec,
                                        float (&dst)[kFusedVec]) {
  if (t == uint8_t(DType::F16))
    loadVec<F16>(p, i0, cnt, vec, dst);
  else if (t == uint8_t(DType::BF16))
    loadVec<BF16>(p, i0, cnt, vec, dst);
  else
    loadVec<float>(p, i0, cnt, vec, dst);
}

__device__ __forceinline__ float roundTo(uint8_t t, float x) {
  if (t == uint8_t(DType::F16))
    return toF(fromF<F16>(x));
  if (t == uint8_t(DType::BF16))
    return toF(fromF<BF16>(x));
  return x;
}

__device__ __forceinline__ void storeAny(uint8_t t, void *y, int64_t i0,
                                         int cnt, bool vec,
                                         const float (&src)[kFusedVec]) {
  if (t == uint8_t(DType::F16))
    storeVec<F16>(y, i0, cnt, vec, src);
  else if (t == uint8_t(DType::BF16))
    storeVec<BF16>(y, i0, cnt, vec, src);
  else
    storeVec<float>(y, i0, cnt, vec, src);
}

/// Runs a fused program's steps over the registers: step s writes register
/// firstStep + s from its operand registers (FusedArgs and FusedMultiArgs
/// carry the same step table).
template <class Args>
__device__ __forceinline__ void
runFusedSteps(const Args &args, int firstStep,
              float (&r)[kFusedMaxRegisters][kFusedVec]) {
  for (int s = 0; s < args.numSteps; ++s) {
    const FusedStep st = args.steps[s];
    float *d = r[firstStep + s];
    const float *a = r[st.a], *b = r[st.b], *c = r[st.c];
    if (st.kind == 0) {
      for (int u = 0; u < kFusedVec; ++u)
        d[u] = unaryF(UnaryOp(st.op), a[u]);
    } else if (st.kind == 1) {
      for (int u = 0; u < kFusedVec; ++u)
        d[u] = binaryF(BinaryOp(st.op), a[u], b[u]);
    } else if (st.kind == 3) {
      for (int u = 0; u < kFusedVec; ++u)
        d[u] = compareF(ComparePred(st.op), a[u], b[u]);
    } else if (st.kind == 4) {
      for (int u = 0; u < kFusedVec; ++u)
        d[u] = a[u] != 0.0f ? b[u] : c[u];
    } else {
      for (int u = 0; u < kFusedVec; ++u)
        d[u] = roundTo(st.op, a[u]);
    }
  }
}

__global__ void fusedKernel(const FusedArgs args, int64_t n, bool vec) {
  float r[kFusedMaxRegisters][kFusedVec];
  const int numIn = args.numInputs, numConst = args.numConsts;
  for (int k = 0; k < numIn; ++k)
    if (args.inScalar[k]) {
      float v[kFusedVec];
      loadAny(args.inType[k], args.in[k], 0, 1, false, v);
      for (int u = 0; u < kFusedVec; ++u)
        r[k][u] = v[0];
    }
  for (int c = 0; c < numConst; ++c)
    for (int u = 0; u < kFusedVec; ++u)
      r[numIn + c][u] = args.consts[c];
  const int firstStep = numIn + numConst;
  int64_t chunks = (n + kFusedVec - 1) / kFusedVec;
  DLOPT_GRID_STRIDE(chunk, chunks) {
    int64_t i0 = chunk * kFusedVec;
    int cnt = n - i0 < kFusedVec ? int(n - i0) : kFusedVec;
    for (int k = 0; k < numIn; ++k)
      if (!args.inScalar[k])
        loadAny(args.inType[k], args.in[k], i0, cnt, vec, r[k]);
    runFusedSteps(args, firstStep, r);
    for (int o = 0; o < args.numOutputs; ++o)
      storeAny(args.outType[o], args.out[o], i0, cnt, vec, r[args.outReg[o]]);
  }
}

static_assert(kFusedChunk == int64_t(kThreads) * kFusedVec,
              "CudaKernels.h's kFusedChunk must be kThreads * kFusedVec");

/// Multi-tensor form: block -> (segment, chunk) through the segment table in
/// the parameters; each thread takes kFusedVec consecutive elements.
__global__ void fusedMultiKernel(const FusedMultiArgs args) {
  const int b = int(blockIdx.x);
  int lo = 0, hi = args.numSegments - 1; // last segment starting at or before b
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (args.blockStart[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int seg = lo;
  const int64_t n = args.n[seg];
  const int64_t i0 =
      (int64_t(b - args.blockStart[seg]) * kThreads + threadIdx.x) * kFusedVec;
  if (i0 >= n)
    return;
  const int cnt = n - i0 < kFusedVec ? int(n - i0) : kFusedVec;
  const bool vec = args.vec[seg] != 0;
  void *const *row = args.ptr + int64_t(seg) * args.rowWidth;
  float r[kFusedMaxRegisters][kFusedVec];
  const int numIn = args.numInputs, numConst = args.numConsts;
  for (int k = 0; k < numIn; ++k) {
    const void *p = args.inSlot[k] < 0 ? args.shared[k] : row[args.inSlot[k]];
    if (args.inScalar[k]) {
      float v[kFusedVec];
      loadAny(args.inType[k], p, 0, 1, false, v);
      for (int u = 0; u < kFusedVec; ++u)
        r[k][u] = v[0];
    } else {
      loadAny(args.inType[k], p, i0, cnt, vec, r[k]);
    }
  }
  for (int c = 0; c < numConst; ++c)
    for (int u = 0; u < kFusedVec; ++u)
      r[numIn + c][u] = args.consts[c];
  const int firstStep = numIn + numConst;
  runFusedSteps(args, firstStep, r);
  const int firstOut = args.rowWidth - args.numOutputs;
  for (int o = 0; o < args.numOutputs; ++o)
    storeAny(args.outType[o], row[firstOut + o], i0, cnt, vec,
             r[args.outReg[o]]);
}

} // namespace

//===----------------------------------------------------------------------===//
// Launchers
//===----------------------------------------------------------------------===//

int unary(Stream s, UnaryOp op, DType t, const void *x, void *y, int64_t n) {
  if (n == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchNumeric(t, [&](auto tag) {
    using T = decltype(tag);
    unaryKernel<T><<<gridFor(n), kThreads, 0, st>>>(
        op, static_cast<const T *>(x), static_cast<T *>(y), n);
    return lastError();
  });
}

int cast(Stream s, DType from, DType to, const void *x, void *y, int64_t n) {
  if (n == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchAny(from, [&](auto stag) {
    using S = decltype(stag);
    return dispatchAny(to, [&](auto dtag) {
      using D = decltype(dtag);
      castKernel<D, S><<<gridFor(n), kThreads, 0, st>>>(
          static_cast<const S *>(x), static_cast<D *>(y), n);
      return lastError();
    });
  });
}

int binary(Stream s, BinaryOp op, DType t, const StridedIndex &idx,
           const void *a, const void *b, void *out, int64_t n,
           DeviceError *err, int tag) {
  if (n == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchNumeric(t, [&](auto ttag) {
    using T = decltype(ttag);
    binaryKernel<T><<<gridFor(n), kThreads, 0, st>>>(
        op, idx, static_cast<const T *>(a), static_cast<const T *>(b),
        static_cast<T *>(out), n, err, tag);
    return lastError();
  });
}

int compare(Stream s, ComparePred p, DType t, const StridedIndex &idx,
            const void *a, const void *b, void *out, int64_t n) {
  if (n == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchNumeric(t, [&](auto ttag) {
    using T = decltype(ttag);
    compareKernel<T><<<gridFor(n), kThreads, 0, st>>>(
        p, idx, static_cast<const T *>(a), static_cast<const T *>(b),
        static_cast<uint8_t *>(out), n);
    return lastError();
  });
}

int select(Stream s, int elemBytes, const StridedIndex &idx, const void *c,
           const void *a, const void *b, void *out, int64_t n) {
  if (n == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchBySize(elemBytes, [&](auto ttag) {
    using T = decltype(ttag);
    selectKernel<T><<<gridFor(n), kThreads, 0, st>>>(
        idx, static_cast<const uint8_t *>(c), static_cast<const T *>(a),
        static_cast<const T *>(b), static_cast<T *>(out), n);
    return lastError();
  });
}

int stridedCopy(Stream s, int elemBytes, const StridedIndex &idx,
                const void *src, void *dst, int64_t n) {
  if (n == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchBySize(elemBytes, [&](auto ttag) {
    using T = decltype(ttag);
    stridedCopyKernel<T><<<gridFor(n), kThreads, 0, st>>>(
        idx, static_cast<const T *>(src), static_cast<T *>(dst), n);
    return lastError();
  });
}

int iota(Stream s, DType t, void *y, int64_t n, int64_t size, int64_t inner) {
  if (n == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchNumeric(t, [&](auto ttag) {
    using T = decltype(ttag);
    iotaKernel<T><<<gridFor(n), kThreads, 0, st>>>(static_cast<T *>(y), n,
                                                   size, inner);
    return lastError();
  });
}

int dropout(Stream s, DType t, const void *x, void *y, int64_t n,
            uint64_t seed, const void *offset, DType offsetType, double rate,
            float scale) {
  if (n == 0)
    return 0;
  auto st = static_cast<cudaStream_t>(s);
  return dispatchFloat(t, [&](auto ttag) {
    using T = decltype(ttag);
    dropoutKernel<T><<<gridFor(n), kThreads, 0, st>>>(
        static_cast<const T *>(x), static_cast<T *>(y), n, seed, offset,
        offsetType == DType::I64, rate, scale);
    return lastError();
  });
}


bool fusedVectorizable(const FusedArgs &args) {
  auto aligned = [](const void *p, uint8_t t) {
    uintptr_t need = t == uint8_t(DType::F32) ? 16 : 8;
    return reinterpret_cast<uintptr_t>(p) % need == 0;
  };
  for (int k = 0; k < args.numInputs; ++k)
    if (!args.inScalar[k] && !aligned(args.in[k], args.inType[k]))
      return false;
  for (int o = 0; o < args.numOutputs; ++o)
    if (!aligned(args.out[o], args.outType[o]))
      return false;
  return true;
}

int fusedElementwiseInterpreted(Stream s, const FusedArgs &args, int64_t n) {
  if (n == 0)
    return 0;
  const bool vec = fusedVectorizable(args);
  int64_t chunks = (n + kFusedVec - 1) / kFusedVec;
  fusedKernel<<<gridFor(chunks), kThreads, 0, static_cast<cudaStream_t>(s)>>>(
      args, n, vec);
  return lastError();
}

int fusedElementwiseMultiInterpreted(Stream s, const FusedMultiArgs &args) {
  if (args.numSegments <= 0 || args.blockStart[args.numSegments] == 0)
    return 0;
  fusedMultiKernel<<<unsigned(args.blockStart[args.numSegments]), kThreads, 0,
                     static_cast<cudaStream_t>(s)>>>(args);
  return lastError();
}

} // namespace dlopt::rt::cuda::kernels
