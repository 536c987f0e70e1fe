//===- CpuBackend.h - Runs instructions on the host with dlopt_cpu --------===//
#pragma once

#include "runtime/exec/Backend.h"

namespace dlopt::rt {

/// Host-memory backend: arenas are aligned heap blocks, copies are memcpy,
/// instructions go to cpu::runKernel. Everything is synchronous.
class CpuBackend final : public Backend {
public:
  explicit CpuBackend(const BackendOptions &opts = {});

  std::string name() const override { return "cpu"; }
  bool supportsOp(const std::string &op) const override;
  Expected<std::unique_ptr<DeviceArena>> allocateArena(int rank,
                                                      int64_t bytes) override;
  Status copyToDevice(DeviceArena &arena, int64_t offset, const void *src,
                      int64_t bytes) override;
  Status copyToHost(void *dst, const DeviceArena &arena, int64_t offset,
                    int64_t bytes) override;
  const void *hostView(const DeviceArena &arena, int64_t offset,
                       int64_t bytes) const override;
  Status copyOnDevice(DeviceArena &arena, int64_t dstOffset, int64_t srcOffset,
                      int64_t bytes) override;
  Status run(const Instr &instr, std::span<const TensorRef> ins,
             std::span<const TensorRef> outs, const RunContext &ctx) override;
  Status synchronize(int) override { return Status::ok(); }

private:
  class Arena;
};

} // namespace dlopt::rt
