//===- CudaLibrary.h - CUDA, cuBLAS(Lt) and NCCL loaded at run time ------===//
//
// The runtime never includes CUDA headers and never links CUDA libraries:
// libcudart, libcublas, libcublasLt and libnccl are dlopen()ed on first use
// and their entry points collected in one symbol table (CudaLibrary), as
// IREE and Triton do. The runtime therefore builds and runs its CPU tests on
// any machine; GPU code asks loadCuda() and gets either the table or an
// error naming the missing library or symbol.
//
// The few types the entry points need are declared here as opaque pointers
// and plain ints with the values of the public CUDA/NCCL headers.
//
// Also here: error-code -> message mapping, one checking macro per library,
// and the bootstrap helpers of between-graph launch (NCCL unique id as hex,
// rank/world size from the launcher's environment).
//
// Status: nothing in this file has ever run on a GPU (docs/communicators.md).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/support/Status.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dlopt::rt::cuda {

// Opaque handles and result codes (ABI-compatible with the real headers).
using cudaError_t = int;    // cudaSuccess == 0
using cublasStatus_t = int; // CUBLAS_STATUS_SUCCESS == 0
using ncclResult_t = int;   // ncclSuccess == 0
using cudaStream_t = struct CUstream_st *;
using cudaEvent_t = struct CUevent_st *;
using cublasHandle_t = struct cublasContext *;
using cublasLtHandle_t = struct cublasLtContext *;
using ncclComm_t = struct ncclComm *;
using cudaGraph_t = struct CUgraph_st *;
using cudaGraphExec_t = struct CUgraphExec_st *;
using cublasLtMatmulDesc_t = struct cublasLtMatmulDescOpaque *;
using cublasLtMatrixLayout_t = struct cublasLtMatrixLayoutOpaque *;
using cublasLtMatmulPreference_t = struct cublasLtMatmulPreferenceOpaque *;
/// cuBLASLt's algorithm descriptor and heuristic result (layout as in
/// cublasLt.h; checked against the real header in CudaAbiCheck.cpp when the
/// toolkit is present at build time).
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};
inline constexpr int kNcclUniqueIdBytes = 128;
struct ncclUniqueId {
  char internal[kNcclUniqueIdBytes];
};
enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum ncclDataType_t : int {
  ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4,
  ncclUint64 = 5, ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8,
  ncclBfloat16 = 9
};
enum ncclRedOp_t : int { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };
inline constexpr ncclResult_t ncclInProgress = 7;
inline constexpr cudaError_t cudaErrorNotReady = 600;
inline constexpr unsigned kCudaStreamNonBlocking = 1; // cudaStreamNonBlocking
inline constexpr unsigned kCudaEventDisableTiming = 2; // cudaEventDisableTiming
inline constexpr int cudaStreamCaptureModeThreadLocal = 1;
inline constexpr int cudaDevAttrMultiProcessorCount = 16;
inline constexpr int cudaDevAttrComputeCapabilityMajor = 75;
inline constexpr int cudaDevAttrComputeCapabilityMinor = 76;
// cuBLAS / cuBLASLt enum values (library_types.h, cublas_api.h, cublasLt.h).
inline constexpr int CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14;
inline constexpr int CUBLAS_OP_N = 0, CUBLAS_OP_T = 1;
inline constexpr int CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77;
inline constexpr int CUBLASLT_MATMUL_DESC_TRANSA = 3,
                     CUBLASLT_MATMUL_DESC_TRANSB = 4;
inline constexpr int CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
                     CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6;
inline constexpr int CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
                     CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
                     CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
                     CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
                     CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8;

