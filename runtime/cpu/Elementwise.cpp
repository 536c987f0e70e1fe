//===- Elementwise.cpp - Unary, cast, binary, compare and select kernels --===//
//
// 16-bit floats are widened to f32, computed, and rounded once on store.
// Integer arithmetic wraps (done in unsigned to avoid undefined behaviour).
// Broadcasting goes through a BroadcastPlan so the innermost loop runs over
// the longest contiguous stretch with strides 0 or 1.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/KernelUtil.h"
#include "runtime/format/FusedProgram.h"
#include "runtime/cpu/ThreadPool.h"
#include "runtime/cpu/VecMath.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace dlopt::rt::cpu {
namespace {

/// Splits the flat output range [0, outer*inner) across threads and calls
/// `f(row, jBegin, jEnd)` for each piece of each row.
template <typename F>
void forEachRowSegment(int64_t outer, int64_t inner, int64_t costPerElem,
                       F &&f) {
  parallelFor(outer * inner, grainFor(costPerElem), [&](int64_t b, int64_t e) {
    int64_t row = b / inner, j = b % inner;
    while (b < e) {
      int64_t len = std::min(inner - j, e - b);
      f(row, j, j + len);
      b += len;
      ++row;
      j = 0;
    }
  });
}

template <typename I> inline I wrapAdd(I a, I b) {
  using U = std::make_unsigned_t<I>;
  return I(U(a) + U(b));
}
template <typename I> inline I wrapSub(I a, I b) {
  using U = std::make_unsigned_t<I>;
  return I(U(a) - U(b));
}
template <typename I> inline I wrapMul(I a, I b) {
  using U = std::make_unsigned_t<I>;
  return I(U(a) * U(b));
}

//===----------------------------------------------------------------------===//
// Unary
//===----------------------------------------------------------------------===//

enum class Unary {
  Neg,
  Abs,
  Relu,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Tanh,
  Sin,
  Cos,
  Sigmoid,
  Silu,
  GeluErf,
  GeluTanh
};

template <Unary K> inline float unaryF(float x) {
  if constexpr (K == Unary::Neg)
    return -x;
  else if constexpr (K == Unary::Abs)
    return std::fabs(x);
  else if constexpr (K == Unary::Relu)
    return x < 0.0f ? 0.0f : x; // NaN stays NaN
  else if constexpr (K == Unary::Exp)
    return vm::expF(x);
  else if constexpr (K == Unary::Log)
    return std::log(x);
  else if constexpr (K == Unary::Sqrt)
    return std::sqrt(x);
  else if constexpr (K == Unary::Rsqrt)
    return 1.0f / std::sqrt(x);
  else if constexpr (K == Unary::Tanh)
    return vm::tanhF(x);
  else if constexpr (K == Unary::Sin)
    return std::sin(x);
  else if constexpr (K == Unary::Cos)
    return std::cos(x);
  else if constexpr (K == Unary::Sigmoid)
    return vm::sigmoidF(x);
  else if constexpr (K == Unary::Silu)
    return vm::siluF(x);
  else if constexpr (K == Unary::GeluErf)
    return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
  else
    return vm::geluTanhF(x);
}

template <Unary K, typename I> inline I unaryI(I x) {
  if constexpr (K == Unary::Neg)
    return wrapSub(I(0), x);
  else if constexpr (K == Unary::Abs)
    return x < 0 ? wrapSub(I(0), x) : x;
  else
    return x < 0 ? I(0) : x;
}

template <Unary K, typename T>
DLOPT_SIMD_CLONES void unaryLoop(const T *x, T *y, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = fromF32<T>(unaryF<K>(toF32(x[i])));
}

template <Unary K>
Status runUnaryTyped(const TensorRef &in,
                     const TensorRef &out) {
  constexpr bool intOk = K == Unary::Neg || K == Unary::Abs || K == Unary::Relu;
  constexpr int64_t cost = K <= Unary::Relu ? 1 : 16;
  int64_t n = in.numElements();
  auto body = [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = in.as<T>();
    T *y = out.as<T>();
    if constexpr (isFloatStorage<T>) {
      parallelFor(n, grainFor(cost), [&](int64_t b, int64_t e) {
        unaryLoop<K, T>(x + b, y + b, e - b);
      });
    } else {
      parallelFor(n, grainFor(cost), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          y[i] = unaryI<K>(x[i]);
      });
    }
    return Status::ok();
  };
  if constexpr (intOk) {
    return dispatchNumeric(in.type.dtype, body);
  } else {
    return dispatchFloat(in.type.dtype, body);
  }
}

