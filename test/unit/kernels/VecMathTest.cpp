//===- VecMathTest.cpp - runtime/cpu/VecMath.h against double libm -------===//
//
// Sweeps every 97th float of each function's interesting range and checks
// the error bound that VecMath.h documents, in units in the last place of
// the correctly rounded result, against the double-precision libm function.
// Also checks special values, and that a vectorized loop gives the same bits
// as one call at a time (the determinism the kernels rely on).
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/VecMath.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace vm = dlopt::rt::cpu::vm;

namespace {

/// |got - ref| in ulps of the float nearest to ref (subnormal spacing for
/// tiny results).
double ulpError(float got, double ref) {
  float r = float(ref);
  if (std::isinf(r))
    return got == r ? 0.0 : std::numeric_limits<double>::infinity();
  double spacing = std::nextafter(std::fabs(r), std::numeric_limits<float>::infinity()) -
                   std::fabs(r);
  return std::fabs(double(got) - ref) / spacing;
}

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// Calls check(x) on every 97th float in [lo, hi] (0 <= lo <= hi, finite),
/// by bit pattern, from a random start; the checks test -x as well.
template <typename F> void sweep(float lo, float hi, F check) {
  constexpr uint32_t kStride = 97;
  uint32_t start = bitsOf(lo) + std::random_device{}() % kStride;
  for (uint32_t u = start, e = bitsOf(hi); u <= e; u += kStride) {
    float x;
    std::memcpy(&x, &u, 4);
    check(x);
    if (e - u < kStride)
      break;
  }
}

TEST(VecMath, ExpIsWithinOneUlpOfTheRoundedResult) {
  double worst = 0;
  float worstAt = 0;
  auto check = [&](float x) {
    for (float v : {x, -x}) {
      if (v < -87.33f || v > 88.72f)
        continue; // normal results only; subnormal and overflow below
      double err = ulpError(vm::expF(v), std::exp(double(v)));
      if (err > worst) {
        worst = err;
        worstAt = v;
      }
    }
  };
  sweep(0.0f, 88.72f, check);
  EXPECT_LE(worst, 1.0) << "at x = " << worstAt;
  std::printf("max error: exp %.3f ulp at %a\n", worst, worstAt);
}

TEST(VecMath, ExpSpecialValuesAndSubnormals) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(vm::expF(0.0f), 1.0f);
  EXPECT_EQ(vm::expF(-0.0f), 1.0f);
  EXPECT_EQ(vm::expF(inf), inf);
  EXPECT_EQ(vm::expF(-inf), 0.0f);
  EXPECT_EQ(vm::expF(89.0f), inf);
  EXPECT_EQ(vm::expF(1000.0f), inf);
  EXPECT_EQ(vm::expF(-104.0f), 0.0f);
  EXPECT_EQ(vm::expF(-1e30f), 0.0f);
  EXPECT_TRUE(std::isnan(vm::expF(std::nanf(""))));
  // Subnormal results: within 1 subnormal spacing of the exact value.
  for (float x = -103.9f; x < -87.4f; x += 0.0137f) {
    double ref = std::exp(double(x));
    EXPECT_LE(std::fabs(double(vm::expF(x)) - ref), 0x1p-149) << x;
  }
  // The largest finite result.
  EXPECT_TRUE(std::isfinite(vm::expF(88.72f)));
}

TEST(VecMath, TanhIsWithinThreeUlpsAndOdd) {
  double worst = 0;
  float worstAt = 0;
  auto check = [&](float x) {
    for (float v : {x, -x}) {
      float y = vm::tanhF(v);
      double err = ulpError(y, std::tanh(double(v)));
      if (err > worst) {
        worst = err;
        worstAt = v;
      }
      ASSERT_EQ(bitsOf(y), bitsOf(-vm::tanhF(-v))) << v;
    }
  };
  sweep(0.0f, 12.0f, check);
  EXPECT_LE(worst, 3.0) << "at x = " << worstAt;
  std::printf("max error: tanh %.3f ulp at %a\n", worst, worstAt);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(vm::tanhF(inf), 1.0f);
  EXPECT_EQ(vm::tanhF(-inf), -1.0f);
  EXPECT_EQ(vm::tanhF(20.0f), 1.0f);
  EXPECT_EQ(vm::tanhF(1e30f), 1.0f);
  EXPECT_EQ(bitsOf(vm::tanhF(0.0f)), bitsOf(0.0f));
  EXPECT_EQ(bitsOf(vm::tanhF(-0.0f)), bitsOf(-0.0f));
  EXPECT_EQ(vm::tanhF(1e-30f), 1e-30f);
  EXPECT_TRUE(std::isnan(vm::tanhF(std::nanf(""))));
}

