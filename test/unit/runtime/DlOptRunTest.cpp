//===- DlOptRunTest.cpp - The dlopt-run command line ----------------------===//

#include "TrainingModels.h"

#include "runtime/exec/Npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
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
  EXPECT_TRUE(contains(r.out, "dlopt-run: error: /nonexistent/model.plan: cannot "
                              "open plan file: No such file or directory"))
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
  EXPECT_TRUE(contains(r.out, "dlopt executable (format version 3)")) << r.out;
  EXPECT_TRUE(contains(r.out, "%2 = matmul(%0, %1) : 2x4xf32  test.mlir:1:3")) << r.out;
  EXPECT_TRUE(contains(r.out, "memory of program 0:")) << r.out;
}

//===----------------------------------------------------------------------===//
// Training (--steps)
//===----------------------------------------------------------------------===//

namespace {

class DlOptRunTrain : public DlOptRun {
protected:
  void SetUp() override {
    DlOptRun::SetUp();
    lmPlan = (dir / "lm.plan").string();
    ASSERT_TRUE(writeExecutable(bigramModel(16, 2, 5), lmPlan).isOk());
    clsPlan = (dir / "cls.plan").string();
    ASSERT_TRUE(writeExecutable(classifierModel(4, 3, 4), clsPlan).isOk());
    // A raw uint16 token stream over 16 ids.
    std::vector<uint8_t> b;
    for (int i = 0; i < 56; ++i) {
      uint16_t t = uint16_t((i * 3 + (i / 7) % 2) % 16);
      b.push_back(uint8_t(t));
      b.push_back(uint8_t(t >> 8));
    }
    tokens = (dir / "tokens.bin").string();
    std::ofstream(tokens, std::ios::binary)
        .write(reinterpret_cast<const char *>(b.data()), std::streamsize(b.size()));
    HostTensor x(tt({10, 3})), y(tt({10}, DType::I32));
    for (int i = 0; i < 10; ++i) {
      y.setElementFromDouble(i, i % 4);
      for (int d = 0; d < 3; ++d)
        x.setElementFromDouble(i * 3 + d, (d == i % 4 ? 2.0 : 0.0) + 0.1 * i);
    }
    images = (dir / "images.npy").string();
    labels = (dir / "labels.npy").string();
    ASSERT_TRUE(writeNpy(images, x).isOk());
    ASSERT_TRUE(writeNpy(labels, y).isOk());
  }

  /// The "loss" field of every line of a metrics file, as written.
  std::vector<std::string> losses(const std::string &path) {
    std::vector<std::string> out;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      size_t at = line.find("\"loss\": ");
      size_t end = line.find(',', at);
      out.push_back(line.substr(at + 8, end - at - 8));
    }
    return out;
  }

  std::string lmPlan, clsPlan, tokens, images, labels;
};

} // namespace

TEST_F(DlOptRunTrain, UsageErrors) {
  auto usage = [&](const std::string &args, const std::string &msg) {
    Result r = runTool(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, "dlopt-run: error: " + msg)) << r.out;
  };
  usage(lmPlan + " --data " + tokens, "--data needs --steps (training)");
  usage(lmPlan + " --steps 0", "--steps expects a positive integer, got '0'");
  usage(lmPlan + " --steps 2 --data " + tokens + " --data-input x=a.npy",
        "--data and --data-input cannot be combined");
  usage(lmPlan + " --steps 2 --data-dtype u8",
        "--data-dtype expects u16 or i32, got 'u8'");
  usage(lmPlan + " --steps 2 --checkpoint-every 3",
        "--checkpoint-every needs --checkpoint-dir");
  usage(lmPlan + " --steps 2 --eval-every 3",
        "--eval-every needs --eval-data or --eval-data-input");
  usage(lmPlan + " --steps 2 --output-dir o",
        "--output-dir does not apply to training (--steps)");
  usage(clsPlan + " --steps 2 --data-input labels", "--data-input expects "
                                                    "NAME=FILE.npy, got 'labels'");
}

