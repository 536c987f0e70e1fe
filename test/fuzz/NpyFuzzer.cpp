//===- NpyFuzzer.cpp - Fuzzes the .npy reader -----------------------------===//
//
// parseNpyHeader (any dtype: token files use it) and parseNpy; an accepted
// array must hold exactly its shape's bytes and survive encodeNpy/parseNpy.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/Npy.h"
#include "test/fuzz/FuzzUtil.h"

using namespace dlopt::rt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::vector<uint8_t> bytes = dlopt::fuzz::bytesOf(data, size);
  Expected<NpyHeader> header = parseNpyHeader(bytes);
  if (header) {
    FUZZ_EXPECT(header->dataOffset <= bytes.size(), "header past the end");
    int64_t n = 1;
    for (int64_t d : header->shape)
      n *= d;
    FUZZ_EXPECT(n == header->numElements, "element count of the shape");
  }
  Expected<HostTensor> t = parseNpy(bytes);
  if (!t)
    return 0;
  FUZZ_EXPECT(header.isOk(), "parseNpy accepted what parseNpyHeader refused");
  FUZZ_EXPECT(int64_t(t->bytes.size()) == t->type.byteSize(),
              "tensor bytes do not match " + t->type.str());
  Expected<HostTensor> again = parseNpy(encodeNpy(*t));
  FUZZ_EXPECT(again.isOk(), "an encoded array cannot be read: " +
                                again.status().message());
  FUZZ_EXPECT(again->type == t->type && again->bytes == t->bytes,
              "the round trip changed " + t->type.str());
  return 0;
}
