//===- World.cpp - Every rank of an executable as threads of one process --===//
#include "runtime/exec/World.h"

#include "runtime/comm/InProcessCommunicator.h"
#include "runtime/exec/CpuBackend.h"
#include "runtime/exec/GlobalTensor.h"

#include <algorithm>
#include <map>
#include <cstring>
#include <optional>
#include <mutex>
#include <thread>

namespace dlopt::rt {

World::~World() = default;

Expected<std::unique_ptr<World>> World::create(const Executable &exe,
                                               const WorldOptions &opts) {
  DLOPT_RETURN_IF_ERROR(exe.validate().withContext("invalid executable: "));
  std::unique_ptr<World> w(new World(exe));
  const int n = exe.worldSize;
  const int first = opts.firstRank, local = opts.numRanks ? opts.numRanks : n;
  if (first < 0 || local < 1 || first + local > n)
    return Status::error("ranks " + std::to_string(first) + " to " +
                         std::to_string(first + local - 1) +
                         " of this process are outside the executable's " +
                         std::to_string(n) + " ranks");
  if (local < n && !opts.processGroup)
    return Status::error("a process running " + std::to_string(local) +
                         " of the " + std::to_string(n) +
                         " ranks needs a communicator to the other processes");
  w->first_ = first;
  w->process_ = opts.processGroup;
  w->onFailure_ = opts.onFailure;
  for (int r = first; r < first + local; ++r) {
    Expected<std::unique_ptr<Backend>> backend =
        opts.backend ? opts.backend(r)
                     : Expected<std::unique_ptr<Backend>>(
                           std::make_unique<CpuBackend>(BackendOptions{1}));
    if (!backend)
      return backend.status().withContext("rank " + std::to_string(r) + ": ");
    SessionOptions so;
    so.rank = r;
    so.seed = opts.seed;
    Expected<std::unique_ptr<Session>> s =
        Session::create(exe, backend.take(), so);
    if (!s)
      return s.status().withContext("rank " + std::to_string(r) + ": ");
    w->sessions_.push_back(s.take());
  }
  // One communicator per (rank, group): ranks sharing their coordinates off
  // the group's axes split off together, ordered by their index in it.
  if (opts.worldGroup) {
    Expected<std::vector<std::unique_ptr<Communicator>>> made =
        opts.worldGroup(n);
    if (!made)
      return made.status().withContext("creating the world communicators: ");
    if (int(made->size()) != local)
      return Status::error("creating the world communicators: made " +
                           std::to_string(made->size()) + " for " +
                           std::to_string(local) + " ranks");
    w->world_ = made.take();
    for (size_t i = 0; i < w->world_.size(); ++i) {
      auto &c = w->world_[i];
      if (!c)
        return Status::error("creating the world communicators: a rank got "
                             "none");
      if (c->size() != n || c->rank() != first + int(i))
        return Status::error(
            "creating the world communicators: rank " +
            std::to_string(first + int(i)) + " got rank " +
            std::to_string(c->rank()) + " of a group of " +
            std::to_string(c->size()) + ", expected a group of " +
            std::to_string(n));
      c->setTimeout(opts.commTimeout);
    }
  } else {
    if (local != n)
      return Status::error("in-process world communicators need every rank "
                           "in this process");
    InProcessOptions io;
    io.timeout = opts.commTimeout;
    w->world_ = createInProcessGroup(n, io);
  }
  if (w->process_)
    w->process_->setTimeout(opts.commTimeout);
  w->groups_.resize(size_t(local));
  for (auto &g : w->groups_)
    g.resize(exe.groups.size());
  DLOPT_RETURN_IF_ERROR(w->onEveryRank([&](int r) -> Status {
    const size_t i = size_t(r - first);
    std::vector<int64_t> c = exe.mesh.coords(r);
    for (size_t g = 0; g < exe.groups.size(); ++g) {
      const std::vector<int32_t> &axes = exe.groups[g].axes;
      int64_t color = 0, key = 0;
      for (size_t a = 0; a < c.size(); ++a) {
        bool in = std::find(axes.begin(), axes.end(), int32_t(a)) != axes.end();
        (in ? key : color) = (in ? key : color) * exe.mesh.shape[a] + c[a];
      }
      Expected<std::unique_ptr<Communicator>> comm =
          w->world_[i]->split(int(color), int(key));
      if (!comm)
        return comm.status().withContext("creating group '" +
                                         exe.groups[g].name + "': ");
      w->groups_[i][g] = comm.take();
    }
    std::vector<Communicator *> mine;
    for (auto &c2 : w->groups_[i])
      mine.push_back(c2.get());
    w->sessions_[i]->setCommunicators(std::move(mine));
    return Status::ok();
  }));
  return w;
}

Status World::onEveryRank(const std::function<Status(int)> &fn) {
  const int n = numLocal();
  std::vector<Status> results(static_cast<size_t>(n));
  std::mutex mu;
  int root = -1;
  auto failed = [&](int r, const Status &st) {
    std::lock_guard<std::mutex> lock(mu);
    if (root >= 0)
      return;
    root = r;
    // Wake every rank waiting on a communicator.
    std::string reason = "rank " + std::to_string(r) + " failed: " +
                         st.message();
    for (auto &c : world_)
      if (c)
        c->abort(reason);
    for (auto &rankGroups : groups_)
      for (auto &c : rankGroups)
        if (c)
          c->abort(reason);
    if (process_)
      process_->abort(reason);
    if (onFailure_)
      onFailure_(first_ + r, st);
  };
  if (n == 1) {
    results[0] = fn(first_);
    if (!results[0])
      failed(0, results[0]);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(size_t(n));
    for (int i = 0; i < n; ++i)
      threads.emplace_back([&, i] {
        Status st = fn(first_ + i);
        if (!st)
          failed(i, st);
        results[size_t(i)] = std::move(st);
      });
    for (std::thread &t : threads)
      t.join();
  }
  if (root < 0)
    return Status::ok();
  return results[size_t(root)].withContext(
      "rank " + std::to_string(first_ + root) + ": ");
}

Expected<std::vector<std::vector<uint8_t>>>
World::allGatherBytes(const std::vector<uint8_t> &mine,
                      const std::string &what) {
  if (!process_)
    return std::vector<std::vector<uint8_t>>{mine};
  const int p = process_->size();
  // Each process's size and the hash of what it exchanges.
  int64_t head[2] = {int64_t(mine.size()),
                     int64_t(fnv1a64(reinterpret_cast<const uint8_t *>(
                                         what.data()),
                                     what.size()) >>
                             1)};
  std::vector<int64_t> heads(size_t(p) * 2, 0);
  DLOPT_RETURN_IF_ERROR(process_->allGather(
      hostIn(head, 2, DType::I64), hostOut(heads.data(), 2 * p, DType::I64)));
  std::vector<int64_t> sizes(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) {
    sizes[size_t(q)] = heads[size_t(q) * 2];
    if (heads[size_t(q) * 2 + 1] != head[1])
      return Status::error("processes out of step: process " +
                           std::to_string(processIndex()) + " exchanges " +
                           what + ", process " + std::to_string(q) +
                           " something else");
  }
  int64_t most = *std::max_element(sizes.begin(), sizes.end());
  std::vector<uint8_t> padded(mine);
  padded.resize(size_t(most), 0);
  std::vector<uint8_t> all(size_t(most * p) + 1);
  DLOPT_RETURN_IF_ERROR(process_->allGather(
      hostIn(padded.data(), most, DType::I1), hostOut(all.data(), most * p,
                                                      DType::I1)));
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q)
    out[size_t(q)].assign(all.begin() + q * most,
                          all.begin() + q * most + sizes[size_t(q)]);
  return out;
}

