//===- cpu_parallel_for.cpp - Fork-join cost of the CPU kernel pool -------===//
//
// Times parallelFor (runtime/cpu/ThreadPool.h) on jobs too small to gain
// from threads, so what is left is the pool's own cost: waking the workers,
// handing out chunks and the join. Three patterns:
//   back-to-back  jobs issued one after another (a kernel's several loops);
//   after-gap     each job after ~G us of serial work on the caller (the
//                 host code between two instructions);
//   serial        the same loop run inline, for reference.
// Usage: dlopt-bench-cpu-parallel-for [threads [jobs [gap_us]]]
// (defaults: all cores, 20000 jobs, 20 us).
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/CpuKernels.h"
#include "runtime/cpu/ThreadPool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace dlopt::rt;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int64_t> sink{0};

/// Busy work of about `us` microseconds on the calling thread.
void spinFor(double us) {
  auto end = Clock::now() + std::chrono::nanoseconds(int64_t(us * 1000));
  while (Clock::now() < end)
    sink.fetch_add(1, std::memory_order_relaxed);
}

/// Median and 90th percentile of one job's cost, in microseconds.
void report(const char *name, std::vector<double> &us) {
  std::sort(us.begin(), us.end());
  std::printf("  %-14s median %7.2f us   p90 %7.2f us   (%zu jobs)\n", name,
              us[us.size() / 2], us[us.size() * 9 / 10], us.size());
}

template <typename Job> std::vector<double> timeJobs(int jobs, double gapUs,
                                                     Job job) {
  std::vector<double> us;
  us.reserve(size_t(jobs));
  for (int j = 0; j < jobs; ++j) {
    if (gapUs > 0)
      spinFor(gapUs);
    auto t0 = Clock::now();
    job();
    us.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return us;
}

} // namespace

int main(int argc, char **argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  int jobs = argc > 2 ? std::atoi(argv[2]) : 20000;
  double gapUs = argc > 3 ? std::atof(argv[3]) : 20.0;
  if (threads > 0)
    cpu::setNumThreads(threads);
  std::printf("parallelFor fork-join cost, %d threads, %d jobs of %d chunks "
              "(each chunk ~0.2 us of work)\n",
              cpu::numThreads(), jobs, cpu::numThreads());
  const int64_t n = cpu::numThreads();
  auto body = [](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      spinFor(0.2);
  };
  auto pooled = [&] { cpu::parallelFor(n, 1, body); };
  auto serial = [&] { body(0, n); };
  pooled(); // starts the pool
  auto a = timeJobs(jobs, 0, pooled);
  report("back-to-back", a);
  auto b = timeJobs(jobs / 4, gapUs, pooled);
  std::printf("  (after %.0f us of caller work each)\n", gapUs);
  report("after-gap", b);
  auto c = timeJobs(jobs / 4, 1000, pooled);
  report("after-1ms", c);
  auto s = timeJobs(jobs, 0, serial);
  report("serial", s);
  return 0;
}
