//===- CalibrationFuzzer.cpp - Fuzzes the calibration reader --------------===//
//
// parseCalibration (--calibration FILE): a JSON object of cost-model
// constants over the defaults.
//
//===----------------------------------------------------------------------===//
#include "planner/Calibration.h"
#include "test/fuzz/FuzzUtil.h"

using namespace dlopt::planner;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto cal = parseCalibration(dlopt::fuzz::textOf(data, size), "fuzz");
  if (!cal)
    FUZZ_EXPECT(!cal.status().message().empty(), "an error without a message");
  return 0;
}
