//===- TransformerPricing.h - Pricing transformer candidates ---*- C++ -*-===//
//
// Internal to the transformer search (Search.cpp): the per-layer costs of
// a model (GroupCost, LayerTimes), the search context that caches them
// (Ctx), and the functions that price one candidate: its stage split, its
// memory, its step time and its communication (price), and the simulator
// input for it. TransformerPricing.cpp has the definitions;
// docs/cost-model.md the formulas.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Search.h"
#include "planner/SearchUtil.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace dlopt::planner::pricing {


/// One matmul of a group, per sample, with how tensor parallelism splits it
/// (TransformerSharding's strategy at tp = 2).
struct GroupGemm {
  GemmShape perSample; ///< m per sample when `broadcast`, else batch
  bool broadcast = true; ///< a weight shared by every row: one GEMM of rows
  enum class Split { None, N, K, Vocab } split = Split::None;
};

/// Per-sample costs of one group by kind.
struct GroupCost {
  /// The group's matmuls, priced one by one with tile and wave
  /// quantization (CostModel::gemmEfficiency); empty for graphs without an
  /// op list, which price mmFlops/mmBytes in one roofline.
  std::vector<GroupGemm> gemms;
  double mmFlops = 0, mmBytes = 0, attFlops = 0, attBytes = 0, otFlops = 0,
         otBytes = 0;
  /// The part of the elementwise work on [s, h] tensors (layer norms,
  /// residual adds, dropouts) that tensor parallelism replicates unless
  /// sequence parallelism splits it.
  double repFlops = 0, repBytes = 0;
  double ops = 0; ///< kernels per forward
  /// The group's memory-bound ops one by one, per sample (bytes in the
  /// activation precision), and whether tensor parallelism replicates
  /// each (unless sequence parallelism splits it): priced by class where
  /// the calibration measured op rates (op_gb_s). Empty for graphs without
  /// an op list, and for layers whose replicated ops are not known
  /// (tpRolesOf), which keep the totals above.
  struct MemoryOp {
    MemoryClass cls = MemoryClass::Stream;
    double flops = 0, bytes = 0;
    bool replicated = false;
    /// An eager op sequence's (eagerKernels) backward bytes, which price
    /// its backward in place of the ratio; 0 for other ops.
    double backwardBytes = 0;
  };
  std::vector<MemoryOp> memoryOps;
  /// Eager norms and rotary embeddings (eagerKernels): their backward
  /// bytes beyond backward_flops_ratio times their forward bytes, per
  /// sample, all and the part tensor parallelism replicates.
  double eagerBackwardExtraBytes = 0, eagerBackwardExtraRepBytes = 0;
};

/// Passes over an [s, h] activation one layer makes outside its matmuls and
/// attention (two layer norms read+write 4, two residual adds 6, two
/// dropouts with their masks 5) and the FLOPs per element they do, for
/// graphs without an op list; otherwise the replicated ops are counted
/// (tpRolesOf).
constexpr double kReplicatedPasses = 15;
constexpr double kReplicatedFlopsPerElement = 20;

/// Forward seconds selective recomputation re-runs per stage: it re-runs
/// softmax and dropout results, which blocks with dlopt's fused attention
/// (its backward recomputes the probabilities itself) do not have (under
/// unfused attention, LayerTimes::selectivePrefix), and the
/// tp and cp gathers, which tpCallsPerLayer and cpComm count. Without sp
/// or cp it keeps what `none` keeps (activationBytesPerLayer), so the free
/// search skips it there unless attention is unfused. Elementwise
/// recomputation re-runs the layers' memory-bound forward
/// (LayerTimes::elementwisePrefix).
constexpr double kSelectiveRerun = 0;

/// Forward seconds of each layer (and pre/post) for one (mbs, tp, cp, sp).
struct LayerTimes {
  std::vector<double> fwd;       ///< per layer, in mark order
  std::vector<double> prefix;    ///< prefix sums of fwd
  std::vector<double> opsPrefix; ///< prefix sums of kernels per forward
  double pre = 0, post = 0;
  /// What the backward GEMMs priced at their own shapes (input and weight
  /// gradients), and memory-bound ops at their class's op_backward_ratio,
  /// take beyond backward_flops_ratio times their forward:
  /// prefix sums per layer, and the pre and post groups'.
  std::vector<double> bwdGemmPrefix;
  double preBwdGemm = 0, postBwdGemm = 0;
  /// Prefix sums per layer of the forward's memory-bound part (all but
  /// the matmuls and attention): what elementwise recomputation re-runs.
  std::vector<double> elementwisePrefix;
  /// Prefix sums per layer of the forward's fused attention (0 under
  /// unfused attention, whose score products are library GEMMs): the
  /// SM-bound kernels that are not the GEMM library's (ComputeMix).
  std::vector<double> fusedAttentionPrefix;
  /// Prefix sums per layer of the library GEMMs a layer's forward
  /// launches (its matmuls, and unfused attention's two score products),
  /// and the pre and post groups': ComputeMix::gemmSeconds.
  std::vector<double> gemmCountPrefix;
  double preGemms = 0, postGemms = 0;
  /// Prefix sums per layer of the matmuls alternate recomputation re-runs
  /// besides (Ctx::groupAlternateGemmTime).
  std::vector<double> alternateGemmPrefix;
  /// Prefix sums per layer of the kernels elementwise and alternate
  /// recomputation launch again (Ctx::rerunKernels), for host dispatch.
  std::vector<double> elementwiseOpsPrefix, alternateOpsPrefix;
  /// Prefix sums per layer of what selective recomputation re-runs: under
  /// unfused attention its whole core, Q K^T through P V (Korthikanti et
  /// al.); 0 with fused attention (kSelectiveRerun).
  std::vector<double> selectivePrefix;
  /// Prefix sums per layer of the kernels selective recomputation launches
  /// again (unfused attention's core; 0 with fused attention).
  std::vector<double> selectiveOpsPrefix;

