//===- FoldBatchReductions.cpp - One GEMM for batch-summed weight grads ---===//
//
// The gradient of a weight that a matmul broadcasts over batch dims is, as
// autodiff writes it, a batched product summed over the batch:
//
//   %g = dlopt.matmul %x, %dy {transpose_a} : [B, S, K], [B, S, N] -> [B, K, N]
//   %w = dlopt.sum %g dims = [0]             : [B, K, N] -> [K, N]
//
// which costs a [B, K, N] temporary, B GEMMs of S rows each and a pass over
// the temporary. The same numbers are one GEMM over the flattened rows,
// which this pass writes instead (the reshapes of contiguous leading dims
// move no data; the GEMM accumulates all B * S rows in f32 before the one
// rounding, where the batched form rounded each sample's product first):
//
//   %x2 = dlopt.reshape %x  : [B, S, K] -> [B*S, K]
//   %d2 = dlopt.reshape %dy : [B, S, N] -> [B*S, N]
//   %w  = dlopt.matmul %x2, %d2 {transpose_a} : ... -> [K, N]
//
// It also turns a sum, mean or max over dims of size 1 into a reshape (a
// copy before: at batch 1 every weight gradient went through one).
//
// It runs after autodiff and partitioning, on per-device shapes, so the
// rows it merges are always this rank's own.
//
//===----------------------------------------------------------------------===//
#include "dialects/DLOpt/IR/DLOptOps.h"
#include "passes/Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

#define DEBUG_TYPE "dlopt-fold-batch-reductions"

namespace dlopt {
#define GEN_PASS_DEF_FOLDBATCHREDUCTIONSPASS
#define GEN_PASS_DEF_FOLDLOSSCASTSPASS
#include "passes/Passes.h.inc"
} // namespace dlopt

using namespace mlir;
using namespace dlopt;

namespace {

/// Gives `to` the marks of `from` (layer, backward, micro-batch, ...). A
/// stable id stays unique: `keepId` ops take it, the others record it as
/// the op they derive from.
void copyMarks(Operation *from, Operation *to, bool keepId) {
  for (NamedAttribute na : from->getDiscardableAttrs()) {
    StringRef name = na.getName().getValue();
    if (name == "dlopt.id" && !keepId) {
      if (!from->hasAttr("dlopt.fwd_id"))
        to->setAttr("dlopt.fwd_id", na.getValue());
      continue;
    }
    to->setAttr(na.getName(), na.getValue());
  }
}

SmallVector<int64_t> sortedDims(ArrayRef<int64_t> dims, int64_t rank) {
  SmallVector<int64_t> out;
  for (int64_t d : dims)
    out.push_back(dl::normalizeDim(d, rank));
  llvm::sort(out);
  return out;
}

struct BatchedMatmulSum : OpRewritePattern<dl::SumOp> {
  BatchedMatmulSum(MLIRContext *ctx, int64_t &count)
      : OpRewritePattern(ctx), count(count) {}
  int64_t &count;

  LogicalResult matchAndRewrite(dl::SumOp sum,
                                PatternRewriter &rewriter) const override {
    auto mm = sum.getInput().getDefiningOp<dl::MatmulOp>();
    if (!mm || !mm.getTransposeA() || mm.getTransposeB() || !mm->hasOneUse() ||
        sum.getKeepdims())
      return rewriter.notifyMatchFailure(sum, "not sum(matmul(a^T, b))");
    auto rt = cast<RankedTensorType>(mm.getType());
    auto at = cast<RankedTensorType>(mm.getLhs().getType());
    auto bt = cast<RankedTensorType>(mm.getRhs().getType());
    int64_t rank = rt.getRank(), batch = rank - 2;
    if (batch < 1 || at.getRank() != rank || bt.getRank() != rank)
      return rewriter.notifyMatchFailure(sum, "no batch dims on both operands");
    SmallVector<int64_t> dims = sortedDims(sum.getDims(), rank);
    if (int64_t(dims.size()) != batch)
      return rewriter.notifyMatchFailure(sum, "not a sum over every batch dim");
    int64_t rows = at.getDimSize(batch);
    for (int64_t i = 0; i < batch; ++i) {
      if (dims[size_t(i)] != i || at.getDimSize(i) != rt.getDimSize(i) ||
          bt.getDimSize(i) != rt.getDimSize(i))
        return rewriter.notifyMatchFailure(sum, "broadcast batch dims");
      rows *= rt.getDimSize(i);
    }
    auto want = RankedTensorType::get(
        {at.getDimSize(batch + 1), bt.getDimSize(batch + 1)},
        rt.getElementType());
    if (want != sum.getType())
      return rewriter.notifyMatchFailure(sum, "result type differs");
    Location loc = sum.getLoc();
    auto flat = [&](Value v, RankedTensorType t) {
      auto ft = RankedTensorType::get({rows, t.getDimSize(batch + 1)},
                                      t.getElementType());
      auto r = dl::ReshapeOp::create(rewriter, loc, ft, v);
      copyMarks(sum, r, /*keepId=*/false);
      return r.getResult();
    };
    Value a = flat(mm.getLhs(), at), b = flat(mm.getRhs(), bt);
    auto gemm = dl::MatmulOp::create(rewriter, loc, a, b, /*transpose_a=*/true,
                                     /*transpose_b=*/false);
    copyMarks(sum, gemm, /*keepId=*/true);
    rewriter.replaceOp(sum, gemm.getResult());
    rewriter.eraseOp(mm);
    ++count;
    return success();
  }
};

/// A reduction whose reduced dims all have size 1 is a reshape.
template <typename Op> struct UnitReduction : OpRewritePattern<Op> {
  UnitReduction(MLIRContext *ctx, int64_t &count)
      : OpRewritePattern<Op>(ctx), count(count) {}
  int64_t &count;

  LogicalResult matchAndRewrite(Op op,
                                PatternRewriter &rewriter) const override {
    auto in = cast<RankedTensorType>(op.getInput().getType());
    if (op.getDims().empty())
      return rewriter.notifyMatchFailure(op, "no dims (the folder's case)");
    for (int64_t d : sortedDims(op.getDims(), in.getRank()))
      if (in.getDimSize(d) != 1)
        return rewriter.notifyMatchFailure(op, "a reduced dim is not 1");
    if (op.getType() == in) {
      rewriter.replaceOp(op, op.getInput());
      ++count;
      return success();
    }
    auto r = dl::ReshapeOp::create(rewriter, op.getLoc(),
                                   cast<RankedTensorType>(op.getType()),
                                   op.getInput());
    copyMarks(op, r, /*keepId=*/true);
    rewriter.replaceOp(op, r.getResult());
    ++count;
    return success();
  }
};

/// The f32 widening of a bf16/f16 value: its source, else null.
Value widenedFrom(Value v) {
  auto c = v.getDefiningOp<dl::CastOp>();
  if (!c)
    return Value();
  auto from = cast<RankedTensorType>(c.getInput().getType());
  auto to = cast<RankedTensorType>(c.getType());
  if (!to.getElementType().isF32() ||
      !(from.getElementType().isBF16() || from.getElementType().isF16()))
    return Value();
  return c.getInput();
}

/// cross_entropy(cast(x to f32)) -> f32  ==>  cross_entropy(x) -> f32.
struct LossOfWidenedLogits : OpRewritePattern<dl::CrossEntropyOp> {
  LossOfWidenedLogits(MLIRContext *ctx, int64_t &count)
      : OpRewritePattern(ctx), count(count) {}
  int64_t &count;

