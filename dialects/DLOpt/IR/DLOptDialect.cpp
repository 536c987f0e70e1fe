//===- DLOptDialect.cpp - dlopt dialect registration and attribute checks -===//
#include "dialects/DLOpt/IR/DLOptDialect.h"
#include "dialects/DLOpt/IR/DLOptOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/BuiltinAttributes.h"

using namespace mlir;
using namespace dlopt::dl;

#include "dialects/DLOpt/IR/DLOptDialect.cpp.inc"

void DLOptDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/DLOpt/IR/DLOptOps.cpp.inc"
      >();
}

Operation *DLOptDialect::materializeConstant(OpBuilder &builder,
                                             Attribute value, Type type,
                                             Location loc) {
  auto typed = dyn_cast<TypedAttr>(value);
  if (!typed || typed.getType() != type)
    return nullptr;
  return arith::ConstantOp::create(builder, loc, type, typed);
}

/// Reads a numeric (float or integer) attribute as double.
static std::optional<double> numericValue(Attribute attr) {
  if (auto f = dyn_cast<FloatAttr>(attr))
    return f.getValueAsDouble();
  if (auto i = dyn_cast<IntegerAttr>(attr))
    return static_cast<double>(i.getInt());
  return std::nullopt;
}

/// Checks a `dlopt.init` initializer description.
static LogicalResult verifyInit(Operation *op, unsigned argIndex,
                                Attribute attr) {
  auto err = [&]() {
    return op->emitError() << "argument #" << argIndex << ": 'dlopt.init' ";
  };
  auto dict = dyn_cast<DictionaryAttr>(attr);
  if (!dict)
    return err() << "expects a dictionary like {dist = \"normal\", std = 0.02}, got "
                 << attr;
  auto dist = dict.getAs<StringAttr>("dist");
  if (!dist)
    return err() << "expects a string entry 'dist', got " << dict;
  StringRef d = dist.getValue();
  SmallVector<StringRef> allowed;
  if (d == "zeros" || d == "ones")
    allowed = {};
  else if (d == "constant")
    allowed = {"value"};
  else if (d == "normal" || d == "truncated_normal")
    allowed = {"mean", "std"};
  else if (d == "uniform")
    allowed = {"low", "high"};
  else
    return err() << "has unknown dist '" << d
                 << "', expected one of zeros, ones, constant, normal, "
                    "truncated_normal, uniform";
  for (NamedAttribute entry : dict) {
    StringRef key = entry.getName().getValue();
    if (key == "dist")
      continue;
    if (!llvm::is_contained(allowed, key))
      return err() << "has unexpected entry '" << key << "' for dist '" << d
                   << "'";
    if (!numericValue(entry.getValue()))
      return err() << "expects entry '" << key << "' to be a number, got "
                   << entry.getValue();
  }
  if (d == "constant" && !dict.get("value"))
    return err() << "with dist 'constant' needs an entry 'value'";
  if (auto s = dict.get("std"))
    if (*numericValue(s) <= 0)
      return err() << "expects 'std' > 0, got " << *numericValue(s);
  if (d == "uniform") {
    double lo = dict.get("low") ? *numericValue(dict.get("low")) : 0.0;
    double hi = dict.get("high") ? *numericValue(dict.get("high")) : 1.0;
    if (!(lo < hi))
      return err() << "expects low < high, got low = " << lo
                   << " and high = " << hi;
  }
  return success();
}

/// dlopt.global_type (a ranked tensor type) and dlopt.split (per dim, a
/// list of mesh axis names), written by the partitioning pass on split
/// arguments and results; dlopt.sharding (the same form), the plan's
/// sharding of an argument, read by it.
/// `dlopt.arg` / `dlopt.result` on a pipeline stage's function
/// (dlopt-pipeline): the argument's or result's index in the whole step.
static LogicalResult verifyStepIndex(Operation *op, const std::string &what,
                                     NamedAttribute attr) {
  auto i = dyn_cast<IntegerAttr>(attr.getValue());
  if (!i || i.getInt() < 0)
    return op->emitError() << what << ": '" << attr.getName().getValue()
                           << "' expects a non-negative integer, got "
                           << attr.getValue();
  return success();
}

static LogicalResult verifyGlobalAttr(Operation *op, const std::string &what,
                                      NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  if (name == "dlopt.global_type") {
    auto t = dyn_cast<TypeAttr>(attr.getValue());
    if (!t || !isa<RankedTensorType>(t.getValue()))
      return op->emitError() << what << ": 'dlopt.global_type' expects a "
                             << "ranked tensor type, got " << attr.getValue();
    return success();
  }
  auto dims = dyn_cast<ArrayAttr>(attr.getValue());
  bool ok = bool(dims);
  if (dims)
    for (Attribute d : dims) {
      auto axes = dyn_cast<ArrayAttr>(d);
      ok &= bool(axes);
      if (axes)
        for (Attribute a : axes)
          ok &= isa<StringAttr>(a);
    }
  if (!ok)
    return op->emitError() << what << ": '" << name << "' expects a list of "
                           << "mesh axis name lists, got " << attr.getValue();
  return success();
}

