//===- GradTest.cpp - gradient ops against float64 references -------------===//
//
// Each gradient kernel is checked against central finite differences of a
// float64 reference of its FORWARD op (written here from docs/ops.md): with
// L(x) = sum(forward(x) * R) for a random R, the kernel run with dy = R must
// return dL/dx. Inputs are rounded to the tested dtype first, and the
// references use the rounded values, so only the kernel's own arithmetic and
// its final rounding are measured. Ops whose contract is a formula of the
// forward output (softmax_grad, ...) or a selection rule (max_pool2d_grad)
// are also checked against that formula in double.
//
//===----------------------------------------------------------------------===//

#include "KernelTestUtil.h"

#include <cmath>
#include <functional>

using namespace kt;

namespace {

using Vec = std::vector<double>;

/// dF/dx by central differences (F is evaluated in double).
Vec fdGrad(const std::function<double(const Vec &)> &f, Vec x,
           double h = 1e-5) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double x0 = x[i];
    x[i] = x0 + h;
    double fp = f(x);
    x[i] = x0 - h;
    double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

double dot(const Vec &a, const Vec &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    s += a[i] * b[i];
  return s;
}

Tensor fromVec(DType dt, Shape shape, const Vec &v) {
  Tensor t(dt, std::move(shape));
  for (int64_t i = 0; i < t.size(); ++i)
    t.set(i, v[size_t(i)]);
  return t;
}

/// Kernel result vs. reference: relative tolerance for the dtype, plus an
/// absolute part scaled by the largest reference value (gradients come from
/// sums with cancellation).
::testing::AssertionResult gradClose(const Tensor &got, const Vec &ref,
                                     double f32Tol = 2e-5) {
  double tol = tolFor(got.type.dtype, f32Tol);
  return allClose(got, ref, tol, tol * std::max(maxAbs(ref), 1e-6));
}

std::string errOf(const Instr &in, const std::vector<const Tensor *> &ins,
                  const std::vector<Tensor *> &outs) {
  Status s = run(in, ins, outs);
  return s.isOk() ? "" : s.message();
}

/// Runs and expects an error whose message names the op.
void expectError(const Instr &in, const std::vector<const Tensor *> &ins,
                 const std::vector<Tensor *> &outs,
                 const std::string &needle = "") {
  std::string msg = errOf(in, ins, outs);
  ASSERT_FALSE(msg.empty()) << in.op << ": expected an error";
  EXPECT_EQ(msg.rfind("op '" + in.op + "' at test.mlir:1:1: ", 0), 0u) << msg;
  if (!needle.empty())
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
}

//===----------------------------------------------------------------------===//
// float64 forward references
//===----------------------------------------------------------------------===//

Vec softmaxFwd(const Vec &x, const Shape &shape, int64_t dim, bool log) {
  int64_t n = shape[dim], inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d)
    inner *= shape[d];
  Vec y(x.size());
  for (size_t line = 0; line < x.size() / n; ++line) {
    int64_t base = (int64_t(line) / inner) * n * inner + int64_t(line) % inner;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; ++j)
      m = std::max(m, x[base + j * inner]);
    for (int64_t j = 0; j < n; ++j)
      s += std::exp(x[base + j * inner] - m);
    for (int64_t j = 0; j < n; ++j) {
      double v = x[base + j * inner];
      y[base + j * inner] = log ? v - m - std::log(s) : std::exp(v - m) / s;
    }
  }
  return y;
}

/// layer_norm (rms = false, with bias) or rms_norm over the last n elements
/// of each row.
Vec normFwd(const Vec &x, const Vec &w, const Vec &b, int64_t n, double eps,
            bool rms) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / n; ++r) {
    const double *v = x.data() + r * n;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < n; ++j)
      mean += v[j];
    mean /= double(n);
    for (int64_t j = 0; j < n; ++j)
      var += rms ? v[j] * v[j] : (v[j] - mean) * (v[j] - mean);
    var /= double(n);
    for (int64_t j = 0; j < n; ++j)
      y[r * n + j] = (rms ? v[j] : v[j] - mean) / std::sqrt(var + eps) * w[j] +
                     (rms ? 0.0 : b[j]);
  }
  return y;
}

struct AttnShape {
  int64_t B, H, G, S, T, D, E;
};

Vec attentionFwd(const AttnShape &c, const Vec &q, const Vec &k, const Vec &v,
                 bool causal, double scale) {
  Vec out(size_t(c.B * c.H * c.S * c.E), 0.0);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      int64_t g = h / (c.H / c.G);
      for (int64_t i = 0; i < c.S; ++i) {
        Vec sc(static_cast<size_t>(c.T));
        double m = -INFINITY;
        for (int64_t j = 0; j < c.T; ++j) {
          double s = 0;
          for (int64_t d = 0; d < c.D; ++d)
            s += q[((b * c.H + h) * c.S + i) * c.D + d] *
                 k[((b * c.G + g) * c.T + j) * c.D + d];
          sc[j] = causal && j > i + (c.T - c.S) ? -INFINITY : s * scale;
          m = std::max(m, sc[j]);
        }
        if (m == -INFINITY)
          continue; // no visible key: zeros
        double z = 0;
        for (int64_t j = 0; j < c.T; ++j)
          z += std::exp(sc[j] - m);
        for (int64_t e = 0; e < c.E; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < c.T; ++j)
            acc += std::exp(sc[j] - m) / z *
                   v[((b * c.G + g) * c.T + j) * c.E + e];
          out[((b * c.H + h) * c.S + i) * c.E + e] = acc;
        }
      }
    }
  return out;
}

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw, groups;
  std::vector<int64_t> stride, padding, dilation;
  int64_t oh() const {
    return (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) / stride[0] + 1;
  }
  int64_t ow() const {
    return (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) / stride[1] + 1;
  }
  Shape xShape() const { return {n, c, h, w}; }
  Shape wShape() const { return {o, c / groups, kh, kw}; }
  Shape yShape() const { return {n, o, oh(), ow()}; }
};

Vec conv2dFwd(const ConvCase &c, const Vec &x, const Vec &w) {
  int64_t cg = c.c / c.groups, og = c.o / c.groups, oh = c.oh(), ow = c.ow();
  Vec y(size_t(c.n * c.o * oh * ow), 0.0);
  for (int64_t n = 0; n < c.n; ++n)
    for (int64_t o = 0; o < c.o; ++o)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double s = 0;
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
                s += x[((n * c.c + g * cg + ci) * c.h + iy) * c.w + ix] *
                     w[((o * cg + ci) * c.kh + ky) * c.kw + kx];
              }
          y[((n * c.o + o) * oh + i) * ow + j] = s;
        }
  return y;
}

std::map<std::string, AttrValue> convAttrs(const ConvCase &c) {
  return {{"stride", c.stride},
          {"padding", c.padding},
          {"dilation", c.dilation},
          {"groups", c.groups}};
}

//===----------------------------------------------------------------------===//
// Tests
//===----------------------------------------------------------------------===//

