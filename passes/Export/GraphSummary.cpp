//===- GraphSummary.cpp - Per-layer FLOPs, bytes and params of a model ----===//
//
// Counts, for every op of the entry function, FLOPs by kind (matmul
// 2*M*N*K*batch, attention 4*B*H*S*T*D, anything else one FLOP per result
// element) and HBM bytes (every tensor operand read once, every result
// written once), and groups them by `dlopt.layer` mark. Unmarked ops before
// the first marked op form "pre", the others "post". A param belongs to the
// group that uses it first.
//
//===----------------------------------------------------------------------===//
#include "passes/Export/GraphSummary.h"

#include "dialects/DLOpt/IR/DLOptDialect.h"
#include "dialects/DLOpt/IR/DLOptOps.h"
#include "passes/ModelUtils.h"

#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <map>

using namespace mlir;
using namespace dlopt;
using dl::DLOptDialect;

static double elements(Type t) {
  auto rt = dyn_cast<RankedTensorType>(t);
  if (!rt || !rt.hasStaticShape())
    return 0;
  return static_cast<double>(rt.getNumElements());
}

static int elemBytes(Type t) {
  auto rt = dyn_cast<RankedTensorType>(t);
  if (!rt)
    return 0;
  unsigned w = rt.getElementType().getIntOrFloatBitWidth();
  return w < 8 ? 1 : static_cast<int>(w / 8);
}

static double tensorBytes(Type t) { return elements(t) * elemBytes(t); }

static bool isFloatTensor(Type t) {
  auto rt = dyn_cast<RankedTensorType>(t);
  return rt && isa<FloatType>(rt.getElementType());
}

static std::string typeName(Type elem) {
  std::string s;
  llvm::raw_string_ostream os(s);
  elem.print(os);
  return s;
}

static std::vector<int64_t> shapeOf(Type t) {
  auto rt = dyn_cast<RankedTensorType>(t);
  if (!rt)
    return {};
  return std::vector<int64_t>(rt.getShape().begin(), rt.getShape().end());
}

static std::string elemTypeName(Type t) {
  if (auto rt = dyn_cast<RankedTensorType>(t))
    return typeName(rt.getElementType());
  return typeName(t);
}

static int64_t normDim(int64_t d, int64_t rank) { return d < 0 ? d + rank : d; }

/// The op-level class of an op (planner/Graph.h, OpClass).
static planner::OpClass classify(Operation &op) {
  using C = planner::OpClass;
  StringRef n = op.getName().getStringRef();
  if (n == "arith.constant" || isa<dl::IotaOp>(op))
    return C::Constant;
  if (isa<dl::MatmulOp>(op))
    return C::Matmul;
  if (isa<dl::SumOp, dl::MeanOp, dl::MaxOp>(op))
    return C::Reduction;
  if (isa<dl::SoftmaxOp, dl::LogSoftmaxOp>(op))
    return C::Softmax;
  if (isa<dl::LayerNormOp, dl::RMSNormOp>(op))
    return C::Norm;
  if (isa<dl::GatherOp>(op))
    return C::Gather;
  if (isa<dl::AttentionOp>(op))
    return C::Attention;
  if (isa<dl::RopeOp>(op))
    return C::Rope;
  if (isa<dl::Conv2DOp>(op))
    return C::Conv2D;
  if (isa<dl::MaxPool2DOp, dl::AvgPool2DOp>(op))
    return C::Pool;
  if (isa<dl::BatchNormOp>(op))
    return C::BatchNorm;
  if (isa<dl::CrossEntropyOp, dl::MSEOp>(op))
    return C::Loss;
  if (isa<dl::ReshapeOp>(op))
    return C::Reshape;
  if (isa<dl::TransposeOp>(op))
    return C::Transpose;
  if (isa<dl::BroadcastToOp>(op))
    return C::Broadcast;
  if (isa<dl::ConcatOp>(op))
    return C::Concat;
  if (isa<dl::SliceOp>(op))
    return C::Slice;
  if (op.hasTrait<OpTrait::Elementwise>() ||
      isa<dl::AddOp, dl::SubOp, dl::MulOp, dl::DivOp, dl::MaximumOp,
          dl::MinimumOp, dl::PowOp, dl::CompareOp, dl::SelectOp,
          dl::DropoutOp, dl::GeluGradOp>(op))
    return C::Elementwise;
  return C::Other;
}

