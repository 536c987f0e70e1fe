//===- OpPricing.h - Pricing one op-level candidate ------------*- C++ -*-===//
//
// What the op-level search (planner/OpSearch.cpp) prices a candidate by: the
// solved strategy problem of one (tp, dp, micro-batch size) and what it
// costs per op (Solved), the pricing context (Ctx: an op's forward and step
// time on a rank, its GEMMs by shape where measured), and `price`, which
// turns a solved problem and a configuration into a candidate's step time
// and memory (pipeline stages, gradient sync, ZeRO, host dispatch). The
// search builds and solves the problems and walks the configurations; this
// prices them, as planner/TransformerPricing does for the transformer
// search.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/OpSearch.h"

#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

namespace dlopt::planner::oppricing {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Memory weights for the constrained ILP of one (pp, zero).
struct MemWeights {
  double paramPerElem = 0; ///< bytes per parameter element on a device
  double activation = 0;   ///< factor on per-micro-batch activation bytes
  double budget = kInf;
};

/// A solved strategy problem for one (tp, dp, mbs) and what it costs per op.
struct Solved {
  int t = 1, dp = 1;
  int64_t mbs = 1, m = 1;
  GraphGeometry geo;
  std::vector<std::vector<Strategy>> strategies; ///< per op id
  std::vector<std::vector<Layout>> argLayouts;   ///< per arg (params)
  std::vector<int> nodeOfOp, nodeOfArg;
  ShardingProblem problem;
  SolveResult solve;
  // Derived from the choice, per op id:
  std::vector<int> chosen;          ///< strategy index (-1: not a node)
  std::vector<double> compute;      ///< per micro-batch (fwd + bwd)
  std::vector<double> mbComm;       ///< per micro-batch
  std::vector<double> mbCalls;      ///< collectives per micro-batch
  std::vector<double> stepCalls;    ///< collectives per step
  std::vector<double> stepComm;     ///< per step (parameter gradients)
  std::vector<double> activation;   ///< stored bytes per micro-batch
  std::vector<double> workingSet;   ///< bytes of one op's operands + result
  std::vector<Layout> resultLayout; ///< per op id
  std::vector<Layout> paramLayout;  ///< per arg
  std::vector<std::vector<int>> paramsOf; ///< per op id: param args it uses
  bool constrained = false;
  MemWeights weights; ///< when constrained

  Solved(const GraphSummary &g, int64_t microBatch, double floatBytes)
      : geo(g, microBatch, floatBytes) {}
};

/// The fraction of the parameters' elements that the backward pass reads
/// (ZeRO-3 gathers those again there; the others only in the forward
/// pass): a parameter is read by the backward pass when an op that is not
/// linear in each operand separately (matmul, mul, a norm, a convolution,
/// ...) uses it beside an operand that needs a gradient (one that depends
/// on a parameter). A first layer's weight (its input is data), a bias
/// (an add) and an untied embedding table (a gather) are not.
double backwardReadFraction(const GraphSummary &g);

struct Ctx {
  const GraphSummary &g;
  const Cluster &cluster;
  const CostModel &cost;
  const SearchOptions &opt;
  CommPricer pricer;
  GpuSpec gpu{};
  double capacity = 0;
  bool train = true;
  double ratio = 2;
  double floatBytes = 4;
  std::vector<int> fwdOps; ///< non-backward op ids in order
  SolveOptions solveOptions{};
  OpSearchStats *stats = nullptr;
  /// backwardReadFraction(g): what ZeRO-3 gathers again for the backward.
  double bwdReadFraction = 1;
  /// What host dispatch is priced on: GPUs a node, the most constrained
  /// host (mostConstrainedHost).
  int gpusPerNode = 1;
  HostSpec host{};

  double roofline(OpKind kind, double flops, double bytes) const {
    if (flops <= 0 && bytes <= 0)
      return 0;
    OpCost op{kind, opt.precision, std::max(0.0, flops), std::max(0.0, bytes)};
    auto e = cost.computeTime(op, gpu);
    return e ? e->time : 0;
  }