TEST(VecMath, SigmoidSiluAndGeluAreWithinTheirBounds) {
  double sig = 0, silu = 0, gelu = 0, dgelu = 0;
  const double c = 0.79788456080286536, k = 0.044715;
  auto check = [&](float x) {
    for (float v : {x, -x}) {
      double d = v;
      sig = std::max(sig, ulpError(vm::sigmoidF(v), 1.0 / (1.0 + std::exp(-d))));
      if (std::fabs(v) > 1e-30f)
        silu = std::max(silu, ulpError(vm::siluF(v), d / (1.0 + std::exp(-d))));
      // gelu and its derivative: absolute error against the double
      // formula, relative to max(1, |x|).
      double t = std::tanh(c * (d + k * d * d * d));
      double g = 0.5 * d * (1.0 + t);
      double dg = 0.5 * (1.0 + t) + 0.5 * d * (1.0 - t * t) * c * (1.0 + 3.0 * k * d * d);
      double scale = std::max(1.0, std::fabs(d));
      gelu = std::max(gelu, std::fabs(vm::geluTanhF(v) - g) / scale);
      dgelu = std::max(dgelu, std::fabs(vm::geluTanhDerivF(v) - dg) / scale);
    }
  };
  sweep(0.0f, 30.0f, check);
  EXPECT_LE(sig, 3.0);
  EXPECT_LE(silu, 3.0);
  EXPECT_LE(gelu, 2e-7);
  EXPECT_LE(dgelu, 4e-7);
  std::printf("max error: sigmoid %.2f ulp, silu %.2f ulp, gelu %.3g, gelu' "
              "%.3g (absolute / max(1, |x|))\n",
              sig, silu, gelu, dgelu);
}

// One call per element through a function the compiler may not vectorize
// or inline, against a loop it does vectorize: the same bits.
[[gnu::noinline]] float scalarExp(float x) { return vm::expF(x); }
[[gnu::noinline]] float scalarTanh(float x) { return vm::tanhF(x); }
[[gnu::noinline]] float scalarGeluDeriv(float x) {
  return vm::geluTanhDerivF(x);
}

[[gnu::noinline]] void vectorExp(const float *x, float *y, int n) {
  for (int i = 0; i < n; ++i)
    y[i] = vm::expF(x[i]);
}
[[gnu::noinline]] void vectorTanh(const float *x, float *y, int n) {
  for (int i = 0; i < n; ++i)
    y[i] = vm::tanhF(x[i]);
}
[[gnu::noinline]] void vectorGeluDeriv(const float *x, float *y, int n) {
  for (int i = 0; i < n; ++i)
    y[i] = vm::geluTanhDerivF(x[i]);
}

TEST(VecMath, VectorLoopsGiveTheBitsOfScalarCalls) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> wide(-120.0f, 100.0f),
      narrow(-6.0f, 6.0f);
  const int n = 4099;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i)
    x[i] = i % 3 ? narrow(rng) : wide(rng);
  x[7] = std::nanf("");
  x[8] = std::numeric_limits<float>::infinity();
  x[9] = -0.0f;
  vectorExp(x.data(), y.data(), n);
  for (int i = 0; i < n; ++i)
    ASSERT_EQ(bitsOf(y[i]), bitsOf(scalarExp(x[i]))) << "exp " << x[i];
  vectorTanh(x.data(), y.data(), n);
  for (int i = 0; i < n; ++i)
    ASSERT_EQ(bitsOf(y[i]), bitsOf(scalarTanh(x[i]))) << "tanh " << x[i];
  vectorGeluDeriv(x.data(), y.data(), n);
  for (int i = 0; i < n; ++i)
    ASSERT_EQ(bitsOf(y[i]), bitsOf(scalarGeluDeriv(x[i]))) << "gelu' " << x[i];
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
// The kernels' AVX2 clones (DLOPT_SIMD_CLONES) must give the bits of the
// baseline ones: the same loops compiled for AVX2 here.
[[gnu::noinline, gnu::target("avx2")]] void avx2Exp(const float *x, float *y,
                                                     int n) {
  for (int i = 0; i < n; ++i)
    y[i] = vm::expF(x[i]);
}
[[gnu::noinline, gnu::target("avx2")]] void avx2GeluDeriv(const float *x,
                                                          float *y, int n) {
  for (int i = 0; i < n; ++i)
    y[i] = vm::geluTanhDerivF(x[i]) + vm::tanhF(x[i]) + vm::siluF(x[i]);
}
[[gnu::noinline]] void baseGeluDeriv(const float *x, float *y, int n) {
  for (int i = 0; i < n; ++i)
    y[i] = vm::geluTanhDerivF(x[i]) + vm::tanhF(x[i]) + vm::siluF(x[i]);
}
[[gnu::noinline, gnu::target("avx2")]] double avx2RowSum(const float *x,
                                                         int n) {
  return vm::rowSumF64(x, n) + vm::rowMax(x, n);
}
[[gnu::noinline]] double baseRowSum(const float *x, int n) {
  return vm::rowSumF64(x, n) + vm::rowMax(x, n);
}

TEST(VecMath, Avx2CodeGivesTheBitsOfTheBaseline) {
  if (!__builtin_cpu_supports("avx2"))
    GTEST_SKIP() << "this CPU has no AVX2";
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-110.0f, 95.0f);
  const int n = 8195;
  std::vector<float> x(n), a(n), b(n);
  for (float &v : x)
    v = dist(rng) / (rng() % 2 ? 1.0f : 16.0f);
  avx2Exp(x.data(), a.data(), n);
  vectorExp(x.data(), b.data(), n);
  for (int i = 0; i < n; ++i)
    ASSERT_EQ(bitsOf(a[i]), bitsOf(b[i])) << "exp " << x[i];
  avx2GeluDeriv(x.data(), a.data(), n);
  baseGeluDeriv(x.data(), b.data(), n);
  for (int i = 0; i < n; ++i)
    ASSERT_EQ(bitsOf(a[i]), bitsOf(b[i])) << x[i];
  for (int len : {1, 7, 8, 9, 100, 8195}) {
    double p = avx2RowSum(x.data(), len), q = baseRowSum(x.data(), len);
    ASSERT_EQ(std::memcmp(&p, &q, sizeof p), 0) << len;
  }
}
#endif

} // namespace
