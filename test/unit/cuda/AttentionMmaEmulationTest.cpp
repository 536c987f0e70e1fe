//===- AttentionMmaEmulationTest.cpp - fa:: kernels on the host emulator --===//
//
// The mma.sync attention kernels (runtime/cuda/kernels/AttentionMma.cuh)
// compiled for the host and run on AttentionMmaEmulator.h, with the launch
// sequence of attention()/attentionGrad() (same grids and shared-memory
// sizes), against a double-precision reference: out, dq, dk, dv, the
// base-2 log-sum-exp and D. Cases: tails of the 64-row tiles, causal
// shifts that hide every key from whole rows and blocks, grouped-query
// heads, offset operands of both widths, one query and one key, a peaky
// softmax. Runs without a GPU, in every build but the sanitizer one
// (ucontext fibers).
//
//===----------------------------------------------------------------------===//

#define DLOPT_ATTENTION_MMA_EMULATION 1
#include "test/unit/cuda/AttentionMmaEmulator.h"

#include "runtime/cuda/kernels/AttentionMma.cuh"

#include <gtest/gtest.h>

#include <random>
#include <string>

using namespace dlopt::rt::cuda::kernels;

namespace {

struct Case {
  int64_t b, h, g, s, t;
  bool causal, useOffset;
  int64_t offset;
  bool offset64;
  float qAmplitude;
};

template <typename T>
std::vector<T> random(size_t n, std::mt19937 &rng, float amp) {
  std::uniform_real_distribution<float> u(-amp, amp);
  std::vector<T> v(n);
  for (auto &x : v)
    x = fromF<T>(u(rng));
  return v;
}

/// max |ref - got| / max(1e-2, max |ref|); `bad` when got has a NaN (an
/// unwritten element: outputs start as NaN).
double relErr(const std::vector<double> &ref, const std::vector<float> &got,
              bool &bad) {
  double mx = 1e-2, err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i]))
      bad = true;
    mx = std::max(mx, std::fabs(ref[i]));
    err = std::max(err, std::fabs(ref[i] - double(got[i])));
  }
  return err / mx;
}

template <typename T, int HD> void runCase(const Case &c) {
  std::mt19937 rng(unsigned(1234 + c.s * 7 + c.t * 13 + HD));
  AttentionDims a;
  a.b = c.b, a.h = c.h, a.g = c.g, a.s = c.s, a.t = c.t, a.d = a.e = HD;
  a.scale = 1.0f / std::sqrt(float(HD));
  a.causal = c.causal;
  int32_t off32 = int32_t(c.offset);
  int64_t off64 = c.offset;
  if (c.useOffset) {
    a.offset = c.offset64 ? static_cast<const void *>(&off64)
                          : static_cast<const void *>(&off32);
    a.offset64 = c.offset64;
  }
  const size_t nq = size_t(c.b * c.h * c.s * HD), nk = size_t(c.b * c.g * c.t * HD);
  auto q = random<T>(nq, rng, c.qAmplitude), k = random<T>(nk, rng, 1.5f),
       v = random<T>(nk, rng, 1.0f), dout = random<T>(nq, rng, 1.0f);
  T nan;
  nan.bits = 0xFFFF;
  std::vector<T> out(nq, nan), dq(nq, nan), dk(nk, nan), dv(nk, nan);
  std::vector<float> lse(size_t(c.b * c.h * c.s), NAN), dvec(lse.size(), NAN);
  using L = fa::Layout<HD>;
  Dim3 qgrid{unsigned(c.b * c.h), unsigned((c.s + fa::BM - 1) / fa::BM)};
  Dim3 kgrid{unsigned(c.b * c.g), unsigned((c.t + fa::BM - 1) / fa::BM)};
  emu::launch(qgrid, L::fwd, [&] {
    fa::fwdKernel<T, HD>(a, q.data(), k.data(), v.data(), out.data(), nullptr,
                         nullptr, nullptr);
  });
  emu::launch(qgrid, L::fwd, [&] {
    fa::fwdKernel<T, HD>(a, q.data(), k.data(), v.data(), nullptr, lse.data(),
                         dout.data(), dvec.data());
  });
  emu::launch(qgrid, L::dq, [&] {
    fa::dqKernel<T, HD>(a, q.data(), k.data(), v.data(), dout.data(),
                        lse.data(), dvec.data(), dq.data());
  });
  if (c.t > 0)
    emu::launch(kgrid, L::dkdv, [&] {
      fa::dkdvKernel<T, HD>(a, q.data(), k.data(), v.data(), dout.data(),
                            lse.data(), dvec.data(), dk.data(), dv.data());
    });

  // The reference, in double.
  const int64_t shift = c.useOffset ? c.offset : c.t - c.s, hpg = c.h / c.g;
  std::vector<double> rOut(nq, 0), rDq(nq, 0), rDk(nk, 0), rDv(nk, 0),
      rLse(lse.size(), 0), rD(lse.size(), 0);
  auto Q = [&](int64_t bh, int64_t i, int x) { return double(toF(q[size_t((bh * c.s + i) * HD + x)])); };
  auto DO = [&](int64_t bh, int64_t i, int x) { return double(toF(dout[size_t((bh * c.s + i) * HD + x)])); };
  auto K = [&](int64_t kv, int64_t j, int x) { return double(toF(k[size_t((kv * c.t + j) * HD + x)])); };
  auto V = [&](int64_t kv, int64_t j, int x) { return double(toF(v[size_t((kv * c.t + j) * HD + x)])); };
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.h; ++h) {
      const int64_t bh = b * c.h + h, kv = b * c.g + h / hpg;
      for (int64_t i = 0; i < c.s; ++i) {
        std::vector<double> sc(size_t(c.t)), p(size_t(c.t), 0);
        double mx = -INFINITY;
        for (int64_t j = 0; j < c.t; ++j) {
          if (c.causal && j > i + shift) {
            sc[size_t(j)] = -INFINITY;
            continue;
          }
          double acc = 0;
          for (int x = 0; x < HD; ++x)
            acc += Q(bh, i, x) * K(kv, j, x);
          sc[size_t(j)] = acc * a.scale;
          mx = std::max(mx, sc[size_t(j)]);
        }
        if (mx == -INFINITY)
          continue; // no visible key: zeros, lse 0
        double sum = 0;
        for (int64_t j = 0; j < c.t; ++j)
          if (sc[size_t(j)] != -INFINITY)
            sum += p[size_t(j)] = std::exp(sc[size_t(j)] - mx);
        for (double &x : p)
          x /= sum;
        const size_t row = size_t(bh * c.s + i);
        rLse[row] = (mx + std::log(sum)) / std::log(2.0);
        for (int x = 0; x < HD; ++x) {
          double o = 0;
          for (int64_t j = 0; j < c.t; ++j)
            o += p[size_t(j)] * V(kv, j, x);
          rOut[row * HD + size_t(x)] = o;
        }
        double D = 0;
        for (int x = 0; x < HD; ++x)
          D += DO(bh, i, x) * rOut[row * HD + size_t(x)];
        rD[row] = D;
        for (int64_t j = 0; j < c.t; ++j) {
          if (p[size_t(j)] == 0)
            continue;
          double dp = 0;
          for (int x = 0; x < HD; ++x)
            dp += DO(bh, i, x) * V(kv, j, x);
          const double ds = p[size_t(j)] * (dp - D);
          for (int x = 0; x < HD; ++x) {
            rDq[row * HD + size_t(x)] += ds * K(kv, j, x) * a.scale;
            rDk[size_t((kv * c.t + j) * HD + x)] += ds * Q(bh, i, x) * a.scale;
            rDv[size_t((kv * c.t + j) * HD + x)] += p[size_t(j)] * DO(bh, i, x);
          }
        }
      }
    }
  auto widen = [](const std::vector<T> &x) {
    std::vector<float> r(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      r[i] = toF(x[i]);
    return r;
  };
  bool bad = false;
  const double tol = std::is_same_v<T, BF16> ? 3e-2 : 5e-3;
  EXPECT_LT(relErr(rOut, widen(out), bad), tol) << "out";
  EXPECT_LT(relErr(rDq, widen(dq), bad), tol) << "dq";
  EXPECT_LT(relErr(rDk, widen(dk), bad), tol) << "dk";
  EXPECT_LT(relErr(rDv, widen(dv), bad), tol) << "dv";
  double el = 0, ed = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (!std::isfinite(lse[i]) || !std::isfinite(dvec[i]))
      bad = true;
    el = std::max(el, std::fabs(double(lse[i]) - rLse[i]));
    ed = std::max(ed, std::fabs(double(dvec[i]) - rD[i]));
  }
  EXPECT_LT(el, 1e-2) << "lse (base 2)";
  EXPECT_LT(ed, 3e-2) << "D";
  EXPECT_FALSE(bad) << "NaN or an unwritten element";
}

