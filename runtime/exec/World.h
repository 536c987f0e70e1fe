//===- World.h - Every rank of an executable as threads of one process ----===//
//
// In-graph execution of a multi-rank executable: one Session per rank, each
// with its own backend, run by one thread per rank, and one communicator
// per (rank, group of Executable::groups), split from one world group (an
// in-process group unless WorldOptions::worldGroup makes another, e.g.
// NCCL for cuda ranks on distinct devices).
//
// Callers speak in global tensors: bind() cuts each rank's block out of a
// global param, state or input (GlobalTensor.h), readOutput() and
// readArgument() put the blocks back together. Parameters are initialized
// by global element index, so every plan starts from the same weights.
//
// Failures: when a rank's program fails, every communicator is aborted so
// the other ranks stop waiting, and execute() returns the failing rank's
// error (the root cause, not the "aborted" errors it caused elsewhere).
//
// Between-graph (docs/launch.md): a World may run only some of the ranks,
// [firstRank, firstRank + numRanks), in this process, the others running in
// other processes (mpirun). WorldOptions::processGroup then connects the
// processes (one communicator per process): reading an output or argument
// gathers the blocks of every process, so those calls are collective (every
// process makes them in the same order), and onFailure tells the other
// processes that a rank here failed.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/comm/Communicator.h"
#include "runtime/exec/Session.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dlopt::rt {

struct WorldOptions {
  uint64_t seed = 0; ///< parameter initialization seed
  /// Deadline of every communication call (a rank that never arrives).
  std::chrono::milliseconds commTimeout = kDefaultCommTimeout;
  /// Makes each rank's backend; default: the CPU backend, one kernel thread.
  std::function<Expected<std::unique_ptr<Backend>>(int rank)> backend;
  /// Makes the world communicator group of n ranks (element r is rank r's),
  /// from which every group's communicators are split; default: an
  /// in-process group (host buffers; the cuda backend stages device data
  /// through host memory). createCudaWorld() in CudaBackend.h sets NCCL.
  /// With numRanks > 0 it makes only this process's ranks' communicators
  /// (element i is rank firstRank + i's, in a group of n).
  std::function<Expected<std::vector<std::unique_ptr<Communicator>>>(int n)>
      worldGroup;
  /// The ranks this process runs: [firstRank, firstRank + numRanks); 0 means
  /// every rank (in-graph).
  int firstRank = 0, numRanks = 0;
  /// One communicator per process, rank = process index, when the ranks are
  /// spread over processes; null in one process.
  std::shared_ptr<Communicator> processGroup;
  /// Called once when a rank of this process fails (before its error
  /// returns), e.g. to tell the other processes.
  std::function<void(int rank, const Status &)> onFailure;
};

class World final : public StepRunner {
public:
  static Expected<std::unique_ptr<World>> create(const Executable &exe,
                                                 const WorldOptions &opts = {});
  ~World() override;

  /// Ranks of the executable (every process's).
  int size() const { return exe_.worldSize; }
  /// This process's ranks: [firstRank(), firstRank() + numLocal()).
  int firstRank() const { return first_; }
  int numLocal() const { return int(sessions_.size()); }
  bool isLocal(int rank) const {
    return rank >= first_ && rank < first_ + numLocal();
  }
  /// A rank of this process (isLocal(rank)).
  Session &session(int rank) { return *sessions_[size_t(rank - first_)]; }
  /// Index of this process and the number of processes (0 and 1 in-graph).
  int processIndex() const { return process_ ? process_->rank() : 0; }
  int numProcesses() const { return process_ ? process_->size() : 1; }
  /// Collective over the processes: the first failure of any process's
  /// `local` (by process index), or ok. In one process, `local` itself.
  Status agreeAcrossProcesses(const Status &local);
  /// Collective over the processes: every process's bytes, by index.
  /// `what` names the exchange: processes that reach different exchanges
  /// (a bug: they must make the same calls in the same order) get an error
  /// naming both instead of each other's bytes.
  Expected<std::vector<std::vector<uint8_t>>>
  allGatherBytes(const std::vector<uint8_t> &mine, const std::string &what);
  const Executable &executable() const override { return exe_; }

  /// Binds a param, state or input by name to its global value.
  Status bind(const std::string &name, const HostTensor &global,
              const std::string &origin = "") override;
  /// Global type of an argument or output (its local type if unsplit).
  Expected<TensorType> globalType(const std::string &name) const;
  /// Initializes every rank's unbound params and states.
  Status initializeParams() override;
  /// Runs every rank's program once (Session::execute on every rank).
  Status execute(bool keepArguments = false) override;
  /// Session::applyUpdates on every rank.
  Status applyUpdates() override;
  /// An output of the last run, as its global tensor.
  Expected<HostTensor> readOutput(const std::string &name) const override;
  /// A param, state or input, as its global tensor.
  Expected<HostTensor> readArgument(const std::string &name) const override;
  /// Inputs some rank has not bound (ranks of different pipeline stages
  /// read different inputs). Collective over the processes.
  std::optional<Box> inputRegion(const std::string &name) const override;
  std::vector<std::string> missingInputs() const override;
  bool hasUpdates() const override { return sessions_[0]->hasUpdates(); }
  /// Every param and state (global tensors).
  std::vector<int32_t> checkpointedValues() const override;
  int checkpointRank() const override { return 0; }
  bool shardedCheckpoints() const override { return true; }

private:
  explicit World(Executable exe) : exe_(std::move(exe)) {}
  /// Runs fn(rank) on one thread per rank; on a failure aborts every
  /// communicator and returns the root cause.
  Status onEveryRank(const std::function<Status(int)> &fn);
  Expected<HostTensor> gather(int32_t id,
                              const std::function<Expected<HostTensor>(int)>
                                  &read) const;

  Executable exe_;
  int first_ = 0;
  std::shared_ptr<Communicator> process_;
  std::function<void(int, const Status &)> onFailure_;
  /// world_[i], groups_[i], sessions_[i]: those of rank first_ + i.
  std::vector<std::unique_ptr<Communicator>> world_;
  /// groups_[i][g]: rank first_ + i's communicator of group g.
  std::vector<std::vector<std::unique_ptr<Communicator>>> groups_;
  std::vector<std::unique_ptr<Session>> sessions_;
};

} // namespace dlopt::rt
