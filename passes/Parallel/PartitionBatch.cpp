//===- PartitionBatch.cpp - Data parallelism: split the batch over dp -----===//
//
// dlopt-partition-batch rewrites a differentiated step (after dlopt-autodiff,
// before dlopt-optimizer) into the program every data-parallel rank runs:
// every dlopt.input is split on dim 0 over the mesh axis "dp", params stay
// whole, and each value is tracked as
//   R     the same on every rank,
//   S(d)  dim d split over dp (each rank holds its block),
//   P     a partial sum: the value is the sum over dp of what ranks hold.
// Ops are rewritten in place to their local types by per-op rules; a P
// value is summed (shard.all_reduce over dp) where an op needs it whole, and
// every result of the function is made R or S. Reductions over the split
// dim become P, scaled so that means divide by global counts (mean, mse:
// 1/dp; cross_entropy and its gradient: local count / global count), which
// makes the step compute exactly the single-device mean-loss gradient.
//
// An op without a rule for the shardings it meets is an error naming the op
// and the sharding; nothing is partitioned silently wrong. This is the
// batch-only first form of the partitioner (docs/parallel.md).
//
//===----------------------------------------------------------------------===//
#include "dialects/DLOpt/IR/DLOptOps.h"
#include "passes/ModelUtils.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"

#include "llvm/ADT/DenseMap.h"

namespace dlopt {
#define GEN_PASS_DEF_PARTITIONBATCHPASS
#include "passes/Passes.h.inc"
} // namespace dlopt

using namespace mlir;
using namespace dlopt;
using dl::DLOptDialect;

