//===- NcclTestsTest.cpp - nccl-tests' output and measured collectives ----===//
//
// parseNcclTests against the fixtures of test/tools/dlopt-calibrate/Inputs
// and hand-written outputs, the collective_table's JSON, and the cost
// model's pricing from it (CostModel::measured), hand-computed.
//
//===----------------------------------------------------------------------===//
#include "planner/NcclTests.h"
#include "planner/CostModel.h"
#include "runtime/support/FileRead.h"
#include "test/unit/planner/TestUtil.h"

#include <gtest/gtest.h>

#include <string>

using namespace dlopt::planner;

namespace {

std::string fixture(const std::string &name) {
  auto t = dlopt::rt::readTextFileLimited(
      std::string(DLOPT_SOURCE_DIR) + "/test/tools/dlopt-calibrate/Inputs/" +
          name,
      "fixture");
  EXPECT_TRUE(t) << t.status().message();
  return t ? *t : std::string();
}

/// An nccl-tests output of `prog` over the hosts' ranks (one line per
/// rank), with `rows` as printed.
std::string output(const std::string &prog,
                   const std::vector<std::pair<std::string, int>> &hosts,
                   const std::string &rows) {
  std::string s = "# nccl-tests version 2.17.6\n";
  if (!prog.empty())
    s += "# Collective test starting: " + prog + "\n";
  s += "# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor)\n"
       "#\n# Using devices\n";
  int r = 0;
  for (const auto &[host, n] : hosts)
    for (int d = 0; d < n; ++d, ++r)
      s += "#  Rank " + std::to_string(r) + " Group  0 Pid 1 on " + host +
           " device " + std::to_string(d) + " [0000:01:00] NVIDIA H100\n";
  s += "#       size   count  type redop root  time algbw busbw #wrong  time "
       "algbw busbw #wrong\n";
  return s + rows;
}

// 2 nodes x 4 ranks, reduce_scatter: busbw = algbw * 7/8.
const char *kRsRows =
    "1048576 32768 float sum -1 100.0 10.49 9.18 0 101.0 10.38 9.08 0\n"
    "4194304 131072 float sum -1 200.0 20.97 18.35 N/A 201.0 20.87 18.26 N/A\n";

TEST(NcclTests, ReadsAPublishedSweep) {
  auto s = parseNcclTests(fixture("h100-all_reduce.txt"), "h100");
  ASSERT_TRUE(s) << s.status().message();
  ASSERT_EQ(s->size(), 1u);
  const NcclTestsSweep &w = s->front();
  EXPECT_EQ(w.collective, Collective::AllReduce);
  EXPECT_EQ(w.ranks, 8);
  EXPECT_EQ(w.nodes, 1);
  EXPECT_EQ(w.ranksPerNode, 8);
  EXPECT_EQ(w.device, "NVIDIA H100 80GB HBM3");
  ASSERT_EQ(w.rows.size(), 6u);
  // 1 MiB at 67.0 GB/s bus bandwidth: 2^20 x 1.75 / 67e9 s, as printed
  // (two decimals of us).
  EXPECT_EQ(w.rows[0].bytes, 1048576);
  EXPECT_NEAR(w.rows[0].seconds, 1048576 * 1.75 / 67.0e9, 0.006e-6);
  EXPECT_EQ(w.rows[5].bytes, 1073741824);
  EXPECT_NEAR(w.rows[5].seconds, 1073741824 * 1.75 / 466.3e9, 0.006e-6);
  for (const CollectiveTableRow &r : w.rows) {
    EXPECT_EQ(r.ranks, 8);
    EXPECT_EQ(r.collective, Collective::AllReduce);
  }
}

TEST(NcclTests, NodesAndRanksANodeFromTheRankList) {
  auto s = parseNcclTests(
      output("reduce_scatter_perf", {{"a", 4}, {"b", 4}}, kRsRows), "rs");
  ASSERT_TRUE(s) << s.status().message();
  ASSERT_EQ(s->size(), 1u);
  EXPECT_EQ((*s)[0].collective, Collective::ReduceScatter);
  EXPECT_EQ((*s)[0].ranks, 8);
  EXPECT_EQ((*s)[0].nodes, 2);
  EXPECT_EQ((*s)[0].ranksPerNode, 4);
  ASSERT_EQ((*s)[0].rows.size(), 2u);
  EXPECT_DOUBLE_EQ((*s)[0].rows[1].seconds, 200e-6); // out-of-place
  // Uneven: 5 and 3 ranks.
  auto u = parseNcclTests(
      output("reduce_scatter_perf", {{"a", 5}, {"b", 3}}, kRsRows), "rs");
  ASSERT_TRUE(u) << u.status().message();
  EXPECT_EQ((*u)[0].ranksPerNode, 5);
  // Two tests in one file, and launcher noise between the lines.
  auto two = parseNcclTests(
      output("reduce_scatter_perf", {{"a", 4}, {"b", 4}}, kRsRows) +
          "# Collective test concluded: reduce_scatter_perf\n"
          "[host:123] 15 more processes have sent help message\n" +
          output("all_gather_perf", {{"a", 2}},
                 "65536 8192 float none -1 10.00 6.55 3.28 0 "
                 "10.0 6.55 3.28 0\n"),
      "two");
  ASSERT_TRUE(two) << two.status().message();
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[1].collective, Collective::AllGather);
  EXPECT_EQ((*two)[1].ranks, 2);
}