const std::vector<Case> &cases() {
  static const std::vector<Case> cs = {
      {1, 2, 1, 64, 64, false, false, 0, false, 1.0f},
      {1, 4, 2, 100, 130, true, false, 0, false, 1.0f}, // shift 30, tails, GQA
      {2, 2, 2, 130, 70, true, false, 0, false, 1.0f},  // shift -60: blind rows
      {1, 3, 1, 70, 200, false, false, 0, false, 2.0f}, // GQA 3:1
      {1, 2, 1, 65, 65, true, true, -5, false, 1.0f},   // i32 offset
      {1, 2, 2, 40, 150, true, true, 100, true, 1.0f},  // i64 offset
      {1, 1, 1, 1, 1, true, false, 0, false, 1.0f},     // one query, one key
      {1, 2, 1, 128, 128, true, false, 0, false, 3.0f}, // peaky softmax
  };
  return cs;
}

std::string describe(const Case &c) {
  return "b=" + std::to_string(c.b) + " h=" + std::to_string(c.h) +
         " g=" + std::to_string(c.g) + " s=" + std::to_string(c.s) +
         " t=" + std::to_string(c.t) + (c.causal ? " causal" : "") +
         (c.useOffset ? " offset=" + std::to_string(c.offset) : "");
}

TEST(AttentionMmaEmulation, Bf16HeadDim64MatchesTheReference) {
  for (const Case &c : cases()) {
    SCOPED_TRACE(describe(c));
    runCase<BF16, 64>(c);
  }
}

TEST(AttentionMmaEmulation, F16HeadDim128MatchesTheReference) {
  // The shapes that exercise tails, blind rows and offsets.
  for (size_t i : {2, 5, 6}) {
    SCOPED_TRACE(describe(cases()[i]));
    runCase<F16, 128>(cases()[i]);
  }
}

TEST(AttentionMmaEmulation, SharedMemoryAccessesAreConflictFree) {
  runCase<BF16, 64>(cases()[0]);
  runCase<F16, 128>(cases()[0]);
  EXPECT_GT(emu::mmaCount, 0);
  EXPECT_EQ(emu::maxLd32Conflict, 1);
  EXPECT_EQ(emu::maxLdmConflict, 1);
}

} // namespace
