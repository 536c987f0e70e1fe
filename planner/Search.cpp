//===- Search.cpp - Enumerate and price parallel plans --------------------===//
#include "planner/Search.h"

#include "planner/SearchUtil.h"
#include "planner/TransformerSharding.h"
#include "planner/ReportUtil.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <set>
#include <tuple>

namespace dlopt::planner {

namespace {

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string_view::npos)
      end = s.size();
    out.emplace_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::optional<int64_t> parseInt(const std::string &s) {
  if (s.empty() || s.size() > 12)
    return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9')
      return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

} // namespace

//===----------------------------------------------------------------------===//
// --fix
//===----------------------------------------------------------------------===//

std::optional<PipelineSchedule> parseSchedule(std::string_view s) {
  if (s == "gpipe")
    return PipelineSchedule::GPipe;
  if (s == "1f1b")
    return PipelineSchedule::OneFOneB;
  if (s == "interleaved" || s == "interleaved-1f1b")
    return PipelineSchedule::Interleaved1F1B;
  if (s == "zero-bubble" || s == "zb" || s == "zbh1")
    return PipelineSchedule::ZeroBubble;
  return std::nullopt;
}

std::optional<RecomputePolicy> parseRecompute(std::string_view s) {
  if (s == "none")
    return RecomputePolicy::None;
  if (s == "selective")
    return RecomputePolicy::Selective;
  if (s == "full")
    return RecomputePolicy::Full;
  return std::nullopt;
}

const char *layoutName(ProcessLayout l, int nodes) {
  if (l == ProcessLayout::BetweenGraph)
    return "between-graph";
  return nodes > 1 ? "hybrid" : "in-graph";
}

std::optional<ProcessLayout> parseLayout(std::string_view s) {
  if (s == "in-graph" || s == "hybrid")
    return ProcessLayout::InGraph;
  if (s == "between-graph")
    return ProcessLayout::BetweenGraph;
  return std::nullopt;
}

const char *scheduleKey(PipelineSchedule s) {
  // scheduleName's spelling, but "interleaved" for the interleaved 1F1B.
  return s == PipelineSchedule::Interleaved1F1B ? "interleaved"
                                                : scheduleName(s);
}


Expected<FixSpec> parseFix(std::string_view text) {
  FixSpec f;
  if (text.empty())
    return f;
  std::map<std::string, std::string> seen; // canonical key -> first item
  for (const std::string &item : split(text, ',')) {
    if (item.empty())
      continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos)
      return Status::error("--fix: expected KEY=VALUE, got '" + item + "'");
    std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    std::string canon = k == "num_mb" ? "mb" : k;
    if (auto it = seen.find(canon); it != seen.end())
      return Status::error("--fix: " + canon + " is given twice ('" +
                           it->second + "' and '" + item + "')");
    seen[canon] = item;
    if (k == "schedule") {
      auto s = parseSchedule(v);
      if (!s)
        return Status::error("--fix: schedule '" + v +
                             "' is not one of gpipe, 1f1b, interleaved, "
                             "zero-bubble");
      f.schedule = s;
      continue;
    }
    if (k == "layout") {
      auto l = parseLayout(v);
      if (!l)
        return Status::error("--fix: layout '" + v +
                             "' is not one of in-graph, hybrid, "
                             "between-graph");
      f.layout = l;
      continue;
    }
    if (k == "sp") {
      if (v != "0" && v != "1")
        return Status::error("--fix: sp=" + v +
                             " is not 0 or 1 (sequence parallelism off/on)");
      f.sp = v == "1";
      continue;
    }
    if (k == "recompute") {
      auto r = parseRecompute(v);
      if (!r)
        return Status::error("--fix: recompute '" + v +
                             "' is not one of none, selective, full");
      f.recompute = r;
      continue;
    }
    static const char *known[] = {"dp", "tp", "pp", "cp", "v", "mbs", "mb",
                                  "num_mb", "zero"};
    if (std::find(std::begin(known), std::end(known), k) == std::end(known))
      return Status::error("--fix: unknown key '" + k +
                           "' (expected dp, tp, pp, cp, sp, mbs, mb, "
                           "schedule, v, zero, recompute, layout)");
    auto n = parseInt(v);
    if (!n || (*n < 1 && k != "zero") || *n > (int64_t(1) << 30))
      return Status::error("--fix: " + k + "=" + v +
                           " is not a positive integer");
    if ((k == "dp" || k == "tp" || k == "pp" || k == "cp" || k == "v") &&
        *n > kMaxDevices)
      return Status::error("--fix: " + k + "=" + v + " exceeds " +
                           std::to_string(kMaxDevices) +
                           ", the most devices a cluster may have");
    if (k == "dp")
      f.dp = int(*n);
    else if (k == "tp")
      f.tp = int(*n);
    else if (k == "pp")
      f.pp = int(*n);
    else if (k == "cp")
      f.cp = int(*n);
    else if (k == "v")
      f.v = int(*n);
    else if (k == "mbs")
      f.mbs = *n;
    else if (k == "mb" || k == "num_mb")
      f.numMicroBatches = *n;
    else if (k == "zero") {
      if (*n > 3)
        return Status::error("--fix: zero=" + v + " is not a ZeRO stage 0-3");
      f.zero = int(*n);
    } else
      return Status::error("--fix: unknown key '" + k +
                           "' (expected dp, tp, pp, cp, sp, mbs, mb, schedule, v, "
                           "zero, recompute, layout)");
  }
  if (f.v && *f.v > 1 && f.schedule &&
      *f.schedule != PipelineSchedule::Interleaved1F1B)
    return Status::error("--fix: v=" + std::to_string(*f.v) +
                         " (model chunks per stage) needs schedule="
                         "interleaved, not schedule=" +
                         scheduleKey(*f.schedule));
  if (f.v && *f.v == 1 && f.schedule &&
      *f.schedule == PipelineSchedule::Interleaved1F1B)
    return Status::error("--fix: schedule=interleaved needs v >= 2 model "
                         "chunks per stage, not v=1");
  if (f.v && *f.v > 1 && f.pp && *f.pp == 1)
    return Status::error("--fix: v=" + std::to_string(*f.v) +
                         " (model chunks per stage) needs a pipeline, "
                         "not pp=1");
  // v > 1 means the interleaved schedule: honour it as such.
  if (f.v && *f.v > 1)
    f.schedule = PipelineSchedule::Interleaved1F1B;
  return f;
}

static std::optional<int64_t>
checkedProduct(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(p, f, &p))
      return std::nullopt;
  return p;
}

std::optional<int64_t> FixSpec::degreeProduct() const {
  return checkedProduct({dp.value_or(1), tp.value_or(1), pp.value_or(1),
                         cp.value_or(1)});
}

std::optional<int64_t> FixSpec::batchProduct() const {
  return checkedProduct(
      {dp.value_or(1), mbs.value_or(1), numMicroBatches.value_or(1)});
}

std::string FixSpec::str() const {
  std::string s;
  auto add = [&](const std::string &kv) { s += (s.empty() ? "" : ",") + kv; };
  if (dp) add("dp=" + std::to_string(*dp));
  if (tp) add("tp=" + std::to_string(*tp));
  if (pp) add("pp=" + std::to_string(*pp));
  if (cp) add("cp=" + std::to_string(*cp));
  if (sp) add(std::string("sp=") + (*sp ? "1" : "0"));
  if (mbs) add("mbs=" + std::to_string(*mbs));
  if (numMicroBatches) add("mb=" + std::to_string(*numMicroBatches));
  if (schedule) add(std::string("schedule=") + scheduleKey(*schedule));
  if (v) add("v=" + std::to_string(*v));
  if (zero) add("zero=" + std::to_string(*zero));
  if (recompute) add(std::string("recompute=") + recomputeName(*recompute));
  if (layout)
    add(std::string("layout=") +
        (*layout == ProcessLayout::InGraph ? "in-graph" : "between-graph"));
  return s;
}

std::string Candidate::key() const {
  std::string s = "dp=" + std::to_string(cfg.dp) + " tp=" +
                  std::to_string(cfg.tp) + " pp=" + std::to_string(cfg.pp);
  if (cfg.cp > 1)
    s += " cp=" + std::to_string(cfg.cp);
  if (cfg.sequenceParallel)
    s += " sp=1";
  s += " mbs=" + std::to_string(cfg.microBatchSize) + " mb=" +
                  std::to_string(cfg.numMicroBatches) + " schedule=" +
                  scheduleKey(cfg.schedule);
  if (cfg.schedule == PipelineSchedule::Interleaved1F1B)
    s += " v=" + std::to_string(cfg.virtualStages);
  s += " zero=" + std::to_string(cfg.zeroStage) +
       " recompute=" + recomputeName(cfg.recompute);
  if (!cfg.stageLayerCounts.empty()) {
    s += " split=";
    for (size_t i = 0; i < cfg.stageLayerCounts.size(); ++i)
      s += (i ? "/" : "") + std::to_string(cfg.stageLayerCounts[i]);
  }
  return s;
}

//===----------------------------------------------------------------------===//
// The model
//===----------------------------------------------------------------------===//

Expected<TransformerSpec> transformerSpecOf(const GraphSummary &g) {
  if (g.numLayers == 0)
    return Status::error(
        "the model has no dlopt.layer marks; --dry-run plans models with "
        "layer marks (transformers from dlopt-gen) only for now");
  if (!g.isTransformer())
    return Status::error(
        "the model has layer marks but no attention op with [B, H, S, D] "
        "operands or no integer [B, S] tokens input; --dry-run plans "
        "transformers only for now");
  TransformerSpec s;
  s.numLayers = g.numLayers;
  s.hidden = g.hidden;
  s.heads = g.heads;
  s.kvHeads = g.kvHeads;
  s.seqLen = g.seq;
  s.vocab = g.vocab > 0 ? g.vocab : 1;
  s.ffnHidden = g.ffn;
  s.tiedEmbeddings = g.tiedEmbeddings;
  s.learnedPositions = g.learnedPositions;
  if (g.normParamsPerLayer || g.normParamsPost) {
    s.normParamsPerLayer = g.normParamsPerLayer;
    s.normParamsPost = g.normParamsPost;
  }
  // The memory model counts a GPT layer (4h^2 + 2hf + biases). A layer with
  // more parameters (a gated MLP) gets the ffn width with the same count.
  const OpGroupSummary *l0 = nullptr;
  for (const OpGroupSummary &grp : g.groups)
    if (grp.layer >= 0 && !l0)
      l0 = &grp;
  if (l0) {
    double h = s.hidden;
    double gptLayer = s.layerParams();
    if (l0->params > 1.02 * gptLayer && h > 0) {
      int64_t f = static_cast<int64_t>(
          std::llround((l0->params - 4 * h * h) / (2 * h)));
      if (f > 0) {
        s.ffnShardWidth = s.ffn();
        s.ffnHidden = f;
        s.gatedMlp = true;
      }
    }
  }
  DLOPT_RETURN_IF_ERROR(s.validate());
  return s;
}

