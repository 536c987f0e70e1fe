//===- PlanFileFuzzer.cpp - Fuzzes the plan JSON reader (--plan) ----------===//
//
// Plan::parse: transformer and op-level plans (version 3) as written by
// `dlopt-compile --dry-run --format json`. An accepted plan must write back
// to JSON that reads again.
//
//===----------------------------------------------------------------------===//
#include "planner/Plan.h"
#include "test/fuzz/FuzzUtil.h"

using namespace dlopt::planner;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto plan = Plan::parse(dlopt::fuzz::textOf(data, size), "fuzz");
  if (!plan) {
    FUZZ_EXPECT(!plan.status().message().empty(), "an error without a message");
    return 0;
  }
  auto again = Plan::parse(plan->toJson(), "fuzz (written back)");
  FUZZ_EXPECT(again.isOk(), "an accepted plan does not read back");
  return 0;
}
