//===- OpSharding.h - Per-op sharding rules and resharding costs ----------===//
//
// The op-level half of the planner (docs/op-sharding.md). Devices form a
// dp x t (x pp) mesh; op-level sharding acts over the t axis. Over t a
// tensor is Replicated (R), Split along one dim (S(d)) or Partial (P: every
// rank holds a full-size summand). Each op class has sharding rules: the
// strategies an op may run with (required operand layouts -> result layout,
// the factor its compute is divided by, intrinsic communication). Between a
// producer's layout and a consumer's requirement a resharding collective
// may be needed; its time comes from CostModel::commTime over the t group.
// Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/CostModel.h"
#include "planner/Graph.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlopt::planner {

/// How a tensor lies over the t ranks of the op-sharding axis.
struct Layout {
  enum Kind : uint8_t { R, S, P };
  Kind kind = R;
  int dim = -1; ///< the split dim for S

  static Layout rep() { return {R, -1}; }
  static Layout split(int d) { return {S, d}; }
  static Layout partial() { return {P, -1}; }
  bool operator==(const Layout &o) const {
    return kind == o.kind && (kind != S || dim == o.dim);
  }
  bool operator!=(const Layout &o) const { return !(*this == o); }
  /// "R", "S0", "S2", "P".
  std::string str() const;
  /// Parses str()'s form; nullopt for anything else (split dims 0-15).
  static std::optional<Layout> parse(std::string_view text);
};

/// A collective an op strategy issues by itself (not a resharding).
struct IntrinsicComm {
  Collective collective = Collective::AllReduce;
  double bytes = 0;      ///< as in CostModel::commTime
  bool backward = false; ///< issued in the backward pass
  std::string what;      ///< "batch-norm statistics", ...
};

/// One way to run an op over the t ranks.
struct Strategy {
  std::string name;             ///< "column", "row", "batch", "replicated", ...
  std::vector<Layout> operands; ///< required layout of each operand
  Layout result;                ///< layout of result #0
  int divisor = 1;              ///< compute (FLOPs and bytes) divided by this
  std::vector<IntrinsicComm> comms;
};

/// Shape and size of one value for one micro-batch.
struct ValueInfo {
  std::vector<int64_t> shape; ///< micro-batch shape
  int batchDim = -1;          ///< the dim that scales with the batch, or -1
  double bytes = 0;           ///< full (unsharded) bytes at plan precision
  bool isFloat = true;
  bool needsGrad = false;     ///< a param or derived from one (training)
  bool isParam = false;
  bool isFree = true;         ///< an input, state, constant: any layout free
};

/// Per-micro-batch geometry of a summarized graph: the shapes of every
/// value with the model batch replaced by the micro-batch size. Batch dims
/// are found by propagation from the inputs' leading dim.
class GraphGeometry {
public:
  /// `floatBytes`: bytes per float element at the plan's precision (the
  /// graph's dtype may differ).
  GraphGeometry(const GraphSummary &graph, int64_t microBatch,
                double floatBytes);

  const GraphSummary &graph() const { return *graph_; }
  int64_t microBatch() const { return mbs_; }
  /// Result #0 of op `id`.
  const ValueInfo &result(int id) const { return results_[id]; }
  /// Operand `i` of op `id` (shape from the consumer's view).
  const ValueInfo &operand(int id, int i) const { return operands_[id][i]; }
  const ValueInfo &arg(int index) const { return args_[index]; }
  /// Factor from the model batch to this micro-batch for the op's FLOPs and
  /// bytes (1 for ops that do not depend on the batch).
  double scale(int id) const { return scales_[id]; }
  /// Batch dim of result #0 for the model batch (independent of mbs).
  int batchDim(int id) const { return results_[id].batchDim; }

private:
  const GraphSummary *graph_;
  int64_t mbs_;
  std::vector<ValueInfo> results_, args_;
  std::vector<std::vector<ValueInfo>> operands_;
  std::vector<double> scales_;
};

/// The strategies of op `id` over `t` ranks (t = 1: "replicated" only).
/// Every op gets at least "replicated". Deterministic order.
std::vector<Strategy> shardingRules(const GraphGeometry &geo, int id, int t);

/// Layouts a parameter may take (R and S(d) for every dim divisible by t).
std::vector<Layout> paramLayouts(const std::vector<int64_t> &shape, int t);

/// The layout the gradient of an operand has when the consumer ran with
/// requirement `required` and compute divisor `divisor`: Partial when a
/// replicated operand met split compute, R when the operand was taken as
/// Partial (the op is linear), else the requirement.
Layout gradLayout(Layout required, int divisor);
/// The gradient layout a producer with result layout `produced` needs (R
/// for a Partial result: every summand gets the full gradient).
Layout gradNeed(Layout produced);

/// One resharding: what collective turns `from` into `to`.
struct Reshard {
  bool needed = false; ///< false: same layout or a local slice
  Collective collective = Collective::AllReduce;
  double bytes = 0; ///< as in CostModel::commTime
  std::string str() const; ///< "all-gather S1->R"
  Layout from, to;
};
/// from == to: none; S->R all-gather (full bytes); R->S, R->P, S->P local
/// (free); S(a)->S(b) all-to-all (bytes / t per rank); P->R all-reduce
/// (full); P->S reduce-scatter (full). `fullBytes` is the unsharded size.
Reshard reshard(Layout from, Layout to, double fullBytes, int t);

/// Times of collectives over the t group (and others), cached.
class CommPricer {
public:
  CommPricer(const Cluster &cluster, const CostModel &cost)
      : cluster_(&cluster), cost_(&cost) {}
  /// Time of `c` with `bytes` over {0, stride, ..., (size-1)*stride}; 0 for
  /// size 1 or no bytes. `link` gets the bottleneck link and `algorithm`
  /// the algorithm the cost model picked, `protocol` NCCL's protocol.
  double time(Collective c, double bytes, int size, int stride,
              LinkKind *link = nullptr, CommAlgorithm *algorithm = nullptr,
              CommProtocol *protocol = nullptr) const;
  double time(const Reshard &r, int t, LinkKind *link = nullptr) const {
    return r.needed ? time(r.collective, r.bytes, t, 1, link) : 0;
  }
  const CostModel &cost() const { return *cost_; }

private:
  const Cluster *cluster_;
  const CostModel *cost_;
  mutable std::vector<std::pair<std::pair<int, int>, Expected<CommGroup>>>
      groups_;
};

/// Roofline class of an op (matmul and conv use matmul efficiency).
OpKind rooflineKind(const OpNode &op);

} // namespace dlopt::planner
