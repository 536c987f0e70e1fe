//===- Cluster.cpp - Presets, YAML/JSON parsing and communicator links ----===//
#include "planner/Cluster.h"

#include "runtime/support/FileRead.h"
#include "runtime/support/JsonLimits.h"

#include <nlohmann/json.hpp>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace dlopt::planner {

using json = nlohmann::ordered_json;

//===----------------------------------------------------------------------===//
// Names
//===----------------------------------------------------------------------===//

const char *precisionName(Precision p) {
  switch (p) {
  case Precision::FP8:
    return "fp8";
  case Precision::BF16:
    return "bf16";
  case Precision::FP16:
    return "fp16";
  case Precision::TF32:
    return "tf32";
  case Precision::FP32:
    return "fp32";
  }
  return "?";
}

std::optional<Precision> parsePrecision(std::string_view s) {
  for (int i = 0; i < kNumPrecisions; ++i)
    if (s == precisionName(static_cast<Precision>(i)))
      return static_cast<Precision>(i);
  return std::nullopt;
}

const char *topologyName(IntraTopology t) {
  return t == IntraTopology::NVSwitch ? "nvswitch" : "ring";
}

//===----------------------------------------------------------------------===//
// Presets (numbers from the public hardware table in design.md)
//===----------------------------------------------------------------------===//

