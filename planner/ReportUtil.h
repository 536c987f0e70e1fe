//===- ReportUtil.h - Pieces the two dry-run reports share ----------------===//
//
// Internal to the planner's reports (Report.cpp for transformer plans,
// OpReport.cpp for op-level plans): number formatting and the report
// sections both print the same way (communication, step-time rows, memory,
// alternatives, search statistics), as text and as plan-file JSON. Not a
// public header: it uses nlohmann/json, which the public headers do not.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Cluster.h"
#include "planner/MemoryModel.h"
#include "planner/Plan.h"
#include "planner/Search.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dlopt::planner::report {

using json = nlohmann::ordered_json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// printf into a std::string (up to 1023 characters).
std::string strf(const char *format, ...)
    __attribute__((format(printf, 1, 2)));
/// "512 B", "1.50 KiB", ..., "2.00 TiB".
std::string humanBytes(double bytes);
/// "1.234 s", "12.345 ms", "7.000 us".
std::string seconds(double s);
/// "20,538".
std::string withCommas(double v);

/// Step time, samples/s, model FLOP/s per device and MFU of a plan.
struct Throughput {
  double step = 0, samples = 0, tflopsPerGpu = 0, mfu = 0;
};
Throughput throughput(double stepTime, double globalBatch,
                      double modelFlopsPerStep, double peakFlops,
                      int devices);

//===----------------------------------------------------------------------===//
// Text sections
//===----------------------------------------------------------------------===//

/// "dlopt dry run: training step of @main on <cluster>\n".
std::string textTitle(bool training, const std::string &model,
                      const Cluster &cluster);
/// The plan section's first lines, from the plan both reports render:
///   "  dp=2 tp=4 pp=2 (dp*tp*pp = 16 devices)" (cp when > 1),
///   "  micro-batch size 1, 8 micro-batches per step",
///   "  schedule interleaved (v=2), zero 1, recompute full, optimizer adam"
/// (recompute left out of op-level plans, which have none).
std::string textPlanHead(const Plan &plan);
/// "== ranks ==": rank, node, GPU, process, stage and mesh coordinates of
/// the first `maxRanks` ranks, then the formula for the rest. Op-level
/// plans (no cp axis in use) leave out the cp column.
std::string textRanks(const Plan &plan, const Cluster &cluster, int maxRanks);
/// "model: ..." from the plan's fingerprint: a transformer's dims, or an
/// op-level graph's op count and parameter tensors; then the parameters,
/// their dtype and the compute precision.
std::string textModelLine(const Plan &plan);
/// One line of "== stages ==": "  stage 1: layers 4-7 (4) + post on
/// H100 (75 GiB)", "  chunk 2 (stage 0): ops 10-19 (10 ops), 1.2 ms per
/// micro-batch, sends 4.00 KiB".
struct StageRow {
  std::string name; ///< "stage 1", "chunk 2 (stage 0)"
  std::string what; ///< "layers 4-7 (4) + post", "ops 10-19 (10 ops)"
  double timePerMicroBatch = -1; ///< printed when >= 0
  double sendBytes = -1;         ///< to the next stage; printed when >= 0
  std::string gpu;               ///< heterogeneous clusters: printed when set
  double capacity = 0;           ///< bytes, with `gpu`
};
/// "\n== stages<qualifier> ==\n" and the rows.
std::string textStages(const std::string &qualifier,
                       const std::vector<StageRow> &rows);
/// "== throughput ==": samples/s (and tokens/s for `tokensPerSample` >
/// 0), model TFLOP/s per GPU with `decimals` digits, MFU against the
/// precision's peak, and what the model FLOPs count (`flopsNote`).
std::string textThroughput(const Throughput &d, double tokensPerSample,
                           int decimals, Precision precision, double peakFlops,
                           const std::string &flopsNote);
/// {samples_per_s, tokens_per_s (tokensPerSample > 0),
/// model_tflops_per_gpu, mfu}.
json jsonThroughput(const Throughput &d, double tokensPerSample);
/// "== step time ==", the total and the compute row.
std::string textStepTimeHead(const StepTime &t, double step);
/// "== communication per step (one rank) ==" and one line per collective;
/// with a calibration whose collective_table is not empty, a note on what
/// it covered (and the devices it was measured on against `cluster`'s).
std::string textCommunication(const std::vector<CommOp> &comms,
                              const Calibration *calibration = nullptr,
                              const Cluster *cluster = nullptr);
