//===- CostModel.h - Time of compute and communication on a cluster -------===//
//
// Analytical estimates, every formula written down in docs/cost-model.md:
// a roofline per op, alpha-beta models per collective and algorithm on the
// link each communicator spans, and the exposed part of overlapped
// communication. Efficiency constants come from Calibration.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Calibration.h"
#include "planner/Cluster.h"

#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

namespace dlopt::planner {

/// How well an op uses the GPU's arithmetic units.
enum class OpKind { Matmul, Attention, Elementwise };
const char *opKindName(OpKind k);

/// What one op costs on one device (after sharding).
struct OpCost {
  OpKind kind = OpKind::Matmul;
  Precision precision = Precision::BF16;
  double flops = 0; ///< floating-point operations
  double bytes = 0; ///< HBM bytes read plus written
};

/// One GEMM (or `batch` independent ones of the same shape):
/// [m, k] x [k, n].
struct GemmShape {
  double m = 0, n = 0, k = 0, batch = 1;
  double flops() const { return 2 * m * n * k * batch; }
};

/// The efficiency of an m x n x k GEMM (rows, columns, inner dim) from a
/// gemm_table grid (Calibration::gemmTable, non-empty and a full grid):
/// linear in log2 of each dim between the grid's points, trilinear over
/// the three; a dim above the grid takes its largest point's value, and a
/// dim below the smallest point costs as long as the smallest point (the
/// efficiency times dim / smallest: kernels work in whole register tiles).
double gemmTableEfficiency(const std::vector<GemmTableRow> &table, double m,
                           double n, double k);

/// The three kernels of a convolution.
enum class ConvPass { Forward, GradInput, GradFilter };

/// The FLOP/s of `pass` for a convolution whose forward im2col GEMM is
/// m x n x k, from a conv_table grid (Calibration::convTable, non-empty and
/// a full grid), interpolated as gemmTableEfficiency interpolates.
double convTableRate(const std::vector<ConvTableRow> &table, ConvPass pass,
                     double m, double n, double k);

struct ComputeEstimate {
  double time = 0;        ///< max(computeTime, memoryTime)
  double computeTime = 0; ///< flops / (peak * efficiency)
  double memoryTime = 0;  ///< bytes / (HBM bandwidth * efficiency)
  bool memoryBound() const { return memoryTime > computeTime; }
};

/// collectiveName: "all-reduce", "all-gather", ... (Collective is in
/// Calibration.h, whose collective_table names it).
const char *collectiveName(Collective c);

enum class CommAlgorithm {
  Auto,
  Ring,
  Tree,
  Hierarchical,
  Direct,
  Nvls,     ///< NVLink SHARP inside one node
  NvlsTree, ///< NVLS inside each node, a tree across nodes (all-reduce)
  Pat,      ///< NCCL's PAT: all-gather, reduce-scatter, one rank a node
  /// The calibration's collective_table: measured on a group of this
  /// shape (docs/cost-model.md, "Measured collectives").
  Measured
};
const char *algorithmName(CommAlgorithm a);

/// NCCL's protocols (docs/cost-model.md, "NCCL's protocols"): LL (8-byte
/// flag-and-data lines: lowest latency, half the bandwidth), LL128
/// (128-byte lines), Simple (bulk copies behind a fence and a flag: full
/// bandwidth, the largest latency a step). None: an algorithm priced
/// without them (nccl_protocols 0, all-to-all, send/recv, hierarchical).
enum class CommProtocol { None, LL, LL128, Simple };
const char *protocolName(CommProtocol p);

/// Which physical link carried the bandwidth term.
enum class LinkKind { None, IntraNode, Network };
const char *linkName(LinkKind l);

struct CommEstimate {
  double time = 0;          ///< latencyTerm + bandwidthTerm
  double latencyTerm = 0;   ///< launch + steps * alpha
  double bandwidthTerm = 0; ///< bytes moved / effective bandwidth
  CommAlgorithm algorithm = CommAlgorithm::Ring; ///< the one used
  CommProtocol protocol = CommProtocol::None;    ///< NCCL's, when priced
  LinkKind link = LinkKind::None;                ///< the bottleneck link
};

/// How activations are recomputed in the backward pass: nothing; the
/// attention core's softmax and dropout results and what tp and cp gather
/// (selective); every op of the layer but its matmuls and attention, whose
/// results stay (elementwise: norms, activations, rope, adds, the gathers);
/// that and every second matmul of the layer (alternate: torchtitan's
/// per-op selective checkpointing); every op of the layer (full).
/// In order of what they re-run, least first (the search's ties prefer
/// the earlier).
enum class RecomputePolicy { None, Selective, Elementwise, Alternate, Full };
const char *recomputeName(RecomputePolicy r);

/// What a window of compute is made of, as shares of its time, for what a
/// collective running beside it takes from it (CostModel::overlapLoss).
struct ComputeMix {
  /// Matmuls, convolutions and attention: the kernels bound by the SMs.
  double gemm = 1;
  /// Of those, the GEMM library's matmuls (cuBLAS), whose kernels are
  /// persistent on GPUs with GpuSpec::persistentGemms; at most `gemm`.
  double matmul = 1;
  /// One of those matmuls' mean duration, seconds (0: unknown; a
  /// collective is then taken to outlast them, CostModel::twoWaveLoss).
  double gemmSeconds = 0;
};

class CostModel {
public:
  explicit CostModel(Calibration calibration = {});
  const Calibration &calibration() const { return cal_; }

