//===- OpTable.cpp - The runtime's operations and their verifier ---------===//
//
// One verify function per op (or family). Each checks what every backend
// relies on: the operand and result counts, element types, shapes, and the
// attributes' presence, types and ranges. The semantics are in docs/ops.md.
//
//===----------------------------------------------------------------------===//

#include "runtime/format/OpTable.h"
#include "runtime/format/FusedProgram.h"

#include <algorithm>
#include <climits>
#include <cmath>

namespace dlopt::rt {
namespace {

using Ins = TypeSpan;
using Outs = TypeSpan;

Status arity(const Instr &instr, Ins ins, Outs outs, size_t numIns,
             size_t numOuts) {
  return checkArity(instr, ins.size(), outs.size(), numIns, numIns, numOuts);
}
Status arityRange(const Instr &instr, Ins ins, Outs outs, size_t minIns,
                  size_t maxIns, size_t numOuts) {
  return checkArity(instr, ins.size(), outs.size(), minIns, maxIns, numOuts);
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

/// neg, abs and relu take ints too; the others are float only.
template <bool IntOk> Status verifyUnary(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 1, 1));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result", outs[0], ins[0]));
  return IntOk ? checkNumeric(instr, "operand #0", ins[0])
               : checkFloat(instr, "operand #0", ins[0]);
}

Status verifyApproximate(const Instr &instr) {
  std::string approx = "none";
  DLOPT_RETURN_IF_ERROR(getOptStringAttr(instr, "approximate", approx));
  if (approx != "none" && approx != "tanh")
    return opError(instr, "expects attribute 'approximate' to be \"none\" or "
                          "\"tanh\", got \"" +
                              approx + "\"");
  return Status::ok();
}

Status verifyGelu(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(verifyUnary<false>(instr, ins, outs));
  return verifyApproximate(instr);
}

Status verifyCast(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 1, 1));
  return checkShape(instr, "result", outs[0].shape, ins[0].shape);
}

/// Operand/result shapes of a broadcasting binary op.
Status verifyBroadcastBinary(const Instr &instr, Ins ins, Outs outs) {
  if (ins[0].dtype != ins[1].dtype)
    return opError(instr, "expects operands of the same element type, got " +
                              typeStr(ins[0]) + " and " + typeStr(ins[1]));
  std::vector<int64_t> shape;
  if (!broadcastShapes(ins[0].shape, ins[1].shape, shape))
    return opError(instr, "operand shapes " + shapeStr(ins[0].shape) +
                              " and " + shapeStr(ins[1].shape) +
                              " do not broadcast");
  return checkShape(instr, "result", outs[0].shape, shape);
}

template <bool FloatOnly>
Status verifyBinary(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 2, 1));
  DLOPT_RETURN_IF_ERROR(verifyBroadcastBinary(instr, ins, outs));
  DLOPT_RETURN_IF_ERROR(FloatOnly ? checkFloat(instr, "operand #0", ins[0])
                                  : checkNumeric(instr, "operand #0", ins[0]));
  return checkDType(instr, "result", outs[0].dtype, ins[0].dtype);
}

Status verifyCompare(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 2, 1));
  DLOPT_RETURN_IF_ERROR(verifyBroadcastBinary(instr, ins, outs));
  DLOPT_RETURN_IF_ERROR(checkNumeric(instr, "operand #0", ins[0]));
  DLOPT_RETURN_IF_ERROR(checkDType(instr, "result", outs[0].dtype, DType::I1));
  std::string pred;
  DLOPT_RETURN_IF_ERROR(getOptStringAttr(instr, "predicate", pred));
  for (const char *p : {"eq", "ne", "lt", "le", "gt", "ge"})
    if (pred == p)
      return Status::ok();
  return opError(instr, "expects attribute 'predicate' to be one of eq, ne, "
                        "lt, le, gt, ge, got '" +
                            pred + "'");
}

Status verifySelect(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 3, 1));
  DLOPT_RETURN_IF_ERROR(
      checkDType(instr, "operand #0", ins[0].dtype, DType::I1));
  if (ins[1].dtype != ins[2].dtype)
    return opError(instr, "expects operands #1 and #2 of the same element "
                          "type, got " +
                              typeStr(ins[1]) + " and " + typeStr(ins[2]));
  DLOPT_RETURN_IF_ERROR(
      checkDType(instr, "result", outs[0].dtype, ins[1].dtype));
  std::vector<int64_t> s01, shape;
  if (!broadcastShapes(ins[0].shape, ins[1].shape, s01) ||
      !broadcastShapes(s01, ins[2].shape, shape))
    return opError(instr, "operand shapes " + shapeStr(ins[0].shape) + ", " +
                              shapeStr(ins[1].shape) + " and " +
                              shapeStr(ins[2].shape) + " do not broadcast");
  return checkShape(instr, "result", outs[0].shape, shape);
}

Status verifyFused(const Instr &instr, Ins ins, Outs outs) {
  std::vector<TensorType> ot(ins.begin(), ins.end()), rt(outs.begin(),
                                                          outs.end());
  auto decoded = fused::decode(instr, ot, rt);
  if (!decoded)
    return opError(instr, decoded.status().message());
  return Status::ok();
}

Status verifyGeluGrad(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 2, 1));
  const TensorType &t = ins[0];
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "operand #0 (x)", t));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "operand #1 (dy)", ins[1], t));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result", outs[0], t));
  return verifyApproximate(instr);
}

Status verifyDropout(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arityRange(instr, ins, outs, 1, 2, 1));
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "operand #0", ins[0]));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result", outs[0], ins[0]));
  double rate = 0;
  int64_t seed = 0;
  DLOPT_RETURN_IF_ERROR(getFloatAttr(instr, "rate", rate));
  DLOPT_RETURN_IF_ERROR(getOptIntAttr(instr, "seed", seed));
  if (!(rate >= 0.0 && rate < 1.0))
    return opError(instr,
                   "expects 'rate' in [0, 1), got " + std::to_string(rate));
  if (ins.size() == 2)
    return checkScalarInt(instr, "operand #1 (offset)", ins[1]);
  return Status::ok();
}

