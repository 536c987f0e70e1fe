//===- MachineCalibration.cpp - Calibration and cluster from measurements -===//

#include "planner/MachineCalibration.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace dlopt::planner {

namespace {

double median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

std::string fmt(const char *f, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

double clampEff(double e) { return std::min(1.0, std::max(1e-3, e)); }

/// Best rate of the samples (FLOP/s), 0 without samples.
double peakOf(const std::vector<GemmSample> &g) {
  double best = 0;
  for (const GemmSample &s : g)
    if (s.seconds > 0)
      best = std::max(best, s.flops() / s.seconds);
  return best;
}

} // namespace

LineFit fitLine(const std::vector<std::pair<double, double>> &xy) {
  // Weighted by 1 / y^2: relative errors count the same at every size, so
  // the small messages fix the intercept and the large ones the slope.
  LineFit f;
  if (xy.empty())
    return f;
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [x, y] : xy) {
    double w = y != 0 ? 1.0 / (y * y) : 1.0;
    sw += w;
    sx += w * x;
    sy += w * y;
    sxx += w * x * x;
    sxy += w * x * y;
  }
  double den = sw * sxx - sx * sx;
  if (xy.size() >= 2 && den > 0) {
    f.slope = (sw * sxy - sx * sy) / den;
    f.intercept = (sy - f.slope * sx) / sw;
  }
  if (xy.size() < 2 || den <= 0 || f.intercept < 0) {
    f.intercept = 0;
    f.slope = sxx > 0 ? sxy / sxx : 0;
  }
  return f;
}

Expected<LinkFit> fitAllReduce(const std::vector<AllReduceSample> &samples) {
  int n = 0;
  for (const AllReduceSample &s : samples)
    n = std::max(n, s.ranks);
  if (n < 2)
    return Status::error("all-reduce samples need at least 2 ranks");
  std::vector<std::pair<double, double>> xy;
  for (const AllReduceSample &s : samples)
    if (s.ranks == n && s.seconds > 0)
      xy.push_back({s.bytes, s.seconds});
  if (xy.size() < 2)
    return Status::error("all-reduce samples need at least 2 message sizes");
  LineFit f = fitLine(xy);
  const auto [lo, hi] = std::minmax_element(
      xy.begin(), xy.end(),
      [](const auto &a, const auto &b) { return a.first < b.first; });
  if (f.slope <= 0) {
    // A small message slowed by the machine's load (a thread woken late)
    // can outweigh the rest in the weighted fit. The largest message and
    // the smallest still give the bandwidth, and the line through them the
    // latency.
    f.slope = hi->first > lo->first
                  ? (hi->second - lo->second) / (hi->first - lo->first)
                  : 0;
    f.intercept = std::max(0.0, lo->second - f.slope * lo->first);
  }
  if (f.slope <= 0)
    return Status::error(
        "all-reduce time does not grow with the message size (" +
        std::to_string(lo->second * 1e6) + " us at the smallest, " +
        std::to_string(hi->second * 1e6) +
        " us at the largest): the machine was too busy to measure; run "
        "again when it is quieter");
  LinkFit l;
  l.ranks = n;
  l.bandwidth = 2.0 * (n - 1) / n / f.slope;
  l.latency = f.intercept / (2.0 * (n - 1));
  return l;
}

