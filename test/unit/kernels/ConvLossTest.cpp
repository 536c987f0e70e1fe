//===- ConvLossTest.cpp - conv2d, pooling and losses against float64 ------===//

#include "KernelTestUtil.h"
#include "runtime/cpu/DnnlConv.h"

#include <map>

using namespace kt;

namespace {

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw, groups;
  std::vector<int64_t> stride, padding, dilation;
  bool bias;
};

TEST(Conv2d, GroupsStridePaddingDilation) {
  KT_SEEDED_RNG(rng);
  const ConvCase cases[] = {
      {2, 3, 8, 8, 4, 3, 3, 1, {1, 1}, {1, 1}, {1, 1}, true},
      {1, 4, 9, 7, 6, 3, 2, 2, {2, 1}, {1, 0}, {1, 2}, true},
      {2, 6, 10, 10, 6, 3, 3, 6, {1, 2}, {2, 1}, {2, 1}, false}, // depthwise
      {1, 8, 5, 6, 4, 1, 1, 1, {1, 1}, {0, 0}, {1, 1}, true},    // 1x1 direct
      {1, 4, 5, 6, 8, 1, 1, 2, {1, 1}, {0, 0}, {1, 1}, false},   // grouped 1x1
      {1, 2, 6, 6, 3, 5, 5, 1, {3, 3}, {2, 2}, {1, 1}, true},
  };
  for (const ConvCase &c : cases)
    for (DType dt : floatTypes()) {
      int64_t cg = c.c / c.groups, og = c.o / c.groups;
      int64_t oh = (c.h + 2 * c.padding[0] - c.dilation[0] * (c.kh - 1) - 1) /
                       c.stride[0] +
                   1;
      int64_t ow = (c.w + 2 * c.padding[1] - c.dilation[1] * (c.kw - 1) - 1) /
                       c.stride[1] +
                   1;
      Tensor x = randomTensor(rng, dt, {c.n, c.c, c.h, c.w});
      Tensor w = randomTensor(rng, dt, {c.o, cg, c.kh, c.kw});
      Tensor b = randomTensor(rng, dt, {c.o});
      Tensor y(dt, {c.n, c.o, oh, ow});
      std::vector<const Tensor *> ins{&x, &w};
      if (c.bias)
        ins.push_back(&b);
      Instr in = makeInstr("conv2d", {{"stride", c.stride},
                                      {"padding", c.padding},
                                      {"dilation", c.dilation},
                                      {"groups", c.groups},
                                      {"has_bias", int64_t(c.bias)}});
      ASSERT_TRUE(run(in, ins, {&y}).isOk()) << run(in, ins, {&y}).message();
      std::vector<double> ref(static_cast<size_t>(y.size()));
      for (int64_t n = 0; n < c.n; ++n)
        for (int64_t o = 0; o < c.o; ++o)
          for (int64_t i = 0; i < oh; ++i)
            for (int64_t j = 0; j < ow; ++j) {
              double s = c.bias ? b.get(o) : 0.0;
              int64_t g = o / og;
              for (int64_t ci = 0; ci < cg; ++ci)
                for (int64_t ky = 0; ky < c.kh; ++ky)
                  for (int64_t kx = 0; kx < c.kw; ++kx) {
                    int64_t iy =
                        i * c.stride[0] - c.padding[0] + ky * c.dilation[0];
                    int64_t ix =
                        j * c.stride[1] - c.padding[1] + kx * c.dilation[1];
                    if (iy < 0 || iy >= c.h || ix < 0 || ix >= c.w)
                      continue;
                    s +=
                        x.get(((n * c.c + g * cg + ci) * c.h + iy) * c.w + ix) *
                        w.get(((o * cg + ci) * c.kh + ky) * c.kw + kx);
                  }
              ref[((n * c.o + o) * oh + i) * ow + j] = s;
            }
      double tol = tolFor(dt, 1e-5);
      EXPECT_TRUE(allClose(y, ref, tol, tol * 4))
          << dtypeName(dt) << " groups " << c.groups;
    }
  Tensor x(DType::F32, {1, 3, 4, 4}), w(DType::F32, {2, 2, 3, 3}),
      y(DType::F32, {1, 2, 2, 2});
  EXPECT_FALSE(run(makeInstr("conv2d"), {&x, &w}, {&y}).isOk()); // C != Cg*g
}

