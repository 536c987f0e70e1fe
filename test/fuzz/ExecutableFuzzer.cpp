//===- ExecutableFuzzer.cpp - Fuzzes the plan file reader -----------------===//
//
// deserializeExecutable (header, payload framing, bounded JSON, schema,
// Executable::validate) and, for what it accepts, the --dump listing and a
// serialize/deserialize round trip. A random file rarely passes the payload
// checksum, so the first input byte picks how the rest is framed:
//   0: the rest is a whole plan file, taken as is;
//   1: the rest is a payload (u64 JSON length, JSON, u64 constant length,
//      constants); the header is written around it, checksum included;
//   2: the rest is the JSON document, optionally followed by a NUL byte and
//      the constant data; payload and header are written around it.
// Mode 2 reaches the JSON schema and the validator almost every time.
//
//===----------------------------------------------------------------------===//
#include "runtime/format/Executable.h"
#include "test/fuzz/FuzzUtil.h"

#include <algorithm>
#include <cstring>

using namespace dlopt::rt;

namespace {

void putU32(std::vector<uint8_t> &out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(uint8_t(v >> (8 * i)));
}
void putU64(std::vector<uint8_t> &out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(uint8_t(v >> (8 * i)));
}

/// The header of docs/executable-format.md around `payload`.
std::vector<uint8_t> withHeader(const std::vector<uint8_t> &payload) {
  std::vector<uint8_t> out = {'D', 'L', 'O', 'P', 'T', 'E', 'X', 'E'};
  putU32(out, kExecutableFormatVersion);
  putU32(out, 0);
  putU64(out, payload.size());
  putU64(out, fnv1a64(payload.data(), payload.size()));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<uint8_t> frame(const uint8_t *data, size_t size) {
  if (size == 0)
    return {};
  uint8_t mode = data[0] % 3;
  const uint8_t *rest = data + 1;
  size_t n = size - 1;
  if (mode == 0)
    return std::vector<uint8_t>(rest, rest + n);
  if (mode == 1)
    return withHeader(std::vector<uint8_t>(rest, rest + n));
  const uint8_t *nul = std::find(rest, rest + n, uint8_t(0));
  size_t jsonLen = size_t(nul - rest);
  size_t constLen = nul == rest + n ? 0 : n - jsonLen - 1;
  std::vector<uint8_t> payload;
  putU64(payload, jsonLen);
  payload.insert(payload.end(), rest, rest + jsonLen);
  putU64(payload, constLen);
  if (constLen)
    payload.insert(payload.end(), nul + 1, rest + n);
  return withHeader(payload);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Expected<Executable> exe = deserializeExecutable(frame(data, size));
  if (!exe) {
    FUZZ_EXPECT(!exe.status().message().empty(), "an error without a message");
    return 0;
  }
  FUZZ_EXPECT(exe->validate().isOk(), "the reader accepted an invalid plan");
  (void)dumpExecutable(*exe);
  Expected<std::vector<uint8_t>> bytes = serializeExecutable(*exe);
  FUZZ_EXPECT(bytes.isOk(), "a plan read back cannot be written: " +
                                bytes.status().message());
  Expected<Executable> again = deserializeExecutable(*bytes);
  FUZZ_EXPECT(again.isOk(), "a written plan cannot be read: " +
                                again.status().message());
  FUZZ_EXPECT(*again == *exe, "the round trip changed the plan");
  return 0;
}
