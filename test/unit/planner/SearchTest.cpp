//===- SearchTest.cpp - Invariants of the plan search ---------------------===//
#include "planner/Search.h"
#include "planner/ConfigSpace.h"
#include "planner/Report.h"
#include "planner/SearchUtil.h"
#include "planner/TransformerPricing.h"

#include "TestUtil.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
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

/// The search's plan under `--fix fix` (which must parse).
Expected<PlanResult> planWithFix(const GraphSummary &g, const Cluster &c,
                                 SearchOptions o, const std::string &fix) {
  auto f = parseFix(fix);
  if (!f)
    return f.status();
  o.fix = *f;
  return searchPlan(g, c, CostModel(), o);
}

void checkInvariants(const PlanResult &p, const Cluster &c) {
  const TrainingConfig &cfg = p.best.cfg;
  EXPECT_EQ(cfg.dp * cfg.tp * cfg.pp * cfg.cp, c.numDevices());
  EXPECT_EQ(cfg.dp * cfg.microBatchSize * cfg.numMicroBatches, p.globalBatch);
  EXPECT_LE(p.best.memory.total(), p.best.capacity);
  EXPECT_LE(c.minDeviceMemory(), p.best.capacity);
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

// The pipeline's fill and drain: a micro-batch passes once through every
// stage but the slowest, which runs all m back to back. With the LM head
// (an unaligned 50257-word vocabulary, whole on every tp rank) on the
// last stage, the layer split leaves the stages unequal (their times with
// the layers' tp collectives, which is how the slowest is chosen), so the
// bubble is the other stages' time, under (pp - 1) times the slowest
// stage's; and the analytical step agrees with the simulator's replay of
// the same schedule, which the old formula did not (-10% for v=2 on
// gpt3-175b).
TEST(Search, PipelineBubbleCountsTheOtherStagesTime) {
  GraphSummary g = gpt(12, 2048, 16, 2048, 50257);
  Cluster c = *resolveCluster("dgx-h100:4");
  for (const char *sched :
       {"schedule=gpipe", "schedule=1f1b", "schedule=interleaved,v=3",
        "schedule=zero-bubble"}) {
    SCOPED_TRACE(sched);
    SearchOptions o = opts(8);
    auto fix = parseFix(std::string("tp=8,pp=4,mbs=1,") + sched);
    ASSERT_TRUE(fix) << fix.status().message();
    o.fix = *fix;
    auto p = searchPlan(g, c, CostModel(), o);
    ASSERT_TRUE(p) << p.status().message();
    const StepTime &t = p->best.time;
    const TrainingConfig &cfg = p->best.cfg;
    ASSERT_EQ(cfg.numMicroBatches, 8);
    double perMb = (t.compute + t.tpComm + t.cpComm) / 8;
    double v = cfg.schedule == PipelineSchedule::Interleaved1F1B
                   ? cfg.virtualStages
                   : 1;
    EXPECT_GT(t.bubble, 0);
    if (cfg.schedule != PipelineSchedule::ZeroBubble)
      EXPECT_LT(t.bubble, 0.9 * (cfg.pp - 1) * perMb / v);
    ASSERT_TRUE(p->simulated) << p->simError;
    EXPECT_REL(t.total(), p->simulated->stepTime, 0.08);
  }
}

TEST(Search, FixedVirtualStagesAreHonouredOrRefused) {
  GraphSummary g = gpt(24, 2048, 16, 2048, 50257);
  auto c = resolveCluster("dgx-a100:4");
  ASSERT_TRUE(c);
  // v > 1 means the interleaved schedule.
  auto v3 = parseFix("v=3");
  ASSERT_TRUE(v3) << v3.status().message();
  EXPECT_EQ(v3->schedule, PipelineSchedule::Interleaved1F1B);
  auto noPipe = parseFix("pp=1,v=3");
  ASSERT_FALSE(noPipe);
  EXPECT_NE(noPipe.status().message().find("needs a pipeline, not pp=1"),
            std::string::npos)
      << noPipe.status().message();
  SearchOptions o = opts(256);
  o.fix = *v3;
  auto p = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->best.cfg.schedule, PipelineSchedule::Interleaved1F1B);
  EXPECT_EQ(p->best.cfg.virtualStages, 3);
  EXPECT_GT(p->best.cfg.pp, 1);
  for (const Alternative &a : p->alternatives)
    EXPECT_EQ(a.cand.cfg.virtualStages, 3) << a.cand.key();
  // (Not checkInvariants: interleaved stages hold non-contiguous chunks.)
  EXPECT_LE(p->best.memory.total(), p->best.capacity);
  // v=1: no interleaving.
  o.fix = *parseFix("v=1,pp=2");
  p = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_NE(p->best.cfg.schedule, PipelineSchedule::Interleaved1F1B);
  // Interleaving needs the micro-batches in multiples of pp.
  o.fix = *parseFix("pp=2,v=3,mb=3");
  p = searchPlan(g, *c, CostModel(), o);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("mb=3 is not a multiple of pp=2"),
            std::string::npos)
      << p.status().message();
}

TEST(Search, ZeroThreeGathersAndReduceScattersPerLayer) {
  // 24 layers, dp = 32 over 4 nodes, ZeRO-3: per micro-batch each layer's
  // parameters are gathered twice (forward, backward) and its gradients
  // reduce-scattered once; the first gather and the last reduce-scatter of
  // each micro-batch have no compute to hide behind.
  GraphSummary g = gpt(24, 2048, 16, 2048, 50304);
  auto c = resolveCluster("dgx-a100:4");
  ASSERT_TRUE(c);
  SearchOptions o = opts(256);
  o.fix = *parseFix("dp=32,tp=1,pp=1,zero=3,mbs=1,recompute=none");
  auto p = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  const double m = double(p->best.cfg.numMicroBatches);
  EXPECT_EQ(m, 8);
  CommOp ag, rs;
  for (const CommOp &op : p->comms) {
    if (op.what == "dp zero-3 parameter all-gather (per layer, fwd+bwd)")
      ag = op;
    if (op.what == "dp gradient reduce-scatter (per layer)")
      rs = op;
  }
  EXPECT_EQ(ag.calls, 2 * 24 * m);
  EXPECT_EQ(rs.calls, 24 * m);
  ASSERT_GT(ag.calls, 0);
  const double ag1 = ag.time / ag.calls, rs1 = rs.time / rs.calls;
  EXPECT_GE(ag.exposed, m * ag1 * (1 - 1e-12));
  EXPECT_GE(rs.exposed, m * rs1 * (1 - 1e-12));
  EXPECT_LE(ag.exposed + rs.exposed, ag.time + rs.time);
  // The per-layer messages together move one copy of the parameters per
  // pass, as the whole-model collectives would.
  EXPECT_NEAR(ag.bytes * 24, p->best.memory.params * 32, 1e-6 * ag.bytes * 24);
}

TEST(Search, InterleavingTriesEveryEvenChunking) {
  // 24 layers on 2 stages: 12 per stage, so v in {2, 3, 4, 6, 12}.
  GraphSummary g = gpt(24, 2048, 16, 2048, 50257);
  auto c = resolveCluster("dgx-a100:4");
  ASSERT_TRUE(c);
  SearchOptions o = opts(256);
  o.topK = 50;
  o.fix = *parseFix("tp=8,pp=2,mbs=1,zero=1,recompute=full,sp=1,"
                    "schedule=interleaved");
  auto p = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  std::set<int> vs{p->best.cfg.virtualStages};
  for (const Alternative &a : p->alternatives)
    vs.insert(a.cand.cfg.virtualStages);
  EXPECT_EQ(vs, (std::set<int>{2, 3, 4, 6, 12}));
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
  EXPECT_NE(p.status().message().find("the fixed degrees multiply to 5, which "
                                      "does not divide the 32 devices"),
            std::string::npos)
      << p.status().message();
  o.fix = *parseFix("pp=32");
  p = searchPlan(g, *c, CostModel(), o);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("pp=32 exceeds the 24 layers"),
            std::string::npos)
      << p.status().message();
  // pp need not divide the layers: 24 layers on 16 stages.
  o.fix = *parseFix("pp=16,schedule=1f1b");
  p = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->stageLayers.size(), 16u);
  checkInvariants(*p, *c);
  EXPECT_FALSE(parseFix("tp=x"));
  EXPECT_FALSE(parseFix("schedule=foo"));
  EXPECT_FALSE(parseFix("zero=4"));
  EXPECT_FALSE(parseFix("color=red"));
}

// Grouped-query attention splits the key/value heads over tp; a tp that does
// not divide them is never chosen, and a fixed one is refused saying why.
TEST(Search, TensorParallelDividesTheKeyValueHeads) {
  GraphSummary g = gpt(24, 2048, 16, 2048, 50257);
  g.kvHeads = 4;
  auto c = resolveCluster("dgx-a100:4");
  ASSERT_TRUE(c);
  SearchOptions o = opts(256);
  auto p = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(4 % p->best.cfg.tp, 0) << "tp=" << p->best.cfg.tp;
  for (const auto &alt : p->alternatives)
    EXPECT_EQ(4 % alt.cand.cfg.tp, 0) << "tp=" << alt.cand.cfg.tp;
  o.fix = *parseFix("tp=8");
  p = searchPlan(g, *c, CostModel(), o);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("tp=8 does not divide the 4 key/value "
                                      "heads"),
            std::string::npos)
      << p.status().message();
  o.fix = *parseFix("tp=4");
  p = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->best.cfg.tp, 4);
}

TEST(Search, TooLargeReportsBestMemory) {
  GraphSummary g = gpt(96, 12288, 96, 2048, 50257);
  auto c = resolveCluster("dgx-a100:1");
  ASSERT_TRUE(c);
  auto p = searchPlan(g, *c, CostModel(), opts(8));
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("no plan fits in memory"),
            std::string::npos);
  EXPECT_NE(p.status().message().find("capacity of 80.00 GiB"),
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
  // 64k tokens without tensor or pipeline parallelism or recomputation:
  // the activations of the 8 layers (32 sbh bytes each, about 4.3 GB at
  // 32k) outgrow the device unless the sequence is split; cp must appear,
  // and the invariants hold. (Left free, the search fits it with
  // elementwise recomputation instead, 20 sbh a layer.)
  GraphSummary g = gpt(8, 4096, 32, 65536, 32000);
  auto c = resolveCluster("dgx-h100:2");
  ASSERT_TRUE(c);
  SearchOptions o = opts(16);
  o.fix = *parseFix("tp=1,pp=1,recompute=none");
  auto p = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  checkInvariants(*p, *c);
  EXPECT_GT(p->best.cfg.cp, 1) << p->best.key();
  bool gather = false;
  for (const CommOp &op : p->comms)
    gather |= op.what.find("cp K/V all-gather") != std::string::npos;
  EXPECT_TRUE(gather);
  // Short sequences do not search cp.
  GraphSummary s = gpt(8, 4096, 32, 2048, 32000);
  auto q = searchPlan(s, *c, CostModel(), opts(16));
  ASSERT_TRUE(q);
  EXPECT_EQ(q->best.cfg.cp, 1);
  EXPECT_GT(q->stats.pruned.size(), 0u);
}