TEST(ScatterAdd, SumsRowsInIdOrder) {
  KT_SEEDED_RNG(rng);
  for (DType dt : floatTypes())
    for (DType it : {DType::I32, DType::I64}) {
      // ids [3, 7] into a [11, 2, 5] table: many duplicates.
      int64_t V = 11;
      Tensor ids = randomTensor(rng, it, {3, 7}, 0, V - 1);
      ids.setInt(0, 4);
      ids.setInt(1, 4);
      Tensor upd = randomTensor(rng, dt, {3, 7, 2, 5}, -2, 2);
      Tensor out(dt, {V, 2, 5});
      for (int64_t i = 0; i < out.size(); ++i)
        out.set(i, 123.0); // must be overwritten
      ASSERT_EQ(errOf(makeInstr("scatter_add"), {&ids, &upd}, {&out}), "");
      // scatter_add is gather's gradient: FD of sum(gather(table) * upd).
      Vec u = upd.values();
      auto loss = [&](const Vec &table) {
        double s = 0;
        for (int64_t i = 0; i < ids.size(); ++i)
          for (int64_t j = 0; j < 10; ++j)
            s += table[ids.getInt(i) * 10 + j] * u[i * 10 + j];
        return s;
      };
      Vec ref = fdGrad(loss, Vec(size_t(V * 10), 0.5));
      EXPECT_TRUE(gradClose(out, ref, 1e-6)) << dtypeName(dt);
    }
  // Wide rows (several feature blocks) and a rank-1 table.
  Tensor ids = randomTensor(rng, DType::I32, {300}, 0, 4);
  Tensor upd = randomTensor(rng, DType::F32, {300, 600});
  Tensor out(DType::F32, {5, 600});
  ASSERT_EQ(errOf(makeInstr("scatter_add"), {&ids, &upd}, {&out}), "");
  Vec ref(static_cast<size_t>(out.size()), 0.0);
  for (int64_t i = 0; i < 300; ++i)
    for (int64_t j = 0; j < 600; ++j)
      ref[ids.getInt(i) * 600 + j] += upd.get(i * 600 + j);
  EXPECT_TRUE(allClose(out, ref, 1e-5, 1e-4));
  Tensor upd1 = randomTensor(rng, DType::BF16, {300});
  Tensor out1(DType::BF16, {5});
  ASSERT_EQ(errOf(makeInstr("scatter_add"), {&ids, &upd1}, {&out1}), "");
  Vec ref1(5, 0.0);
  for (int64_t i = 0; i < 300; ++i)
    ref1[ids.getInt(i)] += upd1.get(i);
  EXPECT_TRUE(allClose(out1, ref1, tolFor(DType::BF16, 1e-5), 1e-2));
  // Errors: id out of range, mismatched updates, float ids.
  for (int64_t bad : {int64_t(-1), int64_t(5)}) {
    Tensor badIds = ids;
    badIds.setInt(17, bad);
    std::string msg = errOf(makeInstr("scatter_add"), {&badIds, &upd}, {&out});
    EXPECT_NE(msg.find("id " + std::to_string(bad) + " at position 17"),
              std::string::npos)
        << msg;
  }
  Tensor updBad(DType::F32, {300, 599});
  expectError(makeInstr("scatter_add"), {&ids, &updBad}, {&out});
  Tensor fids(DType::F32, {300});
  expectError(makeInstr("scatter_add"), {&fids, &upd}, {&out});
}

TEST(SoftmaxGrad, FormulaAndFiniteDifferences) {
  KT_SEEDED_RNG(rng);
  for (bool log : {false, true})
    for (DType dt : floatTypes())
      for (auto [shape, dim] :
           std::vector<std::pair<Shape, int64_t>>{{{4, 9}, 1},
                                                  {{4, 9}, 0},
                                                  {{3, 5, 7}, 1},
                                                  {{2, 3, 70}, 2},
                                                  {{2, 100, 3}, 1}}) {
        Tensor x = randomTensor(rng, dt, shape, -3, 3);
        Tensor y = fromVec(dt, shape, softmaxFwd(x.values(), shape, dim, log));
        Tensor dy = randomTensor(rng, dt, shape, -1, 1);
        Tensor dx(dt, shape);
        const char *op = log ? "log_softmax_grad" : "softmax_grad";
        ASSERT_EQ(errOf(makeInstr(op, {{"dim", dim}}), {&y, &dy}, {&dx}), "");
        // The contract's formula in double, on the stored y.
        int64_t n = shape[dim], inner = 1;
        for (size_t d = dim + 1; d < shape.size(); ++d)
          inner *= shape[d];
        Vec ref(static_cast<size_t>(x.size()));
        for (int64_t i = 0; i < x.size(); ++i) {
          int64_t base = (i / (n * inner)) * n * inner + i % inner;
          double s = 0;
          for (int64_t j = 0; j < n; ++j)
            s += log ? dy.get(base + j * inner)
                     : dy.get(base + j * inner) * y.get(base + j * inner);
          ref[i] = log ? dy.get(i) - std::exp(y.get(i)) * s
                       : y.get(i) * (dy.get(i) - s);
        }
        EXPECT_TRUE(gradClose(dx, ref, 1e-5))
            << op << " " << x.type.str() << " dim " << dim;
        // f32: the gradient of the forward op itself.
        if (dt == DType::F32) {
          Vec r = dy.values();
          Vec fd = fdGrad(
              [&](const Vec &xv) {
                return dot(softmaxFwd(xv, shape, dim, log), r);
              },
              x.values());
          EXPECT_TRUE(gradClose(dx, fd, 2e-5)) << op << " FD";
        }
      }
  Tensor y(DType::F32, {2, 3}), dy(DType::F32, {2, 4}), dx(DType::F32, {2, 3});
  expectError(makeInstr("softmax_grad", {{"dim", int64_t(1)}}), {&y, &dy},
              {&dx});
  expectError(makeInstr("log_softmax_grad", {{"dim", int64_t(2)}}), {&y, &y},
              {&dx});
}

TEST(NormGrad, LayerNormAndRmsNormByFiniteDifferences) {
  KT_SEEDED_RNG(rng);
  for (bool rms : {false, true})
    for (DType dt : floatTypes())
      for (int64_t axis : {2, 1})
        for (bool hw : {false, true}) {
          Shape s{3, 4, 10};
          Shape ns(s.begin() + axis, s.end());
          int64_t n = numel(ns);
          double eps = rms ? 1e-6 : 1e-5;
          Tensor x = randomTensor(rng, dt, s, -2, 3);
          Tensor dy = randomTensor(rng, dt, s, -1, 1);
          Tensor w = randomTensor(rng, dt, ns, 0.5, 1.5);
          Tensor dx(dt, s), dw(dt, ns), db(dt, ns);
          std::vector<const Tensor *> ins{&x, &dy};
          if (hw)
            ins.push_back(&w);
          std::vector<Tensor *> outs{&dx, &dw};
          if (!rms)
            outs.push_back(&db);
          Instr in = makeInstr(
              rms ? "rms_norm_grad" : "layer_norm_grad",
              {{"axis", axis}, {"eps", eps}, {"has_weight", int64_t(hw)}});
          ASSERT_EQ(errOf(in, ins, outs), "");
          Vec xv = x.values(), r = dy.values(), b0(size_t(n), 0.0);
          Vec wv = hw ? w.values() : Vec(size_t(n), 1.0);
          Vec gx = fdGrad(
              [&](const Vec &v) {
                return dot(normFwd(v, wv, b0, n, eps, rms), r);
              },
              xv);
          Vec gw = fdGrad(
              [&](const Vec &v) {
                return dot(normFwd(xv, v, b0, n, eps, rms), r);
              },
              wv);
          Vec gb = fdGrad(
              [&](const Vec &v) {
                return dot(normFwd(xv, wv, v, n, eps, rms), r);
              },
              b0);
          std::string what = std::string(rms ? "rms" : "layer") + " " +
                             dtypeName(dt) + " axis " + std::to_string(axis) +
                             " w " + std::to_string(hw);
          EXPECT_TRUE(gradClose(dx, gx, 5e-5)) << what;
          EXPECT_TRUE(gradClose(dw, gw, 2e-5)) << what;
          if (!rms)
            EXPECT_TRUE(gradClose(db, gb, 1e-5)) << what;
        }
  // Many rows: the parameter gradients are summed over several row chunks.
  {
    Shape s{700, 48};
    Tensor x = randomTensor(rng, DType::F32, s, -2, 2);
    Tensor dy = randomTensor(rng, DType::F32, s);
    Tensor w = randomTensor(rng, DType::F32, {48}, 0.5, 1.5);
    Tensor dx(DType::F32, s), dw(DType::F32, {48}), db(DType::F32, {48});
    ASSERT_EQ(errOf(makeInstr("layer_norm_grad", {{"axis", int64_t(1)},
                                                  {"eps", 1e-5},
                                                  {"has_weight", int64_t(1)}}),
                    {&x, &dy, &w}, {&dx, &dw, &db}),
              "");
    Vec refW(48, 0.0), refB(48, 0.0);
    for (int64_t r = 0; r < 700; ++r) {
      double mean = 0, var = 0;
      for (int64_t j = 0; j < 48; ++j)
        mean += x.get(r * 48 + j) / 48.0;
      for (int64_t j = 0; j < 48; ++j)
        var += (x.get(r * 48 + j) - mean) * (x.get(r * 48 + j) - mean) / 48.0;
      for (int64_t j = 0; j < 48; ++j) {
        double xh = (x.get(r * 48 + j) - mean) / std::sqrt(var + 1e-5);
        refW[j] += dy.get(r * 48 + j) * xh;
        refB[j] += dy.get(r * 48 + j);
      }
    }
    EXPECT_TRUE(gradClose(dw, refW, 1e-5));
    EXPECT_TRUE(gradClose(db, refB, 1e-5));
  }
  // Errors: wrong result count, weight shape, flag/operand mismatch.
  Tensor x(DType::F32, {2, 8}), w(DType::F32, {8}), w7(DType::F32, {7});
  Tensor dx(DType::F32, {2, 8}), dw(DType::F32, {8}), db(DType::F32, {8});
  expectError(makeInstr("layer_norm_grad"), {&x, &x, &w}, {&dx, &dw});
  expectError(makeInstr("rms_norm_grad"), {&x, &x, &w7}, {&dx, &dw});
  expectError(makeInstr("rms_norm_grad", {{"has_weight", int64_t(1)}}),
              {&x, &x}, {&dx, &dw});
  Tensor dy9(DType::F32, {2, 9});
  expectError(makeInstr("layer_norm_grad"), {&x, &dy9}, {&dx, &dw, &db});
}

