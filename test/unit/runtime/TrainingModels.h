//===- TrainingModels.h - Small hand-built training-step plans ------------===//
//
// What `dlopt-compile --train` produces, in miniature: inputs, params,
// optimizer states, "loss"/"lr"/"grad_norm" outputs, and one output per
// param/state that updates it. The gradients are written out by hand with
// existing ops, so these plans test the runtime without the compiler.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "TestUtil.h"

namespace dlopt::rt::test {

inline int32_t scalarF32(ExeBuilder &b, float v) {
  return b.constant(tt({}), {v});
}
inline int32_t scalarI64(ExeBuilder &b, int64_t v) {
  return b.constantBytes(tt({}, DType::I64), &v, sizeof(v));
}
inline std::map<std::string, AttrValue> reduceAll(int rank) {
  std::vector<int64_t> dims;
  for (int i = 0; i < rank; ++i)
    dims.push_back(i);
  return {{"dims", dims}, {"keepdims", int64_t(0)}};
}
/// sqrt(sum(x * x)) over every dim.
inline int32_t norm(ExeBuilder &b, int32_t x, const TensorType &t) {
  int32_t sq = b.op("mul", {x, x}, t);
  int32_t s = b.op("sum", {sq}, tt({}), reduceAll(int(t.shape.size())));
  return b.op("sqrt", {s}, tt({}));
}
/// "step" += 1, as every optimizer's step count.
inline void stepCounter(ExeBuilder &b) {
  int32_t step = b.state("step", tt({}, DType::I64));
  int32_t next = b.op("add", {step, scalarI64(b, 1)}, tt({}, DType::I64));
  b.output("step.next", next, "step");
}

/// A bigram language model: logits[b, s] = table[tokens[b, s]], trained
/// with SGD with momentum (state "sgd.m.table"):
///   m' = 0.9 m + dtable,  table' = table - lr m'.
inline Executable bigramModel(int64_t vocab, int64_t batch, int64_t seq,
                              float lr = 0.5f) {
  ExeBuilder b;
  int64_t n = batch * seq;
  TensorType tv = tt({vocab, vocab});
  int32_t tokens = b.input("tokens", tt({batch, seq}, DType::I32));
  int32_t labels = b.input("labels", tt({batch, seq}, DType::I32));
  int32_t table = b.param("table", tv, Init{"normal", 0.0, 0.1});
  int32_t m = b.state("sgd.m.table", tv);
  int32_t lrc = scalarF32(b, lr);
  int32_t logits3 = b.op("gather", {table, tokens}, tt({batch, seq, vocab}));
  int32_t logits = b.op("reshape", {logits3}, tt({n, vocab}));
  int32_t lab = b.op("reshape", {labels}, tt({n}, DType::I32));
  std::map<std::string, AttrValue> ign = {{"ignore_index", int64_t(-100)}};
  int32_t loss = b.op("cross_entropy", {logits, lab}, tt({}), ign);
  int32_t dl = b.op("cross_entropy_grad", {logits, lab, scalarF32(b, 1.0f)},
                    tt({n, vocab}), ign);
  int32_t dl3 = b.op("reshape", {dl}, tt({batch, seq, vocab}));
  int32_t dtable = b.op("scatter_add", {tokens, dl3}, tv);
  int32_t mm = b.op("mul", {m, scalarF32(b, 0.9f)}, tv);
  int32_t m2 = b.op("add", {mm, dtable}, tv);
  int32_t upd = b.op("mul", {m2, lrc}, tv);
  int32_t table2 = b.op("sub", {table, upd}, tv);
  b.output("loss", loss);
  b.output("lr", lrc);
  b.output("grad_norm", norm(b, dtable, tv));
  b.output("table.next", table2, "table");
  b.output("m.next", m2, "sgd.m.table");
  stepCounter(b);
  return b.build();
}

/// A linear classifier on [batch, dim] features with plain SGD; returns
/// "logits" [batch, classes] for accuracy.
inline Executable classifierModel(int64_t batch, int64_t dim, int64_t classes,
                                  float lr = 0.5f) {
  ExeBuilder b;
  TensorType tw = tt({dim, classes}), tl = tt({batch, classes});
  int32_t x = b.input("images", tt({batch, dim}));
  int32_t y = b.input("labels", tt({batch}, DType::I32));
  int32_t w = b.param("W", tw, Init{"normal", 0.0, 0.1});
  int32_t lrc = scalarF32(b, lr);
  int32_t logits = b.op("matmul", {x, w}, tl);
  std::map<std::string, AttrValue> ign = {{"ignore_index", int64_t(-100)}};
  int32_t loss = b.op("cross_entropy", {logits, y}, tt({}), ign);
  int32_t dl = b.op("cross_entropy_grad", {logits, y, scalarF32(b, 1.0f)}, tl,
                    ign);
  int32_t dw = b.op("matmul", {x, dl}, tw, {{"transpose_a", int64_t(1)}});
  int32_t upd = b.op("mul", {dw, lrc}, tw);
  int32_t w2 = b.op("sub", {w, upd}, tw);
  b.output("loss", loss);
  b.output("lr", lrc);
  b.output("grad_norm", norm(b, dw, tw));
  b.output("logits", logits);
  b.output("W.next", w2, "W");
  stepCounter(b);
  return b.build();
}

/// loss = sqrt(p) with p' = p - 1 from p = 1: losses 1, 0, then NaN at
/// step 3. With `lossScale`, a "loss_scale" state (halved every step)
/// marks the plan as loss-scaled, so non-finite losses are skipped steps.
inline Executable divergingModel(bool lossScale) {
  ExeBuilder b;
  int32_t p = b.param("p", tt({}), Init{"constant", 0, 1, 0, 1, 1.0});
  int32_t loss = b.op("sqrt", {p}, tt({}));
  int32_t p2 = b.op("sub", {p, scalarF32(b, 1.0f)}, tt({}));
  b.output("loss", loss);
  b.output("p.next", p2, "p");
  if (lossScale) {
    int32_t s = b.state("loss_scale", tt({}),
                        Init{"constant", 0, 1, 0, 1, 1024.0});
    b.output("scale.next", b.op("mul", {s, scalarF32(b, 0.5f)}, tt({})),
             "loss_scale");
  }
  return b.build();
}

} // namespace dlopt::rt::test
