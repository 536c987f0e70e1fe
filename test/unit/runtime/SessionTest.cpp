//===- SessionTest.cpp - The executor end to end on the CPU backend -------===//

#include "TestUtil.h"

#include "runtime/exec/CpuBackend.h"
#include "runtime/exec/ParamInit.h"
#include "runtime/exec/Session.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace dlopt::rt;
using namespace dlopt::rt::test;

namespace {

/// loss = sum(matmul(x, w) + b + c), also returning the pre-sum tensor.
Executable linearModel() {
  ExeBuilder b;
  int32_t x = b.input("x", tt({2, 3}));
  int32_t w = b.param("w", tt({3, 4}), Init{"normal", 0.0, 0.5});
  int32_t bias = b.param("b", tt({4}), Init{"ones"});
  int32_t c = b.constant(tt({4}), {0.5f, -1.0f, 2.0f, 0.25f});
  int32_t y = b.op("matmul", {x, w}, tt({2, 4}),
                   {{"transpose_a", int64_t(0)}, {"transpose_b", int64_t(0)}});
  int32_t z = b.op("add", {y, bias}, tt({2, 4}));
  int32_t z2 = b.op("add", {z, c}, tt({2, 4}));
  int32_t loss = b.op("sum", {z2}, tt({}),
                      {{"dims", std::vector<int64_t>{0, 1}},
                       {"keepdims", int64_t(0)}});
  b.output("loss", loss);
  b.output("z", z2);
  return b.build();
}

std::unique_ptr<Session> makeSession(Executable exe, uint64_t seed = 0) {
  Expected<std::unique_ptr<Session>> s = Session::create(
      std::move(exe), std::make_unique<CpuBackend>(), SessionOptions{0, seed});
  EXPECT_TRUE(s.isOk()) << s.status().message();
  return s ? s.take() : nullptr;
}

HostTensor randomTensor(const TensorType &t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  HostTensor h(t);
  for (int64_t i = 0; i < h.numElements(); ++i)
    h.setElementFromDouble(i, u(rng));
  return h;
}

} // namespace

// Reshape views (the memory plan gives a reshape of a temporary its
// operand's bytes) compute what copies do: y = reshape(-x + ...) read late.
TEST(Session, ReshapeViewsComputeWhatCopiesDo) {
  ExeBuilder b;
  int32_t x = b.input("x", tt({4, 8}));
  int32_t t1 = b.op("neg", {x}, tt({4, 8}));
  int32_t t2 = b.op("reshape", {t1}, tt({32}));
  int32_t t3 = b.op("reshape", {t2}, tt({8, 4}));
  int32_t t4 = b.op("neg", {t3}, tt({8, 4}));
  int32_t t5 = b.op("neg", {t4}, tt({8, 4}));
  int32_t t6 = b.op("add", {t5, t3}, tt({8, 4}));
  int32_t t7 = b.op("reshape", {t6}, tt({32}));
  b.output("y", t7);
  Executable exe = b.build();
  ASSERT_EQ(exe.programs[0].memory.offsets[t3],
            exe.programs[0].memory.offsets[t1]);
  auto s = makeSession(exe, 1);
  ASSERT_TRUE(s);
  HostTensor xv = randomTensor(tt({4, 8}), 5);
  ASSERT_TRUE(s->bind("x", xv).isOk());
  Expected<std::vector<NamedTensor>> out = s->run();
  ASSERT_TRUE(out.isOk()) << out.status().message();
  for (int64_t i = 0; i < 32; ++i)
    EXPECT_EQ((*out)[0].tensor.elementAsDouble(i), -2.0 * xv.elementAsDouble(i))
        << i;
}

TEST(Session, LinearModelMatchesReference) {
  auto s = makeSession(linearModel(), 17);
  ASSERT_TRUE(s);
  HostTensor x = randomTensor(tt({2, 3}), 1);
  ASSERT_TRUE(s->bind("x", x, "x.npy").isOk());
  Expected<std::vector<NamedTensor>> out = s->run();
  ASSERT_TRUE(out.isOk()) << out.status().message();
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[0].name, "loss");
  EXPECT_EQ((*out)[1].name, "z");

  // Reference in double from the params the session initialized.
  Expected<HostTensor> w = s->readArgument("w");
  ASSERT_TRUE(w.isOk());
  Expected<HostTensor> expectW = initParam(tt({3, 4}), Init{"normal", 0.0, 0.5}, 17, 0);
  EXPECT_EQ(w->bytes, expectW->bytes);
  const float c[4] = {0.5f, -1.0f, 2.0f, 0.25f};
  double loss = 0;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      double acc = 0;
      for (int k = 0; k < 3; ++k)
        acc += x.elementAsDouble(i * 3 + k) * w->elementAsDouble(k * 4 + j);
      double z = acc + 1.0 + c[j];
      EXPECT_NEAR((*out)[1].tensor.elementAsDouble(i * 4 + j), z, 1e-5);
      loss += z;
    }
  EXPECT_EQ((*out)[0].tensor.type, tt({}));
  EXPECT_NEAR((*out)[0].tensor.elementAsDouble(0), loss, 1e-4);

  // Running again gives bitwise the same result (params are kept).
  Expected<std::vector<NamedTensor>> again = s->run();
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ((*again)[1].tensor.bytes, (*out)[1].tensor.bytes);

  MemoryReport m = s->memory();
  EXPECT_EQ(m.plannedBytes, m.persistentBytes + m.scratchBytes);
  EXPECT_GE(m.allocatedBytes, m.plannedBytes);
  EXPECT_LT(m.allocatedBytes, m.plannedBytes + 64);
  EXPECT_EQ(m.peakAllocatedBytes, m.allocatedBytes);
  EXPECT_GT(s->lastRunSeconds(), 0.0);
}

