//===- OpShardingTest.cpp - Op-level rules, resharding, ILP, stages -------===//
#include "planner/OpSharding.h"
#include "planner/OpPricing.h"
#include "planner/OpSearch.h"
#include "planner/Plan.h"
#include "planner/SearchUtil.h"
#include "planner/Simulator.h"

#include "TestUtil.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <functional>
#include <random>
#include <set>
#include <utility>

using namespace dlopt::planner;

namespace dlopt::planner {
void PrintTo(const Layout &l, std::ostream *os) { *os << l.str(); }
} // namespace dlopt::planner

namespace {

/// Builds a GraphSummary op by op, as passes/Export/GraphSummary.cpp would.
struct Builder {
  GraphSummary g;
  std::vector<std::vector<int64_t>> argShapes;

  explicit Builder(int64_t batch) {
    g.modelName = "main";
    g.batch = batch;
    g.dtype = "f32";
    g.dtypeBytes = 4;
  }
  ValueRef arg(const std::string &name, ArgNode::Role role,
               std::vector<int64_t> shape, bool isFloat = true) {
    ArgNode a;
    a.index = int(g.args.size());
    a.name = name;
    a.role = role;
    a.shape = shape;
    a.isFloat = isFloat;
    a.dtype = isFloat ? "f32" : "i32";
    a.elemBytes = 4;
    if (role == ArgNode::Role::Param) {
      double e = 1;
      for (int64_t d : shape)
        e *= double(d);
      g.totalParams += e;
      g.totalParamBytes += 4 * e;
    }
    g.args.push_back(a);
    return ValueRef{-(a.index + 1), 0};
  }
  ValueRef param(const std::string &name, std::vector<int64_t> shape) {
    return arg(name, ArgNode::Role::Param, std::move(shape));
  }
  ValueRef input(const std::string &name, std::vector<int64_t> shape,
                 bool isFloat = true) {
    return arg(name, ArgNode::Role::Input, std::move(shape), isFloat);
  }
  const std::vector<int64_t> &shapeOf(ValueRef r) const {
    return r.isArg() ? g.args[r.argIndex()].shape : g.ops[r.producer].shape;
  }
  bool isFloat(ValueRef r) const {
    return r.isArg() ? g.args[r.argIndex()].isFloat : g.ops[r.producer].isFloat;
  }
  OpNode &op(const std::string &name, OpClass kind, std::vector<int64_t> shape,
             std::vector<ValueRef> operands, double flops = -1) {
    OpNode n;
    n.id = int(g.ops.size());
    n.op = name;
    n.kind = kind;
    n.shape = shape;
    n.dtype = "f32";
    double out = 1;
    for (int64_t d : shape)
      out *= double(d);
    n.resultBytes = n.floatResultBytes = 4 * out;
    n.bytes = n.resultBytes;
    for (ValueRef r : operands) {
      n.operands.push_back(r);
      n.operandShapes.push_back(shapeOf(r));
      n.operandElemBytes.push_back(4);
      n.operandIsFloat.push_back(isFloat(r));
      double e = 4;
      for (int64_t d : shapeOf(r))
        e *= double(d);
      n.bytes += e;
    }
    n.flops = flops >= 0 ? flops : out;
    g.ops.push_back(n);
    return g.ops.back();
  }
  ValueRef ref(const OpNode &n) const { return ValueRef{n.id, 0}; }
  ValueRef matmul(ValueRef a, ValueRef b) {
    auto sa = shapeOf(a), sb = shapeOf(b);
    std::vector<int64_t> out(sa.begin(), sa.end() - 1);
    out.push_back(sb.back());
    double f = 2.0 * double(sa.back());
    for (int64_t d : out)
      f *= double(d);
    return ref(op("dlopt.matmul", OpClass::Matmul, out, {a, b}, f));
  }
  ValueRef unary(const std::string &name, ValueRef a) {
    return ref(op(name, OpClass::Elementwise, shapeOf(a), {a}));
  }
  ValueRef binary(const std::string &name, ValueRef a, ValueRef b) {
    auto s = shapeOf(a).size() >= shapeOf(b).size() ? shapeOf(a) : shapeOf(b);
    return ref(op(name, OpClass::Elementwise, s, {a, b}));
  }
};

/// x[B, in] -> matmul w1 [in, hidden] -> relu -> matmul w2 [hidden, in] ->
/// mse against y.
GraphSummary mlp2(int64_t batch, int64_t in, int64_t hidden) {
  Builder b(batch);
  ValueRef x = b.input("x", {batch, in});
  ValueRef y = b.input("y", {batch, in});
  ValueRef w1 = b.param("w1", {in, hidden});
  ValueRef w2 = b.param("w2", {hidden, in});
  ValueRef h = b.unary("dlopt.relu", b.matmul(x, w1));
  ValueRef o = b.matmul(h, w2);
  b.op("dlopt.mse", OpClass::Loss, {}, {o, y});
  return b.g;
}

/// `layers` relu(x W) layers of 1024 at batch 16 and an mse loss, without
/// layer marks.
Builder reluChain(int layers) {
  Builder b(16);
  ValueRef h = b.input("x", {16, 1024});
  for (int l = 0; l < layers; ++l)
    h = b.unary("dlopt.relu",
                b.matmul(h, b.param("w" + std::to_string(l), {1024, 1024})));
  b.op("dlopt.mse", OpClass::Loss, {}, {h, b.input("y", {16, 1024})});
  return b;
}

std::set<std::string> names(const std::vector<Strategy> &ss) {
  std::set<std::string> out;
  for (const Strategy &s : ss)
    out.insert(s.name);
  return out;
}

const Strategy *find(const std::vector<Strategy> &ss, const std::string &n) {
  for (const Strategy &s : ss)
    if (s.name == n)
      return &s;
  return nullptr;
}

Cluster preset(const char *name, int nodes = 0) {
  auto c = clusterPreset(name, nodes);
  EXPECT_TRUE(c) << c.status().message();
  return *c;
}

SearchOptions bf16Training(int64_t globalBatch = 0) {
  SearchOptions o;
  o.training = true;
  o.precision = Precision::BF16;
  o.globalBatch = globalBatch;
  return o;
}

//===----------------------------------------------------------------------===//
// Rules
//===----------------------------------------------------------------------===//

TEST(OpSharding, MatmulRules) {
  GraphSummary g = mlp2(8, 64, 256);
  GraphGeometry geo(g, 8, 4);
  auto ss = shardingRules(geo, 0, 4);
  EXPECT_EQ(names(ss), (std::set<std::string>{"replicated", "batch", "column",
                                              "row"}));
  const Strategy *col = find(ss, "column");
  ASSERT_TRUE(col);
  EXPECT_EQ(col->operands[0], Layout::rep());
  EXPECT_EQ(col->operands[1], Layout::split(1));
  EXPECT_EQ(col->result, Layout::split(1));
  EXPECT_EQ(col->divisor, 4);
  const Strategy *row = find(ss, "row");
  ASSERT_TRUE(row);
  EXPECT_EQ(row->operands[0], Layout::split(1));
  EXPECT_EQ(row->operands[1], Layout::split(0));
  EXPECT_EQ(row->result, Layout::partial());
  const Strategy *batch = find(ss, "batch");
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->operands[0], Layout::split(0));
  EXPECT_EQ(batch->operands[1], Layout::rep());
  // One device, or dims that t does not divide: fewer strategies.
  EXPECT_EQ(names(shardingRules(geo, 0, 1)),
            std::set<std::string>{"replicated"});
  GraphGeometry geo1(g, 1, 4); // micro-batch 1: no batch split
  EXPECT_FALSE(find(shardingRules(geo1, 0, 4), "batch"));
  EXPECT_FALSE(find(shardingRules(geo, 0, 3), "column"));
}

TEST(OpSharding, ElementwiseBroadcastAndPartial) {
  Builder b(8);
  ValueRef x = b.input("x", {8, 16});
  ValueRef bias = b.param("bias", {16});
  ValueRef s = b.binary("dlopt.add", x, bias);
  b.unary("dlopt.relu", s);
  GraphGeometry geo(b.g, 8, 4);
  auto add = shardingRules(geo, 0, 2);
  const Strategy *batch = find(add, "batch");
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->operands[1], Layout::rep()); // bias has no batch dim
  const Strategy *d1 = find(add, "dim 1");
  ASSERT_TRUE(d1);
  EXPECT_EQ(d1->operands[0], Layout::split(1));
  EXPECT_EQ(d1->operands[1], Layout::split(0)); // aligned at the end
  const Strategy *part = find(add, "partial");
  ASSERT_TRUE(part);
  EXPECT_EQ(part->operands[0], Layout::partial());
  EXPECT_EQ(part->result, Layout::partial());
  // relu is not linear: no partial pass-through.
  EXPECT_FALSE(find(shardingRules(geo, 1, 2), "partial"));
}

TEST(OpSharding, NormSoftmaxReductionRules) {
  Builder b(4);
  ValueRef x = b.input("x", {4, 8, 16});
  ValueRef w = b.param("w", {16});
  OpNode &ln = b.op("dlopt.layer_norm", OpClass::Norm, {4, 8, 16}, {x, w});
  ln.dims = {2};
  OpNode &sm = b.op("dlopt.softmax", OpClass::Softmax, {4, 8, 16}, {x});
  sm.dims = {1};
  OpNode &sum = b.op("dlopt.sum", OpClass::Reduction, {4, 8}, {x});
  sum.dims = {2};
  OpNode &mx = b.op("dlopt.max", OpClass::Reduction, {4, 8}, {x});
  mx.dims = {2};
  GraphGeometry geo(b.g, 4, 4);
  for (const Strategy &s : shardingRules(geo, 0, 2)) {
    EXPECT_NE(s.result, Layout::split(2)) << "layer_norm split its axis";
    if (s.result.kind == Layout::S)
      EXPECT_EQ(s.operands[1], Layout::rep()); // weight over the axis
  }
  for (const Strategy &s : shardingRules(geo, 1, 2))
    EXPECT_NE(s.result, Layout::split(1)) << "softmax split its dim";
  // Sum over a split dim leaves a partial sum; max needs an all-reduce.
  bool sawPartial = false;
  for (const Strategy &s : shardingRules(geo, 2, 2))
    if (s.operands[0] == Layout::split(2)) {
      EXPECT_EQ(s.result, Layout::partial());
      sawPartial = true;
    }
  EXPECT_TRUE(sawPartial);
  bool sawReduce = false;
  for (const Strategy &s : shardingRules(geo, 3, 2))
    if (s.operands[0] == Layout::split(2)) {
      EXPECT_EQ(s.result, Layout::rep());
      ASSERT_EQ(s.comms.size(), 1u);
      EXPECT_EQ(s.comms[0].collective, Collective::AllReduce);
      sawReduce = true;
    }
  EXPECT_TRUE(sawReduce);
}

