//===- CudaBackendTest.cpp - The cuda backend against the cpu backend -----===//
//
// Without a GPU: the backend's error is the documented one, its op list is
// exact (a subset of the CPU kernels, plus every communication op) and the
// build says whether it has kernels. With a GPU (tests named CudaGpu*, ctest label
// `gpu`, skipped with the reason elsewhere): every supported op, for every
// float dtype it takes, runs on random data through a Session on both
// backends and the outputs agree within per-dtype tolerances (ints, i1 and
// data movement exactly); device-side errors name their op. Every case is
// also run on the CPU backend alone, GPU or not, to check it is well formed.
// Multi-rank executables (every communication op, a context-parallel
// attention step with offsets) run as a World of cuda ranks against one of
// cpu ranks (CudaGpuWorld*).
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/CpuKernels.h"
#include "runtime/cuda/CudaGemm.h"
#include "runtime/cuda/CudaLibrary.h"
#include "runtime/exec/CpuBackend.h"
#include "runtime/exec/CudaBackend.h"
#include "runtime/format/FusedProgram.h"
#include "runtime/cuda/CudaKernels.h"
#include "runtime/exec/Session.h"
#include "runtime/exec/World.h"
#include "test/unit/runtime/TestUtil.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <random>

using namespace dlopt::rt;
namespace kernels = dlopt::rt::cuda::kernels;
using dlopt::rt::test::contains;
using dlopt::rt::test::ExeBuilder;

namespace {

TensorType T(std::vector<int64_t> shape, DType d) { return {d, std::move(shape)}; }

//===--- Without a GPU ------------------------------------------------------===//

TEST(CudaBackend, CreateFailsClearlyWithoutADevice) {
  std::string why;
  int n = cuda::deviceCount(&why);
  auto b = CudaBackend::create();
  if (n > 0) {
    ASSERT_TRUE(b) << b.status().message();
    EXPECT_EQ((*b)->name(), "cuda");
    return;
  }
  ASSERT_FALSE(b);
  EXPECT_TRUE(contains(b.status().message(),
                       "cuda backend: no CUDA device (cudaGetDeviceCount: "))
      << b.status().message();
  std::cout << "no GPU here: " << b.status().message() << "\n";
}

TEST(CudaBackend, SupportedOpsAreExact) {
  std::vector<std::string> ops = CudaBackend::supportedOps();
  ASSERT_FALSE(ops.empty());
  // Every op the cuda backend runs has a CPU reference: a kernel, or the
  // CPU backend's communication code.
  for (const std::string &op : ops)
    EXPECT_TRUE(cpu::hasKernel(op) || isCommunicationOp(op)) << op;
  auto has = [&](const std::string &op) {
    return std::find(ops.begin(), ops.end(), op) != ops.end();
  };
  EXPECT_TRUE(has("matmul"));
  EXPECT_TRUE(has("reshape"));
  // Every communication instruction runs, kernels or not (copies and
  // communicator calls only).
  const std::vector<std::string> comm = {
      "all_gather", "all_reduce",     "all_slice", "all_to_all", "broadcast",
      "recv",       "reduce_scatter", "send",      "send_recv"};
  for (const std::string &op : comm) {
    EXPECT_TRUE(isCommunicationOp(op)) << op;
    EXPECT_TRUE(has(op)) << op;
  }
  // supportsOp must say no to what it cannot run, so plans using it fail
  // at load naming the op.
  for (const char *op : {"barrier", "no_such_op"})
    EXPECT_FALSE(has(op)) << op;
  if (CudaBackend::kernelsBuilt()) {
    for (const char *op :
         {"add", "mul", "cast", "sum", "softmax", "layer_norm",
          "layer_norm_grad", "gelu", "gelu_grad", "gather", "scatter_add",
          "cross_entropy", "cross_entropy_grad", "attention", "attention_grad",
          "dropout", "transpose", "slice", "concat", "broadcast_to", "rope",
          "rms_norm", "rms_norm_grad", "mse", "select", "compare", "iota",
          "fused_elementwise", "conv2d", "conv2d_grad_input",
          "conv2d_grad_filter", "max_pool2d", "avg_pool2d", "max_pool2d_grad",
          "avg_pool2d_grad", "batch_norm", "batch_norm_grad"})
      EXPECT_TRUE(has(op)) << op;
  } else {
    std::vector<std::string> want = comm;
    want.insert(want.end(), {"matmul", "reshape"});
    std::sort(want.begin(), want.end());
    EXPECT_EQ(ops, want);
  }
}

TEST(CudaBackend, BuildDescriptionSaysWhatWasBuilt) {
  std::string d = CudaBackend::buildDescription();
  if (CudaBackend::kernelsBuilt())
    EXPECT_TRUE(contains(d, "kernels: CUDA")) << d;
  else
    EXPECT_TRUE(contains(d, "built without CUDA kernels")) << d;
}

//===--- With a GPU -----------------------------------------------------------===//

/// The backend, or why there is none (the test then skips).
std::unique_ptr<Backend> cudaOrSkip(std::string &why) {
  auto b = CudaBackend::create();
  if (!b) {
    why = b.status().message();
    return nullptr;
  }
  return std::unique_ptr<Backend>(b.take());
}

enum class Dist { Normal, Positive, Ints, Bool };

/// One conformance case: inputs with their random data, ops, outputs.
struct Case {
  ExeBuilder b;
  std::vector<std::pair<std::string, HostTensor>> data;
  std::mt19937_64 rng{12345};
  int outputs = 0;

