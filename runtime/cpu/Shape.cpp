//===- Shape.cpp - reshape, transpose, broadcast_to, concat, slice, ... ---===//
//
// Pure data movement: kernels dispatch on the element size only, so every
// dtype (including i1) shares one instantiation per size.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/KernelUtil.h"
#include "runtime/cpu/ThreadPool.h"

#include <algorithm>
#include <cstring>

namespace dlopt::rt::cpu {
namespace {

Status reshapeKernel(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(checkArity(instr, ins, outs, 1, 1));
  DLOPT_RETURN_IF_ERROR(
      checkDType(instr, "result", outs[0].type.dtype, ins[0].type.dtype));
  if (outs[0].numElements() != ins[0].numElements())
    return opError(instr, "expects the result to have " +
                              std::to_string(ins[0].numElements()) +
                              " elements like the operand, got " +
                              typeStr(outs[0].type));
  int64_t bytes = ins[0].type.byteSize();
  parallelFor(bytes, 1 << 20, [&](int64_t b, int64_t e) {
    std::memcpy(static_cast<char *>(outs[0].data) + b,
                static_cast<const char *>(ins[0].data) + b, size_t(e - b));
  });
  return Status::ok();
}

Status transposeKernel(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(checkArity(instr, ins, outs, 1, 1));
  const TensorType &in = ins[0].type;
  DLOPT_RETURN_IF_ERROR(
      checkDType(instr, "result", outs[0].type.dtype, in.dtype));
  std::vector<int64_t> perm;
  DLOPT_RETURN_IF_ERROR(getIntsAttr(instr, "perm", perm));
  size_t rank = in.shape.size();
  std::vector<bool> seen(rank, false);
  bool valid = perm.size() == rank;
  for (size_t i = 0; valid && i < rank; ++i) {
    valid = perm[i] >= 0 && perm[i] < int64_t(rank) && !seen[perm[i]];
    if (valid)
      seen[perm[i]] = true;
  }
  if (!valid)
    return opError(instr, "expects 'perm' to be a permutation of [0, " +
                              std::to_string(rank) + "), got " +
                              shapeStr(perm));
  std::vector<int64_t> expected(rank);
  for (size_t i = 0; i < rank; ++i)
    expected[i] = in.shape[perm[i]];
  DLOPT_RETURN_IF_ERROR(
      checkShape(instr, "result", outs[0].type.shape, expected));
  if (outs[0].numElements() == 0)
    return Status::ok();

  // Output dims with their input strides, size-1 dims dropped and dims that
  // stay adjacent in the input merged.
  std::vector<int64_t> inStrides = contiguousStrides(in.shape);
  std::vector<int64_t> size, stride;
  for (size_t i = 0; i < rank; ++i) {
    int64_t s = expected[i], st = inStrides[perm[i]];
    if (s == 1)
      continue;
    if (!size.empty() && stride.back() == st * s) {
      size.back() *= s;
      stride.back() = st;
    } else {
      size.push_back(s);
      stride.push_back(st);
    }
  }
  if (size.empty()) {
    size.push_back(1);
    stride.push_back(1);
  }
  if (size.size() == 1)
    return reshapeKernel(instr, ins, outs); // stride is 1: a plain copy
  // Tiled copy of the two innermost output dims (rows x cols); the input
  // walks columns with stride `sc`, so tiles keep both sides in cache.
  size_t r = size.size();
  int64_t rows = size[r - 2], cols = size[r - 1];
  int64_t sr = stride[r - 2], sc = stride[r - 1];
  std::vector<int64_t> outerSize(size.begin(), size.end() - 2);
  std::vector<int64_t> outerStride(stride.begin(), stride.end() - 2);
  int64_t numOuter = product(outerSize, 0, outerSize.size());
  constexpr int64_t kTile = 32;
  int64_t rowTiles = (rows + kTile - 1) / kTile;
  return dispatchBySize(in.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>();
    T *y = outs[0].as<T>();
    parallelFor(numOuter * rowTiles, grainFor(kTile * cols),
                [&](int64_t b, int64_t e) {
                  for (int64_t item = b; item < e; ++item) {
                    int64_t outer = item / rowTiles;
                    int64_t r0 = (item % rowTiles) * kTile;
                    int64_t r1 = std::min(rows, r0 + kTile);
                    int64_t base = 0, rem = outer;
                    for (size_t d = outerSize.size(); d-- > 0;) {
                      base += (rem % outerSize[d]) * outerStride[d];
                      rem /= outerSize[d];
                    }
                    T *yo = y + outer * rows * cols;
                    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
                      int64_t c1 = std::min(cols, c0 + kTile);
                      for (int64_t i = r0; i < r1; ++i) {
                        const T *xi = x + base + i * sr;
                        T *yi = yo + i * cols;
                        for (int64_t j = c0; j < c1; ++j)
                          yi[j] = xi[j * sc];
                      }
                    }
                  }
                });
    return Status::ok();
  });
}

