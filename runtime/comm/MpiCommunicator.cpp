//===- MpiCommunicator.cpp - Ranks as processes, over MPI ----------------===//

#include "runtime/comm/MpiCommunicator.h"
#include "runtime/comm/RankOrderReduce.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dlopt::rt {
namespace {

std::mutex gInitMu;
bool gInitialized = false, gWeInitialized = false;
MpiInfo gInfo;

// Job abort notices travel on their own duplicate of MPI_COMM_WORLD.
MPI_Comm gAbortComm = MPI_COMM_NULL;
constexpr int kAbortTag = 1, kAckTag = 2;
std::mutex gAbortMu;
std::atomic<bool> gAbortSeen{false}, gAbortSent{false};
std::string gAbortReason;
int gAbortFrom = -1;

// The wait note: two buffers, the live one named by gNoteIndex (-1: none).
char gNotes[2][256];
std::atomic<int> gNoteIndex{-1};

void setWaitNote(const std::string &text) {
  int next = gNoteIndex.load() == 0 ? 1 : 0;
  size_t n = std::min(text.size(), sizeof(gNotes[0]) - 1);
  std::memcpy(gNotes[next], text.data(), n);
  gNotes[next][n] = '\0';
  gNoteIndex.store(next);
}
void clearWaitNote() { gNoteIndex.store(-1); }

std::string mpiError(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, size_t(len));
}

/// What a rank is about to do, exchanged before each collective.
struct Desc {
  int64_t kind = 0, inCount = 0, outCount = 0, dtype = 0, arg = 0;
  bool operator==(const Desc &o) const {
    return kind == o.kind && inCount == o.inCount && outCount == o.outCount &&
           dtype == o.dtype && arg == o.arg;
  }
};

enum Kind : int64_t {
  kAllReduce = 1,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast,
  kBarrier
};

const char *kindName(int64_t k) {
  switch (k) {
  case kAllReduce: return "all_reduce";
  case kAllGather: return "all_gather";
  case kReduceScatter: return "reduce_scatter";
  case kAllToAll: return "all_to_all";
  case kBroadcast: return "broadcast";
  case kBarrier: return "barrier";
  }
  return "?";
}

/// Largest byte count one MPI call takes (its counts are ints).
constexpr int64_t kMaxMpiCount = INT32_MAX;

