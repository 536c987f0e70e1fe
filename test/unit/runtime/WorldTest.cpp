// Multi-rank executables (format v3) run as threads of one process: the
// communication instructions against references computed here, global
// binding and outputs, data parallelism against one device, and failures
// that end the run naming the rank instead of hanging.
#include "TestUtil.h"

#include "runtime/comm/InProcessCommunicator.h"
#include "runtime/exec/GlobalTensor.h"
#include "runtime/exec/Session.h"
#include "runtime/exec/CpuBackend.h"
#include "runtime/exec/World.h"

#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <random>
#include <thread>

using namespace dlopt::rt;
using namespace dlopt::rt::test;

namespace {

HostTensor randomTensor(TensorType t, uint32_t seed) {
  HostTensor h(std::move(t));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < h.numElements(); ++i)
    h.data<float>()[i] = u(gen);
  return h;
}

std::unique_ptr<World> makeWorld(const Executable &exe,
                                 std::chrono::milliseconds timeout =
                                     std::chrono::milliseconds(20000)) {
  WorldOptions o;
  o.commTimeout = timeout;
  auto w = World::create(exe, o);
  EXPECT_TRUE(w) << w.status().message();
  return w ? w.take() : nullptr;
}

/// Element (i0, i1) of a 2-D float tensor.
float at(const HostTensor &t, int64_t i, int64_t j) {
  return t.data<float>()[i * t.type.shape[1] + j];
}

} // namespace

