//===- TokenFileFuzzer.cpp - Fuzzes the token file decoder (--data) -------===//
//
// decodeTokenFile: a .npy array of integers (any shape, either order) or raw
// little-endian ids. The first input byte picks the raw dtype (even: u16,
// odd: i32); the rest is the file. Every id returned must be >= 0.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/DataLoader.h"
#include "test/fuzz/FuzzUtil.h"

using namespace dlopt::rt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  TokenDType raw = data[0] & 1 ? TokenDType::I32 : TokenDType::U16;
  Expected<std::vector<int32_t>> ids =
      decodeTokenFile(dlopt::fuzz::bytesOf(data + 1, size - 1), raw);
  if (!ids)
    return 0;
  for (int32_t id : *ids)
    FUZZ_EXPECT(id >= 0, "negative token id " + std::to_string(id));
  return 0;
}