template <Unary K> Status unaryKernel(const Instr &, Ins ins, Outs outs) {
  return runUnaryTyped<K>(ins[0], outs[0]);
}

Status geluKernel(const Instr &instr, Ins ins, Outs outs) {
  std::string approx = "none";
  DLOPT_RETURN_IF_ERROR(getOptStringAttr(instr, "approximate", approx));
  if (approx == "tanh")
    return runUnaryTyped<Unary::GeluTanh>(ins[0], outs[0]);
  return runUnaryTyped<Unary::GeluErf>(ins[0], outs[0]);
}

//===----------------------------------------------------------------------===//
// Cast
//===----------------------------------------------------------------------===//

/// One element of `cast`. i1 travels as uint8_t; any nonzero byte reads as 1.
template <typename D, typename S> inline D castElem(S x) {
  if constexpr (std::is_same_v<D, uint8_t>) {
    if constexpr (isFloatStorage<S>)
      return toF32(x) != 0.0f ? 1 : 0;
    else
      return x != 0 ? 1 : 0;
  } else if constexpr (isFloatStorage<D>) {
    if constexpr (isFloatStorage<S>)
      return fromF32<D>(toF32(x));
    else if constexpr (std::is_same_v<S, uint8_t>)
      return fromF32<D>(x != 0 ? 1.0f : 0.0f);
    else
      return fromF32<D>(float(x));
  } else {
    if constexpr (isFloatStorage<S>)
      return floatToInt<D>(double(toF32(x)));
    else if constexpr (std::is_same_v<S, uint8_t>)
      return x != 0 ? 1 : 0;
    else
      return D(x); // int -> int wraps, as a C++ conversion does
  }
}

Status castKernel(const Instr &, Ins ins, Outs outs) {
  int64_t n = ins[0].numElements();
  return dispatchAny(ins[0].type.dtype, [&](auto stag) -> Status {
    using S = decltype(stag);
    return dispatchAny(outs[0].type.dtype, [&](auto dtag) -> Status {
      using D = decltype(dtag);
      const S *x = ins[0].as<S>();
      D *y = outs[0].as<D>();
      parallelFor(n, grainFor(2), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          y[i] = castElem<D>(x[i]);
      });
      return Status::ok();
    });
  });
}

//===----------------------------------------------------------------------===//
// Binary and compare
//===----------------------------------------------------------------------===//

enum class Binary { Add, Sub, Mul, Div, Max, Min, Pow };
enum class Pred { Eq, Ne, Lt, Le, Gt, Ge };

template <Binary K> inline float binaryF(float a, float b) {
  if constexpr (K == Binary::Add)
    return a + b;
  else if constexpr (K == Binary::Sub)
    return a - b;
  else if constexpr (K == Binary::Mul)
    return a * b;
  else if constexpr (K == Binary::Div)
    return a / b;
  else if constexpr (K == Binary::Max)
    return a != a ? a : (b != b ? b : (a > b ? a : b));
  else if constexpr (K == Binary::Min)
    return a != a ? a : (b != b ? b : (a < b ? a : b));
  else
    return std::pow(a, b);
}

template <Binary K, typename I> inline I binaryI(I a, I b) {
  if constexpr (K == Binary::Add)
    return wrapAdd(a, b);
  else if constexpr (K == Binary::Sub)
    return wrapSub(a, b);
  else if constexpr (K == Binary::Mul)
    return wrapMul(a, b);
  else if constexpr (K == Binary::Div)
    // b != 0 was checked up front; MIN / -1 wraps instead of trapping.
    return b == -1 ? wrapSub(I(0), a) : I(a / b);
  else if constexpr (K == Binary::Max)
    return a > b ? a : b;
  else
    return a < b ? a : b;
}

