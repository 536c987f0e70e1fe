//===- ClusterTest.cpp - Presets, shorthand, YAML/JSON files, errors ------===//
#include "planner/Cluster.h"
#include "test/unit/planner/TestUtil.h"

#include <gtest/gtest.h>

#include <fstream>

using namespace dlopt::planner;
using dlopt::planner::test::writeTemp;

namespace {

::testing::AssertionResult failsWith(const Status &s, const std::string &sub) {
  if (s.isOk())
    return ::testing::AssertionFailure()
           << "expected an error containing '" << sub << "', got success";
  if (s.message().find(sub) == std::string::npos)
    return ::testing::AssertionFailure()
           << "error '" << s.message() << "' does not contain '" << sub << "'";
  return ::testing::AssertionSuccess();
}
template <typename T>
::testing::AssertionResult failsWith(const Expected<T> &e,
                                     const std::string &sub) {
  if (e.isOk())
    return ::testing::AssertionFailure()
           << "expected an error containing '" << sub << "', got a value";
  return failsWith(e.status(), sub);
}

Expected<Cluster> yaml(const std::string &text) {
  return parseCluster(text, ClusterFormat::Yaml, "test.yaml");
}
Expected<Cluster> jsonText(const std::string &text) {
  return parseCluster(text, ClusterFormat::Json, "test.json");
}

// A homogeneous file: two DGX-A100-like nodes written out by hand.
const char *kHomogeneousYaml = R"(
name: two-a100
nodes: 2
gpus_per_node: 8
gpu:
  name: A100
  peak_tflops: {bf16: 312, fp16: 312, tf32: 156, fp32: 19.5}
  memory_gb: 80
  memory_bandwidth_gb_s: 2000
intra_node:
  topology: nvswitch
  bidirectional_bandwidth_gb_s: 600
  latency_us: 2
network:
  nics: 8
  nic_gbit_s: 200
  latency_us: 4
)";

} // namespace

//===----------------------------------------------------------------------===//
// Presets and shorthand
//===----------------------------------------------------------------------===//

TEST(ClusterPreset, DgxA100MatchesPublicNumbers) {
  auto c = clusterPreset("dgx-a100");
  ASSERT_TRUE(c) << c.status().message();
  ASSERT_EQ(c->groups.size(), 1u);
  const NodeGroup &g = c->groups[0];
  EXPECT_EQ(c->numNodes(), 1);
  EXPECT_EQ(c->numDevices(), 8);
  EXPECT_DOUBLE_EQ(g.gpu.peak(Precision::BF16), 312e12);
  EXPECT_DOUBLE_EQ(g.gpu.peak(Precision::TF32), 156e12);
  EXPECT_DOUBLE_EQ(g.gpu.peak(Precision::FP32), 19.5e12);
  EXPECT_DOUBLE_EQ(g.gpu.peak(Precision::FP8), 0); // A100 has no fp8
  EXPECT_DOUBLE_EQ(g.gpu.memoryBytes, 81920.0 * 1024 * 1024); // 80 GiB, as reported
  EXPECT_DOUBLE_EQ(g.gpu.memoryBandwidth, 2.0e12);
  // 600 GB/s both directions -> 300 GB/s per direction.
  EXPECT_DOUBLE_EQ(g.intra.bandwidth, 300e9);
  EXPECT_EQ(g.intra.topology, IntraTopology::NVSwitch);
  // 8 x 200 Gb/s = 1600 Gb/s = 200 GB/s per node per direction.
  EXPECT_DOUBLE_EQ(g.network.bandwidth, 200e9);
  EXPECT_TRUE(c->validate());
}

TEST(ClusterPreset, DgxH100AndH200) {
  auto h100 = clusterPreset("dgx-h100");
  ASSERT_TRUE(h100);
  const NodeGroup &g = h100->groups[0];
  EXPECT_DOUBLE_EQ(g.gpu.peak(Precision::BF16), 989e12);
  EXPECT_DOUBLE_EQ(g.gpu.peak(Precision::FP8), 1979e12);
  EXPECT_DOUBLE_EQ(g.gpu.peak(Precision::FP32), 67e12);
  EXPECT_DOUBLE_EQ(g.gpu.memoryBandwidth, 3.35e12);
  EXPECT_DOUBLE_EQ(g.intra.bandwidth, 450e9);   // 900 / 2
  EXPECT_DOUBLE_EQ(g.network.bandwidth, 400e9); // 8 x 400 Gb/s / 8

  auto h200 = clusterPreset("h200"); // alias of dgx-h200
  ASSERT_TRUE(h200) << h200.status().message();
  EXPECT_DOUBLE_EQ(h200->groups[0].gpu.memoryBytes, 143771.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(h200->groups[0].gpu.memoryBandwidth, 4.8e12);
  EXPECT_EQ(h200->name, "dgx-h200");
}

TEST(ClusterPreset, CpuPresetIsSmall) {
  auto c = resolveCluster("cpu");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->numNodes(), 1);
  EXPECT_EQ(c->numDevices(), 2);
  EXPECT_LT(c->groups[0].gpu.peak(Precision::FP32), 1e12);
}

