//===- CudaBackend.cpp - Runs instructions on NVIDIA GPUs -----------------===//
//
// Host side of the cuda backend: per-rank device state (streams, cuBLASLt,
// workspaces, the device error word), the stream/event bookkeeping of
// runtime/cuda/StreamSchedule.h, and one handler per op that launches
// cuBLASLt or a kernel of runtime/cuda/kernels. Instructions arrive
// verified (runtime/format/OpTable.h, when the executable was loaded), so a
// handler checks only what the CUDA kernels cannot do (head dims, fused
// program limits, dims after collapsing) and takes the shape rules it needs
// from the op table.
//
//===----------------------------------------------------------------------===//

#include "runtime/exec/CudaBackend.h"

#include "runtime/cpu/KernelUtil.h"
#include "runtime/cuda/CudaGemm.h"
#include "runtime/cuda/CudaHandles.h"
#include "runtime/cuda/CudaLibrary.h"
#include "runtime/cuda/NcclCommunicator.h"
#include "runtime/cuda/StreamSchedule.h"
#include "runtime/exec/CommPlan.h"
#ifdef DLOPT_CUDA_KERNELS
#include "runtime/cuda/CudaKernels.h"
#include "runtime/format/FusedProgram.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <type_traits>
#include <unordered_map>

namespace dlopt::rt {

using namespace cuda;
using Ins = std::span<const TensorRef>;
using Outs = std::span<const TensorRef>;

namespace {

constexpr int64_t kArenaAlignment = 256;

bool envFlag(const char *name) {
  const char *v = std::getenv(name);
  return v && (std::strcmp(v, "1") == 0 || std::strcmp(v, "true") == 0);
}

bool inRange(int64_t offset, int64_t bytes, int64_t size) {
  return offset >= 0 && bytes >= 0 && offset <= size && bytes <= size - offset;
}

Status rangeError(const char *what, int64_t offset, int64_t bytes,
                  int64_t size) {
  return Status::error(std::string(what) + ": bytes [" +
                       std::to_string(offset) + ", " +
                       std::to_string(offset + bytes) +
                       ") are outside the arena of " + std::to_string(size) +
                       " bytes");
}

} // namespace

//===----------------------------------------------------------------------===//
// Per-rank state
//===----------------------------------------------------------------------===//

struct CudaBackend::Rank {
  CudaBackend *owner = nullptr;
  const CudaLibrary *lib = nullptr;
  int rank = 0, device = 0;
  Stream streams[kNumStreams];
  CublasLtHandle lt;
  DeviceBuffer gemmWorkspace;
  std::unique_ptr<GemmRunner> gemm;
  DeviceBuffer workspace;
  DeviceBuffer errorWord;
  // Communication: device staging (comm stream only) and pinned host
  // staging for host communicators, both grown on demand.
  DeviceBuffer commStaging;
  PinnedBuffer hostStaging;
  // Arena bounds, for the scheduler's byte ranges.
  const char *arenaBase = nullptr;
  int64_t arenaBytes = 0;
  // Stream bookkeeping since the last synchronize.
  StreamScheduler sched;
  std::vector<StreamKind> nodeStream;
  int32_t lastNode[kNumStreams] = {-1, -1};
  struct Recorded {
    int event = -1;
    int32_t covers = -1; ///< last node of the stream the event follows
  } recorded[kNumStreams];
  std::vector<Event> events;
  size_t eventsUsed = 0;
  // Instruction descriptions for device errors (index = tag).
  std::vector<std::string> tags;
  // Device timing (setDeviceTiming): a start and an end event per run(),
  // `timed` pairs used since the last takeDeviceTimes().
  bool timing = false;
  std::vector<std::pair<Event, Event>> timingEvents;
  size_t timed = 0;
  // Memory.
  int64_t trackedNow = 0, trackedPeak = 0;
  int64_t baselineFree = 0, memGetInfoPeak = 0;

  cudaStream_t stream(StreamKind k) const { return streams[int(k)].get(); }

  Status setDevice() const {
    DLOPT_CUDA_CHECK(lib->cudaSetDevice(device));
    return Status::ok();
  }

  void track(int64_t delta) {
    trackedNow += delta;
    trackedPeak = std::max(trackedPeak, trackedNow);
    if (delta >= 0)
      owner->noteAllocated(delta);
    else
      owner->noteFreed(-delta);
  }

  Status sampleMemGetInfo() {
    size_t freeBytes = 0, total = 0;
    DLOPT_CUDA_CHECK(lib->cudaMemGetInfo(&freeBytes, &total));
    memGetInfoPeak =
        std::max(memGetInfoPeak, baselineFree - int64_t(freeBytes));
    return Status::ok();
  }

  /// Kernel scratch of at least `bytes`, grown (after the streams drain,
  /// since queued kernels may still use the old one) when too small.
  Expected<float *> scratch(int64_t bytes) {
    if (bytes <= workspace.bytes() && workspace.get())
      return static_cast<float *>(workspace.get());
    for (const Stream &s : streams)
      DLOPT_CUDA_CHECK(lib->cudaStreamSynchronize(s.get()));
    int64_t want = std::max<int64_t>(
        {bytes, workspace.bytes() + workspace.bytes() / 2, int64_t(1) << 20});
    want = (want + (int64_t(1) << 20) - 1) / (int64_t(1) << 20) * (int64_t(1) << 20);
    track(-workspace.bytes());
    workspace.reset();
    auto buf = DeviceBuffer::allocate(*lib, want);
    if (!buf)
      return buf.status().withContext("kernel workspace: ");
    workspace = buf.take();
    track(workspace.bytes());
    return static_cast<float *>(workspace.get());
  }

  /// Orders a new node of `kind` after the cross-stream work it depends
  /// on, per the scheduler; returns the node's stream.
  Expected<cudaStream_t> schedule(StreamKind kind,
                                  std::vector<ByteRange> reads,
                                  std::vector<ByteRange> writes) {
    SchedNode node{kind, std::move(reads), std::move(writes)};
    std::vector<int32_t> waits = sched.add(node);
    int32_t self = int32_t(nodeStream.size());
    nodeStream.push_back(kind);
    for (int32_t j : waits) {
      int t = int(nodeStream[j]);
      if (recorded[t].covers < j) {
        // Record after everything queued on t so far (which includes j).
        if (eventsUsed == events.size()) {
          auto e = createEvent(*lib);
          if (!e)
            return e.status();
          events.push_back(e.take());
        }
        int idx = int(eventsUsed++);
        DLOPT_CUDA_CHECK(
            lib->cudaEventRecord(events[idx].get(), streams[t].get()));
        recorded[t] = {idx, lastNode[t]};
      }
      DLOPT_CUDA_CHECK(lib->cudaStreamWaitEvent(
          stream(kind), events[recorded[t].event].get(), 0));
    }
    lastNode[int(kind)] = self;
    return stream(kind);
  }

  ByteRange rangeOf(const TensorRef &t) const {
    const char *p = static_cast<const char *>(t.data);
    if (!p || p < arenaBase || p >= arenaBase + std::max<int64_t>(arenaBytes, 1))
      return {0, 0};
    int64_t b = p - arenaBase;
    return {b, b + t.type.byteSize()};
  }

  void resetSchedule() {
    sched.clear();
    nodeStream.clear();
    for (int s = 0; s < kNumStreams; ++s) {
      lastNode[s] = -1;
      recorded[s] = {};
    }
    eventsUsed = 0;
    tags.clear();
  }
};

class CudaBackend::Arena final : public DeviceArena {
public:
  Arena(Rank &r, DeviceBuffer buf, int64_t size)
      : rank_(r), buf_(std::move(buf)), size_(size) {}
  ~Arena() override {
    int64_t bytes = buf_.bytes();
    (void)rank_.setDevice();
    buf_.reset();
    rank_.track(-bytes);
    if (rank_.arenaBase == static_cast<const char *>(data())) {
      rank_.arenaBase = nullptr;
      rank_.arenaBytes = 0;
    }
  }
  void *data() const override { return buf_.get(); }
  int64_t size() const override { return size_; }
  int rank() const override { return rank_.rank; }

private:
  Rank &rank_;
  DeviceBuffer buf_;
  int64_t size_;
};

//===----------------------------------------------------------------------===//
// Creation and device selection
//===----------------------------------------------------------------------===//

CudaBackend::CudaBackend(const CudaBackendOptions &opts,
                         const CudaLibrary *lib, int numDevices)
    : opts_(opts), lib_(lib), numDevices_(numDevices) {}

CudaBackend::~CudaBackend() {
  // Arenas must be gone (Session destroys its arena first); drain the
  // devices so nothing queued outlives the handles below.
  for (auto &[r, st] : ranks_) {
    if (lib_->cudaSetDevice(st->device) == 0)
      for (const Stream &s : st->streams)
        (void)lib_->cudaStreamSynchronize(s.get());
  }
}

CudaBackendOptions CudaBackend::optionsFromEnv() {
  CudaBackendOptions o;
  o.tf32 = envFlag("DLOPT_CUDA_TF32");
  return o;
}

bool CudaBackend::kernelsBuilt() {
#ifdef DLOPT_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

std::string CudaBackend::buildDescription() {
#ifdef DLOPT_CUDA_KERNELS
  return std::string("kernels: ") + kernels::buildDescription();
#else
  return "built without CUDA kernels (nvcc was not found when this dlopt was "
         "configured): only matmul and reshape run on the cuda backend";
#endif
}

Expected<std::unique_ptr<CudaBackend>>
CudaBackend::create(const CudaBackendOptions &opts) {
  const CudaLibrary *lib = nullptr;
#ifdef DLOPT_CUDA_KERNELS
  const char *why = nullptr;
  lib = kernels::runtimeTable(&why);
  if (!lib)
    return Status::error(std::string("cuda backend: no CUDA device "
                                     "(cudaGetDeviceCount: CUDA not "
                                     "loadable: ") +
                         (why ? why : "?") + ")");
#else
  auto loaded = loadCudaCore();
  if (!loaded)
    return Status::error("cuda backend: no CUDA device (cudaGetDeviceCount: "
                         "CUDA not loadable: " +
                         loaded.status().message() + ")");
  lib = *loaded;
#endif
  int n = 0;
  cudaError_t e = lib->cudaGetDeviceCount(&n);
  if (e != 0)
    return Status::error("cuda backend: no CUDA device (cudaGetDeviceCount: " +
                         cudaErrorMessage(e) + ")");
  if (n == 0)
    return Status::error("cuda backend: no CUDA device (cudaGetDeviceCount: "
                         "0 devices visible; check CUDA_VISIBLE_DEVICES)");
  return std::unique_ptr<CudaBackend>(new CudaBackend(opts, lib, n));
}

CudaBackend::Rank *CudaBackend::findRank(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranks_.find(rank);
  return it == ranks_.end() ? nullptr : it->second.get();
}

Expected<CudaBackend::Rank *> CudaBackend::rankState(int rank) {
  if (Rank *r = findRank(rank))
    return r;
  // Which device: explicit, $DLOPT_CUDA_DEVICE, launcher local rank, rank.
  int device = opts_.device;
  std::string source = "--device";
  if (device < 0)
    if (const char *v = std::getenv("DLOPT_CUDA_DEVICE"); v && *v) {
      char *end = nullptr;
      long d = std::strtol(v, &end, 10);
      if (*end || d < 0)
        return Status::error("cuda backend: DLOPT_CUDA_DEVICE=\"" +
                             std::string(v) +
                             "\" is not a non-negative integer");
      device = int(d);
      source = "DLOPT_CUDA_DEVICE";
    }
  if (device < 0)
    if (auto li = launchInfoFromEnv(); li && li->localRank >= 0) {
      device = li->localRank;
      source = "the launcher's local rank";
    }
  if (device < 0) {
    device = rank % numDevices_;
    source = "rank " + std::to_string(rank);
  }
  if (device >= numDevices_)
    return Status::error("cuda backend: device " + std::to_string(device) +
                         " (from " + source + ") does not exist: " +
                         std::to_string(numDevices_) + " visible");

  auto st = std::make_unique<Rank>();
  Rank &r = *st;
  r.owner = this;
  r.lib = lib_;
  r.rank = rank;
  r.device = device;
  const CudaLibrary &L = *lib_;
  DLOPT_RETURN_IF_ERROR(r.setDevice());
  DLOPT_CUDA_CHECK(L.cudaFree(nullptr)); // creates the context now
  size_t freeBytes = 0, total = 0;
  DLOPT_CUDA_CHECK(L.cudaMemGetInfo(&freeBytes, &total));
  r.baselineFree = int64_t(freeBytes);
  for (Stream &s : r.streams) {
    auto made = createStream(L);
    if (!made)
      return made.status();
    s = made.take();
  }
  cublasLtHandle_t lt = nullptr;
  DLOPT_CUBLAS_CHECK(L.cublasLtCreate(&lt));
  r.lt = CublasLtHandle(&L, lt);
  auto ws = DeviceBuffer::allocate(L, int64_t(GemmRunner::kDefaultWorkspaceBytes));
  if (!ws)
    return ws.status().withContext("cuBLASLt workspace: ");
  r.gemmWorkspace = ws.take();
  r.track(r.gemmWorkspace.bytes());
  r.gemm = std::make_unique<GemmRunner>(L, lt, r.gemmWorkspace.get(),
                                        size_t(r.gemmWorkspace.bytes()),
                                        opts_.tf32);
#ifdef DLOPT_CUDA_KERNELS
  auto ew = DeviceBuffer::allocate(L, int64_t(sizeof(kernels::DeviceError)));
  if (!ew)
    return ew.status().withContext("device error word: ");
  r.errorWord = ew.take();
  r.track(r.errorWord.bytes());
  DLOPT_CUDA_CHECK(L.cudaMemsetAsync(r.errorWord.get(), 0,
                                     sizeof(kernels::DeviceError),
                                     r.stream(StreamKind::Compute)));
  DLOPT_CUDA_CHECK(L.cudaStreamSynchronize(r.stream(StreamKind::Compute)));
#endif
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_.emplace(rank, std::move(st)).first->second.get();
}

std::string CudaBackend::deviceDescription(int rank) const {
  Rank *r = findRank(rank);
  int device = r ? r->device : 0;
  int major = 0, minor = 0, sms = 0;
  (void)lib_->cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                     device);
  (void)lib_->cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                                     device);
  (void)lib_->cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                                     device);
  return "device " + std::to_string(device) + " (sm_" + std::to_string(major) +
         std::to_string(minor) + ", " + std::to_string(sms) + " SMs)";
}

