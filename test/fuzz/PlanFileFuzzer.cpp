//===- PlanFileFuzzer.cpp - Fuzzes the plan JSON reader (--plan) ----------===//
//
// parsePlanFile: transformer (version 2) and op-level (version 1) plans as
// written by `dlopt-compile --dry-run --format json`.
//
//===----------------------------------------------------------------------===//
#include "planner/PlanFile.h"
#include "test/fuzz/FuzzUtil.h"

using namespace dlopt::planner;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto plan = parsePlanFile(dlopt::fuzz::textOf(data, size), "fuzz");
  if (!plan)
    FUZZ_EXPECT(!plan.status().message().empty(), "an error without a message");
  return 0;
}
