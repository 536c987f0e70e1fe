//===- ParamInitTest.cpp - Deterministic parameter initialization ---------===//

#include "TestUtil.h"

#include "runtime/exec/ParamInit.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace dlopt::rt;
using namespace dlopt::rt::test;

namespace {

struct Moments {
  double mean = 0, std = 0, min = 1e300, max = -1e300;
};

Moments moments(const HostTensor &t) {
  Moments m;
  int64_t n = t.numElements();
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = t.elementAsDouble(i);
    sum += v;
    sq += v * v;
    m.min = std::min(m.min, v);
    m.max = std::max(m.max, v);
  }
  m.mean = sum / double(n);
  m.std = std::sqrt(sq / double(n) - m.mean * m.mean);
  return m;
}

HostTensor init(const TensorType &t, const Init &i, uint64_t seed = 0,
                uint64_t index = 0) {
  Expected<HostTensor> r = initParam(t, i, seed, index);
  EXPECT_TRUE(r.isOk()) << r.status().message();
  return r ? r.take() : HostTensor();
}

} // namespace

// Pins the documented scheme (docs/dlopt-run.md); the expected values were
// computed independently from that description in Python.
TEST(ParamInit, KnownAnswers) {
  uint64_t key = initKey(42, 3);
  EXPECT_EQ(key, 0x581ce1ff0e4ae394ull);
  EXPECT_DOUBLE_EQ(initUniform(key, 0), 0.19929231649681145);
  EXPECT_DOUBLE_EQ(initUniform(key, 1), 0.48018569935182964);
  EXPECT_DOUBLE_EQ(initUniform(key, 2), 0.06528716946909863);
  HostTensor t = init(tt({3}), Init{"normal", 0.5, 0.25}, 42, 3);
  EXPECT_FLOAT_EQ(float(t.elementAsDouble(0)), float(0.5 + 0.25 * -0.6615620822105225));
  EXPECT_FLOAT_EQ(float(t.elementAsDouble(1)), float(0.5 + 0.25 * -0.2729302059040843));
  EXPECT_FLOAT_EQ(float(t.elementAsDouble(2)), float(0.5 + 0.25 * -0.7170039918508408));
}

TEST(ParamInit, Deterministic) {
  Init normal{"normal", 0.0, 0.02};
  HostTensor a = init(tt({64, 64}), normal, 7, 2);
  HostTensor b = init(tt({64, 64}), normal, 7, 2);
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_NE(a.bytes, init(tt({64, 64}), normal, 8, 2).bytes);
  EXPECT_NE(a.bytes, init(tt({64, 64}), normal, 7, 3).bytes);
  // Element i depends only on (seed, param, i): a longer tensor extends it.
  HostTensor longer = init(tt({64 * 64 + 10}), normal, 7, 2);
  EXPECT_TRUE(std::equal(a.bytes.begin(), a.bytes.end(), longer.bytes.begin()));
}

TEST(ParamInit, NormalStatistics) {
  HostTensor t = init(tt({1000, 1000}), Init{"normal", 1.5, 0.5}, 123, 0);
  Moments m = moments(t);
  EXPECT_NEAR(m.mean, 1.5, 0.003);
  EXPECT_NEAR(m.std, 0.5, 0.003);
  EXPECT_LT(m.min, 1.5 - 4 * 0.5); // real tails, not truncated
}

TEST(ParamInit, TruncatedNormalStatistics) {
  HostTensor t = init(tt({1000, 1000}), Init{"truncated_normal", -1.0, 2.0}, 5, 1);
  Moments m = moments(t);
  EXPECT_NEAR(m.mean, -1.0, 0.01);
  // Std of a standard normal cut at +-2 is 0.8796.
  EXPECT_NEAR(m.std, 2.0 * 0.8796, 0.01);
  EXPECT_GE(m.min, -1.0 - 4.0 - 1e-6);
  EXPECT_LE(m.max, -1.0 + 4.0 + 1e-6);
  EXPECT_LT(m.min, -1.0 - 3.9);
}

