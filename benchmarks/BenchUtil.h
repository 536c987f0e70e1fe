//===- BenchUtil.h - Timing shared by the CPU benchmarks ------------------===//
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>

namespace dlopt::bench {

/// Best-of-`reps` wall time of `fn` in seconds, after one warm-up call.
inline double bestSeconds(int reps, const std::function<void()> &fn) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

} // namespace dlopt::bench
