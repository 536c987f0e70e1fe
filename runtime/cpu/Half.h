//===- Half.h - IEEE fp16 and bfloat16 <-> f32 conversions ----------------===//
//
// 16-bit floats are stored as raw bits and computed in f32 (docs/ops.md).
// These conversions are exact from 16 bits to f32 and round to nearest even
// from f32 to 16 bits, so every backend and the tools agree on the bits. They
// use integer tricks only (no F16C), keeping the runtime portable.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <bit>
#include <cstdint>

namespace dlopt::rt {

/// Widens IEEE binary16 bits to f32 (exact; NaN stays NaN).
inline float halfToFloat(uint16_t h) {
  // Shift exponent+mantissa into f32 position, then rebias; subnormals are
  // renormalized by a float subtraction, which is exact.
  constexpr uint32_t shiftedExp = 0x7C00u << 13;
  const float magic = std::bit_cast<float>(113u << 23);
  uint32_t o = (uint32_t(h) & 0x7FFFu) << 13;
  uint32_t exp = shiftedExp & o;
  o += (127u - 15u) << 23;
  if (exp == shiftedExp) {
    o += (128u - 16u) << 23; // Inf/NaN keep an all-ones exponent.
  } else if (exp == 0) {
    o += 1u << 23;
    o = std::bit_cast<uint32_t>(std::bit_cast<float>(o) - magic);
  }
  o |= (uint32_t(h) & 0x8000u) << 16;
  return std::bit_cast<float>(o);
}

/// Narrows f32 to IEEE binary16 bits, rounding to nearest even; overflow
/// gives +-Inf and NaN gives a quiet NaN.
inline uint16_t floatToHalf(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t o;
  if (u >= ((127u + 16u) << 23)) {
    // |f| >= 65536 (or Inf/NaN): always Inf or NaN.
    o = u > (255u << 23) ? 0x7E00u : 0x7C00u;
  } else if (u < (113u << 23)) {
    // Subnormal or zero result: adding 0.5f aligns the 10 mantissa bits at the
    // bottom of the float, and the FPU's round-to-nearest-even does the rest.
    const float denormMagic = std::bit_cast<float>(126u << 23);
    o = std::bit_cast<uint32_t>(std::bit_cast<float>(u) + denormMagic) -
        std::bit_cast<uint32_t>(denormMagic);
  } else {
    // Normal: rebias and round; a mantissa carry correctly bumps the
    // exponent (up to Inf for values in [65520, 65536)).
    uint32_t mantOdd = (u >> 13) & 1u;
    u += (uint32_t(15 - 127) << 23) + 0xFFFu;
    u += mantOdd;
    o = u >> 13;
  }
  return uint16_t(o | (sign >> 16));
}

/// Widens bfloat16 bits to f32 (exact).
inline float bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(uint32_t(b) << 16);
}

/// Narrows f32 to bfloat16 bits, rounding to nearest even; NaN gives a quiet
/// NaN of the same sign.
inline uint16_t floatToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    return uint16_t((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

/// Bulk conversions, used to stage 16-bit tensors through f32 buffers.
inline void halfToFloat(const uint16_t *src, float *dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = halfToFloat(src[i]);
}
inline void floatToHalf(const float *src, uint16_t *dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = floatToHalf(src[i]);
}
inline void bf16ToFloat(const uint16_t *src, float *dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = bf16ToFloat(src[i]);
}
inline void floatToBf16(const float *src, uint16_t *dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = floatToBf16(src[i]);
}

} // namespace dlopt::rt
