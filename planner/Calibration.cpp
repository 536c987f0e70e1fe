//===- Calibration.cpp - Defaults, validation and JSON overrides ----------===//
#include "planner/Calibration.h"

#include "runtime/support/FileRead.h"
#include "runtime/support/JsonLimits.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>
#include <fstream>
#include <sstream>

namespace dlopt::planner {
namespace {

enum class Range {
  Efficiency,
  Fraction,
  Positive,
  NonNegative,
  FractionBelowOne,
  Flag
};

/// One row per constant: the single table that parsing, printing,
/// validation and the docs key list all read.
struct Entry {
  const char *name;
  double Calibration::*field;
  double scale; ///< file unit -> SI (e.g. 1e-6 for _us)
  Range range;
  const char *unit;
  const char *meaning;
};

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = kMiB * 1024.0;

const Entry kEntries[] = {
    {"matmul_large_efficiency", &Calibration::matmulLargeEfficiency, 1,
     Range::Efficiency, "fraction",
     "achieved / peak FLOP/s of a large matmul (>= matmul_small_flops)"},
    {"matmul_small_efficiency", &Calibration::matmulSmallEfficiency, 1,
     Range::Efficiency, "fraction",
     "achieved / peak FLOP/s of a small matmul (< matmul_small_flops)"},
    {"matmul_small_flops", &Calibration::matmulSmallFlops, 1,
     Range::NonNegative, "FLOP", "matmuls below this FLOP count are small"},
    {"gemm_peak_efficiency", &Calibration::gemmPeakEfficiency, 1,
     Range::Efficiency, "fraction",
     "achieved / peak FLOP/s of a GEMM whose tiles fill every SM of every "
     "wave, before the K overhead"},
    {"gemm_tile_m", &Calibration::gemmTileM, 1, Range::Positive, "rows",
     "output rows of one CTA tile (wave quantization)"},
    {"gemm_tile_n", &Calibration::gemmTileN, 1, Range::Positive, "columns",
     "output columns of one CTA tile (wave quantization)"},
    {"gemm_k_overhead_steps", &Calibration::gemmKOverheadSteps, 1,
     Range::NonNegative, "steps",
     "fixed cost of a tile (pipeline fill, epilogue) in main-loop steps of "
     "128 bytes of K"},
    {"gemm_unaligned_factor", &Calibration::gemmUnalignedFactor, 1,
     Range::Efficiency, "fraction",
     "efficiency of a GEMM with a dim that is not a multiple of 16 bytes, "
     "relative to an aligned one"},
    {"gemm_thin_tile", &Calibration::gemmThinTile, 1, Range::Positive, "rows",
     "the short side of the thin tiles (thin x gemm_tile_n and "
     "gemm_tile_n x thin) chosen for GEMMs with few rows or columns"},
    {"gemm_max_split_k", &Calibration::gemmMaxSplitK, 1, Range::Positive,
     "slices",
     "most slices split-K cuts K into when the output tiles fill less "
     "than one wave (1: never split)"},
    {"attention_efficiency", &Calibration::attentionEfficiency, 1,
     Range::Efficiency, "fraction",
     "achieved / peak FLOP/s of fused attention"},
    {"elementwise_efficiency", &Calibration::elementwiseEfficiency, 1,
     Range::Efficiency, "fraction",
     "achieved / peak FLOP/s of elementwise and reduction ops"},
    {"memory_bandwidth_efficiency", &Calibration::memoryBandwidthEfficiency, 1,
     Range::Efficiency, "fraction",
     "achieved / peak HBM bandwidth (bytes read + written)"},
    {"backward_flops_ratio", &Calibration::backwardFlopsRatio, 1,
     Range::Positive, "ratio", "backward FLOPs / forward FLOPs of a layer"},
    {"optimizer_gb_s", &Calibration::optimizerBandwidth, 1e9,
     Range::NonNegative, "GB/s",
     "bytes read + written per second by the optimizer update (0: the "
     "memory bandwidth times memory_bandwidth_efficiency)"},
    {"cache_mib", &Calibration::cacheBytes, kMiB, Range::NonNegative, "MiB",
     "bytes read + written up to which a memory-bound op runs at its "
     "op_gb_s rate (its data stays in the cache); larger ops run no faster "
     "than the memory bandwidth (0: at any size)"},
    {"intra_node_bus_efficiency", &Calibration::intraNodeBusEfficiency, 1,
     Range::Efficiency, "fraction",
     "NCCL bus bandwidth / link bandwidth inside a node"},
    {"inter_node_bus_efficiency", &Calibration::interNodeBusEfficiency, 1,
     Range::Efficiency, "fraction",
     "NCCL bus bandwidth / network bandwidth across nodes"},
    {"collective_launch_latency_us", &Calibration::collectiveLaunchLatency,
     1e-6, Range::NonNegative, "us",
     "fixed cost of one collective call (launch, setup) where "
     "nccl_protocols is 0, and of all-to-all, send/recv and the "
     "hierarchical composition"},
    {"nccl_protocols", &Calibration::ncclProtocols, 1, Range::Flag, "flag",
     "1: ring, tree and NVLS are priced with NCCL's protocols (LL, LL128, "
     "Simple: their base and per-step latencies and bandwidth shares, NCCL "
     "2.28's tuning model), the fastest for each message; 0: one protocol, "
     "collective_launch_latency_us plus the links' latency a step (a "
     "communicator that is not NCCL, such as the CPU backend's)"},
    {"nvls_efficiency", &Calibration::nvlsEfficiency, 1, Range::Efficiency,
     "fraction",
     "NVLink SHARP (NVLS, NVLS tree): the share of the per-direction NVLink "
     "bandwidth reached on the busier direction"},
    {"grad_overlap_efficiency", &Calibration::gradOverlapEfficiency, 1,
     Range::Fraction, "fraction",
     "share of backward compute that can hide gradient communication (0: "
     "none, as on the CPU backend, whose collectives block)"},
    {"comm_ctas", &Calibration::commCtas, 1, Range::NonNegative, "SMs",
     "SMs a collective's CTAs hold while it runs beside compute (one per "
     "NCCL channel)"},
    {"comm_hbm_ratio", &Calibration::commHbmRatio, 1, Range::NonNegative,
     "ratio",
     "HBM bytes a collective reads and writes per byte it moves over its "
     "links, taken from memory-bound kernels running beside it"},
    {"p2p_overlap_efficiency", &Calibration::p2pOverlapEfficiency, 1,
     Range::Fraction, "fraction",
     "share of a micro-batch's compute that can hide pipeline send/recv"},
    {"kernel_launch_us", &Calibration::kernelLaunchSeconds, 1e-6,
     Range::NonNegative, "us",
     "host time to issue one kernel or library call to a device"},
    {"in_graph_launch_contention", &Calibration::inGraphLaunchContention, 1,
     Range::NonNegative, "ratio",
     "extra host time per launch for each other device the same process "
     "drives (driver locks, shared allocator)"},
    {"process_host_gib", &Calibration::processHostBytes, kGiB,
     Range::NonNegative, "GiB",
     "host memory of one runtime process (CUDA/NCCL host state, plan, "
     "loader)"},
    {"host_staging_gib", &Calibration::deviceHostStagingBytes, kGiB,
     Range::NonNegative, "GiB",
     "pinned host memory per device (input staging, checkpoint buffers)"},
    {"runtime_reserved_gib", &Calibration::runtimeReservedBytes, kGiB,
     Range::NonNegative, "GiB",
     "per-device memory outside tensors: CUDA context, cuBLAS workspace"},
    {"nccl_buffer_mib", &Calibration::ncclBufferBytes, kMiB, Range::NonNegative,
     "MiB", "NCCL internal buffers per communicator"},
    {"grad_bucket_mib", &Calibration::gradBucketBytes, kMiB, Range::NonNegative,
     "MiB", "size of one gradient-sync bucket"},
    {"fragmentation_fraction", &Calibration::fragmentationFraction, 1,
     Range::FractionBelowOne, "fraction",
     "allocator fragmentation, as a fraction of dynamic memory"},
};

std::string fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

Status checkRange(const Entry &e, double v) {
  bool ok = std::isfinite(v);
  const char *want = "";
  switch (e.range) {
  case Range::Efficiency:
    ok = ok && v > 0 && v <= 1;
    want = "a fraction in (0, 1]";
    break;
  case Range::Fraction:
    ok = ok && v >= 0 && v <= 1;
    want = "a fraction in [0, 1]";
    break;
  case Range::Positive:
    ok = ok && v > 0;
    want = "a positive number";
    break;
  case Range::NonNegative:
    ok = ok && v >= 0;
    want = "a number >= 0";
    break;
  case Range::FractionBelowOne:
    ok = ok && v >= 0 && v < 1;
    want = "a fraction in [0, 1)";
    break;
  case Range::Flag:
    ok = ok && (v == 0 || v == 1);
    want = "0 or 1";
    break;
  }
  if (ok)
    return Status::ok();
  return Status::error(std::string(e.name) + ": expected " + want + ", got " +
                       fmt(v));
}

constexpr const char *kGemmTableKey = "gemm_table";
constexpr const char *kConvTableKey = "conv_table";
constexpr size_t kMaxGridRows = 4096;
constexpr double kMaxGemmDim = double(int64_t(1) << 31);
constexpr double kGFlops = 1e9;

std::string gridRowWhere(const char *key, size_t i) {
  return std::string(key) + " row " + std::to_string(i);
}

/// A grid table (gemm_table, conv_table) must be a full grid: every
/// combination of its distinct m, n and k values once, dims whole numbers
/// in [1, 2^31]; `checkValues` checks a row's measured values.
template <typename Row, typename CheckValues>
Status checkGrid(const char *key, const std::vector<Row> &rows,
                 CheckValues checkValues) {
  if (rows.empty())
    return Status::ok();
  if (rows.size() > kMaxGridRows)
    return Status::error(std::string(key) + ": expected at most " +
                         std::to_string(kMaxGridRows) + " rows, got " +
                         std::to_string(rows.size()));
  std::set<double> ms, ns, ks;
  std::set<std::tuple<double, double, double>> seen;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row &r = rows[i];
    const std::string at = gridRowWhere(key, i);
    for (double d : {r.m, r.n, r.k})
      if (!std::isfinite(d) || d < 1 || d > kMaxGemmDim || d != std::floor(d))
        return Status::error(at + ": expected dims that are whole numbers in "
                                  "[1, 2^31], got " +
                             fmt(d));
    DLOPT_RETURN_IF_ERROR(checkValues(r, at));
    if (!seen.insert({r.m, r.n, r.k}).second)
      return Status::error(at + ": m=" + fmt(r.m) + " n=" + fmt(r.n) +
                           " k=" + fmt(r.k) + " appears twice");
    ms.insert(r.m);
    ns.insert(r.n);
    ks.insert(r.k);
  }
  if (ms.size() * ns.size() * ks.size() != rows.size()) {
    for (double m : ms)
      for (double n : ns)
        for (double k : ks)
          if (!seen.count({m, n, k}))
            return Status::error(
                std::string(key) +
                ": expected every combination of its m, n and k values (a "
                "grid of " +
                std::to_string(ms.size()) + " x " + std::to_string(ns.size()) +
                " x " + std::to_string(ks.size()) + "), missing m=" + fmt(m) +
                " n=" + fmt(n) + " k=" + fmt(k));
  }
  return Status::ok();
}

/// gemm_table: efficiencies in (0, 1].
Status checkGemmTable(const std::vector<GemmTableRow> &rows) {
  return checkGrid(kGemmTableKey, rows,
                   [](const GemmTableRow &r, const std::string &at) {
                     if (!std::isfinite(r.efficiency) ||
                         !(r.efficiency > 0) || r.efficiency > 1)
                       return Status::error(
                           at + ": expected an efficiency in (0, 1], got " +
                           fmt(r.efficiency));
                     return Status::ok();
                   });
}

/// conv_table: rates in (0, 10^9] GFLOP/s.
Status checkConvTable(const std::vector<ConvTableRow> &rows) {
  return checkGrid(
      kConvTableKey, rows, [](const ConvTableRow &r, const std::string &at) {
        for (double v : {r.forward, r.gradInput, r.gradFilter})
          if (!std::isfinite(v) || !(v > 0) || v > 1e9 * kGFlops)
            return Status::error(at + ": expected GFLOP/s in (0, 1e9], got " +
                                 fmt(v / kGFlops));
        return Status::ok();
      });
}

/// Rows of `width` numbers, made into Rows by `make`, then checked.
template <typename Row, typename Make, typename Check>
Expected<std::vector<Row>> parseGrid(const char *key, const char *form,
                                     size_t width, const nlohmann::json &v,
                                     Make make, Check check) {
  if (!v.is_array())
    return Status::error(std::string(key) + ": expected an array of " + form +
                         " rows, got " + std::string(v.type_name()));
  std::vector<Row> rows; // check bounds the count
  for (size_t i = 0; i < v.size() && i <= kMaxGridRows; ++i) {
    const nlohmann::json &r = v[i];
    if (!r.is_array() || r.size() != width)
      return Status::error(gridRowWhere(key, i) + ": expected " + form +
                           ", got " + r.dump().substr(0, 80));
    double x[8];
    for (size_t j = 0; j < width; ++j) {
      if (!r[j].is_number())
        return Status::error(gridRowWhere(key, i) +
                             ": expected numbers, got " +
                             std::string(r[j].type_name()));
      x[j] = r[j].get<double>();
    }
    rows.push_back(make(x));
  }
  if (v.size() > kMaxGridRows)
    return Status::error(std::string(key) + ": expected at most " +
                         std::to_string(kMaxGridRows) + " rows, got " +
                         std::to_string(v.size()));
  DLOPT_RETURN_IF_ERROR(check(rows));
  return rows;
}

Expected<std::vector<GemmTableRow>> parseGemmTable(const nlohmann::json &v) {
  return parseGrid<GemmTableRow>(
      kGemmTableKey, "[m, n, k, efficiency]", 4, v,
      [](const double *x) { return GemmTableRow{x[0], x[1], x[2], x[3]}; },
      checkGemmTable);
}

Expected<std::vector<ConvTableRow>> parseConvTable(const nlohmann::json &v) {
  return parseGrid<ConvTableRow>(
      kConvTableKey,
      "[m, n, k, forward, grad_input, grad_filter] (GFLOP/s)", 6, v,
      [](const double *x) {
        return ConvTableRow{x[0],           x[1],           x[2],
                            x[3] * kGFlops, x[4] * kGFlops, x[5] * kGFlops};
      },
      checkConvTable);
}

constexpr const char *kCollectiveTableKey = "collective_table";
constexpr size_t kMaxCollectiveRows = 65536;
constexpr double kMaxCollectiveRanks = double(1 << 20);
constexpr double kMaxCollectiveBytes = double(int64_t(1) << 50);
constexpr double kMaxCollectiveUs = 1e9; // 1000 s

/// collective_table: every row's fields in range, each (collective,
/// ranks, nodes, ranks_per_node, bytes) once.
Status checkCollectiveTable(const std::vector<CollectiveTableRow> &rows) {
  if (rows.size() > kMaxCollectiveRows)
    return Status::error(std::string(kCollectiveTableKey) +
                         ": expected at most " +
                         std::to_string(kMaxCollectiveRows) + " rows, got " +
                         std::to_string(rows.size()));
  std::set<std::tuple<int, int, int, int, double>> seen;
  for (size_t i = 0; i < rows.size(); ++i) {
    const CollectiveTableRow &r = rows[i];
    const std::string at = gridRowWhere(kCollectiveTableKey, i);
    if (!collectiveTableName(r.collective))
      return Status::error(at + ": send/recv is not a collective the table "
                                "holds");
    if (r.ranks < 2 || r.ranks > kMaxCollectiveRanks)
      return Status::error(at + ": expected ranks in [2, 2^20], got " +
                           std::to_string(r.ranks));
    if (r.nodes < 1 || r.nodes > r.ranks)
      return Status::error(
          at + ": expected nodes in [1, ranks=" + std::to_string(r.ranks) +
          "], got " + std::to_string(r.nodes));
    if (r.ranksPerNode < 1 || r.ranksPerNode > r.ranks ||
        int64_t(r.ranksPerNode) * r.nodes < r.ranks ||
        r.ranksPerNode + (r.nodes - 1) > r.ranks)
      return Status::error(
          at + ": ranks_per_node " + std::to_string(r.ranksPerNode) +
          " cannot place " + std::to_string(r.ranks) + " ranks on " +
          std::to_string(r.nodes) + " nodes (the most ranks on one node)");
    if (!std::isfinite(r.bytes) || r.bytes < 1 ||
        r.bytes > kMaxCollectiveBytes || r.bytes != std::floor(r.bytes))
      return Status::error(at +
                           ": expected bytes a whole number in [1, "
                           "2^50], got " +
                           fmt(r.bytes));
    // At least a nanosecond: the file keeps picoseconds.
    if (!std::isfinite(r.seconds) || !(r.seconds >= 1e-9) ||
        r.seconds > kMaxCollectiveUs * 1e-6)
      return Status::error(at + ": expected us in [0.001, 1e9], got " +
                           fmt(r.seconds * 1e6));
    if (r.device.size() > 200 ||
        std::any_of(r.device.begin(), r.device.end(), [](char ch) {
          return (unsigned char)ch < 0x20 || ch == 0x7f;
        }))
      return Status::error(at + ": expected a device name of at most 200 "
                                "printable characters");
    if (!seen.insert(
                 {int(r.collective), r.ranks, r.nodes, r.ranksPerNode, r.bytes})
             .second)
      return Status::error(at + ": " + collectiveTableName(r.collective) +
                           " over " + std::to_string(r.ranks) + " ranks (" +
                           std::to_string(r.nodes) + " nodes, " +
                           std::to_string(r.ranksPerNode) + " a node) at " +
                           fmt(r.bytes) + " bytes appears twice");
  }
  return Status::ok();
}

/// A collective_table row's integer field: a whole number.
Expected<double> collectiveRowNumber(const nlohmann::json &r, const char *key,
                                     const std::string &at) {
  auto it = r.find(key);
  if (it == r.end())
    return Status::error(at + ": expected the field '" + key + "'");
  if (!it->is_number())
    return Status::error(at + ": " + key + ": expected a number, got " +
                         std::string(it->type_name()));
  return it->get<double>();
}

Expected<std::vector<CollectiveTableRow>>
parseCollectiveTable(const nlohmann::json &v) {
  const std::string key = kCollectiveTableKey;
  if (!v.is_array())
    return Status::error(key +
                         ": expected an array of rows {collective, "
                         "ranks, nodes, ranks_per_node, bytes, us}, "
                         "got " +
                         std::string(v.type_name()));
  if (v.size() > kMaxCollectiveRows)
    return Status::error(key + ": expected at most " +
                         std::to_string(kMaxCollectiveRows) + " rows, got " +
                         std::to_string(v.size()));
  std::vector<CollectiveTableRow> rows;
  for (size_t i = 0; i < v.size(); ++i) {
    const nlohmann::json &r = v[i];
    const std::string at = gridRowWhere(kCollectiveTableKey, i);
    if (!r.is_object())
      return Status::error(at +
                           ": expected an object {collective, ranks, "
                           "nodes, ranks_per_node, bytes, us}, got " +
                           r.dump().substr(0, 80));
    for (auto it = r.begin(); it != r.end(); ++it) {
      static const char *const known[] = {"collective",     "ranks", "nodes",
                                          "ranks_per_node", "bytes", "us",
                                          "device"};
      if (std::find_if(std::begin(known), std::end(known), [&](const char *k) {
            return it.key() == k;
          }) == std::end(known))
        return Status::error(at + ": unknown field '" + it.key() +
                             "' (known: collective, ranks, nodes, "
                             "ranks_per_node, bytes, us, device)");
    }
    CollectiveTableRow row;
    auto name = r.find("collective");
    if (name == r.end() || !name->is_string())
      return Status::error(at + ": expected 'collective', a string");
    if (!collectiveFromTableName(name->get<std::string>(), row.collective))
      return Status::error(at +
                           ": collective: expected all_reduce, "
                           "all_gather, reduce_scatter, alltoall or "
                           "broadcast, got '" +
                           name->get<std::string>().substr(0, 40) + "'");
    double x[5];
    const char *const fields[] = {"ranks", "nodes", "ranks_per_node", "bytes",
                                  "us"};
    for (int f = 0; f < 5; ++f) {
      auto n = collectiveRowNumber(r, fields[f], at);
      if (!n)
        return n.status();
      x[f] = *n;
    }
    for (int f = 0; f < 3; ++f)
      if (!std::isfinite(x[f]) || x[f] != std::floor(x[f]) || x[f] < 0 ||
          x[f] > kMaxCollectiveRanks)
        return Status::error(at + ": " + fields[f] +
                             ": expected a whole number in [1, 2^20], got " +
                             fmt(x[f]));
    if (auto dev = r.find("device"); dev != r.end()) {
      if (!dev->is_string())
        return Status::error(at + ": device: expected a string, got " +
                             std::string(dev->type_name()));
      row.device = dev->get<std::string>();
    }
    row.ranks = int(x[0]);
    row.nodes = int(x[1]);
    row.ranksPerNode = int(x[2]);
    row.bytes = x[3];
    row.seconds = x[4] * 1e-6;
    rows.push_back(row);
  }
  DLOPT_RETURN_IF_ERROR(checkCollectiveTable(rows));
  return rows;
}

nlohmann::ordered_json
collectiveRows(const std::vector<CollectiveTableRow> &table) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const CollectiveTableRow &r : table) {
    nlohmann::ordered_json o;
    o["collective"] = collectiveTableName(r.collective);
    o["ranks"] = r.ranks;
    o["nodes"] = r.nodes;
    o["ranks_per_node"] = r.ranksPerNode;
    o["bytes"] = int64_t(r.bytes);
    o["us"] = std::round(r.seconds * 1e12) / 1e6; // to the picosecond
    if (!r.device.empty())
      o["device"] = r.device;
    rows.push_back(o);
  }
  return rows;
}

