//===- CommPlan.h - Communication instructions as copies and one collective ===//
//
// A communication instruction (docs/executable-format.md) is at most one
// collective over flat buffers, which gathers and scatters along dim 0,
// plus strided block copies before and after it that put the blocks of a
// non-leading axis into rank-major order and back. planCommunication()
// derives those copies from the shapes, with the layout of the CPU
// backend's runCommunication (CpuBackend.cpp, the reference semantics);
// a backend then runs the plan with its own copy primitive:
//
//  - runCommPlanOnHost(): memcpy over host buffers (what the unit tests
//    check against the CPU backend, test/unit/runtime/CommPlanTest.cpp);
//  - the cuda backend: cudaMemcpy2DAsync on the device, around an NCCL call
//    or a host communicator's call on staged copies (CudaBackend.cpp).
//
// Each copy moves `height` rows of `width` bytes between two of the four
// buffers below, at a pitch (the distance between rows) on either side.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/comm/Communicator.h"
#include "runtime/format/Executable.h"
#include "runtime/support/Status.h"

#include <cstdint>
#include <vector>

namespace dlopt::rt {

/// The buffers of a plan: the instruction's operand (X) and result (Y), and
/// two staging buffers of the plan's sendBytes / recvBytes.
enum class CommBuffer : uint8_t { X, Y, Send, Recv };

/// `height` rows of `width` bytes: row i goes from src + srcOffset +
/// i * srcPitch to dst + dstOffset + i * dstPitch (pitches >= width).
struct BlockCopy {
  CommBuffer dst = CommBuffer::Y, src = CommBuffer::X;
  int64_t dstOffset = 0, dstPitch = 0;
  int64_t srcOffset = 0, srcPitch = 0;
  int64_t width = 0, height = 0;
};

enum class CollectiveKind : uint8_t {
  None, ///< no traffic (all_slice)
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  Broadcast, ///< in place on `out`
};

struct CommPlan {
  CollectiveKind call = CollectiveKind::None;
  /// The collective reads `inCount` elements of `in` and writes `outCount`
  /// elements of `out` (Communicator.h's conventions).
  CommBuffer in = CommBuffer::X, out = CommBuffer::Y;
  int64_t inCount = 0, outCount = 0;
  DType dtype = DType::F32;
  ReduceOp reduce = ReduceOp::Sum;
  int root = 0;
  /// Staging buffer sizes (0 when unused).
  int64_t sendBytes = 0, recvBytes = 0;
  /// Copies before and after the collective, in order (a copy whose source
  /// and destination are the same bytes is a no-op).
  std::vector<BlockCopy> before, after;
};

/// The plan of communication instruction `instr` (all_reduce, all_gather,
/// reduce_scatter, all_slice, all_to_all, broadcast) with operand type `x`
/// and result type `y` on the member `groupRank` of a group of `groupSize`.
/// Checks the attributes and shapes again (a backend may be handed an
/// instruction Executable::validate never saw) and that every copy stays
/// inside its buffers.
Expected<CommPlan> planCommunication(const Instr &instr, const TensorType &x,
                                     const TensorType &y, int groupSize,
                                     int groupRank);

/// Runs `plan` on host memory: x and y are the operand and result buffers,
/// `comm` a communicator taking host buffers (unused when the plan has no
/// collective). Staging buffers are allocated here.
Status runCommPlanOnHost(const CommPlan &plan, Communicator *comm,
                         const void *x, void *y);

} // namespace dlopt::rt