//===----------------------------------------------------------------------===//
// Reductions and matmul
//===----------------------------------------------------------------------===//

template <bool FloatOnly>
Status verifyReduce(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 1, 1));
  const TensorType &in = ins[0];
  DLOPT_RETURN_IF_ERROR(FloatOnly ? checkFloat(instr, "operand #0", in)
                                  : checkNumeric(instr, "operand #0", in));
  DLOPT_RETURN_IF_ERROR(checkDType(instr, "result", outs[0].dtype, in.dtype));
  std::vector<int64_t> dims;
  DLOPT_RETURN_IF_ERROR(getIntsAttr(instr, "dims", dims));
  bool keepdims = false;
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(instr, "keepdims", keepdims));
  size_t rank = in.shape.size();
  std::vector<bool> isRed(rank, false);
  for (int64_t d : dims) {
    if (d < 0 || d >= int64_t(rank) || isRed[size_t(d)])
      return opError(instr, "expects distinct dims in [0, " +
                                std::to_string(rank) + "), got " +
                                shapeStr(dims));
    isRed[size_t(d)] = true;
  }
  std::vector<int64_t> expected;
  for (size_t i = 0; i < rank; ++i)
    if (!isRed[i])
      expected.push_back(in.shape[i]);
    else if (keepdims)
      expected.push_back(1);
  return checkShape(instr, "result", outs[0].shape, expected);
}

Status verifyMatmul(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 2, 1));
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "operand #0", ins[0]));
  DLOPT_RETURN_IF_ERROR(
      checkDType(instr, "result", outs[0].dtype, ins[0].dtype));
  MatmulDims d;
  DLOPT_RETURN_IF_ERROR(matmulDims(instr, ins[0], ins[1], d));
  std::vector<int64_t> expected = d.batch;
  expected.push_back(d.m);
  expected.push_back(d.n);
  return checkShape(instr, "result", outs[0].shape, expected);
}

//===----------------------------------------------------------------------===//
// Shape ops
//===----------------------------------------------------------------------===//

Status verifyReshape(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 1, 1));
  DLOPT_RETURN_IF_ERROR(
      checkDType(instr, "result", outs[0].dtype, ins[0].dtype));
  if (outs[0].numElements() != ins[0].numElements())
    return opError(instr, "expects the result to have " +
                              std::to_string(ins[0].numElements()) +
                              " elements like the operand, got " +
                              typeStr(outs[0]));
  return Status::ok();
}

Status verifyTranspose(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 1, 1));
  const TensorType &in = ins[0];
  DLOPT_RETURN_IF_ERROR(checkDType(instr, "result", outs[0].dtype, in.dtype));
  std::vector<int64_t> perm;
  DLOPT_RETURN_IF_ERROR(getIntsAttr(instr, "perm", perm));
  size_t rank = in.shape.size();
  std::vector<bool> seen(rank, false);
  bool valid = perm.size() == rank;
  for (size_t i = 0; valid && i < rank; ++i) {
    valid = perm[i] >= 0 && perm[i] < int64_t(rank) && !seen[size_t(perm[i])];
    if (valid)
      seen[size_t(perm[i])] = true;
  }
  if (!valid)
    return opError(instr, "expects 'perm' to be a permutation of [0, " +
                              std::to_string(rank) + "), got " +
                              shapeStr(perm));
  std::vector<int64_t> expected(rank);
  for (size_t i = 0; i < rank; ++i)
    expected[i] = in.shape[size_t(perm[i])];
  return checkShape(instr, "result", outs[0].shape, expected);
}

Status verifyBroadcastTo(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 1, 1));
  DLOPT_RETURN_IF_ERROR(
      checkDType(instr, "result", outs[0].dtype, ins[0].dtype));
  std::string err = broadcastError(ins[0].shape, outs[0].shape, 0);
  return err.empty() ? Status::ok() : opError(instr, err);
}

Status verifyConcat(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arityRange(instr, ins, outs, 1, SIZE_MAX, 1));
  const TensorType &t0 = ins[0];
  size_t rank = t0.shape.size();
  int64_t dim = 0;
  DLOPT_RETURN_IF_ERROR(getDimAttr(instr, rank, dim));
  std::vector<int64_t> expected = t0.shape;
  expected[size_t(dim)] = 0;
  for (size_t k = 0; k < ins.size(); ++k) {
    const TensorType &t = ins[k];
    bool ok = t.dtype == t0.dtype && t.shape.size() == rank;
    for (size_t i = 0; ok && i < rank; ++i)
      ok = int64_t(i) == dim || t.shape[i] == t0.shape[i];
    if (!ok)
      return opError(instr, "operand #" + std::to_string(k) + " of type " +
                                typeStr(t) + " does not match operand #0 " +
                                typeStr(t0) + " outside dim " +
                                std::to_string(dim));
    expected[size_t(dim)] += t.shape[size_t(dim)];
  }
  return checkType(instr, "result", outs[0], TensorType{t0.dtype, expected});
}

Status verifySlice(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 1, 1));
  SliceGeom g;
  DLOPT_RETURN_IF_ERROR(sliceGeometry(instr, ins[0].shape, g));
  return checkType(instr, "result", outs[0],
                   TensorType{ins[0].dtype, g.sliced});
}

Status verifySliceGrad(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 1, 1));
  const TensorType &tdy = ins[0], &tr = outs[0];
  DLOPT_RETURN_IF_ERROR(checkDType(instr, "result", tr.dtype, tdy.dtype));
  SliceGeom g;
  DLOPT_RETURN_IF_ERROR(sliceGeometry(instr, tr.shape, g));
  return checkShape(instr, "operand #0 (dy)", tdy.shape, g.sliced);
}

