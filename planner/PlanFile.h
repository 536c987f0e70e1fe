//===- PlanFile.h - Reading a dlopt plan file back ------------------------===//
//
// `dlopt-compile --dry-run --format json` writes the versioned plan file
// (docs/plan-report.md); `dlopt-compile --plan FILE` reads it back. The file
// embeds the cluster it was planned for and every choice, so reading it
// gives the cluster, the global batch and a FixSpec that pins all choices;
// the search then re-prices exactly that plan (and fails with the reason if
// the plan no longer fits the model, the cluster or the memory).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Cluster.h"
#include "planner/Graph.h"
#include "planner/Search.h"

#include <string>
#include <string_view>

namespace dlopt::planner {

struct LoadedPlan {
  int version = 0;
  bool training = true;
  std::string precision; ///< "bf16", ...
  int64_t globalBatch = 0;
  FixSpec fix;           ///< every choice of the plan, pinned
  Cluster cluster;       ///< the embedded cluster definition
  // What the plan was made for, checked against the model it is applied to.
  std::string modelName;
  int64_t layers = 0, hidden = 0, heads = 0, seq = 0, vocab = 0;
  double params = 0;
};

/// Parses plan-file text; `source` names it in messages. Errors name the
/// field: missing, of the wrong type, or an unknown format or version.
Expected<LoadedPlan> parsePlanFile(std::string_view text,
                                   std::string_view source);
Expected<LoadedPlan> loadPlanFile(const std::string &path);

/// Checks that `plan` was made for the model `graph` summarizes: layers,
/// hidden size, heads, sequence, vocab and parameter count must agree.
Status checkPlanMatchesModel(const LoadedPlan &plan, const GraphSummary &graph);

} // namespace dlopt::planner