TEST(Pool2d, MaxAndAvg) {
  KT_SEEDED_RNG(rng);
  struct Case {
    std::vector<int64_t> kernel, stride, padding;
    bool includePad;
  };
  const Case cases[] = {{{2, 2}, {2, 2}, {0, 0}, true},
                        {{3, 3}, {2, 1}, {1, 1}, true},
                        {{3, 3}, {2, 1}, {1, 1}, false},
                        {{2, 3}, {1, 2}, {1, 0}, false}};
  for (const Case &c : cases)
    for (bool isMax : {true, false})
      for (DType dt : floatTypes()) {
        int64_t N = 2, C = 3, H = 9, W = 8;
        int64_t oh = (H + 2 * c.padding[0] - c.kernel[0]) / c.stride[0] + 1;
        int64_t ow = (W + 2 * c.padding[1] - c.kernel[1]) / c.stride[1] + 1;
        Tensor x = randomTensor(rng, dt, {N, C, H, W}, -3, 3);
        Tensor y(dt, {N, C, oh, ow});
        std::map<std::string, AttrValue> attrs{
            {"kernel", c.kernel}, {"stride", c.stride}, {"padding", c.padding}};
        if (!isMax)
          attrs["count_include_pad"] = int64_t(c.includePad);
        ASSERT_TRUE(run(makeInstr(isMax ? "max_pool2d" : "avg_pool2d", attrs),
                        {&x}, {&y})
                        .isOk());
        std::vector<double> ref;
        for (int64_t p = 0; p < N * C; ++p)
          for (int64_t i = 0; i < oh; ++i)
            for (int64_t j = 0; j < ow; ++j) {
              double m = -INFINITY, s = 0;
              int64_t cnt = 0;
              for (int64_t ky = 0; ky < c.kernel[0]; ++ky)
                for (int64_t kx = 0; kx < c.kernel[1]; ++kx) {
                  int64_t iy = i * c.stride[0] - c.padding[0] + ky;
                  int64_t ix = j * c.stride[1] - c.padding[1] + kx;
                  if (iy < 0 || iy >= H || ix < 0 || ix >= W) {
                    if (c.includePad)
                      ++cnt; // a padded zero
                    continue;
                  }
                  double v = x.get((p * H + iy) * W + ix);
                  m = std::max(m, v);
                  s += v;
                  ++cnt;
                }
              ref.push_back(isMax ? m : s / double(cnt));
            }
        double tol = tolFor(dt, 1e-6);
        EXPECT_TRUE(allClose(y, ref, tol, isMax ? 0 : tol))
            << (isMax ? "max" : "avg") << " " << dtypeName(dt);
      }
  // Stride defaults to the kernel.
  Tensor x = randomTensor(rng, DType::F32, {1, 1, 4, 4}),
         y(DType::F32, {1, 1, 2, 2});
  ASSERT_TRUE(
      run(makeInstr("max_pool2d", {{"kernel", std::vector<int64_t>{2, 2}}}),
          {&x}, {&y})
          .isOk());
  Tensor bad(DType::F32, {1, 1, 3, 3});
  EXPECT_FALSE(
      run(makeInstr("max_pool2d", {{"kernel", std::vector<int64_t>{2, 2}}}),
          {&x}, {&bad})
          .isOk());
}