Status verifyGather(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 2, 1));
  const TensorType &table = ins[0], &ids = ins[1];
  if (table.shape.empty())
    return opError(instr,
                   "expects a table of rank >= 1, got " + typeStr(table));
  DLOPT_RETURN_IF_ERROR(checkInt(instr, "operand #1 (ids)", ids));
  std::vector<int64_t> expected = ids.shape;
  expected.insert(expected.end(), table.shape.begin() + 1, table.shape.end());
  return checkType(instr, "result", outs[0], TensorType{table.dtype, expected});
}

Status verifyScatterAdd(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 2, 1));
  const TensorType &ti = ins[0], &tu = ins[1], &tr = outs[0];
  DLOPT_RETURN_IF_ERROR(checkInt(instr, "operand #0 (ids)", ti));
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "operand #1 (updates)", tu));
  if (tr.shape.empty())
    return opError(instr, "expects a result of rank >= 1, got " + typeStr(tr));
  std::vector<int64_t> expected = ti.shape;
  expected.insert(expected.end(), tr.shape.begin() + 1, tr.shape.end());
  return checkType(instr, "operand #1 (updates)", tu,
                   TensorType{tr.dtype, expected});
}

Status verifyIota(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 0, 1));
  DLOPT_RETURN_IF_ERROR(checkNumeric(instr, "result", outs[0]));
  DimSplit split;
  return getDimSplit(instr, outs[0].shape, split);
}

//===----------------------------------------------------------------------===//
// Neural-network ops
//===----------------------------------------------------------------------===//

Status verifySoftmax(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 1, 1));
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "operand #0", ins[0]));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result", outs[0], ins[0]));
  DimSplit split;
  return getDimSplit(instr, ins[0].shape, split);
}

Status verifySoftmaxGrad(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 2, 1));
  const TensorType &t = ins[0];
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "operand #0 (y)", t));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "operand #1 (dy)", ins[1], t));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result", outs[0], t));
  DimSplit split;
  return getDimSplit(instr, t.shape, split);
}

template <bool Rms> Status verifyNorm(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arityRange(instr, ins, outs, 1, Rms ? 2 : 3, 1));
  const TensorType &t = ins[0];
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "operand #0", t));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result", outs[0], t));
  NormGeom g;
  DLOPT_RETURN_IF_ERROR(normGeometry(instr, t, Rms, false, ins.size(), g));
  for (size_t k = 1; k < ins.size(); ++k)
    DLOPT_RETURN_IF_ERROR(checkType(instr, k == 1 && g.hasWeight ? "weight"
                                                                 : "bias",
                                    ins[k], TensorType{t.dtype, g.normShape}));
  return Status::ok();
}

template <bool Rms>
Status verifyNormGrad(const Instr &instr, Ins ins, Outs outs) {
  size_t numOuts = Rms ? 2 : 3;
  DLOPT_RETURN_IF_ERROR(arityRange(instr, ins, outs, 2, 3, numOuts));
  const TensorType &t = ins[0];
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "operand #0 (x)", t));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "operand #1 (dy)", ins[1], t));
  NormGeom g;
  DLOPT_RETURN_IF_ERROR(normGeometry(instr, t, Rms, true, ins.size(), g));
  TensorType paramType{t.dtype, g.normShape};
  if (g.hasWeight)
    DLOPT_RETURN_IF_ERROR(checkType(instr, "weight", ins[2], paramType));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result #0", outs[0], t));
  for (size_t i = 1; i < numOuts; ++i)
    DLOPT_RETURN_IF_ERROR(checkType(instr, "result #" + std::to_string(i),
                                    outs[i], paramType));
  return Status::ok();
}

Status verifyAttention(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arityRange(instr, ins, outs, 3, 4, 1));
  AttentionDims a;
  DLOPT_RETURN_IF_ERROR(attentionDims(instr, ins[0], ins[1], ins[2], a));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result", outs[0],
                                  TensorType{ins[0].dtype, {a.b, a.h, a.s, a.e}}));
  if (ins.size() == 4)
    return checkScalarInt(instr, "operand #3 (offset)", ins[3]);
  return Status::ok();
}

Status verifyAttentionGrad(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arityRange(instr, ins, outs, 4, 5, 3));
  const TensorType &tq = ins[0], &tk = ins[1], &tv = ins[2], &tdo = ins[3];
  AttentionDims a;
  DLOPT_RETURN_IF_ERROR(attentionDims(instr, tq, tk, tv, a));
  DLOPT_RETURN_IF_ERROR(
      checkType(instr, "dout", tdo, TensorType{tq.dtype, {a.b, a.h, a.s, a.e}}));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result #0 (dq)", outs[0], tq));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result #1 (dk)", outs[1], tk));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result #2 (dv)", outs[2], tv));
  if (ins.size() == 5)
    return checkScalarInt(instr, "operand #4 (offset)", ins[4]);
  return Status::ok();
}

Status verifyRope(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arityRange(instr, ins, outs, 1, 2, 1));
  const TensorType &tx = ins[0];
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "operand #0", tx));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result", outs[0], tx));
  size_t rank = tx.shape.size();
  if (rank < 2 || tx.shape[rank - 1] % 2 != 0)
    return opError(instr, "expects rank >= 2 and an even last dim, got " +
                              typeStr(tx));
  double theta = 10000.0;
  bool inverse = false;
  DLOPT_RETURN_IF_ERROR(getOptFloatAttr(instr, "theta", theta));
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(instr, "inverse", inverse));
  if (ins.size() == 2)
    return checkScalarInt(instr, "operand #1 (offset)", ins[1]);
  return Status::ok();
}

