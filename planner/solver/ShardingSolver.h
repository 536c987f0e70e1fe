//===- ShardingSolver.h - Pick one strategy per node of a graph -----------===//
//
// The strategy-selection problem of the op-level planner (OpSearch.h) and
// its solvers: exact series-parallel elimination, then an ILP (COIN-OR CBC)
// or greedy + local search on what is left, with a Lagrangian search when
// a memory budget binds; and the balanced contiguous partition of pipeline
// stages. Nothing here knows about ops or devices: a problem is costs on
// nodes and edges. docs/op-sharding.md has the formulation.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/support/Status.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace dlopt::planner {

using rt::Expected;
using rt::Status;

//===----------------------------------------------------------------------===//
// The strategy-selection problem and its solvers
//===----------------------------------------------------------------------===//

/// Pick one strategy per node; pay node costs and, per edge, the cost of the
/// pair of strategies at its ends; keep the summed node memory within the
/// budget.
struct ShardingProblem {
  struct Node {
    std::vector<double> cost; ///< per strategy
    std::vector<double> mem;  ///< per strategy (empty: all 0)
  };
  struct Edge {
    int u = 0, v = 0;
    std::vector<double> cost; ///< |K_u| x |K_v|, row-major
  };
  std::vector<Node> nodes;
  std::vector<Edge> edges;
  double memBudget = std::numeric_limits<double>::infinity();

  bool constrained() const { return memBudget < 1e300; }
  /// Cost of a full assignment; `mem` gets its memory.
  double evaluate(const std::vector<int> &choice, double *mem = nullptr) const;
  Status validate() const;
};

enum class SolverKind {
  /// Elimination, then the ILP on what is left (greedy without CBC); with a
  /// memory budget, a Lagrangian search by elimination, then the ILP.
  Auto,
  Ilp,        ///< the ILP on the whole problem, no elimination (benchmarks)
  Greedy,     ///< elimination, then greedy + local search on what is left
  BruteForce, ///< every assignment (tiny problems, tests)
};
const char *solverName(SolverKind k);

struct SolveOptions {
  SolverKind kind = SolverKind::Auto;
  double timeLimit = 20;       ///< seconds per ILP (a safety net)
  /// Branch-and-bound nodes per ILP: the limit that normally stops a hard
  /// ILP, deterministic unlike the time limit.
  int64_t maxNodes = 2000;
  /// With a memory budget: run the ILP after the Lagrangian search.
  bool polish = true;
  int64_t maxIlpVars = 400000; ///< above: greedy instead (said in the result)
  int64_t maxBruteForce = 20000000;
};

struct SolveResult {
  std::vector<int> choice;
  double cost = 0, mem = 0;
  bool feasible = true; ///< within the memory budget
  bool optimal = false; ///< proven optimal (elimination, ILP or brute force)
  std::string method;   ///< "elimination", "elimination + ilp (cbc)", ...
  std::string note;     ///< why a fallback was taken
  int coreNodes = 0;    ///< nodes left after elimination
  int64_t ilpVars = 0, ilpRows = 0;
  double ilpSeconds = 0;
};

/// True when the planner was built with CBC.
bool haveIlpSolver();
Expected<SolveResult> solveSharding(const ShardingProblem &p,
                                    const SolveOptions &options = {});

/// Contiguous balanced partition: `stages` non-empty ranges of `times` (in
/// order) minimizing the largest range sum (exact, O(stages n log n)).
/// Returns the `stages + 1` start indices (first 0, last n). Empty if n <
/// stages or stages < 1.
std::vector<int> partitionStages(const std::vector<double> &times, int stages);

} // namespace dlopt::planner
