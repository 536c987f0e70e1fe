//===- StepRunner.h - What the training loop and checkpoints drive --------===//
//
// The training loop (Trainer.h) and checkpoints (Checkpoint.h) run a step
// and read and write arguments by name through this interface, so they work
// the same on one rank (Session) and on every rank of a multi-rank
// executable in this process (World, docs/parallel.md). Names and tensors
// are global: a World binds a global tensor by splitting it over the ranks
// and reads a global one back by gathering the ranks' blocks.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/exec/GlobalTensor.h"
#include "runtime/exec/HostTensor.h"
#include "runtime/format/Executable.h"

#include <optional>
#include <string>
#include <vector>

namespace dlopt::rt {

class StepRunner {
public:
  virtual ~StepRunner() = default;

  virtual const Executable &executable() const = 0;
  /// Binds a param, state or input by name (a global tensor).
  virtual Status bind(const std::string &name, const HostTensor &value,
                      const std::string &origin = "") = 0;
  /// The part of input `name`'s global tensor that this process's ranks
  /// read (the smallest box holding their blocks; empty when none of them
  /// reads it), or nullopt when they read all of it. Data loaders fill only
  /// this part (DataLoader::restrictTo).
  virtual std::optional<Box> inputRegion(const std::string &) const {
    return std::nullopt;
  }
  /// Inputs that have not been bound yet.
  virtual std::vector<std::string> missingInputs() const = 0;
  /// Initializes the unbound params and states.
  virtual Status initializeParams() = 0;
  /// Runs the step (see Session::execute).
  virtual Status execute(bool keepArguments = false) = 0;
  /// An output of the last run (global).
  virtual Expected<HostTensor> readOutput(const std::string &name) const = 0;
  /// Whether some output updates a param or state (a training step).
  virtual bool hasUpdates() const = 0;
  /// Applies the last run's updates to the params and states.
  virtual Status applyUpdates() = 0;
  /// A param, state or input by name (global).
  virtual Expected<HostTensor> readArgument(const std::string &name) const = 0;
  /// The params and states a checkpoint of this runner holds (value ids).
  virtual std::vector<int32_t> checkpointedValues() const = 0;
  /// Which rank's checkpoint this is (0 for every rank of a World).
  virtual int checkpointRank() const = 0;
  /// Whether checkpoints are directories of per-rank shards and an index
  /// (a World) rather than one file of global tensors (Checkpoint.h).
  virtual bool shardedCheckpoints() const { return false; }
  /// Seconds of the last execute() until its last instruction was issued
  /// and until it finished (an asynchronous backend's host issue time
  /// against its run time), or -1 where not measured.
  virtual double lastIssueSeconds() const { return -1; }
  virtual double lastRunSeconds() const { return -1; }
};

/// The type of `id` a runner binds and reads: its global type in a
/// multi-rank executable, else its own.
inline const TensorType &argumentType(const Executable &exe, int32_t id) {
  const Value &v = exe.values[size_t(id)];
  return v.global ? v.global->type : v.type;
}

} // namespace dlopt::rt
