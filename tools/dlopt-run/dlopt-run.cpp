//===- dlopt-run.cpp - Runs a dlopt plan file -----------------------------===//
//
// Loads an executable, binds inputs and params from .npy files, initializes
// the rest, runs rank 0's program and reports outputs, memory (planned
// versus allocated) and time. With --steps N it runs a training-step plan N
// times instead (runtime/exec/Trainer.h): data, progress, metrics,
// evaluation and checkpoints. Hand-written argument parsing keeps this tool
// free of LLVM, so it builds wherever the runtime builds. Exit codes: 0 ok,
// 1 error, 2 usage error. See docs/dlopt-run.md and
// docs/training-runtime.md.
//
//===----------------------------------------------------------------------===//

#include "runtime/exec/Checkpoint.h"
#include "runtime/exec/CudaBackend.h"
#include "runtime/exec/DataLoader.h"
#include "runtime/exec/Npy.h"
#include "runtime/exec/ParamInit.h"
#include "runtime/exec/Session.h"
#include "runtime/exec/Trainer.h"
#include "runtime/exec/World.h"
#include "runtime/format/Executable.h"

#include <nlohmann/json.hpp>
#if DLOPT_HAVE_MPI
#include "runtime/comm/MpiCommunicator.h"
#endif

#include <csignal>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
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
  --backend NAME          backend to run on (default cpu; available: cpu,
                          cuda; docs/gpu.md)
  --threads N             kernel worker threads (default: the cores this
                          process may run on)
  --repeat N              run a forward plan N times (same inputs) and
                          print the median and fastest run time
  --dump                  print the plan file readably and exit
  --quiet                 print nothing but errors
  --profile               time every instruction and print the time per op
                          kind and the slowest instructions at the end (cuda:
                          device time between events, no added synchronize;
                          cpu: wall time of each instruction)
  --profile-json FILE     --profile, and write every instruction's time,
                          calls, types, FLOPs and bytes as JSON to FILE
                          (dlopt-calibrate --from-profile reads it)
  --help                  print this help and exit

multi-rank executables (docs/launch.md):
  --devices-per-process G under mpirun/srun: G ranks per process, as
                          threads (default 1: one rank per process)
  --comm-timeout SECONDS  how long a rank waits for its peers in any
                          communication call before the job fails
                          (default 60)

training (plans from dlopt-compile --train; docs/training-runtime.md):
  --steps N               run N training steps (continuing the step count
                          of --resume)
  --data FILE             token stream for the 'tokens'/'labels' inputs:
                          .npy of integers, or raw binary (--data-dtype)
  --data-dtype u16|i32    element type of a raw token file (default u16)
  --data-input NAME=FILE.npy
                          samples of input NAME along dim 0, shuffled each
                          epoch (repeatable; e.g. images and labels)
  --vocab V               synthetic int inputs take values in [0, V) when
                          the plan does not tell (default data: synthetic)
  --log-every K           without a terminal: a progress line every K steps
                          (default 1)
  --metrics FILE          append one JSON object per step (JSONL)
  --eval-data FILE        held-out token stream (formats as --data)
  --eval-data-input NAME=FILE.npy
                          held-out samples (formats as --data-input)
  --eval-every E          evaluate every E steps (default: after the last)
  --eval-batches B        batches per evaluation (default: one pass)
  --checkpoint-dir DIR    write DIR/step-NNNNNN.safetensors at exit
  --checkpoint-every K    ... and every K steps
  --resume FILE           continue from a checkpoint

exit codes: 0 success, 1 error, 2 usage error
)";

using NameFiles = std::vector<std::pair<std::string, std::string>>;

struct Options {
  std::string planPath;
  NameFiles inputs; // name, file
  uint64_t seed = 0;
  std::string outputDir, saveParamsDir, backend = "cpu";
  std::string profileJson; ///< --profile-json: where to write the profile
  int threads = 0;
  int64_t repeat = 1; ///< forward runs; the time printed is their median
  int devicesPerProcess = 0; ///< 0: not given
  double commTimeout = 60;
  /// Whether this process writes files (--save-params, --output-dir): the
  /// first process of a job does; every process reads collectively.
  bool writeFiles = true;
  bool dump = false, quiet = false, help = false, profile = false;
  // Training.
  int64_t steps = 0;
  std::string data, dataDType, evalData, metrics, checkpointDir, resume;
  NameFiles dataInputs, evalDataInputs;
  int64_t vocab = 0, logEvery = 1, evalEvery = 0, evalBatches = 0,
          checkpointEvery = 0;
  /// Training options given, for "needs --steps" errors.
  std::vector<std::string> trainingFlags;
};

/// createBackend(), plus the cuda backend (runtime/exec/CudaBackend.h).
Expected<std::unique_ptr<Backend>> createNamedBackend(const std::string &name,
                                                      const BackendOptions &o) {
  if (name != "cuda")
    return createBackend(name, o);
  auto cuda = CudaBackend::create(CudaBackend::optionsFromEnv());
  if (!cuda)
    return cuda.status();
  return std::unique_ptr<Backend>(cuda.take());
}

/// "device memory: planned X, peak Y" for the cuda backend.
void printDeviceMemory(Session &s) {
  auto *cuda = dynamic_cast<CudaBackend *>(&s.backend());
  if (!cuda)
    return;
  CudaMemoryStats m = cuda->memoryStats(s.rank());
  std::printf("device memory: planned %s, peak %s (arena %s + kernel "
              "workspace %s + cuBLASLt workspace %s; cudaMemGetInfo delta "
              "%s) on %s\n",
              formatBytes(s.memory().plannedBytes).c_str(),
              formatBytes(m.trackedPeakBytes).c_str(),
              formatBytes(m.arenaBytes).c_str(),
              formatBytes(m.workspaceBytes).c_str(),
              formatBytes(m.gemmWorkspaceBytes).c_str(),
              formatBytes(m.memGetInfoPeakBytes).c_str(),
              cuda->deviceDescription(s.rank()).c_str());
  std::printf("%s\n", CudaBackend::fusedKernelReport().c_str());
}