Status verifyBatchNormCommon(const Instr &instr, const TensorType &tx) {
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "operand #0", tx));
  if (tx.shape.size() < 2)
    return opError(instr,
                   "expects x of rank >= 2 ([N, C, ...]), got " + typeStr(tx));
  double eps = 1e-5;
  bool training = false;
  DLOPT_RETURN_IF_ERROR(getOptFloatAttr(instr, "eps", eps));
  return getOptBoolAttr(instr, "training", training);
}

Status verifyBatchNorm(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 5, 3));
  const TensorType &tx = ins[0];
  DLOPT_RETURN_IF_ERROR(verifyBatchNormCommon(instr, tx));
  TensorType vec{tx.dtype, {tx.shape[1]}};
  static const char *names[] = {"x", "weight", "bias", "mean", "var"};
  for (size_t i = 1; i < 5; ++i)
    DLOPT_RETURN_IF_ERROR(checkType(instr, names[i], ins[i], vec));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result #0", outs[0], tx));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result #1", outs[1], vec));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result #2", outs[2], vec));
  double momentum = 0.1;
  DLOPT_RETURN_IF_ERROR(getOptFloatAttr(instr, "momentum", momentum));
  bool training = instr.getBool("training", false);
  int64_t count = tx.shape[0] * product(tx.shape, 2, tx.shape.size());
  if (training && count < 2 && tx.shape[1] > 0)
    return opError(instr, "training mode needs more than 1 value per "
                          "channel, got " +
                              typeStr(tx));
  return Status::ok();
}

Status verifyBatchNormGrad(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 5, 3));
  const TensorType &tx = ins[0];
  DLOPT_RETURN_IF_ERROR(verifyBatchNormCommon(instr, tx));
  TensorType vec{tx.dtype, {tx.shape[1]}};
  static const char *names[] = {"x", "weight", "running_mean", "running_var"};
  for (size_t i = 1; i < 4; ++i)
    DLOPT_RETURN_IF_ERROR(checkType(instr, names[i], ins[i], vec));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "dy", ins[4], tx));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result #0", outs[0], tx));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result #1", outs[1], vec));
  return checkType(instr, "result #2", outs[2], vec);
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

Status verifyLogitsLabels(const Instr &instr, const TensorType &tl,
                          const TensorType &ty) {
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "logits", tl));
  DLOPT_RETURN_IF_ERROR(checkInt(instr, "labels", ty));
  if (tl.shape.size() != 2 || ty.shape.size() != 1 ||
      ty.shape[0] != tl.shape[0])
    return opError(instr, "expects logits [N, C] and labels [N], got " +
                              typeStr(tl) + " and " + typeStr(ty));
  int64_t ignore = -100;
  return getOptIntAttr(instr, "ignore_index", ignore);
}

/// The loss of cross_entropy (result) and the dloss of cross_entropy_grad:
/// a scalar of the logits' element type or f32.
Status checkLossScalar(const Instr &instr, const char *what,
                       const TensorType &t, DType logits) {
  if (t == TensorType{DType::F32, {}})
    return Status::ok();
  return checkType(instr, what, t, TensorType{logits, {}});
}

Status verifyCrossEntropy(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 2, 1));
  DLOPT_RETURN_IF_ERROR(verifyLogitsLabels(instr, ins[0], ins[1]));
  return checkLossScalar(instr, "result", outs[0], ins[0].dtype);
}

Status verifyCrossEntropyGrad(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 3, 1));
  DLOPT_RETURN_IF_ERROR(verifyLogitsLabels(instr, ins[0], ins[1]));
  DLOPT_RETURN_IF_ERROR(checkLossScalar(instr, "dloss", ins[2], ins[0].dtype));
  return checkType(instr, "result", outs[0], ins[0]);
}

Status verifyMse(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 2, 1));
  const TensorType &ta = ins[0];
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "operand #0", ta));
  DLOPT_RETURN_IF_ERROR(checkType(instr, "operand #1", ins[1], ta));
  return checkType(instr, "result", outs[0], TensorType{ta.dtype, {}});
}

//===----------------------------------------------------------------------===//
// Convolution and pooling
//===----------------------------------------------------------------------===//

Status verifyConv2d(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arityRange(instr, ins, outs, 2, 3, 1));
  const TensorType &tx = ins[0], &tw = ins[1];
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "x", tx));
  if (tx.shape.size() != 4 || tw.shape.size() != 4 || tw.dtype != tx.dtype)
    return opError(instr, "expects x [N,C,H,W] and w [O,C/groups,KH,KW] of "
                          "one float type, got " +
                              typeStr(tx) + " and " + typeStr(tw));
  bool hasBias = ins.size() == 3;
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(instr, "has_bias", hasBias));
  if (ins.size() != 2 + size_t(hasBias))
    return opError(instr,
                   "expects " + std::to_string(2 + hasBias) +
                       " operands (has_bias = " + std::to_string(hasBias) +
                       "), got " + std::to_string(ins.size()));
  ConvGeom g;
  DLOPT_RETURN_IF_ERROR(
      convGeometry(instr, tx, tw, hasBias ? &ins[2] : nullptr, g));
  return checkType(instr, "result", outs[0],
                   TensorType{tx.dtype, {tx.shape[0], tw.shape[0], g.oh, g.ow}});
}

Status verifyConv2dGradInput(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 2, 1));
  ConvGeom g;
  return convGradGeometry(instr, outs[0], ins[1], ins[0], g);
}

Status verifyConv2dGradFilter(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 2, 1));
  ConvGeom g;
  return convGradGeometry(instr, ins[0], outs[0], ins[1], g);
}

template <bool Max> Status verifyPool(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 1, 1));
  const TensorType &tx = ins[0];
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "operand #0", tx));
  if (tx.shape.size() < 2)
    return opError(instr,
                   "expects rank >= 2 ([..., H, W]), got " + typeStr(tx));
  PoolGeom g;
  DLOPT_RETURN_IF_ERROR(poolGeometry(instr, Max, tx, g));
  return checkType(instr, "result", outs[0], TensorType{tx.dtype, g.pooled});
}

