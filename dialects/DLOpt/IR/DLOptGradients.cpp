//===- DLOptGradients.cpp - Reverse-mode gradient rules of dlopt ops ------===//
//
// Each differentiable op's AutodiffOpInterface::buildGradients. Rules emit
// plain dlopt ops (or the dedicated *_grad ops where composing primitives
// would be slow or imprecise); the formulas are documented in docs/ops.md.
//
//===----------------------------------------------------------------------===//
#include "dialects/DLOpt/IR/DLOptOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/BuiltinAttributes.h"

using namespace mlir;
using namespace dlopt::dl;

#include "dialects/DLOpt/Interfaces/AutodiffOpInterface.cpp.inc"

namespace {
/// Small builder helpers shared by the rules.
struct G {
  OpBuilder &b;
  Location loc;

  RankedTensorType type(Value v) { return cast<RankedTensorType>(v.getType()); }

  /// A rank-0 constant of `like`'s element type.
  Value scalar(Value like, double v) {
    Type elem = type(like).getElementType();
    auto t = RankedTensorType::get({}, elem);
    Attribute a = isa<FloatType>(elem)
                      ? Attribute(FloatAttr::get(elem, v))
                      : Attribute(IntegerAttr::get(elem, static_cast<int64_t>(v)));
    return arith::ConstantOp::create(b, loc, t, DenseElementsAttr::get(t, a));
  }
  Value zerosLike(Type t) {
    auto rt = cast<RankedTensorType>(t);
    return arith::ConstantOp::create(
        b, loc, rt, DenseElementsAttr::get(rt, b.getZeroAttr(rt.getElementType())));
  }
  Value add(Value x, Value y) { return AddOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return SubOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return MulOp::create(b, loc, x, y); }
  Value div(Value x, Value y) { return DivOp::create(b, loc, x, y); }
  Value neg(Value x) { return NegOp::create(b, loc, x); }
  Value cmp(CmpPredicate p, Value x, Value y) {
    return CompareOp::create(b, loc, p, x, y);
  }
  Value select(Value c, Value x, Value y) {
    return SelectOp::create(b, loc, c, x, y);
  }
  Value reshape(Value x, ArrayRef<int64_t> shape) {
    auto t = RankedTensorType::get(shape, type(x).getElementType());
    if (t == x.getType())
      return x;
    return ReshapeOp::create(b, loc, t, x);
  }
  Value broadcastTo(Value x, RankedTensorType t) {
    if (x.getType() == t)
      return x;
    return BroadcastToOp::create(b, loc, t, x);
  }
  Value sum(Value x, ArrayRef<int64_t> dims, bool keepdims) {
    return SumOp::create(b, loc, x, b.getDenseI64ArrayAttr(dims), keepdims);
  }

  /// Sums a broadcast gradient back to `target`'s shape (NumPy rules).
  Value reduceTo(Value g, Type target) {
    auto t = cast<RankedTensorType>(target);
    auto gt = type(g);
    if (gt == t)
      return g;
    int64_t lead = gt.getRank() - t.getRank();
    SmallVector<int64_t> dims;
    for (int64_t d = 0; d < gt.getRank(); ++d)
      if (d < lead || (t.getDimSize(d - lead) == 1 && gt.getDimSize(d) != 1))
        dims.push_back(d);
    Value r = dims.empty() ? g : sum(g, dims, /*keepdims=*/false);
    return reshape(r, t.getShape());
  }
};

/// Result gradient #0 (rules of single-result ops).
Value dy(ArrayRef<Value> resultGrads) { return resultGrads[0]; }
} // namespace

#define RULE(OpTy)                                                             \
  LogicalResult OpTy::buildGradients(OpBuilder &builder,                       \
                                     ArrayRef<Value> resultGrads,              \
                                     SmallVectorImpl<Value> &operandGrads)

//===----------------------------------------------------------------------===//
// Elementwise unary
//===----------------------------------------------------------------------===//

