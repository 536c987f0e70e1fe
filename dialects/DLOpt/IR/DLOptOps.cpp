//===- DLOptOps.cpp - dlopt op verification, type inference and folding ---===//
#include "dialects/DLOpt/IR/DLOptOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/CommonFolders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"
#include "llvm/ADT/STLExtras.h"

#include <cmath>

using namespace mlir;
using namespace dlopt::dl;

#include "dialects/DLOpt/IR/DLOptEnums.cpp.inc"

//===----------------------------------------------------------------------===//
// Shared helpers
//===----------------------------------------------------------------------===//

/// Emits "'<op>' op <msg>" at `loc` when a location is available, mirroring
/// Operation::emitOpError for inference that runs before the op exists.
static InFlightDiagnostic opError(std::optional<Location> loc,
                                  StringRef opName) {
  InFlightDiagnostic diag = mlir::emitError(*loc);
  diag << "'" << opName << "' op ";
  return diag;
}

#define INFER_ERROR(...)                                                       \
  (loc ? (opError(loc, opName) << __VA_ARGS__, failure()) : failure())

static std::string shapeStr(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (auto [i, d] : llvm::enumerate(shape))
    s += (i ? ", " : "") + std::to_string(d);
  return s + "]";
}

int64_t dlopt::dl::normalizeDim(int64_t dim, int64_t rank) {
  if (dim < -rank || dim >= rank)
    return -1;
  return dim < 0 ? dim + rank : dim;
}

bool dlopt::dl::broadcastShapes(ArrayRef<int64_t> a, ArrayRef<int64_t> b,
                                SmallVectorImpl<int64_t> &out) {
  size_t rank = std::max(a.size(), b.size());
  out.assign(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      return false;
    out[i] = da == 1 ? db : da;
  }
  return true;
}

LogicalResult dlopt::dl::inferBroadcastResult(std::optional<Location> loc,
                                              StringRef opName,
                                              ArrayRef<Type> operands,
                                              Type resultElement,
                                              SmallVectorImpl<Type> &types) {
  SmallVector<int64_t> shape;
  Type elem;
  for (auto [i, t] : llvm::enumerate(operands)) {
    auto rt = dyn_cast<RankedTensorType>(t);
    if (!rt)
      return INFER_ERROR("expects ranked tensor operands, got " << t);
    if (!elem)
      elem = rt.getElementType();
    else if (rt.getElementType() != elem)
      return INFER_ERROR("expects operands of the same element type, got "
                         << elem << " and " << rt.getElementType());
    SmallVector<int64_t> next;
    if (!broadcastShapes(shape, rt.getShape(), next))
      return INFER_ERROR("expects broadcast-compatible shapes, got "
                         << shapeStr(shape) << " and "
                         << shapeStr(rt.getShape()) << " (operand #" << i
                         << ")");
    shape = std::move(next);
  }
  types.push_back(
      RankedTensorType::get(shape, resultElement ? resultElement : elem));
  return success();
}

LogicalResult dlopt::dl::inferReduceResult(std::optional<Location> loc,
                                           StringRef opName, Type input,
                                           ArrayRef<int64_t> dims,
                                           bool keepdims,
                                           SmallVectorImpl<Type> &types) {
  auto rt = cast<RankedTensorType>(input);
  int64_t rank = rt.getRank();
  SmallVector<bool> reduced(rank, false);
  for (int64_t d : dims) {
    int64_t n = normalizeDim(d, rank);
    if (n < 0)
      return INFER_ERROR("expects dims in [" << -rank << ", " << rank
                                             << "), got " << d);
    if (reduced[n])
      return INFER_ERROR("expects distinct dims, got " << d << " twice");
    reduced[n] = true;
  }
  SmallVector<int64_t> shape;
  for (int64_t i = 0; i < rank; ++i) {
    if (!reduced[i])
      shape.push_back(rt.getDimSize(i));
    else if (keepdims)
      shape.push_back(1);
  }
  types.push_back(RankedTensorType::get(shape, rt.getElementType()));
  return success();
}

/// True if `attr` is a splat whose every element equals `value`.
static bool isSplatOf(Attribute attr, double value) {
  auto dense = dyn_cast_if_present<DenseElementsAttr>(attr);
  if (!dense || !dense.isSplat())
    return false;
  Type elem = dense.getElementType();
  if (isa<FloatType>(elem))
    return dense.getSplatValue<APFloat>().convertToDouble() == value;
  if (isa<IntegerType>(elem))
    return dense.getSplatValue<APInt>().getSExtValue() ==
           static_cast<int64_t>(value);
  return false;
}

/// Folds `x op c` to `x` when c is a splat identity and no broadcast happens.
static OpFoldResult foldRightIdentity(Value lhs, Type resultType,
                                      Attribute rhsAttr, double identity) {
  if (lhs.getType() == resultType && isSplatOf(rhsAttr, identity))
    return lhs;
  return {};
}