template <bool Max>
Status verifyPoolGrad(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, Max ? 2 : 1, 1));
  const TensorType &tx = Max ? ins[0] : outs[0];
  const TensorType &tdy = ins[Max ? 1 : 0];
  PoolGeom g;
  DLOPT_RETURN_IF_ERROR(poolGradGeometry(instr, Max, tx, tdy, g));
  if constexpr (Max)
    return checkType(instr, "result", outs[0], tx);
  return Status::ok();
}

//===----------------------------------------------------------------------===//
// Communication (the group's size is checked by Executable::validate)
//===----------------------------------------------------------------------===//

Status verifyCommunication(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, 1, 1));
  int64_t group = 0;
  DLOPT_RETURN_IF_ERROR(getIntAttr(instr, "group", group));
  if (group < 0)
    return opError(instr, "expects 'group' >= 0, got " + std::to_string(group));
  return checkDType(instr, "result", outs[0].dtype, ins[0].dtype);
}

/// send {group, peer}: one operand, no result; recv {group, peer}: no
/// operand, one result. `peer` is the other rank's index in the group; the
/// pairing of sends with receives is checked across ranks
/// (checkCommunicationOrder).
template <bool Send>
Status verifyPointToPoint(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(arity(instr, ins, outs, Send ? 1 : 0, Send ? 0 : 1));
  for (const char *name : {"group", "peer"}) {
    int64_t v = 0;
    DLOPT_RETURN_IF_ERROR(getIntAttr(instr, name, v));
    if (v < 0)
      return opError(instr, std::string("expects '") + name + "' >= 0, got " +
                                std::to_string(v));
  }
  return Status::ok();
}

/// send_recv {group, send_peers, recv_peers}: a batch of point-to-point
/// transfers posted together (NCCL's grouped p2p): operand i goes to
/// send_peers[i], result j comes from recv_peers[j]. Peers are indices in
/// the group; the pairing is checked across ranks (checkCommunicationOrder).
Status verifySendRecv(const Instr &instr, Ins ins, Outs outs) {
  if (ins.empty() && outs.empty())
    return opError(instr, "expects at least one operand or result");
  int64_t group = 0;
  DLOPT_RETURN_IF_ERROR(getIntAttr(instr, "group", group));
  if (group < 0)
    return opError(instr, "expects 'group' >= 0, got " + std::to_string(group));
  for (auto [name, count] : {std::pair<const char *, size_t>{"send_peers", ins.size()},
                             {"recv_peers", outs.size()}}) {
    Expected<std::vector<int64_t>> peers = instr.getInts(name);
    if (!peers)
      return opError(instr, peers.status().message());
    if (peers->size() != count)
      return opError(instr, std::string("expects ") + std::to_string(count) +
                                " entries in '" + name + "', got " +
                                std::to_string(peers->size()));
    for (int64_t v : *peers)
      if (v < 0)
        return opError(instr, std::string("expects '") + name +
                                  "' >= 0, got " + std::to_string(v));
  }
  return Status::ok();
}

std::vector<OpInfo> buildTable() {
  std::vector<OpInfo> t = {
      {"neg", false, verifyUnary<true>},
      {"abs", false, verifyUnary<true>},
      {"relu", false, verifyUnary<true>},
      {"exp", false, verifyUnary<false>},
      {"log", false, verifyUnary<false>},
      {"sqrt", false, verifyUnary<false>},
      {"rsqrt", false, verifyUnary<false>},
      {"tanh", false, verifyUnary<false>},
      {"sin", false, verifyUnary<false>},
      {"cos", false, verifyUnary<false>},
      {"sigmoid", false, verifyUnary<false>},
      {"silu", false, verifyUnary<false>},
      {"gelu", false, verifyGelu},
      {"cast", false, verifyCast},
      {"add", false, verifyBinary<false>},
      {"sub", false, verifyBinary<false>},
      {"mul", false, verifyBinary<false>},
      {"div", false, verifyBinary<false>},
      {"maximum", false, verifyBinary<false>},
      {"minimum", false, verifyBinary<false>},
      {"pow", false, verifyBinary<true>},
      {"compare", false, verifyCompare},
      {"select", false, verifySelect},
      {fused::kOpName, false, verifyFused},
      {"gelu_grad", false, verifyGeluGrad},
      {"dropout", false, verifyDropout},
      {"sum", false, verifyReduce<false>},
      {"max", false, verifyReduce<false>},
      {"mean", false, verifyReduce<true>},
      {"matmul", false, verifyMatmul},
      {"reshape", false, verifyReshape},
      {"transpose", false, verifyTranspose},
      {"broadcast_to", false, verifyBroadcastTo},
      {"concat", false, verifyConcat},
      {"slice", false, verifySlice},
      {"slice_grad", false, verifySliceGrad},
      {"gather", false, verifyGather},
      {"scatter_add", false, verifyScatterAdd},
      {"iota", false, verifyIota},
      {"softmax", false, verifySoftmax},
      {"log_softmax", false, verifySoftmax},
      {"softmax_grad", false, verifySoftmaxGrad},
      {"log_softmax_grad", false, verifySoftmaxGrad},
      {"layer_norm", false, verifyNorm<false>},
      {"rms_norm", false, verifyNorm<true>},
      {"layer_norm_grad", false, verifyNormGrad<false>},
      {"rms_norm_grad", false, verifyNormGrad<true>},
      {"attention", false, verifyAttention},
      {"attention_grad", false, verifyAttentionGrad},
      {"rope", false, verifyRope},
      {"batch_norm", false, verifyBatchNorm},
      {"batch_norm_grad", false, verifyBatchNormGrad},
      {"cross_entropy", false, verifyCrossEntropy},
      {"cross_entropy_grad", false, verifyCrossEntropyGrad},
      {"mse", false, verifyMse},
      {"conv2d", false, verifyConv2d},
      {"conv2d_grad_input", false, verifyConv2dGradInput},
      {"conv2d_grad_filter", false, verifyConv2dGradFilter},
      {"max_pool2d", false, verifyPool<true>},
      {"avg_pool2d", false, verifyPool<false>},
      {"max_pool2d_grad", false, verifyPoolGrad<true>},
      {"avg_pool2d_grad", false, verifyPoolGrad<false>},
      {"all_reduce", true, verifyCommunication},
      {"all_gather", true, verifyCommunication},
      {"reduce_scatter", true, verifyCommunication},
      {"all_slice", true, verifyCommunication},
      {"all_to_all", true, verifyCommunication},
      {"broadcast", true, verifyCommunication},
      {"send", true, verifyPointToPoint<true>},
      {"recv", true, verifyPointToPoint<false>},
      {"send_recv", true, verifySendRecv},
  };
  std::sort(t.begin(), t.end(),
            [](const OpInfo &a, const OpInfo &b) { return a.name < b.name; });
  return t;
}

} // namespace