TEST(Search, ContextParallelDividesActivationsAndGathersKeysAndValues) {
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
  // Half the tokens per rank: selective recomputation keeps each rank's
  // own k and v and gathers them over cp again for the backward pass.
  EXPECT_DOUBLE_EQ(two->best.memory.activations,
                   one->best.memory.activations / 2);
  EXPECT_EQ(one->best.time.cpComm, 0);
  // Without recomputation each rank keeps k and v gathered over cp: per
  // layer 2 (s/cp) b h/t elements more than half of cp=1's, 2 x 8192 x
  // 4096 / 4 x 2 B, over 8 layers and one micro-batch in flight.
  auto oneNone =
      planWithFix(g, *c, o, "tp=4,pp=1,cp=1,mbs=1,recompute=none,zero=1,sp=1");
  auto twoNone =
      planWithFix(g, *c, o, "tp=4,pp=1,cp=2,mbs=1,recompute=none,zero=1,sp=1");
  ASSERT_TRUE(oneNone && twoNone);
  EXPECT_DOUBLE_EQ(twoNone->best.memory.activations,
                   oneNone->best.memory.activations / 2 +
                       8 * 2 * 8192.0 * 4096 / 4 * 2);
  // As applied: per layer an all-gather of K and of V forward and again
  // for the backward pass (selective), their gradients reduce-scattered
  // backward, one logits all-gather for the loss (the vocabulary divides
  // by tp: a tp-th of it).
  CommOp ag, rs, logits;
  for (const CommOp &op : two->comms) {
    if (op.what == "cp K/V all-gather (attention)") ag = op;
    if (op.what == "cp K/V gradient reduce-scatter (attention)") rs = op;
    if (op.what == "cp logits all-gather (loss)") logits = op;
  }
  double m = double(two->best.cfg.numMicroBatches);
  EXPECT_EQ(ag.calls, 4 * 8 * m);
  EXPECT_EQ(rs.calls, 2 * 8 * m);
  EXPECT_EQ(ag.bytes, 16384.0 * 4096 / 4 * 2); // b=1, s, h/tp, bf16
  EXPECT_EQ(logits.bytes, 16384.0 * 32000 / 4 * 2);
  EXPECT_GT(two->best.time.cpComm, 0);
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
  o.fix = *parseFix("tp=8,pp=1,mbs=1,recompute=none,zero=0,sp=0");
  auto off = searchPlan(g, *c, CostModel(), o);
  o.fix = *parseFix("tp=8,pp=1,mbs=1,recompute=none,zero=0,sp=1");
  auto on = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(off && on);
  // Norms/dropouts split over tp: less compute and less activation memory;
  // the all-gather + reduce-scatter pair moves what the all-reduce moved.
  EXPECT_LT(on->best.time.compute, off->best.time.compute);
  EXPECT_LT(on->best.memory.activations, off->best.memory.activations);
  EXPECT_NEAR(on->best.time.tpComm, off->best.time.tpComm,
              0.05 * off->best.time.tpComm);
}

TEST(Search, SelectiveRecomputeGathersTheNormOutputsAgainUnderSp) {
  GraphSummary g = gpt(8, 4096, 32, 4096, 32000);
  auto c = resolveCluster("dgx-a100:1");
  ASSERT_TRUE(c);
  SearchOptions o = opts(8);
  auto none =
      planWithFix(g, *c, o, "tp=8,pp=1,mbs=1,recompute=none,zero=0,sp=1");
  auto sel =
      planWithFix(g, *c, o, "tp=8,pp=1,mbs=1,recompute=selective,zero=0,sp=1");
  ASSERT_TRUE(none && sel);
  // Per layer it keeps the two norm outputs' shards (2/8 sbh each instead
  // of the gathered sbh): 2 (2/8 + 2/8 + 12/8) = 4 sbh against
  // 2 (2 + 2/8 + 12/8) = 7.5 sbh, bf16, s b h = 4096 * 4096.
  const double sbh = 4096.0 * 4096;
  EXPECT_NEAR(none->best.memory.activations - sel->best.memory.activations,
              8 * 3.5 * sbh, 1.0);
  // ... and gathers them again in the backward pass: 2 more all-gathers
  // per layer on top of 8 collectives (2 all-gathers and 2 reduce-scatters
  // each way) of the same bytes.
  EXPECT_NEAR(sel->best.time.tpComm / none->best.time.tpComm, 10.0 / 8.0,
              0.02);
  EXPECT_DOUBLE_EQ(sel->best.time.compute, none->best.time.compute);
  TrainingConfig cfg = sel->best.cfg;
  EXPECT_DOUBLE_EQ(pricing::tpCallsPerLayer(cfg, true).allGather, 6);
  EXPECT_DOUBLE_EQ(pricing::tpForwardShare(cfg), 4.0 / 10.0);
  // The free search prices selective recomputation with SP, and prunes it
  // without SP as the same plan as none.
  auto free = planWithFix(g, *c, o, "tp=8,pp=1,mbs=1,zero=0");
  ASSERT_TRUE(free);
  // none, elementwise, alternate and full, each with sp 0 and 1, and
  // selective with sp.
  EXPECT_EQ(free->stats.enumerated, 9);
  EXPECT_EQ(free->stats.pruned.count(
                "recompute=selective without sp or cp: the same plan as none "
                "(fused attention stores no scores to re-run, nothing is "
                "gathered to gather again)"),
            1u);
}

/// The best plan of an 8-layer GPT (h 4096, seq 4096) at tp=8 with sequence
/// parallelism on one DGX A100, with recomputation `rc`.
Candidate tp8SpRecompute(const char *rc) {
  static const GraphSummary g = gpt(8, 4096, 32, 4096, 32000);
  static const Cluster c = *resolveCluster("dgx-a100:1");
  auto p =
      planWithFix(g, c, opts(8),
                  std::string("tp=8,pp=1,mbs=1,zero=0,sp=1,recompute=") + rc);
  EXPECT_TRUE(p) << rc;
  return p ? p->best : Candidate{};
}

TEST(Search, ElementwiseRecomputeRerunsTheMemoryBoundForward) {
  auto plan = tp8SpRecompute;
  const Candidate none = plan("none"), ew = plan("elementwise"),
                  full = plan("full");
  // Per layer 2.5 sbh bytes kept instead of none's 7.5 (the norm outputs
  // and the GELU output recomputed), s b h = 4096 * 4096, 8 layers, one
  // micro-batch in flight; full keeps the layer input alone.
  const double sbh = 4096.0 * 4096;
  EXPECT_NEAR(none.memory.activations - ew.memory.activations, 8 * 5 * sbh,
              1.0);
  EXPECT_LT(full.memory.activations, ew.memory.activations);
  // It re-runs the memory-bound forward only: more compute than none,
  // much less than full, which re-runs the matmuls and attention too.
  EXPECT_GT(ew.time.compute, none.time.compute);
  EXPECT_LT(ew.time.compute - none.time.compute,
            0.25 * (full.time.compute - none.time.compute));
}

TEST(Search, AlternateRecomputeRerunsEverySecondMatmul) {
  auto plan = tp8SpRecompute;
  const Candidate ew = plan("elementwise"), alt = plan("alternate"),
                  full = plan("full");
  // Per layer 2.25 sbh bytes kept instead of elementwise's 2.5 (k is
  // re-run; tp reduces the out projection's output, which stays).
  const double sbh = 4096.0 * 4096;
  EXPECT_NEAR(ew.memory.activations - alt.memory.activations,
              8 * 0.25 * sbh, 1.0);
  EXPECT_LT(full.memory.activations, alt.memory.activations);
  // This graph has no op list: half its matmuls re-run, between
  // elementwise and full.
  EXPECT_GT(alt.time.compute, ew.time.compute);
  EXPECT_LT(alt.time.compute, full.time.compute);
}

TEST(Search, SequenceParallelPipelinesSendTheShard) {
  GraphSummary g = gpt(8, 4096, 32, 4096, 32000);
  auto c = resolveCluster("dgx-a100:2");
  ASSERT_TRUE(c);
  auto sendBytes = [&](const char *fix) {
    auto r = planWithFix(g, *c, opts(16), fix);
    EXPECT_TRUE(r) << fix;
    for (const CommOp &op : r->comms)
      if (op.collective == Collective::SendRecv)
        return op.bytes;
    return 0.0;
  };
  // One micro-batch's [s, b, h] bf16 activation, 4096 x 4 x 4096 x 2 B;
  // under sequence parallelism each tp rank sends its 1/8 of the sequence.
  const double full = 4096.0 * 4 * 4096 * 2;
  EXPECT_DOUBLE_EQ(
      sendBytes("tp=8,pp=2,mbs=4,schedule=1f1b,recompute=none,zero=0,sp=0"),
      full);
  EXPECT_DOUBLE_EQ(
      sendBytes("tp=8,pp=2,mbs=4,schedule=1f1b,recompute=none,zero=0,sp=1"),
      full / 8);
}