// X(name, return type, parameter list). Required symbols fail loadCuda()
// when absent; optional ones are left null (newer-version entry points).
#define DLOPT_CUDART_SYMBOLS(X, OPT)                                           \
  X(cudaGetDeviceCount, cudaError_t, (int *))                                  \
  X(cudaSetDevice, cudaError_t, (int))                                         \
  X(cudaGetDevice, cudaError_t, (int *))                                       \
  X(cudaGetErrorName, const char *, (cudaError_t))                             \
  X(cudaGetErrorString, const char *, (cudaError_t))                           \
  X(cudaGetLastError, cudaError_t, ())                                         \
  X(cudaDriverGetVersion, cudaError_t, (int *))                                \
  X(cudaRuntimeGetVersion, cudaError_t, (int *))                               \
  X(cudaMalloc, cudaError_t, (void **, size_t))                                \
  X(cudaFree, cudaError_t, (void *))                                           \
  X(cudaMemcpy, cudaError_t, (void *, const void *, size_t, cudaMemcpyKind))   \
  X(cudaMemcpyAsync, cudaError_t,                                              \
    (void *, const void *, size_t, cudaMemcpyKind, cudaStream_t))              \
  X(cudaMemcpy2DAsync, cudaError_t,                                            \
    (void *, size_t, const void *, size_t, size_t, size_t, cudaMemcpyKind,     \
     cudaStream_t))                                                            \
  X(cudaMallocHost, cudaError_t, (void **, size_t))                            \
  X(cudaFreeHost, cudaError_t, (void *))                                       \
  X(cudaMemGetInfo, cudaError_t, (size_t *, size_t *))                         \
  X(cudaDeviceSynchronize, cudaError_t, ())                                    \
  X(cudaStreamCreate, cudaError_t, (cudaStream_t *))                           \
  X(cudaStreamDestroy, cudaError_t, (cudaStream_t))                            \
  X(cudaStreamSynchronize, cudaError_t, (cudaStream_t))                        \
  X(cudaStreamWaitEvent, cudaError_t, (cudaStream_t, cudaEvent_t, unsigned))   \
  X(cudaEventCreate, cudaError_t, (cudaEvent_t *))                             \
  X(cudaEventDestroy, cudaError_t, (cudaEvent_t))                              \
  X(cudaEventRecord, cudaError_t, (cudaEvent_t, cudaStream_t))                 \
  X(cudaEventSynchronize, cudaError_t, (cudaEvent_t))                          \
  X(cudaEventElapsedTime, cudaError_t, (float *, cudaEvent_t, cudaEvent_t))   \
  X(cudaEventQuery, cudaError_t, (cudaEvent_t))                                \
  X(cudaStreamQuery, cudaError_t, (cudaStream_t))                              \
  X(cudaStreamCreateWithFlags, cudaError_t, (cudaStream_t *, unsigned))        \
  X(cudaEventCreateWithFlags, cudaError_t, (cudaEvent_t *, unsigned))          \
  X(cudaMemsetAsync, cudaError_t, (void *, int, size_t, cudaStream_t))         \
  X(cudaDeviceGetAttribute, cudaError_t, (int *, int, int))                    \
  OPT(cudaStreamBeginCapture, cudaError_t, (cudaStream_t, int))                \
  OPT(cudaStreamEndCapture, cudaError_t, (cudaStream_t, cudaGraph_t *))        \
  OPT(cudaGraphInstantiate, cudaError_t,                                       \
      (cudaGraphExec_t *, cudaGraph_t, unsigned long long))                    \
  OPT(cudaGraphLaunch, cudaError_t, (cudaGraphExec_t, cudaStream_t))           \
  OPT(cudaGraphExecDestroy, cudaError_t, (cudaGraphExec_t))                    \
  OPT(cudaGraphDestroy, cudaError_t, (cudaGraph_t))

#define DLOPT_CUBLAS_SYMBOLS(X, OPT)                                           \
  X(cublasCreate_v2, cublasStatus_t, (cublasHandle_t *))                       \
  X(cublasDestroy_v2, cublasStatus_t, (cublasHandle_t))                        \
  X(cublasSetStream_v2, cublasStatus_t, (cublasHandle_t, cudaStream_t))        \
  X(cublasGetStatusName, const char *, (cublasStatus_t))                       \
  X(cublasGetStatusString, const char *, (cublasStatus_t))