/// The planned and allocated memory of one rank, then the device's.
void printMemory(Session &s) {
  MemoryReport m = s.memory();
  std::printf("memory: planned %s (persistent %s + scratch %s), "
              "allocated %s\n",
              formatBytes(m.plannedBytes).c_str(),
              formatBytes(m.persistentBytes).c_str(),
              formatBytes(m.scratchBytes).c_str(),
              formatBytes(m.peakAllocatedBytes).c_str());
  printDeviceMemory(s);
}

/// The memory of every rank of a multi-rank run: planned (persistent +
/// scratch) and the most the backend held at once; ranks with the same
/// figures share a line. Collective over the processes (each reports its
/// ranks); the lines, for the first process to print.
std::vector<std::string> worldMemoryLines(World &w) {
  std::vector<int64_t> mine;
  for (int r = w.firstRank(); r < w.firstRank() + w.numLocal(); ++r) {
    MemoryReport m = w.session(r).memory();
    mine.insert(mine.end(), {int64_t(r), m.plannedBytes, m.persistentBytes,
                             m.scratchBytes, m.peakAllocatedBytes});
  }
  std::vector<uint8_t> bytes(mine.size() * 8);
  std::memcpy(bytes.data(), mine.data(), bytes.size());
  Expected<std::vector<std::vector<uint8_t>>> all = w.allGatherBytes(bytes, "memory reports");
  if (!all)
    return {"memory per rank: unavailable (" + all.status().message() + ")"};
  std::map<std::string, std::vector<int>> lines;
  for (const std::vector<uint8_t> &b : *all)
    for (size_t at = 0; at + 40 <= b.size(); at += 40) {
      int64_t f[5];
      std::memcpy(f, b.data() + at, 40);
      lines[formatBytes(f[1]) + " (persistent " + formatBytes(f[2]) +
            " + scratch " + formatBytes(f[3]) + "), allocated " +
            formatBytes(f[4])]
          .push_back(int(f[0]));
    }
  std::vector<std::string> out;
  for (auto &[text, ranks] : lines) {
    std::sort(ranks.begin(), ranks.end());
    std::string list;
    for (size_t i = 0; i < ranks.size(); ++i) {
      // Runs of consecutive ranks as a-b.
      size_t j = i;
      while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
        ++j;
      if (!list.empty())
        list += ",";
      list += std::to_string(ranks[i]);
      if (j > i) {
        list += "-";
        list += std::to_string(ranks[j]);
      }
      i = j;
    }
    out.push_back("memory per rank: rank" +
                  std::string(ranks.size() > 1 ? "s " : " ") + list +
                  ": planned " + text);
  }
  return out;
}

void printWorldMemory(World &w, const std::vector<std::string> &lines) {
  for (const std::string &l : lines)
    std::printf("%s\n", l.c_str());
  for (int r = w.firstRank(); r < w.firstRank() + w.numLocal(); ++r)
    printDeviceMemory(w.session(r));
}

/// Thrown only inside this file: parse errors carry their exit code.
struct Exit {
  int code;
};

[[noreturn]] void usageError(const std::string &msg) {
  std::fprintf(stderr, "dlopt-run: error: %s\n", msg.c_str());
  std::fprintf(stderr, "run 'dlopt-run --help' for usage\n");
  throw Exit{2};
}

/// How this process was launched (docs/launch.md).
struct Launch {
  bool mpi = false;       ///< started by mpirun/srun, MPI initialized
  int process = 0, processes = 1;
  std::string host;
  std::string where() const {
    return processes > 1 ? "process " + std::to_string(process) + " of " +
                               std::to_string(processes) + " on " + host
                         : std::string();
  }
};
Launch gLaunch;

/// Under MPI, a failure ends the job: the other processes are told (their
/// waits fail naming this one) and this one waits, bounded, until they
/// have reported.
void failJob(const std::string &msg) {
#if DLOPT_HAVE_MPI
  if (!gLaunch.mpi || gLaunch.processes < 2)
    return;
  if (jobAborted())
    acknowledgeJobAbort();
  notifyJobAbort(gLaunch.where() + " failed: " + msg);
  awaitJobAbortAcks(std::chrono::milliseconds(5000));
  // What follows (unwinding the World and its communicators, the MPI and
  // PMIx libraries' exit handlers) must not keep a failed process alive
  // while a peer is stopped or gone: past this bound it leaves anyway.
  static bool armed = false;
  if (!armed) {
    armed = true;
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(15));
      const char note[] = "dlopt-run: leaving after 15 s of shutdown after a "
                          "failure (a peer process may be stopped)\n";
      ssize_t w = ::write(2, note, sizeof(note) - 1);
      (void)w;
      ::_exit(1);
    }).detach();
  }
#else
  (void)msg;
#endif
}

[[noreturn]] void error(const std::string &msg) {
  std::string line = "dlopt-run: error: ";
  if (gLaunch.processes > 1)
    line += "(" + gLaunch.where() + ") ";
  line += msg;
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  failJob(msg);
  throw Exit{1};
}

