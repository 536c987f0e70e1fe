//===- PlanTest.cpp - The plan: lookups, JSON round trip, bad files -------===//
#include "planner/Plan.h"
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

TEST(Plan, RoundTripGivesTheSamePlan) {
  GraphSummary g = smallGpt();
  auto c = resolveCluster("dgx-h100:2");
  ASSERT_TRUE(c);
  std::string text = planJson(g, *c);
  auto lp = Plan::parse(text, "plan.json");
  ASSERT_TRUE(lp) << lp.status().message();
  EXPECT_TRUE(checkPlanMatchesModel(*lp, g).isOk());
  EXPECT_EQ(lp->cluster.numDevices(), 16);
  EXPECT_EQ(lp->mesh.numDevices(), 16);
  EXPECT_EQ(lp->cluster.groups[0].host.memoryBytes,
            c->groups[0].host.memoryBytes);
  SearchOptions o;
  o.globalBatch = lp->globalBatch;
  o.fix = fixSpecOf(*lp);
  auto again = searchPlan(g, lp->cluster, CostModel(), o);
  ASSERT_TRUE(again) << again.status().message();
  EXPECT_EQ(again->stats.enumerated, 1);
  EXPECT_EQ(comparePlans(*lp, again->plan), "");
  auto first = nlohmann::json::parse(text);
  auto second = nlohmann::json::parse(formatJsonReport(*again, lp->cluster, g));
  for (const char *k : {"mesh", "config", "args", "ops", "model", "cluster"})
    EXPECT_EQ(first[k], second[k]) << k;
  EXPECT_EQ(first["report"]["step_time"], second["report"]["step_time"]);
  EXPECT_EQ(first["report"]["memory"], second["report"]["memory"]);
  EXPECT_EQ(first["report"]["ranks"], second["report"]["ranks"]);
  // The plan part alone is Plan::toJson, and parses to the same plan.
  auto plain = nlohmann::json::parse(lp->toJson());
  EXPECT_FALSE(plain.contains("report"));
  auto back = Plan::parse(lp->toJson(), "again.json");
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->toJson(), lp->toJson());
}

TEST(Plan, RejectsBadFiles) {
  GraphSummary g = smallGpt();
  auto c = resolveCluster("dgx-a100:1");
  ASSERT_TRUE(c);
  auto good = nlohmann::json::parse(planJson(g, *c));
  auto expectError = [&](nlohmann::json j, const std::string &needle) {
    auto lp = Plan::parse(j.dump(), "p.json");
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
  j["config"]["micro_batch_size"] = "8";
  expectError(j, "config.micro_batch_size: expected an integer");
  j = good;
  j["config"]["sequence_parallel"] = 1;
  expectError(j, "config.sequence_parallel: expected true or false");
  j = good;
  j["mesh"]["shape"][3] = 3;
  expectError(j, "mesh: pp*dp*cp*tp = ");
  j = good;
  j["mesh"]["shape"][0] = 0;
  expectError(j, "mesh.shape[0]: expected an integer >= 1");
  j = good;
  j["mesh"]["axes"] = {"tp", "dp", "cp", "pp"};
  expectError(j, "mesh.axes: expected [\"pp\", \"dp\", \"cp\", \"tp\"]");
  j = good;
  j["mesh"]["shape"] = {1, 1, 8};
  expectError(j, "mesh.shape: 3 sizes for 4 axes");
  j = good;
  j["global_batch"] = j["global_batch"].get<int>() * 2;
  expectError(j, "config: dp*micro_batch_size*num_micro_batches = ");
  j = good;
  j["cluster"]["definition"]["nodes"][0]["gpu"]["memory_gb"] = -1;
  expectError(j, "cluster.definition");
  j = good;
  j["cluster"]["devices"] = 9;
  expectError(j, "cluster.devices: 9 devices");
  // (The hand-built graph has no args: give the plan two.)
  good["args"] = nlohmann::json::parse(
      R"([{"name": "w", "role": "param",
           "sharding": {"split": [["tp"], []], "partial": []}},
          {"name": "x", "role": "input",
           "sharding": {"split": [["dp"], []], "partial": []}}])");
  ASSERT_TRUE(Plan::parse(good.dump(), "p.json"));
  j = good;
  j["args"][0]["sharding"]["split"][0] = {"ep"};
  expectError(j, "args[0].sharding.split[0]: unknown mesh axis \"ep\"");
  j = good;
  j["args"][0]["sharding"]["split"][0] = {"tp"};
  j["args"][0]["sharding"]["partial"] = {"tp"};
  expectError(j, "args[0].sharding.partial: mesh axis \"tp\" is used twice");
  j = good;
  j["args"][0]["role"] = "weight";
  expectError(j, "args[0].role: expected \"param\"");
  j = good;
  j["args"][1]["name"] = j["args"][0]["name"];
  expectError(j, "args[1].name: argument ");
  EXPECT_FALSE(Plan::parse("{", "p.json"));
  EXPECT_FALSE(Plan::parse("[]", "p.json"));
  EXPECT_FALSE(Plan::load("/nonexistent/plan.json"));
}