TEST(OpSharding, ReshapeTransposeAttentionRules) {
  // [B, S, H] -> [B, S, heads, d] -> [B, heads, S, d] -> attention.
  Builder b(2);
  ValueRef x = b.input("x", {2, 16, 64});
  OpNode &r = b.op("dlopt.reshape", OpClass::Reshape, {2, 16, 4, 16}, {x});
  OpNode &t = b.op("dlopt.transpose", OpClass::Transpose, {2, 4, 16, 16},
                   {b.ref(r)});
  t.dims = {0, 2, 1, 3};
  ValueRef q = b.ref(t);
  b.op("dlopt.attention", OpClass::Attention, {2, 4, 16, 16}, {q, q, q});
  OpNode &flat = b.op("dlopt.reshape", OpClass::Reshape, {32, 64}, {x});
  (void)flat;
  GraphGeometry geo(b.g, 2, 4);
  auto rs = shardingRules(geo, 0, 4);
  bool hidden = false;
  for (const Strategy &s : rs) {
    if (s.operands[0] == Layout::split(2)) {
      EXPECT_EQ(s.result, Layout::split(2)); // hidden -> heads
      hidden = true;
    }
    EXPECT_NE(s.result, Layout::split(3)); // the inner factor never splits
  }
  EXPECT_TRUE(hidden);
  bool heads = false;
  for (const Strategy &s : shardingRules(geo, 1, 4))
    if (s.operands[0] == Layout::split(2)) {
      EXPECT_EQ(s.result, Layout::split(1));
      heads = true;
    }
  EXPECT_TRUE(heads);
  auto att = shardingRules(geo, 2, 4);
  const Strategy *h = find(att, "heads");
  ASSERT_TRUE(h);
  for (const Layout &l : h->operands)
    EXPECT_EQ(l, Layout::split(1));
  // [B, S, H] -> [B*S, H]: the batch dim merges into dim 0.
  EXPECT_EQ(geo.batchDim(3), 0);
  GraphGeometry half(b.g, 1, 4);
  EXPECT_EQ(half.result(3).shape, (std::vector<int64_t>{16, 64}));
}

TEST(OpSharding, ConvBatchNormGatherLossRules) {
  Builder b(8);
  ValueRef img = b.input("img", {8, 16, 8, 8});
  ValueRef w = b.param("w", {32, 16, 3, 3});
  OpNode &conv = b.op("dlopt.conv2d", OpClass::Conv2D, {8, 32, 8, 8}, {img, w});
  conv.groups = 1;
  ValueRef bw = b.param("bn.w", {32}), bb = b.param("bn.b", {32});
  ValueRef rm = b.arg("bn.mean", ArgNode::Role::State, {32});
  ValueRef rv = b.arg("bn.var", ArgNode::Role::State, {32});
  b.op("dlopt.batch_norm", OpClass::BatchNorm, {8, 32, 8, 8},
       {b.ref(conv), bw, bb, rm, rv});
  ValueRef table = b.param("wte", {128, 32});
  ValueRef ids = b.input("ids", {8, 4}, false);
  b.op("dlopt.gather", OpClass::Gather, {8, 4, 32}, {table, ids});
  ValueRef logits = b.input("logits", {8, 128});
  ValueRef labels = b.input("labels", {8}, false);
  b.op("dlopt.cross_entropy", OpClass::Loss, {}, {logits, labels});
  b.op("dlopt.scatter_add", OpClass::Other, {128, 32}, {ids, table});
  GraphGeometry geo(b.g, 8, 4);

  auto cs = shardingRules(geo, 0, 4);
  EXPECT_EQ(names(cs), (std::set<std::string>{"replicated", "batch",
                                              "out-channel", "in-channel"}));
  EXPECT_EQ(find(cs, "in-channel")->result, Layout::partial());
  EXPECT_EQ(find(cs, "out-channel")->result, Layout::split(1));

  auto bn = shardingRules(geo, 1, 4);
  const Strategy *bnBatch = find(bn, "batch");
  ASSERT_TRUE(bnBatch);
  ASSERT_EQ(bnBatch->comms.size(), 2u); // statistics fwd, sums bwd
  EXPECT_FALSE(bnBatch->comms[0].backward);
  EXPECT_TRUE(bnBatch->comms[1].backward);
  const Strategy *bnCh = find(bn, "channel");
  ASSERT_TRUE(bnCh);
  EXPECT_TRUE(bnCh->comms.empty());

  auto ga = shardingRules(geo, 2, 4);
  EXPECT_EQ(find(ga, "vocab rows")->result, Layout::partial());
  EXPECT_EQ(find(ga, "batch")->operands[1], Layout::split(0));

  auto ce = shardingRules(geo, 3, 4);
  EXPECT_EQ(find(ce, "batch")->result, Layout::partial());
  const Strategy *cls = find(ce, "class");
  ASSERT_TRUE(cls);
  EXPECT_EQ(cls->result, Layout::rep());
  EXPECT_EQ(cls->comms.size(), 1u);

  // Anything else is replicated only.
  EXPECT_EQ(names(shardingRules(geo, 4, 4)),
            std::set<std::string>{"replicated"});
}

//===----------------------------------------------------------------------===//
// Resharding
//===----------------------------------------------------------------------===//

TEST(OpSharding, ReshardTable) {
  const double B = 1 << 20;
  auto r = [&](Layout a, Layout b) { return reshard(a, b, B, 4); };
  EXPECT_FALSE(r(Layout::split(1), Layout::split(1)).needed);
  EXPECT_FALSE(r(Layout::rep(), Layout::split(0)).needed);
  EXPECT_FALSE(r(Layout::rep(), Layout::partial()).needed);
  EXPECT_FALSE(r(Layout::partial(), Layout::partial()).needed);
  Reshard ag = r(Layout::split(0), Layout::rep());
  EXPECT_TRUE(ag.needed);
  EXPECT_EQ(ag.collective, Collective::AllGather);
  EXPECT_EQ(ag.bytes, B);
  Reshard a2a = r(Layout::split(0), Layout::split(1));
  EXPECT_EQ(a2a.collective, Collective::AllToAll);
  EXPECT_EQ(a2a.bytes, B / 4);
  EXPECT_EQ(r(Layout::partial(), Layout::rep()).collective,
            Collective::AllReduce);
  EXPECT_EQ(r(Layout::partial(), Layout::split(1)).collective,
            Collective::ReduceScatter);
  EXPECT_FALSE(reshard(Layout::partial(), Layout::rep(), B, 1).needed);
  // Gradients: a replicated operand of split compute gets a partial sum.
  EXPECT_EQ(gradLayout(Layout::rep(), 4), Layout::partial());
  EXPECT_EQ(gradLayout(Layout::rep(), 1), Layout::rep());
  EXPECT_EQ(gradLayout(Layout::partial(), 1), Layout::rep());
  EXPECT_EQ(gradLayout(Layout::split(2), 4), Layout::split(2));
  EXPECT_EQ(gradNeed(Layout::partial()), Layout::rep());
}

TEST(OpSharding, ReshardCostsAreCostModelCollectives) {
  Cluster cl = preset("dgx-a100", 2);
  CostModel cost;
  CommPricer pricer(cl, cost);
  const double B = 48.0 * (1 << 20);
  for (int t : {2, 4, 8}) {
    auto g = cl.stridedGroup(t, 1, 0);
    ASSERT_TRUE(g);
    struct Case {
      Layout a, b;
      Collective c;
      double bytes;
    } cases[] = {
        {Layout::split(0), Layout::rep(), Collective::AllGather, B},
        {Layout::partial(), Layout::rep(), Collective::AllReduce, B},
        {Layout::partial(), Layout::split(0), Collective::ReduceScatter, B},
        {Layout::split(0), Layout::split(1), Collective::AllToAll, B / t},
    };
    for (const Case &cs : cases) {
      auto want = cost.commTime(cs.c, cs.bytes, *g);
      ASSERT_TRUE(want);
      EXPECT_DOUBLE_EQ(pricer.time(reshard(cs.a, cs.b, B, t), t), want->time)
          << collectiveName(cs.c) << " t=" << t;
    }
    EXPECT_EQ(pricer.time(reshard(Layout::rep(), Layout::split(0), B, t), t),
              0.0);
  }
  // Across nodes the dp group's all-reduce uses the network.
  LinkKind link = LinkKind::None;
  EXPECT_GT(pricer.time(Collective::AllReduce, B, 2, 8, &link), 0);
  EXPECT_EQ(link, LinkKind::Network);
}

//===----------------------------------------------------------------------===//
// Solvers
//===----------------------------------------------------------------------===//

/// Random problems: 2..7 nodes with 1..4 strategies, random edges (cycles
/// included), costs with ties and zeros, memory with a budget.
ShardingProblem randomProblem(std::mt19937 &rng, bool budget, bool tree) {
  std::uniform_int_distribution<int> nodes(2, 7), ks(1, 4), coin(0, 9);
  std::uniform_real_distribution<double> cost(0, 10), mem(0, 5);
  ShardingProblem p;
  int n = nodes(rng);
  for (int i = 0; i < n; ++i) {
    ShardingProblem::Node nd;
    int k = ks(rng);
    for (int j = 0; j < k; ++j) {
      nd.cost.push_back(coin(rng) < 2 ? 0.0 : std::round(cost(rng) * 4) / 4);
      nd.mem.push_back(mem(rng));
    }
    p.nodes.push_back(nd);
  }
  auto edge = [&](int u, int v) {
    ShardingProblem::Edge e{u, v, {}};
    for (size_t a = 0; a < p.nodes[u].cost.size(); ++a)
      for (size_t b = 0; b < p.nodes[v].cost.size(); ++b)
        e.cost.push_back(coin(rng) < 3 ? 0.0 : cost(rng));
    p.edges.push_back(e);
  };
  for (int v = 1; v < n; ++v) {
    std::uniform_int_distribution<int> parent(0, v - 1);
    edge(parent(rng), v);
    if (!tree)
      for (int u = 0; u < v; ++u)
        if (coin(rng) < 3)
          edge(u, v);
  }
  if (budget) {
    double lo = 0, hi = 0;
    for (const auto &nd : p.nodes) {
      lo += *std::min_element(nd.mem.begin(), nd.mem.end());
      hi += *std::max_element(nd.mem.begin(), nd.mem.end());
    }
    p.memBudget = lo + (hi - lo) * std::uniform_real_distribution<>(0.2, 0.8)(rng);
  }
  return p;
}

