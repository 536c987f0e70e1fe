//===- FusedProgramTest.cpp - fused_elementwise: format and CPU kernel ----===//
//
// The per-element program survives a plan file round trip, bad programs are
// rejected on read with a message naming the instruction, and the CPU kernel
// gives bitwise the results of one kernel per op for f32 (and within the
// intermediate roundings for bf16), including in place.
//
//===----------------------------------------------------------------------===//

#include "TestUtil.h"
#include "runtime/cpu/CpuKernels.h"
#include "runtime/cpu/Half.h"
#include "runtime/format/FusedProgram.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

namespace dlopt::rt::test {
namespace {

using fused::OpCode;

/// new_m = 0.9 m + g; p' = p - lr * new_m / (sqrt(new_m^2) + 1e-8):
/// inputs m, g, p, lr (rank 0); results new_m, p'.
fused::Program momentumProgram() {
  fused::Program p;
  p.numInputs = 4;
  p.consts = {0.9, 1e-8};
  // registers: 0 m, 1 g, 2 p, 3 lr, 4 c0.9, 5 c1e-8, steps from 6
  p.steps = {{OpCode::Mul, 0, 4},  // 6 = 0.9 m
             {OpCode::Add, 6, 1},  // 7 = new_m
             {OpCode::Mul, 7, 7},  // 8
             {OpCode::Sqrt, 8, -1}, // 9
             {OpCode::Add, 9, 5},  // 10
             {OpCode::Div, 7, 10}, // 11
             {OpCode::Mul, 11, 3}, // 12
             {OpCode::Sub, 2, 12}}; // 13 = p'
  p.outputs = {7, 13};
  return p;
}

Instr fusedInstr(const fused::Program &p, std::vector<int32_t> operands,
                 std::vector<int32_t> results) {
  Instr in;
  in.op = fused::kOpName;
  in.operands = std::move(operands);
  in.results = std::move(results);
  in.loc = "opt.mlir:7:5";
  fused::encode(p, in);
  return in;
}

/// A plan with one fused instruction over [n] of dtype `d`.
Executable fusedPlan(const fused::Program &p, int64_t n, DType d = DType::F32) {
  ExeBuilder b;
  int32_t m = b.input("m", tt({n}, d));
  int32_t g = b.input("g", tt({n}, d));
  int32_t w = b.input("p", tt({n}, d));
  int32_t lr = b.input("lr", tt({}, d));
  int32_t newM = b.temp(tt({n}, d));
  int32_t newP = b.temp(tt({n}, d));
  b.instrs.push_back(fusedInstr(p, {m, g, w, lr}, {newM, newP}));
  b.output("m.next", newM);
  b.output("p.next", newP);
  return b.build();
}

TEST(FusedProgram, RoundTripsThroughThePlanFile) {
  Executable exe = fusedPlan(momentumProgram(), 10);
  ASSERT_TRUE(exe.validate().isOk()) << exe.validate().message();
  auto bytes = serializeExecutable(exe);
  ASSERT_TRUE(bytes.isOk()) << bytes.status().message();
  auto back = deserializeExecutable(*bytes);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(*back, exe);
  const Instr &in = back->programs[0].instrs[0];
  std::vector<TensorType> ot, rt;
  for (int32_t id : in.operands)
    ot.push_back(back->values[id].type);
  for (int32_t id : in.results)
    rt.push_back(back->values[id].type);
  auto p = fused::decode(in, ot, rt);
  ASSERT_TRUE(p.isOk()) << p.status().message();
  EXPECT_EQ(*p, momentumProgram());
  std::string dump = dumpExecutable(*back);
  EXPECT_TRUE(contains(dump, "program: t0 = mul in0, 0.9; t1 = add t0, in1;"))
      << dump;
  EXPECT_TRUE(contains(dump, "-> t1, t7")) << dump;
}

/// Corrupts the fused instruction and expects validate() and a read of the
/// serialized file to reject it, naming the instruction and `what`.
void expectRejected(const std::function<void(Instr &)> &corrupt,
                    const std::string &what, DType d = DType::F32) {
  Executable exe = fusedPlan(momentumProgram(), 10, d);
  corrupt(exe.programs[0].instrs[0]);
  Status st = exe.validate();
  ASSERT_FALSE(st.isOk()) << "accepted a program corrupted with: " << what;
  EXPECT_TRUE(contains(st.message(), "instruction 0 ('fused_elementwise' at "
                                     "opt.mlir:7:5)"))
      << st.message();
  EXPECT_TRUE(contains(st.message(), what)) << st.message();
  auto bytes = serializeExecutable(exe);
  if (bytes) {
    auto back = deserializeExecutable(*bytes);
    ASSERT_FALSE(back.isOk());
    EXPECT_TRUE(contains(back.status().message(), what))
        << back.status().message();
  }
}

TEST(FusedProgram, RejectsBadPrograms) {
  auto code = [](Instr &in) -> std::vector<int64_t> & {
    return std::get<std::vector<int64_t>>(in.attrs["code"]);
  };
  expectRejected([&](Instr &in) { code(in)[0] = 99; }, "step 0: unknown opcode 99");
  expectRejected([&](Instr &in) { code(in)[4] = 7; },
                 "step 1: 'add' reads register 7, expected one of the 7 "
                 "registers defined before it");
  expectRejected([&](Instr &in) { code(in)[1] = -3; }, "reads register -3");
  expectRejected([&](Instr &in) { code(in)[11] = 2; },
                 "step 3: unary 'sqrt' has operand b = 2, expected -1");
  expectRejected([&](Instr &in) { code(in).pop_back(); },
                 "step 7: 'sub' needs 3 ints (opcode and operands), attribute "
                 "'code' ends after 2");
  // select takes four ints: opcode, cond, a, b.
  expectRejected(
      [&](Instr &in) {
        code(in).insert(code(in).end(), {int64_t(OpCode::Select), 13, 7});
      },
      "step 8: 'select' needs 4 ints (opcode and operands), attribute 'code' "
      "ends after 3");
  expectRejected(
      [&](Instr &in) {
        code(in).insert(code(in).end(), {int64_t(OpCode::Select), 13, 7, 14});
      },
      "step 8: 'select' reads register 14, expected one of the 14 registers "
      "defined before it");
  expectRejected(
      [&](Instr &in) {
        code(in).insert(code(in).end(), {int64_t(OpCode::CmpGt), 13, -1});
      },
      "step 8: 'cmp_gt' reads register -1");
  expectRejected([&](Instr &in) { code(in).clear(); }, "no steps");
  expectRejected([&](Instr &in) { in.attrs.erase("code"); },
                 "missing attribute 'code'");
  expectRejected([&](Instr &in) { in.attrs["code"] = std::string("x"); },
                 "attribute 'code' expected int list");
  expectRejected(
      [&](Instr &in) {
        code(in)[0] = int64_t(OpCode::Cast);
        code(in)[2] = int64_t(DType::I32);
      },
      "step 0: 'cast' has target type 3, expected f32 (0), f16 (1) or bf16 (2)");
  expectRejected(
      [&](Instr &in) {
        auto &c = code(in);
        for (int s = 0; s < 60; ++s)
          c.insert(c.end(), {int64_t(OpCode::Neg), 0, -1});
      },
      "fused program has 68 steps, at most 64 are supported");
  expectRejected(
      [&](Instr &in) { in.attrs["outputs"] = std::vector<int64_t>{7}; },
      "attribute 'outputs' names 1 registers, expected one per result (2)");
  expectRejected(
      [&](Instr &in) { in.attrs["outputs"] = std::vector<int64_t>{7, 14}; },
      "result #1 reads register 14, out of range [0, 14)");
  expectRejected(
      [&](Instr &in) { in.attrs["consts"] = std::string("0.9"); },
      "attribute 'consts' expected a float list");
  expectRejected(
      [&](Instr &in) { in.attrs["consts"] = std::vector<double>(40, 1.0); },
      "fused program has 40 constants, at most 32 are supported");
  expectRejected([&](Instr &in) { in.operands.pop_back(); },
                 "step 1: 'add' reads register 6");
}

TEST(FusedProgram, RejectsBadTypes) {
  auto retype = [](int32_t value, TensorType t) {
    Executable exe = fusedPlan(momentumProgram(), 10);
    exe.values[value].type = std::move(t);
    Expected<MemoryPlan> plan = planProgramMemory(exe, exe.programs[0]);
    EXPECT_TRUE(plan.isOk());
    exe.programs[0].memory = *plan;
    return exe.validate();
  };
  Status st = retype(1, tt({10}, DType::I32));
  EXPECT_TRUE(contains(st.message(), "operand #1 is 10xi32, expected a float "
                                     "type (f32, f16 or bf16)"))
      << st.message();
  st = retype(2, tt({5}));
  EXPECT_TRUE(contains(st.message(), "operand #2 is 5xf32, expected the fused "
                                     "shape of the results or rank 0"))
      << st.message();
  st = retype(5, tt({2, 5}));
  EXPECT_TRUE(contains(st.message(), "result #1 is 2x5xf32, expected the "
                                     "fused shape of result #0 (10xf32)"))
      << st.message();
}

//===--- The CPU kernel ----------------------------------------------------===//

template <typename T> std::vector<T> randomVec(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto &x : v) {
    if constexpr (std::is_same_v<T, float>)
      x = dist(rng);
    else
      x = T(floatToBf16(dist(rng)));
  }
  return v;
}

TensorRef ref(void *data, TensorType t) { return TensorRef{data, std::move(t)}; }

Status run(const std::string &op, std::vector<TensorRef> ins,
           std::vector<TensorRef> outs, std::map<std::string, AttrValue> attrs = {}) {
  Instr in;
  in.op = op;
  in.attrs = std::move(attrs);
  return cpu::runKernel(in, ins, outs);
}

/// The momentum program as one op per kernel; f32 or bf16 (uint16_t).
template <typename T>
void unfused(int64_t n, DType d, const T *m, const T *g, const T *p,
             const T *lr, T *newM, T *newP) {
  std::vector<T> t6(n), t8(n), t9(n), t10(n), t11(n), t12(n);
  auto c = [&](float v) {
    if constexpr (std::is_same_v<T, float>)
      return v;
    else
      return T(floatToBf16(v));
  };
  T c09 = c(0.9f), ceps = c(1e-8f);
  TensorType vt = tt({n}, d), st = tt({}, d);
  auto R = [&](const T *x, const TensorType &t) { return ref(const_cast<T *>(x), t); };
  ASSERT_TRUE(run("mul", {R(m, vt), R(&c09, st)}, {R(t6.data(), vt)}).isOk());
  ASSERT_TRUE(run("add", {R(t6.data(), vt), R(g, vt)}, {R(newM, vt)}).isOk());
  ASSERT_TRUE(run("mul", {R(newM, vt), R(newM, vt)}, {R(t8.data(), vt)}).isOk());
  ASSERT_TRUE(run("sqrt", {R(t8.data(), vt)}, {R(t9.data(), vt)}).isOk());
  ASSERT_TRUE(run("add", {R(t9.data(), vt), R(&ceps, st)}, {R(t10.data(), vt)}).isOk());
  ASSERT_TRUE(run("div", {R(newM, vt), R(t10.data(), vt)}, {R(t11.data(), vt)}).isOk());
  ASSERT_TRUE(run("mul", {R(t11.data(), vt), R(lr, st)}, {R(t12.data(), vt)}).isOk());
  ASSERT_TRUE(run("sub", {R(p, vt), R(t12.data(), vt)}, {R(newP, vt)}).isOk());
}

std::map<std::string, AttrValue> attrsOf(const fused::Program &p) {
  Instr in;
  fused::encode(p, in);
  return in.attrs;
}

TEST(FusedKernel, F32IsBitwiseTheUnfusedOps) {
  // 1000 elements: several 256-element blocks and a ragged tail.
  const int64_t n = 1000;
  auto m = randomVec<float>(n, 1), g = randomVec<float>(n, 2),
       p = randomVec<float>(n, 3);
  float lr = 0.0137f;
  std::vector<float> m1(n), p1(n), m2(n), p2(n);
  unfused<float>(n, DType::F32, m.data(), g.data(), p.data(), &lr, m1.data(),
                 p1.data());
  TensorType vt = tt({n}), st = tt({});
  Status s = run(fused::kOpName,
                 {ref(m.data(), vt), ref(g.data(), vt), ref(p.data(), vt),
                  ref(&lr, st)},
                 {ref(m2.data(), vt), ref(p2.data(), vt)},
                 attrsOf(momentumProgram()));
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(0, std::memcmp(m1.data(), m2.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(p1.data(), p2.data(), n * sizeof(float)));

  // In place: the results take the bytes of m and p (as the memory planner
  // arranges for optimizer updates).
  std::vector<float> mi = m, pi = p;
  s = run(fused::kOpName,
          {ref(mi.data(), vt), ref(g.data(), vt), ref(pi.data(), vt),
           ref(&lr, st)},
          {ref(mi.data(), vt), ref(pi.data(), vt)}, attrsOf(momentumProgram()));
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(0, std::memcmp(m1.data(), mi.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(p1.data(), pi.data(), n * sizeof(float)));
}

TEST(FusedKernel, Bf16DiffersOnlyByIntermediateRounding) {
  const int64_t n = 300;
  auto m = randomVec<uint16_t>(n, 4), g = randomVec<uint16_t>(n, 5),
       p = randomVec<uint16_t>(n, 6);
  uint16_t lr = floatToBf16(0.25f);
  std::vector<uint16_t> m1(n), p1(n), m2(n), p2(n);
  unfused<uint16_t>(n, DType::BF16, m.data(), g.data(), p.data(), &lr,
                    m1.data(), p1.data());
  // The compiler exports a bf16 constant's exact (bf16) value.
  fused::Program prog = momentumProgram();
  for (double &c : prog.consts)
    c = bf16ToFloat(floatToBf16(float(c)));
  TensorType vt = tt({n}, DType::BF16), st = tt({}, DType::BF16);
  Status s = run(fused::kOpName,
                 {ref(m.data(), vt), ref(g.data(), vt), ref(p.data(), vt),
                  ref(&lr, st)},
                 {ref(m2.data(), vt), ref(p2.data(), vt)}, attrsOf(prog));
  ASSERT_TRUE(s.isOk()) << s.message();
  // new_m = 0.9 m + g: the unfused path rounds 0.9 m to bf16 first, so the
  // two differ by at most that rounding plus the final one (2^-8 relative
  // each). p' = p - lr new_m / (|new_m| + eps) ~ p -+ 0.25: the same plus
  // the roundings of |new_m| and the quotient, unless new_m is so small
  // that the roundings flip its sign.
  int same = 0;
  for (int64_t i = 0; i < n; ++i) {
    double mi = std::fabs(bf16ToFloat(m[i])), gi = std::fabs(bf16ToFloat(g[i]));
    double scale = 0.9 * mi + gi;
    float a = bf16ToFloat(m1[i]), b = bf16ToFloat(m2[i]);
    EXPECT_LE(std::fabs(a - b), std::ldexp(scale, -7)) << i;
    same += m1[i] == m2[i];
    if (std::fabs(b) < std::ldexp(scale, -5))
      continue;
    float c = bf16ToFloat(p1[i]), d = bf16ToFloat(p2[i]);
    EXPECT_LE(std::fabs(c - d), std::ldexp(std::fabs(c) + 0.25, -6)) << i;
  }
  EXPECT_GT(same, n / 2); // most elements round the same way
}

TEST(FusedKernel, EveryOpcodeMatchesItsOp) {
  const int64_t n = 37;
  auto x = randomVec<float>(n, 7), y = randomVec<float>(n, 8);
  for (float &v : y)
    v = std::fabs(v) + 0.5f; // positive: log, sqrt, pow, div stay finite
  TensorType vt = tt({n});
  struct Case {
    OpCode code;
    std::string op;
    std::map<std::string, AttrValue> attrs;
  };
  std::vector<Case> cases = {
      {OpCode::Neg, "neg", {}},         {OpCode::Abs, "abs", {}},
      {OpCode::Relu, "relu", {}},       {OpCode::Exp, "exp", {}},
      {OpCode::Log, "log", {}},         {OpCode::Sqrt, "sqrt", {}},
      {OpCode::Rsqrt, "rsqrt", {}},     {OpCode::Tanh, "tanh", {}},
      {OpCode::Sin, "sin", {}},         {OpCode::Cos, "cos", {}},
      {OpCode::Sigmoid, "sigmoid", {}}, {OpCode::Silu, "silu", {}},
      {OpCode::Gelu, "gelu", {{"approximate", std::string("none")}}},
      {OpCode::GeluTanh, "gelu", {{"approximate", std::string("tanh")}}},
      {OpCode::Add, "add", {}},         {OpCode::Sub, "sub", {}},
      {OpCode::Mul, "mul", {}},         {OpCode::Div, "div", {}},
      {OpCode::Max, "maximum", {}},     {OpCode::Min, "minimum", {}},
      {OpCode::Pow, "pow", {}}};
  for (const Case &c : cases) {
    bool binary = fused::isBinary(c.code);
    bool positive = c.op == "log" || c.op == "sqrt" || c.op == "rsqrt";
    float *a = positive || c.op == "pow" ? y.data() : x.data();
    std::vector<float> want(n), got(n);
    std::vector<TensorRef> ins = {ref(a, vt)};
    if (binary)
      ins.push_back(ref(y.data(), vt));
    ASSERT_TRUE(run(c.op, ins, {ref(want.data(), vt)}, c.attrs).isOk()) << c.op;
    fused::Program p;
    p.numInputs = int32_t(ins.size());
    p.steps = {{c.code, 0, binary ? 1 : -1}};
    p.outputs = {p.numInputs};
    Status s = run(fused::kOpName, ins, {ref(got.data(), vt)}, attrsOf(p));
    ASSERT_TRUE(s.isOk()) << s.message();
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), n * sizeof(float)))
        << c.op;
  }
  // cast to bf16 rounds, as the cast op does; the result is f32 again.
  fused::Program p;
  p.numInputs = 1;
  p.steps = {{OpCode::Cast, 0, int32_t(DType::BF16)}};
  p.outputs = {1};
  std::vector<float> got(n);
  ASSERT_TRUE(run(fused::kOpName, {ref(x.data(), vt)}, {ref(got.data(), vt)},
                  attrsOf(p))
                  .isOk());
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(got[i], bf16ToFloat(floatToBf16(x[i])));
}

