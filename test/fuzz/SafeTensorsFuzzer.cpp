//===- SafeTensorsFuzzer.cpp - Fuzzes the safetensors reader --------------===//
//
// parseSafeTensors (header length, bounded JSON, tensor table, data tiling);
// an accepted file must survive encodeSafeTensors/parseSafeTensors.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/SafeTensors.h"
#include "test/fuzz/FuzzUtil.h"

#include <set>

using namespace dlopt::rt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Expected<SafeTensorsFile> file =
      parseSafeTensors(dlopt::fuzz::bytesOf(data, size));
  if (!file)
    return 0;
  std::set<std::string> names;
  for (const NamedTensor &t : file->tensors) {
    FUZZ_EXPECT(names.insert(t.name).second, "tensor '" + t.name + "' twice");
    FUZZ_EXPECT(int64_t(t.tensor.bytes.size()) == t.tensor.type.byteSize(),
                "tensor '" + t.name + "' bytes do not match its type");
  }
  Expected<std::vector<uint8_t>> bytes =
      encodeSafeTensors(file->tensors, file->metadata);
  FUZZ_EXPECT(bytes.isOk(), "an accepted file cannot be written: " +
                                bytes.status().message());
  Expected<SafeTensorsFile> again = parseSafeTensors(*bytes);
  FUZZ_EXPECT(again.isOk(), "a written file cannot be read: " +
                                again.status().message());
  FUZZ_EXPECT(again->metadata == file->metadata, "metadata changed");
  FUZZ_EXPECT(again->tensors.size() == file->tensors.size(), "tensor count");
  for (size_t i = 0; i < file->tensors.size(); ++i) {
    const NamedTensor &a = file->tensors[i], &b = again->tensors[i];
    FUZZ_EXPECT(a.name == b.name && a.tensor.type == b.tensor.type &&
                    a.tensor.bytes == b.tensor.bytes,
                "tensor '" + a.name + "' changed");
  }
  return 0;
}
