//===- OpReport.cpp - Text and JSON reports of op-level plans -------------===//
#include "planner/OpSearch.h"

#include "planner/PlanJson.h"
#include "planner/ReportUtil.h"
#include "planner/SearchUtil.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

namespace dlopt::planner {

using namespace report;

//===----------------------------------------------------------------------===//
// Reports
//===----------------------------------------------------------------------===//

namespace {

/// "dlopt.matmul x3: column 2, row 1", by first appearance.
std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>>
groupChoices(const OpPlanResult &p, const GraphSummary &g) {
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>>
      out;
  for (const OpChoice &c : p.choices) {
    const OpNode &op = g.ops[c.op];
    if (op.kind == OpClass::Constant)
      continue;
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const auto &e) { return e.first == op.op; });
    if (it == out.end()) {
      out.push_back({op.op, {}});
      it = out.end() - 1;
    }
    auto jt = std::find_if(it->second.begin(), it->second.end(),
                           [&](const auto &e) { return e.first == c.strategy; });
    if (jt == it->second.end())
      it->second.push_back({c.strategy, 1});
    else
      ++jt->second;
  }
  return out;
}

std::string layouts(const std::vector<Layout> &ls) {
  std::string s;
  for (const Layout &l : ls) {
    if (!s.empty())
      s += ',';
    s += l.str();
  }
  return s.empty() ? "-" : s;
}

Throughput derive(const OpPlanResult &p, int devices) {
  return throughput(p.best.time.total(), double(p.globalBatch),
                    p.modelFlopsPerStep, p.peakFlops, devices);
}

} // namespace