  /// One micro-batch through the layer ranges of a stage, with the pre
  /// group on the first stage and the post group on the last: its forward
  /// time and, training with `recompute`, its forward + backward time
  /// (CostModel::trainingTime plus the backward GEMMs' own shapes).
  struct Stage {
    double fwd = 0, train = 0;
    /// The memory-bound part of `fwd` (all but matmuls and attention).
    double elementwise = 0;
    /// The fused attention in `fwd`.
    double attention = 0;
    /// The library GEMMs `fwd` launches.
    double gemms = 0;
    /// The forward's shares in matmuls and attention, and in library
    /// GEMMs (all of it but the fused attention), with one GEMM's mean
    /// time.
    ComputeMix mix() const {
      if (!(fwd > 0))
        return {};
      const double gemm = std::clamp(1 - elementwise / fwd, 0.0, 1.0);
      const double matmul = std::clamp(gemm - attention / fwd, 0.0, gemm);
      return {gemm, matmul, gemms > 0 ? matmul * fwd / gemms : 0.0};
    }
  };
  Stage stage(const std::vector<std::pair<int64_t, int64_t>> &ranges,
              bool first, bool last, const CostModel &cost,
              RecomputePolicy recompute) const {
    double f = 0, bwdGemm = 0, elementwise = 0, alternate = 0, selective = 0,
           attention = 0, gemms = 0;
    for (auto [a, b] : ranges) {
      f += prefix[b] - prefix[a];
      if (!selectivePrefix.empty())
        selective += selectivePrefix[b] - selectivePrefix[a];
      bwdGemm += bwdGemmPrefix[b] - bwdGemmPrefix[a];
      elementwise += elementwisePrefix[b] - elementwisePrefix[a];
      attention += fusedAttentionPrefix[b] - fusedAttentionPrefix[a];
      gemms += gemmCountPrefix[b] - gemmCountPrefix[a];
      alternate += alternateGemmPrefix[b] - alternateGemmPrefix[a];
    }
    if (first) {
      f += pre;
      bwdGemm += preBwdGemm;
      gemms += preGemms;
    }
    if (last) {
      f += post;
      bwdGemm += postBwdGemm;
      gemms += postGemms;
    }
    const double rerun = recompute == RecomputePolicy::Elementwise ? elementwise
                         : recompute == RecomputePolicy::Alternate
                             ? elementwise + alternate
                             : kSelectiveRerun + selective;
    return {f, cost.trainingTime(f, recompute, rerun) + bwdGemm, elementwise,
            attention, gemms};
  }
};

/// Where the pipeline stages of a candidate land on a heterogeneous
/// cluster: stage st holds ranks [st*S, (st+1)*S), S = tp*cp*dp.
struct StagePlacement {
  std::vector<int> kind;        ///< GPU kind per stage (its slowest)
  std::vector<double> capacity; ///< smallest device memory per stage
  bool uniform = true;          ///< every stage has one kind and capacity
};

struct Shape {
  int dp, tp, pp, cp;
  bool operator<(const Shape &o) const {
    return std::tie(dp, tp, pp, cp) < std::tie(o.dp, o.tp, o.pp, o.cp);
  }
};

/// Tensor-parallel collectives of one layer per micro-batch, as
/// dlopt-partition and dlopt-recompute issue them: 2 per pass (an
/// all-reduce, or under sequence parallelism an all-gather and a
/// reduce-scatter of the same activation), forward and backward; full
/// recomputation re-runs the forward collectives the backward pass needs,
/// which are all but the one producing the layer's output (its input is
/// kept): one all-reduce, or two all-gathers and one reduce-scatter.
/// Selective recomputation under sequence parallelism re-runs the two
/// all-gathers (of the norm outputs, whose shards it keeps).
struct TpCalls {
  double allReduce = 0, allGather = 0, reduceScatter = 0;
  double total() const { return allReduce + allGather + reduceScatter; }
};
inline TpCalls tpCallsPerLayer(const TrainingConfig &cfg, bool train) {
  TpCalls n;
  if (cfg.tp <= 1)
    return n;
  double passes = train ? 2 : 1;
  bool full = train && cfg.recompute == RecomputePolicy::Full;
  bool regather = train && cfg.recompute != RecomputePolicy::None;
  if (cfg.sequenceParallel) {
    n.allGather = 2 * passes + (regather ? 2 : 0);
    n.reduceScatter = 2 * passes + (full ? 1 : 0);
  } else {
    n.allReduce = 2 * passes + (full ? 1 : 0);
  }
  return n;
}

