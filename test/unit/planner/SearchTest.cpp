//===- SearchTest.cpp - Invariants of the plan search ---------------------===//
#include "planner/Report.h"
#include "planner/Search.h"

#include "TestUtil.h"

#include <set>

using namespace dlopt::planner;

namespace {

/// A GPT-like summary built by hand (what GraphSummary produces for
/// dlopt-gen gpt models): per-layer matmul/attention/other costs at batch 1.
GraphSummary gpt(int64_t layers, int64_t hidden, int64_t heads, int64_t seq,
                 int64_t vocab) {
  GraphSummary g;
  g.modelName = "main";
  g.numLayers = layers;
  g.batch = 1;
  g.seq = seq;
  g.hidden = hidden;
  g.heads = heads;
  g.kvHeads = heads;
  g.headDim = hidden / heads;
  g.ffn = 4 * hidden;
  g.vocab = vocab;
  g.tiedEmbeddings = true;
  g.learnedPositions = true;
  g.dtype = "bf16";
  g.dtypeBytes = 2;
  double h = hidden, s = seq;
  OpGroupSummary pre;
  pre.name = "pre";
  pre.otherFlops = s * h;
  pre.otherBytes = 4 * s * h;
  pre.params = vocab * h + s * h;
  g.groups.push_back(pre);
  for (int64_t l = 0; l < layers; ++l) {
    OpGroupSummary L;
    L.layer = l;
    L.name = "layer " + std::to_string(l);
    L.matmulFlops = 2 * s * 12 * h * h;
    L.matmulBytes = 2 * (12 * h * h + 16 * s * h);
    L.attentionFlops = 4 * s * s * h;
    L.attentionBytes = 2 * 4 * s * h;
    L.otherFlops = 20 * s * h;
    L.otherBytes = 2 * 40 * s * h;
    L.params = 12 * h * h + 13 * h;
    g.groups.push_back(L);
  }
  OpGroupSummary post;
  post.name = "post";
  post.matmulFlops = 2 * s * h * vocab;
  post.matmulBytes = 2 * (s * h + vocab * h + s * vocab);
  post.params = 2 * h;
  g.groups.push_back(post);
  g.totalParams = layers * (12 * h * h + 13 * h) + vocab * h + s * h + 2 * h;
  return g;
}

SearchOptions opts(int64_t batch) {
  SearchOptions o;
  o.globalBatch = batch;
  o.topK = 5;
  return o;
}

void checkInvariants(const PlanResult &p, const Cluster &c) {
  const TrainingConfig &cfg = p.best.cfg;
  EXPECT_EQ(cfg.dp * cfg.tp * cfg.pp * cfg.cp, c.numDevices());
  EXPECT_EQ(cfg.dp * cfg.microBatchSize * cfg.numMicroBatches, p.globalBatch);
  EXPECT_LE(p.best.memory.total(), c.minDeviceMemory());
  EXPECT_GT(p.best.time.total(), 0);
  // Every layer in exactly one stage, stages contiguous and in order.
  ASSERT_EQ(int(p.stageLayers.size()), cfg.pp);
  std::vector<int64_t> all;
  for (const auto &s : p.stageLayers) {
    EXPECT_FALSE(s.empty());
    all.insert(all.end(), s.begin(), s.end());
  }
  ASSERT_EQ(int64_t(all.size()), p.spec.numLayers);
  for (size_t i = 0; i < all.size(); ++i)
    EXPECT_EQ(all[i], int64_t(i));
  for (const Alternative &a : p.alternatives) {
    EXPECT_EQ(a.cand.cfg.dp * a.cand.cfg.tp * a.cand.cfg.pp * a.cand.cfg.cp,
              c.numDevices());
    if (a.cand.fits())
      EXPECT_GE(a.cand.time.total(), p.best.time.total()) << a.cand.key();
  }
  // Ranks map onto distinct (stage, dp, cp, tp) coordinates.
  std::set<std::tuple<int, int, int, int>> coords;
  for (int r = 0; r < c.numDevices(); ++r) {
    RankCoords rc = rankCoords(cfg, r);
    coords.insert({rc.stage, rc.dp, rc.cp, rc.tp});
  }
  EXPECT_EQ(int(coords.size()), c.numDevices());
}

} // namespace

TEST(Search, InvariantsOnSeveralClusters) {
  GraphSummary g = gpt(24, 2048, 16, 2048, 50257);
  for (const char *spec : {"dgx-a100:1", "dgx-a100:4", "dgx-h100:16"}) {
    SCOPED_TRACE(spec);
    auto c = resolveCluster(spec);
    ASSERT_TRUE(c) << c.status().message();
    auto p = searchPlan(g, *c, CostModel(), opts(512));
    ASSERT_TRUE(p) << p.status().message();
    checkInvariants(*p, *c);
  }
}

