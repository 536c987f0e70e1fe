//===- Session.cpp - Loads an executable and runs one rank's program ------===//

#include "runtime/exec/Session.h"
#include "runtime/exec/GlobalTensor.h"
#include "runtime/exec/ParamInit.h"

#include "runtime/format/MemoryPlanner.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace dlopt::rt {

namespace {

std::string instrContext(int rank, size_t index, const Instr &in) {
  return "rank " + std::to_string(rank) + ", instruction " +
         std::to_string(index) + " ('" + in.op + "'" +
         (in.loc.empty() ? "" : " at " + in.loc) + "): ";
}

std::string argKind(ValueKind k) { return valueKindName(k); }

} // namespace

Session::Session(Executable exe, std::unique_ptr<Backend> backend,
                 const SessionOptions &opts)
    : exe_(std::move(exe)), opts_(opts), backend_(std::move(backend)) {}

Session::~Session() = default;

Expected<std::unique_ptr<Session>>
Session::create(Executable exe, std::unique_ptr<Backend> backend,
                const SessionOptions &opts) {
  if (!backend)
    return Status::error("no backend given");
  std::unique_ptr<Session> s;
  try {
    s.reset(new Session(std::move(exe), std::move(backend), opts));
    DLOPT_RETURN_IF_ERROR(s->init());
  } catch (const std::exception &e) {
    return Status::error(std::string("creating session: ") + e.what());
  }
  return s;
}

Status Session::init() {
  Status valid = exe_.validate();
  if (!valid)
    return valid.withContext("invalid executable: ");
  if (opts_.rank < 0 || opts_.rank >= exe_.worldSize)
    return Status::error("rank " + std::to_string(opts_.rank) +
                         " out of range: the executable has " +
                         std::to_string(exe_.worldSize) + " rank(s)");
  program_ = &exe_.programs[size_t(exe_.programOf(opts_.rank))];
  for (size_t i = 0; i < program_->instrs.size(); ++i) {
    const Instr &in = program_->instrs[i];
    if (!backend_->supportsOp(in.op))
      return Status::error(instrContext(opts_.rank, i, in) + "op '" + in.op +
                           "' is not supported by the " + backend_->name() +
                           " backend");
  }

  const MemoryPlan &mem = program_->memory;
  Expected<std::unique_ptr<DeviceArena>> arena =
      backend_->allocateArena(opts_.rank, mem.totalBytes());
  if (!arena)
    return arena.status();
  arena_ = arena.take();

  ready_.assign(exe_.values.size(), false);
  for (size_t v = 0; v < exe_.values.size(); ++v) {
    const Value &val = exe_.values[v];
    if (val.kind != ValueKind::Const || mem.offsets[v] < 0)
      continue;
    const uint8_t *src = exe_.constData.data() + val.constOffset;
    if (val.constSplat) {
      // Repeat the one stored element, a chunk at a time.
      const int64_t elem = dtypeSize(val.type.dtype), total = val.type.byteSize();
      const int64_t chunk = std::min<int64_t>(total, int64_t(1) << 20) / elem * elem;
      std::vector<uint8_t> pattern(size_t(std::max<int64_t>(chunk, elem)));
      for (size_t i = 0; i < pattern.size(); i += size_t(elem))
        std::memcpy(pattern.data() + i, src, size_t(elem));
      for (int64_t done = 0; done < total; done += int64_t(pattern.size()))
        DLOPT_RETURN_IF_ERROR(backend_->copyToDevice(
            *arena_, mem.offsets[v] + done, pattern.data(),
            std::min<int64_t>(int64_t(pattern.size()), total - done)));
    } else {
      DLOPT_RETURN_IF_ERROR(backend_->copyToDevice(
          *arena_, mem.offsets[v], src, val.type.byteSize()));
    }
    ready_[v] = true;
  }

  // Resolve every operand and result to its address once, not per run.
  auto *base = static_cast<uint8_t *>(arena_->data());
  auto ref = [&](int32_t id) {
    return TensorRef{base + mem.offsets[id], exe_.values[id].type};
  };
  ins_.resize(program_->instrs.size());
  outs_.resize(program_->instrs.size());
  for (size_t i = 0; i < program_->instrs.size(); ++i) {
    for (int32_t id : program_->instrs[i].operands)
      ins_[i].push_back(ref(id));
    for (int32_t id : program_->instrs[i].results)
      outs_[i].push_back(ref(id));
  }
  return Status::ok();
}

