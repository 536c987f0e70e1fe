//===- CalibrationTest.cpp - Defaults, overrides, errors, docs ------------===//
#include "planner/Calibration.h"
#include "test/unit/planner/TestUtil.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

using namespace dlopt::planner;
using dlopt::planner::test::writeTemp;

TEST(Calibration, DefaultsAreValid) {
  Calibration c;
  EXPECT_TRUE(c.validate()) << c.validate().message();
  // The measured H100 GEMM (790 of 989 TFLOP/s) and copy (3.0 of 3.35 TB/s).
  EXPECT_DOUBLE_EQ(c.matmulLargeEfficiency, 0.80);
  EXPECT_DOUBLE_EQ(c.memoryBandwidthEfficiency, 0.90);
}

TEST(Calibration, OverrideSubsetKeepsTheRest) {
  auto c = parseCalibration(R"({"matmul_large_efficiency": 0.7,
                                "collective_launch_latency_us": 12,
                                "runtime_reserved_gib": 2})",
                            "cal.json");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_DOUBLE_EQ(c->matmulLargeEfficiency, 0.7);
  EXPECT_DOUBLE_EQ(c->collectiveLaunchLatency, 12e-6); // file unit: us
  EXPECT_DOUBLE_EQ(c->runtimeReservedBytes, 2.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(c->attentionEfficiency, Calibration{}.attentionEfficiency);
}

TEST(Calibration, OverridesStackOnABase) {
  Calibration base;
  base.attentionEfficiency = 0.4;
  auto c = parseCalibration(R"({"matmul_small_efficiency": 0.3})", "x", base);
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->attentionEfficiency, 0.4);
  EXPECT_DOUBLE_EQ(c->matmulSmallEfficiency, 0.3);
}

TEST(Calibration, FileAndRoundTrip) {
  Calibration c;
  c.interNodeBusEfficiency = 0.66;
  c.ncclBufferBytes = 32.0 * (1 << 20);
  auto path = writeTemp("cal.json", c.toJson());
  auto back = loadCalibration(path);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_DOUBLE_EQ(back->interNodeBusEfficiency, 0.66);
  EXPECT_DOUBLE_EQ(back->ncclBufferBytes, 32.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(back->collectiveLaunchLatency, c.collectiveLaunchLatency);
}

TEST(Calibration, Errors) {
  auto expectError = [](const std::string &text, const std::string &sub) {
    auto c = parseCalibration(text, "cal.json");
    ASSERT_FALSE(c) << text;
    EXPECT_NE(c.status().message().find(sub), std::string::npos)
        << c.status().message();
  };
  expectError(R"({"matmul_eff": 0.5})",
              "cal.json: unknown calibration key 'matmul_eff' (known: "
              "matmul_large_efficiency");
  // A key older calibrations carry that nothing reads any more is named,
  // not silently accepted.
  expectError(R"({"cp_overlap_efficiency": 0})",
              "cal.json: cp_overlap_efficiency is no longer read: dlopt's "
              "context parallelism gathers K and V before attention");
  expectError(R"({"attention_efficiency": 1.5})",
              "attention_efficiency: expected a fraction in (0, 1], got 1.5");
  expectError(R"({"attention_efficiency": 0})", "got 0");
  expectError(R"({"collective_launch_latency_us": -1})",
              "collective_launch_latency_us: expected a number >= 0, got -1");
  expectError(R"({"nccl_protocols": 0.5})",
              "nccl_protocols: expected 0 or 1, got 0.5");
  expectError(R"({"nccl_protocols": 2})", "expected 0 or 1, got 2");
  expectError(R"({"backward_flops_ratio": 0})",
              "backward_flops_ratio: expected a positive number");
  expectError(R"({"fragmentation_fraction": 1})", "[0, 1)");
  expectError(R"({"grad_bucket_mib": "25"})",
              "grad_bucket_mib: expected a number, got string");
  expectError("[1, 2]", "expected a JSON object of constants, got array");
  expectError("{", "cal.json: invalid JSON: ");
  expectError(R"({"attention_efficiency": 0.5, "attention_efficiency": 0.6})",
              "cal.json: duplicate key \"attention_efficiency\"");
  expectError(R"({"backward_flops_ratio": 1e999})", "number overflow");
  expectError(R"({"grad_bucket_mib": 1e308})",
              "grad_bucket_mib: expected a finite value");
  auto missing = loadCalibration("/nonexistent/cal.json");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("cannot open"), std::string::npos);
}