SolveResult solve(const ShardingProblem &p, SolverKind kind) {
  SolveOptions o;
  o.kind = kind;
  o.maxNodes = 100000;
  auto r = solveSharding(p, o);
  EXPECT_TRUE(r) << r.status().message();
  return r ? *r : SolveResult{};
}

TEST(OpShardingSolver, IlpEqualsBruteForceOnRandomGraphs) {
  if (!haveIlpSolver())
    GTEST_SKIP() << "built without CBC (coinor-libcbc-dev)";
  std::mt19937 rng(12345);
  int constrained = 0, compared = 0;
  for (int it = 0; it < 60; ++it) {
    bool budget = it % 2 == 1;
    ShardingProblem p = randomProblem(rng, budget, false);
    SolveResult bf = solve(p, SolverKind::BruteForce);
    ASSERT_TRUE(bf.feasible);
    for (SolverKind k : {SolverKind::Ilp, SolverKind::Auto}) {
      SolveResult r = solve(p, k);
      EXPECT_TRUE(r.feasible) << "case " << it;
      EXPECT_NEAR(r.cost, bf.cost, 1e-6 * std::max(1.0, bf.cost))
          << "case " << it << " solver " << solverName(k) << " ("
          << r.method << ", " << r.note << ")";
      EXPECT_EQ(r.cost, p.evaluate(r.choice));
      EXPECT_TRUE(r.optimal) << r.method << ": " << r.note;
      ++compared;
    }
    constrained += budget;
  }
  EXPECT_EQ(compared, 120);
  EXPECT_EQ(constrained, 30);
}

TEST(OpShardingSolver, EliminationIsExactOnTreesAndSeriesParallel) {
  std::mt19937 rng(777);
  for (int it = 0; it < 60; ++it) {
    ShardingProblem p = randomProblem(rng, false, true);
    SolveResult bf = solve(p, SolverKind::BruteForce);
    SolveResult el = solve(p, SolverKind::Greedy); // no ILP at all
    EXPECT_EQ(el.method, "elimination") << "case " << it;
    EXPECT_TRUE(el.optimal);
    EXPECT_NEAR(el.cost, bf.cost, 1e-9 * std::max(1.0, bf.cost)) << it;
  }
  // A diamond (u -> a, b -> w) plus a chain is series-parallel too.
  ShardingProblem d;
  for (int i = 0; i < 5; ++i)
    d.nodes.push_back({{1.0 * i, 2.0, 0.5}, {}});
  auto e = [&](int u, int v, std::vector<double> c) {
    d.edges.push_back({u, v, c});
  };
  std::vector<double> m{0, 3, 1, 2, 0, 5, 4, 1, 0};
  e(0, 1, m);
  e(0, 2, m);
  e(1, 3, m);
  e(2, 3, m);
  e(3, 4, m);
  SolveResult el = solve(d, SolverKind::Greedy);
  EXPECT_EQ(el.method, "elimination");
  EXPECT_NEAR(el.cost, solve(d, SolverKind::BruteForce).cost, 1e-12);
}

TEST(OpShardingSolver, GreedyIsFeasibleAndNeverBelowOptimum) {
  std::mt19937 rng(4242);
  for (int it = 0; it < 40; ++it) {
    ShardingProblem p = randomProblem(rng, it % 2 == 1, false);
    SolveResult bf = solve(p, SolverKind::BruteForce);
    SolveResult gr = solve(p, SolverKind::Greedy);
    EXPECT_GE(gr.cost, bf.cost - 1e-9) << it;
    EXPECT_TRUE(gr.feasible) << it;
  }
}

TEST(OpShardingSolver, Deterministic) {
  std::mt19937 rng(99);
  for (int it = 0; it < 20; ++it) {
    ShardingProblem p = randomProblem(rng, it % 2 == 1, false);
    for (SolverKind k : {SolverKind::Auto, SolverKind::Greedy}) {
      SolveResult a = solve(p, k), b = solve(p, k);
      EXPECT_EQ(a.choice, b.choice);
      EXPECT_EQ(a.cost, b.cost);
    }
  }
}

TEST(OpShardingSolver, RejectsMalformedProblems) {
  ShardingProblem p;
  p.nodes.push_back({{1.0}, {}});
  p.nodes.push_back({{}, {}});
  EXPECT_FALSE(solveSharding(p));
  p.nodes[1].cost = {1, 2};
  p.edges.push_back({0, 1, {1.0}}); // needs 1 x 2 entries
  auto r = solveSharding(p);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("wrong size"), std::string::npos);
}

//===----------------------------------------------------------------------===//
// Stage partition
//===----------------------------------------------------------------------===//

double maxStage(const std::vector<double> &t, const std::vector<int> &starts) {
  double worst = 0;
  for (size_t s = 0; s + 1 < starts.size(); ++s) {
    double sum = 0;
    for (int i = starts[s]; i < starts[s + 1]; ++i)
      sum += t[i];
    worst = std::max(worst, sum);
  }
  return worst;
}

/// Every contiguous split into k non-empty ranges.
double bruteForcePartition(const std::vector<double> &t, int k) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> starts{0};
  std::function<void(int)> rec = [&](int left) {
    if (left == 1) {
      starts.push_back(int(t.size()));
      best = std::min(best, maxStage(t, starts));
      starts.pop_back();
      return;
    }
    for (int next = starts.back() + 1; next <= int(t.size()) - (left - 1);
         ++next) {
      starts.push_back(next);
      rec(left - 1);
      starts.pop_back();
    }
  };
  rec(k);
  return best;
}

TEST(OpShardingStages, PartitionCoversEveryOpOnceAndIsOptimal) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> time(0, 1);
  for (int it = 0; it < 200; ++it) {
    int n = 1 + int(rng() % 12), k = 1 + int(rng() % 5);
    std::vector<double> t(n);
    for (double &x : t)
      x = rng() % 4 == 0 ? 0.0 : time(rng);
    auto starts = partitionStages(t, k);
    if (n < k) {
      EXPECT_TRUE(starts.empty());
      continue;
    }
    ASSERT_EQ(int(starts.size()), k + 1);
    EXPECT_EQ(starts.front(), 0);
    EXPECT_EQ(starts.back(), n);
    std::vector<int> owner(n, -1);
    for (int s = 0; s < k; ++s) {
      EXPECT_LT(starts[s], starts[s + 1]) << "empty stage";
      for (int i = starts[s]; i < starts[s + 1]; ++i) {
        EXPECT_EQ(owner[i], -1) << "op " << i << " in two stages";
        owner[i] = s;
      }
    }
    for (int i = 0; i < n; ++i)
      EXPECT_NE(owner[i], -1) << "op " << i << " in no stage";
    EXPECT_NEAR(maxStage(t, starts), bruteForcePartition(t, k), 1e-12);
  }
}

TEST(OpShardingStages, LargePartitionsAreBalanced) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> time(0.1, 2.0);
  std::vector<double> t(3000);
  double total = 0, biggest = 0;
  for (double &x : t) {
    x = time(rng);
    total += x;
    biggest = std::max(biggest, x);
  }
  for (int k : {2, 4, 8, 16, 64}) {
    auto starts = partitionStages(t, k);
    ASSERT_EQ(int(starts.size()), k + 1);
    double m = maxStage(t, starts);
    // The optimum lies in [total/k, total/k + biggest].
    EXPECT_GE(m, total / k - 1e-9);
    EXPECT_LE(m, total / k + biggest + 1e-9);
  }
}

//===----------------------------------------------------------------------===//
// The search
//===----------------------------------------------------------------------===//

std::map<std::string, std::string> strategiesOf(const OpPlanResult &p,
                                                const GraphSummary &g) {
  std::map<std::string, std::string> out;
  for (const OpChoice &c : p.choices)
    out["#" + std::to_string(c.op) + " " + g.ops[c.op].op] = c.strategy;
  return out;
}

/// The host time of issuing a one-stage plan's launches: every kernel and
/// every collective of a micro-batch (the forward ops,
/// backward_flops_ratio times as many backward, each per-micro-batch
/// collective), m times, and each per-step collective once.
double launchSeconds(const OpPlanResult &p) {
  double calls = 0, stepCalls = 0;
  for (const ReshardOp &r : p.reshards)
    (r.perStep ? stepCalls : calls) += 1;
  const Calibration cal;
  const double m = double(p.best.cfg.numMicroBatches);
  return (m * (p.numForwardOps * (1 + cal.backwardFlopsRatio) + calls) +
          stepCalls) *
         cal.kernelLaunchSeconds;
}

