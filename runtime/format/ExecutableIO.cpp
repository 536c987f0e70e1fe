//===- ExecutableIO.cpp - The on-disk encoding of plan files --------------===//
//
// Layout (docs/executable-format.md): a 32-byte little-endian header
//   "DLOPTEXE" | u32 version | u32 flags | u64 payload size | u64 FNV-1a-64
// followed by the payload
//   u64 JSON length | JSON document | u64 constant bytes | constant blob.
// The header is checked before the payload is trusted, so the common
// failures (wrong file, other version, truncation, corruption) get a precise
// message instead of a JSON parse error. nlohmann::json throws; every call is
// wrapped so nothing escapes this file.
//
//===----------------------------------------------------------------------===//

#include "runtime/format/Executable.h"

#include "runtime/support/FileRead.h"
#include "runtime/support/JsonLimits.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace dlopt::rt {

namespace {

using Json = nlohmann::ordered_json;

/// Largest executable file read; its size is checked before reading.
constexpr uint64_t kMaxExecutableBytes = uint64_t(1) << 40;

constexpr char kMagic[8] = {'D', 'L', 'O', 'P', 'T', 'E', 'X', 'E'};

void putU32(std::vector<uint8_t> &out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(uint8_t(v >> (8 * i)));
}
void putU64(std::vector<uint8_t> &out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(uint8_t(v >> (8 * i)));
}
uint32_t getU32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= uint32_t(p[i]) << (8 * i);
  return v;
}
uint64_t getU64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= uint64_t(p[i]) << (8 * i);
  return v;
}

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%016llx", (unsigned long long)v);
  return buf;
}

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

/// JSON has no NaN/Inf, so non-finite doubles are written as strings.
Json doubleToJson(double d) {
  if (std::isnan(d))
    return "nan";
  if (std::isinf(d))
    return d > 0 ? "inf" : "-inf";
  return d;
}

Json attrToJson(const AttrValue &v) {
  Json j = Json::object();
  switch (v.index()) {
  case 0: j["int"] = std::get<int64_t>(v); break;
  case 1: j["float"] = doubleToJson(std::get<double>(v)); break;
  case 2: j["str"] = std::get<std::string>(v); break;
  case 3: j["ints"] = std::get<std::vector<int64_t>>(v); break;
  case 4: {
    Json list = Json::array();
    for (double d : std::get<std::vector<double>>(v))
      list.push_back(doubleToJson(d));
    j["floats"] = list;
    break;
  }
  }
  return j;
}

Json initToJson(const Init &init) {
  Json j = Json::object();
  j["dist"] = init.dist;
  j["mean"] = doubleToJson(init.mean);
  j["std"] = doubleToJson(init.std);
  j["low"] = doubleToJson(init.low);
  j["high"] = doubleToJson(init.high);
  j["value"] = doubleToJson(init.value);
  return j;
}