class MpiCommunicator final : public Communicator {
public:
  MpiCommunicator(MPI_Comm comm, std::chrono::milliseconds timeout)
      : comm_(comm), timeout_(timeout) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    // A communicator with requests still pending (after a timeout) cannot
    // be freed safely; leave it to MPI_Finalize / process exit.
    if (!broken_ && comm_ != MPI_COMM_NULL) {
      if (!flushSends("send"))
        return; // peers gone: leave the requests to process exit
      MPI_Comm_free(&comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void setTimeout(std::chrono::milliseconds t) override { timeout_ = t; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void abort(const std::string &reason) override {
    std::lock_guard<std::mutex> lock(abortMu_);
    if (!aborted_) {
      abortReason_ = reason;
      aborted_ = true;
    }
  }

  Status allReduce(CommInput in, CommOutput out, ReduceOp op) override {
    const char *what = "all_reduce";
    DLOPT_RETURN_IF_ERROR(checkBuffers(what, in, out, in.count));
    DLOPT_RETURN_IF_ERROR(checkReducible(what, in.dtype));
    DLOPT_RETURN_IF_ERROR(agree(what, {kAllReduce, in.count, out.count,
                                       int64_t(in.dtype), int64_t(op)}));
    const int n = size_;
    const int64_t es = dtypeSize(in.dtype), count = in.count;
    if (n == 1) {
      if (out.data != in.data)
        std::memcpy(out.data, in.data, size_t(count * es));
      if (op == ReduceOp::Avg)
        reduceInto({in.data}, 0, count, in.dtype, op, out.data);
      return Status::ok();
    }
    // Chunk q (elements [q*chunk, ...)) is reduced by rank q: an all-to-all
    // brings every rank's copy of chunk q to rank q, which reduces them in
    // rank order; an all-gather returns the reduced chunks to everyone.
    const int64_t chunk = (count + n - 1) / n;
    std::vector<int> sendCounts(static_cast<size_t>(n)), sendDispl(static_cast<size_t>(n)),
        recvCounts(static_cast<size_t>(n)), recvDispl(static_cast<size_t>(n));
    auto span = [&](int q, int64_t &off, int64_t &cnt) {
      off = std::min(count, int64_t(q) * chunk);
      cnt = std::min(count, off + chunk) - off;
    };
    int64_t myOff = 0, myCnt = 0;
    span(rank_, myOff, myCnt);
    if (count * es > kMaxMpiCount)
      return fail(what, Status::error("buffer too large for one MPI call"));
    for (int q = 0; q < n; ++q) {
      int64_t off, cnt;
      span(q, off, cnt);
      sendCounts[size_t(q)] = int(cnt * es);
      sendDispl[size_t(q)] = int(off * es);
      recvCounts[size_t(q)] = int(myCnt * es);
      recvDispl[size_t(q)] = int(int64_t(q) * myCnt * es);
    }
    // Uninitialized: every byte is received before it is read.
    std::unique_ptr<uint8_t[]> gathered(new uint8_t[size_t(myCnt * es * n) + 1]);
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Ialltoallv(
        in.data, sendCounts.data(), sendDispl.data(), MPI_BYTE,
        gathered.get(), recvCounts.data(), recvDispl.data(), MPI_BYTE, comm_,
        &req)));
    DLOPT_RETURN_IF_ERROR(wait(what, req));
    std::vector<const void *> ins(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q)
      ins[size_t(q)] = gathered.get() + int64_t(q) * myCnt * es;
    std::vector<uint8_t> mine(size_t(std::max<int64_t>(myCnt, 1) * es));
    if (myCnt > 0)
      reduceInto(ins, 0, myCnt, in.dtype, op, mine.data());
    // Every rank's reduced chunk lands at its place in every output.
    for (int q = 0; q < n; ++q) {
      int64_t off, cnt;
      span(q, off, cnt);
      recvCounts[size_t(q)] = int(cnt * es);
      recvDispl[size_t(q)] = int(off * es);
    }
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Iallgatherv(
        mine.data(), int(myCnt * es), MPI_BYTE, out.data, recvCounts.data(),
        recvDispl.data(), MPI_BYTE, comm_, &req)));
    return wait(what, req);
  }

  Status allGather(CommInput in, CommOutput out) override {
    const char *what = "all_gather";
    DLOPT_RETURN_IF_ERROR(checkBuffers(what, in, out, in.count * size_));
    DLOPT_RETURN_IF_ERROR(agree(what, {kAllGather, in.count, out.count,
                                       int64_t(in.dtype), 0}));
    const int64_t bytes = in.count * dtypeSize(in.dtype);
    if (bytes > kMaxMpiCount)
      return fail(what, Status::error("buffer too large for one MPI call"));
    // In place (the input is this rank's block of the output) is allowed.
    std::vector<uint8_t> copy;
    const void *src = in.data;
    if (in.data == out.data || overlaps(in, out)) {
      copy.assign(static_cast<const uint8_t *>(in.data),
                  static_cast<const uint8_t *>(in.data) + bytes);
      src = copy.data();
    }
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Iallgather(src, int(bytes), MPI_BYTE,
                                                    out.data, int(bytes),
                                                    MPI_BYTE, comm_, &req)));
    return wait(what, req);
  }

  Status reduceScatter(CommInput in, CommOutput out, ReduceOp op) override {
    const char *what = "reduce_scatter";
    DLOPT_RETURN_IF_ERROR(checkBuffers(what, in, out, in.count / size_));
    if (in.count != out.count * size_)
      return fail(what, Status::error(
                            "input has " + std::to_string(in.count) +
                            " elements, expected " +
                            std::to_string(out.count * size_) +
                            " (the output's count times the group's size)"));
    DLOPT_RETURN_IF_ERROR(checkReducible(what, in.dtype));
    DLOPT_RETURN_IF_ERROR(agree(what, {kReduceScatter, in.count, out.count,
                                       int64_t(in.dtype), int64_t(op)}));
    const int n = size_;
    const int64_t bytes = out.count * dtypeSize(in.dtype);
    if (bytes > kMaxMpiCount / std::max(n, 1))
      return fail(what, Status::error("buffer too large for one MPI call"));
    std::vector<uint8_t> blocks(size_t(bytes * n));
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Ialltoall(in.data, int(bytes),
                                                   MPI_BYTE, blocks.data(),
                                                   int(bytes), MPI_BYTE, comm_,
                                                   &req)));
    DLOPT_RETURN_IF_ERROR(wait(what, req));
    std::vector<const void *> ins(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q)
      ins[size_t(q)] = blocks.data() + int64_t(q) * bytes;
    if (out.count > 0)
      reduceInto(ins, 0, out.count, in.dtype, op, out.data);
    return Status::ok();
  }

  Status allToAll(CommInput in, CommOutput out) override {
    const char *what = "all_to_all";
    DLOPT_RETURN_IF_ERROR(checkBuffers(what, in, out, in.count));
    if (in.count % size_)
      return fail(what, Status::error(std::to_string(in.count) +
                                      " elements do not divide into " +
                                      std::to_string(size_) + " blocks"));
    DLOPT_RETURN_IF_ERROR(agree(what, {kAllToAll, in.count, out.count,
                                       int64_t(in.dtype), 0}));
    const int64_t bytes = in.count / size_ * dtypeSize(in.dtype);
    if (bytes > kMaxMpiCount)
      return fail(what, Status::error("buffer too large for one MPI call"));
    std::vector<uint8_t> copy;
    const void *src = in.data;
    if (overlaps(in, out)) {
      copy.assign(static_cast<const uint8_t *>(in.data),
                  static_cast<const uint8_t *>(in.data) + bytes * size_);
      src = copy.data();
    }
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Ialltoall(src, int(bytes), MPI_BYTE,
                                                   out.data, int(bytes),
                                                   MPI_BYTE, comm_, &req)));
    return wait(what, req);
  }

  Status broadcast(CommOutput buf, int root) override {
    const char *what = "broadcast";
    if (root < 0 || root >= size_)
      return fail(what, Status::error("root " + std::to_string(root) +
                                      " is outside the group of " +
                                      std::to_string(size_)));
    DLOPT_RETURN_IF_ERROR(checkBuffers(what, buf, buf, buf.count));
    DLOPT_RETURN_IF_ERROR(agree(what, {kBroadcast, buf.count, buf.count,
                                       int64_t(buf.dtype), root}));
    const int64_t bytes = buf.count * dtypeSize(buf.dtype);
    if (bytes > kMaxMpiCount)
      return fail(what, Status::error("buffer too large for one MPI call"));
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Ibcast(buf.data, int(bytes), MPI_BYTE,
                                                root, comm_, &req)));
    return wait(what, req);
  }

  Status barrier() override {
    const char *what = "barrier";
    DLOPT_RETURN_IF_ERROR(live(what));
    DLOPT_RETURN_IF_ERROR(flushSends(what));
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Ibarrier(comm_, &req)));
    return wait(what, req);
  }

  /// Buffered, like the in-process communicator's: the data is copied and
  /// the call returns once MPI has it in flight, so two ranks sending to
  /// each other at once (a pipeline's activations one way, gradients the
  /// other) cannot deadlock on MPI's rendezvous protocol. The copies are
  /// released as the sends complete (reaped on every later call).
  Status send(CommInput in, int peer) override {
    const char *what = "send";
    DLOPT_RETURN_IF_ERROR(checkPeer(what, peer));
    DLOPT_RETURN_IF_ERROR(live(what));
    const int64_t bytes = in.count * dtypeSize(in.dtype);
    if (bytes > kMaxMpiCount)
      return fail(what, Status::error("buffer too large for one MPI call"));
    reapSends();
    auto pending = std::make_unique<PendingSend>();
    // The header (count, dtype) lets the receiver check what it gets.
    pending->head[0] = in.count;
    pending->head[1] = int64_t(in.dtype);
    pending->data.assign(static_cast<const uint8_t *>(in.data),
                         static_cast<const uint8_t *>(in.data) + bytes);
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Isend(pending->head, 2, MPI_INT64_T,
                                               peer, kHeadTag, comm_,
                                               &pending->reqs[0])));
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Isend(pending->data.data(),
                                               int(bytes), MPI_BYTE, peer,
                                               kDataTag, comm_,
                                               &pending->reqs[1])));
    pending->peer = peer;
    sends_.push_back(std::move(pending));
    return Status::ok();
  }

  /// Waits for every buffered send (a barrier's and the destructor's
  /// business: nothing may be left in flight when the group goes away).
  Status flushSends(const char *what) {
    for (auto &p : sends_)
      for (MPI_Request &r : p->reqs)
        if (r != MPI_REQUEST_NULL)
          DLOPT_RETURN_IF_ERROR(wait(what, r));
    sends_.clear();
    return Status::ok();
  }

  Status recv(CommOutput out, int peer) override {
    const char *what = "recv";
    DLOPT_RETURN_IF_ERROR(checkPeer(what, peer));
    DLOPT_RETURN_IF_ERROR(live(what));
    int64_t head[2] = {0, 0};
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Irecv(head, 2, MPI_INT64_T, peer,
                                               kHeadTag, comm_, &req)));
    DLOPT_RETURN_IF_ERROR(wait(what, req));
    const int64_t bytes = head[0] * dtypeSize(DType(head[1]));
    if (head[0] != out.count || head[1] != int64_t(out.dtype)) {
      // Drain the data so the pair stays in step, then fail.
      std::vector<uint8_t> sink(size_t(std::max<int64_t>(bytes, 0)));
      if (bytes >= 0 && bytes <= kMaxMpiCount &&
          call(what, MPI_Irecv(sink.data(), int(bytes), MPI_BYTE, peer,
                               kDataTag, comm_, &req)))
        (void)wait(what, req);
      return fail(what, Status::error(
                            "rank " + std::to_string(peer) + " sent " +
                            std::to_string(head[0]) + " elements of " +
                            dtypeName(DType(head[1])) + ", this rank expects " +
                            std::to_string(out.count) + " of " +
                            dtypeName(out.dtype)));
    }
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Irecv(out.data, int(bytes), MPI_BYTE,
                                               peer, kDataTag, comm_, &req)));
    return wait(what, req);
  }

  Expected<std::unique_ptr<Communicator>> split(int color, int key) override {
    const char *what = "split";
    DLOPT_RETURN_IF_ERROR(live(what));
    // MPI_Comm_split blocks; a barrier first bounds the wait for the peers.
    DLOPT_RETURN_IF_ERROR(barrier());
    MPI_Comm sub = MPI_COMM_NULL;
    DLOPT_RETURN_IF_ERROR(call(
        what, MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key,
                             &sub)));
    if (sub == MPI_COMM_NULL)
      return std::unique_ptr<Communicator>();
    return std::unique_ptr<Communicator>(new MpiCommunicator(sub, timeout_));
  }

