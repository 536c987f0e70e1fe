//===- InProcessCommunicator.h - Ranks as threads of one process ---------===//
//
// In-graph execution on the CPU: one process drives n ranks, one thread per
// rank, and they exchange host buffers through a shared rendezvous (a mutex
// and a condition variable). Reductions are deterministic: every element is
// reduced in rank order 0, 1, ..., n-1 (f16/bf16 accumulate in f32 and round
// once; f32 accumulates in f32; integers wrap), so results are bitwise
// identical across runs and thread schedules.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/comm/Communicator.h"

#include <memory>
#include <vector>

namespace dlopt::rt {

struct InProcessOptions {
  std::chrono::milliseconds timeout = kDefaultCommTimeout;
};

/// Creates a group of n ranks; element r is rank r's communicator. Each must
/// be used from one thread at a time (normally one thread per rank).
std::vector<std::unique_ptr<Communicator>>
createInProcessGroup(int n, InProcessOptions opts = {});

} // namespace dlopt::rt