TEST(OpSearch, MegatronPairingWinsForWideLayers) {
  // Wide layers, few samples: column-parallel then row-parallel beats
  // replication and batch splitting (whose weight-gradient all-reduce is
  // the size of the weights).
  GraphSummary g = mlp2(8, 8192, 32768);
  Cluster cl = preset("dgx-a100");
  for (int t : {2, 4, 8}) {
    SearchOptions o = bf16Training();
    o.fix.tp = t;
    o.fix.pp = 1;
    auto p = searchOpPlan(g, cl, CostModel(), o);
    ASSERT_TRUE(p) << p.status().message();
    auto s = strategiesOf(*p, g);
    EXPECT_EQ(s["#0 dlopt.matmul"], "column") << "t=" << t;
    EXPECT_EQ(s["#2 dlopt.matmul"], "row") << "t=" << t;
    EXPECT_EQ(s["#1 dlopt.relu"], "dim 1") << "t=" << t;
    // Megatron's two all-reduces: row output forward, column input backward.
    int fwdAr = 0, bwdAr = 0;
    for (const ReshardOp &r : p->reshards)
      if (r.collective == Collective::AllReduce && r.operand >= 0)
        (r.backward ? bwdAr : fwdAr) += 1;
    EXPECT_EQ(fwdAr, 1) << "t=" << t;
    EXPECT_EQ(bwdAr, 0) << "the input x needs no gradient";
    // Sharded weights: a 1/t share of both matrices per device.
    for (const auto &[name, layout] : p->params)
      EXPECT_EQ(layout.kind, Layout::S) << name;
    EXPECT_NEAR(p->best.hostDispatch, launchSeconds(*p), 1e-12) << "t=" << t;
  }
  // The search without fixes shards the weights too.
  auto p = searchOpPlan(g, cl, CostModel(), bf16Training());
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_GT(p->best.cfg.tp, 1);
}

TEST(OpSearch, GradientSyncSlowsTheBackwardItHides) {
  // 537M parameters over dp=8 on a DGX A100: the gradients' all-reduce
  // hides behind the backward but takes from it what its SMs and
  // HBM traffic take (CostModel::overlapLoss), as in the transformer
  // search: the exposure is min(S, e B) x loss, more than the last bucket.
  // Without contention (comm_ctas and comm_hbm_ratio 0) only the last
  // bucket shows.
  GraphSummary g = mlp2(65536, 16384, 16384);
  Cluster cl = preset("dgx-a100");
  SearchOptions o = bf16Training();
  o.fix.dp = 8;
  o.fix.zero = 0;
  auto exposedSync = [&](const CostModel &m) {
    auto p = searchOpPlan(g, cl, m, o);
    EXPECT_TRUE(p) << p.status().message();
    double e = -1;
    for (const CommOp &c : p ? p->comms : std::vector<CommOp>{})
      if (c.collective == Collective::AllReduce)
        e = c.exposed;
    return std::make_pair(e, p ? p->best.time.total() : 0.0);
  };
  Calibration quiet;
  quiet.commCtas = 0;
  quiet.commHbmRatio = 0;
  auto [with, stepWith] = exposedSync(CostModel());
  auto [without, stepWithout] = exposedSync(CostModel(quiet));
  ASSERT_GE(without, 0);
  EXPECT_GT(with, 1.5 * without);
  EXPECT_NEAR(stepWith - stepWithout, with - without, 1e-9);
}

TEST(OpSearch, DataParallelWinsForSmallModels) {
  // 2M parameters, 400 GFLOP per step: splitting the batch is worth it, the
  // weights are cheap to replicate and their gradients cheap to reduce. (At
  // a quarter of the batch the step is 165 us and every plan within 1% of
  // the others: collective latencies, not the shapes, decide.)
  GraphSummary g = mlp2(32768, 512, 2048);
  Cluster cl = preset("dgx-a100");
  auto p = searchOpPlan(g, cl, CostModel(), bf16Training());
  ASSERT_TRUE(p) << p.status().message();
  // Either dp over all devices or every op batch-split over tp.
  if (p->best.cfg.tp > 1) {
    for (const OpChoice &c : p->choices)
      EXPECT_EQ(c.strategy, "batch") << g.ops[c.op].op;
  } else {
    EXPECT_EQ(p->best.cfg.dp, 8);
  }
  EXPECT_EQ(p->best.cfg.pp, 1);
  for (const auto &[name, layout] : p->params)
    EXPECT_EQ(layout, Layout::rep()) << name;
  // Batch-split over tp: the weight gradients are all-reduced over tp once
  // a step, and the host issues each of those collectives too.
  SearchOptions o = bf16Training();
  o.fix.tp = 8;
  auto split = searchOpPlan(g, cl, CostModel(), o);
  ASSERT_TRUE(split) << split.status().message();
  int perStep = 0;
  for (const ReshardOp &r : split->reshards)
    perStep += r.perStep;
  EXPECT_GT(perStep, 0);
  EXPECT_NEAR(split->best.hostDispatch, launchSeconds(*split), 1e-12);
}

TEST(OpSearch, MicroBatchesAreRowsNotCappedSequences) {
  // A sample of an op-level graph is a row: 1024 of them on one device run
  // as one micro-batch (each extra micro-batch re-reads the weights and
  // runs smaller GEMMs), although the transformer search caps micro-batches
  // at 64 sequences.
  GraphSummary g = mlp2(1024, 1024, 4096);
  SearchOptions o = bf16Training();
  ASSERT_EQ(o.maxMicroBatch, 64);
  auto one = parseCluster("nodes: 1\ngpus_per_node: 1\ngpu: h100-sxm-80gb\n",
                          ClusterFormat::Yaml, "one.yaml");
  ASSERT_TRUE(one) << one.status().message();
  auto p = searchOpPlan(g, *one, CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->best.cfg.microBatchSize, 1024);
  EXPECT_EQ(p->best.cfg.numMicroBatches, 1);
  // Forcing the old cap's shape costs time.
  o.fix.mbs = 64;
  auto capped = searchOpPlan(g, *one, CostModel(), o);
  ASSERT_TRUE(capped) << capped.status().message();
  EXPECT_GT(capped->best.time.total(), p->best.time.total());
}

TEST(OpSearch, PipelineStagesCoverTheGraph) {
  // 12 layers without marks: stages by op.
  Builder b = reluChain(12);
  SearchOptions o = bf16Training();
  o.fix.pp = 4;
  o.fix.tp = 2;
  auto p = searchOpPlan(b.g, preset("dgx-a100"), CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  ASSERT_EQ(p->stages.size(), 4u);
  EXPECT_FALSE(p->stagesByLayer);
  int next = 0, total = 0;
  double worst = 0, sum = 0;
  for (const OpStage &s : p->stages) {
    EXPECT_EQ(s.firstOp, next);
    EXPECT_GE(s.lastOp, s.firstOp);
    total += s.numOps;
    next = s.lastOp + 1;
    worst = std::max(worst, s.timePerMicroBatch);
    sum += s.timePerMicroBatch;
  }
  EXPECT_EQ(total, int(b.g.ops.size()));
  EXPECT_EQ(next, int(b.g.ops.size()));
  EXPECT_LT(worst, 1.5 * sum / 4); // 25 ops of similar size: balanced
  // With layer marks the boundaries fall between layers.
  for (OpNode &op : b.g.ops)
    op.layer = op.id / 2;
  auto q = searchOpPlan(b.g, preset("dgx-a100"), CostModel(), o);
  ASSERT_TRUE(q);
  EXPECT_TRUE(q->stagesByLayer);
  for (const OpStage &s : q->stages)
    EXPECT_EQ(s.firstOp % 2, 0);
}

TEST(OpSearch, InterleavedStagesRunChunksInTurn) {
  // 12 marked layers, pp=4 with v=2: 8 chunks, chunk k on stage k % 4, and
  // the bubble is the 1F1B bubble over v.
  Builder b = reluChain(12);
  for (OpNode &op : b.g.ops)
    op.layer = op.id / 2;
  SearchOptions o = bf16Training(64);
  o.fix.pp = 4;
  o.fix.tp = 1;
  o.fix.numMicroBatches = 8;
  o.fix.schedule = PipelineSchedule::Interleaved1F1B;
  o.fix.v = 2;
  auto p = searchOpPlan(b.g, preset("dgx-a100"), CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  ASSERT_EQ(p->stages.size(), 8u);
  int next = 0;
  for (size_t k = 0; k < p->stages.size(); ++k) {
    EXPECT_EQ(p->stages[k].stage, int(k % 4));
    EXPECT_EQ(p->stages[k].firstOp, next);
    next = p->stages[k].lastOp + 1;
  }
  EXPECT_EQ(next, int(b.g.ops.size()));
  EXPECT_EQ(p->best.cfg.virtualStages, 2);
  // Each op's planned stage is its chunk's.
  for (const PlannedOp &po : p->plan.ops)
    for (size_t k = 0; k < p->stages.size(); ++k)
      if (po.id >= b.g.ops[p->stages[k].firstOp].key() &&
          po.id <= b.g.ops[p->stages[k].lastOp].key())
        EXPECT_EQ(po.stage, p->stages[k].stage) << "op " << po.id;
  SearchOptions flat = o;
  flat.fix.schedule = PipelineSchedule::OneFOneB;
  flat.fix.v.reset();
  auto q = searchOpPlan(b.g, preset("dgx-a100"), CostModel(), flat);
  ASSERT_TRUE(q) << q.status().message();
  ASSERT_EQ(q->stages.size(), 4u);
  EXPECT_LT(p->best.time.bubble, 0.75 * q->best.time.bubble);
}

/// Three marked layers, relu(x W_l), from 1024 wide through `widths`, and
/// an MSE loss against an input as wide as the last.
Builder markedChain(const std::array<int64_t, 3> &widths) {
  Builder b(16);
  ValueRef h = b.input("x", {16, 1024});
  int64_t in = 1024;
  for (size_t l = 0; l < widths.size(); ++l) {
    h = b.unary("dlopt.relu",
                b.matmul(h, b.param("w" + std::to_string(l), {in, widths[l]})));
    in = widths[l];
  }
  b.op("dlopt.mse", OpClass::Loss, {}, {h, b.input("y", {16, in})});
  for (OpNode &op : b.g.ops)
    op.layer = std::min(op.id / 2, 2);
  return b;
}

/// A two-stage plan of `b` with `schedule` and 4 micro-batches.
Expected<OpPlanResult> twoStages(const Builder &b, PipelineSchedule schedule,
                                 bool train) {
  SearchOptions o = train ? bf16Training(64) : SearchOptions{};
  o.globalBatch = 64;
  o.fix.pp = 2;
  o.fix.tp = 1;
  o.fix.numMicroBatches = 4;
  o.fix.schedule = schedule;
  return searchOpPlan(b.g, preset("dgx-a100"), CostModel(), o);
}

TEST(OpSearch, UnevenStagesFillWithTheOthersTime) {
  // Three marked layers of 4, 4 and 1 units of work on two stages: the
  // split is {0} and {1, 2}, 4 against 5. A micro-batch passes once
  // through the faster stage while the slower runs all m, so GPipe's (and
  // forward-only) bubble is the faster stage's time per micro-batch, not
  // (pp - 1) times the slower's, which the op search charged until
  // 2026-11-30 (docs/simulator.md, "Stages that differ").
  const Builder b = markedChain({4096, 1024, 1024});
  for (bool train : {false, true}) {
    SCOPED_TRACE(train ? "training" : "forward only");
    auto p = twoStages(b, PipelineSchedule::GPipe, train);
    ASSERT_TRUE(p) << p.status().message();
    ASSERT_EQ(p->stages.size(), 2u);
    const double t0 = p->stages[0].timePerMicroBatch,
                 t1 = p->stages[1].timePerMicroBatch;
    EXPECT_GT(std::max(t0, t1), 1.05 * std::min(t0, t1));
    EXPECT_NEAR(p->best.time.bubble, std::min(t0, t1),
                1e-9 + 1e-6 * std::min(t0, t1));
  }
}

TEST(OpSearch, SlowestStageFirstHidesTheOthersUnder1F1B) {
  // Layers of 4, 1 and 1 units of work on two stages: {0} against {1, 2},
  // the slower stage first. Under 1F1B it runs its second forward while
  // the first micro-batch goes through stage 1 and back, so the bubble is
  // the schedule run on the two stages' times (forward and backward split
  // by the graph's backward ratio) less m times the slower one, below
  // the (pp - 1) t_max charged until 2026-11-30; zero-bubble the same
  // with half of each backward deferred.
  const Builder b = markedChain({4096, 256, 4096});
  for (PipelineSchedule sched :
       {PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubble}) {
    SCOPED_TRACE(int(sched));
    auto p = twoStages(b, sched, true);
    ASSERT_TRUE(p) << p.status().message();
    ASSERT_EQ(p->stages.size(), 2u);
    std::vector<double> all, fwd, wg;
    for (const OpStage &st : p->stages) {
      all.push_back(st.timePerMicroBatch);
      fwd.push_back(st.timePerMicroBatch / (1 + p->backwardRatio));
      wg.push_back(weightGradSeconds(fwd.back(), all.back() - fwd.back(),
                                     p->backwardRatio));
    }
    ASSERT_GT(all[0], 1.3 * all[1]);
    const double span = pipelineMakespan(
        sched, fwd, all,
        sched == PipelineSchedule::ZeroBubble ? wg : std::vector<double>{}, 4);
    ASSERT_GT(span, 0);
    EXPECT_NEAR(p->best.time.bubble, span - 4 * all[0], 1e-6 * span);
    if (sched == PipelineSchedule::OneFOneB)
      EXPECT_LT(p->best.time.bubble, 0.9 * all[0]);
  }
}

TEST(OpSearch, OneDeviceAndForwardOnly) {
  auto one = parseCluster("nodes: 1\ngpus_per_node: 1\ngpu: a100-sxm-80gb\n",
                          ClusterFormat::Yaml, "one.yaml");
  ASSERT_TRUE(one) << one.status().message();
  GraphSummary g = mlp2(32, 256, 1024);
  auto p = searchOpPlan(g, *one, CostModel(), bf16Training());
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->best.cfg.dp * p->best.cfg.tp * p->best.cfg.pp, 1);
  EXPECT_TRUE(p->reshards.empty());
  SearchOptions fwd = bf16Training();
  fwd.training = false;
  auto f = searchOpPlan(g, *one, CostModel(), fwd);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->best.memory.grads, 0);
  EXPECT_EQ(f->best.memory.optimizer, 0);
  EXPECT_LT(f->best.time.total(), p->best.time.total());
}

