//===- Backend.h - The device interface the executor runs on --------------===//
//
// A Backend owns devices: it allocates one arena per rank, copies bytes
// between host and an arena, runs one instruction on resolved buffers, and
// waits for queued work. The executor never touches device memory itself,
// so a CUDA backend (streams, cuBLAS) slots in behind the same calls. Copies
// and runs may be asynchronous; only synchronize() and copyToHost() (which
// waits for the data it returns) are guaranteed to block.
//
// Communication instructions (all_reduce, all_gather, send/recv, ...) are
// instructions like any other: the backend receives them through run() with
// a RunContext naming the rank and its communicator, so in-graph (threads
// driving several ranks) and between-graph (one process per rank) execution
// need no change here.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/comm/Communicator.h"
#include "runtime/cpu/CpuKernels.h" // TensorRef
#include "runtime/format/Executable.h"
#include "runtime/support/Status.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dlopt::rt {

class Backend;

/// Where an instruction runs. `comm` implements runtime/comm/Communicator.h.
struct RunContext {
  int rank = 0;
  int worldSize = 1;
  Communicator *comm = nullptr; ///< null when worldSize == 1
  /// The rank's communicator of each group of Executable::groups (its own
  /// group of that kind); communication instructions name one by index.
  std::span<Communicator *const> groups;
};

/// One rank's device memory: a single allocation holding every value the
/// rank's memory plan places. Move-only by construction (owned through
/// unique_ptr); destroying it frees the memory.
class DeviceArena {
public:
  virtual ~DeviceArena() = default;
  /// Device address of byte 0 (a host pointer on the CPU backend).
  virtual void *data() const = 0;
  virtual int64_t size() const = 0;
  virtual int rank() const = 0;
};

struct BackendOptions {
  int threads = 0; ///< worker threads for kernels; 0 = backend default
};

class Backend {
public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend &) = delete;
  Backend &operator=(const Backend &) = delete;

  /// Short name used on the command line ("cpu", "cuda").
  virtual std::string name() const = 0;
  /// Whether run() can execute `op`; the executor checks every instruction
  /// on load so unsupported ops fail before anything runs.
  virtual bool supportsOp(const std::string &op) const = 0;

  /// Allocates the arena of `rank` (at least `bytes`, aligned to at least
  /// 64 bytes). Its contents are unspecified.
  virtual Expected<std::unique_ptr<DeviceArena>> allocateArena(int rank,
                                                              int64_t bytes) = 0;
  /// Copies host bytes into the arena at `offset`.
  virtual Status copyToDevice(DeviceArena &arena, int64_t offset,
                              const void *src, int64_t bytes) = 0;
  /// Copies arena bytes at `offset` to host memory; blocks until done.
  virtual Status copyToHost(void *dst, const DeviceArena &arena, int64_t offset,
                            int64_t bytes) = 0;
  /// The host address of arena bytes [offset, offset + bytes) when the
  /// host can read them in place (the CPU backend), else null: readers such
  /// as the checkpoint writer then copy with copyToHost. Valid until the
  /// next run() or copy into the arena.
  virtual const void *hostView(const DeviceArena &, int64_t /*offset*/,
                               int64_t /*bytes*/) const {
    return nullptr;
  }
  /// Copies `bytes` from `srcOffset` to `dstOffset` within one arena (the
  /// ranges must not overlap). The default stages through host memory;
  /// backends override it with a device-side copy.
  virtual Status copyOnDevice(DeviceArena &arena, int64_t dstOffset,
                              int64_t srcOffset, int64_t bytes);
  /// Runs one instruction; `ins`/`outs` point into arenas of this backend
  /// and follow instr.operands/results.
  virtual Status run(const Instr &instr, std::span<const TensorRef> ins,
                     std::span<const TensorRef> outs, const RunContext &ctx) = 0;
  /// Waits for all work queued for `rank`.
  virtual Status synchronize(int rank) = 0;

  /// Device-side timing of instructions, for profiles that must not add a
  /// synchronize per instruction: while on, the backend brackets each run()
  /// of `rank` with device events, and takeDeviceTimes() returns the device
  /// seconds of every run() since the last take, in call order (call it
  /// after synchronize()). Backends that execute synchronously return false
  /// and the caller times run() on the host.
  virtual bool setDeviceTiming(int /*rank*/, bool /*on*/) { return false; }
  virtual Expected<std::vector<double>> takeDeviceTimes(int /*rank*/) {
    return std::vector<double>{};
  }

  /// Device bytes held in arenas now, and the most ever held at once.
  int64_t bytesAllocated() const { return allocated_.load(); }
  int64_t peakBytesAllocated() const { return peak_.load(); }

protected:
  /// Implementations report arena allocations and frees for the counters.
  void noteAllocated(int64_t bytes);
  void noteFreed(int64_t bytes) { allocated_ -= bytes; }

private:
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
};

/// Names accepted by createBackend(), e.g. {"cpu"}.
std::vector<std::string> availableBackends();

/// Creates a backend by name; an unknown name is an error listing the
/// available ones.
Expected<std::unique_ptr<Backend>> createBackend(const std::string &name,
                                                 const BackendOptions &opts = {});

} // namespace dlopt::rt
