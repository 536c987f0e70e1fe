//===- GlobalTensor.cpp - A rank's part of a global tensor ----------------===//
#include "runtime/exec/GlobalTensor.h"

#include <algorithm>
#include <cstring>

namespace dlopt::rt {

std::vector<int64_t> blockStart(const Mesh &mesh, const GlobalLayout &layout,
                                const TensorType &local, int32_t rank) {
  std::vector<int64_t> coords = mesh.coords(rank);
  std::vector<int64_t> start(local.shape.size(), 0);
  for (size_t d = 0; d < layout.split.size() && d < start.size(); ++d) {
    int64_t index = 0;
    for (int32_t a : layout.split[d])
      index = index * mesh.shape[size_t(a)] + coords[size_t(a)];
    start[d] = index * local.shape[d];
  }
  return start;
}

bool Box::empty() const {
  for (size_t d = 0; d < lo.size() && d < hi.size(); ++d)
    if (hi[d] <= lo[d])
      return true;
  return false;
}

bool Box::covers(const std::vector<int64_t> &shape) const {
  if (lo.size() != shape.size() || hi.size() != shape.size())
    return false;
  for (size_t d = 0; d < shape.size(); ++d)
    if (lo[d] > 0 || hi[d] < shape[d])
      return false;
  return true;
}

Box blocksBox(const Mesh &mesh, const GlobalLayout &layout,
              const TensorType &local, const std::vector<int32_t> &ranks) {
  size_t n = local.shape.size();
  Box box{std::vector<int64_t>(n, 0), std::vector<int64_t>(n, 0)};
  bool first = true;
  for (int32_t r : ranks) {
    std::vector<int64_t> start = blockStart(mesh, layout, local, r);
    for (size_t d = 0; d < n; ++d) {
      int64_t end = start[d] + local.shape[d];
      box.lo[d] = first ? start[d] : std::min(box.lo[d], start[d]);
      box.hi[d] = first ? end : std::max(box.hi[d], end);
    }
    first = false;
  }
  return box;
}

namespace {

/// Copies the block [start, start + local.shape) between a global tensor
/// and a local one, a contiguous innermost run at a time.
template <bool ToLocal>
void copyBlock(const TensorType &global, const TensorType &local,
               const std::vector<int64_t> &start, uint8_t *globalBytes,
               uint8_t *localBytes) {
  const size_t rank = local.shape.size();
  const int64_t elem = dtypeSize(local.dtype);
  if (rank == 0) {
    if (ToLocal)
      std::memcpy(localBytes, globalBytes, size_t(elem));
    else
      std::memcpy(globalBytes, localBytes, size_t(elem));
    return;
  }
  if (local.numElements() == 0)
    return;
  std::vector<int64_t> gStride(rank, 1);
  for (size_t d = rank - 1; d-- > 0;)
    gStride[d] = gStride[d + 1] * global.shape[d + 1];
  const int64_t run = local.shape[rank - 1] * elem;
  const int64_t rows = local.numElements() / local.shape[rank - 1];
  std::vector<int64_t> idx(rank, 0);
  for (int64_t row = 0; row < rows; ++row) {
    int64_t g = 0;
    for (size_t d = 0; d < rank; ++d)
      g += (start[d] + idx[d]) * gStride[d];
    uint8_t *gp = globalBytes + g * elem;
    uint8_t *lp = localBytes + row * run;
    if (ToLocal)
      std::memcpy(lp, gp, size_t(run));
    else
      std::memcpy(gp, lp, size_t(run));
    for (size_t d = rank - 1; d-- > 0;) {
      if (++idx[d] < local.shape[d])
        break;
      idx[d] = 0;
    }
  }
}

} // namespace

Expected<HostTensor> localPart(const Mesh &mesh, const GlobalLayout &layout,
                               const TensorType &local, int32_t rank,
                               const HostTensor &global) {
  if (!(global.type == layout.type))
    return Status::error("expected the global " + layout.type.str() +
                         ", got " + global.type.str());
  HostTensor part(local);
  copyBlock<true>(layout.type, local, blockStart(mesh, layout, local, rank),
                  const_cast<uint8_t *>(global.bytes.data()),
                  part.bytes.data());
  return part;
}

Status placePart(const Mesh &mesh, const GlobalLayout &layout, int32_t rank,
                 const HostTensor &part, HostTensor &global) {
  if (!(global.type == layout.type))
    return Status::error("expected the global " + layout.type.str() +
                         ", got " + global.type.str());
  copyBlock<false>(layout.type, part.type,
                   blockStart(mesh, layout, part.type, rank),
                   global.bytes.data(),
                   const_cast<uint8_t *>(part.bytes.data()));
  return Status::ok();
}

} // namespace dlopt::rt