Status World::agreeAcrossProcesses(const Status &local) {
  if (!process_)
    return local;
  std::string text = local ? std::string() : local.message();
  std::vector<uint8_t> mine(text.begin(), text.end());
  mine.insert(mine.begin(), uint8_t(local ? 1 : 0));
  Expected<std::vector<std::vector<uint8_t>>> all =
      allGatherBytes(mine, "a status");
  if (!all)
    return all.status();
  for (size_t q = 0; q < all->size(); ++q) {
    const std::vector<uint8_t> &b = (*all)[q];
    if (!b.empty() && b[0] == 0)
      return Status::error(int(q) == processIndex()
                               ? std::string(b.begin() + 1, b.end())
                               : "process " + std::to_string(q) + ": " +
                                     std::string(b.begin() + 1, b.end()));
  }
  return Status::ok();
}

namespace {

const Value *findNamed(const Executable &exe, const std::string &name,
                       int32_t *idOut) {
  for (const auto *list : {&exe.params, &exe.states, &exe.inputs})
    for (int32_t id : *list)
      if (exe.values[size_t(id)].name == name) {
        *idOut = id;
        return &exe.values[size_t(id)];
      }
  for (size_t i = 0; i < exe.outputs.size(); ++i)
    if (exe.outputNames[i] == name) {
      *idOut = exe.outputs[i];
      return &exe.values[size_t(exe.outputs[i])];
    }
  return nullptr;
}

} // namespace

