//===- FixFuzzer.cpp - Fuzzes the --fix grammar ---------------------------===//
//
// parseFix ("tp=8,pp=2,schedule=1f1b,..."); what it accepts, FixSpec::str
// must spell so that it parses back to the same spec.
//
//===----------------------------------------------------------------------===//
#include "planner/Search.h"
#include "test/fuzz/FuzzUtil.h"

using namespace dlopt::planner;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto fix = parseFix(dlopt::fuzz::textOf(data, size));
  if (!fix)
    return 0;
  std::string text = fix->str();
  auto again = parseFix(text);
  FUZZ_EXPECT(again.isOk(), "'" + text + "' does not parse: " +
                                again.status().message());
  FUZZ_EXPECT(again->str() == text, "'" + text + "' reads back as '" +
                                        again->str() + "'");
  return 0;
}
