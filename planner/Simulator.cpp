//===- Simulator.cpp - Discrete-event simulation of one pipelined step ----===//
#include "planner/Simulator.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <queue>

namespace dlopt::planner {

const char *laneName(SimLane l) {
  switch (l) {
  case SimLane::Compute:
    return "compute";
  case SimLane::P2P:
    return "p2p";
  case SimLane::DPComm:
    return "dp-comm";
  case SimLane::Host:
    return "host";
  }
  return "?";
}

const char *opName(SimOp o) {
  switch (o) {
  case SimOp::Forward:
    return "forward";
  case SimOp::Backward:
    return "backward";
  case SimOp::WeightGrad:
    return "weight-grad";
  case SimOp::Send:
    return "send";
  case SimOp::GradSync:
    return "grad-sync";
  case SimOp::ParamGather:
    return "param-gather";
  case SimOp::Optimizer:
    return "optimizer";
  case SimOp::Issue:
    return "issue";
  }
  return "?";
}

namespace {

/// (micro-batch, virtual stage) pairs above this are refused: the simulator
/// keeps a few doubles per pair.
constexpr int64_t kMaxPairs = int64_t(1) << 24;

enum class Kind : uint8_t { F, B, W };

/// One compute task in a stage's order.
struct Task {
  Kind kind;
  int chunk;
  int64_t mb;
};

Status checkValue(double v, const std::string &what) {
  if (!std::isfinite(v) || v < 0)
    return Status::error(what + ": expected a finite value >= 0, got " +
                         std::to_string(v));
  return Status::ok();
}

Status validate(const SimInput &in) {
  if (in.stages.empty())
    return Status::error("simulator: expected at least one pipeline stage");
  if (in.microBatches < 1)
    return Status::error("simulator: expected at least one micro-batch, got " +
                         std::to_string(in.microBatches));
  if (in.virtualStages < 1)
    return Status::error("simulator: expected virtualStages >= 1, got " +
                         std::to_string(in.virtualStages));
  int64_t pp = static_cast<int64_t>(in.stages.size());
  bool interleaved = in.schedule == PipelineSchedule::Interleaved1F1B;
  if (!interleaved && in.virtualStages != 1)
    return Status::error(std::string("simulator: virtualStages = ") +
                         std::to_string(in.virtualStages) +
                         " needs the interleaved schedule, got " +
                         scheduleName(in.schedule));
  if (interleaved && in.microBatches % pp != 0)
    return Status::error("simulator: interleaved 1F1B needs micro-batches (" +
                         std::to_string(in.microBatches) +
                         ") divisible by the pipeline stages (" +
                         std::to_string(pp) + ")");
  if (in.microBatches > kMaxPairs ||
      in.microBatches * pp * in.virtualStages > kMaxPairs)
    return Status::error(
        "simulator: " + std::to_string(in.microBatches) + " micro-batches x " +
        std::to_string(pp) + " stages x " + std::to_string(in.virtualStages) +
        " chunks is more than the 2^24 tasks the simulator accepts");
  DLOPT_RETURN_IF_ERROR(checkValue(in.p2p, "simulator: p2p"));
  DLOPT_RETURN_IF_ERROR(
      checkValue(in.embeddingSync, "simulator: embeddingSync"));
  if (!std::isfinite(in.gradOverlap) || in.gradOverlap < 0 ||
      in.gradOverlap > 1)
    return Status::error("simulator: gradOverlap: expected a value in [0, 1], "
                         "got " +
                         std::to_string(in.gradOverlap));
  for (size_t s = 0; s < in.stages.size(); ++s) {
    const SimStage &st = in.stages[s];
    std::string where = "simulator: stage " + std::to_string(s) + " ";
    const std::pair<const char *, double> fields[] = {
        {"forward", st.forward},
        {"backward", st.backward},
        {"weightGrad", st.weightGrad},
        {"staticBytes", st.staticBytes},
        {"activationBytes", st.activationBytes},
        {"transientBytes", st.transientBytes},
        {"gradSync", st.gradSync},
        {"gradLastBucket", st.gradLastBucket},
        {"paramGather", st.paramGather},
        {"tpGradSync", st.tpGradSync},
        {"optimizer", st.optimizer},
        {"hostDispatch", st.hostDispatch}};
    for (const auto &[name, value] : fields)
      DLOPT_RETURN_IF_ERROR(checkValue(value, where + name));
    if (st.gradLastBucket > 1)
      return Status::error(where + "gradLastBucket: expected a share in [0, "
                                   "1], got " +
                           std::to_string(st.gradLastBucket));
    if (!std::isfinite(st.gradSyncLoss) || st.gradSyncLoss < 0 ||
        st.gradSyncLoss >= 1)
      return Status::error(where + "gradSyncLoss: expected a share in [0, "
                                   "1), got " +
                           std::to_string(st.gradSyncLoss));
    if (st.weightGrad > st.backward)
      return Status::error(where + "weightGrad: expected at most backward (" +
                           std::to_string(st.backward) + "), got " +
                           std::to_string(st.weightGrad));
  }
  return Status::ok();
}

//===----------------------------------------------------------------------===//
// Orders
//===----------------------------------------------------------------------===//

/// GPipe: every forward, then every backward, both in micro-batch order.
std::vector<Task> gpipeOrder(int64_t m) {
  std::vector<Task> o;
  for (int64_t i = 0; i < m; ++i)
    o.push_back({Kind::F, 0, i});
  for (int64_t i = 0; i < m; ++i)
    o.push_back({Kind::B, 0, i});
  return o;
}

/// 1F1B (PipeDream-flush, Megatron's non-interleaved schedule): warmup of
/// min(pp-s-1, m) forwards, then one forward and one backward, then the
/// remaining backwards.
std::vector<Task> oneFOneBOrder(int64_t pp, int64_t s, int64_t m) {
  std::vector<Task> o;
  int64_t warmup = std::min(pp - s - 1, m);
  for (int64_t i = 0; i < warmup; ++i)
    o.push_back({Kind::F, 0, i});
  for (int64_t i = 0; i < m - warmup; ++i) {
    o.push_back({Kind::F, 0, warmup + i});
    o.push_back({Kind::B, 0, i});
  }
  for (int64_t i = m - warmup; i < m; ++i)
    o.push_back({Kind::B, 0, i});
  return o;
}

/// Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_
/// interleaving, microbatch_group_size_per_vp_stage = pp): virtual
/// micro-batch k runs micro-batch table[k] of chunk c(k), the table going
/// through groups of pp micro-batches chunk by chunk; backwards use the same
/// table with the chunk mirrored. Warmup: 2(pp-s-1) + (v-1)pp forwards.
std::vector<Task> interleavedOrder(int64_t pp, int64_t s, int64_t m, int v) {
  std::vector<std::pair<int64_t, int>> table; // (micro-batch, chunk)
  table.reserve(m * v);
  for (int64_t g = 0; g < m; g += pp)
    for (int c = 0; c < v; ++c)
      for (int64_t i = g; i < g + pp; ++i)
        table.push_back({i, c});
  int64_t total = m * v;
  int64_t warmup = std::min(2 * (pp - s - 1) + (v - 1) * pp, total);
  auto fwd = [&](int64_t k) {
    return Task{Kind::F, table[k].second, table[k].first};
  };
  auto bwd = [&](int64_t k) {
    return Task{Kind::B, v - 1 - table[k].second, table[k].first};
  };
  std::vector<Task> o;
  o.reserve(2 * total);
  for (int64_t k = 0; k < warmup; ++k)
    o.push_back(fwd(k));
  for (int64_t k = 0; k < total - warmup; ++k) {
    o.push_back(fwd(k + warmup));
    o.push_back(bwd(k));
  }
  for (int64_t k = total - warmup; k < total; ++k)
    o.push_back(bwd(k));
  return o;
}

/// ZB-H1 (Qi et al. 2023, the handcrafted schedule as in the authors'
/// DeepSpeed implementation): 1F1B's warmup, then stage s runs s
/// forward + input-gradient pairs whose weight gradients wait, then
/// F B W triples (W of the oldest waiting micro-batch), then B W pairs, then
/// the s waiting W. Stage s thus holds up to min(pp, m) micro-batches: the
/// peak over stages equals 1F1B's (stage 0).
std::vector<Task> zeroBubbleOrder(int64_t pp, int64_t s, int64_t m) {
  std::vector<Task> o;
  int64_t f = 0, b = 0, w = 0;
  int64_t warmup = std::min(pp - s - 1, m);
  for (; f < warmup; ++f)
    o.push_back({Kind::F, 0, f});
  for (int64_t i = 0; i < s && f < m; ++i, ++f, ++b) {
    o.push_back({Kind::F, 0, f});
    o.push_back({Kind::B, 0, b});
  }
  for (; f < m; ++f, ++b, ++w) {
    o.push_back({Kind::F, 0, f});
    o.push_back({Kind::B, 0, b});
    o.push_back({Kind::W, 0, w});
  }
  for (; b < m; ++b, ++w) {
    o.push_back({Kind::B, 0, b});
    o.push_back({Kind::W, 0, w});
  }
  for (; w < m; ++w)
    o.push_back({Kind::W, 0, w});
  return o;
}

std::vector<Task> stageOrder(const SimInput &in, int64_t s) {
  int64_t pp = static_cast<int64_t>(in.stages.size()), m = in.microBatches;
  switch (in.schedule) {
  case PipelineSchedule::GPipe:
    return gpipeOrder(m);
  case PipelineSchedule::OneFOneB:
    return oneFOneBOrder(pp, s, m);
  case PipelineSchedule::Interleaved1F1B:
    return interleavedOrder(pp, s, m, in.virtualStages);
  case PipelineSchedule::ZeroBubble:
    return zeroBubbleOrder(pp, s, m);
  }
  return {};
}

std::string taskName(char kind, int64_t mb, int chunk, int v) {
  std::string n(1, kind);
  n += std::to_string(mb);
  if (v > 1) {
    n += '.';
    n += std::to_string(chunk);
  }
  return n;
}

constexpr double kUnset = -1;

} // namespace

Expected<std::vector<PipelineTask>> pipelineOrder(PipelineSchedule schedule,
                                                  int64_t pp, int64_t stage,
                                                  int64_t m, int v) {
  if (pp < 1 || stage < 0 || stage >= pp)
    return Status::error("pipeline order: stage " + std::to_string(stage) +
                         " outside [0, " + std::to_string(pp) + ")");
  SimInput in;
  in.schedule = schedule;
  in.virtualStages = v;
  in.microBatches = m;
  in.stages.assign(size_t(pp), SimStage{});
  DLOPT_RETURN_IF_ERROR(validate(in));
  std::vector<PipelineTask> out;
  for (const Task &t : stageOrder(in, stage)) {
    PipelineTask p;
    p.kind = t.kind == Kind::F   ? PipelineTask::Forward
             : t.kind == Kind::B ? PipelineTask::Backward
                                 : PipelineTask::WeightGrad;
    p.chunk = t.chunk;
    p.microBatch = t.mb;
    out.push_back(p);
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Simulation
//===----------------------------------------------------------------------===//

namespace {

/// When a gradient-sync share that may start beside the weight-gradient
/// task on [bs, be] ends on a dp-comm lane free from `laneFree`: it runs
/// beside the task at `overlap` of its speed, its last bucket (`lastBucket`
/// of it) after the task (CostModel::exposedGradSync's rule).
double syncShareEnd(double laneFree, double share, double bs, double be,
                    double overlap, double lastBucket, double loss) {
  const double exposed =
      std::max({share - overlap * (be - bs), lastBucket * share,
                std::min(share, overlap * (be - bs)) * loss});
  return std::max(laneFree + share, be + exposed);
}

} // namespace

double chunkedGradSyncExposed(double share, double exposedShare, int v,
                              double spacing) {
  double free = -std::numeric_limits<double>::infinity();
  for (int j = 0; j < std::max(1, v); ++j) {
    const double be = -double(v - 1 - j) * spacing;
    free = std::max(free + share, be + exposedShare);
  }
  return std::max(0.0, free);
}

double queuedGradSyncExposed(double share, double exposedShare, int64_t count,
                             double late, int64_t lateCount, double early) {
  count = std::max<int64_t>(1, count);
  // The backwards' ends, the last at 0: be_j = -(sum of the gaps after j).
  double free = -std::numeric_limits<double>::infinity();
  double start = 0;
  for (int64_t k = 1; k < count; ++k)
    start -= k <= lateCount ? late : early;
  double be = start;
  for (int64_t j = 0; j < count; ++j) {
    free = std::max(free + share, be + exposedShare);
    const int64_t gapsAfter = count - 1 - j; // gap j -> j+1 is number gapsAfter
    if (j + 1 < count)
      be += gapsAfter <= lateCount ? late : early;
  }
  return std::max(0.0, free);
}

double pipelineMakespan(PipelineSchedule schedule,
                        const std::vector<double> &fwd,
                        const std::vector<double> &all,
                        const std::vector<double> &weightGrad, int64_t m,
                        std::vector<double> *finish,
                        std::vector<std::vector<double>> *gradEnds) {
  const int64_t pp = int64_t(fwd.size());
  const bool zb = schedule == PipelineSchedule::ZeroBubble;
  if (schedule == PipelineSchedule::Interleaved1F1B || pp < 1 || m < 1 ||
      int64_t(all.size()) != pp || (zb && int64_t(weightGrad.size()) != pp) ||
      pp * m > kMaxMakespanTasks)
    return -1;
  // Times the replay would refuse (simulateStep's validate): negative or
  // not finite, a forward longer than the whole, a weight gradient longer
  // than the backward.
  for (int64_t s = 0; s < pp; ++s) {
    const double f = fwd[size_t(s)], a = all[size_t(s)];
    const double w = zb ? weightGrad[size_t(s)] : 0.0;
    if (!std::isfinite(f) || !std::isfinite(a) || !std::isfinite(w) || f < 0 ||
        w < 0 || a < f || w > a - f)
      return -1;
  }
  // The orders depend on (schedule, pp, m) alone, which a search prices
  // many candidates with: the last few are kept per thread.
  struct CachedOrders {
    PipelineSchedule schedule;
    int64_t pp, m;
    std::vector<std::vector<Task>> orders;
  };
  thread_local std::vector<CachedOrders> cache;
  const std::vector<std::vector<Task>> *ordersPtr = nullptr;
  for (const CachedOrders &c : cache)
    if (c.schedule == schedule && c.pp == pp && c.m == m)
      ordersPtr = &c.orders;
  if (!ordersPtr) {
    if (cache.size() >= 16)
      cache.erase(cache.begin());
    CachedOrders c{schedule, pp, m, {}};
    c.orders.resize(size_t(pp));
    for (int64_t s = 0; s < pp; ++s)
      c.orders[size_t(s)] = zb ? zeroBubbleOrder(pp, s, m)
                            : schedule == PipelineSchedule::GPipe
                                ? gpipeOrder(m)
                                : oneFOneBOrder(pp, s, m);
    cache.push_back(std::move(c));
    ordersPtr = &cache.back().orders;
  }
  const std::vector<std::vector<Task>> &orders = *ordersPtr;
  auto at = [&](int64_t s, int64_t j) { return size_t(s * m + j); };
  // Finish times of each stage's forward and (input-gradient) backward of
  // each micro-batch; kUnset until run.
  std::vector<double> doneF(size_t(pp * m), kUnset),
      doneB(size_t(pp * m), kUnset);
  std::vector<size_t> next(size_t(pp), 0);
  std::vector<double> clock(size_t(pp), 0);
  if (gradEnds)
    gradEnds->assign(size_t(pp), {});
  size_t left = 0;
  for (const auto &o : orders)
    left += o.size();
  // Runs what is ready on stage s, in its order; false if nothing was.
  auto advance = [&](int64_t s) {
    bool ran = false;
    const auto &o = orders[size_t(s)];
    const double wg = zb ? weightGrad[size_t(s)] : 0.0;
    const double f = fwd[size_t(s)];
    const double b = std::max(0.0, all[size_t(s)] - f - wg);
    while (next[size_t(s)] < o.size()) {
      const Task &t = o[next[size_t(s)]];
      double ready = 0, length = 0;
      if (t.kind == Kind::F) {
        ready = s == 0 ? 0.0 : doneF[at(s - 1, t.mb)];
        length = f;
      } else if (t.kind == Kind::B) {
        ready = s == pp - 1 ? doneF[at(s, t.mb)] : doneB[at(s + 1, t.mb)];
        length = b;
      } else {
        ready = doneB[at(s, t.mb)];
        length = wg;
      }
      if (ready == kUnset)
        break;
      const double end = std::max(clock[size_t(s)], ready) + length;
      clock[size_t(s)] = end;
      if (t.kind == Kind::F)
        doneF[at(s, t.mb)] = end;
      else if (t.kind == Kind::B)
        doneB[at(s, t.mb)] = end;
      if (gradEnds && t.kind == (zb ? Kind::W : Kind::B))
        (*gradEnds)[size_t(s)].push_back(end);
      ++next[size_t(s)];
      --left;
      ran = true;
    }
    return ran;
  };
  // Forwards flow up the stages and backwards down: sweep both ways.
  while (left > 0) {
    bool ran = false;
    for (int64_t s = 0; s < pp; ++s)
      ran |= advance(s);
    for (int64_t s = pp - 1; s >= 0; --s)
      ran |= advance(s);
    if (!ran)
      return -1; // cannot happen for these orders; keep the closed form
  }
  if (finish)
    *finish = clock;
  return *std::max_element(clock.begin(), clock.end());
}

double pipelineSendTime(PipelineSchedule schedule, bool train, int64_t pp,
                        int64_t m, double oneSend, double slack,
                        int virtualStages) {
  if (pp <= 1 || !(oneSend > 0))
    return 0;
  if (!train)
    return double(pp - 1) * oneSend;
  double t = 2 * double(pp - 1) * oneSend;
  if (schedule == PipelineSchedule::OneFOneB) {
    const double waits =
        m >= pp ? 2 * oneSend * (double(pp - 1) * double(m - 1) - 1) /
                      double(pp)
                : 2 * oneSend * double(std::max<int64_t>(0, m - 2));
    t += std::max(0.0, waits - double(m - 1) * std::max(0.0, slack));
  } else if (schedule == PipelineSchedule::Interleaved1F1B &&
             virtualStages > 1) {
    // The laps after the first: pp (v - 1) more hops each way. A stage
    // faster than the slowest reaches each of its chunks early by its share
    // of the slack, which hides part of the two hops around it.
    const double v = virtualStages;
    t += double(pp) * (v - 1) *
         std::max(0.0, 2 * oneSend - std::max(0.0, slack) / v);
  }
  return t;
}

Expected<SimResult> simulateStep(const SimInput &in) {
  DLOPT_RETURN_IF_ERROR(validate(in));
  const int pp = static_cast<int>(in.stages.size());
  const int v = in.virtualStages;
  const int64_t m = in.microBatches;
  const int64_t V = int64_t(pp) * v; // virtual stages
  const bool zb = in.schedule == PipelineSchedule::ZeroBubble;

  std::vector<std::vector<Task>> order(pp);
  size_t remaining = 0;
  for (int s = 0; s < pp; ++s) {
    order[s] = stageOrder(in, s);
    remaining += order[s].size();
  }

  // Per (virtual stage, micro-batch): when its output is usable by the
  // consumer (after the send when the consumer is on another stage), and when
  // the task itself ended.
  auto idx = [m](int64_t vs, int64_t mb) { return vs * m + mb; };
  std::vector<double> fArrive(V * m, kUnset), bArrive(V * m, kUnset);
  std::vector<double> fEnd(V * m, kUnset), bEnd(V * m, kUnset);

  SimResult r;
  r.stageBusy.assign(pp, 0);
  r.memory.resize(pp);
  r.peakMemory.assign(pp, 0);
  // Events per (stage, lane), each in issue order, which is also start
  // order; merged at the end.
  constexpr size_t kLanes = 4;
  std::vector<std::vector<SimEvent>> lanes(size_t(pp) * kLanes);
  auto lane = [&](int s, SimLane l) -> std::vector<SimEvent> & {
    return lanes[size_t(s) * kLanes + size_t(l)];
  };
  for (int s = 0; s < pp; ++s) {
    lane(s, SimLane::Compute).reserve(order[s].size() + 1);
    if (in.p2p > 0)
      lane(s, SimLane::P2P).reserve(order[s].size());
    if (in.stages[s].hostDispatch > 0)
      lane(s, SimLane::Host).reserve(order[s].size() + 1);
  }

  // The host lane: per stage, the host seconds per device second of its
  // forwards, backwards and weight gradients (their issue shares; an equal
  // share each when they take no device time), and where its issuing has
  // got to.
  auto taskTime = [&](int s, Kind k) {
    const SimStage &st = in.stages[s];
    return k == Kind::F   ? st.forward
           : k == Kind::W ? st.weightGrad
           : zb           ? st.backward - st.weightGrad
                          : st.backward;
  };
  std::vector<double> hostPerDevice(pp, 0), hostPerTask(pp, 0),
      hostFree(pp, 0);
  for (int s = 0; s < pp; ++s) {
    const SimStage &st = in.stages[s];
    if (!(st.hostDispatch > 0))
      continue;
    double device = 0;
    for (const Task &t : order[s])
      device += taskTime(s, t.kind);
    if (device > 0)
      hostPerDevice[s] = st.hostDispatch / device;
    else
      hostPerTask[s] = st.hostDispatch / double(order[s].size());
  }
  // Issues a task of `dur` device seconds on stage s's host lane; returns
  // the issue's [start, end].
  auto issue = [&](int s, double dur, const std::string &name, int64_t mb,
                   int chunk) {
    const double start = hostFree[s];
    if (!(in.stages[s].hostDispatch > 0))
      return std::make_pair(start, start);
    hostFree[s] += dur * hostPerDevice[s] + hostPerTask[s];
    lane(s, SimLane::Host)
        .push_back({s, SimLane::Host, SimOp::Issue, "issue " + name, mb, chunk,
                    -1, start, hostFree[s]});
    return std::make_pair(start, hostFree[s]);
  };

  std::vector<size_t> next(pp, 0);
  std::vector<double> computeFree(pp, 0), p2pFree(pp, 0), dpFree(pp, 0);
  std::vector<double> lastStart(pp, 0), lastEnd(pp, 0);
  // Per (stage, chunk): the last task that makes the chunk's weight
  // gradients (its last B, or its last W under zero-bubble), which its
  // share of the gradient sync may overlap.
  std::vector<double> chunkGradStart(size_t(pp) * v, 0),
      chunkGradEnd(size_t(pp) * v, 0);
  // Memory state: activations held and whether a backward runs.
  std::vector<int64_t> held(pp, 0);
  auto memPoint = [&](int s, double t, bool running) {
    const SimStage &st = in.stages[s];
    double bytes = st.staticBytes + st.activationBytes * double(held[s]) +
                   (running ? st.transientBytes : 0.0);
    auto &pts = r.memory[s];
    if (!pts.empty() && pts.back().time == t)
      pts.back().bytes = bytes;
    else
      pts.push_back({t, bytes});
  };
  for (int s = 0; s < pp; ++s)
    memPoint(s, 0, false);

  auto send = [&](int s, int peer, double ready, const std::string &what,
                  int64_t mb, int chunk) {
    double start = std::max(ready, p2pFree[s]);
    double end = start + in.p2p;
    p2pFree[s] = end;
    if (in.p2p > 0)
      lane(s, SimLane::P2P)
          .push_back({s, SimLane::P2P, SimOp::Send, "send " + what, mb, chunk,
                      peer, start, end});
    return end;
  };

  while (remaining > 0) {
    bool progress = false;
    for (int s = 0; s < pp; ++s) {
      while (next[s] < order[s].size()) {
        const Task &t = order[s][next[s]];
        int64_t vs = int64_t(t.chunk) * pp + s;
        double ready = 0;
        switch (t.kind) {
        case Kind::F:
          ready = vs > 0 ? fArrive[idx(vs - 1, t.mb)] : 0;
          break;
        case Kind::B:
          // The gradient from the next virtual stage; the last one starts
          // from its own forward's loss.
          ready = vs + 1 < V ? bArrive[idx(vs + 1, t.mb)] : 0;
          if (fEnd[idx(vs, t.mb)] == kUnset)
            ready = kUnset;
          else if (ready != kUnset)
            ready = std::max(ready, fEnd[idx(vs, t.mb)]);
          break;
        case Kind::W:
          ready = bEnd[idx(vs, t.mb)];
          break;
        }
        if (ready == kUnset)
          break; // blocked on another stage (or, for B, on its own F)

        double dur = taskTime(s, t.kind);
        char letter = t.kind == Kind::F ? 'F' : t.kind == Kind::B ? 'B' : 'W';
        std::string name = taskName(letter, t.mb, t.chunk, v);
        auto [issued, issuedEnd] =
            issue(s, dur, name, t.mb, t.chunk);
        double start = std::max({ready, computeFree[s], issued});
        double end = std::max(start + dur, issuedEnd);
        computeFree[s] = end;
        r.stageBusy[s] += dur;
        lastStart[s] = start;
        lastEnd[s] = end;
        if (t.kind == (zb ? Kind::W : Kind::B)) {
          chunkGradStart[size_t(s) * v + t.chunk] = start;
          chunkGradEnd[size_t(s) * v + t.chunk] = end;
        }
        SimOp op = t.kind == Kind::F   ? SimOp::Forward
                   : t.kind == Kind::B ? SimOp::Backward
                                       : SimOp::WeightGrad;
        lane(s, SimLane::Compute)
            .push_back(
                {s, SimLane::Compute, op, name, t.mb, t.chunk, -1, start, end});
        // ZeRO 2: this micro-batch's share of the chunk's gradients is
        // reduce-scattered once its weight-gradient task ends, by the rule
        // of the end-of-step sync below; the syncs queue on dp-comm.
        const SimStage &cur = in.stages[s];
        if (cur.gradSyncPerMicroBatch && cur.gradSync > 0 &&
            t.kind == (zb ? Kind::W : Kind::B)) {
          const double share = cur.gradSync / v;
          dpFree[s] = syncShareEnd(dpFree[s], share, start, end,
                                   in.gradOverlap, cur.gradLastBucket,
                                   cur.gradSyncLoss);
          lane(s, SimLane::DPComm)
              .push_back({s, SimLane::DPComm, SimOp::GradSync,
                          "grad sync " + std::to_string(t.mb) +
                              (v > 1 ? "." + std::to_string(t.chunk) : ""),
                          t.mb, v > 1 ? t.chunk : -1, -1, dpFree[s] - share,
                          dpFree[s]});
        }

        switch (t.kind) {
        case Kind::F: {
          ++held[s];
          memPoint(s, start, false);
          fEnd[idx(vs, t.mb)] = end;
          if (vs + 1 < V) {
            int peer = int((vs + 1) % pp);
            fArrive[idx(vs, t.mb)] =
                peer == s ? end : send(s, peer, end, name, t.mb, t.chunk);
          }
          break;
        }
        case Kind::B: {
          memPoint(s, start, true);
          if (!zb)
            --held[s];
          memPoint(s, end, false);
          bEnd[idx(vs, t.mb)] = end;
          if (vs > 0) {
            int peer = int((vs - 1) % pp);
            bArrive[idx(vs, t.mb)] =
                peer == s ? end : send(s, peer, end, name, t.mb, t.chunk);
          }
          break;
        }
        case Kind::W:
          memPoint(s, start, true);
          --held[s];
          memPoint(s, end, false);
          break;
        }
        ++next[s];
        --remaining;
        progress = true;
      }
    }
    if (!progress)
      return Status::error("simulator: internal error: the " +
                           std::string(scheduleName(in.schedule)) +
                           " order deadlocks");
  }

  // Gradient sync per stage, then the tied embedding's, then the
  // optimizer.
  std::vector<double> syncEnds(size_t(pp), 0.0);
  for (int s = 0; s < pp; ++s) {
    const SimStage &st = in.stages[s];
    r.pipelineTime = std::max(r.pipelineTime, lastEnd[s]);
    double &syncEnd = syncEnds[size_t(s)];
    syncEnd = std::max(lastEnd[s], dpFree[s]);
    if (st.gradSync > 0 && !st.gradSyncPerMicroBatch) {
      // One sync per chunk, of its share of the stage's gradients, once the
      // chunk's last weight-gradient task may let it start (Megatron-LM's
      // buckets are per model chunk); they queue on the dp-comm lane.
      std::vector<int> chunks(v);
      for (int k = 0; k < v; ++k)
        chunks[k] = k;
      std::stable_sort(chunks.begin(), chunks.end(), [&](int a, int b) {
        return chunkGradEnd[size_t(s) * v + a] <
               chunkGradEnd[size_t(s) * v + b];
      });
      const double share = st.gradSync / v;
      double laneFree = 0;
      for (int k : chunks) {
        const double bs = chunkGradStart[size_t(s) * v + k],
                     be = chunkGradEnd[size_t(s) * v + k];
        const double end =
            syncShareEnd(laneFree, share, bs, be, in.gradOverlap,
                         st.gradLastBucket, st.gradSyncLoss);
        laneFree = end;
        lane(s, SimLane::DPComm)
            .push_back({s, SimLane::DPComm, SimOp::GradSync,
                        v > 1 ? "grad sync." + std::to_string(k) : "grad sync",
                        -1, v > 1 ? k : -1, -1, end - share, end});
      }
      syncEnd = std::max(lastEnd[s], laneFree);
    }
  }
  if (in.embeddingSync > 0 && pp > 1) {
    const double end =
        std::max(syncEnds.front(), syncEnds.back()) + in.embeddingSync;
    for (int s : {0, pp - 1}) {
      syncEnds[size_t(s)] = end;
      lane(s, SimLane::DPComm)
          .push_back({s, SimLane::DPComm, SimOp::GradSync,
                      "embedding grad sync", -1, -1, -1, end - in.embeddingSync,
                      end});
    }
  }
  for (int s = 0; s < pp; ++s) {
    const SimStage &st = in.stages[s];
    const double syncEnd = syncEnds[size_t(s)];
    // Sequence parallelism's tp all-reduce of weight gradients, once the
    // passes are done.
    double tpEnd = computeFree[s];
    if (st.tpGradSync > 0) {
      tpEnd = std::max(computeFree[s], hostFree[s]) + st.tpGradSync;
      lane(s, SimLane::Compute)
          .push_back({s, SimLane::Compute, SimOp::GradSync, "tp grad sync", -1,
                      -1, -1, tpEnd - st.tpGradSync, tpEnd});
    }
    // The optimizer is a few multi-tensor kernels: issued once the host
    // has issued the rest, in no time of its own.
    double optStart = std::max({tpEnd, syncEnd, hostFree[s]});
    double optEnd = optStart + st.optimizer;
    if (optEnd > optStart)
      lane(s, SimLane::Compute)
          .push_back({s, SimLane::Compute, SimOp::Optimizer, "optimizer", -1,
                      -1, -1, optStart, optEnd});
    // ZeRO's gather of the updated parameters, after the optimizer.
    double gatherEnd = optEnd;
    if (st.paramGather > 0) {
      gatherEnd = std::max(optEnd, syncEnd) + st.paramGather;
      lane(s, SimLane::DPComm)
          .push_back({s, SimLane::DPComm, SimOp::ParamGather, "param gather", -1,
                      -1, -1, gatherEnd - st.paramGather, gatherEnd});
    }
    r.stepTime = std::max(r.stepTime, gatherEnd);
  }

  // From the final points: a zero-length task leaves no spike behind.
  for (int s = 0; s < pp; ++s)
    for (const SimMemoryPoint &p : r.memory[s])
      r.peakMemory[s] = std::max(r.peakMemory[s], p.bytes);

  double busiest = *std::max_element(r.stageBusy.begin(), r.stageBusy.end());
  r.bubbleFraction = r.pipelineTime > 0 ? 1.0 - busiest / r.pipelineTime : 0.0;

  // Merge the lanes by (start, stage, lane); each lane keeps issue order.
  using Head = std::pair<double, size_t>; // (start, lane index)
  std::priority_queue<Head, std::vector<Head>, std::greater<Head>> heads;
  std::vector<size_t> pos(lanes.size(), 0);
  size_t total = 0;
  for (size_t l = 0; l < lanes.size(); ++l) {
    total += lanes[l].size();
    if (!lanes[l].empty())
      heads.push({lanes[l][0].start, l});
  }
  r.events.reserve(total);
  while (!heads.empty()) {
    size_t l = heads.top().second;
    heads.pop();
    r.events.push_back(std::move(lanes[l][pos[l]++]));
    if (pos[l] < lanes[l].size())
      heads.push({lanes[l][pos[l]].start, l});
  }
  return r;
}

//===----------------------------------------------------------------------===//
// Chrome trace
//===----------------------------------------------------------------------===//

namespace {

void appendEscaped(std::string &out, const std::string &s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        out += buf;
      } else {
        out += static_cast<char>(c);
      }
    }
  }
  out += '"';
}

/// Shortest round-tripping text of a finite double (JSON has no inf/nan).
std::string num(double v) {
  if (!std::isfinite(v))
    return "0";
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

/// Seconds to trace microseconds, rounded to nanoseconds.
std::string micros(double seconds) {
  return num(std::round(seconds * 1e9) / 1e3);
}

int laneTid(SimLane l) { return static_cast<int>(l); }

} // namespace

std::string chromeTrace(const SimResult &r, const std::string &title) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::string out;
  out.reserve(128 * (r.events.size() + 16));
  bool first = true;
  auto begin = [&]() {
    out += first ? "\n" : ",\n";
    first = false;
  };

