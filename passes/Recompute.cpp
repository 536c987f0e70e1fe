//===- Recompute.cpp - Activation recomputation per layer -----------------===//
#include "dialects/DLOpt/IR/DLOptOps.h"
#include "passes/ModelUtils.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"
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

/// The parameters a ZeRO-3 gather gathers, each as its shard and its
/// full value: one, or, for a bucket (dlopt-optimizer's bucketGathers), one
/// per reshaped shard its concatenation reads, with the column offset of
/// its block in the gathered [ranks, total] rows.
struct GatheredPiece {
  Value shard;
  int64_t offset = 0;
  int64_t size = 0;
};

SmallVector<GatheredPiece> gatheredPieces(shard::AllGatherOp g) {
  Value in = g.getInput();
  auto c = in.getDefiningOp<dl::ConcatOp>();
  if (!c || c.getDim() != 1)
    return {{in, 0, cast<RankedTensorType>(in.getType()).getNumElements()}};
  SmallVector<GatheredPiece> pieces;
  int64_t offset = 0;
  for (Value v : c.getOperands()) {
    auto r = v.getDefiningOp<dl::ReshapeOp>();
    int64_t n = cast<RankedTensorType>(v.getType()).getNumElements();
    pieces.push_back({r ? r.getInput() : v, offset, n});
    offset += n;
  }
  return pieces;
}

bool isBucket(shard::AllGatherOp g) {
  return g.getInput().getDefiningOp<dl::ConcatOp>() != nullptr;
}