/// SIGTERM under a launcher: the launcher is ending the job, normally
/// because another process died. Say what this one was waiting for.
char gTermPrefix[256];
extern "C" void onTerminate(int) {
  auto put = [](const char *p) {
    size_t n = 0;
    while (p[n])
      ++n;
    ssize_t w = ::write(2, p, n);
    (void)w;
  };
  put(gTermPrefix);
#if DLOPT_HAVE_MPI
  const char *note = mpiWaitNote();
  put(note ? "while waiting in " : "while computing (in no communication "
                                   "call)");
  if (note)
    put(note);
#endif
  put("\n");
  ::_exit(143);
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
      "--threads", "--steps", "--data", "--data-dtype", "--data-input",
      "--vocab", "--log-every", "--metrics", "--eval-data",
      "--eval-data-input", "--eval-every", "--eval-batches",
      "--checkpoint-dir", "--checkpoint-every", "--resume",
      "--devices-per-process", "--comm-timeout", "--repeat",
      "--profile-json"};
  auto positive = [](const std::string &name, const std::string &value) {
    std::optional<uint64_t> v = parseUnsigned(value);
    if (!v || *v < 1 || *v > uint64_t(INT64_MAX))
      usageError(name + " expects a positive integer, got '" + value + "'");
    return int64_t(*v);
  };
  auto nameFile = [](const std::string &name, const std::string &value,
                     NameFiles &list) {
    size_t eq = value.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == value.size())
      usageError(name + " expects NAME=FILE.npy, got '" + value + "'");
    std::string inName = value.substr(0, eq);
    for (const auto &[n, f] : list)
      if (n == inName)
        usageError(name + " '" + inName + "' given twice");
    list.push_back({inName, value.substr(eq + 1)});
  };
  auto nonEmpty = [](const std::string &name, const std::string &value) {
    if (value.empty())
      usageError(name + " needs a value");
    return value;
  };
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
    if (arg == "--profile") {
      opts.profile = true;
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
      if (name != "--steps" && name != "--input" && name != "--seed" &&
          name != "--output-dir" && name != "--save-params" &&
          name != "--backend" && name != "--threads" &&
          name != "--devices-per-process" && name != "--comm-timeout" &&
          name != "--repeat" && name != "--profile-json")
        opts.trainingFlags.push_back(name);
      if (name == "--input") {
        nameFile(name, value, opts.inputs);
      } else if (name == "--steps") {
        opts.steps = positive(name, value);
      } else if (name == "--repeat") {
        opts.repeat = positive(name, value);
        if (opts.repeat > 1000000)
          usageError("--repeat expects an integer in [1, 1000000], got '" +
                     value + "'");
      } else if (name == "--data") {
        opts.data = nonEmpty(name, value);
      } else if (name == "--data-dtype") {
        if (value != "u16" && value != "i32")
          usageError("--data-dtype expects u16 or i32, got '" + value + "'");
        opts.dataDType = value;
      } else if (name == "--data-input") {
        nameFile(name, value, opts.dataInputs);
      } else if (name == "--vocab") {
        opts.vocab = positive(name, value);
      } else if (name == "--log-every") {
        opts.logEvery = positive(name, value);
      } else if (name == "--metrics") {
        opts.metrics = nonEmpty(name, value);
      } else if (name == "--eval-data") {
        opts.evalData = nonEmpty(name, value);
      } else if (name == "--eval-data-input") {
        nameFile(name, value, opts.evalDataInputs);
      } else if (name == "--eval-every") {
        opts.evalEvery = positive(name, value);
      } else if (name == "--eval-batches") {
        opts.evalBatches = positive(name, value);
      } else if (name == "--checkpoint-dir") {
        opts.checkpointDir = nonEmpty(name, value);
      } else if (name == "--checkpoint-every") {
        opts.checkpointEvery = positive(name, value);
      } else if (name == "--devices-per-process") {
        std::optional<uint64_t> v = parseUnsigned(value);
        if (!v || *v < 1 || *v > 65536)
          usageError("--devices-per-process expects an integer in [1, "
                     "65536], got '" + value + "'");
        opts.devicesPerProcess = int(*v);
      } else if (name == "--comm-timeout") {
        char *end = nullptr;
        errno = 0;
        double t = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || errno == ERANGE ||
            !(t > 0) || t > 86400 * 7)
          usageError("--comm-timeout expects seconds in (0, 604800], got '" +
                     value + "'");
        opts.commTimeout = t;
      } else if (name == "--resume") {
        opts.resume = nonEmpty(name, value);
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
      } else if (name == "--profile-json") {
        if (value.empty())
          usageError("--profile-json needs a file");
        opts.profileJson = value;
        opts.profile = true;
      } else if (name == "--backend") {
        bool ok = value == "cuda";
        std::string list;
        for (const std::string &b : availableBackends()) {
          ok |= b == value;
          list += (list.empty() ? "" : ", ") + b;
        }
        if (!ok)
          usageError("unknown backend '" + value + "' (available: " + list +
                     "), or cuda on a machine with an NVIDIA GPU");
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
  if (opts.help || opts.dump)
    return opts;
  // Training options need --steps and fit together.
  if (opts.steps == 0 && !opts.trainingFlags.empty())
    usageError(opts.trainingFlags[0] + " needs --steps (training)");
  if (opts.steps > 0 && opts.repeat > 1)
    usageError("--repeat times forward runs; training plans time their "
               "steps (--steps, --metrics)");
  if (!opts.data.empty() && !opts.dataInputs.empty())
    usageError("--data and --data-input cannot be combined");
  if (!opts.dataDType.empty() && opts.data.empty() && opts.evalData.empty())
    usageError("--data-dtype needs --data or --eval-data");
  if (!opts.evalData.empty() && !opts.evalDataInputs.empty())
    usageError("--eval-data and --eval-data-input cannot be combined");
  bool evalData = !opts.evalData.empty() || !opts.evalDataInputs.empty();
  if (!evalData && (opts.evalEvery || opts.evalBatches))
    usageError(std::string(opts.evalEvery ? "--eval-every" : "--eval-batches") +
               " needs --eval-data or --eval-data-input");
  if (opts.checkpointEvery && opts.checkpointDir.empty())
    usageError("--checkpoint-every needs --checkpoint-dir");
  if (opts.steps && !opts.outputDir.empty())
    usageError("--output-dir does not apply to training (--steps); use "
               "--save-params or --checkpoint-dir");
  for (const auto &[name, file] : opts.inputs)
    for (const auto &[dn, df] : opts.dataInputs)
      if (name == dn)
        usageError("input '" + name + "' is given by both --input and "
                   "--data-input");
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
  if (std::isnan(v))
    return "nan"; // never "-nan"
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

/// Prints the per-op time table of --profile, most expensive first.
void printProfile(Session &s) {
  std::vector<std::pair<std::string, Session::OpProfile>> rows(
      s.profile().begin(), s.profile().end());
  double total = 0;
  for (const auto &r : rows)
    total += r.second.seconds;
  std::sort(rows.begin(), rows.end(), [](const auto &a, const auto &b) {
    return a.second.seconds > b.second.seconds;
  });
  const Session::ProfileTotals &pt = s.profileTotals();
  std::printf("profile (%s backend, %.3f s in instructions, %s):\n",
              s.backend().name().c_str(), total,
              pt.deviceTimed ? "device time between events, no added "
                               "synchronize"
                             : "host time with a synchronize after each");
  if (pt.skipped > 0)
    std::printf("  (the first %lld run(s) not counted: warm-up)\n",
                (long long)pt.skipped);
  if (pt.runs > 0)
    std::printf("  per run: %.3f ms wall, %.3f ms until the last instruction "
                "was issued (host), %.3f ms in instructions\n",
                1e3 * pt.wallSeconds / double(pt.runs),
                1e3 * pt.issueSeconds / double(pt.runs),
                1e3 * total / double(pt.runs));
  std::printf("  %-22s %10s %7s %10s\n", "op", "seconds", "%", "calls");
  for (const auto &[op, p] : rows)
    std::printf("  %-22s %10.4f %6.1f%% %10lld\n", op.c_str(), p.seconds,
                total > 0 ? 100.0 * p.seconds / total : 0.0,
                (long long)p.calls);
  // The slowest instructions, with their result types and sources: where a
  // gap against the hardware's rates shows (a matmul's TFLOP/s, a
  // reduction's GB/s).
  const std::vector<Session::OpProfile> &ip = s.instrProfile();
  std::vector<size_t> order(ip.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ip[a].seconds > ip[b].seconds;
  });
  const Executable &e = s.executable();
  const Program &prog = s.program();
  size_t shown = std::min<size_t>(order.size(), 15);
  if (shown)
    std::printf("  slowest instructions (ms per call):\n");
  for (size_t k = 0; k < shown; ++k) {
    size_t i = order[k];
    const Instr &in = prog.instrs[i];
    auto list = [&](const std::vector<int32_t> &ids) {
      std::string t;
      for (size_t j = 0; j < ids.size() && j < 3; ++j)
        t += (j ? ", " : "") + e.values[size_t(ids[j])].type.str();
      if (ids.size() > 3)
        t += ", ... (" + std::to_string(ids.size()) + ")";
      return t;
    };
    std::string types = list(in.results), from = list(in.operands);
    std::printf("  %6zu %-18s %8.3f  %s <- %s  %s\n", i, in.op.c_str(),
                1e3 * ip[i].seconds / double(std::max<int64_t>(ip[i].calls, 1)),
                types.c_str(), from.c_str(), in.loc.c_str());
  }
}

