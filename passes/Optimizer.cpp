//===- Optimizer.cpp - Gradient accumulation, LR schedule, clipping, update ===//
#include "dialects/DLOpt/IR/DLOptOps.h"
#include "passes/ModelUtils.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <cmath>
#include <map>

#define DEBUG_TYPE "dlopt-optimizer"

namespace dlopt {
#define GEN_PASS_DEF_OPTIMIZERPASS
#include "passes/Passes.h.inc"
} // namespace dlopt

using namespace mlir;
using namespace dlopt;
using dl::DLOptDialect;

namespace {

/// Scalar and tensor arithmetic helpers on dlopt ops.
struct Emit {
  OpBuilder &b;
  Location loc;

  Value scalar(Type elem, double v) {
    auto t = RankedTensorType::get({}, elem);
    return arith::ConstantOp::create(
        b, loc, t, DenseElementsAttr::get(t, b.getFloatAttr(elem, v)));
  }
  Value f32(double v) { return scalar(b.getF32Type(), v); }
  Value like(Value x, double v) {
    return scalar(cast<RankedTensorType>(x.getType()).getElementType(), v);
  }
  Value add(Value x, Value y) { return dl::AddOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return dl::SubOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return dl::MulOp::create(b, loc, x, y); }
  Value div(Value x, Value y) { return dl::DivOp::create(b, loc, x, y); }
  Value min(Value x, Value y) { return dl::MinimumOp::create(b, loc, x, y); }
  Value max(Value x, Value y) { return dl::MaximumOp::create(b, loc, x, y); }
  Value sqrt(Value x) { return dl::SqrtOp::create(b, loc, x); }
  Value pow(Value x, Value y) { return dl::PowOp::create(b, loc, x, y); }
  Value tanh(Value x) { return dl::TanhOp::create(b, loc, x); }
  /// Casts a rank-0 scalar to the element type of `x` (no-op if equal).
  Value castLike(Value s, Value x) {
    Type elem = cast<RankedTensorType>(x.getType()).getElementType();
    auto t = RankedTensorType::get({}, elem);
    if (s.getType() == t)
      return s;
    return dl::CastOp::create(b, loc, t, s);
  }
  Value toF32(Value x) {
    auto t = cast<RankedTensorType>(x.getType());
    if (t.getElementType().isF32())
      return x;
    return dl::CastOp::create(b, loc, RankedTensorType::get(t.getShape(), b.getF32Type()), x);
  }
  /// Sum of all elements, as an f32 scalar.
  Value sumAll(Value x) {
    auto t = cast<RankedTensorType>(x.getType());
    SmallVector<int64_t> dims;
    for (int64_t d = 0; d < t.getRank(); ++d)
      dims.push_back(d);
    return dl::SumOp::create(b, loc, toF32(x), b.getDenseI64ArrayAttr(dims), false);
  }
};

/// Micro-batches are unrolled copies of the step (no loops in the
/// executable), so their number and the unrolled size are bounded.
constexpr int64_t kMaxAccumulate = 1024;
constexpr int64_t kMaxAccumulatedOps = 4'000'000;

/// 1 / (1 - beta^t) for the 1-based step t (an f32 scalar), to the
/// precision of the f32 result. The power is formed in double the way
/// PyTorch forms it (with the double beta the user gave): 1 - beta^t =
/// -expm1(t * ln beta), ln beta taken in double at compile time, and
/// expm1(x) = 2T / (1 - T) with T = tanh(x / 2), which keeps its relative
/// accuracy as x -> 0 (1 - pow(f32(beta), t) in f32 lost 5 digits to
/// cancellation: 6.6e-6 too small at beta = 0.999, 6.8e-4 too large at
/// 0.99999). So 1 / (1 - beta^t) = (T - 1) / (2T).
static Value biasCorrection(Emit &e, double beta, Value t) {
  if (beta == 0)
    return e.f32(1.0);
  double halfLog = 0.5 * std::log(beta); // < 0
  Value T = e.tanh(e.mul(t, e.f32(halfLog)));
  return e.div(e.sub(T, e.f32(1.0)), e.mul(T, e.f32(2.0)));
}

struct OptimizerPass : dlopt::impl::OptimizerPassBase<OptimizerPass> {
  using OptimizerPassBase::OptimizerPassBase;

  void runOnOperation() override {
    FailureOr<func::FuncOp> fn = findEntryFunction(getOperation(), entry);
    if (failed(fn) || failed(checkOptions(*fn)))
      return signalPassFailure();
    if (zero > 0 && failed(planZero(*fn)))
      return signalPassFailure();
    // ZeRO-3 gathers per micro-batch and stage 2 reduce-scatters every
    // micro-batch's gradient: before the replay. Stage 1 accumulates whole
    // gradients and reduce-scatters once: after it.
    if (zero >= 3)
      shardParameters(*fn);
    if (zero >= 2)
      scatterGradients(*fn);
    if (accumulate > 1 && failed(accumulateMicroBatches(*fn)))
      return signalPassFailure();
    if (zero == 1)
      scatterGradients(*fn);
    if (zero >= 3)
      markParameterGathers(*fn);
    // The replay marks its copies; a single micro-batch is marked alike
    // when asked (dlopt-pipeline schedules the step by these marks).
    if (accumulate == 1 && markMicroBatches)
      for (Operation &op : fn->getBody().front().without_terminator())
        if (!isa<arith::ConstantOp>(op) &&
            !op.hasAttr(DLOptDialect::kMicroBatchAttr))
          op.setAttr(DLOptDialect::kMicroBatchAttr,
                     IntegerAttr::get(IntegerType::get(op.getContext(), 64), 0));
    computeParamStages(*fn);
    if (bucketMb > 0) {
      bucketGradients(*fn);
      if (zero > 0)
        bucketScatters(*fn);
    }
    if (failed(buildStep(*fn)))
      return signalPassFailure();
    if (bucketMb > 0 && zero > 0)
      bucketGathers(*fn);
  }

  //===--------------------------------------------------------------------===//
  // Gradient buckets
  //===--------------------------------------------------------------------===//

  static RankedTensorType rt(shard::AllReduceOp ar) {
    return cast<RankedTensorType>(ar.getResult().getType());
  }

  /// A gradient's all-reduce and what follows it up to the return (sumOf).
  struct GradSum {
    shard::AllReduceOp ar;
    SmallVector<Operation *> chain;
    int64_t stage = -1; ///< the pipeline stage using the parameter
  };

  /// The pipeline stage of each parameter: the plan's dlopt.stage of the
  /// forward ops that read it (through casts, reshapes and ZeRO-3 gathers);
  /// -1 without stages, kManyStages when several stages read it (a tied
  /// table). A bucket never mixes stages: its concatenation would pull the
  /// other stages' gradients across the pipeline and send the sums back.
  static constexpr int64_t kManyStages = -2;
  llvm::StringMap<int64_t> paramStage;

  void computeParamStages(func::FuncOp fn) {
    paramStage.clear();
    for (BlockArgument arg : fn.getArguments()) {
      auto name = fn.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                  DLOptDialect::kParamAttr);
      if (!name)
        continue;
      int64_t stage = -1;
      SmallVector<Value> work{arg};
      llvm::SmallPtrSet<Operation *, 16> seen;
      while (!work.empty() && stage != kManyStages) {
        Value v = work.pop_back_val();
        for (Operation *user : v.getUsers()) {
          if (!seen.insert(user).second)
            continue;
          if (auto st = user->getAttrOfType<IntegerAttr>(DLOptDialect::kStageAttr)) {
            if (stage == -1 || stage == st.getInt())
              stage = st.getInt();
            else
              stage = kManyStages;
            continue;
          }
          // Look through what carries the parameter to its forward use.
          if (isa<dl::CastOp, dl::ReshapeOp, shard::AllGatherOp>(user))
            for (Value r : user->getResults())
              work.push_back(r);
        }
      }
      paramStage[name.getValue()] = stage;
    }
  }