TEST(CrossEntropy, IgnoreIndexAndBadLabels) {
  KT_SEEDED_RNG(rng);
  for (DType dt : floatTypes())
    for (DType lt : {DType::I32, DType::I64}) {
      int64_t N = 37, C = 11;
      Tensor logits = randomTensor(rng, dt, {N, C}, -4, 4);
      Tensor labels = randomTensor(rng, lt, {N}, 0, C - 1);
      labels.setInt(3, -100);
      labels.setInt(8, -100);
      Tensor loss(dt, {});
      ASSERT_TRUE(
          run(makeInstr("cross_entropy", {{"ignore_index", int64_t(-100)}}),
              {&logits, &labels}, {&loss})
              .isOk());
      double total = 0;
      int64_t count = 0;
      for (int64_t i = 0; i < N; ++i) {
        if (labels.getInt(i) == -100)
          continue;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < C; ++j)
          m = std::max(m, logits.get(i * C + j));
        for (int64_t j = 0; j < C; ++j)
          s += std::exp(logits.get(i * C + j) - m);
        total += m + std::log(s) - logits.get(i * C + labels.getInt(i));
        ++count;
      }
      EXPECT_TRUE(allClose(loss, {total / double(count)}, tolFor(dt, 1e-5)));

      // Every row ignored: 0. A custom ignore_index.
      Tensor all = labels;
      for (int64_t i = 0; i < N; ++i)
        all.setInt(i, 7);
      ASSERT_TRUE(
          run(makeInstr("cross_entropy", {{"ignore_index", int64_t(7)}}),
              {&logits, &all}, {&loss})
              .isOk());
      EXPECT_EQ(loss.get(0), 0.0);

      // Out of range and not ignored.
      for (int64_t bad : {C, int64_t(-1)}) {
        Tensor badLabels = labels;
        badLabels.setInt(5, bad);
        Status s =
            run(makeInstr("cross_entropy"), {&logits, &badLabels}, {&loss});
        ASSERT_FALSE(s.isOk());
        EXPECT_NE(s.message().find("label " + std::to_string(bad)),
                  std::string::npos)
            << s.message();
      }
    }
}

TEST(Mse, MeanSquaredError) {
  KT_SEEDED_RNG(rng);
  for (DType dt : floatTypes()) {
    Tensor a = randomTensor(rng, dt, {300, 457}),
           b = randomTensor(rng, dt, {300, 457});
    Tensor loss(dt, {});
    ASSERT_TRUE(run(makeInstr("mse"), {&a, &b}, {&loss}).isOk());
    double s = 0;
    for (int64_t i = 0; i < a.size(); ++i)
      s += (a.get(i) - b.get(i)) * (a.get(i) - b.get(i));
    EXPECT_TRUE(allClose(loss, {s / double(a.size())}, tolFor(dt, 1e-6)));
  }
  Tensor a(DType::F32, {3}), b(DType::F32, {4}), l(DType::F32, {});
  EXPECT_FALSE(run(makeInstr("mse"), {&a, &b}, {&l}).isOk());
}

} // namespace

