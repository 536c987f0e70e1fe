//===- Partition.cpp - Apply a plan's shardings to a training step --------===//
//
// dlopt-partition rewrites a differentiated step (after dlopt-autodiff,
// before dlopt-optimizer) into the program every rank of a device mesh runs
// (docs/parallel.md). The mesh (`axes`, `sizes`: dp, cp, tp, ...) becomes a
// `shard.grid @dlopt_mesh`; arguments carry the plan's shardings as
// `dlopt.sharding` (per dim, the mesh axes it is split over, major first);
// an input without one is split on dim 0 over dp.
//
// The step is partitioned one mesh axis at a time, in mesh order. Along one
// axis every value is
//   R     the same on every rank of the axis,
//   S(d)  dim d split over the axis (each rank holds its block),
//   P     a partial sum: the value is the sum over the axis of the ranks'.
// The states of different axes are independent, so partitioning axis by
// axis composes: the second axis sees the first's local program as a
// single-device one (its collectives are linear ops to it), and a dim split
// over two axes is split major-first in mesh order.
//
// Ops are rewritten in place to their local types by per-op rules, and
// collectives are inserted where a rule needs another form:
//   P -> R  shard.all_reduce        S(d) -> R  shard.all_gather
//   P -> S  shard.reduce_scatter    R -> S(d)  shard.all_slice (no traffic)
// so that, e.g., a column-parallel matmul (weight split on N) followed by a
// row-parallel one (weight split on K) gives a partial sum that is reduced
// once (Megatron), and cross-entropy over logits split on the classes runs
// vocabulary-parallel. Reductions over a split dim become P, with means
// scaled so that they divide by global counts. Every gradient result leaves
// with its parameter's sharding; other results are made R or S.
//
// An op without a rule for the shardings it meets is an error naming the
// op, the axis and the shardings; nothing is partitioned silently wrong,
// and every local type is checked by the ops' verifiers afterwards.
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
#include "llvm/ADT/StringMap.h"

#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <optional>

namespace dlopt {
#define GEN_PASS_DEF_PARTITIONPASS
#include "passes/Passes.h.inc"
} // namespace dlopt

using namespace mlir;
using namespace dlopt;
using dl::DLOptDialect;

namespace {

/// How one value is held across the ranks of one mesh axis.
struct Sh {
  enum Kind { R, S, P } kind = R;
  int64_t dim = -1; ///< for S
  static Sh rep() { return {}; }
  static Sh split(int64_t d) { return {S, d}; }
  static Sh partial() { return {P, -1}; }
  bool isS() const { return kind == S; }
  bool isP() const { return kind == P; }
  bool isR() const { return kind == R; }
  bool operator==(const Sh &o) const { return kind == o.kind && dim == o.dim; }
  std::string str() const {
    return kind == R ? "R" : kind == P ? "P" : "S" + std::to_string(dim);
  }
};

constexpr llvm::StringLiteral kMeshName = "dlopt_mesh";
constexpr llvm::StringLiteral kShardingAttr = "dlopt.sharding";
constexpr llvm::StringLiteral kGlobalTypeAttr = "dlopt.global_type";
constexpr llvm::StringLiteral kSplitAttr = "dlopt.split";

RankedTensorType rtt(Value v) { return cast<RankedTensorType>(v.getType()); }

bool isElementwise(Operation *op) {
  return isa<dl::NegOp, dl::AbsOp, dl::ReluOp, dl::ExpOp, dl::LogOp,
             dl::SqrtOp, dl::RsqrtOp, dl::TanhOp, dl::SinOp, dl::CosOp,
             dl::SigmoidOp, dl::SiluOp, dl::GeluOp, dl::CastOp, dl::AddOp,
             dl::SubOp, dl::MulOp, dl::DivOp, dl::MaximumOp, dl::MinimumOp,
             dl::PowOp, dl::CompareOp, dl::SelectOp, dl::GeluGradOp>(op);
}

/// The dim of sharding `s` (an ArrayAttr of per-dim axis lists) split over
/// `axis`, or -1.
int64_t dimOfAxis(ArrayAttr s, StringRef axis) {
  if (!s)
    return -1;
  for (auto [d, list] : llvm::enumerate(s))
    for (Attribute a : cast<ArrayAttr>(list))
      if (cast<StringAttr>(a).getValue() == axis)
        return int64_t(d);
  return -1;
}

/// Partitions the function along one mesh axis.
class AxisPartitioner {
public:
  AxisPartitioner(func::FuncOp fn, StringRef axis, int16_t gridAxis, int64_t n)
      : fn(fn), axis(axis), gridAxis(gridAxis), n(n) {}

  LogicalResult run();

private:
  func::FuncOp fn;
  StringRef axis;
  int16_t gridAxis;
  int64_t n;

  llvm::DenseMap<Value, Sh> sh;
  llvm::DenseMap<Value, Value> summed;   ///< P value -> its all_reduce
  llvm::DenseMap<Value, Value> gathered; ///< S value -> its all_gather
  std::map<std::pair<void *, int64_t>, Value> sliced; ///< (R value, dim)
  std::map<std::pair<void *, int64_t>, Value> scattered; ///< (P value, dim)
  /// (labels, ignore_index) -> local count / global count.
  std::map<std::pair<void *, int64_t>, Value> ceScale;
  /// logits split on the classes -> (row max, logsumexp), both [N, 1].
  llvm::DenseMap<Value, std::pair<Value, Value>> lseOf;
  llvm::DenseMap<Type, Value> classIdsOf; ///< [C] type -> local block
  SmallVector<Operation *> dead;

  Sh of(Value v) const {
    auto it = sh.find(v);
    return it == sh.end() ? Sh::rep() : it->second;
  }

  RankedTensorType localType(RankedTensorType t, int64_t d) const {
    SmallVector<int64_t> s(t.getShape());
    s[d] /= n;
    return RankedTensorType::get(s, t.getElementType());
  }
  RankedTensorType gatheredType(RankedTensorType t, int64_t d) const {
    SmallVector<int64_t> s(t.getShape());
    s[d] *= n;
    return RankedTensorType::get(s, t.getElementType());
  }

  FlatSymbolRefAttr grid() {
    return FlatSymbolRefAttr::get(fn.getContext(), kMeshName);
  }
  DenseI16ArrayAttr gridAxes(OpBuilder &b) const {
    return b.getDenseI16ArrayAttr({gridAxis});
  }

  Value scalarLike(OpBuilder &b, Location loc, Type elem, double v) {
    auto t = RankedTensorType::get({}, elem);
    Attribute a = isa<FloatType>(elem) ? Attribute(b.getFloatAttr(elem, v))
                                       : Attribute(b.getIntegerAttr(elem, int64_t(v)));
    return arith::ConstantOp::create(b, loc, t, DenseElementsAttr::get(t, a));
  }

  Value allReduce(OpBuilder &b, Location loc, Value v,
                  shard::ReductionKind kind) {
    Value r = shard::AllReduceOp::create(
                  b, loc, v.getType(), grid(), gridAxes(b), v,
                  shard::ReductionKindAttr::get(b.getContext(), kind))
                  .getResult();
    sh[r] = Sh::rep();
    return r;
  }

  /// The summed (R) form of a P value, created once right after it.
  Value materialize(Value v) {
    if (!of(v).isP())
      return v;
    auto it = summed.find(v);
    if (it != summed.end())
      return it->second;
    OpBuilder b(fn.getContext());
    b.setInsertionPointAfterValue(v);
    Value r = allReduce(b, v.getLoc(), v, shard::ReductionKind::Sum);
    summed[v] = r;
    return r;
  }

  /// The whole (R) form of a value: P summed, S gathered.
  Value whole(Value v) {
    Sh s = of(v);
    if (s.isP())
      return materialize(v);
    if (!s.isS())
      return v;
    auto it = gathered.find(v);
    if (it != gathered.end())
      return it->second;
    OpBuilder b(fn.getContext());
    b.setInsertionPointAfterValue(v);
    Value g = shard::AllGatherOp::create(b, v.getLoc(),
                                         gatheredType(rtt(v), s.dim), grid(),
                                         gridAxes(b), v, b.getIndexAttr(s.dim))
                  .getResult();
    sh[g] = Sh::rep();
    gathered[v] = g;
    return g;
  }

  /// The form of `v` split on dim `d`: R sliced (no traffic), P
  /// reduce-scattered, S on another dim gathered then sliced.
  Value toSplit(Value v, int64_t d) {
    Sh s = of(v);
    if (s.isS() && s.dim == d)
      return v;
    if (s.isS())
      v = whole(v), s = Sh::rep();
    auto key = std::make_pair(v.getAsOpaquePointer(), d);
    auto &cache = s.isP() ? scattered : sliced;
    auto it = cache.find(key);
    if (it != cache.end())
      return it->second;
    OpBuilder b(fn.getContext());
    b.setInsertionPointAfterValue(v);
    Value r;
    if (s.isP())
      r = shard::ReduceScatterOp::create(
              b, v.getLoc(), localType(rtt(v), d), grid(), gridAxes(b), v,
              shard::ReductionKindAttr::get(b.getContext(),
                                            shard::ReductionKind::Sum),
              b.getIndexAttr(d))
              .getResult();
    else
      r = shard::AllSliceOp::create(b, v.getLoc(), localType(rtt(v), d),
                                    grid(), gridAxes(b), v, b.getIndexAttr(d))
              .getResult();
    sh[r] = Sh::split(d);
    cache[key] = r;
    return r;
  }