namespace {

constexpr double kT = 1e12, kG = 1e9, kUs = 1e-6;

GpuSpec makeGpu(const char *name, double fp8, double bf16, double fp16,
                double tf32, double fp32, double memGB, double bwGBs) {
  GpuSpec g;
  g.name = name;
  g.setPeak(Precision::FP8, fp8 * kT);
  g.setPeak(Precision::BF16, bf16 * kT);
  g.setPeak(Precision::FP16, fp16 * kT);
  g.setPeak(Precision::TF32, tf32 * kT);
  g.setPeak(Precision::FP32, fp32 * kT);
  g.memoryBytes = memGB * kG;
  g.memoryBandwidth = bwGBs * kG;
  return g;
}

/// Device memory as the driver reports it (nvidia-smi's memory.total,
/// cudaMemGetInfo's total), in MiB: the real capacity, of which the memory
/// model sets aside runtime_reserved_gib, the NCCL buffers and the
/// fragmentation allowance (docs/cost-model.md, "Workspace").
constexpr double kMiB = 1024.0 * 1024.0;
GpuSpec withMemoryMiB(GpuSpec g, double mib, int sms,
                      double attentionEfficiency = 0,
                      bool persistentGemms = false) {
  g.memoryBytes = mib * kMiB;
  g.sms = sms;
  g.attentionEfficiency = attentionEfficiency;
  g.persistentGemms = persistentGemms;
  return g;
}

// Fused attention, forward + backward, with FlashAttention-2-class kernels
// (warp-level mma.sync: dlopt's, FlashAttention-2's, Triton's): about 0.60
// of the A100's dense peak (Dao 2023: 50-73% forward, lower backward), and
// at most 335 of the H100's 989 TFLOP/s (Dao 2023, H100 figure; the kernels
// use neither Hopper's wgmma nor TMA, which FlashAttention-3 needs for its
// ~75%, Shah et al. 2024). The H200 has the H100's SMs.
constexpr double kAttentionAmpere = 0.60, kAttentionHopperFa2 = 0.34;

// cuBLAS's Hopper GEMMs are persistent kernels (one CTA per SM, a static
// tile schedule: pytorch/pytorch#143988, #144974; NVIDIA/cutlass#2471);
// its Ampere GEMMs launch one CTA per output tile.
constexpr bool kPersistentHopper = true;

const std::map<std::string, GpuSpec> &gpuTable() {
  static const std::map<std::string, GpuSpec> t = {
      // 81920 MiB: NVIDIA's A100 80GB data sheet (80 GiB).
      {"a100-sxm-80gb",
       withMemoryMiB(makeGpu("A100-SXM-80GB", 0, 312, 312, 156, 19.5, 80, 2000),
                     81920, 108, kAttentionAmpere)},
      // 81559 MiB and 143771 MiB: nvidia-smi on the H100 and H200 of
      // dlopt's GPU sessions (docs/gpu-runs), 132 SMs each (cudaDevAttr
      // MultiProcessorCount there); the A100 has 108.
      {"h100-sxm-80gb",
       withMemoryMiB(
           makeGpu("H100-SXM-80GB", 1979, 989, 989, 495, 67, 80, 3350), 81559,
           132, kAttentionHopperFa2, kPersistentHopper)},
      {"h200-sxm-141gb",
       withMemoryMiB(
           makeGpu("H200-SXM-141GB", 1979, 989, 989, 495, 67, 141, 4800),
           143771, 132, kAttentionHopperFa2, kPersistentHopper)},
      // A deliberately small "device" for tests on the CPU backend.
      {"cpu-device", makeGpu("CPU-device", 0, 0.025, 0.025, 0.05, 0.05, 4, 20)},
  };
  return t;
}

struct PresetDef {
  const char *gpu;
  int gpusPerNode;
  IntraNodeLink intra;
  NetworkLink network;
  HostSpec host;
  bool nccl = true; ///< Cluster::ncclCollectives
};

const std::map<std::string, PresetDef> &presetTable() {
  // NVLink bandwidth in the table is both directions; the model uses one
  // direction. Network: NICs x line rate / 8 bits, per direction.
  static const std::map<std::string, PresetDef> t = {
      {"dgx-a100",
       {"a100-sxm-80gb",
        8,
        {IntraTopology::NVSwitch, 300 * kG, 1 * kUs},
        {8 * 200 / 8.0 * kG, 5 * kUs},
        {128, 1024 * kG}}}, // 2x EPYC 7742, 1 TB (DGX A100 user guide)
      {"dgx-h100",
       {"h100-sxm-80gb",
        8,
        {IntraTopology::NVSwitch, 450 * kG, 1 * kUs, /*nvls=*/true},
        {8 * 400 / 8.0 * kG, 5 * kUs},
        {112, 2048 * kG}}}, // 2x Xeon 8480C, 2 TB (DGX H100 user guide)
      {"dgx-h200",
       {"h200-sxm-141gb",
        8,
        {IntraTopology::NVSwitch, 450 * kG, 1 * kUs, /*nvls=*/true},
        {8 * 400 / 8.0 * kG, 5 * kUs},
        {112, 2048 * kG}}}, // 2x Xeon 8480C, 2 TB (DGX H200)
      {"cpu",
       {"cpu-device",
        2,
        {IntraTopology::NVSwitch, 10 * kG, 5 * kUs},
        {1.25 * kG, 50 * kUs},
        {2, 24 * kG},
        /*nccl=*/false}},
  };
  return t;
}

/// Aliases accepted on input; listed next to their target.
const std::map<std::string, std::string> &presetAliases() {
  static const std::map<std::string, std::string> a = {{"h200", "dgx-h200"}};
  return a;
}

std::string joinNames(const std::vector<std::string> &names) {
  std::string s;
  for (const auto &n : names)
    s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::string fmtNum(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

} // namespace

std::vector<std::string> clusterPresetNames() {
  std::vector<std::string> names;
  for (const auto &[k, v] : presetTable())
    names.push_back(k);
  for (const auto &[k, v] : presetAliases())
    names.push_back(k);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> gpuPresetNames() {
  std::vector<std::string> names;
  for (const auto &[k, v] : gpuTable())
    names.push_back(k);
  return names;
}

Expected<GpuSpec> gpuPreset(std::string_view name) {
  auto it = gpuTable().find(std::string(name));
  if (it == gpuTable().end())
    return Status::error("unknown GPU kind '" + std::string(name) +
                         "' (known: " + joinNames(gpuPresetNames()) + ")");
  return it->second;
}

Expected<Cluster> clusterPreset(std::string_view name, int nodes) {
  std::string key(name);
  if (auto a = presetAliases().find(key); a != presetAliases().end())
    key = a->second;
  auto it = presetTable().find(key);
  if (it == presetTable().end())
    return Status::error("unknown cluster preset '" + std::string(name) +
                         "' (known: " + joinNames(clusterPresetNames()) + ")");
  if (nodes < 0)
    return Status::error("cluster preset '" + key +
                         "': node count must be positive, got " +
                         std::to_string(nodes));
  if (nodes == 0)
    nodes = 1;
  const PresetDef &p = it->second;
  Cluster c;
  c.name = nodes == 1 ? key : key + ":" + std::to_string(nodes);
  NodeGroup g;
  g.count = nodes;
  g.gpusPerNode = p.gpusPerNode;
  g.gpu = gpuTable().at(p.gpu);
  g.intra = p.intra;
  g.network = p.network;
  g.host = p.host;
  c.groups.push_back(g);
  c.ncclCollectives = p.nccl;
  return c;
}

//===----------------------------------------------------------------------===//
// Cluster queries
//===----------------------------------------------------------------------===//

int Cluster::numNodes() const {
  int n = 0;
  for (const auto &g : groups)
    n += g.count;
  return n;
}

int Cluster::numDevices() const {
  int n = 0;
  for (const auto &g : groups)
    n += g.count * g.gpusPerNode;
  return n;
}

double Cluster::minDeviceMemory() const {
  double m = 0;
  for (size_t i = 0; i < groups.size(); ++i)
    m = i == 0 ? groups[i].gpu.memoryBytes
               : std::min(m, groups[i].gpu.memoryBytes);
  return m;
}

Expected<DeviceLocation> Cluster::locate(int rank) const {
  int total = numDevices();
  if (rank < 0 || rank >= total)
    return Status::error("rank " + std::to_string(rank) +
                         " is out of range: the cluster has " +
                         std::to_string(total) + " devices");
  int base = 0, nodeBase = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const NodeGroup &g = groups[gi];
    int n = g.count * g.gpusPerNode;
    if (rank < base + n) {
      int off = rank - base;
      return DeviceLocation{nodeBase + off / g.gpusPerNode, off % g.gpusPerNode,
                            static_cast<int>(gi)};
    }
    base += n;
    nodeBase += g.count;
  }
  return Status::error("internal: rank not located");
}

Status Cluster::validate() const {
  std::string where = "cluster '" + name + "': ";
  if (groups.empty())
    return Status::error(where + "has no nodes");
  long long devices = 0;
  for (const auto &g : groups)
    devices += static_cast<long long>(g.count) * g.gpusPerNode;
  if (devices > kMaxDevices)
    return Status::error(where + "has " + std::to_string(devices) +
                         " devices; at most " + std::to_string(kMaxDevices) +
                         " (2^20) are supported");
  for (size_t i = 0; i < groups.size(); ++i) {
    const NodeGroup &g = groups[i];
    std::string p = where + "nodes[" + std::to_string(i) + "].";
    auto positive = [&](const std::string &field, double v) -> Status {
      if (v > 0 && std::isfinite(v))
        return Status::ok();
      return Status::error(p + field +
                           ": expected a finite positive number, got " +
                           fmtNum(v));
    };
    auto nonNegative = [&](const std::string &field, double v) -> Status {
      if (v >= 0 && std::isfinite(v))
        return Status::ok();
      return Status::error(p + field + ": expected a finite number >= 0, got " +
                           fmtNum(v));
    };
    DLOPT_RETURN_IF_ERROR(positive("count", g.count));
    DLOPT_RETURN_IF_ERROR(positive("gpus_per_node", g.gpusPerNode));
    DLOPT_RETURN_IF_ERROR(positive("gpu.memory_gb", g.gpu.memoryBytes));
    DLOPT_RETURN_IF_ERROR(
        positive("gpu.memory_bandwidth_gb_s", g.gpu.memoryBandwidth));
    bool anyPeak = false;
    for (int k = 0; k < kNumPrecisions; ++k) {
      DLOPT_RETURN_IF_ERROR(
          nonNegative(std::string("gpu.peak_tflops.") +
                          precisionName(static_cast<Precision>(k)),
                      g.gpu.peakFlops[k]));
      anyPeak |= g.gpu.peakFlops[k] > 0;
    }
    if (!anyPeak)
      return Status::error(p + "gpu.peak_tflops: no precision has a " +
                           "positive peak");
    // A link no rank uses may be 0, but never infinite: the cluster is
    // written back (toJson), where an overflowed value would not load.
    if (g.gpusPerNode > 1)
      DLOPT_RETURN_IF_ERROR(
          positive("intra_node.bandwidth_gb_s", g.intra.bandwidth));
    else
      DLOPT_RETURN_IF_ERROR(
          nonNegative("intra_node.bandwidth_gb_s", g.intra.bandwidth));
    DLOPT_RETURN_IF_ERROR(
        nonNegative("intra_node.latency_us", g.intra.latency));
    if (numNodes() > 1)
      DLOPT_RETURN_IF_ERROR(
          positive("network.bandwidth_gb_s", g.network.bandwidth));
    else
      DLOPT_RETURN_IF_ERROR(
          nonNegative("network.bandwidth_gb_s", g.network.bandwidth));
    DLOPT_RETURN_IF_ERROR(nonNegative("network.latency_us", g.network.latency));
  }
  return Status::ok();
}

Expected<CommGroup> Cluster::commGroup(const std::vector<int> &ranks) const {
  if (ranks.empty())
    return Status::error("a communicator needs at least one rank");
  std::set<int> seen;
  std::map<int, int> perNode; // node -> ranks of the group on it
  std::map<int, int> nodeGroup;
  for (int r : ranks) {
    if (!seen.insert(r).second)
      return Status::error("rank " + std::to_string(r) +
                           " appears twice in a communicator");
    auto loc = locate(r);
    if (!loc)
      return loc.status();
    ++perNode[loc->node];
    nodeGroup[loc->node] = loc->group;
  }
  CommGroup cg;
  cg.size = static_cast<int>(ranks.size());
  cg.nodes = static_cast<int>(perNode.size());
  cg.nccl = ncclCollectives;
  bool first = true;
  for (auto [node, count] : perNode) {
    const NodeGroup &g = groups[nodeGroup[node]];
    cg.ranksPerNode = std::max(first ? 0 : cg.ranksPerNode, count);
    double share = g.network.bandwidth / g.gpusPerNode;
    if (first) {
      cg.intra = g.intra;
      cg.interBandwidthPerRank = share;
      cg.interLatency = g.network.latency;
    } else {
      cg.intra.bandwidth = std::min(cg.intra.bandwidth, g.intra.bandwidth);
      cg.intra.latency = std::max(cg.intra.latency, g.intra.latency);
      if (g.intra.topology == IntraTopology::Ring)
        cg.intra.topology = IntraTopology::Ring;
      cg.intra.nvls = cg.intra.nvls && g.intra.nvls;
      cg.interBandwidthPerRank = std::min(cg.interBandwidthPerRank, share);
      cg.interLatency = std::max(cg.interLatency, g.network.latency);
    }
    first = false;
  }
  return cg;
}

Expected<CommGroup> Cluster::stridedGroup(int size, int stride,
                                          int first) const {
  if (size < 1 || stride < 1 || first < 0)
    return Status::error("a strided communicator needs size >= 1, stride >= "
                         "1 and first >= 0, got size " +
                         std::to_string(size) + ", stride " +
                         std::to_string(stride) + ", first " +
                         std::to_string(first));
  long long last = first + static_cast<long long>(size - 1) * stride;
  if (last >= numDevices())
    return Status::error(
        "a communicator of " + std::to_string(size) + " ranks with stride " +
        std::to_string(stride) + " from rank " + std::to_string(first) +
        " ends at rank " + std::to_string(last) + ", but the cluster has " +
        std::to_string(numDevices()) + " devices");
  std::vector<int> ranks;
  for (int i = 0; i < size; ++i)
    ranks.push_back(first + i * stride);
  return commGroup(ranks);
}

std::string Cluster::summary() const {
  std::string s = name + ": ";
  for (size_t i = 0; i < groups.size(); ++i)
    s += (i ? " + " : "") + std::to_string(groups[i].count) + " x " +
         std::to_string(groups[i].gpusPerNode) + " " + groups[i].gpu.name;
  s += " (" + std::to_string(numNodes()) + " nodes, " +
       std::to_string(numDevices()) + " devices)";
  return s;
}

std::string Cluster::toJson() const {
  json j;
  j["name"] = name;
  json nodes = json::array();
  for (const NodeGroup &g : groups) {
    json gj;
    gj["count"] = g.count;
    gj["gpus_per_node"] = g.gpusPerNode;
    json gpu;
    gpu["name"] = g.gpu.name;
    json peaks;
    for (int k = 0; k < kNumPrecisions; ++k)
      peaks[precisionName(static_cast<Precision>(k))] = g.gpu.peakFlops[k] / kT;
    gpu["peak_tflops"] = peaks;
    gpu["memory_gb"] = g.gpu.memoryBytes / kG;
    gpu["memory_bandwidth_gb_s"] = g.gpu.memoryBandwidth / kG;
    if (g.gpu.sms > 0)
      gpu["sms"] = g.gpu.sms;
    if (g.gpu.attentionEfficiency > 0)
      gpu["attention_efficiency"] = g.gpu.attentionEfficiency;
    if (g.gpu.persistentGemms)
      gpu["persistent_gemms"] = true;
    gj["gpu"] = gpu;
    // Links a group does not use (a node with one GPU, a single node) may
    // be unset; the reader takes them as absent, so omit them rather than
    // write a bandwidth of 0 that it refuses (found by the cluster fuzzer).
    if (g.intra.bandwidth > 0)
      gj["intra_node"] = {{"topology", topologyName(g.intra.topology)},
                          {"bandwidth_gb_s", g.intra.bandwidth / kG},
                          {"latency_us", g.intra.latency / kUs},
                          {"nvls", g.intra.nvls}};
    if (g.network.bandwidth > 0)
      gj["network"] = {{"bandwidth_gb_s", g.network.bandwidth / kG},
                       {"latency_us", g.network.latency / kUs}};
    if (g.host.cpuCores > 0 || g.host.memoryBytes > 0) {
      json h;
      if (g.host.cpuCores > 0)
        h["cpu_cores"] = g.host.cpuCores;
      if (g.host.memoryBytes > 0)
        h["memory_gb"] = g.host.memoryBytes / kG;
      gj["host"] = h;
    }
    nodes.push_back(gj);
  }
  j["nodes"] = nodes;
  if (!ncclCollectives)
    j["communicator"] = "cpu";
  // Names come from files; the readers refuse invalid UTF-8, but never let
  // a programmatic name make dump() throw.
  return j.dump(2, ' ', false, json::error_handler_t::replace);
}

//===----------------------------------------------------------------------===//
// Parsing: YAML is converted to JSON first so one reader validates both.
//===----------------------------------------------------------------------===//

namespace {

/// A YAML document that cannot become a cluster tree (too deep, too large
/// once aliases are expanded, a key given twice).
struct YamlLimitError {
  std::string message;
};

/// Converts a YAML tree to JSON. yaml-cpp shares aliased nodes, so a 1 KB
/// "billion laughs" file is small in yaml-cpp but explodes here: every node
/// written counts against a budget far above any real cluster file.
class YamlConverter {
public:
  json convert(const YAML::Node &n, const std::string &path, int depth) {
    if (++nodes_ > kMaxNodes)
      throw YamlLimitError{"more than " + std::to_string(kMaxNodes) +
                           " values once aliases are expanded (at " +
                           shown(path) + "); a cluster file needs a few "
                           "hundred"};
    if (depth > kMaxDepth)
      throw YamlLimitError{"nested deeper than " + std::to_string(kMaxDepth) +
                           " levels at " + shown(path)};
    switch (n.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return nullptr;
    case YAML::NodeType::Scalar:
      return scalar(n);
    case YAML::NodeType::Sequence: {
      json a = json::array();
      size_t i = 0;
      for (const auto &e : n)
        a.push_back(convert(e, path + "[" + std::to_string(i++) + "]",
                            depth + 1));
      return a;
    }
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto &kv : n) {
        std::string key = kv.first.as<std::string>();
        if (!validUtf8(key))
          throw YamlLimitError{"a key at " + shown(path) +
                               " is not valid UTF-8"};
        std::string child = path.empty() ? key : path + "." + key;
        if (o.contains(key))
          throw YamlLimitError{"duplicate key '" + key + "' at " +
                               shown(path) + " (each key may appear once)"};
        o[key] = convert(kv.second, child, depth + 1);
      }
      return o;
    }
    }
    return nullptr;
  }

private:
  static constexpr long kMaxNodes = 100000;
  static constexpr int kMaxDepth = rt::kMaxJsonDepth;

  static std::string shown(const std::string &path) {
    if (path.empty())
      return "the top level";
    return path.size() > 120 ? path.substr(0, 120) + "..." : path;
  }

  /// Whether `s` is well-formed UTF-8 (JSON files are checked by their
  /// parser; YAML scalars are checked here, found by the cluster fuzzer).
  static bool validUtf8(const std::string &s) {
    size_t i = 0, n = s.size();
    auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    while (i < n) {
      unsigned char c = at(i);
      size_t len = c < 0x80                  ? 1
                   : c >= 0xC2 && c <= 0xDF ? 2
                   : c >= 0xE0 && c <= 0xEF ? 3
                   : c >= 0xF0 && c <= 0xF4 ? 4
                                            : 0;
      if (len == 0 || i + len > n)
        return false;
      for (size_t k = 1; k < len; ++k)
        if ((at(i + k) & 0xC0) != 0x80)
          return false;
      // No overlong forms, surrogates or code points past U+10FFFF.
      unsigned char d = len > 1 ? at(i + 1) : 0;
      if ((c == 0xE0 && d < 0xA0) || (c == 0xED && d > 0x9F) ||
          (c == 0xF0 && d < 0x90) || (c == 0xF4 && d > 0x8F))
        return false;
      i += len;
    }
    return true;
  }

  static json scalar(const YAML::Node &n) {
    const std::string &s = n.Scalar();
    if (!validUtf8(s))
      throw YamlLimitError{"a value is not valid UTF-8 (at line " +
                           std::to_string(n.Mark().line + 1) + ")"};
    if (n.Tag() == "!") // quoted: always a string
      return s;
    if (s == "true" || s == "True")
      return true;
    if (s == "false" || s == "False")
      return false;
    if (s == "~" || s == "null")
      return nullptr;
    if (!s.empty()) {
      char *end = nullptr;
      errno = 0;
      long long i = std::strtoll(s.c_str(), &end, 10);
      if (*end == '\0' && errno == 0)
        return i;
      errno = 0;
      double d = std::strtod(s.c_str(), &end);
      if (*end == '\0' && errno == 0)
        return d;
      // YAML 1.2's spellings of the non-finite floats; the reader refuses
      // them with the field's name instead of taking them as strings.
      if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf")
        return std::numeric_limits<double>::infinity();
      if (s == "-.inf" || s == "-.Inf" || s == "-.INF")
        return -std::numeric_limits<double>::infinity();
      if (s == ".nan" || s == ".NaN" || s == ".NAN")
        return std::numeric_limits<double>::quiet_NaN();
    }
    return s;
  }

  long nodes_ = 0;
};

const char *typeName(const json &v) {
  if (v.is_number_integer() || v.is_number_unsigned())
    return "an integer";
  if (v.is_number())
    return "a number";
  if (v.is_string())
    return "a string";
  if (v.is_boolean())
    return "a boolean";
  if (v.is_null())
    return "null";
  if (v.is_array())
    return "a list";
  return "a mapping";
}

/// JSON text of a scalar; invalid UTF-8 from a file is replaced, not thrown.
std::string dumpScalar(const json &v) {
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string describe(const json &v) {
  if (v.is_number() || v.is_string() || v.is_boolean())
    return typeName(v) + std::string(" (") + dumpScalar(v) + ")";
  return typeName(v);
}

/// Reads fields of one JSON tree; errors carry the source and field path.
class Reader {
public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  Status error(const std::string &path, const std::string &msg) const {
    return Status::error(source_ + ": " + (path.empty() ? "" : path + ": ") +
                         msg);
  }

  static std::string child(const std::string &path, const std::string &key) {
    return path.empty() ? key : path + "." + key;
  }

  /// Rejects keys outside `allowed` (catches typos like `memroy_gb`).
  Status checkKeys(const json &obj, const std::string &path,
                   std::initializer_list<const char *> allowed) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      bool ok = false;
      std::string list;
      for (const char *a : allowed) {
        ok |= it.key() == a;
        list += (list.empty() ? "" : ", ") + std::string(a);
      }
      if (!ok)
        return error(path, "unknown field '" + it.key() +
                               "' (expected one of: " + list + ")");
    }
    return Status::ok();
  }