TEST(NcclTests, TheCollectiveFromTheFileNameWithoutAHeader) {
  const std::string text = fixture("a100-all_reduce.txt");
  auto none = parseNcclTests(text, "a100");
  ASSERT_FALSE(none);
  EXPECT_NE(none.status().message().find("which collective"), std::string::npos)
      << none.status().message();
  EXPECT_NE(none.status().message().find("all_reduce=FILE"), std::string::npos);
  auto named = collectiveOfNcclTestsName("logs/a100-all_reduce.txt");
  ASSERT_TRUE(named);
  EXPECT_EQ(*named, Collective::AllReduce);
  auto s = parseNcclTests(text, "a100", named);
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ((*s)[0].rows.size(), 6u);
  EXPECT_EQ((*s)[0].device, "NVIDIA A100-SXM4-40GB");
  // Named as the wrong collective, the bus bandwidth gives it away.
  auto wrong = parseNcclTests(text, "a100", Collective::AllGather);
  ASSERT_FALSE(wrong);
  EXPECT_NE(wrong.status().message().find("busbw / algbw is 1.75"),
            std::string::npos)
      << wrong.status().message();
  EXPECT_NE(wrong.status().message().find("expected 0.875"), std::string::npos);
}

TEST(NcclTests, CollectiveOfAName) {
  EXPECT_EQ(collectiveOfNcclTestsName("all_gather_perf.log"),
            Collective::AllGather);
  EXPECT_EQ(collectiveOfNcclTestsName("AllReduce-16n.txt"),
            Collective::AllReduce);
  EXPECT_EQ(collectiveOfNcclTestsName("/x/alltoall/rs-reduce_scatter.log"),
            Collective::ReduceScatter); // the base name only
  EXPECT_EQ(collectiveOfNcclTestsName("alltoall_perf"), Collective::AllToAll);
  EXPECT_EQ(collectiveOfNcclTestsName("broadcast.out"), Collective::Broadcast);
  EXPECT_FALSE(collectiveOfNcclTestsName("nccl.log"));
  EXPECT_FALSE(collectiveOfNcclTestsName("all_reduce_vs_all_gather.log"));
}

