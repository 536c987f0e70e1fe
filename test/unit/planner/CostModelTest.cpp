//===- CostModelTest.cpp - Formulas against hand-computed cases -----------===//
//
// Numbers below use the dgx-h100 preset and the default calibration:
//   NVLink 450 GB/s/dir x 0.80 = 360 GB/s effective, alpha_intra = 1 us
//   network 400 GB/s/node / 8 GPUs = 50 GB/s/rank x 0.85 = 42.5 GB/s,
//   alpha_inter = 5 us, launch latency L = 8 us.
//
//===----------------------------------------------------------------------===//
#include "planner/CostModel.h"
#include "test/unit/planner/TestUtil.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace dlopt::planner;

namespace {

constexpr double kRel = 1e-9;

struct Fixture : ::testing::Test {
  void SetUp() override {
    auto c = resolveCluster("dgx-h100:16");
    ASSERT_TRUE(c);
    cluster = *c;
  }
  CommGroup group(int size, int stride, int first = 0) {
    auto g = cluster.stridedGroup(size, stride, first);
    EXPECT_TRUE(g) << g.status().message();
    return *g;
  }
  CommEstimate comm(Collective c, double bytes, const CommGroup &g,
                    CommAlgorithm a = CommAlgorithm::Auto) {
    auto e = model.commTime(c, bytes, g, a);
    EXPECT_TRUE(e) << e.status().message();
    return e ? *e : CommEstimate{};
  }
  /// The one-protocol alpha-beta terms (nccl_protocols 0), which the
  /// tests of each algorithm's shape check by hand.
  void onePerCall() {
    Calibration c;
    c.ncclProtocols = 0;
    model = CostModel(c);
  }
  Cluster cluster;
  CostModel model;
};

using CommTest = Fixture;

} // namespace

//===----------------------------------------------------------------------===//
// Compute: roofline
//===----------------------------------------------------------------------===//

TEST(Compute, RooflineComputeAndMemoryBound) {
  CostModel m;
  GpuSpec h100 = *gpuPreset("h100-sxm-80gb");
  // 989e12 * 0.8 = 791.2e12 FLOP/s; 3.35e12 * 0.9 = 3.015e12 B/s.
  OpCost op{OpKind::Matmul, Precision::BF16, 791.2e12 / 2, 3.015e12 / 4};
  auto e = m.computeTime(op, h100);
  ASSERT_TRUE(e);
  EXPECT_REL(e->computeTime, 0.5, kRel);
  EXPECT_REL(e->memoryTime, 0.25, kRel);
  EXPECT_REL(e->time, 0.5, kRel);
  EXPECT_FALSE(e->memoryBound());

  // Elementwise: 1e9 FLOPs at 0.5 x 989e12 = 2.0222e-6 s; 3.015e9 bytes at
  // 3.015e12 B/s = 1e-3 s -> memory bound.
  OpCost ew{OpKind::Elementwise, Precision::BF16, 1e9, 3.015e9};
  auto f = m.computeTime(ew, h100);
  ASSERT_TRUE(f);
  EXPECT_REL(f->computeTime, 1e9 / (989e12 * 0.5), kRel);
  EXPECT_REL(f->time, 1e-3, kRel);
  EXPECT_TRUE(f->memoryBound());
}

TEST(Compute, OptimizerUpdateAtItsCalibratedRate) {
  GpuSpec h100 = *gpuPreset("h100-sxm-80gb");
  // Uncalibrated: the elementwise roofline, 3.015e9 bytes at 3.015e12 B/s.
  auto d = CostModel().optimizerTime(1e9, 3.015e9, Precision::BF16, h100);
  ASSERT_TRUE(d);
  EXPECT_REL(d->time, 1e-3, kRel);
  // optimizer_gb_s = 1000: the same bytes take 3.015 ms; the FLOP side
  // stays the elementwise one (and binds when it is the larger).
  Calibration cal;
  cal.optimizerBandwidth = 1e12;
  CostModel m(cal);
  auto e = m.optimizerTime(1e9, 3.015e9, Precision::BF16, h100);
  ASSERT_TRUE(e);
  EXPECT_REL(e->memoryTime, 3.015e-3, kRel);
  EXPECT_REL(e->computeTime, 1e9 / (989e12 * 0.5), kRel);
  EXPECT_REL(e->time, 3.015e-3, kRel);
  auto f = m.optimizerTime(1e13, 1e9, Precision::BF16, h100);
  ASSERT_TRUE(f);
  EXPECT_REL(f->time, 1e13 / (989e12 * 0.5), kRel);
  EXPECT_FALSE(m.optimizerTime(1e9, -1, Precision::BF16, h100));
}

TEST(Compute, MemoryBoundOpsAtTheirClassRate) {
  GpuSpec dev = *gpuPreset("h100-sxm-80gb");
  dev.memoryBandwidth = 100e9; // with memory_bandwidth_efficiency 0.5: 50 GB/s
  Calibration cal;
  cal.memoryBandwidthEfficiency = 0.5;
  // Without rates: every class at the memory bandwidth.
  CostModel plain(cal);
  EXPECT_REL(plain.memoryTime(MemoryClass::Transcendental, 1e8, dev), 2e-3,
             kRel);
  cal.opBandwidth[size_t(MemoryClass::Stream)] = 200e9;
  cal.opBandwidth[size_t(MemoryClass::Transcendental)] = 10e9;
  cal.cacheBytes = 16e6;
  CostModel m(cal);
  // In the cache: the class's own rate, faster or slower than memory.
  EXPECT_REL(m.memoryTime(MemoryClass::Stream, 8e6, dev), 8e6 / 200e9, kRel);
  EXPECT_REL(m.memoryTime(MemoryClass::Transcendental, 8e6, dev), 8e6 / 10e9,
             kRel);
  // A class without a rate: the memory bandwidth.
  EXPECT_REL(m.memoryTime(MemoryClass::Norm, 8e6, dev), 8e6 / 50e9, kRel);
  // Beyond the cache: no faster than the memory bandwidth.
  EXPECT_REL(m.memoryTime(MemoryClass::Stream, 32e6, dev), 32e6 / 50e9, kRel);
  EXPECT_REL(m.memoryTime(MemoryClass::Transcendental, 32e6, dev),
             32e6 / 10e9, kRel);
  EXPECT_EQ(m.memoryTime(MemoryClass::Stream, 0, dev), 0.0);
  // cache_mib 0: the ceiling at any size.
  cal.cacheBytes = 0;
  EXPECT_REL(CostModel(cal).memoryTime(MemoryClass::Stream, 8e6, dev),
             8e6 / 50e9, kRel);
  // The roofline: memory side by class, FLOP side as any elementwise op.
  auto e = m.elementwiseTime(MemoryClass::Stream, 1e3, 8e6, Precision::FP32,
                             dev);
  ASSERT_TRUE(e) << e.status().message();
  EXPECT_REL(e->memoryTime, 8e6 / 200e9, kRel);
  EXPECT_REL(e->time, 8e6 / 200e9, kRel);
  auto f = m.elementwiseTime(MemoryClass::Stream, 1e13, 8e6, Precision::FP32,
                             dev);
  ASSERT_TRUE(f);
  EXPECT_REL(f->time, 1e13 / (dev.peak(Precision::FP32) * 0.5), kRel);
  EXPECT_FALSE(m.elementwiseTime(MemoryClass::Stream, 1, -1, Precision::FP32,
                                 dev));
}

