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

#include "mlir/Dialect/Func/IR/FuncOps.h"
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

  Block &body = fn.getBody().front();
  Operation *terminator = body.getTerminator();
  for (Operation &op : body) {
    if (&op == terminator)
      break;
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
      if (isFloatTensor(r.getType()))
        g->activationBytes += tensorBytes(r.getType());
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
    // Reshapes and transposes are views or copies: count the copy.
    g->otherFlops += outElems;
    g->otherBytes += inBytes + outBytes;
  }

  if (pre.numOps)
    s.groups.push_back(std::move(pre));
  for (auto &[mark, l] : layers)
    s.groups.push_back(std::move(l));
  if (post.numOps)
    s.groups.push_back(std::move(post));
  s.numLayers = static_cast<int64_t>(layers.size());
  s.learnedPositions = preGathers >= 2;
  if (s.dtype.empty()) {
    s.dtype = "f32";
    s.dtypeBytes = 4;
  }
  return s;
}