TEST(Calibration, GemmTableParsesRoundTripsAndRefusesBadGrids) {
  std::string rows;
  for (int m : {16, 256})
    for (int n : {16, 256})
      for (int k : {16, 256})
        rows += std::string(rows.empty() ? "" : ", ") + "[" +
                std::to_string(m) + ", " + std::to_string(n) + ", " +
                std::to_string(k) + ", 0.5]";
  auto c = parseCalibration("{\"gemm_table\": [" + rows + "]}", "cal.json");
  ASSERT_TRUE(c) << c.status().message();
  ASSERT_EQ(c->gemmTable.size(), 8u);
  EXPECT_EQ(c->gemmTable[1].k, 256);
  EXPECT_EQ(c->gemmTable[1].efficiency, 0.5);
  auto back = parseCalibration(c->toJson(), "round trip");
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->gemmTable.size(), 8u);
  EXPECT_EQ(Calibration{}.toJson().find("gemm_table"), std::string::npos);

  auto expectError = [](const std::string &table, const std::string &sub) {
    auto e = parseCalibration("{\"gemm_table\": " + table + "}", "cal.json");
    ASSERT_FALSE(e) << table;
    EXPECT_NE(e.status().message().find(sub), std::string::npos)
        << e.status().message();
    EXPECT_NE(e.status().message().find("cal.json"), std::string::npos);
  };
  expectError("3", "expected an array of [m, n, k, efficiency] rows, got number");
  expectError("[[16, 16, 16]]", "row 0: expected [m, n, k, efficiency]");
  expectError("[[16, 16, \"x\", 0.5]]", "row 0: expected numbers, got string");
  expectError("[[16, 16, 16, 0]]", "expected an efficiency in (0, 1], got 0");
  expectError("[[16, 16, 16, 1.5]]", "expected an efficiency in (0, 1]");
  expectError("[[16.5, 16, 16, 0.5]]", "whole numbers in [1, 2^31], got 16.5");
  expectError("[[0, 16, 16, 0.5]]", "whole numbers in [1, 2^31], got 0");
  expectError("[[16, 16, 16, 0.5], [16, 16, 16, 0.6]]", "appears twice");
  expectError("[[16, 16, 16, 0.5], [256, 16, 16, 0.5], [16, 256, 16, 0.5]]",
              "missing m=256 n=256 k=16");
  // 4097 rows (4097 values of m) are over the limit.
  std::string big = "[";
  for (int i = 0; i < 4097; ++i)
    big += std::string(i ? "," : "") + "[" + std::to_string(i + 1) +
           ",1,1,0.5]";
  expectError(big + "]", "at most 4096 rows");
}


TEST(Calibration, ConvTableParsesInGflopsRoundTripsAndRefusesBadGrids) {
  std::string rows;
  for (int m : {16, 512})
    for (int n : {32, 4096})
      for (int k : {9, 2304})
        rows += std::string(rows.empty() ? "" : ", ") + "[" +
                std::to_string(m) + ", " + std::to_string(n) + ", " +
                std::to_string(k) + ", 100, 80.5, 60]";
  auto c = parseCalibration("{\"conv_table\": [" + rows + "]}", "cal.json");
  ASSERT_TRUE(c) << c.status().message();
  ASSERT_EQ(c->convTable.size(), 8u);
  EXPECT_EQ(c->convTable[1].k, 2304);
  EXPECT_EQ(c->convTable[1].forward, 100e9); // GFLOP/s in the file
  EXPECT_EQ(c->convTable[1].gradInput, 80.5e9);
  EXPECT_EQ(c->convTable[1].gradFilter, 60e9);
  auto back = parseCalibration(c->toJson(), "round trip");
  ASSERT_TRUE(back) << back.status().message();
  ASSERT_EQ(back->convTable.size(), 8u);
  EXPECT_EQ(back->convTable[7].gradInput, 80.5e9);
  EXPECT_EQ(Calibration{}.toJson().find("conv_table"), std::string::npos);
  bool listed = false;
  for (const CalibrationKey &k : calibrationKeys())
    listed |= k.name == std::string("conv_table");
  EXPECT_TRUE(listed);

  auto expectError = [](const std::string &table, const std::string &sub) {
    auto e = parseCalibration("{\"conv_table\": " + table + "}", "cal.json");
    ASSERT_FALSE(e) << table;
    EXPECT_NE(e.status().message().find(sub), std::string::npos)
        << e.status().message();
    EXPECT_NE(e.status().message().find("cal.json"), std::string::npos);
  };
  expectError("{}", "conv_table: expected an array of [m, n, k, forward, "
                    "grad_input, grad_filter] (GFLOP/s) rows, got object");
  expectError("[[16, 32, 9, 1, 1]]", "conv_table row 0: expected [m, n, k");
  expectError("[[16, 32, 9, 1, 1, null]]", "row 0: expected numbers, got null");
  expectError("[[16, 32, 9, 1, 0, 1]]", "expected GFLOP/s in (0, 1e9], got 0");
  expectError("[[16, 32, 9, 1, 1, 2e9]]", "expected GFLOP/s in (0, 1e9]");
  expectError("[[16, 32, 9.5, 1, 1, 1]]", "whole numbers in [1, 2^31], got 9.5");
  expectError("[[16, 32, 9, 1, 1, 1], [16, 32, 9, 2, 2, 2]]", "appears twice");
  expectError("[[16, 32, 9, 1, 1, 1], [512, 32, 9, 1, 1, 1], "
              "[16, 4096, 9, 1, 1, 1]]",
              "conv_table: expected every combination of its m, n and k "
              "values (a grid of 2 x 2 x 1), missing m=512 n=4096 k=9");
}

