//===- NcclCommunicatorTest.cpp - NCCL communicator logic with fakes -------===//
//
// The communicator's host side (argument checks, type/op mapping, groups,
// the async-error / timeout state machine, RAII destroy versus abort,
// creation and bootstrap) against a fake CUDA/NCCL symbol table and a fake
// clock: no GPU, no NCCL.
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/InProcessCommunicator.h"
#include "runtime/cuda/NcclCommunicator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <thread>
#include <unistd.h>

using namespace dlopt::rt;
using namespace dlopt::rt::cuda;

namespace {

/// What the fake library saw and how it behaves.
struct FakeState {
  int worldSize = 4;
  int notReadyPolls = 0;  ///< cudaStreamQuery says "not ready" this often
  bool neverReady = false;
  int asyncErrorAfter = -1; ///< ncclCommGetAsyncError fails after N polls
  int asyncPolls = 0;
  int aborts = 0, destroys = 0, groupStarts = 0, groupEnds = 0;
  int failSendAt = -1, sends = 0, recvs = 0;
  bool haveSplit = true;
  cudaStream_t lastStream = nullptr; ///< of the last ncclAllReduce
  cudaStream_t queried = nullptr;    ///< of the last cudaStreamQuery
  struct Call {
    std::string fn;
    const void *in = nullptr;
    void *out = nullptr;
    size_t count = 0;
    int type = -1, op = -1, peer = -1;
  };
  std::vector<Call> calls;
} g;

ncclComm_t fakeComm(int rank) {
  return reinterpret_cast<ncclComm_t>(uintptr_t(0x1000 + rank));
}
int rankOf(ncclComm_t c) { return int(reinterpret_cast<uintptr_t>(c) - 0x1000) % 32; }

CudaLibrary fakeLib() {
  CudaLibrary l;
  l.cudaSetDevice = [](int) -> cudaError_t { return 0; };
  l.cudaGetLastError = []() -> cudaError_t { return 0; };
  l.cudaStreamCreateWithFlags = [](cudaStream_t *s, unsigned) -> cudaError_t {
    *s = reinterpret_cast<cudaStream_t>(uintptr_t(0x77));
    return 0;
  };
  l.cudaStreamDestroy = [](cudaStream_t) -> cudaError_t { return 0; };
  l.cudaMalloc = [](void **p, size_t) -> cudaError_t {
    static float word;
    *p = &word;
    return 0;
  };
  l.cudaFree = [](void *) -> cudaError_t { return 0; };
  l.cudaStreamQuery = [](cudaStream_t s) -> cudaError_t {
    g.queried = s;
    if (g.neverReady)
      return cudaErrorNotReady;
    if (g.notReadyPolls > 0) {
      --g.notReadyPolls;
      return cudaErrorNotReady;
    }
    return 0;
  };
  l.ncclCommGetAsyncError = [](ncclComm_t, ncclResult_t *r) -> ncclResult_t {
    *r = g.asyncErrorAfter >= 0 && g.asyncPolls++ >= g.asyncErrorAfter ? 6 : 0;
    return 0;
  };
  l.ncclCommAbort = [](ncclComm_t) -> ncclResult_t {
    ++g.aborts;
    return 0;
  };
  l.ncclCommDestroy = [](ncclComm_t) -> ncclResult_t {
    ++g.destroys;
    return 0;
  };
  l.ncclCommUserRank = [](ncclComm_t c, int *r) -> ncclResult_t {
    *r = rankOf(c);
    return 0;
  };
  l.ncclCommCount = [](ncclComm_t, int *n) -> ncclResult_t {
    *n = g.worldSize;
    return 0;
  };
  l.ncclGroupStart = []() -> ncclResult_t {
    ++g.groupStarts;
    return 0;
  };
  l.ncclGroupEnd = []() -> ncclResult_t {
    ++g.groupEnds;
    return 0;
  };
  l.ncclAllReduce = [](const void *in, void *out, size_t n, ncclDataType_t t,
                       ncclRedOp_t op, ncclComm_t,
                       cudaStream_t s) -> ncclResult_t {
    g.lastStream = s;
    g.calls.push_back({"allReduce", in, out, n, int(t), int(op), -1});
    return 0;
  };
  l.ncclAllGather = [](const void *in, void *out, size_t n, ncclDataType_t t,
                       ncclComm_t, cudaStream_t) -> ncclResult_t {
    g.calls.push_back({"allGather", in, out, n, int(t), -1, -1});
    return 0;
  };
  l.ncclReduceScatter = [](const void *in, void *out, size_t n,
                           ncclDataType_t t, ncclRedOp_t op, ncclComm_t,
                           cudaStream_t) -> ncclResult_t {
    g.calls.push_back({"reduceScatter", in, out, n, int(t), int(op), -1});
    return 0;
  };
  l.ncclBroadcast = [](const void *in, void *out, size_t n, ncclDataType_t t,
                       int root, ncclComm_t, cudaStream_t) -> ncclResult_t {
    g.calls.push_back({"broadcast", in, out, n, int(t), -1, root});
    return 0;
  };
  l.ncclSend = [](const void *in, size_t n, ncclDataType_t t, int peer,
                  ncclComm_t, cudaStream_t) -> ncclResult_t {
    if (g.sends++ == g.failSendAt)
      return 3; // ncclInternalError
    g.calls.push_back({"send", in, nullptr, n, int(t), -1, peer});
    return 0;
  };
  l.ncclRecv = [](void *out, size_t n, ncclDataType_t t, int peer, ncclComm_t,
                  cudaStream_t) -> ncclResult_t {
    ++g.recvs;
    g.calls.push_back({"recv", nullptr, out, n, int(t), -1, peer});
    return 0;
  };
  l.ncclCommInitAll = [](ncclComm_t *c, int n, const int *) -> ncclResult_t {
    for (int i = 0; i < n; ++i)
      c[i] = fakeComm(i);
    g.worldSize = n;
    return 0;
  };
  l.ncclCommInitRank = [](ncclComm_t *c, int n, ncclUniqueId id,
                          int rank) -> ncclResult_t {
    if (id.internal[0] != 'd')
      return 4; // ncclInvalidArgument: not the id the test made
    *c = fakeComm(rank);
    g.worldSize = n;
    return 0;
  };
  l.ncclGetUniqueId = [](ncclUniqueId *id) -> ncclResult_t {
    for (int i = 0; i < kNcclUniqueIdBytes; ++i)
      id->internal[i] = char("dlopt"[i % 5]);
    return 0;
  };
  l.ncclCommSplit = [](ncclComm_t c, int color, int key, ncclComm_t *out,
                       void *) -> ncclResult_t {
    g.calls.push_back({"split", nullptr, nullptr, 0, color, key, rankOf(c)});
    *out = color < 0 ? nullptr : fakeComm(32 + key);
    return 0;
  };
  return l;
}

/// A clock that moves only when the code under test sleeps.
class FakeClock final : public Clock {
public:
  std::chrono::steady_clock::time_point now() override { return t; }
  void sleepFor(std::chrono::microseconds d) override {
    t += d;
    ++sleeps;
  }
  std::chrono::steady_clock::time_point t{};
  int sleeps = 0;
};

class NcclCommunicatorTest : public ::testing::Test {
protected:
  void SetUp() override {
    g = FakeState();
    lib = fakeLib();
    opts.clock = &clock;
    opts.timeout = std::chrono::milliseconds(100);
    opts.pollInterval = std::chrono::microseconds(1000);
  }
  std::unique_ptr<NcclCommunicator> make(int rank = 1) {
    auto c = NcclCommunicator::create(lib, NcclComm(lib, fakeComm(rank)), 0,
                                      nullptr, opts);
    EXPECT_TRUE(c) << c.status().message();
    return c ? c.take() : nullptr;
  }
  CudaLibrary lib;
  FakeClock clock;
  NcclOptions opts;
  float buf[64] = {};
  CommInput din(int64_t n, DType t = DType::F32) {
    return {buf, n, t, MemorySpace::Device};
  }
  CommOutput dout(int64_t n, DType t = DType::F32) {
    return {buf + 32, n, t, MemorySpace::Device};
  }
};

TEST_F(NcclCommunicatorTest, RankAndSizeComeFromNccl) {
  auto c = make(2);
  EXPECT_EQ(c->rank(), 2);
  EXPECT_EQ(c->size(), 4);
}

TEST_F(NcclCommunicatorTest, CallsMapTypesOpsAndCounts) {
  auto c = make();
  ASSERT_TRUE(c->allReduce(din(8, DType::BF16), dout(8, DType::BF16),
                           ReduceOp::Avg));
  ASSERT_TRUE(c->allGather(din(2), dout(8)));
  ASSERT_TRUE(c->reduceScatter(din(8, DType::I64), dout(2, DType::I64),
                               ReduceOp::Max));
  ASSERT_TRUE(c->broadcast(dout(5, DType::F16), 3));
  ASSERT_EQ(g.calls.size(), 4u);
  EXPECT_EQ(g.calls[0].fn, "allReduce");
  EXPECT_EQ(g.calls[0].type, ncclBfloat16);
  EXPECT_EQ(g.calls[0].op, ncclAvg);
  EXPECT_EQ(g.calls[0].count, 8u);
  EXPECT_EQ(g.calls[1].count, 2u); // per-rank count
  EXPECT_EQ(g.calls[2].type, ncclInt64);
  EXPECT_EQ(g.calls[2].op, ncclMax);
  EXPECT_EQ(g.calls[2].count, 2u);
  EXPECT_EQ(g.calls[3].peer, 3);
  EXPECT_EQ(g.calls[3].type, ncclFloat16);
}

TEST_F(NcclCommunicatorTest, CallsGoToTheStreamTheBackendSets) {
  // The cuda backend enqueues collectives on its rank's comm stream.
  auto c = make();
  EXPECT_TRUE(c->acceptsDeviceMemory());
  cudaStream_t own = c->stream();
  auto backendStream = reinterpret_cast<cudaStream_t>(uintptr_t(0x99));
  ASSERT_TRUE(c->setDeviceStream(backendStream));
  ASSERT_TRUE(c->allReduce(din(4), dout(4), ReduceOp::Sum));
  EXPECT_EQ(g.lastStream, backendStream);
  EXPECT_EQ(g.queried, backendStream); // the blocking wait polls it
  // A group split meanwhile keeps the creation stream, not the backend's.
  auto child = c->split(0, 0);
  ASSERT_TRUE(child) << child.status().message();
  ASSERT_TRUE((*child)->allReduce(din(4), dout(4), ReduceOp::Sum));
  EXPECT_EQ(g.lastStream, own);
  ASSERT_TRUE(c->setDeviceStream(nullptr));
  ASSERT_TRUE(c->allReduce(din(4), dout(4), ReduceOp::Sum));
  EXPECT_EQ(g.lastStream, own);
  EXPECT_EQ(c->stream(), own);
}

TEST(HostCommunicator, TakesHostMemoryAndHasNoDeviceStream) {
  auto group = createInProcessGroup(1);
  EXPECT_FALSE(group[0]->acceptsDeviceMemory());
  EXPECT_FALSE(group[0]->setDeviceStream(nullptr));
}

TEST_F(NcclCommunicatorTest, BadLocalArgumentsAreErrorsNotCalls) {
  auto c = make();
  CommInput host{buf, 4, DType::F32, MemorySpace::Host};
  Status s = c->allReduce(host, dout(4), ReduceOp::Sum);
  EXPECT_NE(s.message().find("device buffers only"), std::string::npos) << s.message();
  s = c->allReduce(din(4), dout(5), ReduceOp::Sum);
  EXPECT_NE(s.message().find("out.count 5 != in.count 4"), std::string::npos) << s.message();
  s = c->allGather(din(2), dout(7));
  EXPECT_NE(s.message().find("in.count * size (8)"), std::string::npos) << s.message();
  s = c->allReduce(din(4, DType::I1), dout(4, DType::I1), ReduceOp::Sum);
  EXPECT_NE(s.message().find("cannot reduce i1"), std::string::npos);
  s = c->allReduce(din(4, DType::F16), dout(4), ReduceOp::Sum);
  EXPECT_NE(s.message().find("dtype mismatch"), std::string::npos);
  s = c->send(din(4), 4);
  EXPECT_NE(s.message().find("peer out of range"), std::string::npos);
  s = c->broadcast(dout(4), -1);
  EXPECT_NE(s.message().find("root -1 out of range"), std::string::npos);
  EXPECT_TRUE(g.calls.empty());
  EXPECT_FALSE(c->aborted()); // local errors do not abort the group
}

TEST_F(NcclCommunicatorTest, BlockingCallsPollUntilTheStreamIsDone) {
  auto c = make();
  g.notReadyPolls = 3;
  ASSERT_TRUE(c->allReduce(din(4), dout(4), ReduceOp::Sum));
  EXPECT_EQ(clock.sleeps, 3);
  EXPECT_EQ(g.aborts, 0);
}

TEST_F(NcclCommunicatorTest, NonBlockingCallsReturnAtOnceAndSynchronizeWaits) {
  opts.blocking = false;
  auto c = make();
  g.notReadyPolls = 2;
  ASSERT_TRUE(c->allReduce(din(4), dout(4), ReduceOp::Sum));
  EXPECT_EQ(clock.sleeps, 0);
  ASSERT_TRUE(c->synchronize());
  EXPECT_EQ(clock.sleeps, 2);
}

TEST_F(NcclCommunicatorTest, AsyncErrorAbortsInsteadOfHanging) {
  auto c = make();
  g.neverReady = true;
  g.asyncErrorAfter = 2;
  Status s = c->allReduce(din(4), dout(4), ReduceOp::Sum);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("allReduce on rank 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("asynchronous NCCL error: ncclRemoteError"),
            std::string::npos) << s.message();
  EXPECT_NE(s.message().find("communicator aborted"), std::string::npos);
  EXPECT_EQ(g.aborts, 1);
  EXPECT_TRUE(c->aborted());
  // Later calls fail at once with the reason; nothing reaches NCCL.
  size_t before = g.calls.size();
  Status again = c->allGather(din(1), dout(4));
  EXPECT_NE(again.message().find("was aborted"), std::string::npos) << again.message();
  EXPECT_EQ(g.calls.size(), before);
  c.reset();
  EXPECT_EQ(g.destroys, 0); // aborted, never destroyed
  EXPECT_EQ(g.aborts, 1);
}

TEST_F(NcclCommunicatorTest, TimeoutAbortsTheCommunicator) {
  auto c = make();
  g.neverReady = true;
  Status s = c->barrier();
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("barrier on rank 1: timed out after 100 ms"),
            std::string::npos) << s.message();
  EXPECT_GE(clock.t.time_since_epoch(), std::chrono::milliseconds(100));
  EXPECT_LE(clock.t.time_since_epoch(), std::chrono::milliseconds(102));
  EXPECT_EQ(g.aborts, 1);
  c.reset();
  EXPECT_EQ(g.destroys, 0);
}

