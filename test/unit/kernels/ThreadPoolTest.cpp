//===- ThreadPoolTest.cpp - parallelFor's chunking and its pool -----------===//
//
// The pool hands out chunks through one atomic job word and lets the caller
// return without waiting for sleeping workers (ThreadPool.cpp). These tests
// check that every index runs exactly once, in ranges that respect the
// grain, across thousands of jobs with and without idle gaps (workers
// spinning, then asleep), with nested and concurrent callers, and across
// changes of the thread count.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/CpuKernels.h"
#include "runtime/cpu/ThreadPool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace dlopt::rt::cpu {
namespace {

/// Restores the default thread count after a test.
struct ThreadCountGuard {
  ~ThreadCountGuard() { setNumThreads(0); }
};

/// Runs parallelFor(n, grain) and checks every index in [0, n) ran once.
void expectCoversOnce(int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<int> ranges{0};
  parallelFor(n, grain, [&](int64_t b, int64_t e) {
    ASSERT_LT(b, e);
    ranges.fetch_add(1);
    for (int64_t i = b; i < e; ++i)
      hits[size_t(i)].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(hits[size_t(i)].load(), 1) << "index " << i << " of " << n;
  EXPECT_LE(ranges.load(), std::max(1, numThreads()));
  if (grain >= n)
    EXPECT_EQ(ranges.load(), 1);
}

TEST(ThreadPool, EveryIndexRunsOnceForManyShapes) {
  ThreadCountGuard guard;
  for (int threads : {1, 2, 3, 8}) {
    setNumThreads(threads);
    EXPECT_EQ(numThreads(), threads);
    for (int64_t n : {1, 2, 3, 7, 64, 1000})
      for (int64_t grain : {1, 2, 5, 1000})
        expectCoversOnce(n, grain);
  }
}

TEST(ThreadPool, ThousandsOfJobsWithIdleGaps) {
  // Gaps around the workers' spin time (50 us) make them alternately catch
  // a job while spinning and sleep through to a wake-up: a lost wake-up
  // would hang here, a chunk run twice or by a stale job would miscount.
  ThreadCountGuard guard;
  setNumThreads(4);
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> gapUs(0, 150), size(1, 9);
  int64_t total = 0;
  std::atomic<int64_t> seen{0};
  for (int job = 0; job < 3000; ++job) {
    if (job % 3 == 0)
      std::this_thread::sleep_for(std::chrono::microseconds(gapUs(rng)));
    const int64_t n = size(rng);
    total += n * (n + 1) / 2;
    parallelFor(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        seen.fetch_add(i + 1);
    });
    ASSERT_EQ(seen.load(), total) << "job " << job;
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadCountGuard guard;
  setNumThreads(3);
  std::vector<std::atomic<int>> hits(64 * 16);
  parallelFor(64, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallelFor(16, 1, [&](int64_t jb, int64_t je) {
        for (int64_t j = jb; j < je; ++j)
          hits[size_t(i * 16 + j)].fetch_add(1);
      });
  });
  for (auto &h : hits)
    ASSERT_EQ(h.load(), 1);
}

TEST(ThreadPool, ConcurrentCallersEachGetTheirOwnIndices) {
  // Ranks run as threads of one process share the pool: a caller that
  // finds it busy runs its loop itself. Each caller must still see exactly
  // its own indices.
  ThreadCountGuard guard;
  setNumThreads(2);
  constexpr int kCallers = 4, kJobs = 500;
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c)
    callers.emplace_back([&, c] {
      for (int job = 0; job < kJobs; ++job) {
        const int64_t n = 1 + (job + c) % 7;
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        parallelFor(n, 1, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i)
            hits[size_t(i)].fetch_add(1);
        });
        for (auto &h : hits)
          if (h.load() != 1)
            failures.fetch_add(1);
      }
    });
  for (std::thread &t : callers)
    t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(ThreadPool, ThreadCountChangesBetweenJobs) {
  ThreadCountGuard guard;
  for (int round = 0; round < 20; ++round) {
    setNumThreads(1 + round % 4);
    expectCoversOnce(33, 1);
  }
  setNumThreads(0);
  EXPECT_GE(numThreads(), 1); // the process's CPU affinity
}

TEST(ThreadPool, WorkersReallyShareTheWork) {
  // With two threads and two long chunks, both run at once: the second
  // chunk must not wait for the first (it would if the caller ran both).
  ThreadCountGuard guard;
  setNumThreads(2);
  std::atomic<int> inside{0}, maxInside{0};
  for (int attempt = 0; attempt < 20 && maxInside.load() < 2; ++attempt)
    parallelFor(2, 1, [&](int64_t, int64_t) {
      int now = inside.fetch_add(1) + 1;
      int prev = maxInside.load();
      while (now > prev && !maxInside.compare_exchange_weak(prev, now)) {
      }
      auto end = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(20);
      while (std::chrono::steady_clock::now() < end &&
             maxInside.load() < 2)
        std::this_thread::yield();
      inside.fetch_sub(1);
    });
  EXPECT_EQ(maxInside.load(), 2);
}

} // namespace
} // namespace dlopt::rt::cpu