#define DLOPT_CUBLASLT_SYMBOLS(X, OPT)                                         \
  X(cublasLtCreate, cublasStatus_t, (cublasLtHandle_t *))                      \
  X(cublasLtDestroy, cublasStatus_t, (cublasLtHandle_t))                       \
  X(cublasLtGetVersion, size_t, ())                                            \
  X(cublasLtMatmulDescCreate, cublasStatus_t,                                  \
    (cublasLtMatmulDesc_t *, int, int))                                        \
  X(cublasLtMatmulDescDestroy, cublasStatus_t, (cublasLtMatmulDesc_t))         \
  X(cublasLtMatmulDescSetAttribute, cublasStatus_t,                            \
    (cublasLtMatmulDesc_t, int, const void *, size_t))                         \
  X(cublasLtMatrixLayoutCreate, cublasStatus_t,                                \
    (cublasLtMatrixLayout_t *, int, uint64_t, uint64_t, int64_t))              \
  X(cublasLtMatrixLayoutDestroy, cublasStatus_t, (cublasLtMatrixLayout_t))     \
  X(cublasLtMatrixLayoutSetAttribute, cublasStatus_t,                          \
    (cublasLtMatrixLayout_t, int, const void *, size_t))                       \
  X(cublasLtMatmulPreferenceCreate, cublasStatus_t,                            \
    (cublasLtMatmulPreference_t *))                                            \
  X(cublasLtMatmulPreferenceDestroy, cublasStatus_t,                           \
    (cublasLtMatmulPreference_t))                                              \
  X(cublasLtMatmulPreferenceSetAttribute, cublasStatus_t,                      \
    (cublasLtMatmulPreference_t, int, const void *, size_t))                   \
  X(cublasLtMatmulAlgoGetHeuristic, cublasStatus_t,                            \
    (cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,           \
     cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,   \
     cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t *,       \
     int *))                                                                   \
  X(cublasLtMatmul, cublasStatus_t,                                            \
    (cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,       \
     cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t,             \
     const void *, const void *, cublasLtMatrixLayout_t, void *,               \
     cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t,     \
     cudaStream_t))

#define DLOPT_NCCL_SYMBOLS(X, OPT)                                             \
  X(ncclGetVersion, ncclResult_t, (int *))                                     \
  X(ncclGetUniqueId, ncclResult_t, (ncclUniqueId *))                           \
  X(ncclCommInitRank, ncclResult_t, (ncclComm_t *, int, ncclUniqueId, int))    \
  X(ncclCommInitAll, ncclResult_t, (ncclComm_t *, int, const int *))           \
  X(ncclCommDestroy, ncclResult_t, (ncclComm_t))                               \
  X(ncclCommAbort, ncclResult_t, (ncclComm_t))                                 \
  X(ncclCommGetAsyncError, ncclResult_t, (ncclComm_t, ncclResult_t *))         \
  X(ncclCommCount, ncclResult_t, (ncclComm_t, int *))                          \
  X(ncclCommUserRank, ncclResult_t, (ncclComm_t, int *))                       \
  X(ncclGetErrorString, const char *, (ncclResult_t))                          \
  X(ncclGroupStart, ncclResult_t, ())                                          \
  X(ncclGroupEnd, ncclResult_t, ())                                            \
  X(ncclAllReduce, ncclResult_t,                                               \
    (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,    \
     cudaStream_t))                                                            \
  X(ncclAllGather, ncclResult_t,                                               \
    (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t))  \
  X(ncclReduceScatter, ncclResult_t,                                           \
    (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,    \
     cudaStream_t))                                                            \
  X(ncclBroadcast, ncclResult_t,                                               \
    (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,           \
     cudaStream_t))                                                            \
  X(ncclSend, ncclResult_t,                                                    \
    (const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))     \
  X(ncclRecv, ncclResult_t,                                                    \
    (void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))           \
  OPT(ncclGetLastError, const char *, (ncclComm_t))                            \
  OPT(ncclCommSplit, ncclResult_t, (ncclComm_t, int, int, ncclComm_t *, void *)) \
  OPT(ncclCommFinalize, ncclResult_t, (ncclComm_t))

/// The symbol table: every entry point the runtime uses, from one load.
struct CudaLibrary {
#define DLOPT_CUDA_FIELD(name, ret, params) ret(*name) params = nullptr;
  DLOPT_CUDART_SYMBOLS(DLOPT_CUDA_FIELD, DLOPT_CUDA_FIELD)
  DLOPT_CUBLAS_SYMBOLS(DLOPT_CUDA_FIELD, DLOPT_CUDA_FIELD)
  DLOPT_CUBLASLT_SYMBOLS(DLOPT_CUDA_FIELD, DLOPT_CUDA_FIELD)
  DLOPT_NCCL_SYMBOLS(DLOPT_CUDA_FIELD, DLOPT_CUDA_FIELD)
#undef DLOPT_CUDA_FIELD
  /// The directory each library was loaded from (dlinfo RTLD_DI_ORIGIN).
  std::string cudartPath, cublasPath, cublasLtPath, ncclPath;
};

/// Loads (once per process; later calls return the same answer) libcudart
/// (.so.13, .so.12), libcublas, libcublasLt and libnccl.so.2 (loadCudaCore()
/// first, then NCCL). Each soname is
/// tried as is (LD_LIBRARY_PATH, ld.so.cache), then under $DLOPT_CUDA_LIB_DIR,
/// $CUDA_HOME/lib64 and /usr/local/cuda/lib64. The error names the missing
/// library ("libnccl.so.2 not found (dlopen: ...)") or symbol.
Expected<const CudaLibrary *> loadCuda();

