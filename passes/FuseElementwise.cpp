//===- FuseElementwise.cpp - Outlines elementwise chains into fused groups ===//
//
// Greedy producer-consumer grouping in program order. An op joins the
// group(s) of its operands' producers when they share its result shape and
// dlopt.* marks, when the merged group stays within the plan format's limits
// (runtime/format/FusedProgram.h), and when no op outside the group that
// reads a group value sits before it (the fused op is placed at the group's
// last op, so such a reader would lose its operand's definition). The i1
// values of compare and select never cross a group's border (a compare joins
// the group of the select that reads it). Each group of min-group-size ops
// or more becomes one dlopt.fused_elementwise.
//
//===----------------------------------------------------------------------===//
#include "dialects/DLOpt/IR/DLOptOps.h"
#include "passes/ModelUtils.h"
#include "passes/Passes.h"
#include "runtime/format/FusedProgram.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/SmallPtrSet.h"

#define DEBUG_TYPE "dlopt-fuse-elementwise"

namespace dlopt {
#define GEN_PASS_DEF_FUSEELEMENTWISEPASS
#include "passes/Passes.h.inc"
} // namespace dlopt

using namespace mlir;
using namespace dlopt;

namespace {

/// A rank-0 float constant: copied into a group's body as an immediate.
static bool isScalarConstant(Value v) {
  auto cst = v.getDefiningOp<arith::ConstantOp>();
  if (!cst)
    return false;
  auto t = dyn_cast<RankedTensorType>(cst.getType());
  return t && t.getRank() == 0 && isa<FloatType>(t.getElementType()) &&
         isa<DenseElementsAttr>(cst.getValue());
}

/// Whether `v` is a float tensor (what a group's inputs and results are).
static bool isFloatValue(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && isa<FloatType>(t.getElementType());
}

/// The dlopt.* marks an op carries (layer, backward, recompute), without
/// its identity (dlopt.id, dlopt.fwd_id, dlopt.mb), which every op has its
/// own of.
static DictionaryAttr marksOf(Operation *op) { return marksWithoutIds(op); }

/// Whether `op` may be fused and, if so, its fused shape.
static std::optional<ArrayRef<int64_t>> fusedShapeOf(Operation *op) {
  if (op->getNumResults() != 1 || !dl::FusedElementwiseOp::isFusible(op))
    return std::nullopt;
  auto t = cast<RankedTensorType>(op->getResult(0).getType());
  if (!t.hasStaticShape())
    return std::nullopt;
  for (Type o : op->getOperandTypes()) {
    auto ot = cast<RankedTensorType>(o);
    if (ot.getRank() != 0 && ot.getShape() != t.getShape())
      return std::nullopt; // a general broadcast: not expressible
  }
  return t.getShape();
}

struct Group {
  SmallVector<Operation *> ops; // in program order
  SmallVector<int64_t> shape;
  DictionaryAttr marks;
  bool alive = true;
};

struct FuseElementwisePass
    : dlopt::impl::FuseElementwisePassBase<FuseElementwisePass> {
  using FuseElementwisePassBase::FuseElementwisePassBase;

  void runOnOperation() override {
    FunctionOpInterface fn = getOperation();
    if (minGroupSize < 2) {
      fn.emitError() << "dlopt-fuse-elementwise: expects min-group-size >= 2, "
                        "got "
                     << int64_t(minGroupSize);
      return signalPassFailure();
    }
    for (Block &block : fn.getFunctionBody())
      fuseBlock(block);
  }

  /// Counts a candidate group's inputs, constants and outputs.
  struct Counts {
    int64_t inputs = 0, consts = 0, outputs = 0;
  };
  static Counts count(ArrayRef<Operation *> ops,
                      const SmallPtrSetImpl<Operation *> &members) {
    llvm::SmallPtrSet<Value, 16> ins, csts;
    Counts c;
    for (Operation *op : ops) {
      for (Value v : op->getOperands()) {
        Operation *def = v.getDefiningOp();
        if (def && members.contains(def))
          continue;
        if (isScalarConstant(v))
          csts.insert(v);
        else
          ins.insert(v);
      }
      for (Value r : op->getResults())
        for (Operation *user : r.getUsers())
          if (!members.contains(user)) {
            ++c.outputs;
            break;
          }
    }
    c.inputs = ins.size();
    c.consts = csts.size();
    return c;
  }

  /// Whether `ops` (ending with `last`) can be one group placed at `last`.
  static bool canGroup(ArrayRef<Operation *> ops, Operation *last) {
    if (int64_t(ops.size()) > rt::fused::kMaxSteps)
      return false;
    llvm::SmallPtrSet<Operation *, 32> members(ops.begin(), ops.end());
    Block *block = last->getBlock();
    for (Operation *op : ops) {
      // A compare's i1 result and a select's i1 condition stay inside the
      // group: its inputs and results are float tensors.
      for (Value v : op->getOperands()) {
        Operation *def = v.getDefiningOp();
        if ((!def || !members.contains(def)) && !isFloatValue(v))
          return false;
      }
      for (Value r : op->getResults())
        for (Operation *user : r.getUsers()) {
          if (members.contains(user))
            continue;
          if (!isFloatValue(r))
            return false;
          Operation *anc = block->findAncestorOpInBlock(*user);
          if (!anc || anc->isBeforeInBlock(last) || anc == last)
            return false;
        }
    }
    Counts c = count(ops, members);
    return c.inputs <= rt::fused::kMaxInputs &&
           c.consts <= rt::fused::kMaxConsts &&
           c.outputs <= rt::fused::kMaxOutputs;
  }

  void fuseBlock(Block &block) {
    std::vector<Group> groups;
    llvm::DenseMap<Operation *, int> groupOf;
    for (Operation &opRef : block) {
      Operation *op = &opRef;
      std::optional<ArrayRef<int64_t>> shape = fusedShapeOf(op);
      if (!shape)
        continue;
      DictionaryAttr marks = marksOf(op);
      llvm::SetVector<int> producers;
      for (Value v : op->getOperands())
        if (Operation *def = v.getDefiningOp()) {
          auto it = groupOf.find(def);
          if (it == groupOf.end())
            continue;
          Group &g = groups[it->second];
          if (g.alive && ArrayRef<int64_t>(g.shape) == *shape &&
              g.marks == marks)
            producers.insert(it->second);
        }
      // Try all producer groups together, then each alone.
      auto tryMerge = [&](ArrayRef<int> ids) -> bool {
        if (ids.empty())
          return false;
        SmallVector<Operation *> ops;
        for (int id : ids)
          ops.append(groups[id].ops.begin(), groups[id].ops.end());
        llvm::sort(ops, [](Operation *a, Operation *b) {
          return a->isBeforeInBlock(b);
        });
        ops.push_back(op);
        if (!canGroup(ops, op))
          return false;
        int into = ids.front();
        for (int id : ids.drop_front())
          groups[id].alive = false;
        groups[into].ops = std::move(ops);
        for (Operation *m : groups[into].ops)
          groupOf[m] = into;
        return true;
      };
      SmallVector<int> all(producers.begin(), producers.end());
      bool merged = tryMerge(all);
      for (size_t i = 0; !merged && all.size() > 1 && i < all.size(); ++i)
        merged = tryMerge({all[i]});
      if (merged)
        continue;
      Group g;
      g.ops.push_back(op);
      g.shape.assign(shape->begin(), shape->end());
      g.marks = marks;
      groupOf[op] = int(groups.size());
      groups.push_back(std::move(g));
    }
    for (Group &g : groups)
      if (g.alive && int64_t(g.ops.size()) >= minGroupSize)
        outline(g);
  }

  void outline(Group &g) {
    llvm::SmallPtrSet<Operation *, 32> members(g.ops.begin(), g.ops.end());
    llvm::SetVector<Value> inputs, consts, outputs;
    for (Operation *op : g.ops) {
      for (Value v : op->getOperands()) {
        Operation *def = v.getDefiningOp();
        if (def && members.contains(def))
          continue;
        (isScalarConstant(v) ? consts : inputs).insert(v);
      }
      for (Value r : op->getResults())
        if (llvm::any_of(r.getUsers(), [&](Operation *u) {
              return !members.contains(u);
            }))
          outputs.insert(r);
    }
    Operation *last = g.ops.back();
    OpBuilder b(last->getContext());
    b.setInsertionPointAfter(last);
    SmallVector<Location> locs;
    for (Operation *op : g.ops)
      locs.push_back(op->getLoc());
    SmallVector<Type> resultTypes;
    for (Value v : outputs)
      resultTypes.push_back(v.getType());
    auto fused = dl::FusedElementwiseOp::create(
        b, b.getFusedLoc(locs), resultTypes, inputs.getArrayRef());
    fused->setDiscardableAttrs(g.marks);

    Block *body = new Block();
    fused.getBody().push_back(body);
    IRMapping map;
    for (Value in : inputs)
      map.map(in, body->addArgument(in.getType(), in.getLoc()));
    OpBuilder bb = OpBuilder::atBlockEnd(body);
    for (Value c : consts)
      map.map(c, bb.clone(*c.getDefiningOp())->getResult(0));
    for (Operation *op : g.ops) {
      // The body is a per-element program: no marks, no ids.
      Operation *copy = bb.clone(*op, map);
      copy->setDiscardableAttrs(DictionaryAttr::get(copy->getContext()));
    }
    SmallVector<Value> yielded;
    for (Value v : outputs)
      yielded.push_back(map.lookup(v));
    dl::YieldOp::create(bb, fused.getLoc(), yielded);

    for (auto [out, r] : llvm::zip(outputs, fused.getResults()))
      Value(out).replaceUsesWithIf(r, [&](OpOperand &use) {
        return !members.contains(use.getOwner());
      });
    for (Operation *op : llvm::reverse(g.ops))
      op->erase();
    for (Value c : consts)
      if (c.use_empty())
        c.getDefiningOp()->erase();
    ++numGroups;
    numFusedOps += g.ops.size();
  }
};

} // namespace
