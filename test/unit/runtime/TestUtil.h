//===- TestUtil.h - Builders for hand-made executables in runtime tests ---===//
#pragma once

#include "runtime/format/Executable.h"
#include "runtime/format/MemoryPlanner.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace dlopt::rt::test {

/// Builds a single-rank Executable value by value, then plans its memory.
class ExeBuilder {
public:
  ExeBuilder() {
    exe.modelName = "test_model";
    exe.source = "test.mlir";
  }

  int32_t input(const std::string &name, TensorType t) {
    return add(name, std::move(t), ValueKind::Input, &exe.inputs);
  }
  int32_t param(const std::string &name, TensorType t, Init init = {}) {
    int32_t id = add(name, std::move(t), ValueKind::Param, &exe.params);
    exe.values[id].init = std::move(init);
    return id;
  }
  int32_t state(const std::string &name, TensorType t, Init init = {}) {
    int32_t id = add(name, std::move(t), ValueKind::State, &exe.states);
    exe.values[id].init = std::move(init);
    return id;
  }
  int32_t constant(TensorType t, const std::vector<float> &data) {
    return constantBytes(std::move(t), data.data(), data.size() * sizeof(float));
  }
  /// A constant of any element type from its raw little-endian bytes.
  int32_t constantBytes(TensorType t, const void *data, size_t bytes) {
    int32_t id = add("", t, ValueKind::Const, nullptr);
    size_t off = (exe.constData.size() + 63) / 64 * 64;
    exe.constData.resize(off + bytes);
    std::memcpy(exe.constData.data() + off, data, bytes);
    exe.values[id].constOffset = int64_t(off);
    return id;
  }
  int32_t temp(TensorType t) { return add("", std::move(t), ValueKind::Temp, nullptr); }

  /// Appends `op(operands) -> new temp of type t`, returns the temp.
  int32_t op(const std::string &name, std::vector<int32_t> operands,
             TensorType t, std::map<std::string, AttrValue> attrs = {}) {
    int32_t r = temp(std::move(t));
    Instr in;
    in.op = name;
    in.operands = std::move(operands);
    in.results = {r};
    in.attrs = std::move(attrs);
    in.loc = "test.mlir:" + std::to_string(instrs.size() + 1) + ":3";
    instrs.push_back(std::move(in));
    return r;
  }
  /// An output; `updates` names the param or state it replaces after a
  /// training step.
  void output(const std::string &name, int32_t id,
              const std::string &updates = "") {
    exe.outputs.push_back(id);
    exe.outputNames.push_back(name);
    exe.outputUpdates.push_back(updates);
    hasUpdates |= !updates.empty();
  }

  Executable build(int64_t alignment = 64) {
    Executable e = exe;
    // Plans without updates keep the field empty, like inference plans.
    if (!hasUpdates)
      e.outputUpdates.clear();
    Program p;
    p.ranks = {0};
    p.instrs = instrs;
    Expected<MemoryPlan> plan = planProgramMemory(e, p, alignment);
    EXPECT_TRUE(plan.isOk()) << plan.status().message();
    if (plan)
      p.memory = *plan;
    e.programs = {p};
    return e;
  }

  /// One program run by every rank of `mesh` (SPMD), with `groups`.
  Executable buildSpmd(Mesh mesh, std::vector<CommGroup> groups) {
    exe.mesh = std::move(mesh);
    exe.groups = std::move(groups);
    exe.worldSize = int32_t(exe.mesh.size());
    Executable e = build();
    e.programs[0].ranks.clear();
    for (int32_t r = 0; r < e.worldSize; ++r)
      e.programs[0].ranks.push_back(r);
    return e;
  }
  /// Marks value `id` as a block of a global tensor.
  void global(int32_t id, TensorType type,
              std::vector<std::vector<int32_t>> split) {
    exe.values[size_t(id)].global = GlobalLayout{std::move(type), std::move(split)};
  }

  Executable exe;
  std::vector<Instr> instrs;
  bool hasUpdates = false;

private:
  int32_t add(const std::string &name, TensorType t, ValueKind kind,
              std::vector<int32_t> *list) {
    Value v;
    v.name = name;
    v.type = std::move(t);
    v.kind = kind;
    exe.values.push_back(std::move(v));
    int32_t id = int32_t(exe.values.size() - 1);
    if (list)
      list->push_back(id);
    return id;
  }
};

inline TensorType tt(std::vector<int64_t> shape, DType d = DType::F32) {
  return TensorType{d, std::move(shape)};
}

/// True if `haystack` contains `needle`; for readable EXPECTs on messages.
inline bool contains(const std::string &haystack, const std::string &needle) {
  return haystack.find(needle) != std::string::npos;
}

} // namespace dlopt::rt::test