  /// Brings `v` to sharding `want`.
  Value reshard(Value v, Sh want) {
    if (want.isS())
      return toSplit(v, want.dim);
    if (want.isR())
      return whole(v);
    return v; // P is only ever produced by rules
  }

  /// Makes every P operand of `op` whole (all_reduce) first.
  void materializeOperands(Operation *op) {
    for (OpOperand &o : op->getOpOperands())
      if (of(o.get()).isP())
        o.set(materialize(o.get()));
  }
  /// Makes every operand of `op` whole.
  void wholeOperands(Operation *op) {
    for (OpOperand &o : op->getOpOperands())
      if (!of(o.get()).isR())
        o.set(whole(o.get()));
  }

  std::string operandShardings(Operation *op) const {
    std::string s;
    for (Value v : op->getOperands())
      s += (s.empty() ? "" : ", ") + of(v).str();
    return s;
  }
  InFlightDiagnostic refuse(Operation *op, const std::string &why) {
    return op->emitOpError()
           << "has no rule for operand shardings (" << operandShardings(op)
           << ") over mesh axis '" << axis << "' (" << n
           << " ranks): " << why;
  }

  /// Sets result `i` of `op` to the local type of sharding `s`.
  void setResult(Operation *op, unsigned i, Sh s) {
    Value r = op->getResult(i);
    if (s.isS())
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

  Value crossEntropyScale(Operation *op, Value labels, int64_t ignore);
  /// This rank's block of 0..C-1 (C = n * local classes) along the axis, as
  /// a [Cl] tensor of `elem`.
  Value localClassIds(Operation *op, int64_t classesLocal, Type elem);
  std::pair<Value, Value> splitLogSumExp(Operation *op, Value logits);
  LogicalResult vocabCrossEntropy(Operation *op);
  LogicalResult maskedGather(dl::GatherOp op);
  /// The gradient of a lookup in a table split on its rows: each rank adds
  /// the updates of the ids in its block into its rows (no [V, H] table is
  /// built whole, nothing is reduced).
  LogicalResult maskedScatter(dl::ScatterAddOp op);
  /// This rank's first row of a table of `rowsLocal` rows per rank, as a
  /// scalar of `ie`, created before `op`.
  Value firstRow(Operation *op, int64_t rowsLocal, Type ie);
  /// Forward ops by stable id (dlopt.id), for backward ops' dlopt.fwd_id.
  llvm::DenseMap<int64_t, Operation *> forwardOps;
  /// Batch statistics over the whole batch of x [N, C, ...] split on N:
  /// (mean, biased variance), both [C] and R, and the global count.
  std::tuple<Value, Value, double> batchStats(Operation *op, Value x);
  LogicalResult syncedBatchNorm(Operation *op);
  llvm::DenseMap<Value, std::tuple<Value, Value, double>> statsOf;

  /// The plan's sharding (a {split, partial} dictionary) along this axis:
  /// S(d), R, or P; nullopt without one.
  std::optional<Sh> planned(Attribute a) const {
    auto d = dyn_cast_or_null<DictionaryAttr>(a);
    if (!d)
      return std::nullopt;
    for (Attribute p : cast<ArrayAttr>(d.get("partial")))
      if (cast<StringAttr>(p).getValue() == axis)
        return Sh::partial();
    int64_t dim = dimOfAxis(cast<ArrayAttr>(d.get("split")), axis);
    return dim >= 0 ? Sh::split(dim) : Sh::rep();
  }
  /// Brings the operands of a planned (forward) op to the shardings the
  /// plan requires of them (a sequence-parallel input gathered before a
  /// column-parallel matmul, a row-parallel partial sum reduce-scattered
  /// into a sequence-parallel region). Partial requirements are left to
  /// the rules.
  void planOperands(Operation *op);
  /// Reshards the results of a planned op that the plan wants split.
  void planResults(Operation *op);
  LogicalResult seedArguments();
  LogicalResult finishResults();
  LogicalResult partitionOp(Operation *op);
  LogicalResult applyRule(Operation *op);
  LogicalResult elementwise(Operation *op);
  LogicalResult reduction(Operation *op);
  LogicalResult matmul(dl::MatmulOp op);
  /// Aligns the "row" operands `idx` of `op` on dim `d` (the others must be
  /// R); P and R operands are split, S on another dim resharded.
  void alignOn(Operation *op, ArrayRef<unsigned> idx, int64_t d) {
    for (unsigned i : idx) {
      OpOperand &o = op->getOpOperand(i);
      if (!(of(o.get()).isS() && of(o.get()).dim == d))
        o.set(toSplit(o.get(), d));
    }
  }
};

/// Appends `axis` to dim `d`'s list of a `dlopt.split` attribute (created
/// all-empty for a tensor of `rank`).
ArrayAttr appendSplit(MLIRContext *ctx, ArrayAttr split, int64_t rank,
                      int64_t d, StringRef axis) {
  SmallVector<Attribute> dims;
  for (int64_t i = 0; i < rank; ++i) {
    SmallVector<Attribute> list;
    if (split)
      llvm::append_range(list, cast<ArrayAttr>(split[i]).getValue());
    if (i == d)
      list.push_back(StringAttr::get(ctx, axis));
    dims.push_back(ArrayAttr::get(ctx, list));
  }
  return ArrayAttr::get(ctx, dims);
}

LogicalResult AxisPartitioner::seedArguments() {
  MLIRContext *ctx = fn.getContext();
  for (BlockArgument arg : fn.getArguments()) {
    unsigned i = arg.getArgNumber();
    auto t = rtt(arg);
    int64_t d = -1;
    if (auto s = fn.getArgAttrOfType<ArrayAttr>(i, kShardingAttr))
      d = dimOfAxis(s, axis);
    else if (fn.getArgAttr(i, DLOptDialect::kInputAttr) && axis == "dp")
      d = t.getRank() ? 0 : -1;
    if (d < 0)
      continue;
    if (t.getDimSize(d) % n) {
      fn.emitError() << "dlopt-partition: argument #" << i << " ("
                     << t << ") cannot be split over " << axis << " = " << n
                     << ": its dim " << d << " (" << t.getDimSize(d)
                     << " here) must be a multiple of " << n;
      return failure();
    }
    if (!fn.getArgAttr(i, kGlobalTypeAttr))
      fn.setArgAttr(i, kGlobalTypeAttr, TypeAttr::get(t));
    fn.setArgAttr(i, kSplitAttr,
                  appendSplit(ctx, fn.getArgAttrOfType<ArrayAttr>(i, kSplitAttr),
                              t.getRank(), d, axis));
    arg.setType(localType(t, d));
    sh[arg] = Sh::split(d);
  }
  return success();
}

LogicalResult AxisPartitioner::finishResults() {
  MLIRContext *ctx = fn.getContext();
  Block &body = fn.getBody().front();
  Operation *ret = body.getTerminator();
  llvm::StringMap<Sh> paramSh;
  for (BlockArgument arg : fn.getArguments())
    if (auto p = fn.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                 DLOptDialect::kParamAttr))
      paramSh[p.getValue()] = of(arg);
  for (OpOperand &o : ret->getOpOperands()) {
    unsigned i = o.getOperandNumber();
    Value v = o.get();
    // A gradient leaves with its parameter's sharding, the rest R or S.
    Sh want = of(v).isP() ? Sh::rep() : of(v);
    if (auto g = fn.getResultAttrOfType<StringAttr>(i, DLOptDialect::kGradAttr)) {
      auto it = paramSh.find(g.getValue());
      if (it != paramSh.end())
        want = it->second;
    }
    int64_t rank = rtt(v).getRank();
    v = reshard(v, want);
    o.set(v);
    if (want.isS()) {
      if (!fn.getResultAttr(i, kGlobalTypeAttr))
        fn.setResultAttr(i, kGlobalTypeAttr,
                         TypeAttr::get(fn.getResultTypes()[i]));
      fn.setResultAttr(
          i, kSplitAttr,
          appendSplit(ctx, fn.getResultAttrOfType<ArrayAttr>(i, kSplitAttr),
                      rank, want.dim, axis));
    }
  }
  fn.setFunctionType(FunctionType::get(ctx, body.getArgumentTypes(),
                                       ret->getOperandTypes()));
  return success();
}

void AxisPartitioner::planOperands(Operation *op) {
  auto plan = op->getAttrOfType<DictionaryAttr>("dlopt.plan");
  if (!plan)
    return;
  auto want = cast<ArrayAttr>(plan.get("operands"));
  if (want.size() != op->getNumOperands())
    return;
  for (OpOperand &o : op->getOpOperands()) {
    std::optional<Sh> w = planned(want[o.getOperandNumber()]);
    auto t = dyn_cast<RankedTensorType>(o.get().getType());
    if (!w || w->isP() || !t ||
        int64_t(cast<ArrayAttr>(cast<DictionaryAttr>(want[o.getOperandNumber()])
                                    .get("split"))
                    .size()) != t.getRank())
      continue;
    if (w->isS() && t.getDimSize(w->dim) % n)
      continue;
    Sh now = of(o.get());
    if (now == *w)
      continue;
    Value v = o.get(), r = reshard(v, *w);
    if (now.isP()) {
      // A partial sum is reduced once, in the form the plan asks for;
      // every later use (a backward op saving it) takes that form.
      v.replaceUsesWithIf(r, [&](OpOperand &u) {
        return u.getOwner() != r.getDefiningOp() &&
               !isa<shard::AllReduceOp, shard::ReduceScatterOp>(u.getOwner());
      });
    }
    o.set(r);
  }
}

void AxisPartitioner::planResults(Operation *op) {
  auto plan = op->getAttrOfType<DictionaryAttr>("dlopt.plan");
  if (!plan || llvm::is_contained(dead, op))
    return;
  auto want = cast<ArrayAttr>(plan.get("results"));
  if (want.size() != op->getNumResults())
    return;
  for (OpResult r : op->getResults()) {
    std::optional<Sh> w = planned(want[r.getResultNumber()]);
    auto t = dyn_cast<RankedTensorType>(r.getType());
    if (!w || !w->isS() || !t ||
        int64_t(cast<ArrayAttr>(cast<DictionaryAttr>(want[r.getResultNumber()])
                                    .get("split"))
                    .size()) != t.getRank())
      continue;
    Sh now = of(r);
    if (now == *w || (now.isR() && t.getDimSize(w->dim) % n) ||
        (now.isP() && t.getDimSize(w->dim) % n))
      continue;
    SmallVector<OpOperand *> uses;
    for (OpOperand &u : r.getUses())
      uses.push_back(&u);
    Value v = reshard(r, *w);
    for (OpOperand *u : uses)
      u->set(v);
  }
}

LogicalResult AxisPartitioner::run() {
  if (failed(seedArguments()))
    return failure();
  Block &body = fn.getBody().front();
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator()) {
    ops.push_back(&op);
    if (auto id = op.getAttrOfType<IntegerAttr>(DLOptDialect::kIdAttr))
      forwardOps[id.getInt()] = &op;
  }
  llvm::DenseSet<Operation *> original(ops.begin(), ops.end());
  for (Operation *op : ops) {
    Operation *prev = op->getPrevNode(), *next = op->getNextNode();
    if (failed(partitionOp(op)))
      return failure();
    // Ops a rule creates around `op` (a dropout's mask and product, a
    // decomposed loss) belong to its layer and pass, like `op`: the
    // recomputation pass finds a layer's forward by those marks.
    for (Operation *n = prev ? prev->getNextNode() : &body.front();
         n && n != next && n != body.getTerminator(); n = n->getNextNode()) {
      if (original.contains(n))
        continue;
      for (StringRef mark : {DLOptDialect::kLayerAttr, DLOptDialect::kBackwardAttr})
        if (Attribute a = op->getAttr(mark); a && !n->hasAttr(mark))
          n->setAttr(mark, a);
    }
  }
  if (failed(finishResults()))
    return failure();
  for (Operation *op : llvm::reverse(dead))
    op->erase();
  return success();
}

