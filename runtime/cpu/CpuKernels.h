//===- CpuKernels.h - The CPU backend's op kernels ------------------------===//
//
// One entry point runs any instruction on host memory. Kernels read their
// attributes from the Instr (see docs/ops.md for each op's attributes and
// semantics) and the operand/result tensors from TensorRefs whose types were
// fixed at compile time. The instruction must have passed verifyInstr
// (runtime/format/OpTable.h), which Executable::validate runs on every
// instruction when an executable is loaded: kernels do not check counts,
// types, shapes or attributes again. They check what depends on data (ids
// and labels in range, integer division by zero) and return an error Status
// naming the op and its location.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/format/Executable.h"
#include "runtime/support/Status.h"

#include <cstdint>
#include <span>
#include <vector>

namespace dlopt::rt {

/// A dense, row-major tensor in host memory.
struct TensorRef {
  void *data = nullptr;
  TensorType type;
  int64_t numElements() const { return type.numElements(); }
  template <typename T> T *as() const { return static_cast<T *>(data); }
};

namespace cpu {

/// Runs one verified instruction. `ins` and `outs` follow
/// instr.operands/results, with buffers for every non-empty tensor. Results
/// never alias operands.
Status runKernel(const Instr &instr, std::span<const TensorRef> ins,
                 std::span<const TensorRef> outs);

/// Whether a kernel exists for `op` (used to reject unknown ops on load).
bool hasKernel(const std::string &op);

/// Number of worker threads used by multi-threaded kernels (default:
/// hardware concurrency). BLAS threading is configured separately.
void setNumThreads(int n);
int numThreads();

/// The multiply-adds (M*N*K) from which a GEMM is split over the kernel
/// pool; smaller ones run as one single-threaded call (Matmul.cpp).
/// dlopt-calibrate reports it as the GEMM size-class boundary.
int64_t gemmSplitMultiplyAdds();

/// Makes the BLAS single-threaded and stops OpenBLAS's idle server threads
/// (every GEMM is split by the kernel pool instead: Matmul.cpp). Called by
/// the CPU backend at start and by the first GEMM; idempotent.
void useSerialBlas();

} // namespace cpu
} // namespace dlopt::rt
