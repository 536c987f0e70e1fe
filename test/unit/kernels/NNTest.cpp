//===- NNTest.cpp - softmax, norms, attention, rope, batch_norm, dropout --===//

#include "KernelTestUtil.h"

using namespace kt;

namespace {

TEST(Softmax, AlongEachDim) {
  KT_SEEDED_RNG(rng);
  for (bool log : {false, true})
    for (DType dt : floatTypes())
      for (auto [shape, dim] :
           std::vector<std::pair<Shape, int64_t>>{{{4, 9}, 1},
                                                  {{4, 9}, 0},
                                                  {{3, 5, 7}, 1},
                                                  {{2, 3, 1000}, 2},
                                                  {{6}, 0}}) {
        Tensor x = randomTensor(rng, dt, shape, -6, 6);
        Tensor y(dt, shape);
        const char *op = log ? "log_softmax" : "softmax";
        ASSERT_TRUE(run(makeInstr(op, {{"dim", dim}}), {&x}, {&y}).isOk());
        int64_t n = shape[dim], inner = 1;
        for (size_t d = dim + 1; d < shape.size(); ++d)
          inner *= shape[d];
        std::vector<double> ref(static_cast<size_t>(x.size()));
        for (int64_t i = 0; i < x.size(); ++i) {
          int64_t base = (i / (n * inner)) * n * inner + i % inner;
          double m = -INFINITY, s = 0;
          for (int64_t j = 0; j < n; ++j)
            m = std::max(m, x.get(base + j * inner));
          for (int64_t j = 0; j < n; ++j)
            s += std::exp(x.get(base + j * inner) - m);
          ref[i] =
              log ? x.get(i) - m - std::log(s) : std::exp(x.get(i) - m) / s;
        }
        double tol = tolFor(dt, 2e-6 * std::log2(double(n) + 2));
        EXPECT_TRUE(allClose(y, ref, tol, log ? tol * 4 : 0))
            << op << " " << x.type.str() << " dim " << dim;
      }
}

/// layer_norm / rms_norm reference over dims [axis, rank).
std::vector<double> normRef(const Tensor &x, int64_t axis, double eps,
                            const Tensor *w, const Tensor *b, bool rms) {
  int64_t n = 1;
  for (size_t d = axis; d < x.type.shape.size(); ++d)
    n *= x.type.shape[d];
  std::vector<double> ref(static_cast<size_t>(x.size()));
  for (int64_t r = 0; r < x.size() / n; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < n; ++j)
      mean += x.get(r * n + j);
    mean /= double(n);
    for (int64_t j = 0; j < n; ++j) {
      double v = x.get(r * n + j);
      var += rms ? v * v : (v - mean) * (v - mean);
    }
    var /= double(n);
    for (int64_t j = 0; j < n; ++j) {
      double v = x.get(r * n + j);
      double y =
          rms ? v / std::sqrt(var + eps) : (v - mean) / std::sqrt(var + eps);
      if (w)
        y *= w->get(j);
      if (b)
        y += b->get(j);
      ref[r * n + j] = y;
    }
  }
  return ref;
}

TEST(LayerNorm, WeightBiasAxisVariants) {
  KT_SEEDED_RNG(rng);
  for (DType dt : floatTypes())
    for (int64_t axis : {2, 1})
      for (int variant = 0; variant < 4; ++variant) {
        bool hw = variant & 1, hb = variant & 2;
        Shape s{3, 4, 33};
        Shape ns(s.begin() + axis, s.end());
        Tensor x = randomTensor(rng, dt, s, -3, 5);
        Tensor w = randomTensor(rng, dt, ns, 0.5, 1.5);
        Tensor b = randomTensor(rng, dt, ns, -1, 1);
        Tensor y(dt, s);
        std::vector<const Tensor *> ins{&x};
        if (hw)
          ins.push_back(&w);
        if (hb)
          ins.push_back(&b);
        Instr in = makeInstr("layer_norm", {{"axis", axis},
                                            {"eps", 1e-5},
                                            {"has_weight", int64_t(hw)},
                                            {"has_bias", int64_t(hb)}});
        ASSERT_TRUE(run(in, ins, {&y}).isOk()) << run(in, ins, {&y}).message();
        auto ref =
            normRef(x, axis, 1e-5, hw ? &w : nullptr, hb ? &b : nullptr, false);
        double tol = tolFor(dt, 1e-5);
        EXPECT_TRUE(allClose(y, ref, tol, tol * 4)) << variant << " " << axis;
      }
  // Defaults: axis = rank-1, eps = 1e-5, operands decide weight/bias.
  Tensor x = randomTensor(rng, DType::F32, {5, 16}), y(DType::F32, {5, 16});
  ASSERT_TRUE(run(makeInstr("layer_norm"), {&x}, {&y}).isOk());
  EXPECT_TRUE(
      allClose(y, normRef(x, 1, 1e-5, nullptr, nullptr, false), 1e-5, 1e-5));
  // Weight of the wrong shape; operand count disagreeing with the flags.
  Tensor w(DType::F32, {15});
  EXPECT_FALSE(run(makeInstr("layer_norm"), {&x, &w}, {&y}).isOk());
  Tensor w2(DType::F32, {16});
  EXPECT_FALSE(run(makeInstr("layer_norm", {{"has_weight", int64_t(1)},
                                            {"has_bias", int64_t(1)}}),
                   {&x, &w2}, {&y})
                   .isOk());
}