// The communicator the collectives run on: NCCL on the GPU presets and by
// default, dlopt's CPU backend on the cpu preset; a file may say either,
// and the JSON form keeps it.
TEST(ClusterFile, Communicator) {
  EXPECT_TRUE(resolveCluster("dgx-a100")->ncclCollectives);
  auto cpu = resolveCluster("cpu");
  ASSERT_TRUE(cpu);
  EXPECT_FALSE(cpu->ncclCollectives);
  EXPECT_FALSE(cpu->stridedGroup(2, 1)->nccl);
  auto back = jsonText(cpu->toJson());
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_FALSE(back->ncclCollectives);
  EXPECT_EQ(resolveCluster("dgx-h100")->toJson().find("communicator"),
            std::string::npos);
  auto nccl = yaml(std::string(kHomogeneousYaml) + "communicator: nccl\n");
  ASSERT_TRUE(nccl) << nccl.status().message();
  EXPECT_TRUE(nccl->ncclCollectives);
  EXPECT_TRUE(nccl->stridedGroup(8, 1)->nccl);
  auto own = yaml(std::string(kHomogeneousYaml) + "communicator: cpu\n");
  ASSERT_TRUE(own) << own.status().message();
  EXPECT_FALSE(own->stridedGroup(8, 1)->nccl);
  EXPECT_TRUE(
      failsWith(yaml(std::string(kHomogeneousYaml) + "communicator: gloo\n"),
                "communicator: expected \"nccl\" or \"cpu\", got"));
}

TEST(ClusterPreset, Shorthand) {
  auto c = resolveCluster("dgx-h100:16");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(c->numNodes(), 16);
  EXPECT_EQ(c->numDevices(), 128);
  EXPECT_EQ(c->name, "dgx-h100:16");
  auto a = resolveCluster("dgx-a100:128");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->numDevices(), 1024);
  EXPECT_NE(a->summary().find("1024 devices"), std::string::npos);
}

TEST(ClusterPreset, UnknownPresetListsKnownOnes) {
  auto c = resolveCluster("dgx-b200:4");
  EXPECT_TRUE(failsWith(c, "unknown cluster preset 'dgx-b200'"));
  for (const std::string &n : clusterPresetNames())
    EXPECT_TRUE(failsWith(c, n));
  EXPECT_TRUE(failsWith(clusterPreset("nope"), "known: cpu, dgx-a100"));
}

TEST(ClusterPreset, BadShorthandCounts) {
  EXPECT_TRUE(failsWith(resolveCluster("dgx-h100:0"),
                        "must be a positive integer, got '0'"));
  EXPECT_TRUE(failsWith(resolveCluster("dgx-h100:abc"), "got 'abc'"));
  EXPECT_TRUE(failsWith(resolveCluster("dgx-h100:"), "got ''"));
  EXPECT_TRUE(failsWith(resolveCluster("dgx-h100:-2"), "got '-2'"));
  EXPECT_TRUE(failsWith(resolveCluster(""), "empty cluster"));
}

//===----------------------------------------------------------------------===//
// Files
//===----------------------------------------------------------------------===//

TEST(ClusterFile, HomogeneousYaml) {
  auto c = yaml(kHomogeneousYaml);
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(c->name, "two-a100");
  EXPECT_EQ(c->numDevices(), 16);
  const NodeGroup &g = c->groups[0];
  EXPECT_EQ(g.gpu.name, "A100");
  EXPECT_DOUBLE_EQ(g.gpu.peak(Precision::FP32), 19.5e12);
  EXPECT_DOUBLE_EQ(g.gpu.peak(Precision::FP8), 0); // not given: unsupported
  EXPECT_DOUBLE_EQ(g.intra.bandwidth, 300e9);      // 600 bidirectional / 2
  EXPECT_DOUBLE_EQ(g.intra.latency, 2e-6);
  EXPECT_DOUBLE_EQ(g.network.bandwidth, 200e9); // 8 x 200 / 8
  EXPECT_DOUBLE_EQ(g.network.latency, 4e-6);
}