/// The backward pass's gathers `g` of parameters that the recomputed
/// forward gather `mine` also gathers read `mine` instead: each full
/// parameter becomes a slice of `mine`'s rows (a bucket) or `mine` itself.
/// Returns false, changing nothing, unless every parameter `g` gathers is
/// in `mine` and `mine` comes before every use of `g`.
bool reuseGather(shard::AllGatherOp mine, shard::AllGatherOp g) {
  if (g.getGridAxes() != mine.getGridAxes() ||
      g.getGatherAxis() != mine.getGatherAxis() ||
      g.getGatherAxis().getSExtValue() != 0 ||
      getElementTypeOrSelf(g.getType()) != getElementTypeOrSelf(mine.getType()))
    return false;
  SmallVector<GatheredPiece> ours = gatheredPieces(mine), theirs = gatheredPieces(g);
  auto find = [&](Value shard) -> const GatheredPiece * {
    for (const GatheredPiece &p : ours)
      if (p.shard == shard)
        return &p;
    return nullptr;
  };
  for (const GatheredPiece &p : theirs)
    if (!find(p.shard))
      return false;
  if (!llvm::all_of(g->getUsers(), [&](Operation *u) { return mine->isBeforeInBlock(u); }))
    return false;
  // Where each of g's parameters is used, as a full value: its bucket's
  // slice (then reshaped), or g itself.
  SmallVector<std::pair<Operation *, const GatheredPiece *>> uses;
  if (isBucket(g)) {
    for (Operation *u : g->getUsers()) {
      auto slice = dyn_cast<dl::SliceOp>(u);
      if (!slice || slice.getStart().size() != 2)
        return false;
      int64_t off = slice.getStart()[1];
      const GatheredPiece *piece = nullptr;
      for (const GatheredPiece &p : theirs)
        if (p.offset == off)
          piece = &p;
      if (!piece)
        return false;
      uses.push_back({u, piece});
    }
  } else if (isBucket(mine)) {
    uses.push_back({g, &theirs.front()});
  } else {
    g.getResult().replaceAllUsesWith(mine.getResult());
    g->erase();
    return true;
  }
  OpBuilder b(mine->getContext());
  b.setInsertionPointAfter(mine);
  SmallVector<Operation *> u0Users;
  const int64_t ranks = cast<RankedTensorType>(mine.getType()).getDimSize(0);
  DictionaryAttr marks = mine->getDiscardableAttrDictionary();
  // A value of `type` derived from v by `op`: the recomputed forward's own
  // (a slice or reshape of the gather that it already cloned), else a new
  // one right after the gather.
  auto derived = [&](Value v, Type type, auto match, auto build) -> Value {
    for (Operation *user : v.getUsers())
      if (user->getResult(0).getType() == type && match(user) &&
          llvm::all_of(u0Users, [&](Operation *x) { return user->isBeforeInBlock(x); }))
        return user->getResult(0);
    Value r = build();
    r.getDefiningOp()->setDiscardableAttrs(marks);
    b.setInsertionPointAfter(r.getDefiningOp());
    return r;
  };
  for (auto [u, piece] : uses) {
    const GatheredPiece &p = *find(piece->shard);
    u0Users.assign(u->getUsers().begin(), u->getUsers().end());
    Value v = mine.getResult();
    if (isBucket(mine)) {
      auto type = RankedTensorType::get(
          {ranks, p.size}, getElementTypeOrSelf(mine.getType()));
      SmallVector<int64_t> start{0, p.offset}, limit{ranks, p.offset + p.size};
      v = derived(
          v, type,
          [&](Operation *x) {
            auto s = dyn_cast<dl::SliceOp>(x);
            return s && s.getStart() == ArrayRef<int64_t>(start) &&
                   s.getLimit() == ArrayRef<int64_t>(limit);
          },
          [&]() -> Value {
            return dl::SliceOp::create(b, u->getLoc(), mine.getResult(),
                                       b.getDenseI64ArrayAttr(start),
                                       b.getDenseI64ArrayAttr(limit),
                                       b.getDenseI64ArrayAttr({1, 1}));
          });
    }
    Type want = u->getResult(0).getType();
    if (v.getType() != want)
      v = derived(
          v, want, [](Operation *x) { return isa<dl::ReshapeOp>(x); },
          [&]() -> Value { return dl::ReshapeOp::create(b, u->getLoc(), want, v); });
    u->getResult(0).replaceAllUsesWith(v);
    if (u != g.getOperation())
      u->erase();
  }
  Value in = g.getInput();
  g->erase();
  // A bucket's concatenation of the shards is dead now.
  if (auto c = in.getDefiningOp<dl::ConcatOp>(); c && c->use_empty()) {
    SmallVector<Operation *> parts;
    for (Value v : c.getOperands())
      if (Operation *d = v.getDefiningOp())
        parts.push_back(d);
    c->erase();
    for (Operation *d : parts)
      if (d->use_empty())
        d->erase();
  }
  return true;
}

struct RecomputePass : dlopt::impl::RecomputePassBase<RecomputePass> {
  using RecomputePassBase::RecomputePassBase;

  void runOnOperation() override {
    if (policy != "none" && policy != "full" && policy != "selective" &&
        policy != "elementwise" && policy != "alternate") {
      getOperation().emitError() << "dlopt-recompute: unknown policy '"
                                 << std::string(policy)
                                 << "', expected none, selective, elementwise, "
                                    "alternate or full";
      return signalPassFailure();
    }
    FailureOr<func::FuncOp> fn = findEntryFunction(getOperation(), entry);
    if (failed(fn))
      return signalPassFailure();
    if (policy == "none")
      return;
    tpAxis = meshAxisIndex(getOperation(), "tp");
    cpAxis = meshAxisIndex(getOperation(), "cp");
    recompute(*fn);
  }

  /// The partitioned step's mesh axes tp and cp (meshAxisIndex), or -1.
  int tpAxis = -1, cpAxis = -1;
  /// The matmuls `alternate` re-runs: of each layer's forward (per
  /// micro-batch), in program order, the second, the fourth, ...
  llvm::DenseSet<Operation *> rerunMatmuls;

  static std::optional<int64_t> layerOf(Operation *op) {
    if (auto a = op->getAttrOfType<IntegerAttr>(DLOptDialect::kLayerAttr))
      return a.getInt();
    return std::nullopt;
  }