TEST(AttentionGrad, CausalGqaByFiniteDifferences) {
  KT_SEEDED_RNG(rng);
  struct Case {
    AttnShape s;
    bool causal;
  };
  const Case cases[] = {{{1, 2, 2, 5, 5, 4, 4}, true},
                        {{2, 2, 2, 4, 6, 3, 5}, false},
                        {{1, 6, 2, 4, 7, 4, 3}, true},  // GQA, T > S
                        {{1, 4, 1, 5, 5, 3, 2}, true},  // multi-query
                        {{1, 2, 1, 6, 3, 2, 2}, true}}; // S > T: empty rows
  for (const Case &c : cases)
    for (DType dt : floatTypes()) {
      const AttnShape &a = c.s;
      Shape qs{a.B, a.H, a.S, a.D}, ks{a.B, a.G, a.T, a.D},
          vs{a.B, a.G, a.T, a.E}, os{a.B, a.H, a.S, a.E};
      Tensor q = randomTensor(rng, dt, qs, -1.5, 1.5);
      Tensor k = randomTensor(rng, dt, ks, -1.5, 1.5);
      Tensor v = randomTensor(rng, dt, vs);
      Tensor dout = randomTensor(rng, dt, os);
      Tensor dq(dt, qs), dk(dt, ks), dv(dt, vs);
      double scale = 0.7;
      Instr in = makeInstr("attention_grad",
                           {{"causal", int64_t(c.causal)}, {"scale", scale}});
      ASSERT_EQ(errOf(in, {&q, &k, &v, &dout}, {&dq, &dk, &dv}), "");
      Vec qv = q.values(), kv = k.values(), vv = v.values(), r = dout.values();
      auto f = [&](const Vec &Q, const Vec &K, const Vec &Vv) {
        return dot(attentionFwd(a, Q, K, Vv, c.causal, scale), r);
      };
      Vec gq = fdGrad([&](const Vec &t) { return f(t, kv, vv); }, qv);
      Vec gk = fdGrad([&](const Vec &t) { return f(qv, t, vv); }, kv);
      Vec gv = fdGrad([&](const Vec &t) { return f(qv, kv, t); }, vv);
      std::string what =
          std::string(dtypeName(dt)) + " H=" + std::to_string(a.H) +
          " G=" + std::to_string(a.G) + " S=" + std::to_string(a.S) +
          " T=" + std::to_string(a.T) + " causal=" + std::to_string(c.causal);
      EXPECT_TRUE(gradClose(dq, gq, 3e-5)) << "dq " << what;
      EXPECT_TRUE(gradClose(dk, gk, 3e-5)) << "dk " << what;
      EXPECT_TRUE(gradClose(dv, gv, 3e-5)) << "dv " << what;
    }
  // Errors: H % G != 0, dout not shaped [B, H, S, E].
  Tensor q(DType::F32, {1, 3, 4, 8}), k(DType::F32, {1, 2, 4, 8}),
      v(DType::F32, {1, 2, 4, 8}), o(DType::F32, {1, 3, 4, 8});
  Tensor dq(DType::F32, {1, 3, 4, 8}), dk(DType::F32, {1, 2, 4, 8}),
      dv(DType::F32, {1, 2, 4, 8});
  expectError(makeInstr("attention_grad", {{"scale", 0.5}}), {&q, &k, &v, &o},
              {&dq, &dk, &dv}, "H % G == 0");
  Tensor q2(DType::F32, {1, 2, 4, 8}), o2(DType::F32, {1, 2, 4, 7}),
      dq2(DType::F32, {1, 2, 4, 8});
  expectError(makeInstr("attention_grad", {{"scale", 0.5}}), {&q2, &k, &v, &o2},
              {&dq2, &dk, &dv}, "dout");
}

TEST(ConvGrad, InputAndFilterByFiniteDifferences) {
  KT_SEEDED_RNG(rng);
  const ConvCase cases[] = {
      {2, 3, 6, 6, 4, 3, 3, 1, {1, 1}, {1, 1}, {1, 1}},
      {1, 4, 7, 6, 6, 3, 2, 2, {2, 1}, {1, 0}, {1, 2}}, // grouped, strided
      {1, 4, 8, 8, 4, 3, 3, 4, {1, 2}, {2, 1}, {2, 1}}, // depthwise, dilated
      {2, 6, 4, 5, 4, 1, 1, 1, {1, 1}, {0, 0}, {1, 1}}, // 1x1 direct
      {1, 4, 4, 5, 6, 1, 1, 2, {1, 1}, {0, 0}, {1, 1}}, // grouped 1x1
      {1, 2, 7, 7, 3, 5, 5, 1, {3, 3}, {2, 2}, {1, 1}}, // stride > 1, big pad
      {1, 2, 7, 6, 2, 1, 1, 1, {2, 2}, {1, 0}, {1, 1}}, // strided 1x1, padded
  };
  for (const ConvCase &c : cases)
    for (DType dt : floatTypes()) {
      Tensor x = randomTensor(rng, dt, c.xShape());
      Tensor w = randomTensor(rng, dt, c.wShape());
      Tensor dy = randomTensor(rng, dt, c.yShape());
      Tensor dx(dt, c.xShape()), dw(dt, c.wShape());
      ASSERT_EQ(
          errOf(makeInstr("conv2d_grad_input", convAttrs(c)), {&dy, &w}, {&dx}),
          "");
      ASSERT_EQ(errOf(makeInstr("conv2d_grad_filter", convAttrs(c)), {&x, &dy},
                      {&dw}),
                "");
      Vec xv = x.values(), wv = w.values(), r = dy.values();
      Vec gx =
          fdGrad([&](const Vec &t) { return dot(conv2dFwd(c, t, wv), r); }, xv);
      Vec gw =
          fdGrad([&](const Vec &t) { return dot(conv2dFwd(c, xv, t), r); }, wv);
      std::string what = std::string(dtypeName(dt)) + " groups " +
                         std::to_string(c.groups) + " k " +
                         std::to_string(c.kh) + "x" + std::to_string(c.kw);
      EXPECT_TRUE(gradClose(dx, gx, 1e-5)) << "input " << what;
      EXPECT_TRUE(gradClose(dw, gw, 1e-5)) << "filter " << what;
    }
  // Errors: dy not conv2d's output shape, C != Cg * groups.
  ConvCase c{1, 4, 6, 6, 4, 3, 3, 2, {1, 1}, {1, 1}, {1, 1}};
  Tensor x(DType::F32, c.xShape()), w(DType::F32, c.wShape());
  Tensor dyBad(DType::F32, {1, 4, 5, 6}), dy(DType::F32, c.yShape());
  Tensor dx(DType::F32, c.xShape()), dw(DType::F32, c.wShape());
  expectError(makeInstr("conv2d_grad_input", convAttrs(c)), {&dyBad, &w}, {&dx},
              "dy");
  expectError(makeInstr("conv2d_grad_filter", convAttrs(c)), {&x, &dyBad},
              {&dw}, "dy");
  auto a1 = convAttrs(c);
  a1["groups"] = int64_t(1);
  expectError(makeInstr("conv2d_grad_input", a1), {&dy, &w}, {&dx});
  expectError(makeInstr("conv2d_grad_filter", a1), {&x, &dy}, {&dw});
  Tensor dwHalf(DType::F16, c.wShape());
  expectError(makeInstr("conv2d_grad_filter", convAttrs(c)), {&x, &dy},
              {&dwHalf});
}