LogicalResult DLOptDialect::verifyRegionArgAttribute(Operation *op,
                                                     unsigned regionIndex,
                                                     unsigned argIndex,
                                                     NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  if (name == kParamAttr || name == kInputAttr || name == kStateAttr) {
    auto str = dyn_cast<StringAttr>(attr.getValue());
    if (!str || str.getValue().empty())
      return op->emitError() << "argument #" << argIndex << ": '" << name
                             << "' expects a non-empty string name, got "
                             << attr.getValue();
    return success();
  }
  if (name == kInitAttr)
    return verifyInit(op, argIndex, attr.getValue());
  if (name == "dlopt.arg")
    return verifyStepIndex(op, "argument #" + std::to_string(argIndex), attr);
  if (name == "dlopt.global_type" || name == "dlopt.split" ||
      name == "dlopt.sharding")
    return verifyGlobalAttr(op, "argument #" + std::to_string(argIndex), attr);
  return op->emitError() << "argument #" << argIndex
                         << ": unknown dlopt argument attribute '" << name
                         << "', expected dlopt.param, dlopt.input, dlopt.state, "
                            "dlopt.init or dlopt.sharding";
}

LogicalResult DLOptDialect::verifyRegionResultAttribute(Operation *op,
                                                        unsigned regionIndex,
                                                        unsigned resultIndex,
                                                        NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  if (name == "dlopt.global_type" || name == "dlopt.split")
    return verifyGlobalAttr(op, "result #" + std::to_string(resultIndex),
                            attr);
  if (name == "dlopt.result")
    return verifyStepIndex(op, "result #" + std::to_string(resultIndex), attr);
  if (name != kOutputAttr && name != kGradAttr && name != kUpdateAttr)
    return op->emitError() << "result #" << resultIndex
                           << ": unknown dlopt result attribute '" << name
                           << "', expected dlopt.output, dlopt.grad or dlopt.update";
  auto str = dyn_cast<StringAttr>(attr.getValue());
  if (!str || str.getValue().empty())
    return op->emitError() << "result #" << resultIndex << ": '" << name
                           << "' expects a non-empty string, got "
                           << attr.getValue();
  return success();
}

LogicalResult DLOptDialect::verifyOperationAttribute(Operation *op,
                                                     NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  if (name == kLayerAttr || name == kIdAttr || name == kFwdIdAttr ||
      name == kMicroBatchAttr || name == kStageAttr ||
      name == kAccumulateAttr) {
    auto i = dyn_cast<IntegerAttr>(attr.getValue());
    if (!i || i.getInt() < 0)
      return op->emitError() << "'" << name
                             << "' expects a non-negative integer, got "
                             << attr.getValue();
    return success();
  }
  if (name == "dlopt.mesh") {
    auto d = dyn_cast<DictionaryAttr>(attr.getValue());
    auto axes = d ? dyn_cast_or_null<ArrayAttr>(d.get("axes")) : nullptr;
    auto shape = d ? dyn_cast_or_null<DenseI64ArrayAttr>(d.get("shape"))
                   : nullptr;
    if (!axes || !shape || int64_t(axes.size()) != shape.size() ||
        !llvm::all_of(axes, [](Attribute a) { return isa<StringAttr>(a); }) ||
        !llvm::all_of(shape.asArrayRef(), [](int64_t s) { return s >= 1; }))
      return op->emitError() << "'dlopt.mesh' expects {axes = [names], "
                             << "shape = array<i64: sizes>} of equal length, "
                             << "got " << attr.getValue();
    return success();
  }
  if (name == kLossAttr || name == kTrainStepAttr || name == kBackwardAttr ||
      name == kRecomputeAttr) {
    if (!isa<UnitAttr>(attr.getValue()))
      return op->emitError() << "'" << name << "' expects a unit attribute, got "
                             << attr.getValue();
    return success();
  }
  if (name == "dlopt.plan") {
    // {operands = [S...], results = [S...]}, S = {split = [[axis, ...] per
    // dim], partial = [axis, ...]}: the shardings a plan requires of an
    // op's operands and results (read by dlopt-partition).
    auto bad = [&]() {
      return op->emitError()
             << "'dlopt.plan' expects {operands = [...], results = [...]} of "
                "{split = [[axis names] per dim], partial = [axis names]}, got "
             << attr.getValue();
    };
    auto d = dyn_cast<DictionaryAttr>(attr.getValue());
    if (!d)
      return bad();
    for (StringRef key : {"operands", "results"}) {
      auto list = dyn_cast_or_null<ArrayAttr>(d.get(key));
      if (!list)
        return bad();
      for (Attribute e : list) {
        auto sd = dyn_cast<DictionaryAttr>(e);
        auto split = sd ? dyn_cast_or_null<ArrayAttr>(sd.get("split")) : nullptr;
        auto partial = sd ? dyn_cast_or_null<ArrayAttr>(sd.get("partial")) : nullptr;
        if (!split || !partial ||
            !llvm::all_of(partial, [](Attribute a) { return isa<StringAttr>(a); }))
          return bad();
        for (Attribute dim : split) {
          auto axes = dyn_cast<ArrayAttr>(dim);
          if (!axes ||
              !llvm::all_of(axes, [](Attribute a) { return isa<StringAttr>(a); }))
            return bad();
        }
      }
    }
    return success();
  }
  if (name == kZeroGatherAttr) {
    auto s = dyn_cast<StringAttr>(attr.getValue());
    if (!s || !(s.getValue().starts_with("fwd") || s.getValue().starts_with("bwd")))
      return op->emitError() << "'dlopt.zero_gather' expects a string "
                                "\"fwd...\" or \"bwd...\", got "
                             << attr.getValue();
    return success();
  }
  return op->emitError() << "unknown dlopt attribute '" << name
                         << "', expected dlopt.layer, dlopt.loss, dlopt.train_step, "
                            "dlopt.backward, dlopt.recompute, dlopt.id, "
                            "dlopt.fwd_id, dlopt.mb, dlopt.stage, dlopt.accumulate, dlopt.plan or dlopt.zero_gather";
}
