//===- FusedJit.h - fused_elementwise kernels generated and compiled at run time
//
// The nvcc-built fused kernel interprets a program held in its launch
// parameters. Its register file is indexed at run time, so it lives in
// local memory (1.8 KiB per thread, 5x slower than the memory traffic on an
// H200: docs/gpu.md). This file writes one CUDA kernel per program instead,
// with every register a named f32 and every step a call of the same
// per-element function the interpreter uses (ElementMath.cuh), and compiles
// it with NVRTC for the device at hand. The launch parameters and the
// block/thread mapping are the interpreter's (FusedArgs / FusedMultiArgs),
// so the backend fills them the same way and only the kernel differs.
//
// NVRTC (libnvrtc.so.13 or .12, with its libnvrtc-builtins) is dlopen()ed
// like the other CUDA libraries (CudaLibrary.h); it runs on the host and
// needs no GPU, so source generation and compilation are tested on any
// machine with the CUDA toolkit. Loading and launching are in
// kernels/FusedJitLaunch.cpp, beside the CUDA runtime the kernels use.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/cuda/kernels/ElementOps.h"
#include "runtime/support/Status.h"

#include <string>

namespace dlopt::rt::cuda {

/// Name of the generated kernel's entry point.
inline constexpr const char *kFusedJitEntry = "dlopt_fused";

/// The program part of a launch: everything a generated kernel bakes in.
/// Pointers, sizes and the segment table stay launch parameters.
struct FusedJitProgram {
  kernels::FusedStep steps[kernels::kFusedMaxSteps] = {};
  float consts[kernels::kFusedMaxConsts] = {};
  uint8_t inType[kernels::kFusedMaxInputs] = {};
  uint8_t inScalar[kernels::kFusedMaxInputs] = {};
  uint8_t outType[kernels::kFusedMaxOutputs] = {};
  uint8_t outReg[kernels::kFusedMaxOutputs] = {};
  int32_t numInputs = 0, numConsts = 0, numSteps = 0, numOutputs = 0;
  bool multi = false; ///< FusedMultiArgs (segment table) or FusedArgs

  static FusedJitProgram of(const kernels::FusedArgs &a);
  static FusedJitProgram of(const kernels::FusedMultiArgs &a);
  /// A byte string naming the program (the cache key).
  std::string key() const;
};

/// CUDA C++ source of the program's kernel (entry kFusedJitEntry), for
/// NVRTC with the headers of fusedJitHeaders(). Errors: a step, register
/// or dtype outside what the kernels support.
Expected<std::string> fusedJitSource(const FusedJitProgram &p);

/// The headers the generated source includes, as NVRTC in-memory headers.
struct FusedJitHeader {
  const char *name;
  const char *text;
};
const FusedJitHeader *fusedJitHeaders(int *count);

/// The result of compiling one source.
struct FusedJitBinary {
  std::string cubin; ///< machine code for sm_<arch>
  std::string log;   ///< NVRTC's log (ptxas's report with `verbose`)
};
/// Compiles `source` for sm_<arch> (90 for an H100) with NVRTC. `verbose`
/// asks ptxas for its resource report (registers, stack frame) in the log.
/// Errors: NVRTC not found, or the compile failed (with its log).
Expected<FusedJitBinary> compileFusedJit(const std::string &source, int arch,
                                         bool verbose = false);

/// NVRTC's version ("13.0"), or the reason it cannot be loaded.
Expected<std::string> nvrtcVersion();

} // namespace dlopt::rt::cuda