TEST(Mesh, CoordinatesAndGroups) {
  Executable e;
  e.worldSize = 8;
  e.mesh = Mesh{{"pp", "dp", "tp"}, {2, 2, 2}};
  e.groups = {{"dp", {1}}, {"tp", {2}}, {"dp+tp", {1, 2}}};
  EXPECT_EQ(e.mesh.coords(6), (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ(e.groupRanks(0, 5), (std::vector<int32_t>{5, 7}));
  EXPECT_EQ(e.groupRanks(1, 5), (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(e.groupRanks(2, 1), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(e.groupRanks(2, 6), (std::vector<int32_t>{4, 5, 6, 7}));
}

TEST(GlobalTensor, BlocksRoundTrip) {
  Mesh mesh{{"dp", "tp"}, {2, 3}};
  GlobalLayout layout{TensorType{DType::F32, {4, 6}}, {{0}, {1}}};
  TensorType local{DType::F32, {2, 2}};
  HostTensor g = randomTensor(layout.type, 1);
  HostTensor back(layout.type);
  for (int r = 0; r < 6; ++r) {
    auto part = localPart(mesh, layout, local, r, g);
    ASSERT_TRUE(part);
    std::vector<int64_t> c = mesh.coords(r);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 2; ++j)
        EXPECT_EQ(at(*part, i, j), at(g, c[0] * 2 + i, c[1] * 2 + j));
    ASSERT_TRUE(placePart(mesh, layout, r, *part, back));
  }
  EXPECT_EQ(back.bytes, g.bytes);
  // Two axes on one dim: dp major, tp minor.
  GlobalLayout both{TensorType{DType::F32, {12, 2}}, {{0, 1}, {}}};
  auto part = localPart(mesh, both, TensorType{DType::F32, {2, 2}}, 4,
                        randomTensor(both.type, 2));
  ASSERT_TRUE(part);
  EXPECT_EQ(blockStart(mesh, both, TensorType{DType::F32, {2, 2}}, 4),
            (std::vector<int64_t>{8, 0})); // (dp 1, tp 1) -> block 4
}

namespace {

/// y = op(x) over `group` on a 2x2 (dp x tp) mesh, x split over both axes
/// on dim 0 (so each rank holds distinct data) unless `splitX` is false.
struct CollectiveCase {
  Executable exe;
  TensorType globalX, globalY;
};

CollectiveCase collective(const std::string &op,
                          std::map<std::string, AttrValue> attrs,
                          TensorType localX, TensorType localY,
                          std::vector<std::vector<int32_t>> splitY,
                          TensorType globalY) {
  ExeBuilder b;
  int32_t x = b.input("x", localX);
  TensorType gx = localX;
  gx.shape[0] *= 4;
  b.global(x, gx, {{0, 1}, {}});
  int32_t y = b.op(op, {x}, localY, attrs);
  b.output("y", y);
  if (!splitY.empty())
    b.global(y, globalY, splitY);
  CollectiveCase c;
  c.exe = b.buildSpmd(Mesh{{"dp", "tp"}, {2, 2}},
                      {{"dp", {0}}, {"tp", {1}}, {"all", {0, 1}}});
  c.globalX = gx;
  c.globalY = globalY;
  return c;
}

} // namespace

TEST(World, AllReduceOverEachGroup) {
  // x global [8, 3], rank r holds rows [2r, 2r+2). all_reduce over tp sums
  // the two blocks of each dp row group.
  auto c = collective("all_reduce", {{"group", int64_t(1)}, {"reduce", std::string("sum")}},
                      tt({2, 3}), tt({2, 3}), {{0}, {}}, tt({4, 3}));
  auto w = makeWorld(c.exe);
  ASSERT_TRUE(w);
  HostTensor x = randomTensor(c.globalX, 3);
  ASSERT_TRUE(w->bind("x", x));
  ASSERT_TRUE(w->execute());
  auto y = w->readOutput("y");
  ASSERT_TRUE(y) << y.status().message();
  // Ranks (dp, tp): block index = 2 dp + tp. Result for dp d, row i:
  // x[(2d)*2 + i] + x[(2d+1)*2 + i].
  for (int d = 0; d < 2; ++d)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        EXPECT_FLOAT_EQ(at(*y, d * 2 + i, j),
                        at(x, (2 * d) * 2 + i, j) + at(x, (2 * d + 1) * 2 + i, j));
}

TEST(World, AllGatherAndReduceScatterAlongEveryAxis) {
  // all_gather over "all" along dim 1: each rank gets x's four blocks of
  // [2, 3] concatenated along dim 1 -> [2, 12], replicated.
  auto g = collective("all_gather", {{"group", int64_t(2)}, {"axis", int64_t(1)}},
                      tt({2, 3}), tt({2, 12}), {}, tt({2, 12}));
  auto w = makeWorld(g.exe);
  ASSERT_TRUE(w);
  HostTensor x = randomTensor(g.globalX, 4);
  ASSERT_TRUE(w->bind("x", x));
  ASSERT_TRUE(w->execute());
  auto y = w->readOutput("y");
  ASSERT_TRUE(y) << y.status().message();
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        EXPECT_EQ(at(*y, i, r * 3 + j), at(x, r * 2 + i, j));

  // reduce_scatter over "all" along dim 1 of [2, 8]: rank r gets columns
  // [2r, 2r+2) of the sum of the four blocks.
  auto s = collective("reduce_scatter",
                      {{"group", int64_t(2)}, {"axis", int64_t(1)}, {"reduce", std::string("sum")}},
                      tt({2, 8}), tt({2, 2}), {{}, {0, 1}}, tt({2, 8}));
  auto w2 = makeWorld(s.exe);
  ASSERT_TRUE(w2);
  HostTensor x2 = randomTensor(s.globalX, 5);
  ASSERT_TRUE(w2->bind("x", x2));
  ASSERT_TRUE(w2->execute());
  auto y2 = w2->readOutput("y");
  ASSERT_TRUE(y2) << y2.status().message();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 8; ++j) {
      float want = 0;
      for (int r = 0; r < 4; ++r)
        want += at(x2, r * 2 + i, j);
      EXPECT_NEAR(at(*y2, i, j), want, 1e-6);
    }
}

TEST(World, AllToAllAndBroadcast) {
  // all_to_all over dp (2 ranks): split dim 1 of [2, 4], concat on dim 0.
  auto a = collective("all_to_all",
                      {{"group", int64_t(0)}, {"split_axis", int64_t(1)}, {"concat_axis", int64_t(0)}},
                      tt({2, 4}), tt({4, 2}), {{1}, {0}}, tt({8, 4}));
  auto w = makeWorld(a.exe);
  ASSERT_TRUE(w);
  HostTensor x = randomTensor(a.globalX, 6);
  ASSERT_TRUE(w->bind("x", x));
  ASSERT_TRUE(w->execute());
  // Check rank by rank: rank (d, t) receives from dp peer p its columns
  // [2d, 2d+2) as rows [2p, 2p+2).
  for (int r = 0; r < 4; ++r) {
    auto part = w->session(r).readOutput("y");
    ASSERT_TRUE(part);
    int d = r / 2, t = r % 2;
    for (int p = 0; p < 2; ++p) {
      int src = p * 2 + t; // the peer's rank
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
          EXPECT_EQ(at(*part, p * 2 + i, j), at(x, src * 2 + i, d * 2 + j));
    }
  }
  auto bc = collective("broadcast", {{"group", int64_t(2)}, {"root", int64_t(3)}},
                       tt({2, 3}), tt({2, 3}), {}, tt({2, 3}));
  auto w2 = makeWorld(bc.exe);
  ASSERT_TRUE(w2);
  HostTensor x2 = randomTensor(bc.globalX, 7);
  ASSERT_TRUE(w2->bind("x", x2));
  ASSERT_TRUE(w2->execute());
  auto y = w2->readOutput("y");
  ASSERT_TRUE(y) << y.status().message();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(at(*y, i, j), at(x2, 3 * 2 + i, j));
}

namespace {
// loss = mean((x w)^2) over a global batch of 8, and dloss/dw, on one
// device (dp = 1) or with the batch split over dp ranks. Each rank computes
// sum((x_r w)^2) / 8 and x_r^T (2 x_r w) / 8 (its share of the global
// mean), then sums them over dp.
Executable dataParallelLoss(int dp) {
  ExeBuilder b;
  int64_t B = 8 / dp;
  int32_t x = b.input("x", tt({B, 3}));
  int32_t w = b.param("w", tt({3, 2}), Init{"normal", 0.0, 0.5});
  int32_t y = b.op("matmul", {x, w}, tt({B, 2}));
  int32_t sq = b.op("mul", {y, y}, tt({B, 2}));
  int32_t s = b.op("sum", {sq}, tt({}), {{"dims", std::vector<int64_t>{0, 1}}, {"keepdims", int64_t(0)}});
  int32_t inv = b.constant(tt({}), {1.0f / 16.0f});
  int32_t loss = b.op("mul", {s, inv}, tt({}));
  int32_t two = b.constant(tt({}), {2.0f / 16.0f});
  int32_t dy = b.op("mul", {y, two}, tt({B, 2}));
  int32_t g = b.op("matmul", {x, dy}, tt({3, 2}), {{"transpose_a", int64_t(1)}});
  if (dp > 1) {
    b.global(x, tt({8, 3}), {{0}, {}});
    loss = b.op("all_reduce", {loss}, tt({}), {{"group", int64_t(0)}, {"reduce", std::string("sum")}});
    g = b.op("all_reduce", {g}, tt({3, 2}), {{"group", int64_t(0)}, {"reduce", std::string("sum")}});
  }
  b.output("loss", loss);
  b.output("grad", g);
  return dp > 1 ? b.buildSpmd(Mesh{{"dp"}, {dp}}, {{"dp", {0}}}) : b.build();
}
} // namespace

TEST(World, DataParallelStepEqualsOneDevice) {
  // dataParallelLoss on one device and with the batch split over dp = 4.
  auto build = dataParallelLoss;
  HostTensor x = randomTensor(tt({8, 3}), 8);
  auto one = Session::create(build(1), std::make_unique<CpuBackend>(),
                             SessionOptions{0, 42});
  ASSERT_TRUE(one);
  ASSERT_TRUE((*one)->bind("x", x));
  auto ref = (*one)->run();
  ASSERT_TRUE(ref) << ref.status().message();

  WorldOptions o;
  o.seed = 42;
  auto w = World::create(build(4), o);
  ASSERT_TRUE(w) << w.status().message();
  ASSERT_TRUE((*w)->bind("x", x));
  ASSERT_TRUE((*w)->execute());
  auto loss = (*w)->readOutput("loss");
  auto grad = (*w)->readOutput("grad");
  ASSERT_TRUE(loss && grad) << loss.status().message() << grad.status().message();
  // The same parameters (initialized by global index), so the results agree
  // to float rounding of the different summation order.
  EXPECT_NEAR(loss->data<float>()[0], (*ref)[0].tensor.data<float>()[0],
              1e-6 * std::abs((*ref)[0].tensor.data<float>()[0]));
  for (int i = 0; i < 6; ++i)
    EXPECT_NEAR(grad->data<float>()[i], (*ref)[1].tensor.data<float>()[i], 1e-6);
  auto wOne = (*one)->readArgument("w"), wDp = (*w)->readArgument("w");
  ASSERT_TRUE(wOne && wDp);
  EXPECT_EQ(wOne->bytes, wDp->bytes);
}

// Ranks spread over "processes": two Worlds of two ranks each, connected by
// an in-process group standing in for MPI (one communicator per process),
// run on two threads, give the bits of one World running all four ranks,
// and every read is collective (the other process's blocks are gathered).
TEST(World, RanksSpreadOverProcessesGiveTheBitsOfOneProcess) {
  auto build = dataParallelLoss;
  HostTensor x = randomTensor(tt({8, 3}), 8);
  WorldOptions o;
  o.seed = 42;
  auto all = World::create(build(4), o);
  ASSERT_TRUE(all) << all.status().message();
  ASSERT_TRUE((*all)->bind("x", x));
  ASSERT_TRUE((*all)->execute());
  auto wantLoss = (*all)->readOutput("loss");
  auto wantGrad = (*all)->readOutput("grad");
  ASSERT_TRUE(wantLoss && wantGrad);

  // The four ranks' world communicators and the two processes' group.
  auto worldComms = std::make_shared<std::vector<std::unique_ptr<Communicator>>>(
      createInProcessGroup(4));
  std::vector<std::unique_ptr<Communicator>> procs = createInProcessGroup(2);
  std::vector<std::unique_ptr<World>> parts(2);
  std::vector<Status> made(2, Status::ok());
  auto createPart = [&](int p) {
    WorldOptions po;
    po.seed = 42;
    po.firstRank = 2 * p;
    po.numRanks = 2;
    po.processGroup = std::shared_ptr<Communicator>(std::move(procs[size_t(p)]));
    po.worldGroup = [worldComms, p](int)
        -> Expected<std::vector<std::unique_ptr<Communicator>>> {
      std::vector<std::unique_ptr<Communicator>> mine;
      mine.push_back(std::move((*worldComms)[size_t(2 * p)]));
      mine.push_back(std::move((*worldComms)[size_t(2 * p + 1)]));
      return mine;
    };
    auto w = World::create(build(4), po);
    if (!w) {
      made[size_t(p)] = w.status();
      return;
    }
    parts[size_t(p)] = w.take();
  };
  // Creating splits the groups: collective, so both at once.
  std::thread t0(createPart, 0), t1(createPart, 1);
  t0.join();
  t1.join();
  ASSERT_TRUE(made[0] && made[1]) << made[0].message() << made[1].message();
  EXPECT_EQ(parts[1]->firstRank(), 2);
  EXPECT_EQ(parts[1]->numLocal(), 2);
  EXPECT_EQ(parts[1]->processIndex(), 1);
  std::vector<Expected<HostTensor>> loss(2, Status::error("")),
      grad(2, Status::error(""));
  auto runPart = [&](int p) {
    World &w = *parts[size_t(p)];
    ASSERT_TRUE(w.bind("x", x));
    ASSERT_TRUE(w.execute());
    loss[size_t(p)] = w.readOutput("loss");
    grad[size_t(p)] = w.readOutput("grad");
  };
  std::thread r0(runPart, 0), r1(runPart, 1);
  r0.join();
  r1.join();
  for (int p = 0; p < 2; ++p) {
    ASSERT_TRUE(loss[size_t(p)] && grad[size_t(p)])
        << loss[size_t(p)].status().message();
    EXPECT_EQ(loss[size_t(p)]->bytes, wantLoss->bytes);
    EXPECT_EQ(grad[size_t(p)]->bytes, wantGrad->bytes);
  }
  // A World of some of the ranks needs the processes' communicator.
  WorldOptions bad;
  bad.numRanks = 2;
  auto refused = World::create(build(4), bad);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("needs a communicator to the "
                                            "other processes"),
            std::string::npos)
      << refused.status().message();
}

TEST(World, SplitParamsStartFromTheGlobalInitialization) {
  ExeBuilder b;
  int32_t w = b.param("w", tt({2, 3}), Init{"normal", 0.0, 1.0});
  b.global(w, tt({4, 3}), {{0}, {}});
  int32_t y = b.op("neg", {w}, tt({2, 3}));
  b.output("y", y);
  b.global(y, tt({4, 3}), {{0}, {}});
  WorldOptions o;
  o.seed = 9;
  auto world = World::create(b.buildSpmd(Mesh{{"tp"}, {2}}, {{"tp", {0}}}), o);
  ASSERT_TRUE(world) << world.status().message();
  ASSERT_TRUE((*world)->initializeParams());
  auto got = (*world)->readArgument("w");
  ASSERT_TRUE(got) << got.status().message();
  ExeBuilder one;
  one.param("w", tt({4, 3}), Init{"normal", 0.0, 1.0});
  auto s = Session::create(one.build(), std::make_unique<CpuBackend>(),
                           SessionOptions{0, 9});
  ASSERT_TRUE(s);
  ASSERT_TRUE((*s)->initializeParams());
  auto want = (*s)->readArgument("w");
  ASSERT_TRUE(want);
  EXPECT_EQ(got->bytes, want->bytes);
}

TEST(World, AFailingRankEndsTheRunAndIsNamed) {
  // Rank 1's gather reads an id outside the table; rank 0 waits in the
  // all_reduce that follows and must be woken, not left to time out.
  ExeBuilder b;
  int32_t ids = b.input("ids", tt({2}, DType::I32));
  b.global(ids, tt({4}, DType::I32), {{0}});
  int32_t table = b.param("table", tt({4, 2}));
  int32_t rows = b.op("gather", {table, ids}, tt({2, 2}));
  int32_t s = b.op("all_reduce", {rows}, tt({2, 2}), {{"group", int64_t(0)}, {"reduce", std::string("sum")}});
  b.output("s", s);
  auto w = makeWorld(b.buildSpmd(Mesh{{"dp"}, {2}}, {{"dp", {0}}}),
                     std::chrono::milliseconds(60000));
  ASSERT_TRUE(w);
  HostTensor idv(tt({4}, DType::I32));
  int32_t vals[4] = {0, 1, 2, 99};
  std::memcpy(idv.bytes.data(), vals, sizeof(vals));
  ASSERT_TRUE(w->bind("ids", idv));
  auto start = std::chrono::steady_clock::now();
  Status st = w->execute();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                              start)
                    .count();
  ASSERT_FALSE(st);
  EXPECT_TRUE(contains(st.message(), "rank 1: ")) << st.message();
  EXPECT_TRUE(contains(st.message(), "gather")) << st.message();
  EXPECT_LT(secs, 10.0);
}

TEST(World, InvalidMultiRankExecutablesAreRefused) {
  ExeBuilder b;
  int32_t x = b.input("x", tt({2, 3}));
  b.global(x, tt({5, 3}), {{0}, {}}); // 5 does not split 2 ways into 2
  b.output("y", b.op("all_gather", {x}, tt({4, 3}), {{"group", int64_t(0)}, {"axis", int64_t(0)}}));
  Executable e = b.buildSpmd(Mesh{{"dp"}, {2}}, {{"dp", {0}}});
  Status st = e.validate();
  ASSERT_FALSE(st);
  EXPECT_TRUE(contains(st.message(), "dim 0 of 5x3xf32 split 2 ways is not the local 2x3xf32"))
      << st.message();
  e.values[size_t(x)].global->type = tt({4, 3});
  EXPECT_TRUE(e.validate()) << e.validate().message();
  e.programs[0].instrs[0].attrs["group"] = int64_t(3);
  st = e.validate();
  ASSERT_FALSE(st);
  EXPECT_TRUE(contains(st.message(), "group 3 is not in the group table (1 groups)"))
      << st.message();
  e.programs[0].instrs[0].attrs["group"] = int64_t(0);
  e.values[e.programs[0].instrs[0].results[0]].type = tt({3, 4});
  st = e.validate();
  ASSERT_FALSE(st);
  EXPECT_TRUE(contains(st.message(), "expects a 4x3xf32 result for a 2x3xf32 operand over a group of 2, got 3x4xf32"))
      << st.message();
  // Round trip through the file format keeps mesh, groups and layouts.
  e.values[e.programs[0].instrs[0].results[0]].type = tt({4, 3});
  auto bytes = serializeExecutable(e);
  ASSERT_TRUE(bytes) << bytes.status().message();
  auto back = deserializeExecutable(*bytes);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_TRUE(*back == e);
  std::string dump = dumpExecutable(*back);
  EXPECT_TRUE(contains(dump, "mesh:       dp=2")) << dump;
  EXPECT_TRUE(contains(dump, "group 0:    dp over {dp}: [0,1]")) << dump;
  EXPECT_TRUE(contains(dump, "global 4x3xf32 split [dp, -]")) << dump;
  EXPECT_TRUE(contains(dump, "program 0, ranks [0, 1]")) << dump;
}

TEST(World, AMissingReductionShowsAsDisagreeingReplicas) {
  // Each rank's partial sum, declared replicated: the ranks disagree, and
  // reading the output says so instead of returning rank 0's part.
  ExeBuilder b;
  int32_t x = b.input("x", tt({2, 3}));
  b.global(x, tt({4, 3}), {{0}, {}});
  b.output("s", b.op("sum", {x}, tt({3}), {{"dims", std::vector<int64_t>{0}}, {"keepdims", int64_t(0)}}));
  auto w = makeWorld(b.buildSpmd(Mesh{{"dp"}, {2}}, {{"dp", {0}}}));
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->bind("x", randomTensor(tt({4, 3}), 11)));
  ASSERT_TRUE(w->execute());
  auto s = w->readOutput("s");
  ASSERT_FALSE(s);
  EXPECT_EQ(s.status().message(), "output 's': ranks 0 and 1 hold different "
                                  "values of the replicated 3xf32 value");
}

