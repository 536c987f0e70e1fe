//===- TransformerPricing.cpp - Pricing transformer candidates ------------===//
#include "planner/TransformerPricing.h"

#include "planner/ConfigSpace.h"
#include "planner/ReportUtil.h"
#include "planner/SearchUtil.h"
#include "planner/TransformerSharding.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <set>
#include <tuple>

namespace dlopt::planner {

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
  for (const OpNode &op : g.ops) {
    s.dropout |= op.op == "dlopt.dropout";
    s.rmsNorm |= op.op == "dlopt.rms_norm" && op.layer >= 0;
    s.rope |= op.op == "dlopt.rope" && op.layer >= 0;
  }
  DLOPT_RETURN_IF_ERROR(s.validate());
  return s;
}

namespace pricing {

std::optional<EagerKernels> eagerKernels(const OpNode &n, double e) {
  const bool norm = n.op == "dlopt.rms_norm", rope = n.op == "dlopt.rope";
  if ((!norm && !rope) || n.shape.empty())
    return std::nullopt;
  double elems = 1;
  for (int64_t d : n.shape)
    elems *= double(d);
  const double last = double(n.shape.back());
  const double rows = elems / std::max(1.0, last);
  const bool casts = e != 4; // .float() and .type_as() of fp32 are no-ops
  const double f = 4, cast = casts ? e + f : 0;
  EagerKernels k;
  if (norm) {
    k.bytes = elems * (cast + 2 * f + f + 2 * f + cast + 2 * e) + rows * 24 +
              last * e;
    k.kernels = 6 + (casts ? 2 : 0);
    k.backwardBytes =
        elems * (6 * e + cast + 6 * f + f + 7 * f + 3 * f + cast) + rows * 24 +
        last * (e + f);
    k.backwardKernels = 13 + (casts ? 2 : 0);
  } else {
    // The frequencies: [s, d/2] complex64, broadcast over batch and heads
    // (dims 0 and 1 of [b, heads, s, d]).
    const double freqs =
        n.shape.size() >= 2 ? n.shape[n.shape.size() - 2] * last * 4 : 0;
    k.bytes = k.backwardBytes = elems * (cast + 2 * f + cast) + freqs;
    k.kernels = k.backwardKernels = 1 + (casts ? 2 : 0);
  }
  return k;
}

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


} // namespace pricing

