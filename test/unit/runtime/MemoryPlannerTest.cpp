//===- MemoryPlannerTest.cpp - Arena packing from lifetimes ---------------===//

#include "runtime/format/MemoryPlanner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

using namespace dlopt::rt;

namespace {

/// The tightest any packing can be: the most bytes live at one instant.
int64_t maxLiveBytes(const std::vector<BufferLifetime> &bufs) {
  int64_t last = 0;
  for (const auto &b : bufs)
    last = std::max(last, b.lastUse);
  int64_t best = 0;
  for (int64_t t = 0; t <= last; ++t) {
    int64_t live = 0;
    for (const auto &b : bufs)
      if (b.firstUse <= t && t <= b.lastUse)
        live += b.size;
    best = std::max(best, live);
  }
  return best;
}

/// O(n^2) reference for findMemoryConflict.
bool bruteForceConflict(const std::vector<BufferLifetime> &bufs,
                        const std::vector<int64_t> &off) {
  for (size_t i = 0; i < bufs.size(); ++i)
    for (size_t j = i + 1; j < bufs.size(); ++j) {
      if (bufs[i].size == 0 || bufs[j].size == 0)
        continue;
      bool time = bufs[i].firstUse <= bufs[j].lastUse &&
                  bufs[j].firstUse <= bufs[i].lastUse;
      bool mem = off[i] < off[j] + bufs[j].size && off[j] < off[i] + bufs[i].size;
      if (time && mem)
        return true;
    }
  return false;
}

std::vector<BufferLifetime> randomLifetimes(std::mt19937_64 &rng, int n,
                                            int steps) {
  std::vector<BufferLifetime> bufs;
  for (int i = 0; i < n; ++i) {
    BufferLifetime b;
    // Mostly activation-like sizes, some big, a few empty.
    int kind = int(rng() % 10);
    b.size = kind == 0 ? 0 : kind < 3 ? int64_t(rng() % (1 << 20)) : int64_t(rng() % 4096);
    b.firstUse = int64_t(rng() % steps);
    b.lastUse = b.firstUse + int64_t(rng() % std::max(1, steps / 4));
    bufs.push_back(b);
  }
  return bufs;
}

} // namespace

TEST(MemoryPlanner, Empty) {
  MemoryAssignment a = planMemory({});
  EXPECT_TRUE(a.offsets.empty());
  EXPECT_EQ(a.peakBytes, 0);
}

TEST(MemoryPlanner, ReusesMemoryOfDeadBuffers) {
  // A chain: each buffer dies when the next is made.
  std::vector<BufferLifetime> bufs = {{100, 0, 1}, {100, 1, 2}, {100, 2, 3}};
  MemoryAssignment a = planMemory(bufs, 64);
  EXPECT_EQ(a.offsets[0], a.offsets[2]);
  EXPECT_EQ(a.peakBytes, 256); // two buffers of 100, second at 128
  EXPECT_FALSE(findMemoryConflict(bufs, a.offsets).has_value());
}

TEST(MemoryPlanner, BestFitUsesSmallestGap) {
  // Long-lived buffers at [0,1000) and [1024,1124) leave a gap for later ones.
  std::vector<BufferLifetime> bufs = {
      {1000, 0, 10}, {4000, 0, 2}, {100, 0, 10}, {1000, 3, 10}};
  MemoryAssignment a = planMemory(bufs, 1);
  EXPECT_FALSE(findMemoryConflict(bufs, a.offsets).has_value());
  // The 1000-byte buffer born at 3 reuses the space of the dead 4000 one.
  EXPECT_EQ(a.peakBytes, 5100);
}

TEST(MemoryPlanner, RandomLifetimesAreSafeAlignedAndTight) {
  std::mt19937_64 rng(7);
  double ratioSum = 0;
  int counted = 0;
  for (int iter = 0; iter < 200; ++iter) {
    int n = 1 + int(rng() % 120);
    int64_t alignment = int64_t(1) << (rng() % 9);
    std::vector<BufferLifetime> bufs = randomLifetimes(rng, n, 60);
    MemoryAssignment a = planMemory(bufs, alignment);
    ASSERT_EQ(a.offsets.size(), bufs.size());
    ASSERT_FALSE(bruteForceConflict(bufs, a.offsets)) << "iteration " << iter;
    int64_t end = 0;
    for (size_t i = 0; i < bufs.size(); ++i) {
      ASSERT_GE(a.offsets[i], 0);
      ASSERT_EQ(a.offsets[i] % alignment, 0);
      end = std::max(end, a.offsets[i] + bufs[i].size);
    }
    EXPECT_GE(a.peakBytes, end);
    EXPECT_EQ(a.peakBytes % alignment, 0);
    int64_t lower = maxLiveBytes(bufs);
    EXPECT_GE(a.peakBytes, lower);
    if (lower > 0) {
      double ratio = double(a.peakBytes) / double(lower);
      // Alignment padding can cost up to (alignment-1) per live buffer.
      EXPECT_LE(a.peakBytes, 2 * lower + n * alignment) << "iteration " << iter;
      ratioSum += ratio;
      ++counted;
    }
    // Deterministic.
    MemoryAssignment again = planMemory(bufs, alignment);
    EXPECT_EQ(again.offsets, a.offsets);
    EXPECT_EQ(again.peakBytes, a.peakBytes);
  }
  double mean = ratioSum / counted;
  EXPECT_LT(mean, 1.25) << "greedy packing got loose: mean peak/lower bound";
  std::printf("mean peak / max-live lower bound: %.3f\n", mean);
}

TEST(MemoryPlanner, ConflictCheckerAgreesWithBruteForce) {
  std::mt19937_64 rng(11);
  int conflicts = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    int n = 1 + int(rng() % 12);
    std::vector<BufferLifetime> bufs = randomLifetimes(rng, n, 10);
    for (auto &b : bufs)
      b.size %= 64;
    std::vector<int64_t> off(bufs.size());
    for (auto &o : off)
      o = int64_t(rng() % 256);
    bool expected = bruteForceConflict(bufs, off);
    auto got = findMemoryConflict(bufs, off);
    ASSERT_EQ(got.has_value(), expected) << "iteration " << iter;
    if (got) {
      ++conflicts;
      size_t i = got->first, j = got->second;
      EXPECT_LT(i, j);
      EXPECT_TRUE(bufs[i].firstUse <= bufs[j].lastUse &&
                  bufs[j].firstUse <= bufs[i].lastUse);
      EXPECT_TRUE(off[i] < off[j] + bufs[j].size &&
                  off[j] < off[i] + bufs[i].size);
    }
  }
  EXPECT_GT(conflicts, 100); // the test exercises both answers
}

TEST(MemoryPlanner, MalformedInputDoesNotBreakInvariants) {
  std::vector<BufferLifetime> bufs = {{-5, 0, 3}, {100, 5, 2}, {100, 2, 5}};
  MemoryAssignment a = planMemory(bufs, 0);
  EXPECT_EQ(a.offsets.size(), 3u);
  EXPECT_GE(a.peakBytes, 100);
}

TEST(MemoryPlanner, ScalesToManyBuffers) {
  std::mt19937_64 rng(3);
  std::vector<BufferLifetime> bufs = randomLifetimes(rng, 5000, 4000);
  MemoryAssignment a = planMemory(bufs, 64);
  EXPECT_FALSE(findMemoryConflict(bufs, a.offsets).has_value());
  EXPECT_GE(a.peakBytes, maxLiveBytes(bufs));
}
