//===- CheckpointFuzzer.cpp - Fuzzes the checkpoint metadata reader -------===//
//
// A checkpoint is a safetensors file whose metadata holds the training
// loop's position; --resume reads it with parseSafeTensors, then
// parseCheckpointMetadata (the model-dependent tensor checks need a
// Session and are not fuzzed here). Seeds are real checkpoints.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/Checkpoint.h"
#include "runtime/exec/SafeTensors.h"
#include "test/fuzz/FuzzUtil.h"

using namespace dlopt::rt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Expected<SafeTensorsFile> file =
      parseSafeTensors(dlopt::fuzz::bytesOf(data, size));
  if (!file)
    return 0;
  Expected<CheckpointState> state =
      parseCheckpointMetadata(file->metadata, "fuzz: ");
  if (!state)
    return 0;
  FUZZ_EXPECT(state->step >= 0 && state->step <= kMaxTrainingStep,
              "step " + std::to_string(state->step));
  auto source = file->metadata.find("data_source");
  FUZZ_EXPECT(state->dataSource == (source == file->metadata.end()
                                        ? std::string()
                                        : source->second),
              "data source");
  return 0;
}
