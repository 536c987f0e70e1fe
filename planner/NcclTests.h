//===- NcclTests.h - Collective measurements from nccl-tests' output ------===//
//
// nccl-tests (github.com/NVIDIA/nccl-tests: all_reduce_perf,
// all_gather_perf, ...) is what a GPU cluster's users run to measure its
// collectives. parseNcclTests() reads what those programs print and turns
// each test into collective_table rows of the calibration
// (docs/cost-model.md, "Measured collectives"): the collective, the group's
// ranks, nodes and ranks a node (from the rank list), and the out-of-place
// time at each size. dlopt-calibrate --nccl-tests writes them
// (docs/dlopt-calibrate.md).
//
// Plain C++; no MLIR or LLVM headers.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Calibration.h"
#include "runtime/support/Status.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlopt::planner {

/// One nccl-tests test: a sweep of one collective over one group.
struct NcclTestsSweep {
  Collective collective = Collective::AllReduce;
  int ranks = 0, nodes = 0, ranksPerNode = 0;
  std::string device; ///< rank 0's device, as nccl-tests names it
  int line = 0;       ///< where the test's header is (1-based)
  /// Its rows, sizes increasing; seconds are the out-of-place times.
  std::vector<CollectiveTableRow> rows;
};

/// Reads the output of one or more nccl-tests runs (rank 0's standard
/// output, other lines such as launcher warnings in between are skipped).
/// The collective of each test comes from its "# Collective test starting:
/// X_perf" line (nccl-tests 2.17 and later), else from `collective`; the
/// group from its "#  Rank ... on HOST device ..." lines. Errors name
/// `source` and the line: a test without a rank list or rows, a rank
/// listed twice, a size twice, a row whose columns do not parse, a row
/// with wrong values (#wrong not 0 or N/A), a bus bandwidth that is not
/// the collective's over those ranks (the wrong collective, or a rank list
/// that is not the test's), a collective dlopt does not price.
Expected<std::vector<NcclTestsSweep>>
parseNcclTests(std::string_view text, std::string_view source,
               std::optional<Collective> collective = std::nullopt);

/// The collective of an nccl-tests program or file name: the first of
/// all_reduce, all_gather, reduce_scatter, alltoall, broadcast it contains
/// (reduce_scatter before the others it contains); nullopt for none.
std::optional<Collective> collectiveOfNcclTestsName(std::string_view name);

} // namespace dlopt::planner