constexpr const char *kOpRateKey = "op_gb_s";
constexpr const char *kOpBackwardKey = "op_backward_ratio";
constexpr const char *kOpRowKey = "op_row_ns";
constexpr double kGB = 1e9;
constexpr double kNs = 1e-9;

/// The per-class keys: an object of numbers by MemoryClass name, stored
/// times `scale` in `field`; written, read and checked in this order.
struct PerClassKey {
  const char *name;
  std::array<double, kNumMemoryClasses> Calibration::*field;
  double scale;
};
const PerClassKey kPerClassKeys[] = {
    {kOpRateKey, &Calibration::opBandwidth, kGB},
    {kOpBackwardKey, &Calibration::opBackwardRatio, 1},
    {kOpRowKey, &Calibration::opRowSeconds, kNs},
};

/// A per-class figure (kPerClassKeys): each value finite and >= 0 in file
/// units (stored times `scale`).
Status checkPerClass(const char *key,
                     const std::array<double, kNumMemoryClasses> &r,
                     double scale) {
  for (size_t i = 0; i < r.size(); ++i)
    if (!std::isfinite(r[i] / scale) || r[i] < 0)
      return Status::error(std::string(key) + "." +
                           memoryClassName(MemoryClass(i)) +
                           ": expected a number >= 0, got " + fmt(r[i] / scale));
  return Status::ok();
}