  /// The optimizer update moving `bytes` (read + written) with `flops`: an
  /// elementwise roofline whose memory side runs at optimizer_gb_s when the
  /// calibration measured it, else like any elementwise op.
  Expected<ComputeEstimate> optimizerTime(double flops, double bytes,
                                          Precision precision,
                                          const GpuSpec &gpu) const;

  /// Seconds a memory-bound op of class `cls` spends moving `bytes` (read
  /// + written) on `gpu` over `rows` rows of its class (memoryRowsOf): at
  /// the class's op_gb_s rate plus op_row_ns per row where the calibration
  /// measured them, and then no faster than the memory bandwidth times
  /// memory_bandwidth_efficiency once the bytes exceed cache_mib (at any
  /// size when cache_mib is 0); without a rate, at that bandwidth.
  /// docs/cost-model.md, "Memory-bound ops by class".
  double memoryTime(MemoryClass cls, double bytes, const GpuSpec &gpu,
                    double rows = 0) const;
  /// The roofline of a memory-bound op of class `cls`: computeTime of an
  /// elementwise op whose memory side is memoryTime(cls, bytes, rows).
  Expected<ComputeEstimate> elementwiseTime(MemoryClass cls, double flops,
                                            double bytes, Precision precision,
                                            const GpuSpec &gpu,
                                            double rows = 0) const;

  /// Roofline time of one op on `gpu`. Fails if the GPU has no peak for the
  /// op's precision or the counts are negative.
  Expected<ComputeEstimate> computeTime(const OpCost &op,
                                        const GpuSpec &gpu) const;

  /// The efficiency applied to the op's FLOP side.
  double computeEfficiency(const OpCost &op, const GpuSpec &gpu) const;

