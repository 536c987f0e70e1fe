//===- Session.h - Loads an executable and runs one rank's program --------===//
//
// A Session owns a backend and the arena of one rank. Creating it validates
// the executable, checks that the backend supports every instruction,
// allocates the arena at the size the memory plan asks for, and copies the
// constants in. Then callers bind inputs and params by name, and run().
// Params and states that were not bound are initialized from their Init
// (ParamInit.h) the first time they are needed; they keep their values across
// runs. A training step's plan has outputs that update params and states:
// step() runs it and copies those outputs back, so the next step sees them.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/exec/Backend.h"
#include "runtime/exec/HostTensor.h"
#include "runtime/format/Executable.h"
#include "runtime/support/Status.h"

#include "runtime/exec/StepRunner.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dlopt::rt {

struct SessionOptions {
  int rank = 0;      ///< which program of the executable this session runs
  uint64_t seed = 0; ///< parameter initialization seed
};

/// Planned versus actual memory of the session's rank, in bytes.
struct MemoryReport {
  int64_t plannedBytes = 0;    ///< memory plan total (persistent + scratch)
  int64_t persistentBytes = 0; ///< memory plan: params, inputs, consts
  int64_t scratchBytes = 0;    ///< memory plan: temporaries
  int64_t allocatedBytes = 0;  ///< device bytes the backend allocated
  int64_t peakAllocatedBytes = 0; ///< most device bytes held at once
};

class Session final : public StepRunner {
public:
  /// Validates `exe` and prepares the rank's arena. Errors name the problem
  /// (invalid executable, unsupported op with its instruction, allocation).
  static Expected<std::unique_ptr<Session>>
  create(Executable exe, std::unique_ptr<Backend> backend,
         const SessionOptions &opts = {});
  ~Session() override;

  const Executable &executable() const override { return exe_; }
  Backend &backend() { return *backend_; }
  int rank() const { return opts_.rank; }

  /// Binds a param, state or input by name. The type must match exactly, except
  /// that a bf16 value accepts f32 data (rounded to nearest even). `origin`
  /// (e.g. the file name) makes the message say where a bad value came from:
  /// "input 'tokens': expected 2x16xi32, got 2x8xi32 from tokens.npy".
  /// Values this rank does not hold are accepted and ignored.
  Status bind(const std::string &name, const HostTensor &value,
              const std::string &origin = "") override;
  /// Whether `name` is a param, state or input of the executable.
  bool hasArgument(const std::string &name) const;
  /// Inputs (held by this rank) that have not been bound yet.
  std::vector<std::string> missingInputs() const override;

  /// Checks every input is bound and initializes the unbound params and
  /// states. run() calls it; call it first to read initial values.
  Status prepare();
  /// Initializes the unbound params and states only (inputs may still be
  /// missing). The state at position s of Executable::states is initialized
  /// like the param at position params.size() + s.
  Status initializeParams() override;
  /// Runs the program and returns the outputs this rank holds, in output
  /// order.
  Expected<std::vector<NamedTensor>> run();

  /// Runs the program without reading anything back; outputs stay readable
  /// with readOutput() until the next run. run() and step() call it.
  /// Update outputs that the memory plan computes in place (see
  /// findInPlaceUpdates) overwrite their param or state during the run;
  /// with `keepArguments` their old values are restored after the run and
  /// the new ones kept for applyUpdates(), so the run changes nothing until
  /// updates are applied (a full copy of those arguments: use it to look at
  /// the loss before applying, or to evaluate).
  Status execute(bool keepArguments = false) override;
  /// An output of the last run, by name.
  Expected<HostTensor> readOutput(const std::string &name) const override;

  /// Whether some output updates a param or state (a training step).
  bool hasUpdates() const override;
  /// Runs one training step: runs the program and returns the outputs this
  /// rank holds that update nothing (loss, metrics, logits), in output
  /// order; with `apply`, then applies the updates (applyUpdates()). With
  /// `apply = false` params and states are left as they were (evaluation).
  Expected<std::vector<NamedTensor>> step(bool apply = true);
  /// Copies each update output of the last run into the param or state it
  /// names, so the next run sees the new values. An error if nothing ran
  /// since the last call (updates are applied at most once per run).
  Status applyUpdates() override;

