//===- MeshTest.cpp - The device mesh and its rank geometry ---------------===//
#include "planner/Cluster.h"
#include "planner/Mesh.h"
#include "planner/Report.h"

#include <gtest/gtest.h>

#include <set>

using namespace dlopt::planner;

TEST(Mesh, StandardOrderIsTheRankFormula) {
  // rank = ((stage*dp + dp_index)*cp + cp_index)*tp + tp_index
  Mesh m = Mesh::standard(/*pp=*/2, /*dp=*/3, /*cp=*/2, /*tp=*/4);
  EXPECT_EQ(m.numDevices(), 48);
  for (int r = 0; r < m.numDevices(); ++r) {
    RankCoords c = rankCoords(m, r);
    EXPECT_EQ(((c.stage * 3 + c.dp) * 2 + c.cp) * 4 + c.tp, r);
    EXPECT_EQ(m.linearRank(m.coords(r)), r);
  }
  EXPECT_EQ(m.coords(29), (std::vector<int>{1, 0, 1, 1}));
  EXPECT_EQ(m.coord(29, "tp"), 1);
  EXPECT_EQ(m.coord(29, "nope"), 0);
  EXPECT_EQ(m.size("cp"), 2);
  EXPECT_EQ(m.size("ep"), 1);
  EXPECT_EQ(m.str(), "pp=2 dp=3 cp=2 tp=4");
  EXPECT_EQ(m.rankFormula(),
            "rank = ((pp_index*dp + dp_index)*cp + cp_index)*tp + tp_index");
}

TEST(Mesh, AgreesWithTheConfigWrapper) {
  TrainingConfig cfg;
  cfg.pp = 2;
  cfg.dp = 2;
  cfg.cp = 1;
  cfg.tp = 2;
  for (int r = 0; r < 8; ++r) {
    RankCoords a = rankCoords(cfg, r);
    RankCoords b = rankCoords(meshOf(cfg), r);
    EXPECT_EQ(a.stage, b.stage);
    EXPECT_EQ(a.dp, b.dp);
    EXPECT_EQ(a.cp, b.cp);
    EXPECT_EQ(a.tp, b.tp);
  }
  cfg.cp = 0; // unset cp counts as 1
  EXPECT_EQ(meshOf(cfg).numDevices(), 8);
}

TEST(Mesh, Groups) {
  Mesh m = Mesh::standard(2, 2, 1, 2);
  // tp groups are adjacent pairs.
  EXPECT_EQ(m.group(5, {"tp"}), (std::vector<int>{4, 5}));
  // dp groups stride over tp * cp.
  EXPECT_EQ(m.group(5, {"dp"}), (std::vector<int>{5, 7}));
  // pp groups stride over dp * cp * tp.
  EXPECT_EQ(m.group(1, {"pp"}), (std::vector<int>{1, 5}));
  // Over two axes, the first listed is major.
  EXPECT_EQ(m.group(0, {"dp", "tp"}), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(m.group(0, {"tp", "dp"}), (std::vector<int>{0, 2, 1, 3}));
  // An axis of size 1 or an unknown one adds nothing.
  EXPECT_EQ(m.group(6, {"cp"}), (std::vector<int>{6}));
  EXPECT_EQ(m.group(6, {"ep"}), (std::vector<int>{6}));
  EXPECT_EQ(m.group(6, {}), (std::vector<int>{6}));
  // All groups partition the ranks.
  auto dp = m.groups({"dp"});
  ASSERT_EQ(dp.size(), 4u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 3}));
  EXPECT_EQ(dp[2], (std::vector<int>{4, 6}));
  EXPECT_EQ(dp[3], (std::vector<int>{5, 7}));
  for (const auto &axes : std::vector<std::vector<std::string>>{
           {"tp"}, {"dp", "cp"}, {"pp"}, {"pp", "dp", "cp", "tp"}}) {
    std::set<int> seen;
    size_t total = 0;
    for (const auto &g : m.groups(axes)) {
      total += g.size();
      seen.insert(g.begin(), g.end());
      // Every member's own group is this group.
      for (int r : g)
        EXPECT_EQ(m.group(r, axes), g);
    }
    EXPECT_EQ(total, 8u);
    EXPECT_EQ(seen.size(), 8u);
  }
}

TEST(Mesh, MakeChecksAxes) {
  EXPECT_TRUE(Mesh::make({{"pp", 1}, {"tp", 8}}));
  EXPECT_FALSE(Mesh::make({}));
  auto dup = Mesh::make({{"tp", 2}, {"tp", 2}});
  ASSERT_FALSE(dup);
  EXPECT_NE(dup.status().message().find("'tp' appears twice"),
            std::string::npos);
  EXPECT_FALSE(Mesh::make({{"", 2}}));
  EXPECT_FALSE(Mesh::make({{"dp", 0}}));
  EXPECT_FALSE(Mesh::make({{"a", 65536}, {"b", 65536}}));
}

TEST(Mesh, ProcessOfFollowsTheLayout) {
  auto c = resolveCluster("dgx-a100:2");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(processOf(*c, ProcessLayout::BetweenGraph, 9), 9);
  EXPECT_EQ(processOf(*c, ProcessLayout::InGraph, 9), 1);
  EXPECT_EQ(processOf(*c, ProcessLayout::InGraph, 7), 0);
}