TEST(OpSearch, ErrorsSayWhy) {
  Cluster cl = preset("dgx-a100");
  // Too big for any plan: the best memory against the capacity.
  GraphSummary big = mlp2(8, 131072, 262144);
  auto p = searchOpPlan(big, cl, CostModel(), bf16Training());
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("no plan fits in memory"),
            std::string::npos)
      << p.status().message();
  EXPECT_NE(p.status().message().find("against a capacity of 80.00 GiB"),
            std::string::npos)
      << p.status().message();
  GraphSummary empty;
  empty.modelName = "empty";
  auto e = searchOpPlan(empty, cl, CostModel(), bf16Training());
  ASSERT_FALSE(e);
  EXPECT_NE(e.status().message().find("has no ops"), std::string::npos);
  SearchOptions bad = bf16Training();
  bad.fix.schedule = PipelineSchedule::Interleaved1F1B;
  bad.fix.pp = 1;
  auto s = searchOpPlan(mlp2(8, 64, 64), cl, CostModel(), bad);
  ASSERT_FALSE(s);
  EXPECT_NE(s.status().message().find("is impossible: schedule=interleaved "
                                      "needs pp > 1"),
            std::string::npos)
      << s.status().message();
  // v= without a schedule selects interleaving (as --fix v=2 does), with
  // pp > 1 and micro-batches a multiple of pp; v=1 excludes it.
  SearchOptions v = bf16Training();
  v.fix.v = 2;
  auto sv = searchOpPlan(mlp2(8, 64, 64), cl, CostModel(), v);
  ASSERT_TRUE(sv) << sv.status().message();
  EXPECT_EQ(sv->best.cfg.schedule, PipelineSchedule::Interleaved1F1B);
  EXPECT_EQ(sv->best.cfg.virtualStages, 2);
  EXPECT_GT(sv->best.cfg.pp, 1);
  EXPECT_EQ(sv->best.cfg.numMicroBatches % sv->best.cfg.pp, 0);
  // What the op-level search does not plan is refused, not ignored.
  for (const char *f : {"cp=2", "sp=1", "recompute=full"}) {
    SearchOptions o = bf16Training();
    o.fix = *parseFix(f);
    auto r = searchOpPlan(mlp2(8, 64, 64), cl, CostModel(), o);
    ASSERT_FALSE(r) << f;
    const std::string msg = r.status().message();
    EXPECT_NE(msg.find("is impossible"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string(f) + (f[0] == 'r' ? " is" : ":")),
              std::string::npos)
        << msg;
  }
  SearchOptions dp3 = bf16Training();
  dp3.fix.tp = 3;
  auto d = searchOpPlan(mlp2(8, 64, 64), cl, CostModel(), dp3);
  ASSERT_FALSE(d);
  // Said up front, in the shared terms (explainShapeFix).
  EXPECT_NE(d.status().message().find(
                "--fix tp=3 is impossible: the fixed degrees multiply to 3, "
                "which does not divide the"),
            std::string::npos)
      << d.status().message();
  SearchOptions deep = bf16Training();
  deep.fix = *parseFix("pp=2,schedule=interleaved,v=8");
  auto dv = searchOpPlan(mlp2(8, 64, 64), cl, CostModel(), deep);
  ASSERT_FALSE(dv);
  EXPECT_NE(dv.status().message().find(
                "schedule=interleaved: pp*v = 16 model chunks exceed the"),
            std::string::npos)
      << dv.status().message();
}

