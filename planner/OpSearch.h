//===- OpSearch.h - Op-level plans for any dlopt graph --------------------===//
//
// Plans a graph without the transformer layout Search.h needs: the devices
// form a dp x tp x pp mesh; over tp every op picks one of its sharding
// strategies (planner/OpSharding.h) so that compute, intrinsic
// communication and the resharding between ops are cheapest (an Alpa-style
// ILP, solved with COIN-OR CBC after exact series-parallel elimination);
// pipeline stages are contiguous in op order (by layer mark where marks
// exist) and balanced by an exact min-max partition; dp, tp, pp, the
// micro-batch size and the ZeRO stage are enumerated around it with the
// memory model as a constraint. docs/op-sharding.md has the formulation.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/OpSharding.h"
#include "planner/Report.h"
#include "planner/Search.h"
#include "planner/solver/ShardingSolver.h"

#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dlopt::planner {

//===----------------------------------------------------------------------===//
// The op-level plan
//===----------------------------------------------------------------------===//

/// The strategy chosen for one op.
struct OpChoice {
  int op = 0;
  std::string strategy;
  std::vector<Layout> operands;
  Layout result;
  double time = 0; ///< per micro-batch: compute (+ backward) and its comm
};

/// One resharding or intrinsic collective the plan inserts.
struct ReshardOp {
  int consumer = 0;     ///< op id
  int operand = -1;     ///< operand index; -1 for an intrinsic collective
  std::string producer; ///< "#12 dlopt.matmul" or "param fc0.weight"
  std::string what;     ///< "all-reduce P->R", "batch-norm statistics"
  bool backward = false;
  bool perStep = false; ///< once per step (parameter gradients), else per mb
  Collective collective = Collective::AllReduce;
  int groupSize = 1;
  double bytes = 0; ///< per call
  LinkKind link = LinkKind::None;
  double time = 0; ///< per call
};

/// A model chunk of a pipeline: one per stage, or, interleaved, v per
/// stage (chunk k runs on stage k % pp).
struct OpStage {
  int stage = 0;               ///< the pipeline stage that runs it
  int firstOp = 0, lastOp = 0; ///< inclusive op ids
  int numOps = 0;
  int64_t firstLayer = -1, lastLayer = -1; ///< marks inside, -1 if none
  double timePerMicroBatch = 0;
  double boundaryBytes = 0; ///< sent to the next chunk per micro-batch
};

struct OpCandidate {
  TrainingConfig cfg; ///< dp, tp (= the sharding axis t), pp, mbs, m, zero
  StepTime time;
  MemoryBreakdown memory;
  double capacity = 0;
  bool memoryConstrained = false; ///< the ILP ran with the memory row
  /// Seconds of host time issuing a step's kernel launches (its process's,
  /// under the plan's layout); time.host is what of it the devices cannot
  /// hide.
  double hostDispatch = 0;
  /// ZeRO-3: of time.dpComm, what the parameter gathers expose in the
  /// forward passes, and the gathers' and reduce-scatters' share of what
  /// the backward passes expose (for the report's rows).
  double zero3ForwardExposed = 0, zero3BackwardGatherExposed = 0;
  bool fits() const { return memory.total() <= capacity; }
  std::string key() const; ///< "dp=2 tp=4 pp=1 mbs=4 mb=2 zero=1"
};

struct OpAlternative {
  OpCandidate cand;
  std::string why;
};

struct OpSearchStats {
  int64_t priced = 0, feasible = 0, outOfMemory = 0;
  int64_t solves = 0;         ///< strategy problems solved
  int64_t ilpSolves = 0;      ///< of which reached the ILP
  int64_t maxCoreNodes = 0;   ///< largest problem left after elimination
  int64_t maxIlpVars = 0, maxIlpRows = 0;
  double ilpSeconds = 0;      ///< summed
  int64_t problemNodes = 0, problemEdges = 0; ///< of the chosen plan
  std::vector<std::string> notes; ///< fallbacks taken
  std::map<std::string, int64_t> pruned;
  double seconds = 0;
};

struct OpPlanResult {
  /// The chosen plan as the compiler applies it: settings, mesh, and the
  /// shardings the ILP chose for every value (over tp; batch dims over dp).
  /// Everything else here is prediction and search statistics.
  Plan plan;
  OpCandidate best;
  std::vector<OpAlternative> alternatives;
  OpSearchStats stats;
  SolveResult solve; ///< of the chosen plan's strategy problem
  std::vector<OpChoice> choices;  ///< per op (backward ops excluded)
  std::vector<std::pair<std::string, Layout>> params; ///< name, layout
  std::vector<ReshardOp> reshards;
  std::vector<CommOp> comms; ///< per step, like the transformer report
  std::vector<OpStage> stages;
  bool stagesByLayer = false;
  int64_t globalBatch = 0;
  bool training = true;
  Precision precision = Precision::BF16;
  double peakFlops = 0;
  double modelFlopsPerStep = 0; ///< forward FLOPs x (1 + backward ratio)
  double backwardRatio = 2;     ///< measured from backward ops, else calibration
  bool backwardFromGraph = false;
  /// Ops planned; backward ops (dlopt.backward); ops after the backward
  /// pass (the optimizer update of a training-step graph).
  int numForwardOps = 0, numBackwardOps = 0, numUpdateOps = 0;
};

/// How the op-level planner reads a graph: the ops it plans (forward ops in
/// program order), the backward ops (dlopt.backward) that follow their
/// forward ops, and the ops after the backward pass (the optimizer update of
/// a training-step graph), priced as the optimizer step.
struct OpGraphParts {
  std::vector<int> forward;
  int numBackward = 0, numUpdate = 0;
  double forwardFlops = 0, backwardFlops = 0;
};
OpGraphParts splitOpGraph(const GraphSummary &graph);

/// Runs the op-level search. Honours --fix dp, tp, pp, mbs, mb, zero and
/// schedule 1f1b/gpipe; other fixed settings are errors that say why.
Expected<OpPlanResult> searchOpPlan(const GraphSummary &graph,
                                    const Cluster &cluster,
                                    const CostModel &cost,
                                    const SearchOptions &options);

std::string formatOpTextReport(const OpPlanResult &plan,
                               const Cluster &cluster,
                               const GraphSummary &graph,
                               const ReportOptions &options = {});
std::string formatOpJsonReport(const OpPlanResult &plan,
                               const Cluster &cluster,
                               const GraphSummary &graph,
                               const ReportOptions &options = {});

} // namespace dlopt::planner
