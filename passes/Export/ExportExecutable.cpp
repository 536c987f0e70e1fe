//===- ExportExecutable.cpp - dlopt IR to a runtime Executable ------------===//
#include "passes/Export/ExportExecutable.h"

#include "dialects/DLOpt/IR/DLOptOps.h"
#include "passes/ModelUtils.h"
#include "runtime/format/FusedProgram.h"
#include "runtime/format/MemoryPlanner.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Threading.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>

using namespace mlir;
using namespace dlopt;
using dl::DLOptDialect;

static FailureOr<rt::DType> toDType(Type elem) {
  if (elem.isF32()) return rt::DType::F32;
  if (elem.isF16()) return rt::DType::F16;
  if (elem.isBF16()) return rt::DType::BF16;
  if (elem.isInteger(1)) return rt::DType::I1;
  if (elem.isInteger(32)) return rt::DType::I32;
  if (elem.isInteger(64)) return rt::DType::I64;
  return failure();
}

static FailureOr<rt::TensorType> toTensorType(Type t) {
  auto rt = dyn_cast<RankedTensorType>(t);
  if (!rt || !rt.hasStaticShape())
    return failure();
  FailureOr<rt::DType> dt = toDType(rt.getElementType());
  if (failed(dt))
    return failure();
  rt::TensorType out;
  out.dtype = *dt;
  out.shape.assign(rt.getShape().begin(), rt.getShape().end());
  return out;
}

