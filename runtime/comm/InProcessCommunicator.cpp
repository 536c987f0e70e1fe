//===- InProcessCommunicator.cpp - Ranks as threads of one process -------===//
//
// Protocol of every collective (all under the group's mutex except the data
// movement):
//   1. post: rank r writes its descriptor (kind, dtype, counts, pointers)
//      into slot r and waits until every rank has posted (barrier B1);
//   2. compute: every rank validates all descriptors identically (so all
//      ranks return the same error) and computes its own result into a
//      private scratch buffer, reading the other ranks' inputs;
//   3. barrier B2: after it nobody reads inputs or slots any more, so each
//      rank copies scratch to its output (in-place calls are safe) and may
//      post its next descriptor.
// The barrier counts arrivals per rank (monotonic), so a timeout can name
// the ranks that have not arrived. A timeout aborts the group.
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/InProcessCommunicator.h"
#include "runtime/comm/RankOrderReduce.h"

#include "runtime/cpu/Half.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <sstream>

namespace dlopt::rt {
namespace {

enum class Kind : uint8_t {
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  Broadcast,
  Barrier,
  Split
};

const char *kindName(Kind k) {
  switch (k) {
  case Kind::AllReduce: return "allReduce";
  case Kind::AllGather: return "allGather";
  case Kind::ReduceScatter: return "reduceScatter";
  case Kind::AllToAll: return "allToAll";
  case Kind::Broadcast: return "broadcast";
  case Kind::Barrier: return "barrier";
  case Kind::Split: return "split";
  }
  return "?";
}

struct Group;

struct Desc {
  Kind kind = Kind::Barrier;
  ReduceOp op = ReduceOp::Sum;
  DType dtype = DType::F32;
  int64_t inCount = 0, outCount = 0;
  const void *in = nullptr;
  void *out = nullptr;
  int root = 0;
  int color = 0, key = 0;
  std::string localError;
  std::shared_ptr<Group> newGroup; // split: created by each color's leader
};

struct Message {
  std::vector<uint8_t> bytes;
  int64_t count;
  DType dtype;
};

struct Group {
  explicit Group(int n)
      : n(n), arrived(n, 0), slots(n), mail(size_t(n) * size_t(n)) {}
  const int n;
  std::mutex m;
  std::condition_variable cv;
  std::vector<uint64_t> arrived; // barriers each rank has entered
  std::vector<Desc> slots;
  std::vector<std::deque<Message>> mail; // [src * n + dst]
  bool aborted = false;
  std::string abortReason;

