//===- MpiCommunicatorTest.cpp - The MPI communicator, as 4 processes -----===//
//
// Run under mpirun (ctest: mpi-communicator). Every rank generates every
// rank's input from (rank, element) alone, so each can compute the expected
// result itself: the reductions must equal RankOrderReduce bit for bit (the
// in-process communicator's results) and, for float32 sums, a float64
// reference within rounding.
//
//===----------------------------------------------------------------------===//

#include "runtime/comm/MpiCommunicator.h"
#include "runtime/comm/RankOrderReduce.h"
#include "runtime/cpu/Half.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace dlopt::rt;

namespace {

std::unique_ptr<Communicator> gWorld;

Communicator &world() { return *gWorld; }

bool contains(const std::string &s, const std::string &n) {
  return s.find(n) != std::string::npos;
}

/// Element i of rank r's input, as bytes of `t`.
std::vector<uint8_t> inputOf(int r, int64_t count, DType t, uint32_t salt) {
  std::vector<uint8_t> v(size_t(count * dtypeSize(t)));
  for (int64_t i = 0; i < count; ++i) {
    // Values of mixed sign and magnitude, so rounding order matters.
    uint32_t h = uint32_t(i) * 2654435761u ^ uint32_t(r + 1) * 40503u ^ salt;
    h ^= h >> 13;
    double x = (double(h % 20001) - 10000.0) / 997.0 * std::ldexp(1.0, int(h % 7));
    switch (t) {
    case DType::F32: {
      float f = float(x);
      std::memcpy(v.data() + i * 4, &f, 4);
      break;
    }
    case DType::F16: {
      uint16_t b = floatToHalf(float(x) / 64.0f);
      std::memcpy(v.data() + i * 2, &b, 2);
      break;
    }
    case DType::BF16: {
      uint16_t b = floatToBf16(float(x));
      std::memcpy(v.data() + i * 2, &b, 2);
      break;
    }
    case DType::I32: {
      int32_t k = int32_t(h) - int32_t(1u << 30);
      std::memcpy(v.data() + i * 4, &k, 4);
      break;
    }
    case DType::I64: {
      int64_t k = int64_t(h) * 1000003 - (int64_t(1) << 40);
      std::memcpy(v.data() + i * 8, &k, 8);
      break;
    }
    case DType::I1:
      v[size_t(i)] = uint8_t(h & 1);
      break;
    }
  }
  return v;
}

TEST(Mpi, WorldHasFourRanks) {
  EXPECT_EQ(world().size(), 4);
  EXPECT_GE(world().rank(), 0);
  EXPECT_LT(world().rank(), 4);
}

TEST(Mpi, AllReduceEqualsTheRankOrderReduction) {
  const int n = world().size(), me = world().rank();
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min,
                        ReduceOp::Avg})
      for (int64_t count : {int64_t(0), int64_t(1), int64_t(3), int64_t(7),
                            int64_t(1000), int64_t(4097)})
        for (bool inPlace : {false, true}) {
          std::vector<std::vector<uint8_t>> all;
          std::vector<const void *> ptrs;
          for (int r = 0; r < n; ++r)
            all.push_back(inputOf(r, count, t, uint32_t(count) * 7 + 1));
          for (auto &a : all)
            ptrs.push_back(a.data());
          std::vector<uint8_t> want(all[0].size() + 1);
          reduceInto(ptrs, 0, count, t, op, want.data());
          std::vector<uint8_t> in = all[size_t(me)], out(in.size() + 1);
          void *dst = inPlace ? in.data() : out.data();
          Status st = world().allReduce(hostIn(in.data(), count, t),
                                        hostOut(dst, count, t), op);
          ASSERT_TRUE(st.isOk()) << st.message();
          EXPECT_EQ(0, std::memcmp(dst, want.data(), all[0].size()))
              << dtypeName(t) << " " << reduceOpName(op) << " count "
              << count << (inPlace ? " in place" : "");
        }
}