namespace {

/// A two-stage pipeline over pp=2 (one program per stage): rank 0 computes
/// y = x + x and sends it; rank 1 receives it as z and outputs w = z + z.
/// `secondFirst` makes rank 1 send something back before it receives.
struct Pipeline {
  ExeBuilder b;
  int32_t x = 0, y = 0, z = 0, w = 0;
  std::vector<Instr> stage0, stage1;

  Pipeline() {
    x = b.input("x", tt({2, 3}));
    y = b.temp(tt({2, 3}));
    z = b.temp(tt({2, 3}));
    w = b.temp(tt({2, 3}));
    b.output("w", w);
    stage0 = {instr("add", {x, x}, {y}), p2p("send", {y}, {}, 1)};
    stage1 = {p2p("recv", {}, {z}, 0), instr("add", {z, z}, {w})};
  }
  static Instr instr(const std::string &op, std::vector<int32_t> ins,
                     std::vector<int32_t> outs) {
    Instr in;
    in.op = op;
    in.operands = std::move(ins);
    in.results = std::move(outs);
    in.loc = "pipe.mlir:1:1";
    return in;
  }
  static Instr p2p(const std::string &op, std::vector<int32_t> ins,
                   std::vector<int32_t> outs, int64_t peer) {
    Instr in = instr(op, std::move(ins), std::move(outs));
    in.attrs = {{"group", int64_t(0)}, {"peer", peer}};
    return in;
  }
  Executable build() {
    Executable e = b.exe;
    e.outputUpdates.clear();
    e.worldSize = 2;
    e.mesh = Mesh{{"pp"}, {2}};
    e.groups = {{"pp", {0}}};
    for (int s = 0; s < 2; ++s) {
      Program p;
      p.ranks = {s};
      p.instrs = s == 0 ? stage0 : stage1;
      e.programs.push_back(p);
    }
    for (Program &p : e.programs) {
      Expected<MemoryPlan> plan = planProgramMemory(e, p, 64);
      EXPECT_TRUE(plan) << plan.status().message();
      if (plan)
        p.memory = *plan;
    }
    return e;
  }
};

} // namespace