template <Pred P, typename C> inline uint8_t comparePred(C a, C b) {
  if constexpr (P == Pred::Eq)
    return a == b;
  else if constexpr (P == Pred::Ne)
    return a != b;
  else if constexpr (P == Pred::Lt)
    return a < b;
  else if constexpr (P == Pred::Le)
    return a <= b;
  else if constexpr (P == Pred::Gt)
    return a > b;
  else
    return a >= b;
}

/// po[j] = f(pa[j * sa], pb[j * sb]) for strides 0 or 1, specialized so
/// that each case vectorizes.
template <typename TA, typename TO, typename F>
DLOPT_SIMD_CLONES void binaryLoop(const TA *pa, const TA *pb, TO *po,
                                  int64_t len, int64_t sa, int64_t sb, F f) {
  if (sa == 1 && sb == 1)
    for (int64_t j = 0; j < len; ++j)
      po[j] = f(pa[j], pb[j]);
  else if (sa == 1)
    for (int64_t j = 0; j < len; ++j)
      po[j] = f(pa[j], pb[0]);
  else if (sb == 1)
    for (int64_t j = 0; j < len; ++j)
      po[j] = f(pa[0], pb[j]);
  else
    for (int64_t j = 0; j < len; ++j)
      po[j] = f(pa[0], pb[0]);
}

/// out[i] = f(a[...], b[...]) over a broadcast plan; the innermost loop is
/// specialized on the operand strides so the common cases vectorize.
template <typename TA, typename TO, typename F>
void broadcast2(const BroadcastPlan &p, const TA *a, const TA *b, TO *out,
                int64_t cost, F f) {
  int64_t inner = p.inner();
  int64_t sa = p.strides[0].back(), sb = p.strides[1].back();
  forEachRowSegment(p.outer(), inner, cost,
                    [&](int64_t row, int64_t j0, int64_t j1) {
                      const TA *pa = a + p.rowOffset(0, row) + j0 * sa;
                      const TA *pb = b + p.rowOffset(1, row) + j0 * sb;
                      TO *po = out + row * inner + j0;
                      int64_t len = j1 - j0;
                      binaryLoop(pa, pb, po, len, sa, sb, f);
                    });
}

/// Plans a broadcasting binary op (shapes checked by the verifier).
void planBinary(Ins ins, Outs outs, BroadcastPlan &p) {
  planBroadcast(outs[0].type.shape, {ins[0].type.shape, ins[1].type.shape}, p);
}

template <Binary K>
Status binaryKernel(const Instr &instr, Ins ins, Outs outs) {
  BroadcastPlan p;
  planBinary(ins, outs, p);
  const TensorType &t = ins[0].type;
  if (outs[0].numElements() == 0)
    return Status::ok();
  constexpr int64_t cost = K == Binary::Pow ? 16 : (K == Binary::Div ? 4 : 1);
  return dispatchNumeric(t.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *a = ins[0].as<T>(), *b = ins[1].as<T>();
    T *o = outs[0].as<T>();
    if constexpr (isFloatStorage<T>) {
      broadcast2(p, a, b, o, cost, [](T x, T y) {
        return fromF32<T>(binaryF<K>(toF32(x), toF32(y)));
      });
    } else {
      if constexpr (K == Binary::Div) {
        int64_t nb = ins[1].numElements();
        // Every element of b is used at least once when the result is not
        // empty, so a zero anywhere in b is a division by zero.
        for (int64_t i = 0; i < nb; ++i)
          if (b[i] == 0)
            return opError(instr, "integer division by zero (element " +
                                      std::to_string(i) + " of operand #1)");
      }
      broadcast2(p, a, b, o, cost, [](T x, T y) { return binaryI<K>(x, y); });
    }
    return Status::ok();
  });
}

template <Pred P>
Status runCompare(const BroadcastPlan &p, const TensorRef &a,
                  const TensorRef &b, const TensorRef &out) {
  return dispatchNumeric(a.type.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    uint8_t *o = out.as<uint8_t>();
    if constexpr (isFloatStorage<T>)
      broadcast2(p, a.as<T>(), b.as<T>(), o, 1,
                 [](T x, T y) { return comparePred<P>(toF32(x), toF32(y)); });
    else
      broadcast2(p, a.as<T>(), b.as<T>(), o, 1,
                 [](T x, T y) { return comparePred<P>(x, y); });
    return Status::ok();
  });
}