TEST(RmsNorm, WithAndWithoutWeight) {
  KT_SEEDED_RNG(rng);
  for (DType dt : floatTypes())
    for (bool hw : {false, true}) {
      Shape s{6, 2, 40};
      Tensor x = randomTensor(rng, dt, s, -2, 2);
      Tensor w = randomTensor(rng, dt, {2, 40}, 0.5, 1.5);
      Tensor y(dt, s);
      std::vector<const Tensor *> ins{&x};
      if (hw)
        ins.push_back(&w);
      Instr in = makeInstr(
          "rms_norm",
          {{"axis", int64_t(1)}, {"eps", 1e-6}, {"has_weight", int64_t(hw)}});
      ASSERT_TRUE(run(in, ins, {&y}).isOk());
      auto ref = normRef(x, 1, 1e-6, hw ? &w : nullptr, nullptr, true);
      double tol = tolFor(dt, 1e-5);
      EXPECT_TRUE(allClose(y, ref, tol, tol));
    }
}

/// Attention reference from the docs/ops.md formula.
std::vector<double> attentionRef(const Tensor &q, const Tensor &k,
                                 const Tensor &v, bool causal, double scale) {
  int64_t B = q.type.shape[0], H = q.type.shape[1], S = q.type.shape[2],
          D = q.type.shape[3];
  int64_t G = k.type.shape[1], T = k.type.shape[2], E = v.type.shape[3];
  std::vector<double> out(size_t(B * H * S * E), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      int64_t g = h / (H / G);
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> sc(static_cast<size_t>(T));
        double m = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d)
            s += q.get(((b * H + h) * S + i) * D + d) *
                 k.get(((b * G + g) * T + j) * D + d);
          sc[j] = causal && j > i + (T - S) ? -INFINITY : s * scale;
          m = std::max(m, sc[j]);
        }
        double z = 0;
        for (int64_t j = 0; j < T; ++j)
          z += std::exp(sc[j] - m);
        for (int64_t e = 0; e < E; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < T; ++j)
            acc +=
                std::exp(sc[j] - m) / z * v.get(((b * G + g) * T + j) * E + e);
          out[((b * H + h) * S + i) * E + e] = acc;
        }
      }
    }
  return out;
}

