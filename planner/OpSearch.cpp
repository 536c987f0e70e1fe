//===- OpSearch.cpp - The op-level search: dp x tp x pp around the ILP ----===//
#include "planner/OpSearch.h"
#include "planner/OpPricing.h"
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

using namespace oppricing;

namespace {

using namespace report;

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
  if (opt.bytes.unfusedAttention)
    return Status::error(
        "unfused attention (--attention-kernel unfused) is priced by the "
        "transformer search only (models with layer marks); the op-level "
        "search prices dlopt's fused attention");
  if (opt.bytes.eagerNorm || opt.bytes.eagerRope)
    return Status::error(
        "eager norms and rotary embeddings (--eager-kernels) are priced by "
        "the transformer search only (models with layer marks); the "
        "op-level search prices dlopt's fused kernels");
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
  if (!fix.empty())
    if (std::string why = explainShapeFix(rules, fix); !why.empty())
      return Status::error("--fix " + fix.str() + " is impossible: " + why);
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
    CommProtocol proto = CommProtocol::None;
    double time =
        calls * c.pricer.time(coll, bytes, size, stride, &link, &algo, &proto);
    res.comms.push_back({what, coll, size, bytes, calls, link, time, exposed,
                         algorithmName(algo), protocolName(proto)});
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
    op.protocol = "mixed";
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
      // Under ZeRO-3 the exposure splits over the rows: the forward's
      // gathers, the backward's gathers' share of the links they share
      // with the reduce-scatters, and the rest the reduce-scatters'.
      const OpCandidate &best = res.best;
      const double z3 =
          best.zero3ForwardExposed + best.zero3BackwardGatherExposed;
      // ZeRO-3 moves them in grad_bucket_mib buckets, as the pricing takes
      // them (a bucket's gathers and its gradients' reduce-scatter).
      const double bucket = cost.calibration().gradBucketBytes;
      const double buckets = cfg.zeroStage == 3 && bucket > 0
                                 ? std::max(1.0, std::ceil(params / bucket))
                                 : 1.0;
      if (cfg.zeroStage < 3)
        record("dp gradient reduce-scatter", Collective::ReduceScatter, dp, t,
               grads, cfg.zeroStage >= 2 ? m : 1, best.time.dpComm);
      else
        record("dp gradient reduce-scatter", Collective::ReduceScatter, dp, t,
               elems * cfg.precision.gradReduceBytes / buckets, m * buckets,
               std::max(0.0, best.time.dpComm - z3));
      if (cfg.zeroStage < 3)
        record("dp parameter all-gather (after update)", Collective::AllGather,
               dp, t, params, 1, 0);
      else {
        record("dp zero-3 parameter all-gather (forward)",
               Collective::AllGather, dp, t, params / buckets, m * buckets,
               best.zero3ForwardExposed);
        // The backward pass gathers only what it reads.
        record("dp zero-3 parameter all-gather (backward)",
               Collective::AllGather, dp, t,
               params * c.bwdReadFraction / buckets, m * buckets,
               best.zero3BackwardGatherExposed);
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
