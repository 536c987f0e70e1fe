//===- ElementwiseTest.cpp - unary, cast, binary, compare, select ---------===//

#include "KernelTestUtil.h"

#include <functional>
#include <limits>

using namespace kt;

namespace {

struct UnaryCase {
  std::string op;
  std::function<double(double)> ref;
  double lo, hi;
  bool intOk;
  std::map<std::string, AttrValue> attrs = {};
};

std::vector<UnaryCase> unaryCases() {
  const double pi = 3.14159265358979323846;
  return {
      {"neg", [](double x) { return -x; }, -5, 5, true},
      {"abs", [](double x) { return std::fabs(x); }, -5, 5, true},
      {"relu", [](double x) { return x > 0 ? x : 0; }, -5, 5, true},
      {"exp", [](double x) { return std::exp(x); }, -4, 4, false},
      {"log", [](double x) { return std::log(x); }, 0.01, 10, false},
      {"sqrt", [](double x) { return std::sqrt(x); }, 0, 10, false},
      {"rsqrt", [](double x) { return 1 / std::sqrt(x); }, 0.01, 10, false},
      {"tanh", [](double x) { return std::tanh(x); }, -4, 4, false},
      {"sin", [](double x) { return std::sin(x); }, -4, 4, false},
      {"cos", [](double x) { return std::cos(x); }, -4, 4, false},
      {"sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }, -8, 8,
       false},
      {"silu", [](double x) { return x / (1 + std::exp(-x)); }, -8, 8, false},
      {"gelu",
       [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); },
       -5, 5, false},
      {"gelu",
       [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); },
       -5,
       5,
       false,
       {{"approximate", std::string("none")}}},
      {"gelu",
       [pi](double x) {
         return 0.5 * x *
                (1 + std::tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x)));
       },
       -5,
       5,
       false,
       {{"approximate", std::string("tanh")}}},
  };
}

TEST(Unary, FloatMatchesReference) {
  KT_SEEDED_RNG(rng);
  for (const UnaryCase &c : unaryCases()) {
    for (DType dt : floatTypes()) {
      SCOPED_TRACE(c.op + " " + dtypeName(dt));
      // Odd size so chunk edges and tails are exercised; large enough to
      // run multi-threaded.
      Tensor x = randomTensor(rng, dt, {3, 40001}, c.lo, c.hi);
      Tensor y(dt, x.type.shape);
      ASSERT_TRUE(run(makeInstr(c.op, c.attrs), {&x}, {&y}).isOk());
      std::vector<double> ref;
      for (double v : x.values())
        ref.push_back(c.ref(v));
      // Functions like sin/cos/silu cross zero: allow an absolute error on
      // the scale of the inputs' rounding.
      EXPECT_TRUE(allClose(y, ref, tolFor(dt, 4e-6), tolFor(dt, 4e-6) * 1e-1));
    }
  }
}

TEST(Unary, IntNegAbsRelu) {
  KT_SEEDED_RNG(rng);
  for (DType dt : {DType::I32, DType::I64})
    for (const UnaryCase &c : unaryCases()) {
      if (!c.intOk)
        continue;
      Tensor x = randomTensor(rng, dt, {1000}, -1000000, 1000000);
      Tensor y(dt, {1000});
      ASSERT_TRUE(run(makeInstr(c.op), {&x}, {&y}).isOk());
      std::vector<double> ref;
      for (double v : x.values())
        ref.push_back(c.ref(v));
      EXPECT_TRUE(allEqual(y, ref)) << c.op;
    }
  // Integer neg/abs wrap at the minimum instead of trapping.
  Tensor x(DType::I32, {1}), y(DType::I32, {1});
  x.set(0, std::numeric_limits<int32_t>::min());
  ASSERT_TRUE(run(makeInstr("abs"), {&x}, {&y}).isOk());
  EXPECT_EQ(y.get(0), double(std::numeric_limits<int32_t>::min()));
}

TEST(Unary, RejectsBadTypes) {
  Tensor xi(DType::I32, {4}), yi(DType::I32, {4});
  Status s = run(makeInstr("exp"), {&xi}, {&yi});
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("exp"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("test.mlir:1:1"), std::string::npos);
  Tensor x(DType::F32, {4}), y(DType::F32, {5});
  EXPECT_FALSE(run(makeInstr("neg"), {&x}, {&y}).isOk());
  Tensor y16(DType::F16, {4});
  EXPECT_FALSE(run(makeInstr("neg"), {&x}, {&y16}).isOk());
  EXPECT_FALSE(
      run(makeInstr("gelu", {{"approximate", std::string("x")}}), {&x}, {&y})
          .isOk());
}

