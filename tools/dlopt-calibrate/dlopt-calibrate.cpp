//===- dlopt-calibrate.cpp - Measure this machine for the planner ---------===//
//
// Times GEMMs (f32, bf16, f16), attention, a streaming elementwise op and
// the per-op dispatch through the CPU backend's kernels, and all-reduces
// between in-process ranks (and between MPI processes when started by
// mpirun or srun), then writes a calibration file (--calibration) and a
// cluster file (--cluster) that describe this machine to the planner.
// planner/MachineCalibration.h derives them from the samples;
// docs/cost-model.md ("Calibrating a machine") gives the formulas.
//
//===----------------------------------------------------------------------===//

#include "planner/MachineCalibration.h"
#include "planner/NcclTests.h"
#include "planner/ProfileCalibration.h"
#include "runtime/comm/InProcessCommunicator.h"
#include "runtime/cpu/CpuKernels.h"
#include "runtime/cpu/DnnlConv.h"
#include "runtime/format/FusedProgram.h"
#include "runtime/support/FileRead.h"
#ifdef DLOPT_HAVE_MPI
#include "runtime/comm/MpiCommunicator.h"
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <unistd.h>
#include <vector>

using namespace dlopt;
using namespace dlopt::rt;
using planner::AllReduceSample;
using planner::GemmSample;
using planner::MachineSamples;
using Clock = std::chrono::steady_clock;

namespace {

const char *kUsage = R"(usage: dlopt-calibrate [options]

Measures this machine and writes what the planner needs to price plans on
it: a calibration file (--calibration FILE for dlopt-compile) and a cluster
file (--cluster FILE). GEMMs, attention, memory-bound ops (in and out of
the cache), the optimizer update and the per-op dispatch run through the CPU backend's kernels with the threads one device
gets; all-reduces run between in-process ranks, and between processes when
started by mpirun or srun (every process takes part; process 0 writes).

options:
  -o, --calibration-out FILE   calibration JSON (default calibration.json)
  --cluster-out FILE           cluster JSON (default cluster.json)
  --devices N                  devices (ranks) per node the cluster describes
                               (default 1): every kernel sample runs on N
                               threads at once, as the ranks of an in-graph
                               plan do, and its wall time is one device's
  --threads N                  kernel pool threads, shared by the devices, as
                               dlopt-run --threads (default: every core)
  --name NAME                  the cluster's name (default calibrated)
  --statistic median|min       each sample's time from its repeated calls:
                               the median (default; what a step meets on
                               this host, as dlopt-run reports the median
                               step) or the fastest (the machine's peak)
  --quick                      fewer and smaller samples (about 5 s)
  -h, --help                   this text

from profiles (measures nothing; writes the calibration only):
  --from-profile FILE          a dlopt-run --profile-json file, taken on the
                               device --gpu names (repeatable: several plans'
                               profiles on the same device)
  --gpu PRESET|CLUSTER         that device: a GPU preset of docs/cluster.md
                               (h200-sxm-141gb, cpu-device) or a cluster file
                               (its first node group's device)

from nccl-tests (measures nothing; writes the calibration only; with
--from-profile, into the same file):
  --nccl-tests [COLLECTIVE=]FILE
                               the output of all_reduce_perf, all_gather_perf,
                               reduce_scatter_perf, alltoall_perf or
                               broadcast_perf, nccl-tests 2.13 or later
                               (repeatable; one or more tests a file); its
                               collective_table prices those collectives over
                               groups of the measured shape. COLLECTIVE
                               (all_reduce, ...) names it where the output
                               does not (before 2.16.7), over the file's
                               name; -o defaults to collectives.json
  --compare CLUSTER            print the model's figure on CLUSTER (a preset
                               such as dgx-h100:2, or a cluster file) beside
                               each measured one
  --compare-calibration FILE   price --compare's figures with these
                               constants (a calibration file; its
                               collective_table is left out: the model is
                               compared) instead of the defaults
)";

[[noreturn]] void usageError(const std::string &msg) {
  std::fprintf(stderr, "dlopt-calibrate: error: %s\n(see --help)\n",
               msg.c_str());
  std::exit(2);
}

int parseInt(const std::string &flag, const std::string &v, int lo, int hi) {
  char *end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || x < lo || x > hi)
    usageError(flag + " expects an integer in [" + std::to_string(lo) + ", " +
               std::to_string(hi) + "], got '" + v + "'");
  return int(x);
}

/// Devices that run at once: each timed call runs on this many threads
/// together (as the ranks of an in-graph plan do, sharing the kernel pool
/// and the memory bus), and the wall time of all of them is one device's.
int gConcurrent = 1;

/// How a sample's repeated times become its time (--statistic): the
/// median by default, the statistic dlopt-run reports for the step it
/// predicts (the median step), so that a host whose caches or cores are
/// shared with other work is calibrated at the rates a step meets there;
/// or the fastest call, the machine's peak.
bool gMedian = true;

/// The time of a sample from its repeated times (gMedian).
double summarize(std::vector<double> times) {
  if (times.empty())
    return 0;
  std::sort(times.begin(), times.end());
  return gMedian ? times[times.size() / 2] : times.front();
}

/// Wall time of `reps` calls after one warm-up call (summarize), `fn`
/// running on gConcurrent threads at once.
double timed(int reps, const std::function<void()> &fn) {
  auto once = [&] {
    if (gConcurrent == 1) {
      fn();
      return;
    }
    std::vector<std::thread> th;
    for (int i = 0; i < gConcurrent; ++i)
      th.emplace_back(fn);
    for (auto &t : th)
      t.join();
  };
  once();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    once();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return summarize(std::move(times));
}

void check(const Status &s, const char *what) {
  if (!s.isOk()) {
    std::fprintf(stderr, "dlopt-calibrate: error: %s: %s\n", what,
                 s.message().c_str());
    std::exit(1);
  }
}

uint16_t bits16(DType t) { return t == DType::BF16 ? 0x3F00 : 0x3800; } // 0.5