  int32_t in(TensorType t, Dist d = Dist::Normal, int64_t lo = 0,
             int64_t hi = 1) {
    std::string name = "in" + std::to_string(data.size());
    int32_t id = b.input(name, t);
    HostTensor h(t);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::uniform_real_distribution<double> pos(0.1, 4.0);
    std::uniform_int_distribution<int64_t> ints(lo, hi - 1);
    for (int64_t i = 0; i < h.numElements(); ++i) {
      double v = d == Dist::Normal     ? normal(rng)
                 : d == Dist::Positive ? pos(rng)
                 : d == Dist::Ints     ? double(ints(rng))
                                       : double(ints(rng) % 2);
      h.setElementFromDouble(i, v);
    }
    data.emplace_back(name, std::move(h));
    return id;
  }
  int32_t op(const std::string &name, std::vector<int32_t> operands,
             TensorType t, std::map<std::string, AttrValue> attrs = {}) {
    return b.op(name, std::move(operands), std::move(t), std::move(attrs));
  }
  /// A multi-result op: results are fresh temps of `types`.
  std::vector<int32_t> ops(const std::string &name,
                           std::vector<int32_t> operands,
                           std::vector<TensorType> types,
                           std::map<std::string, AttrValue> attrs = {}) {
    std::vector<int32_t> rs;
    for (TensorType &t : types)
      rs.push_back(b.temp(t));
    Instr in;
    in.op = name;
    in.operands = std::move(operands);
    in.results = rs;
    in.attrs = std::move(attrs);
    in.loc = "conformance:" + std::to_string(b.instrs.size() + 1);
    b.instrs.push_back(in);
    return rs;
  }
  void out(int32_t id) { b.output("out" + std::to_string(outputs++), id); }
};

double tolerance(DType t) {
  switch (t) {
  case DType::F32: return 2e-4;
  case DType::F16: return 5e-3;
  case DType::BF16: return 3e-2;
  default: return 0;
  }
}

/// Runs the case on both backends and compares every output.
void runCase(Case &c, bool exact = false) {
  std::string why;
  std::unique_ptr<Backend> gpu = cudaOrSkip(why);
  if (!gpu)
    GTEST_SKIP() << "no GPU: " << why;
  Executable exe = c.b.build();
  for (const Instr &in : exe.programs[0].instrs)
    if (!gpu->supportsOp(in.op)) {
      if (!CudaBackend::kernelsBuilt())
        GTEST_SKIP() << "op '" << in.op << "': " << CudaBackend::buildDescription();
      FAIL() << "op '" << in.op << "' has no CUDA kernel";
    }
  auto cpuS = Session::create(exe, std::make_unique<CpuBackend>());
  auto gpuS = Session::create(exe, std::move(gpu));
  ASSERT_TRUE(cpuS) << cpuS.status().message();
  ASSERT_TRUE(gpuS) << gpuS.status().message();
  for (const auto &[name, t] : c.data) {
    ASSERT_TRUE((*cpuS)->bind(name, t).isOk());
    ASSERT_TRUE((*gpuS)->bind(name, t).isOk());
  }
  auto want = (*cpuS)->run();
  ASSERT_TRUE(want) << want.status().message();
  auto got = (*gpuS)->run();
  ASSERT_TRUE(got) << got.status().message();
  ASSERT_EQ(got->size(), want->size());
  for (size_t o = 0; o < want->size(); ++o) {
    const HostTensor &w = (*want)[o].tensor, &g = (*got)[o].tensor;
    ASSERT_EQ(g.type, w.type);
    double tol = exact ? 0 : tolerance(w.type.dtype);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < w.numElements(); ++i) {
      double a = w.elementAsDouble(i), x = g.elementAsDouble(i);
      bool ok = (std::isnan(a) && std::isnan(x)) || a == x ||
                (tol > 0 && std::fabs(x - a) <= tol * (1 + std::fabs(a)));
      if (!ok && bad++ == 0)
        first = i;
    }
    EXPECT_EQ(bad, 0) << (*want)[o].name << " (" << w.type.str() << "): "
                      << bad << " of " << w.numElements()
                      << " elements differ; first at " << first << ": cuda "
                      << (first >= 0 ? g.elementAsDouble(first) : 0) << ", cpu "
                      << (first >= 0 ? w.elementAsDouble(first) : 0);
  }
}

struct ConformanceCase {
  std::string name;
  std::function<void(Case &, DType)> build;
  bool floats = true; ///< run once per float dtype (else once, f32)
  bool exact = false;
};

/// attention and attention_grad on fresh q [b, h, s, d], k [b, g, t, d],
/// v [b, g, t, e] and dout: once without the offset operand when `offsets`
/// is empty, else once per offset (a rank-0 input of that type and range).
struct AttentionShape {
  int64_t b, h, g, s, t, d, e;
};
struct OffsetInput {
  DType type;
  int64_t lo, hi;
};
void attentionOps(Case &c, DType dt, AttentionShape a, bool causal,
                  double scale, std::vector<OffsetInput> offsets = {}) {
  int32_t q = c.in(T({a.b, a.h, a.s, a.d}, dt)),
          k = c.in(T({a.b, a.g, a.t, a.d}, dt)),
          v = c.in(T({a.b, a.g, a.t, a.e}, dt)),
          dout = c.in(T({a.b, a.h, a.s, a.e}, dt));
  std::map<std::string, AttrValue> at = {{"causal", int64_t(causal)},
                                         {"scale", scale}};
  auto emit = [&](std::vector<int32_t> extra) {
    std::vector<int32_t> fwd = {q, k, v}, bwd = {q, k, v, dout};
    fwd.insert(fwd.end(), extra.begin(), extra.end());
    bwd.insert(bwd.end(), extra.begin(), extra.end());
    c.out(c.op("attention", fwd, T({a.b, a.h, a.s, a.e}, dt), at));
    for (int32_t r : c.ops("attention_grad", bwd,
                           {T({a.b, a.h, a.s, a.d}, dt),
                            T({a.b, a.g, a.t, a.d}, dt),
                            T({a.b, a.g, a.t, a.e}, dt)},
                           at))
      c.out(r);
  };
  if (offsets.empty())
    emit({});
  for (const OffsetInput &o : offsets)
    emit({c.in(T({}, o.type), Dist::Ints, o.lo, o.hi)});
}