Status compareKernel(const Instr &instr, Ins ins, Outs outs) {
  BroadcastPlan p;
  planBinary(ins, outs, p);
  std::string pred;
  DLOPT_RETURN_IF_ERROR(getOptStringAttr(instr, "predicate", pred));
  if (pred == "eq")
    return runCompare<Pred::Eq>(p, ins[0], ins[1], outs[0]);
  if (pred == "ne")
    return runCompare<Pred::Ne>(p, ins[0], ins[1], outs[0]);
  if (pred == "lt")
    return runCompare<Pred::Lt>(p, ins[0], ins[1], outs[0]);
  if (pred == "le")
    return runCompare<Pred::Le>(p, ins[0], ins[1], outs[0]);
  if (pred == "gt")
    return runCompare<Pred::Gt>(p, ins[0], ins[1], outs[0]);
  if (pred == "ge")
    return runCompare<Pred::Ge>(p, ins[0], ins[1], outs[0]);
  return opError(instr, "expects attribute 'predicate' to be one of eq, ne, "
                        "lt, le, gt, ge, got '" +
                            pred + "'");
}

//===----------------------------------------------------------------------===//
// Select
//===----------------------------------------------------------------------===//

Status selectKernel(const Instr &, Ins ins, Outs outs) {
  BroadcastPlan p;
  planBroadcast(outs[0].type.shape,
                {ins[0].type.shape, ins[1].type.shape, ins[2].type.shape}, p);
  return dispatchBySize(ins[1].type.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const uint8_t *c = ins[0].as<uint8_t>();
    const T *a = ins[1].as<T>(), *b = ins[2].as<T>();
    T *o = outs[0].as<T>();
    int64_t inner = p.inner();
    int64_t sc = p.strides[0].back(), sa = p.strides[1].back(),
            sb = p.strides[2].back();
    forEachRowSegment(
        p.outer(), inner, 1, [&](int64_t row, int64_t j0, int64_t j1) {
          const uint8_t *pc = c + p.rowOffset(0, row);
          const T *pa = a + p.rowOffset(1, row), *pb = b + p.rowOffset(2, row);
          T *po = o + row * inner;
          // Dense condition and operands, or a scalar on one side (ReLU's
          // gradient: select(x > 0, dy, 0)): bit masks instead of branches
          // (a data-dependent branch mispredicts on half the elements), in
          // loops the compiler vectorizes.
          auto pick = [](uint8_t c, T x, T y) {
            T m = T(T(0) - T(c != 0));
            return T((x & m) | (y & T(~m)));
          };
          if (sc == 1 && sa == 1 && sb == 1)
            for (int64_t j = j0; j < j1; ++j)
              po[j] = pick(pc[j], pa[j], pb[j]);
          else if (sc == 1 && sa == 1 && sb == 0)
            for (int64_t j = j0; j < j1; ++j)
              po[j] = pick(pc[j], pa[j], pb[0]);
          else if (sc == 1 && sa == 0 && sb == 1)
            for (int64_t j = j0; j < j1; ++j)
              po[j] = pick(pc[j], pa[0], pb[j]);
          else
            for (int64_t j = j0; j < j1; ++j)
              po[j] = pc[j * sc] ? pa[j * sa] : pb[j * sb];
        });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// Fused elementwise groups
//===----------------------------------------------------------------------===//
//
// The per-element program (runtime/format/FusedProgram.h) runs over blocks
// of kFusedBlock elements: each register is a row of the block, each step
// one vectorizable loop over the rows it reads, using the very same scalar
// functions as the unfused kernels above (unaryF/binaryF), so with f32
// tensors the results are bitwise those of one kernel per op. Registers stay
// f32 throughout; only the results are rounded to their element type (an
// explicit cast step rounds to its target type, as the cast op would). All
// inputs of a block are loaded before any result of the block is stored,
// which is what lets a result share an operand's bytes (in-place updates).

constexpr int64_t kFusedBlock = 256;
/// How many blocks ahead fusedSegments prefetches its streams.
constexpr int64_t kFusedAhead = 2;

/// Prefetches the cache lines of bytes [off, off + len) of `base`.
inline void prefetchRange(const void *base, int64_t off, int64_t len,
                          bool write) {
  const char *p = static_cast<const char *>(base) + off;
  for (int64_t i = 0; i < len; i += 64) {
    if (write)
      __builtin_prefetch(p + i, 1, 3);
    else
      __builtin_prefetch(p + i, 0, 3);
  }
}

template <Unary K> void unaryRow(float *d, const float *a, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    d[j] = unaryF<K>(a[j]);
}
template <Binary K>
void binaryRow(float *d, const float *a, const float *b, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    d[j] = binaryF<K>(a[j], b[j]);
}
/// A comparison step: 1.0 where `cmp` holds, 0.0 elsewhere (NaN compares
/// unequal to everything, as in the compare op).
template <Pred P>
void compareRow(float *d, const float *a, const float *b, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    d[j] = comparePred<P>(a[j], b[j]) ? 1.0f : 0.0f;
}
/// select cond, t, f: t where cond != 0, f elsewhere (the select op's copy
/// of the chosen value, bit for bit).
inline void selectRow(float *d, const float *cond, const float *t,
                      const float *f, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    // Both loads unconditional: `cond ? t[j] : f[j]` reads only one in C++,
    // which compiles to masked loads (vmaskmovps, several times slower than
    // a blend on the dev box's Zen cores).
    const float tv = t[j], fv = f[j];
    d[j] = cond[j] != 0.0f ? tv : fv;
  }
}
template <typename T> void roundRow(float *d, const float *a, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    d[j] = toF32(fromF32<T>(a[j]));
}

DLOPT_SIMD_CLONES void runStep(const fused::Step &st, float *d,
                               const float *a, const float *b,
                               const float *c, int64_t n) {
  using O = fused::OpCode;
  switch (st.op) {
  case O::Neg: return unaryRow<Unary::Neg>(d, a, n);
  case O::Abs: return unaryRow<Unary::Abs>(d, a, n);
  case O::Relu: return unaryRow<Unary::Relu>(d, a, n);
  case O::Exp: return unaryRow<Unary::Exp>(d, a, n);
  case O::Log: return unaryRow<Unary::Log>(d, a, n);
  case O::Sqrt: return unaryRow<Unary::Sqrt>(d, a, n);
  case O::Rsqrt: return unaryRow<Unary::Rsqrt>(d, a, n);
  case O::Tanh: return unaryRow<Unary::Tanh>(d, a, n);
  case O::Sin: return unaryRow<Unary::Sin>(d, a, n);
  case O::Cos: return unaryRow<Unary::Cos>(d, a, n);
  case O::Sigmoid: return unaryRow<Unary::Sigmoid>(d, a, n);
  case O::Silu: return unaryRow<Unary::Silu>(d, a, n);
  case O::Gelu: return unaryRow<Unary::GeluErf>(d, a, n);
  case O::GeluTanh: return unaryRow<Unary::GeluTanh>(d, a, n);
  case O::Cast:
    if (DType(st.b) == DType::F16)
      return roundRow<Half16>(d, a, n);
    if (DType(st.b) == DType::BF16)
      return roundRow<BFloat16>(d, a, n);
    return roundRow<float>(d, a, n);
  case O::Add: return binaryRow<Binary::Add>(d, a, b, n);
  case O::Sub: return binaryRow<Binary::Sub>(d, a, b, n);
  case O::Mul: return binaryRow<Binary::Mul>(d, a, b, n);
  case O::Div: return binaryRow<Binary::Div>(d, a, b, n);
  case O::Max: return binaryRow<Binary::Max>(d, a, b, n);
  case O::Min: return binaryRow<Binary::Min>(d, a, b, n);
  case O::Pow: return binaryRow<Binary::Pow>(d, a, b, n);
  case O::CmpEq: return compareRow<Pred::Eq>(d, a, b, n);
  case O::CmpNe: return compareRow<Pred::Ne>(d, a, b, n);
  case O::CmpLt: return compareRow<Pred::Lt>(d, a, b, n);
  case O::CmpLe: return compareRow<Pred::Le>(d, a, b, n);
  case O::CmpGt: return compareRow<Pred::Gt>(d, a, b, n);
  case O::CmpGe: return compareRow<Pred::Ge>(d, a, b, n);
  case O::Select: return selectRow(d, a, b, c, n);
  }
}

/// Runs a checked program over its segments' operands and results (one
/// segment, or the multi-tensor form's several: every parameter of an
/// optimizer update). The blocks of every segment form one parallel loop,
/// so small segments share the threads instead of each paying a dispatch
/// and a join, and a worker sets up its registers once.
void fusedSegments(const fused::Program &p, Ins allIns, Outs allOuts) {
  const size_t numSeg = size_t(p.numSegments);
  const int64_t numIn = p.numInputs, numConst = int64_t(p.consts.size());
  const size_t numOut = p.outputs.size();
  const int64_t numRegs = p.numRegisters();
  // firstBlock[s]: the global index of segment s's first block.
  std::vector<int64_t> firstBlock(numSeg + 1, 0);
  for (size_t g = 0; g < numSeg; ++g) {
    int64_t n = allOuts[g * numOut].numElements();
    firstBlock[g + 1] = firstBlock[g] + (n + kFusedBlock - 1) / kFusedBlock;
  }
  const int64_t numBlocks = firstBlock[numSeg];
  if (numBlocks == 0)
    return;
  // An input that is also an output is copied: another output's store
  // could overwrite its bytes before it is stored.
  std::vector<char> inPlace(static_cast<size_t>(numIn), 1);
  for (int64_t o : p.outputs)
    if (o < numIn)
      inPlace[size_t(o)] = 0;
  int64_t cost = kFusedBlock * (4 + 4 * int64_t(p.steps.size()));
  parallelFor(numBlocks, grainFor(cost), [&](int64_t b, int64_t e) {
    std::vector<float> regs(size_t(numRegs * kFusedBlock));
    auto row = [&](int64_t r) { return regs.data() + r * kFusedBlock; };
    for (int64_t c = 0; c < numConst; ++c)
      std::fill_n(row(numIn + c), kFusedBlock, float(p.consts[size_t(c)]));
    // Where each register's block lives: its row, or for an f32 input the
    // tensor itself (read in place: no copy; results are stored only after
    // every step, so an output sharing an input's bytes is still safe).
    std::vector<const float *> src(static_cast<size_t>(numRegs));
    for (int64_t r = 0; r < numRegs; ++r)
      src[size_t(r)] = row(r);
    size_t seg = size_t(std::upper_bound(firstBlock.begin(), firstBlock.end(),
                                         b) -
                        firstBlock.begin()) -
                 1;
    size_t setUp = numSeg; // the segment whose rank-0 rows are filled
    for (int64_t blk = b; blk < e; ++blk) {
      while (blk >= firstBlock[seg + 1])
        ++seg;
      Ins ins = allIns.subspan(seg * size_t(numIn), size_t(numIn));
      Outs outs = allOuts.subspan(seg * numOut, numOut);
      if (setUp != seg) {
        // Rank-0 inputs: broadcast rows, filled once per segment.
        for (int64_t k = 0; k < numIn; ++k) {
          src[size_t(k)] = row(k);
          if (ins[k].type.shape.empty()) {
            float v = 0.0f;
            (void)dispatchFloat(ins[k].type.dtype, [&](auto tag) -> Status {
              v = toF32(*ins[k].as<decltype(tag)>());
              return Status::ok();
            });
            std::fill_n(row(k), kFusedBlock, v);
          }
        }
        setUp = seg;
      }
      const int64_t n = outs[0].numElements();
      const int64_t i0 = (blk - firstBlock[seg]) * kFusedBlock;
      const int64_t len = std::min(kFusedBlock, n - i0);
      // The steps read one input each, one after another, so the hardware
      // prefetcher sees short streams that stop and start: ask for the
      // block kFusedAhead blocks on of every input and output now, so that
      // all of them are in flight while this block computes (the
      // momentum-style update of benchmarks/cpu_elementwise.cpp ran at a
      // third of a hand loop's speed without).
      if (const int64_t a = i0 + kFusedAhead * kFusedBlock; a < n) {
        const int64_t aLen = std::min(kFusedBlock, n - a);
        for (int64_t k = 0; k < numIn; ++k)
          if (!ins[k].type.shape.empty())
            prefetchRange(ins[k].data, a * dtypeSize(ins[k].type.dtype),
                          aLen * dtypeSize(ins[k].type.dtype), false);
        for (size_t o = 0; o < outs.size(); ++o)
          prefetchRange(outs[o].data, a * dtypeSize(outs[o].type.dtype),
                        aLen * dtypeSize(outs[o].type.dtype), true);
      }
      for (int64_t k = 0; k < numIn; ++k) {
        if (ins[k].type.shape.empty())
          continue;
        if (ins[k].type.dtype == DType::F32 && inPlace[size_t(k)]) {
          src[size_t(k)] = ins[k].as<float>() + i0;
          continue;
        }
        (void)dispatchFloat(ins[k].type.dtype, [&](auto tag) -> Status {
          loadF32(ins[k].as<decltype(tag)>() + i0, row(k), len);
          return Status::ok();
        });
      }
      for (size_t s = 0; s < p.steps.size(); ++s) {
        const fused::Step &st = p.steps[s];
        const bool two = fused::isBinary(st.op) || fused::isTernary(st.op);
        runStep(st, row(numIn + numConst + int64_t(s)), src[size_t(st.a)],
                two ? src[size_t(st.b)] : nullptr,
                fused::isTernary(st.op) ? src[size_t(st.c)] : nullptr, len);
      }
      for (size_t o = 0; o < outs.size(); ++o)
        (void)dispatchFloat(outs[o].type.dtype, [&](auto tag) -> Status {
          storeF32(src[size_t(p.outputs[o])], outs[o].as<decltype(tag)>() + i0,
                   len);
          return Status::ok();
        });
    }
  });
}

Status fusedKernel(const Instr &instr, Ins ins, Outs outs) {
  std::vector<TensorType> ot, rt;
  for (const TensorRef &t : ins)
    ot.push_back(t.type);
  for (const TensorRef &t : outs)
    rt.push_back(t.type);
  auto decoded = fused::decode(instr, ot, rt);
  if (!decoded)
    return opError(instr, decoded.status().message());
  fusedSegments(*decoded, ins, outs);
  return Status::ok();
}

} // namespace