//===----------------------------------------------------------------------===//
// Cast
//===----------------------------------------------------------------------===//

/// Reference of cast for one value, from docs/ops.md.
double castRef(double v, DType from, DType to) {
  if (from == DType::I1)
    v = v != 0;
  switch (to) {
  case DType::I1:
    return v != 0;
  case DType::F32:
    return double(float(v));
  case DType::F16:
    return halfToFloat(floatToHalf(float(v)));
  case DType::BF16:
    return bf16ToFloat(floatToBf16(float(v)));
  case DType::I32:
  case DType::I64: {
    if (isInteger(from) || from == DType::I1)
      return to == DType::I32 ? double(int32_t(int64_t(v))) : v;
    double lo = to == DType::I32 ? -2147483648.0 : -9223372036854775808.0;
    double hi = -lo;
    if (std::isnan(v))
      return 0;
    if (v >= hi)
      return to == DType::I32 ? 2147483647.0 : 9223372036854775807.0;
    if (v <= lo)
      return lo;
    return std::trunc(v);
  }
  }
  return 0;
}

TEST(Cast, AllPairs) {
  KT_SEEDED_RNG(rng);
  const DType all[] = {DType::F32, DType::F16, DType::BF16,
                       DType::I32, DType::I64, DType::I1};
  for (DType from : all)
    for (DType to : all) {
      SCOPED_TRACE(std::string(dtypeName(from)) + " -> " + dtypeName(to));
      Tensor x = randomTensor(rng, from, {257}, -300, 300);
      if (isFloat(from)) {
        // Special values: NaN, +-Inf, saturation, -0.5 (truncates to 0).
        x.set(0, NAN);
        x.set(1, INFINITY);
        x.set(2, -INFINITY);
        x.set(3, 1e30);
        x.set(4, -0.5);
        x.set(5, 0.0);
        x.set(6, 2.75);
        x.set(7, -2.75);
      }
      if (from == DType::I64)
        x.setInt(0, (int64_t(1) << 40) + 3); // wraps when narrowed to i32
      Tensor y(to, {257});
      ASSERT_TRUE(run(makeInstr("cast"), {&x}, {&y}).isOk());
      for (int64_t i = 0; i < x.size(); ++i) {
        double ref = castRef(x.get(i), from, to);
        if (from == DType::I64 && to == DType::I32 && i == 0)
          ref = 3;
        double got = y.get(i);
        if (std::isnan(ref)) {
          ASSERT_TRUE(std::isnan(got)) << i;
        } else if (to == DType::I64 && from != DType::I64 && !isFloat(to)) {
          ASSERT_EQ(y.getInt(i), isFloat(from) && x.get(i) >= 9.3e18
                                     ? std::numeric_limits<int64_t>::max()
                                     : int64_t(ref))
              << i << " from " << x.get(i);
        } else {
          ASSERT_EQ(got, ref) << i << " from " << x.get(i);
        }
      }
    }
}

//===----------------------------------------------------------------------===//
// Binary
//===----------------------------------------------------------------------===//

struct BinaryCase {
  std::string op;
  std::function<double(double, double)> ref;
  bool intOk;
};

std::vector<BinaryCase> binaryCases() {
  return {
      {"add", [](double a, double b) { return a + b; }, true},
      {"sub", [](double a, double b) { return a - b; }, true},
      {"mul", [](double a, double b) { return a * b; }, true},
      {"div", [](double a, double b) { return a / b; }, true},
      {"maximum", [](double a, double b) { return std::max(a, b); }, true},
      {"minimum", [](double a, double b) { return std::min(a, b); }, true},
      {"pow", [](double a, double b) { return std::pow(a, b); }, false},
  };
}

/// Shape pairs covering NumPy broadcasting: equal, scalar, trailing, middle
/// and both-sided broadcast, rank-0 operands.
std::vector<std::pair<Shape, Shape>> broadcastPairs() {
  return {{{4, 8}, {4, 8}},
          {{4, 8}, {8}},
          {{8}, {4, 8}},
          {{3, 1, 5}, {1, 4, 1}},
          {{2, 3, 4, 5}, {3, 1, 5}},
          {{6, 1}, {1, 7}},
          {{}, {3, 4}},
          {{3, 4}, {}},
          {{}, {}},
          {{2, 1, 3}, {2, 5, 3}},
          {{300, 257}, {300, 257}},
          {{300, 257}, {1, 257}},
          {{300, 257}, {300, 1}}};
}