TEST(ClusterFile, HeterogeneousJsonWithGpuNamesAndInheritance) {
  // Two groups; the second inherits intra_node and network from the top.
  const char *text = R"({
    "name": "mixed",
    "gpus_per_node": 8,
    "intra_node": {"topology": "nvswitch", "bandwidth_gb_s": 300},
    "network": {"bandwidth_gb_s": 200, "latency_us": 6},
    "nodes": [
      {"count": 2, "gpu": "a100-sxm-80gb"},
      {"count": 1, "gpu": {"base": "h100-sxm-80gb", "memory_gib": 94},
       "intra_node": {"topology": "ring", "bandwidth_gb_s": 450,
                      "latency_us": 0.5}}
    ]
  })";
  auto c = jsonText(text);
  ASSERT_TRUE(c) << c.status().message();
  ASSERT_EQ(c->groups.size(), 2u);
  EXPECT_FALSE(c->isHomogeneous());
  EXPECT_EQ(c->numNodes(), 3);
  EXPECT_EQ(c->numDevices(), 24);
  EXPECT_EQ(c->groups[0].gpu.name, "A100-SXM-80GB");
  EXPECT_DOUBLE_EQ(c->groups[1].gpu.memoryBytes, 94.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(c->groups[1].gpu.peak(Precision::FP8), 1979e12);
  EXPECT_EQ(c->groups[1].intra.topology, IntraTopology::Ring);
  EXPECT_DOUBLE_EQ(c->groups[1].intra.latency, 0.5e-6);
  EXPECT_DOUBLE_EQ(c->groups[1].network.latency, 6e-6);
  EXPECT_DOUBLE_EQ(c->minDeviceMemory(), 81920.0 * 1024 * 1024);
  // Rank 16 is the first GPU of node 2, in group 1.
  auto loc = c->locate(17);
  ASSERT_TRUE(loc);
  EXPECT_EQ(loc->node, 2);
  EXPECT_EQ(loc->local, 1);
  EXPECT_EQ(loc->group, 1);
}

TEST(ClusterFile, HeterogeneousYamlSameAsJson) {
  const char *text = R"(
nodes:
  - count: 1
    gpus_per_node: 4
    gpu: {name: small, peak_tflops: {fp32: 10}, memory_gb: 16,
          memory_bandwidth_gb_s: 900}
    intra_node: {bandwidth_gb_s: 50}
  - count: 2
    gpus_per_node: 8
    gpu: h100-sxm-80gb
    intra_node: {bandwidth_gb_s: 450}
network: {bandwidth_gb_s: 100}
)";
  auto c = yaml(text);
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(c->numDevices(), 4 + 16);
  EXPECT_EQ(c->name, "test.yaml");                      // no name: the source
  EXPECT_DOUBLE_EQ(c->groups[0].intra.latency, 1e-6);   // default
  EXPECT_DOUBLE_EQ(c->groups[1].network.latency, 5e-6); // default
}

TEST(ClusterFile, LoadFromDiskYamlAndJsonAndRoundTrip) {
  auto y = loadClusterFile(writeTemp("c.yaml", kHomogeneousYaml));
  ASSERT_TRUE(y) << y.status().message();
  // The JSON the cluster prints loads back to the same cluster.
  std::string path = writeTemp("c.json", y->toJson());
  auto j = resolveCluster(path);
  ASSERT_TRUE(j) << j.status().message();
  EXPECT_EQ(j->name, y->name);
  ASSERT_EQ(j->groups.size(), 1u);
  const NodeGroup &a = y->groups[0], &b = j->groups[0];
  EXPECT_EQ(a.count, b.count);
  EXPECT_EQ(a.gpusPerNode, b.gpusPerNode);
  for (int k = 0; k < kNumPrecisions; ++k)
    EXPECT_DOUBLE_EQ(a.gpu.peakFlops[k], b.gpu.peakFlops[k]);
  EXPECT_DOUBLE_EQ(a.gpu.memoryBytes, b.gpu.memoryBytes);
  EXPECT_DOUBLE_EQ(a.intra.bandwidth, b.intra.bandwidth);
  EXPECT_DOUBLE_EQ(a.intra.latency, b.intra.latency);
  EXPECT_DOUBLE_EQ(a.network.bandwidth, b.network.bandwidth);
  EXPECT_DOUBLE_EQ(a.network.latency, b.network.latency);
  // And every preset round-trips too.
  for (const std::string &name : clusterPresetNames()) {
    auto p = clusterPreset(name, 2);
    ASSERT_TRUE(p);
    auto q = parseCluster(p->toJson(), ClusterFormat::Json, name);
    ASSERT_TRUE(q) << name << ": " << q.status().message();
    EXPECT_EQ(q->numDevices(), p->numDevices());
  }
}

TEST(ClusterFile, SingleDeviceClusterIsValid) {
  auto c = yaml(R"(
nodes: 1
gpus_per_node: 1
gpu: h100-sxm-80gb
)");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(c->numDevices(), 1);
  auto g = c->stridedGroup(1, 1);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->size, 1);
  EXPECT_FALSE(g->spansNodes());
}

TEST(ClusterFile, StreamingMultiprocessors) {
  // Presets carry their SM count; a file may override it or give one.
  auto c = yaml(R"(
nodes: 1
gpus_per_node: 1
gpu: {base: h100-sxm-80gb, sms: 114}
)");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(c->groups[0].gpu.sms, 114);
  EXPECT_EQ(gpuPreset("a100-sxm-80gb")->sms, 108);
  EXPECT_EQ(gpuPreset("h200-sxm-141gb")->sms, 132);
  // Round trip through the plan file's cluster.
  auto back = jsonText(c->toJson());
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->groups[0].gpu.sms, 114);
  EXPECT_TRUE(failsWith(yaml(R"(
nodes: 1
gpus_per_node: 1
gpu: {base: h100-sxm-80gb, sms: 0}
)"),
                        "test.yaml: gpu.sms: expected a positive integer, got 0"));
}

