//===- dlopt-run.cpp - Runs a dlopt plan file -----------------------------===//
//
// Loads an executable, binds inputs and params from .npy files, initializes
// the rest, runs rank 0's program and reports outputs, memory (planned
// versus allocated) and time. Hand-written argument parsing keeps this tool
// free of LLVM, so it builds wherever the runtime builds. Exit codes: 0 ok,
// 1 error, 2 usage error. See docs/dlopt-run.md.
//
//===----------------------------------------------------------------------===//

#include "runtime/exec/Npy.h"
#include "runtime/exec/ParamInit.h"
#include "runtime/exec/Session.h"
#include "runtime/format/Executable.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

using namespace dlopt::rt;

namespace {

constexpr const char *kUsage = R"(usage: dlopt-run MODEL.plan [options]

Runs a dlopt plan file (produced by dlopt-compile) and reports its outputs.

options:
  --input NAME=FILE.npy   bind input or param NAME to a .npy file (repeatable)
  --seed N                seed for initializing unbound params (default 0)
  --output-dir DIR        write every output as DIR/NAME.npy
  --save-params DIR       write every param (bound or initialized) as DIR/NAME.npy
  --backend NAME          backend to run on (default cpu; available: cpu)
  --threads N             kernel worker threads (default: all cores)
  --dump                  print the plan file readably and exit
  --quiet                 print nothing but errors
  --help                  print this help and exit

exit codes: 0 success, 1 error, 2 usage error
)";

struct Options {
  std::string planPath;
  std::vector<std::pair<std::string, std::string>> inputs; // name, file
  uint64_t seed = 0;
  std::string outputDir, saveParamsDir, backend = "cpu";
  int threads = 0;
  bool dump = false, quiet = false, help = false;
};

/// Thrown only inside this file: parse errors carry their exit code.
struct Exit {
  int code;
};

[[noreturn]] void usageError(const std::string &msg) {
  std::fprintf(stderr, "dlopt-run: error: %s\n", msg.c_str());
  std::fprintf(stderr, "run 'dlopt-run --help' for usage\n");
  throw Exit{2};
}

[[noreturn]] void error(const std::string &msg) {
  std::fprintf(stderr, "dlopt-run: error: %s\n", msg.c_str());
  throw Exit{1};
}

std::optional<uint64_t> parseUnsigned(const std::string &s) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  errno = 0;
  char *end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno == ERANGE || *end != '\0')
    return std::nullopt;
  return uint64_t(v);
}

Options parseArgs(int argc, char **argv) {
  Options opts;
  static const std::vector<std::string> withValue = {
      "--input", "--seed", "--output-dir", "--save-params", "--backend",
      "--threads"};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      opts.help = true;
      continue;
    }
    if (arg == "--dump") {
      opts.dump = true;
      continue;
    }
    if (arg == "--quiet" || arg == "-q") {
      opts.quiet = true;
      continue;
    }
    if (arg.rfind("-", 0) == 0 && arg != "-") {
      std::string name = arg, value;
      bool hasValue = false;
      if (size_t eq = arg.find('='); eq != std::string::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        hasValue = true;
      }
      bool known = false;
      for (const std::string &w : withValue)
        known |= w == name;
      if (!known)
        usageError("unknown option '" + name + "'");
      if (!hasValue) {
        if (i + 1 >= argc)
          usageError("option '" + name + "' needs a value");
        value = argv[++i];
      }
      if (name == "--input") {
        size_t eq = value.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == value.size())
          usageError("--input expects NAME=FILE.npy, got '" + value + "'");
        std::string inName = value.substr(0, eq);
        for (const auto &[n, f] : opts.inputs)
          if (n == inName)
            usageError("--input '" + inName + "' given twice");
        opts.inputs.push_back({inName, value.substr(eq + 1)});
      } else if (name == "--seed") {
        std::optional<uint64_t> v = parseUnsigned(value);
        if (!v)
          usageError("--seed expects a non-negative integer, got '" + value +
                     "'");
        opts.seed = *v;
      } else if (name == "--threads") {
        std::optional<uint64_t> v = parseUnsigned(value);
        if (!v || *v < 1 || *v > 4096)
          usageError("--threads expects an integer in [1, 4096], got '" +
                     value + "'");
        opts.threads = int(*v);
      } else if (name == "--output-dir") {
        if (value.empty())
          usageError("--output-dir needs a directory");
        opts.outputDir = value;
      } else if (name == "--save-params") {
        if (value.empty())
          usageError("--save-params needs a directory");
        opts.saveParamsDir = value;
      } else if (name == "--backend") {
        bool ok = false;
        std::string list;
        for (const std::string &b : availableBackends()) {
          ok |= b == value;
          list += (list.empty() ? "" : ", ") + b;
        }
        if (!ok)
          usageError("unknown backend '" + value + "' (available: " + list +
                     ")");
        opts.backend = value;
      }
      continue;
    }
    if (!opts.planPath.empty())
      usageError("unexpected argument '" + arg + "' (the plan file is '" +
                 opts.planPath + "')");
    opts.planPath = arg;
  }
  if (!opts.help && opts.planPath.empty())
    usageError("no plan file given");
  return opts;
}

/// File name for a tensor name: anything outside [A-Za-z0-9._-] becomes '_'
/// so names like "layers/0/w" cannot escape the directory.
std::string fileNameFor(const std::string &name) {
  std::string s = name;
  for (char &c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' ||
          c == '_' || c == '-'))
      c = '_';
  if (s.empty() || s == "." || s == "..")
    s = "_" + s;
  return s + ".npy";
}

void makeDir(const std::string &dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    error("cannot create directory '" + dir + "': " + ec.message());
}

