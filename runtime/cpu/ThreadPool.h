//===- ThreadPool.h - Parallel-for for the CPU kernels --------------------===//
//
// Kernels split their outer loops into contiguous chunks and hand them to a
// small persistent pool. Each output element is computed entirely by one
// chunk in a fixed order, so results are bitwise identical for any thread
// count; only the chunk boundaries change.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <functional>

namespace dlopt::rt::cpu {

/// Calls `fn(begin, end)` on disjoint ranges covering [0, n). Ranges hold at
/// least `grain` items (except possibly the last), so cheap loops stay
/// serial. Runs serially when called from inside a pool worker or while
/// another caller is using the pool, which keeps nested and concurrent use
/// safe.
void parallelFor(int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)> &fn);

/// Grain for a loop whose items each cost about `costPerItem` simple
/// operations: aims for chunks of at least ~32K operations.
inline int64_t grainFor(int64_t costPerItem) {
  constexpr int64_t kMinChunkWork = 32768;
  if (costPerItem < 1)
    costPerItem = 1;
  int64_t g = kMinChunkWork / costPerItem;
  return g < 1 ? 1 : g;
}

} // namespace dlopt::rt::cpu
