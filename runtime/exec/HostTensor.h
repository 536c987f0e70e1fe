//===- HostTensor.h - An owned tensor in host memory ----------------------===//
//
// What the executor exchanges with its callers: bound inputs and params,
// outputs, and the contents of .npy files. Elements are dense, row-major,
// little-endian, in the layout of TensorType (bf16/f16 as raw 16-bit words,
// i1 as one byte 0 or 1).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/format/Executable.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dlopt::rt {

struct HostTensor {
  TensorType type;
  std::vector<uint8_t> bytes; ///< exactly type.byteSize() bytes

  HostTensor() = default;
  /// A zero-filled tensor of `type`.
  explicit HostTensor(TensorType t)
      : type(std::move(t)), bytes(size_t(type.byteSize()), 0) {}

  int64_t numElements() const { return type.numElements(); }
  template <typename T> T *data() { return reinterpret_cast<T *>(bytes.data()); }
  template <typename T> const T *data() const {
    return reinterpret_cast<const T *>(bytes.data());
  }
  /// Element `i` widened to double (bf16/f16 exactly, i1 as 0/1).
  double elementAsDouble(int64_t i) const;
  /// Stores `v` into element `i`, rounding as a cast to the element type
  /// would (floats to nearest even, ints truncated toward zero and saturated,
  /// NaN to 0; i1 is v != 0).
  void setElementFromDouble(int64_t i, double v);
};

/// A named tensor, e.g. an output or a checkpoint entry.
struct NamedTensor {
  std::string name;
  HostTensor tensor;
};

/// Converts every element to `dtype` with setElementFromDouble semantics.
HostTensor convertTensor(const HostTensor &t, DType dtype);

/// Summary statistics for reports; NaNs are counted, not folded in.
struct TensorStats {
  double mean = 0, min = 0, max = 0;
  int64_t nanCount = 0, infCount = 0;
};
TensorStats computeStats(const HostTensor &t);

} // namespace dlopt::rt