/// Times an m x n x k GEMM through the kernel. With `cold`, each call
/// reads operands the previous calls did not touch (sets rotated through
/// 64 MiB, more than the caches), as a training step's GEMMs find their
/// weights, last touched a step before.
GemmSample timeGemm(DType t, int64_t m, int64_t n, int64_t k, int reps,
                    bool cold = false) {
  size_t es = t == DType::F32 ? 4 : 2;
  const size_t setBytes = size_t(m * k + k * n) * es;
  const size_t sets =
      cold ? std::clamp<size_t>((size_t(64) << 20) / std::max<size_t>(setBytes, 1),
                                1, 256)
           : 1;
  std::vector<char> a(size_t(m * k) * es * sets),
      b(size_t(k * n) * es * sets), c(size_t(m * n) * es);
  if (t == DType::F32) {
    std::fill_n(reinterpret_cast<float *>(a.data()), m * k * int64_t(sets),
                0.5f);
    std::fill_n(reinterpret_cast<float *>(b.data()), k * n * int64_t(sets),
                0.25f);
  } else {
    std::fill_n(reinterpret_cast<uint16_t *>(a.data()),
                m * k * int64_t(sets), bits16(t));
    std::fill_n(reinterpret_cast<uint16_t *>(b.data()),
                k * n * int64_t(sets), bits16(t));
  }
  Instr in;
  in.op = "matmul";
  in.loc = "dlopt-calibrate";
  // One output per concurrent caller.
  std::vector<std::vector<char>> cs(static_cast<size_t>(gConcurrent), c);
  std::atomic<int> next{0};
  std::atomic<size_t> call{0};
  GemmSample s{m, n, k, 0};
  s.seconds = timed(reps, [&] {
    int me = next++ % gConcurrent;
    const size_t set = call++ % sets;
    TensorRef ins[2] = {{a.data() + set * size_t(m * k) * es, {t, {m, k}}},
                        {b.data() + set * size_t(k * n) * es, {t, {k, n}}}};
    TensorRef outs[1] = {{cs[size_t(me)].data(), {t, {m, n}}}};
    check(cpu::runKernel(in, ins, outs), "matmul");
  });
  return s;
}

/// Times conv2d, conv2d_grad_input and conv2d_grad_filter through the
/// kernels on a 3x3 convolution (stride 1, padding 1) of n images of c
/// channels of h x h pixels into o channels: im2col GEMM dims m = o,
/// n = n * h * h, k = 9 c.
planner::MachineSamples::ConvSample timeConv(int64_t o, int64_t c, int64_t n,
                                             int64_t h, int reps) {
  const TensorType tx{DType::F32, {n, c, h, h}}, tw{DType::F32, {o, c, 3, 3}},
      ty{DType::F32, {n, o, h, h}};
  const size_t conc = size_t(gConcurrent);
  std::vector<float> x(size_t(tx.numElements()), 0.5f),
      w(size_t(tw.numElements()), 0.25f), dy(size_t(ty.numElements()), 0.5f);
  std::vector<std::vector<float>> y(conc, std::vector<float>(dy.size())),
      dx(conc, std::vector<float>(x.size())),
      dw(conc, std::vector<float>(w.size()));
  Instr in;
  in.loc = "dlopt-calibrate";
  in.attrs["stride"] = AttrValue(std::vector<int64_t>{1, 1});
  in.attrs["padding"] = AttrValue(std::vector<int64_t>{1, 1});
  planner::MachineSamples::ConvSample s;
  s.m = o, s.n = n * h * h, s.k = 9 * c;
  double *secs[3] = {&s.forwardSeconds, &s.gradInputSeconds,
                     &s.gradFilterSeconds};
  const char *ops[3] = {"conv2d", "conv2d_grad_input", "conv2d_grad_filter"};
  for (int pass = 0; pass < 3; ++pass) {
    in.op = ops[pass];
    std::atomic<int> next{0};
    *secs[pass] = timed(reps, [&] {
      const size_t me = size_t(next++ % gConcurrent);
      std::vector<TensorRef> ins, outs;
      if (pass == 0) {
        ins = {{x.data(), tx}, {w.data(), tw}};
        outs = {{y[me].data(), ty}};
      } else if (pass == 1) {
        ins = {{dy.data(), ty}, {w.data(), tw}};
        outs = {{dx[me].data(), tx}};
      } else {
        ins = {{x.data(), tx}, {dy.data(), ty}};
        outs = {{dw[me].data(), tw}};
      }
      check(cpu::runKernel(in, ins, outs), ops[pass]);
    });
  }
  return s;
}

/// A collective of `bytes` over `ranks` in-process ranks (threads): the
/// slowest rank's time of each of `reps` calls, summarized. `bytes` as
/// nccl-tests counts them (collective_table): an all-reduce's buffer, an
/// all-gather's whole gathered buffer, a reduce-scatter's whole input.
AllReduceSample
timeInProcess(int ranks, int64_t bytes, int reps,
              planner::Collective coll = planner::Collective::AllReduce) {
  auto comms = createInProcessGroup(ranks);
  const int64_t whole = std::max<int64_t>(ranks, bytes / 4 / ranks * ranks);
  const int64_t part = whole / ranks;
  const bool gather = coll == planner::Collective::AllGather;
  const bool scatter = coll == planner::Collective::ReduceScatter;
  const int64_t inCount = gather ? part : whole;
  const int64_t outCount = scatter ? part : whole;
  std::vector<std::vector<float>> in(static_cast<size_t>(ranks)),
      out(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    in[size_t(r)].assign(size_t(inCount), float(r + 1));
    out[size_t(r)].assign(size_t(outCount), 0.0f);
  }
  std::vector<double> times;
  for (int rep = 0; rep < reps + 1; ++rep) {
    std::vector<double> secs(static_cast<size_t>(ranks));
    std::vector<std::thread> th;
    for (int r = 0; r < ranks; ++r)
      th.emplace_back([&, r] {
        Communicator &cm = *comms[size_t(r)];
        CommInput i = hostIn(in[size_t(r)].data(), inCount, DType::F32);
        CommOutput o = hostOut(out[size_t(r)].data(), outCount, DType::F32);
        auto t0 = Clock::now();
        check(gather    ? cm.allGather(i, o)
              : scatter ? cm.reduceScatter(i, o, ReduceOp::Sum)
                        : cm.allReduce(i, o, ReduceOp::Sum),
              gather    ? "in-process all-gather"
              : scatter ? "in-process reduce-scatter"
                        : "in-process all-reduce");
        secs[size_t(r)] =
            std::chrono::duration<double>(Clock::now() - t0).count();
      });
    for (auto &t : th)
      t.join();
    if (rep > 0)
      times.push_back(*std::max_element(secs.begin(), secs.end()));
  }
  return {ranks, double(whole * 4), summarize(std::move(times))};
}