/// Constant-folds a binary op whose operands and result share one type.
template <typename FloatFn, typename IntFn>
static OpFoldResult foldBinaryConstants(Operation *op,
                                        ArrayRef<Attribute> operands,
                                        FloatFn floatFn, IntFn intFn) {
  Type t = op->getResult(0).getType();
  if (op->getOperand(0).getType() != t || op->getOperand(1).getType() != t)
    return {};
  Type elem = cast<RankedTensorType>(t).getElementType();
  if (isa<FloatType>(elem))
    return constFoldBinaryOp<FloatAttr, APFloat, void>(
        operands, [&](const APFloat &a, const APFloat &b) -> std::optional<APFloat> {
          return floatFn(a, b);
        });
  if (isa<IntegerType>(elem))
    return constFoldBinaryOp<IntegerAttr, APInt, void>(
        operands, [&](const APInt &a, const APInt &b) -> std::optional<APInt> {
          return intFn(a, b);
        });
  return {};
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

OpFoldResult NegOp::fold(FoldAdaptor adaptor) {
  if (auto prev = getInput().getDefiningOp<NegOp>())
    return prev.getInput();
  Type elem = getType().getElementType();
  if (isa<FloatType>(elem))
    return constFoldUnaryOp<FloatAttr, APFloat, void>(adaptor.getOperands(),
                                       [](const APFloat &a) { return -a; });
  return constFoldUnaryOp<IntegerAttr, APInt, void>(adaptor.getOperands(),
                                       [](const APInt &a) { return -a; });
}

OpFoldResult AbsOp::fold(FoldAdaptor adaptor) {
  if (auto prev = getInput().getDefiningOp<AbsOp>())
    return prev.getResult();
  Type elem = getType().getElementType();
  if (isa<FloatType>(elem))
    return constFoldUnaryOp<FloatAttr, APFloat, void>(adaptor.getOperands(),
                                       [](const APFloat &a) { return abs(a); });
  return constFoldUnaryOp<IntegerAttr, APInt, void>(adaptor.getOperands(),
                                       [](const APInt &a) { return a.abs(); });
}

LogicalResult GeluOp::verify() {
  if (getApproximate() != "none" && getApproximate() != "tanh")
    return emitOpError("expects approximate = \"none\" or \"tanh\", got \"")
           << getApproximate() << "\"";
  return success();
}

OpFoldResult CastOp::fold(FoldAdaptor) {
  if (getInput().getType() == getType())
    return getInput();
  return {};
}

OpFoldResult AddOp::fold(FoldAdaptor adaptor) {
  if (OpFoldResult r = foldRightIdentity(getLhs(), getType(), adaptor.getRhs(), 0))
    return r;
  if (OpFoldResult r = foldRightIdentity(getRhs(), getType(), adaptor.getLhs(), 0))
    return r;
  return foldBinaryConstants(
      *this, adaptor.getOperands(), [](APFloat a, const APFloat &b) { a.add(b, APFloat::rmNearestTiesToEven); return a; },
      [](const APInt &a, const APInt &b) { return a + b; });
}

OpFoldResult SubOp::fold(FoldAdaptor adaptor) {
  if (OpFoldResult r = foldRightIdentity(getLhs(), getType(), adaptor.getRhs(), 0))
    return r;
  return foldBinaryConstants(
      *this, adaptor.getOperands(), [](APFloat a, const APFloat &b) { a.subtract(b, APFloat::rmNearestTiesToEven); return a; },
      [](const APInt &a, const APInt &b) { return a - b; });
}

OpFoldResult MulOp::fold(FoldAdaptor adaptor) {
  if (OpFoldResult r = foldRightIdentity(getLhs(), getType(), adaptor.getRhs(), 1))
    return r;
  if (OpFoldResult r = foldRightIdentity(getRhs(), getType(), adaptor.getLhs(), 1))
    return r;
  return foldBinaryConstants(
      *this, adaptor.getOperands(), [](APFloat a, const APFloat &b) { a.multiply(b, APFloat::rmNearestTiesToEven); return a; },
      [](const APInt &a, const APInt &b) { return a * b; });
}

OpFoldResult DivOp::fold(FoldAdaptor adaptor) {
  if (OpFoldResult r = foldRightIdentity(getLhs(), getType(), adaptor.getRhs(), 1))
    return r;
  // Integer division is left to the runtime, which reports division by zero.
  if (!isa<FloatType>(getType().getElementType()))
    return {};
  return foldBinaryConstants(
      *this, adaptor.getOperands(), [](APFloat a, const APFloat &b) { a.divide(b, APFloat::rmNearestTiesToEven); return a; },
      [](const APInt &a, const APInt &) { return a; });
}

OpFoldResult MaximumOp::fold(FoldAdaptor adaptor) {
  if (getLhs() == getRhs() && getLhs().getType() == getType())
    return getLhs();
  return foldBinaryConstants(
      *this, adaptor.getOperands(), [](const APFloat &a, const APFloat &b) { return maximum(a, b); },
      [](const APInt &a, const APInt &b) { return a.sge(b) ? a : b; });
}

OpFoldResult MinimumOp::fold(FoldAdaptor adaptor) {
  if (getLhs() == getRhs() && getLhs().getType() == getType())
    return getLhs();
  return foldBinaryConstants(
      *this, adaptor.getOperands(), [](const APFloat &a, const APFloat &b) { return minimum(a, b); },
      [](const APInt &a, const APInt &b) { return a.sle(b) ? a : b; });
}

LogicalResult CompareOp::inferReturnTypes(MLIRContext *context,
                                          std::optional<Location> loc,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &types) {
  return inferBroadcastResult(loc, getOperationName(),
                              {adaptor.getLhs().getType(), adaptor.getRhs().getType()},
                              IntegerType::get(context, 1), types);
}

LogicalResult SelectOp::inferReturnTypes(MLIRContext *context,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  StringRef opName = getOperationName();
  SmallVector<Type> valueTypes;
  if (failed(inferBroadcastResult(loc, opName,
                                  {adaptor.getTrueValue().getType(),
                                   adaptor.getFalseValue().getType()},
                                  nullptr, valueTypes)))
    return failure();
  auto valueType = cast<RankedTensorType>(valueTypes[0]);
  auto condType = cast<RankedTensorType>(adaptor.getCond().getType());
  SmallVector<int64_t> shape;
  if (!broadcastShapes(condType.getShape(), valueType.getShape(), shape))
    return INFER_ERROR("expects the condition shape "
                       << shapeStr(condType.getShape())
                       << " to broadcast with the value shape "
                       << shapeStr(valueType.getShape()));
  types.push_back(RankedTensorType::get(shape, valueType.getElementType()));
  return success();
}

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::inferReturnTypes(MLIRContext *context,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  StringRef opName = getOperationName();
  auto a = cast<RankedTensorType>(adaptor.getLhs().getType());
  auto b = cast<RankedTensorType>(adaptor.getRhs().getType());
  if (a.getRank() < 2 || b.getRank() < 2)
    return INFER_ERROR("expects operands of rank >= 2, got rank "
                       << a.getRank() << " and rank " << b.getRank());
  if (a.getElementType() != b.getElementType())
    return INFER_ERROR("expects operands of the same element type, got "
                       << a.getElementType() << " and " << b.getElementType());
  int64_t ra = a.getRank(), rb = b.getRank();
  int64_t m = a.getDimSize(ra - 2), ka = a.getDimSize(ra - 1);
  if (adaptor.getTransposeA())
    std::swap(m, ka);
  int64_t kb = b.getDimSize(rb - 2), n = b.getDimSize(rb - 1);
  if (adaptor.getTransposeB())
    std::swap(kb, n);
  if (ka != kb)
    return INFER_ERROR("expects matching contraction sizes, got K = "
                       << ka << " (lhs) and K = " << kb << " (rhs)");
  SmallVector<int64_t> batch;
  if (!broadcastShapes(a.getShape().drop_back(2), b.getShape().drop_back(2),
                       batch))
    return INFER_ERROR("expects broadcast-compatible batch dims, got "
                       << shapeStr(a.getShape().drop_back(2)) << " and "
                       << shapeStr(b.getShape().drop_back(2)));
  batch.push_back(m);
  batch.push_back(n);
  types.push_back(RankedTensorType::get(batch, a.getElementType()));
  return success();
}

//===----------------------------------------------------------------------===//
// Shape ops
//===----------------------------------------------------------------------===//

LogicalResult ReshapeOp::verify() {
  if (getInput().getType().getNumElements() != getType().getNumElements())
    return emitOpError("expects the same number of elements, got ")
           << getInput().getType().getNumElements() << " in "
           << getInput().getType() << " and " << getType().getNumElements()
           << " in " << getType();
  return success();
}

OpFoldResult ReshapeOp::fold(FoldAdaptor adaptor) {
  if (getInput().getType() == getType())
    return getInput();
  if (auto prev = getInput().getDefiningOp<ReshapeOp>()) {
    getInputMutable().assign(prev.getInput());
    return getResult();
  }
  if (auto dense = dyn_cast_if_present<DenseElementsAttr>(adaptor.getInput()))
    return dense.reshape(getType());
  return {};
}

LogicalResult TransposeOp::inferReturnTypes(MLIRContext *context,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  StringRef opName = getOperationName();
  auto in = cast<RankedTensorType>(adaptor.getInput().getType());
  ArrayRef<int64_t> perm = adaptor.getPerm();
  if (static_cast<int64_t>(perm.size()) != in.getRank())
    return INFER_ERROR("expects a permutation of " << in.getRank()
                                                   << " dims, got "
                                                   << perm.size());
  SmallVector<bool> seen(perm.size(), false);
  SmallVector<int64_t> shape;
  for (int64_t p : perm) {
    if (p < 0 || p >= in.getRank() || seen[p])
      return INFER_ERROR("expects perm to be a permutation of [0, "
                         << in.getRank() << "), got " << shapeStr(perm));
    seen[p] = true;
    shape.push_back(in.getDimSize(p));
  }
  types.push_back(RankedTensorType::get(shape, in.getElementType()));
  return success();
}

OpFoldResult TransposeOp::fold(FoldAdaptor) {
  ArrayRef<int64_t> perm = getPerm();
  bool identity = true;
  for (auto [i, p] : llvm::enumerate(perm))
    identity &= static_cast<int64_t>(i) == p;
  if (identity)
    return getInput();
  // transpose(transpose(x, p1), p2) = transpose(x, p1[p2[i]]).
  if (auto prev = getInput().getDefiningOp<TransposeOp>()) {
    ArrayRef<int64_t> inner = prev.getPerm();
    SmallVector<int64_t> composed;
    for (int64_t p : perm)
      composed.push_back(inner[p]);
    getInputMutable().assign(prev.getInput());
    setPerm(composed);
    return getResult();
  }
  return {};
}

LogicalResult BroadcastToOp::verify() {
  SmallVector<int64_t> shape;
  ArrayRef<int64_t> from = getInput().getType().getShape();
  ArrayRef<int64_t> to = getType().getShape();
  if (!broadcastShapes(from, to, shape) || ArrayRef<int64_t>(shape) != to)
    return emitOpError("cannot broadcast ")
           << shapeStr(from) << " to " << shapeStr(to);
  return success();
}

OpFoldResult BroadcastToOp::fold(FoldAdaptor adaptor) {
  if (getInput().getType() == getType())
    return getInput();
  if (auto dense = dyn_cast_if_present<DenseElementsAttr>(adaptor.getInput()))
    if (dense.isSplat())
      return DenseElementsAttr::get(getType(), dense.getSplatValue<Attribute>());
  return {};
}

LogicalResult ConcatOp::inferReturnTypes(MLIRContext *context,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  StringRef opName = getOperationName();
  if (adaptor.getInputs().empty())
    return INFER_ERROR("expects at least one operand");
  auto first = cast<RankedTensorType>(adaptor.getInputs()[0].getType());
  int64_t rank = first.getRank();
  int64_t dim = normalizeDim(adaptor.getDim(), rank);
  if (dim < 0)
    return INFER_ERROR("expects dim in [" << -rank << ", " << rank
                                          << "), got " << adaptor.getDim());
  SmallVector<int64_t> shape(first.getShape());
  shape[dim] = 0;
  for (auto [i, v] : llvm::enumerate(adaptor.getInputs())) {
    auto t = cast<RankedTensorType>(v.getType());
    if (t.getElementType() != first.getElementType())
      return INFER_ERROR("expects operands of the same element type, got "
                         << first.getElementType() << " and "
                         << t.getElementType() << " (operand #" << i << ")");
    if (t.getRank() != rank)
      return INFER_ERROR("expects operands of the same rank, got "
                         << rank << " and " << t.getRank() << " (operand #"
                         << i << ")");
    for (int64_t d = 0; d < rank; ++d)
      if (d != dim && t.getDimSize(d) != first.getDimSize(d))
        return INFER_ERROR("expects operand #" << i << " to have size "
                                               << first.getDimSize(d)
                                               << " in dim " << d << ", got "
                                               << t.getDimSize(d));
    shape[dim] += t.getDimSize(dim);
  }
  types.push_back(RankedTensorType::get(shape, first.getElementType()));
  return success();
}

OpFoldResult ConcatOp::fold(FoldAdaptor) {
  if (getInputs().size() == 1 && getInputs()[0].getType() == getType())
    return getInputs()[0];
  return {};
}

LogicalResult SliceOp::inferReturnTypes(MLIRContext *context,
                                        std::optional<Location> loc,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &types) {
  StringRef opName = getOperationName();
  auto in = cast<RankedTensorType>(adaptor.getInput().getType());
  ArrayRef<int64_t> start = adaptor.getStart(), limit = adaptor.getLimit(),
                    stride = adaptor.getStride();
  int64_t rank = in.getRank();
  if (static_cast<int64_t>(start.size()) != rank ||
      static_cast<int64_t>(limit.size()) != rank ||
      static_cast<int64_t>(stride.size()) != rank)
    return INFER_ERROR("expects start, limit and stride of " << rank
                       << " entries (the input rank), got " << start.size()
                       << ", " << limit.size() << " and " << stride.size());
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t size = in.getDimSize(d);
    if (start[d] < 0 || start[d] > limit[d] || limit[d] > size)
      return INFER_ERROR("expects 0 <= start <= limit <= " << size
                         << " in dim " << d << ", got start = " << start[d]
                         << " and limit = " << limit[d]);
    if (stride[d] < 1)
      return INFER_ERROR("expects stride >= 1 in dim " << d << ", got "
                                                        << stride[d]);
    shape.push_back((limit[d] - start[d] + stride[d] - 1) / stride[d]);
  }
  types.push_back(RankedTensorType::get(shape, in.getElementType()));
  return success();
}

