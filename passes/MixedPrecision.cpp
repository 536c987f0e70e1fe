//===- MixedPrecision.cpp - bf16/fp16 compute with fp32 master weights ----===//
#include "dialects/DLOpt/IR/DLOptOps.h"
#include "passes/ModelUtils.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

#define DEBUG_TYPE "dlopt-mixed-precision"

namespace dlopt {
#define GEN_PASS_DEF_MIXEDPRECISIONPASS
#include "passes/Passes.h.inc"
} // namespace dlopt

using namespace mlir;
using namespace dlopt;
using dl::DLOptDialect;

static Type floatElem(Type t) {
  auto rt = dyn_cast<RankedTensorType>(t);
  if (rt && isa<FloatType>(rt.getElementType()))
    return rt.getElementType();
  return {};
}

namespace {
struct MixedPrecisionPass
    : dlopt::impl::MixedPrecisionPassBase<MixedPrecisionPass> {
  using MixedPrecisionPassBase::MixedPrecisionPassBase;

  void runOnOperation() override {
    if (precision != "bf16" && precision != "fp16") {
      getOperation().emitError() << "dlopt-mixed-precision: unknown precision '"
                                 << std::string(precision)
                                 << "', expected bf16 or fp16";
      return signalPassFailure();
    }
    FailureOr<func::FuncOp> fn = findEntryFunction(getOperation(), entry);
    if (failed(fn))
      return signalPassFailure();
    convert(*fn);
    if (precision == "fp16")
      addLossScaleState(*fn);
  }

  /// Ops whose results stay in fp32.
  static bool keepsF32(Operation *op) {
    return isa<dl::SoftmaxOp, dl::LogSoftmaxOp, dl::SumOp, dl::MeanOp,
               dl::CrossEntropyOp, dl::MSEOp>(op);
  }

  void convert(func::FuncOp fn) {
    MLIRContext *ctx = fn.getContext();
    Type low = precision == "bf16" ? Type(BFloat16Type::get(ctx))
                                   : Type(Float16Type::get(ctx));
    Type f32 = Float32Type::get(ctx);
    Block &body = fn.getBody().front();
    llvm::DenseMap<std::pair<Value, Type>, Value> casts;
    auto castTo = [&](OpBuilder &b, Value v, Type elem) -> Value {
      Type cur = floatElem(v.getType());
      if (!cur || cur == elem)
        return v;
      Value &slot = casts[{v, elem}];
      if (!slot) {
        auto t = RankedTensorType::get(cast<RankedTensorType>(v.getType()).getShape(), elem);
        slot = dl::CastOp::create(b, v.getLoc(), t, v);
        if (Operation *def = v.getDefiningOp()) {
          if (Attribute layer = def->getAttr(DLOptDialect::kLayerAttr))
            slot.getDefiningOp()->setAttr(DLOptDialect::kLayerAttr, layer);
          // A cast of op N's result belongs to op N.
          markDerivedOp(def, slot.getDefiningOp());
        }
        ++numCasts;
      }
      return slot;
    };
    SmallVector<Operation *> ops;
    for (Operation &op : body.without_terminator())
      ops.push_back(&op);
    for (Operation *op : ops) {
      if (isa<arith::ConstantOp, dl::CastOp>(op) ||
          !isa<DLOptDialect>(op->getDialect()))
        continue;
      bool touchesFloat =
          llvm::any_of(op->getOperandTypes(), [](Type t) { return bool(floatElem(t)); }) ||
          llvm::any_of(op->getResultTypes(), [](Type t) { return bool(floatElem(t)); });
      if (!touchesFloat)
        continue;
      // Scalar arithmetic (combining loss terms, say) stays in fp32: it is
      // cheap, and a 16-bit loss would also turn the fp16 loss scale into
      // inf on its way back.
      bool scalar = llvm::all_of(op->getResultTypes(), [](Type t) {
        return !floatElem(t) || cast<RankedTensorType>(t).getRank() == 0;
      });
      Type c = keepsF32(op) || scalar ? f32 : low;
      OpBuilder b(op);
      for (OpOperand &use : op->getOpOperands())
        if (floatElem(use.get().getType()))
          use.set(castTo(b, use.get(), c));
      for (Value r : op->getResults())
        if (floatElem(r.getType()))
          r.setType(RankedTensorType::get(cast<RankedTensorType>(r.getType()).getShape(), c));
    }
    Operation *ret = body.getTerminator();
    OpBuilder b(ret);
    for (auto [i, use] : llvm::enumerate(ret->getOpOperands())) {
      Type declared = fn.getResultTypes()[i];
      if (use.get().getType() != declared)
        use.set(castTo(b, use.get(), cast<RankedTensorType>(declared).getElementType()));
    }
  }

  void addLossScaleState(func::FuncOp fn) {
    MLIRContext *ctx = fn.getContext();
    Builder b(ctx);
    auto add = [&](Type t, StringRef name, DictionaryAttr init) {
      NamedAttrList attrs;
      attrs.append(DLOptDialect::kStateAttr, b.getStringAttr(name));
      if (init)
        attrs.append(DLOptDialect::kInitAttr, init);
      (void)fn.insertArgument(fn.getNumArguments(), t, attrs.getDictionary(ctx),
                              fn.getLoc());
    };
    add(RankedTensorType::get({}, b.getF32Type()), "loss_scale",
        b.getDictionaryAttr({b.getNamedAttr("dist", b.getStringAttr("constant")),
                             b.getNamedAttr("value", b.getF64FloatAttr(initScale))}));
    add(RankedTensorType::get({}, b.getI64Type()), "loss_scale.good_steps", {});
  }
};
} // namespace
