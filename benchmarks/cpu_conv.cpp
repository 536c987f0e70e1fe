//===- cpu_conv.cpp - conv2d and its gradients: oneDNN against im2col -----===//
//
// Times runKernel("conv2d"), "conv2d_grad_input" and "conv2d_grad_filter"
// on the convolutions of resnet18 at 64 px (batch 8) and of the small CNN
// at batch 64, once through oneDNN (the default where built with it) and
// once as im2col + sgemm (DLOPT_CONV=im2col), side by side in one run.
// Prints milliseconds (best of `reps`) and GFLOP/s (2 N O OH OW C/g KH KW
// per kernel).
//
// Usage: dlopt-bench-cpu-conv [threads [reps]]
//
//===----------------------------------------------------------------------===//

#include "benchmarks/BenchUtil.h"
#include "runtime/cpu/CpuKernels.h"
#include "runtime/cpu/DnnlConv.h"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

using namespace dlopt::rt;
using dlopt::bench::bestSeconds;

namespace {

struct Shape {
  const char *what;
  int64_t n, c, h, o, k, stride, pad;
};

} // namespace

int main(int argc, char **argv) {
  const int threads = argc >= 2 ? std::atoi(argv[1]) : 1;
  const int reps = argc >= 3 ? std::atoi(argv[2]) : 10;
  cpu::setNumThreads(threads);
  const Shape shapes[] = {
      {"resnet18 stem", 8, 3, 64, 64, 7, 2, 3},
      {"resnet18 layer1", 8, 64, 16, 64, 3, 1, 1},
      {"resnet18 layer2", 8, 128, 8, 128, 3, 1, 1},
      {"resnet18 layer3", 8, 256, 4, 256, 3, 1, 1},
      {"resnet18 layer4", 8, 512, 2, 512, 3, 1, 1},
      {"resnet18 down4", 8, 256, 4, 512, 1, 2, 0},
      {"cnn conv1", 64, 1, 28, 16, 3, 1, 1},
      {"cnn conv2", 64, 16, 14, 32, 3, 1, 1},
  };
  std::printf("conv2d kernels, %d thread(s), best of %d; oneDNN: %s\n",
              threads, reps, cpu::haveDnnl() ? "built in" : "not built");
  std::printf("%-16s %-28s %-11s %9s %9s %8s %8s %7s\n", "layer", "shape",
              "kernel", "im2col ms", "dnnl ms", "im2col", "dnnl", "speedup");
  std::printf("%-16s %-28s %-11s %9s %9s %8s %8s %7s\n", "", "", "", "", "",
              "GFLOP/s", "GFLOP/s", "");
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Shape &s : shapes) {
    const int64_t oh = (s.h + 2 * s.pad - s.k) / s.stride + 1;
    std::vector<float> x(size_t(s.n * s.c * s.h * s.h)),
        w(size_t(s.o * s.c * s.k * s.k)), y(size_t(s.n * s.o * oh * oh)),
        dy(y.size()), dx(x.size()), dw(w.size());
    for (auto *v : {&x, &w, &dy})
      for (float &f : *v)
        f = dist(rng);
    const TensorType tx{DType::F32, {s.n, s.c, s.h, s.h}},
        tw{DType::F32, {s.o, s.c, s.k, s.k}},
        ty{DType::F32, {s.n, s.o, oh, oh}};
    Instr in;
    in.loc = "bench";
    in.attrs["stride"] = std::vector<int64_t>{s.stride, s.stride};
    in.attrs["padding"] = std::vector<int64_t>{s.pad, s.pad};
    const double flops =
        2.0 * double(s.n * s.o * oh * oh) * double(s.c * s.k * s.k);
    char shape[64];
    std::snprintf(shape, sizeof shape, "%ldx%ldx%ldx%ld k%ld o%ld",
                  long(s.n), long(s.c), long(s.h), long(s.h), long(s.k),
                  long(s.o));
    struct K {
      const char *op;
      std::vector<TensorRef> ins, outs;
    } kernels[] = {
        {"conv2d", {{x.data(), tx}, {w.data(), tw}}, {{y.data(), ty}}},
        {"conv2d_grad_input", {{dy.data(), ty}, {w.data(), tw}},
         {{dx.data(), tx}}},
        {"conv2d_grad_filter", {{x.data(), tx}, {dy.data(), ty}},
         {{dw.data(), tw}}},
    };
    for (K &k : kernels) {
      in.op = k.op;
      double t[2];
      for (int path = 0; path < 2; ++path) {
        cpu::setConvPath(path == 0 ? cpu::ConvPath::Im2col
                                   : cpu::ConvPath::Auto);
        Status st;
        t[path] = bestSeconds(reps, [&] {
          Status r = cpu::runKernel(in, k.ins, k.outs);
          if (!r.isOk())
            st = r;
        });
        if (!st.isOk()) {
          std::fprintf(stderr, "%s failed: %s\n", k.op, st.message().c_str());
          return 1;
        }
      }
      const char *name = k.op + (std::string(k.op) == "conv2d" ? 0 : 7);
      std::printf("%-16s %-28s %-11s %9.3f %9.3f %8.1f %8.1f %6.2fx\n",
                  s.what, shape, name, t[0] * 1e3, t[1] * 1e3,
                  flops / t[0] * 1e-9, flops / t[1] * 1e-9, t[0] / t[1]);
    }
  }
  return 0;
}