TEST(Search, VocabularyParallelCollectivesArePriced) {
  // What dlopt-partition inserts for a vocabulary-parallel embedding, LM
  // head and cross-entropy (docs/cost-model.md, section 7), per step.
  GraphSummary g = gpt(4, 1024, 16, 1024, 32000);
  auto c = resolveCluster("dgx-a100:1");
  ASSERT_TRUE(c);
  SearchOptions o = opts(8);
  auto find = [](const PlanResult &p, const std::string &what) {
    for (const CommOp &x : p.comms)
      if (x.what == what)
        return x;
    return CommOp{};
  };
  o.fix = *parseFix("tp=8,pp=1,mbs=1,recompute=none,zero=0,sp=0");
  auto off = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(off);
  double m = double(off->best.cfg.numMicroBatches);
  CommOp layer = find(*off, "tp all-reduce (layer in/out)");
  CommOp vocab = find(*off, "tp all-reduce (vocab-parallel embedding, LM head)");
  CommOp ce = find(*off, "tp all-reduce (vocab-parallel cross-entropy)");
  EXPECT_EQ(vocab.calls, 2 * m);          // lookup forward, head input backward
  EXPECT_EQ(vocab.bytes, layer.bytes);    // one [b, s, h] activation each
  EXPECT_EQ(ce.calls, 3 * m);             // row max, sum of exps, target
  EXPECT_EQ(ce.bytes, 1024.0 * 4);        // float32 per row
  o.fix = *parseFix("tp=8,pp=1,mbs=1,recompute=none,zero=0,sp=1");
  auto on = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(on);
  EXPECT_EQ(find(*on, "tp all-gather (vocab-parallel LM head, embedding grad)").calls, 2 * m);
  EXPECT_EQ(find(*on, "tp reduce-scatter (vocab-parallel embedding, LM head grad)").calls, 2 * m);
  // Norm weights (GPT: 2 layer norms with weight and bias per layer, the
  // final one) and learned positions are all-reduced once per step.
  EXPECT_EQ(find(*on, "tp all-reduce (sequence-parallel weight gradients)").calls,
            4 * 4 + 2 + 1);
  // Not vocabulary-parallel when the vocabulary does not divide by tp.
  GraphSummary odd = gpt(4, 1024, 16, 1024, 32001);
  o.fix = *parseFix("tp=8,pp=1,mbs=1,recompute=none,zero=0,sp=0");
  auto p = searchPlan(odd, *c, CostModel(), o);
  ASSERT_TRUE(p);
  EXPECT_EQ(find(*p, "tp all-reduce (vocab-parallel cross-entropy)").calls, 0);
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

namespace {

/// Two groups of `nodes` nodes each: `slow` kind first, then `fast`.
Cluster mixed(const std::string &slow, const std::string &fast, int nodes) {
  std::string y = "name: mixed\ngpus_per_node: 8\n"
                  "intra_node: {bidirectional_bandwidth_gb_s: 600}\n"
                  "network: {nics: 8, nic_gbit_s: 200}\n"
                  "nodes:\n"
                  "  - count: " + std::to_string(nodes) + "\n    gpu: " + slow +
                  "\n  - count: " + std::to_string(nodes) + "\n    gpu: " +
                  fast + "\n";
  auto c = parseCluster(y, ClusterFormat::Yaml, "mixed.yaml");
  EXPECT_TRUE(c) << c.status().message();
  return c ? *c : Cluster{};
}

/// Plans `g` on `cluster` for `batch` samples with `fix` pinned; fails the
/// test (and returns an error) when the search does.
Expected<PlanResult> planFixed(const GraphSummary &g, const Cluster &cluster,
                               int64_t batch, const char *fix) {
  SearchOptions o = opts(batch);
  auto f = parseFix(fix);
  EXPECT_TRUE(f) << fix;
  if (f)
    o.fix = *f;
  auto p = searchPlan(g, cluster, CostModel(), o);
  EXPECT_TRUE(p) << fix << ": " << (p ? "" : p.status().message());
  return p;
}

/// The per-stage layer counts of a plan.
std::vector<int64_t> counts(const PlanResult &p) {
  std::vector<int64_t> n;
  for (const auto &s : p.stageLayers)
    n.push_back(int64_t(s.size()));
  return n;
}

} // namespace

TEST(Search, HeterogeneousStagesTakeLayersInProportionToSpeed) {
  GraphSummary g = gpt(48, 4096, 32, 2048, 51200);
  Cluster c = mixed("a100-sxm-80gb", "h100-sxm-80gb", 1);
  SearchOptions o = opts(64);
  auto fix = parseFix("tp=8,pp=2,mbs=1,schedule=1f1b,recompute=selective");
  ASSERT_TRUE(fix);
  o.fix = *fix;
  auto p = searchPlan(g, c, CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  checkInvariants(*p, c);
  ASSERT_EQ(p->stageGpus.size(), 2u);
  EXPECT_EQ(p->stageGpus[0], "A100-SXM-80GB");
  EXPECT_EQ(p->stageGpus[1], "H100-SXM-80GB");
  auto n = counts(*p);
  EXPECT_EQ(p->best.cfg.stageLayerCounts, n);
  // More layers on the faster stage, though not 989/312 = 3.2x: at tp=8 and
  // one sample per micro-batch, the tp all-reduces (same NVLink on both)
  // and memory-bound work (3.35 against 2.0 TB/s) weigh in, and the H100
  // stage also holds the output layer.
  EXPECT_GT(n[1], n[0] + n[0] / 2);
  // Balanced: the two stages' per-micro-batch times (as replayed by the
  // simulator) differ by less than one layer, and the uniform split would
  // be slower.
  ASSERT_EQ(p->simInput.stages.size(), 2u);
  double t0 = p->simInput.stages[0].forward + p->simInput.stages[0].backward;
  double t1 = p->simInput.stages[1].forward + p->simInput.stages[1].backward;
  double perLayer0 = t0 / double(n[0]), perLayer1 = t1 / double(n[1]);
  EXPECT_LT(std::abs(t0 - t1), std::max(perLayer0, perLayer1) * 1.01)
      << t0 << " " << t1;
  EXPECT_GT(perLayer0 * 24, std::max(t0, t1));
  // Faster than the same plan on two A100 nodes, slower than on two H100s.
  auto slow = searchPlan(g, *resolveCluster("dgx-a100:2"), CostModel(), o);
  auto fast = searchPlan(g, *resolveCluster("dgx-h100:2"), CostModel(), o);
  ASSERT_TRUE(slow && fast);
  EXPECT_LT(p->best.time.total(), 0.75 * slow->best.time.total());
  EXPECT_GT(p->best.time.total(), fast->best.time.total());
  // The split is the best contiguous one: moving a layer either way is no
  // faster (priced by pinning the stage sizes through the memory model and
  // the simulator, which replays the same per-stage times).
  ASSERT_TRUE(p->simulated) << p->simError;
  EXPECT_REL(p->simulated->stepTime, p->best.time.total(), 0.05);
  // MFU uses the cluster's mean peak.
  EXPECT_REL(p->peakFlops, (312e12 + 989e12) / 2, 1e-9);
  // The report names each stage's GPU.
  std::string r = formatTextReport(*p, c, g);
  EXPECT_NE(r.find("on A100-SXM-80GB"), std::string::npos) << r;
  EXPECT_NE(r.find("on H100-SXM-80GB"), std::string::npos) << r;
}

TEST(Search, MinMaxSplitMatchesBruteForce) {
  // Random layer weights, per-stage speeds, fixed per-stage costs and
  // memory limits; every composition of L into pp parts enumerated.
  std::mt19937 rng(20261121);
  std::uniform_real_distribution<double> w(0.1, 3.0), speed(0.3, 3.0);
  int checked = 0, infeasible = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int L = 2 + int(rng() % 11), pp = 1 + int(rng() % std::min(4, L));
    std::vector<double> weight(L), sp(pp), fixedCost(pp);
    std::vector<int64_t> maxLayers(pp);
    // Every other trial has identical layers, checked with the count
    // search too.
    const bool identical = trial % 2 == 1;
    double same = w(rng);
    for (double &x : weight)
      x = identical ? same : w(rng);
    for (int st = 0; st < pp; ++st) {
      sp[st] = speed(rng);
      fixedCost[st] = rng() % 2 ? w(rng) : 0;
      maxLayers[st] = 1 + int64_t(rng() % L);
    }
    auto time = [&](int st, int64_t a, int64_t b) {
      double t = fixedCost[st];
      for (int64_t i = a; i < b; ++i)
        t += weight[i];
      return t / sp[st];
    };
    auto fits = [&](int st, int64_t n) { return n <= maxLayers[st]; };
    // Brute force over compositions.
    double best = std::numeric_limits<double>::infinity();
    int64_t bestMost = L; // fewest layers on the fullest stage at `best`
    std::vector<int64_t> cur;
    std::function<void(int64_t)> rec = [&](int64_t a) {
      int st = int(cur.size());
      if (st == pp) {
        if (a != L)
          return;
        double worst = 0;
        int64_t at = 0;
        for (int k = 0; k < pp; ++k) {
          worst = std::max(worst, time(k, at, at + cur[k]));
          at += cur[k];
        }
        int64_t most = *std::max_element(cur.begin(), cur.end());
        if (worst < best * (1 - 1e-12)) {
          best = worst;
          bestMost = most;
        } else if (worst <= best * (1 + 1e-12)) {
          bestMost = std::min(bestMost, most);
        }
        return;
      }
      for (int64_t n = 1; a + n <= L - (pp - 1 - st); ++n) {
        if (!fits(st, n))
          continue;
        cur.push_back(n);
        rec(a + n);
        cur.pop_back();
      }
    };
    rec(0);
    auto split = minMaxContiguousSplit(L, pp, time, fits);
    if (identical) {
      auto byCount = minMaxContiguousSplit(L, pp, time, fits, true);
      if (std::isinf(best))
        EXPECT_TRUE(byCount.empty()) << "trial " << trial;
      else {
        ASSERT_EQ(int(byCount.size()), pp) << "trial " << trial;
        double worst = 0;
        int64_t at = 0;
        for (int k = 0; k < pp; ++k) {
          EXPECT_TRUE(fits(k, byCount[k]));
          worst = std::max(worst, time(k, at, at + byCount[k]));
          at += byCount[k];
        }
        EXPECT_EQ(at, L);
        EXPECT_LE(worst, best * (1 + 1e-8)) << "trial " << trial;
      }
    }
    if (std::isinf(best)) {
      EXPECT_TRUE(split.empty()) << "trial " << trial;
      ++infeasible;
      continue;
    }
    ASSERT_EQ(int(split.size()), pp) << "trial " << trial;
    double worst = 0;
    int64_t at = 0;
    for (int k = 0; k < pp; ++k) {
      EXPECT_GE(split[k], 1);
      EXPECT_TRUE(fits(k, split[k])) << "trial " << trial << " stage " << k;
      worst = std::max(worst, time(k, at, at + split[k]));
      at += split[k];
    }
    EXPECT_EQ(at, L) << "trial " << trial;
    EXPECT_LE(worst, best * (1 + 1e-8)) << "trial " << trial;
    // Among the fastest splits, no stage fuller than it must be.
    EXPECT_LE(*std::max_element(split.begin(), split.end()), bestMost)
        << "trial " << trial;
    ++checked;
  }
  EXPECT_GT(checked, 150);
  EXPECT_GT(infeasible, 0);
  EXPECT_TRUE(minMaxContiguousSplit(2, 3, nullptr, nullptr).empty());
}

TEST(Search, HeterogeneousMemoryShiftsLayersToTheLargerDevice) {
  // Same compute, different memory: a 40 GB and a 141 GB H100-class GPU.
  // The uniform split does not fit the small one; the planner moves layers
  // to the large one until it does.
  std::string y =
      "name: mem\ngpus_per_node: 8\n"
      "intra_node: {bidirectional_bandwidth_gb_s: 900}\n"
      "network: {nics: 8, nic_gbit_s: 400}\n"
      "nodes:\n"
      "  - count: 1\n    gpu: {base: h100-sxm-80gb, name: small, memory_gb: 40}\n"
      "  - count: 1\n    gpu: {base: h100-sxm-80gb, name: large, memory_gb: 141}\n";
  auto c = parseCluster(y, ClusterFormat::Yaml, "mem.yaml");
  ASSERT_TRUE(c) << c.status().message();
  GraphSummary g = gpt(96, 6144, 48, 2048, 51200);
  SearchOptions o = opts(64);
  auto fix = parseFix("tp=8,pp=2,mbs=1,schedule=1f1b,zero=0,recompute=none");
  ASSERT_TRUE(fix);
  o.fix = *fix;
  auto p = searchPlan(g, *c, CostModel(), o);
  ASSERT_TRUE(p) << p.status().message();
  checkInvariants(*p, *c);
  auto n = counts(*p);
  EXPECT_LT(n[0], n[1]);
  // Each stage within its own device.
  TrainingConfig cfg = p->best.cfg;
  for (int st = 0; st < 2; ++st) {
    auto m = transformerStageMemory(p->spec, cfg, st);
    ASSERT_TRUE(m) << m.status().message();
    EXPECT_LE(m->total(), p->stageCapacity[st]) << "stage " << st;
  }
  // The uniform split would not fit the small device.
  cfg.stageLayerCounts.clear();
  auto u = transformerStageMemory(p->spec, cfg, 0);
  ASSERT_TRUE(u);
  EXPECT_GT(u->total(), p->stageCapacity[0]);
}

TEST(Search, HomogeneousPlansNameNoStageGpus) {
  GraphSummary g = gpt(24, 2048, 16, 2048, 50257);
  auto c = resolveCluster("dgx-a100:4");
  ASSERT_TRUE(c);
  auto p = planFixed(g, *c, 256, "pp=4,schedule=1f1b");
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->stageGpus.empty());
  EXPECT_TRUE(p->stageCapacity.empty());
  EXPECT_EQ(formatTextReport(*p, *c, g).find(" on A100"), std::string::npos);
}