RULE(NegOp) {
  G g{builder, getLoc()};
  operandGrads.assign({g.neg(dy(resultGrads))});
  return success();
}
RULE(AbsOp) {
  G g{builder, getLoc()};
  Value neg = g.cmp(CmpPredicate::lt, getInput(), g.scalar(getInput(), 0));
  operandGrads.assign({g.select(neg, g.neg(dy(resultGrads)), dy(resultGrads))});
  return success();
}
RULE(ReluOp) {
  // Reads the result, not the input: y > 0 exactly where x > 0 (NaN
  // included: relu(NaN) is NaN and neither compares greater), and y is what
  // the next layer saves anyway, so x need not outlive the forward pass.
  G g{builder, getLoc()};
  Value y = getResult();
  Value pos = g.cmp(CmpPredicate::gt, y, g.scalar(y, 0));
  operandGrads.assign({g.select(pos, dy(resultGrads), g.scalar(y, 0))});
  return success();
}
RULE(ExpOp) {
  G g{builder, getLoc()};
  operandGrads.assign({g.mul(dy(resultGrads), getResult())});
  return success();
}
RULE(LogOp) {
  G g{builder, getLoc()};
  operandGrads.assign({g.div(dy(resultGrads), getInput())});
  return success();
}
RULE(SqrtOp) {
  G g{builder, getLoc()};
  operandGrads.assign({g.div(dy(resultGrads), g.mul(getResult(), g.scalar(getResult(), 2)))});
  return success();
}
RULE(RsqrtOp) {
  // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
  G g{builder, getLoc()};
  Value y = getResult();
  Value y3 = g.mul(y, g.mul(y, y));
  operandGrads.assign({g.mul(dy(resultGrads), g.mul(y3, g.scalar(y, -0.5)))});
  return success();
}
RULE(TanhOp) {
  G g{builder, getLoc()};
  Value y = getResult();
  operandGrads.assign({g.mul(dy(resultGrads), g.sub(g.scalar(y, 1), g.mul(y, y)))});
  return success();
}
RULE(SinOp) {
  G g{builder, getLoc()};
  operandGrads.assign({g.mul(dy(resultGrads), CosOp::create(builder, getLoc(), getInput()))});
  return success();
}
RULE(CosOp) {
  G g{builder, getLoc()};
  operandGrads.assign({g.neg(g.mul(dy(resultGrads), SinOp::create(builder, getLoc(), getInput())))});
  return success();
}
RULE(SigmoidOp) {
  G g{builder, getLoc()};
  Value y = getResult();
  operandGrads.assign({g.mul(dy(resultGrads), g.mul(y, g.sub(g.scalar(y, 1), y)))});
  return success();
}
RULE(SiluOp) {
  // d/dx x s(x) = s (1 + x (1 - s))
  G g{builder, getLoc()};
  Value x = getInput();
  Value s = SigmoidOp::create(builder, getLoc(), x);
  Value one = g.scalar(x, 1);
  Value d = g.mul(s, g.add(one, g.mul(x, g.sub(one, s))));
  operandGrads.assign({g.mul(dy(resultGrads), d)});
  return success();
}
RULE(GeluOp) {
  operandGrads.assign({GeluGradOp::create(builder, getLoc(), getInput(),
                                     dy(resultGrads), getApproximateAttr())});
  return success();
}
RULE(CastOp) {
  if (!isa<FloatType>(getInput().getType().getElementType())) {
    operandGrads.assign({Value()});
    return success();
  }
  operandGrads.assign({CastOp::create(builder, getLoc(), getInput().getType(),
                                 dy(resultGrads))});
  return success();
}

//===----------------------------------------------------------------------===//
// Elementwise binary (gradients reduce back over broadcast dims)
//===----------------------------------------------------------------------===//