CudaMemoryStats CudaBackend::memoryStats(int rank) const {
  CudaMemoryStats m;
  Rank *r = findRank(rank);
  if (!r)
    return m;
  m.device = r->device;
  m.arenaBytes = r->arenaBytes;
  m.workspaceBytes = r->workspace.bytes();
  m.gemmWorkspaceBytes = r->gemmWorkspace.bytes();
  m.trackedPeakBytes = r->trackedPeak;
  m.memGetInfoPeakBytes = r->memGetInfoPeak;
  return m;
}

//===----------------------------------------------------------------------===//
// Memory and copies
//===----------------------------------------------------------------------===//

Expected<std::unique_ptr<DeviceArena>>
CudaBackend::allocateArena(int rank, int64_t bytes) {
  if (bytes < 0)
    return Status::error("cannot allocate a negative arena size");
  auto st = rankState(rank);
  if (!st)
    return st.status();
  Rank &r = **st;
  DLOPT_RETURN_IF_ERROR(r.setDevice());
  int64_t rounded = std::max<int64_t>(
      kArenaAlignment,
      (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment);
  auto buf = DeviceBuffer::allocate(*lib_, rounded);
  if (!buf)
    return Status::error("cannot allocate the arena of rank " +
                         std::to_string(rank) + " on CUDA device " +
                         std::to_string(r.device) + ": " + formatBytes(bytes) +
                         " (" + buf.status().message() + ")");
  r.track(rounded);
  r.arenaBase = static_cast<const char *>(buf->get());
  r.arenaBytes = bytes;
  DLOPT_RETURN_IF_ERROR(r.sampleMemGetInfo());
  return std::unique_ptr<DeviceArena>(new Arena(r, buf.take(), bytes));
}

Status CudaBackend::copyToDevice(DeviceArena &arena, int64_t offset,
                                 const void *src, int64_t bytes) {
  if (!inRange(offset, bytes, arena.size()))
    return rangeError("copy to device", offset, bytes, arena.size());
  if (bytes == 0)
    return Status::ok();
  auto st = rankState(arena.rank());
  if (!st)
    return st.status();
  Rank &r = **st;
  DLOPT_RETURN_IF_ERROR(r.setDevice());
  auto s = r.schedule(StreamKind::Compute, {}, {{offset, offset + bytes}});
  if (!s)
    return s.status();
  // From pageable memory the call returns once `src` has been staged, so
  // the caller may reuse it.
  DLOPT_CUDA_CHECK(lib_->cudaMemcpyAsync(
      static_cast<char *>(arena.data()) + offset, src, size_t(bytes),
      cudaMemcpyHostToDevice, *s));
  return Status::ok();
}

Status CudaBackend::copyToHost(void *dst, const DeviceArena &arena,
                               int64_t offset, int64_t bytes) {
  if (!inRange(offset, bytes, arena.size()))
    return rangeError("copy to host", offset, bytes, arena.size());
  if (bytes == 0)
    return Status::ok();
  auto st = rankState(arena.rank());
  if (!st)
    return st.status();
  Rank &r = **st;
  DLOPT_RETURN_IF_ERROR(r.setDevice());
  for (const Stream &s : r.streams)
    DLOPT_CUDA_CHECK(lib_->cudaStreamSynchronize(s.get()));
  cudaStream_t cs = r.stream(StreamKind::Compute);
  DLOPT_CUDA_CHECK(lib_->cudaMemcpyAsync(
      dst, static_cast<const char *>(arena.data()) + offset, size_t(bytes),
      cudaMemcpyDeviceToHost, cs));
  DLOPT_CUDA_CHECK(lib_->cudaStreamSynchronize(cs));
  return Status::ok();
}

Status CudaBackend::copyOnDevice(DeviceArena &arena, int64_t dstOffset,
                                 int64_t srcOffset, int64_t bytes) {
  if (!inRange(dstOffset, bytes, arena.size()))
    return rangeError("copy on device (destination)", dstOffset, bytes,
                      arena.size());
  if (!inRange(srcOffset, bytes, arena.size()))
    return rangeError("copy on device (source)", srcOffset, bytes,
                      arena.size());
  if (bytes == 0 || dstOffset == srcOffset)
    return Status::ok();
  auto st = rankState(arena.rank());
  if (!st)
    return st.status();
  Rank &r = **st;
  DLOPT_RETURN_IF_ERROR(r.setDevice());
  auto s = r.schedule(StreamKind::Compute, {{srcOffset, srcOffset + bytes}},
                      {{dstOffset, dstOffset + bytes}});
  if (!s)
    return s.status();
  char *base = static_cast<char *>(arena.data());
  DLOPT_CUDA_CHECK(lib_->cudaMemcpyAsync(base + dstOffset, base + srcOffset,
                                         size_t(bytes),
                                         cudaMemcpyDeviceToDevice, *s));
  return Status::ok();
}

//===----------------------------------------------------------------------===//
// Op handlers
//===----------------------------------------------------------------------===//

namespace {

/// What a handler needs: the rank's state, its stream, and the instruction.
struct Launch {
  CudaBackend::Rank &r;
  cudaStream_t stream;
  const Instr &instr;
  const RunContext *ctx = nullptr; ///< the rank and its communicators
  const CudaLibrary &lib() const { return *r.lib; }
};

using Handler = Status (*)(Launch &, Ins, Outs);

/// Turns a launcher's cudaError_t into a Status naming the op.
#define DLOPT_LAUNCH(L, expr)                                                  \
  do {                                                                         \
    int dlopt_rc_ = (expr);                                                    \
    if (dlopt_rc_ != 0)                                                        \
      return opError((L).instr, cudaFailure(dlopt_rc_, #expr, __FILE__,        \
                                            __LINE__)                          \
                                    .message());                               \
  } while (0)

Status matmulHandler(Launch &L, Ins ins, Outs outs) {
  bool transA = false, transB = false;
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(L.instr, "transpose_a", transA));
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(L.instr, "transpose_b", transB));
  auto plan = planMatmul(ins[0].type, ins[1].type, outs[0].type, transA, transB);
  if (!plan)
    return opError(L.instr, plan.status().message());
  if (outs[0].numElements() == 0)
    return Status::ok();
  // Unaligned 16-bit GEMMs run through padded copies in the kernel scratch
  // (CudaGemm.h planPadding).
  auto scratch = [&](int64_t bytes) -> Expected<void *> {
    auto ws = L.r.scratch(bytes);
    if (!ws)
      return ws.status();
    return static_cast<void *>(*ws);
  };
  Status s = L.r.gemm->run(*plan, ins[0].data, ins[1].data, outs[0].data,
                           L.stream, scratch);
  return s ? s : opError(L.instr, s.message());
}

Status reshapeHandler(Launch &L, Ins ins, Outs outs) {
  int64_t bytes = ins[0].type.byteSize();
  if (bytes && outs[0].data != ins[0].data)
    DLOPT_CUDA_CHECK(L.lib().cudaMemcpyAsync(outs[0].data, ins[0].data,
                                             size_t(bytes),
                                             cudaMemcpyDeviceToDevice,
                                             L.stream));
  return Status::ok();
}

//===--- Communication ---------------------------------------------------------===//
//
// A communication instruction runs as its plan (runtime/exec/CommPlan.h):
// block copies on the device (cudaMemcpy2DAsync on the comm stream, into
// and out of a device staging buffer) around at most one collective over
// the rank's communicator of the instruction's group.
//
//  - A communicator that takes device memory (NCCL) gets the device
//    buffers and enqueues on this rank's comm stream (setDeviceStream), so
//    it follows the events the scheduler placed there; the NCCL
//    communicator then waits for it (blocking mode, with its timeout and
//    async-error polling), so this rank's host thread waits for the
//    collective while its queued compute keeps running.
//  - A host communicator (InProcessCommunicator: ranks as threads sharing
//    one GPU, and the tests) gets host copies: the collective's input is
//    copied to pinned host memory, the comm stream synchronized, the host
//    collective run, and its output copied back. Correct but slow (a host
//    round trip and a synchronization per instruction): meant for tests and
//    one-GPU worlds, not for performance.
//
// all_slice has no collective: one strided device copy.

constexpr int64_t kStagingAlign = 256;

int64_t alignUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

/// A staging buffer of the rank of at least `bytes`, grown in whole MiB
/// after the comm stream drains (queued copies may still use the old one).
/// Device staging counts toward the rank's tracked device memory.
template <typename Memory>
Expected<char *> staging(Launch &L, CudaAllocation<Memory> &buf, int64_t bytes,
                         const char *what) {
  CudaBackend::Rank &r = L.r;
  if (bytes <= buf.bytes() && buf.get())
    return static_cast<char *>(buf.get());
  DLOPT_CUDA_CHECK(r.lib->cudaStreamSynchronize(L.stream));
  constexpr bool onDevice = std::is_same_v<Memory, DeviceMemory>;
  int64_t want = alignUp(std::max<int64_t>(bytes, int64_t(1) << 20),
                         int64_t(1) << 20);
  if (onDevice)
    r.track(-buf.bytes());
  buf.reset();
  auto grown = CudaAllocation<Memory>::allocate(*r.lib, want);
  if (!grown)
    return grown.status().withContext(what);
  buf = grown.take();
  if (onDevice)
    r.track(buf.bytes());
  return static_cast<char *>(buf.get());
}

