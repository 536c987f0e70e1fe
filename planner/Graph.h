//===- Graph.h - What the planner knows about a model graph ---------------===//
//
// A plain-C++ summary of a model's entry function, produced by the compiler
// (passes/Export/GraphSummary.cpp) and consumed by the search: per layer mark
// (`dlopt.layer = N`) the FLOPs and bytes of each op kind, the parameters the
// layer uses first and the bytes of the float values it produces, plus one
// "pre" group (unmarked ops before the first layer) and one "post" group
// (unmarked ops after it). No MLIR here. Counts are for the model's own
// batch (`batch`); the search scales them to a micro-batch.
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
  double activationBytes = 0; ///< bytes of float results of the group's ops

  double flops() const { return matmulFlops + attentionFlops + otherFlops; }
  double bytes() const { return matmulBytes + attentionBytes + otherBytes; }
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
  std::string dtype;             ///< element type of the params ("f32", ...)
  int dtypeBytes = 4;
  double totalParams = 0;     ///< elements of every dlopt.param argument
  double totalParamBytes = 0; ///< their bytes

  bool isTransformer() const { return numLayers > 0 && heads > 0 && seq > 0; }
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
