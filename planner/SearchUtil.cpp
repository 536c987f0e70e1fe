//===- SearchUtil.cpp - What the two searches share -----------------------===//
#include "planner/SearchUtil.h"

#include "planner/ReportUtil.h"

namespace dlopt::planner {

using report::kGiB;
using report::strf;

std::vector<int64_t> divisorsOf(int64_t n) {
  std::vector<int64_t> d;
  // i <= n / i, not i * i <= n: the square overflows for n near 2^63.
  for (int64_t i = 1; i <= n / i; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i)
        d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

bool slowerGpu(const GpuSpec &a, const GpuSpec &b, Precision precision) {
  double pa = a.peak(precision), pb = b.peak(precision);
  if (pa != pb)
    return pa < pb;
  return a.memoryBandwidth < b.memoryBandwidth;
}

Expected<GpuSpec> pacingGpu(const Cluster &cluster, Precision precision) {
  GpuSpec gpu{};
  bool have = false;
  for (const NodeGroup &g : cluster.groups)
    if (!have || slowerGpu(g.gpu, gpu, precision)) {
      gpu = g.gpu;
      have = true;
    }
  if (gpu.peak(precision) <= 0)
    return Status::error(std::string("the GPU kind ") + gpu.name +
                         " has no peak FLOP/s for precision " +
                         precisionName(precision));
  return gpu;
}

HostSpec mostConstrainedHost(const Cluster &cluster) {
  HostSpec host;
  for (size_t i = 0; i < cluster.groups.size(); ++i) {
    const HostSpec &h = cluster.groups[i].host;
    if (i == 0) {
      host = h;
      continue;
    }
    if (h.cpuCores > 0 && (host.cpuCores == 0 || h.cpuCores < host.cpuCores))
      host.cpuCores = h.cpuCores;
    if (h.memoryBytes > 0 &&
        (host.memoryBytes == 0 || h.memoryBytes < host.memoryBytes))
      host.memoryBytes = h.memoryBytes;
  }
  return host;
}

double hostDispatchSeconds(double launches, ProcessLayout layout,
                           int gpusPerNode, const HostSpec &host,
                           const Calibration &cal) {
  const int G = gpusPerNode;
  const double coreFactor =
      host.cpuCores > 0 ? std::max(1.0, double(G) / host.cpuCores) : 1.0;
  const double contention = layout == ProcessLayout::InGraph
                                ? 1 + cal.inGraphLaunchContention * (G - 1)
                                : 1.0;
  return launches * cal.kernelLaunchSeconds * contention * coreFactor;
}

std::string joinReasons(const std::vector<std::string> &why) {
  std::string out;
  for (const auto &w : why)
    out += (out.empty() ? "" : "; ") + w;
  return out;
}

std::vector<BatchSplit> batchSplits(int dp, int64_t gb, const FixSpec &fix,
                                    int64_t maxMicroBatch,
                                    std::map<std::string, int64_t> &pruned) {
  std::vector<BatchSplit> out;
  if (fix.dp && *fix.dp != dp)
    return out;
  if (gb % dp) {
    ++pruned["dp does not divide the global batch"];
    return out;
  }
  const int64_t local = gb / dp;
  for (int64_t mbs : divisorsOf(local)) {
    if (fix.mbs && *fix.mbs != mbs)
      continue;
    if (!fix.mbs && maxMicroBatch > 0 && mbs > maxMicroBatch) {
      ++pruned["micro-batch above the size limit"];
      continue;
    }
    const int64_t m = local / mbs;
    if (fix.numMicroBatches && *fix.numMicroBatches != m)
      continue;
    out.push_back({mbs, m});
  }
  return out;
}

Status noCandidateError(const std::string &fixNote, int devices,
                        int64_t globalBatch,
                        const std::map<std::string, int64_t> &pruned) {
  std::vector<std::string> counted;
  for (const auto &[why, n] : pruned)
    counted.push_back(why + " (" + std::to_string(n) + ")");
  std::string reasons = joinReasons(counted);
  return Status::error("no candidate plan" + fixNote + " for " +
                       std::to_string(devices) + " devices and a global "
                       "batch of " + std::to_string(globalBatch) +
                       ": every candidate was pruned: " +
                       (reasons.empty() ? "no shape matches" : reasons));
}

Status noFitError(const std::string &fixNote, double smallestPeak,
                  const std::string &key, double capacity) {
  return Status::error(
      "no plan fits in memory" + fixNote + ": the smallest peak found is " +
      strf("%.2f", smallestPeak / kGiB) + " GiB per device (" + key +
      ") against a capacity of " + strf("%.2f", capacity / kGiB) +
      " GiB, over by " + strf("%.2f", (smallestPeak - capacity) / kGiB) +
      " GiB");
}

std::string slowerWhy(double time, double bestTime) {
  return "slower by " + strf("%.1f", 100.0 * (time / bestTime - 1)) + "%";
}

std::string outOfMemoryWhy(double memory, double capacity, double time,
                           double bestTime) {
  return "out of memory by " + strf("%.2f", (memory - capacity) / kGiB) +
         " GiB (" + strf("%.1f", 100.0 * (1 - time / bestTime)) +
         "% faster)";
}

} // namespace dlopt::planner