namespace {

/// One matmul of a group, per sample, with how tensor parallelism splits it
/// (TransformerSharding's strategy at tp = 2).
struct GroupGemm {
  GemmShape perSample; ///< m per sample when `broadcast`, else batch
  bool broadcast = true; ///< a weight shared by every row: one GEMM of rows
  enum class Split { None, N, K, Vocab } split = Split::None;
};

/// Per-sample costs of one group by kind.
struct GroupCost {
  /// The group's matmuls, priced one by one with tile and wave
  /// quantization (CostModel::gemmEfficiency); empty for graphs without an
  /// op list, which price mmFlops/mmBytes in one roofline.
  std::vector<GroupGemm> gemms;
  double mmFlops = 0, mmBytes = 0, attFlops = 0, attBytes = 0, otFlops = 0,
         otBytes = 0;
  /// The part of the elementwise work on [s, h] tensors (layer norms,
  /// residual adds, dropouts) that tensor parallelism replicates unless
  /// sequence parallelism splits it.
  double repFlops = 0, repBytes = 0;
  double ops = 0; ///< kernels per forward
};

/// Passes over an [s, h] activation one layer makes outside its matmuls and
/// attention (two layer norms read+write 4, two residual adds 6, two
/// dropouts with their masks 5) and the FLOPs per element they do, for
/// graphs without an op list; otherwise the replicated ops are counted
/// (tpRolesOf).
constexpr double kReplicatedPasses = 15;
constexpr double kReplicatedFlopsPerElement = 20;

/// Forward seconds selective recomputation re-runs per stage: it re-runs
/// softmax and dropout results, which blocks with dlopt's fused attention
/// (its backward recomputes the probabilities itself) do not have. It also
/// keeps what `none` keeps (activationBytesPerLayer), so the free search
/// skips it; `--fix recompute=selective` prices it as `none`.
constexpr double kSelectiveRerun = 0;

/// Forward seconds of each layer (and pre/post) for one (mbs, tp, cp, sp).
struct LayerTimes {
  std::vector<double> fwd;       ///< per layer, in mark order
  std::vector<double> prefix;    ///< prefix sums of fwd
  std::vector<double> opsPrefix; ///< prefix sums of kernels per forward
  double pre = 0, post = 0;
};

/// Where the pipeline stages of a candidate land on a heterogeneous
/// cluster: stage st holds ranks [st*S, (st+1)*S), S = tp*cp*dp.
struct StagePlacement {
  std::vector<int> kind;        ///< GPU kind per stage (its slowest)
  std::vector<double> capacity; ///< smallest device memory per stage
  bool uniform = true;          ///< every stage has one kind and capacity
};

struct Shape {
  int dp, tp, pp, cp;
  bool operator<(const Shape &o) const {
    return std::tie(dp, tp, pp, cp) < std::tie(o.dp, o.tp, o.pp, o.cp);
  }
};

/// Tensor-parallel collectives of one layer per micro-batch, as
/// dlopt-partition and dlopt-recompute issue them: 2 per pass (an
/// all-reduce, or under sequence parallelism an all-gather and a
/// reduce-scatter of the same activation), forward and backward; full
/// recomputation re-runs the forward collectives the backward pass needs,
/// which are all but the one producing the layer's output (its input is
/// kept): one all-reduce, or two all-gathers and one reduce-scatter.
struct TpCalls {
  double allReduce = 0, allGather = 0, reduceScatter = 0;
  double total() const { return allReduce + allGather + reduceScatter; }
};
TpCalls tpCallsPerLayer(const TrainingConfig &cfg, bool train) {
  TpCalls n;
  if (cfg.tp <= 1)
    return n;
  double passes = train ? 2 : 1;
  bool full = train && cfg.recompute == RecomputePolicy::Full;
  if (cfg.sequenceParallel) {
    n.allGather = 2 * passes + (full ? 2 : 0);
    n.reduceScatter = 2 * passes + (full ? 1 : 0);
  } else {
    n.allReduce = 2 * passes + (full ? 1 : 0);
  }
  return n;
}

struct Ctx {
  const GraphSummary &graph;
  const Cluster &cluster;
  const CostModel &cost;
  const SearchOptions &opt;
  TransformerSpec spec{};
  GpuSpec gpu{}; ///< the slowest GPU kind
  double capacity = 0; ///< the smallest device memory
  /// Heterogeneous clusters: the distinct GPU kinds, the kind of each node
  /// group and the first rank of each group. Pipeline stages are placed on
  /// consecutive ranks (rank order tp, cp, dp, pp), so a stage lives on the
  /// groups its rank range touches.
  bool hetero = false;
  /// Every layer costs the same (a stage's time depends on its layer count
  /// only), which lets the heterogeneous split use the faster count search.
  bool identicalLayers = false;
  std::vector<GpuSpec> kinds{};
  std::vector<int> groupKind{};
  std::vector<int> groupFirstRank{};
  std::map<std::pair<int, int>, StagePlacement> placementCache{};
  /// Layer splits for time alone, by (mbs, tp, cp, sp, recompute, pp,
  /// placement: stage ranks on a heterogeneous cluster, else 0).
  std::map<std::tuple<int64_t, int, int, bool, int, int, int>,
           std::vector<int64_t>>
      splitCache{};
  double modelBatch = 1;
  double kvFraction = 1; ///< key/value heads / query heads
  int gpusPerNode = 1;
  HostSpec host{}; ///< the most constrained host
  std::vector<GroupCost> layers{};
  GroupCost pre{}, post{};
  std::map<std::tuple<int64_t, int, int, bool, int>, LayerTimes> timeCache{};
  std::map<std::pair<int, int>, Expected<CommGroup>> groupCache{};

  const GpuSpec &kindSpec(int kind) const {
    return kind < 0 || kind >= int(kinds.size()) ? gpu : kinds[kind];
  }

  double roofline(OpKind kind, double flops, double bytes,
                  int gpuKind = -1) const {
    if (flops <= 0 && bytes <= 0)
      return 0;
    // fp8 runs only the GEMMs in fp8 (Transformer Engine's recipe):
    // attention and the elementwise work stay in bf16.
    Precision p = kind == OpKind::Matmul || opt.precision != Precision::FP8
                      ? opt.precision
                      : Precision::BF16;
    OpCost op{kind, p, flops, bytes};
    auto e = cost.computeTime(op, kindSpec(gpuKind));
    return e ? e->time : 0;
  }

  /// Time of one matmul of a group for `scale` samples on a tp rank.
  double gemmTime(const GroupGemm &gm, double scale, int tp,
                  int gpuKind) const {
    GemmShape g = gm.perSample;
    if (gm.broadcast)
      g.m *= scale;
    else
      g.batch *= scale;
    using Split = GroupGemm::Split;
    const bool vocabSplit = gm.split == Split::Vocab &&
                            std::fmod(g.n, double(tp)) == 0;
    if (gm.split == Split::N || vocabSplit)
      g.n /= tp;
    else if (gm.split == Split::K)
      g.k /= tp;
    const double weights = g.k * g.n * (gm.broadcast ? 1 : g.batch);
    const double bytes = (g.m * g.k * g.batch + weights + g.m * g.n * g.batch) *
                         opt.bytes.activationBytes;
    auto e = cost.gemmTime(g, bytes, opt.precision, kindSpec(gpuKind));
    return e ? e->time : 0;
  }

  /// Forward time of a group for `scale` samples of s/cp tokens each, with
  /// its matmuls, attention and split elementwise work divided by tp and the
  /// replicated part divided by tp only under sequence parallelism.
  double groupTime(const GroupCost &g, double scale, int tp, bool sp,
                   int gpuKind) const {
    double att = roofline(OpKind::Attention, g.attFlops * scale / tp,
                          g.attBytes * scale / tp, gpuKind);
    double repDiv = sp ? tp : 1;
    double mm = 0;
    if (g.gemms.empty())
      mm = roofline(OpKind::Matmul, g.mmFlops * scale / tp,
                    g.mmBytes * scale / tp, gpuKind);
    for (const GroupGemm &gm : g.gemms)
      mm += gemmTime(gm, scale, tp, gpuKind);
    return mm + att +
           roofline(OpKind::Elementwise,
                    (g.otFlops - g.repFlops) * scale / tp +
                        g.repFlops * scale / repDiv,
                    (g.otBytes - g.repBytes) * scale / tp +
                        g.repBytes * scale / repDiv,
                    gpuKind);
  }

  /// Per-layer forward times of one micro-batch on GPU kind `gpuKind` (-1:
  /// the slowest kind).
  const LayerTimes &times(int64_t mbs, int tp, int cp, bool sp,
                          int gpuKind = -1) {
    auto key = std::make_tuple(mbs, tp, cp, sp, gpuKind);
    auto it = timeCache.find(key);
    if (it != timeCache.end())
      return it->second;
    LayerTimes t;
    // A context-parallel rank holds s/cp tokens of each sample; causal
    // attention is load-balanced (two chunks per rank), so every part of
    // the work divides by cp.
    double scale = static_cast<double>(mbs) / cp;
    t.prefix.push_back(0);
    t.opsPrefix.push_back(0);
    for (const GroupCost &g : layers) {
      double f = groupTime(g, scale, tp, sp, gpuKind);
      t.fwd.push_back(f);
      t.prefix.push_back(t.prefix.back() + f);
      t.opsPrefix.push_back(t.opsPrefix.back() + g.ops);
    }
    t.pre = groupTime(pre, scale, tp, sp, gpuKind);
    t.post = groupTime(post, scale, tp, sp, gpuKind);
    return timeCache.emplace(key, std::move(t)).first->second;
  }

  /// Tensor-parallel communication of one layer for one micro-batch of
  /// `boundary` activation bytes (tpCallsPerLayer).
  double tpCommPerLayer(const TrainingConfig &cfg, double boundary,
                        bool train) {
    if (cfg.tp <= 1)
      return 0;
    TpCalls n = tpCallsPerLayer(cfg, train);
    return n.allReduce * comm(Collective::AllReduce, boundary, cfg.tp, 1) +
           n.allGather * comm(Collective::AllGather, boundary, cfg.tp, 1) +
           n.reduceScatter * comm(Collective::ReduceScatter, boundary, cfg.tp, 1);
  }

  /// Every stage on the slowest kind with the smallest memory (cached).
  const StagePlacement &uniformPlacement(int pp) {
    auto key = std::make_pair(0, pp);
    auto it = placementCache.find(key);
    if (it != placementCache.end())
      return it->second;
    StagePlacement pl;
    pl.kind.assign(pp, -1);
    pl.capacity.assign(pp, capacity);
    return placementCache.emplace(key, std::move(pl)).first->second;
  }

