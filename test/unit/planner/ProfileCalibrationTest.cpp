//===- ProfileCalibrationTest.cpp - calibration from dlopt-run profiles ---===//
//
// planner/ProfileCalibration.h on profiles made from known figures: the
// derived constants must come back, and malformed documents must be
// refused naming the field.
//
//===----------------------------------------------------------------------===//

#include "planner/ProfileCalibration.h"

#include <gtest/gtest.h>

using namespace dlopt::planner;

namespace {

ProfileSamples cudaProfile() {
  ProfileSamples p;
  p.backend = "cuda";
  p.deviceTimed = true;
  p.runs = 2;
  p.instructionsPerRun = 3;
  p.issueSeconds = 60e-6; // 10 us per instruction
  return p;
}

TEST(ProfileCalibration, RecoversTheKnownRates) {
  const GpuSpec h100 = *gpuPreset("h100-sxm-80gb");
  const CostModel model;
  ProfileSamples p = cudaProfile();
  // A GEMM running at half the model's speed: gemm_peak_efficiency halves.
  ProfiledInstr mm;
  mm.op = "matmul";
  mm.dtype = "bf16";
  mm.calls = 2;
  mm.hasGemm = true;
  mm.gemm = GemmShape{8192, 8192, 8192, 1};
  mm.bytes = 3.0 * 8192 * 8192 * 2;
  mm.flops = mm.gemm.flops();
  const double modelTime =
      model.gemmTime(mm.gemm, mm.bytes, Precision::BF16, h100)->time;
  mm.seconds = 2 * (2 * modelTime);
  p.instrs.push_back(mm);
  // A forward attention at 30% of the bf16 peak.
  ProfiledInstr att;
  att.op = "attention";
  att.dtype = "bf16";
  att.calls = 4;
  att.flops = 1e12;
  att.seconds = 4 * 1e12 / (0.3 * h100.peak(Precision::BF16));
  p.instrs.push_back(att);
  // Memory-bound kernels at 60% of the HBM bandwidth, and communication and
  // the attention's backward, which do not count.
  ProfiledInstr add;
  add.op = "fused_elementwise";
  add.dtype = "bf16";
  add.calls = 10;
  add.bytes = 1e9;
  add.seconds = 10 * 1e9 / (0.6 * h100.memoryBandwidth);
  p.instrs.push_back(add);
  ProfiledInstr ar = add;
  ar.op = "all_reduce";
  ar.communication = true; // the op table's mark, as dlopt-run writes it
  ar.seconds = 1;
  p.instrs.push_back(ar);
  ProfiledInstr grad = add;
  grad.op = "attention_grad";
  grad.seconds = 1;
  p.instrs.push_back(grad);
  auto c = calibrateFromProfile({p}, h100);
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_NEAR(c->calibration.gemmPeakEfficiency, 0.84 / 2, 1e-9);
  EXPECT_NEAR(c->calibration.attentionEfficiency, 0.3, 1e-9);
  EXPECT_TRUE(c->calibration.attentionEfficiencyGiven);
  EXPECT_NEAR(c->calibration.memoryBandwidthEfficiency, 0.6, 1e-9);
  EXPECT_NEAR(c->calibration.kernelLaunchSeconds, 10e-6, 1e-15);
  // What was derived is reported.
  bool said = false;
  for (const std::string &l : c->lines)
    said |= l.find("gemm_peak_efficiency 0.420") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(ProfileCalibration, RatesMemoryBoundOpsByClass) {
  // The ops the planner prices one by one give their class's rate
  // (op_gb_s, forwards only) and, where the gradient kernel ran too, the
  // gradients' time over their forwards' (op_backward_ratio). Fusions,
  // views and the optimizer's update are the runtime's, not the planner's
  // ops, and do not count; nor does communication.
  const GpuSpec h100 = *gpuPreset("h100-sxm-80gb");
  ProfileSamples p = cudaProfile();
  auto op = [&](const char *name, int64_t calls, double bytes,
                double seconds) {
    ProfiledInstr in;
    in.op = name;
    in.dtype = "bf16";
    in.calls = calls;
    in.bytes = bytes;
    in.seconds = seconds;
    p.instrs.push_back(in);
  };
  op("layer_norm", 4, 1e8, 4e-4);      // 1 TB/s
  op("rms_norm", 2, 1e8, 1e-4);        // 2 TB/s
  op("layer_norm_grad", 4, 2e8, 1.2e-3); // 3x its forward's time
  op("add", 10, 1e8, 5e-4);            // 2 TB/s
  op("transpose", 10, 1e8, 1e-3);      // 1 TB/s
  op("gelu_grad", 2, 1e8, 1e-4);       // no gelu ran: no ratio, no rate
  op("fused_elementwise", 10, 1e9, 1); // not counted by class
  op("reshape", 10, 1e9, 1e-9);
  op("fused_adamw", 1, 1e9, 1);
  ProfiledInstr ar;
  ar.op = "all_reduce";
  ar.communication = true;
  ar.calls = 1;
  ar.bytes = 1e8;
  ar.seconds = 1;
  p.instrs.push_back(ar);
  auto c = calibrateFromProfile({p}, h100);
  ASSERT_TRUE(c) << c.status().message();
  const Calibration &k = c->calibration;
  // norm: 6e8 bytes in 5e-4 s; stream: 2e9 bytes in 1.5e-3 s.
  EXPECT_NEAR(k.opBandwidth[size_t(MemoryClass::Norm)], 6e8 / 5e-4, 1);
  EXPECT_NEAR(k.opBandwidth[size_t(MemoryClass::Stream)], 2e9 / 1.5e-3, 1);
  EXPECT_EQ(k.opBandwidth[size_t(MemoryClass::Transcendental)], 0);
  EXPECT_EQ(k.opBandwidth[size_t(MemoryClass::Softmax)], 0);
  // layer_norm_grad over layer_norm (rms_norm has no gradient here).
  EXPECT_NEAR(k.opBackwardRatio[size_t(MemoryClass::Norm)], 3.0, 1e-9);
  EXPECT_EQ(k.opBackwardRatio[size_t(MemoryClass::Transcendental)], 0);
  EXPECT_EQ(k.opBackwardRatio[size_t(MemoryClass::Stream)], 0);
  bool said = false;
  for (const std::string &l : c->lines)
    said |= l.find("op_gb_s stream 1.33e+03 GB/s (20 calls), norm 1.2e+03 "
                   "GB/s (6 calls, backward 3.00x)") != std::string::npos;
  EXPECT_TRUE(said);
  EXPECT_TRUE(k.validate().ok()) << k.validate().message();
}

TEST(ProfileCalibration, KeepsWhatWasNotMeasured) {
  // No attention ran: the GPU's own efficiency (0.34 on an H100) is kept,
  // not the generic default; nothing else timed keeps its default.
  const GpuSpec h100 = *gpuPreset("h100-sxm-80gb");
  ProfileSamples p = cudaProfile();
  ProfiledInstr add;
  add.op = "layer_norm";
  add.dtype = "bf16";
  add.calls = 1;
  add.bytes = 1e6;
  add.seconds = 1e-6;
  p.instrs.push_back(add);
  auto c = calibrateFromProfile({p}, h100);
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_DOUBLE_EQ(c->calibration.attentionEfficiency, h100.attentionEfficiency);
  EXPECT_DOUBLE_EQ(c->calibration.gemmPeakEfficiency, Calibration().gemmPeakEfficiency);
}

TEST(ProfileCalibration, RefusesTheWrongDeviceOrNothingTimed) {
  const GpuSpec h100 = *gpuPreset("h100-sxm-80gb");
  ProfileSamples cpu;
  cpu.backend = "cpu";
  auto c = calibrateFromProfile({cpu}, h100);
  ASSERT_FALSE(c);
  EXPECT_NE(c.status().message().find("taken on the cpu backend cannot "
                                      "calibrate H100-SXM-80GB"),
            std::string::npos)
      << c.status().message();
  auto none = calibrateFromProfile({cudaProfile()}, h100);
  ASSERT_FALSE(none);
  EXPECT_NE(none.status().message().find("no profiled instruction"),
            std::string::npos);
}

TEST(ProfileCalibration, ParsesWhatDloptRunWrites) {
  auto p = parseProfile(
      R"({"format": "dlopt-profile", "version": 1, "backend": "cuda",
          "device_timed": true, "runs": 3, "skipped": 1, "wall_seconds": 0.5,
          "issue_seconds": 0.01, "instructions_per_run": 2,
          "instructions": [
            {"index": 0, "op": "matmul", "calls": 3, "seconds": 0.2,
             "layer": 0, "results": ["32x64xbf16"],
             "operands": ["32x16xbf16", "16x64xbf16"], "flops": 65536,
             "bytes": 6144, "gemm": {"m": 32, "n": 64, "k": 16, "batch": 1},
             "loc": "m.mlir:3:4"},
            {"index": 1, "op": "attention", "calls": 3, "seconds": 0.1,
             "layer": 0, "communication": false,
             "results": ["1x2x8x4xf32"], "operands": [],
             "flops": 2048, "bytes": 512, "causal": true, "loc": ""}]})",
      "p.json");
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->backend, "cuda");
  EXPECT_TRUE(p->deviceTimed);
  EXPECT_EQ(p->runs, 3);
  EXPECT_EQ(p->instructionsPerRun, 2);
  ASSERT_EQ(p->instrs.size(), 2u);
  EXPECT_EQ(p->instrs[0].dtype, "bf16");
  EXPECT_TRUE(p->instrs[0].hasGemm);
  EXPECT_EQ(p->instrs[0].gemm.m, 32);
  EXPECT_EQ(p->instrs[0].gemm.k, 16);
  EXPECT_EQ(p->instrs[1].dtype, "f32");
  EXPECT_FALSE(p->instrs[1].hasGemm);
  EXPECT_FALSE(p->instrs[1].communication);
}

