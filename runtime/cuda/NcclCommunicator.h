//===- NcclCommunicator.h - Communicator over NCCL and device buffers -----===//
//
// runtime/comm/Communicator.h on NCCL, through the dlopen()ed symbol table
// (CudaLibrary.h), so it builds without NCCL and its host-side logic is
// unit-tested with a fake table and a fake clock (test/unit/cuda).
//
//  - NcclComm owns an ncclComm_t: ncclCommDestroy when it is dropped
//    normally, ncclCommAbort once it has failed or been aborted (a failed
//    communicator may have peers that never arrive; destroy would hang).
//  - NcclGroupGuard brackets ncclGroupStart/End; end() reports End's status,
//    the destructor ends a group left open on an error path.
//  - Every call enqueues on the communicator's stream (its own, the one
//    given at creation, or one set by setDeviceStream(): the cuda backend
//    passes its comm stream so collectives follow the events it placed
//    there). In blocking mode (the
//    default, as Communicator's contract expects) it then waits for the
//    stream, polling ncclCommGetAsyncError: an asynchronous NCCL error or
//    the timeout aborts the communicator and returns an error naming the
//    operation and the rank, instead of hanging. In non-blocking mode the
//    caller orders work through stream() and calls synchronize(), which
//    runs the same wait.
//  - Creation: in-graph with ncclCommInitAll (one process, one communicator
//    per device), between-graph with ncclCommInitRank from a unique id passed
//    as hex (DLOPT_NCCL_ID, or a file rank 0 writes: DLOPT_NCCL_ID_FILE),
//    sub-groups with ncclCommSplit (NCCL >= 2.18).
//
// NCCL cannot check that ranks call collectives with matching arguments (no
// host rendezvous): local arguments are validated, cross-rank mismatches end
// in the timeout.
//
// Status: host logic tested with fakes; nothing here has run with a real
// NCCL on a GPU.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/comm/Communicator.h"
#include "runtime/cuda/CudaHandles.h"
#include "runtime/cuda/CudaLibrary.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dlopt::rt::cuda {

/// Time source of the waits; tests substitute a fake one.
class Clock {
public:
  virtual ~Clock() = default;
  virtual std::chrono::steady_clock::time_point now() = 0;
  virtual void sleepFor(std::chrono::microseconds d) = 0;
};
/// std::chrono::steady_clock and std::this_thread::sleep_for.
Clock &systemClock();

/// An owned ncclComm_t (see the file comment for destroy versus abort).
class NcclComm {
public:
  NcclComm() = default;
  NcclComm(const CudaLibrary &lib, ncclComm_t c) : lib_(&lib), c_(c) {}
  NcclComm(NcclComm &&o) noexcept;
  NcclComm &operator=(NcclComm &&o) noexcept;
  NcclComm(const NcclComm &) = delete;
  NcclComm &operator=(const NcclComm &) = delete;
  ~NcclComm() { reset(); }

  ncclComm_t get() const { return c_; }
  explicit operator bool() const { return c_ != nullptr; }
  /// Marks the communicator failed: it is aborted, not destroyed, later.
  void markFailed() { failed_ = true; }
  bool failed() const { return failed_; }
  /// ncclCommAbort now (idempotent); the handle is gone afterwards.
  void abort() noexcept;
  /// Destroys (or aborts, when failed) and forgets the handle.
  void reset() noexcept;

private:
  const CudaLibrary *lib_ = nullptr;
  ncclComm_t c_ = nullptr;
  bool failed_ = false;
};

/// ncclGroupStart()/ncclGroupEnd() as a scope.
class NcclGroupGuard {
public:
  static Expected<NcclGroupGuard> begin(const CudaLibrary &lib);
  NcclGroupGuard(NcclGroupGuard &&o) noexcept
      : lib_(o.lib_), open_(std::exchange(o.open_, false)) {}
  NcclGroupGuard(const NcclGroupGuard &) = delete;
  NcclGroupGuard &operator=(const NcclGroupGuard &) = delete;
  NcclGroupGuard &operator=(NcclGroupGuard &&) = delete;
  ~NcclGroupGuard();
  /// ncclGroupEnd(); its error, if any. Call once.
  Status end();

private:
  explicit NcclGroupGuard(const CudaLibrary &lib) : lib_(&lib), open_(true) {}
  const CudaLibrary *lib_;
  bool open_;
};