  int64_t stageOfParam(StringRef name) const {
    auto it = paramStage.find(name);
    return it == paramStage.end() ? -1 : it->second;
  }

  static double tensorBytes(Type type) {
    auto t = cast<RankedTensorType>(type);
    return double(t.getNumElements()) *
           std::max<unsigned>(1, t.getElementTypeBitWidth() / 8);
  }

  /// Splits `items` (in program order) into runs that `same` keeps
  /// together, each of at most bucket-mb MiB of `bytes`, and calls `fuse`
  /// on every run of two or more.
  template <typename T, typename Same, typename Bytes, typename Fuse>
  void inBuckets(MutableArrayRef<T> items, Same same, Bytes bytes, Fuse fuse) {
    const double limit = double(bucketMb) * 1024 * 1024;
    SmallVector<T> bucket;
    double size = 0;
    auto flush = [&]() {
      if (bucket.size() >= 2)
        fuse(ArrayRef<T>(bucket));
      bucket.clear();
      size = 0;
    };
    for (T &item : items) {
      if (bucket.empty() || !same(bucket.front(), item) ||
          size + bytes(item) > limit)
        flush();
      size += bytes(item);
      bucket.push_back(std::move(item));
    }
    flush();
  }

  /// Fuses the gradients' all-reduces into buckets: runs of consecutive
  /// (backward-order) all-reduces of returned gradients over the same axes
  /// and element type, up to bucket-mb MiB, become one all-reduce of their
  /// flattened concatenation, placed where the last gradient of the run is
  /// complete, and slices of it.
  void bucketGradients(func::FuncOp fn) {
    Operation *ret = fn.getBody().front().getTerminator();
    SmallVector<GradSum> grads;
    for (OpOperand &o : ret->getOpOperands()) {
      auto p = fn.getResultAttrOfType<StringAttr>(o.getOperandNumber(),
                                                  DLOptDialect::kGradAttr);
      if (!p)
        continue;
      GradSum g;
      g.ar = sumOf(o.get(), g.chain);
      g.stage = stageOfParam(p.getValue());
      if (g.ar && rt(g.ar).getRank() > 0 && g.stage != kManyStages)
        grads.push_back(std::move(g));
    }
    llvm::sort(grads, [](GradSum &a, GradSum &b) {
      return a.ar->isBeforeInBlock(b.ar);
    });
    inBuckets(
        MutableArrayRef<GradSum>(grads),
        [](GradSum &a, GradSum &b) {
          return a.stage == b.stage &&
                 a.ar.getGridAxes() == b.ar.getGridAxes() &&
                 rt(a.ar).getElementType() == rt(b.ar).getElementType();
        },
        [](GradSum &g) { return tensorBytes(g.ar.getType()); },
        [&](ArrayRef<GradSum> bucket) { fuse(bucket); });
  }

  void fuse(ArrayRef<GradSum> bucket) {
    shard::AllReduceOp last = bucket.back().ar;
    OpBuilder b(last);
    Location loc = last.getLoc();
    Type elem = rt(last).getElementType();
    // Every op of the bucket carries the last reduction's marks (layer,
    // pass, micro-batch): the pipeline schedules micro-batch work by them.
    DictionaryAttr marks = last->getDiscardableAttrDictionary();
    auto mark = [&](Value v) {
      v.getDefiningOp()->setDiscardableAttrs(marks);
      return v;
    };
    SmallVector<Value> flat;
    int64_t total = 0;
    for (const GradSum &g : bucket) {
      shard::AllReduceOp ar = g.ar;
      int64_t n = rt(ar).getNumElements();
      flat.push_back(rt(ar).getRank() == 1
                         ? ar.getInput()
                         : mark(dl::ReshapeOp::create(
                               b, loc, RankedTensorType::get({n}, elem),
                               ar.getInput())));
      total += n;
    }
    auto flatType = RankedTensorType::get({total}, elem);
    Value all = mark(dl::ConcatOp::create(b, loc, flat, int64_t(0)));
    auto sum = shard::AllReduceOp::create(b, loc, flatType, last.getGridAttr(),
                                          last.getGridAxesAttr(), all,
                                          last.getReductionAttr());
    sum->setDiscardableAttrs(marks);
    int64_t offset = 0;
    for (const GradSum &g : bucket) {
      shard::AllReduceOp ar = g.ar;
      int64_t n = rt(ar).getNumElements();
      Value piece = mark(dl::SliceOp::create(
          b, loc, sum.getResult(), b.getDenseI64ArrayAttr({offset}),
          b.getDenseI64ArrayAttr({offset + n}), b.getDenseI64ArrayAttr({1})));
      Value back = rt(ar).getRank() == 1
                       ? piece
                       : mark(dl::ReshapeOp::create(b, loc, rt(ar), piece));
      ar.getResult().replaceAllUsesWith(back);
      // What followed the gradient's own all-reduce (a cast to the master
      // weights' type, 1/k) now follows its slice.
      for (Operation *op : llvm::reverse(g.chain)) {
        // A constant it reads (1/k's k) may come later: it moves too.
        for (Value v : op->getOperands())
          if (Operation *def = v.getDefiningOp();
              def && def->getNumOperands() == 0 && !def->isBeforeInBlock(last))
            def->moveBefore(last);
        op->moveBefore(last);
      }
      offset += n;
    }
    for (const GradSum &g : bucket)
      g.ar->erase();
  }

  /// ZeRO's gradient reduce-scatters in buckets: runs of consecutive
  /// (backward-order) reduce-scatters of whole gradients over the replica
  /// axes on dim 0, of one micro-batch, stage and element type, up to
  /// bucket-mb MiB, become one reduce-scatter. Each gradient is viewed as
  /// [ranks, n / ranks] (its dim-0 blocks are contiguous rows), the views
  /// are concatenated along dim 1, and row r of the sum is rank r's shard
  /// of every gradient in turn: every rank keeps its own blocks, as without
  /// buckets. Gradients sharded on another dim go alone.
  void bucketScatters(func::FuncOp fn) {
    Operation *ret = fn.getBody().front().getTerminator();
    // Which parameter each reduce-scatter serves: the gradient flows from
    // it to the return, through the chain (cast, 1/k) and, with
    // micro-batches, the running sum.
    llvm::DenseMap<Operation *, int64_t> stageOf;
    for (OpOperand &o : ret->getOpOperands()) {
      auto p = fn.getResultAttrOfType<StringAttr>(o.getOperandNumber(),
                                                  DLOptDialect::kGradAttr);
      if (!p)
        continue;
      int64_t stage = stageOfParam(p.getValue());
      SmallVector<Value> work{o.get()};
      llvm::SmallPtrSet<Operation *, 16> seen;
      while (!work.empty()) {
        Operation *def = work.pop_back_val().getDefiningOp();
        if (!def || !seen.insert(def).second)
          continue;
        if (auto rs = dyn_cast<shard::ReduceScatterOp>(def)) {
          stageOf[rs] = stage;
          continue;
        }
        if (isa<dl::CastOp, dl::DivOp, dl::AddOp, shard::AllReduceOp>(def))
          for (Value v : def->getOperands())
            work.push_back(v);
      }
    }
    SmallVector<shard::ReduceScatterOp> scatters;
    for (Operation &op : fn.getBody().front().without_terminator())
      if (auto rs = dyn_cast<shard::ReduceScatterOp>(op))
        if (stageOf.count(rs) && stageOf[rs] != kManyStages &&
            rs.getScatterAxis().getSExtValue() == 0 &&
            rs.getGridAxes() == ArrayRef<int16_t>(zeroAxes) &&
            rs.getReduction() == shard::ReductionKind::Sum)
          scatters.push_back(rs);
    auto mb = [](Operation *op) {
      auto a = op->getAttrOfType<IntegerAttr>(DLOptDialect::kMicroBatchAttr);
      return a ? a.getInt() : int64_t(-1);
    };
    inBuckets(
        MutableArrayRef<shard::ReduceScatterOp>(scatters),
        [&](shard::ReduceScatterOp a, shard::ReduceScatterOp b) {
          return stageOf[a] == stageOf[b] && mb(a) == mb(b) &&
                 getElementTypeOrSelf(a.getType()) ==
                     getElementTypeOrSelf(b.getType());
        },
        [](shard::ReduceScatterOp rs) {
          return tensorBytes(rs.getInput().getType());
        },
        [&](ArrayRef<shard::ReduceScatterOp> bucket) {
          SmallVector<Operation *> ops(bucket.begin(), bucket.end());
          fuseZeroBucket(ops, bucket.back());
        });
  }