/// Writes --profile-json: every profiled instruction's calls and seconds,
/// its result and operand types, whether it communicates (the op table's
/// mark), and the FLOPs and bytes of one call (a matmul's 2 m n k with its
/// GEMM shape, a forward attention's 4 B H S T D as the planner counts it;
/// every instruction's operand and result bytes), for dlopt-calibrate
/// --from-profile (docs/dlopt-run.md).
void writeProfileJson(Session &s, const std::string &path) {
  using Json = nlohmann::ordered_json;
  const Executable &e = s.executable();
  const Program &prog = s.program();
  const std::vector<Session::OpProfile> &ip = s.instrProfile();
  const Session::ProfileTotals &pt = s.profileTotals();
  auto types = [&](const std::vector<int32_t> &ids) {
    Json t = Json::array();
    for (int32_t id : ids)
      t.push_back(e.values[size_t(id)].type.str());
    return t;
  };
  Json instrs = Json::array();
  for (size_t i = 0; i < ip.size() && i < prog.instrs.size(); ++i) {
    if (ip[i].calls <= 0)
      continue;
    const Instr &in = prog.instrs[i];
    double bytes = 0;
    for (int32_t id : in.operands)
      bytes += double(e.values[size_t(id)].type.byteSize());
    for (int32_t id : in.results)
      bytes += double(e.values[size_t(id)].type.byteSize());
    Json j = {{"index", i},
              {"op", in.op},
              {"calls", ip[i].calls},
              {"seconds", ip[i].seconds},
              {"layer", in.layer},
              {"communication", isCommunicationOp(in.op)},
              {"results", types(in.results)},
              {"operands", types(in.operands)},
              {"flops", 0.0},
              {"bytes", bytes}};
    if (in.op == "matmul" && in.operands.size() >= 2 && !in.results.empty()) {
      const TensorType &a = e.values[size_t(in.operands[0])].type;
      const TensorType &b = e.values[size_t(in.operands[1])].type;
      const TensorType &c = e.values[size_t(in.results[0])].type;
      if (a.shape.size() >= 2 && c.shape.size() >= 2) {
        const bool transA = in.getBool("transpose_a", false);
        int64_t m = c.shape[c.shape.size() - 2];
        const int64_t n = c.shape.back();
        const int64_t k = transA ? a.shape[a.shape.size() - 2] : a.shape.back();
        int64_t batch = m * n > 0 ? c.numElements() / (m * n) : 0;
        // A weight without batch dims and an untransposed input: one tall
        // GEMM of every row (as the CUDA backend runs a linear layer).
        if (b.shape.size() == 2 && !transA) {
          m *= batch;
          batch = 1;
        }
        j["flops"] = 2.0 * double(c.numElements()) * double(k);
        j["gemm"] = {{"m", m}, {"n", n}, {"k", k}, {"batch", batch}};
      }
    } else if (in.op == "attention" && in.operands.size() >= 2) {
      const TensorType &q = e.values[size_t(in.operands[0])].type;
      const TensorType &kt = e.values[size_t(in.operands[1])].type;
      if (q.shape.size() == 4 && kt.shape.size() == 4)
        j["flops"] = 4.0 * double(q.numElements()) * double(kt.shape[2]);
      j["causal"] = in.getBool("causal", false);
    }
    j["loc"] = in.loc;
    instrs.push_back(std::move(j));
  }
  Json doc = {{"format", "dlopt-profile"},
              {"version", 1},
              {"backend", s.backend().name()},
              {"device_timed", pt.deviceTimed},
              {"runs", pt.runs},
              {"skipped", pt.skipped},
              {"wall_seconds", pt.wallSeconds},
              {"issue_seconds", pt.issueSeconds},
              {"instructions_per_run", prog.instrs.size()},
              {"instructions", std::move(instrs)}};
  std::ofstream f(path);
  // Invalid UTF-8 in a source location is replaced, never thrown on.
  f << doc.dump(1, ' ', false, Json::error_handler_t::replace) << "\n";
  if (!f)
    error("--profile-json: cannot write " + path);
}

