//===- CudaProbe.cpp - Is there a GPU the cuda backend can use? -----------===//
//
// dlopt-cuda-probe: prints the device and the build ("cuda: device 0 (sm_90,
// 132 SMs); kernels: CUDA 13.0, sm_80 sm_90") and exits 0, or prints why the
// cuda backend cannot run here and exits 77, the code ctest reads as "skipped"
// (SKIP_RETURN_CODE). Used by the GPU test entries of test/unit/cuda.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/CudaBackend.h"

#include <cstdio>

int main() {
  using dlopt::rt::CudaBackend;
  auto b = CudaBackend::create();
  if (!b) {
    std::printf("no GPU: %s\n", b.status().message().c_str());
    return 77;
  }
  std::printf("cuda: %s; %s\n", (*b)->deviceDescription(0).c_str(),
              CudaBackend::buildDescription().c_str());
  return 0;
}