TEST(Attention, CausalGqaMatchesReference) {
  KT_SEEDED_RNG(rng);
  struct Case {
    int64_t B, H, G, S, T, D, E;
    bool causal;
  };
  const Case cases[] = {{2, 4, 4, 8, 8, 16, 16, true},
                        {2, 4, 4, 8, 8, 16, 16, false},
                        {1, 6, 2, 5, 9, 8, 12, true}, // GQA, T > S (cache)
                        {2, 8, 1, 7, 7, 4, 4, true},  // multi-query
                        {1, 2, 2, 33, 40, 32, 24, false},
                        // 4 query heads x 520 rows of 520 scores: more than
                        // one score buffer (2^20 floats), the second chunk
                        // starting inside the fourth head.
                        {1, 4, 1, 520, 520, 4, 4, true}};
  for (const Case &c : cases)
    for (DType dt : floatTypes()) {
      Tensor q = randomTensor(rng, dt, {c.B, c.H, c.S, c.D}, -1.5, 1.5);
      Tensor k = randomTensor(rng, dt, {c.B, c.G, c.T, c.D}, -1.5, 1.5);
      Tensor v = randomTensor(rng, dt, {c.B, c.G, c.T, c.E});
      Tensor o(dt, {c.B, c.H, c.S, c.E});
      double scale = 1.0 / std::sqrt(double(c.D));
      Instr in = makeInstr("attention",
                           {{"causal", int64_t(c.causal)}, {"scale", scale}});
      ASSERT_TRUE(run(in, {&q, &k, &v}, {&o}).isOk());
      double tol = tolFor(dt, 1e-5);
      EXPECT_TRUE(allClose(o, attentionRef(q, k, v, c.causal, scale), tol, tol))
          << dtypeName(dt) << " H=" << c.H << " G=" << c.G
          << " causal=" << c.causal;
    }
  Tensor q(DType::F32, {1, 3, 4, 8}), k(DType::F32, {1, 2, 4, 8}),
      v(DType::F32, {1, 2, 4, 8}), o(DType::F32, {1, 3, 4, 8});
  EXPECT_FALSE(run(makeInstr("attention", {{"scale", 0.5}}), {&q, &k, &v}, {&o})
                   .isOk()); // H % G != 0
}

TEST(Rope, HalfSplitRotation) {
  KT_SEEDED_RNG(rng);
  for (DType dt : floatTypes()) {
    Shape s{2, 3, 10, 16};
    Tensor x = randomTensor(rng, dt, s, -2, 2);
    Tensor y(dt, s);
    double theta = 500.0;
    ASSERT_TRUE(run(makeInstr("rope", {{"theta", theta}}), {&x}, {&y}).isOk());
    int64_t S = 10, D = 16;
    std::vector<double> ref(static_cast<size_t>(x.size()));
    for (int64_t r = 0; r < x.size() / D; ++r) {
      int64_t p = r % S;
      for (int64_t i = 0; i < D / 2; ++i) {
        double a = double(p) * std::pow(theta, -2.0 * double(i) / double(D));
        double x0 = x.get(r * D + i), x1 = x.get(r * D + i + D / 2);
        ref[r * D + i] = x0 * std::cos(a) - x1 * std::sin(a);
        ref[r * D + i + D / 2] = x1 * std::cos(a) + x0 * std::sin(a);
      }
    }
    double tol = tolFor(dt, 1e-5);
    EXPECT_TRUE(allClose(y, ref, tol, tol * 2));
  }
  Tensor x(DType::F32, {2, 3}), y(DType::F32, {2, 3});
  EXPECT_FALSE(run(makeInstr("rope"), {&x}, {&y}).isOk()); // odd D
}