private:
  static constexpr int kHeadTag = 17, kDataTag = 18;

  struct PendingSend {
    int64_t head[2] = {0, 0};
    std::vector<uint8_t> data;
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int peer = -1;
  };
  std::vector<std::unique_ptr<PendingSend>> sends_;

  /// Frees the buffers of the sends that completed.
  void reapSends() {
    size_t keep = 0;
    for (size_t i = 0; i < sends_.size(); ++i) {
      int done = 0;
      MPI_Testall(2, sends_[i]->reqs, &done, MPI_STATUSES_IGNORE);
      if (!done)
        sends_[keep++] = std::move(sends_[i]);
    }
    sends_.resize(keep);
  }

  std::string where(const char *what) const {
    return std::string(what) + " (rank " + std::to_string(rank_) +
           " of a group of " + std::to_string(size_) + ", MPI)";
  }

  Status fail(const char *what, const Status &st) {
    return Status::error(where(what) + ": " + st.message());
  }

  Status live(const char *what) {
    std::string jobReason;
    if (jobAborted(&jobReason))
      return Status::error(where(what) + ": aborted: " + jobReason);
    std::lock_guard<std::mutex> lock(abortMu_);
    if (aborted_)
      return Status::error(where(what) + ": aborted: " + abortReason_);
    if (broken_)
      return Status::error(where(what) +
                           ": an earlier call timed out; the group is unusable");
    return Status::ok();
  }

  Status call(const char *what, int rc) {
    if (rc == MPI_SUCCESS)
      return Status::ok();
    broken_ = true;
    return Status::error(where(what) + ": " + mpiError(rc));
  }

  /// Polls `req` until it completes, the timeout passes or abort() is
  /// called. A request left pending makes the group unusable.
  Status wait(const char *what, MPI_Request &req) {
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    int spins = 0;
    setWaitNote(where(what));
    struct Clear {
      ~Clear() { clearWaitNote(); }
    } clear;
    for (;;) {
      int done = 0;
      MPI_Status st;
      int rc = MPI_Test(&req, &done, &st);
      if (rc != MPI_SUCCESS) {
        broken_ = true;
        return Status::error(where(what) + ": " + mpiError(rc));
      }
      if (done)
        return Status::ok();
      if (aborted_.load()) {
        broken_ = true;
        std::lock_guard<std::mutex> lock(abortMu_);
        return Status::error(where(what) + ": aborted: " + abortReason_);
      }
      std::string jobReason;
      if ((spins % 64 == 0 || spins > 1000) && jobAborted(&jobReason)) {
        broken_ = true;
        return Status::error(where(what) + ": aborted: " + jobReason);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        broken_ = true;
        return Status::error(
            where(what) + ": timed out after " +
            std::to_string(timeout_.count() / 1000.0).substr(0, 6) +
            " s waiting for the other ranks of the group (one of them failed, "
            "hangs, or called a different operation)");
      }
      // Spin briefly for low latency, then yield the core.
      if (++spins > 1000)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      else
        std::this_thread::yield();
    }
  }

  /// Exchanges `mine` with every rank; any difference is an error on all.
  Status agree(const char *what, Desc mine) {
    DLOPT_RETURN_IF_ERROR(live(what));
    std::vector<Desc> all(static_cast<size_t>(size_));
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Iallgather(&mine, 5, MPI_INT64_T,
                                                    all.data(), 5, MPI_INT64_T,
                                                    comm_, &req)));
    DLOPT_RETURN_IF_ERROR(wait(what, req));
    for (int q = 0; q < size_; ++q) {
      const Desc &d = all[size_t(q)];
      if (d == mine)
        continue;
      return fail(what, Status::error(
                            "rank " + std::to_string(q) + " called " +
                            kindName(d.kind) + " with " +
                            std::to_string(d.inCount) + " elements of " +
                            dtypeName(DType(d.dtype)) +
                            " (argument " + std::to_string(d.arg) +
                            "), this rank " + kindName(mine.kind) + " with " +
                            std::to_string(mine.inCount) + " of " +
                            dtypeName(DType(mine.dtype)) + " (argument " +
                            std::to_string(mine.arg) + ")"));
    }
    return Status::ok();
  }

  Status checkBuffers(const char *what, CommInput in, CommOutput out,
                      int64_t wantOut) {
    if (in.space != MemorySpace::Host || out.space != MemorySpace::Host)
      return fail(what, Status::error("the MPI communicator takes host "
                                      "buffers only"));
    if (in.count < 0 || out.count != wantOut)
      return fail(what, Status::error(
                            "output has " + std::to_string(out.count) +
                            " elements, expected " + std::to_string(wantOut)));
    if (in.dtype != out.dtype)
      return fail(what, Status::error("input and output element types "
                                      "differ"));
    if ((in.count > 0 && !in.data) || (out.count > 0 && !out.data))
      return fail(what, Status::error("null buffer"));
    return Status::ok();
  }

  Status checkReducible(const char *what, DType t) {
    if (t == DType::I1)
      return fail(what, Status::error("i1 cannot be reduced"));
    return Status::ok();
  }

  Status checkPeer(const char *what, int peer) {
    if (peer < 0 || peer >= size_ || peer == rank_)
      return fail(what, Status::error("peer " + std::to_string(peer) +
                                      " is not another rank of the group of " +
                                      std::to_string(size_)));
    return Status::ok();
  }

  static bool overlaps(CommInput in, CommOutput out) {
    auto a = static_cast<const uint8_t *>(in.data);
    auto b = static_cast<const uint8_t *>(out.data);
    int64_t na = in.count * dtypeSize(in.dtype),
            nb = out.count * dtypeSize(out.dtype);
    return a && b && a < b + nb && b < a + na;
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  std::mutex abortMu_;
  std::atomic<bool> aborted_{false};
  std::string abortReason_;
  bool broken_ = false;
};

} // namespace