TEST(ClusterFile, AttentionEfficiency) {
  // Presets carry the share of the peak their FlashAttention-2-class
  // attention reaches; a file may override it.
  EXPECT_DOUBLE_EQ(gpuPreset("a100-sxm-80gb")->attentionEfficiency, 0.60);
  EXPECT_DOUBLE_EQ(gpuPreset("h100-sxm-80gb")->attentionEfficiency, 0.34);
  EXPECT_DOUBLE_EQ(gpuPreset("h200-sxm-141gb")->attentionEfficiency, 0.34);
  auto c = yaml(R"(
nodes: 1
gpus_per_node: 1
gpu: {base: h100-sxm-80gb, attention_efficiency: 0.7}
)");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_DOUBLE_EQ(c->groups[0].gpu.attentionEfficiency, 0.7);
  auto back = jsonText(c->toJson());
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_DOUBLE_EQ(back->groups[0].gpu.attentionEfficiency, 0.7);
  EXPECT_TRUE(failsWith(yaml(R"(
nodes: 1
gpus_per_node: 1
gpu: {base: h100-sxm-80gb, attention_efficiency: 1.5}
)"),
                        "test.yaml: gpu.attention_efficiency: expected a "
                        "fraction of the peak in (0, 1], got a number (1.5)"));
  EXPECT_FALSE(yaml(R"(
nodes: 1
gpus_per_node: 1
gpu: {base: h100-sxm-80gb, attention_efficiency: 0}
)"));
}

TEST(ClusterFile, PersistentGemms) {
  // cuBLAS's Hopper GEMMs are persistent (one CTA per SM), its Ampere ones
  // are not; a file may say either, the plan file keeps it.
  EXPECT_FALSE(gpuPreset("a100-sxm-80gb")->persistentGemms);
  EXPECT_TRUE(gpuPreset("h100-sxm-80gb")->persistentGemms);
  EXPECT_TRUE(gpuPreset("h200-sxm-141gb")->persistentGemms);
  auto c = yaml(R"(
nodes: 1
gpus_per_node: 1
gpu: {base: a100-sxm-80gb, persistent_gemms: true}
)");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_TRUE(c->groups[0].gpu.persistentGemms);
  auto back = jsonText(c->toJson());
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_TRUE(back->groups[0].gpu.persistentGemms);
  auto off = yaml(R"(
nodes: 1
gpus_per_node: 1
gpu: {base: h100-sxm-80gb, persistent_gemms: false}
)");
  ASSERT_TRUE(off) << off.status().message();
  EXPECT_FALSE(off->groups[0].gpu.persistentGemms);
  auto offBack = jsonText(off->toJson());
  ASSERT_TRUE(offBack) << offBack.status().message();
  EXPECT_FALSE(offBack->groups[0].gpu.persistentGemms);
  EXPECT_TRUE(failsWith(yaml(R"(
nodes: 1
gpus_per_node: 1
gpu: {base: h100-sxm-80gb, persistent_gemms: 1}
)"),
                        "test.yaml: gpu.persistent_gemms: expected true or "
                        "false, got an integer (1)"));
}

TEST(ClusterFile, NvlinkSharp) {
  // The H100 and H200 presets have it, the A100 preset not; a file says so
  // with intra_node.nvls, and a group over nodes has it only if all do.
  EXPECT_TRUE(clusterPreset("dgx-h100")->groups[0].intra.nvls);
  EXPECT_TRUE(clusterPreset("dgx-h200")->groups[0].intra.nvls);
  EXPECT_FALSE(clusterPreset("dgx-a100")->groups[0].intra.nvls);
  auto c = yaml(R"(
nodes: 2
gpus_per_node: 8
gpu: h100-sxm-80gb
intra_node: {bandwidth_gb_s: 450, nvls: true}
network: {bandwidth_gb_s: 400}
)");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_TRUE(c->groups[0].intra.nvls);
  auto back = jsonText(c->toJson());
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_TRUE(back->groups[0].intra.nvls);
  auto g = c->stridedGroup(8, 1, 0);
  ASSERT_TRUE(g);
  EXPECT_TRUE(g->intra.nvls);
  EXPECT_TRUE(failsWith(yaml(R"(
nodes: 1
gpus_per_node: 8
gpu: h100-sxm-80gb
intra_node: {bandwidth_gb_s: 450, nvls: "yes"}
)"),
                        "test.yaml: intra_node.nvls: expected true or false"));
  EXPECT_TRUE(failsWith(yaml(R"(
nodes: 1
gpus_per_node: 8
gpu: h100-sxm-80gb
intra_node: {topology: ring, bandwidth_gb_s: 450, nvls: true}
)"),
                        "test.yaml: intra_node.nvls: NVLink SHARP needs "
                        "topology 'nvswitch'"));
}

//===----------------------------------------------------------------------===//
// Every bad-input message
//===----------------------------------------------------------------------===//

TEST(ClusterFileErrors, MissingFieldNamesThePath) {
  auto c = yaml(R"(
nodes:
  - {count: 1, gpus_per_node: 8, gpu: a100-sxm-80gb}
  - count: 1
    gpus_per_node: 8
    gpu: {peak_tflops: {bf16: 1}, memory_bandwidth_gb_s: 1}
intra_node: {bandwidth_gb_s: 300}
network: {bandwidth_gb_s: 200}
)");
  EXPECT_TRUE(failsWith(
      c, "test.yaml: nodes[1].gpu: missing required field 'memory_gb'"));
  EXPECT_TRUE(
      failsWith(yaml("gpus_per_node: 8\n"), "missing required field 'nodes'"));
  EXPECT_TRUE(failsWith(yaml("nodes: 1\ngpus_per_node: 8\n"),
                        "missing required field 'gpu'"));
  EXPECT_TRUE(
      failsWith(yaml("nodes: 1\ngpus_per_node: 8\ngpu: h100-sxm-80gb\n"),
                "missing required field 'intra_node'"));
  EXPECT_TRUE(failsWith(yaml("nodes: [{gpus_per_node: 1}]\n"),
                        "nodes[0]: missing required field 'count'"));
  EXPECT_TRUE(
      failsWith(yaml("nodes: 2\ngpus_per_node: 1\ngpu: h100-sxm-80gb\n"),
                "missing required field 'network'"));
  EXPECT_TRUE(failsWith(yaml("nodes: 1\ngpus_per_node: 1\ngpu: {memory_gb: 1, "
                             "memory_bandwidth_gb_s: 1}\n"),
                        "gpu: missing required field 'peak_tflops'"));
  EXPECT_TRUE(failsWith(yaml("nodes: 1\ngpus_per_node: 2\ngpu: h100-sxm-80gb\n"
                             "intra_node: {latency_us: 1}\n"),
                        "intra_node: missing required field 'bandwidth_gb_s'"));
  EXPECT_TRUE(failsWith(yaml("nodes: 2\ngpus_per_node: 1\ngpu: h100-sxm-80gb\n"
                             "network: {nics: 8}\n"),
                        "network: missing required field 'nic_gbit_s'"));
}

TEST(ClusterFileErrors, NegativeOrZeroBandwidth) {
  std::string base = "nodes: 2\ngpus_per_node: 8\ngpu: h100-sxm-80gb\n";
  EXPECT_TRUE(failsWith(
      yaml(base + "intra_node: {bandwidth_gb_s: -300}\n"
                  "network: {bandwidth_gb_s: 100}\n"),
      "intra_node.bandwidth_gb_s: expected a positive number, got -300"));
  EXPECT_TRUE(
      failsWith(yaml(base + "intra_node: {bandwidth_gb_s: 300}\n"
                            "network: {bandwidth_gb_s: 0}\n"),
                "network.bandwidth_gb_s: expected a positive number, got 0"));
  EXPECT_TRUE(failsWith(
      yaml(base + "intra_node: {bandwidth_gb_s: 300, latency_us: -1}\n"
                  "network: {bandwidth_gb_s: 100}\n"),
      "intra_node.latency_us: expected a number >= 0, got -1"));
  EXPECT_TRUE(
      failsWith(jsonText(R"({"nodes": [{"count": 1, "gpus_per_node": 1,
                   "gpu": {"base": "a100-sxm-80gb", "memory_gb": -80}}]})"),
                "nodes[0].gpu.memory_gb: expected a positive number, got -80"));
  EXPECT_TRUE(
      failsWith(jsonText(R"({"nodes": 1, "gpus_per_node": 1,
                   "gpu": {"base": "a100-sxm-80gb",
                           "peak_tflops": {"bf16": -1}}})"),
                "gpu.peak_tflops.bf16: expected a number >= 0, got -1"));
}

