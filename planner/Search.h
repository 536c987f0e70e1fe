//===- Search.h - One search over data, tensor and pipeline parallelism ---===//
//
// Enumerates every (dp, tp, pp) with dp*tp*pp = devices, micro-batch size and
// count, pipeline schedule, ZeRO stage and recompute policy for a model with
// layer marks (a transformer from dlopt-gen), prices each candidate with the
// memory model (upper bound per device) and the cost model (roofline compute,
// tensor-parallel all-reduces, pipeline bubble and p2p, data-parallel
// gradient sync overlapped with the backward pass), drops those over the
// device memory and keeps the fastest. Deterministic: ties break on the
// configuration key. Formulas: docs/plan-report.md, "How a plan is priced".
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/CostModel.h"
#include "planner/Graph.h"
#include "planner/MemoryModel.h"
#include "planner/Mesh.h"
#include "planner/Plan.h"
#include "planner/Simulator.h"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlopt::planner {

/// "in-graph", "hybrid" (in-graph on several nodes) or "between-graph".
const char *layoutName(ProcessLayout l, int nodes);
std::optional<ProcessLayout> parseLayout(std::string_view s);

/// Choices a user pins with --fix; unset ones are searched.
struct FixSpec {
  std::optional<int> dp, tp, pp, cp, zero, v;
  std::optional<bool> sp;
  std::optional<int64_t> mbs, numMicroBatches;
  std::optional<PipelineSchedule> schedule;
  std::optional<RecomputePolicy> recompute;
  std::optional<ProcessLayout> layout;
  bool empty() const {
    return !dp && !tp && !pp && !cp && !sp && !zero && !v && !mbs &&
           !numMicroBatches && !schedule && !recompute && !layout;
  }
  std::string str() const;
  /// dp*tp*pp*cp over the fixed degrees (1 for those not fixed); nullopt
  /// when the product overflows int64.
  std::optional<int64_t> degreeProduct() const;
  /// dp*mbs*mb over the fixed values; nullopt on overflow.
  std::optional<int64_t> batchProduct() const;
};

/// The search settings that pin every choice of `plan` (its degrees,
/// micro-batching, schedule, ZeRO, recompute, sequence parallelism and
/// process layout), so that the search re-prices exactly it.
FixSpec fixSpecOf(const Plan &plan);

/// Largest global batch the planner takes (--global-batch).
inline constexpr int64_t kMaxGlobalBatch = int64_t(1) << 30;

struct SearchOptions;
/// Checks what both searches take: a global batch in [0, 2^30] (0: the
/// model's), and no ZeRO stage or recompute policy fixed for a forward-only
/// plan. Both searches call it first.
Status validateSearchOptions(const SearchOptions &opt);
/// Parses "tp=8,pp=8,mbs=1,schedule=1f1b,recompute=full,zero=1,dp=4,mb=16,
/// v=2,cp=2,sp=1,layout=between-graph".
/// Each key may appear once; contradictions the grammar alone shows
/// (v > 1 with a schedule other than interleaved) are refused.
Expected<FixSpec> parseFix(std::string_view text);
std::optional<PipelineSchedule> parseSchedule(std::string_view s);
std::optional<RecomputePolicy> parseRecompute(std::string_view s);

struct SearchOptions {
  bool training = true;        ///< false: forward-only (inference) plan
  int64_t globalBatch = 0;     ///< samples per step; 0 = the model's batch
  Precision precision = Precision::BF16; ///< compute precision
  PrecisionConfig bytes;       ///< bytes per param / grad / activation
  Optimizer optimizer = Optimizer::Adam;
  FixSpec fix;
  int topK = 3;
  /// Largest micro-batch size tried by the transformer search, in
  /// sequences (0: no limit other than the batch). The op-level search
  /// tries every divisor: its samples are rows or images, cheap to search
  /// and bounded by the memory constraint.
  int64_t maxMicroBatch = 64;
  /// Context parallelism is searched for sequences of at least this many
  /// tokens (shorter ones spend more on the K/V ring than attention saves);
  /// `--fix cp=N` applies at any length.
  int64_t contextParallelMinSeq = 8192;
};

/// The time of one step of one candidate, in seconds.
struct StepTime {
  double compute = 0;     ///< m micro-batches of the slowest stage
  double tpComm = 0;      ///< tensor-parallel all-reduces (not overlapped)
  double cpComm = 0;      ///< exposed context-parallel K/V ring exchange
  double ppComm = 0;      ///< exposed pipeline send/recv
  double dpComm = 0;      ///< exposed gradient sync / ZeRO gathers
  double bubble = 0;      ///< pipeline fill and drain
  double host = 0;        ///< host dispatch the devices wait for
  double optimizer = 0;   ///< the optimizer step after the gradient sync
  double total() const {
    return compute + tpComm + cpComm + ppComm + dpComm + bubble + host +
           optimizer;
  }
  double exposedComm() const { return tpComm + cpComm + ppComm + dpComm; }
};

