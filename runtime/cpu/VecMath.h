//===- VecMath.h - Branch-free f32 exp, tanh and friends ---------*- C++ -*-===//
//
// The CPU kernels' transcendental functions, written so that a loop calling
// them compiles to SIMD code: no calls, no branches (selects only), no
// tables, integer bit tricks for the exponent. The scalar libm functions
// (glibc's expf, tanhf) stop the compiler from vectorizing a loop, which
// left gelu and its gradient 60-70x below the memory roofline.
//
// Determinism: every function is a fixed sequence of IEEE f32 additions,
// multiplications and divisions, compiled without contraction
// (-ffp-contract=off) or fast-math, so each input gives the same bits with
// SSE2, AVX2 or AVX-512 code, scalar or vector, on every x86-64 machine.
//
// Accuracy (tested in test/unit/kernels/VecMathTest.cpp against double libm
// on every 97th float of the tested ranges):
//   expF    <= 1 ulp (normal results); subnormal results and overflow
//           (x > 88.72: +inf) as expf; NaN propagates.
//   tanhF   <= 3 ulp; odd; exactly +-1 beyond |x| = 9.01.
//   sigmoidF, siluF: through expF, <= 3 ulp.
//   geluTanhF within 2e-7 max(1, |x|) of the exact function (absolute),
//           geluTanhDerivF within 4e-7 max(1, |x|).
//
// Algorithms: Cephes' expf (Moshier) with Cody-Waite reduction by ln 2 and
// a round-to-nearest through the 1.5 * 2^23 shifter; Cephes' tanhf (odd
// polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1) above).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

/// Runtime ISA dispatch for the hot kernel loops: GCC compiles a function
/// marked DLOPT_SIMD_CLONES twice, for AVX2 and for the x86-64 baseline
/// (SSE2), and picks one when the program loads (an ifunc, by the CPU's
/// features). Both clones give the same bits: no FMA is involved (AVX2 does
/// not imply it, and the kernels build with -ffp-contract=off) and no
/// reduction is reordered. Elsewhere (clang: the sanitizer and fuzz builds,
/// or other architectures) the functions are compiled once, for the
/// baseline.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) &&     \
    !defined(DLOPT_NO_SIMD_CLONES)
#define DLOPT_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DLOPT_SIMD_CLONES
#endif

namespace dlopt::rt::cpu::vm {

inline float bitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t floatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// 2^n for integer n in [-126, 127], exactly.
inline float pow2i(int32_t n) {
  return bitsToFloat(uint32_t(n + 127) << 23);
}

/// e^x. Inputs below -103.97 give 0, above 88.72 +inf, NaN gives NaN.
inline float expF(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  const float kShift = 12582912.0f; // 1.5 * 2^23: adding rounds to integer
  // Clamp to where the result is a finite nonzero float (or just beyond),
  // so the integer exponent below stays in range; NaN passes through the
  // selects untouched and is restored at the end.
  float xc = x > 88.7228394f ? 88.7228394f : x;
  xc = xc < -103.972084f ? -103.972084f : xc;
  float t = xc * kLog2e + kShift;
  float nf = t - kShift;
  int32_t n = int32_t(floatToBits(t) - floatToBits(kShift));
  float r = xc - nf * kLn2Hi;
  r = r - nf * kLn2Lo;
  // e^r on |r| <= ln2/2: 1 + r + r^2 P(r) (Cephes expf coefficients).
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float e = (p * (r * r) + r) + 1.0f;
  // Scale by 2^n as two normal powers so that subnormal results round once
  // (n ranges over [-150, 128]).
  int32_t n1 = n >> 1; // floor(n / 2)
  float y = e * pow2i(n1) * pow2i(n - n1);
  y = x > 88.7228394f ? __builtin_inff() : y;
  y = x < -103.972084f ? 0.0f : y;
  return x != x ? x + x : y;
}

/// tanh(x).
inline float tanhF(float x) {
  float ax = x < 0.0f ? -x : x;
  // |x| < 0.625: x + x^3 P(x^2).
  float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  float small = (p * z) * x + x;
  // |x| >= 0.625: 1 - 2 / (e^{2|x|} + 1), with the sign of x. Beyond 9.01
  // the quotient is below half an ulp of 1 and the result is exactly 1.
  float a = ax > 9.01f ? 9.01f : ax;
  float big = 1.0f - 2.0f / (expF(a + a) + 1.0f);
  big = ax > 9.01f ? 1.0f : big;
  big = x < 0.0f ? -big : big;
  float y = ax < 0.625f ? small : big;
  y = ax == 0.0f ? x : y; // keeps the sign of zero
  return x != x ? x + x : y;
}

/// 1 / (1 + e^-x).
inline float sigmoidF(float x) { return 1.0f / (1.0f + expF(-x)); }

/// x / (1 + e^-x).
inline float siluF(float x) { return x / (1.0f + expF(-x)); }

/// GELU with the tanh approximation, 0.5 x (1 + tanh(u)) with
/// u = c (x + k x^3), computed as x * sigmoid(2u) = x / (1 + e^{-2u}): the
/// same function, one exponential and no 1 + tanh cancellation for x << 0.
/// The exponent is capped at 80 so that e^{-2u} stays finite.
inline float geluTanhF(float x) {
  const float c2 = 1.59576912160573071f, k = 0.044715f; // 2 sqrt(2/pi)
  float a = -(c2 * (x + k * x * x * x));
  a = a > 80.0f ? 80.0f : a;
  return x / (1.0f + expF(a));
}

/// d/dx of geluTanhF: s + x s (1 - s) 2c (1 + 3k x^2), s = sigmoid(2u),
/// with s (1 - s) = e q^2 for e = e^{-2u}, q = 1 / (1 + e).
inline float geluTanhDerivF(float x) {
  const float c2 = 1.59576912160573071f, k = 0.044715f;
  float a = -(c2 * (x + k * x * x * x));
  a = a > 80.0f ? 80.0f : a;
  float e = expF(a);
  float q = 1.0f / (1.0f + e);
  return q + x * (e * q * q) * (c2 * (1.0f + 3.0f * k * x * x));
}

//===----------------------------------------------------------------------===//
// Row helpers for softmax and cross entropy. Reductions run over kLanes
// interleaved partial results, combined in a fixed order at the end: the
// loops vectorize, and the result depends only on n, never on the ISA or
// the thread count.
//===----------------------------------------------------------------------===//

constexpr int kLanes = 8;

/// max_j v[j] (NaNs are skipped unless every element is NaN; -inf for n=0).
inline float rowMax(const float *v, int64_t n) {
  float m[kLanes];
  for (int l = 0; l < kLanes; ++l)
    m[l] = -__builtin_inff();
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l)
      m[l] = v[j + l] > m[l] ? v[j + l] : m[l];
  for (; j < n; ++j)
    m[0] = v[j] > m[0] ? v[j] : m[0];
  float r = m[0];
  for (int l = 1; l < kLanes; ++l)
    r = m[l] > r ? m[l] : r;
  return r;
}