TEST(Mpi, Float32SumAgreesWithFloat64) {
  const int n = world().size(), me = world().rank();
  const int64_t count = 10000;
  std::vector<uint8_t> in = inputOf(me, count, DType::F32, 99);
  std::vector<float> out(static_cast<size_t>(count));
  ASSERT_TRUE(world()
                  .allReduce(hostIn(in.data(), count, DType::F32),
                             hostOut(out.data(), count, DType::F32),
                             ReduceOp::Sum)
                  .isOk());
  std::vector<std::vector<uint8_t>> all;
  for (int r = 0; r < n; ++r)
    all.push_back(inputOf(r, count, DType::F32, 99));
  for (int64_t i = 0; i < count; ++i) {
    double ref = 0, mag = 0;
    for (int r = 0; r < n; ++r) {
      float x;
      std::memcpy(&x, all[size_t(r)].data() + i * 4, 4);
      ref += double(x);
      mag += std::fabs(double(x));
    }
    ASSERT_NEAR(double(out[size_t(i)]), ref, 4 * 6e-8 * mag + 1e-30) << i;
  }
}

TEST(Mpi, GatherScatterAllToAllBroadcast) {
  const int n = world().size(), me = world().rank();
  const int64_t k = 5;
  // all_gather: rank r's block at r*k.
  std::vector<int32_t> mine(k), got(size_t(k * n));
  for (int64_t i = 0; i < k; ++i)
    mine[size_t(i)] = me * 100 + int32_t(i);
  ASSERT_TRUE(world()
                  .allGather(hostIn(mine.data(), k, DType::I32),
                             hostOut(got.data(), k * n, DType::I32))
                  .isOk());
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i)
      EXPECT_EQ(got[size_t(r * k + i)], r * 100 + i);
  // reduce_scatter: block r of the rank-order sum goes to rank r.
  std::vector<std::vector<uint8_t>> all;
  std::vector<const void *> ptrs;
  for (int r = 0; r < n; ++r)
    all.push_back(inputOf(r, k * n, DType::F32, 5));
  for (auto &a : all)
    ptrs.push_back(a.data());
  std::vector<float> want(static_cast<size_t>(k)), out(static_cast<size_t>(k));
  reduceInto(ptrs, me * k, k, DType::F32, ReduceOp::Sum, want.data());
  ASSERT_TRUE(world()
                  .reduceScatter(hostIn(all[size_t(me)].data(), k * n,
                                        DType::F32),
                                 hostOut(out.data(), k, DType::F32),
                                 ReduceOp::Sum)
                  .isOk());
  EXPECT_EQ(0, std::memcmp(out.data(), want.data(), size_t(k) * 4));
  // all_to_all: block j of rank i lands in block i of rank j.
  std::vector<int64_t> send(size_t(k * n)), recv(size_t(k * n));
  for (int j = 0; j < n; ++j)
    for (int64_t i = 0; i < k; ++i)
      send[size_t(j * k + i)] = me * 1000 + j * 10 + i;
  ASSERT_TRUE(world()
                  .allToAll(hostIn(send.data(), k * n, DType::I64),
                            hostOut(recv.data(), k * n, DType::I64))
                  .isOk());
  for (int src = 0; src < n; ++src)
    for (int64_t i = 0; i < k; ++i)
      EXPECT_EQ(recv[size_t(src * k + i)], src * 1000 + me * 10 + i);
  // broadcast from rank 2.
  std::vector<float> b(3, float(me));
  ASSERT_TRUE(world().broadcast(hostOut(b.data(), 3, DType::F32), 2).isOk());
  EXPECT_EQ(b, std::vector<float>(3, 2.0f));
}

