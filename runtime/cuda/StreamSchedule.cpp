//===- StreamSchedule.cpp - Compute/communication streams and their events ===//

#include "runtime/cuda/StreamSchedule.h"

#include <algorithm>

namespace dlopt::rt::cuda {

bool isCommunicationOp(std::string_view op) {
  static constexpr std::string_view kComm[] = {
      "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
      "broadcast",  "send",       "recv",           "barrier", "send_recv"};
  for (std::string_view c : kComm)
    if (op == c)
      return true;
  return false;
}

static bool anyOverlap(const std::vector<ByteRange> &a,
                       const std::vector<ByteRange> &b) {
  for (const ByteRange &x : a)
    for (const ByteRange &y : b)
      if (x.overlaps(y))
        return true;
  return false;
}

bool StreamScheduler::conflicts(const SchedNode &a, const Entry &b) const {
  return anyOverlap(a.reads, b.writes) || anyOverlap(a.writes, b.reads) ||
         anyOverlap(a.writes, b.writes);
}

void StreamScheduler::clear() {
  nodes_.clear();
  for (int s = 0; s < kNumStreams; ++s) {
    byStream_[s].clear();
    known_[s].clear();
  }
}

std::vector<int32_t> StreamScheduler::add(const SchedNode &node) {
  int s = int(node.stream);
  for (auto &k : known_)
    if (k.empty())
      k.assign(kNumStreams, -1);
  // Candidate waits: per other stream, the latest conflicting node not yet
  // known to be finished before this stream's current position.
  std::vector<int32_t> cand;
  for (int t = 0; t < kNumStreams; ++t) {
    if (t == s)
      continue;
    const std::vector<int32_t> &list = byStream_[t];
    for (size_t i = list.size(); i-- > 0;) {
      int32_t j = list[i];
      if (j <= known_[s][t])
        break;
      if (conflicts(node, nodes_[j])) {
        cand.push_back(j);
        break;
      }
    }
  }
  // Transitive reduction: drop a candidate another candidate's clock covers.
  std::vector<int32_t> waits;
  for (int32_t j : cand) {
    bool implied = false;
    for (int32_t o : cand)
      if (o != j && nodes_[o].clock[int(nodes_[j].stream)] >= j)
        implied = true;
    if (!implied)
      waits.push_back(j);
  }
  std::sort(waits.begin(), waits.end());
  // This node's clock: the stream's position joined with every wait's clock.
  std::vector<int32_t> clock = known_[s];
  for (int32_t j : waits)
    for (int t = 0; t < kNumStreams; ++t)
      clock[t] = std::max(clock[t], nodes_[j].clock[t]);
  int32_t self = int32_t(nodes_.size());
  clock[s] = self;
  known_[s] = clock;
  nodes_.push_back({node.stream, node.reads, node.writes, clock});
  byStream_[s].push_back(self);
  return waits;
}

StreamPlan scheduleStreams(const std::vector<SchedNode> &nodes) {
  StreamPlan plan;
  plan.stream.reserve(nodes.size());
  plan.waits.reserve(nodes.size());
  plan.recordAfter.assign(nodes.size(), false);
  StreamScheduler sched;
  for (const SchedNode &n : nodes) {
    plan.stream.push_back(n.stream);
    plan.waits.push_back(sched.add(n));
    for (int32_t j : plan.waits.back())
      plan.recordAfter[j] = true;
  }
  return plan;
}

} // namespace dlopt::rt::cuda