double hostMemoryBytes() {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? double(pages) * double(size) : 0;
}

/// The last-level cache of the CPU this process runs on (the highest
/// level sysfs lists for cpu0), 0 where unknown.
double lastLevelCacheBytes() {
  double bytes = 0;
  int best = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir =
        "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lf(dir + "level"), sf(dir + "size"), tf(dir + "type");
    int level = 0;
    std::string size, type;
    if (!(lf >> level) || !(sf >> size) || !(tf >> type))
      continue;
    if (type == "Instruction" || level < best || size.empty())
      continue;
    char *end = nullptr;
    double v = std::strtod(size.c_str(), &end);
    if (!(v > 0))
      continue;
    if (*end == 'K')
      v *= 1024;
    else if (*end == 'M')
      v *= 1024 * 1024;
    else if (*end == 'G')
      v *= 1024.0 * 1024 * 1024;
    best = level;
    bytes = v;
  }
  return bytes;
}

/// Whether `path` can be written (its directory exists and is writable,
/// and the file, if it exists, is writable), checked before measuring so
/// a bad -o fails at once; says why not.
bool canWrite(const std::string &path) {
  std::string dir = path;
  size_t slash = dir.find_last_of('/');
  dir = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
  const bool exists = ::access(path.c_str(), F_OK) == 0;
  if ((exists && ::access(path.c_str(), W_OK) != 0) ||
      (!exists && ::access(dir.c_str(), W_OK) != 0)) {
    std::fprintf(stderr, "dlopt-calibrate: error: cannot write '%s': %s\n",
                 path.c_str(), std::strerror(errno));
    return false;
  }
  return true;
}

bool writeText(const std::string &path, const std::string &text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) {
    std::fprintf(stderr, "dlopt-calibrate: error: cannot write '%s'\n",
                 path.c_str());
    return false;
  }
  return true;
}

} // namespace

/// "1 MiB", "64 KiB", "1000 B".
std::string sizeName(double bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && bytes >= 1024 && std::fmod(bytes, 1024) == 0) {
    bytes /= 1024;
    ++u;
  }
  char b[48];
  std::snprintf(b, sizeof b, "%.0f %s", bytes, units[u]);
  return b;
}

/// A group of `ranks` ranks on `nodes` nodes with `perNode` on the first
/// (and as many as fit on the others) in `cluster`, for --compare.
planner::Expected<planner::CommGroup>
groupOfShape(const planner::Cluster &cluster, int ranks, int nodes,
             int perNode) {
  std::vector<std::vector<int>> byNode(cluster.numNodes());
  for (int r = 0; r < cluster.numDevices(); ++r) {
    auto loc = cluster.locate(r);
    if (!loc)
      return loc.status();
    byNode[loc->node].push_back(r);
  }
  if (nodes > int(byNode.size()))
    return rt::Status::error("the cluster has " +
                             std::to_string(byNode.size()) +
                             " nodes, the "
                             "group spans " +
                             std::to_string(nodes));
  std::vector<int> chosen;
  int left = ranks;
  for (int k = 0; k < nodes; ++k) {
    // At most perNode here, and at least one for each node after it.
    const int take = std::min(perNode, left - (nodes - 1 - k));
    if (take > int(byNode[k].size()))
      return rt::Status::error(
          "node " + std::to_string(k) + " of the cluster has " +
          std::to_string(byNode[k].size()) + " devices, the group puts " +
          std::to_string(take) + " there");
    chosen.insert(chosen.end(), byNode[k].begin(), byNode[k].begin() + take);
    left -= take;
  }
  return cluster.commGroup(chosen);
}

