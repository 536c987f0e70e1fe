//===- Simulator.h - Discrete-event simulation of one pipelined step ------===//
//
// Replays one training step of a pipeline-parallel plan task by task: each
// stage runs its forwards and backwards strictly in the order of its
// schedule (GPipe, 1F1B, Megatron-LM's interleaved 1F1B, zero-bubble ZB-H1),
// each waits for its input from the neighbouring stage, activations and
// gradients travel on a p2p lane, the data-parallel gradient sync runs on its
// own lane and the optimizer closes the step. The result is the step time,
// the bubble, a memory timeline per stage and every event, which
// chromeTrace() turns into a trace for Perfetto. Semantics: docs/simulator.md.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/MemoryModel.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dlopt::planner {

/// One pipeline stage, i.e. one device (its tp/dp replicas behave alike).
/// Times in seconds, sizes in bytes; all finite and >= 0.
struct SimStage {
  /// One micro-batch's forward through ONE model chunk of this stage (with v
  /// virtual stages a stage holds v chunks), tensor-parallel comm included.
  double forward = 0;
  /// One micro-batch's backward through one chunk: input gradient plus
  /// weight gradient, recompute included.
  double backward = 0;
  /// The weight-gradient part of `backward` (0 <= weightGrad <= backward);
  /// only zero-bubble schedules run it as a separate, deferred task.
  double weightGrad = 0;
  double staticBytes = 0;     ///< params, grads, optimizer state, buffers
  double activationBytes = 0; ///< kept per micro-batch per chunk
  double transientBytes = 0;  ///< extra working set while a backward runs
  /// Data-parallel gradient sync of the whole stage (all-reduce, or
  /// reduce-scatter under ZeRO), on the stage's dp-comm lane.
  double gradSync = 0;
  /// The share (0-1) of gradSync in the last gradient bucket, which is
  /// complete only when the last weight-gradient task ends.
  double gradLastBucket = 0;
  /// Seconds of compute lost per second the gradient sync runs beside a
  /// task (0-1: its SMs and memory traffic, Ctx::overlapSlowdown): the
  /// task waits for the larger of the sync's exposure and what it lost.
  double gradSyncLoss = 0;
  /// ZeRO 2: gradSync is one micro-batch's reduce-scatter, run after each
  /// micro-batch's weight-gradient task of each chunk (gradSync / v a
  /// chunk), not once at the end of the step.
  bool gradSyncPerMicroBatch = false;
  /// Sequence parallelism: the tensor-parallel all-reduce of the stage's
  /// weight gradients over sequence-split rows (norms, learned positions),
  /// once per step on the compute lane after the stage's last task and
  /// before its optimizer step.
  double tpGradSync = 0;
  double optimizer = 0; ///< optimizer step, on the compute lane, at the end
  /// ZeRO 1 and 2: the all-gather of the updated parameter shards, on the
  /// dp-comm lane after the optimizer; the step ends with it.
  double paramGather = 0;
  /// Seconds the host spends issuing this stage's step (its process's
  /// kernel launches). The host runs ahead of the device on its own lane,
  /// issuing the forwards, backwards and weight gradients in order, each
  /// for a share of this time in proportion to its device time; a task
  /// starts no earlier than its issue starts and ends no earlier than its
  /// issue ends. The optimizer (a few multi-tensor kernels) starts once
  /// everything is issued. 0: not modelled.
  double hostDispatch = 0;
};

struct SimInput {
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  int virtualStages = 1;    ///< v: chunks per stage, > 1 only if interleaved
  int64_t microBatches = 1; ///< m per step
  std::vector<SimStage> stages; ///< pp entries, stage 0 first
  /// One activation or gradient send between adjacent stages. Sends run on
  /// the sender's p2p lane: they overlap compute and serialize with each
  /// other.
  double p2p = 0;
  /// The speed in [0, 1] at which a stage's gradSync runs beside its last
  /// weight-gradient task (the last B, or the last W under zero-bubble),
  /// as bucketed all-reduces do; the last bucket (gradLastBucket) runs
  /// after it. With that task on [bs, be] the sync ends at
  /// be + max(gradSync - gradOverlap (be - bs), gradLastBucket gradSync,
  /// min(gradSync, gradOverlap (be - bs)) gradSyncLoss), as
  /// CostModel::exposedGradSync prices it. Interleaved, each chunk syncs
  /// gradSync / v so, after its own last B, and the chunks' syncs queue on
  /// the dp-comm lane.
  double gradOverlap = 1.0;
  /// Tied embeddings with pp > 1: the all-reduce of the shared embedding's
  /// gradient between the first and the last stage (Megatron-LM's embedding
  /// group), once both have finished their passes and gradient syncs and
  /// before either's optimizer step. 0: none.
  double embeddingSync = 0;
};