TEST(Mpi, SplitFormsGroupsByColor) {
  const int me = world().rank();
  auto sub = world().split(me % 2, -me); // reversed order within a color
  ASSERT_TRUE(sub.isOk()) << sub.status().message();
  ASSERT_TRUE(*sub);
  Communicator &g = **sub;
  EXPECT_EQ(g.size(), 2);
  EXPECT_EQ(g.rank(), me < 2 ? 1 : 0);
  int64_t x = me, y = 0;
  ASSERT_TRUE(g.allReduce(hostIn(&x, 1, DType::I64),
                          hostOut(&y, 1, DType::I64), ReduceOp::Sum)
                  .isOk());
  EXPECT_EQ(y, me % 2 == 0 ? 0 + 2 : 1 + 3);
  auto none = world().split(me == 3 ? -1 : 0, me);
  ASSERT_TRUE(none.isOk());
  EXPECT_EQ(bool(*none), me != 3);
}

TEST(Mpi, MismatchedCallsFailOnEveryRankAndKeepTheGroupUsable) {
  const int me = world().rank();
  std::vector<float> x(8, 1.0f), y(8);
  int64_t count = me == 1 ? 7 : 8;
  Status st = world().allReduce(hostIn(x.data(), count, DType::F32),
                                hostOut(y.data(), count, DType::F32),
                                ReduceOp::Sum);
  ASSERT_FALSE(st.isOk());
  EXPECT_TRUE(contains(st.message(), "all_reduce (rank " + std::to_string(me)))
      << st.message();
  EXPECT_TRUE(contains(st.message(), "called all_reduce with")) << st.message();
  // The data was never exchanged, so the group goes on.
  ASSERT_TRUE(world()
                  .allReduce(hostIn(x.data(), 8, DType::F32),
                             hostOut(y.data(), 8, DType::F32), ReduceOp::Sum)
                  .isOk());
  EXPECT_EQ(y[0], 4.0f);
}

TEST(Mpi, SendRecvPairsAndChecksWhatArrives) {
  const int n = world().size(), me = world().rank();
  int32_t v = me * 7, got = -1;
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  // Even ranks send first, so the ring cannot deadlock with blocking sends.
  if (me % 2 == 0) {
    ASSERT_TRUE(world().send(hostIn(&v, 1, DType::I32), next).isOk());
    ASSERT_TRUE(world().recv(hostOut(&got, 1, DType::I32), prev).isOk());
  } else {
    ASSERT_TRUE(world().recv(hostOut(&got, 1, DType::I32), prev).isOk());
    ASSERT_TRUE(world().send(hostIn(&v, 1, DType::I32), next).isOk());
  }
  EXPECT_EQ(got, prev * 7);
  // Rank 0 sends 2 elements, rank 1 expects 3: an error naming both.
  if (me == 0) {
    int32_t two[2] = {1, 2};
    EXPECT_TRUE(world().send(hostIn(two, 2, DType::I32), 1).isOk());
  } else if (me == 1) {
    int32_t three[3];
    Status st = world().recv(hostOut(three, 3, DType::I32), 0);
    ASSERT_FALSE(st.isOk());
    EXPECT_TRUE(contains(st.message(), "rank 0 sent 2 elements of i32, this "
                                       "rank expects 3 of i32"))
        << st.message();
  }
  EXPECT_FALSE(world().send(hostIn(&v, 1, DType::I32), me).isOk());
  ASSERT_TRUE(world().barrier().isOk());
}

TEST(Mpi, AMissingRankTimesOutWithAMessage) {
  const int me = world().rank();
  auto sub = world().split(0, me);
  ASSERT_TRUE(sub.isOk() && *sub);
  Communicator &g = **sub;
  g.setTimeout(std::chrono::milliseconds(300));
  if (me != 0) {
    auto t0 = std::chrono::steady_clock::now();
    Status st = g.barrier();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             t0)
                   .count();
    ASSERT_FALSE(st.isOk());
    EXPECT_TRUE(contains(st.message(), "timed out after 0.3")) << st.message();
    EXPECT_LT(s, 5.0);
    // The group is unusable afterwards, and says so.
    Status again = g.barrier();
    EXPECT_TRUE(contains(again.message(), "earlier call timed out"))
        << again.message();
  }
  ASSERT_TRUE(world().barrier().isOk());
  if (me == 0) { // completes the others' abandoned barrier
    EXPECT_TRUE(g.barrier().isOk());
  }
  ASSERT_TRUE(world().barrier().isOk());
}