  /// A memory-bound op of class `cls` (CostModel::elementwiseTime: at the
  /// class's measured rate where the calibration has one).
  double elementwise(MemoryClass cls, double flops, double bytes,
                     double rows = 0) const {
    if (flops <= 0 && bytes <= 0)
      return 0;
    auto e = cost.elementwiseTime(cls, std::max(0.0, flops),
                                  std::max(0.0, bytes), opt.precision, gpu,
                                  rows);
    return e ? e->time : 0;
  }

  /// Forward time of `op` run by strategy `st` on one of t ranks, moving
  /// `bytes` (opBytes): its FLOPs divided by the strategy's divisor against
  /// those bytes. On GPUs matmuls keep the size classes here: pricing them
  /// by their shape on the rank (CostModel::gemmTime) swings strategy
  /// choices on wave quantization that the tile menu overstates for
  /// single-wave grids (docs/cost-model.md, "GEMM efficiency by shape").
  /// Where gemmsByShape(), a matmul is its rank's GEMM (rankGemm) and a
  /// conv2d at the measured convolution grid's rate for its rank's im2col
  /// GEMM dims (conv_table) or, without one, as that GEMM (rankConvGemms)
  /// at the GEMM grid's efficiency. Other ops are memory-bound by their class
  /// (memoryClassOf).
  double forwardTime(const Solved &s, const OpNode &op, const Strategy &st,
                     double flops, double bytes, int t) const;

  /// Whether matmuls are priced by their shape on the rank: a device
  /// without an SM count whose calibration measured a GEMM grid
  /// (gemm_table; a CPU calibrated by dlopt-calibrate). The wave
  /// quantization that keeps GPUs on the size classes does not arise.
  bool gemmsByShape() const {
    return gpu.sms <= 0 && !cost.calibration().gemmTable.empty();
  }

  double gemm(const GemmShape &g, double bytes) const {
    auto e = cost.gemmTime(g, bytes, opt.precision, gpu);
    return e ? e->time : 0;
  }

