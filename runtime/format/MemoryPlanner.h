//===- MemoryPlanner.h - Arena offsets from buffer lifetimes --------------===//
//
// Assigns each buffer an offset so that buffers whose lifetimes overlap never
// overlap in memory, keeping the peak (the arena size) small. Used by the
// compiler when it emits an executable; plain C++ so it is unit-testable.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/format/Executable.h"

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace dlopt::rt {

/// A buffer live over the instruction interval [firstUse, lastUse]
/// (inclusive: defined by instruction firstUse, last read by lastUse).
struct BufferLifetime {
  int64_t size = 0;
  int64_t firstUse = 0;
  int64_t lastUse = 0;
};

struct MemoryAssignment {
  std::vector<int64_t> offsets; ///< one per buffer, aligned
  int64_t peakBytes = 0;        ///< arena size needed
  bool byBreadth = false;       ///< placed in the order by breadth
};

/// Packs buffers into one arena: best fit, in the order by size or, where
/// that leaves the arena above the live peak and the other does better,
/// by breadth (MemoryPlanner.cpp). Deterministic for the same input.
MemoryAssignment planMemory(const std::vector<BufferLifetime> &buffers,
                            int64_t alignment = 64);

/// Returns a pair of buffers (indices, first < second) that are live at the
/// same time and overlap in memory, or nothing if the assignment is safe.
/// Zero-sized buffers never conflict. O(n log n).
std::optional<std::pair<size_t, size_t>>
findMemoryConflict(const std::vector<BufferLifetime> &buffers,
                   const std::vector<int64_t> &offsets);

/// Builds a complete MemoryPlan for one program of `exe`: the values the
/// rank holds get offsets, persistent values first (in value order, each
/// aligned), then temporaries packed by planMemory() from their lifetimes
/// (definition to last use; outputs live to the end). A rank holds every
/// param, input and const its instructions read or that is an output, and
/// every temporary it defines; with a single program it also holds every
/// param and input, so they can be bound and saved even when unused.
/// Fails if the program reads an undefined temporary or has bad value ids.
/// Update outputs that may be computed directly into the bytes of the
/// param or state they replace (an in-place update), as (temp id, argument
/// id) pairs. Allowed when the argument is read by no instruction after the
/// one defining the update and is no output itself; a read by the defining
/// instruction itself is allowed only for elementwise ops whose operand has
/// exactly the result's type (backends support that exact aliasing). This
/// saves a second copy of the weights and optimizer state in training.
std::vector<std::pair<int32_t, int32_t>>
findInPlaceUpdates(const Executable &exe, const Program &program);

/// Whether `op` is elementwise in the sense of findInPlaceUpdates: element i
/// of the result depends only on element i of each same-typed operand.
bool isElementwiseOp(const std::string &op);

/// With `viewReshapes`, a reshape whose operand and result are temporaries
/// nothing else aliases (no in-place update, no output) gets its operand's
/// offset: the result is a view and backends skip the copy.
Expected<MemoryPlan> planProgramMemory(const Executable &exe,
                                       const Program &program,
                                       int64_t alignment = 64,
                                       bool viewReshapes = true);

} // namespace dlopt::rt