TEST(Session, BoundParamsOverrideInit) {
  auto s = makeSession(linearModel());
  ASSERT_TRUE(s);
  HostTensor w(tt({3, 4})); // zeros
  ASSERT_TRUE(s->bind("w", w).isOk());
  ASSERT_TRUE(s->bind("x", randomTensor(tt({2, 3}), 2)).isOk());
  Expected<std::vector<NamedTensor>> out = s->run();
  ASSERT_TRUE(out.isOk()) << out.status().message();
  // matmul with zero weights: loss = 2 * sum(1 + c) = 2 * (4 + 1.75).
  EXPECT_NEAR((*out)[0].tensor.elementAsDouble(0), 11.5, 1e-6);
}

TEST(Session, SeedChangesInitButIsDeterministic) {
  auto run = [](uint64_t seed) {
    auto s = makeSession(linearModel(), seed);
    EXPECT_TRUE(s->bind("x", randomTensor(tt({2, 3}), 3)).isOk());
    return s->run()->at(1).tensor.bytes;
  };
  EXPECT_EQ(run(1), run(1));
  EXPECT_NE(run(1), run(2));
}

TEST(Session, BindingErrors) {
  auto s = makeSession(linearModel());
  ASSERT_TRUE(s);
  Status st = s->bind("x", HostTensor(tt({2, 8})), "x.npy");
  EXPECT_EQ(st.message(), "input 'x': expected 2x3xf32, got 2x8xf32 from x.npy");
  st = s->bind("x", HostTensor(tt({2, 3}, DType::I32)));
  EXPECT_EQ(st.message(), "input 'x': expected 2x3xf32, got 2x3xi32");
  st = s->bind("w", HostTensor(tt({4, 3})), "w.npy");
  EXPECT_EQ(st.message(), "param 'w': expected 3x4xf32, got 4x3xf32 from w.npy");
  st = s->bind("nope", HostTensor(tt({1})));
  EXPECT_EQ(st.message(), "no input or param named 'nope' (known: x, w, b)");
  HostTensor broken(tt({2, 3}));
  broken.bytes.pop_back();
  EXPECT_TRUE(contains(s->bind("x", broken).message(), "holds 23 bytes"));

  Expected<std::vector<NamedTensor>> out = s->run();
  ASSERT_FALSE(out.isOk());
  EXPECT_EQ(out.status().message(), "missing input 'x' (2x3xf32)");
  EXPECT_EQ(s->missingInputs(), std::vector<std::string>{"x"});
}

TEST(Session, Bf16AcceptsFloat32) {
  ExeBuilder b;
  int32_t x = b.input("x", tt({4}, DType::BF16));
  int32_t y = b.op("neg", {x}, tt({4}, DType::BF16));
  b.output("y", y);
  auto s = makeSession(b.build());
  ASSERT_TRUE(s);
  HostTensor f(tt({4}));
  for (int i = 0; i < 4; ++i)
    f.setElementFromDouble(i, 1.0 + i / 3.0);
  ASSERT_TRUE(s->bind("x", f).isOk());
  Expected<std::vector<NamedTensor>> out = s->run();
  ASSERT_TRUE(out.isOk()) << out.status().message();
  EXPECT_EQ((*out)[0].tensor.type, tt({4}, DType::BF16));
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR((*out)[0].tensor.elementAsDouble(i), -(1.0 + i / 3.0), 1e-2);
  // The reverse is not converted: an f32 value needs f32 data.
  Status st = s->bind("x", HostTensor(tt({4}, DType::F16)));
  EXPECT_EQ(st.message(), "input 'x': expected 4xbf16, got 4xf16");
}

