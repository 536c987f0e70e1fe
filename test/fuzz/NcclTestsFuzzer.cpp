//===- NcclTestsFuzzer.cpp - Fuzzes the nccl-tests output reader ----------===//
//
// parseNcclTests (dlopt-calibrate --nccl-tests FILE): the text nccl-tests'
// programs print. The first byte picks the collectives a COLLECTIVE=
// prefix and the file's name would name (or none). What it reads must make a
// valid collective_table that survives the calibration file's round trip, and
// the cost model must price from it.
//
//===----------------------------------------------------------------------===//
#include "planner/CostModel.h"
#include "planner/NcclTests.h"
#include "test/fuzz/FuzzUtil.h"

#include <cmath>
#include <optional>

using namespace dlopt::planner;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  // The first byte: a prefix's collective (low 3 bits, 0-4; 5-7 none)
  // and a file name's (next 3 bits).
  NcclTestsNames names;
  if (data[0] % 8 < 5)
    names.prefix = Collective(data[0] % 8);
  if ((data[0] >> 3) % 8 < 5)
    names.fileName = Collective((data[0] >> 3) % 8);
  auto sweeps =
      parseNcclTests(dlopt::fuzz::textOf(data + 1, size - 1), "fuzz", names);
  if (!sweeps) {
    FUZZ_EXPECT(!sweeps.status().message().empty(),
                "an error without a message");
    return 0;
  }
  FUZZ_EXPECT(!sweeps->empty(), "success without a test");
  for (const NcclTestsSweep &w : *sweeps) {
    FUZZ_EXPECT(w.ranks >= 2 && w.nodes >= 1 && w.nodes <= w.ranks &&
                    w.ranksPerNode >= 1 && w.ranksPerNode <= w.ranks,
                "a group out of range");
    FUZZ_EXPECT(!w.rows.empty(), "a test without rows");
    for (size_t i = 0; i < w.rows.size(); ++i) {
      FUZZ_EXPECT(w.rows[i].seconds > 0 && std::isfinite(w.rows[i].seconds),
                  "a time that is not positive");
      FUZZ_EXPECT(i == 0 || w.rows[i].bytes > w.rows[i - 1].bytes,
                  "sizes not increasing");
    }
    // One test makes a valid table: in the file and back, and priced.
    Calibration cal;
    cal.collectiveTable = w.rows;
    if (!cal.validate().isOk())
      continue; // e.g. a time above the table's 1e9 us
    auto back = parseCalibration(cal.collectiveTableJson(), "fuzz");
    FUZZ_EXPECT(back && back->collectiveTable.size() == w.rows.size(),
                "the collective_table does not survive its round trip");
    const CostModel model(cal);
    CommGroup g;
    g.size = w.ranks;
    g.nodes = w.nodes;
    g.ranksPerNode = w.ranksPerNode;
    for (double b : {0.0, w.rows.front().bytes, w.rows.back().bytes * 3})
      if (auto e = model.measured(w.collective, b, g))
        FUZZ_EXPECT(e->time >= 0 && std::isfinite(e->time),
                    "a measured price that is not finite");
  }
  return 0;
}
