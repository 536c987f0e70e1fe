//===- Backend.cpp - Allocation counters and the backend registry ---------===//

#include "runtime/exec/Backend.h"
#include "runtime/exec/CpuBackend.h"

namespace dlopt::rt {

void Backend::noteAllocated(int64_t bytes) {
  int64_t now = allocated_ += bytes;
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

Status Backend::copyOnDevice(DeviceArena &arena, int64_t dstOffset,
                             int64_t srcOffset, int64_t bytes) {
  if (bytes < 0)
    return Status::error("copy on device: negative size");
  std::vector<uint8_t> staging;
  try {
    staging.resize(size_t(bytes));
  } catch (const std::exception &e) {
    return Status::error(std::string("copy on device: ") + e.what());
  }
  DLOPT_RETURN_IF_ERROR(copyToHost(staging.data(), arena, srcOffset, bytes));
  return copyToDevice(arena, dstOffset, staging.data(), bytes);
}

std::vector<std::string> availableBackends() { return {"cpu"}; }

Expected<std::unique_ptr<Backend>> createBackend(const std::string &name,
                                                 const BackendOptions &opts) {
  if (name == "cpu")
    return std::unique_ptr<Backend>(new CpuBackend(opts));
  std::string list;
  for (const std::string &b : availableBackends())
    list += (list.empty() ? "" : ", ") + b;
  if (name == "cuda")
    return Status::error("backend 'cuda' is not built into this dlopt "
                         "(available: " + list + ")");
  return Status::error("unknown backend '" + name + "' (available: " + list +
                       ")");
}

} // namespace dlopt::rt