/// The rule attributes and better FLOP counts of one op node.
static void describeOp(Operation &op, planner::OpNode &n) {
  int64_t rank = static_cast<int64_t>(n.shape.size());
  double outElems = 1;
  for (int64_t d : n.shape)
    outElems *= static_cast<double>(d);
  if (auto mm = dyn_cast<dl::MatmulOp>(op)) {
    n.transposeA = mm.getTransposeA();
    n.transposeB = mm.getTransposeB();
  } else if (auto r = dyn_cast<dl::SumOp>(op)) {
    n.dims.assign(r.getDims().begin(), r.getDims().end());
    n.keepDims = r.getKeepdims();
  } else if (auto r = dyn_cast<dl::MeanOp>(op)) {
    n.dims.assign(r.getDims().begin(), r.getDims().end());
    n.keepDims = r.getKeepdims();
  } else if (auto r = dyn_cast<dl::MaxOp>(op)) {
    n.dims.assign(r.getDims().begin(), r.getDims().end());
    n.keepDims = r.getKeepdims();
  } else if (auto sm = dyn_cast<dl::SoftmaxOp>(op)) {
    n.dims = {normDim(sm.getDim(), rank)};
  } else if (auto sm = dyn_cast<dl::LogSoftmaxOp>(op)) {
    n.dims = {normDim(sm.getDim(), rank)};
  } else if (auto ln = dyn_cast<dl::LayerNormOp>(op)) {
    n.dims = {normDim(ln.getAxis(), rank)};
  } else if (auto ln = dyn_cast<dl::RMSNormOp>(op)) {
    n.dims = {normDim(ln.getAxis(), rank)};
  } else if (auto tr = dyn_cast<dl::TransposeOp>(op)) {
    n.dims.assign(tr.getPerm().begin(), tr.getPerm().end());
  } else if (auto c = dyn_cast<dl::ConcatOp>(op)) {
    n.dims = {normDim(c.getDim(), rank)};
  } else if (isa<dl::SliceOp>(op)) {
    // The dims whose size changes; the others are copied whole.
    auto in = shapeOf(op.getOperand(0).getType());
    for (int64_t d = 0; d < rank && d < int64_t(in.size()); ++d)
      if (in[d] != n.shape[d])
        n.dims.push_back(d);
  } else if (auto conv = dyn_cast<dl::Conv2DOp>(op)) {
    n.groups = conv.getGroups();
    n.hasBias = static_cast<bool>(conv.getBias());
    auto w = shapeOf(conv.getFilter().getType());
    if (w.size() == 4)
      n.flops = 2.0 * outElems * double(w[1]) * double(w[2]) * double(w[3]);
  } else if (auto bn = dyn_cast<dl::BatchNormOp>(op)) {
    n.training = bn.getTraining();
  } else if (isa<dl::Conv2DGradInputOp>(op)) {
    auto w = shapeOf(op.getOperand(1).getType());
    if (w.size() == 4 && n.groups > 0)
      n.flops = 2.0 * outElems * double(w[0]) * double(w[2]) * double(w[3]);
  } else if (isa<dl::Conv2DGradFilterOp>(op)) {
    auto dy = shapeOf(op.getOperand(0).getType());
    if (dy.size() == 4)
      n.flops = 2.0 * outElems * double(dy[0]) * double(dy[2]) * double(dy[3]);
  }
}