namespace {

/// How one value is held across the dp ranks.
struct Sh {
  enum Kind { R, S, P } kind = R;
  int64_t dim = -1; ///< for S
  static Sh rep() { return {}; }
  static Sh split(int64_t d) { return {S, d}; }
  static Sh partial() { return {P, -1}; }
  std::string str() const {
    return kind == R ? "R" : kind == P ? "P" : "S" + std::to_string(dim);
  }
};

constexpr llvm::StringLiteral kMeshName = "dlopt_mesh";

struct PartitionBatchPass
    : dlopt::impl::PartitionBatchPassBase<PartitionBatchPass> {
  using PartitionBatchPassBase::PartitionBatchPassBase;

  llvm::DenseMap<Value, Sh> sh;
  llvm::DenseMap<Value, Value> summed; ///< P value -> its all_reduce
  /// (labels, ignore_index) -> local count / global count, per function.
  std::map<std::pair<void *, int64_t>, Value> ceScale;
  func::FuncOp fn;

  Sh of(Value v) const {
    auto it = sh.find(v);
    return it == sh.end() ? Sh::rep() : it->second;
  }

  static RankedTensorType rtt(Value v) {
    return cast<RankedTensorType>(v.getType());
  }

  /// `t` with dim d divided by dp.
  RankedTensorType localType(RankedTensorType t, int64_t d) const {
    SmallVector<int64_t> s(t.getShape());
    s[d] /= dp;
    return RankedTensorType::get(s, t.getElementType());
  }

  Value scalarLike(OpBuilder &b, Location loc, Type elem, double v) {
    auto t = RankedTensorType::get({}, elem);
    return arith::ConstantOp::create(
        b, loc, t, DenseElementsAttr::get(t, b.getFloatAttr(elem, v)));
  }

  Value allReduce(OpBuilder &b, Location loc, Value v,
                  shard::ReductionKind kind) {
    auto ar = shard::AllReduceOp::create(
        b, loc, v.getType(), FlatSymbolRefAttr::get(b.getContext(), kMeshName),
        b.getDenseI16ArrayAttr({0}), v,
        shard::ReductionKindAttr::get(b.getContext(), kind));
    return ar.getResult();
  }

  /// The summed (R) form of a P value, created once right after it.
  Value materialize(Value v) {
    if (of(v).kind != Sh::P)
      return v;
    auto it = summed.find(v);
    if (it != summed.end())
      return it->second;
    OpBuilder b(fn.getContext());
    b.setInsertionPointAfterValue(v);
    Value r = allReduce(b, v.getLoc(), v, shard::ReductionKind::Sum);
    sh[r] = Sh::rep();
    summed[v] = r;
    return r;
  }

  /// Makes every P operand of `op` whole (all_reduce) first.
  void materializeOperands(Operation *op) {
    for (OpOperand &o : op->getOpOperands())
      if (of(o.get()).kind == Sh::P)
        o.set(materialize(o.get()));
  }

  InFlightDiagnostic refuse(Operation *op, const std::string &why) {
    std::string shardings;
    for (Value v : op->getOperands())
      shardings += (shardings.empty() ? "" : ", ") + of(v).str();
    return op->emitOpError()
           << "has no data-parallel rule for operand shardings (" << shardings
           << "): " << why;
  }

  /// Sets result `i` of `op` to the local type of sharding `s`.
  void setResult(Operation *op, unsigned i, Sh s) {
    Value r = op->getResult(i);
    if (s.kind == Sh::S)
      r.setType(localType(rtt(r), s.dim));
    sh[r] = s;
  }

  /// Multiplies `v` (a P scalar or tensor) by `scale` right after its op.
  void scaleAfter(Operation *op, Value v, Value scale) {
    OpBuilder b(op->getContext());
    b.setInsertionPointAfter(op);
    Value s = scale;
    if (getElementTypeOrSelf(scale.getType()) !=
        getElementTypeOrSelf(v.getType()))
      s = dl::CastOp::create(
          b, op->getLoc(),
          RankedTensorType::get({}, getElementTypeOrSelf(v.getType())), scale);
    auto mul = dl::MulOp::create(b, op->getLoc(), v, s);
    v.replaceAllUsesExcept(mul.getResult(), mul);
    sh[mul.getResult()] = sh[v];
  }

  Value constScale(Operation *op, Value like, double v) {
    OpBuilder b(op->getContext());
    b.setInsertionPoint(op);
    return scalarLike(b, op->getLoc(), getElementTypeOrSelf(like.getType()),
                      v);
  }

  /// local valid rows / max(global valid rows, 1) of a cross-entropy's
  /// labels (S0), computed once before its first user.
  Value crossEntropyScale(Operation *op, Value labels, int64_t ignore) {
    auto key = std::make_pair(labels.getAsOpaquePointer(), ignore);
    auto it = ceScale.find(key);
    if (it != ceScale.end())
      return it->second;
    OpBuilder b(op->getContext());
    b.setInsertionPointAfterValue(labels);
    Location loc = labels.getLoc();
    auto lt = rtt(labels);
    auto ignoreT = RankedTensorType::get({}, lt.getElementType());
    Value ig = arith::ConstantOp::create(
        b, loc, ignoreT,
        DenseElementsAttr::get(
            ignoreT, b.getIntegerAttr(lt.getElementType(), ignore)));
    Value valid = dl::CompareOp::create(b, loc, dl::CmpPredicate::ne, labels, ig);
    auto f32 = b.getF32Type();
    Value validF = dl::CastOp::create(
        b, loc, RankedTensorType::get(lt.getShape(), f32), valid);
    SmallVector<int64_t> all;
    for (int64_t d = 0; d < lt.getRank(); ++d)
      all.push_back(d);
    Value local = dl::SumOp::create(b, loc, validF,
                                    b.getDenseI64ArrayAttr(all), false);
    Value global = allReduce(b, loc, local, shard::ReductionKind::Sum);
    Value one = scalarLike(b, loc, f32, 1.0);
    Value denom = dl::MaximumOp::create(b, loc, global, one);
    Value scale = dl::DivOp::create(b, loc, local, denom);
    ceScale[key] = scale;
    return scale;
  }

  LogicalResult partitionOp(Operation *op);
  LogicalResult elementwise(Operation *op);
  LogicalResult reduction(Operation *op);
  LogicalResult matmul(dl::MatmulOp op);

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<func::FuncOp> entryFn = findEntryFunction(module, entry);
    if (failed(entryFn))
      return signalPassFailure();
    fn = *entryFn;
    if (dp < 1) {
      fn.emitError() << "dlopt-partition-batch: dp must be >= 1, got " << int64_t(dp);
      return signalPassFailure();
    }
    if (dp == 1)
      return;
    if (!fn->hasAttr(DLOptDialect::kLossAttr) ||
        fn->hasAttr("dlopt.train_step")) {
      fn.emitError("dlopt-partition-batch: expects a differentiated step "
                   "(after dlopt-autodiff, before dlopt-optimizer)");
      return signalPassFailure();
    }
    MLIRContext *ctx = &getContext();
    OpBuilder mb(module.getBodyRegion());
    mb.setInsertionPointToStart(module.getBody());
    if (!module.lookupSymbol(kMeshName))
      shard::GridOp::create(mb, module.getLoc(), kMeshName,
                            ArrayRef<int64_t>{dp});
    module->setAttr("dlopt.mesh",
                    DictionaryAttr::get(
                        ctx, {NamedAttribute(StringAttr::get(ctx, "axes"),
                                             ArrayAttr::get(ctx, {StringAttr::get(ctx, "dp")})),
                              NamedAttribute(StringAttr::get(ctx, "shape"),
                                             DenseI64ArrayAttr::get(ctx, {int64_t(dp)}))}));

    // Inputs: dim 0 over dp.
    Block &body = fn.getBody().front();
    for (BlockArgument arg : fn.getArguments()) {
      if (!fn.getArgAttr(arg.getArgNumber(), DLOptDialect::kInputAttr))
        continue;
      auto t = rtt(arg);
      if (t.getRank() == 0 || t.getDimSize(0) % dp) {
        fn.emitError() << "dlopt-partition-batch: input #"
                       << arg.getArgNumber() << " (" << t
                       << ") cannot be split over dp = " << int64_t(dp)
                       << ": its dim 0 must be a multiple of dp";
        return signalPassFailure();
      }
      fn.setArgAttr(arg.getArgNumber(), "dlopt.global_type", TypeAttr::get(t));
      fn.setArgAttr(arg.getArgNumber(), "dlopt.split",
                    b_splitAttr(ctx, t.getRank(), 0));
      arg.setType(localType(t, 0));
      sh[arg] = Sh::split(0);
    }

    SmallVector<Operation *> ops;
    for (Operation &op : body.without_terminator())
      ops.push_back(&op);
    for (Operation *op : ops)
      if (failed(partitionOp(op)))
        return signalPassFailure();

    // Results: P is summed; S results record their global type.
    Operation *ret = body.getTerminator();
    for (OpOperand &o : ret->getOpOperands()) {
      unsigned i = o.getOperandNumber();
      Value v = o.get();
      Type global = fn.getResultTypes()[i];
      if (of(v).kind == Sh::P)
        o.set(materialize(v));
      else if (of(v).kind == Sh::S) {
        fn.setResultAttr(i, "dlopt.global_type", TypeAttr::get(global));
        fn.setResultAttr(i, "dlopt.split",
                         b_splitAttr(ctx, rtt(v).getRank(), of(v).dim));
      }
    }
    fn.setFunctionType(FunctionType::get(ctx, body.getArgumentTypes(),
                                         ret->getOperandTypes()));
  }

