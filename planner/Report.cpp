//===- Report.cpp - Text and JSON dry-run reports -------------------------===//
#include "planner/Report.h"

#include "planner/PlanJson.h"
#include "planner/ReportUtil.h"

namespace dlopt::planner {

namespace {

using namespace report;

std::string layerRange(const std::vector<int64_t> &ls) {
  if (ls.empty())
    return "-";
  // Runs of consecutive marks: "0-5", or "0-3, 16-19" for the chunks of an
  // interleaved stage.
  std::string r;
  for (size_t i = 0; i < ls.size();) {
    size_t j = i;
    while (j + 1 < ls.size() && ls[j + 1] == ls[j] + 1)
      ++j;
    r += (r.empty() ? "" : ", ") + std::to_string(ls[i]);
    if (j > i)
      r += "-" + std::to_string(ls[j]);
    i = j + 1;
  }
  return r;
}

Throughput derive(const PlanResult &p, int devices) {
  return throughput(p.best.time.total(), double(p.globalBatch),
                    p.modelFlopsPerStep, p.peakFlops, devices);
}

} // namespace

Mesh meshOf(const TrainingConfig &cfg) {
  return Mesh::standard(cfg.pp, cfg.dp, std::max(1, cfg.cp), cfg.tp);
}

RankCoords rankCoords(const TrainingConfig &cfg, int rank) {
  return rankCoords(meshOf(cfg), rank);
}

std::string launchCommand(const Cluster &cluster, const ProcessPlan &p,
                          const std::string &planFile) {
  const int nodes = cluster.numNodes();
  const int devices = cluster.numDevices();
  const int perNode = p.processesPerNode;
  // CPU "devices" (the cpu preset) run on the CPU backend, every rank a
  // thread of one dlopt-run process (docs/parallel.md).
  bool cpu = !cluster.groups.empty() &&
             cluster.groups.front().gpu.name.rfind("CPU", 0) == 0;
  if (cpu)
    return "dlopt-run --backend cpu " + planFile;
  std::string run = "dlopt-run --backend cuda";
  if (p.layout == ProcessLayout::InGraph)
    run += " --devices-per-process " +
           std::to_string(devices / std::max(1, nodes));
  run += " " + planFile;
  int procs = p.layout == ProcessLayout::InGraph ? nodes : devices;
  if (procs == 1)
    return run;
  return "mpirun -np " + std::to_string(procs) + " --map-by ppr:" +
         std::to_string(perNode) + ":node --hostfile HOSTS " + run;
}

std::string srunCommand(const Cluster &cluster, const ProcessPlan &p,
                        const std::string &planFile) {
  const int nodes = std::max(1, cluster.numNodes());
  const int devices = cluster.numDevices();
  std::string run = "dlopt-run --backend cuda";
  int perNode = devices / nodes;
  if (p.layout == ProcessLayout::InGraph) {
    run += " --devices-per-process " + std::to_string(perNode);
    perNode = 1;
  }
  return "srun -N " + std::to_string(nodes) + " --ntasks-per-node " +
         std::to_string(perNode) + " " + run + " " + planFile;
}

std::string formatTextReport(const PlanResult &p, const Cluster &cluster,
                             const GraphSummary &g, const ReportOptions &o) {
  const TrainingConfig &cfg = p.best.cfg;
  const int devices = cluster.numDevices();
  Throughput d = derive(p, devices);
  std::string r;
  r += textTitle(p.training, g.modelName, cluster);
  r += textModelLine(p.plan);
  if (cfg.precision.unfusedAttention)
    r += "attention priced as unfused kernels: scores materialized "
         "(--attention-kernel unfused, a planning option)\n";
  if (cfg.precision.eagerNorm || cfg.precision.eagerRope)
    r += std::string(cfg.precision.eagerNorm && cfg.precision.eagerRope
                         ? "RMS norms and rotary embeddings"
                     : cfg.precision.eagerNorm ? "RMS norms"
                                               : "rotary embeddings") +
         " priced as eager PyTorch's kernels (--eager-kernels " +
         eagerKernelsName(cfg.precision.eagerNorm, cfg.precision.eagerRope) +
         ", a planning option)\n";
  r += strf("global batch %lld samples x %lld tokens\n\n",
              (long long)p.globalBatch, (long long)p.seq);

  r += "== plan ==\n" + textPlanHead(p.plan);
  const ProcessPlan &proc = p.best.process;
  const int nodes = cluster.numNodes();
  r += strf("  processes: %s, %d per node (%s)\n",
              layoutName(proc.layout, nodes), proc.processesPerNode,
              proc.why.c_str());
  {
    bool cpu = !cluster.groups.empty() &&
               cluster.groups.front().gpu.name.rfind("CPU", 0) == 0;
    r += "  launch: " + launchCommand(cluster, proc, o.executable);
    if (devices > 1 && cpu) {
      r += "  (every rank a thread of this process; one process per rank: "
           "mpirun -n ";
      r += std::to_string(devices);
      r += " dlopt-run --backend cpu ";
      r += o.executable;
      r += "; docs/launch.md)";
    } else if (devices > 1) {
      r += "  (with Slurm: ";
      r += srunCommand(cluster, proc, o.executable);
      r += "; NCCL across processes has not run on a GPU yet)";
    }
    r += "\n";
  }
  {
    std::string shard = "  sharding: matmul ";
    shard += cfg.tp > 1 ? "column/row-parallel over tp (Megatron)"
                        : "unsharded";
    shard += ", attention ";
    shard += cfg.tp > 1 ? "by heads" : "unsharded";
    if (cfg.cp > 1)
      shard += " and by sequence over cp (keys and values all-gathered)";
    shard += ", norms/dropout/residual ";
    shard += cfg.sequenceParallel ? "split by sequence over tp (sequence "
                                    "parallel)"
             : cfg.tp > 1         ? "replicated over tp"
                                  : "unsharded";
    if (cfg.cp > 1)
      shard += ", all activations split by sequence over cp";
    r += shard + "\n";
  }

  r += textRanks(p.plan, cluster, o.maxRanks);

  std::vector<StageRow> stages;
  for (size_t s = 0; s < p.stageLayers.size(); ++s) {
    StageRow row;
    row.name = strf("stage %zu", s);
    row.what = strf("layers %s (%zu)", layerRange(p.stageLayers[s]).c_str(),
                    p.stageLayers[s].size());
    if (s == 0 && g.group("pre"))
      row.what += " + pre";
    if (s + 1 == p.stageLayers.size() && g.group("post"))
      row.what += " + post";
    if (s < p.stageGpus.size()) {
      row.gpu = p.stageGpus[s];
      row.capacity = p.stageCapacity[s];
    }
    stages.push_back(std::move(row));
  }
  r += textStages("", stages);

  r += textCommunication(p.comms, o.calibration, &cluster);

  const StepTime &t = p.best.time;
  r += textStepTime(p.plan, t, d.step, proc.hostDispatch);
  r += "\n== simulated step (discrete-event, docs/simulator.md) ==\n";
  if (p.simulated) {
    const SimResult &sr = *p.simulated;
    double peak = 0;
    int peakStage = 0;
    for (size_t i = 0; i < sr.peakMemory.size(); ++i)
      if (sr.peakMemory[i] > peak) {
        peak = sr.peakMemory[i];
        peakStage = int(i);
      }
    r += strf("  step             %s (analytical %s, %+.1f%%)\n",
                seconds(sr.stepTime).c_str(), seconds(d.step).c_str(),
                d.step > 0 ? 100 * (sr.stepTime / d.step - 1) : 0.0);
    r += strf("  pipeline phase   %s, bubble %.1f%% on the busiest stage\n",
                seconds(sr.pipelineTime).c_str(), 100 * sr.bubbleFraction);
    r += strf("  peak memory      %.3f GiB (stage %d) over the step\n",
                peak / kGiB, peakStage);
    r += strf("  events           %zu (write them with --trace FILE)\n",
                sr.events.size());
  } else {
    r += "  none: " + p.simError + "\n";
  }
  r += textThroughput(d, double(p.seq), 1, p.precision, p.peakFlops,
                      p.training ? "6*params FLOPs per token"
                                 : "2*params FLOPs per token");

  const MemoryBreakdown &m = p.best.memory;
  r += strf("\n== memory per device (stage %d, %s) ==\n", m.stage,
              p.stageGpus.empty() ? "the largest"
                                  : "the least headroom on its own GPU");
  r += textMemoryRows(m, p.best.capacity);
  r += textAlternatives(p.alternatives);
  if (o.explain) {
    const SearchStats &s = p.stats;
    r += textSearchHead(s.enumerated, s.feasible, s.outOfMemory);
    r += textSearchTail(s.pruned, s.seconds);
  }
  return r;
}

std::string formatJsonReport(const PlanResult &p, const Cluster &cluster,
                             const GraphSummary &g, const ReportOptions &o) {
  const int devices = cluster.numDevices();
  Throughput d = derive(p, devices);
  auto config = [](const Candidate &c) {
    json j;
    j["dp"] = c.cfg.dp;
    j["tp"] = c.cfg.tp;
    j["pp"] = c.cfg.pp;
    j["cp"] = c.cfg.cp;
    j["sequence_parallel"] = c.cfg.sequenceParallel;
    j["micro_batch_size"] = c.cfg.microBatchSize;
    j["num_micro_batches"] = c.cfg.numMicroBatches;
    j["schedule"] = scheduleKey(c.cfg.schedule);
    j["virtual_stages"] = c.cfg.virtualStages;
    j["zero_stage"] = c.cfg.zeroStage;
    j["recompute"] = recomputeName(c.cfg.recompute);
    j["attention_kernel"] =
        c.cfg.precision.unfusedAttention ? "unfused" : "fused";
    j["eager_kernels"] =
        eagerKernelsName(c.cfg.precision.eagerNorm, c.cfg.precision.eagerRope);
    j["layout"] = c.process.layout == ProcessLayout::InGraph ? "in-graph"
                                                             : "between-graph";
    if (!c.cfg.stageLayerCounts.empty()) // heterogeneous clusters
      j["stage_layers"] = c.cfg.stageLayerCounts;
    return j;
  };
  auto time = [](const StepTime &t) {
    return json{{"total", t.total()},  {"compute", t.compute},
                {"tp_comm", t.tpComm}, {"cp_comm", t.cpComm},
                {"pp_comm", t.ppComm}, {"dp_comm", t.dpComm},
                {"bubble", t.bubble},  {"host", t.host},
                {"optimizer", t.optimizer}};
  };
  // The plan (what --plan reads back), then the report (never read).
  json j = planJson(p.plan);
  json r;
  r["model"] = {
      {"ffn", p.spec.ffn()},
      {"dtype", g.dtype},
      {"attention_kernel",
       p.best.cfg.precision.unfusedAttention ? "unfused" : "fused"},
      {"eager_kernels", eagerKernelsName(p.best.cfg.precision.eagerNorm,
                                         p.best.cfg.precision.eagerRope)}};
  r["processes"] = {
      {"layout", layoutName(p.best.process.layout, cluster.numNodes())},
      {"per_node", p.best.process.processesPerNode},
      {"host_dispatch", p.best.process.hostDispatch},
      {"host_memory_per_node", p.best.process.hostMemory},
      {"host_memory_capacity", p.best.process.hostCapacity},
      {"why", p.best.process.why},
      {"launch", launchCommand(cluster, p.best.process, o.executable)}};
  json stages = json::array();
  for (size_t s = 0; s < p.stageLayers.size(); ++s) {
    json st = {{"stage", s},
               {"layers", p.stageLayers[s]},
               {"pre", s == 0 && g.group("pre") != nullptr},
               {"post", s + 1 == p.stageLayers.size() &&
                            g.group("post") != nullptr}};
    if (s < p.stageGpus.size()) {
      st["gpu"] = p.stageGpus[s];
      st["capacity"] = p.stageCapacity[s];
    }
    stages.push_back(std::move(st));
  }
  r["stages"] = stages;
  jsonRanks(r, p.plan, cluster);
  r["communication"] = jsonCommunication(p.comms);
  r["step_time"] = time(p.best.time);
  r["throughput"] = jsonThroughput(d, double(p.seq));
  r["memory"] = jsonMemory(p.best.memory, p.best.capacity);
  if (p.simulated) {
    json peaks = json::array();
    for (double b : p.simulated->peakMemory)
      peaks.push_back(b);
    r["simulation"] = {{"step_time", p.simulated->stepTime},
                       {"pipeline_time", p.simulated->pipelineTime},
                       {"bubble_fraction", p.simulated->bubbleFraction},
                       {"peak_memory_per_stage", peaks},
                       {"events", p.simulated->events.size()}};
  } else {
    r["simulation"] = {{"error", p.simError}};
  }
  r["alternatives"] = jsonAlternatives(p.alternatives, config);
  if (o.explain) {
    json pruned = jsonPruned(p.stats.pruned);
    r["search"] = {{"priced", p.stats.enumerated},
                   {"feasible", p.stats.feasible},
                   {"out_of_memory", p.stats.outOfMemory},
                   {"pruned", pruned},
                   {"seconds", p.stats.seconds}};
  }
  j["report"] = std::move(r);
  return j.dump(2) + "\n";
}

} // namespace dlopt::planner
