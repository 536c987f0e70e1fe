//===- CpuBackend.cpp - Runs instructions on the host with dlopt_cpu ------===//

#include "runtime/exec/CpuBackend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace dlopt::rt {

namespace {
constexpr int64_t kArenaAlignment = 64;

Status rangeError(const char *what, int64_t offset, int64_t bytes,
                  int64_t size) {
  return Status::error(std::string(what) + ": bytes [" +
                       std::to_string(offset) + ", " +
                       std::to_string(offset + bytes) +
                       ") are outside the arena of " + std::to_string(size) +
                       " bytes");
}

bool inRange(int64_t offset, int64_t bytes, int64_t size) {
  return offset >= 0 && bytes >= 0 && offset <= size && bytes <= size - offset;
}
} // namespace

class CpuBackend::Arena final : public DeviceArena {
public:
  Arena(CpuBackend &owner, int rank, void *data, int64_t size,
        int64_t allocated)
      : owner_(owner), rank_(rank), data_(data), size_(size),
        allocated_(allocated) {}
  ~Arena() override {
    std::free(data_);
    owner_.noteFreed(allocated_);
  }
  void *data() const override { return data_; }
  int64_t size() const override { return size_; }
  int rank() const override { return rank_; }

private:
  CpuBackend &owner_;
  int rank_;
  void *data_;
  int64_t size_;
  int64_t allocated_;
};

CpuBackend::CpuBackend(const BackendOptions &opts) {
  if (opts.threads > 0)
    cpu::setNumThreads(opts.threads);
}

bool CpuBackend::supportsOp(const std::string &op) const {
  return cpu::hasKernel(op);
}

Expected<std::unique_ptr<DeviceArena>>
CpuBackend::allocateArena(int rank, int64_t bytes) {
  if (bytes < 0)
    return Status::error("cannot allocate a negative arena size");
  // aligned_alloc needs a multiple of the alignment, and a non-zero size so
  // even an empty arena has a distinct valid address.
  int64_t rounded =
      std::max<int64_t>(kArenaAlignment,
                        (bytes + kArenaAlignment - 1) / kArenaAlignment *
                            kArenaAlignment);
  void *p = std::aligned_alloc(kArenaAlignment, size_t(rounded));
  if (!p)
    return Status::error("cannot allocate the arena of rank " +
                         std::to_string(rank) + ": " +
                         formatBytes(bytes) + " (" + std::to_string(bytes) +
                         " bytes) of host memory");
  noteAllocated(rounded);
  return std::unique_ptr<DeviceArena>(
      new Arena(*this, rank, p, bytes, rounded));
}

Status CpuBackend::copyToDevice(DeviceArena &arena, int64_t offset,
                                const void *src, int64_t bytes) {
  if (!inRange(offset, bytes, arena.size()))
    return rangeError("copy to device", offset, bytes, arena.size());
  if (bytes)
    std::memcpy(static_cast<uint8_t *>(arena.data()) + offset, src,
                size_t(bytes));
  return Status::ok();
}

Status CpuBackend::copyToHost(void *dst, const DeviceArena &arena,
                              int64_t offset, int64_t bytes) {
  if (!inRange(offset, bytes, arena.size()))
    return rangeError("copy to host", offset, bytes, arena.size());
  if (bytes)
    std::memcpy(dst, static_cast<const uint8_t *>(arena.data()) + offset,
                size_t(bytes));
  return Status::ok();
}

Status CpuBackend::copyOnDevice(DeviceArena &arena, int64_t dstOffset,
                                int64_t srcOffset, int64_t bytes) {
  if (!inRange(dstOffset, bytes, arena.size()))
    return rangeError("copy on device (destination)", dstOffset, bytes,
                      arena.size());
  if (!inRange(srcOffset, bytes, arena.size()))
    return rangeError("copy on device (source)", srcOffset, bytes,
                      arena.size());
  auto *base = static_cast<uint8_t *>(arena.data());
  if (bytes)
    std::memmove(base + dstOffset, base + srcOffset, size_t(bytes));
  return Status::ok();
}

Status CpuBackend::run(const Instr &instr, std::span<const TensorRef> ins,
                       std::span<const TensorRef> outs, const RunContext &) {
  return cpu::runKernel(instr, ins, outs);
}

} // namespace dlopt::rt