TEST(Search, OneDevice) {
  GraphSummary g = gpt(2, 64, 4, 16, 128);
  auto c = resolveCluster("cpu");
  ASSERT_TRUE(c);
  c->groups[0].gpusPerNode = 1;
  auto p = searchPlan(g, *c, CostModel(), opts(4));
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->best.cfg.dp, 1);
  EXPECT_EQ(p->best.cfg.tp, 1);
  EXPECT_EQ(p->best.cfg.pp, 1);
  checkInvariants(*p, *c);
}

TEST(Search, Deterministic) {
  GraphSummary g = gpt(24, 2048, 16, 2048, 50257);
  auto c = resolveCluster("dgx-a100:4");
  ASSERT_TRUE(c);
  auto a = searchPlan(g, *c, CostModel(), opts(256));
  auto b = searchPlan(g, *c, CostModel(), opts(256));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(formatTextReport(*a, *c, g), formatTextReport(*b, *c, g));
}

TEST(Search, FixIsHonoured) {
  GraphSummary g = gpt(24, 2048, 16, 2048, 50257);
  auto c = resolveCluster("dgx-a100:4");
  ASSERT_TRUE(c);
  SearchOptions o = opts(256);
  auto fix = parseFix("tp=8,pp=2,mbs=1,schedule=1f1b,recompute=full,zero=1");
  ASSERT_TRUE(fix) << fix.status().message();
  o.fix = *fix;
  auto p = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  const TrainingConfig &cfg = p->best.cfg;
  EXPECT_EQ(cfg.tp, 8);
  EXPECT_EQ(cfg.pp, 2);
  EXPECT_EQ(cfg.dp, 2);
  EXPECT_EQ(cfg.microBatchSize, 1);
  EXPECT_EQ(cfg.schedule, PipelineSchedule::OneFOneB);
  EXPECT_EQ(cfg.recompute, RecomputePolicy::Full);
  EXPECT_EQ(cfg.zeroStage, 1);
  checkInvariants(*p, *c);
}

TEST(Search, ImpossibleFixSaysWhy) {
  GraphSummary g = gpt(24, 2048, 16, 2048, 50257);
  auto c = resolveCluster("dgx-a100:4");
  ASSERT_TRUE(c);
  SearchOptions o = opts(256);
  o.fix = *parseFix("tp=3");
  auto p = searchPlan(g, *c, CostModel(), o);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("tp=3 does not divide the 16 attention "
                                      "heads"),
            std::string::npos)
      << p.status().message();
  o.fix = *parseFix("pp=5");
  p = searchPlan(g, *c, CostModel(), o);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("pp=5 does not divide the 24 layers"),
            std::string::npos)
      << p.status().message();
  EXPECT_FALSE(parseFix("tp=x"));
  EXPECT_FALSE(parseFix("schedule=foo"));
  EXPECT_FALSE(parseFix("zero=4"));
  EXPECT_FALSE(parseFix("color=red"));
}

TEST(Search, TooLargeReportsBestMemory) {
  GraphSummary g = gpt(96, 12288, 96, 2048, 50257);
  auto c = resolveCluster("dgx-a100:1");
  ASSERT_TRUE(c);
  auto p = searchPlan(g, *c, CostModel(), opts(8));
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("no plan fits in memory"),
            std::string::npos);
  EXPECT_NE(p.status().message().find("capacity of 74.51 GiB"),
            std::string::npos)
      << p.status().message();
}

TEST(Search, NotATransformer) {
  GraphSummary g;
  g.groups.push_back(OpGroupSummary{});
  auto c = resolveCluster("cpu");
  auto p = searchPlan(g, *c, CostModel(), opts(1));
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("layer marks"), std::string::npos);
}

TEST(Search, LongSequencesUseContextParallelism) {
  // 32k tokens: one layer's activations alone outgrow the device without
  // splitting the sequence; cp must appear, and the invariants hold.
  GraphSummary g = gpt(8, 4096, 32, 32768, 32000);
  auto c = resolveCluster("dgx-h100:2");
  ASSERT_TRUE(c);
  auto p = searchPlan(g, *c, CostModel(), opts(16));
  ASSERT_TRUE(p) << p.status().message();
  checkInvariants(*p, *c);
  EXPECT_GT(p->best.cfg.cp, 1) << p->best.key();
  bool ring = false;
  for (const CommOp &op : p->comms)
    ring |= op.what.find("cp K/V ring") != std::string::npos;
  EXPECT_TRUE(ring);
  // Short sequences do not search cp.
  GraphSummary s = gpt(8, 4096, 32, 2048, 32000);
  auto q = searchPlan(s, *c, CostModel(), opts(16));
  ASSERT_TRUE(q);
  EXPECT_EQ(q->best.cfg.cp, 1);
  EXPECT_GT(q->stats.pruned.size(), 0u);
}