/// Reads every param (collective in a multi-process World) and writes it,
/// unless `write` is false (the processes other than the first).
void saveParams(StepRunner &s, const std::string &dir, bool write = true) {
  const Executable &e = s.executable();
  if (write)
    makeDir(dir);
  std::vector<int32_t> held = s.checkpointedValues();
  for (int32_t id : e.params) {
    if (std::find(held.begin(), held.end(), id) == held.end())
      continue; // held by another rank
    const std::string &name = e.values[id].name;
    Expected<HostTensor> t = s.readArgument(name);
    if (!t)
      error("param '" + name + "': " + t.status().message());
    if (!write)
      continue;
    std::string path =
        (std::filesystem::path(dir) / fileNameFor(name)).string();
    Status st = writeNpy(path, *t);
    if (!st)
      error(st.message());
  }
}

std::unique_ptr<DataLoader> check(Expected<std::unique_ptr<DataLoader>> l,
                                  const std::string &what) {
  if (!l)
    error(what + ": " + l.status().message());
  return l.take();
}

/// An executable whose params, states, inputs and outputs have their global
/// types: what data loaders shape batches by and checkpoints hold.
Executable globalView(const Executable &exe) {
  Executable g = exe;
  for (Value &v : g.values)
    if (v.global)
      v.type = v.global->type;
  return g;
}

/// The planner's prediction beside what this run measured: the median
/// step time after the first step, and the largest program's planned
/// memory (or, for one rank, the most the backend allocated).
void printPrediction(const Executable &e, const std::vector<StepResult> &h,
                     int64_t allocated) {
  if (!e.prediction)
    return;
  const Prediction &p = *e.prediction;
  std::vector<double> t;
  for (size_t i = 1; i < h.size(); ++i)
    t.push_back(h[i].seconds);
  int64_t planned = 0;
  for (const Program &prog : e.programs)
    planned = std::max(planned, prog.memory.totalBytes());
  int64_t measured = std::max(planned, allocated);
  std::printf("prediction (cluster %s): step %.3f ms, memory %s per device\n",
              p.cluster.c_str(), p.stepSeconds * 1e3,
              formatBytes(int64_t(p.memoryBytes)).c_str());
  if (t.empty()) {
    std::printf("measured: no step after the first to compare (run "
                "--steps 2 or more)\n");
  } else {
    std::sort(t.begin(), t.end());
    double med = t.size() % 2 ? t[t.size() / 2]
                              : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
    std::printf("measured: step %.3f ms (median of %zu steps after the "
                "first; prediction %+.1f%%)",
                med * 1e3, t.size(), (p.stepSeconds / med - 1) * 100);
  }
  std::printf("%s memory %s (%s; prediction %+.1f%%)\n",
              t.empty() ? "measured:" : ",", formatBytes(measured).c_str(),
              allocated > planned ? "allocated by the backend"
                                  : "the largest program's plan",
              measured > 0 ? (p.memoryBytes / double(measured) - 1) * 100
                           : 0.0);
}

