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

TEST(NcclTests, TheCollectiveFromAPrefixOrTheFileNameWithoutAHeader) {
  // nccl-tests before 2.16.7: no "Collective test starting" line, and
  // rank lines without a Group ("#   Rank  0 Pid ... [0x10] ...").
  const std::string text = fixture("a100-all_reduce.txt");
  auto none = parseNcclTests(text, "a100");
  ASSERT_FALSE(none);
  EXPECT_NE(none.status().message().find("which collective"), std::string::npos)
      << none.status().message();
  EXPECT_NE(none.status().message().find("all_reduce=FILE"), std::string::npos);
  auto named = collectiveOfNcclTestsName("logs/a100-all_reduce.txt");
  ASSERT_TRUE(named);
  EXPECT_EQ(*named, Collective::AllReduce);
  NcclTestsNames byFile;
  byFile.fileName = named;
  auto s = parseNcclTests(text, "a100", byFile);
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ((*s)[0].rows.size(), 6u);
  EXPECT_EQ((*s)[0].ranks, 8);
  EXPECT_EQ((*s)[0].device, "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ((*s)[0].rows[0].device, "NVIDIA A100-SXM4-40GB");
  // A prefix wins over the file name; named wrongly, the bus bandwidth
  // gives an all-reduce away.
  NcclTestsNames wrongPrefix = byFile;
  wrongPrefix.prefix = Collective::AllGather;
  auto wrong = parseNcclTests(text, "a100", wrongPrefix);
  ASSERT_FALSE(wrong);
  EXPECT_NE(wrong.status().message().find("busbw / algbw is 1.75"),
            std::string::npos)
      << wrong.status().message();
  EXPECT_NE(wrong.status().message().find("expected 0.875"), std::string::npos);
  // Where the output names its collective, a prefix of another is an
  // error, and the same one is fine.
  const std::string h100 = fixture("h100-all_reduce.txt");
  NcclTestsNames ag;
  ag.prefix = Collective::AllGather;
  auto conflict = parseNcclTests(h100, "h100", ag);
  ASSERT_FALSE(conflict);
  EXPECT_NE(conflict.status().message().find(
                "the output is all_reduce_perf's, but the file was named "
                "all_gather="),
            std::string::npos)
      << conflict.status().message();
  NcclTestsNames ar;
  ar.prefix = Collective::AllReduce;
  EXPECT_TRUE(parseNcclTests(h100, "h100", ar));
  // The file name does not override the output's own name.
  NcclTestsNames file;
  file.fileName = Collective::Broadcast;
  auto h = parseNcclTests(h100, "h100", file);
  ASSERT_TRUE(h) << h.status().message();
  EXPECT_EQ((*h)[0].collective, Collective::AllReduce);
}

TEST(NcclTests, FactorsOfEveryCollective) {
  // 4 ranks: all_reduce 1.5, all_gather/reduce_scatter/alltoall 0.75,
  // broadcast 1. Each output passes under its own name and fails under
  // one of another factor.
  struct Case {
    std::string prog;
    Collective c;
    const char *busbw;
  };
  const Case cases[] = {
      {"all_reduce_perf", Collective::AllReduce, "15.73"},
      {"all_gather_perf", Collective::AllGather, "7.86"},
      {"reduce_scatter_perf", Collective::ReduceScatter, "7.86"},
      {"alltoall_perf", Collective::AllToAll, "7.86"},
      {"broadcast_perf", Collective::Broadcast, "10.49"},
  };
  for (const Case &k : cases) {
    // 1 MiB in 100 us: algbw 10.49 GB/s.
    const std::string row = std::string("1048576 262144 float sum 0 100.0 "
                                        "10.49 ") +
                            k.busbw + " 0 100.0 10.49 " + k.busbw + " 0\n";
    auto s = parseNcclTests(output(k.prog, {{"a", 4}}, row), "f");
    ASSERT_TRUE(s) << k.prog << ": " << s.status().message();
    EXPECT_EQ((*s)[0].collective, k.c);
    const std::string other =
        k.c == Collective::AllReduce ? "broadcast_perf" : "all_reduce_perf";
    EXPECT_FALSE(parseNcclTests(output(other, {{"a", 4}}, row), "f"))
        << k.prog << " as " << other;
  }
  // A NAME_SUFFIX build: all_reduce_perf_mpi.
  auto mpi = parseNcclTests(
      output("all_reduce_perf_mpi", {{"a", 4}},
             "1048576 262144 float sum -1 100.0 10.49 15.73 0 100 10.49 "
             "15.73 0\n"),
      "f");
  ASSERT_TRUE(mpi) << mpi.status().message();
  EXPECT_EQ((*mpi)[0].collective, Collective::AllReduce);
}

TEST(NcclTests, RankZerosGroupOfASplitRun) {
  // NCCL_TESTS_SPLIT: 4 ranks in 2 groups of 2 (0, 2 and 1, 3), on two
  // hosts; the timings are rank 0's group's: 2 ranks on 2 nodes.
  std::string s = "# Collective test starting: all_reduce_perf\n"
                  "# nThread 1 nGpus 1\n";
  for (int r = 0; r < 4; ++r)
    s += "#  Rank  " + std::to_string(r) + " Group  " + std::to_string(r % 2) +
         " Pid 1 on " + (r < 2 ? "a" : "b") + " device " +
         std::to_string(r % 2) + " [0000:01:00] X\n";
  // 2 ranks: busbw = algbw.
  s += "1048576 262144 float sum -1 100.0 10.49 10.49 0 100 10.49 10.49 0\n";
  auto w = parseNcclTests(s, "split");
  ASSERT_TRUE(w) << w.status().message();
  EXPECT_EQ((*w)[0].ranks, 2);
  EXPECT_EQ((*w)[0].nodes, 2);
  EXPECT_EQ((*w)[0].ranksPerNode, 1);
  EXPECT_EQ((*w)[0].groups, 2);
}

TEST(NcclTests, LauncherPrefixesAndSizeZero) {
  std::string text = output("all_gather_perf", {{"a", 2}},
                            "0 0 float none -1 5.00 0.00 0.00 0 5.0 0 0 0\n"
                            "65536 8192 float none -1 10.00 6.55 3.28 0 "
                            "10.0 6.55 3.28 0\n");
  // srun -l and mpirun --tag-output put a prefix before every line.
  std::string srun, tagged;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    std::string line = text.substr(pos, eol - pos);
    srun += "0: " + line + "\n";
    tagged += "[1,0]<stdout>:" + line + "\n";
    pos = eol + 1;
  }
  for (const std::string &t : {text, srun, tagged}) {
    auto s = parseNcclTests(t, "f");
    ASSERT_TRUE(s) << s.status().message() << "\n" << t;
    ASSERT_EQ((*s)[0].rows.size(), 1u); // size 0 moved nothing
    EXPECT_EQ((*s)[0].rows[0].bytes, 65536);
  }
}