TEST(World, PipelineStagesSendAndReceive) {
  Pipeline p;
  Executable e = p.build();
  ASSERT_TRUE(e.validate()) << e.validate().message();
  // Through the file format: the reader validates the pairing too.
  auto bytes = serializeExecutable(e);
  ASSERT_TRUE(bytes) << bytes.status().message();
  auto back = deserializeExecutable(*bytes);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_TRUE(*back == e);
  auto w = makeWorld(e);
  ASSERT_TRUE(w);
  HostTensor x = randomTensor(tt({2, 3}), 5);
  ASSERT_TRUE(w->bind("x", x));
  Status st = w->execute();
  ASSERT_TRUE(st) << st.message();
  auto out = w->readOutput("w");
  ASSERT_TRUE(out) << out.status().message();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      EXPECT_FLOAT_EQ(at(*out, i, j), 4 * at(x, i, j));
}

TEST(World, BrokenPairingsAndDeadlocksAreRefusedAtLoad) {
  {
    // The receive expects another type.
    Pipeline p;
    int32_t other = p.b.temp(tt({3, 2}));
    p.stage1 = {Pipeline::p2p("recv", {}, {other}, 0),
                Pipeline::instr("reshape", {other}, {p.z}),
                Pipeline::instr("add", {p.z, p.z}, {p.w})};
    Status st = p.build().validate();
    ASSERT_FALSE(st);
    EXPECT_TRUE(contains(st.message(),
                         "rank 0 sends a 2x3xf32 with 'send' (instruction 1 at "
                         "pipe.mlir:1:1) to rank 1, which receives a 3x2xf32 "
                         "with 'recv' (instruction 0 at pipe.mlir:1:1)"))
        << st.message();
  }
  {
    // Nobody receives: rank 0 waits for a rank that has finished.
    Pipeline p;
    p.stage1 = {Pipeline::instr("add", {p.x, p.x}, {p.w})};
    Status st = p.build().validate();
    ASSERT_FALSE(st);
    EXPECT_TRUE(contains(st.message(),
                         "the programs can deadlock (assuming a send waits for "
                         "its receive): rank 0 sends to rank 1 with 'send' "
                         "(instruction 1 at pipe.mlir:1:1), and rank 1 has no "
                         "matching receive left"))
        << st.message();
  }
  {
    // Both stages send first: with blocking sends, neither receives.
    Pipeline p;
    int32_t back = p.b.temp(tt({2, 3}));
    int32_t got = p.b.temp(tt({2, 3}));
    p.stage0 = {Pipeline::instr("add", {p.x, p.x}, {p.y}),
                Pipeline::p2p("send", {p.y}, {}, 1),
                Pipeline::p2p("recv", {}, {got}, 1)};
    p.stage1 = {Pipeline::instr("add", {p.x, p.x}, {back}),
                Pipeline::p2p("send", {back}, {}, 0),
                Pipeline::p2p("recv", {}, {p.z}, 0),
                Pipeline::instr("add", {p.z, p.z}, {p.w})};
    Status st = p.build().validate();
    ASSERT_FALSE(st);
    EXPECT_TRUE(contains(st.message(),
                         "rank 0 waits in 'send' (instruction 1 at "
                         "pipe.mlir:1:1) to send to rank 1, which waits in "
                         "'send' (instruction 1 at pipe.mlir:1:1)"))
        << st.message();
    // Receiving first on one side makes the same exchange safe.
    std::swap(p.stage1[1], p.stage1[2]);
    Status ok = p.build().validate();
    EXPECT_TRUE(ok) << ok.message();
  }
  {
    // A stage boundary that cuts a value without a send: stage 1 reads
    // stage 0's y directly. The plan of every rank's memory refuses it, and
    // so does the reader, naming the program that defines it.
    Pipeline p;
    Executable e = p.build();
    p.stage1 = {Pipeline::instr("add", {p.y, p.y}, {p.w})};
    e.programs[1].instrs = p.stage1;
    Expected<MemoryPlan> plan = planProgramMemory(e, e.programs[1], 64);
    ASSERT_FALSE(plan);
    EXPECT_TRUE(contains(plan.status().message(),
                         "reads %1 before it is defined (defined by program 0 "
                         "on ranks 0; a value another pipeline stage computes "
                         "must arrive by send/recv)"))
        << plan.status().message();
    Status st = e.validate();
    ASSERT_FALSE(st);
    EXPECT_TRUE(contains(st.message(), "is used before it is defined (defined "
                                       "by program 0 on ranks 0; a value "
                                       "another pipeline stage computes must "
                                       "arrive by send/recv)"))
        << st.message();
  }
  {
    // A rank cannot be its own peer; a peer must be in the group.
    Pipeline p;
    p.stage0[1].attrs["peer"] = int64_t(0);
    Status st = p.build().validate();
    ASSERT_FALSE(st);
    EXPECT_TRUE(contains(st.message(), "names the rank itself as its peer"))
        << st.message();
    p.stage0[1].attrs["peer"] = int64_t(2);
    st = p.build().validate();
    ASSERT_FALSE(st);
    EXPECT_TRUE(contains(st.message(), "peer 2 is outside the group of 2"))
        << st.message();
  }
}