TEST(Compute, EfficiencyPerKindAndPrecision) {
  CostModel m;
  GpuSpec a100 = *gpuPreset("a100-sxm-80gb");
  // Small matmul (< 1e10 FLOPs): 1e9 / (312e12 * 0.5) = 6.4103e-6 s.
  auto small = m.computeTime({OpKind::Matmul, Precision::BF16, 1e9, 0}, a100);
  ASSERT_TRUE(small);
  EXPECT_REL(small->time, 1e9 / 156e12, kRel);
  // Attention at 0.6: 1e12 / (312e12 * 0.6) = 5.3419e-3 s.
  auto att = m.computeTime({OpKind::Attention, Precision::FP16, 1e12, 0}, a100);
  ASSERT_TRUE(att);
  EXPECT_REL(att->time, 1e12 / (312e12 * 0.6), kRel);
  // The H100 runs the same FlashAttention-2-class kernels at 0.34 of its
  // 989 TFLOP/s (they cannot use wgmma): 1e12 / (989e12 * 0.34).
  GpuSpec h100 = *gpuPreset("h100-sxm-80gb");
  auto hatt = m.computeTime({OpKind::Attention, Precision::BF16, 1e12, 0}, h100);
  ASSERT_TRUE(hatt);
  EXPECT_REL(hatt->time, 1e12 / (989e12 * 0.34), kRel);
  // A GPU without its own figure takes the calibration's; a calibration
  // that gives attention_efficiency (a file, dlopt-calibrate) wins over
  // the GPU's.
  GpuSpec plain = h100;
  plain.attentionEfficiency = 0;
  EXPECT_REL(m.computeTime({OpKind::Attention, Precision::BF16, 1e12, 0}, plain)
                 ->time,
             1e12 / (989e12 * 0.6), kRel);
  auto given = parseCalibration(R"({"attention_efficiency": 0.5})", "cal.json");
  ASSERT_TRUE(given) << given.status().message();
  EXPECT_TRUE(given->attentionEfficiencyGiven);
  CostModel withGiven(*given);
  EXPECT_REL(
      withGiven.computeTime({OpKind::Attention, Precision::BF16, 1e12, 0}, h100)
          ->time,
      1e12 / (989e12 * 0.5), kRel);
  EXPECT_FALSE(Calibration().attentionEfficiencyGiven);
  // fp32 on A100: 19.5 TFLOP/s.
  auto fp32 = m.computeTime({OpKind::Matmul, Precision::FP32, 1e12, 0}, a100);
  ASSERT_TRUE(fp32);
  EXPECT_REL(fp32->time, 1e12 / (19.5e12 * 0.8), kRel);
}

namespace {
/// A 2 x 2 x 2 grid over {16, 256} with efficiency 0.1 + 0.4 [m=256] +
/// 0.2 [n=256] + 0.1 [k=256] (0.1 at 16^3, 0.8 at 256^3).
std::vector<GemmTableRow> grid2() {
  std::vector<GemmTableRow> t;
  for (double m : {16.0, 256.0})
    for (double n : {16.0, 256.0})
      for (double k : {16.0, 256.0})
        t.push_back({m, n, k,
                     0.1 + 0.4 * (m == 256) + 0.2 * (n == 256) +
                         0.1 * (k == 256)});
  return t;
}
} // namespace

TEST(Compute, GemmTableInterpolatesInLogDims) {
  const auto t = grid2();
  // Grid points are the measurements.
  EXPECT_REL(gemmTableEfficiency(t, 16, 16, 16), 0.1, kRel);
  EXPECT_REL(gemmTableEfficiency(t, 256, 256, 256), 0.8, kRel);
  EXPECT_REL(gemmTableEfficiency(t, 256, 16, 256), 0.6, kRel);
  // m = 64 is halfway from 16 to 256 in log2 (4 -> 6 -> 8): half of m's
  // 0.4; n = 32 a quarter of n's 0.2; k = 128 three quarters of k's 0.1.
  EXPECT_REL(gemmTableEfficiency(t, 64, 256, 256), 0.1 + 0.2 + 0.2 + 0.1,
             kRel);
  EXPECT_REL(gemmTableEfficiency(t, 64, 32, 128),
             0.1 + 0.2 + 0.05 + 0.075, kRel);
  // Above the grid: the largest point's value.
  EXPECT_REL(gemmTableEfficiency(t, 4096, 1e6, 256), 0.8, kRel);
  // Below it: as long as the smallest point, so the efficiency shrinks
  // with the dim (8 rows of 16: half; 4 columns: a quarter more).
  EXPECT_REL(gemmTableEfficiency(t, 8, 256, 256), 0.4 * 0.5, kRel);
  EXPECT_REL(gemmTableEfficiency(t, 8, 4, 16), 0.1 * 0.5 * 0.25, kRel);
  // Nothing to read.
  EXPECT_EQ(gemmTableEfficiency({}, 64, 64, 64), 0.0);
  EXPECT_EQ(gemmTableEfficiency(t, 0, 64, 64), 0.0);
}

TEST(Compute, GemmTablePricesDevicesWithoutAnSmCount) {
  Calibration cal;
  cal.gemmTable = grid2();
  CostModel m(cal);
  GpuSpec cpu = clusterPreset("cpu")->groups.front().gpu;
  ASSERT_LE(cpu.sms, 0);
  EXPECT_REL(m.gemmEfficiency({64, 256, 256}, Precision::FP32, cpu), 0.6,
             kRel);
  // The time is the roofline at that efficiency.
  GemmShape g{256, 256, 256};
  auto e = m.gemmTime(g, 0, Precision::FP32, cpu);
  ASSERT_TRUE(e) << e.status().message();
  EXPECT_REL(e->time, g.flops() / (cpu.peak(Precision::FP32) * 0.8), kRel);
  // A GPU with an SM count keeps its tile model; without a table, the
  // size classes.
  GpuSpec h100 = *gpuPreset("h100-sxm-80gb");
  EXPECT_REL(m.gemmEfficiency({8192, 8192, 8192}, Precision::BF16, h100),
             CostModel().gemmEfficiency({8192, 8192, 8192}, Precision::BF16,
                                        h100),
             kRel);
  EXPECT_REL(CostModel().gemmEfficiency({256, 256, 256}, Precision::FP32, cpu),
             cal.matmulSmallEfficiency, kRel);
}


TEST(Compute, ConvTablePricesEachPassAtItsMeasuredRate) {
  // A 2 x 2 x 2 grid whose rates differ by pass and grow with each dim.
  std::vector<ConvTableRow> t;
  for (double m : {16.0, 256.0})
    for (double n : {32.0, 4096.0})
      for (double k : {9.0, 2304.0}) {
        const double base =
            1e9 * (10 + 40 * (m == 256) + 20 * (n == 4096) + 10 * (k == 2304));
        t.push_back({m, n, k, base, 2 * base, 0.5 * base});
      }
  // Grid points, then the same log-linear interpolation as gemm_table:
  // m = 64 is halfway from 16 to 256.
  EXPECT_REL(convTableRate(t, ConvPass::Forward, 16, 32, 9), 10e9, kRel);
  EXPECT_REL(convTableRate(t, ConvPass::GradInput, 256, 4096, 2304), 160e9,
             kRel);
  EXPECT_REL(convTableRate(t, ConvPass::GradFilter, 256, 32, 9), 25e9, kRel);
  EXPECT_REL(convTableRate(t, ConvPass::Forward, 64, 4096, 2304), 60e9, kRel);
  // Below the grid the rate shrinks with the dim; above, the edge's.
  EXPECT_REL(convTableRate(t, ConvPass::Forward, 8, 1e6, 1e5), 0.5 * 40e9,
             kRel);
  Calibration cal;
  cal.convTable = t;
  CostModel cm(cal);
  GpuSpec cpu = clusterPreset("cpu")->groups.front().gpu;
  // The time is the pass's FLOPs, 2 m n k groups, at its rate.
  GemmShape fwd{16, 32, 9, 3};
  auto f = cm.convTime(ConvPass::Forward, fwd, cpu);
  auto gi = cm.convTime(ConvPass::GradInput, fwd, cpu);
  ASSERT_TRUE(f && gi);
  EXPECT_REL(*f, 2.0 * 16 * 32 * 9 * 3 / 10e9, kRel);
  EXPECT_REL(*gi, *f / 2, kRel);
  // No table, an empty shape, or a GPU with an SM count: not priced here.
  EXPECT_FALSE(CostModel().convTime(ConvPass::Forward, fwd, cpu));
  EXPECT_FALSE(cm.convTime(ConvPass::Forward, GemmShape{0, 32, 9}, cpu));
  EXPECT_FALSE(
      cm.convTime(ConvPass::Forward, fwd, *gpuPreset("h100-sxm-80gb")));
}

