//===- ReportUtil.cpp - Pieces the two dry-run reports share --------------===//
#include "planner/ReportUtil.h"

#include <algorithm>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <set>
#include <tuple>

namespace dlopt::planner::report {

std::string strf(const char *f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return buf;
}

std::string humanBytes(double bytes) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (bytes >= 1024 && i < 4) {
    bytes /= 1024;
    ++i;
  }
  return strf(i ? "%.2f %s" : "%.0f %s", bytes, u[i]);
}

std::string seconds(double s) {
  if (s >= 1)
    return strf("%.3f s", s);
  if (s >= 1e-3)
    return strf("%.3f ms", s * 1e3);
  return strf("%.3f us", s * 1e6);
}

std::string withCommas(double v) {
  std::string s = strf("%.0f", v), out;
  int n = 0;
  for (auto it = s.rbegin(); it != s.rend(); ++it) {
    if (n && n % 3 == 0 && *it != '-')
      out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++n;
  }
  return out;
}

Throughput throughput(double stepTime, double globalBatch,
                      double modelFlopsPerStep, double peakFlops,
                      int devices) {
  Throughput t;
  t.step = stepTime;
  t.samples = stepTime > 0 ? globalBatch / stepTime : 0;
  t.tflopsPerGpu = stepTime > 0 ? modelFlopsPerStep / stepTime / devices : 0;
  t.mfu = peakFlops > 0 ? t.tflopsPerGpu / peakFlops : 0;
  return t;
}

std::string textModelLine(const Plan &plan) {
  const ModelFingerprint &m = plan.model;
  if (plan.kind == PlanKind::Transformer)
    return strf("model: %lld layers, hidden %lld, heads %lld, seq %lld, "
                "vocab %lld, %.4g parameters, dtype %s, compute %s\n",
                (long long)m.layers, (long long)m.hidden, (long long)m.heads,
                (long long)m.seq, (long long)m.vocab, m.params, m.dtype.c_str(),
                m.precision.c_str());
  int tensors = 0;
  for (const PlannedArg &a : plan.args)
    tensors += a.role == ArgNode::Role::Param;
  return strf("model: %lld ops (op-level plan), %s parameters in %d tensors, "
              "dtype %s, compute %s\n",
              (long long)m.ops, withCommas(m.params).c_str(), tensors,
              m.dtype.c_str(), m.precision.c_str());
}

std::string textStages(const std::string &qualifier,
                       const std::vector<StageRow> &rows) {
  std::string r = "\n== stages" + qualifier + " ==\n";
  for (const StageRow &x : rows) {
    r += "  " + x.name + ": " + x.what;
    if (x.timePerMicroBatch >= 0)
      r += ", " + seconds(x.timePerMicroBatch) + " per micro-batch";
    if (x.sendBytes >= 0)
      r += ", sends " + humanBytes(x.sendBytes);
    if (!x.gpu.empty())
      r += strf(" on %s (%.0f GiB)", x.gpu.c_str(), x.capacity / kGiB);
    r += "\n";
  }
  return r;
}

std::string textThroughput(const Throughput &d, double tokensPerSample,
                           int decimals, Precision precision, double peakFlops,
                           const std::string &flopsNote) {
  std::string r = "\n== throughput ==\n";
  r += tokensPerSample > 0
           ? strf("  %.4g samples/s, %.4g tokens/s\n", d.samples,
                  d.samples * tokensPerSample)
           : strf("  %.4g samples/s\n", d.samples);
  r += strf("  model %.*f TFLOP/s per GPU, MFU %.1f%% (%s peak %.1f TFLOP/s, "
            "%s)\n",
            decimals, d.tflopsPerGpu / 1e12, 100 * d.mfu,
            precisionName(precision), peakFlops / 1e12, flopsNote.c_str());
  return r;
}

json jsonThroughput(const Throughput &d, double tokensPerSample) {
  json j;
  j["samples_per_s"] = d.samples;
  if (tokensPerSample > 0)
    j["tokens_per_s"] = d.samples * tokensPerSample;
  j["model_tflops_per_gpu"] = d.tflopsPerGpu / 1e12;
  j["mfu"] = d.mfu;
  return j;
}

