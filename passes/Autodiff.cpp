//===- Autodiff.cpp - Reverse-mode differentiation of the model loss ------===//
#include "dialects/DLOpt/IR/DLOptOps.h"
#include "passes/ModelUtils.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"

#define DEBUG_TYPE "dlopt-autodiff"

namespace dlopt {
#define GEN_PASS_DEF_AUTODIFFPASS
#include "passes/Passes.h.inc"
} // namespace dlopt

using namespace mlir;
using namespace dlopt;
using dl::DLOptDialect;

static bool isFloatTensor(Type t) {
  auto rt = dyn_cast<RankedTensorType>(t);
  return rt && isa<FloatType>(rt.getElementType());
}

namespace {
struct AutodiffPass : dlopt::impl::AutodiffPassBase<AutodiffPass> {
  using AutodiffPassBase::AutodiffPassBase;

  void runOnOperation() override {
    FailureOr<func::FuncOp> fn = findEntryFunction(getOperation(), entry);
    if (failed(fn) || failed(differentiate(*fn)))
      return signalPassFailure();
  }

  LogicalResult differentiate(func::FuncOp fn) {
    if (fn.isExternal() || !fn.getBody().hasOneBlock())
      return fn.emitError("expects a model function with a single-block body");
    if (!fn->hasAttr(DLOptDialect::kLossAttr) || fn.getNumResults() == 0)
      return fn.emitError("expects a function marked dlopt.loss whose first "
                          "result is a rank-0 float loss; nothing to "
                          "differentiate");
    auto lossType = dyn_cast<RankedTensorType>(fn.getResultTypes()[0]);
    if (!lossType || lossType.getRank() != 0 ||
        !isa<FloatType>(lossType.getElementType()))
      return fn.emitError() << "expects the loss (result #0) to be a rank-0 "
                               "float tensor, got "
                            << fn.getResultTypes()[0];

    Block &body = fn.getBody().front();
    Operation *ret = body.getTerminator();
    OpBuilder b(ret);
    Location loc = ret->getLoc();
    llvm::DenseMap<Value, Value> grads;

    // The gradient contributions of a narrowing cast of an argument (a
    // master weight's bf16/f16 copy under mixed precision) are kept apart and
    // widened one by one before they are summed in the wide type: a tied
    // embedding's lookup and head gradients then never round to the narrow
    // type as a sum, and a pipeline can sum each stage's terms on its own
    // stage (dlopt-pipeline's per-stage sums) and reach the same result up
    // to the order of f32 additions.
    auto narrowingCast = [](Value v) {
      auto c = v.getDefiningOp<dl::CastOp>();
      // Of an argument (a parameter): activations keep their running sum.
      if (!c || !isa<BlockArgument>(c.getOperand()))
        return false;
      auto in = dyn_cast<RankedTensorType>(c.getOperand().getType());
      auto out = dyn_cast<RankedTensorType>(v.getType());
      return in && out && isa<FloatType>(in.getElementType()) &&
             isa<FloatType>(out.getElementType()) &&
             out.getElementType().getIntOrFloatBitWidth() <
                 in.getElementType().getIntOrFloatBitWidth();
    };
    llvm::DenseMap<Value, SmallVector<Value>> parts;
    auto accumulate = [&](Value v, Value g) {
      if (narrowingCast(v)) {
        parts[v].push_back(g);
        return;
      }
      auto [it, inserted] = grads.try_emplace(v, g);
      if (!inserted)
        it->second = dl::AddOp::create(b, g.getLoc(), it->second, g);
    };

    // The backward pass starts from d loss = 1, or from the dynamic loss
    // scale when mixed precision added one (dlopt.state = "loss_scale").
    Value loss = ret->getOperand(0);
    Value seed;
    for (BlockArgument arg : fn.getArguments())
      if (auto s = fn.getArgAttrOfType<StringAttr>(arg.getArgNumber(), DLOptDialect::kStateAttr))
        if (s.getValue() == "loss_scale")
          seed = arg.getType() == lossType
                     ? Value(arg)
                     : Value(dl::CastOp::create(b, loc, lossType, arg));
    if (!seed)
      seed = arith::ConstantOp::create(
          b, loc, lossType,
          DenseElementsAttr::get(lossType, b.getFloatAttr(lossType.getElementType(), 1.0)));
    accumulate(loss, seed);

    // The ops built after `before` (the gradient of `op`) are backward ops
    // derived from it, in the layer of the op they differentiate.
    auto markBackward = [&](Operation *op, Operation *before) {
      Attribute layer = op->getAttr(DLOptDialect::kLayerAttr);
      for (Operation *n = before ? before->getNextNode() : &body.front();
           n != ret; n = n->getNextNode()) {
        ++numGradOps;
        n->setAttr(DLOptDialect::kBackwardAttr, b.getUnitAttr());
        markDerivedOp(op, n);
        if (layer)
          n->setAttr(DLOptDialect::kLayerAttr, layer);
      }
    };

    SmallVector<Operation *> forward;
    for (Operation &op : body.without_terminator())
      forward.push_back(&op);
    for (Operation *op : llvm::reverse(forward)) {
      SmallVector<Value> resultGrads;
      bool any = false;
      for (Value r : op->getResults()) {
        Value g = grads.lookup(r);
        if (auto it = parts.find(r); it != parts.end() && it->second.size() == 1)
          g = it->second.front(); // one contribution: the cast's own rule
        resultGrads.push_back(g);
        any |= bool(g);
      }
      // A narrowing cast whose result has several contributions: each one
      // widened, then summed (see `parts`).
      if (auto it = op->getNumResults() == 1 ? parts.find(op->getResult(0))
                                              : parts.end();
          it != parts.end() && it->second.size() > 1) {
        Operation *before = ret->getPrevNode();
        b.setInsertionPoint(ret);
        Value operand = op->getOperand(0), sum;
        for (Value g : it->second) {
          Value w = dl::CastOp::create(b, g.getLoc(), operand.getType(), g);
          sum = sum ? Value(dl::AddOp::create(b, g.getLoc(), sum, w)) : w;
        }
        markBackward(op, before);
        accumulate(operand, sum);
        continue;
      }
      if (!any || op->getNumOperands() == 0)
        continue;
      auto iface = dyn_cast<dl::AutodiffOpInterface>(op);
      if (!iface) {
        InFlightDiagnostic d = op->emitError()
                               << "op '" << op->getName()
                               << "' is not differentiable, but the loss "
                                  "depends on its result";
        d.attachNote(fn.getLoc()) << "while differentiating the loss of @"
                                  << fn.getSymName();
        return failure();
      }
      Operation *before = ret->getPrevNode();
      SmallVector<Value> operandGrads;
      b.setInsertionPoint(ret);
      if (failed(iface.buildGradients(b, resultGrads, operandGrads)))
        return op->emitError() << "failed to build the gradient of '"
                               << op->getName() << "'";
      if (operandGrads.size() != op->getNumOperands())
        return op->emitError() << "gradient rule returned "
                               << operandGrads.size() << " gradients for "
                               << op->getNumOperands() << " operands";
      markBackward(op, before);
      for (auto [operand, g] : llvm::zip(op->getOperands(), operandGrads)) {
        if (!g || !isFloatTensor(operand.getType()))
          continue;
        if (g.getType() != operand.getType())
          return op->emitError()
                 << "gradient rule produced " << g.getType()
                 << " for an operand of type " << operand.getType();
        accumulate(operand, g);
      }
    }

    // New results: the original ones, then one gradient per parameter.
    SmallVector<Value> results(ret->getOperands());
    SmallVector<Type> resultTypes(fn.getResultTypes());
    SmallVector<DictionaryAttr> resultAttrs;
    for (unsigned i = 0; i < fn.getNumResults(); ++i)
      resultAttrs.push_back(fn.getResultAttrDict(i) ? fn.getResultAttrDict(i)
                                                    : b.getDictionaryAttr({}));
    for (unsigned i = 0; i < fn.getNumArguments(); ++i) {
      auto name = fn.getArgAttrOfType<StringAttr>(i, DLOptDialect::kParamAttr);
      if (!name)
        continue;
      BlockArgument arg = fn.getArgument(i);
      Value g = grads.lookup(arg);
      if (!g) {
        fn.emitWarning() << "parameter '" << name.getValue()
                         << "' does not reach the loss through differentiable ops; its gradient is zero";
        ++numZeroGrads;
        auto t = cast<RankedTensorType>(arg.getType());
        g = arith::ConstantOp::create(
            b, loc, t, DenseElementsAttr::get(t, b.getZeroAttr(t.getElementType())));
      }
      results.push_back(g);
      resultTypes.push_back(arg.getType());
      resultAttrs.push_back(b.getDictionaryAttr(
          {b.getNamedAttr(DLOptDialect::kOutputAttr,
                          b.getStringAttr("grad." + name.getValue())),
           b.getNamedAttr(DLOptDialect::kGradAttr, name)}));
    }
    func::ReturnOp::create(b, loc, results);
    ret->erase();
    fn.setFunctionType(b.getFunctionType(fn.getArgumentTypes(), resultTypes));
    fn.setAllResultAttrs(resultAttrs);
    return success();
  }
};
} // namespace