TEST(Compute, GemmTileAndWaveQuantization) {
  CostModel m;
  GpuSpec h100 = *gpuPreset("h100-sxm-80gb"); // 132 SMs
  // 8192^3: 64 x 32 = 2048 tiles of 128 x 256 in 16 waves of 132 (2112
  // slots): 2048/2112 filled; K share 8192 / (8192 + 3 x 64) in bf16.
  GemmShape big{8192, 8192, 8192};
  EXPECT_REL(m.gemmEfficiency(big, Precision::BF16, h100),
             0.84 * (2048.0 / 2112) * (8192.0 / 8384), kRel);
  // A tensor-parallel slice, n = 2560 (GPT-3 530B's q at tp = 8) and
  // m = 2048 tokens: 16 x 10 = 160 tiles of 128 x 256 in 2 waves of 132
  // (264 slots), but 16 x 20 = 320 tiles of 128 x 128 in 3 waves (396):
  // the better shape wins.
  GemmShape slice{2048, 2560, 20480};
  EXPECT_REL(m.gemmEfficiency(slice, Precision::BF16, h100),
             0.84 * (320.0 / 396) * (20480.0 / 20672), kRel);
  // Partial tiles: m = 96 fills 96/128 of its row of tiles.
  GemmShape ragged{96, 256 * 132, 4096};
  EXPECT_REL(m.gemmEfficiency(ragged, Precision::BF16, h100),
             0.84 * (96.0 / 128) * (4096.0 / 4288), kRel);
  // A dim that is not a multiple of 16 bytes (GPT-2's 50257-word head):
  // the unaligned kernels. 128 x 128 tiles: 64 x 393 = 25152 in 191 waves.
  GemmShape head{8192, 50257, 768};
  EXPECT_REL(m.gemmEfficiency(head, Precision::BF16, h100),
             0.84 * (8192.0 * 50257 / (191 * 132 * 128 * 128)) *
                 (768.0 / 960) * 0.19,
             kRel);
  // A short K loop pays the tile's fixed cost: k = 64 against 192.
  GemmShape shortK{128 * 12, 256 * 11, 64};
  EXPECT_REL(m.gemmEfficiency(shortK, Precision::BF16, h100),
             0.84 * 1.0 * (64.0 / 256), kRel);
  // fp8 steps 128 elements of K per 128 bytes, fp32 32.
  EXPECT_REL(m.gemmEfficiency(big, Precision::FP8, h100),
             0.84 * (2048.0 / 2112) * (8192.0 / 8576), kRel);
  EXPECT_REL(m.gemmEfficiency(big, Precision::FP32, h100),
             0.84 * (2048.0 / 2112) * (8192.0 / 8288), kRel);
  // Batched GEMMs share the waves: 4 x (8 x 4 tiles) = 128 of 132 slots.
  GemmShape batched{1024, 1024, 1024, 4};
  EXPECT_REL(m.gemmEfficiency(batched, Precision::BF16, h100),
             0.84 * (128.0 / 132) * (1024.0 / 1216), kRel);
  // More SMs than tiles never helps past full tiles; more waves of the
  // same fill never hurt.
  EXPECT_LE(m.gemmEfficiency(slice, Precision::BF16, h100),
            m.gemmEfficiency(big, Precision::BF16, h100));
  // Thin tiles: 64 rows fill a 64-row GEMM's tiles where 128 fill half.
  // 64 x 256 tiles: 132 in one wave.
  GemmShape thin{64, 256 * 132, 4096};
  EXPECT_REL(m.gemmEfficiency(thin, Precision::BF16, h100),
             0.84 * 1.0 * (4096.0 / 4288), kRel);
  // Split-K: 512 x 512 outputs are 16 tiles of 128 x 128 for 132 SMs;
  // K = 16384 splits into 8 slices of 2048 (128 tiles, one wave), and the
  // fp32 partials (2 x 8 x 512 x 512 x 4 bytes) go through HBM once each
  // way. (128 x 256 tiles split 16 ways do worse: a K share of 1024/1216.)
  GemmShape deep{512, 512, 16384};
  {
    const double eff0 = 0.84 * (512.0 * 512 * 8 / (132 * 128 * 128)) *
                        (2048.0 / 2240);
    const double t = deep.flops() / (989e12 * eff0) +
                     2 * 8 * 512.0 * 512 * 4 / (h100.memoryBandwidth * 0.9);
    EXPECT_REL(m.gemmEfficiency(deep, Precision::BF16, h100),
               deep.flops() / (989e12 * t), kRel);
    // Without split-K: 16 of 132 slots.
    Calibration noSplit;
    noSplit.gemmMaxSplitK = 1;
    EXPECT_REL(CostModel(noSplit).gemmEfficiency(deep, Precision::BF16, h100),
               0.84 * (512.0 * 512 / (132 * 128 * 128)) * (16384.0 / 16576),
               kRel);
    EXPECT_GT(m.gemmEfficiency(deep, Precision::BF16, h100),
              5 * CostModel(noSplit).gemmEfficiency(deep, Precision::BF16, h100));
  }
  // A grid that fills a wave is never split, nor a K too short to share.
  Calibration noSplit;
  noSplit.gemmMaxSplitK = 1;
  EXPECT_DOUBLE_EQ(m.gemmEfficiency(slice, Precision::BF16, h100),
                   CostModel(noSplit).gemmEfficiency(slice, Precision::BF16, h100));
  GemmShape shallow{512, 512, 256};
  EXPECT_DOUBLE_EQ(m.gemmEfficiency(shallow, Precision::BF16, h100),
                   CostModel(noSplit).gemmEfficiency(shallow, Precision::BF16, h100));
  // Without an SM count, the size classes of old.
  GpuSpec cpu = *gpuPreset("cpu-device");
  EXPECT_EQ(cpu.sms, 0);
  EXPECT_DOUBLE_EQ(m.gemmEfficiency(big, Precision::BF16, cpu), 0.80);
  EXPECT_DOUBLE_EQ(m.gemmEfficiency({64, 64, 64}, Precision::BF16, cpu), 0.50);
  // The roofline: compute at that efficiency, or the bytes if slower.
  auto t = m.gemmTime(big, 3 * 8192.0 * 8192 * 2, Precision::BF16, h100);
  ASSERT_TRUE(t);
  EXPECT_REL(t->computeTime,
             big.flops() / (989e12 * m.gemmEfficiency(big, Precision::BF16, h100)),
             kRel);
  EXPECT_FALSE(t->memoryBound());
  EXPECT_FALSE(m.gemmTime(big, 0, Precision::FP8, *gpuPreset("a100-sxm-80gb")));
}

TEST(Compute, Errors) {
  CostModel m;
  GpuSpec a100 = *gpuPreset("a100-sxm-80gb");
  auto fp8 = m.computeTime({OpKind::Matmul, Precision::FP8, 1e12, 0}, a100);
  ASSERT_FALSE(fp8);
  EXPECT_EQ(fp8.status().message(),
            "A100-SXM-80GB has no fp8 peak: cannot run a matmul op in that "
            "precision");
  auto neg = m.computeTime({OpKind::Matmul, Precision::BF16, -1, 0}, a100);
  ASSERT_FALSE(neg);
  EXPECT_NE(neg.status().message().find("expected flops and bytes >= 0"),
            std::string::npos);
}

TEST(Compute, TrainingTimeWithRecompute) {
  CostModel m; // backward = 2 x forward
  EXPECT_DOUBLE_EQ(m.trainingTime(1.0, RecomputePolicy::None), 3.0);
  EXPECT_DOUBLE_EQ(m.trainingTime(1.0, RecomputePolicy::Full), 4.0);
  EXPECT_DOUBLE_EQ(m.trainingTime(1.0, RecomputePolicy::Selective, 0.2), 3.2);
}

//===----------------------------------------------------------------------===//
// Communication: alpha-beta per algorithm (one protocol, then NCCL's)
//===----------------------------------------------------------------------===//