  /// [[], ..., ["dp"], ...]: dim d split over dp.
  static ArrayAttr b_splitAttr(MLIRContext *ctx, int64_t rank, int64_t d) {
    SmallVector<Attribute> dims;
    for (int64_t i = 0; i < rank; ++i)
      dims.push_back(i == d ? ArrayAttr::get(ctx, {StringAttr::get(ctx, "dp")})
                            : ArrayAttr::get(ctx, {}));
    return ArrayAttr::get(ctx, dims);
  }
};

bool isElementwise(Operation *op) {
  return isa<dl::NegOp, dl::AbsOp, dl::ReluOp, dl::ExpOp, dl::LogOp,
             dl::SqrtOp, dl::RsqrtOp, dl::TanhOp, dl::SinOp, dl::CosOp,
             dl::SigmoidOp, dl::SiluOp, dl::GeluOp, dl::CastOp, dl::AddOp,
             dl::SubOp, dl::MulOp, dl::DivOp, dl::MaximumOp, dl::MinimumOp,
             dl::PowOp, dl::CompareOp, dl::SelectOp, dl::GeluGradOp>(op);
}

LogicalResult PartitionBatchPass::elementwise(Operation *op) {
  auto rt = rtt(op->getResult(0));
  int64_t rr = rt.getRank();
  // Linear in a partial operand: add/sub of partials, neg, and mul/div by
  // a whole value (the partial being the numerator).
  unsigned numP = 0;
  for (Value v : op->getOperands())
    numP += of(v).kind == Sh::P;
  bool linear = false;
  if (numP) {
    if (isa<dl::AddOp, dl::SubOp>(op))
      linear = numP == op->getNumOperands();
    else if (isa<dl::NegOp>(op))
      linear = true;
    else if (isa<dl::MulOp>(op))
      linear = numP == 1;
    else if (isa<dl::DivOp>(op))
      linear = numP == 1 && of(op->getOperand(0)).kind == Sh::P;
    if (!linear)
      materializeOperands(op);
  }
  std::optional<int64_t> split;
  for (Value v : op->getOperands()) {
    Sh s = of(v);
    if (s.kind != Sh::S)
      continue;
    int64_t d = s.dim + (rr - rtt(v).getRank());
    if (split && *split != d)
      return refuse(op, "operands are split on different dims");
    split = d;
  }
  if (split) {
    // A whole operand must broadcast along the split dim.
    for (Value v : op->getOperands()) {
      if (of(v).kind == Sh::S)
        continue;
      int64_t od = *split - (rr - rtt(v).getRank());
      if (od >= 0 && rtt(v).getDimSize(od) != 1)
        return refuse(op, "a whole operand spans the split dim " +
                              std::to_string(*split));
      if (of(v).kind == Sh::P)
        return refuse(op, "a partial operand meets a split one");
    }
    setResult(op, 0, Sh::split(*split));
    return success();
  }
  setResult(op, 0, linear ? Sh::partial() : Sh::rep());
  return success();
}

