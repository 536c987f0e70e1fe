//===- MergeFusedElementwise.cpp - Multi-tensor fused groups --------------===//
//
// Merges independent dlopt.fused_elementwise groups that run the same
// per-element program (same body up to shapes, same dlopt.* marks) into one
// multi-tensor group (`segments = N`), so a backend runs them as one
// instruction: the optimizer update of every parameter of a training step is
// the typical case (as PyTorch's foreach/fused optimizers and apex's
// multi_tensor_apply do by hand).
//
// Groups are visited in program order; a group joins an open bucket of the
// same signature when no op at or before it uses a result of the bucket's
// members (that would be a data dependence, or a use the merged op, placed
// at the bucket's last member, would no longer dominate). Operands of the
// earlier members are defined before them, hence before the merged op.
//
//===----------------------------------------------------------------------===//
#include "dialects/DLOpt/IR/DLOptOps.h"
#include "passes/ModelUtils.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/raw_ostream.h"

#define DEBUG_TYPE "dlopt-merge-fused-elementwise"

namespace dlopt {
#define GEN_PASS_DEF_MERGEFUSEDELEMENTWISEPASS
#include "passes/Passes.h.inc"
} // namespace dlopt

using namespace mlir;
using namespace dlopt;

namespace {

/// A key equal for two groups exactly when they run the same per-element
/// program: the marks, each body argument's element type and rank-0-ness,
/// each body op's name, attributes (constants included), operand registers
/// and result element type, and the yielded registers.
static std::string signatureOf(dl::FusedElementwiseOp op) {
  std::string key;
  llvm::raw_string_ostream os(key);
  os << marksWithoutIds(op) << "|";
  Block &body = op.getBody().front();
  llvm::DenseMap<Value, int64_t> reg;
  for (BlockArgument a : body.getArguments()) {
    auto t = cast<RankedTensorType>(a.getType());
    os << "arg " << t.getElementType() << (t.getRank() == 0 ? " s" : " t")
       << ";";
    reg[a] = int64_t(reg.size());
  }
  for (Operation &inner : body) {
    os << inner.getName() << " " << inner.getAttrDictionary() << " (";
    for (Value v : inner.getOperands()) {
      auto it = reg.find(v);
      os << (it == reg.end() ? int64_t(-1) : it->second) << ",";
    }
    os << ") ->";
    for (Value r : inner.getResults()) {
      os << " " << cast<RankedTensorType>(r.getType()).getElementType();
      reg[r] = int64_t(reg.size());
    }
    os << ";";
  }
  return key;
}

/// The first op of `block` (in order) that uses a result of `op`, or nullptr
/// when there is none; `op` itself when a user lies outside the block.
static Operation *firstUser(Operation *op, Block &block) {
  Operation *first = nullptr;
  for (Value r : op->getResults())
    for (Operation *user : r.getUsers()) {
      Operation *anc = block.findAncestorOpInBlock(*user);
      if (!anc)
        return op;
      if (!first || anc->isBeforeInBlock(first))
        first = anc;
    }
  return first;
}

struct Bucket {
  SmallVector<dl::FusedElementwiseOp> ops; // in program order
  Operation *firstUse = nullptr; // earliest user of any member's result
  bool closed = false;
};

struct MergeFusedElementwisePass
    : dlopt::impl::MergeFusedElementwisePassBase<MergeFusedElementwisePass> {
  using MergeFusedElementwisePassBase::MergeFusedElementwisePassBase;

  void runOnOperation() override {
    FunctionOpInterface fn = getOperation();
    for (Block &block : fn.getFunctionBody())
      mergeBlock(block);
  }

  void mergeBlock(Block &block) {
    std::vector<Bucket> buckets;
    llvm::StringMap<SmallVector<size_t>> bySignature;
    for (Operation &opRef : block) {
      auto op = dyn_cast<dl::FusedElementwiseOp>(&opRef);
      if (!op)
        continue;
      SmallVector<size_t> &candidates = bySignature[signatureOf(op)];
      Operation *use = firstUser(op, block);
      bool placed = false;
      for (size_t id : llvm::reverse(candidates)) {
        Bucket &b = buckets[id];
        // A member's result used at or before `op`: a dependence, or a use
        // the merged op (placed at `op`) would not dominate.
        if (b.closed || (b.firstUse && !op->isBeforeInBlock(b.firstUse)))
          continue;
        b.ops.push_back(op);
        if (use == op.getOperation())
          b.closed = true;
        else if (use && (!b.firstUse || use->isBeforeInBlock(b.firstUse)))
          b.firstUse = use;
        placed = true;
        break;
      }
      if (placed)
        continue;
      Bucket b;
      b.ops.push_back(op);
      b.firstUse = use == op.getOperation() ? nullptr : use;
      b.closed = use == op.getOperation();
      candidates.push_back(buckets.size());
      buckets.push_back(std::move(b));
    }
    for (Bucket &b : buckets)
      if (b.ops.size() >= 2)
        merge(b);
  }

  void merge(Bucket &b) {
    dl::FusedElementwiseOp last = b.ops.back();
    SmallVector<Value> inputs;
    SmallVector<Type> resultTypes;
    SmallVector<Location> locs;
    int64_t segments = 0;
    for (dl::FusedElementwiseOp op : b.ops) {
      llvm::append_range(inputs, op.getInputs());
      llvm::append_range(resultTypes, op.getResultTypes());
      locs.push_back(op.getLoc());
      segments += op.getNumSegments();
    }
    OpBuilder builder(last);
    auto merged = dl::FusedElementwiseOp::create(
        builder, builder.getFusedLoc(locs), resultTypes, inputs,
        builder.getI64IntegerAttr(segments));
    merged->setDiscardableAttrs(marksWithoutIds(b.ops.front()));
    merged.getBody().takeBody(b.ops.front().getBody());
    size_t next = 0;
    for (dl::FusedElementwiseOp op : b.ops) {
      for (Value r : op.getResults())
        r.replaceAllUsesWith(merged.getResult(next++));
      op.erase();
    }
    ++numMerged;
    numSegments += segments;
  }
};

} // namespace