Expected<char *> commStaging(Launch &L, int64_t bytes) {
  return staging(L, L.r.commStaging, bytes, "communication staging: ");
}

Expected<char *> hostStaging(Launch &L, int64_t bytes) {
  return staging(L, L.r.hostStaging, bytes, "pinned communication staging: ");
}

/// Enqueues `copies` on the comm stream; `ptr` resolves a plan buffer.
template <typename Ptr>
Status copyBlocksOnDevice(Launch &L, const std::vector<BlockCopy> &copies,
                          Ptr &&ptr) {
  for (const BlockCopy &c : copies) {
    if (c.width == 0 || c.height == 0)
      continue;
    char *dst = ptr(c.dst) + c.dstOffset;
    const char *src = ptr(c.src) + c.srcOffset;
    if (dst == src && (c.height == 1 || c.dstPitch == c.srcPitch))
      continue; // the same bytes (broadcast in place)
    if (c.height == 1 || (c.dstPitch == c.width && c.srcPitch == c.width)) {
      DLOPT_CUDA_CHECK(L.lib().cudaMemcpyAsync(dst, src,
                                               size_t(c.width * c.height),
                                               cudaMemcpyDeviceToDevice,
                                               L.stream));
    } else {
      DLOPT_CUDA_CHECK(L.lib().cudaMemcpy2DAsync(
          dst, size_t(c.dstPitch), src, size_t(c.srcPitch), size_t(c.width),
          size_t(c.height), cudaMemcpyDeviceToDevice, L.stream));
    }
  }
  return Status::ok();
}

/// The plan's collective on `in`/`out` in `space`.
Status callCollective(Communicator &comm, const CommPlan &p, const void *in,
                      void *out, MemorySpace space) {
  CommInput ci{in, p.inCount, p.dtype, space};
  CommOutput co{out, p.outCount, p.dtype, space};
  switch (p.call) {
  case CollectiveKind::AllReduce: return comm.allReduce(ci, co, p.reduce);
  case CollectiveKind::AllGather: return comm.allGather(ci, co);
  case CollectiveKind::ReduceScatter:
    return comm.reduceScatter(ci, co, p.reduce);
  case CollectiveKind::AllToAll: return comm.allToAll(ci, co);
  case CollectiveKind::Broadcast: return comm.broadcast(co, p.root);
  case CollectiveKind::None: break;
  }
  return Status::ok();
}

/// "'op' at LOC: ", the prefix of a communication instruction's errors.
std::string commWhere(const Instr &instr) {
  return "'" + instr.op + "'" + (instr.loc.empty() ? "" : " at " + instr.loc) +
         ": ";
}

/// The communicator of the instruction's `group` on this rank.
Expected<Communicator *> groupCommunicator(const Launch &L,
                                           const std::string &where) {
  int64_t group = L.instr.getInt("group", -1);
  const RunContext *ctx = L.ctx;
  if (!ctx || group < 0 || size_t(group) >= ctx->groups.size() ||
      !ctx->groups[size_t(group)])
    return Status::error(where + "no communicator for group " +
                         std::to_string(group) + " on rank " +
                         std::to_string(ctx ? ctx->rank : 0));
  return ctx->groups[size_t(group)];
}

/// all_reduce, all_gather, reduce_scatter, all_slice, all_to_all, broadcast.
Status communicationHandler(Launch &L, Ins ins, Outs outs) {
  const Instr &instr = L.instr;
  std::string where = commWhere(instr);
  if (ins.size() != 1 || outs.size() != 1)
    return Status::error(where + "expects 1 operand and 1 result, got " +
                         std::to_string(ins.size()) + " and " +
                         std::to_string(outs.size()));
  Expected<Communicator *> found = groupCommunicator(L, where);
  if (!found)
    return found.status();
  Communicator &comm = **found;
  const TensorRef &x = ins[0], &y = outs[0];
  Expected<CommPlan> planned =
      planCommunication(instr, x.type, y.type, comm.size(), comm.rank());
  if (!planned)
    return planned.status();
  const CommPlan &p = *planned;
  const int64_t elem = dtypeSize(p.dtype);
  const int64_t inBytes = p.inCount * elem, outBytes = p.outCount * elem;

  // Device staging: [send | recv | a separate output for an all_to_all
  // whose input and output are one buffer (NCCL refuses in place)].
  auto devPtr = [&](CommBuffer b, char *staging) -> char * {
    switch (b) {
    case CommBuffer::X: return static_cast<char *>(x.data);
    case CommBuffer::Y: return static_cast<char *>(y.data);
    case CommBuffer::Send: return staging;
    case CommBuffer::Recv: return staging + alignUp(p.sendBytes, kStagingAlign);
    }
    return nullptr;
  };
  bool aliased = p.call == CollectiveKind::AllToAll && outBytes > 0 &&
                 p.in == CommBuffer::X && p.out == CommBuffer::Y &&
                 x.data == y.data;
  int64_t stagingBytes = alignUp(p.sendBytes, kStagingAlign) +
                         alignUp(p.recvBytes, kStagingAlign) +
                         (aliased ? outBytes : 0);
  char *staging = nullptr;
  if (stagingBytes > 0) {
    Expected<char *> s = commStaging(L, stagingBytes);
    if (!s)
      return s.status().withContext(where);
    staging = *s;
  }
  auto ptr = [&](CommBuffer b) { return devPtr(b, staging); };
  DLOPT_RETURN_IF_ERROR(
      copyBlocksOnDevice(L, p.before, ptr).withContext(where));
  if (p.call != CollectiveKind::None) {
    const char *in = ptr(p.in);
    char *out = ptr(p.out);
    char *target = aliased ? staging + alignUp(p.sendBytes, kStagingAlign) +
                                 alignUp(p.recvBytes, kStagingAlign)
                           : out;
    Status st;
    if (comm.acceptsDeviceMemory()) {
      st = comm.setDeviceStream(L.stream);
      if (st)
        st = callCollective(comm, p, in, target, MemorySpace::Device);
      Status back = comm.setDeviceStream(nullptr);
      if (st)
        st = back;
      DLOPT_RETURN_IF_ERROR(L.r.setDevice()); // NCCL selects its device
    } else {
      // Host communicator: stage through pinned memory (see above).
      int64_t hostIn = alignUp(inBytes, kStagingAlign);
      Expected<char *> h = hostStaging(L, hostIn + outBytes);
      if (!h)
        return h.status().withContext(where);
      char *hin = *h, *hout = *h + hostIn;
      bool inPlace = p.call == CollectiveKind::Broadcast;
      if (inPlace ? outBytes > 0 : inBytes > 0)
        DLOPT_CUDA_CHECK(L.lib().cudaMemcpyAsync(
            inPlace ? hout : hin, inPlace ? out : in,
            size_t(inPlace ? outBytes : inBytes), cudaMemcpyDeviceToHost,
            L.stream));
      DLOPT_CUDA_CHECK(L.lib().cudaStreamSynchronize(L.stream));
      st = callCollective(comm, p, hin, hout, MemorySpace::Host);
      if (st && outBytes > 0)
        DLOPT_CUDA_CHECK(L.lib().cudaMemcpyAsync(target, hout, size_t(outBytes),
                                                 cudaMemcpyHostToDevice,
                                                 L.stream));
    }
    if (!st)
      return st.withContext(where);
    if (aliased)
      DLOPT_CUDA_CHECK(L.lib().cudaMemcpyAsync(out, target, size_t(outBytes),
                                               cudaMemcpyDeviceToDevice,
                                               L.stream));
  }
  return copyBlocksOnDevice(L, p.after, ptr).withContext(where);
}

/// send_recv, send and recv (pipeline stages): staged through pinned host
/// memory over a host communicator. The inputs are copied out and the
/// stream drained first; the sends are posted before the receives (the
/// host communicators buffer sends, so a batch never waits on itself), then
/// the received blocks are copied in on the stream.
Status pointToPointHandler(Launch &L, Ins ins, Outs outs) {
  const Instr &instr = L.instr;
  std::string where = commWhere(instr);
  Expected<Communicator *> found = groupCommunicator(L, where);
  if (!found)
    return found.status();
  Communicator &comm = **found;
  if (comm.acceptsDeviceMemory())
    return Status::error(
        where + "point-to-point transfers over NCCL are not implemented yet; "
                "pipeline stages on the cuda backend run over the "
                "host-staged communicators (unset DLOPT_CUDA_NCCL)");
  std::vector<int64_t> sendPeers, recvPeers;
  if (instr.op == "send_recv") {
    Expected<std::vector<int64_t>> sp = instr.getInts("send_peers");
    Expected<std::vector<int64_t>> rp = instr.getInts("recv_peers");
    if (!sp)
      return sp.status().withContext(where);
    if (!rp)
      return rp.status().withContext(where);
    sendPeers = *sp;
    recvPeers = *rp;
  } else {
    (instr.op == "send" ? sendPeers : recvPeers)
        .push_back(instr.getInt("peer", -1));
  }
  if (sendPeers.size() != ins.size() || recvPeers.size() != outs.size())
    return Status::error(where + "expects one peer per operand and result, got " +
                         std::to_string(sendPeers.size()) + " send and " +
                         std::to_string(recvPeers.size()) + " receive peers for " +
                         std::to_string(ins.size()) + " operands and " +
                         std::to_string(outs.size()) + " results");
  auto bytesOf = [](const TensorRef &t) {
    return t.numElements() * dtypeSize(t.type.dtype);
  };
  std::vector<int64_t> offset;
  int64_t total = 0;
  for (const TensorRef &t : ins) {
    offset.push_back(total);
    total += alignUp(bytesOf(t), kStagingAlign);
  }
  for (const TensorRef &t : outs) {
    offset.push_back(total);
    total += alignUp(bytesOf(t), kStagingAlign);
  }
  if (total == 0)
    return Status::ok();
  Expected<char *> h = hostStaging(L, total);
  if (!h)
    return h.status().withContext(where);
  for (size_t i = 0; i < ins.size(); ++i)
    if (bytesOf(ins[i]) > 0)
      DLOPT_CUDA_CHECK(L.lib().cudaMemcpyAsync(*h + offset[i], ins[i].data,
                                               size_t(bytesOf(ins[i])),
                                               cudaMemcpyDeviceToHost, L.stream));
  DLOPT_CUDA_CHECK(L.lib().cudaStreamSynchronize(L.stream));
  for (size_t i = 0; i < ins.size(); ++i)
    DLOPT_RETURN_IF_ERROR(
        comm.send(CommInput{*h + offset[i], ins[i].numElements(),
                            ins[i].type.dtype, MemorySpace::Host},
                  int(sendPeers[i]))
            .withContext(where));
  for (size_t i = 0; i < outs.size(); ++i) {
    char *buf = *h + offset[ins.size() + i];
    DLOPT_RETURN_IF_ERROR(
        comm.recv(CommOutput{buf, outs[i].numElements(), outs[i].type.dtype,
                             MemorySpace::Host},
                  int(recvPeers[i]))
            .withContext(where));
    if (bytesOf(outs[i]) > 0)
      DLOPT_CUDA_CHECK(L.lib().cudaMemcpyAsync(outs[i].data, buf,
                                               size_t(bytesOf(outs[i])),
                                               cudaMemcpyHostToDevice, L.stream));
  }
  return Status::ok();
}

#ifdef DLOPT_CUDA_KERNELS
using kernels::StridedIndex;

