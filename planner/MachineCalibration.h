//===- MachineCalibration.h - Calibration and cluster from measurements ---===//
//
// dlopt-calibrate measures the machine it runs on (GEMMs, attention,
// streaming bandwidth, per-op dispatch, all-reduce between in-process ranks
// and between MPI processes) and turns the samples into a calibration file
// and a cluster file for the planner. This is the second half: plain
// arithmetic on the samples, so it is unit-tested without timing anything.
// docs/cost-model.md, "Calibrating a machine", states every formula.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Calibration.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dlopt::planner {

struct GemmSample {
  int64_t m = 0, n = 0, k = 0;
  double seconds = 0;
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

/// One all-reduce of `bytes` per rank over `ranks` ranks.
struct AllReduceSample {
  int ranks = 0;
  double bytes = 0, seconds = 0;
};

struct MachineSamples {
  std::string name = "calibrated";
  int devices = 1;          ///< devices per node; samples ran this many at once
  int threadsPerDevice = 1; ///< the kernel pool the devices shared
  int hostCores = 0;
  double hostMemoryBytes = 0;
  std::vector<GemmSample> gemmF32, gemmBf16, gemmF16;
  /// Multiply-adds from which the backend splits a GEMM over its threads
  /// (the CPU backend's gemmSplitMultiplyAdds): the boundary of the GEMM
  /// size classes. Required (> 0).
  double gemmSplitMultiplyAdds = 0;
  /// f32 GEMMs on a grid (every combination of a few m, n and k): the
  /// calibration's gemm_table. Optional.
  std::vector<GemmSample> gemmGrid;
  /// f32 convolutions on a grid (every combination of a few m, n and k,
  /// the forward's im2col GEMM dims): the time of conv2d,
  /// conv2d_grad_input and conv2d_grad_filter at each. The calibration's
  /// conv_table. Optional.
  struct ConvSample {
    int64_t m = 0, n = 0, k = 0;
    double forwardSeconds = 0, gradInputSeconds = 0, gradFilterSeconds = 0;
    double flops() const { return 2.0 * double(m) * double(n) * double(k); }
  };
  std::vector<ConvSample> convGrid;
  /// What ran the convolutions ("oneDNN 2.6.3 (avx512)", "im2col +
  /// sgemm"): the grid holds its rates. Printed only.
  std::string convImplementation;
  double attentionFlops = 0, attentionSeconds = 0; ///< f32 forward
  /// Memory-bound kernels: bytes read + written and their time. Samples
  /// whose data outgrows the caches give the device's memory bandwidth
  /// (their median); `cached` ones, whose data stays in the cache, give
  /// the rate of their op's class (op_gb_s; the median per class).
  struct StreamSample {
    std::string op;
    double bytes = 0, seconds = 0;
    bool cached = false;
    /// The op's gradient kernel on the same shape (0: none timed); over
    /// `seconds`, its class's backward ratio (op_backward_ratio).
    double gradientSeconds = 0;
    /// Its rows (memoryRowsOf): two cached samples of a class at
    /// different rows and bytes give its op_row_ns and op_gb_s.
    double rows = 0;
  };
  std::vector<StreamSample> streams;
  /// The device's share of the last-level cache (bytes; 0 unknown).
  double cacheBytes = 0;
  /// The fused AdamW update: bytes read + written and their time.
  double optimizerBytes = 0, optimizerSeconds = 0;
  double dispatchSeconds = 0; ///< one tiny op through the kernel dispatch
  std::vector<AllReduceSample> inProcess; ///< ranks as threads
  /// Collectives over the in-process ranks by size (all-reduce, all-gather,
  /// reduce-scatter; one node): the calibration's collective_table.
  std::vector<CollectiveTableRow> collectives;
  std::vector<AllReduceSample> mpi;       ///< ranks as processes
};

/// Least-squares y = intercept + slope x with weights 1 / y^2 (relative
/// errors; intercept clamped at >= 0, the slope refitted through the origin
/// then).
struct LineFit {
  double intercept = 0, slope = 0;
};
LineFit fitLine(const std::vector<std::pair<double, double>> &xy);

/// Link figures of a ring all-reduce fitted to samples of one rank count
/// n: t = 2(n-1) alpha + 2(n-1)/n S / B.
struct LinkFit {
  int ranks = 0;
  double bandwidth = 0; ///< B, bytes/s
  double latency = 0;   ///< alpha, seconds per ring step
};
/// Fits the samples of the largest rank count among them.
Expected<LinkFit> fitAllReduce(const std::vector<AllReduceSample> &samples);

struct MachineCalibration {
  Calibration calibration;
  std::string clusterJson;        ///< a cluster file (docs/cluster.md)
  std::vector<std::string> lines; ///< what was measured and derived
};

/// The calibration and the cluster of one node of this machine. GEMM
/// samples are required; the others refine their defaults.
Expected<MachineCalibration> calibrateMachine(const MachineSamples &s);

} // namespace dlopt::planner