const std::vector<OpInfo> &opTable() {
  static const std::vector<OpInfo> table = buildTable();
  return table;
}

const OpInfo *findOp(const std::string &name) {
  const std::vector<OpInfo> &t = opTable();
  auto it = std::lower_bound(
      t.begin(), t.end(), name,
      [](const OpInfo &a, const std::string &n) { return a.name < n; });
  return it != t.end() && it->name == name ? &*it : nullptr;
}

bool isCommunicationOp(const std::string &op) {
  const OpInfo *info = findOp(op);
  return info && info->communication;
}

Status verifyInstr(const Instr &instr, TypeSpan ins, TypeSpan outs) {
  const OpInfo *info = findOp(instr.op);
  if (!info)
    return opError(instr, "unknown op (docs/ops.md lists the runtime's ops)");
  for (size_t i = 0; i < ins.size() + outs.size(); ++i) {
    const TensorType &t = i < ins.size() ? ins[i] : outs[i - ins.size()];
    for (int64_t d : t.shape)
      if (d < 0)
        return opError(instr, std::string(i < ins.size() ? "operand" : "result") +
                                  " #" +
                                  std::to_string(i < ins.size() ? i
                                                                : i - ins.size()) +
                                  " has a negative dimension: " + typeStr(t));
  }
  return info->verify(instr, ins, outs);
}

//===----------------------------------------------------------------------===//
// Shape rules
//===----------------------------------------------------------------------===//

Expected<TensorType> commResultType(const Instr &in, const TensorType &x,
                                    int64_t n) {
  auto axisOf = [&](const char *name) -> Expected<int64_t> {
    Expected<int64_t> a = in.getInt(name);
    if (!a)
      return a;
    if (*a < 0 || *a >= int64_t(x.shape.size()))
      return Status::error(std::string(name) + " " + std::to_string(*a) +
                           " is not a dim of the " + x.str() + " operand");
    return a;
  };
  auto reduceOk = [&]() -> Status {
    Expected<std::string> r = in.getString("reduce");
    if (!r)
      return r.status();
    if (*r != "sum" && *r != "max" && *r != "min" && *r != "avg")
      return Status::error("reduce '" + *r +
                           "' is not one of sum, max, min, avg");
    return Status::ok();
  };
  auto divides = [&](int64_t axis, const std::string &what) -> Status {
    if (x.shape[size_t(axis)] % n == 0)
      return Status::ok();
    return Status::error(what + " of " + x.str() +
                         " does not divide by the group of " +
                         std::to_string(n));
  };
  if (in.op == "all_reduce") {
    DLOPT_RETURN_IF_ERROR(reduceOk());
    return x;
  }
  if (in.op == "broadcast") {
    Expected<int64_t> root = in.getInt("root");
    if (!root)
      return root.status();
    if (*root < 0 || *root >= n)
      return Status::error("root " + std::to_string(*root) +
                           " is outside the group of " + std::to_string(n));
    return x;
  }
  if (in.op == "all_gather" || in.op == "reduce_scatter" ||
      in.op == "all_slice") {
    Expected<int64_t> axis = axisOf("axis");
    if (!axis)
      return axis.status();
    TensorType want = x;
    if (in.op == "all_gather") {
      want.shape[size_t(*axis)] *= n;
      return want;
    }
    if (in.op == "reduce_scatter")
      DLOPT_RETURN_IF_ERROR(reduceOk());
    DLOPT_RETURN_IF_ERROR(divides(*axis, "dim " + std::to_string(*axis)));
    want.shape[size_t(*axis)] /= n;
    return want;
  }
  if (in.op == "all_to_all") {
    Expected<int64_t> split = axisOf("split_axis");
    if (!split)
      return split.status();
    Expected<int64_t> concat = axisOf("concat_axis");
    if (!concat)
      return concat.status();
    DLOPT_RETURN_IF_ERROR(divides(*split, "split_axis dim"));
    TensorType want = x;
    want.shape[size_t(*split)] /= n;
    want.shape[size_t(*concat)] *= n;
    return want;
  }
  return Status::error("unknown communication op");
}