TEST(NcclTests, CollectiveOfAName) {
  EXPECT_EQ(collectiveOfNcclTestsName("all_gather_perf.log"),
            Collective::AllGather);
  EXPECT_EQ(collectiveOfNcclTestsName("AllReduce-16n.txt"),
            Collective::AllReduce);
  EXPECT_EQ(collectiveOfNcclTestsName("/x/alltoall/rs-reduce_scatter.log"),
            Collective::ReduceScatter); // the base name only
  EXPECT_EQ(collectiveOfNcclTestsName("alltoall_perf"), Collective::AllToAll);
  EXPECT_EQ(collectiveOfNcclTestsName("all-to-all.txt"), Collective::AllToAll);
  EXPECT_EQ(collectiveOfNcclTestsName("broadcast.out"), Collective::Broadcast);
  EXPECT_FALSE(collectiveOfNcclTestsName("nccl.log"));
  EXPECT_FALSE(collectiveOfNcclTestsName("all_reduce_vs_all_gather.log"));
  EXPECT_FALSE(collectiveOfNcclTestsName("small_gather.log"));
  EXPECT_FALSE(collectiveOfNcclTestsName("alltoallv_perf.log"));
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
       "expected a time of at least 0.01 us"},
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
       "a second test header before the rows of the test at line 1: did "
       "that test fail"},
      {"# Collective test starting: all_reduce_perf\n# nThread 1\n"
       "#  Rank 0 Group 0 Pid 1 on a device 0 [0] X\n"
       "#  Rank 2 Group 0 Pid 1 on a device 1 [0] X\n"
       "1024 256 float sum -1 10.0 0.10 0.10 0 10.0 0.10 0.10 0\n",
       "expected ranks 0 to 1, got rank 2"},
      {"# nThread 1\n#  Rank 0 Group 0 Pid 1\n", "expected '# Rank N ... on "
                                                 "HOST"},
      // Hex, inf and tiny times; the columns checked both ways.
      {output("all_reduce_perf", {{"a", 2}},
              "1024 256 float sum -1 0x1p3 0.10 0.10 0 10.0 0.10 0.10 0\n"),
       "expected numbers for size, time"},
      {output("all_reduce_perf", {{"a", 2}},
              "1024 256 float sum -1 inf 0.10 0.10 0 10.0 0.10 0.10 0\n"),
       "expected numbers for size, time"},
      {output("all_reduce_perf", {{"a", 2}},
              "1024 256 float sum -1 1e-7 0.10 0.10 0 10.0 0.10 0.10 0\n"),
       "expected a time of at least 0.01 us"},
      {output("all_reduce_perf", {{"a", 2}},
              "1048576 262144 float sum -1 0.05 0.00 0.00 0 1 0 0 0\n"),
       "is not size / time"},
      // One rank off in a list of 8: all_gather's 7/8 against 6/7.
      {output("all_gather_perf", {{"a", 7}},
              "1048576 262144 float none -1 100.0 10.49 9.18 0 100 0 0 0\n"),
       "busbw / algbw is 0.875, expected 0.857"},
      {output("all_reduce_perf", {{"a", 2}},
              "1024 256 float sum -1 10.0 0.10 0.10 0 10.0 0.10 0.10 0\n"
              "#  Rank 2 Group 0 Pid 1 on a device 2 [0] X\n"),
       "a rank listed after the test's rows"},
      // Formats this reader does not know.
      {"# nThread 1\n#  Rank 0 Pid 1 on a device 0 [0x1] X\n"
       "#  Rank 1 Pid 1 on a device 1 [0x1] X\n"
       "#       size         count      type   redop     time   algbw   "
       "busbw  error     time   algbw   busbw  error\n",
       "expected the columns of nccl-tests 2.13 and later"},
      {"# nThread 1\n#  Rank 0 Pid 1 on a device 0 [0x1] X\n"
       "# size count type redop root cputime algbw busbw #wrong\n",
       "CPU times (nccl-tests -C 1)"},
      // Processes without MPI: each prints a test of its own.
      {"# Collective test starting: all_reduce_perf\n# nThread 1\n"
       "#  Rank 0 Group 0 Pid 1 on a device 0 [0] X\n"
       "# Collective test starting: all_reduce_perf\n# nThread 1\n"
       "#  Rank 0 Group 0 Pid 2 on a device 1 [0] X\n",
       "a second test header before the rows of the test at line 2"},
      // ... interleaved line by line.
      {"# nThread 1 nGpus 1\n# nThread 1 nGpus 1\n# Using devices\n"
       "#  Rank 0 Group 0 Pid 1 on a device 0 [0] X\n"
       "#  Rank 0 Group 0 Pid 2 on b device 0 [0] X\n",
       "f.log:2: a second test header before the rows of the test at line 1"},
      {output("all_reduce_perf", {{"a", 2}},
              "1024 256 float sum -1 10.0 0.10 0.10 0 10.0 0.10 0.10 0\n") +
           output("all_reduce_perf", {{"a", 2}},
                  "1024 256 float sum -1 10.0 0.10 0.10 0 10 0.10 0.10 0\n"),
       "at the same size (1.02e+03 bytes): two runs in one file"},
      {output("all_reduce_perf", {{"a", 2}},
              "1024 256 float sum -1 10.0 0.10 0.10 0 10.0 0.10 0.10 0\n"
              "1024 256 half sum -1 11.0 0.09 0.09 0 10.0 0.10 0.10 0\n"),
       "-d all, -o all, -r -1 or -N"},
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
      {Collective::ReduceScatter, 16, 2, 8, 4096, 40e-6, "NVIDIA H100"},
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
  EXPECT_EQ(r.device, "NVIDIA H100");
  EXPECT_EQ(back->collectiveTable[0].device, "");

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
      {row(ok + ", \"device\": 3"), "device: expected a string"},
      {row(ok + ", \"device\": \"a\\nb\""), "printable characters"},
      {row("\"collective\": \"all_reduce\", \"ranks\": 8, \"nodes\": 1, "
           "\"ranks_per_node\": 8, \"bytes\": 1, \"us\": 0.0001"),
       "expected us in [0.001, 1e9]"},
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
       "expected us in [0.001, 1e9]"},
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