int32_t Session::findArgument(const std::string &name) const {
  for (const auto *list : {&exe_.inputs, &exe_.params, &exe_.states})
    for (int32_t id : *list)
      if (exe_.values[id].name == name)
        return id;
  return -1;
}

bool Session::hasArgument(const std::string &name) const {
  return findArgument(name) >= 0;
}

Status Session::bind(const std::string &name, const HostTensor &value,
                     const std::string &origin) {
  int32_t id = findArgument(name);
  if (id < 0) {
    std::string known;
    size_t shown = 0, total = exe_.inputs.size() + exe_.params.size() +
                              exe_.states.size();
    for (const auto *list : {&exe_.inputs, &exe_.params, &exe_.states})
      for (int32_t a : *list)
        if (shown++ < 12)
          known += (known.empty() ? "" : ", ") + exe_.values[a].name;
    if (total > 12)
      known += ", ... (" + std::to_string(total) + " in all)";
    return Status::error(std::string(exe_.states.empty()
                                         ? "no input or param named '"
                                         : "no input, param or state named '") +
                         name + "'" +
                         (known.empty() ? " (the model has none)"
                                        : " (known: " + known + ")"));
  }
  const Value &val = exe_.values[id];
  std::string what = argKind(val.kind) + " '" + name + "'";
  std::string from = origin.empty() ? "" : " from " + origin;
  if (int64_t(value.bytes.size()) != value.type.byteSize())
    return Status::error(what + ": tensor" + from + " holds " +
                         std::to_string(value.bytes.size()) + " bytes, " +
                         value.type.str() + " needs " +
                         std::to_string(value.type.byteSize()));
  const HostTensor *src = &value;
  HostTensor converted;
  if (!(value.type == val.type)) {
    bool bf16FromF32 = val.type.dtype == DType::BF16 &&
                       value.type.dtype == DType::F32 &&
                       value.type.shape == val.type.shape;
    if (!bf16FromF32)
      return Status::error(what + ": expected " + val.type.str() + ", got " +
                           value.type.str() + from);
    converted = convertTensor(value, DType::BF16);
    src = &converted;
  }
  int64_t offset = program_->memory.offsets[id];
  if (offset >= 0)
    DLOPT_RETURN_IF_ERROR(
        backend_->copyToDevice(*arena_, offset, src->bytes.data(),
                               int64_t(src->bytes.size()))
            .withContext(what + ": "));
  ready_[id] = true;
  return Status::ok();
}

std::vector<std::string> Session::missingInputs() const {
  std::vector<std::string> missing;
  for (int32_t id : exe_.inputs)
    if (!ready_[id] && program_->memory.offsets[id] >= 0)
      missing.push_back(exe_.values[id].name);
  return missing;
}

Status Session::prepare() {
  std::vector<std::string> missing = missingInputs();
  if (!missing.empty()) {
    std::string list;
    for (const std::string &name : missing)
      list += (list.empty() ? "'" : ", '") + name + "' (" +
              exe_.values[findArgument(name)].type.str() + ")";
    return Status::error(std::string(missing.size() == 1 ? "missing input "
                                                         : "missing inputs ") +
                         list);
  }
  return initializeParams();
}