Expected<TensorType> World::globalType(const std::string &name) const {
  int32_t id = -1;
  const Value *v = findNamed(exe_, name, &id);
  if (!v)
    return Status::error("the executable has no argument or output '" +
                         name + "'");
  return v->global ? v->global->type : v->type;
}

Status World::bind(const std::string &name, const HostTensor &global,
                   const std::string &origin) {
  int32_t id = -1;
  const Value *v = findNamed(exe_, name, &id);
  if (!v || v->kind == ValueKind::Temp || v->kind == ValueKind::Const)
    return sessions_[0]->bind(name, global, origin); // its message lists names
  if (!v->global) {
    for (auto &s : sessions_)
      DLOPT_RETURN_IF_ERROR(s->bind(name, global, origin));
    return Status::ok();
  }
  // Same conversion rule as Session::bind: compare against the global type.
  HostTensor g = global;
  if (!(g.type == v->global->type)) {
    if (!(g.type.shape == v->global->type.shape) ||
        !(g.type.dtype == DType::F32 && v->global->type.dtype == DType::BF16))
      return Status::error(std::string(v->kind == ValueKind::Input ? "input"
                                       : v->kind == ValueKind::Param
                                           ? "param"
                                           : "state") +
                           " '" + name + "': expected " +
                           v->global->type.str() + ", got " + g.type.str() +
                           (origin.empty() ? "" : " from " + origin));
  }
  TensorType localOfData = v->type;
  localOfData.dtype = g.type.dtype;
  GlobalLayout layout = *v->global;
  layout.type.dtype = g.type.dtype;
  for (int r = first_; r < first_ + numLocal(); ++r) {
    Expected<HostTensor> part = localPart(exe_.mesh, layout, localOfData, r, g);
    if (!part)
      return part.status();
    DLOPT_RETURN_IF_ERROR(session(r).bind(name, *part, origin));
  }
  return Status::ok();
}

std::optional<Box> World::inputRegion(const std::string &name) const {
  int32_t id = -1;
  const Value *v = findNamed(exe_, name, &id);
  // A replicated input is compared across every rank when read back, so
  // each process binds all of it.
  if (!v || v->kind != ValueKind::Input || !v->global)
    return std::nullopt;
  // The local ranks holding a block (a pipeline stage that never reads
  // the input holds none); each holder's copy must be the real one, since
  // reading the input back compares the copies of a block.
  std::vector<int32_t> holders;
  for (int r = first_; r < first_ + numLocal(); ++r) {
    int32_t p = exe_.programOf(r);
    if (p >= 0 && exe_.programs[size_t(p)].memory.offsets[size_t(id)] >= 0)
      holders.push_back(r);
  }
  Box box = blocksBox(exe_.mesh, *v->global, v->type, holders);
  if (box.covers(v->global->type.shape))
    return std::nullopt;
  return box;
}

std::vector<std::string> World::missingInputs() const {
  std::vector<std::string> names;
  auto add = [&](const std::string &n) {
    if (std::find(names.begin(), names.end(), n) == names.end())
      names.push_back(n);
  };
  for (const auto &s : sessions_)
    for (const std::string &n : s->missingInputs())
      add(n);
  if (process_) {
    std::string text;
    for (const std::string &n : names)
      text += n + '\n';
    Expected<std::vector<std::vector<uint8_t>>> all =
        const_cast<World *>(this)->allGatherBytes(
            std::vector<uint8_t>(text.begin(), text.end()), "missing inputs");
    if (all)
      for (const std::vector<uint8_t> &b : *all) {
        std::string t(b.begin(), b.end());
        size_t at = 0;
        for (size_t nl; (nl = t.find('\n', at)) != std::string::npos;
             at = nl + 1)
          add(t.substr(at, nl - at));
      }
  }
  // In the executable's order, as one Session lists them.
  std::vector<std::string> ordered;
  for (int32_t id : exe_.inputs)
    if (std::find(names.begin(), names.end(), exe_.values[size_t(id)].name) !=
        names.end())
      ordered.push_back(exe_.values[size_t(id)].name);
  return ordered;
}