Json toJson(const Executable &exe) {
  Json j = Json::object();
  j["format"] = "dlopt-executable";
  j["model"] = exe.modelName;
  j["source"] = exe.source;
  j["world_size"] = exe.worldSize;
  j["mesh"] = {{"axes", exe.mesh.axes}, {"shape", exe.mesh.shape}};
  Json groups = Json::array();
  for (const CommGroup &g : exe.groups) {
    Json axes = Json::array();
    for (int32_t a : g.axes)
      axes.push_back(exe.mesh.axes[size_t(a)]);
    groups.push_back({{"name", g.name}, {"axes", std::move(axes)}});
  }
  j["groups"] = std::move(groups);
  Json values = Json::array();
  for (const Value &v : exe.values) {
    Json jv = Json::object();
    jv["kind"] = valueKindName(v.kind);
    if (!v.name.empty())
      jv["name"] = v.name;
    jv["type"] = v.type.str();
    // Only params and states use their init; write it elsewhere only when
    // it was set, so reading back gives an identical Executable.
    if (v.kind == ValueKind::Param || v.kind == ValueKind::State ||
        !(v.init == Init()))
      jv["init"] = initToJson(v.init);
    if (v.constOffset != -1)
      jv["const_offset"] = v.constOffset;
    if (v.constSplat)
      jv["const_splat"] = true;
    if (v.global) {
      Json split = Json::array();
      for (const std::vector<int32_t> &axes : v.global->split) {
        Json names = Json::array();
        for (int32_t a : axes)
          names.push_back(exe.mesh.axes[size_t(a)]);
        split.push_back(std::move(names));
      }
      jv["global"] = {{"type", v.global->type.str()},
                      {"split", std::move(split)}};
    }
    values.push_back(std::move(jv));
  }
  j["values"] = std::move(values);
  j["params"] = exe.params;
  j["inputs"] = exe.inputs;
  j["states"] = exe.states;
  j["outputs"] = exe.outputs;
  j["output_names"] = exe.outputNames;
  j["output_updates"] = exe.outputUpdates;
  j["const_bytes"] = exe.constData.size();
  if (exe.prediction)
    j["prediction"] = {{"cluster", exe.prediction->cluster},
                       {"step_time_s", exe.prediction->stepSeconds},
                       {"memory_bytes", exe.prediction->memoryBytes}};
  Json programs = Json::array();
  for (const Program &p : exe.programs) {
    Json jp = Json::object();
    jp["ranks"] = p.ranks;
    Json mem = Json::object();
    mem["alignment"] = p.memory.alignment;
    mem["persistent_bytes"] = p.memory.persistentBytes;
    mem["scratch_bytes"] = p.memory.scratchBytes;
    mem["offsets"] = p.memory.offsets;
    jp["memory"] = std::move(mem);
    Json instrs = Json::array();
    for (const Instr &in : p.instrs) {
      Json ji = Json::object();
      ji["op"] = in.op;
      ji["operands"] = in.operands;
      ji["results"] = in.results;
      if (!in.attrs.empty()) {
        Json attrs = Json::object();
        for (const auto &[name, value] : in.attrs)
          attrs[name] = attrToJson(value);
        ji["attrs"] = std::move(attrs);
      }
      if (in.layer != -1)
        ji["layer"] = in.layer;
      if (!in.loc.empty())
        ji["loc"] = in.loc;
      instrs.push_back(std::move(ji));
    }
    jp["instrs"] = std::move(instrs);
    programs.push_back(std::move(jp));
  }
  j["programs"] = std::move(programs);
  return j;
}

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

/// A schema violation, carrying the JSON path of the offending field.
struct SchemaError {
  std::string message;
};

[[noreturn]] void fail(const std::string &path, const std::string &msg) {
  throw SchemaError{path + ": " + msg};
}

const char *jsonTypeName(const Json &j) { return j.type_name(); }

const Json &field(const Json &obj, const std::string &path, const char *key) {
  if (!obj.is_object())
    fail(path, std::string("expected an object, got ") + jsonTypeName(obj));
  auto it = obj.find(key);
  if (it == obj.end())
    fail(path, std::string("missing field '") + key + "'");
  return *it;
}