Status matmulShapes(const TensorType &ta, const TensorType &tb, bool transA,
                    bool transB, MatmulDims &out) {
  if (tb.dtype != ta.dtype)
    return Status::error("expects operands of the same element type, got " +
                         typeStr(ta) + " and " + typeStr(tb));
  if (ta.shape.size() < 2 || tb.shape.size() < 2)
    return Status::error("expects operands of rank >= 2, got " + typeStr(ta) +
                         " and " + typeStr(tb));
  out.transA = transA;
  out.transB = transB;
  size_t ra = ta.shape.size(), rb = tb.shape.size();
  out.m = transA ? ta.shape[ra - 1] : ta.shape[ra - 2];
  int64_t ka = transA ? ta.shape[ra - 2] : ta.shape[ra - 1];
  int64_t kb = transB ? tb.shape[rb - 1] : tb.shape[rb - 2];
  out.n = transB ? tb.shape[rb - 2] : tb.shape[rb - 1];
  if (ka != kb)
    return Status::error("contraction dims differ: " + typeStr(ta) +
                         (transA ? " (transposed)" : "") + " vs " +
                         typeStr(tb) + (transB ? " (transposed)" : ""));
  out.k = ka;
  for (int64_t d : {out.m, out.n, out.k})
    if (d > INT_MAX)
      return Status::error("matrix dim " + std::to_string(d) +
                           " exceeds the BLAS int range");
  std::vector<int64_t> aBatch(ta.shape.begin(), ta.shape.end() - 2);
  std::vector<int64_t> bBatch(tb.shape.begin(), tb.shape.end() - 2);
  if (!broadcastShapes(aBatch, bBatch, out.batch))
    return Status::error("batch dims " + shapeStr(aBatch) + " and " +
                         shapeStr(bBatch) + " do not broadcast");
  return Status::ok();
}

Status matmulDims(const Instr &instr, const TensorType &ta, const TensorType &tb,
                  MatmulDims &out) {
  bool transA = false, transB = false;
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(instr, "transpose_a", transA));
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(instr, "transpose_b", transB));
  Status st = matmulShapes(ta, tb, transA, transB, out);
  return st ? st : opError(instr, st.message());
}

Status sliceGeometry(const Instr &instr, const std::vector<int64_t> &full,
                     SliceGeom &g) {
  size_t rank = full.size();
  g.stride.assign(rank, 1);
  DLOPT_RETURN_IF_ERROR(getIntsAttr(instr, "start", g.start));
  DLOPT_RETURN_IF_ERROR(getIntsAttr(instr, "limit", g.limit));
  DLOPT_RETURN_IF_ERROR(getOptIntsAttr(instr, "stride", g.stride));
  if (g.start.size() != rank || g.limit.size() != rank ||
      g.stride.size() != rank)
    return opError(instr, "expects start/limit/stride of length " +
                              std::to_string(rank) + ", got " +
                              std::to_string(g.start.size()) + "/" +
                              std::to_string(g.limit.size()) + "/" +
                              std::to_string(g.stride.size()));
  g.sliced.assign(rank, 0);
  for (size_t i = 0; i < rank; ++i) {
    if (g.start[i] < 0 || g.start[i] > g.limit[i] || g.limit[i] > full[i] ||
        g.stride[i] < 1)
      return opError(instr, "invalid slice of dim " + std::to_string(i) +
                                " (size " + std::to_string(full[i]) +
                                "): start " + std::to_string(g.start[i]) +
                                ", limit " + std::to_string(g.limit[i]) +
                                ", stride " + std::to_string(g.stride[i]));
    g.sliced[i] = (g.limit[i] - g.start[i] + g.stride[i] - 1) / g.stride[i];
  }
  return Status::ok();
}

Status normGeometry(const Instr &instr, const TensorType &t, bool rms,
                    bool grad, size_t numIns, NormGeom &g) {
  size_t rank = t.shape.size();
  g.axis = rank > 0 ? int64_t(rank) - 1 : 0;
  g.eps = rms ? 1e-6 : 1e-5;
  // Without the flags, the operand count says which optional operands exist
  // (weight comes before bias).
  size_t fixed = grad ? 2 : 1;
  g.hasWeight = numIns >= fixed + 1;
  g.hasBias = !rms && !grad && numIns >= 3;
  DLOPT_RETURN_IF_ERROR(getOptIntAttr(instr, "axis", g.axis));
  DLOPT_RETURN_IF_ERROR(getOptFloatAttr(instr, "eps", g.eps));
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(instr, "has_weight", g.hasWeight));
  if (!rms && !grad)
    DLOPT_RETURN_IF_ERROR(getOptBoolAttr(instr, "has_bias", g.hasBias));
  if (numIns != fixed + size_t(g.hasWeight) + size_t(g.hasBias)) {
    std::string flags = "has_weight = " + std::to_string(g.hasWeight);
    if (!rms && !grad)
      flags += ", has_bias = " + std::to_string(g.hasBias);
    return opError(instr, "expects " +
                              std::to_string(fixed + g.hasWeight + g.hasBias) +
                              " operands (" + flags + "), got " +
                              std::to_string(numIns));
  }
  if (g.axis < 0 || g.axis > int64_t(rank) ||
      (rank > 0 && g.axis == int64_t(rank)))
    return opError(instr, "expects 'axis' in [0, " + std::to_string(rank) +
                              "), got " + std::to_string(g.axis));
  g.normShape.assign(t.shape.begin() + g.axis, t.shape.end());
  g.n = product(g.normShape, 0, g.normShape.size());
  g.rows = g.n == 0 ? 0 : t.numElements() / g.n;
  return Status::ok();
}

Status attentionDims(const Instr &instr, const TensorType &tq,
                     const TensorType &tk, const TensorType &tv,
                     AttentionDims &a) {
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "q", tq));
  for (const TensorType *t : {&tq, &tk, &tv})
    if (t->shape.size() != 4 || t->dtype != tq.dtype)
      return opError(instr, "expects q, k, v of rank 4 with one float "
                            "element type, got " +
                                typeStr(tq) + ", " + typeStr(tk) + ", " +
                                typeStr(tv));
  a.b = tq.shape[0], a.h = tq.shape[1], a.s = tq.shape[2], a.d = tq.shape[3];
  a.g = tk.shape[1], a.t = tk.shape[2], a.e = tv.shape[3];
  if (tk.shape[0] != a.b || tv.shape[0] != a.b || tk.shape[3] != a.d ||
      tv.shape[1] != a.g || tv.shape[2] != a.t || a.g == 0 || a.h % a.g != 0)
    return opError(instr, "expects q [B,H,S,D], k [B,G,T,D], v [B,G,T,E] "
                          "with H % G == 0, got " +
                              typeStr(tq) + ", " + typeStr(tk) + ", " +
                              typeStr(tv));
  a.causal = false;
  a.scale = a.d > 0 ? 1.0 / std::sqrt(double(a.d)) : 1.0;
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(instr, "causal", a.causal));
  return getOptFloatAttr(instr, "scale", a.scale);
}