  /// The step time of `op` under `st` whose forward takes `fwd`: fwd, and
  /// when training its backward. A matmul priced by shape (gemmsByShape)
  /// adds its gradient GEMMs at their own shapes: dA = dC B^T (m x k,
  /// inner n) when A needs a gradient, dB = A^T dC (k x n, inner m) when B
  /// does; dlopt-autodiff emits no GEMM for an operand without one (data,
  /// a first layer's input). A conv2d priced by shape adds its input
  /// gradient's GEMM (when x needs one) and its filter gradient's (when the
  /// filter does). A memory-bound op takes its class's op_backward_ratio
  /// where the calibration measured one; other ops take
  /// backward_flops_ratio (or the graph's measured ratio) times their
  /// forward.
  double stepTime(const Solved &s, const OpNode &op, const Strategy &st,
                  double fwd, int t) const;
};

/// The GEMM one of t ranks runs for matmul `op` under `st`, from the
/// micro-batch shapes with each operand's split dim divided by t: [m, k] x
/// [k, n], `batch` times. Leading dims of A fold into m when B is a plain
/// matrix (the CPU kernel runs one tall GEMM then). nullopt for shapes it
/// cannot read.
std::optional<GemmShape> rankGemm(const Solved &s, const OpNode &op,
                                  const Strategy &st, int t);

/// The GEMMs one of t ranks runs for conv2d `op` under `st`
/// (runtime/cpu/Conv.cpp lowers each group to im2col and a GEMM over all
/// the images' output pixels): the forward W_g [og, ckk] x col [ckk, cols],
/// the input gradient W_g^T dy_g [ckk, cols] (inner og) and the filter
/// gradient dy_g col^T [og, ckk] (inner cols), each `groups` times, with
/// og = O / groups, ckk = C / groups * KH * KW, cols = N * OH * OW from the
/// operands' shapes on the rank. nullopt for shapes it cannot read.
struct ConvGemms {
  GemmShape forward, gradInput, gradFilter;
};
std::optional<ConvGemms> rankConvGemms(const Solved &s, const OpNode &op,
                                       const Strategy &st, int t);

/// Operand `i` of `op` on one of t ranks under `st`: its micro-batch shape
/// with the strategy's split dim divided by t (rounded up).
std::vector<int64_t> rankOperandShape(const Solved &s, const OpNode &op,
                                      const Strategy &st, size_t i, int t);

/// HBM bytes one of t ranks moves for `op` under strategy `st`: each
/// operand and result #0 at its layout's share (a replicated weight is read
/// whole by every rank, a split one 1/t, a partial sum is written whole),
/// plus the results past #0 (batch-norm running stats, ...) whole. A
/// reshape moves nothing.
double opBytes(const Solved &s, const OpNode &op, const Strategy &st, int t);

/// Bytes of model state per parameter element: the parameter, and when
/// training its gradient, the optimizer's moments and the master copy.
double stateBytesPerElem(const SearchOptions &opt, bool train);

/// One optimizer step over `elems` parameters: a memory-bound elementwise
/// pass over the bytes the fused update moves (optimizerStepBytesPerParam;
/// CostModel::optimizerTime: at the calibrated optimizer_gb_s when
/// measured).
double optimizerTime(const Ctx &c, double elems);

/// A priced candidate and its pipeline stages.
struct Priced {
  OpCandidate cand;
  std::vector<int> starts; ///< stage starts over units
  std::vector<int> unitStart; ///< unit -> first index into fwdOps
  bool byLayer = false;
};

/// Units of the partition: runs of equal layer marks when the graph has
/// marks and enough of them, else single ops. Returns start positions in
/// fwdOps (plus the end).
std::vector<int> makeUnits(const Ctx &c, int pp, bool *byLayer);

/// Model chunks per stage: v for the interleaved schedule, else 1.
int chunksPerStage(const TrainingConfig &cfg, bool train);

/// One of ZeRO-3's gather buckets on a stage, in forward order: its
/// collectives' times and bytes, and the compute beside which the next
/// one's run (its ops' forward and backward).
struct Zero3Bucket {
  double gather = 0, gatherBytes = 0; ///< forward gather
  double backwardGather = 0,
         backwardGatherBytes = 0;                   ///< what the backward reads
  double reduceScatter = 0, reduceScatterBytes = 0; ///< its gradients
  double forward = 0, backward = 0;                 ///< its ops' compute
};

/// What a stage's ZeRO-3 collectives expose per micro-batch.
struct Zero3Exposure {
  double forward = 0;        ///< the parameter gathers, forward
  double backward = 0;       ///< gathers and reduce-scatters, backward
  double backwardGather = 0; ///< the gathers' share of `backward`
};

/// ZeRO-3 bucket by bucket, one bucket prefetched, as the transformer
/// search prices its layers (docs/cost-model.md, "ZeRO-3"). Forward: the
/// first bucket's gather shows whole, each later one what the previous
/// bucket's compute (at `efficiency`) does not hide or what it takes from
/// that compute, `lossPerSecond(time, bytes)` of each second beside it,
/// whichever is larger. Backward, buckets in reverse: the last bucket's
/// gather shows whole, then beside each bucket's backward the next
/// bucket's gather and the previous bucket's reduce-scatter share the
/// links, and the first bucket's reduce-scatter follows the last backward.
Zero3Exposure zero3BucketExposure(
    const std::vector<Zero3Bucket> &buckets, double efficiency,
    const std::function<double(double time, double bytes)> &lossPerSecond);

/// Prices one candidate from a solved strategy problem: memory, step time
/// and the stages (their starts over the partition's units).
Priced price(Ctx &c, const Solved &s, TrainingConfig cfg);

} // namespace dlopt::planner::oppricing