TEST(OpSearch, ReplicatedWeightsAreReadWholeByEveryRank) {
  // 8 rows against a 16384 x 16384 weight: a memory-bound GEMM. Splitting
  // the batch over 8 ranks leaves each reading all 512 MiB of the weight;
  // column-parallel reads 1/8 of it. Priced by the rank's bytes, sharding
  // the weight is faster even though both do 1/8 of the FLOPs.
  Builder b(64);
  ValueRef h = b.input("x", {64, 16384});
  h = b.unary("dlopt.relu", b.matmul(h, b.param("w0", {16384, 16384})));
  b.op("dlopt.mse", OpClass::Loss, {}, {h, b.input("y", {64, 16384})});
  SearchOptions o = bf16Training(64);
  o.fix.tp = 8;
  o.fix.pp = 1;
  o.fix.mbs = 64;
  auto p = searchOpPlan(b.g, preset("dgx-a100"), CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  auto s = strategiesOf(*p, b.g);
  EXPECT_NE(s["#0 dlopt.matmul"], "batch");
  EXPECT_NE(s["#0 dlopt.matmul"], "replicated");
  for (const auto &[name, layout] : p->params)
    EXPECT_EQ(layout.kind, Layout::S) << name;
}

TEST(OpSearch, ZeroShardsTheOptimizerStep) {
  // Under ZeRO-1 and up each of the dp ranks updates 1/dp of the states:
  // the optimizer step of dp=8 is an eighth of the one without ZeRO.
  GraphSummary g = mlp2(8192, 512, 2048);
  SearchOptions o = bf16Training();
  o.fix.dp = 8;
  o.fix.pp = 1;
  o.fix.mbs = 64;
  double update[2];
  for (int zero : {0, 1}) {
    o.fix.zero = zero;
    auto p = searchOpPlan(g, preset("dgx-a100"), CostModel(), o);
    ASSERT_TRUE(p) << p.status().message();
    update[zero] = p->best.time.optimizer;
  }
  // The optimizer step (its own row, as in transformer reports): a
  // memory-bound pass over 2.1M parameters: read the fp32 gradient (4),
  // read and write the two fp32 moments (16) and the fp32 master (8),
  // write the bf16 weight (2).
  const PrecisionConfig &pr = o.bytes;
  ASSERT_TRUE(pr.masterWeights);
  const double elems = 2.0 * 512 * 2048;
  const double moved = pr.gradBytes + 4 * pr.optimizerStateBytes +
                       2 * pr.masterBytes + pr.paramBytes;
  EXPECT_EQ(moved, 30);
  const double bw = gpuPreset("a100-sxm-80gb")->memoryBandwidth * 0.9;
  EXPECT_NEAR((update[0] - update[1]) / (7.0 / 8 * elems * moved / bw), 1.0,
              1e-9);
  // At a calibrated optimizer_gb_s the update runs at that rate instead.
  Calibration cal;
  cal.optimizerBandwidth = 100e9;
  for (int zero : {0, 1}) {
    o.fix.zero = zero;
    auto p = searchOpPlan(g, preset("dgx-a100"), CostModel(cal), o);
    ASSERT_TRUE(p) << p.status().message();
    update[zero] = p->best.time.optimizer;
  }
  EXPECT_NEAR((update[0] - update[1]) / (7.0 / 8 * elems * moved / 100e9),
              1.0, 1e-9);
}

TEST(OpSearch, CalibratedCpuPricesEachGemmOfTheStepByItsShape) {
  // One matmul x [512, 1024] x w [1024, 1024] (compute-bound on the cpu
  // preset) on a device with a gemm_table: the forward GEMM and, x being
  // data, only the weight gradient's GEMM dw = x^T dy (1024 x 1024, inner
  // 512); the size classes price the same op as forward x (1 + 2).
  Builder b(512);
  ValueRef x = b.input("x", {512, 1024});
  ValueRef h = b.matmul(x, b.param("w", {1024, 1024}));
  b.op("dlopt.mse", OpClass::Loss, {}, {h, b.input("y", {512, 1024})});
  SearchOptions o;
  o.training = true;
  o.precision = Precision::FP32;
  Calibration flat; // every shape at 0.5
  for (double m : {16.0, 4096.0})
    for (double n : {16.0, 4096.0})
      for (double k : {16.0, 4096.0})
        flat.gemmTable.push_back({m, n, k, 0.5});
  Calibration classes;
  classes.matmulLargeEfficiency = classes.matmulSmallEfficiency = 0.5;
  // The cpu preset's node has two devices: data parallel, 256 rows each.
  const Cluster cpu = preset("cpu", 1);
  o.fix.tp = 1;
  o.fix.pp = 1;
  auto byShape = searchOpPlan(b.g, cpu, CostModel(flat), o);
  auto bySize = searchOpPlan(b.g, cpu, CostModel(classes), o);
  ASSERT_TRUE(byShape) << byShape.status().message();
  ASSERT_TRUE(bySize) << bySize.status().message();
  const double gemm = 2.0 * 256 * 1024 * 1024 /
                      (cpu.groups.front().gpu.peak(Precision::FP32) * 0.5);
  EXPECT_NEAR((bySize->best.time.compute - byShape->best.time.compute) / gemm,
              1.0, 1e-6);
  // Where x needs a gradient too (a second layer), both GEMMs of the
  // backward are there: the two pricings agree on that layer.
  Builder b2(512);
  ValueRef h2 = b2.matmul(b2.input("x", {512, 1024}), b2.param("w0", {1024, 1024}));
  h2 = b2.matmul(h2, b2.param("w1", {1024, 1024}));
  b2.op("dlopt.mse", OpClass::Loss, {}, {h2, b2.input("y", {512, 1024})});
  auto s2 = searchOpPlan(b2.g, cpu, CostModel(flat), o);
  auto c2 = searchOpPlan(b2.g, cpu, CostModel(classes), o);
  ASSERT_TRUE(s2 && c2);
  EXPECT_NEAR((c2->best.time.compute - s2->best.time.compute) / gemm, 1.0,
              1e-6);
}

/// img [64, 16, 14, 14] -> conv 32 x 16 x 3 x 3 -> conv 32 x 32 x 3 x 3 ->
/// mse into `b`; returns the two convolutions' forward FLOPs.
std::pair<double, double> twoConvs(Builder &b) {
  ValueRef img = b.input("img", {64, 16, 14, 14});
  const double f1 = 2.0 * 64 * 32 * 196 * 144, f2 = 2.0 * 64 * 32 * 196 * 288;
  OpNode &c1 = b.op("dlopt.conv2d", OpClass::Conv2D, {64, 32, 14, 14},
                    {img, b.param("w1", {32, 16, 3, 3})}, f1);
  c1.groups = 1;
  ValueRef h = b.ref(c1);
  OpNode &c2 = b.op("dlopt.conv2d", OpClass::Conv2D, {64, 32, 14, 14},
                    {h, b.param("w2", {32, 32, 3, 3})}, f2);
  c2.groups = 1;
  h = b.ref(c2);
  b.op("dlopt.mse", OpClass::Loss, {}, {h, b.input("y", {64, 32, 14, 14})});
  return {f1, f2};
}

/// An f32 training step with tp and pp fixed at 1 (dp takes every device).
SearchOptions fp32TrainingOnEveryDevice() {
  SearchOptions o;
  o.training = true;
  o.precision = Precision::FP32;
  o.fix.tp = 1;
  o.fix.pp = 1;
  return o;
}

TEST(OpSearch, CalibratedCpuPricesConvolutionsAsTheirIm2colGemms) {
  // img [64, 16, 14, 14] -> conv 32 x 16 x 3 x 3 -> conv 32 x 32 x 3 x 3
  // -> mse. On a device with a gemm_table each conv is its GEMMs: the
  // forward [32, 144] x [144, cols], the filter gradient and, for the
  // second conv only (the first one's input is data), the input gradient,
  // all with the forward's FLOPs. The size classes price each conv as its
  // forward x (1 + 2): one GEMM more for the first conv.
  Builder b(64);
  const auto [f1, f2] = twoConvs(b);
  const SearchOptions o = fp32TrainingOnEveryDevice();
  Calibration flat; // every shape at 0.5
  for (double m : {16.0, 1e6})
    for (double n : {16.0, 1e6})
      for (double k : {16.0, 1e6})
        flat.gemmTable.push_back({m, n, k, 0.5});
  Calibration classes;
  classes.matmulLargeEfficiency = classes.matmulSmallEfficiency = 0.5;
  const Cluster cpu = preset("cpu", 1); // two devices: 32 images each
  auto byShape = searchOpPlan(b.g, cpu, CostModel(flat), o);
  auto bySize = searchOpPlan(b.g, cpu, CostModel(classes), o);
  ASSERT_TRUE(byShape) << byShape.status().message();
  ASSERT_TRUE(bySize) << bySize.status().message();
  const double gemm =
      f1 / 2 / (cpu.groups.front().gpu.peak(Precision::FP32) * 0.5);
  EXPECT_NEAR((bySize->best.time.compute - byShape->best.time.compute) / gemm,
              1.0, 1e-6);
  // A table whose efficiency falls with a short inner dim (k 16: 0.1)
  // prices the first conv's filter gradient (inner dim 32 x 196 pixels)
  // like its forward (inner 144), and nothing like the k = 16 corner.
  Calibration slope = flat;
  for (GemmTableRow &r : slope.gemmTable)
    if (r.k == 16)
      r.efficiency = 0.1;
  auto sloped = searchOpPlan(b.g, cpu, CostModel(slope), o);
  ASSERT_TRUE(sloped) << sloped.status().message();
  EXPECT_GT(sloped->best.time.compute, byShape->best.time.compute);
}

TEST(OpSearch, ConvTablePricesEachConvolutionPassAtItsMeasuredRate) {
  // The two convolutions of the test above with a conv_table: forward at
  // rate R, input gradient at R / 2, filter gradient at R / 4, whatever the
  // shape (a flat grid), and the first conv without an input gradient.
  // Doubling R halves exactly the convolutions' share of the step.
  Builder b(64);
  const auto [f1, f2] = twoConvs(b);
  const SearchOptions o = fp32TrainingOnEveryDevice();
  auto withRate = [](double r) {
    Calibration cal;
    for (double m : {1.0, 1e6})
      for (double n : {1.0, 1e6})
        for (double k : {1.0, 1e6}) {
          cal.gemmTable.push_back({m, n, k, 0.5});
          cal.convTable.push_back({m, n, k, r, r / 2, r / 4});
        }
    return cal;
  };
  const Cluster cpu = preset("cpu", 1); // two devices: 32 images each
  const double r = 50e9;
  auto slow = searchOpPlan(b.g, cpu, CostModel(withRate(r)), o);
  auto fast = searchOpPlan(b.g, cpu, CostModel(withRate(2 * r)), o);
  ASSERT_TRUE(slow) << slow.status().message();
  ASSERT_TRUE(fast) << fast.status().message();
  ASSERT_EQ(slow->best.key(), fast->best.key());
  // Per device (half the images): conv 1 forward + filter gradient
  // (1 + 4) f1 / 2 / R, conv 2 forward + input + filter gradients
  // (1 + 2 + 4) f2 / 2 / R; at 2R half of that.
  const double convs = (5 * f1 + 7 * f2) / 2 / r;
  EXPECT_NEAR((slow->best.time.compute - fast->best.time.compute) /
                  (convs / 2),
              1.0, 1e-6);
}

TEST(OpSearch, MemoryBoundOpsRunAtTheirClassRate) {
  // x [256, 1024] -> matmul -> gelu -> add -> mse on one device of the
  // cpu preset: the gelu at the transcendental rate, the add and the mse
  // at the stream rate, each forward x (1 + 2).
  Builder b(256);
  ValueRef x = b.matmul(b.input("x", {256, 1024}), b.param("w", {1024, 1024}));
  ValueRef h = b.unary("dlopt.gelu", x);
  h = b.binary("dlopt.add", h, x);
  b.op("dlopt.mse", OpClass::Loss, {}, {h, b.input("y", {256, 1024})});
  SearchOptions o;
  o.training = true;
  o.precision = Precision::FP32;
  o.fix.tp = 1;
  o.fix.pp = 1;
  o.fix.mbs = 256;
  o.bytes.activationBytes = 4;
  Cluster one = preset("cpu", 1);
  one.groups.front().gpusPerNode = 1;
  auto step = [&](double gelu, double add) {
    Calibration cal;
    cal.opBandwidth[size_t(MemoryClass::Transcendental)] = gelu;
    cal.opBandwidth[size_t(MemoryClass::Stream)] = add;
    cal.cacheBytes = 1e9;
    auto p = searchOpPlan(b.g, one, CostModel(cal), o);
    EXPECT_TRUE(p) << p.status().message();
    return p ? p->best.time.compute : 0.0;
  };
  const double mib = 1024.0 * 1024;
  // The gelu moves 2 MiB (x in, h out), the add 3 MiB and the mse 2 MiB.
  EXPECT_NEAR(step(1e9, 100e9) - step(2e9, 100e9), 3 * 2 * mib / 2e9,
              1e-9);
  EXPECT_NEAR(step(10e9, 1e9) - step(10e9, 2e9), 3 * 5 * mib / 2e9, 1e-8);
  // A measured backward ratio for the transcendental class: the gelu's
  // backward is 1.5 x its forward (2 MiB at 1 GB/s) instead of 2 x.
  auto withRatio = [&](double r) {
    Calibration cal;
    cal.opBandwidth[size_t(MemoryClass::Transcendental)] = 1e9;
    cal.opBandwidth[size_t(MemoryClass::Stream)] = 100e9;
    cal.cacheBytes = 1e9;
    cal.opBackwardRatio[size_t(MemoryClass::Transcendental)] = r;
    auto p = searchOpPlan(b.g, one, CostModel(cal), o);
    EXPECT_TRUE(p) << p.status().message();
    return p ? p->best.time.compute : 0.0;
  };
  EXPECT_NEAR(withRatio(0) - withRatio(1.5), 0.5 * 2 * mib / 1e9, 1e-9);
}

TEST(OpSearch, MemoryConstraintShardsWhatDoesNotFit) {
  // Batch splitting is fastest, but replicated weights do not fit in 80 GB:
  // the memory-constrained solve shards enough of them. Micro-batches of
  // 1024 rows (128 per device under batch splitting) keep the GEMMs
  // compute-bound; with 8 rows per device, every device reading all the
  // replicated weights would cost more than sharding them, and sharding
  // would win without the memory limit.
  Builder b(1024);
  ValueRef h = b.input("x", {1024, 16384});
  for (int l = 0; l < 24; ++l)
    h = b.unary("dlopt.relu",
                b.matmul(h, b.param("w" + std::to_string(l), {16384, 16384})));
  b.op("dlopt.mse", OpClass::Loss, {}, {h, b.input("y", {1024, 16384})});
  SearchOptions o = bf16Training(65536); // 64 micro-batches
  o.fix.tp = 8;
  o.fix.pp = 1;
  o.fix.mbs = 1024;
  auto p = searchOpPlan(b.g, preset("dgx-a100"), CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_TRUE(p->best.fits());
  EXPECT_TRUE(p->best.memoryConstrained);
  int split = 0;
  for (const auto &pl : p->params)
    split += pl.second.kind == Layout::S;
  EXPECT_GT(split, 0);
  EXPECT_LT(split, 24);
  // It reports the faster plan that does not fit.
  bool oom = false;
  for (const OpAlternative &a : p->alternatives)
    oom |= a.why.find("out of memory") != std::string::npos;
  EXPECT_TRUE(oom);
}

TEST(OpSearch, ReportsAreDeterministicAndParse) {
  GraphSummary g = mlp2(64, 4096, 16384);
  Cluster cl = preset("dgx-a100", 2);
  SearchOptions o = bf16Training(256);
  auto a = searchOpPlan(g, cl, CostModel(), o);
  auto b = searchOpPlan(g, cl, CostModel(), o);
  ASSERT_TRUE(a && b);
  ReportOptions ro;
  std::string ta = formatOpTextReport(*a, cl, g, ro);
  EXPECT_EQ(ta, formatOpTextReport(*b, cl, g, ro));
  EXPECT_NE(ta.find("== sharding over tp="), std::string::npos);
  EXPECT_NE(ta.find("dlopt.matmul x2:"), std::string::npos);
  EXPECT_NE(ta.find("== memory per device"), std::string::npos);
  std::string ja = formatOpJsonReport(*a, cl, g, ro);
  EXPECT_EQ(ja, formatOpJsonReport(*b, cl, g, ro));
  EXPECT_NE(ja.find("\"kind\": \"op-level\""), std::string::npos);
  EXPECT_NE(ja.find("\"format\": \"dlopt-plan\""), std::string::npos);
}

//===----------------------------------------------------------------------===//
// Op-level plans (planner/Plan.h)
//===----------------------------------------------------------------------===//

TEST(OpPlanFile, RoundTripGivesTheSamePlan) {
  GraphSummary g = mlp2(64, 4096, 16384);
  Cluster cl = preset("dgx-a100", 2);
  SearchOptions o = bf16Training(256);
  o.optimizer = Optimizer::Momentum;
  auto a = searchOpPlan(g, cl, CostModel(), o);
  ASSERT_TRUE(a) << a.status().message();
  std::string text = formatOpJsonReport(*a, cl, g);
  auto lp = Plan::parse(text, "plan.json");
  ASSERT_TRUE(lp) << lp.status().message();
  EXPECT_EQ(lp->kind, PlanKind::OpLevel);
  EXPECT_EQ(lp->cluster.numDevices(), 16);
  EXPECT_EQ(lp->cluster.summary(), cl.summary());
  EXPECT_EQ(lp->globalBatch, 256);
  EXPECT_TRUE(lp->training);
  EXPECT_EQ(lp->optimizer, Optimizer::Momentum);
  EXPECT_EQ(lp->ops.size(), a->choices.size());
  EXPECT_EQ(lp->args.size(), g.args.size());
  EXPECT_TRUE(checkPlanMatchesModel(*lp, g).isOk());
  EXPECT_EQ(lp->toJson(), a->plan.toJson());

  // Re-priced with every choice pinned: one candidate, the same plan.
  SearchOptions r = bf16Training(lp->globalBatch);
  r.fix = fixSpecOf(*lp);
  r.optimizer = lp->optimizer;
  auto b = searchOpPlan(g, lp->cluster, CostModel(), r);
  ASSERT_TRUE(b) << b.status().message();
  EXPECT_EQ(b->stats.priced, 1);
  EXPECT_EQ(b->best.key(), a->best.key());
  EXPECT_EQ(comparePlans(*lp, b->plan), "");
  auto first = nlohmann::json::parse(text);
  auto second =
      nlohmann::json::parse(formatOpJsonReport(*b, lp->cluster, g));
  for (const char *k : {"model", "cluster", "mesh", "config", "args", "ops"})
    EXPECT_EQ(first[k], second[k]) << k;
  for (const char *k : {"ops", "params", "resharding", "stages", "ranks",
                        "communication", "step_time", "memory"})
    EXPECT_EQ(first["report"][k], second["report"][k]) << k;

  // The sharding is compared op by op.
  Plan other = *lp;
  other.ops[0].strategy = "sideways";
  std::string diff = comparePlans(other, b->plan);
  EXPECT_NE(diff.find("differs from the plan file in 1 place"),
            std::string::npos)
      << diff;
  EXPECT_NE(diff.find("sideways in the plan"), std::string::npos) << diff;
}

TEST(OpPlanFile, ShardingsFollowTheChoices) {
  // A wide MLP with 8 samples on 8 GPUs: tp = 8 with Megatron's column ->
  // row pairing, written as mesh shardings.
  GraphSummary g = mlp2(8, 16384, 16384);
  Cluster cl = preset("dgx-a100");
  SearchOptions o = bf16Training(8);
  o.fix.tp = 8;
  auto a = searchOpPlan(g, cl, CostModel(), o);
  ASSERT_TRUE(a) << a.status().message();
  const Plan &p = a->plan;
  EXPECT_EQ(p.tp(), 8);
  ASSERT_EQ(p.ops.size(), a->choices.size());
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const OpChoice &c = a->choices[i];
    const PlannedOp &po = p.ops[i];
    EXPECT_EQ(po.id, g.ops[c.op].key());
    EXPECT_EQ(po.strategy, c.strategy);
    ASSERT_EQ(po.operands.size(), c.operands.size());
    for (size_t k = 0; k < c.operands.size(); ++k) {
      const Layout &l = c.operands[k];
      const Sharding &s = po.operands[k];
      if (l.kind == Layout::S)
        EXPECT_EQ(s.split[l.dim], std::vector<std::string>{"tp"});
      else if (l.kind == Layout::P)
        EXPECT_EQ(s.partial, std::vector<std::string>{"tp"});
      else
        EXPECT_FALSE(s.uses("tp"));
    }
    ASSERT_EQ(po.results.size(), 1u);
  }
  bool column = false, row = false;
  for (const PlannedOp &po : p.ops) {
    column |= po.strategy == "column";
    row |= po.strategy == "row" && po.results[0].partial ==
                                       std::vector<std::string>{"tp"};
  }
  EXPECT_TRUE(column);
  EXPECT_TRUE(row);
  // Parameters carry their tp layout.
  for (const auto &[name, l] : a->params) {
    const Sharding *s = p.argSharding(name);
    ASSERT_TRUE(s) << name;
    EXPECT_EQ(s->dimOf("tp"), l.kind == Layout::S ? l.dim : -1) << name;
  }
}

TEST(OpPlanFile, ForwardPlan) {
  GraphSummary g = mlp2(8, 64, 256);
  Cluster cl = preset("cpu");
  SearchOptions o;
  o.training = false;
  auto a = searchOpPlan(g, cl, CostModel(), o);
  ASSERT_TRUE(a) << a.status().message();
  auto j = nlohmann::json::parse(formatOpJsonReport(*a, cl, g));
  auto lp = Plan::parse(j.dump(), "p.json");
  ASSERT_TRUE(lp) << lp.status().message();
  EXPECT_FALSE(lp->training);
  EXPECT_EQ(*fixSpecOf(*lp).schedule, PipelineSchedule::GPipe);
  // Every v3 plan embeds its cluster.
  j["cluster"].erase("definition");
  lp = Plan::parse(j.dump(), "p.json");
  ASSERT_FALSE(lp);
  EXPECT_NE(lp.status().message().find(
                "cluster: missing required field 'definition'"),
            std::string::npos)
      << lp.status().message();
}

TEST(OpPlanFile, RejectsBadFiles) {
  GraphSummary g = mlp2(64, 4096, 16384);
  Cluster cl = preset("dgx-a100");
  auto a = searchOpPlan(g, cl, CostModel(), bf16Training(256));
  ASSERT_TRUE(a) << a.status().message();
  auto good = nlohmann::json::parse(formatOpJsonReport(*a, cl, g));
  ASSERT_TRUE(Plan::parse(good.dump(), "p.json"));
  auto expectError = [&](nlohmann::json j, const std::string &needle) {
    auto lp = Plan::parse(j.dump(), "p.json");
    ASSERT_FALSE(lp) << "accepted a plan that should fail with: " << needle;
    EXPECT_NE(lp.status().message().find(needle), std::string::npos)
        << lp.status().message();
  };
  auto j = good;
  j["kind"] = "layer-wise";
  expectError(j, "p.json: kind: expected \"transformer\" or \"op-level\"");
  j = good;
  j["kind"] = 3;
  expectError(j, "kind: expected a string");
  j = good;
  j["version"] = 1;
  expectError(j, "version: this dlopt reads plan files of version 3, got "
                 "version 1");
  j = good;
  j["mode"] = "inference";
  expectError(j, "mode: expected \"training\" or \"forward\"");
  j = good;
  j.erase("global_batch");
  expectError(j, "missing required field 'global_batch'");
  j = good;
  j["model"].erase("ops");
  expectError(j, "model: missing required field 'ops'");
  j = good;
  j["model"]["params"] = "many";
  expectError(j, "model.params: expected a number");
  j = good;
  j["mesh"].erase("shape");
  expectError(j, "mesh: missing required field 'shape'");
  j = good;
  j["mesh"]["shape"][1] = j["mesh"]["shape"][1].get<int>() * 2;
  expectError(j, "mesh: pp*dp*cp*tp = ");
  j = good;
  j["config"]["num_micro_batches"] =
      j["config"]["num_micro_batches"].get<int>() * 2;
  expectError(j, "config: dp*micro_batch_size*num_micro_batches = ");
  j = good;
  j["config"]["schedule"] = "interleaved";
  expectError(j, "config.schedule: \"interleaved\" needs virtual_stages >= 2, "
                 "got 1");
  j = good;
  j["config"]["recompute"] = "full";
  expectError(j, "config.recompute: op-level plans use \"none\"");
  j = good;
  j["config"]["zero_stage"] = 4;
  expectError(j, "config.zero_stage: expected 0 to 3");
  j = good;
  j["config"]["optimizer"] = "lion";
  expectError(j, "config.optimizer: expected \"sgd\"");
  j = good;
  j["ops"].erase(j["ops"].size() - 1);
  expectError(j, "ops: ");
  j = good;
  j["ops"][1].erase("strategy");
  expectError(j, "ops[1]: missing required field 'strategy'");
  j = good;
  j["ops"][1]["id"] = -1;
  expectError(j, "ops[1].id: expected an integer >= 0");
  j = good;
  j["ops"][1]["id"] = j["ops"][0]["id"];
  expectError(j, "ops[1].id: ids must increase");
  j = good;
  j["ops"][1]["stage"] = 5;
  expectError(j, "ops[1].stage: stage 5 of pp = ");
  j = good;
  j["ops"][1]["results"][0]["split"][0] = {"tp", "tp"};
  expectError(j, "ops[1].results[0].split[0]: mesh axis \"tp\" is used twice");
  j = good;
  j["ops"][1]["operands"] = 7;
  expectError(j, "ops[1].operands: expected an array");
  j = good;
  j["mesh"]["shape"][0] = int64_t(1) << 32;
  expectError(j, "mesh.shape[0]: expected an integer >= 1");
  j = good;
  j["args"] = 7;
  expectError(j, "args: expected an array");
  j = good;
  j["cluster"]["devices"] = 9;
  expectError(j, "cluster.devices: 9 devices");
  j = good;
  j["cluster"]["definition"]["nodes"][0]["gpu"]["memory_gb"] = -1;
  expectError(j, "cluster.definition");
  // Forward plans cannot use ZeRO.
  j = good;
  j["mode"] = "forward";
  j["config"]["zero_stage"] = 1;
  expectError(j, "config.zero_stage: zero 1 needs a training plan");
  // Truncated text.
  std::string text = good.dump();
  for (size_t cut : {size_t(1), text.size() / 3, text.size() - 1}) {
    auto lp = Plan::parse(text.substr(0, cut), "p.json");
    ASSERT_FALSE(lp);
    EXPECT_NE(lp.status().message().find("p.json: invalid JSON"),
              std::string::npos)
        << lp.status().message();
  }
}

TEST(OpPlanFile, DetectsAnotherModel) {
  GraphSummary g = mlp2(64, 512, 2048);
  Cluster cl = preset("dgx-a100");
  auto a = searchOpPlan(g, cl, CostModel(), bf16Training(256));
  ASSERT_TRUE(a) << a.status().message();
  auto lp = Plan::parse(formatOpJsonReport(*a, cl, g), "p.json");
  ASSERT_TRUE(lp) << lp.status().message();
  // Wider: other parameter count.
  Status st = checkPlanMatchesModel(*lp, mlp2(64, 512, 4096));
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("the plan was made for another model: "
                              "parameters 2097152 in the plan, 4194304 in "
                              "the model"),
            std::string::npos)
      << st.message();
  // Same counts, another op.
  GraphSummary other = g;
  other.ops[1].op = "dlopt.gelu";
  st = checkPlanMatchesModel(*lp, other);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("planned op 1 is #1 dlopt.relu in the plan, "
                              "#1 dlopt.gelu in the model"),
            std::string::npos)
      << st.message();
  // Stable ids: the plan names op #1, which the model must have.
  other = g;
  for (OpNode &n : other.ops)
    n.stableId = n.id + 100;
  st = checkPlanMatchesModel(*lp, other);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("the model has no forward op #0"),
            std::string::npos)
      << st.message();
  // A transformer plan is not an op-level one and vice versa.
  Plan t = *lp;
  t.kind = PlanKind::Transformer;
  EXPECT_FALSE(checkPlanMatchesModel(t, g).isOk());
}

} // namespace