TEST_F(CommTest, RingAllReduceInsideANode) {
  onePerCall();
  // 8 ranks, S = 1 GB: 2*7/8 * 1e9 / 360e9 = 4.86111e-3 s;
  // latency 8 us + 2*7 * 1 us = 22 us.
  auto e = comm(Collective::AllReduce, 1e9, group(8, 1), CommAlgorithm::Ring);
  EXPECT_REL(e.bandwidthTerm, 1.75e9 / 360e9, kRel);
  EXPECT_REL(e.latencyTerm, 22e-6, kRel);
  EXPECT_REL(e.time, 1.75e9 / 360e9 + 22e-6, kRel);
  EXPECT_EQ(e.link, LinkKind::IntraNode);
  // Tree: 2 * 1e9 / 360e9 is slower than the ring; but the DGX H100's
  // NVSwitch fabric has NVLink SHARP, and Auto picks NVLS (below).
  auto a = comm(Collective::AllReduce, 1e9, group(8, 1));
  EXPECT_EQ(a.algorithm, CommAlgorithm::Nvls);
  // Without SHARP (an A100 node's NVSwitch), ring.
  auto a100 = resolveCluster("dgx-a100");
  ASSERT_TRUE(a100);
  auto g = a100->stridedGroup(8, 1, 0);
  ASSERT_TRUE(g);
  auto r = model.commTime(Collective::AllReduce, 1e9, *g);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->algorithm, CommAlgorithm::Ring);
}

TEST_F(CommTest, NvlsAllReduceInsideAnH100Node) {
  onePerCall();
  // (n+1)/n S / (B * nvls_efficiency) = 9/8 * 1e9 / (450e9 * 0.68); latency
  // 8 us + 2 x 1 us. nccl-tests' bus bandwidth of that: 2*7/8 S / t ~ 476
  // GB/s (NVIDIA quotes about 480), where the ring reaches 360
  // (1.75 S / (450e9 * 0.8)).
  auto e = comm(Collective::AllReduce, 1e9, group(8, 1), CommAlgorithm::Nvls);
  EXPECT_REL(e.bandwidthTerm, 9.0 / 8 * 1e9 / (450e9 * 0.68), kRel);
  EXPECT_REL(e.latencyTerm, 10e-6, kRel);
  EXPECT_EQ(e.link, LinkKind::IntraNode);
  EXPECT_NEAR(1.75e9 / e.time / 1e9, 480, 8);
  // The algorithm bandwidth (S / t) of NCCL_ALGO=NVLS on 4 to 8 H100s of
  // one node, 2-4 GB messages (NVIDIA/nccl issue 1455): 247 (bus 370),
  // 258, 265, 270 and 273 GB/s. The (n+1)/n term follows it within 2%.
  const std::pair<int, double> measured[] = {
      {4, 247}, {5, 258}, {6, 265}, {7, 270}, {8, 273}};
  for (auto [n, algbw] : measured) {
    auto x = comm(Collective::AllReduce, 4e9, group(n, 1), CommAlgorithm::Nvls);
    EXPECT_NEAR(4e9 / x.time / 1e9 / algbw, 1.0, 0.02) << n << " GPUs";
  }
  // Auto: the ring on 2 and 3 GPUs (NVLS's (n+1)/n is the ring's 2(n-1)/n
  // only from 4), NVLS on 8.
  EXPECT_EQ(comm(Collective::AllReduce, 1e9, group(2, 1)).algorithm,
            CommAlgorithm::Ring);
  EXPECT_EQ(comm(Collective::AllReduce, 1e9, group(3, 1)).algorithm,
            CommAlgorithm::Ring);
  EXPECT_EQ(comm(Collective::AllReduce, 1e9, group(8, 1)).algorithm,
            CommAlgorithm::Nvls);
  // Small messages: the ring's 14 hops against NVLS's 2 switch trips.
  auto small = comm(Collective::AllReduce, 1e4, group(8, 1));
  EXPECT_EQ(small.algorithm, CommAlgorithm::Nvls);
  // Only inside one node (across nodes it is the NVLS tree, below).
  auto across = model.commTime(Collective::AllReduce, 1e9, group(16, 1),
                               CommAlgorithm::Nvls);
  ASSERT_FALSE(across);
  EXPECT_NE(across.status().message().find("NVLS needs one node"),
            std::string::npos);
  auto auto16 = comm(Collective::AllReduce, 1e9, group(16, 1));
  EXPECT_NE(auto16.algorithm, CommAlgorithm::Nvls);
  // Not on an A100 node's NVSwitch (no SHARP).
  auto a100 = resolveCluster("dgx-a100");
  ASSERT_TRUE(a100);
  EXPECT_FALSE(model.commTime(Collective::AllReduce, 1e9,
                              *a100->stridedGroup(8, 1, 0),
                              CommAlgorithm::Nvls));
}

TEST_F(CommTest, NvlsAllGatherAndReduceScatterLoseToTheRing) {
  onePerCall();
  // Reduce-scatter sends S and receives S/n, all-gather the reverse
  // (NVIDIA/nccl issue 1083): S / (450e9 * 0.68) on the busier direction,
  // one switch trip; the ring moves 7/8 S at 360 GB/s. NCCL picks the ring
  // (issue 1047: NVLS reduce-scatter measured below the ring), and so
  // does Auto.
  for (Collective c : {Collective::AllGather, Collective::ReduceScatter}) {
    auto e = comm(c, 1e9, group(8, 1), CommAlgorithm::Nvls);
    EXPECT_REL(e.bandwidthTerm, 1e9 / (450e9 * 0.68), kRel);
    EXPECT_REL(e.latencyTerm, 9e-6, kRel);
    auto r = comm(c, 1e9, group(8, 1), CommAlgorithm::Ring);
    EXPECT_LT(r.time, e.time);
    EXPECT_EQ(comm(c, 1e9, group(8, 1)).algorithm, CommAlgorithm::Ring);
    // Across nodes NCCL needs CollNet for it; refused.
    EXPECT_FALSE(model.commTime(c, 1e9, group(16, 1), CommAlgorithm::Nvls));
  }
}

TEST_F(CommTest, NvlsTreeAllReduceAcrossNodes) {
  onePerCall();
  // 2 nodes x 8 H100: NVLS inside, 9/8 S / 306 GB/s, pipelined with the
  // exchange of each rank's S/8 over its 42.5 GB/s network share: the
  // NVLS side is slower. Latency 8 + 2 x 1 + 2 x ceil(log2 2) x 5 us.
  auto t = comm(Collective::AllReduce, 1e9, group(16, 1),
                CommAlgorithm::NvlsTree);
  EXPECT_REL(t.bandwidthTerm, 9.0 / 8 * 1e9 / 306e9, kRel);
  EXPECT_REL(t.latencyTerm, 20e-6, kRel);
  EXPECT_EQ(t.link, LinkKind::IntraNode);
  EXPECT_EQ(comm(Collective::AllReduce, 1e9, group(16, 1)).algorithm,
            CommAlgorithm::NvlsTree);
  // 4 nodes: a double binary tree moves 2 S/8 per rank each way; the
  // network is slower, and the ring (bus 340 GB/s) is about as fast, as
  // measured (NVIDIA/nccl issue 1221: 320 GB/s bus either way on 4 nodes).
  auto t4 = comm(Collective::AllReduce, 4e9, group(32, 1),
                 CommAlgorithm::NvlsTree);
  EXPECT_REL(t4.bandwidthTerm, 2 * 4e9 / 8 / 42.5e9, kRel);
  EXPECT_EQ(t4.link, LinkKind::Network);
  auto r4 = comm(Collective::AllReduce, 4e9, group(32, 1), CommAlgorithm::Ring);
  EXPECT_NEAR(t4.time / r4.time, 1.0, 0.05);
  // Published: 2 nodes x 8 H800 (200 GB/s NVLink per direction), 8 x 100
  // Gb/s NICs a node: 161 GB/s of nccl-tests bus bandwidth with NVLS
  // (NVIDIA/nccl-tests issue 153). Model: min(9/8 S / 136, S/8 / 10.6)
  // -> 159.
  CommGroup h800 = group(16, 1);
  h800.intra.bandwidth = 200e9;
  h800.interBandwidthPerRank = 12.5e9;
  auto p = comm(Collective::AllReduce, 8e9, h800);
  EXPECT_EQ(p.algorithm, CommAlgorithm::NvlsTree);
  EXPECT_NEAR(2.0 * 15 / 16 * 8e9 / p.time / 1e9 / 161, 1.0, 0.03);
  // One rank per node: nothing for the switch to reduce.
  auto perNode = model.commTime(Collective::AllReduce, 1e9, group(16, 8),
                                CommAlgorithm::NvlsTree);
  ASSERT_FALSE(perNode);
  EXPECT_NE(perNode.status().message().find("2 or more ranks on a node"),
            std::string::npos);
  EXPECT_NE(comm(Collective::AllReduce, 1e9, group(16, 8)).algorithm,
            CommAlgorithm::NvlsTree);
  // Only all-reduce.
  EXPECT_FALSE(model.commTime(Collective::AllGather, 1e9, group(16, 1),
                              CommAlgorithm::NvlsTree));
}