const Json *optField(const Json &obj, const char *key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

int64_t asInt(const Json &j, const std::string &path) {
  if (j.is_number_integer())
    return j.get<int64_t>();
  if (j.is_number_unsigned()) {
    uint64_t u = j.get<uint64_t>();
    if (u > uint64_t(INT64_MAX))
      fail(path, "integer out of range");
    return int64_t(u);
  }
  fail(path, std::string("expected an integer, got ") + jsonTypeName(j));
}

int32_t asInt32(const Json &j, const std::string &path) {
  int64_t v = asInt(j, path);
  if (v < INT32_MIN || v > INT32_MAX)
    fail(path, "integer out of 32-bit range");
  return int32_t(v);
}

double asDouble(const Json &j, const std::string &path) {
  if (j.is_number())
    return j.get<double>();
  if (j.is_string()) {
    const std::string &s = j.get_ref<const std::string &>();
    if (s == "nan")
      return NAN;
    if (s == "inf")
      return INFINITY;
    if (s == "-inf")
      return -INFINITY;
  }
  fail(path, std::string("expected a number, got ") + jsonTypeName(j));
}

std::string asString(const Json &j, const std::string &path) {
  if (!j.is_string())
    fail(path, std::string("expected a string, got ") + jsonTypeName(j));
  return j.get<std::string>();
}

const Json &asArray(const Json &j, const std::string &path) {
  if (!j.is_array())
    fail(path, std::string("expected an array, got ") + jsonTypeName(j));
  return j;
}

std::vector<int32_t> asIds(const Json &j, const std::string &path) {
  std::vector<int32_t> out;
  size_t i = 0;
  for (const Json &e : asArray(j, path))
    out.push_back(asInt32(e, path + "[" + std::to_string(i++) + "]"));
  return out;
}

AttrValue attrFromJson(const Json &j, const std::string &path) {
  if (!j.is_object() || j.size() != 1)
    fail(path, "expected an object with one of the keys int, float, str, "
               "ints, floats");
  auto it = j.begin();
  const std::string &tag = it.key();
  std::string p = path + "." + tag;
  if (tag == "int")
    return asInt(*it, p);
  if (tag == "float")
    return asDouble(*it, p);
  if (tag == "str")
    return asString(*it, p);
  if (tag == "ints") {
    std::vector<int64_t> v;
    size_t i = 0;
    for (const Json &e : asArray(*it, p))
      v.push_back(asInt(e, p + "[" + std::to_string(i++) + "]"));
    return v;
  }
  if (tag == "floats") {
    std::vector<double> v;
    size_t i = 0;
    for (const Json &e : asArray(*it, p))
      v.push_back(asDouble(e, p + "[" + std::to_string(i++) + "]"));
    return v;
  }
  fail(path, "unknown attribute tag '" + tag +
                 "' (expected int, float, str, ints or floats)");
}

Executable fromJson(const Json &j) {
  Executable exe;
  if (!j.is_object())
    fail("document", std::string("expected an object, got ") + jsonTypeName(j));
  std::string format = asString(field(j, "document", "format"), "format");
  if (format != "dlopt-executable")
    fail("format", "expected 'dlopt-executable', got '" + format + "'");
  exe.modelName = asString(field(j, "document", "model"), "model");
  exe.source = asString(field(j, "document", "source"), "source");
  exe.worldSize = asInt32(field(j, "document", "world_size"), "world_size");
  {
    const Json &mesh = field(j, "document", "mesh");
    const Json &axes = asArray(field(mesh, "mesh", "axes"), "mesh.axes");
    const Json &shape = asArray(field(mesh, "mesh", "shape"), "mesh.shape");
    if (axes.size() > 8)
      fail("mesh.axes", "at most 8 axes, got " + std::to_string(axes.size()));
    for (size_t a = 0; a < axes.size(); ++a)
      exe.mesh.axes.push_back(
          asString(axes[a], "mesh.axes[" + std::to_string(a) + "]"));
    for (size_t a = 0; a < shape.size() && a < 8; ++a)
      exe.mesh.shape.push_back(
          asInt(shape[a], "mesh.shape[" + std::to_string(a) + "]"));
  }
  // Mesh axes by name, for groups and global layouts.
  auto axisIndex = [&](const Json &name, const std::string &path) {
    std::string s = asString(name, path);
    for (size_t a = 0; a < exe.mesh.axes.size(); ++a)
      if (exe.mesh.axes[a] == s)
        return int32_t(a);
    fail(path, "'" + s + "' is not a mesh axis");
    return int32_t(-1);
  };
  {
    const Json &groups = asArray(field(j, "document", "groups"), "groups");
    for (size_t g = 0; g < groups.size(); ++g) {
      std::string gp = "groups[" + std::to_string(g) + "]";
      CommGroup cg;
      cg.name = asString(field(groups[g], gp, "name"), gp + ".name");
      const Json &axes = asArray(field(groups[g], gp, "axes"), gp + ".axes");
      for (size_t a = 0; a < axes.size(); ++a)
        cg.axes.push_back(
            axisIndex(axes[a], gp + ".axes[" + std::to_string(a) + "]"));
      exe.groups.push_back(std::move(cg));
    }
  }

  const Json &values = asArray(field(j, "document", "values"), "values");
  exe.values.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    std::string p = "values[" + std::to_string(i) + "]";
    const Json &jv = values[i];
    Value v;
    std::string kind = asString(field(jv, p, "kind"), p + ".kind");
    if (kind == "param")
      v.kind = ValueKind::Param;
    else if (kind == "input")
      v.kind = ValueKind::Input;
    else if (kind == "const")
      v.kind = ValueKind::Const;
    else if (kind == "temp")
      v.kind = ValueKind::Temp;
    else if (kind == "state")
      v.kind = ValueKind::State;
    else
      fail(p + ".kind", "expected param, input, state, const or temp, got '" +
                            kind + "'");
    if (const Json *name = optField(jv, "name"))
      v.name = asString(*name, p + ".name");
    Expected<TensorType> type =
        parseTensorType(asString(field(jv, p, "type"), p + ".type"));
    if (!type)
      fail(p + ".type", type.status().message());
    v.type = *type;
    if (const Json *init = optField(jv, "init")) {
      std::string ip = p + ".init";
      v.init.dist = asString(field(*init, ip, "dist"), ip + ".dist");
      v.init.mean = asDouble(field(*init, ip, "mean"), ip + ".mean");
      v.init.std = asDouble(field(*init, ip, "std"), ip + ".std");
      v.init.low = asDouble(field(*init, ip, "low"), ip + ".low");
      v.init.high = asDouble(field(*init, ip, "high"), ip + ".high");
      v.init.value = asDouble(field(*init, ip, "value"), ip + ".value");
    }
    if (const Json *off = optField(jv, "const_offset"))
      v.constOffset = asInt(*off, p + ".const_offset");
    if (const Json *splat = optField(jv, "const_splat")) {
      if (!splat->is_boolean())
        fail(p + ".const_splat", "expected true or false");
      v.constSplat = splat->get<bool>();
    }
    if (const Json *global = optField(jv, "global")) {
      std::string gp = p + ".global";
      GlobalLayout g;
      Expected<TensorType> gt =
          parseTensorType(asString(field(*global, gp, "type"), gp + ".type"));
      if (!gt)
        fail(gp + ".type", gt.status().message());
      g.type = *gt;
      const Json &split = asArray(field(*global, gp, "split"), gp + ".split");
      for (size_t d = 0; d < split.size(); ++d) {
        std::string dp = gp + ".split[" + std::to_string(d) + "]";
        std::vector<int32_t> axes;
        const Json &names = asArray(split[d], dp);
        for (size_t a = 0; a < names.size(); ++a)
          axes.push_back(axisIndex(names[a], dp + "[" + std::to_string(a) + "]"));
        g.split.push_back(std::move(axes));
      }
      v.global = std::move(g);
    }
    exe.values.push_back(std::move(v));
  }
  exe.params = asIds(field(j, "document", "params"), "params");
  exe.inputs = asIds(field(j, "document", "inputs"), "inputs");
  exe.states = asIds(field(j, "document", "states"), "states");
  exe.outputs = asIds(field(j, "document", "outputs"), "outputs");
  const Json &names =
      asArray(field(j, "document", "output_names"), "output_names");
  for (size_t i = 0; i < names.size(); ++i)
    exe.outputNames.push_back(
        asString(names[i], "output_names[" + std::to_string(i) + "]"));
  const Json &updates =
      asArray(field(j, "document", "output_updates"), "output_updates");
  for (size_t i = 0; i < updates.size(); ++i)
    exe.outputUpdates.push_back(
        asString(updates[i], "output_updates[" + std::to_string(i) + "]"));

  if (const Json *pj = optField(j, "prediction")) {
    Prediction pr;
    pr.cluster = asString(field(*pj, "prediction", "cluster"),
                          "prediction.cluster");
    pr.stepSeconds = asDouble(field(*pj, "prediction", "step_time_s"),
                              "prediction.step_time_s");
    pr.memoryBytes = asDouble(field(*pj, "prediction", "memory_bytes"),
                              "prediction.memory_bytes");
    if (!(pr.stepSeconds >= 0) || !(pr.memoryBytes >= 0))
      fail("prediction", "step_time_s and memory_bytes must be >= 0");
    exe.prediction = pr;
  }

  const Json &programs = asArray(field(j, "document", "programs"), "programs");
  for (size_t r = 0; r < programs.size(); ++r) {
    std::string p = "programs[" + std::to_string(r) + "]";
    const Json &jp = programs[r];
    Program prog;
    prog.ranks = asIds(field(jp, p, "ranks"), p + ".ranks");
    std::string mp = p + ".memory";
    const Json &mem = field(jp, p, "memory");
    prog.memory.alignment = asInt(field(mem, mp, "alignment"), mp + ".alignment");
    prog.memory.persistentBytes =
        asInt(field(mem, mp, "persistent_bytes"), mp + ".persistent_bytes");
    prog.memory.scratchBytes =
        asInt(field(mem, mp, "scratch_bytes"), mp + ".scratch_bytes");
    const Json &offsets = asArray(field(mem, mp, "offsets"), mp + ".offsets");
    prog.memory.offsets.reserve(offsets.size());
    for (size_t i = 0; i < offsets.size(); ++i)
      prog.memory.offsets.push_back(
          asInt(offsets[i], mp + ".offsets[" + std::to_string(i) + "]"));
    const Json &instrs = asArray(field(jp, p, "instrs"), p + ".instrs");
    prog.instrs.reserve(instrs.size());
    for (size_t i = 0; i < instrs.size(); ++i) {
      std::string ip = p + ".instrs[" + std::to_string(i) + "]";
      const Json &ji = instrs[i];
      Instr in;
      in.op = asString(field(ji, ip, "op"), ip + ".op");
      in.operands = asIds(field(ji, ip, "operands"), ip + ".operands");
      in.results = asIds(field(ji, ip, "results"), ip + ".results");
      if (const Json *attrs = optField(ji, "attrs")) {
        if (!attrs->is_object())
          fail(ip + ".attrs", "expected an object");
        for (auto it = attrs->begin(); it != attrs->end(); ++it)
          in.attrs[it.key()] =
              attrFromJson(it.value(), ip + ".attrs." + it.key());
      }
      if (const Json *layer = optField(ji, "layer"))
        in.layer = asInt32(*layer, ip + ".layer");
      if (const Json *loc = optField(ji, "loc"))
        in.loc = asString(*loc, ip + ".loc");
      prog.instrs.push_back(std::move(in));
    }
    exe.programs.push_back(std::move(prog));
  }
  return exe;
}