TEST(Plan, DetectsAnotherModel) {
  GraphSummary g = smallGpt();
  auto c = resolveCluster("dgx-a100:1");
  ASSERT_TRUE(c);
  auto lp = Plan::parse(planJson(g, *c), "p.json");
  ASSERT_TRUE(lp);
  GraphSummary other = g;
  other.hidden = 2048;
  Status st = checkPlanMatchesModel(*lp, other);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("hidden 1024 in the plan, 2048 in the model"),
            std::string::npos)
      << st.message();
}

TEST(Plan, KindsAndVersions) {
  GraphSummary g = smallGpt();
  auto c = resolveCluster("dgx-a100:1");
  ASSERT_TRUE(c);
  auto good = nlohmann::json::parse(planJson(g, *c));
  EXPECT_EQ(good["kind"], "transformer");
  EXPECT_EQ(good["version"], kPlanFileVersion);
  auto lp = Plan::parse(good.dump(), "p.json");
  ASSERT_TRUE(lp) << lp.status().message();
  EXPECT_EQ(lp->kind, PlanKind::Transformer);
  // Every plan file names its kind.
  auto j = good;
  j.erase("kind");
  lp = Plan::parse(j.dump(), "p.json");
  ASSERT_FALSE(lp);
  EXPECT_NE(lp.status().message().find("missing required field 'kind'"),
            std::string::npos)
      << lp.status().message();
  // Version 2 (transformer) and 1 (op-level) files are refused.
  j = good;
  j["version"] = 2;
  lp = Plan::parse(j.dump(), "p.json");
  ASSERT_FALSE(lp);
  EXPECT_NE(lp.status().message().find(
                "version: this dlopt reads plan files of version 3, got "
                "version 2"),
            std::string::npos)
      << lp.status().message();
  // The report is not read: anything may stand there.
  j = good;
  j["report"] = "not an object";
  EXPECT_TRUE(Plan::parse(j.dump(), "p.json"));
}

TEST(Plan, ShardingsAndLookups) {
  Sharding s = Sharding::replicated(3);
  EXPECT_TRUE(s.isReplicated());
  EXPECT_EQ(s.str(), "[-, -, -]");
  s.split[0] = {"dp"};
  s.split[1] = {"cp", "tp"};
  s.partial = {"pp"};
  EXPECT_FALSE(s.isReplicated());
  EXPECT_EQ(s.str(), "[dp, cp.tp, -] partial(pp)");
  EXPECT_EQ(s.dimOf("tp"), 1);
  EXPECT_EQ(s.dimOf("ep"), -1);
  EXPECT_TRUE(s.uses("pp"));
  EXPECT_EQ(Sharding::replicated(0).str(), "[]");

  Plan p;
  p.mesh = Mesh::standard(2, 1, 1, 2);
  p.ops.push_back({3, "dlopt.matmul", 0, "column", {}, {s}});
  p.ops.push_back({7, "dlopt.add", 1, "elementwise", {}, {}});
  p.args.push_back({"w", ArgNode::Role::Param, Sharding::replicated(2)});
  ASSERT_TRUE(p.op(3));
  EXPECT_EQ(p.op(3)->strategy, "column");
  EXPECT_FALSE(p.op(4));
  ASSERT_TRUE(p.resultSharding(3));
  EXPECT_EQ(*p.resultSharding(3), s);
  EXPECT_FALSE(p.resultSharding(3, 1));
  EXPECT_FALSE(p.resultSharding(7));
  EXPECT_EQ(p.stageOf(7), 1);
  EXPECT_FALSE(p.stageOf(8));
  ASSERT_TRUE(p.argSharding("w"));
  EXPECT_FALSE(p.argSharding("x"));
  EXPECT_EQ(p.tp(), 2);
  EXPECT_EQ(p.pp(), 2);
  EXPECT_EQ(p.cp(), 1);

  // Differences are reported op by op.
  Plan q = p;
  q.ops[0].results[0].partial.clear();
  std::string diff = comparePlans(p, q);
  EXPECT_NE(diff.find("differs from the plan file in 1 place (#3 dlopt.matmul: "
                      "results ([dp, cp.tp, -] partial(pp)) in the plan, "
                      "([dp, cp.tp, -]) now)"),
            std::string::npos)
      << diff;
  EXPECT_EQ(comparePlans(p, p), "");
}