TEST(Search, ContextParallelDividesActivationsAndAddsRing) {
  GraphSummary g = gpt(8, 4096, 32, 16384, 32000);
  auto c = resolveCluster("dgx-h100:1");
  ASSERT_TRUE(c);
  SearchOptions o = opts(8);
  o.fix = *parseFix("tp=4,pp=1,cp=1,mbs=1,recompute=selective,zero=1,sp=1");
  auto one = searchPlan(g, *c, CostModel(), o);
  o.fix = *parseFix("tp=4,pp=1,cp=2,mbs=1,recompute=selective,zero=1,sp=1");
  auto two = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(one && two) << (one ? two.status().message()
                                  : one.status().message());
  // Half the tokens per rank: selective recompute keeps sbh/t * 34 per
  // layer (no score term), so the stored activations halve exactly.
  EXPECT_DOUBLE_EQ(two->best.memory.activations,
                   one->best.memory.activations / 2);
  EXPECT_EQ(one->best.time.cpComm, 0);
  double ringTime = 0;
  for (const CommOp &op : two->comms)
    if (op.what.find("cp K/V ring") != std::string::npos)
      ringTime = op.time;
  EXPECT_GT(ringTime, 0);
  // 8 GPUs / (tp 4 * cp 2) leave dp = 1: gradients still sync over the
  // dp*cp = 2 ranks that hold the same parameters.
  EXPECT_EQ(two->best.cfg.dp, 1);
  bool dpcp = false;
  for (const CommOp &op : two->comms)
    dpcp |= op.what.rfind("dp*cp", 0) == 0 && op.groupSize == 2;
  EXPECT_TRUE(dpcp);
}

TEST(Search, SequenceParallelSplitsReplicatedWork) {
  GraphSummary g = gpt(8, 4096, 32, 4096, 32000);
  auto c = resolveCluster("dgx-a100:1");
  ASSERT_TRUE(c);
  SearchOptions o = opts(8);
  o.fix = *parseFix("tp=8,pp=1,mbs=1,recompute=none,zero=1,sp=0");
  auto off = searchPlan(g, *c, CostModel(), o);
  o.fix = *parseFix("tp=8,pp=1,mbs=1,recompute=none,zero=1,sp=1");
  auto on = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(off && on);
  // Norms/dropouts split over tp: less compute and less activation memory;
  // the all-gather + reduce-scatter pair moves what the all-reduce moved.
  EXPECT_LT(on->best.time.compute, off->best.time.compute);
  EXPECT_LT(on->best.memory.activations, off->best.memory.activations);
  EXPECT_NEAR(on->best.time.tpComm, off->best.time.tpComm,
              0.05 * off->best.time.tpComm);
}

TEST(Search, ProcessLayoutIsADecision) {
  // Large model: dispatch hidden, in-graph (hybrid) saves host memory.
  GraphSummary big = gpt(24, 2048, 16, 2048, 50257);
  auto c = resolveCluster("dgx-a100:2");
  ASSERT_TRUE(c);
  auto p = searchPlan(big, *c, CostModel(), opts(64));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->best.process.layout, ProcessLayout::InGraph);
  EXPECT_EQ(p->best.process.processesPerNode, 1);
  EXPECT_STREQ(layoutName(p->best.process.layout, c->numNodes()), "hybrid");
  EXPECT_EQ(p->best.time.host, 0);
  // Tiny model with many small kernels: host-bound, one process per GPU.
  GraphSummary tiny = gpt(2, 64, 4, 16, 128);
  for (auto &grp : tiny.groups)
    grp.numOps = 40;
  auto q = searchPlan(tiny, *c, CostModel(), opts(16));
  ASSERT_TRUE(q);
  EXPECT_EQ(q->best.process.layout, ProcessLayout::BetweenGraph);
  EXPECT_EQ(q->best.process.processesPerNode, 8);
  EXPECT_GT(q->best.time.host, 0);
  // A host too small for 8 processes forces in-graph.
  Cluster small = *c;
  small.groups[0].host.memoryBytes = 40e9;
  auto r = searchPlan(tiny, small, CostModel(), opts(16));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->best.process.layout, ProcessLayout::InGraph);
  EXPECT_NE(r->best.process.why.find("host memory"), std::string::npos);
  // And --fix wins.
  SearchOptions o = opts(64);
  o.fix.layout = ProcessLayout::BetweenGraph;
  auto f = searchPlan(big, *c, CostModel(), o);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->best.process.layout, ProcessLayout::BetweenGraph);
}

TEST(Search, FixParsesNewKeys) {
  auto f = parseFix("cp=4,sp=1,layout=hybrid");
  ASSERT_TRUE(f) << f.status().message();
  EXPECT_EQ(*f->cp, 4);
  EXPECT_TRUE(*f->sp);
  EXPECT_EQ(*f->layout, ProcessLayout::InGraph);
  EXPECT_EQ(f->str(), "cp=4,sp=1,layout=in-graph");
  EXPECT_FALSE(parseFix("sp=2"));
  EXPECT_FALSE(parseFix("layout=nope"));
  EXPECT_FALSE(parseFix("cp=0"));
}