TEST_F(DlOptRunTrain, Errors) {
  // An inference plan cannot train.
  Result r = runTool(plan + " --steps 3");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, plan + ": --steps needs a training-step plan, "
                                     "but no output updates a param or state"))
      << r.out;
  r = runTool(clsPlan + " --steps 1 --data " + tokens);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "--data feeds the input 'tokens', which the "
                              "model does not have"))
      << r.out;
  r = runTool(lmPlan + " --steps 1 --data " + (dir / "none.bin").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "No such file or directory")) << r.out;

  // Resuming from a missing, corrupt or foreign checkpoint writes nothing.
  std::string ckdir = (dir / "ck").string();
  r = runTool(lmPlan + " --steps 2 --resume " + (dir / "no.safetensors").string() +
              " --checkpoint-dir " + ckdir);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "no.safetensors: No such file or directory"))
      << r.out;
  EXPECT_FALSE(fs::exists(ckdir));
  r = runTool(clsPlan + " --steps 1 --quiet --checkpoint-dir " + ckdir);
  ASSERT_EQ(r.code, 0) << r.out;
  std::string clsCkpt = ckdir + "/step-000001.safetensors";
  ASSERT_TRUE(fs::exists(clsCkpt));
  std::string lmDir = (dir / "lmck").string();
  r = runTool(lmPlan + " --steps 2 --resume " + clsCkpt + " --checkpoint-dir " +
              lmDir);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "does not match this model")) << r.out;
  EXPECT_TRUE(contains(r.out, "param 'table' (16x16xf32) is missing")) << r.out;
  EXPECT_FALSE(fs::exists(lmDir));
  fs::resize_file(clsCkpt, fs::file_size(clsCkpt) - 4);
  auto before = fs::last_write_time(clsCkpt);
  r = runTool(clsPlan + " --steps 2 --resume " + clsCkpt + " --checkpoint-dir " +
              ckdir);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "lie outside the data")) << r.out;
  EXPECT_EQ(fs::last_write_time(clsCkpt), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(ckdir), {}), 1);
}

TEST_F(DlOptRunTrain, TokenDataProgressAndResume) {
  std::string m1 = (dir / "full.jsonl").string();
  Result r = runTool(lmPlan + " --steps 6 --data " + tokens +
                     " --seed 3 --metrics " + m1 + " --log-every 2");
  ASSERT_EQ(r.code, 0) << r.out;
  // Not a terminal: plain lines every 2 steps and the summary.
  EXPECT_TRUE(contains(r.out, "training steps 1 to 6 on tokens:" + tokens))
      << r.out;
  EXPECT_FALSE(contains(r.out, "step 1/6 ")) << r.out;
  EXPECT_TRUE(contains(r.out, "step 2/6  loss ")) << r.out;
  EXPECT_TRUE(contains(r.out, "  lr 0.5  grad_norm ")) << r.out;
  EXPECT_TRUE(contains(r.out, " tokens/s ")) << r.out;
  EXPECT_TRUE(contains(r.out, "trained 6 steps in ")) << r.out;
  std::vector<std::string> full = losses(m1);
  ASSERT_EQ(full.size(), 6u);

  // 3 steps, checkpoint at exit, resume for 3 more: the same losses.
  std::string ck = (dir / "ck").string(), m2 = (dir / "resumed.jsonl").string();
  r = runTool(lmPlan + " --steps 3 --data " + tokens + " --seed 3 --metrics " +
              m2 + " --checkpoint-dir " + ck);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "checkpoint: " + ck + "/step-000003.safetensors"))
      << r.out;
  std::string params = (dir / "params").string();
  r = runTool(lmPlan + " --steps 3 --data " + tokens + " --metrics " + m2 +
              " --resume " + ck + "/step-000003.safetensors --save-params " +
              params);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "training steps 4 to 6")) << r.out;
  EXPECT_EQ(losses(m2), full);
  EXPECT_TRUE(fs::exists(params + "/table.npy"));
}

TEST_F(DlOptRunTrain, ClassifierEvalAndCheckpoints) {
  std::string ck = (dir / "ck").string(), m = (dir / "m.jsonl").string();
  Result r = runTool(clsPlan + " --steps 5 --data-input images=" + images +
                     " --data-input labels=" + labels + " --eval-data-input images=" +
                     images + " --eval-data-input labels=" + labels +
                     " --eval-every 2 --checkpoint-dir " + ck +
                     " --checkpoint-every 2 --metrics " + m);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "samples/s")) << r.out;
  EXPECT_TRUE(contains(r.out, "eval at step 2: loss ")) << r.out;
  EXPECT_TRUE(contains(r.out, "accuracy ")) << r.out;
  EXPECT_TRUE(contains(r.out, "eval at step 5: loss ")) << r.out; // the end
  EXPECT_TRUE(contains(r.out, "(2 batches)")) << r.out;
  for (const char *f : {"step-000002", "step-000004", "step-000005"})
    EXPECT_TRUE(fs::exists(ck + "/" + f + ".safetensors")) << f;
  EXPECT_EQ(std::distance(fs::directory_iterator(ck), {}), 3); // no temp files
  EXPECT_EQ(losses(m).size(), 5u);

  // Synthetic data by default; the NaN stop.
  r = runTool(clsPlan + " --steps 2 --quiet");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "");
  std::string nanPlan = (dir / "nan.plan").string();
  ASSERT_TRUE(writeExecutable(divergingModel(false), nanPlan).isOk());
  r = runTool(nanPlan + " --steps 5");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "dlopt-run: error: loss is nan at step 3; "
                              "stopping"))
      << r.out;
  std::string scaledPlan = (dir / "scaled.plan").string();
  ASSERT_TRUE(writeExecutable(divergingModel(true), scaledPlan).isOk());
  r = runTool(scaledPlan + " --steps 4");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "step skipped by loss scaling")) << r.out;
}
