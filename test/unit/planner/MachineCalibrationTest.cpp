//===- MachineCalibrationTest.cpp - dlopt-calibrate's derivations ---------===//
//
// The arithmetic that turns dlopt-calibrate's samples into a calibration
// and a cluster (planner/MachineCalibration.h), on samples made from known
// figures: the derived figures must come back.
//
//===----------------------------------------------------------------------===//

#include "planner/Cluster.h"
#include "planner/CostModel.h"
#include "planner/MachineCalibration.h"

#include <gtest/gtest.h>

using namespace dlopt::planner;

namespace {

TEST(MachineCalibration, FitLineRecoversAnExactLine) {
  std::vector<std::pair<double, double>> xy;
  for (double x : {1e3, 1e4, 1e5, 1e6, 1e7})
    xy.push_back({x, 20e-6 + x / 5e9});
  LineFit f = fitLine(xy);
  EXPECT_NEAR(f.intercept, 20e-6, 1e-9);
  EXPECT_NEAR(f.slope, 1 / 5e9, 1e-15);
  // A negative intercept is clamped, the slope refitted through 0 with the
  // same 1 / y^2 weights: sum w x y / sum w x^2.
  f = fitLine({{1, 0.5}, {2, 1.6}});
  EXPECT_EQ(f.intercept, 0);
  const double w1 = 1 / 0.25, w2 = 1 / 2.56;
  EXPECT_NEAR(f.slope, (w1 * 0.5 + w2 * 3.2) / (w1 + w2 * 4), 1e-12);
}

TEST(MachineCalibration, AllReduceFitGivesTheRingsAlphaAndBandwidth) {
  // t = 2(n-1) alpha + 2(n-1)/n S / B with n = 4, alpha 10 us, B 8 GB/s.
  const int n = 4;
  const double alpha = 10e-6, bw = 8e9;
  std::vector<AllReduceSample> s;
  for (double bytes : {4096.0, 65536.0, 1048576.0, 16777216.0})
    s.push_back({n, bytes, 2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * bytes / bw});
  // Samples of fewer ranks are ignored: the largest count is fitted.
  s.push_back({2, 4096, 1.0});
  auto f = fitAllReduce(s);
  ASSERT_TRUE(f) << f.status().message();
  EXPECT_EQ(f->ranks, 4);
  EXPECT_NEAR(f->latency, alpha, 1e-9);
  EXPECT_NEAR(f->bandwidth / bw, 1.0, 1e-6);
  EXPECT_FALSE(fitAllReduce({{1, 4096, 1e-6}, {1, 8192, 2e-6}}));
  EXPECT_FALSE(fitAllReduce({{2, 4096, 1e-6}}));
  EXPECT_FALSE(fitAllReduce({{2, 4096, 2e-6}, {2, 8192, 1e-6}}));
}

TEST(MachineCalibration, AllReduceFitSurvivesASlowSmallMessage) {
  // 2 ranks: t = 5 us + S / 2 GB/s. On a loaded host every size but
  // 64 KiB came out 10-100x slow, which turns the 1/t^2-weighted fit's
  // slope negative (the 64 KiB sample outweighs the rest); the largest and
  // smallest messages still give a positive bandwidth.
  std::vector<AllReduceSample> s;
  const double slow[] = {10, 1, 10, 100};
  int i = 0;
  for (double bytes : {4096.0, 65536.0, 1048576.0, 4194304.0})
    s.push_back({2, bytes, (5e-6 + bytes / 2e9) * slow[i++]});
  ASSERT_LE(fitLine({{s[0].bytes, s[0].seconds},
                     {s[1].bytes, s[1].seconds},
                     {s[2].bytes, s[2].seconds},
                     {s[3].bytes, s[3].seconds}})
                .slope,
            0);
  auto f = fitAllReduce(s);
  ASSERT_TRUE(f) << f.status().message();
  EXPECT_GT(f->bandwidth, 0);
  EXPECT_GE(f->latency, 0);
  // Every size as slow as the smallest: refused, with the figures.
  auto flat = fitAllReduce({{2, 4096, 3e-5}, {2, 65536, 2e-5}, {2, 1048576, 1e-5}});
  ASSERT_FALSE(flat);
  EXPECT_NE(flat.status().message().find("too busy to measure"),
            std::string::npos)
      << flat.status().message();
}

MachineSamples samples() {
  MachineSamples s;
  s.name = "box";
  s.devices = 2;
  s.threadsPerDevice = 2;
  s.hostCores = 2;
  s.hostMemoryBytes = 16.0 * (1ull << 30);
  s.gemmSplitMultiplyAdds = double(1 << 21); // the CPU backend's
  // 100 GFLOP/s at the best large shape, 80 at another, 25 and 35 small.
  auto at = [](int64_t m, int64_t n, int64_t k, double rate) {
    GemmSample g{m, n, k, 0};
    g.seconds = g.flops() / rate;
    return g;
  };
  s.gemmF32 = {at(1024, 1024, 1024, 100e9), at(512, 768, 768, 80e9),
               at(1024, 1024, 512, 90e9), at(128, 128, 64, 25e9),
               at(64, 128, 128, 35e9)};
  s.gemmBf16 = {at(512, 512, 512, 60e9)};
  s.attentionFlops = 1e9;
  s.attentionSeconds = 1e9 / 30e9;
  s.streams = {{"add", 3e9, 3e9 / 20e9}, {"gelu", 2e9, 2e9 / 10e9},
               {"layer_norm", 2e9, 2e9 / 5e9}};
  s.optimizerBytes = 28e8;
  s.optimizerSeconds = 28e8 / 7e9;
  s.dispatchSeconds = 0.5e-6;
  for (double bytes : {4096.0, 1048576.0, 16777216.0})
    s.inProcess.push_back({2, bytes, 2 * 5e-6 + bytes / 4e9});
  return s;
}

TEST(MachineCalibration, DerivesEfficienciesAgainstTheMeasuredPeak) {
  auto r = calibrateMachine(samples());
  ASSERT_TRUE(r) << r.status().message();
  const Calibration &c = r->calibration;
  EXPECT_EQ(c.matmulSmallFlops, 2.0 * (1 << 21));
  EXPECT_NEAR(c.matmulLargeEfficiency, 0.9, 1e-9); // median of 1.0, 0.8, 0.9
  EXPECT_NEAR(c.matmulSmallEfficiency, 0.3, 1e-9); // median of 0.25, 0.35
  EXPECT_NEAR(c.attentionEfficiency, 0.3, 1e-9);
  EXPECT_EQ(c.memoryBandwidthEfficiency, 1.0);
  EXPECT_NEAR(c.kernelLaunchSeconds, 0.5e-6, 1e-15);
  EXPECT_NEAR(c.optimizerBandwidth, 7e9, 1e-3); // the update's own rate
  MachineSamples unmeasured = samples();
  unmeasured.optimizerSeconds = 0;
  auto u = calibrateMachine(unmeasured);
  ASSERT_TRUE(u) << u.status().message();
  EXPECT_EQ(u->calibration.optimizerBandwidth, 0.0); // the roofline's
  EXPECT_EQ(c.intraNodeBusEfficiency, 1.0);
  EXPECT_EQ(c.collectiveLaunchLatency, 0.0);
  EXPECT_EQ(c.runtimeReservedBytes, 0.0);
  // The CPU backend's communication blocks its rank: nothing overlaps it.
  EXPECT_EQ(c.gradOverlapEfficiency, 0.0);
  EXPECT_EQ(c.p2pOverlapEfficiency, 0.0);
  EXPECT_TRUE(c.validate().isOk());
  // Written and read back: 0 is a valid overlap, 1.5 is not.
  auto back = parseCalibration(c.toJson(), "cal.json");
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->gradOverlapEfficiency, 0.0);
  auto bad = parseCalibration("{\"grad_overlap_efficiency\": 1.5}", "cal.json");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("a fraction in [0, 1]"),
            std::string::npos)
      << bad.status().message();
}