std::vector<ConformanceCase> conformanceCases() {
  std::vector<ConformanceCase> cs;
  auto add = [&](std::string name, std::function<void(Case &, DType)> f,
                 bool floats = true, bool exact = false) {
    cs.push_back({std::move(name), std::move(f), floats, exact});
  };
  for (const char *op : {"neg", "abs", "relu", "exp", "tanh", "sin", "cos",
                         "sigmoid", "silu", "gelu"})
    add(op, [op](Case &c, DType d) {
      int32_t x = c.in(T({7, 33}, d));
      c.out(c.op(op, {x}, T({7, 33}, d)));
    });
  for (const char *op : {"log", "sqrt", "rsqrt"})
    add(op, [op](Case &c, DType d) {
      int32_t x = c.in(T({5, 17}, d), Dist::Positive);
      c.out(c.op(op, {x}, T({5, 17}, d)));
    });
  add("gelu_tanh", [](Case &c, DType d) {
    int32_t x = c.in(T({300}, d));
    c.out(c.op("gelu", {x}, T({300}, d), {{"approximate", std::string("tanh")}}));
  });
  add("int_unary", [](Case &c, DType) {
    for (DType d : {DType::I32, DType::I64}) {
      int32_t x = c.in(T({40}, d), Dist::Ints, -100, 100);
      for (const char *op : {"neg", "abs", "relu"})
        c.out(c.op(op, {x}, T({40}, d)));
    }
  }, false, true);
  add("cast", [](Case &c, DType) {
    int32_t x = c.in(T({64}, DType::F32));
    for (DType to : {DType::BF16, DType::F16, DType::I32, DType::I64, DType::I1})
      c.out(c.op("cast", {x}, T({64}, to)));
    int32_t i = c.in(T({64}, DType::I64), Dist::Ints, -1000, 1000);
    for (DType to : {DType::F32, DType::BF16, DType::I32, DType::I1})
      c.out(c.op("cast", {i}, T({64}, to)));
    int32_t bl = c.in(T({64}, DType::I1), Dist::Bool, 0, 2);
    c.out(c.op("cast", {bl}, T({64}, DType::F16)));
  }, false, true);
  for (const char *op : {"add", "sub", "mul", "div", "maximum", "minimum"})
    add(std::string(op) + "_broadcast", [op](Case &c, DType d) {
      int32_t a = c.in(T({4, 1, 8}, d));
      int32_t b = c.in(T({3, 8}, d), Dist::Positive);
      c.out(c.op(op, {a, b}, T({4, 3, 8}, d)));
      int32_t s = c.in(T({}, d), Dist::Positive);
      c.out(c.op(op, {a, s}, T({4, 1, 8}, d)));
    });
  add("pow", [](Case &c, DType d) {
    int32_t a = c.in(T({6, 5}, d), Dist::Positive);
    int32_t b = c.in(T({5}, d));
    c.out(c.op("pow", {a, b}, T({6, 5}, d)));
  });
  add("int_binary", [](Case &c, DType) {
    for (DType d : {DType::I32, DType::I64}) {
      int32_t a = c.in(T({5, 6}, d), Dist::Ints, -50, 50);
      int32_t b = c.in(T({6}, d), Dist::Ints, 1, 9);
      for (const char *op : {"add", "sub", "mul", "div", "maximum", "minimum"})
        c.out(c.op(op, {a, b}, T({5, 6}, d)));
    }
  }, false, true);
  add("compare_select", [](Case &c, DType d) {
    int32_t a = c.in(T({5, 6}, d)), b = c.in(T({6}, d));
    for (const char *p : {"eq", "ne", "lt", "le", "gt", "ge"}) {
      int32_t m = c.op("compare", {a, b}, T({5, 6}, DType::I1),
                       {{"predicate", std::string(p)}});
      c.out(m);
      c.out(c.op("select", {m, a, b}, T({5, 6}, d)));
    }
  }, true, true);
  add("gelu_grad", [](Case &c, DType d) {
    int32_t x = c.in(T({9, 10}, d)), dy = c.in(T({9, 10}, d));
    c.out(c.op("gelu_grad", {x, dy}, T({9, 10}, d)));
    c.out(c.op("gelu_grad", {x, dy}, T({9, 10}, d),
               {{"approximate", std::string("tanh")}}));
  });
  // One fused kernel against the CPU's fused evaluation: an AdamW-like
  // program with a rank-0 input, constants, every unary and binary opcode
  // kind, a cast to bf16 and three results (odd sizes exercise the vector
  // tail); in place on the CPU side is covered by the runtime unit tests.
  add("fused_elementwise", [](Case &c, DType d) {
    using O = fused::OpCode;
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(4099)}) {
      int32_t g = c.in(T({n}, d)), m = c.in(T({n}, d));
      int32_t v = c.in(T({n}, d), Dist::Positive), w = c.in(T({n}, d));
      int32_t lr = c.in(T({}, d), Dist::Positive);
      fused::Program p;
      p.numInputs = 5; // 0 g, 1 m, 2 v, 3 w, 4 lr
      p.consts = {0.9, 0.1, 0.999, 0.001, 1e-8, 0.01}; // 5..10
      p.steps = {{O::Mul, 1, 5},   {O::Mul, 0, 6},   {O::Add, 11, 12}, // 13 m'
                 {O::Mul, 2, 7},   {O::Mul, 0, 0},   {O::Mul, 15, 8},
                 {O::Add, 14, 16},                                     // 17 v'
                 {O::Sqrt, 17, -1}, {O::Add, 18, 9}, {O::Div, 13, 19},
                 {O::Mul, 3, 10},  {O::Add, 20, 21}, {O::Mul, 22, 4},
                 {O::Sub, 3, 23},                                      // 24 w'
                 {O::Tanh, 24, -1}, {O::Gelu, 25, -1}, {O::Max, 26, 0},
                 {O::Cast, 27, int32_t(DType::BF16)}, {O::Exp, 28, -1}}; // 29
      p.outputs = {13, 17, 24, 29};
      Instr in;
      fused::encode(p, in);
      std::vector<int32_t> rs =
          c.ops(fused::kOpName, {g, m, v, w, lr},
                {T({n}, d), T({n}, d), T({n}, d), T({n}, DType::F32)},
                in.attrs);
      for (int32_t r : rs)
        c.out(r);
    }
  });
  // Comparisons and select (ReLU's gradient and a two-sided choice):
  // 1.0/0.0 registers and the chosen value, bit for bit.
  add("fused_elementwise_compare", [](Case &c, DType d) {
    using O = fused::OpCode;
    for (int64_t n : {int64_t(7), int64_t(4099)}) {
      int32_t y = c.in(T({n}, d)), dy = c.in(T({n}, d)), z = c.in(T({n}, d));
      fused::Program p;
      p.numInputs = 3; // 0 y, 1 dy, 2 z
      p.consts = {0.0};  // 3
      p.steps = {{O::CmpGt, 0, 3},    {O::Select, 4, 1, 3},  // 5 relu grad
                 {O::CmpLe, 1, 2},    {O::Select, 6, 1, 2},  // 7 min-like
                 {O::CmpEq, 0, 0},    {O::CmpNe, 0, 2},
                 {O::CmpLt, 9, 8},    {O::CmpGe, 2, 1}};
      p.outputs = {5, 7, 10, 11};
      Instr in;
      fused::encode(p, in);
      for (int32_t r : c.ops(fused::kOpName, {y, dy, z},
                             {T({n}, d), T({n}, d), T({n}, d), T({n}, d)},
                             in.attrs))
        c.out(r);
    }
  });
  // The multi-tensor form: one instruction (one launch) over segments of
  // 1, 4099 (vector body and tail) and 7x3 elements, a
  // shared rank-0 lr and a per-segment rank-0 input, every segment's
  // results checked against the CPU's segment loop.
  add("fused_elementwise_multi", [](Case &c, DType d) {
    using O = fused::OpCode;
    fused::Program p;
    p.numInputs = 5; // 0 g, 1 m, 2 w, 3 lr (shared), 4 scale (per segment)
    p.consts = {0.9, 0.1, 1e-8};                               // 5, 6, 7
    p.steps = {{O::Mul, 1, 5},  {O::Mul, 0, 6},  {O::Add, 8, 9}, // 10 m'
               {O::Mul, 10, 10}, {O::Sqrt, 11, -1}, {O::Add, 12, 7},
               {O::Div, 10, 13}, {O::Mul, 14, 3}, {O::Mul, 15, 4},
               {O::Sub, 2, 16}};                                // 17 w'
    p.outputs = {10, 17};
    std::vector<std::vector<int64_t>> shapes = {{1}, {4099}, {7, 3}};
    p.numSegments = int32_t(shapes.size());
    int32_t lr = c.in(T({}, d), Dist::Positive);
    std::vector<int32_t> ins;
    std::vector<TensorType> rts;
    for (const auto &sh : shapes) {
      int32_t g = c.in(T(sh, d)), m = c.in(T(sh, d)), w = c.in(T(sh, d));
      int32_t scale = c.in(T({}, d), Dist::Positive);
      ins.insert(ins.end(), {g, m, w, lr, scale});
      rts.insert(rts.end(), {T(sh, d), T(sh, d)});
    }
    Instr in;
    fused::encode(p, in);
    for (int32_t r : c.ops(fused::kOpName, ins, rts, in.attrs))
      c.out(r);
  });
  add("dropout", [](Case &c, DType d) {
    int32_t x = c.in(T({33, 65}, d));
    int32_t step = c.in(T({}, DType::I64), Dist::Ints, 0, 1000);
    c.out(c.op("dropout", {x}, T({33, 65}, d), {{"rate", 0.25}, {"seed", int64_t(7)}}));
    c.out(c.op("dropout", {x, step}, T({33, 65}, d),
               {{"rate", 0.5}, {"seed", int64_t(42)}}));
  }, true, true);
  add("data_movement", [](Case &c, DType d) {
    int32_t x = c.in(T({2, 3, 4, 5}, d));
    c.out(c.op("transpose", {x}, T({2, 4, 3, 5}, d),
               {{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
    c.out(c.op("transpose", {x}, T({5, 4, 3, 2}, d),
               {{"perm", std::vector<int64_t>{3, 2, 1, 0}}}));
    c.out(c.op("reshape", {x}, T({6, 20}, d)));
    int32_t r = c.in(T({3, 1, 5}, d));
    c.out(c.op("broadcast_to", {r}, T({2, 3, 4, 5}, d)));
    int32_t y = c.in(T({2, 2, 4, 5}, d));
    c.out(c.op("concat", {x, y}, T({2, 5, 4, 5}, d), {{"dim", int64_t(1)}}));
    std::map<std::string, AttrValue> sl = {
        {"start", std::vector<int64_t>{0, 1, 0, 1}},
        {"limit", std::vector<int64_t>{2, 3, 4, 5}},
        {"stride", std::vector<int64_t>{1, 1, 2, 2}}};
    c.out(c.op("slice", {x}, T({2, 2, 2, 2}, d), sl));
    int32_t g = c.in(T({2, 2, 2, 2}, d));
    c.out(c.op("slice_grad", {g}, T({2, 3, 4, 5}, d), sl));
  }, true, true);
  add("gather_iota", [](Case &c, DType d) {
    int32_t table = c.in(T({50, 12}, d));
    int32_t ids = c.in(T({3, 7}, DType::I32), Dist::Ints, 0, 50);
    c.out(c.op("gather", {table, ids}, T({3, 7, 12}, d)));
    int32_t ids64 = c.in(T({5}, DType::I64), Dist::Ints, 0, 50);
    c.out(c.op("gather", {table, ids64}, T({5, 12}, d)));
    c.out(c.op("iota", {}, T({4, 6}, DType::I32), {{"dim", int64_t(1)}}));
    c.out(c.op("iota", {}, T({4, 6}, d), {{"dim", int64_t(0)}}));
  }, true, true);
  add("scatter_add", [](Case &c, DType d) {
    int32_t ids = c.in(T({4, 9}, DType::I32), Dist::Ints, 0, 10);
    int32_t up = c.in(T({4, 9, 16}, d));
    c.out(c.op("scatter_add", {ids, up}, T({10, 16}, d)));
  });
  for (const char *op : {"sum", "mean", "max"})
    add(std::string("reduce_") + op, [op](Case &c, DType d) {
      int32_t x = c.in(T({6, 7, 40}, d));
      c.out(c.op(op, {x}, T({6, 7}, d), {{"dims", std::vector<int64_t>{2}}}));
      c.out(c.op(op, {x}, T({40}, d), {{"dims", std::vector<int64_t>{0, 1}}}));
      c.out(c.op(op, {x}, T({1, 7, 1}, d),
                 {{"dims", std::vector<int64_t>{0, 2}}, {"keepdims", int64_t(1)}}));
      c.out(c.op(op, {x}, T({}, d), {{"dims", std::vector<int64_t>{0, 1, 2}}}));
    });
  // Shapes that cut the reduced range into chunks (few outputs, many
  // reduced elements: reduceSplit), each combined in chunk order.
  for (const char *op : {"sum", "mean", "max"})
    add(std::string("reduce_chunked_") + op, [op](Case &c, DType d) {
      int32_t rows = c.in(T({3, 20000}, d));
      c.out(c.op(op, {rows}, T({3}, d), {{"dims", std::vector<int64_t>{1}}}));
      int32_t cols = c.in(T({9000, 33}, d));
      c.out(c.op(op, {cols}, T({33}, d), {{"dims", std::vector<int64_t>{0}}}));
      int32_t all = c.in(T({50000}, d));
      c.out(c.op(op, {all}, T({}, d), {{"dims", std::vector<int64_t>{0}}}));
      int32_t mid = c.in(T({40, 6, 300}, d));
      c.out(c.op(op, {mid}, T({6}, d), {{"dims", std::vector<int64_t>{0, 2}}}));
    });
  add("reduce_chunked_int", [](Case &c, DType) {
    int32_t x = c.in(T({3, 20000}, DType::I64), Dist::Ints, -1000, 1000);
    c.out(c.op("sum", {x}, T({3}, DType::I64), {{"dims", std::vector<int64_t>{1}}}));
    int32_t y = c.in(T({9000, 5}, DType::I32), Dist::Ints, -1000, 1000);
    c.out(c.op("sum", {y}, T({5}, DType::I32), {{"dims", std::vector<int64_t>{0}}}));
    c.out(c.op("max", {y}, T({5}, DType::I32), {{"dims", std::vector<int64_t>{0}}}));
  }, false, true);
  add("reduce_int", [](Case &c, DType) {
    int32_t x = c.in(T({6, 50}, DType::I64), Dist::Ints, -1000, 1000);
    c.out(c.op("sum", {x}, T({6}, DType::I64), {{"dims", std::vector<int64_t>{1}}}));
    c.out(c.op("max", {x}, T({50}, DType::I64), {{"dims", std::vector<int64_t>{0}}}));
  }, false, true);
  add("matmul", [](Case &c, DType d) {
    int32_t a = c.in(T({24, 40}, d)), b = c.in(T({40, 16}, d));
    c.out(c.op("matmul", {a, b}, T({24, 16}, d)));
    int32_t bt = c.in(T({16, 40}, d));
    c.out(c.op("matmul", {a, bt}, T({24, 16}, d), {{"transpose_b", int64_t(1)}}));
    int32_t at = c.in(T({40, 24}, d));
    c.out(c.op("matmul", {at, b}, T({24, 16}, d), {{"transpose_a", int64_t(1)}}));
    int32_t x3 = c.in(T({2, 8, 40}, d));
    c.out(c.op("matmul", {x3, b}, T({2, 8, 16}, d)));
    int32_t ba = c.in(T({2, 1, 8, 40}, d)), bb = c.in(T({3, 40, 16}, d));
    c.out(c.op("matmul", {ba, bb}, T({2, 3, 8, 16}, d)));
  });
  for (bool log : {false, true})
    add(log ? "log_softmax" : "softmax", [log](Case &c, DType d) {
      std::string op = log ? "log_softmax" : "softmax";
      int32_t x = c.in(T({5, 6, 70}, d));
      int32_t y2 = c.op(op, {x}, T({5, 6, 70}, d), {{"dim", int64_t(2)}});
      c.out(y2);
      int32_t y0 = c.op(op, {x}, T({5, 6, 70}, d), {{"dim", int64_t(0)}});
      c.out(y0);
      int32_t dy = c.in(T({5, 6, 70}, d));
      c.out(c.op(op + "_grad", {y2, dy}, T({5, 6, 70}, d), {{"dim", int64_t(2)}}));
      c.out(c.op(op + "_grad", {y0, dy}, T({5, 6, 70}, d), {{"dim", int64_t(0)}}));
    });
  add("layer_norm", [](Case &c, DType d) {
    int32_t x = c.in(T({3, 5, 96}, d)), w = c.in(T({96}, d)), b = c.in(T({96}, d));
    c.out(c.op("layer_norm", {x, w, b}, T({3, 5, 96}, d),
               {{"axis", int64_t(2)}, {"eps", 1e-5}, {"has_weight", int64_t(1)},
                {"has_bias", int64_t(1)}}));
    c.out(c.op("layer_norm", {x}, T({3, 5, 96}, d),
               {{"axis", int64_t(1)}, {"eps", 1e-5}, {"has_weight", int64_t(0)},
                {"has_bias", int64_t(0)}}));
    int32_t dy = c.in(T({3, 5, 96}, d));
    for (int32_t r : c.ops("layer_norm_grad", {x, dy, w},
                           {T({3, 5, 96}, d), T({96}, d), T({96}, d)},
                           {{"axis", int64_t(2)}, {"eps", 1e-5},
                            {"has_weight", int64_t(1)}}))
      c.out(r);
  });
  add("rms_norm", [](Case &c, DType d) {
    int32_t x = c.in(T({7, 128}, d)), w = c.in(T({128}, d));
    c.out(c.op("rms_norm", {x, w}, T({7, 128}, d),
               {{"axis", int64_t(1)}, {"eps", 1e-6}, {"has_weight", int64_t(1)}}));
    int32_t dy = c.in(T({7, 128}, d));
    for (int32_t r : c.ops("rms_norm_grad", {x, dy, w},
                           {T({7, 128}, d), T({128}, d)},
                           {{"axis", int64_t(1)}, {"eps", 1e-6},
                            {"has_weight", int64_t(1)}}))
      c.out(r);
  });
  add("cross_entropy", [](Case &c, DType d) {
    int32_t logits = c.in(T({12, 50}, d));
    int32_t labels = c.in(T({12}, DType::I32), Dist::Ints, -1, 50);
    std::map<std::string, AttrValue> ig = {{"ignore_index", int64_t(-1)}};
    c.out(c.op("cross_entropy", {logits, labels}, T({}, d), ig));
    int32_t dl = c.in(T({}, d), Dist::Positive);
    c.out(c.op("cross_entropy_grad", {logits, labels, dl}, T({12, 50}, d), ig));
    int32_t a = c.in(T({9, 11}, d)), b = c.in(T({9, 11}, d));
    c.out(c.op("mse", {a, b}, T({}, d)));
  });
  // What dlopt-fold-loss-casts emits: the logits in their type, an f32 loss
  // and an f32 dloss, the gradient in the logits' type.
  add("cross_entropy_f32_loss", [](Case &c, DType d) {
    int32_t logits = c.in(T({12, 50}, d));
    int32_t labels = c.in(T({12}, DType::I64), Dist::Ints, -1, 50);
    std::map<std::string, AttrValue> ig = {{"ignore_index", int64_t(-1)}};
    c.out(c.op("cross_entropy", {logits, labels}, T({}, DType::F32), ig));
    int32_t dl = c.in(T({}, DType::F32), Dist::Positive);
    c.out(c.op("cross_entropy_grad", {logits, labels, dl}, T({12, 50}, d), ig));
  });
  for (bool causal : {false, true})
    add(causal ? "attention_causal" : "attention", [causal](Case &c, DType d) {
      // GQA (4 query heads on 2 kv heads), S != T, a tail tile.
      attentionOps(c, d, {2, 4, 2, 37, 45, 32, 24}, causal, 0.2);
    });
  add("attention_head128", [](Case &c, DType d) {
    attentionOps(c, d, {1, 2, 2, 70, 70, 128, 128}, true, 1.0 / std::sqrt(128.0));
  });
  // conv2d and its gradients: groups, stride, padding and dilation that
  // differ per axis, odd sizes, a bias; and a 1x1 convolution.
  add("conv2d", [](Case &c, DType d) {
    using V = std::vector<int64_t>;
    std::map<std::string, AttrValue> at = {{"stride", V{2, 1}},
                                           {"padding", V{1, 2}},
                                           {"dilation", V{1, 2}},
                                           {"groups", int64_t(2)}};
    int32_t x = c.in(T({2, 6, 11, 9}, d)), w = c.in(T({8, 3, 3, 3}, d));
    int32_t b = c.in(T({8}, d));
    auto withBias = at;
    withBias["has_bias"] = int64_t(1);
    c.out(c.op("conv2d", {x, w, b}, T({2, 8, 6, 9}, d), withBias));
    c.out(c.op("conv2d", {x, w}, T({2, 8, 6, 9}, d), at));
    int32_t w1 = c.in(T({5, 6, 1, 1}, d));
    c.out(c.op("conv2d", {x, w1}, T({2, 5, 11, 9}, d)));
    int32_t dy = c.in(T({2, 8, 6, 9}, d));
    c.out(c.op("conv2d_grad_input", {dy, w}, T({2, 6, 11, 9}, d), at));
    c.out(c.op("conv2d_grad_filter", {x, dy}, T({8, 3, 3, 3}, d), at));
    int32_t dy1 = c.in(T({2, 5, 11, 9}, d));
    c.out(c.op("conv2d_grad_input", {dy1, w1}, T({2, 6, 11, 9}, d)));
    c.out(c.op("conv2d_grad_filter", {x, dy1}, T({5, 6, 1, 1}, d)));
  });
  // Pooling and its gradients: padding, overlapping windows (stride <
  // kernel), the default stride (= kernel) on rank 3, count_include_pad.
  add("pool2d", [](Case &c, DType d) {
    using V = std::vector<int64_t>;
    int32_t x = c.in(T({2, 3, 9, 7}, d));
    struct P {
      V kernel, stride, padding, out;
    };
    for (const P &p : {P{{3, 2}, {2, 2}, {1, 1}, {2, 3, 5, 4}},
                       P{{3, 3}, {1, 2}, {1, 0}, {2, 3, 9, 3}}}) {
      std::map<std::string, AttrValue> at = {{"kernel", p.kernel},
                                             {"stride", p.stride},
                                             {"padding", p.padding}};
      c.out(c.op("max_pool2d", {x}, T(p.out, d), at));
      int32_t dy = c.in(T(p.out, d));
      c.out(c.op("max_pool2d_grad", {x, dy}, T({2, 3, 9, 7}, d), at));
      for (int64_t inc : {0, 1}) {
        auto avg = at;
        avg["count_include_pad"] = inc;
        c.out(c.op("avg_pool2d", {x}, T(p.out, d), avg));
        c.out(c.op("avg_pool2d_grad", {dy}, T({2, 3, 9, 7}, d), avg));
      }
    }
    int32_t x3 = c.in(T({3, 9, 7}, d));
    std::map<std::string, AttrValue> def = {{"kernel", V{2, 2}}};
    c.out(c.op("max_pool2d", {x3}, T({3, 4, 3}, d), def));
    c.out(c.op("avg_pool2d", {x3}, T({3, 4, 3}, d), def));
    int32_t dy3 = c.in(T({3, 4, 3}, d));
    c.out(c.op("max_pool2d_grad", {x3, dy3}, T({3, 9, 7}, d), def));
    c.out(c.op("avg_pool2d_grad", {dy3}, T({3, 9, 7}, d), def));
  });
  // batch_norm (all three results) and batch_norm_grad, training (batch
  // statistics) and inference (running statistics), rank 4 and rank 2.
  add("batch_norm", [](Case &c, DType d) {
    for (const std::vector<int64_t> &shape :
         {std::vector<int64_t>{4, 5, 3, 7}, std::vector<int64_t>{6, 5}}) {
      int32_t x = c.in(T(shape, d)), w = c.in(T({5}, d)), b = c.in(T({5}, d));
      int32_t rm = c.in(T({5}, d)), rv = c.in(T({5}, d), Dist::Positive);
      int32_t dy = c.in(T(shape, d));
      for (int64_t training : {1, 0}) {
        std::map<std::string, AttrValue> at = {
            {"eps", 1e-5}, {"momentum", 0.1}, {"training", training}};
        for (int32_t r : c.ops("batch_norm", {x, w, b, rm, rv},
                               {T(shape, d), T({5}, d), T({5}, d)}, at))
          c.out(r);
        std::map<std::string, AttrValue> gat = {{"eps", 1e-5},
                                                {"training", training}};
        for (int32_t r : c.ops("batch_norm_grad", {x, w, rm, rv, dy},
                               {T(shape, d), T({5}, d), T({5}, d)}, gat))
          c.out(r);
      }
    }
  });
  add("rope", [](Case &c, DType d) {
    int32_t x = c.in(T({2, 3, 10, 16}, d));
    c.out(c.op("rope", {x}, T({2, 3, 10, 16}, d), {{"theta", 10000.0}}));
    c.out(c.op("rope", {x}, T({2, 3, 10, 16}, d),
               {{"theta", 500000.0}, {"inverse", int64_t(1)}}));
  });
  // Context-parallel position offsets (docs/parallel.md): the causal mask
  // Head dim 64: bf16 and f16 take the tensor-core kernels (f32 the CUDA
  // cores): GQA, S != T, tail tiles of the 64-row blocks, with and without
  // the causal mask, and the offset operand (hiding every key from the
  // first queries, and showing every key).
  for (bool causal : {false, true})
    add(causal ? "attention_tc_causal" : "attention_tc", [causal](Case &c, DType d) {
      attentionOps(c, d, {2, 4, 2, 100, 130, 64, 64}, causal, 0.125);
    });
  // Several full 64-row tiles, four query heads per kv head, and head dim
  // 128 without the mask.
  add("attention_tc_gqa4", [](Case &c, DType d) {
    attentionOps(c, d, {2, 8, 2, 192, 192, 64, 64}, true, 0.125);
  });
  add("attention_tc_head128", [](Case &c, DType d) {
    attentionOps(c, d, {1, 4, 1, 130, 129, 128, 128}, false,
                 1.0 / std::sqrt(128.0));
  });
  add("attention_tc_offset", [](Case &c, DType d) {
    attentionOps(c, d, {1, 2, 1, 70, 150, 64, 64}, true, 0.125,
                 {{DType::I32, -20, -15}, {DType::I32, 40, 45},
                  {DType::I32, 200, 205}});
  });
  // "key j <= query i + offset" and rope positions starting at the offset,
  // from i32 and i64 operands; offsets that hide every key from the first
  // queries (< 0) and that show every key (> T) included.
  add("attention_offset", [](Case &c, DType d) {
    attentionOps(c, d, {1, 4, 2, 19, 45, 16, 24}, true, 0.25,
                 {{DType::I32, 10, 27}, {DType::I64, -8, -3},
                  {DType::I32, 50, 60}});
  });
  add("rope_offset", [](Case &c, DType d) {
    int32_t x = c.in(T({2, 3, 10, 16}, d));
    int32_t off = c.in(T({}, DType::I32), Dist::Ints, 0, 100);
    int32_t off64 = c.in(T({}, DType::I64), Dist::Ints, 1000, 5000);
    c.out(c.op("rope", {x, off}, T({2, 3, 10, 16}, d), {{"theta", 10000.0}}));
    c.out(c.op("rope", {x, off64}, T({2, 3, 10, 16}, d),
               {{"theta", 500000.0}, {"inverse", int64_t(1)}}));
  });
  return cs;
}

struct Param {
  ConformanceCase c;
  DType dtype;
};

// Without a GPU the conformance cases only skip; this runs each of them on
// the CPU backend alone, so a malformed case (shapes, attributes) shows up
// here rather than as a failure of the first GPU run.
TEST(CudaBackend, ConformanceCasesAreWellFormedOnTheCpu) {
  for (const ConformanceCase &cc : conformanceCases())
    for (DType d : cc.floats ? std::vector<DType>{DType::F32, DType::BF16,
                                                  DType::F16}
                             : std::vector<DType>{DType::F32}) {
      SCOPED_TRACE(cc.name + " (" + dtypeName(d) + ")");
      Case c;
      cc.build(c, d);
      auto s = Session::create(c.b.build(), std::make_unique<CpuBackend>());
      ASSERT_TRUE(s) << s.status().message();
      for (const auto &[name, t] : c.data)
        ASSERT_TRUE((*s)->bind(name, t).isOk()) << name;
      auto r = (*s)->run();
      ASSERT_TRUE(r) << r.status().message();
    }
}

void PrintTo(const Param &p, std::ostream *os) {
  *os << p.c.name << " (" << dtypeName(p.dtype) << ")";
}

std::vector<Param> params() {
  std::vector<Param> ps;
  for (const ConformanceCase &c : conformanceCases()) {
    if (c.floats)
      for (DType d : {DType::F32, DType::BF16, DType::F16})
        ps.push_back({c, d});
    else
      ps.push_back({c, DType::F32});
  }
  return ps;
}

class CudaGpuConformance : public ::testing::TestWithParam<Param> {};

TEST_P(CudaGpuConformance, MatchesCpuBackend) {
  Case c;
  GetParam().c.build(c, GetParam().dtype);
  runCase(c, GetParam().c.exact);
}

INSTANTIATE_TEST_SUITE_P(
    Ops, CudaGpuConformance, ::testing::ValuesIn(params()),
    [](const ::testing::TestParamInfo<Param> &info) {
      return info.param.c.name + "_" + dtypeName(info.param.dtype);
    });

// The fused cases once more on each kernel path: the program's own kernel
// compiled by NVRTC (required here: a missing NVRTC fails rather than falls
// back) and the interpreter, both against the CPU backend.
TEST(CudaGpu, FusedKernelsOnBothPathsMatchTheCpu) {
#ifdef DLOPT_CUDA_KERNELS
  std::string why;
  if (!cudaOrSkip(why))
    GTEST_SKIP() << "no GPU: " << why;
  const kernels::FusedMode before = kernels::fusedMode();
  for (kernels::FusedMode m :
       {kernels::FusedMode::Jit, kernels::FusedMode::Interpreter}) {
    kernels::setFusedMode(m);
    for (const ConformanceCase &cc : conformanceCases()) {
      if (cc.name.rfind("fused_elementwise", 0) != 0)
        continue;
      for (DType d : {DType::F32, DType::BF16, DType::F16}) {
        SCOPED_TRACE(cc.name + " (" + dtypeName(d) + ") on the " +
                     (m == kernels::FusedMode::Jit ? "NVRTC kernel"
                                                   : "interpreter"));
        Case c;
        cc.build(c, d);
        runCase(c);
      }
    }
  }
  kernels::setFusedMode(before);
  kernels::FusedJitStats st = kernels::fusedJitStats();
  EXPECT_GT(st.compiled, 0);
  EXPECT_EQ(st.failed, 0);
  std::printf("fused JIT: %d kernels compiled in %.3f s\n", st.compiled,
              st.seconds);
#else
  GTEST_SKIP() << CudaBackend::buildDescription();
#endif
}

// The attention cases once more on each kernel path the tensor-core shapes
// may take (the mma.sync kernels are the default, so the conformance suite
// above runs them): the WMMA kernels and the CUDA-core ones, both against
// the CPU backend.
TEST(CudaGpu, AttentionOnEveryKernelPathMatchesTheCpu) {
#ifdef DLOPT_CUDA_KERNELS
  std::string why;
  if (!cudaOrSkip(why))
    GTEST_SKIP() << "no GPU: " << why;
  const kernels::AttentionPath before = kernels::attentionPath();
  for (kernels::AttentionPath p :
       {kernels::AttentionPath::Mma, kernels::AttentionPath::Wmma,
        kernels::AttentionPath::Simt}) {
    kernels::setAttentionPath(p);
    for (const ConformanceCase &cc : conformanceCases()) {
      if (cc.name.rfind("attention", 0) != 0)
        continue;
      for (DType d : {DType::BF16, DType::F16}) {
        SCOPED_TRACE(cc.name + " (" + dtypeName(d) + ") on the " +
                     (p == kernels::AttentionPath::Mma    ? "mma.sync"
                      : p == kernels::AttentionPath::Wmma ? "WMMA"
                                                          : "CUDA-core") +
                     " kernels");
        Case c;
        cc.build(c, d);
        runCase(c);
      }
    }
  }
  kernels::setAttentionPath(before);
#else
  GTEST_SKIP() << CudaBackend::buildDescription();
#endif
}

// An LM head's three GEMMs with a vocabulary of 4099 (rows not 16 bytes
// apart), large enough for padding (CudaGemm.h planPadding), with padded
// copies and without, against the CPU backend.
TEST(CudaGpu, UnalignedGemmsMatchTheCpuWithAndWithoutPadding) {
  std::string why;
  if (!cudaOrSkip(why))
    GTEST_SKIP() << "no GPU: " << why;
  const bool before = cuda::gemmPadding();
  for (bool pad : {true, false}) {
    cuda::setGemmPadding(pad);
    for (DType d : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(dtypeName(d)) +
                   (pad ? ", padded copies" : ", as planned"));
      Case c;
      int32_t x = c.in(T({2048, 256}, d)), w = c.in(T({4099, 256}, d));
      int32_t dl = c.in(T({2048, 4099}, d));
      c.out(c.op("matmul", {x, w}, T({2048, 4099}, d),
                 {{"transpose_b", int64_t(1)}}));
      c.out(c.op("matmul", {dl, w}, T({2048, 256}, d)));
      c.out(c.op("matmul", {dl, x}, T({4099, 256}, d),
                 {{"transpose_a", int64_t(1)}}));
      runCase(c);
    }
  }
  cuda::setGemmPadding(before);
}

//===--- Multi-rank executables on the cuda backend ------------------------===//

/// Every communication instruction over every group of a dp x tp mesh:
/// x [4, 8, 12] per rank (global [4 dp tp, 8, 12], distinct per rank), one
/// output per instruction.
Executable collectivesExe(int64_t dp, int64_t tp) {
  ExeBuilder b;
  const int64_t all = dp * tp;
  const int64_t size[3] = {dp, tp, all}; // groups 0 dp, 1 tp, 2 all
  int32_t x = b.input("x", T({4, 8, 12}, DType::F32));
  b.global(x, T({4 * all, 8, 12}, DType::F32), {{0, 1}, {}, {}});
  int outs = 0;
  auto out = [&](int32_t id) { b.output("y" + std::to_string(outs++), id); };
  auto grp = [](int64_t g) { return std::make_pair(std::string("group"), AttrValue(g)); };
  auto shape = [](int64_t axis, int64_t f, bool divide) {
    std::vector<int64_t> s = {4, 8, 12};
    s[size_t(axis)] = divide ? s[size_t(axis)] / f : s[size_t(axis)] * f;
    return s;
  };
  for (int64_t g = 0; g < 3; ++g) {
    int64_t n = size[g];
    for (const char *red : {"sum", "max", "min", "avg"})
      out(b.op("all_reduce", {x}, T({4, 8, 12}, DType::F32),
               {grp(g), {"reduce", std::string(red)}}));
    out(b.op("broadcast", {x}, T({4, 8, 12}, DType::F32),
             {grp(g), {"root", int64_t(n - 1)}}));
    for (int64_t axis = 0; axis < 3; ++axis) {
      out(b.op("all_gather", {x}, T(shape(axis, n, false), DType::F32),
               {grp(g), {"axis", axis}}));
      out(b.op("reduce_scatter", {x}, T(shape(axis, n, true), DType::F32),
               {grp(g), {"axis", axis}, {"reduce", std::string("sum")}}));
      out(b.op("all_slice", {x}, T(shape(axis, n, true), DType::F32),
               {grp(g), {"axis", axis}}));
      for (int64_t concat = 0; concat < 3; ++concat) {
        std::vector<int64_t> ys = shape(axis, n, true);
        ys[size_t(concat)] *= n;
        out(b.op("all_to_all", {x}, T(ys, DType::F32),
                 {grp(g), {"split_axis", axis}, {"concat_axis", concat}}));
      }
    }
  }
  return b.buildSpmd(Mesh{{"dp", "tp"}, {dp, tp}},
                     {{"dp", {0}}, {"tp", {1}}, {"all", {0, 1}}});
}

/// Context parallelism over cp ranks: q, k, v split along the sequence,
/// k and v all-gathered, the rank's offset (its block index times S, from
/// all_slice of an iota) shifting the causal mask and rope's positions;
/// attention, its gradient (dk, dv reduce-scattered back), rope.
Executable contextParallelExe(int64_t cp) {
  ExeBuilder b;
  const int64_t B = 1, H = 4, G = 2, S = 24, D = 32, E = 16;
  const DType f = DType::F32;
  auto split = [&](int32_t id, std::vector<int64_t> global) {
    b.global(id, T(global, f), {{}, {}, {0}, {}});
  };
  int32_t q = b.input("q", T({B, H, S, D}, f));
  int32_t k = b.input("k", T({B, G, S, D}, f));
  int32_t v = b.input("v", T({B, G, S, E}, f));
  int32_t dout = b.input("dout", T({B, H, S, E}, f));
  split(q, {B, H, S * cp, D});
  split(k, {B, G, S * cp, D});
  split(v, {B, G, S * cp, E});
  split(dout, {B, H, S * cp, E});
  std::map<std::string, AttrValue> g0 = {{"group", int64_t(0)}};
  auto with = [&](std::map<std::string, AttrValue> a) {
    a["group"] = int64_t(0);
    return a;
  };
  int32_t ids = b.op("iota", {}, T({cp}, DType::I32), {{"dim", int64_t(0)}});
  int32_t mine = b.op("all_slice", {ids}, T({1}, DType::I32),
                      with({{"axis", int64_t(0)}}));
  int32_t idx = b.op("reshape", {mine}, T({}, DType::I32));
  int32_t s32 = int32_t(S);
  int32_t sc = b.constantBytes(T({}, DType::I32), &s32, sizeof s32);
  int32_t off = b.op("mul", {idx, sc}, T({}, DType::I32));
  int32_t kf = b.op("all_gather", {k}, T({B, G, S * cp, D}, f),
                    with({{"axis", int64_t(2)}}));
  int32_t vf = b.op("all_gather", {v}, T({B, G, S * cp, E}, f),
                    with({{"axis", int64_t(2)}}));
  std::map<std::string, AttrValue> at = {{"causal", int64_t(1)},
                                         {"scale", 0.2}};
  int32_t y = b.op("attention", {q, kf, vf, off}, T({B, H, S, E}, f), at);
  int32_t dq = b.temp(T({B, H, S, D}, f)), dk = b.temp(T({B, G, S * cp, D}, f)),
          dv = b.temp(T({B, G, S * cp, E}, f));
  Instr grad;
  grad.op = "attention_grad";
  grad.operands = {q, kf, vf, dout, off};
  grad.results = {dq, dk, dv};
  grad.attrs = at;
  grad.loc = "cp.mlir:1:1";
  b.instrs.push_back(grad);
  int32_t dkl = b.op("reduce_scatter", {dk}, T({B, G, S, D}, f),
                     with({{"axis", int64_t(2)}, {"reduce", std::string("sum")}}));
  int32_t dvl = b.op("reduce_scatter", {dv}, T({B, G, S, E}, f),
                     with({{"axis", int64_t(2)}, {"reduce", std::string("sum")}}));
  int32_t rq = b.op("rope", {q, off}, T({B, H, S, D}, f), {{"theta", 10000.0}});
  b.output("offset", off);
  b.output("y", y);
  b.output("dq", dq);
  b.output("dk", dkl);
  b.output("dv", dvl);
  b.output("rope", rq);
  return b.buildSpmd(Mesh{{"cp"}, {cp}}, {{"cp", {0}}});
}

/// Runs `exe` as a World of cpu ranks and as one of cuda ranks (host
/// communicators, or NCCL) on the same global inputs; every rank's local
/// outputs must agree (exactly, or within `tol` relative).
void compareWorlds(const Executable &exe, bool nccl, double tol) {
  std::string why;
  int devices = cuda::deviceCount(&why);
  if (devices == 0)
    GTEST_SKIP() << "no GPU: " << why;
  if (nccl && devices < exe.worldSize)
    GTEST_SKIP() << "NCCL needs " << exe.worldSize << " GPUs, " << devices
                 << " visible";
  WorldOptions co;
  co.commTimeout = std::chrono::milliseconds(60000);
  auto cpuWorld = World::create(exe, co);
  ASSERT_TRUE(cpuWorld) << cpuWorld.status().message();
  WorldOptions go = co;
  CudaWorldOptions cw;
  cw.nccl = nccl;
  Status st = configureCudaWorld(go, exe.worldSize, cw);
  ASSERT_TRUE(st) << st.message();
  auto gpuWorld = World::create(exe, go);
  ASSERT_TRUE(gpuWorld) << gpuWorld.status().message();
  std::mt19937_64 rng(99);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int32_t id : exe.inputs) {
    const Value &v = exe.values[size_t(id)];
    HostTensor h(v.global ? v.global->type : v.type);
    for (int64_t i = 0; i < h.numElements(); ++i)
      h.setElementFromDouble(i, normal(rng));
    ASSERT_TRUE((*cpuWorld)->bind(v.name, h));
    ASSERT_TRUE((*gpuWorld)->bind(v.name, h));
  }
  Status ran = (*cpuWorld)->execute();
  ASSERT_TRUE(ran) << ran.message();
  ran = (*gpuWorld)->execute();
  ASSERT_TRUE(ran) << ran.message();
  for (int r = 0; r < exe.worldSize; ++r)
    for (size_t o = 0; o < exe.outputNames.size(); ++o) {
      const std::string &name = exe.outputNames[o];
      auto want = (*cpuWorld)->session(r).readOutput(name);
      auto got = (*gpuWorld)->session(r).readOutput(name);
      ASSERT_TRUE(want && got) << name;
      ASSERT_EQ(got->type, want->type) << name;
      int64_t bad = 0, first = -1;
      for (int64_t i = 0; i < want->numElements(); ++i) {
        double a = want->elementAsDouble(i), x = got->elementAsDouble(i);
        if (!(a == x || (tol > 0 && std::fabs(x - a) <= tol * (1 + std::fabs(a))))
            && bad++ == 0)
          first = i;
      }
      EXPECT_EQ(bad, 0) << "rank " << r << ", output " << name << ": "
                        << bad << " of " << want->numElements()
                        << " elements differ, first at " << first << ": cuda "
                        << (first >= 0 ? got->elementAsDouble(first) : 0)
                        << ", cpu "
                        << (first >= 0 ? want->elementAsDouble(first) : 0);
    }
}

// Without a GPU: the executables are well formed and run on cpu ranks.
TEST(CudaBackend, MultiRankCasesAreWellFormedOnTheCpu) {
  for (const Executable &exe :
       {collectivesExe(2, 2), collectivesExe(2, 1), contextParallelExe(2)}) {
    ASSERT_TRUE(exe.validate()) << exe.validate().message();
    auto w = World::create(exe);
    ASSERT_TRUE(w) << w.status().message();
    for (int32_t id : exe.inputs) {
      const Value &v = exe.values[size_t(id)];
      ASSERT_TRUE((*w)->bind(v.name, HostTensor(v.global ? v.global->type
                                                         : v.type)));
    }
    Status st = (*w)->execute();
    ASSERT_TRUE(st) << st.message();
  }
  // Without a device a cuda World is refused before any rank is made.
  WorldOptions o;
  Status st = configureCudaWorld(o, 4);
  if (cuda::deviceCount() == 0) {
    EXPECT_TRUE(contains(st.message(), "no CUDA device")) << st.message();
    EXPECT_FALSE(o.backend);
  }
}

// Four ranks on however many GPUs there are (one is enough), host
// communicators: every collective is data movement or a host reduction in
// rank order, as on the cpu, so the results are the same bits.
TEST(CudaGpuWorld, CollectivesOverHostCommunicatorsMatchTheCpu) {
  compareWorlds(collectivesExe(2, 2), false, 0.0);
}

// NCCL (one GPU per rank): reductions may sum in another order.
TEST(CudaGpuWorld, CollectivesOverNcclMatchTheCpu) {
  std::string why;
  int devices = cuda::deviceCount(&why);
  compareWorlds(devices >= 4 ? collectivesExe(2, 2) : collectivesExe(2, 1),
                true, 1e-5);
}

TEST(CudaGpuWorld, ContextParallelAttentionMatchesTheCpu) {
  if (!CudaBackend::kernelsBuilt())
    GTEST_SKIP() << CudaBackend::buildDescription();
  compareWorlds(contextParallelExe(2), false, 2e-4);
}

TEST(CudaGpu, DeviceErrorsNameTheirOp) {
  std::string why;
  if (!cudaOrSkip(why))
    GTEST_SKIP() << "no GPU: " << why;
  struct Bad {
    const char *op;
    std::function<void(Case &)> build;
  } bad[] = {
      {"gather",
       [](Case &c) {
         int32_t t = c.in(T({10, 4}, DType::F32));
         int32_t ids = c.in(T({3}, DType::I64), Dist::Ints, 10, 11);
         c.out(c.op("gather", {t, ids}, T({3, 4}, DType::F32)));
       }},
      {"cross_entropy",
       [](Case &c) {
         int32_t l = c.in(T({4, 5}, DType::F32));
         int32_t y = c.in(T({4}, DType::I32), Dist::Ints, 5, 6);
         c.out(c.op("cross_entropy", {l, y}, T({}, DType::F32)));
       }},
      {"div",
       [](Case &c) {
         int32_t a = c.in(T({4}, DType::I32), Dist::Ints, 1, 5);
         int32_t b = c.in(T({4}, DType::I32), Dist::Ints, 0, 1);
         c.out(c.op("div", {a, b}, T({4}, DType::I32)));
       }},
  };
  for (Bad &b : bad) {
    Case c;
    b.build(c);
    auto s = Session::create(c.b.build(), cudaOrSkip(why));
    ASSERT_TRUE(s) << s.status().message();
    for (const auto &[name, t] : c.data)
      ASSERT_TRUE((*s)->bind(name, t).isOk());
    auto r = (*s)->run();
    ASSERT_FALSE(r) << b.op;
    EXPECT_TRUE(contains(r.status().message(), std::string("op '") + b.op + "'"))
        << r.status().message();
    // The error word is cleared: a good run afterwards would succeed.
  }
}

TEST(CudaGpu, MemoryIsReportedAgainstThePlan) {
  std::string why;
  std::unique_ptr<Backend> gpu = cudaOrSkip(why);
  if (!gpu)
    GTEST_SKIP() << "no GPU: " << why;
  auto *cuda = static_cast<CudaBackend *>(gpu.get());
  Case c;
  int32_t a = c.in(T({256, 256}, DType::F32)), b = c.in(T({256, 256}, DType::F32));
  c.out(c.op("matmul", {a, b}, T({256, 256}, DType::F32)));
  auto s = Session::create(c.b.build(), std::move(gpu));
  ASSERT_TRUE(s) << s.status().message();
  for (const auto &[name, t] : c.data)
    ASSERT_TRUE((*s)->bind(name, t).isOk());
  ASSERT_TRUE((*s)->run());
  CudaMemoryStats m = cuda->memoryStats(0);
  EXPECT_GE(m.arenaBytes, (*s)->memory().plannedBytes);
  EXPECT_GE(m.trackedPeakBytes, m.arenaBytes + m.gemmWorkspaceBytes);
  EXPECT_GT(m.memGetInfoPeakBytes, 0);
  std::cout << "planned " << (*s)->memory().plannedBytes << ", tracked peak "
            << m.trackedPeakBytes << ", cudaMemGetInfo delta "
            << m.memGetInfoPeakBytes << " on " << cuda->deviceDescription(0)
            << "\n";
}

} // namespace
