//===- InProcessCommunicatorTest.cpp - Collectives over threads ----------===//
//
// Every collective against a serial reference (reduction in rank order) for
// 1-4 ranks and f32/bf16/i32/i64, plus determinism, argument mismatches,
// timeouts, abort and split.
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/InProcessCommunicator.h"
#include "runtime/cpu/Half.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <thread>

using namespace dlopt::rt;
using namespace std::chrono_literals;

namespace {

using Bytes = std::vector<uint8_t>;

/// Runs fn(comm, rank) on one thread per rank; returns each rank's Status.
std::vector<Status>
runRanks(std::vector<std::unique_ptr<Communicator>> &comms,
         const std::function<Status(Communicator &, int)> &fn) {
  std::vector<Status> st(comms.size());
  std::vector<std::thread> ts;
  for (size_t r = 0; r < comms.size(); ++r)
    ts.emplace_back([&, r] { st[r] = fn(*comms[r], int(r)); });
  for (auto &t : ts)
    t.join();
  return st;
}

Bytes randomData(DType t, int64_t n, std::mt19937 &rng) {
  Bytes b(size_t(n * dtypeSize(t)));
  std::uniform_real_distribution<float> f(-10.f, 10.f);
  std::uniform_int_distribution<int64_t> i(-1000000, 1000000);
  for (int64_t k = 0; k < n; ++k) {
    uint8_t *p = b.data() + k * dtypeSize(t);
    switch (t) {
    case DType::F32: { float v = f(rng); std::memcpy(p, &v, 4); break; }
    case DType::BF16: { uint16_t v = floatToBf16(f(rng)); std::memcpy(p, &v, 2); break; }
    case DType::F16: { uint16_t v = floatToHalf(f(rng)); std::memcpy(p, &v, 2); break; }
    case DType::I32: { int32_t v = int32_t(i(rng)); std::memcpy(p, &v, 4); break; }
    case DType::I64: { int64_t v = i(rng) * 1000003; std::memcpy(p, &v, 8); break; }
    default: break;
    }
  }
  return b;
}

bool isFloatT(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

double loadD(DType t, const uint8_t *p) {
  switch (t) {
  case DType::F32: { float v; std::memcpy(&v, p, 4); return v; }
  case DType::BF16: { uint16_t v; std::memcpy(&v, p, 2); return bf16ToFloat(v); }
  case DType::F16: { uint16_t v; std::memcpy(&v, p, 2); return halfToFloat(v); }
  case DType::I32: { int32_t v; std::memcpy(&v, p, 4); return double(v); }
  case DType::I64: { int64_t v; std::memcpy(&v, p, 8); return double(v); }
  default: return 0;
  }
}

/// Serial reference: element-wise reduction in rank order; floats accumulate
/// in f32 and round once, integers in i64.
Bytes reference(DType t, ReduceOp op, const std::vector<Bytes> &ins,
                int64_t off, int64_t cnt) {
  const int64_t es = dtypeSize(t);
  const int n = int(ins.size());
  Bytes out(size_t(cnt * es));
  for (int64_t i = 0; i < cnt; ++i) {
    const size_t at = size_t((off + i) * es);
    uint8_t *dst = out.data() + i * es;
    if (isFloatT(t)) {
      float acc = float(loadD(t, ins[0].data() + at));
      for (int q = 1; q < n; ++q) {
        float x = float(loadD(t, ins[q].data() + at));
        if (op == ReduceOp::Sum || op == ReduceOp::Avg) acc += x;
        else if (op == ReduceOp::Max) acc = std::max(acc, x);
        else acc = std::min(acc, x);
      }
      if (op == ReduceOp::Avg) acc /= float(n);
      if (t == DType::F32) std::memcpy(dst, &acc, 4);
      else { uint16_t h = t == DType::BF16 ? floatToBf16(acc) : floatToHalf(acc); std::memcpy(dst, &h, 2); }
    } else {
      auto ld = [&](int q) {
        if (t == DType::I32) { int32_t v; std::memcpy(&v, ins[q].data() + at, 4); return int64_t(v); }
        int64_t v; std::memcpy(&v, ins[q].data() + at, 8); return v;
      };
      int64_t acc = ld(0);
      for (int q = 1; q < n; ++q) {
        int64_t x = ld(q);
        if (op == ReduceOp::Sum || op == ReduceOp::Avg) acc += x;
        else if (op == ReduceOp::Max) acc = std::max(acc, x);
        else acc = std::min(acc, x);
      }
      if (op == ReduceOp::Avg) acc /= n;
      if (t == DType::I32) { int32_t v = int32_t(acc); std::memcpy(dst, &v, 4); }
      else std::memcpy(dst, &acc, 8);
    }
  }
  return out;
}

struct Case { int n; DType t; };

class CollectiveTest : public ::testing::TestWithParam<Case> {};

TEST_P(CollectiveTest, MatchesSerialReference) {
  const int n = GetParam().n;
  const DType t = GetParam().t;
  const int64_t es = dtypeSize(t);
  const int64_t blk = 7; // elements per rank block
  const int64_t cnt = blk * n;
  std::mt19937 rng(1234 + n * 10 + int(t));
  std::vector<Bytes> ins;
  for (int r = 0; r < n; ++r)
    ins.push_back(randomData(t, cnt, rng));
  auto comms = createInProcessGroup(n);
  ASSERT_EQ(comms.size(), size_t(n));

  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg}) {
    SCOPED_TRACE(reduceOpName(op));
    Bytes want = reference(t, op, ins, 0, cnt);
    std::vector<Bytes> outs(n, Bytes(size_t(cnt * es)));
    auto st = runRanks(comms, [&](Communicator &c, int r) {
      return c.allReduce(hostIn(ins[r].data(), cnt, t), hostOut(outs[r].data(), cnt, t), op);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].isOk()) << st[r].message();
      EXPECT_EQ(outs[r], want) << "allReduce rank " << r;
    }
    // In place.
    std::vector<Bytes> bufs = ins;
    st = runRanks(comms, [&](Communicator &c, int r) {
      return c.allReduce(hostIn(bufs[r].data(), cnt, t), hostOut(bufs[r].data(), cnt, t), op);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].isOk()) << st[r].message();
      EXPECT_EQ(bufs[r], want) << "in-place allReduce rank " << r;
    }
    // Reduce-scatter.
    std::vector<Bytes> rs(n, Bytes(size_t(blk * es)));
    st = runRanks(comms, [&](Communicator &c, int r) {
      return c.reduceScatter(hostIn(ins[r].data(), cnt, t), hostOut(rs[r].data(), blk, t), op);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].isOk()) << st[r].message();
      EXPECT_EQ(rs[r], reference(t, op, ins, r * blk, blk)) << "reduceScatter rank " << r;
    }
  }

  // All-gather: rank r contributes block r of its input.
  {
    std::vector<Bytes> outs(n, Bytes(size_t(cnt * es)));
    Bytes want(size_t(cnt * es));
    for (int r = 0; r < n; ++r)
      std::memcpy(want.data() + r * blk * es, ins[r].data(), size_t(blk * es));
    auto st = runRanks(comms, [&](Communicator &c, int r) {
      return c.allGather(hostIn(ins[r].data(), blk, t), hostOut(outs[r].data(), cnt, t));
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].isOk()) << st[r].message();
      EXPECT_EQ(outs[r], want) << "allGather rank " << r;
    }
  }
  // All-to-all: block j of rank i -> block i of rank j.
  {
    std::vector<Bytes> outs(n, Bytes(size_t(cnt * es)));
    auto st = runRanks(comms, [&](Communicator &c, int r) {
      return c.allToAll(hostIn(ins[r].data(), cnt, t), hostOut(outs[r].data(), cnt, t));
    });
    for (int j = 0; j < n; ++j) {
      ASSERT_TRUE(st[j].isOk()) << st[j].message();
      for (int i = 0; i < n; ++i)
        EXPECT_EQ(0, std::memcmp(outs[j].data() + i * blk * es,
                                 ins[i].data() + j * blk * es, size_t(blk * es)))
            << "allToAll block " << i << " of rank " << j;
    }
  }
  // Broadcast from every root.
  for (int root = 0; root < n; ++root) {
    std::vector<Bytes> bufs = ins;
    auto st = runRanks(comms, [&](Communicator &c, int r) {
      return c.broadcast(hostOut(bufs[r].data(), cnt, t), root);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].isOk()) << st[r].message();
      EXPECT_EQ(bufs[r], ins[root]) << "broadcast root " << root << " rank " << r;
    }
  }
  // Ring send/recv: rank r sends its input to r+1.
  {
    std::vector<Bytes> outs(n, Bytes(size_t(cnt * es)));
    auto st = runRanks(comms, [&](Communicator &c, int r) {
      DLOPT_RETURN_IF_ERROR(c.send(hostIn(ins[r].data(), cnt, t), (r + 1) % n));
      return c.recv(hostOut(outs[r].data(), cnt, t), (r + n - 1) % n);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].isOk()) << st[r].message();
      EXPECT_EQ(outs[r], ins[(r + n - 1) % n]) << "recv on rank " << r;
    }
  }
}