// The f32 2x2, stride-2 max pool and its gradient run eight windows at a
// time in SIMD lanes, with a zero-padded tail: widths with whole blocks and
// tails, an odd width (a column in no window), ties, -0 against +0, and NaN
// rows (which take the scalar rule). Both must give exactly the first strict
// maximum in row-major order (a NaN sticks), forward and backward.
TEST(PoolGrad, MaxTwoByTwoLanesMatchTheFirstMaximumRule) {
  KT_SEEDED_RNG(rng);
  std::uniform_int_distribution<int> pick(0, 9);
  const std::map<std::string, AttrValue> attrs{
      {"kernel", std::vector<int64_t>{2, 2}},
      {"stride", std::vector<int64_t>{2, 2}},
      {"padding", std::vector<int64_t>{0, 0}}};
  for (int64_t W : {14, 16, 17, 26, 34}) {
    const int64_t N = 2, C = 3, H = 6, oh = H / 2, ow = W / 2;
    Tensor x(DType::F32, {N, C, H, W});
    for (int64_t i = 0; i < x.size(); ++i) {
      // Few distinct values: ties and signed zeros are common.
      const float vals[] = {-1.0f, -0.0f, 0.0f, 0.5f,  0.5f,
                            1.0f,  2.0f,  2.0f, -3.0f, 1.0f};
      x.set(i, vals[pick(rng)]);
    }
    x.set(W + 3, NAN);                   // plane 0, row pair 0
    x.set((1 * H + 3) * W + 2 * 2, NAN); // plane 1, row pair 1
    Tensor dy = randomTensor(rng, DType::F32, {N, C, oh, ow});
    Tensor y(DType::F32, {N, C, oh, ow}), dx(DType::F32, {N, C, H, W});
    ASSERT_EQ(errOf(makeInstr("max_pool2d", attrs), {&x}, {&y}), "");
    ASSERT_EQ(errOf(makeInstr("max_pool2d_grad", attrs), {&x, &dy}, {&dx}), "");
    const float *xp = static_cast<const float *>(x.data()),
                *yp = static_cast<const float *>(y.data()),
                *dyp = static_cast<const float *>(dy.data()),
                *dxp = static_cast<const float *>(dx.data());
    std::vector<float> ref(size_t(x.size()), 0.0f);
    for (int64_t p = 0; p < N * C; ++p)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          int64_t at[4];
          for (int q = 0; q < 4; ++q)
            at[q] = (p * H + 2 * i + q / 2) * W + 2 * j + q % 2;
          float r = xp[at[0]];
          int k = 0;
          for (int q = 1; q < 4; ++q) {
            const float v = xp[at[q]];
            if (r == r && (v != v || v > r)) {
              r = v;
              k = q;
            }
          }
          const float got = yp[(p * oh + i) * ow + j];
          EXPECT_TRUE(std::memcmp(&got, &r, 4) == 0 || (r != r && got != got))
              << "W " << W << " plane " << p << " window " << i << "," << j;
          ref[size_t(at[k])] = 0.0f + dyp[(p * oh + i) * ow + j];
        }
    for (int64_t e = 0; e < x.size(); ++e)
      ASSERT_TRUE(std::memcmp(&dxp[e], &ref[size_t(e)], 4) == 0)
          << "W " << W << " dx #" << e << ": " << dxp[e] << " vs "
          << ref[size_t(e)];
  }
}

TEST(PoolGrad, MaxFirstMaximumAndAvgByFiniteDifferences) {
  KT_SEEDED_RNG(rng);
  struct Case {
    std::vector<int64_t> kernel, stride, padding;
    bool includePad;
  };
  const Case cases[] = {{{2, 2}, {2, 2}, {0, 0}, true},
                        {{3, 3}, {2, 1}, {1, 1}, true}, // overlapping
                        {{3, 3}, {2, 1}, {1, 1}, false},
                        {{2, 3}, {1, 2}, {1, 0}, false}};
  int64_t N = 2, C = 2, H = 7, W = 6;
  for (const Case &c : cases)
    for (DType dt : floatTypes()) {
      int64_t oh = (H + 2 * c.padding[0] - c.kernel[0]) / c.stride[0] + 1;
      int64_t ow = (W + 2 * c.padding[1] - c.kernel[1]) / c.stride[1] + 1;
      Shape xs{N, C, H, W}, ys{N, C, oh, ow};
      std::map<std::string, AttrValue> attrs{
          {"kernel", c.kernel}, {"stride", c.stride}, {"padding", c.padding}};
      // Negative inputs: padding must never win the max (it is -inf). bf16
      // rounding makes ties likely, which exercises "first maximum".
      Tensor x = randomTensor(rng, dt, xs, -3, -0.5);
      Tensor dy = randomTensor(rng, dt, ys);
      Tensor dx(dt, xs);
      ASSERT_EQ(errOf(makeInstr("max_pool2d_grad", attrs), {&x, &dy}, {&dx}),
                "");
      Vec ref(static_cast<size_t>(x.size()), 0.0);
      for (int64_t p = 0; p < N * C; ++p)
        for (int64_t i = 0; i < oh; ++i)
          for (int64_t j = 0; j < ow; ++j) {
            int64_t best = -1;
            for (int64_t ky = 0; ky < c.kernel[0]; ++ky)
              for (int64_t kx = 0; kx < c.kernel[1]; ++kx) {
                int64_t iy = i * c.stride[0] - c.padding[0] + ky;
                int64_t ix = j * c.stride[1] - c.padding[1] + kx;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W)
                  continue;
                int64_t at = (p * H + iy) * W + ix;
                if (best < 0 || x.get(at) > x.get(best))
                  best = at;
              }
            ref[best] += dy.get((p * oh + i) * ow + j);
          }
      EXPECT_TRUE(gradClose(dx, ref, 1e-6)) << "max " << dtypeName(dt);

      attrs["count_include_pad"] = int64_t(c.includePad);
      Tensor da(dt, xs);
      ASSERT_EQ(errOf(makeInstr("avg_pool2d_grad", attrs), {&dy}, {&da}), "");
      Vec r = dy.values();
      auto avgFwd = [&](const Vec &xv) {
        double total = 0;
        for (int64_t p = 0; p < N * C; ++p)
          for (int64_t i = 0; i < oh; ++i)
            for (int64_t j = 0; j < ow; ++j) {
              double s = 0;
              int64_t cnt = 0;
              for (int64_t ky = 0; ky < c.kernel[0]; ++ky)
                for (int64_t kx = 0; kx < c.kernel[1]; ++kx) {
                  int64_t iy = i * c.stride[0] - c.padding[0] + ky;
                  int64_t ix = j * c.stride[1] - c.padding[1] + kx;
                  if (iy < 0 || iy >= H || ix < 0 || ix >= W) {
                    cnt += c.includePad;
                    continue;
                  }
                  s += xv[(p * H + iy) * W + ix];
                  ++cnt;
                }
              total += s / double(cnt) * r[(p * oh + i) * ow + j];
            }
        return total;
      };
      EXPECT_TRUE(gradClose(da, fdGrad(avgFwd, x.values()), 1e-6))
          << "avg " << dtypeName(dt) << " include_pad " << c.includePad;
    }
  // Ties: every window is constant, so its first element takes it all.
  Tensor x(DType::F32, {1, 1, 4, 4}), dy(DType::F32, {1, 1, 3, 3}),
      dx(DType::F32, {1, 1, 4, 4});
  for (int64_t i = 0; i < 16; ++i)
    x.set(i, 2.0);
  for (int64_t i = 0; i < 9; ++i)
    dy.set(i, double(i + 1));
  ASSERT_EQ(errOf(makeInstr("max_pool2d_grad",
                            {{"kernel", std::vector<int64_t>{2, 2}},
                             {"stride", std::vector<int64_t>{1, 1}},
                             {"padding", std::vector<int64_t>{0, 0}}}),
                  {&x, &dy}, {&dx}),
            "");
  Vec tie(16, 0.0);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 3; ++j)
      tie[i * 4 + j] = double(i * 3 + j + 1);
  EXPECT_TRUE(allEqual(dx, tie));
  // The same rules on the non-overlapping 2x2 stride-2 path (its own code):
  // a constant window's first element takes it all, a NaN wins over
  // numbers and the first NaN over later ones, a later strict maximum
  // wins, and -0 gradients come out +0 as 0 + g does.
  {
    Tensor x2(DType::F32, {1, 1, 4, 4}), dy2(DType::F32, {1, 1, 2, 2}),
        dx2(DType::F32, {1, 1, 4, 4});
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double xv[16] = {2, 2, 1,   nan, //
                           2, 2, nan, 5,   //
                           1, 1, 0,   -0.0, 1, 3, 0, 0};
    for (int64_t i = 0; i < 16; ++i)
      x2.set(i, xv[i]);
    const double dv[4] = {10, 20, 30, -0.0};
    for (int64_t i = 0; i < 4; ++i)
      dy2.set(i, dv[i]);
    ASSERT_EQ(errOf(makeInstr("max_pool2d_grad",
                              {{"kernel", std::vector<int64_t>{2, 2}},
                               {"stride", std::vector<int64_t>{2, 2}},
                               {"padding", std::vector<int64_t>{0, 0}}}),
                    {&x2, &dy2}, {&dx2}),
              "");
    const double want[16] = {10, 0,  0, 20, //
                             0,  0,  0, 0,  //
                             0,  0,  0, 0,  //
                             0,  30, 0, 0};
    for (int64_t i = 0; i < 16; ++i) {
      EXPECT_EQ(dx2.get(i), want[i]) << i;
      EXPECT_FALSE(std::signbit(dx2.get(i))) << i;
    }
  }
  // Errors: dy not the pooled shape; the result not x's type.
  Tensor dyBad(DType::F32, {1, 1, 2, 2});
  auto attrs =
      std::map<std::string, AttrValue>{{"kernel", std::vector<int64_t>{2, 2}},
                                       {"stride", std::vector<int64_t>{1, 1}}};
  expectError(makeInstr("max_pool2d_grad", attrs), {&x, &dyBad}, {&dx}, "dy");
  expectError(makeInstr("avg_pool2d_grad", attrs), {&dyBad}, {&dx}, "dy");
  Tensor dxBad(DType::F32, {1, 1, 4, 5});
  expectError(makeInstr("max_pool2d_grad", attrs), {&x, &dy}, {&dxBad});
  expectError(makeInstr("avg_pool2d_grad"), {&dy}, {&dx}); // no kernel
}