TEST(BatchNorm, TrainingAndInference) {
  KT_SEEDED_RNG(rng);
  for (DType dt : floatTypes())
    for (bool training : {true, false}) {
      int64_t N = 4, C = 3, HW = 25;
      Tensor x = randomTensor(rng, dt, {N, C, 5, 5}, -2, 3);
      Tensor w = randomTensor(rng, dt, {C}, 0.5, 1.5);
      Tensor b = randomTensor(rng, dt, {C}, -1, 1);
      Tensor rm = randomTensor(rng, dt, {C}, -0.5, 0.5);
      Tensor rv = randomTensor(rng, dt, {C}, 0.5, 2);
      Tensor y(dt, {N, C, 5, 5}), rmo(dt, {C}), rvo(dt, {C});
      double eps = 1e-5, mom = 0.1;
      Instr in = makeInstr(
          "batch_norm",
          {{"eps", eps}, {"momentum", mom}, {"training", int64_t(training)}});
      ASSERT_TRUE(run(in, {&x, &w, &b, &rm, &rv}, {&y, &rmo, &rvo}).isOk());
      std::vector<double> yref(static_cast<size_t>(x.size())), rmref(C),
          rvref(C);
      for (int64_t c = 0; c < C; ++c) {
        double mean = 0, var = 0;
        int64_t cnt = N * HW;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t j = 0; j < HW; ++j)
            mean += x.get((n * C + c) * HW + j);
        mean /= double(cnt);
        for (int64_t n = 0; n < N; ++n)
          for (int64_t j = 0; j < HW; ++j) {
            double d = x.get((n * C + c) * HW + j) - mean;
            var += d * d;
          }
        double biased = var / double(cnt), unbiased = var / double(cnt - 1);
        double useMean = training ? mean : rm.get(c);
        double useVar = training ? biased : rv.get(c);
        rmref[c] = training ? (1 - mom) * rm.get(c) + mom * mean : rm.get(c);
        rvref[c] =
            training ? (1 - mom) * rv.get(c) + mom * unbiased : rv.get(c);
        for (int64_t n = 0; n < N; ++n)
          for (int64_t j = 0; j < HW; ++j) {
            int64_t i = (n * C + c) * HW + j;
            yref[i] =
                (x.get(i) - useMean) / std::sqrt(useVar + eps) * w.get(c) +
                b.get(c);
          }
      }
      double tol = tolFor(dt, 1e-5);
      EXPECT_TRUE(allClose(y, yref, tol, tol * 4)) << training;
      EXPECT_TRUE(allClose(rmo, rmref, tol, tol)) << training;
      EXPECT_TRUE(allClose(rvo, rvref, tol, tol)) << training;
    }
  Tensor x(DType::F32, {2, 3}), v3(DType::F32, {3}), v2(DType::F32, {2});
  Tensor y(DType::F32, {2, 3});
  EXPECT_FALSE(
      run(makeInstr("batch_norm"), {&x, &v3, &v3, &v3, &v2}, {&y, &v3, &v3})
          .isOk());
  EXPECT_FALSE(
      run(makeInstr("batch_norm"), {&x, &v3, &v3, &v3}, {&y, &v3, &v3}).isOk());
}

/// u(seed, i) exactly as written in docs/ops.md.
double uRef(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z = z ^ (z >> 31);
  return double(z >> 40) * std::ldexp(1.0, -24);
}

TEST(Dropout, FormulaDeterminismAndKeepRate) {
  KT_SEEDED_RNG(rng);
  for (DType dt : floatTypes())
    for (double rate : {0.0, 0.1, 0.5, 0.9}) {
      int64_t n = 200000;
      Tensor x = randomTensor(rng, dt, {n}, 0.5, 2);
      Tensor y1(dt, {n}), y2(dt, {n});
      int64_t seed = 1234567;
      Instr in = makeInstr("dropout", {{"rate", rate}, {"seed", seed}});
      ASSERT_TRUE(run(in, {&x}, {&y1}).isOk());
      ASSERT_TRUE(run(in, {&x}, {&y2}).isOk());
      EXPECT_EQ(std::memcmp(y1.data(), y2.data(), size_t(y1.type.byteSize())),
                0);
      std::vector<double> ref(static_cast<size_t>(n));
      int64_t kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        bool keep = uRef(uint64_t(seed), uint64_t(i)) >= rate;
        kept += keep;
        ref[i] = keep ? x.get(i) / (1 - rate) : 0.0;
      }
      EXPECT_TRUE(allClose(y1, ref, tolFor(dt, 1e-6)));
      // Keep rate within 5 sigma of 1 - rate.
      double p = 1 - rate, sigma = std::sqrt(p * (1 - p) / double(n));
      EXPECT_NEAR(double(kept) / double(n), p, 5 * sigma + 1e-12) << rate;
    }
  // A different seed drops different elements.
  Tensor x(DType::F32, {1000}), a(DType::F32, {1000}), b(DType::F32, {1000});
  for (int i = 0; i < 1000; ++i)
    x.set(i, 1.0);
  ASSERT_TRUE(run(makeInstr("dropout", {{"rate", 0.5}, {"seed", int64_t(1)}}),
                  {&x}, {&a})
                  .isOk());
  ASSERT_TRUE(run(makeInstr("dropout", {{"rate", 0.5}, {"seed", int64_t(2)}}),
                  {&x}, {&b})
                  .isOk());
  EXPECT_NE(std::memcmp(a.data(), b.data(), 4000), 0);
  EXPECT_FALSE(run(makeInstr("dropout", {{"rate", 1.0}, {"seed", int64_t(1)}}),
                   {&x}, {&a})
                   .isOk());
}