/// sum_j double(v[j]), over kLanes interleaved partial sums.
inline double rowSumF64(const float *v, int64_t n) {
  double acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l)
      acc[l] += double(v[j + l]);
  for (; j < n; ++j)
    acc[0] += double(v[j]);
  double s = 0;
  for (int l = 0; l < kLanes; ++l)
    s += acc[l];
  return s;
}

/// sum_j double(a[j]) * double(b[j]), over kLanes interleaved partial sums
/// (attention_grad's row sums of dP * P).
inline double dotF64(const float *a, const float *b, int64_t n) {
  double acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l)
      acc[l] += double(a[j + l]) * double(b[j + l]);
  for (; j < n; ++j)
    acc[0] += double(a[j]) * double(b[j]);
  double s = 0;
  for (int l = 0; l < kLanes; ++l)
    s += acc[l];
  return s;
}

/// sum over rows i < rows and j < len of term(i, j) (a double), over
/// kLanes interleaved partial sums: lane l takes the j = l mod kLanes of
/// each row's whole groups of kLanes, lane 0 each row's tail; the lanes are
/// added in a fixed order at the end. For per-channel statistics (batch
/// norm and its gradient), whose sequential double sums were latency-bound.
template <typename Term>
inline double laneSum(int64_t rows, int64_t len, Term term) {
  double acc[kLanes] = {};
  for (int64_t i = 0; i < rows; ++i) {
    int64_t j = 0;
    for (; j + kLanes <= len; j += kLanes)
      for (int l = 0; l < kLanes; ++l)
        acc[l] += term(i, j + l);
    for (; j < len; ++j)
      acc[0] += term(i, j);
  }
  double s = 0;
  for (int l = 0; l < kLanes; ++l)
    s += acc[l];
  return s;
}

/// Two such sums in one pass: {sum a(i, j), sum b(i, j)}.
template <typename TermA, typename TermB>
inline void laneSum2(int64_t rows, int64_t len, TermA a, TermB b, double &sa,
                     double &sb) {
  double accA[kLanes] = {}, accB[kLanes] = {};
  for (int64_t i = 0; i < rows; ++i) {
    int64_t j = 0;
    for (; j + kLanes <= len; j += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        accA[l] += a(i, j + l);
        accB[l] += b(i, j + l);
      }
    for (; j < len; ++j) {
      accA[0] += a(i, j);
      accB[0] += b(i, j);
    }
  }
  sa = sb = 0;
  for (int l = 0; l < kLanes; ++l) {
    sa += accA[l];
    sb += accB[l];
  }
}

/// A norm's row statistics over kLanes partial sums (rowSumF64, laneSum,
/// dotF64): layer_norm's mean mu and 1 / sqrt(var + eps), var the mean
/// squared deviation; rms_norm's 1 / sqrt(mean(v^2) + eps) and mu = 0. The
/// sequential double sums they replace were latency-bound (gpt-small's
/// 512x256 layer norm: 0.38 ms).
template <bool Rms>
inline void normRowStats(const float *v, int64_t n, double eps, float &mu,
                         float &rs) {
  if constexpr (Rms) {
    mu = 0;
    rs = float(1.0 / std::sqrt(dotF64(v, v, n) / double(n) + eps));
  } else {
    const double mean = rowSumF64(v, n) / double(n);
    const double ss = laneSum(1, n, [&](int64_t, int64_t j) {
      const double d = double(v[j]) - mean;
      return d * d;
    });
    mu = float(mean);
    rs = float(1.0 / std::sqrt(ss / double(n) + eps));
  }
}

/// out[j] = e^(v[j] - m); out may be v.
inline void expShifted(const float *v, int64_t n, float m, float *out) {
  for (int64_t j = 0; j < n; ++j)
    out[j] = expF(v[j] - m);
}

} // namespace dlopt::rt::cpu::vm
