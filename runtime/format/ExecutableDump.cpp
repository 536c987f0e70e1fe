//===- ExecutableDump.cpp - Readable listing for dlopt-run --dump ---------===//
//
// The listing mirrors MLIR's generic form closely enough that a reader of
// the source IR recognizes each instruction, and adds what only the plan
// knows: value kinds, byte sizes, arena offsets and the memory summary.
//
//===----------------------------------------------------------------------===//

#include "runtime/format/Executable.h"
#include "runtime/format/FusedProgram.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace dlopt::rt {

std::string formatBytes(int64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (std::abs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof(buf), "%lld B", (long long)bytes);
  else
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  return buf;
}

namespace {

/// Shortest spelling that reads back to the same double.
std::string formatDouble(double d) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, res.ptr);
  // Keep floats recognizable as floats (1.0, not 1).
  if (s.find_first_of(".eEn") == std::string::npos)
    s += ".0";
  return s;
}

std::string formatAttr(const AttrValue &v) {
  std::string s;
  switch (v.index()) {
  case 0: return std::to_string(std::get<int64_t>(v));
  case 1: return formatDouble(std::get<double>(v));
  case 2: return "\"" + std::get<std::string>(v) + "\"";
  case 3:
    s = "[";
    for (int64_t x : std::get<std::vector<int64_t>>(v))
      s += (s.size() > 1 ? ", " : "") + std::to_string(x);
    return s + "]";
  case 4:
    s = "[";
    for (double x : std::get<std::vector<double>>(v))
      s += (s.size() > 1 ? ", " : "") + formatDouble(x);
    return s + "]";
  }
  return "?";
}

std::string formatInit(const Init &init) {
  if (init.dist == "normal" || init.dist == "truncated_normal")
    return init.dist + "(mean=" + formatDouble(init.mean) +
           ", std=" + formatDouble(init.std) + ")";
  if (init.dist == "uniform")
    return "uniform(low=" + formatDouble(init.low) +
           ", high=" + formatDouble(init.high) + ")";
  if (init.dist == "constant")
    return "constant(" + formatDouble(init.value) + ")";
  return init.dist;
}

std::string padRight(std::string s, size_t width) {
  if (s.size() < width)
    s.append(width - s.size(), ' ');
  return s;
}

/// Type of a value id, tolerating ids out of range (dump must never crash,
/// even on an executable that failed validation).
std::string typeOf(const Executable &exe, int32_t id) {
  if (id < 0 || size_t(id) >= exe.values.size())
    return "<bad id>";
  return exe.values[id].type.str();
}

} // namespace

static std::string scratchPeak(const Executable &exe, const Program &prog);