  /// Current contents of a value held by this rank.
  Expected<HostTensor> readValue(int32_t id) const;
  /// Current value of a param, state or input by name.
  Expected<HostTensor> readArgument(const std::string &name) const override;
  /// The bytes of value `id` in place, when the backend lets the host read
  /// its memory (the CPU backend), else null (use readValue). Valid until
  /// the next execute(), bind or update.
  const void *valueView(int32_t id) const;
  /// The same, writable, for binding a param or state in place (e.g. a
  /// checkpoint read straight into memory); after writing it, markBound.
  void *writableView(int32_t id) {
    return const_cast<void *>(valueView(id));
  }
  /// Marks param or state `id` bound (its bytes written through
  /// writableView), so initializeParams leaves it alone.
  void markBound(int32_t id) { ready_[size_t(id)] = true; }
  /// The params and states this rank holds.
  std::vector<int32_t> checkpointedValues() const override;
  int checkpointRank() const override { return opts_.rank; }
  /// Value id of a param, state or input, or -1.
  int32_t findArgument(const std::string &name) const;

  MemoryReport memory() const;
  /// Communicators of a multi-rank executable: groups[g] is this rank's
  /// communicator of Executable::groups[g] (not owned; World sets them).
  void setCommunicators(std::vector<Communicator *> groups) {
    groups_ = std::move(groups);
  }
  /// Wall time of the last run(), in seconds (instructions only).
  double lastRunSeconds() const override { return lastRunSeconds_; }
  /// Host time of the last run() until its last instruction was issued
  /// (before the final synchronize): near lastRunSeconds() when the host,
  /// not the device, sets the pace.
  double lastIssueSeconds() const override { return lastIssueSeconds_; }
  /// With profiling on, every run adds each instruction's time to
  /// profile(): seconds and calls per op name. The time is the device's
  /// (between events around the instruction, with no added synchronize)
  /// where the backend supports Backend::setDeviceTiming, else the host's
  /// wall time after a backend synchronize.
  /// The first `skipRuns` runs after this call are not profiled (warm-up).
  void setProfiling(bool on, int64_t skipRuns = 0) {
    profiling_ = on;
    profileSkip_ = skipRuns;
  }
  struct OpProfile {
    double seconds = 0;
    int64_t calls = 0;
  };
  /// Sums over the profiled runs.
  struct ProfileTotals {
    int64_t runs = 0, skipped = 0;
    double wallSeconds = 0, issueSeconds = 0;
    bool deviceTimed = false; ///< profile() holds device times
  };
  const ProfileTotals &profileTotals() const { return profileTotals_; }
  const std::map<std::string, OpProfile> &profile() const { return profile_; }
  /// The same, per instruction of the program (indexed as program().instrs;
  /// empty until a profiled run).
  const std::vector<OpProfile> &instrProfile() const { return instrProfile_; }
  const Program &program() const { return *program_; }

private:
  Session(Executable exe, std::unique_ptr<Backend> backend,
          const SessionOptions &opts);
  Status init();
  Expected<std::vector<NamedTensor>> collectOutputs(bool includeUpdates);

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
  double lastRunSeconds_ = 0, lastIssueSeconds_ = 0;
  ProfileTotals profileTotals_;
  std::vector<Communicator *> groups_;
  bool profiling_ = false;
  int64_t profileSkip_ = 0;
  std::map<std::string, OpProfile> profile_;
  std::vector<OpProfile> instrProfile_;
  /// A run's update outputs are waiting to be applied.
  bool updatesPending_ = false;
  /// New values of in-place updated arguments held back by
  /// execute(keepArguments = true) until applyUpdates().
  struct PendingUpdate {
    int32_t arg, temp;
    HostTensor value;
  };
  std::vector<PendingUpdate> inPlacePending_;
};

} // namespace dlopt::rt