TEST(NcclTests, RefusesWhatIsNotAMeasurement) {
  struct Case {
    std::string text, message;
  };
  const std::string dupRank =
      "# nThread 1 nGpus 1\n"
      "#  Rank  0 Group  0 Pid 1 on a device  0 [0] NVIDIA H100\n"
      "#  Rank  0 Group  0 Pid 2 on a device  1 [0] NVIDIA H100\n";
  const Case cases[] = {
      {"", "no nccl-tests output found"},
      {"some log\nwithout results\n", "no nccl-tests output found"},
      {dupRank, "rank 0 is listed twice"},
      {output("reduce_perf", {{"a", 2}}, ""), "'reduce_perf' measures no "
                                              "collective"},
      {output("all_reduce_perf", {{"a", 2}}, ""), "has no result rows"},
      {output("all_reduce_perf", {{"a", 1}},
              "1024 256 float sum -1 10.0 0.10 0.00 0 10.0 0.10 0.00 0\n"),
       "over one rank"},
      {output("all_reduce_perf", {{"a", 2}},
              "1024 256 float sum -1 10.0 0.10 0.10 3 10.0 0.10 0.10 0\n"),
       "counted 3 wrong values"},
      {output("all_reduce_perf", {{"a", 2}},
              "1024 256 float sum -1 abc 0.10 0.10 0 10.0 0.10 0.10 0\n"),
       "expected numbers for size, time"},
      {output("all_reduce_perf", {{"a", 2}}, "1024 256 float sum -1 10.0\n"),
       "expected 'size count type"},
      {output("all_reduce_perf", {{"a", 2}},
              "1024 256 float sum -1 0 0.10 0.10 0 10.0 0.10 0.10 0\n"),
       "expected a time > 0"},
      {output("all_reduce_perf", {{"a", 2}},
              "1024 256 float sum -1 10.0 0.10 0.10 0 10.0 0.10 0.10 0\n"
              "1024 256 float sum -1 11.0 0.09 0.09 0 10.0 0.10 0.10 0\n"),
       "size 1024 appears twice"},
      // algbw is not size / time: the columns are shifted.
      {output("all_reduce_perf", {{"a", 2}},
              "1048576 262144 float sum -1 100.0 5.00 5.00 0 100 5 5 0\n"),
       "is not size / time"},
      {output("all_reduce_perf", {{"a", 2}},
              "1024 256 float sum -1 10.0 0.10 0.10 0 10.0 0.10 0.10 0\n"
              "# Out of bounds values : 4 FAILED\n"),
       "reports wrong values"},
      {"1024 256 float sum -1 10.0 0.10 0.10 0 10.0 0.10 0.10 0\n",
       "before the test's header"},
      {"# nThread 1\n1024 256 float sum -1 10.0 0.10 0.10 0\n",
       "before the test's rank list"},
      {"# nThread 1\n#  Rank 0 Group 0 Pid 1 on a device 0 [0] X\n"
       "#  Rank 2 Group 0 Pid 1 on a device 1 [0] X\n"
       "# Collective test starting: all_reduce_perf\n",
       "has no result rows"},
      {"# Collective test starting: all_reduce_perf\n# nThread 1\n"
       "#  Rank 0 Group 0 Pid 1 on a device 0 [0] X\n"
       "#  Rank 2 Group 0 Pid 1 on a device 1 [0] X\n"
       "1024 256 float sum -1 10.0 0.10 0.10 0 10.0 0.10 0.10 0\n",
       "expected ranks 0 to 1, got rank 2"},
      {"# nThread 1\n#  Rank 0 Group 0 Pid 1\n", "expected '# Rank N ... on "
                                                 "HOST"},
  };
  for (const Case &c : cases) {
    auto s = parseNcclTests(c.text, "f.log");
    ASSERT_FALSE(s) << c.text;
    EXPECT_NE(s.status().message().find(c.message), std::string::npos)
        << "got: " << s.status().message() << "\nwant: " << c.message;
    EXPECT_EQ(s.status().message().rfind("f.log", 0), 0u)
        << s.status().message();
  }
}

