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
  /// The group rank 0 timed: the ranks of its Group (NCCL_TESTS_SPLIT
  /// runs several groups at once; the timings are rank 0's group's).
  int ranks = 0, nodes = 0, ranksPerNode = 0;
  int groups = 1;     ///< groups the test's ranks formed
  std::string device; ///< rank 0's device, as nccl-tests names it
  int line = 0;       ///< where the test's header is (1-based)
  /// Its rows, sizes increasing; seconds are the out-of-place times.
  std::vector<CollectiveTableRow> rows;
};

/// What names the collective where the output may not.
struct NcclTestsNames {
  /// --nccl-tests COLLECTIVE=FILE: used where a test has no "# Collective
  /// test starting" line, and an error where it has one of another
  /// collective.
  std::optional<Collective> prefix;
  /// collectiveOfNcclTestsName(the file's name): used where neither the
  /// test nor the prefix names one.
  std::optional<Collective> fileName;
};

/// Reads the output of one or more nccl-tests runs (rank 0's standard
/// output of nccl-tests 2.13 or later; launcher and NCCL messages in
/// between are skipped, and `srun -l` and `mpirun --tag-output` line
/// prefixes taken off). The collective of each test comes from its "#
/// Collective test starting: X_perf" line (nccl-tests 2.16.7 and later),
/// else from `names`; the group from its "#  Rank ... on HOST device ..."
/// lines. Errors name `source` and the line: a test without a rank list
/// or rows, a rank listed twice or several tests' headers before rows
/// (each process ran its own test: nccl-tests without MPI=1), a size
/// twice, a row whose columns do not parse or do not agree (algbw is size
/// / time; busbw is the collective's factor over the group times algbw),
/// a row with wrong values (#wrong not 0 or N/A), output of another format
/// (before 2.13, or -C's CPU times), a collective dlopt does not price, a
/// prefix that contradicts the output.
Expected<std::vector<NcclTestsSweep>>
parseNcclTests(std::string_view text, std::string_view source,
               const NcclTestsNames &names = {});

/// The collective a file or program name names, from its base name's
/// words: all_reduce or allreduce, all_gather, reduce_scatter, alltoall
/// or all_to_all, broadcast (any case, words split at anything but
/// letters and digits); nullopt for none or more than one.
std::optional<Collective> collectiveOfNcclTestsName(std::string_view name);

} // namespace dlopt::planner