std::vector<Case> allCases() {
  std::vector<Case> cs;
  for (int n = 1; n <= 4; ++n)
    for (DType t : {DType::F32, DType::BF16, DType::I32, DType::I64})
      cs.push_back({n, t});
  return cs;
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectiveTest, ::testing::ValuesIn(allCases()),
                         [](const auto &info) {
                           return std::to_string(info.param.n) + "ranks_" +
                                  dtypeName(info.param.t);
                         });

TEST(InProcessCommunicator, DeterministicAcrossRuns) {
  const int n = 4;
  const int64_t cnt = 4096;
  std::mt19937 rng(7);
  std::vector<Bytes> ins;
  for (int r = 0; r < n; ++r)
    ins.push_back(randomData(DType::BF16, cnt, rng));
  Bytes first;
  for (int run = 0; run < 20; ++run) {
    auto comms = createInProcessGroup(n);
    std::vector<Bytes> outs(n, Bytes(size_t(cnt * 2)));
    auto st = runRanks(comms, [&](Communicator &c, int r) {
      if (r == run % n) // perturb the arrival order
        std::this_thread::sleep_for(1ms);
      return c.allReduce(hostIn(ins[r].data(), cnt, DType::BF16),
                         hostOut(outs[r].data(), cnt, DType::BF16), ReduceOp::Sum);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].isOk());
      if (first.empty()) first = outs[r];
      ASSERT_EQ(outs[r], first) << "run " << run << " rank " << r;
    }
  }
}

