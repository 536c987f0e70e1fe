//===- CheckModel.cpp - Checks model-function conventions -----------------===//
#include "dialects/DLOpt/IR/DLOptOps.h"
#include "passes/ModelUtils.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#define DEBUG_TYPE "dlopt-check-model"

namespace dlopt {
#define GEN_PASS_DEF_CHECKMODELPASS
#include "passes/Passes.h.inc"
} // namespace dlopt

using namespace mlir;
using namespace dlopt;
using dl::DLOptDialect;

FailureOr<func::FuncOp> dlopt::findEntryFunction(ModuleOp module,
                                                 StringRef entry) {
  if (!entry.empty()) {
    if (auto f = module.lookupSymbol<func::FuncOp>(entry))
      return f;
    module.emitError() << "entry function '@" << entry << "' not found";
    return failure();
  }
  if (auto f = module.lookupSymbol<func::FuncOp>("main"))
    return f;
  func::FuncOp only;
  int count = 0;
  for (auto f : module.getOps<func::FuncOp>())
    if (f.isPublic() && !f.isExternal()) {
      only = f;
      ++count;
    }
  if (count == 1)
    return only;
  module.emitError() << "expects a function @main or exactly one public "
                        "function as the model entry, found "
                     << count << " public functions";
  return failure();
}

unsigned dlopt::stampOpIds(func::FuncOp fn) {
  if (fn.isExternal())
    return 0;
  int64_t next = 0;
  for (Operation &op : fn.getBody().front())
    if (auto id = op.getAttrOfType<IntegerAttr>(DLOptDialect::kIdAttr))
      next = std::max(next, id.getInt() + 1);
  Builder b(fn.getContext());
  unsigned stamped = 0;
  for (Operation &op : fn.getBody().front()) {
    if (op.hasTrait<OpTrait::IsTerminator>() ||
        op.hasAttr(DLOptDialect::kIdAttr) ||
        op.hasAttr(DLOptDialect::kFwdIdAttr))
      continue;
    op.setAttr(DLOptDialect::kIdAttr, b.getI64IntegerAttr(next++));
    ++stamped;
  }
  return stamped;
}

bool dlopt::isOpIdentityAttr(StringRef name) {
  return name == DLOptDialect::kIdAttr || name == DLOptDialect::kFwdIdAttr ||
         name == DLOptDialect::kMicroBatchAttr;
}

int dlopt::meshAxisIndex(ModuleOp module, StringRef name) {
  auto mesh = module->getAttrOfType<DictionaryAttr>("dlopt.mesh");
  auto axes = mesh ? dyn_cast_or_null<ArrayAttr>(mesh.get("axes")) : ArrayAttr();
  if (!axes)
    return -1;
  for (auto [k, a] : llvm::enumerate(axes))
    if (auto n = dyn_cast<StringAttr>(a); n && n.getValue() == name)
      return int(k);
  return -1;
}

DictionaryAttr dlopt::meshAttr(MLIRContext *ctx, ArrayRef<Attribute> axes,
                              ArrayRef<int64_t> shape) {
  return DictionaryAttr::get(
      ctx, {NamedAttribute(StringAttr::get(ctx, "axes"), ArrayAttr::get(ctx, axes)),
            NamedAttribute(StringAttr::get(ctx, "shape"),
                           DenseI64ArrayAttr::get(ctx, shape))});
}

DictionaryAttr dlopt::marksWithoutIds(Operation *op) {
  DictionaryAttr all = op->getDiscardableAttrDictionary();
  SmallVector<NamedAttribute> kept;
  for (NamedAttribute a : all)
    if (!isOpIdentityAttr(a.getName().getValue()))
      kept.push_back(a);
  if (kept.size() == all.size())
    return all;
  return DictionaryAttr::get(op->getContext(), kept);
}

void dlopt::markDerivedOp(Operation *from, Operation *op) {
  IntegerAttr id = from->getAttrOfType<IntegerAttr>(DLOptDialect::kIdAttr);
  if (!id)
    id = from->getAttrOfType<IntegerAttr>(DLOptDialect::kFwdIdAttr);
  op->removeAttr(DLOptDialect::kIdAttr);
  if (id)
    op->setAttr(DLOptDialect::kFwdIdAttr, id);
}

void dlopt::markDerivedOps(Operation *from, Block::iterator begin,
                           Block::iterator end) {
  for (auto it = begin; it != end; ++it)
    markDerivedOp(from, &*it);
}

namespace {
struct CheckModelPass : dlopt::impl::CheckModelPassBase<CheckModelPass> {
  using CheckModelPassBase::CheckModelPassBase;

  void runOnOperation() override {
    FailureOr<func::FuncOp> fn = findEntryFunction(getOperation(), entry);
    if (failed(fn) || failed(checkFunction(*fn)) || failed(checkIds(*fn)))
      return signalPassFailure();
    numStamped += stampOpIds(*fn);
  }

  /// Ids already present (a model written back by --emit mlir) must be
  /// unique per micro-batch: the plan keys values by them.
  LogicalResult checkIds(func::FuncOp fn) {
    llvm::DenseMap<std::pair<int64_t, int64_t>, Operation *> seen;
    for (Operation &op : fn.getBody().front()) {
      auto id = op.getAttrOfType<IntegerAttr>(DLOptDialect::kIdAttr);
      if (!id)
        continue;
      auto mb = op.getAttrOfType<IntegerAttr>(DLOptDialect::kMicroBatchAttr);
      auto [it, inserted] =
          seen.try_emplace({id.getInt(), mb ? mb.getInt() : -1}, &op);
      if (!inserted) {
        InFlightDiagnostic d = op.emitError()
                               << "op id " << id.getInt()
                               << " (dlopt.id) is already used";
        d.attachNote(it->second->getLoc()) << "first used here";
        return failure();
      }
    }
    return success();
  }

