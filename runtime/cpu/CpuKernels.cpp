//===- CpuKernels.cpp - Kernel registry and shared kernel helpers ---------===//
//
// runKernel looks the op up in a table filled once by the per-family kernel
// files. What the kernels rely on (counts, types, shapes, attributes) was
// checked when the executable was loaded (runtime/format/OpTable.h).
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/CpuKernels.h"
#include "runtime/cpu/KernelUtil.h"

#include <algorithm>

namespace dlopt::rt::cpu {

//===----------------------------------------------------------------------===//
// Errors and checks
//===----------------------------------------------------------------------===//

int64_t optionalScalarInt(Ins ins, size_t index, int64_t otherwise) {
  if (ins.size() <= index)
    return otherwise;
  const TensorRef &t = ins[index];
  return t.type.dtype == DType::I32 ? int64_t(t.as<int32_t>()[0])
                                    : t.as<int64_t>()[0];
}

//===----------------------------------------------------------------------===//
// Shapes and broadcasting
//===----------------------------------------------------------------------===//

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

Status runKernel(const Instr &instr, std::span<const TensorRef> ins,
                 std::span<const TensorRef> outs) {
  auto it = registry().find(instr.op);
  if (it == registry().end())
    return Status::error("no CPU kernel for op '" + instr.op + "'" +
                         (instr.loc.empty() ? "" : " at " + instr.loc));
  return it->second(instr, ins, outs);
}

} // namespace dlopt::rt::cpu