TEST_F(NcclCommunicatorTest, NormalDestructionDestroys) {
  auto c = make();
  ASSERT_TRUE(c->allReduce(din(4), dout(4), ReduceOp::Sum));
  c.reset();
  EXPECT_EQ(g.destroys, 1);
  EXPECT_EQ(g.aborts, 0);
}

TEST_F(NcclCommunicatorTest, AbortFromAnotherThreadWakesAWaiter) {
  auto c = make();
  g.neverReady = true;
  opts.timeout = std::chrono::hours(1);
  c->setTimeout(std::chrono::hours(1));
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c->abort("rank 3 lost its GPU");
  });
  Status s = c->allReduce(din(4), dout(4), ReduceOp::Sum);
  t.join();
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("rank 3 lost its GPU"), std::string::npos) << s.message();
  EXPECT_EQ(g.aborts, 1);
}

TEST_F(NcclCommunicatorTest, AllToAllIsOneGroupOfPairedSendRecv) {
  auto c = make();
  ASSERT_TRUE(c->allToAll(din(8), dout(8)));
  EXPECT_EQ(g.groupStarts, 1);
  EXPECT_EQ(g.groupEnds, 1);
  ASSERT_EQ(g.calls.size(), 8u);
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(g.calls[2 * p].fn, "send");
    EXPECT_EQ(g.calls[2 * p].peer, p);
    EXPECT_EQ(g.calls[2 * p].in, static_cast<const void *>(buf + 2 * p));
    EXPECT_EQ(g.calls[2 * p + 1].fn, "recv");
    EXPECT_EQ(g.calls[2 * p + 1].out, static_cast<void *>(buf + 32 + 2 * p));
    EXPECT_EQ(g.calls[2 * p + 1].count, 2u);
  }
  Status s = c->allToAll(din(6), dout(6));
  EXPECT_NE(s.message().find("divisible by 4"), std::string::npos);
}

