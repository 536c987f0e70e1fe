//===- Plan.h - The plan: everything the compiler applies -----------------===//
//
// Both searches (Search.h, OpSearch.h) return a Plan; the dry-run reports
// render it next to their predictions; `dlopt-compile --plan FILE` reads it
// back. A plan holds
//   - the device mesh (pp x dp x cp x tp in rank order, planner/Mesh.h) and
//     the cluster it was made for;
//   - the sharding of every value of the forward function (op results keyed
//     by the stable op ids dlopt-check-model stamps, `dlopt.id`, which
//     survive the training transforms; function arguments by name), and the
//     sharding each op requires of its operands;
//   - the pipeline stage of every op;
//   - the schedule, micro-batching, global batch, ZeRO stage, recompute
//     policy, sequence parallelism, optimizer and process layout;
//   - a fingerprint of the model it was made for, checked when it is read
//     back.
// Predictions (step time, memory, MFU, alternatives) are not part of it.
//
// The JSON form (docs/plan-report.md, "The plan file") is written by
// toJson and read by Plan::parse, here and nowhere else.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Cluster.h"
#include "planner/CostModel.h"
#include "planner/Graph.h"
#include "planner/MemoryModel.h"
#include "planner/Mesh.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlopt::planner {

/// How a tensor lies over the mesh: per tensor dim, the mesh axes it is
/// split over (major to minor: the block of a rank along the dim is indexed
/// by its coordinates on those axes, the first axis major); and the axes
/// over which every rank holds a summand of the value (partial, pending a
/// sum). Axes in neither are replicated.
struct Sharding {
  std::vector<std::vector<std::string>> split; ///< one entry per tensor dim
  std::vector<std::string> partial;

  /// Every dim unsplit, nothing partial, for a tensor of rank `rank`.
  static Sharding replicated(int rank) {
    Sharding s;
    s.split.resize(rank);
    return s;
  }
  int rank() const { return int(split.size()); }
  bool isReplicated() const;
  /// Whether `axis` splits some dim or is partial.
  bool uses(std::string_view axis) const;
  /// The dim split over `axis`, or -1.
  int dimOf(std::string_view axis) const;
  /// "[dp, -, tp]", "[dp.cp, -] partial(tp)", "[]" for a scalar.
  std::string str() const;
  bool operator==(const Sharding &o) const = default;
};

/// What kind of plan: the search that made it (and re-prices it).
enum class PlanKind { Transformer, OpLevel };
/// "transformer" or "op-level", as in the plan file's "kind".
const char *planKindName(PlanKind k);

/// The plan-file version this dlopt writes and reads (both kinds).
inline constexpr int kPlanFileVersion = 3;

/// One op of the forward function as the plan applies it.
struct PlannedOp {
  int64_t id = 0;       ///< the stable op id (OpNode::key)
  std::string op;       ///< "dlopt.matmul": checked against the model
  int stage = 0;        ///< pipeline stage
  std::string strategy; ///< "column", "row", "vocab-parallel", ...
  /// The sharding the op requires of each operand (a resharding is inserted
  /// where the producer's differs).
  std::vector<Sharding> operands;
  /// The sharding of each result (index = result number).
  std::vector<Sharding> results;
};

/// One argument of the forward function.
struct PlannedArg {
  std::string name; ///< dlopt.param / dlopt.input / dlopt.state name
  ArgNode::Role role = ArgNode::Role::Other;
  Sharding sharding;
};

/// What a plan was made for; the model it is applied to must match.
struct ModelFingerprint {
  std::string name;      ///< entry function
  double params = 0;     ///< parameter elements
  int64_t ops = 0;       ///< planned (forward) ops
  /// Of a graph that is already a training step: its backward ops and the
  /// ops after them (the optimizer update). 0 for a forward model.
  int64_t backwardOps = 0, updateOps = 0;
  std::string dtype;     ///< the params' element type
  std::string precision; ///< compute precision: "bf16", ...
  /// Priced with unfused attention (dlopt-compile --attention-kernel
  /// unfused, a dry-run setting); written as model.attention_kernel only
  /// when set.
  bool unfusedAttention = false;
  /// Priced with eager PyTorch's RMS norms and rotary embeddings
  /// (dlopt-compile --eager-kernels norm,rope, a dry-run setting); written
  /// as model.eager_kernels ("norm", "rope" or "norm,rope") only when set.
  bool eagerNorm = false, eagerRope = false;
  // Transformers only (0 otherwise).
  int64_t layers = 0, hidden = 0, heads = 0, seq = 0, vocab = 0;
};

struct Plan {
  PlanKind kind = PlanKind::Transformer;
  bool training = true;
  ModelFingerprint model;
  Cluster cluster;
  Mesh mesh = Mesh::standard(1, 1, 1, 1);

  int64_t globalBatch = 0;
  int64_t microBatchSize = 1;
  int64_t numMicroBatches = 1; ///< per pipeline, per step
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  int virtualStages = 1;       ///< interleaved 1F1B only
  int zeroStage = 0;
  RecomputePolicy recompute = RecomputePolicy::None;
  bool sequenceParallel = false;
  Optimizer optimizer = Optimizer::Adam;
  ProcessLayout layout = ProcessLayout::BetweenGraph;
  /// Layers per stage when the split is not the uniform one (heterogeneous
  /// clusters); empty otherwise.
  std::vector<int64_t> stageLayerCounts;

  std::vector<PlannedArg> args;
  std::vector<PlannedOp> ops; ///< forward ops, in program order

  int dp() const { return mesh.size("dp"); }
  int tp() const { return mesh.size("tp"); }
  int pp() const { return mesh.size("pp"); }
  int cp() const { return mesh.size("cp"); }

  /// The op with stable id `id`, or nullptr.
  const PlannedOp *op(int64_t id) const;
  /// The sharding of result `result` of op `id`, or nullptr.
  const Sharding *resultSharding(int64_t id, int result = 0) const;
  /// The sharding of the argument named `name`, or nullptr.
  const Sharding *argSharding(std::string_view name) const;
  /// The pipeline stage of op `id`, or nullopt.
  std::optional<int> stageOf(int64_t id) const;

  /// The plan file, as a JSON document (without the report).
  std::string toJson() const;
  /// Parses a plan file; `source` names it in messages. Errors name the
  /// field: missing, of the wrong type, an unknown format, kind or version,
  /// axes that do not exist, or choices that contradict each other, the
  /// mesh or the cluster. A "report" object next to the plan is not read.
  static Expected<Plan> parse(std::string_view text, std::string_view source);
  static Expected<Plan> load(const std::string &path);
};

/// A plan with the settings of a search's chosen configuration and the
/// model's fingerprint; the searches then add the args and ops.
Plan planFromConfig(PlanKind kind, const GraphSummary &graph,
                    const Cluster &cluster, const TrainingConfig &cfg,
                    int64_t globalBatch, bool training, Precision precision,
                    ProcessLayout layout);

/// Checks that `plan` was made for the model `graph` summarizes: the
/// parameter count, the transformer dims (transformer plans), the number of
/// planned ops, and the op at every planned id.
Status checkPlanMatchesModel(const Plan &plan, const GraphSummary &graph);

/// "" when `now` (the plan re-solved from `file`'s settings) assigns every
/// op the strategy and shardings `file` names, and every argument its
/// sharding; else what differs (the count and the first differences).
std::string comparePlans(const Plan &file, const Plan &now);

} // namespace dlopt::planner