TEST(Search, PipelineSplitLightensTheOutputStage) {
  // GPT-2 small: the output layer (vocab 50257) costs about four layers, so
  // a balanced 4-stage pipeline gives the last stage fewer layers than the
  // uniform 3/3/3/3, and is faster than the uniform split would be.
  GraphSummary g = gpt(12, 768, 12, 1024, 50257);
  auto c = resolveCluster("dgx-a100:1");
  ASSERT_TRUE(c);
  auto p = planFixed(g, *c, 64,
                     "tp=1,pp=4,mbs=1,schedule=1f1b,zero=0,recompute=none");
  ASSERT_TRUE(p);
  checkInvariants(*p, *c);
  auto n = counts(*p);
  ASSERT_EQ(n.size(), 4u);
  EXPECT_LT(n[3], 3) << n[0] << "/" << n[1] << "/" << n[2] << "/" << n[3];
  EXPECT_LE(*std::max_element(n.begin(), n.end()), 4);
  // The stage times the simulator replays: the last stage (with the output
  // layer) no longer dominates by more than a layer.
  ASSERT_EQ(p->simInput.stages.size(), 4u);
  double worst = 0, last = 0;
  for (const SimStage &s : p->simInput.stages)
    worst = std::max(worst, s.forward + s.backward);
  last = p->simInput.stages[3].forward + p->simInput.stages[3].backward;
  double perLayer = (p->simInput.stages[1].forward +
                     p->simInput.stages[1].backward) / double(n[1]);
  EXPECT_LT(worst - (p->simInput.stages[1].forward +
                     p->simInput.stages[1].backward),
            1.01 * std::max(perLayer, last));
  // Interleaved 1F1B keeps the uniform split.
  auto q = planFixed(g, *c, 64,
                     "tp=1,pp=2,mbs=1,schedule=interleaved,zero=0,"
                     "recompute=none");
  ASSERT_TRUE(q);
  EXPECT_EQ(counts(*q), (std::vector<int64_t>{6, 6}));
  auto r = planFixed(g, *c, 64,
                     "tp=1,pp=2,mbs=1,schedule=1f1b,zero=0,recompute=none");
  ASSERT_TRUE(r);
  EXPECT_LT(counts(*r)[1], counts(*r)[0]);
}

TEST(Search, InterleavedChunksNeedNotDivideTheLayers) {
  // 26 layers, pp=4, v=2: 8 chunks, the first two of 4 layers, the rest of
  // 3; stage 0 holds chunks 0 and 4.
  GraphSummary g = gpt(26, 2048, 16, 2048, 50257);
  auto c = resolveCluster("dgx-a100:4");
  ASSERT_TRUE(c);
  auto p = planFixed(g, *c, 256, "tp=8,pp=4,mbs=1,schedule=interleaved,v=2");
  ASSERT_TRUE(p);
  ASSERT_EQ(p->stageLayers.size(), 4u);
  EXPECT_EQ(p->stageLayers[0],
            (std::vector<int64_t>{0, 1, 2, 3, 14, 15, 16}));
  EXPECT_EQ(p->stageLayers[1],
            (std::vector<int64_t>{4, 5, 6, 7, 17, 18, 19}));
  EXPECT_EQ(p->stageLayers[3],
            (std::vector<int64_t>{11, 12, 13, 23, 24, 25}));
  std::set<int64_t> all;
  for (const auto &s : p->stageLayers)
    all.insert(s.begin(), s.end());
  EXPECT_EQ(all.size(), 26u);
  EXPECT_EQ(p->best.cfg.virtualStages, 2);
  ASSERT_TRUE(p->simulated) << p->simError;
  // The report prints each stage's chunks.
  std::string r = formatTextReport(*p, *c, g);
  EXPECT_NE(r.find("stage 0: layers 0-3, 14-16 (7) + pre"), std::string::npos)
      << r;
  // v=3 can be fixed too (26 layers, 12 chunks).
  auto q = planFixed(g, *c, 256, "tp=8,pp=4,mbs=1,schedule=interleaved,v=3");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->best.cfg.virtualStages, 3);
  // More chunks than layers is refused with the numbers.
  SearchOptions o = opts(256);
  o.fix = *parseFix("tp=8,pp=4,mbs=1,schedule=interleaved,v=8");
  auto bad = searchPlan(g, *c, CostModel(), o);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("pp*v = 32 model chunks exceed the 26 "
                                        "layers"),
            std::string::npos)
      << bad.status().message();
}

// Issue 10: the --fix grammar refuses what it can see is contradictory, and
// products of fixed values never overflow.
TEST(FixGrammar, RecomputePolicies) {
  for (const char *rc : {"none", "selective", "elementwise", "alternate", "full"}) {
    auto f = parseFix(std::string("recompute=") + rc);
    ASSERT_TRUE(f) << rc;
    EXPECT_STREQ(recomputeName(*f->recompute), rc);
  }
}

TEST(Search, EqualTimesPreferLessRecomputation) {
  // Recomputation hidden behind a host-bound step prices the same: the
  // plan that recomputes less wins, though another keeps less memory.
  Candidate none, ew;
  none.time.compute = ew.time.compute = 1e-3;
  none.cfg.recompute = RecomputePolicy::None;
  ew.cfg.recompute = RecomputePolicy::Elementwise;
  none.memory.activations = 2e9;
  ew.memory.activations = 1e9;
  EXPECT_TRUE(pricing::better(none, ew));
  EXPECT_FALSE(pricing::better(ew, none));
  // Otherwise the faster one, whatever it recomputes.
  ew.time.compute = 0.9e-3;
  EXPECT_TRUE(pricing::better(ew, none));
}

TEST(FixGrammar, RepeatsAndContradictions) {
  auto twice = parseFix("dp=1,tp=2,dp=2");
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.status().message(),
            "--fix: dp is given twice ('dp=1' and 'dp=2')");
  auto alias = parseFix("mb=4,num_mb=8");
  ASSERT_FALSE(alias);
  EXPECT_EQ(alias.status().message(),
            "--fix: mb is given twice ('mb=4' and 'num_mb=8')");
  auto v = parseFix("v=3,schedule=gpipe");
  ASSERT_FALSE(v);
  EXPECT_EQ(v.status().message(),
            "--fix: v=3 (model chunks per stage) needs schedule=interleaved, "
            "not schedule=gpipe");
  EXPECT_FALSE(parseFix("schedule=interleaved,v=1"));
  EXPECT_TRUE(parseFix("schedule=interleaved,v=3"));
  auto big = parseFix("tp=2000000");
  ASSERT_FALSE(big);
  EXPECT_EQ(big.status().message(),
            "--fix: tp=2000000 exceeds 1048576, the most devices a cluster "
            "may have");
  auto huge = parseFix("dp=1048576,tp=1048576,pp=1048576,cp=1048576");
  ASSERT_TRUE(huge);
  EXPECT_FALSE(huge->degreeProduct());
  auto batch = parseFix("dp=1048576,mbs=1073741824,mb=1073741824");
  ASSERT_TRUE(batch);
  EXPECT_FALSE(batch->batchProduct());
  EXPECT_EQ(*parseFix("dp=2,tp=4")->degreeProduct(), 8);
}

TEST(FixGrammar, SearchOptionsAreValidated) {
  SearchOptions so;
  so.globalBatch = -1;
  EXPECT_FALSE(validateSearchOptions(so));
  so.globalBatch = kMaxGlobalBatch + 1;
  EXPECT_FALSE(validateSearchOptions(so));
  so.globalBatch = 0;
  EXPECT_TRUE(validateSearchOptions(so));
  so.training = false;
  so.fix.zero = 2;
  Status st = validateSearchOptions(so);
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("needs a training step (--train)"),
            std::string::npos);
  so.fix.zero = 0;
  EXPECT_TRUE(validateSearchOptions(so));
  so.fix.recompute = RecomputePolicy::Full;
  EXPECT_FALSE(validateSearchOptions(so));
}

TEST(FixGrammar, Divisors) {
  // The loop runs while i <= n/i (i*i overflowed for n near 2^63).
  auto d = divisorsOf(int64_t(1) << 40);
  EXPECT_EQ(d.size(), 41u);
  EXPECT_EQ(d.back(), int64_t(1) << 40);
  EXPECT_EQ(divisorsOf(36), (std::vector<int64_t>{1, 2, 3, 4, 6, 9, 12, 18, 36}));
}

namespace {
/// The transformer search's pricing context for bf16 training on one DGX
/// H100 node, pacing GPU set, with an empty graph: for tests that price a
/// single piece (a GEMM, the optimizer step) directly.
struct H100Pricing {
  GraphSummary g;
  Cluster cl = *resolveCluster("dgx-h100");
  CostModel cost;
  SearchOptions o = [] {
    SearchOptions o;
    o.training = true;
    o.precision = Precision::BF16;
    return o;
  }();
  pricing::Ctx c{g, cl, cost, o};
  H100Pricing() { c.gpu = *gpuPreset("h100-sxm-80gb"); }
};
} // namespace

