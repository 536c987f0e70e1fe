//===- Report.h - The dry-run placement report, as text or JSON -----------===//
//
// How to read it: docs/plan-report.md. The JSON form is the versioned plan
// file {"format": "dlopt-plan", "version": 2, "kind": "transformer", ...}
// that planner/Plan.h reads back.
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
  /// The executable the launch line runs (dlopt-compile's -o, else the
  /// model's name with .exe).
  std::string executable = "model.exe";
  /// The calibration the plan was priced with: the communication table
  /// says what its collective_table covered (nullptr: nothing said).
  const Calibration *calibration = nullptr;
};

/// The standard mesh (planner/Mesh.h) of a configuration:
/// pp x dp x cp x tp.
Mesh meshOf(const TrainingConfig &cfg);
/// rankCoords(meshOf(cfg), rank).
RankCoords rankCoords(const TrainingConfig &cfg, int rank);

/// The command that launches the plan's processes (mpirun for more than one
/// process).
std::string launchCommand(const Cluster &cluster, const ProcessPlan &p,
                          const std::string &planFile);
/// The same launch under Slurm: srun -N NODES --ntasks-per-node K dlopt-run
/// ... (docs/launch.md).
std::string srunCommand(const Cluster &cluster, const ProcessPlan &p,
                        const std::string &planFile);

std::string formatTextReport(const PlanResult &plan, const Cluster &cluster,
                             const GraphSummary &graph,
                             const ReportOptions &options = {});
std::string formatJsonReport(const PlanResult &plan, const Cluster &cluster,
                             const GraphSummary &graph,
                             const ReportOptions &options = {});

} // namespace dlopt::planner