/// ReLU's gradient as the fusion pass leaves it: t0 = cmp_gt y, 0;
/// t1 = select t0, dy, 0. Inputs y, dy; one const.
fused::Program reluGradProgram() {
  fused::Program p;
  p.numInputs = 2;
  p.consts = {0.0};
  p.steps = {{OpCode::CmpGt, 0, 2}, {OpCode::Select, 3, 1, 2}};
  p.outputs = {4};
  return p;
}

TEST(FusedProgram, SelectRoundTripsWithItsFourInts) {
  Instr in = fusedInstr(reluGradProgram(), {0, 1}, {2});
  EXPECT_EQ(std::get<std::vector<int64_t>>(in.attrs.at("code")),
            (std::vector<int64_t>{34, 0, 2, 40, 3, 1, 2}));
  TensorType vt = tt({5});
  auto p = fused::decode(in, {vt, vt}, {vt});
  ASSERT_TRUE(p.isOk()) << p.status().message();
  EXPECT_EQ(*p, reluGradProgram());
  EXPECT_EQ(fused::describe(*p), "t0 = cmp_gt in0, 0; t1 = select t0, in1, 0 -> t1");
  OpCode c;
  ASSERT_TRUE(fused::opCodeFromName("cmp_le", c));
  EXPECT_EQ(c, OpCode::CmpLe);
  EXPECT_FALSE(fused::opCodeFromName("compare", c));
}

