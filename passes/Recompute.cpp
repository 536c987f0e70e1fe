//===- Recompute.cpp - Activation recomputation per layer -----------------===//
#include "dialects/DLOpt/IR/DLOptOps.h"
#include "passes/ModelUtils.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

#define DEBUG_TYPE "dlopt-recompute"

namespace dlopt {
#define GEN_PASS_DEF_RECOMPUTEPASS
#include "passes/Passes.h.inc"
} // namespace dlopt

using namespace mlir;
using namespace dlopt;
using dl::DLOptDialect;

namespace {
struct RecomputePass : dlopt::impl::RecomputePassBase<RecomputePass> {
  using RecomputePassBase::RecomputePassBase;

  void runOnOperation() override {
    if (policy != "none" && policy != "full" && policy != "selective") {
      getOperation().emitError() << "dlopt-recompute: unknown policy '"
                                 << std::string(policy)
                                 << "', expected none, full or selective";
      return signalPassFailure();
    }
    FailureOr<func::FuncOp> fn = findEntryFunction(getOperation(), entry);
    if (failed(fn))
      return signalPassFailure();
    if (policy == "none")
      return;
    recompute(*fn);
  }

  static std::optional<int64_t> layerOf(Operation *op) {
    if (auto a = op->getAttrOfType<IntegerAttr>(DLOptDialect::kLayerAttr))
      return a.getInt();
    return std::nullopt;
  }

  bool recomputable(Operation *op) {
    if (policy == "selective")
      return isa<dl::SoftmaxOp, dl::LogSoftmaxOp, dl::DropoutOp>(op);
    return true;
  }

  void recompute(func::FuncOp fn) {
    Block &body = fn.getBody().front();
    // Forward ops of each layer, in program order, and the first backward op
    // of each layer; per micro-batch when the step replays several
    // (dlopt.mb), since each replay's backward re-runs its own forward.
    using Key = std::pair<int64_t, int64_t>; // (layer, micro-batch or -1)
    llvm::MapVector<Key, SmallVector<Operation *>> forward;
    llvm::DenseMap<Key, Operation *> firstBackward;
    for (Operation &op : body.without_terminator()) {
      std::optional<int64_t> layer = layerOf(&op);
      if (!layer)
        continue;
      auto mb = op.getAttrOfType<IntegerAttr>(DLOptDialect::kMicroBatchAttr);
      Key key{*layer, mb ? mb.getInt() : -1};
      if (op.hasAttr(DLOptDialect::kBackwardAttr))
        firstBackward.try_emplace(key, &op);
      else
        forward[key].push_back(&op);
    }
    for (auto &[key, ops] : forward) {
      Operation *insertAt = firstBackward.lookup(key);
      if (!insertAt)
        continue;
      llvm::SmallPtrSet<Operation *, 32> inLayer(ops.begin(), ops.end());
      auto usedLater = [&](Value v) {
        for (Operation *user : v.getUsers())
          if (user->hasAttr(DLOptDialect::kBackwardAttr) &&
              !user->isBeforeInBlock(insertAt))
            return true;
        return false;
      };
      // Which forward ops to clone: those the backward pass reads (that the
      // policy allows), plus, for `full`, everything they depend on inside
      // the layer.
      llvm::SetVector<Operation *> clone;
      for (Operation *op : llvm::reverse(ops)) {
        bool needed = llvm::any_of(op->getResults(), usedLater) ||
                      llvm::any_of(op->getUsers(), [&](Operation *u) {
                        return clone.contains(u);
                      });
        if (needed && recomputable(op) && !isa<arith::ConstantOp>(op))
          clone.insert(op);
      }
      if (clone.empty())
        continue;
      OpBuilder b(insertAt);
      IRMapping map;
      for (Operation *op : ops) {
        if (!clone.contains(op))
          continue;
        Operation *copy = b.clone(*op, map);
        copy->setAttr(DLOptDialect::kRecomputeAttr, b.getUnitAttr());
        markDerivedOp(op, copy);
        ++numCloned;
      }
      // ZeRO-3: the recomputed forward gathers the layer's parameters again;
      // the backward pass reads those gathers instead of its own, so each
      // parameter is gathered once per backward pass, as FSDP does with
      // activation checkpointing.
      for (Operation *op : clone) {
        auto mine = dyn_cast<shard::AllGatherOp>(
            map.lookup(op->getResult(0)).getDefiningOp());
        auto phase = mine ? mine->getAttrOfType<StringAttr>(DLOptDialect::kZeroGatherAttr)
                          : StringAttr();
        if (!phase || !phase.getValue().starts_with("fwd"))
          continue;
        std::string bwd = ("bwd" + phase.getValue().drop_front(3)).str();
        for (Operation *user : llvm::make_early_inc_range(op->getOperand(0).getUsers())) {
          auto other = user->getAttrOfType<StringAttr>(DLOptDialect::kZeroGatherAttr);
          auto theirs = dyn_cast<shard::AllGatherOp>(user);
          if (!other || other.getValue() != bwd || !theirs ||
              theirs.getType() != mine.getType() ||
              theirs.getGatherAxis() != mine.getGatherAxis() ||
              theirs.getGridAxes() != mine.getGridAxes())
            continue;
          bool dominated = llvm::all_of(user->getUsers(), [&](Operation *u) {
            return mine->isBeforeInBlock(u);
          });
          if (!dominated)
            continue;
          user->getResult(0).replaceAllUsesWith(mine.getResult());
          user->erase();
        }
      }
      // Backward ops from the insertion point on read the clones.
      for (Operation *op : clone)
        for (auto [orig, copy] :
             llvm::zip(op->getResults(), map.lookup(op->getResult(0)).getDefiningOp()->getResults()))
          orig.replaceUsesWithIf(copy, [&](OpOperand &use) {
            Operation *user = use.getOwner();
            return user->hasAttr(DLOptDialect::kBackwardAttr) &&
                   !user->isBeforeInBlock(insertAt);
          });
    }
  }
};
} // namespace