TEST(BatchNormGrad, TrainingAndInferenceByFiniteDifferences) {
  KT_SEEDED_RNG(rng);
  for (DType dt : floatTypes())
    for (bool training : {true, false}) {
      int64_t N = 3, C = 3, HW = 6;
      Shape xs{N, C, 2, 3};
      double eps = 1e-5;
      Tensor x = randomTensor(rng, dt, xs, -2, 3);
      Tensor w = randomTensor(rng, dt, {C}, 0.5, 1.5);
      Tensor rm = randomTensor(rng, dt, {C}, -0.5, 0.5);
      Tensor rv = randomTensor(rng, dt, {C}, 0.5, 2);
      Tensor dy = randomTensor(rng, dt, xs);
      Tensor dx(dt, xs), dw(dt, {C}), db(dt, {C});
      Instr in = makeInstr("batch_norm_grad",
                           {{"eps", eps}, {"training", int64_t(training)}});
      ASSERT_EQ(errOf(in, {&x, &w, &rm, &rv, &dy}, {&dx, &dw, &db}), "");
      Vec r = dy.values(), xv = x.values(), wv = w.values(), b0(C, 0.0);
      auto fwd = [&](const Vec &X, const Vec &Wt, const Vec &B) {
        Vec y(X.size());
        for (int64_t c = 0; c < C; ++c) {
          double mean = rm.get(c), var = rv.get(c);
          if (training) {
            mean = var = 0;
            for (int64_t n = 0; n < N; ++n)
              for (int64_t j = 0; j < HW; ++j)
                mean += X[(n * C + c) * HW + j] / double(N * HW);
            for (int64_t n = 0; n < N; ++n)
              for (int64_t j = 0; j < HW; ++j) {
                double d = X[(n * C + c) * HW + j] - mean;
                var += d * d / double(N * HW);
              }
          }
          for (int64_t n = 0; n < N; ++n)
            for (int64_t j = 0; j < HW; ++j) {
              int64_t i = (n * C + c) * HW + j;
              y[i] = (X[i] - mean) / std::sqrt(var + eps) * Wt[c] + B[c];
            }
        }
        return dot(y, r);
      };
      Vec gx = fdGrad([&](const Vec &t) { return fwd(t, wv, b0); }, xv);
      Vec gw = fdGrad([&](const Vec &t) { return fwd(xv, t, b0); }, wv);
      Vec gb = fdGrad([&](const Vec &t) { return fwd(xv, wv, t); }, b0);
      std::string what =
          std::string(dtypeName(dt)) + " training " + std::to_string(training);
      EXPECT_TRUE(gradClose(dx, gx, 5e-5)) << what;
      EXPECT_TRUE(gradClose(dw, gw, 2e-5)) << what;
      EXPECT_TRUE(gradClose(db, gb, 1e-5)) << what;
    }
  Tensor x(DType::F32, {2, 3}), v3(DType::F32, {3}), v2(DType::F32, {2});
  Tensor dx(DType::F32, {2, 3});
  expectError(makeInstr("batch_norm_grad"), {&x, &v3, &v3, &v2, &x},
              {&dx, &v3, &v3});
  expectError(makeInstr("batch_norm_grad"), {&x, &v3, &v3, &v3, &v3},
              {&dx, &v3, &v3}, "dy");
  expectError(makeInstr("batch_norm_grad"), {&x, &v3, &v3, &v3},
              {&dx, &v3, &v3});
}

TEST(CrossEntropyGrad, IgnoreIndexAndBadLabels) {
  KT_SEEDED_RNG(rng);
  for (DType dt : floatTypes())
    for (DType lt : {DType::I32, DType::I64}) {
      int64_t N = 9, C = 7;
      Tensor logits = randomTensor(rng, dt, {N, C}, -4, 4);
      Tensor labels = randomTensor(rng, lt, {N}, 0, C - 1);
      labels.setInt(2, -100);
      labels.setInt(6, -100);
      Tensor dloss = randomTensor(rng, dt, {}, 0.5, 2);
      Tensor dx(dt, {N, C});
      ASSERT_EQ(errOf(makeInstr("cross_entropy_grad",
                                {{"ignore_index", int64_t(-100)}}),
                      {&logits, &labels, &dloss}, {&dx}),
                "");
      // FD of dloss * cross_entropy(logits).
      auto ce = [&](const Vec &l) {
        double total = 0;
        int64_t count = 0;
        for (int64_t i = 0; i < N; ++i) {
          if (labels.getInt(i) == -100)
            continue;
          double m = -INFINITY, s = 0;
          for (int64_t j = 0; j < C; ++j)
            m = std::max(m, l[i * C + j]);
          for (int64_t j = 0; j < C; ++j)
            s += std::exp(l[i * C + j] - m);
          total += m + std::log(s) - l[i * C + labels.getInt(i)];
          ++count;
        }
        return dloss.get(0) * total / double(count);
      };
      Vec ref = fdGrad(ce, logits.values());
      EXPECT_TRUE(gradClose(dx, ref, 1e-5)) << dtypeName(dt);
      for (int64_t j = 0; j < C; ++j)
        EXPECT_EQ(dx.get(2 * C + j), 0.0);

      // Every row ignored (custom ignore_index): zeros.
      Tensor all = labels;
      for (int64_t i = 0; i < N; ++i)
        all.setInt(i, 5);
      for (int64_t i = 0; i < dx.size(); ++i)
        dx.set(i, 7.0);
      ASSERT_EQ(
          errOf(makeInstr("cross_entropy_grad", {{"ignore_index", int64_t(5)}}),
                {&logits, &all, &dloss}, {&dx}),
          "");
      EXPECT_TRUE(allEqual(dx, Vec(size_t(N * C), 0.0)));

      // Out of range and not ignored.
      for (int64_t bad : {C, int64_t(-1)}) {
        Tensor badLabels = labels;
        badLabels.setInt(4, bad);
        std::string msg = errOf(makeInstr("cross_entropy_grad"),
                                {&logits, &badLabels, &dloss}, {&dx});
        EXPECT_NE(msg.find("label " + std::to_string(bad) + " of row 4"),
                  std::string::npos)
            << msg;
      }
    }
  Tensor logits(DType::F32, {3, 4}), labels(DType::I32, {3}),
      dloss1(DType::F32, {1}), dx(DType::F32, {3, 4});
  expectError(makeInstr("cross_entropy_grad"), {&logits, &labels, &dloss1},
              {&dx}, "dloss");
}