Value AxisPartitioner::crossEntropyScale(Operation *op, Value labels,
                                         int64_t ignore) {
  auto key = std::make_pair(labels.getAsOpaquePointer(), ignore);
  auto it = ceScale.find(key);
  if (it != ceScale.end())
    return it->second;
  OpBuilder b(op->getContext());
  b.setInsertionPointAfterValue(labels);
  Location loc = labels.getLoc();
  auto lt = rtt(labels);
  Value ig = scalarLike(b, loc, lt.getElementType(), double(ignore));
  Value valid = dl::CompareOp::create(b, loc, dl::CmpPredicate::ne, labels, ig);
  auto f32 = b.getF32Type();
  Value validF = dl::CastOp::create(
      b, loc, RankedTensorType::get(lt.getShape(), f32), valid);
  SmallVector<int64_t> all;
  for (int64_t d = 0; d < lt.getRank(); ++d)
    all.push_back(d);
  Value local = dl::SumOp::create(b, loc, validF, b.getDenseI64ArrayAttr(all),
                                  false);
  Value global = allReduce(b, loc, local, shard::ReductionKind::Sum);
  Value one = scalarLike(b, loc, f32, 1.0);
  Value denom = dl::MaximumOp::create(b, loc, global, one);
  Value scale = dl::DivOp::create(b, loc, local, denom);
  ceScale[key] = scale;
  return scale;
}

Value AxisPartitioner::localClassIds(Operation *op, int64_t classesLocal,
                                     Type elem) {
  auto all = RankedTensorType::get({classesLocal * n}, elem);
  auto it = classIdsOf.find(all);
  if (it != classIdsOf.end())
    return it->second;
  OpBuilder b(op->getContext());
  b.setInsertionPointToStart(&fn.getBody().front());
  Value iota = dl::IotaOp::create(b, fn.getLoc(), all, b.getI64IntegerAttr(0));
  sh[iota] = Sh::rep();
  return classIdsOf[all] = toSplit(iota, 0);
}

/// The row max and logsumexp ([N, 1], R) of logits [N, C] split on C.
std::pair<Value, Value> AxisPartitioner::splitLogSumExp(Operation *op,
                                                        Value logits) {
  auto it = lseOf.find(logits);
  if (it != lseOf.end())
    return it->second;
  OpBuilder b(op->getContext());
  b.setInsertionPointAfterValue(logits);
  Location loc = logits.getLoc();
  auto one = b.getDenseI64ArrayAttr({1});
  Value mLocal = dl::MaxOp::create(b, loc, logits, one, true);
  Value m = allReduce(b, loc, mLocal, shard::ReductionKind::Max);
  Value z = dl::SubOp::create(b, loc, logits, m);
  Value e = dl::ExpOp::create(b, loc, z);
  Value sLocal = dl::SumOp::create(b, loc, e, one, true);
  Value s = allReduce(b, loc, sLocal, shard::ReductionKind::Sum);
  Value lse = dl::AddOp::create(b, loc, dl::LogOp::create(b, loc, s), m);
  sh[lse] = Sh::rep();
  lseOf[logits] = {m, lse};
  return {m, lse};
}

/// cross_entropy / cross_entropy_grad with logits [N, C] split on C (a
/// vocabulary-parallel LM head), labels whole: the row max, the sum of
/// exponentials and the target logit are reduced over the axis, so no rank
/// ever holds a whole row of logits.
LogicalResult AxisPartitioner::vocabCrossEntropy(Operation *op) {
  Value logits = op->getOperand(0), labels = op->getOperand(1);
  if (!of(labels).isR() || (op->getNumOperands() > 2 && !of(op->getOperand(2)).isR()))
    return refuse(op, "with logits split on the classes, the labels and the "
                      "upstream gradient must be whole");
  int64_t ignore = op->getAttrOfType<IntegerAttr>("ignore_index").getInt();
  auto [m, lse] = splitLogSumExp(op, logits);
  (void)m;
  OpBuilder b(op);
  Location loc = op->getLoc();
  auto lt = rtt(logits);
  Type elem = lt.getElementType();
  int64_t rows = lt.getDimSize(0), cls = lt.getDimSize(1);
  auto labT = rtt(labels);
  Type labElem = labT.getElementType();
  Value ids = localClassIds(op, cls, labElem);
  Value lab2 = dl::ReshapeOp::create(
      b, loc, RankedTensorType::get({rows, 1}, labElem), labels);
  Value hit = dl::CompareOp::create(b, loc, dl::CmpPredicate::eq, ids, lab2);
  Value ig = scalarLike(b, loc, labElem, double(ignore));
  Value valid = dl::CompareOp::create(b, loc, dl::CmpPredicate::ne, labels, ig);
  Value validF = dl::CastOp::create(
      b, loc, RankedTensorType::get({rows}, elem), valid);
  Value count = dl::MaximumOp::create(
      b, loc,
      dl::SumOp::create(b, loc, validF, b.getDenseI64ArrayAttr({0}), false),
      scalarLike(b, loc, elem, 1.0));
  Value zero = scalarLike(b, loc, elem, 0.0);
  Value result;
  if (isa<dl::CrossEntropyOp>(op)) {
    Value picked = dl::SumOp::create(
        b, loc, dl::SelectOp::create(b, loc, hit, logits, zero),
        b.getDenseI64ArrayAttr({1}), true);
    picked = allReduce(b, loc, picked, shard::ReductionKind::Sum);
    Value rowLoss = dl::ReshapeOp::create(
        b, loc, RankedTensorType::get({rows}, elem),
        dl::SubOp::create(b, loc, lse, picked));
    // Ignored rows may hold anything finite or not: select, not multiply.
    rowLoss = dl::SelectOp::create(b, loc, valid, rowLoss, zero);
    Value total =
        dl::SumOp::create(b, loc, rowLoss, b.getDenseI64ArrayAttr({0}), false);
    result = dl::DivOp::create(b, loc, total, count);
    // An f32 loss of bf16/f16 logits (cross_entropy allows it).
    if (result.getType() != op->getResult(0).getType())
      result = dl::CastOp::create(b, loc, op->getResult(0).getType(), result);
    sh[result] = Sh::rep();
  } else {
    Value dy = op->getOperand(2);
    Value p = dl::ExpOp::create(b, loc, dl::SubOp::create(b, loc, logits, lse));
    Value hitF = dl::CastOp::create(b, loc, rtt(p).clone(elem), hit);
    Value g = dl::SubOp::create(b, loc, p, hitF);
    Value valid2 = dl::ReshapeOp::create(
        b, loc, RankedTensorType::get({rows, 1}, b.getI1Type()), valid);
    g = dl::SelectOp::create(b, loc, valid2, g, zero);
    Value dyE = dy;
    if (getElementTypeOrSelf(dy.getType()) != elem)
      dyE = dl::CastOp::create(b, loc, RankedTensorType::get({}, elem), dy);
    result = dl::MulOp::create(b, loc, g, dl::DivOp::create(b, loc, dyE, count));
    sh[result] = Sh::split(1);
  }
  op->getResult(0).replaceAllUsesWith(result);
  dead.push_back(op);
  return success();
}

