//===- RankOrderReduce.h - Reductions in rank order -----------------------===//
//
// The one reduction every host communicator uses, so in-process ranks and
// MPI processes give bitwise the same results: element i of the result is
// ins[0][i] op ins[1][i] op ... in rank order (f16/bf16 accumulate in f32
// and round once; f32 accumulates in f32; integers accumulate in i64 and
// wrap; avg divides the sum by the number of inputs).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/comm/Communicator.h"

#include <cstdint>
#include <vector>

namespace dlopt::rt {

/// Reduces elements [off, off+cnt) of every input, in rank order, into dst
/// (element 0 of dst is element `off`). I1 is not reducible (a no-op; the
/// communicators refuse it first).
void reduceInto(const std::vector<const void *> &ins, int64_t off,
                int64_t cnt, DType t, ReduceOp op, void *dst);

} // namespace dlopt::rt