TEST(FusedKernel, CompareAndSelectMatchTheirOps) {
  // Random values plus the edges: equal pairs, signed zeros, infinities and
  // NaNs on either side.
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = randomVec<float>(300, 11), y = randomVec<float>(300, 12);
  const std::vector<std::pair<float, float>> edges = {
      {0.0f, -0.0f}, {-0.0f, 0.0f}, {1.5f, 1.5f}, {inf, inf}, {-inf, 1.0f},
      {nan, 1.0f},   {1.0f, nan},   {nan, nan},   {-2.0f, -inf}};
  for (size_t i = 0; i < edges.size(); ++i) {
    x[i * 7] = edges[i].first;
    y[i * 7] = edges[i].second;
  }
  const int64_t n = int64_t(x.size());
  TensorType vt = tt({n}), bt = tt({n}, DType::I1);
  const std::pair<OpCode, const char *> preds[] = {
      {OpCode::CmpEq, "eq"}, {OpCode::CmpNe, "ne"}, {OpCode::CmpLt, "lt"},
      {OpCode::CmpLe, "le"}, {OpCode::CmpGt, "gt"}, {OpCode::CmpGe, "ge"}};
  for (auto [code, pred] : preds) {
    // compare then select(c, x, y) one kernel each, against one program
    // with both results (the 0/1 register and the selection).
    std::vector<uint8_t> mask(static_cast<size_t>(n));
    std::vector<float> want(static_cast<size_t>(n)), gotMask(want), got(want);
    ASSERT_TRUE(run("compare", {ref(x.data(), vt), ref(y.data(), vt)},
                    {ref(mask.data(), bt)}, {{"predicate", std::string(pred)}})
                    .isOk());
    ASSERT_TRUE(run("select",
                    {ref(mask.data(), bt), ref(x.data(), vt), ref(y.data(), vt)},
                    {ref(want.data(), vt)})
                    .isOk());
    fused::Program p;
    p.numInputs = 2;
    p.steps = {{code, 0, 1}, {OpCode::Select, 2, 0, 1}};
    p.outputs = {2, 3};
    Status s = run(fused::kOpName, {ref(x.data(), vt), ref(y.data(), vt)},
                   {ref(gotMask.data(), vt), ref(got.data(), vt)}, attrsOf(p));
    ASSERT_TRUE(s.isOk()) << s.message();
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(gotMask[size_t(i)], mask[size_t(i)] ? 1.0f : 0.0f)
          << pred << " at " << i << ": " << x[size_t(i)] << " vs "
          << y[size_t(i)];
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), size_t(n) * sizeof(float)))
        << pred;
  }
  // ReLU's gradient: dy where y > 0, +0 elsewhere (not dy * 0: a NaN or
  // -0 upstream gradient stays out of the inactive units).
  std::vector<float> dy = randomVec<float>(300, 13);
  dy[1] = nan;
  dy[2] = -0.0f;
  x[1] = -1.0f;
  x[2] = -1.0f;
  std::vector<float> got(static_cast<size_t>(n));
  ASSERT_TRUE(run(fused::kOpName, {ref(x.data(), vt), ref(dy.data(), vt)},
                  {ref(got.data(), vt)}, attrsOf(reluGradProgram()))
                  .isOk());
  for (int64_t i = 0; i < n; ++i) {
    float want = x[size_t(i)] > 0.0f ? dy[size_t(i)] : 0.0f;
    EXPECT_EQ(0, std::memcmp(&want, &got[size_t(i)], sizeof(float))) << i;
  }
}