OpFoldResult SliceOp::fold(FoldAdaptor) {
  if (getInput().getType() != getType())
    return {};
  for (auto [s, st] : llvm::zip(getStart(), getStride()))
    if (s != 0 || st != 1)
      return {};
  return getInput();
}

LogicalResult GatherOp::inferReturnTypes(MLIRContext *context,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  StringRef opName = getOperationName();
  auto table = cast<RankedTensorType>(adaptor.getTable().getType());
  auto ids = cast<RankedTensorType>(adaptor.getIds().getType());
  if (table.getRank() < 1)
    return INFER_ERROR("expects a table of rank >= 1, got rank 0");
  SmallVector<int64_t> shape(ids.getShape());
  llvm::append_range(shape, table.getShape().drop_front());
  types.push_back(RankedTensorType::get(shape, table.getElementType()));
  return success();
}

LogicalResult IotaOp::verify() {
  int64_t rank = getType().getRank();
  if (normalizeDim(getDim(), rank) < 0)
    return emitOpError("expects dim in [")
           << -rank << ", " << rank << "), got " << getDim();
  return success();
}

//===----------------------------------------------------------------------===//
// NN ops
//===----------------------------------------------------------------------===//

template <typename OpTy> static LogicalResult verifyDimAttr(OpTy op) {
  int64_t rank = op.getType().getRank();
  if (normalizeDim(op.getDim(), rank) < 0)
    return op.emitOpError("expects dim in [")
           << -rank << ", " << rank << "), got " << op.getDim();
  return success();
}

