//===- Pipeline.cpp - Cut a training step into pipeline stages -----------===//
//
// dlopt-pipeline (docs/parallel.md, "Pipeline stages"): places every op of a
// training step on a pipeline stage, makes one function per stage with
// dlopt.send_recv where values cross stages, and orders each stage's
// micro-batch tasks by the schedule the planner's simulator replays
// (planner::pipelineOrder).
//
// Placement. A forward op runs on its plan stage (dlopt.stage, keyed by its
// dlopt.id); the chunks of interleaving are the runs of equal stages in id
// order. Backward and recomputed ops (dlopt.fwd_id) run with their forward
// op. Any other op that reads a placed value runs, if it belongs to a
// micro-batch (dlopt.mb), with the operand that the pipeline produces last
// (forwards in increasing, backwards in decreasing virtual stage), so it
// never waits for work scheduled after it; otherwise (accumulation,
// clipping, the update) with its largest operand, so that only small values
// travel. Ops that read only constants and arguments are replicated on every
// stage that uses them; a micro-batch's one (a ZeRO-3 gather) used on one
// stage joins its user's task. Arguments live where they are used.
//
// Order. Each stage runs its tasks in schedule order, each task's ops in
// program order. The sends of a task and the receives of the next one are
// one send_recv (posted together: neither side of 1F1B's exchange waits for
// the other). Ops outside the micro-batches run as soon as their operands
// are there; what needs a value from another stage outside the tasks runs
// after the last task (the tail), where every stage orders its transfers by
// the program position of the value's producer: one global order, so the
// tail cannot deadlock even with blocking sends. The executable's load-time
// check (runtime/format/CommOrder.h) proves the whole step.
//
//===----------------------------------------------------------------------===//

#include "dialects/DLOpt/IR/DLOptDialect.h"
#include "dialects/DLOpt/IR/DLOptOps.h"
#include "passes/ModelUtils.h"
#include "passes/Passes.h"
#include "planner/Search.h"
#include "planner/Simulator.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SmallBitVector.h"

#include <limits>
#include <functional>
#include <map>
#include <tuple>

namespace dlopt {
#define GEN_PASS_DEF_PIPELINEPASS
#include "passes/Passes.h.inc"
} // namespace dlopt

using namespace mlir;
using namespace dlopt;
using dlopt::dl::DLOptDialect;
using planner::PipelineTask;

namespace {

constexpr llvm::StringLiteral kAxis = "pp";
constexpr int64_t kMaxStages = 1024;
constexpr int64_t kMaxVirtual = 64;
constexpr int64_t kMaxMicroBatches = 1024;

bool markedBackward(Operation *op) {
  return op->hasAttr(DLOptDialect::kBackwardAttr) ||
         op->hasAttr(DLOptDialect::kRecomputeAttr);
}

int64_t bytesOf(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  if (!t || !t.hasStaticShape())
    return 0;
  return t.getNumElements() *
         std::max<int64_t>(1, t.getElementType().getIntOrFloatBitWidth() / 8);
}

/// A micro-batch task of one stage: (kind, chunk, micro-batch).
using TaskKey = std::tuple<int, int, int64_t>;

struct PipelinePass : dlopt::impl::PipelinePassBase<PipelinePass> {
  using PipelinePassBase::PipelinePassBase;

  func::FuncOp fn;
  int64_t P = 2, V = 2;
  SmallVector<Operation *> ops;
  llvm::DenseMap<Operation *, unsigned> pos;
  /// Placed ops: their virtual stage (physical stage = vs % P).
  llvm::DenseMap<Operation *, int64_t> vs;
  /// Placed ops of the backward pass: marked so, or placed with a backward
  /// operand (autodiff's sums of gradient contributions carry no mark).
  llvm::DenseSet<Operation *> backward;
  bool isBackward(Operation *op) const { return backward.count(op); }
  /// Replicated ops (constants, what reads only constants and arguments):
  /// the stages that run them.
  llvm::DenseMap<Operation *, llvm::SmallBitVector> rep;
  /// Arguments: the stages that hold them.
  SmallVector<llvm::SmallBitVector> homes;
  /// The functions made so far (erased again on failure).
  SmallVector<func::FuncOp> stageFns;
  /// Per returned value: the stages that must hold it (its update's target).
  llvm::DenseMap<Value, llvm::SmallBitVector> retNeed;

  InFlightDiagnostic bad() {
    signalPassFailure();
    return fn.emitError() << "dlopt-pipeline: ";
  }

  llvm::SmallBitVector stagesOf(Operation *op) {
    if (auto it = vs.find(op); it != vs.end()) {
      llvm::SmallBitVector s(P);
      s.set(it->second % P);
      return s;
    }
    if (auto it = rep.find(op); it != rep.end())
      return it->second;
    return llvm::SmallBitVector(P);
  }

