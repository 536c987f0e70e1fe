//===- SimulatorTest.cpp - Pipeline step simulator ------------------------===//
//
// Closed forms for uniform stages (step time, bubble, peak activations per
// schedule), the exact per-stage orders, dependency and lane invariants on
// random non-uniform stages, gradient-sync overlap, the Chrome trace, every
// validation error and a large configuration.
//
//===----------------------------------------------------------------------===//
#include "planner/Simulator.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <tuple>

using namespace dlopt::planner;

namespace {

constexpr double kEps = 1e-9;

SimInput uniform(PipelineSchedule sched, int pp, int64_t m, int v, double f,
                 double b, double w = 0) {
  SimInput in;
  in.schedule = sched;
  in.virtualStages = v;
  in.microBatches = m;
  for (int s = 0; s < pp; ++s) {
    SimStage st;
    st.forward = f;
    st.backward = b;
    st.weightGrad = w;
    st.staticBytes = 1000;
    st.activationBytes = 10;
    st.transientBytes = 3;
    in.stages.push_back(st);
  }
  return in;
}

SimResult simulate(const SimInput &in) {
  auto r = simulateStep(in);
  EXPECT_TRUE(r.isOk()) << r.status().message();
  return r.isOk() ? r.take() : SimResult{};
}

/// Compute-lane event names of one stage, in time order.
std::string computeOrder(const SimResult &r, int stage) {
  std::string out;
  for (const SimEvent &e : r.events)
    if (e.stage == stage && e.lane == SimLane::Compute) {
      if (!out.empty())
        out += ' ';
      out += e.name;
    }
  return out;
}

std::string errorOf(const SimInput &in) {
  auto r = simulateStep(in);
  EXPECT_FALSE(r.isOk());
  return r.isOk() ? std::string() : r.status().message();
}

} // namespace

//===----------------------------------------------------------------------===//
// Closed forms, uniform stages, no p2p
//===----------------------------------------------------------------------===//

TEST(SimClosedForm, GPipeAnd1F1BStepAndBubble) {
  for (auto sched : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB})
    for (auto [pp, m] : {std::pair{4, 8}, {4, 3}, {8, 32}, {1, 5}, {5, 1}})
      for (auto [f, b] : {std::pair{1.0, 2.0}, {2.0, 1.0}, {0.3, 0.7}}) {
        SCOPED_TRACE(std::string(scheduleName(sched)) +
                     " pp=" + std::to_string(pp) + " m=" + std::to_string(m) +
                     " f=" + std::to_string(f));
        SimResult r = simulate(uniform(sched, pp, m, 1, f, b));
        EXPECT_NEAR(r.stepTime, (m + pp - 1) * (f + b), kEps);
        EXPECT_NEAR(r.pipelineTime, r.stepTime, kEps);
        EXPECT_NEAR(r.bubbleFraction, double(pp - 1) / (m + pp - 1), kEps);
        for (double busy : r.stageBusy)
          EXPECT_NEAR(busy, m * (f + b), kEps);
      }
}

TEST(SimClosedForm, InterleavedBubbleIsDividedByV) {
  // Narayanan et al. 2021: the bubble shrinks from (pp-1)(f+b) to
  // (pp-1)(f+b)/v when each stage holds v chunks of 1/v of its layers.
  for (auto [pp, m] : {std::pair{4, 8}, {4, 4}, {8, 16}, {2, 6}})
    for (int v : {1, 2, 3, 4})
      for (auto [f, b] : {std::pair{1.0, 2.0}, {2.0, 1.0}, {1.0, 1.0}}) {
        SCOPED_TRACE("pp=" + std::to_string(pp) + " m=" + std::to_string(m) +
                     " v=" + std::to_string(v) + " f=" + std::to_string(f));
        SimResult r = simulate(
            uniform(PipelineSchedule::Interleaved1F1B, pp, m, v, f / v, b / v));
        double bubble = (pp - 1) * (f + b) / v;
        EXPECT_NEAR(r.stepTime, m * (f + b) + bubble, kEps);
        EXPECT_NEAR(r.bubbleFraction, double(pp - 1) / (double(m) * v + pp - 1),
                    kEps);
      }
}

TEST(SimClosedForm, ZeroBubbleH1) {
  // With B = input gradient and W = weight gradient, ZB-H1's bubble is
  // (pp-1)(f + B - W) (Qi et al. 2023) as long as W <= min(f, B); 1F1B's is
  // (pp-1)(f + B + W), 2(pp-1)W more.
  const int pp = 4;
  const int64_t m = 8;
  for (auto [f, bIn, w] : {std::tuple{1.0, 1.0, 1.0},
                           {1.0, 1.5, 0.5},
                           {2.0, 0.75, 0.25},
                           {1.0, 2.25, 0.75},
                           {1.0, 1.0, 0.0}}) {
    SCOPED_TRACE("f=" + std::to_string(f) + " B=" + std::to_string(bIn) +
                 " W=" + std::to_string(w));
    SimResult zb = simulate(
        uniform(PipelineSchedule::ZeroBubble, pp, m, 1, f, bIn + w, w));
    SimResult ofob =
        simulate(uniform(PipelineSchedule::OneFOneB, pp, m, 1, f, bIn + w));
    double busy = m * (f + bIn + w);
    EXPECT_NEAR(zb.stepTime, busy + (pp - 1) * (f + bIn - w), kEps);
    EXPECT_NEAR(ofob.stepTime - zb.stepTime, 2 * (pp - 1) * w, kEps);
    EXPECT_NEAR(zb.bubbleFraction, 1 - busy / zb.stepTime, kEps);
  }
  // A W longer than f or B cannot hide more than its order allows: the
  // bubble bottoms out at (pp-1) max(f, B).
  SimResult r =
      simulate(uniform(PipelineSchedule::ZeroBubble, pp, m, 1, 1.0, 2.0, 1.5));
  EXPECT_NEAR(r.stepTime, m * 3.0 + (pp - 1) * 1.0, kEps);
  r = simulate(uniform(PipelineSchedule::ZeroBubble, pp, m, 1, 1.0, 3.0, 1.5));
  EXPECT_NEAR(r.stepTime, m * 4.0 + (pp - 1) * 1.5, kEps);
  // Fewer micro-batches than stages: only m - 1 deferred W's can fill the
  // cooldown; the bubble is (pp-1)(f + B) - min(pp-1, m-1) W (one micro-
  // batch: the whole chain of f + B, and one W at its end).
  for (int stages : {2, 3, 4, 8})
    for (int64_t mb = 1; mb <= 2 * stages; ++mb)
      for (auto [f, bIn, w] : {std::tuple{1.0, 1.0, 1.0},
                               {1.0, 1.5, 0.5},
                               {2.0, 0.75, 0.25}}) {
        SimResult z = simulate(uniform(PipelineSchedule::ZeroBubble, stages,
                                       mb, 1, f, bIn + w, w));
        double k = std::min<double>(stages - 1, mb - 1);
        EXPECT_NEAR(z.stepTime - mb * (f + bIn + w),
                    (stages - 1) * (f + bIn) - k * w, kEps)
            << "pp=" << stages << " m=" << mb;
      }
}

