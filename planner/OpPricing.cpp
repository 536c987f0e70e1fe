//===- OpPricing.cpp - Pricing one op-level candidate ---------------------===//
//
// planner/OpPricing.h says what is here.
//
//===----------------------------------------------------------------------===//
#include "planner/OpPricing.h"

#include "planner/PlanJson.h"
#include "planner/ReportUtil.h"
#include "planner/SearchUtil.h"
#include "planner/Simulator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

namespace dlopt::planner::oppricing {

double backwardReadFraction(const GraphSummary &g) {
  std::vector<bool> dependsOnParam(g.ops.size(), false);
  std::vector<bool> read(g.args.size(), false);
  auto isParam = [&](const ValueRef &r) {
    return r.isArg() && r.argIndex() < int(g.args.size()) &&
           g.args[r.argIndex()].role == ArgNode::Role::Param;
  };
  auto depends = [&](const ValueRef &r) {
    if (r.isArg())
      return isParam(r);
    return r.producer >= 0 && r.producer < int(g.ops.size()) &&
           dependsOnParam[r.producer];
  };
  for (const OpNode &n : g.ops) {
    if (n.backward)
      continue;
    bool any = false;
    for (const ValueRef &r : n.operands)
      any = any || depends(r);
    if (n.id >= 0 && n.id < int(g.ops.size()))
      dependsOnParam[n.id] = any && n.isFloat;
    bool linearInEach =
        n.op == "dlopt.add" || n.op == "dlopt.sub" || n.op == "dlopt.neg" ||
        n.op == "dlopt.cast" || n.kind == OpClass::Reshape ||
        n.kind == OpClass::Transpose || n.kind == OpClass::Broadcast ||
        n.kind == OpClass::Gather || n.kind == OpClass::Concat ||
        n.kind == OpClass::Slice || n.kind == OpClass::Constant;
    if (linearInEach)
      continue;
    for (size_t i = 0; i < n.operands.size(); ++i) {
      if (!isParam(n.operands[i]))
        continue;
      for (size_t j = 0; j < n.operands.size(); ++j)
        if (j != i && depends(n.operands[j]))
          read[n.operands[i].argIndex()] = true;
    }
  }
  double all = 0, bwd = 0;
  for (size_t k = 0; k < g.args.size(); ++k) {
    if (g.args[k].role != ArgNode::Role::Param)
      continue;
    double e = 1;
    for (int64_t d : g.args[k].shape)
      e *= double(d);
    all += e;
    if (read[k])
      bwd += e;
  }
  return all > 0 ? bwd / all : 1.0;
}


double Ctx::forwardTime(const Solved &s, const OpNode &op, const Strategy &st,
                        double flops, double bytes, int t) const {
  if (op.kind == OpClass::Matmul && gemmsByShape())
    if (auto g = rankGemm(s, op, st, t))
      return gemm(*g, bytes);
  if (op.kind == OpClass::Conv2D && gemmsByShape())
    if (auto g = rankConvGemms(s, op, st, t)) {
      if (auto c = cost.convTime(ConvPass::Forward, g->forward, gpu))
        return *c;
      return gemm(g->forward, bytes);
    }
  const OpKind kind = rooflineKind(op);
  if (kind == OpKind::Elementwise)
    return elementwise(memoryClassOf(op.op), flops / st.divisor, bytes,
                       memoryRowsOf(op.op, op.shape) / st.divisor);
  return roofline(kind, flops / st.divisor, bytes);
}

double Ctx::stepTime(const Solved &s, const OpNode &op, const Strategy &st,
                     double fwd, int t) const {
  if (!train)
    return fwd;
  if (op.kind == OpClass::Conv2D && gemmsByShape()) {
    auto g = rankConvGemms(s, op, st, t);
    if (!g)
      return fwd * (1 + ratio);
    // Each gradient reads two of x, W, dy and writes the third's gradient.
    const double bytes =
        (g->forward.m * g->forward.k + g->forward.k * g->forward.n +
         g->forward.m * g->forward.n) *
        double(op.elemBytes) * g->forward.batch;
    // The measured convolution kernels where the calibration has them
    // (conv_table), else the gradients' im2col GEMMs.
    auto pass = [&](ConvPass p, const GemmShape &asGemm) {
      if (auto c = cost.convTime(p, g->forward, gpu))
        return *c;
      return gemm(asGemm, bytes);
    };
    double bwd = 0;
    if (s.geo.operand(op.id, 0).needsGrad)
      bwd += pass(ConvPass::GradInput, g->gradInput);
    if (s.geo.operand(op.id, 1).needsGrad)
      bwd += pass(ConvPass::GradFilter, g->gradFilter);
    return fwd + bwd;
  }
  if (rooflineKind(op) == OpKind::Elementwise) {
    // A memory-bound op's backward: its class's measured ratio where the
    // calibration has one (op_backward_ratio).
    const double r =
        cost.calibration().opBackwardRatio[size_t(memoryClassOf(op.op))];
    return fwd * (1 + (r > 0 ? r : ratio));
  }
  if (op.kind != OpClass::Matmul || !gemmsByShape())
    return fwd * (1 + ratio);
  auto g = rankGemm(s, op, st, t);
  if (!g)
    return fwd * (1 + ratio);
  // Each gradient GEMM reads two of A, B, dC and writes the third's
  // gradient: the same three matrices' bytes.
  const double bytes = (g->m * g->k + g->k * g->n + g->m * g->n) *
                       double(op.elemBytes) * g->batch;
  double bwd = 0;
  if (s.geo.operand(op.id, 0).needsGrad)
    bwd += gemm(GemmShape{g->m, g->k, g->n, g->batch}, bytes);
  if (s.geo.operand(op.id, 1).needsGrad)
    bwd += gemm(GemmShape{g->k, g->n, g->m, g->batch}, bytes);
  return fwd + bwd;
}

std::vector<int64_t> rankOperandShape(const Solved &s, const OpNode &op,
                                      const Strategy &st, size_t i, int t) {
  std::vector<int64_t> shape = s.geo.operand(op.id, int(i)).shape;
  if (i < st.operands.size() && st.operands[i].kind == Layout::S &&
      st.operands[i].dim >= 0 && size_t(st.operands[i].dim) < shape.size())
    shape[size_t(st.operands[i].dim)] =
        (shape[size_t(st.operands[i].dim)] + t - 1) / t;
  return shape;
}

std::optional<GemmShape> rankGemm(const Solved &s, const OpNode &op,
                                  const Strategy &st, int t) {
  if (op.operands.size() < 2)
    return std::nullopt;
  const std::vector<int64_t> sa = rankOperandShape(s, op, st, 0, t),
                             sb = rankOperandShape(s, op, st, 1, t);
  if (sa.size() < 2 || sb.size() < 2)
    return std::nullopt;
  const size_t ra = sa.size(), rb = sb.size();
  double m = double(op.transposeA ? sa[ra - 1] : sa[ra - 2]);
  const double k = double(op.transposeA ? sa[ra - 2] : sa[ra - 1]);
  const double n = double(op.transposeB ? sb[rb - 2] : sb[rb - 1]);
  // The result's batch dims broadcast A's and B's (aligned at the right).
  const size_t na = ra - 2, nb = rb - 2, nr = std::max(na, nb);
  double batch = 1, batchA = 1, batchB = 1;
  for (size_t i = 0; i < nr; ++i) {
    const double da = i < na ? double(sa[na - 1 - i]) : 1.0;
    const double db = i < nb ? double(sb[nb - 1 - i]) : 1.0;
    batch *= std::max(da, db);
    batchA *= da;
    batchB *= db;
  }
  // The kernel's fold (runtime/cpu/Matmul.cpp): B without a batch and A
  // not transposed run as one tall GEMM.
  if (batchB == 1 && batchA == batch && !op.transposeA) {
    m *= batch;
    batch = 1;
  }
  if (!(m > 0 && n > 0 && k > 0))
    return std::nullopt;
  return GemmShape{m, n, k, batch};
}

std::optional<ConvGemms> rankConvGemms(const Solved &s, const OpNode &op,
                                       const Strategy &st, int t) {
  if (op.operands.size() < 2 || op.shape.size() != 4 || op.groups < 1)
    return std::nullopt;
  const std::vector<int64_t> sx = rankOperandShape(s, op, st, 0, t),
                             sw = rankOperandShape(s, op, st, 1, t);
  if (sx.size() != 4 || sw.size() != 4)
    return std::nullopt;
  const double groups = double(op.groups);
  const double og = double(sw[0]) / groups;
  const double ckk = double(sw[1]) * double(sw[2]) * double(sw[3]);
  const double cols = double(sx[0]) * double(op.shape[2]) * double(op.shape[3]);
  if (!(og >= 1 && ckk > 0 && cols > 0))
    return std::nullopt;
  return ConvGemms{GemmShape{og, cols, ckk, groups},
                   GemmShape{ckk, cols, og, groups},
                   GemmShape{og, ckk, cols, groups}};
}

double opBytes(const Solved &s, const OpNode &op, const Strategy &st, int t) {
  // A reshape is a view (the memory planner aliases its result).
  if (op.kind == OpClass::Reshape)
    return 0;
  auto share = [&](const Layout &l) {
    return l.kind == Layout::S ? 1.0 / t : 1.0;
  };
  double b = s.geo.result(op.id).bytes * share(st.result);
  for (size_t i = 0; i < op.operands.size(); ++i)
    b += s.geo.operand(op.id, int(i)).bytes *
         (i < st.operands.size() ? share(st.operands[i]) : 1.0);
  double r0 = double(op.elemBytes);
  for (int64_t d : op.shape)
    r0 *= double(d);
  b += std::max(0.0, op.resultBytes - r0);
  return b;
}

double stateBytesPerElem(const SearchOptions &opt, bool train) {
  const PrecisionConfig &pr = opt.bytes;
  if (!train)
    return pr.paramBytes;
  int moments = opt.optimizer == Optimizer::Adam       ? 2
                : opt.optimizer == Optimizer::Momentum ? 1
                                                       : 0;
  return pr.paramBytes + pr.gradBytes + moments * pr.optimizerStateBytes +
         (pr.masterWeights ? pr.masterBytes : 0.0);
}

double optimizerTime(const Ctx &c, double elems) {
  if (elems <= 0)
    return 0;
  const double bytes = optimizerStepBytesPerParam(c.opt.optimizer, c.opt.bytes);
  auto e = c.cost.optimizerTime(10 * elems, bytes * elems, c.opt.precision,
                                c.gpu);
  return e ? e->time : 0;
}



std::vector<int> makeUnits(const Ctx &c, int pp, bool *byLayer) {
  const auto &ops = c.fwdOps;
  bool marks = false;
  for (int id : ops)
    marks |= c.g.ops[id].layer >= 0;
  std::vector<int> starts;
  if (marks) {
    for (size_t i = 0; i < ops.size(); ++i)
      if (i == 0 || c.g.ops[ops[i]].layer != c.g.ops[ops[i - 1]].layer)
        starts.push_back(int(i));
    if (int(starts.size()) >= pp) {
      starts.push_back(int(ops.size()));
      *byLayer = true;
      return starts;
    }
  }
  starts.clear();
  for (size_t i = 0; i <= ops.size(); ++i)
    starts.push_back(int(i));
  *byLayer = false;
  return starts;
}

int chunksPerStage(const TrainingConfig &cfg, bool train) {
  return train && cfg.schedule == PipelineSchedule::Interleaved1F1B
             ? std::max(1, cfg.virtualStages)
             : 1;
}

namespace {

/// One of ZeRO-3's gather buckets on a stage, in forward order, as
/// dlopt-compile forms them: a run of parameters first read by consecutive
/// ops, up to grad_bucket_mib, gathered before its first reader. `elems`:
/// its parameter elements per rank; `compute`: the forward compute (and
/// tensor-parallel communication) of its ops up to the next bucket's
/// first.
struct StageGatherUnit {
  double elems = 0, compute = 0;
};

/// ZeRO-3 on a stage as dlopt-compile applies it to an op-level graph:
/// its gather buckets (StageGatherUnit) priced by zero3BucketExposure.
Zero3Exposure zero3Exposure(const Ctx &c,
                            const std::vector<StageGatherUnit> &units,
                            ComputeMix mix, int dp, int t,
                            const TrainingConfig &cfg) {
  if (units.empty() || dp <= 1)
    return {};
  const double share = (dp - 1.0) / dp;
  std::vector<Zero3Bucket> b(units.size());
  for (size_t k = 0; k < units.size(); ++k) {
    Zero3Bucket &x = b[k];
    x.gatherBytes = units[k].elems * cfg.precision.paramBytes;
    x.backwardGatherBytes = x.gatherBytes * c.bwdReadFraction;
    x.reduceScatterBytes = units[k].elems * cfg.precision.gradReduceBytes;
    x.gather = c.pricer.time(Collective::AllGather, x.gatherBytes, dp, t);
    x.backwardGather =
        c.pricer.time(Collective::AllGather, x.backwardGatherBytes, dp, t);
    x.reduceScatter =
        c.pricer.time(Collective::ReduceScatter, x.reduceScatterBytes, dp, t);
    x.forward = units[k].compute;
    x.backward = units[k].compute * c.ratio;
  }
  return zero3BucketExposure(b, c.cost.calibration().gradOverlapEfficiency,
                             [&](double time, double bytes) {
                               return c.cost.overlapLoss(
                                   mix, share * bytes / time, c.gpu, time);
                             });
}

} // namespace

Zero3Exposure zero3BucketExposure(
    const std::vector<Zero3Bucket> &b, double efficiency,
    const std::function<double(double time, double bytes)> &lossPerSecond) {
  Zero3Exposure z;
  const size_t n = b.size();
  if (n == 0)
    return z;
  // What a collective of `time` moving `bytes` beside `window` of compute
  // shows: what the compute does not hide, or what the collective takes
  // from it (contention), whichever is larger.
  auto shows = [&](double time, double bytes, double window) {
    if (!(time > 0))
      return 0.0;
    const double beside = std::min(time, efficiency * std::max(0.0, window));
    return std::max(CostModel::exposed(time, window, efficiency),
                    beside * lossPerSecond(time, bytes));
  };
  z.forward = b[0].gather;
  for (size_t k = 1; k < n; ++k)
    z.forward += shows(b[k].gather, b[k].gatherBytes, b[k - 1].forward);
  z.backward = z.backwardGather = b[n - 1].backwardGather;
  for (size_t k = n; k-- > 0;) {
    const double ag = k > 0 ? b[k - 1].backwardGather : 0;
    const double agBytes = k > 0 ? b[k - 1].backwardGatherBytes : 0;
    const double rs = k + 1 < n ? b[k + 1].reduceScatter : 0;
    const double rsBytes = k + 1 < n ? b[k + 1].reduceScatterBytes : 0;
    const double e = shows(ag + rs, agBytes + rsBytes, b[k].backward);
    z.backward += e;
    if (ag + rs > 0)
      z.backwardGather += e * ag / (ag + rs);
  }
  z.backward += b[0].reduceScatter;
  return z;
}

Priced price(Ctx &c, const Solved &s, TrainingConfig cfg) {
  Priced out;
  OpCandidate &cand = out.cand;
  cand.cfg = cfg;
  cand.capacity = c.capacity;
  cand.memoryConstrained = s.constrained;
  const Calibration &cal = c.cost.calibration();
  const bool train = c.train;
  const int pp = cfg.pp, t = cfg.tp, dp = cfg.dp;
  const double m = double(cfg.numMicroBatches);

  // Interleaved, the ops are cut into pp * v model chunks, chunk k on
  // stage k % pp.
  const int V = chunksPerStage(cfg, train);
  const int chunks = pp * V;
  out.unitStart = makeUnits(c, chunks, &out.byLayer);
  const int nUnits = int(out.unitStart.size()) - 1;
  std::vector<double> unitTime(nUnits, 0);
  for (int u = 0; u < nUnits; ++u)
    for (int i = out.unitStart[u]; i < out.unitStart[u + 1]; ++i) {
      int id = c.fwdOps[i];
      unitTime[u] += s.compute[id] + s.mbComm[id];
    }
  out.starts = partitionStages(unitTime, chunks);
  if (out.starts.empty()) {
    cand.memory.workspace = kInf;
    cand.time.compute = kInf;
    return out;
  }
  // Stage (and chunk) of each forward op position.
  std::vector<int> stageOfPos(c.fwdOps.size(), 0);
  std::vector<int> stageOfOp(c.g.ops.size(), -1), chunkOfOp(c.g.ops.size(), -1);
  for (int ch = 0; ch < chunks; ++ch)
    for (int u = out.starts[ch]; u < out.starts[ch + 1]; ++u)
      for (int i = out.unitStart[u]; i < out.unitStart[u + 1]; ++i) {
        stageOfPos[i] = ch % pp;
        stageOfOp[c.fwdOps[i]] = ch % pp;
        chunkOfOp[c.fwdOps[i]] = ch;
      }

  struct StageSum {
    double compute = 0, comm = 0, step = 0, act = 0, work = 0;
    double gemm = 0; ///< the matmuls', convolutions' and attention's compute
    double matmul = 0; ///< of which the matmuls' (library GEMMs)
    double matmuls = 0; ///< the matmul ops
    double paramElems = 0, largestParam = 0;
    double ops = 0; ///< forward ops a micro-batch launches (no constants)
    double calls = 0; ///< collectives a micro-batch launches
    double stepCalls = 0; ///< collectives launched once a step
    std::set<int> params;
    /// ZeRO-3's gather buckets in forward order (StageGatherUnit).
    std::vector<StageGatherUnit> units;
  };
  std::vector<StageSum> ss(pp);
  const double bucketBytes = c.cost.calibration().gradBucketBytes;
  for (size_t i = 0; i < c.fwdOps.size(); ++i) {
    int id = c.fwdOps[i];
    StageSum &x = ss[stageOfPos[i]];
    if (c.g.ops[id].kind != OpClass::Constant)
      x.ops += 1;
    x.compute += s.compute[id];
    const OpClass k = c.g.ops[id].kind;
    if (k == OpClass::Matmul || k == OpClass::Conv2D ||
        k == OpClass::Attention)
      x.gemm += s.compute[id];
    if (k == OpClass::Matmul) {
      x.matmul += s.compute[id];
      x.matmuls += 1;
    }
    x.comm += s.mbComm[id];
    x.calls += s.mbCalls[id];
    x.stepCalls += s.stepCalls[id];
    x.step += s.stepComm[id];
    x.act += s.activation[id];
    x.work = std::max(x.work, s.workingSet[id]);
    // Each parameter once, where the stage first reads it: its elements on
    // the rank, and the ZeRO-3 gather bucket it joins.
    for (int a : s.paramsOf[id])
      if (x.params.insert(a).second) {
        double e = 1;
        for (int64_t d : c.g.args[a].shape)
          e *= double(d);
        e /= s.paramLayout[a].kind == Layout::S ? double(t) : 1.0;
        x.paramElems += e;
        x.largestParam = std::max(x.largestParam, e);
        if (x.units.empty() ||
            (x.units.back().elems > 0 &&
             (x.units.back().elems + e) * cfg.precision.paramBytes >
                 bucketBytes))
          x.units.push_back({});
        x.units.back().elems += e;
      }
    if (x.units.empty())
      x.units.push_back({});
    x.units.back().compute += s.compute[id] + s.mbComm[id];
  }

  // Bytes crossing each chunk boundary per micro-batch (per rank): chunk
  // k sends to chunk k + 1, from stage k % pp to (k + 1) % pp.
  std::vector<double> boundary(std::max(0, chunks - 1), 0);
  if (pp > 1) {
    std::vector<int> lastUse(c.g.ops.size(), -1);
    for (int id : c.fwdOps)
      for (const ValueRef &r : c.g.ops[id].operands)
        if (!r.isArg() && r.producer >= 0 && chunkOfOp[r.producer] >= 0)
          lastUse[r.producer] = std::max(lastUse[r.producer], chunkOfOp[id]);
    for (int id : c.fwdOps) {
      if (lastUse[id] <= chunkOfOp[id] || c.g.ops[id].kind == OpClass::Constant)
        continue;
      double b = s.geo.result(id).bytes /
                 (s.resultLayout[id].kind == Layout::S ? double(t) : 1.0);
      for (int ch = chunkOfOp[id]; ch < lastUse[id]; ++ch)
        boundary[ch] += b;
    }
  }

  int w = 0;
  for (int st = 1; st < pp; ++st)
    if (ss[st].compute + ss[st].comm > ss[w].compute + ss[w].comm)
      w = st;
  const double perMb = ss[w].compute + ss[w].comm;
  double meanMb = 0; // the stages' mean time per micro-batch
  for (const StageSum &x : ss)
    meanMb += (x.compute + x.comm) / pp;
  StepTime &T = cand.time;
  T.compute = m * ss[w].compute;
  if (train) {
    // Under ZeRO (stage 1 and up) each dp rank updates its 1/dp shard of
    // the optimizer states, as the transformer search prices it.
    const double shard = cfg.zeroStage >= 1 ? double(cfg.dp) : 1.0;
    double update = 0;
    for (const StageSum &x : ss)
      update = std::max(update, optimizerTime(c, x.paramElems / shard));
    T.optimizer = update;
  }
  double step = 0;
  for (const StageSum &x : ss)
    step = std::max(step, x.step);
  T.tpComm = m * ss[w].comm + step;
  if (pp > 1) {
    // Stages that differ (the op split's are rarely equal): the forward
    // pipeline waits one pass through every stage but the slowest, and
    // training's schedule is run on the stages' own times, as the
    // transformer search does (pipelineMakespan, docs/simulator.md,
    // "Stages that differ"); the closed forms below stand for interleaving
    // and above its size limit.
    double bubble = -1;
    if (V == 1) {
      std::vector<double> fwd, all, wg;
      double sum = 0;
      for (const StageSum &x : ss) {
        const double t = x.compute + x.comm;
        const double f = train ? t / (1 + c.ratio) : t;
        sum += t;
        all.push_back(t);
        fwd.push_back(f);
        wg.push_back(train ? weightGradSeconds(f, t - f, c.ratio) : 0.0);
      }
      if (!train) {
        bubble = std::max(0.0, sum - perMb);
      } else {
        const bool zb = cfg.schedule == PipelineSchedule::ZeroBubble;
        const double span =
            pipelineMakespan(cfg.schedule, fwd, all,
                             zb ? wg : std::vector<double>{}, int64_t(m));
        if (span >= 0)
          bubble = std::max(0.0, span - m * perMb);
      }
    }
    if (bubble >= 0) {
      T.bubble = bubble;
    } else if (train && cfg.schedule == PipelineSchedule::ZeroBubble) {
      // ZB-H1, as the transformer search prices it (docs/cost-model.md):
      // the deferred weight-gradient passes (half the backward) fill the
      // cooldown, down to (pp-1) max(t_F, t_B); with fewer micro-batches
      // than stages only m - 1 of them do.
      double fwd = ss[w].compute / (1 + c.ratio);
      double weightGrad = weightGradSeconds(fwd, perMb - fwd, c.ratio);
      double inputGrad = std::max(0.0, perMb - fwd - weightGrad);
      double filled = std::min(1.0, (m - 1) / double(pp - 1));
      T.bubble = (pp - 1) * std::max(perMb - weightGrad * (1 + filled),
                                     std::max(fwd, inputGrad));
    } else {
      T.bubble = (pp - 1) * perMb / V;
    }
    // Each stage sends over the boundaries of its chunks (and, backward,
    // their gradients back), overlapped with its micro-batch's compute;
    // the fill and drain paths and 1F1B's steady state wait for them as
    // the transformer search prices it (pipelineSendTime), with the mean
    // boundary's send and the slowest stage's slack.
    double worst = 0, allSends = 0;
    for (int st = 0; st < pp; ++st) {
      double sends = 0;
      for (int ch = st; ch < chunks - 1; ch += pp)
        sends += c.pricer.time(Collective::SendRecv, boundary[ch], 2, t * dp);
      allSends += sends;
      worst = std::max(worst, m * c.cost.exposedP2P((train ? 2 : 1) * sends,
                                                    perMb));
    }
    const double one = chunks > 1 ? allSends / (chunks - 1) : 0;
    T.ppComm = worst +
               pipelineSendTime(train ? cfg.schedule : PipelineSchedule::GPipe,
                                train, pp, m, one, perMb - meanMb,
                                chunks / pp);
  }
  if (train && dp > 1) {
    double worst = 0;
    for (const StageSum &x : ss) {
      double grads = x.paramElems * cfg.precision.gradBytes;
      double params = x.paramElems * cfg.precision.paramBytes;
      double backward = x.compute * c.ratio / (1 + c.ratio);
      // What a sync takes from the backward it runs beside (contention for
      // SMs and memory bandwidth at its link rate, CostModel::overlapLoss),
      // as the transformer search prices it.
      const ComputeMix mix =
          x.compute > 0 ? ComputeMix{x.gemm / x.compute, x.matmul / x.compute,
                                     x.matmuls > 0 ? x.matmul / x.matmuls : 0.0}
                        : ComputeMix{};
      auto loss = [&](Collective coll, double time) {
        return c.cost.syncLoss(coll, grads, dp, time, mix, c.gpu);
      };
      double e = 0;
      if (cfg.zeroStage == 0) {
        const double ar = c.pricer.time(Collective::AllReduce, grads, dp, t);
        e = c.cost.exposedGradSync(ar, backward, grads,
                                   loss(Collective::AllReduce, ar));
      } else {
        // ZeRO >= 2 keeps no whole gradient: each micro-batch's is
        // reduce-scattered as its backward pass makes it; they queue on
        // their own lane, so only the last shows unless they outlast the
        // backwards (chunkedGradSyncExposed).
        const double rs =
            c.pricer.time(Collective::ReduceScatter, grads, dp, t);
        const double last = c.cost.exposedGradSync(
            rs, backward, grads, loss(Collective::ReduceScatter, rs));
        e = cfg.zeroStage >= 2
                ? chunkedGradSyncExposed(rs, last, int(m), backward)
                : last;
        if (cfg.zeroStage < 3) {
          e += c.pricer.time(Collective::AllGather, params, dp, t);
        } else {
          const Zero3Exposure z = zero3Exposure(c, x.units, mix, dp, t, cfg);
          e = m * (z.forward + z.backward);
          if (e > worst) {
            cand.zero3ForwardExposed = m * z.forward;
            cand.zero3BackwardGatherExposed = m * z.backwardGather;
          }
        }
      }
      worst = std::max(worst, e);
    }
    T.dpComm = worst;
  }

  // Host dispatch: each process issues every kernel of its stage's
  // micro-batches (forward ops, backward_flops_ratio times as many
  // backward, and each tensor-parallel collective); the stage with the
  // most launches sets it. One process per
  // device between-graph; in-graph the node's processes contend (the
  // transformer search's in_graph_launch_contention). The host
  // runs ahead; what it adds is its chain past the devices' step: the
  // drain of the last micro-batch's backward through the other stages and
  // the sends between them, then the optimizer (docs/cost-model.md,
  // section 8).
  {
    double launches = 0;
    for (const StageSum &x : ss)
      launches = std::max(
          launches,
          m * (x.ops * (train ? 1 + cal.backwardFlopsRatio : 1.0) + x.calls) +
              x.stepCalls);
    cand.hostDispatch = hostDispatchSeconds(
        launches, c.opt.fix.layout.value_or(ProcessLayout::BetweenGraph),
        c.gpusPerNode, c.host, cal);
    double drain = T.optimizer;
    if (train && pp > 1)
      drain += (pp - 1) * meanMb * c.ratio / (1 + c.ratio) / V;
    T.host = std::max(0.0, cand.hostDispatch + drain - T.total());
  }

  // Memory: the largest stage.
  MemoryBreakdown peak;
  double peakTotal = -1;
  for (int st = 0; st < pp; ++st) {
    const StageSum &x = ss[st];
    MemoryBreakdown mb;
    mb.stage = st;
    if (train) {
      auto states = stateMemory(x.paramElems, dp, cfg.zeroStage,
                                cfg.optimizer, cfg.precision);
      if (states) {
        mb.params = states->params;
        mb.grads = states->grads;
        mb.optimizer = states->optimizer;
      }
      mb.activations = x.act * microBatchesInFlight(cfg, st);
    } else {
      mb.params = x.paramElems * cfg.precision.paramBytes;
      // Live values of a forward pass: bounded by twice the largest op.
      mb.activations = 0;
    }
    mb.transient = x.work * (train ? 1.0 : 2.0);
    int comms = (t > 1) + (dp > 1 && train) + (pp > 1);
    mb.commBuffers = comms * cal.ncclBufferBytes;
    if (pp > 1) {
      // The largest activation this stage sends or receives.
      double largest = 0;
      for (int ch = 0; ch + 1 < chunks; ++ch)
        if (ch % pp == st || (ch + 1) % pp == st)
          largest = std::max(largest, boundary[ch]);
      mb.commBuffers += 2 * largest;
    }
    if (train && dp > 1 && cfg.zeroStage < 3)
      mb.commBuffers += gradBuckets(mb.grads, cfg.zeroStage, dp,
                                    cfg.precision, cal.gradBucketBytes);
    if (train && dp > 1 && cfg.zeroStage == 3)
      mb.commBuffers += zeroThreeBuffers(x.largestParam, mb.grads, dp,
                                         cfg.precision, cal.gradBucketBytes);
    mb.workspace = cal.runtimeReservedBytes +
                   cal.fragmentationFraction *
                       (mb.activations + mb.transient + mb.commBuffers);
    if (mb.total() > peakTotal) {
      peakTotal = mb.total();
      peak = mb;
    }
  }
  cand.memory = peak;
  return out;
}

} // namespace dlopt::planner::oppricing