struct NcclOptions {
  std::chrono::milliseconds timeout = kDefaultCommTimeout;
  /// Pause between polls of the stream and ncclCommGetAsyncError.
  std::chrono::microseconds pollInterval{50};
  /// Each call waits for its stream (the Communicator contract).
  bool blocking = true;
  Clock *clock = nullptr; ///< null = systemClock()
};

class NcclCommunicator final : public Communicator {
public:
  /// Takes `comm` (of `device`); calls run on `stream`, or on a stream of
  /// its own when `stream` is null. Reads rank and size from NCCL.
  static Expected<std::unique_ptr<NcclCommunicator>>
  create(const CudaLibrary &lib, NcclComm comm, int device,
         cudaStream_t stream = nullptr, NcclOptions opts = {});
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  ncclComm_t handle() const { return comm_.get(); }
  bool aborted() const { return aborted_.load(); }

  Status allReduce(CommInput in, CommOutput out, ReduceOp op) override;
  Status allGather(CommInput in, CommOutput out) override;
  Status reduceScatter(CommInput in, CommOutput out, ReduceOp op) override;
  Status allToAll(CommInput in, CommOutput out) override;
  Status broadcast(CommOutput buf, int root) override;
  Status barrier() override;
  Status send(CommInput in, int peer) override;
  Status recv(CommOutput out, int peer) override;
  Expected<std::unique_ptr<Communicator>> split(int color, int key) override;
  void abort(const std::string &reason) override;
  void setTimeout(std::chrono::milliseconds t) override { opts_.timeout = t; }
  std::chrono::milliseconds timeout() const override { return opts_.timeout; }
  bool acceptsDeviceMemory() const override { return true; }
  /// Later calls enqueue on `stream` (the cuda backend's comm stream of this
  /// rank); null returns to the stream given at creation (or our own).
  /// Blocking calls then wait for that stream, everything queued on it
  /// before them included.
  Status setDeviceStream(void *stream) override;

  /// Waits for everything enqueued so far (non-blocking mode), with the
  /// async-error polling and timeout of blocking calls.
  Status synchronize();
  void setBlocking(bool b) { opts_.blocking = b; }

private:
  NcclCommunicator(const CudaLibrary &lib, NcclComm comm, int device,
                   NcclOptions opts);
  /// Common entry checks: not aborted, device selected.
  Status enter(const char *what);
  /// After enqueueing: wait when blocking.
  Status finish(const char *what);
  Status wait(const char *what);
  /// Aborts after a failure and returns `st` with the abort noted.
  Status fail(const char *what, const Status &st);
  Status checkBuffer(const char *what, CommInput b) const;

  const CudaLibrary &lib_;
  NcclComm comm_;
  int device_ = 0, rank_ = 0, size_ = 1;
  Stream ownStream_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t homeStream_ = nullptr; ///< the stream of create()
  NcclOptions opts_;
  std::atomic<bool> aborted_{false};
  /// Held while polling the handle and while aborting it, so abort() from
  /// another thread never races a poll. (Enqueueing calls do not take it:
  /// abort() concurrent with an enqueue on another thread is not safe.)
  std::mutex commMu_;
  std::mutex reasonMu_;
  std::string abortReason_;
  DeviceBuffer barrierWord_; ///< one float for barrier()
};

/// In-graph: one communicator per device of `devices` (ncclCommInitAll);
/// element r is rank r and drives devices[r].
Expected<std::vector<std::unique_ptr<Communicator>>>
createNcclGroup(const CudaLibrary &lib, const std::vector<int> &devices,
                NcclOptions opts = {});

/// Between-graph: this process is `rank` of `size`, on `device`.
Expected<std::unique_ptr<Communicator>>
createNcclCommunicator(const CudaLibrary &lib, int rank, int size,
                       const ncclUniqueId &id, int device,
                       NcclOptions opts = {});

/// The unique id of a between-graph launch: $DLOPT_NCCL_ID (hex) when set;
/// else the file $DLOPT_NCCL_ID_FILE, which rank 0 creates (ncclGetUniqueId,
/// written atomically) and the other ranks wait for, up to the timeout.
Expected<ncclUniqueId> bootstrapUniqueId(const CudaLibrary &lib,
                                         const LaunchInfo &launch,
                                         NcclOptions opts = {});

/// NCCL element type of a DType (i1 travels as uint8).
ncclDataType_t ncclTypeOf(DType t);
ncclRedOp_t ncclOpOf(ReduceOp op);

} // namespace dlopt::rt::cuda
