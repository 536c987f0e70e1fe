//===- HostTensor.cpp - Element access and statistics ---------------------===//

#include "runtime/exec/HostTensor.h"
#include "runtime/cpu/Half.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace dlopt::rt {

namespace {

template <typename T> T load(const uint8_t *p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T> void store(uint8_t *p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

/// Float-to-int as docs/ops.md defines cast: truncate, saturate, NaN -> 0.
template <typename I> I saturatingCast(double v) {
  if (std::isnan(v))
    return 0;
  double t = std::trunc(v);
  if (t <= double(std::numeric_limits<I>::min()))
    return std::numeric_limits<I>::min();
  // 2^63 is exactly representable; anything at or above it saturates.
  if (t >= -double(std::numeric_limits<I>::min()))
    return std::numeric_limits<I>::max();
  return I(t);
}

} // namespace

double HostTensor::elementAsDouble(int64_t i) const {
  const uint8_t *p = bytes.data() + i * dtypeSize(type.dtype);
  switch (type.dtype) {
  case DType::F32: return load<float>(p);
  case DType::F16: return halfToFloat(load<uint16_t>(p));
  case DType::BF16: return bf16ToFloat(load<uint16_t>(p));
  case DType::I32: return load<int32_t>(p);
  case DType::I64: return double(load<int64_t>(p));
  case DType::I1: return *p ? 1.0 : 0.0;
  }
  return 0;
}

void HostTensor::setElementFromDouble(int64_t i, double v) {
  uint8_t *p = bytes.data() + i * dtypeSize(type.dtype);
  switch (type.dtype) {
  case DType::F32: store<float>(p, float(v)); break;
  case DType::F16: store<uint16_t>(p, floatToHalf(float(v))); break;
  case DType::BF16: store<uint16_t>(p, floatToBf16(float(v))); break;
  case DType::I32: store<int32_t>(p, saturatingCast<int32_t>(v)); break;
  case DType::I64: store<int64_t>(p, saturatingCast<int64_t>(v)); break;
  case DType::I1: *p = v != 0 ? 1 : 0; break;
  }
}

HostTensor convertTensor(const HostTensor &t, DType dtype) {
  HostTensor out(TensorType{dtype, t.type.shape});
  int64_t n = t.numElements();
  for (int64_t i = 0; i < n; ++i)
    out.setElementFromDouble(i, t.elementAsDouble(i));
  return out;
}

TensorStats computeStats(const HostTensor &t) {
  TensorStats s;
  int64_t n = t.numElements();
  double sum = 0;
  int64_t finite = 0;
  bool first = true;
  for (int64_t i = 0; i < n; ++i) {
    double v = t.elementAsDouble(i);
    if (std::isnan(v)) {
      ++s.nanCount;
      continue;
    }
    if (std::isinf(v))
      ++s.infCount;
    else {
      sum += v;
      ++finite;
    }
    if (first || v < s.min)
      s.min = v;
    if (first || v > s.max)
      s.max = v;
    first = false;
  }
  s.mean = finite ? sum / double(finite) : 0.0;
  return s;
}

} // namespace dlopt::rt
