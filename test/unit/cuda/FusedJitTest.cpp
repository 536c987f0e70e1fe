//===- FusedJitTest.cpp - Generated fused kernels compile, register-only --===//
//
// NVRTC runs on the host, so these run on any machine with the CUDA toolkit
// (they skip, saying why, without libnvrtc). The kernels' results are
// checked on a GPU by CudaBackendTest's fused cases (CudaGpu*), against the
// CPU backend and the interpreter.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/FusedJit.h"
#include "runtime/support/DType.h"

#include <gtest/gtest.h>

#include <regex>

using namespace dlopt::rt;
using namespace dlopt::rt::cuda;
using kernels::BinaryOp;
using kernels::FusedStep;
using kernels::UnaryOp;

namespace {

FusedStep un(UnaryOp op, int a) {
  return {0, uint8_t(op), uint8_t(a), 0};
}
FusedStep bin(BinaryOp op, int a, int b) {
  return {1, uint8_t(op), uint8_t(a), uint8_t(b)};
}
FusedStep castTo(DType t, int a) { return {2, uint8_t(t), uint8_t(a), 0}; }
FusedStep cmp(kernels::ComparePred p, int a, int b) {
  return {3, uint8_t(p), uint8_t(a), uint8_t(b)};
}
FusedStep select(int cond, int a, int b) {
  return {4, 0, uint8_t(cond), uint8_t(a), uint8_t(b)};
}

/// AdamW with a rank-0 lr, every unary and binary op, a cast, a compare and
/// a select, and results
/// in f32 and `t` (as CudaBackendTest's fused case).
FusedJitProgram adamw(DType t, bool multi) {
  FusedJitProgram p;
  p.multi = multi;
  p.numInputs = 5; // 0 g, 1 m, 2 v, 3 w, 4 lr
  for (int k = 0; k < 5; ++k)
    p.inType[k] = uint8_t(t);
  p.inScalar[4] = 1;
  const float consts[] = {0.9f, 0.1f, 0.999f, 0.001f, 1e-8f, 0.01f}; // 5..10
  p.numConsts = 6;
  for (int c = 0; c < 6; ++c)
    p.consts[c] = consts[c];
  std::vector<FusedStep> steps = {
      bin(BinaryOp::Mul, 1, 5),  bin(BinaryOp::Mul, 0, 6),
      bin(BinaryOp::Add, 11, 12),                                 // 13 m'
      bin(BinaryOp::Mul, 2, 7),  bin(BinaryOp::Mul, 0, 0),
      bin(BinaryOp::Mul, 15, 8), bin(BinaryOp::Add, 14, 16),       // 17 v'
      un(UnaryOp::Sqrt, 17),     bin(BinaryOp::Add, 18, 9),
      bin(BinaryOp::Div, 13, 19), bin(BinaryOp::Mul, 3, 10),
      bin(BinaryOp::Add, 20, 21), bin(BinaryOp::Mul, 22, 4),
      bin(BinaryOp::Sub, 3, 23),                                  // 24 w'
      un(UnaryOp::Tanh, 24),     un(UnaryOp::GeluErf, 25),
      bin(BinaryOp::Max, 26, 0), castTo(DType::BF16, 27),
      un(UnaryOp::Exp, 28),      bin(BinaryOp::GeluTanhGrad, 29, 0),
      bin(BinaryOp::Pow, 30, 5), bin(BinaryOp::Min, 31, 1)};       // 32
  for (UnaryOp u : {UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu, UnaryOp::Log,
                    UnaryOp::Rsqrt, UnaryOp::Sigmoid, UnaryOp::Silu,
                    UnaryOp::GeluTanh})
    steps.push_back(un(u, int(5 + 6 + steps.size()) - 1));
  steps.push_back(bin(BinaryOp::GeluErfGrad, int(11 + steps.size()) - 1, 2));
  // ReLU's gradient shape: select(prev > g, prev, m).
  steps.push_back(cmp(kernels::ComparePred::Gt, int(11 + steps.size()) - 1, 0));
  steps.push_back(select(int(11 + steps.size()) - 1,
                         int(11 + steps.size()) - 2, 1));
  p.numSteps = int32_t(steps.size());
  for (size_t s = 0; s < steps.size(); ++s)
    p.steps[s] = steps[s];
  p.numOutputs = 4;
  const uint8_t regs[] = {13, 17, 24, uint8_t(11 + steps.size() - 1)};
  for (int o = 0; o < 4; ++o) {
    p.outReg[o] = regs[o];
    p.outType[o] = uint8_t(o == 3 ? DType::F32 : t);
  }
  return p;
}

bool haveNvrtc(std::string *why) {
  auto v = nvrtcVersion();
  if (!v)
    *why = v.status().message();
  return bool(v);
}

/// ptxas's "N bytes stack frame" figures in a verbose log.
std::vector<int> stackFrames(const std::string &log) {
  std::vector<int> out;
  std::regex re("([0-9]+) bytes stack frame");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re);
       it != std::sregex_iterator(); ++it)
    out.push_back(std::stoi((*it)[1].str()));
  return out;
}

} // namespace