  out += "{\"traceEvents\":[";
  int pp = static_cast<int>(r.memory.size());
  for (int s = 0; s < pp; ++s) {
    begin();
    out +=
        "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(s) +
        ",\"tid\":0,\"args\":{\"name\":\"stage " + std::to_string(s) + "\"}}";
    begin();
    out += "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" +
           std::to_string(s) +
           ",\"tid\":0,\"args\":{\"sort_index\":" + std::to_string(s) + "}}";
    for (SimLane l :
         {SimLane::Compute, SimLane::P2P, SimLane::DPComm, SimLane::Host}) {
      std::string pidTid = "\"pid\":" + std::to_string(s) +
                           ",\"tid\":" + std::to_string(laneTid(l));
      begin();
      out += "{\"name\":\"thread_name\",\"ph\":\"M\"," + pidTid +
             ",\"args\":{\"name\":\"" + laneName(l) + "\"}}";
      begin();
      out += "{\"name\":\"thread_sort_index\",\"ph\":\"M\"," + pidTid +
             ",\"args\":{\"sort_index\":" + std::to_string(laneTid(l)) + "}}";
    }
  }

  for (const SimEvent &e : r.events) {
    begin();
    out += "{\"name\":";
    appendEscaped(out, e.name);
    out += ",\"cat\":\"";
    out += opName(e.op);
    out += "\",\"ph\":\"X\",\"ts\":" + micros(e.start) +
           ",\"dur\":" + micros(e.end - e.start) +
           ",\"pid\":" + std::to_string(e.stage) +
           ",\"tid\":" + std::to_string(laneTid(e.lane)) + ",\"args\":{";
    bool firstArg = true;
    auto arg = [&](const char *k, const std::string &v) {
      if (!firstArg)
        out += ',';
      firstArg = false;
      out += '"';
      out += k;
      out += "\":";
      out += v;
    };
    if (e.microBatch >= 0)
      arg("micro_batch", std::to_string(e.microBatch));
    if (e.chunk >= 0)
      arg("chunk", std::to_string(e.chunk));
    if (e.peer >= 0)
      arg("to_stage", std::to_string(e.peer));
    out += "}}";
  }

  for (int s = 0; s < pp; ++s) {
    auto counter = [&](double t, double bytes) {
      begin();
      out += "{\"name\":\"memory (GiB)\",\"ph\":\"C\",\"ts\":" + micros(t) +
             ",\"pid\":" + std::to_string(s) +
             ",\"args\":{\"GiB\":" + num(bytes / kGiB) + "}}";
    };
    for (const SimMemoryPoint &p : r.memory[s])
      counter(p.time, p.bytes);
    // Carry the last value to the end of the step so the track spans it.
    if (!r.memory[s].empty() && r.memory[s].back().time < r.stepTime)
      counter(r.stepTime, r.memory[s].back().bytes);
  }

  out += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"title\":";
  appendEscaped(out, title);
  out += ",\"step_time_s\":" + num(r.stepTime) +
         ",\"pipeline_time_s\":" + num(r.pipelineTime) +
         ",\"bubble_fraction\":" + num(r.bubbleFraction) +
         ",\"stages\":" + std::to_string(pp) + "}}\n";
  return out;
}

} // namespace dlopt::planner