static std::string dumpImpl(const Executable &exe) {
  std::ostringstream os;
  size_t counts[5] = {0, 0, 0, 0, 0};
  for (const Value &v : exe.values)
    if (uint8_t(v.kind) < 5)
      ++counts[uint8_t(v.kind)];
  os << "dlopt executable (format version " << exe.version << ")\n";
  os << "  model:      " << (exe.modelName.empty() ? "-" : exe.modelName)
     << "\n";
  os << "  source:     " << (exe.source.empty() ? "-" : exe.source) << "\n";
  os << "  world size: " << exe.worldSize << "\n";
  if (exe.prediction) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%.3f ms a step, %.0f bytes per device",
                  exe.prediction->stepSeconds * 1e3,
                  exe.prediction->memoryBytes);
    os << "  prediction: " << buf << " (the planner, on cluster "
       << exe.prediction->cluster << ")\n";
  }
  if (!exe.mesh.axes.empty()) {
    os << "  mesh:       ";
    for (size_t a = 0; a < exe.mesh.axes.size(); ++a)
      os << (a ? " x " : "") << exe.mesh.axes[a] << "=" << exe.mesh.shape[a];
    os << " (rank = row-major index, last axis fastest)\n";
  }
  for (size_t g = 0; g < exe.groups.size(); ++g) {
    const CommGroup &cg = exe.groups[g];
    os << "  group " << g << ":    " << cg.name << " over {";
    for (size_t a = 0; a < cg.axes.size(); ++a)
      os << (a ? ", " : "") << exe.mesh.axes[size_t(cg.axes[a])];
    os << "}: ";
    // Its communicators, as rank lists (the first few).
    std::vector<bool> seen(size_t(exe.worldSize), false);
    int shown = 0;
    for (int32_t r = 0; r < exe.worldSize && shown < 4; ++r) {
      if (seen[size_t(r)])
        continue;
      std::vector<int32_t> ranks = exe.groupRanks(int32_t(g), r);
      os << (shown++ ? " " : "") << "[";
      for (size_t i = 0; i < ranks.size(); ++i) {
        seen[size_t(ranks[i])] = true;
        os << (i ? "," : "") << ranks[i];
      }
      os << "]";
    }
    if (shown == 4)
      os << " ...";
    os << "\n";
  }
  os << "  values:     " << exe.values.size() << " (" << counts[0]
     << " params, " << counts[1] << " inputs, "
     << (counts[4] ? std::to_string(counts[4]) + " states, " : "")
     << counts[2] << " consts, " << counts[3] << " temps), constant data " << formatBytes(exe.constData.size())
     << "\n\n";

  // With one rank the offsets fit in the values table; with several, each
  // program section lists its own.
  bool singleRank = exe.programs.size() == 1;
  const MemoryPlan *mem0 = singleRank ? &exe.programs[0].memory : nullptr;
  os << "values:\n";
  os << "  " << padRight("id", 7) << padRight("kind", 7) << padRight("name", 20)
     << padRight("type", 22) << padRight("bytes", 12)
     << (singleRank ? padRight("offset", 12) : "") << "notes\n";
  for (size_t v = 0; v < exe.values.size(); ++v) {
    const Value &val = exe.values[v];
    std::string notes;
    if (val.kind == ValueKind::Param || val.kind == ValueKind::State)
      notes = "init " + formatInit(val.init);
    else if (val.kind == ValueKind::Const)
      notes = std::string(val.constSplat ? "const splat @" : "const data @") +
              std::to_string(val.constOffset);
    if (val.global) {
      notes += std::string(notes.empty() ? "" : "; ") + "global " +
               val.global->type.str() + " split [";
      for (size_t d = 0; d < val.global->split.size(); ++d) {
        notes += d ? ", " : "";
        const auto &axes = val.global->split[d];
        if (axes.empty())
          notes += "-";
        for (size_t a = 0; a < axes.size(); ++a)
          notes += (a ? "+" : "") + exe.mesh.axes[size_t(axes[a])];
      }
      notes += "]";
    }
    std::string offset;
    if (mem0) {
      offset = v < mem0->offsets.size() && mem0->offsets[v] >= 0
                   ? std::to_string(mem0->offsets[v])
                   : "-";
    }
    std::ostringstream row;
    row << "  " << padRight("%" + std::to_string(v), 7)
       << padRight(valueKindName(val.kind), 7) << padRight(val.name, 20)
       << padRight(val.type.str(), 22)
       << padRight(std::to_string(val.type.byteSize()), 12)
       << (singleRank ? padRight(offset, 12) : "") << notes;
    // Drop the padding of an empty last column.
    std::string line = row.str();
    line.erase(line.find_last_not_of(' ') + 1);
    os << line << "\n";
  }
  os << "\noutputs:\n";
  for (size_t i = 0; i < exe.outputs.size(); ++i) {
    os << "  " << (i < exe.outputNames.size() ? exe.outputNames[i] : "?")
       << " = %" << exe.outputs[i] << " : " << typeOf(exe, exe.outputs[i]);
    if (i < exe.outputUpdates.size() && !exe.outputUpdates[i].empty())
      os << "  -> updates " << exe.outputUpdates[i];
    os << "\n";
  }

  for (const Program &prog : exe.programs) {
    os << "\nprogram " << (&prog - exe.programs.data()) << ", ranks [";
    for (size_t i = 0; i < prog.ranks.size() && i < 16; ++i)
      os << (i ? ", " : "") << prog.ranks[i];
    os << (prog.ranks.size() > 16 ? ", ...]" : "]") << " ("
       << prog.instrs.size() << " instructions):\n";
    for (size_t i = 0; i < prog.instrs.size(); ++i) {
      const Instr &in = prog.instrs[i];
      char idx[32];
      std::snprintf(idx, sizeof(idx), "%5zu: ", i);
      os << idx;
      for (size_t r = 0; r < in.results.size(); ++r)
        os << (r ? ", " : "") << "%" << in.results[r];
      if (!in.results.empty())
        os << " = ";
      os << in.op << "(";
      for (size_t o = 0; o < in.operands.size(); ++o)
        os << (o ? ", " : "") << "%" << in.operands[o];
      os << ")";
      if (!in.attrs.empty()) {
        os << " {";
        bool first = true;
        for (const auto &[name, value] : in.attrs) {
          os << (first ? "" : ", ") << name << "=" << formatAttr(value);
          first = false;
        }
        os << "}";
      }
      if (!in.results.empty()) {
        os << " : ";
        for (size_t r = 0; r < in.results.size(); ++r)
          os << (r ? ", " : "") << typeOf(exe, in.results[r]);
      }
      if (in.layer >= 0)
        os << "  @layer " << in.layer;
      if (!in.loc.empty())
        os << "  " << in.loc;
      os << "\n";
      if (in.op == fused::kOpName) {
        std::vector<TensorType> ot, rt;
        for (int32_t id : in.operands)
          if (id >= 0 && size_t(id) < exe.values.size())
            ot.push_back(exe.values[id].type);
        for (int32_t id : in.results)
          if (id >= 0 && size_t(id) < exe.values.size())
            rt.push_back(exe.values[id].type);
        auto program = fused::decode(in, ot, rt);
        os << "         program: "
           << (program ? fused::describe(*program)
                       : "<invalid: " + program.status().message() + ">")
           << "\n";
      }
    }
    const MemoryPlan &mem = prog.memory;
    if (!singleRank) {
      os << "  offsets:";
      size_t shown = 0;
      for (size_t v = 0; v < mem.offsets.size(); ++v)
        if (mem.offsets[v] >= 0) {
          os << (shown++ % 8 == 0 ? "\n    " : "  ") << "%" << v << "@"
             << mem.offsets[v];
        }
      os << "\n";
    }
    os << "memory of program " << (&prog - exe.programs.data())
       << ": persistent "
       << formatBytes(mem.persistentBytes) << " + scratch "
       << formatBytes(mem.scratchBytes) << " = "
       << formatBytes(mem.totalBytes()) << " (" << mem.totalBytes()
       << " bytes, alignment " << mem.alignment << ")\n";
    os << scratchPeak(exe, prog);
  }
  return os.str();
}

