//===- OpTable.h - The runtime's operations and their one verifier -------===//
//
// Every instruction an executable may hold is listed here once, with the
// function that checks an instruction of that op against its operand and
// result types and its attributes. Executable::validate() runs it on every
// instruction when an executable is read or built, so by the time a backend
// runs an instruction it is known to be well formed: the CPU kernels and the
// CUDA handlers check nothing that depends only on types and attributes.
// They still check what depends on data (an id out of range, an integer
// division by zero), which only running can tell.
//
// The shape rules that the verifier and the kernels both need (convolution
// and pooling windows, normalization extents, slices, matmul dims) live here
// too, so the two cannot disagree. After a successful verifyInstr() they
// cannot fail.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/format/OpCheck.h"

#include <string>
#include <vector>

namespace dlopt::rt {

/// What the op table knows of one op.
struct OpInfo {
  std::string name;  ///< mnemonic without the dialect prefix ("matmul")
  bool communication = false; ///< runs over a communicator group
  /// Checks one instruction of this op against its operand/result types.
  Status (*verify)(const Instr &, TypeSpan ins, TypeSpan outs) = nullptr;
};

/// Every op, sorted by name.
const std::vector<OpInfo> &opTable();
/// The op called `name`, or null.
const OpInfo *findOp(const std::string &name);

/// Checks `instr` against its operand and result types: a known op, the
/// operand and result counts, element types, shapes and attributes. Errors
/// read "op 'NAME' at LOC: what, expected versus got". Communication ops are
/// checked here for everything but their group's size, which needs the
/// executable (Executable::validate checks that).
Status verifyInstr(const Instr &instr, TypeSpan ins, TypeSpan outs);

//===----------------------------------------------------------------------===//
// Shape rules shared by the verifier and the backends
//===----------------------------------------------------------------------===//

/// The result type of a communication instruction (all_reduce, all_gather,
/// reduce_scatter, all_slice, all_to_all, broadcast) with operand type `x`
/// over a group of `n` ranks, after checking its attributes (reduce, axis,
/// split_axis/concat_axis, root) and that its split dims divide by `n`.
/// Executable::validate and the CUDA backend's CommPlan both use it; the
/// messages name no op (callers prefix it).
Expected<TensorType> commResultType(const Instr &instr, const TensorType &x,
                                    int64_t n);

/// matmul: op(A) is [.., M, K], op(B) is [.., K, N].
struct MatmulDims {
  bool transA = false, transB = false;
  int64_t m = 0, n = 0, k = 0;
  std::vector<int64_t> batch; ///< broadcast batch dims of the result
};
Status matmulDims(const Instr &instr, const TensorType &a, const TensorType &b,
                  MatmulDims &out);
/// The same rule for explicit transposes, with messages that name no op
/// (the CUDA GEMM planner's form).
Status matmulShapes(const TensorType &a, const TensorType &b, bool transA,
                    bool transB, MatmulDims &out);

/// slice / slice_grad: start, limit, stride over `full`, and the sliced
/// shape.
struct SliceGeom {
  std::vector<int64_t> start, limit, stride, sliced;
};
Status sliceGeometry(const Instr &instr, const std::vector<int64_t> &full,
                     SliceGeom &out);

/// layer_norm / rms_norm and their gradients: the normalized trailing dims
/// from `axis`, epsilon, and which of weight and bias are present.
struct NormGeom {
  int64_t axis = 0;
  double eps = 1e-5;
  bool hasWeight = false, hasBias = false;
  std::vector<int64_t> normShape;
  int64_t n = 1;    ///< elements normalized together
  int64_t rows = 0; ///< independent rows
};
/// `numIns` is the operand count; `grad` selects the gradient op's operand
/// layout (x, dy[, weight]).
Status normGeometry(const Instr &instr, const TensorType &x, bool rms,
                    bool grad, size_t numIns, NormGeom &out);

/// attention / attention_grad: q [B,H,S,D], k [B,G,T,D], v [B,G,T,E].
struct AttentionDims {
  int64_t b = 0, h = 0, s = 0, d = 0, g = 0, t = 0, e = 0;
  bool causal = false;
  double scale = 1.0;
};
Status attentionDims(const Instr &instr, const TensorType &q,
                     const TensorType &k, const TensorType &v,
                     AttentionDims &out);

/// conv2d: x [N,C,H,W], w [O,C/groups,KH,KW].
struct ConvGeom {
  int64_t groups = 1;
  int64_t cg = 0, h = 0, w = 0, kh = 0, kw = 0, oh = 0, ow = 0;
  std::vector<int64_t> stride, padding, dilation;
  int64_t ckk() const { return cg * kh * kw; }
  /// 1x1 kernel, stride 1, no padding: the input plane is the column matrix.
  bool direct() const {
    return kh == 1 && kw == 1 && stride[0] == 1 && stride[1] == 1 &&
           padding[0] == 0 && padding[1] == 0;
  }
};
/// Reads stride/padding/dilation/groups; `bias` (optional) must be [O].
Status convGeometry(const Instr &instr, const TensorType &x,
                    const TensorType &w, const TensorType *bias,
                    ConvGeom &out);
/// The gradients' form: x, w and dy [N,O,OH,OW] of one float type, with dy
/// matching conv2d's output shape.
Status convGradGeometry(const Instr &instr, const TensorType &x,
                        const TensorType &w, const TensorType &dy,
                        ConvGeom &out);

/// max_pool2d / avg_pool2d over the last two dims of x [..., H, W].
struct PoolGeom {
  std::vector<int64_t> kernel, stride, padding{0, 0};
  bool includePad = true;
  std::vector<int64_t> pooled; ///< x's shape with H, W replaced by OH, OW
};
Status poolGeometry(const Instr &instr, bool isMax, const TensorType &x,
                    PoolGeom &out);
/// The gradients' form: `x` the forward input type, `dy` the pooled type.
Status poolGradGeometry(const Instr &instr, bool isMax, const TensorType &x,
                        const TensorType &dy, PoolGeom &out);

} // namespace dlopt::rt