TEST(FusedKernel, KernelRejectsWhatTheValidatorRejects) {
  fused::Program p = momentumProgram();
  p.steps[2].a = 40;
  const int64_t n = 4;
  std::vector<float> m(n), g(n), w(n), o1(n), o2(n);
  float lr = 1;
  TensorType vt = tt({n});
  Instr in = fusedInstr(p, {}, {});
  std::vector<TensorRef> ins = {ref(m.data(), vt), ref(g.data(), vt),
                                ref(w.data(), vt), ref(&lr, tt({}))};
  std::vector<TensorRef> outs = {ref(o1.data(), vt), ref(o2.data(), vt)};
  Status s = cpu::runKernel(in, ins, outs);
  ASSERT_FALSE(s.isOk());
  EXPECT_TRUE(contains(s.message(), "fused_elementwise")) << s.message();
  EXPECT_TRUE(contains(s.message(), "step 2: 'mul' reads register 40"))
      << s.message();
}


//===--- Multi-tensor form (segments) --------------------------------------===//

/// The momentum program over three segments of sizes 10, 3x7 and 1 (one
/// shared lr): segment-major operands and results. With `params`, m and p
/// of each segment are params and the results update them (in place).
Executable multiPlan(DType d = DType::F32, bool params = false,
                     std::vector<std::vector<int64_t>> shapes = {{10}, {3, 7}, {1}},
                     const std::function<void(std::vector<int32_t> &)> &edit = {}) {
  ExeBuilder b;
  fused::Program prog = momentumProgram();
  prog.numSegments = int32_t(shapes.size());
  int32_t lr = b.input("lr", tt({}, d));
  std::vector<int32_t> ops, res;
  std::vector<std::pair<std::string, int32_t>> outs;
  for (size_t s = 0; s < shapes.size(); ++s) {
    std::string k = std::to_string(s);
    TensorType t = tt(shapes[s], d);
    int32_t m = params ? b.state("m" + k, t) : b.input("m" + k, t);
    int32_t g = b.input("g" + k, t);
    int32_t w = params ? b.param("p" + k, t) : b.input("p" + k, t);
    ops.insert(ops.end(), {m, g, w, lr});
    int32_t nm = b.temp(t), np = b.temp(t);
    res.insert(res.end(), {nm, np});
    outs.push_back({"m" + k, nm});
    outs.push_back({"p" + k, np});
  }
  if (edit)
    edit(ops);
  b.instrs.push_back(fusedInstr(prog, ops, res));
  for (auto &[name, id] : outs)
    b.output(name + ".next", id, params ? name : "");
  return b.build();
}