/// The forward pass's share of a training layer's tensor-parallel
/// collectives (2 of them, 4 under sequence parallelism); 0 without tp.
inline double tpForwardShare(const TrainingConfig &cfg) {
  const TpCalls n = tpCallsPerLayer(cfg, true);
  return n.total() > 0 ? (cfg.sequenceParallel ? 4 : 2) / n.total() : 0;
}

/// Bytes one rank sends across a pipeline stage boundary per micro-batch
/// and direction: the [s/cp, b, h] activation (`boundary`), its sequence
/// shard under sequence parallelism (dlopt-pipeline sends the shard and
/// gathers it on the receiving stage).
inline double ppSendBytes(const TrainingConfig &cfg, double boundary) {
  return cfg.sequenceParallel && cfg.tp > 1 ? boundary / cfg.tp : boundary;
}

struct Ctx {
  const GraphSummary &graph;
  const Cluster &cluster;
  const CostModel &cost;
  const SearchOptions &opt;
  TransformerSpec spec{};
  GpuSpec gpu{}; ///< the slowest GPU kind
  double capacity = 0; ///< the smallest device memory
  /// Heterogeneous clusters: the distinct GPU kinds, the kind of each node
  /// group and the first rank of each group. Pipeline stages are placed on
  /// consecutive ranks (rank order tp, cp, dp, pp), so a stage lives on the
  /// groups its rank range touches.
  bool hetero = false;
  /// Every layer costs the same (a stage's time depends on its layer count
  /// only), which lets the heterogeneous split use the faster count search.
  bool identicalLayers = false;
  std::vector<GpuSpec> kinds{};
  std::vector<int> groupKind{};
  std::vector<int> groupFirstRank{};
  std::map<std::pair<int, int>, StagePlacement> placementCache{};
  /// Layer splits for time alone, by (mbs, tp, cp, sp, recompute, pp,
  /// placement: stage ranks on a heterogeneous cluster, else 0, and the
  /// ZeRO-3 replicas whose per-layer collectives a stage exposes, else 0).
  std::map<std::tuple<int64_t, int, int, bool, int, int, int, int>,
           std::vector<int64_t>>
      splitCache{};
  double modelBatch = 1;
  double kvFraction = 1; ///< key/value heads / query heads
  int gpusPerNode = 1;
  HostSpec host{}; ///< the most constrained host
  std::vector<GroupCost> layers{};
  GroupCost pre{}, post{};
  std::map<std::tuple<int64_t, int, int, bool, int>, LayerTimes> timeCache{};
  std::map<std::pair<int, int>, Expected<CommGroup>> groupCache{};

  const GpuSpec &kindSpec(int kind) const {
    return kind < 0 || kind >= int(kinds.size()) ? gpu : kinds[kind];
  }

  /// The precision `kind` runs in: fp8 runs only the GEMMs in fp8
  /// (Transformer Engine's recipe); attention and the elementwise work
  /// stay in bf16.
  Precision precisionOf(OpKind kind) const {
    return kind == OpKind::Matmul || opt.precision != Precision::FP8
               ? opt.precision
               : Precision::BF16;
  }

  double roofline(OpKind kind, double flops, double bytes,
                  int gpuKind = -1) const {
    if (flops <= 0 && bytes <= 0)
      return 0;
    OpCost op{kind, precisionOf(kind), flops, bytes};
    auto e = cost.computeTime(op, kindSpec(gpuKind));
    return e ? e->time : 0;
  }

  /// A memory-bound op of class `cls` (CostModel::elementwiseTime).
  double elementwise(MemoryClass cls, double flops, double bytes,
                     int gpuKind = -1) const {
    if (flops <= 0 && bytes <= 0)
      return 0;
    auto e = cost.elementwiseTime(cls, flops, bytes,
                                  precisionOf(OpKind::Elementwise),
                                  kindSpec(gpuKind));
    return e ? e->time : 0;
  }

  /// The shape one matmul of a group runs on a tp rank for `scale`
  /// samples: a shared weight's rows grow with the samples, a batched
  /// matmul's batch does; column-parallel splits n, row-parallel k, the LM
  /// head its vocabulary when tp divides it.
  GemmShape rankShape(const GroupGemm &gm, double scale, int tp) const {
    GemmShape g = gm.perSample;
    if (gm.broadcast)
      g.m *= scale;
    else
      g.batch *= scale;
    using Split = GroupGemm::Split;
    const bool vocabSplit = gm.split == Split::Vocab &&
                            std::fmod(g.n, double(tp)) == 0;
    if (gm.split == Split::N || vocabSplit)
      g.n /= tp;
    else if (gm.split == Split::K)
      g.k /= tp;
    return g;
  }

  /// HBM bytes of the GEMM: both operands and the result, once each.
  double gemmBytes(const GroupGemm &gm, const GemmShape &g) const {
    const double weights = g.k * g.n * (gm.broadcast ? 1 : g.batch);
    return (g.m * g.k * g.batch + weights + g.m * g.n * g.batch) *
           opt.bytes.activationBytes;
  }