// The backward GEMMs at their own shapes: a 1024-token micro-batch through
// a 4096 x 4096 weight on an H100. The input gradient has the forward's
// shape; the weight gradient, [4096, 1024] x [1024, 4096], has 4 waves of
// 128 x 256 tiles (512 of 528 slots, the forward's 128 of 132) but a K
// loop of 1024 against the forward's 4096: K shares 1024/1216 against
// 4096/4288. What trainingTime's ratio of 2 misses is that difference.
TEST(Search, BackwardGemmsArePricedAtTheirOwnShapes) {
  H100Pricing h;
  pricing::Ctx &c = h.c;
  const CostModel &cost = h.cost;
  pricing::GroupGemm gm;
  gm.perSample = GemmShape{1024, 4096, 4096};
  const double fwd = c.gemmTime(gm, 1, 1, -1);
  const double kf = 4096.0 / 4288, kw = 1024.0 / 1216;
  EXPECT_REL(fwd, gm.perSample.flops() / (989e12 * 0.84 * (128.0 / 132) * kf),
             1e-9);
  EXPECT_REL(c.gemmBackwardExtra(gm, 1, 1, -1), fwd * (kf / kw - 1), 1e-9);
  // Split over tp = 2 by columns: the forward [1024, 4096] x [4096, 2048]
  // runs 128 thin 64 x 256 tiles; the input gradient [1024, 2048] x
  // [2048, 4096] 128 tiles of 128 x 256 with a K of 2048; the weight
  // gradient [4096, 1024] x [1024, 2048] 256 tiles in 2 waves. All three
  // fill 64/66 of their slots; only the K shares differ.
  gm.split = pricing::GroupGemm::Split::N;
  const double fwd2 = c.gemmTime(gm, 1, 2, -1);
  const double kd = 2048.0 / 2240;
  EXPECT_REL(fwd2, 2.0 * 1024 * 2048 * 4096 / (989e12 * 0.84 * (128.0 / 132) * kf),
             1e-9);
  EXPECT_REL(c.gemmBackwardExtra(gm, 1, 2, -1), fwd2 * (kf / kd + kf / kw - 2),
             1e-9);
  // A batched GEMM (no shared weight) keeps its batch in both gradients:
  // 8 x [512, 4096] x [4096, 512] forward (8 x 8 tiles of 128 x 128 = 64
  // of 132 slots at K 4096, or split-K), and a square weight gradient of
  // the same shape with K = 512 rows.
  pricing::GroupGemm bm;
  bm.perSample = GemmShape{512, 512, 4096, 8};
  bm.broadcast = false;
  GemmShape dg{512, 4096, 512, 8}, wg{4096, 512, 512, 8};
  const double bytes = (512.0 * 4096 * 8 + 4096.0 * 512 * 8 + 512.0 * 512 * 8) * 2;
  const GpuSpec h100 = *gpuPreset("h100-sxm-80gb");
  EXPECT_REL(c.gemmBackwardExtra(bm, 1, 1, -1),
             cost.gemmTime(dg, bytes, Precision::BF16, h100)->time +
                 cost.gemmTime(wg, bytes, Precision::BF16, h100)->time -
                 2 * c.gemmTime(bm, 1, 1, -1),
             1e-9);
}

// Unfused attention (--attention-kernel unfused) of one layer: Q K^T and P V
// as batched GEMMs at their own shapes, a softmax (read and write) and a
// dropout (read, write, a 1-byte mask) over the s^2 scores; its backward
// dP and dV, the dropout's and the softmax's backward (read two, write
// one), dQ and dK.
// Eager PyTorch's RMS norm and rotary embedding, op by op
// (torchtitan's RMSNorm and apply_rotary_emb, and autograd's backward of
// each op), hand-counted.
TEST(Search, EagerKernels) {
  using pricing::eagerKernels;
  OpNode norm;
  norm.op = "dlopt.rms_norm";
  norm.shape = {2, 1024, 4096}; // b s h
  const double n = 2.0 * 1024 * 4096, rows = 2.0 * 1024;
  auto k = eagerKernels(norm, 2);
  ASSERT_TRUE(k);
  // Forward: cast 6, pow 8, mean 4, mul 8, cast 6, weight mul 4 bytes an
  // element; mean's result (4), its add and rsqrt (8 each), the mul's
  // read (4) a row; the weight once.
  EXPECT_DOUBLE_EQ(k->bytes, 36 * n + 24 * rows + 4096 * 2);
  EXPECT_DOUBLE_EQ(k->kernels, 8);
  // Backward: the weight's mul (grad x w: 4; grad x o, summed: 6 + 2),
  // cast 6, the mul's (grad x r: 8; grad x x, summed: 12 + 4), mean's 4,
  // pow's (x^1: 8, x 2: 8, grad x: 12), the two gradients' sum 12, cast
  // 6: 92 bytes; the weight's gradient in both widths.
  EXPECT_DOUBLE_EQ(k->backwardBytes, 92 * n + 24 * rows + 4096 * 6);
  EXPECT_DOUBLE_EQ(k->backwardKernels, 15);
  // fp32 activations: no casts.
  k = eagerKernels(norm, 4);
  EXPECT_DOUBLE_EQ(k->bytes, (8 + 4 + 8 + 8) * n + 24 * rows + 4096 * 4);
  EXPECT_DOUBLE_EQ(k->kernels, 6);
  EXPECT_DOUBLE_EQ(k->backwardBytes, 92 * n + 24 * rows + 4096 * 8);
  EXPECT_DOUBLE_EQ(k->backwardKernels, 13);
  OpNode rope;
  rope.op = "dlopt.rope";
  rope.shape = {2, 32, 1024, 128}; // b heads s d
  const double m = 2.0 * 32 * 1024 * 128;
  k = eagerKernels(rope, 2);
  ASSERT_TRUE(k);
  // cast 6, complex mul 8, cast 6; the [s, d/2] complex64 frequencies.
  // The backward is the same kernels with the conjugate.
  EXPECT_DOUBLE_EQ(k->bytes, 20 * m + 1024 * 128 * 4);
  EXPECT_DOUBLE_EQ(k->kernels, 3);
  EXPECT_DOUBLE_EQ(k->backwardBytes, k->bytes);
  EXPECT_DOUBLE_EQ(k->backwardKernels, 3);
  k = eagerKernels(rope, 4);
  EXPECT_DOUBLE_EQ(k->bytes, 8 * m + 1024 * 128 * 4);
  EXPECT_DOUBLE_EQ(k->kernels, 1);
  // Other ops, and a layer norm (PyTorch's is one fused kernel): none.
  OpNode ln = norm;
  ln.op = "dlopt.layer_norm";
  EXPECT_FALSE(eagerKernels(ln, 2));
}

// --eager-kernels through the search: each layer's RMS norm and rotary
// embedding (an op list beside the hand-built groups) add, forward and
// backward, their eager bytes less the fused op's (1 + ratio) times, at the
// H100's memory bandwidth; the compute of one device's step moves by
// exactly that.
TEST(Search, EagerKernelsInTheLayerPricing) {
  const int64_t layers = 2, h = 1024, heads = 8, s = 1024, d = h / heads;
  GraphSummary g = gpt(layers, h, heads, s, 1024);
  for (int64_t l = 0; l < layers; ++l) {
    OpNode norm;
    norm.id = int(g.ops.size());
    norm.op = "dlopt.rms_norm";
    norm.kind = OpClass::Norm;
    norm.shape = {1, s, h};
    norm.elemBytes = 2;
    norm.bytes = 2.0 * 2 * s * h + 2 * h; // x, y, the weight
    norm.flops = 4.0 * s * h;
    norm.layer = l;
    g.ops.push_back(norm);
    OpNode rope = norm;
    rope.id = int(g.ops.size());
    rope.op = "dlopt.rope";
    rope.kind = OpClass::Rope;
    rope.shape = {1, heads, s, d};
    rope.bytes = 2.0 * 2 * s * h;
    g.ops.push_back(rope);
  }
  Cluster one = *resolveCluster("dgx-h100:1");
  one.groups[0].gpusPerNode = 1;
  SearchOptions o = opts(1);
  auto price = [&](bool norm, bool rope) {
    SearchOptions x = o;
    x.bytes.eagerNorm = norm;
    x.bytes.eagerRope = rope;
    auto p = planWithFix(g, one, x, "tp=1,pp=1,mbs=1,zero=0,recompute=none");
    EXPECT_TRUE(p) << p.status().message();
    return p ? p->best : Candidate{};
  };
  const Candidate fused = price(false, false), both = price(true, true),
                  ropeOnly = price(false, true);
  const double tau = 1 / (3.35e12 * 0.9); // seconds a byte
  const double ratio = Calibration{}.backwardFlopsRatio;
  auto delta = [&](const OpNode &n) {
    const auto e = pricing::eagerKernels(n, 2);
    return (e->bytes + e->backwardBytes - (1 + ratio) * n.bytes) * tau;
  };
  const double dNorm = delta(g.ops[0]), dRope = delta(g.ops[1]);
  EXPECT_REL(both.time.compute - fused.time.compute, layers * (dNorm + dRope),
             1e-6);
  EXPECT_REL(ropeOnly.time.compute - fused.time.compute, layers * dRope, 1e-6);
  EXPECT_GT(dNorm, 0);
  EXPECT_GT(dRope, 0);
  // Memory: 8 s h a layer for the norms (none), 4 s h for the final norm
  // on the last stage, which this graph's post group has no norm op for,
  // but the spec says the model's norms are RMS norms.
  EXPECT_DOUBLE_EQ(both.memory.activations - fused.memory.activations,
                   layers * 8.0 * s * h + 4.0 * s * h);
  EXPECT_DOUBLE_EQ(ropeOnly.memory.activations, fused.memory.activations);
}

TEST(Search, UnfusedAttentionIsPricedKernelByKernel) {
  H100Pricing h;
  pricing::Ctx &c = h.c;
  c.spec.heads = 16;
  c.spec.hidden = 2048;
  c.spec.seqLen = 1024;
  c.spec.dropout = true;
  h.o.bytes.unfusedAttention = true;
  // 2 samples on a tp = 2 rank: 2 x 8 heads of 1024 x 1024 scores, d = 128.
  const auto u = c.unfusedAttention(2, 2, -1);
  const GpuSpec h100 = *gpuPreset("h100-sxm-80gb");
  const double batch = 16, s = 1024, d = 128, n = batch * s * s;
  auto gemm = [&](double m, double nn, double k) {
    return h.cost
        .gemmTime(GemmShape{m, nn, k, batch},
                  (m * k + k * nn + m * nn) * batch * 2, Precision::BF16, h100)
        ->time;
  };
  // Memory-bound at the H100's 3.35 TB/s x 0.9: 4 n bytes and 5 n bytes.
  const double softmax = 4 * n / (3.35e12 * 0.9),
               dropout = 5 * n / (3.35e12 * 0.9);
  EXPECT_REL(u.gemms, gemm(s, s, d) + gemm(s, d, s), 1e-12);
  EXPECT_REL(u.memory, softmax + dropout, 1e-9);
  EXPECT_REL(u.core, u.gemms + u.memory, 1e-12); // Q K^T through P V
  EXPECT_REL(u.backward,
             gemm(s, s, d) + 3 * gemm(s, d, s) + dropout +
                 6 * n / (3.35e12 * 0.9),
             1e-9);
  // Without dropout only the softmax's passes.
  c.spec.dropout = false;
  EXPECT_REL(c.unfusedAttention(2, 2, -1).memory, softmax, 1e-9);
}