  Status expectObject(const json &v, const std::string &path) const {
    if (v.is_object())
      return Status::ok();
    return error(path, "expected a mapping, got " + describe(v));
  }

  /// A number > 0 (positive) or >= 0.
  Expected<double> number(const json &v, const std::string &path,
                          bool positive) const {
    if (!v.is_number())
      return error(path, "expected a number, got " + describe(v));
    double d = v.get<double>();
    if (!std::isfinite(d))
      return error(path, std::string("expected a finite number, got ") +
                             (std::isnan(d) ? "nan" : d > 0 ? "inf" : "-inf"));
    if (positive && !(d > 0))
      return error(path, "expected a positive number, got " + dumpScalar(v));
    if (!positive && !(d >= 0))
      return error(path, "expected a number >= 0, got " + dumpScalar(v));
    return d;
  }

  Expected<bool> boolean(const json &v, const std::string &path) const {
    if (!v.is_boolean())
      return error(path, "expected true or false, got " + describe(v));
    return v.get<bool>();
  }

  Expected<int> positiveInt(const json &v, const std::string &path) const {
    if (!(v.is_number_integer() || v.is_number_unsigned()))
      return error(path, "expected a positive integer, got " + describe(v));
    long long i = v.get<long long>();
    if (i <= 0 || i > 1000000)
      return error(path, "expected a positive integer, got " + dumpScalar(v));
    return static_cast<int>(i);
  }

private:
  std::string source_;
};

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