std::string formatOpTextReport(const OpPlanResult &p, const Cluster &cluster,
                               const GraphSummary &g, const ReportOptions &o) {
  const TrainingConfig &cfg = p.best.cfg;
  const int devices = cluster.numDevices();
  Throughput d = derive(p, devices);
  std::string r;
  r += textTitle(p.training, g.modelName, cluster);
  r += textModelLine(p.plan);
  if (p.training)
    r += strf("training step priced as forward x %.2f (%s)\n",
              1 + p.backwardRatio,
              p.backwardFromGraph
                  ? strf("%d backward ops in the graph",
                         p.numBackwardOps).c_str()
                  : "backward_flops_ratio of the calibration");
  if (p.numBackwardOps > 0)
    r += strf("backward ops (%d) follow their forward ops' sharding and "
              "stage; %d update ops after them are priced as the optimizer "
              "step\n",
              p.numBackwardOps, p.numUpdateOps);
  r += strf("global batch %lld samples\n\n", (long long)p.globalBatch);

  r += "== plan ==\n" + textPlanHead(p.plan);
  if (p.plan.layout == ProcessLayout::BetweenGraph)
    r += "  processes: one per GPU (between-graph)\n";
  else
    r += strf("  processes: %s, one per node (--fix layout; the op-level "
              "search prices the layout it is given, it does not choose "
              "one)\n",
              layoutName(p.plan.layout, cluster.numNodes()));
  r += strf("  sharding: per op over tp=%d (docs/op-sharding.md)%s\n", cfg.tp,
            p.best.memoryConstrained ? ", memory-constrained" : "");
  {
    const SolveResult &s = p.solve;
    std::string how = s.method;
    if (s.ilpVars > 0)
      how += strf(" (%lld variables, %lld constraints, %s)",
                  (long long)s.ilpVars, (long long)s.ilpRows,
                  seconds(s.ilpSeconds).c_str());
    r += strf("  solver: %s over %lld strategy nodes and %lld edges, %d left "
              "after elimination, %s\n",
              how.c_str(), (long long)p.stats.problemNodes,
              (long long)p.stats.problemEdges, s.coreNodes,
              s.optimal ? "optimal" : "not proven optimal");
    if (!s.note.empty())
      r += "  note: " + s.note + "\n";
  }
  if (cfg.tp > 1) {
    bool allReplicated = true;
    for (const OpChoice &c : p.choices)
      allReplicated &= c.strategy == "replicated";
    if (allReplicated)
      r += strf("  note: every op is replicated over tp=%d: the %d devices "
                "of a tp group compute the same thing (the model is too "
                "small for more devices to pay off)\n",
                cfg.tp, cfg.tp);
  }

  r += strf("\n== sharding over tp=%d (op: strategy count) ==\n", cfg.tp);
  for (const auto &[name, strategies] : groupChoices(p, g)) {
    int total = 0;
    std::string list;
    for (const auto &[sname, n] : strategies) {
      total += n;
      list += (list.empty() ? "" : ", ") + sname + " " + std::to_string(n);
    }
    r += strf("  %s x%d: %s\n", name.c_str(), total, list.c_str());
  }
  {
    int split = 0;
    double bytes = 0, full = 0;
    for (size_t i = 0; i < p.params.size(); ++i)
      if (p.params[i].second.kind == Layout::S)
        ++split;
    for (const ArgNode &a : g.args)
      if (a.role == ArgNode::Role::Param) {
        double e = double(a.elemBytes);
        for (int64_t dd : a.shape)
          e *= double(dd);
        full += e;
        auto it = std::find_if(p.params.begin(), p.params.end(),
                               [&](const auto &x) { return x.first == a.name; });
        bytes += it != p.params.end() && it->second.kind == Layout::S
                     ? e / cfg.tp
                     : e;
      }
    r += strf("  params: %d split over tp, %d replicated (%s of %s per "
              "device before ZeRO)\n",
              split, int(p.params.size()) - split, humanBytes(bytes).c_str(),
              humanBytes(full).c_str());
  }
  if (o.explain) {
    r += "  per op (id op strategy: operands -> result):\n";
    for (const OpChoice &c : p.choices) {
      const OpNode &op = g.ops[c.op];
      if (op.kind == OpClass::Constant)
        continue;
      r += strf("    #%-4d %-22s %-14s %s -> %s\n", c.op, op.op.c_str(),
                c.strategy.c_str(), layouts(c.operands).c_str(),
                c.result.str().c_str());
    }
  }

  r += "\n== resharding and op collectives over tp (one rank) ==\n";
  if (p.reshards.empty()) {
    r += "  none\n";
  } else {
    std::vector<const ReshardOp *> order;
    for (const ReshardOp &x : p.reshards)
      order.push_back(&x);
    const double m = double(cfg.numMicroBatches);
    auto perStep = [&](const ReshardOp *x) {
      return x->time * (x->perStep ? 1.0 : m);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](const ReshardOp *a, const ReshardOp *b) {
                       return perStep(a) > perStep(b);
                     });
    size_t shown = o.explain ? order.size() : std::min<size_t>(order.size(), 12);
    for (size_t i = 0; i < shown; ++i) {
      const ReshardOp &x = *order[i];
      std::string where = "#";
      where += std::to_string(x.consumer);
      where += ' ';
      where += g.ops[x.consumer].op;
      if (x.operand >= 0)
        where += " operand " + std::to_string(x.operand) + " <- " + x.producer;
      r += strf("  %-56s %s %s, group %d, %s, link %s, %s %s\n", where.c_str(),
                x.backward ? "bwd" : "fwd", x.what.c_str(), x.groupSize,
                humanBytes(x.bytes).c_str(), linkName(x.link),
                seconds(x.time).c_str(),
                x.perStep ? "per step" : "per micro-batch");
    }
    if (shown < order.size()) {
      double rest = 0;
      for (size_t i = shown; i < order.size(); ++i)
        rest += perStep(order[i]);
      r += strf("  ... %zu more (%s per step; --explain lists them)\n",
                order.size() - shown, seconds(rest).c_str());
    }
  }

  r += textRanks(p.plan, cluster, o.maxRanks);

  std::vector<StageRow> stages;
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const OpStage &x = p.stages[s];
    StageRow row;
    row.name = p.stages.size() > size_t(cfg.pp)
                   ? strf("chunk %zu (stage %d)", s, x.stage)
                   : strf("stage %zu", s);
    std::string layers;
    if (x.firstLayer >= 0)
      layers = x.firstLayer == x.lastLayer
                   ? strf(", layer %lld", (long long)x.firstLayer)
                   : strf(", layers %lld-%lld", (long long)x.firstLayer,
                          (long long)x.lastLayer);
    row.what = strf("ops %d-%d (%d ops%s)", x.firstOp, x.lastOp, x.numOps,
                    layers.c_str());
    row.timePerMicroBatch = x.timePerMicroBatch;
    if (s + 1 < p.stages.size())
      row.sendBytes = x.boundaryBytes;
    stages.push_back(std::move(row));
  }
  r += textStages(p.stagesByLayer ? " (contiguous layer marks)"
                                  : " (contiguous ops)",
                  stages);

  r += textCommunication(p.comms, o.calibration, &cluster);

  const StepTime &t = p.best.time;
  r += textStepTime(p.plan, t, d.step, p.best.hostDispatch);
  r += textThroughput(d, 0, 3, p.precision, p.peakFlops,
                      p.training ? "the graph's FLOPs with backward"
                                 : "the graph's FLOPs");

  const MemoryBreakdown &m = p.best.memory;
  r += strf("\n== memory per device (stage %d, the largest) ==\n", m.stage);
  r += textMemoryRows(m, p.best.capacity);
  r += textAlternatives(p.alternatives);

  if (o.explain) {
    const OpSearchStats &s = p.stats;
    r += textSearchHead(s.priced, s.feasible, s.outOfMemory);
    r += strf("  %lld strategy problems solved (%lld reached the ILP; "
              "largest core %lld nodes, largest ILP %lld variables x %lld "
              "constraints; ILP time %s)\n",
              (long long)s.solves, (long long)s.ilpSolves,
              (long long)s.maxCoreNodes, (long long)s.maxIlpVars,
              (long long)s.maxIlpRows, seconds(s.ilpSeconds).c_str());
    r += std::string("  ILP solver: ") +
         (haveIlpSolver() ? "COIN-OR CBC" : "none (built without CBC)") + "\n";
    for (const auto &n : s.notes)
      r += "  fallback: " + n + "\n";
    r += textSearchTail(s.pruned, s.seconds);
  }
  return r;
}