Value AxisPartitioner::firstRow(Operation *op, int64_t rowsLocal, Type ie) {
  OpBuilder b(op);
  Location loc = op->getLoc();
  SmallVector<Attribute> starts;
  for (int64_t r = 0; r < n; ++r)
    starts.push_back(b.getIntegerAttr(ie, r * rowsLocal));
  auto st = RankedTensorType::get({n}, ie);
  Value all = arith::ConstantOp::create(b, loc, st,
                                        DenseElementsAttr::get(st, starts));
  sh[all] = Sh::rep();
  Value mine = toSplit(all, 0);
  b.setInsertionPoint(op);
  return dl::ReshapeOp::create(b, loc, RankedTensorType::get({}, ie), mine);
}

LogicalResult AxisPartitioner::maskedScatter(dl::ScatterAddOp op) {
  op->getOpOperand(0).set(whole(op.getIds()));
  op->getOpOperand(1).set(whole(op.getUpdates()));
  Value ids = op.getIds(), upd = op.getUpdates();
  auto it = rtt(ids);
  Type ie = it.getElementType();
  auto rt = rtt(op.getResult());
  int64_t rowsLocal = rt.getDimSize(0) / n;
  Value base = firstRow(op, rowsLocal, ie);
  OpBuilder b(op);
  Location loc = op->getLoc();
  Value local = dl::SubOp::create(b, loc, ids, base);
  Value clamped = dl::MinimumOp::create(
      b, loc, dl::MaximumOp::create(b, loc, local, scalarLike(b, loc, ie, 0)),
      scalarLike(b, loc, ie, double(rowsLocal - 1)));
  Value in = dl::CompareOp::create(b, loc, dl::CmpPredicate::eq, clamped, local);
  SmallVector<int64_t> maskShape(it.getShape());
  maskShape.append(size_t(rtt(upd).getRank() - it.getRank()), 1);
  Value mask = dl::ReshapeOp::create(
      b, loc, RankedTensorType::get(maskShape, b.getI1Type()), in);
  Value masked = dl::SelectOp::create(
      b, loc, mask, upd, scalarLike(b, loc, rtt(upd).getElementType(), 0.0));
  op->getOpOperand(0).set(clamped);
  op->getOpOperand(1).set(masked);
  setResult(op, 0, Sh::split(0));
  return success();
}

/// An embedding lookup in a table split on its rows (vocabulary-parallel):
/// each rank looks up the ids in its block and zeroes the others; the sum
/// over the axis is the lookup.
LogicalResult AxisPartitioner::maskedGather(dl::GatherOp op) {
  Value table = op.getTable(), ids = op.getIds();
  OpBuilder b(op);
  Location loc = op.getLoc();
  auto it = rtt(ids);
  Type ie = it.getElementType();
  int64_t rowsLocal = rtt(table).getDimSize(0);
  // This rank's first row: its block of [0, Vl, 2 Vl, ...].
  Value base = firstRow(op, rowsLocal, ie);
  b.setInsertionPoint(op);
  Value local = dl::SubOp::create(b, loc, ids, base);
  Value clamped = dl::MinimumOp::create(
      b, loc, dl::MaximumOp::create(b, loc, local, scalarLike(b, loc, ie, 0)),
      scalarLike(b, loc, ie, double(rowsLocal - 1)));
  Value in = dl::CompareOp::create(b, loc, dl::CmpPredicate::eq, clamped, local);
  op.getIdsMutable().assign(clamped);
  auto rt = rtt(op.getResult());
  SmallVector<int64_t> maskShape(it.getShape());
  maskShape.append(size_t(rt.getRank() - it.getRank()), 1);
  b.setInsertionPointAfter(op);
  Value mask = dl::ReshapeOp::create(
      b, loc, RankedTensorType::get(maskShape, b.getI1Type()), in);
  Value zero = scalarLike(b, loc, rt.getElementType(), 0.0);
  Value out = dl::SelectOp::create(b, loc, mask, op.getResult(), zero);
  op.getResult().replaceAllUsesExcept(out, out.getDefiningOp());
  sh[op.getResult()] = Sh::partial();
  sh[out] = Sh::partial();
  return success();
}

std::tuple<Value, Value, double> AxisPartitioner::batchStats(Operation *op,
                                                             Value x) {
  auto it = statsOf.find(x);
  if (it != statsOf.end())
    return it->second;
  OpBuilder b(op->getContext());
  b.setInsertionPointAfterValue(x);
  Location loc = x.getLoc();
  auto xt = rtt(x);
  int64_t c = xt.getDimSize(1);
  double count = double(xt.getDimSize(0) * n);
  SmallVector<int64_t> dims{0}, bshape{1, c};
  for (int64_t d = 2; d < xt.getRank(); ++d) {
    dims.push_back(d);
    bshape.push_back(1);
    count *= double(xt.getDimSize(d));
  }
  Type elem = xt.getElementType();
  auto dimsAttr = b.getDenseI64ArrayAttr(dims);
  Value s1 = allReduce(b, loc, dl::SumOp::create(b, loc, x, dimsAttr, false),
                       shard::ReductionKind::Sum);
  Value mean = dl::MulOp::create(b, loc, s1, scalarLike(b, loc, elem, 1.0 / count));
  Value meanB = dl::ReshapeOp::create(b, loc, RankedTensorType::get(bshape, elem), mean);
  Value xc = dl::SubOp::create(b, loc, x, meanB);
  Value s2 = allReduce(
      b, loc,
      dl::SumOp::create(b, loc, dl::MulOp::create(b, loc, xc, xc), dimsAttr, false),
      shard::ReductionKind::Sum);
  Value var = dl::MulOp::create(b, loc, s2, scalarLike(b, loc, elem, 1.0 / count));
  sh[mean] = sh[var] = Sh::rep();
  return statsOf[x] = {mean, var, count};
}

/// batch_norm / batch_norm_grad (training) with the batch split: the
/// statistics are reduced over the axis (synchronized batch norm), so every
/// rank normalizes with the whole batch's. The ops then run in inference
/// form on those statistics; the running statistics and the terms of the
/// input gradient that flow through the statistics are added around them.
LogicalResult AxisPartitioner::syncedBatchNorm(Operation *op) {
  Value x = op->getOperand(0);
  auto xt = rtt(x);
  if (!of(x).isS() || of(x).dim != 0 || xt.getRank() < 2)
    return refuse(op, "only the batch dim (0) of the input may be split");
  // The output gradient is split like the input, the rest whole.
  for (unsigned i = 1; i < op->getNumOperands(); ++i) {
    OpOperand &o = op->getOpOperand(i);
    o.set(isa<dl::BatchNormGradOp>(op) && i == 4 ? toSplit(o.get(), 0)
                                                 : whole(o.get()));
  }
  auto [mean, var, count] = batchStats(op, x);
  OpBuilder b(op);
  Location loc = op->getLoc();
  Type elem = xt.getElementType();
  int64_t c = xt.getDimSize(1);
  SmallVector<int64_t> bshape{1, c};
  bshape.append(size_t(xt.getRank() - 2), 1);
  auto bt = RankedTensorType::get(bshape, elem);
  double eps = op->getAttrOfType<FloatAttr>("eps").getValueAsDouble();
  if (auto bn = dyn_cast<dl::BatchNormOp>(op)) {
    double m = bn.getMomentum().convertToDouble();
    auto y = dl::BatchNormOp::create(b, loc, x, bn.getWeight(), bn.getBias(),
                                     mean, var, bn.getEpsAttr(),
                                     bn.getMomentumAttr(), UnitAttr());
    Value rm = dl::AddOp::create(
        b, loc,
        dl::MulOp::create(b, loc, bn.getRunningMean(), scalarLike(b, loc, elem, 1.0 - m)),
        dl::MulOp::create(b, loc, mean, scalarLike(b, loc, elem, m)));
    Value rv = dl::AddOp::create(
        b, loc,
        dl::MulOp::create(b, loc, bn.getRunningVar(), scalarLike(b, loc, elem, 1.0 - m)),
        dl::MulOp::create(b, loc, var,
                          scalarLike(b, loc, elem, m * count / std::max(count - 1.0, 1.0))));
    sh[y.getResult()] = Sh::split(0);
    sh[rm] = sh[rv] = Sh::rep();
    op->getResult(0).replaceAllUsesWith(y.getResult());
    op->getResult(1).replaceAllUsesWith(rm);
    op->getResult(2).replaceAllUsesWith(rv);
    dead.push_back(op);
    return success();
  }
  auto g = cast<dl::BatchNormGradOp>(op);
  Value w = g.getWeight(), dy = g.getGrad();
  auto inf = dl::BatchNormGradOp::create(b, loc, xt, w.getType(), w.getType(),
                                         x, w, mean, var, dy, g.getEpsAttr(),
                                         UnitAttr());
  Value dw = allReduce(b, loc, inf.getResult(1), shard::ReductionKind::Sum);
  Value db = allReduce(b, loc, inf.getResult(2), shard::ReductionKind::Sum);
  // dx = w inv dy - w inv / M (db + xhat dw), xhat = (x - mean) inv.
  Value inv = dl::RsqrtOp::create(
      b, loc, dl::AddOp::create(b, loc, var, scalarLike(b, loc, elem, eps)));
  Value k = dl::MulOp::create(b, loc, dl::MulOp::create(b, loc, w, inv),
                              scalarLike(b, loc, elem, 1.0 / count));
  auto r = [&](Value v) { return dl::ReshapeOp::create(b, loc, bt, v).getResult(); };
  Value xhat = dl::MulOp::create(b, loc, dl::SubOp::create(b, loc, x, r(mean)), r(inv));
  Value corr = dl::MulOp::create(
      b, loc, r(k), dl::AddOp::create(b, loc, r(db), dl::MulOp::create(b, loc, xhat, r(dw))));
  Value dx = dl::SubOp::create(b, loc, inf.getResult(0), corr);
  sh[dx] = Sh::split(0);
  op->getResult(0).replaceAllUsesWith(dx);
  op->getResult(1).replaceAllUsesWith(dw);
  op->getResult(2).replaceAllUsesWith(db);
  dead.push_back(op);
  return success();
}