TEST(FusedProgram, MultiTensorRoundTripsThroughThePlanFile) {
  Executable exe = multiPlan();
  ASSERT_TRUE(exe.validate().isOk()) << exe.validate().message();
  auto bytes = serializeExecutable(exe);
  ASSERT_TRUE(bytes.isOk()) << bytes.status().message();
  auto back = deserializeExecutable(*bytes);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(*back, exe);
  const Instr &in = back->programs[0].instrs[0];
  EXPECT_EQ(in.getInt("segments", 0), 3);
  std::vector<TensorType> ot, rt;
  for (int32_t id : in.operands)
    ot.push_back(back->values[id].type);
  for (int32_t id : in.results)
    rt.push_back(back->values[id].type);
  auto p = fused::decode(in, ot, rt);
  ASSERT_TRUE(p.isOk()) << p.status().message();
  fused::Program expect = momentumProgram();
  expect.numSegments = 3;
  EXPECT_EQ(*p, expect);
  std::string dump = dumpExecutable(*back);
  EXPECT_TRUE(contains(dump, "-> t1, t7  (x3 segments)")) << dump;
}

void expectMultiRejected(const std::function<void(Executable &)> &corrupt,
                         const std::string &what) {
  Executable exe = multiPlan();
  corrupt(exe);
  Status st = exe.validate();
  ASSERT_FALSE(st.isOk()) << "accepted a plan corrupted with: " << what;
  EXPECT_TRUE(contains(st.message(), "instruction 0 ('fused_elementwise' at "
                                     "opt.mlir:7:5)"))
      << st.message();
  EXPECT_TRUE(contains(st.message(), what)) << st.message();
  auto bytes = serializeExecutable(exe);
  if (bytes) {
    auto back = deserializeExecutable(*bytes);
    ASSERT_FALSE(back.isOk());
    EXPECT_TRUE(contains(back.status().message(), what))
        << back.status().message();
  }
}