Expected<GpuSpec> parseGpu(const Reader &rd, const json &v,
                           const std::string &path) {
  if (v.is_string()) {
    auto g = gpuPreset(v.get<std::string>());
    if (!g)
      return rd.error(path, g.status().message());
    return g;
  }
  DLOPT_RETURN_IF_ERROR(rd.expectObject(v, path));
  DLOPT_RETURN_IF_ERROR(
      rd.checkKeys(v, path,
                   {"name", "base", "peak_tflops", "memory_gb", "memory_gib",
                    "memory_bandwidth_gb_s", "sms", "attention_efficiency",
                    "persistent_gemms"}));
  GpuSpec g;
  bool hasBase = v.contains("base");
  if (hasBase) {
    const json &b = v["base"];
    std::string bp = Reader::child(path, "base");
    if (!b.is_string())
      return rd.error(bp, "expected a GPU kind name, got " + describe(b));
    auto base = gpuPreset(b.get<std::string>());
    if (!base)
      return rd.error(bp, base.status().message());
    g = *base;
  } else {
    g.name = "custom";
  }
  if (v.contains("name")) {
    if (!v["name"].is_string())
      return rd.error(Reader::child(path, "name"),
                      "expected a string, got " + describe(v["name"]));
    g.name = v["name"].get<std::string>();
  }

  std::string pp = Reader::child(path, "peak_tflops");
  if (v.contains("peak_tflops")) {
    const json &peaks = v["peak_tflops"];
    DLOPT_RETURN_IF_ERROR(rd.expectObject(peaks, pp));
    DLOPT_RETURN_IF_ERROR(
        rd.checkKeys(peaks, pp, {"fp8", "bf16", "fp16", "tf32", "fp32"}));
    for (auto it = peaks.begin(); it != peaks.end(); ++it) {
      auto d = rd.number(it.value(), Reader::child(pp, it.key()), false);
      if (!d)
        return d.status();
      g.setPeak(*parsePrecision(it.key()), *d * kT);
    }
  } else if (!hasBase) {
    return rd.error(path, "missing required field 'peak_tflops'");
  }
  bool anyPeak = false;
  for (double p : g.peakFlops)
    anyPeak |= p > 0;
  if (!anyPeak)
    return rd.error(pp, "no precision has a positive peak");

  bool gb = v.contains("memory_gb"), gib = v.contains("memory_gib");
  if (gb && gib)
    return rd.error(path, "give either 'memory_gb' or 'memory_gib', not both");
  if (gb || gib) {
    const char *key = gb ? "memory_gb" : "memory_gib";
    auto d = rd.number(v[key], Reader::child(path, key), true);
    if (!d)
      return d.status();
    g.memoryBytes = *d * (gb ? kG : kGiB);
  } else if (!hasBase) {
    return rd.error(path, "missing required field 'memory_gb'");
  }
  if (v.contains("memory_bandwidth_gb_s")) {
    auto d = rd.number(v["memory_bandwidth_gb_s"],
                       Reader::child(path, "memory_bandwidth_gb_s"), true);
    if (!d)
      return d.status();
    g.memoryBandwidth = *d * kG;
  } else if (!hasBase) {
    return rd.error(path, "missing required field 'memory_bandwidth_gb_s'");
  }
  if (v.contains("sms")) {
    auto n = rd.positiveInt(v["sms"], Reader::child(path, "sms"));
    if (!n)
      return n.status();
    g.sms = *n;
  }
  if (v.contains("attention_efficiency")) {
    std::string ap = Reader::child(path, "attention_efficiency");
    auto d = rd.number(v["attention_efficiency"], ap, true);
    if (!d)
      return d.status();
    if (*d > 1)
      return rd.error(ap, "expected a fraction of the peak in (0, 1], got " +
                              describe(v["attention_efficiency"]));
    g.attentionEfficiency = *d;
  }
  if (v.contains("persistent_gemms")) {
    auto b = rd.boolean(v["persistent_gemms"],
                        Reader::child(path, "persistent_gemms"));
    if (!b)
      return b.status();
    g.persistentGemms = *b;
  }
  return g;
}

