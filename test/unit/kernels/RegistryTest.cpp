//===- RegistryTest.cpp - op coverage, unknown ops, thread determinism ----===//

#include "KernelTestUtil.h"

using namespace kt;

namespace {

TEST(Registry, EveryDocumentedOpHasAKernel) {
  for (const char *op :
       {"neg",        "abs",           "relu",       "exp",
        "log",        "sqrt",          "rsqrt",      "tanh",
        "sin",        "cos",           "sigmoid",    "silu",
        "gelu",       "cast",          "add",        "sub",
        "mul",        "div",           "maximum",    "minimum",
        "pow",        "compare",       "select",     "sum",
        "mean",       "max",           "matmul",     "reshape",
        "transpose",  "broadcast_to",  "concat",     "slice",
        "gather",     "iota",          "softmax",    "log_softmax",
        "layer_norm", "rms_norm",      "attention",  "rope",
        "conv2d",     "max_pool2d",    "avg_pool2d", "batch_norm",
        "dropout",    "cross_entropy", "mse",
        // Gradient ops.
        "scatter_add", "softmax_grad", "log_softmax_grad", "layer_norm_grad",
        "rms_norm_grad", "attention_grad", "conv2d_grad_input",
        "conv2d_grad_filter", "max_pool2d_grad", "avg_pool2d_grad",
        "batch_norm_grad", "cross_entropy_grad", "gelu_grad", "slice_grad"})
    EXPECT_TRUE(cpu::hasKernel(op)) << op;
  EXPECT_FALSE(cpu::hasKernel("foo"));
}

TEST(Registry, UnknownOpAndWrongCounts) {
  Tensor x(DType::F32, {2}), y(DType::F32, {2});
  Status s = run(makeInstr("foo"), {&x}, {&y});
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("op 'foo' at test.mlir:1:1: unknown op"),
            std::string::npos)
      << s.message();
  // Without the verifier, the kernel registry still names an unknown op.
  TensorRef in = x.ref(), out = y.ref();
  s = cpu::runKernel(makeInstr("foo"), std::span<const TensorRef>(&in, 1),
                     std::span<const TensorRef>(&out, 1));
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("no CPU kernel for op 'foo'"), std::string::npos)
      << s.message();
  Tensor z(DType::F32, {2});
  s = run(makeInstr("neg"), {&x}, {&y, &z});
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("result(s)"), std::string::npos) << s.message();
}

// The op table (runtime/format/OpTable.h) and the CPU kernels list the same
// ops: every computing op of the table has a kernel, every kernel is in the
// table, and communication ops are the backend's, not the kernels'.
TEST(Registry, MatchesTheOpTable) {
  for (const OpInfo &op : opTable())
    EXPECT_EQ(cpu::hasKernel(op.name), !op.communication) << op.name;
  for (const char *op : {"all_reduce", "all_gather", "reduce_scatter",
                         "all_slice", "all_to_all", "broadcast"}) {
    ASSERT_NE(findOp(op), nullptr) << op;
    EXPECT_TRUE(findOp(op)->communication) << op;
    EXPECT_TRUE(isCommunicationOp(op)) << op;
  }
  EXPECT_EQ(findOp("foo"), nullptr);
  EXPECT_FALSE(isCommunicationOp("matmul"));
}

/// Runs a mix of multi-threaded kernels and returns their output bytes.
std::vector<std::vector<uint64_t>> runMix(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint64_t>> outs;
  Tensor x = randomTensor(rng, DType::F32, {256, 513});
  Tensor w = randomTensor(rng, DType::F32, {513});
  auto keep = [&](const Instr &in, std::vector<const Tensor *> ins, Shape shape,
                  DType dt = DType::F32) {
    Tensor y(dt, shape);
    EXPECT_TRUE(run(in, ins, {&y}).isOk()) << in.op;
    outs.push_back(y.storage);
  };
  keep(makeInstr("exp"), {&x}, {256, 513});
  keep(makeInstr("add"), {&x, &w}, {256, 513});
  keep(makeInstr("sum", {{"dims", std::vector<int64_t>{0}}}), {&x}, {513});
  keep(makeInstr("sum", {{"dims", std::vector<int64_t>{1}}}), {&x}, {256});
  keep(makeInstr("softmax", {{"dim", int64_t(1)}}), {&x}, {256, 513});
  keep(makeInstr("softmax", {{"dim", int64_t(0)}}), {&x}, {256, 513});
  keep(makeInstr("layer_norm",
                 {{"has_weight", int64_t(1)}, {"has_bias", int64_t(0)}}),
       {&x, &w}, {256, 513});
  keep(makeInstr("mse"), {&x, &x}, {});
  keep(makeInstr("transpose", {{"perm", std::vector<int64_t>{1, 0}}}), {&x},
       {513, 256});
  keep(makeInstr("dropout", {{"rate", 0.3}, {"seed", int64_t(5)}}), {&x},
       {256, 513});
  Tensor q = randomTensor(rng, DType::F32, {1, 4, 64, 32});
  Tensor k = randomTensor(rng, DType::F32, {1, 2, 64, 32});
  keep(makeInstr("attention", {{"causal", int64_t(1)}, {"scale", 0.2}}),
       {&q, &k, &k}, {1, 4, 64, 32});
  Tensor img = randomTensor(rng, DType::F32, {2, 4, 32, 32});
  Tensor f = randomTensor(rng, DType::F32, {8, 4, 3, 3});
  keep(makeInstr("conv2d", {{"padding", std::vector<int64_t>{1, 1}}}),
       {&img, &f}, {2, 8, 32, 32});
  return outs;
}

TEST(Threads, ResultsIndependentOfThreadCount) {
  KT_SEEDED_RNG(rng);
  uint32_t seed = rng();
  int saved = cpu::numThreads();
  cpu::setNumThreads(1);
  EXPECT_EQ(cpu::numThreads(), 1);
  auto one = runMix(seed);
  cpu::setNumThreads(2);
  auto two = runMix(seed);
  cpu::setNumThreads(5);
  auto five = runMix(seed);
  cpu::setNumThreads(saved);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_TRUE(one[i] == two[i]) << "kernel #" << i;
    EXPECT_TRUE(one[i] == five[i]) << "kernel #" << i;
  }
}

} // namespace