// bf16/f16 logits with an f32 loss and an f32 dloss (what
// dlopt-fold-loss-casts emits) give bit for bit what the f32-widened ops
// give, the gradient rounded once to the logits' type as the cast did.
TEST(CrossEntropy, NarrowLogitsEqualTheWidenedOpsBitForBit) {
  KT_SEEDED_RNG(rng);
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtypeName(dt));
    int64_t N = 11, C = 37;
    Tensor logits = randomTensor(rng, dt, {N, C}, -6, 6);
    Tensor wide(DType::F32, {N, C});
    for (int64_t i = 0; i < logits.size(); ++i)
      wide.set(i, logits.get(i)); // exact
    Tensor labels = randomTensor(rng, DType::I32, {N}, 0, C - 1);
    labels.setInt(3, -100);
    Tensor lossN(DType::F32, {}), lossW(DType::F32, {});
    ASSERT_EQ(errOf(makeInstr("cross_entropy"), {&logits, &labels}, {&lossN}),
              "");
    ASSERT_EQ(errOf(makeInstr("cross_entropy"), {&wide, &labels}, {&lossW}),
              "");
    EXPECT_EQ(lossN.storage, lossW.storage)
        << lossN.get(0) << " vs " << lossW.get(0);
    Tensor dloss = randomTensor(rng, DType::F32, {}, 0.5, 2);
    Tensor gN(dt, {N, C}), gW(DType::F32, {N, C}), gWc(dt, {N, C});
    ASSERT_EQ(errOf(makeInstr("cross_entropy_grad"), {&logits, &labels, &dloss},
                    {&gN}),
              "");
    ASSERT_EQ(
        errOf(makeInstr("cross_entropy_grad"), {&wide, &labels, &dloss}, {&gW}),
        "");
    ASSERT_EQ(errOf(makeInstr("cast"), {&gW}, {&gWc}), "");
    EXPECT_EQ(gN.storage, gWc.storage);
    // The loss in the logits' own type still works; other types do not.
    Tensor lossT(dt, {});
    EXPECT_EQ(errOf(makeInstr("cross_entropy"), {&logits, &labels}, {&lossT}),
              "");
    EXPECT_NEAR(lossT.get(0), lossW.get(0), 0.02 * std::fabs(lossW.get(0)));
    DType other = dt == DType::BF16 ? DType::F16 : DType::BF16;
    Tensor lossO(other, {}), dlossO = randomTensor(rng, other, {}, 0.5, 2);
    expectError(makeInstr("cross_entropy"), {&logits, &labels}, {&lossO},
                "result");
    expectError(makeInstr("cross_entropy_grad"), {&logits, &labels, &dlossO},
                {&gN}, "dloss");
  }
}