Expected<IntraNodeLink> parseIntra(const Reader &rd, const json &v,
                                   const std::string &path) {
  DLOPT_RETURN_IF_ERROR(rd.expectObject(v, path));
  DLOPT_RETURN_IF_ERROR(
      rd.checkKeys(v, path,
                   {"topology", "bandwidth_gb_s",
                    "bidirectional_bandwidth_gb_s", "latency_us", "nvls"}));
  IntraNodeLink l;
  l.latency = 1 * kUs;
  if (v.contains("topology")) {
    const json &t = v["topology"];
    std::string s = t.is_string() ? t.get<std::string>() : "";
    if (s == "nvswitch")
      l.topology = IntraTopology::NVSwitch;
    else if (s == "ring")
      l.topology = IntraTopology::Ring;
    else
      return rd.error(Reader::child(path, "topology"),
                      "expected 'nvswitch' or 'ring', got " + describe(t));
  }
  bool uni = v.contains("bandwidth_gb_s");
  bool bi = v.contains("bidirectional_bandwidth_gb_s");
  if (uni == bi)
    return rd.error(path, uni ? "give either 'bandwidth_gb_s' or "
                                "'bidirectional_bandwidth_gb_s', not both"
                              : "missing required field 'bandwidth_gb_s' "
                                "(per GPU, per direction)");
  const char *key = uni ? "bandwidth_gb_s" : "bidirectional_bandwidth_gb_s";
  auto bw = rd.number(v[key], Reader::child(path, key), true);
  if (!bw)
    return bw.status();
  l.bandwidth = *bw * kG / (uni ? 1 : 2);
  if (v.contains("latency_us")) {
    auto lat =
        rd.number(v["latency_us"], Reader::child(path, "latency_us"), false);
    if (!lat)
      return lat.status();
    l.latency = *lat * kUs;
  }
  if (v.contains("nvls")) {
    auto b = rd.boolean(v["nvls"], Reader::child(path, "nvls"));
    if (!b)
      return b.status();
    l.nvls = *b;
    if (l.nvls && l.topology != IntraTopology::NVSwitch)
      return rd.error(Reader::child(path, "nvls"),
                      "NVLink SHARP needs topology 'nvswitch'");
  }
  return l;
}