TEST(World, BatchedSendRecvExchangesWithoutDeadlock) {
  // 1F1B's steady state: each stage sends one tensor to the other and
  // receives one from it. As separate blocking sends this deadlocks; as one
  // send_recv batch per stage (posted together) it does not, and runs.
  Pipeline p;
  int32_t back = p.b.temp(tt({2, 3})), got = p.b.temp(tt({2, 3}));
  int32_t sum = p.b.temp(tt({2, 3}));
  auto batch = [](std::vector<int32_t> ins, std::vector<int32_t> outs,
                  std::vector<int64_t> sendPeers, std::vector<int64_t> recvPeers) {
    Instr in = Pipeline::instr("send_recv", std::move(ins), std::move(outs));
    in.attrs = {{"group", int64_t(0)},
                {"send_peers", std::move(sendPeers)},
                {"recv_peers", std::move(recvPeers)}};
    return in;
  };
  p.stage0 = {Pipeline::instr("add", {p.x, p.x}, {p.y}),
              batch({p.y}, {got}, {1}, {1}),
              Pipeline::instr("add", {got, p.y}, {sum}),
              batch({sum}, {}, {1}, {})};
  p.stage1 = {Pipeline::instr("mul", {p.x, p.x}, {back}),
              batch({back}, {p.z}, {0}, {0}),
              batch({}, {sum}, {}, {0}),
              Pipeline::instr("add", {p.z, sum}, {p.w})};
  Executable e = p.build();
  Status ok = e.validate();
  ASSERT_TRUE(ok) << ok.message();
  auto w = makeWorld(e);
  ASSERT_TRUE(w);
  HostTensor x = randomTensor(tt({2, 3}), 7);
  ASSERT_TRUE(w->bind("x", x));
  Status st = w->execute();
  ASSERT_TRUE(st) << st.message();
  auto out = w->readOutput("w");
  ASSERT_TRUE(out) << out.status().message();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      float v = at(x, i, j);
      // z = 2x, sum = x*x + 2x, w = z + sum.
      EXPECT_FLOAT_EQ(at(*out, i, j), 2 * v + (v * v + 2 * v));
    }

  // The same exchange with the batch split into a blocking send, then a
  // receive, on both stages: refused at load, naming the wait.
  Pipeline q = p;
  q.stage0[1] = Pipeline::p2p("send", {p.y}, {}, 1);
  q.stage0.insert(q.stage0.begin() + 2, Pipeline::p2p("recv", {}, {got}, 1));
  q.stage1[1] = Pipeline::p2p("send", {back}, {}, 0);
  q.stage1.insert(q.stage1.begin() + 2, Pipeline::p2p("recv", {}, {p.z}, 0));
  Status st2 = q.build().validate();
  ASSERT_FALSE(st2);
  EXPECT_TRUE(contains(st2.message(), "rank 0 waits in 'send' (instruction 1 "
                                      "at pipe.mlir:1:1) to send to rank 1, "
                                      "which waits in 'send'"))
      << st2.message();

  // Peers are checked against the group, and counts against the operands.
  Pipeline r = p;
  r.stage0[1].attrs["send_peers"] = std::vector<int64_t>{2};
  Status st3 = r.build().validate();
  ASSERT_FALSE(st3);
  EXPECT_TRUE(contains(st3.message(), "outside the group of 2")) << st3.message();
  r.stage0[1].attrs["send_peers"] = std::vector<int64_t>{1, 1};
  st3 = r.build().validate();
  ASSERT_FALSE(st3);
  EXPECT_TRUE(contains(st3.message(), "expects 1 entries in 'send_peers', got 2"))
      << st3.message();
}