RULE(AddOp) {
  G g{builder, getLoc()};
  operandGrads.assign({g.reduceTo(dy(resultGrads), getLhs().getType()),
                  g.reduceTo(dy(resultGrads), getRhs().getType())});
  return success();
}
RULE(SubOp) {
  G g{builder, getLoc()};
  operandGrads.assign({g.reduceTo(dy(resultGrads), getLhs().getType()),
                  g.reduceTo(g.neg(dy(resultGrads)), getRhs().getType())});
  return success();
}
RULE(MulOp) {
  G g{builder, getLoc()};
  Value d = dy(resultGrads);
  operandGrads.assign({g.reduceTo(g.mul(d, getRhs()), getLhs().getType()),
                  g.reduceTo(g.mul(d, getLhs()), getRhs().getType())});
  return success();
}
RULE(DivOp) {
  // z = a / b: da = dy / b, db = -dy * z / b
  G g{builder, getLoc()};
  Value d = dy(resultGrads);
  Value da = g.div(d, getRhs());
  Value db = g.neg(g.div(g.mul(d, getResult()), getRhs()));
  operandGrads.assign({g.reduceTo(da, getLhs().getType()),
                  g.reduceTo(db, getRhs().getType())});
  return success();
}
/// Maximum/minimum: ties send the gradient to the left operand.
static void minMaxGrad(G &g, Value lhs, Value rhs, Value d, CmpPredicate p,
                       SmallVectorImpl<Value> &operandGrads) {
  Value pick = g.cmp(p, lhs, rhs);
  Value zero = g.scalar(d, 0);
  operandGrads.assign({g.reduceTo(g.select(pick, d, zero), lhs.getType()),
                  g.reduceTo(g.select(pick, zero, d), rhs.getType())});
}
RULE(MaximumOp) {
  G g{builder, getLoc()};
  minMaxGrad(g, getLhs(), getRhs(), dy(resultGrads), CmpPredicate::ge, operandGrads);
  return success();
}
RULE(MinimumOp) {
  G g{builder, getLoc()};
  minMaxGrad(g, getLhs(), getRhs(), dy(resultGrads), CmpPredicate::le, operandGrads);
  return success();
}
RULE(PowOp) {
  // z = a^b: da = dy * b * a^(b-1), db = dy * z * log(a)
  G g{builder, getLoc()};
  Value a = getLhs(), b = getRhs(), d = dy(resultGrads);
  Value bm1 = g.sub(b, g.scalar(b, 1));
  Value da = g.mul(d, g.mul(b, PowOp::create(builder, getLoc(), a, bm1)));
  Value db = g.mul(d, g.mul(getResult(), LogOp::create(builder, getLoc(), a)));
  operandGrads.assign({g.reduceTo(da, a.getType()), g.reduceTo(db, b.getType())});
  return success();
}
RULE(SelectOp) {
  G g{builder, getLoc()};
  Value d = dy(resultGrads);
  Value zero = g.scalar(d, 0);
  operandGrads.assign({Value(),
                  g.reduceTo(g.select(getCond(), d, zero), getTrueValue().getType()),
                  g.reduceTo(g.select(getCond(), zero, d), getFalseValue().getType())});
  return success();
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

/// The result gradient reshaped to keepdims form, then broadcast to the input.
static Value expandReduced(G &g, Value d, RankedTensorType in,
                           ArrayRef<int64_t> dims) {
  SmallVector<int64_t> keep(in.getShape());
  for (int64_t dim : dims)
    keep[normalizeDim(dim, in.getRank())] = 1;
  return g.broadcastTo(g.reshape(d, keep),
                       RankedTensorType::get(in.getShape(), g.type(d).getElementType()));
}

RULE(SumOp) {
  G g{builder, getLoc()};
  operandGrads.assign({expandReduced(g, dy(resultGrads), getInput().getType(), getDims())});
  return success();
}
RULE(MeanOp) {
  G g{builder, getLoc()};
  auto in = getInput().getType();
  int64_t count = 1;
  for (int64_t d : getDims())
    count *= in.getDimSize(normalizeDim(d, in.getRank()));
  Value d = g.div(dy(resultGrads), g.scalar(dy(resultGrads), double(count)));
  operandGrads.assign({expandReduced(g, d, in, getDims())});
  return success();
}
RULE(MaxOp) {
  // The gradient is shared evenly among the elements equal to the maximum.
  G g{builder, getLoc()};
  auto in = getInput().getType();
  Value ymax = expandReduced(g, getResult(), in, getDims());
  Value mask = g.cmp(CmpPredicate::eq, getInput(), ymax);
  Value maskF = CastOp::create(builder, getLoc(), in, mask);
  Value count = g.sum(maskF, getDims(), /*keepdims=*/true);
  Value share = g.div(expandReduced(g, dy(resultGrads), in, getDims()),
                      g.broadcastTo(count, in));
  operandGrads.assign({g.mul(share, maskF)});
  return success();
}

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

RULE(MatmulOp) {
  G g{builder, getLoc()};
  Value a = getLhs(), b = getRhs(), d = dy(resultGrads);
  bool ta = getTransposeA(), tb = getTransposeB();
  auto mm = [&](Value x, Value y, bool tx, bool ty) -> Value {
    return MatmulOp::create(builder, getLoc(), x, y, tx, ty);
  };
  Value da, db;
  if (!ta && !tb) {
    da = mm(d, b, false, true);
    db = mm(a, d, true, false);
  } else if (ta && !tb) {
    da = mm(b, d, false, true);
    db = mm(a, d, false, false);
  } else if (!ta && tb) {
    da = mm(d, b, false, false);
    db = mm(d, a, true, false);
  } else {
    da = mm(b, d, true, true);
    db = mm(d, a, true, true);
  }
  operandGrads.assign({g.reduceTo(da, a.getType()), g.reduceTo(db, b.getType())});
  return success();
}

//===----------------------------------------------------------------------===//
// Shape ops
//===----------------------------------------------------------------------===//

RULE(ReshapeOp) {
  G g{builder, getLoc()};
  operandGrads.assign({g.reshape(dy(resultGrads), getInput().getType().getShape())});
  return success();
}
RULE(TransposeOp) {
  ArrayRef<int64_t> perm = getPerm();
  SmallVector<int64_t> inverse(perm.size());
  for (auto [i, p] : llvm::enumerate(perm))
    inverse[p] = static_cast<int64_t>(i);
  operandGrads.assign({TransposeOp::create(builder, getLoc(), dy(resultGrads),
                                      builder.getDenseI64ArrayAttr(inverse))});
  return success();
}
RULE(BroadcastToOp) {
  G g{builder, getLoc()};
  operandGrads.assign({g.reduceTo(dy(resultGrads), getInput().getType())});
  return success();
}
RULE(ConcatOp) {
  auto rt = getType();
  int64_t dim = normalizeDim(getDim(), rt.getRank());
  int64_t offset = 0;
  operandGrads.clear();
  for (Value in : getInputs()) {
    auto t = cast<RankedTensorType>(in.getType());
    SmallVector<int64_t> start(rt.getRank(), 0), limit(rt.getShape()),
        stride(rt.getRank(), 1);
    start[dim] = offset;
    limit[dim] = offset + t.getDimSize(dim);
    offset = limit[dim];
    operandGrads.push_back(SliceOp::create(
        builder, getLoc(), dy(resultGrads), builder.getDenseI64ArrayAttr(start),
        builder.getDenseI64ArrayAttr(limit), builder.getDenseI64ArrayAttr(stride)));
  }
  return success();
}
RULE(SliceOp) {
  operandGrads.assign({SliceGradOp::create(builder, getLoc(), getInput().getType(),
                                      dy(resultGrads), getStartAttr(),
                                      getLimitAttr(), getStrideAttr())});
  return success();
}
RULE(GatherOp) {
  operandGrads.assign({ScatterAddOp::create(builder, getLoc(), getTable().getType(),
                                       getIds(), dy(resultGrads)),
                  Value()});
  return success();
}

//===----------------------------------------------------------------------===//
// NN ops
//===----------------------------------------------------------------------===//

RULE(SoftmaxOp) {
  operandGrads.assign({SoftmaxGradOp::create(builder, getLoc(), getResult(),
                                        dy(resultGrads), getDimAttr())});
  return success();
}
RULE(LogSoftmaxOp) {
  operandGrads.assign({LogSoftmaxGradOp::create(builder, getLoc(), getResult(),
                                           dy(resultGrads), getDimAttr())});
  return success();
}
RULE(LayerNormOp) {
  auto in = getInput().getType();
  auto stat = RankedTensorType::get(
      in.getShape().drop_front(normalizeDim(getAxis(), in.getRank())),
      in.getElementType());
  auto op = LayerNormGradOp::create(builder, getLoc(), TypeRange{in, stat, stat},
                                    getInput(), dy(resultGrads), getWeight(),
                                    getAxisAttr(), getEpsAttr());
  operandGrads.assign({op.getInputGrad()});
  if (getWeight())
    operandGrads.push_back(op.getWeightGrad());
  if (getBias())
    operandGrads.push_back(op.getBiasGrad());
  return success();
}
RULE(RMSNormOp) {
  auto in = getInput().getType();
  auto stat = RankedTensorType::get(
      in.getShape().drop_front(normalizeDim(getAxis(), in.getRank())),
      in.getElementType());
  auto op = RMSNormGradOp::create(builder, getLoc(), TypeRange{in, stat},
                                  getInput(), dy(resultGrads), getWeight(),
                                  getAxisAttr(), getEpsAttr());
  operandGrads.assign({op.getInputGrad()});
  if (getWeight())
    operandGrads.push_back(op.getWeightGrad());
  return success();
}
RULE(AttentionOp) {
  auto op = AttentionGradOp::create(
      builder, getLoc(),
      TypeRange{getQuery().getType(), getKey().getType(), getValue().getType()},
      getQuery(), getKey(), getValue(), dy(resultGrads), getQueryOffset(),
      getCausalAttr(), getScaleAttr());
  operandGrads.assign({op.getQueryGrad(), op.getKeyGrad(), op.getValueGrad()});
  return success();
}
RULE(RopeOp) {
  operandGrads.assign({RopeOp::create(builder, getLoc(), dy(resultGrads),
                                 getOffset(), getThetaAttr(),
                                 getInverse() ? UnitAttr() : builder.getUnitAttr())});
  return success();
}
RULE(Conv2DOp) {
  G g{builder, getLoc()};
  Value d = dy(resultGrads);
  operandGrads.assign({
      Conv2DGradInputOp::create(builder, getLoc(), getInput().getType(), d,
                                getFilter(), getStrideAttr(), getPaddingAttr(),
                                getDilationAttr(), getGroupsAttr()),
      Conv2DGradFilterOp::create(builder, getLoc(), getFilter().getType(),
                                 getInput(), d, getStrideAttr(), getPaddingAttr(),
                                 getDilationAttr(), getGroupsAttr())});
  if (getBias())
    operandGrads.push_back(g.sum(d, {0, 2, 3}, /*keepdims=*/false));
  return success();
}
RULE(MaxPool2DOp) {
  operandGrads.assign({MaxPool2DGradOp::create(
      builder, getLoc(), getInput().getType(), getInput(), dy(resultGrads),
      getKernelAttr(), getStrideAttr(), getPaddingAttr())});
  return success();
}
RULE(AvgPool2DOp) {
  operandGrads.assign({AvgPool2DGradOp::create(
      builder, getLoc(), getInput().getType(), dy(resultGrads), getKernelAttr(),
      getStrideAttr(), getPaddingAttr(), getCountIncludePadAttr())});
  return success();
}
RULE(BatchNormOp) {
  // Only the normalized output is differentiable; the running statistics
  // are state, not functions of the parameters being trained.
  Value d = resultGrads[0];
  if (!d) {
    operandGrads.assign(5, Value());
    return success();
  }
  auto stat = getWeight().getType();
  auto op = BatchNormGradOp::create(
      builder, getLoc(), TypeRange{getInput().getType(), stat, stat},
      getInput(), getWeight(), getRunningMean(), getRunningVar(), d,
      getEpsAttr(), getTrainingAttr());
  operandGrads.assign({op.getInputGrad(), op.getWeightGrad(), op.getBiasGrad(),
                  Value(), Value()});
  return success();
}
RULE(DropoutOp) {
  // The same seed, rate and offset give the same mask and scale; the offset
  // itself gets no gradient.
  operandGrads.assign({DropoutOp::create(builder, getLoc(), dy(resultGrads),
                                         getOffset(), getRateAttr(),
                                         getSeedAttr())});
  if (getOffset())
    operandGrads.push_back(Value());
  return success();
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

RULE(CrossEntropyOp) {
  operandGrads.assign({CrossEntropyGradOp::create(
                      builder, getLoc(), getLogits().getType(), getLogits(),
                      getLabels(), dy(resultGrads), getIgnoreIndexAttr()),
                  Value()});
  return success();
}
RULE(MSEOp) {
  // d/da mean((a-b)^2) = 2 (a-b) / N
  G g{builder, getLoc()};
  Value diff = g.sub(getLhs(), getRhs());
  double n = static_cast<double>(getLhs().getType().getNumElements());
  Value scale = g.mul(dy(resultGrads), g.scalar(diff, 2.0 / n));
  Value da = g.mul(diff, scale);
  operandGrads.assign({da, g.neg(da)});
  return success();
}
