//===- ClusterYamlFuzzer.cpp - Fuzzes the YAML cluster reader -------------===//
//
// parseCluster(YAML) (anchors and aliases, depth, duplicate keys, every
// field's checks); an accepted cluster printed with Cluster::toJson must
// load back (docs/cluster.md says it does) and print the same.
//
//===----------------------------------------------------------------------===//
#include "planner/Cluster.h"
#include "test/fuzz/FuzzUtil.h"

using namespace dlopt::planner;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto cluster =
      parseCluster(dlopt::fuzz::textOf(data, size), ClusterFormat::Yaml, "fuzz");
  if (!cluster)
    return 0;
  std::string json = cluster->toJson();
  auto again = parseCluster(json, ClusterFormat::Json, "fuzz");
  FUZZ_EXPECT(again.isOk(), "toJson output does not load: " +
                                again.status().message() + "\n" + json);
  FUZZ_EXPECT(again->toJson() == json, "the round trip changed\n" + json);
  return 0;
}