std::string textTitle(bool training, const std::string &model,
                      const Cluster &cluster) {
  return "dlopt dry run: " +
         std::string(training ? "training step" : "forward") + " of @" +
         model + " on " + cluster.summary() + "\n";
}

std::string textStepTimeHead(const StepTime &t, double step) {
  return "\n== step time ==\n" + strf("  total            %s\n",
                                       seconds(step).c_str()) +
         textTimeRow("compute", t.compute, step);
}

std::string textCommunication(const std::vector<CommOp> &comms,
                              const Calibration *calibration,
                              const Cluster *cluster) {
  std::string r = "\n== communication per step (one rank) ==\n";
  if (comms.empty())
    r += "  none\n";
  for (const CommOp &c : comms) {
    // The algorithm, then NCCL's protocol where one was priced.
    std::string how = c.algorithm;
    if (c.protocol != "none" && c.protocol != "mixed")
      how += " " + c.protocol;
    r += strf("  %-40s %-14s group %-5d %10s x %-8.0f link %-10s %-16s "
              "total %s, exposed %s\n",
              c.what.c_str(), collectiveName(c.collective), c.groupSize,
              humanBytes(c.bytes).c_str(), c.calls, linkName(c.link),
              how.c_str(), seconds(c.time).c_str(), seconds(c.exposed).c_str());
  }
  if (!calibration || calibration->collectiveTable.empty())
    return r;
  // What the calibration's collective_table covered: a measured figure
  // beside a modelled one can tip the choice between them.
  const std::vector<CollectiveTableRow> &table = calibration->collectiveTable;
  std::set<std::tuple<int, int, int, int>> shapes;
  std::vector<std::string> devices;
  for (const CollectiveTableRow &t : table) {
    shapes.insert({int(t.collective), t.ranks, t.nodes, t.ranksPerNode});
    if (!t.device.empty() &&
        std::find(devices.begin(), devices.end(), t.device) == devices.end())
      devices.push_back(t.device);
  }
  int measuredLines = 0;
  std::vector<std::string> modelled;
  for (const CommOp &c : comms) {
    if (c.algorithm == "measured") {
      ++measuredLines;
      continue;
    }
    if (c.algorithm == "mixed" || c.collective == Collective::SendRecv)
      continue;
    std::string k =
        strf("%s over %d ranks", collectiveName(c.collective), c.groupSize);
    if (std::find(modelled.begin(), modelled.end(), k) == modelled.end())
      modelled.push_back(k);
  }
  auto list = [](const std::vector<std::string> &v) {
    std::string s;
    for (const std::string &x : v)
      s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  r += strf("  collective_table: %zu measured collective%s and group "
            "shape%s (%zu rows)%s%s; %d of these lines priced from it\n",
            shapes.size(), shapes.size() == 1 ? "" : "s",
            shapes.size() == 1 ? "" : "s", table.size(),
            devices.empty() ? "" : ", measured on ", list(devices).c_str(),
            measuredLines);
  if (!modelled.empty())
    r += "  priced by the model, with no measurement of their group's "
         "shape: " +
         list(modelled) + "\n";
  // The device a table was measured on against the cluster's: a family
  // token of the cluster's GPU name ("H100" of "H100-SXM-80GB") that no
  // measured device's name contains.
  if (cluster && !devices.empty()) {
    auto lowered = [](std::string s) {
      for (char &ch : s)
        ch = char(std::tolower(static_cast<unsigned char>(ch)));
      return s;
    };
    std::set<std::string> mismatched;
    for (const NodeGroup &g : cluster->groups) {
      const std::string family =
          lowered(g.gpu.name.substr(0, g.gpu.name.find('-')));
      const bool seen =
          !family.empty() &&
          std::any_of(devices.begin(), devices.end(),
                      [&](const std::string &d) {
                        return lowered(d).find(family) != std::string::npos;
                      });
      if (!seen)
        mismatched.insert(g.gpu.name);
    }
    if (!mismatched.empty())
      r +=
          "  warning: the collective_table was measured on " + list(devices) +
          ", this cluster's devices are " +
          list(std::vector<std::string>(mismatched.begin(), mismatched.end())) +
          "\n";
  }
  return r;
}

std::string textPlanHead(const Plan &p) {
  std::string r;
  if (p.cp() > 1)
    r += strf("  dp=%d tp=%d pp=%d cp=%d (dp*tp*pp*cp = %d devices)\n", p.dp(),
              p.tp(), p.pp(), p.cp(), p.dp() * p.tp() * p.pp() * p.cp());
  else
    r += strf("  dp=%d tp=%d pp=%d (dp*tp*pp = %d devices)\n", p.dp(), p.tp(),
              p.pp(), p.dp() * p.tp() * p.pp());
  r += strf("  micro-batch size %lld, %lld micro-batches per step\n",
            (long long)p.microBatchSize, (long long)p.numMicroBatches);
  r += std::string("  schedule ") + scheduleKey(p.schedule);
  if (p.schedule == PipelineSchedule::Interleaved1F1B)
    r += strf(" (v=%d)", p.virtualStages);
  r += strf(", zero %d", p.zeroStage);
  if (p.kind == PlanKind::Transformer)
    r += strf(", recompute %s", recomputeName(p.recompute));
  r += strf(", optimizer %s\n", optimizerName(p.optimizer));
  return r;
}

namespace {
/// Whether a plan's rank tables have a cp column: transformer plans.
bool cpColumn(const Plan &p) { return p.kind == PlanKind::Transformer; }
} // namespace

std::string textRanks(const Plan &p, const Cluster &cluster, int maxRanks) {
  const bool cp = cpColumn(p);
  const int devices = cluster.numDevices();
  std::string r = "\n== ranks ==\n";
  r += cp ? "  rank  node  gpu  process  stage  tp  cp  dp\n"
          : "  rank  node  gpu  process  stage  tp  dp\n";
  const int shown = std::min(devices, maxRanks);
  for (int rank = 0; rank < shown; ++rank) {
    auto loc = cluster.locate(rank);
    RankCoords c = rankCoords(p.mesh, rank);
    r += strf("  %4d  %4d  %3d  %7d  %5d  %2d", rank, loc ? loc->node : -1,
              loc ? loc->local : -1, processOf(cluster, p.layout, rank),
              c.stage, c.tp);
    if (cp)
      r += strf("  %2d", c.cp);
    r += strf("  %2d\n", c.dp);
  }
  if (shown < devices) {
    if (cp)
      r += strf("  ... %d more ranks: rank = ((stage*%d + dp)*%d + cp)*%d + "
                "tp; node = rank / gpus per node\n",
                devices - shown, p.dp(), p.cp(), p.tp());
    else
      r += strf("  ... %d more ranks: rank = (stage*%d + dp)*%d + tp; node = "
                "rank / gpus per node\n",
                devices - shown, p.dp(), p.tp());
  }
  return r;
}

std::string textHostRow(const StepTime &t, double step, double dispatch) {
  return strf("  host dispatch    %s (%.1f%%): %s of launches per step, "
              "exposed where issuing them, the pipeline's drain and the "
              "optimizer outlast the devices\n",
              seconds(t.host).c_str(), 100 * t.host / step,
              seconds(dispatch).c_str());
}

std::string textStepTime(const Plan &plan, const StepTime &t, double step,
                         double dispatch) {
  std::string r = textStepTimeHead(t, step);
  r += strf("  exposed comm     %s (%.1f%%): tp %s, ",
            seconds(t.exposedComm()).c_str(), 100 * t.exposedComm() / step,
            seconds(t.tpComm).c_str());
  if (plan.kind == PlanKind::Transformer) // op-level plans have no cp axis
    r += "cp " + seconds(t.cpComm) + ", ";
  r += "pp " + seconds(t.ppComm) + ", dp " + seconds(t.dpComm) + "\n";
  r += textTimeRow("bubble", t.bubble, step);
  r += textTimeRow("optimizer step", t.optimizer, step);
  r += textHostRow(t, step, dispatch);
  return r;
}

std::string textTimeRow(const char *name, double time, double step) {
  return strf("  %-16s %s (%.1f%%)\n", name, seconds(time).c_str(),
              100 * time / step);
}

std::string textMemoryRows(const MemoryBreakdown &m, double capacity) {
  std::string r;
  auto row = [&](const char *n, double v) {
    r += strf("  %-14s %10.3f GiB\n", n, v / kGiB);
  };
  row("params", m.params);
  row("grads", m.grads);
  row("optimizer", m.optimizer);
  row("activations", m.activations);
  row("transient", m.transient);
  row("comm buffers", m.commBuffers);
  row("workspace", m.workspace);
  r += strf("  %-14s %10.3f GiB of %.3f GiB (%.1f%%)\n", "total",
            m.total() / kGiB, capacity / kGiB, 100 * m.total() / capacity);
  return r;
}

std::string textAlternatives(const std::vector<AlternativeRow> &rows) {
  std::string r = "\n== alternatives ==\n";
  if (rows.empty())
    r += "  none\n";
  for (size_t i = 0; i < rows.size(); ++i)
    r += strf("  %zu. %s: %s, %.2f GiB: %s\n", i + 1, rows[i].key.c_str(),
              seconds(rows[i].time).c_str(), rows[i].memory / kGiB,
              rows[i].why.c_str());
  return r;
}

std::string textSearchHead(int64_t priced, int64_t feasible,
                           int64_t outOfMemory) {
  return "\n== search ==\n" +
         strf("  %lld candidates priced: %lld fit, %lld out of memory\n",
              (long long)priced, (long long)feasible, (long long)outOfMemory);
}

std::string textSearchTail(const std::map<std::string, int64_t> &pruned,
                           double secs) {
  std::string r;
  for (const auto &[why, n] : pruned)
    r += strf("  pruned %lld: %s\n", (long long)n, why.c_str());
  r += strf("  search time %.3f s\n", secs);
  return r;
}

json jsonEnvelope(const char *kind, int version, bool training) {
  json j;
  j["format"] = "dlopt-plan";
  j["version"] = version;
  j["kind"] = kind;
  j["mode"] = training ? "training" : "forward";
  return j;
}

json jsonCluster(const Cluster &cluster) {
  return json{{"summary", cluster.summary()},
              {"devices", cluster.numDevices()},
              {"nodes", cluster.numNodes()},
              {"definition", json::parse(cluster.toJson())}};
}

void jsonRanks(json &j, const Plan &p, const Cluster &cluster) {
  const bool cp = cpColumn(p);
  json columns = cp ? json{"rank", "node", "gpu", "process", "stage", "tp",
                           "cp", "dp"}
                    : json{"rank", "node", "gpu", "process", "stage", "tp",
                           "dp"};
  jsonRankTable(
      j, cluster.numDevices(), std::move(columns),
      cp ? "rank = ((stage*dp + dp_index)*cp + cp_index)*tp + tp_index"
         : "rank = (stage*dp + dp_index)*tp + tp_index",
      [&](int rank) {
        auto loc = cluster.locate(rank);
        RankCoords c = rankCoords(p.mesh, rank);
        json row = {rank, loc ? loc->node : -1, loc ? loc->local : -1,
                    processOf(cluster, p.layout, rank), c.stage, c.tp};
        if (cp)
          row.push_back(c.cp);
        row.push_back(c.dp);
        return row;
      });
}

json jsonCommunication(const std::vector<CommOp> &comms) {
  json out = json::array();
  for (const CommOp &c : comms)
    out.push_back({{"what", c.what},
                   {"collective", collectiveName(c.collective)},
                   {"group_size", c.groupSize},
                   {"bytes", c.bytes},
                   {"calls", c.calls},
                   {"link", linkName(c.link)},
                   {"algorithm", c.algorithm},
                   {"protocol", c.protocol},
                   {"time", c.time},
                   {"exposed", c.exposed}});
  return out;
}

json jsonMemory(const MemoryBreakdown &m, double capacity) {
  return json{{"stage", m.stage},
              {"params", m.params},
              {"grads", m.grads},
              {"optimizer", m.optimizer},
              {"activations", m.activations},
              {"transient", m.transient},
              {"comm_buffers", m.commBuffers},
              {"workspace", m.workspace},
              {"total", m.total()},
              {"capacity", capacity}};
}

json jsonPruned(const std::map<std::string, int64_t> &pruned) {
  json out = json::object();
  for (const auto &[why, n] : pruned)
    out[why] = n;
  return out;
}

} // namespace dlopt::planner::report
