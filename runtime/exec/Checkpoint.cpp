//===- Checkpoint.cpp - Training checkpoints as safetensors files ---------===//

#include "runtime/exec/Checkpoint.h"
#include "runtime/exec/GlobalTensor.h"
#include "runtime/exec/SafeTensors.h"
#include "runtime/exec/World.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

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

std::string checkpointName(int64_t step, bool sharded) {
  if (!sharded)
    return checkpointFileName(step);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "step-%06lld", (long long)step);
  return buf;
}

namespace {
Status saveSharded(World &w, const std::string &dir,
                   const CheckpointState &state);
Expected<CheckpointState> loadSharded(StepRunner &session,
                                      const std::string &dir);
} // namespace

Status saveCheckpoint(StepRunner &session, const std::string &path,
                      const CheckpointState &state) {
  if (session.shardedCheckpoints())
    return saveSharded(static_cast<World &>(session), path, state);
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

namespace {
Expected<CheckpointState>
parsePosition(const std::map<std::string, std::string> &meta,
              const std::string &where);
} // namespace

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
  return parsePosition(meta, where);
}

namespace {
Expected<CheckpointState>
parsePosition(const std::map<std::string, std::string> &meta,
              const std::string &where) {
  auto get = [&](const char *key) -> std::string {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
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
} // namespace

Expected<CheckpointState> loadCheckpoint(StepRunner &session,
                                         const std::string &path) {
  {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
      return loadSharded(session, path);
  }
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

namespace dlopt::rt {
namespace {

constexpr int kShardedVersion = 2;
constexpr const char *kIndexName = "index.json";

std::string shardFileName(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "rank-%05d.safetensors", rank);
  return buf;
}

/// One distinct block of a checkpointed value and the lowest rank holding
/// it, which writes it.
struct BlockRef {
  int32_t id = -1;
  int writer = -1;
  std::vector<int64_t> start;
};

std::vector<BlockRef> checkpointBlocks(const Executable &exe,
                                       const std::vector<int32_t> &ids) {
  std::vector<BlockRef> out;
  for (int32_t id : ids) {
    const Value &v = exe.values[size_t(id)];
    std::vector<std::vector<int64_t>> seen;
    for (int r = 0; r < exe.worldSize; ++r) {
      int32_t p = exe.programOf(r);
      if (p < 0 || exe.programs[size_t(p)].memory.offsets[size_t(id)] < 0)
        continue;
      std::vector<int64_t> start =
          v.global ? blockStart(exe.mesh, *v.global, v.type, r)
                   : std::vector<int64_t>(v.type.shape.size(), 0);
      if (std::find(seen.begin(), seen.end(), start) != seen.end())
        continue;
      seen.push_back(start);
      out.push_back({id, r, std::move(start)});
    }
  }
  return out;
}

/// Makes a rename in `dir` durable.
void syncDir(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

Status saveSharded(World &w, const std::string &dir,
                   const CheckpointState &state) {
  namespace fs = std::filesystem;
  const Executable &exe = w.executable();
  const std::string where = "writing checkpoint " + dir + ": ";
  DLOPT_RETURN_IF_ERROR(w.initializeParams().withContext(where));
  const std::string tmp = dir + ".tmp";
  // The first process makes an empty staging directory (a killed writer's
  // is removed); the others wait for it.
  Status made = Status::ok();
  if (w.processIndex() == 0) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec)
      made = Status::error(where + "cannot create " + tmp + ": " +
                           ec.message());
  }
  DLOPT_RETURN_IF_ERROR(w.agreeAcrossProcesses(made));

  const std::vector<BlockRef> blocks =
      checkpointBlocks(exe, w.checkpointedValues());
  const std::string fingerprint = modelFingerprint(exe);
  // This process's ranks write their blocks, one file per rank.
  std::string sizes; // "FILE BYTES\n" per file written here
  Status wrote = Status::ok();
  for (int r = w.firstRank(); wrote && r < w.firstRank() + w.numLocal(); ++r) {
    std::vector<NamedTensor> tensors;
    for (const BlockRef &b : blocks) {
      if (b.writer != r)
        continue;
      const std::string &name = exe.values[size_t(b.id)].name;
      Expected<HostTensor> t = w.session(r).readArgument(name);
      if (!t) {
        wrote = t.status().withContext(where + "'" + name + "': ");
        break;
      }
      tensors.push_back({name, t.take()});
    }
    if (!wrote || tensors.empty())
      continue;
    std::map<std::string, std::string> meta = {
        {"format", "dlopt-checkpoint-shard"},
        {"rank", std::to_string(r)},
        {"fingerprint", fingerprint}};
    Expected<std::vector<uint8_t>> bytes = encodeSafeTensors(tensors, meta);
    if (!bytes) {
      wrote = bytes.status().withContext(where);
      break;
    }
    const std::string file = shardFileName(r);
    wrote = writeFileAtomic((fs::path(tmp) / file).string(), *bytes)
                .withContext(where);
    sizes += file + " " + std::to_string(bytes->size()) + "\n";
  }
  DLOPT_RETURN_IF_ERROR(w.agreeAcrossProcesses(wrote));
  Expected<std::vector<std::vector<uint8_t>>> all = w.allGatherBytes(
      std::vector<uint8_t>(sizes.begin(), sizes.end()), "shard sizes");
  if (!all)
    return all.status().withContext(where);

  // The first process writes the index and renames the directory into place.
  Status done = Status::ok();
  if (w.processIndex() == 0) {
    Json files = Json::object();
    for (const std::vector<uint8_t> &b : *all) {
      std::string text(b.begin(), b.end());
      size_t at = 0;
      for (size_t nl; (nl = text.find('\n', at)) != std::string::npos;
           at = nl + 1) {
        std::string line = text.substr(at, nl - at);
        size_t sp = line.rfind(' ');
        files[line.substr(0, sp)] = {
            {"bytes", std::stoll(line.substr(sp + 1))}};
      }
    }
    Json tensors = Json::object();
    for (int32_t id : w.checkpointedValues()) {
      const Value &v = exe.values[size_t(id)];
      const TensorType &type = argumentType(exe, id);
      Json list = Json::array();
      for (const BlockRef &b : blocks)
        if (b.id == id)
          list.push_back({{"file", shardFileName(b.writer)},
                          {"start", b.start},
                          {"shape", v.type.shape}});
      tensors[v.name] = {{"role", valueKindName(v.kind)},
                         {"dtype", dtypeName(type.dtype)},
                         {"shape", type.shape},
                         {"blocks", std::move(list)}};
    }
    Json mesh = {{"axes", exe.mesh.axes}, {"shape", exe.mesh.shape}};
    Json index = {{"format", kFormat},
                  {"version", kShardedVersion},
                  {"model", exe.modelName},
                  {"fingerprint", fingerprint},
                  {"step", std::to_string(state.step)},
                  {"data_position", std::to_string(state.dataPosition)},
                  {"data_epoch", std::to_string(state.dataEpoch)},
                  {"data_source", state.dataSource},
                  {"rng", kRng},
                  {"rng_seed", std::to_string(state.rngSeed)},
                  {"world_size", exe.worldSize},
                  {"mesh", std::move(mesh)},
                  {"files", std::move(files)},
                  {"tensors", std::move(tensors)}};
    std::string text;
    try {
      text = index.dump(1) + "\n";
    } catch (const std::exception &e) {
      done = Status::error(where + e.what());
    }
    if (done)
      done = writeFileAtomic((fs::path(tmp) / kIndexName).string(),
                             std::vector<uint8_t>(text.begin(), text.end()))
                 .withContext(where);
    if (done) {
      // Replace an older checkpoint of the same step: moved aside first, so
      // a crash leaves one of the two complete.
      std::error_code ec;
      const std::string old = dir + ".old";
      fs::remove_all(old, ec);
      bool hadOld = fs::exists(dir, ec);
      if (hadOld)
        fs::rename(dir, old, ec);
      if (!ec)
        fs::rename(tmp, dir, ec);
      if (ec)
        done = Status::error(where + "cannot move " + tmp + " into place: " +
                             ec.message());
      syncDir(fs::path(dir).parent_path().empty()
                  ? "."
                  : fs::path(dir).parent_path().string());
      if (done && hadOld)
        fs::remove_all(old, ec);
    }
  }
  return w.agreeAcrossProcesses(done);
}

/// What loading found wrong; becomes the Status.
struct LoadError {
  std::string message;
};

Expected<CheckpointState> loadSharded(StepRunner &session,
                                      const std::string &dir) {
  namespace fs = std::filesystem;
  const Executable &exe = session.executable();
  const std::string where = "checkpoint " + dir + ": ";
  const std::string indexPath = (fs::path(dir) / kIndexName).string();
  std::error_code ec;
  if (!fs::is_regular_file(indexPath, ec))
    return Status::error(where + "no " + kIndexName +
                         " (not a sharded checkpoint, or one whose writing "
                         "never finished)");
  uintmax_t indexBytes = fs::file_size(indexPath, ec);
  if (ec || indexBytes > (uintmax_t(1) << 30))
    return Status::error(where + kIndexName + " is unreadable or larger "
                         "than 1 GiB");
  std::string text;
  {
    std::ifstream in(indexPath, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), {});
    if (!in.good() && !in.eof())
      return Status::error(where + "cannot read " + kIndexName);
  }
  Json index;
  try {
    index = Json::parse(text);
  } catch (const std::exception &e) {
    return Status::error(where + kIndexName + " is not valid JSON: " +
                         e.what());
  }
  std::map<std::string, NamedTensor> assembled;
  CheckpointState state;
  try {
    auto str = [&](const char *key) -> std::string {
      if (!index.contains(key) || !index[key].is_string())
        throw LoadError{std::string(kIndexName) + ": '" + key +
                        "' is missing or not a string"};
      return index[key].get<std::string>();
    };
    if (!index.is_object() || str("format") != kFormat)
      throw LoadError{std::string(kIndexName) + ": not a dlopt checkpoint "
                      "index (format is not '" + kFormat + "')"};
    if (!index.contains("version") || index["version"] != kShardedVersion)
      throw LoadError{std::string(kIndexName) + ": version " +
                      (index.contains("version") ? index["version"].dump()
                                                 : std::string("missing")) +
                      ", this dlopt reads sharded checkpoints of version " +
                      std::to_string(kShardedVersion)};
    std::map<std::string, std::string> meta;
    for (const char *k : {"step", "data_position", "data_epoch", "rng_seed",
                          "rng", "data_source"})
      meta[k] = str(k);
    Expected<CheckpointState> pos = parsePosition(meta, "");
    if (!pos)
      throw LoadError{std::string(kIndexName) + ": " + pos.status().message()};
    state = *pos;
    std::string otherModel = "does not match this model (saved from '" +
                             str("model") + "'): ";

    // Every param and state, with its global type, and nothing else.
    const Json &tensors = index.at("tensors");
    if (!tensors.is_object())
      throw LoadError{std::string(kIndexName) + ": 'tensors' is not an object"};
    std::vector<int32_t> ids = session.checkpointedValues();
    std::set<std::string> names;
    for (int32_t id : ids) {
      const Value &v = exe.values[size_t(id)];
      const TensorType &type = argumentType(exe, id);
      names.insert(v.name);
      if (!tensors.contains(v.name))
        throw LoadError{otherModel + valueKindName(v.kind) + " '" + v.name +
                        "' (" + type.str() + ") is missing"};
      const Json &t = tensors[v.name];
      TensorType saved;
      std::optional<DType> dt = parseDType(t.at("dtype").get<std::string>());
      if (!dt)
        throw LoadError{"'" + v.name + "': unknown dtype " +
                        t.at("dtype").dump()};
      saved.dtype = *dt;
      saved.shape = t.at("shape").get<std::vector<int64_t>>();
      if (!(saved == type) ||
          t.at("role").get<std::string>() != valueKindName(v.kind))
        throw LoadError{otherModel + valueKindName(v.kind) + " '" + v.name +
                        "': expected " + type.str() + ", got " +
                        t.at("role").get<std::string>() + " " + saved.str()};
    }
    for (auto it = tensors.begin(); it != tensors.end(); ++it)
      if (!names.count(it.key()))
        throw LoadError{otherModel + "tensor '" + it.key() +
                        "' is not a param or state of this model"};
    std::string fp = modelFingerprint(exe);
    if (str("fingerprint") != fp)
      throw LoadError{otherModel + "model fingerprint " + str("fingerprint") +
                      ", expected " + fp + " (the same tensors, but params "
                      "and states differ in role or order)"};

    // Every shard present and complete before any is read.
    const Json &files = index.at("files");
    std::map<std::string, SafeTensorsFile> shards;
    for (auto it = files.begin(); it != files.end(); ++it) {
      const std::string &name = it.key();
      if (name.find('/') != std::string::npos || name == ".." || name == ".")
        throw LoadError{std::string(kIndexName) + ": shard name '" + name +
                        "' is not a file name"};
      const std::string path = (fs::path(dir) / name).string();
      std::error_code fe;
      uintmax_t bytes = fs::file_size(path, fe);
      if (fe)
        throw LoadError{"shard " + name + " is missing"};
      uintmax_t want = it.value().at("bytes").get<uintmax_t>();
      if (bytes != want)
        throw LoadError{"shard " + name + " has " + std::to_string(bytes) +
                        " bytes, the index says " + std::to_string(want) +
                        " (partial or corrupt)"};
    }
    for (auto it = files.begin(); it != files.end(); ++it) {
      Expected<SafeTensorsFile> f =
          readSafeTensors((fs::path(dir) / it.key()).string());
      if (!f)
        throw LoadError{f.status().message()};
      if (f->metadata["fingerprint"] != fp)
        throw LoadError{"shard " + it.key() + " belongs to another model "
                        "(fingerprint " + f->metadata["fingerprint"] + ")"};
      shards.emplace(it.key(), f.take());
    }

    // Put each tensor together from its blocks, which must tile it.
    for (int32_t id : ids) {
      const Value &v = exe.values[size_t(id)];
      const TensorType &type = argumentType(exe, id);
      HostTensor global(type);
      const size_t rank = type.shape.size();
      const int64_t es = dtypeSize(type.dtype);
      std::set<std::vector<int64_t>> starts;
      std::vector<int64_t> blockShape;
      int64_t covered = 0;
      for (const Json &b : tensors[v.name].at("blocks")) {
        std::string file = b.at("file").get<std::string>();
        auto sh = shards.find(file);
        if (sh == shards.end())
          throw LoadError{"'" + v.name + "': block in " + file +
                          ", which the index does not list"};
        std::vector<int64_t> start = b.at("start").get<std::vector<int64_t>>();
        std::vector<int64_t> shape = b.at("shape").get<std::vector<int64_t>>();
        const HostTensor *part = sh->second.find(v.name);
        if (!part)
          throw LoadError{"shard " + file + " lacks its block of '" + v.name +
                          "'"};
        bool ok = start.size() == rank && shape.size() == rank &&
                  part->type.shape == shape && part->type.dtype == type.dtype &&
                  (blockShape.empty() || blockShape == shape);
        for (size_t d = 0; ok && d < rank; ++d)
          ok = shape[d] > 0 && start[d] >= 0 && start[d] % shape[d] == 0 &&
               start[d] + shape[d] <= type.shape[d];
        if (!ok || !starts.insert(start).second)
          throw LoadError{"'" + v.name + "': the block at [" +
                          Json(start).dump() + "] in " + file +
                          " does not fit the " + type.str() + " tensor"};
        blockShape = shape;
        covered += part->numElements();
        // Rows along the last dim are contiguous in both.
        const int64_t row = rank ? shape[rank - 1] : 1;
        const int64_t rows = rank ? part->numElements() / std::max<int64_t>(row, 1) : 1;
        std::vector<int64_t> idx(rank, 0);
        for (int64_t k = 0; k < rows; ++k) {
          int64_t off = 0;
          for (size_t d = 0; d < rank; ++d)
            off = off * type.shape[d] + start[d] + idx[d];
          std::memcpy(global.bytes.data() + off * es,
                      part->bytes.data() + k * row * es, size_t(row * es));
          for (int d = int(rank) - 2; d >= 0; --d) {
            if (++idx[size_t(d)] < shape[size_t(d)])
              break;
            idx[size_t(d)] = 0;
          }
        }
      }
      if (covered != type.numElements())
        throw LoadError{"'" + v.name + "': its blocks cover " +
                        std::to_string(covered) + " of its " +
                        std::to_string(type.numElements()) + " elements"};
      assembled[v.name] = {v.name, std::move(global)};
    }
  } catch (const LoadError &e) {
    return Status::error(where + e.message);
  } catch (const std::exception &e) {
    return Status::error(where + kIndexName + " is malformed: " + e.what());
  }
  // Everything checked: now bind.
  for (auto &[name, t] : assembled)
    DLOPT_RETURN_IF_ERROR(session.bind(name, t.tensor, dir));
  return state;
}

} // namespace
} // namespace dlopt::rt