TEST(Calibration, OpRatesParseRoundTripAndRefuseBadClasses) {
  auto c = parseCalibration(
      R"({"op_gb_s": {"stream": 200, "transcendental": 17.5}, "cache_mib": 16})",
      "cal.json");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_DOUBLE_EQ(c->opBandwidth[size_t(MemoryClass::Stream)], 200e9);
  EXPECT_DOUBLE_EQ(c->opBandwidth[size_t(MemoryClass::Transcendental)],
                   17.5e9);
  EXPECT_EQ(c->opBandwidth[size_t(MemoryClass::Norm)], 0.0);
  EXPECT_TRUE(c->hasOpBandwidth(MemoryClass::Stream));
  EXPECT_FALSE(c->hasOpBandwidth(MemoryClass::Pool));
  EXPECT_DOUBLE_EQ(c->cacheBytes, 16.0 * (1 << 20));
  auto back = parseCalibration(c->toJson(), "round trip");
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->opBandwidth, c->opBandwidth);
  EXPECT_DOUBLE_EQ(back->cacheBytes, c->cacheBytes);
  EXPECT_EQ(Calibration{}.toJson().find("op_gb_s"), std::string::npos);
  EXPECT_FALSE(Calibration{}.hasAnyOpBandwidth());

  // {"<key>": <value>} is refused with a message holding `sub`.
  auto expectError = [](const std::string &key, const std::string &value,
                        const std::string &sub) {
    auto e = parseCalibration("{\"" + key + "\": " + value + "}", "cal.json");
    ASSERT_FALSE(e) << key << " " << value;
    EXPECT_NE(e.status().message().find(sub), std::string::npos)
        << e.status().message();
    EXPECT_NE(e.status().message().find("cal.json"), std::string::npos);
  };
  expectError("op_gb_s", "12",
              "op_gb_s: expected an object of numbers by op class "
              "(stream, transcendental, norm, softmax, batch_norm, "
              "pool), got number");
  expectError("op_gb_s", R"({"gelu": 3})", "op_gb_s: unknown op class 'gelu'");
  expectError("op_gb_s", R"({"norm": "3"})",
              "op_gb_s.norm: expected a number, got string");
  expectError("op_gb_s", R"({"pool": -1})",
              "op_gb_s.pool: expected a number >= 0, got -1");
  expectError("op_gb_s", R"({"pool": 1e308})",
              "op_gb_s.pool: expected a number >= 0");
  Calibration bad;
  bad.opBandwidth[size_t(MemoryClass::Softmax)] = -1;
  EXPECT_FALSE(bad.validate().isOk());

  // op_backward_ratio: plain ratios by class, the same checks.
  auto r = parseCalibration(R"({"op_backward_ratio": {"batch_norm": 2.5}})",
                            "cal.json");
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->opBackwardRatio[size_t(MemoryClass::BatchNorm)], 2.5);
  EXPECT_EQ(r->opBackwardRatio[size_t(MemoryClass::Pool)], 0.0);
  auto rb = parseCalibration(r->toJson(), "round trip");
  ASSERT_TRUE(rb) << rb.status().message();
  EXPECT_EQ(rb->opBackwardRatio, r->opBackwardRatio);
  EXPECT_EQ(Calibration{}.toJson().find("op_backward_ratio"),
            std::string::npos);
  expectError("op_backward_ratio", R"({"pool": -2})",
              "op_backward_ratio.pool: expected a number >= 0, got -2");

  // op_row_ns: nanoseconds per row by class, stored in seconds.
  auto rows = parseCalibration(R"({"op_row_ns": {"pool": 21.5}})", "cal.json");
  ASSERT_TRUE(rows) << rows.status().message();
  EXPECT_DOUBLE_EQ(rows->opRowSeconds[size_t(MemoryClass::Pool)], 21.5e-9);
  EXPECT_EQ(rows->opRowSeconds[size_t(MemoryClass::Norm)], 0.0);
  auto rowsBack = parseCalibration(rows->toJson(), "round trip");
  ASSERT_TRUE(rowsBack) << rowsBack.status().message();
  EXPECT_EQ(rowsBack->opRowSeconds, rows->opRowSeconds);
  EXPECT_EQ(Calibration{}.toJson().find("op_row_ns"), std::string::npos);
  expectError("op_row_ns", R"({"pool": -1})",
              "op_row_ns.pool: expected a number >= 0, got -1");
  expectError("op_row_ns", R"({"plane": 1})",
              "op_row_ns: unknown op class 'plane'");
}