LogicalResult PartitionBatchPass::reduction(Operation *op) {
  Value x = op->getOperand(0);
  Sh s = of(x);
  auto dims = op->getAttrOfType<DenseI64ArrayAttr>("dims").asArrayRef();
  bool keep = op->hasAttr("keepdims");
  bool isMax = isa<dl::MaxOp>(op);
  if (s.kind == Sh::P) {
    if (isMax) {
      materializeOperands(op);
      setResult(op, 0, Sh::rep());
    } else {
      setResult(op, 0, Sh::partial());
    }
    return success();
  }
  if (s.kind == Sh::R) {
    setResult(op, 0, Sh::rep());
    return success();
  }
  bool reduced = llvm::is_contained(dims, s.dim);
  if (!reduced) {
    int64_t d = s.dim;
    if (!keep)
      for (int64_t r : dims)
        d -= r < s.dim;
    setResult(op, 0, Sh::split(d));
    return success();
  }
  if (isMax) {
    // The max over the split dim is the max of the ranks' maxima.
    setResult(op, 0, Sh::rep());
    OpBuilder b(op->getContext());
    b.setInsertionPointAfter(op);
    Value v = op->getResult(0);
    Value m = allReduce(b, op->getLoc(), v, shard::ReductionKind::Max);
    v.replaceAllUsesExcept(m, m.getDefiningOp());
    sh[m] = Sh::rep();
    return success();
  }
  setResult(op, 0, Sh::partial());
  if (isa<dl::MeanOp>(op)) // local mean / dp sums to the global mean
    scaleAfter(op, op->getResult(0), constScale(op, x, 1.0 / double(dp)));
  return success();
}

