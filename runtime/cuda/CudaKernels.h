//===- CudaKernels.h - Host entry points of the nvcc-built kernels --------===//
//
// The CUDA backend (runtime/exec/CudaBackend.cpp) calls these launchers; they
// are defined in runtime/cuda/kernels/*.cu, built only when CMake finds nvcc
// (DLOPT_ENABLE_CUDA, docs/gpu.md), and the backend compiles its calls only
// when DLOPT_CUDA_KERNELS is defined. This header itself needs no CUDA
// headers: streams travel as void*, element types as DType.
//
// Every launcher validates nothing (the backend checked shapes, attributes
// and types on the host), enqueues its kernels on `stream`, and returns the
// cudaError_t of cudaGetLastError() right after the launches (0 = launched;
// an asynchronous fault shows up at the next synchronize).
//
// Data-dependent errors (an id or label out of range, an integer division
// by zero) cannot be checked on the host without a copy, so kernels record
// the first one in a DeviceError word that the backend reads when it
// synchronizes, and report it with the op and its location.
//
// Status: compiled here (CUDA 13, sm_80 and sm_90), never run on a GPU.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/cuda/kernels/ElementOps.h"
#include "runtime/support/DType.h"

#include <cstdint>
#include <string>

namespace dlopt::rt::cuda {
struct CudaLibrary;
}