/// Drops size-1 dims and merges neighbours every operand walks with one
/// stride, so the kernels do as little index arithmetic as possible.
Status collapse(const Instr &instr, std::vector<int64_t> size,
                std::vector<std::vector<int64_t>> strides, StridedIndex &ix) {
  size_t nops = strides.size();
  std::vector<int64_t> outSize;
  std::vector<std::vector<int64_t>> outStride(nops);
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] == 1)
      continue;
    bool merge = !outSize.empty();
    for (size_t k = 0; merge && k < nops; ++k)
      merge = outStride[k].back() == strides[k][d] * size[d];
    if (merge) {
      outSize.back() *= size[d];
      for (size_t k = 0; k < nops; ++k)
        outStride[k].back() = strides[k][d];
    } else {
      outSize.push_back(size[d]);
      for (size_t k = 0; k < nops; ++k)
        outStride[k].push_back(strides[k][d]);
    }
  }
  if (outSize.empty()) {
    outSize.push_back(1);
    for (size_t k = 0; k < nops; ++k)
      outStride[k].push_back(0);
  }
  if (outSize.size() > size_t(kernels::kMaxDims))
    return opError(instr, "needs " + std::to_string(outSize.size()) +
                              " dims after collapsing; the CUDA kernels "
                              "take at most " +
                              std::to_string(kernels::kMaxDims));
  ix = StridedIndex{};
  ix.rank = int(outSize.size());
  for (size_t d = 0; d < outSize.size(); ++d) {
    ix.size[d] = outSize[d];
    for (size_t k = 0; k < nops; ++k)
      ix.stride[k][d] = outStride[k][d];
  }
  for (size_t k = 0; k < nops; ++k) {
    bool contiguous = true;
    int64_t expect = 1;
    for (size_t d = outSize.size(); d-- > 0;) {
      if (outSize[d] != 1 && outStride[k][d] != expect)
        contiguous = false;
      expect *= outSize[d];
    }
    ix.contiguous[k] = contiguous;
  }
  return Status::ok();
}

/// The index of a broadcast over `outShape` (operands in `shapes`).
Status broadcastIndex(const Instr &instr, const std::vector<int64_t> &outShape,
                      const std::vector<std::vector<int64_t>> &shapes,
                      StridedIndex &ix) {
  cpu::BroadcastPlan p;
  std::string err = cpu::planBroadcast(outShape, shapes, p);
  if (!err.empty())
    return opError(instr, err);
  return collapse(instr, p.shape, p.strides, ix);
}

int tagOf(Launch &L) {
  L.r.tags.push_back("op '" + L.instr.op + "'" +
                     (L.instr.loc.empty() ? "" : " at " + L.instr.loc));
  return int(L.r.tags.size()) - 1;
}

kernels::DeviceError *errorWord(Launch &L) {
  return static_cast<kernels::DeviceError *>(L.r.errorWord.get());
}

//===--- Elementwise ---------------------------------------------------------===//

template <kernels::UnaryOp Op, bool IntOk>
Status unaryHandler(Launch &L, Ins ins, Outs outs) {
  DLOPT_LAUNCH(L, kernels::unary(L.stream, Op, ins[0].type.dtype, ins[0].data,
                                 outs[0].data, ins[0].numElements()));
  return Status::ok();
}

Status geluHandler(Launch &L, Ins ins, Outs outs) {
  std::string approx = "none";
  DLOPT_RETURN_IF_ERROR(getOptStringAttr(L.instr, "approximate", approx));
  if (approx == "tanh")
    return unaryHandler<kernels::UnaryOp::GeluTanh, false>(L, ins, outs);
  return unaryHandler<kernels::UnaryOp::GeluErf, false>(L, ins, outs);
}

Status castHandler(Launch &L, Ins ins, Outs outs) {
  DLOPT_LAUNCH(L, kernels::cast(L.stream, ins[0].type.dtype, outs[0].type.dtype,
                                ins[0].data, outs[0].data,
                                ins[0].numElements()));
  return Status::ok();
}

/// The strided index of a broadcasting binary op (verified shapes).
Status planBinary(const Instr &instr, Ins ins, Outs outs, StridedIndex &ix) {
  return broadcastIndex(instr, outs[0].type.shape,
                        {ins[0].type.shape, ins[1].type.shape}, ix);
}

template <kernels::BinaryOp Op>
Status binaryHandler(Launch &L, Ins ins, Outs outs) {
  StridedIndex ix;
  DLOPT_RETURN_IF_ERROR(planBinary(L.instr, ins, outs, ix));
  const TensorType &t = ins[0].type;
  int tag = Op == kernels::BinaryOp::Div && isInteger(t.dtype) ? tagOf(L) : -1;
  DLOPT_LAUNCH(L, kernels::binary(L.stream, Op, t.dtype, ix, ins[0].data,
                                  ins[1].data, outs[0].data,
                                  outs[0].numElements(), errorWord(L), tag));
  return Status::ok();
}

Status compareHandler(Launch &L, Ins ins, Outs outs) {
  StridedIndex ix;
  DLOPT_RETURN_IF_ERROR(planBinary(L.instr, ins, outs, ix));
  std::string pred;
  DLOPT_RETURN_IF_ERROR(getOptStringAttr(L.instr, "predicate", pred));
  static const std::pair<const char *, kernels::ComparePred> preds[] = {
      {"eq", kernels::ComparePred::Eq}, {"ne", kernels::ComparePred::Ne},
      {"lt", kernels::ComparePred::Lt}, {"le", kernels::ComparePred::Le},
      {"gt", kernels::ComparePred::Gt}, {"ge", kernels::ComparePred::Ge}};
  for (const auto &[name, p] : preds)
    if (pred == name) {
      DLOPT_LAUNCH(L, kernels::compare(L.stream, p, ins[0].type.dtype, ix,
                                       ins[0].data, ins[1].data, outs[0].data,
                                       outs[0].numElements()));
      return Status::ok();
    }
  return opError(L.instr, "expects attribute 'predicate' to be one of eq, ne, "
                          "lt, le, gt, ge, got '" + pred + "'");
}

Status selectHandler(Launch &L, Ins ins, Outs outs) {
  StridedIndex ix;
  DLOPT_RETURN_IF_ERROR(broadcastIndex(
      L.instr, outs[0].type.shape,
      {ins[0].type.shape, ins[1].type.shape, ins[2].type.shape}, ix));
  DLOPT_LAUNCH(L, kernels::select(L.stream, int(dtypeSize(ins[1].type.dtype)),
                                  ix, ins[0].data, ins[1].data, ins[2].data,
                                  outs[0].data, outs[0].numElements()));
  return Status::ok();
}

Status geluGradHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &t = ins[0].type;
  std::string approx = "none";
  DLOPT_RETURN_IF_ERROR(getOptStringAttr(L.instr, "approximate", approx));
  StridedIndex ix;
  DLOPT_RETURN_IF_ERROR(broadcastIndex(L.instr, t.shape, {t.shape, t.shape}, ix));
  DLOPT_LAUNCH(L, kernels::binary(L.stream,
                                  approx == "tanh"
                                      ? kernels::BinaryOp::GeluTanhGrad
                                      : kernels::BinaryOp::GeluErfGrad,
                                  t.dtype, ix, ins[0].data, ins[1].data,
                                  outs[0].data, t.numElements(), nullptr, -1));
  return Status::ok();
}

Status dropoutHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &t = ins[0].type;
  double rate = 0;
  int64_t seed = 0;
  DLOPT_RETURN_IF_ERROR(getFloatAttr(L.instr, "rate", rate));
  DLOPT_RETURN_IF_ERROR(getOptIntAttr(L.instr, "seed", seed));
  const void *offset = nullptr;
  DType offsetType = DType::I64;
  if (ins.size() == 2) {
    offset = ins[1].data;
    offsetType = ins[1].type.dtype;
  }
  float scale = float(1.0 / (1.0 - rate));
  DLOPT_LAUNCH(L, kernels::dropout(L.stream, t.dtype, ins[0].data,
                                   outs[0].data, t.numElements(),
                                   uint64_t(seed), offset, offsetType, rate,
                                   scale));
  return Status::ok();
}

//===--- Data movement -------------------------------------------------------===//

Status transposeHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &in = ins[0].type;
  std::vector<int64_t> perm;
  DLOPT_RETURN_IF_ERROR(getIntsAttr(L.instr, "perm", perm));
  size_t rank = in.shape.size();
  std::vector<int64_t> expected(rank), srcStride(rank);
  std::vector<int64_t> inStrides = contiguousStrides(in.shape);
  for (size_t i = 0; i < rank; ++i) {
    expected[i] = in.shape[perm[i]];
    srcStride[i] = inStrides[perm[i]];
  }
  if (outs[0].numElements() == 0)
    return Status::ok();
  StridedIndex ix;
  DLOPT_RETURN_IF_ERROR(collapse(
      L.instr, expected, {contiguousStrides(expected), srcStride}, ix));
  DLOPT_LAUNCH(L, kernels::stridedCopy(L.stream, int(dtypeSize(in.dtype)), ix,
                                       ins[0].data, outs[0].data,
                                       outs[0].numElements()));
  return Status::ok();
}

Status broadcastToHandler(Launch &L, Ins ins, Outs outs) {
  cpu::BroadcastPlan p;
  cpu::planBroadcast(outs[0].type.shape, {ins[0].type.shape}, p);
  if (outs[0].numElements() == 0)
    return Status::ok();
  StridedIndex ix;
  DLOPT_RETURN_IF_ERROR(collapse(
      L.instr, p.shape, {contiguousStrides(p.shape), p.strides[0]}, ix));
  DLOPT_LAUNCH(L, kernels::stridedCopy(L.stream,
                                       int(dtypeSize(ins[0].type.dtype)), ix,
                                       ins[0].data, outs[0].data,
                                       outs[0].numElements()));
  return Status::ok();
}

Status concatHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &t0 = ins[0].type;
  size_t rank = t0.shape.size();
  int64_t dim = 0;
  DLOPT_RETURN_IF_ERROR(getDimAttr(L.instr, rank, dim));
  std::vector<int64_t> expected = t0.shape;
  expected[dim] = 0;
  for (const TensorRef &in : ins)
    expected[dim] += in.type.shape[dim];
  int64_t es = dtypeSize(t0.dtype);
  std::vector<int64_t> outStrides = contiguousStrides(expected);
  int64_t at = 0;
  for (const TensorRef &in : ins) {
    int64_t n = in.numElements();
    if (n) {
      StridedIndex ix;
      DLOPT_RETURN_IF_ERROR(collapse(L.instr, in.type.shape,
                                     {outStrides,
                                      contiguousStrides(in.type.shape)},
                                     ix));
      DLOPT_LAUNCH(L, kernels::stridedCopy(
                          L.stream, int(es), ix, in.data,
                          static_cast<char *>(outs[0].data) +
                              at * outStrides[dim] * es,
                          n));
    }
    at += in.type.shape[dim];
  }
  return Status::ok();
}

/// The strided view of a slice inside `full`: element offset and strides.
void sliceView(const std::vector<int64_t> &full,
               const std::vector<int64_t> &start,
               const std::vector<int64_t> &stride, int64_t &base,
               std::vector<int64_t> &strides) {
  std::vector<int64_t> fs = contiguousStrides(full);
  base = 0;
  strides.assign(full.size(), 0);
  for (size_t i = 0; i < full.size(); ++i) {
    base += start[i] * fs[i];
    strides[i] = fs[i] * stride[i];
  }
}

Status sliceHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &in = ins[0].type;
  SliceGeom g;
  DLOPT_RETURN_IF_ERROR(sliceGeometry(L.instr, in.shape, g));
  const std::vector<int64_t> &start = g.start, &stride = g.stride,
                             &sliced = g.sliced;
  if (outs[0].numElements() == 0)
    return Status::ok();
  int64_t base = 0, es = dtypeSize(in.dtype);
  std::vector<int64_t> srcStride;
  sliceView(in.shape, start, stride, base, srcStride);
  StridedIndex ix;
  DLOPT_RETURN_IF_ERROR(collapse(
      L.instr, sliced, {contiguousStrides(sliced), srcStride}, ix));
  DLOPT_LAUNCH(L, kernels::stridedCopy(
                      L.stream, int(es), ix,
                      static_cast<const char *>(ins[0].data) + base * es,
                      outs[0].data, outs[0].numElements()));
  return Status::ok();
}