/// Loads libcudart, libcublas and libcublasLt only (what one GPU needs; the
/// NCCL entries stay null until loadCuda() succeeds). Once per process.
Expected<const CudaLibrary *> loadCudaCore();

/// dlopen()s the first of `sonames` found in the search order above; the
/// error lists every name tried with dlerror(). (Exposed for tests.)
Expected<void *> openFirstLibrary(const std::vector<std::string> &sonames);

/// Number of visible GPUs; 0 when CUDA cannot be loaded or there is no
/// driver or device, with the reason in *reason when given.
int deviceCount(std::string *reason = nullptr);

/// "name (description)" for a result code. Uses the library's own strings
/// (cudaGetErrorName/String, cublasGetStatusName/String, ncclGetErrorString)
/// when it is loaded, a built-in table of common codes otherwise.
std::string cudaErrorMessage(cudaError_t e);
std::string cublasStatusMessage(cublasStatus_t s);
std::string ncclResultMessage(ncclResult_t r);

/// The Status the checking macros return: "<expr> failed at file:line:
/// <message>" (plus ncclGetLastError() for NCCL when available).
Status cudaFailure(cudaError_t e, const char *expr, const char *file, int line);
Status cublasFailure(cublasStatus_t s, const char *expr, const char *file,
                     int line);
Status ncclFailure(ncclResult_t r, const char *expr, const char *file,
                   int line);

//===--- Between-graph bootstrap -------------------------------------------===//

/// 256 lowercase hex digits.
std::string uniqueIdToHex(const ncclUniqueId &id);
/// Errors on wrong length or a non-hex digit (naming its position).
Expected<ncclUniqueId> uniqueIdFromHex(std::string_view hex);
/// Reads the id from an environment variable (default DLOPT_NCCL_ID).
Expected<ncclUniqueId> uniqueIdFromEnv(const char *var = "DLOPT_NCCL_ID");
/// Writes/reads the id as one line of hex (the file is written to a
/// temporary name and renamed, so readers never see half an id).
Status writeUniqueIdFile(const std::string &path, const ncclUniqueId &id);
Expected<ncclUniqueId> readUniqueIdFile(const std::string &path);

/// Where this process sits in a multi-process launch.
struct LaunchInfo {
  int rank = 0;
  int worldSize = 1;
  int localRank = -1;  ///< -1 when the launcher does not say
  std::string source;  ///< e.g. "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE"
};

/// Reads rank and world size from the launcher's environment: DLOPT_RANK/
/// DLOPT_WORLD_SIZE (explicit, wins), OMPI_COMM_WORLD_RANK/SIZE (Open MPI),
/// PMI_RANK/PMI_SIZE (MPICH, Intel MPI), SLURM_PROCID/SLURM_NTASKS (srun).
/// Errors: no pair set, half a pair set, a non-integer, rank outside
/// [0, size), or two launcher pairs that disagree.
Expected<LaunchInfo> launchInfoFromEnv();

} // namespace dlopt::rt::cuda

/// Checking macros: return a Status error from the enclosing function when
/// the call fails, recording the expression, file:line and the library's
/// own message.
#define DLOPT_CUDA_CHECK(expr)                                                 \
  do {                                                                         \
    ::dlopt::rt::cuda::cudaError_t dlopt_e_ = (expr);                          \
    if (dlopt_e_ != 0)                                                         \
      return ::dlopt::rt::cuda::cudaFailure(dlopt_e_, #expr, __FILE__,         \
                                            __LINE__);                         \
  } while (0)
#define DLOPT_CUBLAS_CHECK(expr)                                               \
  do {                                                                         \
    ::dlopt::rt::cuda::cublasStatus_t dlopt_s_ = (expr);                       \
    if (dlopt_s_ != 0)                                                         \
      return ::dlopt::rt::cuda::cublasFailure(dlopt_s_, #expr, __FILE__,       \
                                              __LINE__);                       \
  } while (0)
#define DLOPT_NCCL_CHECK(expr)                                                 \
  do {                                                                         \
    ::dlopt::rt::cuda::ncclResult_t dlopt_r_ = (expr);                         \
    if (dlopt_r_ != 0)                                                         \
      return ::dlopt::rt::cuda::ncclFailure(dlopt_r_, #expr, __FILE__,         \
                                            __LINE__);                         \
  } while (0)