/// The process layout of a candidate and its host-side figures.
struct ProcessPlan {
  ProcessLayout layout = ProcessLayout::BetweenGraph;
  int processesPerNode = 1;
  double hostDispatch = 0;   ///< seconds of launches per step, per device
  double hostMemory = 0;     ///< bytes per node (processes + staging)
  double hostCapacity = 0;   ///< the node's host memory; 0 = unknown
  std::string why;           ///< why this layout over the other
};

struct Candidate {
  TrainingConfig cfg;
  ProcessPlan process;
  StepTime time;
  MemoryBreakdown memory; ///< the stage with the largest total
  double capacity = 0;    ///< device memory
  bool fits() const { return memory.total() <= capacity; }
  /// "dp=4 tp=2 pp=1 mbs=1 mb=8 schedule=1f1b zero=1 recompute=none"
  /// (plus cp=N, sp=1 and the layout when they apply).
  std::string key() const;
};

/// One collective a step issues on one rank.
struct CommOp {
  std::string what;  ///< "tp all-reduce (fwd+bwd)", ...
  Collective collective = Collective::AllReduce;
  int groupSize = 1;
  double bytes = 0;  ///< per call, as in CostModel::commTime
  double calls = 0;  ///< per step
  LinkKind link = LinkKind::None;
  double time = 0;   ///< per step, before overlap
  double exposed = 0;
  /// The algorithm the cost model picked ("ring", "nvls-tree", ...), or
  /// "mixed" for a line that sums several collectives.
  std::string algorithm = "ring";
  /// NCCL's protocol the cost model picked ("LL", "LL128", "Simple"),
  /// "none" where it prices one protocol, "mixed" with "mixed" above.
  std::string protocol = "none";
};

struct Alternative {
  Candidate cand;
  std::string why; ///< "slower by 12.3%" or "out of memory by 4.2 GiB"
};

struct SearchStats {
  int64_t enumerated = 0; ///< candidates priced (memory and time)
  int64_t feasible = 0;
  int64_t outOfMemory = 0;
  /// Shapes or settings skipped before pricing, by reason.
  std::map<std::string, int64_t> pruned;
  double seconds = 0; ///< wall time of the search
};

struct PlanResult {
  /// The chosen plan as the compiler applies it: settings, mesh, and the
  /// Megatron shardings of every value (planner/TransformerSharding.h).
  /// Everything else here is prediction and search statistics.
  Plan plan;
  Candidate best;
  std::vector<Alternative> alternatives;
  SearchStats stats;
  /// Layer marks per pipeline stage (index = stage), "pre" on the first,
  /// "post" on the last.
  std::vector<std::vector<int64_t>> stageLayers;
  /// Heterogeneous clusters only: the GPU kind and device memory each stage
  /// runs on (the slowest and smallest among its ranks). Empty otherwise.
  std::vector<std::string> stageGpus;
  std::vector<double> stageCapacity;
  std::vector<CommOp> comms;
  TransformerSpec spec;
  double totalParams = 0;
  int64_t globalBatch = 0, seq = 0;
  double modelFlopsPerStep = 0; ///< 6 * params * tokens (2 * ... forward-only)
  double peakFlops = 0;         ///< per device, chosen precision
  Precision precision = Precision::BF16;
  bool training = true;
  /// The best plan replayed by the discrete-event simulator (training
  /// plans): per-stage times and memory from the same cost and memory
  /// models (the optimizer step included, as in the analytical total).
  SimInput simInput;
  std::optional<SimResult> simulated;
  std::string simError; ///< why there is no simulation, if there is none
};

/// The contiguous split of `layers` layers over `stages` stages (each at
/// least one layer) that minimizes the largest stage time, where
/// time(st, a, b) is stage st's time for layers [a, b) and fits(st, n) says
/// whether n layers fit stage st's memory. Both must be monotone: a stage's
/// time and memory never shrink when its range grows. Bisection on the
/// bottleneck; for a bottleneck T a greedy fill (each stage as many layers
/// as fit in T and memory) succeeds whenever any split does. Returns {}
/// when no split fits. Used for heterogeneous clusters.
///
/// For a bottleneck T, reachability over (stage, first layer) decides
/// whether a split exists in O(stages * layers). With `positionFree` (a
/// stage's time depends only on its layer count, as with identical layers)
/// filling each stage greedily is optimal and is found in
/// O(stages * log layers).
std::vector<int64_t> minMaxContiguousSplit(
    int64_t layers, int stages,
    const std::function<double(int, int64_t, int64_t)> &time,
    const std::function<bool(int, int64_t)> &fits, bool positionFree = false);

/// The TransformerSpec the memory model uses for a summarized graph.
Expected<TransformerSpec> transformerSpecOf(const GraphSummary &g);

/// Runs the search. Errors: the graph is not a transformer with layer marks,
/// an impossible --fix (which constraint fails and by how much), no plan
/// within memory (the best memory found against the capacity).
Expected<PlanResult> searchPlan(const GraphSummary &graph,
                                const Cluster &cluster, const CostModel &cost,
                                const SearchOptions &options);

/// The schedule's spelling in `--fix` and plan files ("gpipe", "1f1b",
/// "interleaved", "zero-bubble").
const char *scheduleKey(PipelineSchedule s);

} // namespace dlopt::planner