TEST(ProfileCalibration, RefusesMalformedProfilesNamingTheField) {
  auto expectError = [](const std::string &text, const std::string &what) {
    auto p = parseProfile(text, "p.json");
    ASSERT_FALSE(p) << text;
    EXPECT_NE(p.status().message().find(what), std::string::npos)
        << p.status().message();
    EXPECT_EQ(p.status().message().rfind("p.json: ", 0), 0u)
        << p.status().message();
  };
  const std::string head = R"({"format": "dlopt-profile", "version": 1,
      "backend": "cuda", "device_timed": true, "runs": 1,
      "instructions_per_run": 1, "issue_seconds": 0, "instructions": )";
  expectError("[1]", "expected a dlopt-run --profile-json object, got array");
  expectError(R"({"format": "other"})", "format: expected \"dlopt-profile\"");
  expectError(R"({"format": "dlopt-profile", "version": 2})",
              "version: expected 1, got 2");
  expectError(R"({"format": "dlopt-profile", "version": 1})",
              "missing 'backend'");
  expectError(head + "{}}", "instructions: expected an array");
  expectError(head + R"([{"op": "add", "calls": 1, "seconds": -1,
                          "flops": 0, "bytes": 0}]})",
              "instructions[0].seconds: expected a number in [0, 1e18], got -1");
  expectError(head + R"([{"op": "add", "calls": 1, "seconds": 1e300,
                          "flops": 0, "bytes": 0}]})",
              "instructions[0].seconds: expected a number in [0, 1e18], got 1e+300");
  expectError(head + R"([{"op": "add", "calls": 1.5, "seconds": 1,
                          "flops": 0, "bytes": 0}]})",
              "instructions[0].calls: expected an integer, got 1.5");
  expectError(head + R"([{"op": "matmul", "calls": 1, "seconds": 1,
                          "flops": 0, "bytes": 0, "gemm": [1, 2]}]})",
              "instructions[0].gemm: expected an object");
  expectError(head + R"([{"op": "matmul", "calls": 1, "seconds": 1,
                          "flops": 0, "bytes": 0, "gemm": {"m": 1}}]})",
              "instructions[0].gemm.n: expected a number, missing");
  expectError(head + R"([{"calls": 1}]})", "instructions[0].op: expected a string");
  expectError(head + R"([{"op": "all_reduce", "communication": 1}]})",
              "instructions[0].communication: expected true or false");
  expectError("{", "p.json: ");
}

} // namespace