LogicalResult SoftmaxOp::verify() { return verifyDimAttr(*this); }
LogicalResult LogSoftmaxOp::verify() { return verifyDimAttr(*this); }

/// Checks a norm's axis, epsilon and affine operands' shapes.
static LogicalResult verifyNorm(Operation *op, RankedTensorType in,
                                int64_t axis, double eps,
                                ArrayRef<std::pair<StringRef, Value>> affine) {
  int64_t rank = in.getRank();
  int64_t a = normalizeDim(axis, rank);
  if (a < 0)
    return op->emitOpError("expects axis in [")
           << -rank << ", " << rank << "), got " << axis;
  if (!(eps >= 0))
    return op->emitOpError("expects eps >= 0, got ") << eps;
  ArrayRef<int64_t> expected = in.getShape().drop_front(a);
  for (auto [name, v] : affine) {
    if (!v)
      continue;
    auto t = cast<RankedTensorType>(v.getType());
    if (t.getShape() != expected || t.getElementType() != in.getElementType())
      return op->emitOpError("expects ")
             << name << " of type "
             << RankedTensorType::get(expected, in.getElementType())
             << " (the input's dims from axis " << a << "), got " << t;
  }
  return success();
}

LogicalResult LayerNormOp::verify() {
  return verifyNorm(*this, getInput().getType(), getAxis(),
                    getEps().convertToDouble(),
                    {{"weight", getWeight()}, {"bias", getBias()}});
}

LogicalResult RMSNormOp::verify() {
  return verifyNorm(*this, getInput().getType(), getAxis(),
                    getEps().convertToDouble(), {{"weight", getWeight()}});
}

LogicalResult AttentionOp::inferReturnTypes(MLIRContext *context,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  StringRef opName = getOperationName();
  auto q = cast<RankedTensorType>(adaptor.getQuery().getType());
  auto k = cast<RankedTensorType>(adaptor.getKey().getType());
  auto v = cast<RankedTensorType>(adaptor.getValue().getType());
  for (auto [name, t] : {std::pair<StringRef, RankedTensorType>{"query", q},
                         {"key", k}, {"value", v}})
    if (t.getRank() != 4)
      return INFER_ERROR("expects " << name
                                    << " of rank 4 [batch, heads, seq, dim], got "
                                    << t);
  if (k.getElementType() != q.getElementType() ||
      v.getElementType() != q.getElementType())
    return INFER_ERROR("expects query, key and value of the same element type");
  if (k.getDimSize(0) != q.getDimSize(0) || v.getDimSize(0) != q.getDimSize(0))
    return INFER_ERROR("expects the same batch size, got "
                       << q.getDimSize(0) << ", " << k.getDimSize(0) << " and "
                       << v.getDimSize(0));
  if (k.getDimSize(1) != v.getDimSize(1) || k.getDimSize(2) != v.getDimSize(2))
    return INFER_ERROR("expects key and value with the same heads and length, got "
                       << k << " and " << v);
  if (q.getDimSize(1) % k.getDimSize(1) != 0)
    return INFER_ERROR("expects query heads (" << q.getDimSize(1)
                       << ") to be a multiple of key/value heads ("
                       << k.getDimSize(1) << ")");
  if (k.getDimSize(3) != q.getDimSize(3))
    return INFER_ERROR("expects key head dim " << k.getDimSize(3)
                       << " to equal query head dim " << q.getDimSize(3));
  if (adaptor.getCausal() && k.getDimSize(2) < q.getDimSize(2))
    return INFER_ERROR("expects causal attention with at least as many keys ("
                       << k.getDimSize(2) << ") as queries (" << q.getDimSize(2)
                       << ")");
  if (auto scale = adaptor.getScale())
    if (!(scale->convertToDouble() > 0))
      return INFER_ERROR("expects scale > 0, got " << scale->convertToDouble());
  if (Value o = adaptor.getQueryOffset())
    if (cast<RankedTensorType>(o.getType()).getRank() != 0)
      return INFER_ERROR("expects a rank-0 offset, got " << o.getType());
  types.push_back(RankedTensorType::get(
      {q.getDimSize(0), q.getDimSize(1), q.getDimSize(2), v.getDimSize(3)},
      q.getElementType()));
  return success();
}

/// An optional position offset must be one integer (rank 0).
static LogicalResult verifyOffset(Operation *op, Value offset) {
  if (offset && cast<RankedTensorType>(offset.getType()).getRank() != 0)
    return op->emitOpError("expects a rank-0 offset, got ") << offset.getType();
  return success();
}

LogicalResult RopeOp::verify() {
  if (failed(verifyOffset(*this, getOffset())))
    return failure();
  auto t = getType();
  if (t.getRank() < 2 || t.getDimSize(t.getRank() - 1) % 2 != 0)
    return emitOpError("expects rank >= 2 and an even last dim, got ") << t;
  if (!(getTheta().convertToDouble() > 0))
    return emitOpError("expects theta > 0, got ")
           << getTheta().convertToDouble();
  return success();
}