Expected<std::array<double, kNumMemoryClasses>>
parsePerClass(const char *key, const nlohmann::json &v,
              std::array<double, kNumMemoryClasses> r, double scale) {
  auto known = [] {
    std::string k;
    for (size_t i = 0; i < kNumMemoryClasses; ++i)
      k += std::string(i ? ", " : "") + memoryClassName(MemoryClass(i));
    return k;
  };
  if (!v.is_object())
    return Status::error(std::string(key) +
                         ": expected an object of numbers by op class (" +
                         known() + "), got " + std::string(v.type_name()));
  for (auto it = v.begin(); it != v.end(); ++it) {
    size_t cls = kNumMemoryClasses;
    for (size_t i = 0; i < kNumMemoryClasses; ++i)
      if (it.key() == memoryClassName(MemoryClass(i)))
        cls = i;
    if (cls == kNumMemoryClasses)
      return Status::error(std::string(key) + ": unknown op class '" +
                           it.key() + "' (known: " + known() + ")");
    if (!it.value().is_number())
      return Status::error(std::string(key) + "." + it.key() +
                           ": expected a number, got " +
                           std::string(it.value().type_name()));
    const double gbs = it.value().get<double>();
    if (!std::isfinite(gbs * scale) || gbs < 0)
      return Status::error(std::string(key) + "." + it.key() +
                           ": expected a number >= 0, got " + fmt(gbs));
    r[cls] = gbs * scale;
  }
  return r;
}

} // namespace

