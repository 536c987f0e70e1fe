//===- StreamSchedule.h - Compute/communication streams and their events --===//
//
// A rank's instructions run on two CUDA streams: communication instructions
// (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send,
// recv, barrier) on a comm stream, everything else on a compute stream, so
// gradient collectives overlap the backward pass. Work on one stream is
// ordered by the stream; an instruction on one stream that depends on work
// of the other waits on an event recorded after that work.
//
// Dependencies come from memory, not from value ids, because the memory plan
// reuses scratch bytes: instruction i depends on an earlier j when i reads
// bytes j writes (RAW), writes bytes j reads (WAR) or writes bytes j writes
// (WAW). Of those, only cross-stream ones need an event, and only the ones
// not already implied: every instruction carries a vector clock (for each
// stream, the latest instruction of that stream known to finish before it),
// so a dependency on j is dropped when an earlier wait already covers j, and
// among several waits of one instruction the ones another wait implies are
// dropped too (a transitive reduction). With two streams that leaves at most
// one wait per instruction.
//
// Plain C++ with no CUDA: unit-tested on the CPU (test/unit/cuda).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace dlopt::rt::cuda {

enum class StreamKind : uint8_t { Compute = 0, Comm = 1 };
inline constexpr int kNumStreams = 2;

/// Whether `op` (an instruction's op name) is communication and belongs on
/// the comm stream.
bool isCommunicationOp(std::string_view op);

/// Bytes [begin, end) of a rank's arena.
struct ByteRange {
  int64_t begin = 0, end = 0;
  bool overlaps(const ByteRange &o) const {
    return begin < o.end && o.begin < end && begin < end && o.begin < o.end;
  }
};

/// One instruction as the scheduler sees it.
struct SchedNode {
  StreamKind stream = StreamKind::Compute;
  std::vector<ByteRange> reads, writes;
};

/// The schedule of a whole instruction list.
struct StreamPlan {
  std::vector<StreamKind> stream;          ///< per node
  std::vector<std::vector<int32_t>> waits; ///< per node: nodes it waits for
  std::vector<bool> recordAfter;           ///< per node: someone waits on it
  int64_t numWaits() const {
    int64_t n = 0;
    for (const auto &w : waits)
      n += int64_t(w.size());
    return n;
  }
};

/// Assigns nodes to streams in order, deriving the waits as above.
class StreamScheduler {
public:
  /// Adds the next node (its index is the number of nodes added before)
  /// and returns the nodes, on other streams, it must wait for.
  std::vector<int32_t> add(const SchedNode &node);
  int32_t size() const { return int32_t(nodes_.size()); }
  void clear();

private:
  struct Entry {
    StreamKind stream;
    std::vector<ByteRange> reads, writes;
    std::vector<int32_t> clock; ///< per stream; -1 = nothing yet
  };
  bool conflicts(const SchedNode &a, const Entry &b) const;

  std::vector<Entry> nodes_;
  std::vector<int32_t> byStream_[kNumStreams]; ///< node indices per stream
  std::vector<int32_t> known_[kNumStreams];    ///< each stream's clock
};

/// The schedule of a whole list: the online waits, plus which nodes must
/// record an event.
StreamPlan scheduleStreams(const std::vector<SchedNode> &nodes);

} // namespace dlopt::rt::cuda