bool launchedByMpi() {
  for (const char *v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                        "SLURM_PROCID", "MPI_LOCALNRANKS"})
    if (std::getenv(v))
      return true;
  return false;
}

Expected<MpiInfo> initMpi(int *argc, char ***argv) {
  std::lock_guard<std::mutex> lock(gInitMu);
  if (gInitialized)
    return gInfo;
  int already = 0;
  MPI_Initialized(&already);
  int provided = MPI_THREAD_SINGLE;
  if (!already) {
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS)
      return Status::error("MPI_Init_thread failed: " + mpiError(rc));
    gWeInitialized = true;
  } else {
    MPI_Query_thread(&provided);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &gInfo.worldRank);
  MPI_Comm_size(MPI_COMM_WORLD, &gInfo.worldSize);
  if (MPI_Comm_dup(MPI_COMM_WORLD, &gAbortComm) != MPI_SUCCESS)
    gAbortComm = MPI_COMM_NULL;
  else
    MPI_Comm_set_errhandler(gAbortComm, MPI_ERRORS_RETURN);
  gInfo.threadMultiple = provided >= MPI_THREAD_MULTIPLE;
  gInitialized = true;
  return gInfo;
}

void finalizeMpi() {
  std::lock_guard<std::mutex> lock(gInitMu);
  if (!gWeInitialized)
    return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized)
    MPI_Finalize();
  gWeInitialized = false;
}