Status sliceGradHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &tr = outs[0].type;
  SliceGeom g;
  DLOPT_RETURN_IF_ERROR(sliceGeometry(L.instr, tr.shape, g));
  const std::vector<int64_t> &start = g.start, &stride = g.stride,
                             &sliced = g.sliced;
  int64_t es = dtypeSize(tr.dtype);
  if (tr.byteSize())
    DLOPT_CUDA_CHECK(L.lib().cudaMemsetAsync(outs[0].data, 0,
                                             size_t(tr.byteSize()), L.stream));
  if (ins[0].numElements() == 0)
    return Status::ok();
  int64_t base = 0;
  std::vector<int64_t> dstStride;
  sliceView(tr.shape, start, stride, base, dstStride);
  StridedIndex ix;
  DLOPT_RETURN_IF_ERROR(collapse(
      L.instr, sliced, {dstStride, contiguousStrides(sliced)}, ix));
  DLOPT_LAUNCH(L, kernels::stridedCopy(L.stream, int(es), ix, ins[0].data,
                                       static_cast<char *>(outs[0].data) +
                                           base * es,
                                       ins[0].numElements()));
  return Status::ok();
}

Status gatherHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &table = ins[0].type, &ids = ins[1].type;
  int64_t rowBytes = product(table.shape, 1, table.shape.size()) *
                     dtypeSize(table.dtype);
  int64_t n = ins[1].numElements();
  if (n == 0 || rowBytes == 0)
    return Status::ok();
  DLOPT_LAUNCH(L, kernels::gather(L.stream, ins[0].data, ins[1].data,
                                  ids.dtype, n, table.shape[0], rowBytes,
                                  outs[0].data, errorWord(L), tagOf(L)));
  return Status::ok();
}

Status iotaHandler(Launch &L, Ins, Outs outs) {
  const TensorType &t = outs[0].type;
  DimSplit split;
  DLOPT_RETURN_IF_ERROR(getDimSplit(L.instr, t.shape, split));
  DLOPT_LAUNCH(L, kernels::iota(L.stream, t.dtype, outs[0].data,
                                t.numElements(), split.n, split.inner));
  return Status::ok();
}

Status scatterAddHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &ti = ins[0].type, &tr = outs[0].type;
  int64_t v = tr.shape[0], rest = product(tr.shape, 1, tr.shape.size());
  auto ws = L.r.scratch(kernels::scatterAddWorkspaceBytes(tr.dtype, v, rest));
  if (!ws)
    return ws.status();
  DLOPT_LAUNCH(L, kernels::scatterAdd(L.stream, tr.dtype, ins[0].data,
                                      ti.dtype, ins[1].data, outs[0].data,
                                      ins[0].numElements(), v, rest, *ws,
                                      errorWord(L), tagOf(L)));
  return Status::ok();
}

//===--- Reductions ---------------------------------------------------------===//

template <kernels::ReduceKind K>
Status reduceHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &in = ins[0].type;
  std::vector<int64_t> dims;
  DLOPT_RETURN_IF_ERROR(getIntsAttr(L.instr, "dims", dims));
  size_t rank = in.shape.size();
  std::vector<bool> isRed(rank, false);
  for (int64_t d : dims)
    isRed[size_t(d)] = true;
  if (outs[0].numElements() == 0)
    return Status::ok();
  // Runs of kept / reduced dims, as the CPU kernel collapses them.
  kernels::ReducePlan p;
  std::vector<int64_t> strides = contiguousStrides(in.shape);
  int lastKind = -1;
  for (size_t i = 0; i < rank; ++i) {
    if (in.shape[i] == 1)
      continue;
    int kind = isRed[i] ? 1 : 0;
    int &r = kind ? p.redRank : p.keptRank;
    int64_t *size = kind ? p.redSize : p.keptSize;
    int64_t *stride = kind ? p.redStride : p.keptStride;
    if (kind == lastKind) {
      size[r - 1] *= in.shape[i];
      stride[r - 1] = strides[i];
    } else {
      if (r == kernels::kMaxDims)
        return opError(L.instr, "too many alternating kept/reduced dims for "
                                "the CUDA reduction kernel");
      size[r] = in.shape[i];
      stride[r] = strides[i];
      ++r;
    }
    lastKind = kind;
  }
  for (int i = 0; i < p.keptRank; ++i)
    p.numOut *= p.keptSize[i];
  for (int i = 0; i < p.redRank; ++i)
    p.numRed *= p.redSize[i];
  void *ws = nullptr;
  if (int64_t bytes = kernels::reduceWorkspaceBytes(p)) {
    auto scratch = L.r.scratch(bytes);
    if (!scratch)
      return scratch.status();
    ws = *scratch;
  }
  DLOPT_LAUNCH(L, kernels::reduce(L.stream, K, in.dtype, p, ins[0].data,
                                  outs[0].data, ws));
  return Status::ok();
}

//===--- Softmax, norms, losses ----------------------------------------------===//

template <bool Log> Status softmaxHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &t = ins[0].type;
  DimSplit split;
  DLOPT_RETURN_IF_ERROR(getDimSplit(L.instr, t.shape, split));
  if (t.numElements() == 0)
    return Status::ok();
  DLOPT_LAUNCH(L, kernels::softmax(L.stream, Log, t.dtype, ins[0].data,
                                   outs[0].data, split.outer, split.n,
                                   split.inner));
  return Status::ok();
}

template <bool Log> Status softmaxGradHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &t = ins[0].type;
  DimSplit split;
  DLOPT_RETURN_IF_ERROR(getDimSplit(L.instr, t.shape, split));
  if (t.numElements() == 0)
    return Status::ok();
  DLOPT_LAUNCH(L, kernels::softmaxGrad(L.stream, Log, t.dtype, ins[0].data,
                                       ins[1].data, outs[0].data, split.outer,
                                       split.n, split.inner));
  return Status::ok();
}

template <bool Rms> Status normHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &t = ins[0].type;
  NormGeom g;
  DLOPT_RETURN_IF_ERROR(normGeometry(L.instr, t, Rms, false, ins.size(), g));
  const bool hasWeight = g.hasWeight, hasBias = g.hasBias;
  const double eps = g.eps;
  const int64_t n = g.n, rows = g.rows;
  if (rows == 0)
    return Status::ok();
  const void *w = hasWeight ? ins[1].data : nullptr;
  const void *b = hasBias ? ins[hasWeight ? 2 : 1].data : nullptr;
  DLOPT_LAUNCH(L, kernels::norm(L.stream, Rms, t.dtype, ins[0].data, w, b,
                                outs[0].data, rows, n, eps));
  return Status::ok();
}

template <bool Rms> Status normGradHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &t = ins[0].type;
  NormGeom g;
  DLOPT_RETURN_IF_ERROR(normGeometry(L.instr, t, Rms, true, ins.size(), g));
  const bool hasWeight = g.hasWeight;
  const double eps = g.eps;
  const int64_t n = g.n, rows = g.rows;
  auto ws = L.r.scratch(kernels::normGradWorkspaceBytes(rows, n));
  if (!ws)
    return ws.status();
  DLOPT_LAUNCH(L, kernels::normGrad(L.stream, Rms, t.dtype, ins[0].data,
                                    ins[1].data,
                                    hasWeight ? ins[2].data : nullptr,
                                    outs[0].data, outs[1].data,
                                    Rms ? nullptr : outs[2].data, rows, n, eps,
                                    *ws));
  return Status::ok();
}

Status crossEntropyIgnore(const Instr &instr, Ins, int64_t &ignore) {
  ignore = -100;
  return getOptIntAttr(instr, "ignore_index", ignore);
}

Status crossEntropyHandler(Launch &L, Ins ins, Outs outs) {
  int64_t ignore;
  DLOPT_RETURN_IF_ERROR(crossEntropyIgnore(L.instr, ins, ignore));
  const TensorType &tl = ins[0].type;
  int64_t n = tl.shape[0], c = tl.shape[1];
  auto ws = L.r.scratch(kernels::lossWorkspaceBytes(n));
  if (!ws)
    return ws.status();
  DLOPT_LAUNCH(L, kernels::crossEntropy(L.stream, tl.dtype, ins[0].data,
                                        ins[1].data, ins[1].type.dtype,
                                        outs[0].data, outs[0].type.dtype, n,
                                        c, ignore, *ws, errorWord(L),
                                        tagOf(L)));
  return Status::ok();
}

Status crossEntropyGradHandler(Launch &L, Ins ins, Outs outs) {
  int64_t ignore;
  DLOPT_RETURN_IF_ERROR(crossEntropyIgnore(L.instr, ins, ignore));
  const TensorType &tl = ins[0].type;
  int64_t n = tl.shape[0], c = tl.shape[1];
  auto ws = L.r.scratch(kernels::lossWorkspaceBytes(n));
  if (!ws)
    return ws.status();
  DLOPT_LAUNCH(L, kernels::crossEntropyGrad(
                      L.stream, tl.dtype, ins[0].data, ins[1].data,
                      ins[1].type.dtype, ins[2].data, ins[2].type.dtype,
                      outs[0].data, n, c, ignore, *ws, errorWord(L),
                      tagOf(L)));
  return Status::ok();
}

Status mseHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &ta = ins[0].type;
  auto ws = L.r.scratch(kernels::lossWorkspaceBytes(ta.numElements()));
  if (!ws)
    return ws.status();
  DLOPT_LAUNCH(L, kernels::mse(L.stream, ta.dtype, ins[0].data, ins[1].data,
                               outs[0].data, ta.numElements(), *ws));
  return Status::ok();
}

//===--- conv2d, pooling, batch_norm ------------------------------------------===//

/// The kernels' form of the shared conv2d geometry (runtime/format/OpTable.h).
kernels::ConvDims convDimsOf(const TensorType &tx, const TensorType &tw,
                             const ConvGeom &g) {
  kernels::ConvDims d{};
  d.n = tx.shape[0];
  d.c = tx.shape[1];
  d.h = g.h;
  d.w = g.w;
  d.o = tw.shape[0];
  d.cg = g.cg;
  d.kh = g.kh;
  d.kw = g.kw;
  d.groups = g.groups;
  d.strideH = g.stride[0];
  d.strideW = g.stride[1];
  d.padH = g.padding[0];
  d.padW = g.padding[1];
  d.dilH = g.dilation[0];
  d.dilW = g.dilation[1];
  d.oh = g.oh;
  d.ow = g.ow;
  return d;
}

Status conv2dHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &tx = ins[0].type, &tw = ins[1].type;
  const bool hasBias = ins.size() == 3; // verified against has_bias
  ConvGeom g;
  DLOPT_RETURN_IF_ERROR(
      convGeometry(L.instr, tx, tw, hasBias ? &ins[2].type : nullptr, g));
  const kernels::ConvDims d = convDimsOf(tx, tw, g);
  if (outs[0].numElements() == 0)
    return Status::ok();
  DLOPT_LAUNCH(L, kernels::conv2d(L.stream, tx.dtype, d, ins[0].data,
                                  ins[1].data,
                                  hasBias ? ins[2].data : nullptr,
                                  outs[0].data));
  return Status::ok();
}

/// conv2d's geometry for its gradients, in the kernels' form.
Status convGradDims(const Instr &instr, const TensorType &tx,
                    const TensorType &tw, const TensorType &tdy,
                    kernels::ConvDims &d) {
  ConvGeom g;
  DLOPT_RETURN_IF_ERROR(convGradGeometry(instr, tx, tw, tdy, g));
  d = convDimsOf(tx, tw, g);
  return Status::ok();
}