TEST(FusedProgram, RejectsBadSegments) {
  auto instr = [](Executable &e) -> Instr & { return e.programs[0].instrs[0]; };
  expectMultiRejected([&](Executable &e) { instr(e).attrs["segments"] = int64_t(0); },
                      "attribute 'segments' is 0, expected 1 to 65536");
  expectMultiRejected([&](Executable &e) { instr(e).attrs["segments"] = int64_t(-2); },
                      "attribute 'segments' is -2");
  expectMultiRejected([&](Executable &e) { instr(e).attrs["segments"] = 2.5; },
                      "attribute 'segments' expected int");
  expectMultiRejected([&](Executable &e) { instr(e).attrs["segments"] = int64_t(5); },
                      "the 12 operands and 6 results do not split evenly into "
                      "5 segments");
  // Segment 1's g (operand #5) of another shape, another dtype; its lr
  // (operand #7) not rank 0; a result of segment 2 of another shape.
  expectMultiRejected(
      [&](Executable &e) { e.values[instr(e).operands[5]].type = tt({4}); },
      "segment 1: operand #5 is 4xf32, expected the fused shape of the "
      "results or rank 0");
  expectMultiRejected(
      [&](Executable &e) {
        e.values[instr(e).operands[5]].type = tt({3, 7}, DType::BF16);
      },
      "segment 1: operand #5 is 3x7xbf16, expected the element type and "
      "rank-0-ness of operand #1 (10xf32)");
  expectMultiRejected(
      [&](Executable &e) {
        int32_t lr1 = e.programs[0].instrs[0].operands[4 + 1]; // g1
        e.programs[0].instrs[0].operands[7] = lr1;
      },
      "segment 1: operand #7 is 3x7xf32, expected the element type and "
      "rank-0-ness of operand #3 (f32)");
  expectMultiRejected(
      [&](Executable &e) { e.values[instr(e).results[5]].type = tt({2}); },
      "segment 2: result #5 is 2xf32, expected the fused shape of result #4 "
      "(1xf32)");
  expectMultiRejected(
      [&](Executable &e) { instr(e).attrs["outputs"] = std::vector<int64_t>{7}; },
      "attribute 'outputs' names 1 registers, expected one per result (2 per "
      "segment)");
}