  /// The FLOP efficiency of a GEMM of this shape on `gpu` in `precision`:
  /// with the GPU's SM count known, tile and wave quantization and the
  /// fixed cost of a tile against its K loop, and the slow kernels of
  /// unaligned dims (docs/cost-model.md, "GEMM efficiency by shape"):
  ///   gemm_peak_efficiency * max over tiles (m n batch / (waves sms tm tn))
  ///     * k / (k + gemm_k_overhead_steps * 128 B / e)
  ///     * (gemm_unaligned_factor if m, n or k is not a multiple of 16 B)
  /// with waves = ceil(ceil(m/tm) ceil(n/tn) batch / sms) over the tiles
  /// 128x256, 256x128 and 128x128 (gemm_tile_m/n) and e the bytes of an
  /// element of `precision`; without it, the measured gemm_table where the
  /// calibration has one (gemmTableEfficiency), else the size classes.
  double gemmEfficiency(const GemmShape &g, Precision precision,
                        const GpuSpec &gpu) const;
  /// The time of one kernel of a convolution whose forward im2col GEMM is
  /// `forward` (m = output channels per group, n = N*OH*OW, k = C/groups*
  /// KH*KW, batch = groups): its FLOPs, 2 m n k batch, at the conv_table's
  /// rate for that pass. nullopt on a device with an SM count, without a
  /// conv_table, or for an empty shape.
  std::optional<double> convTime(ConvPass pass, const GemmShape &forward,
                                 const GpuSpec &gpu) const;
  /// Roofline time of a GEMM moving `bytes` of HBM traffic.
  Expected<ComputeEstimate> gemmTime(const GemmShape &g, double bytes,
                                     Precision precision,
                                     const GpuSpec &gpu) const;

  /// Forward + backward (+ recomputed forward) time of a layer whose
  /// forward takes `forward` seconds. `rerunForward` is the part of the
  /// forward that selective or elementwise recomputation re-executes.
  double trainingTime(double forward, RecomputePolicy policy,
                      double rerunForward = 0) const;

  /// Time of `collective` over `group` with `bytes` as in nccl-tests: the
  /// buffer size per rank for all-reduce and broadcast, the full (gathered)
  /// size for all-gather and reduce-scatter, the send buffer per rank for
  /// all-to-all, the message for send/recv. Auto takes the calibration's
  /// measurement where its collective_table has the collective over a
  /// group of this shape (measured()), else the fastest algorithm that
  /// applies. Algorithms that do not apply to a collective are errors
  /// (Measured where the table has no such group).
  Expected<CommEstimate>
  commTime(Collective collective, double bytes, const CommGroup &group,
           CommAlgorithm algorithm = CommAlgorithm::Auto) const;

  /// Communication left on the critical path when `comm` overlaps with
  /// `overlappable` compute: max(0, comm - efficiency * overlappable).
  static double exposed(double comm, double overlappable, double efficiency);
  /// Gradient sync of `comm` seconds for `gradBytes` of gradients,
  /// overlapped with the backward pass in buckets of grad_bucket_mib: it
  /// runs beside the backward at grad_overlap_efficiency of its speed, and
  /// the last bucket, complete only when the backward ends, is exposed
  /// whole: max(comm - efficiency * backward, lastBucketShare * comm). What
  /// runs beside the backward slows it: `lostPerSecond` of each second of
  /// overlap (contention for SMs and memory bandwidth), which shows when
  /// it is larger than the exposure.
  double exposedGradSync(double comm, double backwardCompute,
                         double gradBytes, double lostPerSecond = 0) const {
    const double e = cal_.gradOverlapEfficiency;
    return std::max(
        {exposed(comm, backwardCompute, e), lastBucketShare(gradBytes) * comm,
         std::min(comm, e * backwardCompute) * lostPerSecond});
  }
  /// The share of `gradBytes` of gradients in the last bucket:
  /// min(1, grad_bucket_mib / gradBytes); 0 without buckets (0 MiB) or
  /// gradients.
  double lastBucketShare(double gradBytes) const {
    return cal_.gradBucketBytes > 0 && gradBytes > 0
               ? std::min(1.0, cal_.gradBucketBytes / gradBytes)
               : 0.0;
  }
  /// Seconds of compute lost per second a collective moving
  /// `linkBytesPerSecond` over its links runs beside it on `gpu`: its CTAs
  /// hold C = comm_ctas of the SMs (at most half), which slows the SM-bound
  /// kernels (`mix.gemm` of the compute) by C / (SMs - C); on a GPU whose
  /// GEMM library runs persistent kernels (GpuSpec::persistentGemms), its
  /// matmuls (`mix.matmul`) launch one CTA per SM and run their last C
  /// CTAs as a second wave, in twice their time (slowed by 1). Its HBM
  /// traffic, comm_hbm_ratio times its link rate, takes that share u of
  /// the memory bandwidth from the memory-bound rest, which slows by
  /// u / (1 - u) (u at most 0.9). A compute slowed by x loses x / (1 + x)
  /// of each second. 0 on a device without SMs (the CPU backend).
  /// `seconds` is the collective's duration: beside persistent GEMMs of
  /// `mix.gemmSeconds` each the share lost is twoWaveLoss's (0 or an
  /// unknown GEMM duration: one half, the long-collective limit).
  double overlapLoss(ComputeMix mix, double linkBytesPerSecond,
                     const GpuSpec &gpu, double seconds = 0) const;
  /// The share of a collective's `seconds` that persistent GEMMs of
  /// `gemm` seconds each lose beside it: their launches wait for SMs the
  /// collective holds, so a GEMM it overlaps by tau < gemm ends tau later,
  /// and one it outlasts runs in two waves, twice its time. Beginning at a
  /// GEMM's start (a collective waits for the persistent GEMM holding
  /// every SM to end): n = floor(K / 2g) GEMMs in two waves, then the
  /// rest r = K - 2 n g, so the lost time is n g + min(r, g). 1 for a
  /// collective shorter than one GEMM, towards 1/2 for a long one.
  static double twoWaveLoss(double seconds, double gemm);
  /// overlapLoss of a gradient sync `collective` of `bytes` over `ranks`
  /// taking `seconds`, at its own link rate: (n-1)/n of its bytes per
  /// second each way for a reduce-scatter or all-gather, twice that for an
  /// all-reduce. 0 when it takes no time.
  double syncLoss(Collective collective, double bytes, int ranks,
                  double seconds, ComputeMix mix, const GpuSpec &gpu) const;
  /// Pipeline send/recv overlapped with a micro-batch's compute.
  double exposedP2P(double comm, double microBatchCompute) const {
    return exposed(comm, microBatchCompute, cal_.p2pOverlapEfficiency);
  }

