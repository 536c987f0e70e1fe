// planCommunication() (runtime/exec/CommPlan.h), the copies-and-one-
// collective form of the communication instructions that the cuda backend
// runs on the device, against the CPU backend's runCommunication (the
// reference): every op, along every axis, for several group sizes and
// element types, run by one thread per rank over an in-process group. The
// results must be the same bytes.
#include "runtime/comm/InProcessCommunicator.h"
#include "runtime/exec/CommPlan.h"
#include "runtime/exec/CpuBackend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

using namespace dlopt::rt;

namespace {

struct PlanCase {
  std::string op;
  std::map<std::string, AttrValue> attrs;
  TensorType x, y;
};

std::string describe(const PlanCase &c, int n) {
  std::string s = c.op + " " + c.x.str() + " -> " + c.y.str() + " over " +
                  std::to_string(n) + ":";
  for (const auto &[k, v] : c.attrs)
    if (const int64_t *i = std::get_if<int64_t>(&v))
      s += " " + k + "=" + std::to_string(*i);
    else if (const std::string *t = std::get_if<std::string>(&v))
      s += " " + k + "=" + *t;
  return s;
}

/// Runs `c` on n ranks with the CPU backend and with the plan; every
/// rank's results must be equal bytes.
void check(const PlanCase &c, int n) {
  SCOPED_TRACE(describe(c, n));
  Instr instr;
  instr.op = c.op;
  instr.attrs = c.attrs;
  instr.loc = "test:1:1";
  auto group = createInProcessGroup(n);
  const size_t ranks = size_t(n);
  std::vector<std::vector<uint8_t>> xs(ranks), want(ranks), got(ranks);
  std::mt19937 gen(1234);
  for (int r = 0; r < n; ++r) {
    xs[size_t(r)].resize(size_t(c.x.byteSize()));
    for (uint8_t &b : xs[size_t(r)])
      b = uint8_t(gen() & 0x3f); // small floats / ints, never NaN
    want[size_t(r)].assign(size_t(c.y.byteSize()), 0xAB);
    got[size_t(r)].assign(size_t(c.y.byteSize()), 0xCD);
  }
  std::vector<Status> wantSt(ranks), gotSt(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Communicator *comm = group[size_t(r)].get();
      Communicator *const groups[] = {comm};
      RunContext ctx;
      ctx.rank = r;
      ctx.worldSize = n;
      ctx.groups = groups;
      CpuBackend cpu;
      TensorRef in{xs[size_t(r)].data(), c.x}, out{want[size_t(r)].data(), c.y};
      wantSt[size_t(r)] = cpu.run(instr, {&in, 1}, {&out, 1}, ctx);
      Expected<CommPlan> plan =
          planCommunication(instr, c.x, c.y, comm->size(), comm->rank());
      if (!plan) {
        gotSt[size_t(r)] = plan.status();
        comm->abort("no plan");
        return;
      }
      gotSt[size_t(r)] = runCommPlanOnHost(*plan, comm, xs[size_t(r)].data(),
                                           got[size_t(r)].data());
    });
  for (auto &t : threads)
    t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(wantSt[size_t(r)]) << wantSt[size_t(r)].message();
    ASSERT_TRUE(gotSt[size_t(r)]) << gotSt[size_t(r)].message();
    EXPECT_EQ(got[size_t(r)], want[size_t(r)]) << "rank " << r;
  }
}

TensorType tt(std::vector<int64_t> shape, DType d = DType::F32) {
  return {d, std::move(shape)};
}

std::vector<int64_t> scaled(std::vector<int64_t> s, size_t axis, int64_t f,
                            bool divide) {
  s[axis] = divide ? s[axis] / f : s[axis] * f;
  return s;
}

} // namespace

