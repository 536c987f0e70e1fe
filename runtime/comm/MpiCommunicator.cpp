//===- MpiCommunicator.cpp - Ranks as processes, over MPI ----------------===//

#include "runtime/comm/MpiCommunicator.h"
#include "runtime/comm/InProcessCommunicator.h"
#include "runtime/comm/RankOrderReduce.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
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

class MpiCommunicator : public Communicator {
public:
  MpiCommunicator(MPI_Comm comm, std::chrono::milliseconds timeout,
                  bool ownsComm = true)
      : comm_(comm), timeout_(timeout), ownsComm_(ownsComm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    // Buffered sends still in flight are waited for, unless the job is
    // failing (a peer may be gone or stopped: this process must exit, not
    // wait out a timeout per request).
    reapSends();
    const bool failing = gAbortSent.load() || gAbortSeen.load();
    if (!sends_.empty() && !broken_ && !failing)
      (void)flushSends("send");
    if (!sends_.empty()) {
      // MPI may still read these buffers: they stay allocated until exit.
      for (auto &p : sends_)
        (void)p.release();
      return;
    }
    // A communicator with requests still pending (after a timeout) cannot
    // be freed safely; leave it to MPI_Finalize / process exit.
    if (!broken_ && ownsComm_ && comm_ != MPI_COMM_NULL)
      MPI_Comm_free(&comm_);
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
    ScratchScope scope(*this);
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
    // Nonblocking collectives read their count arrays until they complete.
    int *sendCounts = scratch<int>(size_t(n)), *sendDispl = scratch<int>(size_t(n)),
        *recvCounts = scratch<int>(size_t(n)), *recvDispl = scratch<int>(size_t(n));
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
    uint8_t *gathered = scratch<uint8_t>(size_t(myCnt * es * n));
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Ialltoallv(
        in.data, sendCounts, sendDispl, MPI_BYTE, gathered, recvCounts,
        recvDispl, MPI_BYTE, comm_, &req)));
    DLOPT_RETURN_IF_ERROR(wait(what, req));
    std::vector<const void *> ins(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q)
      ins[size_t(q)] = gathered + int64_t(q) * myCnt * es;
    uint8_t *mine = scratch<uint8_t>(size_t(std::max<int64_t>(myCnt, 1) * es));
    if (myCnt > 0)
      reduceInto(ins, 0, myCnt, in.dtype, op, mine);
    // Every rank's reduced chunk lands at its place in every output.
    for (int q = 0; q < n; ++q) {
      int64_t off, cnt;
      span(q, off, cnt);
      recvCounts[size_t(q)] = int(cnt * es);
      recvDispl[size_t(q)] = int(off * es);
    }
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Iallgatherv(
        mine, int(myCnt * es), MPI_BYTE, out.data, recvCounts, recvDispl,
        MPI_BYTE, comm_, &req)));
    return wait(what, req);
  }

  Status allGather(CommInput in, CommOutput out) override {
    ScratchScope scope(*this);
    const char *what = "all_gather";
    DLOPT_RETURN_IF_ERROR(checkBuffers(what, in, out, in.count * size_));
    DLOPT_RETURN_IF_ERROR(agree(what, {kAllGather, in.count, out.count,
                                       int64_t(in.dtype), 0}));
    const int64_t bytes = in.count * dtypeSize(in.dtype);
    if (bytes > kMaxMpiCount)
      return fail(what, Status::error("buffer too large for one MPI call"));
    // In place (the input is this rank's block of the output) is allowed.
    const void *src = in.data;
    if (in.data == out.data || overlaps(in, out)) {
      uint8_t *copy = scratch<uint8_t>(size_t(bytes));
      if (bytes)
        std::memcpy(copy, in.data, size_t(bytes));
      src = copy;
    }
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Iallgather(src, int(bytes), MPI_BYTE,
                                                    out.data, int(bytes),
                                                    MPI_BYTE, comm_, &req)));
    return wait(what, req);
  }

  Status reduceScatter(CommInput in, CommOutput out, ReduceOp op) override {
    ScratchScope scope(*this);
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
    uint8_t *blocks = scratch<uint8_t>(size_t(bytes * n));
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Ialltoall(in.data, int(bytes),
                                                   MPI_BYTE, blocks,
                                                   int(bytes), MPI_BYTE, comm_,
                                                   &req)));
    DLOPT_RETURN_IF_ERROR(wait(what, req));
    std::vector<const void *> ins(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q)
      ins[size_t(q)] = blocks + int64_t(q) * bytes;
    if (out.count > 0)
      reduceInto(ins, 0, out.count, in.dtype, op, out.data);
    return Status::ok();
  }

  Status allToAll(CommInput in, CommOutput out) override {
    ScratchScope scope(*this);
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
    const void *src = in.data;
    if (overlaps(in, out)) {
      uint8_t *copy = scratch<uint8_t>(size_t(bytes * size_));
      if (bytes)
        std::memcpy(copy, in.data, size_t(bytes * size_));
      src = copy;
    }
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Ialltoall(src, int(bytes), MPI_BYTE,
                                                   out.data, int(bytes),
                                                   MPI_BYTE, comm_, &req)));
    return wait(what, req);
  }

  Status broadcast(CommOutput buf, int root) override {
    ScratchScope scope(*this);
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
    ScratchScope scope(*this);
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
    ScratchScope scope(*this);
    const char *what = "send";
    DLOPT_RETURN_IF_ERROR(checkPeer(what, peer));
    DLOPT_RETURN_IF_ERROR(live(what));
    const int64_t bytes = in.count * dtypeSize(in.dtype);
    if (bytes > kMaxMpiCount)
      return fail(what, Status::error("buffer too large for one MPI call"));
    int process = 0, headTag = 0, dataTag = 0;
    DLOPT_RETURN_IF_ERROR(
        p2pRoute(what, peer, /*sending=*/true, &process, &headTag, &dataTag));
    reapSends();
    auto pending = std::make_unique<PendingSend>();
    // The header (count, dtype) lets the receiver check what it gets.
    pending->head[0] = in.count;
    pending->head[1] = int64_t(in.dtype);
    pending->data.assign(static_cast<const uint8_t *>(in.data),
                         static_cast<const uint8_t *>(in.data) + bytes);
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Isend(pending->head, 2, MPI_INT64_T,
                                               process, headTag, comm_,
                                               &pending->reqs[0])));
    // With the header in flight the buffers must outlive a failure here.
    Status st = call(what, MPI_Isend(pending->data.data(), int(bytes),
                                     MPI_BYTE, process, dataTag, comm_,
                                     &pending->reqs[1]));
    sends_.push_back(std::move(pending));
    DLOPT_RETURN_IF_ERROR(st);
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
    ScratchScope scope(*this);
    const char *what = "recv";
    DLOPT_RETURN_IF_ERROR(checkPeer(what, peer));
    DLOPT_RETURN_IF_ERROR(live(what));
    int process = 0, headTag = 0, dataTag = 0;
    DLOPT_RETURN_IF_ERROR(
        p2pRoute(what, peer, /*sending=*/false, &process, &headTag, &dataTag));
    int64_t *head = scratch<int64_t>(2);
    head[0] = head[1] = 0;
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Irecv(head, 2, MPI_INT64_T, process,
                                               headTag, comm_, &req)));
    DLOPT_RETURN_IF_ERROR(wait(what, req));
    const int64_t bytes = head[0] * dtypeSize(DType(head[1]));
    if (head[0] != out.count || head[1] != int64_t(out.dtype)) {
      // Drain the data so the pair stays in step, then fail.
      if (bytes >= 0 && bytes <= kMaxMpiCount &&
          call(what, MPI_Irecv(scratch<uint8_t>(size_t(bytes)), int(bytes),
                               MPI_BYTE, process,
                               dataTag, comm_, &req)))
        (void)wait(what, req);
      return fail(what, Status::error(
                            "rank " + std::to_string(peer) + " sent " +
                            std::to_string(head[0]) + " elements of " +
                            dtypeName(DType(head[1])) + ", this rank expects " +
                            std::to_string(out.count) + " of " +
                            dtypeName(out.dtype)));
    }
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Irecv(out.data, int(bytes), MPI_BYTE,
                                               process, dataTag, comm_, &req)));
    return wait(what, req);
  }

  Expected<std::unique_ptr<Communicator>> split(int color, int key) override {
    ScratchScope scope(*this);
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

protected:
  static constexpr int kHeadTag = 17, kDataTag = 18;

  /// Where point-to-point messages between this rank and `peer` travel:
  /// the MPI process and the tags of the header and the data.
  virtual Status p2pRoute(const char *what, int peer, bool sending,
                          int *process, int *headTag, int *dataTag) {
    (void)what;
    (void)sending;
    *process = peer;
    *headTag = kHeadTag;
    *dataTag = kDataTag;
    return Status::ok();
  }

  struct PendingSend {
    int64_t head[2] = {0, 0};
    std::vector<uint8_t> data;
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
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
           " of a group of " + std::to_string(size_) + ", " + transport_ +
           ")";
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
    Desc *all = scratch<Desc>(size_t(size_ + 1));
    all[size_] = mine; // what this rank sends
    MPI_Request req;
    DLOPT_RETURN_IF_ERROR(call(what, MPI_Iallgather(&all[size_], 5,
                                                    MPI_INT64_T, all, 5,
                                                    MPI_INT64_T, comm_, &req)));
    DLOPT_RETURN_IF_ERROR(wait(what, req));
    return compareDescs(what, all, mine);
  }

  Status compareDescs(const char *what, const Desc *all, const Desc &mine) {
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
  bool ownsComm_ = true;
  const char *transport_ = "MPI";
  std::mutex abortMu_;
  std::atomic<bool> aborted_{false};
  std::string abortReason_;
  bool broken_ = false;

  /// Working buffers of one call that MPI reads or writes while its
  /// requests are pending. A call that fails with requests still pending
  /// (a peer failed, a wait timed out: the group is broken) leaves them
  /// allocated until the process exits: MPI may still deliver a late
  /// message into them, and once writing into a freed buffer corrupted the
  /// heap of a surviving process, which then crashed inside MPI_Testall.
  template <class T> T *scratch(size_t n) {
    scratch_.push_back(std::make_unique_for_overwrite<uint8_t[]>(
        std::max<size_t>(1, n * sizeof(T))));
    return reinterpret_cast<T *>(scratch_.back().get());
  }
  /// Frees the scratch buffers made since it was built, unless the group
  /// broke meanwhile (see scratch).
  struct ScratchScope {
    explicit ScratchScope(MpiCommunicator &c)
        : c(c), mark(c.scratch_.size()) {}
    ~ScratchScope() {
      if (c.broken_)
        for (size_t i = mark; i < c.scratch_.size(); ++i)
          (void)c.scratch_[i].release();
      c.scratch_.resize(mark);
    }
    MpiCommunicator &c;
    size_t mark;
  };
  std::vector<std::unique_ptr<uint8_t[]>> scratch_;
};


/// What the communicators of one hybrid world share within a process: the
/// transport (a duplicate of MPI_COMM_WORLD), the layout, and the groups
/// made for ranks that all live in this process.
struct HybridShared {
  ~HybridShared() {
    if (transport != MPI_COMM_NULL)
      MPI_Comm_free(&transport);
  }
  MPI_Comm transport = MPI_COMM_NULL;
  int perProcess = 1, worldSize = 1;
  int64_t tagLimit = 32767;
  std::mutex mu;
  /// In-process groups being handed out: (parent id, split number, color)
  /// -> the group's communicators, taken one by one by its members.
  std::map<std::tuple<int64_t, int64_t, int>,
           std::vector<std::unique_ptr<Communicator>>>
      local;
};

/// A rank of a hybrid layout (docs/launch.md): G ranks per process as
/// threads, processes under mpirun. Ranks are "virtual": rank r lives in
/// process r / G. Every collective is built from point-to-point messages
/// on the shared transport, tagged by (communicator, class, sender,
/// receiver), so threads of one process never see each other's messages;
/// reductions run in rank order through reduceInto like every host
/// communicator's, so the bits match in-graph and between-graph runs.
/// Groups whose ranks all live in one process are in-process groups.
class HybridCommunicator final : public MpiCommunicator {
public:
  HybridCommunicator(std::shared_ptr<HybridShared> shared, int64_t id,
                     std::vector<int> members, int me,
                     std::chrono::milliseconds timeout)
      : MpiCommunicator(shared->transport, timeout, /*ownsComm=*/false),
        shared_(std::move(shared)), id_(id), members_(std::move(members)) {
    rank_ = me;
    size_ = int(members_.size());
    transport_ = "MPI, hybrid";
  }

  Status allReduce(CommInput in, CommOutput out, ReduceOp op) override {
    ScratchScope scope(*this);
    const char *what = "all_reduce";
    DLOPT_RETURN_IF_ERROR(checkBuffers(what, in, out, in.count));
    DLOPT_RETURN_IF_ERROR(checkReducible(what, in.dtype));
    DLOPT_RETURN_IF_ERROR(agree(what, {kAllReduce, in.count, out.count,
                                       int64_t(in.dtype), int64_t(op)}));
    const int n = size_;
    const int64_t es = dtypeSize(in.dtype), count = in.count;
    const int64_t chunk = (count + n - 1) / n;
    auto span = [&](int q, int64_t &off, int64_t &cnt) {
      off = std::min(count, int64_t(q) * chunk);
      cnt = std::min(count, off + chunk) - off;
    };
    int64_t myOff, myCnt;
    span(rank_, myOff, myCnt);
    // Phase 1: chunk q of every rank to rank q, reduced there in rank order.
    std::vector<const void *> ins(static_cast<size_t>(n));
    std::vector<MPI_Request> reqs;
    const auto *src = static_cast<const uint8_t *>(in.data);
    for (int q = 0; q < n; ++q) {
      if (q == rank_) {
        ins[size_t(q)] = src + myOff * es;
        continue;
      }
      int64_t off, cnt;
      span(q, off, cnt);
      uint8_t *got = scratch<uint8_t>(size_t(myCnt * es));
      ins[size_t(q)] = got;
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, src + off * es,
                                 cnt * es, /*send=*/true));
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, got, myCnt * es,
                                 /*send=*/false));
    }
    DLOPT_RETURN_IF_ERROR(waitAll(what, reqs));
    uint8_t *mine = scratch<uint8_t>(size_t(std::max<int64_t>(myCnt, 1) * es));
    if (myCnt > 0)
      reduceInto(ins, 0, myCnt, in.dtype, op, mine);
    // Phase 2: every reduced chunk to every rank.
    auto *dst = static_cast<uint8_t *>(out.data);
    for (int q = 0; q < n; ++q) {
      if (q == rank_)
        continue;
      int64_t off, cnt;
      span(q, off, cnt);
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, mine, myCnt * es,
                                 true));
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, dst + off * es,
                                 cnt * es, false));
    }
    DLOPT_RETURN_IF_ERROR(waitAll(what, reqs));
    if (myCnt > 0)
      std::memcpy(dst + myOff * es, mine, size_t(myCnt * es));
    return Status::ok();
  }

  Status allGather(CommInput in, CommOutput out) override {
    ScratchScope scope(*this);
    const char *what = "all_gather";
    DLOPT_RETURN_IF_ERROR(checkBuffers(what, in, out, in.count * size_));
    DLOPT_RETURN_IF_ERROR(agree(what, {kAllGather, in.count, out.count,
                                       int64_t(in.dtype), 0}));
    const int64_t bytes = in.count * dtypeSize(in.dtype);
    uint8_t *copy = scratch<uint8_t>(size_t(bytes));
    if (bytes)
      std::memcpy(copy, in.data, size_t(bytes));
    auto *dst = static_cast<uint8_t *>(out.data);
    std::vector<MPI_Request> reqs;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_)
        continue;
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, copy, bytes, true));
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, dst + q * bytes, bytes,
                                 false));
    }
    DLOPT_RETURN_IF_ERROR(waitAll(what, reqs));
    if (bytes)
      std::memcpy(dst + rank_ * bytes, copy, size_t(bytes));
    return Status::ok();
  }

  Status reduceScatter(CommInput in, CommOutput out, ReduceOp op) override {
    ScratchScope scope(*this);
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
    const int64_t bytes = out.count * dtypeSize(in.dtype);
    const auto *src = static_cast<const uint8_t *>(in.data);
    std::vector<const void *> ins(static_cast<size_t>(size_));
    std::vector<MPI_Request> reqs;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) {
        // A copy: the output may be this very block (in place), and the
        // reduction writes it while reading the inputs.
        uint8_t *own = scratch<uint8_t>(size_t(bytes));
        if (bytes)
          std::memcpy(own, src + q * bytes, size_t(bytes));
        ins[size_t(q)] = own;
        continue;
      }
      uint8_t *got = scratch<uint8_t>(size_t(bytes));
      ins[size_t(q)] = got;
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, src + q * bytes, bytes,
                                 true));
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, got, bytes, false));
    }
    DLOPT_RETURN_IF_ERROR(waitAll(what, reqs));
    if (out.count > 0)
      reduceInto(ins, 0, out.count, in.dtype, op, out.data);
    return Status::ok();
  }

  Status allToAll(CommInput in, CommOutput out) override {
    ScratchScope scope(*this);
    const char *what = "all_to_all";
    DLOPT_RETURN_IF_ERROR(checkBuffers(what, in, out, in.count));
    if (in.count % size_)
      return fail(what, Status::error(std::to_string(in.count) +
                                      " elements do not divide into " +
                                      std::to_string(size_) + " blocks"));
    DLOPT_RETURN_IF_ERROR(agree(what, {kAllToAll, in.count, out.count,
                                       int64_t(in.dtype), 0}));
    const int64_t bytes = in.count / size_ * dtypeSize(in.dtype);
    uint8_t *copy = scratch<uint8_t>(size_t(bytes * size_));
    if (bytes)
      std::memcpy(copy, in.data, size_t(bytes * size_));
    auto *dst = static_cast<uint8_t *>(out.data);
    std::vector<MPI_Request> reqs;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_)
        continue;
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, copy + q * bytes,
                                 bytes, true));
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, dst + q * bytes, bytes,
                                 false));
    }
    DLOPT_RETURN_IF_ERROR(waitAll(what, reqs));
    if (bytes)
      std::memcpy(dst + rank_ * bytes, copy + rank_ * bytes, size_t(bytes));
    return Status::ok();
  }

  Status broadcast(CommOutput buf, int root) override {
    ScratchScope scope(*this);
    const char *what = "broadcast";
    if (root < 0 || root >= size_)
      return fail(what, Status::error("root " + std::to_string(root) +
                                      " is outside the group of " +
                                      std::to_string(size_)));
    DLOPT_RETURN_IF_ERROR(checkBuffers(what, buf, buf, buf.count));
    DLOPT_RETURN_IF_ERROR(agree(what, {kBroadcast, buf.count, buf.count,
                                       int64_t(buf.dtype), root}));
    const int64_t bytes = buf.count * dtypeSize(buf.dtype);
    std::vector<MPI_Request> reqs;
    if (rank_ == root) {
      for (int q = 0; q < size_; ++q)
        if (q != rank_)
          DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, buf.data, bytes,
                                     true));
    } else {
      DLOPT_RETURN_IF_ERROR(post(what, reqs, root, kColl, buf.data, bytes,
                                 false));
    }
    return waitAll(what, reqs);
  }

  Status barrier() override {
    ScratchScope scope(*this);
    const char *what = "barrier";
    DLOPT_RETURN_IF_ERROR(live(what));
    DLOPT_RETURN_IF_ERROR(flushSends(what));
    return agree(what, {kBarrier, 0, 0, 0, 0});
  }

  Expected<std::unique_ptr<Communicator>> split(int color, int key) override {
    ScratchScope scope(*this);
    const char *what = "split";
    DLOPT_RETURN_IF_ERROR(live(what));
    const int64_t seq = ++splits_;
    // Everyone's (color, key), exchanged point to point.
    int64_t *all = scratch<int64_t>(size_t(size_) * 2 + 2);
    int64_t *mine = all + size_t(size_) * 2;
    mine[0] = color;
    mine[1] = key;
    std::vector<MPI_Request> reqs;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_)
        continue;
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, mine, 16, true));
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, &all[size_t(q) * 2], 16,
                                 false));
    }
    DLOPT_RETURN_IF_ERROR(waitAll(what, reqs));
    all[size_t(rank_) * 2] = color;
    all[size_t(rank_) * 2 + 1] = key;
    if (color < 0)
      return std::unique_ptr<Communicator>();
    std::vector<std::pair<int64_t, int>> order; // (key, index here)
    for (int q = 0; q < size_; ++q)
      if (all[size_t(q) * 2] == color)
        order.push_back({all[size_t(q) * 2 + 1], q});
    std::sort(order.begin(), order.end());
    std::vector<int> members;
    int me = -1;
    bool oneProcess = true;
    const int myProcess = members_[size_t(rank_)] / shared_->perProcess;
    for (size_t i = 0; i < order.size(); ++i) {
      int r = members_[size_t(order[i].second)];
      members.push_back(r);
      if (order[i].second == rank_)
        me = int(i);
      oneProcess &= r / shared_->perProcess == myProcess;
    }
    if (oneProcess) {
      // Every member is a thread of this process: an in-process group,
      // made by the first member to get here and taken by each.
      std::lock_guard<std::mutex> lock(shared_->mu);
      auto k = std::make_tuple(id_, seq, color);
      auto it = shared_->local.find(k);
      if (it == shared_->local.end()) {
        InProcessOptions io;
        io.timeout = timeout_;
        it = shared_->local
                 .emplace(k, createInProcessGroup(int(members.size()), io))
                 .first;
      }
      std::unique_ptr<Communicator> c = std::move(it->second[size_t(me)]);
      bool allTaken = true;
      for (auto &x : it->second)
        allTaken &= !x;
      if (allTaken)
        shared_->local.erase(it);
      return c;
    }
    const int64_t childId = id_ * 64 + seq;
    if (seq >= 64 || childId * 2 + 2 > shared_->tagLimit / (int64_t(shared_->worldSize) * shared_->worldSize))
      return fail(what, Status::error("too many communicators for MPI's tag "
                                      "space (" +
                                      std::to_string(shared_->tagLimit) + ")"));
    return std::unique_ptr<Communicator>(new HybridCommunicator(
        shared_, childId, std::move(members), me, timeout_));
  }