// A call abandoned on a timeout leaves its requests pending in MPI, which
// may still write a late peer's data into the call's working buffers. They
// must not be freed: here ranks 1-3 give up on an all-reduce rank 0 joins a
// second later, then allocate blocks of the size of the call's descriptor
// exchange (the allocator hands back what was freed last) and fill them;
// rank 0's contribution arriving meanwhile must not land in them. Before
// the buffers were kept, it did, and in a real job a process that had seen
// a peer fail crashed inside MPI_Testall.
TEST(Mpi, AnAbandonedCallKeepsItsBuffersForLateData) {
  const int me = world().rank();
  auto sub = world().split(0, me);
  ASSERT_TRUE(sub.isOk() && *sub);
  Communicator &g = **sub;
  std::vector<float> x(64, 1.0f), y(64, 0.0f);
  std::vector<std::unique_ptr<std::vector<uint8_t>>> blocks;
  if (me != 0) {
    g.setTimeout(std::chrono::milliseconds(300));
    Status st = g.allReduce(hostIn(x.data(), 64, DType::F32),
                            hostOut(y.data(), 64, DType::F32), ReduceOp::Sum);
    ASSERT_FALSE(st.isOk());
    EXPECT_TRUE(contains(st.message(), "timed out")) << st.message();
    for (size_t bytes : {size_t(160), size_t(200), size_t(256), size_t(64)})
      for (int i = 0; i < 64; ++i)
        blocks.push_back(
            std::make_unique<std::vector<uint8_t>>(bytes, uint8_t(0xAB)));
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    g.setTimeout(std::chrono::milliseconds(1000));
    (void)g.allReduce(hostIn(x.data(), 64, DType::F32),
                      hostOut(y.data(), 64, DType::F32), ReduceOp::Sum);
  }
  // Ranks 1-3 make progress here while rank 0 sends.
  ASSERT_TRUE(world().barrier().isOk());
  ASSERT_TRUE(world().barrier().isOk());
  size_t hit = 0;
  for (auto &b : blocks)
    for (uint8_t v : *b)
      hit += v != 0xAB;
  EXPECT_EQ(hit, 0u) << "a late message landed in memory the call had freed";
}

// Creating a world waits a bounded time for the other processes: here rank
// 3 comes 1.5 s late and the others, with a 0.3 s timeout, fail with a
// message instead of waiting (they would hang forever on a stopped peer).
// Rank 3 then completes the duplication the others abandoned.
TEST(Mpi, CreatingAWorldWaitsBoundedForALateProcess) {
  const int me = world().rank();
  ASSERT_TRUE(world().barrier().isOk());
  MpiOptions o;
  if (me == 3) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    o.timeout = std::chrono::milliseconds(20000);
    auto late = createMpiWorld(o);
    EXPECT_TRUE(late.isOk()) << late.status().message();
  } else {
    o.timeout = std::chrono::milliseconds(300);
    auto t0 = std::chrono::steady_clock::now();
    auto early = createMpiWorld(o);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             t0)
                   .count();
    ASSERT_FALSE(early.isOk());
    EXPECT_TRUE(contains(early.status().message(),
                         "creating the MPI world: timed out after 0.3"))
        << early.status().message();
    EXPECT_TRUE(contains(early.status().message(), "was stopped"))
        << early.status().message();
    EXPECT_LT(s, 1.4);
  }
  ASSERT_TRUE(world().barrier().isOk());
}

TEST(Mpi, AbortFailsLaterCallsWithTheReason) {
  auto sub = world().split(world().rank(), 0); // a group of one per rank
  ASSERT_TRUE(sub.isOk() && *sub);
  (*sub)->abort("rank 9 failed: test");
  float x = 1, y = 0;
  Status st = (*sub)->allReduce(hostIn(&x, 1, DType::F32),
                                hostOut(&y, 1, DType::F32), ReduceOp::Sum);
  ASSERT_FALSE(st.isOk());
  EXPECT_TRUE(contains(st.message(), "aborted: rank 9 failed: test"))
      << st.message();
}