TEST_F(CommTest, AllGatherReduceScatterBroadcastInsideANode) {
  onePerCall();
  // (n-1)/n * S / B = 7/8 * 1e9 / 360e9; latency 8 + 7 * 1 us.
  auto ag = comm(Collective::AllGather, 1e9, group(8, 1));
  EXPECT_REL(ag.time, 0.875e9 / 360e9 + 15e-6, kRel);
  auto rs = comm(Collective::ReduceScatter, 1e9, group(8, 1));
  EXPECT_REL(rs.time, ag.time, kRel);
  // Broadcast, pipelined ring: 7 us + 8 us + 1e9 / 360e9.
  auto bc = comm(Collective::Broadcast, 1e9, group(8, 1), CommAlgorithm::Ring);
  EXPECT_REL(bc.time, 1e9 / 360e9 + 15e-6, kRel);
  // Tree broadcast: chain of 7 intra hops, same bandwidth term.
  auto bt = comm(Collective::Broadcast, 1e9, group(8, 1), CommAlgorithm::Tree);
  EXPECT_REL(bt.time, 1e9 / 360e9 + 15e-6, kRel);
}

TEST_F(CommTest, RingVersusTreeAcrossNodes) {
  onePerCall();
  // dp group: 16 ranks, one per node (stride 8), 42.5 GB/s per rank.
  CommGroup dp = group(16, 8);
  // Ring, S = 1 MB: latency 8 + 2*15*5 = 158 us;
  // bandwidth 2*15/16 * 1e6 / 42.5e9 = 44.1176 us.
  auto ring = comm(Collective::AllReduce, 1e6, dp, CommAlgorithm::Ring);
  EXPECT_REL(ring.latencyTerm, 158e-6, kRel);
  EXPECT_REL(ring.bandwidthTerm, 1.875e6 / 42.5e9, kRel);
  EXPECT_EQ(ring.link, LinkKind::Network);
  // Tree: latency 8 + 2 * ceil(log2 16) * 5 = 48 us; bandwidth 2e6/42.5e9.
  auto tree = comm(Collective::AllReduce, 1e6, dp, CommAlgorithm::Tree);
  EXPECT_REL(tree.latencyTerm, 48e-6, kRel);
  EXPECT_REL(tree.bandwidthTerm, 2e6 / 42.5e9, kRel);
  // Small messages: tree wins; large: ring wins.
  EXPECT_EQ(comm(Collective::AllReduce, 1e6, dp).algorithm,
            CommAlgorithm::Tree);
  EXPECT_EQ(comm(Collective::AllReduce, 1e9, dp).algorithm,
            CommAlgorithm::Ring);
}

TEST_F(CommTest, HierarchicalAllReduce) {
  onePerCall();
  // All 128 ranks (16 nodes x 8), S = 1 GB.
  //  intra RS:  7 * 1 us + 7/8 * 1e9 / 360e9          = 2.430556e-3
  //  inter AR over 16 nodes of S/8 = 1.25e8 per rank:
  //             30 * 5 us + 2*15/16 * 1.25e8 / 42.5e9  = 5.514706e-3
  //  intra AG:  same as RS
  //  launches:  3 * 8 us
  CommGroup all = group(128, 1);
  auto h = comm(Collective::AllReduce, 1e9, all, CommAlgorithm::Hierarchical);
  double lat = 3 * 8e-6 + 2 * 7e-6 + 30 * 5e-6;
  double band = 2 * 0.875e9 / 360e9 + 2.34375e8 / 42.5e9;
  EXPECT_REL(h.latencyTerm, lat, kRel);
  EXPECT_REL(h.bandwidthTerm, band, kRel);
  EXPECT_EQ(h.link, LinkKind::Network);
  // Flat ring over 128: bottleneck min(360, 8 * 42.5 = 340) GB/s, network;
  // latency 8 + 254 * 5 us.
  auto r = comm(Collective::AllReduce, 1e9, all, CommAlgorithm::Ring);
  EXPECT_REL(r.bandwidthTerm, 2.0 * 127 / 128 * 1e9 / 340e9, kRel);
  EXPECT_REL(r.latencyTerm, 8e-6 + 254 * 5e-6, kRel);
  EXPECT_EQ(r.link, LinkKind::Network);
  // Hierarchical all-gather: inter AG of S/8 over 16 nodes, then intra AG.
  auto ag = comm(Collective::AllGather, 1e9, all, CommAlgorithm::Hierarchical);
  EXPECT_REL(ag.time,
             2 * 8e-6 + 15 * 5e-6 + 7 * 1e-6 + 15.0 / 16 * 1.25e8 / 42.5e9 +
                 0.875e9 / 360e9,
             kRel);
  // Hierarchical inside one node is just a ring.
  auto one = comm(Collective::AllReduce, 1e9, group(8, 1),
                  CommAlgorithm::Hierarchical);
  EXPECT_EQ(one.algorithm, CommAlgorithm::Ring);
}

//===----------------------------------------------------------------------===//
// NCCL's protocols (nccl_protocols 1, the default): NCCL 2.28's tuning model
//===----------------------------------------------------------------------===//

TEST_F(CommTest, NcclProtocolsOfARingInsideANode) {
  // 8 ranks of a DGX H100 node, 14 steps, bus bandwidth 360 GB/s.
  CommGroup node = group(8, 1);
  // 1 GB: Simple, full bandwidth; base 8.4 us + 14 x 3.4 us (NVLink's
  // Simple step, above the 1 us hop).
  auto big = comm(Collective::AllReduce, 1e9, node, CommAlgorithm::Ring);
  EXPECT_EQ(big.protocol, CommProtocol::Simple);
  EXPECT_REL(big.latencyTerm, 8.4e-6 + 14 * 3.4e-6, kRel);
  EXPECT_REL(big.bandwidthTerm, 1.75e9 / 360e9, kRel);
  // 4 MiB: LL (half the bandwidth, 20.6 us: 61.4 us in all) just ahead of
  // LL128 (14 + 14 x 1.9 = 40.6 us at 92% of it: 62.8) and Simple (56 us
  // at all of it: 76.4). (NCCL also caps LL's bandwidth by GPU generation,
  // llMaxBws, which is not modelled.)
  const double mid = 4 << 20;
  auto m = comm(Collective::AllReduce, mid, node, CommAlgorithm::Ring);
  EXPECT_EQ(m.protocol, CommProtocol::LL);
  EXPECT_REL(m.latencyTerm, 6.6e-6 + 14 * 1e-6, kRel);
  EXPECT_REL(m.bandwidthTerm, 1.75 * mid / 180e9, kRel);
  // 1 KB: LL, base 6.6 us and 14 steps at the 1 us hop (NCCL's LL step,
  // 0.6 us, is below the cluster's hop latency, which wins).
  auto tiny = comm(Collective::AllReduce, 1e3, node, CommAlgorithm::Ring);
  EXPECT_EQ(tiny.protocol, CommProtocol::LL);
  EXPECT_REL(tiny.latencyTerm, 6.6e-6 + 14 * 1e-6, kRel);
  EXPECT_REL(tiny.bandwidthTerm, 1.75e3 / 180e9, kRel);
  // All-gather, 16 MiB: 7 steps. LL128: 14 + 7 x 1.9 = 27.3 us, 7/8 S at
  // 331.2 GB/s; Simple: 8.4 + 7 x 3.4 = 32.2 us at 360.
  const double s16 = 16 << 20;
  // LL128 is the faster (71.6 us against 73.0).
  auto ag = comm(Collective::AllGather, s16, node);
  EXPECT_EQ(ag.protocol, CommProtocol::LL128);
  EXPECT_REL(ag.time, 27.3e-6 + 0.875 * s16 / (360e9 * 0.92), kRel);
  EXPECT_LT(ag.time, 32.2e-6 + 0.875 * s16 / 360e9);
  // Broadcast: NCCL's ring only (the tree is offered by name).
  EXPECT_EQ(comm(Collective::Broadcast, 1e3, node).algorithm,
            CommAlgorithm::Ring);
  // Against one protocol at 8 us + 1 us a step, mid-size messages take
  // longer: the per-step cost NCCL's own model gives its protocols.
  Calibration one;
  one.ncclProtocols = 0;
  auto before = *CostModel(one).commTime(Collective::AllReduce, 16 << 20, node,
                                         CommAlgorithm::Ring);
  auto after = comm(Collective::AllReduce, 16 << 20, node, CommAlgorithm::Ring);
  EXPECT_GT(after.time, before.time * 1.1);
  EXPECT_EQ(before.protocol, CommProtocol::None);
}