TEST(Session, RejectsUnsupportedOpsOnLoad) {
  ExeBuilder b;
  int32_t x = b.input("x", tt({4}));
  int32_t y = b.op("frobnicate", {x}, tt({4}));
  b.output("y", y);
  Expected<std::unique_ptr<Session>> s =
      Session::create(b.build(), std::make_unique<CpuBackend>());
  ASSERT_FALSE(s.isOk());
  // The op table (runtime/format/OpTable.h) refuses it before any backend
  // is asked.
  EXPECT_EQ(s.status().message(),
            "invalid executable: program 0 (ranks 0): instruction 0 "
            "('frobnicate' at test.mlir:1:3): unknown op (docs/ops.md lists "
            "the runtime's ops)");
}

TEST(Session, RejectsInvalidExecutable) {
  Executable exe = linearModel();
  exe.programs[0].memory.scratchBytes = 0;
  Expected<std::unique_ptr<Session>> s =
      Session::create(exe, std::make_unique<CpuBackend>());
  ASSERT_FALSE(s.isOk());
  EXPECT_TRUE(contains(s.status().message(), "invalid executable: "));
  Expected<std::unique_ptr<Session>> r = Session::create(
      linearModel(), std::make_unique<CpuBackend>(), SessionOptions{3, 0});
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().message(),
            "rank 3 out of range: the executable has 1 rank(s)");
}

TEST(Session, KernelErrorsNameTheInstruction) {
  ExeBuilder b;
  int32_t a = b.input("a", tt({2}, DType::I32));
  int32_t d = b.input("d", tt({2}, DType::I32));
  int32_t q = b.op("div", {a, d}, tt({2}, DType::I32));
  b.output("q", q);
  auto s = makeSession(b.build());
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->bind("a", HostTensor(tt({2}, DType::I32))).isOk());
  ASSERT_TRUE(s->bind("d", HostTensor(tt({2}, DType::I32))).isOk());
  Expected<std::vector<NamedTensor>> out = s->run();
  ASSERT_FALSE(out.isOk());
  // The session names the instruction; the kernel names the op and its
  // location (once).
  EXPECT_TRUE(contains(out.status().message(),
                       "rank 0, instruction 0: op 'div' at test.mlir:1:3: "))
      << out.status().message();
}

TEST(Session, OutputsMayBeArguments) {
  ExeBuilder b;
  int32_t x = b.input("x", tt({3}));
  int32_t p = b.param("p", tt({2}), Init{"constant", 0, 1, 0, 1, 2.5});
  b.output("x_again", x);
  b.output("p", p);
  auto s = makeSession(b.build());
  ASSERT_TRUE(s);
  HostTensor xv = randomTensor(tt({3}), 4);
  ASSERT_TRUE(s->bind("x", xv).isOk());
  Expected<std::vector<NamedTensor>> out = s->run();
  ASSERT_TRUE(out.isOk()) << out.status().message();
  EXPECT_EQ((*out)[0].tensor.bytes, xv.bytes);
  EXPECT_EQ((*out)[1].tensor.elementAsDouble(1), 2.5);
}

TEST(Session, EmptyProgramAndArena) {
  ExeBuilder b;
  Expected<std::unique_ptr<Session>> s =
      Session::create(b.build(), std::make_unique<CpuBackend>());
  ASSERT_TRUE(s.isOk()) << s.status().message();
  Expected<std::vector<NamedTensor>> out = (*s)->run();
  ASSERT_TRUE(out.isOk());
  EXPECT_TRUE(out->empty());
}

TEST(Backend, RegistryAndBounds) {
  Expected<std::unique_ptr<Backend>> cpu = createBackend("cpu");
  ASSERT_TRUE(cpu.isOk());
  EXPECT_EQ((*cpu)->name(), "cpu");
  EXPECT_TRUE((*cpu)->supportsOp("matmul"));
  EXPECT_FALSE((*cpu)->supportsOp("frobnicate"));
  Expected<std::unique_ptr<Backend>> bad = createBackend("tpu");
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().message(), "unknown backend 'tpu' (available: cpu)");

  Expected<std::unique_ptr<DeviceArena>> arena = (*cpu)->allocateArena(0, 100);
  ASSERT_TRUE(arena.isOk());
  EXPECT_EQ((*cpu)->bytesAllocated(), 128);
  uint8_t buf[8] = {};
  EXPECT_TRUE((*cpu)->copyToDevice(**arena, 92, buf, 8).isOk());
  EXPECT_FALSE((*cpu)->copyToDevice(**arena, 96, buf, 8).isOk());
  EXPECT_FALSE((*cpu)->copyToHost(buf, **arena, -1, 1).isOk());
  arena->reset();
  EXPECT_EQ((*cpu)->bytesAllocated(), 0);
  EXPECT_EQ((*cpu)->peakBytesAllocated(), 128);
}
