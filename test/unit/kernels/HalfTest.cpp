//===- HalfTest.cpp - fp16/bf16 conversions against exact references ------===//

#include "runtime/cpu/Half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

using namespace dlopt::rt;

namespace {

/// Value of IEEE binary16 bits from the definition.
double halfValue(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  double v;
  if (exp == 0)
    v = std::ldexp(double(mant), -24);
  else if (exp == 31)
    v = mant ? NAN : INFINITY;
  else
    v = std::ldexp(double(1024 + mant), exp - 25);
  return sign ? -v : v;
}

/// Nearest representable value with ties to even, by search over a sorted
/// list of finite non-negative values (bits increase with value).
template <typename Decode>
uint16_t nearestBits(float f, Decode decode, uint16_t maxFinite,
                     double overflowAt) {
  double a = std::fabs(double(f));
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (a >= overflowAt)
    return sign | uint16_t(maxFinite + 1); // Inf
  uint16_t lo = 0, hi = maxFinite;
  while (lo < hi) { // first bits with value >= a
    uint16_t mid = uint16_t((lo + hi) / 2);
    if (decode(mid) < a)
      lo = uint16_t(mid + 1);
    else
      hi = mid;
  }
  if (decode(lo) == a || lo == 0)
    return sign | lo;
  double up = decode(lo) - a, down = a - decode(uint16_t(lo - 1));
  uint16_t pick = up < down ? lo
                            : (down < up ? uint16_t(lo - 1)
                                         : ((lo & 1) ? uint16_t(lo - 1) : lo));
  return sign | pick;
}

TEST(Half, HalfToFloatExhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    double ref = halfValue(uint16_t(h));
    float got = halfToFloat(uint16_t(h));
    if (std::isnan(ref))
      ASSERT_TRUE(std::isnan(got)) << h;
    else
      ASSERT_EQ(double(got), ref) << h;
  }
}

TEST(Half, RoundTripExhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if (std::isnan(halfValue(uint16_t(h))))
      continue;
    ASSERT_EQ(floatToHalf(halfToFloat(uint16_t(h))), h);
  }
}

TEST(Half, FloatToHalfRoundsToNearestEven) {
  std::mt19937 rng(1234);
  // Overflow threshold: halfway between 65504 and 65536.
  auto decode = [](uint16_t b) { return halfValue(b); };
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float f = std::bit_cast<float>(bits(rng));
    if (std::isnan(f))
      continue;
    if (std::fabs(f) > 1e6f || std::fabs(f) < 1e-9f)
      f = std::ldexp(float(i % 1000) / 997.0f, -(i % 30)) * (i % 2 ? 1 : -1);
    ASSERT_EQ(floatToHalf(f), nearestBits(f, decode, 0x7BFF, 65520.0)) << f;
  }
  // Ties: exactly halfway between neighbours.
  for (uint16_t h = 1; h < 0x7BFF; h += 7) {
    float mid = float((halfValue(h) + halfValue(uint16_t(h + 1))) / 2);
    uint16_t expect = (h & 1) ? uint16_t(h + 1) : h;
    ASSERT_EQ(floatToHalf(mid), expect) << h;
  }
  EXPECT_EQ(floatToHalf(INFINITY), 0x7C00);
  EXPECT_EQ(floatToHalf(-INFINITY), 0xFC00);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7C00);
  EXPECT_EQ(floatToHalf(65519.99f), 0x7BFF);
  EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(NAN))));
}

TEST(BFloat16, ExactAndRounding) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = bf16ToFloat(uint16_t(b));
    ASSERT_EQ(std::bit_cast<uint32_t>(f), b << 16);
    if (!std::isnan(f))
      ASSERT_EQ(floatToBf16(f), b);
  }
  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(rng);
    float f = std::bit_cast<float>(u);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16ToFloat(floatToBf16(f))));
      continue;
    }
    // Reference: the two bf16 neighbours and the rounding rule.
    uint32_t down = u & 0xFFFF0000u, up = down + 0x10000u;
    double a = double(std::bit_cast<float>(down));
    // Past the largest finite value the next step up is 2^128 (Inf).
    double bval = (up & 0x7FFFFFFFu) == 0x7F800000u
                      ? std::copysign(std::ldexp(1.0, 128), f)
                      : double(std::bit_cast<float>(up));
    double dd = std::fabs(double(f) - a), du = std::fabs(bval - double(f));
    uint32_t pick = dd < du   ? down
                    : du < dd ? up
                              : (((down >> 16) & 1) ? up : down);
    if ((down & 0x7F800000u) == 0x7F800000u) // f is Inf: exact
      pick = down;
    ASSERT_EQ(floatToBf16(f), uint16_t(pick >> 16)) << f;
  }
}

} // namespace