// Context parallelism as dlopt applies it: contiguous sequence blocks, so
// under the causal mask the last of cp ranks does 2 - 1/cp times the
// average fused attention, and the layer runs at its pace. Everything
// else divides by cp.
TEST(Search, ContiguousContextBlocksLeaveTheLastRankTheMostAttention) {
  pricing::GroupCost layer;
  layer.attFlops = 4.0 * 16 * 4096 * 4096 * 128; // 4 H S T D, one sample
  layer.attBytes = 4.0 * 4096 * 2048 * 2;
  layer.mmFlops = 2.0 * 4096 * 2048 * 8192;
  layer.mmBytes = 2.0 * (4096 * 2048 + 2048 * 8192 + 4096 * 8192);
  layer.otFlops = 20.0 * 4096 * 2048;
  layer.otBytes = 30.0 * 4096 * 2048;
  layer.ops = 10;
  H100Pricing h;
  h.c.spec.heads = 16;
  h.c.spec.hidden = 2048;
  h.c.spec.seqLen = 4096;
  h.c.layers = {layer};
  EXPECT_DOUBLE_EQ(pricing::Ctx::cpCausalImbalance(1), 1);
  EXPECT_DOUBLE_EQ(pricing::Ctx::cpCausalImbalance(2), 1.5);
  EXPECT_DOUBLE_EQ(pricing::Ctx::cpCausalImbalance(4), 1.75);
  const auto &one = h.c.times(2, 1, 1, false);
  const auto &four = h.c.times(2, 1, 4, false);
  const double att1 = one.fusedAttentionPrefix[1];
  // Each rank's queries are a quarter; the last rank's block sees 7/8 of
  // the keys it holds where a balanced quarter sees half.
  EXPECT_REL(four.fusedAttentionPrefix[1],
             1.75 * h.c.roofline(OpKind::Attention, layer.attFlops * 2 / 4,
                                 layer.attBytes * 2 / 4),
             1e-12);
  EXPECT_GT(four.fusedAttentionPrefix[1], att1 / 4);
  // The rest of the layer divides by cp.
  EXPECT_REL(four.fwd[0] - four.fusedAttentionPrefix[1],
             h.c.groupMatmulAttentionTime(layer, 0.5, 1, -1) -
                 h.c.fusedAttentionTime(layer, 0.5, 1, -1, 1) +
                 h.c.groupElementwiseTime(layer, 0.5, 1, false, -1),
             1e-12);
}

// The unfused kernels replace the fused attention's roofline in a layer's
// forward, its backward is theirs in place of backward_flops_ratio times
// the forward, and selective recomputation re-runs the whole core (Q K^T
// through P V), 4 kernels with dropout.
TEST(Search, UnfusedAttentionReplacesTheFusedKernelInALayer) {
  pricing::GroupCost layer;
  layer.attFlops = 4.0 * 16 * 1024 * 1024 * 128; // 4 H S T D, one sample
  layer.attBytes = 4.0 * 1024 * 2048 * 2;
  layer.mmFlops = 2.0 * 1024 * 2048 * 8192;
  layer.mmBytes = 2.0 * (1024 * 2048 + 2048 * 8192 + 1024 * 8192);
  layer.otFlops = 20.0 * 1024 * 2048;
  layer.otBytes = 30.0 * 1024 * 2048;
  layer.ops = 10;
  H100Pricing fused, unfused;
  for (H100Pricing *h : {&fused, &unfused}) {
    h->c.spec.heads = 16;
    h->c.spec.hidden = 2048;
    h->c.spec.seqLen = 1024;
    h->c.spec.dropout = true;
    h->c.layers = {layer};
  }
  unfused.o.bytes.unfusedAttention = true;
  const auto &tf = fused.c.times(2, 2, 1, false);
  const auto &tu = unfused.c.times(2, 2, 1, false);
  const auto u = unfused.c.unfusedAttention(2, 2, -1);
  const double att =
      fused.c.roofline(OpKind::Attention, layer.attFlops, layer.attBytes);
  EXPECT_REL(tu.fwd[0], tf.fwd[0] - att + u.gemms + u.memory, 1e-9);
  const double ratio = fused.cost.calibration().backwardFlopsRatio;
  auto train = [](const pricing::LayerTimes &t, RecomputePolicy r) {
    return t.stage({{0, 1}}, false, false, CostModel(), r).train;
  };
  EXPECT_REL(train(tu, RecomputePolicy::None),
             train(tf, RecomputePolicy::None) - att * (1 + ratio) + u.gemms +
                 u.memory + u.backward,
             1e-9);
  EXPECT_REL(train(tu, RecomputePolicy::Selective) -
                 train(tu, RecomputePolicy::None),
             u.gemms + u.memory, 1e-9);
  EXPECT_EQ(train(tf, RecomputePolicy::Selective),
            train(tf, RecomputePolicy::None));
  // Elementwise recomputation re-runs the softmax and the dropout too.
  EXPECT_REL(train(tu, RecomputePolicy::Elementwise) -
                 train(tf, RecomputePolicy::Elementwise),
             -att * (1 + ratio) + u.gemms + 2 * u.memory + u.backward, 1e-9);
  // Kernels: Q K^T, softmax, dropout, P V where fused attention is one.
  EXPECT_EQ(tu.opsPrefix[1] - tf.opsPrefix[1], 3);
  EXPECT_EQ(tu.selectiveOpsPrefix[1], 4);
  EXPECT_EQ(tu.elementwiseOpsPrefix[1] - tf.elementwiseOpsPrefix[1], 2);
}

// With unfused attention selective recomputation drops the probabilities,
// so the search tries it without sp or cp; context parallelism is not
// priced for materialized scores and is pruned.
TEST(Search, UnfusedAttentionSearchesSelectiveAndPrunesCp) {
  SpaceRules r;
  r.devices = 8;
  r.gpusPerNode = 8;
  r.globalBatch = 8;
  r.numUnits = 4;
  r.seqLen = 8192;
  r.cpMinSeq = 4096;
  r.contextParallel = true;
  r.sequenceParallel = true;
  r.recompute = true;
  r.tpRule = [](int) { return std::string(); };
  auto count = [&](bool unfusedAttention) {
    r.bytes.unfusedAttention = unfusedAttention;
    std::map<std::string, int64_t> pruned;
    int selectiveNoSp = 0, cp = 0;
    forEachConfig(r, FixSpec{}, pruned, [&](const TrainingConfig &cfg) {
      selectiveNoSp += cfg.recompute == RecomputePolicy::Selective &&
                       !cfg.sequenceParallel && cfg.cp == 1;
      cp += cfg.cp > 1;
      EXPECT_EQ(cfg.precision.unfusedAttention, unfusedAttention);
    });
    return std::make_pair(selectiveNoSp, cp);
  };
  auto [selF, cpF] = count(false);
  auto [selU, cpU] = count(true);
  EXPECT_EQ(selF, 0);
  EXPECT_GT(selU, 0);
  EXPECT_GT(cpF, 0);
  EXPECT_EQ(cpU, 0);
}

// Which matmuls alternate recomputation re-runs, from a layer's op list in
// program order: the second, fourth, ..., not the last (its output feeds
// only the residual add), and under tp not a row-parallel one (its output
// is reduced across ranks and kept).
TEST(Search, AlternateRecomputeChoosesTheMatmulsByPosition) {
  H100Pricing h;
  pricing::Ctx &c = h.c;
  using Split = pricing::GroupGemm::Split;
  auto gemm = [](double n, double k, Split split) {
    pricing::GroupGemm gm;
    gm.perSample = GemmShape{1024, n, k};
    gm.split = split;
    return gm;
  };
  // A Llama layer: q, k, v, out, gate, up, down.
  const pricing::GroupGemm q = gemm(4096, 4096, Split::N),
                           k = gemm(1024, 4096, Split::N),
                           out = gemm(4096, 4096, Split::K),
                           up = gemm(14336, 4096, Split::N),
                           down = gemm(4096, 14336, Split::K);
  pricing::GroupCost layer;
  layer.gemms = {q, k, k, out, up, up, down};
  EXPECT_REL(c.groupAlternateGemmTime(layer, 1, 1, -1),
             c.gemmTime(k, 1, 1, -1) + c.gemmTime(out, 1, 1, -1) +
                 c.gemmTime(up, 1, 1, -1),
             1e-12);
  EXPECT_REL(c.groupAlternateGemmTime(layer, 2, 4, -1),
             c.gemmTime(k, 2, 4, -1) + c.gemmTime(up, 2, 4, -1), 1e-12);
  // A GPT layer: q, k, v, out, fc1, fc2; fc2 is the last.
  layer.gemms = {q, q, q, out, up, down};
  EXPECT_REL(c.groupAlternateGemmTime(layer, 1, 1, -1),
             c.gemmTime(q, 1, 1, -1) + c.gemmTime(out, 1, 1, -1), 1e-12);
  EXPECT_REL(c.groupAlternateGemmTime(layer, 1, 2, -1), c.gemmTime(q, 1, 2, -1),
             1e-12);
  // Host dispatch: of a Llama layer's 20 forward kernels, 7 matmuls and the
  // attention, elementwise launches 12 again and alternate 15 (k, out and
  // up besides; 14 under tp, whose reduced out projection stays).
  layer.gemms = {q, k, k, out, up, up, down};
  layer.ops = 20;
  layer.attFlops = 1;
  EXPECT_EQ(pricing::Ctx::rerunKernels(layer, 1, false), 12);
  EXPECT_EQ(pricing::Ctx::rerunKernels(layer, 1, true), 15);
  EXPECT_EQ(pricing::Ctx::rerunKernels(layer, 2, true), 14);
}

// A collective beside compute on an H100: its 16 CTAs split each
// persistent cuBLAS GEMM into two waves (x = 1), slow the fused attention
// by 16 / (132 - 16), and its HBM traffic, twice its link rate, the rest
// by u / (1 - u); the compute loses x / (1 + x) of each second.
TEST(Search, CollectivesBesideComputeSlowIt) {
  H100Pricing h;
  const GpuSpec &gpu = h.c.gpu;
  ASSERT_EQ(gpu.sms, 132);
  ASSERT_TRUE(gpu.persistentGemms);
  const double u = 2 * 370e9 / gpu.memoryBandwidth;
  const double x = 0.7 + 0.1 * 16.0 / 116 + 0.2 * u / (1 - u);
  EXPECT_REL(h.c.overlapSlowdown({0.8, 0.7}, 370e9, -1), x / (1 + x), 1e-12);
  // All attention: the SMs alone; a link rate past the HBM: u at most 0.9.
  EXPECT_REL(h.c.overlapSlowdown({1, 0}, 370e9, -1),
             (16.0 / 116) / (1 + 16.0 / 116), 1e-12);
  EXPECT_REL(h.c.overlapSlowdown({1, 1}, 370e9, -1), 0.5, 1e-12);
  EXPECT_REL(h.c.overlapSlowdown({0, 0}, 1e14, -1), 9.0 / 10, 1e-12);
  // No SMs (the CPU backend): nothing.
  h.c.gpu = *gpuPreset("cpu-device");
  EXPECT_EQ(h.c.overlapSlowdown({0.5, 0.5}, 1e9, -1), 0);
}