/// conv2d_grad_input %dy, %w -> dx (the forward input type).
Status conv2dGradInputHandler(Launch &L, Ins ins, Outs outs) {
  kernels::ConvDims d;
  DLOPT_RETURN_IF_ERROR(
      convGradDims(L.instr, outs[0].type, ins[1].type, ins[0].type, d));
  if (outs[0].numElements() == 0)
    return Status::ok();
  DLOPT_LAUNCH(L, kernels::conv2dGradInput(L.stream, outs[0].type.dtype, d,
                                           ins[0].data, ins[1].data,
                                           outs[0].data));
  return Status::ok();
}

/// conv2d_grad_filter %x, %dy -> dw (the filter type).
Status conv2dGradFilterHandler(Launch &L, Ins ins, Outs outs) {
  kernels::ConvDims d;
  DLOPT_RETURN_IF_ERROR(
      convGradDims(L.instr, ins[0].type, outs[0].type, ins[1].type, d));
  if (outs[0].numElements() == 0)
    return Status::ok();
  DLOPT_LAUNCH(L, kernels::conv2dGradFilter(L.stream, ins[0].type.dtype, d,
                                            ins[0].data, ins[1].data,
                                            outs[0].data));
  return Status::ok();
}

/// The kernels' form of the shared pooling geometry.
kernels::PoolDims poolDimsOf(const TensorType &tx, const PoolGeom &g) {
  size_t rank = tx.shape.size();
  kernels::PoolDims d{};
  d.countIncludePad = g.includePad;
  d.planes = product(tx.shape, 0, rank - 2);
  d.h = tx.shape[rank - 2];
  d.w = tx.shape[rank - 1];
  d.kh = g.kernel[0];
  d.kw = g.kernel[1];
  d.strideH = g.stride[0];
  d.strideW = g.stride[1];
  d.padH = g.padding[0];
  d.padW = g.padding[1];
  d.oh = g.pooled[rank - 2];
  d.ow = g.pooled[rank - 1];
  return d;
}

template <bool Max> Status poolHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &tx = ins[0].type;
  PoolGeom g;
  DLOPT_RETURN_IF_ERROR(poolGeometry(L.instr, Max, tx, g));
  const kernels::PoolDims d = poolDimsOf(tx, g);
  if (outs[0].numElements() == 0)
    return Status::ok();
  DLOPT_LAUNCH(L, kernels::pool2d(L.stream, Max, tx.dtype, d, ins[0].data,
                                  outs[0].data));
  return Status::ok();
}

/// max_pool2d_grad %x, %dy and avg_pool2d_grad %dy.
template <bool Max> Status poolGradHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &tx = Max ? ins[0].type : outs[0].type;
  PoolGeom g;
  DLOPT_RETURN_IF_ERROR(poolGeometry(L.instr, Max, tx, g));
  const kernels::PoolDims d = poolDimsOf(tx, g);
  if (outs[0].numElements() == 0)
    return Status::ok();
  DLOPT_LAUNCH(L, kernels::pool2dGrad(L.stream, Max, tx.dtype, d,
                                      Max ? ins[0].data : nullptr,
                                      ins[Max ? 1 : 0].data, outs[0].data));
  return Status::ok();
}

/// N, C and the elements per (image, channel) of batch_norm(_grad)'s x.
void batchNormDims(Ins ins, int64_t &n, int64_t &c, int64_t &inner) {
  const TensorType &tx = ins[0].type;
  n = tx.shape[0];
  c = tx.shape[1];
  inner = product(tx.shape, 2, tx.shape.size());
}

Status batchNormHandler(Launch &L, Ins ins, Outs outs) {
  int64_t n, c, inner;
  batchNormDims(ins, n, c, inner);
  double eps = 1e-5, momentum = 0.1;
  bool training = false;
  DLOPT_RETURN_IF_ERROR(getOptFloatAttr(L.instr, "eps", eps));
  DLOPT_RETURN_IF_ERROR(getOptFloatAttr(L.instr, "momentum", momentum));
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(L.instr, "training", training));
  DLOPT_LAUNCH(L, kernels::batchNorm(L.stream, ins[0].type.dtype, ins[0].data,
                                     ins[1].data, ins[2].data, ins[3].data,
                                     ins[4].data, outs[0].data, outs[1].data,
                                     outs[2].data, n, c, inner, eps, momentum,
                                     training));
  return Status::ok();
}

Status batchNormGradHandler(Launch &L, Ins ins, Outs outs) {
  int64_t n, c, inner;
  batchNormDims(ins, n, c, inner);
  double eps = 1e-5;
  bool training = false;
  DLOPT_RETURN_IF_ERROR(getOptFloatAttr(L.instr, "eps", eps));
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(L.instr, "training", training));
  DLOPT_LAUNCH(L, kernels::batchNormGrad(L.stream, ins[0].type.dtype,
                                         ins[0].data, ins[1].data, ins[2].data,
                                         ins[3].data, ins[4].data, outs[0].data,
                                         outs[1].data, outs[2].data, n, c,
                                         inner, eps, training));
  return Status::ok();
}

//===--- Attention and rope ---------------------------------------------------===//

/// The kernels' form of the shared attention dims; the optional trailing
/// offset operand (context parallelism, docs/parallel.md) stays in device
/// memory and the kernels read it: the causal mask becomes "query i sees
/// keys j <= i + offset" (T - S without it), as in runtime/cpu/NN.cpp.
Status cudaAttentionDims(const Instr &instr, Ins ins, size_t offsetIndex,
                         kernels::AttentionDims &a) {
  AttentionDims g;
  DLOPT_RETURN_IF_ERROR(
      attentionDims(instr, ins[0].type, ins[1].type, ins[2].type, g));
  a.b = g.b;
  a.h = g.h;
  a.s = g.s;
  a.d = g.d;
  a.g = g.g;
  a.t = g.t;
  a.e = g.e;
  a.causal = g.causal;
  a.scale = float(g.scale);
  a.offset = nullptr;
  a.offset64 = false;
  if (ins.size() > offsetIndex) {
    a.offset = ins[offsetIndex].data;
    a.offset64 = ins[offsetIndex].type.dtype == DType::I64;
  }
  // What the kernels can do (not a property of the instruction).
  if (a.d > kernels::kMaxHeadDim || a.e > kernels::kMaxHeadDim)
    return opError(instr, "head dims D = " + std::to_string(a.d) + ", E = " +
                              std::to_string(a.e) +
                              " exceed the CUDA attention kernels' limit of " +
                              std::to_string(kernels::kMaxHeadDim));
  return Status::ok();
}

Status attentionHandler(Launch &L, Ins ins, Outs outs) {
  kernels::AttentionDims a;
  DLOPT_RETURN_IF_ERROR(cudaAttentionDims(L.instr, ins, 3, a));
  if (outs[0].numElements() == 0)
    return Status::ok();
  DLOPT_LAUNCH(L, kernels::attention(L.stream, ins[0].type.dtype, a,
                                     ins[0].data, ins[1].data, ins[2].data,
                                     outs[0].data));
  return Status::ok();
}

Status attentionGradHandler(Launch &L, Ins ins, Outs outs) {
  kernels::AttentionDims a;
  DLOPT_RETURN_IF_ERROR(cudaAttentionDims(L.instr, ins, 4, a));
  DType dt = ins[0].type.dtype;
  auto ws = L.r.scratch(kernels::attentionGradWorkspaceBytes(a));
  if (!ws)
    return ws.status();
  DLOPT_LAUNCH(L, kernels::attentionGrad(L.stream, dt, a, ins[0].data,
                                         ins[1].data, ins[2].data, ins[3].data,
                                         outs[0].data, outs[1].data,
                                         outs[2].data, *ws));
  return Status::ok();
}

/// rope; positions start at the optional offset operand (device memory).
Status ropeHandler(Launch &L, Ins ins, Outs outs) {
  const TensorType &tx = ins[0].type;
  size_t rank = tx.shape.size();
  double theta = 10000.0;
  bool inverse = false;
  DLOPT_RETURN_IF_ERROR(getOptFloatAttr(L.instr, "theta", theta));
  DLOPT_RETURN_IF_ERROR(getOptBoolAttr(L.instr, "inverse", inverse));
  const void *offset = ins.size() > 1 ? ins[1].data : nullptr;
  DType offsetType = ins.size() > 1 ? ins[1].type.dtype : DType::I32;
  int64_t s = tx.shape[rank - 2], d = tx.shape[rank - 1];
  if (tx.numElements() == 0)
    return Status::ok();
  DLOPT_LAUNCH(L, kernels::rope(L.stream, tx.dtype, ins[0].data, outs[0].data,
                                tx.numElements() / d, s, d, theta, inverse,
                                offset, offsetType));
  return Status::ok();
}

//===--- Fused elementwise ---------------------------------------------------===//

static_assert(kernels::kFusedMaxInputs == fused::kMaxInputs &&
                  kernels::kFusedMaxOutputs == fused::kMaxOutputs &&
                  kernels::kFusedMaxConsts == fused::kMaxConsts &&
                  kernels::kFusedMaxSteps == fused::kMaxSteps,
              "CudaKernels.h and FusedProgram.h disagree on the limits");

/// The launch parameters of a checked program: fused opcodes become the
/// unary/binary ops of the unfused kernels, so the two paths share their
/// per-element functions.
Status fusedArgs(const Instr &instr, const fused::Program &p, Ins ins,
                 Outs outs, kernels::FusedArgs &a) {
  using O = fused::OpCode;
  using U = kernels::UnaryOp;
  using B = kernels::BinaryOp;
  // decode() checked the limits; the bounds below also tell the compiler.
  if (p.numInputs > kernels::kFusedMaxInputs ||
      outs.size() > size_t(kernels::kFusedMaxOutputs) ||
      p.consts.size() > size_t(kernels::kFusedMaxConsts) ||
      p.steps.size() > size_t(kernels::kFusedMaxSteps) ||
      p.outputs.size() != outs.size() || ins.size() != size_t(p.numInputs))
    return opError(instr, "fused program exceeds the CUDA kernel's limits");
  a.numInputs = p.numInputs;
  for (int k = 0; k < p.numInputs && k < kernels::kFusedMaxInputs; ++k) {
    a.in[k] = ins[k].data;
    a.inType[k] = uint8_t(ins[k].type.dtype);
    a.inScalar[k] = ins[k].type.shape.empty() ? 1 : 0;
  }
  a.numConsts = int32_t(p.consts.size());
  for (size_t c = 0; c < p.consts.size() && c < size_t(kernels::kFusedMaxConsts); ++c)
    a.consts[c] = float(p.consts[c]);
  a.numSteps = int32_t(p.steps.size());
  for (size_t s = 0; s < p.steps.size() && s < size_t(kernels::kFusedMaxSteps); ++s) {
    const fused::Step &st = p.steps[s];
    kernels::FusedStep &k = a.steps[s];
    k.a = uint8_t(st.a);
    k.b = fused::isBinary(st.op) || fused::isTernary(st.op) ? uint8_t(st.b)
                                                            : 0;
    k.c = fused::isTernary(st.op) ? uint8_t(st.c) : 0;
    int u = -1, b = -1;
    switch (st.op) {
    case O::Neg: u = int(U::Neg); break;
    case O::Abs: u = int(U::Abs); break;
    case O::Relu: u = int(U::Relu); break;
    case O::Exp: u = int(U::Exp); break;
    case O::Log: u = int(U::Log); break;
    case O::Sqrt: u = int(U::Sqrt); break;
    case O::Rsqrt: u = int(U::Rsqrt); break;
    case O::Tanh: u = int(U::Tanh); break;
    case O::Sin: u = int(U::Sin); break;
    case O::Cos: u = int(U::Cos); break;
    case O::Sigmoid: u = int(U::Sigmoid); break;
    case O::Silu: u = int(U::Silu); break;
    case O::Gelu: u = int(U::GeluErf); break;
    case O::GeluTanh: u = int(U::GeluTanh); break;
    case O::Cast: break;
    case O::Add: b = int(B::Add); break;
    case O::Sub: b = int(B::Sub); break;
    case O::Mul: b = int(B::Mul); break;
    case O::Div: b = int(B::Div); break;
    case O::Max: b = int(B::Max); break;
    case O::Min: b = int(B::Min); break;
    case O::Pow: b = int(B::Pow); break;
    case O::CmpEq: case O::CmpNe: case O::CmpLt: case O::CmpLe:
    case O::CmpGt: case O::CmpGe: case O::Select: break;
    }
    if (fused::isCompare(st.op)) {
      k.kind = 3;
      k.op = uint8_t(int(st.op) - int(O::CmpEq)); // the ComparePred order
    } else if (st.op == O::Select) {
      k.kind = 4;
      k.op = 0;
    } else if (u >= 0) {
      k.kind = 0;
      k.op = uint8_t(u);
    } else if (b >= 0) {
      k.kind = 1;
      k.op = uint8_t(b);
    } else if (st.op == O::Cast) {
      k.kind = 2;
      k.op = uint8_t(st.b);
    } else {
      return opError(instr, "step " + std::to_string(s) +
                                " has an opcode the CUDA kernel lacks");
    }
  }
  a.numOutputs = int32_t(outs.size());
  for (size_t o = 0; o < outs.size() && o < size_t(kernels::kFusedMaxOutputs); ++o) {
    a.out[o] = outs[o].data;
    a.outType[o] = uint8_t(outs[o].type.dtype);
    a.outReg[o] = uint8_t(p.outputs[o]);
  }
  return Status::ok();
}

