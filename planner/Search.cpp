//===- Search.cpp - The transformer search: enumerate, price, choose ------===//
#include "planner/Search.h"

#include "planner/ConfigSpace.h"
#include "planner/SearchUtil.h"
#include "planner/TransformerPricing.h"
#include "planner/TransformerSharding.h"
#include "planner/ReportUtil.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <set>
#include <tuple>


namespace dlopt::planner {

using namespace pricing;

Status validateSearchOptions(const SearchOptions &opt) {
  if (opt.globalBatch < 0 || opt.globalBatch > kMaxGlobalBatch)
    return Status::error("the global batch must be between 1 and " +
                         std::to_string(kMaxGlobalBatch) + " (2^30), got " +
                         std::to_string(opt.globalBatch));
  if (!opt.training && opt.fix.zero && *opt.fix.zero > 0)
    return Status::error("--fix zero=" + std::to_string(*opt.fix.zero) +
                         " needs a training step (--train): ZeRO shards "
                         "optimizer state, gradients and parameters, which a "
                         "forward pass does not have");
  if (!opt.training && opt.fix.recompute &&
      *opt.fix.recompute != RecomputePolicy::None)
    return Status::error("--fix recompute needs a training step (--train): "
                         "a forward pass keeps no activations to recompute");
  return Status::ok();
}

namespace {

/// How tensor parallelism treats each op, as TransformerSharding lowers
/// the graph at tp = 2 without sequence parallelism: the split of each
/// matmul (column-parallel splits N, row-parallel K, the LM head the
/// vocabulary) and the other ops whose result stays replicated over tp
/// (norms, residual adds, dropouts: the work every tp rank repeats unless
/// sequence parallelism splits it). Unknown when tp = 2 does not apply
/// (then tp never exceeds 1).
struct TpRoles {
  std::map<int64_t, GroupGemm::Split> splits;
  std::set<int64_t> replicated;
  bool known = false;
};

TpRoles tpRolesOf(const GraphSummary &graph, const TransformerSpec &spec) {
  TpRoles out;
  if (spec.heads % 2 || spec.tpWidth() % 2 || spec.kv() % 2)
    return out;
  TrainingConfig cfg;
  cfg.tp = 2;
  std::vector<int64_t> marks;
  for (const OpGroupSummary &g : graph.groups)
    if (g.layer >= 0)
      marks.push_back(g.layer);
  Plan plan;
  lowerTransformerSharding(graph, cfg, {marks}, plan);
  out.known = !plan.ops.empty();
  for (const PlannedOp &o : plan.ops) {
    if (o.op == "dlopt.matmul") {
      if (o.strategy == "column")
        out.splits[o.id] = GroupGemm::Split::N;
      else if (o.strategy == "row")
        out.splits[o.id] = GroupGemm::Split::K;
      else if (o.strategy == "vocab-parallel")
        out.splits[o.id] = GroupGemm::Split::Vocab;
    } else if (o.op != "dlopt.attention" && !o.results.empty() &&
               !o.results[0].uses("tp")) {
      out.replicated.insert(o.id);
    }
  }
  return out;
}

/// The matmuls of `n` per sample: [.., m, k] x [k, n] with a weight shared
/// by every row (one GEMM over all rows), or batched on both sides.
std::optional<GroupGemm> groupGemmOf(const OpNode &n, double modelBatch) {
  if (n.operandShapes.size() < 2 || n.shape.size() < 2)
    return std::nullopt;
  const auto &a = n.operandShapes[0], &b = n.operandShapes[1];
  if (a.size() < 2 || b.size() < 2)
    return std::nullopt;
  auto lead = [](const std::vector<int64_t> &v) {
    double p = 1;
    for (size_t i = 0; i + 2 < v.size(); ++i)
      p *= double(v[i]);
    return p;
  };
  GroupGemm g;
  const double m = double(n.shape[n.shape.size() - 2]);
  g.perSample.n = double(n.shape.back());
  g.perSample.k = double(n.transposeA ? a[a.size() - 2] : a.back());
  g.broadcast = lead(b) == 1;
  if (g.broadcast) {
    g.perSample.m = m * lead(a) / modelBatch;
    g.perSample.batch = 1;
  } else {
    g.perSample.m = m;
    g.perSample.batch = lead(n.shape) / modelBatch;
  }
  return g;
}

} // namespace

Expected<PlanResult> searchPlan(const GraphSummary &graph,
                                const Cluster &cluster, const CostModel &cost,
                                const SearchOptions &opt) {
  auto start = std::chrono::steady_clock::now();
  DLOPT_RETURN_IF_ERROR(cluster.validate());
  DLOPT_RETURN_IF_ERROR(validateSearchOptions(opt));
  auto specOr = transformerSpecOf(graph);
  if (!specOr)
    return specOr.status();

  Ctx c{graph, cluster, cost, opt};
  c.spec = *specOr;
  // An eager sequence the model has no op for would price nothing.
  if (opt.bytes.eagerNorm && !c.spec.rmsNorm)
    return Status::error("--eager-kernels norm: the model's layers have no "
                         "RMS norm (dlopt.rms_norm) to price as eager "
                         "PyTorch's (its layer norm is one fused kernel "
                         "there too)");
  if (opt.bytes.eagerRope && !c.spec.rope)
    return Status::error("--eager-kernels rope: the model's layers have no "
                         "rotary embedding (dlopt.rope)");
  c.capacity = cluster.minDeviceMemory();
  // The slowest GPU kind sets the pace of a uniform plan.
  auto gpu = pacingGpu(cluster, opt.precision);
  if (!gpu)
    return gpu.status();
  c.gpu = *gpu;
  // Distinct GPU kinds (by name and memory) and where each group starts.
  {
    int first = 0;
    for (const NodeGroup &g : cluster.groups) {
      int kind = -1;
      for (size_t k = 0; k < c.kinds.size(); ++k)
        if (c.kinds[k].name == g.gpu.name &&
            c.kinds[k].memoryBytes == g.gpu.memoryBytes)
          kind = int(k);
      if (kind < 0) {
        kind = int(c.kinds.size());
        c.kinds.push_back(g.gpu);
      }
      c.groupKind.push_back(kind);
      c.groupFirstRank.push_back(first);
      first += g.count * g.gpusPerNode;
    }
    c.hetero = c.kinds.size() > 1;
  }
  c.modelBatch = graph.batch > 0 ? double(graph.batch) : 1.0;
  // Per-sample costs: the graph's counts divided by its batch.
  auto perSample = [&](const OpGroupSummary &g) {
    GroupCost gc;
    double k = 1.0 / c.modelBatch;
    gc.mmFlops = g.matmulFlops * k;
    gc.mmBytes = g.matmulBytes * k;
    gc.attFlops = g.attentionFlops * k;
    gc.attBytes = g.attentionBytes * k;
    gc.otFlops = g.otherFlops * k;
    gc.otBytes = g.otherBytes * k;
    // Bytes of the model dtype -> bytes of the activation precision.
    double scale = opt.bytes.activationBytes / std::max(1, graph.dtypeBytes);
    gc.mmBytes *= scale;
    gc.attBytes *= scale;
    gc.otBytes *= scale;
    gc.ops = double(g.numOps);
    if (g.layer >= 0) {
      double sh = double(graph.seq) * double(c.spec.hidden);
      gc.repBytes =
          std::min(gc.otBytes, kReplicatedPasses * sh * opt.bytes.activationBytes);
      gc.repFlops = std::min(gc.otFlops, kReplicatedFlopsPerElement * sh);
    }
    return gc;
  };
  c.kvFraction = graph.heads > 0 && graph.kvHeads > 0
                     ? double(graph.kvHeads) / double(graph.heads)
                     : 1.0;
  c.gpusPerNode = cluster.groups.empty() ? 1 : cluster.groups.front().gpusPerNode;
  c.host = mostConstrainedHost(cluster);
  std::map<int64_t, size_t> layerIndex; // mark -> index in c.layers
  for (const OpGroupSummary &g : graph.groups) {
    if (g.layer >= 0) {
      layerIndex[g.layer] = c.layers.size();
      c.layers.push_back(perSample(g));
    } else if (g.name == "pre")
      c.pre = perSample(g);
    else
      c.post = perSample(g);
  }
  // Each matmul of the op list, priced by its own shape, and the work of
  // each layer that tensor parallelism replicates, counted op by op.
  {
    const TpRoles roles = tpRolesOf(graph, c.spec);
    const double toActivation =
        opt.bytes.activationBytes / std::max(1, graph.dtypeBytes);
    std::vector<double> repBytes(c.layers.size(), 0),
        repFlops(c.layers.size(), 0);
    bool seenLayer = false;
    for (const OpNode &n : graph.ops) {
      seenLayer |= n.layer >= 0;
      auto li = layerIndex.find(n.layer);
      if (n.kind != OpClass::Matmul) {
        const bool rep = li != layerIndex.end() &&
                         n.kind != OpClass::Constant &&
                         roles.replicated.count(n.key());
        if (rep) {
          repBytes[li->second] += n.bytes / c.modelBatch * toActivation;
          repFlops[li->second] += n.flops / c.modelBatch;
        }
        if (n.kind != OpClass::Constant && n.kind != OpClass::Attention &&
            n.op != "dlopt.attention_grad" && !n.backward) {
          GroupCost &grp = li != layerIndex.end() ? c.layers[li->second]
                           : seenLayer             ? c.post
                                                   : c.pre;
          double bytes = n.bytes / c.modelBatch * toActivation;
          const bool eagerOp =
              (opt.bytes.eagerNorm && n.op == "dlopt.rms_norm") ||
              (opt.bytes.eagerRope && n.op == "dlopt.rope");
          const auto eager = eagerOp
                                 ? eagerKernels(n, opt.bytes.activationBytes)
                                 : std::nullopt;
          GroupCost::MemoryOp mo{memoryClassOf(n.op), n.flops / c.modelBatch,
                                 bytes, rep};
          if (eager) {
            // Eager PyTorch's op sequence in place of the fused kernel:
            // plain elementwise kernels and reductions (the stream class),
            // its bytes, its kernels beyond the one counted, and autograd's
            // backward in place of the ratio.
            const double more = eager->bytes / c.modelBatch - bytes;
            const double bwdExtra = eager->backwardBytes / c.modelBatch -
                                    cost.calibration().backwardFlopsRatio *
                                        eager->bytes / c.modelBatch;
            mo.cls = MemoryClass::Stream;
            mo.bytes += more;
            mo.backwardBytes = eager->backwardBytes / c.modelBatch;
            grp.otBytes += more;
            grp.ops += eager->kernels - 1;
            grp.eagerBackwardExtraBytes += bwdExtra;
            if (rep) {
              repBytes[li->second] += more;
              grp.eagerBackwardExtraRepBytes += bwdExtra;
            }
          }
          grp.memoryOps.push_back(mo);
        }
        continue;
      }
      auto gm = groupGemmOf(n, c.modelBatch);
      if (!gm)
        continue;
      auto it = roles.splits.find(n.key());
      if (it != roles.splits.end())
        gm->split = it->second;
      GroupCost &grp = li != layerIndex.end() ? c.layers[li->second]
                       : seenLayer             ? c.post
                                               : c.pre;
      grp.gemms.push_back(*gm);
    }
    if (roles.known)
      for (size_t i = 0; i < c.layers.size(); ++i) {
        GroupCost &g = c.layers[i];
        g.repBytes = std::min(g.otBytes, repBytes[i]);
        g.repFlops = std::min(g.otFlops, repFlops[i]);
      }
    else
      for (GroupCost &g : c.layers)
        g.memoryOps.clear();
  }

  c.identicalLayers = true;
  for (const GroupCost &l : c.layers) {
    const GroupCost &f = c.layers.front();
    if (l.mmFlops != f.mmFlops || l.mmBytes != f.mmBytes ||
        l.attFlops != f.attFlops || l.attBytes != f.attBytes ||
        l.otFlops != f.otFlops || l.otBytes != f.otBytes ||
        l.repFlops != f.repFlops || l.repBytes != f.repBytes)
      c.identicalLayers = false;
  }

  const int devices = cluster.numDevices();
  const int64_t gb = opt.globalBatch > 0 ? opt.globalBatch : graph.batch;
  if (gb < 1)
    return Status::error("the global batch must be at least 1");
  const FixSpec &fix = opt.fix;
  const int gpusPerNode = cluster.groups.empty()
                              ? 1
                              : cluster.groups.front().gpusPerNode;
  const TransformerSpec &spec = c.spec;

  if (!fix.empty()) {
    std::string why = explainFix(fix, spec, graph.kvHeads, devices, gb);
    if (!why.empty())
      return Status::error("--fix " + fix.str() + " is impossible: " + why);
  }

  PlanResult res;
  SearchStats &st = res.stats;
  CandidateRanking<Candidate, Shape, decltype(&better)> ranking(opt.topK,
                                                                &better);

  SpaceRules rules;
  rules.devices = devices;
  rules.gpusPerNode = gpusPerNode;
  rules.globalBatch = gb;
  rules.maxMicroBatch = opt.maxMicroBatch;
  rules.training = opt.training;
  rules.optimizer = opt.optimizer;
  rules.bytes = opt.bytes;
  rules.tpRule = [&](int tp) -> std::string {
    if (spec.heads % tp || spec.tpWidth() % tp)
      return "tp does not divide heads or ffn";
    if (graph.kvHeads > 0 && graph.kvHeads % tp)
      return "tp does not divide the key/value heads";
    return "";
  };
  rules.units = "layers";
  rules.numUnits = spec.numLayers;
  rules.contextParallel = true;
  rules.seqLen = spec.seqLen;
  rules.cpMinSeq = opt.contextParallelMinSeq;
  rules.sequenceParallel = true;
  rules.recompute = true;
  rules.schedules = true;
  forEachConfig(rules, fix, st.pruned, [&](const TrainingConfig &cfg) {
    Candidate cand;
    cand.cfg = cfg;
    price(c, cand, nullptr);
    ranking.consider(Shape{cfg.dp, cfg.tp, cfg.pp, cfg.cp}, cand);
  });

  st.enumerated = ranking.priced();
  st.feasible = ranking.feasible();
  st.outOfMemory = ranking.outOfMemory();
  auto fixNote = fix.empty() ? std::string() : " with --fix " + fix.str();
  if (st.enumerated == 0)
    return noCandidateError(fixNote, devices, gb, st.pruned);
  if (!ranking.best()) {
    const Candidate &lm = *ranking.leastMemory();
    return noFitError(fixNote, lm.memory.total(), lm.key(), lm.capacity);
  }
  const std::optional<Candidate> &best = ranking.best();

  res.best = *best;
  price(c, res.best, &res.comms);
  if (opt.training) {
    res.simInput = simInputFor(c, res.best);
    auto sim = simulateStep(res.simInput);
    if (sim)
      res.simulated = std::move(*sim);
    else
      res.simError = sim.status().message();
  } else {
    res.simError = "forward-only plans are not simulated";
  }

  // Alternatives: the best of every other (dp, tp, pp), including shapes
  // that would be faster but do not fit; then the runners-up of any shape.
  res.alternatives = ranking.alternatives<Alternative>(*best);

  // Stage assignment.
  const StageRanges bestRanges = stageRanges(spec, res.best.cfg);
  std::vector<int64_t> marks;
  for (const OpGroupSummary &g : graph.groups)
    if (g.layer >= 0)
      marks.push_back(g.layer);
  for (int s = 0; s < res.best.cfg.pp; ++s) {
    res.stageLayers.emplace_back();
    for (auto [a, b] : bestRanges.ranges[s])
      res.stageLayers.back().insert(res.stageLayers.back().end(),
                                    marks.begin() + a, marks.begin() + b);
  }

  res.plan = planFromConfig(PlanKind::Transformer, graph, cluster,
                            res.best.cfg, gb, opt.training, opt.precision,
                            res.best.process.layout);
  lowerTransformerSharding(graph, res.best.cfg, res.stageLayers, res.plan);

  res.spec = spec;
  res.totalParams = graph.totalParams;
  res.globalBatch = gb;
  res.seq = graph.seq;
  res.training = opt.training;
  res.precision = opt.precision;
  // MFU is against the cluster's aggregate peak: the mean over devices.
  {
    double sum = 0;
    for (const NodeGroup &g : cluster.groups)
      sum += g.gpu.peak(opt.precision) * g.count * g.gpusPerNode;
    res.peakFlops = sum / std::max(1, devices);
  }
  if (c.hetero) {
    const Candidate &b = res.best;
    const StagePlacement &pl =
        c.placement(b.cfg.tp * b.cfg.cp * b.cfg.dp, b.cfg.pp);
    for (int s = 0; s < b.cfg.pp; ++s) {
      res.stageGpus.push_back(c.kindSpec(pl.kind[s]).name);
      res.stageCapacity.push_back(pl.capacity[s]);
    }
  }
  res.modelFlopsPerStep =
      (opt.training ? 6.0 : 2.0) * graph.totalParams * double(gb) * graph.seq;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             start)
                   .count();
  return res;
}

} // namespace dlopt::planner