TEST(SimClosedForm, PeakActivations) {
  const int pp = 4;
  auto peakUnits = [](const SimResult &r, const SimInput &in, int s) {
    const SimStage &st = in.stages[s];
    return (r.peakMemory[s] - st.staticBytes - st.transientBytes) /
           st.activationBytes;
  };
  for (int64_t m : {2, 4, 8, 12}) {
    SCOPED_TRACE("m=" + std::to_string(m));
    SimInput g = uniform(PipelineSchedule::GPipe, pp, m, 1, 1, 2);
    SimInput o = uniform(PipelineSchedule::OneFOneB, pp, m, 1, 1, 2);
    SimInput z = uniform(PipelineSchedule::ZeroBubble, pp, m, 1, 1, 2, 1);
    SimResult rg = simulate(g), ro = simulate(o), rz = simulate(z);
    for (int s = 0; s < pp; ++s) {
      EXPECT_DOUBLE_EQ(peakUnits(rg, g, s), double(m));
      EXPECT_DOUBLE_EQ(peakUnits(ro, o, s),
                       double(std::min<int64_t>(pp - s, m)));
      // ZB-H1 keeps a micro-batch until its W: every stage reaches stage
      // 0's 1F1B peak.
      EXPECT_DOUBLE_EQ(peakUnits(rz, z, s), double(std::min<int64_t>(pp, m)));
    }
    if (m % pp)
      continue;
    for (int v : {2, 4}) {
      // Megatron's warmup plus the steady state's forward:
      // 2(pp-s-1) + (v-1)pp + 1 chunk activations, at most m*v.
      SimInput i = uniform(PipelineSchedule::Interleaved1F1B, pp, m, v, 0.5, 1);
      SimResult ri = simulate(i);
      for (int s = 0; s < pp; ++s)
        EXPECT_DOUBLE_EQ(peakUnits(ri, i, s),
                         double(std::min<int64_t>(
                             2 * (pp - s - 1) + (v - 1) * pp + 1, m * v)))
            << "v=" << v << " stage " << s;
    }
  }
}

TEST(SimClosedForm, MemoryTimeline) {
  SimInput in = uniform(PipelineSchedule::OneFOneB, 3, 5, 1, 1, 2);
  SimResult r = simulate(in);
  ASSERT_EQ(r.memory.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    const auto &pts = r.memory[s];
    ASSERT_GE(pts.size(), 2u);
    // Stage 0 starts F0 at t = 0; the others wait with static memory only.
    EXPECT_EQ(pts.front().time, 0);
    EXPECT_EQ(pts.front().bytes, s == 0 ? 1010 : 1000);
    EXPECT_EQ(pts.back().bytes, 1000) << "all activations released";
    double peak = 0;
    for (size_t i = 0; i < pts.size(); ++i) {
      if (i)
        EXPECT_LT(pts[i - 1].time, pts[i].time);
      peak = std::max(peak, pts[i].bytes);
    }
    EXPECT_EQ(peak, r.peakMemory[s]);
  }
  // Stage 2 (last) of 1F1B: F0 [0+2,3], B0 [3,5]: activation at 2, the
  // transient on top at 3, both gone at 5.
  const auto &last = r.memory[2];
  EXPECT_EQ(last[1].time, 2);
  EXPECT_EQ(last[1].bytes, 1010);
  EXPECT_EQ(last[2].time, 3);
  EXPECT_EQ(last[2].bytes, 1013);
  EXPECT_EQ(last[3].time, 5);
}

//===----------------------------------------------------------------------===//
// Orders
//===----------------------------------------------------------------------===//

