//===- CudaLibraryTest.cpp - Runtime loading and bootstrap, no GPU needed -===//
#include "runtime/cuda/CudaLibrary.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <iostream>

using namespace dlopt::rt;
using namespace dlopt::rt::cuda;

namespace {

TEST(CudaLibrary, LoadReportsTableOrClearError) {
  auto lib = loadCuda();
  if (lib) {
    std::cout << "loadCuda: loaded (cudart from " << (*lib)->cudartPath
              << ", nccl from " << (*lib)->ncclPath << ")\n";
    EXPECT_NE((*lib)->cudaGetDeviceCount, nullptr);
    EXPECT_NE((*lib)->ncclAllReduce, nullptr);
  } else {
    std::cout << "loadCuda: " << lib.status().message() << "\n";
    EXPECT_FALSE(lib.status().message().empty());
  }
  std::string why;
  int n = deviceCount(&why);
  std::cout << "deviceCount: " << n << (n ? "" : " (" + why + ")") << "\n";
  if (n == 0) {
    EXPECT_FALSE(why.empty());
  }
}

TEST(CudaLibrary, MissingLibraryIsNamed) {
  auto h = openFirstLibrary({"libdlopt_does_not_exist.so.7"});
  ASSERT_FALSE(h);
  EXPECT_NE(h.status().message().find(
                "libdlopt_does_not_exist.so.7 not found (dlopen: "),
            std::string::npos)
      << h.status().message();
}

TEST(CudaLibrary, ErrorMessages) {
  EXPECT_NE(cudaErrorMessage(100).find("cudaErrorNoDevice"), std::string::npos)
      << cudaErrorMessage(100);
  EXPECT_NE(cublasStatusMessage(7).find("CUBLAS_STATUS_INVALID_VALUE"),
            std::string::npos)
      << cublasStatusMessage(7);
  EXPECT_NE(ncclResultMessage(4).find("ncclInvalidArgument"), std::string::npos);
  EXPECT_NE(ncclResultMessage(99).find("99"), std::string::npos);
}

Status failingCuda() {
  DLOPT_CUDA_CHECK(cudaError_t(2));
  return Status::ok();
}
Status failingNccl() {
  DLOPT_NCCL_CHECK(ncclResult_t(5));
  return Status::ok();
}
Status okCublas() {
  DLOPT_CUBLAS_CHECK(cublasStatus_t(0));
  return Status::ok();
}

TEST(CudaLibrary, CheckMacrosRecordExpressionAndLocation) {
  Status s = failingCuda();
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("cudaError_t(2) failed at "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("CudaLibraryTest.cpp:"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("cudaErrorMemoryAllocation"), std::string::npos) << s.message();
  Status n = failingNccl();
  EXPECT_NE(n.message().find("ncclInvalidUsage"), std::string::npos) << n.message();
  EXPECT_TRUE(okCublas().isOk());
}

TEST(NcclBootstrap, UniqueIdHexRoundTrip) {
  ncclUniqueId id;
  for (int i = 0; i < kNcclUniqueIdBytes; ++i)
    id.internal[i] = char(i * 37 + 11);
  std::string hex = uniqueIdToHex(id);
  ASSERT_EQ(hex.size(), 256u);
  auto back = uniqueIdFromHex(hex);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(0, std::memcmp(back->internal, id.internal, kNcclUniqueIdBytes));

  auto path = std::filesystem::temp_directory_path() /
              ("dlopt_nccl_id_" + std::to_string(::getpid()));
  ASSERT_TRUE(writeUniqueIdFile(path.string(), id).isOk());
  auto fromFile = readUniqueIdFile(path.string());
  ASSERT_TRUE(fromFile) << fromFile.status().message();
  EXPECT_EQ(0, std::memcmp(fromFile->internal, id.internal, kNcclUniqueIdBytes));
  std::filesystem::remove(path);

  ::setenv("DLOPT_NCCL_ID", hex.c_str(), 1);
  auto fromEnv = uniqueIdFromEnv();
  ASSERT_TRUE(fromEnv) << fromEnv.status().message();
  ::unsetenv("DLOPT_NCCL_ID");
  EXPECT_FALSE(uniqueIdFromEnv());
}

TEST(NcclBootstrap, BadHex) {
  auto shortId = uniqueIdFromHex("abcd");
  ASSERT_FALSE(shortId);
  EXPECT_NE(shortId.status().message().find("expected 256 hex digits, got 4"),
            std::string::npos);
  std::string bad(256, '0');
  bad[17] = 'g';
  auto b = uniqueIdFromHex(bad);
  ASSERT_FALSE(b);
  EXPECT_NE(b.status().message().find("position 17"), std::string::npos)
      << b.status().message();
  EXPECT_FALSE(readUniqueIdFile("/nonexistent/dlopt_id"));
}

class LaunchEnv : public ::testing::Test {
protected:
  static constexpr const char *kVars[] = {
      "DLOPT_RANK", "DLOPT_WORLD_SIZE", "DLOPT_LOCAL_RANK",
      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
      "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
      "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  void clear() {
    for (const char *v : kVars)
      ::unsetenv(v);
  }
  void set(const char *k, const char *v) { ::setenv(k, v, 1); }
};

TEST_F(LaunchEnv, NoneSet) {
  auto li = launchInfoFromEnv();
  ASSERT_FALSE(li);
  EXPECT_NE(li.status().message().find("DLOPT_RANK"), std::string::npos);
}

TEST_F(LaunchEnv, EachLauncher) {
  set("OMPI_COMM_WORLD_RANK", "3");
  set("OMPI_COMM_WORLD_SIZE", "8");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  auto li = launchInfoFromEnv();
  ASSERT_TRUE(li) << li.status().message();
  EXPECT_EQ(li->rank, 3);
  EXPECT_EQ(li->worldSize, 8);
  EXPECT_EQ(li->localRank, 1);
  clear();
  set("PMI_RANK", "0");
  set("PMI_SIZE", "2");
  li = launchInfoFromEnv();
  ASSERT_TRUE(li);
  EXPECT_EQ(li->worldSize, 2);
  clear();
  set("SLURM_PROCID", "5");
  set("SLURM_NTASKS", "6");
  li = launchInfoFromEnv();
  ASSERT_TRUE(li);
  EXPECT_EQ(li->rank, 5);
  // DLOPT_* overrides the launcher.
  set("DLOPT_RANK", "0");
  set("DLOPT_WORLD_SIZE", "1");
  li = launchInfoFromEnv();
  ASSERT_TRUE(li);
  EXPECT_EQ(li->worldSize, 1);
  EXPECT_EQ(li->source, "DLOPT_RANK/DLOPT_WORLD_SIZE");
}

TEST_F(LaunchEnv, Errors) {
  set("DLOPT_RANK", "1");
  auto li = launchInfoFromEnv();
  ASSERT_FALSE(li);
  EXPECT_NE(li.status().message().find("DLOPT_RANK is set but DLOPT_WORLD_SIZE is not"),
            std::string::npos) << li.status().message();
  set("DLOPT_WORLD_SIZE", "x2");
  li = launchInfoFromEnv();
  ASSERT_FALSE(li);
  EXPECT_NE(li.status().message().find("not a non-negative integer"), std::string::npos);
  set("DLOPT_WORLD_SIZE", "1");
  li = launchInfoFromEnv();
  ASSERT_FALSE(li);
  EXPECT_NE(li.status().message().find("outside world size"), std::string::npos);
  clear();
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "4");
  set("SLURM_PROCID", "2");
  set("SLURM_NTASKS", "4");
  li = launchInfoFromEnv();
  ASSERT_FALSE(li);
  EXPECT_NE(li.status().message().find("inconsistent"), std::string::npos)
      << li.status().message();
}

// Labelled `gpu` in CMake; skips with the reason when no device is present.
TEST(CudaGpu, SetDeviceAndNcclWorldOfOne) {
  auto lib = loadCuda();
  if (!lib)
    GTEST_SKIP() << "CUDA not loadable: " << lib.status().message();
  std::string why;
  if (deviceCount(&why) == 0)
    GTEST_SKIP() << "no GPU: " << why;
  const CudaLibrary &L = **lib;
  ASSERT_EQ(L.cudaSetDevice(0), 0);
  ncclComm_t comm = nullptr;
  int dev = 0;
  ASSERT_EQ(L.ncclCommInitAll(&comm, 1, &dev), 0);
  float *buf = nullptr;
  ASSERT_EQ(L.cudaMalloc(reinterpret_cast<void **>(&buf), 4 * sizeof(float)), 0);
  float host[4] = {1, 2, 3, 4};
  ASSERT_EQ(L.cudaMemcpy(buf, host, sizeof host, cudaMemcpyHostToDevice), 0);
  ASSERT_EQ(L.ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, comm, nullptr), 0);
  float out[4] = {};
  ASSERT_EQ(L.cudaMemcpy(out, buf, sizeof out, cudaMemcpyDeviceToHost), 0);
  EXPECT_EQ(out[3], 4.f);
  L.cudaFree(buf);
  L.ncclCommDestroy(comm);
}

} // namespace