// The oneDNN path (runtime/cpu/DnnlConv.h) of conv2d and both gradients:
// against float64 references on shapes that cut the batch into several
// chunks (with a shorter last one), groups, depthwise, strides, dilation
// and a right padding the window does not reach; the same bits with 1, 2
// and 3 threads; and near im2col + sgemm's results.
TEST(Conv2d, OneDnnMatchesReferenceAndIgnoresThreadCount) {
  if (!cpu::haveDnnl())
    GTEST_SKIP() << "built without oneDNN (libdnnl-dev): convolutions run "
                    "as im2col + sgemm only";
  KT_SEEDED_RNG(rng);
  const ConvCase cases[] = {
      {5, 8, 2, 2, 16, 3, 3, 1, {1, 1}, {1, 1}, {1, 1}, false}, // chunks 3+2
      {7, 3, 9, 9, 16, 3, 3, 1, {2, 2}, {1, 1}, {1, 1}, false},
      {3, 8, 7, 6, 8, 3, 2, 2, {2, 1}, {1, 0}, {2, 1}, false}, // groups
      {2, 16, 6, 6, 16, 3, 3, 16, {1, 1}, {1, 1}, {1, 1}, false}, // depthwise
      {4, 16, 5, 5, 32, 1, 1, 1, {1, 1}, {0, 0}, {1, 1}, false},   // 1x1
      {2, 3, 12, 12, 8, 7, 7, 1, {2, 2}, {3, 3}, {1, 1}, false},
      {2, 4, 6, 6, 8, 2, 2, 1, {2, 2}, {0, 0}, {1, 1}, false},
      {3, 4, 7, 7, 8, 2, 2, 1, {3, 3}, {0, 0}, {1, 1}, false}, // padR < 0
  };
  for (const ConvCase &c : cases) {
    const int64_t cg = c.c / c.groups, og = c.o / c.groups;
    const int64_t oh =
        (c.h + 2 * c.padding[0] - c.dilation[0] * (c.kh - 1) - 1) /
            c.stride[0] +
        1;
    const int64_t ow =
        (c.w + 2 * c.padding[1] - c.dilation[1] * (c.kw - 1) - 1) /
            c.stride[1] +
        1;
    Tensor x = randomTensor(rng, DType::F32, {c.n, c.c, c.h, c.w});
    Tensor w = randomTensor(rng, DType::F32, {c.o, cg, c.kh, c.kw});
    Tensor dy = randomTensor(rng, DType::F32, {c.n, c.o, oh, ow});
    // Float64 references: y, dx = sum over windows of dy * w, dw = sum of
    // dy * x.
    std::vector<double> y(size_t(c.n * c.o * oh * ow)),
        dx(size_t(x.size())), dw(size_t(w.size()));
    for (int64_t n = 0; n < c.n; ++n)
      for (int64_t o = 0; o < c.o; ++o)
        for (int64_t i = 0; i < oh; ++i)
          for (int64_t j = 0; j < ow; ++j) {
            const int64_t yi = ((n * c.o + o) * oh + i) * ow + j;
            const int64_t g = o / og;
            for (int64_t ci = 0; ci < cg; ++ci)
              for (int64_t ky = 0; ky < c.kh; ++ky)
                for (int64_t kx = 0; kx < c.kw; ++kx) {
                  const int64_t iy =
                      i * c.stride[0] - c.padding[0] + ky * c.dilation[0];
                  const int64_t ix =
                      j * c.stride[1] - c.padding[1] + kx * c.dilation[1];
                  if (iy < 0 || iy >= c.h || ix < 0 || ix >= c.w)
                    continue;
                  const int64_t xi =
                      ((n * c.c + g * cg + ci) * c.h + iy) * c.w + ix;
                  const int64_t wi = ((o * cg + ci) * c.kh + ky) * c.kw + kx;
                  y[size_t(yi)] += x.get(xi) * w.get(wi);
                  dx[size_t(xi)] += dy.get(yi) * w.get(wi);
                  dw[size_t(wi)] += dy.get(yi) * x.get(xi);
                }
          }
    const std::map<std::string, AttrValue> attrs{
        {"stride", c.stride},
        {"padding", c.padding},
        {"dilation", c.dilation},
        {"groups", c.groups}};
    auto runAll = [&](Tensor &ty, Tensor &tdx, Tensor &tdw) {
      ASSERT_TRUE(run(makeInstr("conv2d", attrs), {&x, &w}, {&ty}).isOk());
      ASSERT_TRUE(run(makeInstr("conv2d_grad_input", attrs), {&dy, &w},
                      {&tdx})
                      .isOk());
      ASSERT_TRUE(run(makeInstr("conv2d_grad_filter", attrs), {&x, &dy},
                      {&tdw})
                      .isOk());
    };
    std::vector<Tensor> ys, dxs, dws;
    for (int threads : {1, 2, 3}) {
      cpu::setNumThreads(threads);
      ys.emplace_back(DType::F32, Shape{c.n, c.o, oh, ow});
      dxs.emplace_back(DType::F32, x.type.shape);
      dws.emplace_back(DType::F32, w.type.shape);
      runAll(ys.back(), dxs.back(), dws.back());
    }
    cpu::setConvPath(cpu::ConvPath::Im2col);
    Tensor yi(DType::F32, {c.n, c.o, oh, ow}), dxi(DType::F32, x.type.shape),
        dwi(DType::F32, w.type.shape);
    runAll(yi, dxi, dwi);
    cpu::setConvPath(cpu::ConvPath::Auto);
    cpu::setNumThreads(2);
    const std::string what = "case n=" + std::to_string(c.n) +
                             " c=" + std::to_string(c.c) +
                             " groups=" + std::to_string(c.groups);
    EXPECT_TRUE(allClose(ys[0], y, 1e-4, 1e-4)) << what;
    EXPECT_TRUE(allClose(dxs[0], dx, 1e-4, 1e-4)) << what;
    EXPECT_TRUE(allClose(dws[0], dw, 1e-4, 1e-4)) << what;
    for (size_t t = 1; t < ys.size(); ++t) {
      EXPECT_EQ(std::memcmp(ys[t].data(), ys[0].data(), ys[0].type.byteSize()),
                0)
          << what << ": forward bits depend on the thread count";
      EXPECT_EQ(
          std::memcmp(dxs[t].data(), dxs[0].data(), dxs[0].type.byteSize()), 0)
          << what << ": input gradient bits depend on the thread count";
      EXPECT_EQ(
          std::memcmp(dws[t].data(), dws[0].data(), dws[0].type.byteSize()), 0)
          << what << ": filter gradient bits depend on the thread count";
    }
    std::vector<double> vy, vdx, vdw;
    for (int64_t i = 0; i < yi.size(); ++i)
      vy.push_back(yi.get(i));
    for (int64_t i = 0; i < dxi.size(); ++i)
      vdx.push_back(dxi.get(i));
    for (int64_t i = 0; i < dwi.size(); ++i)
      vdw.push_back(dwi.get(i));
    EXPECT_TRUE(allClose(ys[0], vy, 1e-4, 1e-4)) << what << " vs im2col";
    EXPECT_TRUE(allClose(dxs[0], vdx, 1e-4, 1e-4)) << what << " vs im2col";
    EXPECT_TRUE(allClose(dws[0], vdw, 1e-4, 1e-4)) << what << " vs im2col";
  }
}

