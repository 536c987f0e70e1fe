//===- ElementOps.h - Elementwise op codes and the fused-program ABI ------===//
//
// Shared by the host (CudaKernels.h, the backend), the nvcc-built kernels
// and the kernels compiled at run time by NVRTC (FusedJit.cpp hands this
// file to NVRTC as an in-memory header). It therefore includes nothing
// under NVRTC and uses only built-in types there.
//
//===----------------------------------------------------------------------===//
#pragma once

#ifdef __CUDACC_RTC__
typedef unsigned char uint8_t;
typedef signed char int8_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
#else
#include <cstdint>
#endif

namespace dlopt::rt::cuda::kernels {

enum class UnaryOp : int {
  Neg, Abs, Relu, Exp, Log, Sqrt, Rsqrt, Tanh, Sin, Cos, Sigmoid, Silu,
  GeluErf, GeluTanh
};
enum class BinaryOp : int {
  Add, Sub, Mul, Div, Max, Min, Pow,
  /// gelu_grad(x = a, dy = b) for the erf and the tanh form (same shapes).
  GeluErfGrad, GeluTanhGrad
};
/// The compare op's predicates (also a fused comparison step's `op`).
enum class ComparePred : int { Eq, Ne, Lt, Le, Gt, Ge };

//===--- Fused elementwise groups -----------------------------------------===//

/// Limits of a fused_elementwise program (equal to runtime/format/
/// FusedProgram.h's; CudaBackend.cpp static_asserts that).
inline constexpr int kFusedMaxInputs = 16;
inline constexpr int kFusedMaxOutputs = 8;
inline constexpr int kFusedMaxConsts = 32;
inline constexpr int kFusedMaxSteps = 64;
inline constexpr int kFusedMaxRegisters =
    kFusedMaxInputs + kFusedMaxConsts + kFusedMaxSteps;

/// One step: kind 0 = unaryF(UnaryOp(op), r[a]), 1 = binaryF(BinaryOp(op),
/// r[a], r[b]), 2 = round r[a] to DType(op) (a cast step), 3 =
/// compareF(ComparePred(op), r[a], r[b]) (1.0 or 0.0), 4 = select: r[a] != 0
/// ? r[b] : r[c].
struct FusedStep {
  uint8_t kind = 0, op = 0, a = 0, b = 0, c = 0;
};
/// The whole program travels in the kernel's parameters (under 1 KiB).
/// Registers: inputs, then constants, then one per step, as in the format.
struct FusedArgs {
  const void *in[kFusedMaxInputs] = {};
  void *out[kFusedMaxOutputs] = {};
  float consts[kFusedMaxConsts] = {};
  FusedStep steps[kFusedMaxSteps] = {};
  uint8_t inType[kFusedMaxInputs] = {};   ///< DType of each input
  uint8_t inScalar[kFusedMaxInputs] = {}; ///< 1 = rank 0, broadcast
  uint8_t outType[kFusedMaxOutputs] = {}; ///< DType of each result
  uint8_t outReg[kFusedMaxOutputs] = {};  ///< register of each result
  int32_t numInputs = 0, numConsts = 0, numSteps = 0, numOutputs = 0;
};
/// Multi-tensor form (a fused_elementwise with `segments` > 1): one launch
/// runs the program over up to kFusedMaxLaunchSegments segments. Block b
/// maps to (segment, chunk): segment s owns blocks [blockStart[s],
/// blockStart[s+1]) and each block covers kFusedChunk consecutive elements
/// of it (kFusedVec per thread). The segment table travels in the kernel
/// parameters (static_assert'ed under the 4 KiB limit): one row of
/// `rowWidth` pointers per segment, the per-segment inputs first (input k at
/// column inSlot[k]) then the outputs; an input that is the same buffer in
/// every segment (a shared scalar such as the learning rate) has
/// inSlot[k] = -1 and sits once in shared[k]. The backend splits an
/// instruction with more segments or pointers than fit into several
/// launches.
inline constexpr int kFusedMaxLaunchSegments = 64;
inline constexpr int kFusedMaxLaunchPointers = 304;
/// Threads per block and elements per thread of the fused kernels (4: one
/// 16-byte f32 vector).
inline constexpr int kFusedThreads = 256;
inline constexpr int kFusedVec = 4;
inline constexpr int64_t kFusedChunk = int64_t(kFusedThreads) * kFusedVec;
struct FusedMultiArgs {
  float consts[kFusedMaxConsts] = {};
  FusedStep steps[kFusedMaxSteps] = {};
  uint8_t inType[kFusedMaxInputs] = {};
  uint8_t inScalar[kFusedMaxInputs] = {};
  int8_t inSlot[kFusedMaxInputs] = {};
  uint8_t outType[kFusedMaxOutputs] = {};
  uint8_t outReg[kFusedMaxOutputs] = {};
  int32_t numInputs = 0, numConsts = 0, numSteps = 0, numOutputs = 0;
  int32_t rowWidth = 0, numSegments = 0;
  const void *shared[kFusedMaxInputs] = {};
  int64_t n[kFusedMaxLaunchSegments] = {};
  int32_t blockStart[kFusedMaxLaunchSegments + 1] = {};
  uint8_t vec[kFusedMaxLaunchSegments] = {}; ///< 1 = vector loads/stores
  void *ptr[kFusedMaxLaunchPointers] = {};
};
static_assert(sizeof(FusedMultiArgs) <= 4096,
              "FusedMultiArgs must fit in the 4 KiB of kernel parameters");

}  // namespace dlopt::rt::cuda::kernels