TEST(SimOrder, OneFOneB) {
  SimResult r = simulate(uniform(PipelineSchedule::OneFOneB, 4, 8, 1, 1, 2));
  EXPECT_EQ(computeOrder(r, 0),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(computeOrder(r, 2),
            "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(computeOrder(r, 3),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
}

TEST(SimOrder, GPipe) {
  SimResult r = simulate(uniform(PipelineSchedule::GPipe, 2, 3, 1, 1, 2));
  EXPECT_EQ(computeOrder(r, 0), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(computeOrder(r, 1), "F0 F1 F2 B0 B1 B2");
}

TEST(SimOrder, InterleavedFollowsMegatron) {
  // pp=2, m=4, v=2: the table runs groups of pp micro-batches chunk by
  // chunk, (0,c0) (1,c0) (0,c1) (1,c1) (2,c0) (3,c0) (2,c1) (3,c1);
  // backwards mirror the chunk. Warmup 2(pp-s-1) + (v-1)pp: 4 and 2.
  SimResult r =
      simulate(uniform(PipelineSchedule::Interleaved1F1B, 2, 4, 2, 1, 2));
  EXPECT_EQ(computeOrder(r, 0), "F0.0 F1.0 F0.1 F1.1 "
                                "F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 "
                                "B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(computeOrder(r, 1), "F0.0 F1.0 "
                                "F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 "
                                "F2.1 B2.1 F3.1 B3.1 "
                                "B2.0 B3.0");
}

TEST(SimOrder, ZeroBubbleH1) {
  // Stage s defers s weight gradients: warmup pp-s-1 F, s (F B), then
  // (F B W), (B W), and the s deferred W.
  SimResult r =
      simulate(uniform(PipelineSchedule::ZeroBubble, 4, 8, 1, 1, 2, 1));
  EXPECT_EQ(computeOrder(r, 0), "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 "
                                "F7 B4 W4 B5 W5 B6 W6 B7 W7");
  EXPECT_EQ(computeOrder(r, 1), "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 "
                                "F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7");
  EXPECT_EQ(computeOrder(r, 3), "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 "
                                "F6 B6 W3 F7 B7 W4 W5 W6 W7");
  // Fewer micro-batches than stages.
  r = simulate(uniform(PipelineSchedule::ZeroBubble, 4, 2, 1, 1, 2, 1));
  EXPECT_EQ(computeOrder(r, 0), "F0 F1 B0 W0 B1 W1");
  EXPECT_EQ(computeOrder(r, 3), "F0 B0 F1 B1 W0 W1");
}

TEST(SimOrder, PipelineOrderIsWhatTheSimulatorRuns) {
  // dlopt-pipeline orders each stage's program by pipelineOrder: it must be
  // the order the simulator replays, for every schedule.
  struct Case {
    PipelineSchedule s;
    int pp;
    int64_t m;
    int v;
  };
  for (Case c : {Case{PipelineSchedule::GPipe, 3, 5, 1},
                 Case{PipelineSchedule::OneFOneB, 4, 6, 1},
                 Case{PipelineSchedule::OneFOneB, 4, 2, 1},
                 Case{PipelineSchedule::Interleaved1F1B, 2, 4, 2},
                 Case{PipelineSchedule::Interleaved1F1B, 4, 8, 3},
                 Case{PipelineSchedule::ZeroBubble, 4, 8, 1}}) {
    SimResult r = simulate(uniform(c.s, c.pp, c.m, c.v, 1, 2,
                                   c.s == PipelineSchedule::ZeroBubble ? 1 : 0));
    for (int stage = 0; stage < c.pp; ++stage) {
      auto order = pipelineOrder(c.s, c.pp, stage, c.m, c.v);
      ASSERT_TRUE(order.isOk()) << order.status().message();
      std::string names;
      for (const PipelineTask &t : *order) {
        if (!names.empty())
          names += ' ';
        names += t.kind == PipelineTask::Forward    ? 'F'
                 : t.kind == PipelineTask::Backward ? 'B'
                                                    : 'W';
        names += std::to_string(t.microBatch);
        if (c.v > 1)
          names += "." + std::to_string(t.chunk);
      }
      EXPECT_EQ(names, computeOrder(r, stage))
          << scheduleName(c.s) << " pp=" << c.pp << " stage " << stage;
    }
  }
  // Its errors are the simulator's, and a stage outside the pipeline.
  EXPECT_FALSE(pipelineOrder(PipelineSchedule::Interleaved1F1B, 4, 0, 6, 2).isOk());
  EXPECT_FALSE(pipelineOrder(PipelineSchedule::OneFOneB, 4, 0, 4, 2).isOk());
  EXPECT_FALSE(pipelineOrder(PipelineSchedule::OneFOneB, 4, 4, 4, 1).isOk());
}

//===----------------------------------------------------------------------===//
// Invariants on random, non-uniform stages with p2p
//===----------------------------------------------------------------------===//

namespace {

void checkInvariants(const SimInput &in, const SimResult &r) {
  const int pp = static_cast<int>(in.stages.size());
  const int v = in.virtualStages;
  const int64_t m = in.microBatches;
  const bool zb = in.schedule == PipelineSchedule::ZeroBubble;
  // (op, virtual stage, micro-batch) -> event
  std::map<std::tuple<SimOp, int64_t, int64_t>, const SimEvent *> byKey;
  std::map<std::tuple<SimOp, int64_t, int64_t>, const SimEvent *> sends;
  std::map<std::pair<int, SimLane>, std::vector<const SimEvent *>> lanes;
  for (const SimEvent &e : r.events) {
    EXPECT_GE(e.end, e.start);
    lanes[{e.stage, e.lane}].push_back(&e);
    if (e.op == SimOp::Forward || e.op == SimOp::Backward ||
        e.op == SimOp::WeightGrad) {
      int64_t vs = int64_t(e.chunk) * pp + e.stage;
      EXPECT_TRUE(byKey.emplace(std::tuple{e.op, vs, e.microBatch}, &e).second)
          << "duplicate " << e.name << " on stage " << e.stage;
    }
    if (e.op == SimOp::Send) {
      SimOp what =
          e.name.rfind("send F", 0) == 0 ? SimOp::Forward : SimOp::Backward;
      int64_t vs = int64_t(e.chunk) * pp + e.stage;
      sends[{what, vs, e.microBatch}] = &e;
    }
  }
  // Exactly one F and B (and W under zero-bubble) per (chunk, mb) per stage.
  size_t perKind = size_t(pp) * v * m;
  size_t expected = perKind * (zb ? 3 : 2);
  EXPECT_EQ(byKey.size(), expected);
  // Lanes never overlap.
  for (auto &[key, evs] : lanes) {
    std::sort(evs.begin(), evs.end(),
              [](auto *a, auto *b) { return a->start < b->start; });
    for (size_t i = 1; i < evs.size(); ++i)
      EXPECT_GE(evs[i]->start, evs[i - 1]->end - kEps)
          << evs[i]->name << " overlaps " << evs[i - 1]->name << " on stage "
          << key.first << " lane " << laneName(key.second);
  }
  // Producers end (and their send arrives) before consumers start.
  const int64_t V = int64_t(pp) * v;
  auto arrival = [&](SimOp op, int64_t vs, int64_t mb, int consumerStage) {
    const SimEvent *p = byKey.at({op, vs, mb});
    if (p->stage == consumerStage)
      return p->end;
    double end = p->end + in.p2p;
    if (in.p2p > 0) {
      const SimEvent *s = sends.at({op, vs, mb});
      EXPECT_EQ(s->stage, p->stage);
      EXPECT_EQ(s->peer, consumerStage);
      EXPECT_GE(s->start, p->end - kEps);
      EXPECT_NEAR(s->end - s->start, in.p2p, kEps);
      end = s->end;
    }
    return end;
  };
  for (int64_t vs = 0; vs < V; ++vs)
    for (int64_t mb = 0; mb < m; ++mb) {
      int stage = int(vs % pp);
      const SimEvent *f = byKey.at({SimOp::Forward, vs, mb});
      const SimEvent *b = byKey.at({SimOp::Backward, vs, mb});
      if (vs > 0)
        EXPECT_GE(f->start, arrival(SimOp::Forward, vs - 1, mb, stage) - kEps)
            << f->name << " on stage " << stage;
      EXPECT_GE(b->start, f->end - kEps);
      if (vs + 1 < V)
        EXPECT_GE(b->start, arrival(SimOp::Backward, vs + 1, mb, stage) - kEps)
            << b->name << " on stage " << stage;
      if (zb) {
        const SimEvent *w = byKey.at({SimOp::WeightGrad, vs, mb});
        EXPECT_GE(w->start, b->end - kEps);
        EXPECT_NEAR(b->end - b->start,
                    in.stages[stage].backward - in.stages[stage].weightGrad,
                    kEps);
      } else {
        EXPECT_NEAR(b->end - b->start, in.stages[stage].backward, kEps);
      }
    }
  // Events sorted by start time.
  for (size_t i = 1; i < r.events.size(); ++i)
    EXPECT_LE(r.events[i - 1].start, r.events[i].start);
  EXPECT_LE(r.pipelineTime, r.stepTime + kEps);
}

SimInput randomInput(std::mt19937 &rng, PipelineSchedule sched, int pp,
                     int64_t m, int v) {
  std::uniform_real_distribution<double> u(0.5, 2.0);
  SimInput in;
  in.schedule = sched;
  in.virtualStages = v;
  in.microBatches = m;
  in.p2p = 0.1 * u(rng);
  in.gradOverlap = 0.5;
  for (int s = 0; s < pp; ++s) {
    SimStage st;
    st.forward = u(rng);
    st.backward = 2 * u(rng);
    st.weightGrad = st.backward * 0.4;
    st.staticBytes = 1e9 * u(rng);
    st.activationBytes = 1e8 * u(rng);
    st.transientBytes = 1e7 * u(rng);
    st.gradSync = u(rng);
    st.optimizer = 0.1 * u(rng);
    in.stages.push_back(st);
  }
  return in;
}

} // namespace

TEST(SimInvariants, RandomStagesAllSchedules) {
  std::mt19937 rng(20240501);
  for (auto [pp, m] : {std::pair{4, 8}, {3, 6}, {5, 10}, {1, 3}, {2, 2}}) {
    for (auto sched :
         {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB,
          PipelineSchedule::ZeroBubble, PipelineSchedule::Interleaved1F1B}) {
      for (int v : {1, 2, 3}) {
        if (v > 1 && sched != PipelineSchedule::Interleaved1F1B)
          continue;
        SCOPED_TRACE(std::string(scheduleName(sched)) +
                     " pp=" + std::to_string(pp) + " m=" + std::to_string(m) +
                     " v=" + std::to_string(v));
        SimInput in = randomInput(rng, sched, pp, m, v);
        SimResult r = simulate(in);
        checkInvariants(in, r);
        // Deterministic.
        EXPECT_EQ(chromeTrace(r, "a"), chromeTrace(simulate(in), "a"));
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// Communication
//===----------------------------------------------------------------------===//

TEST(SimComm, P2PAddsToTheCriticalPath) {
  // GPipe: the forward wave crosses pp-1 boundaries, and the backward wave
  // too; with p2p <= min(f, b) the sends never queue.
  const int pp = 4;
  const int64_t m = 6;
  const double f = 1, b = 2, p = 0.25;
  SimInput in = uniform(PipelineSchedule::GPipe, pp, m, 1, f, b);
  in.p2p = p;
  SimResult r = simulate(in);
  EXPECT_NEAR(r.stepTime, (m + pp - 1) * (f + b) + 2 * (pp - 1) * p, kEps);
  size_t sends = 0;
  for (const SimEvent &e : r.events)
    sends += e.op == SimOp::Send;
  EXPECT_EQ(sends, size_t(2 * (pp - 1) * m));
  checkInvariants(in, r);

  for (auto sched : {PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubble,
                     PipelineSchedule::Interleaved1F1B}) {
    int v = sched == PipelineSchedule::Interleaved1F1B ? 2 : 1;
    SimInput a = uniform(sched, pp, 8, v, f / v, b / v, b / v / 2);
    SimInput c = a;
    c.p2p = 0.1;
    double t0 = simulate(a).stepTime, t1 = simulate(c).stepTime;
    EXPECT_GT(t1, t0 + 0.1) << scheduleName(sched);
  }
}

TEST(SimComm, SendsSerializeOnTheirLane) {
  // A p2p slower than the forward: stage 0's sends queue back to back, so
  // the last stage receives micro-batch i at (i+1) p2p + f.
  SimInput in = uniform(PipelineSchedule::GPipe, 2, 4, 1, 1, 1);
  in.p2p = 3;
  SimResult r = simulate(in);
  for (const SimEvent &e : r.events)
    if (e.stage == 1 && e.op == SimOp::Forward)
      EXPECT_NEAR(e.start, 1 + 3.0 * (e.microBatch + 1), kEps) << e.name;
}

TEST(SimComm, TiedEmbeddingSyncWaitsForBothEndStages) {
  // 1F1B on 3 stages: stage 0 finishes last, at the pipeline's end. The
  // embedding's all-reduce between stages 0 and 2 starts when both have
  // finished their passes and gradient syncs, and both optimizers wait for
  // it; stage 1's does not.
  const int pp = 3;
  const int64_t m = 4;
  const double f = 1, b = 2, opt = 0.5, sync = 0.75, emb = 1.25;
  const double pipe = (m + pp - 1) * (f + b);
  SimInput in = uniform(PipelineSchedule::OneFOneB, pp, m, 1, f, b);
  for (SimStage &st : in.stages) {
    st.gradSync = sync;
    st.optimizer = opt;
  }
  in.gradOverlap = 0;
  in.embeddingSync = emb;
  SimResult r = simulate(in);
  EXPECT_NEAR(r.pipelineTime, pipe, kEps);
  EXPECT_NEAR(r.stepTime, pipe + sync + emb + opt, kEps);
  int syncs = 0;
  for (const SimEvent &e : r.events) {
    if (e.name == "embedding grad sync") {
      ++syncs;
      EXPECT_NE(e.stage, 1);
      EXPECT_EQ(e.lane, SimLane::DPComm);
      EXPECT_NEAR(e.start, pipe + sync, kEps);
      EXPECT_NEAR(e.end, pipe + sync + emb, kEps);
    }
    if (e.op == SimOp::Optimizer && e.stage != 1)
      EXPECT_NEAR(e.start, pipe + sync + emb, kEps) << e.stage;
    if (e.op == SimOp::Optimizer && e.stage == 1)
      EXPECT_LT(e.start, pipe + sync);
  }
  EXPECT_EQ(syncs, 2);
  // One stage: nothing to sum between stages.
  in = uniform(PipelineSchedule::OneFOneB, 1, m, 1, f, b);
  in.embeddingSync = emb;
  EXPECT_NEAR(simulate(in).stepTime, m * (f + b), kEps);
}

TEST(SimComm, GradSyncOverlap) {
  // 1F1B, uniform: stage 0 ends last; its last B lasts b = 2.
  const int pp = 3;
  const int64_t m = 4;
  const double f = 1, b = 2, opt = 0.5;
  const double pipe = (m + pp - 1) * (f + b);
  auto step = [&](double sync, double overlap) {
    SimInput in = uniform(PipelineSchedule::OneFOneB, pp, m, 1, f, b);
    for (SimStage &st : in.stages) {
      st.gradSync = sync;
      st.optimizer = opt;
    }
    in.gradOverlap = overlap;
    SimResult r = simulate(in);
    EXPECT_NEAR(r.pipelineTime, pipe, kEps);
    for (const SimEvent &e : r.events)
      if (e.op == SimOp::GradSync) {
        EXPECT_EQ(e.lane, SimLane::DPComm);
        EXPECT_NEAR(e.end - e.start, sync, kEps);
      }
    return r.stepTime;
  };
  EXPECT_NEAR(step(0, 1), pipe + opt, kEps);
  EXPECT_NEAR(step(1.5, 0), pipe + 1.5 + opt, kEps); // fully exposed
  EXPECT_NEAR(step(1.5, 1), pipe + opt, kEps);       // hidden in the last B
  // At half speed beside the B (2 s): 1 s of it done, 0.5 s left.
  EXPECT_NEAR(step(1.5, 0.5), pipe + 0.5 + opt, kEps);
  EXPECT_NEAR(step(5, 1), pipe + (5 - b) + opt, kEps); // longer than the B
  EXPECT_LT(step(1.5, 1), step(1.5, 0));
  // The last bucket (40% of the gradients) starts when the B ends.
  {
    SimInput in = uniform(PipelineSchedule::OneFOneB, pp, m, 1, f, b);
    for (SimStage &st : in.stages) {
      st.gradSync = 1.5;
      st.gradLastBucket = 0.4;
      st.optimizer = opt;
    }
    EXPECT_NEAR(simulate(in).stepTime, pipe + 0.6 + opt, kEps);
  }
  // Contention: the sync hidden in the last B (1.5 s beside it) takes 0.2
  // of each of those seconds from it, 0.3 s, which shows; at 0.1, 0.15 s
  // is less than the last bucket's 0.6 s.
  for (double loss : {0.2, 0.1}) {
    SimInput in = uniform(PipelineSchedule::OneFOneB, pp, m, 1, f, b);
    for (SimStage &st : in.stages) {
      st.gradSync = 1.5;
      st.gradLastBucket = loss == 0.2 ? 0.0 : 0.4;
      st.gradSyncLoss = loss;
      st.optimizer = opt;
    }
    EXPECT_NEAR(simulate(in).stepTime, pipe + (loss == 0.2 ? 0.3 : 0.6) + opt,
                kEps);
  }

  // Under zero-bubble the last weight-gradient task is a W.
  SimInput z = uniform(PipelineSchedule::ZeroBubble, pp, m, 1, f, b, 0.5);
  for (SimStage &st : z.stages)
    st.gradSync = 1.5;
  SimResult rz = simulate(z);
  EXPECT_NEAR(rz.stepTime, rz.pipelineTime + 1.5 - 0.5, kEps);
}

TEST(SimComm, InterleavedChunksSyncAsTheirLastBackwardEnds) {
  // pp = 2, v = 2, m = 2, F = 1, B = 2 a chunk, no sends. Stage 0's last
  // chunk-1 B ends a lap before its last chunk-0 B: each chunk's half of
  // the sync starts after its own last B, and they queue on one lane.
  const int pp = 2, v = 2;
  const int64_t m = 2;
  auto run = [&](double sync, double overlap, double gather) {
    SimInput in = uniform(PipelineSchedule::Interleaved1F1B, pp, m, v, 1, 2);
    for (SimStage &st : in.stages) {
      st.gradSync = sync;
      st.paramGather = gather;
    }
    in.gradOverlap = overlap;
    return simulate(in);
  };
  SimResult none = run(0, 0, 0);
  // Stage 0: its last B's (chunk 1, then chunk 0) and when they end.
  double b1 = 0, b0 = 0;
  for (const SimEvent &e : none.events)
    if (e.stage == 0 && e.op == SimOp::Backward && e.microBatch == m - 1)
      (e.chunk == 1 ? b1 : b0) = e.end;
  ASSERT_GT(b0, b1);
  const double lap = b0 - b1;
  // A short sync: chunk 1's half is done before chunk 0's B ends; only
  // chunk 0's half shows, after its B.
  SimResult shortSync = run(1, 0, 0);
  EXPECT_NEAR(shortSync.stepTime - none.stepTime, 0.5, kEps);
  int syncs = 0;
  for (const SimEvent &e : shortSync.events)
    if (e.op == SimOp::GradSync) {
      ++syncs;
      EXPECT_EQ(e.lane, SimLane::DPComm);
      EXPECT_NEAR(e.end - e.start, 0.5, kEps);
      EXPECT_EQ(e.name, "grad sync." + std::to_string(e.chunk));
      if (e.stage == 0)
        EXPECT_NEAR(e.start, e.chunk == 1 ? b1 : b0, kEps);
    }
  EXPECT_EQ(syncs, pp * v);
  // A sync of more than two laps: chunk 0's half queues behind chunk 1's.
  const double big = 2 * lap + 2;
  SimResult longSync = run(big, 0, 0);
  EXPECT_NEAR(longSync.stepTime, b1 + big, kEps);
  // The closed form says the same.
  EXPECT_NEAR(chunkedGradSyncExposed(0.5, 0.5, v, lap), 0.5, kEps);
  EXPECT_NEAR(chunkedGradSyncExposed(big / 2, big / 2, v, lap), big - lap,
              kEps);
  // With overlap each half hides behind its own B (2 s) up to overlap x
  // the half.
  EXPECT_NEAR(run(1, 1, 0).stepTime, none.stepTime, kEps);
  // ZeRO's parameter gather follows the optimizer, exposed.
  EXPECT_NEAR(run(1, 1, 0.75).stepTime, none.stepTime + 0.75, kEps);
}

TEST(SimComm, ZeroTwoReduceScattersEachMicroBatch) {
  // One stage, 1F1B, m = 4, F = 1, B = 2: B_i ends at 3 (i + 1). Under
  // ZeRO 2 each micro-batch's reduce-scatter follows its B on the dp-comm
  // lane; they queue.
  auto run = [](double rs) {
    SimInput in = uniform(PipelineSchedule::OneFOneB, 1, 4, 1, 1, 2);
    in.stages[0].gradSync = rs;
    in.stages[0].gradSyncPerMicroBatch = true;
    in.gradOverlap = 1;
    return simulate(in);
  };
  // Short: each hides in its B.
  SimResult hidden = run(1.5);
  EXPECT_NEAR(hidden.stepTime, 12, kEps);
  int syncs = 0;
  for (const SimEvent &e : hidden.events)
    if (e.op == SimOp::GradSync) {
      EXPECT_EQ(e.name, "grad sync " + std::to_string(e.microBatch));
      ++syncs;
    }
  EXPECT_EQ(syncs, 4);
  // Comm-bound: 4 s each, 2 s hidden in its B; the lane ends at 17
  // (5, 9, 13, 17), 5 s past the last B.
  EXPECT_NEAR(run(4).stepTime, 17, kEps);
  // The closed form with the backwards 3 s apart says the same; the
  // search charges them a backward (2 s) apart, which errs on the slow
  // side: 8 s.
  EXPECT_NEAR(chunkedGradSyncExposed(4, 2, 4, 3), 5, kEps);
  EXPECT_NEAR(chunkedGradSyncExposed(4, 2, 4, 2), 8, kEps);
}

TEST(SimHost, AHostBoundStepTakesTheHostsTime) {
  // One stage, m = 4, F = 1, B = 2 (12 s of passes), optimizer 0.5. The
  // host issues every F and B for a share of hostDispatch in proportion to
  // its device time, ahead of the device; the optimizer (a few
  // multi-tensor kernels) once everything is issued.
  auto run = [](double host) {
    SimInput in = uniform(PipelineSchedule::OneFOneB, 1, 4, 1, 1, 2);
    in.stages[0].optimizer = 0.5;
    in.stages[0].hostDispatch = host;
    return simulate(in);
  };
  SimResult none = run(0);
  EXPECT_NEAR(none.stepTime, 12.5, kEps);
  // Hidden: the host issues at 0.5 s per device second and stays ahead.
  SimResult hidden = run(6);
  EXPECT_NEAR(hidden.stepTime, 12.5, kEps);
  EXPECT_NEAR(hidden.pipelineTime, none.pipelineTime, kEps);
  // Host-bound: the last B ends when the host has issued it, at 20 s, and
  // the optimizer follows: 20.5 s, as the search's dispatch + tail has it.
  SimResult bound = run(20);
  EXPECT_NEAR(bound.pipelineTime, 20, kEps);
  EXPECT_NEAR(bound.stepTime, 20.5, kEps);
  // Each task waits for its issue: F0 is issued over [0, 5/3] and ends
  // then.
  int issues = 0;
  double hostEnd = 0;
  for (const SimEvent &e : bound.events) {
    if (e.lane == SimLane::Host) {
      ++issues;
      EXPECT_EQ(e.op, SimOp::Issue);
      EXPECT_EQ(e.name.rfind("issue ", 0), 0u) << e.name;
      EXPECT_NEAR(e.start, hostEnd, kEps) << e.name; // back to back
      hostEnd = e.end;
    }
    if (e.name == "F0")
      EXPECT_NEAR(e.end, 20.0 / 12, kEps);
  }
  EXPECT_EQ(issues, 4 + 4); // every F and B
  EXPECT_NEAR(hostEnd, 20, kEps);
  EXPECT_EQ(std::count_if(none.events.begin(), none.events.end(),
                          [](const SimEvent &e) {
                            return e.lane == SimLane::Host;
                          }),
            0);
}

TEST(SimHost, ASlowHostStretchesEveryStageOfAPipeline) {
  // GPipe, pp = 2, m = 4, F = B = 1: (m + pp - 1) * 2 = 10 s. With each
  // process issuing its stage's 8 s of device work in 16 s, stage 1's last
  // B ends when its host has issued it, at 16 s; the device alone would
  // end at 10.
  SimInput in = uniform(PipelineSchedule::GPipe, 2, 4, 1, 1, 1);
  SimResult dev = simulate(in);
  EXPECT_NEAR(dev.stepTime, 10, kEps);
  for (SimStage &st : in.stages)
    st.hostDispatch = 16;
  SimResult host = simulate(in);
  EXPECT_GE(host.stepTime, 16 - kEps);
  EXPECT_LE(host.stepTime, 16 + 2 + kEps); // at most one task's 2 s late
  // A host that is faster than its device changes nothing.
  for (SimStage &st : in.stages)
    st.hostDispatch = 4;
  EXPECT_NEAR(simulate(in).stepTime, 10, kEps);
}

//===----------------------------------------------------------------------===//
// Chrome trace
//===----------------------------------------------------------------------===//

TEST(SimTrace, ParsesWithMetadataAndCounts) {
  SimInput in = uniform(PipelineSchedule::Interleaved1F1B, 4, 8, 2, 0.5, 1);
  in.p2p = 0.05;
  for (SimStage &st : in.stages) {
    st.gradSync = 1;
    st.optimizer = 0.25;
    st.paramGather = 0.5;
  }
  SimResult r = simulate(in);
  std::string text = chromeTrace(r, "gpt \"tiny\"\n");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << text.substr(0, 400);
  ASSERT_TRUE(j.contains("traceEvents"));
  EXPECT_EQ(j["otherData"]["title"], "gpt \"tiny\"\n");
  EXPECT_DOUBLE_EQ(j["otherData"]["step_time_s"].get<double>(), r.stepTime);

  size_t complete = 0, counters = 0, processNames = 0, threadNames = 0;
  size_t memPoints = 0;
  for (const auto &pts : r.memory)
    memPoints += pts.size() + (pts.back().time < r.stepTime ? 1 : 0);
  std::map<std::string, size_t> byCat;
  for (const auto &e : j["traceEvents"]) {
    std::string ph = e["ph"];
    int pid = e["pid"];
    EXPECT_GE(pid, 0);
    EXPECT_LT(pid, 4);
    if (ph == "X") {
      ++complete;
      byCat[e["cat"].get<std::string>()]++;
      EXPECT_GE(e["dur"].get<double>(), 0);
      EXPECT_TRUE(e["tid"] == 0 || e["tid"] == 1 || e["tid"] == 2);
      EXPECT_NE(e["cat"], "issue"); // no host time given
    } else if (ph == "C") {
      ++counters;
      EXPECT_EQ(e["name"], "memory (GiB)");
      EXPECT_TRUE(e["args"]["GiB"].is_number());
    } else if (ph == "M" && e["name"] == "process_name") {
      ++processNames;
      EXPECT_EQ(e["args"]["name"], "stage " + std::to_string(pid));
    } else if (ph == "M" && e["name"] == "thread_name") {
      ++threadNames;
      int tid = e["tid"];
      EXPECT_EQ(e["args"]["name"], laneName(static_cast<SimLane>(tid)));
    }
  }
  EXPECT_EQ(complete, r.events.size());
  EXPECT_EQ(processNames, 4u);
  EXPECT_EQ(threadNames, 16u);
  EXPECT_EQ(counters, memPoints);
  EXPECT_EQ(byCat["forward"], 4u * 8 * 2);
  EXPECT_EQ(byCat["backward"], 4u * 8 * 2);
  EXPECT_EQ(byCat["grad-sync"], 4u * 2); // one per chunk
  EXPECT_EQ(byCat["param-gather"], 4u);
  EXPECT_EQ(byCat["optimizer"], 4u);
  // Every virtual-stage boundary sends each micro-batch both ways.
  EXPECT_EQ(byCat["send"], 2u * (4 * 2 - 1) * 8);

  // The first event: F0.0 on stage 0 at 0 for 0.5 s = 500000 us.
  const SimEvent &e0 = r.events.front();
  EXPECT_EQ(e0.name, "F0.0");
  for (const auto &e : j["traceEvents"])
    if (e["ph"] == "X" && e["name"] == "F0.0" && e["pid"] == 0) {
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 0);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 500000);
      EXPECT_EQ(e["args"]["micro_batch"], 0);
      EXPECT_EQ(e["args"]["chunk"], 0);
    }
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

TEST(SimValidation, EveryError) {
  SimInput ok = uniform(PipelineSchedule::OneFOneB, 2, 4, 1, 1, 2, 1);
  EXPECT_TRUE(simulateStep(ok).isOk());

  SimInput in = ok;
  in.stages[1].hostDispatch = -1;
  EXPECT_NE(errorOf(in).find("stage 1 hostDispatch"), std::string::npos)
      << errorOf(in);

  in = ok;
  in.stages.clear();
  EXPECT_NE(errorOf(in).find("at least one pipeline stage"), std::string::npos);

  in = ok;
  in.microBatches = 0;
  EXPECT_NE(errorOf(in).find("at least one micro-batch, got 0"),
            std::string::npos);

  in = ok;
  in.virtualStages = 0;
  EXPECT_NE(errorOf(in).find("virtualStages >= 1, got 0"), std::string::npos);

  for (auto sched : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB,
                     PipelineSchedule::ZeroBubble}) {
    in = ok;
    in.schedule = sched;
    in.virtualStages = 2;
    EXPECT_NE(errorOf(in).find("needs the interleaved schedule"),
              std::string::npos)
        << scheduleName(sched);
  }

  in = ok;
  in.schedule = PipelineSchedule::Interleaved1F1B;
  in.virtualStages = 2;
  in.microBatches = 3;
  EXPECT_NE(errorOf(in).find("micro-batches (3) divisible by the pipeline "
                             "stages (2)"),
            std::string::npos);

  for (double bad : {-1.0, std::nan(""), HUGE_VAL}) {
    in = ok;
    in.embeddingSync = bad;
    std::string msg = errorOf(in);
    EXPECT_NE(msg.find("embeddingSync"), std::string::npos) << msg;
    EXPECT_NE(msg.find("finite value >= 0"), std::string::npos) << msg;
  }

  const std::pair<const char *, double SimStage::*> fields[] = {
      {"forward", &SimStage::forward},
      {"backward", &SimStage::backward},
      {"weightGrad", &SimStage::weightGrad},
      {"staticBytes", &SimStage::staticBytes},
      {"activationBytes", &SimStage::activationBytes},
      {"transientBytes", &SimStage::transientBytes},
      {"gradSync", &SimStage::gradSync},
      {"paramGather", &SimStage::paramGather},
      {"tpGradSync", &SimStage::tpGradSync},
      {"optimizer", &SimStage::optimizer}};
  for (auto [name, field] : fields)
    for (double bad : {-1.0, std::nan(""), HUGE_VAL}) {
      in = ok;
      in.stages[1].*field = bad;
      std::string msg = errorOf(in);
      EXPECT_NE(msg.find(std::string("stage 1 ") + name), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("finite value >= 0"), std::string::npos) << msg;
    }

  for (double bad : {-0.1, 1.0, std::nan("")}) {
    in = ok;
    in.stages[1].gradSyncLoss = bad;
    EXPECT_NE(errorOf(in).find("stage 1 gradSyncLoss: expected a share in "
                               "[0, 1)"),
              std::string::npos)
        << errorOf(in);
  }
  in = ok;
  in.p2p = -0.5;
  EXPECT_NE(errorOf(in).find("p2p: expected a finite value"),
            std::string::npos);
  in = ok;
  in.p2p = std::nan("");
  EXPECT_NE(errorOf(in).find("p2p"), std::string::npos);

  in = ok;
  in.stages[0].weightGrad = 2.5;
  EXPECT_NE(errorOf(in).find("stage 0 weightGrad: expected at most backward"),
            std::string::npos);

  for (double bad : {-0.1, 1.1, std::nan("")}) {
    in = ok;
    in.gradOverlap = bad;
    EXPECT_NE(errorOf(in).find("gradOverlap: expected a value in [0, 1]"),
              std::string::npos);
  }

  in = ok;
  in.microBatches = int64_t(1) << 30;
  EXPECT_NE(errorOf(in).find("2^24"), std::string::npos);
}

//===----------------------------------------------------------------------===//
// Scale
//===----------------------------------------------------------------------===//

TEST(SimScale, LargeInterleavedPipeline) {
  SimInput in =
      uniform(PipelineSchedule::Interleaved1F1B, 64, 512, 4, 0.25, 0.5);
  in.p2p = 0.01;
  for (SimStage &st : in.stages)
    st.gradSync = 1;
  auto t0 = std::chrono::steady_clock::now();
  auto r = simulateStep(in);
  auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(r.isOk()) << r.status().message();
  std::string trace = chromeTrace(*r, "scale");
  auto t2 = std::chrono::steady_clock::now();
  EXPECT_EQ(r->stageBusy.size(), 64u);
  EXPECT_GT(r->stepTime, 512 * 4 * 0.75);
  std::printf("pp=64 m=512 v=4: %zu events, simulate %.1f ms, trace %.1f ms "
              "(%.1f MB)\n",
              r->events.size(),
              std::chrono::duration<double, std::milli>(t1 - t0).count(),
              std::chrono::duration<double, std::milli>(t2 - t1).count(),
              trace.size() / 1e6);
}
TEST(Simulator, SendsInClosedFormMatchTheReplay) {
  // Equal stages, sends no longer than a stage's forward: the closed form
  // (fill and drain hops, 1F1B's steady-state waits) is the replay's time
  // less the compute-only schedule, (m - 1 + pp) (F + B). (Interleaved, the
  // replay of equal chunks waits 2 (pp v - 1) hops, but the closed form
  // keeps 2 (pp - 1): docs/simulator.md says why.)
  for (PipelineSchedule sched :
       {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB})
    for (double B : {1.0, 2.0, 3.0})
      for (int pp : {2, 4, 8})
        for (int m : {2, 4, 8, 16, 32})
          for (double c : {0.1, 0.25}) {
            SimInput in;
            in.schedule = sched;
            in.microBatches = m;
            in.p2p = c;
            for (int s = 0; s < pp; ++s) {
              SimStage st;
              st.forward = 1;
              st.backward = B;
              in.stages.push_back(st);
            }
            auto r = simulateStep(in);
            ASSERT_TRUE(r) << r.status().message();
            const double compute = (m - 1 + pp) * (1 + B);
            EXPECT_NEAR(r->pipelineTime - compute,
                        pipelineSendTime(sched, true, pp, m, c), 1e-9)
                << "schedule " << int(sched) << " B " << B << " pp " << pp
                << " m " << m << " c " << c;
          }
  // By hand: 1F1B, pp = 4, m = 8: 2 x 3 hops + 2 (3 x 7 - 1) / 4 = 16 sends.
  EXPECT_DOUBLE_EQ(pipelineSendTime(PipelineSchedule::OneFOneB, true, 4, 8, 1),
                   16);
  // Interleaved and zero-bubble: the fill and drain hops only.
  EXPECT_DOUBLE_EQ(
      pipelineSendTime(PipelineSchedule::Interleaved1F1B, true, 4, 8, 1), 6);
  EXPECT_DOUBLE_EQ(
      pipelineSendTime(PipelineSchedule::ZeroBubble, true, 4, 8, 1), 6);
  // Forward only: pp - 1 hops; one stage: none.
  EXPECT_DOUBLE_EQ(pipelineSendTime(PipelineSchedule::GPipe, false, 4, 8, 1), 3);
  EXPECT_DOUBLE_EQ(pipelineSendTime(PipelineSchedule::OneFOneB, true, 1, 8, 1), 0);
}
TEST(Simulator, MakespanOfStagesThatDifferIsTheReplay) {
  // By hand: 1F1B, 4 stages (F, B) = (1, 2) except a slower stage 1 (1.5,
  // 3), 8 micro-batches. Stage 1 runs 3 forwards by 5.5, but micro-batch
  // 0's backward comes back from stages 2 and 3 only at 1 + 1.5 + 6 = 8.5;
  // then 5 forwards and 8 backwards, 40, and stage 0's last backward, 42.
  // The closed form the search used before, sum t + (m - 1) t_max, says 45:
  // it made every stage after the slowest one wait as if it were the last.
  EXPECT_DOUBLE_EQ(pipelineMakespan(PipelineSchedule::OneFOneB, {1, 1.5, 1, 1},
                                    {3, 4.5, 3, 3}, {}, 8),
                   42);
  // Equal stages: (m + pp - 1)(F + B); zero-bubble with W <= min(F, B):
  // (pp - 1)(F + B - W) + m (F + B) at m >= pp.
  EXPECT_DOUBLE_EQ(
      pipelineMakespan(PipelineSchedule::OneFOneB, {1, 1, 1}, {3, 3, 3}, {}, 5),
      21);
  EXPECT_DOUBLE_EQ(pipelineMakespan(PipelineSchedule::ZeroBubble, {1, 1, 1},
                                    {3, 3, 3}, {1, 1, 1}, 5),
                   2 * (1 + 1 - 1) + 5 * 3);
  // GPipe: the forwards at stage 0's pace (1.5 from stage 1 on), the
  // backwards at stage 1's (3): sum F + (m - 1) max F + sum B + (m - 1)
  // max B, where sum t + (m - 1) max t would say the same only if one
  // stage were the slowest both ways. Stages (2, 1) forward and (2, 3)
  // backward, 4 micro-batches: 3 + 6 + 5 + 9 = 23 (the old form: 8 + 3 x
  // 4 = 20).
  EXPECT_DOUBLE_EQ(
      pipelineMakespan(PipelineSchedule::GPipe, {2, 1}, {4, 4}, {}, 4), 23);
  // Interleaving, mismatched sizes and too many tasks: no figure.
  EXPECT_LT(
      pipelineMakespan(PipelineSchedule::Interleaved1F1B, {1}, {3}, {}, 2), 0);
  EXPECT_LT(pipelineMakespan(PipelineSchedule::OneFOneB, {1, 1}, {3}, {}, 2),
            0);
  EXPECT_LT(pipelineMakespan(PipelineSchedule::ZeroBubble, {1}, {3}, {}, 2), 0);
  // Times the replay refuses: a weight gradient longer than the
  // backward, a negative or non-finite time.
  EXPECT_LT(
      pipelineMakespan(PipelineSchedule::ZeroBubble, {1, 1}, {2, 2}, {3, 3}, 2),
      0);
  EXPECT_LT(
      pipelineMakespan(PipelineSchedule::OneFOneB, {1, -1}, {3, 3}, {}, 2), 0);
  EXPECT_LT(pipelineMakespan(PipelineSchedule::GPipe, {1, NAN}, {3, 3}, {}, 2),
            0);
  EXPECT_LT(pipelineMakespan(
                PipelineSchedule::OneFOneB, std::vector<double>(64, 1.0),
                std::vector<double>(64, 3.0), {}, kMaxMakespanTasks / 64 + 1),
            0);
  // Against the replay (no sends, no collectives): stages of random
  // forwards, backwards and weight gradients, 2-8 stages, 1 to 3 pp
  // micro-batches; each stage's end too.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.5, 2.0);
  for (PipelineSchedule sched :
       {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB,
        PipelineSchedule::ZeroBubble})
    for (int pp : {2, 3, 4, 8})
      for (int m : {1, 2, pp - 1, pp, pp + 1, 3 * pp})
        for (int draw = 0; draw < 4; ++draw) {
          if (m < 1)
            continue;
          SimInput in;
          in.schedule = sched;
          in.microBatches = m;
          std::vector<double> fwd, all, wg;
          for (int s = 0; s < pp; ++s) {
            SimStage st;
            st.forward = u(rng);
            st.backward = 2 * u(rng);
            if (sched == PipelineSchedule::ZeroBubble)
              st.weightGrad = st.backward * 0.5 * u(rng) / 2;
            in.stages.push_back(st);
            fwd.push_back(st.forward);
            all.push_back(st.forward + st.backward);
            wg.push_back(st.weightGrad);
          }
          auto r = simulateStep(in);
          ASSERT_TRUE(r) << r.status().message();
          std::vector<double> finish;
          const double span = pipelineMakespan(
              sched, fwd, all,
              sched == PipelineSchedule::ZeroBubble ? wg
                                                    : std::vector<double>{},
              m, &finish);
          EXPECT_NEAR(span, r->pipelineTime, 1e-9 * r->pipelineTime)
              << "schedule " << int(sched) << " pp " << pp << " m " << m;
          ASSERT_EQ(finish.size(), size_t(pp));
          EXPECT_DOUBLE_EQ(*std::max_element(finish.begin(), finish.end()),
                           span);
          // Each stage's end, which the search's per-stage gradient syncs
          // read: the replay's last forward, backward or weight gradient
          // on that stage.
          std::vector<double> last(size_t(pp), 0.0);
          for (const SimEvent &e : r->events)
            if (e.lane == SimLane::Compute &&
                (e.op == SimOp::Forward || e.op == SimOp::Backward ||
                 e.op == SimOp::WeightGrad))
              last[size_t(e.stage)] = std::max(last[size_t(e.stage)], e.end);
          for (int s = 0; s < pp; ++s)
            EXPECT_NEAR(finish[size_t(s)], last[size_t(s)],
                        1e-9 * r->pipelineTime)
                << "schedule " << int(sched) << " pp " << pp << " m " << m
                << " stage " << s;
        }
}
TEST(Simulator, SlowestStageHidesTheSteadyStateSends) {
  // A slower last stage (the LM head's) gives the others slack: the mean
  // cycle through the pipeline, mean t + 2 (pp-1) c / pp per micro-batch,
  // binds only past t_max. With the slack the closed form is within 0.2% of
  // the replay; without it, 2-12% above.
  for (double slow : {1.05, 1.2, 2.0})
    for (int pp : {4, 8})
      for (double c : {0.1, 0.3})
        for (int m : {8, 32}) {
          SimInput in;
          in.schedule = PipelineSchedule::OneFOneB;
          in.microBatches = m;
          in.p2p = c;
          double sum = 0, mx = 0;
          for (int s = 0; s < pp; ++s) {
            const double k = s == pp - 1 ? slow : 1.0;
            SimStage st;
            st.forward = k;
            st.backward = 2 * k;
            in.stages.push_back(st);
            sum += 3 * k;
            mx = std::max(mx, 3 * k);
          }
          auto r = simulateStep(in);
          ASSERT_TRUE(r) << r.status().message();
          const double base = (m - 1) * mx + sum;
          const double closed =
              base + pipelineSendTime(in.schedule, true, pp, m, c,
                                      mx - sum / pp);
          EXPECT_NEAR(closed / r->pipelineTime, 1.0, 0.002)
              << "slow " << slow << " pp " << pp << " c " << c << " m " << m;
          const double blind =
              base + pipelineSendTime(in.schedule, true, pp, m, c, 0);
          EXPECT_GT(blind / r->pipelineTime, 1.015);
        }
}

TEST(SimClosedForm, InterleavedSendsWaitEveryLap) {
  // Interleaved 1F1B's first forward and last backward pass through all
  // pp v virtual stages. Equal stages: 2 (pp v - 1) sends, exactly as the
  // replay, for sends up to a chunk's forward. One slower stage (the LM
  // head's): the others' slack hides part of the laps after the first;
  // within 3.5% of the replay, where charging 2 (pp v - 1) hops was 20%
  // over and 2 (pp - 1) hops up to 24% under.
  double worstUniform = 0, worstSlow = 0, worstOld = 0;
  for (int pp : {2, 4, 8})
    for (int v : {2, 3, 4, 6})
      for (int64_t m : {int64_t(pp), int64_t(2 * pp), int64_t(4 * pp)})
        for (double slow : {1.0, 1.05, 1.1, 1.3, 2.0})
          for (double B : {1.0, 2.0})
            for (int ci = 0; ci <= 8; ++ci) {
              const double f = 1, c = ci * 0.125 * f / v;
              SimInput in = uniform(PipelineSchedule::Interleaved1F1B, pp, m,
                                    v, f / v, B / v);
              in.stages.back().forward *= slow;
              in.stages.back().backward *= slow;
              in.p2p = c;
              SimResult r = simulate(in);
              const double tmax = slow * (f + B),
                           sum = (pp - 1) * (f + B) + tmax;
              const double compute = double(m) * tmax + (sum - tmax) / v;
              const double closed =
                  compute + pipelineSendTime(PipelineSchedule::Interleaved1F1B,
                                             true, pp, m, c, tmax - sum / pp, v);
              const double e = std::fabs(closed / r.pipelineTime - 1);
              (slow == 1.0 ? worstUniform : worstSlow) =
                  std::max(slow == 1.0 ? worstUniform : worstSlow, e);
              worstOld = std::max(
                  worstOld, std::fabs((compute + 2 * (pp - 1) * c) /
                                          r.pipelineTime -
                                      1));
            }
  EXPECT_LT(worstUniform, 1e-9);
  EXPECT_LT(worstSlow, 0.035);
  EXPECT_GT(worstOld, 0.2);
  // By hand: pp = 4, v = 2, equal stages, one send of 1: 2 x 7 hops.
  EXPECT_DOUBLE_EQ(
      pipelineSendTime(PipelineSchedule::Interleaved1F1B, true, 4, 8, 1, 0, 2),
      14);
  // A slack of 2 v per micro-batch hides the laps after the first.
  EXPECT_DOUBLE_EQ(
      pipelineSendTime(PipelineSchedule::Interleaved1F1B, true, 4, 8, 1, 4, 2),
      6);
}