/// --steps N: the training loop over a training-step plan, on one rank
/// (`session`, a Session) or every rank of a multi-rank executable in this
/// process (`world`, a World).
int runTraining(const Options &opts, StepRunner &s, Session *session,
                const std::string &header, const std::string &layout = "") {
  const Executable view = globalView(s.executable());
  const Executable &e = view;
  if (!s.hasUpdates())
    error(opts.planPath + ": --steps needs a training-step plan, but no output "
          "updates a param or state (compile the model with dlopt-compile "
          "--train)");
  TokenDType dtype =
      opts.dataDType == "i32" ? TokenDType::I32 : TokenDType::U16;
  auto boundByInput = [&](const std::string &name) {
    for (const auto &[n, f] : opts.inputs)
      if (n == name)
        return true;
    return false;
  };

  // Under a launcher, each process makes its share of the load-time data
  // checks (the processes agree on the outcome) and reads only the part
  // of each batch its ranks hold.
  World *world = dynamic_cast<World *>(&s);
  DataShare share;
  if (world && world->numProcesses() > 1)
    share = {world->processIndex(), world->numProcesses()};
  auto shared = [&](Expected<std::unique_ptr<DataLoader>> l,
                    const std::string &what) {
    if (share.count > 1) {
      Status st = world->agreeAcrossProcesses(l ? Status::ok() : l.status());
      if (!st)
        error(what + ": " + st.message());
    }
    std::unique_ptr<DataLoader> loader = check(std::move(l), what);
    for (const std::string &name : loader->inputs())
      if (std::optional<Box> box = s.inputRegion(name))
        loader->restrictTo(name, std::move(*box));
    return loader;
  };

  std::unique_ptr<DataLoader> train, eval;
  if (!opts.data.empty()) {
    train = shared(createTokenLoader(e, opts.data, dtype, share),
                   "--data " + opts.data);
  } else if (!opts.dataInputs.empty()) {
    train = shared(createArrayLoader(e, opts.dataInputs, /*shuffle=*/true,
                                     share),
                   "--data-input");
  } else {
    // Synthetic data for every input not bound with --input.
    train = shared(createSyntheticLoader(e, s.missingInputs(), opts.vocab),
                   "synthetic data");
  }
  for (const std::string &name : train->inputs())
    if (boundByInput(name))
      usageError("input '" + name + "' is given by both --input and the "
                 "training data (" + train->describe() + ")");
  if (!opts.evalData.empty())
    eval = shared(createTokenLoader(e, opts.evalData, dtype, share),
                  "--eval-data " + opts.evalData);
  else if (!opts.evalDataInputs.empty())
    eval = shared(createArrayLoader(e, opts.evalDataInputs,
                                    /*shuffle=*/false, share),
                  "--eval-data-input");

  TrainerOptions topts;
  topts.steps = opts.steps;
  topts.seed = opts.seed;
  topts.logEvery = opts.logEvery;
  topts.metricsPath = opts.metrics;
  topts.evalEvery = opts.evalEvery;
  topts.evalBatches = opts.evalBatches;
  topts.checkpointDir = opts.checkpointDir;
  topts.checkpointEvery = opts.checkpointEvery;
  topts.log = stderr;
  topts.progress = opts.quiet                ? TrainerOptions::Progress::None
                   : isatty(fileno(stderr)) ? TrainerOptions::Progress::Bar
                                            : TrainerOptions::Progress::Lines;
  Expected<std::unique_ptr<Trainer>> trainer =
      Trainer::create(s, *train, eval.get(), topts);
  if (!trainer)
    error(opts.planPath + ": " + trainer.status().message());
  Trainer &t = **trainer;
  if (!opts.resume.empty()) {
    Status st = t.resume(opts.resume);
    if (!st)
      error(st.message());
  }
  Status prepared = s.initializeParams();
  if (!prepared)
    error(prepared.message());

  if (opts.steps > kMaxTrainingStep - t.stepCount())
    error("--steps " + std::to_string(opts.steps) + " after step " +
          std::to_string(t.stepCount()) + " would pass the largest step "
          "count " + std::to_string(kMaxTrainingStep) + " (2^53)");
  int64_t first = t.stepCount() + 1, last = t.stepCount() + opts.steps;
  if (!opts.quiet) {
    std::printf("%s\n", header.c_str());
    std::printf("training steps %lld to %lld on %s%s\n", (long long)first,
                (long long)last, train->describe().c_str(),
                opts.resume.empty() ? ""
                                    : (" (resumed from " + opts.resume + ")")
                                          .c_str());
    std::fflush(stdout);
  }
  Status ran = t.run();
  if (!ran)
    error(ran.message());
  if (!opts.saveParamsDir.empty())
    saveParams(s, opts.saveParamsDir, opts.writeFiles);

  std::vector<std::string> memLines;
  if (world)
    memLines = worldMemoryLines(*world);
  if (!opts.quiet) {
    if (!session)
      std::printf("%s\n", layout.c_str());
    const std::vector<StepResult> &h = t.history();
    double seconds = 0;
    for (const StepResult &r : h)
      seconds += r.seconds;
    double rate = seconds > 0 ? double(h.size()) * double(t.itemsPerStep()) /
                                    seconds
                              : 0;
    std::printf("trained %zu steps in %.3f s: loss %s -> %s, %.0f %s\n",
                h.size(), seconds, formatNumber(h.front().loss).c_str(),
                formatNumber(h.back().loss).c_str(), rate,
                t.tokenThroughput() ? "tokens/s" : "samples/s");
    if (h.back().eval) {
      const EvalResult &ev = *h.back().eval;
      std::printf("eval: loss %s", formatNumber(ev.loss).c_str());
      if (ev.accuracy)
        std::printf("  accuracy %.4f", *ev.accuracy);
      std::printf("  (%lld batches)\n", (long long)ev.batches);
    }
    if (!opts.resume.empty())
      std::printf("resumed from %s: %s read in %.3f s (%.2f GB/s)\n",
                  opts.resume.c_str(), formatBytes(t.resumeBytes()).c_str(),
                  t.resumeSeconds(),
                  t.resumeSeconds() > 0
                      ? double(t.resumeBytes()) / t.resumeSeconds() / 1e9
                      : 0.0);
    if (!t.lastCheckpoint().empty())
      std::printf("checkpoint: %s (%s written in %.3f s, %.2f GB/s)\n",
                  t.lastCheckpoint().c_str(),
                  formatBytes(t.checkpointBytes()).c_str(),
                  t.checkpointSeconds(),
                  t.checkpointSeconds() > 0
                      ? double(t.checkpointBytes()) / t.checkpointSeconds() /
                            1e9
                      : 0.0);
    if (!opts.saveParamsDir.empty())
      std::printf("wrote %zu param(s) to %s\n", e.params.size(),
                  opts.saveParamsDir.c_str());
    if (session)
      printMemory(*session);
    else if (world)
      printWorldMemory(*world, memLines);
    printPrediction(e, h, session ? session->memory().peakAllocatedBytes : 0);
  }
  if (opts.profile && session) {
    printProfile(*session);
    if (!opts.profileJson.empty())
      writeProfileJson(*session, opts.profileJson);
  }
  return 0;
}