/// Checks the magic of the first `size` bytes of a file. MLIR text gets a
/// hint; dlopt-gen's comment header can push `func.func` a few hundred
/// bytes in, so the first 4 KiB are searched.
Status checkMagic(const uint8_t *data, size_t size) {
  if (size >= sizeof(kMagic) && std::memcmp(data, kMagic, 8) == 0)
    return Status::ok();
  std::string msg = "not a dlopt plan file (bad magic)";
  std::string head(data, data + std::min<size_t>(size, 4096));
  if (head.find("func.func") != std::string::npos ||
      head.find("module {") != std::string::npos ||
      head.find("module attributes") != std::string::npos ||
      head.find("dlopt.") != std::string::npos)
    msg += "; this looks like MLIR text: compile it with dlopt-compile first";
  return Status::error(msg);
}

Expected<Executable> deserializeImpl(const std::vector<uint8_t> &bytes) {
  size_t size = bytes.size();
  DLOPT_RETURN_IF_ERROR(checkMagic(bytes.data(), size));
  if (size < kExecutableHeaderSize)
    return Status::error("truncated: file has " + std::to_string(size) +
                         " bytes, the header alone needs " +
                         std::to_string(kExecutableHeaderSize));
  const uint8_t *p = bytes.data();
  uint32_t version = getU32(p + 8);
  uint32_t flags = getU32(p + 12);
  uint64_t payloadSize = getU64(p + 16);
  uint64_t checksum = getU64(p + 24);
  if (version != kExecutableFormatVersion)
    return Status::error("plan file format version " + std::to_string(version) +
                         ", this dlopt reads version " +
                         std::to_string(kExecutableFormatVersion) +
                         " (recompile the model with this dlopt)");
  if (flags != 0)
    return Status::error("unsupported format flags " + hex(flags) +
                         " (this dlopt knows none)");
  uint64_t have = size - kExecutableHeaderSize;
  if (payloadSize > have)
    return Status::error("truncated: header says " +
                         std::to_string(payloadSize) +
                         " bytes of payload, file has " + std::to_string(have));
  if (payloadSize < have)
    return Status::error("trailing data: header says " +
                         std::to_string(payloadSize) +
                         " bytes of payload, file has " + std::to_string(have));
  const uint8_t *payload = p + kExecutableHeaderSize;
  uint64_t computed = fnv1a64(payload, payloadSize);
  if (computed != checksum)
    return Status::error("checksum mismatch (header " + hex(checksum) +
                         ", payload " + hex(computed) + "): the file is corrupt");

  // The checksum matched, but the payload may still have been written by a
  // buggy or hostile producer: bound every length by what is there.
  if (payloadSize < 8)
    return Status::error("malformed payload: no JSON length");
  uint64_t jsonLen = getU64(payload);
  if (jsonLen > payloadSize - 8)
    return Status::error("malformed payload: JSON length " +
                         std::to_string(jsonLen) + " exceeds the payload");
  uint64_t rest = payloadSize - 8 - jsonLen;
  if (rest < 8)
    return Status::error("malformed payload: no constant data length");
  uint64_t constLen = getU64(payload + 8 + jsonLen);
  if (constLen != rest - 8)
    return Status::error("malformed payload: constant data length " +
                         std::to_string(constLen) + ", but " +
                         std::to_string(rest - 8) + " bytes follow");

  const char *jsonBegin = reinterpret_cast<const char *>(payload + 8);
  Expected<Json> parsed = parseJsonBounded<Json>(jsonBegin, jsonBegin + jsonLen);
  if (!parsed)
    return Status::error("malformed JSON: " + parsed.status().message());
  Json doc = parsed.take();
  Executable exe;
  try {
    exe = fromJson(doc);
  } catch (const SchemaError &e) {
    return Status::error("invalid executable: " + e.message);
  }
  exe.version = version;
  const uint8_t *blob = payload + 16 + jsonLen;
  exe.constData.assign(blob, blob + constLen);
  if (const Json *declared = optField(doc, "const_bytes")) {
    if (!declared->is_number_unsigned() && !declared->is_number_integer())
      return Status::error("invalid executable: const_bytes: expected an "
                           "integer");
    if (declared->get<int64_t>() != int64_t(constLen))
      return Status::error("invalid executable: const_bytes says " +
                           std::to_string(declared->get<int64_t>()) +
                           ", payload has " + std::to_string(constLen));
  }
  Status valid = exe.validate();
  if (!valid)
    return valid.withContext("invalid executable: ");
  return exe;
}

} // namespace

