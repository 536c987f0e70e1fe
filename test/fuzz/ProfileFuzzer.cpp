//===- ProfileFuzzer.cpp - Fuzzes the profile reader ---------------------===//
//
// parseProfile (dlopt-calibrate --from-profile FILE): a dlopt-run
// --profile-json document. Whatever parses is also derived from, against a
// GPU and a device without SMs (each refuses the other's backend).
//
//===----------------------------------------------------------------------===//
#include "planner/ProfileCalibration.h"
#include "test/fuzz/FuzzUtil.h"

using namespace dlopt::planner;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto p = parseProfile(dlopt::fuzz::textOf(data, size), "fuzz");
  if (!p) {
    FUZZ_EXPECT(!p.status().message().empty(), "an error without a message");
    return 0;
  }
  for (const char *gpu : {"h100-sxm-80gb", "cpu-device"}) {
    auto c = calibrateFromProfile({*p}, *gpuPreset(gpu));
    if (c) {
      FUZZ_EXPECT(c->calibration.validate().isOk(),
                  "a derived calibration out of its ranges");
      // What dlopt-calibrate writes loads back.
      FUZZ_EXPECT(parseCalibration(c->calibration.toJson(), "written").isOk(),
                  "the derived calibration does not load back");
    }
    else
      FUZZ_EXPECT(!c.status().message().empty(), "an error without a message");
  }
  return 0;
}