TEST(Binary, FloatBroadcastMatchesReference) {
  KT_SEEDED_RNG(rng);
  for (const BinaryCase &c : binaryCases())
    for (DType dt : floatTypes())
      for (auto [sa, sb] : broadcastPairs()) {
        Shape so;
        size_t r = std::max(sa.size(), sb.size());
        for (size_t i = 0; i < r; ++i) {
          int64_t da = i < r - sa.size() ? 1 : sa[i - (r - sa.size())];
          int64_t db = i < r - sb.size() ? 1 : sb[i - (r - sb.size())];
          so.push_back(std::max(da, db));
        }
        bool positive = c.op == "pow" || c.op == "div";
        Tensor a = randomTensor(rng, dt, sa, positive ? 0.5 : -3, 3);
        Tensor b = randomTensor(rng, dt, sb, positive ? 0.5 : -3, 3);
        if (c.op == "pow")
          b = randomTensor(rng, dt, sb, -2, 2);
        Tensor out(dt, so);
        ASSERT_TRUE(run(makeInstr(c.op), {&a, &b}, {&out}).isOk());
        std::vector<double> ref(static_cast<size_t>(numel(so)));
        for (int64_t i = 0; i < numel(so); ++i) {
          Shape idx = unravel(i, so);
          ref[i] = c.ref(a.get(broadcastIndex(idx, sa)),
                         b.get(broadcastIndex(idx, sb)));
        }
        // add/sub may cancel: absolute slack relative to the inputs.
        EXPECT_TRUE(allClose(out, ref, tolFor(dt, 2e-6), tolFor(dt, 2e-6) * 3))
            << c.op << " " << dtypeName(dt) << " " << a.type.str() << ", "
            << b.type.str();
      }
}

TEST(Binary, IntMatchesReference) {
  KT_SEEDED_RNG(rng);
  for (const BinaryCase &c : binaryCases()) {
    if (!c.intOk)
      continue;
    for (DType dt : {DType::I32, DType::I64}) {
      Tensor a = randomTensor(rng, dt, {5, 7}, -1000, 1000);
      Tensor b = randomTensor(rng, dt, {7}, 1, 50);
      b.set(3, -7); // negative divisor: truncation toward zero
      Tensor out(dt, {5, 7});
      ASSERT_TRUE(run(makeInstr(c.op), {&a, &b}, {&out}).isOk());
      std::vector<double> ref;
      for (int64_t i = 0; i < 35; ++i) {
        double x = a.get(i), y = b.get(i % 7);
        ref.push_back(c.op == "div" ? std::trunc(x / y) : c.ref(x, y));
      }
      EXPECT_TRUE(allEqual(out, ref)) << c.op << " " << dtypeName(dt);
    }
  }
  // Wrapping add.
  Tensor a(DType::I32, {1}), b(DType::I32, {1}), o(DType::I32, {1});
  a.set(0, 2147483647);
  b.set(0, 1);
  ASSERT_TRUE(run(makeInstr("add"), {&a, &b}, {&o}).isOk());
  EXPECT_EQ(o.get(0), -2147483648.0);
}

TEST(Binary, IntDivisionByZeroIsError) {
  Tensor a(DType::I32, {2, 3}), b(DType::I32, {3}), o(DType::I32, {2, 3});
  for (int i = 0; i < 6; ++i)
    a.set(i, i + 1);
  b.set(0, 1);
  b.set(1, 0);
  b.set(2, 2);
  Status s = run(makeInstr("div"), {&a, &b}, {&o});
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("division by zero"), std::string::npos)
      << s.message();
  Tensor b64(DType::I64, {3}), a64(DType::I64, {3}), o64(DType::I64, {3});
  EXPECT_FALSE(run(makeInstr("div"), {&a64, &b64}, {&o64}).isOk());
}

TEST(Binary, NaNPropagatesThroughMaxMin) {
  Tensor a(DType::F32, {3}), b(DType::F32, {3}), o(DType::F32, {3});
  a.set(0, NAN);
  a.set(1, 1);
  a.set(2, 2);
  b.set(0, 1);
  b.set(1, NAN);
  b.set(2, 3);
  for (const char *op : {"maximum", "minimum"}) {
    ASSERT_TRUE(run(makeInstr(op), {&a, &b}, {&o}).isOk());
    EXPECT_TRUE(std::isnan(o.get(0)) && std::isnan(o.get(1))) << op;
    EXPECT_EQ(o.get(2), std::string(op) == "maximum" ? 3 : 2);
  }
}

