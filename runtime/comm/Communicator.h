//===- Communicator.h - Collective communication among ranks -------------===//
//
// A Communicator connects the ranks of one group. Every collective is called
// by all ranks of the group in the same order with matching arguments; the
// implementation checks that they match and returns a Status error (on every
// rank) when they do not, instead of corrupting memory. Point-to-point
// send/recv pair up per (sender, receiver) in FIFO order.
//
// Implementations: InProcessCommunicator (ranks are threads of one process,
// host buffers, deterministic reductions) and NcclCommunicator (device
// buffers, runtime/cuda/NcclCommunicator.h); see docs/communicators.md.
//
// No call hangs forever: each has a timeout (default 60 s, setTimeout()).
// A timeout aborts the group and returns an error naming the operation and
// the ranks that never arrived; abort() wakes every waiter with an error.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/support/DType.h"
#include "runtime/support/Status.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace dlopt::rt {

enum class ReduceOp : uint8_t { Sum, Max, Min, Avg };

inline const char *reduceOpName(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum: return "sum";
  case ReduceOp::Max: return "max";
  case ReduceOp::Min: return "min";
  case ReduceOp::Avg: return "avg";
  }
  return "?";
}

/// Where a communication buffer lives. Implementations say which they accept
/// (InProcessCommunicator: Host only; NCCL: Device).
enum class MemorySpace : uint8_t { Host, Device };

/// A buffer read by a communication call: `count` elements of `dtype`.
struct CommInput {
  const void *data = nullptr;
  int64_t count = 0;
  DType dtype = DType::F32;
  MemorySpace space = MemorySpace::Host;
};

/// A buffer written by a communication call.
struct CommOutput {
  void *data = nullptr;
  int64_t count = 0;
  DType dtype = DType::F32;
  MemorySpace space = MemorySpace::Host;
  operator CommInput() const { return {data, count, dtype, space}; }
};

inline CommInput hostIn(const void *p, int64_t n, DType t) {
  return {p, n, t, MemorySpace::Host};
}
inline CommOutput hostOut(void *p, int64_t n, DType t) {
  return {p, n, t, MemorySpace::Host};
}

/// Collective/point-to-point communication among the ranks of one group.
/// Buffer-size conventions (n = size()):
///   allReduce      out.count == in.count
///   allGather      out.count == in.count * n, rank r's input at r*in.count
///   reduceScatter  in.count == out.count * n, rank r gets block r
///   allToAll       in.count == out.count, divisible by n; block j of rank
///                  i's input lands in block i of rank j's output
///   broadcast      in place; the root's buffer is copied to every rank
/// In-place calls (out aliasing in) are allowed for every collective.
class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual Status allReduce(CommInput in, CommOutput out, ReduceOp op) = 0;
  virtual Status allGather(CommInput in, CommOutput out) = 0;
  virtual Status reduceScatter(CommInput in, CommOutput out, ReduceOp op) = 0;
  virtual Status allToAll(CommInput in, CommOutput out) = 0;
  virtual Status broadcast(CommOutput buf, int root) = 0;
  /// Blocks until every rank of the group has arrived.
  virtual Status barrier() = 0;

  /// Point-to-point: the i-th send from A to B matches the i-th recv on B
  /// from A; count and dtype must agree.
  virtual Status send(CommInput in, int peer) = 0;
  virtual Status recv(CommOutput out, int peer) = 0;

  /// Collective over this group: ranks passing the same color >= 0 form a
  /// new group, ordered by (key, rank in this group). A negative color
  /// leaves the caller out: it gets a null communicator.
  virtual Expected<std::unique_ptr<Communicator>> split(int color,
                                                        int key) = 0;

  /// Fails every pending and future call on every rank of the group with
  /// an error carrying `reason`. Safe to call from any thread.
  virtual void abort(const std::string &reason) = 0;

  virtual void setTimeout(std::chrono::milliseconds t) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  /// Whether the calls take MemorySpace::Device buffers (the NCCL
  /// communicator). Host communicators (InProcessCommunicator) say no; a
  /// device backend then stages its buffers through host memory.
  virtual bool acceptsDeviceMemory() const { return false; }
  /// Device communicators: enqueue the following calls on `stream` (a
  /// cudaStream_t of the communicator's device), after the work already
  /// queued there; null returns to the communicator's own stream. Callers
  /// put the communicator's own stream back before that stream may go away.
  /// Host communicators have no stream: an error.
  virtual Status setDeviceStream(void *stream) {
    (void)stream;
    return Status::error("this communicator takes host buffers and has no "
                         "device stream");
  }
};

/// Default time a rank waits for its peers before aborting the group.
inline constexpr std::chrono::milliseconds kDefaultCommTimeout{60000};

} // namespace dlopt::rt
