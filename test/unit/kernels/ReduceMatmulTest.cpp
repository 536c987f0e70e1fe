//===- ReduceMatmulTest.cpp - sum/mean/max and matmul against float64 -----===//

#include "KernelTestUtil.h"

#include <limits>

using namespace kt;

namespace {

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

struct ReduceCase {
  Shape shape;
  std::vector<int64_t> dims;
};

std::vector<ReduceCase> reduceCases() {
  return {{{7, 9}, {1}},          {{7, 9}, {0}},       {{7, 9}, {0, 1}},
          {{3, 4, 5}, {1}},       {{3, 4, 5}, {0, 2}}, {{2, 3, 4, 5}, {1, 3}},
          {{2, 3, 4, 5}, {0, 1}}, {{2, 1, 4}, {1}},    {{5}, {0}},
          {{600, 300}, {0}},      {{300, 600}, {1}},   {{4, 3}, {}},
          {{2, 1000, 3}, {1}},
          // Longer than one chunk of a float sum (16384): chunk borders
          // inside a row (rows of 333, two reduced runs), one long stretch.
          {{70, 3, 333}, {0, 2}}, {{40000}, {0}}};
}

TEST(Reduce, MatchesReference) {
  KT_SEEDED_RNG(rng);
  for (const char *op : {"sum", "mean", "max"})
    for (DType dt :
         {DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64})
      for (const ReduceCase &c : reduceCases())
        for (bool keep : {false, true}) {
          if (std::string(op) == "mean" && !isFloat(dt))
            continue;
          SCOPED_TRACE(std::string(op) + " " + dtypeName(dt) + " dims " +
                       std::to_string(c.dims.size()) + " keep " +
                       std::to_string(keep));
          Tensor x = randomTensor(rng, dt, c.shape, isFloat(dt) ? -2 : -100,
                                  isFloat(dt) ? 2 : 100);
          Shape outShape, keptShape;
          std::vector<bool> red(c.shape.size(), false);
          for (int64_t d : c.dims)
            red[d] = true;
          int64_t count = 1;
          for (size_t i = 0; i < c.shape.size(); ++i) {
            if (!red[i])
              outShape.push_back(c.shape[i]);
            else if (keep)
              outShape.push_back(1);
            keptShape.push_back(red[i] ? 1 : c.shape[i]);
            count *= red[i] ? c.shape[i] : 1;
          }
          Tensor y(dt, outShape);
          Instr in =
              makeInstr(op, {{"dims", c.dims}, {"keepdims", int64_t(keep)}});
          ASSERT_TRUE(run(in, {&x}, {&y}).isOk());
          std::vector<double> ref(size_t(numel(keptShape)),
                                  std::string(op) == "max" ? -INFINITY : 0.0);
          std::vector<double> mag(ref.size(), 0.0);
          for (int64_t i = 0; i < x.size(); ++i) {
            Shape idx = unravel(i, c.shape);
            for (size_t d = 0; d < idx.size(); ++d)
              if (red[d])
                idx[d] = 0;
            int64_t o = ravel(idx, keptShape);
            double v = x.get(i);
            if (std::string(op) == "max")
              ref[o] = std::max(ref[o], v);
            else
              ref[o] += v;
            mag[o] += std::fabs(v);
          }
          if (std::string(op) == "mean")
            for (double &v : ref)
              v /= double(count);
          if (!isFloat(dt)) {
            EXPECT_TRUE(allEqual(y, ref));
          } else {
            // Error bound relative to the sum of magnitudes.
            double tol = tolFor(dt, 1e-6);
            double atol = 0;
            for (size_t o = 0; o < ref.size(); ++o)
              atol = std::max(
                  atol, tol * mag[o] / (std::string(op) == "mean" ? count : 1));
            EXPECT_TRUE(
                allClose(y, ref, tol, std::string(op) == "max" ? 0 : atol));
          }
        }
}

// A long float sum is cut into chunks summed in parallel: the result is the
// same bits with any thread count, and equal to an ordered double sum
// rounded once (the test data's sums are far from a float rounding tie).
TEST(Reduce, LongSumsIndependentOfThreadCount) {
  KT_SEEDED_RNG(rng);
  Tensor x = randomTensor(rng, DType::F32, {5, 3, 20011}, -2, 2);
  Instr in = makeInstr("sum", {{"dims", std::vector<int64_t>{0, 2}}});
  int saved = cpu::numThreads();
  std::vector<std::vector<float>> got;
  for (int threads : {1, 2, 5}) {
    cpu::setNumThreads(threads);
    Tensor y(DType::F32, {3});
    ASSERT_TRUE(run(in, {&x}, {&y}).isOk());
    got.push_back({float(y.get(0)), float(y.get(1)), float(y.get(2))});
  }
  cpu::setNumThreads(saved);
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(got[0], got[2]);
  for (int k = 0; k < 3; ++k) {
    double ref = 0;
    for (int a = 0; a < 5; ++a)
      for (int c = 0; c < 20011; ++c)
        ref += x.get((a * 3 + k) * 20011 + c);
    EXPECT_NEAR(got[0][size_t(k)], ref, 1e-6 * std::fabs(ref) + 1e-4);
  }
}

TEST(Reduce, MaxPropagatesNaN) {
  Tensor x(DType::F32, {2, 3}), y(DType::F32, {2});
  for (int i = 0; i < 6; ++i)
    x.set(i, i);
  x.set(1, NAN);
  ASSERT_TRUE(
      run(makeInstr("max", {{"dims", std::vector<int64_t>{1}}}), {&x}, {&y})
          .isOk());
  EXPECT_TRUE(std::isnan(y.get(0)));
  EXPECT_EQ(y.get(1), 5);
}

TEST(Reduce, RejectsBadDims) {
  Tensor x(DType::F32, {2, 3}), y(DType::F32, {2});
  EXPECT_FALSE(
      run(makeInstr("sum", {{"dims", std::vector<int64_t>{2}}}), {&x}, {&y})
          .isOk());
  EXPECT_FALSE(
      run(makeInstr("sum", {{"dims", std::vector<int64_t>{0}}}), {&x}, {&y})
          .isOk()); // result shape should be [3]
  EXPECT_FALSE(run(makeInstr("sum"), {&x}, {&y}).isOk()); // missing dims
  Tensor xi(DType::I32, {2, 3}), yi(DType::I32, {2});
  EXPECT_FALSE(
      run(makeInstr("mean", {{"dims", std::vector<int64_t>{1}}}), {&xi}, {&yi})
          .isOk());
}

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

struct MatmulCase {
  Shape a, b;
  bool ta, tb;
};

TEST(Matmul, MatchesReference) {
  KT_SEEDED_RNG(rng);
  const MatmulCase cases[] = {
      {{5, 7}, {7, 3}, false, false},
      {{7, 5}, {7, 3}, true, false},
      {{5, 7}, {3, 7}, false, true},
      {{7, 5}, {3, 7}, true, true},
      {{2, 4, 8}, {16, 8}, false, true},       // linear layer, folded
      {{2, 3, 4, 8}, {8, 6}, false, false},    // folded over two batch dims
      {{2, 1, 4, 8}, {3, 8, 5}, false, false}, // both batches broadcast
      {{4, 8}, {2, 3, 8, 5}, false, false},    // a broadcast over b's batch
      {{3, 8, 4}, {1, 8, 5}, true, false},
      {{2, 3, 9, 4}, {2, 3, 9, 6}, true, false},
      {{64, 96}, {96, 80}, false, false},
      {{1, 1}, {1, 1}, false, false},
  };
  for (const MatmulCase &c : cases)
    for (DType dt : floatTypes()) {
      Tensor a = randomTensor(rng, dt, c.a), b = randomTensor(rng, dt, c.b);
      size_t ra = c.a.size(), rb = c.b.size();
      int64_t m = c.ta ? c.a[ra - 1] : c.a[ra - 2];
      int64_t k = c.ta ? c.a[ra - 2] : c.a[ra - 1];
      int64_t n = c.tb ? c.b[rb - 2] : c.b[rb - 1];
      Shape ab(c.a.begin(), c.a.end() - 2), bb(c.b.begin(), c.b.end() - 2);
      Shape batch;
      size_t r = std::max(ab.size(), bb.size());
      for (size_t i = 0; i < r; ++i) {
        int64_t x = i < r - ab.size() ? 1 : ab[i - (r - ab.size())];
        int64_t y = i < r - bb.size() ? 1 : bb[i - (r - bb.size())];
        batch.push_back(std::max(x, y));
      }
      Shape os = batch;
      os.push_back(m);
      os.push_back(n);
      Tensor o(dt, os);
      Instr in = makeInstr("matmul", {{"transpose_a", int64_t(c.ta)},
                                      {"transpose_b", int64_t(c.tb)}});
      ASSERT_TRUE(run(in, {&a, &b}, {&o}).isOk())
          << run(in, {&a, &b}, {&o}).message();
      std::vector<double> ref(static_cast<size_t>(numel(os)));
      int64_t nb = numel(batch);
      for (int64_t bi = 0; bi < nb; ++bi) {
        Shape bidx = unravel(bi, batch);
        int64_t ia = broadcastIndex(bidx, ab), ib = broadcastIndex(bidx, bb);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t p = 0; p < k; ++p) {
              double av = a.get(ia * m * k + (c.ta ? p * m + i : i * k + p));
              double bv = b.get(ib * k * n + (c.tb ? j * k + p : p * n + j));
              s += av * bv;
            }
            ref[(bi * m + i) * n + j] = s;
          }
      }
      double tol = tolFor(dt, 1e-6 * double(k));
      EXPECT_TRUE(allClose(o, ref, tol, tol * std::sqrt(double(k))))
          << a.type.str() << " x " << b.type.str();
    }
}

TEST(Matmul, RejectsBadShapes) {
  Tensor a(DType::F32, {4, 5}), b(DType::F32, {6, 3}), o(DType::F32, {4, 3});
  Status s = run(makeInstr("matmul"), {&a, &b}, {&o});
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("matmul"), std::string::npos);
  Tensor a1(DType::F32, {5}), b1(DType::F32, {5, 3}), o1(DType::F32, {3});
  EXPECT_FALSE(run(makeInstr("matmul"), {&a1, &b1}, {&o1}).isOk());
  Tensor ai(DType::I32, {2, 2}), oi(DType::I32, {2, 2});
  EXPECT_FALSE(run(makeInstr("matmul"), {&ai, &ai}, {&oi}).isOk());
  Tensor a3(DType::F32, {2, 4, 5}), b3(DType::F32, {3, 5, 2}),
      o3(DType::F32, {2, 4, 2});
  EXPECT_FALSE(run(makeInstr("matmul"), {&a3, &b3}, {&o3}).isOk());
}

} // namespace
