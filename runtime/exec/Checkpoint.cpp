//===- Checkpoint.cpp - Training checkpoints as safetensors files ---------===//

#include "runtime/exec/Checkpoint.h"
#include "runtime/exec/GlobalTensor.h"
#include "runtime/exec/SafeTensors.h"
#include "runtime/exec/World.h"
#include "runtime/support/JsonLimits.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <thread>

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

/// One distinct block of a checkpointed value and the rank that writes it.
struct BlockRef {
  int32_t id = -1;
  int writer = -1;
  std::vector<int64_t> start;
};

/// The distinct blocks of `ids`, each written once. A block held by
/// several ranks (a data-parallel replica, a replicated value) is written
/// by the holder with the fewest bytes to write so far, taking blocks from
/// the largest down, so the ranks' files come out about the same size and
/// their writes overlap instead of queueing on the lowest rank. Every
/// process computes the same assignment.
std::vector<BlockRef> checkpointBlocks(const Executable &exe,
                                       const std::vector<int32_t> &ids) {
  std::vector<BlockRef> out;
  std::vector<std::vector<int>> holders;
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
      auto it = std::find(seen.begin(), seen.end(), start);
      if (it != seen.end()) {
        holders[out.size() - seen.size() + size_t(it - seen.begin())]
            .push_back(r);
        continue;
      }
      seen.push_back(start);
      out.push_back({id, r, std::move(start)});
      holders.push_back({r});
    }
  }
  std::vector<size_t> order(out.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  auto bytes = [&](size_t i) {
    return exe.values[size_t(out[i].id)].type.byteSize();
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return bytes(a) > bytes(b); });
  std::vector<int64_t> load(size_t(exe.worldSize), 0);
  for (size_t i : order) {
    int best = holders[i][0];
    for (int r : holders[i])
      if (load[size_t(r)] < load[size_t(best)])
        best = r;
    out[i].writer = best;
    load[size_t(best)] += bytes(i);
  }
  return out;
}