/// --nccl-tests: reads each file, prints its sweeps (beside the model's
/// figures on `compare` when given), and returns their rows, a valid
/// collective_table. Exit code 1 on an unreadable file or output, or rows
/// the table refuses; 2 on a bad COLLECTIVE= prefix.
std::vector<planner::CollectiveTableRow>
importNcclTests(const std::vector<std::string> &specs,
                const std::string &compare,
                const std::string &compareCalibration) {
  auto fail = [](const std::string &msg) {
    std::fflush(stdout);
    std::fprintf(stderr, "dlopt-calibrate: error: %s\n", msg.c_str());
    std::exit(1);
  };
  std::optional<planner::Cluster> cluster;
  if (!compare.empty()) {
    auto c = planner::resolveCluster(compare);
    if (!c)
      usageError("--compare: " + c.status().message());
    cluster = c.take();
  }
  // The model's figures: the default constants, or the file's without its
  // own measurements.
  planner::Calibration constants;
  if (!compareCalibration.empty()) {
    auto c = planner::loadCalibration(compareCalibration);
    if (!c)
      fail("--compare-calibration: " + c.status().message());
    constants = c.take();
    constants.collectiveTable.clear();
  }
  const planner::CostModel model(constants);
  std::vector<planner::CollectiveTableRow> rows;
  std::map<std::tuple<int, int, int, int, double>, std::string> from;
  for (const std::string &spec : specs) {
    std::string path = spec;
    planner::NcclTestsNames names;
    const size_t eq = spec.find('=');
    if (eq != std::string::npos) {
      planner::Collective c;
      if (planner::collectiveFromTableName(spec.substr(0, eq), c)) {
        names.prefix = c;
        path = spec.substr(eq + 1);
      } else if (spec.substr(0, eq).find('/') == std::string::npos &&
                 !std::ifstream(spec).good()) {
        usageError("--nccl-tests: '" + spec.substr(0, eq) +
                   "' is not all_reduce, all_gather, reduce_scatter, "
                   "alltoall or broadcast");
      }
    }
    names.fileName = planner::collectiveOfNcclTestsName(path);
    auto text = rt::readTextFileLimited(path, "nccl-tests output");
    if (!text)
      fail(text.status().message());
    auto sweeps = planner::parseNcclTests(*text, path, names);
    if (!sweeps)
      fail(sweeps.status().message());
    for (const planner::NcclTestsSweep &w : *sweeps) {
      const char *name = planner::collectiveTableName(w.collective);
      const std::string ofGroups =
          w.groups > 1
              ? "; rank 0's group of the test's " + std::to_string(w.groups)
              : std::string();
      std::printf("nccl-tests: %s over %d ranks (%d node%s, %d a node%s)%s%s, "
                  "%zu sizes %s to %s (%s:%d)\n",
                  name, w.ranks, w.nodes, w.nodes == 1 ? "" : "s",
                  w.ranksPerNode, ofGroups.c_str(),
                  w.device.empty() ? "" : ", ", w.device.c_str(), w.rows.size(),
                  sizeName(w.rows.front().bytes).c_str(),
                  sizeName(w.rows.back().bytes).c_str(), path.c_str(), w.line);
      std::optional<planner::CommGroup> g;
      if (cluster) {
        auto gr = groupOfShape(*cluster, w.ranks, w.nodes, w.ranksPerNode);
        if (gr)
          g = *gr;
        else
          std::printf("  (--compare: %s)\n", gr.status().message().c_str());
      }
      // nccl-tests' bus bandwidth: bytes / time times the collective's
      // factor over n ranks.
      const int n = w.ranks;
      const double factor =
          w.collective == planner::Collective::AllReduce   ? 2.0 * (n - 1) / n
          : w.collective == planner::Collective::Broadcast ? 1.0
                                                           : double(n - 1) / n;
      if (g)
        std::printf("  %10s %12s %10s %12s %10s %-16s %14s\n", "size",
                    "measured", "busbw", "model", "busbw", "(algorithm)",
                    "measured/model");
      else
        std::printf("  %10s %12s %10s\n", "size", "measured", "busbw");
      for (const planner::CollectiveTableRow &r : w.rows) {
        const auto key = std::make_tuple(int(r.collective), r.ranks, r.nodes,
                                         r.ranksPerNode, r.bytes);
        auto [it, fresh] = from.emplace(key, path);
        if (!fresh)
          fail(path + ": " + name + " over " + std::to_string(r.ranks) +
               " ranks (" + std::to_string(r.nodes) + " node" +
               (r.nodes == 1 ? "" : "s") + ", " +
               std::to_string(r.ranksPerNode) + " a node) at " +
               sizeName(r.bytes) + " was measured already, in " + it->second);
        rows.push_back(r);
        const double busbw = r.bytes * factor / r.seconds / 1e9;
        if (!g) {
          std::printf("  %10s %9.2f us %5.1f GB/s\n", sizeName(r.bytes).c_str(),
                      r.seconds * 1e6, busbw);
          continue;
        }
        auto e = model.commTime(r.collective, r.bytes, *g);
        if (!e) {
          std::printf("  %10s %9.2f us %5.1f GB/s   (model: %s)\n",
                      sizeName(r.bytes).c_str(), r.seconds * 1e6, busbw,
                      e.status().message().c_str());
          continue;
        }
        std::string how = planner::algorithmName(e->algorithm);
        if (e->protocol != planner::CommProtocol::None)
          how += std::string(" ") + planner::protocolName(e->protocol);
        std::printf("  %10s %9.2f us %5.1f GB/s %9.2f us %5.1f GB/s %-16s "
                    "%13.2fx\n",
                    sizeName(r.bytes).c_str(), r.seconds * 1e6, busbw,
                    e->time * 1e6, r.bytes * factor / e->time / 1e9,
                    ("(" + how + ")").c_str(), r.seconds / e->time);
      }
    }
  }
  planner::Calibration table;
  table.collectiveTable = rows;
  if (auto st = table.validate(); !st.isOk())
    fail(st.message());
  return rows;
}