TEST(OpSharding, LayoutParsesItsOwnForm) {
  for (Layout l : {Layout::rep(), Layout::partial(), Layout::split(0),
                   Layout::split(3), Layout::split(15)}) {
    auto back = Layout::parse(l.str());
    ASSERT_TRUE(back) << l.str();
    EXPECT_EQ(*back, l);
  }
  for (const char *bad : {"", "S", "S16", "S01", "Sx", "r", "RR", "P0", "S-1"})
    EXPECT_FALSE(Layout::parse(bad)) << bad;
}

TEST(OpSearch, ZeroThreeBucketsHideBehindThePreviousBucket) {
  using oppricing::Zero3Bucket;
  using oppricing::zero3BucketExposure;
  // Three buckets; gathers of 2, 3 and 4 ms (forward), 1, 2 and 3 ms
  // (backward), reduce-scatters of 5, 6 and 7 ms; forward compute 10, 1
  // and 2 ms, backward twice that. Efficiency 0.5, no contention.
  std::vector<Zero3Bucket> b(3);
  const double ms = 1e-3;
  for (int k = 0; k < 3; ++k) {
    b[k].gather = (2 + k) * ms;
    b[k].backwardGather = (1 + k) * ms;
    b[k].reduceScatter = (5 + k) * ms;
  }
  b[0].forward = 10 * ms;
  b[1].forward = 1 * ms;
  b[2].forward = 2 * ms;
  for (Zero3Bucket &x : b)
    x.backward = 2 * x.forward;
  auto none = [](double, double) { return 0.0; };
  auto z = zero3BucketExposure(b, 0.5, none);
  // Forward: the first gather whole (2); the second beside bucket 0's 10
  // ms, half of which hides: max(0, 3 - 5) = 0; the third beside bucket
  // 1's 1 ms: 4 - 0.5 = 3.5.
  EXPECT_NEAR(z.forward, (2 + 0 + 3.5) * ms, 1e-12);
  // Backward: bucket 2's gather whole (3); beside bucket 2's 4 ms,
  // bucket 1's gather (2): 2 - 2 = 0; beside bucket 1's 2 ms, bucket 0's
  // gather and bucket 2's reduce-scatter (1 + 7): 8 - 1 = 7; beside bucket
  // 0's 20 ms, bucket 1's reduce-scatter (6): 6 - 10 < 0, 0; then bucket
  // 0's reduce-scatter (5).
  EXPECT_NEAR(z.backward, (3 + 0 + 7 + 0 + 5) * ms, 1e-12);
  // The gathers' share: 3, and 1/8 of the 7.
  EXPECT_NEAR(z.backwardGather, (3 + 7.0 / 8) * ms, 1e-12);
  // Contention: a collective takes half of each second beside compute;
  // the second forward gather, hidden, now shows what it takes: min(3, 5)
  // x 0.5 = 1.5.
  auto half = [](double, double) { return 0.5; };
  auto zc = zero3BucketExposure(b, 0.5, half);
  EXPECT_NEAR(zc.forward, (2 + 1.5 + 3.5) * ms, 1e-12);
  // One bucket: its gathers and reduce-scatter all show.
  auto one = zero3BucketExposure({b[0]}, 0.5, none);
  EXPECT_NEAR(one.forward, 2 * ms, 1e-12);
  EXPECT_NEAR(one.backward, (1 + 5) * ms, 1e-12);
  EXPECT_EQ(zero3BucketExposure({}, 0.5, none).forward, 0);
}