// Links no rank uses may not overflow either: the cluster is written back
// (toJson), where an infinite value would not load (a libFuzzer finding,
// 2026-11-29: 1e308 GB/s on one node became inf bytes/s, then null).
TEST(ClusterFileErrors, UnusedLinksOverflowingAreRefused) {
  EXPECT_TRUE(failsWith(
      jsonText(R"({"nodes": 1, "gpus_per_node": 2, "gpu": "cpu-device",
                   "intra_node": {"bandwidth_gb_s": 10},
                   "network": {"bandwidth_gb_s": 1e308}})"),
      "network.bandwidth_gb_s: expected a finite number >= 0, got inf"));
  EXPECT_TRUE(failsWith(
      jsonText(R"({"nodes": 2, "gpus_per_node": 1, "gpu": "cpu-device",
                   "intra_node": {"bandwidth_gb_s": 1e308},
                   "network": {"bandwidth_gb_s": 10}})"),
      "intra_node.bandwidth_gb_s: expected a finite number >= 0, got inf"));
  // A large but finite one loads and round-trips.
  auto ok = jsonText(R"({"nodes": 1, "gpus_per_node": 1, "gpu": "cpu-device",
                         "network": {"bandwidth_gb_s": 1e200}})");
  ASSERT_TRUE(ok) << ok.status().message();
  EXPECT_TRUE(parseCluster(ok->toJson(), ClusterFormat::Json, "again"));
}

