//===- Graph.h - What the planner knows about a model graph ---------------===//
//
// A plain-C++ summary of a model's entry function, produced by the compiler
// (passes/Export/GraphSummary.cpp) and consumed by the search: per layer mark
// (`dlopt.layer = N`) the FLOPs and bytes of each op kind, the parameters the
// layer uses first and the bytes of the float values it produces, plus one
// "pre" group (unmarked ops before the first layer) and one "post" group
// (unmarked ops after it). No MLIR here. Counts are for the model's own
// batch (`batch`); the search scales them to a micro-batch. Alongside the
// groups, an op-level description (OpNode/ArgNode: every op with its shapes,
// operands, FLOPs and bytes) feeds the op-level planner for any graph.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlopt::planner {

/// One op group: a layer mark, or the unmarked ops before ("pre") or after
/// ("post") the layers.
struct OpGroupSummary {
  std::string name; ///< "pre", "layer N", "post"
  int64_t layer = -1; ///< the mark; -1 for pre/post
  int64_t numOps = 0;
  /// matmul: 2*M*N*K*batch; bytes = operands + result.
  double matmulFlops = 0, matmulBytes = 0;
  /// attention: 4*B*H*S*T*D (QK^T and PV); bytes = q, k, v, out.
  double attentionFlops = 0, attentionBytes = 0;
  /// everything else: ~1 FLOP per result element; bytes = operands + results.
  double otherFlops = 0, otherBytes = 0;
  double params = 0;          ///< elements of params first used here
  double paramBytes = 0;      ///< their bytes in the model's dtype

  double flops() const { return matmulFlops + attentionFlops + otherFlops; }
  double bytes() const { return matmulBytes + attentionBytes + otherBytes; }
};

/// How the op-level planner (planner/OpSharding.h) treats an op: which
/// sharding rules apply. The exact op is in OpNode::op.
enum class OpClass {
  Constant,    ///< arith.constant, dlopt.iota: replicated, free
  Elementwise, ///< unary, binary (broadcasting), select, compare, cast, dropout
  Matmul,
  Reduction,   ///< sum, mean, max over OpNode::dims
  Softmax,     ///< softmax, log_softmax over OpNode::dims[0]
  Norm,        ///< layer_norm, rms_norm over dims [OpNode::dims[0], rank)
  Gather,      ///< table rows by ids
  Attention,
  Rope,        ///< elementwise except the last two dims
  Conv2D,
  Pool,        ///< max_pool2d, avg_pool2d
  BatchNorm,
  Loss,        ///< cross_entropy, mse
  Reshape,
  Transpose,   ///< OpNode::dims = perm
  Broadcast,   ///< broadcast_to
  Concat,      ///< along OpNode::dims[0]
  Slice,       ///< OpNode::dims = the dims actually sliced
  Other,       ///< anything else (gradient ops, scatter_add, ...)
};

/// A reference to a value of the entry function: the result `result` of op
/// `producer` (producer >= 0), or function argument `-(producer + 1)`.
struct ValueRef {
  int producer = 0;
  int result = 0;
  bool isArg() const { return producer < 0; }
  int argIndex() const { return -(producer + 1); }
};

/// One op of the entry function, in program (topological) order. Counts are
/// for the model's own batch (GraphSummary::batch), like the group sums.
struct OpNode {
  int id = 0;          ///< index in GraphSummary::ops
  /// The stable id (`dlopt.id`) dlopt-check-model stamps before the
  /// training transforms, which keep it; -1 when the op has none.
  int64_t stableId = -1;
  /// `dlopt.fwd_id` on ops derived from a forward op (backward ops,
  /// recomputed clones, casts); -1 otherwise.
  int64_t fwdId = -1;
  /// The id plans key this op by: the stable id, or the position when the
  /// graph was summarized without ids (hand-built graphs in tests).
  int64_t key() const { return stableId >= 0 ? stableId : id; }
  std::string op;      ///< "dlopt.matmul", "arith.constant", ...
  OpClass kind = OpClass::Other;
  std::vector<int64_t> shape; ///< result #0 (empty for a scalar)
  /// Every result's shape (index = result number); may be empty in graphs
  /// built by hand, see GraphSummary::resultShape.
  std::vector<std::vector<int64_t>> resultShapes;
  std::string dtype;          ///< element type of result #0 ("f32", "i32")
  int elemBytes = 4;          ///< bytes per element of result #0
  bool isFloat = true;        ///< result #0 has a float element type
  int numResults = 1;
  /// Operands: who produces them, their shapes and bytes per element.
  std::vector<ValueRef> operands;
  std::vector<std::vector<int64_t>> operandShapes;
  std::vector<int> operandElemBytes;
  std::vector<bool> operandIsFloat;
  /// FLOPs as the groups count them, except conv2d and its gradients, which
  /// count 2 * MACs here (the groups count them as one FLOP per element).
  double flops = 0;
  double bytes = 0;      ///< operands read once + results written once
  double paramElems = 0; ///< elements of params first used by this op
  double resultBytes = 0;      ///< all results
  double floatResultBytes = 0; ///< float results (activations)
  int64_t layer = -1;          ///< the dlopt.layer mark, -1 if none
  bool backward = false;       ///< made by dlopt-autodiff (dlopt.backward)
  /// Result #0 is read by dlopt's backward pass, so a training step keeps
  /// it from the forward pass (summarizeGraph finds out from autodiff;
  /// true when it cannot, and in graphs built by hand).
  bool savedForBackward = true;
  /// Integer attributes the sharding rules need (meaning by kind above).
  std::vector<int64_t> dims;
  bool transposeA = false, transposeB = false; ///< matmul
  int64_t groups = 1;          ///< conv2d
  bool hasBias = false;        ///< conv2d
  bool keepDims = false;       ///< reductions
  bool training = true;        ///< batch_norm statistics from the batch
};