TEST(OpSearch, ZeroThreeShowsItsFirstGatherAndLastReduceScatter) {
  // Two 4096 x 4096 layers (32 MiB each in bf16, one 25 MiB bucket each)
  // on 16 ranks of two DGX H100s: the first bucket's gather has nothing
  // to hide behind, nor the last reduce-scatter; the whole-model gather
  // priced behind the whole step's compute (before 2026-11-30) hid both.
  auto cl = *resolveCluster("dgx-h100:2");
  SearchOptions z3 = bf16Training();
  z3.globalBatch = 64;
  z3.fix = *parseFix("dp=16,zero=3");
  auto b = searchOpPlan(mlp2(64, 4096, 4096), cl, CostModel(), z3);
  ASSERT_TRUE(b) << b.status().message();
  const OpCandidate &best = b->best;
  EXPECT_GT(best.zero3ForwardExposed, 0);
  EXPECT_GT(best.zero3BackwardGatherExposed, 0);
  EXPECT_GT(best.time.dpComm,
            best.zero3ForwardExposed + best.zero3BackwardGatherExposed);
  // The report's rows: per bucket, and their exposures add up.
  double gathers = 0, exposed = 0;
  for (const CommOp &op : b->comms)
    if (op.what.rfind("dp ", 0) == 0) {
      exposed += op.exposed;
      if (op.what.find("zero-3 parameter all-gather (forward)") !=
          std::string::npos)
        gathers = op.calls;
    }
  EXPECT_GE(gathers, 2);
  EXPECT_NEAR(exposed, best.time.dpComm, 1e-12);
}
