//===- ConfigSpace.h - The configurations both searches price -------------===//
//
// Both searches (Search.cpp for transformers, OpSearch.cpp for any graph)
// walk one space: the tensor, context and pipeline degrees (data
// parallelism takes the remaining devices), the split of the global batch
// into micro-batches, the pipeline schedule with its model chunks (v), the
// ZeRO stage, the recompute policy and sequence parallelism. Every choice
// honours --fix, and every shape skipped before pricing is counted under
// its reason (the report's "pruned" lines, and the "every candidate was
// pruned" error). What a search supports, and what limits its degrees, is
// a SpaceRules value: the transformer search varies every dim, limits tp
// by its heads and pp by its layers; the op-level search keeps cp = 1, no
// sequence parallelism, no recompute and one schedule, and limits pp by
// its forward ops. A --fix of a dim a search does not vary is refused
// (unsupportedFixes), never ignored.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Search.h"

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace dlopt::planner {

struct SpaceRules {
  int devices = 1;
  int gpusPerNode = 1;     ///< tp stays within a node unless --fix tp says
  int64_t globalBatch = 1; ///< samples per step
  int64_t maxMicroBatch = 0; ///< largest micro-batch tried; 0: no limit
  bool training = true;
  Optimizer optimizer = Optimizer::Adam;
  PrecisionConfig bytes;
  /// Why a tensor-parallel degree does not fit the model ("" when it
  /// does), checked before the node rule. Unset: every degree fits.
  std::function<std::string(int tp)> tpRule;
  /// What pipeline stages split ("layers", "ops") and how many there are:
  /// pp, and pp * v for interleaving, may not exceed it.
  std::string units = "layers";
  int64_t numUnits = 1;
  /// Context parallelism: searched for sequences of at least cpMinSeq
  /// tokens (any length when fixed); needs 2 * cp to divide seqLen.
  bool contextParallel = false;
  int64_t seqLen = 0, cpMinSeq = 0;
  /// Sequence parallelism (needs tp > 1 dividing the tokens per rank).
  bool sequenceParallel = false;
  /// Recompute policies (selective without sp or cp is pruned as the same
  /// plan as none, unless attention is unfused: then it drops the scores).
  bool recompute = false;
  /// Every pipeline schedule (GPipe, 1F1B, interleaved with each v whose
  /// pp * v divides the units, zero-bubble); otherwise one: --fix's, else
  /// 1F1B for training and GPipe for a forward pass.
  bool schedules = false;
};

/// Why `fix` pins what a search with `rules` does not vary ("" when it
/// pins nothing of the kind): cp > 1, sp = 1 or a recompute policy other
/// than none without the corresponding rule.
std::string unsupportedFixes(const SpaceRules &rules, const FixSpec &fix);

/// Why `fix` can match no configuration of a space of `rules` ("" when
/// it can), in the terms every search shares: the degrees against the
/// devices, dp x cp for ZeRO, pp (and pp * v interleaved) against the
/// units, the batch split against the global batch. A search adds its
/// model's own reasons (the transformer search: heads, widths, sequence).
std::string explainShapeFix(const SpaceRules &rules, const FixSpec &fix);

/// Calls visit(cfg) for every configuration of the space that `fix`
/// allows, in a fixed order (tp, cp, pp, batch split, schedule, ZeRO,
/// recompute, sp; each ascending), with cfg's optimizer and precision from
/// the rules; counts every shape skipped before pricing in `pruned`.
void forEachConfig(const SpaceRules &rules, const FixSpec &fix,
                   std::map<std::string, int64_t> &pruned,
                   const std::function<void(const TrainingConfig &)> &visit);

} // namespace dlopt::planner
