//===- Report.h - The dry-run placement report, as text or JSON -----------===//
//
// How to read it: docs/plan-report.md. The JSON form is the versioned plan
// file {"format": "dlopt-plan", "version": 1, ...}.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Cluster.h"
#include "planner/Graph.h"
#include "planner/Search.h"

#include <string>

namespace dlopt::planner {

struct ReportOptions {
  bool explain = false; ///< add the search statistics
  int maxRanks = 16;    ///< rank-table rows before the summary line
};

/// Pipeline stage, tensor and data coordinates of a global rank: tp is the
/// innermost axis, then dp, then pp (rank = (pp*dp_deg + dp)*tp_deg + tp).
struct RankCoords {
  int stage = 0, tp = 0, dp = 0;
};
RankCoords rankCoords(const TrainingConfig &cfg, int rank);

std::string formatTextReport(const PlanResult &plan, const Cluster &cluster,
                             const GraphSummary &graph,
                             const ReportOptions &options = {});
std::string formatJsonReport(const PlanResult &plan, const Cluster &cluster,
                             const GraphSummary &graph,
                             const ReportOptions &options = {});

} // namespace dlopt::planner