namespace {

using namespace pricing;

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

namespace pricing {

/// What a stage of `layers` layers holding `paramBytes` of parameters
/// exposes of ZeRO-3's per-layer gathers and reduce-scatters beside its
/// forward `fwd` and backward `bwd` (zero3Comm: forward plus backward).
double zero3StageExposure(Ctx &c, const TrainingConfig &cfg, double paramBytes,
                          double layers, double fwd, double bwd, ComputeMix mix,
                          int gpuKind);

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
  // Under ZeRO-3 a stage also exposes its layers' parameter gathers and
  // gradient reduce-scatters (zero3Comm), which grow with its layers as
  // its compute does but do not hide behind the pre and post groups'
  // compute in the same way: a split for compute alone can leave the
  // stages with the most layers the slowest by far. The parameters of a
  // stage of n layers are affine in n (stageMemory's).
  const int replicas = cfg.dp * std::max(1, cfg.cp);
  const bool zero3 = train && cfg.zeroStage == 3 && replicas > 1;
  std::vector<double> param1(pp, 0), paramSlope(pp, 0);
  if (zero3)
    for (int st = 0; st < pp; ++st) {
      auto m1 = stageMemory(c, cfg, st, 1), m2 = stageMemory(c, cfg, st, 2);
      if (m1 && m2) {
        param1[st] = m1->params * replicas;
        paramSlope[st] = (m2->params - m1->params) * replicas;
      }
    }
  auto stageTime = [&](int st, int64_t a, int64_t b) {
    const LayerTimes::Stage t =
        lt[st]->stage({{a, b}}, st == 0, st == pp - 1, c.cost, cfg.recompute);
    double x = (train ? t.train : t.fwd) + double(b - a) * tpLayer;
    if (zero3 && b > a)
      x += zero3StageExposure(
          c, cfg, param1[st] + double(b - a - 1) * paramSlope[st],
          double(b - a), t.fwd, t.train - t.fwd, t.mix(), pl.kind[st]);
    return x;
  };
  // The split for time alone depends on no memory setting (ZeRO 0-2,
  // schedule), so it is shared by many candidates; it is kept when every
  // stage fits. Under ZeRO-3 it depends on the replicas too.
  auto key = std::make_tuple(cfg.microBatchSize, cfg.tp, cfg.cp, sp,
                             int(cfg.recompute), pp, placementKey,
                             zero3 ? replicas : 0);
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

/// Tied embeddings with pp > 1: the all-reduce of the shared embedding's
/// gradient (the first stage's word embedding, the last stage's output
/// matrix; split over tp) between the two stages, after the pipeline flush
/// and before the optimizer step (Megatron-LM's embedding group).
struct TiedEmbeddingSync {
  double bytes = 0;
  int stride = 0; ///< ranks between the two stages' peers
  double seconds = 0;
};
TiedEmbeddingSync tiedEmbeddingSync(Ctx &c, const TrainingConfig &cfg) {
  TiedEmbeddingSync e;
  e.bytes = double(c.spec.vocab) * c.spec.hidden / cfg.tp *
            cfg.precision.gradReduceBytes;
  e.stride = (cfg.pp - 1) * cfg.tp * cfg.cp * cfg.dp;
  e.seconds = c.comm(Collective::AllReduce, e.bytes, 2, e.stride);
  return e;
}

/// The optimizer step on a device holding `mem`: memory-bound over its
/// optimizer shard, moving optimizerStepBytesPerParam per parameter (Adam
/// with fp32 gradients, master and moments and a bf16 weight: 30), 10
/// FLOPs per parameter.
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
  const double bytesPerParam = optimizerStepBytesPerParam(cfg.optimizer, pr);
  if (shard <= 0)
    return 0;
  auto e = c.cost.optimizerTime(10 * shard, bytesPerParam * shard,
                                c.precisionOf(OpKind::Elementwise),
                                c.kindSpec(gpuKind));
  return e ? e->time : 0;
}

/// Chooses the process layout: the host time each layout spends issuing a
/// step's launches (exposed only when it, plus `drain`, exceeds the
/// devices' step time, since the host runs ahead), under the node's host
/// memory. The host-bound step: the last stage's process issues the share
/// `issuedBeforeChain` of its launches (all of them but a zero-bubble
/// schedule's last weight gradient), then `drain` runs (the last
/// micro-batch's backward through the other stages and the sends between
/// them; 0 without a pipeline), but not before everything is issued; then
/// `tail` (the exposed gradient sync and the optimizer step). Ties go to
/// in-graph: one process per node needs no launcher on one node, keeps one
/// loader and one copy of the plan per node, and saves (G-1) processes of
/// host memory.
void chooseLayout(Ctx &c, Candidate &cand, double launchesPerStep,
                  double deviceTime, double drain, double issuedBeforeChain,
                  double tail, double firstTask, double firstStage) {
  const Calibration &cal = c.cost.calibration();
  const int G = c.gpusPerNode;
  const int nodes = c.cluster.numNodes();
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
    o.dispatch = hostDispatchSeconds(launchesPerStep, l, G, c.host, cal);
    o.memory = o.procs * cal.processHostBytes + G * cal.deviceHostStagingBytes;
    o.fits = c.host.memoryBytes <= 0 || o.memory <= c.host.memoryBytes;
    const double issued =
        std::max(o.dispatch, o.dispatch * issuedBeforeChain + drain);
    // The step's first task (the first stage's first forward) ends no
    // earlier than its process has issued it, its share of the stage's
    // launches: everything after it waits that much.
    const double lead =
        firstStage > 0 ? firstTask * (o.dispatch / firstStage - 1) : 0.0;
    o.exposed = std::max({0.0, issued + tail - deviceTime, lead});
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

/// Context parallelism as dlopt-partition applies it, the all-gather form
/// (docs/parallel.md): per layer every rank gathers the keys and values of
/// the whole sequence before attention (again for a recomputed forward,
/// and under selective recomputation, which keeps only the shards)
/// and, backward, reduce-scatters their gradients back onto the sequence;
/// the loss gathers the logits over cp (flattening [b, s] with s split has
/// no block layout). None of it overlaps with compute. One micro-batch's
/// calls and their times, for the analytical step and the simulator alike.
struct CpComm {
  double kvBytes = 0, logitBytes = 0;
  double gather = 0, scatter = 0, logits = 0; ///< one call each
  double gathers = 0, scatters = 0;           ///< calls per layer
  /// The forward pass's share over `layers` layers (2 gathers a layer),
  /// with the logits' gather where the stage computes the loss.
  double forward(double layers, bool loss) const {
    return layers * 2 * gather + (loss ? logits : 0);
  }
  double total(double layers, bool loss) const {
    return layers * (gathers * gather + scatters * scatter) +
           (loss ? logits : 0);
  }
};

CpComm cpComm(Ctx &c, const TrainingConfig &cfg, bool train) {
  CpComm r;
  const int cp = cfg.cp;
  if (cp <= 1)
    return r;
  const double actBytes = cfg.precision.activationBytes;
  const double mbs = double(cfg.microBatchSize), seqLen = double(c.spec.seqLen);
  r.kvBytes = mbs * seqLen * c.spec.hidden * c.kvFraction / cfg.tp * actBytes;
  r.gather = c.comm(Collective::AllGather, r.kvBytes, cp, cfg.tp);
  r.scatter = c.comm(Collective::ReduceScatter, r.kvBytes, cp, cfg.tp);
  // Full and selective recomputation gather the keys and values again for
  // the backward pass.
  r.gathers =
      2 * (1 + (train && cfg.recompute != RecomputePolicy::None ? 1 : 0));
  r.scatters = train ? 2 : 0;
  if (c.spec.vocab > 0) {
    bool vocabParallel = cfg.tp > 1 && c.spec.vocab % cfg.tp == 0;
    r.logitBytes = mbs * seqLen * double(c.spec.vocab) /
                   (vocabParallel ? cfg.tp : 1) * actBytes;
    r.logits = c.comm(Collective::AllGather, r.logitBytes, cp, cfg.tp);
  }
  return r;
}

/// Vocabulary parallelism's collectives for one micro-batch on a stage
/// (the embedding table and the LM head split on the vocabulary when tp
/// divides it, planner/TransformerSharding.cpp, as dlopt-partition
/// applies it), by pass. On the first stage the lookup's partial sum is
/// all-reduced forward (reduce-scattered into the sequence-parallel region
/// under sp, whose backward gathers the embedding's output gradient for
/// the local scatter into the table's rows). On the last stage the head's
/// input gradient is all-reduced backward (under sp the head's input is
/// gathered forward and its gradient reduce-scattered), and cross-entropy
/// reduces three float32 [rows, 1] vectors forward (row max, sum of
/// exponentials, target logit) instead of gathering logits.
struct VocabComm {
  double fwd = 0, bwd = 0;
};
VocabComm vocabComm(Ctx &c, const TrainingConfig &cfg, double boundary,
                    bool first, bool last, bool train) {
  VocabComm v;
  if (cfg.tp <= 1 || c.spec.vocab <= 0 || c.spec.vocab % cfg.tp != 0)
    return v;
  const bool sp = cfg.sequenceParallel;
  if (!sp) {
    const double one = c.comm(Collective::AllReduce, boundary, cfg.tp, 1);
    if (first)
      v.fwd += one;
    if (last && train)
      v.bwd += one;
  } else {
    const double ag = c.comm(Collective::AllGather, boundary, cfg.tp, 1);
    const double rs = c.comm(Collective::ReduceScatter, boundary, cfg.tp, 1);
    if (first) {
      v.fwd += rs;
      if (train)
        v.bwd += ag;
    }
    if (last) {
      v.fwd += ag;
      if (train)
        v.bwd += rs;
    }
  }
  if (last) {
    const double rowStats =
        double(cfg.microBatchSize) * c.spec.seqLen / cfg.cp * 4;
    v.fwd += 3 * c.comm(Collective::AllReduce, rowStats, cfg.tp, 1);
  }
  return v;
}

/// Sequence parallelism leaves the gradients of the weights applied to
/// sequence-split rows partial over tp: one all-reduce each per step, on
/// the stage that holds them, after its last backward. They are the
/// norms' weights and biases and the learned positions, and the embedding
/// table and LM head when tp does not divide the vocabulary (dlopt keeps
/// them replicated then, so their gradients are whole tables; pad the
/// vocabulary to a multiple of tp to avoid it). The row-parallel biases
/// too are left out: a vector each.
struct SpWeightGradSync {
  double calls = 0, bytes = 0, seconds = 0;
};
SpWeightGradSync spWeightGradSync(Ctx &c, const TrainingConfig &cfg,
                                  int64_t layers, bool first, bool last) {
  SpWeightGradSync s;
  const double h = c.spec.hidden * cfg.precision.gradReduceBytes;
  s.calls = double(c.spec.normParamsPerLayer * layers +
                   (last ? c.spec.normParamsPost : 0));
  s.bytes = s.calls * h;
  if (first && c.spec.learnedPositions) {
    s.bytes += double(c.spec.seqLen) * h;
    s.calls += 1;
  }
  if (c.spec.vocab > 0 && c.spec.vocab % cfg.tp != 0) {
    // The embedding on the first stage, the head on the last: one table
    // on a single stage when they are tied.
    double tables = (first ? 1 : 0) + (last ? 1 : 0);
    if (first && last && c.spec.tiedEmbeddings)
      tables = 1;
    s.bytes += tables * double(c.spec.vocab) * h;
    s.calls += tables;
  }
  if (s.calls > 0)
    s.seconds =
        c.comm(Collective::AllReduce, s.bytes / s.calls, cfg.tp, 1) * s.calls;
  return s;
}

/// ZeRO-3 moves parameters layer by layer, one layer prefetched
/// (FSDP-style): the gather of layer i+1 runs during layer i's forward; in
/// the backward, the gather for the next layer and the reduce-scatter of
/// the layer just finished share the same links during one layer's
/// backward. Per micro-batch over `L` layers whose forward and backward
/// take `fwd` and `bwd`, the first gather has nothing to hide behind, each
/// later layer exposes what its compute cannot hide, and the last
/// reduce-scatter follows the last backward (docs/cost-model.md, "ZeRO-3").
struct Zero3Comm {
  double ag1 = 0, rs1 = 0; ///< one layer's gather and reduce-scatter
  /// Exposed in the forward pass: the exposure or, where larger, the
  /// compute the collectives slow beside them (Ctx::overlapSlowdown).
  double forward = 0;
  double shared = 0;       ///< exposed in the backward by both, sharing links
  double agShare = 0;      ///< the gathers' share of `shared`
  /// Exposed in the backward pass, the last reduce-scatter included.
  double backward() const { return shared + rs1; }
};

Zero3Comm zero3Comm(Ctx &c, double paramBytes, double gradBytes, double L,
                    double fwd, double bwd, int dp, int stride, ComputeMix mix,
                    int gpuKind) {
  Zero3Comm z;
  L = std::max(1.0, L);
  z.ag1 = c.comm(Collective::AllGather, paramBytes / L, dp, stride);
  z.rs1 = c.comm(Collective::ReduceScatter, gradBytes / L, dp, stride);
  const double eff = c.cost.calibration().gradOverlapEfficiency;
  // The part of each collective that runs beside the layers' compute slows
  // that compute (overlapSlowdown, at the collective's own link rate).
  const double share = (dp - 1.0) / dp;
  auto lost = [&](double t, double bytes, double window) {
    const double beside = std::min(t, eff * window);
    return t > 0
               ? beside * c.overlapSlowdown(mix, share * bytes / t, gpuKind, t)
               : 0.0;
  };
  const double agBytes = paramBytes / L, rsBytes = gradBytes / L;
  // A layer waits for the later of its slowed compute and its collective:
  // what shows is the larger of the exposure and the compute lost.
  const double exposedF = CostModel::exposed(z.ag1, fwd / L, eff),
               lostF = lost(z.ag1, agBytes, fwd / L);
  // Backward: the next layer's gather and this layer's reduce-scatter, one
  // after the other on the links, at their combined rate.
  const double exposedB = CostModel::exposed(z.ag1 + z.rs1, bwd / L, eff),
               lostB = lost(z.ag1 + z.rs1, agBytes + rsBytes, bwd / L);
  z.forward = z.ag1 + (L - 1) * std::max(exposedF, lostF);
  z.shared = L * std::max(exposedB, lostB);
  z.agShare = z.ag1 + z.rs1 > 0 ? z.ag1 / (z.ag1 + z.rs1) : 0;
  return z;
}

double zero3StageExposure(Ctx &c, const TrainingConfig &cfg, double paramBytes,
                          double layers, double fwd, double bwd, ComputeMix mix,
                          int gpuKind) {
  const Zero3Comm z = zero3Comm(
      c, paramBytes,
      paramBytes / cfg.precision.paramBytes * cfg.precision.gradReduceBytes,
      layers, fwd, bwd, cfg.dp * std::max(1, cfg.cp), cfg.tp, mix, gpuKind);
  return z.forward + z.backward();
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
  // Slowest with its layers' tensor-parallel collectives, which run on the
  // critical path (as the layer split and the simulator count them): the
  // stage with the LM head can have the most compute and still be faster
  // than a stage of many layers with their collectives. `sumTime` and
  // `worstTime` are those per-stage times, collectives included.
  double worstTrain = 0, worstFwd = 0, worstOps = 0, worstRerunOps = 0;
  ComputeMix worstMix;
  int worstKind = -1;
  double sumTime = 0, worstTime = 0;
  int64_t worstLayers = 0;
  // One micro-batch's path through a zero-bubble pipeline: with F_s, B_s
  // and W_s stage s's forward, input-gradient and weight-gradient time
  // (its tensor-parallel collectives split between forward and backward
  // by their calls, as the simulator's stages), sum_s F_s + sum_s B_s +
  // max_s(W_s - sum_{j<s} B_j), accumulated stage by stage.
  const double tpFwdShare = tpForwardShare(cfg);
  double pathFwd = 0, pathInputGrad = 0, pathLead = 0;
  // GPipe (and 1F1B with one micro-batch) prices each stage's gradient
  // sync behind its own last backward (below), ZeRO 0 and 1: each stage's
  // backward of one micro-batch, its collectives' share included, is kept
  // for that only.
  // Zero-bubble with one micro-batch the same, behind each stage's weight
  // gradient (its last task), the stages ending their input gradients
  // back to back from the last to the first.
  const bool zbSingle =
      cfg.schedule == PipelineSchedule::ZeroBubble && m == 1;
  // 1F1B and zero-bubble with more micro-batches do the same where their
  // schedule is run on the stages' times (pipelineMakespan, below), which
  // gives each stage's end: `stageLead` is how long before the step's
  // pipeline phase ends each stage ends its last task.
  const bool zb = cfg.schedule == PipelineSchedule::ZeroBubble;
  const bool perStageShape = train && cfg.pp > 1 && cfg.zeroStage < 2 &&
                             (cfg.schedule == PipelineSchedule::GPipe ||
                              cfg.schedule == PipelineSchedule::OneFOneB || zb);
  const bool perStageSyncClosed =
      perStageShape &&
      (cfg.schedule == PipelineSchedule::GPipe ||
       (cfg.schedule == PipelineSchedule::OneFOneB && m == 1) || zbSingle);
  std::vector<double> stageLead;
  // ZeRO 2 reduce-scatters each micro-batch's gradients after the task
  // that completes them, queued on one lane per stage: with the schedule's
  // run, from each stage's own task ends (`stageGradEnds`, before the
  // pipeline phase ends by `pipeSpan`).
  const bool zero2Queue = train && cfg.pp > 1 && cfg.zeroStage == 2 &&
                          (cfg.schedule == PipelineSchedule::GPipe ||
                           cfg.schedule == PipelineSchedule::OneFOneB || zb);
  std::vector<std::vector<double>> stageGradEnds;
  double pipeSpan = -1;
  // Interleaved, ZeRO 0 and 1: each stage syncs its chunks' shares behind
  // its own chunks' backwards too (stageSyncs).
  const bool interleavedStages =
      train && cfg.pp > 1 && cfg.zeroStage < 2 &&
      cfg.schedule == PipelineSchedule::Interleaved1F1B &&
      cfg.virtualStages > 1;
  // Each stage's forward pass, whole time and weight-gradient part per
  // micro-batch, collectives included (as the simulator's stages), for
  // the schedule run on them (pipelineMakespan) and the stages' syncs.
  std::vector<double> stageFwdPass, stageAll, stageWeightGrad;
  // Per stage: what its sync runs beside (its last backward, or under
  // zero-bubble its weight gradient), and the part of its last backward
  // that precedes the next stage up's (all of it; the input gradient under
  // zero-bubble).
  auto stageBackward = [&](int st) {
    return zb ? stageWeightGrad[st] : stageAll[st] - stageFwdPass[st];
  };
  auto stageChain = [&](int st) {
    return stageAll[st] - stageFwdPass[st] - (zb ? stageWeightGrad[st] : 0.0);
  };
  // ZeRO-3 gathers each stage's own layers' parameters behind that stage's
  // own compute, every micro-batch (zero3Comm). What its layers cannot
  // hide lengthens each of the stage's passes, as the simulator replays
  // it, so it is part of the stage's time with collectives: the slowest
  // stage, the pipeline's fill and drain and zero-bubble's path all see
  // it. `worstZero3` is the slowest stage's, per micro-batch.
  const int replicas = cfg.dp * cp;
  // The gradient syncs before the optimizer step that the step exposes
  // (data-parallel and tied-embedding); sequence parallelism's all-reduce
  // of weight gradients runs beside them.
  double preOptimizerSyncs = 0;
  const bool zero3Stages = train && cfg.zeroStage == 3 && replicas > 1 &&
                           stageMems.size() == size_t(cfg.pp);
  Zero3Comm worstZero3;
  double worstZero3Params = 0;
  VocabComm worstVocab;
  // The slowest stage's context-parallel collectives per micro-batch, and
  // its forward pass with its collectives.
  double worstCp = 0, worstFwdPass = 0;
  int worstStage = 0;
  // Each stage's share of matmuls and attention and its GPU kind, for the
  // contention of its gradient sync (stageSyncs).
  std::vector<ComputeMix> stageMix;
  std::vector<int> stageKind;
  const CpComm cpc = cp > 1 ? cpComm(c, cfg, train) : CpComm{};
  // The first stage's first forward (one chunk's) and its time per
  // micro-batch, for the host's lead (chooseLayout).
  double firstTask = 0, firstStage = 0;
  const double chunks =
      cfg.schedule == PipelineSchedule::Interleaved1F1B ? cfg.virtualStages : 1;
  for (int st = 0; st < cfg.pp; ++st) {
    const LayerTimes &lt = c.times(cfg.microBatchSize, cfg.tp, cp, sp,
                                   pl ? pl->kind[st] : -1);
    const LayerTimes::Stage sc = lt.stage(ranges.ranges[st], st == 0,
                                          st == cfg.pp - 1, c.cost,
                                          cfg.recompute);
    const double f = sc.fwd;
    double ops = ranges.sum(lt.opsPrefix, st);
    if (st == 0)
      ops += c.pre.ops;
    if (st == cfg.pp - 1)
      ops += c.post.ops;
    // Kernels the recomputed forward launches again.
    const double rerunOps = cfg.recompute == RecomputePolicy::Full ? ops
                            : cfg.recompute == RecomputePolicy::Elementwise
                                ? ranges.sum(lt.elementwiseOpsPrefix, st)
                            : cfg.recompute == RecomputePolicy::Alternate
                                ? ranges.sum(lt.alternateOpsPrefix, st)
                            : cfg.recompute == RecomputePolicy::Selective
                                ? ranges.sum(lt.selectiveOpsPrefix, st)
                                : 0.0;
    double t = train ? sc.train : f;
    // The stage's tensor-parallel collectives: its layers', and the
    // vocabulary-parallel embedding's or head's where it holds them.
    const VocabComm vc =
        vocabComm(c, cfg, boundary, st == 0, st == cfg.pp - 1, train);
    const double stageTp =
        double(ranges.layers(st)) * tpLayer + vc.fwd + vc.bwd;
    const double stageTpFwd =
        double(ranges.layers(st)) * tpLayer * (train ? tpFwdShare : 1.0) +
        vc.fwd;
    // Context parallelism's (cpComm), the loss's on the last stage.
    const double cpAll =
        cp > 1 ? cpc.total(double(ranges.layers(st)), st == cfg.pp - 1) : 0.0;
    const double cpFwd =
        cp > 1 ? cpc.forward(double(ranges.layers(st)), st == cfg.pp - 1)
               : 0.0;
    Zero3Comm z3;
    double z3Params = 0;
    if (zero3Stages) {
      const double pBytes = cfg.precision.paramBytes;
      z3Params = stageMems[st].params / pBytes * replicas;
      z3 = zero3Comm(c, z3Params * pBytes,
                     z3Params * cfg.precision.gradReduceBytes,
                     double(ranges.layers(st)), f, t - f, replicas, cfg.tp,
                     sc.mix(), pl ? pl->kind[st] : -1);
    }
    const double withComm =
        t + stageTp + cpAll + z3.forward + z3.backward();
    const double fwdPass = f + stageTpFwd + cpFwd + z3.forward;
    sumTime += withComm;
    stageFwdPass.push_back(fwdPass);
    stageAll.push_back(withComm);
    // At most the backward's compute (weightGradSeconds), so at most the
    // backward with its collectives, as the simulator requires.
    const double w =
        train ? weightGradSeconds(f, t - f,
                                  c.cost.calibration().backwardFlopsRatio)
              : 0.0;
    stageWeightGrad.push_back(w);
    stageMix.push_back(sc.mix());
    stageKind.push_back(pl ? pl->kind[st] : -1);
    if (st == 0) {
      firstTask = fwdPass / chunks;
      firstStage = withComm;
    }
    if (train) {
      const double fwd = fwdPass;
      pathFwd += fwd;
      pathLead = std::max(pathLead, w - pathInputGrad);
      pathInputGrad += withComm - fwd - w;
    }
    if (withComm > worstTime) {
      worstTime = withComm;
      worstTrain = t;
      worstFwd = f;
      worstOps = ops;
      worstRerunOps = rerunOps;
      worstMix = sc.mix();
      worstKind = pl ? pl->kind[st] : -1;
      worstLayers = ranges.layers(st);
      worstZero3 = z3;
      worstZero3Params = z3Params;
      worstVocab = vc;
      worstCp = cpAll;
      worstFwdPass = fwdPass;
      worstStage = st;
    }
  }
  const double zero3PerMb = worstZero3.forward + worstZero3.backward();
  // The slowest stage's weight-gradient part of its backward (what
  // zero-bubble defers): its bubble, the gradient sync's window and the
  // host's drain read it.
  const double worstWeightGrad =
      weightGradSeconds(worstFwd, worstTrain - worstFwd,
                        c.cost.calibration().backwardFlopsRatio);

  auto record = [&](const std::string &what, Collective coll, int size,
                    int stride, double bytes, double calls, double exposed) {
    if (!comms || size <= 1 || calls <= 0)
      return;
    LinkKind link = LinkKind::None;
    CommAlgorithm algo = CommAlgorithm::Ring;
    CommProtocol proto = CommProtocol::None;
    double time =
        calls * c.comm(coll, bytes, size, stride, &link, &algo, &proto);
    comms->push_back({what, coll, size, bytes, calls, link, time, exposed,
                      algorithmName(algo), protocolName(proto)});
  };
  // Tensor parallelism: 2 all-reduces per layer per pass (forward,
  // backward, recomputed forward), on the critical path. Under sequence
  // parallelism each becomes an all-gather plus a reduce-scatter of the
  // same activation (Korthikanti et al. 2022): the same ring volume.
  double tpPerMb = 0, tpPerStep = 0;
  size_t spRow = size_t(-1); // its line in `comms`, exposure set below
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
    // Vocabulary parallelism (vocabComm): the embedding's collectives on
    // the first stage, the head's and cross-entropy's on the last. The
    // slowest stage's are on the step's critical path; the others' are in
    // their stages' passes, so in the fill and drain. Listed for the whole
    // model, their exposure the slowest stage's share.
    if (c.spec.vocab > 0 && c.spec.vocab % cfg.tp == 0) {
      const VocabComm all = vocabComm(c, cfg, boundary, true, true, train);
      const double share =
          all.fwd + all.bwd > 0
              ? (worstVocab.fwd + worstVocab.bwd) / (all.fwd + all.bwd)
              : 0.0;
      double vcalls = (train ? 2 : 1) * m;
      if (!sp) {
        double one = c.comm(Collective::AllReduce, boundary, cfg.tp, 1);
        record("tp all-reduce (vocab-parallel embedding, LM head)",
               Collective::AllReduce, cfg.tp, 1, boundary, vcalls,
               share * (train ? 2 : 1) * one * m);
      } else {
        double ag = c.comm(Collective::AllGather, boundary, cfg.tp, 1);
        double rs = c.comm(Collective::ReduceScatter, boundary, cfg.tp, 1);
        record("tp all-gather (vocab-parallel LM head, embedding grad)",
               Collective::AllGather, cfg.tp, 1, boundary, vcalls,
               share * (train ? 2 : 1) * ag * m);
        record("tp reduce-scatter (vocab-parallel embedding, LM head grad)",
               Collective::ReduceScatter, cfg.tp, 1, boundary, vcalls,
               share * (train ? 2 : 1) * rs * m);
      }
      double rowStats = double(cfg.microBatchSize) * c.spec.seqLen / cp * 4;
      double ce = c.comm(Collective::AllReduce, rowStats, cfg.tp, 1);
      record("tp all-reduce (vocab-parallel cross-entropy)",
             Collective::AllReduce, cfg.tp, 1, rowStats, 3 * m,
             share * 3 * ce * m);
      tpPerMb += worstVocab.fwd + worstVocab.bwd;
    }
    // Sequence parallelism: each stage all-reduces its weight gradients
    // over sequence-split rows once per step, after its last backward
    // (spWeightGradSync); the step waits for the longest. Not part of any
    // pass, so not of the pipeline's fill and drain either.
    if (sp && train) {
      SpWeightGradSync worst;
      for (int st = 0; st < cfg.pp; ++st) {
        const SpWeightGradSync s = spWeightGradSync(
            c, cfg, ranges.layers(st), st == 0, st == cfg.pp - 1);
        if (s.seconds > worst.seconds)
          worst = s;
      }
      if (worst.calls > 0 && comms) {
        spRow = comms->size();
        record("tp all-reduce (sequence-parallel weight gradients)",
               Collective::AllReduce, cfg.tp, 1, worst.bytes / worst.calls,
               worst.calls, worst.seconds);
      }
      tpPerStep = worst.seconds;
    }
  }

  // Context parallelism (cpComm), every micro-batch on the worst stage.
  double cpPerMb = 0;
  if (cp > 1) {
    const CpComm &cc = cpc;
    const double L = double(worstLayers);
    cpPerMb = worstCp;
    record("cp K/V all-gather (attention)", Collective::AllGather, cp, cfg.tp,
           cc.kvBytes, cc.gathers * L * m, cc.gathers * L * cc.gather * m);
    record("cp K/V gradient reduce-scatter (attention)",
           Collective::ReduceScatter, cp, cfg.tp, cc.kvBytes,
           cc.scatters * L * m, cc.scatters * L * cc.scatter * m);
    // The loss's gather is on the last stage; exposed here only when that
    // is the slowest.
    if (cc.logits > 0)
      record("cp logits all-gather (loss)", Collective::AllGather, cp, cfg.tp,
             cc.logitBytes, m,
             worstStage == cfg.pp - 1 ? cc.logits * m : 0.0);
  }

  // Pipeline send/recv: activations forward, gradients backward, v times
  // per micro-batch when interleaved; overlapped with the micro-batch.
  const int ppStride = cfg.tp * cp * cfg.dp;
  double ppExposed = 0, oneSend = 0;
  if (cfg.pp > 1) {
    double v = cfg.schedule == PipelineSchedule::Interleaved1F1B
                   ? cfg.virtualStages
                   : 1;
    double perMb = (train ? 2 : 1) * v;
    double one = c.comm(Collective::SendRecv, ppSendBytes(cfg, boundary), 2,
                        ppStride);
    oneSend = one;
    // Sends overlap the micro-batches' compute and their tensor- and
    // context-parallel collectives (they run on a stream and link of their
    // own), but the fill and drain paths wait for every hop, and under 1F1B
    // each steady-state backward waits for the next stage's gradient
    // (pipelineSendTime, which matches the simulator's replay).
    ppExposed = m * c.cost.exposedP2P(perMb * one, worstTime) +
                pipelineSendTime(train ? cfg.schedule : PipelineSchedule::GPipe,
                                 train, cfg.pp, m, one,
                                 worstTime - sumTime / cfg.pp, int(v));
    record("pp send/recv (stage boundary)", Collective::SendRecv, 2, ppStride,
           ppSendBytes(cfg, boundary), perMb * m, ppExposed);
  }

  StepTime &T = cand.time;
  double perMb = worstTrain + tpPerMb + cpPerMb + zero3PerMb;
  T.compute = m * worstTrain;
  T.tpComm = m * tpPerMb; // + what tpPerStep's all-reduce exposes, below
  T.cpComm = m * cpPerMb;
  T.ppComm = ppExposed;
  if (cfg.pp > 1) {
    // Filling and draining the pipeline: a micro-batch passes once through
    // every stage but the slowest, which runs all m back to back, so the
    // bubble is the other stages' time per micro-batch, sum_s t_s - t_max:
    // (pp - 1) t for equal stages, less when one stage (the LM head's) is
    // slower than the rest. `stagesToFill` is that sum in units of t_max.
    const double stagesToFill =
        worstTime > 0 ? (sumTime - worstTime) / worstTime : cfg.pp - 1;
    double fill = stagesToFill * perMb;
    // The fill charges every other stage's time once, as if the slowest
    // stage waited for all of them. Under 1F1B it does when it is the
    // last; an earlier one runs its warm-up forwards while the first
    // micro-batch goes round the later stages, and waits for the last
    // one's round trip before its last backwards. Under GPipe the forwards
    // and the backwards each go at their slowest stage's pace, which need
    // not be the same stage; zero-bubble's deferred weight gradients fill
    // what they can. Training under these schedules runs them on the
    // stages' times (pipelineMakespan), which gives the bubble in the
    // slowest stage's units of perMb, each stage's end (stageLead) and its
    // gradient-completing tasks' ends (stageGradEnds, for ZeRO 2); the
    // closed forms below stand where it gives none. Forward only, the fill
    // is exact.
    double spanBubble = -1;
    if (train && cfg.schedule != PipelineSchedule::Interleaved1F1B) {
      std::vector<double> finish;
      pipeSpan =
          pipelineMakespan(cfg.schedule, stageFwdPass, stageAll,
                           zb ? stageWeightGrad : std::vector<double>{}, m,
                           &finish, zero2Queue ? &stageGradEnds : nullptr);
      if (pipeSpan >= 0 && perStageShape)
        for (double f : finish)
          stageLead.push_back(pipeSpan - f);
      if (pipeSpan >= 0 && worstTime > 0)
        spanBubble =
            std::max(0.0, pipeSpan - m * worstTime) * perMb / worstTime;
    }
    switch (train ? cfg.schedule : PipelineSchedule::GPipe) {
    case PipelineSchedule::GPipe:
    case PipelineSchedule::OneFOneB:
      T.bubble = spanBubble >= 0 ? spanBubble : fill;
      break;
    case PipelineSchedule::Interleaved1F1B:
      T.bubble = fill / cfg.virtualStages;
      break;
    case PipelineSchedule::ZeroBubble: {
      if (spanBubble >= 0) {
        T.bubble = spanBubble;
        break;
      }
      // ZB-H1 (Qi et al. 2023): deferred weight-gradient passes fill the
      // cooldown, leaving (pp-1) * (t_F + t_B - t_W) where t_B is the
      // input-gradient part (t_B + t_W = the backward), i.e. the 1F1B
      // bubble less 2 (pp-1) t_W; it cannot drop below (pp-1) max(t_F,
      // t_B) (the simulator shows the same floor). With fewer micro-batches
      // than stages only m - 1 deferred W's fill the cooldown: (pp-1)(t_F +
      // t_B) - min(pp-1, m-1) t_W (the simulator's replay, exactly, for
      // t_W <= min(t_F, t_B)).
      //
      // Stages differ (the LM head's, a shorter first or last stage): the
      // full cooldown above scales the slowest stage's composition by the
      // others' time, which is that of equal stages. With one micro-batch
      // the replay is a single path instead: every forward, then each
      // stage's input gradient back to stage 0, the step ending with the
      // weight gradient that finishes last, sum_s F_s + max_s(sum_{j>=s}
      // B_j + W_s), of which the slowest stage's own time is not bubble.
      // Between one micro-batch and pp, as the deferred W's fill more of
      // the cooldown, the bubble goes linearly from that to the full
      // cooldown's, as it does for equal stages (where the two ends are
      // (pp-1)(t_F + t_B) and (pp-1)(t_F + t_B - t_W)).
      const double weightGrad = worstWeightGrad;
      double inputGrad = std::max(0.0, perMb - worstFwdPass - weightGrad);
      const double full =
          stagesToFill * std::max(perMb - 2 * weightGrad,
                                  std::max(worstFwdPass, inputGrad));
      const double single = std::max(
          0.0, pathFwd + pathInputGrad + pathLead - worstTime);
      const double filled = std::min(1.0, (m - 1) / double(cfg.pp - 1));
      T.bubble = single + filled * (full - single);
      break;
    }
    }
  }

  // Data parallelism: gradient sync over the dp * cp ranks that hold the
  // same parameters (all-reduce, or reduce-scatter plus a parameter
  // all-gather under ZeRO), overlapped with the last micro-batch's
  // backward; ZeRO-3 gathers parameters for every forward and backward.
  double zero3Calls = 0;
  if (train && replicas > 1) {
    double pBytes = cfg.precision.paramBytes;
    double paramsOnDevice = cand.memory.params / pBytes *
                            (cfg.zeroStage == 3 ? replicas : 1);
    double gradBytes = paramsOnDevice * cfg.precision.gradReduceBytes;
    double paramBytes = paramsOnDevice * pBytes;
    // The slowest stage's backward pass with its collectives: what a
    // gradient sync runs beside (as the simulator's backward task).
    const double backward = std::max(0.0, worstTime - worstFwdPass);
    int dp = replicas, stride = cfg.tp;
    const char *grp = cp > 1 ? "dp*cp" : "dp";
    // Interleaved, each model chunk syncs its share of the gradients once
    // its last backward ends; the last micro-batch's backward takes a lap
    // through the pipeline between one chunk's and the next on the stage
    // that finishes last (chunkedGradSyncExposed, as the simulator).
    const int v = cfg.schedule == PipelineSchedule::Interleaved1F1B
                      ? cfg.virtualStages
                      : 1;
    const double lap =
        worstTime > 0
            ? sumTime * backward / worstTime / v + cfg.pp * oneSend
            : 0.0;
    // What a sync runs beside: the backward, or under zero-bubble its
    // deferred weight-gradient part, which comes last (as the simulator).
    const double window =
        cfg.schedule == PipelineSchedule::ZeroBubble ? worstWeightGrad
                                                     : backward;
    // What a sync takes from the backward it runs beside (contention for
    // SMs and memory bandwidth, CostModel::syncLoss), as for ZeRO-3's
    // collectives.
    auto syncLoss = [&](Collective coll, double t, double bytes, ComputeMix mix,
                        int kind) {
      return c.cost.syncLoss(coll, bytes, dp, t, mix, c.kindSpec(kind));
    };
    auto exposedSync = [&](Collective coll, double t) {
      return chunkedGradSyncExposed(
          t / v,
          c.cost.exposedGradSync(
              t / v, window / v, gradBytes / v,
              syncLoss(coll, t, gradBytes, worstMix, worstKind)),
          v, lap);
    };
    // Stages that differ: each stage syncs its own gradients behind its
    // own last task (the backward; zero-bubble's weight gradient) and
    // ends that task lead_s before the last stage to finish does, so the
    // step waits for max_s(exposed_s - lead_s), as the simulator replays
    // it: the first stage, with the embedding's gradients behind a short
    // backward, can be the one, not the slowest. ZeRO 0 and 1 (one sync
    // per step). lead_s comes from the schedule run on the stages' times
    // (stageLead, GPipe, 1F1B and zero-bubble). Where there is none (more
    // than kMaxMakespanTasks), GPipe, 1F1B with one micro-batch and
    // zero-bubble with one take the chain of last backwards, sum_{j<s}
    // B_j (the last backwards run back to back from the last stage to the
    // first, nothing else queued), and the others the slowest stage's
    // sync (their cooldown backwards queue behind each other, and the
    // lags are longer than the sums).
    // Stage st's own gradients synced in `parts` equal shares (its model
    // chunks when interleaved): one share's time and what of it shows
    // after the backward it runs beside.
    struct StageShare {
      double time, exposed;
    };
    auto stageShare = [&](Collective coll, int st, double parts) {
      const double bytes =
          stageMems[st].params / pBytes * cfg.precision.gradReduceBytes;
      const double t = c.comm(coll, bytes, dp, stride);
      return StageShare{
          t / parts,
          c.cost.exposedGradSync(
              t / parts, stageBackward(st) / parts, bytes / parts,
              syncLoss(coll, t, bytes, stageMix[st], stageKind[st]))};
    };
    auto stageSyncs = [&](Collective coll, double fallback) {
      if (interleavedStages && stageMems.size() == size_t(cfg.pp)) {
        // Each stage's chunks sync their shares of its own gradients
        // behind its own chunks' last backwards, a lap apart
        // (chunkedGradSyncExposed), and the stages end their last
        // (chunk 0) backwards one chunk's backward apart from the last
        // stage down to stage 0, which ends last: the first stage, with
        // the embedding's gradients behind a shorter backward, can be the
        // one, not the slowest.
        double worst = 0, chain = 0;
        for (int st = 0; st < cfg.pp; ++st) {
          const StageShare sh = stageShare(coll, st, v);
          worst = std::max(worst,
                           chunkedGradSyncExposed(sh.time, sh.exposed, v, lap) -
                               chain);
          chain += stageChain(st) / v;
        }
        return worst;
      }
      if (!(perStageSyncClosed || !stageLead.empty()) ||
          stageMems.size() != size_t(cfg.pp))
        return fallback;
      // Stage s ends its last task `lead` before the last stage to finish
      // does: from the schedule's run, or else the chain of last
      // backwards (input gradients) from it to stage 0, and under
      // zero-bubble the difference of their weight gradients (a stage
      // that ends after stage 0 taken as ending with it).
      double worst = 0, chain = 0;
      for (int st = 0; st < cfg.pp; ++st) {
        const double lead =
            !stageLead.empty()
                ? stageLead[st]
                : std::max(0.0, chain + (zbSingle ? stageBackward(0) -
                                                        stageBackward(st)
                                                  : 0.0));
        worst = std::max(worst, stageShare(coll, st, 1).exposed - lead);
        chain += stageChain(st);
      }
      return worst;
    };
    if (cfg.zeroStage == 0) {
      double t = c.comm(Collective::AllReduce, gradBytes, dp, stride);
      double e = stageSyncs(Collective::AllReduce,
                            exposedSync(Collective::AllReduce, t));
      T.dpComm += e;
      preOptimizerSyncs += e;
      record(std::string(grp) + " gradient all-reduce", Collective::AllReduce,
             dp, stride, gradBytes, 1, e);
    } else if (cfg.zeroStage == 3) {
      // Layer by layer (zero3Comm); every micro-batch gathers again. Each
      // stage's exposure is already in its passes (above), so this is the
      // slowest stage's, m times; the pipeline's fill and drain carry the
      // other stages'. The shared backward exposure is charged to the
      // gathers and reduce-scatters in proportion.
      double L = double(std::max<int64_t>(1, worstLayers));
      Zero3Comm z = worstZero3;
      double stageParamBytes = worstZero3Params * pBytes;
      if (!zero3Stages) {
        // No per-stage memory (a stage did not fit): the slowest stage's
        // layers with the largest stage's parameters, added to the step.
        z = zero3Comm(c, paramBytes, gradBytes, L, worstFwd,
                      worstTrain - worstFwd, dp, stride, worstMix, worstKind);
        stageParamBytes = paramBytes;
      }
      const double exposed = m * (z.forward + z.shared + z.rs1);
      const double parts = z.forward + z.shared + z.rs1;
      const double eAg =
          parts > 0 ? exposed * (z.forward + z.agShare * z.shared) / parts : 0;
      const double eRs = exposed - eAg;
      const double perLayerParams = stageParamBytes / L,
                   perLayerGrads = stageParamBytes / pBytes *
                                   cfg.precision.gradReduceBytes / L;
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
      // ZeRO 2: the micro-batches' reduce-scatters queue on their own
      // lane, each after its backward (per chunk when interleaved; the
      // backwards at least a backward apart), so only the last shows
      // unless they outlast the passes (as the simulator replays them).
      // Without interleaving the slowest stage's backwards end a backward
      // apart in GPipe's and in the cooldown of 1F1B and zero-bubble (its
      // last pp - 1), and one micro-batch's forward and backward apart in
      // their steady state (queuedGradSyncExposed).
      double e = 0;
      if (cfg.zeroStage < 2) {
        e = stageSyncs(Collective::ReduceScatter,
                       exposedSync(Collective::ReduceScatter, rs));
      } else if (pipeSpan >= 0 && stageGradEnds.size() == size_t(cfg.pp) &&
                 stageMems.size() == size_t(cfg.pp)) {
        // Each stage's own queue, from its own tasks' ends in the
        // schedule's run (the simulator's rule): the step waits for the
        // stage whose last reduce-scatter ends latest after the pipeline.
        for (int st = 0; st < cfg.pp; ++st) {
          const StageShare sh = stageShare(Collective::ReduceScatter, st, 1);
          double free = -std::numeric_limits<double>::infinity();
          for (double be : stageGradEnds[st])
            free = std::max(free + sh.time, be + sh.exposed);
          e = std::max(e, free - pipeSpan);
        }
      } else {
        const bool steady = cfg.schedule != PipelineSchedule::GPipe;
        const double rsExposed =
            c.cost.exposedGradSync(rs / v, window / v, gradBytes / v,
                                   syncLoss(Collective::ReduceScatter, rs,
                                            gradBytes, worstMix, worstKind));
        e = v > 1 ? chunkedGradSyncExposed(rs / v, rsExposed, int(m) * v,
                                           window / v)
                  : queuedGradSyncExposed(rs, rsExposed, int64_t(m), backward,
                                          steady ? cfg.pp - 1 - worstStage
                                                 : int64_t(m),
                                          steady ? perMb : backward);
      }
      T.dpComm += e;
      preOptimizerSyncs += e;
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
    const TiedEmbeddingSync e = tiedEmbeddingSync(c, cfg);
    T.dpComm += e.seconds;
    preOptimizerSyncs += e.seconds;
    record("embedding gradient all-reduce (first+last stage)",
           Collective::AllReduce, 2, e.stride, e.bytes, 1, e.seconds);
  }

  // Sequence parallelism's all-reduce of weight gradients runs on the
  // compute stream after each stage's last backward, beside the gradient
  // syncs on their own: what outlasts them shows (as the simulator).
  const double tpExposedPerStep = std::max(0.0, tpPerStep - preOptimizerSyncs);
  T.tpComm += tpExposedPerStep;
  if (comms && spRow < comms->size())
    (*comms)[spRow].exposed = tpExposedPerStep;

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
      (train ? worstRerunOps : 0) +
      (cfg.tp > 1 ? tpCallsPerLayer(cfg, train).total() * worstLayers : 0) +
      (cp > 1 ? (cp - 1) * worstLayers * (train ? 3 : 1) : 0) +
      (cfg.pp > 1 ? (train ? 2 : 1) : 0);
  // What still runs once the last task is issued. A host-bound pipeline:
  // the last stage's last backward (of its first chunk) ends when its
  // process has issued it, and the other stages' backwards of that
  // micro-batch, one chunk each, and the sends between them follow it
  // (under zero-bubble only the input-gradient parts are on that chain, and
  // the first stage's deferred weight gradient closes it); a micro-batch's
  // backward on the mean stage, with its share of the collectives the
  // passes cannot hide. Then the tail: the exposed gradient sync and the
  // optimizer step (ZeRO-3's exposure is inside the passes). The
  // simulator's host lane shows the same chain.
  double drain = 0, issuedBeforeChain = 1;
  const double tail = T.optimizer + tpExposedPerStep +
                      (cfg.zeroStage < 3 ? T.dpComm : 0.0);
  if (train && cfg.pp > 1 && worstTrain > 0) {
    const double v = cfg.schedule == PipelineSchedule::Interleaved1F1B
                         ? cfg.virtualStages
                         : 1;
    const double passComm = m * tpPerMb + T.cpComm +
                            (cfg.zeroStage == 3 ? T.dpComm : 0.0);
    const double perMb = worstTrain + passComm / m;
    const double mean = sumTime / cfg.pp / worstTime / v; // of the worst
    const double bwd = perMb * (worstTrain - worstFwd) / worstTrain * mean;
    const double wgt =
        cfg.schedule == PipelineSchedule::ZeroBubble
            ? worstWeightGrad * mean
            : 0.0;
    drain += (cfg.pp - 1) * (oneSend + bwd - wgt) + wgt;
    // Under zero-bubble the last stage's last task is a weight gradient,
    // issued after the backward that starts the chain.
    if (wgt > 0)
      issuedBeforeChain = 1 - wgt / mean / (m * worstTrain);
  }
  chooseLayout(c, cand, kernelsPerMb * m + zero3Calls, T.total(), drain,
               issuedBeforeChain, tail, firstTask, m * firstStage);
}

/// The simulator's view of a priced candidate: per stage, one micro-batch's
/// forward and backward per model chunk (tensor- and context-parallel
/// communication, and ZeRO-3's exposed per-layer collectives, included as
/// in the analytical model), memory, gradient sync, a memory-bound
/// optimizer step and the host time its process
/// spends issuing the step.
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
  const double fwdShare = tpForwardShare(cfg);
  SimInput in;
  in.schedule = cfg.schedule;
  in.virtualStages = int(v);
  in.microBatches = cfg.numMicroBatches;
  in.gradOverlap = cal.gradOverlapEfficiency;
  if (cfg.pp > 1)
    in.p2p = c.comm(Collective::SendRecv, ppSendBytes(cfg, boundary), 2,
                    cfg.tp * cp * cfg.dp);
  if (cfg.pp > 1 && c.spec.tiedEmbeddings)
    in.embeddingSync = tiedEmbeddingSync(c, cfg).seconds;
  const double tAct = activationBytesPerLayer(c.spec, cfg);
  const CpComm cc = cpComm(c, cfg, true);
  for (int st = 0; st < cfg.pp; ++st) {
    const int kind = pl ? pl->kind[st] : -1;
    const LayerTimes &lt = c.times(cfg.microBatchSize, cfg.tp, cp, sp, kind);
    const LayerTimes::Stage sc = lt.stage(ranges.ranges[st], st == 0,
                                          st == cfg.pp - 1, c.cost,
                                          cfg.recompute);
    const double f = sc.fwd, t = sc.train;
    double layers = double(ranges.layers(st));
    // Communication on the critical path of every pass, split between the
    // forward and the rest (backward, recomputed forward) by their calls.
    double comm = tpLayer * layers;
    // The vocabulary-parallel embedding's and head's (vocabComm).
    const VocabComm vc =
        vocabComm(c, cfg, boundary, st == 0, st == cfg.pp - 1, true);
    // Context parallelism's collectives (the loss's on the last stage),
    // which overlap nothing, as in the analytical step.
    const bool loss = st == cfg.pp - 1;
    const double cpFwd = cc.forward(layers, loss),
                 cpAll = cc.total(layers, loss);
    SimStage s;
    s.forward = (f + comm * fwdShare + vc.fwd + cpFwd) / v;
    s.backward =
        (t - f + comm * (1 - fwdShare) + vc.bwd + cpAll - cpFwd) / v;
    s.weightGrad =
        weightGradSeconds(f / v, s.backward, cal.backwardFlopsRatio);
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
      if (cfg.zeroStage == 3) {
        // Per layer and micro-batch, what the layers' compute cannot hide
        // (zero3Comm); no whole-stage sync at the end.
        const Zero3Comm z = zero3Comm(c, params * pBytes, grads, layers, f,
                                      t - f, replicas, cfg.tp, sc.mix(), kind);
        s.forward += z.forward / v;
        s.backward += z.backward() / v;
      } else {
        s.gradSync =
            cfg.zeroStage == 0
                ? c.comm(Collective::AllReduce, grads, replicas, cfg.tp)
                : c.comm(Collective::ReduceScatter, grads, replicas, cfg.tp);
        s.gradLastBucket = c.cost.lastBucketShare(grads / v);
        // What the sync takes from the task it runs beside.
        s.gradSyncLoss = c.cost.syncLoss(
            cfg.zeroStage == 0 ? Collective::AllReduce
                               : Collective::ReduceScatter,
            grads, replicas, s.gradSync, sc.mix(), c.kindSpec(kind));
        if (cfg.zeroStage > 0)
          s.paramGather =
              c.comm(Collective::AllGather, params * pBytes, replicas, cfg.tp);
        s.gradSyncPerMicroBatch = cfg.zeroStage == 2;
      }
    }
    if (sp)
      s.tpGradSync = spWeightGradSync(c, cfg, ranges.layers(st), st == 0,
                                      st == cfg.pp - 1)
                         .seconds;
    if (mem)
      s.optimizer = optimizerStepTime(c, cfg, *mem, kind);
    // The process issuing this stage's launches (chooseLayout).
    s.hostDispatch = cand.process.hostDispatch;
    in.stages.push_back(s);
  }
  return in;
}