Status convGeometry(const Instr &instr, const TensorType &tx,
                    const TensorType &tw, const TensorType *bias,
                    ConvGeom &g) {
  g.stride = {1, 1};
  g.padding = {0, 0};
  g.dilation = {1, 1};
  g.groups = 1;
  DLOPT_RETURN_IF_ERROR(getWindowPair(instr, "stride", g.stride, 1));
  DLOPT_RETURN_IF_ERROR(getWindowPair(instr, "padding", g.padding, 0));
  DLOPT_RETURN_IF_ERROR(getWindowPair(instr, "dilation", g.dilation, 1));
  DLOPT_RETURN_IF_ERROR(getOptIntAttr(instr, "groups", g.groups));
  int64_t c = tx.shape[1];
  int64_t o = tw.shape[0];
  g.h = tx.shape[2], g.w = tx.shape[3];
  g.cg = tw.shape[1], g.kh = tw.shape[2], g.kw = tw.shape[3];
  if (g.groups < 1 || g.groups > c || c != g.cg * g.groups ||
      o % g.groups != 0)
    return opError(instr, "expects C = Cg * groups and O % groups == 0, got " +
                              typeStr(tx) + ", " + typeStr(tw) +
                              ", groups = " + std::to_string(g.groups));
  if (bias)
    DLOPT_RETURN_IF_ERROR(
        checkType(instr, "bias", *bias, TensorType{tx.dtype, {o}}));
  g.oh = windowOut(g.h, g.kh, g.stride[0], g.padding[0], g.dilation[0]);
  g.ow = windowOut(g.w, g.kw, g.stride[1], g.padding[1], g.dilation[1]);
  if (g.oh < 0 || g.ow < 0)
    return opError(instr, "kernel does not fit the padded input: " +
                              typeStr(tx) + ", " + typeStr(tw));
  return Status::ok();
}

Status convGradGeometry(const Instr &instr, const TensorType &tx,
                        const TensorType &tw, const TensorType &tdy,
                        ConvGeom &g) {
  for (const TensorType *t : {&tx, &tw, &tdy})
    if (t->shape.size() != 4 || t->dtype != tx.dtype || !isFloat(t->dtype))
      return opError(instr, "expects x [N,C,H,W], w [O,C/groups,KH,KW] and "
                            "dy [N,O,OH,OW] of one float type, got " +
                                typeStr(tx) + ", " + typeStr(tw) + ", " +
                                typeStr(tdy));
  DLOPT_RETURN_IF_ERROR(convGeometry(instr, tx, tw, nullptr, g));
  return checkShape(instr, "dy (conv2d's output)", tdy.shape,
                    {tx.shape[0], tw.shape[0], g.oh, g.ow});
}

Status poolGeometry(const Instr &instr, bool isMax, const TensorType &tx,
                    PoolGeom &g) {
  size_t rank = tx.shape.size();
  DLOPT_RETURN_IF_ERROR(getIntsAttr(instr, "kernel", g.kernel));
  if (g.kernel.size() != 2 || g.kernel[0] < 1 || g.kernel[1] < 1 ||
      g.kernel[0] > kMaxWindowAttr || g.kernel[1] > kMaxWindowAttr)
    return opError(instr, "expects 'kernel' to be 2 ints in [1, 2^30], got " +
                              shapeStr(g.kernel));
  g.stride = g.kernel;
  g.padding = {0, 0};
  g.includePad = true;
  DLOPT_RETURN_IF_ERROR(getWindowPair(instr, "stride", g.stride, 1));
  DLOPT_RETURN_IF_ERROR(getWindowPair(instr, "padding", g.padding, 0));
  if (!isMax)
    DLOPT_RETURN_IF_ERROR(
        getOptBoolAttr(instr, "count_include_pad", g.includePad));
  int64_t h = tx.shape[rank - 2], w = tx.shape[rank - 1];
  int64_t oh = windowOut(h, g.kernel[0], g.stride[0], g.padding[0], 1);
  int64_t ow = windowOut(w, g.kernel[1], g.stride[1], g.padding[1], 1);
  if (oh < 0 || ow < 0)
    return opError(instr, "window " + shapeStr(g.kernel) +
                              " does not fit the padded input " + typeStr(tx));
  g.pooled.assign(tx.shape.begin(), tx.shape.end() - 2);
  g.pooled.push_back(oh);
  g.pooled.push_back(ow);
  return Status::ok();
}

Status poolGradGeometry(const Instr &instr, bool isMax, const TensorType &tx,
                        const TensorType &tdy, PoolGeom &g) {
  DLOPT_RETURN_IF_ERROR(checkFloat(instr, "x", tx));
  if (tx.shape.size() < 2)
    return opError(instr,
                   "expects rank >= 2 ([..., H, W]), got " + typeStr(tx));
  DLOPT_RETURN_IF_ERROR(checkDType(instr, "dy", tdy.dtype, tx.dtype));
  DLOPT_RETURN_IF_ERROR(poolGeometry(instr, isMax, tx, g));
  return checkShape(instr, "dy (the pooled shape)", tdy.shape, g.pooled);
}

} // namespace dlopt::rt
