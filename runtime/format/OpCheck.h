//===- OpCheck.h - Checks and attribute reads shared by the op verifiers --===//
//
// The building blocks of the instruction verifier (OpTable.h) and of the
// attribute reads the backends share with it: error formatting that names
// the op and its location, type and shape checks on TensorTypes, typed
// attribute reads, and the shape rules (broadcasting, sliding windows) that
// several ops use. Standard library only, like the rest of dlopt_format.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/format/Executable.h"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dlopt::rt {

/// Operand or result types of one instruction.
using TypeSpan = std::span<const TensorType>;

/// "[2, 3]".
std::string shapeStr(const std::vector<int64_t> &shape);
/// "4x8xf32" (tensor type as in MLIR, without `tensor<>`).
std::string typeStr(const TensorType &t);

/// "op 'OP' at LOC: MSG" (the location part is left out when unknown).
Status opError(const Instr &instr, const std::string &msg);

/// The number of operands must lie in [minIns, maxIns] (SIZE_MAX: no upper
/// bound) and the number of results must be numOuts.
Status checkArity(const Instr &instr, size_t numIns, size_t numOuts,
                  size_t minIns, size_t maxIns, size_t wantOuts);

/// `what` (e.g. "operand #0") must have a float element type.
Status checkFloat(const Instr &instr, const std::string &what,
                  const TensorType &t);
/// `what` must have a float or int element type.
Status checkNumeric(const Instr &instr, const std::string &what,
                    const TensorType &t);
/// `what` must have an int (i32/i64) element type.
Status checkInt(const Instr &instr, const std::string &what,
                const TensorType &t);
/// `what` must be a rank-0 i32/i64 tensor (a position offset operand).
Status checkScalarInt(const Instr &instr, const std::string &what,
                      const TensorType &t);
/// `got` must equal `expected` (dtype and shape).
Status checkType(const Instr &instr, const std::string &what,
                 const TensorType &got, const TensorType &expected);
Status checkDType(const Instr &instr, const std::string &what, DType got,
                  DType expected);
Status checkShape(const Instr &instr, const std::string &what,
                  const std::vector<int64_t> &got,
                  const std::vector<int64_t> &expected);

/// Typed attribute reads that turn a missing/mistyped attribute into an
/// error naming the op.
Status getIntAttr(const Instr &instr, const std::string &name, int64_t &out);
Status getIntsAttr(const Instr &instr, const std::string &name,
                   std::vector<int64_t> &out);
Status getFloatAttr(const Instr &instr, const std::string &name, double &out);
/// Optional variants: `out` keeps its default when the attribute is absent.
Status getOptIntAttr(const Instr &instr, const std::string &name, int64_t &out);
Status getOptIntsAttr(const Instr &instr, const std::string &name,
                      std::vector<int64_t> &out);
Status getOptFloatAttr(const Instr &instr, const std::string &name,
                       double &out);
Status getOptBoolAttr(const Instr &instr, const std::string &name, bool &out);
Status getOptStringAttr(const Instr &instr, const std::string &name,
                        std::string &out);

/// Largest stride, padding, dilation and window size the conv and pool ops
/// take; far above any real one, and small enough that every index computed
/// from them stays far from int64 overflow.
constexpr int64_t kMaxWindowAttr = int64_t(1) << 30;

/// Reads a 2-int attribute (stride, padding, dilation, kernel) with a
/// default; each int must lie in [minValue, kMaxWindowAttr].
Status getWindowPair(const Instr &instr, const std::string &name,
                     std::vector<int64_t> &out, int64_t minValue);

/// Output size of a sliding window; -1 when the window does not fit or the
/// arithmetic would overflow.
int64_t windowOut(int64_t in, int64_t k, int64_t s, int64_t p, int64_t dil);

inline int64_t product(const std::vector<int64_t> &v, size_t begin,
                       size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i)
    p *= v[i];
  return p;
}

/// Reads the required "dim" attribute and checks it is in [0, rank).
Status getDimAttr(const Instr &instr, size_t rank, int64_t &dim);

/// A row-major shape seen as [outer, n, inner] around one dim.
struct DimSplit {
  int64_t dim = 0, outer = 1, n = 1, inner = 1;
};

/// getDimAttr, then splits `shape` around that dim.
Status getDimSplit(const Instr &instr, const std::vector<int64_t> &shape,
                   DimSplit &s);

/// Row-major element strides.
std::vector<int64_t> contiguousStrides(const std::vector<int64_t> &shape);

/// NumPy broadcast of `a` and `b`; false when incompatible.
bool broadcastShapes(const std::vector<int64_t> &a,
                     const std::vector<int64_t> &b, std::vector<int64_t> &out);

/// Whether `in` broadcasts to exactly `out` (NumPy rules, leading dims
/// added); otherwise a message saying why, naming operand #`index`.
std::string broadcastError(const std::vector<int64_t> &in,
                           const std::vector<int64_t> &out, size_t index);

} // namespace dlopt::rt