TEST(FusedKernel, MultiTensorIsBitwiseOneInstructionPerSegment) {
  // Segments of 5000 (blocks and a tail), 3, 0, 7000 and 1 elements, f32,
  // each with its own lr (a rank-0 input: its broadcast row is refilled
  // where a worker's blocks cross into the next segment); the segments'
  // blocks form one parallel loop, split across segments. Then in place,
  // as the memory planner arranges for optimizer updates.
  std::vector<int64_t> sizes = {5000, 3, 0, 7000, 1};
  std::vector<float> lrs = {0.0137f, 0.5f, 0.25f, -0.003f, 2.0f};
  TensorType st = tt({});
  std::vector<std::vector<float>> m, g, p, m1, p1, m2, p2;
  std::vector<TensorRef> ins, outs, insInPlace, outsInPlace;
  for (size_t s = 0; s < sizes.size(); ++s) {
    int64_t n = sizes[s];
    m.push_back(randomVec<float>(n, 10 + s));
    g.push_back(randomVec<float>(n, 20 + s));
    p.push_back(randomVec<float>(n, 30 + s));
    m1.emplace_back(n);
    p1.emplace_back(n);
    m2.emplace_back(n);
    p2.emplace_back(n);
  }
  std::vector<std::vector<float>> mi = m, pi = p;
  for (size_t s = 0; s < sizes.size(); ++s) {
    TensorType vt = tt({sizes[s]});
    float &lr = lrs[s];
    Status one = run(fused::kOpName,
                     {ref(m[s].data(), vt), ref(g[s].data(), vt),
                      ref(p[s].data(), vt), ref(&lr, st)},
                     {ref(m1[s].data(), vt), ref(p1[s].data(), vt)},
                     attrsOf(momentumProgram()));
    ASSERT_TRUE(one.isOk()) << one.message();
    ins.insert(ins.end(), {ref(m[s].data(), vt), ref(g[s].data(), vt),
                           ref(p[s].data(), vt), ref(&lr, st)});
    outs.insert(outs.end(), {ref(m2[s].data(), vt), ref(p2[s].data(), vt)});
    insInPlace.insert(insInPlace.end(),
                      {ref(mi[s].data(), vt), ref(g[s].data(), vt),
                       ref(pi[s].data(), vt), ref(&lr, st)});
    outsInPlace.insert(outsInPlace.end(),
                       {ref(mi[s].data(), vt), ref(pi[s].data(), vt)});
  }
  fused::Program prog = momentumProgram();
  prog.numSegments = int32_t(sizes.size());
  Status s = run(fused::kOpName, ins, outs, attrsOf(prog));
  ASSERT_TRUE(s.isOk()) << s.message();
  s = run(fused::kOpName, insInPlace, outsInPlace, attrsOf(prog));
  ASSERT_TRUE(s.isOk()) << s.message();
  for (size_t k = 0; k < sizes.size(); ++k) {
    size_t bytes = size_t(sizes[k]) * sizeof(float);
    if (bytes == 0)
      continue; // data() may be null, and memcmp(null, ...) is UB
    EXPECT_EQ(0, std::memcmp(m1[k].data(), m2[k].data(), bytes)) << k;
    EXPECT_EQ(0, std::memcmp(p1[k].data(), p2[k].data(), bytes)) << k;
    EXPECT_EQ(0, std::memcmp(m1[k].data(), mi[k].data(), bytes)) << k;
    EXPECT_EQ(0, std::memcmp(p1[k].data(), pi[k].data(), bytes)) << k;
  }
}