TEST(InProcessCommunicator, MismatchedSizesFailOnEveryRank) {
  auto comms = createInProcessGroup(3);
  std::vector<float> a(8, 1.f), b(8);
  auto st = runRanks(comms, [&](Communicator &c, int r) {
    int64_t cnt = r == 2 ? 5 : 8;
    return c.allReduce(hostIn(a.data(), cnt, DType::F32), hostOut(b.data(), cnt, DType::F32),
                       ReduceOp::Sum);
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(st[r].isOk());
    EXPECT_NE(st[r].message().find("mismatched"), std::string::npos) << st[r].message();
    EXPECT_NE(st[r].message().find("rank 2"), std::string::npos) << st[r].message();
  }
  // The group stays usable after an argument error.
  st = runRanks(comms, [&](Communicator &c, int) { return c.barrier(); });
  for (auto &s : st) EXPECT_TRUE(s.isOk()) << s.message();
}

TEST(InProcessCommunicator, MismatchedDtypesAndLocalErrors) {
  auto comms = createInProcessGroup(2);
  std::vector<int32_t> a(4), b(8);
  auto st = runRanks(comms, [&](Communicator &c, int r) {
    DType t = r == 0 ? DType::F32 : DType::I32;
    return c.allReduce(hostIn(a.data(), 4, t), hostOut(b.data(), 4, t), ReduceOp::Sum);
  });
  EXPECT_FALSE(st[0].isOk());
  EXPECT_FALSE(st[1].isOk());
  st = runRanks(comms, [&](Communicator &c, int r) {
    // Rank 1 passes a wrong output size for allGather.
    return c.allGather(hostIn(a.data(), 4, DType::I32), hostOut(b.data(), r == 1 ? 4 : 8, DType::I32));
  });
  for (auto &s : st) {
    ASSERT_FALSE(s.isOk());
    EXPECT_NE(s.message().find("rank 1: out.count"), std::string::npos) << s.message();
  }
  EXPECT_FALSE(comms[0]->send(hostIn(a.data(), 4, DType::I32), 2).isOk());
  EXPECT_FALSE(comms[0]->recv(hostOut(a.data(), 4, DType::I32), -1).isOk());
  CommOutput dev{a.data(), 4, DType::I32, MemorySpace::Device};
  Status s = comms[0]->send(dev, 1);
  EXPECT_NE(s.message().find("host buffers only"), std::string::npos);
}

TEST(InProcessCommunicator, TimeoutNamesMissingRanks) {
  auto comms = createInProcessGroup(3, {std::chrono::milliseconds(100)});
  std::vector<float> a(4, 1.f), b(4);
  // Rank 1 never calls.
  auto st = runRanks(comms, [&](Communicator &c, int r) -> Status {
    if (r == 1) return Status::ok();
    return c.allReduce(hostIn(a.data(), 4, DType::F32), hostOut(b.data(), 4, DType::F32),
                       ReduceOp::Sum);
  });
  for (int r : {0, 2}) {
    ASSERT_FALSE(st[r].isOk());
    EXPECT_NE(st[r].message().find("allReduce"), std::string::npos) << st[r].message();
    EXPECT_NE(st[r].message().find("[1]"), std::string::npos) << st[r].message();
  }
  std::cout << "timeout error: " << st[0].message() << "\n";
  // The group is aborted afterwards; nothing hangs.
  EXPECT_FALSE(comms[1]->barrier().isOk());
}

TEST(InProcessCommunicator, RecvTimeout) {
  auto comms = createInProcessGroup(2, {std::chrono::milliseconds(50)});
  float x = 0;
  Status s = comms[0]->recv(hostOut(&x, 1, DType::F32), 1);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("never sent"), std::string::npos) << s.message();
}

