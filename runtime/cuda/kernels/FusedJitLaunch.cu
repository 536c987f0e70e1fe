//===- FusedJitLaunch.cu - Launching the run-time compiled fused kernels --===//
//
// fusedElementwise(Multi) pick the kernel per fusedMode(): the program's own
// (runtime/cuda/FusedJit.h writes and compiles it; this file loads the
// machine code with cudaLibraryLoadData, once per program and device
// architecture, and launches it with the interpreter's parameters and
// grid), or the interpreter (Elementwise.cu). Host code only.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/FusedJit.h"
#include "runtime/cuda/kernels/Common.cuh"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace dlopt::rt::cuda::kernels {
namespace {

FusedMode modeFromEnv() {
  const char *v = std::getenv("DLOPT_CUDA_FUSED");
  if (!v || !*v || std::strcmp(v, "auto") == 0)
    return FusedMode::Auto;
  if (std::strcmp(v, "jit") == 0)
    return FusedMode::Jit;
  if (std::strcmp(v, "interp") == 0)
    return FusedMode::Interpreter;
  std::fprintf(stderr,
               "dlopt: DLOPT_CUDA_FUSED=\"%s\" is not auto, jit or interp; "
               "using auto\n",
               v);
  return FusedMode::Auto;
}

std::atomic<int> gMode{-1};

struct Entry {
  cudaLibrary_t library = nullptr;
  cudaKernel_t kernel = nullptr;
  std::string error; ///< why there is no kernel
};

struct Cache {
  std::mutex mu;
  std::unordered_map<std::string, std::unique_ptr<Entry>> entries;
  FusedJitStats stats;
  bool warned = false;
};

Cache &cache() {
  static Cache *c = new Cache; // never destroyed: kernels may outlive statics
  return *c;
}

/// sm_XY of the current device as XY.
int currentArch(std::string *error) {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) !=
          cudaSuccess) {
    *error = "cannot read the device's compute capability";
    return 0;
  }
  return major * 10 + minor;
}

/// The kernel of `p` for the current device, compiled and loaded on first
/// use; null with the reason in *error.
cudaKernel_t kernelFor(const FusedJitProgram &p, std::string *error) {
  int arch = currentArch(error);
  if (!arch)
    return nullptr;
  std::string key = p.key();
  key += "@" + std::to_string(arch);
  Cache &c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.entries.find(key);
  if (it == c.entries.end()) {
    auto e = std::make_unique<Entry>();
    auto t0 = std::chrono::steady_clock::now();
    Expected<std::string> src = fusedJitSource(p);
    if (!src) {
      e->error = src.status().message();
    } else if (Expected<FusedJitBinary> bin = compileFusedJit(*src, arch); !bin) {
      e->error = bin.status().message();
    } else {
      cudaError_t rc = cudaLibraryLoadData(&e->library, bin->cubin.data(),
                                           nullptr, nullptr, 0, nullptr,
                                           nullptr, 0);
      if (rc == cudaSuccess)
        rc = cudaLibraryGetKernel(&e->kernel, e->library, kFusedJitEntry);
      if (rc != cudaSuccess) {
        e->error = std::string("loading the compiled fused kernel: ") +
                   cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")";
        e->kernel = nullptr;
        (void)cudaGetLastError();
      }
    }
    c.stats.seconds += std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - t0)
                           .count();
    if (e->kernel)
      ++c.stats.compiled;
    else
      ++c.stats.failed;
    it = c.entries.emplace(std::move(key), std::move(e)).first;
  }
  if (!it->second->kernel) {
    *error = it->second->error;
    if (fusedMode() == FusedMode::Auto && !c.warned) {
      c.warned = true;
      std::fprintf(stderr,
                   "dlopt: fused_elementwise runs on the interpreter kernel "
                   "(slower): %s\n",
                   error->c_str());
    }
  }
  return it->second->kernel;
}

int launch(cudaKernel_t k, unsigned blocks, void **params, Stream s) {
  cudaError_t rc =
      cudaLaunchKernel(reinterpret_cast<const void *>(k), dim3(blocks),
                       dim3(kFusedThreads), params, 0,
                       static_cast<cudaStream_t>(s));
  return rc == cudaSuccess ? lastError() : int(rc);
}

} // namespace

void setFusedMode(FusedMode m) { gMode.store(int(m)); }

FusedMode fusedMode() {
  int m = gMode.load();
  if (m < 0) {
    int fromEnv = int(modeFromEnv());
    gMode.compare_exchange_strong(m, fromEnv);
    m = gMode.load();
  }
  return FusedMode(m);
}

FusedJitStats fusedJitStats() {
  Cache &c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.stats;
}

int fusedElementwise(Stream s, const FusedArgs &args, int64_t n,
                     std::string *error) {
  if (n == 0)
    return 0;
  const FusedMode mode = fusedMode();
  if (mode != FusedMode::Interpreter) {
    std::string why;
    if (cudaKernel_t k = kernelFor(FusedJitProgram::of(args), &why)) {
      long long count = n;
      bool vec = fusedVectorizable(args);
      void *params[] = {const_cast<FusedArgs *>(&args), &count, &vec};
      int64_t chunks = (n + kFusedVec - 1) / kFusedVec;
      return launch(k, gridFor(chunks), params, s);
    }
    if (mode == FusedMode::Jit) {
      if (error)
        *error = why;
      return kFusedJitFailed;
    }
  }
  return fusedElementwiseInterpreted(s, args, n);
}

int fusedElementwiseMulti(Stream s, const FusedMultiArgs &args,
                          std::string *error) {
  if (args.numSegments <= 0 || args.blockStart[args.numSegments] == 0)
    return 0;
  const FusedMode mode = fusedMode();
  if (mode != FusedMode::Interpreter) {
    std::string why;
    if (cudaKernel_t k = kernelFor(FusedJitProgram::of(args), &why)) {
      void *params[] = {const_cast<FusedMultiArgs *>(&args)};
      return launch(k, unsigned(args.blockStart[args.numSegments]), params, s);
    }
    if (mode == FusedMode::Jit) {
      if (error)
        *error = why;
      return kFusedJitFailed;
    }
  }
  return fusedElementwiseMultiInterpreted(s, args);
}

} // namespace dlopt::rt::cuda::kernels
