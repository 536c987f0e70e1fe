//===- PlanFileTest.cpp - Plan files round trip and reject bad input ------===//
#include "planner/PlanFile.h"
#include "planner/Report.h"

#include "TestUtil.h"

#include <nlohmann/json.hpp>

using namespace dlopt::planner;

namespace {

GraphSummary smallGpt() {
  GraphSummary g;
  g.modelName = "main";
  g.numLayers = 4;
  g.batch = 1;
  g.seq = 1024;
  g.hidden = 1024;
  g.heads = 16;
  g.kvHeads = 16;
  g.headDim = 64;
  g.ffn = 4096;
  g.vocab = 32000;
  g.dtype = "bf16";
  g.dtypeBytes = 2;
  double h = 1024, s = 1024;
  for (int l = 0; l < 4; ++l) {
    OpGroupSummary L;
    L.layer = l;
    L.name = "layer " + std::to_string(l);
    L.matmulFlops = 2 * s * 12 * h * h;
    L.matmulBytes = 2 * (12 * h * h + 16 * s * h);
    L.attentionFlops = 4 * s * s * h;
    L.attentionBytes = 8 * s * h;
    L.otherFlops = 20 * s * h;
    L.otherBytes = 80 * s * h;
    L.params = 12 * h * h + 13 * h;
    L.numOps = 30;
    g.groups.push_back(L);
  }
  g.totalParams = 4 * (12 * h * h + 13 * h) + 32000 * h + s * h + 2 * h;
  return g;
}

std::string planJson(const GraphSummary &g, const Cluster &c) {
  SearchOptions o;
  o.globalBatch = 32;
  auto p = searchPlan(g, c, CostModel(), o);
  EXPECT_TRUE(p) << p.status().message();
  return formatJsonReport(*p, c, g);
}

} // namespace

TEST(PlanFile, RoundTripGivesTheSamePlan) {
  GraphSummary g = smallGpt();
  auto c = resolveCluster("dgx-h100:2");
  ASSERT_TRUE(c);
  std::string text = planJson(g, *c);
  auto lp = parsePlanFile(text, "plan.json");
  ASSERT_TRUE(lp) << lp.status().message();
  EXPECT_TRUE(checkPlanMatchesModel(*lp, g).isOk());
  EXPECT_EQ(lp->cluster.numDevices(), 16);
  EXPECT_EQ(lp->cluster.groups[0].host.memoryBytes,
            c->groups[0].host.memoryBytes);
  SearchOptions o;
  o.globalBatch = lp->globalBatch;
  o.fix = lp->fix;
  auto again = searchPlan(g, lp->cluster, CostModel(), o);
  ASSERT_TRUE(again) << again.status().message();
  EXPECT_EQ(again->stats.enumerated, 1);
  auto first = nlohmann::json::parse(text);
  auto second = nlohmann::json::parse(formatJsonReport(*again, lp->cluster, g));
  EXPECT_EQ(first["config"], second["config"]);
  EXPECT_EQ(first["step_time"], second["step_time"]);
  EXPECT_EQ(first["memory"], second["memory"]);
  EXPECT_EQ(first["ranks"], second["ranks"]);
}

TEST(PlanFile, RejectsBadFiles) {
  GraphSummary g = smallGpt();
  auto c = resolveCluster("dgx-a100:1");
  ASSERT_TRUE(c);
  auto good = nlohmann::json::parse(planJson(g, *c));
  auto expectError = [&](nlohmann::json j, const std::string &needle) {
    auto lp = parsePlanFile(j.dump(), "p.json");
    ASSERT_FALSE(lp) << "accepted a plan that should fail with: " << needle;
    EXPECT_NE(lp.status().message().find(needle), std::string::npos)
        << lp.status().message();
  };
  auto j = good;
  j["format"] = "other";
  expectError(j, "format: expected \"dlopt-plan\"");
  j = good;
  j["version"] = 7;
  expectError(j, "got version 7");
  j = good;
  j["config"].erase("schedule");
  expectError(j, "config: missing required field 'schedule'");
  j = good;
  j["config"]["schedule"] = "sideways";
  expectError(j, "config.schedule: unknown schedule");
  j = good;
  j["config"]["zero_stage"] = 5;
  expectError(j, "config.zero_stage: expected 0 to 3");
  j = good;
  j["config"]["tp"] = "8";
  expectError(j, "config.tp: expected an integer");
  j = good;
  j["cluster"]["definition"]["nodes"][0]["gpu"]["memory_gb"] = -1;
  expectError(j, "cluster.definition");
  j = good;
  j["cluster"]["devices"] = 9;
  expectError(j, "cluster.devices: 9 devices");
  EXPECT_FALSE(parsePlanFile("{", "p.json"));
  EXPECT_FALSE(parsePlanFile("[]", "p.json"));
  EXPECT_FALSE(loadPlanFile("/nonexistent/plan.json"));
}

TEST(PlanFile, DetectsAnotherModel) {
  GraphSummary g = smallGpt();
  auto c = resolveCluster("dgx-a100:1");
  ASSERT_TRUE(c);
  auto lp = parsePlanFile(planJson(g, *c), "p.json");
  ASSERT_TRUE(lp);
  GraphSummary other = g;
  other.hidden = 2048;
  Status st = checkPlanMatchesModel(*lp, other);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("hidden 1024 in the plan, 2048 in the model"),
            std::string::npos)
      << st.message();
}

TEST(PlanFile, KindsAndVersions) {
  GraphSummary g = smallGpt();
  auto c = resolveCluster("dgx-a100:1");
  ASSERT_TRUE(c);
  auto good = nlohmann::json::parse(planJson(g, *c));
  EXPECT_EQ(good["kind"], "transformer");
  EXPECT_EQ(good["version"], planFileVersion(PlanKind::Transformer));
  auto lp = parsePlanFile(good.dump(), "p.json");
  ASSERT_TRUE(lp) << lp.status().message();
  EXPECT_EQ(lp->kind, PlanKind::Transformer);
  // Version-2 files written before "kind" existed are transformer plans.
  auto j = good;
  j.erase("kind");
  lp = parsePlanFile(j.dump(), "p.json");
  ASSERT_TRUE(lp) << lp.status().message();
  EXPECT_EQ(lp->kind, PlanKind::Transformer);
  j = good;
  j["version"] = 1;
  lp = parsePlanFile(j.dump(), "p.json");
  ASSERT_FALSE(lp);
  EXPECT_NE(lp.status().message().find(
                "version: this dlopt reads transformer plan files of version "
                "2, got version 1"),
            std::string::npos)
      << lp.status().message();
  // A transformer plan body under the op-level kind: the op-level fields
  // are missing, and the error names the first.
  j = good;
  j["kind"] = "op-level";
  j["version"] = planFileVersion(PlanKind::OpLevel);
  lp = parsePlanFile(j.dump(), "p.json");
  ASSERT_FALSE(lp);
  EXPECT_NE(lp.status().message().find("model: missing required field 'ops'"),
            std::string::npos)
      << lp.status().message();
}
