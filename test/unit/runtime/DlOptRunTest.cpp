//===- DlOptRunTest.cpp - The dlopt-run command line ----------------------===//

#include "TestUtil.h"

#include "runtime/exec/Npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sys/wait.h>

using namespace dlopt::rt;
using namespace dlopt::rt::test;
namespace fs = std::filesystem;

namespace {

struct Result {
  int code = -1;
  std::string out; ///< stdout and stderr together
};

Result runTool(const std::string &args) {
  std::string cmd = std::string(DLOPT_RUN_PATH) + " " + args + " 2>&1";
  Result r;
  FILE *p = popen(cmd.c_str(), "r");
  if (!p)
    return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0)
    r.out.append(buf, n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class DlOptRun : public ::testing::Test {
protected:
  void SetUp() override {
    dir = fs::temp_directory_path() /
          ("dlopt_run_test_" + std::to_string(getpid()) + "_" +
           std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    ExeBuilder b;
    int32_t x = b.input("x", tt({2, 3}));
    int32_t w = b.param("w", tt({3, 4}), Init{"normal", 0.0, 0.5});
    int32_t y = b.op("matmul", {x, w}, tt({2, 4}));
    int32_t loss = b.op("sum", {y}, tt({}),
                        {{"dims", std::vector<int64_t>{0, 1}},
                         {"keepdims", int64_t(0)}});
    b.output("loss", loss);
    b.output("y", y);
    plan = (dir / "model.plan").string();
    ASSERT_TRUE(writeExecutable(b.build(), plan).isOk());
    HostTensor xv(tt({2, 3}));
    for (int i = 0; i < 6; ++i)
      xv.setElementFromDouble(i, 0.25 * i - 0.5);
    xPath = (dir / "x.npy").string();
    ASSERT_TRUE(writeNpy(xPath, xv).isOk());
  }
  void TearDown() override { fs::remove_all(dir); }

  fs::path dir;
  std::string plan, xPath;
};

} // namespace

TEST_F(DlOptRun, Help) {
  Result r = runTool("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "usage: dlopt-run MODEL.plan")) << r.out;
  EXPECT_TRUE(contains(r.out, "--save-params DIR"));
}

TEST_F(DlOptRun, UsageErrorsExitWith2) {
  Result r = runTool("");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "dlopt-run: error: no plan file given")) << r.out;
  r = runTool(plan + " --frobnicate");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "dlopt-run: error: unknown option '--frobnicate'"));
  r = runTool(plan + " --input x");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "--input expects NAME=FILE.npy, got 'x'")) << r.out;
  r = runTool(plan + " --seed");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "option '--seed' needs a value"));
  r = runTool(plan + " --seed -3");
  EXPECT_EQ(r.code, 2);
  r = runTool(plan + " --threads 0");
  EXPECT_EQ(r.code, 2);
  r = runTool(plan + " --backend tpu");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "unknown backend 'tpu' (available: cpu)"));
  r = runTool(plan + " other.plan");
  EXPECT_EQ(r.code, 2);
  r = runTool(plan + " --input x=a.npy --input x=b.npy");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "--input 'x' given twice"));
}

TEST_F(DlOptRun, ErrorsExitWith1) {
  Result r = runTool("/nonexistent/model.plan");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "dlopt-run: error: reading /nonexistent/model.plan: "
                              "No such file or directory"))
      << r.out;
  r = runTool(xPath); // a .npy file is not a plan
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "not a dlopt plan file (bad magic)")) << r.out;
  r = runTool(plan);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "dlopt-run: error: missing input 'x' (2x3xf32); "
                              "bind with --input x=FILE.npy"))
      << r.out;
  r = runTool(plan + " --input x=" + (dir / "missing.npy").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "No such file or directory")) << r.out;
  r = runTool(plan + " --input bogus=" + xPath);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "no input or param named 'bogus' (known: x, w)"))
      << r.out;
  r = runTool(plan + " --input w=" + xPath);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "dlopt-run: error: param 'w': expected 3x4xf32, "
                              "got 2x3xf32 from " + xPath))
      << r.out;
  // Truncated plan file.
  fs::resize_file(plan, fs::file_size(plan) - 5);
  r = runTool(plan + " --input x=" + xPath);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "truncated: header says")) << r.out;
}

TEST_F(DlOptRun, RunsAndWritesOutputsAndParams) {
  std::string outDir = (dir / "out").string(), paramDir = (dir / "params").string();
  Result r = runTool(plan + " --input x=" + xPath + " --seed 5 --output-dir " +
                     outDir + " --save-params " + paramDir + " --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "model test_model (test.mlir): 1 rank(s)")) << r.out;
  EXPECT_TRUE(contains(r.out, "  loss = ")) << r.out;
  EXPECT_TRUE(contains(r.out, "  y: 2x4xf32  mean ")) << r.out;
  EXPECT_TRUE(contains(r.out, "memory: planned ")) << r.out;
  EXPECT_TRUE(contains(r.out, "time: ")) << r.out;

  Expected<HostTensor> w = readNpy(paramDir + "/w.npy");
  Expected<HostTensor> x = readNpy(xPath);
  Expected<HostTensor> y = readNpy(outDir + "/y.npy");
  Expected<HostTensor> loss = readNpy(outDir + "/loss.npy");
  ASSERT_TRUE(w.isOk() && x.isOk() && y.isOk() && loss.isOk());
  double total = 0;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      double acc = 0;
      for (int k = 0; k < 3; ++k)
        acc += x->elementAsDouble(i * 3 + k) * w->elementAsDouble(k * 4 + j);
      EXPECT_NEAR(y->elementAsDouble(i * 4 + j), acc, 1e-5);
      total += acc;
    }
  EXPECT_NEAR(loss->elementAsDouble(0), total, 1e-5);

  // Feeding the saved params back gives the same outputs, even with another
  // seed; the run is deterministic.
  std::string outDir2 = (dir / "out2").string();
  r = runTool(plan + " --quiet --seed 99 --input x=" + xPath + " --input w=" +
              paramDir + "/w.npy --output-dir " + outDir2);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(readNpy(outDir2 + "/y.npy")->bytes, y->bytes);

  // Another seed, other params, other loss.
  std::string outDir3 = (dir / "out3").string();
  r = runTool(plan + " --quiet --seed=6 --input=x=" + xPath + " --output-dir=" + outDir3);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(readNpy(outDir3 + "/y.npy")->bytes, y->bytes);
}

TEST_F(DlOptRun, Dump) {
  Result r = runTool(plan + " --dump");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "dlopt executable (format version 1)")) << r.out;
  EXPECT_TRUE(contains(r.out, "%2 = matmul(%0, %1) : 2x4xf32  test.mlir:1:3")) << r.out;
  EXPECT_TRUE(contains(r.out, "memory rank 0:")) << r.out;
}