  /// fp8 (Transformer Engine's recipe): the cast of one GEMM operand of
  /// `elements` to fp8 with its transpose, the copy the other pass's GEMM
  /// reads (TE's fused cast-transpose, with the amax): read 2 bytes, write
  /// 1 + 1, a memory-bound stream. The forward casts each GEMM's input,
  /// the backward its output gradient; weights are cast once per step
  /// (MemoryModel's fp8 copy), not priced. 0 in other precisions.
  double fp8CastTime(double elements, int gpuKind) const {
    if (opt.precision != Precision::FP8 || elements <= 0)
      return 0;
    return elementwise(MemoryClass::Stream, elements, 4 * elements, gpuKind);
  }

  /// Time of one matmul of a group for `scale` samples on a tp rank (under
  /// fp8 with its input's cast).
  double gemmTime(const GroupGemm &gm, double scale, int tp,
                  int gpuKind) const {
    GemmShape g = rankShape(gm, scale, tp);
    auto e = cost.gemmTime(g, gemmBytes(gm, g), opt.precision,
                           kindSpec(gpuKind));
    return (e ? e->time : 0) + fp8CastTime(g.m * g.k * g.batch, gpuKind);
  }

  /// The backward of one matmul of a group for `scale` samples on a tp
  /// rank: the input gradient dy [m, n] x W^T [n, k] and the weight
  /// gradient x^T [k, m] x dy [m, n] (summed over every row of a shared
  /// weight), each priced at its own shape, less backward_flops_ratio
  /// times the forward that trainingTime charges for it; under fp8 the
  /// cast of dy in place of that ratio times the input's cast.
  double gemmBackwardExtra(const GroupGemm &gm, double scale, int tp,
                           int gpuKind) const {
    GemmShape g = rankShape(gm, scale, tp);
    const double bytes = gemmBytes(gm, g);
    GemmShape dgrad{g.m, g.k, g.n, g.batch};
    GemmShape wgrad{g.k, g.n, g.m, g.batch};
    const GpuSpec &gpu = kindSpec(gpuKind);
    auto f = cost.gemmTime(g, bytes, opt.precision, gpu);
    auto d = cost.gemmTime(dgrad, bytes, opt.precision, gpu);
    auto w = cost.gemmTime(wgrad, bytes, opt.precision, gpu);
    if (!f || !d || !w)
      return 0;
    const double ratio = cost.calibration().backwardFlopsRatio;
    return d->time + w->time - ratio * f->time +
           fp8CastTime(g.m * g.n * g.batch, gpuKind) -
           ratio * fp8CastTime(g.m * g.k * g.batch, gpuKind);
  }

  /// Unfused attention (PrecisionConfig::unfusedAttention) of one layer for
  /// `scale` samples (each s/cp queries against s keys) on a tp rank, with
  /// n = scale (a/t) s^2 score elements of e bytes (docs/cost-model.md,
  /// "Unfused attention"):
  ///   forward   Q K^T (batch scale a/t, s x s x d), a fused
  ///             scale-mask-softmax (read and write the scores, the softmax
  ///             class), dropout of the probabilities when the model has
  ///             dropout (read, write, a 1-byte mask; a stream), P V (s x d
  ///             x s); each GEMM moves its operands and result once
  ///   backward  dP = dO V^T and dV = P^T dO, the dropout's backward (read
  ///             the gradient and the mask, write), the softmax's (read the
  ///             probabilities and their gradient, write), dQ = dS K and dK
  ///             = dS^T Q.
  struct UnfusedAttention {
    double gemms = 0;  ///< the forward's two GEMMs
    double memory = 0; ///< the forward's softmax and dropout
    double core = 0;   ///< what selective recomputation re-runs: all of it
    double backward = 0;
  };
  UnfusedAttention unfusedAttention(double scale, int tp, int gpuKind) const {
    UnfusedAttention u;
    if (spec.heads <= 0 || spec.seqLen <= 0 || spec.hidden <= 0)
      return u;
    const double s = double(spec.seqLen), d = double(spec.hidden) / spec.heads;
    const double batch = scale * double(spec.heads) / tp;
    const double e = opt.bytes.activationBytes;
    const double n = batch * s * s;
    const GpuSpec &gpu = kindSpec(gpuKind);
    const Precision pr = precisionOf(OpKind::Attention);
    auto gemm = [&](double m, double nn, double k) {
      GemmShape g{m, nn, k, batch};
      auto t = cost.gemmTime(g, (m * k + k * nn + m * nn) * batch * e, pr, gpu);
      return t ? t->time : 0.0;
    };
    const double scores = gemm(s, s, d);  // Q K^T; dP = dO V^T likewise
    const double context = gemm(s, d, s); // P V; dV, dQ, dK likewise
    const double softmax =
        elementwise(MemoryClass::Softmax, 5 * n, 2 * e * n, gpuKind);
    const double dropout =
        spec.dropout
            ? elementwise(MemoryClass::Stream, 2 * n, (2 * e + 1) * n, gpuKind)
            : 0;
    u.gemms = scores + context;
    u.memory = softmax + dropout;
    // Megatron-LM checkpoints the whole core attention (Q K^T through the
    // P V product; Korthikanti et al. 2022, section 4.2).
    u.core = u.gemms + u.memory;
    const double softmaxGrad =
        elementwise(MemoryClass::Softmax, 3 * n, 3 * e * n, gpuKind);
    u.backward = scores + 3 * context + dropout + softmaxGrad;
    return u;
  }
  bool unfused(const GroupCost &g) const {
    return opt.bytes.unfusedAttention && g.attFlops > 0;
  }