LogicalResult PartitionBatchPass::matmul(dl::MatmulOp op) {
  Value a = op.getLhs(), b = op.getRhs();
  Sh sa = of(a), sb = of(b);
  auto at = rtt(a), bt = rtt(b), rt = rtt(op.getResult());
  int64_t ra = at.getRank(), rb = bt.getRank(), rr = rt.getRank();
  if (sa.kind == Sh::P || sb.kind == Sh::P) {
    if (sa.kind == Sh::P && sb.kind == Sh::R) {
      setResult(op, 0, Sh::partial());
      return success();
    }
    if (sb.kind == Sh::P && sa.kind == Sh::R) {
      setResult(op, 0, Sh::partial());
      return success();
    }
    materializeOperands(op);
    sa = of(op.getLhs());
    sb = of(op.getRhs());
  }
  // Logical dims: a [.., M, K], b [.., K, N].
  int64_t aM = op.getTransposeA() ? ra - 1 : ra - 2;
  int64_t aK = op.getTransposeA() ? ra - 2 : ra - 1;
  int64_t bK = op.getTransposeB() ? rb - 1 : rb - 2;
  int64_t bN = op.getTransposeB() ? rb - 2 : rb - 1;
  if (sa.kind == Sh::S && sb.kind == Sh::S && sa.dim == aK && sb.dim == bK) {
    setResult(op, 0, Sh::partial()); // the contraction runs over the batch
    return success();
  }
  if (sa.kind == Sh::S && sb.kind == Sh::R) {
    if (sa.dim == aM) {
      setResult(op, 0, Sh::split(rr - 2));
      return success();
    }
    if (sa.dim < ra - 2) {
      // A batch dim of a; b must not span it.
      int64_t bd = sa.dim - (ra - rb);
      if (bd >= 0 && bd < rb - 2 && bt.getDimSize(bd) != 1)
        return refuse(op, "the whole right operand spans the split batch dim");
      setResult(op, 0, Sh::split(sa.dim + (rr - ra)));
      return success();
    }
  }
  if (sa.kind == Sh::S && sb.kind == Sh::S && sa.dim < ra - 2 &&
      sb.dim < rb - 2 && sa.dim + (rr - ra) == sb.dim + (rr - rb)) {
    setResult(op, 0, Sh::split(sa.dim + (rr - ra))); // the same batch dim
    return success();
  }
  if (sb.kind == Sh::S && sa.kind == Sh::R && sb.dim == bN) {
    setResult(op, 0, Sh::split(rr - 1));
    return success();
  }
  if (sa.kind == Sh::R && sb.kind == Sh::R) {
    setResult(op, 0, Sh::rep());
    return success();
  }
  return refuse(op, "split operands that are not batch rows, columns or a "
                    "shared contraction");
}