/// "  host dispatch    ...": the exposed host time and the launches' total.
std::string textHostRow(const StepTime &t, double step, double dispatch);
/// "== step time ==": the total, compute, exposed communication by axis
/// (cp where the plan has the axis: transformer plans), bubble, optimizer
/// step and host rows, for both kinds of plan.
std::string textStepTime(const Plan &plan, const StepTime &t, double step,
                         double dispatch);
/// "  compute          1.234 ms (12.3%)\n": a share of the step time.
std::string textTimeRow(const char *name, double time, double step);
/// The memory rows (params ... workspace) and the total against capacity.
std::string textMemoryRows(const MemoryBreakdown &m, double capacity);

/// One alternative as both reports list it.
struct AlternativeRow {
  std::string key;
  double time = 0, memory = 0;
  std::string why;
};
/// "== alternatives ==" and "  1. <key>: <time>, <GiB>: <why>" lines.
std::string textAlternatives(const std::vector<AlternativeRow> &rows);
template <class Alt>
std::string textAlternatives(const std::vector<Alt> &alts) {
  std::vector<AlternativeRow> rows;
  for (const Alt &a : alts)
    rows.push_back({a.cand.key(), a.cand.time.total(), a.cand.memory.total(),
                    a.why});
  return textAlternatives(rows);
}

/// "== search ==" and its first line (candidates priced, fit, out of
/// memory); textSearchTail: the pruned reasons and the search time.
std::string textSearchHead(int64_t priced, int64_t feasible,
                           int64_t outOfMemory);
std::string textSearchTail(const std::map<std::string, int64_t> &pruned,
                           double seconds);

//===----------------------------------------------------------------------===//
// JSON pieces of the plan file
//===----------------------------------------------------------------------===//

/// {"format": "dlopt-plan", "version", "kind", "mode"}: what every plan
/// file starts with (planner/Plan.h reads it).
json jsonEnvelope(const char *kind, int version, bool training);

/// JSON reports list at most this many ranks; the rest follow from
/// `rank_formula` and the cluster's node order (docs/plan-report.md), so a
/// report stays a few hundred KiB at any cluster size.
constexpr int kMaxListedRanks = 4096;

/// Writes `rank_columns`, `ranks` (the first kMaxListedRanks rows that
/// `row(rank)` gives), `ranks_total`, `ranks_listed` and `rank_formula`.
template <typename RowFn>
void jsonRankTable(json &j, int devices, json columns, const char *formula,
                   RowFn row) {
  json ranks = json::array();
  const int listed = devices < kMaxListedRanks ? devices : kMaxListedRanks;
  for (int rank = 0; rank < listed; ++rank)
    ranks.push_back(row(rank));
  j["rank_columns"] = std::move(columns);
  j["ranks"] = std::move(ranks);
  j["ranks_total"] = devices;
  j["ranks_listed"] = listed;
  j["rank_formula"] = formula;
}
/// The rank table of a plan in JSON (jsonRankTable), with the columns and
/// formula textRanks prints.
void jsonRanks(json &j, const Plan &plan, const Cluster &cluster);
/// {summary, devices, nodes, definition}: the definition in the
/// docs/cluster.md JSON format, so that the plan file can be read back
/// without --cluster.
json jsonCluster(const Cluster &cluster);
json jsonCommunication(const std::vector<CommOp> &comms);
json jsonMemory(const MemoryBreakdown &m, double capacity);
json jsonPruned(const std::map<std::string, int64_t> &pruned);
/// [{config, step_time, memory, why}], `config(cand)` giving the config.
template <class Alt, class Config>
json jsonAlternatives(const std::vector<Alt> &alts, Config config) {
  json out = json::array();
  for (const Alt &a : alts)
    out.push_back({{"config", config(a.cand)},
                   {"step_time", a.cand.time.total()},
                   {"memory", a.cand.memory.total()},
                   {"why", a.why}});
  return out;
}

} // namespace dlopt::planner::report
