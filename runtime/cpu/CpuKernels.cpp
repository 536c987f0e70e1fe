//===- CpuKernels.cpp - Kernel registry and shared kernel helpers ---------===//
//
// runKernel looks the op up in a table filled once by the per-family kernel
// files, after checking what every kernel relies on (buffers present, shapes
// non-negative).
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/CpuKernels.h"
#include "runtime/cpu/KernelUtil.h"

#include <algorithm>

namespace dlopt::rt::cpu {

//===----------------------------------------------------------------------===//
// Errors and checks
//===----------------------------------------------------------------------===//

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

Status checkArity(const Instr &instr, Ins ins, Outs outs, size_t numIns,
                  size_t numOuts) {
  return checkArityRange(instr, ins, outs, numIns, numIns, numOuts);
}

Status checkArityRange(const Instr &instr, Ins ins, Outs outs, size_t minIns,
                       size_t maxIns, size_t numOuts) {
  if (ins.size() < minIns || ins.size() > maxIns) {
    std::string expected = std::to_string(minIns);
    if (maxIns != minIns)
      expected += maxIns == SIZE_MAX ? "+" : ".." + std::to_string(maxIns);
    return opError(instr, "expects " + expected + " operand(s), got " +
                              std::to_string(ins.size()));
  }
  if (outs.size() != numOuts)
    return opError(instr, "expects " + std::to_string(numOuts) +
                              " result(s), got " + std::to_string(outs.size()));
  return Status::ok();
}

Expected<int64_t> optionalScalarInt(const Instr &instr, Ins ins, size_t index,
                                    const char *name, int64_t otherwise) {
  if (ins.size() <= index)
    return otherwise;
  const TensorType &t = ins[index].type;
  if (!t.shape.empty() || (t.dtype != DType::I32 && t.dtype != DType::I64))
    return opError(instr, "expects operand #" + std::to_string(index) + " (" +
                              name + ") to be a rank-0 i32/i64 tensor, got " +
                              typeStr(t));
  return t.dtype == DType::I32 ? int64_t(ins[index].as<int32_t>()[0])
                               : ins[index].as<int64_t>()[0];
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

//===----------------------------------------------------------------------===//
// Shapes and broadcasting
//===----------------------------------------------------------------------===//

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

int64_t BroadcastPlan::rowOffset(size_t k, int64_t row) const {
  int64_t off = 0;
  const std::vector<int64_t> &st = strides[k];
  for (size_t d = shape.size() - 1; d-- > 0;) {
    int64_t idx = row % shape[d];
    row /= shape[d];
    off += idx * st[d];
  }
  return off;
}

std::string planBroadcast(const std::vector<int64_t> &outShape,
                          const std::vector<std::vector<int64_t>> &inShapes,
                          BroadcastPlan &plan) {
  size_t r = outShape.size();
  size_t n = inShapes.size();
  // Per operand, aligned strides over the full output rank.
  std::vector<std::vector<int64_t>> full(n, std::vector<int64_t>(r, 0));
  for (size_t k = 0; k < n; ++k) {
    const std::vector<int64_t> &s = inShapes[k];
    if (s.size() > r)
      return "operand #" + std::to_string(k) + " of shape " + shapeStr(s) +
             " has a higher rank than the result shape " + shapeStr(outShape);
    std::vector<int64_t> st = contiguousStrides(s);
    size_t lead = r - s.size();
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t od = outShape[lead + i];
      if (s[i] == od)
        full[k][lead + i] = s[i] == 1 ? 0 : st[i];
      else if (s[i] == 1)
        full[k][lead + i] = 0;
      else
        return "operand #" + std::to_string(k) + " of shape " + shapeStr(s) +
               " does not broadcast to " + shapeStr(outShape);
    }
  }
  plan.shape.clear();
  plan.strides.assign(n, {});
  for (size_t i = 0; i < r; ++i) {
    if (outShape[i] == 1)
      continue;
    bool merge = !plan.shape.empty();
    for (size_t k = 0; merge && k < n; ++k)
      merge = plan.strides[k].back() == full[k][i] * outShape[i];
    if (merge) {
      plan.shape.back() *= outShape[i];
      for (size_t k = 0; k < n; ++k)
        plan.strides[k].back() = full[k][i];
    } else {
      plan.shape.push_back(outShape[i]);
      for (size_t k = 0; k < n; ++k)
        plan.strides[k].push_back(full[k][i]);
    }
  }
  if (plan.shape.empty()) {
    plan.shape.push_back(1);
    for (size_t k = 0; k < n; ++k)
      plan.strides[k].push_back(0);
  }
  return "";
}

//===----------------------------------------------------------------------===//
// Registry
//===----------------------------------------------------------------------===//

static const KernelRegistry &registry() {
  static const KernelRegistry r = [] {
    KernelRegistry m;
    registerElementwiseKernels(m);
    registerReduceKernels(m);
    registerMatmulKernels(m);
    registerShapeKernels(m);
    registerNNKernels(m);
    registerConvKernels(m);
    registerLossKernels(m);
    registerGradKernels(m);
    return m;
  }();
  return r;
}

bool hasKernel(const std::string &op) { return registry().count(op) != 0; }

static Status checkTensor(const Instr &instr, const char *kind, size_t i,
                          const TensorRef &t) {
  for (int64_t d : t.type.shape)
    if (d < 0)
      return opError(instr,
                     std::string(kind) + " #" + std::to_string(i) +
                         " has a negative dimension: " + typeStr(t.type));
  if (t.data == nullptr && t.numElements() > 0)
    return opError(instr, std::string(kind) + " #" + std::to_string(i) +
                              " has no buffer");
  return Status::ok();
}

Status runKernel(const Instr &instr, std::span<const TensorRef> ins,
                 std::span<const TensorRef> outs) {
  auto it = registry().find(instr.op);
  if (it == registry().end())
    return Status::error("no CPU kernel for op '" + instr.op + "'" +
                         (instr.loc.empty() ? "" : " at " + instr.loc));
  for (size_t i = 0; i < ins.size(); ++i)
    DLOPT_RETURN_IF_ERROR(checkTensor(instr, "operand", i, ins[i]));
  for (size_t i = 0; i < outs.size(); ++i)
    DLOPT_RETURN_IF_ERROR(checkTensor(instr, "result", i, outs[i]));
  return it->second(instr, ins, outs);
}

} // namespace dlopt::rt::cpu
