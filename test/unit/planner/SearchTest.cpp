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
  EXPECT_EQ(cfg.dp * cfg.tp * cfg.pp, c.numDevices());
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
    EXPECT_EQ(a.cand.cfg.dp * a.cand.cfg.tp * a.cand.cfg.pp, c.numDevices());
    if (a.cand.fits())
      EXPECT_GE(a.cand.time.total(), p.best.time.total()) << a.cand.key();
  }
  // Ranks map onto distinct (stage, dp, tp) coordinates.
  std::set<std::tuple<int, int, int>> coords;
  for (int r = 0; r < c.numDevices(); ++r) {
    RankCoords rc = rankCoords(cfg, r);
    coords.insert({rc.stage, rc.dp, rc.tp});
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
