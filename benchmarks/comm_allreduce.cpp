//===- comm_allreduce.cpp - In-process all-reduce against memcpy ----------===//
//
// Plan application's communication figure (docs/performance.md): an
// all-reduce of 64 MiB of float32 across 4 in-process ranks (the
// InProcessCommunicator that runs multi-rank executables on the CPU),
// against this machine's memcpy bandwidth measured in the same run: the
// time, the bus bandwidth (nccl-tests' 2(n-1)/n x size / time) and the
// memory traffic (n buffers read, n written) against memcpy's.
//
//   dlopt-bench-comm [MiB] [ranks] [repeats]
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/InProcessCommunicator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

using namespace dlopt::rt;
using Clock = std::chrono::steady_clock;

int main(int argc, char **argv) {
  const int64_t mib = argc > 1 ? std::atoll(argv[1]) : 64;
  const int ranks = argc > 2 ? std::atoi(argv[2]) : 4;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  if (mib < 1 || ranks < 2 || repeats < 1) {
    std::fprintf(stderr, "usage: dlopt-bench-comm [MiB >= 1] [ranks >= 2] [repeats >= 1]\n");
    return 2;
  }
  const int64_t bytes = mib << 20, count = bytes / 4;

  // memcpy bandwidth: best of `repeats` copies of the same size.
  std::vector<char> a(size_t(bytes), 1), b(size_t(bytes), 0);
  double memcpyBest = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), size_t(bytes));
    memcpyBest = std::min(memcpyBest,
                          std::chrono::duration<double>(Clock::now() - t0).count());
  }
  double memcpyGBs = double(bytes) / memcpyBest / 1e9;

  auto comms = createInProcessGroup(ranks);
  std::vector<std::vector<float>> in(static_cast<size_t>(ranks)),
      out(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    in[size_t(r)].assign(size_t(count), float(r + 1));
    out[size_t(r)].assign(size_t(count), 0.0f);
  }
  double best = 1e30;
  for (int rep = 0; rep < repeats + 1; ++rep) { // the first is a warm-up
    std::vector<std::thread> threads;
    std::vector<double> secs(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        auto t0 = Clock::now();
        Status st = comms[size_t(r)]->allReduce(
            hostIn(in[size_t(r)].data(), count, DType::F32),
            hostOut(out[size_t(r)].data(), count, DType::F32), ReduceOp::Sum);
        secs[size_t(r)] = std::chrono::duration<double>(Clock::now() - t0).count();
        if (!st.isOk()) {
          std::fprintf(stderr, "rank %d: %s\n", r, st.message().c_str());
          std::exit(1);
        }
      });
    for (auto &t : threads)
      t.join();
    if (rep > 0)
      best = std::min(best, *std::max_element(secs.begin(), secs.end()));
  }
  float want = float(ranks * (ranks + 1) / 2);
  for (int r = 0; r < ranks; ++r)
    if (out[size_t(r)][0] != want || out[size_t(r)][size_t(count - 1)] != want) {
      std::fprintf(stderr, "wrong result on rank %d\n", r);
      return 1;
    }
  double algGBs = double(bytes) / best / 1e9;
  double busGBs = algGBs * 2.0 * (ranks - 1) / ranks;
  std::printf("all-reduce %lld MiB float32, %d in-process ranks (best of %d):\n",
              (long long)mib, ranks, repeats);
  std::printf("  time %.2f ms, algorithm bandwidth %.2f GB/s, bus bandwidth %.2f GB/s\n",
              best * 1e3, algGBs, busGBs);
  // Every rank's input is read and every rank's output written once: the
  // least memory traffic an all-reduce of n buffers in one memory can do.
  double trafficGBs = 2.0 * ranks * double(bytes) / best / 1e9;
  std::printf("  memory traffic %.2f GB/s (n inputs read, n outputs written)\n",
              trafficGBs);
  std::printf("  memcpy of %lld MiB: %.2f GB/s (traffic %.2f GB/s: read + write)\n",
              (long long)mib, memcpyGBs, 2 * memcpyGBs);
  std::printf("  all-reduce time / memcpy time: %.2fx; memcpy bandwidth / bus "
              "bandwidth: %.2fx; memcpy traffic / all-reduce traffic: %.2fx\n",
              best / memcpyBest, memcpyGBs / busGBs,
              2 * memcpyGBs / trafficGBs);
  return 0;
}
