//===- CommPlan.cpp - Communication instructions as copies and one collective =//

#include "runtime/exec/CommPlan.h"
#include "runtime/format/OpTable.h"

#include <cstring>

namespace dlopt::rt {

namespace {

/// One copy per rank r of `n`: rank r's block of `height` rows of `width`
/// bytes, strided on one side and packed rank-major on the other.
void perRank(std::vector<BlockCopy> &out, int64_t n, BlockCopy base,
             int64_t dstStep, int64_t srcStep) {
  for (int64_t r = 0; r < n; ++r) {
    BlockCopy c = base;
    c.dstOffset += r * dstStep;
    c.srcOffset += r * srcStep;
    out.push_back(c);
  }
}

bool inside(int64_t offset, int64_t pitch, int64_t width, int64_t height,
            int64_t size) {
  if (height == 0 || width == 0)
    return true;
  if (offset < 0 || width < 0 || height < 0 || pitch < width)
    return false;
  return offset + (height - 1) * pitch + width <= size;
}

} // namespace

Expected<CommPlan> planCommunication(const Instr &instr, const TensorType &x,
                                     const TensorType &y, int groupSize,
                                     int groupRank) {
  std::string where = "'" + instr.op + "'" +
                      (instr.loc.empty() ? "" : " at " + instr.loc) + ": ";
  auto fail = [&](const std::string &msg) -> Status {
    return Status::error(where + msg);
  };
  const int64_t n = groupSize;
  if (n < 1 || groupRank < 0 || groupRank >= n)
    return fail("rank " + std::to_string(groupRank) +
                " is outside its group of " + std::to_string(n));
  if (x.dtype != y.dtype)
    return fail("operand is " + x.str() + " but result is " + y.str() +
                " (the element types must agree)");
  // The shape rule shared with Executable::validate; after it, every
  // attribute below is present and in range.
  Expected<TensorType> want = commResultType(instr, x, n);
  if (!want)
    return fail(want.status().message());
  if (!(*want == y))
    return fail("expects a " + want->str() + " result for a " + x.str() +
                " operand over a group of " + std::to_string(n) + ", got " +
                y.str());
  auto axisOf = [&](const char *name) { return instr.getInt(name, 0); };
  auto reduceOf = [&]() {
    std::string r = *instr.getString("reduce");
    return r == "max"   ? ReduceOp::Max
           : r == "min" ? ReduceOp::Min
           : r == "avg" ? ReduceOp::Avg
                        : ReduceOp::Sum;
  };

  CommPlan p;
  p.dtype = x.dtype;
  const int64_t elem = dtypeSize(x.dtype);
  const int64_t xBytes = x.byteSize(), yBytes = y.byteSize();
  const std::string &op = instr.op;
  if (op == "all_reduce") {
    p.reduce = reduceOf();
    p.call = CollectiveKind::AllReduce;
    p.inCount = p.outCount = x.numElements();
  } else if (op == "broadcast") {
    int64_t root = instr.getInt("root", 0);
    p.call = CollectiveKind::Broadcast;
    p.root = int(root);
    p.in = p.out = CommBuffer::Y;
    p.inCount = p.outCount = y.numElements();
    // The operand into the result, then the root's result everywhere.
    p.before.push_back({CommBuffer::Y, CommBuffer::X, 0, xBytes, 0, xBytes,
                        xBytes, 1});
  } else if (op == "all_gather") {
    const int64_t axis = axisOf("axis");
    p.call = CollectiveKind::AllGather;
    p.inCount = x.numElements();
    p.outCount = y.numElements();
    int64_t rows = product(x.shape, 0, size_t(axis));
    if (rows > 1) {
      // Gathered blocks arrive rank-major; interleave them into dim `axis`.
      int64_t chunk = product(x.shape, size_t(axis), x.shape.size()) * elem;
      p.out = CommBuffer::Recv;
      p.recvBytes = yBytes;
      perRank(p.after, n,
              {CommBuffer::Y, CommBuffer::Recv, 0, n * chunk, 0, chunk, chunk,
               rows},
              chunk, rows * chunk);
    }
  } else if (op == "reduce_scatter") {
    const int64_t axis = axisOf("axis");
    p.reduce = reduceOf();
    p.call = CollectiveKind::ReduceScatter;
    p.inCount = x.numElements();
    p.outCount = y.numElements();
    int64_t rows = product(x.shape, 0, size_t(axis));
    if (rows > 1) {
      // Make each destination rank's blocks contiguous first.
      int64_t chunk = product(y.shape, size_t(axis), y.shape.size()) * elem;
      p.in = CommBuffer::Send;
      p.sendBytes = xBytes;
      perRank(p.before, n,
              {CommBuffer::Send, CommBuffer::X, 0, chunk, 0, n * chunk, chunk,
               rows},
              rows * chunk, chunk);
    }
  } else if (op == "all_slice") {
    // No traffic: this rank's block (its index in the group) along `axis`.
    const int64_t axis = axisOf("axis");
    int64_t rows = product(x.shape, 0, size_t(axis));
    int64_t chunk = product(y.shape, size_t(axis), y.shape.size()) * elem;
    p.before.push_back({CommBuffer::Y, CommBuffer::X, 0, chunk,
                        groupRank * chunk, n * chunk, chunk, rows});
  } else { // all_to_all: commResultType refused every other op
    const int64_t split = axisOf("split_axis");
    const int64_t concat = axisOf("concat_axis");
    p.call = CollectiveKind::AllToAll;
    p.inCount = x.numElements();
    p.outCount = y.numElements();
    // Send block r (the r-th slice of `split`) to rank r; received block r
    // becomes the r-th slice of `concat`. With nothing before the split
    // (or concat) dim the blocks are already rank-major: no copy.
    const int64_t blockBytes = xBytes / n;
    int64_t so = product(x.shape, 0, size_t(split));
    int64_t sIn = x.shape[size_t(split)];
    int64_t sInner = product(x.shape, size_t(split) + 1, x.shape.size()) * elem;
    if (so > 1) {
      p.in = CommBuffer::Send;
      p.sendBytes = xBytes;
      int64_t w = (sIn / n) * sInner;
      perRank(p.before, n,
              {CommBuffer::Send, CommBuffer::X, 0, w, 0, sIn * sInner, w, so},
              blockBytes, w);
    }
    // Each received block has x's shape with dim `split` divided by n.
    TensorType bt = x;
    bt.shape[size_t(split)] /= n;
    int64_t co = product(bt.shape, 0, size_t(concat));
    int64_t cIn = bt.shape[size_t(concat)];
    int64_t cInner =
        product(bt.shape, size_t(concat) + 1, bt.shape.size()) * elem;
    if (co > 1) {
      p.out = CommBuffer::Recv;
      p.recvBytes = yBytes;
      int64_t w = cIn * cInner;
      perRank(p.after, n,
              {CommBuffer::Y, CommBuffer::Recv, 0, w * n, 0, w, w, co}, w,
              blockBytes);
    }
  }

  // Every copy inside its buffers (the backends copy without checking).
  auto sizeOf = [&](CommBuffer b) {
    switch (b) {
    case CommBuffer::X: return xBytes;
    case CommBuffer::Y: return yBytes;
    case CommBuffer::Send: return p.sendBytes;
    case CommBuffer::Recv: return p.recvBytes;
    }
    return int64_t(0);
  };
  for (const auto *list : {&p.before, &p.after})
    for (const BlockCopy &c : *list)
      if (!inside(c.dstOffset, c.dstPitch, c.width, c.height, sizeOf(c.dst)) ||
          !inside(c.srcOffset, c.srcPitch, c.width, c.height, sizeOf(c.src)))
        return fail("internal error: a planned block copy leaves its buffer");
  if (p.call != CollectiveKind::None &&
      (p.inCount * elem > sizeOf(p.in) || p.outCount * elem > sizeOf(p.out)))
    return fail("internal error: the collective's buffers are too small");
  return p;
}

Status runCommPlanOnHost(const CommPlan &plan, Communicator *comm,
                         const void *x, void *y) {
  std::vector<uint8_t> send(size_t(plan.sendBytes)),
      recv(size_t(plan.recvBytes));
  auto ptr = [&](CommBuffer b) -> uint8_t * {
    switch (b) {
    case CommBuffer::X: return static_cast<uint8_t *>(const_cast<void *>(x));
    case CommBuffer::Y: return static_cast<uint8_t *>(y);
    case CommBuffer::Send: return send.data();
    case CommBuffer::Recv: return recv.data();
    }
    return nullptr;
  };
  auto copy = [&](const std::vector<BlockCopy> &list) {
    for (const BlockCopy &c : list) {
      uint8_t *d = ptr(c.dst) + c.dstOffset;
      const uint8_t *s = ptr(c.src) + c.srcOffset;
      for (int64_t i = 0; i < c.height; ++i)
        if (d + i * c.dstPitch != s + i * c.srcPitch && c.width > 0)
          std::memcpy(d + i * c.dstPitch, s + i * c.srcPitch, size_t(c.width));
    }
  };
  copy(plan.before);
  if (plan.call != CollectiveKind::None) {
    if (!comm)
      return Status::error("no communicator for a collective");
    CommInput in = hostIn(ptr(plan.in), plan.inCount, plan.dtype);
    CommOutput out = hostOut(ptr(plan.out), plan.outCount, plan.dtype);
    Status st;
    switch (plan.call) {
    case CollectiveKind::AllReduce: st = comm->allReduce(in, out, plan.reduce); break;
    case CollectiveKind::AllGather: st = comm->allGather(in, out); break;
    case CollectiveKind::ReduceScatter:
      st = comm->reduceScatter(in, out, plan.reduce);
      break;
    case CollectiveKind::AllToAll: st = comm->allToAll(in, out); break;
    case CollectiveKind::Broadcast: st = comm->broadcast(out, plan.root); break;
    case CollectiveKind::None: break;
    }
    if (!st)
      return st;
  }
  copy(plan.after);
  return Status::ok();
}

} // namespace dlopt::rt