/// Runs fn(communicator) on one thread per rank of this process's part of a
/// hybrid world of 2 ranks per process (8 ranks over the 4 processes).
void onHybridRanks(const std::function<void(Communicator &)> &fn) {
  auto made = createHybridWorld(2);
  ASSERT_TRUE(made.isOk()) << made.status().message();
  std::vector<std::unique_ptr<Communicator>> comms = made.take();
  ASSERT_EQ(comms.size(), 2u);
  std::vector<std::thread> threads;
  for (auto &c : comms)
    threads.emplace_back([&fn, &c] { fn(*c); });
  for (auto &t : threads)
    t.join();
}

TEST(Hybrid, CollectivesEqualTheRankOrderReduction) {
  onHybridRanks([](Communicator &c) {
    const int n = c.size(), me = c.rank();
    EXPECT_EQ(n, 2 * world().size());
    EXPECT_EQ(me / 2, world().rank()); // ranks 2p and 2p+1 live in process p
    for (DType t : {DType::F32, DType::BF16, DType::I64})
      for (int64_t count : {int64_t(1), int64_t(7), int64_t(1000)}) {
        std::vector<std::vector<uint8_t>> all;
        std::vector<const void *> ptrs;
        for (int r = 0; r < n; ++r)
          all.push_back(inputOf(r, count * n, t, uint32_t(count) + 5));
        for (auto &a : all)
          ptrs.push_back(a.data());
        const int64_t es = dtypeSize(t);
        std::vector<uint8_t> want(size_t(count * n * es));
        reduceInto(ptrs, 0, count * n, t, ReduceOp::Sum, want.data());
        std::vector<uint8_t> out(want.size());
        Status st = c.allReduce(hostIn(all[size_t(me)].data(), count * n, t),
                                hostOut(out.data(), count * n, t),
                                ReduceOp::Sum);
        ASSERT_TRUE(st.isOk()) << st.message();
        EXPECT_EQ(out, want) << "all_reduce " << dtypeName(t) << " " << count;
        std::vector<uint8_t> block(size_t(count * es));
        st = c.reduceScatter(hostIn(all[size_t(me)].data(), count * n, t),
                             hostOut(block.data(), count, t), ReduceOp::Sum);
        ASSERT_TRUE(st.isOk()) << st.message();
        EXPECT_EQ(0, std::memcmp(block.data(), want.data() + me * count * es,
                                 block.size()));
        // In place: the output is this rank's block of the input.
        std::vector<uint8_t> inplace = all[size_t(me)];
        st = c.reduceScatter(
            hostIn(inplace.data(), count * n, t),
            hostOut(inplace.data() + me * count * es, count, t), ReduceOp::Sum);
        ASSERT_TRUE(st.isOk()) << st.message();
        EXPECT_EQ(0, std::memcmp(inplace.data() + me * count * es,
                                 want.data() + me * count * es, block.size()))
            << "in-place reduce_scatter " << dtypeName(t) << " " << count;
        std::vector<uint8_t> gathered(size_t(count * n * es));
        st = c.allGather(hostIn(all[size_t(me)].data(), count, t),
                         hostOut(gathered.data(), count * n, t));
        ASSERT_TRUE(st.isOk()) << st.message();
        for (int r = 0; r < n; ++r)
          EXPECT_EQ(0, std::memcmp(gathered.data() + r * count * es,
                                   all[size_t(r)].data(), size_t(count * es)));
        std::vector<uint8_t> swapped(size_t(count * n * es));
        st = c.allToAll(hostIn(all[size_t(me)].data(), count * n, t),
                        hostOut(swapped.data(), count * n, t));
        ASSERT_TRUE(st.isOk()) << st.message();
        for (int r = 0; r < n; ++r) // block me of rank r's input
          EXPECT_EQ(0, std::memcmp(swapped.data() + r * count * es,
                                   all[size_t(r)].data() + me * count * es,
                                   size_t(count * es)));
        std::vector<uint8_t> b = all[size_t(me)];
        st = c.broadcast(hostOut(b.data(), count, t), 3);
        ASSERT_TRUE(st.isOk()) << st.message();
        EXPECT_EQ(0, std::memcmp(b.data(), all[3].data(), size_t(count * es)));
      }
  });
  ASSERT_TRUE(world().barrier().isOk());
}