/// Output size of a sliding window (conv or pool) along one dim.
static int64_t windowOut(int64_t in, int64_t k, int64_t s, int64_t p,
                         int64_t d) {
  int64_t span = in + 2 * p - d * (k - 1) - 1;
  return span < 0 ? 0 : span / s + 1;
}

LogicalResult Conv2DOp::inferReturnTypes(MLIRContext *context,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  StringRef opName = getOperationName();
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  auto w = cast<RankedTensorType>(adaptor.getFilter().getType());
  if (x.getRank() != 4 || w.getRank() != 4)
    return INFER_ERROR("expects input [N, C, H, W] and filter [O, C/groups, KH, KW] of rank 4, got "
                       << x << " and " << w);
  if (x.getElementType() != w.getElementType())
    return INFER_ERROR("expects input and filter of the same element type");
  ArrayRef<int64_t> stride = adaptor.getStride(), pad = adaptor.getPadding(),
                    dil = adaptor.getDilation();
  if (stride.size() != 2 || pad.size() != 2 || dil.size() != 2)
    return INFER_ERROR("expects stride, padding and dilation of 2 entries");
  for (int i = 0; i < 2; ++i)
    if (stride[i] < 1 || dil[i] < 1 || pad[i] < 0)
      return INFER_ERROR("expects stride >= 1, dilation >= 1, padding >= 0, got stride "
                         << shapeStr(stride) << ", padding " << shapeStr(pad)
                         << ", dilation " << shapeStr(dil));
  int64_t groups = adaptor.getGroups();
  int64_t c = x.getDimSize(1), o = w.getDimSize(0);
  if (groups < 1 || c % groups || o % groups)
    return INFER_ERROR("expects groups (" << groups
                       << ") >= 1 dividing input channels (" << c
                       << ") and output channels (" << o << ")");
  if (w.getDimSize(1) != c / groups)
    return INFER_ERROR("expects filter dim 1 = channels / groups = "
                       << c / groups << ", got " << w.getDimSize(1));
  if (Value bias = adaptor.getBias()) {
    auto b = cast<RankedTensorType>(bias.getType());
    if (b.getShape() != ArrayRef<int64_t>{o} ||
        b.getElementType() != x.getElementType())
      return INFER_ERROR("expects bias of type "
                         << RankedTensorType::get({o}, x.getElementType())
                         << ", got " << b);
  }
  int64_t oh = windowOut(x.getDimSize(2), w.getDimSize(2), stride[0], pad[0], dil[0]);
  int64_t ow = windowOut(x.getDimSize(3), w.getDimSize(3), stride[1], pad[1], dil[1]);
  if (oh < 1 || ow < 1)
    return INFER_ERROR("gives an empty output: the dilated filter is larger than the padded input");
  types.push_back(RankedTensorType::get({x.getDimSize(0), o, oh, ow},
                                        x.getElementType()));
  return success();
}

template <typename Adaptor>
static LogicalResult inferPool(std::optional<Location> loc, StringRef opName,
                               Adaptor adaptor, SmallVectorImpl<Type> &types) {
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  if (x.getRank() != 4)
    return INFER_ERROR("expects input [N, C, H, W] of rank 4, got " << x);
  ArrayRef<int64_t> kernel = adaptor.getKernel();
  SmallVector<int64_t> stride(kernel);
  if (auto s = adaptor.getStride())
    stride.assign(s->begin(), s->end());
  ArrayRef<int64_t> pad = adaptor.getPadding();
  if (kernel.size() != 2 || stride.size() != 2 || pad.size() != 2)
    return INFER_ERROR("expects kernel, stride and padding of 2 entries");
  for (int i = 0; i < 2; ++i) {
    if (kernel[i] < 1 || stride[i] < 1 || pad[i] < 0)
      return INFER_ERROR("expects kernel >= 1, stride >= 1, padding >= 0, got kernel "
                         << shapeStr(kernel) << ", stride " << shapeStr(stride)
                         << ", padding " << shapeStr(pad));
    if (2 * pad[i] > kernel[i])
      return INFER_ERROR("expects padding at most half the kernel, got padding "
                         << pad[i] << " for kernel " << kernel[i]);
  }
  int64_t oh = windowOut(x.getDimSize(2), kernel[0], stride[0], pad[0], 1);
  int64_t ow = windowOut(x.getDimSize(3), kernel[1], stride[1], pad[1], 1);
  if (oh < 1 || ow < 1)
    return INFER_ERROR("gives an empty output: the kernel is larger than the padded input");
  types.push_back(RankedTensorType::get(
      {x.getDimSize(0), x.getDimSize(1), oh, ow}, x.getElementType()));
  return success();
}

LogicalResult MaxPool2DOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  return inferPool(loc, getOperationName(), adaptor, types);
}

LogicalResult AvgPool2DOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  return inferPool(loc, getOperationName(), adaptor, types);
}

LogicalResult BatchNormOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  StringRef opName = getOperationName();
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  if (x.getRank() < 2)
    return INFER_ERROR("expects input [N, C, ...] of rank >= 2, got " << x);
  auto stat = RankedTensorType::get({x.getDimSize(1)}, x.getElementType());
  for (auto [name, v] : {std::pair<StringRef, Value>{"weight", adaptor.getWeight()},
                         {"bias", adaptor.getBias()},
                         {"running_mean", adaptor.getRunningMean()},
                         {"running_var", adaptor.getRunningVar()}})
    if (v.getType() != stat)
      return INFER_ERROR("expects " << name << " of type " << stat << ", got "
                                    << v.getType());
  double momentum = adaptor.getMomentum().convertToDouble();
  if (!(momentum >= 0 && momentum <= 1))
    return INFER_ERROR("expects momentum in [0, 1], got " << momentum);
  if (!(adaptor.getEps().convertToDouble() >= 0))
    return INFER_ERROR("expects eps >= 0, got "
                       << adaptor.getEps().convertToDouble());
  types.push_back(x);
  types.push_back(stat);
  types.push_back(stat);
  return success();
}

LogicalResult SendRecvOp::verify() {
  if (getInputs().empty() && getResults().empty())
    return emitOpError("expects at least one tensor to send or receive");
  if (getTo().size() != getInputs().size())
    return emitOpError("expects one 'to' coordinate per sent tensor: ")
           << getInputs().size() << " tensors, " << getTo().size()
           << " coordinates";
  if (getFrom().size() != getResults().size())
    return emitOpError("expects one 'from' coordinate per received tensor: ")
           << getResults().size() << " tensors, " << getFrom().size()
           << " coordinates";
  for (int64_t c : getTo())
    if (c < 0)
      return emitOpError("expects 'to' coordinates >= 0, got ") << c;
  for (int64_t c : getFrom())
    if (c < 0)
      return emitOpError("expects 'from' coordinates >= 0, got ") << c;
  if (getAxis().empty())
    return emitOpError("expects a mesh axis name");
  return success();
}