int main(int argc, char **argv) {
  std::string calOut = "calibration.json", clusterOut = "cluster.json";
  MachineSamples s;
  int threads = 0;
  bool quick = false;
  std::vector<std::string> profiles, ncclTests;
  std::string gpuName, measuringFlag, clusterFlag, compare, compareCalibration;
  bool calOutGiven = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        usageError(a + " expects a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "-o" || a == "--calibration-out") {
      calOut = value();
      calOutGiven = true;
    } else if (a == "--cluster-out") {
      clusterOut = value();
      clusterFlag = a;
    } else if (a == "--from-profile") {
      profiles.push_back(value());
    } else if (a == "--gpu") {
      gpuName = value();
    } else if (a == "--nccl-tests") {
      ncclTests.push_back(value());
    } else if (a == "--compare") {
      compare = value();
    } else if (a == "--compare-calibration") {
      compareCalibration = value();
    } else if (a == "--devices") {
      s.devices = parseInt(a, value(), 1, 4096);
      measuringFlag = a;
    } else if (a == "--threads") {
      threads = parseInt(a, value(), 1, 4096);
      measuringFlag = a;
    } else if (a == "--name") {
      s.name = value();
      if (s.name.empty())
        usageError("--name expects a non-empty name");
      measuringFlag = a;
    } else if (a == "--quick") {
      quick = true;
      measuringFlag = a;
    } else if (a == "--statistic") {
      measuringFlag = a;
      const std::string v = value();
      if (v != "median" && v != "min")
        usageError("--statistic expects median or min, got '" + v + "'");
      gMedian = v == "median";
    } else {
      usageError("unknown option '" + a + "'");
    }
  }
  if (!compareCalibration.empty() && compare.empty())
    usageError("--compare-calibration prices --compare's figures; give "
               "--compare CLUSTER");
  if (!compare.empty() && ncclTests.empty())
    usageError("--compare prints the model beside --nccl-tests' figures; "
               "give --nccl-tests FILE");
  // The modes that measure nothing and write a calibration only.
  auto calibrationOnly = [&](const std::string &mode) {
    if (!measuringFlag.empty())
      usageError(measuringFlag + " does not apply to " + mode +
                 ", which measures nothing");
    if (!clusterFlag.empty())
      usageError("--cluster-out does not apply to " + mode +
                 ", which writes a calibration only");
  };
  if (!ncclTests.empty() && profiles.empty()) {
    // A file of the table alone: not calibration.json, which may hold
    // this machine's constants.
    if (!calOutGiven)
      calOut = "collectives.json";
    if (!gpuName.empty())
      usageError("--gpu names the device of --from-profile's profiles");
    calibrationOnly("--nccl-tests");
    if (!canWrite(calOut))
      return 1;
    planner::Calibration cal;
    cal.collectiveTable =
        importNcclTests(ncclTests, compare, compareCalibration);
    // Only the table: the file goes with --calibration beside (after)
    // another, whose constants it leaves alone.
    if (!writeText(calOut, cal.collectiveTableJson()))
      return 1;
    std::printf("wrote %s (collective_table: %zu rows)\n", calOut.c_str(),
                cal.collectiveTable.size());
    return 0;
  }
  if (!profiles.empty() || !gpuName.empty()) {
    if (profiles.empty())
      usageError("--gpu names the device of --from-profile's profiles");
    if (gpuName.empty())
      usageError("--from-profile needs --gpu: the device the profiles were "
                 "taken on");
    calibrationOnly("--from-profile");
    // A GPU preset, or a cluster file whose (first) device it is: the one
    // dlopt-calibrate wrote for this machine, say.
    auto gpu = planner::gpuPreset(gpuName);
    if (!gpu) {
      auto cluster = planner::resolveCluster(gpuName);
      if (!cluster || cluster->groups.empty())
        usageError("--gpu: " + gpu.status().message() +
                   (cluster ? "" : "; as a cluster: " +
                                       cluster.status().message()));
      gpu = cluster->groups.front().gpu;
    }
    if (!canWrite(calOut))
      return 1;
    std::vector<planner::ProfileSamples> samples;
    for (const std::string &path : profiles) {
      auto p = planner::loadProfile(path);
      if (!p) {
        std::fprintf(stderr, "dlopt-calibrate: error: %s\n",
                     p.status().message().c_str());
        return 1;
      }
      samples.push_back(p.take());
    }
    auto cal = planner::calibrateFromProfile(samples, *gpu);
    if (!cal) {
      std::fprintf(stderr, "dlopt-calibrate: error: %s\n",
                   cal.status().message().c_str());
      return 1;
    }
    for (const std::string &l : cal->lines)
      std::printf("%s\n", l.c_str());
    if (!ncclTests.empty()) {
      cal->calibration.collectiveTable =
          importNcclTests(ncclTests, compare, compareCalibration);
    }
    if (!writeText(calOut, cal->calibration.toJson()))
      return 1;
    std::printf("wrote %s\n", calOut.c_str());
    return 0;
  }
  if (!canWrite(calOut) || !canWrite(clusterOut))
    return 1;
  int worldRank = 0;
#ifdef DLOPT_HAVE_MPI
  if (launchedByMpi()) {
    auto info = initMpi(&argc, &argv);
    if (!info) {
      std::fprintf(stderr, "dlopt-calibrate: error: %s\n",
                   info.status().message().c_str());
      return 1;
    }
    worldRank = info->worldRank;
    if (info->worldSize > 1) {
      auto comm = createMpiWorld();
      if (!comm) {
        std::fprintf(stderr, "dlopt-calibrate: error: %s\n",
                     comm.status().message().c_str());
        return 1;
      }
      for (int64_t bytes : {int64_t(4) << 10, int64_t(64) << 10,
                            int64_t(1) << 20, int64_t(quick ? 4 : 16) << 20}) {
        int64_t count = bytes / 4;
        std::vector<float> in(static_cast<size_t>(count), 1.0f),
            out(static_cast<size_t>(count));
        std::vector<double> times;
        for (int rep = 0; rep < (quick ? 3 : 6); ++rep) {
          check((*comm)->barrier(), "MPI barrier");
          auto t0 = Clock::now();
          check((*comm)->allReduce(hostIn(in.data(), count, DType::F32),
                                   hostOut(out.data(), count, DType::F32),
                                   ReduceOp::Sum),
                "MPI all-reduce");
          double t = std::chrono::duration<double>(Clock::now() - t0).count();
          if (rep > 0)
            times.push_back(t);
        }
        s.mpi.push_back(
            {info->worldSize, double(bytes), summarize(std::move(times))});
      }
    }
    if (worldRank != 0) {
      finalizeMpi();
      return 0;
    }
  }