void registerElementwiseKernels(KernelRegistry &r) {
  r["neg"] = unaryKernel<Unary::Neg>;
  r["abs"] = unaryKernel<Unary::Abs>;
  r["relu"] = unaryKernel<Unary::Relu>;
  r["exp"] = unaryKernel<Unary::Exp>;
  r["log"] = unaryKernel<Unary::Log>;
  r["sqrt"] = unaryKernel<Unary::Sqrt>;
  r["rsqrt"] = unaryKernel<Unary::Rsqrt>;
  r["tanh"] = unaryKernel<Unary::Tanh>;
  r["sin"] = unaryKernel<Unary::Sin>;
  r["cos"] = unaryKernel<Unary::Cos>;
  r["sigmoid"] = unaryKernel<Unary::Sigmoid>;
  r["silu"] = unaryKernel<Unary::Silu>;
  r["gelu"] = geluKernel;
  r["cast"] = castKernel;
  r["add"] = binaryKernel<Binary::Add>;
  r["sub"] = binaryKernel<Binary::Sub>;
  r["mul"] = binaryKernel<Binary::Mul>;
  r["div"] = binaryKernel<Binary::Div>;
  r["maximum"] = binaryKernel<Binary::Max>;
  r["minimum"] = binaryKernel<Binary::Min>;
  r["pow"] = binaryKernel<Binary::Pow>;
  r["compare"] = compareKernel;
  r["select"] = selectKernel;
  r[fused::kOpName] = fusedKernel;
}

} // namespace dlopt::rt::cpu