/// The positions (in `fn`'s body, terminator excluded) of the forward ops
/// whose result #0 dlopt's own backward pass reads: what a training step
/// keeps from the forward pass (a relu's output, a matmul's inputs; not a
/// residual add's sum). A training graph answers directly; a loss function
/// is differentiated in a throw-away clone (dlopt-autodiff, the rules the
/// compiler will apply). Returns nothing when neither applies or autodiff
/// fails (the compile reports that itself): every float result counts.
static std::optional<llvm::DenseSet<int>> savedForBackward(ModuleOp module,
                                                          func::FuncOp fn,
                                                          StringRef entry) {
  // The backward ops' operands that are forward results #0, as positions.
  auto collect = [](func::FuncOp f, auto positionOf) {
    llvm::DenseSet<int> saved;
    for (Operation &op : f.getBody().front()) {
      if (!op.hasAttr(DLOptDialect::kBackwardAttr))
        continue;
      for (Value v : op.getOperands()) {
        auto res = dyn_cast<OpResult>(v);
        if (!res || res.getResultNumber() != 0 ||
            res.getOwner()->hasAttr(DLOptDialect::kBackwardAttr))
          continue;
        if (std::optional<int> pos = positionOf(res.getOwner()))
          saved.insert(*pos);
      }
    }
    return saved;
  };
  Block &body = fn.getBody().front();
  if (llvm::any_of(body, [](Operation &op) {
        return op.hasAttr(DLOptDialect::kBackwardAttr);
      })) {
    // Already a training step: read it as it is.
    llvm::DenseMap<Operation *, int> pos;
    for (Operation &op : body)
      pos[&op] = static_cast<int>(pos.size());
    return collect(fn, [&](Operation *op) -> std::optional<int> {
      auto it = pos.find(op);
      return it == pos.end() ? std::nullopt : std::optional<int>(it->second);
    });
  }
  if (!fn->hasAttr(DLOptDialect::kLossAttr))
    return std::nullopt;
  // A loss function: differentiate a copy whose ops carry their positions.
  // (Not dlopt.*: the dialect verifies its own discardable attributes.)
  constexpr llvm::StringLiteral kPos = "summary_pos";
  OwningOpRef<ModuleOp> clone = module.clone();
  FailureOr<func::FuncOp> cf = findEntryFunction(*clone, entry);
  if (failed(cf))
    return std::nullopt;
  int n = 0;
  for (Operation &op : cf->getBody().front())
    op.setAttr(kPos, IntegerAttr::get(IntegerType::get(op.getContext(), 64),
                                      n++));
  {
    // Quiet: a model autodiff rejects is reported by the compile itself.
    ScopedDiagnosticHandler quiet(module.getContext(),
                                  [](Diagnostic &) { return success(); });
    PassManager pm(module.getContext());
    AutodiffPassOptions ad;
    ad.entry = entry.str();
    pm.addPass(createAutodiffPass(ad));
    if (failed(pm.run(*clone)))
      return std::nullopt;
  }
  cf = findEntryFunction(*clone, entry);
  if (failed(cf))
    return std::nullopt;
  return collect(*cf, [&](Operation *op) -> std::optional<int> {
    if (auto p = op->getAttrOfType<IntegerAttr>(kPos))
      return static_cast<int>(p.getInt());
    return std::nullopt;
  });
}

