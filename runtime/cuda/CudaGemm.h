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
// Unaligned 16-bit GEMMs run through padded copies (planPadding()).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/cuda/CudaLibrary.h"
#include "runtime/format/Executable.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>
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
  /// Leading dims (row-major): lda = transA ? m : k, ldb = transB ? k : n,
  /// ldc = n, unless set explicitly (a padded copy's).
  int64_t ldaSet = 0, ldcSet = 0;
  int64_t lda() const { return ldaSet ? ldaSet : transA ? m : k; }
  int64_t ldb() const { return transB ? k : n; }
  int64_t ldc() const { return ldcSet ? ldcSet : n; }
  int64_t calls() const { return int64_t(aOffsets.size()); }
};

/// How a 16-bit GEMM with a leading dimension that is not a multiple of 8
/// elements runs: cuBLASLt has only slow kernels for rows that are not 16
/// bytes apart (gpt2's tied LM head, N = 50257: about 126 TFLOP/s on an
/// H100, where the aligned shape runs near 700). Such an A (lda) is copied
/// to scratch with a padded leading dim, and such a C computed into scratch
/// and copied out, `chunkM` rows of C at a time so the scratch stays under
/// a bound. One call, no batch, aligned B, and at least kMinPadFlops.
struct GemmPadding {
  bool padA = false, padC = false;
  int64_t chunkM = 0;
  /// Scratch for one chunk's A copy (at offset 0) and C (at cOffset).
  int64_t scratchBytes = 0, cOffset = 0;
};
inline constexpr double kMinPadFlops = 4e9;
inline constexpr int64_t kGemmPadScratchBytes = int64_t(256) << 20;
/// The padding `p` needs, or nullopt when it runs as planned (aligned, too
/// small to gain, or not one plain call). `maxScratch` bounds the scratch.
std::optional<GemmPadding> planPadding(const GemmPlan &p,
                                       int64_t maxScratch = kGemmPadScratchBytes,
                                       double minFlops = kMinPadFlops);

/// Whether GemmRunner pads unaligned GEMMs. Off by default until it has
/// run on a GPU; the default comes from $DLOPT_CUDA_GEMM_PAD ("1" on, "0"
/// or unset off).
void setGemmPadding(bool on);
bool gemmPadding();

/// A strided copy (cudaMemcpy2DAsync); every count in elements.
struct PadCopy {
  int64_t srcOffset = 0, srcPitch = 0, dstOffset = 0, dstPitch = 0;
  int64_t width = 0, height = 0;
};
/// One chunk of a padded GEMM: copy A's rows (or columns) to scratch, run
/// `gemm` (aOffsets[0] into A or the scratch, cOffsets[0] into C or the
/// scratch), copy C's rows out of scratch.
struct PadStep {
  std::optional<PadCopy> copyA; ///< A -> scratch
  GemmPlan gemm;
  bool aInScratch = false, cInScratch = false;
  std::optional<PadCopy> copyC; ///< scratch -> C
};
std::vector<PadStep> padSteps(const GemmPlan &p, const GemmPadding &g);

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
  /// `scratch`, when given and gemmPadding() is on, is asked for device
  /// memory for planPadding()'s copies; otherwise unaligned GEMMs run as
  /// they are.
  Status run(const GemmPlan &p, const void *a, const void *b, void *c,
             cudaStream_t stream,
             const std::function<Expected<void *>(int64_t)> &scratch = {});

  /// Recommended workspace (32 MiB, as cuBLAS suggests for Hopper).
  static constexpr size_t kDefaultWorkspaceBytes = size_t(32) << 20;

private:
  struct Cached;
  using Key = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, unsigned, int64_t, int64_t>;
  Status call(const GemmPlan &p, const void *a, const void *b, void *c,
              cudaStream_t stream);
  Expected<Cached *> lookup(const GemmPlan &p, unsigned alignment);

  const CudaLibrary &lib_;
  cublasLtHandle_t handle_;
  void *workspace_;
  size_t workspaceBytes_;
  bool tf32_;
  std::map<Key, std::unique_ptr<Cached>> cache_;
};

} // namespace dlopt::rt::cuda
