//===- Report.h - The dry-run placement report, as text or JSON -----------===//
//
// How to read it: docs/plan-report.md. The JSON form is the versioned plan
// file {"format": "dlopt-plan", "version": 2, "kind": "transformer", ...}
// that planner/PlanFile.h reads back.
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

/// Pipeline stage, tensor, context and data coordinates of a global rank:
/// tp is the innermost axis, then cp, then dp, then pp (Megatron-LM's
/// order): rank = ((stage*dp_deg + dp)*cp_deg + cp)*tp_deg + tp.
struct RankCoords {
  int stage = 0, tp = 0, cp = 0, dp = 0;
};
RankCoords rankCoords(const TrainingConfig &cfg, int rank);

/// The operating-system process that drives `rank` under `layout`: the rank
/// itself (between-graph) or its node (in-graph / hybrid).
int processOf(const Cluster &cluster, ProcessLayout layout, int rank);

/// The command that launches the plan's processes (mpirun for more than one
/// process).
std::string launchCommand(const Cluster &cluster, const ProcessPlan &p,
                          const std::string &planFile);

std::string formatTextReport(const PlanResult &plan, const Cluster &cluster,
                             const GraphSummary &graph,
                             const ReportOptions &options = {});
std::string formatJsonReport(const PlanResult &plan, const Cluster &cluster,
                             const GraphSummary &graph,
                             const ReportOptions &options = {});

} // namespace dlopt::planner