FailureOr<planner::GraphSummary> dlopt::summarizeGraph(ModuleOp module,
                                                       StringRef entry) {
  FailureOr<func::FuncOp> fnOr = findEntryFunction(module, entry);
  if (failed(fnOr))
    return failure();
  func::FuncOp fn = *fnOr;

  planner::GraphSummary s;
  s.modelName = fn.getSymName().str();

  // Arguments: params (counted), the tokens input (batch, seq).
  llvm::DenseSet<Value> params;
  Value tokens;
  for (unsigned i = 0, e = fn.getNumArguments(); i < e; ++i) {
    Value arg = fn.getArgument(i);
    {
      planner::ArgNode a;
      a.index = static_cast<int>(i);
      a.shape = shapeOf(arg.getType());
      a.dtype = elemTypeName(arg.getType());
      a.elemBytes = elemBytes(arg.getType());
      a.isFloat = isFloatTensor(arg.getType());
      a.name = "arg" + std::to_string(i);
      using Role = planner::ArgNode::Role;
      if (auto n = fn.getArgAttrOfType<StringAttr>(i, DLOptDialect::kParamAttr)) {
        a.role = Role::Param;
        a.name = n.getValue().str();
      } else if (auto n = fn.getArgAttrOfType<StringAttr>(
                     i, DLOptDialect::kInputAttr)) {
        a.role = Role::Input;
        a.name = n.getValue().str();
      } else if (auto n = fn.getArgAttrOfType<StringAttr>(
                     i, DLOptDialect::kStateAttr)) {
        a.role = Role::State;
        a.name = n.getValue().str();
      }
      s.args.push_back(std::move(a));
    }
    if (fn.getArgAttrOfType<StringAttr>(i, DLOptDialect::kParamAttr)) {
      params.insert(arg);
      s.totalParams += elements(arg.getType());
      s.totalParamBytes += tensorBytes(arg.getType());
      if (s.dtype.empty())
        if (auto rt = dyn_cast<RankedTensorType>(arg.getType())) {
          s.dtype = typeName(rt.getElementType());
          s.dtypeBytes = elemBytes(rt);
        }
      continue;
    }
    auto in = fn.getArgAttrOfType<StringAttr>(i, DLOptDialect::kInputAttr);
    if (!in)
      continue;
    auto rt = dyn_cast<RankedTensorType>(arg.getType());
    if (!rt || rt.getRank() == 0)
      continue;
    if (!s.batch)
      s.batch = rt.getDimSize(0);
    bool isInt = isa<IntegerType>(rt.getElementType());
    if (isInt && rt.getRank() == 2 &&
        (!tokens || in.getValue() == "tokens")) {
      tokens = arg;
      s.batch = rt.getDimSize(0);
      s.seq = rt.getDimSize(1);
    }
  }

  // Groups: "pre" = index 0, layers by mark, "post".
  planner::OpGroupSummary pre, post;
  pre.name = "pre";
  post.name = "post";
  std::map<int64_t, planner::OpGroupSummary> layers;
  bool seenLayer = false;
  llvm::DenseSet<Value> usedParams;
  Value embeddingTable;
  int preGathers = 0;
  std::optional<int64_t> firstMark;
  llvm::DenseSet<Value> normParamsLayer, normParamsPost, normParamsPre;

  Block &body = fn.getBody().front();
  Operation *terminator = body.getTerminator();
  llvm::DenseMap<Operation *, int> opIds;
  auto refOf = [&](Value v) {
    planner::ValueRef r;
    if (auto ba = dyn_cast<BlockArgument>(v)) {
      r.producer = -(static_cast<int>(ba.getArgNumber()) + 1);
      return r;
    }
    auto res = cast<OpResult>(v);
    auto it = opIds.find(res.getOwner());
    r.producer = it == opIds.end() ? -1 : it->second;
    r.result = static_cast<int>(res.getResultNumber());
    return r;
  };
  // Params already used by an earlier op node (for OpNode::paramElems).
  llvm::DenseSet<Value> nodeParams;
  const std::optional<llvm::DenseSet<int>> saved =
      savedForBackward(module, fn, entry);
  for (Operation &op : body) {
    if (&op == terminator)
      break;
    {
      planner::OpNode n;
      n.id = static_cast<int>(s.ops.size());
      if (saved)
        n.savedForBackward = saved->contains(n.id);
      n.op = op.getName().getStringRef().str();
      n.kind = classify(op);
      n.numResults = static_cast<int>(op.getNumResults());
      if (op.getNumResults() > 0) {
        Type r0 = op.getResult(0).getType();
        n.shape = shapeOf(r0);
        n.dtype = elemTypeName(r0);
        n.elemBytes = elemBytes(r0);
        n.isFloat = isFloatTensor(r0);
      }
      double outElems = 0;
      for (Value r : op.getResults()) {
        n.resultShapes.push_back(shapeOf(r.getType()));
        n.resultBytes += tensorBytes(r.getType());
        outElems += elements(r.getType());
        if (isFloatTensor(r.getType()))
          n.floatResultBytes += tensorBytes(r.getType());
      }
      for (Value v : op.getOperands()) {
        n.operands.push_back(refOf(v));
        n.operandShapes.push_back(shapeOf(v.getType()));
        n.operandElemBytes.push_back(elemBytes(v.getType()));
        n.operandIsFloat.push_back(isFloatTensor(v.getType()));
        n.bytes += tensorBytes(v.getType());
        if (params.contains(v) && nodeParams.insert(v).second)
          n.paramElems += elements(v.getType());
      }
      n.bytes += n.resultBytes;
      // A reshape moves nothing (a view); a gather reads its ids and the
      // rows it writes. The groups (below) add these bytes up.
      if (isa<dl::ReshapeOp>(op))
        n.bytes = 0;
      else if (auto gather = dyn_cast<dl::GatherOp>(op))
        n.bytes = tensorBytes(gather.getIds().getType()) + 2 * n.resultBytes;
      if (auto mark = op.getAttrOfType<IntegerAttr>(DLOptDialect::kLayerAttr))
        n.layer = mark.getInt();
      n.backward = op.hasAttr(DLOptDialect::kBackwardAttr);
      if (auto id = op.getAttrOfType<IntegerAttr>(DLOptDialect::kIdAttr))
        n.stableId = id.getInt();
      if (auto id = op.getAttrOfType<IntegerAttr>(DLOptDialect::kFwdIdAttr))
        n.fwdId = id.getInt();
      // FLOPs as the groups count them (below); conv2d and its gradients
      // get their multiply-adds in describeOp.
      if (auto mm = dyn_cast<dl::MatmulOp>(op)) {
        auto lhs = cast<RankedTensorType>(mm.getLhs().getType());
        int64_t k = mm.getTransposeA() ? lhs.getDimSize(lhs.getRank() - 2)
                                       : lhs.getDimSize(lhs.getRank() - 1);
        n.flops = 2.0 * outElems * static_cast<double>(k);
      } else if (auto at = dyn_cast<dl::AttentionOp>(op)) {
        auto q = cast<RankedTensorType>(at.getQuery().getType());
        auto k = cast<RankedTensorType>(at.getKey().getType());
        if (q.getRank() == 4 && k.getRank() == 4)
          n.flops = 4.0 * q.getDimSize(0) * q.getDimSize(1) * q.getDimSize(2) *
                    q.getDimSize(3) * k.getDimSize(2);
        else
          n.flops = 4.0 * outElems * elements(k) /
                    std::max<double>(1.0, k.getShape().back());
      } else if (n.kind == planner::OpClass::Constant ||
                 isa<dl::ReshapeOp>(op)) {
        n.flops = 0; // a reshape is a view
      } else {
        n.flops = outElems;
      }
      if (isa<dl::AttentionGradOp>(op) && op.getNumOperands() >= 2) {
        // Recomputes the scores and forms four products: ~2x the forward.
        auto q = shapeOf(op.getOperand(0).getType());
        auto k = shapeOf(op.getOperand(1).getType());
        if (q.size() == 4 && k.size() == 4)
          n.flops = 8.0 * q[0] * q[1] * q[2] * q[3] * k[2];
      }
      describeOp(op, n);
      opIds[&op] = n.id;
      s.ops.push_back(std::move(n));
    }
    if (isa<dl::LayerNormOp, dl::RMSNormOp>(op)) {
      auto mark = op.getAttrOfType<IntegerAttr>(DLOptDialect::kLayerAttr);
      if (!mark || !firstMark || *firstMark == mark.getInt()) {
        if (mark)
          firstMark = mark.getInt();
        for (Value v : op.getOperands().drop_front())
          if (params.contains(v))
            (mark ? normParamsLayer : (seenLayer ? normParamsPost : normParamsPre))
                .insert(v);
      }
    }
    planner::OpGroupSummary *g;
    if (auto mark = op.getAttrOfType<IntegerAttr>(DLOptDialect::kLayerAttr)) {
      seenLayer = true;
      auto &l = layers[mark.getInt()];
      if (l.name.empty()) {
        l.layer = mark.getInt();
        l.name = "layer " + std::to_string(mark.getInt());
      }
      g = &l;
    } else {
      g = seenLayer ? &post : &pre;
    }
    ++g->numOps;

    double inBytes = 0, outBytes = 0, outElems = 0;
    for (Value v : op.getOperands()) {
      inBytes += tensorBytes(v.getType());
      if (params.contains(v) && usedParams.insert(v).second) {
        g->params += elements(v.getType());
        g->paramBytes += tensorBytes(v.getType());
      }
    }
    for (Value r : op.getResults()) {
      outBytes += tensorBytes(r.getType());
      outElems += elements(r.getType());
    }

    if (auto mm = dyn_cast<dl::MatmulOp>(op)) {
      auto lhs = cast<RankedTensorType>(mm.getLhs().getType());
      int64_t k = mm.getTransposeA() ? lhs.getDimSize(lhs.getRank() - 2)
                                     : lhs.getDimSize(lhs.getRank() - 1);
      g->matmulFlops += 2.0 * outElems * static_cast<double>(k);
      g->matmulBytes += inBytes + outBytes;
      if (g->layer >= 0) {
        auto res = cast<RankedTensorType>(mm.getResult().getType());
        s.ffn = std::max<int64_t>(s.ffn, res.getDimSize(res.getRank() - 1));
      }
      if (g == &post && embeddingTable && mm.getRhs() == embeddingTable)
        s.tiedEmbeddings = true;
      continue;
    }
    if (auto at = dyn_cast<dl::AttentionOp>(op)) {
      auto q = cast<RankedTensorType>(at.getQuery().getType());
      auto k = cast<RankedTensorType>(at.getKey().getType());
      if (q.getRank() == 4 && k.getRank() == 4) {
        double b = q.getDimSize(0), h = q.getDimSize(1), sq = q.getDimSize(2),
               d = q.getDimSize(3), t = k.getDimSize(2);
        g->attentionFlops += 4.0 * b * h * sq * t * d;
        if (!s.heads) {
          s.heads = q.getDimSize(1);
          s.kvHeads = k.getDimSize(1);
          s.headDim = q.getDimSize(3);
          s.hidden = s.heads * s.headDim;
        }
      } else {
        g->attentionFlops += 4.0 * outElems * elements(k) /
                             std::max<double>(1.0, k.getShape().back());
      }
      g->attentionBytes += inBytes + outBytes;
      continue;
    }
    if (auto gather = dyn_cast<dl::GatherOp>(op)) {
      if (g == &pre) {
        ++preGathers;
        if (tokens && gather.getIds() == tokens) {
          embeddingTable = gather.getTable();
          auto t = cast<RankedTensorType>(gather.getTable().getType());
          s.vocab = t.getDimSize(0);
        }
      }
    }
    // A reshape is a view: the backends' memory planner gives its result
    // its operand's bytes (runtime/format/MemoryPlanner.cpp), so nothing
    // moves. A transpose is a copy. The bytes are the op node's (a gather
    // reads its ids and the rows it writes, not the whole table).
    if (isa<dl::ReshapeOp>(op))
      continue;
    g->otherFlops += outElems;
    g->otherBytes += s.ops.back().bytes;
  }

  for (Value v : terminator->getOperands())
    s.outputs.push_back(refOf(v));

  if (pre.numOps)
    s.groups.push_back(std::move(pre));
  for (auto &[mark, l] : layers)
    s.groups.push_back(std::move(l));
  if (post.numOps)
    s.groups.push_back(std::move(post));
  s.numLayers = static_cast<int64_t>(layers.size());
  s.learnedPositions = preGathers >= 2;
  s.normParamsPerLayer = int64_t(normParamsLayer.size());
  s.normParamsPost = int64_t(normParamsPost.size());
  if (s.dtype.empty()) {
    s.dtype = "f32";
    s.dtypeBytes = 4;
  }
  return s;
}