/// A multi-rank executable: every rank as a thread of this process
/// (in-graph, CPU backend), global inputs and outputs (docs/parallel.md).
int runWorld(const Options &opts, const Executable &exe,
             const std::string &header) {
  if (opts.backend != "cpu" && opts.backend != "cuda")
    error(opts.planPath + ": multi-rank executables run on the cpu or cuda "
          "backend (--backend " + opts.backend + ")");
  if (opts.profile)
    error(opts.planPath + ": --profile is not supported for multi-rank "
          "executables yet");
  if (opts.repeat > 1)
    error(opts.planPath + ": --repeat is not supported for multi-rank "
          "executables yet");
  WorldOptions wo;
  wo.seed = opts.seed;
  wo.commTimeout = std::chrono::milliseconds(int64_t(opts.commTimeout * 1e3));
  const int n = exe.worldSize;
  std::string layout = "ran " + std::to_string(n) +
                       " ranks as threads of this process (in-graph)";
  if (opts.devicesPerProcess && n % opts.devicesPerProcess)
    usageError("--devices-per-process " +
               std::to_string(opts.devicesPerProcess) + " does not divide " +
               "the executable's " + std::to_string(n) + " ranks");
  if (gLaunch.processes > 1) {
#if DLOPT_HAVE_MPI
    const int g = opts.devicesPerProcess ? opts.devicesPerProcess : 1;
    const int p = gLaunch.processes;
    if (int64_t(p) * g != n)
      error(opts.planPath + ": the launcher started " + std::to_string(p) +
            " processes x " + std::to_string(g) + " rank(s) per process = " +
            std::to_string(int64_t(p) * g) + " ranks, but the executable has " +
            std::to_string(n) + "; start " +
            (n % g ? std::to_string(n) + " processes"
                   : std::to_string(n / g) + " processes (mpirun -n " +
                         std::to_string(n / g) + ")") +
            (g == 1 && p > 0 && n % p == 0
                 ? " or pass --devices-per-process " + std::to_string(n / p)
                 : ""));
    wo.firstRank = gLaunch.process * g;
    wo.numRanks = g;
    MpiOptions mo;
    mo.timeout = wo.commTimeout;
    Expected<std::unique_ptr<Communicator>> pg = createMpiWorld(mo);
    if (!pg)
      error(pg.status().message());
    wo.processGroup = std::shared_ptr<Communicator>(pg.take());
    wo.worldGroup = [mo, g](int) -> Expected<
                                  std::vector<std::unique_ptr<Communicator>>> {
      if (g > 1)
        return createHybridWorld(g, mo);
      Expected<std::unique_ptr<Communicator>> c = createMpiWorld(mo);
      if (!c)
        return c.status();
      std::vector<std::unique_ptr<Communicator>> v;
      v.push_back(c.take());
      return v;
    };
    if (opts.backend == "cuda") {
      // NCCL between every rank, bootstrapped over MPI; ranks on this
      // node's devices by their node-local process index.
      int nodeLocal = gLaunch.process;
      for (const char *v : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                            "MPI_LOCALRANKID"})
        if (const char *e = std::getenv(v); e && *e) {
          nodeLocal = std::atoi(e);
          break;
        }
      CudaWorldOptions co;
      co.backend = CudaBackend::optionsFromEnv();
      Status st = configureCudaProcessWorld(wo, n, nodeLocal, co);
      if (!st)
        error(opts.planPath + ": " + st.message());
    }
    wo.onFailure = [](int rank, const Status &st) {
      notifyJobAbort("rank " + std::to_string(rank) + " (" +
                     gLaunch.where() + ") failed: " + st.message());
    };
    layout = g > 1 ? "ran " + std::to_string(n) + " ranks as " +
                         std::to_string(p) + " processes x " +
                         std::to_string(g) +
                         " threads (hybrid: in-graph within a process, MPI "
                         "between processes)"
                   : "ran " + std::to_string(n) + " ranks as " +
                         std::to_string(p) + " processes (between-graph, MPI)";
#endif
  } else if (opts.devicesPerProcess && opts.devicesPerProcess < n) {
    layout += "; no launcher found (mpirun, srun), so --devices-per-process " +
              std::to_string(opts.devicesPerProcess) + " did not split it";
  }
  if (opts.backend == "cuda" && gLaunch.processes == 1) {
    // Ranks on devices r mod (visible devices); host-staged communicators
    // unless DLOPT_CUDA_NCCL=1 (one distinct device per rank) (docs/gpu.md).
    CudaWorldOptions co;
    co.backend = CudaBackend::optionsFromEnv();
    const char *nccl = std::getenv("DLOPT_CUDA_NCCL");
    co.nccl = nccl && std::string(nccl) == "1";
    Status st = configureCudaWorld(wo, exe.worldSize, co);
    if (!st)
      error(opts.planPath + ": " + st.message());
  }
  Expected<std::unique_ptr<World>> world = World::create(exe, wo);
  if (!world)
    error(opts.planPath + ": " + world.status().message());
  World &w = **world;
  // Reports, files and metrics come from the first process only.
  const bool first = w.processIndex() == 0;
  Options local = opts;
  if (!first) {
    local.quiet = true;
    local.metrics.clear();
    local.outputDir.clear();
    local.writeFiles = false;
  }
  for (const auto &[name, file] : opts.inputs) {
    Expected<HostTensor> t = readNpy(file);
    if (!t)
      error("--input " + name + "=" + file + ": " + t.status().message());
    Status st = w.bind(name, *t, file);
    if (!st)
      error("--input " + name + "=" + file + ": " + st.message());
  }
  if (opts.steps > 0)
    return runTraining(local, w, nullptr, header, layout);
  std::vector<std::string> missing = w.missingInputs();
  if (!missing.empty())
    error("input '" + missing[0] + "' is not bound; bind with --input " +
          missing[0] + "=FILE.npy (the global tensor)");
  Status st = w.initializeParams();
  if (!st)
    error(st.message());
  auto t0 = std::chrono::steady_clock::now();
  st = w.execute();
  if (!st)
    error(st.message());
  double secs = std::chrono::duration<double>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
  if (!local.saveParamsDir.empty())
    saveParams(w, local.saveParamsDir, local.writeFiles);
  std::vector<NamedTensor> outputs;
  for (const std::string &name : exe.outputNames) {
    Expected<HostTensor> t = w.readOutput(name);
    if (!t)
      error(t.status().message());
    outputs.push_back({name, t.take()});
  }
  if (!local.outputDir.empty()) {
    makeDir(local.outputDir);
    for (const NamedTensor &out : outputs) {
      Status ws = writeNpy(
          (std::filesystem::path(local.outputDir) / fileNameFor(out.name))
              .string(),
          out.tensor);
      if (!ws)
        error(ws.message());
    }
  }
  std::vector<std::string> memLines = worldMemoryLines(w);
  if (!local.quiet) {
    std::printf("%s\n", header.c_str());
    std::printf("%s\n", layout.c_str());
    std::printf("outputs (global):\n");
    for (const NamedTensor &out : outputs)
      std::printf("  %s\n", describe(out).c_str());
    printWorldMemory(w, memLines);
    std::printf("time: %.3f ms (%s backend, all ranks)\n", secs * 1e3,
                opts.backend.c_str());
    if (!local.outputDir.empty())
      std::printf("wrote %zu output(s) to %s\n", outputs.size(),
                  local.outputDir.c_str());
  }
  return 0;
}

