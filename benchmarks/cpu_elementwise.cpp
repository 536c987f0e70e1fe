//===- cpu_elementwise.cpp - Fused elementwise programs vs. memory bandwidth ===//
//
// Times the CPU backend's fused_elementwise kernel (the per-element program
// interpreter, runtime/cpu/Elementwise.cpp) on long f32 tensors against
// what the memory allows, in the same run:
//
//   memcpy     the same bytes copied (per thread, a contiguous share), the
//              traffic rate (read + write) a streaming kernel can reach;
//   hand loop  the same arithmetic written as a plain C++ loop over the
//              same shares (compiled with the same flags).
//
// Programs: scale (y = 2x: 8 bytes per element), add (y = a + b: 12), a
// momentum-style update (m' = 0.9 m + g, p' = p - lr m' / (|m'| + 1e-8):
// reads 3, writes 2, 20 bytes) and the tanh GELU (8 bytes, compute-heavy).
// Each figure is the best of `reps` calls after a warm-up; traffic counts
// each tensor read once and each result written once.
//
// Usage: dlopt-bench-cpu-elementwise [elements [reps [threads]]]
//        (default 16M elements, 64 MiB per tensor; 10 reps; every core)
//
//===----------------------------------------------------------------------===//

#include "benchmarks/BenchUtil.h"
#include "runtime/cpu/CpuKernels.h"
#include "runtime/cpu/ThreadPool.h"
#include "runtime/format/FusedProgram.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace dlopt::rt;
using dlopt::bench::bestSeconds;
using dlopt::rt::fused::OpCode;