  /// One collective for a bucket of ZeRO's reduce-scatters or all-gathers
  /// over the replica axes on dim 0 (R ranks), placed at `at`: each
  /// member's input is viewed as rows (R rows of n / R for a
  /// reduce-scatter, one row of its shard for a gather), the rows are
  /// concatenated along dim 1, and each member's result is its columns of
  /// the collective's rows (one row, or R), reshaped back. Uses of an
  /// earlier member's result that come before `at` move after it, in order.
  void fuseZeroBucket(ArrayRef<Operation *> bucket, Operation *at) {
    const bool scatter = isa<shard::ReduceScatterOp>(at);
    OpBuilder b(at);
    Location loc = at->getLoc();
    DictionaryAttr marks = at->getDiscardableAttrDictionary();
    auto mark = [&](Value v) {
      v.getDefiningOp()->setDiscardableAttrs(marks);
      return v;
    };
    Type elem = getElementTypeOrSelf(at->getResult(0).getType());
    const int64_t n = zeroRanks, inRows = scatter ? n : 1,
                  outRows = scatter ? 1 : n;
    // Elements per row: the shard's.
    auto perRow = [&](Operation *op) {
      Value shard = scatter ? op->getResult(0) : op->getOperand(0);
      return cast<RankedTensorType>(shard.getType()).getNumElements();
    };
    SmallVector<Value> rows;
    int64_t total = 0;
    for (Operation *op : bucket) {
      rows.push_back(mark(dl::ReshapeOp::create(
          b, loc, RankedTensorType::get({inRows, perRow(op)}, elem),
          op->getOperand(0))));
      total += perRow(op);
    }
    Value all = mark(dl::ConcatOp::create(b, loc, rows, int64_t(1)));
    auto outType = RankedTensorType::get({outRows, total}, elem);
    Value sum;
    if (auto rs = dyn_cast<shard::ReduceScatterOp>(at))
      sum = shard::ReduceScatterOp::create(b, loc, outType, rs.getGridAttr(),
                                           rs.getGridAxesAttr(), all,
                                           rs.getReductionAttr(),
                                           b.getIndexAttr(0));
    else
      sum = shard::AllGatherOp::create(
          b, loc, outType, cast<shard::AllGatherOp>(at).getGridAttr(),
          cast<shard::AllGatherOp>(at).getGridAxesAttr(), all,
          b.getIndexAttr(0));
    mark(sum);
    llvm::SetVector<Operation *> moved;
    int64_t offset = 0;
    for (Operation *op : bucket) {
      int64_t per = perRow(op);
      Value piece = mark(dl::SliceOp::create(
          b, loc, sum, b.getDenseI64ArrayAttr({0, offset}),
          b.getDenseI64ArrayAttr({outRows, offset + per}),
          b.getDenseI64ArrayAttr({1, 1})));
      Value value =
          mark(dl::ReshapeOp::create(b, loc, op->getResult(0).getType(), piece));
      SmallVector<Operation *> work(op->getUsers().begin(), op->getUsers().end());
      while (!work.empty()) {
        Operation *u = work.pop_back_val();
        if (u->hasTrait<OpTrait::IsTerminator>() || !u->isBeforeInBlock(at) ||
            !moved.insert(u))
          continue;
        for (Operation *uu : u->getUsers())
          work.push_back(uu);
      }
      op->getResult(0).replaceAllUsesWith(value);
      offset += per;
    }
    SmallVector<Operation *> order(moved.begin(), moved.end());
    llvm::sort(order, [](Operation *x, Operation *y) { return x->isBeforeInBlock(y); });
    Operation *after = &*std::prev(b.getInsertionPoint());
    for (Operation *op : order) {
      op->moveAfter(after);
      after = op;
    }
    for (Operation *op : bucket) {
      updateGathers.erase(op);
      op->erase();
    }
  }

  /// The updated parameters' all-gathers (ZeRO 1 and 2), by parameter.
  llvm::DenseMap<Operation *, std::string> updateGathers;