Expected<NetworkLink> parseNetwork(const Reader &rd, const json &v,
                                   const std::string &path) {
  DLOPT_RETURN_IF_ERROR(rd.expectObject(v, path));
  DLOPT_RETURN_IF_ERROR(rd.checkKeys(
      v, path, {"bandwidth_gb_s", "nics", "nic_gbit_s", "latency_us"}));
  NetworkLink n;
  n.latency = 5 * kUs;
  bool direct = v.contains("bandwidth_gb_s");
  bool nics = v.contains("nics") || v.contains("nic_gbit_s");
  if (direct && nics)
    return rd.error(path, "give either 'bandwidth_gb_s' or 'nics' with "
                          "'nic_gbit_s', not both");
  if (direct) {
    auto bw = rd.number(v["bandwidth_gb_s"],
                        Reader::child(path, "bandwidth_gb_s"), true);
    if (!bw)
      return bw.status();
    n.bandwidth = *bw * kG;
  } else if (nics) {
    if (!v.contains("nics"))
      return rd.error(path, "missing required field 'nics' (given "
                            "'nic_gbit_s')");
    if (!v.contains("nic_gbit_s"))
      return rd.error(path, "missing required field 'nic_gbit_s' (given "
                            "'nics')");
    auto count = rd.positiveInt(v["nics"], Reader::child(path, "nics"));
    if (!count)
      return count.status();
    auto rate =
        rd.number(v["nic_gbit_s"], Reader::child(path, "nic_gbit_s"), true);
    if (!rate)
      return rate.status();
    n.bandwidth = *count * *rate / 8.0 * kG;
  } else {
    return rd.error(path, "missing required field 'bandwidth_gb_s' (per node, "
                          "per direction) or 'nics' with 'nic_gbit_s'");
  }
  if (v.contains("latency_us")) {
    auto lat =
        rd.number(v["latency_us"], Reader::child(path, "latency_us"), false);
    if (!lat)
      return lat.status();
    n.latency = *lat * kUs;
  }
  return n;
}