TEST(MachineCalibration, TheGemmGridBecomesTheGemmTable) {
  MachineSamples s = samples();
  auto at = [](int64_t m, int64_t n, int64_t k, double rate) {
    GemmSample g{m, n, k, 0};
    g.seconds = g.flops() / rate;
    return g;
  };
  // A 2 x 2 x 2 grid; its fastest shape (120 GFLOP/s) beats every sample
  // of gemmF32 (100), so it is the peak the efficiencies are taken of.
  for (int64_t m : {16, 512})
    for (int64_t n : {16, 512})
      for (int64_t k : {16, 512})
        s.gemmGrid.push_back(
            at(m, n, k, m == 512 && n == 512 && k == 512 ? 120e9 : 12e9));
  auto r = calibrateMachine(s);
  ASSERT_TRUE(r) << r.status().message();
  const Calibration &c = r->calibration;
  ASSERT_EQ(c.gemmTable.size(), 8u);
  for (const GemmTableRow &row : c.gemmTable)
    EXPECT_NEAR(row.efficiency, row.m == 512 && row.n == 512 ? (row.k == 512 ? 1.0 : 0.1) : 0.1,
                1e-9);
  EXPECT_NEAR(c.matmulLargeEfficiency, 0.75, 1e-9); // 0.9 of 100 against 120
  EXPECT_TRUE(c.validate().isOk());
  // Without the grid: no table (the size classes price GEMMs).
  EXPECT_TRUE(calibrateMachine(samples())->calibration.gemmTable.empty());
  // A grid with a hole is left out, and says why.
  s.gemmGrid.pop_back();
  auto h = calibrateMachine(s);
  ASSERT_TRUE(h) << h.status().message();
  EXPECT_TRUE(h->calibration.gemmTable.empty());
  bool said = false;
  for (const std::string &l : h->lines)
    said = said || l.find("GEMM grid left out") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(MachineCalibration, TheConvolutionGridBecomesTheConvTable) {
  MachineSamples s = samples();
  // A 2 x 2 x 2 grid: each pass's rate is what the samples' times give.
  for (int64_t m : {16, 512})
    for (int64_t n : {32, 4096})
      for (int64_t k : {9, 2304}) {
        MachineSamples::ConvSample g;
        g.m = m, g.n = n, g.k = k;
        g.forwardSeconds = g.flops() / 200e9;
        g.gradInputSeconds = g.flops() / 100e9;
        g.gradFilterSeconds = g.flops() / (m == 512 ? 50e9 : 150e9);
        s.convGrid.push_back(g);
      }
  s.convImplementation = "im2col + sgemm";
  auto r = calibrateMachine(s);
  ASSERT_TRUE(r) << r.status().message();
  const Calibration &c = r->calibration;
  ASSERT_EQ(c.convTable.size(), 8u);
  for (const ConvTableRow &row : c.convTable) {
    EXPECT_NEAR(row.forward, 200e9, 1e-3);
    EXPECT_NEAR(row.gradInput, 100e9, 1e-3);
    EXPECT_NEAR(row.gradFilter, row.m == 512 ? 50e9 : 150e9, 1e-3);
  }
  EXPECT_TRUE(c.validate().isOk());
  bool said = false;
  for (const std::string &l : r->lines)
    said = said || l.find("convolution grid: 8 shapes, 50.0 to 200.0 GFLOP/s "
                          "(conv_table), through im2col + sgemm") !=
                       std::string::npos;
  EXPECT_TRUE(said);
  // Without the grid: no table (convolutions priced as their GEMMs).
  EXPECT_TRUE(calibrateMachine(samples())->calibration.convTable.empty());
  // A grid with a hole is left out, and says why.
  s.convGrid.pop_back();
  auto h = calibrateMachine(s);
  ASSERT_TRUE(h) << h.status().message();
  EXPECT_TRUE(h->calibration.convTable.empty());
  said = false;
  for (const std::string &l : h->lines)
    said = said || l.find("convolution grid left out") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(MachineCalibration, WritesAClusterThePlannerReads) {
  auto r = calibrateMachine(samples());
  ASSERT_TRUE(r) << r.status().message();
  auto cl = parseCluster(r->clusterJson, ClusterFormat::Json, "calibrated");
  ASSERT_TRUE(cl) << cl.status().message() << "\n" << r->clusterJson;
  EXPECT_EQ(cl->name, "box");
  ASSERT_EQ(cl->groups.size(), 1u);
  const NodeGroup &g = cl->groups[0];
  EXPECT_EQ(g.count, 1);
  EXPECT_EQ(g.gpusPerNode, 2);
  EXPECT_NEAR(g.gpu.peak(Precision::FP32), 100e9, 1e3);
  EXPECT_NEAR(g.gpu.peak(Precision::BF16), 60e9, 1e3);
  EXPECT_EQ(g.gpu.peak(Precision::FP16), 0.0); // not measured: unsupported
  EXPECT_NEAR(g.gpu.memoryBandwidth, 10e9, 1e3); // the median stream
  EXPECT_NEAR(g.gpu.memoryBytes, 8.0 * (1ull << 30), 1e3); // host / devices
  EXPECT_NEAR(g.intra.bandwidth, 4e9, 1e3);
  EXPECT_NEAR(g.intra.latency, 5e-6, 1e-10);
  EXPECT_EQ(g.host.cpuCores, 2);
}

TEST(MachineCalibration, MeasuredCollectivesBecomeTheCollectiveTable) {
  MachineSamples s = samples();
  // Without rows, no table: the fit prices every group.
  auto none = calibrateMachine(s);
  ASSERT_TRUE(none) << none.status().message();
  EXPECT_TRUE(none->calibration.collectiveTable.empty());
  s.collectives = {{Collective::AllReduce, 2, 1, 2, 4096, 30e-6, ""},
                   {Collective::AllReduce, 2, 1, 2, 4 << 20, 300e-6, ""},
                   {Collective::AllGather, 2, 1, 2, 4096, 40e-6, ""},
                   {Collective::ReduceScatter, 2, 1, 2, 4096, 35e-6, ""}};
  auto r = calibrateMachine(s);
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_EQ(r->calibration.collectiveTable.size(), 4u);
  EXPECT_EQ(r->calibration.collectiveTable[2].collective,
            Collective::AllGather);
  EXPECT_DOUBLE_EQ(r->calibration.collectiveTable[1].seconds, 300e-6);
  bool said = false;
  for (const std::string &l : r->lines)
    said |= l == "in-process collectives by size (collective_table): "
                 "all_gather 1, all_reduce 2, reduce_scatter 1 rows, 4 KiB "
                 "to 4 MiB over 2 ranks";
  EXPECT_TRUE(said);
  // The file round-trips through the reader with the rows.
  auto back = parseCalibration(r->calibration.toJson(), "cal.json");
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->collectiveTable.size(), 4u);
  // A bad row is refused, not written.
  s.collectives.push_back({Collective::AllGather, 2, 1, 2, 4096, -1, ""});
  EXPECT_FALSE(calibrateMachine(s));
}

TEST(MachineCalibration, CachedSamplesGiveTheRateOfTheirClass) {
  MachineSamples s = samples();
  auto cached = [](const char *op, double gbs, double backward = 0) {
    const double t = 8e6 / (gbs * 1e9);
    return MachineSamples::StreamSample{op, 8e6, t, true, backward * t};
  };
  s.streams = {{"add", 3e9, 3e9 / 40e9},
               cached("add", 200),
               cached("relu", 100, 4),
               cached("gelu", 15, 1.25),
               cached("layer_norm", 30),
               cached("batch_norm", 35, 2.5),
               cached("max_pool2d", 25),
               {"bad", 1e6, 0, true}}; // untimed: left out
  s.cacheBytes = 32.0 * (1 << 20);
  auto r = calibrateMachine(s);
  ASSERT_TRUE(r) << r.status().message();
  const Calibration &c = r->calibration;
  auto rate = [&](MemoryClass m) { return c.opBandwidth[size_t(m)]; };
  EXPECT_NEAR(rate(MemoryClass::Stream), 150e9, 1e3); // median of add, relu
  EXPECT_NEAR(rate(MemoryClass::Transcendental), 15e9, 1e3);
  EXPECT_NEAR(rate(MemoryClass::Norm), 30e9, 1e3);
  EXPECT_EQ(rate(MemoryClass::Softmax), 0.0); // not measured
  EXPECT_NEAR(rate(MemoryClass::BatchNorm), 35e9, 1e3);
  EXPECT_NEAR(rate(MemoryClass::Pool), 25e9, 1e3);
  EXPECT_EQ(c.cacheBytes, 16.0 * (1 << 20)); // half the device's share
  // Backward ratios from the gradient kernels' times, where timed.
  auto back = [&](MemoryClass m) { return c.opBackwardRatio[size_t(m)]; };
  EXPECT_NEAR(back(MemoryClass::Stream), 4.0, 1e-9); // relu alone
  EXPECT_NEAR(back(MemoryClass::Transcendental), 1.25, 1e-9);
  EXPECT_NEAR(back(MemoryClass::BatchNorm), 2.5, 1e-9);
  EXPECT_EQ(back(MemoryClass::Norm), 0.0); // no gradient timed
  EXPECT_TRUE(c.validate().isOk());
  // The memory bandwidth is the uncached samples' alone.
  auto cl = parseCluster(r->clusterJson, ClusterFormat::Json, "calibrated");
  ASSERT_TRUE(cl) << cl.status().message();
  EXPECT_NEAR(cl->groups[0].gpu.memoryBandwidth, 40e9, 1e3);
  EXPECT_EQ(c.opRowSeconds[size_t(MemoryClass::Pool)], 0.0); // one shape
  // Without cached samples: no rates, no cache term.
  auto plain = calibrateMachine(samples());
  ASSERT_TRUE(plain) << plain.status().message();
  EXPECT_FALSE(plain->calibration.hasAnyOpBandwidth());
  EXPECT_EQ(plain->calibration.cacheBytes, 0.0);
}

TEST(MachineCalibration, RefusesWhatItCannotDerive) {
  MachineSamples s = samples();
  s.gemmF32.clear();
  auto r = calibrateMachine(s);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("no timed f32 GEMM samples"),
            std::string::npos);
  s = samples();
  s.devices = 0;
  EXPECT_FALSE(calibrateMachine(s));
  s = samples();
  s.gemmSplitMultiplyAdds = 0;
  r = calibrateMachine(s);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("GEMM split size"), std::string::npos);
  s = samples();
  s.inProcess = {{2, 4096, 1e-5}};
  r = calibrateMachine(s);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("in-process all-reduce"),
            std::string::npos);
}

} // namespace