namespace dlopt::rt::cuda::kernels {

using Stream = void *; ///< a cudaStream_t

/// Most dims a strided view may keep after size-1 dims are dropped and
/// mergeable neighbours merged.
inline constexpr int kMaxDims = 8;
/// Most operands a strided elementwise kernel reads (select reads 3).
inline constexpr int kMaxOperands = 3;

/// The index space of an elementwise kernel: `rank` dims of `size`, and per
/// operand (0..kMaxOperands) element strides over those dims. The output is
/// contiguous (row-major over `size`) unless a kernel says otherwise.
struct StridedIndex {
  int rank = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[kMaxOperands][kMaxDims] = {};
  /// Operand k is contiguous over the whole index space (offset = index).
  bool contiguous[kMaxOperands] = {};
};

/// First data-dependent error of a run, written by kernels on the device.
struct DeviceError {
  int code = 0;     ///< ErrorCode; 0 = none
  int tag = 0;      ///< the backend's tag of the instruction that failed
  long long a = 0;  ///< bad value (id, label)
  long long b = 0;  ///< its position
  long long c = 0;  ///< the bound (V, C)
};
enum ErrorCode : int {
  kErrNone = 0,
  kErrIdOutOfRange = 1,    ///< gather / scatter_add: a = id, b = pos, c = V
  kErrLabelOutOfRange = 2, ///< cross_entropy(_grad): a = label, b = row, c = C
  kErrIntDivByZero = 3,    ///< div: b = flat index of the zero in operand #1
};

/// True when this build has the kernels (always true where this header's
/// definitions are linked in).
bool built();
/// "CUDA 13.0, sm_80 sm_90" style description of what nvcc built.
const char *buildDescription();

/// The CUDA symbol table the backend must use with these kernels: the
/// cuBLAS(Lt) entries of loadCudaCore() and the CUDA runtime entries of the
/// runtime linked into the kernels (cudart_static), so kernels, memory and
/// streams share one CUDA runtime. Error: the libraries cannot be loaded.
/// Declared with an out-parameter to keep Status out of this header.
const CudaLibrary *runtimeTable(const char **error);

//===--- Elementwise ----------------------------------------------------===//

/// y = op(x) over n contiguous elements (float types; Neg/Abs/Relu also int).
int unary(Stream s, UnaryOp op, DType t, const void *x, void *y, int64_t n);
/// y = cast(x) with the conversions of docs/ops.md.
int cast(Stream s, DType from, DType to, const void *x, void *y, int64_t n);
/// out = a op b over `idx` (operands 0 = a, 1 = b). Integer Div records
/// kErrIntDivByZero (with `tag`) and writes 0 for that element.
int binary(Stream s, BinaryOp op, DType t, const StridedIndex &idx,
           const void *a, const void *b, void *out, int64_t n,
           DeviceError *err, int tag);
/// out (i1) = a pred b over `idx`.
int compare(Stream s, ComparePred p, DType t, const StridedIndex &idx,
            const void *a, const void *b, void *out, int64_t n);
/// out = c ? a : b over `idx` (operands 0 = c, 1 = a, 2 = b), by element size.
int select(Stream s, int elemBytes, const StridedIndex &idx, const void *c,
           const void *a, const void *b, void *out, int64_t n);
/// dst[offset0(i)] = src[offset1(i)] for i over `idx` (operand 0 = dst
/// strides, 1 = src strides): transpose, broadcast_to, slice, slice_grad and
/// concat are all this copy.
int stridedCopy(Stream s, int elemBytes, const StridedIndex &idx,
                const void *src, void *dst, int64_t n);
/// y[i] = (i / inner) % size (int or float element type).
int iota(Stream s, DType t, void *y, int64_t n, int64_t size, int64_t inner);
/// The counter-based dropout of docs/ops.md. `offset` is null or a rank-0
/// device tensor of `offsetType` (i32/i64) read on the device, so the seed
/// follows the step counter without a copy.
int dropout(Stream s, DType t, const void *x, void *y, int64_t n,
            uint64_t seed, const void *offset, DType offsetType, double rate,
            float scale);

//===--- Fused elementwise groups -----------------------------------------===//

/// Evaluates the program for each of the n elements (f32 registers, results
/// rounded on store) in one launch: a grid-stride loop in which each thread
/// takes 4 consecutive elements, with 16-byte (f32) / 8-byte (f16, bf16)
/// vector loads and stores where every non-scalar buffer is aligned for
/// them. Each thread loads its elements' inputs before storing any result,
/// so results may alias same-typed inputs.
///
/// The kernel is the program's own, compiled at run time by NVRTC
/// (runtime/cuda/FusedJit.h), or the nvcc-built interpreter; fusedMode()
/// says which. Returns kFusedJitFailed, with the reason in *error, when the
/// mode is Jit and the kernel cannot be made.
int fusedElementwise(Stream s, const FusedArgs &args, int64_t n,
                     std::string *error = nullptr);

/// One launch of blockStart[numSegments] blocks (nothing when zero); the
/// kernel as for fusedElementwise.
int fusedElementwiseMulti(Stream s, const FusedMultiArgs &args,
                          std::string *error = nullptr);

/// Whether every non-scalar operand and result of `args` is aligned for
/// vector loads and stores.
bool fusedVectorizable(const FusedArgs &args);
/// The interpreter kernels themselves (program in the launch parameters,
/// its registers in local memory).
int fusedElementwiseInterpreted(Stream s, const FusedArgs &args, int64_t n);
int fusedElementwiseMultiInterpreted(Stream s, const FusedMultiArgs &args);

/// How fused_elementwise runs. Auto: the program's own kernel when NVRTC is
/// found (once per program and device; compile failures are reported once
/// on stderr), else the interpreter. Jit: the program's own kernel or an
/// error. Interpreter: always the interpreter. The default comes from
/// $DLOPT_CUDA_FUSED ("auto", "jit", "interp"; unset = auto).
enum class FusedMode { Auto, Jit, Interpreter };
void setFusedMode(FusedMode m);
FusedMode fusedMode();
/// Returned by the fused launchers when the mode is Jit and NVRTC failed.
inline constexpr int kFusedJitFailed = -1000;
/// Kernels compiled so far and the seconds NVRTC and loading took.
struct FusedJitStats {
  int compiled = 0, failed = 0;
  double seconds = 0;
};
FusedJitStats fusedJitStats();

//===--- Gather, scatter, reductions, normalization, losses ----------------===//

/// out[i, :] = table[ids[i], :] (rowBytes bytes per row), V rows.
int gather(Stream s, const void *table, const void *ids, DType idType,
           int64_t n, int64_t v, int64_t rowBytes, void *out,
           DeviceError *err, int tag);
/// out = zeros; out[ids[i], :] += updates[i, :] (f32 accumulation in the
/// row-major order of ids). `ws`: scatterAddWorkspaceBytes() (f16/bf16).
int scatterAdd(Stream s, DType t, const void *ids, DType idType,
               const void *updates, void *out, int64_t n, int64_t v,
               int64_t rest, float *ws, DeviceError *err, int tag);
int64_t scatterAddWorkspaceBytes(DType t, int64_t v, int64_t rest);

enum class ReduceKind : int { Sum, Mean, Max };
/// A reduction seen as kept dims (outer, row-major order of the output) and
/// reduced dims, with input strides (size-1 dims dropped, runs merged).
struct ReducePlan {
  int keptRank = 0, redRank = 0;
  int64_t keptSize[kMaxDims] = {}, keptStride[kMaxDims] = {};
  int64_t redSize[kMaxDims] = {}, redStride[kMaxDims] = {};
  int64_t numOut = 1, numRed = 1;
};
/// How a reduction is cut: `chunks` blocks per output (or per 32 outputs)
/// over runs of `chunk` reduced elements, combined in chunk order.
struct ReduceSplit {
  int64_t chunks = 1, chunk = 1;
};
ReduceSplit reduceSplit(const ReducePlan &p);
/// Workspace reduce() needs for `p` (0 when it runs in one pass).
int64_t reduceWorkspaceBytes(const ReducePlan &p);
int reduce(Stream s, ReduceKind k, DType t, const ReducePlan &p,
           const void *x, void *y, void *ws);

/// softmax / log_softmax of x viewed as [outer, n, inner] along n.
int softmax(Stream s, bool log, DType t, const void *x, void *y,
            int64_t outer, int64_t n, int64_t inner);
int softmaxGrad(Stream s, bool log, DType t, const void *y, const void *dy,
                void *dx, int64_t outer, int64_t n, int64_t inner);

/// layer_norm (rms = false) or rms_norm over rows of n; w/b may be null.
int norm(Stream s, bool rms, DType t, const void *x, const void *w,
         const void *b, void *y, int64_t rows, int64_t n, double eps);
/// Gradients of norm: dx, dw (and db for layer_norm; null for rms_norm).
/// `ws`: normGradWorkspaceBytes().
int normGrad(Stream s, bool rms, DType t, const void *x, const void *dy,
             const void *w, void *dx, void *dw, void *db, int64_t rows,
             int64_t n, double eps, float *ws);
int64_t normGradWorkspaceBytes(int64_t rows, int64_t n);

/// Scalar mean cross entropy of logits [n, c] and int labels [n].
/// `ws`: lossWorkspaceBytes(n).
int crossEntropy(Stream s, DType t, const void *logits, const void *labels,
                 DType labelType, void *loss, DType lossType, int64_t n,
                 int64_t c, int64_t ignoreIndex, float *ws, DeviceError *err,
                 int tag);
/// dlogits = (softmax - onehot) * dloss / count. `ws`: lossWorkspaceBytes(n).
int crossEntropyGrad(Stream s, DType t, const void *logits,
                     const void *labels, DType labelType, const void *dloss,
                     DType dlossType, void *dlogits, int64_t n, int64_t c,
                     int64_t ignoreIndex, float *ws, DeviceError *err, int tag);
/// Scalar mean((a-b)^2) over n elements. `ws`: lossWorkspaceBytes(...).
int mse(Stream s, DType t, const void *a, const void *b, void *out,
        int64_t n, float *ws);
int64_t lossWorkspaceBytes(int64_t rows);

//===--- Attention and rope -------------------------------------------------===//

struct AttentionDims {
  int64_t b = 0, h = 0, g = 0, s = 0, t = 0, d = 0, e = 0;
  float scale = 1.0f;
  bool causal = false;
  /// Causal mask: query i sees keys j <= i + shift, where shift is T - S
  /// when `offset` is null, else the rank-0 i32 (or i64 with offset64)
  /// device tensor at `offset` (the context-parallel position offset
  /// operand), read on the device.
  const void *offset = nullptr;
  bool offset64 = false;
};
/// Most head dim (D and E) the attention kernels take.
inline constexpr int64_t kMaxHeadDim = 256;
/// out = softmax(scale q k^T + mask) v: tiled over keys with an online
/// softmax (flash-attention style, f32 math on CUDA cores).
int attention(Stream s, DType t, const AttentionDims &dims, const void *q,
              const void *k, const void *v, void *out);
/// dq, dk, dv of attention (recomputes the forward pass; no atomics, dk/dv
/// sum over the query heads of each kv head in a fixed order).
/// `ws`: attentionGradWorkspaceBytes().
int attentionGrad(Stream s, DType t, const AttentionDims &dims,
                  const void *q, const void *k, const void *v,
                  const void *dout, void *dq, void *dk, void *dv, float *ws);
int64_t attentionGradWorkspaceBytes(const AttentionDims &dims);

/// Which kernels attention and attention_grad take where the tensor cores
/// apply (bf16/f16, head dims 64 and 128, sm_80+). Wmma: the WMMA kernels
/// that stage scores in shared memory (the default: verified on H100 and
/// H200). Mma: register-level mma.sync m16n8k16 tiles (FlashAttention-2
/// style; not yet run on a GPU, so opt-in). Simt: the f32 CUDA-core
/// kernels everywhere. The default comes from $DLOPT_CUDA_ATTENTION
/// ("mma", "wmma", "simt"; unset = wmma).
enum class AttentionPath { Mma, Wmma, Simt };
void setAttentionPath(AttentionPath p);
AttentionPath attentionPath();

/// rope over rows of d (positions along the dim of size `seq`). `offset`:
/// null, or a rank-0 device tensor of `offsetType` (i32/i64) added to every
/// position (the context-parallel offset operand), read on the device.
int rope(Stream s, DType t, const void *x, void *y, int64_t rows,
         int64_t seq, int64_t d, double theta, bool inverse,
         const void *offset = nullptr, DType offsetType = DType::I64);

//===--- Convolution, pooling, batch_norm ------------------------------------===//

/// conv2d geometry: x [n, c, h, w], w [o, cg, kh, kw] (c = cg * groups),
/// y [n, o, oh, ow]; stride/padding/dilation as (rows, cols).
struct ConvDims {
  int64_t n = 0, c = 0, h = 0, w = 0, o = 0, cg = 0, kh = 0, kw = 0;
  int64_t oh = 0, ow = 0, groups = 1;
  int64_t strideH = 1, strideW = 1, padH = 0, padW = 0, dilH = 1, dilW = 1;
};
/// y = conv2d(x, w) (+ bias[o] when bias is non-null): direct convolution,
/// one thread per output element, f32 accumulation over (ci, ky, kx).
int conv2d(Stream s, DType t, const ConvDims &d, const void *x,
           const void *w, const void *bias, void *y);
/// dx of conv2d: one thread per input element gathers the (o, ky, kx) taps
/// that read it, f32 accumulation, no atomics.
int conv2dGradInput(Stream s, DType t, const ConvDims &d, const void *dy,
                    const void *w, void *dx);
/// dw of conv2d: one block per filter element reduces over (n, oy, ox)
/// (per-thread f32 partials, an f64 block tree), no atomics.
int conv2dGradFilter(Stream s, DType t, const ConvDims &d, const void *x,
                     const void *dy, void *dw);

/// Pool geometry: x [planes, h, w] -> y [planes, oh, ow].
struct PoolDims {
  int64_t planes = 0, h = 0, w = 0, oh = 0, ow = 0;
  int64_t kh = 1, kw = 1, strideH = 1, strideW = 1, padH = 0, padW = 0;
  bool countIncludePad = true; ///< avg only
};
/// max_pool2d (padding is -inf; NaN wins, as on the CPU) or avg_pool2d (f64
/// window sums).
int pool2d(Stream s, bool isMax, DType t, const PoolDims &d, const void *x,
           void *y);
/// max_pool2d_grad (x needed) or avg_pool2d_grad (x null): one thread per
/// input pixel adds the gradients of the windows that chose it in the
/// row-major order of the output positions, in f32, as the CPU does (same
/// bits).
int pool2dGrad(Stream s, bool isMax, DType t, const PoolDims &d,
               const void *x, const void *dy, void *dx);

/// batch_norm of x [n, c, inner]: y, and the updated running mean/var
/// (training: batch statistics in f64, unbiased variance for the running
/// update; else the running statistics, copied through). One block per
/// channel.
int batchNorm(Stream s, DType t, const void *x, const void *w,
              const void *b, const void *rm, const void *rv, void *y,
              void *rmOut, void *rvOut, int64_t n, int64_t c, int64_t inner,
              double eps, double momentum, bool training);
/// batch_norm_grad: dx, dw, db (one block per channel, f64 sums).
int batchNormGrad(Stream s, DType t, const void *x, const void *w,
                  const void *rm, const void *rv, const void *dy, void *dx,
                  void *dw, void *db, int64_t n, int64_t c, int64_t inner,
                  double eps, bool training);

} // namespace dlopt::rt::cuda::kernels
