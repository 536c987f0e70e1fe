//===- TransformerSharding.h - Megatron shardings for a transformer plan --===//
//
// The transformer search chooses degrees (dp, tp, pp, cp, sp) and a stage
// split; plan application needs the sharding of every value. This lowers
// the choice into per-value shardings of the forward ops with Megatron-LM's
// template, found by walking the graph in program order:
//   - inputs: batch dim over dp, sequence dim over cp;
//   - a matmul with a weight param whose input is split over tp on its
//     contraction dim is row-parallel (weight split on its input dim, result
//     partial over tp); otherwise, when tp divides its output width, it is
//     column-parallel (weight split on its output dim, input gathered over
//     tp); the LM head over the vocabulary is vocab-parallel;
//   - attention heads follow the column-parallel QKV split through the
//     reshapes (heads over tp), the sequence stays over cp (ring);
//   - the token embedding is vocab-parallel (table rows over tp, result
//     partial over tp) and so is the cross-entropy on class-split logits;
//   - a partial value is reduced where it is used: with sequence
//     parallelism into a split of its sequence dim over tp (reduce-scatter),
//     otherwise replicated (all-reduce); norms run sequence-parallel;
//   - anything else keeps the splits it can and replicates the rest.
// Each op gets the sharding it requires of its operands (a resharding where
// the producer's differs) and the sharding of its results. Plain C++.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Graph.h"
#include "planner/MemoryModel.h"
#include "planner/Plan.h"

#include <cstdint>
#include <vector>

namespace dlopt::planner {

/// Fills `plan.args` and `plan.ops` (every forward op, GraphSummary::
/// forwardOps) for configuration `cfg`. `stageLayers[s]` lists the layer
/// marks of pipeline stage s; unmarked ops before the first layer go to
/// stage 0, the others to the last stage.
void lowerTransformerSharding(const GraphSummary &graph,
                              const TrainingConfig &cfg,
                              const std::vector<std::vector<int64_t>> &stageLayers,
                              Plan &plan);

/// The pipeline stage of every op of `graph` (index = position) under the
/// layer split `stageLayers`, as lowerTransformerSharding assigns it.
std::vector<int> stagesByLayer(const GraphSummary &graph,
                               const std::vector<std::vector<int64_t>> &stageLayers);

} // namespace dlopt::planner