  /// What a group's backward takes beyond backward_flops_ratio times its
  /// forward: its GEMMs at their own shapes (gemmBackwardExtra) and, where
  /// its memory-bound ops are priced one by one (memoryOpsPriced), each
  /// one's class's op_backward_ratio in place of that ratio.
  double groupBackwardExtra(const GroupCost &g, double scale, int tp, bool sp,
                            int gpuKind) const {
    double x = 0;
    for (const GroupGemm &gm : g.gemms)
      x += gemmBackwardExtra(gm, scale, tp, gpuKind);
    if (unfused(g)) {
      const UnfusedAttention u = unfusedAttention(scale, tp, gpuKind);
      x += u.backward -
           cost.calibration().backwardFlopsRatio * (u.gemms + u.memory);
    }
    const Calibration &cal = cost.calibration();
    if (memoryOpsPriced(g)) {
      for (const GroupCost::MemoryOp &o : g.memoryOps) {
        if (o.backwardBytes > 0) {
          // An eager sequence: autograd's backward kernels.
          GroupCost::MemoryOp b = o;
          b.bytes = o.backwardBytes;
          b.flops = 0;
          x += memoryOpTime(b, scale, tp, sp, gpuKind) -
               cal.backwardFlopsRatio * memoryOpTime(o, scale, tp, sp, gpuKind);
          continue;
        }
        const double r = cal.opBackwardRatio[size_t(o.cls)];
        if (r > 0)
          x += memoryOpTime(o, scale, tp, sp, gpuKind) *
               (r - cal.backwardFlopsRatio);
      }
    } else if (g.eagerBackwardExtraBytes != 0) {
      // The extra can be negative (an eager rotation's backward moves what
      // its forward does, less than twice it): time per byte, signed.
      const double bytes =
          (g.eagerBackwardExtraBytes - g.eagerBackwardExtraRepBytes) * scale /
              tp +
          g.eagerBackwardExtraRepBytes * scale / (sp ? tp : 1);
      const double perByte =
          roofline(OpKind::Elementwise, 0, 1e9, gpuKind) / 1e9;
      x += bytes * perByte;
    }
    return x;
  }

  /// Whether a group's memory-bound ops are priced one by one: it has them
  /// and the calibration measured op rates (op_gb_s).
  bool memoryOpsPriced(const GroupCost &g) const {
    return !g.memoryOps.empty() && cost.calibration().hasAnyOpBandwidth();
  }

  /// Forward time of one memory-bound op of a group for `scale` samples,
  /// divided by tp unless tp replicates it without sequence parallelism.
  double memoryOpTime(const GroupCost::MemoryOp &o, double scale, int tp,
                      bool sp, int gpuKind) const {
    const double div = o.replicated && !sp ? 1 : tp;
    return elementwise(o.cls, o.flops * scale / div, o.bytes * scale / div,
                       gpuKind);
  }

  /// Forward time of a group for `scale` samples of s/cp tokens each, with
  /// its matmuls, attention and split elementwise work divided by tp and the
  /// replicated part divided by tp only under sequence parallelism.
  double groupTime(const GroupCost &g, double scale, int tp, bool sp,
                   int gpuKind) const {
    return groupMatmulAttentionTime(g, scale, tp, gpuKind) +
           groupElementwiseTime(g, scale, tp, sp, gpuKind);
  }

  /// A group's matmuls and attention for `scale` samples on a tp rank.
  double groupMatmulAttentionTime(const GroupCost &g, double scale, int tp,
                                  int gpuKind, int cp = 1) const {
    double att = unfused(g) ? unfusedAttention(scale, tp, gpuKind).gemms
                            : fusedAttentionTime(g, scale, tp, gpuKind, cp);
    double mm = 0;
    if (g.gemms.empty())
      mm = roofline(OpKind::Matmul, g.mmFlops * scale / tp,
                    g.mmBytes * scale / tp, gpuKind);
    for (const GroupGemm &gm : g.gemms)
      mm += gemmTime(gm, scale, tp, gpuKind);
    return mm + att;
  }

  /// The library GEMMs a group's forward launches: its matmuls (one
  /// where the graph gave no op list but matmul FLOPs), and unfused
  /// attention's two score products.
  double gemmCount(const GroupCost &g) const {
    double n =
        g.gemms.empty() ? (g.mmFlops > 0 ? 1 : 0) : double(g.gemms.size());
    return n + (unfused(g) ? 2 : 0);
  }

  /// Context parallelism as dlopt-partition applies it gives each cp rank
  /// a contiguous block of the sequence, so under a causal mask rank r's
  /// queries see (r + 1/2) / cp of the keys it holds where a balanced
  /// split sees half: the last rank does 2 - 1/cp times the average, and
  /// the layer runs at its pace (its collectives wait for it). Fused
  /// attention skips the masked tiles; unfused attention computes them.
  static double cpCausalImbalance(int cp) {
    return cp > 1 ? 2.0 - 1.0 / cp : 1.0;
  }

