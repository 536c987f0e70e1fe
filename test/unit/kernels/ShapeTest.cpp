//===- ShapeTest.cpp - data movement kernels: exact results ---------------===//

#include "KernelTestUtil.h"

using namespace kt;

namespace {

const DType kAllTypes[] = {DType::F32, DType::F16, DType::BF16,
                           DType::I32, DType::I64, DType::I1};

TEST(Reshape, CopiesRowMajor) {
  KT_SEEDED_RNG(rng);
  for (DType dt : kAllTypes) {
    Tensor x = randomTensor(rng, dt, {4, 6, 5}, -50, 50);
    Tensor y(dt, {24, 5});
    ASSERT_TRUE(run(makeInstr("reshape"), {&x}, {&y}).isOk());
    EXPECT_TRUE(allEqual(y, x.values()));
  }
  Tensor x(DType::F32, {4}), y(DType::F32, {5});
  EXPECT_FALSE(run(makeInstr("reshape"), {&x}, {&y}).isOk());
}

TEST(Transpose, Permutations) {
  KT_SEEDED_RNG(rng);
  const std::pair<Shape, std::vector<int64_t>> cases[] = {
      {{4, 8}, {1, 0}},
      {{3, 4, 5}, {0, 2, 1}},
      {{3, 4, 5}, {2, 0, 1}},
      {{3, 4, 5}, {1, 0, 2}},
      {{2, 3, 4, 5}, {0, 2, 1, 3}},
      {{2, 3, 4, 5}, {3, 2, 1, 0}},
      {{1, 7, 1, 3}, {2, 3, 0, 1}},
      {{5}, {0}},
      {{130, 70}, {1, 0}},
      {{2, 3, 4}, {0, 1, 2}}};
  for (auto &[shape, perm] : cases)
    for (DType dt : kAllTypes) {
      Tensor x = randomTensor(rng, dt, shape, -50, 50);
      Shape os;
      for (int64_t p : perm)
        os.push_back(shape[p]);
      Tensor y(dt, os);
      ASSERT_TRUE(
          run(makeInstr("transpose", {{"perm", perm}}), {&x}, {&y}).isOk());
      std::vector<double> ref(static_cast<size_t>(numel(os)));
      for (int64_t i = 0; i < numel(os); ++i) {
        Shape oi = unravel(i, os), ii(shape.size());
        for (size_t d = 0; d < perm.size(); ++d)
          ii[perm[d]] = oi[d];
        ref[i] = x.get(ravel(ii, shape));
      }
      EXPECT_TRUE(allEqual(y, ref)) << x.type.str();
    }
  Tensor x(DType::F32, {2, 3}), y(DType::F32, {3, 2});
  EXPECT_FALSE(
      run(makeInstr("transpose", {{"perm", std::vector<int64_t>{0, 0}}}), {&x},
          {&y})
          .isOk());
  EXPECT_FALSE(
      run(makeInstr("transpose", {{"perm", std::vector<int64_t>{0, 1}}}), {&x},
          {&y})
          .isOk());
}

TEST(BroadcastTo, NumPyRules) {
  KT_SEEDED_RNG(rng);
  const std::pair<Shape, Shape> cases[] = {
      {{1, 8}, {4, 8}}, {{8}, {3, 4, 8}}, {{3, 1, 2}, {3, 5, 2}},
      {{}, {2, 3}},     {{2, 3}, {2, 3}}, {{4, 1}, {2, 4, 300}}};
  for (auto &[from, to] : cases)
    for (DType dt : {DType::F32, DType::BF16, DType::I64, DType::I1}) {
      Tensor x = randomTensor(rng, dt, from, -50, 50);
      Tensor y(dt, to);
      ASSERT_TRUE(run(makeInstr("broadcast_to"), {&x}, {&y}).isOk());
      std::vector<double> ref;
      for (int64_t i = 0; i < numel(to); ++i)
        ref.push_back(x.get(broadcastIndex(unravel(i, to), from)));
      EXPECT_TRUE(allEqual(y, ref));
    }
  Tensor x(DType::F32, {3}), y(DType::F32, {4});
  EXPECT_FALSE(run(makeInstr("broadcast_to"), {&x}, {&y}).isOk());
}

TEST(Concat, AlongEachDim) {
  KT_SEEDED_RNG(rng);
  for (int64_t dim = 0; dim < 3; ++dim)
    for (DType dt : {DType::F32, DType::F16, DType::I32, DType::I1}) {
      Shape s0{2, 3, 4}, s1 = s0, s2 = s0;
      s1[dim] = 1;
      s2[dim] = 5;
      Tensor a = randomTensor(rng, dt, s0, -9, 9),
             b = randomTensor(rng, dt, s1, -9, 9),
             c = randomTensor(rng, dt, s2, -9, 9);
      Shape os = s0;
      os[dim] = s0[dim] + s1[dim] + s2[dim];
      Tensor y(dt, os);
      ASSERT_TRUE(
          run(makeInstr("concat", {{"dim", dim}}), {&a, &b, &c}, {&y}).isOk());
      std::vector<double> ref;
      for (int64_t i = 0; i < numel(os); ++i) {
        Shape idx = unravel(i, os);
        int64_t p = idx[dim];
        const Tensor *src = &a;
        const Shape *ss = &s0;
        if (p >= s0[dim] + s1[dim]) {
          src = &c;
          ss = &s2;
          p -= s0[dim] + s1[dim];
        } else if (p >= s0[dim]) {
          src = &b;
          ss = &s1;
          p -= s0[dim];
        }
        idx[dim] = p;
        ref.push_back(src->get(ravel(idx, *ss)));
      }
      EXPECT_TRUE(allEqual(y, ref)) << dim;
    }
  Tensor a(DType::F32, {2, 3}), b(DType::F32, {2, 4}), y(DType::F32, {4, 3});
  EXPECT_FALSE(
      run(makeInstr("concat", {{"dim", int64_t(0)}}), {&a, &b}, {&y}).isOk());
}

TEST(Slice, StartLimitStride) {
  KT_SEEDED_RNG(rng);
  struct Case {
    Shape shape;
    std::vector<int64_t> start, limit, stride;
  };
  const Case cases[] = {{{4, 8}, {0, 1}, {4, 8}, {1, 2}},
                        {{5, 6, 7}, {1, 0, 2}, {5, 6, 7}, {2, 3, 1}},
                        {{5, 6, 7}, {4, 2, 0}, {5, 5, 7}, {1, 1, 3}},
                        {{9}, {2}, {2}, {1}},
                        {{3, 4}, {0, 0}, {3, 4}, {1, 1}}};
  for (const Case &c : cases)
    for (DType dt : {DType::F32, DType::BF16, DType::I64, DType::I1}) {
      Tensor x = randomTensor(rng, dt, c.shape, -50, 50);
      Shape os;
      for (size_t d = 0; d < c.shape.size(); ++d)
        os.push_back((c.limit[d] - c.start[d] + c.stride[d] - 1) / c.stride[d]);
      Tensor y(dt, os);
      ASSERT_TRUE(run(makeInstr("slice", {{"start", c.start},
                                          {"limit", c.limit},
                                          {"stride", c.stride}}),
                      {&x}, {&y})
                      .isOk());
      std::vector<double> ref;
      for (int64_t i = 0; i < numel(os); ++i) {
        Shape idx = unravel(i, os);
        for (size_t d = 0; d < idx.size(); ++d)
          idx[d] = c.start[d] + idx[d] * c.stride[d];
        ref.push_back(x.get(ravel(idx, c.shape)));
      }
      EXPECT_TRUE(allEqual(y, ref));
    }
  Tensor x(DType::F32, {4}), y(DType::F32, {3});
  EXPECT_FALSE(run(makeInstr("slice", {{"start", std::vector<int64_t>{2}},
                                       {"limit", std::vector<int64_t>{5}},
                                       {"stride", std::vector<int64_t>{1}}}),
                   {&x}, {&y})
                   .isOk());
}

TEST(Gather, RowsAndOutOfRangeIds) {
  KT_SEEDED_RNG(rng);
  for (DType idt : {DType::I32, DType::I64})
    for (DType dt : {DType::F32, DType::F16, DType::I32}) {
      Tensor table = randomTensor(rng, dt, {50, 3, 4}, -9, 9);
      Tensor ids = randomTensor(rng, idt, {2, 7}, 0, 49);
      Tensor y(dt, {2, 7, 3, 4});
      ASSERT_TRUE(run(makeInstr("gather"), {&table, &ids}, {&y}).isOk());
      std::vector<double> ref;
      for (int64_t i = 0; i < 14; ++i)
        for (int64_t j = 0; j < 12; ++j)
          ref.push_back(table.get(ids.getInt(i) * 12 + j));
      EXPECT_TRUE(allEqual(y, ref));
      for (int64_t bad : {int64_t(50), int64_t(-1)}) {
        ids.setInt(5, bad);
        Status s = run(makeInstr("gather"), {&table, &ids}, {&y});
        ASSERT_FALSE(s.isOk());
        EXPECT_NE(s.message().find(std::to_string(bad)), std::string::npos)
            << s.message();
        EXPECT_NE(s.message().find("gather"), std::string::npos);
      }
    }
  Tensor table(DType::F32, {5, 2}), fids(DType::F32, {3}),
      y(DType::F32, {3, 2});
  EXPECT_FALSE(run(makeInstr("gather"), {&table, &fids}, {&y}).isOk());
}

TEST(Iota, IndexAlongDim) {
  for (DType dt : {DType::I32, DType::I64, DType::F32, DType::BF16})
    for (int64_t dim = 0; dim < 3; ++dim) {
      Shape s{3, 4, 5};
      Tensor y(dt, s);
      ASSERT_TRUE(run(makeInstr("iota", {{"dim", dim}}), {}, {&y}).isOk());
      std::vector<double> ref;
      for (int64_t i = 0; i < numel(s); ++i)
        ref.push_back(double(unravel(i, s)[dim]));
      EXPECT_TRUE(allEqual(y, ref));
    }
  Tensor y(DType::I32, {3});
  EXPECT_FALSE(run(makeInstr("iota", {{"dim", int64_t(1)}}), {}, {&y}).isOk());
}

} // namespace