const char *collectiveTableName(Collective c) {
  switch (c) {
  case Collective::AllReduce:
    return "all_reduce";
  case Collective::AllGather:
    return "all_gather";
  case Collective::ReduceScatter:
    return "reduce_scatter";
  case Collective::AllToAll:
    return "alltoall";
  case Collective::Broadcast:
    return "broadcast";
  case Collective::SendRecv:
    break;
  }
  return nullptr;
}

bool collectiveFromTableName(std::string_view name, Collective &c) {
  for (Collective k :
       {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter,
        Collective::AllToAll, Collective::Broadcast})
    if (name == collectiveTableName(k)) {
      c = k;
      return true;
    }
  return false;
}

const char *memoryClassName(MemoryClass c) {
  switch (c) {
  case MemoryClass::Stream:
    return "stream";
  case MemoryClass::Transcendental:
    return "transcendental";
  case MemoryClass::Norm:
    return "norm";
  case MemoryClass::Softmax:
    return "softmax";
  case MemoryClass::BatchNorm:
    return "batch_norm";
  case MemoryClass::Pool:
    return "pool";
  }
  return "?";
}

MemoryClass memoryClassOf(std::string_view op) {
  if (op.substr(0, 6) == "dlopt.")
    op.remove_prefix(6);
  static const std::pair<const char *, MemoryClass> kOps[] = {
      {"exp", MemoryClass::Transcendental},
      {"log", MemoryClass::Transcendental},
      {"tanh", MemoryClass::Transcendental},
      {"sin", MemoryClass::Transcendental},
      {"cos", MemoryClass::Transcendental},
      {"sigmoid", MemoryClass::Transcendental},
      {"silu", MemoryClass::Transcendental},
      {"gelu", MemoryClass::Transcendental},
      {"gelu_grad", MemoryClass::Transcendental},
      {"pow", MemoryClass::Transcendental},
      {"dropout", MemoryClass::Transcendental},
      {"layer_norm", MemoryClass::Norm},
      {"rms_norm", MemoryClass::Norm},
      {"layer_norm_grad", MemoryClass::Norm},
      {"rms_norm_grad", MemoryClass::Norm},
      {"softmax", MemoryClass::Softmax},
      {"log_softmax", MemoryClass::Softmax},
      {"softmax_grad", MemoryClass::Softmax},
      {"log_softmax_grad", MemoryClass::Softmax},
      {"cross_entropy", MemoryClass::Softmax},
      {"cross_entropy_grad", MemoryClass::Softmax},
      {"batch_norm", MemoryClass::BatchNorm},
      {"batch_norm_grad", MemoryClass::BatchNorm},
      {"max_pool2d", MemoryClass::Pool},
      {"avg_pool2d", MemoryClass::Pool},
      {"max_pool2d_grad", MemoryClass::Pool},
      {"avg_pool2d_grad", MemoryClass::Pool},
  };
  for (const auto &[name, cls] : kOps)
    if (op == name)
      return cls;
  return MemoryClass::Stream;
}