LogicalResult AxisPartitioner::elementwise(Operation *op) {
  auto rt = rtt(op->getResult(0));
  int64_t rr = rt.getRank();
  // The split dim of the result: the first split operand's. Operands split
  // on another dim are gathered, whole or partial operands spanning it are
  // sliced or reduce-scattered, partial ones broadcast along it summed.
  std::optional<int64_t> split;
  for (Value v : op->getOperands())
    if (of(v).isS()) {
      split = of(v).dim + (rr - rtt(v).getRank());
      break;
    }
  if (split) {
    for (OpOperand &o : op->getOpOperands()) {
      Value v = o.get();
      int64_t od = *split - (rr - rtt(v).getRank());
      bool spans = od >= 0 && rtt(v).getDimSize(od) != 1;
      if (of(v).isS() && of(v).dim == od)
        continue;
      if (of(v).isS())
        v = whole(v);
      o.set(spans ? toSplit(v, od) : whole(v));
    }
    setResult(op, 0, Sh::split(*split));
    return success();
  }
  // Linear in a partial operand: add/sub of partials, neg, and mul/div by
  // a whole value (the partial being the numerator).
  unsigned numP = 0;
  for (Value v : op->getOperands())
    numP += of(v).isP();
  bool linear = false;
  if (isa<dl::AddOp, dl::SubOp>(op))
    linear = numP == op->getNumOperands();
  else if (isa<dl::NegOp>(op))
    linear = true;
  else if (isa<dl::MulOp>(op))
    linear = numP == 1;
  else if (isa<dl::DivOp>(op))
    linear = numP == 1 && of(op->getOperand(0)).isP();
  if (!linear)
    materializeOperands(op);
  setResult(op, 0, linear ? Sh::partial() : Sh::rep());
  return success();
}

LogicalResult AxisPartitioner::reduction(Operation *op) {
  Value x = op->getOperand(0);
  Sh s = of(x);
  auto dims = op->getAttrOfType<DenseI64ArrayAttr>("dims").asArrayRef();
  bool keep = op->hasAttr("keepdims");
  bool isMax = isa<dl::MaxOp>(op);
  if (s.isP()) {
    if (isMax) {
      materializeOperands(op);
      setResult(op, 0, Sh::rep());
    } else {
      setResult(op, 0, Sh::partial());
    }
    return success();
  }
  if (s.isR()) {
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
    return success();
  }
  setResult(op, 0, Sh::partial());
  if (isa<dl::MeanOp>(op)) // local mean / n sums to the global mean
    scaleAfter(op, op->getResult(0), constScale(op, x, 1.0 / double(n)));
  return success();
}

LogicalResult AxisPartitioner::matmul(dl::MatmulOp op) {
  Value a = op.getLhs(), b = op.getRhs();
  auto at = rtt(a), bt = rtt(b), rt = rtt(op.getResult());
  int64_t ra = at.getRank(), rb = bt.getRank(), rr = rt.getRank();
  // Logical dims: a [.., M, K], b [.., K, N].
  int64_t aM = op.getTransposeA() ? ra - 1 : ra - 2;
  int64_t aK = op.getTransposeA() ? ra - 2 : ra - 1;
  int64_t bK = op.getTransposeB() ? rb - 1 : rb - 2;
  int64_t bN = op.getTransposeB() ? rb - 2 : rb - 1;
  auto apply = [&](Sh sa, Sh sb) -> std::optional<Sh> {
    if (sa.isP() && sb.isR())
      return Sh::partial();
    if (sb.isP() && sa.isR())
      return Sh::partial();
    if (sa.isP() || sb.isP())
      return std::nullopt;
    if (sa.isS() && sb.isS() && sa.dim == aK && sb.dim == bK)
      return Sh::partial(); // a shared contraction (row-parallel)
    if (sa.isS() && sb.isR()) {
      if (sa.dim == aM)
        return Sh::split(rr - 2);
      if (sa.dim < ra - 2) {
        // A batch dim of a; b must not span it.
        int64_t bd = sa.dim - (ra - rb);
        if (bd >= 0 && bd < rb - 2 && bt.getDimSize(bd) != 1)
          return std::nullopt;
        return Sh::split(sa.dim + (rr - ra));
      }
    }
    if (sa.isS() && sb.isS() && sa.dim < ra - 2 && sb.dim < rb - 2 &&
        sa.dim + (rr - ra) == sb.dim + (rr - rb))
      return Sh::split(sa.dim + (rr - ra)); // the same batch dim
    if (sb.isS() && sa.isR()) {
      if (sb.dim == bN)
        return Sh::split(rr - 1); // column-parallel
      if (sb.dim < rb - 2) {
        int64_t ad = sb.dim - (rb - ra);
        if (ad >= 0 && ad < ra - 2 && at.getDimSize(ad) != 1)
          return std::nullopt;
        return Sh::split(sb.dim + (rr - rb));
      }
    }
    if (sa.isR() && sb.isR())
      return Sh::rep();
    return std::nullopt;
  };
  Sh sa = of(a), sb = of(b);
  std::optional<Sh> r = apply(sa, sb);
  // A partial operand passed on as a partial result is reduced later at the
  // result's size; reduce-scattering the operand now may be cheaper (a
  // context-parallel key gradient before its input-gradient matmul), so
  // that case is searched too.
  if (r && r->isP() && (sa.isP() || sb.isP()))
    r.reset();
  if (!r) {
    // No rule for this pair: reshard the operands to the pair with a rule
    // that moves the fewest elements: gathers and reduce-scatters cost the
    // value's size, sums twice that, slices and reuses of an earlier
    // reshard nothing; a partial result costs its size (a reduction
    // later). A parameter keeps its sharding unless nothing else works
    // (gathering a weight would leave the activation split where the plan
    // has it whole). So a sequence-parallel x @ W gathers x, its weight
    // gradient x^T dy gathers dy, and a context-parallel key gradient is
    // reduce-scattered back onto the sequence.
    auto isParam = [&](Value v) {
      auto arg = dyn_cast<BlockArgument>(v);
      return arg && fn.getArgAttr(arg.getArgNumber(), DLOptDialect::kParamAttr);
    };
    auto size = [&](Value v) {
      return double(rtt(v).getNumElements()) * (of(v).isS() ? double(n) : 1.0);
    };
    auto matmulUsers = [](Value v) {
      double k = 0;
      for (Operation *user : v.getUsers())
        k += isa<dl::MatmulOp>(user) ? 1 : 0;
      return std::max(k, 1.0);
    };
    auto cost = [&](Value v, Sh to) -> double {
      Sh from = of(v);
      if (from == to)
        return 0;
      double c;
      void *key = v.getAsOpaquePointer();
      if (to.isR())
        c = from.isS() ? (gathered.count(v) ? 0 : size(v))
                       : (summed.count(v) ? 0 : 2 * size(v));
      else if (from.isR())
        c = 0;
      else if (from.isP())
        // One reduce-scatter serves every matmul that reads the value (a
        // context-parallel key gradient feeds both its input- and its
        // weight-gradient matmul), so each pays its share.
        c = scattered.count({key, to.dim}) ? 0 : size(v) / matmulUsers(v);
      else
        c = gathered.count(v) ? 0 : size(v);
      if (isParam(v) && !(from.isR() && to.isS()))
        c += 1e15;
      return c;
    };
    // In a weight gradient (x^T dy) a partial operand is reduce-scattered
    // only along the contraction (its own feature dim would leave the
    // result split on a weight dim that is gathered again later); other
    // partial operands (an input gradient dy W^T) may be scattered on their
    // rows too.
    // A weight gradient (x^T dy in the backward pass) whose weight is
    // replicated over this axis: over cp (which never splits a weight) a
    // partial result is reduced by the gradient synchronization the plan
    // prices over dp and cp anyway, so it costs nothing extra here.
    const bool weightGrad = op->hasAttr("dlopt.backward") &&
                            op.getTransposeA() && axis == "cp";
    // A partial result costs its reduction later: its size, or for a
    // batched weight gradient (summed over the batch dims first) its
    // matrix dims.
    auto partialCost = [&]() -> double {
      if (weightGrad)
        return 0;
      bool summedOverBatch = false;
      if (rr > 2 && op->hasOneUse())
        if (auto sum = dyn_cast<dl::SumOp>(*op->getUsers().begin())) {
          auto dims = sum.getDims();
          summedOverBatch = int64_t(dims.size()) == rr - 2;
          for (int64_t i = 0; summedOverBatch && i < rr - 2; ++i)
            summedOverBatch = dims[size_t(i)] == i;
        }
      if (summedOverBatch)
        return double(rt.getDimSize(rr - 2)) * double(rt.getDimSize(rr - 1));
      return double(rt.getNumElements());
    };
    // Equal costs go to the dim this axis splits the model's inputs on
    // (the batch under dp, the sequence under cp), so a reduce-scattered
    // gradient lands where the activations are.
    int64_t home = -1;
    for (BlockArgument arg : fn.getArguments())
      if (!isParam(arg) && of(arg).isS()) {
        home = of(arg).dim;
        break;
      }
    auto candidates = [&](Value v, int64_t featureDim) {
      SmallVector<Sh> c{of(v), Sh::rep()};
      auto t = rtt(v);
      SmallVector<int64_t> dims;
      if (home >= 0 && home < t.getRank())
        dims.push_back(home);
      for (int64_t k = 0; k < t.getRank(); ++k)
        if (k != home)
          dims.push_back(k);
      for (int64_t k : dims) {
        int64_t global = t.getDimSize(k) * (of(v).isS() && of(v).dim == k ? n : 1);
        if (global % n == 0 && !(of(v).isS() && of(v).dim == k) &&
            !(of(v).isP() && k == featureDim && op.getTransposeA()))
          c.push_back(Sh::split(k));
      }
      return c;
    };
    double best = std::numeric_limits<double>::infinity();
    Sh bestA = Sh::rep(), bestB = Sh::rep();
    for (Sh ca : candidates(a, aM))
      for (Sh cb : candidates(b, bN)) {
        std::optional<Sh> res = apply(ca, cb);
        if (!res)
          continue;
        double c = cost(a, ca) + cost(b, cb) + (res->isP() ? partialCost() : 0.0);
        if (c < best) {
          best = c;
          bestA = ca;
          bestB = cb;
          r = res;
        }
      }
    if (!r)
      return refuse(op, "no matmul form for these operands");
    if (!(bestA == sa))
      op->getOpOperand(0).set(reshard(a, bestA));
    if (!(bestB == sb))
      op->getOpOperand(1).set(reshard(b, bestB));
  }
  setResult(op, 0, *r);
  return success();
}

