//===- Executable.cpp - Types, attribute getters and validation -----------===//
//
// validate() is the gate every reader goes through, so it assumes nothing
// about its input: every index is range-checked and every size computation is
// overflow-checked before it is used.
//
//===----------------------------------------------------------------------===//

#include "runtime/format/Executable.h"
#include "runtime/format/CommOrder.h"
#include "runtime/format/FusedProgram.h"
#include "runtime/format/OpTable.h"
#include "runtime/format/MemoryPlanner.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace dlopt::rt {

std::string TensorType::str() const {
  std::string s;
  for (int64_t d : shape) {
    s += std::to_string(d);
    s += 'x';
  }
  s += dtypeName(dtype);
  return s;
}

const char *valueKindName(ValueKind kind) {
  switch (kind) {
  case ValueKind::Param: return "param";
  case ValueKind::Input: return "input";
  case ValueKind::Const: return "const";
  case ValueKind::Temp: return "temp";
  case ValueKind::State: return "state";
  }
  return "?";
}

Expected<TensorType> parseTensorType(const std::string &text) {
  TensorType t;
  size_t pos = 0;
  while (true) {
    size_t x = text.find('x', pos);
    if (x == std::string::npos)
      break;
    std::string dim = text.substr(pos, x - pos);
    if (dim.empty() || dim.size() > 15 ||
        dim.find_first_not_of("0123456789") != std::string::npos)
      return Status::error("bad tensor type '" + text + "': dimension '" +
                           dim + "' is not a non-negative integer");
    t.shape.push_back(std::stoll(dim));
    pos = x + 1;
  }
  auto dt = parseDType(std::string_view(text).substr(pos));
  if (!dt)
    return Status::error("bad tensor type '" + text + "': unknown element "
                         "type '" + text.substr(pos) +
                         "' (expected f32, f16, bf16, i32, i64 or i1)");
  t.dtype = *dt;
  return t;
}