enum class SimLane { Compute, P2P, DPComm, Host };
/// "compute", "p2p", "dp-comm", "host".
const char *laneName(SimLane l);

enum class SimOp {
  Forward,
  Backward,
  WeightGrad,
  Send,
  GradSync,
  ParamGather, ///< ZeRO's gather of the updated parameters
  Optimizer,
  Issue ///< the host issuing a compute task's launches
};
/// "forward", "backward", "weight-grad", "send", "grad-sync",
/// "param-gather", "optimizer", "issue".
const char *opName(SimOp o);

struct SimEvent {
  int stage = 0; ///< the stage whose lane runs it (the sender for a Send)
  SimLane lane = SimLane::Compute;
  SimOp op = SimOp::Forward;
  /// "F3", "B3", "W3" (micro-batch 3; "F3.1" for chunk 1 when v > 1),
  /// "send F3" / "send B3.1", "grad sync", "optimizer", "issue F3" /
  /// "issue optimizer" on the host lane.
  std::string name;
  int64_t microBatch = -1; ///< -1 for the step's syncs and optimizer
  int chunk = -1;          ///< model chunk on this stage; -1 as above
  int peer = -1;           ///< receiving stage of a Send, else -1
  double start = 0, end = 0;
};

/// A step function: `bytes` holds from `time` until the next point.
struct SimMemoryPoint {
  double time = 0;
  double bytes = 0;
};

struct SimResult {
  /// End of the last optimizer step (of the last compute task when there is
  /// no gradient sync or optimizer time).
  double stepTime = 0;
  /// End of the last forward/backward/weight-gradient task on any stage.
  double pipelineTime = 0;
  /// Idle share of the pipeline phase [0, pipelineTime] on the busiest
  /// stage: 1 - max(stageBusy) / pipelineTime. Uniform stages, no p2p:
  /// (pp-1)/(m+pp-1) for GPipe and 1F1B.
  double bubbleFraction = 0;
  std::vector<double> stageBusy;  ///< forward+backward(+W) seconds per stage
  std::vector<double> peakMemory; ///< bytes per stage
  /// Per stage: static + activationBytes x (chunk forwards started whose
  /// backward, or W under zero-bubble, has not ended) + transientBytes while
  /// a B or W runs; a point at t = 0 and at every change.
  std::vector<std::vector<SimMemoryPoint>> memory;
  /// Sorted by start, then stage, then lane, then issue order.
  std::vector<SimEvent> events;
};

/// One compute task of a stage's schedule: the forward, the backward (input
/// gradient, and the weight gradient too unless the schedule defers it) or
/// the deferred weight gradient of micro-batch `microBatch` through the
/// stage's model chunk `chunk` (0 unless interleaved).
struct PipelineTask {
  enum Kind : uint8_t { Forward, Backward, WeightGrad } kind = Forward;
  int chunk = 0;
  int64_t microBatch = 0;
};

/// The order in which stage `stage` of `pp` runs its tasks under `schedule`
/// with `m` micro-batches and `v` chunks per stage: the order the simulator
/// replays and the order dlopt-pipeline gives each stage's program. Errors
/// as simulateStep's (m < 1, v < 1, v > 1 without interleaving, interleaving
/// with m % pp != 0, too many pairs) and a stage outside [0, pp).
Expected<std::vector<PipelineTask>> pipelineOrder(PipelineSchedule schedule,
                                                  int64_t pp, int64_t stage,
                                                  int64_t m, int v);