  /// Where a value is read: the stages of its users (and of its update's
  /// target when returned).
  llvm::SmallBitVector usersOf(Value v) {
    llvm::SmallBitVector s(P);
    for (Operation *u : v.getUsers()) {
      if (isa<func::ReturnOp>(u))
        continue;
      s |= stagesOf(u);
    }
    if (auto it = retNeed.find(v); it != retNeed.end())
      s |= it->second;
    return s;
  }

  void runOnOperation() override;
  LogicalResult place(const std::map<int64_t, int64_t> &vsOfId);
  bool sumPerStage();
  LogicalResult build(ArrayRef<std::vector<PipelineTask>> orders,
                      bool zeroBubble);
};

void PipelinePass::runOnOperation() {
  ModuleOp module = getOperation();
  FailureOr<func::FuncOp> entryFn = findEntryFunction(module, entry);
  if (failed(entryFn))
    return signalPassFailure();
  fn = *entryFn;
  P = stages;
  if (P < 2 || P > kMaxStages) {
    bad() << "expects stages in [2, " << kMaxStages << "], got " << P;
    return;
  }
  if (virtualStages < 1 || virtualStages > kMaxVirtual) {
    bad() << "expects virtual-stages in [1, " << kMaxVirtual << "], got "
          << int64_t(virtualStages);
    return;
  }
  if (microBatches < 1 || microBatches > kMaxMicroBatches) {
    bad() << "expects micro-batches in [1, " << kMaxMicroBatches << "], got "
          << int64_t(microBatches);
    return;
  }
  V = P * virtualStages;
  std::optional<planner::PipelineSchedule> parsed =
      planner::parseSchedule(schedule);
  if (!parsed) {
    bad() << "unknown schedule '" << schedule
          << "'; expected gpipe, 1f1b, interleaved-1f1b or zero-bubble";
    return;
  }
  planner::PipelineSchedule sched = *parsed;
  if (!fn->hasAttr(DLOptDialect::kTrainStepAttr)) {
    bad() << "expects a training step (after dlopt-optimizer)";
    return;
  }
  if (meshAxisIndex(module, kAxis) >= 0) {
    bad() << "the module already has a '" << kAxis << "' mesh axis";
    return;
  }
  std::vector<std::vector<PipelineTask>> orders;
  for (int64_t s = 0; s < P; ++s) {
    auto o = planner::pipelineOrder(sched, P, s, microBatches,
                                    int(virtualStages));
    if (!o) {
      bad() << o.status().message();
      return;
    }
    orders.push_back(o.take());
  }

  // The plan's stage of every forward op, and its chunk: the runs of equal
  // stages in id (program) order visit 0, 1, ..., P-1, virtual-stages times.
  std::map<int64_t, int64_t> stageOfId;
  for (Operation &op : fn.getBody().front().without_terminator()) {
    auto id = op.getAttrOfType<IntegerAttr>(DLOptDialect::kIdAttr);
    auto st = op.getAttrOfType<IntegerAttr>(DLOptDialect::kStageAttr);
    if (!id || !st)
      continue;
    if (st.getInt() < 0 || st.getInt() >= P) {
      op.emitError() << "dlopt-pipeline: dlopt.stage " << st.getInt()
                     << " outside [0, " << P << ")";
      return signalPassFailure();
    }
    auto [it, fresh] = stageOfId.emplace(id.getInt(), st.getInt());
    if (!fresh && it->second != st.getInt()) {
      op.emitError() << "dlopt-pipeline: op id " << id.getInt()
                     << " is on stage " << st.getInt() << " here and on stage "
                     << it->second << " elsewhere";
      return signalPassFailure();
    }
  }
  if (stageOfId.empty()) {
    bad() << "no forward op carries a dlopt.stage (the plan's stage of each "
             "op)";
    return;
  }
  std::map<int64_t, int64_t> vsOfId;
  int64_t run = -1, prev = -1, prevId = -1;
  for (auto [id, st] : stageOfId) {
    if (st != prev) {
      ++run;
      if (run >= V || st != run % P) {
        bad() << "the forward ops' stages, in program order, must go through "
                 "stages 0 to "
              << P - 1 << " in turn (" << int64_t(virtualStages)
              << " time(s), one model chunk each); op id " << id
              << " is on stage " << st << " after op id " << prevId
              << " on stage " << prev;
        return;
      }
      prev = st;
    }
    prevId = id;
    vsOfId[id] = run;
  }
  if (run + 1 != V) {
    bad() << "the forward ops form " << run + 1 << " model chunk(s) over the "
          << "stages; expected stages x virtual-stages = " << V
          << " (a stage without ops?)";
    return;
  }

  if (failed(place(vsOfId)))
    return;
  // Gradients summed from two stages per micro-batch (a tied embedding's)
  // are summed per stage over the micro-batches first: placed again.
  if (sumPerStage()) {
    ops.clear();
    pos.clear();
    vs.clear();
    backward.clear();
    rep.clear();
    homes.clear();
    retNeed.clear();
    if (failed(place(vsOfId)))
      return;
  }
  if (failed(build(orders, sched == planner::PipelineSchedule::ZeroBubble))) {
    for (func::FuncOp f : stageFns)
      f.erase();
    return signalPassFailure();
  }

  // The mesh gains the stage axis, major; the collectives' grid axes shift.
  MLIRContext *ctx = &getContext();
  SmallVector<Attribute> axes{StringAttr::get(ctx, kAxis)};
  SmallVector<int64_t> shape{P};
  if (auto mesh = module->getAttrOfType<DictionaryAttr>("dlopt.mesh")) {
    llvm::append_range(axes, cast<ArrayAttr>(mesh.get("axes")).getValue());
    llvm::append_range(shape,
                       cast<DenseI64ArrayAttr>(mesh.get("shape")).asArrayRef());
  }
  module->setAttr("dlopt.mesh", meshAttr(ctx, axes, shape));
  module.walk([&](Operation *op) {
    if (auto grid = dyn_cast<shard::GridOp>(op)) {
      SmallVector<int64_t> s{P};
      llvm::append_range(s, grid.getShape());
      op->setAttr("shape", DenseI64ArrayAttr::get(ctx, s));
      return;
    }
    if (op->getDialect() && isa<shard::ShardDialect>(op->getDialect()))
      if (auto a = op->getAttrOfType<DenseI16ArrayAttr>("grid_axes")) {
        SmallVector<int16_t> shifted;
        for (int16_t x : a.asArrayRef())
          shifted.push_back(int16_t(x + 1));
        op->setAttr("grid_axes", DenseI16ArrayAttr::get(ctx, shifted));
      }
  });
}

LogicalResult PipelinePass::place(const std::map<int64_t, int64_t> &vsOfId) {
  Block &body = fn.getBody().front();
  for (Operation &op : body.without_terminator()) {
    pos[&op] = unsigned(ops.size());
    ops.push_back(&op);
  }
  auto timeKey = [&](Operation *d) {
    int64_t v = vs.lookup(d);
    return isBackward(d) ? 2 * V - 1 - v : v;
  };
  // Ops placed by their own id (a forward op) or their forward op's.
  llvm::DenseSet<Operation *> anchored;
  for (Operation *op : ops) {
    if (isa<arith::ConstantOp>(op))
      continue;
    std::optional<int64_t> s;
    for (StringRef attr : {DLOptDialect::kIdAttr, DLOptDialect::kFwdIdAttr})
      if (auto id = op->getAttrOfType<IntegerAttr>(attr); id && !s)
        if (auto it = vsOfId.find(id.getInt()); it != vsOfId.end())
          s = it->second;
    if (s)
      anchored.insert(op);
    if (!s) {
      bool inMicroBatch = op->hasAttr(DLOptDialect::kMicroBatchAttr);
      Operation *best = nullptr;
      int64_t bestBytes = -1;
      for (Value o : op->getOperands()) {
        Operation *d = o.getDefiningOp();
        if (!d || !vs.count(d))
          continue;
        bool better;
        if (!best)
          better = true;
        else if (inMicroBatch)
          better = timeKey(d) > timeKey(best);
        else
          better = bytesOf(o) > bestBytes ||
                   (bytesOf(o) == bestBytes && timeKey(d) > timeKey(best));
        if (better) {
          best = d;
          bestBytes = bytesOf(o);
        }
      }
      if (best) {
        s = vs.lookup(best);
        if (isBackward(best))
          backward.insert(op);
      }
    }
    if (s)
      vs[op] = *s;
    if (s && markedBackward(op))
      backward.insert(op);
  }
  // An all-gather placed with its operand whose readers all run on one
  // other virtual stage, in the same pass, runs there instead: the shard
  // crosses the stages, not the gathered value (the axis size times its
  // bytes). Sequence parallelism's backward pass gathers each stage's
  // input gradient for the previous stage's last matmuls so.
  for (Operation *op : ops) {
    if (!isa<shard::AllGatherOp>(op) || anchored.contains(op) ||
        !vs.count(op) || op->use_empty())
      continue;
    std::optional<int64_t> target;
    bool movable = true;
    for (Operation *u : op->getUsers()) {
      if (!anchored.contains(u) || isBackward(u) != isBackward(op) ||
          (target && *target != vs.lookup(u))) {
        movable = false;
        break;
      }
      target = vs.lookup(u);
    }
    if (movable && *target != vs.lookup(op))
      vs[op] = *target;
  }

  // Replicated ops and arguments: where they are read (a fixpoint, as an
  // updated state is needed where its argument lives, and vice versa).
  homes.assign(fn.getNumArguments(), llvm::SmallBitVector(P));
  llvm::StringMap<unsigned> argOf;
  for (unsigned i = 0; i < fn.getNumArguments(); ++i)
    for (StringRef k : {DLOptDialect::kParamAttr, DLOptDialect::kStateAttr,
                        DLOptDialect::kInputAttr})
      if (auto n = fn.getArgAttrOfType<StringAttr>(i, k))
        argOf[n.getValue()] = i;
  Operation *ret = body.getTerminator();
  for (Operation *op : ops)
    if (!vs.count(op))
      rep[op] = llvm::SmallBitVector(P);
  auto fixpoint = [&]() {
  for (bool changed = true; changed;) {
    changed = false;
    for (unsigned r = 0; r < ret->getNumOperands(); ++r) {
      Value v = ret->getOperand(r);
      llvm::SmallBitVector need(P);
      if (auto u = fn.getResultAttrOfType<StringAttr>(r, DLOptDialect::kUpdateAttr))
        if (auto it = argOf.find(u.getValue()); it != argOf.end())
          need = homes[it->second];
      llvm::SmallBitVector &cur = retNeed.try_emplace(v, P).first->second;
      if ((cur | need) != cur) {
        cur |= need;
        changed = true;
      }
    }
    for (Operation *op : llvm::reverse(ops)) {
      auto it = rep.find(op);
      if (it == rep.end())
        continue;
      llvm::SmallBitVector s(P);
      for (Value r : op->getResults())
        s |= usersOf(r);
      if ((it->second | s) != it->second) {
        it->second |= s;
        changed = true;
      }
    }
    for (BlockArgument a : fn.getArguments()) {
      llvm::SmallBitVector s = usersOf(a);
      if ((homes[a.getArgNumber()] | s) != homes[a.getArgNumber()]) {
        homes[a.getArgNumber()] |= s;
        changed = true;
      }
    }
  }
  };
  fixpoint();
  // An argument read nowhere but by its own update (a step counter without
  // a schedule) lives on the first stage; a value read nowhere (an output
  // such as the learning rate) is computed on the last, where the loss is.
  for (unsigned i = 0; i < homes.size(); ++i)
    if (homes[i].none())
      homes[i].set(0);
  fixpoint();
  for (Operation *op : ops)
    if (auto it = rep.find(op); it != rep.end() && it->second.none())
      it->second.set(P - 1);
  fixpoint();
  // A micro-batch's replicated op used on one stage only (a ZeRO-3 gather)
  // joins the task of its first user there, so it runs per micro-batch.
  for (Operation *op : llvm::reverse(ops)) {
    auto it = rep.find(op);
    if (it == rep.end() || !op->hasAttr(DLOptDialect::kMicroBatchAttr) ||
        it->second.count() != 1)
      continue;
    Operation *first = nullptr;
    bool allPlaced = true;
    for (Value r : op->getResults())
      for (Operation *u : r.getUsers()) {
        if (!vs.count(u)) {
          allPlaced = false;
          continue;
        }
        if (!first || pos[u] < pos[first])
          first = u;
      }
    if (!allPlaced || !first)
      continue;
    vs[op] = vs.lookup(first);
    if (isBackward(first))
      backward.insert(op);
    rep.erase(it);
  }
  return success();
}

/// A sum over the micro-batches (ops outside them, `((t0 + t1) + t2) ...`)
/// of per-micro-batch sums `ti = ai + bi` whose terms come from two stages
/// (a tied embedding: the head's gradient on the last stage, the lookup's on
/// the first) would send a whole gradient per micro-batch. It becomes
/// `(a0 + a1 + ...) + (b0 + b1 + ...)`: each stage sums its own terms and
/// one gradient crosses, as Megatron-LM all-reduces the embedding gradient
/// of the first and last stage once per step. (The sum is reassociated: it
/// differs from one device's by rounding.) Returns whether it changed the
/// step.
bool PipelinePass::sumPerStage() {
  auto physOf = [&](Value v) -> int64_t {
    Operation *d = v.getDefiningOp();
    auto it = d ? vs.find(d) : vs.end();
    return it == vs.end() ? -1 : it->second % P;
  };
  auto isAdd = [](Operation *op) { return op && isa<dl::AddOp>(op); };
  auto inMicroBatch = [](Operation *op) {
    return op->hasAttr(DLOptDialect::kMicroBatchAttr);
  };
  bool changed = false;
  llvm::DenseSet<Operation *> seen;
  for (Operation *root : llvm::reverse(ops)) {
    // (Erased ops are in `seen`: test it before touching the op.)
    if (seen.count(root) || !isAdd(root) || inMicroBatch(root))
      continue;
    // The chain's inner adds (outside the micro-batches, used once by it)
    // and its leaves, in program order.
    SmallVector<Operation *> inner{root}, leaves;
    bool ok = true;
    std::function<void(Value)> walk = [&](Value v) {
      Operation *d = v.getDefiningOp();
      if (isAdd(d) && !inMicroBatch(d) && d->hasOneUse()) {
        inner.push_back(d);
        walk(d->getOperand(0));
        walk(d->getOperand(1));
      } else if (isAdd(d) && inMicroBatch(d) && d->hasOneUse()) {
        leaves.push_back(d);
      } else {
        ok = false;
      }
    };
    walk(root->getOperand(0));
    walk(root->getOperand(1));
    for (Operation *op : inner)
      seen.insert(op);
    for (Operation *op : leaves)
      seen.insert(op);
    if (!ok || leaves.size() < 2)
      continue;
    int64_t p = physOf(leaves[0]->getOperand(0)),
            q = physOf(leaves[0]->getOperand(1));
    if (p < 0 || q < 0 || p == q)
      continue;
    Type type = root->getResult(0).getType();
    for (Operation *l : leaves)
      ok = ok && physOf(l->getOperand(0)) == p &&
           physOf(l->getOperand(1)) == q && l->getResult(0).getType() == type &&
           l->getOperand(0).getType() == type &&
           l->getOperand(1).getType() == type;
    if (!ok)
      continue;
    llvm::sort(leaves, [&](Operation *a, Operation *b) {
      return a->isBeforeInBlock(b);
    });
    OpBuilder b(root);
    Value sums[2];
    for (int side = 0; side < 2; ++side)
      for (Operation *l : leaves) {
        Value t = l->getOperand(side);
        if (!sums[side]) {
          sums[side] = t;
          continue;
        }
        // Marked as backward work: fusion then keeps each stage's sum apart
        // from what follows the exchange (fused with it, the sum would run
        // after the exchange and keep every term alive until then).
        auto add = dl::AddOp::create(b, root->getLoc(), type, sums[side], t);
        add->setAttr(DLOptDialect::kBackwardAttr, b.getUnitAttr());
        // One mark per micro-batch: fusion keeps the running sums apart.
        if (Operation *d = t.getDefiningOp())
          if (Attribute mb = d->getAttr(DLOptDialect::kMicroBatchAttr))
            add->setAttr(DLOptDialect::kAccumulateAttr, mb);
        sums[side] = add.getResult();
      }
    Value total =
        dl::AddOp::create(b, root->getLoc(), type, sums[0], sums[1]).getResult();
    root->getResult(0).replaceAllUsesWith(total);
    for (Operation *op : inner)
      op->erase();
    for (Operation *l : leaves)
      l->erase();
    changed = true;
  }
  return changed;
}

LogicalResult PipelinePass::build(ArrayRef<std::vector<PipelineTask>> orders,
                                  bool zeroBubble) {
  Block &body = fn.getBody().front();
  Operation *ret = body.getTerminator();
  MLIRContext *ctx = fn.getContext();

  auto physical = [&](Operation *op) { return vs.lookup(op) % P; };
  auto inTask = [&](Operation *op) {
    return vs.count(op) && op->hasAttr(DLOptDialect::kMicroBatchAttr);
  };
  auto taskOf = [&](Operation *op) -> TaskKey {
    auto mb = op->getAttrOfType<IntegerAttr>(DLOptDialect::kMicroBatchAttr);
    return {isBackward(op) ? int(PipelineTask::Backward)
                           : int(PipelineTask::Forward),
            int(vs.lookup(op) / P), mb ? mb.getInt() : 0};
  };
  for (Operation *op : ops)
    if (inTask(op)) {
      int64_t mb = std::get<2>(taskOf(op));
      if (mb < 0 || mb >= int64_t(microBatches))
        return op->emitError() << "dlopt-pipeline: micro-batch " << mb
                               << " outside [0, " << int64_t(microBatches)
                               << "); the step has another number of "
                                  "micro-batches than the schedule";
    }

  // Transfers: (value, from stage, to stage). A value read by a task on
  // the receiving stage crosses during the tasks; any other in the tail.
  struct Transfer {
    Value v;
    int64_t from, to;
    bool inTasks;
  };
  SmallVector<Transfer> transfers;
  for (Operation *op : ops) {
    if (!vs.count(op))
      continue;
    int64_t p = physical(op);
    for (Value r : op->getResults()) {
      llvm::SmallBitVector need = usersOf(r);
      for (int64_t q = 0; q < P; ++q) {
        if (q == p || !need.test(q))
          continue;
        bool consumerTask = false;
        for (Operation *u : r.getUsers())
          if (inTask(u) && physical(u) == q)
            consumerTask = true;
        transfers.push_back({r, p, q, consumerTask});
      }
    }
  }

  // Zero-bubble: a backward task's ops that no transfer depends on are its
  // deferred weight-gradient part.
  llvm::DenseSet<Operation *> weightGrad;
  if (zeroBubble) {
    llvm::DenseSet<Operation *> critical;
    SmallVector<Operation *> work;
    for (const Transfer &t : transfers)
      if (Operation *d = t.v.getDefiningOp(); d && inTask(d) && isBackward(d))
        work.push_back(d);
    while (!work.empty()) {
      Operation *op = work.pop_back_val();
      if (!critical.insert(op).second)
        continue;
      for (Value o : op->getOperands())
        if (Operation *d = o.getDefiningOp();
            d && inTask(d) && taskOf(d) == taskOf(op))
          work.push_back(d);
    }
    for (Operation *op : ops)
      if (inTask(op) && isBackward(op) && !critical.count(op))
        weightGrad.insert(op);
  }
  auto describe = [&](TaskKey k) {
    const char *kinds = "FBW";
    return std::string(1, kinds[std::get<0>(k)]) +
           std::to_string(std::get<2>(k)) +
           (V > P ? "." + std::to_string(std::get<1>(k)) : "");
  };
  auto keyOf = [&](Operation *op) {
    TaskKey k = taskOf(op);
    if (weightGrad.count(op))
      std::get<0>(k) = int(PipelineTask::WeightGrad);
    return k;
  };

  // Every stage's function, built side by side.
  struct Stage {
    func::FuncOp fn;
    OpBuilder b;
    IRMapping map;
    std::vector<SmallVector<Operation *>> taskOps;
    SmallVector<Operation *> loose; // ops outside the tasks, program order
    size_t looseFirst = 0;
    llvm::DenseSet<Operation *> emitted;
    size_t next = 0; // the next task to run
    SmallVector<unsigned> results;
  };
  std::vector<Stage> st;
  st.reserve(size_t(P));
  OpBuilder mb(fn);
  for (int64_t s = 0; s < P; ++s) {
    const std::vector<PipelineTask> &order = orders[size_t(s)];
    std::map<TaskKey, unsigned> orderIndex;
    for (unsigned i = 0; i < order.size(); ++i)
      orderIndex[{int(order[i].kind), order[i].chunk, order[i].microBatch}] = i;
    std::vector<SmallVector<Operation *>> taskOps(order.size());
    SmallVector<Operation *> loose;
    for (Operation *op : ops) {
      if (!stagesOf(op).test(s))
        continue;
      if (inTask(op)) {
        auto it = orderIndex.find(keyOf(op));
        if (it == orderIndex.end())
          return op->emitError() << "dlopt-pipeline: no task of stage " << s
                                 << "'s schedule runs this op (task "
                                 << describe(keyOf(op)) << ")";
        taskOps[it->second].push_back(op);
      } else {
        loose.push_back(op);
      }
    }

    // The function: this stage's arguments and results.
    SmallVector<Type> argTypes;
    SmallVector<DictionaryAttr> argAttrs;
    SmallVector<unsigned> argIndex;
    for (BlockArgument a : fn.getArguments())
      if (homes[a.getArgNumber()].test(s)) {
        argTypes.push_back(a.getType());
        argAttrs.push_back(fn.getArgAttrDict(a.getArgNumber()));
        argIndex.push_back(a.getArgNumber());
      }
    SmallVector<unsigned> results;
    for (unsigned r = 0; r < ret->getNumOperands(); ++r) {
      Value v = ret->getOperand(r);
      bool here;
      if (auto it = retNeed.find(v); it != retNeed.end() && it->second.any())
        here = it->second.test(s);
      else if (auto a = dyn_cast<BlockArgument>(v))
        here = homes[a.getArgNumber()].test(s);
      else
        here = stagesOf(v.getDefiningOp()).test(s);
      if (here)
        results.push_back(r);
    }
    SmallVector<Type> resultTypes;
    for (unsigned r : results)
      resultTypes.push_back(ret->getOperand(r).getType());
    std::string name = (fn.getSymName() + ".stage" + std::to_string(s)).str();
    auto sfn = func::FuncOp::create(mb, fn.getLoc(), name,
                                    FunctionType::get(ctx, argTypes, resultTypes));
    stageFns.push_back(sfn);
    for (NamedAttribute a : fn->getDiscardableAttrs())
      sfn->setAttr(a.getName(), a.getValue());
    sfn->setAttr(DLOptDialect::kStageAttr,
                 IntegerAttr::get(IntegerType::get(ctx, 64), s));
    for (unsigned i = 0; i < argAttrs.size(); ++i) {
      if (argAttrs[i])
        sfn.setArgAttrs(i, argAttrs[i]);
      // The step's argument order: parameters are initialized by their
      // index in it, whatever the stage.
      sfn.setArgAttr(i, "dlopt.arg",
                     IntegerAttr::get(IntegerType::get(ctx, 64), argIndex[i]));
    }
    for (auto [i, r] : llvm::enumerate(results)) {
      if (DictionaryAttr d = fn.getResultAttrDict(r))
        sfn.setResultAttrs(unsigned(i), d);
      sfn.setResultAttr(unsigned(i), "dlopt.result",
                        IntegerAttr::get(IntegerType::get(ctx, 64), r));
    }
    Block *entryBlock = sfn.addEntryBlock();
    Stage stage{sfn, OpBuilder::atBlockEnd(entryBlock), IRMapping(),
                std::move(taskOps), std::move(loose), 0, {}, 0, results};
    for (auto [i, a] : llvm::enumerate(argIndex))
      stage.map.map(fn.getArgument(a), entryBlock->getArgument(unsigned(i)));
    st.push_back(std::move(stage));
  }

  // Replicated ops (reading only arguments and constants) run where
  // first needed, not as early as possible: a ZeRO slice of a parameter
  // hoisted to the start would be held all step.
  auto isRepHere = [&](int64_t s, Operation *d) {
    auto it = d ? rep.find(d) : rep.end();
    return it != rep.end() && it->second.test(s);
  };
  std::function<bool(int64_t, Value)> canHave = [&](int64_t s, Value v) {
    if (st[size_t(s)].map.contains(v))
      return true;
    Operation *d = v.getDefiningOp();
    return isRepHere(s, d) &&
           llvm::all_of(d->getOperands(), [&](Value o) { return canHave(s, o); });
  };
  std::function<void(int64_t, Value)> ensure = [&](int64_t s, Value v) {
    Stage &S = st[size_t(s)];
    Operation *d = v.getDefiningOp();
    if (S.map.contains(v) || !isRepHere(s, d) || S.emitted.count(d))
      return;
    for (Value o : d->getOperands())
      ensure(s, o);
    if (llvm::all_of(d->getOperands(), [&](Value o) { return S.map.contains(o); })) {
      S.b.clone(*d, S.map);
      S.emitted.insert(d);
    }
  };
  auto emitOp = [&](int64_t s, Operation *op) -> LogicalResult {
    Stage &S = st[size_t(s)];
    for (Value o : op->getOperands())
      ensure(s, o);
    for (auto [i, o] : llvm::enumerate(op->getOperands()))
      if (!S.map.contains(o)) {
        InFlightDiagnostic d =
            op->emitError() << "dlopt-pipeline: on stage " << s
                            << ", this op would run before its operand #" << i
                            << " is there";
        if (auto a = dyn_cast<BlockArgument>(o))
          d << " (argument #" << a.getArgNumber() << " of the step, which "
            << "stage " << s << " does not hold; the op is '" << op->getName()
            << "')";
        if (Operation *def = o.getDefiningOp())
          d.attachNote(def->getLoc())
              << "operand defined by '" << def->getName() << "' here ("
              << (vs.count(def) ? "stage " + std::to_string(physical(def))
                                : std::string("replicated"))
              << (inTask(def) ? ", task " + describe(keyOf(def)) : "")
              << "); the op is '" << op->getName() << "' ("
              << (inTask(op) ? "task " + describe(keyOf(op))
                             : std::string("outside the micro-batches"))
              << ")";
        return failure();
      }
    S.b.clone(*op, S.map);
    return success();
  };
  // One send_recv on stage s: the sends, then the receives.
  auto exchange = [&](int64_t s, ArrayRef<unsigned> sends,
                      ArrayRef<unsigned> recvs) {
    if (sends.empty() && recvs.empty())
      return;
    Stage &S = st[size_t(s)];
    SmallVector<Value> in;
    SmallVector<int64_t> to, from;
    SmallVector<Type> types;
    Location loc = fn.getLoc();
    for (unsigned t : sends) {
      in.push_back(S.map.lookup(transfers[t].v));
      to.push_back(transfers[t].to);
      loc = transfers[t].v.getLoc();
    }
    for (unsigned t : recvs) {
      types.push_back(transfers[t].v.getType());
      from.push_back(transfers[t].from);
      loc = transfers[t].v.getLoc();
    }
    auto op = dl::SendRecvOp::create(S.b, loc, types, in,
                                     S.b.getDenseI64ArrayAttr(to),
                                     S.b.getDenseI64ArrayAttr(from),
                                     S.b.getStringAttr(kAxis));
    for (auto [i, t] : llvm::enumerate(recvs))
      S.map.map(transfers[t].v, op.getResult(unsigned(i)));
  };
  // Ops outside the tasks run as soon as their operands are there.
  auto flush = [&](int64_t s) {
    Stage &S = st[size_t(s)];
    for (size_t i = S.looseFirst; i < S.loose.size(); ++i) {
      Operation *op = S.loose[i];
      if (S.emitted.count(op) || isRepHere(s, op) ||
          !llvm::all_of(op->getOperands(),
                        [&](Value v) { return canHave(s, v); }))
        continue;
      for (Value v : op->getOperands())
        ensure(s, v);
      S.b.clone(*op, S.map);
      S.emitted.insert(op);
    }
    while (S.looseFirst < S.loose.size() &&
           (S.emitted.count(S.loose[S.looseFirst]) ||
            isRepHere(s, S.loose[S.looseFirst])))
      ++S.looseFirst;
  };
  auto runnable = [&](int64_t s) {
    Stage &S = st[size_t(s)];
    if (S.next >= S.taskOps.size())
      return false;
    llvm::DenseSet<Operation *> inside(S.taskOps[S.next].begin(),
                                       S.taskOps[S.next].end());
    for (Operation *op : S.taskOps[S.next])
      for (Value o : op->getOperands())
        if (!canHave(s, o) &&
            !(o.getDefiningOp() && inside.count(o.getDefiningOp())))
          return false;
    return true;
  };

  // The tasks, in lockstep rounds: in each round every stage runs its next
  // task if its inputs are there, then every value a task will read on
  // another stage crosses as soon as it exists, each stage's transfers of
  // the round in one send_recv. Each round's send_recvs pair only with
  // each other and every stage reaches them, so the rounds cannot deadlock
  // whatever a send waits for; transfers between two stages keep one order
  // on both sides (first in, first out, as NCCL pairs them).
  SmallVector<bool> done(transfers.size(), false);
  for (;;) {
    bool progress = false, finished = true;
    for (int64_t s = 0; s < P; ++s) {
      flush(s);
      if (runnable(s)) {
        Stage &S = st[size_t(s)];
        for (Operation *op : S.taskOps[S.next])
          if (failed(emitOp(s, op)))
            return failure();
        ++S.next;
        progress = true;
        flush(s);
      }
      finished = finished && st[size_t(s)].next >= st[size_t(s)].taskOps.size();
    }
    std::vector<SmallVector<unsigned>> sends(static_cast<size_t>(P)),
        recvs(static_cast<size_t>(P));
    for (unsigned t = 0; t < transfers.size(); ++t) {
      const Transfer &x = transfers[t];
      if (done[t] || !x.inTasks || !st[size_t(x.from)].map.contains(x.v))
        continue;
      sends[size_t(x.from)].push_back(t);
      recvs[size_t(x.to)].push_back(t);
      done[t] = true;
      progress = true;
    }
    for (int64_t s = 0; s < P; ++s)
      exchange(s, sends[size_t(s)], recvs[size_t(s)]);
    if (finished && llvm::all_of(sends, [](auto &v) { return v.empty(); }))
      break;
    if (!progress) {
      for (int64_t s = 0; s < P; ++s) {
        Stage &S = st[size_t(s)];
        if (S.next >= S.taskOps.size())
          continue;
        for (Operation *op : S.taskOps[S.next])
          for (Value o : op->getOperands())
            if (!S.map.contains(o) && o.getDefiningOp() &&
                !llvm::is_contained(S.taskOps[S.next], o.getDefiningOp()))
              return op->emitError()
                     << "dlopt-pipeline: stage " << s << "'s task "
                     << describe(keyOf(op))
                     << " waits for a value no stage produces before it "
                        "under this schedule";
      }
      return fn.emitError() << "dlopt-pipeline: the schedule cannot proceed";
    }
  }

  // The tail: the rest in program order, each transfer at its producer's
  // position (the same order on every stage, so it cannot deadlock).
  for (int64_t s = 0; s < P; ++s) {
    Stage &S = st[size_t(s)];
    flush(s);
    struct Item {
      uint64_t key;
      Operation *op;
      unsigned transfer;
    };
    SmallVector<Item> tail;
    for (Operation *op : S.loose)
      if (!S.emitted.count(op))
        tail.push_back({uint64_t(pos[op]) * 2, op, 0});
    for (unsigned t = 0; t < transfers.size(); ++t) {
      const Transfer &x = transfers[t];
      if (done[t] || (x.from != s && x.to != s))
        continue;
      tail.push_back({uint64_t(pos[x.v.getDefiningOp()]) * 2 + 1, nullptr, t});
    }
    // Equal keys are transfers of one value: by receiving stage.
    std::stable_sort(tail.begin(), tail.end(), [&](const Item &a, const Item &c) {
      if (a.key != c.key)
        return a.key < c.key;
      return !a.op && !c.op && transfers[a.transfer].to < transfers[c.transfer].to;
    });
    for (const Item &it : tail) {
      if (it.op) {
        if (S.emitted.count(it.op))
          continue; // a replicated op some earlier op needed
        if (failed(emitOp(s, it.op)))
          return failure();
        S.emitted.insert(it.op);
        continue;
      }
      const Transfer &x = transfers[it.transfer];
      if (x.from == s) {
        if (!S.map.contains(x.v))
          return x.v.getDefiningOp()->emitError()
                 << "dlopt-pipeline: stage " << s
                 << " has not computed this value when it must send it";
        exchange(s, {it.transfer}, {});
      } else {
        exchange(s, {}, {it.transfer});
      }
    }
    SmallVector<Value> outs;
    for (unsigned r : S.results) {
      Value v = ret->getOperand(r);
      if (!S.map.contains(v))
        return fn.emitError() << "dlopt-pipeline: result #" << r
                              << " is not computed on stage " << s;
      outs.push_back(S.map.lookup(v));
    }
    func::ReturnOp::create(S.b, ret->getLoc(), outs);
  }
  fn.erase();
  return success();
}

} // namespace