namespace {

/// Runs body(begin, end) over [0, n) split into one contiguous share per
/// kernel-pool thread.
void forShares(int64_t n, const std::function<void(int64_t, int64_t)> &body) {
  const int64_t shares = std::max(1, cpu::numThreads());
  const int64_t per = (n + shares - 1) / shares;
  cpu::parallelFor(shares, 1, [&](int64_t sb, int64_t se) {
    for (int64_t s = sb; s < se; ++s)
      body(std::min(n, s * per), std::min(n, (s + 1) * per));
  });
}

struct Case {
  std::string name;
  /// Its inputs are tensors of n elements, but for a last rank-0 one
  /// where scalarLr (the momentum's learning rate); so are its results.
  fused::Program program;
  bool scalarLr = false;
  int tensorInputs() const { return program.numInputs - (scalarLr ? 1 : 0); }
  int results() const { return int(program.outputs.size()); }
  std::function<void(const std::vector<const float *> &,
                     const std::vector<float *> &, int64_t, int64_t)>
      hand;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  {
    Case c;
    c.name = "scale y=2x";
    c.program.numInputs = 1;
    c.program.consts = {2.0};
    c.program.steps = {{OpCode::Mul, 0, 1}};
    c.program.outputs = {2};
    c.hand = [](auto &in, auto &o, int64_t b, int64_t e) {
      const float *x = in[0];
      float *y = o[0];
      for (int64_t i = b; i < e; ++i)
        y[i] = x[i] * 2.0f;
    };
    out.push_back(std::move(c));
  }
  {
    Case c;
    c.name = "add y=a+b";
    c.program.numInputs = 2;
    c.program.steps = {{OpCode::Add, 0, 1}};
    c.program.outputs = {2};
    c.hand = [](auto &in, auto &o, int64_t b, int64_t e) {
      const float *x = in[0], *z = in[1];
      float *y = o[0];
      for (int64_t i = b; i < e; ++i)
        y[i] = x[i] + z[i];
    };
    out.push_back(std::move(c));
  }
  {
    Case c;
    c.name = "momentum update";
    // registers: 0 m, 1 g, 2 p, 3 lr, 4 c0.9, 5 c1e-8, steps from 6
    c.program.numInputs = 4;
    c.program.consts = {0.9, 1e-8};
    c.program.steps = {{OpCode::Mul, 0, 4},   // 6 = 0.9 m
                       {OpCode::Add, 6, 1},   // 7 = m'
                       {OpCode::Abs, 7, -1},  // 8
                       {OpCode::Add, 8, 5},   // 9
                       {OpCode::Div, 7, 9},   // 10
                       {OpCode::Mul, 10, 3},  // 11
                       {OpCode::Sub, 2, 11}}; // 12 = p'
    c.program.outputs = {7, 12};
    c.scalarLr = true;
    c.hand = [](auto &in, auto &o, int64_t b, int64_t e) {
      const float *m = in[0], *g = in[1], *p = in[2];
      const float lr = in[3][0];
      float *mo = o[0], *po = o[1];
      for (int64_t i = b; i < e; ++i) {
        float nm = m[i] * 0.9f + g[i];
        mo[i] = nm;
        po[i] = p[i] - nm / (std::fabs(nm) + 1e-8f) * lr;
      }
    };
    out.push_back(std::move(c));
  }
  {
    Case c;
    c.name = "gelu (tanh)";
    c.program.numInputs = 1;
    c.program.steps = {{OpCode::GeluTanh, 0, -1}};
    c.program.outputs = {1};
    // glibc's scalar tanhf: what a plain loop gets.
    c.hand = [](auto &in, auto &o, int64_t b, int64_t e) {
      const float *x = in[0];
      float *y = o[0];
      for (int64_t i = b; i < e; ++i) {
        const float v = x[i];
        y[i] = 0.5f * v *
               (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
      }
    };
    out.push_back(std::move(c));
  }
  return out;
}

} // namespace

int main(int argc, char **argv) {
  int64_t n = int64_t(1) << 24;
  int reps = 10;
  if (argc >= 2)
    n = std::atoll(argv[1]);
  if (argc >= 3)
    reps = std::atoi(argv[2]);
  if (argc >= 4)
    cpu::setNumThreads(std::atoi(argv[3]));
  if (n < 1 || reps < 1) {
    std::fprintf(stderr, "usage: dlopt-bench-cpu-elementwise [elements "
                         "[reps [threads]]]\n");
    return 2;
  }

  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<std::vector<float>> tensors(5);
  for (auto &t : tensors) {
    t.resize(size_t(n));
    for (float &x : t)
      x = dist(rng);
  }
  std::vector<float> outA(static_cast<size_t>(n)),
      outB(static_cast<size_t>(n));
  float lr = 1e-3f;

  const double mib = double(n) * 4 / (1 << 20);
  std::printf("fused_elementwise on %lld f32 elements (%.0f MiB per tensor), "
              "%d kernel threads, best of %d\n",
              static_cast<long long>(n), mib, cpu::numThreads(), reps);
  const double tCopy = bestSeconds(reps, [&] {
    forShares(n, [&](int64_t b, int64_t e) {
      std::memcpy(outA.data() + b, tensors[0].data() + b,
                  size_t(e - b) * sizeof(float));
    });
  });
  const double copyRate = 2.0 * double(n) * 4 / tCopy;
  std::printf("  memcpy: %.2f ms, traffic %.2f GB/s (read + write)\n",
              tCopy * 1e3, copyRate * 1e-9);
  std::printf("  %-18s %10s %12s %10s %12s %10s %12s\n", "program",
              "kernel ms", "kernel GB/s", "hand ms", "hand GB/s",
              "kern/hand", "of memcpy");

  for (const Case &c : cases()) {
    Instr instr;
    instr.op = fused::kOpName;
    instr.loc = "bench";
    std::vector<TensorRef> ins, outs;
    std::vector<const float *> inPtrs;
    for (int i = 0; i < c.tensorInputs(); ++i) {
      ins.push_back({tensors[size_t(i)].data(), {DType::F32, {n}}});
      inPtrs.push_back(tensors[size_t(i)].data());
    }
    if (c.scalarLr) {
      ins.push_back({&lr, {DType::F32, {}}});
      inPtrs.push_back(&lr);
    }
    std::vector<float *> outPtrs = {outA.data(), outB.data()};
    outPtrs.resize(size_t(c.results()));
    for (int i = 0; i < c.results(); ++i)
      outs.push_back({outPtrs[size_t(i)], {DType::F32, {n}}});
    for (size_t i = 0; i < ins.size(); ++i)
      instr.operands.push_back(int32_t(i));
    for (size_t i = 0; i < outs.size(); ++i)
      instr.results.push_back(int32_t(ins.size() + i));
    fused::encode(c.program, instr);

    Status first;
    const double tKernel = bestSeconds(reps, [&] {
      Status s = cpu::runKernel(instr, ins, outs);
      if (!s.isOk() && first.isOk())
        first = s;
    });
    if (!first.isOk()) {
      std::fprintf(stderr, "%s failed: %s\n", c.name.c_str(),
                   first.message().c_str());
      return 1;
    }
    const double tHand = bestSeconds(reps, [&] {
      forShares(n, [&](int64_t b, int64_t e) { c.hand(inPtrs, outPtrs, b, e); });
    });
    const double bytes =
        double(c.tensorInputs() + c.results()) * double(n) * 4;
    std::printf("  %-18s %10.2f %12.2f %10.2f %12.2f %10.2f %11.0f%%\n",
                c.name.c_str(), tKernel * 1e3, bytes / tKernel * 1e-9,
                tHand * 1e3, bytes / tHand * 1e-9, tKernel / tHand,
                100.0 * (bytes / tKernel) / copyRate);
  }
  return 0;
}
