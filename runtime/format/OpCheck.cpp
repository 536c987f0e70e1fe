//===- OpCheck.cpp - Checks and attribute reads shared by the verifiers ---===//

#include "runtime/format/OpCheck.h"

#include <algorithm>

namespace dlopt::rt {

std::string shapeStr(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i)
      s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string typeStr(const TensorType &t) {
  // Formatted here rather than with TensorType::str() so error paths do not
  // depend on the format library's formatting choices.
  std::string s;
  for (int64_t d : t.shape)
    s += std::to_string(d) + "x";
  return s + dtypeName(t.dtype);
}

Status opError(const Instr &instr, const std::string &msg) {
  std::string s = "op '" + instr.op + "'";
  if (!instr.loc.empty())
    s += " at " + instr.loc;
  return Status::error(s + ": " + msg);
}

Status checkArity(const Instr &instr, size_t numIns, size_t numOuts,
                  size_t minIns, size_t maxIns, size_t wantOuts) {
  if (numIns < minIns || numIns > maxIns) {
    std::string expected = std::to_string(minIns);
    if (maxIns != minIns)
      expected += maxIns == SIZE_MAX ? "+" : ".." + std::to_string(maxIns);
    return opError(instr, "expects " + expected + " operand(s), got " +
                              std::to_string(numIns));
  }
  if (numOuts != wantOuts)
    return opError(instr, "expects " + std::to_string(wantOuts) +
                              " result(s), got " + std::to_string(numOuts));
  return Status::ok();
}

Status checkFloat(const Instr &instr, const std::string &what,
                  const TensorType &t) {
  if (isFloat(t.dtype))
    return Status::ok();
  return opError(instr, "expects " + what +
                            " to have a float element type, got " + typeStr(t));
}

Status checkNumeric(const Instr &instr, const std::string &what,
                    const TensorType &t) {
  if (isFloat(t.dtype) || isInteger(t.dtype))
    return Status::ok();
  return opError(instr, "expects " + what +
                            " to have a float or int element type, got " +
                            typeStr(t));
}

Status checkInt(const Instr &instr, const std::string &what,
                const TensorType &t) {
  if (isInteger(t.dtype))
    return Status::ok();
  return opError(instr, "expects " + what +
                            " to have an int element type, got " + typeStr(t));
}

Status checkType(const Instr &instr, const std::string &what,
                 const TensorType &got, const TensorType &expected) {
  if (got == expected)
    return Status::ok();
  return opError(instr, "expects " + what + " of type " + typeStr(expected) +
                            ", got " + typeStr(got));
}

Status checkDType(const Instr &instr, const std::string &what, DType got,
                  DType expected) {
  if (got == expected)
    return Status::ok();
  return opError(instr, "expects " + what + " to have element type " +
                            dtypeName(expected) + ", got " + dtypeName(got));
}

Status checkShape(const Instr &instr, const std::string &what,
                  const std::vector<int64_t> &got,
                  const std::vector<int64_t> &expected) {
  if (got == expected)
    return Status::ok();
  return opError(instr, "expects " + what + " of shape " + shapeStr(expected) +
                            ", got " + shapeStr(got));
}

template <typename T>
static Status unwrap(const Instr &instr, Expected<T> e, T &out) {
  if (!e.isOk())
    return opError(instr, e.status().message());
  out = e.take();
  return Status::ok();
}

Status getIntAttr(const Instr &instr, const std::string &name, int64_t &out) {
  return unwrap(instr, instr.getInt(name), out);
}
Status getIntsAttr(const Instr &instr, const std::string &name,
                   std::vector<int64_t> &out) {
  return unwrap(instr, instr.getInts(name), out);
}
Status getFloatAttr(const Instr &instr, const std::string &name, double &out) {
  return unwrap(instr, instr.getFloat(name), out);
}
Status getOptIntAttr(const Instr &instr, const std::string &name,
                     int64_t &out) {
  return instr.hasAttr(name) ? getIntAttr(instr, name, out) : Status::ok();
}
Status getOptIntsAttr(const Instr &instr, const std::string &name,
                      std::vector<int64_t> &out) {
  return instr.hasAttr(name) ? getIntsAttr(instr, name, out) : Status::ok();
}
Status getOptFloatAttr(const Instr &instr, const std::string &name,
                       double &out) {
  return instr.hasAttr(name) ? getFloatAttr(instr, name, out) : Status::ok();
}
Status getOptBoolAttr(const Instr &instr, const std::string &name, bool &out) {
  if (!instr.hasAttr(name))
    return Status::ok();
  int64_t v = 0;
  DLOPT_RETURN_IF_ERROR(getIntAttr(instr, name, v));
  if (v != 0 && v != 1)
    return opError(instr, "expects attribute '" + name +
                              "' to be 0 or 1, got " + std::to_string(v));
  out = v != 0;
  return Status::ok();
}
Status getOptStringAttr(const Instr &instr, const std::string &name,
                        std::string &out) {
  if (!instr.hasAttr(name))
    return Status::ok();
  return unwrap(instr, instr.getString(name), out);
}


Status checkScalarInt(const Instr &instr, const std::string &what,
                      const TensorType &t) {
  if (t.shape.empty() && (t.dtype == DType::I32 || t.dtype == DType::I64))
    return Status::ok();
  return opError(instr, "expects " + what +
                            " to be a rank-0 i32/i64 tensor, got " +
                            typeStr(t));
}

Status getWindowPair(const Instr &instr, const std::string &name,
                     std::vector<int64_t> &out, int64_t minValue) {
  DLOPT_RETURN_IF_ERROR(getOptIntsAttr(instr, name, out));
  if (out.size() != 2 || out[0] < minValue || out[1] < minValue ||
      out[0] > kMaxWindowAttr || out[1] > kMaxWindowAttr)
    return opError(instr, "expects '" + name + "' to be 2 ints in [" +
                              std::to_string(minValue) + ", 2^30], got " +
                              shapeStr(out));
  return Status::ok();
}

int64_t windowOut(int64_t in, int64_t k, int64_t s, int64_t p, int64_t dil) {
  int64_t twoP, reach, padded, span;
  if (__builtin_mul_overflow(p, int64_t(2), &twoP) ||
      __builtin_mul_overflow(dil, k - 1, &reach) ||
      __builtin_add_overflow(in, twoP, &padded) ||
      __builtin_sub_overflow(padded, reach + 1, &span) || s < 1)
    return -1;
  return span < 0 ? -1 : span / s + 1;
}

Status getDimAttr(const Instr &instr, size_t rank, int64_t &dim) {
  DLOPT_RETURN_IF_ERROR(getIntAttr(instr, "dim", dim));
  if (dim < 0 || dim >= int64_t(rank))
    return opError(instr, "expects 'dim' in [0, " + std::to_string(rank) +
                              "), got " + std::to_string(dim));
  return Status::ok();
}

Status getDimSplit(const Instr &instr, const std::vector<int64_t> &shape,
                   DimSplit &s) {
  DLOPT_RETURN_IF_ERROR(getDimAttr(instr, shape.size(), s.dim));
  s.n = shape[s.dim];
  s.inner = product(shape, s.dim + 1, shape.size());
  s.outer = product(shape, 0, s.dim);
  return Status::ok();
}

std::string broadcastError(const std::vector<int64_t> &in,
                           const std::vector<int64_t> &out, size_t index) {
  std::string head = "operand #" + std::to_string(index) + " of shape " +
                     shapeStr(in);
  if (in.size() > out.size())
    return head + " has a higher rank than the result shape " + shapeStr(out);
  size_t lead = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] != out[lead + i] && in[i] != 1)
      return head + " does not broadcast to " + shapeStr(out);
  return "";
}

std::vector<int64_t> contiguousStrides(const std::vector<int64_t> &shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;)
    s[i - 1] = s[i] * shape[i];
  return s;
}

bool broadcastShapes(const std::vector<int64_t> &a,
                     const std::vector<int64_t> &b, std::vector<int64_t> &out) {
  size_t r = std::max(a.size(), b.size());
  out.assign(r, 1);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      return false;
    out[i] = da == 1 ? db : da;
  }
  return true;
}

} // namespace dlopt::rt
