//===- CostModel.cpp - Roofline, alpha-beta collectives, overlap ----------===//
#include "planner/CostModel.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>

namespace dlopt::planner {

const char *opKindName(OpKind k) {
  switch (k) {
  case OpKind::Matmul:
    return "matmul";
  case OpKind::Attention:
    return "attention";
  case OpKind::Elementwise:
    return "elementwise";
  }
  return "?";
}

const char *collectiveName(Collective c) {
  switch (c) {
  case Collective::AllReduce:
    return "all-reduce";
  case Collective::AllGather:
    return "all-gather";
  case Collective::ReduceScatter:
    return "reduce-scatter";
  case Collective::AllToAll:
    return "all-to-all";
  case Collective::Broadcast:
    return "broadcast";
  case Collective::SendRecv:
    return "send/recv";
  }
  return "?";
}

const char *algorithmName(CommAlgorithm a) {
  switch (a) {
  case CommAlgorithm::Auto:
    return "auto";
  case CommAlgorithm::Ring:
    return "ring";
  case CommAlgorithm::Tree:
    return "tree";
  case CommAlgorithm::Hierarchical:
    return "hierarchical";
  case CommAlgorithm::Direct:
    return "direct";
  case CommAlgorithm::Nvls:
    return "nvls";
  case CommAlgorithm::NvlsTree:
    return "nvls-tree";
  case CommAlgorithm::Pat:
    return "pat";
  case CommAlgorithm::Measured:
    return "measured";
  }
  return "?";
}

const char *protocolName(CommProtocol p) {
  switch (p) {
  case CommProtocol::None:
    return "none";
  case CommProtocol::LL:
    return "LL";
  case CommProtocol::LL128:
    return "LL128";
  case CommProtocol::Simple:
    return "Simple";
  }
  return "?";
}

const char *linkName(LinkKind l) {
  switch (l) {
  case LinkKind::None:
    return "none";
  case LinkKind::IntraNode:
    return "intra-node";
  case LinkKind::Network:
    return "network";
  }
  return "?";
}

const char *recomputeName(RecomputePolicy r) {
  switch (r) {
  case RecomputePolicy::None:
    return "none";
  case RecomputePolicy::Selective:
    return "selective";
  case RecomputePolicy::Full:
    return "full";
  case RecomputePolicy::Elementwise:
    return "elementwise";
  case RecomputePolicy::Alternate:
    return "alternate";
  }
  return "?";
}

//===----------------------------------------------------------------------===//
// Compute
//===----------------------------------------------------------------------===//

double CostModel::computeEfficiency(const OpCost &op,
                                    const GpuSpec &gpu) const {
  switch (op.kind) {
  case OpKind::Matmul:
    return op.flops >= cal_.matmulSmallFlops ? cal_.matmulLargeEfficiency
                                             : cal_.matmulSmallEfficiency;
  case OpKind::Attention:
    return gpu.attentionEfficiency > 0 && !cal_.attentionEfficiencyGiven
               ? gpu.attentionEfficiency
               : cal_.attentionEfficiency;
  case OpKind::Elementwise:
    return cal_.elementwiseEfficiency;
  }
  return 1.0;
}

namespace {

/// The value `field` of a grid table (gemm_table, conv_table) at m x n x k:
/// see gemmTableEfficiency.
template <typename Row>
double gridValue(const std::vector<Row> &table, double Row::*field, double m,
                 double n, double k) {
  if (table.empty() || !(m > 0) || !(n > 0) || !(k > 0))
    return 0;
  std::vector<double> axes[3];
  for (const Row &r : table) {
    axes[0].push_back(r.m);
    axes[1].push_back(r.n);
    axes[2].push_back(r.k);
  }
  // Per dim: the two grid points around x, the weight of the upper one
  // (linear in log2 x), and the below-grid factor.
  struct Bracket {
    double lo = 0, hi = 0, w = 0, factor = 1;
  } b[3];
  const double x[3] = {m, n, k};
  for (int d = 0; d < 3; ++d) {
    std::vector<double> &a = axes[d];
    std::sort(a.begin(), a.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
    if (x[d] <= a.front()) {
      b[d] = {a.front(), a.front(), 0, x[d] / a.front()};
    } else if (x[d] >= a.back()) {
      b[d] = {a.back(), a.back(), 0, 1};
    } else {
      size_t i = size_t(std::upper_bound(a.begin(), a.end(), x[d]) -
                        a.begin()) -
                 1;
      b[d] = {a[i], a[i + 1],
              std::log2(x[d] / a[i]) / std::log2(a[i + 1] / a[i]), 1};
    }
  }
  auto at = [&](double mm, double nn, double kk) {
    for (const Row &r : table)
      if (r.m == mm && r.n == nn && r.k == kk)
        return r.*field;
    return 0.0; // not a full grid: Calibration::validate refuses those
  };
  double v = 0;
  for (int c = 0; c < 8; ++c) {
    double wt = 1;
    double p[3];
    for (int d = 0; d < 3; ++d) {
      const bool upper = (c >> d) & 1;
      wt *= upper ? b[d].w : 1 - b[d].w;
      p[d] = upper ? b[d].hi : b[d].lo;
    }
    if (wt > 0)
      v += wt * at(p[0], p[1], p[2]);
  }
  return v * b[0].factor * b[1].factor * b[2].factor;
}

} // namespace

double gemmTableEfficiency(const std::vector<GemmTableRow> &table, double m,
                           double n, double k) {
  return gridValue(table, &GemmTableRow::efficiency, m, n, k);
}

double convTableRate(const std::vector<ConvTableRow> &table, ConvPass pass,
                     double m, double n, double k) {
  double ConvTableRow::*field = pass == ConvPass::Forward
                                    ? &ConvTableRow::forward
                                : pass == ConvPass::GradInput
                                    ? &ConvTableRow::gradInput
                                    : &ConvTableRow::gradFilter;
  return gridValue(table, field, m, n, k);
}

std::optional<double> CostModel::convTime(ConvPass pass,
                                          const GemmShape &forward,
                                          const GpuSpec &gpu) const {
  if (gpu.sms > 0 || cal_.convTable.empty())
    return std::nullopt;
  const double rate =
      convTableRate(cal_.convTable, pass, forward.m, forward.n, forward.k);
  if (!(rate > 0) || !(forward.flops() > 0))
    return std::nullopt;
  return forward.flops() / rate;
}

double CostModel::gemmEfficiency(const GemmShape &g, Precision precision,
                                 const GpuSpec &gpu) const {
  const bool shaped =
      g.m > 0 && g.n > 0 && g.k > 0 && g.batch > 0;
  if (gpu.sms <= 0 && shaped && !cal_.gemmTable.empty()) {
    const double eff = gemmTableEfficiency(cal_.gemmTable, g.m, g.n, g.k);
    if (eff > 0)
      return eff;
  }
  if (gpu.sms <= 0 || !shaped)
    return computeEfficiency(OpCost{OpKind::Matmul, precision, g.flops(), 0},
                             gpu);
  const double sms = gpu.sms;
  const double elem = precisionBytes(precision);
  const double step = 128.0 / elem; // K per main-loop step
  auto kShare = [&](double k) {
    return k / (k + cal_.gemmKOverheadSteps * step);
  };
  // Split-K's partial sums: fp32 tiles written by each slice and read back
  // by the reduction, through HBM.
  const double peak = gpu.peak(precision);
  const double bw = gpu.memoryBandwidth * cal_.memoryBandwidthEfficiency;
  const double maxSplit = std::max(1.0, std::floor(cal_.gemmMaxSplitK));
  // The best of the kernels cuBLAS chooses among: a tile shape, and for a
  // grid that fills less than one wave, a split of K into s slices whose
  // tiles run side by side. The share of the launched tile slots that does
  // useful work, times the K loop's share of a tile's time.
  double best = 0;
  auto consider = [&](double tm, double tn) {
    const double tiles =
        std::ceil(g.m / tm) * std::ceil(g.n / tn) * std::ceil(g.batch);
    for (double s = 1; s <= maxSplit; ++s) {
      if (s > 1 && (tiles * s > sms || g.k / s < 4 * step))
        break;
      const double waves = std::ceil(tiles * s / sms);
      const double filled =
          std::min(1.0, g.m * g.n * g.batch * s / (waves * sms * tm * tn));
      double eff = cal_.gemmPeakEfficiency * filled * kShare(g.k / s);
      if (s > 1 && peak > 0 && bw > 0) {
        const double t = g.flops() / (peak * eff) +
                         2 * s * g.m * g.n * g.batch * 4 / bw;
        eff = g.flops() / (peak * t);
      }
      best = std::max(best, eff);
    }
  };
  const double tm = cal_.gemmTileM, tn = cal_.gemmTileN,
               thin = cal_.gemmThinTile;
  consider(tm, tn);
  consider(tn, tm);
  consider(tm, tm);
  consider(thin, tn);
  consider(tn, thin);
  // Rows whose length is not a multiple of 16 bytes cannot be loaded by the
  // aligned (TMA / vectorized) kernels: the contiguous dims of row-major
  // A [m, k], B [k, n] and C [m, n], i.e. k and n. The number of rows m
  // does not matter.
  const double align = 16.0 / elem;
  const bool aligned =
      std::fmod(g.n, align) == 0 && std::fmod(g.k, align) == 0;
  return best * (aligned ? 1.0 : cal_.gemmUnalignedFactor);
}

Expected<ComputeEstimate> CostModel::gemmTime(const GemmShape &g, double bytes,
                                              Precision precision,
                                              const GpuSpec &gpu) const {
  OpCost op{OpKind::Matmul, precision, g.flops(), bytes};
  return roofline(op, gpu, [&] { return gemmEfficiency(g, precision, gpu); });
}

Expected<ComputeEstimate> CostModel::optimizerTime(double flops, double bytes,
                                                   Precision precision,
                                                   const GpuSpec &gpu) const {
  auto e = computeTime(OpCost{OpKind::Elementwise, precision, flops, bytes},
                       gpu);
  if (!e || !(cal_.optimizerBandwidth > 0))
    return e;
  e->memoryTime = bytes / cal_.optimizerBandwidth;
  e->time = std::max(e->computeTime, e->memoryTime);
  return e;
}

double CostModel::memoryTime(MemoryClass cls, double bytes,
                             const GpuSpec &gpu, double rows) const {
  if (!(bytes > 0))
    return 0;
  const double dram = gpu.memoryBandwidth * cal_.memoryBandwidthEfficiency;
  const double t = dram > 0 ? bytes / dram : 0;
  if (!cal_.hasOpBandwidth(cls))
    return t;
  const double own = bytes / cal_.opBandwidth[size_t(cls)] +
                     std::max(0.0, rows) * cal_.opRowSeconds[size_t(cls)];
  return bytes <= cal_.cacheBytes ? own : std::max(own, t);
}

Expected<ComputeEstimate>
CostModel::elementwiseTime(MemoryClass cls, double flops, double bytes,
                           Precision precision, const GpuSpec &gpu,
                           double rows) const {
  auto e = computeTime(OpCost{OpKind::Elementwise, precision, flops, bytes},
                       gpu);
  if (!e || !cal_.hasOpBandwidth(cls))
    return e;
  e->memoryTime = memoryTime(cls, bytes, gpu, rows);
  e->time = std::max(e->computeTime, e->memoryTime);
  return e;
}

Expected<ComputeEstimate> CostModel::computeTime(const OpCost &op,
                                                 const GpuSpec &gpu) const {
  return roofline(op, gpu, [&] { return computeEfficiency(op, gpu); });
}

Expected<ComputeEstimate>
CostModel::roofline(const OpCost &op, const GpuSpec &gpu,
                    const std::function<double()> &efficiency) const {
  if (!(op.flops >= 0) || !(op.bytes >= 0))
    return Status::error(std::string(opKindName(op.kind)) +
                         " op: expected flops and bytes >= 0, got flops " +
                         std::to_string(op.flops) + ", bytes " +
                         std::to_string(op.bytes));
  ComputeEstimate e;
  if (op.flops > 0) {
    double peak = gpu.peak(op.precision);
    if (!(peak > 0))
      return Status::error(gpu.name + " has no " + precisionName(op.precision) +
                           " peak: cannot run a " + opKindName(op.kind) +
                           " op in that precision");
    e.computeTime = op.flops / (peak * efficiency());
  }
  if (op.bytes > 0) {
    if (!(gpu.memoryBandwidth > 0))
      return Status::error(gpu.name + " has no memory bandwidth");
    e.memoryTime =
        op.bytes / (gpu.memoryBandwidth * cal_.memoryBandwidthEfficiency);
  }
  e.time = std::max(e.computeTime, e.memoryTime);
  return e;
}

double CostModel::trainingTime(double forward, RecomputePolicy policy,
                               double rerunForward) const {
  double t = forward * (1.0 + cal_.backwardFlopsRatio);
  if (policy == RecomputePolicy::Full)
    t += forward;
  else if (policy != RecomputePolicy::None)
    t += rerunForward;
  return t;
}

double CostModel::twoWaveLoss(double seconds, double gemm) {
  if (!(seconds > 0) || !(gemm > 0))
    return 0.5;
  const double n = std::floor(seconds / (2 * gemm));
  const double lost = n * gemm + std::min(seconds - 2 * n * gemm, gemm);
  return std::clamp(lost / seconds, 0.5, 1.0);
}

double CostModel::overlapLoss(ComputeMix mix, double linkBytesPerSecond,
                              const GpuSpec &g, double seconds) const {
  if (g.sms <= 0)
    return 0;
  const double ctas = std::min(cal_.commCtas, 0.5 * g.sms);
  const double sm = ctas / (g.sms - ctas);
  // A persistent GEMM sizes its grid to every SM: with C of them held, its
  // last C CTAs wait for the first wave's SMs and it takes twice its time
  // (pytorch/pytorch#143988: H100 matmuls 2x as long beside FSDP's NCCL
  // kernels); one the collective overlaps only in part ends that much
  // later (twoWaveLoss). As a slowdown: lost share phi = x / (1 + x),
  // capped at 0.95 (x = 19) for the other kernels' sake.
  double persistent = sm;
  if (g.persistentGemms && ctas > 0) {
    const double phi = std::min(0.95, twoWaveLoss(seconds, mix.gemmSeconds));
    persistent = phi / (1 - phi);
  }
  const double u =
      g.memoryBandwidth > 0
          ? std::min(0.9, cal_.commHbmRatio * std::max(0.0, linkBytesPerSecond) /
                              g.memoryBandwidth)
          : 0.0;
  const double gemm = std::clamp(mix.gemm, 0.0, 1.0);
  const double matmul = std::clamp(mix.matmul, 0.0, gemm);
  const double x =
      matmul * persistent + (gemm - matmul) * sm + (1 - gemm) * u / (1 - u);
  return x / (1 + x);
}

double CostModel::syncLoss(Collective collective, double bytes, int ranks,
                           double seconds, ComputeMix mix,
                           const GpuSpec &gpu) const {
  if (!(seconds > 0) || ranks <= 1)
    return 0;
  const double moved = (collective == Collective::AllReduce ? 2.0 : 1.0) *
                       (ranks - 1.0) / ranks;
  return overlapLoss(mix, moved * bytes / seconds, gpu, seconds);
}

double CostModel::exposed(double comm, double overlappable, double efficiency) {
  return std::max(0.0, comm - efficiency * std::max(0.0, overlappable));
}

//===----------------------------------------------------------------------===//
// Communication
//===----------------------------------------------------------------------===//

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// The link parameters every algorithm reads, with calibration applied.
struct Links {
  int n, m, k;        ///< ranks, nodes, ranks per node
  double intraBw;     ///< effective bytes/s of one GPU's NVLink
  double rankInterBw; ///< effective network bytes/s of one rank
  double intraLat, interLat;
};

Links links(const CommGroup &g, const Calibration &cal) {
  Links l;
  l.n = g.size;
  l.m = std::max(1, g.nodes);
  l.k = std::max(1, g.ranksPerNode);
  l.intraBw = g.intra.bandwidth * cal.intraNodeBusEfficiency;
  l.rankInterBw = g.interBandwidthPerRank * cal.interNodeBusEfficiency;
  l.intraLat = g.intra.latency;
  l.interLat = g.interLatency;
  return l;
}

/// Bottleneck bandwidth of a flat ring or tree over the group: inside one
/// node the NVLink of a GPU; across nodes the slower of NVLink (when a node
/// holds more than one rank) and the k per-rank network shares a node
/// boundary crossing can use.
std::pair<double, LinkKind> flatBandwidth(const Links &l) {
  if (l.m == 1)
    return {l.intraBw, LinkKind::IntraNode};
  double inter = l.k * l.rankInterBw;
  double intra = l.k > 1 ? l.intraBw : kInf;
  if (intra < inter)
    return {intra, LinkKind::IntraNode};
  return {inter, LinkKind::Network};
}

/// Per-step latency of a flat algorithm: the slowest hop it crosses.
double flatLatency(const Links &l) {
  if (l.m == 1)
    return l.intraLat;
  return std::max(l.interLat, l.k > 1 ? l.intraLat : 0.0);
}

/// Flat ring on one level: the classic alpha-beta terms.
///   all-reduce:      2(n-1) alpha + 2(n-1)/n S / B
///   all-gather, RS:   (n-1) alpha +  (n-1)/n S / B
///   broadcast:        (n-1) alpha +          S / B   (pipelined chain)
void ringTerms(Collective c, int n, double bytes, double alpha, double bw,
               double &lat, double &band) {
  double steps = 0, factor = 0;
  switch (c) {
  case Collective::AllReduce:
    steps = 2.0 * (n - 1);
    factor = 2.0 * (n - 1) / n;
    break;
  case Collective::AllGather:
  case Collective::ReduceScatter:
    steps = n - 1;
    factor = static_cast<double>(n - 1) / n;
    break;
  default:
    steps = n - 1;
    factor = 1.0;
    break;
  }
  lat = steps * alpha;
  band = n > 1 ? factor * bytes / bw : 0.0;
}

CommEstimate finish(CommEstimate e) {
  e.time = e.latencyTerm + e.bandwidthTerm;
  return e;
}

} // namespace

namespace {

/// Whether NCCL's protocols price a collective over `g`: the calibration's
/// nccl_protocols and a cluster whose collectives run on NCCL.
bool ncclProtocols(const Calibration &cal, const CommGroup &g) {
  return cal.ncclProtocolModel() && g.nccl;
}

/// NCCL's tuning model of its protocols: NCCL 2.28, src/graph/tuning.cc
/// (ncclTunerConstantsDefaults, ncclTopoTuneModel, ncclTopoGetAlgoTime).
/// Latencies in microseconds; docs/cost-model.md, "NCCL's protocols".
struct NcclProtocol {
  CommProtocol protocol;
  double ringBase, treeBase;     ///< baseLatencies[Ring], [Tree]
  double ringNvlink, treeNvlink; ///< hwLatencies[NVLINK][Ring], [Tree]
  double ringNet, treeNet;       ///< hwLatencies[NET][Ring], [Tree]
  double netOverhead; ///< a multi-node ring's floor on its intra steps
  double ringBw;      ///< the ring's share of the bus bandwidth
  /// The tree all-reduce's share after NCCL's 0.92: on one node, on more.
  double treeBwOneNode, treeBwNodes;
  /// treeCorrectionFactor: the tree all-reduce's bandwidth at 64 B x 2^i.
  std::array<double, 23> treeCorrection;
};

// clang-format off
constexpr NcclProtocol kNcclProtocols[] = {
    // protocol            base ring, tree  NVLink ring, tree  net ring, tree  overhead  ring bw  tree bw: one node, more
    {CommProtocol::LL,     6.6,  6.8,       0.6, 0.6,          2.7, 5.0,       1.0,      0.5,     1 / 3.8, 1 / 3.8,
     {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0}},
    {CommProtocol::LL128,  14.0, 14.0,      1.9, 1.25,         4.0, 8.5,       1.0,      0.92,    7.0 / 9.0, 120.0 / 128.0,
     {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0}},
    {CommProtocol::Simple, 8.4,  8.4,       3.4, 4.0,          14.0, 14.0,     3.0,      1.0,     1.0, 1.0,
     {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9}},
};
// clang-format on
constexpr double kUsec = 1e-6;
/// hwLatencies[NVLINK][NVLS][Simple]: NCCL's whole latency of an NVLS
/// collective (its base latency is 0).
constexpr double kNvlsLatency = 25 * kUsec;
/// hwLatencies[NET][NVLSTree][Simple]: each tree level across nodes.
constexpr double kNvlsTreeNetLatency = 20.9 * kUsec;
/// A multi-node Simple ring all-reduce's latency (the "plateau effect of
/// ring" for compute capability 8.0 and up).
constexpr double kRingPlateau = 1.4;
/// PAT: baseLatencies[PAT][Simple], hwLatencies[NET][Tree][Simple] / 3.5
/// a level, 2.8 us a rank, 0.75 of the bus bandwidth.
constexpr double kPatBase = 8.0 * kUsec;
constexpr double kPatNetStep = 14.0 * kUsec; // a slower hop takes its own
constexpr double kPatLevelDiv = 3.5;
constexpr double kPatPerRank = 2.8 * kUsec;
constexpr double kPatBandwidthShare = 0.75;

/// Steps of a ring collective (n ranks) and of them those that cross a
/// node boundary (m nodes): NCCL's nsteps and nInterSteps.
std::pair<double, double> ringSteps(Collective c, int n, int m) {
  const double rounds = c == Collective::AllReduce ? 2.0 : 1.0;
  return {rounds * (n - 1), m > 1 ? rounds * (m - 1) : 0.0};
}

/// The fastest of NCCL's protocols for an algorithm: `price(p, e)` sets
/// the latency and bandwidth terms of `base` under protocol `p`.
template <class Price>
CommEstimate fastestProtocol(const CommEstimate &base, Price price) {
  CommEstimate best = base;
  best.time = std::numeric_limits<double>::infinity();
  for (const NcclProtocol &p : kNcclProtocols) {
    CommEstimate cand = base;
    cand.protocol = p.protocol;
    price(p, cand);
    cand = finish(cand);
    if (cand.time < best.time)
      best = cand;
  }
  return best;
}

/// floor(log2(bytes / 64)) as NCCL indexes its tree correction; -1 below.
int treeSizeIndex(double bytes) {
  if (!(bytes >= 64))
    return -1;
  return static_cast<int>(std::floor(std::log2(bytes / 64)));
}

} // namespace

CommEstimate CostModel::ring(Collective c, double bytes,
                             const CommGroup &g) const {
  Links l = links(g, cal_);
  auto [bw, link] = flatBandwidth(l);
  double lat, band;
  ringTerms(c, l.n, bytes, flatLatency(l), bw, lat, band);
  CommEstimate e;
  e.algorithm = CommAlgorithm::Ring;
  e.link = link;
  if (!ncclProtocols(cal_, g)) {
    e.latencyTerm = cal_.collectiveLaunchLatency + lat;
    e.bandwidthTerm = band;
    return finish(e);
  }
  // NCCL's ring: its base latency, then each step inside a node at the
  // NVLink step latency (no less than the network's post overhead when the
  // ring spans nodes) and each step across a node boundary at the network
  // step latency (the tree's when a node holds one rank); a link hop slower
  // than NCCL's figure takes its own latency. The bandwidth term at the
  // protocol's share of the bus bandwidth. The fastest protocol wins.
  const auto [steps, interSteps] = ringSteps(c, l.n, l.m);
  return fastestProtocol(e, [&](const NcclProtocol &p, CommEstimate &cand) {
    double intraStep = std::max(l.intraLat, p.ringNvlink * kUsec);
    if (l.m > 1)
      intraStep = std::max(intraStep, p.netOverhead * kUsec);
    const double interStep =
        std::max(l.interLat, (l.k == 1 ? p.treeNet : p.ringNet) * kUsec);
    cand.latencyTerm = p.ringBase * kUsec + (steps - interSteps) * intraStep +
                       interSteps * interStep;
    if (p.protocol == CommProtocol::Simple && l.m > 1 &&
        c == Collective::AllReduce &&
        bytes / (std::max(1.0, cal_.commCtas) * l.n) >= 64)
      cand.latencyTerm *= kRingPlateau;
    cand.bandwidthTerm = band / p.ringBw;
  });
}

CommEstimate CostModel::tree(Collective c, double bytes,
                             const CommGroup &g) const {
  // NCCL's tree: a chain inside each node, a (double) binary tree across
  // nodes. Depth = (k-1) intra hops + ceil(log2 m) inter hops. All-reduce is
  // a pipelined reduce up plus broadcast down: 2 S / B; broadcast S / B.
  Links l = links(g, cal_);
  auto [bw, link] = flatBandwidth(l);
  const double hops = std::ceil(std::log2(static_cast<double>(l.m)));
  double passes = c == Collective::AllReduce ? 2.0 : 1.0;
  CommEstimate e;
  e.algorithm = CommAlgorithm::Tree;
  e.link = link;
  if (!ncclProtocols(cal_, g)) {
    double depth = (l.k - 1) * l.intraLat + hops * l.interLat;
    e.latencyTerm = cal_.collectiveLaunchLatency + passes * depth;
    e.bandwidthTerm = passes * bytes / bw;
    return finish(e);
  }
  // NCCL's tree with each protocol: its base latency, the depth at the
  // tree's step latencies, and for all-reduce 0.92 of the bus bandwidth
  // times the protocol's share and NCCL's correction for mid sizes.
  const int sizeIndex = treeSizeIndex(bytes);
  return fastestProtocol(e, [&](const NcclProtocol &p, CommEstimate &cand) {
    const double depth =
        (l.k - 1) * std::max(l.intraLat, p.treeNvlink * kUsec) +
        hops * std::max(l.interLat, p.treeNet * kUsec);
    double share = 1;
    if (p.protocol != CommProtocol::Simple)
      share = l.m == 1 ? p.treeBwOneNode : p.treeBwNodes;
    if (c == Collective::AllReduce) {
      share *= 0.92;
      if (sizeIndex >= 0 && sizeIndex < 23)
        share *= p.treeCorrection[sizeIndex];
    }
    cand.latencyTerm = p.treeBase * kUsec + passes * depth;
    cand.bandwidthTerm = passes * bytes / (bw * share);
  });
}

CommEstimate CostModel::hierarchical(Collective c, double bytes,
                                     const CommGroup &g) const {
  Links l = links(g, cal_);
  if (l.m == 1 || l.k == 1) { // one level only: it is a ring
    return ring(c, bytes, g);
  }
  int k = l.k, m = (l.n + k - 1) / k;
  double intraLat, intraBand, interLat, interBand;
  CommEstimate e;
  e.algorithm = CommAlgorithm::Hierarchical;
  if (c == Collective::AllReduce) {
    // Intra reduce-scatter of S, inter all-reduce of S/k by each of the k
    // local ranks on its own network share, intra all-gather of S.
    ringTerms(Collective::ReduceScatter, k, bytes, l.intraLat, l.intraBw,
              intraLat, intraBand);
    ringTerms(Collective::AllReduce, m, bytes / k, l.interLat, l.rankInterBw,
              interLat, interBand);
    e.latencyTerm = 3 * cal_.collectiveLaunchLatency + 2 * intraLat + interLat;
    e.bandwidthTerm = 2 * intraBand + interBand;
    e.link =
        interBand >= 2 * intraBand ? LinkKind::Network : LinkKind::IntraNode;
  } else {
    // All-gather: inter all-gather of S/k among same-local-index ranks, then
    // intra all-gather of S. Reduce-scatter is the mirror image.
    ringTerms(Collective::AllGather, k, bytes, l.intraLat, l.intraBw, intraLat,
              intraBand);
    ringTerms(Collective::AllGather, m, bytes / k, l.interLat, l.rankInterBw,
              interLat, interBand);
    e.latencyTerm = 2 * cal_.collectiveLaunchLatency + intraLat + interLat;
    e.bandwidthTerm = intraBand + interBand;
    e.link = interBand >= intraBand ? LinkKind::Network : LinkKind::IntraNode;
  }
  return finish(e);
}

CommEstimate CostModel::direct(Collective c, double bytes,
                               const CommGroup &g) const {
  Links l = links(g, cal_);
  CommEstimate e;
  e.algorithm = CommAlgorithm::Direct;
  if (c == Collective::SendRecv) {
    bool net = l.m > 1;
    e.link = net ? LinkKind::Network : LinkKind::IntraNode;
    e.latencyTerm =
        cal_.collectiveLaunchLatency + (net ? l.interLat : l.intraLat);
    e.bandwidthTerm = bytes / (net ? l.rankInterBw : l.intraBw);
    return finish(e);
  }
  // All-to-all, pairwise: each rank sends S/n to each of the n-1 others.
  // Inside a node on NVSwitch every GPU sends at full rate; on a ring
  // topology a message travels min(j, k-j) hops, so the k GPUs' 2k link
  // directions (B/2 each) carry S * floor(k^2/4) / k bytes each.
  int n = l.n, k = l.k;
  double intraShare = static_cast<double>(k - 1) / n * bytes; // per rank
  if (g.intra.topology == IntraTopology::Ring && k > 2)
    intraShare = std::max<double>(k - 1, std::floor(k * k / 4.0)) / n * bytes;
  double intraTime = k > 1 ? intraShare / l.intraBw : 0.0;
  double interTime =
      l.m > 1 ? static_cast<double>(n - k) / n * bytes / l.rankInterBw : 0.0;
  e.link = interTime > intraTime ? LinkKind::Network : LinkKind::IntraNode;
  e.latencyTerm = cal_.collectiveLaunchLatency + (n - 1) * flatLatency(l);
  e.bandwidthTerm = std::max(intraTime, interTime);
  return finish(e);
}

namespace {
/// An NVSwitch fabric with NVLink SHARP holding 2+ ranks of the group on a
/// node: what NCCL's NVLS algorithms need.
bool nvlsFabric(const CommGroup &g) {
  return g.intra.nvls && g.intra.topology == IntraTopology::NVSwitch &&
         g.ranksPerNode >= 2;
}
/// NCCL's NVLS: all-reduce, all-gather and reduce-scatter inside one node.
/// (Across nodes NCCL runs NVLS all-gather and reduce-scatter only with
/// CollNet, in-network reduction in the InfiniBand switches, which the
/// cluster files do not describe.)
bool nvlsApplies(Collective c, const CommGroup &g) {
  return (c == Collective::AllReduce || c == Collective::AllGather ||
          c == Collective::ReduceScatter) &&
         g.nodes == 1 && nvlsFabric(g);
}
/// NCCL's NVLSTree: all-reduce over several nodes, NVLS inside each.
bool nvlsTreeApplies(Collective c, const CommGroup &g) {
  return c == Collective::AllReduce && g.nodes > 1 && nvlsFabric(g);
}
/// NCCL's PAT (2.23 and up): all-gather and reduce-scatter over several
/// nodes with one rank on each (ncclPatEnable), in NCCL's protocol model.
bool patApplies(Collective c, const CommGroup &g, const Calibration &cal) {
  return (c == Collective::AllGather || c == Collective::ReduceScatter) &&
         g.nodes > 1 && g.ranksPerNode == 1 && ncclProtocols(cal, g);
}
} // namespace

CommEstimate CostModel::nvls(Collective c, double bytes,
                             const CommGroup &g) const {
  // The switch reduces and multicasts (multimem.ld_reduce, multimem.st).
  // All-reduce: each GPU sends S and receives its reduced shard S/n plus
  // the multicast S, so its busier (receive) direction carries (n+1)/n S:
  // (n+1)/n S / B, against the ring's 2(n-1)/n S / B; two switch round
  // trips. Reduce-scatter sends S and receives S/n; all-gather sends S/n
  // and receives S: S / B either way, one switch trip; slower than the
  // ring's (n-1)/n S / B (docs/cost-model.md, "NVLS").
  const int n = g.size;
  CommEstimate e;
  e.algorithm = CommAlgorithm::Nvls;
  e.link = LinkKind::IntraNode;
  const double bw = g.intra.bandwidth * cal_.nvlsEfficiency;
  const double trips = c == Collective::AllReduce ? 2.0 : 1.0;
  e.latencyTerm = cal_.collectiveLaunchLatency + trips * g.intra.latency;
  if (ncclProtocols(cal_, g)) { // NCCL's whole NVLS latency (Simple)
    e.protocol = CommProtocol::Simple;
    e.latencyTerm = std::max(kNvlsLatency, trips * g.intra.latency);
  }
  e.bandwidthTerm =
      (c == Collective::AllReduce ? double(n + 1) / n : 1.0) * bytes / bw;
  return finish(e);
}

CommEstimate CostModel::nvlsTree(double bytes, const CommGroup &g) const {
  // NVLS reduces the node's S into shards in the switch; each of the k
  // local ranks all-reduces its S/k shard with the other nodes over a tree
  // on its network share; NVLS multicasts the result. NCCL pipelines the
  // three in chunks, so the slower side sets the time:
  //   intra  (k+1)/k S / (B_link nvls_efficiency)       as NVLS inside a node
  //   inter  S/k / B_rank on two nodes (one exchange each way),
  //          2 S/k / B_rank on more (a double binary tree: every node sends
  //          and receives 2 S/k, as an inner node of one tree and a leaf of
  //          the other)
  Links l = links(g, cal_);
  const double k = l.k;
  const double intra =
      (k + 1) / k * bytes / (g.intra.bandwidth * cal_.nvlsEfficiency);
  const double inter = (l.m <= 2 ? 1.0 : 2.0) * bytes / k / l.rankInterBw;
  CommEstimate e;
  e.algorithm = CommAlgorithm::NvlsTree;
  e.link = inter > intra ? LinkKind::Network : LinkKind::IntraNode;
  const double levels = std::ceil(std::log2(static_cast<double>(l.m)));
  e.latencyTerm =
      cal_.collectiveLaunchLatency + 2 * l.intraLat + 2 * levels * l.interLat;
  if (ncclProtocols(cal_, g)) { // NCCL: NVLS's, then two passes a level
    e.protocol = CommProtocol::Simple;
    e.latencyTerm = std::max(kNvlsLatency, 2 * l.intraLat) +
                    2 * levels * std::max(kNvlsTreeNetLatency, l.interLat);
  }
  e.bandwidthTerm = std::max(intra, inter);
  return finish(e);
}

CommEstimate CostModel::pat(double bytes, const CommGroup &g) const {
  // NCCL's PAT ("parallel aggregated trees"): a logarithmic schedule of
  // exchanges, Simple protocol only. NCCL's tuning model: base 8 us,
  // floor(log2 m) levels at a third and a half of the tree's network step
  // (14 us / 3.5) and, still, 2.8 us a rank; 0.75 of the bus bandwidth over
  // the whole gathered size (its time is S / (0.75 B), where the ring's is
  // (n-1)/n S / B).
  Links l = links(g, cal_);
  auto [bw, link] = flatBandwidth(l);
  const double levels = std::floor(std::log2(static_cast<double>(l.m)));
  CommEstimate e;
  e.algorithm = CommAlgorithm::Pat;
  e.protocol = CommProtocol::Simple;
  e.link = link;
  e.latencyTerm = kPatBase +
                  levels * std::max(l.interLat, kPatNetStep) / kPatLevelDiv +
                  l.n * kPatPerRank;
  e.bandwidthTerm = bytes / (kPatBandwidthShare * bw);
  return finish(e);
}

CostModel::CostModel(Calibration calibration) : cal_(std::move(calibration)) {
  for (const CollectiveTableRow &r : cal_.collectiveTable)
    measuredCurves_[{int(r.collective), r.ranks, r.nodes, r.ranksPerNode}]
        .push_back({r.bytes, r.seconds});
  for (auto &[key, curve] : measuredCurves_) {
    std::sort(curve.begin(), curve.end());
    // A message never costs more than a larger one measured: the running
    // minimum from the largest down.
    for (size_t i = curve.size() - 1; i-- > 0;)
      curve[i].second = std::min(curve[i].second, curve[i + 1].second);
  }
}

std::optional<CommEstimate> CostModel::measured(Collective c, double bytes,
                                                const CommGroup &g) const {
  auto it = measuredCurves_.find({int(c), g.size, g.nodes, g.ranksPerNode});
  if (it == measuredCurves_.end())
    return std::nullopt;
  const std::vector<std::pair<double, double>> &curve = it->second;
  double t;
  if (bytes <= curve.front().first) {
    t = curve.front().second;
  } else if (bytes >= curve.back().first) {
    t = curve.back().second * (bytes / curve.back().first);
  } else {
    auto hi = std::lower_bound(curve.begin(), curve.end(), bytes,
                               [](const std::pair<double, double> &p,
                                  double b) { return p.first < b; });
    auto lo = hi - 1;
    const double f = (bytes - lo->first) / (hi->first - lo->first);
    t = lo->second + f * (hi->second - lo->second);
  }
  CommEstimate e;
  e.algorithm = CommAlgorithm::Measured;
  e.link = g.spansNodes() ? LinkKind::Network : LinkKind::IntraNode;
  // The smallest message's time stands for the fixed cost, the rest for
  // the bytes.
  e.latencyTerm = std::min(t, curve.front().second);
  e.bandwidthTerm = t - e.latencyTerm;
  e.time = t;
  return e;
}

Expected<CommEstimate> CostModel::commTime(Collective c, double bytes,
                                           const CommGroup &g,
                                           CommAlgorithm algo) const {
  std::string what = std::string(collectiveName(c)) + " over " +
                     std::to_string(g.size) + " ranks";
  if (!(bytes >= 0) || !std::isfinite(bytes))
    return Status::error(what + ": expected bytes >= 0, got " +
                         std::to_string(bytes));
  if (g.size < 1)
    return Status::error(what + ": a communicator needs at least one rank");
  if (c == Collective::SendRecv && g.size != 2 && g.size != 1)
    return Status::error(what + ": send/recv needs a communicator of 2 "
                                "ranks");
  bool ok = false;
  switch (algo) {
  case CommAlgorithm::Auto:
    ok = true;
    break;
  case CommAlgorithm::Ring:
    ok = c == Collective::AllReduce || c == Collective::AllGather ||
         c == Collective::ReduceScatter || c == Collective::Broadcast;
    break;
  case CommAlgorithm::Tree:
    ok = c == Collective::AllReduce || c == Collective::Broadcast;
    break;
  case CommAlgorithm::Hierarchical:
    ok = c == Collective::AllReduce || c == Collective::AllGather ||
         c == Collective::ReduceScatter;
    break;
  case CommAlgorithm::Direct:
    ok = c == Collective::AllToAll || c == Collective::SendRecv;
    break;
  case CommAlgorithm::Nvls:
    ok = c == Collective::AllReduce || c == Collective::AllGather ||
         c == Collective::ReduceScatter;
    break;
  case CommAlgorithm::NvlsTree:
    ok = c == Collective::AllReduce;
    break;
  case CommAlgorithm::Pat:
    ok = c == Collective::AllGather || c == Collective::ReduceScatter;
    break;
  case CommAlgorithm::Measured:
    ok = collectiveTableName(c) != nullptr;
    break;
  }
  if (!ok)
    return Status::error(what + ": the " + algorithmName(algo) +
                         " algorithm does not implement " + collectiveName(c));
  if (g.size == 1) { // a communicator of one rank moves nothing
    CommEstimate e;
    e.algorithm = algo == CommAlgorithm::Auto ? CommAlgorithm::Ring : algo;
    return e;
  }
  if (g.spansNodes() && !(g.interBandwidthPerRank > 0))
    return Status::error(what + ": the communicator spans " +
                         std::to_string(g.nodes) +
                         " nodes but the network bandwidth is 0");
  if (g.ranksPerNode > 1 && !(g.intra.bandwidth > 0))
    return Status::error(what + ": the intra-node bandwidth is 0");

  switch (algo) {
  case CommAlgorithm::Ring:
    return ring(c, bytes, g);
  case CommAlgorithm::Tree:
    return tree(c, bytes, g);
  case CommAlgorithm::Hierarchical:
    return hierarchical(c, bytes, g);
  case CommAlgorithm::Direct:
    return direct(c, bytes, g);
  case CommAlgorithm::Nvls:
    if (!nvlsApplies(c, g))
      return Status::error(what + ": NVLS needs one node whose NVSwitch "
                                  "fabric has NVLink SHARP (intra_node.nvls) "
                                  "and 2 or more of the ranks");
    return nvls(c, bytes, g);
  case CommAlgorithm::NvlsTree:
    if (!nvlsTreeApplies(c, g))
      return Status::error(what + ": NVLS tree needs several nodes whose "
                                  "NVSwitch fabric has NVLink SHARP "
                                  "(intra_node.nvls), 2 or more ranks on a "
                                  "node");
    return nvlsTree(bytes, g);
  case CommAlgorithm::Pat:
    if (!patApplies(c, g, cal_))
      return Status::error(what + ": PAT needs one rank on each of several "
                                  "nodes and NCCL's protocols "
                                  "(nccl_protocols 1, communicator nccl)");
    return pat(bytes, g);
  case CommAlgorithm::Measured:
    if (auto m = measured(c, bytes, g))
      return *m;
    return Status::error(what + " (" + std::to_string(g.nodes) + " nodes, " +
                         std::to_string(g.ranksPerNode) +
                         " a node): the calibration's collective_table "
                         "measured no such group");
  case CommAlgorithm::Auto:
    break;
  }
  // A measurement of this collective over a group of this shape is what
  // it costs on this cluster.
  if (auto m = measured(c, bytes, g))
    return *m;
  // Auto: the fastest applicable algorithm; ties keep the earlier one.
  std::vector<CommEstimate> cands;
  switch (c) {
  // The algorithms NCCL implements, which dlopt's NCCL communicator gets
  // (ncclAllReduce, ncclAllGather, ncclReduceScatter on the group): not the
  // two-level hierarchical composition, which NCCL does not run (its ring
  // is node-aware, its tree is the two-level all-reduce). Hierarchical
  // stays available when asked for by name.
  case Collective::AllReduce:
    cands = {ring(c, bytes, g), tree(c, bytes, g)};
    if (nvlsApplies(c, g))
      cands.push_back(nvls(c, bytes, g));
    if (nvlsTreeApplies(c, g))
      cands.push_back(nvlsTree(bytes, g));
    break;
  case Collective::AllGather:
  case Collective::ReduceScatter:
    cands = {ring(c, bytes, g)};
    if (nvlsApplies(c, g))
      cands.push_back(nvls(c, bytes, g));
    if (patApplies(c, g, cal_))
      cands.push_back(pat(bytes, g));
    break;
  case Collective::Broadcast:
    // NCCL broadcasts over its ring only; the tree stays for the
    // one-protocol model (and by name).
    cands = {ring(c, bytes, g)};
    if (!ncclProtocols(cal_, g))
      cands.push_back(tree(c, bytes, g));
    break;
  case Collective::AllToAll:
  case Collective::SendRecv:
    cands = {direct(c, bytes, g)};
    break;
  }
  CommEstimate best = cands.front();
  for (const CommEstimate &e : cands)
    if (e.time < best.time)
      best = e;
  return best;
}

} // namespace dlopt::planner
