//===- FuzzUtil.h - Shared helpers of the libFuzzer targets ---------------===//
//
// A reader may refuse any input with a message; it must never crash, hang or
// read out of bounds (the sanitizers see to that). What a reader accepts must
// also survive a round trip through the matching writer: FUZZ_EXPECT turns a
// broken property into a crash that libFuzzer reports with its input.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#define FUZZ_EXPECT(cond, msg)                                                 \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "%s:%d: property failed: %s: %s\n", __FILE__,       \
                   __LINE__, #cond, std::string(msg).c_str());                 \
      std::abort();                                                            \
    }                                                                          \
  } while (0)

namespace dlopt::fuzz {

inline std::vector<uint8_t> bytesOf(const uint8_t *data, size_t size) {
  return std::vector<uint8_t>(data, data + size);
}

inline std::string_view textOf(const uint8_t *data, size_t size) {
  return std::string_view(reinterpret_cast<const char *>(data), size);
}

} // namespace dlopt::fuzz