TEST(Hybrid, SendsAroundARingAllAtOnce) {
  onHybridRanks([](Communicator &c) {
    const int n = c.size(), me = c.rank();
    // Every rank sends first: buffered sends cannot deadlock.
    std::vector<float> v(5000, float(me)), got(5000, -1);
    ASSERT_TRUE(c.send(hostIn(v.data(), 5000, DType::F32), (me + 1) % n).isOk());
    ASSERT_TRUE(c.send(hostIn(v.data(), 7, DType::F32), (me + 1) % n).isOk());
    ASSERT_TRUE(
        c.recv(hostOut(got.data(), 5000, DType::F32), (me + n - 1) % n).isOk());
    EXPECT_EQ(got[4999], float((me + n - 1) % n));
    Status st = c.recv(hostOut(got.data(), 8, DType::F32), (me + n - 1) % n);
    ASSERT_FALSE(st.isOk());
    EXPECT_TRUE(contains(st.message(), "sent 7 elements of f32, this rank "
                                       "expects 8 of f32"))
        << st.message();
    ASSERT_TRUE(c.barrier().isOk());
  });
  ASSERT_TRUE(world().barrier().isOk());
}

TEST(Hybrid, GroupsInsideAProcessAreInProcess) {
  onHybridRanks([](Communicator &c) {
    const int me = c.rank();
    // Pairs (2p, 2p+1) live in one process; (r, r + 2, ...) span processes.
    auto inside = c.split(me / 2, me);
    auto across = c.split(me % 2, me);
    ASSERT_TRUE(inside.isOk() && *inside) << inside.status().message();
    ASSERT_TRUE(across.isOk() && *across) << across.status().message();
    EXPECT_EQ((*inside)->size(), 2);
    EXPECT_EQ((*across)->size(), c.size() / 2);
    float x = float(me), y = 0;
    ASSERT_TRUE((*inside)->allReduce(hostIn(&x, 1, DType::F32),
                                     hostOut(&y, 1, DType::F32), ReduceOp::Sum)
                    .isOk());
    EXPECT_EQ(y, float(me / 2 * 4 + 1));
    ASSERT_TRUE((*across)->allReduce(hostIn(&x, 1, DType::F32),
                                     hostOut(&y, 1, DType::F32), ReduceOp::Max)
                    .isOk());
    EXPECT_EQ(y, float(c.size() - 2 + me % 2));
    // A send to oneself names the communicator: the in-process one for the
    // pair, the hybrid one for the spanning group.
    Status a = (*inside)->send(hostIn(&x, 1, DType::F32), (*inside)->rank());
    Status b = (*across)->send(hostIn(&x, 1, DType::F32), (*across)->rank());
    EXPECT_FALSE(contains(a.message(), "MPI")) << a.message();
    EXPECT_TRUE(contains(b.message(), "MPI, hybrid")) << b.message();
  });
  ASSERT_TRUE(world().barrier().isOk());
}

} // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto info = initMpi(&argc, &argv);
  if (!info) {
    std::fprintf(stderr, "%s\n", info.status().message().c_str());
    return 1;
  }
  auto w = createMpiWorld();
  if (!w) {
    std::fprintf(stderr, "%s\n", w.status().message().c_str());
    return 1;
  }
  gWorld = w.take();
  int rc = RUN_ALL_TESTS();
  // Every rank reports; the job fails if any rank failed.
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  gWorld.reset();
  finalizeMpi();
  return worst;
}
