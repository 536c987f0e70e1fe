//===- StreamScheduleTest.cpp - Compute/comm streams and events, on the CPU ===//
#include "runtime/cuda/StreamSchedule.h"

#include <gtest/gtest.h>

using namespace dlopt::rt::cuda;

namespace {

constexpr StreamKind C = StreamKind::Compute, M = StreamKind::Comm;

/// Bytes [b, b + 16): one 16-byte "value" per letter of the tests.
ByteRange v(int b) { return {int64_t(b) * 16, int64_t(b) * 16 + 16}; }

SchedNode node(StreamKind s, std::vector<int> reads, std::vector<int> writes) {
  SchedNode n;
  n.stream = s;
  for (int r : reads)
    n.reads.push_back(v(r));
  for (int w : writes)
    n.writes.push_back(v(w));
  return n;
}

using Waits = std::vector<std::vector<int32_t>>;

TEST(StreamSchedule, CommunicationOpsGoToTheCommStream) {
  for (const char *op : {"all_reduce", "all_gather", "reduce_scatter",
                         "all_to_all", "broadcast", "send", "recv", "barrier"})
    EXPECT_TRUE(isCommunicationOp(op)) << op;
  for (const char *op : {"matmul", "add", "broadcast_to", "reshape", "sum", ""})
    EXPECT_FALSE(isCommunicationOp(op)) << op;
}

TEST(StreamSchedule, ComputeOnlyNeedsNoEvents) {
  StreamPlan p = scheduleStreams({node(C, {}, {0}), node(C, {0}, {1}),
                                  node(C, {1}, {0})});
  EXPECT_EQ(p.numWaits(), 0);
  EXPECT_EQ(p.waits, (Waits{{}, {}, {}}));
  EXPECT_EQ(p.recordAfter, (std::vector<bool>{false, false, false}));
}

TEST(StreamSchedule, CollectiveWaitsForItsProducer) {
  // g = grad(); all_reduce(g) in place.
  StreamPlan p = scheduleStreams({node(C, {9}, {0}), node(M, {0}, {0})});
  EXPECT_EQ(p.stream, (std::vector<StreamKind>{C, M}));
  EXPECT_EQ(p.waits, (Waits{{}, {0}}));
  EXPECT_EQ(p.recordAfter, (std::vector<bool>{true, false}));
}

TEST(StreamSchedule, OnlyTheLatestProducerOnAStreamIsWaitedFor) {
  // Two gradients produced in order, one collective over both: waiting for
  // the second implies the first (same stream).
  StreamPlan p = scheduleStreams(
      {node(C, {}, {0}), node(C, {}, {1}), node(M, {0, 1}, {2})});
  EXPECT_EQ(p.waits, (Waits{{}, {}, {1}}));
  EXPECT_EQ(p.numWaits(), 1);
}

TEST(StreamSchedule, IndependentComputeIsNotDelayed) {
  // Compute that neither reads what the collective writes nor writes what
  // it reads runs on, no wait; the consumer of the result waits.
  StreamPlan p = scheduleStreams({node(C, {}, {0}), node(M, {0}, {1}),
                                  node(C, {5}, {6}), node(C, {1}, {7})});
  EXPECT_EQ(p.waits, (Waits{{}, {0}, {}, {1}}));
  EXPECT_EQ(p.recordAfter, (std::vector<bool>{true, true, false, false}));
}

TEST(StreamSchedule, WriteAfterReadAcrossStreams) {
  // The collective reads buffer 0; compute that reuses buffer 0 (the memory
  // plan's scratch reuse) must wait for it.
  StreamPlan p = scheduleStreams(
      {node(C, {}, {0}), node(M, {0}, {1}), node(C, {}, {0})});
  EXPECT_EQ(p.waits, (Waits{{}, {0}, {1}}));
}

TEST(StreamSchedule, WriteAfterWriteAcrossStreams) {
  StreamPlan p = scheduleStreams({node(M, {}, {3}), node(C, {}, {3})});
  EXPECT_EQ(p.waits, (Waits{{}, {0}}));
}

TEST(StreamSchedule, TransitiveWaitsAreDropped) {
  // 0 C writes a; 1 M reads a writes b (waits 0); 2 C reads b (waits 1);
  // 3 C writes a again: WAR with 1, already implied by 2's wait.
  // 4 M reads c written by 3: waits 3 (its clock covers 0..3).
  StreamPlan p = scheduleStreams({node(C, {}, {0}), node(M, {0}, {1}),
                                  node(C, {1}, {2}), node(C, {}, {0}),
                                  node(M, {0}, {4})});
  EXPECT_EQ(p.waits, (Waits{{}, {0}, {1}, {}, {3}}));
  EXPECT_EQ(p.numWaits(), 3);
}

TEST(StreamSchedule, AlreadyOrderedDependencyNeedsNoNewWait) {
  // The second collective depends on compute node 0, which the first
  // collective already waited for (comm stream order covers it).
  StreamPlan p = scheduleStreams({node(C, {}, {0}), node(M, {0}, {1}),
                                  node(M, {0}, {2})});
  EXPECT_EQ(p.waits, (Waits{{}, {0}, {}}));
}

TEST(StreamSchedule, PartialOverlapIsADependency) {
  SchedNode w = node(C, {}, {});
  w.writes = {{0, 100}};
  SchedNode r = node(M, {}, {});
  r.reads = {{99, 120}};
  SchedNode far = node(M, {}, {});
  far.reads = {{100, 120}}; // touches, does not overlap
  StreamPlan p = scheduleStreams({w, r});
  EXPECT_EQ(p.waits, (Waits{{}, {0}}));
  StreamPlan q = scheduleStreams({w, far});
  EXPECT_EQ(q.waits, (Waits{{}, {}}));
  // Empty ranges never conflict.
  SchedNode e = node(M, {}, {});
  e.reads = {{50, 50}};
  EXPECT_EQ(scheduleStreams({w, e}).numWaits(), 0);
}

TEST(StreamSchedule, PipelinedBucketsOverlap) {
  // Backward produces grads g0..g3 (compute), each all-reduced right after
  // it is produced; the optimizer reads every reduced grad at the end.
  std::vector<SchedNode> nodes;
  for (int i = 0; i < 4; ++i) {
    nodes.push_back(node(C, {20 + i}, {i}));  // g_i = backward(...)
    nodes.push_back(node(M, {i}, {i}));       // all_reduce(g_i) in place
  }
  nodes.push_back(node(C, {0, 1, 2, 3}, {10})); // optimizer
  StreamPlan p = scheduleStreams(nodes);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(p.waits[2 * i], std::vector<int32_t>{}) << "compute " << i;
    EXPECT_EQ(p.waits[2 * i + 1], std::vector<int32_t>{2 * i}) << "comm " << i;
  }
  // Waiting for the last collective covers the earlier ones.
  EXPECT_EQ(p.waits[8], std::vector<int32_t>{7});
  EXPECT_EQ(p.numWaits(), 5);
}

TEST(StreamSchedule, OnlineSchedulerMatchesThePlanAndClears) {
  std::vector<SchedNode> nodes = {node(C, {}, {0}), node(M, {0}, {1}),
                                  node(C, {1}, {2})};
  StreamPlan p = scheduleStreams(nodes);
  StreamScheduler s;
  for (size_t i = 0; i < nodes.size(); ++i)
    EXPECT_EQ(s.add(nodes[i]), p.waits[i]);
  EXPECT_EQ(s.size(), 3);
  s.clear();
  EXPECT_EQ(s.size(), 0);
  // After clear() nothing earlier is remembered.
  EXPECT_EQ(s.add(node(M, {2}, {3})), std::vector<int32_t>{});
}

} // namespace