Status Session::initializeParams() {
  // States continue the params' stream indices, so adding optimizer state
  // never changes the initial params.
  size_t numParams = exe_.params.size();
  for (size_t p = 0; p < numParams + exe_.states.size(); ++p) {
    int32_t id = p < numParams ? exe_.params[p] : exe_.states[p - numParams];
    int64_t offset = program_->memory.offsets[id];
    if (ready_[id] || offset < 0)
      continue;
    const Value &val = exe_.values[id];
    // A split param is the rank's block of the global one: element values
    // depend on global indices only, whatever the plan.
    Expected<HostTensor> t =
        val.global
            ? initParamBlock(val.global->type, val.type,
                             blockStart(exe_.mesh, *val.global, val.type,
                                        opts_.rank),
                             val.init, opts_.seed, p)
            : initParam(val.type, val.init, opts_.seed, p);
    if (!t)
      return t.status().withContext(argKind(val.kind) + " '" + val.name +
                                    "': ");
    DLOPT_RETURN_IF_ERROR(backend_->copyToDevice(
        *arena_, offset, t->bytes.data(), int64_t(t->bytes.size())));
    ready_[id] = true;
  }
  return Status::ok();
}

Expected<std::vector<NamedTensor>> Session::run() {
  DLOPT_RETURN_IF_ERROR(execute());
  return collectOutputs(/*includeUpdates=*/true);
}

Expected<std::vector<NamedTensor>> Session::step(bool apply) {
  DLOPT_RETURN_IF_ERROR(execute(/*keepArguments=*/!apply));
  Expected<std::vector<NamedTensor>> outs =
      collectOutputs(/*includeUpdates=*/false);
  if (outs && apply)
    DLOPT_RETURN_IF_ERROR(applyUpdates());
  return outs;
}

bool Session::hasUpdates() const {
  for (const std::string &u : exe_.outputUpdates)
    if (!u.empty())
      return true;
  return false;
}

Status Session::applyUpdates() {
  if (!updatesPending_)
    return Status::error("no run to apply updates from (updates are applied "
                         "once per run)");
  updatesPending_ = false;
  const std::vector<int64_t> &offsets = program_->memory.offsets;
  for (const PendingUpdate &p : inPlacePending_)
    DLOPT_RETURN_IF_ERROR(backend_->copyToDevice(
        *arena_, offsets[p.arg], p.value.bytes.data(),
        int64_t(p.value.bytes.size())));
  inPlacePending_.clear();
  // Temporaries never share bytes with params or states, so they are copied
  // in place. An update taken from another persistent value (a swap, say)
  // is staged first so every copy reads the values from before the step.
  struct Copy {
    int32_t src, dst;
  };
  std::vector<Copy> direct;
  std::vector<std::pair<int32_t, HostTensor>> staged;
  for (size_t i = 0; i < exe_.outputUpdates.size(); ++i) {
    const std::string &target = exe_.outputUpdates[i];
    if (target.empty())
      continue;
    int32_t src = exe_.outputs[i], dst = findArgument(target);
    if (dst < 0 || offsets[dst] < 0 || src == dst ||
        offsets[src] == offsets[dst])
      continue; // not this rank's, an identity or an in-place update
    if (offsets[src] < 0)
      return Status::error("output '" + exe_.outputNames[i] + "' updates '" +
                           target + "', which rank " +
                           std::to_string(opts_.rank) +
                           " holds, but the rank does not hold the output");
    if (exe_.values[src].kind == ValueKind::Temp) {
      direct.push_back({src, dst});
    } else {
      Expected<HostTensor> t = readValue(src);
      if (!t)
        return t.status().withContext("updating '" + target + "': ");
      staged.emplace_back(dst, t.take());
    }
  }
  for (const Copy &c : direct)
    DLOPT_RETURN_IF_ERROR(
        backend_
            ->copyOnDevice(*arena_, offsets[c.dst], offsets[c.src],
                           exe_.values[c.dst].type.byteSize())
            .withContext("updating '" + exe_.values[c.dst].name + "': "));
  for (const auto &[dst, t] : staged)
    DLOPT_RETURN_IF_ERROR(
        backend_
            ->copyToDevice(*arena_, offsets[dst], t.bytes.data(),
                           int64_t(t.bytes.size()))
            .withContext("updating '" + exe_.values[dst].name + "': "));
  for (const Copy &c : direct)
    ready_[c.dst] = true;
  for (const auto &st : staged)
    ready_[st.first] = true;
  return backend_->synchronize(opts_.rank);
}