#endif
  unsigned hw = std::thread::hardware_concurrency();
  s.hostCores = int(hw ? hw : 1);
  s.hostMemoryBytes = hostMemoryBytes();
  // The kernel pool as dlopt-run sizes it (--threads, else the cores of
  // the process's CPU affinity), shared by the devices' concurrent callers.
  s.threadsPerDevice = threads ? threads : cpu::numThreads();
  cpu::setNumThreads(s.threadsPerDevice);
  gConcurrent = s.devices;
  const int reps = quick ? 2 : 5;

  // GEMMs: square, and the shapes of transformer layers and LM heads on
  // this backend's scale, both size classes (below and above the
  // multiply-adds where the kernel starts to split a GEMM: 2^21).
  s.gemmSplitMultiplyAdds = double(cpu::gemmSplitMultiplyAdds());
  std::vector<std::array<int64_t, 3>> f32Shapes =
      quick ? std::vector<std::array<int64_t, 3>>{{64, 128, 128},
                                                  {128, 128, 128},
                                                  {256, 256, 256},
                                                  {512, 512, 512},
                                                  {512, 1024, 256}}
            : std::vector<std::array<int64_t, 3>>{
                  {64, 64, 64},     {64, 128, 128},    {32, 256, 128},
                  {128, 128, 128},  {256, 256, 256},   {128, 768, 256},
                  {512, 512, 512},  {1024, 1024, 1024}, {512, 768, 768},
                  {512, 3072, 768}, {512, 768, 3072},  {512, 8192, 256},
                  {2048, 256, 256}};
  for (auto [m, n, k] : f32Shapes)
    s.gemmF32.push_back(timeGemm(DType::F32, m, n, k, reps));
  // The GEMM grid of the gemm_table: every combination of these rows,
  // columns and inner dims (docs/cost-model.md, "GEMM efficiency by shape
  // on a CPU"). Small GEMMs are timed more often: one call is a few
  // microseconds.
  {
    const std::vector<int64_t> dims =
        quick ? std::vector<int64_t>{16, 128, 1024}
              : std::vector<int64_t>{16, 64, 256, 1024};
    for (int64_t m : dims)
      for (int64_t n : dims)
        for (int64_t k : dims) {
          const double flops = 2.0 * double(m * n * k);
          const int r = flops < double(1 << 24) ? 10 * reps : reps;
          s.gemmGrid.push_back(timeGemm(DType::F32, m, n, k, r, /*cold=*/true));
        }
  }
  // The convolution grid of the conv_table: 3x3 convolutions whose im2col
  // GEMM dims are every combination of m = output channels, k = 9 x input
  // channels and n = output pixels over the batch (2x2, 8x8 and 32x32
  // planes), the shapes from a ResNet's last layers to a small CNN's first
  // (docs/cost-model.md, "Convolutions on a CPU").
  {
    const std::vector<int64_t> outs =
        quick ? std::vector<int64_t>{16, 512} : std::vector<int64_t>{16, 64, 512};
    const std::vector<int64_t> ins =
        quick ? std::vector<int64_t>{1, 256} : std::vector<int64_t>{1, 16, 256};
    // (images, plane side): n = 32, 512, 4096 pixels.
    const std::vector<std::pair<int64_t, int64_t>> planes =
        quick ? std::vector<std::pair<int64_t, int64_t>>{{8, 2}, {4, 32}}
              : std::vector<std::pair<int64_t, int64_t>>{{8, 2}, {8, 8}, {4, 32}};
    for (int64_t o : outs)
      for (int64_t c : ins)
        for (auto [n, h] : planes) {
          const double flops = 2.0 * double(o * 9 * c * n * h * h);
          const int r = flops < double(1 << 24) ? 10 * reps : reps;
          s.convGrid.push_back(timeConv(o, c, n, h, r));
        }
    s.convImplementation = cpu::convImplementationName();
  }
  for (DType t : {DType::BF16, DType::F16})
    for (int64_t d : {int64_t(256), int64_t(quick ? 256 : 512)}) {
      GemmSample g = timeGemm(t, d, d, d, reps);
      (t == DType::BF16 ? s.gemmBf16 : s.gemmF16).push_back(g);
    }

  // Attention forward, f32, not causal: 4 b h s t d FLOPs.
  {
    int64_t b = 2, h = 4, sq = quick ? 64 : 128, d = 64;
    std::vector<float> q(size_t(b * h * sq * d), 0.01f);
    std::vector<std::vector<float>> o(static_cast<size_t>(gConcurrent), q);
    std::atomic<int> next{0};
    Instr in;
    in.op = "attention";
    in.loc = "dlopt-calibrate";
    in.attrs["causal"] = AttrValue(int64_t(0));
    in.attrs["scale"] = AttrValue(0.125);
    TensorType tt{DType::F32, {b, h, sq, d}};
    s.attentionSeconds = timed(reps, [&] {
      TensorRef ins[3] = {{q.data(), tt}, {q.data(), tt}, {q.data(), tt}};
      TensorRef outs[1] = {{o[size_t(next++ % gConcurrent)].data(), tt}};
      check(cpu::runKernel(in, ins, outs), "attention");
    });
    s.attentionFlops = 4.0 * double(b * h * sq * sq * d);
  }
  // Memory-bound kernels. The memory bandwidth: an add (two read, one
  // written) of 64 MiB arrays (16 MiB quick), more than the caches hold.
  // The op rates (op_gb_s): one op of each class (planner MemoryClass) with
  // its data in the cache, as a training step's activations of a few MiB
  // are (each op reads what the op before it wrote): an add and a ReLU
  // (streams), the tanh GELU, a layer norm over rows of 256, a softmax
  // over rows of 128, a training batch norm over 16 channels of 28x28
  // planes and a 2x2 max pool, each reading and writing about a quarter of
  // the device's share of the last-level cache (at most 8 MiB; 4 MiB where
  // the cache size is unknown). Bytes are counted as the planner counts
  // them: operands read once plus results written once.
  s.cacheBytes = lastLevelCacheBytes() / s.devices;
  {
    const double footprint =
        s.cacheBytes > 0 ? std::min(s.cacheBytes / 4, double(8 << 20))
                         : double(4 << 20);
    const int64_t big = int64_t(quick ? 4 : 16) << 20;
    // Elements per array, a multiple of a batch norm image (16 x 28 x 28).
    const int64_t plane = 16 * 28 * 28;
    const int64_t small = std::max<int64_t>(
        plane, int64_t(footprint / 8 / double(plane)) * plane);
    const size_t callers = static_cast<size_t>(gConcurrent);
    std::vector<std::vector<float>> x(callers), y(callers), z(callers);
    for (size_t i = 0; i < callers; ++i) {
      x[i].assign(size_t(big), 0.5f);
      y[i].assign(size_t(big), 2.0f);
      z[i].assign(size_t(big), 0.0f);
    }
    std::vector<float> w(256, 1.0f), bias(256, 0.0f), stats(16, 0.5f),
        statsOut(16 * callers);
    std::vector<std::vector<float>> gradW(callers, std::vector<float>(512));
    struct Stream {
      const char *op;
      TensorType in, out;
      int inputs; ///< tensors of in's shape
      bool cached;
      std::map<std::string, AttrValue> attrs;
    };
    auto flat = [](int64_t n) { return TensorType{DType::F32, {n}}; };
    const TensorType rows256{DType::F32, {small / 256, 256}},
        rows128{DType::F32, {small / 128, 128}},
        images{DType::F32, {small / plane, 16, 28, 28}},
        pooled{DType::F32, {small / plane, 16, 14, 14}},
        // The same bytes in 8x8 planes: 12.25 times the planes, for the
        // pool's per-plane cost (op_row_ns).
        planes8{DType::F32, {small / (49 * 64), 49, 8, 8}},
        pooled8{DType::F32, {small / (49 * 64), 49, 4, 4}};
    const AttrValue two = AttrValue(std::vector<int64_t>{2, 2});
    const TensorType vec16{DType::F32, {16}};
    std::vector<Stream> streams = {
        {"add", flat(big), flat(big), 2, false, {}},
        {"add", flat(small), flat(small), 2, true, {}},
        {"relu", flat(small), flat(small), 1, true, {}},
        {"gelu", flat(small), flat(small), 1, true,
         {{"approximate", AttrValue(std::string("tanh"))}}},
        {"layer_norm", rows256, rows256, 1, true,
         {{"axis", AttrValue(int64_t(1))}, {"eps", AttrValue(1e-5)}}},
        {"softmax", rows128, rows128, 1, true, {{"dim", AttrValue(int64_t(1))}}},
        {"batch_norm", images, images, 1, true,
         {{"eps", AttrValue(1e-5)},
          {"momentum", AttrValue(0.1)},
          {"training", AttrValue(int64_t(1))}}},
        {"max_pool2d", images, pooled, 1, true,
         {{"kernel", two}, {"stride", two}}},
        {"max_pool2d", planes8, pooled8, 1, true,
         {{"kernel", two}, {"stride", two}}},
    };
    for (const Stream &st : streams) {
      std::atomic<int> next{0};
      Instr in;
      in.op = st.op;
      in.loc = "dlopt-calibrate";
      in.attrs = st.attrs;
      const std::string op = st.op;
      double secs = timed(st.cached ? 4 * reps : reps, [&] {
        size_t me = size_t(next++ % gConcurrent);
        std::vector<TensorRef> ins = {{x[me].data(), st.in}};
        std::vector<TensorRef> outs = {{z[me].data(), st.out}};
        if (st.inputs == 2)
          ins.push_back({y[me].data(), st.in});
        if (op == "layer_norm") {
          ins.push_back({w.data(), {DType::F32, {256}}});
          ins.push_back({bias.data(), {DType::F32, {256}}});
        } else if (op == "batch_norm") {
          for (int i = 0; i < 4; ++i)
            ins.push_back({stats.data(), vec16});
          outs.push_back({statsOut.data() + 16 * me, vec16});
          outs.push_back({statsOut.data() + 16 * me, vec16});
        }
        check(cpu::runKernel(in, ins, outs), st.op);
      });
      const double bytes =
          4.0 * double(st.inputs * st.in.numElements() + st.out.numElements());
      s.streams.push_back({st.op, bytes, secs, st.cached});
      s.streams.back().rows = planner::memoryRowsOf(st.op, st.out.shape);
      // The gradient kernel dlopt's backward runs for this op, on the same
      // shape (the add's gradient is its incoming one: no kernel). Its time
      // over the forward's is the class's backward ratio.
      if (!st.cached || op == "add")
        continue;
      Instr gi;
      gi.loc = "dlopt-calibrate";
      gi.attrs = st.attrs;
      if (op == "relu") {
        // select(x > 0, dy, 0), as dlopt-autodiff emits it, fused.
        using fused::OpCode;
        fused::Program p;
        p.numInputs = 2;
        p.consts = {0.0};
        p.steps = {{OpCode::CmpGt, 0, 2}, {OpCode::Select, 3, 1, 2}};
        p.outputs = {4};
        gi.op = fused::kOpName;
        gi.attrs.clear();
        fused::encode(p, gi);
      } else {
        gi.op = op + "_grad";
      }
      std::atomic<int> gnext{0};
      const double gsecs = timed(4 * reps, [&] {
        size_t me = size_t(gnext++ % gConcurrent);
        std::vector<TensorRef> ins = {{x[me].data(), st.in}};
        std::vector<TensorRef> outs = {{z[me].data(), st.in}};
        float *side = statsOut.data() + 16 * me;
        if (op == "batch_norm") {
          ins.push_back({stats.data(), vec16}); // w
          ins.push_back({stats.data(), vec16}); // mean
          ins.push_back({stats.data(), vec16}); // var
          ins.push_back({y[me].data(), st.in}); // dy
          outs.push_back({side, vec16});
          outs.push_back({side, vec16});
        } else if (op == "max_pool2d") {
          ins.push_back({y[me].data(), st.out}); // dy
        } else if (op == "layer_norm") {
          ins.push_back({y[me].data(), st.in}); // dy
          ins.push_back({w.data(), {DType::F32, {256}}});
          outs.push_back({gradW[me].data(), {DType::F32, {256}}});
          outs.push_back({gradW[me].data() + 256, {DType::F32, {256}}});
        } else {
          ins.push_back({y[me].data(), st.in}); // dy
        }
        check(cpu::runKernel(gi, ins, outs), gi.op.c_str());
      });
      s.streams.back().gradientSeconds = gsecs;
    }
  }
  // The optimizer update: the fused AdamW program dlopt-compile emits
  // (f32, weight decay; inputs g, m, v, the two bias corrections and the
  // parameter; m, v and the parameter updated in place), 28 bytes per
  // parameter read + written. Its rate prices the optimizer step
  // (optimizer_gb_s): on a CPU its sqrt and divide keep it below the
  // streaming kernels' bandwidth.
  {
    const int64_t n = int64_t(quick ? 1 : 4) << 20;
    const size_t callers = static_cast<size_t>(gConcurrent);
    std::vector<std::vector<float>> g(callers), m(callers), v(callers),
        p(callers);
    for (size_t i = 0; i < callers; ++i) {
      g[i].assign(size_t(n), 1e-3f);
      m[i].assign(size_t(n), 0.0f);
      v[i].assign(size_t(n), 0.0f);
      p[i].assign(size_t(n), 0.5f);
    }
    float c1 = 10.0f, c2 = 1000.0f;
    // Registers: inputs g 0, m 1, v 2, c1 3, c2 4, p 5; constants
    // 1-b1 6, b1 7, lr = 1-b2 8, b2 9, eps 10, wd 11; steps from 12.
    using fused::OpCode;
    fused::Program adamw;
    adamw.numInputs = 6;
    adamw.consts = {0.1, 0.9, 1e-3, 0.999, 1e-8, 0.01};
    adamw.steps = {
        {OpCode::Mul, 0, 6},   // 12 = (1-b1) g
        {OpCode::Mul, 1, 7},   // 13 = b1 m
        {OpCode::Add, 13, 12}, // 14 = m'
        {OpCode::Mul, 0, 0},   // 15 = g^2
        {OpCode::Mul, 15, 8},  // 16 = (1-b2) g^2
        {OpCode::Mul, 2, 9},   // 17 = b2 v
        {OpCode::Add, 17, 16}, // 18 = v'
        {OpCode::Mul, 14, 3},  // 19 = m' c1
        {OpCode::Mul, 18, 4},  // 20 = v' c2
        {OpCode::Sqrt, 20, -1},
        {OpCode::Add, 21, 10}, // 22 = sqrt + eps
        {OpCode::Div, 19, 22},
        {OpCode::Mul, 5, 11},  // 24 = wd p
        {OpCode::Add, 23, 24},
        {OpCode::Mul, 25, 8},  // 26 = lr (...)
        {OpCode::Sub, 5, 26},  // 27 = p'
    };
    adamw.outputs = {14, 18, 27};
    Instr in;
    in.op = fused::kOpName;
    in.loc = "dlopt-calibrate";
    fused::encode(adamw, in);
    std::atomic<int> next{0};
    const TensorType vec{DType::F32, {n}}, scalar{DType::F32, {}};
    s.optimizerSeconds = timed(reps, [&] {
      size_t me = size_t(next++ % gConcurrent);
      TensorRef ins[6] = {{g[me].data(), vec}, {m[me].data(), vec},
                          {v[me].data(), vec}, {&c1, scalar},
                          {&c2, scalar},       {p[me].data(), vec}};
      TensorRef outs[3] = {
          {m[me].data(), vec}, {v[me].data(), vec}, {p[me].data(), vec}};
      check(cpu::runKernel(in, ins, outs), "fused AdamW update");
    });
    s.optimizerBytes = 28.0 * double(n);
  }
  // Dispatch: one-element adds, the mean over many calls.
  {
    Instr in;
    in.op = "add";
    in.loc = "dlopt-calibrate";
    TensorType tt{DType::F32, {1}};
    const int calls = quick ? 2000 : 20000;
    s.dispatchSeconds = timed(reps, [&] {
                          float x = 1, y = 2, z = 0;
                          TensorRef ins[2] = {{&x, tt}, {&y, tt}};
                          TensorRef outs[1] = {{&z, tt}};
                          for (int i = 0; i < calls; ++i)
                            check(cpu::runKernel(in, ins, outs), "add");
                        }) /
                        calls;
  }
  // All-reduce between in-process ranks (threads), as in-graph plans run.
  {
    // Measured again (up to three times, with more repetitions) when a
    // loaded machine gave times that do not grow with the message size.
    int ranks = std::max(2, s.devices);
    for (int attempt = 0; attempt < 3; ++attempt) {
      s.inProcess.clear();
      for (int64_t bytes : {int64_t(4) << 10, int64_t(64) << 10,
                            int64_t(1) << 20, int64_t(quick ? 4 : 16) << 20})
        s.inProcess.push_back(timeInProcess(ranks, bytes, reps << attempt));
      if (planner::fitAllReduce(s.inProcess))
        break;
    }
    // The three collectives a plan's groups run, measured by size over the
    // same ranks: the calibration's collective_table, which prices a group
    // of this shape from the measurement (the all-reduce's samples above,
    // the all-gather and reduce-scatter timed here).
    for (const AllReduceSample &a : s.inProcess)
      s.collectives.push_back({planner::Collective::AllReduce, a.ranks, 1,
                               a.ranks, a.bytes, a.seconds, ""});
    for (planner::Collective coll :
         {planner::Collective::AllGather, planner::Collective::ReduceScatter})
      for (const AllReduceSample &a : s.inProcess) {
        AllReduceSample t = timeInProcess(ranks, int64_t(a.bytes), reps, coll);
        s.collectives.push_back(
            {coll, t.ranks, 1, t.ranks, t.bytes, t.seconds, ""});
      }
  }

  auto cal = planner::calibrateMachine(s);
  if (!cal) {
    std::fprintf(stderr, "dlopt-calibrate: error: %s\n",
                 cal.status().message().c_str());
    return 1;
  }
  std::printf("each sample: the %s of %d or more timed calls after a warm-up "
              "(--statistic %s)\n",
              gMedian ? "median" : "fastest", reps,
              gMedian ? "median" : "min");
  for (const std::string &l : cal->lines)
    std::printf("%s\n", l.c_str());
  if (!writeText(calOut, cal->calibration.toJson()) ||
      !writeText(clusterOut, cal->clusterJson))
    return 1;
  std::printf("wrote %s and %s\n", calOut.c_str(), clusterOut.c_str());
#ifdef DLOPT_HAVE_MPI
  if (launchedByMpi())
    finalizeMpi();
#endif
  return 0;
}