bool better(const Candidate &a, const Candidate &b) {
  double ta = a.time.total(), tb = b.time.total();
  if (ta != tb)
    return ta < tb;
  // Equal time (recomputation hidden behind a host-bound step, say): the
  // plan that recomputes less, then the one with more memory headroom.
  if (a.cfg.recompute != b.cfg.recompute)
    return a.cfg.recompute < b.cfg.recompute;
  double ma = a.memory.total(), mb = b.memory.total();
  if (ma != mb)
    return ma < mb;
  auto k = [](const Candidate &c) {
    return std::make_tuple(c.cfg.tp, c.cfg.pp, c.cfg.cp, c.cfg.dp,
                           c.cfg.sequenceParallel, c.cfg.microBatchSize,
                           int(c.cfg.schedule), c.cfg.virtualStages,
                           c.cfg.zeroStage);
  };
  return k(a) < k(b);
}

/// Why a fixed choice cannot work, or "" if no divisibility constraint fails.
std::string explainFix(const FixSpec &f, const TransformerSpec &spec,
                       int64_t kvHeads, int devices, int64_t gb) {
  auto str = [](int64_t v) { return std::to_string(v); };
  SpaceRules rules;
  rules.devices = devices;
  rules.globalBatch = gb;
  rules.units = "layers";
  rules.numUnits = spec.numLayers;
  std::vector<std::string> why;
  if (std::string shape = explainShapeFix(rules, f); !shape.empty())
    why.push_back(shape);
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
  return joinReasons(why);
}

} // namespace pricing

} // namespace dlopt::planner