/// The effective seed of docs/ops.md, written out independently of the
/// kernel: seed + offset * 0xD1B54A32D192ED03 in uint64 (offset sign-extended).
uint64_t effectiveSeedRef(int64_t seed, int64_t offset) {
  uint64_t s = static_cast<uint64_t>(seed);
  uint64_t o = static_cast<uint64_t>(offset); // two's complement = sign-extend
  uint64_t m = 0xD1B54A32D192ED03ull;
  // Shift-and-add multiplication, wrapping mod 2^64.
  uint64_t prod = 0;
  for (int b = 0; b < 64; ++b)
    if ((m >> b) & 1)
      prod += o << b;
  return s + prod;
}

Tensor offsetScalar(DType dt, int64_t v) {
  Tensor t(dt, {});
  if (dt == DType::I64)
    *static_cast<int64_t *>(t.data()) = v;
  else
    *static_cast<int32_t *>(t.data()) = static_cast<int32_t>(v);
  return t;
}

TEST(Dropout, OffsetOperand) {
  KT_SEEDED_RNG(rng);
  const int64_t n = 4096;
  for (DType dt : floatTypes()) {
    Tensor x = randomTensor(rng, dt, {n}, 0.5, 2);
    for (int64_t seed : {int64_t(42), int64_t(-7), int64_t(9007199254740993)}) {
      Instr in = makeInstr("dropout", {{"rate", 0.3}, {"seed", seed}});
      Tensor none(dt, {n});
      ASSERT_TRUE(run(in, {&x}, {&none}).isOk());
      // Offset 0 (i32 or i64) reproduces the offset-less mask bitwise.
      for (DType ot : {DType::I32, DType::I64}) {
        Tensor zero = offsetScalar(ot, 0), y(dt, {n});
        ASSERT_TRUE(run(in, {&x, &zero}, {&y}).isOk());
        EXPECT_EQ(std::memcmp(none.data(), y.data(), size_t(y.type.byteSize())),
                  0)
            << x.type.str() << " seed " << seed;
      }
      // Nonzero offsets change the mask and follow the formula.
      for (int64_t off : {int64_t(1), int64_t(2), int64_t(-1), int64_t(1000),
                          int64_t(0x7fffffffffffffffll)}) {
        for (DType ot : {DType::I32, DType::I64}) {
          if (ot == DType::I32 && off != int64_t(int32_t(off)))
            continue;
          Tensor o = offsetScalar(ot, off), y(dt, {n});
          ASSERT_TRUE(run(in, {&x, &o}, {&y}).isOk());
          EXPECT_NE(
              std::memcmp(none.data(), y.data(), size_t(y.type.byteSize())), 0)
              << "offset " << off;
          uint64_t s = effectiveSeedRef(seed, off);
          std::vector<double> ref(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i)
            ref[i] = uRef(s, uint64_t(i)) >= 0.3 ? x.get(i) / 0.7 : 0.0;
          EXPECT_TRUE(allClose(y, ref, tolFor(dt, 1e-6)))
              << x.type.str() << " seed " << seed << " offset " << off << " "
              << o.type.str();
          // Exactly the same elements are zero as in the reference.
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(y.get(i) == 0.0, ref[i] == 0.0) << i;
        }
      }
    }
  }
  // The i32 offset is sign-extended: -1 as i32 == -1 as i64.
  Tensor x(DType::F32, {1000}), a(DType::F32, {1000}), b(DType::F32, {1000});
  for (int i = 0; i < 1000; ++i)
    x.set(i, 1.0);
  Instr in = makeInstr("dropout", {{"rate", 0.5}, {"seed", int64_t(5)}});
  Tensor m32 = offsetScalar(DType::I32, -1), m64 = offsetScalar(DType::I64, -1);
  ASSERT_TRUE(run(in, {&x, &m32}, {&a}).isOk());
  ASSERT_TRUE(run(in, {&x, &m64}, {&b}).isOk());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 4000), 0);
  // The offset must be a rank-0 integer.
  Tensor vec(DType::I64, {1}), f(DType::F32, {});
  EXPECT_FALSE(run(in, {&x, &vec}, {&a}).isOk());
  EXPECT_FALSE(run(in, {&x, &f}, {&a}).isOk());
  EXPECT_FALSE(run(in, {&x, &m64, &m64}, {&a}).isOk());
}

} // namespace
