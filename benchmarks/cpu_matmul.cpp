//===- cpu_matmul.cpp - GFLOP/s of the CPU matmul kernel vs. raw sgemm ----===//
//
// Times runKernel("matmul") against a direct cblas_sgemm call on the same
// buffers, so the kernel's own overhead (validation, dispatch, batching) is
// visible. Usage: dlopt-bench-cpu-matmul [M N K [reps]] (default 1024^3).
//
//===----------------------------------------------------------------------===//

#include "benchmarks/BenchUtil.h"
#include "runtime/cpu/CpuKernels.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

using namespace dlopt::rt;
using dlopt::bench::bestSeconds;

int main(int argc, char **argv) {
  int64_t m = 1024, n = 1024, k = 1024;
  int reps = 10;
  if (argc >= 4) {
    m = std::atoll(argv[1]);
    n = std::atoll(argv[2]);
    k = std::atoll(argv[3]);
  }
  if (argc >= 5)
    reps = std::atoi(argv[4]);

  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> a(size_t(m * k)), b(size_t(k * n)), c(size_t(m * n));
  for (float &x : a)
    x = dist(rng);
  for (float &x : b)
    x = dist(rng);

  Instr instr;
  instr.op = "matmul";
  instr.loc = "bench";
  TensorRef ins[2] = {{a.data(), {DType::F32, {m, k}}},
                      {b.data(), {DType::F32, {k, n}}}};
  TensorRef outs[1] = {{c.data(), {DType::F32, {m, n}}}};

  Status firstStatus;
  double tKernel = bestSeconds(reps, [&] {
    Status s = cpu::runKernel(instr, ins, outs);
    if (!s.isOk())
      firstStatus = s;
  });
  if (!firstStatus.isOk()) {
    std::fprintf(stderr, "matmul failed: %s\n", firstStatus.message().c_str());
    return 1;
  }
  double tBlas = bestSeconds(reps, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n),
                int(k), 1.0f, a.data(), int(k), b.data(), int(n), 0.0f,
                c.data(), int(n));
  });
  double flops = 2.0 * double(m) * double(n) * double(k);
  std::printf("matmul %lldx%lldx%lld f32 (best of %d)\n", (long long)m,
              (long long)n, (long long)k, reps);
  std::printf("  runKernel(matmul): %8.2f GFLOP/s  (%.3f ms)\n",
              flops / tKernel * 1e-9, tKernel * 1e3);
  std::printf("  cblas_sgemm:       %8.2f GFLOP/s  (%.3f ms)\n",
              flops / tBlas * 1e-9, tBlas * 1e3);
  std::printf("  kernel / sgemm:    %8.3f\n", tBlas / tKernel);
  return 0;
}