TEST(FusedProgram, MultiTensorInPlaceStaysWithinASegment) {
  // Each segment's new m and p take the bytes of its own m and p.
  Executable exe = multiPlan(DType::F32, /*params=*/true);
  ASSERT_TRUE(exe.validate().isOk()) << exe.validate().message();
  auto pairs = findInPlaceUpdates(exe, exe.programs[0]);
  EXPECT_EQ(pairs.size(), 6u);
  const Instr &in = exe.programs[0].instrs[0];
  for (auto [t, a] : pairs) {
    size_t rt = std::find(in.results.begin(), in.results.end(), t) -
                in.results.begin();
    size_t op = std::find(in.operands.begin(), in.operands.end(), a) -
                in.operands.begin();
    EXPECT_EQ(rt / 2, op / 4) << "result %" << t << " takes %" << a;
  }
  // A result whose param another segment reads (segment 0's g := segment
  // 1's p) may not take its bytes: the segments run concurrently on a GPU.
  Executable cross = multiPlan(DType::F32, true, {{4}, {4}},
                               [](std::vector<int32_t> &ops) { ops[1] = ops[6]; });
  ASSERT_TRUE(cross.validate().isOk()) << cross.validate().message();
  const Instr &ci = cross.programs[0].instrs[0];
  for (auto [t, a] : findInPlaceUpdates(cross, cross.programs[0]))
    EXPECT_NE(a, ci.operands[6]) << "result %" << t << " takes segment 1's p";
  EXPECT_EQ(findInPlaceUpdates(cross, cross.programs[0]).size(), 3u);
}

} // namespace
} // namespace dlopt::rt::test