// A stage's mix: the forward's matmuls and attention, and of those the
// library GEMMs (all but the fused attention).
TEST(Search, StageMixSeparatesFusedAttention) {
  pricing::LayerTimes::Stage st{10, 30, 2, 3, 4};
  const ComputeMix mix = st.mix();
  EXPECT_DOUBLE_EQ(mix.gemm, 0.8);
  EXPECT_DOUBLE_EQ(mix.matmul, 0.5);
  // 5 of the 10 in 4 GEMMs: 1.25 each.
  EXPECT_DOUBLE_EQ(mix.gemmSeconds, 1.25);
  // No forward: all matmuls.
  const ComputeMix none = pricing::LayerTimes::Stage{}.mix();
  EXPECT_DOUBLE_EQ(none.gemm, 1);
  EXPECT_DOUBLE_EQ(none.matmul, 1);
}

// fp8: each GEMM's input is cast to fp8 with its transpose in the forward
// (read 2 bytes, write 1 + 1 per element), its output gradient in the
// backward, as Transformer Engine's cast-transpose kernels: memory-bound
// streams beside the fp8 GEMMs.
TEST(Search, Fp8GemmsPayTheirOperandsCasts) {
  H100Pricing h;
  h.o.precision = Precision::FP8;
  pricing::Ctx c{h.g, h.cl, h.cost, h.o};
  c.gpu = *gpuPreset("h100-sxm-80gb");
  pricing::GroupGemm gm;
  gm.perSample = GemmShape{8192, 4096, 1024}; // [8192, 1024] x [1024, 4096]
  const GemmShape g = gm.perSample;
  auto raw = h.cost.gemmTime(g, c.gemmBytes(gm, g), Precision::FP8, c.gpu);
  ASSERT_TRUE(raw);
  auto cast = [&](double n) {
    return h.cost.elementwiseTime(MemoryClass::Stream, n, 4 * n,
                                  Precision::BF16, c.gpu)
        ->time;
  };
  EXPECT_REL(c.gemmTime(gm, 1, 1, -1), raw->time + cast(8192.0 * 1024), 1e-12);
  // The backward casts dy [8192, 4096] where trainingTime's ratio charged
  // twice the input's cast.
  auto d = h.cost.gemmTime(GemmShape{8192, 1024, 4096}, c.gemmBytes(gm, g),
                           Precision::FP8, c.gpu);
  auto w = h.cost.gemmTime(GemmShape{1024, 4096, 8192}, c.gemmBytes(gm, g),
                           Precision::FP8, c.gpu);
  const double ratio = h.cost.calibration().backwardFlopsRatio;
  EXPECT_REL(c.gemmBackwardExtra(gm, 1, 1, -1),
             d->time + w->time - ratio * raw->time + cast(8192.0 * 4096) -
                 ratio * cast(8192.0 * 1024),
             1e-12);
  // bf16 casts nothing.
  H100Pricing bf16;
  EXPECT_EQ(bf16.c.fp8CastTime(1e6, -1), 0);
}

// Where the calibration measured op rates (op_gb_s), a layer's memory-bound
// ops are priced one by one at their class's rate, each divided by tp
// unless tensor parallelism replicates it (then by tp only under sequence
// parallelism); without rates the group's totals take one roofline.
TEST(Search, MemoryBoundOpsArePricedByClassWhereMeasured) {
  GraphSummary g;
  Cluster cl = *resolveCluster("dgx-h100");
  SearchOptions o;
  o.training = true;
  o.precision = Precision::BF16;
  Calibration cal;
  cal.opBandwidth[size_t(MemoryClass::Transcendental)] = 100e9;
  cal.opBandwidth[size_t(MemoryClass::Stream)] = 1000e9;
  cal.cacheBytes = 1e12;
  CostModel measured(cal), plain;
  pricing::Ctx c{g, cl, measured, o}, p{g, cl, plain, o};
  c.gpu = p.gpu = *gpuPreset("h100-sxm-80gb");
  pricing::GroupCost grp;
  grp.otFlops = 2e3;
  grp.otBytes = 3e6;
  grp.repFlops = 1e3;
  grp.repBytes = 2e6;
  grp.memoryOps = {{MemoryClass::Transcendental, 1e3, 1e6, false},
                   {MemoryClass::Stream, 1e3, 2e6, true}};
  EXPECT_REL(c.groupTime(grp, 1, 2, false, -1), 0.5e6 / 100e9 + 2e6 / 1000e9,
             1e-9);
  EXPECT_REL(c.groupTime(grp, 1, 2, true, -1), 0.5e6 / 100e9 + 1e6 / 1000e9,
             1e-9);
  EXPECT_REL(c.groupTime(grp, 4, 1, false, -1), 4e6 / 100e9 + 8e6 / 1000e9,
             1e-9);
  // The backward: backward_flops_ratio (2) x the forward, and where a
  // class's op_backward_ratio is measured (transcendental 3), the extra
  // ratio of that op's forward.
  EXPECT_EQ(c.groupBackwardExtra(grp, 1, 2, false, -1), 0.0);
  Calibration withBackward = cal;
  withBackward.opBackwardRatio[size_t(MemoryClass::Transcendental)] = 3;
  CostModel mb(withBackward);
  pricing::Ctx cb{g, cl, mb, o};
  cb.gpu = c.gpu;
  EXPECT_REL(cb.groupBackwardExtra(grp, 1, 2, false, -1), 0.5e6 / 100e9,
             1e-9);
  // Without rates: one roofline of 0.5 + 2 MB at the HBM bandwidth x 0.9.
  EXPECT_REL(p.groupTime(grp, 1, 2, false, -1),
             2.5e6 / (gpuPreset("h100-sxm-80gb")->memoryBandwidth * 0.9),
             1e-9);
}

// The transformer search's optimizer step moves the bytes the precision
// implies (optimizerStepBytesPerParam) over the device's shard: 1e9
// parameters of Adam state under bf16 with fp32 gradients move 30 GB, in
// f32 28 GB; plain SGD (no state: the shard comes from the weights) 12 GB.
TEST(Search, OptimizerStepMovesTheBytesOfItsPrecision) {
  H100Pricing h;
  pricing::Ctx &c = h.c;
  const CostModel &cost = h.cost;
  auto expected = [&](double params, double bytesPerParam) {
    return cost
        .optimizerTime(10 * params, bytesPerParam * params,
                       c.precisionOf(OpKind::Elementwise), c.gpu)
        ->time;
  };
  TrainingConfig cfg;
  MemoryBreakdown mem;
  mem.optimizer = 1e9 * (2 * 4 + 4); // two fp32 moments and the master
  EXPECT_REL(pricing::optimizerStepTime(c, cfg, mem, -1), expected(1e9, 30),
             1e-12);
  cfg.precision.paramBytes = 4;
  cfg.precision.masterWeights = false;
  mem.optimizer = 1e9 * 2 * 4;
  EXPECT_REL(pricing::optimizerStepTime(c, cfg, mem, -1), expected(1e9, 28),
             1e-12);
  cfg.optimizer = Optimizer::SGD;
  mem.optimizer = 0;
  mem.params = 4e9;
  EXPECT_REL(pricing::optimizerStepTime(c, cfg, mem, -1), expected(1e9, 12),
             1e-12);
}

// The analytical step against the simulator's replay where they used to
// part: host-bound plans (the replay had no host; the closed form had no
// pipeline drain behind a host-bound last stage), context parallelism and
// ZeRO-3 (the replay left out their collectives). docs/simulator.md,
// "Small and host-bound plans".
TEST(Search, HostBoundAndLongSequencePlansAgreeWithTheReplay) {
  // Kernels per layer as dlopt-gen's GPT has them (the host issues each).
  auto withOps = [](GraphSummary g) {
    for (OpGroupSummary &grp : g.groups)
      grp.numOps = grp.layer >= 0 ? 40 : 8;
    return g;
  };
  const GraphSummary tiny = withOps(gpt(2, 64, 4, 16, 128));
  struct Case {
    const char *fix;
    GraphSummary g;
    const char *cluster;
    int64_t batch;
    bool hostBound;
  };
  const Case cases[] = {
      {"mbs=1", tiny, "dgx-h100:2", 16, true},
      {"pp=2,schedule=gpipe,mbs=2", tiny, "dgx-h100:2", 16, true},
      {"pp=2,schedule=1f1b,mbs=2", tiny, "dgx-h100:2", 16, true},
      {"pp=2,schedule=1f1b,mbs=2", withOps(gpt(2, 1024, 4, 64, 1024)),
       "dgx-h100:2", 16, true},
      {"cp=4,zero=3,tp=1,pp=1", withOps(gpt(12, 768, 12, 16384, 50257)),
       "dgx-h100:4", 8, false},
  };
  for (const Case &k : cases) {
    SCOPED_TRACE(k.fix);
    SearchOptions o = opts(k.batch);
    auto fix = parseFix(k.fix);
    ASSERT_TRUE(fix) << fix.status().message();
    o.fix = *fix;
    auto p = searchPlan(k.g, *resolveCluster(k.cluster), CostModel(), o);
    ASSERT_TRUE(p) << p.status().message();
    EXPECT_EQ(p->best.time.host > 0, k.hostBound);
    ASSERT_TRUE(p->simulated) << p->simError;
    // Never optimistic by more than 3%, conservative by at most 10% (the
    // closed form charges the gradient sync and the optimizer after the
    // drain; the replay overlaps them with the other stages' drain).
    const double ratio = p->best.time.total() / p->simulated->stepTime;
    EXPECT_GT(ratio, 0.97);
    EXPECT_LT(ratio, 1.10);
    // The replay issued every compute task on the host lane.
    const bool issued = std::any_of(
        p->simulated->events.begin(), p->simulated->events.end(),
        [](const SimEvent &e) { return e.lane == SimLane::Host; });
    EXPECT_TRUE(issued);
  }
}
/// Plans with `fix` under `o` and expects the analytical step within
/// `rel` of the replay's.
void expectAgreesWithReplay(const GraphSummary &g, const Cluster &c,
                            SearchOptions o, const std::string &fix,
                            double rel) {
  auto p = planWithFix(g, c, std::move(o), fix);
  ASSERT_TRUE(p) << p.status().message();
  ASSERT_TRUE(p->simulated) << p->simError;
  EXPECT_REL(p->best.time.total(), p->simulated->stepTime, rel);
}