TEST(MachineCalibration, TwoPoolShapesGiveItsCostPerPlane) {
  // The same 8 MB at 28x28 and at 8x8 planes: t = planes a + bytes / r
  // with a = 20 ns and r = 30 GB/s. 1337 and 16384 planes.
  MachineSamples s = samples();
  const double a = 20e-9, r = 30e9, bytes = 8e6;
  auto pool = [&](double planes) {
    MachineSamples::StreamSample x{"max_pool2d", bytes, planes * a + bytes / r,
                                   true, 1.2 * (planes * a + bytes / r)};
    x.rows = planes;
    return x;
  };
  s.streams = {{"add", 3e9, 3e9 / 40e9}, pool(1337), pool(16384)};
  s.cacheBytes = 32.0 * (1 << 20);
  auto res = calibrateMachine(s);
  ASSERT_TRUE(res) << res.status().message();
  const Calibration &c = res->calibration;
  EXPECT_NEAR(c.opRowSeconds[size_t(MemoryClass::Pool)], a, 1e-15);
  EXPECT_NEAR(c.opBandwidth[size_t(MemoryClass::Pool)], r, 1e3);
  EXPECT_NEAR(c.opBackwardRatio[size_t(MemoryClass::Pool)], 1.2, 1e-9);
  bool said = false;
  for (const std::string &l : res->lines)
    said |= l.find("op_row_ns") != std::string::npos &&
            l.find("pool 20.0") != std::string::npos;
  EXPECT_TRUE(said);
  // The priced op reproduces both samples.
  CostModel m(c);
  GpuSpec dev = *gpuPreset("cpu-device");
  EXPECT_NEAR(m.memoryTime(MemoryClass::Pool, bytes, dev, 16384),
              16384 * a + bytes / r, 1e-12);
  EXPECT_NEAR(m.memoryTime(MemoryClass::Pool, bytes, dev, 1337),
              1337 * a + bytes / r, 1e-12);
  // A sample that would give a negative cost per plane is not fitted.
  s.streams = {{"add", 3e9, 3e9 / 40e9}, pool(16384), pool(1337)};
  s.streams[2].seconds = 2 * s.streams[1].seconds; // fewer planes, slower
  auto odd = calibrateMachine(s);
  ASSERT_TRUE(odd) << odd.status().message();
  EXPECT_EQ(odd->calibration.opRowSeconds[size_t(MemoryClass::Pool)], 0.0);
}