TEST_F(NcclCommunicatorTest, GroupIsEndedWhenACallInsideFails) {
  auto c = make();
  g.failSendAt = 1;
  Status s = c->allToAll(din(8), dout(8));
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("ncclSend"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("ncclInternalError"), std::string::npos);
  EXPECT_EQ(g.groupStarts, 1);
  EXPECT_EQ(g.groupEnds, 1); // the guard closed the group
  EXPECT_EQ(g.aborts, 1);
}

TEST_F(NcclCommunicatorTest, GroupGuard) {
  {
    auto gg = NcclGroupGuard::begin(lib);
    ASSERT_TRUE(gg);
    EXPECT_TRUE(gg->end());
    EXPECT_FALSE(gg->end()); // once
  }
  EXPECT_EQ(g.groupEnds, 1);
  {
    auto gg = NcclGroupGuard::begin(lib);
    ASSERT_TRUE(gg);
  } // left open: the destructor ends it
  EXPECT_EQ(g.groupStarts, 2);
  EXPECT_EQ(g.groupEnds, 2);
}

TEST_F(NcclCommunicatorTest, NcclCommRaii) {
  {
    NcclComm a(lib, fakeComm(0));
    NcclComm b = std::move(a);
    EXPECT_FALSE(a);
    EXPECT_TRUE(b);
  }
  EXPECT_EQ(g.destroys, 1);
  {
    NcclComm a(lib, fakeComm(0));
    a.markFailed();
  }
  EXPECT_EQ(g.aborts, 1);
  EXPECT_EQ(g.destroys, 1);
}