  LogicalResult checkFunction(func::FuncOp fn) {
    if (fn.isExternal())
      return fn.emitError("expects the model entry to have a body");
    llvm::StringMap<unsigned> names;
    auto claim = [&](StringRef name, Operation *op, const Twine &what) {
      auto [it, inserted] = names.try_emplace(name, 0);
      if (!inserted) {
        op->emitError() << what << " uses the name '" << name
                        << "' which is already taken";
        return failure();
      }
      return success();
    };
    for (unsigned i = 0, e = fn.getNumArguments(); i < e; ++i) {
      Type t = fn.getArgument(i).getType();
      auto param = fn.getArgAttrOfType<StringAttr>(i, DLOptDialect::kParamAttr);
      auto input = fn.getArgAttrOfType<StringAttr>(i, DLOptDialect::kInputAttr);
      auto state = fn.getArgAttrOfType<StringAttr>(i, DLOptDialect::kStateAttr);
      int kinds = bool(param) + bool(input) + bool(state);
      if (kinds == 0)
        return fn.emitError() << "argument #" << i << " (" << t
                              << ") is neither a dlopt.param nor a dlopt.input";
      if (kinds > 1)
        return fn.emitError() << "argument #" << i
                              << " has more than one of dlopt.param, "
                                 "dlopt.input and dlopt.state";
      if (input && fn.getArgAttr(i, DLOptDialect::kInitAttr))
        return fn.emitError() << "argument #" << i
                              << " has a dlopt.init but is not a dlopt.param";
      auto rt = dyn_cast<RankedTensorType>(t);
      if (!rt || !rt.hasStaticShape())
        return fn.emitError() << "argument #" << i
                              << " expects a statically shaped tensor, got " << t;
      if (param && !isa<FloatType>(rt.getElementType()))
        return fn.emitError() << "argument #" << i << " is a dlopt.param of type "
                              << t << ", expected a float tensor";
      StringAttr argName = param ? param : input ? input : state;
      if (failed(claim(argName.getValue(), fn, "argument #" + Twine(i))))
        return failure();
      param ? ++numParams : ++numInputs;
    }
    llvm::StringSet<> outputNames;
    for (unsigned i = 0, e = fn.getNumResults(); i < e; ++i) {
      Type t = fn.getResultTypes()[i];
      auto rt = dyn_cast<RankedTensorType>(t);
      if (!rt || !rt.hasStaticShape())
        return fn.emitError() << "result #" << i
                              << " expects a statically shaped tensor, got " << t;
      // Outputs have their own namespace: a training step's new weights are
      // outputs named like the params they replace.
      auto name = fn.getResultAttrOfType<StringAttr>(i, DLOptDialect::kOutputAttr);
      std::string n = name ? name.getValue().str() : "out" + std::to_string(i);
      if (!outputNames.insert(n).second)
        return fn.emitError() << "result #" << i << " uses the output name '"
                              << n << "' which is already taken";
    }
    for (unsigned i = 0, e = fn.getNumResults(); i < e; ++i) {
      auto upd = fn.getResultAttrOfType<StringAttr>(i, DLOptDialect::kUpdateAttr);
      if (!upd)
        continue;
      bool found = false;
      for (unsigned a = 0; a < fn.getNumArguments() && !found; ++a) {
        auto p = fn.getArgAttrOfType<StringAttr>(a, DLOptDialect::kParamAttr);
        auto s = fn.getArgAttrOfType<StringAttr>(a, DLOptDialect::kStateAttr);
        StringAttr n = p ? p : s;
        if (!n || n != upd)
          continue;
        found = true;
        if (fn.getArgumentTypes()[a] != fn.getResultTypes()[i])
          return fn.emitError() << "result #" << i << " updates '"
                                << upd.getValue() << "' of type "
                                << fn.getArgumentTypes()[a] << " but has type "
                                << fn.getResultTypes()[i];
      }
      if (!found)
        return fn.emitError() << "result #" << i << " updates '"
                              << upd.getValue()
                              << "', which is no dlopt.param or dlopt.state";
    }
    if (fn->hasAttr(DLOptDialect::kLossAttr)) {
      if (fn.getNumResults() == 0)
        return fn.emitError("is marked dlopt.loss but returns nothing; "
                            "expected a rank-0 float loss as the first result");
      auto rt = dyn_cast<RankedTensorType>(fn.getResultTypes()[0]);
      if (!rt || rt.getRank() != 0 || !isa<FloatType>(rt.getElementType()))
        return fn.emitError() << "is marked dlopt.loss, so the first result "
                                 "must be a rank-0 float tensor, got "
                              << fn.getResultTypes()[0];
    }
    WalkResult walk = fn.getBody().walk([&](Operation *op) {
      if (isa<func::ReturnOp>(op) ||
          isa<DLOptDialect>(op->getDialect()))
        return WalkResult::advance();
      if (auto cst = dyn_cast<arith::ConstantOp>(op)) {
        if (isa<DenseElementsAttr>(cst.getValue()))
          return WalkResult::advance();
        cst.emitError() << "expects a dense tensor constant, got "
                        << cst.getValue();
        return WalkResult::interrupt();
      }
      op->emitError() << "op '" << op->getName()
                      << "' is not supported in a dlopt model; expected dlopt "
                         "ops, arith.constant and func.return";
      return WalkResult::interrupt();
    });
    if (walk.wasInterrupted())
      return failure();
    if (!fn.getBody().hasOneBlock())
      return fn.emitError("expects a single-block function body");
    return success();
  }
};
} // namespace