Expected<MachineCalibration> calibrateMachine(const MachineSamples &s) {
  if (s.devices < 1)
    return Status::error("calibration: devices per node must be >= 1, got " +
                         std::to_string(s.devices));
  const double peak32 = std::max(peakOf(s.gemmF32), peakOf(s.gemmGrid));
  if (peakOf(s.gemmF32) <= 0)
    return Status::error("calibration: no timed f32 GEMM samples");
  if (!(s.gemmSplitMultiplyAdds > 0))
    return Status::error(
        "calibration: expected the GEMM split size (multiply-adds) > 0, got " +
        std::to_string(s.gemmSplitMultiplyAdds));
  MachineCalibration out;
  Calibration &c = out.calibration;
  auto &L = out.lines;
  L.push_back(fmt("f32 GEMM peak: %.1f GFLOP/s per device (%.0f devices at "
                  "once on %.0f kernel threads)",
                  peak32 * 1e-9, s.devices, s.threadsPerDevice));
  // Size classes: the backend runs a GEMM below its split size as one
  // single-threaded call, so that is the class boundary here.
  c.matmulSmallFlops = 2.0 * s.gemmSplitMultiplyAdds;
  std::vector<double> small, large;
  for (const GemmSample &g : s.gemmF32)
    if (g.seconds > 0)
      (g.flops() < c.matmulSmallFlops ? small : large)
          .push_back(g.flops() / g.seconds / peak32);
  if (!large.empty())
    c.matmulLargeEfficiency = clampEff(median(large));
  if (!small.empty())
    c.matmulSmallEfficiency = clampEff(median(small));
  L.push_back(fmt("GEMM efficiency against that peak: large %.2f (median of "
                  "%.0f), small %.2f",
                  c.matmulLargeEfficiency, double(large.size()),
                  c.matmulSmallEfficiency));
  // No tile model on a CPU (the device gets no SM count): GEMMs are priced
  // by the measured grid instead, where there is one.
  if (!s.gemmGrid.empty()) {
    for (const GemmSample &g : s.gemmGrid)
      if (g.seconds > 0)
        c.gemmTable.push_back({double(g.m), double(g.n), double(g.k),
                               clampEff(g.flops() / g.seconds / peak32)});
    if (Status st = c.validate(); !st.isOk()) {
      L.push_back("GEMM grid left out: " + st.message());
      c.gemmTable.clear();
    } else {
      double lo = 1, hi = 0;
      for (const GemmTableRow &r : c.gemmTable) {
        lo = std::min(lo, r.efficiency);
        hi = std::max(hi, r.efficiency);
      }
      L.push_back(fmt("GEMM grid: %.0f shapes, efficiency %.3f to %.3f of "
                      "the peak (gemm_table)",
                      double(c.gemmTable.size()), lo, hi));
    }
  }
  // Convolutions: their own kernels' rates where measured (a CPU backend
  // with oneDNN runs them faster than their im2col GEMMs).
  if (!s.convGrid.empty()) {
    for (const MachineSamples::ConvSample &g : s.convGrid)
      if (g.forwardSeconds > 0 && g.gradInputSeconds > 0 &&
          g.gradFilterSeconds > 0)
        c.convTable.push_back(
            {double(g.m), double(g.n), double(g.k), g.flops() / g.forwardSeconds,
             g.flops() / g.gradInputSeconds, g.flops() / g.gradFilterSeconds});
    if (Status st = c.validate(); !st.isOk()) {
      L.push_back("convolution grid left out: " + st.message());
      c.convTable.clear();
    } else {
      double lo = 1e30, hi = 0;
      for (const ConvTableRow &r : c.convTable)
        for (double v : {r.forward, r.gradInput, r.gradFilter}) {
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
      L.push_back(fmt("convolution grid: %.0f shapes, %.1f to %.1f GFLOP/s "
                      "(conv_table)",
                      double(c.convTable.size()), lo * 1e-9, hi * 1e-9) +
                  (s.convImplementation.empty()
                       ? std::string()
                       : ", through " + s.convImplementation));
    }
  }
  double attention = 0;
  if (s.attentionSeconds > 0 && s.attentionFlops > 0) {
    attention = s.attentionFlops / s.attentionSeconds;
    c.attentionEfficiency = clampEff(attention / peak32);
    c.attentionEfficiencyGiven = true;
    L.push_back(fmt("attention: %.1f GFLOP/s, efficiency %.3f of the peak",
                    attention * 1e-9, c.attentionEfficiency));
  }
  double bandwidth = 0;
  std::vector<double> rates;
  std::string each;
  std::vector<double> classRates[kNumMemoryClasses],
      classBackward[kNumMemoryClasses];
  std::vector<const MachineSamples::StreamSample *>
      classSamples[kNumMemoryClasses];
  for (const MachineSamples::StreamSample &st : s.streams) {
    if (!(st.seconds > 0 && st.bytes > 0))
      continue;
    if (st.cached) {
      const size_t cls = size_t(memoryClassOf(st.op));
      classRates[cls].push_back(st.bytes / st.seconds);
      classSamples[cls].push_back(&st);
      if (st.gradientSeconds > 0)
        classBackward[cls].push_back(st.gradientSeconds / st.seconds);
      continue;
    }
    rates.push_back(st.bytes / st.seconds);
    each += (each.empty() ? "" : ", ") + st.op + " " +
            fmt("%.1f", rates.back() * 1e-9);
  }
  if (!rates.empty()) {
    bandwidth = median(rates);
    c.memoryBandwidthEfficiency = 1.0;
    L.push_back(fmt("memory bandwidth: %.2f GB/s (bytes read + written, "
                    "data beyond the caches; ",
                    bandwidth * 1e-9) +
                each + " GB/s)");
  }
  std::string ops, rowCosts;
  for (size_t i = 0; i < kNumMemoryClasses; ++i)
    if (!classRates[i].empty()) {
      c.opBandwidth[i] = median(classRates[i]);
      // Two samples at different rows (the pool at 28x28 and 8x8 planes):
      // t = rows a + bytes / rate, two equations in a and 1/rate.
      const MachineSamples::StreamSample *lo = nullptr, *hi = nullptr;
      for (const MachineSamples::StreamSample *x : classSamples[i]) {
        if (!lo || x->rows < lo->rows)
          lo = x;
        if (!hi || x->rows > hi->rows)
          hi = x;
      }
      const double det =
          lo && hi ? lo->rows * hi->bytes - hi->rows * lo->bytes : 0;
      if (lo && hi && hi->rows > 1.5 * lo->rows && det != 0) {
        const double a =
            (lo->seconds * hi->bytes - hi->seconds * lo->bytes) / det;
        const double inv =
            (lo->rows * hi->seconds - hi->rows * lo->seconds) / det;
        if (a > 0 && inv > 0) {
          c.opRowSeconds[i] = a;
          c.opBandwidth[i] = 1 / inv;
          rowCosts += (rowCosts.empty() ? "" : ", ") +
                      std::string(memoryClassName(MemoryClass(i))) + " " +
                      fmt("%.1f", a * 1e9);
        }
      }
      ops += (ops.empty() ? "" : ", ") +
             std::string(memoryClassName(MemoryClass(i))) + " " +
             fmt("%.1f", c.opBandwidth[i] * 1e-9);
    }
  std::string backward;
  for (size_t i = 0; i < kNumMemoryClasses; ++i)
    if (!classBackward[i].empty()) {
      c.opBackwardRatio[i] = median(classBackward[i]);
      backward += (backward.empty() ? "" : ", ") +
                  std::string(memoryClassName(MemoryClass(i))) + " " +
                  fmt("%.2f", c.opBackwardRatio[i]);
    }
  if (!ops.empty()) {
    // An op's bytes up to half the device's share of the cache: the rest
    // holds the other tensors a step keeps live around it.
    c.cacheBytes = s.cacheBytes / 2;
    L.push_back("memory-bound ops with their data in the cache (op_gb_s): " +
                ops + " GB/s; " +
                (c.cacheBytes > 0
                     ? fmt("up to %.1f MiB an op (cache_mib: half the "
                           "device's %.1f MiB of last-level cache)",
                           c.cacheBytes / double(1 << 20),
                           s.cacheBytes / double(1 << 20))
                     : std::string("cache size unknown: every op also no "
                                   "faster than the memory bandwidth")));
  }
  if (!rowCosts.empty())
    L.push_back("their fixed cost per row, from two shapes (op_row_ns; "
                "pool: per output plane): " +
                rowCosts + " ns");
  if (!backward.empty())
    L.push_back("their gradient kernels' time over the forward's "
                "(op_backward_ratio): " +
                backward);
  if (s.optimizerSeconds > 0 && s.optimizerBytes > 0) {
    c.optimizerBandwidth = s.optimizerBytes / s.optimizerSeconds;
    L.push_back(fmt("optimizer update (fused AdamW): %.2f GB/s (bytes read + "
                    "written)",
                    c.optimizerBandwidth * 1e-9));
  }
  if (s.dispatchSeconds > 0) {
    c.kernelLaunchSeconds = s.dispatchSeconds;
    L.push_back(fmt("per-op dispatch: %.2f us", s.dispatchSeconds * 1e6));
  }
  // Communication: the link figures go to the cluster, so the efficiencies
  // are 1 and the fixed cost per call is inside the per-step latency. The
  // fit is one protocol's alpha-beta terms of the measured communicator,
  // not NCCL's three.
  c.intraNodeBusEfficiency = 1.0;
  c.interNodeBusEfficiency = 1.0;
  c.collectiveLaunchLatency = 0.0;
  c.ncclProtocols = 0;
  // The CPU backend runs each rank's instructions in program order and its
  // collectives, sends and receives block the rank's thread: nothing
  // overlaps communication with compute.
  c.gradOverlapEfficiency = 0.0;
  c.p2pOverlapEfficiency = 0.0;
  // Host-side runtime state: CPU "devices" live in host memory, with no
  // CUDA context, cuBLAS workspace or NCCL buffers.
  c.runtimeReservedBytes = 0;
  c.ncclBufferBytes = 0;

  nlohmann::ordered_json gpu;
  gpu["name"] = s.name + "-device";
  const double peakBf16 = peakOf(s.gemmBf16), peakF16 = peakOf(s.gemmF16);
  gpu["peak_tflops"] = {{"fp32", peak32 * 1e-12},
                        {"tf32", peak32 * 1e-12},
                        {"bf16", peakBf16 * 1e-12},
                        {"fp16", peakF16 * 1e-12}};
  if (peakBf16 > 0 || peakF16 > 0)
    L.push_back(fmt("bf16 GEMM peak: %.1f GFLOP/s, f16: %.1f GFLOP/s",
                    peakBf16 * 1e-9, peakF16 * 1e-9));
  double devMem = s.hostMemoryBytes > 0 ? s.hostMemoryBytes / s.devices
                                        : 4.0 * (1ull << 30);
  gpu["memory_gib"] = devMem / double(1ull << 30);
  gpu["memory_bandwidth_gb_s"] =
      (bandwidth > 0 ? bandwidth : 20e9) * 1e-9;
  nlohmann::ordered_json cl;
  cl["name"] = s.name;
  // dlopt's CPU backend communicators (threads, MPI), not NCCL.
  cl["communicator"] = "cpu";
  cl["nodes"] = 1;
  cl["gpus_per_node"] = s.devices;
  cl["gpu"] = gpu;
  if (!s.inProcess.empty()) {
    auto f = fitAllReduce(s.inProcess);
    if (!f)
      return f.status().withContext("calibration: in-process all-reduce: ");
    cl["intra_node"] = {{"topology", "nvswitch"},
                        {"bandwidth_gb_s", f->bandwidth * 1e-9},
                        {"latency_us", f->latency * 1e6}};
    L.push_back(fmt("in-process all-reduce (%.0f ranks): bus bandwidth %.2f "
                    "GB/s, %.1f us per ring step",
                    f->ranks, f->bandwidth * 1e-9, f->latency * 1e6));
  } else {
    cl["intra_node"] = {{"topology", "nvswitch"},
                        {"bandwidth_gb_s", 10.0},
                        {"latency_us", 5.0}};
  }
  if (!s.mpi.empty()) {
    auto f = fitAllReduce(s.mpi);
    if (!f)
      return f.status().withContext("calibration: MPI all-reduce: ");
    cl["network"] = {{"bandwidth_gb_s", f->bandwidth * 1e-9},
                     {"latency_us", f->latency * 1e6}};
    L.push_back(fmt("MPI all-reduce (%.0f processes): bus bandwidth %.2f "
                    "GB/s, %.1f us per ring step",
                    f->ranks, f->bandwidth * 1e-9, f->latency * 1e6));
  } else {
    cl["network"] = {{"bandwidth_gb_s", 1.25}, {"latency_us", 50.0}};
  }
  nlohmann::ordered_json host;
  if (s.hostCores > 0)
    host["cpu_cores"] = s.hostCores;
  if (s.hostMemoryBytes > 0)
    host["memory_gb"] = s.hostMemoryBytes * 1e-9;
  if (!host.empty())
    cl["host"] = host;
  out.clusterJson = cl.dump(2) + "\n";
  if (!s.collectives.empty()) {
    // Measured by size: a group of the measured shape is priced from them
    // (collective_table), the fit above prices the others.
    c.collectiveTable = s.collectives;
    std::map<std::string, int> rows;
    double lo = 0, hi = 0;
    int ranks = 0;
    for (const CollectiveTableRow &r : s.collectives) {
      ++rows[collectiveTableName(r.collective)];
      lo = lo > 0 ? std::min(lo, r.bytes) : r.bytes;
      hi = std::max(hi, r.bytes);
      ranks = std::max(ranks, r.ranks);
    }
    std::string what;
    for (const auto &[name, n] : rows)
      what += (what.empty() ? "" : ", ") + name + " " + std::to_string(n);
    L.push_back("in-process collectives by size (collective_table): " + what +
                " rows" +
                fmt(", %.0f KiB to %.0f MiB over %.0f ranks", lo / 1024,
                    hi / (1024 * 1024), ranks));
  }
  DLOPT_RETURN_IF_ERROR(c.validate());
  return out;
}

} // namespace dlopt::planner