  /// The collective_table's figure for `collective` of `bytes` over a
  /// group of g's size, nodes and ranks a node; nullopt when the table has
  /// none. Between two measured sizes the time is interpolated linearly
  /// in bytes; below the smallest it is the smallest's time; above the
  /// largest, the largest's bandwidth (time in proportion to bytes). The
  /// measurements are first made non-decreasing in bytes: a size never
  /// costs more than a larger one measured (it could be sent padded).
  std::optional<CommEstimate> measured(Collective collective, double bytes,
                                       const CommGroup &g) const;

private:
  /// max(flops / (peak * efficiency()), bytes / usable bandwidth), with
  /// the errors of computeTime; efficiency() is asked only when there are
  /// FLOPs.
  Expected<ComputeEstimate>
  roofline(const OpCost &op, const GpuSpec &gpu,
           const std::function<double()> &efficiency) const;
  CommEstimate ring(Collective c, double bytes, const CommGroup &g) const;
  CommEstimate tree(Collective c, double bytes, const CommGroup &g) const;
  CommEstimate hierarchical(Collective c, double bytes,
                            const CommGroup &g) const;
  CommEstimate direct(Collective c, double bytes, const CommGroup &g) const;
  /// NVLink SHARP all-reduce, all-gather or reduce-scatter inside one
  /// NVSwitch node (nvlsApplies()).
  CommEstimate nvls(Collective c, double bytes, const CommGroup &g) const;
  /// NCCL's NVLSTree all-reduce over several nodes (nvlsTreeApplies()).
  CommEstimate nvlsTree(double bytes, const CommGroup &g) const;
  /// NCCL's PAT all-gather or reduce-scatter over one rank a node
  /// (patApplies()).
  CommEstimate pat(double bytes, const CommGroup &g) const;

  Calibration cal_;
  /// collective_table by (collective, ranks, nodes, ranks a node): its
  /// (bytes, seconds) sorted by bytes, seconds non-decreasing.
  std::map<std::tuple<int, int, int, int>,
           std::vector<std::pair<double, double>>>
      measuredCurves_;
};

} // namespace dlopt::planner