uint64_t fnv1a64(const uint8_t *data, size_t size) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; ++i) {
    h ^= data[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

//===----------------------------------------------------------------------===//
// Instr attribute getters
//===----------------------------------------------------------------------===//

namespace {

const char *attrKindName(const AttrValue &v) {
  switch (v.index()) {
  case 0: return "int";
  case 1: return "float";
  case 2: return "string";
  case 3: return "int list";
  case 4: return "float list";
  }
  return "?";
}

std::string instrWhere(const Instr &in) {
  std::string s = "instruction '" + in.op + "'";
  if (!in.loc.empty())
    s += " at " + in.loc;
  return s;
}

Status missingAttr(const Instr &in, const std::string &name) {
  return Status::error(instrWhere(in) + ": missing attribute '" + name + "'");
}

Status mistypedAttr(const Instr &in, const std::string &name,
                    const char *expected, const AttrValue &got) {
  return Status::error(instrWhere(in) + ": attribute '" + name +
                       "' expected " + expected + ", got " +
                       attrKindName(got));
}

} // namespace

Expected<int64_t> Instr::getInt(const std::string &name) const {
  auto it = attrs.find(name);
  if (it == attrs.end())
    return missingAttr(*this, name);
  if (auto *v = std::get_if<int64_t>(&it->second))
    return *v;
  return mistypedAttr(*this, name, "int", it->second);
}

Expected<double> Instr::getFloat(const std::string &name) const {
  auto it = attrs.find(name);
  if (it == attrs.end())
    return missingAttr(*this, name);
  if (auto *v = std::get_if<double>(&it->second))
    return *v;
  if (auto *v = std::get_if<int64_t>(&it->second))
    return static_cast<double>(*v);
  return mistypedAttr(*this, name, "float", it->second);
}

Expected<std::string> Instr::getString(const std::string &name) const {
  auto it = attrs.find(name);
  if (it == attrs.end())
    return missingAttr(*this, name);
  if (auto *v = std::get_if<std::string>(&it->second))
    return *v;
  return mistypedAttr(*this, name, "string", it->second);
}

Expected<std::vector<int64_t>> Instr::getInts(const std::string &name) const {
  auto it = attrs.find(name);
  if (it == attrs.end())
    return missingAttr(*this, name);
  if (auto *v = std::get_if<std::vector<int64_t>>(&it->second))
    return *v;
  // An empty list has no element type of its own; accept either spelling.
  if (auto *v = std::get_if<std::vector<double>>(&it->second); v && v->empty())
    return std::vector<int64_t>{};
  return mistypedAttr(*this, name, "int list", it->second);
}

int64_t Instr::getInt(const std::string &name, int64_t dflt) const {
  auto it = attrs.find(name);
  if (it == attrs.end())
    return dflt;
  if (auto *v = std::get_if<int64_t>(&it->second))
    return *v;
  return dflt;
}

double Instr::getFloat(const std::string &name, double dflt) const {
  auto it = attrs.find(name);
  if (it == attrs.end())
    return dflt;
  if (auto *v = std::get_if<double>(&it->second))
    return *v;
  if (auto *v = std::get_if<int64_t>(&it->second))
    return static_cast<double>(*v);
  return dflt;
}

bool Instr::getBool(const std::string &name, bool dflt) const {
  auto it = attrs.find(name);
  if (it == attrs.end())
    return dflt;
  if (auto *v = std::get_if<int64_t>(&it->second))
    return *v != 0;
  return dflt;
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

namespace {

/// Sizes beyond this are rejected: no real device has 2^48 bytes, and the
/// bound keeps every offset + size sum far from int64 overflow.
constexpr int64_t kMaxBytes = int64_t(1) << 48;

const char *kindName(ValueKind k) { return valueKindName(k); }

std::string valueRef(const Executable &exe, int64_t id) {
  std::string s = "%" + std::to_string(id);
  if (id >= 0 && id < int64_t(exe.values.size()) &&
      !exe.values[id].name.empty())
    s += " ('" + exe.values[id].name + "')";
  return s;
}

/// Byte size of a type, or -1 if a dim is negative or the size is absurd.
int64_t checkedByteSize(const TensorType &t) {
  int64_t n = dtypeSize(t.dtype);
  if (n == 0)
    return -1;
  for (int64_t d : t.shape) {
    if (d < 0)
      return -1;
    if (d != 0 && n > kMaxBytes / d)
      return -1;
    n *= d;
  }
  return n;
}

bool isKnownDist(const std::string &d) {
  return d == "zeros" || d == "ones" || d == "constant" || d == "normal" ||
         d == "truncated_normal" || d == "uniform";
}

std::string ranksText(const std::vector<int32_t> &ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i)
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8)
    s += ", ... (" + std::to_string(ranks.size()) + " ranks)";
  return s;
}

/// A communication instruction against its group (the shape rule is
/// commResultType, runtime/format/OpTable.h).
Status validateCommunication(const Executable &exe, const Instr &in,
                             const std::string &iw) {
  auto attrInt = [&](const char *name) -> Expected<int64_t> {
    Expected<int64_t> v = in.getInt(name);
    if (!v)
      return Status::error(iw + v.status().message());
    return v;
  };
  Expected<int64_t> group = attrInt("group");
  if (!group)
    return group.status();
  if (*group < 0 || size_t(*group) >= exe.groups.size())
    return Status::error(iw + "group " + std::to_string(*group) +
                         " is not in the group table (" +
                         std::to_string(exe.groups.size()) + " groups)");
  int64_t n = exe.groupSize(int32_t(*group));
  if (in.op == "send" || in.op == "recv") {
    // The pairing is checked across ranks (checkCommunicationOrder).
    Expected<int64_t> peer = attrInt("peer");
    if (!peer)
      return peer.status();
    if (*peer < 0 || *peer >= n)
      return Status::error(iw + "peer " + std::to_string(*peer) +
                           " is outside the group of " + std::to_string(n));
    return Status::ok();
  }
  if (in.op == "send_recv") {
    for (const char *name : {"send_peers", "recv_peers"}) {
      Expected<std::vector<int64_t>> peers = in.getInts(name);
      if (!peers)
        return Status::error(iw + peers.status().message());
      for (int64_t p : *peers)
        if (p >= n)
          return Status::error(iw + "peer " + std::to_string(p) + " in '" +
                               name + "' is outside the group of " +
                               std::to_string(n));
    }
    return Status::ok();
  }
  // verifyInstr checked the counts and element types already.
  const TensorType &x = exe.values[in.operands[0]].type;
  const TensorType &y = exe.values[in.results[0]].type;
  Expected<TensorType> want = commResultType(in, x, n);
  if (!want)
    return Status::error(iw + want.status().message());
  if (*want == y)
    return Status::ok();
  return Status::error(iw + "expects a " + want->str() + " result for a " +
                       x.str() + " operand over a group of " +
                       std::to_string(n) + ", got " + y.str());
}

Status validateProgram(const Executable &exe, size_t r,
                       const std::vector<int64_t> &sizes) {
  const Program &prog = exe.programs[r];
  std::string where = "program " + std::to_string(r) + " (ranks " +
                      ranksText(prog.ranks) + "): ";
  const MemoryPlan &mem = prog.memory;
  size_t numValues = exe.values.size();

  if (mem.alignment < 1 || (mem.alignment & (mem.alignment - 1)) != 0)
    return Status::error(where + "memory alignment must be a power of two, "
                                 "got " + std::to_string(mem.alignment));
  if (mem.persistentBytes < 0 || mem.scratchBytes < 0 ||
      mem.persistentBytes > kMaxBytes || mem.scratchBytes > kMaxBytes)
    return Status::error(where + "memory plan has invalid sizes (persistent " +
                         std::to_string(mem.persistentBytes) + ", scratch " +
                         std::to_string(mem.scratchBytes) + ")");
  if (mem.offsets.size() != numValues)
    return Status::error(where + "memory plan has " +
                         std::to_string(mem.offsets.size()) +
                         " offsets, expected one per value (" +
                         std::to_string(numValues) + ")");
  int64_t total = mem.totalBytes();
  for (size_t v = 0; v < numValues; ++v) {
    int64_t off = mem.offsets[v];
    if (off == -1)
      continue;
    if (off < 0 || off > kMaxBytes)
      return Status::error(where + "value " + valueRef(exe, v) +
                           " has invalid offset " + std::to_string(off));
    if (off % mem.alignment != 0)
      return Status::error(where + "value " + valueRef(exe, v) + " offset " +
                           std::to_string(off) + " is not aligned to " +
                           std::to_string(mem.alignment));
    if (off + sizes[v] > total)
      return Status::error(
          where + "value " + valueRef(exe, v) + " at offset " +
          std::to_string(off) + " with " + std::to_string(sizes[v]) +
          " bytes ends past the arena (" + std::to_string(total) + " bytes)");
  }

  // Def-before-use, single definition, and lifetimes for the overlap check.
  int64_t n = int64_t(prog.instrs.size());
  std::vector<int64_t> defAt(numValues, -1), lastUse(numValues, -1);
  for (int64_t i = 0; i < n; ++i) {
    const Instr &in = prog.instrs[i];
    std::string iw = where + "instruction " + std::to_string(i) + " ('" +
                     in.op + "'" + (in.loc.empty() ? "" : " at " + in.loc) +
                     "): ";
    if (in.op.empty())
      return Status::error(iw + "empty op name");
    for (int32_t id : in.operands) {
      if (id < 0 || size_t(id) >= numValues)
        return Status::error(iw + "operand id " + std::to_string(id) +
                             " out of range [0, " + std::to_string(numValues) +
                             ")");
      if (exe.values[id].kind == ValueKind::Temp && defAt[id] < 0)
        return Status::error(iw + "operand " + valueRef(exe, id) +
                             " is used before it is defined" +
                             definedElsewhere(exe, prog, id));
      if (mem.offsets[id] < 0)
        return Status::error(iw + "operand " + valueRef(exe, id) +
                             " has no offset in this rank's memory plan");
      lastUse[id] = i;
    }
    for (int32_t id : in.results) {
      if (id < 0 || size_t(id) >= numValues)
        return Status::error(iw + "result id " + std::to_string(id) +
                             " out of range [0, " + std::to_string(numValues) +
                             ")");
      if (exe.values[id].kind != ValueKind::Temp)
        return Status::error(iw + "result " + valueRef(exe, id) + " is a " +
                             kindName(exe.values[id].kind) +
                             "; only temporaries can be defined");
      if (defAt[id] >= 0)
        return Status::error(iw + "result " + valueRef(exe, id) +
                             " is already defined by instruction " +
                             std::to_string(defAt[id]));
      if (mem.offsets[id] < 0)
        return Status::error(iw + "result " + valueRef(exe, id) +
                             " has no offset in this rank's memory plan");
      if (std::find(in.operands.begin(), in.operands.end(), id) !=
          in.operands.end())
        return Status::error(iw + "result " + valueRef(exe, id) +
                             " is also an operand");
      defAt[id] = i;
      lastUse[id] = i;
    }
    {
      std::vector<TensorType> ot, rt;
      for (int32_t id : in.operands)
        ot.push_back(exe.values[id].type);
      for (int32_t id : in.results)
        rt.push_back(exe.values[id].type);
      Status st = verifyInstr(in, ot, rt);
      if (!st) {
        // `iw` names the op and its location already.
        std::string msg = st.message();
        std::string self = "op '" + in.op + "'" +
                           (in.loc.empty() ? "" : " at " + in.loc) + ": ";
        if (msg.rfind(self, 0) == 0)
          msg = msg.substr(self.size());
        return Status::error(iw + msg);
      }
    }
    if (isCommunicationOp(in.op))
      DLOPT_RETURN_IF_ERROR(validateCommunication(exe, in, iw));
  }
  // Outputs this rank defines stay live to the end so they can be read back.
  for (int32_t id : exe.outputs)
    if (defAt[id] >= 0)
      lastUse[id] = n;

  // Persistent values are live over the whole program; temporaries over
  // [definition, last use]. Nothing live at the same time may share bytes.
  // An in-place update (findInPlaceUpdates) may take its argument's bytes
  // from its defining instruction on; the argument is dead from there.
  std::vector<int64_t> persistentEnd(numValues, n);
  std::vector<bool> inPlaceValue(numValues, false);
  for (auto [t, a] : findInPlaceUpdates(exe, prog)) {
    inPlaceValue[size_t(t)] = inPlaceValue[size_t(a)] = true;
    if (mem.offsets[t] == mem.offsets[a] && defAt[t] >= 0)
      persistentEnd[a] = defAt[t] - 1;
  }
  // A reshape result at its operand's offset is a view of it (the memory
  // planner's viewReshapes): both temporaries, neither an in-place update
  // nor an output, the same size. The two are one buffer, live from the
  // operand's definition to the last use of either.
  std::vector<int32_t> viewOf(numValues, -1);
  {
    std::vector<bool> isOutput(numValues, false);
    for (int32_t id : exe.outputs)
      isOutput[size_t(id)] = true;
    auto viewable = [&](int32_t id) {
      return exe.values[size_t(id)].kind == ValueKind::Temp &&
             !inPlaceValue[size_t(id)] && !isOutput[size_t(id)] &&
             defAt[size_t(id)] >= 0;
    };
    for (const Instr &in : prog.instrs) {
      if (in.op != "reshape" || in.operands.size() != 1 ||
          in.results.size() != 1)
        continue;
      int32_t x = in.operands[0], y = in.results[0];
      if (mem.offsets[x] < 0 || mem.offsets[y] != mem.offsets[x] ||
          sizes[x] != sizes[y] || !viewable(x) || !viewable(y))
        continue;
      int32_t root = viewOf[size_t(x)] >= 0 ? viewOf[size_t(x)] : x;
      viewOf[size_t(y)] = root;
      lastUse[size_t(root)] = std::max(lastUse[size_t(root)], lastUse[size_t(y)]);
    }
  }
  std::vector<BufferLifetime> lifetimes;
  std::vector<int64_t> offsets;
  std::vector<size_t> ids;
  for (size_t v = 0; v < numValues; ++v) {
    if (mem.offsets[v] < 0 || sizes[v] == 0 || viewOf[v] >= 0)
      continue;
    BufferLifetime b;
    b.size = sizes[v];
    if (exe.values[v].kind != ValueKind::Temp) {
      b.firstUse = -1;
      b.lastUse = persistentEnd[v];
    } else if (defAt[v] >= 0) {
      b.firstUse = defAt[v];
      b.lastUse = lastUse[v];
    } else {
      continue; // held but never defined here: never live
    }
    lifetimes.push_back(b);
    offsets.push_back(mem.offsets[v]);
    ids.push_back(v);
  }
  auto conflict = findMemoryConflict(lifetimes, offsets);
  if (conflict) {
    size_t a = ids[conflict->first], b = ids[conflict->second];
    return Status::error(
        where + "memory plan overlaps live values " + valueRef(exe, a) +
        " [" + std::to_string(mem.offsets[a]) + ", " +
        std::to_string(mem.offsets[a] + sizes[a]) + ") and " +
        valueRef(exe, b) + " [" + std::to_string(mem.offsets[b]) + ", " +
        std::to_string(mem.offsets[b] + sizes[b]) + ")");
  }
  return Status::ok();
}

/// The mesh multiplies to the world size; group axes are mesh axes.
Status validateMesh(const Executable &exe) {
  const Mesh &m = exe.mesh;
  if (m.axes.size() != m.shape.size())
    return Status::error("mesh has " + std::to_string(m.axes.size()) +
                         " axis names but " + std::to_string(m.shape.size()) +
                         " sizes");
  if (m.axes.size() > 8)
    return Status::error("mesh has " + std::to_string(m.axes.size()) +
                         " axes; at most 8 are supported");
  int64_t n = 1;
  for (size_t a = 0; a < m.shape.size(); ++a) {
    if (m.shape[a] < 1 || m.shape[a] > (1 << 20))
      return Status::error("mesh axis '" + m.axes[a] + "' has size " +
                           std::to_string(m.shape[a]) +
                           "; expected 1 to 1048576");
    for (size_t b = 0; b < a; ++b)
      if (m.axes[b] == m.axes[a])
        return Status::error("mesh axis '" + m.axes[a] + "' appears twice");
    n *= m.shape[a];
    if (n > (1 << 20))
      return Status::error("mesh has more than 1048576 ranks");
  }
  if (n != exe.worldSize)
    return Status::error("mesh " + std::to_string(n) +
                         " ranks but world size " +
                         std::to_string(exe.worldSize));
  for (size_t g = 0; g < exe.groups.size(); ++g) {
    const CommGroup &cg = exe.groups[g];
    for (size_t i = 0; i < cg.axes.size(); ++i)
      if (cg.axes[i] < 0 || size_t(cg.axes[i]) >= m.axes.size() ||
          (i && cg.axes[i] <= cg.axes[i - 1]))
        return Status::error("group " + std::to_string(g) + " ('" + cg.name +
                             "'): axes must be increasing mesh axis indices "
                             "in [0, " + std::to_string(m.axes.size()) + ")");
  }
  return Status::ok();
}

/// A global layout splits each dim over distinct mesh axes, evenly, into
/// exactly the local type.
Status validateGlobal(const Executable &exe, size_t v) {
  const Value &val = exe.values[v];
  const GlobalLayout &g = *val.global;
  std::string where = "value " + valueRef(exe, v) + ": global layout: ";
  if (val.kind == ValueKind::Temp || val.kind == ValueKind::Const) {
    bool output = false;
    for (int32_t o : exe.outputs)
      output |= o == int32_t(v);
    if (!output)
      return Status::error(where + "only params, inputs, states and outputs "
                                   "have one");
  }
  if (g.type.dtype != val.type.dtype ||
      g.type.shape.size() != val.type.shape.size() ||
      g.split.size() != val.type.shape.size())
    return Status::error(where + "global type " + g.type.str() + " with " +
                         std::to_string(g.split.size()) +
                         " split lists does not match the local type " +
                         val.type.str());
  if (checkedByteSize(g.type) < 0)
    return Status::error(where + "global type " + g.type.str() +
                         " is invalid or too large");
  std::vector<bool> used(exe.mesh.axes.size(), false);
  for (size_t d = 0; d < g.split.size(); ++d) {
    int64_t parts = 1;
    for (int32_t a : g.split[d]) {
      if (a < 0 || size_t(a) >= used.size() || used[size_t(a)])
        return Status::error(where + "dim " + std::to_string(d) +
                             " names mesh axis " + std::to_string(a) +
                             ", which is out of range or used twice");
      used[size_t(a)] = true;
      parts *= exe.mesh.shape[size_t(a)];
    }
    if (g.type.shape[d] % parts || g.type.shape[d] / parts != val.type.shape[d])
      return Status::error(where + "dim " + std::to_string(d) + " of " +
                           g.type.str() + " split " + std::to_string(parts) +
                           " ways is not the local " + val.type.str());
  }
  return Status::ok();
}

/// Output updates: each names a param or state of the output's exact type,
/// and no param or state is updated twice.
Status validateUpdates(const Executable &exe) {
  if (exe.outputUpdates.empty())
    return Status::ok();
  if (exe.outputUpdates.size() != exe.outputs.size())
    return Status::error("there are " + std::to_string(exe.outputs.size()) +
                         " outputs but " +
                         std::to_string(exe.outputUpdates.size()) +
                         " output updates (expected one per output, or none)");
  std::map<std::string, int32_t> updatable; // name -> value id
  for (const auto *list : {&exe.params, &exe.states})
    for (int32_t id : *list)
      updatable[exe.values[id].name] = id;
  std::map<std::string, size_t> updatedBy;
  for (size_t i = 0; i < exe.outputs.size(); ++i) {
    const std::string &target = exe.outputUpdates[i];
    if (target.empty())
      continue;
    std::string where = "output '" + exe.outputNames[i] + "' updates '" +
                        target + "'";
    auto it = updatable.find(target);
    if (it == updatable.end())
      return Status::error(where + ", which is not a param or state");
    const TensorType &want = exe.values[it->second].type;
    const TensorType &got = exe.values[exe.outputs[i]].type;
    if (!(want == got))
      return Status::error(where + ": the " +
                           kindName(exe.values[it->second].kind) + " is " +
                           want.str() + ", the output is " + got.str());
    auto [prev, fresh] = updatedBy.emplace(target, i);
    if (!fresh)
      return Status::error(where + ", which output '" +
                           exe.outputNames[prev->second] +
                           "' already updates");
  }
  return Status::ok();
}

} // namespace

Status Executable::validate() const {
  if (version != kExecutableFormatVersion)
    return Status::error("executable version " + std::to_string(version) +
                         ", this dlopt reads version " +
                         std::to_string(kExecutableFormatVersion));
  if (worldSize < 1)
    return Status::error("world size must be at least 1, got " +
                         std::to_string(worldSize));
  if (worldSize > (1 << 20))
    return Status::error("world size " + std::to_string(worldSize) +
                         " is above the limit of 1048576 ranks");
  DLOPT_RETURN_IF_ERROR(validateMesh(*this));
  if (programs.empty() || programs.size() > size_t(worldSize))
    return Status::error("world size is " + std::to_string(worldSize) +
                         " but there are " + std::to_string(programs.size()) +
                         " programs (expected 1 to " +
                         std::to_string(worldSize) + ")");
  std::vector<int32_t> owner(size_t(worldSize), -1);
  for (size_t p = 0; p < programs.size(); ++p) {
    if (programs[p].ranks.empty())
      return Status::error("program " + std::to_string(p) + " runs on no rank");
    for (int32_t r : programs[p].ranks) {
      if (r < 0 || r >= worldSize)
        return Status::error("program " + std::to_string(p) + " names rank " +
                             std::to_string(r) + ", outside [0, " +
                             std::to_string(worldSize) + ")");
      if (owner[size_t(r)] >= 0)
        return Status::error("rank " + std::to_string(r) + " runs programs " +
                             std::to_string(owner[size_t(r)]) + " and " +
                             std::to_string(p) + "; each rank runs one");
      owner[size_t(r)] = int32_t(p);
    }
  }
  for (size_t r = 0; r < owner.size(); ++r)
    if (owner[r] < 0)
      return Status::error("rank " + std::to_string(r) + " of " +
                           std::to_string(worldSize) + " runs no program");

  std::vector<int64_t> sizes(values.size());
  for (size_t v = 0; v < values.size(); ++v) {
    const Value &val = values[v];
    int64_t bytes = checkedByteSize(val.type);
    if (bytes < 0)
      return Status::error("value " + valueRef(*this, v) +
                           " has an invalid or too large type");
    sizes[v] = bytes;
    if (uint8_t(val.kind) > uint8_t(ValueKind::State))
      return Status::error("value " + valueRef(*this, v) +
                           " has an unknown kind");
    if (val.constSplat && val.kind != ValueKind::Const)
      return Status::error("value " + valueRef(*this, v) +
                           " is marked const_splat but is not a constant");
    if (val.kind == ValueKind::Const) {
      int64_t stored = val.constSplat ? dtypeSize(val.type.dtype) : bytes;
      if (val.constOffset < 0 || val.constOffset > int64_t(constData.size()) ||
          stored > int64_t(constData.size()) - val.constOffset)
        return Status::error(
            "constant " + valueRef(*this, v) + " (" +
            std::to_string(stored) + " bytes at offset " +
            std::to_string(val.constOffset) +
            ") lies outside the constant data (" +
            std::to_string(constData.size()) + " bytes)");
    }
    if (val.global)
      DLOPT_RETURN_IF_ERROR(validateGlobal(*this, v));
    if (val.kind == ValueKind::Param || val.kind == ValueKind::State) {
      const Init &init = val.init;
      std::string what = kindName(val.kind);
      if (!isKnownDist(init.dist))
        return Status::error(what + " " + valueRef(*this, v) +
                             " has unknown init distribution '" + init.dist +
                             "' (expected zeros, ones, constant, normal, "
                             "truncated_normal or uniform)");
      if ((init.dist == "normal" || init.dist == "truncated_normal") &&
          !(init.std >= 0))
        return Status::error(what + " " + valueRef(*this, v) +
                             " init std must be >= 0");
      if (init.dist == "uniform" && !(init.low <= init.high))
        return Status::error(what + " " + valueRef(*this, v) +
                             " init needs low <= high");
    }
  }

  // Params, inputs and states: every such value listed exactly once, names
  // unique among all of them (they are bound and checkpointed by name).
  std::set<std::string> argNames;
  auto checkArgList = [&](const std::vector<int32_t> &list, ValueKind kind,
                          const char *what) -> Status {
    std::vector<int> seen(values.size(), 0);
    for (int32_t id : list) {
      if (id < 0 || size_t(id) >= values.size())
        return Status::error(std::string(what) + " list has value id " +
                             std::to_string(id) + " out of range");
      if (values[id].kind != kind)
        return Status::error(std::string(what) + " list names " +
                             valueRef(*this, id) + " which is a " +
                             kindName(values[id].kind));
      if (seen[id]++)
        return Status::error(std::string(what) + " list names " +
                             valueRef(*this, id) + " twice");
      const std::string &name = values[id].name;
      if (name.empty())
        return Status::error(std::string(what) + " " + valueRef(*this, id) +
                             " has no name");
      if (!argNames.insert(name).second)
        return Status::error("two params/inputs/states are named '" + name +
                             "'");
    }
    for (size_t v = 0; v < values.size(); ++v)
      if (values[v].kind == kind && !seen[v])
        return Status::error(std::string(what) + " " + valueRef(*this, v) +
                             " is missing from the " + what + " list");
    return Status::ok();
  };
  DLOPT_RETURN_IF_ERROR(checkArgList(params, ValueKind::Param, "param"));
  DLOPT_RETURN_IF_ERROR(checkArgList(inputs, ValueKind::Input, "input"));
  DLOPT_RETURN_IF_ERROR(checkArgList(states, ValueKind::State, "state"));

  if (outputNames.size() != outputs.size())
    return Status::error("there are " + std::to_string(outputs.size()) +
                         " outputs but " + std::to_string(outputNames.size()) +
                         " output names");
  std::set<std::string> outNames;
  for (size_t i = 0; i < outputs.size(); ++i) {
    int32_t id = outputs[i];
    if (id < 0 || size_t(id) >= values.size())
      return Status::error("output " + std::to_string(i) + " has value id " +
                           std::to_string(id) + " out of range");
    if (outputNames[i].empty())
      return Status::error("output " + std::to_string(i) + " has no name");
    if (!outNames.insert(outputNames[i]).second)
      return Status::error("two outputs are named '" + outputNames[i] + "'");
  }
  DLOPT_RETURN_IF_ERROR(validateUpdates(*this));

  for (size_t r = 0; r < programs.size(); ++r)
    DLOPT_RETURN_IF_ERROR(validateProgram(*this, r, sizes));

  // A temporary output must be produced by some rank.
  std::vector<bool> defined(values.size(), false);
  for (const Program &p : programs)
    for (const Instr &in : p.instrs)
      for (int32_t res : in.results)
        defined[res] = true;
  for (size_t i = 0; i < outputs.size(); ++i) {
    int32_t id = outputs[i];
    if (values[id].kind == ValueKind::Temp && !defined[id])
      return Status::error("output '" + outputNames[i] + "' (" +
                           valueRef(*this, id) +
                           ") is not defined by any instruction");
  }
  // Sends meet receives, collectives agree, and nothing can hang.
  return checkCommunicationOrder(*this);
}


std::string definedElsewhere(const Executable &exe, const Program &self,
                             int32_t id) {
  for (size_t p = 0; p < exe.programs.size(); ++p) {
    const Program &other = exe.programs[p];
    if (&other == &self)
      continue;
    for (const Instr &in : other.instrs)
      for (int32_t res : in.results)
        if (res == id)
          return " (defined by program " + std::to_string(p) + " on ranks " +
                 ranksText(other.ranks) +
                 "; a value another pipeline stage computes must arrive by "
                 "send/recv)";
  }
  return "";
}

std::vector<int64_t> Mesh::coords(int64_t rank) const {
  std::vector<int64_t> c(shape.size());
  for (size_t a = shape.size(); a-- > 0;) {
    c[a] = rank % shape[a];
    rank /= shape[a];
  }
  return c;
}

int32_t Executable::programOf(int32_t rank) const {
  for (size_t p = 0; p < programs.size(); ++p)
    for (int32_t r : programs[p].ranks)
      if (r == rank)
        return int32_t(p);
  return -1;
}

int64_t Executable::groupSize(int32_t group) const {
  int64_t n = 1;
  for (int32_t a : groups[size_t(group)].axes)
    n *= mesh.shape[size_t(a)];
  return n;
}

int32_t Executable::groupMember(int32_t group, int32_t rank, int64_t index) const {
  // `rank`'s coordinates with the group's axes set to `index` (row-major).
  const std::vector<int32_t> &axes = groups[size_t(group)].axes;
  std::vector<int64_t> c = mesh.coords(rank);
  for (size_t k = axes.size(); k-- > 0;) {
    int64_t s = mesh.shape[size_t(axes[k])];
    c[size_t(axes[k])] = index % s;
    index /= s;
  }
  int64_t r = 0;
  for (size_t a = 0; a < c.size(); ++a)
    r = r * mesh.shape[a] + c[a];
  return int32_t(r);
}

std::vector<int32_t> Executable::groupRanks(int32_t group, int32_t rank) const {
  int64_t n = groupSize(group);
  std::vector<int32_t> out;
  out.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i)
    out.push_back(groupMember(group, rank, i));
  return out;
}

} // namespace dlopt::rt
