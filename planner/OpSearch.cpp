//===- OpSearch.cpp - The op-level search: dp x tp x pp around the ILP ----===//
#include "planner/OpSearch.h"
#include "planner/Simulator.h"

#include "planner/PlanJson.h"
#include "planner/ReportUtil.h"
#include "planner/ConfigSpace.h"
#include "planner/SearchUtil.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <tuple>

namespace dlopt::planner {

namespace {

using namespace report;

constexpr double kInf = std::numeric_limits<double>::infinity();

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

} // namespace

//===----------------------------------------------------------------------===//
// The search
//===----------------------------------------------------------------------===//

std::string OpCandidate::key() const {
  return "dp=" + std::to_string(cfg.dp) + " tp=" + std::to_string(cfg.tp) +
         " pp=" + std::to_string(cfg.pp) +
         " mbs=" + std::to_string(cfg.microBatchSize) +
         " mb=" + std::to_string(cfg.numMicroBatches) +
         " zero=" + std::to_string(cfg.zeroStage);
}

namespace {

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

/// Operand `i` of `op` on one of t ranks under `st`: its micro-batch shape
/// with the strategy's split dim divided by t (rounded up).
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

/// HBM bytes one of t ranks moves for `op` under strategy `st`: each
/// operand and result #0 at its layout's share (a replicated weight is read
/// whole by every rank, a split one 1/t, a partial sum is written whole),
/// plus the results past #0 (batch-norm running stats, ...) whole. A
/// reshape moves nothing.
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

/// One optimizer step over `elems` parameters: a memory-bound elementwise
/// pass over the bytes the fused update moves (optimizerStepBytesPerParam;
/// CostModel::optimizerTime: at the calibrated optimizer_gb_s when
/// measured).
double optimizerTime(const Ctx &c, double elems) {
  if (elems <= 0)
    return 0;
  const double bytes = optimizerStepBytesPerParam(c.opt.optimizer, c.opt.bytes);
  auto e = c.cost.optimizerTime(10 * elems, bytes * elems, c.opt.precision,
                                c.gpu);
  return e ? e->time : 0;
}

/// Builds and solves the strategy problem of (t, dp, mbs).
std::unique_ptr<Solved> solveFor(Ctx &c, int t, int dp, int64_t mbs,
                                 int64_t m, const MemWeights *mw) {
  const GraphSummary &g = c.g;
  auto s = std::make_unique<Solved>(g, mbs, c.floatBytes);
  s->t = t;
  s->dp = dp;
  s->mbs = mbs;
  s->m = m;
  s->constrained = mw != nullptr;
  if (mw)
    s->weights = *mw;
  const size_t nOps = g.ops.size(), nArgs = g.args.size();
  s->strategies.resize(nOps);
  s->argLayouts.resize(nArgs);
  s->nodeOfOp.assign(nOps, -1);
  s->nodeOfArg.assign(nArgs, -1);
  const double mm = double(m);
  ShardingProblem &p = s->problem;
  const bool train = c.train;

  // Params used by forward ops are nodes (their layout over t).
  std::vector<bool> used(nArgs, false);
  for (int id : c.fwdOps)
    for (const ValueRef &r : g.ops[id].operands)
      if (r.isArg() && r.argIndex() < int(nArgs))
        used[r.argIndex()] = true;
  for (size_t a = 0; a < nArgs; ++a) {
    if (!used[a] || g.args[a].role != ArgNode::Role::Param)
      continue;
    s->argLayouts[a] = paramLayouts(g.args[a].shape, t);
    double elems = 1;
    for (int64_t d : g.args[a].shape)
      elems *= double(d);
    ShardingProblem::Node n;
    for (const Layout &l : s->argLayouts[a]) {
      double div = l.kind == Layout::S ? t : 1;
      double sync = 0;
      if (train && dp > 1)
        sync = c.pricer.time(Collective::AllReduce,
                             elems / div * c.opt.bytes.gradReduceBytes, dp, t);
      // The optimizer updates what the device holds; without training, a
      // tie-breaker of 0.1 ns per GB held keeps weights sharded when that
      // is free.
      double update = train ? optimizerTime(c, elems / div)
                            : 1e-19 * elems / div * c.opt.bytes.paramBytes;
      n.cost.push_back(sync + update);
      n.mem.push_back(mw ? elems / div * mw->paramPerElem : 0.0);
    }
    s->nodeOfArg[a] = int(p.nodes.size());
    p.nodes.push_back(std::move(n));
  }

  // Forward ops (constants are free values, like inputs).
  for (int id : c.fwdOps) {
    const OpNode &op = g.ops[id];
    if (op.kind == OpClass::Constant)
      continue;
    s->strategies[id] = shardingRules(s->geo, id, t);
    const double scale = s->geo.scale(id);
    const double flops = op.flops * scale;
    ShardingProblem::Node n;
    for (const Strategy &st : s->strategies[id]) {
      double fwd = c.forwardTime(*s, op, st, flops, opBytes(*s, op, st, t), t);
      double comp = c.stepTime(*s, op, st, fwd, t);
      double comm = 0;
      for (const IntrinsicComm &ic : st.comms)
        if (train || !ic.backward)
          comm += c.pricer.time(ic.collective, ic.bytes, t, 1);
      n.cost.push_back(mm * (comp + comm));
      double act = 0;
      if (train && op.isFloat)
        act = s->geo.result(id).bytes /
              (st.result.kind == Layout::S ? double(t) : 1.0);
      n.mem.push_back(mw ? act * mw->activation : 0.0);
    }
    s->nodeOfOp[id] = int(p.nodes.size());
    p.nodes.push_back(std::move(n));
  }

  // Edges: producer layout x consumer strategy.
  for (int id : c.fwdOps) {
    int v = s->nodeOfOp[id];
    if (v < 0)
      continue;
    const OpNode &op = g.ops[id];
    const auto &sv = s->strategies[id];
    for (size_t i = 0; i < op.operands.size(); ++i) {
      const ValueRef &ref = op.operands[i];
      int u = -1;
      std::vector<Layout> from;
      bool isParam = false;
      if (ref.isArg()) {
        if (ref.argIndex() >= int(nArgs) || s->nodeOfArg[ref.argIndex()] < 0)
          continue;
        u = s->nodeOfArg[ref.argIndex()];
        from = s->argLayouts[ref.argIndex()];
        isParam = true;
      } else {
        if (ref.producer < 0 || ref.result != 0 ||
            s->nodeOfOp[ref.producer] < 0)
          continue;
        u = s->nodeOfOp[ref.producer];
        for (const Strategy &ps : s->strategies[ref.producer])
          from.push_back(ps.result);
      }
      const ValueInfo &val = s->geo.operand(id, int(i));
      const bool grad = train && val.needsGrad;
      ShardingProblem::Edge e;
      e.u = u;
      e.v = v;
      bool any = false;
      for (const Layout &lu : from)
        for (const Strategy &st : sv) {
          const Layout req = st.operands[i];
          double fwd = c.pricer.time(reshard(lu, req, val.bytes, t), t);
          double bwd = 0;
          if (grad)
            bwd = c.pricer.time(reshard(gradLayout(req, st.divisor),
                                        gradNeed(lu), val.bytes, t),
                                t);
          double cost = mm * fwd + (isParam ? 1.0 : mm) * bwd;
          any |= cost != 0;
          e.cost.push_back(cost);
        }
      if (any)
        p.edges.push_back(std::move(e));
    }
  }
  if (mw)
    p.memBudget = mw->budget;

  auto solved = solveSharding(p, c.solveOptions);
  if (solved) {
    s->solve = *solved;
  } else {
    // Only malformed problems fail; fall back to all-replicated.
    s->solve.choice.assign(p.nodes.size(), 0);
    s->solve.note = solved.status().message();
  }
  if (c.stats) {
    ++c.stats->solves;
    if (s->solve.ilpVars > 0)
      ++c.stats->ilpSolves;
    c.stats->maxCoreNodes =
        std::max<int64_t>(c.stats->maxCoreNodes, s->solve.coreNodes);
    c.stats->maxIlpVars = std::max(c.stats->maxIlpVars, s->solve.ilpVars);
    c.stats->maxIlpRows = std::max(c.stats->maxIlpRows, s->solve.ilpRows);
    c.stats->ilpSeconds += s->solve.ilpSeconds;
    if (!s->solve.note.empty()) {
      std::string note = "tp=" + std::to_string(t) + " dp=" +
                         std::to_string(dp) + " mbs=" + std::to_string(mbs) +
                         (mw ? " (memory-constrained)" : "") + ": " +
                         s->solve.note;
      if (c.stats->notes.size() < 8)
        c.stats->notes.push_back(note);
    }
  }

  // Per-op costs of the choice.
  const auto &ch = s->solve.choice;
  s->chosen.assign(nOps, -1);
  s->compute.assign(nOps, 0);
  s->mbComm.assign(nOps, 0);
  s->mbCalls.assign(nOps, 0);
  s->stepCalls.assign(nOps, 0);
  s->stepComm.assign(nOps, 0);
  s->activation.assign(nOps, 0);
  s->workingSet.assign(nOps, 0);
  s->resultLayout.assign(nOps, Layout::rep());
  s->paramLayout.assign(nArgs, Layout::rep());
  s->paramsOf.assign(nOps, {});
  for (size_t a = 0; a < nArgs; ++a)
    if (s->nodeOfArg[a] >= 0)
      s->paramLayout[a] = s->argLayouts[a][ch[s->nodeOfArg[a]]];
  for (int id : c.fwdOps)
    if (s->nodeOfOp[id] >= 0) {
      s->chosen[id] = ch[s->nodeOfOp[id]];
      s->resultLayout[id] = s->strategies[id][s->chosen[id]].result;
    }
  for (int id : c.fwdOps) {
    const OpNode &op = g.ops[id];
    for (const ValueRef &r : op.operands)
      if (r.isArg() && r.argIndex() < int(nArgs) &&
          s->nodeOfArg[r.argIndex()] >= 0)
        s->paramsOf[id].push_back(r.argIndex());
    if (s->chosen[id] < 0)
      continue;
    const Strategy &st = s->strategies[id][s->chosen[id]];
    double flops = op.flops * s->geo.scale(id);
    double fwd = c.forwardTime(*s, op, st, flops, opBytes(*s, op, st, t), t);
    s->compute[id] = c.stepTime(*s, op, st, fwd, t);
    // Each collective is priced and counted (a launch of its own for the
    // host, docs/cost-model.md section 8).
    auto addMb = [&](double time) {
      s->mbComm[id] += time;
      s->mbCalls[id] += time > 0;
    };
    for (const IntrinsicComm &ic : st.comms)
      if (train || !ic.backward)
        addMb(c.pricer.time(ic.collective, ic.bytes, t, 1));
    double work = s->geo.result(id).bytes /
                  (st.result.kind == Layout::S ? double(t) : 1.0);
    // Kept for the backward pass: what dlopt's own backward reads
    // (OpNode::savedForBackward; every float result when unknown).
    if (train && op.isFloat && op.savedForBackward)
      s->activation[id] = work;
    for (size_t i = 0; i < op.operands.size(); ++i) {
      const ValueRef &ref = op.operands[i];
      const ValueInfo &val = s->geo.operand(id, int(i));
      const Layout req = st.operands[i];
      work += val.bytes / (req.kind == Layout::S ? double(t) : 1.0);
      Layout lu;
      bool isParam = false;
      if (ref.isArg()) {
        if (ref.argIndex() >= int(nArgs) || s->nodeOfArg[ref.argIndex()] < 0)
          continue;
        lu = s->paramLayout[ref.argIndex()];
        isParam = true;
      } else {
        if (ref.producer < 0 || ref.result != 0 ||
            s->chosen[ref.producer] < 0)
          continue;
        lu = s->resultLayout[ref.producer];
      }
      addMb(c.pricer.time(reshard(lu, req, val.bytes, t), t));
      if (train && val.needsGrad) {
        double b = c.pricer.time(
            reshard(gradLayout(req, st.divisor), gradNeed(lu), val.bytes, t),
            t);
        if (isParam) {
          s->stepComm[id] += b;
          s->stepCalls[id] += b > 0;
        } else
          addMb(b);
      }
    }
    s->workingSet[id] = work;
  }
  return s;
}

struct Priced {
  OpCandidate cand;
  std::vector<int> starts; ///< stage starts over units
  std::vector<int> unitStart; ///< unit -> first index into fwdOps
  bool byLayer = false;
};

/// Units of the partition: runs of equal layer marks when the graph has
/// marks and enough of them, else single ops. Returns start positions in
/// fwdOps (plus the end).
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

/// Model chunks per stage: v for the interleaved schedule, else 1.
int chunksPerStage(const TrainingConfig &cfg, bool train) {
  return train && cfg.schedule == PipelineSchedule::Interleaved1F1B
             ? std::max(1, cfg.virtualStages)
             : 1;
}

/// Prices one candidate from a solved strategy problem. `stageOps` gets each
/// stage's range of positions in fwdOps when given.
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
    double paramElems = 0, largestParam = 0;
    double ops = 0; ///< forward ops a micro-batch launches (no constants)
    double calls = 0; ///< collectives a micro-batch launches
    double stepCalls = 0; ///< collectives launched once a step
    std::set<int> params;
  };
  std::vector<StageSum> ss(pp);
  for (size_t i = 0; i < c.fwdOps.size(); ++i) {
    int id = c.fwdOps[i];
    StageSum &x = ss[stageOfPos[i]];
    if (c.g.ops[id].kind != OpClass::Constant)
      x.ops += 1;
    x.compute += s.compute[id];
    x.comm += s.mbComm[id];
    x.calls += s.mbCalls[id];
    x.stepCalls += s.stepCalls[id];
    x.step += s.stepComm[id];
    x.act += s.activation[id];
    x.work = std::max(x.work, s.workingSet[id]);
    for (int a : s.paramsOf[id])
      x.params.insert(a);
  }
  for (StageSum &x : ss)
    for (int a : x.params) {
      double e = 1;
      for (int64_t d : c.g.args[a].shape)
        e *= double(d);
      e /= s.paramLayout[a].kind == Layout::S ? double(t) : 1.0;
      x.paramElems += e;
      x.largestParam = std::max(x.largestParam, e);
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
    T.bubble = (pp - 1) * perMb / V;
    if (train && cfg.schedule == PipelineSchedule::ZeroBubble) {
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
      double e = 0;
      if (cfg.zeroStage == 0) {
        e = c.cost.exposedGradSync(
            c.pricer.time(Collective::AllReduce, grads, dp, t), backward,
            grads);
      } else {
        // ZeRO >= 2 keeps no whole gradient: each micro-batch's is
        // reduce-scattered as its backward pass makes it; they queue on
        // their own lane, so only the last shows unless they outlast the
        // backwards (chunkedGradSyncExposed).
        const double rs =
            c.pricer.time(Collective::ReduceScatter, grads, dp, t);
        const double last = c.cost.exposedGradSync(rs, backward, grads);
        e = cfg.zeroStage >= 2
                ? chunkedGradSyncExposed(rs, last, int(m), backward)
                : last;
        double ag = c.pricer.time(Collective::AllGather, params, dp, t);
        double agBwd = c.pricer.time(Collective::AllGather,
                                     params * c.bwdReadFraction, dp, t);
        e += cfg.zeroStage < 3
                 ? ag
                 : m * CostModel::exposed(ag + agBwd, x.compute + x.comm,
                                          cal.gradOverlapEfficiency);
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
      mb.commBuffers += 2 * x.largestParam * cfg.precision.paramBytes;
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

bool better(const OpCandidate &a, const OpCandidate &b) {
  double ta = a.time.total(), tb = b.time.total();
  if (ta != tb)
    return ta < tb;
  auto k = [](const OpCandidate &c) {
    return std::make_tuple(c.cfg.tp, c.cfg.pp, c.cfg.dp, c.cfg.microBatchSize,
                           c.cfg.zeroStage, int(c.cfg.schedule));
  };
  return k(a) < k(b);
}

SolverKind solverFromEnv() {
  const char *e = std::getenv("DLOPT_OP_SOLVER");
  if (!e)
    return SolverKind::Auto;
  std::string s = e;
  if (s == "ilp")
    return SolverKind::Ilp;
  if (s == "greedy")
    return SolverKind::Greedy;
  return SolverKind::Auto;
}

} // namespace

OpGraphParts splitOpGraph(const GraphSummary &g) {
  OpGraphParts parts;
  // A graph that is already a training step (dlopt-compile --train --emit
  // mlir) has backward ops (dlopt.backward) and, after them, the optimizer
  // update: the update is priced as the optimizer step, not planned per op.
  bool seenBackward = false;
  for (const OpNode &op : g.ops) {
    if (op.backward) {
      parts.backwardFlops += op.flops;
      ++parts.numBackward;
      // (Constants are hoisted to the top by canonicalization.)
      seenBackward |= op.kind != OpClass::Constant;
    } else if (seenBackward) {
      ++parts.numUpdate;
    } else {
      parts.forwardFlops += op.flops;
      parts.forward.push_back(op.id);
    }
  }
  return parts;
}

Expected<OpPlanResult> searchOpPlan(const GraphSummary &g,
                                    const Cluster &cluster,
                                    const CostModel &cost,
                                    const SearchOptions &opt) {
  auto t0 = Clock::now();
  DLOPT_RETURN_IF_ERROR(cluster.validate());
  DLOPT_RETURN_IF_ERROR(validateSearchOptions(opt));
  OpPlanResult res;
  OpSearchStats &st = res.stats;
  Ctx c{g, cluster, cost, opt, CommPricer(cluster, cost), {}, 0, true, 2, 4,
        {}, {}, nullptr};
  c.stats = &st;
  c.bwdReadFraction = backwardReadFraction(g);
  c.train = opt.training;
  c.floatBytes = opt.bytes.activationBytes;
  c.capacity = cluster.minDeviceMemory();
  c.solveOptions.kind = solverFromEnv();
  // Memory-constrained problems get the Lagrangian search while enumerating;
  // the ILP polishes the chosen plan only.
  c.solveOptions.polish = false;
  auto gpu = pacingGpu(cluster, opt.precision);
  if (!gpu)
    return gpu.status();
  c.gpu = *gpu;
  c.gpusPerNode =
      cluster.groups.empty() ? 1 : std::max(1, cluster.groups.front().gpusPerNode);
  c.host = mostConstrainedHost(cluster);
  // What the op-level search does not vary (cp, sp, recompute) is refused
  // when fixed (ConfigSpace.h).
  std::string fixWhy = unsupportedFixes(SpaceRules{}, opt.fix);
  if (!fixWhy.empty())
    return Status::error("--fix " + opt.fix.str() + " is impossible: " +
                         fixWhy);

  const OpGraphParts parts = splitOpGraph(g);
  const double fwdFlops = parts.forwardFlops, bwdFlops = parts.backwardFlops;
  c.fwdOps = parts.forward;
  res.numBackwardOps = parts.numBackward;
  res.numUpdateOps = parts.numUpdate;
  res.numForwardOps = int(c.fwdOps.size());
  if (c.fwdOps.empty())
    return Status::error("the entry function @" + g.modelName +
                         " has no ops to plan");
  c.ratio = cost.calibration().backwardFlopsRatio;
  if (res.numBackwardOps > 0 && fwdFlops > 0) {
    c.ratio = bwdFlops / fwdFlops;
    res.backwardFromGraph = true;
  }
  res.backwardRatio = c.ratio;

  const int devices = cluster.numDevices();
  const int64_t B = g.batch > 0 ? g.batch : 1;
  const int64_t gb = opt.globalBatch > 0 ? opt.globalBatch : B;
  if (gb < 1)
    return Status::error("the global batch must be at least 1");
  const FixSpec &fix = opt.fix;
  const int gpusPerNode =
      cluster.groups.empty() ? 1 : cluster.groups.front().gpusPerNode;

  std::map<std::tuple<int, int, int64_t>, std::unique_ptr<Solved>> cache;
  std::map<std::tuple<int, int, int64_t, int, int>, std::unique_ptr<Solved>>
      memCache;
  CandidateRanking<OpCandidate, std::tuple<int, int, int>, decltype(&better)>
      ranking(opt.topK, &better);
  const Solved *bestSolved = nullptr;
  int constrainedSolves = 0;
  const int kMaxConstrainedSolves = 48;

  auto consider = [&](const OpCandidate &cand, const Solved *s) {
    auto out = ranking.consider({cand.cfg.dp, cand.cfg.tp, cand.cfg.pp}, cand);
    if (out.newBest)
      bestSolved = s;
    return out.fits;
  };

  SpaceRules rules;
  rules.devices = devices;
  rules.gpusPerNode = gpusPerNode;
  rules.globalBatch = gb;
  // Every micro-batch size (SearchOptions::maxMicroBatch caps only the
  // transformer search): a sample is a row or an image here.
  rules.maxMicroBatch = 0;
  rules.training = c.train;
  rules.optimizer = opt.optimizer;
  rules.bytes = opt.bytes;
  rules.units = "ops";
  rules.numUnits = int64_t(c.fwdOps.size());
  forEachConfig(rules, fix, st.pruned, [&](const TrainingConfig &cfg) {
    const int t = cfg.tp, dp = cfg.dp, pp = cfg.pp, zero = cfg.zeroStage;
    const int64_t mbs = cfg.microBatchSize, m = cfg.numMicroBatches;
    auto key = std::make_tuple(t, dp, mbs);
    auto it = cache.find(key);
    if (it == cache.end())
      it = cache.emplace(key, solveFor(c, t, dp, mbs, m, nullptr)).first;
    const Solved &s = *it->second;
    Priced pr = price(c, s, cfg);
    if (consider(pr.cand, &s) || t == 1)
      return;
    // Out of memory: let the ILP trade time for memory.
    if (constrainedSolves >= kMaxConstrainedSolves) {
      if (st.notes.size() < 8 &&
          std::find(st.notes.begin(), st.notes.end(),
                    "memory-constrained solves stopped at " +
                        std::to_string(kMaxConstrainedSolves)) ==
              st.notes.end())
        st.notes.push_back("memory-constrained solves stopped at " +
                           std::to_string(kMaxConstrainedSolves));
      return;
    }
    const Calibration &cal = cost.calibration();
    MemWeights mw;
    double inflight = c.train ? microBatchesInFlight(cfg, 0) : 0.0;
    mw.paramPerElem = stateBytesPerElem(opt, c.train) / pp;
    if (c.train && dp > 1) {
      auto one = stateMemory(1.0, dp, zero, opt.optimizer, opt.bytes);
      if (one)
        mw.paramPerElem = one->total() / pp;
    }
    mw.activation = inflight / pp * (1 + cal.fragmentationFraction);
    double fixed = pr.cand.memory.commBuffers + pr.cand.memory.transient +
                   cal.runtimeReservedBytes;
    mw.budget = c.capacity - fixed;
    if (mw.budget <= 0)
      return;
    auto mkey = std::make_tuple(t, dp, mbs, pp, zero);
    auto mit = memCache.find(mkey);
    if (mit == memCache.end()) {
      ++constrainedSolves;
      mit = memCache.emplace(mkey, solveFor(c, t, dp, mbs, m, &mw)).first;
    }
    Priced pc = price(c, *mit->second, cfg);
    consider(pc.cand, mit->second.get());
  });

  st.priced = ranking.priced();
  st.feasible = ranking.feasible();
  st.outOfMemory = ranking.outOfMemory();
  std::string fixNote = fix.empty() ? "" : " with --fix " + fix.str();
  if (st.priced == 0)
    return noCandidateError(fixNote, devices, gb, st.pruned);
  if (!ranking.best()) {
    const OpCandidate &lm = *ranking.leastMemory();
    return noFitError(fixNote, lm.memory.total(), lm.key(), lm.capacity);
  }
  std::optional<OpCandidate> best = ranking.best();

  // Alternatives, as in the transformer search.
  res.alternatives = ranking.alternatives<OpAlternative>(*best);

  std::unique_ptr<Solved> polished;
  if (bestSolved->constrained && c.solveOptions.kind == SolverKind::Auto) {
    c.solveOptions.polish = true;
    const TrainingConfig &bc = best->cfg;
    polished = solveFor(c, bc.tp, bc.dp, bc.microBatchSize, bc.numMicroBatches,
                        &bestSolved->weights);
    Priced pp = price(c, *polished, bc);
    if (pp.cand.fits() && pp.cand.time.total() <= best->time.total()) {
      best = pp.cand;
      bestSolved = polished.get();
    }
  }

  // The chosen plan in detail.
  const Solved &s = *bestSolved;
  Priced pr = price(c, s, best->cfg);
  res.best = pr.cand;
  res.solve = s.solve;
  st.problemNodes = int64_t(s.problem.nodes.size());
  st.problemEdges = int64_t(s.problem.edges.size());
  res.stagesByLayer = pr.byLayer;
  const int t = best->cfg.tp, dp = best->cfg.dp, pp = best->cfg.pp;
  const double m = double(best->cfg.numMicroBatches);
  for (int id : c.fwdOps) {
    OpChoice ch;
    ch.op = id;
    if (s.chosen[id] >= 0) {
      const Strategy &sg = s.strategies[id][s.chosen[id]];
      ch.strategy = sg.name;
      ch.operands = sg.operands;
      ch.result = sg.result;
    } else {
      ch.strategy = "replicated";
      ch.operands.assign(g.ops[id].operands.size(), Layout::rep());
    }
    ch.time = s.compute[id] + s.mbComm[id];
    res.choices.push_back(std::move(ch));
  }
  for (size_t a = 0; a < g.args.size(); ++a)
    if (s.nodeOfArg[a] >= 0)
      res.params.emplace_back(g.args[a].name, s.paramLayout[a]);

  // Reshardings and intrinsic collectives of the chosen plan.
  auto producerName = [&](const ValueRef &r) {
    if (r.isArg())
      return "param " + (r.argIndex() < int(g.args.size())
                             ? g.args[r.argIndex()].name
                             : std::to_string(r.argIndex()));
    return "#" + std::to_string(r.producer) + " " + g.ops[r.producer].op;
  };
  double tpTotal = 0;
  for (int id : c.fwdOps) {
    if (s.chosen[id] < 0)
      continue;
    const OpNode &op = g.ops[id];
    const Strategy &sg = s.strategies[id][s.chosen[id]];
    for (const IntrinsicComm &ic : sg.comms) {
      if (!c.train && ic.backward)
        continue;
      ReshardOp r;
      r.consumer = id;
      r.what = ic.what;
      r.backward = ic.backward;
      r.collective = ic.collective;
      r.groupSize = t;
      r.bytes = ic.bytes;
      r.time = c.pricer.time(ic.collective, ic.bytes, t, 1, &r.link);
      res.reshards.push_back(r);
    }
    for (size_t i = 0; i < op.operands.size(); ++i) {
      const ValueRef &ref = op.operands[i];
      const ValueInfo &val = s.geo.operand(id, int(i));
      Layout lu;
      bool isParam = false;
      if (ref.isArg()) {
        if (ref.argIndex() >= int(g.args.size()) ||
            s.nodeOfArg[ref.argIndex()] < 0)
          continue;
        lu = s.paramLayout[ref.argIndex()];
        isParam = true;
      } else {
        if (ref.producer < 0 || ref.result != 0 || s.chosen[ref.producer] < 0)
          continue;
        lu = s.resultLayout[ref.producer];
      }
      const Layout req = sg.operands[i];
      auto add = [&](const Reshard &rs, bool bwd) {
        if (!rs.needed)
          return;
        ReshardOp r;
        r.consumer = id;
        r.operand = int(i);
        r.producer = producerName(ref);
        r.what = rs.str();
        r.backward = bwd;
        r.perStep = bwd && isParam;
        r.collective = rs.collective;
        r.groupSize = t;
        r.bytes = rs.bytes;
        r.time = c.pricer.time(rs, t, &r.link);
        res.reshards.push_back(r);
      };
      add(reshard(lu, req, val.bytes, t), false);
      if (c.train && val.needsGrad)
        add(reshard(gradLayout(req, sg.divisor), gradNeed(lu), val.bytes, t),
            true);
    }
  }
  for (const ReshardOp &r : res.reshards)
    tpTotal += r.time * (r.perStep ? 1.0 : m);

  // Per-step collectives, in the transformer report's form.
  auto record = [&](const std::string &what, Collective coll, int size,
                    int stride, double bytes, double calls, double exposed) {
    if (size <= 1 || calls <= 0 || bytes <= 0)
      return;
    LinkKind link = LinkKind::None;
    CommAlgorithm algo = CommAlgorithm::Ring;
    double time =
        calls * c.pricer.time(coll, bytes, size, stride, &link, &algo);
    res.comms.push_back({what, coll, size, bytes, calls, link, time, exposed,
                         algorithmName(algo)});
  };
  if (t > 1 && !res.reshards.empty()) {
    // Summed: the per-op list is in `reshards`.
    CommOp op;
    op.what = "tp resharding + op collectives (all)";
    op.collective = Collective::AllReduce;
    op.groupSize = t;
    op.calls = 0;
    for (const ReshardOp &r : res.reshards) {
      op.calls += r.perStep ? 1 : m;
      op.bytes = std::max(op.bytes, r.bytes);
      if (r.link == LinkKind::Network || op.link == LinkKind::None)
        op.link = r.link;
    }
    op.time = tpTotal;
    op.exposed = res.best.time.tpComm;
    op.algorithm = "mixed";
    res.comms.push_back(op);
  }
  // Chunk ranges (one per stage, or v per stage interleaved) and their
  // boundaries.
  const int chunks = int(pr.starts.size()) - 1;
  for (int ch = 0; ch < chunks; ++ch) {
    OpStage os;
    os.stage = ch % pp;
    int fromPos = pr.unitStart[pr.starts[ch]];
    int toPos = pr.unitStart[pr.starts[ch + 1]] - 1;
    os.firstOp = c.fwdOps[fromPos];
    os.lastOp = c.fwdOps[toPos];
    os.numOps = toPos - fromPos + 1;
    for (int i = fromPos; i <= toPos; ++i) {
      int id = c.fwdOps[i];
      os.timePerMicroBatch += s.compute[id] + s.mbComm[id];
      int64_t l = g.ops[id].layer;
      if (l >= 0) {
        if (os.firstLayer < 0)
          os.firstLayer = l;
        os.lastLayer = l;
      }
    }
    res.stages.push_back(os);
  }
  if (pp > 1) {
    std::vector<int> stageOf(g.ops.size(), -1); // the chunk, here
    for (int ch = 0; ch < chunks; ++ch)
      for (int i = pr.unitStart[pr.starts[ch]];
           i < pr.unitStart[pr.starts[ch + 1]]; ++i)
        stageOf[c.fwdOps[i]] = ch;
    std::vector<int> lastUse(g.ops.size(), -1);
    for (int id : c.fwdOps)
      for (const ValueRef &r : g.ops[id].operands)
        if (!r.isArg() && r.producer >= 0 && stageOf[r.producer] >= 0)
          lastUse[r.producer] = std::max(lastUse[r.producer], stageOf[id]);
    for (int id : c.fwdOps) {
      if (lastUse[id] <= stageOf[id] || g.ops[id].kind == OpClass::Constant)
        continue;
      double b = s.geo.result(id).bytes /
                 (s.resultLayout[id].kind == Layout::S ? double(t) : 1.0);
      for (int sg = stageOf[id]; sg < lastUse[id]; ++sg)
        res.stages[sg].boundaryBytes += b;
    }
    double worst = 0;
    for (int ch = 0; ch + 1 < chunks; ++ch)
      worst = std::max(worst, res.stages[ch].boundaryBytes);
    record("pp send/recv (stage boundary)", Collective::SendRecv, 2, t * dp,
           worst, (c.train ? 2 : 1) * m * (chunks / pp),
           res.best.time.ppComm);
  }
  if (c.train && dp > 1) {
    double elems = 0;
    for (size_t a = 0; a < g.args.size(); ++a)
      if (s.nodeOfArg[a] >= 0) {
        double e = 1;
        for (int64_t d : g.args[a].shape)
          e *= double(d);
        elems += e / (s.paramLayout[a].kind == Layout::S ? double(t) : 1.0);
      }
    elems /= pp; // roughly one stage's share
    const TrainingConfig &cfg = res.best.cfg;
    double grads = elems * cfg.precision.gradBytes;
    double params = elems * cfg.precision.paramBytes;
    if (cfg.zeroStage == 0) {
      record("dp gradient all-reduce", Collective::AllReduce, dp, t, grads, 1,
             res.best.time.dpComm);
    } else {
      record("dp gradient reduce-scatter", Collective::ReduceScatter, dp, t,
             grads, cfg.zeroStage >= 2 ? m : 1, res.best.time.dpComm);
      if (cfg.zeroStage < 3)
        record("dp parameter all-gather (after update)", Collective::AllGather,
               dp, t, params, 1, 0);
      else {
        record("dp zero-3 parameter all-gather (forward)", Collective::AllGather,
               dp, t, params, m, 0);
        // The backward pass gathers only what it reads.
        record("dp zero-3 parameter all-gather (backward)", Collective::AllGather,
               dp, t, params * c.bwdReadFraction, m, 0);
      }
    }
  }

  // The plan: the ILP's layouts over tp, batch dims over dp.
  // The process layout: one process per device unless --fix says (the
  // op-level search prices the host dispatch of the layout it is given but
  // does not choose one).
  res.plan = planFromConfig(PlanKind::OpLevel, g, cluster, res.best.cfg, gb,
                            c.train, opt.precision,
                            fix.layout.value_or(ProcessLayout::BetweenGraph));
  {
    auto sharding = [&](Layout l, size_t rank, int batchDim) {
      Sharding sh = Sharding::replicated(int(rank));
      if (dp > 1 && batchDim >= 0 && batchDim < int(rank))
        sh.split[batchDim].push_back("dp");
      if (t > 1 && l.kind == Layout::S && l.dim >= 0 && l.dim < int(rank))
        sh.split[l.dim].push_back("tp");
      else if (t > 1 && l.kind == Layout::P)
        sh.partial.push_back("tp");
      return sh;
    };
    std::vector<int> stageOfOp(g.ops.size(), 0);
    for (int ch = 0; ch + 1 < int(pr.starts.size()); ++ch)
      for (int i = pr.unitStart[pr.starts[ch]];
           i < pr.unitStart[pr.starts[ch + 1]]; ++i)
        stageOfOp[c.fwdOps[i]] = ch % pp;
    for (const OpChoice &ch : res.choices) {
      const OpNode &n = g.ops[ch.op];
      PlannedOp po;
      po.id = n.key();
      po.op = n.op;
      po.stage = stageOfOp[ch.op];
      po.strategy = ch.strategy;
      for (size_t k = 0; k < n.operands.size(); ++k)
        po.operands.push_back(sharding(
            k < ch.operands.size() ? ch.operands[k] : Layout::rep(),
            n.operandShapes[k].size(), s.geo.operand(ch.op, int(k)).batchDim));
      po.results.push_back(
          sharding(ch.result, n.shape.size(), s.geo.batchDim(ch.op)));
      // Results the rules do not describe: like result #0 when shaped like
      // it, else replicated.
      for (int k = 1; k < n.numResults; ++k) {
        std::vector<int64_t> shape = g.resultShape(n, k);
        po.results.push_back(shape == n.shape
                                 ? po.results[0]
                                 : Sharding::replicated(int(shape.size())));
      }
      res.plan.ops.push_back(std::move(po));
    }
    std::map<std::string, Layout> paramLayout(res.params.begin(),
                                              res.params.end());
    for (const ArgNode &a : g.args) {
      auto it = paramLayout.find(a.name);
      Layout l = it == paramLayout.end() ? Layout::rep() : it->second;
      int batchDim =
          a.role == ArgNode::Role::Input ? s.geo.arg(a.index).batchDim : -1;
      res.plan.args.push_back(
          {a.name, a.role, sharding(l, a.shape.size(), batchDim)});
    }
  }

  res.globalBatch = gb;
  res.training = c.train;
  res.precision = opt.precision;
  res.peakFlops = c.gpu.peak(opt.precision);
  res.modelFlopsPerStep =
      fwdFlops / double(B) * double(gb) * (c.train ? 1 + c.ratio : 1.0);
  st.seconds = since(t0);
  return res;
}

} // namespace dlopt::planner