Status broadcastToKernel(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(checkArity(instr, ins, outs, 1, 1));
  DLOPT_RETURN_IF_ERROR(
      checkDType(instr, "result", outs[0].type.dtype, ins[0].type.dtype));
  BroadcastPlan p;
  std::string err = planBroadcast(outs[0].type.shape, {ins[0].type.shape}, p);
  if (!err.empty())
    return opError(instr, err);
  if (outs[0].numElements() == 0)
    return Status::ok();
  return dispatchBySize(ins[0].type.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>();
    T *y = outs[0].as<T>();
    int64_t inner = p.inner(), s = p.strides[0].back();
    parallelFor(p.outer(), grainFor(inner), [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        const T *xr = x + p.rowOffset(0, row);
        T *yr = y + row * inner;
        if (s == 1)
          std::memcpy(yr, xr, size_t(inner) * sizeof(T));
        else
          std::fill(yr, yr + inner, xr[0]);
      }
    });
    return Status::ok();
  });
}

Status concatKernel(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(checkArityRange(instr, ins, outs, 1, SIZE_MAX, 1));
  const TensorType &t0 = ins[0].type;
  size_t rank = t0.shape.size();
  int64_t dim = 0;
  DLOPT_RETURN_IF_ERROR(getDimAttr(instr, rank, dim));
  std::vector<int64_t> expected = t0.shape;
  expected[dim] = 0;
  for (size_t k = 0; k < ins.size(); ++k) {
    const TensorType &t = ins[k].type;
    bool ok = t.dtype == t0.dtype && t.shape.size() == rank;
    for (size_t i = 0; ok && i < rank; ++i)
      ok = int64_t(i) == dim || t.shape[i] == t0.shape[i];
    if (!ok)
      return opError(instr, "operand #" + std::to_string(k) + " of type " +
                                typeStr(t) + " does not match operand #0 " +
                                typeStr(t0) + " outside dim " +
                                std::to_string(dim));
    expected[dim] += t.shape[dim];
  }
  DLOPT_RETURN_IF_ERROR(
      checkType(instr, "result", outs[0].type, TensorType{t0.dtype, expected}));
  int64_t esize = dtypeSize(t0.dtype);
  int64_t outer = product(expected, 0, dim);
  int64_t innerBytes = product(expected, dim + 1, rank) * esize;
  int64_t outRow = expected[dim] * innerBytes;
  parallelFor(outer, grainFor(outRow / 4 + 1), [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      char *dst = static_cast<char *>(outs[0].data) + o * outRow;
      for (const TensorRef &in : ins) {
        int64_t chunk = in.type.shape[dim] * innerBytes;
        if (chunk)
          std::memcpy(dst, static_cast<const char *>(in.data) + o * chunk,
                      size_t(chunk));
        dst += chunk;
      }
    }
  });
  return Status::ok();
}

