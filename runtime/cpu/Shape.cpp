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

Status reshapeKernel(const Instr &, Ins ins, Outs outs) {
  int64_t bytes = ins[0].type.byteSize();
  if (outs[0].data == ins[0].data)
    return Status::ok(); // the memory plan made the result a view
  parallelFor(bytes, 1 << 20, [&](int64_t b, int64_t e) {
    std::memcpy(static_cast<char *>(outs[0].data) + b,
                static_cast<const char *>(ins[0].data) + b, size_t(e - b));
  });
  return Status::ok();
}

Status transposeKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &in = ins[0].type;
  std::vector<int64_t> perm;
  DLOPT_RETURN_IF_ERROR(getIntsAttr(instr, "perm", perm));
  size_t rank = in.shape.size();
  std::vector<int64_t> expected(rank);
  for (size_t i = 0; i < rank; ++i)
    expected[i] = in.shape[perm[i]];
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

Status broadcastToKernel(const Instr &, Ins ins, Outs outs) {
  BroadcastPlan p;
  planBroadcast(outs[0].type.shape, {ins[0].type.shape}, p);
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
  const TensorType &t0 = ins[0].type;
  size_t rank = t0.shape.size();
  int64_t dim = 0;
  DLOPT_RETURN_IF_ERROR(getDimAttr(instr, rank, dim));
  std::vector<int64_t> expected = t0.shape;
  expected[dim] = 0;
  for (size_t k = 0; k < ins.size(); ++k) {
    expected[dim] += ins[k].type.shape[dim];
  }
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
  const TensorType &in = ins[0].type;
  size_t rank = in.shape.size();
  SliceGeom g;
  DLOPT_RETURN_IF_ERROR(sliceGeometry(instr, in.shape, g));
  const std::vector<int64_t> &start = g.start, &stride = g.stride,
                             &expected = g.sliced;
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
  const TensorType &table = ins[0].type, &ids = ins[1].type;
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

Status iotaKernel(const Instr &instr, Ins, Outs outs) {
  const TensorType &t = outs[0].type;
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