TEST(CommPlan, MatchesTheCpuBackendForEveryOpAndAxis) {
  const std::vector<int64_t> shape = {4, 6, 2, 12};
  for (int n : {1, 2, 3}) {
    for (DType d : {DType::F32, DType::BF16, DType::I64}) {
      for (const char *red : {"sum", "max", "avg"}) {
        if (d == DType::I64 && std::string(red) == "avg")
          continue;
        check({"all_reduce", {{"group", int64_t(0)}, {"reduce", std::string(red)}},
               tt(shape, d), tt(shape, d)},
              n);
      }
      check({"broadcast", {{"group", int64_t(0)}, {"root", int64_t(n - 1)}},
             tt(shape, d), tt(shape, d)},
            n);
      for (size_t axis = 0; axis < shape.size(); ++axis) {
        int64_t a = int64_t(axis);
        check({"all_gather", {{"group", int64_t(0)}, {"axis", a}},
               tt(shape, d), tt(scaled(shape, axis, n, false), d)},
              n);
        if (shape[axis] % n)
          continue;
        check({"reduce_scatter",
               {{"group", int64_t(0)}, {"axis", a}, {"reduce", std::string("sum")}},
               tt(shape, d), tt(scaled(shape, axis, n, true), d)},
              n);
        check({"all_slice", {{"group", int64_t(0)}, {"axis", a}},
               tt(shape, d), tt(scaled(shape, axis, n, true), d)},
              n);
        for (size_t concat = 0; concat < shape.size(); ++concat)
          check({"all_to_all",
                 {{"group", int64_t(0)},
                  {"split_axis", a},
                  {"concat_axis", int64_t(concat)}},
                 tt(shape, d),
                 tt(scaled(scaled(shape, axis, n, true), concat, n, false), d)},
                n);
      }
    }
  }
  // Rank 0 and size-1 dims.
  check({"all_reduce", {{"group", int64_t(0)}, {"reduce", std::string("min")}},
         tt({}), tt({})},
        2);
  check({"all_gather", {{"group", int64_t(0)}, {"axis", int64_t(1)}},
         tt({1, 3, 1}), tt({1, 6, 1})},
        2);
}

TEST(CommPlan, CopiesAreStridedAsDocumented) {
  // all_gather along dim 1 of [2, 3] f32 over 2: the gathered [2 ranks][2
  // rows][12 bytes] are interleaved into [2 rows][2 ranks][12 bytes].
  Instr in;
  in.op = "all_gather";
  in.attrs = {{"group", int64_t(0)}, {"axis", int64_t(1)}};
  auto p = planCommunication(in, tt({2, 3}), tt({2, 6}), 2, 0);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->call, CollectiveKind::AllGather);
  EXPECT_EQ(p->in, CommBuffer::X);
  EXPECT_EQ(p->out, CommBuffer::Recv);
  EXPECT_EQ(p->recvBytes, 48);
  ASSERT_EQ(p->after.size(), 2u);
  const BlockCopy &c = p->after[1];
  EXPECT_EQ(c.dst, CommBuffer::Y);
  EXPECT_EQ(c.src, CommBuffer::Recv);
  EXPECT_EQ(c.dstOffset, 12);
  EXPECT_EQ(c.dstPitch, 24);
  EXPECT_EQ(c.srcOffset, 24);
  EXPECT_EQ(c.srcPitch, 12);
  EXPECT_EQ(c.width, 12);
  EXPECT_EQ(c.height, 2);
  // Along dim 0 nothing is copied.
  in.attrs["axis"] = int64_t(0);
  p = planCommunication(in, tt({2, 3}), tt({4, 3}), 2, 1);
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->before.empty() && p->after.empty());
  EXPECT_EQ(p->out, CommBuffer::Y);
  // all_slice of rank 1 is one strided copy and no collective.
  in.op = "all_slice";
  in.attrs["axis"] = int64_t(1);
  p = planCommunication(in, tt({2, 4}), tt({2, 2}), 2, 1);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->call, CollectiveKind::None);
  ASSERT_EQ(p->before.size(), 1u);
  EXPECT_EQ(p->before[0].srcOffset, 8);
  EXPECT_EQ(p->before[0].srcPitch, 16);
}

TEST(CommPlan, RefusesInconsistentInstructions) {
  Instr in;
  in.op = "all_gather";
  in.loc = "m.mlir:3:4";
  in.attrs = {{"group", int64_t(0)}, {"axis", int64_t(1)}};
  auto p = planCommunication(in, tt({2, 3}), tt({2, 7}), 2, 0);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("'all_gather' at m.mlir:3:4: expects "
                                      "a 2x6xf32 result"),
            std::string::npos)
      << p.status().message();
  in.attrs["axis"] = int64_t(2);
  EXPECT_FALSE(planCommunication(in, tt({2, 3}), tt({2, 6}), 2, 0));
  in.op = "reduce_scatter";
  in.attrs = {{"group", int64_t(0)}, {"axis", int64_t(1)},
              {"reduce", std::string("prod")}};
  p = planCommunication(in, tt({2, 4}), tt({2, 2}), 2, 0);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("reduce 'prod'"), std::string::npos);
  in.op = "all_slice";
  in.attrs = {{"group", int64_t(0)}, {"axis", int64_t(1)}};
  EXPECT_FALSE(planCommunication(in, tt({2, 3}), tt({2, 1}), 2, 0));
  EXPECT_FALSE(planCommunication(in, tt({2, 4}), tt({2, 2}), 2, 2));
  in.op = "send";
  EXPECT_FALSE(planCommunication(in, tt({2, 4}), tt({2, 4}), 2, 0));
}