TEST(ClusterFileErrors, WrongTypesAndUnknownNames) {
  std::string base = "gpus_per_node: 8\ngpu: h100-sxm-80gb\n"
                     "intra_node: {bandwidth_gb_s: 450}\n";
  EXPECT_TRUE(failsWith(yaml(base + "nodes: 0\n"),
                        "nodes: expected a positive node count"));
  EXPECT_TRUE(failsWith(yaml(base + "nodes: two\n"), "a string (\"two\")"));
  EXPECT_TRUE(failsWith(yaml(base + "nodes: [{count: 1.5}]\n"),
                        "nodes[0].count: expected a positive integer, got "
                        "a number (1.5)"));
  EXPECT_TRUE(failsWith(yaml(base + "nodes: []\n"),
                        "expected at least one node group"));
  EXPECT_TRUE(failsWith(yaml("nodes: 1\ngpus_per_node: 1\ngpu: b200\n"),
                        "gpu: unknown GPU kind 'b200' (known: a100-sxm-80gb"));
  EXPECT_TRUE(failsWith(
      yaml("nodes: 1\ngpus_per_node: 2\ngpu: h100-sxm-80gb\n"
           "intra_node: {topology: torus, bandwidth_gb_s: 1}\n"),
      "intra_node.topology: expected 'nvswitch' or 'ring', got a string "
      "(\"torus\")"));
  EXPECT_TRUE(
      failsWith(yaml("nodes: 1\ngpus_per_node: 1\ngpu: {base: h100-sxm-80gb, "
                     "memroy_gb: 3}\n"),
                "gpu: unknown field 'memroy_gb'"));
  EXPECT_TRUE(failsWith(yaml("nodes: 1\nnode_count: 3\n"),
                        "unknown field 'node_count'"));
  EXPECT_TRUE(
      failsWith(yaml("nodes: 1\ngpus_per_node: 1\ngpu: {base: h100-sxm-80gb, "
                     "peak_tflops: {int4: 3}}\n"),
                "gpu.peak_tflops: unknown field 'int4'"));
  EXPECT_TRUE(failsWith(
      yaml(
          "nodes: 1\ngpus_per_node: 2\ngpu: h100-sxm-80gb\n"
          "intra_node: {bandwidth_gb_s: 1, bidirectional_bandwidth_gb_s: 2}\n"),
      "not both"));
  EXPECT_TRUE(failsWith(
      yaml("nodes: 1\ngpus_per_node: 1\ngpu: {base: h100-sxm-80gb, "
           "peak_tflops: {bf16: 0, fp16: 0, fp8: 0, tf32: 0, fp32: 0}}\n"),
      "no precision has a positive peak"));
  // A quoted number is a string, not a number.
  EXPECT_TRUE(failsWith(
      yaml("nodes: 1\ngpus_per_node: \"8\"\ngpu: h100-sxm-80gb\n"),
      "gpus_per_node: expected a positive integer, got a string (\"8\")"));
  EXPECT_TRUE(failsWith(yaml("- 1\n- 2\n"), "expected a mapping, got a list"));
}

TEST(ClusterFileErrors, SyntaxErrorsAndFiles) {
  EXPECT_TRUE(failsWith(yaml("nodes: [1, 2\n"), "test.yaml:"));
  EXPECT_TRUE(failsWith(yaml("nodes: [1, 2\n"), "invalid YAML"));
  EXPECT_TRUE(failsWith(jsonText("{\"nodes\": }"), "test.json: invalid JSON"));
  EXPECT_TRUE(failsWith(yaml(""), "the cluster file is empty"));
  EXPECT_TRUE(failsWith(loadClusterFile("/nonexistent/c.yaml"),
                        "/nonexistent/c.yaml: cannot open cluster file"));
  EXPECT_TRUE(failsWith(loadClusterFile("cluster.txt"),
                        "expected a .yaml, .yml or .json cluster file"));
}

//===----------------------------------------------------------------------===//
// Communicators: which links a group spans
//===----------------------------------------------------------------------===//

