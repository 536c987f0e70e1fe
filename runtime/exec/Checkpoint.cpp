//===- Checkpoint.cpp - Training checkpoints as safetensors files ---------===//

#include "runtime/exec/Checkpoint.h"
#include "runtime/exec/SafeTensors.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>

namespace dlopt::rt {

namespace {

using Json = nlohmann::ordered_json;

constexpr const char *kFormat = "dlopt-checkpoint";
constexpr const char *kRng = "dlopt-counter-v1";

std::optional<uint64_t> parseU64(const std::string &s) {
  if (s.empty() || s.size() > 20 ||
      s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    uint64_t d = uint64_t(c - '0');
    if (v > (UINT64_MAX - d) / 10)
      return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

} // namespace

std::string modelFingerprint(const Executable &exe) {
  std::string text;
  for (const auto *list : {&exe.params, &exe.states})
    for (int32_t id : *list) {
      // Global types: a checkpoint of a multi-rank step holds global
      // tensors and loads into any layout of the same model.
      const Value &v = exe.values[id];
      text += std::string(valueKindName(v.kind)) + " " + v.name + " " +
              argumentType(exe, id).str() + "\n";
    }
  uint64_t h = fnv1a64(reinterpret_cast<const uint8_t *>(text.data()),
                       text.size());
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx", (unsigned long long)h);
  return buf;
}

std::string checkpointFileName(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "step-%06lld.safetensors", (long long)step);
  return buf;
}

Status saveCheckpoint(StepRunner &session, const std::string &path,
                      const CheckpointState &state) {
  const Executable &exe = session.executable();
  DLOPT_RETURN_IF_ERROR(session.initializeParams().withContext(
      "writing checkpoint " + path + ": "));
  std::vector<NamedTensor> tensors;
  Json table = Json::object();
  for (int32_t id : session.checkpointedValues()) {
    Expected<HostTensor> t = session.readArgument(exe.values[id].name);
    if (!t)
      return t.status().withContext("writing checkpoint " + path + ": '" +
                                    exe.values[id].name + "': ");
    tensors.push_back({exe.values[id].name, t.take()});
    Json entry = Json::object();
    entry["role"] = valueKindName(exe.values[id].kind);
    entry["sharding"] = "replicated";
    table[exe.values[id].name] = std::move(entry);
  }
  std::map<std::string, std::string> meta;
  meta["format"] = kFormat;
  meta["version"] = std::to_string(kCheckpointVersion);
  meta["model"] = exe.modelName;
  meta["fingerprint"] = modelFingerprint(exe);
  meta["step"] = std::to_string(state.step);
  meta["data_position"] = std::to_string(state.dataPosition);
  meta["data_epoch"] = std::to_string(state.dataEpoch);
  meta["data_source"] = state.dataSource;
  meta["rng"] = kRng;
  meta["rng_seed"] = std::to_string(state.rngSeed);
  // Global tensors (a multi-rank step's are gathered from its ranks), in
  // one file; sharded checkpoints written per rank come with MPI execution.
  meta["world_size"] = "1";
  meta["rank"] = std::to_string(session.checkpointRank());
  try {
    meta["tensors"] = table.dump();
  } catch (const std::exception &e) {
    return Status::error("writing checkpoint " + path + ": " + e.what());
  }
  Expected<std::vector<uint8_t>> bytes = encodeSafeTensors(tensors, meta);
  if (!bytes)
    return bytes.status().withContext("writing checkpoint " + path + ": ");
  return writeFileAtomic(path, *bytes).withContext("writing checkpoint: ");
}

Expected<CheckpointState>
parseCheckpointMetadata(const std::map<std::string, std::string> &meta,
                        const std::string &where) {
  auto get = [&](const char *key) -> std::string {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  if (get("format") != kFormat)
    return Status::error(where + "not a dlopt checkpoint (metadata format is '" +
                         get("format") + "', expected '" + kFormat + "')");
  if (get("version") != std::to_string(kCheckpointVersion))
    return Status::error(where + "checkpoint version '" + get("version") +
                         "', this dlopt reads version " +
                         std::to_string(kCheckpointVersion));
  if (get("world_size") != "1")
    return Status::error(where + "saved with world size '" +
                         get("world_size") +
                         "'; only world size 1 (replicated) checkpoints can "
                         "be loaded");

  CheckpointState state;
  struct Field {
    const char *key;
    uint64_t *out;
  };
  uint64_t step = 0;
  for (Field f : {Field{"step", &step}, Field{"data_position", &state.dataPosition},
                  Field{"data_epoch", &state.dataEpoch},
                  Field{"rng_seed", &state.rngSeed}}) {
    std::optional<uint64_t> v = parseU64(get(f.key));
    if (!v)
      return Status::error(where + "metadata '" + f.key +
                           "' must be a non-negative integer, got '" +
                           get(f.key) + "'");
    if (f.out == &step && *v > uint64_t(kMaxTrainingStep))
      return Status::error(where + "metadata 'step' is " + get(f.key) +
                           ", more than the largest step count " +
                           std::to_string(kMaxTrainingStep) + " (2^53)");
    *f.out = *v;
  }
  state.step = int64_t(step);
  if (get("rng") != kRng)
    return Status::error(where + "unknown data generator '" + get("rng") +
                         "' (expected '" + kRng + "')");
  state.dataSource = get("data_source");
  return state;
}

Expected<CheckpointState> loadCheckpoint(StepRunner &session,
                                         const std::string &path) {
  const Executable &exe = session.executable();
  Expected<SafeTensorsFile> file = readSafeTensors(path);
  if (!file)
    return file.status().withContext("checkpoint ");
  std::string where = "checkpoint " + path + ": ";
  const auto &meta = file->metadata;
  auto get = [&](const char *key) -> std::string {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  Expected<CheckpointState> state = parseCheckpointMetadata(meta, where);
  if (!state)
    return state.status();

  // Every tensor of the model, with its exact type, and nothing else.
  std::string otherModel = where + "does not match this model (saved from '" +
                           get("model") + "'): ";
  std::vector<int32_t> ids = session.checkpointedValues();
  std::map<std::string, int32_t> byName;
  for (int32_t id : ids) {
    const Value &v = exe.values[id];
    const TensorType &type = argumentType(exe, id);
    byName[v.name] = id;
    const HostTensor *t = file->find(v.name);
    if (!t)
      return Status::error(otherModel + valueKindName(v.kind) + " '" + v.name +
                           "' (" + type.str() + ") is missing");
    if (!(t->type == type))
      return Status::error(otherModel + valueKindName(v.kind) + " '" + v.name +
                           "': expected " + type.str() + ", got " +
                           t->type.str());
  }
  for (const NamedTensor &t : file->tensors)
    if (!byName.count(t.name))
      return Status::error(otherModel + "tensor '" + t.name + "' (" +
                           t.tensor.type.str() +
                           ") is not a param or state of this model");
  std::string fp = modelFingerprint(exe);
  if (get("fingerprint") != fp)
    return Status::error(otherModel + "model fingerprint " +
                         get("fingerprint") + ", expected " + fp +
                         " (the same tensors, but params and states differ "
                         "in role or order)");

  // Everything checked: now bind. bind() can only fail on a type mismatch,
  // which was ruled out above.
  for (const NamedTensor &t : file->tensors)
    DLOPT_RETURN_IF_ERROR(session.bind(t.name, t.tensor, path));
  return state;
}

} // namespace dlopt::rt