/// Parses one node group. Fields missing from the group are taken from the
/// top level (`top`), so a homogeneous file writes them once.
Expected<NodeGroup> parseGroup(const Reader &rd, const json &top,
                               const json *grp, const std::string &grpPath,
                               int count, bool multiNode) {
  auto pick = [&](const char *key) -> std::pair<const json *, std::string> {
    if (grp && grp->contains(key))
      return {&(*grp)[key], Reader::child(grpPath, key)};
    if (top.contains(key))
      return {&top[key], std::string(key)};
    return {nullptr, ""};
  };
  auto missing = [&](const char *key) {
    return rd.error(grpPath, std::string("missing required field '") + key +
                                 "'" +
                                 (grp ? " (in the group or at the top "
                                        "level)"
                                      : ""));
  };
  NodeGroup g;
  g.count = count;

  auto [gpn, gpnPath] = pick("gpus_per_node");
  if (!gpn)
    return missing("gpus_per_node");
  auto n = rd.positiveInt(*gpn, gpnPath);
  if (!n)
    return n.status();
  g.gpusPerNode = *n;

  auto [gpu, gpuPath] = pick("gpu");
  if (!gpu)
    return missing("gpu");
  auto spec = parseGpu(rd, *gpu, gpuPath);
  if (!spec)
    return spec.status();
  g.gpu = *spec;

  auto [intra, intraPath] = pick("intra_node");
  if (intra) {
    auto l = parseIntra(rd, *intra, intraPath);
    if (!l)
      return l.status();
    g.intra = *l;
  } else if (g.gpusPerNode > 1) {
    return missing("intra_node");
  }

  auto [host, hostPath] = pick("host");
  if (host) {
    DLOPT_RETURN_IF_ERROR(rd.expectObject(*host, hostPath));
    DLOPT_RETURN_IF_ERROR(
        rd.checkKeys(*host, hostPath, {"cpu_cores", "memory_gb"}));
    if (host->contains("cpu_cores")) {
      auto cores = rd.positiveInt((*host)["cpu_cores"],
                                  Reader::child(hostPath, "cpu_cores"));
      if (!cores)
        return cores.status();
      g.host.cpuCores = *cores;
    }
    if (host->contains("memory_gb")) {
      auto mem = rd.number((*host)["memory_gb"],
                           Reader::child(hostPath, "memory_gb"), true);
      if (!mem)
        return mem.status();
      g.host.memoryBytes = *mem * kG;
    }
  }

  auto [net, netPath] = pick("network");
  if (net) {
    auto l = parseNetwork(rd, *net, netPath);
    if (!l)
      return l.status();
    g.network = *l;
  } else if (multiNode) {
    return missing("network");
  }
  return g;
}