Status World::initializeParams() {
  return onEveryRank([&](int r) { return session(r).initializeParams(); });
}

Status World::execute(bool keepArguments) {
  return onEveryRank(
      [&](int r) { return session(r).execute(keepArguments); });
}

Status World::applyUpdates() {
  for (auto &s : sessions_)
    DLOPT_RETURN_IF_ERROR(s->applyUpdates());
  return Status::ok();
}

namespace {

/// A rank's read of a value, as it crosses between processes:
/// i32 rank, u8 ok, then the type (u8 dtype, i32 rank, i64 dims) and the
/// bytes, or the error text; lengths as i64.
void appendRead(std::vector<uint8_t> &out, int32_t rank,
                const Expected<HostTensor> &t) {
  auto put = [&](const void *p, size_t n) {
    const uint8_t *b = static_cast<const uint8_t *>(p);
    out.insert(out.end(), b, b + n);
  };
  put(&rank, 4);
  uint8_t ok = t ? 1 : 0;
  put(&ok, 1);
  if (!t) {
    std::string m = t.status().message();
    int64_t len = int64_t(m.size());
    put(&len, 8);
    put(m.data(), m.size());
    return;
  }
  uint8_t dt = uint8_t(t->type.dtype);
  put(&dt, 1);
  int32_t nd = int32_t(t->type.shape.size());
  put(&nd, 4);
  for (int64_t d : t->type.shape)
    put(&d, 8);
  int64_t len = int64_t(t->bytes.size());
  put(&len, 8);
  put(t->bytes.data(), t->bytes.size());
}

/// Parses what appendRead wrote (from another process of this job).
Status parseReads(const std::vector<uint8_t> &in,
                  std::map<int, Expected<HostTensor>> &reads) {
  size_t at = 0;
  auto get = [&](void *p, size_t n) {
    if (at + n > in.size())
      return false;
    std::memcpy(p, in.data() + at, n);
    at += n;
    return true;
  };
  const Status bad = Status::error("malformed block exchange between processes");
  while (at < in.size()) {
    int32_t rank = 0;
    uint8_t ok = 0;
    if (!get(&rank, 4) || !get(&ok, 1))
      return bad;
    if (!ok) {
      int64_t len = 0;
      if (!get(&len, 8) || len < 0 || at + size_t(len) > in.size())
        return bad;
      std::string m(in.begin() + at, in.begin() + at + len);
      at += size_t(len);
      reads.emplace(rank, Status::error(m));
      continue;
    }
    uint8_t dt = 0;
    int32_t nd = 0;
    if (!get(&dt, 1) || !get(&nd, 4) || nd < 0 || nd > 64 || dt > 5)
      return bad;
    TensorType type;
    type.dtype = DType(dt);
    type.shape.resize(size_t(nd));
    for (int64_t &d : type.shape)
      if (!get(&d, 8))
        return bad;
    int64_t len = 0;
    if (!get(&len, 8) || len < 0 || at + size_t(len) > in.size())
      return bad;
    HostTensor t;
    t.type = type;
    t.bytes.assign(in.begin() + at, in.begin() + at + len);
    at += size_t(len);
    reads.emplace(rank, std::move(t));
  }
  return Status::ok();
}

} // namespace