private:
  static constexpr int kColl = 0, kP2p = 1;

  /// Sends and receives of the base class, between virtual ranks: one tag
  /// for the header and the data (MPI keeps their order).
  Status p2pRoute(const char *what, int peer, bool sending, int *process,
                  int *headTag, int *dataTag) override {
    DLOPT_RETURN_IF_ERROR(route(what, peer, kP2p, sending, headTag, process));
    *dataTag = *headTag;
    return Status::ok();
  }

  /// The MPI tag and process of a message between this rank and `peer`.
  Status route(const char *what, int peer, int cls, bool sending, int *tag,
               int *process) {
    const int64_t w = shared_->worldSize;
    const int64_t a = members_[size_t(rank_)], b = members_[size_t(peer)];
    const int64_t from = sending ? a : b, to = sending ? b : a;
    const int64_t t = ((id_ * 2 + cls) * w + from) * w + to;
    if (t > shared_->tagLimit)
      return fail(what, Status::error("tag " + std::to_string(t) +
                                      " beyond MPI's limit " +
                                      std::to_string(shared_->tagLimit)));
    *tag = int(t);
    *process = int(b / shared_->perProcess);
    return Status::ok();
  }

  Status post(const char *what, std::vector<MPI_Request> &reqs, int peer,
              int cls, const void *data, int64_t bytes, bool sending) {
    Status st = postOne(what, reqs, peer, cls, data, bytes, sending);
    // Failing with earlier requests of the call pending breaks the group:
    // their buffers must outlive the call (scratch).
    if (!st && !reqs.empty())
      broken_ = true;
    return st;
  }

  Status postOne(const char *what, std::vector<MPI_Request> &reqs, int peer,
                 int cls, const void *data, int64_t bytes, bool sending) {
    if (bytes > kMaxMpiCount)
      return fail(what, Status::error("buffer too large for one MPI call"));
    int tag = 0, proc = 0;
    DLOPT_RETURN_IF_ERROR(route(what, peer, cls, sending, &tag, &proc));
    MPI_Request r;
    if (sending)
      DLOPT_RETURN_IF_ERROR(call(what, MPI_Isend(data, int(bytes), MPI_BYTE,
                                                 proc, tag, comm_, &r)));
    else
      DLOPT_RETURN_IF_ERROR(call(what, MPI_Irecv(const_cast<void *>(data),
                                                 int(bytes), MPI_BYTE, proc,
                                                 tag, comm_, &r)));
    reqs.push_back(r);
    return Status::ok();
  }

  Status waitAll(const char *what, std::vector<MPI_Request> &reqs) {
    for (MPI_Request &r : reqs)
      DLOPT_RETURN_IF_ERROR(wait(what, r));
    reqs.clear();
    return Status::ok();
  }

  /// Exchanges `mine` with every rank point to point; any difference is an
  /// error on all.
  Status agree(const char *what, Desc mine) {
    DLOPT_RETURN_IF_ERROR(live(what));
    Desc *all = scratch<Desc>(size_t(size_) + 1);
    all[size_] = mine; // what this rank sends
    std::vector<MPI_Request> reqs;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_)
        continue;
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, &all[size_],
                                 sizeof(Desc), true));
      DLOPT_RETURN_IF_ERROR(post(what, reqs, q, kColl, &all[size_t(q)],
                                 sizeof(Desc), false));
    }
    DLOPT_RETURN_IF_ERROR(waitAll(what, reqs));
    all[size_t(rank_)] = mine;
    return compareDescs(what, all, mine);
  }

  std::shared_ptr<HybridShared> shared_;
  int64_t id_;
  std::vector<int> members_; ///< global ranks, in group order
  int64_t splits_ = 0;
};

} // namespace