/// "file:line:col" of the first file location inside `loc`.
static std::string locString(Location loc) {
  std::string out;
  loc->walk([&](Location l) {
    if (auto f = dyn_cast<FileLineColLoc>(l)) {
      out = (f.getFilename().getValue() + ":" + Twine(f.getLine()) + ":" +
             Twine(f.getColumn()))
                .str();
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return out;
}

static double numeric(DictionaryAttr dict, StringRef key, double dflt) {
  Attribute a = dict.get(key);
  if (auto f = dyn_cast_if_present<FloatAttr>(a))
    return f.getValueAsDouble();
  if (auto i = dyn_cast_if_present<IntegerAttr>(a))
    return static_cast<double>(i.getInt());
  return dflt;
}

static rt::Init toInit(DictionaryAttr dict) {
  rt::Init init;
  if (!dict)
    return init;
  if (auto d = dict.getAs<StringAttr>("dist"))
    init.dist = d.getValue().str();
  init.mean = numeric(dict, "mean", 0.0);
  init.std = numeric(dict, "std", 1.0);
  init.low = numeric(dict, "low", 0.0);
  init.high = numeric(dict, "high", 1.0);
  init.value = numeric(dict, "value", 0.0);
  return init;
}

/// Appends the little-endian bytes of a dense constant to `blob`.
static void appendConstant(DenseElementsAttr attr, std::vector<uint8_t> &blob,
                           bool oneElement) {
  Type elem = attr.getElementType();
  int64_t n = oneElement ? 1 : attr.getNumElements();
  auto put = [&](uint64_t bits, unsigned bytes) {
    for (unsigned b = 0; b < bytes; ++b)
      blob.push_back(static_cast<uint8_t>(bits >> (8 * b)));
  };
  if (isa<FloatType>(elem)) {
    unsigned bytes = elem.getIntOrFloatBitWidth() / 8;
    if (attr.isSplat()) {
      uint64_t bits = attr.getSplatValue<APFloat>().bitcastToAPInt().getZExtValue();
      for (int64_t i = 0; i < n; ++i)
        put(bits, bytes);
      return;
    }
    for (const APFloat &v : attr.getValues<APFloat>())
      put(v.bitcastToAPInt().getZExtValue(), bytes);
    return;
  }
  unsigned width = elem.getIntOrFloatBitWidth();
  unsigned bytes = width == 1 ? 1 : width / 8;
  if (attr.isSplat()) {
    uint64_t bits = attr.getSplatValue<APInt>().getZExtValue();
    for (int64_t i = 0; i < n; ++i)
      put(bits, bytes);
    return;
  }
  for (const APInt &v : attr.getValues<APInt>())
    put(v.getZExtValue(), bytes);
}

/// Converts an attribute to an instruction attribute value, if representable.
static std::optional<rt::AttrValue> toAttrValue(Attribute attr) {
  // Enum attributes are IntegerAttrs underneath: match them first.
  if (auto p = dyn_cast<dl::CmpPredicateAttr>(attr))
    return rt::AttrValue(dl::stringifyCmpPredicate(p.getValue()).str());
  if (auto b = dyn_cast<BoolAttr>(attr))
    return rt::AttrValue(int64_t(b.getValue()));
  if (auto i = dyn_cast<IntegerAttr>(attr))
    return rt::AttrValue(i.getInt());
  if (auto f = dyn_cast<FloatAttr>(attr))
    return rt::AttrValue(f.getValueAsDouble());
  if (auto s = dyn_cast<StringAttr>(attr))
    return rt::AttrValue(s.getValue().str());
  if (isa<UnitAttr>(attr))
    return rt::AttrValue(int64_t(1));
  if (auto a = dyn_cast<DenseI64ArrayAttr>(attr))
    return rt::AttrValue(std::vector<int64_t>(a.asArrayRef().begin(),
                                              a.asArrayRef().end()));
  return std::nullopt;
}

using Attrs = std::map<std::string, rt::AttrValue>;

static std::vector<int64_t> vec(ArrayRef<int64_t> a) {
  return std::vector<int64_t>(a.begin(), a.end());
}

/// Sets every attribute an instruction carries, with defaults filled in and
/// dims normalized, so backends never need the op's defaults.
static void normalizeAttrs(Operation *op, Attrs &a) {
  auto rankOf = [](Value v) { return cast<RankedTensorType>(v.getType()).getRank(); };
  llvm::TypeSwitch<Operation *>(op)
      .Case([&](dl::GeluOp o) { a["approximate"] = o.getApproximate().str(); })
      .Case<dl::SumOp, dl::MeanOp, dl::MaxOp>([&](auto o) {
        std::vector<int64_t> dims;
        for (int64_t d : o.getDims())
          dims.push_back(dl::normalizeDim(d, rankOf(o.getInput())));
        llvm::sort(dims);
        a["dims"] = dims;
        a["keepdims"] = int64_t(o.getKeepdims());
      })
      .Case([&](dl::MatmulOp o) {
        a["transpose_a"] = int64_t(o.getTransposeA());
        a["transpose_b"] = int64_t(o.getTransposeB());
      })
      .Case([&](dl::ConcatOp o) {
        a["dim"] = dl::normalizeDim(o.getDim(), rankOf(o.getResult()));
      })
      .Case([&](dl::IotaOp o) {
        a["dim"] = dl::normalizeDim(o.getDim(), rankOf(o.getResult()));
      })
      .Case<dl::SoftmaxOp, dl::LogSoftmaxOp>([&](auto o) {
        a["dim"] = dl::normalizeDim(o.getDim(), rankOf(o.getResult()));
      })
      .Case([&](dl::LayerNormOp o) {
        a["axis"] = dl::normalizeDim(o.getAxis(), rankOf(o.getInput()));
        a["eps"] = o.getEps().convertToDouble();
        a["has_weight"] = int64_t(bool(o.getWeight()));
        a["has_bias"] = int64_t(bool(o.getBias()));
      })
      .Case([&](dl::RMSNormOp o) {
        a["axis"] = dl::normalizeDim(o.getAxis(), rankOf(o.getInput()));
        a["eps"] = o.getEps().convertToDouble();
        a["has_weight"] = int64_t(bool(o.getWeight()));
      })
      .Case([&](dl::AttentionOp o) {
        a["causal"] = int64_t(o.getCausal());
        int64_t d = o.getQuery().getType().getDimSize(3);
        a["scale"] = o.getScale() ? o.getScale()->convertToDouble()
                                  : 1.0 / std::sqrt(double(d));
      })
      .Case([&](dl::RopeOp o) {
        a["theta"] = o.getTheta().convertToDouble();
        a["inverse"] = int64_t(o.getInverse());
      })
      .Case([&](dl::GeluGradOp o) { a["approximate"] = o.getApproximate().str(); })
      .Case<dl::SoftmaxGradOp, dl::LogSoftmaxGradOp>([&](auto o) {
        a["dim"] = dl::normalizeDim(o.getDim(), rankOf(o.getResult()));
      })
      .Case<dl::LayerNormGradOp, dl::RMSNormGradOp>([&](auto o) {
        a["axis"] = dl::normalizeDim(o.getAxis(), rankOf(o.getInput()));
        a["eps"] = o.getEps().convertToDouble();
        a["has_weight"] = int64_t(bool(o.getWeight()));
      })
      .Case([&](dl::AttentionGradOp o) {
        a["causal"] = int64_t(o.getCausal());
        int64_t d = o.getQuery().getType().getDimSize(3);
        a["scale"] = o.getScale() ? o.getScale()->convertToDouble()
                                  : 1.0 / std::sqrt(double(d));
      })
      .Case<dl::Conv2DGradInputOp, dl::Conv2DGradFilterOp>([&](auto o) {
        a["stride"] = vec(o.getStride());
        a["padding"] = vec(o.getPadding());
        a["dilation"] = vec(o.getDilation());
        a["groups"] = o.getGroups();
      })
      .Case<dl::MaxPool2DGradOp, dl::AvgPool2DGradOp>([&](auto o) {
        a["kernel"] = vec(o.getKernel());
        a["stride"] = o.getStride() ? vec(*o.getStride()) : vec(o.getKernel());
        a["padding"] = vec(o.getPadding());
        if constexpr (std::is_same_v<decltype(o), dl::AvgPool2DGradOp>)
          a["count_include_pad"] = int64_t(o.getCountIncludePad());
      })
      .Case([&](dl::BatchNormGradOp o) {
        a["eps"] = o.getEps().convertToDouble();
        a["training"] = int64_t(o.getTraining());
      })
      .Case([&](dl::CrossEntropyGradOp o) { a["ignore_index"] = o.getIgnoreIndex(); })
      .Case([&](dl::Conv2DOp o) {
        a["stride"] = vec(o.getStride());
        a["padding"] = vec(o.getPadding());
        a["dilation"] = vec(o.getDilation());
        a["groups"] = o.getGroups();
        a["has_bias"] = int64_t(bool(o.getBias()));
      })
      .Case<dl::MaxPool2DOp, dl::AvgPool2DOp>([&](auto o) {
        a["kernel"] = vec(o.getKernel());
        a["stride"] = o.getStride() ? vec(*o.getStride()) : vec(o.getKernel());
        a["padding"] = vec(o.getPadding());
        if constexpr (std::is_same_v<decltype(o), dl::AvgPool2DOp>)
          a["count_include_pad"] = int64_t(o.getCountIncludePad());
      })
      .Case([&](dl::BatchNormOp o) {
        a["eps"] = o.getEps().convertToDouble();
        a["momentum"] = o.getMomentum().convertToDouble();
        a["training"] = int64_t(o.getTraining());
      })
      .Case([&](dl::CrossEntropyOp o) { a["ignore_index"] = o.getIgnoreIndex(); })
      .Default([](Operation *) {});
}

/// The per-element program of a fused group (runtime/format/FusedProgram.h):
/// body arguments, then the body's constants, then one step per op.
static LogicalResult encodeFused(dl::FusedElementwiseOp op, rt::Instr &instr) {
  Block &body = op.getBody().front();
  rt::fused::Program p;
  p.numSegments = static_cast<int32_t>(op.getNumSegments());
  p.numInputs = static_cast<int32_t>(body.getNumArguments());
  llvm::DenseMap<Value, int32_t> reg;
  for (BlockArgument a : body.getArguments())
    reg[a] = static_cast<int32_t>(a.getArgNumber());
  for (Operation &inner : body.without_terminator())
    if (auto cst = dyn_cast<arith::ConstantOp>(inner)) {
      auto dense = cast<DenseElementsAttr>(cst.getValue());
      reg[cst.getResult()] =
          p.numInputs + static_cast<int32_t>(p.consts.size());
      p.consts.push_back(
          (*dense.getValues<APFloat>().begin()).convertToDouble());
    }
  int32_t next = p.numInputs + static_cast<int32_t>(p.consts.size());
  for (Operation &inner : body.without_terminator()) {
    if (isa<arith::ConstantOp>(inner))
      continue;
    std::string name = inner.getName().stripDialect().str();
    if (auto g = dyn_cast<dl::GeluOp>(inner); g && g.getApproximate() == "tanh")
      name = "gelu_tanh";
    if (auto c = dyn_cast<dl::CompareOp>(inner))
      name = "cmp_" + dl::stringifyCmpPredicate(c.getPredicate()).str();
    rt::fused::Step st;
    if (!rt::fused::opCodeFromName(name, st.op))
      return inner.emitError() << "cannot be exported in a fused group";
    st.a = reg.lookup(inner.getOperand(0));
    if (rt::fused::isBinary(st.op) || rt::fused::isTernary(st.op)) {
      st.b = reg.lookup(inner.getOperand(1));
      if (rt::fused::isTernary(st.op))
        st.c = reg.lookup(inner.getOperand(2));
    } else if (st.op == rt::fused::OpCode::Cast) {
      FailureOr<rt::DType> dt = toDType(
          cast<RankedTensorType>(inner.getResult(0).getType()).getElementType());
      if (failed(dt))
        return inner.emitError() << "cannot be exported in a fused group";
      st.b = static_cast<int32_t>(*dt);
    }
    p.steps.push_back(st);
    reg[inner.getResult(0)] = next++;
  }
  for (Value v : body.getTerminator()->getOperands())
    p.outputs.push_back(reg.lookup(v));
  rt::fused::encode(p, instr);
  return success();
}

FailureOr<rt::Executable> dlopt::exportExecutable(ModuleOp module,
                                                  StringRef entry,
                                                  StringRef sourceName) {
  // A pipelined step (dlopt-pipeline) is one function per stage, each a
  // program of the ranks with that pp coordinate; otherwise the entry
  // function is every rank's program.
  SmallVector<func::FuncOp> fns;
  for (auto f : module.getOps<func::FuncOp>())
    if (f->hasAttr(DLOptDialect::kStageAttr))
      fns.push_back(f);
  llvm::stable_sort(fns, [](func::FuncOp a, func::FuncOp b) {
    return a->getAttrOfType<IntegerAttr>(DLOptDialect::kStageAttr).getInt() <
           b->getAttrOfType<IntegerAttr>(DLOptDialect::kStageAttr).getInt();
  });
  if (fns.empty()) {
    FailureOr<func::FuncOp> fnOr = findEntryFunction(module, entry);
    if (failed(fnOr))
      return failure();
    fns.push_back(*fnOr);
  }
  func::FuncOp fn = fns.front();

  rt::Executable exe;
  exe.modelName = fn.getSymName().str();
  if (fns.size() > 1 || fn->hasAttr(DLOptDialect::kStageAttr))
    exe.modelName = fn.getSymName().rsplit(".stage").first.str();
  exe.source = sourceName.str();
  exe.worldSize = 1;
  // A partitioned step (docs/parallel.md): every rank runs this program.
  if (auto mesh = module->getAttrOfType<DictionaryAttr>("dlopt.mesh")) {
    for (Attribute a : cast<ArrayAttr>(mesh.get("axes")))
      exe.mesh.axes.push_back(cast<StringAttr>(a).getValue().str());
    for (int64_t s : cast<DenseI64ArrayAttr>(mesh.get("shape")).asArrayRef())
      exe.mesh.shape.push_back(s);
    exe.worldSize = int32_t(exe.mesh.size());
  }
  int64_t ppAxis = -1;
  for (size_t a = 0; a < exe.mesh.axes.size(); ++a)
    if (exe.mesh.axes[a] == "pp")
      ppAxis = int64_t(a);
  if (fns.size() > 1 || fn->hasAttr(DLOptDialect::kStageAttr)) {
    if (ppAxis < 0 || exe.mesh.shape[size_t(ppAxis)] != int64_t(fns.size()))
      return fn.emitError() << "the module has " << fns.size()
                            << " stage functions but its dlopt.mesh has no "
                               "'pp' axis of that size";
    for (auto [s, f] : llvm::enumerate(fns))
      if (f->getAttrOfType<IntegerAttr>(DLOptDialect::kStageAttr).getInt() !=
          int64_t(s))
        return f.emitError() << "expects stage functions 0 to "
                             << fns.size() - 1 << ", each once";
  }
  // The communicator group of a set of grid axes, created on first use.
  auto groupOf = [&](ArrayRef<int16_t> axes) -> int64_t {
    std::vector<int32_t> a(axes.begin(), axes.end());
    for (size_t g = 0; g < exe.groups.size(); ++g)
      if (exe.groups[g].axes == a)
        return int64_t(g);
    rt::CommGroup cg;
    for (int32_t x : a)
      cg.name += (cg.name.empty() ? "" : "+") +
                 (size_t(x) < exe.mesh.axes.size() ? exe.mesh.axes[size_t(x)]
                                                   : std::to_string(x));
    cg.axes = a;
    exe.groups.push_back(cg);
    return int64_t(exe.groups.size() - 1);
  };
  // dlopt.global_type + dlopt.split of an argument or result.
  auto globalOf = [&](DictionaryAttr attrs)
      -> FailureOr<std::optional<rt::GlobalLayout>> {
    if (!attrs)
      return std::optional<rt::GlobalLayout>();
    auto gt = attrs.getAs<TypeAttr>("dlopt.global_type");
    auto split = attrs.getAs<ArrayAttr>("dlopt.split");
    if (!gt || !split)
      return std::optional<rt::GlobalLayout>();
    FailureOr<rt::TensorType> t = toTensorType(gt.getValue());
    if (failed(t))
      return failure();
    rt::GlobalLayout g;
    g.type = *t;
    for (Attribute d : split) {
      std::vector<int32_t> axes;
      for (Attribute a : cast<ArrayAttr>(d)) {
        StringRef name = cast<StringAttr>(a).getValue();
        auto it = std::find(exe.mesh.axes.begin(), exe.mesh.axes.end(), name);
        if (it == exe.mesh.axes.end()) {
          fn.emitError() << "dlopt.split names '" << name
                         << "', which is not an axis of the module's dlopt.mesh";
          return failure();
        }
        axes.push_back(int32_t(it - exe.mesh.axes.begin()));
      }
      g.split.push_back(std::move(axes));
    }
    return std::optional<rt::GlobalLayout>(std::move(g));
  };

  llvm::DenseMap<Value, int32_t> ids;
  // Values that several stages define or bind under one name (arguments,
  // outputs) share one value id; each program holds its own copy.
  llvm::StringMap<int32_t> argIds, outputIds;
  // Pipeline stages: each argument's index in the whole step.
  llvm::DenseMap<int32_t, int64_t> argOrder;
  llvm::DenseMap<Value, int32_t> forced;
  struct Output {
    int32_t id;
    std::string name, update;
    std::optional<rt::GlobalLayout> global;
  };
  std::map<int64_t, Output> outputs;
  auto addValue = [&](Value v, rt::Value desc) -> FailureOr<int32_t> {
    if (auto it = forced.find(v); it != forced.end()) {
      ids[v] = it->second;
      return it->second;
    }
    FailureOr<rt::TensorType> t = toTensorType(v.getType());
    if (failed(t)) {
      emitError(v.getLoc()) << "cannot export value of type " << v.getType()
                            << ": expected a statically shaped tensor of "
                               "f32, f16, bf16, i32, i64 or i1";
      return failure();
    }
    desc.type = *t;
    int32_t id = static_cast<int32_t>(exe.values.size());
    exe.values.push_back(std::move(desc));
    ids[v] = id;
    return id;
  };

  // An instruction's operands (defined earlier in its function) and its
  // results (new values).
  auto bindValues = [&](Operation &op, rt::Instr &instr) -> LogicalResult {
    for (Value v : op.getOperands()) {
      auto it = ids.find(v);
      if (it == ids.end())
        return op.emitError("uses a value defined outside the function body");
      instr.operands.push_back(it->second);
    }
    for (Value r : op.getResults()) {
      FailureOr<int32_t> id = addValue(r, rt::Value{});
      if (failed(id))
        return failure();
      instr.results.push_back(*id);
    }
    return success();
  };

  for (func::FuncOp fn : fns) {
  rt::Program prog;
  prog.ranks.clear();
  for (int32_t r = 0; r < exe.worldSize; ++r)
    if (ppAxis < 0 ||
        exe.mesh.coords(r)[size_t(ppAxis)] ==
            fn->getAttrOfType<IntegerAttr>(DLOptDialect::kStageAttr).getInt())
      prog.ranks.push_back(r);
  Operation *terminator = fn.getBody().front().getTerminator();
  forced.clear();
  for (auto [i, v] : llvm::enumerate(terminator->getOperands())) {
    auto name = fn.getResultAttrOfType<StringAttr>(unsigned(i), DLOptDialect::kOutputAttr);
    if (name && !isa<BlockArgument>(v))
      if (auto it = outputIds.find(name.getValue()); it != outputIds.end())
        forced[v] = it->second;
  }
  for (unsigned i = 0, e = fn.getNumArguments(); i < e; ++i) {
    rt::Value desc;
    if (auto p = fn.getArgAttrOfType<StringAttr>(i, DLOptDialect::kParamAttr)) {
      desc.kind = rt::ValueKind::Param;
      desc.name = p.getValue().str();
      desc.init = toInit(fn.getArgAttrOfType<DictionaryAttr>(i, DLOptDialect::kInitAttr));
    } else if (auto in = fn.getArgAttrOfType<StringAttr>(i, DLOptDialect::kInputAttr)) {
      desc.kind = rt::ValueKind::Input;
      desc.name = in.getValue().str();
    } else if (auto st = fn.getArgAttrOfType<StringAttr>(i, DLOptDialect::kStateAttr)) {
      desc.kind = rt::ValueKind::State;
      desc.name = st.getValue().str();
      desc.init = toInit(fn.getArgAttrOfType<DictionaryAttr>(i, DLOptDialect::kInitAttr));
    } else {
      return fn.emitError() << "argument #" << i
                            << " is neither a dlopt.param nor a dlopt.input";
    }
    auto global = globalOf(fn.getArgAttrDict(i));
    if (failed(global))
      return failure();
    desc.global = *global;
    if (auto it = argIds.find(desc.name); it != argIds.end()) {
      FailureOr<rt::TensorType> t = toTensorType(fn.getArgument(i).getType());
      const rt::Value &prev = exe.values[size_t(it->second)];
      if (failed(t) || !(*t == prev.type) || prev.kind != desc.kind ||
          !(prev.global == desc.global))
        return fn.emitError() << "argument '" << desc.name
                              << "' differs from the argument of that name "
                                 "of another stage";
      ids[fn.getArgument(i)] = it->second;
      continue;
    }
    FailureOr<int32_t> id = addValue(fn.getArgument(i), desc);
    if (failed(id))
      return failure();
    (desc.kind == rt::ValueKind::Param   ? exe.params
     : desc.kind == rt::ValueKind::State ? exe.states
                                         : exe.inputs)
        .push_back(*id);
    argIds[desc.name] = *id;
    if (auto a = fn.getArgAttrOfType<IntegerAttr>(i, "dlopt.arg"))
      argOrder[*id] = a.getInt();
  }

  // Instructions and constants, in program order.
  for (Operation &op : fn.getBody().front()) {
    if (&op == terminator)
      break;
    if (auto cst = dyn_cast<arith::ConstantOp>(op)) {
      auto dense = dyn_cast<DenseElementsAttr>(cst.getValue());
      if (!dense)
        return cst.emitError() << "expects a dense tensor constant, got "
                               << cst.getValue();
      rt::Value desc;
      desc.kind = rt::ValueKind::Const;
      // A splat stays one element: dense<0.5> : tensor<20000x20000xf32>
      // must not write 1.6 GB.
      desc.constSplat = dense.isSplat() && dense.getNumElements() > 1;
      while (exe.constData.size() % 64)
        exe.constData.push_back(0);
      desc.constOffset = static_cast<int64_t>(exe.constData.size());
      if (failed(addValue(cst.getResult(), desc)))
        return failure();
      appendConstant(dense, exe.constData, desc.constSplat);
      continue;
    }
    if (isa<shard::GridOp>(op))
      continue;
    if (isa<shard::AllReduceOp, shard::AllGatherOp, shard::ReduceScatterOp,
            shard::AllSliceOp, shard::AllToAllOp>(op)) {
      if (exe.mesh.axes.empty())
        return op.emitError("a collective in a module without dlopt.mesh");
      if (op.getNumOperands() != 1 || op.getNumResults() != 1)
        return op.emitError("expects one operand and one result");
      rt::Instr instr;
      instr.loc = locString(op.getLoc());
      auto it = ids.find(op.getOperand(0));
      if (it == ids.end())
        return op.emitError("uses a value defined outside the entry function body");
      instr.operands.push_back(it->second);
      FailureOr<int32_t> id = addValue(op.getResult(0), rt::Value{});
      if (failed(id))
        return failure();
      instr.results.push_back(*id);
      auto axes = op.getAttrOfType<DenseI16ArrayAttr>("grid_axes");
      instr.attrs["group"] = groupOf(axes ? axes.asArrayRef() : ArrayRef<int16_t>{});
      auto reduceName = [&](shard::ReductionKind k) -> FailureOr<std::string> {
        switch (k) {
        case shard::ReductionKind::Sum: return std::string("sum");
        case shard::ReductionKind::Max: return std::string("max");
        case shard::ReductionKind::Min: return std::string("min");
        case shard::ReductionKind::Average: return std::string("avg");
        default:
          return op.emitError("reduction kind not supported by the runtime "
                              "(sum, max, min, average)");
        }
      };
      if (auto ar = dyn_cast<shard::AllReduceOp>(op)) {
        instr.op = "all_reduce";
        FailureOr<std::string> r = reduceName(ar.getReduction());
        if (failed(r))
          return failure();
        instr.attrs["reduce"] = *r;
      } else if (auto ag = dyn_cast<shard::AllGatherOp>(op)) {
        instr.op = "all_gather";
        instr.attrs["axis"] = int64_t(ag.getGatherAxis().getSExtValue());
      } else if (auto rs = dyn_cast<shard::ReduceScatterOp>(op)) {
        instr.op = "reduce_scatter";
        FailureOr<std::string> r = reduceName(rs.getReduction());
        if (failed(r))
          return failure();
        instr.attrs["reduce"] = *r;
        instr.attrs["axis"] = int64_t(rs.getScatterAxis().getSExtValue());
      } else if (auto sl = dyn_cast<shard::AllSliceOp>(op)) {
        instr.op = "all_slice";
        instr.attrs["axis"] = int64_t(sl.getSliceAxis().getSExtValue());
      } else {
        auto a2a = cast<shard::AllToAllOp>(op);
        instr.op = "all_to_all";
        instr.attrs["split_axis"] = int64_t(a2a.getSplitAxis().getSExtValue());
        instr.attrs["concat_axis"] = int64_t(a2a.getConcatAxis().getSExtValue());
      }
      prog.instrs.push_back(std::move(instr));
      continue;
    }
    if (auto sr = dyn_cast<dl::SendRecvOp>(op)) {
      auto axis = std::find(exe.mesh.axes.begin(), exe.mesh.axes.end(),
                            sr.getAxis().str());
      if (axis == exe.mesh.axes.end())
        return op.emitError() << "mesh axis '" << sr.getAxis()
                              << "' is not in the module's dlopt.mesh";
      int64_t a = axis - exe.mesh.axes.begin();
      for (int64_t c : llvm::concat<const int64_t>(sr.getTo(), sr.getFrom()))
        if (c >= exe.mesh.shape[size_t(a)])
          return op.emitError() << "coordinate " << c << " is outside mesh axis '"
                                << sr.getAxis() << "' of size "
                                << exe.mesh.shape[size_t(a)];
      rt::Instr instr;
      instr.op = "send_recv";
      instr.loc = locString(op.getLoc());
      if (failed(bindValues(op, instr)))
        return failure();
      instr.attrs["group"] = groupOf({int16_t(a)});
      instr.attrs["send_peers"] = vec(sr.getTo());
      instr.attrs["recv_peers"] = vec(sr.getFrom());
      prog.instrs.push_back(std::move(instr));
      continue;
    }
    if (!isa<DLOptDialect>(op.getDialect()))
      return op.emitError() << "op '" << op.getName()
                            << "' cannot be exported; expected dlopt ops, "
                               "shard collectives (all_reduce, all_gather, "
                               "reduce_scatter, all_slice, all_to_all), "
                               "arith.constant and func.return";
    rt::Instr instr;
    instr.op = op.getName().stripDialect().str();
    instr.loc = locString(op.getLoc());
    if (failed(bindValues(op, instr)))
      return failure();
    for (NamedAttribute attr : op.getAttrDictionary()) {
      StringRef name = attr.getName().getValue();
      if (name == DLOptDialect::kLayerAttr) {
        instr.layer = static_cast<int32_t>(cast<IntegerAttr>(attr.getValue()).getInt());
        continue;
      }
      if (name.starts_with("dlopt.") || name == "operandSegmentSizes")
        continue;
      if (std::optional<rt::AttrValue> v = toAttrValue(attr.getValue()))
        instr.attrs[name.str()] = *v;
    }
    normalizeAttrs(&op, instr.attrs);
    if (auto fused = dyn_cast<dl::FusedElementwiseOp>(op))
      if (failed(encodeFused(fused, instr)))
        return failure();
    prog.instrs.push_back(std::move(instr));
  }

  for (auto [i, v] : llvm::enumerate(terminator->getOperands())) {
    auto index = fn.getResultAttrOfType<IntegerAttr>(unsigned(i), "dlopt.result");
    int64_t r = index ? index.getInt() : int64_t(i);
    auto name = fn.getResultAttrOfType<StringAttr>(unsigned(i), DLOptDialect::kOutputAttr);
    auto update = fn.getResultAttrOfType<StringAttr>(unsigned(i), DLOptDialect::kUpdateAttr);
    auto global = globalOf(fn.getResultAttrDict(unsigned(i)));
    if (failed(global))
      return failure();
    Output o{ids.lookup(v), name ? name.getValue().str() : "out" + std::to_string(r),
             update ? update.getValue().str() : "", *global};
    if (auto it = outputs.find(r); it != outputs.end()) {
      if (it->second.id != o.id)
        return fn.emitError() << "result '" << o.name
                              << "' is another value than the same result "
                                 "of another stage";
      continue;
    }
    outputIds[o.name] = o.id;
    outputs.emplace(r, std::move(o));
  }
  exe.programs.push_back(std::move(prog));
  }
  // Params, inputs and states in the step's argument order (a param's
  // initial value depends on its index), not in order of appearance.
  if (!argOrder.empty())
    for (std::vector<int32_t> *list : {&exe.params, &exe.inputs, &exe.states})
      llvm::stable_sort(*list, [&](int32_t a, int32_t b) {
        return argOrder.lookup(a) < argOrder.lookup(b);
      });
  for (auto &[r, o] : outputs) {
    exe.outputs.push_back(o.id);
    exe.outputNames.push_back(o.name);
    exe.outputUpdates.push_back(o.update);
    if (o.global)
      exe.values[size_t(o.id)].global = *o.global;
  }

  // Memory plans: persistent values first, then temporaries packed by
  // lifetime (outputs live to the end of the program). After every program
  // exists: with several, each holds only the arguments it uses.
  // Programs are planned independently, on the context's threads.
  std::vector<std::optional<rt::Expected<rt::MemoryPlan>>> plans(
      exe.programs.size());
  mlir::parallelFor(fn.getContext(), 0, exe.programs.size(), [&](size_t i) {
    plans[i].emplace(rt::planProgramMemory(exe, exe.programs[i]));
  });
  for (size_t i = 0; i < plans.size(); ++i) {
    if (!*plans[i])
      return fn.emitError() << "memory planning failed: "
                            << plans[i]->status().message();
    exe.programs[i].memory = plans[i]->take();
  }
  return exe;
}