TEST(InProcessCommunicator, RecvSizeMismatch) {
  auto comms = createInProcessGroup(2);
  float x[4] = {1, 2, 3, 4};
  ASSERT_TRUE(comms[0]->send(hostIn(x, 4, DType::F32), 1).isOk());
  Status s = comms[1]->recv(hostOut(x, 3, DType::F32), 0);
  EXPECT_NE(s.message().find("peer sent 4 x f32"), std::string::npos) << s.message();
}

TEST(InProcessCommunicator, AbortWakesWaiters) {
  auto comms = createInProcessGroup(3); // default 60 s timeout
  auto t0 = std::chrono::steady_clock::now();
  auto st = runRanks(comms, [&](Communicator &c, int r) -> Status {
    if (r == 2) {
      std::this_thread::sleep_for(50ms);
      c.abort("test abort");
      return Status::ok();
    }
    return c.barrier();
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  for (int r : {0, 1}) {
    ASSERT_FALSE(st[r].isOk());
    EXPECT_NE(st[r].message().find("test abort"), std::string::npos) << st[r].message();
  }
  float x;
  EXPECT_FALSE(comms[0]->recv(hostOut(&x, 1, DType::F32), 1).isOk());
}

TEST(InProcessCommunicator, SplitIntoTwoGroups) {
  const int n = 4;
  auto comms = createInProcessGroup(n);
  std::vector<std::unique_ptr<Communicator>> subs(n);
  // Even ranks form color 0, odd ranks color 1; key reverses the order.
  auto st = runRanks(comms, [&](Communicator &c, int r) -> Status {
    auto sub = c.split(r % 2, -r);
    if (!sub) return sub.status();
    subs[r] = sub.take();
    return Status::ok();
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].isOk()) << st[r].message();
    ASSERT_TRUE(subs[r]);
    EXPECT_EQ(subs[r]->size(), 2);
  }
  EXPECT_EQ(subs[0]->rank(), 1); // keys 0 and -2: rank 2 comes first
  EXPECT_EQ(subs[2]->rank(), 0);
  EXPECT_EQ(subs[1]->rank(), 1);
  EXPECT_EQ(subs[3]->rank(), 0);
  std::vector<int64_t> v(n), out(n);
  st = runRanks(subs, [&](Communicator &c, int r) {
    v[r] = r;
    return c.allReduce(hostIn(&v[r], 1, DType::I64), hostOut(&out[r], 1, DType::I64),
                       ReduceOp::Sum);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].isOk()) << st[r].message();
    EXPECT_EQ(out[r], r % 2 == 0 ? 0 + 2 : 1 + 3);
  }
  // Negative color: left out.
  st = runRanks(comms, [&](Communicator &c, int r) -> Status {
    auto sub = c.split(r == 0 ? -1 : 0, 0);
    if (!sub) return sub.status();
    if ((r == 0) != (*sub == nullptr)) return Status::error("wrong membership");
    if (*sub && (*sub)->size() != n - 1) return Status::error("wrong size");
    return Status::ok();
  });
  for (auto &s : st) EXPECT_TRUE(s.isOk()) << s.message();
}

} // namespace