std::string formatOpJsonReport(const OpPlanResult &p, const Cluster &cluster,
                               const GraphSummary &g, const ReportOptions &o) {
  const int devices = cluster.numDevices();
  Throughput d = derive(p, devices);
  auto config = [](const OpCandidate &c) {
    json j;
    j["dp"] = c.cfg.dp;
    j["tp"] = c.cfg.tp;
    j["pp"] = c.cfg.pp;
    j["micro_batch_size"] = c.cfg.microBatchSize;
    j["num_micro_batches"] = c.cfg.numMicroBatches;
    j["schedule"] = scheduleKey(c.cfg.schedule);
    j["zero_stage"] = c.cfg.zeroStage;
    j["recompute"] = recomputeName(RecomputePolicy::None);
    j["optimizer"] = optimizerName(c.cfg.optimizer);
    return j;
  };
  // The plan (what --plan reads back), then the report (never read).
  json j = planJson(p.plan);
  json r;
  r["model"] = {{"param_tensors", p.params.size()},
                {"backward_ratio", p.backwardRatio}};
  r["solver"] = {{"method", p.solve.method},
                 {"optimal", p.solve.optimal},
                 {"nodes", p.stats.problemNodes},
                 {"edges", p.stats.problemEdges},
                 {"core_nodes", p.solve.coreNodes},
                 {"ilp_variables", p.solve.ilpVars},
                 {"ilp_constraints", p.solve.ilpRows},
                 {"ilp_seconds", p.solve.ilpSeconds},
                 {"note", p.solve.note},
                 {"memory_constrained", p.best.memoryConstrained}};
  json summary = json::object();
  for (const auto &[name, strategies] : groupChoices(p, g)) {
    json e = json::object();
    for (const auto &[sname, n] : strategies)
      e[sname] = n;
    summary[name] = e;
  }
  r["sharding_summary"] = summary;
  // Per op: the ILP's strategy in the tp layouts of docs/op-sharding.md
  // (the plan's "ops" hold the same choice as mesh shardings).
  json ops = json::array();
  for (const OpChoice &c : p.choices) {
    json ol = json::array();
    for (const Layout &l : c.operands)
      ol.push_back(l.str());
    ops.push_back({{"id", g.ops[c.op].key()},
                   {"op", g.ops[c.op].op},
                   {"strategy", c.strategy},
                   {"operands", ol},
                   {"result", c.result.str()},
                   {"time", c.time}});
  }
  r["ops"] = ops;
  json params = json::array();
  for (const auto &[name, l] : p.params)
    params.push_back({{"name", name}, {"layout", l.str()}});
  r["params"] = params;
  json rs = json::array();
  for (const ReshardOp &x : p.reshards)
    rs.push_back({{"op", g.ops[x.consumer].key()},
                  {"operand", x.operand},
                  {"producer", x.producer},
                  {"what", x.what},
                  {"pass", x.backward ? "backward" : "forward"},
                  {"per", x.perStep ? "step" : "micro-batch"},
                  {"collective", collectiveName(x.collective)},
                  {"group_size", x.groupSize},
                  {"bytes", x.bytes},
                  {"link", linkName(x.link)},
                  {"time", x.time}});
  r["resharding"] = rs;
  json stages = json::array();
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const OpStage &x = p.stages[s];
    stages.push_back({{"stage", x.stage},
                      {"chunk", s},
                      {"first_op", g.ops[x.firstOp].key()},
                      {"last_op", g.ops[x.lastOp].key()},
                      {"num_ops", x.numOps},
                      {"first_layer", x.firstLayer},
                      {"last_layer", x.lastLayer},
                      {"time_per_micro_batch", x.timePerMicroBatch},
                      {"boundary_bytes", x.boundaryBytes}});
  }
  r["stages"] = stages;
  r["stages_by"] = p.stagesByLayer ? "layer" : "op";
  jsonRanks(r, p.plan, cluster);
  r["communication"] = jsonCommunication(p.comms);
  const StepTime &t = p.best.time;
  r["step_time"] = {{"total", t.total()},   {"compute", t.compute},
                    {"tp_comm", t.tpComm},  {"pp_comm", t.ppComm},
                    {"dp_comm", t.dpComm},  {"bubble", t.bubble},
                    {"host", t.host},       {"optimizer", t.optimizer},
                    {"host_dispatch", p.best.hostDispatch}};
  r["throughput"] = jsonThroughput(d, 0);
  r["memory"] = jsonMemory(p.best.memory, p.best.capacity);
  r["alternatives"] = jsonAlternatives(p.alternatives, config);
  if (o.explain) {
    json pruned = jsonPruned(p.stats.pruned);
    r["search"] = {{"priced", p.stats.priced},
                   {"feasible", p.stats.feasible},
                   {"out_of_memory", p.stats.outOfMemory},
                   {"solves", p.stats.solves},
                   {"ilp_solves", p.stats.ilpSolves},
                   {"max_core_nodes", p.stats.maxCoreNodes},
                   {"max_ilp_variables", p.stats.maxIlpVars},
                   {"max_ilp_constraints", p.stats.maxIlpRows},
                   {"ilp_seconds", p.stats.ilpSeconds},
                   {"notes", p.stats.notes},
                   {"pruned", pruned},
                   {"seconds", p.stats.seconds}};
  }
  j["report"] = std::move(r);
  return j.dump(2) + "\n";
}

} // namespace dlopt::planner