/// A bf16 training plan: its cluster, global batch and --fix.
struct ReplayCase {
  const char *cluster;
  int64_t batch;
  const char *fix;
};

/// expectAgreesWithReplay for each case.
template <size_t N>
void expectCasesAgreeWithReplay(const GraphSummary &g,
                                const ReplayCase (&cases)[N], double rel) {
  for (const ReplayCase &k : cases) {
    SCOPED_TRACE(std::string(k.cluster) + " " + k.fix);
    SearchOptions o = opts(k.batch);
    o.training = true;
    o.precision = Precision::BF16;
    expectAgreesWithReplay(g, *resolveCluster(k.cluster), o, k.fix, rel);
  }
}

/// GPipe, 1F1B and zero-bubble on 2 and 4 stages with 1, 2, 4 and 8
/// micro-batches (tp=1, one sample each, dp = 16 / pp) under ZeRO `zero`:
/// each plan's analytical step within `rel` of its replay.
void expectScheduleGridAgreesWithReplay(const GraphSummary &g, const Cluster &c,
                                        int zero, double rel) {
  for (const char *schedule : {"1f1b", "gpipe", "zero-bubble"})
    for (int pp : {2, 4})
      for (int mb : {1, 2, 4, 8}) {
        const std::string f = "tp=1,mbs=1,zero=" + std::to_string(zero) +
                              ",schedule=" + schedule +
                              ",pp=" + std::to_string(pp) +
                              ",mb=" + std::to_string(mb);
        SCOPED_TRACE(f);
        expectAgreesWithReplay(g, c, opts(16 / pp * mb), f, rel);
      }
}

TEST(Search, UnevenPipelinesAgreeWithTheReplay) {
  // GPT-2 small (tied embeddings, 50257-word head) on 2 DGX H100s, tp=1:
  // the split puts most layers and the embedding on stage 0 and fewer with
  // the head on the last, so the stages differ. Every schedule, from one
  // micro-batch to more than pp, ZeRO 0: within 1.5% of the replay (GPipe
  // exact: each stage's gradient sync behind its own last backward, less
  // how much earlier than the last stage to finish it ends; 1F1B and
  // zero-bubble up to 1.2% under). Until 2026-11-30 1F1B and zero-bubble
  // with several micro-batches took the slowest stage's sync, and with
  // the fill and drain from the schedule run on the stages' times (stage
  // 0, with the embedding, is the slowest here) they were 1.6-2.0% under
  // the replay with it. Until 2026-11-29 the closed form
  // priced the slowest stage's sync, and GPipe on 4 stages was 1.4-2.4%
  // under the replay: stage 0, which finishes last, syncs more gradients
  // (the embedding's) behind a shorter backward. Before
  // 2026-11-29 the replay left out the tied embedding's all-reduce between
  // the first and last stages (1F1B and GPipe 2-5% apart), and the
  // zero-bubble bubble scaled the slowest stage's composition by the
  // others' time (8-15% apart with fewer micro-batches than stages).
  expectScheduleGridAgreesWithReplay(gpt(12, 768, 12, 1024, 50257),
                                     *resolveCluster("dgx-h100:2"), 0, 0.015);
}

TEST(Search, ZeroTwoPipelinesQueueEachStagesReduceScatters) {
  // ZeRO 2 reduce-scatters each micro-batch's gradients once its backward
  // (zero-bubble: its weight gradient) ends, on one lane per stage. Since
  // 2026-11-30 the closed form queues them per stage on the ends of the
  // schedule run on the stages' times, as the replay does; it took the
  // slowest stage's queue with backwards assumed evenly spaced, and GPT-3
  // 13B with pp=4 under GPipe was 2.9% under the replay (its first stage,
  // with the embedding's gradients, ends last). GPT-2 small on 2 DGX
  // H100s, its uneven split, dp = 16 / pp: within 2.5% (zero-bubble was
  // 2.1-3.9% under before). What is left, 60-110 us at every micro-batch
  // count, is in this hand-built summary's step after the pipeline, not in
  // the queue, and was there before: dlopt-gen's gpt2-small with zero=2,
  // GPipe, pp=2 agrees with its replay exactly (7.536 ms both).
  expectScheduleGridAgreesWithReplay(gpt(12, 768, 12, 1024, 50257),
                                     *resolveCluster("dgx-h100:2"), 2, 0.025);
}

TEST(Search, InterleavedStagesSyncBehindTheirOwnChunks) {
  // Interleaved, each stage's chunks all-reduce their shares of its own
  // gradients behind its own chunks' backwards, and stage 0 ends last, a
  // chunk's backward after stage 1. GPT-3 6.7B, tp=4 pp=2 v=2 on 16 DGX
  // H100s (dp=16 over the network), two micro-batches: stage 0's chunk
  // backwards hide less of its share than the slowest stage's (the LM
  // head's) would. Until 2026-11-30 the closed form priced the slowest
  // stage's window: with dlopt-gen's gpt3-6.7b 3.8% under the replay (2.5
  // ms of sync exposed where the replay shows 10.5 ms), with this
  // hand-built summary 0.50% (now 0.07%; within 0.25%).
  GraphSummary g = gpt(32, 4096, 32, 2048, 50257);
  const ReplayCase cases[] = {
      {"dgx-h100:16", 64,
       "dp=16,tp=4,pp=2,mbs=2,schedule=interleaved,v=2,mb=2,zero=0,"
       "recompute=none,sp=1"},
      {"dgx-h100:16", 256,
       "dp=16,tp=4,pp=2,mbs=2,schedule=interleaved,v=2,mb=8,zero=0,"
       "recompute=none,sp=1"},
      {"dgx-h100:16", 64,
       "dp=16,tp=4,pp=2,mbs=2,schedule=interleaved,v=2,mb=2,zero=1,"
       "recompute=none,sp=1"},
  };
  expectCasesAgreeWithReplay(g, cases, 0.0025);
}

TEST(Search, ZeroThreePipelinesAgreeWithTheReplay) {
  // GPT-3 175B on 16 DGX H100s, dp=32 pp=4 ZeRO-3, 48 micro-batches: the
  // memory-driven split gives the stages different layer counts (for
  // dlopt-gen's gpt3-175b 20 with the embedding, 26, 26 and 24), and each
  // stage gathers its own layers' parameters behind its own compute.
  // Until 2026-11-29 the closed form took the parameters of the stage with
  // the most memory (there 20 layers and the embedding) over the layers of
  // the slowest (26): gathers of 2.64 GiB a layer instead of 3.38, hidden
  // where the replay's were not, 13% under it (44.5 s against 51.2 s; this
  // test failed).
  GraphSummary g = gpt(96, 12288, 96, 2048, 50257);
  Cluster c = *resolveCluster("dgx-h100:16");
  SearchOptions o = opts(1536);
  o.training = true;
  o.precision = Precision::BF16;
  expectAgreesWithReplay(
      g, c, o, "dp=32,tp=1,pp=4,mbs=1,schedule=1f1b,zero=3,recompute=elementwise",
      0.02);
}

TEST(Search, ZeroThreeExposureFillsThePipeline) {
  // What ZeRO-3's per-layer collectives cannot hide lengthens each pass of
  // the stage that gathers, so the pipeline's fill and drain, which are
  // the other stages' passes, carry it too (the replay adds it to every
  // pass). Until 2026-11-29 the closed form added the slowest stage's
  // exposure m times and priced the fill without it: with few
  // micro-batches and gathers the compute cannot hide, 15-27% under the
  // replay on these GPT-3 6.7B plans (this test failed).
  GraphSummary g = gpt(32, 4096, 32, 2048, 50257);
  const ReplayCase cases[] = {
      {"dgx-h100:8", 4,
       "dp=2,tp=8,pp=4,mbs=2,mb=1,schedule=zero-bubble,zero=3,"
       "recompute=full"},
      {"dgx-a100:16", 16,
       "dp=8,tp=4,pp=4,mbs=2,mb=1,schedule=1f1b,zero=3,recompute=selective,"
       "sp=1"},
      {"dgx-h100:16", 16,
       "dp=2,tp=8,pp=8,mbs=2,mb=4,schedule=1f1b,zero=3,"
       "recompute=elementwise,sp=1"},
      {"dgx-h100:8", 64,
       "dp=32,tp=1,pp=2,mbs=2,mb=1,schedule=gpipe,zero=3,recompute=selective"},
  };
  expectCasesAgreeWithReplay(g, cases, 0.03);
}

TEST(Search, GradientSyncTailsAgreeWithTheReplay) {
  // GPT-3 1.3B. Zero-bubble with one micro-batch syncs each stage's
  // gradients behind that stage's own weight gradient, its last task: the
  // first stage, ending last with the embedding's gradients behind a short
  // weight gradient, sets the exposure (until 2026-11-29 the closed form
  // took the slowest stage's window, the head stage's: 9% under the replay
  // for dlopt-gen's gpt3-1.3b, less for this summary). Sequence
  // parallelism's all-reduce of the weight gradients runs on the compute
  // stream beside the data-parallel sync, so only what outlasts it shows
  // (the closed form had added both: 6.6% over here; this case failed).
  GraphSummary g = gpt(24, 2048, 16, 2048, 50257);
  const ReplayCase cases[] = {
      {"dgx-a100:16", 16,
       "dp=4,tp=8,pp=4,mbs=4,mb=1,schedule=zero-bubble,zero=0,"
       "recompute=elementwise"},
      {"dgx-h100:4", 8, "dp=8,tp=4,pp=1,mbs=1,mb=1,zero=0,sp=1"},
  };
  expectCasesAgreeWithReplay(g, cases, 0.02);
}

TEST(Search, InterleavedPlansAgreeWithTheReplay) {
  // GPT-3 175B on 1024 A100s, tp=8, pp=8, 8 micro-batches of 1: the
  // interleaved plans' sends (pp v - 1 hops each way, less the slack) and
  // per-chunk gradient syncs (each chunk's share after its own last
  // backward), ZeRO 0 and 1: within 2% (1-1.5% above). Before 2026-11-29
  // the closed form was 2-5% under the replay, whose syncs then all waited
  // for the last chunk.
  GraphSummary g = gpt(96, 12288, 96, 2048, 50257);
  Cluster c = *resolveCluster("dgx-a100:128");
  for (int v : {2, 6, 12})
    for (int zero : {0, 1}) {
      SCOPED_TRACE("v=" + std::to_string(v) + " zero=" + std::to_string(zero));
      SearchOptions o = opts(128);
      o.precision = Precision::BF16;
      expectAgreesWithReplay(g, c, o,
                             "tp=8,pp=8,mbs=1,mb=8,schedule=interleaved,v=" +
                                 std::to_string(v) +
                                 ",zero=" + std::to_string(zero),
                             0.02);
    }
}