  /// The GPU kind and memory of each stage of S ranks (cached).
  const StagePlacement &placement(int stageRanks, int pp) {
    auto key = std::make_pair(stageRanks, pp);
    auto it = placementCache.find(key);
    if (it != placementCache.end())
      return it->second;
    StagePlacement pl;
    for (int st = 0; st < pp; ++st) {
      const int lo = st * stageRanks, hi = lo + stageRanks;
      int kind = -1;
      double cap = 0;
      for (size_t gi = 0; gi < cluster.groups.size(); ++gi) {
        const NodeGroup &g = cluster.groups[gi];
        int first = groupFirstRank[gi], end = first + g.count * g.gpusPerNode;
        if (end <= lo || first >= hi)
          continue;
        const GpuSpec &k = kinds[groupKind[gi]];
        if (kind < 0 || slowerGpu(k, kinds[kind], opt.precision))
          kind = groupKind[gi];
        cap = cap == 0 ? k.memoryBytes : std::min(cap, k.memoryBytes);
      }
      pl.kind.push_back(kind);
      pl.capacity.push_back(cap);
      if (st > 0 && (kind != pl.kind[0] || cap != pl.capacity[0]))
        pl.uniform = false;
    }
    return placementCache.emplace(key, std::move(pl)).first->second;
  }

  const Expected<CommGroup> &group(int size, int stride) {
    auto key = std::make_pair(size, stride);
    auto it = groupCache.find(key);
    if (it != groupCache.end())
      return it->second;
    return groupCache.emplace(key, cluster.stridedGroup(size, stride, 0))
        .first->second;
  }

  double comm(Collective c, double bytes, int size, int stride,
              LinkKind *link = nullptr) {
    if (size <= 1 || bytes <= 0)
      return 0;
    const auto &g = group(size, stride);
    if (!g)
      return 0;
    auto e = cost.commTime(c, bytes, *g);
    if (!e)
      return 0;
    if (link)
      *link = e->link;
    return e->time;
  }
};

/// First layer index of each stage (contiguous, the first L mod pp stages
/// one layer longer, as MemoryModel's layersOnStage).
std::vector<int64_t> stageStarts(int64_t layers, int pp) {
  std::vector<int64_t> starts;
  int64_t at = 0;
  for (int st = 0; st < pp; ++st) {
    starts.push_back(at);
    at += layers / pp + (st < layers % pp ? 1 : 0);
  }
  starts.push_back(at);
  return starts;
}

/// First layer index of each stage under cfg's split (uniform when unset).
std::vector<int64_t> stageStarts(const TransformerSpec &spec,
                                 const TrainingConfig &cfg) {
  if (cfg.stageLayerCounts.empty())
    return stageStarts(spec.numLayers, cfg.pp);
  std::vector<int64_t> starts{0};
  for (int64_t n : cfg.stageLayerCounts)
    starts.push_back(starts.back() + n);
  return starts;
}

/// The layer ranges [a, b) of each stage: one contiguous range, or under
/// interleaved 1F1B the v model chunks of the stage (chunk j of the pp*v
/// chunks, in layer order, runs on stage j mod pp).
struct StageRanges {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges;

  int64_t layers(int st) const {
    int64_t n = 0;
    for (auto [a, b] : ranges[st])
      n += b - a;
    return n;
  }
  /// The sum over the stage's layers of a per-layer quantity given by its
  /// prefix sums.
  double sum(const std::vector<double> &prefix, int st) const {
    double x = 0;
    for (auto [a, b] : ranges[st])
      x += prefix[b] - prefix[a];
    return x;
  }
};

StageRanges stageRanges(const TransformerSpec &spec,
                        const TrainingConfig &cfg) {
  StageRanges r;
  r.ranges.resize(cfg.pp);
  if (cfg.schedule == PipelineSchedule::Interleaved1F1B && cfg.pp > 1) {
    auto chunks =
        interleavedChunkLayers(spec.numLayers, cfg.pp, cfg.virtualStages);
    int64_t at = 0;
    for (size_t j = 0; j < chunks.size(); ++j) {
      r.ranges[j % cfg.pp].push_back({at, at + chunks[j]});
      at += chunks[j];
    }
    return r;
  }
  auto starts = stageStarts(spec, cfg);
  for (int st = 0; st < cfg.pp; ++st)
    r.ranges[st].push_back({starts[st], starts[st + 1]});
  return r;
}

/// A forward-only step keeps no gradients, optimizer state or stored
/// activations: one layer's activations per micro-batch in flight.
void forwardOnlyMemory(const Ctx &c, const TrainingConfig &cfg,
                       MemoryBreakdown &m) {
  TrainingConfig fwdOnly = cfg;
  fwdOnly.recompute = RecomputePolicy::None;
  m.grads = 0;
  m.optimizer = 0;
  m.transient = 0;
  m.activations = activationBytesPerLayer(c.spec, fwdOnly) *
                  std::min<double>(cfg.pp, cfg.numMicroBatches);
}

/// Memory of stage `st` holding `layers` layers.
Expected<MemoryBreakdown> stageMemory(const Ctx &c, const TrainingConfig &cfg,
                                      int st, int64_t layers) {
  auto m = transformerStageMemoryWithLayers(c.spec, cfg, st, layers,
                                            c.cost.calibration());
  if (m && !c.opt.training)
    forwardOnlyMemory(c, cfg, *m);
  return m;
}

} // namespace

namespace {

/// minMaxContiguousSplit when a stage's time depends only on how many
/// layers it holds (identical layers): then filling each stage with as many
/// layers as fit in T (and under the cap) is optimal, and a stage's fill is
/// found by bisection on its count, O(pp log L) per T.
bool countSplit(int64_t L, int pp,
                const std::function<double(int, int64_t, int64_t)> &time,
                const std::function<bool(int, int64_t)> &fits, double T,
                int64_t cap, std::vector<int64_t> *out) {
  int64_t a = 0;
  if (out)
    out->clear();
  for (int st = 0; st < pp; ++st) {
    const int64_t maxN = std::min(cap, L - a - (pp - 1 - st));
    auto ok = [&](int64_t n) { return time(st, 0, n) <= T && fits(st, n); };
    int64_t n = 0;
    if (st == pp - 1) {
      n = L - a >= 1 && L - a <= cap && ok(L - a) ? L - a : 0;
    } else if (maxN >= 1 && ok(1)) {
      int64_t lo = 1, hi = maxN; // ok(lo) holds
      while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (ok(mid))
          lo = mid;
        else
          hi = mid - 1;
      }
      n = lo;
    }
    if (n == 0)
      return false;
    if (out)
      out->push_back(n);
    a += n;
  }
  return true;
}

/// The general case: reach[st][a] says stages 0..st-1 can cover layers
/// [0, a) within T with at most `cap` layers each. For a start a, stage st
/// can end anywhere in [a+1, maxEnd(a)]; maxEnd never decreases with a (a
/// shorter range is no slower and no larger), so one sweep per stage finds
/// them all: O(pp * L) per T. The split is read back from the end.
bool reachSplit(int64_t L, int pp,
                const std::function<double(int, int64_t, int64_t)> &time,
                const std::function<bool(int, int64_t)> &fits, double T,
                int64_t cap, std::vector<int64_t> *out) {
  std::vector<std::vector<char>> reach(pp + 1, std::vector<char>(L + 1, 0));
  std::vector<int64_t> diff(L + 2);
  reach[0][0] = 1;
  for (int st = 0; st < pp; ++st) {
    std::fill(diff.begin(), diff.end(), 0);
    const int64_t lastEnd = L - (pp - 1 - st); // later stages need 1 each
    int64_t b = 0;
    for (int64_t a = 0; a < L; ++a) {
      b = std::max(b, a);
      while (b < lastEnd && b + 1 - a <= cap && time(st, a, b + 1) <= T &&
             fits(st, b + 1 - a))
        ++b;
      if (!reach[st][a] || b <= a)
        continue;
      int64_t lo = st == pp - 1 ? L : a + 1, hi = b;
      if (lo <= hi) {
        ++diff[lo];
        --diff[hi + 1];
      }
    }
    int64_t run = 0;
    for (int64_t e = 0; e <= L; ++e) {
      run += diff[e];
      reach[st + 1][e] = run > 0;
    }
  }
  if (!reach[pp][L])
    return false;
  if (out) {
    // Walk back from the end: the latest start of each stage that is
    // reachable and reaches the next stage's start.
    out->assign(pp, 0);
    int64_t e = L;
    for (int st = pp - 1; st >= 0; --st) {
      int64_t a = e - 1;
      while (a >= 0 && !(reach[st][a] && e - a <= cap && time(st, a, e) <= T &&
                         fits(st, e - a)))
        --a;
      if (a < 0)
        return false; // cannot happen: reach[pp][L] held
      (*out)[st] = e - a;
      e = a;
    }
  }
  return true;
}

} // namespace

std::vector<int64_t> minMaxContiguousSplit(
    int64_t layers, int stages,
    const std::function<double(int, int64_t, int64_t)> &time,
    const std::function<bool(int, int64_t)> &fits, bool positionFree) {
  const int64_t L = layers;
  const int pp = stages;
  if (pp < 1 || L < pp)
    return {};
  auto solve = [&](double T, int64_t cap, std::vector<int64_t> *out) {
    return positionFree ? countSplit(L, pp, time, fits, T, cap, out)
                        : reachSplit(L, pp, time, fits, T, cap, out);
  };
  // Any split's bottleneck is at most the largest whole-model stage time.
  double hi = 0;
  for (int st = 0; st < pp; ++st)
    hi = std::max(hi, time(st, 0, L));
  hi = hi * (1 + 1e-12) + 1e-300;
  if (!solve(hi, L, nullptr))
    return {};
  double lo = 0;
  for (int it = 0; it < 100 && hi - lo > 1e-9 * hi; ++it) {
    double mid = 0.5 * (lo + hi);
    if (solve(mid, L, nullptr))
      hi = mid;
    else
      lo = mid;
  }
  // Among the splits with that bottleneck, the one with the fewest layers
  // on its fullest stage (filling stages greedily would otherwise pile
  // layers onto the first stages, which costs memory for nothing).
  int64_t capLo = (L + pp - 1) / pp, capHi = L;
  while (capLo < capHi) {
    int64_t mid = capLo + (capHi - capLo) / 2;
    if (solve(hi, mid, nullptr))
      capHi = mid;
    else
      capLo = mid + 1;
  }
  std::vector<int64_t> counts;
  if (!solve(hi, capHi, &counts))
    return {};
  return counts;
}