TEST(Binary, RejectsMismatches) {
  Tensor a(DType::F32, {4, 3}), b(DType::F32, {4}), o(DType::F32, {4, 3});
  EXPECT_FALSE(run(makeInstr("add"), {&a, &b}, {&o}).isOk()); // no broadcast
  Tensor b2(DType::F16, {3});
  EXPECT_FALSE(run(makeInstr("add"), {&a, &b2}, {&o}).isOk()); // dtype
  Tensor b3(DType::F32, {3}), o2(DType::F32, {2, 4, 3});
  EXPECT_FALSE(run(makeInstr("add"), {&a, &b3}, {&o2}).isOk()); // result
  Status s = run(makeInstr("add"), {&a}, {&o});
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("expects 2 operand(s), got 1"), std::string::npos)
      << s.message();
  Tensor ai(DType::I32, {3}), bi(DType::I32, {3}), oi(DType::I32, {3});
  EXPECT_FALSE(run(makeInstr("pow"), {&ai, &bi}, {&oi}).isOk());
}

//===----------------------------------------------------------------------===//
// Compare and select
//===----------------------------------------------------------------------===//

TEST(Compare, AllPredicates) {
  KT_SEEDED_RNG(rng);
  const std::pair<const char *, std::function<bool(double, double)>> preds[] = {
      {"eq", [](double a, double b) { return a == b; }},
      {"ne", [](double a, double b) { return a != b; }},
      {"lt", [](double a, double b) { return a < b; }},
      {"le", [](double a, double b) { return a <= b; }},
      {"gt", [](double a, double b) { return a > b; }},
      {"ge", [](double a, double b) { return a >= b; }}};
  for (auto &[name, fn] : preds)
    for (DType dt :
         {DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64}) {
      // Small integer-valued range so equality happens often.
      Tensor a = randomTensor(rng, dt, {6, 5}, -3, 3);
      Tensor b = randomTensor(rng, dt, {5}, -3, 3);
      if (isFloat(dt)) {
        a.set(0, NAN);
        for (int64_t i = 0; i < a.size(); ++i)
          if (i)
            a.set(i, std::round(a.get(i)));
        for (int64_t i = 0; i < b.size(); ++i)
          b.set(i, std::round(b.get(i)));
      }
      Tensor c(DType::I1, {6, 5});
      ASSERT_TRUE(run(makeInstr("compare", {{"predicate", std::string(name)}}),
                      {&a, &b}, {&c})
                      .isOk());
      std::vector<double> ref;
      for (int64_t i = 0; i < 30; ++i)
        ref.push_back(fn(a.get(i), b.get(i % 5)));
      EXPECT_TRUE(allEqual(c, ref)) << name << " " << dtypeName(dt);
    }
  Tensor a(DType::F32, {2}), c(DType::I1, {2});
  EXPECT_FALSE(run(makeInstr("compare", {{"predicate", std::string("xx")}}),
                   {&a, &a}, {&c})
                   .isOk());
  Tensor cf(DType::F32, {2});
  EXPECT_FALSE(run(makeInstr("compare", {{"predicate", std::string("eq")}}),
                   {&a, &a}, {&cf})
                   .isOk());
}

TEST(Select, BroadcastsAllThree) {
  KT_SEEDED_RNG(rng);
  for (DType dt : {DType::F32, DType::BF16, DType::I64, DType::I1}) {
    Tensor c = randomTensor(rng, DType::I1, {4, 1, 6});
    Tensor a = randomTensor(rng, dt, {5, 1}, -9, 9);
    Tensor b = randomTensor(rng, dt, {}, -9, 9);
    Tensor o(dt, {4, 5, 6});
    ASSERT_TRUE(run(makeInstr("select"), {&c, &a, &b}, {&o}).isOk());
    Shape so{4, 5, 6};
    std::vector<double> ref;
    for (int64_t i = 0; i < numel(so); ++i) {
      Shape idx = unravel(i, so);
      ref.push_back(c.get(broadcastIndex(idx, {4, 1, 6}))
                        ? a.get(broadcastIndex(idx, {5, 1}))
                        : b.get(0));
    }
    EXPECT_TRUE(allEqual(o, ref)) << dtypeName(dt);
  }
  Tensor cf(DType::F32, {2}), a(DType::F32, {2}), o(DType::F32, {2});
  EXPECT_FALSE(run(makeInstr("select"), {&cf, &a, &a}, {&o}).isOk());
}

} // namespace
