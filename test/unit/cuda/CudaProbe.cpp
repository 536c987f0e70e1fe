//===- CudaProbe.cpp - Is there a GPU the cuda backend can use? -----------===//
//
// dlopt-cuda-probe: prints the device, the build and how fused kernels are
// made ("cuda: device 0 (sm_90, 132 SMs); kernels: CUDA 13.0, sm_80 sm_90;
// fused kernels: NVRTC 13.0") and exits 0, or prints why the
// cuda backend cannot run here and exits 77, the code ctest reads as "skipped"
// (SKIP_RETURN_CODE). Used by the GPU test entries of test/unit/cuda.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/FusedJit.h"
#include "runtime/exec/CudaBackend.h"

#include <cstdio>

int main() {
  using dlopt::rt::CudaBackend;
  auto b = CudaBackend::create();
  if (!b) {
    std::printf("no GPU: %s\n", b.status().message().c_str());
    return 77;
  }
  auto nvrtc = dlopt::rt::cuda::nvrtcVersion();
  std::string fused = nvrtc ? "fused kernels: NVRTC " + *nvrtc
                            : "fused kernels: interpreter (" +
                                  nvrtc.status().message() + ")";
  std::printf("cuda: %s; %s; %s\n", (*b)->deviceDescription(0).c_str(),
              CudaBackend::buildDescription().c_str(), fused.c_str());
  return 0;
}