// collective_table in a calibration file.
TEST(NcclTests, CollectiveTableJson) {
  Calibration c;
  c.collectiveTable = {
      {Collective::AllReduce, 8, 1, 8, 1048576, 27.39e-6},
      {Collective::ReduceScatter, 16, 2, 8, 4096, 40e-6},
  };
  ASSERT_TRUE(c.validate().isOk());
  auto back = parseCalibration(c.toJson(), "rt");
  ASSERT_TRUE(back) << back.status().message();
  ASSERT_EQ(back->collectiveTable.size(), 2u);
  const CollectiveTableRow &r = back->collectiveTable[1];
  EXPECT_EQ(r.collective, Collective::ReduceScatter);
  EXPECT_EQ(r.ranks, 16);
  EXPECT_EQ(r.nodes, 2);
  EXPECT_EQ(r.ranksPerNode, 8);
  EXPECT_EQ(r.bytes, 4096);
  EXPECT_DOUBLE_EQ(r.seconds, 40e-6);

  auto row = [](const std::string &fields) {
    return "{\"collective_table\": [{" + fields + "}]}";
  };
  const std::string ok =
      "\"collective\": \"all_reduce\", \"ranks\": 8, \"nodes\": 1, "
      "\"ranks_per_node\": 8, \"bytes\": 1024, \"us\": 10";
  ASSERT_TRUE(parseCalibration(row(ok), "f"));
  const std::pair<std::string, std::string> bad[] = {
      {"{\"collective_table\": 3}", "expected an array"},
      {"{\"collective_table\": [3]}", "row 0: expected an object"},
      {row(ok + ", \"busbw\": 3"), "unknown field 'busbw'"},
      {row("\"collective\": \"send_recv\", \"ranks\": 2, \"nodes\": 1, "
           "\"ranks_per_node\": 2, \"bytes\": 1, \"us\": 1"),
       "collective: expected all_reduce"},
      {row("\"ranks\": 8, \"nodes\": 1, \"ranks_per_node\": 8, \"bytes\": "
           "1, \"us\": 1"),
       "expected 'collective'"},
      {row("\"collective\": \"all_reduce\", \"ranks\": 1, \"nodes\": 1, "
           "\"ranks_per_node\": 1, \"bytes\": 1, \"us\": 1"),
       "expected ranks in [2, 2^20], got 1"},
      {row("\"collective\": \"all_reduce\", \"ranks\": 8.5, \"nodes\": 1, "
           "\"ranks_per_node\": 8, \"bytes\": 1, \"us\": 1"),
       "ranks: expected a whole number"},
      {row("\"collective\": \"all_reduce\", \"ranks\": 8, \"nodes\": 9, "
           "\"ranks_per_node\": 1, \"bytes\": 1, \"us\": 1"),
       "expected nodes in [1, ranks=8], got 9"},
      {row("\"collective\": \"all_reduce\", \"ranks\": 8, \"nodes\": 2, "
           "\"ranks_per_node\": 3, \"bytes\": 1, \"us\": 1"),
       "ranks_per_node 3 cannot place 8 ranks on 2 nodes"},
      {row("\"collective\": \"all_reduce\", \"ranks\": 8, \"nodes\": 2, "
           "\"ranks_per_node\": 8, \"bytes\": 1, \"us\": 1"),
       "ranks_per_node 8 cannot place"},
      {row("\"collective\": \"all_reduce\", \"ranks\": 8, \"nodes\": 1, "
           "\"ranks_per_node\": 8, \"bytes\": 1.5, \"us\": 1"),
       "expected bytes a whole number"},
      {row("\"collective\": \"all_reduce\", \"ranks\": 8, \"nodes\": 1, "
           "\"ranks_per_node\": 8, \"bytes\": 1, \"us\": 0"),
       "expected us in (0, 1e9]"},
      {row("\"collective\": \"all_reduce\", \"ranks\": 8, \"nodes\": 1, "
           "\"ranks_per_node\": 8, \"bytes\": 1, \"us\": \"3\""),
       "us: expected a number"},
      {"{\"collective_table\": [{" + ok + "}, {" + ok + "}]}",
       "row 1: all_reduce over 8 ranks (1 nodes, 8 a node) at 1024 bytes "
       "appears twice"},
  };
  for (const auto &[text, message] : bad) {
    auto p = parseCalibration(text, "f");
    ASSERT_FALSE(p) << text;
    EXPECT_NE(p.status().message().find(message), std::string::npos)
        << "got: " << p.status().message() << "\nwant: " << message;
  }
}

struct Measured : ::testing::Test {
  void SetUp() override {
    auto c = resolveCluster("dgx-h100:2");
    ASSERT_TRUE(c);
    cluster = *c;
    Calibration cal;
    // 8 ranks of one node: 100 us at 1 MiB, 150 at 4 MiB, 120 at 16 MiB
    // (4 MiB then costs 120: a message never costs more than a larger
    // one), 600 at 64 MiB.
    const double mib = 1048576;
    for (auto [mb, us] :
         {std::pair{1.0, 100.0}, {16.0, 120.0}, {4.0, 150.0}, {64.0, 600.0}})
      cal.collectiveTable.push_back(
          {Collective::AllReduce, 8, 1, 8, mb * mib, us * 1e-6});
    // 2 ranks on 2 nodes (one a node).
    cal.collectiveTable.push_back(
        {Collective::AllGather, 2, 2, 1, 8 * mib, 500e-6});
    model = CostModel(cal);
  }
  CommGroup group(int size, int stride) {
    auto g = cluster.stridedGroup(size, stride);
    EXPECT_TRUE(g) << g.status().message();
    return *g;
  }
  Cluster cluster;
  CostModel model;
};