/// MPI_Comm_dup that cannot hang: MPI_Comm_idup polled until it completes,
/// `timeout` passes, or another process reported a failure. A process that
/// is stopped or gone before it joins would otherwise block every other
/// one here with no message. On a timeout the request is left pending (the
/// process is about to fail anyway).
Status dupBounded(MPI_Comm from, MPI_Comm *out, std::chrono::milliseconds timeout,
                  const std::string &what, bool watchAborts = true) {
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Comm_idup(from, out, &req);
  if (rc != MPI_SUCCESS)
    return Status::error(what + ": MPI_Comm_idup failed: " + mpiError(rc));
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int spins = 0;; ++spins) {
    int done = 0;
    rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
      return Status::error(what + ": MPI_Comm_idup failed: " + mpiError(rc));
    if (done)
      return Status::ok();
    std::string reason;
    if (watchAborts && spins % 64 == 0 && jobAborted(&reason))
      return Status::error(what + ": aborted: " + reason);
    if (std::chrono::steady_clock::now() > deadline)
      return Status::error(
          what + ": timed out after " +
          std::to_string(timeout.count() / 1000.0).substr(0, 6) +
          " s waiting for the other processes to join (one of them failed, "
          "was stopped, or has not started)");
    if (spins > 1000)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    else
      std::this_thread::yield();
  }
}