// The path in use is oneDNN's where built with it, and DLOPT_CONV's
// im2col (or setConvPath) turns it off.
TEST(Conv2d, OneDnnIsUsedUnlessTurnedOff) {
  if (!cpu::haveDnnl())
    GTEST_SKIP() << "built without oneDNN (libdnnl-dev)";
  ConvGeom g;
  g.cg = 4, g.h = 6, g.w = 6, g.kh = 3, g.kw = 3, g.oh = 6, g.ow = 6;
  g.stride = {1, 1}, g.padding = {1, 1}, g.dilation = {1, 1};
  std::vector<float> x(2 * 4 * 36, 1.0f), w(8 * 4 * 9, 0.5f),
      y(2 * 8 * 36, -1.0f);
  EXPECT_TRUE(cpu::dnnlConvForward(g, 2, 4, 8, x.data(), w.data(), y.data()));
  EXPECT_EQ(y[7], 4 * 9 * 0.5f); // an interior pixel: 36 taps of 0.5
  EXPECT_NE(std::string(cpu::convImplementationName()).find("oneDNN"),
            std::string::npos);
  cpu::setConvPath(cpu::ConvPath::Im2col);
  EXPECT_FALSE(cpu::dnnlConvForward(g, 2, 4, 8, x.data(), w.data(), y.data()));
  EXPECT_STREQ(cpu::convImplementationName(), "im2col + sgemm");
  cpu::setConvPath(cpu::ConvPath::Auto);
}