/// Runs fn(0), ..., fn(n - 1) at once: fn(0) on this thread, the others on
/// threads of their own.
void onThreads(int n, const std::function<void(int)> &fn) {
  std::vector<std::thread> threads;
  for (int i = 1; i < n; ++i)
    threads.emplace_back(fn, i);
  if (n > 0)
    fn(0);
  for (std::thread &t : threads)
    t.join();
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
    // Staging directories of killed writers (step-N.tmp, step-N.old) are as
    // large as a checkpoint and nothing else would remove them.
    fs::path parent = fs::path(dir).parent_path();
    if (parent.empty())
      parent = ".";
    for (const auto &e : fs::directory_iterator(parent, ec)) {
      const std::string name = e.path().filename().string();
      auto ends = [&](const std::string &suffix) {
        return name.size() > suffix.size() &&
               name.compare(name.size() - suffix.size(), suffix.size(),
                            suffix) == 0;
      };
      std::error_code ec2;
      if (name.rfind("step-", 0) == 0 && (ends(".tmp") || ends(".old")) &&
          e.is_directory(ec2))
        fs::remove_all(e.path(), ec2);
    }
    ec.clear();
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
  // This process's ranks write their blocks, one file per rank, each rank
  // on its own thread (the writes and their fsyncs overlap).
  const int local = w.numLocal();
  std::vector<Status> results(size_t(local), Status::ok());
  std::vector<uint64_t> fileBytes(size_t(local), 0);
  auto writeRank = [&](int i) {
    const int r = w.firstRank() + i;
    std::vector<TensorView> views;
    std::vector<std::unique_ptr<HostTensor>> copies;
    for (const BlockRef &b : blocks) {
      if (b.writer != r)
        continue;
      const Value &v = exe.values[size_t(b.id)];
      // Written straight from the rank's memory where the host can read
      // it (the CPU backend), else from a copy.
      if (const void *p = w.session(r).valueView(b.id)) {
        views.push_back({v.name, v.type, p});
        continue;
      }
      Expected<HostTensor> t = w.session(r).readArgument(v.name);
      if (!t) {
        results[size_t(i)] =
            t.status().withContext(where + "'" + v.name + "': ");
        return;
      }
      copies.push_back(std::make_unique<HostTensor>(t.take()));
      views.push_back({v.name, v.type, copies.back()->bytes.data()});
    }
    if (views.empty())
      return;
    std::map<std::string, std::string> meta = {
        {"format", "dlopt-checkpoint-shard"},
        {"rank", std::to_string(r)},
        {"fingerprint", fingerprint}};
    results[size_t(i)] =
        writeSafeTensorsAtomic((fs::path(tmp) / shardFileName(r)).string(),
                               views, meta, &fileBytes[size_t(i)])
            .withContext(where);
  };
  onThreads(local, writeRank);
  Status wrote = Status::ok();
  std::string sizes; // "FILE BYTES\n" per file written here
  for (int i = 0; i < local; ++i) {
    if (!results[size_t(i)] && wrote)
      wrote = results[size_t(i)];
    if (fileBytes[size_t(i)])
      sizes += shardFileName(w.firstRank() + i) + " " +
               std::to_string(fileBytes[size_t(i)]) + "\n";
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
    Expected<Json> parsed =
        parseJsonBounded<Json>(text.data(), text.data() + text.size());
    if (!parsed)
      return Status::error(where + kIndexName + " is not valid JSON: " +
                           parsed.status().message());
    index = parsed.take();
  } catch (const std::exception &e) {
    return Status::error(where + kIndexName + " is not valid JSON: " +
                         e.what());
  }
  // What this process binds: per (rank here, value) its block, filled from
  // the saved blocks it overlaps (a Session's "block" is the whole tensor).
  struct Target {
    int rank = -1; ///< of a World; -1: the Session itself
    int32_t id = -1;
    std::vector<int64_t> start;
    HostTensor data;      ///< the block, unless read in place
    void *direct = nullptr; ///< the rank's memory, read straight into
  };
  std::vector<Target> targets;
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

    // Every shard present and complete, and its table readable, before
    // any data is read.
    const Json &files = index.at("files");
    std::map<std::string, SafeTensorsTable> tables;
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
      Expected<SafeTensorsTable> table = readSafeTensorsTable(path);
      if (!table)
        throw LoadError{table.status().message()};
      if (table->metadata["fingerprint"] != fp)
        throw LoadError{"shard " + name + " belongs to another model "
                        "(fingerprint " + table->metadata["fingerprint"] + ")"};
      tables.emplace(name, table.take());
    }

    // The blocks of each tensor must tile it: each in its file with the
    // right type, within the tensor, on the grid of its shape, distinct,
    // covering every element.
    struct Saved {
      std::string file;
      const SafeTensorsTable::Entry *entry = nullptr;
      std::vector<int64_t> start, shape;
    };
    std::map<int32_t, std::vector<Saved>> saved;
    for (int32_t id : ids) {
      const Value &v = exe.values[size_t(id)];
      const TensorType &type = argumentType(exe, id);
      const size_t rank = type.shape.size();
      std::set<std::vector<int64_t>> starts;
      std::vector<int64_t> blockShape;
      int64_t covered = 0;
      for (const Json &b : tensors[v.name].at("blocks")) {
        Saved sv;
        sv.file = b.at("file").get<std::string>();
        sv.start = b.at("start").get<std::vector<int64_t>>();
        sv.shape = b.at("shape").get<std::vector<int64_t>>();
        auto tb = tables.find(sv.file);
        if (tb == tables.end())
          throw LoadError{"'" + v.name + "': block in " + sv.file +
                          ", which the index does not list"};
        sv.entry = tb->second.find(v.name);
        if (!sv.entry)
          throw LoadError{"shard " + sv.file + " lacks its block of '" +
                          v.name + "'"};
        bool ok = sv.start.size() == rank && sv.shape.size() == rank &&
                  sv.entry->type.shape == sv.shape &&
                  sv.entry->type.dtype == type.dtype &&
                  (blockShape.empty() || blockShape == sv.shape);
        for (size_t d = 0; ok && d < rank; ++d)
          ok = sv.shape[d] > 0 && sv.start[d] >= 0 &&
               sv.start[d] % sv.shape[d] == 0 &&
               sv.start[d] + sv.shape[d] <= type.shape[d];
        if (!ok || !starts.insert(sv.start).second)
          throw LoadError{"'" + v.name + "': the block at " +
                          Json(sv.start).dump() + " in " + sv.file +
                          " does not fit the " + type.str() + " tensor"};
        blockShape = sv.shape;
        covered += sv.entry->type.numElements();
        saved[id].push_back(std::move(sv));
      }
      if (covered != type.numElements())
        throw LoadError{"'" + v.name + "': its blocks cover " +
                        std::to_string(covered) + " of its " +
                        std::to_string(type.numElements()) + " elements"};
    }

    // This process's blocks, filled from the saved blocks they overlap; a
    // saved block is read only if some block here needs it.
    World *world = session.shardedCheckpoints()
                       ? static_cast<World *>(&session)
                       : nullptr;
    // The targets of each value, [first, end) in `targets`.
    std::vector<std::pair<size_t, size_t>> spans;
    for (int32_t id : ids) {
      const Value &v = exe.values[size_t(id)];
      const TensorType &type = argumentType(exe, id);
      const size_t nd = type.shape.size();
      size_t first = targets.size();
      if (world) {
        for (int r = world->firstRank();
             r < world->firstRank() + world->numLocal(); ++r) {
          int32_t p = exe.programOf(r);
          if (p < 0 || exe.programs[size_t(p)].memory.offsets[size_t(id)] < 0)
            continue;
          Target tg;
          tg.rank = r;
          tg.id = id;
          tg.start = v.global ? blockStart(exe.mesh, *v.global, v.type, r)
                              : std::vector<int64_t>(nd, 0);
          tg.data.type = v.type;
          tg.data.type.dtype = type.dtype;
          targets.push_back(std::move(tg));
        }
      } else {
        Target tg;
        tg.id = id;
        tg.start.assign(nd, 0);
        tg.data.type = type;
        targets.push_back(std::move(tg));
      }
      spans.push_back({first, targets.size()});
    }
    // Fill them, values spread over threads. A target that is exactly a
    // saved block (resuming under the same plan) is read straight into
    // place; otherwise each saved block it overlaps is read once and the
    // overlap copied.
    auto fill = [&](size_t k) -> Status {
      const int32_t id = ids[k];
      const TensorType &type = argumentType(exe, id);
      const size_t nd = type.shape.size();
      const int64_t es = dtypeSize(type.dtype);
      // A World rank's block that is exactly a saved block (the same plan)
      // is read straight into the rank's memory where the host can write
      // it (the CPU backend): no copy and no second first touch. Every
      // check of the checkpoint is done by now, so this overwrites nothing
      // unless a read itself fails.
      for (size_t t = spans[k].first; t < spans[k].second; ++t) {
        Target &tg = targets[t];
        bool exact = false;
        for (const Saved &sv : saved.at(id))
          exact = exact || (sv.start == tg.start &&
                            sv.shape == tg.data.type.shape &&
                            sv.entry->type.dtype == tg.data.type.dtype);
        if (world && exact &&
            exe.values[size_t(id)].type.dtype == tg.data.type.dtype)
          tg.direct = world->session(tg.rank).writableView(id);
        if (!tg.direct)
          tg.data.bytes.resize(size_t(tg.data.type.byteSize()));
      }
      for (const Saved &sv : saved[id]) {
        std::vector<uint8_t> data; // read on first use
        const std::string path = (fs::path(dir) / sv.file).string();
        for (size_t t = spans[k].first; t < spans[k].second; ++t) {
          Target &tg = targets[t];
          const std::vector<int64_t> &ts = tg.data.type.shape;
          if (tg.start == sv.start && ts == sv.shape) {
            DLOPT_RETURN_IF_ERROR(readSafeTensorsEntry(
                path, *sv.entry,
                tg.direct ? tg.direct : (void *)tg.data.bytes.data()));
            continue;
          }
          // The overlap [lo, hi) of the saved block and the target.
          std::vector<int64_t> lo(nd), hi(nd);
          bool empty = false;
          for (size_t d = 0; d < nd; ++d) {
            lo[d] = std::max(sv.start[d], tg.start[d]);
            hi[d] = std::min(sv.start[d] + sv.shape[d], tg.start[d] + ts[d]);
            empty |= lo[d] >= hi[d];
          }
          if (empty)
            continue;
          if (data.empty() && sv.entry->bytes) {
            data.resize(size_t(sv.entry->bytes));
            DLOPT_RETURN_IF_ERROR(
                readSafeTensorsEntry(path, *sv.entry, data.data()));
          }
          // Copy row by row along the last dim.
          const int64_t row = nd ? hi[nd - 1] - lo[nd - 1] : 1;
          std::vector<int64_t> idx(lo);
          for (;;) {
            int64_t from = 0, to = 0;
            for (size_t d = 0; d < nd; ++d) {
              from = from * sv.shape[d] + (idx[d] - sv.start[d]);
              to = to * ts[d] + (idx[d] - tg.start[d]);
            }
            std::memcpy(tg.data.bytes.data() + to * es,
                        data.data() + from * es, size_t(row * es));
            int d = int(nd) - 2;
            for (; d >= 0; --d) {
              if (++idx[size_t(d)] < hi[size_t(d)])
                break;
              idx[size_t(d)] = lo[size_t(d)];
            }
            if (d < 0)
              break;
          }
        }
      }
      return Status::ok();
    };
    std::atomic<size_t> next{0};
    std::vector<Status> filled(
        size_t(std::max(1u, std::min(8u, std::thread::hardware_concurrency()))),
        Status::ok());
    auto worker = [&](size_t w) {
      for (size_t k; (k = next.fetch_add(1)) < ids.size();) {
        Status st = fill(k);
        if (!st) {
          filled[w] = st;
          next = ids.size();
        }
      }
    };
    onThreads(int(filled.size()), [&](int w) { worker(size_t(w)); });
    for (const Status &st : filled)
      if (!st)
        throw LoadError{st.message()};
  } catch (const LoadError &e) {
    return Status::error(where + e.message);
  } catch (const std::exception &e) {
    return Status::error(where + kIndexName + " is malformed: " + e.what());
  }
  // Everything checked and read: now bind, each rank of a World on its own
  // thread (binding first touches the ranks' memory).
  if (!session.shardedCheckpoints()) {
    for (Target &t : targets)
      DLOPT_RETURN_IF_ERROR(
          session.bind(exe.values[size_t(t.id)].name, t.data, dir));
    return state;
  }
  World &w = static_cast<World &>(session);
  std::vector<Status> bound(size_t(w.numLocal()), Status::ok());
  auto bindRank = [&](int i) {
    const int r = w.firstRank() + i;
    for (Target &t : targets)
      if (t.rank == r) {
        if (t.direct) {
          w.session(r).markBound(t.id);
          continue;
        }
        Status st = w.session(r).bind(exe.values[size_t(t.id)].name, t.data, dir);
        if (!st) {
          bound[size_t(i)] = st;
          return;
        }
        t.data = HostTensor(); // free as we go
      }
  };
  onThreads(w.numLocal(), bindRank);
  for (const Status &st : bound)
    DLOPT_RETURN_IF_ERROR(st);
  return state;
}

} // namespace
} // namespace dlopt::rt