Status sliceKernel(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(checkArity(instr, ins, outs, 1, 1));
  const TensorType &in = ins[0].type;
  size_t rank = in.shape.size();
  std::vector<int64_t> start, limit, stride(rank, 1);
  DLOPT_RETURN_IF_ERROR(getIntsAttr(instr, "start", start));
  DLOPT_RETURN_IF_ERROR(getIntsAttr(instr, "limit", limit));
  DLOPT_RETURN_IF_ERROR(getOptIntsAttr(instr, "stride", stride));
  if (start.size() != rank || limit.size() != rank || stride.size() != rank)
    return opError(instr, "expects start/limit/stride of length " +
                              std::to_string(rank) + ", got " +
                              std::to_string(start.size()) + "/" +
                              std::to_string(limit.size()) + "/" +
                              std::to_string(stride.size()));
  std::vector<int64_t> expected(rank);
  for (size_t i = 0; i < rank; ++i) {
    if (start[i] < 0 || start[i] > limit[i] || limit[i] > in.shape[i] ||
        stride[i] < 1)
      return opError(instr, "invalid slice of dim " + std::to_string(i) +
                                " (size " + std::to_string(in.shape[i]) +
                                "): start " + std::to_string(start[i]) +
                                ", limit " + std::to_string(limit[i]) +
                                ", stride " + std::to_string(stride[i]));
    expected[i] = (limit[i] - start[i] + stride[i] - 1) / stride[i];
  }
  DLOPT_RETURN_IF_ERROR(
      checkType(instr, "result", outs[0].type, TensorType{in.dtype, expected}));
  if (outs[0].numElements() == 0)
    return Status::ok();
  std::vector<int64_t> inStrides = contiguousStrides(in.shape);
  int64_t base = 0;
  for (size_t i = 0; i < rank; ++i)
    base += start[i] * inStrides[i];
  if (rank == 0)
    return reshapeKernel(instr, ins, outs);
  int64_t inner = expected[rank - 1];
  int64_t innerStep = stride[rank - 1];
  int64_t numRows = outs[0].numElements() / inner;
  return dispatchBySize(in.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T *x = ins[0].as<T>() + base;
    T *y = outs[0].as<T>();
    parallelFor(numRows, grainFor(inner), [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        int64_t off = 0, rem = row;
        for (size_t d = rank - 1; d-- > 0;) {
          off += (rem % expected[d]) * stride[d] * inStrides[d];
          rem /= expected[d];
        }
        const T *xr = x + off;
        T *yr = y + row * inner;
        for (int64_t j = 0; j < inner; ++j)
          yr[j] = xr[j * innerStep];
      }
    });
    return Status::ok();
  });
}

Status gatherKernel(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(checkArity(instr, ins, outs, 2, 1));
  const TensorType &table = ins[0].type, &ids = ins[1].type;
  if (table.shape.empty())
    return opError(instr,
                   "expects a table of rank >= 1, got " + typeStr(table));
  DLOPT_RETURN_IF_ERROR(checkInt(instr, "operand #1 (ids)", ids));
  std::vector<int64_t> expected = ids.shape;
  expected.insert(expected.end(), table.shape.begin() + 1, table.shape.end());
  DLOPT_RETURN_IF_ERROR(checkType(instr, "result", outs[0].type,
                                  TensorType{table.dtype, expected}));
  int64_t v = table.shape[0];
  int64_t n = ins[1].numElements();
  int64_t rowBytes =
      product(table.shape, 1, table.shape.size()) * dtypeSize(table.dtype);
  auto run = [&](auto *idp) -> Status {
    for (int64_t i = 0; i < n; ++i)
      if (idp[i] < 0 || idp[i] >= v)
        return opError(instr, "id " + std::to_string(int64_t(idp[i])) +
                                  " at position " + std::to_string(i) +
                                  " is outside [0, " + std::to_string(v) + ")");
    parallelFor(n, grainFor(rowBytes / 4 + 1), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        std::memcpy(static_cast<char *>(outs[0].data) + i * rowBytes,
                    static_cast<const char *>(ins[0].data) +
                        int64_t(idp[i]) * rowBytes,
                    size_t(rowBytes));
    });
    return Status::ok();
  };
  if (ids.dtype == DType::I32)
    return run(ins[1].as<int32_t>());
  return run(ins[1].as<int64_t>());
}

Status iotaKernel(const Instr &instr, Ins ins, Outs outs) {
  DLOPT_RETURN_IF_ERROR(checkArity(instr, ins, outs, 0, 1));
  const TensorType &t = outs[0].type;
  DLOPT_RETURN_IF_ERROR(checkNumeric(instr, "result", t));
  DimSplit split;
  DLOPT_RETURN_IF_ERROR(getDimSplit(instr, t.shape, split));
  int64_t size = split.n, inner = split.inner;
  int64_t n = t.numElements();
  return dispatchNumeric(t.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    T *y = outs[0].as<T>();
    parallelFor(n, grainFor(2), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        int64_t v = (i / inner) % size;
        if constexpr (isFloatStorage<T>)
          y[i] = fromF32<T>(float(v));
        else
          y[i] = T(v);
      }
    });
    return Status::ok();
  });
}

} // namespace

void registerShapeKernels(KernelRegistry &r) {
  r["reshape"] = reshapeKernel;
  r["transpose"] = transposeKernel;
  r["broadcast_to"] = broadcastToKernel;
  r["concat"] = concatKernel;
  r["slice"] = sliceKernel;
  r["gather"] = gatherKernel;
  r["iota"] = iotaKernel;
}

} // namespace dlopt::rt::cpu