namespace {

/// Layers per stage on a heterogeneous cluster: the contiguous split that
/// minimizes the slowest stage's time per micro-batch (compute on the
/// stage's own GPU kind plus its tensor-parallel communication) with every
/// stage within its own device memory (minMaxContiguousSplit). Returns {}
/// when no split fits (the candidate is then priced uniformly and reported
/// out of memory).
std::vector<int64_t> splitLayers(Ctx &c, const TrainingConfig &cfg,
                                 const StagePlacement &pl, int placementKey,
                                 double tpLayer) {
  const int pp = cfg.pp;
  const bool train = c.opt.training;
  const bool sp = cfg.sequenceParallel && cfg.tp > 1;
  std::vector<const LayerTimes *> lt;
  for (int st = 0; st < pp; ++st)
    lt.push_back(&c.times(cfg.microBatchSize, cfg.tp, cfg.cp, sp, pl.kind[st]));
  auto stageTime = [&](int st, int64_t a, int64_t b) {
    const LayerTimes &t = *lt[st];
    double f = t.prefix[b] - t.prefix[a];
    if (st == 0)
      f += t.pre;
    if (st == pp - 1)
      f += t.post;
    double x = train ? c.cost.trainingTime(f, cfg.recompute, kSelectiveRerun) : f;
    return x + double(b - a) * tpLayer;
  };
  // The split for time alone depends on no memory setting (ZeRO, schedule,
  // dp), so it is shared by many candidates; it is kept when every stage
  // fits.
  auto key = std::make_tuple(cfg.microBatchSize, cfg.tp, cfg.cp, sp,
                             int(cfg.recompute), pp, placementKey);
  auto it = c.splitCache.find(key);
  if (it == c.splitCache.end())
    it = c.splitCache
             .emplace(key, minMaxContiguousSplit(
                               c.spec.numLayers, pp, stageTime,
                               [](int, int64_t) { return true; },
                               c.identicalLayers))
             .first;
  const std::vector<int64_t> &fast = it->second;
  bool fits = !fast.empty();
  for (int st = 0; fits && st < pp; ++st) {
    auto m = stageMemory(c, cfg, st, fast[st]);
    fits = m && m->total() <= pl.capacity[st];
  }
  if (fits)
    return fast;
  // Memory binds: split again under every stage's capacity. Memory is
  // affine in the stage's layers.
  std::vector<double> mem1, slope;
  for (int st = 0; st < pp; ++st) {
    auto a = stageMemory(c, cfg, st, 1), b = stageMemory(c, cfg, st, 2);
    if (!a || !b)
      return {};
    mem1.push_back(a->total());
    slope.push_back(b->total() - a->total());
  }
  auto fitsMem = [&](int st, int64_t n) {
    return mem1[st] + double(n - 1) * slope[st] <= pl.capacity[st];
  };
  return minMaxContiguousSplit(c.spec.numLayers, pp, stageTime, fitsMem,
                               c.identicalLayers);
}

/// The optimizer step on a device holding `mem`: memory-bound over its
/// optimizer shard (Adam with fp32 master weights reads and writes about 28
/// bytes per parameter: bf16 weight and gradient, fp32 master and two
/// moments; SGD/momentum about 16), 10 FLOPs per parameter.
double optimizerStepTime(const Ctx &c, const TrainingConfig &cfg,
                         const MemoryBreakdown &mem, int gpuKind) {
  const PrecisionConfig &pr = cfg.precision;
  double moments = cfg.optimizer == Optimizer::Adam       ? 2
                   : cfg.optimizer == Optimizer::Momentum ? 1
                                                          : 0;
  double perParam = pr.optimizerStateBytes * moments +
                    (pr.masterWeights ? pr.masterBytes : 0);
  double shard = perParam > 0 ? mem.optimizer / perParam
                              : mem.params / std::max(1.0, pr.paramBytes);
  double bytesPerParam = cfg.optimizer == Optimizer::Adam ? 28 : 16;
  return c.roofline(OpKind::Elementwise, 10 * shard, bytesPerParam * shard,
                    gpuKind);
}

/// Chooses the process layout: the host time each layout spends issuing a
/// step's launches (exposed only when it exceeds the devices' step time,
/// since the host runs ahead), under the node's host memory. Ties go to
/// in-graph: one process per node needs no launcher on one node, keeps one
/// loader and one copy of the plan per node, and saves (G-1) processes of
/// host memory.
void chooseLayout(Ctx &c, Candidate &cand, double launchesPerStep,
                  double deviceTime) {
  const Calibration &cal = c.cost.calibration();
  const int G = c.gpusPerNode;
  const int nodes = c.cluster.numNodes();
  double coreFactor =
      c.host.cpuCores > 0 ? std::max(1.0, double(G) / c.host.cpuCores) : 1.0;
  struct Option {
    ProcessLayout layout;
    int procs;
    double dispatch, memory, exposed;
    bool fits;
  };
  auto make = [&](ProcessLayout l) {
    Option o;
    o.layout = l;
    o.procs = l == ProcessLayout::InGraph ? 1 : G;
    double contention =
        l == ProcessLayout::InGraph ? 1 + cal.inGraphLaunchContention * (G - 1)
                                    : 1.0;
    o.dispatch =
        launchesPerStep * cal.kernelLaunchSeconds * contention * coreFactor;
    o.memory = o.procs * cal.processHostBytes + G * cal.deviceHostStagingBytes;
    o.fits = c.host.memoryBytes <= 0 || o.memory <= c.host.memoryBytes;
    o.exposed = std::max(0.0, o.dispatch - deviceTime);
    return o;
  };
  Option in = make(ProcessLayout::InGraph);
  Option bg = make(ProcessLayout::BetweenGraph);
  const Option *pick = &in;
  std::string why;
  auto ms = [](double s) { return report::strf("%.3f ms", s * 1e3); };
  auto gib = [](double b) {
    return report::strf("%.1f GiB", b / report::kGiB);
  };
  if (c.opt.fix.layout) {
    pick = *c.opt.fix.layout == ProcessLayout::InGraph ? &in : &bg;
    why = "fixed by --fix or the plan file";
  } else if (G == 1) {
    pick = &bg;
    why = "one GPU per node: the layouts coincide";
  } else if (!in.fits && bg.fits) {
    pick = &bg;
    why = "in-graph would need " + gib(in.memory) + " of host memory";
  } else if (in.fits && !bg.fits) {
    why = "between-graph would need " + gib(bg.memory) + " of host memory, " +
          "over the node's " + gib(c.host.memoryBytes);
  } else if (bg.exposed + 1e-12 < in.exposed) {
    pick = &bg;
    why = "host-bound step: one process driving " + std::to_string(G) +
          " GPUs would issue " + ms(in.dispatch) + " of launches against " +
          ms(bg.dispatch) + " per process, over the " + ms(deviceTime) +
          " the devices take";
  } else {
    why = "host dispatch hidden either way (" + ms(in.dispatch) +
          " of launches per step against " + ms(deviceTime) +
          " on the devices); one process per node saves " +
          gib(bg.memory - in.memory) + " of host memory" +
          (nodes == 1 ? " and needs no launcher" : "");
  }
  ProcessPlan &p = cand.process;
  p.layout = pick->layout;
  p.processesPerNode = pick->procs;
  p.hostDispatch = pick->dispatch;
  p.hostMemory = pick->memory;
  p.hostCapacity = c.host.memoryBytes;
  p.why = why;
  cand.time.host = pick->exposed;
}

/// Prices one candidate: memory and step time. Records the collectives when
/// `comms` is given.
void price(Ctx &c, Candidate &cand, std::vector<CommOp> *comms) {
  TrainingConfig &cfg = cand.cfg;
  const bool train = c.opt.training;
  const int cp = cfg.cp;
  const bool sp = cfg.sequenceParallel && cfg.tp > 1;
  cand.capacity = c.capacity;
  cand.time = StepTime{};
  cand.memory = MemoryBreakdown{};

  const double m = static_cast<double>(cfg.numMicroBatches);
  const double actBytes = cfg.precision.activationBytes;
  // One micro-batch's [s/cp, b, h] activation.
  const double boundary = double(cfg.microBatchSize) * c.spec.seqLen / cp *
                          c.spec.hidden * actBytes;
  const double tpLayer = c.tpCommPerLayer(cfg, boundary, train);

  // The layer split of a pipeline: the slowest stage as fast as possible.
  // On a homogeneous cluster that moves layers off the stages that also
  // hold the embeddings or the output layer (Llama 3 drops a layer from its
  // first and last stages for the same reason); on a heterogeneous one each
  // stage runs on its own GPU kind and memory, and faster or larger stages
  // take more layers. Interleaved 1F1B keeps the uniform split.
  const StagePlacement *pl =
      c.hetero ? &c.placement(cfg.tp * cp * cfg.dp, cfg.pp) : nullptr;
  cfg.stageLayerCounts.clear();
  if (cfg.pp > 1 && cfg.schedule != PipelineSchedule::Interleaved1F1B) {
    auto counts =
        splitLayers(c, cfg, pl ? *pl : c.uniformPlacement(cfg.pp),
                    pl ? cfg.tp * cp * cfg.dp : 0, tpLayer);
    bool uniform = true;
    for (int st = 0; st < int(counts.size()); ++st)
      uniform = uniform && counts[st] == layersOnStage(c.spec, cfg.pp, st);
    if (!uniform)
      cfg.stageLayerCounts = std::move(counts);
  } else if (cfg.pp > 1) {
    // Interleaved: chunks of L / (pp*v) layers, the first L mod (pp*v) one
    // longer; a stage holds v of them.
    auto chunks = interleavedChunkLayers(c.spec.numLayers, cfg.pp,
                                         cfg.virtualStages);
    std::vector<int64_t> counts(cfg.pp, 0);
    bool uniform = true;
    for (size_t j = 0; j < chunks.size(); ++j)
      counts[j % cfg.pp] += chunks[j];
    for (int st = 0; st < cfg.pp; ++st)
      uniform = uniform && counts[st] == layersOnStage(c.spec, cfg.pp, st);
    if (!uniform)
      cfg.stageLayerCounts = std::move(counts);
  }
  const StageRanges ranges = stageRanges(c.spec, cfg);

  // Memory (upper bound): every stage's, kept for the optimizer step below;
  // the report shows the stage with the least headroom under its own
  // capacity (the largest on a homogeneous cluster).
  std::vector<MemoryBreakdown> stageMems;
  for (int st = 0; st < cfg.pp; ++st) {
    auto mem = stageMemory(c, cfg, st, ranges.layers(st));
    if (!mem) {
      stageMems.clear();
      cand.memory = MemoryBreakdown{};
      cand.memory.workspace = std::numeric_limits<double>::infinity();
      break;
    }
    double cap = pl ? pl->capacity[st] : c.capacity;
    if (stageMems.empty() ||
        cap - mem->total() < cand.capacity - cand.memory.total()) {
      cand.memory = *mem;
      cand.capacity = cap;
    }
    stageMems.push_back(*mem);
  }

  // Compute per micro-batch on each stage; the slowest stage sets the pace.
  double worstTrain = 0, worstFwd = 0, worstOps = 0;
  int64_t worstLayers = 0;
  for (int st = 0; st < cfg.pp; ++st) {
    const LayerTimes &lt = c.times(cfg.microBatchSize, cfg.tp, cp, sp,
                                   pl ? pl->kind[st] : -1);
    double f = ranges.sum(lt.prefix, st);
    double ops = ranges.sum(lt.opsPrefix, st);
    if (st == 0) {
      f += lt.pre;
      ops += c.pre.ops;
    }
    if (st == cfg.pp - 1) {
      f += lt.post;
      ops += c.post.ops;
    }
    double t = train ? c.cost.trainingTime(f, cfg.recompute, kSelectiveRerun) : f;
    if (t > worstTrain) {
      worstTrain = t;
      worstFwd = f;
      worstOps = ops;
      worstLayers = ranges.layers(st);
    }
  }

  auto record = [&](const std::string &what, Collective coll, int size,
                    int stride, double bytes, double calls, double exposed) {
    if (!comms || size <= 1 || calls <= 0)
      return;
    LinkKind link = LinkKind::None;
    double time = calls * c.comm(coll, bytes, size, stride, &link);
    comms->push_back({what, coll, size, bytes, calls, link, time, exposed});
  };
  // Tensor parallelism: 2 all-reduces per layer per pass (forward,
  // backward, recomputed forward), on the critical path. Under sequence
  // parallelism each becomes an all-gather plus a reduce-scatter of the
  // same activation (Korthikanti et al. 2022): the same ring volume.
  double tpPerMb = 0;
  if (cfg.tp > 1) {
    TpCalls n = tpCallsPerLayer(cfg, train);
    if (!sp) {
      double one = c.comm(Collective::AllReduce, boundary, cfg.tp, 1);
      tpPerMb = n.allReduce * worstLayers * one;
      record("tp all-reduce (layer in/out)", Collective::AllReduce, cfg.tp, 1,
             boundary, n.allReduce * worstLayers * m, tpPerMb * m);
    } else {
      double ag = c.comm(Collective::AllGather, boundary, cfg.tp, 1);
      double rs = c.comm(Collective::ReduceScatter, boundary, cfg.tp, 1);
      tpPerMb = worstLayers * (n.allGather * ag + n.reduceScatter * rs);
      record("tp all-gather (sequence parallel)", Collective::AllGather,
             cfg.tp, 1, boundary, n.allGather * worstLayers * m,
             n.allGather * worstLayers * ag * m);
      record("tp reduce-scatter (sequence parallel)",
             Collective::ReduceScatter, cfg.tp, 1, boundary,
             n.reduceScatter * worstLayers * m,
             n.reduceScatter * worstLayers * rs * m);
    }
    // Vocabulary parallelism (the embedding table and the LM head split on
    // the vocabulary, planner/TransformerSharding.cpp), as dlopt-partition
    // applies it: the lookup's partial sum is all-reduced (reduce-scattered
    // into the sequence-parallel region), the head's input gathered under
    // sp; backward, the head's input gradient is all-reduced
    // (reduce-scattered) and, under sp, the embedding's output gradient
    // gathered for the local scatter into the table's rows. Cross-entropy
    // reduces three float32 [rows, 1] vectors (row max, sum of
    // exponentials, target logit) instead of gathering logits. On the
    // stages that hold the embedding or the head; priced on the critical
    // path.
    if (c.spec.vocab > 0 && c.spec.vocab % cfg.tp == 0) {
      double vcalls = (train ? 2 : 1) * m;
      double vPerMb = 0;
      if (!sp) {
        double one = c.comm(Collective::AllReduce, boundary, cfg.tp, 1);
        vPerMb = (train ? 2 : 1) * one;
        record("tp all-reduce (vocab-parallel embedding, LM head)",
               Collective::AllReduce, cfg.tp, 1, boundary, vcalls, vPerMb * m);
      } else {
        double ag = c.comm(Collective::AllGather, boundary, cfg.tp, 1);
        double rs = c.comm(Collective::ReduceScatter, boundary, cfg.tp, 1);
        vPerMb = (train ? 2 : 1) * (ag + rs);
        record("tp all-gather (vocab-parallel LM head, embedding grad)",
               Collective::AllGather, cfg.tp, 1, boundary, vcalls,
               (train ? 2 : 1) * ag * m);
        record("tp reduce-scatter (vocab-parallel embedding, LM head grad)",
               Collective::ReduceScatter, cfg.tp, 1, boundary, vcalls,
               (train ? 2 : 1) * rs * m);
      }
      double rowStats = double(cfg.microBatchSize) * c.spec.seqLen / cp * 4;
      double ce = c.comm(Collective::AllReduce, rowStats, cfg.tp, 1);
      vPerMb += 3 * ce;
      record("tp all-reduce (vocab-parallel cross-entropy)",
             Collective::AllReduce, cfg.tp, 1, rowStats, 3 * m, 3 * ce * m);
      tpPerMb += vPerMb;
    }
    // Sequence parallelism leaves the gradients of the weights applied to
    // sequence-split rows partial over tp: one all-reduce each per step
    // (the norms' weights and biases, learned positions; the row-parallel
    // biases too, which are left out: a vector each).
    if (sp && train) {
      double h = c.spec.hidden * cfg.precision.gradReduceBytes;
      double calls = double(c.spec.normParamsPerLayer * worstLayers +
                            c.spec.normParamsPost);
      double bytes = calls * h;
      if (c.spec.learnedPositions) {
        bytes += double(c.spec.seqLen) * h;
        calls += 1;
      }
      // A vocabulary that tp does not divide keeps the embedding and the
      // LM head replicated: their gradients over sequence-split rows are
      // whole tables, all-reduced over tp (pad the vocabulary to a
      // multiple of tp to avoid it).
      if (c.spec.vocab > 0 && c.spec.vocab % cfg.tp != 0) {
        double tables = c.spec.tiedEmbeddings ? 1 : 2;
        bytes += tables * double(c.spec.vocab) * h;
        calls += tables;
      }
      double time =
          calls > 0 ? c.comm(Collective::AllReduce, bytes / calls, cfg.tp, 1) * calls : 0;
      if (calls > 0)
        record("tp all-reduce (sequence-parallel weight gradients)",
             Collective::AllReduce, cfg.tp, 1, bytes / calls, calls, time);
      tpPerMb += time / m;
    }
  }

  // Context parallelism as dlopt-partition applies it, the all-gather form
  // (docs/parallel.md): per layer every rank gathers the keys and values of
  // the whole sequence before attention (again for a recomputed forward)
  // and, backward, reduce-scatters their gradients back onto the sequence;
  // the loss gathers the logits over cp (flattening [b, s] with s split has
  // no block layout). None of it overlaps with compute.
  double cpPerMb = 0;
  if (cp > 1) {
    const double mbs = double(cfg.microBatchSize), seqLen = double(c.spec.seqLen);
    double kvOne = mbs * seqLen * c.spec.hidden * c.kvFraction / cfg.tp * actBytes;
    double ag = c.comm(Collective::AllGather, kvOne, cp, cfg.tp);
    double rs = c.comm(Collective::ReduceScatter, kvOne, cp, cfg.tp);
    double gathers = 2 * (1 + (train && cfg.recompute == RecomputePolicy::Full ? 1 : 0));
    double scatters = train ? 2 : 0;
    cpPerMb = worstLayers * (gathers * ag + scatters * rs);
    record("cp K/V all-gather (attention)", Collective::AllGather, cp, cfg.tp,
           kvOne, gathers * worstLayers * m, gathers * worstLayers * ag * m);
    record("cp K/V gradient reduce-scatter (attention)",
           Collective::ReduceScatter, cp, cfg.tp, kvOne,
           scatters * worstLayers * m, scatters * worstLayers * rs * m);
    if (c.spec.vocab > 0) {
      bool vocabParallel = cfg.tp > 1 && c.spec.vocab % cfg.tp == 0;
      double logits = mbs * seqLen * double(c.spec.vocab) /
                      (vocabParallel ? cfg.tp : 1) * actBytes;
      double lg = c.comm(Collective::AllGather, logits, cp, cfg.tp);
      cpPerMb += lg;
      record("cp logits all-gather (loss)", Collective::AllGather, cp, cfg.tp,
             logits, m, lg * m);
    }
  }

  // Pipeline send/recv: activations forward, gradients backward, v times
  // per micro-batch when interleaved; overlapped with the micro-batch.
  const int ppStride = cfg.tp * cp * cfg.dp;
  double ppExposed = 0;
  if (cfg.pp > 1) {
    double v = cfg.schedule == PipelineSchedule::Interleaved1F1B
                   ? cfg.virtualStages
                   : 1;
    double perMb = (train ? 2 : 1) * v;
    double one = c.comm(Collective::SendRecv, boundary, 2, ppStride);
    ppExposed = m * c.cost.exposedP2P(perMb * one, worstTrain);
    record("pp send/recv (stage boundary)", Collective::SendRecv, 2, ppStride,
           boundary, perMb * m, ppExposed);
  }

  StepTime &T = cand.time;
  double perMb = worstTrain + tpPerMb + cpPerMb;
  T.compute = m * worstTrain;
  T.tpComm = m * tpPerMb;
  T.cpComm = m * cpPerMb;
  T.ppComm = ppExposed;
  if (cfg.pp > 1) {
    double fill = (cfg.pp - 1) * perMb;
    switch (train ? cfg.schedule : PipelineSchedule::GPipe) {
    case PipelineSchedule::GPipe:
    case PipelineSchedule::OneFOneB:
      T.bubble = fill;
      break;
    case PipelineSchedule::Interleaved1F1B:
      T.bubble = fill / cfg.virtualStages;
      break;
    case PipelineSchedule::ZeroBubble: {
      // ZB-H1 (Qi et al. 2023): deferred weight-gradient passes fill the
      // cooldown, leaving (pp-1) * (t_F + t_B - t_W) where t_B is the
      // input-gradient part (t_B + t_W = the backward), i.e. the 1F1B
      // bubble less 2 (pp-1) t_W; it cannot drop below (pp-1) max(t_F,
      // t_B) (the simulator shows the same floor).
      double weightGrad =
          worstFwd * c.cost.calibration().backwardFlopsRatio / 2;
      double inputGrad = std::max(0.0, perMb - worstFwd - weightGrad);
      T.bubble = (cfg.pp - 1) * std::max(perMb - 2 * weightGrad,
                                         std::max(worstFwd, inputGrad));
      break;
    }
    }
  }

  // Data parallelism: gradient sync over the dp * cp ranks that hold the
  // same parameters (all-reduce, or reduce-scatter plus a parameter
  // all-gather under ZeRO), overlapped with the last micro-batch's
  // backward; ZeRO-3 gathers parameters for every forward and backward.
  const int replicas = cfg.dp * cp;
  double zero3Calls = 0;
  if (train && replicas > 1) {
    double pBytes = cfg.precision.paramBytes;
    double paramsOnDevice = cand.memory.params / pBytes *
                            (cfg.zeroStage == 3 ? replicas : 1);
    double gradBytes = paramsOnDevice * cfg.precision.gradReduceBytes;
    double paramBytes = paramsOnDevice * pBytes;
    double backward = worstTrain - worstFwd;
    int dp = replicas, stride = cfg.tp;
    const char *grp = cp > 1 ? "dp*cp" : "dp";
    if (cfg.zeroStage == 0) {
      double t = c.comm(Collective::AllReduce, gradBytes, dp, stride);
      double e = c.cost.exposedGradSync(t, backward);
      T.dpComm += e;
      record(std::string(grp) + " gradient all-reduce", Collective::AllReduce,
             dp, stride, gradBytes, 1, e);
    } else if (cfg.zeroStage == 3) {
      // Layer by layer, one layer prefetched (FSDP-style): the gather of
      // layer i+1 runs during layer i's forward; in the backward, the
      // gather for the next layer and the reduce-scatter of the layer just
      // finished share the same links during one layer's backward. Per
      // micro-batch, the first gather has nothing to hide behind, each
      // later layer exposes what its compute cannot hide, and the last
      // reduce-scatter follows the last backward (docs/cost-model.md,
      // "ZeRO-3").
      const double L = double(std::max<int64_t>(1, worstLayers));
      const double perLayerParams = paramBytes / L, perLayerGrads = gradBytes / L;
      const double ag1 =
          c.comm(Collective::AllGather, perLayerParams, dp, stride);
      const double rs1 =
          c.comm(Collective::ReduceScatter, perLayerGrads, dp, stride);
      const double eff = c.cost.calibration().gradOverlapEfficiency;
      const double fl = worstFwd / L, bl = backward / L;
      const double fwdExposed =
          ag1 + (L - 1) * CostModel::exposed(ag1, fl, eff);
      const double bwdShared = L * CostModel::exposed(ag1 + rs1, bl, eff);
      // The shared backward exposure is charged to each in proportion.
      const double agShare = ag1 + rs1 > 0 ? ag1 / (ag1 + rs1) : 0;
      const double eAg = m * (fwdExposed + agShare * bwdShared);
      const double eRs = m * ((1 - agShare) * bwdShared + rs1);
      T.dpComm += eAg + eRs;
      zero3Calls = 3 * L * m;
      record(std::string(grp) + " gradient reduce-scatter (per layer)",
             Collective::ReduceScatter, dp, stride, perLayerGrads, L * m, eRs);
      record(std::string(grp) +
                 " zero-3 parameter all-gather (per layer, fwd+bwd)",
             Collective::AllGather, dp, stride, perLayerParams, 2 * L * m, eAg);
    } else {
      // ZeRO 2 keeps no whole gradient: each micro-batch's is
      // reduce-scattered as its backward pass makes it (as DeepSpeed's
      // stage 2 does under gradient accumulation, and dlopt applies it).
      double rsCalls = cfg.zeroStage >= 2 ? m : 1;
      double rs = c.comm(Collective::ReduceScatter, gradBytes, dp, stride);
      double e = rsCalls * c.cost.exposedGradSync(rs, backward);
      T.dpComm += e;
      record(std::string(grp) + " gradient reduce-scatter",
             Collective::ReduceScatter, dp, stride, gradBytes, rsCalls, e);
      // Updated parameters, gathered before the next forward.
      double ag = c.comm(Collective::AllGather, paramBytes, dp, stride);
      T.dpComm += ag;
      record(std::string(grp) + " parameter all-gather (after update)",
             Collective::AllGather, dp, stride, paramBytes, 1, ag);
    }
  }

  // Tied embeddings with pp > 1: the first stage's word embedding and the
  // last stage's output matrix are one parameter, whose gradients are
  // summed between the two stages after the pipeline flush (Megatron-LM's
  // embedding group), before the optimizer step: not overlapped.
  if (train && cfg.pp > 1 && c.spec.tiedEmbeddings) {
    double bytes = double(c.spec.vocab) * c.spec.hidden / cfg.tp *
                   cfg.precision.gradReduceBytes;
    int stride = (cfg.pp - 1) * cfg.tp * cp * cfg.dp;
    double t = c.comm(Collective::AllReduce, bytes, 2, stride);
    T.dpComm += t;
    record("embedding gradient all-reduce (first+last stage)",
           Collective::AllReduce, 2, stride, bytes, 1, t);
  }

  // The optimizer step after the gradient sync, on the stage that holds
  // the most optimizer state (the stages step in parallel).
  if (train)
    for (size_t st = 0; st < stageMems.size(); ++st)
      T.optimizer = std::max(T.optimizer,
                             optimizerStepTime(c, cfg, stageMems[st],
                                               pl ? pl->kind[st] : -1));

  // Host dispatch: kernels of the worst stage per micro-batch (forward,
  // about twice as many backward, a recomputed forward) plus its
  // collectives, against the devices' step time.
  double kernelsPerMb =
      worstOps * (train ? 1 + c.cost.calibration().backwardFlopsRatio : 1) +
      (cfg.recompute == RecomputePolicy::Full && train ? worstOps : 0) +
      (cfg.tp > 1 ? tpCallsPerLayer(cfg, train).total() * worstLayers : 0) +
      (cp > 1 ? (cp - 1) * worstLayers * (train ? 3 : 1) : 0) +
      (cfg.pp > 1 ? (train ? 2 : 1) : 0);
  chooseLayout(c, cand, kernelsPerMb * m + zero3Calls, T.total());
}

/// The simulator's view of a priced candidate: per stage, one micro-batch's
/// forward and backward per model chunk (tensor- and context-parallel
/// communication included, as in the analytical model), memory, gradient
/// sync and a memory-bound optimizer step.
SimInput simInputFor(Ctx &c, const Candidate &cand) {
  const TrainingConfig &cfg = cand.cfg;
  const Calibration &cal = c.cost.calibration();
  const int cp = cfg.cp;
  const bool sp = cfg.sequenceParallel && cfg.tp > 1;
  const StagePlacement *pl =
      c.hetero ? &c.placement(cfg.tp * cp * cfg.dp, cfg.pp) : nullptr;
  const StageRanges ranges = stageRanges(c.spec, cfg);
  const double v = cfg.schedule == PipelineSchedule::Interleaved1F1B
                       ? cfg.virtualStages
                       : 1;
  const double actBytes = cfg.precision.activationBytes;
  const double boundary = double(cfg.microBatchSize) * c.spec.seqLen / cp *
                          c.spec.hidden * actBytes;
  const double tpLayer = c.tpCommPerLayer(cfg, boundary, true);
  // The forward pass's share of the layer's collectives (2 or 4 of them).
  const TpCalls tpCalls = tpCallsPerLayer(cfg, true);
  const double fwdShare =
      tpCalls.total() > 0 ? (cfg.sequenceParallel ? 4 : 2) / tpCalls.total() : 0;
  SimInput in;
  in.schedule = cfg.schedule;
  in.virtualStages = int(v);
  in.microBatches = cfg.numMicroBatches;
  in.gradOverlap = cal.gradOverlapEfficiency;
  if (cfg.pp > 1)
    in.p2p = c.comm(Collective::SendRecv, boundary, 2, cfg.tp * cp * cfg.dp);
  const double tAct = activationBytesPerLayer(c.spec, cfg);
  for (int st = 0; st < cfg.pp; ++st) {
    const int kind = pl ? pl->kind[st] : -1;
    const LayerTimes &lt = c.times(cfg.microBatchSize, cfg.tp, cp, sp, kind);
    double f = ranges.sum(lt.prefix, st);
    if (st == 0)
      f += lt.pre;
    if (st == cfg.pp - 1)
      f += lt.post;
    double layers = double(ranges.layers(st));
    double t = c.cost.trainingTime(f, cfg.recompute, kSelectiveRerun);
    // Communication on the critical path of every pass, split between the
    // forward and the rest (backward, recomputed forward) by their calls.
    double comm = tpLayer * layers;
    SimStage s;
    s.forward = (f + comm * fwdShare) / v;
    s.backward = (t - f + comm * (1 - fwdShare)) / v;
    s.weightGrad = std::min(s.backward, f * cal.backwardFlopsRatio / 2 / v);
    auto mem = transformerStageMemory(c.spec, cfg, st, cal);
    if (mem) {
      s.staticBytes = mem->params + mem->grads + mem->optimizer +
                      mem->commBuffers + mem->workspace;
      s.transientBytes = mem->transient;
    }
    s.activationBytes = tAct * layers / v;
    // Gradient sync of this stage's parameters over dp*cp.
    int replicas = cfg.dp * cp;
    if (replicas > 1 && mem) {
      double pBytes = cfg.precision.paramBytes;
      double params =
          mem->params / pBytes * (cfg.zeroStage == 3 ? replicas : 1);
      double grads = params * cfg.precision.gradReduceBytes;
      s.gradSync =
          cfg.zeroStage == 0
              ? c.comm(Collective::AllReduce, grads, replicas, cfg.tp)
              : c.comm(Collective::ReduceScatter, grads, replicas, cfg.tp) +
                    (cfg.zeroStage < 3
                         ? c.comm(Collective::AllGather, params * pBytes,
                                  replicas, cfg.tp)
                         : 0);
    }
    if (mem)
      s.optimizer = optimizerStepTime(c, cfg, *mem, kind);
    in.stages.push_back(s);
  }
  return in;
}

bool better(const Candidate &a, const Candidate &b) {
  double ta = a.time.total(), tb = b.time.total();
  if (ta != tb)
    return ta < tb;
  // Equal time: the plan with more memory headroom.
  double ma = a.memory.total(), mb = b.memory.total();
  if (ma != mb)
    return ma < mb;
  auto k = [](const Candidate &c) {
    return std::make_tuple(c.cfg.tp, c.cfg.pp, c.cfg.cp, c.cfg.dp,
                           c.cfg.sequenceParallel, c.cfg.microBatchSize,
                           int(c.cfg.schedule), c.cfg.virtualStages,
                           c.cfg.zeroStage, int(c.cfg.recompute));
  };
  return k(a) < k(b);
}

/// Why a fixed choice cannot work, or "" if no divisibility constraint fails.
std::string explainFix(const FixSpec &f, const TransformerSpec &spec,
                       int64_t kvHeads, int devices, int64_t gb) {
  auto str = [](int64_t v) { return std::to_string(v); };
  std::vector<std::string> why;
  std::optional<int64_t> prodOr = f.degreeProduct();
  int64_t prod = prodOr.value_or(0);
  if (!prodOr)
    why.push_back("the fixed degrees multiply to more than 2^63, more than "
                  "the " + str(devices) + " devices");
  else if (f.dp && f.tp && f.pp && prod != devices)
    why.push_back("dp*tp*pp*cp = " + str(*f.dp) + "*" + str(*f.tp) + "*" +
                  str(*f.pp) + "*" + str(f.cp.value_or(1)) + " = " +
                  str(prod) + " but the cluster has " + str(devices) +
                  " devices");
  else if (devices % prod != 0)
    why.push_back("the fixed degrees multiply to " + str(prod) +
                  ", which does not divide the " + str(devices) + " devices");
  if (f.tp && spec.heads % *f.tp)
    why.push_back("tp=" + str(*f.tp) + " does not divide the " +
                  str(spec.heads) + " attention heads (remainder " +
                  str(spec.heads % *f.tp) + ")");
  if (f.tp && kvHeads > 0 && kvHeads != spec.heads && kvHeads % *f.tp)
    why.push_back("tp=" + str(*f.tp) + " does not divide the " +
                  str(kvHeads) + " key/value heads (grouped-query attention "
                  "splits them over tp; replicating them is not supported)");
  if (f.tp && spec.tpWidth() % *f.tp)
    why.push_back("tp=" + str(*f.tp) + " does not divide the ffn width " +
                  str(spec.tpWidth()));
  if (f.cp && *f.cp > 1 && spec.seqLen % (2 * int64_t(*f.cp)))
    why.push_back("cp=" + str(*f.cp) + ": 2*cp = " + str(2 * *f.cp) +
                  " (two load-balanced chunks per rank) does not divide the "
                  "sequence length " + str(spec.seqLen));
  if (f.sp && *f.sp && f.tp && *f.tp == 1)
    why.push_back("sp=1 (sequence parallelism) needs tp > 1");
  if (f.sp && *f.sp && f.tp &&
      (spec.seqLen / f.cp.value_or(1)) % *f.tp)
    why.push_back("sp=1: tp=" + str(*f.tp) + " does not divide the " +
                  str(spec.seqLen / f.cp.value_or(1)) + " tokens per rank");
  if (f.pp && *f.pp > spec.numLayers)
    why.push_back("pp=" + str(*f.pp) + " exceeds the " +
                  str(spec.numLayers) + " layers");
  if (prodOr && !f.dp && f.tp && f.pp && devices % prod == 0 &&
      gb % (devices / prod))
    why.push_back("tp*pp*cp = " + str(prod) + " leaves dp = " +
                  str(devices / prod) + ", which does not divide the global "
                  "batch " + str(gb) + " (set --global-batch)");
  std::optional<int64_t> batchProdOr = f.batchProduct();
  int64_t batchProd = batchProdOr.value_or(0);
  if (!batchProdOr)
    why.push_back("the fixed dp/mbs/mb multiply to more than 2^63, more than "
                  "the global batch " + str(gb));
  else if (f.dp && f.mbs && f.numMicroBatches && batchProd != gb)
    why.push_back("dp*mbs*mb = " + str(batchProd) +
                  " but the global batch is " + str(gb));
  else if (gb % batchProd)
    why.push_back("the fixed dp/mbs/mb multiply to " + str(batchProd) +
                  ", which does not divide the global batch " + str(gb) +
                  " (remainder " + str(gb % batchProd) + ")");
  if (f.schedule == PipelineSchedule::Interleaved1F1B) {
    int v = f.v.value_or(2);
    if (f.pp && *f.pp == 1)
      why.push_back("schedule=interleaved needs pp > 1");
    else if (f.pp && spec.numLayers < int64_t(*f.pp) * v)
      why.push_back("schedule=interleaved: pp*v = " + str(*f.pp * v) +
                    " model chunks exceed the " + str(spec.numLayers) +
                    " layers");
    else if (!f.pp && spec.numLayers < 2 * int64_t(v))
      why.push_back("schedule=interleaved: v=" + str(v) +
                    " model chunks per stage on at least 2 stages exceed "
                    "the " + str(spec.numLayers) + " layers");
    if (f.pp && *f.pp > 1 && f.numMicroBatches && *f.numMicroBatches % *f.pp)
      why.push_back("schedule=interleaved: mb=" + str(*f.numMicroBatches) +
                    " is not a multiple of pp=" + str(*f.pp));
  }
  return joinReasons(why);
}

} // namespace

