//===- Mesh.h - The device mesh of a plan and its rank geometry -----------===//
//
// A plan's devices form a mesh of named axes listed in rank order, major to
// minor. The planner's mesh is pp x dp x cp x tp (Megatron-LM's order):
//   rank = ((stage*dp + dp_index)*cp + cp_index)*tp + tp_index
// so tp neighbours are adjacent ranks (one node) and pipeline stages are the
// outermost blocks. Everything that needs the position of a rank (reports,
// plan application's communicator groups, the launch line) goes through
// here. Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/support/Status.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlopt::planner {

using rt::Expected;
using rt::Status;

struct Cluster;

/// How ranks map to operating-system processes. InGraph: one process per
/// node drives all of the node's GPUs (on several nodes this is the hybrid
/// layout: in-graph inside a node, between-graph across nodes).
/// BetweenGraph: one process per GPU.
enum class ProcessLayout { InGraph, BetweenGraph };

/// One named mesh axis.
struct MeshAxis {
  std::string name; ///< "pp", "dp", "cp", "tp"
  int size = 1;
  bool operator==(const MeshAxis &o) const = default;
};

class Mesh {
public:
  Mesh() = default;
  /// Axes in rank order, major to minor. Use make() for untrusted input.
  explicit Mesh(std::vector<MeshAxis> axes) : axes_(std::move(axes)) {}
  /// Checks the axes: at least one, distinct non-empty names, sizes >= 1,
  /// and a product that fits an int.
  static Expected<Mesh> make(std::vector<MeshAxis> axes);
  /// The planner's mesh: pp x dp x cp x tp, every axis present (size 1
  /// where unused).
  static Mesh standard(int pp, int dp, int cp, int tp);

  const std::vector<MeshAxis> &axes() const { return axes_; }
  int rank() const { return int(axes_.size()); } ///< number of axes
  /// Product of the axis sizes (1 for an empty mesh).
  int numDevices() const;
  /// Index of the axis named `name`, or nullopt.
  std::optional<int> axisIndex(std::string_view name) const;
  /// Size of the axis named `name`; 1 when the mesh has no such axis.
  int size(std::string_view name) const;
  bool hasAxis(std::string_view name) const { return axisIndex(name).has_value(); }

  /// The coordinates of `rank` (one per axis, in axis order).
  std::vector<int> coords(int rank) const;
  /// The coordinate of `rank` on axis `name` (0 if the mesh has none).
  int coord(int rank, std::string_view name) const;
  /// The linear rank of `coords` (one per axis, each in range).
  int linearRank(const std::vector<int> &coords) const;

  /// The ranks of the group over `axes` that contains `rank`: every rank
  /// that agrees with `rank` outside `axes`, ordered by their coordinates
  /// on `axes` (in the order `axes` lists them, the first major). Unknown
  /// axis names are ignored (size 1).
  std::vector<int> group(int rank, const std::vector<std::string> &axes) const;
  /// All groups over `axes`, each as group() orders it, in the order of
  /// their smallest rank: a partition of the ranks.
  std::vector<std::vector<int>>
  groups(const std::vector<std::string> &axes) const;

  /// "pp=2 dp=2 cp=1 tp=4".
  std::string str() const;
  /// "rank = ((pp_index*dp + dp_index)*cp + cp_index)*tp + tp_index".
  std::string rankFormula() const;

  bool operator==(const Mesh &o) const = default;

private:
  std::vector<MeshAxis> axes_;
};

/// Pipeline stage, tensor, context and data coordinates of a global rank on
/// the standard mesh.
struct RankCoords {
  int stage = 0, tp = 0, cp = 0, dp = 0;
};
RankCoords rankCoords(const Mesh &mesh, int rank);

/// The operating-system process that drives `rank` under `layout`: the rank
/// itself (between-graph) or its node (in-graph / hybrid).
int processOf(const Cluster &cluster, ProcessLayout layout, int rank);

} // namespace dlopt::planner