TEST(World, CollectivesInADifferentOrderAreRefusedAtLoad) {
  // Two programs over dp=2 issue the same two all-reduces in opposite
  // orders: each rank waits for the other at a different collective.
  Pipeline p;
  int32_t a = p.b.temp(tt({2, 3})), c = p.b.temp(tt({2, 3}));
  int32_t a2 = p.b.temp(tt({2, 3})), c2 = p.b.temp(tt({2, 3}));
  auto ar = [](int32_t in, int32_t out, const char *reduce) {
    Instr i = Pipeline::instr("all_reduce", {in}, {out});
    i.attrs = {{"group", int64_t(0)}, {"reduce", std::string(reduce)}};
    return i;
  };
  p.stage0 = {ar(p.x, a, "sum"), ar(a, c, "max"), Pipeline::instr("add", {c, c}, {p.w})};
  p.stage1 = {ar(p.x, a2, "max"), ar(a2, c2, "sum"), Pipeline::instr("add", {c2, c2}, {p.w})};
  Status st = p.build().validate();
  ASSERT_FALSE(st);
  EXPECT_TRUE(contains(st.message(),
                       "the ranks of one communicator disagree on their next "
                       "collective: rank 0 runs 'all_reduce' (instruction 0 "
                       "at pipe.mlir:1:1) (all_reduce group=0 reduce=sum of "
                       "2x3xf32), rank 1 runs 'all_reduce' (instruction 0 at "
                       "pipe.mlir:1:1) (all_reduce group=0 reduce=max of "
                       "2x3xf32)"))
      << st.message();
}
