//===- PlanFile.h - Reading a dlopt plan file back ------------------------===//
//
// `dlopt-compile --dry-run --format json` writes the versioned plan file
// (docs/plan-report.md, docs/op-sharding.md); `dlopt-compile --plan FILE`
// reads it back. The file embeds the cluster it was planned for and every
// choice, so reading it gives the cluster, the global batch and a FixSpec
// that pins all choices; the search then re-prices exactly that plan (and
// fails with the reason if the plan no longer fits the model, the cluster or
// the memory).
//
// Two kinds of plan share the envelope {"format": "dlopt-plan", "kind",
// "version"} and each kind counts its own versions:
//   "transformer" (Search.h): version 2. Files written before "kind" existed
//                 have no "kind" and are read as transformer plans.
//   "op-level"    (OpSearch.h): version 1.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Cluster.h"
#include "planner/Graph.h"
#include "planner/OpSearch.h"
#include "planner/Search.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlopt::planner {

enum class PlanKind { Transformer, OpLevel };
/// "transformer" or "op-level", as in the plan file's "kind".
const char *planKindName(PlanKind k);
/// The version this dlopt writes and reads for plans of kind `k`.
int planFileVersion(PlanKind k);

/// One op of an op-level plan as the file names it.
struct PlannedOp {
  int id = 0;
  std::string op;       ///< "dlopt.matmul"
  std::string strategy; ///< "column", "replicated", ...
  /// Layouts of the operands and of result #0 ("R", "S0", "P"), when the
  /// file gives them (op-level plans written by dlopt always do).
  std::optional<std::vector<std::string>> operands;
  std::optional<std::string> result;
};

struct LoadedPlan {
  PlanKind kind = PlanKind::Transformer;
  int version = 0;
  bool training = true;
  std::string precision; ///< "bf16", ...
  int64_t globalBatch = 0;
  FixSpec fix;           ///< every choice of the plan, pinned
  Cluster cluster;       ///< the embedded cluster definition
  /// False for an op-level file without `cluster.definition` (written before
  /// op-level plans could be read back): it needs --cluster.
  bool hasCluster = true;
  // What the plan was made for, checked against the model it is applied to.
  std::string modelName;
  double params = 0;
  // Transformer plans.
  int64_t layers = 0, hidden = 0, heads = 0, seq = 0, vocab = 0;
  // Op-level plans.
  int64_t numOps = 0, numBackwardOps = 0, numUpdateOps = 0;
  std::optional<Optimizer> optimizer; ///< config.optimizer when present
  std::vector<PlannedOp> ops;         ///< per planned op, in file order
  std::vector<std::pair<std::string, std::string>> paramLayouts; ///< name, layout
};

/// Parses plan-file text; `source` names it in messages. Errors name the
/// field: missing, of the wrong type, an unknown format, kind or version, or
/// choices that contradict each other or the plan kind.
Expected<LoadedPlan> parsePlanFile(std::string_view text,
                                   std::string_view source);
Expected<LoadedPlan> loadPlanFile(const std::string &path);

/// Checks that `plan` was made for the model `graph` summarizes. Transformer
/// plans: layers, hidden size, heads, sequence, vocab and parameter count.
/// Op-level plans: forward, backward and update op counts, parameter count
/// and the op at every planned id.
Status checkPlanMatchesModel(const LoadedPlan &plan, const GraphSummary &graph);

/// After re-pricing an op-level plan: "" when every op and parameter got the
/// strategy and layout the file names, else what differs (the count and the
/// first differences), e.g. because the calibration or the solver changed.
std::string compareOpSharding(const LoadedPlan &plan, const OpPlanResult &now,
                              const GraphSummary &graph);

} // namespace dlopt::planner