/// One argument of the entry function.
struct ArgNode {
  enum class Role { Param, Input, State, Other };
  int index = 0;
  std::string name; ///< the dlopt.param/input/state name, else "argN"
  Role role = Role::Other;
  std::vector<int64_t> shape;
  std::string dtype;
  int elemBytes = 4;
  bool isFloat = true;
};

struct GraphSummary {
  std::string modelName;
  /// "pre" (if any), then layers in mark order, then "post" (if any).
  std::vector<OpGroupSummary> groups;
  int64_t numLayers = 0; ///< distinct layer marks
  int64_t batch = 0;     ///< leading dim of the tokens input (or first input)
  int64_t seq = 0;       ///< second dim of an integer [B, S] input; 0 if none
  int64_t hidden = 0;    ///< heads * head dim of the attention ops; 0 if none
  int64_t heads = 0;     ///< query heads of the attention ops
  int64_t kvHeads = 0;   ///< key/value heads
  int64_t headDim = 0;
  int64_t ffn = 0;   ///< widest matmul output inside a layer
  int64_t vocab = 0; ///< rows of the table gathered by the tokens input
  bool tiedEmbeddings = false;   ///< the gathered table is used again in "post"
  bool learnedPositions = false; ///< a second gather (positions) in "pre"
  /// Params that weight or shift a norm (layer_norm, rms_norm) inside the
  /// first layer, and after the last one ("post").
  int64_t normParamsPerLayer = 0, normParamsPost = 0;
  std::string dtype;             ///< element type of the params ("f32", ...)
  int dtypeBytes = 4;
  double totalParams = 0;     ///< elements of every dlopt.param argument
  double totalParamBytes = 0; ///< their bytes

  /// The op-level description (planner/OpSearch.h plans from it): every op
  /// of the entry function but the terminator, in program order, every
  /// argument, and the values the function returns.
  std::vector<OpNode> ops;
  std::vector<ArgNode> args;
  std::vector<ValueRef> outputs;

  bool isTransformer() const { return numLayers > 0 && heads > 0 && seq > 0; }
  /// The shape of result `k` of `n`: from OpNode::resultShapes, else
  /// result #0's shape, else as a consumer sees it ({} if unused).
  std::vector<int64_t> resultShape(const OpNode &n, int k) const {
    if (k < int(n.resultShapes.size()))
      return n.resultShapes[k];
    if (k == 0)
      return n.shape;
    for (const OpNode &m : ops)
      for (size_t i = 0; i < m.operands.size(); ++i)
        if (m.operands[i].producer == n.id && m.operands[i].result == k &&
            i < m.operandShapes.size())
          return m.operandShapes[i];
    return {};
  }
  /// Positions of the forward ops, the ops a plan lists: every op but those
  /// of the backward pass (dlopt.backward) and those after it (the
  /// optimizer update of a graph that is already a training step).
  std::vector<int> forwardOps() const {
    std::vector<int> out;
    bool seenBackward = false;
    for (const OpNode &n : ops) {
      if (n.backward)
        seenBackward |= n.kind != OpClass::Constant; // constants are hoisted
      else if (!seenBackward)
        out.push_back(n.id);
    }
    return out;
  }
  /// The position in `ops` of the op with plan key `key` (OpNode::key), or
  /// -1. Linear; callers that look up many build their own map.
  int findOp(int64_t key) const {
    for (const OpNode &n : ops)
      if (n.key() == key)
        return n.id;
    return -1;
  }
  double totalFlops() const {
    double f = 0;
    for (const auto &g : groups)
      f += g.flops();
    return f;
  }
  /// The group of layer mark `layer`, or nullptr.
  const OpGroupSummary *layer(int64_t layer) const {
    for (const auto &g : groups)
      if (g.layer == layer)
        return &g;
    return nullptr;
  }
  const OpGroupSummary *group(const std::string &name) const {
    for (const auto &g : groups)
      if (g.name == name)
        return &g;
    return nullptr;
  }
};

} // namespace dlopt::planner