/// The multi-tensor form: segments batched into as few launches as the
/// parameter-space segment table allows (one for every optimizer update of a
/// small model); see kernels::FusedMultiArgs.
Status fusedMultiHandler(Launch &L, const fused::Program &p, Ins ins,
                         Outs outs) {
  const size_t numIn = size_t(p.numInputs), numOut = p.outputs.size();
  const size_t segs = size_t(p.numSegments);
  // The program part, converted once (from segment 0's operands).
  kernels::FusedArgs one;
  DLOPT_RETURN_IF_ERROR(fusedArgs(L.instr, p, ins.subspan(0, numIn),
                                  outs.subspan(0, numOut), one));
  kernels::FusedMultiArgs m;
  std::copy(std::begin(one.consts), std::end(one.consts), m.consts);
  std::copy(std::begin(one.steps), std::end(one.steps), m.steps);
  std::copy(std::begin(one.inType), std::end(one.inType), m.inType);
  std::copy(std::begin(one.inScalar), std::end(one.inScalar), m.inScalar);
  std::copy(std::begin(one.outType), std::end(one.outType), m.outType);
  std::copy(std::begin(one.outReg), std::end(one.outReg), m.outReg);
  m.numInputs = one.numInputs;
  m.numConsts = one.numConsts;
  m.numSteps = one.numSteps;
  m.numOutputs = one.numOutputs;
  // Inputs that are one buffer in every segment go once into `shared`.
  int32_t width = 0;
  for (size_t k = 0; k < numIn; ++k) {
    bool same = true;
    for (size_t s = 1; s < segs && same; ++s)
      same = ins[s * numIn + k].data == ins[k].data;
    if (same) {
      m.inSlot[k] = -1;
      m.shared[k] = ins[k].data;
    } else {
      m.inSlot[k] = int8_t(width++);
    }
  }
  m.rowWidth = width + int32_t(numOut);
  const size_t perLaunch =
      std::min<size_t>(kernels::kFusedMaxLaunchSegments,
                       kernels::kFusedMaxLaunchPointers / size_t(m.rowWidth));
  auto aligned = [](const void *ptr, DType t) {
    uintptr_t need = t == DType::F32 ? 16 : 8;
    return reinterpret_cast<uintptr_t>(ptr) % need == 0;
  };
  constexpr int64_t kMaxBlocks = 0x7FFFFFFF;
  auto flush = [&]() -> Status {
    std::string why;
    int rc = kernels::fusedElementwiseMulti(L.stream, m, &why);
    if (rc == kernels::kFusedJitFailed)
      return opError(L.instr, "DLOPT_CUDA_FUSED=jit: " + why);
    DLOPT_LAUNCH(L, rc);
    m.numSegments = 0;
    m.blockStart[0] = 0;
    return Status::ok();
  };
  m.numSegments = 0;
  m.blockStart[0] = 0;
  for (size_t s = 0; s < segs; ++s) {
    int64_t n = outs[s * numOut].numElements();
    int64_t blocks = (n + kernels::kFusedChunk - 1) / kernels::kFusedChunk;
    if (blocks > kMaxBlocks)
      return opError(L.instr, "segment " + std::to_string(s) + " has " +
                                  std::to_string(n) +
                                  " elements, too many for one launch");
    if (size_t(m.numSegments) == perLaunch ||
        int64_t(m.blockStart[m.numSegments]) + blocks > kMaxBlocks)
      DLOPT_RETURN_IF_ERROR(flush());
    const int32_t j = m.numSegments;
    void **row = m.ptr + int64_t(j) * m.rowWidth;
    bool vec = true;
    for (size_t k = 0; k < numIn; ++k) {
      const TensorRef &t = ins[s * numIn + k];
      if (!t.type.shape.empty() && !aligned(t.data, t.type.dtype))
        vec = false;
      if (m.inSlot[k] >= 0)
        row[m.inSlot[k]] = t.data;
    }
    for (size_t o = 0; o < numOut; ++o) {
      const TensorRef &t = outs[s * numOut + o];
      if (!aligned(t.data, t.type.dtype))
        vec = false;
      row[width + int32_t(o)] = t.data;
    }
    m.n[j] = n;
    m.vec[j] = vec ? 1 : 0;
    m.blockStart[j + 1] = m.blockStart[j] + int32_t(blocks);
    m.numSegments = j + 1;
  }
  if (m.numSegments > 0)
    DLOPT_RETURN_IF_ERROR(flush());
  return Status::ok();
}

Status fusedHandler(Launch &L, Ins ins, Outs outs) {
  std::vector<TensorType> ot, rt;
  for (const TensorRef &t : ins)
    ot.push_back(t.type);
  for (const TensorRef &t : outs)
    rt.push_back(t.type);
  auto program = fused::decode(L.instr, ot, rt);
  if (!program)
    return opError(L.instr, program.status().message());
  if (program->numSegments > 1)
    return fusedMultiHandler(L, *program, ins, outs);
  kernels::FusedArgs a;
  DLOPT_RETURN_IF_ERROR(fusedArgs(L.instr, *program, ins, outs, a));
  std::string why;
  int rc = kernels::fusedElementwise(L.stream, a, outs[0].numElements(), &why);
  if (rc == kernels::kFusedJitFailed)
    return opError(L.instr, "DLOPT_CUDA_FUSED=jit: " + why);
  DLOPT_LAUNCH(L, rc);
  return Status::ok();
}

#endif // DLOPT_CUDA_KERNELS

const std::unordered_map<std::string, Handler> &handlers() {
  static const std::unordered_map<std::string, Handler> table = [] {
    std::unordered_map<std::string, Handler> h;
    h["matmul"] = matmulHandler;
    h["reshape"] = reshapeHandler;
    for (const char *op : {"all_reduce", "all_gather", "reduce_scatter",
                           "all_slice", "all_to_all", "broadcast"})
      h[op] = communicationHandler;
    for (const char *op : {"send_recv", "send", "recv"})
      h[op] = pointToPointHandler;
#ifdef DLOPT_CUDA_KERNELS
    using U = kernels::UnaryOp;
    using B = kernels::BinaryOp;
    using R = kernels::ReduceKind;
    h["neg"] = unaryHandler<U::Neg, true>;
    h["abs"] = unaryHandler<U::Abs, true>;
    h["relu"] = unaryHandler<U::Relu, true>;
    h["exp"] = unaryHandler<U::Exp, false>;
    h["log"] = unaryHandler<U::Log, false>;
    h["sqrt"] = unaryHandler<U::Sqrt, false>;
    h["rsqrt"] = unaryHandler<U::Rsqrt, false>;
    h["tanh"] = unaryHandler<U::Tanh, false>;
    h["sin"] = unaryHandler<U::Sin, false>;
    h["cos"] = unaryHandler<U::Cos, false>;
    h["sigmoid"] = unaryHandler<U::Sigmoid, false>;
    h["silu"] = unaryHandler<U::Silu, false>;
    h["gelu"] = geluHandler;
    h["cast"] = castHandler;
    h[fused::kOpName] = fusedHandler;
    h["add"] = binaryHandler<B::Add>;
    h["sub"] = binaryHandler<B::Sub>;
    h["mul"] = binaryHandler<B::Mul>;
    h["div"] = binaryHandler<B::Div>;
    h["maximum"] = binaryHandler<B::Max>;
    h["minimum"] = binaryHandler<B::Min>;
    h["pow"] = binaryHandler<B::Pow>;
    h["compare"] = compareHandler;
    h["select"] = selectHandler;
    h["gelu_grad"] = geluGradHandler;
    h["dropout"] = dropoutHandler;
    h["transpose"] = transposeHandler;
    h["broadcast_to"] = broadcastToHandler;
    h["concat"] = concatHandler;
    h["slice"] = sliceHandler;
    h["slice_grad"] = sliceGradHandler;
    h["gather"] = gatherHandler;
    h["iota"] = iotaHandler;
    h["scatter_add"] = scatterAddHandler;
    h["sum"] = reduceHandler<R::Sum>;
    h["mean"] = reduceHandler<R::Mean>;
    h["max"] = reduceHandler<R::Max>;
    h["softmax"] = softmaxHandler<false>;
    h["log_softmax"] = softmaxHandler<true>;
    h["softmax_grad"] = softmaxGradHandler<false>;
    h["log_softmax_grad"] = softmaxGradHandler<true>;
    h["layer_norm"] = normHandler<false>;
    h["rms_norm"] = normHandler<true>;
    h["layer_norm_grad"] = normGradHandler<false>;
    h["rms_norm_grad"] = normGradHandler<true>;
    h["cross_entropy"] = crossEntropyHandler;
    h["cross_entropy_grad"] = crossEntropyGradHandler;
    h["mse"] = mseHandler;
    h["attention"] = attentionHandler;
    h["attention_grad"] = attentionGradHandler;
    h["rope"] = ropeHandler;
    h["conv2d"] = conv2dHandler;
    h["conv2d_grad_input"] = conv2dGradInputHandler;
    h["conv2d_grad_filter"] = conv2dGradFilterHandler;
    h["max_pool2d"] = poolHandler<true>;
    h["avg_pool2d"] = poolHandler<false>;
    h["max_pool2d_grad"] = poolGradHandler<true>;
    h["avg_pool2d_grad"] = poolGradHandler<false>;
    h["batch_norm"] = batchNormHandler;
    h["batch_norm_grad"] = batchNormGradHandler;
#endif
    return h;
  }();
  return table;
}

} // namespace

std::string CudaBackend::fusedKernelReport() {
#ifdef DLOPT_CUDA_KERNELS
  kernels::FusedJitStats st = kernels::fusedJitStats();
  const kernels::FusedMode mode = kernels::fusedMode();
  if (mode == kernels::FusedMode::Interpreter)
    return "fused kernels: interpreter (DLOPT_CUDA_FUSED=interp)";
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "fused kernels: %d compiled by NVRTC in %.2f s%s", st.compiled,
                st.seconds,
                st.failed ? (", " + std::to_string(st.failed) +
                             " failed (interpreter used for those)")
                                .c_str()
                          : "");
  return buf;
#else
  return "fused kernels: none (" + buildDescription() + ")";