TEST(CommGroup, IntraAndInterNodeGroups) {
  auto c = resolveCluster("dgx-h100:4");
  ASSERT_TRUE(c);
  // tp group: 8 consecutive ranks, one node.
  auto tp = c->stridedGroup(8, 1, 8);
  ASSERT_TRUE(tp) << tp.status().message();
  EXPECT_EQ(tp->nodes, 1);
  EXPECT_EQ(tp->ranksPerNode, 8);
  EXPECT_DOUBLE_EQ(tp->intra.bandwidth, 450e9);
  // dp group with stride 8: one rank on each of 4 nodes; each rank gets
  // 400 GB/s / 8 GPUs = 50 GB/s of its node's network.
  auto dp = c->stridedGroup(4, 8, 3);
  ASSERT_TRUE(dp);
  EXPECT_EQ(dp->nodes, 4);
  EXPECT_EQ(dp->ranksPerNode, 1);
  EXPECT_DOUBLE_EQ(dp->interBandwidthPerRank, 50e9);
  EXPECT_DOUBLE_EQ(dp->interLatency, 5e-6);
  // 16 ranks with stride 2: 4 per node on 4 nodes.
  auto mixed = c->stridedGroup(16, 2);
  ASSERT_TRUE(mixed);
  EXPECT_EQ(mixed->nodes, 4);
  EXPECT_EQ(mixed->ranksPerNode, 4);
}

TEST(CommGroup, HeterogeneousTakesTheBottleneck) {
  auto c = jsonText(R"({"gpus_per_node": 2,
    "nodes": [
      {"count": 1, "gpu": "a100-sxm-80gb",
       "intra_node": {"bandwidth_gb_s": 300, "latency_us": 1},
       "network": {"bandwidth_gb_s": 200, "latency_us": 3}},
      {"count": 1, "gpu": "h100-sxm-80gb",
       "intra_node": {"topology": "ring", "bandwidth_gb_s": 450,
                      "latency_us": 2},
       "network": {"bandwidth_gb_s": 400, "latency_us": 7}}]})");
  ASSERT_TRUE(c) << c.status().message();
  auto g = c->commGroup({0, 1, 2, 3});
  ASSERT_TRUE(g);
  EXPECT_DOUBLE_EQ(g->intra.bandwidth, 300e9);
  EXPECT_DOUBLE_EQ(g->intra.latency, 2e-6);
  EXPECT_EQ(g->intra.topology, IntraTopology::Ring);
  EXPECT_DOUBLE_EQ(g->interBandwidthPerRank, 100e9); // min(200/2, 400/2)
  EXPECT_DOUBLE_EQ(g->interLatency, 7e-6);
}

TEST(CommGroup, Errors) {
  auto c = resolveCluster("dgx-h100:2");
  ASSERT_TRUE(c);
  EXPECT_TRUE(failsWith(c->commGroup({}), "at least one rank"));
  EXPECT_TRUE(failsWith(c->commGroup({0, 3, 3}), "rank 3 appears twice"));
  EXPECT_TRUE(failsWith(c->commGroup({0, 16}),
                        "rank 16 is out of range: the cluster has 16 devices"));
  EXPECT_TRUE(failsWith(c->stridedGroup(8, 4),
                        "ends at rank 28, but the cluster has 16 devices"));
  EXPECT_TRUE(failsWith(c->stridedGroup(0, 1), "size >= 1"));
  EXPECT_TRUE(failsWith(c->locate(-1), "rank -1 is out of range"));
}

//===----------------------------------------------------------------------===//
// The examples in docs/cluster.md parse.
//===----------------------------------------------------------------------===//

TEST(ClusterDocs, ExamplesParse) {
  std::ifstream in(std::string(DLOPT_SOURCE_DIR) + "/docs/cluster.md");
  ASSERT_TRUE(in) << "docs/cluster.md is missing";
  std::string line, block, lang;
  int parsed = 0;
  bool inBlock = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) {
      if (!inBlock) {
        inBlock = true;
        lang = line.substr(3);
        block.clear();
      } else {
        inBlock = false;
        if (lang == "yaml" || lang == "json") {
          auto c = parseCluster(
              block, lang == "yaml" ? ClusterFormat::Yaml : ClusterFormat::Json,
              "docs/cluster.md");
          EXPECT_TRUE(c) << c.status().message() << "\n" << block;
          ++parsed;
        }
      }
      continue;
    }
    if (inBlock)
      block += line + "\n";
  }
  EXPECT_GE(parsed, 3);
}

TEST(ClusterFileErrors, TooManyDevicesAndBadUtf8) {
  EXPECT_TRUE(failsWith(
      yaml("nodes: 1000000\ngpus_per_node: 1000\ngpu: h100-sxm-80gb\n"
           "intra_node: {bandwidth_gb_s: 1}\nnetwork: {bandwidth_gb_s: 1}\n"),
      "at most 1048576 (2^20) are supported"));
  EXPECT_TRUE(failsWith(
      yaml("nodes: 1\ngpus_per_node: \"\xff\xfe\"\ngpu: h100-sxm-80gb\n"),
      "test.yaml: a value is not valid UTF-8 (at line 2)"));
}