LogicalResult AxisPartitioner::partitionOp(Operation *op) {
  planOperands(op);
  if (failed(applyRule(op)))
    return failure();
  planResults(op);
  return success();
}

LogicalResult AxisPartitioner::applyRule(Operation *op) {
  if (isa<arith::ConstantOp, dl::IotaOp>(op)) {
    sh[op->getResult(0)] = Sh::rep();
    return success();
  }
  // Collectives of an earlier axis are linear maps to this one.
  if (isa<shard::AllReduceOp>(op)) {
    Sh s = of(op->getOperand(0));
    setResult(op, 0, s);
    return success();
  }
  if (isa<shard::AllGatherOp, shard::AllSliceOp, shard::ReduceScatterOp>(op)) {
    Sh s = of(op->getOperand(0));
    int64_t d = op->getAttrOfType<IntegerAttr>(
                      isa<shard::AllGatherOp>(op)   ? "gather_axis"
                      : isa<shard::AllSliceOp>(op) ? "slice_axis"
                                                   : "scatter_axis")
                    .getInt();
    if (s.isS() && s.dim == d) {
      op->getOpOperand(0).set(whole(op->getOperand(0)));
      s = Sh::rep();
    }
    setResult(op, 0, s);
    return success();
  }
  bool anySharded = false;
  for (Value v : op->getOperands())
    anySharded |= !of(v).isR();
  if (!anySharded) {
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

  // The gradient of a vocabulary-parallel lookup stays in the table's rows.
  if (auto sa = dyn_cast<dl::ScatterAddOp>(op)) {
    auto fid = op->getAttrOfType<IntegerAttr>(DLOptDialect::kFwdIdAttr);
    auto g = fid ? dyn_cast_or_null<dl::GatherOp>(forwardOps.lookup(fid.getInt()))
                 : dl::GatherOp();
    if (g && of(g.getTable()).isS() && of(g.getTable()).dim == 0 &&
        rtt(op->getResult(0)).getDimSize(0) % n == 0 &&
        !(of(sa.getIds()).isS() && of(sa.getUpdates()).isS() &&
          of(sa.getIds()).dim == of(sa.getUpdates()).dim))
      return maskedScatter(sa);
  }
  // scatter_add is linear in its updates: whole ids with partial updates
  // give a partial result.
  if (isa<dl::ScatterAddOp>(op) && of(op->getOperand(0)).isR() &&
      of(op->getOperand(1)).isP()) {
    setResult(op, 0, Sh::partial());
    return success();
  }
  if (auto g = dyn_cast<dl::GatherOp>(op)) {
    Sh t = of(g.getTable());
    if (t.isS() && t.dim == 0 && of(g.getIds()).isR())
      return maskedGather(g);
  }

  // Row-wise ops align their operands on a split leading dim: a partial
  // operand is reduce-scattered there rather than summed whole.
  auto splitOf = [&](unsigned i) { return of(op->getOperand(i)); };
  if (isa<dl::LayerNormOp, dl::RMSNormOp, dl::LayerNormGradOp,
          dl::RMSNormGradOp>(op)) {
    int64_t rank = rtt(op->getOperand(0)).getRank();
    int64_t axisAttr = op->getAttrOfType<IntegerAttr>("axis").getInt();
    if (axisAttr < 0)
      axisAttr += rank;
    bool isGrad = isa<dl::LayerNormGradOp, dl::RMSNormGradOp>(op);
    unsigned rowOperands = isGrad ? 2 : 1;
    // Rows split on a leading dim; the weights whole (gathered if split).
    std::optional<int64_t> d;
    for (unsigned i = 0; i < rowOperands; ++i)
      if (splitOf(i).isS() && splitOf(i).dim < axisAttr)
        d = splitOf(i).dim;
    for (unsigned i = rowOperands; i < op->getNumOperands(); ++i) {
      OpOperand &o = op->getOpOperand(i);
      o.set(whole(o.get()));
    }
    if (!d) {
      wholeOperands(op);
      for (unsigned i = 0; i < op->getNumResults(); ++i)
        setResult(op, i, Sh::rep());
      return success();
    }
    alignOn(op, isGrad ? ArrayRef<unsigned>{0, 1} : ArrayRef<unsigned>{0}, *d);
    setResult(op, 0, Sh::split(*d));
    // Weight and bias gradients sum over the leading dims: partial.
    for (unsigned i = 1; i < op->getNumResults(); ++i)
      setResult(op, i, Sh::partial());
    return success();
  }
  if (isa<dl::SoftmaxOp, dl::LogSoftmaxOp, dl::SoftmaxGradOp,
          dl::LogSoftmaxGradOp>(op)) {
    int64_t dim = op->getAttrOfType<IntegerAttr>("dim").getInt();
    int64_t rank = rtt(op->getOperand(0)).getRank();
    if (dim < 0)
      dim += rank;
    // Split on a dim that is not normalized: every operand alike. Else the
    // normalized dim is gathered (the whole row is needed).
    std::optional<int64_t> d;
    for (Value v : op->getOperands())
      if (of(v).isS() && of(v).dim != dim)
        d = of(v).dim;
    if (!d) {
      wholeOperands(op);
      setResult(op, 0, Sh::rep());
      return success();
    }
    SmallVector<unsigned> all;
    for (unsigned i = 0; i < op->getNumOperands(); ++i)
      all.push_back(i);
    alignOn(op, all, *d);
    setResult(op, 0, Sh::split(*d));
    return success();
  }
  if (isa<dl::MSEOp>(op)) {
    Sh s0 = splitOf(0), s1 = splitOf(1);
    if (!s0.isS() && !s1.isS()) {
      wholeOperands(op);
      setResult(op, 0, Sh::rep());
      return success();
    }
    int64_t d = s0.isS() ? s0.dim : s1.dim;
    alignOn(op, {0, 1}, d);
    setResult(op, 0, Sh::partial());
    scaleAfter(op, op->getResult(0),
               constScale(op, op->getResult(0), 1.0 / double(n)));
    return success();
  }
  // Data movement and rotations are linear: a partial sum stays one.
  if (isa<dl::TransposeOp, dl::ReshapeOp>(op) && of(op->getOperand(0)).isP()) {
    setResult(op, 0, Sh::partial());
    return success();
  }
  if (auto rope = dyn_cast<dl::RopeOp>(op);
      rope && of(rope.getInput()).isP() &&
      (!rope.getOffset() || of(rope.getOffset()).isR())) {
    setResult(op, 0, Sh::partial());
    return success();
  }
  // The remaining rules need whole (not partial) operands; on whole
  // operands every op computes the same on every rank.
  materializeOperands(op);
  if (llvm::all_of(op->getOperands(), [&](Value v) { return of(v).isR(); })) {
    for (unsigned i = 0; i < op->getNumResults(); ++i)
      sh[op->getResult(i)] = Sh::rep();
    return success();
  }
  auto allSplitOn = [&](int64_t d) {
    for (Value v : op->getOperands())
      if (!of(v).isR() && !(of(v).isS() && of(v).dim == d))
        return false;
    return true;
  };

  if (isa<dl::CrossEntropyOp, dl::CrossEntropyGradOp>(op)) {
    Sh lg = splitOf(0), lb = splitOf(1);
    if (lg.isS() && lg.dim == 1)
      return vocabCrossEntropy(op);
    if (!(lg.isS() && lg.dim == 0 && lb.isS() && lb.dim == 0))
      return refuse(op, "logits and labels must both be split on rows, or "
                        "the logits on the classes with whole labels");
    if (auto ce = dyn_cast<dl::CrossEntropyOp>(op)) {
      setResult(op, 0, Sh::partial());
      scaleAfter(op, op->getResult(0),
                 crossEntropyScale(op, ce.getLabels(), ce.getIgnoreIndex()));
      return success();
    }
    auto ceg = cast<dl::CrossEntropyGradOp>(op);
    if (!splitOf(2).isR())
      return refuse(op, "the upstream gradient must be whole");
    setResult(op, 0, Sh::split(0));
    scaleAfter(op, op->getResult(0),
               crossEntropyScale(op, ceg.getLabels(), ceg.getIgnoreIndex()));
    return success();
  }
  if (isa<dl::BatchNormOp, dl::BatchNormGradOp>(op) &&
      op->hasAttr("training"))
    return syncedBatchNorm(op);
  if (auto drop = dyn_cast<dl::DropoutOp>(op)) {
    // The mask must not depend on the sharding: it is drawn for the whole
    // tensor (global element indices, the same seed and offset on every
    // rank) and each rank keeps its block. Every rank draws the whole mask.
    Sh s = splitOf(0);
    if (!s.isS() || (drop.getOffset() && !of(drop.getOffset()).isR()))
      return refuse(op, "expects a split input and a whole offset");
    OpBuilder b(op);
    Location loc = op->getLoc();
    auto whole = gatheredType(rtt(drop.getInput()), s.dim);
    Value ones = arith::ConstantOp::create(
        b, loc, whole,
        DenseElementsAttr::get(whole, b.getFloatAttr(whole.getElementType(), 1.0)));
    sh[ones] = Sh::rep();
    auto mask = dl::DropoutOp::create(b, loc, ones, drop.getOffset(),
                                      drop.getRateAttr(), drop.getSeedAttr());
    sh[mask.getResult()] = Sh::rep();
    Value mine = toSplit(mask.getResult(), s.dim);
    b.setInsertionPoint(op);
    Value y = dl::MulOp::create(b, loc, drop.getInput(), mine);
    sh[y] = s;
    op->getResult(0).replaceAllUsesWith(y);
    dead.push_back(op);
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
    // The operand's dims before this axis split it.
    SmallVector<int64_t> gin(in);
    gin[s.dim] *= n;
    int64_t prefix = 1;
    for (int64_t d = 0; d < s.dim; ++d)
      prefix *= gin[d];
    // An output dim j with the same prefix (the product of the dims before
    // it) holds, per prefix index, the same elements as the split dim and
    // everything after it; rank r's contiguous chunk of them is then block
    // r of dim j whenever dim j divides by n.
    int64_t p2 = 1;
    for (size_t j = 0; j < out.size(); ++j) {
      if (p2 == prefix && out[j] % n == 0) {
        setResult(op, 0, Sh::split(int64_t(j)));
        return success();
      }
      p2 *= out[j];
    }
    // Otherwise the reshape runs on the whole value.
    wholeOperands(op);
    setResult(op, 0, Sh::rep());
    return success();
  }
  if (auto g = dyn_cast<dl::GatherOp>(op)) {
    Sh t = splitOf(0), ids = splitOf(1);
    int64_t idsRank = rtt(g.getIds()).getRank();
    if (t.isR() && ids.isS()) {
      setResult(op, 0, ids); // rows of the result follow the ids
      return success();
    }
    if (t.isS() && t.dim > 0 && ids.isR()) {
      setResult(op, 0, Sh::split(t.dim - 1 + idsRank)); // split features
      return success();
    }
    return refuse(op, "the table must be whole, split on its rows with whole "
                      "ids, or split on its features");
  }
  if (auto sa = dyn_cast<dl::ScatterAddOp>(op)) {
    Sh ids = splitOf(0), upd = splitOf(1);
    int64_t idsRank = rtt(sa.getIds()).getRank();
    if (ids.isS() && upd.isS() && ids.dim == upd.dim) {
      setResult(op, 0, Sh::partial()); // each rank adds its rows' updates
      return success();
    }
    if (ids.isR() && upd.isS() && upd.dim >= idsRank) {
      setResult(op, 0, Sh::split(upd.dim - idsRank + 1)); // split features
      return success();
    }
    if (ids.isS() && upd.isR()) {
      alignOn(op, {1}, ids.dim);
      setResult(op, 0, Sh::partial());
      return success();
    }
    if (ids.isR() && upd.isS() && upd.dim < idsRank) {
      // Updates split along an ids dim (a sequence-parallel gradient):
      // each rank scatters its rows with its ids.
      alignOn(op, {0}, upd.dim);
      setResult(op, 0, Sh::partial());
      return success();
    }
    return refuse(op, "ids and updates must be split alike");
  }
  if (isa<dl::AttentionOp, dl::AttentionGradOp>(op) &&
      splitOf(0).isS() && splitOf(0).dim == 2) {
    // Queries split on the sequence (context parallelism, the all-gather
    // form): every rank attends with its block of queries to all keys and
    // values (gathered), its causal mask shifted to its block's position.
    bool isGrad = isa<dl::AttentionGradOp>(op);
    OpOperand &q = op->getOpOperand(0);
    int64_t sLocal = rtt(q.get()).getDimSize(2);
    for (unsigned i : {1u, 2u}) {
      OpOperand &o = op->getOpOperand(i);
      o.set(whole(o.get()));
    }
    if (isGrad) {
      OpOperand &g = op->getOpOperand(3);
      if (!(of(g.get()).isS() && of(g.get()).dim == 2))
        g.set(toSplit(g.get(), 2));
    }
    int64_t keys = rtt(op->getOperand(1)).getDimSize(2);
    auto i64 = IntegerType::get(op->getContext(), 64);
    Value base = firstRow(op, sLocal, i64);
    OpBuilder b(op);
    Location loc = op->getLoc();
    Value old = isGrad ? cast<dl::AttentionGradOp>(op).getQueryOffset()
                       : cast<dl::AttentionOp>(op).getQueryOffset();
    if (old && !of(old).isR())
      return refuse(op, "expects a whole offset");
    // Query 0 of the whole sequence sits at T - S among the keys (or at the
    // op's own offset); this rank's first query r * S_local after it.
    Value start = old ? (getElementTypeOrSelf(old.getType()) == i64
                             ? old
                             : dl::CastOp::create(
                                   b, loc, RankedTensorType::get({}, i64), old)
                                   .getResult())
                      : scalarLike(b, loc, i64, double(keys - sLocal * n));
    Value offset = dl::AddOp::create(b, loc, start, base);
    sh[offset] = Sh::rep();
    if (isGrad)
      cast<dl::AttentionGradOp>(op).getQueryOffsetMutable().assign(offset);
    else
      cast<dl::AttentionOp>(op).getQueryOffsetMutable().assign(offset);
    setResult(op, 0, Sh::split(2));
    for (unsigned i = 1; i < op->getNumResults(); ++i)
      setResult(op, i, Sh::partial()); // each rank's share of dk, dv
    return success();
  }
  if (isa<dl::AttentionOp, dl::AttentionGradOp>(op)) {
    // [B, H, S, D]: the batch or the heads may be split (the kv heads of
    // a group follow their query heads when both divide).
    // Heads first, then the batch; operands split otherwise are resharded.
    // q, k, v (and the output gradient); an offset operand stays whole.
    unsigned tensors = isa<dl::AttentionGradOp>(op) ? 4 : 3;
    if (op->getNumOperands() > tensors &&
        !of(op->getOperand(tensors)).isR())
      return refuse(op, "expects a whole offset");
    std::optional<int64_t> d;
    for (int64_t cand : {1, 0})
      for (unsigned i = 0; i < tensors; ++i)
        if (!d && of(op->getOperand(i)).isS() &&
            of(op->getOperand(i)).dim == cand)
          d = cand;
    if (!d)
      return refuse(op, "only the batch (0) or the heads (1) of q, k and v "
                        "may be split, or the queries' sequence (2)");
    for (unsigned i = 0; i < tensors; ++i) {
      Value v = op->getOperand(i);
      if (!of(v).isS() && rtt(v).getDimSize(*d) % n)
        return refuse(op, "dim " + std::to_string(*d) + " of an operand does "
                          "not divide by the axis");
    }
    SmallVector<unsigned> all;
    for (unsigned i = 0; i < tensors; ++i)
      all.push_back(i);
    alignOn(op, all, *d);
    for (unsigned i = 0; i < op->getNumResults(); ++i)
      setResult(op, i, Sh::split(*d));
    return success();
  }
  // Convolutions and pools: the batch (dim 0) may be split; the filter
  // gradient sums over it.
  if (isa<dl::Conv2DOp, dl::MaxPool2DOp, dl::AvgPool2DOp,
          dl::Conv2DGradInputOp, dl::MaxPool2DGradOp, dl::AvgPool2DGradOp>(
          op)) {
    Sh s = splitOf(0);
    bool ok = s.isS() && s.dim == 0;
    for (unsigned i = 1; i < op->getNumOperands(); ++i) {
      Sh o = splitOf(i);
      bool batchOperand = isa<dl::MaxPool2DGradOp>(op); // (x, dy)
      ok &= batchOperand ? o.isS() && o.dim == 0 : o.isR();
    }
    if (!ok)
      return refuse(op, "only the batch dim (0) of the activations may be "
                        "split, with whole filters and biases");
    setResult(op, 0, Sh::split(0));
    return success();
  }
  if (isa<dl::Conv2DGradFilterOp>(op)) {
    // A whole operand beside a batch-split one takes its rank's block (a
    // slice, no traffic): dy of a loss summed over the whole batch.
    for (unsigned i = 0; i < 2; ++i) {
      Sh mine = splitOf(i), other = splitOf(1 - i);
      if (mine.isR() && other.isS() && other.dim == 0)
        op->getOpOperand(i).set(reshard(op->getOperand(i), Sh::split(0)));
    }
    if (!allSplitOn(0) || !splitOf(0).isS() || !splitOf(1).isS())
      return refuse(op, "x and dy must both be split on the batch");
    setResult(op, 0, Sh::partial());
    return success();
  }
  if (auto rope = dyn_cast<dl::RopeOp>(op)) {
    // Positions run along dim -2 and pairs along the last dim. Split on
    // the positions (context parallelism), a rank's rows start at its
    // block's position.
    Sh s = splitOf(0);
    int64_t rank = rtt(op->getOperand(0)).getRank();
    if (!s.isS() || s.dim == rank - 1 ||
        (rope.getOffset() && !of(rope.getOffset()).isR()))
      return refuse(op, "the pairs (last dim) may not be split, and the "
                        "offset must be whole");
    if (s.dim == rank - 2) {
      auto i64 = IntegerType::get(op->getContext(), 64);
      Value base = firstRow(op, rtt(op->getOperand(0)).getDimSize(s.dim), i64);
      Value offset = base;
      if (Value old = rope.getOffset()) {
        OpBuilder b(op);
        Value o = getElementTypeOrSelf(old.getType()) == i64
                      ? old
                      : dl::CastOp::create(b, op->getLoc(),
                                           RankedTensorType::get({}, i64), old)
                            .getResult();
        offset = dl::AddOp::create(b, op->getLoc(), o, base);
      }
      sh[offset] = Sh::rep();
      rope.getOffsetMutable().assign(offset);
    }
    setResult(op, 0, s);
    return success();
  }
  return refuse(op, "this op has no partitioning rule yet");
}

struct PartitionPass : dlopt::impl::PartitionPassBase<PartitionPass> {
  using PartitionPassBase::PartitionPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<func::FuncOp> entryFn = findEntryFunction(module, entry);
    if (failed(entryFn))
      return signalPassFailure();
    func::FuncOp fn = *entryFn;
    auto bad = [&]() {
      signalPassFailure();
      return fn.emitError() << "dlopt-partition: ";
    };
    if (axes.size() != sizes.size()) {
      bad() << "expects one size per mesh axis, got " << axes.size()
            << " axes and " << sizes.size() << " sizes";
      return;
    }
    // The mesh: the axes of size > 1, in the order given.
    SmallVector<std::string> meshAxes;
    SmallVector<int64_t> meshSizes;
    for (auto [a, s] : llvm::zip(axes, sizes)) {
      if (s < 1 || s > (int64_t(1) << 20)) {
        bad() << "mesh axis '" << a << "' has size " << s
              << "; expected 1 to 2^20";
        return;
      }
      if (llvm::is_contained(meshAxes, a)) {
        bad() << "mesh axis '" << a << "' is given twice";
        return;
      }
      if (s > 1) {
        meshAxes.push_back(a);
        meshSizes.push_back(s);
      }
    }
    if (meshAxes.empty())
      return;
    if (!fn->hasAttr(DLOptDialect::kLossAttr) ||
        fn->hasAttr("dlopt.train_step")) {
      bad() << "expects a differentiated step (after dlopt-autodiff, before "
               "dlopt-optimizer)";
      return;
    }
    if (module->hasAttr("dlopt.mesh") || module.lookupSymbol(kMeshName)) {
      bad() << "the module is already partitioned (it has a dlopt.mesh)";
      return;
    }
    // Argument shardings name mesh axes, each once, in mesh order per dim.
    std::vector<std::string> axisList(axes.begin(), axes.end());
    for (unsigned i = 0; i < fn.getNumArguments(); ++i) {
      auto s = fn.getArgAttrOfType<ArrayAttr>(i, kShardingAttr);
      if (!fn.getArgAttr(i, kShardingAttr))
        continue;
      auto t = rtt(fn.getArgument(i));
      if (!s || int64_t(s.size()) != t.getRank()) {
        bad() << "argument #" << i << " (" << t << "): " << kShardingAttr
              << " must list one array of mesh axes per dim ("
              << t.getRank() << "), got " << fn.getArgAttr(i, kShardingAttr);
        return;
      }
      std::set<std::string> seen;
      for (auto [d, list] : llvm::enumerate(s)) {
        auto axesOfDim = dyn_cast<ArrayAttr>(list);
        if (!axesOfDim) {
          bad() << "argument #" << i << ": dim " << d << " of "
                << kShardingAttr << " is not an array of axis names";
          return;
        }
        int64_t prev = -1, prod = 1;
        for (Attribute a : axesOfDim) {
          auto name = dyn_cast<StringAttr>(a);
          auto it = name ? llvm::find(axisList, name.getValue().str())
                         : axisList.end();
          if (it == axisList.end()) {
            bad() << "argument #" << i << ": " << kShardingAttr << " names "
                  << a << ", which is not a mesh axis";
            return;
          }
          if (!seen.insert(name.getValue().str()).second) {
            bad() << "argument #" << i << ": axis '" << name.getValue()
                  << "' splits two dims";
            return;
          }
          int64_t pos = it - axisList.begin();
          if (pos < prev) {
            bad() << "argument #" << i << ": dim " << d
                  << " lists its axes out of mesh order";
            return;
          }
          prev = pos;
          prod *= sizes[size_t(pos)];
        }
        if (t.getDimSize(d) % prod) {
          bad() << "argument #" << i << " (" << t << "): dim " << d << " ("
                << t.getDimSize(d) << ") does not divide by " << prod
                << ", the ranks of the axes that split it";
          return;
        }
      }
    }

    MLIRContext *ctx = &getContext();
    OpBuilder mb(module.getBodyRegion());
    mb.setInsertionPointToStart(module.getBody());
    shard::GridOp::create(mb, module.getLoc(), kMeshName, meshSizes);
    SmallVector<Attribute> axisAttrs;
    for (const std::string &a : meshAxes)
      axisAttrs.push_back(StringAttr::get(ctx, a));
    module->setAttr("dlopt.mesh", meshAttr(ctx, axisAttrs, meshSizes));
    for (size_t k = 0; k < meshAxes.size(); ++k) {
      AxisPartitioner part(fn, meshAxes[k], int16_t(k), meshSizes[k]);
      if (failed(part.run()))
        return signalPassFailure();
    }
    // A sum over one axis, then over another (a gradient of a weight
    // replicated over dp and cp): one all-reduce over both.
    SmallVector<shard::AllReduceOp> outer;
    fn.walk([&](shard::AllReduceOp ar) { outer.push_back(ar); });
    for (shard::AllReduceOp ar : outer) {
      auto inner = ar.getInput().getDefiningOp<shard::AllReduceOp>();
      if (!inner || !inner->hasOneUse() ||
          inner.getReduction() != ar.getReduction())
        continue;
      SmallVector<int16_t> axes(inner.getGridAxes());
      llvm::append_range(axes, ar.getGridAxes());
      llvm::sort(axes);
      ar.getInputMutable().assign(inner.getInput());
      ar.setGridAxes(axes);
      inner->erase();
    }
    // A sum over one axis, then a slice over another (the gradient of a
    // vocabulary-parallel embedding, built whole): slice first, so the sum
    // moves only this rank's block. Slicing commutes with a sum over
    // other ranks.
    SmallVector<shard::AllSliceOp> slices;
    fn.walk([&](shard::AllSliceOp sl) { slices.push_back(sl); });
    for (shard::AllSliceOp sl : slices) {
      auto ar = sl.getInput().getDefiningOp<shard::AllReduceOp>();
      if (!ar || !ar->hasOneUse() ||
          llvm::any_of(sl.getGridAxes(), [&](int16_t a) {
            return llvm::is_contained(ar.getGridAxes(), a);
          }))
        continue;
      OpBuilder b(sl);
      auto first = shard::AllSliceOp::create(
          b, sl.getLoc(), sl.getType(), sl.getGridAttr(), sl.getGridAxesAttr(),
          ar.getInput(), sl.getSliceAxisAttr());
      auto sum = shard::AllReduceOp::create(b, ar.getLoc(), sl.getType(),
                                            ar.getGridAttr(), ar.getGridAxesAttr(),
                                            first.getResult(), ar.getReductionAttr());
      sl.getResult().replaceAllUsesWith(sum.getResult());
      sl->erase();
      ar->erase();
    }
    // A collective belongs to the layer and pass (forward or backward) of
    // the value it reshards, so recomputation re-runs a layer's forward
    // collectives with its ops and the backward reads the clones.
    fn.walk([&](Operation *op) {
      if (!isa<shard::ShardDialect>(op->getDialect()) || op->getNumOperands() != 1)
        return;
      Operation *def = op->getOperand(0).getDefiningOp();
      if (!def)
        return;
      for (StringRef mark : {DLOptDialect::kLayerAttr, DLOptDialect::kBackwardAttr})
        if (Attribute a = def->getAttr(mark); a && !op->hasAttr(mark))
          op->setAttr(mark, a);
    });
    for (unsigned i = 0; i < fn.getNumArguments(); ++i)
      fn.removeArgAttr(i, kShardingAttr);
    fn.walk([](Operation *op) { op->removeAttr("dlopt.plan"); });
  }
};

} // namespace