  LogicalResult matchAndRewrite(dl::CrossEntropyOp op,
                                PatternRewriter &rewriter) const override {
    Value x = widenedFrom(op.getLogits());
    if (!x)
      return rewriter.notifyMatchFailure(op, "logits are not a widening cast");
    if (!cast<RankedTensorType>(op.getType()).getElementType().isF32())
      return rewriter.notifyMatchFailure(op, "the loss is not f32");
    auto ce = dl::CrossEntropyOp::create(rewriter, op.getLoc(), op.getType(),
                                         x, op.getLabels(),
                                         op.getIgnoreIndexAttr());
    copyMarks(op, ce, /*keepId=*/true);
    rewriter.replaceOp(op, ce.getResult());
    ++count;
    return success();
  }
};

/// cast(cross_entropy_grad(cast(x to f32), y, d) to type(x))
///   ==>  cross_entropy_grad(x, y, d) -> type(x).
struct GradOfWidenedLogits : OpRewritePattern<dl::CastOp> {
  GradOfWidenedLogits(MLIRContext *ctx, int64_t &count)
      : OpRewritePattern(ctx), count(count) {}
  int64_t &count;

  LogicalResult matchAndRewrite(dl::CastOp narrow,
                                PatternRewriter &rewriter) const override {
    auto g = narrow.getInput().getDefiningOp<dl::CrossEntropyGradOp>();
    if (!g || !g->hasOneUse())
      return rewriter.notifyMatchFailure(narrow, "not the one use of a "
                                                 "cross_entropy_grad");
    Value x = widenedFrom(g.getLogits());
    if (!x || x.getType() != narrow.getType())
      return rewriter.notifyMatchFailure(
          narrow, "the logits are not widened from the cast's type");
    auto ng = dl::CrossEntropyGradOp::create(
        rewriter, g.getLoc(), x.getType(), x, g.getLabels(), g.getGrad(),
        g.getIgnoreIndexAttr());
    copyMarks(g, ng, /*keepId=*/true);
    rewriter.replaceOp(narrow, ng.getResult());
    rewriter.eraseOp(g);
    ++count;
    return success();
  }
};

struct FoldLossCastsPass
    : dlopt::impl::FoldLossCastsPassBase<FoldLossCastsPass> {
  using FoldLossCastsPassBase::FoldLossCastsPassBase;

  void runOnOperation() override {
    int64_t losses = 0, grads = 0;
    RewritePatternSet patterns(&getContext());
    patterns.add<LossOfWidenedLogits>(&getContext(), losses);
    patterns.add<GradOfWidenedLogits>(&getContext(), grads);
    GreedyRewriteConfig config;
    config.enableFolding(false);
    config.setRegionSimplificationLevel(GreedySimplifyRegionLevel::Disabled);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns),
                                     config)))
      return signalPassFailure();
    numLosses += losses;
    numGrads += grads;
  }
};

struct FoldBatchReductionsPass
    : dlopt::impl::FoldBatchReductionsPassBase<FoldBatchReductionsPass> {
  using FoldBatchReductionsPassBase::FoldBatchReductionsPassBase;

  void runOnOperation() override {
    int64_t gemms = 0, units = 0;
    RewritePatternSet patterns(&getContext());
    patterns.add<BatchedMatmulSum>(&getContext(), gemms);
    patterns.add<UnitReduction<dl::SumOp>, UnitReduction<dl::MeanOp>,
                 UnitReduction<dl::MaxOp>>(&getContext(), units);
    GreedyRewriteConfig config;
    config.enableFolding(false);
    config.setRegionSimplificationLevel(GreedySimplifyRegionLevel::Disabled);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns),
                                     config)))
      return signalPassFailure();
    numGemms += gemms;
    numUnitReductions += units;
  }
};

} // namespace
