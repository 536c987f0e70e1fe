//===- CudaAbiCheck.cpp - The hand-declared CUDA ABI against real headers -===//
//
// CudaLibrary.h declares the few CUDA, cuBLASLt and NCCL types and constants
// the runtime needs instead of including the headers. Wherever the toolkit
// is present at build time this file checks those declarations against the
// real headers, so a mismatch is a compile error, not a wrong result on a GPU.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/CudaLibrary.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#if __has_include(<nccl.h>)
#include <nccl.h>
#define DLOPT_HAVE_NCCL_H 1
#endif

#include <cstddef>

namespace c = dlopt::rt::cuda;

#define DLOPT_SAME(a, b) static_assert(int(a) == int(b), #a " differs")
DLOPT_SAME(c::cudaMemcpyHostToDevice, cudaMemcpyHostToDevice);
DLOPT_SAME(c::cudaMemcpyDeviceToHost, cudaMemcpyDeviceToHost);
DLOPT_SAME(c::cudaMemcpyDeviceToDevice, cudaMemcpyDeviceToDevice);
static_assert(c::cudaErrorNotReady == cudaErrorNotReady);
static_assert(c::kCudaStreamNonBlocking == cudaStreamNonBlocking);
static_assert(c::kCudaEventDisableTiming == cudaEventDisableTiming);
static_assert(c::cudaStreamCaptureModeThreadLocal ==
              cudaStreamCaptureModeThreadLocal);
static_assert(c::cudaDevAttrMultiProcessorCount ==
              cudaDevAttrMultiProcessorCount);
static_assert(c::cudaDevAttrComputeCapabilityMajor ==
              cudaDevAttrComputeCapabilityMajor);
static_assert(c::cudaDevAttrComputeCapabilityMinor ==
              cudaDevAttrComputeCapabilityMinor);

static_assert(c::CUDA_R_32F == CUDA_R_32F);
static_assert(c::CUDA_R_16F == CUDA_R_16F);
static_assert(c::CUDA_R_16BF == CUDA_R_16BF);
static_assert(c::CUBLAS_OP_N == CUBLAS_OP_N);
static_assert(c::CUBLAS_OP_T == CUBLAS_OP_T);
static_assert(c::CUBLAS_COMPUTE_32F == CUBLAS_COMPUTE_32F);
static_assert(c::CUBLAS_COMPUTE_32F_FAST_TF32 == CUBLAS_COMPUTE_32F_FAST_TF32);
static_assert(c::CUBLASLT_MATMUL_DESC_TRANSA == CUBLASLT_MATMUL_DESC_TRANSA);
static_assert(c::CUBLASLT_MATMUL_DESC_TRANSB == CUBLASLT_MATMUL_DESC_TRANSB);
static_assert(c::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT ==
              CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
static_assert(c::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET ==
              CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
static_assert(c::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ==
              CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);
static_assert(c::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES ==
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES);
static_assert(c::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES ==
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES);
static_assert(c::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES ==
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES);
static_assert(c::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES ==
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES);

static_assert(sizeof(c::cublasLtMatmulAlgo_t) == sizeof(cublasLtMatmulAlgo_t));
static_assert(sizeof(c::cublasLtMatmulHeuristicResult_t) ==
              sizeof(cublasLtMatmulHeuristicResult_t));
static_assert(offsetof(c::cublasLtMatmulHeuristicResult_t, workspaceSize) ==
              offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize));
static_assert(offsetof(c::cublasLtMatmulHeuristicResult_t, state) ==
              offsetof(cublasLtMatmulHeuristicResult_t, state));
static_assert(offsetof(c::cublasLtMatmulHeuristicResult_t, wavesCount) ==
              offsetof(cublasLtMatmulHeuristicResult_t, wavesCount));

#ifdef DLOPT_HAVE_NCCL_H
static_assert(c::kNcclUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);
static_assert(sizeof(c::ncclUniqueId) == sizeof(ncclUniqueId));
DLOPT_SAME(c::ncclFloat32, ncclFloat32);
DLOPT_SAME(c::ncclFloat16, ncclFloat16);
DLOPT_SAME(c::ncclBfloat16, ncclBfloat16);
DLOPT_SAME(c::ncclInt32, ncclInt32);
DLOPT_SAME(c::ncclInt64, ncclInt64);
DLOPT_SAME(c::ncclUint8, ncclUint8);
DLOPT_SAME(c::ncclSum, ncclSum);
DLOPT_SAME(c::ncclMax, ncclMax);
DLOPT_SAME(c::ncclMin, ncclMin);
DLOPT_SAME(c::ncclAvg, ncclAvg);
static_assert(c::ncclInProgress == ncclInProgress);
#endif