TEST_F(CommTest, NcclProtocolsAcrossNodes) {
  // A ring over 2 nodes x 8: 30 steps, 2 of them across the boundary.
  // Simple: 8.4 + 28 x 3.4 + 2 x 14 us, times NCCL's 1.4 "plateau" of a
  // multi-node Simple ring all-reduce.
  CommGroup two = group(16, 1);
  auto r = comm(Collective::AllReduce, 1e9, two, CommAlgorithm::Ring);
  EXPECT_EQ(r.protocol, CommProtocol::Simple);
  EXPECT_REL(r.latencyTerm, 1.4 * (8.4e-6 + 28 * 3.4e-6 + 2 * 14e-6), kRel);
  // All-gather has no plateau: 8.4 + 14 x 3.4 + 1 x 14 us.
  auto ag = comm(Collective::AllGather, 1e9, two, CommAlgorithm::Ring);
  EXPECT_EQ(ag.protocol, CommProtocol::Simple);
  EXPECT_REL(ag.latencyTerm, 8.4e-6 + 14 * 3.4e-6 + 14e-6, kRel);
  // One rank per node (16 nodes): every step crosses, at the tree's
  // network latency (NCCL: with one rank a node the latency is exposed).
  CommGroup dp = group(16, 8);
  auto flat = comm(Collective::AllReduce, 1e9, dp, CommAlgorithm::Ring);
  EXPECT_REL(flat.latencyTerm, 1.4 * (8.4e-6 + 30 * 14e-6), kRel);
  // LL128 tells the tree's figure (8.5 us) from the ring's (4.0): at 10 MB
  // it is the fastest protocol of that ring, 14 + 30 x 8.5 us.
  auto ll128 = comm(Collective::AllReduce, 1e7, dp, CommAlgorithm::Ring);
  EXPECT_EQ(ll128.protocol, CommProtocol::LL128);
  EXPECT_REL(ll128.latencyTerm, 14e-6 + 30 * 8.5e-6, kRel);
  // The plateau needs S / (channels x n) >= 64 bytes, comm_ctas channels:
  // with 10^7 of them, 1 GB over 16 ranks is 6.25 bytes a channel's rank.
  Calibration manyChannels;
  manyChannels.commCtas = 1e7;
  auto flatter =
      *CostModel(manyChannels)
           .commTime(Collective::AllReduce, 1e9, dp, CommAlgorithm::Ring);
  EXPECT_EQ(flatter.protocol, CommProtocol::Simple);
  EXPECT_REL(flatter.latencyTerm, 8.4e-6 + 30 * 14e-6, kRel);
  // The floor of a multi-node ring's NVLink steps (NCCL's network post
  // overhead, 1 us): LL's 0.6 us step becomes 1 us with a 0.1 us hop; its
  // network steps take the 5 us hop, above the ring's 2.7 us.
  CommGroup fast = two;
  fast.intra.latency = 0.1e-6;
  auto floored = comm(Collective::AllReduce, 1e3, fast, CommAlgorithm::Ring);
  EXPECT_EQ(floored.protocol, CommProtocol::LL);
  EXPECT_REL(floored.latencyTerm, 6.6e-6 + 28 * 1e-6 + 2 * 5e-6, kRel);
  // On one node there is no floor: 0.6 us a step.
  CommGroup fastNode = group(8, 1);
  fastNode.intra.latency = 0.1e-6;
  auto inNode = comm(Collective::AllReduce, 1e3, fastNode, CommAlgorithm::Ring);
  EXPECT_REL(inNode.latencyTerm, 6.6e-6 + 14 * 0.6e-6, kRel);
  // The tree at 1 MB: depth ceil(log2 16) = 4 network levels. NCCL's
  // correction at 1 MB (index floor(log2(1e6 / 64)) = 13) and 0.92 of the
  // bus bandwidth; LL128 (120/128 of it, correction 0.6) is the fastest:
  // 14 + 2 x 4 x 8.5 us, 2 S / (42.5 GB/s x 0.92 x 0.9375 x 0.6).
  auto tree = comm(Collective::AllReduce, 1e6, dp, CommAlgorithm::Tree);
  EXPECT_EQ(tree.protocol, CommProtocol::LL128);
  EXPECT_REL(tree.latencyTerm, 14e-6 + 2 * 4 * 8.5e-6, kRel);
  EXPECT_REL(tree.bandwidthTerm, 2e6 / (42.5e9 * 0.92 * 0.9375 * 0.6), kRel);
  // Small messages: the tree; large: the ring.
  EXPECT_EQ(comm(Collective::AllReduce, 1e6, dp).algorithm,
            CommAlgorithm::Tree);
  EXPECT_EQ(comm(Collective::AllReduce, 1e9, dp).algorithm,
            CommAlgorithm::Ring);
}

TEST_F(CommTest, NcclProtocolsOfNvls) {
  // NVLS: NCCL's 25 us, whole (no base latency), Simple only.
  auto e = comm(Collective::AllReduce, 1e9, group(8, 1), CommAlgorithm::Nvls);
  EXPECT_EQ(e.protocol, CommProtocol::Simple);
  EXPECT_REL(e.latencyTerm, 25e-6, kRel);
  EXPECT_REL(e.bandwidthTerm, 9.0 / 8 * 1e9 / (450e9 * 0.68), kRel);
  // Small messages go to the ring's LL: 20.6 us against NVLS's 25.
  auto small = comm(Collective::AllReduce, 1e4, group(8, 1));
  EXPECT_EQ(small.algorithm, CommAlgorithm::Ring);
  EXPECT_EQ(small.protocol, CommProtocol::LL);
  // NVLS tree over 2 nodes: 25 us, then 2 x 1 level x 20.9 us.
  auto t =
      comm(Collective::AllReduce, 1e9, group(16, 1), CommAlgorithm::NvlsTree);
  EXPECT_REL(t.latencyTerm, 25e-6 + 2 * 20.9e-6, kRel);
  EXPECT_EQ(comm(Collective::AllReduce, 1e9, group(16, 1)).algorithm,
            CommAlgorithm::NvlsTree);
}

// A cluster whose collectives do not run on NCCL (the cpu preset,
// `communicator: cpu`) is priced with the one-protocol terms whatever the
// calibration says.
TEST_F(CommTest, NonNcclCommunicatorsTakeTheOneProtocolTerms) {
  CommGroup node = group(8, 1);
  node.nccl = false;
  auto e = comm(Collective::AllReduce, 1e9, node, CommAlgorithm::Ring);
  EXPECT_EQ(e.protocol, CommProtocol::None);
  EXPECT_REL(e.latencyTerm, 8e-6 + 14 * 1e-6, kRel);
  EXPECT_EQ(comm(Collective::AllReduce, 1e9, node).protocol,
            CommProtocol::None);
  CommGroup dp = group(16, 8);
  dp.nccl = false;
  EXPECT_NE(comm(Collective::AllGather, 1e6, dp).algorithm, CommAlgorithm::Pat);
}