double memoryRowsOf(std::string_view op,
                    const std::vector<int64_t> &resultShape) {
  if (memoryClassOf(op) != MemoryClass::Pool || resultShape.size() < 2)
    return 0;
  double planes = 1;
  for (size_t i = 0; i + 2 < resultShape.size(); ++i)
    planes *= double(resultShape[i]);
  return planes;
}

Status Calibration::validate() const {
  for (const Entry &e : kEntries)
    DLOPT_RETURN_IF_ERROR(checkRange(e, this->*e.field / e.scale));
  for (const PerClassKey &k : kPerClassKeys)
    DLOPT_RETURN_IF_ERROR(checkPerClass(k.name, this->*k.field, k.scale));
  DLOPT_RETURN_IF_ERROR(checkGemmTable(gemmTable));
  DLOPT_RETURN_IF_ERROR(checkCollectiveTable(collectiveTable));
  return checkConvTable(convTable);
}

std::string Calibration::toJson() const {
  nlohmann::ordered_json j;
  for (const Entry &e : kEntries)
    j[e.name] = this->*e.field / e.scale;
  if (!gemmTable.empty()) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const GemmTableRow &r : gemmTable)
      rows.push_back({r.m, r.n, r.k, r.efficiency});
    j[kGemmTableKey] = rows;
  }
  if (!convTable.empty()) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const ConvTableRow &r : convTable)
      rows.push_back({r.m, r.n, r.k, r.forward / kGFlops,
                      r.gradInput / kGFlops, r.gradFilter / kGFlops});
    j[kConvTableKey] = rows;
  }
  if (!collectiveTable.empty())
    j[kCollectiveTableKey] = collectiveRows(collectiveTable);
  for (const PerClassKey &k : kPerClassKeys) {
    const std::array<double, kNumMemoryClasses> &values = this->*k.field;
    nlohmann::ordered_json byClass;
    for (size_t i = 0; i < kNumMemoryClasses; ++i)
      if (values[i] > 0)
        byClass[memoryClassName(MemoryClass(i))] = values[i] / k.scale;
    if (!byClass.empty()) // measured for some class
      j[k.name] = byClass;
  }
  return j.dump(2);
}

