//===- Session.h - Loads an executable and runs one rank's program --------===//
//
// A Session owns a backend and the arena of one rank. Creating it validates
// the executable, checks that the backend supports every instruction,
// allocates the arena at the size the memory plan asks for, and copies the
// constants in. Then callers bind inputs and params by name, and run().
// Params that were not bound are initialized from their Init (ParamInit.h)
// the first time they are needed; params keep their values across runs.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/exec/Backend.h"
#include "runtime/exec/HostTensor.h"
#include "runtime/format/Executable.h"
#include "runtime/support/Status.h"

#include <memory>
#include <string>
#include <vector>

namespace dlopt::rt {

struct SessionOptions {
  int rank = 0;      ///< which program of the executable this session runs
  uint64_t seed = 0; ///< parameter initialization seed
};

/// A named tensor, e.g. an output.
struct NamedTensor {
  std::string name;
  HostTensor tensor;
};

/// Planned versus actual memory of the session's rank, in bytes.
struct MemoryReport {
  int64_t plannedBytes = 0;    ///< memory plan total (persistent + scratch)
  int64_t persistentBytes = 0; ///< memory plan: params, inputs, consts
  int64_t scratchBytes = 0;    ///< memory plan: temporaries
  int64_t allocatedBytes = 0;  ///< device bytes the backend allocated
  int64_t peakAllocatedBytes = 0; ///< most device bytes held at once
};

class Session {
public:
  /// Validates `exe` and prepares the rank's arena. Errors name the problem
  /// (invalid executable, unsupported op with its instruction, allocation).
  static Expected<std::unique_ptr<Session>>
  create(Executable exe, std::unique_ptr<Backend> backend,
         const SessionOptions &opts = {});
  ~Session();

  const Executable &executable() const { return exe_; }
  Backend &backend() { return *backend_; }
  int rank() const { return opts_.rank; }

  /// Binds a param or input by name. The type must match exactly, except
  /// that a bf16 value accepts f32 data (rounded to nearest even). `origin`
  /// (e.g. the file name) makes the message say where a bad value came from:
  /// "input 'tokens': expected 2x16xi32, got 2x8xi32 from tokens.npy".
  /// Values this rank does not hold are accepted and ignored.
  Status bind(const std::string &name, const HostTensor &value,
              const std::string &origin = "");
  /// Whether `name` is a param or input of the executable.
  bool hasArgument(const std::string &name) const;
  /// Inputs (held by this rank) that have not been bound yet.
  std::vector<std::string> missingInputs() const;

  /// Checks every input is bound and initializes the unbound params.
  /// run() calls it; call it first to read initial params.
  Status prepare();
  /// Runs the program and returns the outputs this rank holds, in output
  /// order.
  Expected<std::vector<NamedTensor>> run();

  /// Current contents of a value held by this rank.
  Expected<HostTensor> readValue(int32_t id) const;
  /// Current value of a param or input by name.
  Expected<HostTensor> readArgument(const std::string &name) const;

  MemoryReport memory() const;
  /// Wall time of the last run(), in seconds (instructions only).
  double lastRunSeconds() const { return lastRunSeconds_; }

private:
  Session(Executable exe, std::unique_ptr<Backend> backend,
          const SessionOptions &opts);
  Status init();
  int32_t findArgument(const std::string &name) const;

  Executable exe_;
  SessionOptions opts_;
  std::unique_ptr<Backend> backend_;
  // Declared after backend_ so it is destroyed first.
  std::unique_ptr<DeviceArena> arena_;
  const Program *program_ = nullptr;
  /// Per value: bound (inputs/params) or initialized (params).
  std::vector<bool> ready_;
  /// Operand and result refs of each instruction, resolved once.
  std::vector<std::vector<TensorRef>> ins_, outs_;
  double lastRunSeconds_ = 0;
};

} // namespace dlopt::rt