TEST_F(CommTest, PatAllGatherOverOneRankANode) {
  // 16 nodes, one rank each (42.5 GB/s): PAT's 8 us + floor(log2 16) x 4
  // us + 16 x 2.8 us = 68.8 us, and S / (0.75 B).
  CommGroup dp = group(16, 8);
  for (Collective c : {Collective::AllGather, Collective::ReduceScatter}) {
    auto p = comm(c, 1e6, dp, CommAlgorithm::Pat);
    EXPECT_EQ(p.algorithm, CommAlgorithm::Pat);
    EXPECT_EQ(p.protocol, CommProtocol::Simple);
    EXPECT_REL(p.latencyTerm, 68.8e-6, kRel);
    EXPECT_REL(p.bandwidthTerm, 1e6 / (0.75 * 42.5e9), kRel);
    // 1 MB: PAT (100.2 us) beats the ring's best, LL: 6.6 + 15 x 5 us and
    // 15/16 S at half the bandwidth (125.7 us).
    auto r = comm(c, 1e6, dp, CommAlgorithm::Ring);
    EXPECT_EQ(r.protocol, CommProtocol::LL);
    EXPECT_REL(r.time, 81.6e-6 + 0.9375e6 / 21.25e9, kRel);
    EXPECT_EQ(comm(c, 1e6, dp).algorithm, CommAlgorithm::Pat);
    // 1 GB: the ring (15/16 S at all of the bandwidth) beats PAT's 0.75.
    EXPECT_EQ(comm(c, 1e9, dp).algorithm, CommAlgorithm::Ring);
  }
  // Not with several ranks on a node, nor for all-reduce, nor without
  // NCCL's protocols.
  EXPECT_NE(comm(Collective::AllGather, 1e6, group(16, 1)).algorithm,
            CommAlgorithm::Pat);
  auto many = model.commTime(Collective::AllGather, 1e6, group(16, 1),
                             CommAlgorithm::Pat);
  ASSERT_FALSE(many);
  EXPECT_NE(many.status().message().find("PAT needs one rank on each"),
            std::string::npos);
  EXPECT_FALSE(
      model.commTime(Collective::AllReduce, 1e6, dp, CommAlgorithm::Pat));
  onePerCall();
  EXPECT_EQ(comm(Collective::AllGather, 1e6, dp).algorithm,
            CommAlgorithm::Ring);
}

TEST_F(CommTest, NcclProtocolsAgainstMeasuredSweeps) {
  // nccl-tests all_reduce_perf bus bandwidth on one 8-GPU node
  // (docs/cost-model.md, "Against measured sweeps"): the protocols bring
  // the model nearer at every size from 1 MiB, and it stays above the
  // measured figures (NCCL's own model is optimistic there too).
  auto a100 = resolveCluster("dgx-a100");
  ASSERT_TRUE(a100);
  CommGroup node = *a100->stridedGroup(8, 1, 0);
  Calibration one;
  one.ncclProtocols = 0;
  const std::pair<double, double> oci[] = {
      {1 << 20, 23.9},   {4 << 20, 54.6},    {16 << 20, 119.8},
      {64 << 20, 199.2}, {256 << 20, 221.4}, {1 << 30, 230.1}};
  for (auto [bytes, measured] : oci) {
    auto busbw = [&](const CostModel &m) {
      return 1.75 * bytes /
             m.commTime(Collective::AllReduce, bytes, node)->time / 1e9;
    };
    double now = busbw(model), before = busbw(CostModel(one));
    EXPECT_LE(std::abs(now - measured), std::abs(before - measured) + 1e-9)
        << bytes;
    EXPECT_GT(now, measured) << bytes;
  }
}

TEST_F(CommTest, AllToAll) {
  // Inside a node on NVSwitch: 7/8 * S / 360e9; latency 8 + 7 * 1 us.
  auto in = comm(Collective::AllToAll, 1e9, group(8, 1));
  EXPECT_REL(in.time, 0.875e9 / 360e9 + 15e-6, kRel);
  EXPECT_EQ(in.algorithm, CommAlgorithm::Direct);
  // Two nodes x 8, S = 1.6 GB: intra 7/16 * S / 360e9 = 1.944e-3;
  // inter 8/16 * S / 42.5e9 = 18.82e-3 (bottleneck); latency 8 + 15 * 5 us.
  auto two = comm(Collective::AllToAll, 1.6e9, group(16, 1));
  EXPECT_REL(two.bandwidthTerm, 0.8e9 / 42.5e9, kRel);
  EXPECT_REL(two.latencyTerm, 8e-6 + 15 * 5e-6, kRel);
  EXPECT_EQ(two.link, LinkKind::Network);
  // A ring topology node: floor(8^2/4) = 16 hop-messages per rank ->
  // 16/8 * S / B = 2 * 1e9 / 360e9.
  CommGroup ring = group(8, 1);
  ring.intra.topology = IntraTopology::Ring;
  auto r = comm(Collective::AllToAll, 1e9, ring);
  EXPECT_REL(r.bandwidthTerm, 2e9 / 360e9, kRel);
}

TEST_F(CommTest, SendRecv) {
  // Same node: 8 + 1 us + 1e9 / 360e9.
  auto in = comm(Collective::SendRecv, 1e9, group(2, 1));
  EXPECT_REL(in.time, 9e-6 + 1e9 / 360e9, kRel);
  EXPECT_EQ(in.link, LinkKind::IntraNode);
  // Across nodes: 8 + 5 us + 1e9 / 42.5e9.
  auto out = comm(Collective::SendRecv, 1e9, group(2, 8));
  EXPECT_REL(out.time, 13e-6 + 1e9 / 42.5e9, kRel);
  EXPECT_EQ(out.link, LinkKind::Network);
}

TEST_F(CommTest, OneRankMovesNothing) {
  for (Collective c : {Collective::AllReduce, Collective::AllGather,
                       Collective::AllToAll, Collective::Broadcast}) {
    auto e = comm(c, 1e9, group(1, 1));
    EXPECT_EQ(e.time, 0.0) << collectiveName(c);
  }
}

TEST_F(CommTest, Errors) {
  auto msg = [&](Collective c, double bytes, const CommGroup &g,
                 CommAlgorithm a) {
    auto e = model.commTime(c, bytes, g, a);
    EXPECT_FALSE(e);
    return e ? std::string() : e.status().message();
  };
  EXPECT_EQ(msg(Collective::AllGather, 1, group(8, 1), CommAlgorithm::Tree),
            "all-gather over 8 ranks: the tree algorithm does not implement "
            "all-gather");
  EXPECT_NE(msg(Collective::AllReduce, 1, group(8, 1), CommAlgorithm::Direct)
                .find("direct algorithm does not implement all-reduce"),
            std::string::npos);
  EXPECT_NE(msg(Collective::AllToAll, 1, group(8, 1), CommAlgorithm::Ring)
                .find("ring algorithm"),
            std::string::npos);
  EXPECT_NE(msg(Collective::AllReduce, -5, group(8, 1), CommAlgorithm::Auto)
                .find("expected bytes >= 0"),
            std::string::npos);
  EXPECT_NE(msg(Collective::SendRecv, 1, group(3, 1), CommAlgorithm::Auto)
                .find("send/recv needs a communicator of 2 ranks"),
            std::string::npos);
  CommGroup broken = group(16, 8);
  broken.interBandwidthPerRank = 0;
  EXPECT_NE(msg(Collective::AllReduce, 1, broken, CommAlgorithm::Auto)
                .find("network bandwidth is 0"),
            std::string::npos);
}

TEST_F(CommTest, MoreBandwidthIsNeverSlower) {
  const Collective all[] = {Collective::AllReduce, Collective::AllGather,
                            Collective::ReduceScatter, Collective::AllToAll,
                            Collective::Broadcast};
  const CommGroup shapes[] = {group(8, 1), group(16, 8), group(32, 2),
                              group(128, 1)};
  for (const CommGroup &base : shapes)
    for (Collective c : all)
      for (double bytes : {1e3, 1e6, 1e9}) {
        double prev = INFINITY;
        for (double f : {0.5, 1.0, 2.0, 4.0}) {
          CommGroup g = base;
          g.intra.bandwidth *= f;
          g.interBandwidthPerRank *= f;
          double t = comm(c, bytes, g).time;
          EXPECT_LE(t, prev) << collectiveName(c) << " " << bytes;
          prev = t;
        }
        // More bytes never take less time either.
        EXPECT_LE(comm(c, bytes, base).time, comm(c, 2 * bytes, base).time);
      }
}

//===----------------------------------------------------------------------===//
// Overlap
//===----------------------------------------------------------------------===//