TEST_F(NcclCommunicatorTest, SplitUsesNcclCommSplit) {
  auto c = make(1);
  auto child = c->split(5, 2);
  ASSERT_TRUE(child) << child.status().message();
  ASSERT_TRUE(*child);
  EXPECT_EQ((*child)->rank(), 2 + 32 - 32); // fakeComm(32 + key) -> rank key
  auto none = c->split(-3, 0);
  ASSERT_TRUE(none);
  EXPECT_FALSE(*none);
  EXPECT_EQ(g.calls.back().type, -1); // NCCL_SPLIT_NOCOLOR
  lib.ncclCommSplit = nullptr;
  auto c2 = make(0);
  auto e = c2->split(0, 0);
  ASSERT_FALSE(e);
  EXPECT_NE(e.status().message().find("NCCL >= 2.18"), std::string::npos);
}

TEST_F(NcclCommunicatorTest, InGraphGroupOfThreeDevices) {
  auto group = createNcclGroup(lib, {0, 1, 2}, opts);
  ASSERT_TRUE(group) << group.status().message();
  ASSERT_EQ(group->size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ((*group)[r]->rank(), r);
    EXPECT_EQ((*group)[r]->size(), 3);
    EXPECT_EQ(static_cast<NcclCommunicator &>(*(*group)[r]).device(), r);
  }
  group->clear();
  EXPECT_EQ(g.destroys, 3);
}