  /// A layer's fused attention on a tp rank for `scale` samples (1/cp of
  /// the queries each), on the last cp rank (cpCausalImbalance).
  double fusedAttentionTime(const GroupCost &g, double scale, int tp,
                            int gpuKind, int cp) const {
    return cpCausalImbalance(cp) * roofline(OpKind::Attention,
                                            g.attFlops * scale / tp,
                                            g.attBytes * scale / tp, gpuKind);
  }

  /// The matmuls of a layer that alternate recomputation re-runs for
  /// `scale` samples on a tp rank (dlopt-recompute's `alternate`): of its
  /// matmuls in program order the second, fourth, ..., less the last (a
  /// pre-norm layer's last matmul feeds only the residual add, whose
  /// backward reads nothing) and, under tp, less the row-parallel ones,
  /// whose reduced output is kept. A graph without an op list: half its
  /// matmul time.
  double groupAlternateGemmTime(const GroupCost &g, double scale, int tp,
                                int gpuKind) const {
    if (g.gemms.empty())
      return 0.5 * roofline(OpKind::Matmul, g.mmFlops * scale / tp,
                            g.mmBytes * scale / tp, gpuKind);
    double t = 0;
    for (size_t i : alternateRerunGemms(g, tp))
      t += gemmTime(g.gemms[i], scale, tp, gpuKind);
    return t;
  }

  /// The indices into a layer's op list of the matmuls alternate
  /// recomputation re-runs: the second, fourth, ..., not the last, and
  /// under tp not a row-parallel one (groupAlternateGemmTime).
  static std::vector<size_t> alternateRerunGemms(const GroupCost &g, int tp) {
    std::vector<size_t> idx;
    for (size_t i = 1; i + 1 < g.gemms.size(); i += 2)
      if (tp == 1 || g.gemms[i].split != GroupGemm::Split::K)
        idx.push_back(i);
    return idx;
  }

  /// Seconds of compute lost per second a collective moving
  /// `linkBytesPerSecond` runs beside it on GPU kind `gpuKind`
  /// (CostModel::overlapLoss).
  double overlapSlowdown(ComputeMix mix, double linkBytesPerSecond, int gpuKind,
                         double seconds = 0) const {
    return cost.overlapLoss(mix, linkBytesPerSecond, kindSpec(gpuKind),
                            seconds);
  }

  /// Kernels of a layer's forward that elementwise recomputation (or, with
  /// `alternate`, alternate recomputation) launches again: all but its
  /// matmuls and attention, plus the matmuls groupAlternateGemmTime
  /// counts.
  static double rerunKernels(const GroupCost &g, int tp, bool alternate) {
    double n = g.ops - double(g.gemms.size()) - (g.attFlops > 0 ? 1 : 0);
    if (alternate)
      n += double(alternateRerunGemms(g, tp).size());
    return std::max(0.0, n);
  }

  /// The memory-bound part of a group's forward (groupTime less its
  /// matmuls and attention): its ops one by one where they are priced so,
  /// else one roofline over the group's other FLOPs and bytes.
  double groupElementwiseTime(const GroupCost &g, double scale, int tp,
                              bool sp, int gpuKind) const {
    // Unfused attention's softmax and dropout over the scores.
    const double scores =
        unfused(g) ? unfusedAttention(scale, tp, gpuKind).memory : 0;
    if (memoryOpsPriced(g)) {
      double ew = scores;
      for (const GroupCost::MemoryOp &o : g.memoryOps)
        ew += memoryOpTime(o, scale, tp, sp, gpuKind);
      return ew;
    }
    double repDiv = sp ? tp : 1;
    return scores + roofline(OpKind::Elementwise,
                             (g.otFlops - g.repFlops) * scale / tp +
                                 g.repFlops * scale / repDiv,
                             (g.otBytes - g.repBytes) * scale / tp +
                                 g.repBytes * scale / repDiv,
                             gpuKind);
  }