bool launchedByMpi() {
  for (const char *v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                        "SLURM_PROCID", "MPI_LOCALNRANKS"})
    if (std::getenv(v))
      return true;
  return false;
}

Expected<MpiInfo> initMpi(int *argc, char ***argv,
                          std::chrono::milliseconds startupTimeout) {
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
  if (Status st = dupBounded(MPI_COMM_WORLD, &gAbortComm, startupTimeout,
                             "MPI start-up", /*watchAborts=*/false);
      !st) {
    gAbortComm = MPI_COMM_NULL;
    return st;
  }
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
  DLOPT_RETURN_IF_ERROR(
      dupBounded(MPI_COMM_WORLD, &dup, opts.timeout, "creating the MPI world"));
  return std::unique_ptr<Communicator>(new MpiCommunicator(dup, opts.timeout));
}

Expected<std::vector<std::unique_ptr<Communicator>>>
createHybridWorld(int ranksPerProcess, MpiOptions opts) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    return Status::error("createHybridWorld: MPI is not initialized (initMpi)");
  if (ranksPerProcess < 1)
    return Status::error("createHybridWorld: ranks per process must be >= 1");
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (ranksPerProcess > 1 && provided < MPI_THREAD_MULTIPLE)
    return Status::error("hybrid layouts need an MPI library with "
                         "MPI_THREAD_MULTIPLE; this one granted less");
  int p = 0, np = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &p);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  auto shared = std::make_shared<HybridShared>();
  DLOPT_RETURN_IF_ERROR(dupBounded(MPI_COMM_WORLD, &shared->transport,
                                   opts.timeout, "creating the hybrid world"));
  MPI_Comm_set_errhandler(shared->transport, MPI_ERRORS_RETURN);
  void *ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  if (flag && ub)
    shared->tagLimit = *static_cast<int *>(ub);
  shared->perProcess = ranksPerProcess;
  shared->worldSize = np * ranksPerProcess;
  const int64_t w = shared->worldSize;
  if ((1 * 2 + 2) * w * w > shared->tagLimit)
    return Status::error("a hybrid world of " + std::to_string(w) +
                         " ranks needs more message tags than this MPI "
                         "offers (" + std::to_string(shared->tagLimit) + ")");
  std::vector<int> members(static_cast<size_t>(w));
  for (int r = 0; r < int(w); ++r)
    members[size_t(r)] = r;
  std::vector<std::unique_ptr<Communicator>> out;
  for (int i = 0; i < ranksPerProcess; ++i)
    out.push_back(std::unique_ptr<Communicator>(new HybridCommunicator(
        shared, 1, members, p * ranksPerProcess + i, opts.timeout)));
  return out;
}

} // namespace dlopt::rt