LogicalResult PartitionBatchPass::partitionOp(Operation *op) {
  if (isa<arith::ConstantOp>(op)) {
    sh[op->getResult(0)] = Sh::rep();
    return success();
  }
  if (isa<shard::AllReduceOp>(op))
    return success();
  bool anySplit = false;
  for (Value v : op->getOperands())
    anySplit |= of(v).kind != Sh::R;
  if (!anySplit) {
    for (unsigned i = 0; i < op->getNumResults(); ++i)
      sh[op->getResult(i)] = Sh::rep();
    return success();
  }
  if (isElementwise(op))
    return elementwise(op);
  if (isa<dl::SumOp, dl::MeanOp, dl::MaxOp>(op))
    return reduction(op);
  if (auto mm = dyn_cast<dl::MatmulOp>(op))
    return matmul(mm);

  // scatter_add is linear in its updates: whole ids with partial updates
  // give a partial result.
  if (isa<dl::ScatterAddOp>(op) && of(op->getOperand(0)).kind == Sh::R &&
      of(op->getOperand(1)).kind == Sh::P) {
    setResult(op, 0, Sh::partial());
    return success();
  }

  // The remaining rules need whole (not partial) operands.
  materializeOperands(op);
  auto splitOf = [&](unsigned i) { return of(op->getOperand(i)); };
  auto allSplitOn = [&](int64_t d) {
    for (Value v : op->getOperands())
      if (of(v).kind != Sh::R && !(of(v).kind == Sh::S && of(v).dim == d))
        return false;
    return true;
  };

  if (auto ce = dyn_cast<dl::CrossEntropyOp>(op)) {
    if (!allSplitOn(0) || of(ce.getLogits()).kind != Sh::S ||
        of(ce.getLabels()).kind != Sh::S)
      return refuse(op, "logits and labels must both be split on rows");
    setResult(op, 0, Sh::partial());
    scaleAfter(op, op->getResult(0),
               crossEntropyScale(op, ce.getLabels(), ce.getIgnoreIndex()));
    return success();
  }
  if (auto ceg = dyn_cast<dl::CrossEntropyGradOp>(op)) {
    if (of(op->getOperand(0)).kind != Sh::S || of(op->getOperand(0)).dim != 0 ||
        of(op->getOperand(1)).kind != Sh::S || of(op->getOperand(2)).kind != Sh::R)
      return refuse(op, "logits and labels must be split on rows and the "
                        "upstream gradient whole");
    setResult(op, 0, Sh::split(0));
    scaleAfter(op, op->getResult(0),
               crossEntropyScale(op, op->getOperand(1), ceg.getIgnoreIndex()));
    return success();
  }
  if (isa<dl::MSEOp>(op)) {
    Sh s0 = splitOf(0), s1 = splitOf(1);
    if (s0.kind != Sh::S || s1.kind != Sh::S || s0.dim != s1.dim)
      return refuse(op, "both operands must be split on the same dim");
    setResult(op, 0, Sh::partial());
    scaleAfter(op, op->getResult(0),
               constScale(op, op->getResult(0), 1.0 / double(dp)));
    return success();
  }
  if (isa<dl::SoftmaxOp, dl::LogSoftmaxOp, dl::SoftmaxGradOp,
          dl::LogSoftmaxGradOp>(op)) {
    int64_t dim = op->getAttrOfType<IntegerAttr>("dim").getInt();
    int64_t rank = rtt(op->getOperand(0)).getRank();
    if (dim < 0)
      dim += rank;
    Sh s = splitOf(0);
    if (s.kind != Sh::S || s.dim == dim || !allSplitOn(s.dim))
      return refuse(op, "the normalized dim must not be split");
    setResult(op, 0, s);
    return success();
  }
  if (isa<dl::LayerNormOp, dl::RMSNormOp, dl::LayerNormGradOp,
          dl::RMSNormGradOp>(op)) {
    int64_t rank = rtt(op->getOperand(0)).getRank();
    int64_t axis = op->getAttrOfType<IntegerAttr>("axis").getInt();
    if (axis < 0)
      axis += rank;
    Sh s = splitOf(0);
    bool gradOk = isa<dl::LayerNormGradOp, dl::RMSNormGradOp>(op)
                      ? of(op->getOperand(1)).kind == Sh::S &&
                            of(op->getOperand(1)).dim == s.dim
                      : true;
    for (unsigned i = isa<dl::LayerNormOp, dl::RMSNormOp>(op) ? 1 : 2;
         i < op->getNumOperands(); ++i)
      gradOk &= of(op->getOperand(i)).kind == Sh::R;
    if (s.kind != Sh::S || s.dim >= axis || !gradOk)
      return refuse(op, "only leading (not normalized) dims may be split, "
                        "with whole weights");
    setResult(op, 0, s);
    // Weight and bias gradients sum over the leading dims: partial.
    for (unsigned i = 1; i < op->getNumResults(); ++i)
      setResult(op, i, Sh::partial());
    return success();
  }
  if (auto tr = dyn_cast<dl::TransposeOp>(op)) {
    Sh s = splitOf(0);
    auto perm = tr.getPerm();
    for (size_t j = 0; j < perm.size(); ++j)
      if (perm[j] == s.dim) {
        setResult(op, 0, Sh::split(int64_t(j)));
        return success();
      }
    return refuse(op, "bad permutation");
  }
  if (isa<dl::ReshapeOp>(op)) {
    Sh s = splitOf(0);
    auto in = rtt(op->getOperand(0)).getShape();
    auto out = rtt(op->getResult(0)).getShape();
    // Global input dims: the operand's type is already local.
    SmallVector<int64_t> gin(in);
    gin[s.dim] *= dp;
    int64_t prefix = 1;
    for (int64_t d = 0; d < s.dim; ++d)
      prefix *= gin[d];
    int64_t p2 = 1;
    for (size_t j = 0; j < out.size(); ++j) {
      if (p2 == prefix && out[j] % dp == 0 && gin[s.dim] % dp == 0 &&
          (out[j] % gin[s.dim] == 0 || gin[s.dim] % out[j] == 0)) {
        setResult(op, 0, Sh::split(int64_t(j)));
        return success();
      }
      p2 *= out[j];
    }
    return refuse(op, "the reshape moves the split dim across blocks");
  }
  if (isa<dl::GatherOp>(op)) {
    // table (whole) and ids split on d: rows of the result follow the ids.
    Sh t = splitOf(0), ids = splitOf(1);
    if (t.kind != Sh::R || ids.kind != Sh::S)
      return refuse(op, "the table must be whole and the ids split");
    setResult(op, 0, ids);
    return success();
  }
  if (isa<dl::ScatterAddOp>(op)) {
    Sh ids = splitOf(0), upd = splitOf(1);
    if (ids.kind != Sh::S || upd.kind != Sh::S || ids.dim != upd.dim)
      return refuse(op, "ids and updates must be split alike");
    setResult(op, 0, Sh::partial()); // each rank adds its rows' updates
    return success();
  }
  if (isa<dl::AttentionOp, dl::AttentionGradOp>(op)) {
    if (!allSplitOn(0))
      return refuse(op, "only the batch dim (0) of q, k and v may be split");
    for (unsigned i = 0; i < op->getNumResults(); ++i)
      setResult(op, i, Sh::split(0));
    return success();
  }
  // Convolutions and pools: the batch (dim 0) may be split; the filter
  // gradient sums over it.
  if (isa<dl::Conv2DOp, dl::MaxPool2DOp, dl::AvgPool2DOp,
          dl::Conv2DGradInputOp, dl::MaxPool2DGradOp, dl::AvgPool2DGradOp>(
          op)) {
    Sh s = splitOf(0);
    bool ok = s.kind == Sh::S && s.dim == 0;
    for (unsigned i = 1; i < op->getNumOperands(); ++i) {
      Sh o = splitOf(i);
      bool batchOperand = isa<dl::MaxPool2DGradOp>(op); // (x, dy)
      ok &= batchOperand ? o.kind == Sh::S && o.dim == 0 : o.kind == Sh::R;
    }
    if (!ok)
      return refuse(op, "only the batch dim (0) of the activations may be "
                        "split, with whole filters and biases");
    setResult(op, 0, Sh::split(0));
    return success();
  }
  if (isa<dl::Conv2DGradFilterOp>(op)) {
    if (!allSplitOn(0) || splitOf(0).kind != Sh::S || splitOf(1).kind != Sh::S)
      return refuse(op, "x and dy must both be split on the batch");
    setResult(op, 0, Sh::partial());
    return success();
  }
  if (isa<dl::RopeOp>(op)) {
    if (!allSplitOn(0))
      return refuse(op, "only the batch dim (0) may be split (positions run "
                        "along the sequence)");
    setResult(op, 0, Sh::split(0));
    return success();
  }
  return refuse(op, "not supported by the batch partitioner yet");
}

} // namespace
