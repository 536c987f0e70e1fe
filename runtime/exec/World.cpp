//===- World.cpp - Every rank of an executable as threads of one process --===//
#include "runtime/exec/World.h"

#include "runtime/comm/InProcessCommunicator.h"
#include "runtime/exec/CpuBackend.h"
#include "runtime/exec/GlobalTensor.h"

#include <algorithm>
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
  for (int r = 0; r < n; ++r) {
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
    if (int(made->size()) != n)
      return Status::error("creating the world communicators: made " +
                           std::to_string(made->size()) + " for " +
                           std::to_string(n) + " ranks");
    w->world_ = made.take();
    for (auto &c : w->world_) {
      if (!c)
        return Status::error("creating the world communicators: a rank got "
                             "none");
      c->setTimeout(opts.commTimeout);
    }
  } else {
    InProcessOptions io;
    io.timeout = opts.commTimeout;
    w->world_ = createInProcessGroup(n, io);
  }
  w->groups_.resize(size_t(n));
  for (auto &g : w->groups_)
    g.resize(exe.groups.size());
  DLOPT_RETURN_IF_ERROR(w->onEveryRank([&](int r) -> Status {
    std::vector<int64_t> c = exe.mesh.coords(r);
    for (size_t g = 0; g < exe.groups.size(); ++g) {
      const std::vector<int32_t> &axes = exe.groups[g].axes;
      int64_t color = 0, key = 0;
      for (size_t a = 0; a < c.size(); ++a) {
        bool in = std::find(axes.begin(), axes.end(), int32_t(a)) != axes.end();
        (in ? key : color) = (in ? key : color) * exe.mesh.shape[a] + c[a];
      }
      Expected<std::unique_ptr<Communicator>> comm =
          w->world_[size_t(r)]->split(int(color), int(key));
      if (!comm)
        return comm.status().withContext("creating group '" +
                                         exe.groups[g].name + "': ");
      w->groups_[size_t(r)][g] = comm.take();
    }
    std::vector<Communicator *> mine;
    for (auto &c2 : w->groups_[size_t(r)])
      mine.push_back(c2.get());
    w->sessions_[size_t(r)]->setCommunicators(std::move(mine));
    return Status::ok();
  }));
  return w;
}

Status World::onEveryRank(const std::function<Status(int)> &fn) {
  const int n = size();
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
  };
  if (n == 1) {
    results[0] = fn(0);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(size_t(n));
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        Status st = fn(r);
        if (!st)
          failed(r, st);
        results[size_t(r)] = std::move(st);
      });
    for (std::thread &t : threads)
      t.join();
  }
  if (n == 1 && !results[0])
    root = 0;
  if (root < 0)
    return Status::ok();
  return results[size_t(root)].withContext("rank " + std::to_string(root) +
                                           ": ");
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
  for (int r = 0; r < size(); ++r) {
    Expected<HostTensor> part = localPart(exe_.mesh, layout, localOfData, r, g);
    if (!part)
      return part.status();
    DLOPT_RETURN_IF_ERROR(sessions_[size_t(r)]->bind(name, *part, origin));
  }
  return Status::ok();
}

Status World::initializeParams() {
  return onEveryRank(
      [&](int r) { return sessions_[size_t(r)]->initializeParams(); });
}

Status World::execute(bool keepArguments) {
  return onEveryRank(
      [&](int r) { return sessions_[size_t(r)]->execute(keepArguments); });
}

Status World::applyUpdates() {
  for (auto &s : sessions_)
    DLOPT_RETURN_IF_ERROR(s->applyUpdates());
  return Status::ok();
}

Expected<HostTensor>
World::gather(int32_t id,
              const std::function<Expected<HostTensor>(int)> &read) const {
  const Value &v = exe_.values[size_t(id)];
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
      return read(0).status();
    return *first;
  }
  HostTensor global(v.global->type);
  std::vector<std::vector<int64_t>> starts;
  std::vector<std::vector<uint8_t>> blocks;
  // Pipeline stages: only the ranks of the stages holding it have a block.
  auto holds = [&](int r) {
    int32_t p = exe_.programOf(r);
    return p >= 0 && exe_.programs[size_t(p)].memory.offsets[size_t(id)] >= 0;
  };
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
        return sessions_[size_t(r)]->readOutput(name);
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
    return sessions_[size_t(r)]->readArgument(name);
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