  /// ZeRO's parameter all-gathers in buckets, as the reduce-scatters: the
  /// updated parameters' gathers after the update (ZeRO 1 and 2), placed
  /// where the last of a run is computed, and ZeRO-3's gathers of one
  /// layer, pass and micro-batch, placed at the first of them (they read
  /// only arguments). Each shard is flattened to [1, n / ranks], the shards
  /// are concatenated along dim 1 and gathered along dim 0: row r holds
  /// rank r's block of every parameter, so a parameter's columns, as
  /// [ranks, n / ranks] rows, are its dim-0 blocks in order.
  void bucketGathers(func::FuncOp fn) {
    struct Gather {
      shard::AllGatherOp ag;
      int64_t stage;
      bool zero3;
    };
    SmallVector<Gather> gathers;
    for (Operation &op : fn.getBody().front().without_terminator()) {
      auto ag = dyn_cast<shard::AllGatherOp>(op);
      if (!ag || ag.getGatherAxis().getSExtValue() != 0 ||
          ag.getGridAxes() != ArrayRef<int16_t>(zeroAxes))
        continue;
      std::string param;
      bool zero3 = false;
      if (auto it = updateGathers.find(ag); it != updateGathers.end()) {
        param = it->second;
      } else if (auto arg = dyn_cast<BlockArgument>(ag.getInput());
                 arg && ag->hasAttr(DLOptDialect::kZeroGatherAttr)) {
        auto name = fn.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                    DLOptDialect::kParamAttr);
        if (!name)
          continue;
        param = name.getValue().str();
        zero3 = true;
      } else {
        continue;
      }
      int64_t stage = stageOfParam(param);
      if (stage != kManyStages)
        gathers.push_back({ag, stage, zero3});
    }
    inBuckets(
        MutableArrayRef<Gather>(gathers),
        [](Gather &a, Gather &b) {
          return a.zero3 == b.zero3 && a.stage == b.stage &&
                 getElementTypeOrSelf(a.ag.getType()) ==
                     getElementTypeOrSelf(b.ag.getType()) &&
                 a.ag->getDiscardableAttrDictionary() ==
                     b.ag->getDiscardableAttrDictionary();
        },
        [](Gather &g) { return tensorBytes(g.ag.getType()); },
        [&](ArrayRef<Gather> bucket) {
          SmallVector<Operation *> ops;
          for (const Gather &g : bucket)
            ops.push_back(g.ag);
          // ZeRO-3's gathers read only arguments: at the first, before
          // every use; an update's gather where the last update is done.
          fuseZeroBucket(ops, bucket.front().zero3 ? ops.front() : ops.back());
        });
  }

  //===--------------------------------------------------------------------===//
  // ZeRO
  //===--------------------------------------------------------------------===//

  /// The replica axes (mesh indices of dp and cp, in mesh order), their
  /// names and their number of ranks; the sharded local dim per parameter
  /// (absent: no dim divides, the parameter keeps whole state).
  SmallVector<int16_t> zeroAxes;
  SmallVector<StringRef> zeroAxisNames;
  int64_t zeroRanks = 1;
  llvm::StringMap<int64_t> zeroDim;

  static constexpr llvm::StringLiteral kGlobalType = "dlopt.global_type";
  static constexpr llvm::StringLiteral kSplit = "dlopt.split";

  LogicalResult planZero(func::FuncOp fn) {
    auto bad = [&]() { return fn.emitError() << "dlopt-optimizer: zero=" << int64_t(zero) << ": "; };
    auto mesh = fn->getParentOfType<ModuleOp>()->getAttrOfType<DictionaryAttr>("dlopt.mesh");
    if (mesh) {
      auto axes = cast<ArrayAttr>(mesh.get("axes"));
      auto shape = cast<DenseI64ArrayAttr>(mesh.get("shape")).asArrayRef();
      for (auto [k, a] : llvm::enumerate(axes)) {
        StringRef name = cast<StringAttr>(a).getValue();
        if ((name == "dp" || name == "cp") && shape[k] > 1) {
          zeroAxes.push_back(int16_t(k));
          zeroAxisNames.push_back(name);
          zeroRanks *= shape[k];
        }
      }
    }
    if (zeroAxes.empty())
      return bad() << "ZeRO shards over the data-parallel replicas (mesh axes "
                      "dp and cp), but "
                   << (mesh ? "the step's mesh has neither"
                            : "the step is not partitioned (no dlopt.mesh)");
    for (BlockArgument arg : fn.getArguments()) {
      auto name = fn.getArgAttrOfType<StringAttr>(arg.getArgNumber(), DLOptDialect::kParamAttr);
      if (!name)
        continue;
      auto t = cast<RankedTensorType>(arg.getType());
      for (int64_t d = 0; d < t.getRank(); ++d)
        if (t.getDimSize(d) >= zeroRanks && t.getDimSize(d) % zeroRanks == 0) {
          zeroDim[name.getValue()] = d;
          break;
        }
    }
    return success();
  }

  FlatSymbolRefAttr grid() { return FlatSymbolRefAttr::get(&getContext(), "dlopt_mesh"); }

  RankedTensorType shardType(Type full, int64_t d) {
    auto t = cast<RankedTensorType>(full);
    SmallVector<int64_t> shape(t.getShape());
    shape[d] /= zeroRanks;
    return RankedTensorType::get(shape, t.getElementType());
  }

  /// The global layout of parameter `arg`'s shard: its own layout with the
  /// replica axes appended on the sharded dim.
  SmallVector<NamedAttribute> shardLayout(func::FuncOp fn, BlockArgument arg, int64_t d) {
    MLIRContext *ctx = &getContext();
    unsigned i = arg.getArgNumber();
    auto t = cast<RankedTensorType>(arg.getType());
    Attribute global = fn.getArgAttr(i, kGlobalType);
    if (!global)
      global = TypeAttr::get(t);
    auto split = fn.getArgAttrOfType<ArrayAttr>(i, kSplit);
    SmallVector<Attribute> dims;
    for (int64_t k = 0; k < t.getRank(); ++k) {
      SmallVector<Attribute> list;
      if (split)
        llvm::append_range(list, cast<ArrayAttr>(split[k]).getValue());
      if (k == d)
        for (StringRef a : zeroAxisNames)
          list.push_back(StringAttr::get(ctx, a));
      dims.push_back(ArrayAttr::get(ctx, list));
    }
    return {NamedAttribute(StringAttr::get(ctx, kGlobalType), global),
            NamedAttribute(StringAttr::get(ctx, kSplit), ArrayAttr::get(ctx, dims))};
  }

  /// ZeRO-3: every sharded parameter argument becomes its shard; its uses
  /// read an all-gather created right before the first use of each phase
  /// (forward, backward), so the whole parameter lives only while used.
  void shardParameters(func::FuncOp fn) {
    OpBuilder b(&getContext());
    for (BlockArgument arg : fn.getArguments()) {
      unsigned i = arg.getArgNumber();
      auto name = fn.getArgAttrOfType<StringAttr>(i, DLOptDialect::kParamAttr);
      if (!name || !zeroDim.count(name.getValue()))
        continue;
      int64_t d = zeroDim[name.getValue()];
      auto full = cast<RankedTensorType>(arg.getType());
      for (NamedAttribute a : shardLayout(fn, arg, d))
        fn.setArgAttr(i, a.getName(), a.getValue());
      SmallVector<Operation *> users(arg.getUsers());
      llvm::sort(users, [](Operation *x, Operation *y) { return x->isBeforeInBlock(y); });
      users.erase(std::unique(users.begin(), users.end()), users.end());
      arg.setType(shardType(full, d));
      Value gathered[2];
      for (Operation *user : users) {
        int phase = user->hasAttr(DLOptDialect::kBackwardAttr) ? 1 : 0;
        if (!gathered[phase]) {
          b.setInsertionPoint(user);
          auto ag = shard::AllGatherOp::create(b, user->getLoc(), full, grid(),
                                               b.getDenseI16ArrayAttr(zeroAxes),
                                               arg, b.getIndexAttr(d));
          ag->setAttr(DLOptDialect::kZeroGatherAttr, b.getStringAttr(phase ? "bwd" : "fwd"));
          // Part of its first user's layer and pass: recomputing the layer
          // gathers the parameter again.
          for (StringRef mark : {DLOptDialect::kLayerAttr, DLOptDialect::kBackwardAttr})
            if (Attribute a = user->getAttr(mark))
              ag->setAttr(mark, a);
          gathered[phase] = ag.getResult();
        }
        user->replaceUsesOfWith(arg, gathered[phase]);
      }
    }
    fn.setFunctionType(FunctionType::get(&getContext(), fn.getBody().getArgumentTypes(),
                                         fn.getResultTypes()));
  }

  /// Keeps the micro-batches' parameter gathers apart (CSE merges ops that
  /// differ only in their ids and micro-batch marks).
  void markParameterGathers(func::FuncOp fn) {
    fn.walk([&](shard::AllGatherOp ag) {
      auto phase = ag->getAttrOfType<StringAttr>(DLOptDialect::kZeroGatherAttr);
      auto mb = ag->getAttrOfType<IntegerAttr>(DLOptDialect::kMicroBatchAttr);
      if (phase && mb)
        ag->setAttr(DLOptDialect::kZeroGatherAttr,
                    StringAttr::get(&getContext(), phase.getValue() + ".mb" +
                                                       std::to_string(mb.getInt())));
    });
  }

  /// The all-reduce that sums a returned gradient, looking through what
  /// may follow it: a cast to the master weights' type (mixed precision
  /// reduces in the compute type) and the 1/k of accumulated micro-batches.
  /// `chain` gets those ops, outermost first.
  static shard::AllReduceOp sumOf(Value v, SmallVector<Operation *> &chain) {
    chain.clear();
    while (Operation *def = v.getDefiningOp()) {
      if (!def->hasOneUse())
        break;
      if (auto c = dyn_cast<dl::CastOp>(def)) {
        chain.push_back(def);
        v = c.getInput();
        continue;
      }
      if (auto d = dyn_cast<dl::DivOp>(def);
          d && d.getRhs().getType().getRank() == 0 && d.getLhs().getType() == d.getType()) {
        chain.push_back(def);
        v = d.getLhs();
        continue;
      }
      break;
    }
    auto ar = v.getDefiningOp<shard::AllReduceOp>();
    if (!ar || ar.getReduction() != shard::ReductionKind::Sum || !ar->hasOneUse())
      return {};
    return ar;
  }

  /// Re-applies `chain` (from sumOf) to `v`, innermost first, at the types
  /// of `v`'s shape.
  static Value reapply(OpBuilder &b, ArrayRef<Operation *> chain, Value v) {
    for (Operation *op : llvm::reverse(chain)) {
      b.setInsertionPoint(op);
      auto vt = cast<RankedTensorType>(v.getType());
      if (auto c = dyn_cast<dl::CastOp>(op))
        v = dl::CastOp::create(
            b, op->getLoc(),
            RankedTensorType::get(vt.getShape(), c.getType().getElementType()), v);
      else
        v = dl::DivOp::create(b, op->getLoc(), v, cast<dl::DivOp>(op).getRhs());
      v.getDefiningOp()->setDiscardableAttrs(op->getDiscardableAttrDictionary());
    }
    return v;
  }

  /// ZeRO: a sharded parameter's gradient sum over the replica axes becomes
  /// a reduce-scatter onto its shard (the rest of the sum, over other axes,
  /// an all-reduce of the shard); the result is the gradient's shard.
  void scatterGradients(func::FuncOp fn) {
    Operation *ret = fn.getBody().front().getTerminator();
    OpBuilder b(&getContext());
    for (OpOperand &o : ret->getOpOperands()) {
      auto p = fn.getResultAttrOfType<StringAttr>(o.getOperandNumber(), DLOptDialect::kGradAttr);
      if (!p || !zeroDim.count(p.getValue()))
        continue;
      int64_t d = zeroDim[p.getValue()];
      SmallVector<Operation *> chain;
      shard::AllReduceOp ar = sumOf(o.get(), chain);
      SmallVector<int16_t> rest;
      bool covers = false;
      if (ar) {
        ArrayRef<int16_t> axes = ar.getGridAxes();
        covers = llvm::all_of(zeroAxes, [&](int16_t a) { return llvm::is_contained(axes, a); });
        for (int16_t a : axes)
          if (!llvm::is_contained(zeroAxes, a))
            rest.push_back(a);
      }
      if (covers) {
        b.setInsertionPoint(ar);
        Value shard = shard::ReduceScatterOp::create(
                          b, ar.getLoc(), shardType(ar.getType(), d), grid(),
                          b.getDenseI16ArrayAttr(zeroAxes), ar.getInput(),
                          shard::ReductionKindAttr::get(&getContext(), shard::ReductionKind::Sum),
                          b.getIndexAttr(d))
                          .getResult();
        // The reduction's marks (layer, pass, micro-batch) carry over.
        shard.getDefiningOp()->setDiscardableAttrs(ar->getDiscardableAttrDictionary());
        if (!rest.empty())
          shard = shard::AllReduceOp::create(b, ar.getLoc(), shard.getType(), grid(),
                                             b.getDenseI16ArrayAttr(rest), shard,
                                             ar.getReductionAttr())
                      .getResult();
        shard = reapply(b, chain, shard);
        o.set(shard);
        for (Operation *op : chain)
          op->erase();
        ar->erase();
      } else {
        // Already summed (or never partial): every rank keeps its block.
        b.setInsertionPointAfterValue(o.get());
        Value shard = shard::AllSliceOp::create(b, o.get().getLoc(), shardType(o.get().getType(), d),
                                                grid(), b.getDenseI16ArrayAttr(zeroAxes),
                                                o.get(), b.getIndexAttr(d))
                          .getResult();
        o.set(shard);
      }
    }
    fn.setFunctionType(FunctionType::get(&getContext(), fn.getBody().getArgumentTypes(),
                                         ret->getOperandTypes()));
  }

  LogicalResult checkOptions(func::FuncOp fn) {
    auto bad = [&]() { return fn.emitError() << "dlopt-optimizer: "; };
    if (optimizer != "sgd" && optimizer != "adam" && optimizer != "adamw")
      return bad() << "unknown optimizer '" << std::string(optimizer)
                   << "', expected sgd, adam or adamw";
    for (auto [name, v] :
         {std::pair<const char *, double>{"lr", lr}, {"min-lr", minLr},
          {"momentum", momentum}, {"weight-decay", weightDecay},
          {"beta1", beta1}, {"beta2", beta2}, {"eps", eps},
          {"clip-norm", clipNorm}})
      if (!std::isfinite(v))
        return bad() << "expects a finite " << name << ", got " << v;
    if (!(lr > 0))
      return bad() << "expects lr > 0, got " << double(lr);
    if (!(momentum >= 0 && momentum < 1))
      return bad() << "expects momentum in [0, 1), got " << double(momentum);
    if (nesterov && momentum == 0)
      return bad() << "nesterov needs momentum > 0";
    if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
      return bad() << "expects beta1 and beta2 in [0, 1), got " << double(beta1)
                   << " and " << double(beta2);
    if (!(eps > 0))
      return bad() << "expects eps > 0, got " << double(eps);
    if (schedule != "constant" && schedule != "cosine" && schedule != "linear")
      return bad() << "unknown schedule '" << std::string(schedule)
                   << "', expected constant, cosine or linear";
    if (warmupSteps < 0)
      return bad() << "expects warmup-steps >= 0, got " << int64_t(warmupSteps);
    if (schedule != "constant" && totalSteps <= warmupSteps)
      return bad() << "schedule '" << std::string(schedule)
                   << "' needs total-steps > warmup-steps, got total-steps = "
                   << int64_t(totalSteps) << " and warmup-steps = " << int64_t(warmupSteps);
    if (!(minLr >= 0 && minLr <= lr))
      return bad() << "expects 0 <= min-lr <= lr, got " << double(minLr);
    if (!(clipNorm >= 0))
      return bad() << "expects clip-norm >= 0, got " << double(clipNorm);
    if (!gradNorm && clipNorm > 0)
      return bad() << "clip-norm " << double(clipNorm)
                   << " needs the gradient norm (grad-norm=false)";
    if (zero < 0 || zero > 3)
      return bad() << "zero=" << int64_t(zero) << ": expects a ZeRO stage from 0 to 3";
    if (!(bucketMb >= 0) || !std::isfinite(double(bucketMb)))
      return bad() << "expects bucket-mb >= 0 (MiB; 0: no buckets), got "
                   << double(bucketMb);
    if (accumulate < 1 || accumulate > kMaxAccumulate)
      return bad() << "expects accumulate in [1, " << kMaxAccumulate
                   << "], got " << int64_t(accumulate)
                   << " (each micro-batch is a copy of the step)";
    int64_t bodyOps = 0;
    fn.walk([&](Operation *) { ++bodyOps; });
    if (accumulate > 1 && bodyOps * int64_t(accumulate) > kMaxAccumulatedOps)
      return bad() << "accumulate = " << int64_t(accumulate) << " copies the "
                   << bodyOps << " ops of the step into "
                   << bodyOps * int64_t(accumulate) << " ops, more than "
                   << kMaxAccumulatedOps << "; use fewer micro-batches";
    return success();
  }

  /// Replays forward and backward once per micro-batch; every input gains a
  /// leading dim of size `accumulate`.
  LogicalResult accumulateMicroBatches(func::FuncOp fn) {
    Block &body = fn.getBody().front();
    Operation *ret = body.getTerminator();
    int64_t k = accumulate;
    SmallVector<Operation *> ops;
    for (Operation &op : body.without_terminator())
      ops.push_back(&op);

    SmallVector<BlockArgument> inputs;
    SmallVector<RankedTensorType> origTypes;
    for (BlockArgument arg : fn.getArguments())
      if (fn.getArgAttr(arg.getArgNumber(), DLOptDialect::kInputAttr)) {
        inputs.push_back(arg);
        origTypes.push_back(cast<RankedTensorType>(arg.getType()));
      }
    if (inputs.empty())
      return fn.emitError("dlopt-optimizer: accumulate > 1 needs at least one dlopt.input to split");
    for (auto [arg, t] : llvm::zip(inputs, origTypes)) {
      SmallVector<int64_t> shape{k};
      llvm::append_range(shape, t.getShape());
      arg.setType(RankedTensorType::get(shape, t.getElementType()));
      // A data-parallel input's global type gains the same leading dim.
      unsigned i = arg.getArgNumber();
      if (auto g = fn.getArgAttrOfType<TypeAttr>(i, "dlopt.global_type")) {
        auto gt = cast<RankedTensorType>(g.getValue());
        SmallVector<int64_t> gs{k};
        llvm::append_range(gs, gt.getShape());
        fn.setArgAttr(i, "dlopt.global_type",
                      TypeAttr::get(RankedTensorType::get(gs, gt.getElementType())));
      }
      if (auto split = fn.getArgAttrOfType<ArrayAttr>(i, "dlopt.split")) {
        SmallVector<Attribute> dims{ArrayAttr::get(fn.getContext(), {})};
        llvm::append_range(dims, split.getValue());
        fn.setArgAttr(i, "dlopt.split", ArrayAttr::get(fn.getContext(), dims));
      }
    }
    fn.setFunctionType(FunctionType::get(fn.getContext(), body.getArgumentTypes(),
                                         fn.getResultTypes()));

    OpBuilder b(ret);
    Emit e{b, ret->getLoc()};
    SmallVector<Value> sums(ret->getNumOperands());
    SmallVector<bool> averaged(ret->getNumOperands(), false);
    SmallVector<shard::AllReduceOp> partialOf(ret->getNumOperands());
    for (unsigned r = 0; r < ret->getNumOperands(); ++r)
      averaged[r] = r == 0 || fn.getResultAttr(r, DLOptDialect::kGradAttr);
    for (int64_t i = 0; i < k; ++i) {
      IRMapping map;
      for (auto [arg, t] : llvm::zip(inputs, origTypes)) {
        auto full = cast<RankedTensorType>(arg.getType());
        SmallVector<int64_t> start(full.getRank(), 0), limit(full.getShape()),
            stride(full.getRank(), 1);
        start[0] = i;
        limit[0] = i + 1;
        Value sl = dl::SliceOp::create(b, arg.getLoc(), arg,
                                       b.getDenseI64ArrayAttr(start),
                                       b.getDenseI64ArrayAttr(limit),
                                       b.getDenseI64ArrayAttr(stride));
        map.map(arg, dl::ReshapeOp::create(b, arg.getLoc(), t, sl).getResult());
      }
      // Each replay keeps the ops' ids; dlopt.mb keeps (id, mb) unique.
      for (Operation *op : ops)
        b.clone(*op, map)->setAttr(DLOptDialect::kMicroBatchAttr,
                                   b.getI64IntegerAttr(i));
      for (unsigned r = 0; r < ret->getNumOperands(); ++r) {
        Value v = map.lookupOrDefault(ret->getOperand(r));
        // A partitioned step sums a gradient over its ranks last: sum the
        // micro-batches' partial sums and reduce once (the all-reduce is
        // linear), so accumulation does not multiply the traffic.
        if (averaged[r])
          if (auto ar = v.getDefiningOp<shard::AllReduceOp>();
              ar && ar.getReduction() == shard::ReductionKind::Sum &&
              v.use_empty()) {
            partialOf[r] = ar;
            v = ar.getInput();
          }
        // Averaged results are summed; the others keep the last micro-batch.
        // Each running sum is marked with its micro-batch (dlopt.accumulate,
        // not dlopt.mb: it is not that micro-batch's replay), so fusion keeps
        // the sums apart: one group for the chain would run at the last
        // micro-batch and keep every micro-batch's gradient until then.
        // The sum is formed right where the micro-batch's gradient is
        // complete, so that gradient dies there (at the end of the replay,
        // every gradient of the micro-batch would be live at once).
        if (averaged[r] && sums[r]) {
          OpBuilder::InsertionGuard guard(b);
          if (Operation *def = v.getDefiningOp())
            b.setInsertionPointAfter(def);
          Value sum = e.add(sums[r], v);
          if (Operation *add = sum.getDefiningOp())
            add->setAttr(DLOptDialect::kAccumulateAttr, b.getI64IntegerAttr(i));
          sums[r] = sum;
        } else {
          sums[r] = v;
        }
      }
    }
    for (unsigned r = 0; r < ret->getNumOperands(); ++r) {
      shard::AllReduceOp ar = partialOf[r];
      if (!ar || !averaged[r])
        continue;
      // Every micro-batch's value was its own all-reduce of the same axes.
      sums[r] = shard::AllReduceOp::create(b, ar.getLoc(), sums[r].getType(),
                                           ar.getGridAttr(), ar.getGridAxesAttr(),
                                           sums[r], ar.getReductionAttr())
                    .getResult();
    }
    for (unsigned r = 0; r < ret->getNumOperands(); ++r)
      if (averaged[r])
        sums[r] = e.div(sums[r], e.like(sums[r], double(k)));
    ret->setOperands(sums);
    for (Operation *op : llvm::reverse(ops))
      op->erase();
    return success();
  }

  LogicalResult buildStep(func::FuncOp fn) {
    Block &body = fn.getBody().front();
    Operation *ret = body.getTerminator();
    MLIRContext *ctx = fn.getContext();
    OpBuilder b(ret);
    Location loc = ret->getLoc();
    Emit e{b, loc};
    if (!fn->hasAttr(DLOptDialect::kLossAttr))
      return fn.emitError("dlopt-optimizer: expects a dlopt.loss function; run dlopt-autodiff first");

    // Split the results into gradients (by parameter) and the rest.
    llvm::StringMap<Value> gradOf;
    SmallVector<unsigned> otherResults;
    for (unsigned r = 0; r < ret->getNumOperands(); ++r) {
      if (auto p = fn.getResultAttrOfType<StringAttr>(r, DLOptDialect::kGradAttr))
        gradOf[p.getValue()] = ret->getOperand(r);
      else
        otherResults.push_back(r);
    }
    if (gradOf.empty()) {
      bool hasParams = llvm::any_of(fn.getArguments(), [&](BlockArgument a) {
        return fn.getArgAttr(a.getArgNumber(), DLOptDialect::kParamAttr);
      });
      if (!hasParams)
        return fn.emitError("dlopt-optimizer: nothing to train: the model has "
                            "no parameters (no argument carries "
                            "dlopt.param)");
      return fn.emitError("dlopt-optimizer: the function returns no dlopt.grad "
                          "results; run dlopt-autodiff first");
    }

    SmallVector<std::pair<BlockArgument, StringAttr>> params;
    for (BlockArgument arg : fn.getArguments())
      if (auto p = fn.getArgAttrOfType<StringAttr>(arg.getArgNumber(), DLOptDialect::kParamAttr)) {
        if (!gradOf.count(p.getValue()))
          return fn.emitError() << "dlopt-optimizer: parameter '" << p.getValue()
                                << "' has no gradient result";
        params.emplace_back(arg, p);
      }

    // The global layout (dlopt.global_type, dlopt.split) of an argument of
    // a partitioned step; a parameter's states and updates share it.
    auto layoutOf = [&](BlockArgument arg) {
      SmallVector<NamedAttribute> l;
      for (StringRef k : {kGlobalType, kSplit})
        if (Attribute a = fn.getArgAttr(arg.getArgNumber(), k))
          l.push_back(b.getNamedAttr(k, a));
      return l;
    };
    llvm::StringMap<SmallVector<NamedAttribute>> layouts;
    // ZeRO stages 1 and 2: the layout of a sharded parameter's states (its
    // own layout with the replica axes on the sharded dim).
    llvm::StringMap<SmallVector<NamedAttribute>> stateLayouts;
    // New state arguments; `like` gives its layout.
    auto addState = [&](Type t, StringRef name,
                        BlockArgument like = {}) -> BlockArgument {
      unsigned idx = fn.getNumArguments();
      NamedAttrList attrs;
      attrs.append(DLOptDialect::kStateAttr, b.getStringAttr(name));
      if (like) {
        StringRef param = fn.getArgAttrOfType<StringAttr>(
                               like.getArgNumber(), DLOptDialect::kParamAttr)
                              .getValue();
        auto it = stateLayouts.find(param);
        SmallVector<NamedAttribute> l =
            it != stateLayouts.end() ? it->second : layoutOf(like);
        attrs.append(l);
        layouts[name] = l;
      }
      (void)fn.insertArgument(idx, t, attrs.getDictionary(ctx), loc);
      return fn.getArgument(idx);
    };
    for (auto &[arg, name] : params) {
      layouts[name.getValue()] = layoutOf(arg);
      auto z = zeroDim.find(name.getValue());
      if (z != zeroDim.end() && zero < 3)
        stateLayouts[name.getValue()] = shardLayout(fn, arg, z->second);
    }
    struct Update {
      Value value;
      std::string name;
    };
    SmallVector<Update> updates;

    Type i64 = RankedTensorType::get({}, b.getI64Type());
    BlockArgument step = addState(i64, "step");
    // A new dropout mask every step: the dropouts without an offset (forward
    // and backward copies alike, so their masks still match) take the step.
    fn.walk([&](dl::DropoutOp op) {
      if (!op.getOffset())
        op.getOffsetMutable().assign(step);
    });
    auto one64 = arith::ConstantOp::create(
        b, loc, cast<RankedTensorType>(i64),
        DenseElementsAttr::get(cast<RankedTensorType>(i64), b.getI64IntegerAttr(1)));
    Value nextStep = dl::AddOp::create(b, loc, step, one64);
    // t: 1-based number of this step, in f32.
    Value t = dl::CastOp::create(b, loc, RankedTensorType::get({}, b.getF32Type()), nextStep);

    Value lrNow = buildSchedule(e, t);

    // Dynamic loss scaling (fp16): gradients arrive multiplied by the scale.
    BlockArgument lossScale, goodSteps;
    for (BlockArgument arg : fn.getArguments())
      if (auto s = fn.getArgAttrOfType<StringAttr>(arg.getArgNumber(), DLOptDialect::kStateAttr)) {
        if (s.getValue() == "loss_scale")
          lossScale = arg;
        else if (s.getValue() == "loss_scale.good_steps")
          goodSteps = arg;
      }
    if (lossScale) {
      Value inv = e.div(e.f32(1.0), e.toF32(lossScale));
      for (auto &[arg, name] : params) {
        Value &g = gradOf[name.getValue()];
        g = e.mul(g, e.castLike(inv, g));
      }
    }

    // Global gradient norm (reported as grad_norm) and clipping. In a partitioned
    // step a gradient split over mesh axes holds only its block: the sums
    // of its squares are summed over those axes (one all_reduce per set of
    // axes), so every rank clips by the same, global norm.
    // With pipeline stages the squares are summed per stage first, so one
    // partial sum per stage (and set of axes) crosses the pipeline instead
    // of one scalar per parameter (as Megatron-LM does); without stages the
    // order is the parameters'.
    // grad-norm=false (no clipping, no grad_norm result): no pass over the
    // gradients, and no norm.
    Value total;
    std::map<std::pair<int64_t, std::vector<int16_t>>, Value> partials;
    auto mesh = fn->getParentOfType<ModuleOp>()->getAttrOfType<DictionaryAttr>(
        "dlopt.mesh");
    if (gradNorm) {
      for (auto &[arg, name] : params) {
        Value g = gradOf[name.getValue()];
        // |g| * |g| = g * g exactly, but not the same op as Adam's g * g:
        // CSE would otherwise keep every gradient's square alive from here to
        // the update (a second copy of all gradients at the step's peak).
        Value mag = dl::AbsOp::create(b, loc, g);
        Value s = e.sumAll(e.mul(mag, mag));
        std::vector<int16_t> axes;
        ArrayAttr split = fn.getArgAttrOfType<ArrayAttr>(arg.getArgNumber(), kSplit);
        // A ZeRO-sharded gradient is the shard: its state's layout.
        if (auto it = stateLayouts.find(name.getValue()); it != stateLayouts.end())
          for (NamedAttribute a : it->second)
            if (a.getName() == kSplit)
              split = cast<ArrayAttr>(a.getValue());
        if (split && mesh)
          for (Attribute d : split)
            for (Attribute a : cast<ArrayAttr>(d))
              for (auto [k, m] : llvm::enumerate(cast<ArrayAttr>(mesh.get("axes"))))
                if (m == a)
                  axes.push_back(int16_t(k));
        llvm::sort(axes);
        int64_t stage = std::max<int64_t>(stageOfParam(name.getValue()), -1);
        Value &t = partials[{stage, axes}];
        t = t ? e.add(t, s) : s;
      }
    }
    for (auto &[key, partial] : partials) {
      const std::vector<int16_t> &axes = key.second;
      Value sum = axes.empty()
                      ? partial
                      : shard::AllReduceOp::create(
                            b, loc, partial.getType(),
                            FlatSymbolRefAttr::get(ctx, "dlopt_mesh"),
                            b.getDenseI16ArrayAttr(axes), partial,
                            shard::ReductionKindAttr::get(ctx, shard::ReductionKind::Sum))
                            .getResult();
      total = total ? e.add(total, sum) : sum;
    }
    Value norm = total ? e.sqrt(total) : Value();
    Value clipScale;
    if (clipNorm > 0)
      clipScale = e.min(e.f32(1.0),
                        e.div(e.f32(clipNorm), e.add(norm, e.f32(1e-6))));

    double wd = weightDecay >= 0 ? double(weightDecay)
                                 : (optimizer == "adamw" ? 0.01 : 0.0);
    Value bc1, bc2;
    if (optimizer != "sgd") {
      bc1 = biasCorrection(e, beta1, t);
      bc2 = biasCorrection(e, beta2, t);
    }
    size_t numUpdatedParams = 0;
    for (auto &[param, nameAttr] : params) {
      StringRef name = nameAttr.getValue();
      Value g = gradOf[name];
      // ZeRO stages 1 and 2 update the shard of a replicated parameter
      // (each rank keeps its block, no traffic) and gather the result.
      Value p = param;
      auto z = zeroDim.find(name);
      bool gatherUpdate = z != zeroDim.end() && zero < 3;
      if (gatherUpdate)
        p = shard::AllSliceOp::create(b, loc, shardType(param.getType(), z->second), grid(),
                                      b.getDenseI16ArrayAttr(zeroAxes), param,
                                      b.getIndexAttr(z->second))
                .getResult();
      if (clipScale)
        g = e.mul(g, e.castLike(clipScale, g));
      Value lrP = e.castLike(lrNow, p);
      Value newP;
      if (optimizer == "sgd") {
        if (wd > 0)
          g = e.add(g, e.mul(p, e.like(p, wd)));
        if (momentum > 0) {
          BlockArgument buf = addState(p.getType(), ("sgd.momentum." + name).str(), param);
          Value newBuf = e.add(e.mul(buf, e.like(buf, momentum)), g);
          updates.push_back({newBuf, ("sgd.momentum." + name).str()});
          g = nesterov ? e.add(g, e.mul(newBuf, e.like(buf, momentum))) : newBuf;
        }
        newP = e.sub(p, e.mul(g, lrP));
      } else {
        std::string prefix = optimizer + ".";
        if (optimizer == "adam" && wd > 0)
          g = e.add(g, e.mul(p, e.like(p, wd)));
        BlockArgument m = addState(p.getType(), prefix + "m." + name.str(), param);
        BlockArgument v = addState(p.getType(), prefix + "v." + name.str(), param);
        Value newM = e.add(e.mul(m, e.like(m, beta1)), e.mul(g, e.like(g, 1 - beta1)));
        Value newV = e.add(e.mul(v, e.like(v, beta2)),
                           e.mul(e.mul(g, g), e.like(g, 1 - beta2)));
        updates.push_back({newM, prefix + "m." + name.str()});
        updates.push_back({newV, prefix + "v." + name.str()});
        Value mhat = e.mul(newM, e.castLike(bc1, p));
        Value vhat = e.mul(newV, e.castLike(bc2, p));
        Value upd = e.div(mhat, e.add(e.sqrt(vhat), e.like(p, eps)));
        if (optimizer == "adamw" && wd > 0)
          upd = e.add(upd, e.mul(p, e.like(p, wd)));
        newP = e.sub(p, e.mul(upd, lrP));
      }
      if (gatherUpdate) {
        auto ag = shard::AllGatherOp::create(b, loc, param.getType(), grid(),
                                             b.getDenseI16ArrayAttr(zeroAxes), newP,
                                             b.getIndexAttr(z->second));
        updateGathers[ag] = name.str();
        newP = ag.getResult();
      }
      // New parameter values come first, then the optimizer state.
      updates.insert(updates.begin() + numUpdatedParams++, {newP, name.str()});
      ++numParams;
    }
    updates.push_back({nextStep, "step"});

    if (lossScale) {
      // Skip the step (keep every parameter and state) when a gradient is
      // inf or NaN; total - total is 0 exactly when total is finite.
      Value finite = dl::CompareOp::create(b, loc, dl::CmpPredicate::eq,
                                           e.sub(total, total), e.f32(0.0));
      llvm::StringMap<Value> old;
      for (BlockArgument arg : fn.getArguments()) {
        unsigned i = arg.getArgNumber();
        if (auto n = fn.getArgAttrOfType<StringAttr>(i, DLOptDialect::kParamAttr))
          old[n.getValue()] = arg;
        else if (auto n = fn.getArgAttrOfType<StringAttr>(i, DLOptDialect::kStateAttr))
          old[n.getValue()] = arg;
      }
      for (Update &u : updates)
        u.value = dl::SelectOp::create(b, loc, finite, u.value, old[u.name]);
      auto i64t = cast<RankedTensorType>(goodSteps.getType());
      auto i64c = [&](int64_t v) -> Value {
        return arith::ConstantOp::create(
            b, loc, i64t, DenseElementsAttr::get(i64t, b.getI64IntegerAttr(v)));
      };
      Value good1 = dl::AddOp::create(b, loc, goodSteps, i64c(1));
      Value grow = dl::CompareOp::create(b, loc, dl::CmpPredicate::ge, good1,
                                         i64c(growthInterval));
      Value scaleOk = dl::SelectOp::create(
          b, loc, grow, e.mul(lossScale, e.like(lossScale, 2.0)), lossScale);
      Value goodOk = dl::SelectOp::create(b, loc, grow, i64c(0), good1);
      updates.push_back(
          {dl::SelectOp::create(b, loc, finite, scaleOk,
                                e.mul(lossScale, e.like(lossScale, 0.5))),
           "loss_scale"});
      updates.push_back({dl::SelectOp::create(b, loc, finite, goodOk, i64c(0)),
                         "loss_scale.good_steps"});
    }

    // Results: loss, lr, grad_norm (unless grad-norm=false), other outputs,
    // updates.
    SmallVector<Value> results;
    SmallVector<DictionaryAttr> attrs;
    auto named = [&](StringRef output, StringRef update = {}) {
      NamedAttrList l;
      l.append(DLOptDialect::kOutputAttr, b.getStringAttr(output));
      if (!update.empty())
        l.append(DLOptDialect::kUpdateAttr, b.getStringAttr(update));
      return l.getDictionary(ctx);
    };
    results.push_back(ret->getOperand(0));
    attrs.push_back(fn.getResultAttrDict(0) ? fn.getResultAttrDict(0) : named("loss"));
    results.push_back(lrNow);
    attrs.push_back(named("lr"));
    if (norm) {
      results.push_back(norm);
      attrs.push_back(named("grad_norm"));
    }
    for (unsigned r : otherResults) {
      if (r == 0)
        continue;
      results.push_back(ret->getOperand(r));
      attrs.push_back(fn.getResultAttrDict(r) ? fn.getResultAttrDict(r)
                                              : b.getDictionaryAttr({}));
    }
    for (Update &u : updates) {
      results.push_back(u.value);
      NamedAttrList l(named(u.name, u.name));
      auto it = layouts.find(u.name);
      if (it != layouts.end())
        l.append(it->second);
      attrs.push_back(l.getDictionary(ctx));
    }
    func::ReturnOp::create(b, loc, results);
    ret->erase();
    SmallVector<Type> types;
    for (Value v : results)
      types.push_back(v.getType());
    fn.setFunctionType(FunctionType::get(ctx, body.getArgumentTypes(), types));
    fn.setAllResultAttrs(attrs);
    fn->setAttr(DLOptDialect::kTrainStepAttr, UnitAttr::get(ctx));
    return success();
  }

  /// lr(t) for 1-based step t: linear warmup, then constant, cosine or linear
  /// decay to min-lr at total-steps.
  Value buildSchedule(Emit &e, Value t) {
    Value peak = e.f32(lr);
    Value decayed = peak;
    if (schedule != "constant") {
      double span = double(totalSteps - warmupSteps);
      Value progress = e.div(e.sub(t, e.f32(double(warmupSteps))), e.f32(span));
      progress = e.min(e.max(progress, e.f32(0.0)), e.f32(1.0));
      Value frac;
      if (schedule == "cosine")
        frac = e.mul(e.f32(0.5),
                     e.add(e.f32(1.0), dl::CosOp::create(e.b, e.loc,
                                                         e.mul(progress, e.f32(M_PI)))));
      else
        frac = e.sub(e.f32(1.0), progress);
      decayed = e.add(e.f32(minLr), e.mul(e.f32(lr - minLr), frac));
    }
    if (warmupSteps <= 0)
      return decayed;
    Value warm = e.mul(peak, e.div(t, e.f32(double(warmupSteps))));
    Value inWarmup = dl::CompareOp::create(e.b, e.loc, dl::CmpPredicate::le, t,
                                           e.f32(double(warmupSteps)));
    return dl::SelectOp::create(e.b, e.loc, inWarmup, warm, decayed);
  }
};
} // namespace