Expected<Cluster> parseTree(const Reader &rd, const json &top,
                            std::string_view source) {
  DLOPT_RETURN_IF_ERROR(rd.expectObject(top, ""));
  DLOPT_RETURN_IF_ERROR(
      rd.checkKeys(top, "",
                   {"name", "nodes", "gpus_per_node", "gpu", "intra_node",
                    "network", "host", "communicator"}));
  Cluster c;
  c.name = std::string(source);
  if (top.contains("communicator")) {
    const json &v = top["communicator"];
    if (!v.is_string() ||
        (v.get<std::string>() != "nccl" && v.get<std::string>() != "cpu"))
      return rd.error("communicator",
                      "expected \"nccl\" or \"cpu\", got " + describe(v));
    c.ncclCollectives = v.get<std::string>() == "nccl";
  }
  if (top.contains("name")) {
    if (!top["name"].is_string())
      return rd.error("name",
                      "expected a string, got " + describe(top["name"]));
    c.name = top["name"].get<std::string>();
  }
  if (!top.contains("nodes"))
    return rd.error("", "missing required field 'nodes' (a node count or a "
                        "list of node groups)");
  const json &nodes = top["nodes"];
  if (nodes.is_array()) {
    if (nodes.empty())
      return rd.error("nodes", "expected at least one node group");
    int total = 0;
    std::vector<int> counts;
    for (size_t i = 0; i < nodes.size(); ++i) {
      std::string p = "nodes[" + std::to_string(i) + "]";
      DLOPT_RETURN_IF_ERROR(rd.expectObject(nodes[i], p));
      DLOPT_RETURN_IF_ERROR(rd.checkKeys(
          nodes[i], p,
          {"count", "gpus_per_node", "gpu", "intra_node", "network",
           "host"}));
      if (!nodes[i].contains("count"))
        return rd.error(p, "missing required field 'count'");
      auto cnt = rd.positiveInt(nodes[i]["count"], p + ".count");
      if (!cnt)
        return cnt.status();
      counts.push_back(*cnt);
      total += *cnt;
    }
    for (size_t i = 0; i < nodes.size(); ++i) {
      auto g =
          parseGroup(rd, top, &nodes[i], "nodes[" + std::to_string(i) + "]",
                     counts[i], total > 1);
      if (!g)
        return g.status();
      c.groups.push_back(*g);
    }
  } else {
    auto cnt = rd.positiveInt(nodes, "nodes");
    if (!cnt)
      return rd.error("nodes", "expected a positive node count or a list of "
                               "node groups, got " +
                                   describe(nodes));
    auto g = parseGroup(rd, top, nullptr, "", *cnt, *cnt > 1);
    if (!g)
      return g.status();
    c.groups.push_back(*g);
  }
  DLOPT_RETURN_IF_ERROR(c.validate().withContext(std::string(source) + ": "));
  return c;
}

bool endsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.substr(s.size() - suffix.size()) == suffix;
}

} // namespace

Expected<Cluster> parseCluster(std::string_view text, ClusterFormat format,
                               std::string_view source) {
  Reader rd{std::string(source)};
  json tree;
  if (format == ClusterFormat::Json) {
    auto parsed = rt::parseJsonBounded<json>(text, /*ignoreComments=*/true);
    if (!parsed)
      return Status::error(std::string(source) + ": " +
                           parsed.status().message());
    tree = parsed.take();
  } else {
    try {
      tree = YamlConverter().convert(YAML::Load(std::string(text)), "", 0);
    } catch (const YamlLimitError &e) {
      return Status::error(std::string(source) + ": " + e.message);
    } catch (const YAML::DeepRecursion &e) {
      return Status::error(std::string(source) + ":" +
                           std::to_string(e.mark.line + 1) + ":" +
                           std::to_string(e.mark.column + 1) +
                           ": invalid YAML: nested deeper than " +
                           std::to_string(e.depth()) + " levels");
    } catch (const YAML::Exception &e) {
      return Status::error(
          std::string(source) + ":" + std::to_string(e.mark.line + 1) + ":" +
          std::to_string(e.mark.column + 1) + ": invalid YAML: " + e.msg);
    }
  }
  if (tree.is_null())
    return Status::error(std::string(source) + ": the cluster file is empty");
  return parseTree(rd, tree, source);
}

Expected<Cluster> loadClusterFile(const std::string &path) {
  ClusterFormat fmt;
  if (endsWith(path, ".yaml") || endsWith(path, ".yml"))
    fmt = ClusterFormat::Yaml;
  else if (endsWith(path, ".json"))
    fmt = ClusterFormat::Json;
  else
    return Status::error(path + ": expected a .yaml, .yml or .json cluster "
                                "file");
  Expected<std::string> text = rt::readTextFileLimited(path, "cluster file");
  if (!text)
    return text.status();
  return parseCluster(*text, fmt, path);
}

Expected<Cluster> resolveCluster(std::string_view spec) {
  if (spec.empty())
    return Status::error("empty cluster: give a preset (" +
                         joinNames(clusterPresetNames()) +
                         "), PRESET:NODES, or a .yaml/.json file");
  if (endsWith(spec, ".yaml") || endsWith(spec, ".yml") ||
      endsWith(spec, ".json"))
    return loadClusterFile(std::string(spec));
  std::string_view name = spec;
  int nodes = 0;
  if (auto colon = spec.find(':'); colon != std::string_view::npos) {
    name = spec.substr(0, colon);
    std::string count(spec.substr(colon + 1));
    bool digits = !count.empty() && count.size() <= 7 &&
                  std::all_of(count.begin(), count.end(),
                              [](char ch) { return ch >= '0' && ch <= '9'; });
    if (!digits || std::stoi(count) == 0)
      return Status::error("cluster '" + std::string(spec) +
                           "': the node count after ':' must be a positive "
                           "integer, got '" +
                           count + "'");
    nodes = std::stoi(count);
  }
  return clusterPreset(name, nodes);
}

} // namespace dlopt::planner
