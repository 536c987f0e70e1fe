//===- GraphSummary.h - Summarize a dlopt entry function for the planner --===//
#pragma once

#include "planner/Graph.h"

#include "mlir/IR/BuiltinOps.h"

namespace dlopt {

/// Walks the entry function (`entry`, else @main or the only public one) and
/// returns its per-layer-mark costs for the planner (see planner/Graph.h).
/// Ops carry the stable ids (`dlopt.id`) they have; run stampOpIds
/// (passes/ModelUtils.h) first so that every op has one.
/// Emits an error and fails when the entry cannot be found.
mlir::FailureOr<planner::GraphSummary>
summarizeGraph(mlir::ModuleOp module, llvm::StringRef entry);

} // namespace dlopt
