//===- Calibration.h - Every efficiency constant of the cost model --------===//
//
// The one place where the cost and memory models keep their empirical
// constants. Defaults are documented in docs/cost-model.md; a user replaces
// any subset with measured values from a JSON file.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/support/Status.h"

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace dlopt::planner {

using rt::Expected;
using rt::Status;

/// One measured GEMM of a gemm_table: rows m, columns n, inner dim k, and
/// its achieved FLOP/s over the device's peak.
struct GemmTableRow {
  double m = 0, n = 0, k = 0, efficiency = 0;
};

/// One measured convolution of a conv_table: the forward's im2col GEMM
/// dims (rows m = output channels per group, columns n = N * OH * OW,
/// inner dim k = C / groups * KH * KW) and the FLOP/s (2 m n k over the
/// time) of the CPU backend's three convolution kernels at that shape.
struct ConvTableRow {
  double m = 0, n = 0, k = 0;
  double forward = 0, gradInput = 0, gradFilter = 0; ///< FLOP/s
};

enum class Collective {
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  Broadcast,
  SendRecv
};

/// One measured collective of a collective_table (nccl-tests' figures,
/// read by `dlopt-calibrate --nccl-tests`): `collective` over `ranks` ranks
/// on `nodes` nodes with at most `ranksPerNode` on one, moving `bytes` as
/// nccl-tests counts them (CostModel::commTime's convention), took
/// `seconds`.
struct CollectiveTableRow {
  Collective collective = Collective::AllReduce;
  int ranks = 0, nodes = 0, ranksPerNode = 0;
  double bytes = 0, seconds = 0;
  /// The device it was measured on, as nccl-tests names it ("NVIDIA H100
  /// 80GB HBM3"); empty when not known. Reports compare it with the
  /// cluster's.
  std::string device;
};
/// The collective_table name of a collective, nccl-tests' spelling without
/// "_perf": all_reduce, all_gather, reduce_scatter, alltoall, broadcast;
/// nullptr for send/recv, which the table does not hold.
const char *collectiveTableName(Collective c);
/// The collective of a collective_table name; false for other names.
bool collectiveFromTableName(std::string_view name, Collective &c);

/// What limits a memory-bound op where the calibration measured op rates
/// (op_gb_s; dlopt-calibrate times one op of each class on a CPU): plain
/// streams (adds, ReLU, copies, casts, reductions), transcendental
/// elementwise ops (exp, tanh, GELU, SiLU, sigmoid, pow, dropout's random
/// numbers), row norms (layer_norm, rms_norm), softmaxes and the cross
/// entropy, batch norms, and pooling. Gradients take their op's class.
enum class MemoryClass { Stream, Transcendental, Norm, Softmax, BatchNorm, Pool };
constexpr size_t kNumMemoryClasses = 6;
/// The op_gb_s key of a class: "stream", "transcendental", "norm",
/// "softmax", "batch_norm", "pool".
const char *memoryClassName(MemoryClass c);
/// The class of a dlopt op, by its mnemonic with or without "dlopt.";
/// ops not listed above are streams.
MemoryClass memoryClassOf(std::string_view op);
/// The rows a memory-bound op pays its class's op_row_ns for, from its
/// result's shape: for the pool class the planes (every dim but the last
/// two: images x channels); 0 for the other classes, whose per-row cost is
/// not measured.
double memoryRowsOf(std::string_view op,
                    const std::vector<int64_t> &resultShape);

/// Empirical constants. Efficiencies are fractions of a hardware peak in
/// (0, 1]; times are seconds; sizes are bytes. JSON keys are the snake_case
/// names listed by calibrationKeys().
struct Calibration {
  // Compute: achievable fraction of the dtype's peak FLOP/s per op kind.
  double matmulLargeEfficiency = 0.80; ///< matmul_large_efficiency
  double matmulSmallEfficiency = 0.50; ///< matmul_small_efficiency
  double matmulSmallFlops = 1e10;      ///< matmul_small_flops: below = small
  // GEMMs on a GPU whose SM count is known: tile and wave quantization
  // (docs/cost-model.md, "GEMM efficiency by shape"). The size classes
  // above price GEMMs on devices without an SM count.
  double gemmPeakEfficiency = 0.84; ///< gemm_peak_efficiency
  double gemmTileM = 128;           ///< gemm_tile_m: output rows per CTA
  double gemmTileN = 256;           ///< gemm_tile_n: output columns per CTA
  double gemmKOverheadSteps = 3;    ///< gemm_k_overhead_steps
  double gemmUnalignedFactor = 0.19; ///< gemm_unaligned_factor
  double gemmThinTile = 64;         ///< gemm_thin_tile: rows of a thin tile
  double gemmMaxSplitK = 16;        ///< gemm_max_split_k: 1 = no split-K
  /// gemm_table: GEMM efficiency measured on a grid of shapes (every
  /// combination of its m, n and k values), for devices without an SM
  /// count; dlopt-calibrate writes it on CPUs (docs/cost-model.md, "GEMM
  /// efficiency by shape on a CPU"). Empty: the size classes.
  std::vector<GemmTableRow> gemmTable;
  /// conv_table: conv2d, conv2d_grad_input and conv2d_grad_filter measured
  /// on a grid of shapes (every combination of its m, n and k values),
  /// rates in FLOP/s (the JSON holds GFLOP/s), for devices without an SM
  /// count; dlopt-calibrate writes it on CPUs, whose convolutions need not
  /// run at their im2col GEMMs' speed (oneDNN's do not). Empty: a conv2d
  /// is priced as its im2col GEMMs.
  std::vector<ConvTableRow> convTable;
  /// collective_table: collectives measured on the cluster (nccl-tests'
  /// sweeps); a collective over a group of the same ranks, nodes and ranks
  /// per node is priced from them (docs/cost-model.md, "Measured
  /// collectives"), others by the model. Empty: the model everywhere.
  std::vector<CollectiveTableRow> collectiveTable;
  double attentionEfficiency = 0.60;   ///< attention_efficiency
  /// attention_efficiency was given (a calibration file, dlopt-calibrate's
  /// measurement): it then overrides the GPU's own (GpuSpec).
  bool attentionEfficiencyGiven = false;
  double elementwiseEfficiency = 0.50; ///< elementwise_efficiency (FLOP side)
  double memoryBandwidthEfficiency = 0.90; ///< memory_bandwidth_efficiency
  double backwardFlopsRatio = 2.0;         ///< backward_flops_ratio (bwd / fwd)
  /// The optimizer update's bytes read + written per second (optimizer_gb_s,
  /// stored in bytes/s); 0 prices it at the memory bandwidth times
  /// memory_bandwidth_efficiency. dlopt-calibrate measures it on CPUs.
  double optimizerBandwidth = 0;
  /// op_gb_s: bytes read + written per second of memory-bound ops of each
  /// class (index: MemoryClass) with their data in the cache; 0 where not
  /// measured (such ops run at the memory bandwidth times
  /// memory_bandwidth_efficiency). Stored in bytes/s.
  std::array<double, kNumMemoryClasses> opBandwidth{};
  /// op_backward_ratio: a memory-bound op's backward time over its
  /// forward's, per class (index: MemoryClass), from its gradient kernel;
  /// 0 where not measured (such ops take backward_flops_ratio).
  std::array<double, kNumMemoryClasses> opBackwardRatio{};
  /// op_row_ns: a memory-bound op's fixed cost per row of its class, in
  /// seconds (stored; nanoseconds in the file), on top of its bytes at the
  /// op_gb_s rate; 0 where not measured. The pool class's row is an output
  /// plane (one image's channel): a 2x2 pool over 7x7 planes pays it four
  /// times as often per byte as one over 14x14 planes. dlopt-calibrate
  /// measures it by timing the class's op at two plane sizes.
  std::array<double, kNumMemoryClasses> opRowSeconds{};
  /// cache_mib: bytes read + written up to which a memory-bound op with an
  /// op_gb_s rate keeps its data in the cache; above it (and at any size
  /// when 0) it runs no faster than the memory bandwidth.
  double cacheBytes = 0;
  bool hasOpBandwidth(MemoryClass c) const {
    return opBandwidth[size_t(c)] > 0;
  }
  bool hasAnyOpBandwidth() const {
    for (double r : opBandwidth)
      if (r > 0)
        return true;
    return false;
  }

  // Communication: NCCL bus-bandwidth efficiency and per-call latency.
  double intraNodeBusEfficiency = 0.80;  ///< intra_node_bus_efficiency
  double interNodeBusEfficiency = 0.85;  ///< inter_node_bus_efficiency
  double collectiveLaunchLatency = 8e-6; ///< collective_launch_latency_us
  /// nccl_protocols: 1 prices ring, tree and NVLS with NCCL's three
  /// protocols (docs/cost-model.md, "NCCL's protocols"); 0 with one
  /// protocol of collective_launch_latency_us plus a link hop a step.
  double ncclProtocols = 1; ///< nccl_protocols (0 or 1)
  bool ncclProtocolModel() const { return ncclProtocols != 0; }
  /// NVLink SHARP: the share of the per-direction NVLink bandwidth the
  /// NVLS kernels reach on their busier direction (docs/cost-model.md,
  /// "NVLS").
  double nvlsEfficiency = 0.68; ///< nvls_efficiency

  // Overlap of communication with compute.
  double gradOverlapEfficiency = 0.80; ///< grad_overlap_efficiency
  double p2pOverlapEfficiency = 0.90;  ///< p2p_overlap_efficiency
  /// What a collective running beside compute takes from it (ZeRO-3's
  /// per-layer gathers and reduce-scatters): the SMs its CTAs hold (one
  /// per NCCL channel; NCCL's maintainers: 16 on a DGX with 8 NICs, and 16
  /// NVLS channels on Hopper), and HBM traffic of this many bytes per
  /// byte it moves over its links ("at least 2x", NVIDIA/nccl#1428).
  double commCtas = 16;    ///< comm_ctas
  double commHbmRatio = 2; ///< comm_hbm_ratio

  // Process layout (in-graph vs between-graph), host side.
  double kernelLaunchSeconds = 4e-6;    ///< kernel_launch_us: host cost/launch
  double inGraphLaunchContention = 0.05; ///< in_graph_launch_contention
  double processHostBytes = 4.0 * (1ull << 30); ///< process_host_gib
  double deviceHostStagingBytes = 2.0 * (1ull << 30); ///< host_staging_gib

  // Memory: what a device holds beyond tensors the model names.
  double runtimeReservedBytes = 1.0 * (1ull << 30); ///< runtime_reserved_gib
  double ncclBufferBytes = 64.0 * (1ull << 20);     ///< nccl_buffer_mib
  double gradBucketBytes = 25.0 * (1ull << 20);     ///< grad_bucket_mib
  double fragmentationFraction = 0.05;              ///< fragmentation_fraction

  /// Checks every constant's range; the message names the JSON key.
  Status validate() const;
  /// Writes every constant, in file units, as a JSON object.
  std::string toJson() const;
  /// Writes only the collective_table, as a JSON object: a file to give
  /// with --calibration after (or without) another, which it leaves as it
  /// is.
  std::string collectiveTableJson() const;
};

/// One calibration key: its JSON name, unit and meaning (for docs and errors).
struct CalibrationKey {
  std::string name;
  std::string unit;
  std::string meaning;
};
const std::vector<CalibrationKey> &calibrationKeys();

/// Applies the keys present in the JSON object `text` on top of `base`.
/// Unknown keys, non-numbers and out-of-range values are errors that name the
/// key; `source` prefixes messages (a file name).
Expected<Calibration> parseCalibration(std::string_view text,
                                       std::string_view source,
                                       const Calibration &base = {});
/// Reads a JSON calibration file over the defaults (or `base`).
Expected<Calibration> loadCalibration(const std::string &path,
                                      const Calibration &base = {});

} // namespace dlopt::planner
