//===- Reduce.cpp - sum, mean and max over a set of dims
//-------------------===//
//
// The input is viewed as alternating runs of kept and reduced dims (size-1
// dims dropped, neighbours merged). When the innermost run is reduced, each
// output element walks a contiguous stretch; when it is kept, whole rows of
// the input are accumulated into a block of outputs, which keeps memory
// access sequential for reductions over leading dims. Float sums accumulate
// in double, in an order fixed by the shape alone (never by the thread
// count): a contiguous stretch is added in vm::laneSum's interleaved lanes
// (vectorizable, where one running sum would be a chain of dependent adds),
// and a long reduction is cut into fixed chunks of kSumChunk elements,
// summed in parallel and then added in chunk order.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/KernelUtil.h"
#include "runtime/cpu/ThreadPool.h"
#include "runtime/cpu/VecMath.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dlopt::rt::cpu {
namespace {

enum class Reduction { Sum, Mean, Max };

struct Dim {
  int64_t size, stride;
};

/// Walks the offsets of a multi-dim index space in row-major order.
struct Odometer {
  const std::vector<Dim> *dims;
  std::vector<int64_t> idx;
  int64_t offset = 0;

  explicit Odometer(const std::vector<Dim> &d) : dims(&d), idx(d.size(), 0) {}
  /// Positions at linear index `linear`.
  void seek(int64_t linear) {
    offset = 0;
    for (size_t i = dims->size(); i-- > 0;) {
      idx[i] = linear % (*dims)[i].size;
      linear /= (*dims)[i].size;
      offset += idx[i] * (*dims)[i].stride;
    }
  }
  void next() {
    for (size_t i = dims->size(); i-- > 0;) {
      const Dim &d = (*dims)[i];
      offset += d.stride;
      if (++idx[i] < d.size)
        return;
      offset -= d.stride * d.size;
      idx[i] = 0;
    }
  }
};

/// Accumulator per element type and reduction.
template <typename T, Reduction K> struct Acc {
  static constexpr bool isF = isFloatStorage<T>;
  using Value =
      std::conditional_t<K == Reduction::Max, std::conditional_t<isF, float, T>,
                         std::conditional_t<isF, double, uint64_t>>;
  static Value init() {
    if constexpr (K != Reduction::Max)
      return 0;
    else if constexpr (isF)
      return -std::numeric_limits<float>::infinity();
    else
      return std::numeric_limits<T>::min();
  }
  static void add(Value &acc, T x) {
    if constexpr (K != Reduction::Max) {
      if constexpr (isF)
        acc += double(toF32(x));
      else
        acc += uint64_t(int64_t(x)); // wraps like the op's integer sum
    } else if constexpr (isF) {
      float v = toF32(x);
      if (acc == acc && (v != v || v > acc)) // NaN sticks
        acc = v;
    } else if (x > acc) {
      acc = x;
    }
  }
  static T finish(Value acc, int64_t count) {
    if constexpr (K == Reduction::Mean && isF)
      return fromF32<T>(float(acc / double(count)));
    else if constexpr (K == Reduction::Mean)
      return T(int64_t(acc) / count); // not reached: mean is float-only
    else if constexpr (isF)
      return fromF32<T>(float(acc));
    else
      return T(acc);
  }
};

/// Elements of one chunk of a long float sum (see the file comment).
constexpr int64_t kSumChunk = 16384;

/// The double sum of x[0..n), in vm::laneSum's interleaved lanes.
template <typename T> double sumStretch(const T *x, int64_t n) {
  return vm::laneSum(1, n,
                     [&](int64_t, int64_t j) { return double(toF32(x[j])); });
}

template <typename T, Reduction K>
void reduce(const T *x, T *y, const std::vector<Dim> &kept,
            const std::vector<Dim> &red, bool innerKept) {
  using A = Acc<T, K>;
  int64_t numOut = 1, numRed = 1;
  for (const Dim &d : kept)
    numOut *= d.size;
  for (const Dim &d : red)
    numRed *= d.size;

  if constexpr (K != Reduction::Max && isFloatStorage<T>)
    if (!innerKept) {
      // Each output: its reduced elements in row-major order, cut into
      // chunks of kSumChunk (rows of rowLen contiguous elements); every chunk
      // is summed by sumStretch, the chunks are then added in order.
      const int64_t rowLen = red.empty() ? 1 : red.back().size;
      std::vector<Dim> outerRed(red.begin(), red.end() - (red.empty() ? 0 : 1));
      const int64_t chunks = (numRed + kSumChunk - 1) / kSumChunk;
      std::vector<double> part(size_t(numOut * chunks));
      parallelFor(numOut * chunks, grainFor(std::min(numRed, kSumChunk)),
                  [&](int64_t b, int64_t e) {
                    Odometer ko(kept), ro(outerRed);
                    int64_t at = -1; // the output ko points at
                    for (int64_t item = b; item < e; ++item) {
                      const int64_t o = item / chunks, c = item % chunks;
                      int64_t f = c * kSumChunk;
                      const int64_t end = std::min(numRed, f + kSumChunk);
                      if (o == at + 1 && at >= 0)
                        ko.next();
                      else if (o != at)
                        ko.seek(o);
                      at = o;
                      ro.seek(f / rowLen);
                      double acc = 0;
                      while (f < end) {
                        const int64_t j = f % rowLen;
                        const int64_t len = std::min(rowLen - j, end - f);
                        acc += sumStretch(x + ko.offset + ro.offset + j, len);
                        f += len;
                        if (j + len == rowLen)
                          ro.next();
                      }
                      part[size_t(item)] = acc;
                    }
                  });
      for (int64_t o = 0; o < numOut; ++o) {
        double acc = 0;
        for (int64_t c = 0; c < chunks; ++c)
          acc += part[size_t(o * chunks + c)];
        y[o] = A::finish(acc, numRed);
      }
      return;
    }

  if (!innerKept) {
    // Innermost run reduced (stride 1): each output walks contiguous rows.
    int64_t rowLen = red.empty() ? 1 : red.back().size;
    std::vector<Dim> outerRed(red.begin(), red.end() - (red.empty() ? 0 : 1));
    int64_t numRows = numRed / rowLen;
    parallelFor(numOut, grainFor(numRed), [&](int64_t b, int64_t e) {
      Odometer ko(kept), ro(outerRed);
      ko.seek(b);
      for (int64_t o = b; o < e; ++o, ko.next()) {
        typename A::Value acc = A::init();
        ro.seek(0);
        for (int64_t r = 0; r < numRows; ++r, ro.next()) {
          const T *p = x + ko.offset + ro.offset;
          for (int64_t j = 0; j < rowLen; ++j)
            A::add(acc, p[j]);
        }
        y[o] = A::finish(acc, numRed);
      }
    });
    return;
  }

  // Innermost run kept: accumulate input rows into blocks of outputs.
  constexpr int64_t kBlock = 256;
  int64_t inner = kept.back().size;
  std::vector<Dim> outerKept(kept.begin(), kept.end() - 1);
  int64_t numOuter = numOut / inner;
  int64_t numBlocks = (inner + kBlock - 1) / kBlock;
  parallelFor(numOuter * numBlocks, grainFor(numRed * kBlock),
              [&](int64_t b, int64_t e) {
                Odometer ko(outerKept), ro(red);
                typename A::Value acc[kBlock];
                for (int64_t item = b; item < e; ++item) {
                  int64_t outer = item / numBlocks;
                  int64_t j0 = (item % numBlocks) * kBlock;
                  int64_t len = std::min(kBlock, inner - j0);
                  ko.seek(outer);
                  std::fill(acc, acc + len, A::init());
                  ro.seek(0);
                  for (int64_t r = 0; r < numRed; ++r, ro.next()) {
                    const T *p = x + ko.offset + ro.offset + j0;
                    for (int64_t j = 0; j < len; ++j)
                      A::add(acc[j], p[j]);
                  }
                  T *q = y + outer * inner + j0;
                  for (int64_t j = 0; j < len; ++j)
                    q[j] = A::finish(acc[j], numRed);
                }
              });
}

template <Reduction K>
Status reduceKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &in = ins[0].type;
  std::vector<int64_t> dims;
  DLOPT_RETURN_IF_ERROR(getIntsAttr(instr, "dims", dims));
  size_t rank = in.shape.size();
  std::vector<bool> isRed(rank, false);
  for (int64_t d : dims)
    isRed[size_t(d)] = true;

  // Collapse into runs of kept / reduced dims.
  std::vector<int64_t> strides = contiguousStrides(in.shape);
  std::vector<Dim> kept, red;
  int lastKind = -1; // 0 kept, 1 reduced
  for (size_t i = 0; i < rank; ++i) {
    if (in.shape[i] == 1)
      continue;
    std::vector<Dim> &run = isRed[i] ? red : kept;
    int kind = isRed[i] ? 1 : 0;
    if (kind == lastKind) {
      run.back().size *= in.shape[i];
      run.back().stride = strides[i];
    } else {
      run.push_back({in.shape[i], strides[i]});
    }
    lastKind = kind;
  }
  bool innerKept = lastKind == 0;
  if (outs[0].numElements() == 0)
    return Status::ok();
  return dispatchNumeric(in.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    reduce<T, K>(ins[0].as<T>(), outs[0].as<T>(), kept, red, innerKept);
    return Status::ok();
  });
}

} // namespace

void registerReduceKernels(KernelRegistry &r) {
  r["sum"] = reduceKernel<Reduction::Sum>;
  r["mean"] = reduceKernel<Reduction::Mean>;
  r["max"] = reduceKernel<Reduction::Max>;
}

} // namespace dlopt::rt::cpu