Expected<HostTensor>
World::gather(int32_t id,
              const std::function<Expected<HostTensor>(int)> &localRead) const {
  const Value &v = exe_.values[size_t(id)];
  // Pipeline stages: only the ranks of the stages holding it have a block.
  auto holds = [&](int r) {
    int32_t p = exe_.programOf(r);
    return p >= 0 && exe_.programs[size_t(p)].memory.offsets[size_t(id)] >= 0;
  };
  // Every rank's read: this process's directly, the others' exchanged
  // (every process calls gather for the same value in the same order).
  std::map<int, Expected<HostTensor>> reads;
  std::vector<uint8_t> mine;
  for (int r = first_; r < first_ + numLocal(); ++r) {
    // An unsplit value is compared across ranks; a split one needs the
    // ranks holding a block (the first of each, checked below).
    if (v.global && !holds(r))
      continue;
    Expected<HostTensor> t = localRead(r);
    if (process_)
      appendRead(mine, r, t);
    reads.emplace(r, std::move(t));
  }
  if (process_) {
    Expected<std::vector<std::vector<uint8_t>>> all =
        const_cast<World *>(this)->allGatherBytes(
            mine, "the blocks of '" + v.name + "'");
    if (!all)
      return all.status();
    for (size_t q = 0; q < all->size(); ++q)
      if (int(q) != processIndex())
        DLOPT_RETURN_IF_ERROR(parseReads((*all)[q], reads));
  }
  auto read = [&](int r) -> Expected<HostTensor> {
    auto it = reads.find(r);
    if (it == reads.end())
      return Status::error("rank " + std::to_string(r) + " holds no copy");
    return it->second;
  };
  if (!v.global) {
    // Replicated: every rank holding it must agree bit for bit, which is
    // what catches a missing or doubled reduction.
    std::optional<HostTensor> first;
    int firstRank = -1;
    for (int r = 0; r < size(); ++r) {
      Expected<HostTensor> t = read(r);
      if (!t)
        continue;
      if (!first) {
        first = t.take();
        firstRank = r;
      } else if (t->bytes != first->bytes) {
        return Status::error("ranks " + std::to_string(firstRank) + " and " +
                             std::to_string(r) + " hold different values "
                             "of the replicated " + v.type.str() + " value");
      }
    }
    if (!first)
      return read(first_).status();
    return *first;
  }
  HostTensor global(v.global->type);
  std::vector<std::vector<int64_t>> starts;
  std::vector<std::vector<uint8_t>> blocks;
  int64_t wantBlocks = 1;
  for (const std::vector<int32_t> &axes : v.global->split)
    for (int32_t a : axes)
      wantBlocks *= exe_.mesh.shape[size_t(a)];
  for (int r = 0; r < size(); ++r) {
    if (!holds(r))
      continue;
    Expected<HostTensor> part = read(r);
    if (!part)
      return part.status();
    std::vector<int64_t> start = blockStart(exe_.mesh, *v.global, v.type, r);
    bool seen = false;
    for (size_t i = 0; i < starts.size(); ++i)
      if (starts[i] == start) {
        seen = true;
        if (blocks[i] != part->bytes)
          return Status::error("rank " + std::to_string(r) +
                               " holds a different copy of its block of "
                               "the " + v.global->type.str() + " value");
      }
    if (seen)
      continue;
    starts.push_back(start);
    blocks.push_back(part->bytes);
    DLOPT_RETURN_IF_ERROR(placePart(exe_.mesh, *v.global, r, *part, global));
  }
  if (int64_t(starts.size()) != wantBlocks)
    return Status::error("the ranks hold " + std::to_string(starts.size()) +
                         " of the " + std::to_string(wantBlocks) +
                         " blocks of the " + v.global->type.str() + " value");
  return global;
}

Expected<HostTensor> World::readOutput(const std::string &name) const {
  for (size_t i = 0; i < exe_.outputs.size(); ++i)
    if (exe_.outputNames[i] == name) {
      Expected<HostTensor> t = gather(exe_.outputs[i], [&](int r) {
        return sessions_[size_t(r - first_)]->readOutput(name);
      });
      if (!t)
        return t.status().withContext("output '" + name + "': ");
      return t;
    }
  return sessions_[0]->readOutput(name); // its message lists the outputs
}

Expected<HostTensor> World::readArgument(const std::string &name) const {
  int32_t id = sessions_[0]->findArgument(name);
  if (id < 0)
    return sessions_[0]->readArgument(name);
  Expected<HostTensor> t = gather(id, [&](int r) {
    return sessions_[size_t(r - first_)]->readArgument(name);
  });
  if (!t)
    return t.status().withContext("'" + name + "': ");
  return t;
}

} // namespace dlopt::rt

namespace dlopt::rt {

std::vector<int32_t> World::checkpointedValues() const {
  std::vector<int32_t> ids;
  for (const auto *list : {&exe_.params, &exe_.states})
    ids.insert(ids.end(), list->begin(), list->end());
  return ids;
}

} // namespace dlopt::rt