void notifyJobAbort(const std::string &reason) {
  if (gAbortComm == MPI_COMM_NULL || gAbortSent.exchange(true))
    return;
  int me = 0, n = 1;
  MPI_Comm_rank(gAbortComm, &me);
  MPI_Comm_size(gAbortComm, &n);
  // Static: the sends may still be in flight when this returns.
  static std::string text;
  text = reason.substr(0, 4000);
  static std::vector<MPI_Request> reqs;
  reqs.clear();
  std::lock_guard<std::mutex> lock(gAbortMu);
  for (int q = 0; q < n; ++q) {
    if (q == me)
      continue;
    MPI_Request r;
    if (MPI_Isend(text.data(), int(text.size()), MPI_CHAR, q, kAbortTag,
                  gAbortComm, &r) == MPI_SUCCESS)
      reqs.push_back(r);
  }
  // Small messages go eagerly; give them a moment, never block on a peer.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!reqs.empty() && std::chrono::steady_clock::now() < deadline) {
    int done = 0;
    MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool jobAborted(std::string *reason) {
  if (!gAbortSeen.load()) {
    if (gAbortComm == MPI_COMM_NULL)
      return false;
    std::lock_guard<std::mutex> lock(gAbortMu);
    if (!gAbortSeen.load()) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kAbortTag, gAbortComm, &flag, &st) !=
              MPI_SUCCESS ||
          !flag)
        return false;
      int len = 0;
      MPI_Get_count(&st, MPI_CHAR, &len);
      std::string text(size_t(std::max(len, 0)), '\0');
      MPI_Recv(text.data(), len, MPI_CHAR, st.MPI_SOURCE, kAbortTag,
               gAbortComm, MPI_STATUS_IGNORE);
      gAbortReason = text;
      gAbortFrom = st.MPI_SOURCE;
      gAbortSeen.store(true);
    }
  }
  if (reason) {
    std::lock_guard<std::mutex> lock(gAbortMu);
    *reason = gAbortReason;
  }
  return true;
}