  void abortLocked(const std::string &reason) {
    if (!aborted) {
      aborted = true;
      abortReason = reason;
    }
    cv.notify_all();
  }
};

std::string describe(const Desc &d) {
  std::ostringstream os;
  os << kindName(d.kind);
  switch (d.kind) {
  case Kind::Barrier:
    break;
  case Kind::Split:
    os << "(color " << d.color << ", key " << d.key << ")";
    break;
  default:
    os << "(in " << d.inCount << " x " << dtypeName(d.dtype) << ", out "
       << d.outCount;
    if (d.kind == Kind::AllReduce || d.kind == Kind::ReduceScatter)
      os << ", " << reduceOpName(d.op);
    if (d.kind == Kind::Broadcast)
      os << ", root " << d.root;
    os << ")";
  }
  return os.str();
}

bool sameArgs(const Desc &a, const Desc &b) {
  if (a.kind != b.kind)
    return false;
  switch (a.kind) {
  case Kind::Barrier:
  case Kind::Split:
    return true;
  case Kind::AllReduce:
  case Kind::ReduceScatter:
    if (a.op != b.op)
      return false;
    break;
  case Kind::Broadcast:
    if (a.root != b.root)
      return false;
    break;
  default:
    break;
  }
  return a.dtype == b.dtype && a.inCount == b.inCount &&
         a.outCount == b.outCount;
}

/// Elements [off, off+cnt) of float32 inputs summed in rank order (the same
/// sums as reduceInto) and written to every output at the same elements, in
/// blocks that vectorize. An output may be one of the inputs (an in-place
/// all-reduce): each block is read from every input before it is written.
void sumF32ToAll(const std::vector<const void *> &ins,
                 const std::vector<void *> &outs, int64_t off, int64_t cnt) {
  constexpr int64_t kBlock = 2048;
  float acc[kBlock];
  for (int64_t b = 0; b < cnt; b += kBlock) {
    int64_t m = std::min(kBlock, cnt - b);
    const float *p0 = static_cast<const float *>(ins[0]) + off + b;
    for (int64_t i = 0; i < m; ++i)
      acc[i] = p0[i];
    for (size_t q = 1; q < ins.size(); ++q) {
      const float *pq = static_cast<const float *>(ins[q]) + off + b;
      for (int64_t i = 0; i < m; ++i)
        acc[i] += pq[i];
    }
    for (void *o : outs)
      std::memcpy(static_cast<float *>(o) + off + b, acc,
                  size_t(m) * sizeof(float));
  }
}

class InProcessCommunicator final : public Communicator {
public:
  InProcessCommunicator(std::shared_ptr<Group> g, int rank,
                        std::chrono::milliseconds timeout)
      : g_(std::move(g)), rank_(rank), timeout_(timeout) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->n; }
  void setTimeout(std::chrono::milliseconds t) override { timeout_ = t; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  Status allReduce(CommInput in, CommOutput out, ReduceOp op) override {
    Desc d = post(Kind::AllReduce, in, out);
    d.op = op;
    checkReducible(d);
    if (d.localError.empty() && out.count != in.count)
      d.localError = "out.count " + std::to_string(out.count) +
                     " != in.count " + std::to_string(in.count);
    return collective(std::move(d));
  }
  Status allGather(CommInput in, CommOutput out) override {
    Desc d = post(Kind::AllGather, in, out);
    if (d.localError.empty() && out.count != in.count * size())
      d.localError = "out.count " + std::to_string(out.count) +
                     " != in.count * size = " +
                     std::to_string(in.count * size());
    return collective(std::move(d));
  }
  Status reduceScatter(CommInput in, CommOutput out, ReduceOp op) override {
    Desc d = post(Kind::ReduceScatter, in, out);
    d.op = op;
    checkReducible(d);
    if (d.localError.empty() && in.count != out.count * size())
      d.localError = "in.count " + std::to_string(in.count) +
                     " != out.count * size = " +
                     std::to_string(out.count * size());
    return collective(std::move(d));
  }
  Status allToAll(CommInput in, CommOutput out) override {
    Desc d = post(Kind::AllToAll, in, out);
    if (d.localError.empty() &&
        (out.count != in.count || in.count % size() != 0))
      d.localError = "allToAll needs in.count == out.count, divisible by "
                     "size " + std::to_string(size()) + " (in " +
                     std::to_string(in.count) + ", out " +
                     std::to_string(out.count) + ")";
    return collective(std::move(d));
  }
  Status broadcast(CommOutput buf, int root) override {
    Desc d = post(Kind::Broadcast, buf, buf);
    d.root = root;
    if (d.localError.empty() && (root < 0 || root >= size()))
      d.localError = "root " + std::to_string(root) + " out of range [0, " +
                     std::to_string(size()) + ")";
    return collective(std::move(d));
  }
  Status barrier() override {
    Desc d;
    d.kind = Kind::Barrier;
    return collective(std::move(d));
  }

  Status send(CommInput in, int peer) override {
    std::string what = "send from rank " + std::to_string(rank_) +
                       " to rank " + std::to_string(peer);
    DLOPT_RETURN_IF_ERROR(checkP2P(what, in, peer));
    Message msg{std::vector<uint8_t>(size_t(in.count * dtypeSize(in.dtype))),
                in.count, in.dtype};
    if (!msg.bytes.empty())
      std::memcpy(msg.bytes.data(), in.data, msg.bytes.size());
    std::lock_guard<std::mutex> lk(g_->m);
    if (g_->aborted)
      return abortedError(what);
    g_->mail[size_t(rank_) * g_->n + peer].push_back(std::move(msg));
    g_->cv.notify_all();
    return Status::ok();
  }

  Status recv(CommOutput out, int peer) override {
    std::string what = "recv on rank " + std::to_string(rank_) +
                       " from rank " + std::to_string(peer);
    DLOPT_RETURN_IF_ERROR(checkP2P(what, out, peer));
    std::unique_lock<std::mutex> lk(g_->m);
    auto &box = g_->mail[size_t(peer) * g_->n + rank_];
    bool ready = g_->cv.wait_for(
        lk, timeout_, [&] { return g_->aborted || !box.empty(); });
    if (!ready) {
      std::string msg = what + " timed out after " +
                        std::to_string(timeout_.count()) + " ms: rank " +
                        std::to_string(peer) +
                        " never sent (communicator group aborted)";
      g_->abortLocked(msg);
      return Status::error(msg);
    }
    if (g_->aborted)
      return abortedError(what);
    Message msg = std::move(box.front());
    box.pop_front();
    lk.unlock();
    if (msg.count != out.count || msg.dtype != out.dtype)
      return Status::error(what + ": expected " + std::to_string(out.count) +
                           " x " + dtypeName(out.dtype) + ", peer sent " +
                           std::to_string(msg.count) + " x " +
                           dtypeName(msg.dtype));
    if (!msg.bytes.empty())
      std::memcpy(out.data, msg.bytes.data(), msg.bytes.size());
    return Status::ok();
  }

  Expected<std::unique_ptr<Communicator>> split(int color, int key) override {
    Desc d;
    d.kind = Kind::Split;
    d.color = color;
    d.key = key;
    const char *what = "split";
    std::unique_lock<std::mutex> lk(g_->m);
    if (g_->aborted)
      return abortedError(what);
    g_->slots[rank_] = d;
    if (Status s = waitAll(lk, what); !s)
      return s;
    Status bad = validate();
    std::unique_ptr<Communicator> result;
    if (bad.isOk() && color >= 0) {
      // Members of my color ordered by (key, parent rank); the lowest parent
      // rank of the color creates the shared group (under the lock).
      std::vector<std::pair<int, int>> members; // (key, parent rank)
      for (int q = 0; q < g_->n; ++q)
        if (g_->slots[q].color == color)
          members.emplace_back(g_->slots[q].key, q);
      std::sort(members.begin(), members.end());
      int leader = g_->n;
      for (auto &m : members)
        leader = std::min(leader, m.second);
      auto &ng = g_->slots[leader].newGroup;
      if (!ng)
        ng = std::make_shared<Group>(int(members.size()));
      int newRank = 0;
      while (members[newRank].second != rank_)
        ++newRank;
      result = std::make_unique<InProcessCommunicator>(ng, newRank, timeout_);
    }
    if (Status s = waitAll(lk, what); !s)
      return s;
    if (!bad)
      return bad;
    return Expected<std::unique_ptr<Communicator>>(std::move(result));
  }

  void abort(const std::string &reason) override {
    std::lock_guard<std::mutex> lk(g_->m);
    g_->abortLocked("aborted by rank " + std::to_string(rank_) + ": " +
                    reason);
  }

private:
  Desc post(Kind k, CommInput in, CommOutput out) {
    Desc d;
    d.kind = k;
    d.dtype = in.dtype;
    d.inCount = in.count;
    d.outCount = out.count;
    d.in = in.data;
    d.out = out.data;
    if (in.space != MemorySpace::Host || out.space != MemorySpace::Host)
      d.localError = "the in-process communicator takes host buffers only";
    else if (in.count < 0 || out.count < 0)
      d.localError = "negative element count";
    else if ((in.count > 0 && !in.data) || (out.count > 0 && !out.data))
      d.localError = "null buffer";
    else if (in.dtype != out.dtype)
      d.localError = std::string("dtype mismatch: in ") +
                     dtypeName(in.dtype) + ", out " + dtypeName(out.dtype);
    return d;
  }

  static void checkReducible(Desc &d) {
    if (d.localError.empty() && d.dtype == DType::I1)
      d.localError = "cannot reduce i1 values";
  }

  Status checkP2P(const std::string &what, CommInput b, int peer) const {
    if (peer < 0 || peer >= size())
      return Status::error(what + ": peer out of range [0, " +
                           std::to_string(size()) + ")");
    if (b.space != MemorySpace::Host)
      return Status::error(what +
                           ": the in-process communicator takes host buffers "
                           "only");
    if (b.count < 0 || (b.count > 0 && !b.data))
      return Status::error(what + ": bad buffer (negative count or null)");
    return Status::ok();
  }

  Status abortedError(const std::string &what) const {
    return Status::error(what + " on rank " + std::to_string(rank_) +
                         ": communicator aborted: " + g_->abortReason);
  }

  /// Enters the next barrier and waits (lock held) for every rank.
  Status waitAll(std::unique_lock<std::mutex> &lk, const char *what) {
    const uint64_t target = ++g_->arrived[rank_];
    g_->cv.notify_all();
    auto all = [&] {
      if (g_->aborted)
        return true;
      for (int q = 0; q < g_->n; ++q)
        if (g_->arrived[q] < target)
          return false;
      return true;
    };
    if (!g_->cv.wait_for(lk, timeout_, all)) {
      std::string missing;
      for (int q = 0; q < g_->n; ++q)
        if (g_->arrived[q] < target)
          missing += (missing.empty() ? "" : ", ") + std::to_string(q);
      std::string msg = std::string(what) + " on rank " +
                        std::to_string(rank_) + " timed out after " +
                        std::to_string(timeout_.count()) +
                        " ms waiting for ranks [" + missing +
                        "] (communicator group aborted)";
      g_->abortLocked(msg);
      return Status::error(msg);
    }
    if (g_->aborted)
      return abortedError(what);
    return Status::ok();
  }

  /// Same verdict on every rank: local errors first, then mismatches.
  Status validate() const {
    const auto &s = g_->slots;
    const char *what = kindName(s[rank_].kind);
    for (int q = 0; q < g_->n; ++q)
      if (!s[q].localError.empty())
        return Status::error(std::string(what) + ": rank " +
                             std::to_string(q) + ": " + s[q].localError);
    for (int q = 1; q < g_->n; ++q)
      if (!sameArgs(s[0], s[q]))
        return Status::error(std::string(what) +
                             ": mismatched calls across ranks: rank 0 called " +
                             describe(s[0]) + ", rank " + std::to_string(q) +
                             " called " + describe(s[q]));
    return Status::ok();
  }

  Status collective(Desc mine) {
    const char *what = kindName(mine.kind);
    std::unique_lock<std::mutex> lk(g_->m);
    if (g_->aborted)
      return abortedError(what);
    g_->slots[rank_] = std::move(mine);
    DLOPT_RETURN_IF_ERROR(waitAll(lk, what));
    lk.unlock();

    Status st = validate();
    if (st.isOk() && g_->slots[rank_].kind == Kind::AllReduce)
      return allReduceChunked(lk, what);
    std::vector<uint8_t> scratch;
    const Desc &d = g_->slots[rank_];
    if (st.isOk())
      scratch = compute(d);

    lk.lock();
    DLOPT_RETURN_IF_ERROR(waitAll(lk, what));
    lk.unlock();
    if (!st)
      return st;
    if (!scratch.empty() && !(d.kind == Kind::Broadcast && d.root == rank_))
      std::memcpy(d.out, scratch.data(), scratch.size());
    return Status::ok();
  }

  /// All-reduce with the least memory traffic: rank r reduces chunk r of
  /// every input (in rank order: the same result as reduceInto) and writes
  /// it to chunk r of every rank's output; a barrier keeps every buffer
  /// alive until all ranks are done. Only rank r touches chunk r of any
  /// buffer, so an output may be its rank's input.
  Status allReduceChunked(std::unique_lock<std::mutex> &lk, const char *what) {
    const auto &s = g_->slots;
    const int n = g_->n;
    const Desc &d = s[rank_];
    const int64_t es = dtypeSize(d.dtype);
    const int64_t count = d.outCount, chunk = (count + n - 1) / n;
    const int64_t off = std::min(count, int64_t(rank_) * chunk);
    const int64_t cnt = std::min(count, off + chunk) - off;
    std::vector<const void *> ins(n);
    std::vector<void *> outs(n);
    for (int q = 0; q < n; ++q) {
      ins[q] = s[q].in;
      outs[q] = s[q].out;
    }
    if (cnt > 0) {
      if (d.dtype == DType::F32 && d.op == ReduceOp::Sum) {
        sumF32ToAll(ins, outs, off, cnt);
      } else {
        std::vector<uint8_t> tmp(size_t(cnt * es));
        reduceInto(ins, off, cnt, d.dtype, d.op, tmp.data());
        for (void *o : outs)
          std::memcpy(static_cast<uint8_t *>(o) + off * es, tmp.data(),
                      tmp.size());
      }
    }
    lk.lock();
    DLOPT_RETURN_IF_ERROR(waitAll(lk, what));
    return Status::ok();
  }

  /// This rank's result, read from every rank's input (between B1 and B2).
  std::vector<uint8_t> compute(const Desc &d) const {
    const auto &s = g_->slots;
    const int n = g_->n;
    const int64_t es = dtypeSize(d.dtype);
    std::vector<uint8_t> out(size_t(d.outCount * es));
    std::vector<const void *> ins(n);
    for (int q = 0; q < n; ++q)
      ins[q] = s[q].in;
    switch (d.kind) {
    case Kind::AllReduce:
      reduceInto(ins, 0, d.outCount, d.dtype, d.op, out.data());
      break;
    case Kind::ReduceScatter:
      reduceInto(ins, int64_t(rank_) * d.outCount, d.outCount, d.dtype, d.op,
                 out.data());
      break;
    case Kind::AllGather:
      for (int q = 0; q < n && d.inCount > 0; ++q)
        std::memcpy(out.data() + q * d.inCount * es, ins[q],
                    size_t(d.inCount * es));
      break;
    case Kind::AllToAll: {
      const int64_t blk = d.outCount / n * es;
      for (int q = 0; q < n && blk > 0; ++q)
        std::memcpy(out.data() + q * blk,
                    static_cast<const uint8_t *>(ins[q]) + rank_ * blk,
                    size_t(blk));
      break;
    }
    case Kind::Broadcast:
      if (d.root != rank_ && !out.empty())
        std::memcpy(out.data(), ins[d.root], out.size());
      break;
    case Kind::Barrier:
    case Kind::Split:
      break;
    }
    return out;
  }

  std::shared_ptr<Group> g_;
  int rank_;
  std::chrono::milliseconds timeout_;
};

} // namespace

std::vector<std::unique_ptr<Communicator>>
createInProcessGroup(int n, InProcessOptions opts) {
  std::vector<std::unique_ptr<Communicator>> comms;
  if (n <= 0)
    return comms;
  auto g = std::make_shared<Group>(n);
  for (int r = 0; r < n; ++r)
    comms.push_back(
        std::make_unique<InProcessCommunicator>(g, r, opts.timeout));
  return comms;
}

} // namespace dlopt::rt