  /// Per-layer forward times of one micro-batch on GPU kind `gpuKind` (-1:
  /// the slowest kind).
  const LayerTimes &times(int64_t mbs, int tp, int cp, bool sp,
                          int gpuKind = -1) {
    auto key = std::make_tuple(mbs, tp, cp, sp, gpuKind);
    auto it = timeCache.find(key);
    if (it != timeCache.end())
      return it->second;
    LayerTimes t;
    // A context-parallel rank holds s/cp tokens of each sample, so every
    // part of the work divides by cp but the fused causal attention of the
    // last rank's contiguous block (cpCausalImbalance).
    double scale = static_cast<double>(mbs) / cp;
    t.prefix.push_back(0);
    t.opsPrefix.push_back(0);
    t.bwdGemmPrefix.push_back(0);
    t.elementwisePrefix.push_back(0);
    t.fusedAttentionPrefix.push_back(0);
    t.gemmCountPrefix.push_back(0);
    t.alternateGemmPrefix.push_back(0);
    t.elementwiseOpsPrefix.push_back(0);
    t.alternateOpsPrefix.push_back(0);
    t.selectivePrefix.push_back(0);
    t.selectiveOpsPrefix.push_back(0);
    for (const GroupCost &g : layers) {
      // Unfused attention launches Q K^T, the softmax, the dropout (with
      // dropout) and P V where the fused kernel is one launch; elementwise
      // recomputation launches its softmax and dropout again, selective
      // all of them.
      const double memoryKernels = unfused(g) ? (spec.dropout ? 2 : 1) : 0;
      const double coreKernels = unfused(g) ? 2 + memoryKernels : 0;
      t.selectivePrefix.push_back(
          t.selectivePrefix.back() +
          (unfused(g) ? unfusedAttention(scale, tp, gpuKind).core : 0));
      t.selectiveOpsPrefix.push_back(t.selectiveOpsPrefix.back() + coreKernels);
      t.elementwiseOpsPrefix.push_back(t.elementwiseOpsPrefix.back() +
                                       rerunKernels(g, tp, false) +
                                       memoryKernels);
      t.alternateOpsPrefix.push_back(t.alternateOpsPrefix.back() +
                                     rerunKernels(g, tp, true) + memoryKernels);
      const double ew = groupElementwiseTime(g, scale, tp, sp, gpuKind);
      const double f = groupMatmulAttentionTime(g, scale, tp, gpuKind, cp) + ew;
      t.elementwisePrefix.push_back(t.elementwisePrefix.back() + ew);
      t.gemmCountPrefix.push_back(t.gemmCountPrefix.back() + gemmCount(g));
      t.fusedAttentionPrefix.push_back(
          t.fusedAttentionPrefix.back() +
          (unfused(g) ? 0 : fusedAttentionTime(g, scale, tp, gpuKind, cp)));
      t.alternateGemmPrefix.push_back(
          t.alternateGemmPrefix.back() +
          groupAlternateGemmTime(g, scale, tp, gpuKind));
      t.fwd.push_back(f);
      t.prefix.push_back(t.prefix.back() + f);
      t.opsPrefix.push_back(t.opsPrefix.back() + g.ops +
                            (coreKernels > 0 ? coreKernels - 1 : 0));
      t.bwdGemmPrefix.push_back(t.bwdGemmPrefix.back() +
                                groupBackwardExtra(g, scale, tp, sp, gpuKind));
    }
    t.pre = groupTime(pre, scale, tp, sp, gpuKind);
    t.post = groupTime(post, scale, tp, sp, gpuKind);
    t.preGemms = gemmCount(pre);
    t.postGemms = gemmCount(post);
    t.preBwdGemm = groupBackwardExtra(pre, scale, tp, sp, gpuKind);
    t.postBwdGemm = groupBackwardExtra(post, scale, tp, sp, gpuKind);
    return timeCache.emplace(key, std::move(t)).first->second;
  }

  /// Tensor-parallel communication of one layer for one micro-batch of
  /// `boundary` activation bytes (tpCallsPerLayer).
  double tpCommPerLayer(const TrainingConfig &cfg, double boundary,
                        bool train) {
    if (cfg.tp <= 1)
      return 0;
    TpCalls n = tpCallsPerLayer(cfg, train);
    return n.allReduce * comm(Collective::AllReduce, boundary, cfg.tp, 1) +
           n.allGather * comm(Collective::AllGather, boundary, cfg.tp, 1) +
           n.reduceScatter * comm(Collective::ReduceScatter, boundary, cfg.tp, 1);
  }

  /// Every stage on the slowest kind with the smallest memory (cached).
  const StagePlacement &uniformPlacement(int pp) {
    auto key = std::make_pair(0, pp);
    auto it = placementCache.find(key);
    if (it != placementCache.end())
      return it->second;
    StagePlacement pl;
    pl.kind.assign(pp, -1);
    pl.capacity.assign(pp, capacity);
    return placementCache.emplace(key, std::move(pl)).first->second;
  }

  /// The GPU kind and memory of each stage of S ranks (cached).
  const StagePlacement &placement(int stageRanks, int pp) {
    auto key = std::make_pair(stageRanks, pp);
    auto it = placementCache.find(key);
    if (it != placementCache.end())
      return it->second;
    StagePlacement pl;
    for (int st = 0; st < pp; ++st) {
      const int lo = st * stageRanks, hi = lo + stageRanks;
      int kind = -1;
      double cap = 0;
      for (size_t gi = 0; gi < cluster.groups.size(); ++gi) {
        const NodeGroup &g = cluster.groups[gi];
        int first = groupFirstRank[gi], end = first + g.count * g.gpusPerNode;
        if (end <= lo || first >= hi)
          continue;
        const GpuSpec &k = kinds[groupKind[gi]];
        if (kind < 0 || slowerGpu(k, kinds[kind], opt.precision))
          kind = groupKind[gi];
        cap = cap == 0 ? k.memoryBytes : std::min(cap, k.memoryBytes);
      }
      pl.kind.push_back(kind);
      pl.capacity.push_back(cap);
      if (st > 0 && (kind != pl.kind[0] || cap != pl.capacity[0]))
        pl.uniform = false;
    }
    return placementCache.emplace(key, std::move(pl)).first->second;
  }

  const Expected<CommGroup> &group(int size, int stride) {
    auto key = std::make_pair(size, stride);
    auto it = groupCache.find(key);
    if (it != groupCache.end())
      return it->second;
    return groupCache.emplace(key, cluster.stridedGroup(size, stride, 0))
        .first->second;
  }

