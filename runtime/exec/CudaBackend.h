//===- CudaBackend.h - Runs instructions on NVIDIA GPUs -------------------===//
//
// The "cuda" backend (dlopt-run --backend cuda): one cudaMalloc arena per
// rank at the size of the rank's memory plan, host<->device copies, matmul
// on cuBLASLt, and every other supported op on the nvcc-built kernels of
// runtime/cuda/kernels (when this build has them; without nvcc the backend
// runs matmul and plain copies only and says "built without CUDA kernels").
// Instructions go to a compute stream and communication instructions to a
// comm stream, with the events runtime/cuda/StreamSchedule.h derives.
// Communication instructions run over the rank's communicators: NCCL on
// device buffers, or a host communicator through pinned host staging
// (CudaBackend.cpp, "Communication"; configureCudaWorld() below).
//
// CUDA, cuBLAS(Lt) and NCCL are loaded at run time (CudaLibrary.h); without
// a driver or device, create() fails with "cuda backend: no CUDA device
// (cudaGetDeviceCount: ...)".
//
// Status: builds and reports its errors on machines without a GPU; nothing
// of it has run on a GPU yet (docs/gpu.md lists what has not).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/exec/Backend.h"
#include "runtime/exec/World.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dlopt::rt::cuda {
struct CudaLibrary;
}

namespace dlopt::rt {

struct CudaBackendOptions {
  /// Device of rank r: `device` when >= 0 (single-rank runs), else
  /// $DLOPT_CUDA_DEVICE, else the launcher's local rank (between-graph),
  /// else r modulo the number of visible devices (in-graph).
  int device = -1;
  /// TF32 for f32 GEMMs; default from DLOPT_CUDA_TF32=1.
  bool tf32 = false;
};

/// Device memory of one rank, in bytes.
struct CudaMemoryStats {
  int device = -1;
  int64_t arenaBytes = 0;       ///< the memory plan's arena
  int64_t workspaceBytes = 0;   ///< kernel scratch (grown on demand)
  int64_t gemmWorkspaceBytes = 0; ///< cuBLASLt workspace (allocated once)
  int64_t trackedPeakBytes = 0; ///< most of the three held at once
  /// Peak of (free memory when the rank's context was set up) - (free now),
  /// sampled by cudaMemGetInfo at every synchronize: includes what cuBLAS,
  /// NCCL and the CUDA runtime allocate on their own.
  int64_t memGetInfoPeakBytes = 0;
};

class CudaBackend final : public Backend {
public:
  /// Loads CUDA and checks for a device; the error says why not.
  static Expected<std::unique_ptr<CudaBackend>>
  create(const CudaBackendOptions &opts = {});
  /// Options from the environment (DLOPT_CUDA_TF32; DLOPT_CUDA_DEVICE is
  /// read at device selection).
  static CudaBackendOptions optionsFromEnv();
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  bool supportsOp(const std::string &op) const override;
  Expected<std::unique_ptr<DeviceArena>> allocateArena(int rank,
                                                      int64_t bytes) override;
  Status copyToDevice(DeviceArena &arena, int64_t offset, const void *src,
                      int64_t bytes) override;
  Status copyToHost(void *dst, const DeviceArena &arena, int64_t offset,
                    int64_t bytes) override;
  Status copyOnDevice(DeviceArena &arena, int64_t dstOffset, int64_t srcOffset,
                      int64_t bytes) override;
  Status run(const Instr &instr, std::span<const TensorRef> ins,
             std::span<const TensorRef> outs, const RunContext &ctx) override;
  Status synchronize(int rank) override;
  bool setDeviceTiming(int rank, bool on) override;
  Expected<std::vector<double>> takeDeviceTimes(int rank) override;

  /// Memory of `rank` (zeros before its arena exists).
  CudaMemoryStats memoryStats(int rank) const;
  /// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)" style, for reports.
  std::string deviceDescription(int rank) const;

  /// Whether this build has the nvcc-built kernels, and a description of
  /// the build ("kernels: CUDA 13.0, sm_80 sm_90" or "built without CUDA
  /// kernels (nvcc was not found at configure time)").
  static bool kernelsBuilt();
  static std::string buildDescription();
  /// How this process ran fused_elementwise so far: "fused kernels: 7
  /// compiled by NVRTC in 2.10 s", or the interpreter and why.
  static std::string fusedKernelReport();
  /// Every op name supportsOp() accepts in this build, sorted.
  static std::vector<std::string> supportedOps();

  struct Rank; ///< per-rank device state (CudaBackend.cpp)

private:
  class Arena;
  CudaBackend(const CudaBackendOptions &opts, const cuda::CudaLibrary *lib,
              int numDevices);
  Expected<Rank *> rankState(int rank);
  Rank *findRank(int rank) const;

  CudaBackendOptions opts_;
  const cuda::CudaLibrary *lib_; ///< the symbol table in use
  int numDevices_;
  mutable std::mutex mu_;
  std::map<int, std::unique_ptr<Rank>> ranks_;
};

/// How a World (runtime/exec/World.h) runs its ranks on the cuda backend.
struct CudaWorldOptions {
  /// Device of each rank; empty: rank r on device r modulo the visible
  /// devices (several ranks may share one GPU).
  std::vector<int> devices;
  /// NCCL communicators: ncclCommInitAll over the ranks' devices, every
  /// group split off with ncclCommSplit (NCCL >= 2.18). Needs a distinct
  /// device per rank. Otherwise the World's default host communicators:
  /// every collective is staged through host memory (slow; for tests and
  /// ranks sharing one GPU).
  bool nccl = false;
  /// Options of every rank's backend (`device` is taken from `devices`).
  CudaBackendOptions backend;
};

/// Makes `o` run a World of `worldSize` ranks on the cuda backend: sets
/// o.backend (one CudaBackend per rank, on its device) and, with nccl,
/// o.worldGroup. Errors: no CUDA device, a device that does not exist, or
/// NCCL with fewer distinct devices than ranks.
Status configureCudaWorld(WorldOptions &o, int worldSize,
                          const CudaWorldOptions &co = {});

/// Between-graph and hybrid GPU runs (docs/launch.md): this process runs
/// ranks [o.firstRank, o.firstRank + o.numRanks) of `worldSize`, on devices
/// nodeLocalIndex * numRanks + i of this node (modulo the visible devices),
/// with NCCL between every rank: the first process creates the NCCL unique
/// id and broadcasts it over o.processGroup (MPI), every rank joins with
/// ncclCommInitRank (this process's ranks on threads of their own), and
/// groups are split with ncclCommSplit. o.processGroup must be set.
/// Written against the NCCL API; not yet run on GPUs (docs/gpu.md).
Status configureCudaProcessWorld(WorldOptions &o, int worldSize,
                                 int nodeLocalIndex,
                                 const CudaWorldOptions &co = {});

} // namespace dlopt::rt