Status validateSearchOptions(const SearchOptions &opt) {
  if (opt.globalBatch < 0 || opt.globalBatch > kMaxGlobalBatch)
    return Status::error("the global batch must be between 1 and " +
                         std::to_string(kMaxGlobalBatch) + " (2^30), got " +
                         std::to_string(opt.globalBatch));
  if (!opt.training && opt.fix.zero && *opt.fix.zero > 0)
    return Status::error("--fix zero=" + std::to_string(*opt.fix.zero) +
                         " needs a training step (--train): ZeRO shards "
                         "optimizer state, gradients and parameters, which a "
                         "forward pass does not have");
  if (!opt.training && opt.fix.recompute &&
      *opt.fix.recompute != RecomputePolicy::None)
    return Status::error("--fix recompute needs a training step (--train): "
                         "a forward pass keeps no activations to recompute");
  return Status::ok();
}

namespace {

/// How tensor parallelism treats each op, as TransformerSharding lowers
/// the graph at tp = 2 without sequence parallelism: the split of each
/// matmul (column-parallel splits N, row-parallel K, the LM head the
/// vocabulary) and the other ops whose result stays replicated over tp
/// (norms, residual adds, dropouts: the work every tp rank repeats unless
/// sequence parallelism splits it). Unknown when tp = 2 does not apply
/// (then tp never exceeds 1).
struct TpRoles {
  std::map<int64_t, GroupGemm::Split> splits;
  std::set<int64_t> replicated;
  bool known = false;
};

TpRoles tpRolesOf(const GraphSummary &graph, const TransformerSpec &spec) {
  TpRoles out;
  if (spec.heads % 2 || spec.tpWidth() % 2 || spec.kv() % 2)
    return out;
  TrainingConfig cfg;
  cfg.tp = 2;
  std::vector<int64_t> marks;
  for (const OpGroupSummary &g : graph.groups)
    if (g.layer >= 0)
      marks.push_back(g.layer);
  Plan plan;
  lowerTransformerSharding(graph, cfg, {marks}, plan);
  out.known = !plan.ops.empty();
  for (const PlannedOp &o : plan.ops) {
    if (o.op == "dlopt.matmul") {
      if (o.strategy == "column")
        out.splits[o.id] = GroupGemm::Split::N;
      else if (o.strategy == "row")
        out.splits[o.id] = GroupGemm::Split::K;
      else if (o.strategy == "vocab-parallel")
        out.splits[o.id] = GroupGemm::Split::Vocab;
    } else if (o.op != "dlopt.attention" && !o.results.empty() &&
               !o.results[0].uses("tp")) {
      out.replicated.insert(o.id);
    }
  }
  return out;
}

/// The matmuls of `n` per sample: [.., m, k] x [k, n] with a weight shared
/// by every row (one GEMM over all rows), or batched on both sides.
std::optional<GroupGemm> groupGemmOf(const OpNode &n, double modelBatch) {
  if (n.operandShapes.size() < 2 || n.shape.size() < 2)
    return std::nullopt;
  const auto &a = n.operandShapes[0], &b = n.operandShapes[1];
  if (a.size() < 2 || b.size() < 2)
    return std::nullopt;
  auto lead = [](const std::vector<int64_t> &v) {
    double p = 1;
    for (size_t i = 0; i + 2 < v.size(); ++i)
      p *= double(v[i]);
    return p;
  };
  GroupGemm g;
  const double m = double(n.shape[n.shape.size() - 2]);
  g.perSample.n = double(n.shape.back());
  g.perSample.k = double(n.transposeA ? a[a.size() - 2] : a.back());
  g.broadcast = lead(b) == 1;
  if (g.broadcast) {
    g.perSample.m = m * lead(a) / modelBatch;
    g.perSample.batch = 1;
  } else {
    g.perSample.m = m;
    g.perSample.batch = lead(n.shape) / modelBatch;
  }
  return g;
}

} // namespace