Status Session::execute(bool keepArguments) {
  updatesPending_ = false;
  inPlacePending_.clear();
  DLOPT_RETURN_IF_ERROR(prepare());
  // Arguments that in-place updates overwrite, saved when the run must
  // leave them unchanged.
  struct Saved {
    int32_t arg, temp;
    HostTensor value;
  };
  std::vector<Saved> saved;
  if (keepArguments) {
    const std::vector<int64_t> &offsets = program_->memory.offsets;
    for (auto [t, a] : findInPlaceUpdates(exe_, *program_)) {
      if (offsets[t] < 0 || offsets[t] != offsets[a])
        continue;
      Expected<HostTensor> v = readValue(a);
      if (!v)
        return v.status();
      saved.push_back({a, t, v.take()});
    }
  }
  RunContext ctx;
  ctx.rank = opts_.rank;
  ctx.worldSize = exe_.worldSize;
  ctx.groups = groups_;
  // A warm-up run the profile leaves out runs as if profiling were off.
  const bool profiling = profiling_ && profileSkip_ == 0;
  if (profiling_ && profileSkip_ > 0) {
    --profileSkip_;
    ++profileTotals_.skipped;
  }
  auto start = std::chrono::steady_clock::now();
  // Profiles take device times where the backend has them (no synchronize
  // per instruction, so the timings keep the overlap and the launch
  // pipelining of a real step); otherwise host times after a synchronize.
  const bool deviceTimed =
      profiling && backend_->setDeviceTiming(opts_.rank, true);
  if (profiling)
    instrProfile_.resize(program_->instrs.size());
  for (size_t i = 0; i < program_->instrs.size(); ++i) {
    const Instr &in = program_->instrs[i];
    auto t0 = std::chrono::steady_clock::now();
    Status st = backend_->run(in, ins_[i], outs_[i], ctx);
    if (st && profiling && !deviceTimed) {
      st = backend_->synchronize(opts_.rank);
      double dt = std::chrono::duration<double>(
                      std::chrono::steady_clock::now() - t0)
                      .count();
      OpProfile &p = profile_[in.op];
      p.seconds += dt;
      ++p.calls;
      instrProfile_[i].seconds += dt;
      ++instrProfile_[i].calls;
    }
    if (!st)
      // Kernel errors already name the op and its location.
      return st.withContext("rank " + std::to_string(opts_.rank) +
                            ", instruction " + std::to_string(i) + ": ");
  }
  lastIssueSeconds_ = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - start)
                          .count();
  DLOPT_RETURN_IF_ERROR(backend_->synchronize(opts_.rank));
  lastRunSeconds_ = std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  if (profiling) {
    profileTotals_.runs += 1;
    profileTotals_.wallSeconds += lastRunSeconds_;
    profileTotals_.issueSeconds += lastIssueSeconds_;
    profileTotals_.deviceTimed = deviceTimed;
  }
  if (deviceTimed) {
    Expected<std::vector<double>> times = backend_->takeDeviceTimes(opts_.rank);
    (void)backend_->setDeviceTiming(opts_.rank, false);
    if (!times)
      return times.status();
    if (times->size() != program_->instrs.size())
      return Status::error("device timing: " + std::to_string(times->size()) +
                           " times for " +
                           std::to_string(program_->instrs.size()) +
                           " instructions");
    for (size_t i = 0; i < times->size(); ++i) {
      double dt = (*times)[i];
      OpProfile &p = profile_[program_->instrs[i].op];
      p.seconds += dt;
      ++p.calls;
      instrProfile_[i].seconds += dt;
      ++instrProfile_[i].calls;
    }
  }
  // Put the saved arguments back, keeping their new values for
  // applyUpdates().
  for (Saved &sv : saved) {
    Expected<HostTensor> updated = readValue(sv.arg);
    if (!updated)
      return updated.status();
    DLOPT_RETURN_IF_ERROR(backend_->copyToDevice(
        *arena_, program_->memory.offsets[sv.arg], sv.value.bytes.data(),
        int64_t(sv.value.bytes.size())));
    inPlacePending_.push_back({sv.arg, sv.temp, updated.take()});
  }
  if (!saved.empty())
    DLOPT_RETURN_IF_ERROR(backend_->synchronize(opts_.rank));
  updatesPending_ = true;
  return Status::ok();
}