TEST(Calibration, PoolRowsAreItsOutputPlanes) {
  EXPECT_EQ(memoryRowsOf("dlopt.max_pool2d", {64, 32, 7, 7}), 64.0 * 32);
  EXPECT_EQ(memoryRowsOf("max_pool2d_grad", {64, 32, 14, 14}), 64.0 * 32);
  EXPECT_EQ(memoryRowsOf("avg_pool2d", {8, 3, 2, 2}), 24.0);
  EXPECT_EQ(memoryRowsOf("layer_norm", {64, 256}), 0.0); // not measured
  EXPECT_EQ(memoryRowsOf("max_pool2d", {4}), 0.0);
}

TEST(Calibration, OpsFallIntoTheirMemoryClass) {
  EXPECT_EQ(memoryClassOf("dlopt.add"), MemoryClass::Stream);
  EXPECT_EQ(memoryClassOf("relu"), MemoryClass::Stream);
  EXPECT_EQ(memoryClassOf("dlopt.transpose"), MemoryClass::Stream);
  EXPECT_EQ(memoryClassOf("dlopt.gelu"), MemoryClass::Transcendental);
  EXPECT_EQ(memoryClassOf("dlopt.silu"), MemoryClass::Transcendental);
  EXPECT_EQ(memoryClassOf("dlopt.dropout"), MemoryClass::Transcendental);
  EXPECT_EQ(memoryClassOf("dlopt.rms_norm"), MemoryClass::Norm);
  EXPECT_EQ(memoryClassOf("dlopt.layer_norm_grad"), MemoryClass::Norm);
  EXPECT_EQ(memoryClassOf("dlopt.cross_entropy"), MemoryClass::Softmax);
  EXPECT_EQ(memoryClassOf("dlopt.log_softmax"), MemoryClass::Softmax);
  EXPECT_EQ(memoryClassOf("dlopt.batch_norm"), MemoryClass::BatchNorm);
  EXPECT_EQ(memoryClassOf("dlopt.avg_pool2d_grad"), MemoryClass::Pool);
  EXPECT_EQ(memoryClassOf("dlopt.gelux"), MemoryClass::Stream);
  EXPECT_EQ(memoryClassOf("foo.gelu"), MemoryClass::Stream);
  for (size_t i = 0; i < kNumMemoryClasses; ++i)
    EXPECT_STRNE(memoryClassName(MemoryClass(i)), "?");
}

TEST(Calibration, EveryKeyIsDocumented) {
  std::ifstream in(std::string(DLOPT_SOURCE_DIR) + "/docs/cost-model.md");
  ASSERT_TRUE(in) << "docs/cost-model.md is missing";
  std::stringstream ss;
  ss << in.rdbuf();
  std::string doc = ss.str();
  for (const CalibrationKey &k : calibrationKeys())
    EXPECT_NE(doc.find("`" + k.name + "`"), std::string::npos)
        << k.name << " is not documented in docs/cost-model.md";
  // Each key's row in the constants table says where its default comes
  // from: a measurement, a source, dlopt-calibrate, or "assumption".
  const std::regex source("assumption|measured|dlopt-calibrate|section|"
                          "et al|NVIDIA/|PyTorch|NCCL|FlashAttention");
  for (const CalibrationKey &k : calibrationKeys()) {
    const std::string head = "| `" + k.name + "` |";
    size_t at = doc.find(head);
    if (at == std::string::npos) {
      ADD_FAILURE() << k.name << " has no row in the constants table";
      continue;
    }
    const std::string row = doc.substr(at, doc.find('\n', at) - at);
    EXPECT_TRUE(std::regex_search(row, source))
        << k.name << "'s row names no source and no assumption: " << row;
  }
}