TEST(ParamInit, UniformStatistics) {
  HostTensor t = init(tt({500000}), Init{"uniform", 0, 1, -2.0, 6.0}, 9, 4);
  Moments m = moments(t);
  EXPECT_NEAR(m.mean, 2.0, 0.02);
  EXPECT_NEAR(m.std, 8.0 / std::sqrt(12.0), 0.02);
  EXPECT_GE(m.min, -2.0);
  EXPECT_LT(m.max, 6.0);
}

TEST(ParamInit, ConstantsAndDTypes) {
  Init c;
  c.dist = "constant";
  c.value = 0.1;
  HostTensor f = init(tt({4}), c);
  EXPECT_EQ(f.data<float>()[3], 0.1f);
  HostTensor h = init(tt({4}, DType::BF16), c);
  EXPECT_NEAR(h.elementAsDouble(0), 0.1, 0.001);
  HostTensor ones = init(tt({2, 2}, DType::I32), Init{"ones"});
  EXPECT_EQ(ones.data<int32_t>()[3], 1);
  HostTensor zeros = init(tt({3}, DType::I64), Init{"zeros"});
  EXPECT_EQ(zeros.data<int64_t>()[2], 0);
  HostTensor b = init(tt({1000}, DType::BF16), Init{"normal", 0.0, 1.0}, 1, 1);
  HostTensor f32 = init(tt({1000}), Init{"normal", 0.0, 1.0}, 1, 1);
  // bf16 holds the rounded f32 value.
  for (int i = 0; i < 1000; ++i)
    EXPECT_NEAR(b.elementAsDouble(i), f32.elementAsDouble(i),
                std::fabs(f32.elementAsDouble(i)) / 128.0);
  EXPECT_FALSE(initParam(tt({2}), Init{"gaussian"}, 0, 0).isOk());
}

// A block generated alone equals the same block cut out of the whole
// parameter, for every distribution, block shape and position.
TEST(ParamInit, BlocksEqualTheirPartOfTheWhole) {
  TensorType global = tt({6, 4, 10});
  const std::vector<Init> inits = {
      Init{"normal", 0.5, 2.0}, Init{"uniform"}, Init{"truncated_normal", 0.0, 1.0},
      Init{"ones"}};
  for (size_t k = 0; k < inits.size(); ++k) {
    Init init = inits[k];
    if (init.dist == "uniform") {
      init.low = -3;
      init.high = 5;
    }
    auto whole = initParam(global, init, 11, k);
    ASSERT_TRUE(whole) << whole.status().message();
    for (std::vector<int64_t> shape : {std::vector<int64_t>{3, 4, 10},
                                       std::vector<int64_t>{6, 2, 5},
                                       std::vector<int64_t>{2, 1, 2}})
      for (int64_t a = 0; a + shape[0] <= 6; a += shape[0])
        for (int64_t b = 0; b + shape[1] <= 4; b += shape[1])
          for (int64_t c = 0; c + shape[2] <= 10; c += shape[2]) {
            TensorType local = tt(shape);
            auto block = initParamBlock(global, local, {a, b, c}, init, 11, k);
            ASSERT_TRUE(block) << block.status().message();
            for (int64_t i = 0; i < shape[0]; ++i)
              for (int64_t j = 0; j < shape[1]; ++j)
                for (int64_t l = 0; l < shape[2]; ++l) {
                  float want = whole->data<float>()[((a + i) * 4 + b + j) * 10 +
                                                    c + l];
                  float got =
                      block->data<float>()[(i * shape[1] + j) * shape[2] + l];
                  ASSERT_EQ(want, got) << init.dist << " at " << a + i << ","
                                       << b + j << "," << c + l;
                }
          }
  }
  // A block that does not fit is refused.
  auto bad = initParamBlock(global, tt({4, 4, 10}),
                            {4, 0, 0}, inits[0], 1, 0);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("does not fit"), std::string::npos);
}