Expected<std::vector<uint8_t>> serializeExecutable(const Executable &exe) {
  try {
    Status valid = exe.validate();
    if (!valid)
      return valid.withContext("refusing to write an invalid executable: ");
    std::string json = toJson(exe).dump();
    std::vector<uint8_t> payload;
    payload.reserve(16 + json.size() + exe.constData.size());
    putU64(payload, json.size());
    payload.insert(payload.end(), json.begin(), json.end());
    putU64(payload, exe.constData.size());
    payload.insert(payload.end(), exe.constData.begin(), exe.constData.end());

    std::vector<uint8_t> out;
    out.reserve(kExecutableHeaderSize + payload.size());
    out.insert(out.end(), kMagic, kMagic + 8);
    putU32(out, kExecutableFormatVersion);
    putU32(out, 0);
    putU64(out, payload.size());
    putU64(out, fnv1a64(payload.data(), payload.size()));
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
  } catch (const std::exception &e) {
    return Status::error(std::string("serializing executable: ") + e.what());
  }
}

Expected<Executable> deserializeExecutable(const std::vector<uint8_t> &bytes) {
  try {
    return deserializeImpl(bytes);
  } catch (const std::exception &e) {
    // Only reachable on allocation failure or a library bug.
    return Status::error(std::string("reading executable: ") + e.what());
  }
}