TEST(GeluGrad, ExactAndTanhByFiniteDifferences) {
  KT_SEEDED_RNG(rng);
  for (DType dt : floatTypes())
    for (std::string approx : {"none", "tanh"}) {
      Shape s{5, 203};
      Tensor x = randomTensor(rng, dt, s, -6, 6);
      Tensor dy = randomTensor(rng, dt, s, -2, 2);
      Tensor dx(dt, s);
      ASSERT_EQ(errOf(makeInstr("gelu_grad", {{"approximate", approx}}),
                      {&x, &dy}, {&dx}),
                "");
      auto gelu = [&](double v) {
        if (approx == "none")
          return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
        return 0.5 * v *
               (1 +
                std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      };
      Vec ref(static_cast<size_t>(x.size()));
      for (int64_t i = 0; i < x.size(); ++i) {
        double v = x.get(i), h = 1e-5;
        ref[i] = dy.get(i) * (gelu(v + h) - gelu(v - h)) / (2 * h);
      }
      double tol = tolFor(dt, 1e-5);
      EXPECT_TRUE(allClose(dx, ref, tol, tol))
          << dtypeName(dt) << " " << approx;
    }
  Tensor x(DType::F32, {4}), dx(DType::F32, {4}), dy5(DType::F32, {5});
  expectError(makeInstr("gelu_grad", {{"approximate", std::string("erf")}}),
              {&x, &x}, {&dx}, "approximate");
  expectError(makeInstr("gelu_grad"), {&x, &dy5}, {&dx});
}

TEST(SliceGrad, PlacesDyIntoZeros) {
  KT_SEEDED_RNG(rng);
  struct Case {
    Shape shape, start, limit, stride;
  };
  const Case cases[] = {{{4, 8}, {0, 1}, {4, 8}, {1, 2}},
                        {{5, 6, 7}, {1, 0, 2}, {5, 6, 7}, {2, 3, 1}},
                        {{3, 9}, {1, 2}, {2, 9}, {1, 3}},
                        {{6}, {0}, {6}, {1}},
                        {{2, 3}, {1, 1}, {1, 3}, {1, 1}}}; // empty dy
  for (const Case &c : cases)
    for (DType dt : floatTypes()) {
      Shape ds;
      for (size_t i = 0; i < c.shape.size(); ++i)
        ds.push_back((c.limit[i] - c.start[i] + c.stride[i] - 1) / c.stride[i]);
      Tensor dy = randomTensor(rng, dt, ds, -3, 3);
      Tensor dx(dt, c.shape);
      for (int64_t i = 0; i < dx.size(); ++i)
        dx.set(i, 9.0);
      ASSERT_EQ(errOf(makeInstr("slice_grad", {{"start", c.start},
                                               {"limit", c.limit},
                                               {"stride", c.stride}}),
                      {&dy}, {&dx}),
                "");
      Vec ref(static_cast<size_t>(dx.size()), 0.0);
      for (int64_t i = 0; i < dy.size(); ++i) {
        Shape idx = unravel(i, ds);
        for (size_t d = 0; d < idx.size(); ++d)
          idx[d] = c.start[d] + idx[d] * c.stride[d];
        ref[ravel(idx, c.shape)] = dy.get(i);
      }
      EXPECT_TRUE(allEqual(dx, ref)) << dtypeName(dt);
    }
  Tensor dy(DType::F32, {2, 3}), dx(DType::F32, {4, 8});
  auto attrs = std::map<std::string, AttrValue>{
      {"start", Shape{0, 0}}, {"limit", Shape{4, 8}}, {"stride", Shape{2, 2}}};
  expectError(makeInstr("slice_grad", attrs), {&dy}, {&dx}, "dy"); // [2,4]
  attrs["limit"] = Shape{4, 9};
  expectError(makeInstr("slice_grad", attrs), {&dy}, {&dx}, "invalid slice");
  Tensor dxH(DType::F16, {4, 8});
  attrs["limit"] = Shape{4, 6};
  expectError(makeInstr("slice_grad", attrs), {&dy}, {&dxH});
}

TEST(RopeInverse, UndoesRopeAndIsItsGradient) {
  KT_SEEDED_RNG(rng);
  for (DType dt : floatTypes()) {
    Shape s{2, 2, 6, 8};
    Tensor x = randomTensor(rng, dt, s, -2, 2);
    Tensor y(dt, s), back(dt, s), y0(dt, s);
    double theta = 100.0;
    ASSERT_EQ(errOf(makeInstr("rope", {{"theta", theta}}), {&x}, {&y}), "");
    ASSERT_EQ(
        errOf(makeInstr("rope", {{"theta", theta}, {"inverse", int64_t(0)}}),
              {&x}, {&y0}),
        "");
    EXPECT_EQ(std::memcmp(y.data(), y0.data(), size_t(y.type.byteSize())), 0);
    // f32 round trip; 16-bit results are rounded twice.
    Tensor yf = fromVec(DType::F32, s, y.values()), backF(DType::F32, s);
    ASSERT_EQ(
        errOf(makeInstr("rope", {{"theta", theta}, {"inverse", int64_t(1)}}),
              {&yf}, {&backF}),
        "");
    double tol = tolFor(dt, 1e-5);
    EXPECT_TRUE(allClose(backF, x.values(), tol * 2, tol * 4)) << dtypeName(dt);
    // rope is linear, so its gradient is the inverse rotation of dy.
    Tensor dy = randomTensor(rng, dt, s);
    ASSERT_EQ(
        errOf(makeInstr("rope", {{"theta", theta}, {"inverse", int64_t(1)}}),
              {&dy}, {&back}),
        "");
    int64_t S = 6, D = 8;
    auto rope = [&](const Vec &xv) {
      Vec out(xv.size());
      for (size_t r = 0; r < xv.size() / D; ++r) {
        int64_t p = int64_t(r) % S;
        for (int64_t i = 0; i < D / 2; ++i) {
          double a = double(p) * std::pow(theta, -2.0 * double(i) / double(D));
          double x0 = xv[r * D + i], x1 = xv[r * D + i + D / 2];
          out[r * D + i] = x0 * std::cos(a) - x1 * std::sin(a);
          out[r * D + i + D / 2] = x1 * std::cos(a) + x0 * std::sin(a);
        }
      }
      return out;
    };
    Vec r = dy.values();
    Vec ref = fdGrad([&](const Vec &t) { return dot(rope(t), r); }, x.values());
    EXPECT_TRUE(gradClose(back, ref, 1e-5)) << dtypeName(dt);
  }
  Tensor x(DType::F32, {2, 4}), y(DType::F32, {2, 4});
  expectError(makeInstr("rope", {{"inverse", int64_t(2)}}), {&x}, {&y},
              "inverse");
}

TEST(GradEmpty, ZeroSizedShapesGiveZerosWithoutCrashing) {
  // No ids: a zero table.
  Tensor ids(DType::I32, {0}), upd(DType::F32, {0, 3}),
      table(DType::F32, {4, 3});
  for (int64_t i = 0; i < table.size(); ++i)
    table.set(i, 1.0);
  ASSERT_EQ(errOf(makeInstr("scatter_add"), {&ids, &upd}, {&table}), "");
  EXPECT_TRUE(allEqual(table, Vec(12, 0.0)));
  // No queries: dk and dv are zero. No keys: everything is zero.
  for (auto [S, T] : {std::pair<int64_t, int64_t>{0, 3}, {3, 0}}) {
    Tensor q(DType::F32, {1, 2, S, 4}), k(DType::F32, {1, 1, T, 4}),
        v(DType::F32, {1, 1, T, 2}), o(DType::F32, {1, 2, S, 2});
    Tensor dq(DType::F32, {1, 2, S, 4}), dk(DType::F32, {1, 1, T, 4}),
        dv(DType::F32, {1, 1, T, 2});
    for (Tensor *t : {&q, &k, &v, &o})
      for (int64_t i = 0; i < t->size(); ++i)
        t->set(i, 1.0);
    for (Tensor *t : {&dq, &dk, &dv})
      for (int64_t i = 0; i < t->size(); ++i)
        t->set(i, 5.0);
    ASSERT_EQ(errOf(makeInstr("attention_grad", {{"scale", 0.5}}),
                    {&q, &k, &v, &o}, {&dq, &dk, &dv}),
              "");
    EXPECT_TRUE(allEqual(dq, Vec(size_t(dq.size()), 0.0)));
    EXPECT_TRUE(allEqual(dk, Vec(size_t(dk.size()), 0.0)));
    EXPECT_TRUE(allEqual(dv, Vec(size_t(dv.size()), 0.0)));
  }
  // An empty batch: the filter gradient is zero.
  ConvCase c{0, 2, 5, 5, 2, 3, 3, 1, {1, 1}, {1, 1}, {1, 1}};
  Tensor x(DType::F32, c.xShape()), dy(DType::F32, c.yShape()),
      dw(DType::F32, c.wShape()), w(DType::F32, c.wShape()),
      dx(DType::F32, c.xShape());
  for (int64_t i = 0; i < dw.size(); ++i)
    dw.set(i, 3.0);
  ASSERT_EQ(
      errOf(makeInstr("conv2d_grad_filter", convAttrs(c)), {&x, &dy}, {&dw}),
      "");
  EXPECT_TRUE(allEqual(dw, Vec(size_t(dw.size()), 0.0)));
  ASSERT_EQ(
      errOf(makeInstr("conv2d_grad_input", convAttrs(c)), {&dy, &w}, {&dx}),
      "");
  // Norm, batch-norm and softmax gradients of empty tensors.
  Tensor e(DType::F32, {0, 4}), p4(DType::F32, {4});
  Tensor ex(DType::F32, {0, 4}), pw(DType::F32, {4}), pb(DType::F32, {4});
  ASSERT_EQ(errOf(makeInstr("layer_norm_grad"), {&e, &e}, {&ex, &pw, &pb}), "");
  EXPECT_TRUE(allEqual(pw, Vec(4, 0.0)));
  ASSERT_EQ(errOf(makeInstr("batch_norm_grad", {{"training", int64_t(1)}}),
                  {&e, &p4, &p4, &p4, &e}, {&ex, &pw, &pb}),
            "");
  EXPECT_TRUE(allEqual(pb, Vec(4, 0.0)));
  ASSERT_EQ(
      errOf(makeInstr("softmax_grad", {{"dim", int64_t(0)}}), {&e, &e}, {&ex}),
      "");
  Tensor logits(DType::F32, {0, 5}), labels(DType::I64, {0}),
      dloss(DType::F32, {}), dl(DType::F32, {0, 5});
  ASSERT_EQ(
      errOf(makeInstr("cross_entropy_grad"), {&logits, &labels, &dloss}, {&dl}),
      "");
}

/// Runs the gradient kernels on one seed and returns their output bytes.
std::vector<std::vector<uint64_t>> runGradMix(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint64_t>> outs;
  auto keep = [&](const Instr &in, std::vector<const Tensor *> ins,
                  std::vector<Shape> shapes) {
    std::vector<Tensor> res;
    for (const Shape &s : shapes)
      res.emplace_back(DType::F32, s);
    std::vector<Tensor *> ptrs;
    for (Tensor &t : res)
      ptrs.push_back(&t);
    EXPECT_EQ(errOf(in, ins, ptrs), "") << in.op;
    for (Tensor &t : res)
      outs.push_back(t.storage);
  };
  Tensor ids = randomTensor(rng, DType::I32, {4000}, 0, 49);
  Tensor upd = randomTensor(rng, DType::F32, {4000, 300});
  keep(makeInstr("scatter_add"), {&ids, &upd}, {{50, 300}});
  Tensor x = randomTensor(rng, DType::F32, {1000, 96});
  Tensor dy = randomTensor(rng, DType::F32, {1000, 96});
  Tensor w = randomTensor(rng, DType::F32, {96});
  keep(makeInstr(
           "layer_norm_grad",
           {{"axis", int64_t(1)}, {"eps", 1e-5}, {"has_weight", int64_t(1)}}),
       {&x, &dy, &w}, {{1000, 96}, {96}, {96}});
  keep(makeInstr("rms_norm_grad", {{"axis", int64_t(1)}, {"eps", 1e-6}}),
       {&x, &dy}, {{1000, 96}, {96}});
  keep(makeInstr("softmax_grad", {{"dim", int64_t(0)}}), {&x, &dy},
       {{1000, 96}});
  Tensor q = randomTensor(rng, DType::F32, {1, 4, 64, 16});
  Tensor k = randomTensor(rng, DType::F32, {1, 2, 64, 16});
  keep(makeInstr("attention_grad", {{"causal", int64_t(1)}, {"scale", 0.25}}),
       {&q, &k, &k, &q}, {{1, 4, 64, 16}, {1, 2, 64, 16}, {1, 2, 64, 16}});
  Tensor img = randomTensor(rng, DType::F32, {2, 4, 24, 24});
  Tensor f = randomTensor(rng, DType::F32, {8, 4, 3, 3});
  Tensor gy = randomTensor(rng, DType::F32, {2, 8, 24, 24});
  auto pad =
      std::map<std::string, AttrValue>{{"padding", std::vector<int64_t>{1, 1}}};
  keep(makeInstr("conv2d_grad_input", pad), {&gy, &f}, {{2, 4, 24, 24}});
  keep(makeInstr("conv2d_grad_filter", pad), {&img, &gy}, {{8, 4, 3, 3}});
  Tensor py = randomTensor(rng, DType::F32, {2, 4, 23, 23});
  auto pool =
      std::map<std::string, AttrValue>{{"kernel", std::vector<int64_t>{2, 2}},
                                       {"stride", std::vector<int64_t>{1, 1}},
                                       {"padding", std::vector<int64_t>{0, 0}}};
  keep(makeInstr("max_pool2d_grad", pool), {&img, &py}, {{2, 4, 24, 24}});
  keep(makeInstr("avg_pool2d_grad", pool), {&py}, {{2, 4, 24, 24}});
  Tensor c4 = randomTensor(rng, DType::F32, {4}, 0.5, 1.5);
  keep(makeInstr("batch_norm_grad", {{"training", int64_t(1)}}),
       {&img, &c4, &c4, &c4, &img}, {{2, 4, 24, 24}, {4}, {4}});
  return outs;
}

TEST(GradThreads, ResultsIndependentOfThreadCount) {
  KT_SEEDED_RNG(rng);
  uint32_t seed = rng();
  int saved = cpu::numThreads();
  cpu::setNumThreads(1);
  auto one = runGradMix(seed);
  cpu::setNumThreads(2);
  auto two = runGradMix(seed);
  cpu::setNumThreads(5);
  auto five = runGradMix(seed);
  cpu::setNumThreads(saved);
  ASSERT_EQ(one.size(), two.size());
  ASSERT_EQ(one.size(), five.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_TRUE(one[i] == two[i]) << "result #" << i;
    EXPECT_TRUE(one[i] == five[i]) << "result #" << i;
  }
}

} // namespace

