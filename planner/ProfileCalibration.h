//===- ProfileCalibration.h - Calibration from a dlopt-run profile --------===//
//
// dlopt-run --profile-json writes every instruction's time, calls, types,
// FLOPs and bytes. calibrateFromProfile() turns such profiles, taken on one
// device, into the calibration constants that price dlopt's own kernels on
// it: the GEMMs' speed against the GEMM model (gemm_peak_efficiency, or the
// size classes' efficiencies on a device without SMs), the forward
// attention's FLOP rate (attention_efficiency), the memory-bound kernels'
// bandwidth (memory_bandwidth_efficiency) and the host's issue time per
// instruction (kernel_launch_us). dlopt-calibrate --from-profile reads the
// files and writes the calibration (docs/dlopt-calibrate.md).
//
// Plain C++; no MLIR or LLVM headers.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Calibration.h"
#include "planner/Cluster.h"
#include "planner/CostModel.h"
#include "runtime/support/Status.h"

#include <string>
#include <string_view>
#include <vector>

namespace dlopt::planner {

/// One profiled instruction: its op, its first result's dtype ("bf16"),
/// whether it moves data between ranks (the runtime op table's mark), its
/// calls and their seconds over the profiled runs, the FLOPs and bytes of
/// one call, and a matmul's GEMM shape.
struct ProfiledInstr {
  std::string op, dtype;
  bool communication = false;
  int64_t calls = 0;
  double seconds = 0, flops = 0, bytes = 0;
  bool hasGemm = false;
  GemmShape gemm;
};

/// One dlopt-run --profile-json file.
struct ProfileSamples {
  std::string backend;
  bool deviceTimed = false; ///< device times between events (cuda)
  int64_t runs = 0, instructionsPerRun = 0;
  double issueSeconds = 0; ///< host time until the last issue, all runs
  std::vector<ProfiledInstr> instrs;
};

/// Parses a --profile-json document; errors name `source` and the field.
Expected<ProfileSamples> parseProfile(std::string_view text,
                                      std::string_view source);
/// Reads and parses a --profile-json file (bounded size).
Expected<ProfileSamples> loadProfile(const std::string &path);

struct ProfileCalibration {
  Calibration calibration; ///< the defaults with the derived constants
  std::vector<std::string> lines; ///< what was measured and derived
};

/// The constants the profiles (all of one device, `gpu`) give; the others
/// keep their defaults. GEMMs: gemm_peak_efficiency (or, on a device
/// without SMs, matmul_large/small_efficiency) scaled by the model's time
/// over the measured time of every matmul; attention_efficiency: the
/// forward attentions' FLOPs per second over the dtype's peak (the GPU's
/// own where none ran); memory_bandwidth_efficiency: the bytes per second
/// of every instruction but matmuls, attention, convolutions and
/// communication over the memory bandwidth; op_gb_s and op_backward_ratio
/// per memory class: the forward bytes per second of the ops the planner
/// prices one by one (not fusions, views, constants or the optimizer's
/// update) and their gradient kernels' time over their forwards' where
/// both ran; kernel_launch_us: the host's
/// issue time per instruction, from device-timed profiles only. Each
/// efficiency is clamped to (0, 1]. An error when no profile has a timed
/// instruction.
Expected<ProfileCalibration>
calibrateFromProfile(const std::vector<ProfileSamples> &profiles,
                     const GpuSpec &gpu);

} // namespace dlopt::planner