  /// An activation gathered over tp alone (sequence parallelism's gathers
  /// of the norm outputs for the column-parallel matmuls) or over cp alone
  /// (context parallelism's keys and values for the attention), not a
  /// ZeRO-3 parameter gather.
  bool isActivationGather(Operation *op) const {
    auto g = dyn_cast<shard::AllGatherOp>(op);
    if (!g || g->hasAttr(DLOptDialect::kZeroGatherAttr))
      return false;
    ArrayRef<int16_t> axes = g.getGridAxes();
    return axes.size() == 1 &&
           ((tpAxis >= 0 && axes[0] == tpAxis) ||
            (cpAxis >= 0 && axes[0] == cpAxis));
  }

  bool recomputable(Operation *op) {
    // Selective: the attention-core results (softmax, log-softmax, dropout)
    // and the tp and cp all-gathers of activations (under sequence
    // parallelism the norm outputs, under context parallelism the keys and
    // values): the backward pass gathers the kept shard again, as
    // Megatron-LM does, instead of holding the gathered copy from the
    // forward.
    if (policy == "selective")
      return isa<dl::SoftmaxOp, dl::LogSoftmaxOp, dl::DropoutOp>(op) ||
             isActivationGather(op);
    // Elementwise: every op but the matmuls, attention and convolutions,
    // whose results stay, and but the collectives that move data between
    // ranks other than those gathers (reductions are not re-run).
    // Alternate: the same and every second matmul of the layer
    // (torchtitan's per-op selective checkpointing, which saves the
    // outputs of the odd-numbered matmuls only). A ZeRO-3 parameter gather is re-run too when a recomputed op reads
    // it (a norm's weight, a re-run matmul's), and the backward pass then
    // reads that gather instead of its own: reading the forward's gather
    // instead would hold every layer's gathered parameters from its
    // forward to its backward pass, undoing ZeRO-3.
    if (policy == "elementwise" || policy == "alternate") {
      if (isa<dl::AttentionOp, dl::Conv2DOp, dl::SendRecvOp>(op))
        return false;
      if (isa<dl::MatmulOp>(op))
        return rerunMatmuls.contains(op);
      if (op->getDialect() && isa<shard::ShardDialect>(op->getDialect()))
        return isActivationGather(op) || isa<shard::AllSliceOp>(op) ||
               (isa<shard::AllGatherOp>(op) &&
                op->hasAttr(DLOptDialect::kZeroGatherAttr));
      return true;
    }
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
    if (policy == "alternate")
      for (auto &[key, ops] : forward) {
        int64_t n = 0;
        for (Operation *op : ops)
          if (isa<dl::MatmulOp>(op) && ++n % 2 == 0)
            rerunMatmuls.insert(op);
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
        // The backward gathers of the same parameters: of the same shard,
        // or, in a bucket, of a concatenation of such shards.
        SmallVector<shard::AllGatherOp> theirs;
        for (const GatheredPiece &p : gatheredPieces(mine)) {
          SmallVector<Value> work{p.shard};
          for (int depth = 0; depth < 3 && !work.empty(); ++depth) {
            SmallVector<Value> next;
            for (Value v : work)
              for (Operation *user : v.getUsers()) {
                if (auto g = dyn_cast<shard::AllGatherOp>(user)) {
                  auto other = g->getAttrOfType<StringAttr>(DLOptDialect::kZeroGatherAttr);
                  if (other && other.getValue() == bwd && g != mine &&
                      !llvm::is_contained(theirs, g))
                    theirs.push_back(g);
                } else if (isa<dl::ReshapeOp, dl::ConcatOp>(user)) {
                  next.push_back(user->getResult(0));
                }
              }
            work = std::move(next);
          }
        }
        for (shard::AllGatherOp g : theirs)
          reuseGather(mine, g);
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