std::string Calibration::collectiveTableJson() const {
  nlohmann::ordered_json j;
  j[kCollectiveTableKey] = collectiveRows(collectiveTable);
  return j.dump(2);
}

const std::vector<CalibrationKey> &calibrationKeys() {
  static const std::vector<CalibrationKey> keys = [] {
    std::vector<CalibrationKey> k;
    for (const Entry &e : kEntries)
      k.push_back({e.name, e.unit, e.meaning});
    k.push_back({kGemmTableKey, "rows [m, n, k, fraction]",
                 "GEMM efficiency measured on a grid of shapes, for devices "
                 "without an SM count (interpolated between grid points)"});
    k.push_back({kConvTableKey,
                 "rows [m, n, k, forward, grad_input, grad_filter] (GFLOP/s)",
                 "conv2d and its gradients measured on a grid of shapes "
                 "(m, n, k: the forward's im2col GEMM), for devices without "
                 "an SM count (absent: convolutions priced as their im2col "
                 "GEMMs)"});
    k.push_back({kCollectiveTableKey,
                 "rows {collective, ranks, nodes, ranks_per_node, bytes, us, "
                 "device}",
                 "collectives measured on the cluster (dlopt-calibrate "
                 "--nccl-tests): a collective over a group of the same "
                 "ranks, nodes and ranks a node is priced from them, "
                 "interpolated in bytes (absent: the model)"});
    k.push_back({kOpRateKey, "object of GB/s by op class",
                 "bytes read + written per second of memory-bound ops with "
                 "their data in the cache, by class: stream, transcendental, "
                 "norm, softmax, batch_norm, pool (absent or 0: the memory "
                 "bandwidth times memory_bandwidth_efficiency)"});
    k.push_back({kOpBackwardKey, "object of ratios by op class",
                 "backward time over forward time of memory-bound ops, by "
                 "class, from their gradient kernels (absent or 0: "
                 "backward_flops_ratio)"});
    k.push_back({kOpRowKey, "object of ns by op class",
                 "fixed cost per row of a memory-bound op, by class, on top "
                 "of its bytes at the op_gb_s rate; pool: per output plane "
                 "(absent or 0: none)"});
    return k;
  }();
  return keys;
}