namespace {

/// Image i of an [N, ...] tensor as a [1, ...] tensor (f32).
Tensor imageOf(const Tensor &t, int64_t i) {
  Shape s = t.type.shape;
  int64_t per = t.size() / s[0];
  s[0] = 1;
  Tensor r(DType::F32, s);
  std::copy_n(static_cast<const float *>(t.data()) + i * per, per,
              static_cast<float *>(r.data()));
  return r;
}

} // namespace

// conv2d and its gradients put several images' planes side by side in one
// GEMM when their column matrices fit in 1 MiB (2^18 floats: Conv.cpp,
// imagesPerChunkOf), in chunks of images evened out (evenChunk), which
// all three run in parallel (the filter gradient into one slice per chunk,
// added in chunk order). These shapes make several
// chunks, some with a partial last one; the results must equal the
// one-image-at-a-time path (a batch of 1) image by image, and the filter
// gradient their sum, and be the same bits with one and two threads.
TEST(ConvGrad, ImageChunksAgreeWithOneImageAtATime) {
  KT_SEEDED_RNG(rng);
  const ConvCase cases[] = {
      {9, 16, 16, 16, 8, 3, 3, 1, {1, 1}, {1, 1}, {1, 1}},  // 5 + 4 images
      {10, 32, 16, 16, 8, 3, 3, 2, {1, 1}, {1, 1}, {1, 1}}, // grouped: 5 + 5
      {6, 64, 32, 32, 4, 1, 1, 1, {1, 1}, {0, 0}, {1, 1}},  // 1x1: 3 + 3
      {5, 96, 24, 24, 8, 3, 3, 1, {2, 2}, {1, 1}, {1, 1}},  // strided: 2+2+1
  };
  for (const ConvCase &c : cases) {
    Tensor x = randomTensor(rng, DType::F32, c.xShape());
    Tensor w = randomTensor(rng, DType::F32, c.wShape());
    Tensor dy = randomTensor(rng, DType::F32, c.yShape());
    Tensor y(DType::F32, c.yShape()), dx(DType::F32, c.xShape()),
        dw(DType::F32, c.wShape());
    auto attrs = convAttrs(c);
    ASSERT_EQ(errOf(makeInstr("conv2d", attrs), {&x, &w}, {&y}), "");
    ASSERT_EQ(errOf(makeInstr("conv2d_grad_input", attrs), {&dy, &w}, {&dx}),
              "");
    ASSERT_EQ(errOf(makeInstr("conv2d_grad_filter", attrs), {&x, &dy}, {&dw}),
              "");
    {
      // The same bits on one and on two threads.
      const int saved = cpu::numThreads();
      std::vector<double> ys[2], dxs[2], dws[2];
      for (int t = 0; t < 2; ++t) {
        cpu::setNumThreads(t + 1);
        Tensor yt(DType::F32, c.yShape()), dxt(DType::F32, c.xShape()),
            dwt(DType::F32, c.wShape());
        ASSERT_EQ(errOf(makeInstr("conv2d", attrs), {&x, &w}, {&yt}), "");
        ASSERT_EQ(
            errOf(makeInstr("conv2d_grad_input", attrs), {&dy, &w}, {&dxt}),
            "");
        ASSERT_EQ(
            errOf(makeInstr("conv2d_grad_filter", attrs), {&x, &dy}, {&dwt}),
            "");
        ys[t] = yt.values();
        dxs[t] = dxt.values();
        dws[t] = dwt.values();
      }
      cpu::setNumThreads(saved);
      EXPECT_TRUE(ys[0] == ys[1]) << "threads changed conv2d";
      EXPECT_TRUE(dxs[0] == dxs[1]) << "threads changed conv2d_grad_input";
      EXPECT_TRUE(dws[0] == dws[1]) << "threads changed conv2d_grad_filter";
    }
    ConvCase one = c;
    one.n = 1;
    std::vector<double> yRef, dxRef, dwRef(size_t(dw.size()), 0.0);
    for (int64_t i = 0; i < c.n; ++i) {
      Tensor xi = imageOf(x, i), dyi = imageOf(dy, i);
      Tensor yi(DType::F32, one.yShape()), dxi(DType::F32, one.xShape()),
          dwi(DType::F32, one.wShape());
      ASSERT_EQ(errOf(makeInstr("conv2d", attrs), {&xi, &w}, {&yi}), "");
      ASSERT_EQ(
          errOf(makeInstr("conv2d_grad_input", attrs), {&dyi, &w}, {&dxi}), "");
      ASSERT_EQ(
          errOf(makeInstr("conv2d_grad_filter", attrs), {&xi, &dyi}, {&dwi}),
          "");
      for (int64_t j = 0; j < yi.size(); ++j)
        yRef.push_back(yi.get(j));
      for (int64_t j = 0; j < dxi.size(); ++j)
        dxRef.push_back(dxi.get(j));
      for (int64_t j = 0; j < dwi.size(); ++j)
        dwRef[size_t(j)] += dwi.get(j);
    }
    std::string what = "n=" + std::to_string(c.n) +
                       " c=" + std::to_string(c.c) +
                       " groups=" + std::to_string(c.groups);
    EXPECT_TRUE(allClose(y, yRef, 1e-5, 1e-4)) << "y " << what;
    EXPECT_TRUE(allClose(dx, dxRef, 1e-5, 1e-4)) << "dx " << what;
    EXPECT_TRUE(gradClose(dw, dwRef, 1e-5)) << "dw " << what;
  }
}