TEST(FusedJit, SourceNamesEveryStepAndResult) {
  auto src = fusedJitSource(adamw(DType::BF16, false));
  ASSERT_TRUE(src) << src.status().message();
  EXPECT_NE(src->find("extern \"C\" __global__"), std::string::npos);
  EXPECT_NE(src->find(kFusedJitEntry), std::string::npos);
  // The rank-0 lr is read once, outside the element loop.
  EXPECT_NE(src->find("const float s4 = toF(*static_cast<const BF16 *>(p4));"),
            std::string::npos)
      << *src;
  // The cast step rounds through bf16; results are stored in their types.
  EXPECT_NE(src->find("toF(fromF<BF16>(r27))"), std::string::npos) << *src;
  EXPECT_NE(src->find("storeVec<float>(q3"), std::string::npos) << *src;
  EXPECT_NE(src->find("storeVec<BF16>(q0"), std::string::npos) << *src;
  // Comparisons give 1.0/0.0; select reads its condition against 0.
  EXPECT_NE(src->find("compareF(ComparePred(4), r41, r0)"), std::string::npos)
      << *src;
  EXPECT_NE(src->find("(r42 != 0.0f ? r41 : r1)"), std::string::npos) << *src;
  // Constants are bit-exact: 0.9f is 0x3f666666.
  EXPECT_NE(src->find("__uint_as_float(0x3f666666u)"), std::string::npos);
  auto multi = fusedJitSource(adamw(DType::BF16, true));
  ASSERT_TRUE(multi);
  EXPECT_NE(multi->find("const FusedMultiArgs args"), std::string::npos);
  EXPECT_NE(multi->find("args.inSlot[4] < 0 ? args.shared[4]"),
            std::string::npos);
}

TEST(FusedJit, KeySeparatesProgramsThatDiffer) {
  FusedJitProgram a = adamw(DType::F32, false);
  FusedJitProgram b = a;
  EXPECT_EQ(a.key(), b.key());
  b.consts[2] = 0.99f;
  EXPECT_NE(a.key(), b.key());
  b = a;
  b.inType[0] = uint8_t(DType::F16);
  EXPECT_NE(a.key(), b.key());
  b = a;
  b.multi = true;
  EXPECT_NE(a.key(), b.key());
  b = a;
  b.inScalar[1] = 1;
  EXPECT_NE(a.key(), b.key());
  // Entries past the used counts are not part of the program.
  b = a;
  b.consts[a.numConsts + 1] = 5.0f;
  b.steps[a.numSteps + 1] = bin(BinaryOp::Add, 0, 0);
  EXPECT_EQ(a.key(), b.key());
}

TEST(FusedJit, BadProgramsAreRefused) {
  FusedJitProgram p = adamw(DType::F32, false);
  p.steps[3].a = uint8_t(5 + 6 + 3); // reads its own register
  auto src = fusedJitSource(p);
  ASSERT_FALSE(src);
  EXPECT_NE(src.status().message().find("step 3 reads a register not yet "
                                        "defined"),
            std::string::npos)
      << src.status().message();
  p = adamw(DType::F32, false);
  p.inType[2] = uint8_t(DType::I32);
  src = fusedJitSource(p);
  ASSERT_FALSE(src);
  EXPECT_NE(src.status().message().find("not a float type"), std::string::npos);
  p = adamw(DType::F32, false);
  p.outReg[1] = 200;
  EXPECT_FALSE(fusedJitSource(p));
  p = adamw(DType::F32, false);
  p.steps[0].kind = 7;
  EXPECT_FALSE(fusedJitSource(p));
}

// Every form and dtype compiles for Ampere and Hopper with every register
// in hardware registers: no stack frame, no spills (the interpreter has a
// 1824-byte frame).
TEST(FusedJit, CompilesWithoutLocalMemory) {
  std::string why;
  if (!haveNvrtc(&why))
    GTEST_SKIP() << why;
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (bool multi : {false, true})
      for (int arch : {80, 90}) {
        SCOPED_TRACE(std::string(dtypeName(t)) + (multi ? " multi" : "") +
                     " sm_" + std::to_string(arch));
        auto src = fusedJitSource(adamw(t, multi));
        ASSERT_TRUE(src) << src.status().message();
        auto bin = compileFusedJit(*src, arch, /*verbose=*/true);
        ASSERT_TRUE(bin) << bin.status().message();
        EXPECT_GT(bin->cubin.size(), 1000u);
        std::vector<int> frames = stackFrames(bin->log);
        ASSERT_FALSE(frames.empty()) << bin->log;
        for (int f : frames)
          EXPECT_EQ(f, 0) << bin->log;
        EXPECT_NE(bin->log.find("0 bytes spill stores, 0 bytes spill loads"),
                  std::string::npos)
            << bin->log;
      }
}

TEST(FusedJit, CompileErrorsCarryTheLog) {
  std::string why;
  if (!haveNvrtc(&why))
    GTEST_SKIP() << why;
  auto bin = compileFusedJit("extern \"C\" __global__ void dlopt_fused() { "
                             "undefined_name(); }",
                             90);
  ASSERT_FALSE(bin);
  EXPECT_NE(bin.status().message().find("undefined_name"), std::string::npos)
      << bin.status().message();
}

// sinf and cosf reduce large arguments through a small local array (32
// bytes of frame once they sit in a long program, as in the nvcc-built unary
// kernel); the common path stays in registers and nothing spills. Hence
// adamw() leaves them out of the no-frame check above.
TEST(FusedJit, SinCosCompile) {
  std::string why;
  if (!haveNvrtc(&why))
    GTEST_SKIP() << why;
  FusedJitProgram p;
  p.numInputs = 1;
  p.inType[0] = uint8_t(DType::F32);
  p.numSteps = 2;
  p.steps[0] = un(UnaryOp::Sin, 0);
  p.steps[1] = un(UnaryOp::Cos, 1);
  p.numOutputs = 1;
  p.outReg[0] = 2;
  p.outType[0] = uint8_t(DType::F32);
  auto src = fusedJitSource(p);
  ASSERT_TRUE(src) << src.status().message();
  auto bin = compileFusedJit(*src, 90, /*verbose=*/true);
  ASSERT_TRUE(bin) << bin.status().message();
  EXPECT_NE(bin->log.find("0 bytes spill stores, 0 bytes spill loads"),
            std::string::npos)
      << bin->log;
}