std::string formatNumber(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string describe(const NamedTensor &out) {
  const HostTensor &t = out.tensor;
  if (t.type.shape.empty()) {
    double v = t.elementAsDouble(0);
    std::string text = isFloat(t.type.dtype)
                           ? formatNumber(v)
                           : std::to_string(int64_t(v));
    return out.name + " = " + text + "  (" + dtypeName(t.type.dtype) + ")";
  }
  std::string s = out.name + ": " + t.type.str();
  if (t.numElements() == 0)
    return s + "  (empty)";
  TensorStats st = computeStats(t);
  s += "  mean " + formatNumber(st.mean) + "  min " + formatNumber(st.min) +
       "  max " + formatNumber(st.max);
  if (st.nanCount)
    s += "  nan " + std::to_string(st.nanCount);
  if (st.infCount)
    s += "  inf " + std::to_string(st.infCount);
  return s;
}

int runMain(int argc, char **argv) {
  Options opts = parseArgs(argc, argv);
  if (opts.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }

  Expected<Executable> exe = readExecutable(opts.planPath);
  if (!exe)
    error(exe.status().message());
  if (opts.dump) {
    std::fputs(dumpExecutable(*exe).c_str(), stdout);
    return 0;
  }
  size_t numInstrs = exe->programs.empty() ? 0 : exe->programs[0].instrs.size();
  std::string header = "model " +
                       (exe->modelName.empty() ? "-" : exe->modelName) +
                       (exe->source.empty() ? "" : " (" + exe->source + ")") +
                       ": " + std::to_string(exe->worldSize) + " rank(s), " +
                       std::to_string(numInstrs) + " instructions, " +
                       std::to_string(exe->params.size()) + " params, " +
                       std::to_string(exe->inputs.size()) + " inputs";
  if (exe->worldSize > 1 && !opts.quiet)
    std::fprintf(stderr,
                 "dlopt-run: warning: the plan has %d ranks; running rank 0 "
                 "only\n",
                 exe->worldSize);

  BackendOptions bopts;
  bopts.threads = opts.threads;
  Expected<std::unique_ptr<Backend>> backend =
      createBackend(opts.backend, bopts);
  if (!backend)
    error(backend.status().message());
  SessionOptions sopts;
  sopts.seed = opts.seed;
  Expected<std::unique_ptr<Session>> session =
      Session::create(exe.take(), backend.take(), sopts);
  if (!session)
    error(opts.planPath + ": " + session.status().message());
  Session &s = **session;

  for (const auto &[name, file] : opts.inputs) {
    if (!s.hasArgument(name)) {
      Status st = s.bind(name, HostTensor(), file); // for the message
      error("--input " + name + "=" + file + ": " + st.message());
    }
    Expected<HostTensor> t = readNpy(file);
    if (!t)
      error("--input " + name + "=" + file + ": " + t.status().message());
    Status st = s.bind(name, *t, file);
    if (!st)
      error(st.message());
  }
  std::vector<std::string> missing = s.missingInputs();
  if (!missing.empty()) {
    Status st = s.prepare();
    error(st.message() + "; bind with --input " + missing[0] + "=FILE.npy");
  }
  Status prepared = s.prepare();
  if (!prepared)
    error(prepared.message());

  const Executable &e = s.executable();
  if (!opts.saveParamsDir.empty()) {
    makeDir(opts.saveParamsDir);
    const MemoryPlan &mem = e.programs[s.rank()].memory;
    for (int32_t id : e.params) {
      if (mem.offsets[id] < 0)
        continue; // held by another rank
      const std::string &name = e.values[id].name;
      Expected<HostTensor> t = s.readValue(id);
      if (!t)
        error("param '" + name + "': " + t.status().message());
      std::string path =
          (std::filesystem::path(opts.saveParamsDir) / fileNameFor(name))
              .string();
      Status st = writeNpy(path, *t);
      if (!st)
        error(st.message());
    }
  }

  Expected<std::vector<NamedTensor>> outputs = s.run();
  if (!outputs)
    error(outputs.status().message());

  if (!opts.outputDir.empty()) {
    makeDir(opts.outputDir);
    for (const NamedTensor &out : *outputs) {
      std::string path =
          (std::filesystem::path(opts.outputDir) / fileNameFor(out.name))
              .string();
      Status st = writeNpy(path, out.tensor);
      if (!st)
        error(st.message());
    }
  }

  if (!opts.quiet) {
    std::printf("%s\n", header.c_str());
    std::printf("outputs:\n");
    for (const NamedTensor &out : *outputs)
      std::printf("  %s\n", describe(out).c_str());
    MemoryReport m = s.memory();
    std::printf("memory: planned %s (persistent %s + scratch %s), "
                "allocated %s\n",
                formatBytes(m.plannedBytes).c_str(),
                formatBytes(m.persistentBytes).c_str(),
                formatBytes(m.scratchBytes).c_str(),
                formatBytes(m.peakAllocatedBytes).c_str());
    std::printf("time: %.3f ms (%s backend)\n", s.lastRunSeconds() * 1e3,
                s.backend().name().c_str());
    if (!opts.outputDir.empty())
      std::printf("wrote %zu output(s) to %s\n", outputs->size(),
                  opts.outputDir.c_str());
    if (!opts.saveParamsDir.empty())
      std::printf("wrote %zu param(s) to %s\n", e.params.size(),
                  opts.saveParamsDir.c_str());
  }
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    return runMain(argc, argv);
  } catch (const Exit &e) {
    return e.code;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "dlopt-run: error: %s\n", e.what());
    return 1;
  }
}