  double comm(Collective c, double bytes, int size, int stride,
              LinkKind *link = nullptr, CommAlgorithm *algorithm = nullptr,
              CommProtocol *protocol = nullptr) {
    if (size <= 1 || bytes <= 0)
      return 0;
    const auto &g = group(size, stride);
    if (!g)
      return 0;
    auto e = cost.commTime(c, bytes, *g);
    if (!e)
      return 0;
    if (link)
      *link = e->link;
    if (algorithm)
      *algorithm = e->algorithm;
    if (protocol)
      *protocol = e->protocol;
    return e->time;
  }
};

/// What eager PyTorch runs for a dlopt.rms_norm or dlopt.rope op
/// (PrecisionConfig::eagerNorm, eagerRope): torchtitan's RMSNorm, x *
/// rsqrt(mean(x.float()^2) + eps) cast back and times the weight, and its
/// apply_rotary_emb, x.float() as complex pairs times the frequencies,
/// cast back, forward and autograd's backward: one kernel per op, in fp32
/// (docs/cost-model.md, "Eager norms and rotary embeddings"). Per element
/// of the result, with activations of `e` bytes and f = 4 (the casts are
/// no-ops when e is 4):
///   RMS norm forward: cast (e + f), pow 2f, mean f, mul 2f, cast (f + e),
///     weight mul 2e: 4e + 28 bytes; 8 kernels (6 without the casts)
///   RMS norm backward: weight mul's 6e (both gradients, the weight's a
///     reduction), cast (e + f), the mul's 6f, mean's f, pow's 7f, the
///     sum of the two gradients 3f, cast (f + e): 92 bytes at e = 2 or 4;
///     15 kernels (13)
///   rope forward: cast (e + f), complex mul 2f, cast (f + e): 2e + 16;
///     3 kernels (1)
///   rope backward: the same with the conjugate frequencies: 2e + 16; 3
/// Row-sized traffic (mean's result, its add and rsqrt, the mul's read:
/// 24 bytes a row forward, the same backward), the weight and the
/// frequencies are added once. nullopt for other ops.
struct EagerKernels {
  double bytes = 0, kernels = 0;                 ///< forward
  double backwardBytes = 0, backwardKernels = 0; ///< autograd's backward
};
std::optional<EagerKernels> eagerKernels(const OpNode &n, double e);

/// First layer index of each stage (contiguous, the first L mod pp stages
/// one layer longer, as MemoryModel's layersOnStage).
std::vector<int64_t> stageStarts(int64_t layers, int pp);
/// First layer index of each stage under cfg's split (uniform when unset).
std::vector<int64_t> stageStarts(const TransformerSpec &spec,
                                 const TrainingConfig &cfg);

/// The layer ranges [a, b) of each stage: one contiguous range, or under
/// interleaved 1F1B the v model chunks of the stage (chunk j of the pp*v
/// chunks, in layer order, runs on stage j mod pp).
struct StageRanges {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges;

  int64_t layers(int st) const {
    int64_t n = 0;
    for (auto [a, b] : ranges[st])
      n += b - a;
    return n;
  }
  /// The sum over the stage's layers of a per-layer quantity given by its
  /// prefix sums.
  double sum(const std::vector<double> &prefix, int st) const {
    double x = 0;
    for (auto [a, b] : ranges[st])
      x += prefix[b] - prefix[a];
    return x;
  }
};


StageRanges stageRanges(const TransformerSpec &spec, const TrainingConfig &cfg);

/// A forward-only step keeps no gradients, optimizer state or stored
/// activations: one layer's activations per micro-batch in flight.
void forwardOnlyMemory(const Ctx &c, const TrainingConfig &cfg,
                       MemoryBreakdown &m);
/// Memory of stage `st` holding `layers` layers.
Expected<MemoryBreakdown> stageMemory(const Ctx &c, const TrainingConfig &cfg,
                                      int st, int64_t layers);

/// Layers per stage on a heterogeneous cluster ({} when no split fits).
std::vector<int64_t> splitLayers(Ctx &c, const TrainingConfig &cfg,
                                 const StagePlacement &pl, int placementKey,
                                 double tpLayer);
/// Seconds of the optimizer step of the slowest stage.
double optimizerStepTime(const Ctx &c, const TrainingConfig &cfg,
                         const MemoryBreakdown &mem, int gpuKind);
/// Picks the process layout of a candidate from its launches and time,
/// and prices the host's exposure: its launches plus the pipeline's
/// `drain` after the share `issuedBeforeChain` of them, then `tail`,
/// against `deviceTime`, or the wait for the issue of the step's first
/// task (`firstTask` device seconds of the first stage's `firstStage`).
void chooseLayout(Ctx &c, Candidate &cand, double launchesPerStep,
                  double deviceTime, double drain, double issuedBeforeChain,
                  double tail, double firstTask, double firstStage);
/// Prices `cand`: memory, step time, and (when `comms`) its collectives.
void price(Ctx &c, Candidate &cand, std::vector<CommOp> *comms);
/// The simulator's input for a priced candidate.
SimInput simInputFor(Ctx &c, const Candidate &cand);
/// The search's order: fitting first, then faster, then the tie-breaks.
bool better(const Candidate &a, const Candidate &b);
/// Why a --fix has no candidate, in words.
std::string explainFix(const FixSpec &f, const TransformerSpec &spec,
                       int64_t kvHeads, int devices, int64_t gb);

} // namespace dlopt::planner::pricing