/// The time the stage-boundary sends add to a pipelined step in closed
/// form, each send taking `oneSend` seconds (docs/simulator.md, "Sends in
/// closed form"):
///   - the first micro-batch's forward and the last one's backward wait for
///     every hop: pp - 1 each way;
///   - under 1F1B each steady-state backward also waits for the next
///     stage's gradient, 2 oneSend ((pp-1)(m-1) - 1) / pp in all for m >= pp
///     and 2 oneSend max(0, m - 2) for m < pp, less what the slowest stage
///     hides: (m - 1) `slack`, where slack = t_max - mean_s t_s per
///     micro-batch (the mean cycle through the pipeline, mean t + 2 (pp-1)
///     oneSend / pp per micro-batch, only binds when it exceeds t_max);
///   - interleaved with `v` chunks a stage, the first forward and the last
///     backward pass through all pp v virtual stages: pp v - 1 hops each
///     way, of which the pp (v - 1) beyond the first lap's can hide in the
///     slack of the stages that wait for the slowest: pp (v - 1) max(0,
///     2 oneSend - slack / v) on top of the 2 (pp - 1) hops;
///   - GPipe, interleaving and zero-bubble hide the steady-state sends.
/// For GPipe, 1F1B and interleaving it equals simulateStep's replay for
/// equal stages and sends no longer than a stage's (a chunk's) forward;
/// with one slower stage the interleaved form is within 1% of the replay
/// (checked in SimulatorTest).
/// The gradient sync a stage exposes after its last weight-gradient task,
/// when its `v` model chunks sync their `share` each as the chunk's last
/// backward ends (Megatron-LM's per-chunk buckets), the chunks' last
/// backwards end `spacing` seconds apart, a share alone exposes
/// `exposedShare` after its backward, and the shares queue on one lane:
/// the recursion end_j = max(end_{j-1} + share, be_j + exposedShare) over
/// be_j = -(v-1-j) spacing. For v = 1 it is `exposedShare`.
double chunkedGradSyncExposed(double share, double exposedShare, int v,
                              double spacing);
/// The same for ZeRO 2's reduce-scatters of `count` micro-batches, each
/// `share` seconds, started as its micro-batch's backward ends and exposing
/// `exposedShare` alone, queued on one lane, when the last `lateCount` gaps
/// between backwards' ends are `late` seconds and the ones before `early`
/// (1F1B's cooldown runs backwards back to back, its steady state one
/// forward and one backward per micro-batch).
double queuedGradSyncExposed(double share, double exposedShare, int64_t count,
                             double late, int64_t lateCount, double early);

double pipelineSendTime(PipelineSchedule schedule, bool train, int64_t pp,
                        int64_t m, double oneSend, double slack = 0,
                        int virtualStages = 1);

/// Above this many (stage, micro-batch) pairs pipelineMakespan gives no
/// figure (about 0.1 ms of work at the limit).
constexpr int64_t kMaxMakespanTasks = 1 << 14;

/// The step of a GPipe, 1F1B or zero-bubble pipeline without sends, from
/// each stage's forward `fwd[s]`, whole time `all[s]` and (zero-bubble)
/// weight-gradient part `weightGrad[s]` per micro-batch, over `m`
/// micro-batches: the finish of the last task when every stage runs its
/// order (the simulator's) as soon as each task's input is ready
/// (docs/simulator.md, "Stages that differ"). `finish`, when given,
/// receives each stage's end of its last task, and `gradEnds` each
/// stage's ends of the tasks that complete a micro-batch's gradients (its
/// backwards; zero-bubble's weight gradients), in the order it runs them.
/// Returns a negative value (the caller keeps its closed form) for
/// interleaving, where pp * m exceeds `kMaxMakespanTasks`, for sizes that do
/// not match and for times the replay refuses (negative or not finite, a
/// forward longer than the whole, a weight gradient longer than the backward).
double pipelineMakespan(PipelineSchedule schedule,
                        const std::vector<double> &fwd,
                        const std::vector<double> &all,
                        const std::vector<double> &weightGrad, int64_t m,
                        std::vector<double> *finish = nullptr,
                        std::vector<std::vector<double>> *gradEnds = nullptr);

/// Simulates one step. Errors name the offending field: no stages, m < 1,
/// v < 1, v > 1 without interleaving, interleaving with m % pp != 0, a
/// negative or non-finite time or size, weightGrad > backward, gradOverlap
/// outside [0, 1], more than 2^24 (micro-batch, virtual stage) pairs.
Expected<SimResult> simulateStep(const SimInput &in);

/// Chrome trace JSON (opens in ui.perfetto.dev or chrome://tracing): one
/// process per stage ("stage N"), threads "compute", "p2p", "dp-comm" and
/// "host",
/// complete events (ph "X", microseconds) and a "memory (GiB)" counter per
/// stage; `title` and the headline numbers go to "otherData".
std::string chromeTrace(const SimResult &r, const std::string &title);

} // namespace dlopt::planner