TEST(ClusterFile, HostFieldsParseAndRoundTrip) {
  auto c = yaml("nodes: 2\n"
                "gpus_per_node: 8\n"
                "gpu: h100-sxm-80gb\n"
                "intra_node: {topology: nvswitch, bandwidth_gb_s: 450}\n"
                "network: {bandwidth_gb_s: 400}\n"
                "host: {cpu_cores: 96, memory_gb: 1536}\n");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(c->groups[0].host.cpuCores, 96);
  EXPECT_DOUBLE_EQ(c->groups[0].host.memoryBytes, 1536e9);
  auto again = parseCluster(c->toJson(), ClusterFormat::Json, "again.json");
  ASSERT_TRUE(again) << again.status().message();
  EXPECT_EQ(again->groups[0].host.cpuCores, 96);
  EXPECT_DOUBLE_EQ(again->groups[0].host.memoryBytes, 1536e9);
  // Presets carry their hosts; an unknown host stays 0 (no constraint).
  auto p = clusterPreset("dgx-a100", 1);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->groups[0].host.cpuCores, 128);
  EXPECT_DOUBLE_EQ(p->groups[0].host.memoryBytes, 1024e9);
  auto bare = yaml("nodes: 1\ngpus_per_node: 1\ngpu: a100-sxm-80gb\n");
  ASSERT_TRUE(bare) << bare.status().message();
  EXPECT_EQ(bare->groups[0].host.cpuCores, 0);
  EXPECT_EQ(bare->groups[0].host.memoryBytes, 0);
}

TEST(ClusterFileErrors, BadHostFields) {
  const char *base = "nodes: 1\ngpus_per_node: 1\ngpu: a100-sxm-80gb\n";
  auto bad = [&](const std::string &host, const std::string &needle) {
    auto c = yaml(std::string(base) + host);
    ASSERT_FALSE(c) << host;
    EXPECT_NE(c.status().message().find(needle), std::string::npos)
        << c.status().message();
  };
  bad("host: {memory_gb: -4}\n", "host.memory_gb");
  bad("host: {cpu_cores: 0}\n", "host.cpu_cores");
  bad("host: {cpu_cores: 8, disks: 2}\n", "unknown field 'disks'");
  bad("host: 12\n", "host: expected a mapping");
}

// Issue 10: YAML cannot expand, nest or repeat its way past the reader.
TEST(ClusterFileErrors, YamlLimits) {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'j'; ++c) {
    std::string prev(1, char(c - 1));
    bomb += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 10; ++i)
      bomb += (i ? ", *" : "*") + prev;
    bomb += "]\n";
  }
  EXPECT_TRUE(failsWith(yaml(bomb), "more than 100000 values once aliases "
                                    "are expanded"));
  std::string deep = "a: " + std::string(100, '[') + std::string(100, ']');
  EXPECT_TRUE(failsWith(yaml(deep), "nested deeper than 64 levels at a[0]"));
  EXPECT_TRUE(failsWith(yaml("name: c\nname: d\nnodes: 1\n"),
                        "duplicate key 'name' at the top level"));
  EXPECT_TRUE(failsWith(
      yaml("nodes: 1\ngpus_per_node: 1\ngpu: {memory_gb: .inf, "
           "memory_bandwidth_gb_s: 1, peak_tflops: {bf16: 1}}\n"),
      "gpu.memory_gb: expected a finite number, got inf"));
  EXPECT_TRUE(failsWith(
      yaml("nodes: 1\ngpus_per_node: 1\ngpu: {memory_gb: 1e308, "
           "memory_bandwidth_gb_s: 1, peak_tflops: {bf16: 1}}\n"),
      "memory_gb: expected a finite positive number, got inf"));
}

// Found by the cluster fuzzer: a one-GPU, one-node cluster has no links,
// and its JSON must read back (a written bandwidth of 0 was refused).
TEST(ClusterFile, OneDeviceRoundTrips) {
  auto c = yaml("nodes: 1\ngpus_per_node: 1\ngpu: cpu-device\n"
                "host: {cpu_cores: 2, memory_gb: 24}\n");
  ASSERT_TRUE(c) << c.status().message();
  auto back = parseCluster(c->toJson(), ClusterFormat::Json, "back.json");
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->toJson(), c->toJson());
}

// Found by the cluster fuzzer: YAML takes any bytes, JSON does not; invalid
// UTF-8 is refused when read instead of throwing when written.
TEST(ClusterFileErrors, InvalidUtf8InYaml) {
  EXPECT_TRUE(failsWith(yaml("name: mixed\xff\nnodes: 1\ngpus_per_node: 1\n"
                             "gpu: cpu-device\n"),
                        "is not valid UTF-8"));
  EXPECT_TRUE(failsWith(yaml("na\xc3me: x\n"), "is not valid UTF-8"));
  auto ok = yaml("name: caf\xc3\xa9\nnodes: 1\ngpus_per_node: 1\ngpu: cpu-device\n");
  ASSERT_TRUE(ok) << ok.status().message();
  EXPECT_EQ(ok->name, "caf\xc3\xa9");
}