Expected<Calibration> parseCalibration(std::string_view text,
                                       std::string_view source,
                                       const Calibration &base) {
  std::string where = std::string(source) + ": ";
  auto parsed =
      rt::parseJsonBounded<nlohmann::json>(text, /*ignoreComments=*/true);
  if (!parsed)
    return Status::error(where + parsed.status().message());
  nlohmann::json j = parsed.take();
  if (!j.is_object())
    return Status::error(where + "expected a JSON object of constants, got " +
                         std::string(j.type_name()));
  Calibration c = base;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == kGemmTableKey) {
      auto rows = parseGemmTable(it.value());
      if (!rows)
        return Status::error(where + rows.status().message());
      c.gemmTable = rows.take();
      continue;
    }
    if (it.key() == kCollectiveTableKey) {
      auto rows = parseCollectiveTable(it.value());
      if (!rows)
        return Status::error(where + rows.status().message());
      c.collectiveTable = rows.take();
      continue;
    }
    if (it.key() == kConvTableKey) {
      auto rows = parseConvTable(it.value());
      if (!rows)
        return Status::error(where + rows.status().message());
      c.convTable = rows.take();
      continue;
    }
    const PerClassKey *perClass = nullptr;
    for (const PerClassKey &k : kPerClassKeys)
      if (it.key() == k.name)
        perClass = &k;
    if (perClass) {
      auto values = parsePerClass(perClass->name, it.value(),
                                  c.*perClass->field, perClass->scale);
      if (!values)
        return Status::error(where + values.status().message());
      c.*perClass->field = *values;
      continue;
    }
    const Entry *entry = nullptr;
    for (const Entry &e : kEntries)
      if (it.key() == e.name)
        entry = &e;
    if (!entry && it.key() == "cp_overlap_efficiency")
      return Status::error(
          where + "cp_overlap_efficiency is no longer read: dlopt's context "
                  "parallelism gathers K and V before attention, which hides "
                  "none of it (docs/cost-model.md, section 7); delete the "
                  "key");
    if (!entry) {
      std::string known;
      for (const Entry &e : kEntries)
        known += std::string(known.empty() ? "" : ", ") + e.name;
      known += std::string(", ") + kGemmTableKey + ", " + kConvTableKey + ", " +
               kCollectiveTableKey;
      for (const PerClassKey &k : kPerClassKeys)
        known += std::string(", ") + k.name;
      return Status::error(where + "unknown calibration key '" + it.key() +
                           "' (known: " + known + ")");
    }
    if (!it.value().is_number())
      return Status::error(where + it.key() + ": expected a number, got " +
                           std::string(it.value().type_name()));
    double v = it.value().get<double>();
    DLOPT_RETURN_IF_ERROR(checkRange(*entry, v).withContext(where));
    if (!std::isfinite(v * entry->scale))
      return Status::error(where + it.key() + ": expected a finite value, " +
                           fmt(v) + " overflows once converted");
    c.*(entry->field) = v * entry->scale;
    if (entry->field == &Calibration::attentionEfficiency)
      c.attentionEfficiencyGiven = true;
  }
  return c;
}

Expected<Calibration> loadCalibration(const std::string &path,
                                      const Calibration &base) {
  Expected<std::string> text =
      rt::readTextFileLimited(path, "calibration file");
  if (!text)
    return text.status();
  return parseCalibration(*text, path, base);
}

} // namespace dlopt::planner
