//===- Trainer.h - The training loop over a training-step plan ------------===//
//
// A training-step plan (dlopt-compile --train) takes inputs, params and
// optimizer states and returns "loss" (plus "lr", "grad_norm" and maybe
// "logits") and one output per param/state that updates it. The Trainer
// feeds batches from a DataLoader, runs the step, checks the loss, applies
// the updates, and around that: progress output, JSONL metrics, evaluation
// on held-out data and checkpoints (docs/training-runtime.md).
//
// Everything that decides a step's numbers (params, states, the data
// position and the data seed) is in the checkpoint, so on a deterministic
// backend (cpu) N steps + resume + N steps equal 2N steps bit for bit.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/exec/DataLoader.h"
#include "runtime/exec/StepRunner.h"

#include <cstdio>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dlopt::rt {

struct TrainerOptions {
  int64_t steps = 0;   ///< steps to run in this invocation (run())
  uint64_t seed = 0;   ///< data seed; a resumed run takes the checkpoint's
  enum class Progress { None, Lines, Bar };
  Progress progress = Progress::Lines;
  int64_t logEvery = 1;         ///< Lines: print every K steps (and the last)
  std::FILE *log = nullptr;     ///< progress and notes; null means stderr
  std::string metricsPath;      ///< JSONL file appended per step; "" = none
  int64_t evalEvery = 0;        ///< evaluate every E steps; 0 = at the end
  int64_t evalBatches = 0;      ///< batches per evaluation; 0 = one pass
  std::string checkpointDir;    ///< "" = no checkpoints
  int64_t checkpointEvery = 0;  ///< every K steps (0 = at exit only)
};

struct EvalResult {
  double loss = 0;                 ///< mean of the batches' losses
  std::optional<double> accuracy;  ///< argmax(logits) == labels, if any
  int64_t batches = 0;
};

struct StepResult {
  int64_t step = 0;       ///< number of this step (1-based, global)
  double loss = 0;
  std::optional<double> lr, gradNorm;
  double seconds = 0;     ///< wall time: data, binding, run, updates
  /// The run alone, and its host time until the last instruction was
  /// issued (StepRunner::lastRunSeconds/lastIssueSeconds; -1: unknown).
  /// Issue time close to run time: the host, not the device, sets the pace.
  double runSeconds = -1, issueSeconds = -1;
  double throughput = 0;  ///< tokens/s or samples/s (see tokenThroughput)
  /// Non-finite loss under loss scaling: the plan skipped the update itself.
  bool skipped = false;
  std::optional<double> lossScale; ///< after the step, when the plan has one
  /// Non-finite loss without loss scaling: nothing was applied and the step
  /// does not count; run() stops.
  bool diverged = false;
  std::optional<EvalResult> eval;
};

class Trainer {
public:
  /// Checks that the plan is a training step (updates and a scalar float
  /// "loss" output) and that `train` (and `eval`, which must feed the same
  /// inputs) together with what is already bound feed every input.
  static Expected<std::unique_ptr<Trainer>>
  create(StepRunner &session, const DataLoader &train, const DataLoader *eval,
         const TrainerOptions &opts);

  /// Restores params, states, step, data position and data seed from a
  /// checkpoint; on error nothing changed.
  Status resume(const std::string &path);
  /// Runs one step (see StepResult::diverged).
  Expected<StepResult> step();
  /// Runs the step program on the eval data without applying updates.
  Expected<EvalResult> evaluate();
  /// opts.steps steps with progress, metrics, evaluation and checkpoints.
  /// A diverged step is an error ("loss is nan at step 7 ...").
  Status run();
  /// Writes checkpointDir/step-NNNNNN.safetensors now; returns its path.
  Expected<std::string> checkpoint();
  /// Writes a checkpoint to `path`.
  Status checkpointTo(const std::string &path);

  int64_t stepCount() const { return step_; }
  uint64_t dataPosition() const { return position_; }
  uint64_t seed() const { return seed_; }
  /// Throughput counts tokens (the plan has a "tokens" input) or samples.
  bool tokenThroughput() const { return tokensPerStep_ > 0; }
  /// Tokens or samples one step consumes.
  int64_t itemsPerStep() const {
    return tokensPerStep_ > 0 ? tokensPerStep_ : samplesPerStep_;
  }
  /// Steps run by this Trainer, in order.
  const std::vector<StepResult> &history() const { return history_; }
  /// The last checkpoint written, or "".
  const std::string &lastCheckpoint() const { return lastCheckpoint_; }
  /// Wall time and bytes of the last checkpoint written and of resume()
  /// (bytes: the files' sizes).
  double checkpointSeconds() const { return checkpointSeconds_; }
  int64_t checkpointBytes() const { return checkpointBytes_; }
  double resumeSeconds() const { return resumeSeconds_; }
  int64_t resumeBytes() const { return resumeBytes_; }

private:
  Trainer(StepRunner &session, const DataLoader &train, const DataLoader *eval,
          const TrainerOptions &opts);
  Status runLoop();
  Status bindBatch(const DataLoader &loader, uint64_t index);
  /// Starts drawing training batch `index` on a background thread, so it is
  /// ready when the next step binds it (a generated or read batch overlaps
  /// the step running now).
  void prefetch(uint64_t index);
  /// Waits for the background batch, if any, and returns it when it is
  /// batch `index` for the current seed (else nullopt: drawn anew).
  std::optional<Expected<std::vector<NamedTensor>>> takePrefetched(
      uint64_t index);
  std::string metricsLine(const StepResult &r) const;
  void showProgress(const StepResult &r, int64_t done, int64_t total,
                    double elapsed, bool last);
  void note(const std::string &line);

  StepRunner &session_;
  const DataLoader &train_;
  const DataLoader *eval_;
  TrainerOptions opts_;
  std::FILE *log_;
  int64_t step_ = 0;
  uint64_t position_ = 0;
  uint64_t seed_ = 0;
  int64_t tokensPerStep_ = 0, samplesPerStep_ = 1;
  /// The plan's current dynamic loss scale, if it has one.
  std::optional<double> lossScale() const;
  bool lossScaling_ = false;
  bool hasLr_ = false, hasGradNorm_ = false, hasAccuracy_ = false;
  bool barShown_ = false;
  double lastBarTime_ = -1;
  std::vector<StepResult> history_;
  std::string lastCheckpoint_;
  double checkpointSeconds_ = 0, resumeSeconds_ = 0;
  int64_t checkpointBytes_ = 0, resumeBytes_ = 0;
  /// The training batch being drawn in the background (at most one call of
  /// train_.batch() runs at a time: a direct call waits for it first).
  std::future<Expected<std::vector<NamedTensor>>> prefetch_;
  uint64_t prefetchIndex_ = 0, prefetchSeed_ = 0;
};

} // namespace dlopt::rt