/// Where a program's temporaries peak and what is live there: the
/// instruction, the live bytes, the largest live values (with the
/// instruction that made them) and the live bytes by producing op. Explains
/// a memory plan (docs/executable-format.md, "Reading the memory plan").
static std::string scratchPeak(const Executable &exe, const Program &prog) {
  const size_t n = prog.instrs.size();
  if (n == 0)
    return "";
  std::vector<int64_t> defAt(exe.values.size(), -1), lastUse(exe.values.size(), -1);
  for (size_t i = 0; i < n; ++i) {
    for (int32_t id : prog.instrs[i].operands)
      if (id >= 0 && size_t(id) < exe.values.size())
        lastUse[size_t(id)] = int64_t(i);
    for (int32_t id : prog.instrs[i].results)
      if (id >= 0 && size_t(id) < exe.values.size())
        defAt[size_t(id)] = lastUse[size_t(id)] = int64_t(i);
  }
  for (int32_t id : exe.outputs)
    if (id >= 0 && size_t(id) < exe.values.size() && defAt[size_t(id)] >= 0)
      lastUse[size_t(id)] = int64_t(n) - 1;
  // Temporaries in the scratch region (an in-place update's result shares
  // its argument's persistent bytes and is not counted).
  auto inScratch = [&](size_t v) {
    return exe.values[v].kind == ValueKind::Temp && defAt[v] >= 0 &&
           v < prog.memory.offsets.size() &&
           prog.memory.offsets[v] >= prog.memory.persistentBytes;
  };
  std::vector<int64_t> delta(n + 1, 0);
  for (size_t v = 0; v < exe.values.size(); ++v)
    if (inScratch(v)) {
      int64_t b = exe.values[v].type.byteSize();
      delta[size_t(defAt[v])] += b;
      delta[size_t(lastUse[v]) + 1] -= b;
    }
  int64_t live = 0, best = -1;
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    live += delta[i];
    if (live > best)
      best = live, at = i;
  }
  struct Live {
    int64_t bytes;
    size_t v;
  };
  std::vector<Live> here;
  std::map<std::string, int64_t> byOp;
  for (size_t v = 0; v < exe.values.size(); ++v)
    if (inScratch(v) && defAt[v] <= int64_t(at) && lastUse[v] >= int64_t(at)) {
      int64_t b = exe.values[v].type.byteSize();
      here.push_back({b, v});
      byOp[prog.instrs[size_t(defAt[v])].op] += b;
    }
  std::sort(here.begin(), here.end(), [](const Live &a, const Live &b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.v < b.v;
  });
  std::ostringstream os;
  const Instr &peak = prog.instrs[at];
  os << "  scratch peak: " << formatBytes(best) << " live at instruction "
     << at << " ('" << peak.op << "'" << (peak.loc.empty() ? "" : " at " + peak.loc)
     << "), " << here.size() << " temporaries; the largest:\n";
  for (size_t k = 0; k < here.size() && k < 6; ++k) {
    const Instr &def = prog.instrs[size_t(defAt[here[k].v])];
    os << "    %" << here[k].v << "  " << exe.values[here[k].v].type.str() << "  "
       << formatBytes(here[k].bytes) << "  from '" << def.op << "' (instruction "
       << defAt[here[k].v] << (def.loc.empty() ? "" : " at " + def.loc) << ")\n";
  }
  std::vector<std::pair<int64_t, std::string>> ops;
  for (const auto &[op, b] : byOp)
    ops.push_back({b, op});
  std::sort(ops.rbegin(), ops.rend());
  os << "    by op:";
  for (size_t k = 0; k < ops.size() && k < 6; ++k)
    os << (k ? ", " : " ") << ops[k].second << " " << formatBytes(ops[k].first);
  os << "\n";
  return os.str();
}

std::string dumpExecutable(const Executable &exe) {
  try {
    return dumpImpl(exe);
  } catch (const std::exception &e) {
    return std::string("<cannot dump executable: ") + e.what() + ">\n";
  }
}

} // namespace dlopt::rt
