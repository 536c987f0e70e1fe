//===- NcclCommunicator.cpp - Communicator over NCCL and device buffers ---===//

#include "runtime/cuda/NcclCommunicator.h"

#include <cstdlib>
#include <filesystem>
#include <thread>

namespace dlopt::rt::cuda {

//===----------------------------------------------------------------------===//
// Clock, NcclComm, NcclGroupGuard
//===----------------------------------------------------------------------===//

namespace {
class SystemClock final : public Clock {
public:
  std::chrono::steady_clock::time_point now() override {
    return std::chrono::steady_clock::now();
  }
  void sleepFor(std::chrono::microseconds d) override {
    std::this_thread::sleep_for(d);
  }
};

std::string ms(std::chrono::milliseconds t) {
  return std::to_string(t.count()) + " ms";
}
} // namespace

Clock &systemClock() {
  static SystemClock c;
  return c;
}

NcclComm::NcclComm(NcclComm &&o) noexcept
    : lib_(o.lib_), c_(std::exchange(o.c_, nullptr)),
      failed_(std::exchange(o.failed_, false)) {}

NcclComm &NcclComm::operator=(NcclComm &&o) noexcept {
  if (this != &o) {
    reset();
    lib_ = o.lib_;
    c_ = std::exchange(o.c_, nullptr);
    failed_ = std::exchange(o.failed_, false);
  }
  return *this;
}

void NcclComm::abort() noexcept {
  if (c_ && lib_)
    (void)lib_->ncclCommAbort(c_);
  c_ = nullptr;
  failed_ = true;
}

void NcclComm::reset() noexcept {
  if (c_ && lib_) {
    if (failed_)
      (void)lib_->ncclCommAbort(c_);
    else
      (void)lib_->ncclCommDestroy(c_);
  }
  c_ = nullptr;
}

Expected<NcclGroupGuard> NcclGroupGuard::begin(const CudaLibrary &lib) {
  DLOPT_NCCL_CHECK(lib.ncclGroupStart());
  return NcclGroupGuard(lib);
}

NcclGroupGuard::~NcclGroupGuard() {
  if (open_)
    (void)lib_->ncclGroupEnd();
}

Status NcclGroupGuard::end() {
  if (!open_)
    return Status::error("ncclGroupEnd: the group was already ended");
  open_ = false;
  DLOPT_NCCL_CHECK(lib_->ncclGroupEnd());
  return Status::ok();
}

ncclDataType_t ncclTypeOf(DType t) {
  switch (t) {
  case DType::F32: return ncclFloat32;
  case DType::F16: return ncclFloat16;
  case DType::BF16: return ncclBfloat16;
  case DType::I32: return ncclInt32;
  case DType::I64: return ncclInt64;
  case DType::I1: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t ncclOpOf(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum: return ncclSum;
  case ReduceOp::Max: return ncclMax;
  case ReduceOp::Min: return ncclMin;
  case ReduceOp::Avg: return ncclAvg;
  }
  return ncclSum;
}

//===----------------------------------------------------------------------===//
// NcclCommunicator
//===----------------------------------------------------------------------===//

NcclCommunicator::NcclCommunicator(const CudaLibrary &lib, NcclComm comm,
                                   int device, NcclOptions opts)
    : lib_(lib), comm_(std::move(comm)), device_(device), opts_(opts) {
  if (!opts_.clock)
    opts_.clock = &systemClock();
}

NcclCommunicator::~NcclCommunicator() {
  // Let queued work finish (bounded by the timeout) before the handle goes;
  // a communicator that failed or timed out is aborted instead.
  if (comm_ && !aborted_ && lib_.cudaSetDevice(device_) == 0) {
    Status st = wait("destroying the communicator");
    (void)st;
  }
}

Expected<std::unique_ptr<NcclCommunicator>>
NcclCommunicator::create(const CudaLibrary &lib, NcclComm comm, int device,
                         cudaStream_t stream, NcclOptions opts) {
  if (!comm)
    return Status::error("NCCL communicator: no communicator handle");
  std::unique_ptr<NcclCommunicator> c(
      new NcclCommunicator(lib, std::move(comm), device, opts));
  DLOPT_CUDA_CHECK(lib.cudaSetDevice(device));
  DLOPT_NCCL_CHECK(lib.ncclCommUserRank(c->comm_.get(), &c->rank_));
  DLOPT_NCCL_CHECK(lib.ncclCommCount(c->comm_.get(), &c->size_));
  if (stream) {
    c->stream_ = stream;
  } else {
    auto s = createStream(lib);
    if (!s)
      return s.status();
    c->ownStream_ = s.take();
    c->stream_ = c->ownStream_.get();
  }
  c->homeStream_ = c->stream_;
  return c;
}

Status NcclCommunicator::setDeviceStream(void *stream) {
  stream_ = stream ? static_cast<cudaStream_t>(stream) : homeStream_;
  return Status::ok();
}

void NcclCommunicator::abort(const std::string &reason) {
  {
    std::lock_guard<std::mutex> lock(reasonMu_);
    if (abortReason_.empty())
      abortReason_ = reason;
  }
  if (!aborted_.exchange(true)) {
    std::lock_guard<std::mutex> lock(commMu_);
    comm_.abort();
  }
}

Status NcclCommunicator::enter(const char *what) {
  if (aborted_) {
    std::lock_guard<std::mutex> lock(reasonMu_);
    return Status::error(std::string(what) + " on rank " +
                         std::to_string(rank_) +
                         ": the NCCL communicator was aborted: " +
                         abortReason_);
  }
  Status st = [&]() -> Status {
    DLOPT_CUDA_CHECK(lib_.cudaSetDevice(device_));
    return Status::ok();
  }();
  return st.withContext(std::string(what) + ": ");
}

Status NcclCommunicator::fail(const char *what, const Status &st) {
  std::string msg = std::string(what) + " on rank " + std::to_string(rank_) +
                    ": " + st.message() + "; communicator aborted";
  abort(msg);
  return Status::error(msg);
}

Status NcclCommunicator::wait(const char *what) {
  Clock &clock = *opts_.clock;
  auto start = clock.now();
  for (;;) {
    if (aborted_)
      return enter(what);
    cudaError_t q = lib_.cudaStreamQuery(stream_);
    if (q == 0)
      return Status::ok();
    if (q != cudaErrorNotReady)
      return fail(what, cudaFailure(q, "cudaStreamQuery(stream)", __FILE__,
                                    __LINE__));
    ncclResult_t async = 0, r = 0;
    {
      std::lock_guard<std::mutex> lock(commMu_);
      if (aborted_)
        continue; // reported at the top of the loop
      r = lib_.ncclCommGetAsyncError(comm_.get(), &async);
    }
    if (r != 0)
      return fail(what, ncclFailure(r, "ncclCommGetAsyncError(comm, &async)",
                                    __FILE__, __LINE__));
    if (async != 0 && async != ncclInProgress)
      return fail(what, Status::error("asynchronous NCCL error: " +
                                      ncclResultMessage(async)));
    auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        clock.now() - start);
    if (waited >= opts_.timeout)
      return fail(what, Status::error("timed out after " + ms(opts_.timeout) +
                                      " (a peer did not join, or the "
                                      "ranks called collectives in "
                                      "different orders)"));
    clock.sleepFor(opts_.pollInterval);
  }
}

Status NcclCommunicator::finish(const char *what) {
  return opts_.blocking ? wait(what) : Status::ok();
}

Status NcclCommunicator::synchronize() {
  DLOPT_RETURN_IF_ERROR(enter("synchronize"));
  return wait("synchronize");
}

Status NcclCommunicator::checkBuffer(const char *what, CommInput b) const {
  if (b.space != MemorySpace::Device)
    return Status::error(std::string(what) +
                         ": the NCCL communicator takes device buffers only");
  if (b.count < 0 || (b.count > 0 && !b.data))
    return Status::error(std::string(what) +
                         ": bad buffer (negative count or null)");
  return Status::ok();
}

/// Runs one NCCL call: on failure the communicator is aborted.
#define DLOPT_NCCL_CALL(what, expr)                                            \
  do {                                                                         \
    ::dlopt::rt::cuda::ncclResult_t dlopt_r_ = (expr);                         \
    if (dlopt_r_ != 0)                                                         \
      return fail(what, ncclFailure(dlopt_r_, #expr, __FILE__, __LINE__));     \
  } while (0)

namespace {
Status sameType(const char *what, CommInput in, CommOutput out) {
  if (in.dtype != out.dtype)
    return Status::error(std::string(what) + ": dtype mismatch: in " +
                         dtypeName(in.dtype) + ", out " + dtypeName(out.dtype));
  return Status::ok();
}
Status reducible(const char *what, DType t) {
  if (t == DType::I1)
    return Status::error(std::string(what) + ": cannot reduce i1 values");
  return Status::ok();
}
} // namespace

Status NcclCommunicator::allReduce(CommInput in, CommOutput out, ReduceOp op) {
  const char *what = "allReduce";
  DLOPT_RETURN_IF_ERROR(enter(what));
  DLOPT_RETURN_IF_ERROR(checkBuffer(what, in));
  DLOPT_RETURN_IF_ERROR(checkBuffer(what, out));
  DLOPT_RETURN_IF_ERROR(sameType(what, in, out));
  DLOPT_RETURN_IF_ERROR(reducible(what, in.dtype));
  if (out.count != in.count)
    return Status::error("allReduce: out.count " + std::to_string(out.count) +
                         " != in.count " + std::to_string(in.count));
  DLOPT_NCCL_CALL(what, lib_.ncclAllReduce(in.data, out.data, size_t(in.count),
                                           ncclTypeOf(in.dtype), ncclOpOf(op),
                                           comm_.get(), stream_));
  return finish(what);
}

Status NcclCommunicator::allGather(CommInput in, CommOutput out) {
  const char *what = "allGather";
  DLOPT_RETURN_IF_ERROR(enter(what));
  DLOPT_RETURN_IF_ERROR(checkBuffer(what, in));
  DLOPT_RETURN_IF_ERROR(checkBuffer(what, out));
  DLOPT_RETURN_IF_ERROR(sameType(what, in, out));
  if (out.count != in.count * size_)
    return Status::error("allGather: out.count " + std::to_string(out.count) +
                         " != in.count * size (" +
                         std::to_string(in.count * size_) + ")");
  DLOPT_NCCL_CALL(what, lib_.ncclAllGather(in.data, out.data, size_t(in.count),
                                           ncclTypeOf(in.dtype), comm_.get(),
                                           stream_));
  return finish(what);
}

Status NcclCommunicator::reduceScatter(CommInput in, CommOutput out,
                                       ReduceOp op) {
  const char *what = "reduceScatter";
  DLOPT_RETURN_IF_ERROR(enter(what));
  DLOPT_RETURN_IF_ERROR(checkBuffer(what, in));
  DLOPT_RETURN_IF_ERROR(checkBuffer(what, out));
  DLOPT_RETURN_IF_ERROR(sameType(what, in, out));
  DLOPT_RETURN_IF_ERROR(reducible(what, in.dtype));
  if (in.count != out.count * size_)
    return Status::error("reduceScatter: in.count " + std::to_string(in.count) +
                         " != out.count * size (" +
                         std::to_string(out.count * size_) + ")");
  DLOPT_NCCL_CALL(what, lib_.ncclReduceScatter(
                            in.data, out.data, size_t(out.count),
                            ncclTypeOf(in.dtype), ncclOpOf(op), comm_.get(),
                            stream_));
  return finish(what);
}

Status NcclCommunicator::allToAll(CommInput in, CommOutput out) {
  const char *what = "allToAll";
  DLOPT_RETURN_IF_ERROR(enter(what));
  DLOPT_RETURN_IF_ERROR(checkBuffer(what, in));
  DLOPT_RETURN_IF_ERROR(checkBuffer(what, out));
  DLOPT_RETURN_IF_ERROR(sameType(what, in, out));
  if (in.count != out.count || in.count % size_ != 0)
    return Status::error("allToAll: in.count " + std::to_string(in.count) +
                         " and out.count " + std::to_string(out.count) +
                         " must be equal and divisible by " +
                         std::to_string(size_));
  if (in.data == out.data && in.count > 0)
    return Status::error("allToAll: in place is not supported by the NCCL "
                         "communicator (pass a separate output)");
  int64_t block = in.count / size_;
  int64_t bytes = block * dtypeSize(in.dtype);
  ncclDataType_t t = ncclTypeOf(in.dtype);
  {
    auto group = NcclGroupGuard::begin(lib_);
    if (!group)
      return fail(what, group.status());
    for (int p = 0; p < size_; ++p) {
      DLOPT_NCCL_CALL(what, lib_.ncclSend(static_cast<const char *>(in.data) +
                                              p * bytes,
                                          size_t(block), t, p, comm_.get(),
                                          stream_));
      DLOPT_NCCL_CALL(what, lib_.ncclRecv(static_cast<char *>(out.data) +
                                              p * bytes,
                                          size_t(block), t, p, comm_.get(),
                                          stream_));
    }
    Status ended = group->end();
    if (!ended)
      return fail(what, ended);
  }
  return finish(what);
}

Status NcclCommunicator::broadcast(CommOutput buf, int root) {
  const char *what = "broadcast";
  DLOPT_RETURN_IF_ERROR(enter(what));
  DLOPT_RETURN_IF_ERROR(checkBuffer(what, buf));
  if (root < 0 || root >= size_)
    return Status::error("broadcast: root " + std::to_string(root) +
                         " out of range [0, " + std::to_string(size_) + ")");
  DLOPT_NCCL_CALL(what, lib_.ncclBroadcast(buf.data, buf.data,
                                           size_t(buf.count),
                                           ncclTypeOf(buf.dtype), root,
                                           comm_.get(), stream_));
  return finish(what);
}

Status NcclCommunicator::barrier() {
  const char *what = "barrier";
  DLOPT_RETURN_IF_ERROR(enter(what));
  if (!barrierWord_.get()) {
    auto b = DeviceBuffer::allocate(lib_, sizeof(float));
    if (!b)
      return b.status().withContext("barrier: ");
    barrierWord_ = b.take();
  }
  // An all-reduce of one word, waited for even in non-blocking mode.
  DLOPT_NCCL_CALL(what, lib_.ncclAllReduce(barrierWord_.get(),
                                           barrierWord_.get(), 1, ncclFloat32,
                                           ncclSum, comm_.get(), stream_));
  return wait(what);
}

Status NcclCommunicator::send(CommInput in, int peer) {
  const char *what = "send";
  DLOPT_RETURN_IF_ERROR(enter(what));
  DLOPT_RETURN_IF_ERROR(checkBuffer(what, in));
  if (peer < 0 || peer >= size_)
    return Status::error("send: peer out of range [0, " +
                         std::to_string(size_) + ")");
  DLOPT_NCCL_CALL(what, lib_.ncclSend(in.data, size_t(in.count),
                                      ncclTypeOf(in.dtype), peer, comm_.get(),
                                      stream_));
  return finish(what);
}

Status NcclCommunicator::recv(CommOutput out, int peer) {
  const char *what = "recv";
  DLOPT_RETURN_IF_ERROR(enter(what));
  DLOPT_RETURN_IF_ERROR(checkBuffer(what, out));
  if (peer < 0 || peer >= size_)
    return Status::error("recv: peer out of range [0, " +
                         std::to_string(size_) + ")");
  DLOPT_NCCL_CALL(what, lib_.ncclRecv(out.data, size_t(out.count),
                                      ncclTypeOf(out.dtype), peer, comm_.get(),
                                      stream_));
  return finish(what);
}

Expected<std::unique_ptr<Communicator>> NcclCommunicator::split(int color,
                                                                int key) {
  const char *what = "split";
  DLOPT_RETURN_IF_ERROR(enter(what));
  if (!lib_.ncclCommSplit)
    return Status::error("split: ncclCommSplit is not available (NCCL >= "
                         "2.18 is needed)");
  // NCCL_SPLIT_NOCOLOR is -1; any negative color leaves the caller out.
  ncclComm_t child = nullptr;
  DLOPT_NCCL_CALL(what, lib_.ncclCommSplit(comm_.get(), color < 0 ? -1 : color,
                                           key, &child, nullptr));
  if (color < 0 || !child)
    return std::unique_ptr<Communicator>();
  // The child shares our creation stream, not one set by setDeviceStream()
  // for the calls in flight (that stream belongs to the caller).
  auto c = create(lib_, NcclComm(lib_, child), device_, homeStream_, opts_);
  if (!c)
    return c.status();
  return std::unique_ptr<Communicator>(c.take());
}

//===----------------------------------------------------------------------===//
// Creation and bootstrap
//===----------------------------------------------------------------------===//

Expected<std::vector<std::unique_ptr<Communicator>>>
createNcclGroup(const CudaLibrary &lib, const std::vector<int> &devices,
                NcclOptions opts) {
  if (devices.empty())
    return Status::error("createNcclGroup: no devices");
  std::vector<ncclComm_t> raw(devices.size(), nullptr);
  DLOPT_NCCL_CHECK(
      lib.ncclCommInitAll(raw.data(), int(devices.size()), devices.data()));
  // Own every handle first so an error below releases them all.
  std::vector<NcclComm> owned;
  for (ncclComm_t c : raw)
    owned.emplace_back(lib, c);
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t r = 0; r < devices.size(); ++r) {
    auto c = NcclCommunicator::create(lib, std::move(owned[r]), devices[r],
                                      nullptr, opts);
    if (!c)
      return c.status().withContext("rank " + std::to_string(r) + ": ");
    out.push_back(c.take());
  }
  return out;
}

Expected<std::unique_ptr<Communicator>>
createNcclCommunicator(const CudaLibrary &lib, int rank, int size,
                       const ncclUniqueId &id, int device, NcclOptions opts) {
  if (size < 1 || rank < 0 || rank >= size)
    return Status::error("createNcclCommunicator: rank " +
                         std::to_string(rank) + " outside world size " +
                         std::to_string(size));
  DLOPT_CUDA_CHECK(lib.cudaSetDevice(device));
  ncclComm_t c = nullptr;
  DLOPT_NCCL_CHECK(lib.ncclCommInitRank(&c, size, id, rank));
  auto comm = NcclCommunicator::create(lib, NcclComm(lib, c), device, nullptr,
                                       opts);
  if (!comm)
    return comm.status();
  return std::unique_ptr<Communicator>(comm.take());
}

Expected<ncclUniqueId> bootstrapUniqueId(const CudaLibrary &lib,
                                         const LaunchInfo &launch,
                                         NcclOptions opts) {
  if (const char *v = std::getenv("DLOPT_NCCL_ID"); v && *v)
    return uniqueIdFromEnv("DLOPT_NCCL_ID");
  const char *file = std::getenv("DLOPT_NCCL_ID_FILE");
  if (!file || !*file)
    return Status::error("no NCCL unique id: set DLOPT_NCCL_ID (256 hex "
                         "digits) or DLOPT_NCCL_ID_FILE (a path every rank "
                         "can read; rank 0 writes it)");
  if (launch.rank == 0) {
    ncclUniqueId id;
    DLOPT_NCCL_CHECK(lib.ncclGetUniqueId(&id));
    DLOPT_RETURN_IF_ERROR(writeUniqueIdFile(file, id));
    return id;
  }
  Clock &clock = opts.clock ? *opts.clock : systemClock();
  auto start = clock.now();
  for (;;) {
    std::error_code ec;
    if (std::filesystem::exists(file, ec))
      return readUniqueIdFile(file);
    if (clock.now() - start >= opts.timeout)
      return Status::error("rank " + std::to_string(launch.rank) +
                           ": timed out after " + ms(opts.timeout) +
                           " waiting for rank 0 to write the NCCL id to " +
                           file);
    clock.sleepFor(std::chrono::milliseconds(10));
  }
}

} // namespace dlopt::rt::cuda