TEST(Overlap, CollectiveBesideComputeSlowsIt) {
  // An A100 (108 SMs, 2 TB/s): NCCL's 16 CTAs slow the SM-bound kernels
  // by 16/92; a collective at 300 GB/s each way moves 2 x 300 GB/s of HBM,
  // u of the bandwidth, which slows the memory-bound rest by u / (1 - u).
  // A compute slowed by x loses x / (1 + x) of each second. The A100's
  // GEMMs are not persistent: matmuls and attention alike.
  CostModel m;
  const GpuSpec a100 = *gpuPreset("a100-sxm-80gb");
  ASSERT_FALSE(a100.persistentGemms);
  const double u = 2 * 300e9 / a100.memoryBandwidth;
  const double x = 0.8 * 16.0 / 92 + 0.2 * u / (1 - u);
  EXPECT_NEAR(m.overlapLoss({0.8, 0.6}, 300e9, a100), x / (1 + x), 1e-12);
  EXPECT_NEAR(m.overlapLoss({1, 1}, 300e9, a100), (16.0 / 92) / (1 + 16.0 / 92),
              1e-12);
  EXPECT_NEAR(m.overlapLoss({0, 0}, 1e14, a100), 0.9, 1e-12); // u <= 0.9
  // A share outside [0, 1] is clamped (the matmuls' to the SM-bound
  // share); a device without SMs loses nothing.
  EXPECT_NEAR(m.overlapLoss({2, 3}, 300e9, a100),
              m.overlapLoss({1, 1}, 300e9, a100), 1e-15);
  EXPECT_EQ(m.overlapLoss({0.5, 0.5}, 1e9, *gpuPreset("cpu-device")), 0);
}

TEST(Overlap, PersistentGemmsRunInTwoWavesBesideACollective) {
  // An H100 (132 SMs, 3.35 TB/s): cuBLAS's Hopper GEMMs are persistent,
  // one CTA per SM, so with NCCL's 16 CTAs holding SMs the last 16 CTAs
  // run as a second wave: a matmul takes twice its time (x = 1). Fused
  // attention (not the library's) slows by 16/116 as on the A100, the
  // memory-bound rest by u / (1 - u).
  CostModel m;
  const GpuSpec h100 = *gpuPreset("h100-sxm-80gb");
  ASSERT_TRUE(h100.persistentGemms);
  ASSERT_TRUE(gpuPreset("h200-sxm-141gb")->persistentGemms);
  const double u = 2 * 370e9 / h100.memoryBandwidth;
  const double x = 0.6 * 1 + 0.2 * 16.0 / 116 + 0.2 * u / (1 - u);
  EXPECT_NEAR(m.overlapLoss({0.8, 0.6}, 370e9, h100), x / (1 + x), 1e-12);
  // All matmuls: half of each second beside the collective is lost.
  EXPECT_NEAR(m.overlapLoss({1, 1}, 370e9, h100), 0.5, 1e-12);
  // All attention: the SM share alone.
  EXPECT_NEAR(m.overlapLoss({1, 0}, 370e9, h100),
              (16.0 / 116) / (1 + 16.0 / 116), 1e-12);
  // The same GPU without persistent GEMMs prices matmuls by the SM share.
  GpuSpec tiled = h100;
  tiled.persistentGemms = false;
  EXPECT_NEAR(m.overlapLoss({1, 1}, 370e9, tiled),
              (16.0 / 116) / (1 + 16.0 / 116), 1e-12);
  // A collective that holds no SMs (comm_ctas 0) splits nothing.
  Calibration none;
  none.commCtas = 0;
  none.commHbmRatio = 0;
  EXPECT_EQ(CostModel(none).overlapLoss({1, 1}, 370e9, h100), 0);
}

TEST(Overlap, APersistentGemmLosesWhatTheCollectiveOverlapsOfIt) {
  // GEMMs of 1 ms beside a collective that starts with one of them: a
  // 0.6 ms collective delays the first GEMM's last CTAs 0.6 ms (all of
  // it lost); 1.5 ms runs it in two waves (1 ms of 1.5 lost); 5 ms runs
  // two in two waves and overlaps the third by 1 ms (2 + 1 of 5).
  EXPECT_DOUBLE_EQ(CostModel::twoWaveLoss(0.6e-3, 1e-3), 1.0);
  EXPECT_DOUBLE_EQ(CostModel::twoWaveLoss(1.5e-3, 1e-3), 1.0 / 1.5);
  EXPECT_DOUBLE_EQ(CostModel::twoWaveLoss(5e-3, 1e-3), 3.0 / 5);
  EXPECT_DOUBLE_EQ(CostModel::twoWaveLoss(4e-3, 1e-3), 2.0 / 4);
  // A long collective: towards a half; an unknown GEMM time: a half.
  EXPECT_NEAR(CostModel::twoWaveLoss(1.0, 1e-3), 0.5, 1e-3);
  EXPECT_DOUBLE_EQ(CostModel::twoWaveLoss(1e-3, 0), 0.5);
  EXPECT_DOUBLE_EQ(CostModel::twoWaveLoss(0, 1e-3), 0.5);
  // On an H100, all matmuls of 1 ms beside a 1.5 ms collective: two
  // thirds of it lost; beside a shorter one, all of it, capped at 0.95.
  CostModel m;
  const GpuSpec h100 = *gpuPreset("h100-sxm-80gb");
  EXPECT_NEAR(m.overlapLoss({1, 1, 1e-3}, 370e9, h100, 1.5e-3), 1.0 / 1.5,
              1e-12);
  EXPECT_NEAR(m.overlapLoss({1, 1, 1e-3}, 370e9, h100, 0.5e-3), 0.95, 1e-12);
  // Without the collective's time, the long-collective limit.
  EXPECT_NEAR(m.overlapLoss({1, 1, 1e-3}, 370e9, h100), 0.5, 1e-12);
  // The A100's GEMMs are not persistent: the SM share, whatever the times.
  const GpuSpec a100 = *gpuPreset("a100-sxm-80gb");
  EXPECT_NEAR(m.overlapLoss({1, 1, 1e-3}, 300e9, a100, 0.5e-3),
              (16.0 / 92) / (1 + 16.0 / 92), 1e-12);
}

TEST(Overlap, ExposedTime) {
  // max(0, comm - eff * overlappable)
  EXPECT_DOUBLE_EQ(CostModel::exposed(10, 8, 0.8), 10 - 6.4);
  EXPECT_DOUBLE_EQ(CostModel::exposed(1, 8, 0.8), 0.0);
  EXPECT_DOUBLE_EQ(CostModel::exposed(5, -3, 0.8), 5.0);
  CostModel m; // grad overlap 0.8, p2p overlap 0.9
  // 1 GiB of gradients in 25 MiB buckets: the last is 1/40.96 of the sync.
  const double gib = double(1 << 30);
  EXPECT_DOUBLE_EQ(m.exposedGradSync(10, 10, gib), 2.0);
  EXPECT_DOUBLE_EQ(m.exposedGradSync(10, 20, gib), 10 * 25.0 / 1024);
  // Gradients in one bucket: nothing hides.
  EXPECT_DOUBLE_EQ(m.exposedGradSync(10, 20, 20.0 * (1 << 20)), 10.0);
  EXPECT_DOUBLE_EQ(m.lastBucketShare(100.0 * (1 << 20)), 0.25);
  EXPECT_DOUBLE_EQ(m.lastBucketShare(0), 0.0);
  Calibration nb;
  nb.gradBucketBytes = 0; // no buckets: no last-bucket floor
  EXPECT_DOUBLE_EQ(CostModel(nb).exposedGradSync(10, 20, gib), 0.0);
  // Contention: a sync hidden beside the backward still takes
  // lostPerSecond of each second it runs there from the compute; the
  // larger of that and the exposure shows.
  EXPECT_DOUBLE_EQ(CostModel(nb).exposedGradSync(10, 20, gib, 0.12), 1.2);
  EXPECT_DOUBLE_EQ(m.exposedGradSync(10, 20, gib, 0.12), 1.2);
  // Only the part beside the backward (0.8 x 5 s) loses; 6 s is exposed.
  EXPECT_DOUBLE_EQ(m.exposedGradSync(10, 5, gib, 0.12), 6.0);
  EXPECT_DOUBLE_EQ(CostModel(nb).exposedGradSync(10, 100, gib, 0.5), 5.0);
  EXPECT_NEAR(m.exposedP2P(1.0, 1.0), 0.1, 1e-12);
}
