//===- CudaGemm.h - dlopt matmul on cuBLASLt ------------------------------===//
//
// planMatmul() turns a `matmul` instruction (row-major operands, batch dims
// broadcasting as in NumPy, optional transposes; docs/ops.md) into cuBLASLt
// calls: the largest run of batch dims that every operand walks with one
// stride becomes a strided batch (stride 0 for a broadcast operand), the
// rest becomes a loop of calls, and a linear layer (`b` without batch,
// `a` not transposed) folds into one tall GEMM. Planning is plain C++ and
// unit-tested without a GPU.
//
// GemmRunner issues the calls: row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B)^T op(A)^T, in f32 (CUBLAS_COMPUTE_32F; TF32 only
// when asked: DLOPT_CUDA_TF32=1), bf16 or f16 with f32 accumulation. Matmul
// descriptors, layouts and the heuristic's algorithm are cached per shape;
// the workspace is allocated once by the caller.
//
// Status: planning tested on the CPU; the cuBLASLt calls have never run on
// a GPU.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/cuda/CudaLibrary.h"
#include "runtime/format/Executable.h"

#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace dlopt::rt::cuda {

/// The cuBLASLt calls of one matmul. Offsets and strides are in elements.
struct GemmPlan {
  DType dtype = DType::F32;
  bool transA = false, transB = false;
  int64_t m = 0, n = 0, k = 0;
  /// One strided-batched call covers `batchCount` matrices; operand X of
  /// matrix j starts at offset + j * strideX (strideA/B may be 0).
  int64_t batchCount = 1;
  int64_t strideA = 0, strideB = 0, strideC = 0;
  /// Starting offsets of each call (one entry per call, at least one).
  std::vector<int64_t> aOffsets, bOffsets, cOffsets;
  /// Leading dims (row-major): lda = transA ? m : k, ldb = transB ? k : n.
  int64_t lda() const { return transA ? m : k; }
  int64_t ldb() const { return transB ? k : n; }
  int64_t calls() const { return int64_t(aOffsets.size()); }
};

/// Checks the operand/result types like the CPU kernel and plans the calls.
/// Errors read "expects ..." (the caller prefixes the op and location).
Expected<GemmPlan> planMatmul(const TensorType &a, const TensorType &b,
                              const TensorType &c, bool transA, bool transB);

/// Runs GemmPlans through cuBLASLt on one device.
class GemmRunner {
public:
  /// `workspace` (device memory of `workspaceBytes`) must outlive the
  /// runner; `tf32` allows TF32 for f32 operands.
  GemmRunner(const CudaLibrary &lib, cublasLtHandle_t handle, void *workspace,
             size_t workspaceBytes, bool tf32);
  ~GemmRunner();
  GemmRunner(const GemmRunner &) = delete;
  GemmRunner &operator=(const GemmRunner &) = delete;

  /// Enqueues the plan's calls on `stream`. a/b/c are the operand bases.
  Status run(const GemmPlan &p, const void *a, const void *b, void *c,
             cudaStream_t stream);

  /// Recommended workspace (32 MiB, as cuBLAS suggests for Hopper).
  static constexpr size_t kDefaultWorkspaceBytes = size_t(32) << 20;

private:
  struct Cached;
  using Key = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, unsigned>;
  Expected<Cached *> lookup(const GemmPlan &p, unsigned alignment);

  const CudaLibrary &lib_;
  cublasLtHandle_t handle_;
  void *workspace_;
  size_t workspaceBytes_;
  bool tf32_;
  std::map<Key, std::unique_ptr<Cached>> cache_;
};

} // namespace dlopt::rt::cuda