Expected<PlanResult> searchPlan(const GraphSummary &graph,
                                const Cluster &cluster, const CostModel &cost,
                                const SearchOptions &opt) {
  auto start = std::chrono::steady_clock::now();
  DLOPT_RETURN_IF_ERROR(cluster.validate());
  DLOPT_RETURN_IF_ERROR(validateSearchOptions(opt));
  auto specOr = transformerSpecOf(graph);
  if (!specOr)
    return specOr.status();

  Ctx c{graph, cluster, cost, opt};
  c.spec = *specOr;
  c.capacity = cluster.minDeviceMemory();
  // The slowest GPU kind sets the pace of a uniform plan.
  auto gpu = pacingGpu(cluster, opt.precision);
  if (!gpu)
    return gpu.status();
  c.gpu = *gpu;
  // Distinct GPU kinds (by name and memory) and where each group starts.
  {
    int first = 0;
    for (const NodeGroup &g : cluster.groups) {
      int kind = -1;
      for (size_t k = 0; k < c.kinds.size(); ++k)
        if (c.kinds[k].name == g.gpu.name &&
            c.kinds[k].memoryBytes == g.gpu.memoryBytes)
          kind = int(k);
      if (kind < 0) {
        kind = int(c.kinds.size());
        c.kinds.push_back(g.gpu);
      }
      c.groupKind.push_back(kind);
      c.groupFirstRank.push_back(first);
      first += g.count * g.gpusPerNode;
    }
    c.hetero = c.kinds.size() > 1;
  }
  c.modelBatch = graph.batch > 0 ? double(graph.batch) : 1.0;
  // Per-sample costs: the graph's counts divided by its batch.
  auto perSample = [&](const OpGroupSummary &g) {
    GroupCost gc;
    double k = 1.0 / c.modelBatch;
    gc.mmFlops = g.matmulFlops * k;
    gc.mmBytes = g.matmulBytes * k;
    gc.attFlops = g.attentionFlops * k;
    gc.attBytes = g.attentionBytes * k;
    gc.otFlops = g.otherFlops * k;
    gc.otBytes = g.otherBytes * k;
    // Bytes of the model dtype -> bytes of the activation precision.
    double scale = opt.bytes.activationBytes / std::max(1, graph.dtypeBytes);
    gc.mmBytes *= scale;
    gc.attBytes *= scale;
    gc.otBytes *= scale;
    gc.ops = double(g.numOps);
    if (g.layer >= 0) {
      double sh = double(graph.seq) * double(c.spec.hidden);
      gc.repBytes =
          std::min(gc.otBytes, kReplicatedPasses * sh * opt.bytes.activationBytes);
      gc.repFlops = std::min(gc.otFlops, kReplicatedFlopsPerElement * sh);
    }
    return gc;
  };
  c.kvFraction = graph.heads > 0 && graph.kvHeads > 0
                     ? double(graph.kvHeads) / double(graph.heads)
                     : 1.0;
  c.gpusPerNode = cluster.groups.empty() ? 1 : cluster.groups.front().gpusPerNode;
  // The most constrained host: fewest cores and least memory per GPU.
  for (size_t i = 0; i < cluster.groups.size(); ++i) {
    const HostSpec &h = cluster.groups[i].host;
    if (i == 0) {
      c.host = h;
      continue;
    }
    if (h.cpuCores > 0 && (c.host.cpuCores == 0 || h.cpuCores < c.host.cpuCores))
      c.host.cpuCores = h.cpuCores;
    if (h.memoryBytes > 0 &&
        (c.host.memoryBytes == 0 || h.memoryBytes < c.host.memoryBytes))
      c.host.memoryBytes = h.memoryBytes;
  }
  std::map<int64_t, size_t> layerIndex; // mark -> index in c.layers
  for (const OpGroupSummary &g : graph.groups) {
    if (g.layer >= 0) {
      layerIndex[g.layer] = c.layers.size();
      c.layers.push_back(perSample(g));
    } else if (g.name == "pre")
      c.pre = perSample(g);
    else
      c.post = perSample(g);
  }
  // Each matmul of the op list, priced by its own shape, and the work of
  // each layer that tensor parallelism replicates, counted op by op.
  {
    const TpRoles roles = tpRolesOf(graph, c.spec);
    const double toActivation =
        opt.bytes.activationBytes / std::max(1, graph.dtypeBytes);
    std::vector<double> repBytes(c.layers.size(), 0),
        repFlops(c.layers.size(), 0);
    bool seenLayer = false;
    for (const OpNode &n : graph.ops) {
      seenLayer |= n.layer >= 0;
      auto li = layerIndex.find(n.layer);
      if (n.kind != OpClass::Matmul) {
        if (li != layerIndex.end() && n.kind != OpClass::Constant &&
            roles.replicated.count(n.key())) {
          repBytes[li->second] += n.bytes / c.modelBatch * toActivation;
          repFlops[li->second] += n.flops / c.modelBatch;
        }
        continue;
      }
      auto gm = groupGemmOf(n, c.modelBatch);
      if (!gm)
        continue;
      auto it = roles.splits.find(n.key());
      if (it != roles.splits.end())
        gm->split = it->second;
      GroupCost &grp = li != layerIndex.end() ? c.layers[li->second]
                       : seenLayer             ? c.post
                                               : c.pre;
      grp.gemms.push_back(*gm);
    }
    if (roles.known)
      for (size_t i = 0; i < c.layers.size(); ++i) {
        GroupCost &g = c.layers[i];
        g.repBytes = std::min(g.otBytes, repBytes[i]);
        g.repFlops = std::min(g.otFlops, repFlops[i]);
      }
  }

  c.identicalLayers = true;
  for (const GroupCost &l : c.layers) {
    const GroupCost &f = c.layers.front();
    if (l.mmFlops != f.mmFlops || l.mmBytes != f.mmBytes ||
        l.attFlops != f.attFlops || l.attBytes != f.attBytes ||
        l.otFlops != f.otFlops || l.otBytes != f.otBytes ||
        l.repFlops != f.repFlops || l.repBytes != f.repBytes)
      c.identicalLayers = false;
  }

  const int devices = cluster.numDevices();
  const int64_t gb = opt.globalBatch > 0 ? opt.globalBatch : graph.batch;
  if (gb < 1)
    return Status::error("the global batch must be at least 1");
  const FixSpec &fix = opt.fix;
  const int gpusPerNode = cluster.groups.empty()
                              ? 1
                              : cluster.groups.front().gpusPerNode;
  const TransformerSpec &spec = c.spec;

  if (!fix.empty()) {
    std::string why = explainFix(fix, spec, graph.kvHeads, devices, gb);
    if (!why.empty())
      return Status::error("--fix " + fix.str() + " is impossible: " + why);
  }

  PlanResult res;
  SearchStats &st = res.stats;
  CandidateRanking<Candidate, Shape, decltype(&better)> ranking(opt.topK,
                                                                &better);
  auto prune = [&](const std::string &why, int64_t n = 1) {
    st.pruned[why] += n;
  };

  for (int64_t tp64 : divisorsOf(devices)) {
    int tp = int(tp64);
    if (fix.tp && *fix.tp != tp)
      continue;
    if (spec.heads % tp || spec.tpWidth() % tp) {
      prune("tp does not divide heads or ffn");
      continue;
    }
    if (graph.kvHeads > 0 && graph.kvHeads % tp) {
      prune("tp does not divide the key/value heads");
      continue;
    }
    if (tp > gpusPerNode && !fix.tp) {
      prune("tp spans nodes (kept within a node)");
      continue;
    }
   for (int64_t cp64 : divisorsOf(devices / tp)) {
    int cp = int(cp64);
    if (fix.cp ? *fix.cp != cp : cp > 1 && spec.seqLen < opt.contextParallelMinSeq) {
      if (!fix.cp)
        prune("cp > 1 (only searched for sequences of at least " +
              std::to_string(opt.contextParallelMinSeq) + " tokens)");
      continue;
    }
    if (cp > 1 && spec.seqLen % (2 * int64_t(cp))) {
      prune("2*cp does not divide the sequence");
      continue;
    }
    for (int64_t pp64 : divisorsOf(devices / tp / cp)) {
      int pp = int(pp64);
      if (fix.pp && *fix.pp != pp)
        continue;
      if (pp > spec.numLayers) {
        prune("pp exceeds the layers");
        continue;
      }
      int dp = devices / tp / pp / cp;
      for (const auto [mbs, m] :
           batchSplits(dp, gb, fix, opt.maxMicroBatch, st.pruned)) {
        // Schedules (only one when there is no pipeline).
        std::vector<std::pair<PipelineSchedule, int>> scheds;
        if (pp == 1 || !opt.training) {
          if (fix.schedule == PipelineSchedule::Interleaved1F1B) {
            prune(pp == 1 ? "interleaved: needs pp > 1"
                          : "interleaved: a forward-only plan has no "
                            "backward to interleave");
            continue;
          }
          scheds.push_back({fix.schedule.value_or(
                                opt.training ? PipelineSchedule::OneFOneB
                                             : PipelineSchedule::GPipe),
                            1});
        } else {
          scheds.push_back({PipelineSchedule::GPipe, 1});
          scheds.push_back({PipelineSchedule::OneFOneB, 1});
          // Interleaving: every v >= 2 that splits the stage's layers
          // into equal chunks (pp*v divides the layers); 2 and 4 with
          // uneven chunks when none does; a fixed v as given.
          std::vector<int> vs;
          if (fix.v) {
            if (*fix.v > 1)
              vs.push_back(*fix.v);
          } else {
            for (int64_t v = 2; v * pp <= spec.numLayers; ++v)
              if (spec.numLayers % (v * pp) == 0)
                vs.push_back(int(v));
            if (vs.empty())
              vs = {2, 4};
          }
          for (int v : vs) {
            if (spec.numLayers < int64_t(pp) * v || m % pp) {
              prune("interleaved: fewer layers than pp*v chunks, or mb % pp");
              continue;
            }
            scheds.push_back({PipelineSchedule::Interleaved1F1B, v});
          }
          scheds.push_back({PipelineSchedule::ZeroBubble, 1});
        }
        for (auto [sched, v] : scheds) {
          if (fix.schedule && *fix.schedule != sched)
            continue;
          for (int zero = 0; zero <= 3; ++zero) {
            if (fix.zero && *fix.zero != zero)
              continue;
            if (!fix.zero && zero > 0 && (dp == 1 || !opt.training))
              continue; // the same plan as zero=0
            for (RecomputePolicy rc :
                 {RecomputePolicy::None, RecomputePolicy::Selective,
                  RecomputePolicy::Full}) {
              if (fix.recompute && *fix.recompute != rc)
                continue;
              if (!fix.recompute && !opt.training &&
                  rc != RecomputePolicy::None)
                continue;
              if (!fix.recompute && rc == RecomputePolicy::Selective) {
                prune("recompute=selective: the same plan as none (fused "
                      "attention stores no scores to re-run)");
                continue;
              }
             for (bool sp : {false, true}) {
              if (fix.sp && *fix.sp != sp)
                continue;
              if (sp && (tp == 1 || (spec.seqLen / cp) % tp)) {
                if (tp > 1)
                  prune("sp: tp does not divide the tokens per rank");
                continue;
              }
              Candidate cand;
              TrainingConfig &cfg = cand.cfg;
              cfg.dp = dp;
              cfg.tp = tp;
              cfg.pp = pp;
              cfg.cp = cp;
              cfg.sequenceParallel = sp;
              cfg.zeroStage = zero;
              cfg.microBatchSize = mbs;
              cfg.numMicroBatches = m;
              cfg.schedule = sched;
              cfg.virtualStages = v;
              cfg.recompute = rc;
              cfg.optimizer = opt.optimizer;
              cfg.precision = opt.bytes;
              price(c, cand, nullptr);
              ranking.consider(Shape{dp, tp, pp, cp}, cand);
            }
             }
          }
        }
      }
    }
   }
  }

  st.enumerated = ranking.priced();
  st.feasible = ranking.feasible();
  st.outOfMemory = ranking.outOfMemory();
  auto fixNote = fix.empty() ? std::string() : " with --fix " + fix.str();
  if (st.enumerated == 0)
    return noCandidateError(fixNote, devices, gb, st.pruned);
  if (!ranking.best()) {
    const Candidate &lm = *ranking.leastMemory();
    return noFitError(fixNote, lm.memory.total(), lm.key(), lm.capacity);
  }
  const std::optional<Candidate> &best = ranking.best();

  res.best = *best;
  price(c, res.best, &res.comms);
  if (opt.training) {
    res.simInput = simInputFor(c, res.best);
    auto sim = simulateStep(res.simInput);
    if (sim)
      res.simulated = std::move(*sim);
    else
      res.simError = sim.status().message();
  } else {
    res.simError = "forward-only plans are not simulated";
  }

  // Alternatives: the best of every other (dp, tp, pp), including shapes
  // that would be faster but do not fit; then the runners-up of any shape.
  res.alternatives = ranking.alternatives<Alternative>(*best);

  // Stage assignment.
  const StageRanges bestRanges = stageRanges(spec, res.best.cfg);
  std::vector<int64_t> marks;
  for (const OpGroupSummary &g : graph.groups)
    if (g.layer >= 0)
      marks.push_back(g.layer);
  for (int s = 0; s < res.best.cfg.pp; ++s) {
    res.stageLayers.emplace_back();
    for (auto [a, b] : bestRanges.ranges[s])
      res.stageLayers.back().insert(res.stageLayers.back().end(),
                                    marks.begin() + a, marks.begin() + b);
  }

  res.plan = planFromConfig(PlanKind::Transformer, graph, cluster,
                            res.best.cfg, gb, opt.training, opt.precision,
                            res.best.process.layout);
  lowerTransformerSharding(graph, res.best.cfg, res.stageLayers, res.plan);

  res.spec = spec;
  res.totalParams = graph.totalParams;
  res.globalBatch = gb;
  res.seq = graph.seq;
  res.training = opt.training;
  res.precision = opt.precision;
  // MFU is against the cluster's aggregate peak: the mean over devices.
  {
    double sum = 0;
    for (const NodeGroup &g : cluster.groups)
      sum += g.gpu.peak(opt.precision) * g.count * g.gpusPerNode;
    res.peakFlops = sum / std::max(1, devices);
  }
  if (c.hetero) {
    const Candidate &b = res.best;
    const StagePlacement &pl =
        c.placement(b.cfg.tp * b.cfg.cp * b.cfg.dp, b.cfg.pp);
    for (int s = 0; s < b.cfg.pp; ++s) {
      res.stageGpus.push_back(c.kindSpec(pl.kind[s]).name);
      res.stageCapacity.push_back(pl.capacity[s]);
    }
  }
  res.modelFlopsPerStep =
      (opt.training ? 6.0 : 2.0) * graph.totalParams * double(gb) * graph.seq;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             start)
                   .count();
  return res;
}

} // namespace dlopt::planner