#endif
}

bool CudaBackend::supportsOp(const std::string &op) const {
  return handlers().count(op) != 0;
}

std::vector<std::string> CudaBackend::supportedOps() {
  std::vector<std::string> ops;
  for (const auto &[name, fn] : handlers())
    ops.push_back(name);
  std::sort(ops.begin(), ops.end());
  return ops;
}

//===----------------------------------------------------------------------===//
// Running and synchronizing
//===----------------------------------------------------------------------===//

Status CudaBackend::run(const Instr &instr, std::span<const TensorRef> ins,
                        std::span<const TensorRef> outs,
                        const RunContext &ctx) {
  auto it = handlers().find(instr.op);
  if (it == handlers().end())
    return Status::error("no CUDA kernel for op '" + instr.op + "'" +
                         (instr.loc.empty() ? "" : " at " + instr.loc) +
                         (kernelsBuilt() ? "" : " (" + buildDescription() + ")"));
  auto st = rankState(ctx.rank);
  if (!st)
    return st.status();
  Rank &r = **st;
  DLOPT_RETURN_IF_ERROR(r.setDevice());
  std::vector<ByteRange> reads, writes;
  for (const TensorRef &t : ins)
    reads.push_back(r.rangeOf(t));
  for (const TensorRef &t : outs)
    writes.push_back(r.rangeOf(t));
  StreamKind kind = isCommunicationOp(instr.op) ? StreamKind::Comm
                                                 : StreamKind::Compute;
  auto stream = r.schedule(kind, std::move(reads), std::move(writes));
  if (!stream)
    return stream.status();
  Launch L{r, *stream, instr, &ctx};
  if (!r.timing)
    return it->second(L, ins, outs);
  if (r.timed == r.timingEvents.size()) {
    auto a = createEvent(*lib_, /*timing=*/true);
    if (!a)
      return a.status();
    auto b = createEvent(*lib_, /*timing=*/true);
    if (!b)
      return b.status();
    r.timingEvents.emplace_back(a.take(), b.take());
  }
  auto &[begin, end] = r.timingEvents[r.timed++];
  DLOPT_CUDA_CHECK(lib_->cudaEventRecord(begin.get(), *stream));
  DLOPT_RETURN_IF_ERROR(it->second(L, ins, outs));
  DLOPT_CUDA_CHECK(lib_->cudaEventRecord(end.get(), *stream));
  return Status::ok();
}

bool CudaBackend::setDeviceTiming(int rank, bool on) {
  auto st = rankState(rank);
  if (!st)
    return false;
  (*st)->timing = on;
  (*st)->timed = 0;
  return true;
}

Expected<std::vector<double>> CudaBackend::takeDeviceTimes(int rank) {
  std::vector<double> out;
  Rank *r = findRank(rank);
  if (!r)
    return out;
  DLOPT_RETURN_IF_ERROR(r->setDevice());
  out.reserve(r->timed);
  for (size_t i = 0; i < r->timed; ++i) {
    auto &[begin, end] = r->timingEvents[i];
    DLOPT_CUDA_CHECK(lib_->cudaEventSynchronize(end.get()));
    float ms = 0;
    DLOPT_CUDA_CHECK(lib_->cudaEventElapsedTime(&ms, begin.get(), end.get()));
    out.push_back(double(ms) * 1e-3);
  }
  r->timed = 0;
  return out;
}

Status CudaBackend::synchronize(int rank) {
  Rank *r = findRank(rank);
  if (!r)
    return Status::ok(); // nothing was ever queued for this rank
  DLOPT_RETURN_IF_ERROR(r->setDevice());
  for (const Stream &s : r->streams)
    DLOPT_CUDA_CHECK(lib_->cudaStreamSynchronize(s.get()));
  Status result = Status::ok();
#ifdef DLOPT_CUDA_KERNELS
  kernels::DeviceError err;
  DLOPT_CUDA_CHECK(lib_->cudaMemcpy(&err, r->errorWord.get(), sizeof err,
                                    cudaMemcpyDeviceToHost));
  if (err.code != 0) {
    std::string what = err.tag >= 0 && size_t(err.tag) < r->tags.size()
                           ? r->tags[err.tag]
                           : "an op";
    std::string msg;
    switch (err.code) {
    case kernels::kErrIdOutOfRange:
      msg = "id " + std::to_string(err.a) + " at position " +
            std::to_string(err.b) + " is outside [0, " +
            std::to_string(err.c) + ")";
      break;
    case kernels::kErrLabelOutOfRange:
      msg = "label " + std::to_string(err.a) + " of row " +
            std::to_string(err.b) + " is outside [0, " + std::to_string(err.c) +
            ") and not ignore_index";
      break;
    case kernels::kErrIntDivByZero:
      msg = "integer division by zero (element " + std::to_string(err.b) +
            " of operand #1)";
      break;
    default:
      msg = "device error code " + std::to_string(err.code);
    }
    result = Status::error(what + ": " + msg + " (found on the device at "
                                             "synchronize)");
    cudaStream_t cs = r->stream(StreamKind::Compute);
    DLOPT_CUDA_CHECK(
        lib_->cudaMemsetAsync(r->errorWord.get(), 0, sizeof err, cs));
    DLOPT_CUDA_CHECK(lib_->cudaStreamSynchronize(cs));
  }
#endif
  DLOPT_RETURN_IF_ERROR(r->sampleMemGetInfo());
  r->resetSchedule();
  return result;
}


//===----------------------------------------------------------------------===//
// Worlds of cuda ranks
//===----------------------------------------------------------------------===//

namespace {

/// The backend's CUDA runtime table (the kernels' static runtime when they
/// are built) with NCCL's entries from loadCuda(), so NCCL communicators
/// use the same runtime for their streams and device selection.
Expected<const CudaLibrary *> ncclLibrary() {
  static std::once_flag once;
  static CudaLibrary table;
  static std::string error;
  static bool ok = false;
  std::call_once(once, [] {
    auto full = loadCuda();
    if (!full) {
      error = full.status().message();
      return;
    }
#ifdef DLOPT_CUDA_KERNELS
    const char *why = nullptr;
    const CudaLibrary *base = kernels::runtimeTable(&why);
    if (!base) {
      error = why ? why : "the CUDA runtime table is not available";
      return;
    }
    table = *base;
#define DLOPT_COPY_NCCL(name, ret, params) table.name = (*full)->name;
    DLOPT_NCCL_SYMBOLS(DLOPT_COPY_NCCL, DLOPT_COPY_NCCL)
#undef DLOPT_COPY_NCCL
    table.ncclPath = (*full)->ncclPath;
#else
    table = **full;
#endif
    ok = true;
  });
  if (!ok)
    return Status::error("NCCL: " + error);
  return &table;
}

} // namespace

Status configureCudaWorld(WorldOptions &o, int worldSize,
                          const CudaWorldOptions &co) {
  if (worldSize < 1)
    return Status::error("cuda world: no ranks");
  std::string why;
  int visible = deviceCount(&why);
  if (visible <= 0)
    return Status::error("cuda backend: no CUDA device (" + why + ")");
  std::vector<int> devices = co.devices;
  if (devices.empty())
    for (int r = 0; r < worldSize; ++r)
      devices.push_back(r % visible);
  if (int(devices.size()) != worldSize)
    return Status::error("cuda world: " + std::to_string(devices.size()) +
                         " devices for " + std::to_string(worldSize) +
                         " ranks");
  for (int d : devices)
    if (d < 0 || d >= visible)
      return Status::error("cuda world: device " + std::to_string(d) +
                           " does not exist (" + std::to_string(visible) +
                           " visible)");
  if (co.nccl &&
      std::set<int>(devices.begin(), devices.end()).size() != devices.size())
    return Status::error(
        "cuda world: NCCL needs a distinct device per rank (" +
        std::to_string(worldSize) + " ranks, " + std::to_string(visible) +
        " devices visible); without NCCL, ranks may share devices");
  CudaBackendOptions base = co.backend;
  o.backend = [devices, base](int r) -> Expected<std::unique_ptr<Backend>> {
    CudaBackendOptions b = base;
    b.device = devices[size_t(r)];
    auto made = CudaBackend::create(b);
    if (!made)
      return made.status();
    return std::unique_ptr<Backend>(made.take());
  };
  if (co.nccl)
    o.worldGroup = [devices](int n)
        -> Expected<std::vector<std::unique_ptr<Communicator>>> {
      if (n != int(devices.size()))
        return Status::error("cuda world: " + std::to_string(n) +
                             " ranks, configured for " +
                             std::to_string(devices.size()));
      auto lib = ncclLibrary();
      if (!lib)
        return lib.status();
      return createNcclGroup(**lib, devices);
    };
  else
    o.worldGroup = nullptr;
  return Status::ok();
}

Status configureCudaProcessWorld(WorldOptions &o, int worldSize,
                                 int nodeLocalIndex,
                                 const CudaWorldOptions &co) {
  if (!o.processGroup)
    return Status::error("cuda process world: no communicator between the "
                         "processes");
  const int first = o.firstRank, local = o.numRanks ? o.numRanks : worldSize;
  std::string why;
  int visible = deviceCount(&why);
  if (visible <= 0)
    return Status::error("cuda backend: no CUDA device (" + why + ")");
  std::vector<int> devices; // of this process's ranks
  for (int i = 0; i < local; ++i)
    devices.push_back((nodeLocalIndex * local + i) % visible);
  if (std::set<int>(devices.begin(), devices.end()).size() != devices.size())
    return Status::error("cuda process world: " + std::to_string(local) +
                         " ranks in this process but " +
                         std::to_string(visible) +
                         " devices visible; NCCL needs a device per rank");
  auto lib = ncclLibrary();
  if (!lib)
    return lib.status();
  const CudaLibrary *nccl = *lib;
  // The first process's unique id, to every process.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  Status made = Status::ok();
  if (o.processGroup->rank() == 0) {
    ncclResult_t rc = nccl->ncclGetUniqueId(&id);
    if (rc != 0)
      made = Status::error("ncclGetUniqueId failed (" + std::to_string(int(rc)) +
                           ")");
  }
  int32_t ok = made ? 1 : 0;
  DLOPT_RETURN_IF_ERROR(
      o.processGroup->broadcast(hostOut(&ok, 1, DType::I32), 0));
  if (!ok)
    return made ? Status::error("process 0 could not create the NCCL unique "
                                "id")
                : made;
  DLOPT_RETURN_IF_ERROR(o.processGroup->broadcast(
      hostOut(&id, int64_t(sizeof(id)), DType::I1), 0));
  CudaBackendOptions base = co.backend;
  o.backend = [devices, base, first](int r) -> Expected<std::unique_ptr<Backend>> {
    CudaBackendOptions b = base;
    b.device = devices[size_t(r - first)];
    auto created = CudaBackend::create(b);
    if (!created)
      return created.status();
    return std::unique_ptr<Backend>(created.take());
  };
  o.worldGroup = [nccl, devices, first, id](int n)
      -> Expected<std::vector<std::unique_ptr<Communicator>>> {
    // ncclCommInitRank blocks until every rank joined: this process's
    // ranks join from threads of their own.
    std::vector<Expected<std::unique_ptr<Communicator>>> got;
    for (size_t i = 0; i < devices.size(); ++i)
      got.emplace_back(Status::error("not created"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < devices.size(); ++i)
      threads.emplace_back([&, i] {
        got[i] = createNcclCommunicator(*nccl, first + int(i), n, id,
                                        devices[i]);
      });
    for (std::thread &t : threads)
      t.join();
    std::vector<std::unique_ptr<Communicator>> out;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!got[i])
        return got[i].status().withContext("rank " +
                                           std::to_string(first + int(i)) +
                                           ": ");
      out.push_back(got[i].take());
    }
    return out;
  };
  return Status::ok();
}

} // namespace dlopt::rt
