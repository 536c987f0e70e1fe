//===- Cluster.h - The hardware a plan runs on ----------------------------===//
//
// A cluster is a list of node groups (one group for a homogeneous cluster).
// Each group says how many nodes it has, how many GPUs a node holds, the GPU
// kind, the intra-node link and the inter-node network. Clusters come from
// built-in presets ("dgx-h100", "dgx-h100:16") or YAML/JSON files; the
// format is documented in docs/cluster.md. All quantities are SI: bytes,
// seconds, FLOP/s, bytes/s.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/support/Status.h"

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlopt::planner {

using rt::Expected;
using rt::Status;

/// Most devices a cluster may have (2^20, ten times the largest training
/// clusters built so far); keeps every rank list and search bounded.
inline constexpr int kMaxDevices = 1 << 20;

/// Arithmetic precisions with their own peak FLOP/s.
enum class Precision { FP8 = 0, BF16, FP16, TF32, FP32 };
constexpr int kNumPrecisions = 5;
const char *precisionName(Precision p);
std::optional<Precision> parsePrecision(std::string_view s);
/// Bytes of one element as the tensor cores read it (tf32: 4).
inline double precisionBytes(Precision p) {
  return p == Precision::FP8 ? 1 : p == Precision::TF32 || p == Precision::FP32 ? 4 : 2;
}

/// One GPU (or test device) kind.
struct GpuSpec {
  std::string name;
  /// Dense peak FLOP/s indexed by Precision; 0 means unsupported.
  std::array<double, kNumPrecisions> peakFlops{};
  double memoryBytes = 0;     ///< HBM capacity
  double memoryBandwidth = 0; ///< HBM bytes/s (read + write)
  /// Streaming multiprocessors; 0 when unknown (GEMMs are then priced by
  /// size class instead of tile and wave quantization).
  int sms = 0;
  /// Achieved / peak FLOP/s of fused attention (forward and backward) on
  /// this GPU with the FlashAttention-2 class of kernels dlopt runs
  /// (docs/cost-model.md, "Attention by GPU"); 0: the calibration's
  /// attention_efficiency. A calibration file that sets
  /// attention_efficiency overrides it.
  double attentionEfficiency = 0;
  /// The GEMM library's kernels are persistent with a static tile
  /// schedule: one CTA per SM, each working through its share of the tiles
  /// (cuBLAS on Hopper). Beside a collective whose CTAs hold some SMs, such
  /// a GEMM runs in two waves, twice its time (CostModel::overlapLoss).
  bool persistentGemms = false;

  double peak(Precision p) const { return peakFlops[static_cast<int>(p)]; }
  void setPeak(Precision p, double v) { peakFlops[static_cast<int>(p)] = v; }
};

enum class IntraTopology { NVSwitch, Ring };
const char *topologyName(IntraTopology t);

/// The link between GPUs of one node.
struct IntraNodeLink {
  IntraTopology topology = IntraTopology::NVSwitch;
  double bandwidth = 0; ///< bytes/s per GPU, per direction
  double latency = 0;   ///< seconds per hop (alpha of one algorithm step)
  /// NVLink SHARP: the switches reduce and multicast (third-generation
  /// NVSwitch with Hopper GPUs), so NCCL's NVLS all-reduce applies.
  bool nvls = false;
};

/// A node's connection to the inter-node network.
struct NetworkLink {
  double bandwidth = 0; ///< bytes/s per node, per direction (all NICs)
  double latency = 0;   ///< seconds per hop
};

/// The host side of a node: what the process layout (in-graph or
/// between-graph) is constrained by. 0 means unknown (no constraint).
struct HostSpec {
  int cpuCores = 0;
  double memoryBytes = 0;
};

/// `count` identical nodes.
struct NodeGroup {
  int count = 1;
  int gpusPerNode = 1;
  GpuSpec gpu;
  IntraNodeLink intra;
  NetworkLink network;
  HostSpec host;
};

/// Where a global rank lives. Ranks are numbered node by node, group by
/// group: node 0 holds ranks 0..gpusPerNode-1, and so on.
struct DeviceLocation {
  int node = 0;  ///< global node index
  int local = 0; ///< GPU index inside the node
  int group = 0; ///< index into Cluster::groups
};

/// The links a communicator of a given set of ranks uses (the bottleneck of
/// every node it touches). See docs/cost-model.md, "Which link".
struct CommGroup {
  int size = 1;         ///< ranks in the communicator
  int nodes = 1;        ///< distinct nodes it spans
  int ranksPerNode = 1; ///< most ranks it has on one node
  IntraNodeLink intra;  ///< slowest intra-node link among its nodes
  /// Inter-node bytes/s one rank of the group can use: the node's network
  /// bandwidth divided by its GPUs (every GPU of a node is assumed to
  /// communicate at once, as in data-parallel groups of 3D parallelism).
  double interBandwidthPerRank = 0;
  double interLatency = 0;
  /// The collectives run on NCCL (Cluster::ncclCollectives): NCCL's
  /// algorithms and protocols apply.
  bool nccl = true;
  bool spansNodes() const { return nodes > 1; }
};

struct Cluster {
  std::string name;
  std::vector<NodeGroup> groups;
  /// The communicator the collectives run on (cluster files'
  /// `communicator`): NCCL (`nccl`, the default), whose algorithms and
  /// protocols the cost model prices, or dlopt's CPU backend (`cpu`:
  /// in-process threads and MPI), priced with the links' alpha-beta terms
  /// alone (docs/cluster.md).
  bool ncclCollectives = true;

  int numNodes() const;
  int numDevices() const;
  bool isHomogeneous() const { return groups.size() == 1; }
  /// The location of a rank; the rank must be in [0, numDevices()).
  Expected<DeviceLocation> locate(int rank) const;
  /// The smallest device memory in the cluster (what a uniform plan must fit).
  double minDeviceMemory() const;
  /// Checks counts > 0, bandwidths > 0, latencies >= 0, and that a
  /// multi-node cluster has a network.
  Status validate() const;

  /// The links used by a communicator over `ranks` (distinct, in range).
  Expected<CommGroup> commGroup(const std::vector<int> &ranks) const;
  /// The communicator {first, first+stride, ..., first+(size-1)*stride}.
  Expected<CommGroup> stridedGroup(int size, int stride, int first = 0) const;

  /// A one-line description: "dgx-h100:16 (16 nodes x 8 H100-SXM-80GB = 128
  /// devices)".
  std::string summary() const;
  /// The cluster in the documented JSON format (loadable again).
  std::string toJson() const;
};

/// Names of the built-in cluster presets, sorted.
std::vector<std::string> clusterPresetNames();
/// Names of the built-in GPU kinds (usable as `gpu: <name>` in files).
std::vector<std::string> gpuPresetNames();
/// A built-in GPU kind.
Expected<GpuSpec> gpuPreset(std::string_view name);
/// A built-in cluster with `nodes` nodes (0 = the preset's default, 1).
Expected<Cluster> clusterPreset(std::string_view name, int nodes = 0);

enum class ClusterFormat { Yaml, Json };
/// Parses cluster text; `source` names it in messages (a file name).
Expected<Cluster> parseCluster(std::string_view text, ClusterFormat format,
                               std::string_view source);
/// Loads a .yaml/.yml or .json cluster file.
Expected<Cluster> loadClusterFile(const std::string &path);
/// Resolves a --cluster argument: "PRESET", "PRESET:NODES", or a path to a
/// .yaml/.yml/.json file.
Expected<Cluster> resolveCluster(std::string_view spec);

} // namespace dlopt::planner