Expected<std::vector<NamedTensor>>
Session::collectOutputs(bool includeUpdates) {
  std::vector<NamedTensor> outputs;
  for (size_t i = 0; i < exe_.outputs.size(); ++i) {
    int32_t id = exe_.outputs[i];
    if (program_->memory.offsets[id] < 0)
      continue;
    if (!includeUpdates && i < exe_.outputUpdates.size() &&
        !exe_.outputUpdates[i].empty())
      continue;
    Expected<HostTensor> t = readValue(id);
    if (!t)
      return t.status().withContext("output '" + exe_.outputNames[i] + "': ");
    outputs.push_back({exe_.outputNames[i], t.take()});
  }
  return outputs;
}

Expected<HostTensor> Session::readValue(int32_t id) const {
  if (id < 0 || size_t(id) >= exe_.values.size())
    return Status::error("value id " + std::to_string(id) + " out of range");
  int64_t offset = program_->memory.offsets[id];
  if (offset < 0)
    return Status::error("value %" + std::to_string(id) +
                         " is not held by rank " + std::to_string(opts_.rank));
  HostTensor t;
  try {
    t = HostTensor(exe_.values[id].type);
  } catch (const std::exception &e) {
    return Status::error(std::string("reading a value: ") + e.what());
  }
  DLOPT_RETURN_IF_ERROR(backend_->copyToHost(t.bytes.data(), *arena_, offset,
                                             int64_t(t.bytes.size())));
  return t;
}

const void *Session::valueView(int32_t id) const {
  if (id < 0 || size_t(id) >= exe_.values.size())
    return nullptr;
  int64_t offset = program_->memory.offsets[size_t(id)];
  if (offset < 0)
    return nullptr;
  return backend_->hostView(*arena_, offset,
                            exe_.values[size_t(id)].type.byteSize());
}

Expected<HostTensor> Session::readOutput(const std::string &name) const {
  for (size_t i = 0; i < exe_.outputs.size(); ++i)
    if (exe_.outputNames[i] == name) {
      // An in-place update held back by execute(keepArguments = true).
      for (const PendingUpdate &p : inPlacePending_)
        if (p.temp == exe_.outputs[i])
          return p.value;
      Expected<HostTensor> t = readValue(exe_.outputs[i]);
      if (!t)
        return t.status().withContext("output '" + name + "': ");
      return t;
    }
  return Status::error("no output named '" + name + "'");
}

Expected<HostTensor> Session::readArgument(const std::string &name) const {
  int32_t id = findArgument(name);
  if (id < 0)
    return Status::error("no input, param or state named '" + name + "'");
  return readValue(id);
}

MemoryReport Session::memory() const {
  MemoryReport r;
  r.plannedBytes = program_->memory.totalBytes();
  r.persistentBytes = program_->memory.persistentBytes;
  r.scratchBytes = program_->memory.scratchBytes;
  r.allocatedBytes = backend_->bytesAllocated();
  r.peakAllocatedBytes = backend_->peakBytesAllocated();
  return r;
}

} // namespace dlopt::rt

namespace dlopt::rt {

std::vector<int32_t> Session::checkpointedValues() const {
  const std::vector<int64_t> &offsets =
      exe_.programs[size_t(exe_.programOf(opts_.rank))].memory.offsets;
  std::vector<int32_t> ids;
  for (const auto *list : {&exe_.params, &exe_.states})
    for (int32_t id : *list)
      if (offsets[size_t(id)] >= 0)
        ids.push_back(id);
  return ids;
}

} // namespace dlopt::rt
