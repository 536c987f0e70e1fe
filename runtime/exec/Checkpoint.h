//===- Checkpoint.h - Training checkpoints as safetensors files -----------===//
//
// A checkpoint holds every param and state of the session's rank and the
// training loop's position, so a resumed run continues exactly (on the CPU
// backend bit for bit). Format (docs/training-runtime.md): a safetensors
// file whose tensors are named like the params and states, with metadata
//
//   format "dlopt-checkpoint", version "1", model, fingerprint,
//   step, data_position, data_epoch, data_source, rng, rng_seed,
//   world_size, rank, tensors (JSON: name -> {"role", "sharding"})
//
// Loading checks everything against the model before anything is bound, so
// a checkpoint of another model, or a corrupt one, changes nothing.
//
// Sharded checkpoints (a multi-rank World, in one process or many): a
// directory step-NNNNNN/ with one rank-RRRRR.safetensors per rank that
// writes blocks (each distinct block of every param and state once, by the
// lowest rank holding it) and index.json, which records the loop position,
// the model's fingerprint, every file's size and, per tensor, its role,
// global dtype and shape and where each block lies. The files are written
// into step-NNNNNN.tmp/ and the directory is renamed into place by the
// first process once every process has written its shards, so a checkpoint
// directory is complete or absent. Either kind loads into any plan and any
// process layout of the same model: blocks are put together into global
// tensors, which the runner splits its own way (resharding).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/exec/StepRunner.h"
#include "runtime/support/Status.h"

#include <cstdint>
#include <map>
#include <string>

namespace dlopt::rt {

inline constexpr int kCheckpointVersion = 1;

/// The training loop's position, saved next to the tensors.
struct CheckpointState {
  int64_t step = 0;          ///< training steps completed
  uint64_t dataPosition = 0; ///< batches the training data has served
  uint64_t dataEpoch = 0;    ///< informational: passes over the data so far
  uint64_t rngSeed = 0;      ///< seed of the counter-based data generator
  std::string dataSource;    ///< informational: "synthetic", "tokens:FILE", ...
};

/// Hex FNV-1a 64 of "kind name type\n" over params then states, in order:
/// two plans agree on it iff their checkpoints are interchangeable.
std::string modelFingerprint(const Executable &exe);

/// Step counts stay below 2^53, so they are exact wherever they are printed
/// or stored as JSON numbers; checkpoints and --steps beyond it are refused.
inline constexpr int64_t kMaxTrainingStep = int64_t(1) << 53;

/// "step-000123.safetensors".
std::string checkpointFileName(int64_t step);
/// checkpointFileName, or "step-000123" (a directory) for a runner that
/// writes sharded checkpoints.
std::string checkpointName(int64_t step, bool sharded);

/// Writes every param and state the runner holds, atomically: one file of
/// global tensors, or a sharded directory when runner.shardedCheckpoints()
/// (then every process of a World calls it; `path` names the directory).
Status saveCheckpoint(StepRunner &session, const std::string &path,
                      const CheckpointState &state);

/// Checks a checkpoint's metadata on its own (format, version, world size,
/// the loop position, the data generator) and returns the saved position;
/// `where` prefixes messages. loadCheckpoint calls it before it compares the
/// tensors with the model.
Expected<CheckpointState>
parseCheckpointMetadata(const std::map<std::string, std::string> &meta,
                        const std::string &where = "");

/// Reads `path` (a file, or a sharded checkpoint's directory), checks that
/// it is a dlopt checkpoint of this model (every param and state present
/// with the same dtype and shape, nothing else; for a directory every shard
/// present, complete and covering its tensors), then binds the tensors and
/// returns the saved position. On error nothing in the session has changed.
Expected<CheckpointState> loadCheckpoint(StepRunner &session,
                                         const std::string &path);

} // namespace dlopt::rt