TEST_F(NcclCommunicatorTest, BetweenGraphBootstrapThroughAFile) {
  std::string dir = ::testing::TempDir() + "/dlopt-nccl-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::string file = dir + "/id";
  std::filesystem::remove(file);
  unsetenv("DLOPT_NCCL_ID");
  setenv("DLOPT_NCCL_ID_FILE", file.c_str(), 1);
  // Rank 1 first: no file yet, it times out on the fake clock.
  LaunchInfo r1{1, 2, 1, "test"};
  auto early = bootstrapUniqueId(lib, r1, opts);
  ASSERT_FALSE(early);
  EXPECT_NE(early.status().message().find("waiting for rank 0"), std::string::npos)
      << early.status().message();
  // Rank 0 writes it, rank 1 reads the same id, both init their rank.
  LaunchInfo r0{0, 2, 0, "test"};
  auto id0 = bootstrapUniqueId(lib, r0, opts);
  ASSERT_TRUE(id0) << id0.status().message();
  auto id1 = bootstrapUniqueId(lib, r1, opts);
  ASSERT_TRUE(id1) << id1.status().message();
  EXPECT_EQ(uniqueIdToHex(*id0), uniqueIdToHex(*id1));
  auto c1 = createNcclCommunicator(lib, 1, 2, *id1, 0, opts);
  ASSERT_TRUE(c1) << c1.status().message();
  EXPECT_EQ((*c1)->rank(), 1);
  EXPECT_EQ((*c1)->size(), 2);
  // The environment variable wins over the file.
  setenv("DLOPT_NCCL_ID", uniqueIdToHex(*id0).c_str(), 1);
  auto fromEnv = bootstrapUniqueId(lib, r1, opts);
  ASSERT_TRUE(fromEnv);
  unsetenv("DLOPT_NCCL_ID");
  unsetenv("DLOPT_NCCL_ID_FILE");
  auto none = bootstrapUniqueId(lib, r1, opts);
  ASSERT_FALSE(none);
  EXPECT_NE(none.status().message().find("DLOPT_NCCL_ID_FILE"), std::string::npos);
  auto bad = createNcclCommunicator(lib, 2, 2, *id0, 0, opts);
  ASSERT_FALSE(bad);
  std::filesystem::remove_all(dir);
}

} // namespace