LogicalResult DropoutOp::verify() {
  double rate = getRate().convertToDouble();
  if (!(rate >= 0 && rate < 1))
    return emitOpError("expects rate in [0, 1), got ") << rate;
  if (Value offset = getOffset()) {
    auto t = cast<RankedTensorType>(offset.getType());
    if (t.getRank() != 0)
      return emitOpError("expects offset to be a rank-0 integer tensor, got ")
             << t;
  }
  return success();
}

OpFoldResult DropoutOp::fold(FoldAdaptor) {
  if (getRate().isZero())
    return getInput();
  return {};
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

LogicalResult CrossEntropyOp::inferReturnTypes(MLIRContext *,
                                               std::optional<Location> loc,
                                               Adaptor adaptor,
                                               SmallVectorImpl<Type> &types) {
  StringRef opName = getOperationName();
  auto logits = cast<RankedTensorType>(adaptor.getLogits().getType());
  auto labels = cast<RankedTensorType>(adaptor.getLabels().getType());
  if (logits.getRank() != 2)
    return INFER_ERROR("expects logits [N, C] of rank 2, got " << logits);
  if (labels.getRank() != 1 || labels.getDimSize(0) != logits.getDimSize(0))
    return INFER_ERROR("expects labels of shape [" << logits.getDimSize(0)
                                                   << "] (one per row), got "
                                                   << labels);
  types.push_back(RankedTensorType::get({}, logits.getElementType()));
  return success();
}

bool CrossEntropyOp::isCompatibleReturnTypes(TypeRange inferred,
                                             TypeRange actual) {
  if (inferred.size() != 1 || actual.size() != 1)
    return false;
  if (inferred[0] == actual[0])
    return true;
  auto t = dyn_cast<RankedTensorType>(actual[0]);
  return t && t.getRank() == 0 && t.getElementType().isF32();
}

LogicalResult MSEOp::inferReturnTypes(MLIRContext *,
                                      std::optional<Location> loc,
                                      Adaptor adaptor,
                                      SmallVectorImpl<Type> &types) {
  StringRef opName = getOperationName();
  Type a = adaptor.getLhs().getType(), b = adaptor.getRhs().getType();
  if (a != b)
    return INFER_ERROR("expects operands of the same type, got " << a
                                                                  << " and " << b);
  types.push_back(
      RankedTensorType::get({}, cast<RankedTensorType>(a).getElementType()));
  return success();
}


//===----------------------------------------------------------------------===//
// Gradient ops
//===----------------------------------------------------------------------===//

/// Emits "expects <what> of type <expected>, got <actual>" unless equal.
static LogicalResult expectType(Operation *op, StringRef what, Type expected,
                                Type actual) {
  if (expected == actual)
    return success();
  return op->emitOpError("expects ")
         << what << " of type " << expected << ", got " << actual;
}

LogicalResult ScatterAddOp::verify() {
  auto ids = getIds().getType();
  auto upd = getUpdates().getType();
  auto res = getType();
  if (res.getRank() < 1)
    return emitOpError("expects a result of rank >= 1, got ") << res;
  SmallVector<int64_t> expected(ids.getShape());
  llvm::append_range(expected, res.getShape().drop_front());
  return expectType(*this, "updates",
                    RankedTensorType::get(expected, res.getElementType()), upd);
}

template <typename OpTy> static LogicalResult verifySoftmaxGrad(OpTy op) {
  return verifyDimAttr(op);
}
LogicalResult SoftmaxGradOp::verify() { return verifySoftmaxGrad(*this); }
LogicalResult LogSoftmaxGradOp::verify() { return verifySoftmaxGrad(*this); }

/// Checks a norm gradient: grad and input_grad match input, the parameter
/// gradients are shaped like the normalized dims.
static LogicalResult verifyNormGrad(Operation *op, RankedTensorType in,
                                    Value grad, int64_t axis, double eps,
                                    Value weight, ValueRange paramGrads) {
  if (failed(verifyNorm(op, in, axis, eps, {{"weight", weight}})))
    return failure();
  if (failed(expectType(op, "grad", in, grad.getType())) ||
      failed(expectType(op, "input_grad", in, op->getResult(0).getType())))
    return failure();
  auto stat = RankedTensorType::get(
      in.getShape().drop_front(normalizeDim(axis, in.getRank())),
      in.getElementType());
  for (Value g : paramGrads)
    if (failed(expectType(op, "parameter gradient", stat, g.getType())))
      return failure();
  return success();
}

LogicalResult LayerNormGradOp::verify() {
  return verifyNormGrad(*this, getInput().getType(), getGrad(), getAxis(),
                        getEps().convertToDouble(), getWeight(),
                        {getWeightGrad(), getBiasGrad()});
}

LogicalResult RMSNormGradOp::verify() {
  return verifyNormGrad(*this, getInput().getType(), getGrad(), getAxis(),
                        getEps().convertToDouble(), getWeight(),
                        {getWeightGrad()});
}

LogicalResult AttentionGradOp::verify() {
  if (failed(verifyOffset(*this, getQueryOffset())))
    return failure();
  SmallVector<Type> forward;
  StringRef opName = getOperationName();
  std::optional<Location> loc = getLoc();
  auto q = getQuery().getType(), k = getKey().getType(),
       v = getValue().getType();
  if (q.getRank() != 4 || k.getRank() != 4 || v.getRank() != 4)
    return INFER_ERROR("expects query, key and value of rank 4");
  if (q.getDimSize(1) % k.getDimSize(1) != 0 || k.getShape().drop_back() != v.getShape().drop_back() ||
      k.getDimSize(3) != q.getDimSize(3) || k.getDimSize(0) != q.getDimSize(0))
    return INFER_ERROR("expects query, key and value shaped as for dlopt.attention, got "
                       << q << ", " << k << " and " << v);
  auto out = RankedTensorType::get({q.getDimSize(0), q.getDimSize(1),
                                    q.getDimSize(2), v.getDimSize(3)},
                                   q.getElementType());
  if (failed(expectType(*this, "grad", out, getGrad().getType())) ||
      failed(expectType(*this, "query_grad", q, getQueryGrad().getType())) ||
      failed(expectType(*this, "key_grad", k, getKeyGrad().getType())) ||
      failed(expectType(*this, "value_grad", v, getValueGrad().getType())))
    return failure();
  return success();
}

/// Computes conv2d's output type for (input, filter) or fails with a message.
static FailureOr<RankedTensorType>
convForwardType(Operation *op, RankedTensorType x, RankedTensorType w,
                ArrayRef<int64_t> stride, ArrayRef<int64_t> pad,
                ArrayRef<int64_t> dil, int64_t groups) {
  if (x.getRank() != 4 || w.getRank() != 4)
    return op->emitOpError("expects rank-4 input and filter, got ")
           << x << " and " << w;
  if (stride.size() != 2 || pad.size() != 2 || dil.size() != 2)
    return op->emitOpError("expects stride, padding and dilation of 2 entries");
  for (int i = 0; i < 2; ++i)
    if (stride[i] < 1 || dil[i] < 1 || pad[i] < 0)
      return op->emitOpError("expects stride >= 1, dilation >= 1, padding >= 0");
  int64_t c = x.getDimSize(1), o = w.getDimSize(0);
  if (groups < 1 || c % groups || o % groups || w.getDimSize(1) != c / groups)
    return op->emitOpError("expects groups (")
           << groups << ") dividing channels " << c << " and " << o
           << " with filter dim 1 = " << c / std::max<int64_t>(groups, 1)
           << ", got " << w.getDimSize(1);
  int64_t oh = windowOut(x.getDimSize(2), w.getDimSize(2), stride[0], pad[0], dil[0]);
  int64_t ow = windowOut(x.getDimSize(3), w.getDimSize(3), stride[1], pad[1], dil[1]);
  return RankedTensorType::get({x.getDimSize(0), o, oh, ow}, x.getElementType());
}

LogicalResult Conv2DGradInputOp::verify() {
  auto dy = getLhs().getType(), w = getRhs().getType(), dx = getType();
  FailureOr<RankedTensorType> fwd = convForwardType(
      *this, dx, w, getStride(), getPadding(), getDilation(), getGroups());
  if (failed(fwd))
    return failure();
  return expectType(*this, "grad (the conv2d output of this input and filter)",
                    *fwd, dy);
}

LogicalResult Conv2DGradFilterOp::verify() {
  auto x = getLhs().getType(), dy = getRhs().getType(), dw = getType();
  FailureOr<RankedTensorType> fwd = convForwardType(
      *this, x, dw, getStride(), getPadding(), getDilation(), getGroups());
  if (failed(fwd))
    return failure();
  return expectType(*this, "grad (the conv2d output of this input and filter)",
                    *fwd, dy);
}

/// Checks a pool gradient's output-gradient type against the forward rule.
template <typename OpTy>
static LogicalResult verifyPoolGrad(OpTy op, RankedTensorType input,
                                    Type grad) {
  std::optional<Location> loc = op.getLoc();
  StringRef opName = op.getOperationName();
  if (input.getRank() != 4)
    return INFER_ERROR("expects an input of rank 4, got " << input);
  ArrayRef<int64_t> kernel = op.getKernel();
  SmallVector<int64_t> stride(kernel);
  if (auto s = op.getStride())
    stride.assign(s->begin(), s->end());
  ArrayRef<int64_t> pad = op.getPadding();
  if (kernel.size() != 2 || stride.size() != 2 || pad.size() != 2)
    return INFER_ERROR("expects kernel, stride and padding of 2 entries");
  for (int i = 0; i < 2; ++i)
    if (kernel[i] < 1 || stride[i] < 1 || pad[i] < 0 || 2 * pad[i] > kernel[i])
      return INFER_ERROR("expects kernel >= 1, stride >= 1 and 0 <= padding <= kernel/2");
  auto out = RankedTensorType::get(
      {input.getDimSize(0), input.getDimSize(1),
       windowOut(input.getDimSize(2), kernel[0], stride[0], pad[0], 1),
       windowOut(input.getDimSize(3), kernel[1], stride[1], pad[1], 1)},
      input.getElementType());
  return expectType(op, "grad (the pooled shape)", out, grad);
}

LogicalResult MaxPool2DGradOp::verify() {
  return verifyPoolGrad(*this, getInput().getType(), getGrad().getType());
}

LogicalResult AvgPool2DGradOp::verify() {
  return verifyPoolGrad(*this, getType(), getGrad().getType());
}

LogicalResult BatchNormGradOp::verify() {
  auto x = getInput().getType();
  if (x.getRank() < 2)
    return emitOpError("expects input [N, C, ...] of rank >= 2, got ") << x;
  auto stat = RankedTensorType::get({x.getDimSize(1)}, x.getElementType());
  if (failed(expectType(*this, "weight", stat, getWeight().getType())) ||
      failed(expectType(*this, "running_mean", stat, getRunningMean().getType())) ||
      failed(expectType(*this, "running_var", stat, getRunningVar().getType())) ||
      failed(expectType(*this, "grad", x, getGrad().getType())) ||
      failed(expectType(*this, "input_grad", x, getInputGrad().getType())) ||
      failed(expectType(*this, "weight_grad", stat, getWeightGrad().getType())) ||
      failed(expectType(*this, "bias_grad", stat, getBiasGrad().getType())))
    return failure();
  return success();
}

LogicalResult CrossEntropyGradOp::verify() {
  auto logits = getLogits().getType();
  auto labels = getLabels().getType();
  if (logits.getRank() != 2)
    return emitOpError("expects logits [N, C] of rank 2, got ") << logits;
  if (labels.getRank() != 1 || labels.getDimSize(0) != logits.getDimSize(0))
    return emitOpError("expects labels of shape [")
           << logits.getDimSize(0) << "], got " << labels;
  auto grad = cast<RankedTensorType>(getGrad().getType());
  if (!(grad.getRank() == 0 && grad.getElementType().isF32()) &&
      failed(expectType(*this, "grad",
                        RankedTensorType::get({}, logits.getElementType()),
                        grad)))
    return failure();
  return expectType(*this, "result", logits, getType());
}

LogicalResult GeluGradOp::verify() {
  if (getApproximate() != "none" && getApproximate() != "tanh")
    return emitOpError("expects approximate = \"none\" or \"tanh\", got \"")
           << getApproximate() << "\"";
  return success();
}

LogicalResult SliceGradOp::verify() {
  SmallVector<Type> types;
  if (failed(SliceOp::inferReturnTypes(getContext(), getLoc(),
                                       SliceOp::Adaptor({getResult()}, {},
                                           [&] {
                                             SliceOp::Properties p;
                                             p.start = getStartAttr();
                                             p.limit = getLimitAttr();
                                             p.stride = getStrideAttr();
                                             return p;
                                           }()),
                                       types)))
    return failure();
  return expectType(*this, "grad (the sliced shape)", types[0],
                    getGrad().getType());
}

//===----------------------------------------------------------------------===//
// FusedElementwiseOp
//===----------------------------------------------------------------------===//

static bool isFloatTensor(Type t) {
  auto rt = dyn_cast<RankedTensorType>(t);
  return rt && isa<Float32Type, Float16Type, BFloat16Type>(rt.getElementType());
}

static bool isBoolTensor(Type t) {
  auto rt = dyn_cast<RankedTensorType>(t);
  return rt && rt.getElementType().isInteger(1);
}

bool FusedElementwiseOp::isFusible(Operation *op) {
  // compare (float operands, an i1 result) and select (an i1 condition,
  // float values) carry their i1 values inside the group only: the fused
  // program's registers are f32 (1.0/0.0 for a comparison), and every input
  // and result of the group is a float tensor.
  if (auto cmp = dyn_cast<CompareOp>(op))
    return isFloatTensor(cmp.getLhs().getType()) &&
           isFloatTensor(cmp.getRhs().getType()) &&
           isBoolTensor(cmp.getType());
  if (auto sel = dyn_cast<SelectOp>(op))
    return isBoolTensor(sel.getCond().getType()) &&
           isFloatTensor(sel.getTrueValue().getType()) &&
           isFloatTensor(sel.getFalseValue().getType()) &&
           isFloatTensor(sel.getType());
  if (!isa<NegOp, AbsOp, ReluOp, ExpOp, LogOp, SqrtOp, RsqrtOp, TanhOp, SinOp,
           CosOp, SigmoidOp, SiluOp, GeluOp, CastOp, AddOp, SubOp, MulOp,
           DivOp, MaximumOp, MinimumOp, PowOp>(op))
    return false;
  for (Type t : op->getOperandTypes())
    if (!isFloatTensor(t))
      return false;
  for (Type t : op->getResultTypes())
    if (!isFloatTensor(t))
      return false;
  return true;
}

LogicalResult FusedElementwiseOp::verify() {
  if (getNumResults() == 0)
    return emitOpError("expects at least one result");
  int64_t n = getNumSegments();
  if (getInputs().size() % n != 0 || getNumResults() % n != 0)
    return emitOpError("expects the inputs (")
           << getInputs().size() << ") and results (" << getNumResults()
           << ") to split evenly into " << n << " segments";
  int64_t k = getInputs().size() / n, numR = getNumResults() / n;
  for (int64_t s = 0; s < n; ++s) {
    int64_t first = s * numR;
    ArrayRef<int64_t> shape =
        cast<RankedTensorType>(getResult(first).getType()).getShape();
    for (int64_t j = 0; j < numR; ++j) {
      auto t = cast<RankedTensorType>(getResult(first + j).getType());
      if (t.getShape() != shape)
        return emitOpError("expects every result to have the fused shape of "
                           "result #")
               << first << " (" << getResult(first).getType() << "), got "
               << t << " for result #" << first + j;
      Type t0 = cast<RankedTensorType>(getResult(j).getType()).getElementType();
      if (t.getElementType() != t0)
        return emitOpError("expects result #")
               << first + j << " to have the element type of result #" << j
               << " (" << t0 << "), got " << t;
    }
    for (int64_t i = 0; i < k; ++i) {
      auto rt = cast<RankedTensorType>(getInputs()[s * k + i].getType());
      if (rt.getRank() != 0 && rt.getShape() != shape)
        return emitOpError("expects input #")
               << s * k + i << " to have the fused shape or rank 0, got "
               << rt;
      auto r0 = cast<RankedTensorType>(getInputs()[i].getType());
      if (rt.getElementType() != r0.getElementType() ||
          (rt.getRank() == 0) != (r0.getRank() == 0))
        return emitOpError("expects input #")
               << s * k + i << " to have the element type and rank-0-ness "
               << "of input #" << i << " (" << r0 << "), got " << rt;
    }
  }
  return success();
}

LogicalResult FusedElementwiseOp::verifyRegions() {
  Block &body = getBody().front();
  size_t numArgs = getInputs().size() / getNumSegments();
  if (body.getNumArguments() != numArgs)
    return emitOpError("expects the body to have one argument per input (")
           << numArgs << "), got " << body.getNumArguments();
  for (auto [i, arg] : llvm::enumerate(body.getArguments()))
    if (arg.getType() != getInputs()[i].getType())
      return emitOpError("expects body argument #")
             << i << " to have the type of input #" << i << " ("
             << getInputs()[i].getType() << "), got " << arg.getType();
  ArrayRef<int64_t> shape = getFusedShape();
  for (Operation &op : body.without_terminator()) {
    if (auto cst = dyn_cast<arith::ConstantOp>(op)) {
      auto t = dyn_cast<RankedTensorType>(cst.getType());
      auto dense = dyn_cast<DenseElementsAttr>(cst.getValue());
      if (!t || t.getRank() != 0 || !isFloatTensor(t) || !dense) {
        InFlightDiagnostic d = op.emitOpError("in a fused group expects a "
                                              "rank-0 float tensor constant, "
                                              "got ")
                               << cst.getType();
        d.attachNote(getLoc()) << "in this group";
        return d;
      }
      continue;
    }
    if (!isFusible(&op)) {
      InFlightDiagnostic d = op.emitOpError(
          "cannot be fused: expects a float elementwise dlopt op (neg, abs, "
          "relu, exp, log, sqrt, rsqrt, tanh, sin, cos, sigmoid, silu, gelu, "
          "cast, add, sub, mul, div, maximum, minimum, pow), a compare of "
          "floats or a select of floats");
      d.attachNote(getLoc()) << "in this group";
      return d;
    }
    for (Type t : op.getResultTypes())
      if (cast<RankedTensorType>(t).getShape() != shape) {
        InFlightDiagnostic d = op.emitOpError("in a fused group expects a "
                                              "result of the fused shape ")
                               << RankedTensorType::get(
                                      shape,
                                      cast<RankedTensorType>(t).getElementType())
                               << ", got " << t;
        d.attachNote(getLoc()) << "in this group";
        return d;
      }
  }
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield)
    return emitOpError("expects the body to end in dlopt.yield");
  TypeRange segTypes = getSegmentResults(0).getTypes();
  if (yield.getValues().getTypes() != segTypes)
    return yield.emitOpError("expects the types of the group's results (")
           << segTypes << "), got (" << yield.getValues().getTypes() << ")";
  return success();
}

#define GET_OP_CLASSES
#include "dialects/DLOpt/IR/DLOptOps.cpp.inc"