TEST_F(Measured, InterpolatedInBytesWhereTheGroupWasMeasured) {
  const double mib = 1048576;
  const CommGroup tp = group(8, 1);
  auto at = [&](double bytes) {
    auto e = model.commTime(Collective::AllReduce, bytes, tp);
    EXPECT_TRUE(e) << e.status().message();
    EXPECT_EQ(e->algorithm, CommAlgorithm::Measured);
    EXPECT_EQ(e->protocol, CommProtocol::None);
    EXPECT_EQ(e->link, LinkKind::IntraNode);
    EXPECT_NEAR(e->latencyTerm + e->bandwidthTerm, e->time, 1e-15);
    return e->time;
  };
  EXPECT_NEAR(at(1 * mib), 100e-6, 1e-12);
  EXPECT_NEAR(at(0.25 * mib), 100e-6, 1e-12); // below: the smallest's
  EXPECT_NEAR(at(4 * mib), 120e-6, 1e-12);    // the larger size's 120
  EXPECT_NEAR(at(2.5 * mib), 110e-6, 1e-12);  // halfway 1 -> 4 MiB
  EXPECT_NEAR(at(40 * mib), 360e-6, 1e-12);   // halfway 16 -> 64 MiB
  EXPECT_NEAR(at(128 * mib), 1200e-6, 1e-12); // 64 MiB's bandwidth
  auto big = model.commTime(Collective::AllReduce, 128 * mib, tp);
  EXPECT_NEAR(big->latencyTerm, 100e-6, 1e-12); // the smallest's time
  // Asked for by name it is the same; the model's ring is still there.
  auto named = model.commTime(Collective::AllReduce, 2.5 * mib, tp,
                              CommAlgorithm::Measured);
  ASSERT_TRUE(named);
  EXPECT_NEAR(named->time, 110e-6, 1e-12);
  auto ring =
      model.commTime(Collective::AllReduce, 2.5 * mib, tp, CommAlgorithm::Ring);
  ASSERT_TRUE(ring);
  EXPECT_EQ(ring->algorithm, CommAlgorithm::Ring);
  EXPECT_NE(ring->time, named->time);
  // Across nodes, one rank on each.
  auto ag = model.commTime(Collective::AllGather, 4 * mib, group(2, 8));
  ASSERT_TRUE(ag) << ag.status().message();
  EXPECT_EQ(ag->algorithm, CommAlgorithm::Measured);
  EXPECT_EQ(ag->link, LinkKind::Network);
  EXPECT_NEAR(ag->time, 500e-6, 1e-12);
}

TEST_F(Measured, OtherGroupsAndCollectivesTakeTheModel) {
  const double mib = 1048576;
  const CostModel plain;
  struct Case {
    Collective c;
    CommGroup g;
  };
  const Case cases[] = {
      {Collective::AllReduce, group(4, 1)}, // fewer ranks
      {Collective::AllReduce, group(8, 2)}, // 8 ranks on 2 nodes
      {Collective::AllGather, group(8, 1)}, // another collective
      {Collective::AllReduce, group(2, 8)}, // all-gather's group
      {Collective::ReduceScatter, group(2, 8)},
  };
  for (const Case &k : cases) {
    auto e = model.commTime(k.c, 4 * mib, k.g);
    auto p = plain.commTime(k.c, 4 * mib, k.g);
    ASSERT_TRUE(e && p);
    EXPECT_NE(e->algorithm, CommAlgorithm::Measured);
    EXPECT_EQ(e->time, p->time);
  }
  auto named = model.commTime(Collective::AllReduce, mib, group(4, 1),
                              CommAlgorithm::Measured);
  ASSERT_FALSE(named);
  EXPECT_NE(named.status().message().find("collective_table measured no "
                                          "such group"),
            std::string::npos)
      << named.status().message();
  EXPECT_FALSE(model.commTime(Collective::SendRecv, mib, group(2, 1),
                              CommAlgorithm::Measured));
  // A communicator of one rank moves nothing, measured or not.
  auto one = model.commTime(Collective::AllReduce, mib, group(1, 1));
  ASSERT_TRUE(one);
  EXPECT_EQ(one->time, 0);
}

} // namespace