Status writeExecutable(const Executable &exe, const std::string &path) {
  Expected<std::vector<uint8_t>> bytes = serializeExecutable(exe);
  if (!bytes)
    return bytes.status().withContext("writing " + path + ": ");
  // Write next to the target and rename, so a crash never leaves a
  // half-written plan file under the real name.
  std::string tmp = path + ".tmp";
  std::FILE *f = std::fopen(tmp.c_str(), "wb");
  if (!f)
    return Status::error("writing " + path + ": cannot open '" + tmp +
                         "': " + std::strerror(errno));
  size_t written = std::fwrite(bytes->data(), 1, bytes->size(), f);
  bool closed = std::fclose(f) == 0;
  if (written != bytes->size() || !closed) {
    std::remove(tmp.c_str());
    return Status::error("writing " + path + ": write failed: " +
                         std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status::error("writing " + path + ": cannot rename: " +
                         std::strerror(errno));
  }
  return Status::ok();
}

Expected<Executable> readExecutable(const std::string &path) {
  Expected<std::vector<uint8_t>> bytes = readFileLimited(
      path, "plan file", kMaxExecutableBytes, PrefixCheck{8, checkMagic});
  if (!bytes)
    return bytes.status();
  Expected<Executable> exe = deserializeExecutable(*bytes);
  if (!exe)
    return exe.status().withContext(path + ": ");
  return exe;
}

} // namespace dlopt::rt