void acknowledgeJobAbort() {
  if (!gAbortSeen.load() || gAbortFrom < 0)
    return;
  static int one = 1;
  MPI_Request r;
  if (MPI_Isend(&one, 1, MPI_INT, gAbortFrom, kAckTag, gAbortComm, &r) !=
      MPI_SUCCESS)
    return;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  int done = 0;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (!done)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int awaitJobAbortAcks(std::chrono::milliseconds timeout) {
  if (gAbortComm == MPI_COMM_NULL)
    return 0;
  int n = 1;
  MPI_Comm_size(gAbortComm, &n);
  int got = 0;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (got < n - 1 && std::chrono::steady_clock::now() < deadline) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kAckTag, gAbortComm, &flag, &st) !=
        MPI_SUCCESS)
      break;
    if (flag) {
      int v = 0;
      MPI_Recv(&v, 1, MPI_INT, st.MPI_SOURCE, kAckTag, gAbortComm,
               MPI_STATUS_IGNORE);
      ++got;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  return got;
}

const char *mpiWaitNote() {
  int i = gNoteIndex.load();
  return i < 0 ? nullptr : gNotes[i];
}

Expected<std::unique_ptr<Communicator>> createMpiWorld(MpiOptions opts) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    return Status::error("createMpiWorld: MPI is not initialized (initMpi)");
  MPI_Comm dup = MPI_COMM_NULL;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  if (rc != MPI_SUCCESS)
    return Status::error("MPI_Comm_dup failed: " + mpiError(rc));
  return std::unique_ptr<Communicator>(new MpiCommunicator(dup, opts.timeout));
}

} // namespace dlopt::rt
