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

/// Start of `rank`'s block along each dim of the global tensor.
std::vector<int64_t> blockStart(const Mesh &mesh, const GlobalLayout &layout,
                                const TensorType &local, int32_t rank);

/// The block of `global` (of type layout.type) that `rank` holds, as a
/// tensor of type `local`.
Expected<HostTensor> localPart(const Mesh &mesh, const GlobalLayout &layout,
                               const TensorType &local, int32_t rank,
                               const HostTensor &global);

/// Writes `part` (rank's block, of the local type) into `global`.
Status placePart(const Mesh &mesh, const GlobalLayout &layout, int32_t rank,
                 const HostTensor &part, HostTensor &global);

} // namespace dlopt::rt