int runMain(int argc, char **argv) {
  Options opts = parseArgs(argc, argv);
  if (opts.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }

#if DLOPT_HAVE_MPI
  if (!opts.dump && launchedByMpi()) {
    Expected<MpiInfo> mpi = initMpi(
        &argc, &argv,
        std::chrono::milliseconds(int64_t(opts.commTimeout * 1e3)));
    if (!mpi)
      error(mpi.status().message());
    gLaunch.mpi = true;
    gLaunch.process = mpi->worldRank;
    gLaunch.processes = mpi->worldSize;
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    gLaunch.host = host;
    std::snprintf(gTermPrefix, sizeof(gTermPrefix),
                  "dlopt-run: (%s) terminated by the launcher (another "
                  "process failed or the job was cancelled) ",
                  gLaunch.where().c_str());
    if (gLaunch.processes > 1)
      std::signal(SIGTERM, onTerminate);
  }
#endif
  Expected<Executable> exe = readExecutable(opts.planPath);
  if (!exe)
    error(exe.status().message());
  // An unwritable --profile-json fails before anything runs (without
  // truncating an existing file, or leaving a new empty one behind).
  if (!opts.dump && !opts.profileJson.empty()) {
    std::error_code ec;
    const bool existed = std::filesystem::exists(opts.profileJson, ec);
    std::FILE *f = std::fopen(opts.profileJson.c_str(), "a");
    if (!f)
      error("--profile-json: cannot write " + opts.profileJson + ": " +
            std::strerror(errno));
    std::fclose(f);
    if (!existed)
      std::filesystem::remove(opts.profileJson, ec);
  }
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
                       std::to_string(exe->inputs.size()) + " inputs" +
                       (exe->states.empty()
                            ? ""
                            : ", " + std::to_string(exe->states.size()) +
                                  " states");
  if (exe->worldSize > 1)
    return runWorld(opts, *exe, header);
  if (gLaunch.processes > 1)
    error(opts.planPath + ": the launcher started " +
          std::to_string(gLaunch.processes) + " processes, but the "
          "executable has 1 rank; run it without mpirun/srun, or compile it "
          "for " + std::to_string(gLaunch.processes) + " devices");

  BackendOptions bopts;
  bopts.threads = opts.threads;
  Expected<std::unique_ptr<Backend>> backend =
      createNamedBackend(opts.backend, bopts);
  if (!backend)
    error(backend.status().message());
  SessionOptions sopts;
  sopts.seed = opts.seed;
  Expected<std::unique_ptr<Session>> session =
      Session::create(exe.take(), backend.take(), sopts);
  if (!session)
    error(opts.planPath + ": " + session.status().message());
  Session &s = **session;
  // Training and repeated profiles leave out the first run (lazy loading,
  // kernel compilation, cuBLASLt heuristics): they describe the steady state.
  s.setProfiling(opts.profile, opts.steps > 1 || opts.repeat > 1 ? 1 : 0);

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
  if (opts.steps > 0)
    return runTraining(opts, s, &s, header);
  std::vector<std::string> missing = s.missingInputs();
  if (!missing.empty()) {
    Status st = s.prepare();
    error(st.message() + "; bind with --input " + missing[0] + "=FILE.npy");
  }
  Status prepared = s.prepare();
  if (!prepared)
    error(prepared.message());

  const Executable &e = s.executable();
  if (!opts.saveParamsDir.empty())
    saveParams(s, opts.saveParamsDir, opts.writeFiles);

  std::vector<NamedTensor> outputs; // the last run's
  std::vector<double> runTimes;
  for (int64_t r = 0; r < opts.repeat; ++r) {
    Expected<std::vector<NamedTensor>> ran = s.run();
    if (!ran)
      error(ran.status().message());
    outputs = ran.take();
    runTimes.push_back(s.lastRunSeconds());
  }

  if (!opts.outputDir.empty()) {
    makeDir(opts.outputDir);
    for (const NamedTensor &out : outputs) {
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
    for (const NamedTensor &out : outputs)
      std::printf("  %s\n", describe(out).c_str());
    printMemory(s);
    if (runTimes.size() == 1) {
      std::printf("time: %.3f ms (%s backend)\n", runTimes[0] * 1e3,
                  s.backend().name().c_str());
    } else {
      std::sort(runTimes.begin(), runTimes.end());
      std::printf("time: median %.3f ms, fastest %.3f ms over %zu runs (%s "
                  "backend)\n",
                  runTimes[runTimes.size() / 2] * 1e3, runTimes[0] * 1e3,
                  runTimes.size(), s.backend().name().c_str());
    }
    if (!opts.outputDir.empty())
      std::printf("wrote %zu output(s) to %s\n", outputs.size(),
                  opts.outputDir.c_str());
    if (!opts.saveParamsDir.empty())
      std::printf("wrote %zu param(s) to %s\n", e.params.size(),
                  opts.saveParamsDir.c_str());
  }
  if (opts.profile) {
    printProfile(s);
    if (!opts.profileJson.empty())
      writeProfileJson(s, opts.profileJson);
  }
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  int rc = 1;
  try {
    rc = runMain(argc, argv);
  } catch (const Exit &e) {
    rc = e.code;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "dlopt-run: error: %s\n", e.what());
    failJob(e.what());
    rc = 1;
  }
#if DLOPT_HAVE_MPI
  // A failed process leaves without MPI_Finalize (which would wait for
  // peers that may be gone), and without the libraries' exit handlers
  // (PMIx's may wait on a launcher busy with a stopped peer); the launcher
  // then ends the job.
  if (rc == 0) {
    finalizeMpi();
  } else if (gLaunch.mpi && gLaunch.processes > 1) {
    std::fflush(nullptr);
    ::_exit(rc);
  }
#endif
  return rc;
}
