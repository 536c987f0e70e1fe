//===- MemoryPlannerTest.cpp - Arena packing from lifetimes ---------------===//

#include "runtime/format/MemoryPlanner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
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

/// The plain best-fit scan planMemory indexes by time: every placed buffer
/// is visited in address order. planMemory must give the same offsets.
std::vector<int64_t> referencePlacement(std::vector<BufferLifetime> bufs,
                                        int64_t alignment) {
  auto alignUp = [&](int64_t x) { return (x + alignment - 1) / alignment * alignment; };
  for (auto &b : bufs) {
    b.size = std::max<int64_t>(b.size, 0);
    b.lastUse = std::max(b.lastUse, b.firstUse);
  }
  std::vector<size_t> order(bufs.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const BufferLifetime &x = bufs[a], &y = bufs[b];
    if (x.size != y.size)
      return x.size > y.size;
    int64_t lx = x.lastUse - x.firstUse, ly = y.lastUse - y.firstUse;
    if (lx != ly)
      return lx > ly;
    return x.firstUse < y.firstUse;
  });
  std::vector<int64_t> off(bufs.size(), 0);
  std::vector<size_t> placed;
  for (size_t idx : order) {
    const BufferLifetime &b = bufs[idx];
    if (b.size == 0)
      continue;
    int64_t cursor = 0, best = -1, bestGap = INT64_MAX;
    for (size_t p : placed) {
      const BufferLifetime &o = bufs[p];
      if (!(b.firstUse <= o.lastUse && o.firstUse <= b.lastUse))
        continue;
      int64_t cand = alignUp(cursor);
      if (cand + b.size <= off[p] && off[p] - cursor < bestGap) {
        bestGap = off[p] - cursor;
        best = cand;
      }
      cursor = std::max(cursor, off[p] + o.size);
    }
    off[idx] = best >= 0 ? best : alignUp(cursor);
    auto pos = std::upper_bound(placed.begin(), placed.end(), off[idx],
                                [&](int64_t v, size_t p) { return v < off[p]; });
    placed.insert(pos, idx);
  }
  return off;
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

// A training step's pattern: layer l's activations live from its forward
// (time l) to its backward (2L - l); its weight gradient from its backward
// to the optimizer at the end. Largest first places every gradient before
// any activation and leaves the activations no room below them; the order
// by breadth packs the peak's buffers first and reaches the live peak.
TEST(MemoryPlanner, TheOrderByBreadthPacksATrainingStepToItsLivePeak) {
  const int layers = 12;
  std::vector<BufferLifetime> bufs;
  for (int l = 0; l < layers; ++l) {
    for (int i = 0; i < 5; ++i) // activations
      bufs.push_back({3 << 10, l, 2 * layers - l});
    for (int i = 0; i < 2; ++i) // the gradients, born at the backward
      bufs.push_back({7 << 10, 2 * layers - l, 2 * layers + 1});
  }
  MemoryAssignment a = planMemory(bufs, 64);
  EXPECT_FALSE(bruteForceConflict(bufs, a.offsets));
  EXPECT_EQ(a.peakBytes, maxLiveBytes(bufs));
  EXPECT_TRUE(a.byBreadth);
  int64_t bySizeEnd = 0;
  const std::vector<int64_t> ref = referencePlacement(bufs, 64);
  for (size_t i = 0; i < bufs.size(); ++i)
    bySizeEnd = std::max(bySizeEnd, ref[i] + bufs[i].size);
  EXPECT_GT(bySizeEnd, a.peakBytes);
}

TEST(MemoryPlanner, TimeIndexGivesTheReferenceScansOffsets) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 40; ++round) {
    int n = 50 + int(rng() % 1500);
    int steps = 20 + int(rng() % 6000); // spans from one block to many
    std::vector<BufferLifetime> bufs = randomLifetimes(rng, n, steps);
    if (round % 4 == 0) // long-lived buffers, as weights' gradients are
      for (int i = 0; i < n / 20; ++i)
        bufs[rng() % n].lastUse += steps;
    int64_t alignment = round % 3 == 0 ? 1 : 64;
    MemoryAssignment a = planMemory(bufs, alignment);
    const std::vector<int64_t> ref = referencePlacement(bufs, alignment);
    if (!a.byBreadth) {
      EXPECT_EQ(a.offsets, ref) << "round " << round;
    } else {
      // The order by breadth won: it must be safe and strictly smaller.
      int64_t refEnd = 0;
      for (size_t i = 0; i < bufs.size(); ++i)
        refEnd = std::max(refEnd, ref[i] + std::max<int64_t>(bufs[i].size, 0));
      EXPECT_LT(a.peakBytes, (refEnd + alignment - 1) / alignment * alignment)
          << "round " << round;
      EXPECT_FALSE(bruteForceConflict(bufs, a.offsets)) << "round " << round;
    }
  }
  // Lifetimes at the ends of int64 do not overflow the index.
  std::vector<BufferLifetime> far = {{64, INT64_MIN, INT64_MIN + 1},
                                     {64, INT64_MAX - 1, INT64_MAX},
                                     {64, 0, 0}};
  EXPECT_EQ(planMemory(far, 64).offsets, referencePlacement(far, 64));
}
