//===- GlobalTensor.h - A rank's part of a global tensor ------------------===//
//
// A value of a multi-rank executable with a GlobalLayout is one block of its
// global tensor: dim d is split evenly over the mesh axes layout.split[d]
// (major first), so the block's start along d is
//     sum_k coord(axis_k) * prod_{j > k} size(axis_j)  *  local.shape[d].
// These helpers cut a rank's block out of a global tensor and put it back;
// binding, parameter initialization, outputs and checkpoints use them, so a
// value means the same global tensor whatever the plan.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/exec/HostTensor.h"
#include "runtime/format/Executable.h"

namespace dlopt::rt {

/// A box of a global tensor: the elements with lo[d] <= i_d < hi[d].
struct Box {
  std::vector<int64_t> lo, hi;
  /// Whether it holds no element.
  bool empty() const;
  /// Whether it holds the whole of a tensor of `shape`.
  bool covers(const std::vector<int64_t> &shape) const;
  bool operator==(const Box &o) const { return lo == o.lo && hi == o.hi; }
};

/// Start of `rank`'s block along each dim of the global tensor.
std::vector<int64_t> blockStart(const Mesh &mesh, const GlobalLayout &layout,
                                const TensorType &local, int32_t rank);

/// The block of `global` (of type layout.type) that `rank` holds, as a
/// tensor of type `local`.
Expected<HostTensor> localPart(const Mesh &mesh, const GlobalLayout &layout,
                               const TensorType &local, int32_t rank,
                               const HostTensor &global);

/// The smallest box holding the blocks of `ranks` (of type `local`); an
/// empty box when `ranks` is empty.
Box blocksBox(const Mesh &mesh, const GlobalLayout &layout,
              const TensorType &local, const std::vector<int32_t> &ranks);

/// Writes `part` (rank's block, of the local type) into `global`.
Status placePart(const Mesh &mesh, const GlobalLayout &layout, int32_t rank,
                 const HostTensor &part, HostTensor &global);

} // namespace dlopt::rt
